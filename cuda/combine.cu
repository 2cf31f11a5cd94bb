// The combine kernels: one warp per row folds the groups' partials in a fixed
// order, then the shared rules of sampling/fold.h turn the row's reduction
// into its summary or draft outputs.
#include "combine.h"
#include "launch.cuh"
#include "stochastic_phase.cuh"
#include "tuning.h"
#include "util/dtype.h"

namespace flashspec {
namespace cuda {
namespace {

constexpr int kWarpsPerBlock = tuning::kCombineWarpsPerBlock;

// A row's combined partial and status; for a chain row's stochastic draft
// also q's log-sum-exp (dense q).
struct CombinedRow {
  int32_t status;
  Partial all;
  float q_lse;
};

__device__ CombinedRow combine_row(const combine::Sources& s, int row, int lane) {
  CombinedRow res;
  const RowPlan& plan = s.plans[row];
  res.all = warp_combine(s.partials + row, s.groups, s.partial_stride, lane);
  res.status = row_status(plan, res.all, s.hidden_bad[row]);
  res.q_lse = 0.0f;
  if (s.stochastic && s.drafts.q_logits) {
    // Every dense q the row tries must be finite (the CPU backend's rule).
    const RowDrafts rd = s.drafts.row_drafts[row];
    for (int i = 0; i < rd.count; ++i) {
      float qm, qs;
      int q_bad;
      warp_combine_q(s.q_partials + s.drafts.tried[rd.begin + i], s.groups, s.partial_stride, lane, qm, qs, q_bad);
      if (i == 0) res.q_lse = lse_value(qm, qs);
      if (res.status == FLASHSPEC_OK && q_bad) res.status = FLASHSPEC_ERR_NON_FINITE;
    }
  }
  return res;
}

__global__ void combine_verify_kernel(const combine::Sources s, const int32_t* batch_status, RowSummary* out) {
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= s.rows) return;  // whole warp
  const RowPlan& plan = s.plans[row];
  const CombinedRow res = combine_row(s, row, lane);
  RowSummary summary = verify_summary(plan, res.all, *batch_status != FLASHSPEC_OK ? *batch_status : res.status);
  if (summary.status == FLASHSPEC_OK && s.stochastic && lane == 0) {
    Residual residual = empty_residual();
    if (plan.flags & kPlanKeep)
      for (int k = 0; k < s.groups; ++k) merge_residual(residual, s.residuals[int64_t(k) * s.partial_stride + row]);
    // A chain row's draft (q_row), judged in finalize by Algorithm 1.
    const float log_q = plan.q_row >= 0 ? drafted_log_q(s.drafts, plan.q_row, plan.tracked, plan.inv_td, res.q_lse)
                                        : 0.0f;
    stochastic_summary(summary, plan, log_q, residual);
    // A tree node's own draft as its parent's row judged it (T > 0).
    const int32_t own = s.drafts.row_drafts[row].own;
    if (own >= 0 && !(plan.flags & kPlanGreedy)) {
      const DraftVerdict v = s.drafts.verdicts[own];
      summary.node_log_ratio = v.log_ratio;
      summary.node_logp = v.logp;
    }
  }
  if (lane == 0) out[row] = summary;
}

__global__ void combine_draft_kernel(const combine::Sources s, int32_t* tokens_out, float* scores_out) {
  pdl_wait();
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= s.rows) return;
  const CombinedRow res = combine_row(s, row, lane);
  if (lane != 0) return;
  draft_outputs(s.plans[row], res.all, res.status, tokens_out + row, scores_out ? scores_out + row : nullptr);
}

__global__ void combine_records_kernel(const combine::Sources s, int32_t vocab_begin, int32_t vocab_end,
                                       int32_t vocab_size, ShardRecord* out) {
  pdl_wait();
  pdl_trigger();
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= s.rows) return;
  const Partial all = warp_combine(s.partials + row, s.groups, s.partial_stride, lane);
  if (lane == 0) out[row] = shard_record(with_hidden_flag(all, s.hidden_bad[row]), vocab_begin, vocab_end, vocab_size);
}

// A row of gathered records: the merged Partial and the row's status.
__device__ int32_t merge_row_records(const RowPlan& plan, const ShardRecord* records, int32_t shards, int32_t rows,
                                     int32_t row, Partial& all) {
  all = empty_partial();
  if (plan.status != FLASHSPEC_OK) return plan.status;
  if (first_bad_record(records, shards, rows, row, records[0].vocab_size) >= 0) return FLASHSPEC_ERR_INVALID_ARGUMENT;
  all = merge_records(records, shards, rows, row);
  return row_status(plan, all, 0);
}

__global__ void record_summaries_kernel(const RowPlan* plans, const ShardRecord* records, int32_t shards, int32_t rows,
                                        const int32_t* batch_status, RowSummary* out) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  Partial all;
  const int32_t status = merge_row_records(plans[row], records, shards, rows, row, all);
  out[row] = verify_summary(plans[row], all, *batch_status != FLASHSPEC_OK ? *batch_status : status);
}

__global__ void record_drafts_kernel(const RowPlan* plans, const ShardRecord* records, int32_t shards, int32_t rows,
                                     int32_t* tokens_out, float* scores_out) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  Partial all;
  const int32_t status = merge_row_records(plans[row], records, shards, rows, row, all);
  draft_outputs(plans[row], all, status, tokens_out + row, scores_out ? scores_out + row : nullptr);
}

constexpr int kRecordThreads = 128;

}  // namespace

namespace combine {

cudaError_t record_rows(const Sources& src, int32_t vocab_begin, int32_t vocab_end, int32_t vocab_size,
                        ShardRecord* out, cudaStream_t stream) {
  const int blocks = (src.rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  Sources s = src;
  void* args[] = {&s, &vocab_begin, &vocab_end, &vocab_size, &out};
  return launch_dependent(reinterpret_cast<const void*>(&combine_records_kernel), dim3(blocks),
                          dim3(kWarpsPerBlock * 32), 0, stream, args);
}

cudaError_t summaries_from_records(const RowPlan* plans, const ShardRecord* records, int32_t shards, int32_t rows,
                                   const int32_t* batch_status, RowSummary* out, cudaStream_t stream) {
  record_summaries_kernel<<<(rows + kRecordThreads - 1) / kRecordThreads, kRecordThreads, 0, stream>>>(
      plans, records, shards, rows, batch_status, out);
  return cudaGetLastError();
}

cudaError_t drafts_from_records(const RowPlan* plans, const ShardRecord* records, int32_t shards, int32_t rows,
                                int32_t* tokens_out, float* scores_out, cudaStream_t stream) {
  record_drafts_kernel<<<(rows + kRecordThreads - 1) / kRecordThreads, kRecordThreads, 0, stream>>>(
      plans, records, shards, rows, tokens_out, scores_out);
  return cudaGetLastError();
}

cudaError_t verify_rows(const Sources& src, const int32_t* batch_status, RowSummary* out, cudaStream_t stream) {
  const int blocks = (src.rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  Sources s = src;
  void* args[] = {&s, &batch_status, &out};
  return launch_dependent(reinterpret_cast<const void*>(&combine_verify_kernel), dim3(blocks),
                          dim3(kWarpsPerBlock * 32), 0, stream, args);
}

cudaError_t draft_rows(const Sources& src, int32_t* tokens_out, float* scores_out, cudaStream_t stream) {
  const int blocks = (src.rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  Sources s = src;
  void* args[] = {&s, &tokens_out, &scores_out};
  return launch_dependent(reinterpret_cast<const void*>(&combine_draft_kernel), dim3(blocks),
                          dim3(kWarpsPerBlock * 32), 0, stream, args);
}

}  // namespace combine
}  // namespace cuda
}  // namespace flashspec
