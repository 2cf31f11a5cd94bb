// The CPU backend's logprobs against float64, at the sizes where fp32
// rounding adds up: the emitted tokens' controlled logprobs, their raw
// logprobs and the top-n raw logprobs, for fp32 and bf16 LM heads, top-k 1,
// 40 and 1024 (the largest that truncates), top-p, min-p, bias with a
// repetition penalty, and masks, over vocabularies from 1000 to 128256
// tokens. Every value is within 1e-4 of the float64 reference
// (reference_controls.h) of the exact logits of the stored weights.
//
// The reference ranks and cuts in float64, the library in fp32: a token
// whose x lies within fp32 error of the cut may be kept by one and not the
// other. Such a token is allowed (and counted) only when the float64 gap to
// the cut is below kCutTie; it never loosens the tolerance of the others.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "../exactness/reference_controls.h"
#include "support.h"

namespace {

using namespace fstest;

constexpr double kTolerance = 1e-4;
constexpr double kCutTie = 1e-4;  // x within this of the cut: fp32 may rank it either side

struct AccuracyCase {
  const char* name;
  flashspec_dtype dtype;  // W and hidden rows
  int vocab, d, requests, max_n;
  float temperature;  // requests: T·0.8, T·1.0, and a third greedy
  int top_k;          // 0: none; else even requests (odd ones keep every token)
  float top_p, min_p;  // 0: none
  bool bias, mask;
  int top_n;
  double w_scale = 3.0;  // W ~ N(0, (w_scale / √d)²): larger, more peaked rows
};

struct Errors {
  double logprob = 0.0, raw = 0.0, top = 0.0;
  int slots = 0, cut_ties = 0, rejections = 0;
  // Largest distance of the logprobs to a wrong reference whose requests
  // swap "top-k" and "every token" (a kept set of the wrong request): the
  // test's power to see a wrong kept set.
  double swapped_top_k = 0.0;
  std::vector<float> logprobs, raw_logprobs, top_logprobs;  // as the library returned them
};

// The float64 controls of request r, row `row`.
ReferenceControls reference_controls(const AccuracyCase& c, int r, const std::vector<int32_t>& top_k,
                                     const std::vector<float>& top_p, const std::vector<float>& min_p,
                                     const std::vector<int32_t>& bias_offsets, const std::vector<int32_t>& bias_tokens,
                                     const std::vector<float>& bias_values, const std::vector<float>& penalty,
                                     const std::vector<uint32_t>& mask, int words, int row) {
  ReferenceControls rc;
  if (c.top_k && top_k[size_t(r)] != FLASHSPEC_TOP_K_ALL) rc.top_k = top_k[size_t(r)];
  if (c.top_p > 0) rc.top_p = top_p[size_t(r)];
  if (c.min_p > 0) rc.min_p = min_p[size_t(r)];
  if (c.bias) {
    for (int e = bias_offsets[size_t(r)]; e < bias_offsets[size_t(r + 1)]; ++e)
      rc.bias.emplace_back(bias_tokens[size_t(e)], bias_values[size_t(e)]);
    rc.repetition = penalty[size_t(r)];
  }
  if (c.mask) {
    rc.allowed.resize(size_t(c.vocab));
    for (int i = 0; i < c.vocab; ++i)
      rc.allowed[size_t(i)] = (mask[size_t(row) * size_t(words) + size_t(i / 32)] >> (i % 32)) & 1u;
  }
  return rc;
}

// x of `token` under the controls (before truncation), as the reference
// computes it, and the x of the last token the reference keeps.
struct CutView {
  double token_x, cut_x;
};

CutView cut_view(const std::vector<double>& l, double temperature, const ReferenceControls& rc,
                 const std::vector<double>& p, int token) {
  auto x_of = [&](int i) {
    double v = l[size_t(i)];
    bool named = false;
    double bias = 0.0;
    for (const auto& [t, b] : rc.bias)
      if (t == i) named = true, bias += double(b);
    if (named) v = v > 0.0 ? v / rc.repetition : v * rc.repetition;
    return (v + bias) / temperature;
  };
  double cut = INFINITY;
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] > 0.0) cut = std::min(cut, x_of(int(i)));
  return {x_of(token), cut};
}

Errors run_case(const AccuracyCase& c, int32_t threads = 0) {
  Errors e;
  Rng rng(9001 + uint64_t(c.vocab) * 3 + uint64_t(c.top_k) * 7 + uint64_t(c.top_p * 100) +
          uint64_t(c.min_p * 1000) + (c.bias ? 11 : 0) + (c.mask ? 13 : 0) + uint64_t(c.dtype));
  const Matrix w = random_matrix(c.dtype, c.vocab, c.d, rng, c.w_scale / std::sqrt(double(c.d)));
  std::vector<int32_t> offsets(1, 0), drafts;
  std::vector<float> temperatures;
  for (int r = 0; r < c.requests; ++r) {
    offsets.push_back(offsets.back() + rng.below(c.max_n + 1));
    temperatures.push_back(r % 3 == 2 ? 0.0f : c.temperature * float(0.8 + 0.2 * (r % 3)));
  }
  const int rows = offsets.back() + c.requests;
  const Matrix h = random_matrix(c.dtype, rows, c.d, rng, 1.0);
  std::vector<std::vector<double>> logits(static_cast<size_t>(rows));
  for (int row = 0; row < rows; ++row) logits[size_t(row)] = reference_logits(w, h, row).logit;
  // Drafts: the row's argmax (mostly accepted), or a random token.
  for (int r = 0; r < c.requests; ++r)
    for (int j = 0; j < offsets[size_t(r + 1)] - offsets[size_t(r)]; ++j) {
      const int row = offsets[size_t(r)] + r + j;
      drafts.push_back(rng.below(3) == 0 ? rng.below(c.vocab) : argmax(logits[size_t(row)]));
    }
  if (drafts.empty()) drafts.push_back(0);

  // Controls, per request (mask per row).
  const int words = (c.vocab + 31) / 32;
  std::vector<int32_t> top_k, bias_offsets(1, 0), bias_tokens;
  std::vector<float> top_p, min_p, bias_values, penalty;
  std::vector<uint32_t> mask;
  for (int r = 0; r < c.requests; ++r) {
    top_k.push_back(r % 2 == 0 ? c.top_k : FLASHSPEC_TOP_K_ALL);
    top_p.push_back(r % 4 == 3 ? 1.0f : c.top_p);
    min_p.push_back(r % 5 == 4 ? 0.0f : c.min_p);
    penalty.push_back(r % 3 == 1 ? 1.0f : 1.3f);
    if (c.bias) {
      for (int k = 0; k < 6; ++k) {
        bias_tokens.push_back(k % 2 ? argmax(logits[size_t(offsets[size_t(r)] + r)]) : rng.below(c.vocab));
        bias_values.push_back(float(rng.uniform() * 6.0 - 3.0));
      }
      bias_tokens.push_back(bias_tokens.back());  // a repeated token: its entries add up
      bias_values.push_back(0.75f);
    }
    bias_offsets.push_back(int32_t(bias_tokens.size()));
  }
  if (c.mask) {
    mask.assign(size_t(rows) * size_t(words), 0u);
    for (int row = 0; row < rows; ++row)
      for (int i = 0; i < c.vocab; ++i)
        if (rng.below(10) < 7) mask[size_t(row) * size_t(words) + size_t(i / 32)] |= 1u << (i % 32);
  }
  flashspec_sampling_controls controls;
  flashspec_sampling_controls_init(&controls);
  if (c.top_k) controls.top_k = top_k.data();
  if (c.top_p > 0) controls.top_p = top_p.data();
  if (c.min_p > 0) controls.min_p = min_p.data();
  if (c.bias) {
    controls.bias_offsets = bias_offsets.data();
    controls.bias_tokens = bias_tokens.data();
    controls.bias_values = bias_values.data();
    controls.repetition_penalty = penalty.data();
  }
  if (c.mask) controls.token_mask = mask.data();

  auto ctx = make_context(ContextOptions(FLASHSPEC_BACKEND_CPU).seed(77).cpu_threads(threads).max_rows(rows).max_requests(c.requests));
  const flashspec_tensor wv = w.view(), hv = h.view();
  auto head = make_head(ctx.get(), wv);
  if (!ctx || !head) return e;
  flashspec_verify_batch batch;
  flashspec_verify_batch_init(&batch);
  batch.num_requests = c.requests;
  batch.draft_offsets = offsets.data();
  batch.draft_tokens = drafts.data();
  batch.target_hidden = &hv;
  batch.temperatures = temperatures.data();
  batch.controls = &controls;
  batch.logprobs = 1;
  batch.top_logprobs = c.top_n;
  const size_t n_top = size_t(rows) * size_t(std::max(c.top_n, 1));
  std::vector<int32_t> accepted(static_cast<size_t>(c.requests)), emitted(static_cast<size_t>(rows)), top_tokens(n_top);
  std::vector<float> logprobs(static_cast<size_t>(rows)), raw_logprobs(static_cast<size_t>(rows)), top_logprobs(n_top);
  flashspec_verify_result result;
  flashspec_verify_result_init(&result);
  result.accepted_counts = accepted.data();
  result.emitted_tokens = emitted.data();
  result.logprobs = logprobs.data();
  result.raw_logprobs = raw_logprobs.data();
  if (c.top_n) {
    result.top_tokens = top_tokens.data();
    result.top_logprobs = top_logprobs.data();
  }
  const flashspec_status status = flashspec_verify_and_finalize(ctx.get(), head.get(), &batch, &result);
  EXPECT_EQ(status, FLASHSPEC_OK) << flashspec_context_last_error(ctx.get());
  if (status != FLASHSPEC_OK) return e;

  for (int r = 0; r < c.requests; ++r) {
    const int row0 = offsets[size_t(r)] + r, n = offsets[size_t(r + 1)] - offsets[size_t(r)];
    EXPECT_GE(accepted[size_t(r)], 0) << c.name << " request " << r;
    e.rejections += accepted[size_t(r)] < n;
    for (int s = 0; s <= accepted[size_t(r)]; ++s) {
      const size_t slot = size_t(row0 + s);  // a chain's slot s is drawn by row s
      const std::vector<double>& l = logits[slot];
      const int token = emitted[slot];
      if (token < 0 || token >= c.vocab) {
        ADD_FAILURE() << c.name << " request " << r << " slot " << s << ": token " << token;
        continue;
      }
      const std::vector<double> raw = raw_log_softmax(l);
      e.raw = std::max(e.raw, std::fabs(raw_logprobs[slot] - raw[size_t(token)]));
      EXPECT_NEAR(raw_logprobs[slot], raw[size_t(token)], kTolerance) << c.name << " request " << r << " slot " << s;
      const double T = temperatures[size_t(r)];
      if (T == 0.0) {
        EXPECT_EQ(logprobs[slot], 0.0f) << c.name << " request " << r << " slot " << s;  // a point mass
      } else {
        const ReferenceControls rc =
            reference_controls(c, r, top_k, top_p, min_p, bias_offsets, bias_tokens, bias_values, penalty, mask,
                               words, int(slot));
        const std::vector<double> p = controlled(l, T, rc);
        const CutView cut = cut_view(l, T, rc, p, token);
        if (c.top_k) {
          ReferenceControls swapped = rc;
          swapped.top_k = top_k[size_t(r)] == FLASHSPEC_TOP_K_ALL ? c.top_k : INT_MAX;
          const double q = controlled(l, T, swapped)[size_t(token)];
          if (q > 0.0) e.swapped_top_k = std::max(e.swapped_top_k, std::fabs(logprobs[slot] - std::log(q)));
        }
        if (p[size_t(token)] > 0.0 || std::isinf(logprobs[slot])) {
          const double expected = p[size_t(token)] > 0.0 ? std::log(p[size_t(token)]) : -INFINITY;
          if (std::fabs(cut.token_x - cut.cut_x) < kCutTie && std::isinf(expected) != std::isinf(logprobs[slot])) {
            ++e.cut_ties;
          } else if (!std::isinf(expected)) {
            e.logprob = std::max(e.logprob, std::fabs(logprobs[slot] - expected));
            EXPECT_NEAR(logprobs[slot], expected, kTolerance)
                << c.name << " request " << r << " slot " << s << " token " << token << " T " << T << " k "
                << top_k[size_t(r)];
          }
        } else {
          // Emitted outside the float64 kept set: only a token at the cut.
          EXPECT_LT(std::fabs(cut.token_x - cut.cut_x), kCutTie)
              << c.name << " request " << r << " slot " << s << ": token " << token << " is outside the kept set";
          ++e.cut_ties;
        }
      }
      // Top n by raw logit, ties by smaller id.
      std::vector<int32_t> ids(static_cast<size_t>(c.vocab));
      for (int i = 0; i < c.vocab; ++i) ids[size_t(i)] = i;
      const int count = std::min(c.top_n, c.vocab);
      std::partial_sort(ids.begin(), ids.begin() + count, ids.end(), [&l](int32_t a, int32_t b) {
        return l[size_t(a)] > l[size_t(b)] || (l[size_t(a)] == l[size_t(b)] && a < b);
      });
      for (int i = 0; i < count; ++i) {
        const size_t t = slot * size_t(c.top_n) + size_t(i);
        const int32_t got = top_tokens[t];
        if (got < 0 || got >= c.vocab) {
          ADD_FAILURE() << c.name << " slot " << slot << " rank " << i << ": token " << got;
          continue;
        }
        // fp32 logits may swap two tokens whose exact logits nearly tie.
        if (got != ids[size_t(i)]) {
          EXPECT_LT(std::fabs(l[size_t(got)] - l[size_t(ids[size_t(i)])]), 1e-4);
        }
        e.top = std::max(e.top, std::fabs(top_logprobs[t] - raw[size_t(got)]));
        EXPECT_NEAR(top_logprobs[t], raw[size_t(got)], kTolerance) << c.name << " slot " << slot << " rank " << i;
      }
      ++e.slots;
    }
  }
  std::printf("[ accuracy ] %-28s V=%-6d %s: %3d slots, max |error| logprob %.2e raw %.2e top %.2e, "
              "%d cut tie(s), %d rejection(s), swapped top-k %.2e\n",
              c.name, c.vocab, c.dtype == FLASHSPEC_DTYPE_F32 ? "fp32" : "bf16", e.slots, e.logprob, e.raw, e.top,
              e.cut_ties, e.rejections, e.swapped_top_k);
  EXPECT_LE(e.cut_ties, std::max(1, e.slots / 50));
  e.logprobs = logprobs;
  e.raw_logprobs = raw_logprobs;
  e.top_logprobs = top_logprobs;
  return e;
}

// Runs the cases; returns how many drafted tokens they accepted (the slots
// beyond each request's one drawn token), so a test can insist that its
// accepted drafts were checked too.
int accepted_slots(const std::vector<AccuracyCase>& cases) {
  int accepted = 0;
  for (const AccuracyCase& c : cases) accepted += run_case(c).slots - c.requests;
  return accepted;
}

constexpr flashspec_dtype kF32 = FLASHSPEC_DTYPE_F32;
constexpr flashspec_dtype kBf16 = FLASHSPEC_DTYPE_BF16;

// The case that showed the CPU 0.011 away from float64: top-k 1024 of 2503
// tokens in bf16.
TEST(LogprobAccuracy, TopK1024OfABf16Head) {
  const AccuracyCase reported{"top-k 1024", kBf16, 2503, 96, 30, 3, 1.0f, 1024, 0, 0, false, false, 5};
  const int accepted = accepted_slots({reported,
                                       {"top-k 1024", kF32, 2503, 96, 30, 3, 1.0f, 1024, 0, 0, false, false, 5},
                                       {"top-k 1024, T 0.96/1.2", kBf16, 2503, 96, 30, 3, 1.2f, 1024, 0, 0, false,
                                        false, 5},
                                       {"top-k 1024, flat rows", kBf16, 4000, 64, 12, 3, 1.2f, 1024, 0, 0, false,
                                        false, 5, 1.0}});
  EXPECT_GT(accepted, 10);
  // Power: the kept set of the wrong request is far outside the tolerance.
  EXPECT_GT(run_case(reported).swapped_top_k, 100 * kTolerance);
}

// The log-sum-exps run in token or rank order whatever the thread count:
// the same bits from 1 and 3 threads.
TEST(LogprobAccuracy, IndependentOfTheThreadCount) {
  const AccuracyCase c{"k 40, p 0.95, min-p, bias, mask", kBf16, 70001, 64, 5, 2, 0.8f, 40, 0.95f, 0.05f, true, true,
                       8};
  const Errors one = run_case(c, 1), three = run_case(c, 3);
  ASSERT_EQ(one.logprobs.size(), three.logprobs.size());
  EXPECT_EQ(0, std::memcmp(one.logprobs.data(), three.logprobs.data(), one.logprobs.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(one.raw_logprobs.data(), three.raw_logprobs.data(), one.raw_logprobs.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(one.top_logprobs.data(), three.top_logprobs.data(), one.top_logprobs.size() * sizeof(float)));
}

TEST(LogprobAccuracy, EachControlAlone) {
  int accepted = 0;
  for (flashspec_dtype t : {kF32, kBf16})
    accepted += accepted_slots({{"top-k 1", t, 1000, 64, 12, 3, 1.0f, 1, 0, 0, false, false, 3},
                                {"top-k 40", t, 3001, 64, 12, 3, 1.0f, 40, 0, 0, false, false, 3},
                                {"top-p 0.9", t, 2503, 64, 12, 3, 1.0f, 0, 0.9f, 0, false, false, 3, 6.0},
                                {"min-p 0.1", t, 2503, 64, 12, 3, 1.0f, 0, 0, 0.1f, false, false, 3, 6.0},
                                {"bias + penalty", t, 2503, 64, 12, 3, 1.0f, 0, 0, 0, true, false, 3},
                                {"mask", t, 2503, 64, 12, 3, 1.0f, 0, 0, 0, false, true, 3}});
  EXPECT_GT(accepted, 10);
}

// llama.cpp's chain with bias and mask, logprobs alone and top-k 1024 over
// the real vocabulary sizes: log-sum-exps of 10^5 terms, where an fp32
// running sum was off by 1.3e-4.
TEST(LogprobAccuracy, LargeVocabularies) {
  int accepted = 0;
  for (flashspec_dtype t : {kF32, kBf16})
    accepted += accepted_slots(
        {{"k 40, p 0.95, min-p, bias, mask", t, 70001, 64, 5, 2, 0.8f, 40, 0.95f, 0.05f, true, true, 8},
         {"logprobs alone", t, 128256, 32, 4, 2, 1.0f, 0, 0, 0, false, false, 20, 1.0},
         {"top-k 1024", t, 128256, 32, 4, 2, 1.0f, 1024, 0, 0, false, false, 4, 1.0}});
  EXPECT_GT(accepted, 0);
}

}  // namespace
