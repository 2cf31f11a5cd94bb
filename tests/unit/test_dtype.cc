// bf16 / fp16 conversions: exhaustive round trips and rounding rules; the
// 8-bit LM-head formats (e4m3, int8) and the quantisation rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "../common/fp8_reference.h"
#include "../common/rng.h"
#include "util/dtype.h"
#include "util/quantize.h"

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

// ---------------------------------------------------------------------------
// 8-bit LM-head formats (util/dtype.h) against fp8_reference.h, which is
// written from the OCP e4m3fn definition, and the quantisation rule
// (util/quantize.h) against flashspec.h's statement of it.
// ---------------------------------------------------------------------------
namespace {

bool same_float_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

TEST(E4m3, EveryCodeDecodesToTheOcpValue) {
  for (int c = 0; c < 256; ++c) {
    const double want = fstest::e4m3_reference(uint8_t(c));
    const float got = e4m3_to_float(uint8_t(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
      continue;
    }
    EXPECT_EQ(double(got), want) << "code " << c;
    EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << "code " << c << ": sign (zero included)";
  }
  // Exactly two NaN codes, and the landmarks of the format.
  int nans = 0;
  for (int c = 0; c < 256; ++c) nans += std::isnan(e4m3_to_float(uint8_t(c))) ? 1 : 0;
  EXPECT_EQ(nans, 2);
  EXPECT_EQ(e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xfe), -448.0f);
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));  // least subnormal
  EXPECT_EQ(e4m3_to_float(0x07), std::ldexp(7.0f, -9));  // greatest subnormal
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));  // least normal
  EXPECT_EQ(e4m3_to_float(0x77), 240.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xff)));
}

TEST(E4m3, EveryFiniteCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const float f = e4m3_to_float(uint8_t(c));
    if (std::isnan(f)) continue;
    ASSERT_EQ(int(float_to_e4m3(f)), c) << "value " << f;
  }
}

// Between every two consecutive codes of one sign (subnormals, the
// subnormal/normal boundary 0x07/0x08 and the normals up to 448): the
// midpoint goes to the even code, a float just below it to the lower code
// and one just above to the upper code.
TEST(E4m3, RoundsToNearestEvenAtEveryMidpoint) {
  for (int c = 0; c < 0x7e; ++c) {
    const double lo = fstest::e4m3_reference(uint8_t(c)), hi = fstest::e4m3_reference(uint8_t(c + 1));
    const float mid = float((lo + hi) / 2);
    ASSERT_EQ(double(mid), (lo + hi) / 2) << "midpoint of codes " << c << ", " << c + 1 << " is exact in fp32";
    const int even = (c % 2 == 0) ? c : c + 1;
    for (float sign : {1.0f, -1.0f}) {
      const int s = sign < 0 ? 0x80 : 0;
      EXPECT_EQ(int(float_to_e4m3(sign * mid)), s | even) << "midpoint " << sign * mid;
      EXPECT_EQ(int(float_to_e4m3(sign * std::nextafter(mid, 0.0f))), s | c) << "below " << sign * mid;
      EXPECT_EQ(int(float_to_e4m3(sign * std::nextafter(mid, 1e9f))), s | (c + 1)) << "above " << sign * mid;
    }
  }
  // Below half the least subnormal: zero, of the input's sign.
  EXPECT_EQ(int(float_to_e4m3(std::ldexp(1.0f, -10))), 0x00);  // tie → even (0)
  EXPECT_EQ(int(float_to_e4m3(-std::ldexp(1.0f, -11))), 0x80);
  EXPECT_EQ(int(float_to_e4m3(std::numeric_limits<float>::denorm_min())), 0x00);
}

TEST(E4m3, SaturatesAndKeepsNaN) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (float big : {448.0f, std::nextafter(448.0f, 1e9f), 464.0f, 479.0f, 480.0f, 1e6f,
                    std::numeric_limits<float>::max(), inf}) {
    EXPECT_EQ(int(float_to_e4m3(big)), 0x7e) << big;
    EXPECT_EQ(int(float_to_e4m3(-big)), 0xfe) << -big;
  }
  // 416 (0x7d) and 448 (0x7e) are the last two codes: 432 is their midpoint
  // (tie → the even code, 448).
  EXPECT_EQ(int(float_to_e4m3(432.0f)), 0x7e);
  EXPECT_EQ(int(float_to_e4m3(std::nextafter(432.0f, 0.0f))), 0x7d);
  EXPECT_EQ(int(float_to_e4m3(nan)), 0x7f);
  EXPECT_EQ(int(float_to_e4m3(-nan)), 0xff);
  EXPECT_EQ(int(float_to_e4m3(0.0f)), 0x00);
  EXPECT_EQ(int(float_to_e4m3(-0.0f)), 0x80);
}

TEST(E4m3, RandomFloatsRoundToTheNearestCode) {
  fstest::Rng rng(0xe4);
  for (int i = 0; i < 100000; ++i) {
    const float f = float(std::ldexp(rng.uniform(), int(rng.below(24)) - 14) * (rng.below(2) ? -1.0 : 1.0));
    ASSERT_EQ(int(float_to_e4m3(f)), int(fstest::nearest_e4m3_reference(f))) << f;
  }
}

TEST(I8, EveryCodeDecodesToItsTwosComplementValue) {
  for (int c = 0; c < 256; ++c) EXPECT_EQ(double(i8_to_float(uint8_t(c))), fstest::i8_reference(uint8_t(c))) << c;
  EXPECT_EQ(i8_to_float(0x80), -128.0f);
  EXPECT_EQ(i8_to_float(0x7f), 127.0f);
  EXPECT_EQ(i8_to_float(0xff), -1.0f);
}

TEST(Quantize, ScaleIsAmaxOver448Or127AndOneForZero) {
  for (float amax : {1.0f, 0.3f, 1e-3f, 7.5f, 3e4f}) {
    EXPECT_TRUE(same_float_bits(quantize_scale(amax, FLASHSPEC_DTYPE_E4M3), amax / 448.0f)) << amax;
    EXPECT_TRUE(same_float_bits(quantize_scale(amax, FLASHSPEC_DTYPE_I8), amax / 127.0f)) << amax;
  }
  for (flashspec_dtype stored : {FLASHSPEC_DTYPE_E4M3, FLASHSPEC_DTYPE_I8}) {
    EXPECT_EQ(quantize_scale(0.0f, stored), 1.0f);
    // amax / 448 underflows to 0 below 448 · 2^-149: scale 1 too.
    EXPECT_EQ(quantize_scale(std::numeric_limits<float>::denorm_min(), stored), 1.0f);
    const std::vector<float> zeros(13, 0.0f);
    std::vector<uint8_t> codes(13, 0x55);
    EXPECT_EQ(quantize_row(zeros.data(), 13, stored, codes.data()), 1.0f);
    for (uint8_t c : codes) EXPECT_EQ(int(c), 0);
  }
}

TEST(Quantize, Int8CodesRoundTiesToEvenAndClampAt127) {
  const flashspec_dtype I8 = FLASHSPEC_DTYPE_I8;
  // Scale 0.5 (a power of two): w / scale is exact, so each w below is a tie.
  const struct {
    float w;
    int code;
  } cases[] = {{0.25f, 0},    {0.75f, 2},    {1.25f, 2},   {-0.25f, 0},   {-0.75f, -2},  {-1.25f, -2},
               {63.25f, 126}, {63.75f, 127}, {0.3f, 1},    {-0.2f, 0},    {63.5f, 127},  {64.0f, 127},
               {-64.0f, -127}, {-63.75f, -127}, {1e9f, 127}, {-1e9f, -127}};
  for (const auto& c : cases)
    EXPECT_EQ(int(int8_t(quantize_code(c.w, 0.5f, I8))), c.code) << "w " << c.w << " / 0.5";
  // -128 is never produced: the clamp is symmetric.
  EXPECT_EQ(int(quantize_code(-127.5f, 1.0f, I8)), 0x81);
}

TEST(Quantize, RowsGiveTheDefinedScalesAndCodes) {
  fstest::Rng rng(0x9a);
  for (flashspec_dtype stored : {FLASHSPEC_DTYPE_E4M3, FLASHSPEC_DTYPE_I8})
    for (int trial = 0; trial < 200; ++trial) {
      const int64_t n = 1 + rng.below(70);
      const double magnitude = std::ldexp(1.0, int(rng.below(30)) - 15);
      std::vector<float> w(static_cast<size_t>(n));
      float amax = 0.0f;
      for (float& x : w) {
        x = float(rng.normal() * magnitude);
        amax = std::max(amax, std::fabs(x));
      }
      std::vector<uint8_t> codes(static_cast<size_t>(n));
      const float scale = quantize_row(w.data(), n, stored, codes.data());
      const bool e4m3 = stored == FLASHSPEC_DTYPE_E4M3;
      ASSERT_TRUE(same_float_bits(scale, amax / (e4m3 ? 448.0f : 127.0f))) << "n " << n;
      for (int64_t k = 0; k < n; ++k) {
        const float x = w[size_t(k)] / scale;
        int want;
        if (e4m3) {
          want = fstest::nearest_e4m3_reference(x);
        } else {
          double r = std::nearbyint(double(x));  // ties to even in the default mode
          want = int(uint8_t(int8_t(std::clamp(r, -127.0, 127.0))));
        }
        ASSERT_EQ(int(codes[size_t(k)]), want) << "n " << n << " k " << k << " w/scale " << x;
        // The element of largest magnitude gets the largest code.
        if (std::fabs(w[size_t(k)]) == amax) {
          const double v = e4m3 ? fstest::e4m3_reference(codes[size_t(k)]) : fstest::i8_reference(codes[size_t(k)]);
          EXPECT_EQ(std::fabs(v), e4m3 ? 448.0 : 127.0) << "amax element";
        }
      }
    }
}
