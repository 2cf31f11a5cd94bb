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

// The scan's rows and W as every scan takes them (p.h holds the staged
// hidden rows in W's 16-bit dtype — bf16 for 8-bit codes — row stride
// p.k_pad), plus what the cuBLAS product needs.
struct Request {
  ScanParams p;
  int32_t d;              // reduction length (W's hidden size)
  cublasHandle_t handle;  // bound to the stream, with its workspace set
  float* workspace;       // [rows, chunk] fp32
  int32_t chunk;          // tokens per chunk, a multiple of tuning::kGemmSliceTokens
  uint16_t* dequantized;  // 8-bit heads: [kDequantTokens, p.d_load] bf16; else unused
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

// Partials (groups) a scan of `vocab` tokens in chunks of `chunk` writes.
int groups_for(int32_t vocab, int32_t chunk);
// Enqueues the whole scan on `stream`.
Status scan(const Request& request, cudaStream_t stream);

}  // namespace gemm_scan
}  // namespace cuda
}  // namespace flashspec
