// T = 0 verification equals plain greedy decoding token for token: the
// accepted drafts are the argmax prefix, then the argmax at the first
// mismatch (or the bonus argmax when every draft matched).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "support.h"

namespace {

using namespace fstest;

// Hidden rows whose float64 argmax is clear of fp32 error, so the expected
// greedy token is unambiguous; the argmax of each row is returned.
Matrix clear_rows(const Matrix& w, int64_t rows, Rng& rng, std::vector<int32_t>& argmaxes) {
  Matrix hidden(FLASHSPEC_DTYPE_F32, rows, w.cols);
  argmaxes.assign(size_t(rows), -1);
  for (int64_t r = 0; r < rows; ++r) {
    for (;;) {
      for (int64_t c = 0; c < w.cols; ++c) hidden.set(r, c, rng.normal());
      ReferenceLogits ref = reference_logits(w, hidden, r);
      int32_t best = argmax(ref.logit);
      if (ref.logit[size_t(best)] - runner_up(ref.logit, best) > 4 * ref.max_error) {
        argmaxes[size_t(r)] = best;
        break;
      }
    }
  }
  return hidden;
}

struct Case {
  HostBatch batch;
  std::vector<std::vector<int32_t>> greedy;  // per request, the argmax of each of its rows
  std::vector<int32_t> mismatch;             // first wrong draft, or n_r when all are right
};

Case make_case(const Matrix& w, Rng& rng, const std::vector<int>& lengths) {
  Case c;
  int64_t rows = 0;
  for (int n : lengths) rows += n + 1;
  std::vector<int32_t> argmaxes;
  c.batch.hidden = clear_rows(w, rows, rng, argmaxes);
  const int32_t V = int32_t(w.rows);
  int64_t row = 0;
  for (int n : lengths) {
    std::vector<int32_t> g(argmaxes.begin() + row, argmaxes.begin() + row + n + 1);
    int32_t m = rng.below(n + 1);
    std::vector<int32_t> drafts(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) {
      if (j < m) drafts[size_t(j)] = g[size_t(j)];
      else if (j == m) drafts[size_t(j)] = (g[size_t(j)] + 1 + rng.below(V - 1)) % V;
      else drafts[size_t(j)] = rng.below(3) == 0 ? g[size_t(j)] : rng.below(V);  // right or wrong: ignored
    }
    c.batch.drafts.push_back(drafts);
    c.greedy.push_back(g);
    c.mismatch.push_back(m);
    row += n + 1;
  }
  c.batch.temperatures.assign(lengths.size(), 0.0f);
  return c;
}

void expect_greedy(const Case& c, const Outcome& got) {
  for (size_t r = 0; r < c.greedy.size(); ++r) {
    const int32_t m = c.mismatch[r];
    const size_t n = c.batch.drafts[r].size();
    EXPECT_EQ(got.accepted[r], m) << "request " << r;
    std::vector<int32_t> expected(n + 1, -1);
    for (int32_t j = 0; j <= m; ++j) expected[size_t(j)] = c.greedy[r][size_t(j)];
    EXPECT_EQ(got.emitted[r], expected) << "request " << r << " (n = " << n << ", first mismatch " << m << ")";
  }
}

TEST(GreedyVerify, EqualsGreedyDecodingTokenForToken) {
  Rng rng(31);
  for (flashspec_dtype wt : {FLASHSPEC_DTYPE_BF16, FLASHSPEC_DTYPE_F32, FLASHSPEC_DTYPE_F16}) {
    auto ctx = make_context(ContextOptions().cpu_threads(2));
    Matrix w = random_matrix(wt, 1000, 32, rng, 0.5);
    HeadPtr head = make_head(ctx.get(), w.view());
    for (int trial = 0; trial < 8; ++trial) {
      Case c = make_case(w, rng, {0, 1, 2, 4, 7, 3, 5});
      Outcome got = verify_and_finalize(ctx.get(), head.get(), c.batch);
      SCOPED_TRACE(::testing::Message() << dtype_name(wt) << " trial " << trial);
      expect_greedy(c, got);

      // The library's own greedy decoding of the same rows agrees.
      std::vector<int32_t> tokens(size_t(c.batch.hidden.rows), -1);
      flashspec_tensor h = c.batch.hidden.view();
      ASSERT_EQ(flashspec_draft(ctx.get(), head.get(), &h, nullptr, tokens.data(), nullptr), FLASHSPEC_OK);
      for (size_t r = 0; r < c.greedy.size(); ++r)
        for (size_t j = 0; j < c.greedy[r].size(); ++j)
          EXPECT_EQ(tokens[size_t(c.batch.first_row(r)) + j], c.greedy[r][j]);
    }
  }
}

TEST(GreedyVerify, IndependentOfSeedStepAndSeparateSummaries) {
  Rng rng(32);
  Matrix w = random_matrix(FLASHSPEC_DTYPE_BF16, 700, 24, rng, 0.5);
  auto ctx = make_context(ContextOptions().cpu_threads(3).seed(1));
  HeadPtr head = make_head(ctx.get(), w.view());
  Case c = make_case(w, rng, {3, 0, 6, 2});
  Outcome base = verify_and_finalize(ctx.get(), head.get(), c.batch);
  expect_greedy(c, base);
  c.batch.seeds = {11, 12, 13, 14};
  c.batch.steps = {5, 6, 7, 8};
  c.batch.request_ids = {100, 200, 300, 400};
  Outcome reseeded = verify_and_finalize(ctx.get(), head.get(), c.batch);
  EXPECT_EQ(reseeded.accepted, base.accepted);
  EXPECT_EQ(reseeded.emitted, base.emitted);
  EXPECT_EQ(reseeded.next_steps, (std::vector<uint64_t>{6, 7, 8, 9}));

  // flashspec_verify + flashspec_finalize with caller-owned summaries.
  flashspec_summaries* raw = nullptr;
  ASSERT_EQ(flashspec_summaries_create(ctx.get(), 64, 8, &raw), FLASHSPEC_OK);
  SummariesPtr summaries(raw);
  flashspec_verify_batch b = c.batch.view();
  ASSERT_EQ(flashspec_verify(ctx.get(), head.get(), &b, summaries.get()), FLASHSPEC_OK)
      << flashspec_context_last_error(ctx.get());
  std::vector<int32_t> accepted(4, -9), emitted(size_t(c.batch.total_rows()), -9);
  flashspec_verify_result res;
  flashspec_verify_result_init(&res);
  res.accepted_counts = accepted.data();
  res.emitted_tokens = emitted.data();
  ASSERT_EQ(flashspec_finalize(ctx.get(), &b, summaries.get(), &res), FLASHSPEC_OK)
      << flashspec_context_last_error(ctx.get());
  EXPECT_EQ(accepted, base.accepted);
  for (size_t r = 0; r < 4; ++r)
    EXPECT_EQ(std::vector<int32_t>(emitted.begin() + c.batch.first_row(r),
                                   emitted.begin() + c.batch.first_row(r) + int64_t(c.batch.drafts[r].size()) + 1),
              base.emitted[r]);
}

// greedy = 1 (no temperatures) is the batch temperatures of 0 make, token
// for token: verify with the one, finalize with the other, and a finalize
// of a batch at temperature 1 is refused as another batch.
TEST(GreedyVerify, GreedyFlagIsTemperaturesOfZero) {
  Rng rng(33);
  Matrix w = random_matrix(FLASHSPEC_DTYPE_BF16, 900, 40, rng, 0.5);
  auto ctx = make_context(ContextOptions().cpu_threads(2).seed(5));
  HeadPtr head = make_head(ctx.get(), w.view());
  Case c = make_case(w, rng, {4, 0, 2, 7, 1});
  c.batch.seeds = {1, 2, 3, 4, 5};
  const Outcome zeros = verify_and_finalize(ctx.get(), head.get(), c.batch);
  expect_greedy(c, zeros);

  flashspec_verify_batch flagged = c.batch.view();
  flagged.temperatures = nullptr;
  flagged.greedy = 1;
  flashspec_summaries* raw = nullptr;
  ASSERT_EQ(flashspec_summaries_create(ctx.get(), 64, 8, &raw), FLASHSPEC_OK);
  SummariesPtr summaries(raw);
  ASSERT_EQ(flashspec_verify(ctx.get(), head.get(), &flagged, summaries.get()), FLASHSPEC_OK)
      << flashspec_context_last_error(ctx.get());
  const size_t requests = c.batch.drafts.size();
  std::vector<int32_t> accepted(requests, -9), emitted(size_t(c.batch.total_rows()), -9);
  flashspec_verify_result res;
  flashspec_verify_result_init(&res);
  res.accepted_counts = accepted.data();
  res.emitted_tokens = emitted.data();

  flashspec_verify_batch at_one = flagged;
  at_one.greedy = 0;  // temperatures NULL: 1 for every request
  EXPECT_EQ(flashspec_finalize(ctx.get(), &at_one, summaries.get(), &res), FLASHSPEC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashspec_context_last_error(ctx.get())).find("summaries"), std::string::npos);
  EXPECT_EQ(accepted, std::vector<int32_t>(requests, -9));

  const flashspec_verify_batch with_zeros = c.batch.view();
  ASSERT_EQ(flashspec_finalize(ctx.get(), &with_zeros, summaries.get(), &res), FLASHSPEC_OK)
      << flashspec_context_last_error(ctx.get());
  EXPECT_EQ(accepted, zeros.accepted);
  for (size_t r = 0; r < requests; ++r)
    EXPECT_EQ(std::vector<int32_t>(emitted.begin() + c.batch.first_row(r),
                                   emitted.begin() + c.batch.first_row(r) + int64_t(c.batch.drafts[r].size()) + 1),
              zeros.emitted[r]);

  std::fill(accepted.begin(), accepted.end(), -9);
  ASSERT_EQ(flashspec_verify_and_finalize(ctx.get(), head.get(), &flagged, &res), FLASHSPEC_OK)
      << flashspec_context_last_error(ctx.get());
  EXPECT_EQ(accepted, zeros.accepted);
}

TEST(GreedyVerify, TiesResolveToTheSmallestIdAsInGreedyDecoding) {
  // Rows 3 and 700 of W are identical and dominate for the hidden row v:
  // greedy decoding picks 3, so a draft of 700 is rejected and 3 emitted,
  // and a draft of 3 is accepted.
  Rng rng(33);
  const int64_t V = 900, d = 16;
  Matrix w = random_matrix(FLASHSPEC_DTYPE_F32, V, d, rng, 0.05);
  Matrix v = random_matrix(FLASHSPEC_DTYPE_F32, 1, d, rng, 1.0);
  w.copy_row(3, v, 0);
  w.copy_row(700, v, 0);
  auto ctx = make_context(ContextOptions().cpu_threads(2));
  HeadPtr head = make_head(ctx.get(), w.view());
  HostBatch hb;
  hb.hidden = Matrix(FLASHSPEC_DTYPE_F32, 4, d);
  for (int64_t r = 0; r < 4; ++r) hb.hidden.copy_row(r, v, 0);
  hb.drafts = {{700}, {3}};
  hb.temperatures = {0.0f, 0.0f};
  Outcome got = verify_and_finalize(ctx.get(), head.get(), hb);
  EXPECT_EQ(got.accepted, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(got.emitted[0], (std::vector<int32_t>{3, -1}));
  EXPECT_EQ(got.emitted[1], (std::vector<int32_t>{3, 3}));
}

TEST(GreedyVerify, GreedyRequestsAreUnaffectedBySampledNeighbours) {
  Rng rng(34);
  Matrix w = random_matrix(FLASHSPEC_DTYPE_BF16, 513, 16, rng, 0.5);
  auto ctx = make_context(ContextOptions().cpu_threads(2));
  HeadPtr head = make_head(ctx.get(), w.view());
  Case c = make_case(w, rng, {4, 2, 5, 1});
  c.batch.temperatures = {0.0f, 1.0f, 0.0f, 0.7f};
  Outcome got = verify_and_finalize(ctx.get(), head.get(), c.batch);
  for (size_t r : {size_t(0), size_t(2)}) {
    const int32_t m = c.mismatch[r];
    EXPECT_EQ(got.accepted[r], m);
    std::vector<int32_t> expected(c.batch.drafts[r].size() + 1, -1);
    for (int32_t j = 0; j <= m; ++j) expected[size_t(j)] = c.greedy[r][size_t(j)];
    EXPECT_EQ(got.emitted[r], expected) << "request " << r;
  }
}

}  // namespace
