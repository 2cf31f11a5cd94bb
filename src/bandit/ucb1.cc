// UCB1: play each arm once, then the arm maximising
//   mean_a + exploration * sqrt(2 ln t / n_a),
// t the number of rounds so far, n_a the arm's plays. With rewards in [0, 1]
// and exploration 1 this is the policy of Auer et al. (2002), whose expected
// regret grows as O(log t).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "bandit/policy.h"
#include "util/status.h"

namespace flashspec {
namespace {

class Ucb1 final : public Policy {
 public:
  Ucb1(int32_t arms, double exploration) : exploration_(exploration), plays_(size_t(arms)), sums_(size_t(arms)) {}

  int32_t select() override {
    const int32_t arms = num_arms();
    for (int32_t a = 0; a < arms; ++a)
      if (plays_[size_t(a)] == 0) return a;
    const double log_t = std::log(double(rounds_));
    int32_t best = 0;
    double best_index = -1.0;
    for (int32_t a = 0; a < arms; ++a) {
      const double n = double(plays_[size_t(a)]);
      const double index = sums_[size_t(a)] / n + exploration_ * std::sqrt(2.0 * log_t / n);
      if (index > best_index) {
        best_index = index;
        best = a;
      }
    }
    return best;
  }

  void update(int32_t arm, double reward) override {
    require(arm >= 0 && arm < num_arms(), FLASHSPEC_ERR_OUT_OF_RANGE, "policy update", "arm outside [0, num_arms)");
    plays_[size_t(arm)] += 1;
    sums_[size_t(arm)] += std::isnan(reward) ? 0.0 : std::fmin(1.0, std::fmax(0.0, reward));
    rounds_ += 1;
  }

  void reset() override {
    std::fill(plays_.begin(), plays_.end(), 0);
    std::fill(sums_.begin(), sums_.end(), 0.0);
    rounds_ = 0;
  }

  int32_t num_arms() const override { return int32_t(plays_.size()); }

 private:
  double exploration_;
  std::vector<uint64_t> plays_;
  std::vector<double> sums_;
  uint64_t rounds_ = 0;
};

}  // namespace

std::unique_ptr<Policy> make_ucb1_policy(int32_t num_arms, double exploration) {
  require(num_arms >= 1, FLASHSPEC_ERR_OUT_OF_RANGE, "num_arms", "must be >= 1");
  require(std::isfinite(exploration) && exploration >= 0.0, FLASHSPEC_ERR_INVALID_ARGUMENT, "exploration",
          "must be finite and >= 0");
  return std::make_unique<Ucb1>(num_arms, exploration);
}

}  // namespace flashspec
