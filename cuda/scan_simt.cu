// The CUDA-core scan: exact fp32 products for the combinations the tensor
// cores cannot take as they are (fp32 weights, hidden rows of another dtype
// than W, borrowed heads whose rows are not 16-byte aligned, stochastic
// drafts of 8-bit heads).
//
// Each warp walks a contiguous sub-range of its CTA's tokens; for one token
// the lanes split d, accumulate up to kSimtRows dot products and reduce them
// with shuffles; lane r then folds row r's logit into its partial.
#include "scan.h"
#include "stochastic_phase.cuh"
#include "tuning.h"

namespace flashspec {
namespace cuda {
namespace scan {
namespace {

constexpr int kSimtRows = tuning::kSimtRows;
constexpr int kThreads = tuning::kSimtThreads;
constexpr int kWarps = kThreads / 32;
constexpr size_t kPlanBytes = kSimtRows * sizeof(RowPlan);
constexpr size_t kRunningBytes = kWarps * kSimtRows * sizeof(Partial);
constexpr size_t kScratchBytes = (2 * kSimtRows + 4 * kWarps) * sizeof(float);
constexpr size_t kBaseBytes = kPlanBytes + kRunningBytes + kScratchBytes;

__global__ void __launch_bounds__(kThreads) simt_scan_kernel(const ScanParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  RowPlan* plans = reinterpret_cast<RowPlan*>(smem);
  Partial* running = reinterpret_cast<Partial*>(smem + kPlanBytes);
  float* scratch = reinterpret_cast<float*>(smem + kPlanBytes + kRunningBytes);
  float* kept = reinterpret_cast<float*>(smem + kBaseBytes);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int group = blockIdx.x;
  int begin, end;
  group_range(p.vocab, p.groups, group, begin, end);
  if (tid < kSimtRows) {
    plans[tid] = plan_or_placeholder(p.plans, p.row_base, p.rows, tid);
  }
  __syncthreads();

  const int len = end - begin;
  const int wbegin = begin + int((int64_t(len) * warp) / kWarps);
  const int wend = begin + int((int64_t(len) * (warp + 1)) / kWarps);
  const float* h = static_cast<const float*>(p.h) + int64_t(p.row_base) * p.k_pad;
  const size_t esize = dtype_size(p.w_dtype);
  const RowPlan& my_plan = plans[lane < kSimtRows ? lane : 0];
  const bool my_row = lane < p.rows;
  const bool keep = my_row && p.stochastic && (my_plan.flags & kPlanKeep);
  Partial part = empty_partial();

  for (int tok = wbegin; tok < wend; ++tok) {
    const void* wrow = static_cast<const unsigned char*>(p.w) + int64_t(tok) * p.ldw * int64_t(esize);
    float acc[kSimtRows];
#pragma unroll
    for (int r = 0; r < kSimtRows; ++r) acc[r] = 0.0f;
    for (int k = lane; k < p.d_load; k += 32) {
      const float wv = load_as_float(wrow, p.w_dtype, k);
#pragma unroll
      for (int r = 0; r < kSimtRows; ++r)
        if (r < p.rows) acc[r] = fmaf(wv, h[int64_t(r) * p.k_pad + k], acc[r]);
    }
    float mine = 0.0f;
#pragma unroll
    for (int r = 0; r < kSimtRows; ++r) {
      float v = acc[r];
      for (int mask = 16; mask > 0; mask >>= 1) v += __shfl_xor_sync(0xffffffffu, v, mask);
      if (lane == r) mine = v;
    }
    if (my_row) {
      if (p.w_scale) mine *= p.w_scale[tok];  // 8-bit codes: the row's scale times the finished sum
      const int32_t id = p.token_base + tok;
      const uint32_t noise = (my_plan.flags & kPlanGreedy) ? 0u : noise_word(my_plan.key, id);
      fold_logit(part, my_plan, mine, id, noise);
      if (keep) kept[int64_t(lane) * p.slice + (tok - begin)] = mine * my_plan.inv_t;
    }
  }
  if (lane < kSimtRows) running[warp * kSimtRows + lane] = part;
  __syncthreads();
  if (tid < p.rows) {
    Partial all = running[tid];
    for (int w = 1; w < kWarps; ++w) merge_partial(all, running[w * kSimtRows + tid]);
    p.partials[int64_t(group) * p.partial_stride + p.row_base + tid] = all;
  }
  if (p.stochastic) {
    __syncthreads();
    stochastic_phase(p, group, begin, end, plans, kept, scratch);
  }
}

}  // namespace

const void* simt_kernel() { return reinterpret_cast<const void*>(&simt_scan_kernel); }
size_t simt_base_smem() { return kBaseBytes; }

}  // namespace scan
}  // namespace cuda
}  // namespace flashspec
