// Built instead of cuda/ when the library is configured without CUDA.
#include "kernels/backend.h"
#include "util/status.h"

namespace flashspec {

std::unique_ptr<Backend> make_cuda_backend(const BackendConfig&) {
  fail(FLASHSPEC_ERR_NO_DEVICE, Field::kBackend, "this build of FlashSpec has no CUDA backend");
}

int cuda_device_count() { return 0; }

}  // namespace flashspec
