// Which scan serves a call, and how it is launched: the shape tables of
// tuning.h applied to the rows of a call and the device the context runs on.
//
//   stochastic drafts            tiled scan (tensor cores, or CUDA cores),
//                                cooperative, kept logits in shared memory
//   ≤ kStreamMaxRows rows, 16-bit weight-streaming scan (combines its rows);
//                                on sm_90a, where tuning::stream_box_serves,
//                                its TMA and warpgroup-MMA form
//   ≤ kStreamWideMaxRows, 16-bit on sm_90a: the same TMA scan with the
//                                hidden rows as the MMA's M (combines its rows)
//   more rows, 16-bit            cuBLAS one vocabulary chunk at a time
//                                (the tiled tensor-core scan without cuBLAS)
//   any other dtype combination  CUDA-core fp32 scan
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "device_storage.h"
#include "scan_gemm.h"
#include "scan_params.h"
#include "tuning.h"

namespace flashspec {
namespace cuda {

// What the device allows each scan kernel, read once per context.
struct ScanLimits {
  int sm_count = 0;
  size_t max_smem = 0;  // dynamic shared memory a block may opt in to
  int stream_blocks_per_sm[tuning::kStreamShapeCount][5] = {};  // [shape][W dtype]
  // The sm_90a weight-streaming scan (scan::stream_box_kernel) may run: the
  // build has sm_90a code, the device is compute capability 9.0, and the
  // kernel's shared memory fits.
  bool stream_box = false;
  bool stream_box_codes = false;  // the same for 8-bit codes (a larger ring)
  // The same for its 17–64-row form (scan::stream_wide_kernel).
  bool stream_wide = false;
  // The tile scan (tile_scan::kernel_for) may run: the same conditions.
  bool tile_scan = false;
  int tile_pairs = 0;  // clusters of its paired forms that run at once (tile_scan::max_pairs; the fewer)
  int mma_blocks_per_sm[tuning::kMmaShapeCount] = {};
  int simt_blocks_per_sm = 1;
};

// Sets the scan kernels' attributes on `device` (the current device) and
// reads their occupancy.
ScanLimits configure_scans(int device);

// The context's scan workspace, sized for max_rows rows.
struct ScanWorkspace {
  RowPlan* plans;          // [max_rows]
  const void* hidden;      // staged hidden rows, [max_rows, k_pad]
  RingHidden ring_hidden;  // the rows as the 8-bit-code TMA ring reads them, where staged
                           // (scan_reads_ring_order); NULL members else
  TileHidden tile_hidden;  // an 8-bit head's rows as the tile scan reads them in f16, where staged
                           // (scan_reads_tile_f16); NULL members else
  Partial* partials;       // [kMaxGroups, max_rows]
  QPartial* q_partials;    // [kMaxGroups, max_rows]
  Residual* residuals;     // [kMaxGroups, max_rows]
  int32_t max_rows;        // the partials' stride
  cublasHandle_t cublas;   // NULL when max_rows ≤ kStreamMaxRows
  gemm_scan::ChunkPipeline chunks;  // the cuBLAS scan's logits buffers, each [max_rows, chunk]
  uint16_t* dequantized;   // an 8-bit head's bf16 rows for the cuBLAS scan; NULL if none is reserved
  const float* gumbel_bounds;  // [256] sampling/gumbel_bounds.h, for the folds that skip noise
};

// Whether run_scan may take the TMA ring for `rows` rows of `head` (an 8-bit
// head at 9–16 rows that the ring serves), which reads the hidden rows'
// copies of ScanWorkspace::ring_hidden (RingHidden): the staging writes
// them too where this holds. Without them the register scan serves the
// call.
bool scan_reads_ring_order(const ScanLimits& limits, const CudaLmHead& head, bool tensor_cores, int rows);

// Whether run_scan may take the tile scan for `rows` rows of an 8-bit
// `head` (may_sample as run_scan's), which multiplies in f16 where the
// rows' copies of ScanWorkspace::tile_hidden (TileHidden) are staged and
// exact: the staging writes them where this holds. Without them it
// multiplies the bf16 rows.
bool scan_reads_tile_f16(const ScanLimits& limits, const CudaLmHead& head, bool tensor_cores, int rows,
                         bool may_sample);

// Tests (testing.h): the sm_90a TMA-ring scans (9–16 and 17–64 rows) serve
// every call they can (on) or those tuning::stream_box_serves and
// tuning::stream_wide_serves pick (off, the default).
void set_stream_rings_everywhere(bool on);
// Lets only the cuBLAS chunks (scan_gemm.h) serve many-row scans (on), so
// that tests reach them on a device where the tile scan would serve; off
// (the default) restores the rules. Process-wide; set it between calls.
void set_many_row_chunks_only(bool on);

// Tokens per cuBLAS chunk for max_rows rows: as many as fit the logits
// workspace, in whole fold slices.
int32_t gemm_chunk_tokens(int32_t max_rows);

struct ScanOutcome {
  int groups;     // partials per row the scan wrote
  bool combined;  // the scan also wrote the rows' outputs (`tail`)
};

// Runs the scan that serves `rows` rows of `head` (tensor_cores: the hidden
// rows are staged in W's 16-bit dtype, bf16 for 8-bit codes), stochastic
// when `drafts` is given. may_sample: false only where every row is known
// to be greedy, which lets a scan take a kernel instance tuned for greedy
// launches (the result is the same either way).
ScanOutcome run_scan(const ScanLimits& limits, const ScanWorkspace& workspace, const CudaLmHead& head,
                     bool tensor_cores, int rows, bool may_sample, const StochasticDrafts* drafts,
                     const StreamTail& tail, cudaStream_t stream);

}  // namespace cuda
}  // namespace flashspec
