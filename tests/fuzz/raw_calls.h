// Calls that pass an enum argument holding any 32-bit value, as a C caller
// may. They are C (raw_calls.c): in C++ merely holding such a value in an
// enum object is undefined, so the harnesses never do; the library must
// cope with what C allows.
#pragma once

#include <stdint.h>

#include "flashspec.h"

#ifdef __cplusplus
extern "C" {
#endif

const char* fsfuzz_status_string(int32_t status);
const char* fsfuzz_status_name(int32_t status);
const char* fsfuzz_table_status_string(const flashspec_api* api, int32_t status);
double fsfuzz_rng_uniform(uint64_t seed, uint64_t request_id, uint64_t step, int32_t position, int32_t purpose,
                          int32_t token);
flashspec_status fsfuzz_lm_head_create(flashspec_context* ctx, const flashspec_tensor* weight, int32_t flags,
                                       flashspec_lm_head** out);

#ifdef __cplusplus
}
#endif
