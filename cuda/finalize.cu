// The Algorithm 1 finalize on the device: one thread per request runs the
// shared finalize_request, reading the request through the shared
// request_view.
#include "finalize.h"
#include "launch.cuh"
#include "sampling/algorithm1.h"
#include "tuning.h"

namespace flashspec {
namespace cuda {
namespace {

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
    for (int k = r; k < a.batch.total_rows; k += gridDim.x * blockDim.x) {
      a.result.emitted_tokens[k] = -1;
      if (a.result.accepted_nodes) a.result.accepted_nodes[k] = -1;
    }
  if (r >= a.batch.num_requests) return;
  // Offsets that do not describe the batch still make a view; only its
  // step is read then.
  const RequestView v = request_view(a.batch, r);
  int32_t* accepted_nodes = a.result.accepted_nodes ? a.result.accepted_nodes + v.first_row : nullptr;
  int32_t accepted = -1;
  if (!bad_batch && a.batch.draft_parents) {
    accepted = finalize_tree_request(v, a.batch.draft_tokens, a.batch.draft_parents, a.rows,
                                     a.result.emitted_tokens + v.first_row, accepted_nodes, nullptr, nullptr,
                                     nullptr);
  } else if (!bad_batch) {
    accepted = finalize_request(v, a.batch.draft_tokens, a.rows, a.batch.accept_uniforms,
                                a.result.emitted_tokens + v.first_row);
  }
  if (accepted_nodes && !bad_batch && !a.batch.draft_parents)
    for (int32_t k = 0; k <= v.num_drafts; ++k) accepted_nodes[k] = k < accepted ? k : -1;
  a.result.accepted_counts[r] = accepted;
  if (a.result.next_steps) a.result.next_steps[r] = v.step + 1;
}

}  // namespace

namespace finalize {

cudaError_t requests(const VerifyArgs& args, const RowSummary* rows, const int32_t* batch_status,
                     const ResultArgs& result, cudaStream_t stream) {
  FinalizeArgs a{args, rows, batch_status, result};
  const int threads = tuning::kFinalizeThreads;
  const int blocks = (args.num_requests + threads - 1) / threads;
  void* params[] = {&a};
  return launch_dependent(reinterpret_cast<const void*>(&finalize_kernel), dim3(blocks), dim3(threads), 0, stream,
                          params);
}

}  // namespace finalize
}  // namespace cuda
}  // namespace flashspec
