// Lets the same inline code compile for the host and, under nvcc, the device.
#pragma once

#if defined(__CUDACC__)
#define FS_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FS_HOST_DEVICE inline
#endif
