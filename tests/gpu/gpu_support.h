// Helpers of the GPU tests: skip and check macros, device buffers and device
// copies of matrices, the float64 reference used to recognise near-ties, and
// a chi-square p-value. Handles, Rng, contexts, LM heads and matrices come
// from ../common.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../common/handles.h"
#include "../common/make.h"
#include "../common/matrix.h"
#include "../common/rng.h"
#include "flashspec.h"
#include "util/philox.h"
#include "util/quantize.h"

namespace fstest {

#define FSGPU_SKIP_WITHOUT_DEVICE()                                                         \
  do {                                                                                      \
    if (flashspec_cuda_device_count() == 0)                                                 \
      GTEST_SKIP() << "no CUDA device (flashspec_cuda_device_count() == 0): GPU test skipped"; \
  } while (0)

#define FSGPU_OK(ctx, call)                                                                      \
  do {                                                                                           \
    flashspec_status st_ = (call);                                                               \
    ASSERT_EQ(st_, FLASHSPEC_OK) << #call << ": " << flashspec_status_name(st_) << ": "          \
                                 << flashspec_context_last_error(ctx);                           \
  } while (0)

#define FSGPU_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

// Device copy of a host vector.
template <class T>
class Dev {
 public:
  explicit Dev(size_t n) : n_(n) {
    if (n_ && cudaMalloc(&p_, n_ * sizeof(T)) != cudaSuccess) p_ = nullptr;
    if (p_) cudaMemset(p_, 0xff, n_ * sizeof(T));  // poison: unwritten outputs show
  }
  explicit Dev(const std::vector<T>& v) : Dev(v.size()) { put(v); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() {
    if (p_) cudaFree(p_);
  }
  void put(const std::vector<T>& v) {
    if (p_) cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  std::vector<T> get() const {
    std::vector<T> v(n_);
    if (p_) cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
  T* ptr() const { return static_cast<T*>(p_); }

 private:
  void* p_ = nullptr;
  size_t n_;
};

// A device copy of a matrix with the same layout.
class DevMatrix {
 public:
  explicit DevMatrix(const Matrix& m) : m_(m), buf_(m.size_bytes()) {
    cudaMemcpy(buf_.ptr(), m.data(), m.size_bytes(), cudaMemcpyHostToDevice);
  }
  flashspec_tensor view() const {
    flashspec_tensor t = flashspec_tensor_make(buf_.ptr(), m_.dtype, FLASHSPEC_MEMORY_CUDA, m_.rows, m_.cols);
    t.row_stride = m_.stride;
    return t;
  }
  unsigned char* ptr() const { return buf_.ptr(); }

 private:
  const Matrix& m_;
  Dev<unsigned char> buf_;
};

// Exact (float64) logit of token i for hidden row r.
inline double exact_logit(const Matrix& w, const Matrix& h, int64_t r, int64_t i) {
  double acc = 0.0;
  for (int64_t c = 0; c < w.cols; ++c) acc += w.at(i, c) * h.at(r, c);
  return acc;
}

// stored: FLASHSPEC_DTYPE_E4M3 or FLASHSPEC_DTYPE_I8 quantises W into an
// 8-bit head on both backends (flashspec_lm_head_create_quantized); F32:
// W as it is.
constexpr flashspec_dtype kUnquantised = FLASHSPEC_DTYPE_F32;

// The W an 8-bit head holds (the rule of util/quantize.h), as fp32 values
// s_v · q_vk, for the float64 reference; W itself when unquantised.
inline Matrix dequantised(const Matrix& w, flashspec_dtype stored) {
  Matrix out(FLASHSPEC_DTYPE_F32, w.rows, w.cols);
  std::vector<float> row(size_t(w.cols));
  std::vector<uint8_t> codes(size_t(w.cols));
  for (int64_t v = 0; v < w.rows; ++v) {
    for (int64_t k = 0; k < w.cols; ++k) row[size_t(k)] = float(w.at(v, k));
    const float scale = stored == kUnquantised ? 1.0f : flashspec::quantize_row(row.data(), w.cols, stored, codes.data());
    for (int64_t k = 0; k < w.cols; ++k)
      out.set(v, k, stored == kUnquantised ? double(row[size_t(k)])
                                           : double(scale) * flashspec::load_as_float(codes.data(), stored, k));
  }
  return out;
}

// A pre-quantised 8-bit head's rows as a caller hands them over: codes
// drawn byte by byte over every value the dtype has (int8's −128, which the
// quantiser never writes, included; e4m3's NaN codes excepted) and a scale
// per row; `reference` is their values s_v · q_vk, for the float64 logits.
struct PrequantisedRows {
  std::vector<uint8_t> codes;  // [vocab, d]
  std::vector<float> scales;   // [vocab]
  Matrix reference;
};

inline PrequantisedRows prequantised_rows(flashspec_dtype stored, int64_t vocab, int64_t d, Rng& rng) {
  PrequantisedRows out{std::vector<uint8_t>(size_t(vocab * d)), std::vector<float>(size_t(vocab)),
                       Matrix(FLASHSPEC_DTYPE_F32, vocab, d)};
  for (int64_t v = 0; v < vocab; ++v) {
    uint8_t* row = out.codes.data() + v * d;
    for (int64_t k = 0; k < d; ++k) {
      do row[k] = uint8_t(rng.next() >> 56);
      while (stored == FLASHSPEC_DTYPE_E4M3 && (row[k] & 0x7f) == 0x7f);
    }
    // Logits of unit scale: a code's magnitude is up to 448 (e4m3) or 128.
    const double largest = stored == FLASHSPEC_DTYPE_E4M3 ? 448.0 : 128.0;
    out.scales[size_t(v)] = float((0.5 + rng.uniform()) * 3.0 / (largest * std::sqrt(double(d))));
    for (int64_t k = 0; k < d; ++k)
      out.reference.set(v, k, double(out.scales[size_t(v)]) * flashspec::load_as_float(row, stored, k));
  }
  return out;
}

// A head over those rows, copied from host memory.
inline HeadPtr make_prequantised_head(flashspec_context* ctx, const PrequantisedRows& rows, flashspec_dtype stored) {
  const flashspec_tensor codes = flashspec_tensor_make(rows.codes.data(), stored, FLASHSPEC_MEMORY_HOST,
                                                       rows.reference.rows, rows.reference.cols);
  const flashspec_tensor scales =
      flashspec_tensor_make(rows.scales.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, rows.reference.rows, 1);
  flashspec_lm_head* head = nullptr;
  EXPECT_EQ(flashspec_lm_head_create_quantized(ctx, &codes, &scales, stored, FLASHSPEC_LM_HEAD_COPY, &head),
            FLASHSPEC_OK)
      << flashspec_context_last_error(ctx);
  return HeadPtr(head);
}

inline HeadPtr make_case_head(flashspec_context* ctx, const flashspec_tensor& w, flashspec_lm_head_flags flags,
                       flashspec_dtype stored) {
  if (stored == kUnquantised) return make_head(ctx, w, flags);
  flashspec_lm_head* head = nullptr;
  EXPECT_EQ(flashspec_lm_head_create_quantized(ctx, &w, nullptr, stored, flags, &head), FLASHSPEC_OK)
      << flashspec_context_last_error(ctx);
  EXPECT_EQ(flashspec_lm_head_dtype(head), stored);
  return HeadPtr(head);
}

// Near-tie threshold on scores of unit scale: fp32 accumulation over d terms
// moves a logit by far less (about 1e-6 here); two candidates closer than
// this may legitimately swap between backends.
constexpr double kNearTie = 2e-3;

namespace gpu_stats {

// Regularised upper incomplete gamma Q(a, x) (Numerical Recipes), for the
// chi-square p-value Q(df/2, chi2/2). In a sub-namespace: the exactness
// suite's stats.h has its own fstest::gamma_q.
inline double gamma_q(double a, double x) {
  if (x <= 0) return 1.0;
  const double gln = std::lgamma(a);
  if (x < a + 1) {
    double sum = 1.0 / a, del = sum, ap = a;
    for (int n = 0; n < 1000; ++n) {
      ap += 1;
      del *= x / ap;
      sum += del;
      if (std::fabs(del) < std::fabs(sum) * 1e-15) break;
    }
    return 1.0 - sum * std::exp(-x + a * std::log(x) - gln);
  }
  double b = x + 1 - a, c = 1e300, d = 1 / b, hh = d;
  for (int i = 1; i < 1000; ++i) {
    double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (std::fabs(d) < 1e-300) d = 1e-300;
    c = b + an / c;
    if (std::fabs(c) < 1e-300) c = 1e-300;
    d = 1 / d;
    double del = d * c;
    hh *= del;
    if (std::fabs(del - 1) < 1e-15) break;
  }
  return std::exp(-x + a * std::log(x) - gln) * hh;
}

}  // namespace gpu_stats

// p-value of Pearson's chi-square of counts against probabilities (cells
// with expected count < 5 are pooled).
inline double chi_square_p(const std::vector<long>& counts, const std::vector<double>& probs) {
  long n = 0;
  for (long c : counts) n += c;
  double chi2 = 0.0, pool_obs = 0.0, pool_exp = 0.0;
  int cells = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    double e = probs[i] * double(n);
    if (e < 5.0) {
      pool_obs += double(counts[i]);
      pool_exp += e;
      continue;
    }
    chi2 += (double(counts[i]) - e) * (double(counts[i]) - e) / e;
    ++cells;
  }
  if (pool_exp > 0.0) {
    if (pool_exp < 1e-12) {
      if (pool_obs > 0) return 0.0;
    } else {
      chi2 += (pool_obs - pool_exp) * (pool_obs - pool_exp) / pool_exp;
      ++cells;
    }
  }
  if (cells < 2) return 1.0;
  return gpu_stats::gamma_q(0.5 * (cells - 1), 0.5 * chi2);
}

}  // namespace fstest
