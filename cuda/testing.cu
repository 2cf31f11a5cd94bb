#include "testing.h"

#include <cuda_runtime.h>

#include <cstring>

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

}  // namespace

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
