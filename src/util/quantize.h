// The 8-bit LM-head quantisation rule (flashspec.h:
// flashspec_lm_head_create_quantized), one definition for every backend:
// per vocabulary row, scale = amax / 448 (e4m3) or amax / 127 (int8), and
// code_k = w_k / scale rounded to nearest, ties to even (e4m3 saturating at
// ±448, int8 clamped to ±127). A row whose scale would be 0 (all zeros, or an
// amax below 448 · 2^-149) gets scale 1, so its codes are its rounded values.
#pragma once

#include <cmath>
#include <cstdint>

#include "flashspec.h"
#include "util/dtype.h"

namespace flashspec {

inline float quantize_scale(float amax, flashspec_dtype stored) {
  const float scale = amax / (stored == FLASHSPEC_DTYPE_E4M3 ? kE4m3Max : 127.0f);
  return scale > 0.0f ? scale : 1.0f;
}

inline uint8_t quantize_code(float w, float scale, flashspec_dtype stored) {
  const float x = w / scale;
  if (stored == FLASHSPEC_DTYPE_E4M3) return float_to_e4m3(x);
  const float r = std::nearbyint(x);  // the default rounding mode: to nearest, ties to even
  return uint8_t(int8_t(r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r)));
}

// Quantises one row of n fp32 values into codes; returns its scale.
inline float quantize_row(const float* w, int64_t n, flashspec_dtype stored, uint8_t* codes) {
  float amax = 0.0f;
  for (int64_t k = 0; k < n; ++k) amax = std::fmax(amax, std::fabs(w[k]));
  const float scale = quantize_scale(amax, stored);
  for (int64_t k = 0; k < n; ++k) codes[k] = quantize_code(w[k], scale, stored);
  return scale;
}

}  // namespace flashspec
