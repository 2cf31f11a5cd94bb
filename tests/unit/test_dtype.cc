// bf16 / fp16 conversions: exhaustive round trips and rounding rules.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "util/dtype.h"

using namespace flashspec;

TEST(Bf16, EveryFiniteValueRoundTripsExactly) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    float f = bf16_to_float(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(f))));
      continue;
    }
    ASSERT_EQ(float_to_bf16(f), uint16_t(h)) << "bf16 bits " << h;
  }
}

TEST(Bf16, RoundsToNearestEven) {
  // 1 + 2^-8 lies exactly between two bf16 values (1 and 1 + 2^-7): ties go to even (1).
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 0.00390625f)), 1.0f);
  // 1 + 3·2^-8 lies between 1 + 2^-7 and 1 + 2^-6: tie to even, 1 + 2^-6.
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3 * 0.00390625f)), 1.0f + 0.015625f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 0.0040f)), 1.0f + 0.0078125f);
  EXPECT_TRUE(std::isinf(bf16_to_float(float_to_bf16(std::numeric_limits<float>::max()))));
}

TEST(Fp16, EveryValueRoundTripsExactly) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    float f = fp16_to_float(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(f))));
      continue;
    }
    ASSERT_EQ(float_to_fp16(f), uint16_t(h)) << "fp16 bits " << h;
  }
}

TEST(Fp16, KnownValuesAndRounding) {
  EXPECT_EQ(fp16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(fp16_to_float(0xc000), -2.0f);
  EXPECT_EQ(fp16_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(fp16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(fp16_to_float(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);  // rounds to +Inf
  EXPECT_EQ(float_to_fp16(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -25)), 0x0000);          // tie → even (0)
  EXPECT_EQ(float_to_fp16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(float_to_fp16(std::ldexp(3.0f, -25)), 0x0002);          // 1.5 ulp: tie → even (2)
  EXPECT_EQ(float_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);   // tie → even
  EXPECT_EQ(float_to_fp16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);   // tie → even
}

TEST(Fp16, RandomFloatsRoundToTheNearest) {
  uint32_t state = 12345;
  for (int i = 0; i < 200000; ++i) {
    state = state * 1664525u + 1013904223u;
    float f = std::ldexp(float(state >> 8) / float(1 << 24), int(state % 40) - 28) * ((state & 1) ? -1.0f : 1.0f);
    float r = fp16_to_float(float_to_fp16(f));
    // No fp16 value lies closer to f than r.
    uint16_t bits = float_to_fp16(f);
    for (int delta : {-1, 1}) {
      uint16_t nb = uint16_t(bits + delta);
      float n = fp16_to_float(nb);
      if (std::isnan(n) || std::isinf(n) || ((nb ^ bits) & 0x8000)) continue;
      ASSERT_LE(std::fabs(double(r) - f), std::fabs(double(n) - f)) << f;
    }
  }
}
