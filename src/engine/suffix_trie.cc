#include "engine/suffix_trie.h"

#include <algorithm>

namespace flashspec {

SuffixTrie::SuffixTrie(int32_t depth) : depth_(depth) { clear(); }

void SuffixTrie::clear() {
  nodes_.assign(1, Node{});
  free_.clear();
  children_.clear();
  active_.assign(1, kRoot);
}

void SuffixTrie::start_sequence() { active_.assign(1, kRoot); }

int32_t SuffixTrie::child(int32_t node, int32_t token) const {
  auto it = children_.find(key(node, token));
  return it == children_.end() ? kNone : it->second;
}

int32_t SuffixTrie::child_or_create(int32_t node, int32_t token) {
  auto [it, inserted] = children_.try_emplace(key(node, token), kNone);
  if (!inserted) return it->second;
  int32_t id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    id = int32_t(nodes_.size());
    nodes_.emplace_back();
  }
  Node& parent = nodes_[size_t(node)];
  Node& fresh = nodes_[size_t(id)];
  fresh = Node{};
  fresh.token = token;
  fresh.depth = parent.depth + 1;
  fresh.parent = node;
  fresh.next_sibling = parent.first_child;
  if (parent.first_child != kNone) nodes_[size_t(parent.first_child)].prev_sibling = id;
  parent.first_child = id;
  it->second = id;
  return id;
}

void SuffixTrie::append(int32_t token) {
  nodes_[kRoot].count += 1;
  next_active_.assign(1, kRoot);
  for (int32_t node : active_) {
    const int32_t next = child_or_create(node, token);
    nodes_[size_t(node)].continued += 1;
    nodes_[size_t(next)].count += 1;
    if (nodes_[size_t(next)].depth < depth_) next_active_.push_back(next);
  }
  active_.swap(next_active_);
}

void SuffixTrie::release(int32_t id) {
  Node& node = nodes_[size_t(id)];
  Node& parent = nodes_[size_t(node.parent)];
  if (node.prev_sibling != kNone)
    nodes_[size_t(node.prev_sibling)].next_sibling = node.next_sibling;
  else
    parent.first_child = node.next_sibling;
  if (node.next_sibling != kNone) nodes_[size_t(node.next_sibling)].prev_sibling = node.prev_sibling;
  children_.erase(key(node.parent, node.token));
  node = Node{};
  free_.push_back(id);
}

void SuffixTrie::remove(const int32_t* tokens, int32_t count) {
  std::vector<int32_t> path;
  for (int32_t start = 0; start < count; ++start) {
    path.clear();
    int32_t node = kRoot;
    for (int32_t i = start; i < count && i - start < depth_; ++i) {
      node = child(node, tokens[i]);
      if (node == kNone) break;  // not indexed: nothing of it to remove
      path.push_back(node);
    }
    // Deepest first, so a node is released only after its descendants on
    // this path (a child's count never exceeds its parent's).
    for (size_t p = path.size(); p-- > 0;) {
      Node& n = nodes_[size_t(path[p])];
      n.count -= 1;
      nodes_[size_t(n.parent)].continued -= 1;
      if (n.count == 0) release(path[p]);
    }
  }
  nodes_[kRoot].count -= count;
  start_sequence();
}

int32_t SuffixTrie::longest_continued_suffix(const int32_t* context, int32_t length, int32_t max_length,
                                             int32_t* matched_length) const {
  // Both "occurs" and "occurs followed by a token" hold for every suffix of
  // a suffix that has them, so the longest such length is found by
  // bisection: O(log(max_length)) walks of at most max_length steps.
  auto walk = [&](int32_t n) {
    int32_t node = kRoot;
    for (int32_t i = length - n; i < length && node != kNone; ++i) node = child(node, context[i]);
    return node != kNone && nodes_[size_t(node)].continued > 0 ? node : kNone;
  };
  int32_t lo = 0, hi = std::min({max_length, length, depth_ - 1});
  int32_t best = kRoot;
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo + 1) / 2;
    const int32_t node = walk(mid);
    if (node != kNone) {
      lo = mid;
      best = node;
    } else {
      hi = mid - 1;
    }
  }
  *matched_length = lo;
  return lo > 0 ? best : kRoot;
}

}  // namespace flashspec
