// Greedy drafts (T = 0): the token is argmax l with ties going to the
// smallest id, including ties inside a CPU tile and across tile boundaries
// (256 tokens), and the reported logit is l_x within fp32 accumulation error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "support.h"

namespace {

using namespace fstest;

struct Drafted {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
};

Drafted greedy_draft(flashspec_context* ctx, flashspec_lm_head* head, const Matrix& hidden) {
  Drafted out;
  out.tokens.assign(size_t(hidden.rows), -7);
  out.logits.assign(size_t(hidden.rows), NAN);
  flashspec_tensor h = hidden.view();
  flashspec_status s = flashspec_draft(ctx, head, &h, nullptr, out.tokens.data(), out.logits.data());
  EXPECT_EQ(s, FLASHSPEC_OK) << flashspec_context_last_error(ctx);
  return out;
}

TEST(GreedyDraft, ArgmaxAndLogitMatchTheFloat64Reference) {
  auto ctx = make_context(ContextOptions().cpu_threads(2));
  Rng rng(11);
  const flashspec_dtype dtypes[] = {FLASHSPEC_DTYPE_F32, FLASHSPEC_DTYPE_BF16, FLASHSPEC_DTYPE_F16};
  const int64_t vocabs[] = {1, 7, 255, 256, 257, 1000, 1537};
  const int64_t dims[] = {1, 3, 64, 100};
  int exact_checks = 0;
  for (flashspec_dtype wt : dtypes)
    for (flashspec_dtype ht : dtypes)
      for (int64_t V : vocabs)
        for (int64_t d : dims) {
          if (ht != wt && d != 64) continue;  // mixed dtypes: one shape is enough
          Matrix w = random_matrix(wt, V, d, rng, 0.5);
          Matrix hidden = random_matrix(ht, 5, d, rng, 1.0);
          HeadPtr head = make_head(ctx.get(), w.view());
          ASSERT_TRUE(head);
          EXPECT_EQ(flashspec_lm_head_vocab_size(head.get()), V);
          EXPECT_EQ(flashspec_lm_head_hidden_size(head.get()), d);
          Drafted got = greedy_draft(ctx.get(), head.get(), hidden);
          for (int64_t r = 0; r < hidden.rows; ++r) {
            ReferenceLogits ref = reference_logits(w, hidden, r);
            const int32_t x = got.tokens[size_t(r)];
            SCOPED_TRACE(::testing::Message() << "W " << dtype_name(wt) << " h " << dtype_name(ht) << " V " << V
                                              << " d " << d << " row " << r);
            ASSERT_GE(x, 0);
            ASSERT_LT(x, V);
            // The reported logit is l_x evaluated in fp32.
            EXPECT_LE(std::fabs(double(got.logits[size_t(r)]) - ref.logit[size_t(x)]), ref.error_bound[size_t(x)]);
            const int32_t best = argmax(ref.logit);
            const double gap = ref.logit[size_t(best)] - runner_up(ref.logit, best);
            if (gap > 2 * ref.max_error) {
              EXPECT_EQ(x, best);
              ++exact_checks;
            } else {
              // A near-tie under fp32 error: any token within the error of the max.
              EXPECT_GE(ref.logit[size_t(x)], ref.logit[size_t(best)] - 2 * ref.max_error);
            }
          }
        }
  EXPECT_GT(exact_checks, 200);  // the near-tie branch must stay the exception
}

// With d = 1 each logit is one fp32 product, rounded once: the fp32
// reference is exact, and bf16 weights make exact ties common.
TEST(GreedyDraft, HiddenSizeOneTiesGoToTheSmallestId) {
  auto ctx = make_context(ContextOptions().cpu_threads(3));
  Rng rng(12);
  for (flashspec_dtype wt : {FLASHSPEC_DTYPE_BF16, FLASHSPEC_DTYPE_F16, FLASHSPEC_DTYPE_F32}) {
    const int64_t V = 700;
    Matrix w(wt, V, 1);
    for (int64_t v = 0; v < V; ++v) w.set(v, 0, double(rng.below(9)) - 4.0);  // values in {−4..4}: many ties
    HeadPtr head = make_head(ctx.get(), w.view());
    Matrix hidden(FLASHSPEC_DTYPE_F32, 4, 1);
    const double hs[] = {1.0, -1.0, 0.37, -2.5};
    for (int r = 0; r < 4; ++r) hidden.set(r, 0, hs[r]);
    Drafted got = greedy_draft(ctx.get(), head.get(), hidden);
    for (int r = 0; r < 4; ++r) {
      float best = -INFINITY;
      int32_t best_token = -1;
      for (int64_t v = 0; v < V; ++v) {
        float l = float(w.at(v, 0)) * float(hidden.at(r, 0));
        if (l > best) {
          best = l;
          best_token = int32_t(v);
        }
      }
      EXPECT_EQ(got.tokens[size_t(r)], best_token) << dtype_name(wt) << " row " << r;
      EXPECT_EQ(got.logits[size_t(r)], best) << dtype_name(wt) << " row " << r;
    }
  }
}

// Rows of W that are bit-identical give bit-identical logits: exact ties
// wherever the duplicates sit relative to the 256-token tiles.
TEST(GreedyDraft, DuplicateRowsTieToTheSmallestIdAcrossTiles) {
  const int64_t V = 1000, d = 32;
  const std::vector<std::vector<int64_t>> tie_sets = {
      {5, 300, 900}, {255, 256}, {256, 511, 512}, {999, 270, 260}, {0, 999}, {767, 768, 769}, {998, 999}};
  for (flashspec_dtype wt : {FLASHSPEC_DTYPE_F32, FLASHSPEC_DTYPE_BF16}) {
    Rng rng(13);
    Matrix w = random_matrix(wt, V, d, rng, 0.05);
    Matrix v = random_matrix(FLASHSPEC_DTYPE_F32, 1, d, rng, 1.0);
    Matrix hidden(FLASHSPEC_DTYPE_F32, int64_t(tie_sets.size()), d);
    for (size_t k = 0; k < tie_sets.size(); ++k)
      for (int64_t c = 0; c < d; ++c) hidden.set(int64_t(k), c, v.at(0, c) * (1.0 + 0.1 * double(k)));
    // Per tie set: the rows of the set carry v, and the hidden row is
    // aligned with v, so those rows tie for the largest logit.
    for (size_t k = 0; k < tie_sets.size(); ++k) {
      Matrix wk = w;
      for (int64_t row : tie_sets[k])
        for (int64_t c = 0; c < d; ++c) wk.set(row, c, v.at(0, c));
      for (int threads : {1, 2, 3}) {
        auto ctx = make_context(ContextOptions().cpu_threads(threads));
        HeadPtr head = make_head(ctx.get(), wk.view());
        Matrix one(FLASHSPEC_DTYPE_F32, 1, d);
        one.copy_row(0, hidden, int64_t(k));
        Drafted got = greedy_draft(ctx.get(), head.get(), one);
        int64_t smallest = *std::min_element(tie_sets[k].begin(), tie_sets[k].end());
        EXPECT_EQ(got.tokens[0], smallest) << dtype_name(wt) << " tie set " << k << " threads " << threads;
        // The tie is real: the reference says every member is the max.
        ReferenceLogits ref = reference_logits(wk, one, 0);
        for (int64_t row : tie_sets[k]) EXPECT_EQ(ref.logit[size_t(row)], ref.logit[size_t(smallest)]);
        EXPECT_GT(ref.logit[size_t(smallest)] - 2 * ref.max_error,
                  [&] {
                    double m = -INFINITY;
                    for (int64_t t = 0; t < V; ++t)
                      if (std::find(tie_sets[k].begin(), tie_sets[k].end(), t) == tie_sets[k].end())
                        m = std::max(m, ref.logit[size_t(t)]);
                    return m;
                  }())
            << "the tied rows must clearly beat every other token";
      }
    }
  }
}

TEST(GreedyDraft, PerRowZeroTemperatureIsGreedy) {
  auto ctx = make_context(ContextOptions().cpu_threads(2));
  Rng rng(14);
  Matrix w = random_matrix(FLASHSPEC_DTYPE_BF16, 600, 16, rng, 0.5);
  Matrix hidden = random_matrix(FLASHSPEC_DTYPE_F32, 3, 16, rng, 1.0);
  HeadPtr head = make_head(ctx.get(), w.view());
  Drafted plain = greedy_draft(ctx.get(), head.get(), hidden);
  flashspec_draft_params p;
  flashspec_draft_params_init(&p);
  p.temperature = 1.0f;
  const float temps[] = {0.0f, 0.0f, 0.0f};
  p.temperatures = temps;
  std::vector<int32_t> tokens(3, -1);
  std::vector<float> logits(3, NAN);
  flashspec_tensor h = hidden.view();
  ASSERT_EQ(flashspec_draft(ctx.get(), head.get(), &h, &p, tokens.data(), logits.data()), FLASHSPEC_OK);
  EXPECT_EQ(tokens, plain.tokens);
  EXPECT_EQ(logits, plain.logits);
  // scores_out may be NULL.
  std::vector<int32_t> tokens2(3, -1);
  ASSERT_EQ(flashspec_draft(ctx.get(), head.get(), &h, nullptr, tokens2.data(), nullptr), FLASHSPEC_OK);
  EXPECT_EQ(tokens2, plain.tokens);
}

TEST(GreedyDraft, StridedHiddenAndWeightViews) {
  auto ctx = make_context(ContextOptions().cpu_threads(2));
  Rng rng(15);
  const int64_t V = 300, d = 10, stride = 13;
  Matrix w = random_matrix(FLASHSPEC_DTYPE_F32, V, d, rng, 0.5);
  Matrix hidden = random_matrix(FLASHSPEC_DTYPE_F32, 4, d, rng, 1.0);
  // Padded copies; the padding holds NaN, which must never be read.
  std::vector<float> wp(size_t(V * stride), NAN), hp(size_t(4 * stride), NAN);
  for (int64_t r = 0; r < V; ++r)
    for (int64_t c = 0; c < d; ++c) wp[size_t(r * stride + c)] = w.f32[size_t(r * d + c)];
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t c = 0; c < d; ++c) hp[size_t(r * stride + c)] = hidden.f32[size_t(r * d + c)];
  flashspec_tensor wt = flashspec_tensor_make(wp.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, V, d);
  wt.row_stride = stride;
  flashspec_lm_head* raw = nullptr;
  ASSERT_EQ(flashspec_lm_head_create(ctx.get(), &wt, FLASHSPEC_LM_HEAD_COPY, &raw), FLASHSPEC_OK)
      << flashspec_context_last_error(ctx.get());
  HeadPtr strided(raw);
  HeadPtr dense = make_head(ctx.get(), w.view());
  flashspec_tensor ht = flashspec_tensor_make(hp.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, 4, d);
  ht.row_stride = stride;
  std::vector<int32_t> t1(4), t2(4);
  std::vector<float> l1(4), l2(4);
  ASSERT_EQ(flashspec_draft(ctx.get(), strided.get(), &ht, nullptr, t1.data(), l1.data()), FLASHSPEC_OK)
      << flashspec_context_last_error(ctx.get());
  flashspec_tensor hd = hidden.view();
  ASSERT_EQ(flashspec_draft(ctx.get(), dense.get(), &hd, nullptr, t2.data(), l2.data()), FLASHSPEC_OK);
  EXPECT_EQ(t1, t2);
  EXPECT_EQ(l1, l2);
}

}  // namespace
