// The suffix drafter (SuffixDecoding, Oliaro et al., arXiv:2411.04975).
//
// Two suffix tries with occurrence counts (engine/suffix_trie.h): one over
// the current sequence (prompt and emitted tokens, extended as the sequence
// grows), one over the outputs of earlier generations of this drafter (a
// cache of at most cache_max_tokens tokens; the oldest outputs are removed
// first). Each step it matches, in each trie, the longest suffix of the
// context (at most max_match_len tokens) that occurred followed by a token,
// and grows a proposal from the matched node by the counts:
//
//   the probability of a child c of node n is count(c) / Σ count(children of n)
//   and a proposed node's score is the product of those along its path, the
//   estimated probability that the target accepts everything up to it.
//
// A chain follows the most frequent child (ties: the smaller token id) while
// the score stays ≥ min_probability, for at most max_depth tokens. A tree
// adds, best first, the candidate node of highest score (SuffixDecoding's
// greedy expansion) while it is ≥ min_probability, up to a node budget and
// max_depth levels. The sum of the scores is the expected number of accepted
// tokens under the counts; of the two tries' proposals the higher sum wins
// (ties: the current sequence's).
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "engine/drafter.h"
#include "engine/suffix_trie.h"

namespace flashspec {

struct SuffixDrafterConfig {
  int32_t max_match_len = 16;     // 1..kMaxMatchLen
  int32_t max_depth = 16;         // 1..kMaxDepth
  double min_probability = 0.1;   // [0, 1]
  int32_t cache_max_tokens = 16384;  // 0..kMaxCacheTokens; 0: no cache
  bool propose_trees = false;        // propose() gives trees, not chains
  DrafterCost cost;
};

// A draft tree: node i has token tokens[i] and parent parents[i] (−1: a
// child of the last context token); parents come before their children and
// no two children of one node share a token.
struct SuffixTree {
  std::vector<int32_t> tokens;
  std::vector<int32_t> parents;
  double score = 0.0;  // Σ of the nodes' scores: expected accepted tokens
  void clear() {
    tokens.clear();
    parents.clear();
    score = 0.0;
  }
};

class SuffixDrafter final : public Drafter {
 public:
  static constexpr int32_t kMaxMatchLen = 64;
  static constexpr int32_t kMaxDepth = 64;
  static constexpr int32_t kMaxCacheTokens = 1 << 24;

  // Throws OUT_OF_RANGE / INVALID_ARGUMENT naming the field out of range.
  explicit SuffixDrafter(const SuffixDrafterConfig& config);
  SuffixDrafter(const SuffixDrafter&) = delete;
  SuffixDrafter& operator=(const SuffixDrafter&) = delete;

  void begin(const int32_t* prompt, int32_t length) override;
  void propose(const DraftRequest& request, LmHeadRunner& runner, DraftProposal& out) override;
  void finish(const int32_t* sequence, int32_t length) override;
  DrafterCost cost() const override { return config_.cost; }

  // For hosts that draft without the engine: brings the index up to
  // `context`. A context that extends the one indexed appends the new
  // tokens; any other starts a new sequence (the previous one's output, its
  // tokens after the first context it was given, goes to the cache).
  void observe(const int32_t* context, int32_t length);
  // The best chain of at most max_tokens tokens after the indexed sequence;
  // returns its score.
  double propose_chain(int32_t max_tokens, std::vector<int32_t>& tokens) const;
  // The best tree of at most max_nodes nodes after the indexed sequence.
  void propose_tree(int32_t max_nodes, SuffixTree& tree) const;

  int64_t cached_tokens() const { return cached_tokens_; }
  int32_t cached_outputs() const { return int32_t(outputs_.size()); }
  const SuffixTrie& sequence_trie() const { return sequence_trie_; }
  const SuffixTrie& cache_trie() const { return cache_trie_; }
  const SuffixDrafterConfig& config() const { return config_; }

 private:
  void start(const int32_t* prompt, int32_t length);
  void extend(const int32_t* tokens, int32_t count);
  void end_sequence();
  void cache_output(const int32_t* tokens, int32_t count);

  SuffixDrafterConfig config_;
  SuffixTrie sequence_trie_;
  SuffixTrie cache_trie_;
  std::vector<int32_t> sequence_;  // what sequence_trie_ indexes
  int32_t prompt_length_ = 0;
  bool in_sequence_ = false;       // sequence_ holds an output not yet cached
  std::deque<std::vector<int32_t>> outputs_;  // cached, oldest first
  int64_t cached_tokens_ = 0;
};

}  // namespace flashspec
