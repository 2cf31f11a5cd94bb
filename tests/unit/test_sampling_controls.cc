// Sampling controls, logprobs and typical acceptance on the CPU backend:
// T = 0 under any control is greedy decoding over the controlled set; the
// emitted tokens' logprobs and the top-n raw logprobs match a float64
// reference; typical acceptance follows Medusa's rule; sampled drafts stay
// in the kept set with log q of the controlled q; every bad control is
// refused with its own status and a message naming it, outputs untouched;
// callers built against the 0.1 header (shorter structs) keep working.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "../common/make.h"
#include "../exactness/reference_controls.h"
#include "flashspec.h"

namespace {

using fstest::ReferenceControls;

constexpr int kHidden = 16;

// A random model and its float64 logits.
struct Model {
  int vocab;
  std::vector<float> weight;
  Model(int v, uint64_t seed) : vocab(v), weight(size_t(v) * kHidden) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& w : weight) w = normal(rng);
  }
  std::vector<double> logits(const float* h) const {
    std::vector<double> l(static_cast<size_t>(vocab));
    for (int i = 0; i < vocab; ++i) {
      double acc = 0.0;
      for (int k = 0; k < kHidden; ++k) acc += double(weight[size_t(i) * kHidden + k]) * double(h[k]);
      l[size_t(i)] = acc;
    }
    return l;
  }
  flashspec_tensor tensor() const {
    return flashspec_tensor_make(weight.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, vocab, kHidden);
  }
};

std::vector<float> random_rows(int rows, uint64_t seed, float scale = 0.8f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> h(size_t(rows) * kHidden);
  for (float& x : h) x = normal(rng);
  return h;
}

// Controls for R requests that all use one setting, as arrays the C API takes.
struct ControlArrays {
  std::vector<int32_t> top_k;
  std::vector<float> top_p, min_p, typical_epsilon, typical_delta;
  std::vector<int32_t> bias_offsets, bias_tokens;
  std::vector<float> bias_values;
  std::vector<uint32_t> mask;  // [rows, words]
  flashspec_sampling_controls c;

  ControlArrays(int requests, const ReferenceControls& spec, const std::vector<std::vector<bool>>& row_allowed, int vocab) {
    flashspec_sampling_controls_init(&c);
    top_k.assign(size_t(requests), spec.top_k == INT_MAX ? FLASHSPEC_TOP_K_ALL : spec.top_k);
    top_p.assign(size_t(requests), float(spec.top_p));
    min_p.assign(size_t(requests), float(spec.min_p));
    bias_offsets.push_back(0);
    for (int r = 0; r < requests; ++r) {
      for (const auto& [token, value] : spec.bias) {
        bias_tokens.push_back(token);
        bias_values.push_back(value);
      }
      bias_offsets.push_back(int32_t(bias_tokens.size()));
    }
    const int words = (vocab + 31) / 32;
    for (const auto& allowed : row_allowed) {
      std::vector<uint32_t> bits(size_t(words), 0u);
      for (int i = 0; i < vocab; ++i)
        if (allowed.empty() || allowed[size_t(i)]) bits[size_t(i / 32)] |= 1u << (i % 32);
      mask.insert(mask.end(), bits.begin(), bits.end());
    }
    c.top_k = top_k.data();
    c.top_p = top_p.data();
    c.min_p = min_p.data();
    c.bias_offsets = bias_offsets.data();
    c.bias_tokens = bias_tokens.data();
    c.bias_values = bias_values.data();
    c.token_mask = row_allowed.empty() ? nullptr : mask.data();
  }
};

ReferenceControls chain(int vocab, std::mt19937_64& rng) {
  ReferenceControls spec;
  spec.top_k = 40;
  spec.top_p = 0.95;
  spec.min_p = 0.05;
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int k = 0; k < 10; ++k) spec.bias.push_back({int(rng() % uint64_t(vocab)), normal(rng)});
  spec.bias.push_back(spec.bias[0]);  // a repeated token: its entries add up
  return spec;
}

std::vector<bool> random_allowed(int vocab, std::mt19937_64& rng) {
  std::vector<bool> allowed(static_cast<size_t>(vocab));
  for (int i = 0; i < vocab; ++i) allowed[size_t(i)] = rng() % 4 != 0;
  return allowed;
}

class SamplingControls : public ::testing::Test {
 protected:
  void SetUp() override {
    ctx_ = fstest::make_context(fstest::ContextOptions().seed(11).max_rows(4096).max_requests(1024));
    head_ = fstest::make_head(ctx_.get(), model_.tensor());
  }
  Model model_{300, 5};
  fstest::ContextPtr ctx_;
  fstest::HeadPtr head_;
};

// One request: rows h_0..h_n, drafts x_1..x_n.
struct Request {
  std::vector<float> hidden;
  std::vector<int32_t> drafts;
};

TEST_F(SamplingControls, TemperatureZeroIsGreedyOverTheControlledSet) {
  std::mt19937_64 rng(3);
  const int V = model_.vocab, n = 4, R = 6;
  const ReferenceControls spec = chain(V, rng);
  std::vector<float> hidden = random_rows(R * (n + 1), 21);
  std::vector<std::vector<bool>> allowed;
  std::vector<int32_t> offsets(1, 0), drafts;
  // Drafts: the controlled argmax of each row, but request r drafts a wrong
  // token at position r (so positions after it are never reached).
  std::vector<std::vector<int>> greedy(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j <= n; ++j) {
      allowed.push_back(random_allowed(V, rng));
      ReferenceControls row_spec = spec;
      row_spec.allowed = allowed.back();
      const auto p = fstest::controlled(model_.logits(&hidden[size_t(r * (n + 1) + j) * kHidden]), 0.0, row_spec);
      greedy[size_t(r)].push_back(int(std::max_element(p.begin(), p.end()) - p.begin()));
      if (j < n) drafts.push_back(j == r ? (greedy[size_t(r)].back() + 1) % V : greedy[size_t(r)].back());
    }
    offsets.push_back(int32_t(drafts.size()));
  }
  ControlArrays controls(R, spec, allowed, V);
  std::vector<float> temperatures(size_t(R), 0.0f);
  flashspec_tensor target = flashspec_tensor_make(hidden.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST,
                                                  R * (n + 1), kHidden);
  flashspec_verify_batch batch;
  flashspec_verify_batch_init(&batch);
  batch.num_requests = R;
  batch.draft_offsets = offsets.data();
  batch.draft_tokens = drafts.data();
  batch.target_hidden = &target;
  batch.temperatures = temperatures.data();
  batch.controls = &controls.c;
  batch.logprobs = 1;
  std::vector<int32_t> accepted(static_cast<size_t>(R)), emitted(size_t(R * (n + 1)));
  std::vector<float> logprobs(emitted.size());
  flashspec_verify_result result;
  flashspec_verify_result_init(&result);
  result.accepted_counts = accepted.data();
  result.emitted_tokens = emitted.data();
  result.logprobs = logprobs.data();
  ASSERT_EQ(flashspec_verify_and_finalize(ctx_.get(), head_.get(), &batch, &result), FLASHSPEC_OK)
      << flashspec_context_last_error(ctx_.get());
  for (int r = 0; r < R; ++r) {
    const int expected_accepted = std::min(r, n);
    EXPECT_EQ(accepted[size_t(r)], expected_accepted) << "request " << r;
    for (int k = 0; k <= expected_accepted; ++k) {
      EXPECT_EQ(emitted[size_t(r * (n + 1) + k)], greedy[size_t(r)][size_t(k)]) << "request " << r << " slot " << k;
      EXPECT_EQ(logprobs[size_t(r * (n + 1) + k)], 0.0f);  // a point mass
    }
  }

  // A greedy draft call with the same controls gives the same argmaxes.
  std::vector<float> draft_hidden(hidden.begin(), hidden.begin() + (n + 1) * kHidden);
  std::vector<std::vector<bool>> draft_allowed(allowed.begin(), allowed.begin() + n + 1);
  ControlArrays draft_controls(n + 1, spec, draft_allowed, V);
  flashspec_draft_params params;
  flashspec_draft_params_init(&params);
  params.controls = &draft_controls.c;
  flashspec_tensor h = flashspec_tensor_make(draft_hidden.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, n + 1, kHidden);
  std::vector<int32_t> tokens(size_t(n + 1));
  ASSERT_EQ(flashspec_draft(ctx_.get(), head_.get(), &h, &params, tokens.data(), nullptr), FLASHSPEC_OK)
      << flashspec_context_last_error(ctx_.get());
  for (int j = 0; j <= n; ++j) EXPECT_EQ(tokens[size_t(j)], greedy[0][size_t(j)]) << "row " << j;
}

TEST_F(SamplingControls, LogprobsAndTopLogprobsMatchTheFloat64Reference) {
  std::mt19937_64 rng(4);
  const int V = model_.vocab, n = 3, R = 40, top_n = 7;
  const float T = 0.8f;
  const ReferenceControls spec = chain(V, rng);
  std::vector<float> hidden = random_rows(R * (n + 1), 22, 1.2f);
  std::vector<std::vector<bool>> allowed;
  std::vector<int32_t> offsets(1, 0), drafts;
  std::vector<std::vector<double>> p_rows, raw_rows;
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j <= n; ++j) {
      allowed.push_back(random_allowed(V, rng));
      ReferenceControls row_spec = spec;
      row_spec.allowed = allowed.back();
      const auto l = model_.logits(&hidden[size_t(r * (n + 1) + j) * kHidden]);
      p_rows.push_back(fstest::controlled(l, T, row_spec));
      raw_rows.push_back(fstest::raw_log_softmax(l));
      if (j < n) {  // the row's most probable token, or a random one
        const auto& p = p_rows.back();
        drafts.push_back(rng() % 2 ? int(std::max_element(p.begin(), p.end()) - p.begin()) : int(rng() % uint64_t(V)));
      }
    }
    offsets.push_back(int32_t(drafts.size()));
  }
  ControlArrays controls(R, spec, allowed, V);
  std::vector<float> temperatures(size_t(R), T);
  flashspec_tensor target = flashspec_tensor_make(hidden.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST,
                                                  R * (n + 1), kHidden);
  flashspec_verify_batch batch;
  flashspec_verify_batch_init(&batch);
  batch.num_requests = R;
  batch.draft_offsets = offsets.data();
  batch.draft_tokens = drafts.data();
  batch.target_hidden = &target;
  batch.temperatures = temperatures.data();
  batch.controls = &controls.c;
  batch.logprobs = 1;
  batch.top_logprobs = top_n;
  const size_t rows = size_t(R * (n + 1));
  std::vector<int32_t> accepted(static_cast<size_t>(R)), emitted(rows), top_tokens(rows * top_n);
  std::vector<float> logprobs(rows), raw_logprobs(rows), top_logprobs(rows * top_n);
  flashspec_verify_result result;
  flashspec_verify_result_init(&result);
  result.accepted_counts = accepted.data();
  result.emitted_tokens = emitted.data();
  result.logprobs = logprobs.data();
  result.raw_logprobs = raw_logprobs.data();
  result.top_tokens = top_tokens.data();
  result.top_logprobs = top_logprobs.data();
  fstest::SummariesPtr summaries;
  {
    flashspec_summaries* s = nullptr;
    ASSERT_EQ(flashspec_summaries_create(ctx_.get(), int32_t(rows), R, &s), FLASHSPEC_OK);
    summaries.reset(s);
  }
  ASSERT_EQ(flashspec_verify(ctx_.get(), head_.get(), &batch, summaries.get()), FLASHSPEC_OK)
      << flashspec_context_last_error(ctx_.get());
  ASSERT_EQ(flashspec_finalize(ctx_.get(), &batch, summaries.get(), &result), FLASHSPEC_OK)
      << flashspec_context_last_error(ctx_.get());
  int checked = 0;
  for (int r = 0; r < R; ++r)
    for (int k = 0; k <= n; ++k) {
      const size_t slot = size_t(r * (n + 1) + k);
      if (k > accepted[size_t(r)]) {
        EXPECT_EQ(emitted[slot], -1);
        EXPECT_TRUE(std::isnan(logprobs[slot]));
        EXPECT_TRUE(std::isnan(raw_logprobs[slot]));
        for (int i = 0; i < top_n; ++i) EXPECT_EQ(top_tokens[slot * top_n + size_t(i)], -1);
        continue;
      }
      const int token = emitted[slot];
      ASSERT_GT(p_rows[slot][size_t(token)], 0.0) << "emitted a token outside the kept set";
      EXPECT_NEAR(logprobs[slot], std::log(p_rows[slot][size_t(token)]), 1e-4) << "request " << r << " slot " << k;
      EXPECT_NEAR(raw_logprobs[slot], raw_rows[slot][size_t(token)], 1e-4) << "request " << r << " slot " << k;
      // Top n by raw logit, ties by smaller id.
      std::vector<int> ids(static_cast<size_t>(V));
      for (int i = 0; i < V; ++i) ids[size_t(i)] = i;
      const auto& lr = raw_rows[slot];
      std::partial_sort(ids.begin(), ids.begin() + top_n, ids.end(),
                        [&lr](int a, int b) { return lr[size_t(a)] > lr[size_t(b)] || (lr[size_t(a)] == lr[size_t(b)] && a < b); });
      for (int i = 0; i < top_n; ++i) {
        EXPECT_EQ(top_tokens[slot * top_n + size_t(i)], ids[size_t(i)]) << "slot " << slot << " rank " << i;
        EXPECT_NEAR(top_logprobs[slot * top_n + size_t(i)], lr[size_t(ids[size_t(i)])], 1e-4);
      }
      ++checked;
    }
  EXPECT_GT(checked, R);  // some requests accepted drafts
}

TEST_F(SamplingControls, TypicalAcceptanceFollowsMedusasRule) {
  const int V = model_.vocab, R = 200;
  const float T = 1.0f, epsilon = 0.09f, delta = 0.3f;
  std::vector<float> hidden = random_rows(R * 2, 23, 1.5f);
  std::mt19937_64 rng(9);
  std::vector<int32_t> offsets(1, 0), drafts;
  std::vector<bool> expect_accept;
  for (int r = 0; r < R; ++r) {
    const auto l = model_.logits(&hidden[size_t(r * 2) * kHidden]);
    const auto p = fstest::controlled(l, T, ReferenceControls{});
    double entropy = 0.0;
    for (double v : p)
      if (v > 0) entropy -= v * std::log(v);
    const double threshold = std::min(double(epsilon), double(delta) * std::exp(-entropy));
    // A draft clearly above or below the threshold.
    int token = -1;
    for (int tries = 0; tries < 1000 && token < 0; ++tries) {
      const int t = rng() % 3 ? int(std::max_element(p.begin(), p.end()) - p.begin()) : int(rng() % uint64_t(V));
      if (std::fabs(std::log(p[size_t(t)]) - std::log(threshold)) > 1e-3) token = t;
    }
    ASSERT_GE(token, 0);
    drafts.push_back(token);
    offsets.push_back(int32_t(drafts.size()));
    expect_accept.push_back(p[size_t(token)] > threshold);
  }
  std::vector<float> eps(size_t(R), epsilon), del(size_t(R), delta), temperatures(size_t(R), T);
  flashspec_sampling_controls controls;
  flashspec_sampling_controls_init(&controls);
  controls.typical_epsilon = eps.data();
  controls.typical_delta = del.data();
  flashspec_tensor target = flashspec_tensor_make(hidden.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, R * 2, kHidden);
  flashspec_verify_batch batch;
  flashspec_verify_batch_init(&batch);
  batch.num_requests = R;
  batch.draft_offsets = offsets.data();
  batch.draft_tokens = drafts.data();
  batch.target_hidden = &target;
  batch.temperatures = temperatures.data();
  batch.controls = &controls;
  std::vector<int32_t> accepted(static_cast<size_t>(R)), emitted(size_t(R * 2));
  flashspec_verify_result result;
  flashspec_verify_result_init(&result);
  result.accepted_counts = accepted.data();
  result.emitted_tokens = emitted.data();
  ASSERT_EQ(flashspec_verify_and_finalize(ctx_.get(), head_.get(), &batch, &result), FLASHSPEC_OK)
      << flashspec_context_last_error(ctx_.get());
  int accepts = 0, rejects = 0, checked = 0;
  for (int r = 0; r < R; ++r) {
    EXPECT_EQ(accepted[size_t(r)] == 1, bool(expect_accept[size_t(r)])) << "request " << r;
    accepts += accepted[size_t(r)] == 1;
    if (accepted[size_t(r)] != 0) continue;
    ++rejects;
    // A rejecting row emits the Gumbel-max sample of p itself, the rejected
    // token not excluded (Algorithm 1's residual would exclude it), with the
    // row's RESIDUAL_NOISE (seed 11, request id r, step 0, position 0).
    const auto l = model_.logits(&hidden[size_t(r * 2) * kHidden]);
    double best = -INFINITY, second = -INFINITY;
    int expected = -1;
    for (int i = 0; i < V; ++i) {
      const double u = flashspec_rng_uniform(11, uint64_t(r), 0, 0, FLASHSPEC_RNG_RESIDUAL_NOISE, i);
      const double score = l[size_t(i)] / T - std::log(-std::log(u));
      if (score > best) {
        second = best;
        best = score;
        expected = i;
      } else if (score > second) {
        second = score;
      }
    }
    if (best - second < 1e-3) continue;  // a near-tie fp32 may break either way
    EXPECT_EQ(emitted[size_t(r * 2)], expected) << "request " << r;
    ++checked;
  }
  EXPECT_GT(accepts, 10);
  EXPECT_GT(rejects, 10);
  EXPECT_GT(checked, rejects / 2);
}

TEST_F(SamplingControls, SampledDraftsStayInTheKeptSetWithTheirLogQ) {
  std::mt19937_64 rng(5);
  const int V = model_.vocab, rows = 400;
  const float T = 0.9f;
  ReferenceControls spec = chain(V, rng);
  spec.top_k = 12;
  std::vector<float> hidden = random_rows(rows, 24, 1.2f);
  std::vector<std::vector<bool>> allowed;
  for (int r = 0; r < rows; ++r) allowed.push_back(random_allowed(V, rng));
  ControlArrays controls(rows, spec, allowed, V);
  flashspec_draft_params params;
  flashspec_draft_params_init(&params);
  params.temperature = T;
  params.controls = &controls.c;
  flashspec_tensor h = flashspec_tensor_make(hidden.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, rows, kHidden);
  std::vector<int32_t> tokens(static_cast<size_t>(rows));
  std::vector<float> scores(static_cast<size_t>(rows));
  ASSERT_EQ(flashspec_draft(ctx_.get(), head_.get(), &h, &params, tokens.data(), scores.data()), FLASHSPEC_OK)
      << flashspec_context_last_error(ctx_.get());
  for (int r = 0; r < rows; ++r) {
    ReferenceControls row_spec = spec;
    row_spec.allowed = allowed[size_t(r)];
    const auto q = fstest::controlled(model_.logits(&hidden[size_t(r) * kHidden]), T, row_spec);
    ASSERT_GT(q[size_t(tokens[size_t(r)])], 0.0) << "row " << r << " drafted a token outside the kept set";
    EXPECT_NEAR(scores[size_t(r)], std::log(q[size_t(tokens[size_t(r)])]), 1e-4) << "row " << r;
  }
}

// Bad controls: a specific status, a message naming the argument, outputs
// untouched.
struct BadCase {
  const char* name;
  flashspec_status status;
  const char* argument;
  std::function<void(flashspec_verify_batch&, flashspec_sampling_controls&, flashspec_verify_result&)> mutate;
};

TEST_F(SamplingControls, BadControlsAreRefusedNamingTheArgument) {
  const int V = 2000;  // above FLASHSPEC_MAX_TOP_K, so a k between it and V is refused
  Model big(V, 6);
  fstest::HeadPtr big_head = fstest::make_head(ctx_.get(), big.tensor());
  const int R = 2;
  std::vector<float> hidden = random_rows(4, 25);
  std::vector<int32_t> offsets = {0, 1, 2}, drafts = {3, 4};
  std::vector<int32_t> top_k = {5, 5}, bias_offsets = {0, 1, 2}, bias_tokens = {7, 8};
  std::vector<float> top_p = {0.9f, 0.9f}, min_p = {0.1f, 0.1f}, bias_values = {1.0f, -1.0f};
  std::vector<uint32_t> mask(size_t(4 * ((V + 31) / 32)), 0xffffffffu);
  std::vector<float> eps = {0.1f, 0.1f}, delta = {0.3f, 0.3f};
  std::vector<float> draft_logits(size_t(2 * V), 0.0f);
  flashspec_tensor q = flashspec_tensor_make(draft_logits.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, 2, V);

  std::vector<BadCase> cases = {
      {"top_k 0", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->controls->top_k", [&](auto&, auto& c, auto&) { top_k[1] = 0; (void)c; }},
      {"top_k negative", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->controls->top_k", [&](auto&, auto&, auto&) { top_k[0] = -3; }},
      {"top_k beyond the bound", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->controls->top_k",
       [&](auto&, auto&, auto&) { top_k[0] = FLASHSPEC_MAX_TOP_K + 1; }},
      {"top_p 0", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->controls->top_p", [&](auto&, auto&, auto&) { top_p[0] = 0.0f; }},
      {"top_p above 1", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->controls->top_p", [&](auto&, auto&, auto&) { top_p[1] = 1.5f; }},
      {"top_p NaN", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->controls->top_p", [&](auto&, auto&, auto&) { top_p[0] = NAN; }},
      {"min_p negative", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->controls->min_p", [&](auto&, auto&, auto&) { min_p[0] = -0.1f; }},
      {"min_p above 1", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->controls->min_p", [&](auto&, auto&, auto&) { min_p[1] = 1.01f; }},
      {"bias token out of range", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->controls->bias_tokens",
       [&](auto&, auto&, auto&) { bias_tokens[1] = V; }},
      {"bias token negative", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->controls->bias_tokens",
       [&](auto&, auto&, auto&) { bias_tokens[0] = -1; }},
      {"bias value NaN", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->controls->bias_values",
       [&](auto&, auto&, auto&) { bias_values[0] = NAN; }},
      {"bias value infinite", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->controls->bias_values",
       [&](auto&, auto&, auto&) { bias_values[1] = -INFINITY; }},
      {"bias offsets decrease", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->controls->bias_offsets",
       [&](auto&, auto&, auto&) { bias_offsets[1] = 2; bias_offsets[2] = 1; }},
      {"bias tokens without offsets", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->controls->bias_offsets",
       [&](auto&, auto& c, auto&) { c.bias_offsets = nullptr; }},
      {"bias values NULL", FLASHSPEC_ERR_NULL_POINTER, "batch->controls->bias_values",
       [&](auto&, auto& c, auto&) { c.bias_values = nullptr; }},
      {"mask of the wrong size", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->controls->mask_words",
       [&](auto&, auto& c, auto&) { c.mask_words = (V + 31) / 32 + 1; }},
      {"mask allowing nothing", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->controls->token_mask",
       [&](auto&, auto&, auto&) { std::fill(mask.begin() + 2 * ((V + 31) / 32), mask.begin() + 3 * ((V + 31) / 32), 0u); }},
      {"mask allowing only tokens past V", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->controls->token_mask",
       [&](auto&, auto&, auto&) {
         const int words = (V + 31) / 32;
         std::fill(mask.begin(), mask.begin() + words, 0u);
         mask[size_t(words - 1)] = 0xffffffffu << (V % 32);
       }},
      {"typical_delta without epsilon", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->controls->typical_delta",
       [&](auto&, auto& c, auto&) { c.typical_delta = delta.data(); }},
      {"typical_epsilon above 1", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->controls->typical_epsilon",
       [&](auto&, auto& c, auto&) { eps[1] = 2.0f; c.typical_epsilon = eps.data(); }},
      {"typical in draft controls", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->draft_controls->typical_epsilon",
       [&](auto& b, auto& c, auto&) {
         b.draft_logits = &q;
         static flashspec_sampling_controls dc;
         flashspec_sampling_controls_init(&dc);
         dc.typical_epsilon = eps.data();
         b.draft_controls = &dc;
         (void)c;
       }},
      {"draft controls without draft logits", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->draft_controls",
       [&](auto& b, auto& c, auto&) { b.draft_controls = &c; }},
      {"repetition penalty 0", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->controls->repetition_penalty",
       [&](auto&, auto& c, auto&) { static float zero[2] = {1.0f, 0.0f}; c.repetition_penalty = zero; }},
      {"controls struct_size", FLASHSPEC_ERR_STRUCT_SIZE, "batch->controls->struct_size",
       [&](auto&, auto& c, auto&) { c.struct_size = 8; }},
      {"logprobs 2", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->logprobs", [&](auto& b, auto&, auto&) { b.logprobs = 2; }},
      {"top_logprobs 21", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->top_logprobs",
       [&](auto& b, auto&, auto&) { b.top_logprobs = FLASHSPEC_MAX_TOP_LOGPROBS + 1; }},
      {"logprobs not kept", FLASHSPEC_ERR_INVALID_ARGUMENT, "result->logprobs",
       [&](auto& b, auto&, auto& r) { b.logprobs = 0; (void)r; }},
      {"top tokens not kept", FLASHSPEC_ERR_INVALID_ARGUMENT, "result->top_tokens",
       [&](auto& b, auto&, auto&) { b.top_logprobs = 0; }},
      {"logprobs overlapping emitted tokens", FLASHSPEC_ERR_INVALID_ARGUMENT, "result->emitted_tokens",
       [&](auto&, auto&, auto& r) { r.logprobs = reinterpret_cast<float*>(r.emitted_tokens); }},
      {"raw logprobs overlapping a control", FLASHSPEC_ERR_INVALID_ARGUMENT, "result->raw_logprobs",
       [&](auto&, auto&, auto& r) { r.raw_logprobs = top_p.data(); }},
  };
  for (const BadCase& bad : cases) {
    SCOPED_TRACE(bad.name);
    top_k = {5, 5};
    top_p = {0.9f, 0.9f};
    min_p = {0.1f, 0.1f};
    bias_offsets = {0, 1, 2};
    bias_tokens = {7, 8};
    bias_values = {1.0f, -1.0f};
    eps = {0.1f, 0.1f};
    std::fill(mask.begin(), mask.end(), 0xffffffffu);
    flashspec_sampling_controls controls;
    flashspec_sampling_controls_init(&controls);
    controls.top_k = top_k.data();
    controls.top_p = top_p.data();
    controls.min_p = min_p.data();
    controls.bias_offsets = bias_offsets.data();
    controls.bias_tokens = bias_tokens.data();
    controls.bias_values = bias_values.data();
    controls.token_mask = mask.data();
    flashspec_tensor target = flashspec_tensor_make(hidden.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, 4, kHidden);
    flashspec_verify_batch batch;
    flashspec_verify_batch_init(&batch);
    batch.num_requests = R;
    batch.draft_offsets = offsets.data();
    batch.draft_tokens = drafts.data();
    batch.target_hidden = &target;
    batch.controls = &controls;
    batch.logprobs = 1;
    batch.top_logprobs = 2;
    std::vector<int32_t> accepted(size_t(R), 123), emitted(4, 123), top_tokens(8, 123);
    std::vector<float> logprobs(4, 7.0f), raw(4, 7.0f), top_lp(8, 7.0f);
    flashspec_verify_result result;
    flashspec_verify_result_init(&result);
    result.accepted_counts = accepted.data();
    result.emitted_tokens = emitted.data();
    result.logprobs = logprobs.data();
    result.raw_logprobs = raw.data();
    result.top_tokens = top_tokens.data();
    result.top_logprobs = top_lp.data();
    bad.mutate(batch, controls, result);
    const flashspec_status status = flashspec_verify_and_finalize(ctx_.get(), big_head.get(), &batch, &result);
    EXPECT_EQ(status, bad.status) << flashspec_status_name(status) << ": " << flashspec_context_last_error(ctx_.get());
    const std::string message = flashspec_context_last_error(ctx_.get());
    EXPECT_EQ(message.rfind(bad.argument, 0), 0u) << message;
    EXPECT_EQ(accepted, std::vector<int32_t>(size_t(R), 123));
    EXPECT_EQ(std::count(emitted.begin(), emitted.end(), 123), 4);
    EXPECT_EQ(std::count(top_tokens.begin(), top_tokens.end(), 123), 8);
    if (result.logprobs == logprobs.data()) {
      EXPECT_EQ(std::count(logprobs.begin(), logprobs.end(), 7.0f), 4);
    }
  }

  // The valid batch itself passes (the cases fail for their own reason).
  flashspec_sampling_controls controls;
  flashspec_sampling_controls_init(&controls);
  controls.top_k = top_k.data();
  controls.token_mask = mask.data();
  flashspec_tensor target = flashspec_tensor_make(hidden.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, 4, kHidden);
  flashspec_verify_batch batch;
  flashspec_verify_batch_init(&batch);
  batch.num_requests = R;
  batch.draft_offsets = offsets.data();
  batch.draft_tokens = drafts.data();
  batch.target_hidden = &target;
  batch.controls = &controls;
  std::vector<int32_t> accepted(static_cast<size_t>(R)), emitted(4);
  flashspec_verify_result result;
  flashspec_verify_result_init(&result);
  result.accepted_counts = accepted.data();
  result.emitted_tokens = emitted.data();
  EXPECT_EQ(flashspec_verify_and_finalize(ctx_.get(), big_head.get(), &batch, &result), FLASHSPEC_OK)
      << flashspec_context_last_error(ctx_.get());
  // k ≥ V keeps every token: allowed above the bound.
  top_k = {V, FLASHSPEC_TOP_K_ALL};
  EXPECT_EQ(flashspec_verify_and_finalize(ctx_.get(), big_head.get(), &batch, &result), FLASHSPEC_OK)
      << flashspec_context_last_error(ctx_.get());

  // Draft calls refuse typical acceptance.
  std::vector<float> eps_rows(4, 0.1f);
  flashspec_sampling_controls draft_controls;
  flashspec_sampling_controls_init(&draft_controls);
  draft_controls.typical_epsilon = eps_rows.data();
  flashspec_draft_params params;
  flashspec_draft_params_init(&params);
  params.controls = &draft_controls;
  std::vector<int32_t> tokens(4, 123);
  EXPECT_EQ(flashspec_draft(ctx_.get(), big_head.get(), &target, &params, tokens.data(), nullptr),
            FLASHSPEC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(flashspec_context_last_error(ctx_.get())).rfind("params->controls->typical_epsilon", 0), 0u);
  EXPECT_EQ(tokens, std::vector<int32_t>(4, 123));
}

// A caller built against the 0.1 header passes the shorter structs: they
// work, and the library reads nothing past their struct_size.
TEST_F(SamplingControls, StructsOfTheFirstLayoutStillWork) {
  std::vector<float> hidden = random_rows(3, 26);
  std::vector<int32_t> offsets = {0, 2}, drafts = {1, 2};
  flashspec_tensor target = flashspec_tensor_make(hidden.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, 3, kHidden);
  const uintptr_t garbage = 0x10;  // would crash if read as a pointer
  flashspec_verify_batch batch;
  flashspec_verify_batch_init(&batch);
  batch.num_requests = 1;
  batch.draft_offsets = offsets.data();
  batch.draft_tokens = drafts.data();
  batch.target_hidden = &target;
  batch.controls = reinterpret_cast<const flashspec_sampling_controls*>(garbage);
  batch.draft_controls = reinterpret_cast<const flashspec_sampling_controls*>(garbage);
  batch.logprobs = 77;
  batch.top_logprobs = -5;
  batch.struct_size = uint32_t(offsetof(flashspec_verify_batch, controls));
  std::vector<int32_t> accepted(1), emitted(3);
  flashspec_verify_result result;
  flashspec_verify_result_init(&result);
  result.accepted_counts = accepted.data();
  result.emitted_tokens = emitted.data();
  result.logprobs = reinterpret_cast<float*>(garbage);
  result.top_tokens = reinterpret_cast<int32_t*>(garbage);
  result.struct_size = uint32_t(offsetof(flashspec_verify_result, logprobs));
  EXPECT_EQ(flashspec_verify_and_finalize(ctx_.get(), head_.get(), &batch, &result), FLASHSPEC_OK)
      << flashspec_context_last_error(ctx_.get());
  EXPECT_GE(accepted[0], 0);

  flashspec_draft_params params;
  flashspec_draft_params_init(&params);
  params.controls = reinterpret_cast<const flashspec_sampling_controls*>(garbage);
  params.struct_size = uint32_t(offsetof(flashspec_draft_params, controls));
  std::vector<int32_t> tokens(3);
  EXPECT_EQ(flashspec_draft(ctx_.get(), head_.get(), &target, &params, tokens.data(), nullptr), FLASHSPEC_OK)
      << flashspec_context_last_error(ctx_.get());

  // The 0.1 *_init entry points (the symbols, reached here through the
  // plugin table) write the 0.1 layout and nothing past it.
  const flashspec_api* api = flashspec_get_api(FLASHSPEC_ABI_VERSION);
  ASSERT_NE(api, nullptr);
  auto first_layout_fill = [](auto init, size_t first_size) {
    std::vector<unsigned char> buffer(first_size + 64, 0xab);
    init(buffer.data());
    uint32_t size = 0;
    std::memcpy(&size, buffer.data(), sizeof size);
    EXPECT_EQ(size, first_size);
    EXPECT_EQ(size_t(std::count(buffer.begin() + long(first_size), buffer.end(), 0xab)), size_t(64))
        << "wrote past the 0.1 layout";
  };
  first_layout_fill([api](void* p) { api->verify_batch_init(static_cast<flashspec_verify_batch*>(p)); },
                    offsetof(flashspec_verify_batch, controls));
  first_layout_fill([api](void* p) { api->verify_result_init(static_cast<flashspec_verify_result*>(p)); },
                    offsetof(flashspec_verify_result, logprobs));
  first_layout_fill([api](void* p) { api->draft_params_init(static_cast<flashspec_draft_params*>(p)); },
                    offsetof(flashspec_draft_params, controls));
  // The sized entry points write what they are told, at most today's struct.
  std::vector<unsigned char> buffer(sizeof(flashspec_verify_batch) + 64, 0xab);
  api->verify_batch_init_sized(reinterpret_cast<flashspec_verify_batch*>(buffer.data()), buffer.size());
  EXPECT_EQ(reinterpret_cast<flashspec_verify_batch*>(buffer.data())->struct_size, sizeof(flashspec_verify_batch));
  EXPECT_EQ(size_t(std::count(buffer.begin() + long(sizeof(flashspec_verify_batch)), buffer.end(), 0xab)), size_t(64));

  // Sizes below the first layout are still refused.
  batch.struct_size = uint32_t(offsetof(flashspec_verify_batch, controls)) - 4;
  EXPECT_EQ(flashspec_verify_and_finalize(ctx_.get(), head_.get(), &batch, &result), FLASHSPEC_ERR_STRUCT_SIZE);
}

}  // namespace
