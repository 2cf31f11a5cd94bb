#include "engine/suffix_drafter.h"

#include <algorithm>
#include <cmath>
#include <queue>
#include <string>

#include "util/status.h"

namespace flashspec {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

// The child of highest count (ties: the smaller token id), or kNone.
int32_t most_frequent_child(const SuffixTrie& trie, int32_t node) {
  int32_t best = SuffixTrie::kNone;
  for (int32_t c = trie.first_child(node); c != SuffixTrie::kNone; c = trie.next_sibling(c)) {
    if (best == SuffixTrie::kNone || trie.count(c) > trie.count(best) ||
        (trie.count(c) == trie.count(best) && trie.token(c) < trie.token(best)))
      best = c;
  }
  return best;
}

double chain_from(const SuffixTrie& trie, int32_t node, int32_t max_tokens, double min_probability,
                  std::vector<int32_t>& tokens) {
  tokens.clear();
  double path = 1.0, score = 0.0;
  while (int32_t(tokens.size()) < max_tokens && trie.continued_count(node) > 0) {
    const int32_t next = most_frequent_child(trie, node);
    const double p = path * double(trie.count(next)) / double(trie.continued_count(node));
    if (p < min_probability) break;
    tokens.push_back(trie.token(next));
    score += p;
    path = p;
    node = next;
  }
  return score;
}

void tree_from(const SuffixTrie& trie, int32_t root, int32_t max_nodes, int32_t max_depth, double min_probability,
               SuffixTree& tree) {
  tree.clear();
  struct Candidate {
    double score;
    int32_t token;      // ties: the smaller token id (as the chain), then
    uint64_t order;     // the push order, so the result is deterministic
    int32_t node;       // trie node
    int32_t parent;     // index in the tree, −1 for the root
    int32_t level;      // 1 for a child of the root
  };
  auto lower = [](const Candidate& a, const Candidate& b) {
    if (a.score != b.score) return a.score < b.score;
    if (a.token != b.token) return a.token > b.token;
    return a.order > b.order;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(lower)> frontier(lower);
  uint64_t pushed = 0;
  auto push_children = [&](int32_t node, double path, int32_t index, int32_t level) {
    if (level > max_depth || trie.continued_count(node) == 0) return;
    const double total = double(trie.continued_count(node));
    for (int32_t c = trie.first_child(node); c != SuffixTrie::kNone; c = trie.next_sibling(c)) {
      const double p = path * double(trie.count(c)) / total;
      // Scores only fall along a path: a child below the bar never leads
      // to a node above it.
      if (p >= min_probability) frontier.push(Candidate{p, trie.token(c), pushed++, c, index, level});
    }
  };
  push_children(root, 1.0, -1, 1);
  while (!frontier.empty() && int32_t(tree.tokens.size()) < max_nodes) {
    const Candidate best = frontier.top();
    frontier.pop();
    const int32_t index = int32_t(tree.tokens.size());
    tree.tokens.push_back(trie.token(best.node));
    tree.parents.push_back(best.parent);
    tree.score += best.score;
    push_children(best.node, best.score, index, best.level + 1);
  }
}

}  // namespace

SuffixDrafter::SuffixDrafter(const SuffixDrafterConfig& config)
    : config_(config),
      sequence_trie_(config.max_match_len + config.max_depth),
      cache_trie_(config.max_match_len + config.max_depth) {
  require(config.max_match_len >= 1 && config.max_match_len <= kMaxMatchLen, FLASHSPEC_ERR_OUT_OF_RANGE,
          "max_match_len", "must be in [1, " + str(kMaxMatchLen) + "], got " + str(config.max_match_len));
  require(config.max_depth >= 1 && config.max_depth <= kMaxDepth, FLASHSPEC_ERR_OUT_OF_RANGE, "max_depth",
          "must be in [1, " + str(kMaxDepth) + "], got " + str(config.max_depth));
  require(std::isfinite(config.min_probability) && config.min_probability >= 0.0 && config.min_probability <= 1.0,
          FLASHSPEC_ERR_OUT_OF_RANGE, "min_probability",
          "must be in [0, 1], got " + std::to_string(config.min_probability));
  require(config.cache_max_tokens >= 0 && config.cache_max_tokens <= kMaxCacheTokens, FLASHSPEC_ERR_OUT_OF_RANGE,
          "cache_max_tokens",
          "must be in [0, " + str(kMaxCacheTokens) + "], got " + str(config.cache_max_tokens));
}

void SuffixDrafter::start(const int32_t* prompt, int32_t length) {
  end_sequence();
  sequence_trie_.clear();
  sequence_.clear();
  extend(prompt, length);
  prompt_length_ = length;
  in_sequence_ = true;
}

void SuffixDrafter::extend(const int32_t* tokens, int32_t count) {
  for (int32_t i = 0; i < count; ++i) {
    sequence_.push_back(tokens[i]);
    sequence_trie_.append(tokens[i]);
  }
}

void SuffixDrafter::end_sequence() {
  if (!in_sequence_) return;
  in_sequence_ = false;
  cache_output(sequence_.data() + prompt_length_, int32_t(sequence_.size()) - prompt_length_);
}

void SuffixDrafter::cache_output(const int32_t* tokens, int32_t count) {
  if (config_.cache_max_tokens == 0 || count <= 0) return;
  // An output longer than the whole cache keeps its end, nearest what comes next.
  if (count > config_.cache_max_tokens) {
    tokens += count - config_.cache_max_tokens;
    count = config_.cache_max_tokens;
  }
  while (!outputs_.empty() && cached_tokens_ + count > config_.cache_max_tokens) {
    const std::vector<int32_t>& oldest = outputs_.front();
    cache_trie_.remove(oldest.data(), int32_t(oldest.size()));
    cached_tokens_ -= int64_t(oldest.size());
    outputs_.pop_front();
  }
  outputs_.emplace_back(tokens, tokens + count);
  cache_trie_.start_sequence();
  for (int32_t i = 0; i < count; ++i) cache_trie_.append(tokens[i]);
  cached_tokens_ += count;
}

void SuffixDrafter::begin(const int32_t* prompt, int32_t length) { start(prompt, length); }

void SuffixDrafter::finish(const int32_t* sequence, int32_t length) {
  observe(sequence, length);
  end_sequence();
}

void SuffixDrafter::observe(const int32_t* context, int32_t length) {
  const bool extends = in_sequence_ && length >= int32_t(sequence_.size()) &&
                       std::equal(sequence_.begin(), sequence_.end(), context);
  if (extends)
    extend(context + sequence_.size(), length - int32_t(sequence_.size()));
  else
    start(context, length);
}

double SuffixDrafter::propose_chain(int32_t max_tokens, std::vector<int32_t>& tokens) const {
  tokens.clear();
  const int32_t limit = std::min(max_tokens, config_.max_depth);
  if (limit <= 0) return 0.0;
  double best_score = 0.0;
  std::vector<int32_t> candidate;
  for (const SuffixTrie* trie : {&sequence_trie_, &cache_trie_}) {
    int32_t matched = 0;
    const int32_t node = trie->longest_continued_suffix(sequence_.data(), int32_t(sequence_.size()),
                                                        config_.max_match_len, &matched);
    if (matched == 0) continue;
    const double score = chain_from(*trie, node, limit, config_.min_probability, candidate);
    if (score > best_score) {
      best_score = score;
      tokens.swap(candidate);
    }
  }
  return best_score;
}

void SuffixDrafter::propose_tree(int32_t max_nodes, SuffixTree& tree) const {
  tree.clear();
  if (max_nodes <= 0) return;
  SuffixTree candidate;
  for (const SuffixTrie* trie : {&sequence_trie_, &cache_trie_}) {
    int32_t matched = 0;
    const int32_t node = trie->longest_continued_suffix(sequence_.data(), int32_t(sequence_.size()),
                                                        config_.max_match_len, &matched);
    if (matched == 0) continue;
    tree_from(*trie, node, max_nodes, config_.max_depth, config_.min_probability, candidate);
    if (candidate.score > tree.score) std::swap(tree, candidate);
  }
}

void SuffixDrafter::propose(const DraftRequest& request, LmHeadRunner&, DraftProposal& out) {
  require(in_sequence_ && request.length >= int32_t(sequence_.size()), FLASHSPEC_ERR_INTERNAL, "suffix drafter",
          "the context shrank without a new begin()");
  extend(request.context + sequence_.size(), request.length - int32_t(sequence_.size()));
  auto outside = [&](int32_t t) { return t < 0 || int64_t(t) >= request.vocab; };
  if (!config_.propose_trees) {
    propose_chain(request.max_tokens, out.tokens);
    // Tokens cached by a host with another vocabulary never reach the verify.
    out.tokens.erase(std::find_if(out.tokens.begin(), out.tokens.end(), outside), out.tokens.end());
    return;
  }
  SuffixTree tree;
  propose_tree(request.max_tokens, tree);
  // The same, with the subtrees below such tokens (parents come first, so
  // one pass renumbers what stays).
  std::vector<int32_t> index(tree.tokens.size(), -1);
  for (size_t i = 0; i < tree.tokens.size(); ++i) {
    const int32_t parent = tree.parents[i];
    if (outside(tree.tokens[i]) || (parent >= 0 && index[size_t(parent)] < 0)) continue;
    index[i] = int32_t(out.tokens.size());
    out.tokens.push_back(tree.tokens[i]);
    out.parents.push_back(parent < 0 ? -1 : index[size_t(parent)]);
  }
}

}  // namespace flashspec
