// Sets a busy flag for a scope and clears it however the scope is left:
// the engines' guard against a callback re-entering the call it runs in.
#pragma once

namespace flashspec {

class BusyGuard {
 public:
  explicit BusyGuard(bool& flag) : flag_(flag) { flag_ = true; }
  ~BusyGuard() { flag_ = false; }
  BusyGuard(const BusyGuard&) = delete;
  BusyGuard& operator=(const BusyGuard&) = delete;

 private:
  bool& flag_;
};

}  // namespace flashspec
