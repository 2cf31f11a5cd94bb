// The fused top-k draft (flashspec_draft_top_k) against a float64
// reference: per row the k allowed tokens of largest x = l + bias (bias after
// the repetition penalty, masked tokens out), in rank order, and their log
// softmax over the allowed tokens; fewer allowed tokens than k leave −1 /
// −Inf slots. Near-ties are handled by comparing the ranked values, not the
// ids, within the fp32 accumulation bound of support.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "support.h"

namespace {

using namespace fstest;

constexpr int64_t kRows = 4;
constexpr float kPenalty = 1.3f;

// Per-row controls that own their arrays: row 0 no mask; row 1 about half
// the vocabulary; row 2 only three tokens (fewer than k = 5 and 16); row 3
// every token but the raw argmax. Each row's bias list penalises its raw
// argmax and lifts another token well above the rest.
struct Controls {
  std::vector<int32_t> bias_offsets{0};
  std::vector<int32_t> bias_tokens;
  std::vector<float> bias_values;
  std::vector<float> penalties;
  std::vector<uint32_t> mask;
  int32_t words = 0;
  flashspec_sampling_controls view{};

  bool allowed(int64_t row, int64_t token) const {
    return (mask[size_t(row * words + token / 32)] >> (token % 32)) & 1u;
  }
};

Controls make_controls(const Matrix& w, const Matrix& hidden, Rng& rng) {
  Controls c;
  const int64_t V = w.rows;
  c.words = int32_t((V + 31) / 32);
  c.mask.assign(size_t(kRows * c.words), 0u);
  for (int64_t r = 0; r < kRows; ++r) {
    const ReferenceLogits ref = reference_logits(w, hidden, r);
    const int32_t top = argmax(ref.logit);
    for (int64_t i = 0; i < V; ++i) {
      bool allow = true;
      if (r == 1) allow = rng.uniform() < 0.5 || i == (top + 7) % V;
      if (r == 2) allow = i == 3 || i == V / 2 || i == V - 1;
      if (r == 3) allow = i != top;
      if (allow) c.mask[size_t(r * c.words + i / 32)] |= 1u << (i % 32);
    }
    const int32_t lifted = r == 2 ? int32_t(V / 2) : int32_t((top + 7) % V);
    c.bias_tokens.insert(c.bias_tokens.end(), {top, lifted, top});
    c.bias_values.insert(c.bias_values.end(), {-0.25f, 20.0f, 0.0f});  // repeats add up
    c.bias_offsets.push_back(int32_t(c.bias_tokens.size()));
    c.penalties.push_back(kPenalty);
  }
  flashspec_sampling_controls_init(&c.view);
  c.view.bias_offsets = c.bias_offsets.data();
  c.view.bias_tokens = c.bias_tokens.data();
  c.view.bias_values = c.bias_values.data();
  c.view.repetition_penalty = c.penalties.data();
  c.view.token_mask = c.mask.data();
  return c;
}

// x of the allowed tokens in float64 (NaN for masked ones) and its bound.
struct ReferenceRow {
  std::vector<double> x;
  double error_bound = 0.0;
  std::vector<int32_t> ranked;  // allowed tokens by x descending, ties by id
  double lse = 0.0;
};

ReferenceRow reference_row(const Matrix& w, const Matrix& hidden, const Controls& c, int64_t r) {
  const ReferenceLogits ref = reference_logits(w, hidden, r);
  const int64_t V = w.rows;
  std::vector<double> bias(size_t(V), 0.0);
  std::vector<bool> penalised(size_t(V), false);
  for (int32_t e = c.bias_offsets[size_t(r)]; e < c.bias_offsets[size_t(r) + 1]; ++e) {
    bias[size_t(c.bias_tokens[size_t(e)])] += c.bias_values[size_t(e)];
    penalised[size_t(c.bias_tokens[size_t(e)])] = true;
  }
  ReferenceRow out;
  out.x.assign(size_t(V), NAN);
  std::vector<double> allowed_x;
  for (int64_t i = 0; i < V; ++i) {
    if (!c.allowed(r, i)) continue;
    const double l = ref.logit[size_t(i)];
    const double p = penalised[size_t(i)] ? (l > 0 ? l / kPenalty : l * kPenalty) : l;
    out.x[size_t(i)] = p + bias[size_t(i)];
    out.ranked.push_back(int32_t(i));
    allowed_x.push_back(out.x[size_t(i)]);
  }
  // The penalty scales a logit's error by at most r; the fp32 penalty and
  // bias additions round once more each.
  out.error_bound = ref.max_error * kPenalty + 1e-6;
  std::sort(out.ranked.begin(), out.ranked.end(), [&](int32_t a, int32_t b) {
    return out.x[size_t(a)] > out.x[size_t(b)] || (out.x[size_t(a)] == out.x[size_t(b)] && a < b);
  });
  out.lse = log_sum_exp(allowed_x, 1.0);
  return out;
}

struct TopK {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

TopK draft_top_k(flashspec_context* ctx, flashspec_lm_head* head, const Matrix& hidden,
                 const flashspec_draft_params* params, int32_t k) {
  TopK out;
  out.tokens.assign(size_t(hidden.rows * k), -7);
  out.logprobs.assign(size_t(hidden.rows * k), NAN);
  flashspec_tensor h = hidden.view();
  EXPECT_EQ(flashspec_draft_top_k(ctx, head, &h, params, k, out.tokens.data(), out.logprobs.data()), FLASHSPEC_OK)
      << flashspec_context_last_error(ctx);
  return out;
}

// Checks one row of a top-k answer against the reference.
void expect_matches_reference(const ReferenceRow& ref, const int32_t* tokens, const float* logprobs, int32_t k) {
  const size_t kept = std::min(size_t(k), ref.ranked.size());
  std::vector<int32_t> seen;
  for (size_t i = 0; i < size_t(k); ++i) {
    SCOPED_TRACE(::testing::Message() << "slot " << i);
    if (i >= kept) {
      EXPECT_EQ(tokens[i], -1);
      EXPECT_EQ(logprobs[i], -INFINITY);
      continue;
    }
    const int32_t token = tokens[i];
    ASSERT_GE(token, 0);
    ASSERT_LT(token, int32_t(ref.x.size()));
    ASSERT_FALSE(std::isnan(ref.x[size_t(token)])) << "token " << token << " is masked";
    EXPECT_EQ(std::count(seen.begin(), seen.end(), token), 0) << "token " << token << " repeated";
    seen.push_back(token);
    // The value at rank i is the reference's rank-i value: a different id
    // there is a near-tie within the fp32 bound, never a wrong token.
    const double want_x = ref.x[size_t(ref.ranked[i])];
    EXPECT_LE(std::fabs(ref.x[size_t(token)] - want_x), 2.0 * ref.error_bound)
        << "token " << token << " where the reference ranks " << ref.ranked[i];
    // log p within the logit's bound plus the LSE's (each ≤ the bound) and
    // fp32 rounding of the result.
    const double want_logp = ref.x[size_t(token)] - ref.lse;
    EXPECT_LE(std::fabs(double(logprobs[i]) - want_logp), 2.0 * ref.error_bound + 1e-5 * (1.0 + std::fabs(want_logp)));
  }
}

TEST(DraftTopK, MatchesTheFloat64ReferenceWithBiasPenaltyAndMask) {
  auto ctx = make_context(ContextOptions().cpu_threads(2));
  Rng rng(23);
  const flashspec_dtype dtypes[] = {FLASHSPEC_DTYPE_F32, FLASHSPEC_DTYPE_BF16};
  const int64_t vocabs[] = {1000, 70001};
  const int32_t ks[] = {1, 5, 16};
  int bias_changed_top = 0;
  for (flashspec_dtype dt : dtypes)
    for (int64_t V : vocabs) {
      const int64_t d = 48;
      Matrix w = random_matrix(dt, V, d, rng, 0.5);
      Matrix hidden = random_matrix(dt, kRows, d, rng, 1.0);
      HeadPtr head = make_head(ctx.get(), w.view());
      ASSERT_TRUE(head);
      Controls c = make_controls(w, hidden, rng);
      flashspec_draft_params params;
      flashspec_draft_params_init(&params);
      params.controls = &c.view;
      std::vector<ReferenceRow> refs;
      for (int64_t r = 0; r < kRows; ++r) refs.push_back(reference_row(w, hidden, c, r));
      for (int64_t r = 0; r < kRows; ++r)
        bias_changed_top += refs[size_t(r)].ranked[0] != argmax(reference_logits(w, hidden, r).logit);
      TopK widest;
      for (int32_t k : ks) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " V " << V << " k " << k);
        const TopK got = draft_top_k(ctx.get(), head.get(), hidden, &params, k);
        for (int64_t r = 0; r < kRows; ++r) {
          SCOPED_TRACE(::testing::Message() << "row " << r);
          expect_matches_reference(refs[size_t(r)], got.tokens.data() + r * k, got.logprobs.data() + r * k, k);
        }
        if (k == 16) widest = got;
      }
      // Top-k answers are prefixes of one ranking: k = 5 and k = 1 are the
      // first entries of k = 16, bit for bit.
      for (int32_t k : {1, 5}) {
        const TopK got = draft_top_k(ctx.get(), head.get(), hidden, &params, k);
        for (int64_t r = 0; r < kRows; ++r)
          for (int32_t i = 0; i < k; ++i) {
            EXPECT_EQ(got.tokens[size_t(r * k + i)], widest.tokens[size_t(r * 16 + i)]);
            EXPECT_EQ(got.logprobs[size_t(r * k + i)], widest.logprobs[size_t(r * 16 + i)]);
          }
      }
    }
  // The controls must matter, or the reference would not test them.
  EXPECT_GE(bias_changed_top, 12);
}

TEST(DraftTopK, WithoutControlsIsTheRawLogSoftmax) {
  auto ctx = make_context(ContextOptions().cpu_threads(2));
  Rng rng(5);
  const int64_t V = 3001, d = 32;
  Matrix w = random_matrix(FLASHSPEC_DTYPE_F32, V, d, rng, 0.5);
  Matrix hidden = random_matrix(FLASHSPEC_DTYPE_F32, 3, d, rng, 1.0);
  HeadPtr head = make_head(ctx.get(), w.view());
  ASSERT_TRUE(head);
  // No mask, no bias: the reference of the controlled test with every token
  // allowed and an empty bias list.
  Controls none;
  none.words = int32_t((V + 31) / 32);
  none.mask.assign(size_t(3 * none.words), 0xffffffffu);
  none.bias_offsets.assign(4, 0);
  for (const int32_t k : {1, 16}) {
    const TopK got = draft_top_k(ctx.get(), head.get(), hidden, nullptr, k);
    for (int64_t r = 0; r < 3; ++r)
      expect_matches_reference(reference_row(w, hidden, none, r), got.tokens.data() + r * k,
                               got.logprobs.data() + r * k, k);
  }
  // logprobs_out NULL: the same tokens.
  std::vector<int32_t> tokens(3 * 16, -7);
  flashspec_tensor h = hidden.view();
  ASSERT_EQ(flashspec_draft_top_k(ctx.get(), head.get(), &h, nullptr, 16, tokens.data(), nullptr), FLASHSPEC_OK);
  EXPECT_EQ(tokens, draft_top_k(ctx.get(), head.get(), hidden, nullptr, 16).tokens);
}

TEST(DraftTopK, FirstTokenIsTheGreedyDraft) {
  auto ctx = make_context(ContextOptions().cpu_threads(2));
  Rng rng(31);
  for (flashspec_dtype dt : {FLASHSPEC_DTYPE_F32, FLASHSPEC_DTYPE_BF16}) {
    const int64_t V = 70001, d = 40;
    Matrix w = random_matrix(dt, V, d, rng, 0.5);
    Matrix hidden = random_matrix(dt, kRows, d, rng, 1.0);
    HeadPtr head = make_head(ctx.get(), w.view());
    ASSERT_TRUE(head);
    Controls c = make_controls(w, hidden, rng);
    for (const bool controlled : {false, true}) {
      flashspec_draft_params params;
      flashspec_draft_params_init(&params);
      params.controls = controlled ? &c.view : nullptr;
      std::vector<int32_t> greedy(kRows, -7);
      flashspec_tensor h = hidden.view();
      ASSERT_EQ(flashspec_draft(ctx.get(), head.get(), &h, &params, greedy.data(), nullptr), FLASHSPEC_OK)
          << flashspec_context_last_error(ctx.get());
      // The greedy token is the rank-0 token at any k, exactly.
      for (const int32_t k : {1, 16}) {
        const TopK got = draft_top_k(ctx.get(), head.get(), hidden, &params, k);
        for (int64_t r = 0; r < kRows; ++r)
          EXPECT_EQ(got.tokens[size_t(r * k)], greedy[size_t(r)]) << dtype_name(dt) << " controls " << controlled
                                                                  << " k " << k << " row " << r;
      }
    }
  }
}

TEST(DraftTopK, SamplingFieldsOfParamsDoNotChangeTheResult) {
  auto ctx = make_context(ContextOptions().cpu_threads(2));
  Rng rng(8);
  Matrix w = random_matrix(FLASHSPEC_DTYPE_F32, 700, 16, rng, 0.5);
  Matrix hidden = random_matrix(FLASHSPEC_DTYPE_F32, 2, 16, rng, 1.0);
  HeadPtr head = make_head(ctx.get(), w.view());
  ASSERT_TRUE(head);
  const TopK plain = draft_top_k(ctx.get(), head.get(), hidden, nullptr, 8);
  std::vector<float> temps{0.3f, 2.0f};
  std::vector<uint64_t> seeds{1, 2}, ids{5, 6}, steps{3, 4};
  std::vector<int32_t> positions{1, 2};
  flashspec_draft_params params;
  flashspec_draft_params_init(&params);
  params.temperature = 0.7f;
  params.temperatures = temps.data();
  params.seeds = seeds.data();
  params.request_ids = ids.data();
  params.steps = steps.data();
  params.positions = positions.data();
  const TopK got = draft_top_k(ctx.get(), head.get(), hidden, &params, 8);
  EXPECT_EQ(got.tokens, plain.tokens);
  EXPECT_EQ(got.logprobs, plain.logprobs);
}

}  // namespace
