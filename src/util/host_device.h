// Lets the same inline code compile for the host and, under nvcc, the device,
// with the few float helpers whose spelling differs between the two.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define FS_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FS_HOST_DEVICE inline
#endif

namespace flashspec {

FS_HOST_DEVICE float neg_inf() { return -INFINITY; }
FS_HOST_DEVICE float pos_inf() { return INFINITY; }

FS_HOST_DEVICE bool is_finite(float x) {
#if defined(__CUDA_ARCH__)
  return isfinite(x);
#else
  return std::isfinite(x);
#endif
}

}  // namespace flashspec
