// Reference definitions of the 8-bit LM-head formats for the tests, written
// from the format definitions and not from the library's code: OCP fp8
// e4m3fn (sign, 4 exponent bits of bias 7, 3 mantissa bits; exponent 0 is
// subnormal, m · 2^-9; no infinities; 0x7f/0xff NaN; largest ±448) and
// two's-complement int8. Also the nearest e4m3 code by exhaustive search.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace fstest {

// The value of an e4m3fn code (NaN for 0x7f and 0xff).
inline double e4m3_reference(uint8_t code) {
  const bool negative = (code & 0x80) != 0;
  const int exponent = (code >> 3) & 0xf, mantissa = code & 0x7;
  if (exponent == 0xf && mantissa == 0x7) return std::numeric_limits<double>::quiet_NaN();
  const double magnitude = exponent == 0 ? std::ldexp(double(mantissa), -9)                  // 0.m · 2^(1−7)
                                         : std::ldexp(double(8 + mantissa), exponent - 7 - 3);  // 1.m · 2^(e−7)
  return negative ? -magnitude : magnitude;
}

inline double i8_reference(uint8_t code) { return code < 128 ? double(code) : double(int(code) - 256); }

// The e4m3 code nearest x, ties to the even code (mantissa bit 0 clear);
// |x| ≥ 448 and ±Inf saturate to ±448; NaN gives 0x7f with x's sign. Found
// by comparing x with all 127 non-negative finite codes.
inline uint8_t nearest_e4m3_reference(double x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return uint8_t(sign | 0x7f);
  const double a = std::fabs(x);
  if (a >= 448.0) return uint8_t(sign | 0x7e);
  uint8_t best = 0;
  double best_distance = std::numeric_limits<double>::infinity();
  for (int c = 0; c <= 0x7e; ++c) {
    const double distance = std::fabs(e4m3_reference(uint8_t(c)) - a);
    if (distance < best_distance || (distance == best_distance && (c & 1) == 0)) {
      best = uint8_t(c);
      best_distance = distance;
    }
  }
  return uint8_t(sign | best);
}

}  // namespace fstest
