// One sequence of a speculative loop: its tokens, its cache bookkeeping and
// the rules of each of its steps. The single-sequence engine and the batched
// engine both run their sequences through this class, so a sequence emits
// the same tokens in either: the arm and draft length of a step, the tokens
// of its target forward, the verify request (keyed by its own seed, request
// id and step), the rollback, and the delivery of the emitted tokens (stop
// tokens, budget, streaming, metrics, the policy's reward), the adaptive
// draft length of its drafters, and telling its drafters the final sequence.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bandit/draft_length.h"
#include "bandit/policy.h"
#include "bandit/reward.h"
#include "engine/drafter.h"
#include "engine/lm_head_runner.h"
#include "flashspec.h"
#include "metrics/metrics.h"

namespace flashspec {

struct Arm {
  int32_t drafter;    // index into the sequence's drafters; −1 when draft_len is 0
  int32_t draft_len;  // k ≥ 0
};

struct GenerateConfig {
  float temperature = 1.0f;
  uint64_t seed = 0;
  uint64_t request_id = 0;
  int32_t max_tokens = 1;
  std::vector<int32_t> stop_tokens;
  // Called once per emitted token; non-zero stops the sequence (HOST_STOP).
  // May be empty.
  std::function<int(int32_t token)> on_token;
};

// What a generation produced so far; still valid after a failure.
struct GenerateProgress {
  int32_t num_tokens = 0;
  int32_t steps = 0;
  flashspec_finish_reason finish_reason = FLASHSPEC_FINISH_NONE;
};

// The largest reward each arm can earn, from the drafters that play it.
RewardScale make_reward_scale(const CostModel& cost, const std::vector<Arm>& arms,
                              const std::vector<Drafter*>& drafters);

// What a sequence borrows from the engine that runs it.
struct SequenceShared {
  const std::vector<Arm>* arms = nullptr;
  const std::vector<Drafter*>* drafters = nullptr;  // indexed by Arm::drafter
  const CostModel* cost = nullptr;
  Policy* policy = nullptr;
  const RewardScale* reward_scale = nullptr;
  Metrics* metrics = nullptr;         // always recorded
  Metrics* extra_metrics = nullptr;   // also recorded, if set
  int64_t vocab = 0;
  int32_t max_context = 0;            // 0: unlimited
  // Each step drafts the k of DraftLengthRule (at most the arm's) instead
  // of the arm's k; the rule learns from this sequence's steps alone.
  bool adaptive_draft_len = false;
  double draft_len_memory = 64.0;  // ≥ 1, used when adaptive_draft_len
  // The host keeps chosen tokens of a tree step's forward (a keep callback):
  // the cache then holds the accepted path after a tree step.
  bool target_keeps = false;
};

// What the host's cache needs after a step's verify.
enum class CacheFix {
  kNone,      // it holds what the next step needs
  kRollback,  // truncate it to cache_length() (the rollback callback, if any)
  kKeep,      // keep forward_past() tokens, then the forward's tokens at keep()
};

class Sequence {
 public:
  // The drafters must be set; their costs fix the draft length rules.
  explicit Sequence(const SequenceShared& shared);

  // Starts over with this prompt (drafters begin too). tokens_out, if set,
  // receives the emitted tokens (capacity ≥ config.max_tokens).
  void begin(const int32_t* prompt, int32_t prompt_len, GenerateConfig config, int32_t* tokens_out);

  // The generation ended, finished or failed: the drafters see the final
  // sequence (the tokens emitted before a failure were streamed all the
  // same). Once per begin(); later calls do nothing.
  void end();

  // Before a step: true (finish_reason set) once the budget or the context
  // is used up.
  bool finished_before_step();

  // Picks the step's arm and drafts. Throws what the drafter throws; the
  // sequence is then as before the call, but for the policy's draw.
  void draft(LmHeadRunner& runner);
  int32_t drafted() const { return int32_t(proposal_.tokens.size()); }
  const DraftProposal& proposal() const { return proposal_; }
  // The step verifies a tree (flashspec.h, Tree steps): the drafter
  // proposed one, of at least one node (even one shaped as a chain).
  bool tree() const { return !proposal_.parents.empty(); }

  // The target forward of the step: the tokens the cache lacks, then the
  // drafts, appended to `tokens`; the cache must hold cache_length() tokens
  // before them; it returns drafted() + 1 rows. With `parents`, one entry
  // per token appended to it too: −1, or for a tree's node the index of its
  // parent among this sequence's tokens of the call.
  void append_forward_tokens(std::vector<int32_t>& tokens, std::vector<int32_t>* parents = nullptr) const;
  int32_t cache_length() const { return cache_length_; }
  // The forward succeeded: the cache now holds the drafts too.
  void forwarded();

  // The verify request of the step (hidden: this sequence's rows).
  SequenceVerify verify_request(const flashspec_tensor* hidden) const;

  // The verify accepted `accepted` drafts (a tree: the path's depth, its
  // nodes accepted_nodes[0 .. accepted)) and emitted emitted[0 .. accepted].
  // Says what the host's cache needs.
  CacheFix verified(int32_t accepted, const int32_t* emitted, const int32_t* accepted_nodes);
  // CacheFix::kKeep: the last forward's num_past and the indices of its
  // tokens to keep.
  int32_t forward_past() const { return forward_past_; }
  const std::vector<int32_t>& keep() const { return keep_; }

  // Emits the step's tokens, rewards the arm, records the step (its wall
  // time `seconds`). Returns true when the sequence finished. Throws
  // CALLBACK when the token callback throws (the tokens before it stay
  // emitted).
  bool deliver(double seconds);

  const GenerateProgress& progress() const { return progress_; }
  GenerateProgress& progress() { return progress_; }
  uint64_t step() const { return step_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }  // prompt, then emitted
  int32_t prompt_length() const { return prompt_len_; }
  // The draft length rule of a drafter (read by tests and metrics).
  const DraftLengthRule& draft_length_rule(int32_t drafter) const { return draft_length_rules_[size_t(drafter)]; }

 private:
  SequenceShared shared_;
  GenerateConfig config_;
  int32_t* tokens_out_ = nullptr;
  GenerateProgress progress_;
  std::vector<int32_t> tokens_;
  int32_t prompt_len_ = 0;
  int32_t cache_length_ = 0;
  uint64_t step_ = 0;
  bool ended_ = true;  // end() has run since begin()
  // One per drafter; they outlive generations, as the policy does.
  std::vector<DraftLengthRule> draft_length_rules_;

  // The step in progress.
  int32_t arm_index_ = 0;
  int32_t planned_draft_len_ = 0;  // before the budget and context limits
  int32_t draft_len_ = 0;
  bool drafter_called_ = false;
  int32_t accepted_ = 0;
  DraftProposal proposal_;
  std::vector<int32_t> emitted_;
  int32_t forward_past_ = 0;   // the cache length the forward started from
  int32_t forward_lacked_ = 0; // the tokens it appended before the drafts
  std::vector<int32_t> keep_;
};

}  // namespace flashspec
