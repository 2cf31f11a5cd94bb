// The tensor-core scan: logits = hidden · Wᵀ on mma.sync (bf16 or fp16 in,
// fp32 accumulation), reduced to per-row partials in the epilogue.
//
// A CTA owns a contiguous, 8-aligned token range and one block of BM rows.
// It walks its range in tiles of BN tokens; the k-loop over d and the walk
// over tiles form one flat sequence, so the cp.async pipeline (16-byte
// copies, STAGES deep) keeps streaming W across tile boundaries while the
// epilogue of the previous tile runs. Shared-memory rows are BK * 2 bytes with
// a 3-bit XOR swizzle, so ldmatrix and the async copies are free of bank
// conflicts. Nothing vocabulary-sized leaves the chip.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <utility>

#include "mma.cuh"
#include "scan.h"
#include "stochastic_phase.cuh"
#include "tuning.h"

namespace flashspec {
namespace cuda {
namespace scan {
namespace {

constexpr int kThreads = tuning::kMmaThreads;
constexpr int kBN = tuning::kMmaTileTokens;

// The layout of shape kShape of tuning::kMmaShapes (BM rows, BK columns per
// stage; see the table for why each shape is what it is).
template <int kShape>
struct Config {
  static constexpr tuning::MmaShape kTuned = tuning::kMmaShapes[kShape];
  static constexpr int BM = kTuned.bm;
  static constexpr int kBK = kTuned.bk;
  static constexpr int kChunks = kBK / 8;  // 16-byte chunks per smem row
  static constexpr int kRowBytes = kBK * 2;
  static constexpr int kStages = tuning::kMmaStages;
  static constexpr int kMinBlocks = kTuned.min_blocks;
  static constexpr int kWarpsM = BM >= 64 ? 2 : 1;
  static constexpr int kWarpsN = (kThreads / 32) / kWarpsM;
  static constexpr int kWM = BM / kWarpsM;
  static constexpr int kWN = kBN / kWarpsN;
  static constexpr int kMT = kWM / 16;
  static constexpr int kNT = kWN / 8;
  static constexpr int kStageBytes = (BM + kBN) * kRowBytes;
  static constexpr int kPipeBytes = kStages * kStageBytes;
  static constexpr int kPlanBytes = BM * int(sizeof(RowPlan));
  static constexpr int kRunningBytes = kWarpsN * BM * int(sizeof(Partial));
  static constexpr int kBaseBytes = kPipeBytes + kPlanBytes + kRunningBytes;
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Byte offset of 16-byte chunk c of a smem row of kRowBytes: the low chunk
// bits are XORed with the row, so the eight rows of an ldmatrix phase, and
// eight consecutive async copies, hit distinct banks (64-byte rows: two
// rows share a 128-byte line, hence the shift).
template <int kRowBytes>
__device__ __forceinline__ int swizzle(int row, int chunk) {
  if constexpr (kRowBytes == 64) return row * 64 + ((chunk ^ ((row >> 1) & 3)) << 4);
  return row * kRowBytes + ((chunk ^ (row & 7)) << 4);
}



__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;  // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

template <int kShape, bool kBf16>
__global__ void __launch_bounds__(kThreads, Config<kShape>::kMinBlocks) mma_scan_kernel(const ScanParams p) {
  using C = Config<kShape>;
  constexpr int BM = C::BM;
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* pipe = smem;
  RowPlan* plans = reinterpret_cast<RowPlan*>(smem + C::kPipeBytes);
  Partial* running = reinterpret_cast<Partial*>(smem + C::kPipeBytes + C::kPlanBytes);
  float* kept = reinterpret_cast<float*>(smem + C::kBaseBytes);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int wm = warp / C::kWarpsN, wn = warp % C::kWarpsN;
  const int rb = blockIdx.x % p.row_blocks;
  const int group = blockIdx.x / p.row_blocks;
  int begin, end;
  group_range(p.vocab, p.groups, group, begin, end);

  for (int lr = tid; lr < BM; lr += kThreads) {
    const int row = rb * BM + lr;
    plans[lr] = plan_or_placeholder(p.plans, p.row_base, p.rows, row);
  }
  for (int i = tid; i < C::kWarpsN * BM; i += kThreads) running[i] = empty_partial();

  constexpr int kBK = C::kBK, kCh = C::kChunks, kRB = C::kRowBytes;
  const int ktiles = (p.k_pad + kBK - 1) / kBK;
  const int tiles = (end - begin + kBN - 1) / kBN;
  const int64_t total = int64_t(tiles) * ktiles;
  const size_t esize = 2;
  const unsigned char* hbase = static_cast<const unsigned char*>(p.h);
  const unsigned char* wbase = static_cast<const unsigned char*>(p.w);

  // The producer runs kStages − 1 steps ahead of the consumer; both walk
  // (tile, k-tile) with counters, no 64-bit division per step.
  int issue_tile = 0, issue_kt = 0, issue_stage = 0;
  auto issue = [&]() {
    const int tok0 = begin + issue_tile * kBN, k0 = issue_kt * kBK;
    unsigned char* st = pipe + issue_stage * C::kStageBytes;
    for (int i = tid; i < (BM + kBN) * kCh; i += kThreads) {
      if (i < BM * kCh) {
        const int r = i / kCh, c = i % kCh;
        const int row = rb * BM + r, col = k0 + c * 8;
        const bool valid = row < p.rows && col < p.k_pad;
        const void* src = valid ? hbase + (int64_t(p.row_base + row) * p.k_pad + col) * esize : p.h;
        cp_async16(smem_u32(st + swizzle<kRB>(r, c)), src, valid);
      } else {
        const int j = i - BM * kCh;
        const int r = j / kCh, c = j % kCh;
        const int tok = tok0 + r, col = k0 + c * 8;
        const bool valid = tok < end && col < p.d_load;
        const void* src = valid ? wbase + (int64_t(tok) * p.ldw + col) * esize : p.w;
        cp_async16(smem_u32(st + BM * kRB + swizzle<kRB>(r, c)), src, valid);
      }
    }
    if (++issue_kt == ktiles) {
      issue_kt = 0;
      ++issue_tile;
    }
    if (++issue_stage == C::kStages) issue_stage = 0;
  };

  float acc[C::kMT][C::kNT][4];
#pragma unroll
  for (int mt = 0; mt < C::kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < C::kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;

  __syncthreads();  // plans and running partials in place

#pragma unroll 1
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < total) issue();
    cp_async_commit();
  }

  const int mi = lane >> 3, mr = lane & 7;
  int tile = 0, kt = 0, stage = 0;
#pragma unroll 1
  for (int64_t it = 0; it < total; ++it) {
    cp_async_wait<C::kStages - 2>();
    __syncthreads();
    if (it + C::kStages - 1 < total) issue();
    cp_async_commit();

    const unsigned char* st = pipe + stage * C::kStageBytes;
    if (++stage == C::kStages) stage = 0;
    const uint32_t a_base = smem_u32(st), b_base = smem_u32(st + BM * kRB);
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      uint32_t a[C::kMT][4], b[C::kNT][2];
#pragma unroll
      for (int mt = 0; mt < C::kMT; ++mt) {
        const int row = wm * C::kWM + mt * 16 + (mi & 1) * 8 + mr;
        ldmatrix_x4(a_base + swizzle<kRB>(row, ks * 2 + (mi >> 1)), a[mt][0], a[mt][1], a[mt][2], a[mt][3]);
      }
#pragma unroll
      for (int np = 0; np < C::kNT / 2; ++np) {
        const int tok = wn * C::kWN + np * 16 + (mi >> 1) * 8 + mr;
        ldmatrix_x4(b_base + swizzle<kRB>(tok, ks * 2 + (mi & 1)), b[2 * np][0], b[2 * np][1], b[2 * np + 1][0],
                    b[2 * np + 1][1]);
      }
#pragma unroll
      for (int mt = 0; mt < C::kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < C::kNT; ++nt)
          mma_m16n8k16<kBf16>(acc[mt][nt], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[nt][0], b[nt][1]);
    }

    if (++kt == ktiles) {
      // Epilogue of one tile: fold this thread's logits, merge the four
      // lanes that share a row, add to the warp column's running partial.
      kt = 0;
      const int tok0 = begin + tile * kBN + wn * C::kWN;
      ++tile;
#pragma unroll
      for (int mt = 0; mt < C::kMT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int lr = wm * C::kWM + mt * 16 + h * 8 + g;
          const bool row_valid = rb * BM + lr < p.rows;
          const RowPlan& plan = plans[lr];
          const bool greedy = plan.flags & kPlanGreedy;
          const bool keep = (plan.flags & kPlanKeep) && p.stochastic && row_valid;
          Partial part = empty_partial();
#pragma unroll
          for (int nt = 0; nt < C::kNT; ++nt) {
            const int tok = tok0 + nt * 8 + 2 * t;
            if (tok < end) {
              const int32_t id = p.token_base + tok;
              uint32_t n0 = 0, n1 = 0;
              if (!greedy) {
                if ((id & 1) == 0) {
                  // An even id and its successor share one Philox block.
                  Philox4 block = row_block(plan.key, uint32_t(id) >> 2);
                  n0 = philox_word(block, id & 3);
                  n1 = philox_word(block, (id & 3) + 1);
                } else {
                  n0 = noise_word(plan.key, id);
                  n1 = noise_word(plan.key, id + 1);
                }
              }
              const float l0 = acc[mt][nt][2 * h], l1 = acc[mt][nt][2 * h + 1];
              fold_logit(part, plan, l0, id, n0);
              if (keep) kept[int64_t(lr) * p.slice + (tok - begin)] = l0 * plan.inv_t;
              if (tok + 1 < end) {
                fold_logit(part, plan, l1, id + 1, n1);
                if (keep) kept[int64_t(lr) * p.slice + (tok + 1 - begin)] = l1 * plan.inv_t;
              }
            }
          }
          merge_with_lane(part, 1, lane);
          merge_with_lane(part, 2, lane);
          if (t == 0 && row_valid) merge_partial(running[wn * BM + lr], part);
        }
      }
#pragma unroll
      for (int mt = 0; mt < C::kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < C::kNT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;
    }
  }
  cp_async_wait<0>();
  __syncthreads();

  for (int lr = tid; lr < BM; lr += kThreads) {
    const int row = rb * BM + lr;
    if (row >= p.rows) continue;
    Partial all = running[lr];
    for (int w = 1; w < C::kWarpsN; ++w) merge_partial(all, running[w * BM + lr]);
    p.partials[int64_t(group) * p.partial_stride + p.row_base + row] = all;
  }
  if (p.stochastic) {
    __syncthreads();
    // The pipeline buffers are free now: reuse them as scratch.
    stochastic_phase(p, group, begin, end, plans, kept, reinterpret_cast<float*>(pipe));
  }
}

template <int kShape>
MmaKernel mma_kernel_of() {
  using C = Config<kShape>;
  return MmaKernel{reinterpret_cast<const void*>(&mma_scan_kernel<kShape, true>),
                   reinterpret_cast<const void*>(&mma_scan_kernel<kShape, false>), size_t(C::kBaseBytes),
                   size_t(C::kPipeBytes)};
}

template <size_t... kShapes>
const MmaKernel* mma_kernel_table(std::index_sequence<kShapes...>) {
  static const MmaKernel table[] = {mma_kernel_of<int(kShapes)>()...};
  return table;
}

}  // namespace

const MmaKernel& mma_kernel(int shape) {
  return mma_kernel_table(std::make_index_sequence<tuning::kMmaShapeCount>())[shape];
}

}  // namespace scan
}  // namespace cuda
}  // namespace flashspec
