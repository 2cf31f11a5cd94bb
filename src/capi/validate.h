// Argument validation for the C API: every check runs before any memory is
// touched, and each failure names the argument.
#pragma once

#include <cstdint>
#include <cstring>

#include "capi/handles.h"
#include "kernels/backend.h"

namespace flashspec {

// The integer a C caller stored in an enum field or argument. C allows any
// int there; in C++ reading an enum object that holds a value outside the
// enum's range (a negative one, here) is undefined, so validation reads the
// bits and checks them before the value is used as the enum.
template <class Enum>
int32_t raw_enum(const Enum& value) {
  static_assert(sizeof(Enum) == sizeof(int32_t), "flashspec enums are 32-bit");
  int32_t raw;
  std::memcpy(&raw, &value, sizeof raw);
  return raw;
}

// A head of this context's backend and device.
const LmHeadStorage& validate_head(const flashspec_context& ctx, const flashspec_lm_head* head, const char* argument);

// A view that can be read: data non-NULL, known dtype and memory, sizes
// positive, row_stride ≥ cols, byte size without overflow.
void validate_tensor(const flashspec_tensor* t, const char* argument);

void validate_struct_size(uint32_t given, size_t expected, const char* argument);

void validate_temperature(float t, const char* argument);

// Validates a draft call and fills args (defaults resolved).
DraftArgs validate_draft(const flashspec_context& ctx, const LmHeadStorage& head, const flashspec_tensor* hidden,
                         const flashspec_draft_params* params, int32_t* tokens_out, float* scores_out);

// Validates a verify batch against the head, the summaries it will fill and
// the context's max_rows; total sizes are read from the offsets when they
// are host memory (CPU backend). `summaries_name` names the store in errors.
VerifyArgs validate_batch(const flashspec_context& ctx, const LmHeadStorage& head,
                          const flashspec_verify_batch* batch, const SummaryStore& summaries,
                          const char* summaries_name);

// What a verify of `batch` (validated as `args`) leaves for finalize to check.
VerifiedBatch describe_batch(const LmHeadStorage& head, const flashspec_verify_batch& batch, const VerifyArgs& args);

// Validates a batch for finalize: well formed, and the batch the summaries
// describe (`verified`).
VerifyArgs validate_batch_for_finalize(const flashspec_context& ctx, const flashspec_verify_batch* batch,
                                       const VerifiedBatch& verified);

ResultArgs validate_result(const flashspec_context& ctx, const flashspec_verify_result* result);

}  // namespace flashspec
