#include "metrics/metrics.h"

#include <algorithm>

namespace flashspec {

void Metrics::record(const StepRecord& step) {
  steps_ += 1;
  if (step.drafted > 0) drafts_ += 1;
  draft_tokens_ += uint64_t(step.drafted);
  accepted_tokens_ += uint64_t(step.accepted);
  emitted_tokens_ += uint64_t(step.delivered);
  if (size_t(step.drafted) > position_drafted_.size()) {
    position_drafted_.resize(size_t(step.drafted), 0);
    position_accepted_.resize(size_t(step.drafted), 0);
  }
  for (int32_t j = 0; j < step.drafted; ++j) position_drafted_[size_t(j)] += 1;
  for (int32_t j = 0; j < step.accepted; ++j) position_accepted_[size_t(j)] += 1;
  if (step.arm >= 0 && size_t(step.arm) < arms_.size()) {
    ArmStats& arm = arms_[size_t(step.arm)];
    arm.pulls += 1;
    arm.draft_tokens += uint64_t(step.drafted);
    arm.accepted_tokens += uint64_t(step.accepted);
    arm.reward_sum += step.reward;
    arm.cost_sum += step.cost;
  }
  latency_.record(step.seconds);
}

MetricsSnapshot Metrics::snapshot() const {
  MetricsSnapshot s;
  s.steps = steps_;
  s.drafts = drafts_;
  s.draft_tokens = draft_tokens_;
  s.accepted_tokens = accepted_tokens_;
  s.emitted_tokens = emitted_tokens_;
  s.acceptance_rate = draft_tokens_ ? double(accepted_tokens_) / double(draft_tokens_) : 0.0;
  s.mean_accepted_length = drafts_ ? double(accepted_tokens_) / double(drafts_) : 0.0;
  s.tokens_per_step = steps_ ? double(emitted_tokens_) / double(steps_) : 0.0;
  s.latency_p50_seconds = latency_.quantile(0.50);
  s.latency_p99_seconds = latency_.quantile(0.99);
  s.num_positions = int32_t(position_drafted_.size());
  return s;
}

void Metrics::reset() {
  const size_t arms = arms_.size();
  *this = Metrics(int32_t(arms));
}

}  // namespace flashspec
