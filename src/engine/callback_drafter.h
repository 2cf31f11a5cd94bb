// A drafter backed by a host callback (flashspec_draft_fn): tokens only
// (point-mass draft), tokens with their draft logits rows (stochastic draft),
// a tree of point-mass tokens with their parents, or draft hidden rows that
// FlashSpec drafts greedily with its fused draft.
// Every output of the callback is checked; anything wrong is
// FLASHSPEC_ERR_CALLBACK with a message saying what.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/drafter.h"
#include "flashspec.h"
#include "kernels/backend.h"

namespace flashspec {

struct CallbackDrafterConfig {
  flashspec_draft_kind kind = FLASHSPEC_DRAFT_TOKENS;
  flashspec_draft_fn draft = nullptr;
  void* user_data = nullptr;
  float draft_temperature = 1.0f;          // LOGITS
  const LmHeadStorage* head = nullptr;     // HIDDEN
  DrafterCost cost;
};

class CallbackDrafter final : public Drafter {
 public:
  explicit CallbackDrafter(const CallbackDrafterConfig& config) : config_(config) {}

  void begin(const int32_t*, int32_t) override {}
  void propose(const DraftRequest& request, LmHeadRunner& runner, DraftProposal& out) override;
  DrafterCost cost() const override { return config_.cost; }

 private:
  void propose_tokens(const DraftRequest& request, LmHeadRunner& runner, DraftProposal& out);
  void propose_hidden(const DraftRequest& request, LmHeadRunner& runner, DraftProposal& out);
  flashspec_draft_call make_call(const DraftRequest& request, int32_t max_tokens);
  void invoke(flashspec_draft_call& call);

  CallbackDrafterConfig config_;
  std::vector<int32_t> buffer_;
  std::vector<int32_t> parents_;  // TREE
};

// Checks a view a callback returned: data, dtype, memory, rows and cols.
// Fails with FLASHSPEC_ERR_CALLBACK, the message starting with `what`.
void check_callback_view(const flashspec_tensor& view, const char* what, flashspec_memory memory, int64_t rows,
                         int64_t cols);

}  // namespace flashspec
