// The CPU backend's tile pass (kernels/cpu/cpu_scan.h): the AVX2 logits
// kernel gives the portable kernel's bits, a logit does not depend on the
// tile or batch it is computed in; the Gumbel bounds bound the contract's
// Gumbel transform; and the pruned tile fold equals the unpruned one field
// for field, and the per-token fold of sampling/fold.h in all but the
// rounding of the log-sum-exp sum, on random and adversarial logits.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "../common/rng.h"
#include "kernels/cpu/cpu_scan.h"
#include "sampling/fold.h"
#include "sampling/gumbel_bounds.h"
#include "util/dtype.h"
#include "util/philox.h"

namespace {

using namespace flashspec;
using fstest::Rng;

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// Weights [count, d] of one dtype, from uniform values scaled by `scale`.
struct Weights {
  flashspec_dtype dtype;
  std::vector<float> f32;
  std::vector<uint16_t> half;
  cpu::WeightRows rows(int64_t d, int64_t first = 0) const {
    const void* base = dtype == FLASHSPEC_DTYPE_F32 ? static_cast<const void*>(f32.data() + first * d)
                                                    : static_cast<const void*>(half.data() + first * d);
    return cpu::WeightRows{base, dtype, d, nullptr};
  }
};

Weights make_weights(flashspec_dtype dtype, int64_t count, int64_t d, Rng& rng) {
  Weights w{dtype, {}, {}};
  for (int64_t i = 0; i < count * d; ++i) {
    const float x = float(rng.normal() * 0.3);
    if (dtype == FLASHSPEC_DTYPE_F32) w.f32.push_back(x);
    else w.half.push_back(dtype == FLASHSPEC_DTYPE_BF16 ? float_to_bf16(x) : float_to_fp16(x));
  }
  return w;
}

TEST(CpuScan, Avx2KernelGivesThePortableKernelsBits) {
  std::vector<float> probe(1);
  if (!cpu::tile_logits_avx2(cpu::WeightRows{probe.data(), FLASHSPEC_DTYPE_F32, 1, nullptr}, 1, probe.data(), 1, 1,
                             probe.data()))
    GTEST_SKIP() << "this CPU lacks AVX2, FMA or F16C: tile_logits runs the portable kernel only";
  Rng rng(5);
  for (flashspec_dtype dtype : {FLASHSPEC_DTYPE_F32, FLASHSPEC_DTYPE_BF16, FLASHSPEC_DTYPE_F16})
    for (int64_t d : {1, 7, 8, 13, 64, 515})
      for (int64_t rows : {1, 2, 3, 4, 5, 7, 16})
        for (int64_t count : {1, 3, 4, 9, 37}) {
          Weights w = make_weights(dtype, count, d, rng);
          std::vector<float> hidden(size_t(rows * d));
          for (float& h : hidden) h = float(rng.normal());
          std::vector<float> fast(size_t(rows * count), NAN), portable(size_t(rows * count), NAN);
          ASSERT_TRUE(cpu::tile_logits_avx2(w.rows(d), count, hidden.data(), rows, d, fast.data()));
          cpu::tile_logits_portable(w.rows(d), count, hidden.data(), rows, d, portable.data());
          for (size_t i = 0; i < fast.size(); ++i)
            ASSERT_TRUE(same_bits(fast[i], portable[i]))
                << "dtype " << dtype << " d " << d << " rows " << rows << " count " << count << " at " << i << ": "
                << fast[i] << " vs " << portable[i];
        }
}

// A logit is a function of its weight row and hidden row only: computing it
// alone (one token, one row) gives the bits it has inside a tile of a batch.
TEST(CpuScan, LogitDoesNotDependOnTileOrBatch) {
  Rng rng(6);
  for (flashspec_dtype dtype : {FLASHSPEC_DTYPE_F32, FLASHSPEC_DTYPE_BF16, FLASHSPEC_DTYPE_F16})
    for (int64_t d : {5, 64, 300}) {
      const int64_t count = 23, rows = 11;
      Weights w = make_weights(dtype, count, d, rng);
      std::vector<float> hidden(size_t(rows * d));
      for (float& h : hidden) h = float(rng.normal());
      std::vector<float> all(size_t(rows * count));
      cpu::tile_logits(w.rows(d), count, hidden.data(), rows, d, all.data());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t k = 0; k < count; ++k) {
          float alone = NAN;
          cpu::tile_logits(w.rows(d, k), 1, hidden.data() + r * d, 1, d, &alone);
          ASSERT_TRUE(same_bits(alone, all[size_t(r * count + k)])) << "d " << d << " row " << r << " token " << k;
        }
    }
}

TEST(CpuScan, SumExpIsAccurateAndTheSameOnBothKernels) {
  Rng rng(10);
  for (int64_t n : {1, 5, 8, 9, 64, 255, 256}) {
    for (double spread : {0.0, 1.0, 10.0, 100.0, 1000.0}) {
      std::vector<float> x(static_cast<size_t>(n));
      float m = -INFINITY;
      for (float& v : x) {
        v = float(rng.normal() * spread);
        m = std::max(m, v);
      }
      double exact = 0.0;
      for (float v : x) exact += std::exp(double(v) - double(m));
      const float portable = cpu::sum_exp_portable(x.data(), n, m);
      // Each term within a few ulp, then n float additions.
      EXPECT_NEAR(portable, exact, exact * (4.0 + double(n)) * std::ldexp(1.0, -24)) << "n " << n << " spread " << spread;
      float fast = NAN;
      if (cpu::sum_exp_avx2(x.data(), n, m, &fast)) {
        EXPECT_TRUE(same_bits(fast, portable)) << "n " << n << " spread " << spread << ": " << fast << " vs " << portable;
      }
    }
  }
  // exp itself, term by term, over the range that matters (x − m in [−87, 0]).
  for (int i = 0; i < 87000; ++i) {
    const float t = -float(i) * 1e-3f;
    const float zero = 0.0f;
    const double exact = std::exp(double(t));
    const float got = cpu::sum_exp_portable(&t, 1, zero);
    ASSERT_NEAR(got, exact, 2.0 * std::ldexp(exact, -23)) << "exp(" << t << ")";
  }
  // Below the floor a term is e^−87 (which no sum holding 1 can see).
  const float far = -1000.0f, floor = -87.0f, zero = 0.0f;
  EXPECT_EQ(cpu::sum_exp_portable(&far, 1, zero), cpu::sum_exp_portable(&floor, 1, zero));
  const float terms[2] = {0.0f, -1000.0f};
  EXPECT_EQ(cpu::sum_exp_portable(terms, 2, zero), 1.0f);
}

TEST(CpuScan, MayPlaceIsTheSameOnBothKernels) {
  Rng rng(11);
  std::vector<float> bounds(256);
  for (uint32_t b = 0; b < 256; ++b) bounds[b] = cpu::gumbel_bucket_bound(b);
  for (int trial = 0; trial < 2000; ++trial) {
    float x[32];
    uint32_t words[32];
    for (int j = 0; j < 32; ++j) {
      x[j] = rng.below(50) == 0 ? NAN : float(rng.normal() * 5.0);
      words[j] = uint32_t(rng.next());
    }
    const float runner_up = float(rng.normal() * 10.0);
    for (int64_t n : {1, 7, 31, 32})
      for (const uint32_t* w : {static_cast<const uint32_t*>(nullptr), static_cast<const uint32_t*>(words)}) {
        const uint32_t fast = cpu::may_place(x, w, n, runner_up, bounds.data(), bounds[255]);
        uint32_t expected = 0;
        for (int64_t j = 0; j < n; ++j)
          if (x[j] + (w ? bounds[w[j] >> 24] : bounds[255]) > runner_up) expected |= 1u << j;
        ASSERT_EQ(fast, expected) << "n " << n;
        ASSERT_EQ(cpu::may_place(x, w, n, runner_up, bounds.data(), bounds[255], cpu::Kernel::kPortable), expected);
      }
  }
}

TEST(CpuScan, RowWordsAreThePhiloxBlocks) {
  for (uint32_t first : {0u, 1u, 7u, 0x3fff0u, 0x3fffcu, 123456u})
    for (int64_t n : {1, 7, 8, 9, 17, 64}) {
      const RngRowKey key = make_row_key(0x123456789abcdefull + first, 77, 5, 3, FLASHSPEC_RNG_DRAFT_NOISE);
      std::vector<uint32_t> words(static_cast<size_t>(4 * n));
      cpu::row_words(key, first, n, words.data());
      for (int64_t i = 0; i < n; ++i) {
        const Philox4 block = row_block(key, first + uint32_t(i));
        for (int j = 0; j < 4; ++j)
          ASSERT_EQ(words[size_t(4 * i + j)], block.v[j]) << "first " << first << " block " << i << " word " << j;
      }
    }
}

void check_gumbel_bound(uint32_t x) {
  const float g = gumbel_from_bits(x);
  // The error model the bounds rest on (sampling/gumbel_bounds.h: margin 1e-3 + 1e-4·|g|).
  ASSERT_LE(std::fabs(double(g) - exact_gumbel(x)), 1e-4) << "x = " << x;
  ASSERT_LE(g, cpu::gumbel_bucket_bound(x >> 24)) << "x = " << x;
  ASSERT_LE(g, cpu::gumbel_max_bound()) << "x = " << x;
}

TEST(CpuScan, GumbelBucketBoundsBoundTheContractsTransform) {
  for (uint32_t b = 1; b < 256; ++b) ASSERT_LE(cpu::gumbel_bucket_bound(b - 1), cpu::gumbel_bucket_bound(b));
  EXPECT_EQ(cpu::gumbel_max_bound(), cpu::gumbel_bucket_bound(255));
  // Where each bucket ends and the next begins, where the transform is
  // steepest (both ends of the range), and random words.
  for (uint64_t b = 0; b <= 256; ++b)
    for (int64_t delta = -4096; delta < 4096; ++delta) {
      const int64_t x = int64_t(b << 24) + delta;
      if (x >= 0 && x <= int64_t(0xffffffffu)) {
        check_gumbel_bound(uint32_t(x));
      }
    }
  for (uint32_t x = 0; x < (1u << 20); ++x) {
    check_gumbel_bound(x);
    check_gumbel_bound(0xffffffffu - x);
    check_gumbel_bound(0x80000000u - 1 - x);
    check_gumbel_bound(0x80000000u + x);
  }
  Rng rng(7);
  for (int i = 0; i < (1 << 22); ++i) check_gumbel_bound(uint32_t(rng.next()));
  // Not loose where it matters: the top bucket's bound is within 0.01 of
  // the largest value the transform gives.
  EXPECT_LT(cpu::gumbel_max_bound() - gumbel_from_bits(0xffffffffu), 0.01f);
}

void expect_same_partial(const Partial& a, const Partial& b, const std::string& what, bool compare_s = true) {
  EXPECT_TRUE(same_bits(a.m, b.m)) << what << ": m " << a.m << " vs " << b.m;
  if (compare_s) {
    EXPECT_TRUE(same_bits(a.s, b.s)) << what << ": s " << a.s << " vs " << b.s;
  }
  EXPECT_TRUE(same_bits(a.best, b.best)) << what << ": best " << a.best << " vs " << b.best;
  EXPECT_TRUE(same_bits(a.best_scaled, b.best_scaled)) << what << ": best_scaled";
  EXPECT_EQ(a.token, b.token) << what;
  EXPECT_TRUE(same_bits(a.second, b.second)) << what << ": second " << a.second << " vs " << b.second;
  EXPECT_TRUE(same_bits(a.tracked, b.tracked)) << what << ": tracked";
  EXPECT_EQ(a.flags, b.flags) << what;
}

// The per-token fold of sampling/fold.h over the same tokens, its
// candidates offered in the given form (OfferForm).
template <OfferForm kForm = OfferForm::kBranches>
Partial fold_each(const RowPlan& plan, const std::vector<float>& l, int32_t first_token) {
  Partial p = empty_partial();
  const bool greedy = plan.flags & kPlanGreedy;
  for (size_t k = 0; k < l.size(); ++k) {
    const int32_t token = first_token + int32_t(k);
    fold_logit<kForm>(p, plan, l[k], token, greedy ? 0u : row_word(plan.key, token));
  }
  return p;
}

RowPlan sampled_plan(float temperature, int32_t tracked, int32_t excluded, uint64_t seed) {
  RowPlan plan = inert_plan(FLASHSPEC_OK);
  plan.flags = temperature == 0.0f ? kPlanGreedy : 0;
  plan.inv_t = temperature == 0.0f ? 1.0f : 1.0f / temperature;
  plan.tracked = tracked;
  plan.excluded = excluded;
  if (temperature > 0.0f) plan.key = make_row_key(seed, 3, 4, 1, FLASHSPEC_RNG_RESIDUAL_NOISE);
  return plan;
}

// Logit rows of many kinds: what the fold sees in practice and the cases
// where a wrong skip would show (ties, a winner at the very end, runner-ups
// set late, plateaus of equal values, huge spreads where nearly every token
// is skipped, values at the edge of the Gumbel bound).
std::vector<std::vector<float>> logit_cases(Rng& rng, int64_t count) {
  std::vector<std::vector<float>> cases;
  for (double scale : {0.01, 1.0, 3.0, 30.0, 300.0}) {
    std::vector<float> l(static_cast<size_t>(count));
    for (float& x : l) x = float(rng.normal() * scale);
    cases.push_back(l);
  }
  cases.push_back(std::vector<float>(size_t(count), 1.5f));  // all equal
  {
    std::vector<float> l(static_cast<size_t>(count));  // increasing: the winner keeps changing
    for (int64_t k = 0; k < count; ++k) l[size_t(k)] = float(k) * 0.5f;
    cases.push_back(l);
  }
  {
    std::vector<float> l(static_cast<size_t>(count));  // decreasing in big steps: all but the first few skipped
    for (int64_t k = 0; k < count; ++k) l[size_t(k)] = -float(k) * 7.0f;
    cases.push_back(l);
  }
  {
    std::vector<float> l(static_cast<size_t>(count), -1000.0f);  // one spike at the end, one at the start
    l.back() = 50.0f;
    l.front() = 49.0f;
    cases.push_back(l);
  }
  {
    // Two plateaus exactly the top bucket bound apart, with tokens just
    // above and below: skips decided by a hair.
    const float gap = cpu::gumbel_max_bound();
    std::vector<float> l(static_cast<size_t>(count));
    for (int64_t k = 0; k < count; ++k) {
      const int kind = rng.below(4);
      l[size_t(k)] = kind == 0 ? 10.0f
                               : kind == 1 ? 10.0f - gap
                                           : kind == 2 ? std::nextafter(10.0f - gap, 0.0f)
                                                       : std::nextafter(10.0f - gap, -100.0f);
    }
    cases.push_back(l);
  }
  {
    std::vector<float> l(static_cast<size_t>(count));  // few distinct values: many exact ties
    for (float& x : l) x = float(rng.below(3)) * 4.0f;
    cases.push_back(l);
  }
  return cases;
}

TEST(CpuScan, PrunedFoldIsTheUnprunedFoldBitForBit) {
  Rng rng(8);
  int64_t noised_pruned = 0, noised_all = 0;
  for (int64_t count : {1, 2, 5, 64, 255, 256})
    for (int32_t first : {0, 3, 1000, 128001})
      for (float temperature : {0.0f, 0.25f, 1.0f, 3.0f})
        for (const std::vector<float>& l : logit_cases(rng, count)) {
          const int32_t inside = first + rng.below(count);
          for (int32_t excluded : {-1, inside, first}) {
            const RowPlan plan = sampled_plan(temperature, inside, temperature > 0.0f ? excluded : -1, rng.next());
            const std::string what = "count " + std::to_string(count) + " first " + std::to_string(first) + " T " +
                                     std::to_string(temperature) + " excluded " + std::to_string(excluded);
            const Partial pruned = cpu::fold_tile(plan, l.data(), count, first, true, &noised_pruned);
            const Partial all = cpu::fold_tile(plan, l.data(), count, first, false, &noised_all);
            expect_same_partial(pruned, all, what);
            // The portable code, pruned or not: the same bits.
            expect_same_partial(cpu::fold_tile(plan, l.data(), count, first, true, nullptr, cpu::Kernel::kPortable),
                                all, what + " portable");
            expect_same_partial(cpu::fold_tile(plan, l.data(), count, first, false, nullptr, cpu::Kernel::kPortable),
                                all, what + " portable, unpruned");
            // And the per-token fold: the same but for the rounding of s.
            const Partial each = fold_each(plan, l, first);
            expect_same_partial(pruned, each, what, /*compare_s=*/false);
            EXPECT_NEAR(pruned.s, each.s, 1e-5 * each.s + 1e-30) << what;
          }
        }
  // The pruning did skip most tokens' noise here; without it, none.
  EXPECT_LT(noised_pruned * 2, noised_all);
}

// A skip rule that ignores the runner-up (skipping what cannot beat the
// winner) is wrong; the cases above catch it: the check has power.
TEST(CpuScan, CasesCatchASkipThatIgnoresTheRunnerUp) {
  Rng rng(8);
  int differing = 0;
  for (const std::vector<float>& l : logit_cases(rng, 256)) {
    const RowPlan plan = sampled_plan(1.0f, -1, -1, rng.next());
    Partial wrong = empty_partial();
    for (size_t k = 0; k < l.size(); ++k) {
      const float x = l[k] * plan.inv_t;
      if (x + cpu::gumbel_max_bound() <= wrong.best) continue;  // the deliberate mistake
      offer_candidate(wrong, x + gumbel_from_bits(row_word(plan.key, int32_t(k))), x, int32_t(k));
    }
    const Partial right = cpu::fold_tile(plan, l.data(), 256, 0, true);
    if (!same_bits(wrong.second, right.second)) ++differing;
  }
  EXPECT_GT(differing, 0);
}

// A fold whose tokens go round-robin to kLanes partials of one row, which
// are merged at the end, as the 17–64-row TMA scan's lanes fold theirs: each
// partial offers a sampled token only where may_reach_merged admits it
// against its own runner-up and a floor that `floor_of` takes from the
// partials every 16 tokens. Tokens first + k, k < l.size().
constexpr int kLanes = 4;
template <class FloorOf>
Partial fold_lanes_with_floor(const RowPlan& plan, const std::vector<float>& l, int32_t first, FloorOf&& floor_of,
                              int64_t* noised) {
  const std::array<float, 256>& bounds = gumbel_bucket_bounds();
  Partial lanes[kLanes] = {empty_partial(), empty_partial(), empty_partial(), empty_partial()};
  float floor = neg_inf();
  for (size_t k = 0; k < l.size(); ++k) {
    if (k % 16 == 0) floor = floor_of(lanes);
    Partial& p = lanes[k % kLanes];
    const int32_t token = first + int32_t(k);
    const float scaled = fold_logit_mass(p, plan, l[k], token);
    if (plan.flags & kPlanGreedy) {
      offer_logit(p, plan, scaled, token, 0.0f);
      continue;
    }
    const uint32_t word = row_word(plan.key, token);
    if (!may_reach_merged(scaled, bounds[word >> 24], p.second, floor)) continue;
    ++*noised;
    offer_logit(p, plan, scaled, token, gumbel_from_bits(word));
  }
  Partial all = lanes[0];
  for (int lane = 1; lane < kLanes; ++lane) merge_partial(all, lanes[lane]);
  return all;
}

// A floor from the other partials' runner-ups leaves the merged partial as
// the unpruned fold's, bit for bit (the per-token fold here differs only in
// the rounding of s, summed in another order).
TEST(CpuScan, FloorOfMergedPartialsLeavesTheMergeBitForBit) {
  Rng rng(9);
  int64_t noised = 0, tokens = 0;
  const auto runner_ups = [](const Partial (&lanes)[kLanes]) {
    float floor = lanes[0].second;
    for (const Partial& p : lanes) floor = std::fmax(floor, p.second);
    return floor;
  };
  for (int64_t count : {1, 5, 64, 255, 1024})
    for (float temperature : {0.0f, 0.25f, 1.0f, 3.0f})
      for (const std::vector<float>& l : logit_cases(rng, count)) {
        const int32_t first = 1000, inside = first + rng.below(count);
        for (int32_t excluded : {-1, inside}) {
          const RowPlan plan = sampled_plan(temperature, inside, temperature > 0.0f ? excluded : -1, rng.next());
          const std::string what = "count " + std::to_string(count) + " T " + std::to_string(temperature) +
                                   " excluded " + std::to_string(excluded);
          const Partial merged = fold_lanes_with_floor(plan, l, first, runner_ups, &noised);
          const Partial each = fold_each(plan, l, first);
          expect_same_partial(merged, each, what, /*compare_s=*/false);
          EXPECT_NEAR(merged.s, each.s, 1e-5 * each.s + 1e-30) << what;
          if (temperature > 0.0f) tokens += count;
        }
      }
  // The floor and the bounds did skip most tokens' noise.
  EXPECT_LT(noised * 2, tokens);
}

// A floor from the partials' winners rather than their runner-ups is wrong
// (a token below another partial's winner may still be the merged
// runner-up); the cases above catch it: the check has power.
TEST(CpuScan, CasesCatchAFloorFromTheWinners) {
  Rng rng(9);
  int differing = 0;
  int64_t noised = 0;
  const auto winners = [](const Partial (&lanes)[kLanes]) {
    float floor = lanes[0].best;
    for (const Partial& p : lanes) floor = std::fmax(floor, p.best);
    return floor;
  };
  for (const std::vector<float>& l : logit_cases(rng, 256)) {
    const RowPlan plan = sampled_plan(1.0f, -1, -1, rng.next());
    const Partial wrong = fold_lanes_with_floor(plan, l, 0, winners, &noised);
    const Partial right = fold_each(plan, l, 0);
    if (!same_bits(wrong.second, right.second) || wrong.token != right.token) ++differing;
  }
  EXPECT_GT(differing, 0);
}

// The logit cases with non-finite values among them: NaN, ±Inf, a scaled
// logit that overflows.
std::vector<std::vector<float>> logit_cases_with_non_finite(Rng& rng, int64_t count) {
  std::vector<std::vector<float>> cases = logit_cases(rng, count);
  for (float bad : {NAN, INFINITY, -INFINITY, 3e38f}) {
    std::vector<float> l = logit_cases(rng, count)[1];
    for (size_t k = 0; k < l.size(); k += 7) l[k] = bad;
    cases.push_back(l);
  }
  return cases;
}

// The folds that keep their partials in registers (the TMA-ring scans, the
// many-row fold) offer candidates by selects, the others by branches: the
// same partial, bit for bit, ties, exclusions and non-finite scores
// included.
TEST(CpuScan, CandidatesBySelectsAreCandidatesByBranches) {
  Rng rng(10);
  for (int64_t count : {1, 2, 5, 64, 255})
    for (float temperature : {0.0f, 0.25f, 1.0f, 3.0f})
      for (const std::vector<float>& l : logit_cases_with_non_finite(rng, count)) {
        const int32_t first = 1000, inside = first + rng.below(count);
        for (int32_t excluded : {-1, inside, first}) {
          const RowPlan plan = sampled_plan(temperature, inside, temperature > 0.0f ? excluded : -1, rng.next());
          const std::string what = "count " + std::to_string(count) + " T " + std::to_string(temperature) +
                                   " excluded " + std::to_string(excluded);
          expect_same_partial(fold_each<OfferForm::kSelects>(plan, l, first), fold_each(plan, l, first), what);
        }
      }
}

// A select form that lets a tie displace the winner (the later token
// winning) is wrong; the cases above catch it: the check has power.
TEST(CpuScan, CasesCatchASelectFormThatBreaksTiesLate) {
  Rng rng(10);
  int differing = 0;
  for (const std::vector<float>& l : logit_cases(rng, 64)) {
    const RowPlan plan = sampled_plan(0.0f, -1, -1, rng.next());
    Partial wrong = empty_partial();
    for (size_t k = 0; k < l.size(); ++k) {
      const bool wins = l[k] >= wrong.best;  // the deliberate mistake: >= for >
      wrong.second = wins ? wrong.best : l[k] > wrong.second ? l[k] : wrong.second;
      wrong.best = wins ? l[k] : wrong.best;
      wrong.best_scaled = wins ? l[k] : wrong.best_scaled;
      wrong.token = wins ? int32_t(k) : wrong.token;
    }
    const Partial right = fold_each<OfferForm::kSelects>(plan, l, 0);
    if (wrong.token != right.token || !same_bits(wrong.second, right.second)) ++differing;
  }
  EXPECT_GT(differing, 0);
}

TEST(CpuScan, NonFiniteLogitsSetTheFoldsFlags) {
  for (float bad : {NAN, INFINITY, -INFINITY})
    for (float temperature : {0.0f, 1.0f}) {
      std::vector<float> l(40, 1.0f);
      l[17] = bad;
      const RowPlan plan = sampled_plan(temperature, 3, -1, 9);
      EXPECT_EQ(cpu::fold_tile(plan, l.data(), 40, 0).flags, fold_each(plan, l, 0).flags);
    }
  // A finite logit whose l/T overflows.
  std::vector<float> l(8, 1.0f);
  l[2] = 3e38f;
  const RowPlan plan = sampled_plan(0.01f, -1, -1, 9);
  EXPECT_EQ(cpu::fold_tile(plan, l.data(), 8, 0).flags, kPartialScaleOverflow);
  EXPECT_EQ(fold_each(plan, l, 0).flags, kPartialScaleOverflow);
}

}  // namespace
