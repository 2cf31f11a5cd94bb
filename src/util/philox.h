// Philox4x32-10 (Salmon et al., SC'11) and the library's randomness contract.
//
// Every random number is a pure function of (seed, request id, step,
// position, purpose, token): independent of tiling, threads, backend and
// batch composition. The layout is documented in flashspec.h.
#pragma once

#include <cmath>
#include <cstdint>

#include "flashspec.h"
#include "util/host_device.h"

namespace flashspec {

struct Philox4 {
  uint32_t v[4];
};

FS_HOST_DEVICE void mul_hi_lo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
#if defined(__CUDA_ARCH__)
  *hi = __umulhi(a, b);
  *lo = a * b;
#else
  uint64_t product = uint64_t(a) * uint64_t(b);
  *hi = uint32_t(product >> 32);
  *lo = uint32_t(product);
#endif
}

FS_HOST_DEVICE Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                      uint32_t k1) {
  const uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  const uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mul_hi_lo(kMul0, c0, &hi0, &lo0);
    mul_hi_lo(kMul1, c2, &hi1, &lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0;
    uint32_t n1 = lo1;
    uint32_t n2 = hi0 ^ c3 ^ k1;
    uint32_t n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// The (key, counter-words c1..c3) of one row: everything but c0.
struct RngRowKey {
  uint32_t k0, k1, c1, c2, c3;
  uint32_t c0_high;  // purpose << 28 | position << 18
};

FS_HOST_DEVICE RngRowKey make_row_key(uint64_t seed, uint64_t request_id, uint64_t step, int32_t position,
                                      flashspec_rng_purpose purpose) {
  RngRowKey key;
  key.k0 = uint32_t(seed);
  key.k1 = uint32_t(seed >> 32);
  key.c1 = uint32_t(step);
  key.c2 = uint32_t(request_id);
  key.c3 = uint32_t(request_id >> 32);
  key.c0_high = (uint32_t(purpose) << 28) | ((uint32_t(position) & 0x3ffu) << 18);
  return key;
}

// The four words of the block holding tokens 4b .. 4b+3.
FS_HOST_DEVICE Philox4 row_block(const RngRowKey& key, uint32_t block) {
  return philox4x32_10(key.c0_high | (block & 0x3ffffu), key.c1, key.c2, key.c3, key.k0, key.k1);
}

FS_HOST_DEVICE uint32_t row_word(const RngRowKey& key, int32_t token) {
  Philox4 block = row_block(key, uint32_t(token) >> 2);
  return block.v[token & 3];
}

// u = (x + 0.5) / 2^32, strictly inside (0, 1); in double, exact.
FS_HOST_DEVICE double uniform_from_bits(uint32_t x) { return (double(x) + 0.5) * 2.3283064365386963e-10; }

// log u for u = (x + 0.5) / 2^32, accurate in float over the whole range,
// without a branch (on a GPU both halves of a warp's lanes would otherwise run
// both paths). With w the smaller of u and 1 − u (exact, in (0, 1/2]):
//   u ≤ 1/2: log u = log w;
//   u > 1/2: log u = log1p(−w) = log(a)·(−w)/(a − 1) with a = 1 − w rounded
//            (Goldberg's identity; a − 1 is exact), and −w where a rounds to 1.
FS_HOST_DEVICE float log_uniform_from_bits(uint32_t x) {
  const bool low = x < 0x80000000u;
  const uint32_t k = low ? x : 0xffffffffu - x;
  const float w = (float(k) + 0.5f) * 2.3283064365386963e-10f;
  const float a = low ? w : 1.0f - w;
  const float log_a = logf(a);
  const float a_minus_1 = a - 1.0f;
  if (low) return log_a;
  return a_minus_1 == 0.0f ? -w : log_a * (-w / a_minus_1);
}

// Gumbel noise g = −log(−log u), both tails kept: from about −3.1 (x = 0)
// to about +22.9 (x = 2^32 − 1); no value is clamped.
FS_HOST_DEVICE float gumbel_from_bits(uint32_t x) { return -logf(-log_uniform_from_bits(x)); }

}  // namespace flashspec
