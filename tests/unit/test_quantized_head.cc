// 8-bit LM heads on the CPU backend (flashspec_lm_head_create_quantized):
// a head quantised by the library is the head of the codes and scales that
// the quantisation rule gives; a greedy draft and a T = 0 verify follow the
// float64 argmax of l_v = s_v · Σ_k h_k q_vk, with q_vk decoded by
// fp8_reference.h; the AVX2 and portable logits kernels agree bit for bit on
// codes with scales; strided inputs never read their padding; the head
// reports its dtype; and every bad input fails with its status, a message
// naming the argument and *out untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "../common/fp8_reference.h"
#include "kernels/cpu/cpu_scan.h"
#include "support.h"
#include "util/dtype.h"
#include "util/quantize.h"

namespace {

using namespace fstest;

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();
constexpr int32_t kPoison = 0x7eadbeef;

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

const char* stored_name(flashspec_dtype t) { return t == FLASHSPEC_DTYPE_E4M3 ? "e4m3" : "i8"; }

// A pre-quantised head: codes [rows, stride] (padding past cols filled with
// `pad`) and one fp32 scale per row.
struct Codes {
  flashspec_dtype stored = FLASHSPEC_DTYPE_I8;
  int64_t rows = 0, cols = 0, stride = 0;
  std::vector<uint8_t> codes;
  std::vector<float> scales;

  uint8_t code(int64_t v, int64_t k) const { return codes[size_t(v * stride + k)]; }
  double value(int64_t v, int64_t k) const {
    return stored == FLASHSPEC_DTYPE_E4M3 ? e4m3_reference(code(v, k)) : i8_reference(code(v, k));
  }
  flashspec_tensor view() const {
    flashspec_tensor t = flashspec_tensor_make(codes.data(), stored, FLASHSPEC_MEMORY_HOST, rows, cols);
    t.row_stride = stride;
    return t;
  }
  flashspec_tensor scales_view() const {
    return flashspec_tensor_make(scales.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, rows, 1);
  }
};

uint8_t random_code(flashspec_dtype stored, Rng& rng) {
  for (;;) {
    const uint8_t c = uint8_t(rng.next() >> 56);
    if (stored == FLASHSPEC_DTYPE_I8 || (c & 0x7f) != 0x7f) return c;  // no e4m3 NaN
  }
}

// Every int8 code, every finite e4m3 code, scales over many binades, and
// rows 3 and 7 with scale 0 (all their logits are 0).
Codes random_codes(flashspec_dtype stored, int64_t rows, int64_t cols, Rng& rng, int64_t stride = 0,
                   uint8_t pad = 0x7f) {
  Codes c;
  c.stored = stored;
  c.rows = rows;
  c.cols = cols;
  c.stride = stride ? stride : cols;
  c.codes.assign(size_t(rows * c.stride), pad);
  c.scales.resize(size_t(rows));
  const double base = stored == FLASHSPEC_DTYPE_E4M3 ? 1.0 / 448 : 1.0 / 127;
  for (int64_t v = 0; v < rows; ++v) {
    for (int64_t k = 0; k < cols; ++k) c.codes[size_t(v * c.stride + k)] = random_code(stored, rng);
    c.scales[size_t(v)] = float(base * std::ldexp(0.5 + rng.uniform(), int(rng.below(7)) - 3));
    if (v == 3 || v == 7) c.scales[size_t(v)] = 0.0f;
  }
  return c;
}

// The codes and scales flashspec.h's rule gives for w (its exact values).
Codes quantize_matrix(const Matrix& w, flashspec_dtype stored) {
  Codes c;
  c.stored = stored;
  c.rows = w.rows;
  c.cols = c.stride = w.cols;
  c.codes.resize(size_t(w.rows * w.cols));
  c.scales.resize(size_t(w.rows));
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t v = 0; v < w.rows; ++v) {
    for (int64_t k = 0; k < w.cols; ++k) row[size_t(k)] = float(w.at(v, k));
    c.scales[size_t(v)] = flashspec::quantize_row(row.data(), w.cols, stored, c.codes.data() + v * w.cols);
  }
  return c;
}

flashspec_status create(flashspec_context* ctx, const flashspec_tensor& weight, const flashspec_tensor* scales,
                        flashspec_dtype stored, flashspec_lm_head** out) {
  return flashspec_lm_head_create_quantized(ctx, &weight, scales, stored, FLASHSPEC_LM_HEAD_COPY, out);
}

HeadPtr make_quantized(flashspec_context* ctx, const flashspec_tensor& weight, const flashspec_tensor* scales,
                       flashspec_dtype stored) {
  flashspec_lm_head* head = nullptr;
  EXPECT_EQ(create(ctx, weight, scales, stored, &head), FLASHSPEC_OK) << flashspec_context_last_error(ctx);
  return HeadPtr(head);
}

HeadPtr make_from_codes(flashspec_context* ctx, const Codes& c) {
  const flashspec_tensor s = c.scales_view();
  return make_quantized(ctx, c.view(), &s, c.stored);
}

// Float64 logits s_v · Σ_k h_k q_vk of one hidden row, and a bound on the
// error of the fp32 evaluation: the dot product as in support.h (γ_(d+1)
// Σ|h q|, times s_v), then one rounding of the product with s_v.
ReferenceLogits dequantised_logits(const Codes& c, const Matrix& hidden, int64_t row) {
  ReferenceLogits out;
  out.logit.resize(size_t(c.rows));
  out.error_bound.resize(size_t(c.rows));
  const double u = std::ldexp(1.0, -24), n = double(c.cols + 1), gamma = n * u / (1.0 - n * u);
  for (int64_t v = 0; v < c.rows; ++v) {
    double sum = 0.0, magnitude = 0.0;
    for (int64_t k = 0; k < c.cols; ++k) {
      const double p = c.value(v, k) * hidden.at(row, k);
      sum += p;
      magnitude += std::fabs(p);
    }
    const double s = c.scales[size_t(v)];
    out.logit[size_t(v)] = s * sum;
    out.error_bound[size_t(v)] = s * gamma * magnitude * (1 + u) + u * std::fabs(s * sum) + 1e-300;
    out.max_error = std::max(out.max_error, out.error_bound[size_t(v)]);
  }
  return out;
}

// Draft outputs of one call.
struct DraftOut {
  std::vector<int32_t> tokens;
  std::vector<float> scores;
};

DraftOut draft(flashspec_context* ctx, const flashspec_lm_head* head, const Matrix& hidden, float temperature) {
  DraftOut out{std::vector<int32_t>(size_t(hidden.rows), -9), std::vector<float>(size_t(hidden.rows), kNaN)};
  flashspec_draft_params p;
  flashspec_draft_params_init(&p);
  p.temperature = temperature;
  std::vector<uint64_t> seeds(size_t(hidden.rows));
  for (size_t i = 0; i < seeds.size(); ++i) seeds[i] = 1000 + i;
  p.seeds = seeds.data();
  const flashspec_tensor h = hidden.view();
  EXPECT_EQ(flashspec_draft(ctx, head, &h, &p, out.tokens.data(), out.scores.data()), FLASHSPEC_OK)
      << flashspec_context_last_error(ctx);
  return out;
}

DraftOut draft_top_k(flashspec_context* ctx, const flashspec_lm_head* head, const Matrix& hidden, int32_t k) {
  DraftOut out{std::vector<int32_t>(size_t(hidden.rows * k), -9), std::vector<float>(size_t(hidden.rows * k), kNaN)};
  const flashspec_tensor h = hidden.view();
  EXPECT_EQ(flashspec_draft_top_k(ctx, head, &h, nullptr, k, out.tokens.data(), out.scores.data()), FLASHSPEC_OK)
      << flashspec_context_last_error(ctx);
  return out;
}

// Two heads are the same function: greedy drafts (token and logit), sampled
// drafts (token and log q, which depends on every logit through the LSE)
// and top-k drafts (k tokens and log-probabilities) agree bit for bit.
void expect_same_head(flashspec_context* ctx, const flashspec_lm_head* a, const flashspec_lm_head* b,
                      const Matrix& hidden, const std::string& what) {
  for (float t : {0.0f, 0.7f}) {
    const DraftOut x = draft(ctx, a, hidden, t), y = draft(ctx, b, hidden, t);
    EXPECT_EQ(x.tokens, y.tokens) << what << " T " << t;
    for (size_t i = 0; i < x.scores.size(); ++i)
      ASSERT_TRUE(same_bits(x.scores[i], y.scores[i])) << what << " T " << t << " row " << i << ": " << x.scores[i]
                                                       << " vs " << y.scores[i];
  }
  const int32_t k = int32_t(std::min<int64_t>(16, flashspec_lm_head_vocab_size(a)));
  const DraftOut x = draft_top_k(ctx, a, hidden, k), y = draft_top_k(ctx, b, hidden, k);
  EXPECT_EQ(x.tokens, y.tokens) << what << " top-k";
  for (size_t i = 0; i < x.scores.size(); ++i)
    ASSERT_TRUE(same_bits(x.scores[i], y.scores[i])) << what << " top-k slot " << i;
}

// Whether tile_logits_avx2 runs on this CPU (it returns false, writing
// nothing, where it does not).
bool cpu_has_avx2_probe(std::vector<float>& probe) {
  return flashspec::cpu::tile_logits_avx2(flashspec::cpu::WeightRows{probe.data(), FLASHSPEC_DTYPE_F32, 1, nullptr}, 1,
                                          probe.data(), 1, 1, probe.data());
}

// ---------------------------------------------------------------------------

// Quantising bf16/fp16/fp32 weights gives the head of the codes and scales
// quantize_row computes (util/quantize.h, tested against flashspec.h's rule
// in test_dtype.cc). Rows with an all-zero row (scale 1), one non-zero
// element, and weights of very different magnitudes.
TEST(QuantizedHead, QuantisingEqualsPassingTheRulesCodesAndScales) {
  auto ctx = make_context(ContextOptions().cpu_threads(2));
  Rng rng(71);
  for (flashspec_dtype stored : {FLASHSPEC_DTYPE_E4M3, FLASHSPEC_DTYPE_I8})
    for (flashspec_dtype wt : {FLASHSPEC_DTYPE_F32, FLASHSPEC_DTYPE_BF16, FLASHSPEC_DTYPE_F16})
      for (int64_t V : {16, 300})
        for (int64_t d : {5, 40}) {
          Matrix w = random_matrix(wt, V, d, rng, 0.5);
          for (int64_t k = 0; k < d; ++k) w.set(2, k, 0.0);
          for (int64_t k = 0; k < d; ++k) w.set(4, k, k == d / 2 ? -3.0 : 0.0);
          for (int64_t k = 0; k < d; ++k) w.set(6, k, 1e-3 * rng.normal());
          for (int64_t k = 0; k < d; ++k) w.set(9, k, 300.0 * rng.normal());
          const Codes c = quantize_matrix(w, stored);
          EXPECT_EQ(c.scales[2], 1.0f);
          HeadPtr quantised = make_quantized(ctx.get(), w.view(), nullptr, stored);
          HeadPtr given = make_from_codes(ctx.get(), c);
          ASSERT_TRUE(quantised && given);
          EXPECT_EQ(flashspec_lm_head_dtype(quantised.get()), stored);
          Matrix hidden = random_matrix(FLASHSPEC_DTYPE_F32, 48, d, rng, 1.0);
          expect_same_head(ctx.get(), quantised.get(), given.get(), hidden,
                           std::string(stored_name(stored)) + " from " + dtype_name(wt) + " V " + std::to_string(V) +
                               " d " + std::to_string(d));
        }
}

// A greedy draft's token is the argmax of the float64 logits s_v Σ h_k q_vk
// and its score is that logit (within the fp32 error bound), for hidden rows
// in every dtype. Rows whose top two logits are within 1e-4 (relative) or
// within the error bound are skipped; few are.
TEST(QuantizedHead, GreedyDraftIsTheArgmaxOfTheDequantisedLogits) {
  auto ctx = make_context(ContextOptions().cpu_threads(3));
  Rng rng(72);
  for (flashspec_dtype stored : {FLASHSPEC_DTYPE_E4M3, FLASHSPEC_DTYPE_I8})
    for (int64_t d : {5, 64, 77}) {
      const Codes c = random_codes(stored, 700, d, rng);
      HeadPtr head = make_from_codes(ctx.get(), c);
      ASSERT_TRUE(head);
      for (flashspec_dtype ht : {FLASHSPEC_DTYPE_F32, FLASHSPEC_DTYPE_BF16, FLASHSPEC_DTYPE_F16}) {
        Matrix hidden = random_matrix(ht, 100, d, rng, 1.0);
        const DraftOut got = draft(ctx.get(), head.get(), hidden, 0.0f);
        int skipped = 0;
        for (int64_t r = 0; r < hidden.rows; ++r) {
          const ReferenceLogits ref = dequantised_logits(c, hidden, r);
          const int32_t best = argmax(ref.logit);
          const double gap = ref.logit[size_t(best)] - runner_up(ref.logit, best);
          if (gap <= 1e-4 * std::fabs(ref.logit[size_t(best)]) || gap <= 2 * ref.max_error) {
            ++skipped;
            continue;
          }
          EXPECT_EQ(got.tokens[size_t(r)], best) << stored_name(stored) << " d " << d << " hidden " << dtype_name(ht)
                                                 << " row " << r;
          EXPECT_NEAR(got.scores[size_t(r)], ref.logit[size_t(best)], ref.error_bound[size_t(best)])
              << stored_name(stored) << " d " << d << " row " << r;
        }
        EXPECT_LE(skipped, 5) << "too many rows with near-tied logits to test";
      }
    }
}

// Hidden rows whose float64 argmax is clear of the fp32 error bound, and
// their argmaxes.
Matrix clear_rows(const Codes& c, int64_t rows, Rng& rng, std::vector<int32_t>& argmaxes) {
  Matrix hidden(FLASHSPEC_DTYPE_F32, rows, c.cols);
  argmaxes.assign(size_t(rows), -1);
  for (int64_t r = 0; r < rows; ++r)
    for (;;) {
      for (int64_t k = 0; k < c.cols; ++k) hidden.set(r, k, rng.normal());
      const ReferenceLogits ref = dequantised_logits(c, hidden, r);
      const int32_t best = argmax(ref.logit);
      const double gap = ref.logit[size_t(best)] - runner_up(ref.logit, best);
      if (gap > 4 * ref.max_error && gap > 1e-4 * std::fabs(ref.logit[size_t(best)])) {
        argmaxes[size_t(r)] = best;
        break;
      }
    }
  return hidden;
}

// T = 0 verification accepts exactly the drafted prefix that matches the
// float64 argmaxes, then emits the argmax of the first mismatching row (or
// the bonus row's).
TEST(QuantizedHead, GreedyVerifyAcceptsTheArgmaxPrefix) {
  auto ctx = make_context(ContextOptions().cpu_threads(2));
  Rng rng(73);
  for (flashspec_dtype stored : {FLASHSPEC_DTYPE_E4M3, FLASHSPEC_DTYPE_I8}) {
    const Codes c = random_codes(stored, 500, 24, rng);
    HeadPtr head = make_from_codes(ctx.get(), c);
    ASSERT_TRUE(head);
    const int32_t V = int32_t(c.rows);
    for (int trial = 0; trial < 6; ++trial) {
      const std::vector<int> lengths = {0, 1, 2, 4, 7, 3, 5};
      int64_t rows = 0;
      for (int n : lengths) rows += n + 1;
      std::vector<int32_t> argmaxes;
      HostBatch hb;
      hb.hidden = clear_rows(c, rows, rng, argmaxes);
      std::vector<int32_t> mismatch;
      int64_t row = 0;
      for (int n : lengths) {
        const int32_t m = rng.below(n + 1);
        std::vector<int32_t> drafts(static_cast<size_t>(n));
        for (int j = 0; j < n; ++j) {
          const int32_t g = argmaxes[size_t(row + j)];
          drafts[size_t(j)] = j < m ? g : j == m ? (g + 1 + rng.below(V - 1)) % V : rng.below(V);
        }
        hb.drafts.push_back(drafts);
        mismatch.push_back(m);
        row += n + 1;
      }
      hb.temperatures.assign(lengths.size(), 0.0f);
      const Outcome got = verify_and_finalize(ctx.get(), head.get(), hb);
      for (size_t r = 0; r < lengths.size(); ++r) {
        const int32_t m = mismatch[r];
        EXPECT_EQ(got.accepted[r], m) << stored_name(stored) << " request " << r;
        std::vector<int32_t> expected(size_t(lengths[r]) + 1, -1);
        for (int32_t j = 0; j <= m; ++j) expected[size_t(j)] = argmaxes[size_t(hb.first_row(r) + j)];
        EXPECT_EQ(got.emitted[r], expected) << stored_name(stored) << " request " << r;
      }
    }
  }
}

// The AVX2 kernel gives the portable kernel's bits on codes with scales
// (every int8 code, every finite e4m3 code, zero scales), d a multiple of 8
// or not, strided rows; and the scale multiplies the finished sum: each
// logit is scale · (the same kernel's logit without scales), exactly.
TEST(QuantizedHead, Avx2KernelGivesThePortableKernelsBitsOnCodes) {
  std::vector<float> probe(1);
  const bool avx2 = cpu_has_avx2_probe(probe);
  Rng rng(74);
  for (flashspec_dtype stored : {FLASHSPEC_DTYPE_E4M3, FLASHSPEC_DTYPE_I8})
    for (int64_t d : {1, 7, 8, 13, 64, 515})
      for (int64_t pad : {0, 5})
        for (int64_t rows : {1, 3, 4, 7, 16})
          for (int64_t count : {1, 4, 9, 37}) {
            const Codes c = random_codes(stored, count, d, rng, d + pad);
            const flashspec::cpu::WeightRows w{c.codes.data(), stored, c.stride, c.scales.data()};
            const flashspec::cpu::WeightRows unscaled{c.codes.data(), stored, c.stride, nullptr};
            std::vector<float> hidden(size_t(rows * d));
            for (float& h : hidden) h = float(rng.normal());
            std::vector<float> fast(size_t(rows * count), kNaN), portable(size_t(rows * count), kNaN),
                plain(size_t(rows * count), kNaN);
            flashspec::cpu::tile_logits_portable(w, count, hidden.data(), rows, d, portable.data());
            flashspec::cpu::tile_logits_portable(unscaled, count, hidden.data(), rows, d, plain.data());
            const std::string what = std::string(stored_name(stored)) + " d " + std::to_string(d) + " stride " +
                                     std::to_string(d + pad) + " rows " + std::to_string(rows) + " count " +
                                     std::to_string(count);
            for (int64_t r = 0; r < rows; ++r)
              for (int64_t k = 0; k < count; ++k) {
                const size_t i = size_t(r * count + k);
                ASSERT_TRUE(same_bits(portable[i], plain[i] * c.scales[size_t(k)])) << what << " at " << i;
              }
            if (!avx2) continue;
            ASSERT_TRUE(flashspec::cpu::tile_logits_avx2(w, count, hidden.data(), rows, d, fast.data()));
            for (size_t i = 0; i < fast.size(); ++i)
              ASSERT_TRUE(same_bits(fast[i], portable[i]))
                  << what << " at " << i << ": " << fast[i] << " vs " << portable[i];
          }
  if (!avx2) GTEST_SKIP() << "this CPU lacks AVX2, FMA or F16C: only the portable kernel was checked";
}

// Codes with row_stride > cols (padding of NaN codes, never read), strided
// scales, and bf16/fp16/fp32 weights with row_stride > cols (NaN padding):
// the heads equal those of the contiguous inputs.
TEST(QuantizedHead, StridedInputsReadOnlyTheirRows) {
  auto ctx = make_context(ContextOptions().cpu_threads(2));
  Rng rng(75);
  const int64_t V = 300, d = 13, stride = 21;
  for (flashspec_dtype stored : {FLASHSPEC_DTYPE_E4M3, FLASHSPEC_DTYPE_I8}) {
    const Codes strided = random_codes(stored, V, d, rng, stride, 0x7f);
    Codes contiguous = strided;
    contiguous.stride = d;
    contiguous.codes.clear();
    for (int64_t v = 0; v < V; ++v)
      for (int64_t k = 0; k < d; ++k) contiguous.codes.push_back(strided.code(v, k));
    // Scales as a [V, 1] view with row_stride 3 (NaN between them).
    std::vector<float> spaced(size_t(V * 3), kNaN);
    for (int64_t v = 0; v < V; ++v) spaced[size_t(v * 3)] = strided.scales[size_t(v)];
    flashspec_tensor spaced_view = flashspec_tensor_make(spaced.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, V, 1);
    spaced_view.row_stride = 3;
    HeadPtr a = make_quantized(ctx.get(), strided.view(), &spaced_view, stored);
    HeadPtr b = make_from_codes(ctx.get(), contiguous);
    ASSERT_TRUE(a && b);
    Matrix hidden = random_matrix(FLASHSPEC_DTYPE_F32, 32, d, rng, 1.0);
    expect_same_head(ctx.get(), a.get(), b.get(), hidden, std::string(stored_name(stored)) + " strided codes");

    for (flashspec_dtype wt : {FLASHSPEC_DTYPE_F16, FLASHSPEC_DTYPE_BF16, FLASHSPEC_DTYPE_F32}) {
      Matrix padded = random_matrix(wt, V, d, rng, 0.5, stride);
      Matrix dense(wt, V, d);
      for (int64_t v = 0; v < V; ++v) dense.copy_row(v, padded, v);
      for (int64_t v = 0; v < V; ++v)
        for (int64_t k = d; k < stride; ++k) {
          if (wt == FLASHSPEC_DTYPE_F32) padded.f32[size_t(v * stride + k)] = kNaN;
          else padded.half[size_t(v * stride + k)] = wt == FLASHSPEC_DTYPE_BF16 ? 0x7fc0 : 0x7e00;
        }
      HeadPtr p = make_quantized(ctx.get(), padded.view(), nullptr, stored);
      HeadPtr q = make_quantized(ctx.get(), dense.view(), nullptr, stored);
      ASSERT_TRUE(p && q);
      expect_same_head(ctx.get(), p.get(), q.get(), hidden,
                       std::string(stored_name(stored)) + " from strided " + dtype_name(wt));
    }
  }
}

TEST(QuantizedHead, ReportsItsDtype) {
  auto ctx = make_context(ContextOptions().cpu_threads(1));
  Rng rng(76);
  EXPECT_EQ(flashspec_lm_head_dtype(nullptr), FLASHSPEC_DTYPE_F32);
  for (flashspec_dtype stored : {FLASHSPEC_DTYPE_E4M3, FLASHSPEC_DTYPE_I8}) {
    const Codes c = random_codes(stored, 20, 8, rng);
    HeadPtr from_codes = make_from_codes(ctx.get(), c);
    EXPECT_EQ(flashspec_lm_head_dtype(from_codes.get()), stored);
    for (flashspec_dtype wt : {FLASHSPEC_DTYPE_F32, FLASHSPEC_DTYPE_BF16, FLASHSPEC_DTYPE_F16}) {
      Matrix w = random_matrix(wt, 20, 8, rng, 1.0);
      HeadPtr quantised = make_quantized(ctx.get(), w.view(), nullptr, stored);
      EXPECT_EQ(flashspec_lm_head_dtype(quantised.get()), stored) << dtype_name(wt);
      EXPECT_EQ(flashspec_lm_head_vocab_size(quantised.get()), 20);
      EXPECT_EQ(flashspec_lm_head_hidden_size(quantised.get()), 8);
      HeadPtr plain = make_head(ctx.get(), w.view());
      EXPECT_EQ(flashspec_lm_head_dtype(plain.get()), wt) << dtype_name(wt);
    }
  }
}

// ---------------------------------------------------------------------------
// Bad input
// ---------------------------------------------------------------------------

template <class Enum>
void set_raw(Enum& field, int32_t value) {
  static_assert(sizeof(Enum) == sizeof(int32_t), "32-bit enums");
  std::memcpy(&field, &value, sizeof value);
}

void expect_failure(const std::string& name, flashspec_status got, flashspec_status want, const flashspec_context* ctx,
                    const char* argument) {
  EXPECT_EQ(got, want) << name << ": got " << flashspec_status_name(got) << ", want " << flashspec_status_name(want)
                       << " (message: " << flashspec_context_last_error(ctx) << ")";
  const std::string message = flashspec_context_last_error(ctx);
  EXPECT_NE(message.find(argument), std::string::npos)
      << name << ": message \"" << message << "\" does not name " << argument;
}

TEST(QuantizedHead, BadInput) {
  constexpr int64_t V = 40, d = 8;
  auto ctx = make_context(ContextOptions().cpu_threads(2));
  Rng rng(77);
  const Codes e4m3 = random_codes(FLASHSPEC_DTYPE_E4M3, V, d, rng);
  const Codes i8 = random_codes(FLASHSPEC_DTYPE_I8, V, d, rng);
  const Matrix f32 = random_matrix(FLASHSPEC_DTYPE_F32, V, d, rng, 1.0);
  const Matrix bf16 = random_matrix(FLASHSPEC_DTYPE_BF16, V, d, rng, 1.0);

  // One call's arguments; each case starts from valid e4m3 codes.
  struct Call {
    flashspec_context* ctx = nullptr;
    flashspec_tensor weight{}, scales{};
    bool null_weight = false, null_scales = false, null_out = false;
    flashspec_dtype stored = FLASHSPEC_DTYPE_E4M3;
    flashspec_lm_head_flags flags = FLASHSPEC_LM_HEAD_COPY;
    std::vector<uint8_t> codes;
    std::vector<float> scale_values, f32;
    std::vector<uint16_t> half;
  };
  struct Case {
    const char* name;
    flashspec_status status;
    const char* argument;
    std::function<void(Call&)> mutate;
  };
  auto use_float = [&](Call& c, const Matrix& m) {
    c.weight = m.view();
    c.null_scales = true;
  };
  const std::vector<Case> cases = {
      {"ctx NULL", FLASHSPEC_ERR_NULL_POINTER, "ctx", [](Call& c) { c.ctx = nullptr; }},
      {"out NULL", FLASHSPEC_ERR_NULL_POINTER, "out", [](Call& c) { c.null_out = true; }},
      {"weight NULL", FLASHSPEC_ERR_NULL_POINTER, "weight", [](Call& c) { c.null_weight = true; }},
      {"scales->data NULL", FLASHSPEC_ERR_NULL_POINTER, "scales", [](Call& c) { c.scales.data = nullptr; }},
      {"stored F32", FLASHSPEC_ERR_DTYPE_MISMATCH, "stored", [](Call& c) { c.stored = FLASHSPEC_DTYPE_F32; }},
      {"stored BF16", FLASHSPEC_ERR_DTYPE_MISMATCH, "stored", [](Call& c) { c.stored = FLASHSPEC_DTYPE_BF16; }},
      {"stored F16", FLASHSPEC_ERR_DTYPE_MISMATCH, "stored", [](Call& c) { c.stored = FLASHSPEC_DTYPE_F16; }},
      {"stored 5", FLASHSPEC_ERR_DTYPE_MISMATCH, "stored", [](Call& c) { set_raw(c.stored, 5); }},
      // (A negative value cannot be passed by value through the enum type
      // without undefined behaviour in C++; C callers can, and the check is
      // the same comparison.)
      {"stored FORCE_32BIT_", FLASHSPEC_ERR_DTYPE_MISMATCH, "stored",
       [](Call& c) { c.stored = FLASHSPEC_DTYPE_FORCE_32BIT_; }},
      {"e4m3 codes, stored I8", FLASHSPEC_ERR_DTYPE_MISMATCH, "weight",
       [](Call& c) { c.stored = FLASHSPEC_DTYPE_I8; }},
      {"int8 codes, stored E4M3", FLASHSPEC_ERR_DTYPE_MISMATCH, "weight",
       [](Call& c) { c.weight.dtype = FLASHSPEC_DTYPE_I8; }},
      {"weight dtype 5", FLASHSPEC_ERR_DTYPE_MISMATCH, "weight", [](Call& c) { set_raw(c.weight.dtype, 5); }},
      {"scales with f32 weights", FLASHSPEC_ERR_INVALID_ARGUMENT, "scales",
       [&](Call& c) { c.weight = f32.view(); }},
      {"scales with bf16 weights", FLASHSPEC_ERR_INVALID_ARGUMENT, "scales",
       [&](Call& c) { c.weight = bf16.view(); }},
      {"scales missing with e4m3 codes", FLASHSPEC_ERR_INVALID_ARGUMENT, "scales",
       [](Call& c) { c.null_scales = true; }},
      {"scales missing with int8 codes", FLASHSPEC_ERR_INVALID_ARGUMENT, "scales",
       [&](Call& c) { c.null_scales = true, c.weight = i8.view(), c.stored = FLASHSPEC_DTYPE_I8; }},
      {"scales bf16", FLASHSPEC_ERR_DTYPE_MISMATCH, "scales",
       [](Call& c) {
         c.half.assign(size_t(V), 0x3f80);
         c.scales.data = c.half.data(), c.scales.dtype = FLASHSPEC_DTYPE_BF16;
       }},
      {"scales int8", FLASHSPEC_ERR_DTYPE_MISMATCH, "scales", [](Call& c) { c.scales.dtype = FLASHSPEC_DTYPE_I8; }},
      {"scales [V, 2]", FLASHSPEC_ERR_INVALID_ARGUMENT, "scales",
       [](Call& c) {
         c.scale_values.resize(size_t(2 * V), 1.0f);
         c.scales.data = c.scale_values.data(), c.scales.cols = 2, c.scales.row_stride = 2;
       }},
      {"scales [V - 1, 1]", FLASHSPEC_ERR_INVALID_ARGUMENT, "scales", [](Call& c) { c.scales.rows = V - 1; }},
      {"scales [1, V]", FLASHSPEC_ERR_INVALID_ARGUMENT, "scales",
       [](Call& c) { c.scales.rows = 1, c.scales.cols = V, c.scales.row_stride = V; }},
      {"scale negative", FLASHSPEC_ERR_NON_FINITE, "scales", [](Call& c) { c.scale_values[5] = -0.25f; }},
      {"scale least negative", FLASHSPEC_ERR_NON_FINITE, "scales",
       [](Call& c) { c.scale_values[0] = -std::numeric_limits<float>::denorm_min(); }},
      {"scale NaN", FLASHSPEC_ERR_NON_FINITE, "scales", [](Call& c) { c.scale_values[V - 1] = kNaN; }},
      {"scale +Inf", FLASHSPEC_ERR_NON_FINITE, "scales", [](Call& c) { c.scale_values[17] = kInf; }},
      {"scale -Inf", FLASHSPEC_ERR_NON_FINITE, "scales", [](Call& c) { c.scale_values[1] = -kInf; }},
      {"e4m3 NaN code 0x7f", FLASHSPEC_ERR_NON_FINITE, "weight", [](Call& c) { c.codes[3 * d + 2] = 0x7f; }},
      {"e4m3 NaN code 0xff in the last row", FLASHSPEC_ERR_NON_FINITE, "weight",
       [](Call& c) { c.codes[(V - 1) * d + d - 1] = 0xff; }},
      {"NaN in f32 weights", FLASHSPEC_ERR_NON_FINITE, "weight",
       [&](Call& c) {
         use_float(c, f32);
         c.f32 = f32.f32;
         c.f32[size_t(11 * d + 4)] = kNaN;
         c.weight.data = c.f32.data();
       }},
      {"Inf in f32 weights", FLASHSPEC_ERR_NON_FINITE, "weight",
       [&](Call& c) {
         use_float(c, f32);
         c.f32 = f32.f32;
         c.f32[0] = -kInf;
         c.weight.data = c.f32.data();
       }},
      {"NaN in bf16 weights", FLASHSPEC_ERR_NON_FINITE, "weight",
       [&](Call& c) {
         use_float(c, bf16);
         c.half = bf16.half;
         c.half[size_t(V * d - 1)] = 0x7fc0;
         c.weight.data = c.half.data();
       }},
      {"BORROW with f32 weights", FLASHSPEC_ERR_INVALID_ARGUMENT, "flags",
       [&](Call& c) { use_float(c, f32), c.flags = FLASHSPEC_LM_HEAD_BORROW; }},
      {"BORROW of codes on the CPU backend", FLASHSPEC_ERR_DEVICE_MISMATCH, "flags",
       [](Call& c) { c.flags = FLASHSPEC_LM_HEAD_BORROW; }},
      {"flags 2", FLASHSPEC_ERR_INVALID_ARGUMENT, "flags", [](Call& c) { c.flags = flashspec_lm_head_flags(2); }},
      {"codes in device memory on the CPU backend", FLASHSPEC_ERR_DEVICE_MISMATCH, "weight",
       [](Call& c) { c.weight.memory = FLASHSPEC_MEMORY_CUDA, c.scales.memory = FLASHSPEC_MEMORY_CUDA; }},
      {"f32 weights in device memory on the CPU backend", FLASHSPEC_ERR_DEVICE_MISMATCH, "weight",
       [&](Call& c) { use_float(c, f32), c.weight.memory = FLASHSPEC_MEMORY_CUDA; }},
      {"scales in device memory, codes in host memory", FLASHSPEC_ERR_DEVICE_MISMATCH, "scales",
       [](Call& c) { c.scales.memory = FLASHSPEC_MEMORY_CUDA; }},
      {"weight rows 0", FLASHSPEC_ERR_OUT_OF_RANGE, "weight", [](Call& c) { c.weight.rows = 0; }},
      {"weight row_stride < cols", FLASHSPEC_ERR_OUT_OF_RANGE, "weight", [](Call& c) { c.weight.row_stride = d - 1; }},
  };
  auto fresh = [&] {
    Call c;
    c.ctx = ctx.get();
    c.codes = e4m3.codes;
    c.scale_values = e4m3.scales;
    c.weight = flashspec_tensor_make(nullptr, FLASHSPEC_DTYPE_E4M3, FLASHSPEC_MEMORY_HOST, V, d);
    c.scales = flashspec_tensor_make(nullptr, FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, V, 1);
    return c;
  };
  auto call = [](Call& c, flashspec_lm_head** out) {
    if (c.weight.data == nullptr && !c.null_weight) c.weight.data = c.codes.data();
    return flashspec_lm_head_create_quantized(c.ctx, c.null_weight ? nullptr : &c.weight,
                                              c.null_scales ? nullptr : &c.scales, c.stored, c.flags,
                                              c.null_out ? nullptr : out);
  };
  {
    // The unmutated call succeeds, so each failure below is its mutation's.
    Call c = fresh();
    c.weight.data = c.codes.data();
    c.scales.data = c.scale_values.data();
    flashspec_lm_head* out = nullptr;
    ASSERT_EQ(call(c, &out), FLASHSPEC_OK) << flashspec_context_last_error(ctx.get());
    flashspec_lm_head_destroy(out);
  }
  for (const Case& k : cases) {
    Call c = fresh();
    c.weight.data = c.codes.data();
    c.scales.data = c.scale_values.data();
    k.mutate(c);
    flashspec_lm_head* out = reinterpret_cast<flashspec_lm_head*>(uintptr_t(kPoison));
    const flashspec_status s = call(c, &out);
    expect_failure(k.name, s, k.status, c.ctx, k.argument);
    EXPECT_EQ(out, reinterpret_cast<flashspec_lm_head*>(uintptr_t(kPoison))) << k.name << ": *out was written";
  }
  // Valid edge cases: scale 0 and -0, int8 code -128, the largest e4m3
  // codes, and NaN codes in the padding past cols.
  {
    Codes c = random_codes(FLASHSPEC_DTYPE_I8, V, d, rng, d + 3, 0x80);
    c.scales[0] = 0.0f;
    c.scales[1] = -0.0f;
    c.codes[0] = 0x80;
    HeadPtr head = make_from_codes(ctx.get(), c);
    EXPECT_TRUE(head);
    Codes e = random_codes(FLASHSPEC_DTYPE_E4M3, V, d, rng, d + 3, 0x7f);
    e.codes[0] = 0x7e, e.codes[1] = 0xfe;
    HeadPtr e_head = make_from_codes(ctx.get(), e);
    EXPECT_TRUE(e_head);
  }
}

// 8-bit dtypes are for flashspec_lm_head_create_quantized only: the other
// calls refuse them as any tensor's dtype.
TEST(QuantizedHead, OrdinaryCallsRefuseEightBitDtypes) {
  constexpr int64_t V = 40, d = 8;
  auto ctx = make_context(ContextOptions().cpu_threads(2));
  Rng rng(78);
  const Codes codes = random_codes(FLASHSPEC_DTYPE_I8, V, d, rng);
  Matrix w = random_matrix(FLASHSPEC_DTYPE_F32, V, d, rng, 1.0);
  HeadPtr head = make_head(ctx.get(), w.view());
  ASSERT_TRUE(head);
  for (flashspec_dtype t : {FLASHSPEC_DTYPE_E4M3, FLASHSPEC_DTYPE_I8}) {
    const std::string name = stored_name(t);
    flashspec_tensor as_weight = codes.view();
    as_weight.dtype = t;
    flashspec_lm_head* out = reinterpret_cast<flashspec_lm_head*>(uintptr_t(kPoison));
    expect_failure("lm_head_create " + name, flashspec_lm_head_create(ctx.get(), &as_weight, FLASHSPEC_LM_HEAD_COPY, &out),
                   FLASHSPEC_ERR_DTYPE_MISMATCH, ctx.get(), "weight");
    EXPECT_EQ(out, reinterpret_cast<flashspec_lm_head*>(uintptr_t(kPoison)));
    expect_failure("lm_head_create_shard " + name,
                   flashspec_lm_head_create_shard(ctx.get(), &as_weight, FLASHSPEC_LM_HEAD_COPY, 0, V, &out),
                   FLASHSPEC_ERR_DTYPE_MISMATCH, ctx.get(), "weight");
    EXPECT_EQ(out, reinterpret_cast<flashspec_lm_head*>(uintptr_t(kPoison)));

    std::vector<uint8_t> hidden_codes(size_t(2 * d), 0x38);
    const flashspec_tensor hidden = flashspec_tensor_make(hidden_codes.data(), t, FLASHSPEC_MEMORY_HOST, 2, d);
    std::vector<int32_t> tokens(2, kPoison);
    std::vector<float> scores(2, 7.0f);
    expect_failure("draft hidden " + name,
                   flashspec_draft(ctx.get(), head.get(), &hidden, nullptr, tokens.data(), scores.data()),
                   FLASHSPEC_ERR_DTYPE_MISMATCH, ctx.get(), "hidden");
    EXPECT_EQ(tokens, std::vector<int32_t>(2, kPoison));
    EXPECT_EQ(scores, std::vector<float>(2, 7.0f));
    expect_failure("draft_top_k hidden " + name,
                   flashspec_draft_top_k(ctx.get(), head.get(), &hidden, nullptr, 1, tokens.data(), scores.data()),
                   FLASHSPEC_ERR_DTYPE_MISMATCH, ctx.get(), "hidden");
    EXPECT_EQ(tokens, std::vector<int32_t>(2, kPoison));

    // verify: 8-bit target_hidden, and 8-bit draft_logits.
    HostBatch hb;
    hb.drafts = {{1}};
    hb.hidden = random_matrix(FLASHSPEC_DTYPE_F32, 2, d, rng, 1.0);
    flashspec_verify_batch b = hb.view();
    b.target_hidden = &hidden;
    std::vector<int32_t> accepted(1, kPoison), emitted(2, kPoison);
    flashspec_verify_result res;
    flashspec_verify_result_init(&res);
    res.accepted_counts = accepted.data();
    res.emitted_tokens = emitted.data();
    expect_failure("verify target_hidden " + name, flashspec_verify_and_finalize(ctx.get(), head.get(), &b, &res),
                   FLASHSPEC_ERR_DTYPE_MISMATCH, ctx.get(), "target_hidden");
    b = hb.view();
    std::vector<uint8_t> logit_codes(size_t(V), 0x38);
    const flashspec_tensor draft_logits = flashspec_tensor_make(logit_codes.data(), t, FLASHSPEC_MEMORY_HOST, 1, V);
    b.draft_logits = &draft_logits;
    expect_failure("verify draft_logits " + name, flashspec_verify_and_finalize(ctx.get(), head.get(), &b, &res),
                   FLASHSPEC_ERR_DTYPE_MISMATCH, ctx.get(), "draft_logits");
    EXPECT_EQ(accepted, std::vector<int32_t>(1, kPoison));
    EXPECT_EQ(emitted, std::vector<int32_t>(2, kPoison));
  }
}

}  // namespace
