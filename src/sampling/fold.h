// The fold rules of the one pass over the LM head, shared by every backend:
// how a logit enters a row's running reduction, how two reductions of
// adjacent token ranges merge, and what a row's final reduction becomes.
// CPU/CUDA parity rests on these being one implementation.
//
// A Partial reduces a row over a token range: the log-sum-exp of l/T kept
// online (m, s = Σ exp(x − m)), the Gumbel (T > 0) or logit (T = 0) winner
// and runner-up, and the tracked token's scaled logit. Tokens reach a Partial
// in increasing order and merges break ties towards the smaller token id, so
// the winner does not depend on how the vocabulary was cut.
#pragma once

#include <cmath>
#include <cstdint>

#include "flashspec.h"
#include "sampling/row_plan.h"
#include "sampling/row_summary.h"
#include "util/host_device.h"
#include "util/philox.h"

namespace flashspec {

constexpr int32_t kPartialTracked = 1;        // `tracked` holds the tracked token's l/T
constexpr int32_t kPartialNonFinite = 2;      // a logit is NaN or ±Inf
constexpr int32_t kPartialScaleOverflow = 4;  // a finite logit overflowed when divided by T

struct Partial {
  float m;            // max of l/T (T > 0)
  float s;            // Σ exp(l/T − m)
  float best;         // the winner's score
  float best_scaled;  // the winner's l/T (T > 0) or l (T = 0)
  int32_t token;      // the winner, −1 for an empty range
  float second;       // the runner-up's score
  float tracked;      // l/T of the tracked token
  int32_t flags;      // kPartial*
};
static_assert(sizeof(Partial) == 32, "a Partial is two 16-byte words on the device");

// Best candidate of the residual max(p − q, 0) of a stochastic draft over a
// token range.
struct Residual {
  float best;
  int32_t token;  // −1: no token of the range has p > q
  float second;
  int32_t pad;
};

FS_HOST_DEVICE Partial empty_partial() {
  Partial p;
  p.m = neg_inf();
  p.s = 0.0f;
  p.best = neg_inf();
  p.best_scaled = 0.0f;
  p.token = -1;
  p.second = neg_inf();
  p.tracked = 0.0f;
  p.flags = 0;
  return p;
}

FS_HOST_DEVICE Residual empty_residual() {
  Residual r;
  r.best = neg_inf();
  r.token = -1;
  r.second = neg_inf();
  r.pad = 0;
  return r;
}

// Online log-sum-exp: (m, s) ← (m, s) ∪ {x}: if x > m, s·e^(m − x) + 1 and
// m = x; otherwise s + e^(x − m). One exponential, e^−|x − m| (m − x is
// −(x − m) exactly), and selects rather than an exponential on each of two
// branches: a warp whose lanes split ran both, and the branch kept a lane's
// independent folds from overlapping (bench/RESULTS.md).
FS_HOST_DEVICE void lse_add(float& m, float& s, float x) {
  const bool above = x > m;
  const float e = expf(-fabsf(x - m));
  s = above ? s * e + 1.0f : s + e;
  m = above ? x : m;
}

// (m, s) ← (m, s) ∪ (bm, bs): if bm > m, s·e^(m − bm) + bs and m = bm;
// otherwise s + bs·e^(bm − m) (s unchanged where bs is empty, bm = −∞).
// One exponential and selects, as lse_add: a chain of merges (the end of a
// scan, a CTA's partials combined) waits on each in turn, and the branches
// made each take several times as long.
FS_HOST_DEVICE void lse_merge(float& m, float& s, float bm, float bs) {
  const bool above = bm > m;
  const float e = expf(-fabsf(bm - m));
  s = above ? s * e + bs : bm != neg_inf() ? s + bs * e : s;
  m = above ? bm : m;
}

FS_HOST_DEVICE float lse_value(float m, float s) { return m + logf(s); }

// Score gap between a winner and its runner-up; +Inf without a runner-up.
FS_HOST_DEVICE float winner_gap(float best, float second) {
  return second == neg_inf() ? pos_inf() : best - second;
}

// How a fold applies offer_candidate's rule; both forms leave a partial
// bit for bit the same. Branches store the candidate's fields only where
// the candidate changes: the form for folds whose partials live in memory
// (the CPU backend, the ≤ 16-row register scan, whose partials are in shared
// memory: selects there wrote them back at every logit and made that scan
// 9–11 % slower, greedy drafts included). Selects leave no branch in a
// lane's chain of offers, so that its independent folds overlap: the form
// for folds whose partials live in registers (the TMA-ring scans and the
// many-row fold: H200, 0.3–1 % faster, bench/RESULTS.md).
enum class OfferForm { kBranches, kSelects };

// Offers `token`, with its score (l/T + g, or l for T = 0) and scaled logit,
// as p's winner or runner-up. Tokens come in increasing order, so a tie
// keeps the earlier, smaller id. A score that is not above p.second changes
// nothing (the CPU backend skips such tokens' noise on that ground).
template <OfferForm kForm = OfferForm::kBranches>
FS_HOST_DEVICE void offer_candidate(Partial& p, float score, float scaled, int32_t token) {
  if constexpr (kForm == OfferForm::kSelects) {
    const bool wins = score > p.best;
    p.second = wins ? p.best : score > p.second ? score : p.second;
    p.best = wins ? score : p.best;
    p.best_scaled = wins ? scaled : p.best_scaled;
    p.token = wins ? token : p.token;
  } else if (score > p.best) {
    p.second = p.best;
    p.best = score;
    p.best_scaled = scaled;
    p.token = token;
  } else if (score > p.second) {
    p.second = score;
  }
}

// The two halves of fold_logit_with_gumbel below, for a fold that offers
// its sampled tokens after the rest of their step: fold_logit_mass folds
// logit l of `token` into p's non-finite flags, tracked logit and (sampled
// rows) log-sum-exp and returns its scaled logit; offer_logit then offers
// the token as a candidate with its score (scaled, plus `gumbel` on a
// sampled row). A row's tokens must still be offered in increasing order.
FS_HOST_DEVICE float fold_logit_mass(Partial& p, const RowPlan& plan, float l, int32_t token) {
  const bool greedy = plan.flags & kPlanGreedy;
  const float scaled = greedy ? l : l * plan.inv_t;
  if (!is_finite(scaled)) p.flags |= is_finite(l) ? kPartialScaleOverflow : kPartialNonFinite;
  if (token == plan.tracked) {
    p.tracked = scaled;
    p.flags |= kPartialTracked;
  }
  if (!greedy) lse_add(p.m, p.s, scaled);
  return scaled;
}
// Whether `token` is offered as a candidate at all: every token but the
// plan's excluded one. A fold by selects offers the excluded token the score
// −∞ instead, which is above neither score and so changes nothing, as
// skipping it does.
FS_HOST_DEVICE bool is_offered(const RowPlan& plan, int32_t token) { return token != plan.excluded; }
template <OfferForm kForm = OfferForm::kBranches>
FS_HOST_DEVICE void offer_logit(Partial& p, const RowPlan& plan, float scaled, int32_t token, float gumbel) {
  if constexpr (kForm == OfferForm::kSelects) {
    const float score = plan.flags & kPlanGreedy ? scaled : scaled + gumbel;
    offer_candidate<kForm>(p, is_offered(plan, token) ? score : neg_inf(), scaled, token);
  } else {
    if (!is_offered(plan, token)) return;
    offer_candidate<kForm>(p, plan.flags & kPlanGreedy ? scaled : scaled + gumbel, scaled, token);
  }
}

// Folds logit l of `token` into p, the token's Gumbel noise already drawn:
// `gumbel` is gumbel_from_bits of its RNG word under plan.key (ignored for
// greedy rows).
template <OfferForm kForm = OfferForm::kBranches>
FS_HOST_DEVICE void fold_logit_with_gumbel(Partial& p, const RowPlan& plan, float l, int32_t token, float gumbel) {
  const float scaled = fold_logit_mass(p, plan, l, token);
  offer_logit<kForm>(p, plan, scaled, token, gumbel);
}

// Folds logit l of `token` into p. `noise` is the token's RNG word under
// plan.key (ignored for greedy rows).
template <OfferForm kForm = OfferForm::kBranches>
FS_HOST_DEVICE void fold_logit(Partial& p, const RowPlan& plan, float l, int32_t token, uint32_t noise) {
  const bool greedy = plan.flags & kPlanGreedy;
  fold_logit_with_gumbel<kForm>(p, plan, l, token, greedy ? 0.0f : gumbel_from_bits(noise));
}

// Whether a sampled token of scaled logit `scaled` needs its Gumbel
// transform to be offered: noise_bound bounds gumbel_from_bits of its RNG
// word from above (the bucket bound of sampling/gumbel_bounds.h), so where
// scaled + noise_bound is not above `runner_up` (the partial's runner-up, or
// any lower score) the token would score at most that and change nothing as
// a candidate. A fold that offers only the tokens this admits (after
// fold_logit_mass for every token) leaves the partial bit for bit as
// fold_logit does.
FS_HOST_DEVICE bool may_reach(float scaled, float noise_bound, float runner_up) {
  return scaled + noise_bound > runner_up;
}

// may_reach, where the partial is one of several over a token range that
// are merged before anything reads them: `floor` is a runner-up score of one
// of the others (or of this one). A score strictly below it is below two
// scores of that partial, so it is neither the merged winner nor its
// runner-up, ties included, and skipping the token leaves the merged
// partial bit for bit as fold_logit does, though not this partial itself.
FS_HOST_DEVICE bool may_reach_merged(float scaled, float noise_bound, float runner_up, float floor) {
  return may_reach(scaled, noise_bound, runner_up) && !(scaled + noise_bound < floor);
}

// a ← a ∪ b; ties between winners go to the smaller token id. Selects
// rather than branches, as lse_merge.
FS_HOST_DEVICE void merge_partial(Partial& a, const Partial& b) {
  lse_merge(a.m, a.s, b.m, b.s);
  a.tracked = (b.flags & kPartialTracked) ? b.tracked : a.tracked;
  a.flags |= b.flags;
  const bool b_wins =
      (b.token >= 0) & ((a.token < 0) | (b.best > a.best) | ((b.best == a.best) & (b.token < a.token)));
  a.second = b_wins ? fmaxf(a.best, b.second) : fmaxf(a.second, b.best);
  a.best = b_wins ? b.best : a.best;
  a.best_scaled = b_wins ? b.best_scaled : a.best_scaled;
  a.token = b_wins ? b.token : a.token;
}

// log max(e^a − e^b, 0): −Inf where b ≥ a (a token the subtraction empties).
FS_HOST_DEVICE float log_subtract(float a, float b) {
  return a > b ? a + log1pf(-expf(b - a)) : neg_inf();
}

// Folds `token` into the residual max(p − q, 0): tokens with p > q compete
// with score log(p − q) + g, g the token's RESIDUAL_NOISE Gumbel.
FS_HOST_DEVICE void fold_residual(Residual& r, float log_p, float log_q, int32_t token, uint32_t noise) {
  if (!(log_p > log_q)) return;
  const float score = log_subtract(log_p, log_q) + gumbel_from_bits(noise);
  if (score > r.best) {
    r.second = r.best;
    r.best = score;
    r.token = token;
  } else if (score > r.second) {
    r.second = score;
  }
}

// a ← a ∪ b; ties go to the smaller token id.
FS_HOST_DEVICE void merge_residual(Residual& a, const Residual& b) {
  const bool b_wins = b.token >= 0 && (a.token < 0 || b.best > a.best || (b.best == a.best && b.token < a.token));
  if (b_wins) {
    a.second = fmaxf(a.best, b.second);
    a.best = b.best;
    a.token = b.token;
  } else {
    a.second = fmaxf(a.second, b.best);
  }
}

// A row's status after the pass: what planning found, else non-finite
// hidden values (hidden_bad), logits or scaled logits.
FS_HOST_DEVICE int32_t row_status(const RowPlan& plan, const Partial& all, int32_t hidden_bad) {
  if (plan.status != FLASHSPEC_OK) return plan.status;
  if (hidden_bad || (all.flags & (kPartialNonFinite | kPartialScaleOverflow))) return FLASHSPEC_ERR_NON_FINITE;
  return FLASHSPEC_OK;
}

FS_HOST_DEVICE float row_lse(const RowPlan& plan, const Partial& all) {
  return (plan.flags & kPlanGreedy) ? 0.0f : lse_value(all.m, all.s);
}

// The summary of a verify row with its whole-vocabulary reduction `all`.
// For a stochastic draft row, draft_logq and (T > 0) the residual candidate
// are set afterwards by stochastic_summary.
FS_HOST_DEVICE RowSummary verify_summary(const RowPlan& plan, const Partial& all, int32_t status) {
  RowSummary summary;
  summary.lse = row_lse(plan, all);
  summary.draft_logit = plan.tracked >= 0 ? all.tracked : 0.0f;
  summary.draft_logq = 0.0f;
  summary.candidate = all.token;
  summary.candidate_gap = winner_gap(all.best, all.second);
  summary.status = status;
  summary.typical = 0;
  summary.typical_log_threshold = 0.0f;
  summary.candidate_logit = all.best_scaled;
  summary.raw_lse = 0.0f;
  summary.draft_raw_logit = 0.0f;
  summary.candidate_raw_logit = 0.0f;
  summary.node_log_ratio = neg_inf();
  summary.node_logp = 0.0f;
  summary.node_raw_logp = 0.0f;
  return summary;
}

// Completes a stochastic draft row's summary: log q(x) of a chain row's
// draft (z_x/T_d − LSE(z/T_d), or a sparse support's log q), and the
// residual candidate. An empty residual (p ≤ q everywhere: unreachable in
// exact arithmetic) leaves the p-sample as the candidate.
FS_HOST_DEVICE void stochastic_summary(RowSummary& summary, const RowPlan& plan, float draft_log_q,
                                       const Residual& residual) {
  summary.draft_logq = draft_log_q;
  if ((plan.flags & kPlanKeep) && residual.token >= 0) {
    summary.candidate = residual.token;
    summary.candidate_gap = winner_gap(residual.best, residual.second);
  }
}

// A draft row's outputs: the token (−1 on error) and its logit (T = 0) or
// log q (T > 0), NaN on error.
FS_HOST_DEVICE void draft_outputs(const RowPlan& plan, const Partial& all, int32_t status, int32_t* token,
                                  float* score) {
  const bool ok = status == FLASHSPEC_OK && all.token >= 0;
  *token = ok ? all.token : -1;
  if (score)
    *score = !ok ? NAN : ((plan.flags & kPlanGreedy) ? all.best_scaled : all.best_scaled - row_lse(plan, all));
}

}  // namespace flashspec
