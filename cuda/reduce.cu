// Kernels that run after a scan: the combine (one warp per row folds the
// groups' partials in a fixed order) and the Algorithm 1 finalize (one thread
// per request, the shared finalize_request).
#include "pdl.cuh"
#include "row_outputs.cuh"
#include "sampling/algorithm1.h"
#include "steps.h"

namespace flashspec {
namespace cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

// A row's combined partial and status; for stochastic drafts also q's
// log-sum-exp.
struct RowResult {
  int32_t status;
  Partial all;
  float q_lse;
  int32_t q_bad;
};

__device__ RowResult combine_row(const combine::Sources& s, int row, int lane) {
  RowResult res;
  const RowPlan& plan = s.plans[row];
  res.all = warp_combine(s.partials + row, s.groups, s.partial_stride, lane);
  res.status = row_status(plan, res.all, s.hidden_bad[row]);
  res.q_lse = 0.0f;
  res.q_bad = 0;
  if (s.q_logits && plan.q_row >= 0) {
    float qm, qs;
    warp_combine_q(s.q_partials + row, s.groups, s.partial_stride, lane, qm, qs, res.q_bad);
    res.q_lse = qm + logf(qs);
    if (res.status == FLASHSPEC_OK && res.q_bad) res.status = FLASHSPEC_ERR_NON_FINITE;
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
  RowResult res = combine_row(s, row, lane);
  RowSummary summary = verify_summary(plan, res.all, s.hidden_bad[row], *batch_status);
  if (summary.status == FLASHSPEC_OK && res.status != FLASHSPEC_OK) summary.status = res.status;
  if (summary.status == FLASHSPEC_OK && s.q_logits && plan.q_row >= 0) {
    const void* qrow = static_cast<const unsigned char*>(s.q_logits) +
                       int64_t(plan.q_row) * s.q_ld * int64_t(dtype_size(s.q_dtype));
    summary.draft_logq = load_as_float(qrow, s.q_dtype, plan.tracked) * plan.inv_td - res.q_lse;
    if (plan.flags & kPlanKeep) {
      Residual acc;
      acc.best = neg_inf();
      acc.token = -1;
      acc.second = neg_inf();
      acc.pad = 0;
      if (lane == 0)
        for (int k = 0; k < s.groups; ++k) merge_residual(acc, s.residuals[int64_t(k) * s.partial_stride + row]);
      if (acc.token >= 0) {
        summary.candidate = acc.token;
        summary.candidate_gap = acc.second == neg_inf() ? pos_inf() : acc.best - acc.second;
      }
    }
  }
  if (lane == 0) out[row] = summary;
}

__global__ void combine_draft_kernel(const combine::Sources s, int32_t* tokens_out, float* scores_out) {
  pdl_wait();
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= s.rows) return;
  RowResult res = combine_row(s, row, lane);
  if (lane != 0) return;
  draft_outputs(s.plans[row], res.all, s.hidden_bad[row], tokens_out + row, scores_out ? scores_out + row : nullptr);
}

struct FinalizeArgs {
  VerifyArgs batch;  // device-resident arrays, validated
  const RowSummary* rows;
  const int32_t* batch_status;
  ResultArgs result;
};

__global__ void finalize_kernel(const FinalizeArgs a) {
  pdl_wait();
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  const bool bad_batch = *a.batch_status != FLASHSPEC_OK;
  if (bad_batch)
    for (int k = r; k < a.batch.total_rows; k += gridDim.x * blockDim.x) a.result.emitted_tokens[k] = -1;
  if (r >= a.batch.num_requests) return;
  const uint64_t step = a.batch.steps ? a.batch.steps[r] : 0;
  if (bad_batch) {
    a.result.accepted_counts[r] = -1;
  } else {
    const RequestView v = request_view(a.batch, r);
    a.result.accepted_counts[r] = finalize_request(v, a.batch.draft_tokens, a.rows, a.batch.accept_uniforms,
                                                   a.result.emitted_tokens + v.first_row);
  }
  if (a.result.next_steps) a.result.next_steps[r] = step + 1;
}

}  // namespace

namespace combine {

cudaError_t verify_rows(const Sources& src, const int32_t* batch_status, RowSummary* out, cudaStream_t stream) {
  const int blocks = (src.rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  combine::Sources s = src;
  void* args[] = {&s, &batch_status, &out};
  return launch_dependent(reinterpret_cast<const void*>(&combine_verify_kernel), dim3(blocks),
                          dim3(kWarpsPerBlock * 32), 0, stream, args);
}

cudaError_t draft_rows(const Sources& src, int32_t* tokens_out, float* scores_out, cudaStream_t stream) {
  const int blocks = (src.rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  combine::Sources s = src;
  void* args[] = {&s, &tokens_out, &scores_out};
  return launch_dependent(reinterpret_cast<const void*>(&combine_draft_kernel), dim3(blocks),
                          dim3(kWarpsPerBlock * 32), 0, stream, args);
}

}  // namespace combine

namespace finalize {

cudaError_t requests(const VerifyArgs& args, const RowSummary* rows, const int32_t* batch_status,
                     const ResultArgs& result, cudaStream_t stream) {
  FinalizeArgs a{args, rows, batch_status, result};
  const int threads = 128;
  const int blocks = (args.num_requests + threads - 1) / threads;
  void* params[] = {&a};
  return launch_dependent(reinterpret_cast<const void*>(&finalize_kernel), dim3(blocks), dim3(threads), 0, stream,
                          params);
}

}  // namespace finalize

}  // namespace cuda
}  // namespace flashspec
