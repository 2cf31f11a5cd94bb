// What a pass over the LM head must compute for one hidden row, and the
// rule that derives it from the row's request. Every backend builds its
// plans with these functions, so the CPU and CUDA scans follow the same
// plan for the same row.
#pragma once

#include <cstdint>

#include "flashspec.h"
#include "util/host_device.h"
#include "util/philox.h"

namespace flashspec {

// One request of a verify batch, its optional per-request values resolved to
// their documented defaults (kernels/args.h: request_view).
struct RequestView {
  int32_t index;            // r: the request's place in the batch
  int32_t first_draft;      // index of draft token 1 in draft_tokens
  int32_t num_drafts;       // n
  int32_t first_row;        // index of the request's first target row
  float temperature;        // target T ≥ 0
  float draft_temperature;  // T_d > 0 of a stochastic draft's q
  uint64_t seed, request_id, step;
};

// One row of a draft call, defaults resolved (kernels/args.h:
// draft_row_view).
struct DraftRowView {
  int32_t row;        // the row's place in the call (its request)
  float temperature;  // 0: greedy
  uint64_t seed, request_id, step;
  int32_t position;
};

constexpr int32_t kPlanGreedy = 1;  // T = 0: argmax of the raw logits
constexpr int32_t kPlanKeep = 2;    // stochastic draft row with T > 0: the residual needs the row's logits

struct RowPlan {
  float inv_t;       // 1/T (T > 0); 1 for greedy rows
  int32_t flags;     // kPlan*
  int32_t tracked;   // token whose scaled logit is reported, or −1
  int32_t excluded;  // token never chosen as candidate, or −1
  RngRowKey key;     // Gumbel noise of the candidate (T > 0)
  int32_t status;    // flashspec_status found while planning (0 = valid)
  int32_t q_row;     // row of draft_logits for a stochastic draft row, else −1
  float inv_td;      // 1/T_d of q
  int32_t request;   // the row's request (a draft call: the row itself); 0 in an inert plan
};

// A greedy plan that tracks and excludes nothing: the plan of a row that is
// invalid (status ≠ 0) or that only pads a tile.
FS_HOST_DEVICE RowPlan inert_plan(int32_t status) {
  RowPlan plan = {};
  plan.inv_t = 1.0f;
  plan.flags = kPlanGreedy;
  plan.tracked = -1;
  plan.excluded = -1;
  plan.status = status;
  plan.q_row = -1;
  plan.inv_td = 1.0f;
  plan.request = 0;
  return plan;
}

// Row j (0 ≤ j ≤ n) of request v: rows j < n score draft j + 1 (tracked) and
// hold the residual candidate, row n the bonus. A point-mass draft's residual
// is p without the drafted token (excluded); a stochastic draft's is
// max(p − q, 0), for which the row keeps its logits. Under typical
// acceptance a rejecting row emits a sample of p itself: nothing excluded.
FS_HOST_DEVICE RowPlan verify_row_plan(const RequestView& v, int32_t j, const int32_t* draft_tokens,
                                       bool stochastic, bool typical = false) {
  const bool greedy = v.temperature == 0.0f;
  const bool bonus = j == v.num_drafts;
  RowPlan plan = inert_plan(FLASHSPEC_OK);
  plan.request = v.index;
  plan.flags = greedy ? kPlanGreedy : 0;
  plan.inv_t = greedy ? 1.0f : 1.0f / v.temperature;
  plan.tracked = bonus ? -1 : draft_tokens[v.first_draft + j];
  plan.excluded = (!bonus && !stochastic && !greedy && !typical) ? plan.tracked : -1;
  if (!bonus && stochastic && !greedy && !typical) plan.flags |= kPlanKeep;
  plan.q_row = (!bonus && stochastic) ? v.first_draft + j : -1;
  plan.inv_td = stochastic ? 1.0f / v.draft_temperature : 1.0f;
  if (!greedy)
    plan.key = make_row_key(v.seed, v.request_id, v.step, j,
                            bonus ? FLASHSPEC_RNG_BONUS_NOISE : FLASHSPEC_RNG_RESIDUAL_NOISE);
  return plan;
}

// Row j of a request whose drafts form a tree: a draw from p itself (the
// argmax at T = 0) with BONUS_NOISE at position j; nothing tracked or
// excluded (the walk compares the draw with the node's children).
FS_HOST_DEVICE RowPlan tree_row_plan(const RequestView& v, int32_t j) {
  const bool greedy = v.temperature == 0.0f;
  RowPlan plan = inert_plan(FLASHSPEC_OK);
  plan.request = v.index;
  plan.flags = greedy ? kPlanGreedy : 0;
  plan.inv_t = greedy ? 1.0f : 1.0f / v.temperature;
  if (!greedy) plan.key = make_row_key(v.seed, v.request_id, v.step, j, FLASHSPEC_RNG_BONUS_NOISE);
  return plan;
}

// Row j of a request whose stochastic drafts form a tree: as tree_row_plan,
// except that a node with children (T > 0) keeps its logits for the
// residual chain its children are tried against, and its fallback draw
// uses RESIDUAL_NOISE at j, as a chain row's does (a chain given as a tree
// then takes Algorithm 1's random numbers). inv_td is its children's 1/T_d.
FS_HOST_DEVICE RowPlan stochastic_tree_row_plan(const RequestView& v, int32_t j, bool has_children) {
  RowPlan plan = tree_row_plan(v, j);
  plan.inv_td = 1.0f / v.draft_temperature;
  if (has_children && v.temperature != 0.0f) {
    plan.flags |= kPlanKeep;
    plan.key = make_row_key(v.seed, v.request_id, v.step, j, FLASHSPEC_RNG_RESIDUAL_NOISE);
  }
  return plan;
}

// A draft row: argmax (T = 0) or Gumbel-max with DRAFT_NOISE at its position.
FS_HOST_DEVICE RowPlan draft_row_plan(const DraftRowView& v) {
  const bool greedy = v.temperature == 0.0f;
  RowPlan plan = inert_plan(FLASHSPEC_OK);
  plan.request = v.row;
  plan.flags = greedy ? kPlanGreedy : 0;
  plan.inv_t = greedy ? 1.0f : 1.0f / v.temperature;
  if (!greedy) plan.key = make_row_key(v.seed, v.request_id, v.step, v.position, FLASHSPEC_RNG_DRAFT_NOISE);
  return plan;
}

}  // namespace flashspec
