// The suffix drafter and its index: counts equal brute-force substring
// counts, the longest continued suffix is matched, the depth follows the
// counts, earlier outputs are cached across generations within a bounded
// size (removal restores the exact counts), and trees are well formed.
// Plus the adaptive draft length rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "bandit/draft_length.h"
#include "engine/suffix_drafter.h"
#include "engine/suffix_trie.h"
#include "engine_support.h"
#include "util/status.h"

namespace {

using flashspec::DraftLengthRule;
using flashspec::SuffixDrafter;
using flashspec::SuffixDrafterConfig;
using flashspec::SuffixTree;
using flashspec::SuffixTrie;

using Text = std::vector<int32_t>;

// Occurrences of `pattern` in the texts.
int64_t occurrences(const std::vector<Text>& texts, const Text& pattern) {
  int64_t n = 0;
  for (const Text& t : texts)
    for (size_t i = 0; i + pattern.size() <= t.size(); ++i)
      n += std::equal(pattern.begin(), pattern.end(), t.begin() + std::ptrdiff_t(i));
  return n;
}

// The node of `pattern`, or kNone.
int32_t find(const SuffixTrie& trie, const Text& pattern) {
  int32_t node = SuffixTrie::kRoot;
  for (int32_t t : pattern) {
    node = trie.child(node, t);
    if (node == SuffixTrie::kNone) break;
  }
  return node;
}

// Every node's count is its substring's occurrences, every substring of
// length ≤ depth is a node, and nothing else is.
void expect_counts(const SuffixTrie& trie, const std::vector<Text>& texts) {
  std::set<Text> substrings;
  for (const Text& t : texts)
    for (size_t i = 0; i < t.size(); ++i)
      for (size_t n = 1; n <= size_t(trie.depth_limit()) && i + n <= t.size(); ++n)
        substrings.insert(Text(t.begin() + std::ptrdiff_t(i), t.begin() + std::ptrdiff_t(i + n)));
  for (const Text& s : substrings) {
    const int32_t node = find(trie, s);
    ASSERT_NE(node, SuffixTrie::kNone);
    EXPECT_EQ(trie.count(node), occurrences(texts, s));
    int64_t children = 0;
    for (int32_t c = trie.first_child(node); c != SuffixTrie::kNone; c = trie.next_sibling(c)) children += trie.count(c);
    EXPECT_EQ(trie.continued_count(node), children);
  }
  EXPECT_EQ(trie.num_nodes(), int64_t(substrings.size()) + 1);
}

Text random_text(fstest::Rng& rng, int32_t length, int32_t vocab) {
  Text t;
  for (int32_t i = 0; i < length; ++i) t.push_back(rng.below(vocab));
  return t;
}

TEST(SuffixTrie, CountsEqualSubstringOccurrences) {
  fstest::Rng rng(11);
  SuffixTrie trie(5);
  std::vector<Text> texts;
  for (int i = 0; i < 4; ++i) {
    texts.push_back(random_text(rng, 40 + 7 * i, 3 + i));
    trie.start_sequence();
    for (int32_t t : texts.back()) trie.append(t);
  }
  expect_counts(trie, texts);
}

TEST(SuffixTrie, RemovingATextRestoresTheCountsOfTheOthers) {
  fstest::Rng rng(12);
  SuffixTrie trie(6);
  std::vector<Text> texts;
  for (int i = 0; i < 5; ++i) {
    texts.push_back(random_text(rng, 30, 4));
    trie.start_sequence();
    for (int32_t t : texts.back()) trie.append(t);
  }
  const int64_t full = trie.num_nodes();
  for (int i = 0; i < 3; ++i) {
    trie.remove(texts.front().data(), int32_t(texts.front().size()));
    texts.erase(texts.begin());
    expect_counts(trie, texts);
  }
  // Freed nodes are reused: adding the texts back needs no more room.
  SuffixTrie fresh(6);
  for (const Text& t : texts) {
    fresh.start_sequence();
    for (int32_t x : t) fresh.append(x);
  }
  EXPECT_EQ(trie.num_nodes(), fresh.num_nodes());
  EXPECT_LT(trie.num_nodes(), full);
}

TEST(SuffixTrie, LongestContinuedSuffixAgreesWithBruteForce) {
  fstest::Rng rng(13);
  for (int round = 0; round < 40; ++round) {
    const Text text = random_text(rng, 60, 3);
    SuffixTrie trie(8);
    for (int32_t t : text) trie.append(t);
    const Text context = random_text(rng, 12, 3);
    int32_t matched = -1;
    const int32_t node = trie.longest_continued_suffix(context.data(), int32_t(context.size()), 6, &matched);
    // Brute force: the longest n ≤ 6 whose suffix occurs followed by a token.
    int32_t want = 0;
    for (int32_t n = 1; n <= 6; ++n) {
      const Text suffix(context.end() - n, context.end());
      const Text head(text.begin(), text.end() - 1);  // an occurrence followed by a token
      if (occurrences({head}, suffix) > 0) want = n;
    }
    EXPECT_EQ(matched, want) << "round " << round;
    if (want > 0) EXPECT_EQ(node, find(trie, Text(context.end() - want, context.end())));
  }
}

SuffixDrafterConfig config(int32_t max_match_len, int32_t max_depth, double min_probability, int32_t cache = 0) {
  SuffixDrafterConfig c;
  c.max_match_len = max_match_len;
  c.max_depth = max_depth;
  c.min_probability = min_probability;
  c.cache_max_tokens = cache;
  return c;
}

Text chain(SuffixDrafter& d, const Text& context, int32_t k, double* score = nullptr) {
  d.observe(context.data(), int32_t(context.size()));
  Text out;
  const double s = d.propose_chain(k, out);
  if (score) *score = s;
  return out;
}

TEST(SuffixDrafter, ProposesWhatFollowedTheLongestMatch) {
  SuffixDrafter d(config(4, 8, 0.0));
  // "1 2" occurred followed by 3 4; "2" alone also by 9 (more recently).
  EXPECT_EQ(chain(d, {1, 2, 3, 4, 5, 2, 9, 7, 1, 2}, 3), (Text{3, 4, 5}));
  // No earlier occurrence of the last token: no draft.
  SuffixDrafter none(config(4, 8, 0.0));
  EXPECT_TRUE(chain(none, {1, 2, 3, 4}, 3).empty());
}

TEST(SuffixDrafter, TheMostFrequentContinuationWinsAndTheCountsSetTheDepth) {
  // After "5" came 6 three times and 7 once, so p(6) = 3/4; after "5 6"
  // came 1 twice and 2 once, so the path 6, 1 scores 3/4 · 2/3 = 1/2.
  const Text context = {5, 6, 1, 5, 6, 1, 5, 6, 2, 5, 7, 0, 5};
  SuffixDrafter d(config(1, 8, 0.0));
  double score = 0.0;
  const Text all = chain(d, context, 8, &score);
  ASSERT_GE(all.size(), 2u);
  EXPECT_EQ(all[0], 6);
  EXPECT_EQ(all[1], 1);
  // min_probability cuts the chain where its score falls below it.
  SuffixDrafter strict(config(1, 8, 0.6));
  EXPECT_EQ(chain(strict, context, 8), (Text{6}));
  SuffixDrafter stricter(config(1, 8, 0.8));
  EXPECT_TRUE(chain(stricter, context, 8).empty());
  // "5 6 1" was always followed by "5 6", then by 1 once and 2 once: the
  // path holds at 1/2 for two more tokens and then halves.
  SuffixDrafter half(config(1, 8, 0.5));
  EXPECT_EQ(chain(half, context, 8, &score), (Text{6, 1, 5, 6}));
  EXPECT_DOUBLE_EQ(score, 0.75 + 0.5 + 0.5 + 0.5);
  // At 1/4 it goes on through the tie (1 and 2 once each after "5 6 1 5 6":
  // the smaller id) and then along the only continuation.
  SuffixDrafter quarter(config(1, 8, 0.25));
  EXPECT_EQ(chain(quarter, context, 8), (Text{6, 1, 5, 6, 1, 5, 6, 2}));
  // max_depth and k bound it.
  SuffixDrafter shallow(config(1, 1, 0.0));
  EXPECT_EQ(chain(shallow, context, 8), (Text{6}));
  EXPECT_EQ(chain(d, context, 1), (Text{6}));
}

TEST(SuffixDrafter, ThePreviousOutputsAreCachedAcrossGenerations) {
  SuffixDrafter d(config(4, 8, 0.0, 1000));
  const Text first_prompt = {1, 2};
  const Text output = {40, 41, 42, 43, 44, 45};
  d.begin(first_prompt.data(), 2);
  Text sequence = first_prompt;
  sequence.insert(sequence.end(), output.begin(), output.end());
  d.finish(sequence.data(), int32_t(sequence.size()));
  EXPECT_EQ(d.cached_tokens(), int64_t(output.size()));  // the output, not the prompt
  // A new prompt that ends like the earlier output drafts its continuation.
  const Text prompt = {7, 8, 41, 42};
  d.begin(prompt.data(), int32_t(prompt.size()));
  Text out;
  d.propose_chain(4, out);
  EXPECT_EQ(out, (Text{43, 44, 45}));
  // Without a cache it has nothing to draft from.
  SuffixDrafter uncached(config(4, 8, 0.0, 0));
  uncached.begin(first_prompt.data(), 2);
  uncached.finish(sequence.data(), int32_t(sequence.size()));
  uncached.begin(prompt.data(), int32_t(prompt.size()));
  uncached.propose_chain(4, out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(uncached.cached_tokens(), 0);
}

TEST(SuffixDrafter, TheCacheStaysWithinItsBoundAndForgetsTheOldestOutputs) {
  const int32_t bound = 100;
  SuffixDrafter d(config(3, 4, 0.0, bound));
  fstest::Rng rng(21);
  std::vector<Text> outputs;
  for (int g = 0; g < 30; ++g) {
    const Text prompt = {int32_t(1000 + g)};
    const Text output = random_text(rng, 17 + g % 5, 50);
    Text sequence = prompt;
    sequence.insert(sequence.end(), output.begin(), output.end());
    d.begin(prompt.data(), 1);
    d.finish(sequence.data(), int32_t(sequence.size()));
    outputs.push_back(output);
    EXPECT_LE(d.cached_tokens(), bound);
    // Memory: at most depth nodes per cached token.
    EXPECT_LE(d.cache_trie().num_nodes(), 1 + int64_t(d.cache_trie().depth_limit()) * d.cached_tokens());
  }
  // The cache holds exactly the newest outputs that fit, with their counts.
  std::vector<Text> kept;
  int64_t total = 0;
  for (size_t i = outputs.size(); i-- > 0 && total + int64_t(outputs[i].size()) <= bound;) {
    kept.insert(kept.begin(), outputs[i]);
    total += int64_t(outputs[i].size());
  }
  EXPECT_EQ(d.cached_tokens(), total);
  EXPECT_EQ(d.cached_outputs(), int32_t(kept.size()));
  expect_counts(d.cache_trie(), kept);
  // An output longer than the cache keeps its last tokens.
  const Text prompt = {9999};
  Text sequence = prompt;
  const Text huge = random_text(rng, 3 * bound, 50);
  sequence.insert(sequence.end(), huge.begin(), huge.end());
  d.begin(prompt.data(), 1);
  d.finish(sequence.data(), int32_t(sequence.size()));
  EXPECT_EQ(d.cached_tokens(), bound);
  expect_counts(d.cache_trie(), {Text(huge.end() - bound, huge.end())});
}

TEST(SuffixDrafter, ObserveExtendsOrStartsANewSequence) {
  SuffixDrafter d(config(4, 8, 0.0, 1000));
  Text context = {1, 2, 3, 1, 2};
  EXPECT_EQ(chain(d, context, 2), (Text{3, 1}));
  context.push_back(3);
  EXPECT_EQ(d.sequence_trie().count(SuffixTrie::kRoot), 5);
  d.observe(context.data(), int32_t(context.size()));
  EXPECT_EQ(d.sequence_trie().count(SuffixTrie::kRoot), 6);  // one token appended
  // A different context is a new sequence; the old one's output (the token
  // beyond its first context) is cached.
  const Text other = {7, 7};
  d.observe(other.data(), 2);
  EXPECT_EQ(d.sequence_trie().count(SuffixTrie::kRoot), 2);
  EXPECT_EQ(d.cached_tokens(), 1);
}

// Parents before children, no repeated token among siblings, depth ≤
// max_depth, every node's path a real continuation of the match.
void expect_well_formed(const SuffixTree& tree, int32_t max_depth) {
  ASSERT_EQ(tree.tokens.size(), tree.parents.size());
  std::map<std::pair<int32_t, int32_t>, int> siblings;
  std::vector<int32_t> level(tree.tokens.size());
  for (size_t i = 0; i < tree.tokens.size(); ++i) {
    const int32_t parent = tree.parents[i];
    ASSERT_GE(parent, -1);
    ASSERT_LT(parent, int32_t(i)) << "node " << i;
    const int seen = ++siblings[std::make_pair(parent, tree.tokens[i])];
    EXPECT_EQ(seen, 1) << "node " << i << " repeats a sibling's token";
    level[i] = parent < 0 ? 1 : level[size_t(parent)] + 1;
    EXPECT_LE(level[i], max_depth);
  }
}

TEST(SuffixDrafter, TreesAreWellFormedBestFirstAndContainTheChain) {
  fstest::Rng rng(31);
  for (int round = 0; round < 30; ++round) {
    const int32_t depth = 1 + round % 5;
    SuffixDrafter d(config(3, depth, 0.01 * (round % 4)));
    const Text context = random_text(rng, 80, 4);
    d.observe(context.data(), int32_t(context.size()));
    SuffixTree tree;
    d.propose_tree(24, tree);
    expect_well_formed(tree, depth);
    EXPECT_LE(tree.tokens.size(), 24u);
    // Best first: a smaller budget gives a prefix of the larger tree.
    SuffixTree small;
    d.propose_tree(5, small);
    ASSERT_LE(small.tokens.size(), tree.tokens.size());
    EXPECT_TRUE(std::equal(small.tokens.begin(), small.tokens.end(), tree.tokens.begin()));
    EXPECT_TRUE(std::equal(small.parents.begin(), small.parents.end(), tree.parents.begin()));
    // The chain is the tree's path of most frequent children: its first
    // token is the tree's first node.
    Text out;
    d.propose_chain(depth, out);
    ASSERT_EQ(out.empty(), tree.tokens.empty());
    if (!out.empty()) EXPECT_EQ(out[0], tree.tokens[0]);
  }
  // Several continuations of one context become siblings.
  SuffixDrafter d(config(1, 2, 0.0));
  const Text context = {5, 1, 5, 2, 5, 3, 5};
  d.observe(context.data(), int32_t(context.size()));
  SuffixTree tree;
  d.propose_tree(3, tree);
  EXPECT_EQ(tree.parents, (Text{-1, -1, -1}));
  EXPECT_EQ(std::set<int32_t>(tree.tokens.begin(), tree.tokens.end()), (std::set<int32_t>{1, 2, 3}));
}

TEST(SuffixDrafter, ParamsOutOfRangeAreRefused) {
  auto status_of = [](SuffixDrafterConfig c) {
    try {
      SuffixDrafter d(c);
    } catch (const flashspec::Error& e) {
      return e.status();
    }
    return FLASHSPEC_OK;
  };
  EXPECT_EQ(status_of(config(0, 4, 0.1)), FLASHSPEC_ERR_OUT_OF_RANGE);
  EXPECT_EQ(status_of(config(65, 4, 0.1)), FLASHSPEC_ERR_OUT_OF_RANGE);
  EXPECT_EQ(status_of(config(4, 0, 0.1)), FLASHSPEC_ERR_OUT_OF_RANGE);
  EXPECT_EQ(status_of(config(4, 4, 1.5)), FLASHSPEC_ERR_OUT_OF_RANGE);
  EXPECT_EQ(status_of(config(4, 4, 0.1, -1)), FLASHSPEC_ERR_OUT_OF_RANGE);
  EXPECT_EQ(status_of(config(4, 4, 0.1, 1000)), FLASHSPEC_OK);
}

// ---- The adaptive draft length ---------------------------------------------------

double rate(const flashspec::CostModel& model, const flashspec::DrafterCost& cost, const std::vector<double>& a,
            int32_t k) {
  double reach = 1.0, tokens = 1.0;
  for (int32_t j = 0; j < k; ++j) tokens += (reach *= a[size_t(j)]);
  return tokens / flashspec::step_cost(model, cost, k > 0, k);
}

TEST(DraftLengthRule, BestLengthIsTheArgmaxOfTokensPerCost) {
  fstest::Rng rng(41);
  for (int round = 0; round < 200; ++round) {
    flashspec::CostModel model{1.0, 0.01 + 0.2 * rng.uniform()};
    flashspec::DrafterCost cost{0.3 * rng.uniform(), 0.1 * rng.uniform()};
    std::vector<double> a(8);
    for (double& x : a) x = rng.uniform();
    const int32_t k = DraftLengthRule::best_length(model, cost, a, 8);
    for (int32_t other = 0; other <= 8; ++other) EXPECT_LE(rate(model, cost, a, other), rate(model, cost, a, k) + 1e-12);
  }
  // Certain acceptance and nearly free rows: the longest draft. Hopeless
  // drafts: none.
  const flashspec::CostModel model{1.0, 0.02};
  EXPECT_EQ(DraftLengthRule::best_length(model, {}, std::vector<double>(6, 1.0), 6), 6);
  EXPECT_EQ(DraftLengthRule::best_length(model, {}, std::vector<double>(6, 0.0), 6), 0);
  // A position that is rarely accepted ends the draft before it.
  EXPECT_EQ(DraftLengthRule::best_length(model, {}, {0.9, 0.9, 0.01, 0.9}, 4), 2);
}

TEST(DraftLengthRule, EstimatesFollowTheLiveAcceptanceAndChooseTheBestK) {
  // A drafter whose position j is accepted with probability a_j given the
  // earlier ones, simulated: the rule's estimates approach a_j and it plays
  // the k of the true rates. The statistic a careless rule would keep
  // (accepted / drafted per position, which counts the positions after the
  // first rejection as rejected) picks a shorter k on the same truth.
  const flashspec::CostModel model{1.0, 0.2};
  const std::vector<double> truth = {0.9, 0.9, 0.9, 0.9, 0.1, 0.1};
  const int32_t best = DraftLengthRule::best_length(model, {}, truth, 6);
  ASSERT_EQ(best, 4);
  std::vector<double> unconditional;
  double reach = 1.0;
  for (double a : truth) unconditional.push_back(reach *= a);
  EXPECT_LT(DraftLengthRule::best_length(model, {}, unconditional, 6), best);

  DraftLengthRule rule(model, {}, 400.0);
  fstest::Rng rng(42);
  int played_best = 0;
  const int steps = 4000, judged = 1000;
  for (int step = 0; step < steps; ++step) {
    const int32_t k = rule.choose(6);
    if (step >= steps - judged) played_best += k == best;
    int32_t accepted = 0;
    while (accepted < k && rng.uniform() < truth[size_t(accepted)]) ++accepted;
    rule.record(k, accepted);
  }
  // Now and then it tries a longer draft again (an untried position drifts
  // back to 1/2); mostly it plays the best k.
  EXPECT_GT(played_best, judged * 8 / 10);
  for (int32_t j = 0; j < best; ++j) EXPECT_NEAR(rule.acceptance(j), truth[size_t(j)], 0.05) << "position " << j;
}

TEST(DraftLengthRule, OldStepsAreForgotten) {
  const flashspec::CostModel model{1.0, 0.1};
  DraftLengthRule rule(model, {}, 16.0);
  for (int i = 0; i < 200; ++i) rule.record(4, 4);
  EXPECT_EQ(rule.choose(4), 4);
  for (int i = 0; i < 200; ++i) rule.record(4, 0);
  EXPECT_EQ(rule.choose(4), 0);
  EXPECT_LT(rule.acceptance(0), 1.0 / 17.0);
}

}  // namespace
