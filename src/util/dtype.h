// Exact conversions between fp32 and the 16-bit storage formats.
//
// bf16 → fp32 and fp16 → fp32 are exact; fp32 → bf16/fp16 round to nearest,
// ties to even, with overflow to ±Inf and NaN kept NaN (quiet).
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

// Size in bytes of one element; 0 for an unknown dtype.
FS_HOST_DEVICE size_t dtype_size(flashspec_dtype dtype) {
  switch (dtype) {
    case FLASHSPEC_DTYPE_F32: return 4;
    case FLASHSPEC_DTYPE_BF16: return 2;
    case FLASHSPEC_DTYPE_F16: return 2;
    default: return 0;
  }
}

// Element i of a row of the given dtype, as fp32 (exact).
FS_HOST_DEVICE float load_as_float(const void* row, flashspec_dtype dtype, int64_t i) {
  switch (dtype) {
    case FLASHSPEC_DTYPE_BF16: return bf16_to_float(static_cast<const uint16_t*>(row)[i]);
    case FLASHSPEC_DTYPE_F16: return fp16_to_float(static_cast<const uint16_t*>(row)[i]);
    default: return static_cast<const float*>(row)[i];
  }
}

}  // namespace flashspec
