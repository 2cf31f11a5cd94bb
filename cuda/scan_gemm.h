// Host side of the many-row scan: cuBLAS logits of one vocabulary chunk at a
// time into an L2-sized workspace, each chunk folded into row partials.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "device_common.cuh"

namespace flashspec {
namespace cuda {
namespace gemm_scan {

struct Request {
  cublasHandle_t handle;  // bound to the stream, with its workspace set
  const void* w;          // LM head, [vocab, ldw], bf16 or fp16
  int64_t ldw;
  flashspec_dtype w_dtype;
  int32_t vocab;
  int32_t d;              // reduction length
  const void* h;          // staged hidden rows, [*, ldh], same dtype as W
  int64_t ldh;
  int32_t rows;           // rows in this launch
  int32_t row_base;       // first global row
  float* workspace;       // [rows, chunk] fp32
  int32_t chunk;          // tokens per chunk, a multiple of slice_tokens()
  const RowPlan* plans;
  Partial* partials;      // [groups][partial_stride]
  int32_t partial_stride;
};

// What failed, if anything: a CUDA error, or (cuda == cudaSuccess) a cuBLAS
// status named in `what`.
struct Status {
  cudaError_t cuda;
  const char* what;
};

// Tokens per fold CTA; chunks are multiples of it.
int32_t slice_tokens();
// Partials (groups) a scan of `vocab` tokens in chunks of `chunk` writes.
int groups_for(int32_t vocab, int32_t chunk);
// Enqueues the whole scan on `stream`.
Status scan(const Request& request, cudaStream_t stream);

}  // namespace gemm_scan
}  // namespace cuda
}  // namespace flashspec
