// Exactness of verify under sampling controls: with bias, penalties, a token
// mask, top-k, top-p, min-p, each alone and as llama.cpp's default chain
// (top-k 40, top-p 0.95, min-p 0.05, T 0.8, with penalties and a mask), the tokens the
// library emits at every position, and the bonus token, are distributed as
// the float64 controlled target p_j (Algorithm 1 on the filtered p). Greedy
// (point-mass) drafts, some of them outside the kept set, and stochastic
// drafts sampled from a controlled q (draft_controls).
//
// Each configuration also runs deliberately wrong samplers with the same
// number of trials through the same tests and asserts that each is rejected:
// top-p applied before the temperature, min-p relative to the max over
// masked tokens too, the bias added after the temperature, the repetition
// penalty applied after the bias, every control ignored, and the residual
// computed from the uncontrolled p.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "../common/context.h"
#include "flashspec.h"
#include "reference_controls.h"
#include "reference_sampler.h"
#include "stats.h"

namespace {

using fstest::Distribution;
using fstest::Verdict;
using fstest::FilterBug;
using fstest::ReferenceControls;

constexpr int kHidden = 8;
constexpr int kMaxDrafts = 3;


// Which controls a configuration turns on.
struct Config {
  const char* name;
  int vocab;
  float temperature;
  bool stochastic;
  int top_k;  // 0: off
  float top_p, min_p;
  bool bias, mask;
  std::vector<FilterBug> bugs;
  float repetition = 1.0f;  // repetition penalty of the bias tokens
};

std::string config_name(const Config& c) { return std::string(c.name) + (c.stochastic ? "_stochastic" : "_greedy"); }

// Algorithm 1 whose acceptance uses p but whose residual after a rejection is
// built from `residual_p` (the wrong sampler when that is the uncontrolled p).
std::vector<int> algorithm1_with_residual(const std::vector<Distribution>& p, const std::vector<Distribution>& residual_p,
                                          const std::vector<Distribution>& q, const std::vector<int>& x,
                                          std::mt19937_64& rng) {
  std::vector<int> emitted;
  for (size_t j = 0; j < x.size(); ++j) {
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    if (u < std::min(1.0, p[j][size_t(x[j])] / q[j][size_t(x[j])])) {
      emitted.push_back(x[j]);
      continue;
    }
    Distribution residual(p[j].size());
    double mass = 0.0;
    for (size_t i = 0; i < residual.size(); ++i) mass += (residual[i] = std::max(residual_p[j][i] - q[j][i], 0.0));
    for (double& r : residual) r /= mass;
    emitted.push_back(fstest::sample(residual, rng));
    return emitted;
  }
  emitted.push_back(fstest::sample(p[x.size()], rng));
  return emitted;
}

class ControlsExactness : public ::testing::TestWithParam<Config> {
 protected:
  void SetUp() override {
    const auto options = fstest::ContextOptions().seed(0xc0ffee).max_rows(1 << 16).max_requests(1 << 14);
    ASSERT_EQ(fstest::create_context(options, &ctx_), FLASHSPEC_OK) << flashspec_context_last_error(nullptr);
  }
  void TearDown() override {
    flashspec_lm_head_destroy(head_);
    flashspec_context_destroy(ctx_);
  }

  flashspec_context* ctx_ = nullptr;
  flashspec_lm_head* head_ = nullptr;
};

TEST_P(ControlsExactness, EveryPositionMatchesTheControlledTarget) {
  const Config c = GetParam();
  const int V = c.vocab;
  const int trials = 16000;
  const float draft_temperature = 0.9f;
  std::mt19937_64 rng(std::hash<std::string>()(config_name(c)));
  std::normal_distribution<float> normal(0.0f, 1.0f);

  std::vector<float> weight(size_t(V) * kHidden);
  for (float& w : weight) w = normal(rng);
  flashspec_tensor w = flashspec_tensor_make(weight.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, V, kHidden);
  ASSERT_EQ(flashspec_lm_head_create(ctx_, &w, FLASHSPEC_LM_HEAD_COPY, &head_), FLASHSPEC_OK);
  auto logits_of = [&](const std::vector<float>& h) {
    std::vector<double> l(static_cast<size_t>(V));
    for (int i = 0; i < V; ++i) {
      double acc = 0.0;
      for (int k = 0; k < kHidden; ++k) acc += double(weight[size_t(i) * kHidden + k]) * double(h[size_t(k)]);
      l[size_t(i)] = acc;
    }
    return l;
  };

  // Target rows like an LM's: spread logits and one dominant token.
  std::vector<std::vector<float>> rows(kMaxDrafts + 1);
  std::vector<std::vector<double>> target_logits(kMaxDrafts + 1), draft_logits(kMaxDrafts);
  std::vector<std::vector<float>> draft_logit_rows(kMaxDrafts);
  std::normal_distribution<double> noise(0.0, 0.7);
  for (int j = 0; j <= kMaxDrafts; ++j) {
    std::vector<float>& h = rows[size_t(j)];
    h.resize(kHidden);
    for (float& x : h) x = normal(rng) * float(2.5 / std::sqrt(double(kHidden)));
    const int top = int(rng() % uint64_t(V));
    double norm2 = 0.0;
    for (int k = 0; k < kHidden; ++k) norm2 += double(weight[size_t(top) * kHidden + k]) * weight[size_t(top) * kHidden + k];
    for (int k = 0; k < kHidden; ++k) h[size_t(k)] += float(2.5 * weight[size_t(top) * kHidden + k] / norm2);
    target_logits[size_t(j)] = logits_of(h);
    if (j < kMaxDrafts) {
      draft_logit_rows[size_t(j)].resize(size_t(V));
      draft_logits[size_t(j)].resize(size_t(V));
      for (int i = 0; i < V; ++i)
        draft_logits[size_t(j)][size_t(i)] =
            double(draft_logit_rows[size_t(j)][size_t(i)] = float(target_logits[size_t(j)][size_t(i)] + noise(rng)));
    }
  }

  // The controls: one set for every request; the mask per row clears the
  // row's raw argmax (so min-p's max must be the max over allowed tokens)
  // and a random third of the others.
  ReferenceControls spec;
  if (c.top_k) spec.top_k = c.top_k;
  spec.top_p = c.top_p;
  spec.min_p = c.min_p;
  if (c.bias && c.repetition == 1.0f)
    for (int k = 0; k < 12; ++k) spec.bias.push_back({int(rng() % uint64_t(V)), float(normal(rng) * 1.5f)});
  if (c.bias && c.repetition != 1.0f) {
    // Penalties as a runtime computes them: the recent tokens (here each
    // row's most likely token and a few others) with −(count · frequency +
    // presence).
    for (const auto& l : target_logits)
      spec.bias.push_back({int(std::max_element(l.begin(), l.end()) - l.begin()), -float(1 + rng() % 3) * 0.8f - 0.4f});
    for (int k = 0; k < 8; ++k) spec.bias.push_back({int(rng() % uint64_t(V)), -float(1 + rng() % 3) * 0.8f - 0.4f});
  }
  spec.repetition = c.repetition;
  const int words = (V + 31) / 32;
  auto make_mask = [&](const std::vector<double>& l, std::vector<bool>* allowed, std::vector<uint32_t>* bits) {
    allowed->assign(size_t(V), true);
    if (!c.mask) return;
    const int argmax = int(std::max_element(l.begin(), l.end()) - l.begin());
    for (int i = 0; i < V; ++i) (*allowed)[size_t(i)] = i != argmax && rng() % 3 != 0;
    bits->assign(size_t(words), 0u);
    for (int i = 0; i < V; ++i)
      if ((*allowed)[size_t(i)]) (*bits)[size_t(i / 32)] |= 1u << (i % 32);
  };
  std::vector<ReferenceControls> target_spec(kMaxDrafts + 1, spec), draft_spec(kMaxDrafts, spec);
  std::vector<std::vector<uint32_t>> target_bits(kMaxDrafts + 1), draft_bits(kMaxDrafts);
  for (int j = 0; j <= kMaxDrafts; ++j)
    make_mask(target_logits[size_t(j)], &target_spec[size_t(j)].allowed, &target_bits[size_t(j)]);
  for (int j = 0; j < kMaxDrafts; ++j) make_mask(draft_logits[size_t(j)], &draft_spec[size_t(j)].allowed, &draft_bits[size_t(j)]);

  std::vector<Distribution> p, p_uncontrolled, q;
  for (int j = 0; j <= kMaxDrafts; ++j) {
    p.push_back(fstest::controlled(target_logits[size_t(j)], c.temperature, target_spec[size_t(j)]));
    p_uncontrolled.push_back(fstest::controlled(target_logits[size_t(j)], c.temperature, ReferenceControls{}));
  }
  for (int j = 0; j < kMaxDrafts; ++j)
    q.push_back(c.stochastic ? fstest::controlled(draft_logits[size_t(j)], draft_temperature, draft_spec[size_t(j)])
                             : fstest::controlled(draft_logits[size_t(j)], draft_temperature, ReferenceControls{}));

  // Trial t drafts t mod 4 tokens: from q (stochastic), or a point mass on
  // the draft's argmax with every fifth drawn from the uncontrolled draft
  // softmax, which may lie outside the kept set (then always rejected).
  std::vector<std::vector<int>> drafts(static_cast<size_t>(trials));
  for (size_t t = 0; t < drafts.size(); ++t)
    for (int j = 0; j < int(t % (kMaxDrafts + 1)); ++j) {
      const Distribution& qj = q[size_t(j)];
      const bool draw = c.stochastic || t % 5 == 4;
      drafts[t].push_back(draw ? fstest::sample(qj, rng) : int(std::max_element(qj.begin(), qj.end()) - qj.begin()));
    }

  // The library: all trials in batches of requests with distinct ids.
  std::vector<std::vector<int>> emitted;
  const int batch_size = 2000;
  for (int start = 0; start < trials; start += batch_size) {
    const int R = std::min(batch_size, trials - start);
    std::vector<int32_t> offsets(size_t(R) + 1, 0), tokens;
    std::vector<float> hidden, z;
    std::vector<uint32_t> mask, q_mask;
    std::vector<uint64_t> ids;
    std::vector<int32_t> top_k(size_t(R), c.top_k ? c.top_k : FLASHSPEC_TOP_K_ALL), bias_offsets(size_t(R) + 1, 0),
        bias_tokens;
    std::vector<float> top_p(size_t(R), c.top_p), min_p(size_t(R), c.min_p), bias_values,
        repetition(size_t(R), c.repetition);
    for (int r = 0; r < R; ++r) {
      const auto& x = drafts[size_t(start + r)];
      offsets[size_t(r) + 1] = offsets[size_t(r)] + int32_t(x.size());
      for (size_t j = 0; j <= x.size(); ++j) {
        hidden.insert(hidden.end(), rows[j].begin(), rows[j].end());
        mask.insert(mask.end(), target_bits[j].begin(), target_bits[j].end());
        if (j < x.size()) {
          tokens.push_back(x[j]);
          z.insert(z.end(), draft_logit_rows[j].begin(), draft_logit_rows[j].end());
          q_mask.insert(q_mask.end(), draft_bits[j].begin(), draft_bits[j].end());
        }
      }
      for (const auto& [token, value] : spec.bias) {
        bias_tokens.push_back(token);
        bias_values.push_back(value);
      }
      bias_offsets[size_t(r) + 1] = int32_t(bias_tokens.size());
      ids.push_back(uint64_t(start + r));
    }
    flashspec_sampling_controls controls;
    flashspec_sampling_controls_init(&controls);
    controls.top_k = top_k.data();
    controls.top_p = top_p.data();
    controls.min_p = min_p.data();
    if (c.bias) {
      controls.bias_offsets = bias_offsets.data();
      controls.bias_tokens = bias_tokens.data();
      controls.bias_values = bias_values.data();
    }
    controls.token_mask = c.mask ? mask.data() : nullptr;
    controls.repetition_penalty = repetition.data();
    flashspec_sampling_controls draft_controls = controls;
    draft_controls.token_mask = c.mask ? q_mask.data() : nullptr;

    std::vector<float> temperatures(size_t(R), c.temperature), draft_temperatures(size_t(R), draft_temperature);
    flashspec_tensor target = flashspec_tensor_make(hidden.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST,
                                                    int64_t(hidden.size() / kHidden), kHidden);
    flashspec_tensor draft = flashspec_tensor_make(z.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, offsets.back(), V);
    flashspec_verify_batch batch;
    flashspec_verify_batch_init(&batch);
    batch.num_requests = R;
    batch.draft_offsets = offsets.data();
    batch.draft_tokens = tokens.data();
    batch.target_hidden = &target;
    batch.temperatures = temperatures.data();
    batch.request_ids = ids.data();
    batch.controls = &controls;
    if (c.stochastic) {
      batch.draft_logits = &draft;
      batch.draft_temperatures = draft_temperatures.data();
      batch.draft_controls = &draft_controls;
    }
    std::vector<int32_t> accepted(static_cast<size_t>(R)), out(hidden.size() / kHidden);
    flashspec_verify_result result;
    flashspec_verify_result_init(&result);
    result.accepted_counts = accepted.data();
    result.emitted_tokens = out.data();
    ASSERT_EQ(flashspec_verify_and_finalize(ctx_, head_, &batch, &result), FLASHSPEC_OK)
        << flashspec_context_last_error(ctx_);
    for (int r = 0; r < R; ++r) {
      const int first = offsets[size_t(r)] + r;
      ASSERT_GE(accepted[size_t(r)], 0);
      std::vector<int> e(out.begin() + first, out.begin() + first + accepted[size_t(r)] + 1);
      for (int k = 0; k <= accepted[size_t(r)]; ++k) ASSERT_GT(p[size_t(k)][size_t(e[size_t(k)])], 0.0) << "token outside the kept set";
      emitted.push_back(e);
    }
  }

  auto tally = [&](const std::vector<std::vector<int>>& tokens_out, Verdict* verdict) {
    std::vector<std::vector<int64_t>> at(kMaxDrafts + 1, std::vector<int64_t>(size_t(V), 0));
    std::vector<std::vector<int64_t>> bonus(kMaxDrafts + 1, std::vector<int64_t>(size_t(V), 0));
    for (size_t t = 0; t < tokens_out.size(); ++t) {
      const auto& e = tokens_out[t];
      for (size_t k = 0; k < e.size(); ++k) ++at[k][size_t(e[k])];
      if (e.size() == drafts[t].size() + 1) ++bonus[e.size() - 1][size_t(e.back())];
    }
    for (int k = 0; k <= kMaxDrafts; ++k) verdict->add("position " + std::to_string(k + 1), at[size_t(k)], p[size_t(k)]);
    for (int k = 0; k <= kMaxDrafts; ++k)
      verdict->add("bonus after " + std::to_string(k) + " drafts", bonus[size_t(k)], p[size_t(k)]);
  };
  Verdict library;
  tally(emitted, &library);
  std::printf("FlashSpec %s:\n%s", config_name(c).c_str(), library.detail.c_str());
  EXPECT_FALSE(library.rejects()) << library.detail;

  // Wrong samplers, same trials, same tests: each must be rejected.
  auto q_of = [&](const std::vector<int>& x) {
    std::vector<Distribution> qt;
    for (size_t j = 0; j < x.size(); ++j) qt.push_back(c.stochastic ? q[j] : fstest::point_mass(x[j], size_t(V)));
    return qt;
  };
  auto expect_rejected = [&](const std::string& name, const std::vector<std::vector<int>>& wrong) {
    Verdict verdict;
    tally(wrong, &verdict);
    std::printf("wrong sampler %s:\n%s", name.c_str(), verdict.detail.c_str());
    EXPECT_TRUE(verdict.rejects()) << "the tests failed to reject the wrong sampler " << name << "\n" << verdict.detail;
  };
  for (FilterBug bug : c.bugs) {
    std::vector<Distribution> p_wrong;
    for (int j = 0; j <= kMaxDrafts; ++j)
      p_wrong.push_back(fstest::controlled(target_logits[size_t(j)], c.temperature, target_spec[size_t(j)], bug));
    std::mt19937_64 bug_rng(77);
    std::vector<std::vector<int>> wrong;
    for (const auto& x : drafts) {
      std::vector<Distribution> pt(p_wrong.begin(), p_wrong.begin() + long(x.size()) + 1);
      wrong.push_back(fstest::algorithm1(pt, q_of(x), x, fstest::Bug::kNone, bug_rng));
    }
    expect_rejected(fstest::filter_bug_name(bug), wrong);
  }
  std::mt19937_64 bug_rng(78);
  std::vector<std::vector<int>> wrong;
  for (const auto& x : drafts) wrong.push_back(algorithm1_with_residual(p, p_uncontrolled, q_of(x), x, bug_rng));
  expect_rejected("residual-from-uncontrolled-p", wrong);
}

std::vector<Config> configs() {
  using B = FilterBug;
  std::vector<Config> all;
  for (bool stochastic : {false, true}) {
    all.push_back({"bias", 48, 0.6f, stochastic, 0, 1.0f, 0.0f, true, false, {B::kBiasAfterTemperature, B::kNoControls}});
    all.push_back({"mask", 48, 1.0f, stochastic, 0, 1.0f, 0.0f, false, true, {B::kNoControls}});
    all.push_back({"top_k", 48, 1.0f, stochastic, 4, 1.0f, 0.0f, false, false, {B::kNoControls}});
    all.push_back({"top_p", 48, 0.5f, stochastic, 0, 0.6f, 0.0f, false, false, {B::kTopPBeforeTemperature, B::kNoControls}});
    all.push_back({"min_p", 48, 1.0f, stochastic, 0, 1.0f, 0.15f, false, true, {B::kMinPUnmaskedMax, B::kNoControls}});
    all.push_back({"llama_default_chain", 96, 0.8f, stochastic, 40, 0.95f, 0.05f, true, true,
                   {B::kMinPUnmaskedMax, B::kNoControls}});
    all.push_back({"penalties", 48, 0.8f, stochastic, 0, 1.0f, 0.0f, true, false,
                   {B::kRepetitionAfterBias, B::kNoControls}, 1.8f});
  }
  return all;
}

INSTANTIATE_TEST_SUITE_P(Controls, ControlsExactness, ::testing::ValuesIn(configs()),
                         [](const ::testing::TestParamInfo<Config>& info) { return config_name(info.param); });

}  // namespace
