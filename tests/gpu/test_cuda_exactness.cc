// Exactness on the CUDA backend: the first emitted token of a verify is
// distributed as the target p itself (Algorithm 1), for a greedy draft, a
// stochastic draft and the bonus position. Pearson chi-square against p at
// α = 0.001 with fixed seeds; each test also shows its power by rejecting,
// with the same samples, the distribution a known-wrong sampler would give.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "gpu_support.h"
#include "sampling/gumbel_bounds.h"
#include "testing.h"

using namespace fstest;

namespace {

constexpr int kVocab = 12;
constexpr int kRequests = 512;
constexpr int kCalls = 48;
constexpr double kAlpha = 1e-3;

std::vector<double> softmax(const std::vector<double>& z, double t) {
  std::vector<double> p(z.size());
  double m = -1e300, s = 0.0;
  for (double v : z) m = std::max(m, v / t);
  for (size_t i = 0; i < z.size(); ++i) s += p[i] = std::exp(z[i] / t - m);
  for (double& v : p) v /= s;
  return p;
}

struct Scenario {
  std::vector<double> target_logits;  // exactly representable in fp32
  double temperature;
  int drafts;              // 0 (bonus only) or 1
  int drafted = -1;        // greedy draft token, or −1 for stochastic drafts
  std::vector<double> q_logits;  // stochastic drafts
  double draft_temperature = 1.0;
};

// Runs kCalls verify calls of kRequests requests each (distinct request ids)
// and counts the first emitted token.
std::vector<long> sample(const Scenario& s) {
  std::vector<long> counts(kVocab, 0);
  auto ctx = make_context(ContextOptions(FLASHSPEC_BACKEND_CUDA).seed(2024).max_rows(2 * kRequests));
  EXPECT_TRUE(ctx);
  if (!ctx) return counts;
  // W = identity, so a hidden row equal to the logits gives those logits.
  Matrix w(FLASHSPEC_DTYPE_F32, kVocab, kVocab);
  for (int i = 0; i < kVocab; ++i)
    for (int j = 0; j < kVocab; ++j) w.set(i, j, i == j ? 1.0f : 0.0f);
  auto head = make_head(ctx.get(), w.view(), FLASHSPEC_LM_HEAD_COPY);
  const int rows_per = s.drafts + 1, rows = kRequests * rows_per;
  Matrix h(FLASHSPEC_DTYPE_F32, rows, kVocab);
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < kVocab; ++j) h.set(r, j, float(s.target_logits[size_t(j)]));
  std::vector<int32_t> offsets(kRequests + 1);
  for (int r = 0; r <= kRequests; ++r) offsets[size_t(r)] = r * s.drafts;
  std::vector<float> temps(kRequests, float(s.temperature)), dtemps(kRequests, float(s.draft_temperature));
  Matrix q(FLASHSPEC_DTYPE_F32, std::max(1, kRequests * s.drafts), kVocab);
  std::vector<double> qp = s.q_logits.empty() ? std::vector<double>() : softmax(s.q_logits, s.draft_temperature);
  for (int k = 0; k < kRequests * s.drafts; ++k)
    for (int j = 0; j < kVocab; ++j) q.set(k, j, s.q_logits.empty() ? 0.0f : float(s.q_logits[size_t(j)]));
  Rng rng(77);
  DevMatrix hd(h), qd(q);
  flashspec_tensor hv = hd.view(), qv = qd.view();
  Dev<int32_t> d_off(offsets), d_tok(std::max(1, kRequests * s.drafts)), d_acc(kRequests), d_emit(static_cast<size_t>(rows));
  Dev<float> d_temps(temps), d_dtemps(dtemps);
  Dev<uint64_t> d_ids(kRequests);
  for (int call = 0; call < kCalls; ++call) {
    std::vector<int32_t> tokens(size_t(std::max(1, kRequests * s.drafts)), std::max(0, s.drafted));
    if (s.drafted < 0 && s.drafts > 0)
      for (auto& x : tokens) {  // x ~ q
        double u = rng.uniform(), acc = 0.0;
        for (x = 0; x < kVocab - 1; ++x)
          if ((acc += qp[size_t(x)]) >= u) break;
      }
    std::vector<uint64_t> ids(kRequests);
    for (int r = 0; r < kRequests; ++r) ids[size_t(r)] = uint64_t(call) * kRequests + uint64_t(r);
    d_tok.put(tokens);
    d_ids.put(ids);
    flashspec_verify_batch b;
    flashspec_verify_batch_init(&b);
    b.memory = FLASHSPEC_MEMORY_CUDA;
    b.num_requests = kRequests;
    b.draft_offsets = d_off.ptr();
    b.draft_tokens = d_tok.ptr();
    b.target_hidden = &hv;
    b.draft_logits = s.drafted < 0 && s.drafts > 0 ? &qv : nullptr;
    b.temperatures = d_temps.ptr();
    b.draft_temperatures = b.draft_logits ? d_dtemps.ptr() : nullptr;
    b.request_ids = d_ids.ptr();
    b.max_draft_len = 1;
    flashspec_verify_result res;
    flashspec_verify_result_init(&res);
    res.memory = FLASHSPEC_MEMORY_CUDA;
    res.accepted_counts = d_acc.ptr();
    res.emitted_tokens = d_emit.ptr();
    flashspec_status st = flashspec_verify_and_finalize(ctx.get(), head.get(), &b, &res);
    EXPECT_EQ(st, FLASHSPEC_OK) << flashspec_context_last_error(ctx.get());
    if (st != FLASHSPEC_OK) return counts;
    std::vector<int32_t> emit = d_emit.get();
    for (int r = 0; r < kRequests; ++r) {
      int32_t tok = emit[size_t(r * rows_per)];
      EXPECT_GE(tok, 0);
      if (tok >= 0 && tok < kVocab) ++counts[size_t(tok)];
    }
  }
  return counts;
}

void check(const char* name, const Scenario& s, const std::vector<double>& wrong) {
  std::vector<long> counts = sample(s);
  std::vector<double> p = softmax(s.target_logits, s.temperature);
  const double p_right = chi_square_p(counts, p), p_wrong = chi_square_p(counts, wrong);
  std::printf("[ exact  ] %s: chi-square p-value %.4g against the target, %.3g against a wrong sampler's law\n", name,
              p_right, p_wrong);
  EXPECT_GT(p_right, kAlpha) << name << ": emitted tokens are not distributed as the target";
  EXPECT_LT(p_wrong, kAlpha) << name << ": the test cannot tell a wrong sampler apart (no power)";
}

class GpuExactness : public ::testing::Test {
 protected:
  void SetUp() override { FSGPU_SKIP_WITHOUT_DEVICE(); }
};

const std::vector<double> kLogits = {1.0, 0.5, 2.0, -1.0, 0.0, 1.5, -0.5, 0.25, -2.0, 0.75, 1.25, -0.25};

TEST_F(GpuExactness, GreedyDraftFirstToken) {
  Scenario s{kLogits, 1.0, 1, 5, {}, 1.0};
  // Wrong sampler: on rejection, resample from p instead of the residual.
  std::vector<double> p = softmax(kLogits, 1.0), wrong(p.size());
  for (size_t i = 0; i < p.size(); ++i) wrong[i] = (i == 5 ? p[5] : 0.0) + (1 - p[5]) * p[i];
  check("greedy draft, T=1", s, wrong);
}

TEST_F(GpuExactness, StochasticDraftFirstToken) {
  std::vector<double> z = {0.5, 1.5, 0.0, 1.0, -0.5, 2.0, 0.25, -1.0, 0.75, 0.0, -0.25, 1.0};
  Scenario s{kLogits, 0.8, 1, -1, z, 1.25};
  // Wrong sampler: accept with min(1, p/q) but resample from p.
  std::vector<double> p = softmax(kLogits, 0.8), q = softmax(z, 1.25), wrong(p.size());
  double beta = 0.0;
  for (size_t i = 0; i < p.size(); ++i) beta += std::min(p[i], q[i]);
  for (size_t i = 0; i < p.size(); ++i) wrong[i] = std::min(p[i], q[i]) + (1 - beta) * p[i];
  check("stochastic draft, T=0.8, T_d=1.25", s, wrong);
}

TEST_F(GpuExactness, BonusToken) {
  Scenario s{kLogits, 1.3, 0, -1, {}, 1.0};
  std::vector<double> wrong = softmax(kLogits, 1.0);  // temperature ignored
  check("bonus token, T=1.3", s, wrong);
}

// The many-row scan's fold gives no noise to a token whose scaled logit plus
// its RNG word's bucket bound (sampling/gumbel_bounds.h) cannot place; that
// is exact only if the device's noise never exceeds the bound. Every 32-bit
// word is checked, and the closest one keeps most of the bounds' margin of
// at least 1e-3 (the float evaluation errs by about 1e-5).
TEST_F(GpuExactness, GumbelBucketBoundsHoldForEveryWordOnTheDevice) {
  uint64_t violations = 0;
  float closest = 0.0f;
  ASSERT_TRUE(flashspec::cuda::check_gumbel_bounds(flashspec::gumbel_bucket_bounds().data(), &violations, &closest));
  EXPECT_EQ(violations, 0u);
  EXPECT_GT(closest, 5e-4f);
  std::printf("[   INFO   ] closest bound − noise over all 2^32 words: %.6g\n", double(closest));
}

// Every e4m3 code but the NaNs (which a head never holds) and every int8
// code converts on the device, to bf16 and to f16 as the scans multiply
// them, to exactly the value the CPU backend reads (util/dtype.h), signed
// zeros and subnormals included.
TEST_F(GpuExactness, EveryCodeConvertsExactly) {
  for (flashspec_dtype dtype : {FLASHSPEC_DTYPE_E4M3, FLASHSPEC_DTYPE_I8}) {
    float as_bf16[256], as_f16[256];
    ASSERT_TRUE(flashspec::cuda::convert_every_code(dtype, as_bf16, as_f16));
    for (int c = 0; c < 256; ++c) {
      if (dtype == FLASHSPEC_DTYPE_E4M3 && (c & 0x7f) == 0x7f) continue;
      const uint8_t code = uint8_t(c);
      const float expected = flashspec::load_as_float(&code, dtype, 0);
      for (float got : {as_bf16[c], as_f16[c]}) {
        EXPECT_EQ(got, expected) << "dtype " << int(dtype) << " code " << c;
        EXPECT_EQ(std::signbit(got), std::signbit(expected)) << "dtype " << int(dtype) << " code " << c;
      }
    }
  }
}

}  // namespace
