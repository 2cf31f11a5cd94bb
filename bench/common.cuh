// What the GPU benchmarks share: checked-call macros that exit with a
// message, fill and read kernels, and the standard materialising verify of
// serving engines (softmax probabilities written, then acceptance, recovered
// and bonus tokens as separate kernels) that FlashSpec is measured against.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "flashspec.h"
#include "util/philox.h"

namespace {

#define CUDA_OK(call)                                                                                  \
  do {                                                                                                 \
    cudaError_t e_ = (call);                                                                           \
    if (e_ != cudaSuccess) {                                                                           \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));      \
      std::exit(1);                                                                                    \
    }                                                                                                  \
  } while (0)
#define CUBLAS_OK(call)                                                                   \
  do {                                                                                    \
    cublasStatus_t s_ = (call);                                                           \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                    \
      std::fprintf(stderr, "%s:%d %s: cuBLAS status %d\n", __FILE__, __LINE__, #call, int(s_)); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)
#define FS_OK(ctx, call)                                                                                   \
  do {                                                                                                     \
    flashspec_status s_ = (call);                                                                          \
    if (s_ != FLASHSPEC_OK) {                                                                              \
      std::fprintf(stderr, "%s:%d %s: %s: %s\n", __FILE__, __LINE__, #call, flashspec_status_name(s_),     \
                   flashspec_context_last_error(ctx));                                                     \
      std::exit(1);                                                                                        \
    }                                                                                                      \
  } while (0)

// The command line both GPU benchmarks take:
//   [--quick] [--only V d rows] [--reps N] [--json FILE]
struct BenchArgs {
  bool quick = false;
  int only_v = 0, only_d = 0, only_rows = 0;  // --only: one shape
  int reps;                                   // at least the benchmark's minimum
  std::string json;                           // written only where --json names it
};

// Parses argv (--reps defaults to default_reps, and is at least min_reps);
// false, after printing the usage, on anything else.
inline bool parse_bench_args(int argc, char** argv, int min_reps, int default_reps, BenchArgs& out) {
  out.reps = std::max(min_reps, default_reps);
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) out.quick = true;
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) out.reps = std::max(min_reps, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) out.json = argv[++i];
    else if (!std::strcmp(argv[i], "--only") && i + 3 < argc) {
      out.only_v = std::atoi(argv[++i]);
      out.only_d = std::atoi(argv[++i]);
      out.only_rows = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--only V d rows] [--reps N>=%d] [--json FILE]\n", argv[0], min_reps);
      return false;
    }
  }
  return true;
}

// ---- helper kernels -------------------------------------------------------

__device__ __forceinline__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return uint32_t(x);
}

// Uniform values in [−scale, scale), bf16.
__global__ void fill_bf16(__nv_bfloat16* p, size_t n, float scale, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float u = float(hash32(seed * 0x9e3779b97f4a7c15ull + i) >> 8) * (1.0f / 16777216.0f);
    p[i] = __float2bfloat16((2.0f * u - 1.0f) * scale);
  }
}

// The read-bandwidth yardstick: 16-byte loads, several in flight, a sum.
__global__ void read_kernel(const uint4* p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride), d = __ldcs(p + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n; i += stride) {
    uint4 a = __ldcs(p + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x12345678u) *sink = acc;
}

// ---- the standard materialising path (separate kernels) -------------------

constexpr int kRowThreads = 1024;

template <class T>
__device__ T block_reduce(T v, T (*op)(T, T), T* shared) {
  for (int m = 16; m > 0; m >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, m));
  if ((threadIdx.x & 31) == 0) shared[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < blockDim.x / 32 ? shared[threadIdx.x] : shared[0];
    for (int m = 16; m > 0; m >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, m));
    if (threadIdx.x == 0) shared[0] = v;
  }
  __syncthreads();
  v = shared[0];
  __syncthreads();
  return v;
}
__device__ float fmax_op(float a, float b) { return fmaxf(a, b); }
__device__ float fadd_op(float a, float b) { return a + b; }

// probs[r] = softmax(logits[r] / T), written out (V % 4 == 0).
__global__ void softmax_kernel(const float* logits, float* probs, int vocab, float inv_t) {
  __shared__ float shared[32];
  const float4* row = reinterpret_cast<const float4*>(logits + size_t(blockIdx.x) * vocab);
  float4* out = reinterpret_cast<float4*>(probs + size_t(blockIdx.x) * vocab);
  const int n4 = vocab / 4;
  float m = -INFINITY;
  for (int i = threadIdx.x; i < n4; i += blockDim.x) {
    float4 v = row[i];
    m = fmaxf(m, fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)) * inv_t);
  }
  m = block_reduce(m, fmax_op, shared);
  float s = 0.0f;
  for (int i = threadIdx.x; i < n4; i += blockDim.x) {
    float4 v = row[i];
    s += __expf(v.x * inv_t - m) + __expf(v.y * inv_t - m) + __expf(v.z * inv_t - m) + __expf(v.w * inv_t - m);
  }
  s = block_reduce(s, fadd_op, shared);
  const float inv_s = 1.0f / s;
  for (int i = threadIdx.x; i < n4; i += blockDim.x) {
    float4 v = row[i];
    out[i] = make_float4(__expf(v.x * inv_t - m) * inv_s, __expf(v.y * inv_t - m) * inv_s,
                         __expf(v.z * inv_t - m) * inv_s, __expf(v.w * inv_t - m) * inv_s);
  }
}

// Per request: accept drafts while u < p(x); accepted counts.
__global__ void accept_kernel(const float* probs, const int32_t* tokens, int requests, int n, int vocab,
                              int32_t* accepted) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= requests) return;
  int a = 0;
  for (int j = 0; j < n; ++j) {
    const int row = r * (n + 1) + j;
    float u = float(flashspec::uniform_from_bits(
        flashspec::row_word(flashspec::make_row_key(1, r, 0, j, FLASHSPEC_RNG_ACCEPT_UNIFORM), 0)));
    if (!(u < probs[size_t(row) * vocab + tokens[r * n + j]])) break;
    ++a;
  }
  accepted[r] = a;
}

// Gumbel-max over log p of one row (excluding `exclude`): the recovered
// token of a draft row, or the bonus token.
__global__ void sample_kernel(const float* probs, const int32_t* tokens, int n, int vocab, int bonus,
                              int32_t* out) {
  __shared__ float best_s[32];
  __shared__ int best_t[32];
  const int k = blockIdx.x;  // draft row index (bonus: request index)
  const int r = bonus ? k : k / n, j = bonus ? n : k % n;
  const int row = r * (n + 1) + j;
  const int exclude = bonus ? -1 : tokens[r * n + j];
  flashspec::RngRowKey key =
      flashspec::make_row_key(1, r, 0, j, bonus ? FLASHSPEC_RNG_BONUS_NOISE : FLASHSPEC_RNG_RESIDUAL_NOISE);
  const float4* p = reinterpret_cast<const float4*>(probs + size_t(row) * vocab);
  float best = -INFINITY;
  int tok = -1;
  for (int i = threadIdx.x; i < vocab / 4; i += blockDim.x) {
    float4 v = p[i];
    flashspec::Philox4 b = flashspec::row_block(key, uint32_t(i));
    float vals[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int t = 4 * i + e;
      if (t == exclude) continue;
      float s = __logf(vals[e]) + flashspec::gumbel_from_bits(b.v[e]);
      if (s > best) {
        best = s;
        tok = t;
      }
    }
  }
  for (int m = 16; m > 0; m >>= 1) {
    float ob = __shfl_xor_sync(0xffffffffu, best, m);
    int ot = __shfl_xor_sync(0xffffffffu, tok, m);
    if (ob > best || (ob == best && ot < tok)) {
      best = ob;
      tok = ot;
    }
  }
  if ((threadIdx.x & 31) == 0) {
    best_s[threadIdx.x >> 5] = best;
    best_t[threadIdx.x >> 5] = tok;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < int(blockDim.x / 32); ++w)
      if (best_s[w] > best) {
        best = best_s[w];
        tok = best_t[w];
      }
    out[k] = tok;
  }
}

// ---- timing: CUDA graphs replayed between CUDA events ----------------------

struct Timer {
  cudaStream_t stream;
  int reps;
  // Median of `reps` replays, rotating over the graphs (one per buffer).
  double median_ms(const std::vector<cudaGraphExec_t>& graphs) {
    for (int w = 0; w < 5; ++w) CUDA_OK(cudaGraphLaunch(graphs[size_t(w) % graphs.size()], stream));
    std::vector<cudaEvent_t> ev(size_t(reps) * 2);
    for (auto& e : ev) CUDA_OK(cudaEventCreate(&e));
    for (int r = 0; r < reps; ++r) {
      CUDA_OK(cudaEventRecord(ev[size_t(2 * r)], stream));
      CUDA_OK(cudaGraphLaunch(graphs[size_t(r) % graphs.size()], stream));
      CUDA_OK(cudaEventRecord(ev[size_t(2 * r + 1)], stream));
    }
    CUDA_OK(cudaStreamSynchronize(stream));
    std::vector<float> ms(static_cast<size_t>(reps));
    for (int r = 0; r < reps; ++r) CUDA_OK(cudaEventElapsedTime(&ms[size_t(r)], ev[size_t(2 * r)], ev[size_t(2 * r + 1)]));
    for (auto& e : ev) cudaEventDestroy(e);
    std::sort(ms.begin(), ms.end());
    return ms[size_t(reps / 2)];
  }
  cudaGraphExec_t capture(const std::function<void()>& body) {
    cudaGraph_t g;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    body();
    CUDA_OK(cudaStreamEndCapture(stream, &g));
    cudaGraphExec_t exec;
    CUDA_OK(cudaGraphInstantiate(&exec, g, 0));
    CUDA_OK(cudaGraphDestroy(g));
    return exec;
  }
};


// What every benchmark times with: the device's properties, a non-blocking
// stream, and a cuBLAS handle on it with a fixed workspace (so CUDA graphs
// capture its GEMMs). Construct it only where flashspec_cuda_device_count()
// found a device.
struct BenchDevice {
  cudaDeviceProp prop{};
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  void* blas_workspace = nullptr;
  static constexpr size_t kBlasWorkspaceBytes = size_t(64) << 20;

  BenchDevice() {
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CUBLAS_OK(cublasCreate(&blas));
    CUBLAS_OK(cublasSetStream(blas, stream));
    CUDA_OK(cudaMalloc(&blas_workspace, kBlasWorkspaceBytes));
    CUBLAS_OK(cublasSetWorkspace(blas, blas_workspace, kBlasWorkspaceBytes));
  }
  BenchDevice(const BenchDevice&) = delete;
  BenchDevice& operator=(const BenchDevice&) = delete;
  ~BenchDevice() {
    cublasDestroy(blas);
    cudaFree(blas_workspace);
    cudaStreamDestroy(stream);
  }
  // The yardstick: logits [rows, vocab] = hidden [rows, d] · Wᵀ, bf16 in,
  // fp32 out and compute, W [vocab, d].
  void gemm(const __nv_bfloat16* w, const __nv_bfloat16* hidden, float* logits, int vocab, int rows, int d) const {
    const float one = 1.0f, zero = 0.0f;
    CUBLAS_OK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, vocab, rows, d, &one, w, CUDA_R_16BF, d, hidden,
                           CUDA_R_16BF, d, &zero, logits, CUDA_R_32F, vocab, CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT));
  }
};

// The verify batch of `rows` rows the benchmarks time: rows % 4 == 0 →
// rows/4 requests of 3 drafts; else one request of rows − 1 drafts; draft
// tokens spread over the vocabulary. Device copies of the offsets and
// tokens, and room for the accepted counts and emitted tokens.
struct BenchBatch {
  int rows, drafts_per_request, requests;
  int32_t *offsets = nullptr, *tokens = nullptr, *accepted = nullptr, *emitted = nullptr;

  BenchBatch(int rows_, int vocab) : rows(rows_) {
    drafts_per_request = rows % 4 == 0 ? 3 : rows - 1;
    requests = rows / (drafts_per_request + 1);
    std::vector<int32_t> host_offsets(size_t(requests) + 1), host_tokens(size_t(std::max(1, requests * drafts_per_request)));
    for (int r = 0; r <= requests; ++r) host_offsets[size_t(r)] = r * drafts_per_request;
    for (size_t k = 0; k < host_tokens.size(); ++k) host_tokens[k] = int32_t((k * 2654435761u) % uint32_t(vocab));
    CUDA_OK(cudaMalloc(&offsets, host_offsets.size() * 4));
    CUDA_OK(cudaMalloc(&tokens, host_tokens.size() * 4));
    CUDA_OK(cudaMalloc(&accepted, size_t(requests) * 4));
    CUDA_OK(cudaMalloc(&emitted, size_t(rows) * 4));
    CUDA_OK(cudaMemcpy(offsets, host_offsets.data(), host_offsets.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(tokens, host_tokens.data(), host_tokens.size() * 4, cudaMemcpyHostToDevice));
  }
  BenchBatch(const BenchBatch&) = delete;
  BenchBatch& operator=(const BenchBatch&) = delete;
  ~BenchBatch() {
    for (void* p : {static_cast<void*>(offsets), static_cast<void*>(tokens), static_cast<void*>(accepted),
                    static_cast<void*>(emitted)})
      cudaFree(p);
  }
  // The batch over `hidden` ([rows, d] in device memory) at the default
  // temperature, and the result of its accepted counts and emitted tokens.
  flashspec_verify_batch batch(const flashspec_tensor* hidden) const {
    flashspec_verify_batch b;
    flashspec_verify_batch_init(&b);
    b.memory = FLASHSPEC_MEMORY_CUDA;
    b.num_requests = requests;
    b.draft_offsets = offsets;
    b.draft_tokens = tokens;
    b.target_hidden = hidden;
    b.max_draft_len = std::max(1, drafts_per_request);
    return b;
  }
  flashspec_verify_result result() const {
    flashspec_verify_result r;
    flashspec_verify_result_init(&r);
    r.memory = FLASHSPEC_MEMORY_CUDA;
    r.accepted_counts = accepted;
    r.emitted_tokens = emitted;
    return r;
  }
};

}  // namespace
