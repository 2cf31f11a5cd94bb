// Calls into host callbacks. A callback is C, but a C++ host may still throw
// through it: whatever it does, the engine sees a status, never an exception
// of the host's.
#pragma once

#include <string>

#include "util/status.h"

namespace flashspec {

// Runs call() (which returns the callback's int) and turns a non-zero return
// or an exception into FLASHSPEC_ERR_CALLBACK naming the callback.
template <class Call>
void call_host(const std::string& name, Call&& call) {
  int rc = 0;
  try {
    rc = call();
  } catch (...) {
    fail(FLASHSPEC_ERR_CALLBACK, name + ": threw an exception");
  }
  if (rc != 0) fail(FLASHSPEC_ERR_CALLBACK, name + ": reported failure (returned " + std::to_string(rc) + ")");
}

}  // namespace flashspec
