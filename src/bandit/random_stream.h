// A counter-based random stream for the bandit: Philox4x32-10 keyed by the
// policy's seed, counter (round, arm, draw). Draws are a function of those
// numbers alone, so a policy replays exactly from its seed.
#pragma once

#include <cmath>
#include <cstdint>

#include "util/philox.h"

namespace flashspec {

class RandomStream {
 public:
  RandomStream(uint64_t seed, uint64_t round, uint32_t arm)
      : k0_(uint32_t(seed)), k1_(uint32_t(seed >> 32)), c1_(uint32_t(round)), c2_(uint32_t(round >> 32)), c3_(arm) {}

  // Uniform strictly inside (0, 1), 32 random bits.
  double uniform() {
    if (word_ == 4) {
      block_ = philox4x32_10(draw_++, c1_, c2_, c3_, k0_, k1_);
      word_ = 0;
    }
    return uniform_from_bits(block_.v[word_++]);
  }

  // Standard normal (Box–Muller; one of the pair).
  double normal() {
    const double u1 = uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

  // Gamma(shape, 1) for shape ≥ 1 (Marsaglia & Tsang 2000).
  double gamma(double shape) {
    const double d = shape - 1.0 / 3.0;
    const double c = 1.0 / std::sqrt(9.0 * d);
    for (;;) {
      double x, v;
      do {
        x = normal();
        v = 1.0 + c * x;
      } while (v <= 0.0);
      v = v * v * v;
      const double u = uniform();
      if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
      if (std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v;
    }
  }

  // Beta(a, b) for a, b ≥ 1.
  double beta(double a, double b) {
    const double x = gamma(a);
    const double y = gamma(b);
    return x / (x + y);
  }

 private:
  uint32_t k0_, k1_, c1_, c2_, c3_;
  uint32_t draw_ = 0;
  Philox4 block_{};
  int word_ = 4;
};

}  // namespace flashspec
