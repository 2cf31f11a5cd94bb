// The speculative loop for many sequences at once: each step drafts for
// every active sequence (chains or trees), runs the host's target forward
// once over the ragged batch, verifies every sequence in one fused pass
// (as trees, chains included, when any sequence drafted a tree), then rolls
// back (or keeps a tree's path), streams and finishes each sequence on its
// own. Each sequence runs the
// single engine's step rules (engine/sequence.h) with its own drafters,
// policy and metrics, so it emits what a fresh single engine would.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bandit/policy.h"
#include "bandit/reward.h"
#include "engine/drafter.h"
#include "engine/lm_head_runner.h"
#include "engine/sequence.h"
#include "flashspec.h"
#include "kernels/backend.h"
#include "metrics/metrics.h"
#include "util/status.h"

namespace flashspec {

struct BatchEngineConfig {
  const LmHeadStorage* target_head = nullptr;
  flashspec_batch_target_forward_fn target_forward = nullptr;
  flashspec_batch_target_rollback_fn target_rollback = nullptr;
  flashspec_batch_target_keep_fn target_keep = nullptr;
  void* target_user_data = nullptr;
  int32_t num_drafters = 0;  // drafters each sequence brings
  std::vector<Arm> arms;
  PolicyConfig policy;
  CostModel cost;
  int32_t max_context = 0;    // 0: unlimited
  int32_t max_sequences = 1;  // fits the runner's max_rows and max_requests
  // SequenceShared::adaptive_draft_len and draft_len_memory, per sequence.
  bool adaptive_draft_len = false;
  double draft_len_memory = 64.0;
};

class BatchEngine {
 public:
  // One sequence in the engine.
  struct Slot {
    Slot(uint64_t id, std::vector<Drafter*> drafters, const BatchEngineConfig& config, Metrics& totals,
         int64_t vocab);
    uint64_t id;
    std::vector<Drafter*> drafters;  // borrowed, indexed by Arm::drafter
    std::unique_ptr<Policy> policy;
    RewardScale reward_scale;
    Metrics metrics;
    Sequence sequence;
    bool active = true;
    flashspec_status status = FLASHSPEC_OK;
    std::string error;  // the message of `status`
  };

  // The runner is borrowed; config is validated by the caller (C API).
  BatchEngine(BatchEngineConfig config, LmHeadRunner& runner);

  // The caller has checked the id is new, there is room, and the prompt,
  // config and drafters are valid. tokens of the sequence: Slot::sequence.
  void add(uint64_t id, const int32_t* prompt, int32_t prompt_len, GenerateConfig config,
           std::vector<Drafter*> drafters);
  // Returns false for an id not in the engine. An active sequence ends
  // (its drafters see its final sequence) before it leaves.
  bool remove(uint64_t id);
  const Slot* find(uint64_t id) const;
  int32_t size() const { return int32_t(slots_.size()); }

  // One step of every active sequence; returns how many are still active.
  // Errors of one sequence end it (Slot::status); errors of the step as a
  // whole throw flashspec::Error and leave every sequence as it was.
  int32_t step();
  bool busy() const { return busy_; }

  const Metrics& metrics() const { return metrics_; }
  const std::vector<Arm>& arms() const { return config_.arms; }
  const BatchEngineConfig& config() const { return config_; }
  int64_t vocab() const { return vocab_; }
  const std::vector<std::unique_ptr<Slot>>& slots() const { return slots_; }

 private:
  // Runs the step's forward; returns the hidden rows of the stepping slots.
  flashspec_tensor forward_target();
  // Verifies the stepping slots in one pass.
  void verify(const flashspec_tensor& hidden);
  // A slot stops: its drafters see its final sequence.
  static void finish(Slot& slot);
  static void end_with_error(Slot& slot, const Error& error);

  BatchEngineConfig config_;
  LmHeadRunner& runner_;
  int64_t vocab_;
  int64_t hidden_;
  Metrics metrics_;
  bool busy_ = false;
  uint64_t step_count_ = 0;
  std::vector<std::unique_ptr<Slot>> slots_;  // in the order they joined

  // The step in progress.
  std::vector<Slot*> stepping_;
  std::vector<uint64_t> ids_;
  std::vector<int32_t> num_past_, token_offsets_, tokens_, row_offsets_, parents_;
  std::vector<SequenceVerify> requests_;
  std::vector<int32_t> accepted_, emitted_, accepted_nodes_;
};

}  // namespace flashspec
