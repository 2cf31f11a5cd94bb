// The reward of one speculative step, and its scaling to [0, 1] for the
// policies. The cost model is the one documented in flashspec.h
// (flashspec_engine_params):
//
//   cost = target_step_cost + target_row_cost · (n + 1)
//        + drafter_call_cost · [drafter called] + drafter_token_cost · n
//   reward = (accepted + 1) / cost
//
// with n the draft tokens verified. The +1 counts the token the target emits
// every step (recovered or bonus), so the reward is the step's throughput in
// tokens per unit cost and a "no draft" arm (n = 0) earns 1 / cost.
#pragma once

#include <cstdint>
#include <vector>

namespace flashspec {

struct CostModel {
  double target_step_cost = 1.0;  // one target forward, > 0
  double target_row_cost = 0.0;   // each row the target scores, ≥ 0
};

struct DrafterCost {
  double call_cost = 0.0;   // per step the drafter is asked, ≥ 0
  double token_cost = 0.0;  // per draft token it proposes, ≥ 0
};

double step_cost(const CostModel& model, const DrafterCost& drafter, bool drafter_called, int32_t drafted);

double step_reward(const CostModel& model, const DrafterCost& drafter, bool drafter_called, int32_t drafted,
                   int32_t accepted);

// Divides rewards by the largest reward any arm can earn, so a policy sees
// values in [0, 1]. Arms are given as (drafter cost, draft length).
class RewardScale {
 public:
  RewardScale(const CostModel& model, const std::vector<DrafterCost>& arm_costs,
              const std::vector<int32_t>& arm_lengths);
  double max_reward() const { return max_reward_; }
  double normalize(double reward) const;

 private:
  double max_reward_ = 1.0;
};

}  // namespace flashspec
