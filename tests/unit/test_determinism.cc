// Determinism: randomness depends only on (seed, request id, step,
// position, token). The same seed gives bit-identical drafts and verify
// outcomes for any CPU thread count; a request verified alone or inside a
// batch of others (other draft lengths, other positions) gets the same
// result; different steps or request ids give different samples.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "support.h"

namespace {

using namespace fstest;

constexpr int64_t kVocab = 2100;  // 9 CPU tiles, the last one partial
constexpr int64_t kHidden = 24;

struct DraftRun {
  std::vector<int32_t> tokens;
  std::vector<float> logq;
};

DraftRun sampled_draft(flashspec_context* ctx, flashspec_lm_head* head, const Matrix& hidden, float temperature,
                       const std::vector<uint64_t>& seeds, const std::vector<uint64_t>& ids,
                       const std::vector<uint64_t>& steps, const std::vector<int32_t>& positions) {
  DraftRun out{std::vector<int32_t>(size_t(hidden.rows), -1), std::vector<float>(size_t(hidden.rows), 0.0f)};
  flashspec_draft_params p;
  flashspec_draft_params_init(&p);
  p.temperature = temperature;
  p.seeds = seeds.empty() ? nullptr : seeds.data();
  p.request_ids = ids.empty() ? nullptr : ids.data();
  p.steps = steps.empty() ? nullptr : steps.data();
  p.positions = positions.empty() ? nullptr : positions.data();
  flashspec_tensor h = hidden.view();
  EXPECT_EQ(flashspec_draft(ctx, head, &h, &p, out.tokens.data(), out.logq.data()), FLASHSPEC_OK)
      << flashspec_context_last_error(ctx);
  return out;
}

// A batch whose drafts are plausible under the target (each draft is the
// target row's argmax, or a random token), so acceptance and rejection both
// happen; optionally with stochastic draft logits.
HostBatch plausible_batch(const Matrix& w, Rng& rng, const std::vector<int>& lengths, bool stochastic) {
  HostBatch hb;
  int64_t rows = 0, drafts = 0;
  for (int n : lengths) rows += n + 1, drafts += n;
  hb.hidden = random_matrix(FLASHSPEC_DTYPE_F32, rows, w.cols, rng, 1.0);
  int64_t row = 0;
  for (int n : lengths) {
    std::vector<int32_t> d(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) {
      ReferenceLogits ref = reference_logits(w, hb.hidden, row + j);
      d[size_t(j)] = rng.below(4) == 0 ? rng.below(w.rows) : argmax(ref.logit);
    }
    hb.drafts.push_back(d);
    row += n + 1;
  }
  if (stochastic) {
    hb.has_draft_logits = true;
    hb.draft_logits = random_matrix(FLASHSPEC_DTYPE_F32, drafts, w.rows, rng, 1.5);
    hb.draft_temperatures.assign(lengths.size(), 1.0f);
  }
  return hb;
}

TEST(Determinism, SameSeedSameTokensForAnyThreadCount) {
  Rng rng(41);
  Matrix w = random_matrix(FLASHSPEC_DTYPE_BF16, kVocab, kHidden, rng, 0.3);
  Matrix hidden = random_matrix(FLASHSPEC_DTYPE_F32, 10, kHidden, rng, 1.0);
  std::vector<uint64_t> seeds(10), ids(10), steps(10);
  std::vector<int32_t> positions(10);
  for (int r = 0; r < 10; ++r) {
    seeds[size_t(r)] = 1000 + uint64_t(r % 3);
    ids[size_t(r)] = 77 + uint64_t(r);
    steps[size_t(r)] = uint64_t(r * 5);
    positions[size_t(r)] = r % 4;
  }
  HostBatch greedy_drafts = plausible_batch(w, rng, {3, 0, 5, 2}, false);
  greedy_drafts.temperatures = {1.0f, 0.5f, 2.0f, 0.0f};
  greedy_drafts.seeds = {9, 9, 10, 11};
  greedy_drafts.request_ids = {1, 2, 3, 4};
  greedy_drafts.steps = {3, 3, 4, 5};
  HostBatch stochastic_drafts = plausible_batch(w, rng, {2, 4, 1}, true);
  stochastic_drafts.temperatures = {1.0f, 0.8f, 1.5f};
  stochastic_drafts.draft_temperatures = {1.0f, 0.6f, 2.0f};

  DraftRun first_draft;
  Outcome first_greedy, first_stochastic;
  bool have_first = false;
  for (int threads : {1, 2, 3, 7}) {
    auto ctx = make_context(ContextOptions().cpu_threads(threads).seed(123));
    HeadPtr head = make_head(ctx.get(), w.view());
    DraftRun d = sampled_draft(ctx.get(), head.get(), hidden, 0.9f, seeds, ids, steps, positions);
    Outcome g = verify_and_finalize(ctx.get(), head.get(), greedy_drafts);
    Outcome s = verify_and_finalize(ctx.get(), head.get(), stochastic_drafts);
    if (!have_first) {
      first_draft = d;
      first_greedy = g;
      first_stochastic = s;
      have_first = true;
      continue;
    }
    EXPECT_EQ(d.tokens, first_draft.tokens) << threads << " threads";
    EXPECT_EQ(d.logq, first_draft.logq) << threads << " threads";  // bit-identical
    EXPECT_TRUE(g == first_greedy) << threads << " threads";
    EXPECT_TRUE(s == first_stochastic) << threads << " threads";
  }
  // Run to run on one context: the same again.
  auto ctx = make_context(ContextOptions().cpu_threads(2).seed(123));
  HeadPtr head = make_head(ctx.get(), w.view());
  EXPECT_EQ(sampled_draft(ctx.get(), head.get(), hidden, 0.9f, seeds, ids, steps, positions).tokens,
            first_draft.tokens);
  EXPECT_TRUE(verify_and_finalize(ctx.get(), head.get(), greedy_drafts) == first_greedy);
}

// Request `target` of `batch`, cut out as a batch of its own.
HostBatch alone(const HostBatch& batch, size_t target) {
  HostBatch hb;
  hb.drafts = {batch.drafts[target]};
  const int64_t n = int64_t(batch.drafts[target].size());
  hb.hidden = Matrix(batch.hidden.dtype, n + 1, batch.hidden.cols);
  for (int64_t j = 0; j <= n; ++j) hb.hidden.copy_row(j, batch.hidden, batch.first_row(target) + j);
  hb.temperatures = {batch.temperatures[target]};
  hb.seeds = {batch.seeds[target]};
  hb.request_ids = {batch.request_ids[target]};
  hb.steps = {batch.steps[target]};
  if (batch.has_draft_logits) {
    hb.has_draft_logits = true;
    hb.draft_temperatures = {batch.draft_temperatures[target]};
    int64_t first = 0;
    for (size_t k = 0; k < target; ++k) first += int64_t(batch.drafts[k].size());
    hb.draft_logits = Matrix(batch.draft_logits.dtype, std::max<int64_t>(n, 1), batch.draft_logits.cols);
    for (int64_t j = 0; j < n; ++j) hb.draft_logits.copy_row(j, batch.draft_logits, first + j);
  }
  return hb;
}

TEST(Determinism, RequestAloneEqualsRequestInsideABatch) {
  Rng rng(42);
  // Sharp targets (logit spread ~7): drafted argmaxes are often but not
  // always accepted.
  Matrix w = random_matrix(FLASHSPEC_DTYPE_BF16, kVocab, kHidden, rng, 1.5);
  auto ctx = make_context(ContextOptions().cpu_threads(2).seed(5));
  HeadPtr head = make_head(ctx.get(), w.view());
  for (bool stochastic : {false, true}) {
    std::set<std::vector<int32_t>> distinct;
    std::set<int32_t> accepted_counts;
    for (uint64_t step = 0; step < 24; ++step) {
      HostBatch batch = plausible_batch(w, rng, {2, 5, 0, 3}, stochastic);
      batch.temperatures = {1.0f, 1.0f, 0.7f, 1.3f};
      batch.seeds = {31, 32, 33, 34};
      batch.request_ids = {1000, 42, 7, 1ull << 40};
      batch.steps = {step + 9, step, step + 1, 3};
      if (stochastic) batch.draft_temperatures = {1.0f, 0.9f, 1.0f, 1.2f};
      Outcome together = verify_and_finalize(ctx.get(), head.get(), batch);
      for (size_t target = 0; target < batch.drafts.size(); ++target) {
        HostBatch single = alone(batch, target);
        if (single.drafts[0].empty()) single.has_draft_logits = false;  // no drafts: no draft logits rows
        Outcome solo = verify_and_finalize(ctx.get(), head.get(), single);
        EXPECT_EQ(solo.accepted[0], together.accepted[target])
            << (stochastic ? "stochastic" : "greedy") << " step " << step << " request " << target;
        EXPECT_EQ(solo.emitted[0], together.emitted[target])
            << (stochastic ? "stochastic" : "greedy") << " step " << step << " request " << target;
        EXPECT_EQ(solo.next_steps[0], together.next_steps[target]);
      }
      // The same request (id 42, 5 drafts) with the same hidden rows, moved
      // to the front of a differently shaped batch.
      HostBatch moved = alone(batch, 1);
      HostBatch other = plausible_batch(w, rng, {1}, stochastic);
      moved.drafts.push_back(other.drafts[0]);
      Matrix h(FLASHSPEC_DTYPE_F32, moved.hidden.rows + 2, kHidden);
      for (int64_t r = 0; r < moved.hidden.rows; ++r) h.copy_row(r, moved.hidden, r);
      h.copy_row(moved.hidden.rows, other.hidden, 0);
      h.copy_row(moved.hidden.rows + 1, other.hidden, 1);
      moved.hidden = h;
      moved.temperatures.push_back(1.0f);
      moved.seeds.push_back(99);
      moved.request_ids.push_back(4242);
      moved.steps.push_back(0);
      if (stochastic) {
        Matrix q(FLASHSPEC_DTYPE_F32, 6, kVocab);
        for (int64_t r = 0; r < 5; ++r) q.copy_row(r, moved.draft_logits, r);
        q.copy_row(5, other.draft_logits, 0);
        moved.draft_logits = q;
        moved.draft_temperatures.push_back(1.0f);
      }
      Outcome shifted = verify_and_finalize(ctx.get(), head.get(), moved);
      EXPECT_EQ(shifted.accepted[0], together.accepted[1]) << "step " << step;
      EXPECT_EQ(shifted.emitted[0], together.emitted[1]) << "step " << step;
      distinct.insert(together.emitted[1]);
      accepted_counts.insert(together.accepted[1]);
    }
    // The comparisons above are not vacuous: outcomes vary with the step.
    EXPECT_GT(distinct.size(), 12u) << (stochastic ? "stochastic" : "greedy");
    EXPECT_GT(accepted_counts.size(), 2u) << (stochastic ? "stochastic" : "greedy");
  }
}

TEST(Determinism, StepsAndRequestIdsChangeTheSamples) {
  // A near-uniform target over 2100 tokens: equal samples for different
  // steps would be a broken key, not chance.
  Rng rng(43);
  Matrix w = random_matrix(FLASHSPEC_DTYPE_F32, kVocab, kHidden, rng, 0.02);
  auto ctx = make_context(ContextOptions().cpu_threads(2).seed(8));
  HeadPtr head = make_head(ctx.get(), w.view());
  Matrix one = random_matrix(FLASHSPEC_DTYPE_F32, 1, kHidden, rng, 1.0);
  Matrix rows(FLASHSPEC_DTYPE_F32, 16, kHidden);
  for (int64_t r = 0; r < 16; ++r) rows.copy_row(r, one, 0);
  std::vector<uint64_t> seeds(16, 3), same_id(16, 5), steps(16), ids(16), same_step(16, 2);
  std::vector<int32_t> positions(16, 1);
  for (int r = 0; r < 16; ++r) steps[size_t(r)] = uint64_t(r), ids[size_t(r)] = uint64_t(r) * 1000;
  auto by_step = sampled_draft(ctx.get(), head.get(), rows, 1.0f, seeds, same_id, steps, positions).tokens;
  auto by_id = sampled_draft(ctx.get(), head.get(), rows, 1.0f, seeds, ids, same_step, positions).tokens;
  EXPECT_GT(std::set<int32_t>(by_step.begin(), by_step.end()).size(), 13u);
  EXPECT_GT(std::set<int32_t>(by_id.begin(), by_id.end()).size(), 13u);
  // A row's sample does not depend on the other rows of the call.
  for (int r : {0, 7, 15}) {
    Matrix single(FLASHSPEC_DTYPE_F32, 1, kHidden);
    single.copy_row(0, rows, r);
    auto solo = sampled_draft(ctx.get(), head.get(), single, 1.0f, {3}, {5}, {uint64_t(r)}, {1});
    EXPECT_EQ(solo.tokens[0], by_step[size_t(r)]) << "row " << r;
  }
  // Bonus tokens (no drafts) at consecutive steps differ too.
  std::set<int32_t> bonus;
  for (uint64_t step = 0; step < 16; ++step) {
    HostBatch hb;
    hb.drafts = {{}};
    hb.hidden = one;
    hb.temperatures = {1.0f};
    hb.seeds = {3};
    hb.request_ids = {5};
    hb.steps = {step};
    Outcome o = verify_and_finalize(ctx.get(), head.get(), hb);
    bonus.insert(o.emitted[0][0]);
  }
  EXPECT_GT(bonus.size(), 13u);
}

}  // namespace
