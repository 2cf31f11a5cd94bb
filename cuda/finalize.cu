// The Algorithm 1 finalize on the device: one thread per request runs the
// shared finalize_request, reading the request through the shared
// request_view. A tree's walk reads its nodes' parents, tokens and row
// summaries level by level, so one block per tree request first stages them
// in shared memory and its first thread walks there.
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
  finalize::TopLogprobs top;
};

template <bool kTree>
__global__ void finalize_kernel(const FinalizeArgs a) {
  pdl_wait();
  const int thread = int(blockIdx.x * blockDim.x + threadIdx.x);
  const int r = kTree ? int(blockIdx.x) : thread;
  const bool lead = !kTree || threadIdx.x == 0;
  const bool bad_batch = *a.batch_status != FLASHSPEC_OK;
  const int32_t n = a.top.n;
  if (bad_batch)
    for (int k = thread; k < a.batch.total_rows; k += gridDim.x * blockDim.x) {
      a.result.emitted_tokens[k] = -1;
      if (a.result.accepted_nodes) a.result.accepted_nodes[k] = -1;
      if (a.result.logprobs) a.result.logprobs[k] = NAN;
      if (a.result.raw_logprobs) a.result.raw_logprobs[k] = NAN;
      for (int32_t i = 0; i < n; ++i) {
        if (a.result.top_tokens) a.result.top_tokens[int64_t(k) * n + i] = -1;
        if (a.result.top_logprobs) a.result.top_logprobs[int64_t(k) * n + i] = NAN;
      }
    }
  if (r >= a.batch.num_requests || bad_batch) {
    if (r < a.batch.num_requests && lead) {
      a.result.accepted_counts[r] = -1;
      // Offsets that do not describe the batch still make a view; only its
      // step is read then.
      if (a.result.next_steps) a.result.next_steps[r] = request_view(a.batch, r).step + 1;
    }
    return;
  }
  const RequestView v = request_view(a.batch, r);
  auto at = [&v](auto* out) { return out ? out + v.first_row : nullptr; };
  int32_t* accepted_nodes = at(a.result.accepted_nodes);
  int32_t* drawing_rows = a.top.drawing_rows ? a.top.drawing_rows + v.first_row : nullptr;
  int32_t accepted;
  // A chain given as a tree is verified as a chain (kernels/args.h).
  if (kTree && !request_is_chain(a.batch, v)) {
    __shared__ int32_t tokens[FLASHSPEC_MAX_DRAFT_LEN], parents[FLASHSPEC_MAX_DRAFT_LEN];
    extern __shared__ RowSummary staged_rows[];  // [max_draft_len + 1]
    for (int32_t k = threadIdx.x; k < v.num_drafts; k += blockDim.x) {  // ≤ max_draft_len (plans)
      tokens[k] = a.batch.draft_tokens[v.first_draft + k];
      parents[k] = a.batch.draft_parents[v.first_draft + k];
    }
    // The walk reads every row's status, then a row's summary per level:
    // one lane doing that from global memory waits on each read in turn.
    static_assert(sizeof(RowSummary) % sizeof(uint32_t) == 0, "summaries are copied word by word");
    constexpr int kWords = int(sizeof(RowSummary) / sizeof(uint32_t));
    const uint32_t* src = reinterpret_cast<const uint32_t*>(a.rows + v.first_row);
    uint32_t* dst = reinterpret_cast<uint32_t*>(staged_rows);
    // Loads first, then stores, so a thread's loads are in flight together.
    const int32_t words = (v.num_drafts + 1) * kWords;
    for (int32_t base = threadIdx.x; base < words; base += 4 * blockDim.x) {
      uint32_t word[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int32_t w = base + i * int32_t(blockDim.x);
        word[i] = w < words ? src[w] : 0u;
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int32_t w = base + i * int32_t(blockDim.x);
        if (w < words) dst[w] = word[i];
      }
    }
    __syncthreads();
    if (!lead) return;
    RequestView staged = v;  // its drafts and rows now start at 0
    staged.first_draft = 0;
    staged.first_row = 0;
    // The caller's uniforms are indexed from the request's first draft, as
    // the staged nodes are.
    const float* uniforms = a.batch.accept_uniforms ? a.batch.accept_uniforms + v.first_draft : nullptr;
    accepted = finalize_tree_request(staged, tokens, parents, staged_rows, a.result.emitted_tokens + v.first_row,
                                     accepted_nodes, at(a.result.logprobs), at(a.result.raw_logprobs), drawing_rows,
                                     has_draft_distribution(a.batch), uniforms);
  } else {
    if (!lead) return;
    accepted = finalize_request(v, a.batch.draft_tokens, a.rows, a.batch.accept_uniforms,
                                a.result.emitted_tokens + v.first_row);
    if (a.result.logprobs || a.result.raw_logprobs)
      emitted_logprobs(v, a.rows, accepted, at(a.result.logprobs), at(a.result.raw_logprobs));
    for (int32_t k = 0; k <= v.num_drafts; ++k) {
      const bool emitted = accepted >= 0 && k <= accepted;
      if (drawing_rows) drawing_rows[k] = emitted ? k : -1;
      if (accepted_nodes) accepted_nodes[k] = emitted && k < accepted ? k : -1;
    }
  }
  // Slot k's top logprobs are those of the row that drew its token.
  if (n > 0 && drawing_rows)
    for (int32_t k = 0; k <= v.num_drafts; ++k) {
      const int32_t row = drawing_rows[k];
      const int64_t slot = int64_t(v.first_row + k) * n, source = int64_t(v.first_row + row) * n;
      for (int32_t i = 0; i < n; ++i) {
        if (a.result.top_tokens) a.result.top_tokens[slot + i] = row >= 0 ? a.top.tokens[source + i] : -1;
        if (a.result.top_logprobs) a.result.top_logprobs[slot + i] = row >= 0 ? a.top.logprobs[source + i] : NAN;
      }
    }
  a.result.accepted_counts[r] = accepted;
  if (a.result.next_steps) a.result.next_steps[r] = v.step + 1;
}

}  // namespace

namespace finalize {

cudaError_t configure() {
  const size_t most = size_t(FLASHSPEC_MAX_DRAFT_LEN + 1) * sizeof(RowSummary);
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(&finalize_kernel<true>),
                              cudaFuncAttributeMaxDynamicSharedMemorySize, int(most));
}

cudaError_t requests(const VerifyArgs& args, const RowSummary* rows, const int32_t* batch_status,
                     const ResultArgs& result, const TopLogprobs& top, cudaStream_t stream) {
  FinalizeArgs a{args, rows, batch_status, result, top};
  void* params[] = {&a};
  if (args.draft_parents) {
    // Each tree request's block stages its n + 1 row summaries: room for
    // max_draft_len + 1 of them (configure() allows the largest).
    const size_t staged = size_t(args.max_draft_len + 1) * sizeof(RowSummary);
    return launch_dependent(reinterpret_cast<const void*>(&finalize_kernel<true>), dim3(args.num_requests),
                            dim3(tuning::kTreeFinalizeThreads), staged, stream, params);
  }
  const int threads = tuning::kFinalizeThreads;
  const int blocks = (args.num_requests + threads - 1) / threads;
  return launch_dependent(reinterpret_cast<const void*>(&finalize_kernel<false>), dim3(blocks), dim3(threads), 0,
                          stream, params);
}

}  // namespace finalize
}  // namespace cuda
}  // namespace flashspec
