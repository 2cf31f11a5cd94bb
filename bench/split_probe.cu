// How the split of a streaming read over one-CTA-per-SM grids bears on the
// HBM bandwidth it gets: the question behind the weight-streaming scans'
// fixed token range per CTA (bench/RESULTS.md, "The split of W over the
// CTAs"). Each layout reads the same buffer (far larger than L2) once per
// call; the bench prints the median call (a CUDA graph replayed `--reps`
// times), the bandwidth, and the ratio to the aligned static split, which is
// what the scans do (16-token tiles of whole rows). Layouts:
//
//   static, 16-byte bounds   CTA c reads [c·n/C, (c+1)·n/C) of n 16-byte words
//   static, aligned          the same bounds rounded down to 1 KB
//   static, aligned, by SM   the range of slot %smid (claimed once per SM)
//   weighted, by SM          slot %smid's range 9/8 as long on the SMs that
//                            finished first in the static split (measured here)
//   dynamic, 1 MB            1 MB chunks claimed with an atomic counter
//
// Also, from each SM's mean CTA time over `reps` calls of the aligned static
// split: the least, median and largest, and the SMs more than 4 % faster
// than the median (those the weighted layout favours). Usage:
// flashspec_split_probe [--reps N] [--threads N].
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common.cuh"

namespace {

__device__ __forceinline__ unsigned sm_id() {
  unsigned r;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t r;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(r));
  return r;
}

// Reads 16-byte words [begin, end) with the block's threads, eight loads in
// flight per thread; returns their XOR (kept live through `sink`).
__device__ __forceinline__ unsigned read_range(const uint4* p, size_t begin, size_t end) {
  unsigned acc = 0;
  const size_t step = blockDim.x;
  size_t i = begin + threadIdx.x;
  for (; i + 7 * step < end; i += 8 * step) {
    uint4 v[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = __ldcs(p + i + k * step);
#pragma unroll
    for (int k = 0; k < 8; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  }
  for (; i < end; i += step) {
    const uint4 a = __ldcs(p + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  return acc;
}

// The slot of this CTA: its SM's (%smid) when free, else the first free one,
// so that every slot is read once whatever the placement. `claimed` is zeroed
// before each call.
__device__ int claim_slot(int* claimed) {
  __shared__ int slot;
  if (threadIdx.x == 0) {
    int s = int(sm_id());
    if (s >= int(gridDim.x) || atomicExch(claimed + s, 1) != 0)
      for (s = 0; atomicExch(claimed + s, 1) != 0; ++s) {
      }
    slot = s;
  }
  __syncthreads();
  return slot;
}

enum Layout { kStaticWords, kStaticAligned, kStaticBySm, kWeightedBySm };

// A static split: slot `s` (blockIdx or claimed) reads words [bound(s),
// bound(s + 1)) with bounds from `cum` (prefix sums of the slots' weights;
// aligned layouts round them to 1 KB). `ends`: [smid, ns] per CTA.
__global__ void static_read(const uint4* p, size_t n, Layout layout, const int64_t* cum, int* claimed,
                            unsigned* sink, uint64_t* ends) {
  const bool by_sm = layout == kStaticBySm || layout == kWeightedBySm;
  const int slot = by_sm ? claim_slot(claimed) : int(blockIdx.x);
  const uint64_t t0 = global_ns();
  size_t begin, end;
  if (layout == kStaticWords) {
    begin = size_t(slot) * n / gridDim.x;
    end = size_t(slot + 1) * n / gridDim.x;
  } else {
    const size_t kilobytes = n / 64, total = size_t(cum[gridDim.x]);
    begin = size_t(cum[slot]) * kilobytes / total * 64;
    end = slot + 1 == int(gridDim.x) ? n : size_t(cum[slot + 1]) * kilobytes / total * 64;
  }
  const unsigned acc = read_range(p, begin, end);
  __syncthreads();
  if (threadIdx.x == 0) {
    ends[2 * blockIdx.x] = sm_id();
    ends[2 * blockIdx.x + 1] = global_ns() - t0;
  }
  if (acc == 0x12345678u) *sink = acc;
}

// 1 MB chunks taken in turn by whichever CTA asks next.
__global__ void dynamic_read(const uint4* p, size_t n, size_t chunk, unsigned* counter, unsigned* sink) {
  __shared__ unsigned next;
  unsigned acc = 0;
  const size_t chunks = (n + chunk - 1) / chunk;
  for (;;) {
    if (threadIdx.x == 0) next = atomicAdd(counter, 1u);
    __syncthreads();
    const unsigned c = next;
    __syncthreads();
    if (c >= chunks) break;
    acc ^= read_range(p, c * chunk, std::min(n, (c + 1) * chunk));
  }
  if (acc == 0x12345678u) *sink = acc;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 30, threads = 1024;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 < argc && !std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (i + 1 < argc && !std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [--reps N] [--threads N]\n", argv[0]);
      return 2;
    }
  }
  if (reps < 1 || threads < 32 || threads > 1024 || threads % 32) {
    std::fprintf(stderr, "--reps must be ≥ 1 and --threads a multiple of 32 in [32, 1024]\n");
    return 2;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "no CUDA device: nothing to measure\n");
    return 1;
  }
  const BenchDevice device;
  const int sms = device.prop.multiProcessorCount;
  Timer timer{device.stream, reps};
  std::printf("device: %s (%d SMs), one CTA of %d threads per SM, median of %d calls\n", device.prop.name, sms,
              threads, reps);

  const size_t max_bytes = size_t(4) << 30;
  uint4* buf;
  unsigned *sink, *counter;
  int* claimed;
  int64_t* cum;
  uint64_t* ends;
  CUDA_OK(cudaMalloc(&buf, max_bytes));
  CUDA_OK(cudaMemset(buf, 1, max_bytes));
  CUDA_OK(cudaMalloc(&sink, sizeof(unsigned)));
  CUDA_OK(cudaMalloc(&counter, sizeof(unsigned)));
  CUDA_OK(cudaMalloc(&claimed, sizeof(int) * size_t(sms)));
  CUDA_OK(cudaMalloc(&cum, sizeof(int64_t) * size_t(sms + 1)));
  CUDA_OK(cudaMalloc(&ends, 2 * sizeof(uint64_t) * size_t(sms)));
  cudaStream_t stream = device.stream;

  auto set_weights = [&](const std::vector<int64_t>& weights) {
    std::vector<int64_t> prefix(size_t(sms) + 1, 0);
    for (int s = 0; s < sms; ++s) prefix[size_t(s) + 1] = prefix[size_t(s)] + weights[size_t(s)];
    CUDA_OK(cudaMemcpy(cum, prefix.data(), prefix.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
  };
  auto time_static = [&](size_t n, Layout layout) {
    cudaGraphExec_t g = timer.capture([&] {
      CUDA_OK(cudaMemsetAsync(claimed, 0, sizeof(int) * size_t(sms), stream));
      static_read<<<sms, threads, 0, stream>>>(buf, n, layout, cum, claimed, sink, ends);
    });
    const double ms = timer.median_ms({g});
    CUDA_OK(cudaGraphExecDestroy(g));
    return ms;
  };

  for (const size_t bytes : {size_t(1050) << 20, size_t(2100) << 20, max_bytes}) {
    const size_t n = bytes / 16;
    set_weights(std::vector<int64_t>(size_t(sms), 8));
    // Each SM's CTA time in the aligned static split, over `reps` calls.
    std::vector<double> sm_us(size_t(sms), 0.0);
    for (int r = 0; r < reps; ++r) {
      CUDA_OK(cudaMemsetAsync(claimed, 0, sizeof(int) * size_t(sms), stream));
      static_read<<<sms, threads, 0, stream>>>(buf, n, kStaticAligned, cum, claimed, sink, ends);
      std::vector<uint64_t> h(2 * size_t(sms));
      CUDA_OK(cudaMemcpyAsync(h.data(), ends, h.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost, stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      for (int c = 0; c < sms; ++c) sm_us[size_t(h[2 * size_t(c)])] += double(h[2 * size_t(c) + 1]) * 1e-3 / reps;
    }
    std::vector<double> sorted = sm_us;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[size_t(sms) / 2];
    std::printf("\n%zu MB: a CTA's time in the aligned static split min %.1f median %.1f max %.1f us; SMs > 4 %% faster:",
                bytes >> 20, sorted.front(), median, sorted.back());
    std::vector<int64_t> weights(size_t(sms), 8);
    for (int s = 0; s < sms; ++s)
      if (sm_us[size_t(s)] < 0.96 * median) {
        weights[size_t(s)] = 9;
        std::printf(" %d", s);
      }
    std::printf("\n");

    const double aligned = time_static(n, kStaticAligned);
    auto report = [&](const char* name, double ms) {
      std::printf("  %-28s %8.1f us %6.0f GB/s  ÷ aligned static %.3f\n", name, ms * 1e3, double(bytes) / (ms * 1e-3) / 1e9,
                  ms / aligned);
    };
    report("static, 16-byte bounds", time_static(n, kStaticWords));
    report("static, aligned", aligned);
    report("static, aligned, by SM", time_static(n, kStaticBySm));
    set_weights(weights);
    report("weighted 9/8, by SM", time_static(n, kWeightedBySm));
    cudaGraphExec_t g = timer.capture([&] {
      CUDA_OK(cudaMemsetAsync(counter, 0, sizeof(unsigned), stream));
      dynamic_read<<<sms, threads, 0, stream>>>(buf, n, (size_t(1) << 20) / 16, counter, sink);
    });
    report("dynamic, 1 MB chunks", timer.median_ms({g}));
    CUDA_OK(cudaGraphExecDestroy(g));
  }
  CUDA_OK(cudaFree(buf));
  CUDA_OK(cudaFree(sink));
  CUDA_OK(cudaFree(counter));
  CUDA_OK(cudaFree(claimed));
  CUDA_OK(cudaFree(cum));
  CUDA_OK(cudaFree(ends));
  return 0;
}
