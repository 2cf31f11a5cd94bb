// The speculative decoding loop for one sequence: pick an arm, draft (a
// chain or a tree), run the host's target forward, verify through the fused
// LM head, roll the KV cache back (or keep a tree's accepted path), stream
// the tokens, record metrics and reward the arm.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "bandit/policy.h"
#include "bandit/reward.h"
#include "engine/drafter.h"
#include "engine/lm_head_runner.h"
#include "engine/sequence.h"
#include "flashspec.h"
#include "kernels/backend.h"
#include "metrics/metrics.h"

namespace flashspec {

struct EngineConfig {
  const LmHeadStorage* target_head = nullptr;
  flashspec_target_forward_fn target_forward = nullptr;
  flashspec_target_rollback_fn target_rollback = nullptr;
  flashspec_target_keep_fn target_keep = nullptr;
  void* target_user_data = nullptr;
  std::vector<Drafter*> drafters;  // borrowed
  std::vector<Arm> arms;
  PolicyConfig policy;
  CostModel cost;
  int32_t max_context = 0;  // 0: unlimited
  // SequenceShared::adaptive_draft_len and draft_len_memory.
  bool adaptive_draft_len = false;
  double draft_len_memory = 64.0;
};

class Engine {
 public:
  // The runner is borrowed; config is validated by the caller (C API). The
  // engine's own arguments to the runner are valid by construction: tokens
  // from the drafters and the host's callbacks are checked as they arrive.
  Engine(EngineConfig config, LmHeadRunner& runner);

  // Runs the loop; tokens_out (capacity ≥ max_tokens, or NULL) receives the
  // emitted tokens. Throws flashspec::Error; progress() then says what was
  // emitted before the failure.
  void generate(const int32_t* prompt, int32_t prompt_len, const GenerateConfig& config, int32_t* tokens_out);
  const GenerateProgress& progress() const { return sequence_.progress(); }

  // Thread-safe.
  void cancel() { cancel_requested_.store(true, std::memory_order_relaxed); }
  bool busy() const { return busy_; }

  const Metrics& metrics() const { return metrics_; }
  void reset_metrics() { metrics_.reset(); }
  const std::vector<Arm>& arms() const { return config_.arms; }
  int64_t vocab() const { return vocab_; }
  int32_t max_context() const { return config_.max_context; }

 private:
  // Steps sequence_ until it finishes; throws as generate() does.
  void run_loop();
  // One step of sequence_; returns true when the sequence finished.
  bool run_step();

  EngineConfig config_;
  LmHeadRunner& runner_;
  int64_t vocab_;
  int64_t hidden_;
  std::unique_ptr<Policy> policy_;
  RewardScale reward_scale_;
  Metrics metrics_;
  std::atomic<bool> cancel_requested_{false};
  bool busy_ = false;
  Sequence sequence_;
  std::vector<int32_t> forward_tokens_, forward_parents_;
  std::vector<int32_t> emitted_, accepted_nodes_;
};

}  // namespace flashspec
