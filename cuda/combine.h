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
#include "sampling/shard_record.h"
#include "scan_params.h"
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
  bool stochastic;           // the rows verify stochastic drafts: then
  StochasticDrafts drafts;   // their q and what the scan judged
};

cudaError_t verify_rows(const Sources& src, const int32_t* batch_status, RowSummary* out, cudaStream_t stream);
cudaError_t draft_rows(const Sources& src, int32_t* tokens_out, float* scores_out, cudaStream_t stream);

// A vocabulary shard's pass: each row's record over [vocab_begin, vocab_end)
// of vocab_size.
cudaError_t record_rows(const Sources& src, int32_t vocab_begin, int32_t vocab_end, int32_t vocab_size,
                        ShardRecord* out, cudaStream_t stream);

// The gathered records [shards][rows] merged per row into verify summaries
// (for finalize::requests) or draft outputs. A row whose records do not tile
// the vocabulary of records[0] gets FLASHSPEC_ERR_INVALID_ARGUMENT.
cudaError_t summaries_from_records(const RowPlan* plans, const ShardRecord* records, int32_t shards, int32_t rows,
                                   const int32_t* batch_status, RowSummary* out, cudaStream_t stream);
cudaError_t drafts_from_records(const RowPlan* plans, const ShardRecord* records, int32_t shards, int32_t rows,
                                int32_t* tokens_out, float* scores_out, cudaStream_t stream);

}  // namespace combine
}  // namespace cuda
}  // namespace flashspec
