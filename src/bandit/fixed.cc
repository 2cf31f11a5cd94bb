// The two policies that do not learn: a fixed arm (a host that knows its best
// drafter), and the oracle that knows every arm's true mean (the yardstick
// for regret in tests).
#include <cmath>
#include <string>
#include <vector>

#include "bandit/policy.h"
#include "util/status.h"

namespace flashspec {
namespace {

class Fixed final : public Policy {
 public:
  Fixed(int32_t arms, int32_t arm) : arms_(arms), arm_(arm) {}
  int32_t select() override { return arm_; }
  void update(int32_t, double) override {}
  void reset() override {}
  int32_t num_arms() const override { return arms_; }

 private:
  int32_t arms_;
  int32_t arm_;
};

int32_t best_arm(const std::vector<double>& means) {
  int32_t best = 0;
  for (size_t a = 1; a < means.size(); ++a)
    if (means[a] > means[size_t(best)]) best = int32_t(a);
  return best;
}

}  // namespace

std::unique_ptr<Policy> make_fixed_policy(int32_t num_arms, int32_t arm) {
  require(num_arms >= 1, FLASHSPEC_ERR_OUT_OF_RANGE, "num_arms", "must be >= 1");
  require(arm >= 0 && arm < num_arms, FLASHSPEC_ERR_OUT_OF_RANGE, "fixed_arm",
          "is " + std::to_string(arm) + ", outside [0, " + std::to_string(num_arms) + ")");
  return std::make_unique<Fixed>(num_arms, arm);
}

std::unique_ptr<Policy> make_oracle_policy(std::vector<double> means) {
  require(!means.empty(), FLASHSPEC_ERR_OUT_OF_RANGE, "oracle_means", "is empty");
  for (size_t a = 0; a < means.size(); ++a)
    require(std::isfinite(means[a]), FLASHSPEC_ERR_INVALID_ARGUMENT, "oracle_means",
            "entry " + std::to_string(a) + " is not finite");
  const int32_t arms = int32_t(means.size());
  return std::make_unique<Fixed>(arms, best_arm(means));
}

}  // namespace flashspec
