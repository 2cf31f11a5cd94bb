// Context creation for the tests and the benchmark. No GoogleTest here:
// bench/bench.cu includes this file; the checked variant for tests is
// make_context in make.h.
#pragma once

#include <cstdint>

#include "flashspec.h"

namespace fstest {

// The parameters of a context. Starts from flashspec_context_params_init's
// defaults with the backend set to CPU (never AUTO, so a test never picks a
// device by accident); each setter overrides one field and returns *this:
//   ContextOptions().cpu_threads(2).seed(7)
//   ContextOptions(FLASHSPEC_BACKEND_CUDA).cuda_stream(stream).max_rows(64)
class ContextOptions {
 public:
  explicit ContextOptions(flashspec_backend backend = FLASHSPEC_BACKEND_CPU) {
    flashspec_context_params_init(&params_);
    params_.backend = backend;
  }
  ContextOptions& seed(uint64_t value) {
    params_.seed = value;
    return *this;
  }
  ContextOptions& cpu_threads(int32_t value) {
    params_.cpu_threads = value;
    return *this;
  }
  ContextOptions& max_rows(int32_t value) {
    params_.max_rows = value;
    return *this;
  }
  ContextOptions& max_requests(int32_t value) {
    params_.max_requests = value;
    return *this;
  }
  ContextOptions& cuda_stream(void* stream) {
    params_.cuda_stream = stream;
    return *this;
  }
  const flashspec_context_params& params() const { return params_; }

 private:
  flashspec_context_params params_;
};

// flashspec_context_create with these options: *out is set on success and
// untouched on error (the message is flashspec_context_last_error(NULL)).
inline flashspec_status create_context(const ContextOptions& options, flashspec_context** out) {
  return flashspec_context_create(&options.params(), out);
}

}  // namespace fstest
