// Exactness of tree verify (flashspec.h, "Tree verify"): with point-mass
// drafts that form a tree — several candidates at the root, repeated sibling
// tokens, grandchildren — the joint distribution of the first two emitted
// tokens equals the target's, P(a, b) = p(a | start) p(b | a). The target is
// context-dependent (the row after token a is context_rows[a]); when the
// first token leaves the tree, the second comes from a second, bonus-only
// call, as a decoding loop does. Wrong walks with the same number of trials
// are rejected. Also: T = 0 follows greedy decoding, the accepted path's
// node indices, and bad parents refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "../common/context.h"
#include "flashspec.h"
#include "reference_sampler.h"
#include "stats.h"

namespace {

using fstest::Distribution;

constexpr int kHidden = 8;
constexpr int kVocab = 12;
constexpr double kAlpha = 0.001;

struct Tree {
  std::vector<int32_t> tokens, parents;
  std::vector<std::vector<float>> rows;  // root row, then one per node
};

class TreeVerify : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto options = fstest::ContextOptions().seed(123).max_rows(1 << 16).max_requests(1 << 14);
    ASSERT_EQ(fstest::create_context(options, &ctx_), FLASHSPEC_OK);
    std::mt19937_64 rng(8);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    weight_.resize(size_t(kVocab) * kHidden);
    for (float& w : weight_) w = normal(rng);
    flashspec_tensor w = flashspec_tensor_make(weight_.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, kVocab, kHidden);
    ASSERT_EQ(flashspec_lm_head_create(ctx_, &w, FLASHSPEC_LM_HEAD_COPY, &head_), FLASHSPEC_OK);
    auto row = [&](float scale) {
      std::vector<float> h(kHidden);
      for (float& x : h) x = normal(rng) * scale;
      return h;
    };
    start_ = row(1.2f);
    for (int a = 0; a < kVocab; ++a) after_.push_back(row(1.2f));
    for (int a = 0; a < kVocab * kVocab; ++a) after2_.push_back(row(1.2f));
  }
  void TearDown() override {
    flashspec_lm_head_destroy(head_);
    flashspec_context_destroy(ctx_);
  }

  Distribution p_of(const std::vector<float>& h, double temperature) const {
    std::vector<double> l(kVocab);
    for (int i = 0; i < kVocab; ++i) {
      double acc = 0.0;
      for (int k = 0; k < kHidden; ++k) acc += double(weight_[size_t(i) * kHidden + k]) * double(h[size_t(k)]);
      l[size_t(i)] = acc;
    }
    Distribution p(kVocab);
    if (temperature == 0.0) {
      p[size_t(std::max_element(l.begin(), l.end()) - l.begin())] = 1.0;
      return p;
    }
    const double m = *std::max_element(l.begin(), l.end());
    double sum = 0.0;
    for (int i = 0; i < kVocab; ++i) sum += (p[size_t(i)] = std::exp((l[size_t(i)] - m) / temperature));
    for (double& v : p) v /= sum;
    return p;
  }

  // Verifies trees (one request each, request ids from id0) at temperature
  // T; returns the emitted tokens and accepted node indices per request.
  void verify(const std::vector<Tree>& trees, float temperature, uint64_t id0, std::vector<std::vector<int>>* emitted,
              std::vector<std::vector<int>>* nodes) {
    emitted->clear();
    nodes->clear();
    const size_t chunk = 2000;
    for (size_t start = 0; start < trees.size(); start += chunk) {
      const std::vector<Tree> part(trees.begin() + long(start), trees.begin() + long(std::min(trees.size(), start + chunk)));
      std::vector<std::vector<int>> e, n;
      ASSERT_NO_FATAL_FAILURE(verify_chunk(part, temperature, id0 + start, &e, &n));
      emitted->insert(emitted->end(), e.begin(), e.end());
      nodes->insert(nodes->end(), n.begin(), n.end());
    }
  }

  void verify_chunk(const std::vector<Tree>& trees, float temperature, uint64_t id0,
                    std::vector<std::vector<int>>* emitted, std::vector<std::vector<int>>* nodes) {
    const int R = int(trees.size());
    std::vector<int32_t> offsets(1, 0), tokens, parents;
    std::vector<float> hidden;
    std::vector<uint64_t> ids;
    for (const Tree& t : trees) {
      tokens.insert(tokens.end(), t.tokens.begin(), t.tokens.end());
      parents.insert(parents.end(), t.parents.begin(), t.parents.end());
      offsets.push_back(int32_t(tokens.size()));
      for (const auto& h : t.rows) hidden.insert(hidden.end(), h.begin(), h.end());
      ids.push_back(id0 + ids.size());
    }
    const int rows = int(hidden.size() / kHidden);
    std::vector<float> temperatures(size_t(R), temperature);
    flashspec_tensor target = flashspec_tensor_make(hidden.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, rows, kHidden);
    flashspec_verify_batch batch;
    flashspec_verify_batch_init(&batch);
    batch.num_requests = R;
    batch.draft_offsets = offsets.data();
    batch.draft_tokens = tokens.data();
    batch.draft_parents = parents.data();
    batch.target_hidden = &target;
    batch.temperatures = temperatures.data();
    batch.request_ids = ids.data();
    std::vector<int32_t> accepted(static_cast<size_t>(R)), out(static_cast<size_t>(rows)), path(static_cast<size_t>(rows));
    flashspec_verify_result result;
    flashspec_verify_result_init(&result);
    result.accepted_counts = accepted.data();
    result.emitted_tokens = out.data();
    result.accepted_nodes = path.data();
    ASSERT_EQ(flashspec_verify_and_finalize(ctx_, head_, &batch, &result), FLASHSPEC_OK) << flashspec_context_last_error(ctx_);
    emitted->clear();
    nodes->clear();
    for (int r = 0; r < R; ++r) {
      const int first = offsets[size_t(r)] + r, n = offsets[size_t(r) + 1] - offsets[size_t(r)];
      ASSERT_GE(accepted[size_t(r)], 0);
      ASSERT_LE(accepted[size_t(r)], n);
      emitted->emplace_back(out.begin() + first, out.begin() + first + accepted[size_t(r)] + 1);
      nodes->emplace_back(path.begin() + first, path.begin() + first + accepted[size_t(r)]);
      // The path is a path of the tree, its tokens the emitted ones.
      int parent = -1;
      for (int k = 0; k < accepted[size_t(r)]; ++k) {
        const int node = nodes->back()[size_t(k)];
        ASSERT_EQ(trees[size_t(r)].parents[size_t(node)], parent);
        ASSERT_EQ(trees[size_t(r)].tokens[size_t(node)], emitted->back()[size_t(k)]);
        parent = node;
      }
      for (int k = accepted[size_t(r)]; k <= n; ++k) ASSERT_EQ(path[size_t(first + k)], -1);
      for (int k = accepted[size_t(r)] + 1; k <= n; ++k) ASSERT_EQ(out[size_t(first + k)], -1);
    }
  }

  // A tree over the context model: at the root, `width` candidate tokens
  // (a repeated sibling included), each with two children.
  Tree random_tree(std::mt19937_64& rng, int width) {
    Tree t;
    t.rows.push_back(start_);
    std::vector<int> firsts;
    for (int c = 0; c < width; ++c) {
      const int a = c == width - 1 && width > 1 ? t.tokens[0] : int(rng() % kVocab);  // last repeats the first
      firsts.push_back(int(t.tokens.size()));
      t.tokens.push_back(a);
      t.parents.push_back(-1);
      t.rows.push_back(after_[size_t(a)]);
    }
    for (int f : firsts)
      for (int c = 0; c < 2; ++c) {
        const int a = t.tokens[size_t(f)], b = int(rng() % kVocab);
        t.tokens.push_back(b);
        t.parents.push_back(f);
        t.rows.push_back(after2_[size_t(a * kVocab + b)]);
      }
    return t;
  }

  flashspec_context* ctx_ = nullptr;
  flashspec_lm_head* head_ = nullptr;
  std::vector<float> weight_, start_;
  std::vector<std::vector<float>> after_, after2_;
};

class TreeJoint : public TreeVerify, public ::testing::WithParamInterface<float> {};

TEST_P(TreeJoint, FirstTwoTokensFollowTheTarget) {
  const float T = GetParam();
  const int trials = 30000;
  std::mt19937_64 rng(uint64_t(T * 100) + 5);
  const Distribution p_start = p_of(start_, T);
  std::vector<Distribution> p_after;
  for (int a = 0; a < kVocab; ++a) p_after.push_back(p_of(after_[size_t(a)], T));
  Distribution joint(size_t(kVocab) * kVocab);
  for (int a = 0; a < kVocab; ++a)
    for (int b = 0; b < kVocab; ++b) joint[size_t(a * kVocab + b)] = p_start[size_t(a)] * p_after[size_t(a)][size_t(b)];

  std::vector<Tree> trees;
  for (int t = 0; t < trials; ++t) trees.push_back(random_tree(rng, 1 + t % 4));
  std::vector<std::vector<int>> emitted, nodes;
  ASSERT_NO_FATAL_FAILURE(verify(trees, T, 0, &emitted, &nodes));
  // Requests whose first token left the tree: a second, bonus-only call with
  // the row after that token.
  std::vector<Tree> seconds;
  std::vector<size_t> which;
  for (size_t t = 0; t < emitted.size(); ++t)
    if (emitted[t].size() == 1) {
      seconds.push_back(Tree{{}, {}, {after_[size_t(emitted[t][0])]}});
      which.push_back(t);
    }
  std::vector<std::vector<int>> second_emitted, second_nodes;
  ASSERT_NO_FATAL_FAILURE(verify(seconds, T, 1u << 20, &second_emitted, &second_nodes));
  for (size_t k = 0; k < which.size(); ++k) emitted[which[k]].push_back(second_emitted[k][0]);
  ASSERT_GT(which.size(), size_t(trials / 20));
  ASSERT_LT(which.size(), size_t(trials - trials / 20));

  auto verdict = [&](const std::vector<std::vector<int>>& pairs, const char* name) {
    std::vector<int64_t> counts(joint.size(), 0);
    for (const auto& e : pairs) ++counts[size_t(e[0] * kVocab + e[1])];
    const auto chi = fstest::chi_square(counts, joint);
    const auto ks = fstest::kolmogorov_smirnov(counts, joint);
    std::printf("%s T=%g: chi2=%.2f df=%d p=%.3g  KS D=%.4f p=%.3g\n", name, double(T), chi.statistic,
                chi.degrees_of_freedom, chi.p_value, ks.distance, ks.p_value);
    return std::min(chi.p_value, ks.p_value) < kAlpha / 2;
  };
  EXPECT_FALSE(verdict(emitted, "FlashSpec tree verify"));

  // Wrong walks, same trees, same trials: each must be rejected.
  std::mt19937_64 wrong_rng(99);
  auto walk = [&](int bug) {
    std::vector<std::vector<int>> pairs;
    for (const Tree& t : trees) {
      const int a = fstest::sample(p_start, wrong_rng);
      int child = -1;
      for (size_t k = 0; k < t.tokens.size() && child < 0; ++k)
        if (t.parents[k] == -1 && t.tokens[k] == a) child = int(k);
      const Distribution* second = &p_after[size_t(a)];
      if (bug == 0 && child >= 0) second = &p_start;  // the child's token drawn from the parent's row
      if (bug == 1 && child >= 0) second = &p_after[size_t(t.tokens[0])];  // always the first child's context
      if (bug == 2 && child < 0) second = &p_start;  // after leaving the tree, the next token from the root row
      pairs.push_back({a, fstest::sample(*second, wrong_rng)});
    }
    return pairs;
  };
  EXPECT_TRUE(verdict(walk(0), "wrong: child drawn from the parent's row"));
  EXPECT_TRUE(verdict(walk(1), "wrong: always the first child's context"));
  EXPECT_TRUE(verdict(walk(2), "wrong: bonus from the root row"));
}

INSTANTIATE_TEST_SUITE_P(Temperatures, TreeJoint, ::testing::Values(0.7f, 1.0f, 1.6f));

TEST_F(TreeVerify, TemperatureZeroFollowsGreedyDecoding) {
  std::mt19937_64 rng(3);
  std::vector<Tree> trees;
  for (int t = 0; t < 200; ++t) trees.push_back(random_tree(rng, 1 + t % 5));
  std::vector<std::vector<int>> emitted, nodes;
  ASSERT_NO_FATAL_FAILURE(verify(trees, 0.0f, 0, &emitted, &nodes));
  int deep = 0;
  for (size_t t = 0; t < trees.size(); ++t) {
    // Greedy decoding: the argmax at the root, then at the row after it.
    const Distribution p0 = p_of(start_, 0.0);
    const int a = int(std::max_element(p0.begin(), p0.end()) - p0.begin());
    ASSERT_EQ(emitted[t][0], a);
    if (emitted[t].size() > 1) {
      const Distribution p1 = p_of(after_[size_t(a)], 0.0);
      EXPECT_EQ(emitted[t][1], int(std::max_element(p1.begin(), p1.end()) - p1.begin()));
      // A repeated sibling: the first child of that token is taken.
      EXPECT_EQ(trees[t].tokens[size_t(nodes[t][0])], a);
      for (int k = 0; k < nodes[t][0]; ++k)
        EXPECT_FALSE(trees[t].parents[size_t(k)] == -1 && trees[t].tokens[size_t(k)] == a);
      ++deep;
    }
  }
  EXPECT_GT(deep, 0);
}

TEST_F(TreeVerify, BadParentsAreRefused) {
  std::vector<int32_t> offsets = {0, 3}, tokens = {1, 2, 3}, parents = {-1, 0, 2};
  std::vector<float> hidden(4 * kHidden, 0.1f);
  flashspec_tensor target = flashspec_tensor_make(hidden.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, 4, kHidden);
  flashspec_verify_batch batch;
  flashspec_verify_batch_init(&batch);
  batch.num_requests = 1;
  batch.draft_offsets = offsets.data();
  batch.draft_tokens = tokens.data();
  batch.draft_parents = parents.data();
  batch.target_hidden = &target;
  std::vector<int32_t> accepted(1, 5), out(4, 5);
  flashspec_verify_result result;
  flashspec_verify_result_init(&result);
  result.accepted_counts = accepted.data();
  result.emitted_tokens = out.data();
  for (int32_t bad : {2, 3, -2}) {
    parents[2] = bad;
    EXPECT_EQ(flashspec_verify_and_finalize(ctx_, head_, &batch, &result), FLASHSPEC_ERR_OUT_OF_RANGE);
    EXPECT_EQ(std::string(flashspec_context_last_error(ctx_)).rfind("batch->draft_parents", 0), 0u)
        << flashspec_context_last_error(ctx_);
    EXPECT_EQ(out, std::vector<int32_t>(4, 5));
  }
  parents[2] = 1;
  std::vector<float> q(3 * kVocab, 0.0f);
  flashspec_tensor logits = flashspec_tensor_make(q.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, 3, kVocab);
  batch.draft_logits = &logits;  // a stochastic tree (test_stochastic_tree_exactness.cc)
  EXPECT_EQ(flashspec_verify_and_finalize(ctx_, head_, &batch, &result), FLASHSPEC_OK) << flashspec_context_last_error(ctx_);
  batch.draft_logits = nullptr;
  EXPECT_EQ(flashspec_verify_and_finalize(ctx_, head_, &batch, &result), FLASHSPEC_OK) << flashspec_context_last_error(ctx_);
}

}  // namespace
