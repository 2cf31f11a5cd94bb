// Internal error type: thrown inside the core, translated at the C boundary.
#pragma once

#include <exception>
#include <string>
#include <utility>

#include "flashspec.h"

namespace flashspec {

class Error : public std::exception {
 public:
  Error(flashspec_status status, std::string message, int cuda_error = 0)
      : status_(status), message_(std::move(message)), cuda_error_(cuda_error) {}
  const char* what() const noexcept override { return message_.c_str(); }
  flashspec_status status() const noexcept { return status_; }
  int cuda_error() const noexcept { return cuda_error_; }

 private:
  flashspec_status status_;
  std::string message_;
  int cuda_error_;
};

[[noreturn]] inline void fail(flashspec_status status, std::string message) {
  throw Error(status, std::move(message));
}

// Argument checks read as `require(cond, STATUS, "argument", "why")`, so the
// message always names the argument first.
inline void require(bool ok, flashspec_status status, const char* argument, const std::string& why) {
  if (!ok) fail(status, std::string(argument) + ": " + why);
}

}  // namespace flashspec
