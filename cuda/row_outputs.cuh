// What a row's combined Partial becomes: the RowSummary of a verify row, or
// the token and score of a draft row. Shared by the combine kernels and by
// the weight-streaming scan, whose last CTA combines the rows itself.
#pragma once

#include "device_common.cuh"

namespace flashspec {
namespace cuda {

// Status of a row: what the prepare kernels found, else non-finite hidden
// values or logits seen by the scan.
__device__ __forceinline__ int32_t row_status(const RowPlan& plan, const Partial& all, int32_t hidden_bad) {
  if (plan.status != FLASHSPEC_OK) return plan.status;
  if (hidden_bad || (all.flags & kPartialNonFinite)) return FLASHSPEC_ERR_NON_FINITE;
  return FLASHSPEC_OK;
}

__device__ __forceinline__ float row_lse(const RowPlan& plan, const Partial& all) {
  return (plan.flags & kPlanGreedy) ? 0.0f : all.m + logf(all.s);
}

// The summary of a verify row of a greedy (point-mass) draft; a batch-level
// error overrides the row's own status.
__device__ __forceinline__ RowSummary verify_summary(const RowPlan& plan, const Partial& all, int32_t hidden_bad,
                                                     int32_t batch_status) {
  RowSummary summary;
  summary.lse = row_lse(plan, all);
  summary.draft_logit = plan.tracked >= 0 ? all.tracked : 0.0f;
  summary.draft_logq = 0.0f;
  summary.candidate = all.token;
  summary.candidate_gap = all.second == neg_inf() ? pos_inf() : all.best - all.second;
  summary.status = batch_status != FLASHSPEC_OK ? batch_status : row_status(plan, all, hidden_bad);
  return summary;
}

// A draft row's outputs: the token (−1 on error) and its logit (T = 0) or
// log q (T > 0), NaN on error.
__device__ __forceinline__ void draft_outputs(const RowPlan& plan, const Partial& all, int32_t hidden_bad,
                                              int32_t* token, float* score) {
  const bool ok = row_status(plan, all, hidden_bad) == FLASHSPEC_OK && all.token >= 0;
  *token = ok ? all.token : -1;
  if (score)
    *score = !ok ? __int_as_float(0x7fc00000)
                 : ((plan.flags & kPlanGreedy) ? all.best_scaled : all.best_scaled - row_lse(plan, all));
}

}  // namespace cuda
}  // namespace flashspec
