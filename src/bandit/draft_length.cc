#include "bandit/draft_length.h"

#include <algorithm>

namespace flashspec {

int32_t DraftLengthRule::best_length(const CostModel& model, const DrafterCost& cost,
                                     const std::vector<double>& acceptance, int32_t max_len) {
  int32_t best = 0;
  double best_rate = 1.0 / step_cost(model, cost, false, 0);
  double reach = 1.0, tokens = 1.0;
  for (int32_t k = 1; k <= max_len && size_t(k) <= acceptance.size(); ++k) {
    reach *= acceptance[size_t(k - 1)];
    tokens += reach;
    const double rate = tokens / step_cost(model, cost, true, k);
    if (rate > best_rate) {
      best_rate = rate;
      best = k;
    }
  }
  return best;
}

double DraftLengthRule::acceptance(int32_t position) const {
  double estimate = 0.5;
  for (int32_t j = 0; j <= position; ++j) {
    const double accepted = size_t(j) < accepted_.size() ? accepted_[size_t(j)] : 0.0;
    const double trials = size_t(j) < trials_.size() ? trials_[size_t(j)] : 0.0;
    estimate = (accepted + kPriorTrials * estimate) / (trials + kPriorTrials);
  }
  return estimate;
}

int32_t DraftLengthRule::choose(int32_t max_len) const {
  std::vector<double> a(size_t(std::max(max_len, 0)));
  double estimate = 0.5;
  for (int32_t j = 0; j < max_len; ++j) {
    const double accepted = size_t(j) < accepted_.size() ? accepted_[size_t(j)] : 0.0;
    const double trials = size_t(j) < trials_.size() ? trials_[size_t(j)] : 0.0;
    a[size_t(j)] = estimate = (accepted + kPriorTrials * estimate) / (trials + kPriorTrials);
  }
  return best_length(model_, cost_, a, max_len);
}

void DraftLengthRule::record(int32_t drafted, int32_t accepted) {
  for (double& c : accepted_) c *= keep_;
  for (double& c : trials_) c *= keep_;
  const int32_t reached = std::min(drafted, accepted + 1);  // positions tried
  if (size_t(reached) > trials_.size()) {
    trials_.resize(size_t(reached), 0.0);
    accepted_.resize(size_t(reached), 0.0);
  }
  for (int32_t j = 0; j < reached; ++j) {
    trials_[size_t(j)] += 1.0;
    if (j < accepted) accepted_[size_t(j)] += 1.0;
  }
}

}  // namespace flashspec
