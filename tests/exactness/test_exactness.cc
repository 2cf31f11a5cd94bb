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

namespace {

using fstest::Bug;
using fstest::Distribution;
using fstest::Verdict;

constexpr int kHidden = 8;
constexpr uint64_t kSeed = 0x5eed5eedULL;

const Bug kWrongSamplers[] = {Bug::kResampleFromP, Bug::kAcceptOffByOne, Bug::kInvertedRatio,
                              Bug::kBonusFromWrongRow};

#define FS_CHECK(call)                                                                  \
  do {                                                                                  \
    flashspec_status status_ = (call);                                                  \
    ASSERT_EQ(status_, FLASHSPEC_OK) << #call << ": " << flashspec_status_string(status_) \
                                     << " — " << flashspec_context_last_error(ctx_);    \
  } while (0)

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

Distribution softmax(const std::vector<double>& logits, double temperature) {
  Distribution p(logits.size());
  double m = -INFINITY;
  for (double l : logits) m = std::max(m, l / temperature);
  double sum = 0.0;
  for (size_t i = 0; i < p.size(); ++i) sum += (p[i] = std::exp(logits[i] / temperature - m));
  for (double& x : p) x /= sum;
  return p;
}

std::vector<float> random_hidden(std::mt19937_64& rng, double logit_scale) {
  // Logits then have standard deviation about logit_scale.
  std::normal_distribution<float> normal(0.0f, float(logit_scale / std::sqrt(double(kHidden))));
  std::vector<float> h(kHidden);
  for (float& x : h) x = normal(rng);
  return h;
}

// A target row like an LM's near a confident prediction: one token (random)
// holds about half the mass, the rest is a noisy tail. Logits scale with T,
// so every temperature sees the same shape of l/T; a library that ignored T
// would be far off. Without a dominant token, chains of accepted drafts (and
// so the bonus position) would almost never be reached on 1000 tokens.
std::vector<float> confident_row(const Model& model, double temperature, std::mt19937_64& rng) {
  std::vector<float> h = random_hidden(rng, 1.5 * temperature);
  int top = int(std::uniform_int_distribution<int>(0, model.vocab - 1)(rng));
  const float* w = model.weight.data() + size_t(top) * kHidden;
  double norm2 = 0.0;
  for (int k = 0; k < kHidden; ++k) norm2 += double(w[k]) * w[k];
  double margin = (std::log(double(model.vocab)) + 1.0) * temperature;
  for (int k = 0; k < kHidden; ++k) h[size_t(k)] += float(margin * w[k] / norm2);
  return h;
}


class ExactnessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto options = fstest::ContextOptions().seed(kSeed).max_rows(1 << 16).max_requests(1 << 14);
    ASSERT_EQ(fstest::create_context(options, &ctx_), FLASHSPEC_OK) << flashspec_context_last_error(nullptr);
  }
  void TearDown() override {
    flashspec_lm_head_destroy(head_);
    flashspec_context_destroy(ctx_);
  }

  void upload(const Model& model) {
    flashspec_lm_head_destroy(head_);
    head_ = nullptr;
    flashspec_tensor w = flashspec_tensor_make(model.weight.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST,
                                               model.vocab, kHidden);
    FS_CHECK(flashspec_lm_head_create(ctx_, &w, FLASHSPEC_LM_HEAD_COPY, &head_));
  }

  // Verifies one batch of requests on the library; each request r has drafts
  // tokens[r], hidden rows rows[r] (n_r + 1 of them), stochastic draft logits
  // draft_logits[r] (n_r rows of V, empty for greedy drafts).
  void verify(const std::vector<std::vector<int>>& tokens, const std::vector<std::vector<float>>& rows,
              const std::vector<std::vector<float>>& draft_logits, int vocab, float temperature,
              float draft_temperature, uint64_t step, const std::vector<uint64_t>& request_ids,
              std::vector<std::vector<int>>* emitted) {
    const int32_t requests = int32_t(tokens.size());
    std::vector<int32_t> offsets(static_cast<size_t>(requests) + 1, 0), flat_tokens;
    std::vector<float> hidden, logits;
    for (int32_t r = 0; r < requests; ++r) {
      offsets[size_t(r) + 1] = offsets[size_t(r)] + int32_t(tokens[size_t(r)].size());
      flat_tokens.insert(flat_tokens.end(), tokens[size_t(r)].begin(), tokens[size_t(r)].end());
      hidden.insert(hidden.end(), rows[size_t(r)].begin(), rows[size_t(r)].end());
      logits.insert(logits.end(), draft_logits[size_t(r)].begin(), draft_logits[size_t(r)].end());
    }
    const bool stochastic = !logits.empty();
    std::vector<float> temperatures(static_cast<size_t>(requests), temperature), draft_temperatures(size_t(requests), draft_temperature);
    std::vector<uint64_t> steps(static_cast<size_t>(requests), step);
    flashspec_tensor target = flashspec_tensor_make(hidden.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST,
                                                    int64_t(hidden.size() / kHidden), kHidden);
    flashspec_tensor draft = flashspec_tensor_make(logits.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST,
                                                   offsets.back(), vocab);
    flashspec_verify_batch batch;
    flashspec_verify_batch_init(&batch);
    batch.num_requests = requests;
    batch.draft_offsets = offsets.data();
    batch.draft_tokens = flat_tokens.data();
    batch.target_hidden = &target;
    batch.draft_logits = stochastic ? &draft : nullptr;
    batch.temperatures = temperatures.data();
    batch.draft_temperatures = stochastic ? draft_temperatures.data() : nullptr;
    batch.request_ids = request_ids.data();
    batch.steps = steps.data();
    std::vector<int32_t> accepted(static_cast<size_t>(requests)), out(hidden.size() / kHidden);
    flashspec_verify_result result;
    flashspec_verify_result_init(&result);
    result.accepted_counts = accepted.data();
    result.emitted_tokens = out.data();
    FS_CHECK(flashspec_verify_and_finalize(ctx_, head_, &batch, &result));
    emitted->assign(size_t(requests), {});
    for (int32_t r = 0; r < requests; ++r) {
      ASSERT_GE(accepted[size_t(r)], 0);
      ASSERT_LE(accepted[size_t(r)], int32_t(tokens[size_t(r)].size()));
      const int32_t first = offsets[size_t(r)] + r;
      for (int32_t k = 0; k <= accepted[size_t(r)]; ++k) {
        ASSERT_GE(out[size_t(first + k)], 0);
        ASSERT_LT(out[size_t(first + k)], vocab);
        (*emitted)[size_t(r)].push_back(out[size_t(first + k)]);
      }
      for (int32_t k = 0; k < accepted[size_t(r)]; ++k) ASSERT_EQ(out[size_t(first + k)], tokens[size_t(r)][size_t(k)]);
    }
  }

  flashspec_context* ctx_ = nullptr;
  flashspec_lm_head* head_ = nullptr;
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
    p.push_back(softmax(l, c.temperature));
    if (j < max_drafts) {
      std::vector<float> z(static_cast<size_t>(c.vocab));
      std::vector<double> zd(static_cast<size_t>(c.vocab));
      for (int i = 0; i < c.vocab; ++i) zd[size_t(i)] = double(z[size_t(i)] = float(l[size_t(i)] + noise(rng)));
      draft_logit_rows.push_back(z);
      q.push_back(softmax(zd, draft_temperature));
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

  std::vector<float> start_row = random_hidden(rng, 2.5);
  std::vector<std::vector<float>> context_rows(static_cast<size_t>(V));
  for (auto& row : context_rows) row = random_hidden(rng, 2.5);
  Distribution p_start = softmax(model.logits(start_row.data()), c.temperature);
  std::vector<Distribution> p_after(static_cast<size_t>(V));
  for (int a = 0; a < V; ++a) p_after[size_t(a)] = softmax(model.logits(context_rows[size_t(a)].data()), c.temperature);

  // Draft model: its own logits per context (index V is the start).
  std::normal_distribution<double> noise(0.0, 1.5);
  std::vector<std::vector<float>> draft_z(static_cast<size_t>(V) + 1);
  std::vector<Distribution> q_after(static_cast<size_t>(V) + 1);
  for (int a = 0; a <= V; ++a) {
    std::vector<double> l = model.logits(a == V ? start_row.data() : context_rows[size_t(a)].data());
    std::vector<double> zd(static_cast<size_t>(V));
    draft_z[size_t(a)].resize(size_t(V));
    for (int i = 0; i < V; ++i) zd[size_t(i)] = double(draft_z[size_t(a)][size_t(i)] = float(0.7 * l[size_t(i)] + noise(rng)));
    q_after[size_t(a)] = softmax(zd, draft_temperature);
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
  const int batch = 2048;
  for (int start = 0; start < c.trials; start += batch) {
    const int count = std::min(batch, c.trials - start);
    std::vector<std::vector<int>> tokens;
    std::vector<std::vector<float>> rows, logits;
    std::vector<uint64_t> ids;
    for (int t = start; t < start + count; ++t) {
      const auto& x = drafts[size_t(t)];
      tokens.push_back(x);
      std::vector<float> r = start_row;
      for (int token : x) r.insert(r.end(), context_rows[size_t(token)].begin(), context_rows[size_t(token)].end());
      rows.push_back(r);
      std::vector<float> z;
      if (c.stochastic) {
        z = draft_z[size_t(V)];
        if (x.size() > 1) z.insert(z.end(), draft_z[size_t(x[0])].begin(), draft_z[size_t(x[0])].end());
      }
      logits.push_back(z);
      ids.push_back(uint64_t(t));
    }
    std::vector<std::vector<int>> first;
    ASSERT_NO_FATAL_FAILURE(verify(tokens, rows, logits, V, c.temperature, draft_temperature, 0, ids, &first));
    // Requests that stopped after one token continue with a bonus-only step.
    std::vector<std::vector<int>> next_tokens;
    std::vector<std::vector<float>> next_rows, next_logits;
    std::vector<uint64_t> next_ids;
    std::vector<int> waiting;
    for (int k = 0; k < count; ++k) {
      if (first[size_t(k)].size() >= 2) {
        ++counts[size_t(first[size_t(k)][0] * V + first[size_t(k)][1])];
      } else {
        waiting.push_back(k);
        next_tokens.push_back({});
        next_rows.push_back(context_rows[size_t(first[size_t(k)][0])]);
        next_logits.push_back({});
        next_ids.push_back(ids[size_t(k)]);
      }
    }
    if (waiting.empty()) continue;
    std::vector<std::vector<int>> second;
    ASSERT_NO_FATAL_FAILURE(verify(next_tokens, next_rows, next_logits, V, c.temperature, draft_temperature, 1, next_ids, &second));
    for (size_t w = 0; w < waiting.size(); ++w)
      ++counts[size_t(first[size_t(waiting[w])][0] * V + second[w][0])];
  }
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
