// How every kernel of the CUDA backend is launched, on an explicit stream:
// plainly, cooperatively (the stochastic scans' grid barrier), or as a
// programmatic dependent launch.
//
// Programmatic dependent launch (Hopper): a kernel launched with
// launch_dependent() may start while the kernel before it on the stream is
// still running, and waits in pdl_wait() until that kernel has finished and
// its writes are visible. It hides the launch gap between the short kernels
// around a scan. Every kernel launched this way calls pdl_wait() before it
// touches what its predecessors wrote, and before it exits, so ordering on
// the stream stays transitive. On older architectures both calls compile to
// nothing and the launch attribute is ignored.
#pragma once

#include <cuda_runtime.h>

namespace flashspec {
namespace cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Lets the next kernel on the stream launch now (it still waits for this one
// to finish before reading its results).
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Launches kernel(args...) with at most one launch attribute.
inline cudaError_t launch_with(const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                               void** args, cudaLaunchAttribute* attribute) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = attribute ? 1 : 0;
  return cudaLaunchKernelExC(&config, kernel, args);
}

// Launches kernel(args...) so that it may start before its predecessor on
// the stream ends (it waits in pdl_wait()).
inline cudaError_t launch_dependent(const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                    void** args) {
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  return launch_with(kernel, grid, block, smem, stream, args, &attribute);
}

// Launches kernel(args...), as a cooperative launch (all CTAs co-resident,
// grid-wide barriers allowed) when `cooperative` is set.
inline cudaError_t launch(const void* kernel, dim3 grid, dim3 block, size_t smem, bool cooperative,
                          cudaStream_t stream, void** args) {
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeCooperative;
  attribute.val.cooperative = 1;
  return launch_with(kernel, grid, block, smem, stream, args, cooperative ? &attribute : nullptr);
}

}  // namespace cuda
}  // namespace flashspec
