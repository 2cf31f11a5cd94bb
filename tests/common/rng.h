// splitmix64: a small seeded generator that gives the same numbers on every
// platform, so the tests' inputs are reproducible.
#pragma once

#include <cmath>
#include <cstdint>

namespace fstest {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return (double(next() >> 11) + 0.5) * 0x1.0p-53; }  // in (0, 1)
  double normal() { return std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform()); }
  int32_t below(int64_t n) { return int32_t(next() % uint64_t(n)); }

 private:
  uint64_t state_;
};

}  // namespace fstest
