// How the engine reaches FlashSpec's fused LM head. The engine sits below
// the C API (DESIGN.md §2), so it states what it needs here and the C API
// layer implements it with flashspec_draft and flashspec_verify_and_finalize:
// the engine's target sampling is exactly the public fused verify.
#pragma once

#include <cstdint>

#include "flashspec.h"

namespace flashspec {

class LmHeadRunner {
 public:
  virtual ~LmHeadRunner() = default;
  // Where hidden rows, logits and index arrays must live for this backend.
  virtual flashspec_memory memory() const = 0;
  // Most target rows one verify may hold (the context's max_rows).
  virtual int32_t max_rows() const = 0;
  virtual int64_t vocab_size(const flashspec_lm_head* head) const = 0;
  virtual int64_t hidden_size(const flashspec_lm_head* head) const = 0;
  // Greedy fused draft: tokens_out[r] = argmax of hidden row r · Wᵀ.
  virtual void draft_greedy(const flashspec_lm_head* head, const flashspec_tensor& hidden, int32_t* tokens_out) = 0;
  // flashspec_verify_and_finalize; throws flashspec::Error on failure.
  virtual void verify_and_finalize(const flashspec_lm_head* head, const flashspec_verify_batch& batch,
                                   const flashspec_verify_result& result) = 0;
};

}  // namespace flashspec
