#include "kernels/cpu/cpu_scan.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "sampling/gumbel_bounds.h"
#include "util/dtype.h"
#include "util/philox.h"

#if defined(__x86_64__) || defined(__i386__)
#define FLASHSPEC_CPU_X86 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define FLASHSPEC_CPU_X86 0
#endif

namespace flashspec {
namespace cpu {
namespace {

constexpr int kLanes = 8;

float sum_lanes(const float* lane) {
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

const unsigned char* weight_row(const WeightRows& w, int64_t k) {
  return static_cast<const unsigned char*>(w.data) + size_t(k * w.row_stride) * dtype_size(w.dtype);
}

}  // namespace

void convert_row(const void* row, flashspec_dtype dtype, int64_t n, float* out) {
  switch (dtype) {
    case FLASHSPEC_DTYPE_F32: std::memcpy(out, row, size_t(n) * sizeof(float)); break;
    case FLASHSPEC_DTYPE_BF16:
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(static_cast<const uint16_t*>(row)[i]);
      break;
    case FLASHSPEC_DTYPE_E4M3:
      for (int64_t i = 0; i < n; ++i) out[i] = e4m3_to_float(static_cast<const uint8_t*>(row)[i]);
      break;
    case FLASHSPEC_DTYPE_I8:
      for (int64_t i = 0; i < n; ++i) out[i] = i8_to_float(static_cast<const uint8_t*>(row)[i]);
      break;
    default:
      for (int64_t i = 0; i < n; ++i) out[i] = fp16_to_float(static_cast<const uint16_t*>(row)[i]);
      break;
  }
}

namespace {
// An 8-bit head's logits are the codes' dot products times their row's scale.
void apply_row_scales(const WeightRows& w, int64_t count, int64_t rows, float* logits) {
  if (!w.scales) return;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < count; ++k) logits[r * count + k] *= w.scales[k];
}
}  // namespace

// The definition of a logit (cpu_scan.h), one weight row at a time. std::fma
// rounds once, as the vector kernel's FMA does.
void tile_logits_portable(const WeightRows& w, int64_t count, const float* hidden, int64_t rows, int64_t d,
                          float* logits) {
  std::vector<float> row(static_cast<size_t>(d));
  for (int64_t k = 0; k < count; ++k) {
    convert_row(weight_row(w, k), w.dtype, d, row.data());
    for (int64_t r = 0; r < rows; ++r) {
      const float* h = hidden + r * d;
      float lane[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t i = 0;
      for (; i + kLanes <= d; i += kLanes)
        for (int j = 0; j < kLanes; ++j) lane[j] = std::fma(row[size_t(i + j)], h[i + j], lane[j]);
      for (int j = 0; i < d; ++i, ++j) lane[j] = std::fma(row[size_t(i)], h[i], lane[j]);
      logits[r * count + k] = sum_lanes(lane);
    }
  }
  apply_row_scales(w, count, rows, logits);
}

namespace {

// exp(x − m) for x − m ≤ 0 (Cephes' expf: n = round((x − m)/ln 2), the
// remainder r in two steps, a degree-7 polynomial, 2^n from the exponent
// bits). The AVX2 kernel does these operations in this order, lane by lane.
constexpr float kExpFloor = -87.0f;  // 2^n stays a normal float
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kExpP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                            4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

inline float exp_term(float x, float m) {
  const float t = std::max(x - m, kExpFloor);
  const float n = std::nearbyint(t * kLog2e);
  float r = std::fma(n, -kLn2Hi, t);
  r = std::fma(n, -kLn2Lo, r);
  float p = kExpP[0];
  for (int i = 1; i < 6; ++i) p = std::fma(p, r, kExpP[i]);
  const float y = std::fma(p, r * r, r) + 1.0f;
  return y * bits_to_float(uint32_t(int32_t(n) + 127) << 23);
}

}  // namespace

float sum_exp_portable(const float* x, int64_t n, float m) {
  float lane[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes)
    for (int j = 0; j < kLanes; ++j) lane[j] += exp_term(x[k + j], m);
  for (int j = 0; k < n; ++k, ++j) lane[j] += exp_term(x[k], m);
  return sum_lanes(lane);
}

#if FLASHSPEC_CPU_X86
namespace {

#define FS_AVX2 __attribute__((target("avx2,fma,f16c")))

// The 256 e4m3 values, for a gather (util/dtype.h's e4m3_to_float).
const std::array<float, 256>& e4m3_values() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[size_t(c)] = e4m3_to_float(uint8_t(c));
    return t;
  }();
  return table;
}

// Eight weights from element i of a row, as fp32 (exact conversions).
template <flashspec_dtype D>
FS_AVX2 inline __m256 load_weights(const unsigned char* row, int64_t i) {
  if constexpr (D == FLASHSPEC_DTYPE_F32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + i);
  } else if constexpr (D == FLASHSPEC_DTYPE_I8) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + i));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
  } else if constexpr (D == FLASHSPEC_DTYPE_E4M3) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + i));
    return _mm256_i32gather_ps(e4m3_values().data(), _mm256_cvtepu8_epi32(bytes), 4);
  } else {
    const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(row) + i));
    if constexpr (D == FLASHSPEC_DTYPE_BF16)
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
    else
      return _mm256_cvtph_ps(half);
  }
}

template <flashspec_dtype D>
FS_AVX2 inline float weight_at(const unsigned char* row, int64_t i) {
  if constexpr (D == FLASHSPEC_DTYPE_F32) return reinterpret_cast<const float*>(row)[i];
  else if constexpr (D == FLASHSPEC_DTYPE_E4M3) return e4m3_to_float(row[i]);
  else if constexpr (D == FLASHSPEC_DTYPE_I8) return i8_to_float(row[i]);
  else if constexpr (D == FLASHSPEC_DTYPE_BF16) return bf16_to_float(reinterpret_cast<const uint16_t*>(row)[i]);
  else return fp16_to_float(reinterpret_cast<const uint16_t*>(row)[i]);
}

// sum_lanes of a vector's eight lanes, the same additions in the same tree:
// two horizontal adds give (0+1)+(2+3) in the low half and (4+5)+(6+7) in
// the high half.
FS_AVX2 inline float sum_lanes_avx2(__m256 v) {
  const __m256 pairs = _mm256_hadd_ps(v, v);
  const __m256 quads = _mm256_hadd_ps(pairs, pairs);
  return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(quads), _mm256_extractf128_ps(quads, 1)));
}

// NW weight rows × NH hidden rows: NW·NH accumulators of eight lanes, each
// weight vector loaded once per step and used NH times. The tail past the
// last multiple of eight goes into lanes 0.. as in the portable kernel.
template <flashspec_dtype D, int NW, int NH>
FS_AVX2 void block_avx2(const WeightRows& w, int64_t k0, int64_t count, const float* hidden, int64_t r0, int64_t d,
                        float* logits, bool prefetch_next) {
  const unsigned char* wr[NW];
  const float* hr[NH];
  for (int a = 0; a < NW; ++a) wr[a] = weight_row(w, k0 + a);
  for (int b = 0; b < NH; ++b) hr[b] = hidden + (r0 + b) * d;
  __m256 acc[NW][NH];
#pragma GCC unroll 4
  for (int a = 0; a < NW; ++a)
#pragma GCC unroll 4
    for (int b = 0; b < NH; ++b) acc[a][b] = _mm256_setzero_ps();
  const int64_t body = d - d % kLanes;
  // The next block's weight rows, a cache line at a time, while this block
  // computes: the hardware prefetcher is slow to follow NW short streams.
  constexpr int64_t kElementBytes = D == FLASHSPEC_DTYPE_F32 ? 4 : (D == FLASHSPEC_DTYPE_E4M3 || D == FLASHSPEC_DTYPE_I8) ? 1 : 2;
  constexpr int64_t kLineElements = 64 / kElementBytes;
  const unsigned char* next[NW];
  for (int a = 0; a < NW; ++a) next[a] = prefetch_next ? weight_row(w, k0 + NW + a) : nullptr;
  for (int64_t i = 0; i < body; i += kLanes) {
    if (prefetch_next && i % kLineElements == 0)
      for (int a = 0; a < NW; ++a)
        _mm_prefetch(reinterpret_cast<const char*>(next[a] + i * kElementBytes), _MM_HINT_T1);
    __m256 h[NH];
#pragma GCC unroll 4
    for (int b = 0; b < NH; ++b) h[b] = _mm256_loadu_ps(hr[b] + i);
#pragma GCC unroll 4
    for (int a = 0; a < NW; ++a) {
      const __m256 wv = load_weights<D>(wr[a], i);
#pragma GCC unroll 4
      for (int b = 0; b < NH; ++b) acc[a][b] = _mm256_fmadd_ps(wv, h[b], acc[a][b]);
    }
  }
  if (body == d) {
    for (int a = 0; a < NW; ++a)
      for (int b = 0; b < NH; ++b) logits[(r0 + b) * count + k0 + a] = sum_lanes_avx2(acc[a][b]);
    return;
  }
  for (int a = 0; a < NW; ++a)
    for (int b = 0; b < NH; ++b) {
      alignas(32) float lane[kLanes];
      _mm256_store_ps(lane, acc[a][b]);
      for (int64_t i = body, j = 0; i < d; ++i, ++j) lane[j] = std::fma(weight_at<D>(wr[a], i), hr[b][i], lane[j]);
      logits[(r0 + b) * count + k0 + a] = sum_lanes(lane);
    }
}

constexpr int kBlockWeights = 4;  // weight rows per block
constexpr int kBlockHidden = 3;   // hidden rows per block: 12 accumulators + 3 + 1 of 16 registers

template <flashspec_dtype D, int NW>
FS_AVX2 void weight_block_avx2(const WeightRows& w, int64_t k0, int64_t count, const float* hidden, int64_t rows,
                               int64_t d, float* logits) {
  // Rows past the tile are never prefetched (they may not exist).
  const bool prefetch = k0 + 2 * NW <= count;
  int64_t r0 = 0;
  for (; r0 + kBlockHidden <= rows; r0 += kBlockHidden)
    block_avx2<D, NW, kBlockHidden>(w, k0, count, hidden, r0, d, logits, prefetch && r0 == 0);
  if (rows - r0 == 2) block_avx2<D, NW, 2>(w, k0, count, hidden, r0, d, logits, prefetch && r0 == 0);
  if (rows - r0 == 1) block_avx2<D, NW, 1>(w, k0, count, hidden, r0, d, logits, prefetch && r0 == 0);
}

template <flashspec_dtype D>
FS_AVX2 void tile_avx2(const WeightRows& w, int64_t count, const float* hidden, int64_t rows, int64_t d,
                       float* logits) {
  int64_t k0 = 0;
  for (; k0 + kBlockWeights <= count; k0 += kBlockWeights)
    weight_block_avx2<D, kBlockWeights>(w, k0, count, hidden, rows, d, logits);
  switch (count - k0) {
    case 3: weight_block_avx2<D, 3>(w, k0, count, hidden, rows, d, logits); break;
    case 2: weight_block_avx2<D, 2>(w, k0, count, hidden, rows, d, logits); break;
    case 1: weight_block_avx2<D, 1>(w, k0, count, hidden, rows, d, logits); break;
    default: break;
  }
}

// F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does
// not know the name. AVX2's check covers the OS saving the YMM registers.
bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29));
}

bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
  return has;
}

FS_AVX2 float sum_exp_avx2_kernel(const float* x, int64_t n, float m) {
  const __m256 mv = _mm256_set1_ps(m), floor = _mm256_set1_ps(kExpFloor), log2e = _mm256_set1_ps(kLog2e);
  const __m256 ln2_hi = _mm256_set1_ps(-kLn2Hi), ln2_lo = _mm256_set1_ps(-kLn2Lo), one = _mm256_set1_ps(1.0f);
  __m256 acc = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes) {
    const __m256 t = _mm256_max_ps(_mm256_sub_ps(_mm256_loadu_ps(x + k), mv), floor);
    const __m256 nv = _mm256_round_ps(_mm256_mul_ps(t, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(nv, ln2_hi, t);
    r = _mm256_fmadd_ps(nv, ln2_lo, r);
    __m256 p = _mm256_set1_ps(kExpP[0]);
    for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpP[i]));
    const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), one);
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(nv), _mm256_set1_epi32(127)), 23);
    acc = _mm256_add_ps(acc, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
  }
  alignas(32) float lane[kLanes];
  _mm256_store_ps(lane, acc);
  for (int j = 0; k < n; ++k, ++j) lane[j] += exp_term(x[k], m);
  return sum_lanes(lane);
}

// a · m for each 32-bit lane: the high and low words of the 64-bit product.
FS_AVX2 inline void mul_hi_lo8(__m256i a, uint32_t m, __m256i& hi, __m256i& lo) {
  const __m256i mv = _mm256_set1_epi32(int32_t(m));
  const __m256i even = _mm256_mul_epu32(a, mv);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), mv);
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}

// philox4x32_10 of util/philox.h for eight consecutive blocks, one a lane.
FS_AVX2 void row_words8(const RngRowKey& key, uint32_t first_block, uint32_t* words) {
  const __m256i blocks = _mm256_add_epi32(_mm256_set1_epi32(int32_t(first_block)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  __m256i c0 = _mm256_or_si256(_mm256_set1_epi32(int32_t(key.c0_high)),
                               _mm256_and_si256(blocks, _mm256_set1_epi32(0x3ffff)));
  __m256i c1 = _mm256_set1_epi32(int32_t(key.c1)), c2 = _mm256_set1_epi32(int32_t(key.c2));
  __m256i c3 = _mm256_set1_epi32(int32_t(key.c3));
  uint32_t k0 = key.k0, k1 = key.k1;
  for (int round = 0; round < 10; ++round) {
    __m256i hi0, lo0, hi1, lo1;
    mul_hi_lo8(c0, 0xD2511F53u, hi0, lo0);
    mul_hi_lo8(c2, 0xCD9E8D57u, hi1, lo1);
    c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32(int32_t(k0)));
    c1 = lo1;
    c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32(int32_t(k1)));
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  // Interleave: block i's four words are words[4 i .. 4 i + 3].
  const __m256i t0 = _mm256_unpacklo_epi32(c0, c1), t1 = _mm256_unpackhi_epi32(c0, c1);
  const __m256i t2 = _mm256_unpacklo_epi32(c2, c3), t3 = _mm256_unpackhi_epi32(c2, c3);
  const __m256i b0 = _mm256_unpacklo_epi64(t0, t2), b1 = _mm256_unpackhi_epi64(t0, t2);
  const __m256i b2 = _mm256_unpacklo_epi64(t1, t3), b3 = _mm256_unpackhi_epi64(t1, t3);
  // b0 holds blocks 0 and 4, b1 blocks 1 and 5, b2 blocks 2 and 6, b3 blocks 3 and 7.
  __m256i* out = reinterpret_cast<__m256i*>(words);
  _mm256_storeu_si256(out + 0, _mm256_permute2x128_si256(b0, b1, 0x20));
  _mm256_storeu_si256(out + 1, _mm256_permute2x128_si256(b2, b3, 0x20));
  _mm256_storeu_si256(out + 2, _mm256_permute2x128_si256(b0, b1, 0x31));
  _mm256_storeu_si256(out + 3, _mm256_permute2x128_si256(b2, b3, 0x31));
}

// may_place for 32 tokens. With words, most tokens are settled without a
// gather: below bucket 255 a bound is at most bounds[254] (the bounds
// increase), so where x + bounds[254] ≤ runner_up only the top bucket can
// place; the gather runs only for vectors with a token above that line.
FS_AVX2 uint32_t may_place32_avx2(const float* x, const uint32_t* words, float runner_up, const float* bounds,
                                  float max_bound) {
  const __m256 threshold = _mm256_set1_ps(runner_up);
  uint32_t mask = 0;
  for (int q = 0; q < 4; ++q) {
    const __m256 xv = _mm256_loadu_ps(x + 8 * q);
    const __m256 top_above = _mm256_cmp_ps(_mm256_add_ps(xv, _mm256_set1_ps(max_bound)), threshold, _CMP_GT_OQ);
    if (!words) {
      mask |= uint32_t(_mm256_movemask_ps(top_above)) << (8 * q);
      continue;
    }
    const __m256i bucket = _mm256_srli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + 8 * q)), 24);
    const __m256 below_top_above =
        _mm256_cmp_ps(_mm256_add_ps(xv, _mm256_set1_ps(bounds[254])), threshold, _CMP_GT_OQ);
    __m256 above;
    if (_mm256_movemask_ps(below_top_above) == 0) {
      const __m256 in_top = _mm256_castsi256_ps(_mm256_cmpeq_epi32(bucket, _mm256_set1_epi32(255)));
      above = _mm256_and_ps(in_top, top_above);
    } else {
      const __m256 bound = _mm256_i32gather_ps(bounds, bucket, 4);
      above = _mm256_cmp_ps(_mm256_add_ps(xv, bound), threshold, _CMP_GT_OQ);
    }
    mask |= uint32_t(_mm256_movemask_ps(above)) << (8 * q);
  }
  return mask;
}

// scale_row (below) for AVX2: the max over eight lanes, then the tail.
FS_AVX2 bool scale_row_avx2(const float* l, int64_t n, float inv_t, float* scaled, float* max) {
  const __m256 inv = _mm256_set1_ps(inv_t), abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 inf = _mm256_set1_ps(INFINITY);
  __m256 mv = _mm256_set1_ps(-INFINITY), finite = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes) {
    const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(l + k), inv);
    _mm256_storeu_ps(scaled + k, x);
    finite = _mm256_and_ps(finite, _mm256_cmp_ps(_mm256_and_ps(x, abs_mask), inf, _CMP_LT_OQ));
    mv = _mm256_max_ps(mv, x);
  }
  alignas(32) float lane[kLanes];
  _mm256_store_ps(lane, mv);
  float m = -INFINITY;
  for (float v : lane) m = std::max(m, v);
  bool all_finite = _mm256_movemask_ps(finite) == 0xff;
  for (; k < n; ++k) {
    const float x = l[k] * inv_t;
    scaled[k] = x;
    all_finite = all_finite && std::isfinite(x);
    m = std::max(m, x);
  }
  // The lanes may meet a +0 and a −0 in another order than the token
  // order; the sign of a zero max then comes from the chain in token order.
  if (m == 0.0f) {
    m = -INFINITY;
    for (k = 0; k < n; ++k) m = std::max(m, scaled[k]);
  }
  *max = m;
  return all_finite;
}

}  // namespace

bool sum_exp_avx2(const float* x, int64_t n, float m, float* sum) {
  if (!cpu_has_avx2()) return false;
  *sum = sum_exp_avx2_kernel(x, n, m);
  return true;
}

bool tile_logits_avx2(const WeightRows& w, int64_t count, const float* hidden, int64_t rows, int64_t d,
                      float* logits) {
  if (!cpu_has_avx2()) return false;
  switch (w.dtype) {
    case FLASHSPEC_DTYPE_F32: tile_avx2<FLASHSPEC_DTYPE_F32>(w, count, hidden, rows, d, logits); break;
    case FLASHSPEC_DTYPE_BF16: tile_avx2<FLASHSPEC_DTYPE_BF16>(w, count, hidden, rows, d, logits); break;
    case FLASHSPEC_DTYPE_E4M3: tile_avx2<FLASHSPEC_DTYPE_E4M3>(w, count, hidden, rows, d, logits); break;
    case FLASHSPEC_DTYPE_I8: tile_avx2<FLASHSPEC_DTYPE_I8>(w, count, hidden, rows, d, logits); break;
    default: tile_avx2<FLASHSPEC_DTYPE_F16>(w, count, hidden, rows, d, logits); break;
  }
  apply_row_scales(w, count, rows, logits);
  return true;
}

const char* tile_logits_kernel() { return cpu_has_avx2() ? "avx2" : "portable"; }

#else  // not x86

namespace {
bool cpu_has_avx2() { return false; }
void row_words8(const RngRowKey&, uint32_t, uint32_t*) {}
uint32_t may_place32_avx2(const float*, const uint32_t*, float, const float*, float) { return 0; }
bool scale_row_avx2(const float*, int64_t, float, float*, float*) { return false; }
}  // namespace
bool tile_logits_avx2(const WeightRows&, int64_t, const float*, int64_t, int64_t, float*) { return false; }
bool sum_exp_avx2(const float*, int64_t, float, float*) { return false; }
const char* tile_logits_kernel() { return "portable"; }

#endif

float sum_exp(const float* x, int64_t n, float m) {
  float sum;
  return sum_exp_avx2(x, n, m, &sum) ? sum : sum_exp_portable(x, n, m);
}

bool scale_row(const float* l, int64_t n, float inv_t, float* scaled, float* max, Kernel kernel) {
  if (kernel == Kernel::kBest && cpu_has_avx2()) return scale_row_avx2(l, n, inv_t, scaled, max);
  float m = neg_inf();
  bool finite = true;
  for (int64_t k = 0; k < n; ++k) {
    const float x = l[k] * inv_t;
    scaled[k] = x;
    finite = finite && is_finite(x);
    m = std::max(m, x);
  }
  *max = m;
  return finite;
}

uint32_t may_place(const float* x, const uint32_t* words, int64_t n, float runner_up, const float* bounds,
                   float max_bound, Kernel kernel) {
  if (n == 32 && kernel == Kernel::kBest && cpu_has_avx2())
    return may_place32_avx2(x, words, runner_up, bounds, max_bound);
  uint32_t mask = 0;
  for (int64_t j = 0; j < n; ++j) {
    const float bound = words ? bounds[words[j] >> 24] : max_bound;
    if (x[j] + bound > runner_up) mask |= 1u << j;
  }
  return mask;
}

void row_words(const RngRowKey& key, uint32_t first_block, int64_t n, uint32_t* words) {
  int64_t i = 0;
  if (cpu_has_avx2())
    for (; i + 8 <= n; i += 8) row_words8(key, first_block + uint32_t(i), words + 4 * i);
  for (; i < n; ++i) {
    const Philox4 block = row_block(key, first_block + uint32_t(i));
    for (int j = 0; j < 4; ++j) words[4 * i + j] = block.v[j];
  }
}

void tile_logits(const WeightRows& w, int64_t count, const float* hidden, int64_t rows, int64_t d, float* logits) {
  if (!tile_logits_avx2(w, count, hidden, rows, d, logits)) tile_logits_portable(w, count, hidden, rows, d, logits);
}

float gumbel_bucket_bound(uint32_t bucket) { return gumbel_bucket_bounds()[bucket & 255u]; }
float gumbel_max_bound() { return gumbel_bucket_bounds()[255]; }

Partial fold_tile(const RowPlan& plan, const float* l, int64_t count, int32_t first_token, bool prune,
                  int64_t* noised, Kernel kernel) {
  Partial p = empty_partial();
  const bool greedy = plan.flags & kPlanGreedy;
  if (plan.tracked >= first_token && int64_t(plan.tracked) < first_token + count) {
    const float x = l[plan.tracked - first_token];
    p.tracked = greedy ? x : x * plan.inv_t;
    p.flags |= kPartialTracked;
  }
  if (greedy) {
    for (int64_t k = 0; k < count; ++k) {
      if (!is_finite(l[k])) p.flags |= kPartialNonFinite;
      const int32_t token = first_token + int32_t(k);
      if (is_offered(plan, token)) offer_candidate(p, l[k], l[k], token);
    }
    return p;
  }

  constexpr int64_t kChunk = 256;  // scaled logits held on the stack at a time
  constexpr int64_t kGroupBlocks = 8;  // Philox blocks computed together (row_words)
  float scaled[kChunk];
  // The words of the chunk's blocks, a group of eight blocks (32 tokens) at
  // a time, computed when a token of the group first needs its noise.
  constexpr int64_t kGroupWords = kGroupBlocks * 4;
  uint32_t words[(kChunk / kGroupWords + 1) * kGroupWords];
  const std::array<float, 256>& bounds = gumbel_bucket_bounds();
  const float max_bound = bounds[255];
  int64_t noise_count = 0;
  for (int64_t c0 = 0; c0 < count; c0 += kChunk) {
    const int64_t n = std::min(kChunk, count - c0);
    // The chunk's log-sum-exp: its max first, then Σ exp(x − max), merged
    // like any two adjacent ranges.
    float m = neg_inf();
    int32_t flags = 0;
    if (!scale_row(l + c0, n, plan.inv_t, scaled, &m, kernel)) {
      for (int64_t k = 0; k < n; ++k)
        if (!is_finite(scaled[k])) flags |= is_finite(l[c0 + k]) ? kPartialScaleOverflow : kPartialNonFinite;
    }
    float s = 0.0f;
    if (flags == 0)
      s = kernel == Kernel::kPortable ? sum_exp_portable(scaled, n, m) : sum_exp(scaled, n, m);
    else  // the row fails (require_finite_row, row_status); only keep the math quiet
      m = neg_inf();
    p.flags |= flags;
    lse_merge(p.m, p.s, m, s);

    // words[w] is the Philox word of the chunk's token w − offset.
    const uint32_t first_block = uint32_t(first_token + int32_t(c0)) >> 2;
    const int64_t offset = int64_t(uint32_t(first_token + int32_t(c0)) & 3u);
    uint32_t ready = 0;  // bit g: the words of block group g are in `words`
    auto need_words = [&](int64_t w0, int64_t w1) {
      for (int64_t g = w0 / kGroupWords; g <= (w1 - 1) / kGroupWords; ++g)
        if (!((ready >> g) & 1u)) {
          row_words(plan.key, first_block + uint32_t(g * kGroupBlocks), kGroupBlocks, words + g * kGroupWords);
          ready |= 1u << g;
        }
    };
    for (int64_t k0 = 0; k0 < n; k0 += 32) {
      const int64_t width = std::min<int64_t>(32, n - k0);
      // Bit j: token k0 + j may place, by the bounds against the runner-up
      // as the group starts. The runner-up only grows, so what fails here
      // fails below too.
      uint32_t candidates = width == 32 ? 0xffffffffu : (1u << width) - 1u;
      if (prune) {
        candidates = may_place(scaled + k0, nullptr, width, p.second, bounds.data(), max_bound, kernel);
        if (candidates == 0) continue;
      }
      need_words(k0 + offset, k0 + offset + width);
      if (prune) candidates &= may_place(scaled + k0, words + k0 + offset, width, p.second, bounds.data(), max_bound, kernel);
      while (candidates) {
        const int64_t k = k0 + __builtin_ctz(candidates);
        candidates &= candidates - 1;
        const int32_t token = first_token + int32_t(c0 + k);
        if (!is_offered(plan, token)) continue;
        const float x = scaled[k];
        const uint32_t bits = words[k + offset];
        // A score that cannot exceed the runner-up changes nothing
        // (offer_candidate); fl(x + g) ≤ fl(x + bound) since rounding is
        // monotone, so these skips are exact.
        if (prune && x + bounds[bits >> 24] <= p.second) continue;
        offer_candidate(p, x + gumbel_from_bits(bits), x, token);
        ++noise_count;
      }
    }
  }
  if (noised) *noised += noise_count;
  return p;
}

}  // namespace cpu
}  // namespace flashspec
