// Drafter selection as a multi-armed bandit. An arm is an index the engine
// maps to a (drafter, draft length) pair; a policy picks an arm each round
// and learns from the reward the engine reports for it. Rewards given to a
// policy lie in [0, 1] (reward.h scales the engine's tokens-per-cost to it).
// Every policy is deterministic given its configuration and seed.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace flashspec {

enum class PolicyKind {
  kUcb1,      // UCB1 (Auer, Cesa-Bianchi, Fischer 2002)
  kThompson,  // Thompson sampling, Beta posteriors (Agrawal & Goyal 2012)
  kFixed,     // always the same arm
  kOracle,    // always the arm with the highest known mean (for tests)
};

struct PolicyConfig {
  PolicyKind kind = PolicyKind::kUcb1;
  int32_t num_arms = 1;
  uint64_t seed = 0;             // Thompson sampling's random stream
  double exploration = 1.0;      // UCB1: index = mean + exploration * sqrt(2 ln t / n)
  int32_t fixed_arm = 0;         // kFixed
  std::vector<double> oracle_means;  // kOracle: the true mean reward of each arm
};

class Policy {
 public:
  virtual ~Policy() = default;
  // The arm to play next; ties go to the smallest index.
  virtual int32_t select() = 0;
  // The reward, clamped to [0, 1], that the arm selected last earned.
  virtual void update(int32_t arm, double reward) = 0;
  // Forget everything learned; the random stream restarts from the seed.
  virtual void reset() = 0;
  virtual int32_t num_arms() const = 0;
};

// Throws flashspec::Error (INVALID_ARGUMENT / OUT_OF_RANGE) on a bad config.
std::unique_ptr<Policy> make_policy(const PolicyConfig& config);

std::unique_ptr<Policy> make_ucb1_policy(int32_t num_arms, double exploration);
std::unique_ptr<Policy> make_thompson_policy(int32_t num_arms, uint64_t seed);
std::unique_ptr<Policy> make_fixed_policy(int32_t num_arms, int32_t arm);
std::unique_ptr<Policy> make_oracle_policy(std::vector<double> means);

}  // namespace flashspec
