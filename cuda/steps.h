// Host launchers of the small kernels around a scan: preparing row plans and
// staging hidden rows (before), combining partials into summaries or draft
// outputs, and the Algorithm 1 finalize (after). Each takes an explicit
// stream and returns the launch's cudaError_t.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "device_common.cuh"
#include "kernels/backend.h"

namespace flashspec {
namespace cuda {

namespace prepare {

// Row plans of a verify batch; device-side checks of offsets, token ids,
// temperatures and uniforms land in each plan's status and, for offsets that
// do not describe the batch, in *batch_status.
cudaError_t verify_plans(const VerifyArgs& args, int32_t vocab, RowPlan* plans, int32_t* batch_status,
                         cudaStream_t stream);

// Row plans of a draft call; invalid temperatures or positions land in status.
cudaError_t draft_plans(const DraftArgs& args, RowPlan* plans, cudaStream_t stream);

// Copies hidden rows into `out` ([rows, k_pad], zero beyond d): as raw 16-bit
// values when as_float is false (the tensor-core path, same dtype as W), as
// fp32 otherwise. bad[r] = 1 if row r holds a NaN or Inf.
cudaError_t stage_hidden(const flashspec_tensor& hidden, int32_t k_pad, bool as_float, void* out, int32_t* bad,
                         cudaStream_t stream);

// found = 1 if the [rows, cols] matrix (row stride ld) holds a NaN or Inf.
cudaError_t find_non_finite(const void* data, flashspec_dtype dtype, int64_t rows, int64_t cols, int64_t ld,
                            int32_t* found, cudaStream_t stream);

}  // namespace prepare

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

namespace finalize {

cudaError_t requests(const VerifyArgs& args, const RowSummary* rows, const int32_t* batch_status,
                     const ResultArgs& result, cudaStream_t stream);

}  // namespace finalize

}  // namespace cuda
}  // namespace flashspec
