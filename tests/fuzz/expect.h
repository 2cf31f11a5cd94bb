// The status a harness expects from one call, from what it put into the
// call: the invalid arguments it planted (violations, each with the status
// the header documents for it) and whether a logit must, or may, overflow.
#pragma once

#include <string>
#include <vector>

#include "fuzz_common.h"

namespace fsfuzz {

class Expect {
 public:
  // An argument the header says is invalid, with its documented status.
  void violate(flashspec_status status, const std::string& what) { violations_.push_back({status, what}); }
  // The call may (or must) fail with NON_FINITE because of its values.
  void nonfinite(bool possible, bool sure, const std::string& why = "") {
    nonfinite_possible_ = nonfinite_possible_ || possible || sure;
    if (sure && !nonfinite_sure_) sure_reason_ = why;
    nonfinite_sure_ = nonfinite_sure_ || sure;
  }
  // A status the header also allows here (UNSUPPORTED for misaligned data).
  void allow(flashspec_status status) { allowed_.push_back(status); }

  bool valid() const { return violations_.empty(); }
  bool nonfinite_possible() const { return nonfinite_possible_; }
  bool must_fail() const { return !violations_.empty() || nonfinite_sure_; }
  size_t count() const { return violations_.size(); }
  const std::string& first() const { return violations_.front().what; }

  // Checks `got` against the expectation; `call` and `message` describe it.
  void check(flashspec_status got, const char* call, const char* message) const {
    const bool allowed = is_allowed(got);
    if (violations_.empty()) {
      if (nonfinite_sure_)
        FS_CHECK(got == FLASHSPEC_ERR_NON_FINITE || allowed, "%s: %s must overflow fp32 (NON_FINITE), got %s (%s)",
                 call, sure_reason_.empty() ? "a logit" : sure_reason_.c_str(), name(got), message);
      else if (!nonfinite_possible_)
        FS_CHECK(got == FLASHSPEC_OK || allowed, "%s: a valid call failed with %s (%s)", call, name(got), message);
      else
        FS_CHECK(got == FLASHSPEC_OK || got == FLASHSPEC_ERR_NON_FINITE || allowed,
                 "%s: a valid call failed with %s (%s)", call, name(got), message);
      return;
    }
    FS_CHECK(got != FLASHSPEC_OK, "%s: invalid argument accepted (%s; %zu planted, expected %s)", call,
             violations_.front().what.c_str(), violations_.size(), name(violations_.front().status));
    if (violations_.size() == 1 && !nonfinite_sure_)
      FS_CHECK(got == violations_.front().status || allowed ||
                   (nonfinite_possible_ && got == FLASHSPEC_ERR_NON_FINITE),
               "%s: %s should give %s, got %s (%s)", call, violations_.front().what.c_str(),
               name(violations_.front().status), name(got), message);
  }

 private:
  bool is_allowed(flashspec_status got) const {
    for (flashspec_status s : allowed_)
      if (s == got) return true;
    return false;
  }
  struct Violation {
    flashspec_status status;
    std::string what;
  };
  std::vector<Violation> violations_;
  std::vector<flashspec_status> allowed_;
  bool nonfinite_possible_ = false;
  bool nonfinite_sure_ = false;
  std::string sure_reason_;
};

}  // namespace fsfuzz
