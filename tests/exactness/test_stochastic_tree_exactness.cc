// Exactness of stochastic drafts with sparse q and of stochastic
// multi-candidate trees (flashspec.h, "Sparse draft distributions" and "Tree
// verify"). A decoding loop over a context-dependent target (V = 6, the row
// after each prefix of up to three tokens its own hidden row) drafts, per
// request, a tree of depth ≤ 3 − |prefix| and width ≤ 3 whose children are
// sampled i.i.d. from the drafter's q of their parent's prefix (dense logits,
// or a top-4 support), mixed in one ragged batch with stochastic chains,
// point-mass trees (supports {x} with q = 1) and bonus-only requests; it
// verifies, appends the emitted tokens and goes on until every trial has
// three tokens. The law of those three tokens, over all 216 outcomes, must be
// the target's, P(a, b, c) = p(a) p(b | a) p(c | ab) in float64, whatever
// depth the tree walks reached. Wrong walks over the same trees with the
// same number of trials must be rejected. Also: T = 0 follows greedy
// decoding, and a stochastic chain given as a tree emits what Algorithm 1
// emits for it, token for token.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "../common/context.h"
#include "flashspec.h"
#include "reference_sampler.h"
#include "stats.h"

namespace {

using fstest::Distribution;
using fstest::Verdict;

constexpr int kHidden = 8;
constexpr int kVocab = 6;
constexpr int kTokens = 3;   // tokens per trial whose joint law is tested
constexpr int kSupport = 4;  // the sparse drafter's top-k
constexpr int kPrefixes = 1 + kVocab + kVocab * kVocab + kVocab * kVocab * kVocab;

enum class QForm { kDense, kSparse };

// How a request's drafts are laid out. kTrees: every request a tree
// (draft_parents given), mixing stochastic trees, stochastic chains, point-
// mass trees (sparse only) and bonus-only requests. kChains: stochastic
// chains without draft_parents (Algorithm 1).
enum class Layout { kTrees, kChains };

// How a simulated walk verifies the children of a node.
enum class Walk {
  kCorrect,            // SpecInfer: r ← norm(max(r − q, 0)) after each rejection
  kNoResidualUpdate,   // every sibling tested against p; the final sample from norm(max(p − q_last, 0))
  kUnnormalisedResidual,  // r ← max(r − q, 0) without renormalising before the next sibling
  kDenseQForSparse,    // a sparse drafter's ratio and residual computed from its untruncated q
};

int prefix_id(const std::vector<int>& prefix) {
  int id = 0, base = 0, width = 1;
  for (size_t len = 0; len < prefix.size(); ++len) {
    base += width;
    width *= kVocab;
  }
  for (int t : prefix) id = id * kVocab + t;
  return base + id;
}

struct Tree {
  std::vector<int32_t> tokens, parents;
  std::vector<int> node_prefix;      // prefix id of the row after each node
  std::vector<int> drafted_from;     // prefix id whose q each node was drawn from
  std::vector<bool> point_mass;      // node drafted as a point mass (support {x})
};

class StochasticTree : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto options = fstest::ContextOptions().seed(77).max_rows(1 << 16).max_requests(1 << 14);
    ASSERT_EQ(fstest::create_context(options, &ctx_), FLASHSPEC_OK);
    std::mt19937_64 rng(21);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    weight_.resize(size_t(kVocab) * kHidden);
    for (float& w : weight_) w = normal(rng);
    flashspec_tensor w = flashspec_tensor_make(weight_.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, kVocab, kHidden);
    ASSERT_EQ(flashspec_lm_head_create(ctx_, &w, FLASHSPEC_LM_HEAD_COPY, &head_), FLASHSPEC_OK);
    hidden_.resize(size_t(kPrefixes) * kHidden);
    for (float& h : hidden_) h = normal(rng) * 0.6f;
    // The drafter: the target's logits plus noise, so that trees are often
    // accepted deep and q still differs from p everywhere.
    draft_logits_.resize(size_t(kPrefixes) * kVocab);
    for (int id = 0; id < kPrefixes; ++id)
      for (int i = 0; i < kVocab; ++i) {
        double l = 0.0;
        for (int k = 0; k < kHidden; ++k)
          l += double(weight_[size_t(i) * kHidden + k]) * double(hidden_[size_t(id) * kHidden + k]);
        draft_logits_[size_t(id) * kVocab + size_t(i)] = float(l) + normal(rng) * 0.8f;
      }
    for (int id = 0; id < kPrefixes; ++id) {
      q_full_.push_back(softmax(&draft_logits_[size_t(id) * kVocab], 1.0));
      q_top_.push_back(top_k(q_full_.back()));
    }
  }
  void TearDown() override {
    flashspec_lm_head_destroy(head_);
    flashspec_context_destroy(ctx_);
  }

  static Distribution softmax(const float* z, double temperature) {
    Distribution p(kVocab);
    const double m = *std::max_element(z, z + kVocab);
    double sum = 0.0;
    for (int i = 0; i < kVocab; ++i) sum += (p[size_t(i)] = std::exp((double(z[i]) - m) / temperature));
    for (double& v : p) v /= sum;
    return p;
  }

  // q truncated to its kSupport most likely tokens and renormalised: what
  // the sparse drafter samples from.
  static Distribution top_k(const Distribution& q) {
    std::vector<int> order(kVocab);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return q[size_t(a)] > q[size_t(b)]; });
    Distribution t(kVocab);
    double sum = 0.0;
    for (int i = 0; i < kSupport; ++i) sum += (t[size_t(order[size_t(i)])] = q[size_t(order[size_t(i)])]);
    for (double& v : t) v /= sum;
    return t;
  }

  // The target after prefix `id` at temperature T (T = 0: the argmax).
  Distribution p_of(int id, double temperature) const {
    std::vector<double> l(kVocab);
    for (int i = 0; i < kVocab; ++i) {
      double acc = 0.0;
      for (int k = 0; k < kHidden; ++k)
        acc += double(weight_[size_t(i) * kHidden + k]) * double(hidden_[size_t(id) * kHidden + k]);
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

  // The q a drafter of this form samples from after prefix `id`.
  const Distribution& drafter_q(QForm form, int id) const { return form == QForm::kDense ? q_full_[size_t(id)] : q_top_[size_t(id)]; }

  // A draft tree after `prefix`, at most `depth` levels deep. Trial kinds
  // (kind % 4): 0 a stochastic tree (root width 1..3, then 0..3, then 0..2),
  // 1 a stochastic chain, 2 a point-mass tree (sparse q; dense: stochastic),
  // 3 a shallow stochastic tree or, one time in three, no drafts.
  Tree make_tree(const std::vector<int>& prefix, int depth, int kind, QForm form, Layout layout,
                 std::mt19937_64& rng) const {
    Tree t;
    if (layout == Layout::kChains) kind = 1;
    if (kind == 3 && rng() % 3 == 0) return t;
    if (kind == 3) depth = std::min(depth, 1);
    const bool chain = kind == 1;
    const bool point_mass = kind == 2 && form == QForm::kSparse;
    struct Open {
      int node;
      int level;
      std::vector<int> path;
    };
    std::vector<Open> open = {{-1, 0, prefix}};
    for (size_t next = 0; next < open.size(); ++next) {
      const Open o = open[next];
      if (o.level >= depth) continue;
      const int width = chain ? (layout == Layout::kChains && rng() % 4 == 0 ? 0 : 1)
                              : o.level == 0 ? 1 + int(rng() % 3) : o.level == 1 ? int(rng() % 4) : int(rng() % 3);
      const int from = prefix_id(o.path);
      for (int c = 0; c < width; ++c) {
        const int token = fstest::sample(drafter_q(form, from), rng);
        std::vector<int> path = o.path;
        path.push_back(token);
        t.tokens.push_back(token);
        t.parents.push_back(o.node);
        t.node_prefix.push_back(prefix_id(path));
        t.drafted_from.push_back(from);
        t.point_mass.push_back(point_mass);
        open.push_back({int(t.tokens.size()) - 1, o.level + 1, path});
      }
    }
    return t;
  }

  // Verifies one tree per prefix in one batch (request ids from id0) and
  // returns each request's emitted tokens; `depths` gets accepted counts.
  void verify(const std::vector<std::vector<int>>& prefixes, const std::vector<Tree>& trees, QForm form, Layout layout,
              float temperature, uint64_t id0, std::vector<std::vector<int>>* emitted, std::vector<int>* depths) {
    const int R = int(trees.size());
    std::vector<int32_t> offsets(1, 0), tokens, parents, support_offsets(1, 0), support_tokens;
    std::vector<float> hidden, logits, support_probs;
    std::vector<uint64_t> ids;
    auto add_row = [&](int id) {
      hidden.insert(hidden.end(), hidden_.begin() + long(id) * kHidden, hidden_.begin() + long(id + 1) * kHidden);
    };
    for (int r = 0; r < R; ++r) {
      const Tree& t = trees[size_t(r)];
      add_row(prefix_id(prefixes[size_t(r)]));
      for (size_t k = 0; k < t.tokens.size(); ++k) {
        tokens.push_back(t.tokens[k]);
        parents.push_back(t.parents[k]);
        add_row(t.node_prefix[k]);
        const int from = t.drafted_from[k];
        if (form == QForm::kDense) {
          logits.insert(logits.end(), draft_logits_.begin() + long(from) * kVocab,
                        draft_logits_.begin() + long(from + 1) * kVocab);
        } else if (t.point_mass[k]) {
          support_tokens.push_back(t.tokens[k]);
          support_probs.push_back(1.0f);
        } else {
          for (int i = 0; i < kVocab; ++i)
            if (q_top_[size_t(from)][size_t(i)] > 0.0) {
              support_tokens.push_back(i);
              support_probs.push_back(float(q_top_[size_t(from)][size_t(i)]));
            }
        }
        support_offsets.push_back(int32_t(support_tokens.size()));
      }
      offsets.push_back(int32_t(tokens.size()));
      ids.push_back(id0 + uint64_t(r));
    }
    const int rows = int(hidden.size() / kHidden);
    std::vector<float> temperatures(size_t(R), temperature);
    flashspec_tensor target = flashspec_tensor_make(hidden.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, rows, kHidden);
    flashspec_tensor q = flashspec_tensor_make(logits.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST,
                                               int64_t(tokens.size()), kVocab);
    flashspec_verify_batch batch;
    flashspec_verify_batch_init(&batch);
    batch.num_requests = R;
    batch.draft_offsets = offsets.data();
    batch.draft_tokens = tokens.data();
    batch.draft_parents = layout == Layout::kTrees ? parents.data() : nullptr;
    batch.target_hidden = &target;
    batch.temperatures = temperatures.data();
    batch.request_ids = ids.data();
    if (form == QForm::kDense && !tokens.empty()) batch.draft_logits = &q;
    if (form == QForm::kSparse) {
      batch.draft_support_offsets = support_offsets.data();
      batch.draft_support_tokens = support_tokens.data();
      batch.draft_support_probs = support_probs.data();
    }
    std::vector<int32_t> accepted(static_cast<size_t>(R)), out(static_cast<size_t>(rows)), path(static_cast<size_t>(rows));
    flashspec_verify_result result;
    flashspec_verify_result_init(&result);
    result.accepted_counts = accepted.data();
    result.emitted_tokens = out.data();
    result.accepted_nodes = path.data();
    ASSERT_EQ(flashspec_verify_and_finalize(ctx_, head_, &batch, &result), FLASHSPEC_OK) << flashspec_context_last_error(ctx_);
    emitted->clear();
    depths->clear();
    for (int r = 0; r < R; ++r) {
      const Tree& t = trees[size_t(r)];
      const int first = offsets[size_t(r)] + r, a = accepted[size_t(r)];
      ASSERT_GE(a, 0);
      ASSERT_LE(a, int(t.tokens.size()));
      emitted->emplace_back(out.begin() + first, out.begin() + first + a + 1);
      depths->push_back(a);
      // The accepted nodes are a path of the tree carrying the emitted tokens.
      int parent = -1;
      for (int k = 0; k < a; ++k) {
        const int node = path[size_t(first + k)];
        ASSERT_EQ(t.parents[size_t(node)], parent);
        ASSERT_EQ(t.tokens[size_t(node)], emitted->back()[size_t(k)]);
        parent = node;
      }
    }
  }

  // The decoding loop: every trial's first kTokens tokens, drafting trees
  // with `form` and verifying them in batches of ragged, mixed requests.
  // depth_seen[d] counts first-round requests that accepted d drafts.
  std::vector<std::vector<int>> decode_library(int trials, QForm form, Layout layout, float temperature, uint64_t seed,
                                               std::vector<int>* depth_seen) {
    std::mt19937_64 rng(seed);
    std::vector<std::vector<int>> seqs(static_cast<size_t>(trials));
    depth_seen->assign(kTokens + 1, 0);
    for (int round = 0;; ++round) {
      std::vector<int> active;
      for (int t = 0; t < trials; ++t)
        if (int(seqs[size_t(t)].size()) < kTokens) active.push_back(t);
      if (active.empty()) break;
      const size_t chunk = 1500;
      for (size_t start = 0; start < active.size(); start += chunk) {
        std::vector<std::vector<int>> prefixes;
        std::vector<Tree> trees;
        for (size_t i = start; i < std::min(active.size(), start + chunk); ++i) {
          const auto& s = seqs[size_t(active[i])];
          prefixes.push_back(s);
          trees.push_back(make_tree(s, kTokens - int(s.size()), active[i] % 4, form, layout, rng));
        }
        std::vector<std::vector<int>> emitted;
        std::vector<int> depths;
        verify(prefixes, trees, form, layout, temperature, uint64_t(round) << 32 | start, &emitted, &depths);
        if (HasFatalFailure()) return {};
        for (size_t i = 0; i < emitted.size(); ++i) {
          auto& s = seqs[size_t(active[start + i])];
          for (int token : emitted[i])
            if (int(s.size()) < kTokens) s.push_back(token);
          if (round == 0) ++(*depth_seen)[size_t(std::min(depths[i], kTokens))];
        }
      }
    }
    return seqs;
  }

  // The same loop with a float64 simulation of a walk over the same kind
  // of trees (its own random numbers).
  std::vector<std::vector<int>> decode_simulated(int trials, QForm form, Layout layout, double temperature,
                                                 uint64_t seed, Walk walk) const {
    std::mt19937_64 rng(seed);
    std::vector<std::vector<int>> seqs(static_cast<size_t>(trials));
    for (int t = 0; t < trials; ++t) {
      auto& s = seqs[size_t(t)];
      while (int(s.size()) < kTokens) {
        const Tree tree = make_tree(s, kTokens - int(s.size()), t % 4, form, layout, rng);
        for (int token : simulate_walk(s, tree, form, temperature, walk, rng))
          if (int(s.size()) < kTokens) s.push_back(token);
      }
    }
    return seqs;
  }

  // One request's emitted tokens under `walk`.
  std::vector<int> simulate_walk(const std::vector<int>& prefix, const Tree& t, QForm form, double temperature, Walk walk,
                                 std::mt19937_64& rng) const {
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    std::vector<int> out;
    int node = -1, row_prefix = prefix_id(prefix);
    for (;;) {
      const Distribution p = p_of(row_prefix, temperature);
      Distribution r = p, last_q;
      int next = -1;
      for (size_t k = 0; k < t.tokens.size() && next < 0; ++k) {
        if (t.parents[k] != node) continue;
        Distribution q(kVocab, 0.0);
        if (t.point_mass[k])
          q[size_t(t.tokens[k])] = 1.0;
        else
          q = (walk == Walk::kDenseQForSparse) ? q_full_[size_t(t.drafted_from[k])] : drafter_q(form, t.drafted_from[k]);
        const int x = t.tokens[k];
        if (uniform(rng) * q[size_t(x)] < r[size_t(x)]) {
          next = int(k);
          break;
        }
        last_q = q;
        if (walk == Walk::kNoResidualUpdate) continue;
        double mass = 0.0;
        for (int i = 0; i < kVocab; ++i) mass += (r[size_t(i)] = std::max(r[size_t(i)] - q[size_t(i)], 0.0));
        if (walk != Walk::kUnnormalisedResidual && mass > 0.0)
          for (double& v : r) v /= mass;
      }
      if (next < 0) {
        if (walk == Walk::kNoResidualUpdate && !last_q.empty())
          for (int i = 0; i < kVocab; ++i) r[size_t(i)] = std::max(p[size_t(i)] - last_q[size_t(i)], 0.0);
        const double mass = std::accumulate(r.begin(), r.end(), 0.0);
        for (double& v : r) v /= mass;
        out.push_back(fstest::sample(r, rng));
        return out;
      }
      out.push_back(t.tokens[size_t(next)]);
      node = next;
      row_prefix = t.node_prefix[size_t(next)];
    }
  }

  Distribution target_law(double temperature) const {
    Distribution law(size_t(kVocab) * kVocab * kVocab);
    const Distribution p0 = p_of(prefix_id({}), temperature);
    for (int a = 0; a < kVocab; ++a) {
      const Distribution p1 = p_of(prefix_id({a}), temperature);
      for (int b = 0; b < kVocab; ++b) {
        const Distribution p2 = p_of(prefix_id({a, b}), temperature);
        for (int c = 0; c < kVocab; ++c)
          law[size_t((a * kVocab + b) * kVocab + c)] = p0[size_t(a)] * p1[size_t(b)] * p2[size_t(c)];
      }
    }
    return law;
  }

  static Verdict judge(const std::vector<std::vector<int>>& seqs, const Distribution& law, const char* name) {
    std::vector<int64_t> counts(law.size(), 0);
    for (const auto& s : seqs) ++counts[size_t((s[0] * kVocab + s[1]) * kVocab + s[2])];
    Verdict v;
    v.add("three tokens", counts, law);
    std::printf("%s:\n%s", name, v.detail.c_str());
    return v;
  }

  flashspec_context* ctx_ = nullptr;
  flashspec_lm_head* head_ = nullptr;
  std::vector<float> weight_, hidden_, draft_logits_;
  std::vector<Distribution> q_full_, q_top_;
};

struct Config {
  QForm form;
  Layout layout;
  float temperature;
};

class StochasticTreeLaw : public StochasticTree, public ::testing::WithParamInterface<Config> {};

TEST_P(StochasticTreeLaw, ThreeTokensFollowTheTarget) {
  const Config c = GetParam();
  const int trials = 40000;
  const Distribution law = target_law(c.temperature);
  std::vector<int> depths;
  const auto seqs = decode_library(trials, c.form, c.layout, c.temperature, 11, &depths);
  ASSERT_FALSE(HasFatalFailure());
  std::printf("first-round accepted depths 0..3: %d %d %d %d\n", depths[0], depths[1], depths[2], depths[3]);
  for (int d = 0; d <= kTokens; ++d) EXPECT_GT(depths[size_t(d)], trials / 100) << "depth " << d << " rarely reached";
  EXPECT_FALSE(judge(seqs, law, "FlashSpec").rejects());
  EXPECT_FALSE(judge(decode_simulated(trials, c.form, c.layout, c.temperature, 12, Walk::kCorrect), law,
                     "float64 SpecInfer walk")
                   .rejects());
  if (c.layout == Layout::kTrees) {
    EXPECT_TRUE(judge(decode_simulated(trials, c.form, c.layout, c.temperature, 13, Walk::kNoResidualUpdate), law,
                      "wrong: siblings tested against p, residual never updated")
                    .rejects());
    EXPECT_TRUE(judge(decode_simulated(trials, c.form, c.layout, c.temperature, 14, Walk::kUnnormalisedResidual), law,
                      "wrong: residual not renormalised between siblings")
                    .rejects());
  }
  if (c.form == QForm::kSparse)
    EXPECT_TRUE(judge(decode_simulated(trials, c.form, c.layout, c.temperature, 15, Walk::kDenseQForSparse), law,
                      "wrong: ratio and residual from the untruncated q")
                    .rejects());
}

INSTANTIATE_TEST_SUITE_P(Grid, StochasticTreeLaw,
                         ::testing::Values(Config{QForm::kDense, Layout::kTrees, 1.0f},
                                           Config{QForm::kSparse, Layout::kTrees, 1.0f},
                                           Config{QForm::kSparse, Layout::kTrees, 0.6f},
                                           Config{QForm::kSparse, Layout::kChains, 1.0f},
                                           Config{QForm::kDense, Layout::kTrees, 1.5f}),
                         [](const ::testing::TestParamInfo<Config>& info) {
                           const Config& c = info.param;
                           return std::string(c.form == QForm::kDense ? "Dense" : "Sparse") +
                                  (c.layout == Layout::kTrees ? "Trees" : "Chains") + "T" +
                                  std::to_string(int(c.temperature * 10));
                         });

TEST_F(StochasticTree, TemperatureZeroFollowsGreedyDecoding) {
  for (QForm form : {QForm::kDense, QForm::kSparse}) {
    std::vector<int> depths;
    const auto seqs = decode_library(600, form, Layout::kTrees, 0.0f, 5, &depths);
    ASSERT_FALSE(HasFatalFailure());
    std::vector<int> greedy;
    for (int k = 0; k < kTokens; ++k) {
      const Distribution p = p_of(prefix_id(greedy), 0.0);
      greedy.push_back(int(std::max_element(p.begin(), p.end()) - p.begin()));
    }
    for (const auto& s : seqs) ASSERT_EQ(s, greedy);
    EXPECT_GT(depths[1] + depths[2] + depths[3], 0) << "no tree had the greedy token";
  }
}

TEST_F(StochasticTree, ChainGivenAsTreeEmitsWhatAlgorithm1Emits) {
  for (QForm form : {QForm::kDense, QForm::kSparse}) {
    std::mt19937_64 rng(9);
    std::vector<std::vector<int>> prefixes(400);
    std::vector<Tree> chains;
    for (auto& prefix : prefixes) chains.push_back(make_tree(prefix, kTokens, 1, form, Layout::kChains, rng));
    std::vector<std::vector<int>> as_tree, as_chain;
    std::vector<int> tree_depths, chain_depths;
    ASSERT_NO_FATAL_FAILURE(verify(prefixes, chains, form, Layout::kTrees, 1.0f, 0, &as_tree, &tree_depths));
    ASSERT_NO_FATAL_FAILURE(verify(prefixes, chains, form, Layout::kChains, 1.0f, 0, &as_chain, &chain_depths));
    EXPECT_EQ(as_tree, as_chain);
    EXPECT_EQ(tree_depths, chain_depths);
  }
}

}  // namespace
