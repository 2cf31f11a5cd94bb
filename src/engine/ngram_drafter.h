// Prompt-lookup drafting: find the longest suffix of the sequence, of length
// n in [min_n, max_n], that occurred earlier, and propose the tokens that
// followed its most recent earlier occurrence.
//
// The index is updated incrementally: for each n, a hash map from the
// content of an n-gram to the end position of its most recent occurrence
// that already has a following token. Appending a token costs
// O(max_n²) (one n-gram per n, hashed and compared over its n tokens) and a
// lookup O(max_n²), independent of the sequence length, so drafting over a
// whole generation is linear in its length.
//
// The copy after a match at end position e proposes sequence[e + 1 ..] and,
// when the match is closer to the end than k tokens, runs on into the tokens
// it is proposing (the overlapping copy of LZ77): a periodic sequence drafts
// its period again and again. It never proposes more than k tokens.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "engine/drafter.h"

namespace flashspec {

class NgramDrafter final : public Drafter {
 public:
  static constexpr int32_t kMaxN = 32;

  // Throws OUT_OF_RANGE unless 1 ≤ min_n ≤ max_n ≤ kMaxN.
  NgramDrafter(int32_t min_n, int32_t max_n, DrafterCost cost = {});
  NgramDrafter(const NgramDrafter&) = delete;
  NgramDrafter& operator=(const NgramDrafter&) = delete;

  void begin(const int32_t* prompt, int32_t length) override;
  void propose(const DraftRequest& request, LmHeadRunner& runner, DraftProposal& out) override;
  DrafterCost cost() const override { return cost_; }

  // The index on its own: append tokens, then look up.
  void append(const int32_t* tokens, int32_t count);
  // Writes up to max_tokens tokens to out and returns how many (0: no match).
  // matched_n, if given, receives the length of the suffix matched (0 if none).
  int32_t lookup(int32_t max_tokens, int32_t* out, int32_t* matched_n = nullptr) const;
  int32_t length() const { return int32_t(tokens_.size()); }

 private:
  // Hash and equality of the n-gram ending at a position, read from tokens_.
  struct GramHash {
    const NgramDrafter* self;
    int32_t n;
    size_t operator()(int32_t end) const;
  };
  struct GramEqual {
    const NgramDrafter* self;
    int32_t n;
    bool operator()(int32_t a, int32_t b) const;
  };
  using GramMap = std::unordered_map<int32_t, int32_t, GramHash, GramEqual>;

  int32_t min_n_;
  int32_t max_n_;
  DrafterCost cost_;
  std::vector<int32_t> tokens_;
  std::vector<GramMap> maps_;  // maps_[n − min_n]: n-gram → most recent end with a follower
};

}  // namespace flashspec
