// Fuzz-input readers for the values the harnesses share: matrices,
// temperatures and the small selector bytes. An input byte 0 always means
// the plain, valid choice, so short inputs make valid calls.
#pragma once

#include <limits>

#include "fuzz_common.h"

namespace fsfuzz {

// A temperature; most bytes give a valid one, a few the edges of the range
// and a few invalid values (negative, NaN, ±Inf).
inline float read_temperature(Input& in, float zero_value) {
  const uint8_t t = in.u8();
  switch (t) {
    case 0: return zero_value;
    case 1: return 1.0f;
    case 2: return 0.5f;
    case 3: return 2.0f;
    case 4: return 0.0f;
    case 5: return -0.0f;
    case 6: return 1e-3f;
    case 7: return 1e-38f;                                      // l/T may overflow
    case 8: return std::numeric_limits<float>::denorm_min();    // 1/T overflows
    case 9: return -1.0f;
    case 10: return std::numeric_limits<float>::quiet_NaN();
    case 11: return std::numeric_limits<float>::infinity();
    case 12: return -std::numeric_limits<float>::infinity();
    case 13: return std::numeric_limits<float>::max();
    case 14: return -std::numeric_limits<float>::denorm_min();
    case 15: return in.f32();
    default: return float(t - 15) / 32.0f;
  }
}

inline bool valid_temperature(float t) { return std::isfinite(t) && t >= 0.0f; }
inline bool valid_draft_temperature(float t) { return std::isfinite(t) && t > 0.0f; }

// A host matrix's layout and values: dtype, extra stride, misalignment,
// value mode, scale and the seed of its values.
struct MatrixSpec {
  int32_t dtype = FLASHSPEC_DTYPE_F32;
  int64_t extra_stride = 0;
  size_t offset = 0;
  ValueMode mode = ValueMode::kNormal;
  float scale = 1.0f;
  bool duplicate_rows = false;
  uint64_t seed = 0;
};

// `allow_huge`: whether kHuge (values that may overflow a logit) may be chosen.
inline MatrixSpec read_matrix_spec(Input& in, bool allow_huge) {
  MatrixSpec s;
  s.dtype = int32_t(in.u8() % 3);
  s.extra_stride = in.u8() % 3;
  const uint8_t align = in.u8();
  // Misaligned data (an odd byte offset, or 2 for fp32) in 1 of 8.
  if (align >= 224) s.offset = size_t(1 + align % 3);
  const uint8_t mode = in.u8();
  if (mode < 160) s.mode = ValueMode::kNormal;
  else s.mode = ValueMode((mode - 160) % uint8_t(allow_huge ? 5 : 4));
  s.scale = 0.125f * float(1 + in.u8() % 32);
  s.duplicate_rows = in.u8() >= 192;
  s.seed = in.u64();
  return s;
}

inline void build(HostMatrix& m, const MatrixSpec& s, int64_t rows, int64_t cols) {
  m.init(s.dtype, rows, cols, s.extra_stride, s.offset);
  Rng rng(s.seed);
  fill(m, rng, s.mode, s.scale, s.duplicate_rows);
}

// A non-finite value at a place the input picks: NaN, +Inf or −Inf.
inline void plant_nonfinite(HostMatrix& m, Input& in) {
  if (m.rows * m.cols == 0) return;
  const int64_t r = in.range(0, m.rows - 1), c = in.range(0, m.cols - 1);
  const uint8_t k = in.u8() % 3;
  const float v = k == 0 ? std::numeric_limits<float>::quiet_NaN()
                         : (k == 1 ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity());
  m.set(r, c, v);
}

}  // namespace fsfuzz
