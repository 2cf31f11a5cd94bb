// Sampled drafts (T > 0): the online log-sum-exp of the tiled pass gives
// log q(x) = l_x/T − LSE(l/T) as a float64 computation would, for fp32,
// bf16 and fp16 weights, without overflow for logits far beyond exp's
// range; and the token is the Gumbel-max under the contract's noise.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "sampling/fold.h"
#include "support.h"
#include "util/philox.h"

namespace {

using namespace fstest;

struct Sampled {
  std::vector<int32_t> tokens;
  std::vector<float> logq;
};

Sampled sampled_draft(flashspec_context* ctx, flashspec_lm_head* head, const Matrix& hidden, float temperature,
                      flashspec_status expected = FLASHSPEC_OK) {
  Sampled out;
  out.tokens.assign(size_t(hidden.rows), -7);
  out.logq.assign(size_t(hidden.rows), NAN);
  flashspec_draft_params p;
  flashspec_draft_params_init(&p);
  p.temperature = temperature;
  flashspec_tensor h = hidden.view();
  flashspec_status s = flashspec_draft(ctx, head, &h, &p, out.tokens.data(), out.logq.data());
  EXPECT_EQ(s, expected) << flashspec_context_last_error(ctx);
  return out;
}

// Bound on |fp32 log q − exact log q|: each logit is off by at most
// max_error (fp32 accumulation, see support.h), which moves l_x/T and, LSE
// being 1-Lipschitz in the max norm, LSE(l/T) by max_error/T each; scaling
// by 1/T, the float LSE and the final subtraction add a few roundings at
// the scale of the largest |l/T|.
double logq_tolerance(const ReferenceLogits& ref, double temperature, double lse) {
  double max_scaled = 0.0;
  for (double l : ref.logit) max_scaled = std::max(max_scaled, std::fabs(l / temperature));
  return 2.0 * ref.max_error / temperature + 16.0 * std::ldexp(1.0, -24) * (max_scaled + std::fabs(lse) + 1.0);
}

TEST(OnlineLse, LogQMatchesFloat64ReferenceForEveryDtype) {
  auto ctx = make_context(ContextOptions().cpu_threads(2).seed(99));
  Rng rng(21);
  for (flashspec_dtype wt : {FLASHSPEC_DTYPE_F32, FLASHSPEC_DTYPE_BF16, FLASHSPEC_DTYPE_F16})
    for (int64_t V : {1, 200, 1000, 2049})
      for (float T : {0.25f, 0.5f, 1.0f, 2.0f}) {
        const int64_t d = 48;
        Matrix w = random_matrix(wt, V, d, rng, 0.4);
        Matrix hidden = random_matrix(wt, 6, d, rng, 1.0);
        HeadPtr head = make_head(ctx.get(), w.view());
        Sampled got = sampled_draft(ctx.get(), head.get(), hidden, T);
        for (int64_t r = 0; r < hidden.rows; ++r) {
          ReferenceLogits ref = reference_logits(w, hidden, r);
          const int32_t x = got.tokens[size_t(r)];
          ASSERT_GE(x, 0);
          ASSERT_LT(x, V);
          const double lse = log_sum_exp(ref.logit, 1.0 / double(T));
          const double expected = ref.logit[size_t(x)] / double(T) - lse;
          const double tol = logq_tolerance(ref, T, lse);
          EXPECT_NEAR(got.logq[size_t(r)], expected, tol)
              << dtype_name(wt) << " V " << V << " T " << T << " row " << r;
          EXPECT_LE(got.logq[size_t(r)], tol);  // a log-probability
          if (V == 1) {
            EXPECT_EQ(got.logq[size_t(r)], 0.0f);
          }
        }
      }
}

TEST(OnlineLse, HugeLogitsDoNotOverflow) {
  // Logits up to ±1000: l/T reaches ±4000 at T = 0.25, far past where exp
  // overflows in fp32 (88) or fp64 (709). Only a running max keeps it finite.
  auto ctx = make_context(ContextOptions().cpu_threads(2).seed(5));
  Rng rng(22);
  const int64_t V = 777, d = 16;
  for (float T : {0.25f, 1.0f, 4.0f}) {
    Matrix w = random_matrix(FLASHSPEC_DTYPE_F32, V, d, rng, 1.0);
    Matrix hidden(FLASHSPEC_DTYPE_F32, 4, d);
    for (int64_t r = 0; r < 4; ++r) {
      Matrix dir = random_matrix(FLASHSPEC_DTYPE_F32, 1, d, rng, 1.0);
      // Scale so the largest |logit| is 80/T · k for growing k.
      double m = 0.0;
      for (int64_t v = 0; v < V; ++v) {
        double l = 0.0;
        for (int64_t c = 0; c < d; ++c) l += w.at(v, c) * dir.at(0, c);
        m = std::max(m, std::fabs(l));
      }
      const double target = (80.0 / T) * double(1 + 3 * r);
      for (int64_t c = 0; c < d; ++c) hidden.set(r, c, dir.at(0, c) * target / m);
    }
    HeadPtr head = make_head(ctx.get(), w.view());
    Sampled got = sampled_draft(ctx.get(), head.get(), hidden, T);
    for (int64_t r = 0; r < 4; ++r) {
      ReferenceLogits ref = reference_logits(w, hidden, r);
      const int32_t x = got.tokens[size_t(r)];
      ASSERT_TRUE(std::isfinite(got.logq[size_t(r)])) << "T " << T << " row " << r;
      const double lse = log_sum_exp(ref.logit, 1.0 / double(T));
      EXPECT_TRUE(std::isfinite(lse));
      EXPECT_NEAR(got.logq[size_t(r)], ref.logit[size_t(x)] / T - lse, logq_tolerance(ref, T, lse))
          << "T " << T << " row " << r;
    }
  }
}

TEST(OnlineLse, SampledTokenIsTheGumbelMaxOfTheContractNoise) {
  // Draft with NULL arrays: seed = the context's, request id = row index,
  // step 0, position 0, purpose DRAFT_NOISE. Recompute the Gumbel-max in
  // float64 from the contract; near-ties (score gap within the fp32 error
  // of l/T plus the float Gumbel transform) may go either way.
  const uint64_t seed = 0x5eed5eedull;
  auto ctx = make_context(ContextOptions().cpu_threads(3).seed(seed));
  Rng rng(23);
  const int64_t V = 1500, d = 32;
  int exact = 0;
  for (flashspec_dtype wt : {FLASHSPEC_DTYPE_F32, FLASHSPEC_DTYPE_BF16})
    for (float T : {0.5f, 1.0f, 3.0f}) {
      Matrix w = random_matrix(wt, V, d, rng, 0.3);
      Matrix hidden = random_matrix(FLASHSPEC_DTYPE_F32, 8, d, rng, 1.0);
      HeadPtr head = make_head(ctx.get(), w.view());
      Sampled got = sampled_draft(ctx.get(), head.get(), hidden, T);
      for (int64_t r = 0; r < hidden.rows; ++r) {
        ReferenceLogits ref = reference_logits(w, hidden, r);
        flashspec::RngRowKey key = flashspec::make_row_key(seed, uint64_t(r), 0, 0, FLASHSPEC_RNG_DRAFT_NOISE);
        std::vector<double> score(static_cast<size_t>(V));
        for (int64_t v = 0; v < V; ++v)
          score[size_t(v)] = ref.logit[size_t(v)] / T + flashspec::gumbel_from_bits(flashspec::row_word(key, int32_t(v)));
        const int32_t best = argmax(score);
        const double slack = 2.0 * (ref.max_error / T + 1e-5 * (std::fabs(score[size_t(best)]) + 1.0));
        if (score[size_t(best)] - runner_up(score, best) > slack) {
          EXPECT_EQ(got.tokens[size_t(r)], best) << dtype_name(wt) << " T " << T << " row " << r;
          ++exact;
        } else {
          EXPECT_GE(score[size_t(got.tokens[size_t(r)])], score[size_t(best)] - slack);
        }
      }
    }
  EXPECT_GT(exact, 40);
}

TEST(OnlineLse, TemperatureTooSmallForTheLogitsIsReportedNotNaN) {
  // |l|/T beyond the fp32 range: l/T would be ±Inf, and Inf − Inf turns the
  // log-sum-exp into NaN. The pass must refuse the row rather than return a
  // NaN log q or a token chosen among infinities.
  auto ctx = make_context(ContextOptions().cpu_threads(2));
  Rng rng(24);
  Matrix w = random_matrix(FLASHSPEC_DTYPE_F32, 300, 8, rng, 1.0);
  Matrix hidden = random_matrix(FLASHSPEC_DTYPE_F32, 2, 8, rng, 10.0);
  HeadPtr head = make_head(ctx.get(), w.view());
  for (float T : {1e-38f, 1e-40f /* subnormal: 1/T is Inf */}) {
    Sampled got = sampled_draft(ctx.get(), head.get(), hidden, T, FLASHSPEC_ERR_NON_FINITE);
    EXPECT_EQ(got.tokens[0], -7) << "outputs must stay untouched";
    EXPECT_TRUE(std::isnan(got.logq[0]));
    EXPECT_NE(std::string(flashspec_context_last_error(ctx.get())).find("temperature"), std::string::npos)
        << flashspec_context_last_error(ctx.get());
  }
  // A small but representable l/T is fine: the argmax gets log q ≈ 0.
  Sampled ok = sampled_draft(ctx.get(), head.get(), hidden, 1e-6f);
  for (int r = 0; r < 2; ++r) {
    ReferenceLogits ref = reference_logits(w, hidden, r);
    EXPECT_EQ(ok.tokens[size_t(r)], argmax(ref.logit));
    EXPECT_TRUE(std::isfinite(ok.logq[size_t(r)]));
  }
}

// lse_merge and merge_partial take selects rather than branches (a chain of
// merges on the GPU waited on each branch in turn); the result must be the
// branching form's, bit for bit, over empty, equal, larger and smaller
// operands and ties between winners.
TEST(OnlineLse, MergesGiveTheBranchingFormsBits) {
  using flashspec::Partial;
  auto branching_lse = [](float& m, float& s, float bm, float bs) {
    if (bm > m) {
      s = s * std::exp(m - bm) + bs;
      m = bm;
    } else if (bm != -INFINITY) {
      s += bs * std::exp(bm - m);
    }
  };
  auto branching_merge = [&](Partial& a, const Partial& b) {
    branching_lse(a.m, a.s, b.m, b.s);
    if (b.flags & flashspec::kPartialTracked) a.tracked = b.tracked;
    a.flags |= b.flags;
    const bool b_wins =
        b.token >= 0 && (a.token < 0 || b.best > a.best || (b.best == a.best && b.token < a.token));
    if (b_wins) {
      a.second = std::fmax(a.best, b.second);
      a.best = b.best;
      a.best_scaled = b.best_scaled;
      a.token = b.token;
    } else {
      a.second = std::fmax(a.second, b.best);
    }
  };
  auto bits = [](float v) {
    uint32_t u;
    std::memcpy(&u, &v, sizeof u);
    return u;
  };
  const float maxima[] = {-INFINITY, -3.5f, 0.0f, 0.25f, 7.0f, 1e30f};
  const float scores[] = {-INFINITY, -1.0f, 2.0f, 2.0f, 5.5f};
  const int32_t tokens[] = {-1, 3, 17};
  std::vector<Partial> partials;
  for (float m : maxima)
    for (float best : scores)
      for (int32_t token : tokens) {
        Partial p = flashspec::empty_partial();
        if (m != -INFINITY) {
          p.m = m;
          p.s = 1.0f + 0.375f * float(partials.size() % 7);
        }
        if (token >= 0) {
          p.token = token;
          p.best = best;
          p.best_scaled = best - 0.5f;
          p.second = best - 1.25f;
        }
        p.tracked = float(partials.size());
        p.flags = int32_t(partials.size() % 3 == 0 ? flashspec::kPartialTracked : 0);
        partials.push_back(p);
      }
  for (const Partial& a0 : partials)
    for (const Partial& b : partials) {
      Partial got = a0, want = a0;
      flashspec::merge_partial(got, b);
      branching_merge(want, b);
      ASSERT_EQ(bits(got.m), bits(want.m));
      ASSERT_EQ(bits(got.s), bits(want.s)) << a0.m << " " << a0.s << " ∪ " << b.m << " " << b.s;
      ASSERT_EQ(bits(got.best), bits(want.best));
      ASSERT_EQ(bits(got.best_scaled), bits(want.best_scaled));
      ASSERT_EQ(got.token, want.token);
      ASSERT_EQ(bits(got.second), bits(want.second));
      ASSERT_EQ(bits(got.tracked), bits(want.tracked));
      ASSERT_EQ(got.flags, want.flags);
    }
}

}  // namespace
