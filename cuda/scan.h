// Host side of the scan kernels: which kernel serves a configuration, its
// shared-memory needs, and one launcher (explicit stream, optionally
// cooperative) for all of them.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "scan_common.cuh"

namespace flashspec {
namespace cuda {
namespace scan {

// Tensor-core scan, W and hidden both bf16 (bf16 = true) or both fp16; bm ∈
// {16, 64, 128} rows per CTA. 16-byte-aligned weight rows, d_load % 8 == 0.
const void* mma_kernel(int bm, bool bf16);
size_t mma_base_smem(int bm);       // dynamic shared memory without kept logits
size_t mma_scratch_capacity(int bm);  // bytes reusable by the residual phase
int mma_threads();

// CUDA-core fp32 scan for every other combination (fp32 weights, dtypes that
// differ, unaligned borrowed heads): up to kSimtRows rows per launch, hidden
// staged as fp32.
constexpr int kSimtRows = 16;
const void* simt_kernel();
size_t simt_base_smem();
int simt_threads();

// Weight-streaming scan for ≤ stream_max_rows() rows, W and hidden both bf16
// or both fp16, non-stochastic: warps stream their own 16-token tiles into
// tensor-core fragments. One Partial per CTA (group = blockIdx.x).
const void* stream_kernel(int rows, bool bf16);
int stream_threads();
int stream_max_rows();
// Tiles per warp so that max_blocks CTAs cover the vocabulary, and the CTAs
// then needed: every warp but the last gets the same number of tiles.
int stream_tiles_per_warp(int32_t vocab, int max_blocks);
int stream_blocks(int32_t vocab, int tiles_per_warp);
// The weight-streaming scan combines its own rows: the last CTA to finish
// (counted in done_counter, which it resets to 0) folds every CTA's partial
// in CTA order and writes the verify summaries or the draft outputs, so no
// combine kernel follows it.
struct StreamTail {
  int32_t* done_counter;        // device int, 0 between launches
  const int32_t* hidden_bad;    // [rows] from the staging kernel
  const int32_t* batch_status;  // verify: the batch-level status; NULL for a draft
  RowSummary* summaries;        // verify: output
  int32_t* tokens_out;          // draft: output
  float* scores_out;            // draft: output, may be NULL
};

cudaError_t launch_stream(const void* kernel, const ScanParams& params, const StreamTail& tail, int tiles_per_warp,
                          int blocks, cudaStream_t stream);

cudaError_t launch(const void* kernel, const ScanParams& params, int grid, int threads, size_t smem,
                   bool cooperative, cudaStream_t stream);

}  // namespace scan
}  // namespace cuda
}  // namespace flashspec
