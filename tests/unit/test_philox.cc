// Philox4x32-10 known answers (Random123 kat_vectors) and the randomness
// contract of flashspec.h: counter layout, distinct streams, uniforms in
// (0, 1) and a Gumbel transform that keeps both tails.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <set>
#include <tuple>
#include <vector>

#include "flashspec.h"
#include "util/philox.h"

namespace {

struct Kat {
  uint32_t counter[4];
  uint32_t key[2];
  uint32_t expected[4];
};

// Random123 examples/kat_vectors: the three philox4x32, 10-round lines.
const Kat kKats[] = {
    {{0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u},
     {0x00000000u, 0x00000000u},
     {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
    {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
     {0xffffffffu, 0xffffffffu},
     {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
    {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
     {0xa4093822u, 0x299f31d0u},
     {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
};

TEST(PhiloxKat, PublicFunctionMatchesRandom123) {
  for (const Kat& k : kKats) {
    uint32_t out[4] = {0, 0, 0, 0};
    flashspec_philox4x32_10(k.counter, k.key, out);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], k.expected[i]) << "word " << i << " of counter " << std::hex << k.counter[0];
  }
}

TEST(PhiloxKat, InternalFunctionMatchesRandom123) {
  for (const Kat& k : kKats) {
    flashspec::Philox4 r =
        flashspec::philox4x32_10(k.counter[0], k.counter[1], k.counter[2], k.counter[3], k.key[0], k.key[1]);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(r.v[i], k.expected[i]) << "word " << i;
  }
}

TEST(PhiloxKat, NullArgumentsAreNoOps) {
  uint32_t counter[4] = {1, 2, 3, 4}, key[2] = {5, 6}, out[4] = {7, 7, 7, 7};
  flashspec_philox4x32_10(nullptr, key, out);
  flashspec_philox4x32_10(counter, nullptr, out);
  for (uint32_t w : out) EXPECT_EQ(w, 7u);
  flashspec_philox4x32_10(counter, key, nullptr);
}

// The word the header's layout names, computed from the header alone.
uint32_t contract_word(uint64_t seed, uint64_t request_id, uint64_t step, int32_t position,
                       flashspec_rng_purpose purpose, int32_t token) {
  uint32_t counter[4] = {(uint32_t(purpose) << 28) | (uint32_t(position) << 18) | (uint32_t(token) >> 2),
                         uint32_t(step), uint32_t(request_id), uint32_t(request_id >> 32)};
  uint32_t key[2] = {uint32_t(seed), uint32_t(seed >> 32)};
  uint32_t out[4];
  flashspec_philox4x32_10(counter, key, out);
  return out[token & 3];
}

TEST(RngContract, UniformIsTheDocumentedWordOfTheDocumentedCounter) {
  const uint64_t seeds[] = {0, 1, 0x0123456789abcdefull, ~0ull};
  const uint64_t ids[] = {0, 7, 0xfedcba9876543210ull, ~0ull};
  const uint64_t steps[] = {0, 1, 0xffffffffull, 12345};
  const int32_t positions[] = {0, 1, 17, FLASHSPEC_MAX_DRAFT_LEN};
  const int32_t tokens[] = {0, 1, 2, 3, 4, 255, 256, 31999, FLASHSPEC_MAX_VOCAB - 1};
  const flashspec_rng_purpose purposes[] = {FLASHSPEC_RNG_DRAFT_NOISE, FLASHSPEC_RNG_ACCEPT_UNIFORM,
                                            FLASHSPEC_RNG_RESIDUAL_NOISE, FLASHSPEC_RNG_BONUS_NOISE};
  for (uint64_t seed : seeds)
    for (uint64_t id : ids)
      for (uint64_t step : steps)
        for (int32_t pos : positions)
          for (flashspec_rng_purpose purpose : purposes)
            for (int32_t token : tokens) {
              uint32_t word = contract_word(seed, id, step, pos, purpose, token);
              double expected = (double(word) + 0.5) / 4294967296.0;
              ASSERT_EQ(flashspec_rng_uniform(seed, id, step, pos, purpose, token), expected)
                  << "seed " << seed << " id " << id << " step " << step << " position " << pos << " purpose "
                  << purpose << " token " << token;
              // The kernels' internal path gives the same word.
              flashspec::RngRowKey key = flashspec::make_row_key(seed, id, step, pos, purpose);
              ASSERT_EQ(flashspec::row_word(key, token), word);
            }
}

TEST(RngContract, EveryCoordinateSelectsADistinctWord) {
  // Vary one coordinate at a time around a base point; every word differs
  // from every other (a shared counter would repeat a word exactly).
  std::set<uint32_t> words;
  std::vector<std::tuple<uint64_t, uint64_t, uint64_t, int32_t, int, int32_t>> points;
  for (int purpose = 1; purpose <= 4; ++purpose)
    for (int32_t pos = 0; pos < 8; ++pos)
      for (int32_t token = 0; token < 16; ++token) points.emplace_back(9, 3, 5, pos, purpose, token);
  for (uint64_t step = 0; step < 64; ++step) points.emplace_back(9, 3, step + 100, 0, 1, 0);
  for (uint64_t id = 0; id < 64; ++id) points.emplace_back(9, id + 100, 5, 0, 1, 0);
  points.emplace_back(9, 3ull | (1ull << 32), 5, 0, 1, 0);  // request id differing in the high word only
  for (uint64_t seed = 0; seed < 64; ++seed) points.emplace_back(seed + 100, 3, 5, 0, 1, 0);
  points.emplace_back(9ull | (1ull << 32), 3, 5, 0, 1, 0);  // seed differing in the high word only
  for (const auto& p : points) {
    auto [seed, id, step, pos, purpose, token] = p;
    uint32_t w = contract_word(seed, id, step, pos, flashspec_rng_purpose(purpose), token);
    EXPECT_EQ(flashspec::row_word(flashspec::make_row_key(seed, id, step, pos, flashspec_rng_purpose(purpose)), token), w);
    words.insert(w);
  }
  EXPECT_EQ(words.size(), points.size()) << "two coordinates share a random word";
}

TEST(RngContract, PurposesNeverShareACounterValue) {
  // The counter word c0 of (purpose, position, token) is injective over the
  // whole documented range: purpose in the top 4 bits, position in 10 bits,
  // token block in 18 bits.
  for (int a = 1; a <= 4; ++a)
    for (int b = 1; b <= 4; ++b) {
      if (a == b) continue;
      for (int32_t pos : {0, 1, 1023})
        for (int32_t token : {0, 4, FLASHSPEC_MAX_VOCAB - 1}) {
          flashspec::RngRowKey ka = flashspec::make_row_key(1, 2, 3, pos, flashspec_rng_purpose(a));
          flashspec::RngRowKey kb = flashspec::make_row_key(1, 2, 3, pos, flashspec_rng_purpose(b));
          EXPECT_NE(ka.c0_high | (uint32_t(token) >> 2), kb.c0_high | (uint32_t(token) >> 2));
        }
    }
  EXPECT_EQ(flashspec::make_row_key(0, 0, 0, FLASHSPEC_MAX_DRAFT_LEN, FLASHSPEC_RNG_DRAFT_NOISE).c0_high,
            (1u << 28) | (1023u << 18));
}

TEST(RngContract, UniformsLieStrictlyInsideTheUnitInterval) {
  const double lo = flashspec::uniform_from_bits(0u);
  const double hi = flashspec::uniform_from_bits(0xffffffffu);
  EXPECT_GT(lo, 0.0);
  EXPECT_LT(hi, 1.0);
  EXPECT_EQ(lo, 0.5 / 4294967296.0);
  EXPECT_EQ(hi, 1.0 - 0.5 / 4294967296.0);
  // log u stays finite and negative at both ends, accurate to float.
  EXPECT_NEAR(flashspec::log_uniform_from_bits(0u), std::log(lo), 1e-5);
  EXPECT_LT(flashspec::log_uniform_from_bits(0xffffffffu), 0.0f);
  EXPECT_NEAR(flashspec::log_uniform_from_bits(0xffffffffu) / std::log(hi), 1.0, 1e-5);
  // Below 1/2, log u is computed as log(x + 0.5) − 32 ln 2 in float: its
  // absolute error is a few ulps at the scale of 32 ln 2 ≈ 22 (ulp 2^-20).
  // Above 1/2, log1p of the exact 1 − u is accurate relative to log u.
  for (uint32_t x : {0u, 1u, 12345u, 0x7fffffffu, 0x80000000u, 0xc0000000u, 0xfffffffeu, 0xffffffffu}) {
    double lu = std::log(flashspec::uniform_from_bits(x));
    double tolerance = x < 0x80000000u ? 4 * std::ldexp(1.0, -20) : 4e-7 * std::fabs(lu);
    EXPECT_NEAR(flashspec::log_uniform_from_bits(x), lu, tolerance) << x;
  }
}

TEST(RngContract, GumbelKeepsBothTailsAndIsMonotone) {
  const float g_lo = flashspec::gumbel_from_bits(0u);
  const float g_hi = flashspec::gumbel_from_bits(0xffffffffu);
  ASSERT_TRUE(std::isfinite(g_lo));
  ASSERT_TRUE(std::isfinite(g_hi));
  // −log(−log u) at u = 2^-33 and u = 1 − 2^-33.
  EXPECT_NEAR(g_lo, -std::log(-std::log(0.5 / 4294967296.0)), 1e-5);
  EXPECT_NEAR(g_hi, -std::log(-std::log1p(-0.5 / 4294967296.0)), 1e-4);
  EXPECT_GT(g_hi, 22.0f);  // unclamped upper tail
  EXPECT_LT(g_lo, -3.0f);
  // Non-decreasing across the whole 32-bit range (strided) and densely around
  // both ends and the switch between the two formulas at 2^31.
  float previous = -INFINITY;
  for (uint64_t x = 0; x <= 0xffffffffull; x += 65537) {
    float g = flashspec::gumbel_from_bits(uint32_t(x));
    ASSERT_TRUE(std::isfinite(g)) << x;
    ASSERT_GE(g, previous) << "at x = " << x;
    previous = g;
  }
  for (uint64_t start : {0ull, 0x7fff0000ull, 0xffff0000ull}) {
    previous = -INFINITY;
    for (uint64_t x = start; x < start + 0x10000ull && x <= 0xffffffffull; ++x) {
      float g = flashspec::gumbel_from_bits(uint32_t(x));
      ASSERT_GE(g, previous) << "at x = " << x;
      previous = g;
    }
  }
  EXPECT_GT(flashspec::gumbel_from_bits(0xffffffffu), flashspec::gumbel_from_bits(0xfff00000u));
  EXPECT_GT(flashspec::gumbel_from_bits(0x00100000u), flashspec::gumbel_from_bits(0u));
}

}  // namespace
