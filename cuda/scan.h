// Host side of the scan kernels: the kernel of each tuning-table entry
// (tuning.h), its shared-memory needs, and the weight-streaming scan's
// launcher. Which scan serves a call is decided in dispatch.cu.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "scan_params.h"

namespace flashspec {
namespace cuda {
namespace scan {

// Weight-streaming scan for ≤ tuning::kStreamMaxRows rows, W and hidden both
// bf16 or both fp16, or W 8-bit codes (e4m3 or int8) and hidden bf16,
// point-mass drafts: warps stream their own 16-token tiles into tensor-core
// fragments. One kernel per tuning::kStreamShapes entry and W dtype.
const void* stream_kernel(int shape, flashspec_dtype w_dtype);
// CTAs for the vocabulary: max_blocks (every resident slot), or fewer where
// the vocabulary has fewer 16-token tiles than that many CTAs have warps. The
// tiles are shared out evenly over the grid's warps.
int stream_blocks(int32_t vocab, int max_blocks);
// The last CTA to finish (counted in tail.done_counter, which it resets to
// 0) folds every CTA's partial in CTA order and writes the verify summaries
// or the draft outputs named by `tail`.
cudaError_t launch_stream(const void* kernel, const ScanParams& params, const StreamTail& tail, int blocks,
                          cudaStream_t stream);

// The same scan on sm_90a (dispatch checks the device and the build) for W
// and hidden both bf16 or both fp16, or W 8-bit codes and hidden bf16: W
// reaches shared memory in TMA boxes and warpgroup MMAs multiply it (codes
// converted to bf16 in registers); one CTA per SM, launch_stream_box's
// threads and stream_box_smem(W's dtype) bytes of dynamic shared memory.
// NULL for other dtypes and for shapes it does not serve
// (tuning::stream_box_serves).
// hand_off: the instance whose consumer groups share each CTA's last unit's
// fold, for launches that may have a sampled row (tuning::
// stream_box_hands_off); any launch may take either.
const void* stream_box_kernel(int shape, flashspec_dtype w_dtype, bool hand_off);
size_t stream_box_smem(flashspec_dtype w_dtype);
// The tensor maps a stream_box_kernel or stream_wide_kernel reads: W in
// boxes of tuning::kStreamBoxMapTokens tokens and of 16 tokens, and the
// launch's staged hidden rows (boxes of just its rows, which the kernel
// pads to its MMA's with zeros; for 8-bit codes the bf16 copy of
// ScanParams::ring_hidden, and its f16 copy in hidden_f16); all 128 bytes
// wide.
struct StreamMaps {
  CUtensorMap w;
  CUtensorMap w_tile;
  CUtensorMap hidden;
  CUtensorMap hidden_f16;  // 8-bit codes only
};
// 17–tuning::kStreamWideMaxRows rows on sm_90a, W and hidden both bf16 or
// both fp16: the same ring of TMA boxes, the hidden rows as the warpgroup
// MMA's M (zeros past the launch's). One CTA per SM, launch_stream_wide's
// threads and stream_wide_smem() bytes of dynamic shared memory; NULL for
// other dtypes.
const void* stream_wide_kernel(flashspec_dtype w_dtype);
size_t stream_wide_smem();
// Encodes the maps for a launch; false (the register path serves it) unless
// W is 16-bit or 8-bit codes (the staged rows 16-bit, for codes their
// copies of ScanParams::ring_hidden present) with 16-byte-aligned rows and
// the driver can encode tensor maps.
bool stream_box_maps(const ScanParams& params, StreamMaps* maps);
// A 2-D tensor map of `rows` rows of 16-bit elements or 8-bit codes
// (`columns` of which exist, `pitch` bytes apart) read in boxes of 128
// bytes × box_rows rows, in the 128-byte swizzle of the wgmma descriptors
// (wgmma.cuh); false where the driver cannot encode it.
bool encode_row_map(CUtensorMap* map, flashspec_dtype dtype, const void* base, uint64_t columns, uint64_t rows,
                    uint64_t pitch, uint32_t box_rows);
// A 2-D tensor map of `rows` rows of 8-bit codes (`columns` of which
// exist, `pitch` bytes apart) read in boxes of box_columns codes ×
// box_rows rows, unswizzled (the tile scan converts them in shared
// memory); false where the driver cannot encode it.
bool encode_code_map(CUtensorMap* map, const void* base, uint64_t columns, uint64_t rows, uint64_t pitch,
                     uint32_t box_columns, uint32_t box_rows);
// launch_stream's contract for a stream_box_kernel.
cudaError_t launch_stream_box(const void* kernel, const ScanParams& params, const StreamTail& tail,
                              const StreamMaps& maps, int blocks, cudaStream_t stream);
// The same for a stream_wide_kernel (params.gumbel_bounds NULL: no noise is
// skipped).
cudaError_t launch_stream_wide(const void* kernel, const ScanParams& params, const StreamTail& tail,
                               const StreamMaps& maps, int blocks, cudaStream_t stream);

// Tiled tensor-core scan, W and hidden both bf16 or both fp16, 16-byte-aligned
// weight rows, d_load % 8 == 0. One kernel per tuning::kMmaShapes entry.
struct MmaKernel {
  const void* bf16;
  const void* fp16;
  size_t base_smem;      // dynamic shared memory without kept logits
  size_t scratch_bytes;  // of it, reusable by the residual phase
};
const MmaKernel& mma_kernel(int shape);

// CUDA-core fp32 scan for every other combination (fp32 weights, dtypes that
// differ, unaligned borrowed heads): up to tuning::kSimtRows rows per launch,
// hidden staged as fp32.
const void* simt_kernel();
size_t simt_base_smem();

}  // namespace scan
}  // namespace cuda
}  // namespace flashspec
