// The weight-streaming scan for few rows (≤ 16): a pure read of W at HBM
// bandwidth, with the product on tensor cores and the reduction in registers.
//
// Every warp owns a run of 16-token tiles and streams them straight from
// global memory into mma.sync A fragments: no shared-memory staging, no
// block-wide barrier in the main loop, so a warp waits only for its own
// loads while the SM's other warps keep the memory system busy. The k
// dimension is permuted inside each 32-element chunk so that a lane's A
// fragment is two 16-byte loads (eight consecutive elements of token g and of
// token g + 8) and its B fragment one 16-byte load of hidden row g: the dot
// product is a sum over k, so any permutation applied to both operands gives
// the same logits. Hidden rows are tiny and stay in L1/L2.
//
// 8-bit codes (e4m3, int8) take the same loads — 16 bytes of token g and of
// g + 8 per lane per 64-byte chunk — which now hold 16 codes each: the chunk
// covers 64 elements, the codes are converted to bf16 in registers (exactly:
// every e4m3 and int8 value is a bf16 value) and feed four mma instructions
// against the matching 16 elements of the bf16 hidden row. Half the bytes of
// W per logit; the row's scale multiplies the finished logit.
//
// The epilogue folds each logit into the lane's running Partial of its rows
// (online log-sum-exp, Gumbel top-2, tracked logit); tokens reach a Partial in
// increasing order. Warps then merge across lanes and across the CTA in a
// fixed order, and the CTA writes one Partial per row: nothing
// vocabulary-sized leaves the chip.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <utility>

#include "launch.cuh"
#include "codes.cuh"
#include "mma.cuh"
#include "scan.h"
#include "scan_params.h"
#include "tuning.h"
#include "warp_fold.cuh"

namespace flashspec {
namespace cuda {
namespace scan {
namespace {

constexpr int kThreads = tuning::kStreamThreads;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxRows = tuning::kStreamMaxRows;

__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 v;
  // The 256-byte L2 prefetch matters: without it the scan is 17% slower.
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ uint4 load_cached(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

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

// Loads of one burst: kUnroll 64-byte chunks of the lane's two tokens.
template <int kUnroll>
struct Burst {
  uint4 a0[kUnroll], a1[kUnroll];
};

// kShape: the entry of tuning::kStreamShapes (rows, 8-row groups, burst
// length, CTAs per SM); kW: W's dtype (bf16, fp16, e4m3, int8).
template <flashspec_dtype kW, int kShape>
__global__ void __launch_bounds__(kThreads, tuning::stream_shape(is_codes(kW), kShape).min_blocks)
    stream_scan_kernel(const ScanParams p, const StreamTail tail) {
  constexpr bool kCodes = is_codes(kW);
  constexpr bool kBf16 = kW != FLASHSPEC_DTYPE_F16;  // the mma's input type
  constexpr int kChunk = kCodes ? 64 : 32;           // elements per 64-byte chunk of a row
  constexpr int kLaneElements = kChunk / 4;          // a lane's 16 bytes of a chunk
  constexpr int kNT = tuning::stream_shape(kCodes, kShape).row_groups;
  __shared__ RowPlan plans[kMaxRows];
  // The lanes' running partials live here rather than in registers, which
  // the double-buffered loads need: [warp][nt][j][lane].
  __shared__ Partial running[kWarps][kNT][2][32];
  __shared__ Partial merged[kWarps][kMaxRows];

  constexpr int kUnroll = tuning::stream_shape(kCodes, kShape).unroll;
  using Burst = flashspec::cuda::scan::Burst<kUnroll>;
  pdl_wait();     // plans and staged hidden rows come from the kernels before
  pdl_trigger();  // what follows may launch now; it waits for this grid to finish

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  if (tid < kMaxRows) {
    plans[tid] = plan_or_placeholder(p.plans, p.row_base, p.rows, tid);
  }
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    running[warp][nt][0][lane] = empty_partial();
    running[warp][nt][1][lane] = empty_partial();
  }
  __syncthreads();

  const int total_tiles = (p.vocab + 15) / 16;
  // Warp w of the grid's W takes tiles [w·T/W, (w+1)·T/W): runs differ by
  // at most one tile, so every SM streams the same share of W whatever the
  // vocabulary (whole runs of ⌈T/W⌉ tiles left a tenth of the SMs half
  // loaded at V = 151936).
  const int64_t grid_warps = int64_t(gridDim.x) * kWarps, warp_index = int64_t(blockIdx.x) * kWarps + warp;
  const int first_tile = int(warp_index * total_tiles / grid_warps);
  const int tiles = int((warp_index + 1) * total_tiles / grid_warps) - first_tile;
  const int chunks = p.k_pad / kChunk;
  const int bursts = (chunks + kUnroll - 1) / kUnroll;
  const int steps = tiles * bursts;

  // B operands: hidden row nt*8 + g, the lane's 8 elements of each chunk.
  const unsigned char* hrow[kNT];
  bool hvalid[kNT];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    const int row = nt * 8 + g;
    hvalid[nt] = row < p.rows;
    hrow[nt] = static_cast<const unsigned char*>(p.h) +
               (int64_t(p.row_base + (hvalid[nt] ? row : 0)) * p.k_pad + kLaneElements * t) * 2;
  }

  const uint4 zero = make_uint4(0, 0, 0, 0);
  const unsigned char* w = static_cast<const unsigned char*>(p.w);
  // Issues the loads of step s (tile s / bursts, burst s % bursts).
  auto issue = [&](int tile, int burst, Burst& out) {
    const int tok_a = (first_tile + tile) * 16 + g, tok_b = tok_a + 8;
    const bool valid_a = tok_a < p.vocab, valid_b = tok_b < p.vocab;
    constexpr int kElement = kCodes ? 1 : 2;
    const unsigned char* wa = w + (int64_t(valid_a ? tok_a : 0) * p.ldw + kLaneElements * t) * kElement;
    const unsigned char* wb = w + (int64_t(valid_b ? tok_b : 0) * p.ldw + kLaneElements * t) * kElement;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = burst * kUnroll + u;
      const bool in_w = c < chunks && c * kChunk + kLaneElements * t < p.d_load;
      out.a0[u] = (in_w && valid_a) ? load_stream(wa + int64_t(c) * 64) : zero;
      out.a1[u] = (in_w && valid_b) ? load_stream(wb + int64_t(c) * 64) : zero;
    }
  };

  // Two accumulator sets (even and odd chunks) halve the chain of dependent
  // mma instructions a warp waits on; they are added in the epilogue.
  float acc[2][kNT][4];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) acc[h][nt][0] = acc[h][nt][1] = acc[h][nt][2] = acc[h][nt][3] = 0.0f;

  Burst cur;
  if (steps > 0) issue(0, 0, cur);
  int tile = 0, burst = 0;
#pragma unroll 1
  for (int s = 0; s < steps; ++s) {
    // The next burst's loads go out before this one is consumed, across
    // tile boundaries, so every lane keeps two bursts in flight.
    int next_tile = tile, next_burst = burst + 1;
    if (next_burst == bursts) {
      next_burst = 0;
      ++next_tile;
    }
    Burst nxt;
    if (s + 1 < steps) issue(next_tile, next_burst, nxt);

#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = burst * kUnroll + u;
      if constexpr (kCodes) {
        // The lane's 16 codes of token a and of token b as bf16 pairs; pair
        // j meets hidden elements 2j, 2j + 1 of the lane's 16.
        uint32_t a[8], b[8];
        const uint32_t wa[4] = {cur.a0[u].x, cur.a0[u].y, cur.a0[u].z, cur.a0[u].w};
        const uint32_t wb[4] = {cur.a1[u].x, cur.a1[u].y, cur.a1[u].z, cur.a1[u].w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          codes_to_bf16x2<kW>(wa[q], a[2 * q], a[2 * q + 1]);
          codes_to_bf16x2<kW>(wb[q], b[2 * q], b[2 * q + 1]);
        }
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          const bool live = c < chunks && hvalid[nt];
          const uint4 h0 = live ? load_cached(hrow[nt] + c * 128) : zero;
          const uint4 h1 = live ? load_cached(hrow[nt] + c * 128 + 16) : zero;
          mma_m16n8k16<true>(acc[0][nt], a[0], b[0], a[1], b[1], h0.x, h0.y);
          mma_m16n8k16<true>(acc[1][nt], a[2], b[2], a[3], b[3], h0.z, h0.w);
          mma_m16n8k16<true>(acc[0][nt], a[4], b[4], a[5], b[5], h1.x, h1.y);
          mma_m16n8k16<true>(acc[1][nt], a[6], b[6], a[7], b[7], h1.z, h1.w);
        }
      } else {
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          const uint4 b = (c < chunks && hvalid[nt]) ? load_cached(hrow[nt] + c * 64) : zero;
          mma_m16n8k16<kBf16>(acc[u & 1][nt], cur.a0[u].x, cur.a1[u].x, cur.a0[u].y, cur.a1[u].y, b.x, b.y);
          mma_m16n8k16<kBf16>(acc[u & 1][nt], cur.a0[u].z, cur.a1[u].z, cur.a0[u].w, cur.a1[u].w, b.z, b.w);
        }
      }
    }

    if (burst == bursts - 1) {
      // acc[·][nt] = {(tok_a, row 2t), (tok_a, row 2t+1), (tok_b, row 2t), (tok_b, row 2t+1)}.
      const int tok_a = (first_tile + tile) * 16 + g, tok_b = tok_a + 8;
      float scale_a = 1.0f, scale_b = 1.0f;
      if constexpr (kCodes) {
        if (tok_a < p.vocab) scale_a = __ldg(p.w_scale + tok_a);
        if (tok_b < p.vocab) scale_b = __ldg(p.w_scale + tok_b);
      }
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int row = nt * 8 + 2 * t + j;
          if (row < p.rows) {
            const RowPlan& plan = plans[row];
            const bool greedy = plan.flags & kPlanGreedy;
            Partial part = running[warp][nt][j][lane];
            float l_a = acc[0][nt][j] + acc[1][nt][j], l_b = acc[0][nt][2 + j] + acc[1][nt][2 + j];
            if constexpr (kCodes) {
              l_a *= scale_a;
              l_b *= scale_b;
            }
            const int32_t id_a = p.token_base + tok_a, id_b = p.token_base + tok_b;
            if (tok_a < p.vocab) fold_logit(part, plan, l_a, id_a, greedy ? 0u : noise_word(plan.key, id_a));
            if (tok_b < p.vocab) fold_logit(part, plan, l_b, id_b, greedy ? 0u : noise_word(plan.key, id_b));
            running[warp][nt][j][lane] = part;
          }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) acc[h][nt][0] = acc[h][nt][1] = acc[h][nt][2] = acc[h][nt][3] = 0.0f;
      }
    }
    cur = nxt;
    tile = next_tile;
    burst = next_burst;
  }

  Partial part[kNT][2];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int j = 0; j < 2; ++j) part[nt][j] = running[warp][nt][j][lane];
  finish_scan<kNT, kWarps>(p, tail, plans, part, merged, warp, lane);
}

template <flashspec_dtype kW, size_t... kShapes>
const void* stream_kernel_of(int shape, std::index_sequence<kShapes...>) {
  static const void* const kernels[] = {reinterpret_cast<const void*>(&stream_scan_kernel<kW, int(kShapes)>)...};
  return kernels[shape];
}

}  // namespace

const void* stream_kernel(int shape, flashspec_dtype w_dtype) {
  const auto shapes = std::make_index_sequence<tuning::kStreamShapeCount>();
  switch (w_dtype) {
    case FLASHSPEC_DTYPE_F16: return stream_kernel_of<FLASHSPEC_DTYPE_F16>(shape, shapes);
    case FLASHSPEC_DTYPE_E4M3: return stream_kernel_of<FLASHSPEC_DTYPE_E4M3>(shape, shapes);
    case FLASHSPEC_DTYPE_I8: return stream_kernel_of<FLASHSPEC_DTYPE_I8>(shape, shapes);
    default: return stream_kernel_of<FLASHSPEC_DTYPE_BF16>(shape, shapes);
  }
}

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
