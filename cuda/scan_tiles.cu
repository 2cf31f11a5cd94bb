// The scan of greedy launches of 9 rows or more on sm_90a (tile_scan,
// scan_tiles.h): a warp-specialised GEMM whose epilogue is the fold. A CTA
// owns a tile of hidden rows (the MMA's M) and a range of the vocabulary,
// walked in tiles of W's tokens (N); one producer lane moves both operands
// through a ring of TMA boxes, and two consumer warpgroups take the token
// tiles in turn: each multiplies its tile into fp32 accumulators and then
// folds them straight into its rows' running Partials while the other group
// multiplies the next tile, so the fold overlaps the tensor cores (CUTLASS's
// "ping-pong" schedule). The logits never leave the registers. Where the
// launch's tiles of rows pair up, CTAs of two tiles of rows over one token
// range run as a cluster and each loads half of every W box into both
// (kPaired). For 8-bit codes (e4m3, int8) the producer lane loads each
// stage's codes beside it, three more producer warps convert them into the
// stage's 16-bit W panel in the layout a TMA box of 16-bit W would have,
// and the fold scales each logit by its row's scale (codes.cuh's
// conversions are exact, so the logits are those of the dequantised head).
// The panel is f16 where every row of the CTA's tile has an exact f16 copy
// (TileHidden: the row times a power of two, which the fold takes off
// again), which the hidden boxes then bring: e4m3 converts to f16 in one
// instruction per pair of codes, to bf16 in four, and int8 in three
// against four. Elsewhere it is bf16, meeting the bf16 rows.
//
// Every row is greedy (dispatch launches it only then): a row's score is its
// logit, with no scaling, log-sum-exp or noise, as in fold_logit. Sampled
// rows stay with the cuBLAS chunks, whose fold runs beside the products on
// other SMs: here a sampled fold (Philox words, bounds, Gumbel transforms)
// has one warp per scheduler and took longer than the other group's
// products (bench/RESULTS.md).
//
// Accumulator layout (wgmma.cuh): thread (warp w of its group, lane = 4g +
// t) holds, for each 64-row block b of the CTA's rows, rows 64b + 16w + g
// and 64b + 16w + g + 8 (h = 0, 1) at tokens 8j + 2t + q (q = 0, 1) of the
// tile: acc[b][4j + 2h + q]. The four lanes of one g share their rows, so a
// row's partial is the merge of four lanes' (tokens interleaved in pairs;
// merges break ties by token id, so the order of the pieces does not
// matter), and each lane offers its own tokens in increasing order.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "codes.cuh"
#include "launch.cuh"
#include "scan.h"
#include "scan_tiles.h"
#include "tma.cuh"
#include "warp_fold.cuh"
#include "wgmma.cuh"

namespace flashspec {
namespace cuda {
namespace tile_scan {
namespace {

constexpr int kGroups = 2;  // consumer warpgroups
constexpr int kConsumerWarps = kGroups * 4;
constexpr int kThreads = (kConsumerWarps + 4) * 32;  // and a producer warpgroup
// Registers per thread after the split: the producer warpgroup gives up
// what the consumers' accumulators take (at one CTA per SM, 65536 in all).
// With 8-bit codes three of its warps convert them and keep more.
constexpr int kProducerRegisters = 40, kConsumerRegisters = 232;
constexpr int kCodeProducerRegisters = 56, kCodeConsumerRegisters = 224;
static_assert(4 * 32 * (kProducerRegisters + kGroups * kConsumerRegisters) <= 65536, "the register file");
static_assert(4 * 32 * (kCodeProducerRegisters + kGroups * kCodeConsumerRegisters) <= 65536, "the register file");
// 8-bit codes: the producer warpgroup's first warp issues the loads, the
// other three convert each stage's codes into its W panel.
constexpr int kConverterWarps = 3;
constexpr int kColumns = 64;  // 16-bit elements per row per stage: one 128-byte swizzled box row
constexpr int kRowBytes = kColumns * 2;
constexpr int kAlign = 1024;  // the 128-byte swizzle's period
constexpr size_t kMaxSmemBytes = 227 * 1024;  // one CTA's shared memory on sm_90, opted in

// Keeps the compiler from reading or moving the accumulators while MMAs
// that write them may be in flight: after the wait, every register is
// "written" here, in order.
template <int kN>
__device__ __forceinline__ void settle(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Folds one greedy row's logits of a tile into the thread's partial of the
// row: l(i), i = 2j + q, is the logit of token first + 8j + q (first: the
// global id of the thread's first token of the tile), and `count` of the
// tile's columns from the thread's first are in the vocabulary (token i is
// where 8j + q < count). The per-token work is predicated and the
// candidates taken by selects (OfferForm::kSelects: the partial is in
// registers). kPlain: every token is in the vocabulary and neither the
// tracked nor the excluded token is in the tile, so those tests compile
// away.
template <bool kPlain, int kPairs, class Logit>
__device__ __forceinline__ void fold_row(Partial& part, const RowPlan& plan, Logit&& l, int32_t first, int count) {
#pragma unroll
  for (int j = 0; j < kPairs; ++j)
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const float x = l(2 * j + q);
      const int32_t token = first + 8 * j + q;
      const bool in = kPlain || 8 * j + q < count;
      if (in && !is_finite(x)) part.flags |= kPartialNonFinite;
      if (!kPlain && in && token == plan.tracked) {
        part.tracked = x;
        part.flags |= kPartialTracked;
      }
      const bool offered = in && (kPlain || is_offered(plan, token));
      offer_candidate<OfferForm::kSelects>(part, offered ? x : neg_inf(), x, token);
    }
}

// The consumer threads' running partials, one per row slot, in shared
// memory between tiles (a field's words of consecutive threads adjacent),
// so that the accumulators have the registers during the products.
template <int kSlots>
struct PartialSlots {
  static constexpr int kWords = sizeof(Partial) / 4;
  static constexpr int kThreadsHere = kGroups * 128;
  static constexpr int kBytes = kSlots * kWords * kThreadsHere * 4;
  uint32_t* words;  // [slot][word][consumer thread]
  int thread;

  __device__ __forceinline__ Partial load(int slot) const {
    uint32_t w[kWords];
#pragma unroll
    for (int k = 0; k < kWords; ++k) w[k] = words[(slot * kWords + k) * kThreadsHere + thread];
    Partial part;
    memcpy(&part, w, sizeof(part));
    return part;
  }
  __device__ __forceinline__ void store(int slot, const Partial& part) const {
    uint32_t w[kWords];
    memcpy(w, &part, sizeof(part));
#pragma unroll
    for (int k = 0; k < kWords; ++k) words[(slot * kWords + k) * kThreadsHere + thread] = w[k];
  }
};

// A CTA's shape: kBlocks 64-row blocks (its rows: 64 · kBlocks, each
// consumer group's too), kTokens tokens per tile, and as many ring stages
// as fit in one CTA's shared memory beside the plans and the partials.
// kCodes: W is 8-bit codes, which each stage also holds as loaded (64
// bytes per token, unswizzled) until they are converted into its bf16 W
// panel, and which a third barrier per stage (`loaded`) counts.
template <int kBlocks_, int kTokens_, bool kCodes_ = false>
struct Shape {
  static constexpr int kBlocks = kBlocks_;
  static constexpr int kTokens = kTokens_;
  static constexpr bool kCodes = kCodes_;
  static constexpr int kRows = 64 * kBlocks;
  static constexpr int kAcc = kTokens / 2;    // per 64-row block
  static constexpr int kPairs = kTokens / 8;  // token pairs per row per thread
  static constexpr int kSlots = 2 * kBlocks;  // rows per consumer thread
  static constexpr int kHiddenBytes = kRows * kRowBytes;
  static constexpr int kWBytes = kTokens * kRowBytes;
  static constexpr int kCodeBytes = kCodes ? kTokens * kColumns : 0;
  static constexpr int kStageBytes = kHiddenBytes + kWBytes + kCodeBytes;
  static constexpr int kStageBarriers = kCodes ? 3 : 2;
  using Parts = PartialSlots<kSlots>;
  // Besides the stages (each with its full and empty barriers, and loaded
  // for codes): the ring's alignment, the `multiplied` barrier, the plans
  // and the partials.
  static constexpr size_t kFixedBytes = kAlign + sizeof(uint64_t) + kRows * sizeof(RowPlan) + Parts::kBytes;
  static constexpr int kStages =
      int((kMaxSmemBytes - kFixedBytes) / (kStageBytes + kStageBarriers * sizeof(uint64_t)));
  static constexpr int kBarriers = kStageBarriers * kStages + 1;
  static constexpr size_t kSmemBytes = size_t(kStages) * kStageBytes + kAlign + kBarriers * sizeof(uint64_t) +
                                       kRows * sizeof(RowPlan) + Parts::kBytes;
  static_assert(kHiddenBytes % kAlign == 0 && kWBytes % kAlign == 0 && kCodeBytes % kAlign == 0,
                "every tile starts on the swizzle's period");
  static_assert(kTokens == 128 || kTokens == 256, "the MMA's N (wgmma::mma_k16_n128, mma_k16_n256)");
  static_assert(kSmemBytes <= kMaxSmemBytes, "one CTA per SM on sm_90");
};
// The forms' shapes (scan_tiles.h). 128 rows by 128 tokens: 128
// accumulators per consumer thread, five 32 KB stages. 64 rows: eight 24 KB
// stages of 128 tokens, or five 40 KB stages of 256 (the same 128
// accumulators), whose 8 KB box of hidden rows serves twice the tokens of
// W. The 24 KB stages were five as well until measured: eight were level at
// V = 32000 and 0.5–1.1 % faster at 151936 × 4096 and 8192 × 64 rows (H200,
// greedy drafts 297.6 → 295.8 and 598.4 → 594.0 µs; seven in between;
// bench/RESULTS.md).
using Shape128x128 = Shape<2, 128>;
using Shape64x128 = Shape<1, 128>;
using Shape64x256 = Shape<1, 256>;
static_assert(Shape128x128::kStages == 5 && Shape64x128::kStages == 8 && Shape64x256::kStages == 5,
              "the stage counts measured (bench/RESULTS.md)");
// 8-bit codes: the 128-token forms, each stage 8 KB of codes more (256
// tokens would leave three stages), unpaired.
using CodeShape128x128 = Shape<2, 128, true>;
using CodeShape64x128 = Shape<1, 128, true>;
static_assert(CodeShape128x128::kStages == 4 && CodeShape64x128::kStages == 6, "the stage counts of 8-bit codes");

// One k16 step of a 64-row block's products into its accumulators.
template <class S, bool kBf16>
__device__ __forceinline__ void mma_step(float (&acc)[S::kAcc], uint64_t hidden, uint64_t w, bool accumulate) {
  if constexpr (S::kTokens == 128) wgmma::mma_k16_n128<kBf16>(acc, hidden, w, accumulate);
  else wgmma::mma_k16_n256<kBf16>(acc, hidden, w, accumulate);
}

// A stage's token row of codes: 16-byte vectors, each converting into two
// of bf16.
constexpr int kCodeVectors = kColumns / 16;

// Converts one stage's codes (kTokens rows of kColumns codes, unswizzled)
// into its W panel (kTokens rows of kColumns bf16, or f16 with kF16,
// 128-byte swizzle, as a TMA box of 16-bit W would have written it) with
// the converter warps' threads, exactly (codes.cuh). The row's scale
// multiplies the finished logit.
template <class S, flashspec_dtype kW, bool kF16>
__device__ __forceinline__ void convert_stage(const unsigned char* codes, unsigned char* w, int thread) {
  auto convert = [](uint32_t word, uint32_t& lo, uint32_t& hi) {
    if constexpr (kF16)
      codes_to_f16x2<kW>(word, lo, hi);
    else
      codes_to_bf16x2<kW>(word, lo, hi);
  };
  for (int v = thread; v < S::kTokens * kCodeVectors; v += kConverterWarps * 32) {
    const int token = v / kCodeVectors, quarter = v % kCodeVectors;
    const uint4 in = tma::load_shared_16(tma::smem_address(codes + token * kColumns + quarter * 16));
    uint4 lo, hi;
    convert(in.x, lo.x, lo.y);
    convert(in.y, lo.z, lo.w);
    convert(in.z, hi.x, hi.y);
    convert(in.w, hi.z, hi.w);
    // 16-byte chunk c of a 128-byte row r sits at chunk c ^ (r mod 8).
    unsigned char* row = w + token * kRowBytes;
    *reinterpret_cast<uint4*>(row + (((2 * quarter) ^ (token & 7)) * 16)) = lo;
    *reinterpret_cast<uint4*>(row + (((2 * quarter + 1) ^ (token & 7)) * 16)) = hi;
  }
}

// kPaired: launched in clusters of two CTAs, the two tiles of rows 2c and
// 2c + 1 over the same token range, whose producers each load half of every
// W box into both CTAs (TMA multicast): W leaves L2 once per pair of row
// tiles. A stage is then refilled only once both CTAs' groups are done
// with it (the empty barriers count the warps of both).
template <class S, flashspec_dtype kW, bool kPaired>
__global__ void __launch_bounds__(kThreads, 1)
    tile_scan_kernel(const ScanParams p, const __grid_constant__ TileMaps maps) {
  constexpr bool kCodes = S::kCodes, kBf16 = kW != FLASHSPEC_DTYPE_F16;
  static_assert(kCodes == is_codes(kW) && !(kCodes && kPaired), "8-bit codes take the unpaired code shapes");
  constexpr int kStages = S::kStages;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* ring =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + kAlign - 1) & ~uintptr_t(kAlign - 1));
  uint64_t* full = reinterpret_cast<uint64_t*>(ring + kStages * S::kStageBytes);
  uint64_t* empty = full + kStages;
  // Phase i completes when the group of the CTA's token tile i has waited
  // for every stage of it: the other group starts tile i + 1 only then, so
  // the groups take the ring's stages in step order and no stage's full
  // barrier is waited on more than one phase ahead.
  uint64_t* multiplied = empty + kStages;
  // 8-bit codes: a stage's codes and hidden rows have landed (its `full`
  // then counts the converter warps).
  uint64_t* loaded = multiplied + 1;
  RowPlan* plans = reinterpret_cast<RowPlan*>(multiplied + 1 + (kCodes ? kStages : 0));
  uint32_t* part_words = reinterpret_cast<uint32_t*>(plans + S::kRows);  // S::Parts

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int tiles = (p.vocab + S::kTokens - 1) / S::kTokens;
  const int first_tile = int(int64_t(blockIdx.y) * tiles / gridDim.y);
  const int cta_tiles = int(int64_t(blockIdx.y + 1) * tiles / gridDim.y) - first_tile;
  const int row0 = blockIdx.x * S::kRows;  // of the launch
  const int k_steps = (p.k_pad + kColumns - 1) / kColumns;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      tma::barrier_init(full + s, kCodes ? kConverterWarps : 1);
      tma::barrier_init(empty + s, kPaired ? 8 : 4);  // the warps of the group(s) that multiplied the stage
      if constexpr (kCodes) tma::barrier_init(loaded + s, 1);
    }
    tma::barrier_init(multiplied, 4);
    tma::barrier_init_fence();
  }
  // Where the launch's rows end inside this CTA's tile of rows, it loads
  // only those; each stage's rows past them are zeroed once here.
  const int rows_here = min(S::kRows, p.rows - row0);
  if (rows_here < S::kRows)
    tma::zero_panel_tails(kStages, S::kHiddenBytes, rows_here * kRowBytes,
                          [&](int stage) { return ring + stage * S::kStageBytes; });
  // The barriers set up before any load uses them; paired, both CTAs'
  // before either's loads reach the other.
  if constexpr (kPaired)
    tma::cluster_sync();
  else
    __syncthreads();
  const uint32_t rank = kPaired ? tma::cluster_rank() : 0u;
  const bool producer = warp == kConsumerWarps && lane == 0;  // one lane issues every load

  // Step s of the CTA's walk: token tile first_tile + s / k_steps, columns
  // (s % k_steps) · kColumns, in stage s mod kStages. Its W box: the whole
  // box, or this CTA's half of it into both CTAs (paired).
  const uint32_t stage_bytes =
      uint32_t(rows_here * kRowBytes + (kCodes ? S::kCodeBytes : S::kWBytes));  // the other CTA's half included
  const int steps = cta_tiles * k_steps;
  // Where a stage's loads land: its full barrier, or for codes its loaded.
  uint64_t* const landed = kCodes ? loaded : full;
  const auto load_w = [&](int tile, int column, int stage, uint64_t policy) {
    unsigned char* dst = ring + stage * S::kStageBytes + S::kHiddenBytes;
    if constexpr (kCodes)
      tma::load_box_2d(dst + S::kWBytes, &maps.w, loaded + stage, column, tile * S::kTokens, policy);
    else if constexpr (kPaired)
      tma::load_box_2d_multicast(dst + rank * (S::kWBytes / 2), &maps.w, full + stage, column,
                                 tile * S::kTokens + int(rank) * (S::kTokens / 2), 0x3, policy);
    else
      tma::load_box_2d(dst, &maps.w, full + stage, column, tile * S::kTokens, policy);
  };
  // W depends on no kernel before this one: its first kStages boxes go out
  // before the grid waits for the staged rows and plans, while those
  // kernels run (as the ring scans' do, box::start_ring). H200: 0–2 % off
  // (V = 32000 × 2048 × 256 greedy draft 63.8 → 62.7 µs, 64-row calls
  // level); asking L2 for the next 4 or 8 steps' boxes as well was up to
  // 4 % slower (bench/RESULTS.md).
  const int early = min(kStages, steps);
  if (producer) {
    const uint64_t once = tma::evict_first_policy();
    for (int s = 0; s < early; ++s) {
      tma::barrier_expect(landed + s, stage_bytes);
      load_w(first_tile + s / k_steps, (s % k_steps) * kColumns, s, once);
    }
  }
  pdl_wait();  // the staged rows and plans come from the kernels before
  for (int r = threadIdx.x; r < S::kRows; r += kThreads)
    plans[r] = plan_or_placeholder(p.plans, p.row_base, p.rows, row0 + r);
  // 8-bit codes: the products in f16 where every row of the CTA's tile has
  // an exact f16 copy (TileHidden's factors, which the staging wrote before
  // the grid's wait).
  static_assert(S::kRows <= kThreads, "a thread per row of the tile");
  bool f16_products = false;
  if constexpr (kCodes)
    f16_products = __syncthreads_and(
        p.tile_hidden.factors != nullptr &&
        (int(threadIdx.x) >= rows_here || __ldg(p.tile_hidden.factors + p.row_base + row0 + threadIdx.x) > 0.0f));
  else
    __syncthreads();

  if (warp >= kConsumerWarps) {  // the producer warpgroup
    wgmma::lower_registers<kCodes ? kCodeProducerRegisters : kProducerRegisters>();
    if constexpr (kCodes) {
      if (warp > kConsumerWarps) {  // the converter warps: every step of the CTA's walk in order
        const int thread = threadIdx.x - (kConsumerWarps + 1) * 32;
        const auto convert_steps = [&](auto f16) {
          int stage = 0;
          uint32_t phase = 0;
          for (int s = 0; s < steps; ++s) {
            tma::barrier_wait(loaded + stage, phase);
            unsigned char* at = ring + stage * S::kStageBytes + S::kHiddenBytes;
            convert_stage<S, kW, decltype(f16)::value>(at + S::kWBytes, at, thread);
            tma::shared_stores_to_async_proxy();  // the MMAs read the panel through the async proxy
            __syncwarp();
            if (lane == 0) tma::barrier_arrive(full + stage);
            if (++stage == kStages) {
              stage = 0;
              phase ^= 1u;
            }
          }
        };
        if (f16_products)
          convert_steps(std::true_type{});
        else
          convert_steps(std::false_type{});
        return;
      }
    }
    if (producer) {
      // W evict-first, the hidden rows evict-last: with evict-normal for W
      // greedy drafts took 7–14 % longer at 256–512 rows, for both 20–28 %
      // (bench/RESULTS.md).
      const uint64_t once = tma::evict_first_policy();
      const uint64_t kept = tma::evict_last_policy();
      const CUtensorMap* hidden_map = f16_products ? (rows_here < S::kRows ? &maps.hidden_last_f16 : &maps.hidden_f16)
                                                   : (rows_here < S::kRows ? &maps.hidden_last : &maps.hidden);
      // Steps from `early` on are on a later pass over the ring (early is
      // kStages wherever there are more steps), so each first waits for
      // the stage's empty barrier: phase 0 on the second pass, 1 on the
      // third, and so on (the phase flips as the stage index wraps).
      int s = 0, stage = 0;
      uint32_t phase = 1;
      for (int tile = first_tile; tile < first_tile + cta_tiles; ++tile)
        for (int column = 0; column < k_steps * kColumns; column += kColumns, ++s) {
          if (s >= early) {
            tma::barrier_wait(empty + stage, phase);
            tma::barrier_expect(landed + stage, stage_bytes);
            load_w(tile, column, stage, once);
          }
          tma::load_box_2d(ring + stage * S::kStageBytes, hidden_map, landed + stage, column, p.row_base + row0,
                           kept);
          if (++stage == kStages) {
            stage = 0;
            phase ^= 1u;
          }
        }
    }
    return;
  }

  wgmma::raise_registers<kCodes ? kCodeConsumerRegisters : kConsumerRegisters>();
  const int group = warp / 4, warp_in_group = warp % 4, g = lane / 4, t = lane % 4;
  float acc[S::kBlocks][S::kAcc];
  const typename S::Parts parts{part_words, int(threadIdx.x)};
#pragma unroll
  for (int slot = 0; slot < S::kSlots; ++slot) parts.store(slot, empty_partial());
  const uint32_t ring_address = tma::smem_address(ring);
  const auto local_row = [&](int b, int h) { return b * 64 + warp_in_group * 16 + g + 8 * h; };
  // A warp is done with a stage: its lane 0 tells this CTA's producer and,
  // paired, the other CTA's, whose multicast writes here too.
  const auto release = [&](int stage) {
    if (lane != 0) return;
    tma::barrier_arrive(empty + stage);
    if constexpr (kPaired) tma::barrier_arrive_in(empty + stage, rank ^ 1u);
  };

  // f16 products: each row's factor 2^-k (TileHidden), taken off its
  // logits before the code scale (exactly: a power of two).
  float row_factor[S::kBlocks][2];
#pragma unroll
  for (int b = 0; b < S::kBlocks; ++b)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + local_row(b, h);
      row_factor[b][h] = f16_products && row < p.rows ? __ldg(p.tile_hidden.factors + p.row_base + row) : 1.0f;
    }

  // The tiles' products and folds, the MMAs' type a compile-time tag: a
  // branch between the two types inside the loop would make ptxas
  // serialise every wgmma of the kernel (C7520; bench/RESULTS.md).
  const auto consume_tiles = [&](auto f16) {
    constexpr bool kF16Products = decltype(f16)::value;
    for (int i = group; i < cta_tiles; i += kGroups) {
      if (i > 0) tma::barrier_wait(multiplied, uint32_t(i - 1) & 1u);
      // The ring's stage and phase of the tile's first step, then counted on:
      // no division on the path from one step's MMAs to the next.
      int stage = (i * k_steps) % kStages, last_stage = stage;
      uint32_t phase = uint32_t((i * k_steps) / kStages) & 1u;
      for (int k = 0; k < k_steps; ++k) {
        tma::barrier_wait(full + stage, phase);
        wgmma::fence();
        const uint32_t hidden = ring_address + stage * S::kStageBytes;
        const uint32_t w = hidden + S::kHiddenBytes;
#pragma unroll
        for (int kk = 0; kk < kColumns / 16; ++kk)
#pragma unroll
          for (int b = 0; b < S::kBlocks; ++b)
            mma_step<S, kBf16 && !kF16Products>(acc[b], wgmma::k_major_sw128(hidden + b * 64 * kRowBytes + kk * 32),
                                                wgmma::k_major_sw128(w + kk * 32), k > 0 || kk > 0);
        wgmma::commit();
        wgmma::wait<1>();  // the step before this one is done with its stage
        if (k > 0) release(last_stage);
        last_stage = stage;
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1u;
        }
      }
      if (lane == 0) tma::barrier_arrive(multiplied);  // the other group may start the next tile
      wgmma::wait_all();
#pragma unroll
      for (int b = 0; b < S::kBlocks; ++b) settle(acc[b]);
      release(last_stage);

      // The fold, while the other group multiplies the next tile.
      const int32_t tile_first = (first_tile + i) * S::kTokens;  // index into W
      const int count = p.vocab - (tile_first + 2 * t);
      const int32_t first = p.token_base + tile_first + 2 * t;
      const int32_t global_first = p.token_base + tile_first;
      const bool whole = tile_first + S::kTokens <= p.vocab;
      if constexpr (kCodes) {  // each token's row scale on its finished logits
#pragma unroll
        for (int j = 0; j < S::kPairs; ++j)
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            const int32_t token = tile_first + 2 * t + 8 * j + q;
            const float scale = token < p.vocab ? __ldg(p.w_scale + token) : 0.0f;
#pragma unroll
            for (int b = 0; b < S::kBlocks; ++b)
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                float& logit = acc[b][4 * j + 2 * h + q];
                logit = (kF16Products ? logit * row_factor[b][h] : logit) * scale;
              }
          }
      }
#pragma unroll
      for (int b = 0; b < S::kBlocks; ++b)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const RowPlan& plan = plans[local_row(b, h)];
          const auto l = [&](int x) { return acc[b][4 * (x / 2) + 2 * h + (x % 2)]; };
          const bool plain = whole && uint32_t(plan.tracked - global_first) >= uint32_t(S::kTokens) &&
                             uint32_t(plan.excluded - global_first) >= uint32_t(S::kTokens);
          Partial part = parts.load(2 * b + h);
          if (plain) fold_row<true, S::kPairs>(part, plan, l, first, count);
          else fold_row<false, S::kPairs>(part, plan, l, first, count);
          parts.store(2 * b + h, part);
        }
    }
  };
  if (kCodes && f16_products)
    consume_tiles(std::bool_constant<kCodes>{});
  else
    consume_tiles(std::false_type{});

  // The four lanes of each row merge; the first writes the group's partial
  // (group 2·blockIdx.y + group: the combine merges a row's in any order).
#pragma unroll
  for (int b = 0; b < S::kBlocks; ++b)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      Partial merged = parts.load(2 * b + h);
      merge_with_lane(merged, 1, lane);
      merge_with_lane(merged, 2, lane);
      const int row = row0 + local_row(b, h);
      if (t == 0 && row < p.rows)
        p.partials[int64_t(kGroups * blockIdx.y + group) * p.partial_stride + p.row_base + row] = merged;
    }
  // Paired: neither CTA leaves while the other may still arrive on its
  // barriers (its last releases).
  if constexpr (kPaired) tma::cluster_sync();
}

template <class S, bool kPaired>
const void* kernel_of(flashspec_dtype w_dtype) {
  if (w_dtype == FLASHSPEC_DTYPE_BF16)
    return reinterpret_cast<const void*>(&tile_scan_kernel<S, FLASHSPEC_DTYPE_BF16, kPaired>);
  if (w_dtype == FLASHSPEC_DTYPE_F16)
    return reinterpret_cast<const void*>(&tile_scan_kernel<S, FLASHSPEC_DTYPE_F16, kPaired>);
  return nullptr;
}
template <class S>
const void* code_kernel_of(flashspec_dtype w_dtype) {
  if (w_dtype == FLASHSPEC_DTYPE_E4M3)
    return reinterpret_cast<const void*>(&tile_scan_kernel<S, FLASHSPEC_DTYPE_E4M3, false>);
  if (w_dtype == FLASHSPEC_DTYPE_I8) return reinterpret_cast<const void*>(&tile_scan_kernel<S, FLASHSPEC_DTYPE_I8, false>);
  return nullptr;
}

// A form's shape as numbers, for the host.
struct FormShape {
  int rows, tokens;
  size_t smem_bytes;
};
template <class S>
constexpr FormShape form_shape_of() {
  return FormShape{S::kRows, S::kTokens, S::kSmemBytes};
}
FormShape shape_of(Form form, bool codes = false) {
  switch (form) {
    case Form::kTile64x128: return codes ? form_shape_of<CodeShape64x128>() : form_shape_of<Shape64x128>();
    case Form::kTile64x256:
    case Form::kTile64x256Paired: return form_shape_of<Shape64x256>();
    default: return codes ? form_shape_of<CodeShape128x128>() : form_shape_of<Shape128x128>();
  }
}

int row_tiles(Form form, int32_t rows) {
  const int tile_rows = shape_of(form).rows;
  return (rows + tile_rows - 1) / tile_rows;
}

// The most token tiles a CTA of the form takes.
int cta_tiles_at_most(Form form, int32_t rows, int32_t vocab, int sm_count, int max_groups, int max_pairs) {
  const int tokens = shape_of(form).tokens;
  const int tiles = (vocab + tokens - 1) / tokens;
  const int ctas = groups_for(form, rows, vocab, sm_count, max_groups, max_pairs) / kGroups;
  return (tiles + ctas - 1) / ctas;
}

// Whether `form`, of 256-token tiles, gives every consumer group of a CTA a
// tile and its largest CTA no more of the products (rows by tokens) than
// `other`'s.
bool long_tiles_serve(Form form, Form other, int32_t rows, int32_t vocab, int sm_count, int max_groups,
                      int max_pairs) {
  const int tiles = cta_tiles_at_most(form, rows, vocab, sm_count, max_groups, max_pairs);
  const int other_tiles = cta_tiles_at_most(other, rows, vocab, sm_count, max_groups, max_pairs);
  const FormShape shape = shape_of(form), other_shape = shape_of(other);
  return tiles >= kGroups && int64_t(tiles) * shape.tokens * shape.rows <=
                                 int64_t(other_tiles) * other_shape.tokens * other_shape.rows;
}

}  // namespace

bool paired(Form form) { return form == Form::kTile64x256Paired || form == Form::kTile128x128Paired; }

Form form_for(flashspec_dtype w_dtype, int32_t rows, int32_t vocab, int sm_count, int max_groups, int max_pairs) {
  if (is_codes(w_dtype)) return rows <= Shape64x128::kRows ? Form::kTile64x128 : Form::kTile128x128;
  const auto serve = [&](Form form, Form other) {
    return long_tiles_serve(form, other, rows, vocab, sm_count, max_groups, max_pairs);
  };
  if (rows <= Shape64x256::kRows)
    return serve(Form::kTile64x256, Form::kTile64x128) ? Form::kTile64x256 : Form::kTile64x128;
  if (max_pairs > 0 && rows <= 2 * Shape64x256::kRows && serve(Form::kTile64x256Paired, Form::kTile128x128))
    return Form::kTile64x256Paired;
  return max_pairs > 0 && row_tiles(Form::kTile128x128, rows) % 2 == 0 ? Form::kTile128x128Paired
                                                                       : Form::kTile128x128;
}

const void* kernel_for(flashspec_dtype w_dtype, Form form) {
  if (is_codes(w_dtype)) {
    if (form == Form::kTile64x128) return code_kernel_of<CodeShape64x128>(w_dtype);
    if (form == Form::kTile128x128) return code_kernel_of<CodeShape128x128>(w_dtype);
    return nullptr;
  }
  switch (form) {
    case Form::kTile64x128: return kernel_of<Shape64x128, false>(w_dtype);
    case Form::kTile64x256: return kernel_of<Shape64x256, false>(w_dtype);
    case Form::kTile64x256Paired: return kernel_of<Shape64x256, true>(w_dtype);
    case Form::kTile128x128: return kernel_of<Shape128x128, false>(w_dtype);
    case Form::kTile128x128Paired: return kernel_of<Shape128x128, true>(w_dtype);
  }
  return nullptr;
}

size_t smem_bytes(flashspec_dtype w_dtype, Form form) { return shape_of(form, is_codes(w_dtype)).smem_bytes; }

int groups_for(Form form, int32_t rows, int32_t vocab, int sm_count, int max_groups, int max_pairs) {
  constexpr int kMinCtaTokens = 256;  // two 128-token tiles, one per consumer group, or one of 256
  const int tokens = shape_of(form).tokens;
  const int tiles = (vocab + tokens - 1) / tokens;
  const int tiles_per_cta = std::max(1, kMinCtaTokens / tokens);
  const int slots = paired(form) && max_pairs > 0 ? 2 * max_pairs : sm_count;  // CTAs that run at once
  const int ctas = std::max(
      1, std::min({max_groups / kGroups, (tiles + tiles_per_cta - 1) / tiles_per_cta, slots / row_tiles(form, rows)}));
  return kGroups * ctas;
}

int max_pairs(Form form) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(2, 1);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem_bytes(FLASHSPEC_DTYPE_BF16, form);
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = 2;
  cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel_for(FLASHSPEC_DTYPE_BF16, form), &config) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return clusters;
}

bool encode_maps(const ScanParams& p, Form form, TileMaps* maps) {
  const bool codes = is_codes(p.w_dtype);
  if (p.w_dtype != FLASHSPEC_DTYPE_BF16 && p.w_dtype != FLASHSPEC_DTYPE_F16 && !codes) return false;
  // 8-bit codes: one byte each, the hidden rows staged in bf16 (and,
  // where tile_hidden is, in f16).
  const flashspec_dtype hidden_dtype = codes ? FLASHSPEC_DTYPE_BF16 : p.w_dtype;
  const uint64_t pitch = uint64_t(p.ldw) * (codes ? 1 : 2), hidden_pitch = uint64_t(p.k_pad) * 2;
  if (p.d_load <= 0 || p.vocab <= 0 || pitch % 16 != 0 || hidden_pitch % 16 != 0 ||
      reinterpret_cast<uintptr_t>(p.w) % 16 != 0 || reinterpret_cast<uintptr_t>(p.h) % 16 != 0)
    return false;
  const FormShape shape = shape_of(form, codes);
  const int32_t last_rows = p.rows % shape.rows;
  const uint32_t w_box_tokens = uint32_t(paired(form) ? shape.tokens / 2 : shape.tokens);
  const bool w_map = codes ? scan::encode_code_map(&maps->w, p.w, uint64_t(p.d_load), uint64_t(p.vocab), pitch,
                                                   uint32_t(kColumns), w_box_tokens)
                           : scan::encode_row_map(&maps->w, p.w_dtype, p.w, uint64_t(p.d_load), uint64_t(p.vocab),
                                                  pitch, w_box_tokens);
  // The staged rows (`rows` of them at `h`, of `dtype`) in boxes of a tile
  // of rows and of the last tile's rows.
  const auto encode_hidden = [&](CUtensorMap* whole, CUtensorMap* last, flashspec_dtype dtype, const void* h) {
    const uint64_t rows = uint64_t(p.row_base + p.rows);
    return reinterpret_cast<uintptr_t>(h) % 16 == 0 &&
           scan::encode_row_map(whole, dtype, h, uint64_t(p.k_pad), rows, hidden_pitch, uint32_t(shape.rows)) &&
           scan::encode_row_map(last, dtype, h, uint64_t(p.k_pad), rows, hidden_pitch,
                                uint32_t(last_rows > 0 ? last_rows : shape.rows));
  };
  std::memset(&maps->hidden_f16, 0, sizeof(maps->hidden_f16));
  std::memset(&maps->hidden_last_f16, 0, sizeof(maps->hidden_last_f16));
  return w_map && encode_hidden(&maps->hidden, &maps->hidden_last, hidden_dtype, p.h) &&
         (!codes || !p.tile_hidden.f16 ||
          encode_hidden(&maps->hidden_f16, &maps->hidden_last_f16, FLASHSPEC_DTYPE_F16, p.tile_hidden.f16));
}

cudaError_t launch(const void* kernel, Form form, const ScanParams& params, const TileMaps& maps,
                   cudaStream_t stream) {
  ScanParams p = params;
  TileMaps m = maps;
  void* args[] = {&p, &m};
  const dim3 grid(unsigned(row_tiles(form, p.rows)), unsigned(p.groups / kGroups));
  const size_t smem = smem_bytes(p.w_dtype, form);
  if (!paired(form)) return launch_dependent(kernel, grid, dim3(kThreads), smem, stream, args);
  cudaLaunchAttribute attributes[2];
  attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[0].val.programmaticStreamSerializationAllowed = 1;
  attributes[1].id = cudaLaunchAttributeClusterDimension;
  attributes[1].val.clusterDim.x = 2;
  attributes[1].val.clusterDim.y = attributes[1].val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = 2;
  return cudaLaunchKernelExC(&config, kernel, args);
}

}  // namespace tile_scan
}  // namespace cuda
}  // namespace flashspec
