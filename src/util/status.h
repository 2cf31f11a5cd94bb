// Internal error type: thrown inside the core, translated at the C boundary.
#pragma once

#include <array>
#include <exception>
#include <string>
#include <utility>

#include "flashspec.h"

namespace flashspec {

// The input an error is about, as the layers below the C API know it. Only
// src/capi knows which public argument carries that input in the call at
// hand ("hidden" for a draft, "batch->target_hidden" for a verify), so a
// backend tags its errors with a Field and the caller names it.
enum class Field : int {
  kNone,           // the message names what it is about already
  kBackend,        // the backend asked for
  kDeviceOrdinal,  // the device asked for
  kWeight,         // the LM head's weights
  kFlags,          // how the LM head is held (copy or borrow)
  kHead,           // an LM head handle
  kHidden,         // the hidden rows of a draft or verify
  kTemperature,    // the temperature(s) of those rows
  kDraftLogits,    // the draft logits rows of stochastic drafts
  kCpuThreads,     // the CPU worker threads asked for
  kCount
};

class Error : public std::exception {
 public:
  Error(flashspec_status status, std::string message, int cuda_error = 0)
      : status_(status), message_(std::move(message)), cuda_error_(cuda_error) {}
  Error(flashspec_status status, Field field, std::string message, int cuda_error = 0)
      : status_(status), field_(field), message_(std::move(message)), cuda_error_(cuda_error) {}
  const char* what() const noexcept override { return message_.c_str(); }
  flashspec_status status() const noexcept { return status_; }
  Field field() const noexcept { return field_; }
  int cuda_error() const noexcept { return cuda_error_; }
  // This error with its field named: "argument: message", no tag left.
  Error named(const char* argument) const {
    return Error(status_, std::string(argument) + ": " + message_, cuda_error_);
  }

 private:
  flashspec_status status_;
  Field field_ = Field::kNone;
  std::string message_;
  int cuda_error_;
};

[[noreturn]] inline void fail(flashspec_status status, std::string message) {
  throw Error(status, std::move(message));
}

[[noreturn]] inline void fail(flashspec_status status, Field field, std::string message) {
  throw Error(status, field, std::move(message));
}

// Argument checks read as `require(cond, STATUS, "argument", "why")`, so the
// message always names the argument first.
inline void require(bool ok, flashspec_status status, const char* argument, const std::string& why) {
  if (!ok) fail(status, std::string(argument) + ": " + why);
}

// The same for layers below the C API, which tag the input instead.
inline void require(bool ok, flashspec_status status, Field field, const std::string& why) {
  if (!ok) fail(status, field, why);
}

// What each Field is called by a caller; NULL leaves the tag for an outer
// caller to name.
using FieldNames = std::array<const char*, size_t(Field::kCount)>;

// Runs body(); an Error tagged with a field that `names` knows leaves with
// that field named.
template <class Body>
decltype(auto) naming_fields(const FieldNames& names, Body&& body) {
  try {
    return body();
  } catch (const Error& e) {
    const char* name = e.field() == Field::kNone ? nullptr : names[size_t(e.field())];
    if (name) throw e.named(name);
    throw;
  }
}

}  // namespace flashspec
