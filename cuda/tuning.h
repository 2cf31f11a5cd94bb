// Every tuning constant of the CUDA backend: one table per scan, read by the
// kernels (as template parameters) and by dispatch (to pick a shape), with
// the measurement that chose each value beside it. Change a value here and
// nowhere else.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flashspec {
namespace cuda {
namespace tuning {

// Token-range groups a scan may split the vocabulary into: sizes the
// partials workspace, [kMaxGroups, max_rows] Partials.
constexpr int kMaxGroups = 1024;

// ---- Weight-streaming scan (scan_stream.cu): ≤ 16 rows, 16-bit W ----------
// Each warp streams 16-token tiles of W into mma.sync fragments; row_groups
// 8-row groups of hidden rows ride on each tile.
struct StreamShape {
  int max_rows;    // rows this shape serves
  int row_groups;  // 8-row mma n-tiles
  int unroll;      // 32-element chunks per burst; two bursts in flight per lane
  int min_blocks;  // CTAs per SM the kernel is compiled for (__launch_bounds__)
  // Whether a sampled row's Gumbel noise for a tile is drawn while the loads
  // of the tile's last burst are in flight rather than after its products.
  // With one CTA per SM a warp's epilogue holds up its own loads and few
  // other warps cover for it (16-bit W, 9–16 rows: verify 1.4–2.5 % faster
  // on an H200). With two CTAs per SM the other CTA's warps do: at ≤ 8 rows
  // it measured level, and the 8-bit shapes' 128 registers would spill.
  bool draw_ahead;
};
// With ≤ 8 rows two CTAs per SM and 4-chunk bursts (up to 8 KB per warp in
// flight) were fastest on an H200; with 9–16 rows the second row group's
// registers leave room for one CTA per SM, and 8-chunk bursts keep as many
// bytes in flight. 8-bit codes have their own table below (a 64-byte chunk
// then holds 64 elements).
constexpr StreamShape kStreamShapes[] = {
    {8, 1, 4, 2, false},
    {16, 2, 8, 1, true},
};
constexpr int kStreamShapeCount = int(sizeof(kStreamShapes) / sizeof(kStreamShapes[0]));
// 8-bit codes: the same rows per shape (stream_shape_for serves both). At
// 9–16 rows the codes' conversion makes one CTA per SM (8 warps) too few to
// keep the loads coming (Nsight Compute: DRAM at 47 %); 4-chunk bursts fit
// two CTAs per SM (128 registers): e4m3 verify ÷ bf16 GEMM 0.76 → 0.67 at
// V = 128256, d = 4096, 16 rows, 0.66 → 0.56 at 262144 × 8192 (H100; 2-chunk
// bursts gave 0.69 and 0.56; bench/RESULTS.md).
constexpr StreamShape kStreamCodeShapes[] = {
    {8, 1, 4, 2, false},
    {16, 2, 4, 2, false},
};
static_assert(sizeof(kStreamCodeShapes) == sizeof(kStreamShapes), "one 8-bit shape per 16-bit shape");
constexpr StreamShape stream_shape(bool codes, int shape) {
  return codes ? kStreamCodeShapes[shape] : kStreamShapes[shape];
}
constexpr int kStreamMaxRows = kStreamShapes[kStreamShapeCount - 1].max_rows;
constexpr int kStreamThreads = 256;
// Bytes of W the weight-streaming grid asks L2 for before it waits for the
// kernels before it (staging, plans: a few microseconds in which HBM would
// otherwise idle), spread over the first 16-token tile of every warp. About
// what HBM moves in 3.5 µs, and well under L2, which must keep the lines until
// the warps reach them.
constexpr int64_t kStreamPrefetchBytes = int64_t(16) << 20;

// The first shape that serves `rows` (rows ≤ kStreamMaxRows).
constexpr int stream_shape_for(int rows) {
  int i = 0;
  while (i + 1 < kStreamShapeCount && rows > kStreamShapes[i].max_rows) ++i;
  return i;
}

// The same scan on sm_90a with W moved by the tensor-memory accelerator
// into a CTA-wide ring of shared-memory stages and multiplied by warpgroup
// MMAs (scan_stream.cu, stream_box_kernel), the geometry of cuBLAS's
// few-row GEMV kernels: one producer warp and kStreamBoxGroups consumer
// warpgroups; a stage holds kStreamBoxPanels 128-byte panels of
// kStreamBoxStageTokens tokens' rows and the hidden rows' same columns,
// which every token of the stage shares (the register path re-reads the
// hidden rows through L1 for each 16-token tile). H200, Nsight Compute,
// V = 128256, d = 4096, the kernel alone: 16 rows 356 µs (register path) →
// 324 µs, but 1 row 270 → 281 µs (cuBLAS's GEMM: 250), so it serves 9–16
// rows only. 256-token stages × 6 beat 128 × 12, 256 × 4 and two-panel
// stages; 64-token boxes beat 16, 32 and 256.
//
// The consumer groups take whole 256-token units in turn, so that one folds
// a unit while the other multiplies the next. With both groups on every
// stage and folding after it, the scan paid only with rows of 16 KB (H100 |
// H200, verify ÷ GEMM, 262144 × 8192 × 16: 0.967 → 0.958 | 1.117 → 1.069);
// with units in turn, against the register path, H200, verify µs at 16 rows:
// 262144 × 2048 318 → 291, 262144 × 4096 568 → 533, 128256 × 4096 300 →
// 287, 128256 × 2048 179 → 170; 262144 × 8192 (both groups per stage →
// in turn) 1038 → 1029. A CTA with fewer than two units leaves one group
// idle and its fold exposed: V = 32000, 16 rows, 68 → 74 µs at d = 2048,
// 99 → 105 at d = 4096 (bench/RESULTS.md). Hence: rows of at least
// kStreamBoxMinRowBytes and at least kStreamBoxMinUnits units per CTA.
constexpr int kStreamBoxGroups = 2;
constexpr int kStreamBoxStageTokens = 256;
constexpr int kStreamBoxStages = 6;
constexpr int kStreamBoxPanels = 1;      // 128-byte column panels per stage
constexpr int kStreamBoxMapTokens = 64;  // tokens per box of W's bulk tensor map (16 at a ragged unit end)
constexpr int kStreamBoxMinShape = 1;    // the first kStreamShapes entry it serves (9–16 rows)
constexpr int64_t kStreamBoxMinRowBytes = 4096;
constexpr int kStreamBoxMinUnits = 2;    // 256-token units per CTA

// Whether a TMA-ring scan over `vocab` tokens on `ctas` CTAs (one per SM)
// gives every CTA at least `units` units of kStreamBoxStageTokens tokens.
constexpr bool ring_units_at_least(int64_t vocab, int ctas, int units) {
  return vocab >= int64_t(units) * kStreamBoxStageTokens * ctas;
}

// Whether the sm_90a scan serves a stream shape whose W rows are row_bytes
// long over a vocabulary of `vocab` tokens on `ctas` CTAs (one per SM),
// where the device and the build have it. 8-bit codes take the same rule
// (a row of d codes is d bytes): their stages hold a 128-byte panel of 128
// codes per token, which the multiplying group converts to bf16 (to f16
// where the hidden rows allow, RingHidden) in registers as the MMA's
// A, reading a token's codes of four k16 steps in one 16-byte load
// (ring_code_column's k order). H200, µs: int8 verify,
// register scan → ring, 128256 × 4096 × 16 230.0 → 214.9, × 9 223.2 →
// 202.8, 262144 × 8192 × 16 774.8 → 701.7, 151936 × 4096 × 16 275.6 →
// 240.7; e4m3 greedy draft / verify, ring reading 16-bit pairs → 16-byte
// units, 128256 × 4096 × 16 197.6 / 219.4 → 191.7 / 209.5, 262144 × 8192 ×
// 16 672.2 / 709.0 → 652.1 / 685.2 (the register scan: 208.0 / 224.3 and
// 738.7 / 751.9 in an earlier run), then with f16 products 160.4 / 181.6
// and 538.9 / 564.8 (the bf16 products in the same run 192.5 / 210.9 and
// 663.0 / 687.9); int8 verify with f16 products 128256 × 4096 × 16 214.2
// → 200.1, 262144 × 8192 × 16 744.2 → 667.2. Reading 16-bit pairs, int8
// measured −1 … +2 % against the register scan (bench/RESULTS.md).
constexpr bool stream_box_serves(int shape, int64_t row_bytes, int64_t vocab, int ctas) {
  return shape >= kStreamBoxMinShape && row_bytes >= kStreamBoxMinRowBytes &&
         ring_units_at_least(vocab, ctas, kStreamBoxMinUnits);
}

// Whether a launch of that scan over `vocab` tokens on `ctas` CTAs that may
// have a sampled row takes the instance whose two consumer groups share
// each CTA's last unit's fold (box::consume_units: the owner hands the
// other, idle group the first half of the unit's 64-token tiles). The
// last unit's sampled fold is otherwise exposed after the CTA's last
// loads; a greedy one is short, and greedy launches keep the instance
// without the handoff, whose code alone made greedy drafts 5–9 µs slower
// even with the handoff off. H200, µs (bench/RESULTS.md): with three or
// four 64-token tiles in the last unit (one or two handed over) the verify
// and sampled draft were 4–7 µs faster in one kernel (128256 × 4096 × 16
// verify 288.8 → 283.6) and, as the second instance, 2–4.5 µs at 16 rows
// (128256 × 2048 × 16 verify 165.9 → 161.8, sampled draft 160.4 → 155.9;
// 9 rows level), greedy drafts level; with two (one handed over: 151936 ×
// 4096 × 9) 3.5 µs slower. Hence: at least kStreamBoxHandOffMinTiles tiles
// in every CTA's last unit.
constexpr int kStreamBoxHandOffMinTiles = 3;
constexpr int ring_last_unit_tiles(int64_t ring_tiles) {  // 64-token tiles in the last unit of a CTA's 16-token tiles
  const int64_t units = (ring_tiles + kStreamBoxStageTokens / 16 - 1) / (kStreamBoxStageTokens / 16);
  const int64_t last = ring_tiles - (units - 1) * (kStreamBoxStageTokens / 16);
  return int((last * 16 + 63) / 64);
}
constexpr bool stream_box_hands_off(int64_t vocab, int ctas) {
  const int64_t tiles = (vocab + 15) / 16, fewest = tiles / ctas, most = (tiles + ctas - 1) / ctas;
  return fewest * 16 > kStreamBoxStageTokens && ring_last_unit_tiles(fewest) >= kStreamBoxHandOffMinTiles &&
         ring_last_unit_tiles(most) >= kStreamBoxHandOffMinTiles;
}
static_assert(stream_box_hands_off(128256, 132) && stream_box_hands_off(262144, 132) &&
                  !stream_box_hands_off(151936, 132) && !stream_box_hands_off(32000, 132),
              "the shapes measured on either side of the rule");

// 17–kStreamWideMaxRows rows on sm_90a (stream_wide_kernel): the same ring
// and the same stages of 256 tokens × 64 columns, the hidden rows now the
// warpgroup MMA's M (64 rows, zeros past the call's) and W's 64-token tiles
// its N; the two consumer warpgroups take whole units in turn, as above.
// Five 40 KB stages fit beside the plans. Its cost does not fall with the
// rows (the MMA is always 64 rows), and it pays only where a CTA's units
// are long and many: a unit's sampled fold (dependent Philox, log and exp
// chains with one warp per scheduler) takes tens of µs, which hide behind
// the other group's next unit only when that unit's loads take longer, and
// the last unit's fold is exposed (half of it since the two groups share
// it: 262144 × 8192 × 32–64, verify 12–17 µs faster). H200, verify µs,
// cuBLAS chunks → this scan: 262144 × 8192, 64 rows 1168 → 1086, 48 rows
// 1136 → 1086, 32 rows 1114 → 1097, but 17 rows 1075 → 1105; 151936 × 8192
// × 64 level (699 → 697); 128256 × 8192, 64 rows level, 32 rows 560 → 588;
// 128256 × 4096 × 64 330 → 372, 32000 × 2048 × 64 68 → 145
// (bench/RESULTS.md). With the last unit's fold shared, a full 64 rows also
// pay with fewer units (H200, verify µs, two rounds, cuBLAS chunks → this
// scan: 128256 × 8192 × 64 609 → 586, 151936 × 8192 × 64 720 → 694), 48
// and 32 rows there still do not (151936 × 8192: 678 → 687, 664 → 677).
// Since the fold keeps its plans in registers and runs the Gumbel
// transform once per lane and round, rows of 8 KB pay over many units
// (262144 × 4096, 64 / 48 / 32 / 24 / 17 rows: 668 → 602, 647 → 589, 625 →
// 581, 610 → 576, 603 → 577; greedy drafts 10–13 % faster) but not over few
// (128256 × 4096 × 64 340 → 359, 151936 × 4096 × 64 402 → 406), and fewer
// rows pay too (262144 × 8192 × 24 1110 → 1074, × 17 1095 → 1078). Hence:
// rows of at least kStreamWideMinRowBytes over at least kStreamWideMinUnits
// units per CTA, or kStreamWideFullMinUnits for rows of
// kStreamWideLongRowBytes at kStreamWideMaxRows rows. Since its hidden
// boxes hold just the launch's rows (no zero-filled rows past them), 17–48
// rows verify 1–3 % faster at 262144 × 4096/8192; given every sampled call
// of 24–48 rows it gained 1–3.5 % on the verify at 128256–151936 × 4096/
// 8192 but lost up to 7 % elsewhere and on sampled drafts, so the rule
// stands (H200, bench/RESULTS.md).
constexpr int kStreamWideMaxRows = 64;
constexpr int kStreamWideStages = 5;
constexpr int64_t kStreamWideMinRowBytes = 8192;
constexpr int64_t kStreamWideLongRowBytes = 16384;
constexpr int kStreamWideMinUnits = 6;      // 256-token units per CTA
constexpr int kStreamWideFullMinUnits = 3;  // the same, long rows at kStreamWideMaxRows rows

// Whether the 17–64-row sm_90a scan serves `rows` rows (17 to
// kStreamWideMaxRows) of a head of `vocab` rows of row_bytes each on `ctas`
// CTAs (one per SM).
constexpr bool stream_wide_serves(int rows, int64_t vocab, int64_t row_bytes, int ctas) {
  const bool full_long = rows >= kStreamWideMaxRows && row_bytes >= kStreamWideLongRowBytes;
  return row_bytes >= kStreamWideMinRowBytes &&
         ring_units_at_least(vocab, ctas, full_long ? kStreamWideFullMinUnits : kStreamWideMinUnits);
}
static_assert(stream_wide_serves(64, 128256, 16384, 132) && !stream_wide_serves(48, 151936, 16384, 132) &&
                  stream_wide_serves(17, 262144, 16384, 132) && !stream_wide_serves(64, 32000, 16384, 132) &&
                  stream_wide_serves(17, 262144, 8192, 132) && !stream_wide_serves(64, 151936, 8192, 132) &&
                  !stream_wide_serves(64, 262144, 4096, 132),
              "the shapes measured on either side of the rule");

// From kTileScanMinRows rows on sm_90a, 16-bit heads, launches whose rows
// are all greedy (drafts at the one temperature 0, verify batches with
// greedy = 1, the engine's all-greedy steps): the tile scan
// (scan_tiles.cu), a GEMM whose epilogue folds (tiles of 128 rows by 128
// tokens; up to 128 rows, of 64 rows by 256 or 128 tokens:
// tile_scan::form_for), before the 9–16-row and 17–64-row scans and the
// cuBLAS chunks. From 17 rows, measured with 128-row tiles throughout;
// H200, µs, greedy drafts, cuBLAS chunks → tile scan: 128256 × 4096 ×
// 100 317 → 290, × 128 332 → 284, × 256 502–523 → 424–433, × 512 954–960 → 775–856; 151936 ×
// 4096 × 128 396 → 313; 262144 × 8192 × 128 1217 → 1173; 32000 × 2048 ×
// 128 62 → 59; 151936 × 2048 × 100 225 → 184. At 17–64 rows (a last tile
// of rows loaded in a box of just its rows), the rules before → tile scan:
// 128256 × 4096 × 64 306 → 272, × 32 298 → 272; 262144 × 4096 × 64 553 →
// 518; 151936 × 8192 × 64 675 → 608; 32000 × 4096 × 64 86 → 81; 128256 ×
// 2048 × 64 179 → 139. Rows past a multiple of 128 cost a whole tile of
// rows (W read once more): 128256 × 4096 × 129 took 376–423 against the
// chunks' 365–387, 262144 × 8192 × 300 2559–2587 against 2376–2405, while
// 200 and 300 rows at d = 4096 gained (bench/RESULTS.md). Launches that may
// sample keep the chunks: there the tile scan's sampled fold, with one warp
// per scheduler beside the other group's products, was slower at 256–512
// rows and mixed at 100–128 (e.g. verify 128256 × 4096 × 100 361 → 382,
// 151936 × 4096 × 128 457 → 418). Greedy launches of the 9–16-row shape: a
// 64-row tile of which the launch fills 9–16 rows costs it about what 64
// rows do (128256 × 4096 greedy drafts: 257–259 µs at 1, 5, 9 and 16 rows),
// which from 9 rows is below the weight-streaming scans' time. H200, µs,
// greedy draft / greedy verify batch, TMA ring → tile scan (two rounds):
// 16 rows 32000 × 2048 51.0 → 45.0 / 55.6 → 51.5, 128256 × 4096 263.3 →
// 258.6 / 269.6 → 263.9, 151936 × 4096 316.4 → 294.2 / 322.8 → 299.2,
// 262144 × 8192 1005.4 → 993.1 / 1010.4 → 998.0; 9 rows 128256 × 4096
// 260.3 → 257.8 / 266.4 → 263.9, 151936 × 8192 616.5 → 585.8 / 622.7 →
// 590.8; every one of 14 such shapes faster (0.88–1.00 of the time), but 1
// and 5 rows 2–4 % slower (262144 × 8192 × 1 974.4 → 997.1), where the
// ≤ 8-row scans' one row group costs less (bench/RESULTS.md).
constexpr int kTileScanMinRows = kStreamShapes[0].max_rows + 1;
static_assert(kTileScanMinRows == 9, "the row counts measured on either side of the rule");
// 8-bit heads (e4m3, int8 codes) take the tile scan from the first row
// count the TMA rings do not serve them: up to 16 rows the 9–16-row ring
// reads the codes as the MMA's A from registers, beyond it the codes went
// through bf16 copies for cuBLAS, a conversion kernel and a GEMM per 4096
// tokens (3.1–3.8× the bf16 GEMM at 64 rows, H200). The tile scan reads
// each code once and converts it in shared memory: H200, e4m3 greedy
// drafts at 17–64 rows 0.34–0.43 of the time (128256 × 4096 × 64 928.9 →
// 348.5 µs), and 0.80–0.87 of that again with the products in f16 (282 µs
// there). Its three converting warps set its rate whatever the rows (275
// and 282 µs at 17 and 64 rows), while the ring took 153 µs at 16, so the
// ring keeps 9–16 rows (bench/RESULTS.md).
constexpr int kTileScanMinCodeRows = kStreamMaxRows + 1;
// Launches whose tiles of rows pair up (an even number of them: 129–256
// and 385–512 rows) run the tile scan in clusters of two CTAs that share
// each box of W by TMA multicast, so W leaves L2 once per two tiles of rows
// (a CTA's share of L2's traffic per stage 32 → 24 KB). H200, greedy µs,
// unpaired → paired (two rounds): 128256 × 8192 × 256 891–908 → 838–858,
// 151936 × 8192 × 512 2010–2076 → 1901–1943, 262144 × 8192 × 256 1880–1934
// → 1732–1756, 128256 × 4096 × 512 789–838 → 775–788; at d ≤ 4096 and 256
// rows within ±5 % (a median 0.99 of the time), 129 rows level
// (bench/RESULTS.md). Launches of 65–128 rows likewise pair two 64-row
// tiles of 256 tokens where tile_scan::form_for takes them: 128-row tile →
// pair, 128256 × 4096 × 128 283–285 → 273–275, 262144 × 8192 × 128 1184 →
// 1137–1169; 65–96 rows level.
constexpr bool kTileScanPairs = true;

// ---- Tensor-core tiled scan (scan_mma.cu): stochastic drafts, and many ----
// rows without cuBLAS. A CTA owns BM rows and walks its token range in
// tiles of kMmaTileTokens; each pipeline stage holds BK columns.
struct MmaShape {
  int max_rows;    // rows per call this shape serves (the last serves all)
  int bm;          // rows per CTA
  int bk;          // columns per stage: each W row contributes bk * 2 bytes
  int min_blocks;  // CTAs per SM the kernel is compiled for
};
// Few rows make the scan a pure weight stream, where long contiguous runs per
// row keep DRAM pages open (BK = 128: 256 bytes); many rows make it
// compute-bound, where smaller stages leave room for a second CTA per SM.
constexpr MmaShape kMmaShapes[] = {
    {16, 16, 128, 1},
    {64, 64, 64, 2},
    {1 << 30, 128, 32, 2},
};
constexpr int kMmaShapeCount = int(sizeof(kMmaShapes) / sizeof(kMmaShapes[0]));
constexpr int kMmaTileTokens = 128;
constexpr int kMmaStages = 4;
constexpr int kMmaThreads = 256;

constexpr int mma_shape_for(int rows) {
  int i = 0;
  while (i + 1 < kMmaShapeCount && rows > kMmaShapes[i].max_rows) ++i;
  return i;
}

// ---- CUDA-core fp32 scan (scan_simt.cu): every other dtype combination -----
constexpr int kSimtRows = 16;  // rows per launch: one per lane of the first half-warp
constexpr int kSimtThreads = 256;

// ---- cuBLAS chunked scan (scan_gemm.cu): > kStreamMaxRows rows ------------
// The product is compute-bound there: cuBLAS writes one chunk of logits
// [rows, chunk] into a workspace that stays in L2, and a fold kernel reduces
// it before the next chunk overwrites it.
constexpr size_t kGemmWorkspaceBytes = size_t(64) << 20;      // logits chunk, about L2-sized per chunk
constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;    // cuBLAS's own, fixed so graphs can capture it
constexpr int32_t kGemmSliceTokens = 4096;                    // tokens per fold CTA at least; chunks are multiples
// The fold doubles its slices up to this while a chunk still gives
// kGemmFoldMinBlocks CTAs (slice_tokens, scan_gemm.h). H100, verify ÷ GEMM,
// 4096 → 16384-token slices: 256 rows 1.61 → 1.47 (V = 128256, d = 4096),
// 512 rows 1.66 → 1.54; 64 rows 1.22 → 1.21 where a 65536-token chunk
// still gives 256 CTAs, 1.59 → 1.71 at V = 32000 where it gave 128.
constexpr int32_t kGemmMaxSliceTokens = 16384;
constexpr int kGemmFoldMinBlocks = 256;
constexpr int32_t kGemmMaxChunkTokens = 65536;
constexpr int kGemmFoldThreads = 256;
// With few rows the product reads W at the bandwidth of fewer SMs than the
// device has, and cuBLAS's kernels take a whole SM each (all its registers),
// so a fold launched beside a product only runs once the product's CTAs
// retire. Up to kGemmSharedSmsMaxRows rows, a scan of more than one chunk
// asks cuBLAS to target kGemmFoldSms fewer SMs (cublasSetSmCountTarget),
// leaving them to the previous chunk's fold. H200, verify ÷ GEMM at 64 rows,
// SMs left 0 → 8 / 16 / 28 / 44: 128256 × 4096 1.242 → 1.223 / 1.216 / 1.194 /
// 1.216; 262144 × 8192 1.125 → 1.077 / 1.078 / 1.073 / 1.117; 151936 × 4096
// 1.336 → 1.393 / 1.395 / 1.289 / 1.328; at 256 rows, where the product is
// bound by the tensor cores, 8 SMs left cost 4 % (bench/RESULTS.md).
constexpr int kGemmFoldSms = 28;
constexpr int kGemmSharedSmsMaxRows = 64;
constexpr int kGemmTokensPerThread = 4;                       // one Philox block serves four Gumbel draws

// ---- Kernels around the scan (prepare.cu, combine.cu, finalize.cu) --------
constexpr int kPlanThreads = 512;      // the verify plans kernel is one block
constexpr int kCombineWarpsPerBlock = 4;
constexpr int kFinalizeThreads = 128;
constexpr int kTreeFinalizeThreads = 256;  // stage a tree's summaries (≤ 4 loads per thread at 255 nodes)

}  // namespace tuning
}  // namespace cuda
}  // namespace flashspec
