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

// The scan's rows and W as every scan takes them (p.h holds the staged
// hidden rows in W's 16-bit dtype, row stride p.k_pad), plus what the cuBLAS
// product needs.
struct Request {
  ScanParams p;
  int32_t d;              // reduction length (W's hidden size)
  cublasHandle_t handle;  // bound to the stream, with its workspace set
  float* workspace;       // [rows, chunk] fp32
  int32_t chunk;          // tokens per chunk, a multiple of tuning::kGemmSliceTokens
};

// What failed, if anything: a CUDA error, or (cuda == cudaSuccess) a cuBLAS
// status named in `what`.
struct Status {
  cudaError_t cuda;
  const char* what;
};

// Partials (groups) a scan of `vocab` tokens in chunks of `chunk` writes.
int groups_for(int32_t vocab, int32_t chunk);
// Enqueues the whole scan on `stream`.
Status scan(const Request& request, cudaStream_t stream);

}  // namespace gemm_scan
}  // namespace cuda
}  // namespace flashspec
