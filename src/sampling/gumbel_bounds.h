// Upper bounds of the contract's Gumbel noise by the top byte of its RNG
// word, shared by the backends' pruning: a token whose logit plus the bound
// of its word's bucket cannot beat a score already seen needs no noise, and
// skipping it leaves the row's winner and runner-up bit for bit as they were
// (offer_candidate, sampling/fold.h).
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

namespace flashspec {

// g(x) = −ln(−ln u), u = (x + 0.5) / 2^32, in double; ln u for u > 1/2 as
// log1p(−(1 − u)), 1 − u exact.
inline double exact_gumbel(uint64_t x) {
  const double two32 = 4294967296.0;
  const double log_u = x < 0x80000000u ? std::log((double(x) + 0.5) / two32)
                                       : std::log1p(-((two32 - double(x) - 0.5) / two32));
  return -std::log(-log_u);
}

// Bucket b holds x in [b·2^24, (b + 1)·2^24). The exact g increases with x,
// so its largest value in a bucket is at the bucket's last x. The float
// evaluation (gumbel_from_bits) stays within about 1e-5 of the exact value
// (tests/unit/test_cpu_scan.cc checks 1e-4 on millions of inputs, every
// bucket edge included); the margin of 1e-3 + 1e-4·|g| covers that many
// times over, and the sum is rounded up to a float. Checks of all 2^32
// inputs against these bounds found every value below its bound: x86-64
// with glibc 2.36's logf (the closest by 1.0002e-3), and the CUDA device
// code (tests/gpu/test_cuda_exactness.cc). The bounds are non-decreasing in
// the bucket; bucket 255's bounds every word.
inline const std::array<float, 256>& gumbel_bucket_bounds() {
  static const std::array<float, 256> bounds = [] {
    std::array<float, 256> b{};
    for (uint32_t k = 0; k < 256; ++k) {
      const double g = exact_gumbel((uint64_t(k) << 24) + 0xffffffu);
      const double bound = g + 1e-3 + 1e-4 * std::fabs(g);
      float f = float(bound);
      if (double(f) < bound) f = std::nextafter(f, INFINITY);
      b[k] = f;
    }
    return b;
  }();
  return bounds;
}

}  // namespace flashspec
