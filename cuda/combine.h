// Host launchers of the combine kernels: one warp per row folds the groups'
// partials of a scan in a fixed order into the row's verify summary or draft
// outputs (the weight-streaming scan combines its own rows instead).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "flashspec.h"
#include "sampling/fold.h"
#include "sampling/row_plan.h"
#include "sampling/row_summary.h"
#include "warp_fold.cuh"

namespace flashspec {
namespace cuda {
namespace combine {

struct Sources {
  const RowPlan* plans;
  const Partial* partials;
  const QPartial* q_partials;
  const Residual* residuals;
  const int32_t* hidden_bad;
  int32_t partial_stride;
  int32_t groups;
  int32_t rows;
  const void* q_logits;  // NULL: no stochastic drafts
  flashspec_dtype q_dtype;
  int64_t q_ld;
};

cudaError_t verify_rows(const Sources& src, const int32_t* batch_status, RowSummary* out, cudaStream_t stream);
cudaError_t draft_rows(const Sources& src, int32_t* tokens_out, float* scores_out, cudaStream_t stream);

}  // namespace combine
}  // namespace cuda
}  // namespace flashspec
