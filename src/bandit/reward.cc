#include "bandit/reward.h"

#include <algorithm>
#include <cmath>

namespace flashspec {

double step_cost(const CostModel& model, const DrafterCost& drafter, bool drafter_called, int32_t drafted) {
  return model.target_step_cost + model.target_row_cost * double(drafted + 1) +
         (drafter_called ? drafter.call_cost : 0.0) + drafter.token_cost * double(drafted);
}

double step_reward(const CostModel& model, const DrafterCost& drafter, bool drafter_called, int32_t drafted,
                   int32_t accepted) {
  return double(accepted + 1) / step_cost(model, drafter, drafter_called, drafted);
}

RewardScale::RewardScale(const CostModel& model, const std::vector<DrafterCost>& arm_costs,
                         const std::vector<int32_t>& arm_lengths) {
  // (n + 1) / cost(n) is monotone in n (cost is affine in n), so an arm's
  // best case is at n = 0 (drafter not called) or n = its length, all accepted.
  double best = 0.0;
  for (size_t a = 0; a < arm_costs.size(); ++a) {
    best = std::max(best, step_reward(model, arm_costs[a], false, 0, 0));
    best = std::max(best, step_reward(model, arm_costs[a], true, arm_lengths[a], arm_lengths[a]));
  }
  if (best > 0.0 && std::isfinite(best)) max_reward_ = best;
}

double RewardScale::normalize(double reward) const {
  return std::min(1.0, std::max(0.0, reward / max_reward_));
}

}  // namespace flashspec
