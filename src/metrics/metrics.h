// Acceptance metrics of a speculative engine: totals, the per-position
// acceptance counts, per-arm statistics and step latency. Plain counters,
// updated once per verify step; snapshot() copies them out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "metrics/latency_histogram.h"

namespace flashspec {

// One verify step as the engine saw it.
struct StepRecord {
  int32_t arm;        // the bandit arm played
  int32_t drafted;    // draft tokens verified, n
  int32_t accepted;   // accepted draft tokens, 0..n
  int32_t delivered;  // tokens handed to the host (≤ accepted + 1: a stop or the
                      // length limit can cut the step short)
  double reward;      // tokens per unit cost (bandit/reward.h)
  double cost;
  double seconds;     // wall time of the step
};

struct ArmStats {
  uint64_t pulls = 0;
  uint64_t draft_tokens = 0;
  uint64_t accepted_tokens = 0;
  double reward_sum = 0.0;
  double cost_sum = 0.0;
};

struct MetricsSnapshot {
  uint64_t steps = 0;
  uint64_t drafts = 0;  // steps that verified at least one draft token
  uint64_t draft_tokens = 0;
  uint64_t accepted_tokens = 0;
  uint64_t emitted_tokens = 0;
  double acceptance_rate = 0.0;       // accepted / draft tokens
  double mean_accepted_length = 0.0;  // accepted / drafts
  double tokens_per_step = 0.0;       // emitted / steps
  double latency_p50_seconds = 0.0;
  double latency_p99_seconds = 0.0;
  int32_t num_positions = 0;  // longest draft verified so far
};

class Metrics {
 public:
  explicit Metrics(int32_t num_arms) : arms_(size_t(num_arms)) {}

  void record(const StepRecord& step);
  MetricsSnapshot snapshot() const;
  // position_drafted()[j]: steps whose draft had at least j + 1 tokens;
  // position_accepted()[j]: steps that accepted at least j + 1 of them.
  // Both are non-increasing in j, and accepted[j] ≤ drafted[j].
  const std::vector<uint64_t>& position_drafted() const { return position_drafted_; }
  const std::vector<uint64_t>& position_accepted() const { return position_accepted_; }
  const std::vector<ArmStats>& arms() const { return arms_; }
  void reset();

 private:
  uint64_t steps_ = 0;
  uint64_t drafts_ = 0;
  uint64_t draft_tokens_ = 0;
  uint64_t accepted_tokens_ = 0;
  uint64_t emitted_tokens_ = 0;
  std::vector<uint64_t> position_drafted_;
  std::vector<uint64_t> position_accepted_;
  std::vector<ArmStats> arms_;
  LatencyHistogram latency_;
};

}  // namespace flashspec
