// Host side of the tile scan on sm_90a, for launches of more than 16 rows
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

// W in boxes of the kernel's tile of tokens, the staged hidden rows in boxes
// of its tile of rows, and the last tile of rows, where the launch's rows
// end inside it, in a box of just those rows; all 128 bytes wide, in the
// 128-byte swizzle.
struct TileMaps {
  CUtensorMap w;
  CUtensorMap w_half;  // half of W's box, which each CTA of a pair multicasts to both
  CUtensorMap hidden;
  CUtensorMap hidden_last;
};

// The kernel for W and hidden both bf16 or both fp16 (NULL for other
// dtypes): tiles of 128 rows by 128 tokens; every row of a launch must be
// greedy (its plan's kPlanGreedy), as a row's score is taken to be its
// logit. paired: the instance launched in clusters of two CTAs, the tiles
// of rows 2c and 2c + 1, which share each box of W (TMA multicast), for
// launches whose tiles of rows pair up (pairs_rows).
const void* kernel_for(flashspec_dtype w_dtype, bool paired);
// Their dynamic shared memory.
size_t smem_bytes();
// Whether a launch of `rows` rows has an even number of tiles of rows.
bool pairs_rows(int32_t rows);
// How many clusters of the paired kernel run at once on the current
// device (0 where none can).
int max_pairs(const void* paired_kernel);
// Partials (groups) per row of a launch of `rows` rows on `sm_count` SMs:
// one CTA per SM (paired, max_pairs > 0: two per cluster that runs at once),
// the vocabulary cut into token ranges of whole tiles, each range the work
// of one CTA per tile of rows, whose two consumer groups write a partial
// each (so an even count).
int groups_for(int32_t rows, int32_t vocab, int sm_count, int max_groups, int max_pairs);
// Encodes the maps; false (another scan serves the call) unless the rows of
// W and of the staged hidden rows are 16-byte aligned and the driver can
// encode tensor maps.
bool encode_maps(const ScanParams& params, TileMaps* maps);
// Enqueues the scan: params.groups partials per row (groups_for; each a
// consumer group's tiles, so not one token range: the combine's merge does
// not need one), as a programmatic dependent launch.
cudaError_t launch(const void* kernel, bool paired, const ScanParams& params, const TileMaps& maps,
                   cudaStream_t stream);

}  // namespace tile_scan
}  // namespace cuda
}  // namespace flashspec
