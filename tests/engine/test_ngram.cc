// The n-gram prompt-lookup drafter: longest suffix in [min_n, max_n], most
// recent earlier match, k bounded, no match, and equivalence with a
// brute-force search on random sequences built incrementally.
#include <gtest/gtest.h>

#include <vector>

#include "engine/ngram_drafter.h"
#include "engine_support.h"
#include "util/status.h"

namespace {

using flashspec::NgramDrafter;

std::vector<int32_t> lookup(NgramDrafter& drafter, const std::vector<int32_t>& context, int32_t k,
                            int32_t* matched = nullptr) {
  drafter.begin(context.data(), int32_t(context.size()));
  std::vector<int32_t> out(size_t(std::max(k, 0)), -7);
  const int32_t n = drafter.lookup(k, out.data(), matched);
  out.resize(size_t(n));
  return out;
}

// Longest suffix (n from max_n down to min_n) with an earlier occurrence,
// most recent one; the copy may run into its own output.
std::vector<int32_t> brute_force(const std::vector<int32_t>& s, int32_t min_n, int32_t max_n, int32_t k) {
  const int32_t len = int32_t(s.size());
  for (int32_t n = std::min(max_n, len - 1); n >= min_n; --n) {
    for (int32_t end = len - 2; end >= n - 1; --end) {
      bool same = true;
      for (int32_t i = 0; i < n && same; ++i) same = s[size_t(end - i)] == s[size_t(len - 1 - i)];
      if (!same) continue;
      std::vector<int32_t> ext = s;
      std::vector<int32_t> out;
      for (int32_t i = 0; i < k; ++i) {
        out.push_back(ext[size_t(end + 1 + i)]);
        ext.push_back(out.back());
      }
      return out;
    }
  }
  return {};
}

TEST(NgramDrafter, ProposesWhatFollowedTheSuffix) {
  NgramDrafter d(1, 3);
  int32_t matched = -1;
  EXPECT_EQ(lookup(d, {1, 2, 3, 4, 1, 2}, 3, &matched), (std::vector<int32_t>{3, 4, 1}));
  EXPECT_EQ(matched, 2);
}

TEST(NgramDrafter, LongestSuffixBeatsAMoreRecentShorterOne) {
  // "1 2" occurred at positions 1..2 (followed by 9); "2" alone most recently
  // at 5 (followed by 8).
  const std::vector<int32_t> context = {5, 1, 2, 9, 7, 2, 8, 1, 2};
  NgramDrafter longest(1, 3);
  int32_t matched = 0;
  EXPECT_EQ(lookup(longest, context, 1, &matched), (std::vector<int32_t>{9}));
  EXPECT_EQ(matched, 2);
  NgramDrafter unigram(1, 1);
  EXPECT_EQ(lookup(unigram, context, 1, &matched), (std::vector<int32_t>{8}));
  EXPECT_EQ(matched, 1);
}

TEST(NgramDrafter, MostRecentMatchWins) {
  NgramDrafter d(2, 2);
  EXPECT_EQ(lookup(d, {1, 2, 7, 1, 2, 8, 1, 2}, 1), (std::vector<int32_t>{8}));
}

TEST(NgramDrafter, MinNIsRespected) {
  const std::vector<int32_t> context = {1, 2, 3, 9, 3};
  NgramDrafter bigram(2, 4);
  EXPECT_TRUE(lookup(bigram, context, 4).empty());
  NgramDrafter unigram(1, 4);
  EXPECT_EQ(lookup(unigram, context, 2), (std::vector<int32_t>{9, 3}));
}

TEST(NgramDrafter, MaxNIsRespected) {
  // A 3-gram match (followed by 5) and a more recent 2-gram match (followed
  // by 6): with max_n = 2 the 3-gram is not looked for.
  const std::vector<int32_t> context = {1, 2, 3, 5, 0, 2, 3, 6, 1, 2, 3};
  NgramDrafter three(1, 3);
  EXPECT_EQ(lookup(three, context, 1), (std::vector<int32_t>{5}));
  NgramDrafter two(1, 2);
  EXPECT_EQ(lookup(two, context, 1), (std::vector<int32_t>{6}));
}

TEST(NgramDrafter, KBoundsTheDraftAndTheCopyRunsOnPeriodically) {
  NgramDrafter d(1, 4);
  EXPECT_EQ(lookup(d, {1, 2, 1, 2}, 5), (std::vector<int32_t>{1, 2, 1, 2, 1}));
  EXPECT_EQ(lookup(d, {1, 2, 1, 2}, 1), (std::vector<int32_t>{1}));
  EXPECT_TRUE(lookup(d, {1, 2, 1, 2}, 0).empty());
  EXPECT_EQ(lookup(d, {4, 4}, 3), (std::vector<int32_t>{4, 4, 4}));
}

TEST(NgramDrafter, NoMatchNoDraft) {
  NgramDrafter d(1, 4);
  EXPECT_TRUE(lookup(d, {1, 2, 3, 4}, 4).empty());
  EXPECT_TRUE(lookup(d, {7}, 4).empty());
}

TEST(NgramDrafter, RejectsBadN) {
  EXPECT_THROW(NgramDrafter(0, 2), flashspec::Error);
  EXPECT_THROW(NgramDrafter(3, 2), flashspec::Error);
  EXPECT_THROW(NgramDrafter(1, NgramDrafter::kMaxN + 1), flashspec::Error);
}

TEST(NgramDrafter, IncrementalIndexMatchesBruteForce) {
  fstest::Rng rng(7);
  for (int trial = 0; trial < 60; ++trial) {
    const int32_t alphabet = 2 + rng.below(4);
    const int32_t min_n = 1 + rng.below(3);
    const int32_t max_n = min_n + rng.below(4);
    NgramDrafter d(min_n, max_n);
    std::vector<int32_t> seq = {rng.below(alphabet)};
    d.begin(seq.data(), 1);
    while (seq.size() < 120) {
      // Grow by a random chunk, appended incrementally as the engine does.
      const int32_t chunk = 1 + rng.below(3);
      for (int32_t i = 0; i < chunk; ++i) seq.push_back(rng.below(alphabet));
      d.append(seq.data() + d.length(), int32_t(seq.size()) - d.length());
      const int32_t k = 1 + rng.below(6);
      std::vector<int32_t> proposal(static_cast<size_t>(k));
      proposal.resize(size_t(d.lookup(k, proposal.data())));
      ASSERT_EQ(proposal, brute_force(seq, min_n, max_n, k))
          << "trial " << trial << " length " << seq.size() << " n in [" << min_n << ", " << max_n << "]";
      ASSERT_LE(int32_t(proposal.size()), k);
    }
  }
}

}  // namespace
