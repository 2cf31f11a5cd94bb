// Thompson sampling with Beta posteriors. Rewards in [0, 1] are turned into
// Bernoulli outcomes (success with probability equal to the reward, the
// binarisation of Agrawal & Goyal 2012), so each arm's posterior stays a
// Beta(1 + successes, 1 + failures) and the policy keeps the O(log t) regret
// of Bernoulli Thompson sampling for any reward distribution on [0, 1].
// Each round draws θ_a ~ Beta for every arm and plays the largest.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "bandit/policy.h"
#include "bandit/random_stream.h"
#include "util/status.h"

namespace flashspec {
namespace {

// Draws of a round use arm ids 0..A−1; the binarisation of an update uses
// this id, so the two never share a counter.
constexpr uint32_t kBinarizeStream = 0xffffffffu;

class Thompson final : public Policy {
 public:
  Thompson(int32_t arms, uint64_t seed) : seed_(seed), successes_(size_t(arms)), failures_(size_t(arms)) {}

  int32_t select() override {
    int32_t best = 0;
    double best_theta = -1.0;
    for (int32_t a = 0; a < num_arms(); ++a) {
      RandomStream stream(seed_, round_, uint32_t(a));
      const double theta = stream.beta(1.0 + successes_[size_t(a)], 1.0 + failures_[size_t(a)]);
      if (theta > best_theta) {
        best_theta = theta;
        best = a;
      }
    }
    return best;
  }

  void update(int32_t arm, double reward) override {
    require(arm >= 0 && arm < num_arms(), FLASHSPEC_ERR_OUT_OF_RANGE, "policy update", "arm outside [0, num_arms)");
    const double r = std::isnan(reward) ? 0.0 : std::min(1.0, std::max(0.0, reward));
    RandomStream stream(seed_, round_, kBinarizeStream);
    if (stream.uniform() < r)
      successes_[size_t(arm)] += 1.0;
    else
      failures_[size_t(arm)] += 1.0;
    round_ += 1;
  }

  void reset() override {
    std::fill(successes_.begin(), successes_.end(), 0.0);
    std::fill(failures_.begin(), failures_.end(), 0.0);
    round_ = 0;
  }

  int32_t num_arms() const override { return int32_t(successes_.size()); }

 private:
  uint64_t seed_;
  uint64_t round_ = 0;
  std::vector<double> successes_;
  std::vector<double> failures_;
};

}  // namespace

std::unique_ptr<Policy> make_thompson_policy(int32_t num_arms, uint64_t seed) {
  require(num_arms >= 1, FLASHSPEC_ERR_OUT_OF_RANGE, "num_arms", "must be >= 1");
  return std::make_unique<Thompson>(num_arms, seed);
}

}  // namespace flashspec
