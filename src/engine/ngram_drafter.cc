#include "engine/ngram_drafter.h"

#include <algorithm>
#include <string>

#include "util/status.h"

namespace flashspec {

size_t NgramDrafter::GramHash::operator()(int32_t end) const {
  // FNV-1a over the n tokens, then a final avalanche (splitmix64).
  uint64_t h = 1469598103934665603ull;
  const int32_t* t = self->tokens_.data() + (end - n + 1);
  for (int32_t i = 0; i < n; ++i) {
    h ^= uint32_t(t[i]);
    h *= 1099511628211ull;
  }
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return size_t(h);
}

bool NgramDrafter::GramEqual::operator()(int32_t a, int32_t b) const {
  const int32_t* t = self->tokens_.data();
  for (int32_t i = 0; i < n; ++i)
    if (t[a - i] != t[b - i]) return false;
  return true;
}

NgramDrafter::NgramDrafter(int32_t min_n, int32_t max_n, DrafterCost cost)
    : min_n_(min_n), max_n_(max_n), cost_(cost) {
  require(min_n >= 1 && min_n <= kMaxN, FLASHSPEC_ERR_OUT_OF_RANGE, "min_n",
          "must be in [1, " + std::to_string(kMaxN) + "], got " + std::to_string(min_n));
  require(max_n >= min_n && max_n <= kMaxN, FLASHSPEC_ERR_OUT_OF_RANGE, "max_n",
          "must be in [min_n, " + std::to_string(kMaxN) + "], got " + std::to_string(max_n));
  for (int32_t n = min_n; n <= max_n; ++n) maps_.emplace_back(16, GramHash{this, n}, GramEqual{this, n});
}

void NgramDrafter::begin(const int32_t* prompt, int32_t length) {
  tokens_.clear();
  for (GramMap& map : maps_) map.clear();
  append(prompt, length);
}

void NgramDrafter::append(const int32_t* tokens, int32_t count) {
  for (int32_t k = 0; k < count; ++k) {
    tokens_.push_back(tokens[k]);
    // The n-gram ending just before the new token now has a follower.
    const int32_t end = int32_t(tokens_.size()) - 2;
    for (int32_t n = min_n_; n <= max_n_ && end - n + 1 >= 0; ++n) maps_[size_t(n - min_n_)][end] = end;
  }
}

int32_t NgramDrafter::lookup(int32_t max_tokens, int32_t* out, int32_t* matched_n) const {
  if (matched_n) *matched_n = 0;
  const int32_t length = int32_t(tokens_.size());
  if (max_tokens <= 0) return 0;
  const int32_t suffix_end = length - 1;
  // An earlier occurrence ends at ≤ length − 2, so n ≤ length − 1.
  for (int32_t n = std::min(max_n_, length - 1); n >= min_n_; --n) {
    const GramMap& map = maps_[size_t(n - min_n_)];
    auto it = map.find(suffix_end);
    if (it == map.end()) continue;
    const int32_t match_end = it->second;
    for (int32_t i = 0; i < max_tokens; ++i) {
      const int32_t source = match_end + 1 + i;
      out[i] = source < length ? tokens_[size_t(source)] : out[source - length];
    }
    if (matched_n) *matched_n = n;
    return max_tokens;
  }
  return 0;
}

void NgramDrafter::propose(const DraftRequest& request, LmHeadRunner&, DraftProposal& out) {
  require(request.length >= length(), FLASHSPEC_ERR_INTERNAL, "n-gram drafter",
          "the context shrank without a new begin()");
  append(request.context + length(), request.length - length());
  out.tokens.resize(size_t(request.max_tokens));
  const int32_t n = lookup(request.max_tokens, out.tokens.data());
  out.tokens.resize(size_t(n));
}

}  // namespace flashspec
