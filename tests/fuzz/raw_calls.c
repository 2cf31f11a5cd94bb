// See raw_calls.h: C callers passing any 32-bit value in an enum argument.
#include "raw_calls.h"

const char* fsfuzz_status_string(int32_t status) { return flashspec_status_string((flashspec_status)status); }

const char* fsfuzz_status_name(int32_t status) { return flashspec_status_name((flashspec_status)status); }

const char* fsfuzz_table_status_string(const flashspec_api* api, int32_t status) {
  return api->status_string((flashspec_status)status);
}

double fsfuzz_rng_uniform(uint64_t seed, uint64_t request_id, uint64_t step, int32_t position, int32_t purpose,
                          int32_t token) {
  return flashspec_rng_uniform(seed, request_id, step, position, (flashspec_rng_purpose)purpose, token);
}

flashspec_status fsfuzz_lm_head_create(flashspec_context* ctx, const flashspec_tensor* weight, int32_t flags,
                                       flashspec_lm_head** out) {
  return flashspec_lm_head_create(ctx, weight, (flashspec_lm_head_flags)flags, out);
}
