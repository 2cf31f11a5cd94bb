// Argument validation for the C API: every check runs before any memory is
// touched, and each failure names the argument.
#pragma once

#include <cstdint>
#include <cstring>

#include "capi/handles.h"
#include "kernels/backend.h"
#include "util/raw_enum.h"

namespace flashspec {

// A head of this context's backend and device; a vocabulary shard only
// where `shard_call`.
const LmHeadStorage& validate_head(const flashspec_context& ctx, const flashspec_lm_head* head, const char* argument,
                                   bool shard_call = false);

// A view that can be read: data non-NULL, known dtype and memory, sizes
// positive, row_stride ≥ cols, byte size without overflow.
// The view's own rules (flashspec.h: flashspec_tensor); 8-bit dtypes only
// where codes_allowed (an LM head's weight).
void validate_tensor(const flashspec_tensor* t, const char* argument, bool codes_allowed = false);

void validate_temperature(float t, const char* argument);

// Validates a draft call and fills args (defaults resolved).
DraftArgs validate_draft(const flashspec_context& ctx, const LmHeadStorage& head, const flashspec_tensor* hidden,
                         const flashspec_draft_params* params, int32_t* tokens_out, float* scores_out);

// Validates a fused top-k draft (flashspec_draft_top_k) of k tokens per row
// into tokens_out / logprobs_out ([rows, k]); the outputs are not stored in
// the returned args.
DraftArgs validate_draft_top_k(const flashspec_context& ctx, const LmHeadStorage& head, const flashspec_tensor* hidden,
                               const flashspec_draft_params* params, int32_t k, const int32_t* tokens_out,
                               const float* logprobs_out);

// A batch as today's struct (params.h: load_struct), NULL refused.
flashspec_verify_batch load_batch(const flashspec_verify_batch* batch);

// Validates a verify batch against the head, the summaries it will fill and
// the context's max_rows; total sizes are read from the offsets when they
// are host memory (CPU backend). `summaries_name` names the store in errors.
VerifyArgs validate_batch(const flashspec_context& ctx, const LmHeadStorage& head,
                          const flashspec_verify_batch& batch, const SummaryStore* summaries,
                          const char* summaries_name);

// Vocabulary shards (flashspec.h): a shard's verify or draft writing
// `records`; finalize and draft from the gathered records of `shards` ranks
// (host records are checked: version, slices tiling the vocabulary).
VerifyArgs validate_verify_shard(const flashspec_context& ctx, const LmHeadStorage& head,
                                 const flashspec_verify_batch& batch, const void* records);
VerifyArgs validate_finalize_shards(const flashspec_context& ctx, const flashspec_verify_batch& batch,
                                    const void* records, int32_t shards);
DraftArgs validate_draft_shard(const flashspec_context& ctx, const LmHeadStorage& head,
                               const flashspec_tensor* hidden, const flashspec_draft_params* params,
                               const void* records);
DraftArgs validate_draft_from_shards(const flashspec_context& ctx, const flashspec_draft_params* params,
                                     const void* records, int32_t shards, int32_t rows, int32_t* tokens_out,
                                     float* scores_out);

// What a verify of `batch` (validated as `args`) leaves for finalize to check.
VerifiedBatch describe_batch(const LmHeadStorage& head, const flashspec_verify_batch& batch, const VerifyArgs& args);

// Validates a batch for finalize: well formed, and the batch the summaries
// describe (`verified`).
VerifyArgs validate_batch_for_finalize(const flashspec_context& ctx, const flashspec_verify_batch& batch,
                                       const VerifiedBatch& verified);

ResultArgs validate_result(const flashspec_context& ctx, const flashspec_verify_result* result);

// Logprob outputs need a verify that kept them: `source` names the struct
// that asks ("batch").
void validate_result_requests(const ResultArgs& result, bool logprobs_kept, int32_t top_logprobs_kept,
                              const char* source);

// The aliasing rule of flashspec_finalize: no output shares memory with an
// input (the batch's arrays and, for finalize_shards, the `shards` ranks'
// records) or another output, except next_steps == batch->steps exactly.
// `host`: the batch lives in host memory (the backend's memory).
void validate_result_disjoint(const VerifyArgs& args, const ResultArgs& result, bool host,
                              const void* records = nullptr, int32_t shards = 0);

}  // namespace flashspec
