// The CUDA backend linked in rather than loaded as a module: the internal
// static library the test programs use, which holds the CUDA objects itself.
#include "kernels/cuda_module.h"

namespace flashspec {

std::unique_ptr<Backend> make_cuda_backend(const BackendConfig& config) { return cuda::make_backend(config); }

int cuda_device_count() { return cuda::device_count(); }

}  // namespace flashspec
