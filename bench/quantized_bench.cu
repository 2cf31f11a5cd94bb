// 8-bit LM heads against bf16 (flashspec_lm_head_create_quantized).
//
// Per shape (V, d, rows) it measures, in one run on one card:
//   gemm       cuBLAS logits of the bf16 head alone (bf16 in, fp32 out)
//   verify     flashspec_verify_and_finalize on the bf16 head (greedy drafts, T = 1)
//   e4m3, int8 the same verify on an 8-bit head of the same shape
//   e4m3_g, int8_g  flashspec_draft, greedy, on the e4m3 and int8 heads
// and prints each over gemm. The 8-bit heads hold pre-quantised codes in
// device memory (BORROW) with one scale per row, as a serving engine loads
// them; each op is a CUDA graph, timed as the median of --reps replays,
// rotating over ≥ 2 weight buffers per dtype where they fit so the L2 holds
// no W.
//
// Usage: flashspec_quantized_bench [--quick] [--only V d rows] [--reps N] [--json FILE]
// (--only: rows up to 512; the grid's rows are 1–64)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "../tests/common/context.h"
#include "common.cuh"
#include "flashspec.h"

namespace {

// Random 8-bit codes: int8 in [−127, 127]; e4m3 any finite code.
__global__ void fill_codes(uint8_t* p, size_t n, bool e4m3, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t c = hash32(seed * 0x9e3779b97f4a7c15ull + i) & 0xffu;
    if (e4m3) {
      c &= 0xbfu;  // magnitudes up to 2^0.875 · 2: logits of a few units after the scale
    } else if (c == 0x80u) {
      c = 0x81u;
    }
    p[i] = uint8_t(c);
  }
}

__global__ void fill_scales(float* p, int n, float scale) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = scale;
}

struct Result {
  int vocab, d, rows;
  double gemm_ms, verify_ms, e4m3_ms, int8_ms, e4m3_greedy_ms, int8_greedy_ms;
};

}  // namespace

int main(int argc, char** argv) {
  BenchArgs args;
  if (!parse_bench_args(argc, argv, 50, 50, args)) return 2;
  if (flashspec_cuda_device_count() == 0) {
    std::fprintf(stderr, "no CUDA device: nothing to measure\n");
    return 1;
  }
  const BenchDevice device;
  const cudaDeviceProp& prop = device.prop;
  cudaStream_t stream = device.stream;
  Timer timer{stream, args.reps};

  std::vector<int> vocabs = args.quick ? std::vector<int>{128256} : std::vector<int>{32000, 128256, 151936, 262144};
  std::vector<int> hiddens = args.quick ? std::vector<int>{4096} : std::vector<int>{2048, 4096, 8192};
  std::vector<int> row_counts = args.quick ? std::vector<int>{1, 16, 64} : std::vector<int>{1, 2, 5, 9, 16, 64};
  // The grid's context takes up to 64 rows; --only up to kMaxOnlyRows, in
  // a context of that many (the 8-bit tile scan's 128-row tiles).
  constexpr int kGridRows = 64, kMaxOnlyRows = 512;
  int max_rows = kGridRows;
  if (args.only_v > 0) {
    vocabs = {args.only_v};
    hiddens = {args.only_d};
    row_counts = {std::min(kMaxOnlyRows, std::max(1, args.only_rows))};
    max_rows = std::max(kGridRows, row_counts[0]);
  }
  std::printf("device: %s (%d SMs)\n", prop.name, prop.multiProcessorCount);

  const auto options = fstest::ContextOptions(FLASHSPEC_BACKEND_CUDA)
                           .cuda_stream(stream)
                           .max_rows(max_rows)
                           .max_requests(max_rows)
                           .seed(1);
  flashspec_context* ctx = nullptr;
  FS_OK(nullptr, fstest::create_context(options, &ctx));

  std::vector<Result> results;
  for (int vocab : vocabs)
    for (int d : hiddens) {
      const size_t elements = size_t(vocab) * size_t(d);
      size_t free_b = 0, total_b = 0;
      CUDA_OK(cudaMemGetInfo(&free_b, &total_b));
      const size_t other = size_t(max_rows) * vocab * 4 + (size_t(1) << 30);
      // Buffers per dtype: bf16 (2 bytes), e4m3 and int8 (1 byte each).
      const int buffers =
          std::max(1, int(std::min<size_t>(3, (free_b > other ? free_b - other : 0) / (elements * 4))));
      std::vector<void*> memory;
      std::vector<flashspec_lm_head*> bf16_heads, e4m3_heads, int8_heads;
      std::vector<__nv_bfloat16*> bf16_weights;
      const float w_scale = 3.0f * std::sqrt(3.0f / float(d));
      float* scales;
      CUDA_OK(cudaMalloc(&scales, size_t(vocab) * 4));
      memory.push_back(scales);
      for (int b = 0; b < buffers; ++b) {
        __nv_bfloat16* w;
        CUDA_OK(cudaMalloc(&w, elements * 2));
        memory.push_back(w);
        bf16_weights.push_back(w);
        fill_bf16<<<4096, 256, 0, stream>>>(w, elements, w_scale, 100 + b);
        flashspec_tensor wt = flashspec_tensor_make(w, FLASHSPEC_DTYPE_BF16, FLASHSPEC_MEMORY_CUDA, vocab, d);
        flashspec_lm_head* head;
        FS_OK(ctx, flashspec_lm_head_create(ctx, &wt, FLASHSPEC_LM_HEAD_BORROW, &head));
        bf16_heads.push_back(head);
        for (bool e4m3 : {true, false}) {
          uint8_t* codes;
          CUDA_OK(cudaMalloc(&codes, elements));
          memory.push_back(codes);
          fill_codes<<<4096, 256, 0, stream>>>(codes, elements, e4m3, 200 + b);
          fill_scales<<<256, 256, 0, stream>>>(scales, vocab, e4m3 ? w_scale / 2.0f : w_scale / 127.0f);
          CUDA_OK(cudaStreamSynchronize(stream));
          const flashspec_dtype dtype = e4m3 ? FLASHSPEC_DTYPE_E4M3 : FLASHSPEC_DTYPE_I8;
          flashspec_tensor ct = flashspec_tensor_make(codes, dtype, FLASHSPEC_MEMORY_CUDA, vocab, d);
          flashspec_tensor st = flashspec_tensor_make(scales, FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_CUDA, vocab, 1);
          FS_OK(ctx, flashspec_lm_head_create_quantized(ctx, &ct, &st, dtype, FLASHSPEC_LM_HEAD_BORROW, &head));
          (e4m3 ? e4m3_heads : int8_heads).push_back(head);
        }
      }
      __nv_bfloat16* hidden;
      float* logits;
      CUDA_OK(cudaMalloc(&hidden, size_t(max_rows) * d * 2));
      CUDA_OK(cudaMalloc(&logits, size_t(max_rows) * vocab * 4));
      fill_bf16<<<1024, 256, 0, stream>>>(hidden, size_t(max_rows) * d, std::sqrt(3.0f), 7);
      CUDA_OK(cudaStreamSynchronize(stream));

      for (int rows : row_counts) {
        const BenchBatch batch(rows, vocab);
        int32_t* d_out;
        float* d_scores;
        CUDA_OK(cudaMalloc(&d_out, size_t(rows) * 4));
        CUDA_OK(cudaMalloc(&d_scores, size_t(rows) * 4));
        flashspec_tensor hv = flashspec_tensor_make(hidden, FLASHSPEC_DTYPE_BF16, FLASHSPEC_MEMORY_CUDA, rows, d);
        auto verify_on = [&](flashspec_lm_head* head) {
          const flashspec_verify_batch b = batch.batch(&hv);
          flashspec_verify_result res = batch.result();
          FS_OK(ctx, flashspec_verify_and_finalize(ctx, head, &b, &res));
        };
        std::vector<cudaGraphExec_t> gemm, verify, e4m3, int8, e4m3_greedy, int8_greedy;
        auto greedy_draft_on = [&](flashspec_lm_head* head) {
          flashspec_draft_params p;
          flashspec_draft_params_init(&p);
          p.memory = FLASHSPEC_MEMORY_CUDA;
          p.temperature = 0.0f;
          FS_OK(ctx, flashspec_draft(ctx, head, &hv, &p, d_out, d_scores));
        };
        for (int b = 0; b < buffers; ++b) {
          gemm.push_back(timer.capture([&] { device.gemm(bf16_weights[size_t(b)], hidden, logits, vocab, rows, d); }));
          verify.push_back(timer.capture([&] { verify_on(bf16_heads[size_t(b)]); }));
          e4m3.push_back(timer.capture([&] { verify_on(e4m3_heads[size_t(b)]); }));
          int8.push_back(timer.capture([&] { verify_on(int8_heads[size_t(b)]); }));
          e4m3_greedy.push_back(timer.capture([&] { greedy_draft_on(e4m3_heads[size_t(b)]); }));
          int8_greedy.push_back(timer.capture([&] { greedy_draft_on(int8_heads[size_t(b)]); }));
        }
        Result r{vocab, d, rows, timer.median_ms(gemm), timer.median_ms(verify), timer.median_ms(e4m3),
                 timer.median_ms(int8), timer.median_ms(e4m3_greedy), timer.median_ms(int8_greedy)};
        results.push_back(r);
        std::printf("V=%6d d=%5d rows=%3d | gemm %.4f verify %.4f e4m3 %.4f int8 %.4f e4m3_g %.4f int8_g %.4f ms | "
                    "verify/gemm %.3f e4m3/gemm %.3f int8/gemm %.3f e4m3_g/gemm %.3f int8_g/gemm %.3f\n",
                    vocab, d, rows, r.gemm_ms, r.verify_ms, r.e4m3_ms, r.int8_ms, r.e4m3_greedy_ms, r.int8_greedy_ms,
                    r.verify_ms / r.gemm_ms, r.e4m3_ms / r.gemm_ms, r.int8_ms / r.gemm_ms,
                    r.e4m3_greedy_ms / r.gemm_ms, r.int8_greedy_ms / r.gemm_ms);
        std::fflush(stdout);
        for (auto* list : {&gemm, &verify, &e4m3, &int8, &e4m3_greedy, &int8_greedy})
          for (auto g : *list) cudaGraphExecDestroy(g);
        cudaFree(d_out);
        cudaFree(d_scores);
      }
      for (auto* list : {&bf16_heads, &e4m3_heads, &int8_heads})
        for (auto* h : *list) flashspec_lm_head_destroy(h);
      for (void* p : memory) cudaFree(p);
      cudaFree(hidden);
      cudaFree(logits);
    }

  std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  FILE* f = args.json.empty() ? nullptr : std::fopen(args.json.c_str(), "w");
  if (!args.json.empty() && !f) std::fprintf(stderr, "cannot write %s\n", args.json.c_str());
  if (f) {
    std::fprintf(f, "{\n  \"device\": \"%s\",\n  \"date\": \"%s\",\n  \"reps\": %d,\n  \"results\": [\n", prop.name,
                 date, args.reps);
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      std::fprintf(f,
                   "    {\"V\": %d, \"d\": %d, \"rows\": %d, \"gemm_ms\": %.5f, \"verify_ms\": %.5f, "
                   "\"e4m3_verify_ms\": %.5f, \"int8_verify_ms\": %.5f, \"e4m3_draft_greedy_ms\": %.5f, "
                   "\"int8_draft_greedy_ms\": %.5f, \"verify_over_gemm\": %.4f, \"e4m3_over_gemm\": %.4f, "
                   "\"int8_over_gemm\": %.4f, \"e4m3_greedy_over_gemm\": %.4f, \"int8_greedy_over_gemm\": %.4f}%s\n",
                   r.vocab, r.d, r.rows, r.gemm_ms, r.verify_ms, r.e4m3_ms, r.int8_ms, r.e4m3_greedy_ms,
                   r.int8_greedy_ms, r.verify_ms / r.gemm_ms, r.e4m3_ms / r.gemm_ms, r.int8_ms / r.gemm_ms,
                   r.e4m3_greedy_ms / r.gemm_ms, r.int8_greedy_ms / r.gemm_ms, i + 1 < results.size() ? "," : "");
    }
    std::fprintf(f, "  ]\n}\n");
    std::fclose(f);
  }
  flashspec_context_destroy(ctx);
  return 0;
}
