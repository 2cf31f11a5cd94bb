// The CUDA backend is a module, libflashspec-cuda.so, that the core loads on
// first need (a CUDA context, an AUTO context, flashspec_cuda_device_count),
// so the core library itself depends on libc and libstdc++ only and loads
// where the CUDA runtime is missing. The module exports one symbol,
// flashspec_cuda_module, which returns this versioned table.
#pragma once

#include <cstdint>
#include <memory>

#include "kernels/backend.h"

namespace flashspec {

// Bumped whenever the table, or any type it passes (Backend, BackendConfig,
// LmHeadStorage, the call arguments), changes: a module of another version is
// refused rather than called.
constexpr uint32_t kCudaModuleInterface = 1;

struct CudaModuleTable {
  uint32_t interface_version;
  std::unique_ptr<Backend> (*make_backend)(const BackendConfig& config);
  int (*device_count)();
};

namespace cuda {
// Defined in cuda/ (cuda_backend.cu).
std::unique_ptr<Backend> make_backend(const BackendConfig& config);
int device_count();
}  // namespace cuda

}  // namespace flashspec
