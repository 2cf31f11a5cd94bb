// Host side of the many-row scan: cuBLAS logits of one vocabulary chunk at a
// time into an L2-sized workspace, each chunk folded into row partials.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "scan_params.h"

namespace flashspec {
namespace cuda {
namespace gemm_scan {

// 8-bit heads: cuBLAS has no product of bf16 hidden rows with 8-bit codes,
// so the codes of this many vocabulary rows at a time are converted to bf16
// (exactly) into a workspace first, and each logit is scaled after.
constexpr int32_t kDequantTokens = 4096;

// Two logits buffers and a second stream, so that one chunk is folded while
// cuBLAS writes the next: each chunk's product runs on the call's stream and
// its fold on `side`; events order the reuse of each buffer, and the call's
// stream takes the side stream's work back at the end, so a captured call
// captures both streams. side NULL: logits[0] only, every kernel on the
// call's stream.
struct ChunkPipeline {
  float* logits[2];  // each holds `capacity` floats
  int64_t capacity;
  cudaStream_t side;  // non-blocking
  cudaEvent_t ready[2], freed[2], joined;

  bool pipelined() const { return side != nullptr; }
  // Where chunk `index` is written: its buffer, once the call's stream has
  // waited for the fold of chunk index − 2 that read it last.
  cudaError_t acquire(int index, cudaStream_t stream, float** out) const {
    const int buffer = pipelined() ? index % 2 : 0;
    *out = logits[buffer];
    return pipelined() && index >= 2 ? cudaStreamWaitEvent(stream, freed[buffer], 0) : cudaSuccess;
  }
  // Chunk `index` is written (on `stream`): the stream its fold runs on,
  // after it, is `*fold_stream`.
  cudaError_t hand_over(int index, cudaStream_t stream, cudaStream_t* fold_stream) const {
    *fold_stream = pipelined() ? side : stream;
    if (!pipelined()) return cudaSuccess;
    const cudaError_t e = cudaEventRecord(ready[index % 2], stream);
    return e != cudaSuccess ? e : cudaStreamWaitEvent(side, ready[index % 2], 0);
  }
  // Chunk `index`'s fold is enqueued: its buffer may be written again after it.
  cudaError_t release(int index) const {
    return pipelined() ? cudaEventRecord(freed[index % 2], side) : cudaSuccess;
  }
  // `stream` waits for everything enqueued on the side stream.
  cudaError_t join(cudaStream_t stream) const {
    if (!pipelined()) return cudaSuccess;
    const cudaError_t e = cudaEventRecord(joined, side);
    return e != cudaSuccess ? e : cudaStreamWaitEvent(stream, joined, 0);
  }
};

// The scan's rows and W as every scan takes them (p.h holds the staged
// hidden rows in W's 16-bit dtype — bf16 for 8-bit codes — row stride
// p.k_pad), plus what the cuBLAS product needs.
struct Request {
  ScanParams p;
  int32_t d;              // reduction length (W's hidden size)
  cublasHandle_t handle;  // bound to the stream, with its workspace set
  ChunkPipeline chunks;   // logits [rows, chunk] fp32 per buffer
  int32_t chunk;          // tokens per chunk (chunk_tokens), a multiple of tuning::kGemmSliceTokens
  uint16_t* dequantized;  // 8-bit heads: [kDequantTokens, p.d_load] bf16; else unused
  const float* gumbel_bounds;  // the 256 bucket bounds of sampling/gumbel_bounds.h
  int product_sms;        // SMs cuBLAS targets for a chunk written while an earlier one is folded; 0: all
};

// What failed, if anything: a CUDA error, or (cuda == cudaSuccess) a cuBLAS
// status named in `what`.
struct Status {
  cudaError_t cuda;
  const char* what;
};

// W and the staged hidden rows as a logits product needs them.
struct Product {
  cublasHandle_t handle;
  const void* w;          // [vocab, ldw] in w_dtype
  int64_t ldw;
  flashspec_dtype w_dtype;
  const float* w_scale;   // 8-bit codes: [vocab] row scales
  uint16_t* dequantized;  // 8-bit codes: [kDequantTokens, d_load] bf16 workspace
  int32_t d;
  int32_t d_load;         // 8-bit codes: columns of a row converted (a multiple of 16, zeros past d)
  const void* h;          // staged hidden rows [rows, k_pad]: W's dtype, bf16 for codes
  int32_t k_pad;
  int32_t rows;
};

// logits[r · ld + i] = the logit of hidden row r and token v0 + i, for
// i < count, r < rows: one cublasGemmEx, or for 8-bit codes a conversion
// and a cublasGemmEx per kDequantTokens rows and the rows' scales.
Status logits_chunk(const Product& product, int32_t v0, int32_t count, float* logits, int32_t ld,
                    cudaStream_t stream);

// Tokens per chunk of a scan of `rows` rows whose buffers hold `capacity`
// floats each: as many whole slices as a buffer holds, at most
// tuning::kGemmMaxChunkTokens. Fewer rows get longer chunks: the products
// run at cuBLAS's speed either way, and fewer chunks mean fewer folds
// (with 64 rows on an H100, chunks of 64K tokens against 32K: verify ÷ GEMM
// 1.28 → 1.23; cutting the vocabulary into four or eight chunks to shorten
// the last fold was slower, bench/RESULTS.md). The partials' slices are the
// same token ranges whatever the chunk, so the result is too.
int32_t chunk_tokens(int32_t rows, int64_t capacity);
// Tokens per fold CTA (a slice) in a chunk of `count` tokens of `rows` rows:
// the longest of tuning::kGemmSliceTokens doubled up to
// tuning::kGemmMaxSliceTokens that still gives tuning::kGemmFoldMinBlocks
// CTAs. Longer slices cost fewer block reductions per token and let the
// fold's pruning see more scores before a token comes; too few CTAs leave
// SMs idle.
int32_t slice_tokens(int32_t count, int32_t rows);
// The SMs a chunk's product may target while the previous chunk is folded
// beside it (Request::product_sms) for a scan of `rows` rows on a device of
// `sm_count` SMs; 0: all of them.
int product_sms(int32_t rows, int sm_count);
// Partials (groups) a scan of `vocab` tokens of `rows` rows in chunks of
// `chunk` writes.
int groups_for(int32_t vocab, int32_t chunk, int32_t rows);
// Enqueues the whole scan on `stream`.
Status scan(const Request& request, cudaStream_t stream);

}  // namespace gemm_scan
}  // namespace cuda
}  // namespace flashspec
