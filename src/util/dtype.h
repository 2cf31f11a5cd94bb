// Exact conversions between fp32 and the storage formats.
//
// bf16, fp16, e4m3 and int8 → fp32 are exact; fp32 → bf16/fp16 round to
// nearest, ties to even, with overflow to ±Inf and NaN kept NaN (quiet);
// fp32 → e4m3 rounds to nearest, ties to even, saturating at ±448.
#pragma once

#include <cstdint>
#include <cstring>

#include "flashspec.h"
#include "util/host_device.h"

namespace flashspec {

FS_HOST_DEVICE float bits_to_float(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

FS_HOST_DEVICE uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
#endif
}

FS_HOST_DEVICE float bf16_to_float(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }

FS_HOST_DEVICE uint16_t float_to_bf16(float f) {
  uint32_t bits = float_to_bits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x0040u);  // quiet NaN
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t((bits + rounding) >> 16);
}

FS_HOST_DEVICE float fp16_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) return bits_to_float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    if (mantissa == 0) return bits_to_float(sign);
    // Subnormal: value = mantissa * 2^-24, exact in fp32.
    float magnitude = float(mantissa) * 5.9604644775390625e-08f;
    return sign ? -magnitude : magnitude;
  }
  return bits_to_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

FS_HOST_DEVICE uint16_t float_to_fp16(float f) {
  uint32_t bits = float_to_bits(f);
  uint16_t sign = uint16_t((bits >> 16) & 0x8000u);
  uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return uint16_t(sign | 0x7e00u);      // NaN
  if (abs_bits >= 0x477ff000u) return uint16_t(sign | 0x7c00u);     // rounds to Inf
  if (abs_bits < 0x38800000u) {                                      // fp16 subnormal or zero
    if (abs_bits < 0x33000000u) return sign;                         // below half the least subnormal
    uint32_t exponent = abs_bits >> 23;
    uint32_t mantissa = (abs_bits & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - exponent;                                // 14..24
    uint32_t result = mantissa >> shift;
    uint32_t remainder = mantissa & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (remainder > half || (remainder == half && (result & 1u))) ++result;
    return uint16_t(sign | result);
  }
  uint32_t rounded = abs_bits + 0xfffu + ((abs_bits >> 13) & 1u);
  return uint16_t(sign | ((rounded - 0x38000000u) >> 13));
}

// fp8 e4m3 (OCP "e4m3fn"): sign, 4 exponent bits (bias 7), 3 mantissa bits;
// no infinities, 0x7f and 0xff are NaN, the largest finite value is 448.
constexpr float kE4m3Max = 448.0f;

FS_HOST_DEVICE float e4m3_to_float(uint8_t c) {
  const uint32_t sign = uint32_t(c & 0x80u) << 24;
  const uint32_t exponent = (c >> 3) & 0xfu, mantissa = c & 0x7u;
  if (exponent == 0xfu && mantissa == 0x7u) return bits_to_float(0x7fc00000u | sign);
  if (exponent == 0) {
    const float magnitude = float(mantissa) * 0.001953125f;  // mantissa · 2^-9, exact
    return sign ? -magnitude : magnitude;
  }
  return bits_to_float(sign | ((exponent + 120u) << 23) | (mantissa << 20));
}

// Round to nearest, ties to even; |f| beyond 448 (Inf included) saturates to
// ±448; NaN becomes 0x7f with f's sign.
FS_HOST_DEVICE uint8_t float_to_e4m3(float f) {
  const uint32_t bits = float_to_bits(f);
  const uint8_t sign = uint8_t((bits >> 24) & 0x80u);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return uint8_t(sign | 0x7fu);
  if (abs_bits >= 0x43e00000u) return uint8_t(sign | 0x7eu);  // ≥ 448
  if (abs_bits < 0x3c800000u) {                              // below 2^-6: subnormal codes m · 2^-9
    // Scaling by 2^9 is exact; the code is the rounded multiple (8 rounds up
    // into the smallest normal, code 0x08, which is the same bits).
    const float scaled = bits_to_float(abs_bits) * 512.0f;
#if defined(__CUDA_ARCH__)
    const uint32_t m = uint32_t(rintf(scaled));
#else
    const uint32_t m = uint32_t(__builtin_rintf(scaled));
#endif
    return uint8_t(sign | m);
  }
  // Keep 3 of the 23 mantissa bits, rounding to nearest even (a carry moves
  // into the exponent), then rebias 127 → 7.
  const uint32_t rounded = (abs_bits + 0x7ffffu + ((abs_bits >> 20) & 1u)) >> 20;
  const uint32_t code = rounded - ((127u - 7u) << 3);
  return uint8_t(sign | (code > 0x7eu ? 0x7eu : code));
}

FS_HOST_DEVICE float i8_to_float(uint8_t c) { return float(int8_t(c)); }

// Whether a dtype is one of the 8-bit LM-head formats (codes with one fp32
// scale per vocabulary row; flashspec_lm_head_create_quantized).
FS_HOST_DEVICE bool dtype_is_8bit(flashspec_dtype dtype) {
  return dtype == FLASHSPEC_DTYPE_E4M3 || dtype == FLASHSPEC_DTYPE_I8;
}

// Size in bytes of one element; 0 for an unknown dtype.
FS_HOST_DEVICE size_t dtype_size(flashspec_dtype dtype) {
  switch (dtype) {
    case FLASHSPEC_DTYPE_F32: return 4;
    case FLASHSPEC_DTYPE_BF16: return 2;
    case FLASHSPEC_DTYPE_F16: return 2;
    case FLASHSPEC_DTYPE_E4M3: return 1;
    case FLASHSPEC_DTYPE_I8: return 1;
    default: return 0;
  }
}

// Element i of a row of the given dtype, as fp32 (exact; an 8-bit code's
// value before its row's scale).
FS_HOST_DEVICE float load_as_float(const void* row, flashspec_dtype dtype, int64_t i) {
  switch (dtype) {
    case FLASHSPEC_DTYPE_BF16: return bf16_to_float(static_cast<const uint16_t*>(row)[i]);
    case FLASHSPEC_DTYPE_F16: return fp16_to_float(static_cast<const uint16_t*>(row)[i]);
    case FLASHSPEC_DTYPE_E4M3: return e4m3_to_float(static_cast<const uint8_t*>(row)[i]);
    case FLASHSPEC_DTYPE_I8: return i8_to_float(static_cast<const uint8_t*>(row)[i]);
    default: return static_cast<const float*>(row)[i];
  }
}

}  // namespace flashspec
