// Host side of the tile scan on sm_90a, for launches of 9 rows or more
// that are all greedy: one kernel computes the logits of a tile of hidden rows
// by a tile of W's tokens with warpgroup MMAs and folds them from the
// accumulators into the rows' partials, tile after tile, so no logit leaves
// the SM (the cuBLAS chunks of scan_gemm.h write each chunk's logits to L2
// and read them back). Which calls it serves: dispatch.cu, tuning.h
// (kTileScanMinRows).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "scan_params.h"

namespace flashspec {
namespace cuda {
namespace tile_scan {

// The kernel's forms, by tile of rows by tile of tokens. The paired forms
// run in clusters of two CTAs, the tiles of rows 2c and 2c + 1 over one
// token range, which share each box of W (TMA multicast), for launches with
// an even number of tiles of rows.
enum class Form { kTile64x128, kTile64x256, kTile64x256Paired, kTile128x128, kTile128x128Paired };
constexpr Form kForms[] = {Form::kTile64x128, Form::kTile64x256, Form::kTile64x256Paired, Form::kTile128x128,
                           Form::kTile128x128Paired};
bool paired(Form form);

// The form of a launch (the arguments as groups_for's; max_pairs 0 where
// the paired forms may not serve). At most 64 rows: 256-token tiles, whose
// box of hidden rows per stage serves twice the tokens of W, unless
// 128-token tiles cut the vocabulary into CTAs' ranges more evenly (fewer
// tokens in the largest) or a CTA would have fewer 256-token tiles than
// consumer groups. H200, greedy drafts at 64 rows, µs, 128-row tiles →
// 64 × 256: 128256 × 4096 272 → 259, 262144 × 8192 1047 → 1003; 64 × 128:
// 32000 × 2048 48.6 → 45.0, 151936 × 4096 304 → 298 (bench/RESULTS.md).
// 65–128 rows: two 64-row tiles of 256 tokens sharing W, on the same terms
// against one 128-row tile of 128 tokens; more rows: 128-row tiles, paired
// where they pair up.
// 8-bit codes (e4m3, int8): 64-row tiles of 128 tokens up to 64 rows,
// 128-row tiles of 128 tokens beyond, unpaired.
Form form_for(flashspec_dtype w_dtype, int32_t rows, int32_t vocab, int sm_count, int max_groups, int max_pairs);

// W in boxes of the form's tile of tokens (paired forms: half of it, which
// each CTA of a pair multicasts to both), the staged hidden rows in boxes of
// its tile of rows, and the last tile of rows, where the launch's rows end
// inside it, in a box of just those rows; all 128 bytes wide, in the
// 128-byte swizzle. 8-bit codes: W's boxes 64 bytes wide, unswizzled, and
// where the rows' f16 copies are staged (ScanParams::tile_hidden) the same
// two boxes of those.
struct TileMaps {
  CUtensorMap w;
  CUtensorMap hidden;
  CUtensorMap hidden_last;
  CUtensorMap hidden_f16;
  CUtensorMap hidden_last_f16;
};

// The kernel of a form for W and hidden both bf16 or both fp16, or for W
// of 8-bit codes (e4m3, int8; the 128-token unpaired forms) and hidden
// rows in bf16: three warps of the producer warpgroup convert each stage's
// codes (exactly) in shared memory for the MMAs, and the fold scales each
// logit by its row's scale. The codes go to f16 and meet the rows' f16
// copies (TileHidden) in CTAs whose rows all have one, each logit then
// also scaled by its row's factor; to bf16, meeting the bf16 rows,
// elsewhere. NULL for other dtypes and forms.
// Every row of a launch must be greedy (its plan's kPlanGreedy), as a
// row's score is taken to be its logit.
const void* kernel_for(flashspec_dtype w_dtype, Form form);
// Their dynamic shared memory.
size_t smem_bytes(flashspec_dtype w_dtype, Form form);
// How many clusters of a paired form's kernel run at once on the current
// device (0 where none can).
int max_pairs(Form form);
// Partials (groups) per row of a launch of `rows` rows on `sm_count` SMs:
// one CTA per SM (paired forms: two per cluster of the max_pairs that run
// at once), the vocabulary cut into token ranges of whole tiles, at least
// 256 tokens each, each range the work of one CTA per tile of rows, whose
// two consumer groups write a partial each (so an even count).
int groups_for(Form form, int32_t rows, int32_t vocab, int sm_count, int max_groups, int max_pairs);
// Encodes the maps; false (another scan serves the call) unless the rows of
// W and of the staged hidden rows are 16-byte aligned and the driver can
// encode tensor maps.
bool encode_maps(const ScanParams& params, Form form, TileMaps* maps);
// Enqueues the scan: params.groups partials per row (groups_for; each a
// consumer group's tiles, so not one token range: the combine's merge does
// not need one), as a programmatic dependent launch.
cudaError_t launch(const void* kernel, Form form, const ScanParams& params, const TileMaps& maps,
                   cudaStream_t stream);

}  // namespace tile_scan
}  // namespace cuda
}  // namespace flashspec
