// The weight-streaming scan for few rows (≤ 16): the loop of
// stream_tiles.cuh, with the reduction in registers. Its epilogue folds each
// logit into the lane's running Partial of its rows (online log-sum-exp,
// Gumbel top-2, tracked logit); tokens reach a Partial in increasing order.
// Warps then merge across lanes and across the CTA in a fixed order, and the
// CTA writes one Partial per row: nothing vocabulary-sized leaves the chip.
#include <algorithm>
#include <type_traits>
#include <utility>

#include "launch.cuh"
#include "scan.h"
#include "scan_params.h"
#include "stream_tiles.cuh"
#include "tma.cuh"
#include "tuning.h"
#include "util/dtype.h"
#include "warp_fold.cuh"
#include "wgmma.cuh"

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

// After every thread of the CTA has written its rows' partials: the last CTA
// to finish (threadFenceReduction pattern) combines every CTA's partial, in
// CTA order, into the row outputs named by `tail` and resets the counter.
template <int kWarpsInCta>
__device__ __forceinline__ void combine_in_last_cta(const ScanParams& p, const StreamTail& tail,
                                                    const RowPlan* plans, int warp, int lane) {
  const int tid = threadIdx.x;
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (tid == 0) last = atomicAdd(tail.done_counter, 1) == int(gridDim.x) - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int row = warp; row < p.rows; row += kWarpsInCta) {
    const Partial all = warp_combine<4>(int(gridDim.x), lane, [&](int k) {
      return load_partial_l2(p.partials + int64_t(k) * p.partial_stride + p.row_base + row);
    });
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

// The end of a scan: lanes of one t hold the same rows (nt*8 + 2t + j) for
// different tokens, so they merge over g; the warps merge in order into the
// CTA's partial; then combine_in_last_cta.
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
  combine_in_last_cta<kWarpsInCta>(p, tail, plans, warp, lane);
}

// The plans of a lane's rows in the ≤ 16-row scans: row(nt, j) is that of
// row nt*8 + 2t + j as the fold reads it, keyed(nt, j) the same plan with
// its RNG key, for the noise. SharedLanePlans reads both from the CTA's
// copy in shared memory at each use. HeldLanePlans holds what the fold
// reads at every logit (1/T, flags, tracked and excluded tokens) in
// registers, so that a logit's chain does not begin with loads of its plan,
// and reads the keys, which the noise needs once per tile, where they lie
// (the 9–16-row TMA scan, whose fold keeps its partials in registers too).
struct SharedLanePlans {
  const RowPlan* plans;
  int t;  // the lane's t (lane & 3)
  __device__ __forceinline__ const RowPlan& row(int nt, int j) const { return plans[nt * 8 + 2 * t + j]; }
  __device__ __forceinline__ const RowPlan& keyed(int nt, int j) const { return row(nt, j); }
};
template <int kNT>
struct HeldLanePlans {
  SharedLanePlans shared;  // where the keys are read
  RowPlan fold[kNT][2];    // the fold's fields; the others an inert plan's
  __device__ __forceinline__ explicit HeldLanePlans(SharedLanePlans lane_plans) : shared(lane_plans) {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const RowPlan& plan = shared.row(nt, j);
        fold[nt][j] = inert_plan(FLASHSPEC_OK);
        fold[nt][j].inv_t = plan.inv_t;
        fold[nt][j].flags = plan.flags;
        fold[nt][j].tracked = plan.tracked;
        fold[nt][j].excluded = plan.excluded;
      }
  }
  __device__ __forceinline__ const RowPlan& row(int nt, int j) const { return fold[nt][j]; }
  __device__ __forceinline__ const RowPlan& keyed(int nt, int j) const { return shared.row(nt, j); }
};

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
template <class Plans>
__device__ __forceinline__ void tile_noise(const Plans& plans, int nt, int32_t tile_id0, int lane,
                                           uint32_t (&words)[4]) {
  const int g = lane >> 2, t = lane & 3;
  const RowPlan& own = plans.keyed(nt, g >> 2);
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

// The Gumbel noise of the lane's logits of a tile (tok_a: the lane's token g
// of the tile as an index into W): gumbel[nt][2j + k] that of token
// tok_a + 8k on row nt*8 + 2t + j, from tile_noise's words. A greedy row's
// entries are not read.
template <int kNT, class Plans>
__device__ __forceinline__ void tile_gumbels(const ScanParams& p, const Plans& plans, int tok_a,
                                             float (&gumbel)[kNT][4]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    uint32_t words[4];
    tile_noise(plans, nt, p.token_base + tok_a - (lane >> 2), lane, words);
#pragma unroll
    for (int i = 0; i < 4; ++i) gumbel[nt][i] = gumbel_from_bits(words[i]);
  }
}

// The epilogue of a 16-token tile: folds each of the lane's logits into its
// running Partial of the row (running(nt, j): row nt*8 + 2t + j) — online
// log-sum-exp, Gumbel top-2, tracked logit. logit(nt, q) is stream_tiles'
// (tok_a: the lane's token g of the tile as an index into W); tokens reach a
// Partial in increasing order. Where shared_noise is set, sampled rows take
// their noise from tile_noise: drawn here, or drawn ahead by tile_gumbels
// into `drawn` (NULL: none drawn). plans: SharedLanePlans or HeldLanePlans;
// kForm: how the candidates are offered (sampling/fold.h: OfferForm).
template <int kNT, OfferForm kForm, class Plans, class Logit, class Running>
__device__ __forceinline__ void fold_tile(const ScanParams& p, const Plans& plans, bool shared_noise, int tok_a,
                                          const float (*drawn)[4], Logit&& logit, Running&& running) {
  const int lane = threadIdx.x & 31, t = lane & 3;
  const int tok_b = tok_a + 8;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    uint32_t words[4] = {0, 0, 0, 0};
    if (shared_noise && !drawn) tile_noise(plans, nt, p.token_base + tok_a - (lane >> 2), lane, words);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int row = nt * 8 + 2 * t + j;
      if (row < p.rows) {
        const RowPlan& plan = plans.row(nt, j);
        const bool greedy = plan.flags & kPlanGreedy;
        Partial part = running(nt, j);
        const int32_t id_a = p.token_base + tok_a, id_b = p.token_base + tok_b;
        if (shared_noise && drawn) {
          if (tok_a < p.vocab) fold_logit_with_gumbel<kForm>(part, plan, logit(nt, j), id_a, drawn[nt][2 * j]);
          if (tok_b < p.vocab) fold_logit_with_gumbel<kForm>(part, plan, logit(nt, 2 + j), id_b, drawn[nt][2 * j + 1]);
        } else {
          const RngRowKey& key = plans.keyed(nt, j).key;
          const uint32_t noise_a = greedy ? 0u : shared_noise ? words[2 * j] : noise_word(key, id_a);
          const uint32_t noise_b = greedy ? 0u : shared_noise ? words[2 * j + 1] : noise_word(key, id_b);
          if (tok_a < p.vocab) fold_logit<kForm>(part, plan, logit(nt, j), id_a, noise_a);
          if (tok_b < p.vocab) fold_logit<kForm>(part, plan, logit(nt, 2 + j), id_b, noise_b);
        }
        running(nt, j) = part;
      }
    }
  }
}

// Whether a launch's sampled rows can take their noise from tile_noise:
// where the tiles' tokens start on Philox blocks (a shard may begin
// anywhere).
__device__ __forceinline__ bool tiles_share_noise(const ScanParams& p, const RowPlan* plans) {
  bool sampled = false;
  for (int row = 0; row < p.rows; ++row) sampled |= !(plans[row].flags & kPlanGreedy);
  return sampled && (p.token_base & 3) == 0;
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

  const stream::WarpRun run = stream::warp_run(p.vocab);
  stream::prefetch_run_start<kW>(p, run);
  pdl_wait();     // plans and staged hidden rows come from the kernels before
  pdl_trigger();  // what follows may launch now; it waits for this grid to finish

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid < kMaxRows) {
    plans[tid] = plan_or_placeholder(p.plans, p.row_base, p.rows, tid);
  }
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    running[warp][nt][0][lane] = empty_partial();
    running[warp][nt][1][lane] = empty_partial();
  }
  __syncthreads();

  const bool shared_noise = tiles_share_noise(p, plans);

  // Where the shape draws ahead, a tile's noise is drawn while the loads of
  // its last burst are in flight (stream_tiles' prepare), not after its
  // products.
  constexpr bool kDrawAhead = tuning::stream_shape(is_codes(kW), kShape).draw_ahead;
  float gumbel[kNT][4];
  stream::stream_tiles<kW, kShape>(
      p, run.first_tile, run.tiles,
      [&](int tok_a) {
        if (kDrawAhead && shared_noise) tile_gumbels<kNT>(p, SharedLanePlans{plans, lane & 3}, tok_a, gumbel);
      },
      [&](int tok_a, auto&& logit) {
        // Partials in shared memory: candidates by branches (OfferForm).
        fold_tile<kNT, OfferForm::kBranches>(p, SharedLanePlans{plans, lane & 3}, shared_noise, tok_a,
                                             kDrawAhead ? gumbel : nullptr, logit,
                                             [&](int nt, int j) -> Partial& { return running[warp][nt][j][lane]; });
      });

  Partial part[kNT][2];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int j = 0; j < 2; ++j) part[nt][j] = running[warp][nt][j][lane];
  finish_scan<kNT, kWarps>(p, tail, plans, part, merged, warp, lane);
}

// ---- W by the tensor-memory accelerator into warpgroup MMAs (sm_90a) -------
namespace box {
// The rows of a ring's hidden box for a launch of `rows` rows: its own,
// at most the ring's (the MMA's side), on the host (the map) and in the
// kernel (the bytes a stage expects).
__host__ __device__ constexpr int ring_box_rows(int ring_rows, int rows) { return rows < ring_rows ? rows : ring_rows; }
constexpr int kGroups = tuning::kStreamBoxGroups;        // consumer warpgroups, taking units in turn
constexpr int kStages = tuning::kStreamBoxStages;
constexpr int kTileTokens = 64;                           // a wgmma's 64-token side
constexpr int kStageTokens = tuning::kStreamBoxStageTokens;
constexpr int kUnitTiles = kStageTokens / kTileTokens;    // a stage's 64-token tiles, one group's
constexpr int kStageTiles = kStageTokens / 16;            // 16-token tiles (the vocabulary's split)
constexpr int kBoxColumns = 64;                           // 16-bit elements of a row per TMA box: 128 bytes
constexpr int kRowBytes = kBoxColumns * 2;
constexpr int kPanels = tuning::kStreamBoxPanels;         // W's boxes side by side along a row per stage
constexpr int kTileBytes = kTileTokens * kRowBytes;
constexpr int kPanelBytes = kStageTokens * kRowBytes;     // one panel of W's tokens
constexpr int kWBytes = kPanels * kPanelBytes;            // a stage's W; the hidden rows' panels follow
constexpr int kAlign = 1024;                              // the 128-byte swizzle's period
constexpr int kGroupWarps = 4;                            // a warpgroup
constexpr int kConsumerWarps = kGroups * kGroupWarps;
constexpr int kProducerWarp = kConsumerWarps;
constexpr int kThreads = (kConsumerWarps + 1) * 32;
static_assert(kPanelBytes % kAlign == 0 && kTileBytes % kAlign == 0, "every tile starts on the swizzle's period");
static_assert(kStageTokens % tuning::kStreamBoxMapTokens == 0, "a full stage is whole boxes of the bulk map");

// A CTA's ring of kStages stages, each W's panels of one step (kStageTokens
// tokens × kColumns columns) then kHiddenRows hidden rows' same columns, and
// what the producer lane puts there: step s is unit s / slices of the CTA's
// tiles [first_tile, first_tile + tiles), columns (s % slices) · kColumns.
// A stage's full barrier counts its bytes; its empty barrier the consumer
// warps that are done with it. kCodes: W is 8-bit codes, whose 128-byte
// panel holds twice the columns of a 16-bit one, and the hidden rows' (bf16)
// take two panels for each of W's.
template <int kStages_, int kHiddenRows_, bool kCodes = false>
struct Ring {
  static constexpr int kStages = kStages_;
  static constexpr int kHiddenRows = kHiddenRows_;  // the MMA's side
  static constexpr int kPanelColumns = kCodes ? kRowBytes : kBoxColumns;  // W's elements per panel row
  static constexpr int kColumns = kPanels * kPanelColumns;                // elements of each row a stage holds
  static constexpr int kHiddenPanels = kColumns / kBoxColumns;
  static constexpr int kHiddenPanelBytes = kHiddenRows * kRowBytes;
  static constexpr int kStageBytes = kWBytes + kHiddenPanels * kHiddenPanelBytes;
  static constexpr size_t kSmemBytes = size_t(kStages) * kStageBytes + kAlign;
  static_assert(kStageBytes % kAlign == 0 && kHiddenPanelBytes % kAlign == 0,
                "every tile starts on the swizzle's period");

  unsigned char* ring;
  uint64_t* full;
  const StreamMaps& maps;
  int first_tile, tiles, slices;
  bool f16_hidden;  // 8-bit codes: the hidden rows' f16 copy (maps.hidden_f16) rather than maps.hidden
  int hidden_rows;  // rows of a hidden box: ring_box_rows(kHiddenRows, the launch's rows)

  __device__ __forceinline__ static int stage_of(int s) { return s % kStages; }
  __device__ __forceinline__ unsigned char* stage(int s) const { return ring + size_t(stage_of(s)) * kStageBytes; }

  // Step s's W boxes (whole boxes of the bulk map, 16-token boxes for a
  // unit's ragged end), with the stage's whole byte count announced first.
  __device__ __forceinline__ void load_w(int s) const {
    const int unit = s / slices, column = (s - unit * slices) * kColumns;
    const int unit_tiles = min(kStageTiles, tiles - unit * kStageTiles);
    uint64_t* bar = full + stage_of(s);
    tma::barrier_expect(bar, uint32_t(kPanels * unit_tiles * 16 * kRowBytes + kHiddenPanels * hidden_rows * kRowBytes));
    const int token = (first_tile + unit * kStageTiles) * 16;
    const uint64_t once = tma::evict_first_policy();  // W is read once
    constexpr int kMapTiles = tuning::kStreamBoxMapTokens / 16;
    for (int panel = 0; panel < kPanels; ++panel) {
      unsigned char* dst = stage(s) + panel * kPanelBytes;
      const int x = column + panel * kPanelColumns;
      int tile = 0;
      for (; tile + kMapTiles <= unit_tiles; tile += kMapTiles)
        tma::load_box_2d(dst + tile * 16 * kRowBytes, &maps.w, bar, x, token + tile * 16, once);
      for (; tile < unit_tiles; ++tile)
        tma::load_box_2d(dst + tile * 16 * kRowBytes, &maps.w_tile, bar, x, token + tile * 16, once);
    }
  }

  // Every stage's hidden rows past the boxes' (the MMA's rows past the
  // launch's), zeroed once at the start by the CTA's threads: the boxes
  // bring only the launch's rows (tma::zero_panel_tails).
  __device__ __forceinline__ void zero_rows_past_boxes() const {
    if (hidden_rows >= kHiddenRows) return;
    tma::zero_panel_tails(kStages * kHiddenPanels, kHiddenPanelBytes, hidden_rows * kRowBytes, [&](int panel) {
      return stage(panel / kHiddenPanels) + kWBytes + (panel % kHiddenPanels) * kHiddenPanelBytes;
    });
  }

  // Step s's box of the hidden rows, separately: the first stages' go out
  // only once the staged rows exist.
  __device__ __forceinline__ void load_hidden(int s, int row_base) const {
    const uint64_t kept = tma::evict_last_policy();  // every CTA reads the hidden rows
    const int column = (s % slices) * kColumns;
    // Each map's address known to the compiler (a parameter's), not chosen
    // at run time.
    for (int panel = 0; panel < kHiddenPanels; ++panel) {
      unsigned char* dst = stage(s) + kWBytes + panel * kHiddenPanelBytes;
      if (f16_hidden)
        tma::load_box_2d(dst, &maps.hidden_f16, full + stage_of(s), column + panel * kBoxColumns, row_base, kept);
      else
        tma::load_box_2d(dst, &maps.hidden, full + stage_of(s), column + panel * kBoxColumns, row_base, kept);
    }
  }

  // The producer lane after the grid's wait: the hidden rows of the first
  // `early` steps (whose W went out before it), then every later step once
  // its stage's previous use (step s − kStages) has been consumed.
  __device__ __forceinline__ void produce(int early, int steps, uint64_t* empty, int row_base) const {
    for (int s = 0; s < early; ++s) load_hidden(s, row_base);
    for (int s = early; s < steps; ++s) {
      tma::barrier_wait(empty + stage_of(s), uint32_t(s / kStages - 1) & 1u);
      load_w(s);
      load_hidden(s, row_base);
    }
  }
};

// The 9–16-row scan's ring.
using NarrowRing = Ring<kStages, kMaxRows>;

// The 9–16-row scan's ring for 8-bit codes.
using CodeRing = Ring<kStages, kMaxRows, true>;

// The CTA's share of the vocabulary in a ring scan: tiles [c·T/C,
// (c+1)·T/C) of the T 16-token tiles (the split of stream::first_tile_of,
// by CTA), walked in units of kStageTokens tokens, each unit in `slices`
// steps of kColumns columns (step s: unit s / slices, columns
// (s % slices) · kColumns).
struct Walk {
  int first_tile, tiles, units, slices, steps;
};
template <class RingT>
__device__ __forceinline__ Walk walk_of(const ScanParams& p) {
  constexpr int kColumns = RingT::kColumns;
  Walk w;
  w.first_tile = stream::first_tile_of(blockIdx.x, gridDim.x, p.vocab);
  w.tiles = stream::first_tile_of(int64_t(blockIdx.x) + 1, gridDim.x, p.vocab) - w.first_tile;
  w.units = (w.tiles + kStageTiles - 1) / kStageTiles;
  w.slices = (p.d_load + kColumns - 1) / kColumns;
  w.steps = w.units * w.slices;
  return w;
}

// A ring's barriers. A stage's full barrier counts its bytes, its empty
// barrier the warps of the group that multiplied it. Phase u of unit_done
// completes when unit u's stages have all been multiplied: a group starts
// its next unit only then, so the groups take the ring's stages in step
// order and a stage's full barrier is never waited on more than one phase
// ahead (the other group's fold still runs beside the next unit).
template <int kRingStages>
struct Barriers {
  uint64_t full[kRingStages], empty[kRingStages];
  uint64_t unit_done;
  uint64_t handoff;  // the last unit's handed tiles are in the ring (consume_units)
  uint64_t codes_read;  // 8-bit codes: the last unit's owner has read every code its stash may overwrite
};

// What a ring scan's CTA does before its warps take their roles: the
// barriers set up, W's first stages requested by the producer lane before
// the grid waits for its predecessors (W depends on none of them), the
// wait, and the launch's first plan_rows plans in shared memory. The caller
// synchronises the CTA before reading them. kHandOff: the kernel's groups
// hand over part of the last unit (consume_units).
template <bool kHandOff, class RingT>
__device__ __forceinline__ void start_ring(const ScanParams& p, const RingT& ring, Barriers<RingT::kStages>& bars,
                                           int early, RowPlan* plans, int plan_rows) {
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int stage = 0; stage < RingT::kStages; ++stage) {
      tma::barrier_init(bars.full + stage, 1);
      tma::barrier_init(bars.empty + stage, kGroupWarps);
    }
    tma::barrier_init(&bars.unit_done, kGroupWarps);
    if (kHandOff) {
      tma::barrier_init(&bars.handoff, kGroupWarps * 32);
      tma::barrier_init(&bars.codes_read, kGroupWarps * 32);
    }
    tma::barrier_init_fence();
  }
  __syncthreads();
  if (tid == kProducerWarp * 32)
    for (int s = 0; s < early; ++s) ring.load_w(s);
  ring.zero_rows_past_boxes();  // the caller's barrier orders it before the hidden loads and the MMAs

  pdl_wait();     // plans and staged hidden rows come from the kernels before
  pdl_trigger();  // what follows may launch now; it waits for this grid to finish

  if (tid < plan_rows) plans[tid] = plan_or_placeholder(p.plans, p.row_base, p.rows, tid);
}

// How many of the CTA's last unit's 64-token tiles the group that does not
// own it folds: the last unit's fold follows the CTA's last loads with
// nothing to hide behind, while the other group has folded its own last
// unit beside them and is idle, so the two split it (the owner keeps the
// larger half, its logits being in its registers already). None where the
// CTA has one unit (no other group has work).
__device__ __forceinline__ int handed_tiles(const Walk& walk) {
  if (walk.units < 2) return 0;
  constexpr int kTileTiles = kTileTokens / 16;
  const int last_tiles = walk.tiles - (walk.units - 1) * kStageTiles;  // 16-token tiles, 1..kStageTiles
  return (last_tiles + kTileTiles - 1) / kTileTiles / 2;
}

// A consumer warpgroup's part of a ring scan: the groups take whole units in
// turn (group u mod kGroups takes unit u), so that one folds a unit's
// logits while the other multiplies the next. For each stage of its units,
// multiply(stage, accumulate, f16) issues the stage's MMAs (stage: its
// shared-memory address; accumulate: false on a unit's first stage; f16:
// std::true_type where the launch's `f16` holds, the 8-bit-code ring's
// products in f16, else std::false_type); after a
// unit's last stage, fold(unit, begin, end, false) folds its 64-token tiles
// [begin, end) from the accumulators (tile i in the i-th). With kHandOff,
// the owner of the CTA's last unit first hands its first
// handed_tiles(walk) tiles to the other group: stash(count) puts the first
// `count` tiles of its accumulators in the ring (every stage is free once
// the last one has been multiplied), and the other group, after its own
// units, folds them from there: fold(last, 0, count, true).
template <bool kHandOff, class RingT, class Multiply, class Fold, class Stash>
__device__ __forceinline__ void consume_units(const Walk& walk, Barriers<RingT::kStages>& bars, uint32_t ring_address,
                                              int group, Multiply&& multiply, Fold&& fold, Stash&& stash,
                                              bool f16 = false) {
  const int lane = threadIdx.x & 31;
  const int last = walk.units - 1, handed = kHandOff ? handed_tiles(walk) : 0;
  // One call of fold, whose code is long, and one path through the MMAs'
  // waits (ptxas serialises every stage's MMAs otherwise): the group that
  // does not own the last unit passes it and goes on to "unit" walk.units,
  // with no stages, its share of the last unit folded from the ring.
#pragma unroll 1
  for (int unit = group; unit <= last + (handed > 0 ? 1 : 0); unit += kGroups) {
    const bool handed_in = unit > last;
    if (handed_in)
      tma::barrier_wait(&bars.handoff, 0);
    else if (unit > 0)
      tma::barrier_wait(&bars.unit_done, uint32_t(unit - 1) & 1u);
    // One stage's MMAs stay in flight while the group waits for the next
    // stage and issues its MMAs; a stage is released once its group has
    // finished (H200: 9–16-row greedy drafts 0.6–2.5 % faster than waiting
    // on each stage's group before the next, the verify level).
    int in_flight = -1;
    const int slices = handed_in ? 0 : walk.slices;
    auto multiply_slices = [&](auto f16_tag) {
#pragma unroll 1
      for (int slice = 0; slice < slices; ++slice) {
        const int s = unit * walk.slices + slice, stage = RingT::stage_of(s);
        tma::barrier_wait(bars.full + stage, uint32_t(s / RingT::kStages) & 1u);
        wgmma::fence();
        multiply(ring_address + uint32_t(stage * RingT::kStageBytes), slice > 0, f16_tag);
        wgmma::commit();
        wgmma::wait<1>();
        __syncwarp();
        if (lane == 0 && in_flight >= 0) tma::barrier_arrive(bars.empty + in_flight);
        in_flight = stage;
      }
    };
    // A branch around the whole loop: one around each stage's MMAs has ptxas
    // serialise them (C7520, "WG.AR in divergent path").
    if (f16)
      multiply_slices(std::true_type{});
    else
      multiply_slices(std::false_type{});
    wgmma::wait_all();
    __syncwarp();
    if (lane == 0 && in_flight >= 0) tma::barrier_arrive(bars.empty + in_flight);
    if (lane == 0 && !handed_in) tma::barrier_arrive(&bars.unit_done);
    int begin = 0;
    if (unit == last && handed > 0) {
      stash(handed);
      tma::barrier_arrive(&bars.handoff);  // every thread, after its own stores
      begin = handed;
    }
    fold(handed_in ? last : unit, begin, handed_in ? handed : kUnitTiles, handed_in);
  }
}

// Where a ring scan's last unit's handed tiles wait: float q of a thread's
// tile i at [(i · kFloats + q) · 128 + its thread in the group], so that a
// warp's stores and loads are consecutive words; the other group's thread
// of the same warp and lane folds them.
template <int kFloats>
struct Handoff {
  float* slots;
  int thread;  // in the warpgroup
  __device__ __forceinline__ float& at(int i, int q) const {
    return slots[(i * kFloats + q) * kGroupWarps * 32 + thread];
  }
  template <int kTiles>
  __device__ __forceinline__ void stash(const float (&acc)[kTiles][kFloats], int count) const {
#pragma unroll
    for (int i = 0; i < kTiles; ++i)
      if (i < count)
#pragma unroll
        for (int q = 0; q < kFloats; ++q) at(i, q) = acc[i][q];
  }
};

// A stage's MMAs, the loop nest both ring scans share: for each panel, each
// k16 step of its 64 columns and each of the unit's 64-token tiles i,
// mma(i, w, hidden, accumulate) with the shared-memory addresses of tile
// i's W and of the hidden rows at that step (accumulate: false only for the
// unit's first product). The kernels differ in which is the MMA's A.
template <class RingT, class Mma>
__device__ __forceinline__ void multiply_stage(uint32_t stage, bool accumulate, Mma&& mma) {
  const uint32_t hidden = stage + uint32_t(kWBytes);
#pragma unroll
  for (int panel = 0; panel < kPanels; ++panel)
#pragma unroll
    for (int k = 0; k < kBoxColumns / 16; ++k)
#pragma unroll
      for (int i = 0; i < kUnitTiles; ++i)
        mma(i, stage + panel * kPanelBytes + i * kTileBytes + k * 32,
            hidden + panel * RingT::kHiddenPanelBytes + k * 32, accumulate || panel > 0 || k > 0);
}

// A stage's MMAs for 8-bit codes (CodeRing), W the MMA's A from registers,
// in the k order of ring_code_column (codes.cuh), in which the stage's
// hidden rows were staged (bf16; with kF16 the rows' f16 copy of
// RingHidden, the codes then converted to f16): each thread reads the
// 16-byte unit 2t + j of its tokens' 128-code lines (tokens 16·group_warp +
// g and + 8 of each of the unit's 64-token tiles, in the TMA's 128-byte
// swizzle: 16-byte unit u of row r at u ^ (r mod 8), the tiles 1024-byte
// aligned) for the k16 steps 4j … 4j + 3, converts word s of it to the
// pairs of step 4j + s (codes_to_bf16x2 or codes_to_f16x2, exact) and
// multiplies them by the hidden rows' panel in the stage (at
// stage_address, a shared-memory address). A tile's second
// units are read as its first ones' last words convert. The unit's tiles
// go in two halves, each its own MMA group: a half waits only for its own
// MMAs of the step before (which read the fragments it overwrites), so its
// conversion runs while the other half's MMAs do (H200: int8 verify 1–6 %,
// e4m3 0–3 % faster than one group per step; four groups of one tile
// measured the same as two); a stage's first step waits for none,
// consume_units having waited for the stage before.
constexpr int kCodeMmaGroups = 2;
template <flashspec_dtype kW, class RingT, bool kF16>
__device__ __forceinline__ void multiply_code_stage(uint32_t stage_address, bool accumulate, int group_warp,
                                                    float (&acc)[kUnitTiles][8]) {
  static_assert(RingT::kColumns == kRingCodeBlock, "a stage is one block of ring_code_column's order");
  auto convert = [](uint32_t word, uint32_t& lo, uint32_t& hi) {
    if constexpr (kF16)
      codes_to_f16x2<kW>(word, lo, hi);
    else
      codes_to_bf16x2<kW>(word, lo, hi);
  };
  constexpr int kStepsPerUnit = 4;  // k16 steps per 16-byte unit of a token's codes
  constexpr int kSteps = RingT::kColumns / 16;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const uint32_t row_g = stage_address + uint32_t((16 * group_warp + g) * kRowBytes);
  const uint32_t hidden = stage_address + uint32_t(kWBytes);
  // units[i][0]: token g's unit of tile i, units[i][1]: token g + 8's, by
  // shared-memory loads (a generic pointer's loads take longer to return).
  auto read_units = [&](int j, int i, uint4 (&units)[2]) {
    const uint32_t at = row_g + uint32_t((((2 * t + j) ^ g) << 4) + i * kTileBytes);
    units[0] = tma::load_shared_16(at);
    units[1] = tma::load_shared_16(at + 8 * kRowBytes);
  };
  auto word = [](const uint4& u, int s) { return s == 0 ? u.x : s == 1 ? u.y : s == 2 ? u.z : u.w; };
  uint4 units[kSteps / kStepsPerUnit][kUnitTiles][2];
#pragma unroll
  for (int i = 0; i < kUnitTiles; ++i) read_units(0, i, units[0][i]);
  constexpr int kGroupTiles = kUnitTiles / kCodeMmaGroups;
  uint32_t fragments[kUnitTiles][4];
#pragma unroll
  for (int step = 0; step < kSteps; ++step) {
    const int j = step / kStepsPerUnit, s = step % kStepsPerUnit;
    const uint64_t b =
        wgmma::k_major_sw128(hidden + uint32_t((step / 4) * RingT::kHiddenPanelBytes + (step % 4) * 32));
#pragma unroll
    for (int mma_group = 0; mma_group < kCodeMmaGroups; ++mma_group) {
      if (step >= 1) wgmma::wait<kCodeMmaGroups - 1>();
#pragma unroll
      for (int i = mma_group * kGroupTiles; i < (mma_group + 1) * kGroupTiles; ++i) {
        // Registers 0 and 2 of the fragment: token g's columns 2t, 2t + 1
        // and 2t + 8, 2t + 9; 1 and 3 the same of token g + 8.
        convert(word(units[j][i][0], s), fragments[i][0], fragments[i][2]);
        convert(word(units[j][i][1], s), fragments[i][1], fragments[i][3]);
        // A tile's next units, into the registers its last words leave.
        if (s == kStepsPerUnit - 1 && j + 1 < kSteps / kStepsPerUnit) read_units(j + 1, i, units[j + 1][i]);
      }
      wgmma::fence();
#pragma unroll
      for (int i = mma_group * kGroupTiles; i < (mma_group + 1) * kGroupTiles; ++i)
        wgmma::mma_k16_n16_registers<!kF16>(acc[i], fragments[i], b, accumulate || step > 0);
      wgmma::commit();
    }
  }
}
}  // namespace box

// The weight-streaming scan on sm_90a. Each CTA walks its token range
// (box::Walk) in units of box::kStageTokens tokens, each unit in stages of
// 64 columns: the producer warp's lane 0 loads a stage's tokens (whole
// boxes of the bulk map, 16-token boxes for a unit's ragged end) and the
// hidden rows' same columns, and the stage's full barrier counts their
// bytes. The two consumer warpgroups take whole units in turn
// (box::consume_units): a group multiplies each of its unit's 64-token tiles
// by the hidden rows (four k16 wgmma per tile and stage), its warps arrive
// on the stage's empty barrier, and after the unit's last stage each warp
// folds its 16-token tiles' logits with fold_tile, exactly as the register
// path does, while the other group multiplies the next unit. kHandOff: the
// two groups share the CTA's last unit's fold (box::consume_units), the
// instance for launches that may have a sampled row (tuning::
// stream_box_hands_off). 8-bit codes: a stage holds 128 codes of each token,
// which the multiplying group converts to bf16 or f16 as the MMA's A in the k
// order of ring_code_column, the hidden rows' copy in that order its B
// (box::multiply_code_stage); the row scales multiply the finished logits.
template <flashspec_dtype kW, int kShape, bool kHandOff>
__global__ void __launch_bounds__(box::kThreads, 1)
    stream_box_kernel(const ScanParams p, const StreamTail tail, const __grid_constant__ StreamMaps maps) {
  constexpr int kNT = tuning::stream_shape(false, kShape).row_groups;
  constexpr int kN = kNT * 8;  // the wgmma's N: hidden rows per launch, padded to 8
  static_assert(kN == kMaxRows, "the ring's hidden panels are kMaxRows rows, the hidden map's box");
  constexpr bool kCodes = is_codes(kW);
  using Ring = std::conditional_t<kCodes, box::CodeRing, box::NarrowRing>;
  constexpr bool kBf16 = kW == FLASHSPEC_DTYPE_BF16;
  __shared__ RowPlan plans[kMaxRows];
  __shared__ Partial merged[box::kConsumerWarps + 1][kMaxRows];
  __shared__ __align__(8) box::Barriers<Ring::kStages> bars;
  extern __shared__ unsigned char dynamic_smem[];
  unsigned char* const ring = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(dynamic_smem) + box::kAlign - 1) & ~uintptr_t(box::kAlign - 1));

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const box::Walk walk = box::walk_of<Ring>(p);
  const int early = walk.steps < Ring::kStages ? walk.steps : Ring::kStages;
  Ring ring_of{ring, bars.full, maps, walk.first_tile, walk.tiles, walk.slices, false,
                    box::ring_box_rows(Ring::kHiddenRows, p.rows)};
  box::start_ring<kHandOff>(p, ring_of, bars, early, plans, kMaxRows);
  // 8-bit codes: the products in f16 where every row's f16 copy is exact
  // (RingHidden's factors, which the staging wrote before the grid's wait).
  bool f16_products = false;
  if constexpr (kCodes) {
    f16_products = __syncthreads_and(tid >= p.rows || __ldg(p.ring_hidden.factors + p.row_base + tid) > 0.0f);
    ring_of.f16_hidden = f16_products;
  } else {
    __syncthreads();
  }

  Partial held[kNT][2];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) held[nt][0] = held[nt][1] = empty_partial();

  if (warp == box::kProducerWarp) {
    if (lane == 0) ring_of.produce(early, walk.steps, bars.empty, p.row_base);
  } else {
    const bool shared_noise = tiles_share_noise(p, plans);
    const int group = warp / box::kGroupWarps, group_warp = warp % box::kGroupWarps;
    // The lane's rows' plans in registers, as its partials are.
    const HeldLanePlans<kNT> lane_plans(SharedLanePlans{plans, lane & 3});
    float acc[box::kUnitTiles][kN / 2];
    // The factor 2^-k of each of the lane's rows (nt·8 + 2t + j) where the
    // products are in f16, which takes the f16 copy's scaling off a logit.
    float row_factor[kNT][2];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int row = nt * 8 + 2 * (lane & 3) + j;
        row_factor[nt][j] = f16_products && row < p.rows ? __ldg(p.ring_hidden.factors + p.row_base + row) : 1.0f;
      }
    const box::Handoff<kN / 2> handoff{reinterpret_cast<float*>(ring), group_warp * 32 + lane};
    const uint32_t ring_address = tma::smem_address(ring);
    box::consume_units<kHandOff, Ring>(
        walk, bars, ring_address, group,
        [&](uint32_t stage, bool accumulate, auto f16_tag) {
          constexpr bool kF16 = kCodes && decltype(f16_tag)::value;
          if constexpr (kCodes)
            box::multiply_code_stage<kW, Ring, kF16>(stage, accumulate, group_warp, acc);
          else
            box::multiply_stage<Ring>(stage, accumulate, [&](int i, uint32_t w, uint32_t hidden, bool scale_d) {
              wgmma::mma_k16<kN, kBf16>(acc[i], wgmma::k_major_sw128(w), wgmma::k_major_sw128(hidden), scale_d);
            });
        },
        [&](int unit, int begin, int end, bool handed_in) {
          // Warp group_warp holds tokens 16·group_warp + g (+ 8) of each
          // 64-token tile. The loop runs rather than unrolls (one copy of
          // fold_tile), taking each tile's logits from acc[0] and moving the
          // next tile's there; tiles handed over are read where they lie in
          // the ring, by the thread of the owner's warp and lane.
          const bool from_ring = kHandOff && handed_in;
#pragma unroll 1
          for (int i = 0; i < end; ++i) {
            const int tile = unit * box::kStageTiles + i * box::kGroupWarps + group_warp;
            if (i >= begin && tile < walk.tiles) {
              const int tok_a = (walk.first_tile + tile) * 16 + (lane >> 2), tok_b = tok_a + 8;
              // 8-bit codes: the row's scale multiplies the finished logit
              // (after the hidden row's factor, exact: a power of two).
              float scale_a = 1.0f, scale_b = 1.0f;
              if constexpr (kCodes) {
                if (tok_a < p.vocab) scale_a = __ldg(p.w_scale + tok_a);
                if (tok_b < p.vocab) scale_b = __ldg(p.w_scale + tok_b);
              }
              fold_tile<kNT, OfferForm::kSelects>(
                  p, lane_plans, shared_noise, tok_a, nullptr,
                  [&](int nt, int q) {
                    const float v = from_ring ? handoff.at(i, 4 * nt + q) : acc[0][4 * nt + q];
                    return kCodes ? v * row_factor[nt][q & 1] * (q < 2 ? scale_a : scale_b) : v;
                  },
                  [&](int nt, int j) -> Partial& { return held[nt][j]; });
            }
            if (!from_ring)
#pragma unroll
              for (int next = 0; next + 1 < box::kUnitTiles; ++next)
#pragma unroll
                for (int q = 0; q < kN / 2; ++q) acc[next][q] = acc[next + 1][q];
          }
        },
        [&](int count) {
          if constexpr (kHandOff) {
            // The stash lands on stages the group's warps read codes from
            // with ordinary loads, which a warp behind the others may not
            // have finished (compute-sanitizer's racecheck found the race
            // without this wait); 16-bit W is read by the MMAs alone, which
            // the group issues together and has waited for.
            if constexpr (kCodes) {
              tma::barrier_arrive(&bars.codes_read);
              tma::barrier_wait(&bars.codes_read, 0);
            }
            handoff.stash(acc, count);
          }
        },
        f16_products);
  }
  finish_scan<kNT, box::kConsumerWarps + 1>(p, tail, plans, held, merged, warp, lane);
}

// ---- 17–64 rows: the hidden rows as the warpgroup MMA's M (sm_90a) ---------
namespace wide {
constexpr int kRows = tuning::kStreamWideMaxRows;  // the wgmma's M
using WideRing = box::Ring<tuning::kStreamWideStages, kRows>;
// The consumer warpgroups, then a whole producer warpgroup: registers are
// moved between warpgroups (a consumer holds a unit's 128 accumulators), so
// the block is whole warpgroups. 168 registers each at launch; the producer
// warpgroup gives up all but kProducerRegisters and the consumers take
// kConsumerRegisters, and both return to kLaunchRegisters for the end.
constexpr int kThreads = (box::kConsumerWarps + 4) * 32;
constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
constexpr int kProducerRegisters = 40;
constexpr int kConsumerRegisters = (65536 - 128 * kProducerRegisters) / (box::kConsumerWarps * 32) / 8 * 8;
static_assert(kLaunchRegisters == 168 && kConsumerRegisters == 232, "the register split of a 384-thread CTA");
static_assert(kRows == 64, "a launch's rows are one wgmma M");
static_assert(box::kTileTokens == 64, "a consumer's 64-token tile is one N = 64 wgmma");
}  // namespace wide

// The Philox words of a thread's logits at 17–64 rows: words[h][e] that of
// token id + e (id, a multiple of 2, the thread's first token of an 8-token
// column group) on its row h (row0 + 8h). The lanes t and t ^ 1 of a g hold
// the same two rows and tokens id, id + 1 and id + 2, id + 3 of one Philox
// block (the launch's tokens start on a block): each computes the block of
// one row, keeps the two words it needs and hands its partner the other two.
// pair_key: the key of that row, row0 + 8 (lane & 1); NULL where the row
// is greedy, whose block is not computed (its words are never read).
__device__ __forceinline__ void pair_noise(const RngRowKey* pair_key, int32_t id, int lane, uint32_t (&words)[2][2]) {
  const int own = lane & 1;  // the row whose block this lane computes; its tokens are words 2·own, 2·own + 1
  Philox4 block = {{0, 0, 0, 0}};
  if (pair_key) block = row_block(*pair_key, uint32_t(id) >> 2);
  const uint32_t keep0 = own ? block.v[2] : block.v[0], keep1 = own ? block.v[3] : block.v[1];
  const uint32_t got0 = __shfl_xor_sync(0xffffffffu, own ? block.v[0] : block.v[2], 1);
  const uint32_t got1 = __shfl_xor_sync(0xffffffffu, own ? block.v[1] : block.v[3], 1);
  words[0][0] = own ? got0 : keep0;
  words[0][1] = own ? got1 : keep1;
  words[1][0] = own ? keep0 : got0;
  words[1][1] = own ? keep1 : got1;
}

// The weight-streaming scan for 17–64 rows on sm_90a: stream_box_kernel's
// CTAs, ring, producer and units in turn, with the roles in the MMA
// swapped. A stage's 64 hidden rows (zeros past the launch's) are the
// wgmma's A and each of its four 64-token tiles a B, N = 64, so warp w of a
// consumer warpgroup holds rows 16w + g and 16w + g + 8 of tokens 8j + 2t
// and + 1 of each tile (wgmma.cuh). Each thread folds its 64 tokens of a
// unit into its two rows' running partials in increasing token order; at
// the end the four lanes of a g merge, then the groups.
template <flashspec_dtype kW>
__global__ void __launch_bounds__(wide::kThreads, 1)
    stream_wide_kernel(const ScanParams p, const StreamTail tail, const __grid_constant__ StreamMaps maps) {
  using Ring = wide::WideRing;
  constexpr bool kBf16 = kW == FLASHSPEC_DTYPE_BF16;
  constexpr bool kHandOff = true;  // part of a CTA's last unit folded by the other group (consume_units)
  __shared__ RowPlan plans[wide::kRows];
  __shared__ Partial merged[box::kGroups][wide::kRows];
  __shared__ float noise_bounds[256];  // by an RNG word's top byte (sampling/gumbel_bounds.h)
  static_assert(wide::kThreads >= 256, "a thread per bound");
  __shared__ __align__(8) box::Barriers<Ring::kStages> bars;
  extern __shared__ unsigned char dynamic_smem[];
  unsigned char* const ring = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(dynamic_smem) + box::kAlign - 1) & ~uintptr_t(box::kAlign - 1));

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const box::Walk walk = box::walk_of<Ring>(p);
  const int early = walk.steps < Ring::kStages ? walk.steps : Ring::kStages;
  const Ring ring_of{ring, bars.full, maps, walk.first_tile, walk.tiles, walk.slices, false,
                    box::ring_box_rows(Ring::kHiddenRows, p.rows)};
  // Completes once every consumer warp has lowered its register budget at
  // the end: the producer warps ask for theirs back only then (below).
  __shared__ __align__(8) uint64_t registers_back;
  if (tid == 0) tma::barrier_init(&registers_back, box::kConsumerWarps);  // fenced in start_ring
  box::start_ring<kHandOff>(p, ring_of, bars, early, plans, wide::kRows);
  if (tid < 256) noise_bounds[tid] = p.gumbel_bounds ? p.gumbel_bounds[tid] : pos_inf();
  __syncthreads();

  const int group = warp / box::kGroupWarps, group_warp = warp % box::kGroupWarps;
  const int row0 = 16 * group_warp + g;  // the thread's rows: row0 and row0 + 8
  Partial held[2] = {empty_partial(), empty_partial()};
  if (warp >= box::kProducerWarp) {  // the producer warpgroup; its first lane loads
    wgmma::lower_registers<wide::kProducerRegisters>();
    if (warp == box::kProducerWarp && lane == 0) ring_of.produce(early, walk.steps, bars.empty, p.row_base);
    __syncwarp();  // the register budget moves for whole, converged warps
    // A request for registers spins until the CTA's pool can grant it, in
    // no order: asked for before the consumers have raised their budgets, a
    // producer warp could take back what they are waiting for, and every
    // warp would then wait for ever. The consumers give the registers back
    // only when they are done.
    tma::barrier_wait(&registers_back, 0);
    wgmma::raise_registers<wide::kLaunchRegisters>();
  } else {
    wgmma::raise_registers<wide::kConsumerRegisters>();
    const bool shared_noise = tiles_share_noise(p, plans);
    // The thread's two rows' plans in registers (read from shared memory,
    // each logit's chain began with those loads: H200, 262144 × 4096 × 64
    // verify 642 → 624 µs), and the plan of the row whose Philox blocks
    // this lane computes.
    const RowPlan own[2] = {plans[row0], plans[row0 + 8]};
    const RowPlan& pair_plan = plans[row0 + 8 * (lane & 1)];
    const bool pair_sampled = !(pair_plan.flags & kPlanGreedy);
    float acc[box::kUnitTiles][32];
    const box::Handoff<32> handoff{reinterpret_cast<float*>(ring), group_warp * 32 + lane};
    box::consume_units<kHandOff, Ring>(
        walk, bars, tma::smem_address(ring), group,
        [&](uint32_t stage, bool accumulate, auto) {
          box::multiply_stage<Ring>(stage, accumulate, [&](int i, uint32_t w, uint32_t hidden, bool scale_d) {
            wgmma::mma_k16_n64<kBf16>(acc[i], wgmma::k_major_sw128(hidden), wgmma::k_major_sw128(w), scale_d);
          });
        },
        [&](int unit, int begin, int end, bool handed_in) {
          // Column group j of tile i: tokens local, local + 1 of the CTA's
          // range (one 16-token tile), in acc[i][4j + 2h + e]. The loops run
          // rather than unroll, taking each group from the front of acc[0]
          // and moving the next one there (then the next tile's logits;
          // tiles handed over are read where they lie in the ring):
          // unrolled, the fold was a copy of fold_logit per logit and of the
          // Philox rounds per block (320 KB of code at two tiles per group),
          // more than the SM's instruction caches hold, and the scan read W
          // at half the GEMM's rate; rolled, the kernel is 68 KB.
#pragma unroll 1
          for (int i = 0; i < end; ++i) {
            const int tile_local = unit * box::kStageTokens + i * box::kTileTokens + 2 * t;
            // Each row's floor for the tile: the highest runner-up among the
            // four lanes that hold the row (may_reach_merged), so that fewer
            // tokens wait for a transform than against the lane's own
            // runner-up (H200: 262144 × 4096 × 64 verify 598 → 591 µs,
            // sampled draft 605 → 593; once per unit instead of per tile,
            // the verify was level).
            float floor[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const float second = held[h].second;
              const float pair = fmaxf(second, __shfl_xor_sync(0xffffffffu, second, 1));
              floor[h] = fmaxf(pair, __shfl_xor_sync(0xffffffffu, pair, 2));
            }
#pragma unroll 1
            for (int j = 0; j < 8 && i >= begin; ++j) {  // a tile before `begin` only moves on
              const int local = tile_local + 8 * j;
              const int tok = walk.first_tile * 16 + local;
              const int32_t id = p.token_base + tok;
              const bool in_range = local < walk.tiles * 16;
              float logits[4];
#pragma unroll
              for (int q = 0; q < 4; ++q) logits[q] = handed_in ? handoff.at(i, 4 * j + q) : acc[0][q];
              uint32_t words[2][2] = {{0, 0}, {0, 0}};
              if (shared_noise) pair_noise(pair_sampled ? &pair_plan.key : nullptr, id, lane, words);
              // Every logit's mass first; a greedy row's tokens are offered
              // at once, a sampled row's only where the bound of its noise
              // lets it reach the lane's runner-up before this group's
              // offers and the tile's floor (may_reach_merged), and those
              // after the rest, one per lane and round, so that the warp
              // runs the Gumbel transform as often as its busiest lane needs
              // it rather than once for each logit any lane needs it for
              // (H200: 262144 × 4096 × 64 verify 623 → 604 µs). Each row's
              // tokens are still offered in increasing order, so the merged
              // partials are fold_logit's, bit for bit.
              float scaled[4];
              unsigned pending = 0;  // bit 2h + e: logit 2h + e waits for its Gumbel transform
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                if (row0 + 8 * h >= p.rows) continue;
                const RowPlan& plan = own[h];
                const bool greedy = plan.flags & kPlanGreedy;
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                  if (!in_range || tok + e >= p.vocab) continue;
                  scaled[2 * h + e] = fold_logit_mass(held[h], plan, logits[2 * h + e], id + e);
                  if (greedy) {
                    offer_logit<OfferForm::kSelects>(held[h], plan, scaled[2 * h + e], id + e, 0.0f);
                    continue;
                  }
                  // A shard starting off a Philox block: each token's own word (the
                  // key read where it lies, not held in registers for this rare case).
                  if (!shared_noise) words[h][e] = noise_word(plans[row0 + 8 * h].key, id + e);
                  if (may_reach_merged(scaled[2 * h + e], noise_bounds[words[h][e] >> 24], held[h].second, floor[h]))
                    pending |= 1u << (2 * h + e);
                }
              }
              offer_pending(pending, [&](int k) {
                const uint32_t word = k == 0 ? words[0][0] : k == 1 ? words[0][1] : k == 2 ? words[1][0] : words[1][1];
                const float score = k == 0 ? scaled[0] : k == 1 ? scaled[1] : k == 2 ? scaled[2] : scaled[3];
                const float gumbel = gumbel_from_bits(word);
                if (k < 2)
                  offer_logit<OfferForm::kSelects>(held[0], own[0], score, id + k, gumbel);
                else
                  offer_logit<OfferForm::kSelects>(held[1], own[1], score, id + (k - 2), gumbel);
              });
              if (!handed_in)
#pragma unroll
                for (int q = 0; q + 4 < 32; ++q) acc[0][q] = acc[0][q + 4];
            }
            if (!handed_in)
#pragma unroll
              for (int next = 0; next + 1 < box::kUnitTiles; ++next)
#pragma unroll
                for (int q = 0; q < 32; ++q) acc[next][q] = acc[next + 1][q];
          }
        },
        [&](int count) { handoff.stash(acc, count); });
    // The four lanes of a g hold the same two rows.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      merge_with_lane(held[h], 1, lane);
      merge_with_lane(held[h], 2, lane);
      if (t == 0) merged[group][row0 + 8 * h] = held[h];
    }
    wgmma::lower_registers<wide::kLaunchRegisters>();
    if (lane == 0) tma::barrier_arrive(&registers_back);
  }
  __syncthreads();
  if (tid < p.rows) {
    Partial all = merged[0][tid];
    for (int other = 1; other < box::kGroups; ++other) merge_partial(all, merged[other][tid]);
    p.partials[int64_t(blockIdx.x) * p.partial_stride + p.row_base + tid] = all;
  }
  combine_in_last_cta<wide::kThreads / 32>(p, tail, plans, warp, lane);
}

template <flashspec_dtype kW>
const void* wide_kernel_address() {
  return reinterpret_cast<const void*>(&stream_wide_kernel<kW>);
}

struct StreamScan {
  template <flashspec_dtype kW, int kShape>
  static const void* of() {
    return reinterpret_cast<const void*>(&stream_scan_kernel<kW, kShape>);
  }
};

// The sm_90a kernel of a stream shape it serves, else NULL (not compiled).
template <flashspec_dtype kW, int kShape, bool kHandOff>
const void* box_kernel_address() {
  if constexpr (kShape >= tuning::kStreamBoxMinShape)
    return reinterpret_cast<const void*>(&stream_box_kernel<kW, kShape, kHandOff>);
  else
    return nullptr;
}
template <flashspec_dtype kW, size_t... kShapes>
const void* box_kernel_of(int shape, bool hand_off, std::index_sequence<kShapes...>) {
  static const void* const kernels[][2] = {
      {box_kernel_address<kW, int(kShapes), false>(), box_kernel_address<kW, int(kShapes), true>()}...};
  return kernels[shape][hand_off ? 1 : 0];
}

// cuTensorMapEncodeTiled from the driver the runtime uses (no link against
// libcuda): NULL where the driver lacks it.
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiled encode_tiled() {
  static const EncodeTiled encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return EncodeTiled(nullptr);
    }
    return reinterpret_cast<EncodeTiled>(fn);
  }();
  return encode;
}

// A 2-D map of rows of 16-bit elements or 8-bit codes (`columns` elements
// of which exist, `pitch` bytes apart), read in boxes of 128 bytes ×
// box_rows rows with the 128-byte swizzle the wgmma descriptors expect.
bool encode_rows(EncodeTiled encode, CUtensorMap* map, flashspec_dtype dtype, const void* base, uint64_t columns,
                 uint64_t rows, uint64_t pitch, uint32_t box_rows) {
  const cuuint64_t dims[2] = {columns, rows};
  const cuuint64_t strides[1] = {pitch};
  const cuuint32_t box[2] = {uint32_t(is_codes(dtype) ? box::kRowBytes : box::kBoxColumns), box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUtensorMapDataType type = is_codes(dtype)                ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                   : dtype == FLASHSPEC_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                                   : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return encode(map, type, 2, const_cast<void*>(base), dims, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace

bool encode_row_map(CUtensorMap* map, flashspec_dtype dtype, const void* base, uint64_t columns, uint64_t rows,
                    uint64_t pitch, uint32_t box_rows) {
  const EncodeTiled encode = encode_tiled();
  return encode && encode_rows(encode, map, dtype, base, columns, rows, pitch, box_rows);
}

bool encode_code_map(CUtensorMap* map, const void* base, uint64_t columns, uint64_t rows, uint64_t pitch,
                     uint32_t box_columns, uint32_t box_rows) {
  const EncodeTiled encode = encode_tiled();
  if (!encode) return false;
  const cuuint64_t dims[2] = {columns, rows};
  const cuuint64_t strides[1] = {pitch};
  const cuuint32_t box[2] = {box_columns, box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

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

const void* stream_box_kernel(int shape, flashspec_dtype w_dtype, bool hand_off) {
  const auto shapes = std::make_index_sequence<tuning::kStreamShapeCount>();
  switch (w_dtype) {
    case FLASHSPEC_DTYPE_BF16: return box_kernel_of<FLASHSPEC_DTYPE_BF16>(shape, hand_off, shapes);
    case FLASHSPEC_DTYPE_F16: return box_kernel_of<FLASHSPEC_DTYPE_F16>(shape, hand_off, shapes);
    case FLASHSPEC_DTYPE_E4M3: return box_kernel_of<FLASHSPEC_DTYPE_E4M3>(shape, hand_off, shapes);
    case FLASHSPEC_DTYPE_I8: return box_kernel_of<FLASHSPEC_DTYPE_I8>(shape, hand_off, shapes);
    default: return nullptr;
  }
}

size_t stream_box_smem(flashspec_dtype w_dtype) {
  return is_codes(w_dtype) ? box::CodeRing::kSmemBytes : box::NarrowRing::kSmemBytes;
}

const void* stream_wide_kernel(flashspec_dtype w_dtype) {
  if (w_dtype == FLASHSPEC_DTYPE_BF16) return wide_kernel_address<FLASHSPEC_DTYPE_BF16>();
  if (w_dtype == FLASHSPEC_DTYPE_F16) return wide_kernel_address<FLASHSPEC_DTYPE_F16>();
  return nullptr;
}

size_t stream_wide_smem() { return wide::WideRing::kSmemBytes; }

bool stream_box_maps(const ScanParams& p, StreamMaps* maps) {
  if (p.w_dtype != FLASHSPEC_DTYPE_BF16 && p.w_dtype != FLASHSPEC_DTYPE_F16 && !is_codes(p.w_dtype)) return false;
  // 8-bit codes meet the hidden rows' copies in the ring's k order
  // (RingHidden): bf16 and f16, with the f16 copy's factors.
  const bool codes = is_codes(p.w_dtype);
  const flashspec_dtype hidden_dtype = codes ? FLASHSPEC_DTYPE_BF16 : p.w_dtype;
  const void* hidden = codes ? p.ring_hidden.bf16 : p.h;
  const uint64_t hidden_columns = uint64_t(codes ? ring_code_columns(p.k_pad) : p.k_pad);
  const uint64_t pitch = uint64_t(p.ldw) * dtype_size(p.w_dtype), hidden_pitch = hidden_columns * 2;
  if (p.d_load <= 0 || p.vocab <= 0 || pitch % 16 != 0 || hidden_pitch % 16 != 0 || !hidden ||
      reinterpret_cast<uintptr_t>(p.w) % 16 != 0 || reinterpret_cast<uintptr_t>(hidden) % 16 != 0 ||
      (codes && (!p.ring_hidden.f16 || !p.ring_hidden.factors ||
                 reinterpret_cast<uintptr_t>(p.ring_hidden.f16) % 16 != 0)))
    return false;
  const EncodeTiled encode = encode_tiled();
  if (!encode) return false;
  const int ring_rows = p.rows <= tuning::kStreamMaxRows
                            ? tuning::stream_shape(false, tuning::stream_shape_for(p.rows)).row_groups * 8
                            : tuning::kStreamWideMaxRows;
  const uint32_t n = uint32_t(box::ring_box_rows(ring_rows, p.rows));
  return encode_rows(encode, &maps->w, p.w_dtype, p.w, uint64_t(p.d_load), uint64_t(p.vocab), pitch,
                     tuning::kStreamBoxMapTokens) &&
         encode_rows(encode, &maps->w_tile, p.w_dtype, p.w, uint64_t(p.d_load), uint64_t(p.vocab), pitch, 16) &&
         encode_rows(encode, &maps->hidden, hidden_dtype, hidden, hidden_columns, uint64_t(p.row_base + p.rows),
                     hidden_pitch, n) &&
         (!codes || encode_rows(encode, &maps->hidden_f16, FLASHSPEC_DTYPE_F16, p.ring_hidden.f16,
                                   hidden_columns, uint64_t(p.row_base + p.rows), hidden_pitch, n));
}

namespace {
// A launch of a TMA-ring kernel: (ScanParams, StreamTail, StreamMaps).
cudaError_t launch_ring(const void* kernel, const ScanParams& params, const StreamTail& tail, const StreamMaps& maps,
                        int blocks, int threads, size_t smem, cudaStream_t stream) {
  ScanParams p = params;
  StreamTail t = tail;
  StreamMaps m = maps;
  void* args[] = {&p, &t, &m};
  return launch_dependent(kernel, dim3(blocks), dim3(threads), smem, stream, args);
}
}  // namespace

cudaError_t launch_stream_box(const void* kernel, const ScanParams& params, const StreamTail& tail,
                              const StreamMaps& maps, int blocks, cudaStream_t stream) {
  return launch_ring(kernel, params, tail, maps, blocks, box::kThreads, stream_box_smem(params.w_dtype), stream);
}

cudaError_t launch_stream_wide(const void* kernel, const ScanParams& params, const StreamTail& tail,
                               const StreamMaps& maps, int blocks, cudaStream_t stream) {
  return launch_ring(kernel, params, tail, maps, blocks, wide::kThreads, stream_wide_smem(), stream);
}

}  // namespace scan
}  // namespace cuda
}  // namespace flashspec
