// Exactness of speculative verification on 8-bit LM heads (CPU backend): the
// tokens FlashSpec emits are distributed as sampling from the float64
// softmax of the dequantised logits l_v = s_v · Σ_k h_k q_vk — at every draft
// position, at the bonus position, and jointly for the first two tokens —
// for int8 and e4m3 heads, greedy (point-mass) and sampled drafts, with
// codes and scales given by the caller or quantised by the library. The
// codes are decoded by tests/common/fp8_reference.h.
//
// The statistics are test_exactness.cc's (chi-square and Kolmogorov–Smirnov,
// family-wise α = 0.001, Bonferroni-corrected). To show that they can tell,
// the same emitted tokens are tested against two deliberately wrong
// references, each of which must be rejected: the softmax of the logits
// without the scales (Σ h_k q_vk), and — where the caller's coarse codes
// (int8 codes within ±2..3, e4m3 codes within the subnormals) move the
// distribution far from the original weights' — the softmax of the original
// fp32 weights. Seeds are fixed, so every run sees the same samples.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "../common/context.h"
#include "../common/fp8_reference.h"
#include "flashspec.h"
#include "reference_sampler.h"
#include "stats.h"
#include "verify_fixture.h"

namespace {

using fstest::Distribution;
using fstest::Verdict;

constexpr int kHidden = 8;
constexpr uint64_t kSeed = 0x0815eedULL;

// How the head's codes come about.
enum class Mode {
  kCoarseCodes,    // the caller's codes and scales, coarse on most rows
  kQuantisedHere,  // fp32 weights quantised by the library (flashspec.h's rule)
};

// The logits a reference uses.
enum class Reference {
  kDequantised,  // s_v · Σ h_k q_vk: the head's (correct)
  kUnscaled,     // Σ h_k q_vk: the scales ignored (wrong)
  kOriginal,     // Σ h_k w_vk of the fp32 weights before quantisation (wrong)
};

const char* reference_name(Reference r) {
  return r == Reference::kDequantised ? "dequantised" : r == Reference::kUnscaled ? "unscaled" : "original fp32";
}

// A target model: original fp32 weights W [V, d], the 8-bit codes and row
// scales of the head, and the exact logits of each reference.
struct Model {
  int vocab;
  flashspec_dtype stored;
  Mode mode;
  std::vector<float> weight;  // [V, d]
  std::vector<uint8_t> codes;  // [V, d]
  std::vector<float> scales;   // [V]

  Model(int v, flashspec_dtype t, Mode m, std::mt19937_64& rng)
      : vocab(v), stored(t), mode(m), weight(size_t(v) * kHidden), codes(size_t(v) * kHidden), scales(size_t(v)) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& w : weight) w = normal(rng);
    const bool e4m3 = stored == FLASHSPEC_DTYPE_E4M3;
    for (int i = 0; i < vocab; ++i) {
      const float* w = weight.data() + size_t(i) * kHidden;
      float amax = 0.0f;
      for (int k = 0; k < kHidden; ++k) amax = std::max(amax, std::fabs(w[k]));
      // The largest code magnitude of the row: the rule's (448 or 127), or
      // on two rows of three a coarse one (int8 ±2 or ±3; e4m3 7 · 2^-9, the
      // largest subnormal, so the row has 15 levels).
      float top = e4m3 ? 448.0f : 127.0f;
      if (mode == Mode::kCoarseCodes && i % 3 != 2) top = e4m3 ? std::ldexp(7.0f, -9) : float(2 + i % 3);
      scales[size_t(i)] = amax / top;
      for (int k = 0; k < kHidden; ++k) {
        const float x = w[k] / scales[size_t(i)];
        codes[size_t(i) * kHidden + k] =
            e4m3 ? fstest::nearest_e4m3_reference(x)
                 : uint8_t(int8_t(std::clamp(std::nearbyint(double(x)), -127.0, 127.0)));
      }
    }
  }

  double code_value(int i, int k) const {
    const uint8_t c = codes[size_t(i) * kHidden + k];
    return stored == FLASHSPEC_DTYPE_E4M3 ? fstest::e4m3_reference(c) : fstest::i8_reference(c);
  }

  // Row i of the dequantised weights, s_i · q_i.
  std::vector<double> dequantised_row(int i) const {
    std::vector<double> row(kHidden);
    for (int k = 0; k < kHidden; ++k) row[size_t(k)] = double(scales[size_t(i)]) * code_value(i, k);
    return row;
  }

  std::vector<double> logits(const float* hidden, Reference reference = Reference::kDequantised) const {
    std::vector<double> l(static_cast<size_t>(vocab));
    for (int i = 0; i < vocab; ++i) {
      double acc = 0.0;
      for (int k = 0; k < kHidden; ++k)
        acc += double(hidden[k]) * (reference == Reference::kOriginal ? double(weight[size_t(i) * kHidden + k])
                                                                       : code_value(i, k));
      l[size_t(i)] = reference == Reference::kDequantised ? double(scales[size_t(i)]) * acc : acc;
    }
    return l;
  }
};

// As test_exactness.cc's confident_row, on the dequantised weights: one
// random token holds about half the mass, so chains of accepted drafts and
// the bonus position are reached.
std::vector<float> confident_row(const Model& model, double temperature, std::mt19937_64& rng) {
  std::vector<float> h = fstest::random_hidden(rng, 1.5 * temperature, kHidden);
  const int top = int(std::uniform_int_distribution<int>(0, model.vocab - 1)(rng));
  const std::vector<double> w = model.dequantised_row(top);
  double norm2 = 0.0;
  for (double x : w) norm2 += x * x;
  const double margin = (std::log(double(model.vocab)) + 1.0) * temperature;
  for (int k = 0; k < kHidden; ++k) h[size_t(k)] += float(margin * w[size_t(k)] / norm2);
  return h;
}

class QuantizedExactnessTest : public fstest::VerifyFixture {
 protected:
  QuantizedExactnessTest() : VerifyFixture(kHidden, kSeed) {}

  void upload(const Model& model) {
    flashspec_lm_head_destroy(head_);
    head_ = nullptr;
    if (model.mode == Mode::kQuantisedHere) {
      const flashspec_tensor w = flashspec_tensor_make(model.weight.data(), FLASHSPEC_DTYPE_F32,
                                                       FLASHSPEC_MEMORY_HOST, model.vocab, kHidden);
      FS_CHECK(flashspec_lm_head_create_quantized(ctx_, &w, nullptr, model.stored, FLASHSPEC_LM_HEAD_COPY, &head_));
    } else {
      const flashspec_tensor q =
          flashspec_tensor_make(model.codes.data(), model.stored, FLASHSPEC_MEMORY_HOST, model.vocab, kHidden);
      const flashspec_tensor s =
          flashspec_tensor_make(model.scales.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, model.vocab, 1);
      FS_CHECK(flashspec_lm_head_create_quantized(ctx_, &q, &s, model.stored, FLASHSPEC_LM_HEAD_COPY, &head_));
    }
    ASSERT_EQ(flashspec_lm_head_dtype(head_), model.stored);
  }
};

struct Config {
  flashspec_dtype stored;
  Mode mode;
  float temperature;
  bool stochastic;
  int trials;
};

constexpr int kVocab = 16;

std::string config_name(const Config& c) {
  char name[96];
  std::snprintf(name, sizeof name, "%s_%s_T%g_%s", c.stored == FLASHSPEC_DTYPE_E4M3 ? "e4m3" : "i8",
                c.mode == Mode::kCoarseCodes ? "coarse_codes" : "quantised_here", double(c.temperature),
                c.stochastic ? "stochastic" : "greedy");
  std::string s = name;
  for (char& ch : s)
    if (ch == '.') ch = 'p';
  return s;
}

// The wrong references a configuration must reject: the unscaled logits
// always; the original weights where the codes are coarse.
std::vector<Reference> wrong_references(const Config& c) {
  if (c.mode == Mode::kCoarseCodes) return {Reference::kUnscaled, Reference::kOriginal};
  return {Reference::kUnscaled};
}

// --- Per position: fixed target rows, so emitted token k ~ p_{k−1} ----------

class QuantizedPerPositionTest : public QuantizedExactnessTest, public ::testing::WithParamInterface<Config> {};

TEST_P(QuantizedPerPositionTest, EveryPositionMatchesTheDequantisedTarget) {
  const Config c = GetParam();
  const int V = kVocab, max_drafts = 3;
  const float draft_temperature = 0.8f;
  std::mt19937_64 rng(2000 + uint64_t(c.stored) * 13 + uint64_t(c.mode) * 5 + (c.stochastic ? 1 : 0));
  Model model(V, c.stored, c.mode, rng);
  ASSERT_NO_FATAL_FAILURE(upload(model));

  // Fixed target rows h_0..h_3; the draft model's logits are the target's
  // (dequantised) plus noise.
  std::vector<std::vector<float>> target_rows, draft_logit_rows;
  std::vector<Distribution> q;
  std::normal_distribution<double> noise(0.0, 0.7);
  for (int j = 0; j <= max_drafts; ++j) {
    target_rows.push_back(confident_row(model, c.temperature, rng));
    if (j < max_drafts) {
      const std::vector<double> l = model.logits(target_rows.back().data());
      std::vector<float> z(static_cast<size_t>(V));
      std::vector<double> zd(static_cast<size_t>(V));
      for (int i = 0; i < V; ++i) zd[size_t(i)] = double(z[size_t(i)] = float(l[size_t(i)] + noise(rng)));
      draft_logit_rows.push_back(z);
      q.push_back(fstest::softmax(zd, draft_temperature));
    }
  }
  auto target = [&](Reference reference) {
    std::vector<Distribution> p;
    for (const auto& row : target_rows) p.push_back(fstest::softmax(model.logits(row.data(), reference), c.temperature));
    return p;
  };

  // Trial t drafts t mod 4 tokens: sampled from q, or the draft model's
  // argmax with every fifth trial on a token drawn from q.
  std::vector<std::vector<int>> draft_tokens(static_cast<size_t>(c.trials));
  for (size_t t = 0; t < draft_tokens.size(); ++t)
    for (int j = 0; j < int(t % (max_drafts + 1)); ++j) {
      const Distribution& qj = q[size_t(j)];
      const bool draw = c.stochastic || t % 5 == 4;
      draft_tokens[t].push_back(draw ? fstest::sample(qj, rng) : int(std::max_element(qj.begin(), qj.end()) - qj.begin()));
    }

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
    ASSERT_NO_FATAL_FAILURE(verify(tokens, rows, logits, V, c.temperature, draft_temperature, 0, ids, &part));
    emitted.insert(emitted.end(), part.begin(), part.end());
  }

  // Every emitted token at index k against p_k; the bonus token after n
  // accepted drafts against p_n on its own.
  auto tally = [&](const std::vector<Distribution>& p) {
    Verdict verdict;
    std::vector<std::vector<int64_t>> at(max_drafts + 1, std::vector<int64_t>(size_t(V), 0));
    std::vector<std::vector<int64_t>> bonus(max_drafts + 1, std::vector<int64_t>(size_t(V), 0));
    for (size_t t = 0; t < emitted.size(); ++t) {
      const auto& e = emitted[t];
      for (size_t k = 0; k < e.size(); ++k) ++at[k][size_t(e[k])];
      if (e.size() == draft_tokens[t].size() + 1) ++bonus[e.size() - 1][size_t(e.back())];
    }
    for (int k = 0; k <= max_drafts; ++k) verdict.add("position " + std::to_string(k + 1), at[size_t(k)], p[size_t(k)]);
    for (int k = 0; k <= max_drafts; ++k)
      verdict.add("bonus after " + std::to_string(k) + " drafts", bonus[size_t(k)], p[size_t(k)]);
    return verdict;
  };
  const Verdict library = tally(target(Reference::kDequantised));
  std::printf("FlashSpec %s against the dequantised target:\n%s", config_name(c).c_str(), library.detail.c_str());
  EXPECT_FALSE(library.rejects()) << library.detail;

  // The same tokens and statistics must reject the wrong references.
  for (Reference wrong : wrong_references(c)) {
    const Verdict verdict = tally(target(wrong));
    std::printf("the same tokens against the %s target:\n%s", reference_name(wrong), verdict.detail.c_str());
    EXPECT_TRUE(verdict.rejects()) << "the tests failed to reject the " << reference_name(wrong) << " target\n"
                                   << verdict.detail;
  }
}

std::vector<Config> per_position_configs() {
  std::vector<Config> configs;
  for (flashspec_dtype stored : {FLASHSPEC_DTYPE_I8, FLASHSPEC_DTYPE_E4M3})
    for (Mode mode : {Mode::kCoarseCodes, Mode::kQuantisedHere})
      for (bool stochastic : {false, true})
        configs.push_back({stored, mode, mode == Mode::kCoarseCodes ? 1.0f : 0.5f, stochastic, 20000});
  return configs;
}

INSTANTIATE_TEST_SUITE_P(Grid, QuantizedPerPositionTest, ::testing::ValuesIn(per_position_configs()),
                         [](const ::testing::TestParamInfo<Config>& info) { return config_name(info.param); });

// --- Joint distribution of the first two emitted tokens -------------------
// As test_exactness.cc's JointTest: the hidden row after token a is
// context_rows[a], P(y1 = a, y2 = b) = p(a | start) p(b | a); a request that
// stopped after one token continues with a bonus-only call.

class QuantizedJointTest : public QuantizedExactnessTest, public ::testing::WithParamInterface<Config> {};

TEST_P(QuantizedJointTest, FirstTwoTokensMatchTheDequantisedTarget) {
  const Config c = GetParam();
  const int V = kVocab;
  const float draft_temperature = 1.0f;
  std::mt19937_64 rng(6000 + uint64_t(c.stored) * 13 + uint64_t(c.mode) * 5 + (c.stochastic ? 1 : 0));
  Model model(V, c.stored, c.mode, rng);
  ASSERT_NO_FATAL_FAILURE(upload(model));

  const std::vector<float> start_row = fstest::random_hidden(rng, 2.5, kHidden);
  std::vector<std::vector<float>> context_rows(static_cast<size_t>(V));
  for (auto& row : context_rows) row = fstest::random_hidden(rng, 2.5, kHidden);
  auto joint_of = [&](Reference reference) {
    const Distribution p_start = fstest::softmax(model.logits(start_row.data(), reference), c.temperature);
    Distribution joint(size_t(V) * size_t(V));
    for (int a = 0; a < V; ++a) {
      const Distribution p_after = fstest::softmax(model.logits(context_rows[size_t(a)].data(), reference), c.temperature);
      for (int b = 0; b < V; ++b) joint[size_t(a * V + b)] = p_start[size_t(a)] * p_after[size_t(b)];
    }
    return joint;
  };

  // Draft model: its own logits per context (index V is the start).
  std::normal_distribution<double> noise(0.0, 1.5);
  std::vector<std::vector<float>> draft_z(static_cast<size_t>(V) + 1);
  std::vector<Distribution> q_after(static_cast<size_t>(V) + 1);
  for (int a = 0; a <= V; ++a) {
    const std::vector<double> l = model.logits(a == V ? start_row.data() : context_rows[size_t(a)].data());
    std::vector<double> zd(static_cast<size_t>(V));
    draft_z[size_t(a)].resize(size_t(V));
    for (int i = 0; i < V; ++i) zd[size_t(i)] = double(draft_z[size_t(a)][size_t(i)] = float(0.7 * l[size_t(i)] + noise(rng)));
    q_after[size_t(a)] = fstest::softmax(zd, draft_temperature);
  }
  auto greedy_draft = [&](int context) {
    const auto& z = draft_z[size_t(context)];
    return int(std::max_element(z.begin(), z.end()) - z.begin());
  };

  std::vector<std::vector<int>> drafts(static_cast<size_t>(c.trials));
  for (size_t t = 0; t < drafts.size(); ++t) {
    auto& x = drafts[t];
    x.push_back(c.stochastic ? fstest::sample(q_after[size_t(V)], rng) : greedy_draft(V));
    if (t % 2) x.push_back(c.stochastic ? fstest::sample(q_after[size_t(x[0])], rng) : greedy_draft(x[0]));
  }

  std::vector<int64_t> counts(size_t(V) * size_t(V), 0);
  ASSERT_NO_FATAL_FAILURE(count_first_two(drafts, start_row, context_rows, draft_z, c.stochastic, V, c.temperature,
                                          draft_temperature, &counts));
  Verdict library;
  library.add("joint (y1, y2)", counts, joint_of(Reference::kDequantised));
  std::printf("FlashSpec joint %s against the dequantised target:\n%s", config_name(c).c_str(), library.detail.c_str());
  EXPECT_FALSE(library.rejects()) << library.detail;

  for (Reference wrong : wrong_references(c)) {
    Verdict verdict;
    verdict.add("joint (y1, y2)", counts, joint_of(wrong));
    std::printf("the same tokens against the %s target:\n%s", reference_name(wrong), verdict.detail.c_str());
    EXPECT_TRUE(verdict.rejects()) << "the joint test failed to reject the " << reference_name(wrong) << " target\n"
                                   << verdict.detail;
  }
}

std::vector<Config> joint_configs() {
  std::vector<Config> configs;
  for (flashspec_dtype stored : {FLASHSPEC_DTYPE_I8, FLASHSPEC_DTYPE_E4M3})
    for (bool stochastic : {false, true}) configs.push_back({stored, Mode::kCoarseCodes, 1.0f, stochastic, 40000});
  return configs;
}

INSTANTIATE_TEST_SUITE_P(Grid, QuantizedJointTest, ::testing::ValuesIn(joint_configs()),
                         [](const ::testing::TestParamInfo<Config>& info) { return config_name(info.param); });

}  // namespace
