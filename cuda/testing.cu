#include "testing.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstring>

#include "codes.cuh"
#include "device_storage.h"
#include "dispatch.h"
#include "util/philox.h"

namespace flashspec {
namespace cuda {

void serve_ring_scans_everywhere(bool on) { set_stream_rings_everywhere(on); }

void serve_many_rows_by_chunks(bool on) { set_many_row_chunks_only(on); }

bool read_summaries(const SummaryStore& store, int32_t rows, RowSummary* out) {
  if (store.backend != FLASHSPEC_BACKEND_CUDA || rows > store.max_rows) return false;
  const auto& s = static_cast<const CudaSummaries&>(store);
  if (cudaSetDevice(store.device) != cudaSuccess) return false;
  if (cudaDeviceSynchronize() != cudaSuccess) return false;
  return cudaMemcpy(out, s.rows.as<RowSummary>(), size_t(rows) * sizeof(RowSummary), cudaMemcpyDeviceToHost) ==
         cudaSuccess;
}

namespace {

// Blocks of 256 threads, each thread 64 words: 2^32 words in 2^18 blocks.
constexpr int kBoundThreads = 256;
constexpr uint32_t kWordsPerThread = 64;

__global__ void gumbel_bounds_kernel(const float* bounds, unsigned long long* violations, int* closest_bits) {
  __shared__ float b[256];
  b[threadIdx.x] = bounds[threadIdx.x];
  __syncthreads();
  const uint32_t first = (uint32_t(blockIdx.x) * kBoundThreads + threadIdx.x) * kWordsPerThread;
  unsigned long long bad = 0;
  float closest = INFINITY;
  for (uint32_t i = 0; i < kWordsPerThread; ++i) {
    const uint32_t word = first + i;
    const float margin = b[word >> 24] - gumbel_from_bits(word);
    bad += !(margin >= 0.0f);
    closest = fminf(closest, margin);
  }
  if (bad) atomicAdd(violations, bad);
  // Margins ≥ 0 order as the ints of their bits; violations are counted
  // above and leave 0 here.
  atomicMin(closest_bits, __float_as_int(fmaxf(closest, 0.0f)));
}

template <flashspec_dtype kW>
__global__ void convert_every_code_kernel(float* as_bf16, float* as_f16) {
  const uint32_t word = 0x01010101u * threadIdx.x;  // four copies of code threadIdx.x
  uint32_t b_lo, b_hi, h_lo, h_hi;
  codes_to_bf16x2<kW>(word, b_lo, b_hi);
  codes_to_f16x2<kW>(word, h_lo, h_hi);
  // Every pair holds the code twice: a lane that differs from the first
  // reads as NaN, which no code's value is.
  const uint32_t b[2] = {b_lo, b_hi}, h[2] = {h_lo, h_hi};
  float bf = __uint_as_float((b_lo & 0xffffu) << 16), hf = __half2float(__ushort_as_half(uint16_t(h_lo)));
  for (uint32_t pair : b)
    for (uint32_t lane : {pair & 0xffffu, pair >> 16})
      if (lane != (b_lo & 0xffffu)) bf = __int_as_float(0x7fc00000);
  for (uint32_t pair : h)
    for (uint32_t lane : {pair & 0xffffu, pair >> 16})
      if (lane != (h_lo & 0xffffu)) hf = __int_as_float(0x7fc00000);
  as_bf16[threadIdx.x] = bf;
  as_f16[threadIdx.x] = hf;
}

}  // namespace

bool convert_every_code(flashspec_dtype dtype, float* as_bf16, float* as_f16) {
  if (dtype != FLASHSPEC_DTYPE_E4M3 && dtype != FLASHSPEC_DTYPE_I8) return false;
  float* d = nullptr;
  bool ok = cudaMalloc(&d, 512 * sizeof(float)) == cudaSuccess;
  if (ok) {
    if (dtype == FLASHSPEC_DTYPE_E4M3) convert_every_code_kernel<FLASHSPEC_DTYPE_E4M3><<<1, 256>>>(d, d + 256);
    else convert_every_code_kernel<FLASHSPEC_DTYPE_I8><<<1, 256>>>(d, d + 256);
    ok = cudaGetLastError() == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess &&
         cudaMemcpy(as_bf16, d, 256 * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess &&
         cudaMemcpy(as_f16, d + 256, 256 * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess;
  }
  cudaFree(d);
  return ok;
}

bool check_gumbel_bounds(const float* bounds, uint64_t* violations, float* closest) {
  float* d_bounds = nullptr;
  unsigned long long* d_bad = nullptr;
  int* d_closest = nullptr;
  const int inf_bits = 0x7f800000;
  bool ok = cudaMalloc(&d_bounds, 256 * sizeof(float)) == cudaSuccess &&
            cudaMalloc(&d_bad, sizeof *d_bad) == cudaSuccess &&
            cudaMalloc(&d_closest, sizeof *d_closest) == cudaSuccess;
  ok = ok && cudaMemcpy(d_bounds, bounds, 256 * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess &&
       cudaMemset(d_bad, 0, sizeof *d_bad) == cudaSuccess &&
       cudaMemcpy(d_closest, &inf_bits, sizeof inf_bits, cudaMemcpyHostToDevice) == cudaSuccess;
  if (ok) {
    const unsigned blocks = unsigned((uint64_t(1) << 32) / (uint64_t(kBoundThreads) * kWordsPerThread));
    gumbel_bounds_kernel<<<blocks, kBoundThreads>>>(d_bounds, d_bad, d_closest);
    unsigned long long bad = 0;
    int closest_bits = 0;
    ok = cudaGetLastError() == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess &&
         cudaMemcpy(&bad, d_bad, sizeof bad, cudaMemcpyDeviceToHost) == cudaSuccess &&
         cudaMemcpy(&closest_bits, d_closest, sizeof closest_bits, cudaMemcpyDeviceToHost) == cudaSuccess;
    *violations = bad;
    std::memcpy(closest, &closest_bits, sizeof *closest);
  }
  cudaFree(d_bounds);
  cudaFree(d_bad);
  cudaFree(d_closest);
  return ok;
}

}  // namespace cuda
}  // namespace flashspec
