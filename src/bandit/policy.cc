#include "bandit/policy.h"

#include <cmath>
#include <string>

#include "util/status.h"

namespace flashspec {

std::unique_ptr<Policy> make_policy(const PolicyConfig& config) {
  require(config.num_arms >= 1, FLASHSPEC_ERR_OUT_OF_RANGE, "num_arms",
          "must be >= 1, got " + std::to_string(config.num_arms));
  switch (config.kind) {
    case PolicyKind::kUcb1:
      return make_ucb1_policy(config.num_arms, config.exploration);
    case PolicyKind::kThompson:
      return make_thompson_policy(config.num_arms, config.seed);
    case PolicyKind::kFixed:
      return make_fixed_policy(config.num_arms, config.fixed_arm);
    case PolicyKind::kOracle:
      require(int32_t(config.oracle_means.size()) == config.num_arms, FLASHSPEC_ERR_OUT_OF_RANGE, "oracle_means",
              "needs one mean per arm (" + std::to_string(config.num_arms) + ")");
      return make_oracle_policy(config.oracle_means);
  }
  fail(FLASHSPEC_ERR_INVALID_ARGUMENT, "policy: unknown kind");
}

}  // namespace flashspec
