// The entry point of libflashspec-cuda.so, the CUDA backend as a module
// (src/kernels/cuda_module.h): its only export.
#include "kernels/cuda_module.h"

extern "C" __attribute__((visibility("default"))) const flashspec::CudaModuleTable* flashspec_cuda_module(
    uint32_t interface_version) {
  static const flashspec::CudaModuleTable table{flashspec::kCudaModuleInterface, &flashspec::cuda::make_backend,
                                                &flashspec::cuda::device_count};
  return interface_version == flashspec::kCudaModuleInterface ? &table : nullptr;
}
