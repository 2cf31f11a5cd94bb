// A depth-bounded suffix trie with occurrence counts: the index behind the
// suffix drafter (SuffixDecoding, Oliaro et al., arXiv:2411.04975).
//
// Every substring of length ≤ depth of the indexed sequences is a node, and
// a node's count is the number of its occurrences. Appending a token to a
// sequence extends the suffixes of length 0 .. depth − 1 that end just
// before it (the "active" nodes) by one child each: O(depth) hash look-ups
// per token, whatever the length of the text, so the trie grows with the
// sequence and is never rebuilt. A sequence can be removed again (the counts
// of its substrings go down; nodes that reach 0 are freed and reused), which
// is what bounds the drafter's cache of earlier outputs.
//
// Why a trie of bounded depth rather than a suffix tree or a suffix
// automaton over the whole text: those are O(n) nodes, but an occurrence
// count per node needs a pass over the structure after each append (or an
// ancestor walk of unbounded length), and neither supports removing a text.
// The drafter only needs short contexts (the matched suffix) and short
// continuations (the draft), so depth bounds both, and counts and removal
// stay O(depth) per token. The price is memory: at most depth nodes per
// indexed token (about 64 bytes each with the hash entry).
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace flashspec {

class SuffixTrie {
 public:
  static constexpr int32_t kRoot = 0;
  static constexpr int32_t kNone = -1;

  // depth ≥ 1: the longest substring indexed.
  explicit SuffixTrie(int32_t depth);

  // Forget every sequence.
  void clear();
  // The next append() starts a new sequence (counts stay).
  void start_sequence();
  // Appends one token to the current sequence.
  void append(int32_t token);
  // Removes a sequence added earlier by start_sequence() and appending
  // exactly these tokens: every count it added goes back down. Ends the
  // current sequence (the next append() starts a new one).
  void remove(const int32_t* tokens, int32_t count);

  // The longest suffix of context[0 .. length), at most max_length tokens,
  // that occurs in the indexed text followed by at least one token. Returns
  // its node and writes its length (0 and kRoot when none).
  int32_t longest_continued_suffix(const int32_t* context, int32_t length, int32_t max_length,
                                   int32_t* matched_length) const;

  int32_t child(int32_t node, int32_t token) const;
  int32_t first_child(int32_t node) const { return nodes_[size_t(node)].first_child; }
  int32_t next_sibling(int32_t node) const { return nodes_[size_t(node)].next_sibling; }
  int32_t token(int32_t node) const { return nodes_[size_t(node)].token; }
  int32_t depth(int32_t node) const { return nodes_[size_t(node)].depth; }
  // Occurrences of the node's substring; for the root, tokens indexed.
  int64_t count(int32_t node) const { return nodes_[size_t(node)].count; }
  // Occurrences followed by another token: the sum of the children's counts.
  int64_t continued_count(int32_t node) const { return nodes_[size_t(node)].continued; }

  int32_t depth_limit() const { return depth_; }
  // Nodes in use, root included.
  int64_t num_nodes() const { return int64_t(nodes_.size() - free_.size()); }

 private:
  struct Node {
    int32_t token = -1;
    int32_t depth = 0;
    int32_t parent = kNone;
    int32_t first_child = kNone;
    int32_t next_sibling = kNone;
    int32_t prev_sibling = kNone;
    int64_t count = 0;
    int64_t continued = 0;
  };

  static uint64_t key(int32_t node, int32_t token) { return uint64_t(uint32_t(node)) << 32 | uint32_t(token); }
  int32_t child_or_create(int32_t node, int32_t token);
  void release(int32_t node);

  int32_t depth_;
  std::vector<Node> nodes_;
  std::vector<int32_t> free_;
  std::unordered_map<uint64_t, int32_t> children_;
  // Nodes of the current sequence's suffixes of length 0 .. depth − 1.
  std::vector<int32_t> active_;
  std::vector<int32_t> next_active_;
};

}  // namespace flashspec
