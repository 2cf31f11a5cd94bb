// Exactness of speculative verification: the tokens FlashSpec emits are
// distributed as sampling from the target model alone (Leviathan et al. 2023,
// Algorithm 1), for greedy (point-mass) and stochastic drafts, at every draft
// position, at the bonus position, and jointly for the first two tokens.
//
// Each configuration runs the library on the CPU backend against the exact
// float64 target with chi-square and Kolmogorov–Smirnov tests (family-wise
// α = 0.001 per configuration, Bonferroni-corrected),
// then runs deliberately wrong samplers with the same number of trials through
// the same tests and asserts that every one of them is rejected: a test that
// could not tell a wrong sampler from a right one would prove nothing.
// Seeds are fixed, so every run sees the same samples.
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
#include "reference_sampler.h"
#include "stats.h"
#include "verify_fixture.h"

namespace {

using fstest::Bug;
using fstest::Distribution;
using fstest::Verdict;

constexpr int kHidden = 8;
constexpr uint64_t kSeed = 0x5eed5eedULL;

const Bug kWrongSamplers[] = {Bug::kResampleFromP, Bug::kAcceptOffByOne, Bug::kInvertedRatio,
                              Bug::kBonusFromWrongRow};

// A small target model: an fp32 LM head W [V, d] and hidden rows; the exact
// distributions are computed from the same fp32 numbers in float64.
struct Model {
  int vocab;
  std::vector<float> weight;  // [V, d]

  Model(int v, std::mt19937_64& rng) : vocab(v), weight(size_t(v) * kHidden) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& w : weight) w = normal(rng);
  }

  std::vector<double> logits(const float* hidden) const {
    std::vector<double> l(static_cast<size_t>(vocab));
    for (int i = 0; i < vocab; ++i) {
      double acc = 0.0;
      for (int k = 0; k < kHidden; ++k) acc += double(weight[size_t(i) * kHidden + k]) * double(hidden[k]);
      l[size_t(i)] = acc;
    }
    return l;
  }
};

// A target row like an LM's near a confident prediction: one token (random)
// holds about half the mass, the rest is a noisy tail. Logits scale with T,
// so every temperature sees the same shape of l/T; a library that ignored T
// would be far off. Without a dominant token, chains of accepted drafts (and
// so the bonus position) would almost never be reached on 1000 tokens.
std::vector<float> confident_row(const Model& model, double temperature, std::mt19937_64& rng) {
  std::vector<float> h = fstest::random_hidden(rng, 1.5 * temperature, kHidden);
  int top = int(std::uniform_int_distribution<int>(0, model.vocab - 1)(rng));
  const float* w = model.weight.data() + size_t(top) * kHidden;
  double norm2 = 0.0;
  for (int k = 0; k < kHidden; ++k) norm2 += double(w[k]) * w[k];
  double margin = (std::log(double(model.vocab)) + 1.0) * temperature;
  for (int k = 0; k < kHidden; ++k) h[size_t(k)] += float(margin * w[k] / norm2);
  return h;
}


class ExactnessTest : public fstest::VerifyFixture {
 protected:
  ExactnessTest() : VerifyFixture(kHidden, kSeed) {}

  void upload(const Model& model) {
    flashspec_lm_head_destroy(head_);
    head_ = nullptr;
    flashspec_tensor w = flashspec_tensor_make(model.weight.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST,
                                               model.vocab, kHidden);
    FS_CHECK(flashspec_lm_head_create(ctx_, &w, FLASHSPEC_LM_HEAD_COPY, &head_));
  }
};

struct Config {
  int vocab;
  float temperature;
  bool stochastic;
  int trials;
};

std::string config_name(const Config& c) {
  char name[96];
  std::snprintf(name, sizeof name, "V%d_T%g_%s", c.vocab, double(c.temperature), c.stochastic ? "stochastic" : "greedy");
  std::string s = name;
  for (char& ch : s)
    if (ch == '.') ch = 'p';
  return s;
}

// --- Per position: fixed target rows, so emitted token k ~ p_{k−1} -------

class PerPositionTest : public ExactnessTest, public ::testing::WithParamInterface<Config> {};

TEST_P(PerPositionTest, EveryPositionMatchesTheTarget) {
  const Config c = GetParam();
  const int max_drafts = 3;
  const float draft_temperature = 0.8f;
  std::mt19937_64 rng(1000 + uint64_t(c.vocab) * 7 + uint64_t(c.temperature * 10) + (c.stochastic ? 1 : 0));
  Model model(c.vocab, rng);
  upload(model);

  // Target rows h_0..h_3, fixed for every trial, so the k-th emitted token
  // must follow p_{k−1} whatever happened before it. The draft model's
  // logits are the target's plus noise: a good but imperfect drafter.
  std::vector<std::vector<float>> target_rows;
  std::vector<Distribution> p, q;
  std::vector<std::vector<float>> draft_logit_rows;
  std::normal_distribution<double> noise(0.0, 0.7);
  for (int j = 0; j <= max_drafts; ++j) {
    target_rows.push_back(confident_row(model, c.temperature, rng));
    std::vector<double> l = model.logits(target_rows.back().data());
    p.push_back(fstest::softmax(l, c.temperature));
    if (j < max_drafts) {
      std::vector<float> z(static_cast<size_t>(c.vocab));
      std::vector<double> zd(static_cast<size_t>(c.vocab));
      for (int i = 0; i < c.vocab; ++i) zd[size_t(i)] = double(z[size_t(i)] = float(l[size_t(i)] + noise(rng)));
      draft_logit_rows.push_back(z);
      q.push_back(fstest::softmax(zd, draft_temperature));
    }
  }

  // Trial t drafts n = t mod 4 tokens: sampled from q (stochastic), or a
  // point mass on the draft model's argmax (greedy), with every fifth trial
  // on a token drawn from q so that other tokens are rejected too.
  std::vector<std::vector<int>> draft_tokens(static_cast<size_t>(c.trials));
  for (size_t t = 0; t < draft_tokens.size(); ++t)
    for (int j = 0; j < int(t % (max_drafts + 1)); ++j) {
      const Distribution& qj = q[size_t(j)];
      bool draw = c.stochastic || t % 5 == 4;
      draft_tokens[t].push_back(draw ? fstest::sample(qj, rng)
                                     : int(std::max_element(qj.begin(), qj.end()) - qj.begin()));
    }

  // Every emitted token at index k against p_k, and the bonus token after
  // n accepted drafts against p_n on its own.
  auto tally = [&](const std::vector<std::vector<int>>& emitted, Verdict* verdict) {
    std::vector<std::vector<int64_t>> at(max_drafts + 1, std::vector<int64_t>(size_t(c.vocab), 0));
    std::vector<std::vector<int64_t>> bonus(max_drafts + 1, std::vector<int64_t>(size_t(c.vocab), 0));
    for (size_t t = 0; t < emitted.size(); ++t) {
      const auto& e = emitted[t];
      for (size_t k = 0; k < e.size(); ++k) ++at[k][size_t(e[k])];
      if (e.size() == draft_tokens[t].size() + 1) ++bonus[e.size() - 1][size_t(e.back())];
    }
    for (int k = 0; k <= max_drafts; ++k) verdict->add("position " + std::to_string(k + 1), at[size_t(k)], p[size_t(k)]);
    for (int k = 0; k <= max_drafts; ++k)
      verdict->add("bonus after " + std::to_string(k) + " drafts", bonus[size_t(k)], p[size_t(k)]);
  };

  // The library, in batches of requests with distinct request ids.
  std::vector<std::vector<int>> emitted;
  const int batch = 2048;
  for (int start = 0; start < c.trials; start += batch) {
    const int count = std::min(batch, c.trials - start);
    std::vector<std::vector<int>> tokens(draft_tokens.begin() + start, draft_tokens.begin() + start + count);
    std::vector<std::vector<float>> rows, logits;
    std::vector<uint64_t> ids;
    for (const auto& x : tokens) {
      rows.emplace_back();
      for (size_t j = 0; j <= x.size(); ++j) rows.back().insert(rows.back().end(), target_rows[j].begin(), target_rows[j].end());
      logits.emplace_back();
      if (c.stochastic)
        for (size_t j = 0; j < x.size(); ++j)
          logits.back().insert(logits.back().end(), draft_logit_rows[j].begin(), draft_logit_rows[j].end());
      ids.push_back(uint64_t(start) + ids.size());
    }
    std::vector<std::vector<int>> part;
    ASSERT_NO_FATAL_FAILURE(verify(tokens, rows, logits, c.vocab, c.temperature, draft_temperature, 0, ids, &part));
    emitted.insert(emitted.end(), part.begin(), part.end());
  }
  Verdict library;
  tally(emitted, &library);
  std::printf("FlashSpec %s:\n%s", config_name(c).c_str(), library.detail.c_str());
  EXPECT_FALSE(library.rejects()) << library.detail;

  // The same statistics must reject every wrong sampler.
  for (Bug bug : kWrongSamplers) {
    std::mt19937_64 bug_rng(77);
    std::vector<std::vector<int>> wrong(static_cast<size_t>(c.trials));
    for (int t = 0; t < c.trials; ++t) {
      const auto& x = draft_tokens[size_t(t)];
      std::vector<Distribution> pt(p.begin(), p.begin() + long(x.size()) + 1), qt;
      for (size_t j = 0; j < x.size(); ++j)
        qt.push_back(c.stochastic ? q[j] : fstest::point_mass(x[j], size_t(c.vocab)));
      wrong[size_t(t)] = fstest::algorithm1(pt, qt, x, bug, bug_rng);
    }
    Verdict verdict;
    tally(wrong, &verdict);
    std::printf("wrong sampler %s:\n%s", fstest::bug_name(bug), verdict.detail.c_str());
    EXPECT_TRUE(verdict.rejects()) << "the tests failed to reject the wrong sampler "
                                           << fstest::bug_name(bug) << "\n" << verdict.detail;
  }
}

std::vector<Config> per_position_configs() {
  std::vector<Config> configs;
  for (int vocab : {2, 16, 1000})
    for (float t : {0.5f, 1.0f, 2.0f})
      for (bool stochastic : {false, true})
        configs.push_back({vocab, t, stochastic, vocab == 2 ? 20000 : (vocab == 16 ? 20000 : 12000)});
  return configs;
}

INSTANTIATE_TEST_SUITE_P(Grid, PerPositionTest, ::testing::ValuesIn(per_position_configs()),
                         [](const ::testing::TestParamInfo<Config>& info) { return config_name(info.param); });

// --- Joint distribution of the first two emitted tokens -----------------
// The target now depends on the context: the hidden row after token a is
// context_rows[a]. P(y1 = a, y2 = b) = p(a | start) p(b | a). When the first
// draft is rejected, the second token comes from a second call that verifies
// no drafts (the bonus row after y1), as a decoding loop would do.

class JointTest : public ExactnessTest, public ::testing::WithParamInterface<Config> {};

TEST_P(JointTest, FirstTwoTokensMatchTheTarget) {
  const Config c = GetParam();
  const int V = c.vocab;
  const float draft_temperature = 1.0f;
  std::mt19937_64 rng(5000 + uint64_t(V) + uint64_t(c.temperature * 10) + (c.stochastic ? 1 : 0));
  Model model(V, rng);
  upload(model);

  std::vector<float> start_row = fstest::random_hidden(rng, 2.5, kHidden);
  std::vector<std::vector<float>> context_rows(static_cast<size_t>(V));
  for (auto& row : context_rows) row = fstest::random_hidden(rng, 2.5, kHidden);
  Distribution p_start = fstest::softmax(model.logits(start_row.data()), c.temperature);
  std::vector<Distribution> p_after(static_cast<size_t>(V));
  for (int a = 0; a < V; ++a) p_after[size_t(a)] = fstest::softmax(model.logits(context_rows[size_t(a)].data()), c.temperature);

  // Draft model: its own logits per context (index V is the start).
  std::normal_distribution<double> noise(0.0, 1.5);
  std::vector<std::vector<float>> draft_z(static_cast<size_t>(V) + 1);
  std::vector<Distribution> q_after(static_cast<size_t>(V) + 1);
  for (int a = 0; a <= V; ++a) {
    std::vector<double> l = model.logits(a == V ? start_row.data() : context_rows[size_t(a)].data());
    std::vector<double> zd(static_cast<size_t>(V));
    draft_z[size_t(a)].resize(size_t(V));
    for (int i = 0; i < V; ++i) zd[size_t(i)] = double(draft_z[size_t(a)][size_t(i)] = float(0.7 * l[size_t(i)] + noise(rng)));
    q_after[size_t(a)] = fstest::softmax(zd, draft_temperature);
  }
  // Greedy drafts come from a deterministic drafter: the argmax of its logits.
  auto greedy_draft = [&](int context) {
    const auto& z = draft_z[size_t(context)];
    return int(std::max_element(z.begin(), z.end()) - z.begin());
  };

  Distribution joint(size_t(V) * size_t(V));
  for (int a = 0; a < V; ++a)
    for (int b = 0; b < V; ++b) joint[size_t(a * V + b)] = p_start[size_t(a)] * p_after[size_t(a)][size_t(b)];

  // Odd trials draft two tokens, even trials one: with one draft the second
  // emitted token is the bonus token whenever the draft is accepted.
  std::vector<std::vector<int>> drafts(static_cast<size_t>(c.trials));
  for (size_t t = 0; t < drafts.size(); ++t) {
    auto& x = drafts[t];
    x.push_back(c.stochastic ? fstest::sample(q_after[size_t(V)], rng) : greedy_draft(V));
    if (t % 2) x.push_back(c.stochastic ? fstest::sample(q_after[size_t(x[0])], rng) : greedy_draft(x[0]));
  }

  std::vector<int64_t> counts(joint.size(), 0);
  ASSERT_NO_FATAL_FAILURE(count_first_two(drafts, start_row, context_rows, draft_z, c.stochastic, V, c.temperature,
                                          draft_temperature, &counts));
  Verdict library;
  library.add("joint (y1, y2)", counts, joint);
  std::printf("FlashSpec joint %s:\n%s", config_name(c).c_str(), library.detail.c_str());
  EXPECT_FALSE(library.rejects()) << library.detail;

  // Wrong samplers, run through the same decoding loop in float64.
  for (Bug bug : kWrongSamplers) {
    std::mt19937_64 bug_rng(99);
    std::vector<int64_t> wrong(joint.size(), 0);
    for (int t = 0; t < c.trials; ++t) {
      const auto& x = drafts[size_t(t)];
      std::vector<Distribution> p = {p_start}, q;
      for (size_t j = 0; j < x.size(); ++j) {
        p.push_back(p_after[size_t(x[j])]);
        q.push_back(c.stochastic ? q_after[j == 0 ? size_t(V) : size_t(x[j - 1])]
                                 : fstest::point_mass(x[j], size_t(V)));
      }
      std::vector<int> e = fstest::algorithm1(p, q, x, bug, bug_rng);
      int second = e.size() >= 2 ? e[1] : fstest::algorithm1({p_after[size_t(e[0])]}, {}, {}, Bug::kNone, bug_rng)[0];
      ++wrong[size_t(e[0] * V + second)];
    }
    Verdict verdict;
    verdict.add("joint (y1, y2)", wrong, joint);
    std::printf("wrong sampler %s:\n%s", fstest::bug_name(bug), verdict.detail.c_str());
    EXPECT_TRUE(verdict.rejects()) << "the joint test failed to reject " << fstest::bug_name(bug)
                                           << "\n" << verdict.detail;
  }
}

std::vector<Config> joint_configs() {
  std::vector<Config> configs;
  for (int vocab : {2, 16})
    for (float t : {0.5f, 1.0f, 2.0f})
      for (bool stochastic : {false, true}) configs.push_back({vocab, t, stochastic, 40000});
  return configs;
}

INSTANTIATE_TEST_SUITE_P(Grid, JointTest, ::testing::ValuesIn(joint_configs()),
                         [](const ::testing::TestParamInfo<Config>& info) { return config_name(info.param); });

}  // namespace
