// Drafter selection: UCB1 and Thompson sampling on stationary Bernoulli
// bandits (the best arm dominates late rounds; regret grows sublinearly, a
// non-learning policy's linearly), determinism, fixed and oracle policies,
// and the reward scale.
#include <gtest/gtest.h>

#include <vector>

#include "bandit/policy.h"
#include "bandit/reward.h"
#include "engine_support.h"
#include "util/status.h"

namespace {

using namespace flashspec;

const std::vector<double> kMeans = {0.30, 0.50, 0.72, 0.45, 0.55};
constexpr int32_t kBest = 2;

struct Run {
  std::vector<double> regret;  // cumulative pseudo-regret after each round
  double late_best_fraction;   // share of the last quarter of rounds on the best arm
};

Run play(Policy& policy, int32_t rounds, uint64_t env_seed) {
  fstest::Rng env(env_seed);
  Run run;
  double regret = 0.0;
  int32_t late_best = 0;
  const int32_t late_start = rounds - rounds / 4;
  for (int32_t t = 0; t < rounds; ++t) {
    const int32_t arm = policy.select();
    EXPECT_GE(arm, 0);
    EXPECT_LT(arm, int32_t(kMeans.size()));
    regret += kMeans[kBest] - kMeans[size_t(arm)];
    run.regret.push_back(regret);
    if (t >= late_start && arm == kBest) ++late_best;
    policy.update(arm, env.uniform() < kMeans[size_t(arm)] ? 1.0 : 0.0);
  }
  run.late_best_fraction = double(late_best) / double(rounds / 4);
  return run;
}

// Mean over environments of the late-round share and of regret at T and 2T.
struct Summary {
  double late_best_fraction = 0.0;
  double regret_t = 0.0, regret_2t = 0.0;
};

template <class MakePolicy>
Summary evaluate(MakePolicy make, int32_t t, int32_t environments) {
  Summary s;
  for (int32_t e = 0; e < environments; ++e) {
    std::unique_ptr<Policy> policy = make(uint64_t(e));
    Run run = play(*policy, 2 * t, 1000 + uint64_t(e));
    // Late rounds of the 2T-round run.
    s.late_best_fraction += run.late_best_fraction / environments;
    s.regret_t += run.regret[size_t(t - 1)] / environments;
    s.regret_2t += run.regret[size_t(2 * t - 1)] / environments;
  }
  return s;
}

constexpr int32_t kT = 6000;
constexpr int32_t kEnvironments = 8;

TEST(Bandit, Ucb1FindsTheBestArmWithSublinearRegret) {
  Summary s = evaluate([](uint64_t) { return make_ucb1_policy(int32_t(kMeans.size()), 1.0); }, kT, kEnvironments);
  EXPECT_GE(s.late_best_fraction, 0.90);
  EXPECT_GT(s.regret_t, 0.0);
  EXPECT_LT(s.regret_2t / s.regret_t, 1.5) << "R(T) " << s.regret_t << " R(2T) " << s.regret_2t;
}

TEST(Bandit, ThompsonFindsTheBestArmWithSublinearRegret) {
  Summary s = evaluate([](uint64_t seed) { return make_thompson_policy(int32_t(kMeans.size()), seed); }, kT,
                       kEnvironments);
  EXPECT_GE(s.late_best_fraction, 0.90);
  EXPECT_GT(s.regret_t, 0.0);
  EXPECT_LT(s.regret_2t / s.regret_t, 1.5) << "R(T) " << s.regret_t << " R(2T) " << s.regret_2t;
}

TEST(Bandit, TheRegretCheckRejectsPoliciesThatDoNotLearn) {
  // Power of the checks above: a fixed suboptimal arm and a uniformly random
  // choice (a pure explorer) have linear regret, ratio 2.
  Summary fixed = evaluate([](uint64_t) { return make_fixed_policy(int32_t(kMeans.size()), 1); }, kT, kEnvironments);
  EXPECT_NEAR(fixed.regret_2t / fixed.regret_t, 2.0, 1e-9);
  EXPECT_LT(fixed.late_best_fraction, 0.90);
  // UCB1 with a huge exploration bonus keeps trying every arm.
  Summary explorer =
      evaluate([](uint64_t) { return make_ucb1_policy(int32_t(kMeans.size()), 50.0); }, kT, kEnvironments);
  EXPECT_GT(explorer.regret_2t / explorer.regret_t, 1.5);
  EXPECT_LT(explorer.late_best_fraction, 0.90);
}

TEST(Bandit, ThompsonIsDeterministicGivenItsSeed) {
  auto sequence = [](uint64_t seed) {
    std::unique_ptr<Policy> p = make_thompson_policy(4, seed);
    fstest::Rng env(3);
    std::vector<int32_t> arms;
    for (int t = 0; t < 300; ++t) {
      arms.push_back(p->select());
      p->update(arms.back(), env.uniform());
    }
    return arms;
  };
  EXPECT_EQ(sequence(11), sequence(11));
  EXPECT_NE(sequence(11), sequence(12));
  // reset() replays from the seed.
  std::unique_ptr<Policy> p = make_thompson_policy(4, 11);
  for (int t = 0; t < 50; ++t) p->update(p->select(), 0.5);
  p->reset();
  fstest::Rng env(3);
  std::vector<int32_t> replay;
  for (int t = 0; t < 300; ++t) {
    replay.push_back(p->select());
    p->update(replay.back(), env.uniform());
  }
  EXPECT_EQ(replay, sequence(11));
}

TEST(Bandit, Ucb1PlaysEveryArmOnceFirstInOrder) {
  std::unique_ptr<Policy> p = make_ucb1_policy(3, 1.0);
  for (int32_t a = 0; a < 3; ++a) {
    EXPECT_EQ(p->select(), a);
    p->update(a, 0.0);
  }
}

TEST(Bandit, FixedAndOracle) {
  std::unique_ptr<Policy> fixed = make_fixed_policy(3, 2);
  for (int t = 0; t < 5; ++t) {
    EXPECT_EQ(fixed->select(), 2);
    fixed->update(2, 0.0);
  }
  std::unique_ptr<Policy> oracle = make_oracle_policy({0.1, 0.9, 0.9, 0.3});
  EXPECT_EQ(oracle->select(), 1);  // ties: smallest index
  EXPECT_THROW(make_fixed_policy(3, 3), Error);
  EXPECT_THROW(make_oracle_policy({}), Error);
  PolicyConfig config;
  config.kind = PolicyKind::kOracle;
  config.num_arms = 2;
  config.oracle_means = {1.0};
  EXPECT_THROW(make_policy(config), Error);
}

TEST(Reward, CostModelAndScale) {
  CostModel model;
  model.target_step_cost = 1.0;
  model.target_row_cost = 0.1;
  DrafterCost drafter{0.2, 0.05};
  // cost = 1 + 0.1 · 4 + 0.2 + 0.05 · 3 = 1.75; reward = 3 / 1.75.
  EXPECT_DOUBLE_EQ(step_cost(model, drafter, true, 3), 1.75);
  EXPECT_DOUBLE_EQ(step_reward(model, drafter, true, 3, 2), 3.0 / 1.75);
  // Not called, nothing drafted: only the target.
  EXPECT_DOUBLE_EQ(step_cost(model, drafter, false, 0), 1.1);
  RewardScale scale(model, {DrafterCost{}, drafter}, {0, 3});
  EXPECT_DOUBLE_EQ(scale.max_reward(), 4.0 / 1.75);
  EXPECT_DOUBLE_EQ(scale.normalize(4.0 / 1.75), 1.0);
  EXPECT_DOUBLE_EQ(scale.normalize(1.0 / 1.1), (1.0 / 1.1) / (4.0 / 1.75));
  EXPECT_GE(scale.normalize(-1.0), 0.0);
  EXPECT_LE(scale.normalize(100.0), 1.0);
}

}  // namespace
