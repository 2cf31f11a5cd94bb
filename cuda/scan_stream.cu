// The weight-streaming scan for few rows (≤ 16): the loop of
// stream_tiles.cuh, with the reduction in registers. Its epilogue folds each
// logit into the lane's running Partial of its rows (online log-sum-exp,
// Gumbel top-2, tracked logit); tokens reach a Partial in increasing order.
// Warps then merge across lanes and across the CTA in a fixed order, and the
// CTA writes one Partial per row: nothing vocabulary-sized leaves the chip.
#include <algorithm>
#include <utility>

#include "launch.cuh"
#include "scan.h"
#include "scan_params.h"
#include "stream_tiles.cuh"
#include "tuning.h"
#include "warp_fold.cuh"

namespace flashspec {
namespace cuda {
namespace scan {
namespace {

using stream::kMaxRows;
using stream::kThreads;
using stream::kWarps;

static_assert(sizeof(Partial) == 32, "load_partial_l2 reads a Partial as two float4");

// A Partial written by another CTA of this launch: read from L2, never from
// a possibly stale L1 line.
__device__ __forceinline__ Partial load_partial_l2(const Partial* src) {
  const float4* v = reinterpret_cast<const float4*>(src);
  const float4 lo = __ldcg(v), hi = __ldcg(v + 1);
  Partial p;
  p.m = lo.x;
  p.s = lo.y;
  p.best = lo.z;
  p.best_scaled = lo.w;
  p.token = __float_as_int(hi.x);
  p.second = hi.y;
  p.tracked = hi.z;
  p.flags = __float_as_int(hi.w);
  return p;
}

// The end of a scan: lanes of one t hold the same rows (nt*8 + 2t + j) for
// different tokens, so they merge over g; the warps merge in order into the
// CTA's partial; the last CTA to finish (threadFenceReduction pattern)
// combines every CTA's partial into the row outputs and resets the counter.
template <int kNT, int kWarpsInCta>
__device__ __forceinline__ void finish_scan(const ScanParams& p, const StreamTail& tail, const RowPlan* plans,
                                            Partial (&part)[kNT][2], Partial (*merged)[kMaxRows], int warp,
                                            int lane) {
  const int tid = threadIdx.x, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      merge_with_lane(part[nt][j], 4, lane);
      merge_with_lane(part[nt][j], 8, lane);
      merge_with_lane(part[nt][j], 16, lane);
      const int row = nt * 8 + 2 * t + j;
      if (g == 0 && row < kMaxRows) merged[warp][row] = part[nt][j];
    }
  __syncthreads();
  if (tid < p.rows) {
    Partial all = merged[0][tid];
    for (int wi = 1; wi < kWarpsInCta; ++wi) merge_partial(all, merged[wi][tid]);
    p.partials[int64_t(blockIdx.x) * p.partial_stride + p.row_base + tid] = all;
  }

  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (tid == 0) last = atomicAdd(tail.done_counter, 1) == int(gridDim.x) - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int row = warp; row < p.rows; row += kWarpsInCta) {
    Partial all = empty_partial();
    for (int k = lane; k < int(gridDim.x); k += 32)
      merge_partial(all, load_partial_l2(p.partials + int64_t(k) * p.partial_stride + p.row_base + row));
    for (int mask = 1; mask < 32; mask <<= 1) merge_with_lane(all, mask, lane);
    if (lane == 0) {
      const int global_row = p.row_base + row;
      const RowPlan& plan = plans[row];
      const int32_t status = row_status(plan, all, tail.hidden_bad[global_row]);
      if (tail.records)
        tail.records[global_row] = shard_record(with_hidden_flag(all, tail.hidden_bad[global_row]), p.token_base,
                                                p.token_base + p.vocab, tail.vocab_size);
      else if (tail.summaries)
        tail.summaries[global_row] =
            verify_summary(plan, all, *tail.batch_status != FLASHSPEC_OK ? *tail.batch_status : status);
      else
        draft_outputs(plan, all, status, tail.tokens_out + global_row,
                      tail.scores_out ? tail.scores_out + global_row : nullptr);
    }
  }
  if (tid == 0) *tail.done_counter = 0;
}

// The RNG words of the lane's four logits of a tile in row group nt: word
// 2j + k is that of token tile_id0 + g + 8k on row nt*8 + 2t + j (tile_id0,
// the tile's first token id, a multiple of 4). The tile's 16 tokens lie in
// four Philox blocks; the eight lanes of one t need those four blocks on
// their two rows, eight blocks, so each computes one (lane g: block g mod 4
// on row 2t + g/4) instead of the four its own words come from, and four
// shuffles hand every lane its words. The lanes with g of one parity hold
// the blocks the lanes g/4 = parity read (blocks parity and parity + 2 on
// both rows); in round r the one with index i = g/2 among them gives word
// (r + i) mod 4, which is the word every lane reading it that round needs.
// A greedy row's blocks are not computed (its words are never read).
__device__ __forceinline__ void tile_noise(const RowPlan* plans, int nt, int32_t tile_id0, int lane,
                                           uint32_t (&words)[4]) {
  const int g = lane >> 2, t = lane & 3;
  const RowPlan& own = plans[nt * 8 + 2 * t + (g >> 2)];
  Philox4 block = {{0, 0, 0, 0}};
  if (!(own.flags & kPlanGreedy)) block = row_block(own.key, uint32_t(tile_id0) / 4 + uint32_t(g & 3));
  const int word = g & 3, pair = g >> 2;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const uint32_t given = philox_word(block, (r + (g >> 1)) & 3);
    const int item = (word - r) & 3;  // 2j + k of what this lane reads this round
    const uint32_t got = __shfl_sync(0xffffffffu, given, (pair + 2 * item) * 4 + t);
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (item == k) words[k] = got;
  }
}

// kShape: the entry of tuning::kStreamShapes (rows, 8-row groups, burst
// length, CTAs per SM); kW: W's dtype (bf16, fp16, e4m3, int8).
template <flashspec_dtype kW, int kShape>
__global__ void __launch_bounds__(kThreads, tuning::stream_shape(is_codes(kW), kShape).min_blocks)
    stream_scan_kernel(const ScanParams p, const StreamTail tail) {
  constexpr int kNT = tuning::stream_shape(is_codes(kW), kShape).row_groups;
  __shared__ RowPlan plans[kMaxRows];
  // The lanes' running partials live here rather than in registers, which
  // the double-buffered loads need: [warp][nt][j][lane].
  __shared__ Partial running[kWarps][kNT][2][32];
  __shared__ Partial merged[kWarps][kMaxRows];

  pdl_wait();     // plans and staged hidden rows come from the kernels before
  pdl_trigger();  // what follows may launch now; it waits for this grid to finish

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int t = lane & 3;
  if (tid < kMaxRows) {
    plans[tid] = plan_or_placeholder(p.plans, p.row_base, p.rows, tid);
  }
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    running[warp][nt][0][lane] = empty_partial();
    running[warp][nt][1][lane] = empty_partial();
  }
  __syncthreads();

  const stream::WarpRun run = stream::warp_run(p.vocab);
  // Sampled rows take their noise from tile_noise where the tiles' tokens
  // start on Philox blocks (a shard may begin anywhere).
  bool sampled = false;
  for (int row = 0; row < p.rows; ++row) sampled |= !(plans[row].flags & kPlanGreedy);
  const bool shared_noise = sampled && (p.token_base & 3) == 0;

  // The epilogue folds each logit into the lane's running Partial of its
  // rows (online log-sum-exp, Gumbel top-2, tracked logit); tokens reach a
  // Partial in increasing order.
  stream::stream_tiles<kW, kShape>(p, run.first_tile, run.tiles, [&](int tok_a, auto&& logit) {
    const int tok_b = tok_a + 8;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      uint32_t words[4] = {0, 0, 0, 0};
      if (shared_noise) tile_noise(plans, nt, p.token_base + tok_a - (lane >> 2), lane, words);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int row = nt * 8 + 2 * t + j;
        if (row < p.rows) {
          const RowPlan& plan = plans[row];
          const bool greedy = plan.flags & kPlanGreedy;
          Partial part = running[warp][nt][j][lane];
          const int32_t id_a = p.token_base + tok_a, id_b = p.token_base + tok_b;
          const uint32_t noise_a = greedy ? 0u : shared_noise ? words[2 * j] : noise_word(plan.key, id_a);
          const uint32_t noise_b = greedy ? 0u : shared_noise ? words[2 * j + 1] : noise_word(plan.key, id_b);
          if (tok_a < p.vocab) fold_logit(part, plan, logit(nt, j), id_a, noise_a);
          if (tok_b < p.vocab) fold_logit(part, plan, logit(nt, 2 + j), id_b, noise_b);
          running[warp][nt][j][lane] = part;
        }
      }
    }
  });

  Partial part[kNT][2];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int j = 0; j < 2; ++j) part[nt][j] = running[warp][nt][j][lane];
  finish_scan<kNT, kWarps>(p, tail, plans, part, merged, warp, lane);
}

struct StreamScan {
  template <flashspec_dtype kW, int kShape>
  static const void* of() {
    return reinterpret_cast<const void*>(&stream_scan_kernel<kW, kShape>);
  }
};

}  // namespace

const void* stream_kernel(int shape, flashspec_dtype w_dtype) { return stream::kernel_for<StreamScan>(shape, w_dtype); }

int stream_blocks(int32_t vocab, int max_blocks) {
  const int64_t tiles = (int64_t(vocab) + 15) / 16;
  return int(std::max<int64_t>(1, std::min<int64_t>(max_blocks, (tiles + kWarps - 1) / kWarps)));
}

cudaError_t launch_stream(const void* kernel, const ScanParams& params, const StreamTail& tail, int blocks,
                          cudaStream_t stream) {
  ScanParams p = params;
  StreamTail t = tail;
  void* args[] = {&p, &t};
  return launch_dependent(kernel, dim3(blocks), dim3(kThreads), 0, stream, args);
}

}  // namespace scan
}  // namespace cuda
}  // namespace flashspec
