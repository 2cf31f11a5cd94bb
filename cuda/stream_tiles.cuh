// The weight-streaming loop for few rows (≤ 16): a pure read of W at HBM
// bandwidth, with the product on tensor cores. Two kernels run it: the
// plain scan (scan_stream.cu), whose epilogue folds each logit into the
// lane's running Partials, and the controlled scan (controls.cu), whose
// epilogue keeps the CTA's logits in shared memory for the controls.
//
// Every warp owns a run of 16-token tiles and streams them straight from
// global memory into mma.sync A fragments: no shared-memory staging, no
// block-wide barrier in the loop, so a warp waits only for its own loads
// while the SM's other warps keep the memory system busy. The k dimension is
// permuted inside each 32-element chunk so that a lane's A fragment is two
// 16-byte loads (eight consecutive elements of token g and of token g + 8)
// and its B fragment one 16-byte load of hidden row g: the dot product is a
// sum over k, so any permutation applied to both operands gives the same
// logits. Hidden rows are tiny and stay in L1/L2.
//
// 8-bit codes (e4m3, int8) take the same loads — 16 bytes of token g and of
// g + 8 per lane per 64-byte chunk — which now hold 16 codes each: the chunk
// covers 64 elements, the codes are converted to bf16 in registers (exactly:
// every e4m3 and int8 value is a bf16 value) and feed four mma instructions
// against the matching 16 elements of the bf16 hidden row. Half the bytes of
// W per logit; the row's scale multiplies the finished logit.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "codes.cuh"
#include "mma.cuh"
#include "scan_params.h"
#include "tuning.h"

namespace flashspec {
namespace cuda {
namespace stream {

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

// Warp w of the grid's W takes tiles [w·T/W, (w+1)·T/W) of the T 16-token
// tiles: runs differ by at most one tile, so every SM streams the same share
// of W whatever the vocabulary (whole runs of ⌈T/W⌉ tiles left a tenth of
// the SMs half loaded at V = 151936). A CTA's warps hold consecutive runs,
// so a CTA covers one contiguous token range.
__host__ __device__ __forceinline__ int first_tile_of(int64_t warp_index, int64_t grid_warps, int32_t vocab) {
  const int64_t total_tiles = (int64_t(vocab) + 15) / 16;
  return int(warp_index * total_tiles / grid_warps);
}

// The calling warp's run of tiles in a grid of stream kernels.
struct WarpRun {
  int first_tile, tiles;
};
__device__ __forceinline__ WarpRun warp_run(int32_t vocab) {
  const int64_t grid_warps = int64_t(gridDim.x) * kWarps;
  const int64_t warp_index = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int first = first_tile_of(warp_index, grid_warps, vocab);
  return WarpRun{first, first_tile_of(warp_index + 1, grid_warps, vocab) - first};
}

// Asks L2 for the start of the calling warp's run before the kernel waits
// for its predecessors (W depends on none of them): the first bytes of each
// row of its first tile, which its first bursts read, the grid taking
// tuning::kStreamPrefetchBytes in all. The lines are only requested; the
// loads that follow read them as any other.
template <flashspec_dtype kW>
__device__ __forceinline__ void prefetch_run_start(const ScanParams& p, const WarpRun& run) {
  constexpr int64_t kElement = is_codes(kW) ? 1 : 2;
  const int lane = threadIdx.x & 31;
  const int token = run.first_tile * 16 + lane;
  if (run.tiles <= 0 || lane >= 16 || token >= p.vocab) return;
  const int64_t grid_rows = int64_t(gridDim.x) * kWarps * 16;
  const int64_t row_bytes = int64_t(p.d_load) * kElement;
  int64_t bytes = tuning::kStreamPrefetchBytes / grid_rows / 128 * 128;
  if (bytes > row_bytes) bytes = row_bytes;
  const unsigned char* row = static_cast<const unsigned char*>(p.w) + int64_t(token) * p.ldw * kElement;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // One bulk request per row (the copy engine, not the load unit's slots);
  // rows start 16-byte aligned on this path and the size is whole 16 bytes.
  bytes &= ~int64_t(15);
  if (bytes > 0)
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(row), "r"(uint32_t(bytes)) : "memory");
#else
  for (int64_t b = 0; b < bytes; b += 128) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(row + b));
#endif
}

// Loads of one burst: kUnroll 64-byte chunks of the lane's two tokens.
template <int kUnroll>
struct Burst {
  uint4 a0[kUnroll], a1[kUnroll];
};

// Streams the warp's run of tiles of W against the launch's hidden rows.
// Before the products of a tile's last burst, whose loads and the next
// burst's are then in flight, it calls prepare(tok_a): work of the tile's
// epilogue that needs no logit goes there, in the shadow of the loads.
// After each tile it calls epilogue(tok_a, logit): logit(nt, q) is the
// logit of (tok_a, row nt*8 + 2t + q) for q = 0, 1 and of (tok_a + 8, row
// nt*8 + 2t + q − 2) for q = 2, 3, with tok_a the lane's token (g) of the
// tile as an index into W and 8-bit codes' row scales applied. Tokens past
// the vocabulary and rows past p.rows hold zeros the epilogue must skip.
// kShape: the entry of tuning::kStreamShapes; kW: W's dtype.
template <flashspec_dtype kW, int kShape, class Prepare, class Epilogue>
__device__ __forceinline__ void stream_tiles(const ScanParams& p, int first_tile, int tiles, Prepare&& prepare,
                                             Epilogue&& epilogue) {
  constexpr bool kCodes = is_codes(kW);
  constexpr bool kBf16 = kW != FLASHSPEC_DTYPE_F16;  // the mma's input type
  constexpr int kChunk = kCodes ? 64 : 32;           // elements per 64-byte chunk of a row
  constexpr int kLaneElements = kChunk / 4;          // a lane's 16 bytes of a chunk
  constexpr int kNT = tuning::stream_shape(kCodes, kShape).row_groups;
  constexpr int kUnroll = tuning::stream_shape(kCodes, kShape).unroll;
  using BurstT = Burst<kUnroll>;

  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
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
  auto issue = [&](int tile, int burst, BurstT& out) {
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

  BurstT cur;
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
    BurstT nxt;
    if (s + 1 < steps) issue(next_tile, next_burst, nxt);
    if (burst == bursts - 1) prepare((first_tile + tile) * 16 + g);

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
      const int tok_a = (first_tile + tile) * 16 + g, tok_b = tok_a + 8;
      float scale_a = 1.0f, scale_b = 1.0f;
      if constexpr (kCodes) {
        if (tok_a < p.vocab) scale_a = __ldg(p.w_scale + tok_a);
        if (tok_b < p.vocab) scale_b = __ldg(p.w_scale + tok_b);
      }
      // logit(nt, q): q = 0, 1 token a's rows nt*8 + 2t, + 1; q = 2, 3 token b's.
      auto logit = [&](int nt, int q) {
        float v = acc[0][nt][q] + acc[1][nt][q];
        if constexpr (kCodes) v *= q < 2 ? scale_a : scale_b;
        return v;
      };
      epilogue(tok_a, logit);
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h) acc[h][nt][0] = acc[h][nt][1] = acc[h][nt][2] = acc[h][nt][3] = 0.0f;
    }
    cur = nxt;
    tile = next_tile;
    burst = next_burst;
  }
}

// Calls f(row, token, logit) for each of the lane's logits of a tile that
// is in the vocabulary and in the launch's rows (stream_tiles' epilogue).
template <int kNT, class Logit, class F>
__device__ __forceinline__ void each_logit(const ScanParams& p, int tok_a, Logit&& logit, F&& f) {
  const int t = threadIdx.x & 3, tok_b = tok_a + 8;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int row = nt * 8 + 2 * t + j;
      if (row < p.rows) {
        if (tok_a < p.vocab) f(row, tok_a, logit(nt, j));
        if (tok_b < p.vocab) f(row, tok_b, logit(nt, 2 + j));
      }
    }
}

// The instance of a stream kernel template for a tuning::kStreamShapes
// entry and W's dtype: Kernel::of<kW, kShape>() gives its address.
template <class Kernel, flashspec_dtype kW, size_t... kShapes>
const void* kernel_of(int shape, std::index_sequence<kShapes...>) {
  static const void* const kernels[] = {Kernel::template of<kW, int(kShapes)>()...};
  return kernels[shape];
}
template <class Kernel>
const void* kernel_for(int shape, flashspec_dtype w_dtype) {
  const auto shapes = std::make_index_sequence<tuning::kStreamShapeCount>();
  switch (w_dtype) {
    case FLASHSPEC_DTYPE_F16: return kernel_of<Kernel, FLASHSPEC_DTYPE_F16>(shape, shapes);
    case FLASHSPEC_DTYPE_E4M3: return kernel_of<Kernel, FLASHSPEC_DTYPE_E4M3>(shape, shapes);
    case FLASHSPEC_DTYPE_I8: return kernel_of<Kernel, FLASHSPEC_DTYPE_I8>(shape, shapes);
    default: return kernel_of<Kernel, FLASHSPEC_DTYPE_BF16>(shape, shapes);
  }
}

}  // namespace stream
}  // namespace cuda
}  // namespace flashspec
