// The cost of sampling controls and logprobs in the fused verify (bf16 LM
// heads), against the plain-temperature verify and the cuBLAS GEMM, in one
// run on one card.
//
// Per shape (V, d, rows) it measures:
//   gemm       cuBLAS logits alone (bf16 in, fp32 out, fp32 compute)
//   plain      flashspec_verify_and_finalize, T = 0.8, no controls
//   chain      llama.cpp's default chain: top-k 40, top-p 0.95, min-p 0.05, T = 0.8
//   logprobs   the chain, returning the emitted tokens' logprobs and the top 5
//   top_p      top-p 0.9 alone, captured: the kept set is found among the
//              best FLASHSPEC_MAX_TOP_K tokens (a captured call refuses
//              requests whose kept set is larger)
// and, for top_p, the fraction of requests whose kept set was larger than
// the candidate list on these logits (the requests an eager call continues
// in two more passes over W). Each op is captured into a CUDA graph per
// weight buffer; replays are timed with CUDA events (median of --reps),
// rotating over weight buffers so the L2 holds no W. Two more columns time
// eager calls on the host clock, each call then a stream synchronise
// (median of --reps): plain_eager (no controls) and top_p_eager (top-p 0.9,
// continuing the requests beyond the list).
//
// Usage: flashspec_controls_bench [--quick] [--only V d rows] [--reps N] [--json FILE]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "../tests/common/context.h"
#include "common.cuh"
#include "flashspec.h"

namespace {

struct Row {
  int vocab, d, rows;
  double gemm, plain, chain, logprobs, top_p, beyond, plain_eager, top_p_eager;
};

// Device arrays of one controls struct, every request alike.
struct Controls {
  int32_t* top_k = nullptr;
  float *top_p = nullptr, *min_p = nullptr;
  flashspec_sampling_controls view;
  Controls(int requests, int k, float p, float min_p_value) {
    flashspec_sampling_controls_init(&view);
    if (k > 0) {
      std::vector<int32_t> v(size_t(requests), k);
      CUDA_OK(cudaMalloc(&top_k, v.size() * 4));
      CUDA_OK(cudaMemcpy(top_k, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
      view.top_k = top_k;
    }
    if (p < 1.0f) {
      std::vector<float> v(size_t(requests), p);
      CUDA_OK(cudaMalloc(&top_p, v.size() * 4));
      CUDA_OK(cudaMemcpy(top_p, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
      view.top_p = top_p;
    }
    if (min_p_value > 0.0f) {
      std::vector<float> v(size_t(requests), min_p_value);
      CUDA_OK(cudaMalloc(&min_p, v.size() * 4));
      CUDA_OK(cudaMemcpy(min_p, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
      view.min_p = min_p;
    }
  }
  ~Controls() {
    cudaFree(top_k);
    cudaFree(top_p);
    cudaFree(min_p);
  }
};

}  // namespace

int main(int argc, char** argv) {
  BenchArgs args;
  if (!parse_bench_args(argc, argv, 20, 50, args)) return 2;
  if (flashspec_cuda_device_count() == 0) {
    std::fprintf(stderr, "no CUDA device: nothing to measure\n");
    return 1;
  }
  const BenchDevice device;
  const cudaDeviceProp& prop = device.prop;
  cudaStream_t stream = device.stream;
  Timer timer{stream, args.reps};

  std::vector<int> vocabs = args.quick ? std::vector<int>{128256} : std::vector<int>{128256, 151936, 262144};
  std::vector<int> hiddens = args.quick ? std::vector<int>{4096} : std::vector<int>{4096, 8192};
  std::vector<int> row_counts = args.quick ? std::vector<int>{1, 5, 16, 64} : std::vector<int>{1, 2, 5, 9, 16, 64};
  const int max_rows = 64;
  if (args.only_v > 0) {
    vocabs = {args.only_v};
    hiddens = {args.only_d};
    row_counts = {std::min(max_rows, std::max(1, args.only_rows))};
  }
  std::printf("device: %s (%d SMs)\n", prop.name, prop.multiProcessorCount);
  const auto options = fstest::ContextOptions(FLASHSPEC_BACKEND_CUDA)
                           .cuda_stream(stream)
                           .max_rows(max_rows)
                           .max_requests(max_rows)
                           .seed(1);
  flashspec_context* ctx = nullptr;
  FS_OK(nullptr, fstest::create_context(options, &ctx));

  std::vector<Row> results;
  for (int vocab : vocabs)
    for (int d : hiddens) {
      const size_t w_bytes = size_t(vocab) * size_t(d) * 2;
      size_t free_b = 0, total_b = 0;
      CUDA_OK(cudaMemGetInfo(&free_b, &total_b));
      const size_t other = size_t(max_rows) * vocab * 4 + (size_t(1) << 30);
      const int buffers = std::max(1, int(std::min<size_t>(3, (free_b > other ? free_b - other : 0) / w_bytes)));
      std::vector<__nv_bfloat16*> weights(static_cast<size_t>(buffers));
      std::vector<flashspec_lm_head*> heads(static_cast<size_t>(buffers));
      const float w_scale = 3.0f * std::sqrt(3.0f / float(d));  // logits of a few units
      for (int b = 0; b < buffers; ++b) {
        CUDA_OK(cudaMalloc(&weights[size_t(b)], w_bytes));
        fill_bf16<<<4096, 256, 0, stream>>>(weights[size_t(b)], w_bytes / 2, w_scale, 100 + b);
        flashspec_tensor wt =
            flashspec_tensor_make(weights[size_t(b)], FLASHSPEC_DTYPE_BF16, FLASHSPEC_MEMORY_CUDA, vocab, d);
        FS_OK(ctx, flashspec_lm_head_create(ctx, &wt, FLASHSPEC_LM_HEAD_BORROW, &heads[size_t(b)]));
      }
      __nv_bfloat16* hidden;
      float* logits;
      CUDA_OK(cudaMalloc(&hidden, size_t(max_rows) * d * 2));
      CUDA_OK(cudaMalloc(&logits, size_t(max_rows) * vocab * 4));
      fill_bf16<<<1024, 256, 0, stream>>>(hidden, size_t(max_rows) * d, std::sqrt(3.0f), 7);
      CUDA_OK(cudaStreamSynchronize(stream));

      for (int rows : row_counts) {
        const BenchBatch batch(rows, vocab);
        const int requests = batch.requests;
        std::vector<float> temps(size_t(requests), 0.8f);
        int32_t* d_top;
        float *d_temps, *d_lp, *d_raw, *d_toplp;
        CUDA_OK(cudaMalloc(&d_temps, size_t(requests) * 4));
        CUDA_OK(cudaMalloc(&d_lp, size_t(rows) * 4));
        CUDA_OK(cudaMalloc(&d_raw, size_t(rows) * 4));
        CUDA_OK(cudaMalloc(&d_top, size_t(rows) * 5 * 4));
        CUDA_OK(cudaMalloc(&d_toplp, size_t(rows) * 5 * 4));
        CUDA_OK(cudaMemcpy(d_temps, temps.data(), temps.size() * 4, cudaMemcpyHostToDevice));
        flashspec_tensor hv = flashspec_tensor_make(hidden, FLASHSPEC_DTYPE_BF16, FLASHSPEC_MEMORY_CUDA, rows, d);
        const Controls chain(requests, 40, 0.95f, 0.05f), nucleus(requests, 0, 0.9f, 0.0f);

        auto verify = [&](flashspec_lm_head* head, const flashspec_sampling_controls* controls, bool logprobs) {
          flashspec_verify_batch b = batch.batch(&hv);
          b.temperatures = d_temps;
          b.controls = controls;
          b.logprobs = logprobs ? 1 : 0;
          b.top_logprobs = logprobs ? 5 : 0;
          flashspec_verify_result res = batch.result();
          if (logprobs) {
            res.logprobs = d_lp;
            res.raw_logprobs = d_raw;
            res.top_tokens = d_top;
            res.top_logprobs = d_toplp;
          }
          FS_OK(ctx, flashspec_verify_and_finalize(ctx, head, &b, &res));
        };
        std::vector<cudaGraphExec_t> gemm, plain, with_chain, with_logprobs, with_top_p;
        for (int b = 0; b < buffers; ++b) {
          flashspec_lm_head* head = heads[size_t(b)];
          gemm.push_back(timer.capture([&] { device.gemm(weights[size_t(b)], hidden, logits, vocab, rows, d); }));
          plain.push_back(timer.capture([&] { verify(head, nullptr, false); }));
          with_chain.push_back(timer.capture([&] { verify(head, &chain.view, false); }));
          with_logprobs.push_back(timer.capture([&] { verify(head, &chain.view, true); }));
          with_top_p.push_back(timer.capture([&] { verify(head, &nucleus.view, false); }));
        }
        Row r{vocab, d, rows, timer.median_ms(gemm), timer.median_ms(plain), timer.median_ms(with_chain),
              timer.median_ms(with_logprobs), timer.median_ms(with_top_p), 0.0, 0.0, 0.0};
        // Eager calls, timed on the host clock through a synchronise.
        auto eager_ms = [&](const flashspec_sampling_controls* controls) {
          std::vector<double> times;
          for (int i = -2; i < args.reps; ++i) {  // two warm-up calls
            CUDA_OK(cudaStreamSynchronize(stream));
            const auto start = std::chrono::steady_clock::now();
            verify(heads[size_t((i + 2) % buffers)], controls, false);
            CUDA_OK(cudaStreamSynchronize(stream));
            const auto stop = std::chrono::steady_clock::now();
            if (i >= 0) times.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
          }
          std::sort(times.begin(), times.end());
          return times[times.size() / 2];
        };
        r.plain_eager = eager_ms(nullptr);
        r.top_p_eager = eager_ms(&nucleus.view);
        // Requests a captured call refuses because top-p alone kept more
        // than the candidate list: those an eager call continues.
        CUDA_OK(cudaGraphLaunch(with_top_p[0], stream));
        std::vector<int32_t> accepted(static_cast<size_t>(requests));
        CUDA_OK(cudaMemcpyAsync(accepted.data(), batch.accepted, accepted.size() * 4, cudaMemcpyDeviceToHost, stream));
        CUDA_OK(cudaStreamSynchronize(stream));
        int refused = 0;
        for (int32_t a : accepted) refused += a < 0;
        r.beyond = double(refused) / double(requests);
        results.push_back(r);
        std::printf("V=%6d d=%5d rows=%3d | gemm %.4f plain %.4f chain %.4f logprobs %.4f top_p %.4f ms | "
                    "plain/gemm %.3f chain/gemm %.3f chain/plain %.3f logprobs/plain %.3f top_p/plain %.3f | "
                    "top-p requests beyond the candidate list %.2f | eager: plain %.4f top_p %.4f ms, "
                    "top_p/plain %.3f\n",
                    vocab, d, rows, r.gemm, r.plain, r.chain, r.logprobs, r.top_p, r.plain / r.gemm, r.chain / r.gemm,
                    r.chain / r.plain, r.logprobs / r.plain, r.top_p / r.plain, r.beyond, r.plain_eager,
                    r.top_p_eager, r.top_p_eager / r.plain_eager);
        std::fflush(stdout);
        for (auto* list : {&gemm, &plain, &with_chain, &with_logprobs, &with_top_p})
          for (auto g : *list) cudaGraphExecDestroy(g);
        for (void* p : {static_cast<void*>(d_temps), static_cast<void*>(d_lp), static_cast<void*>(d_raw),
                        static_cast<void*>(d_top), static_cast<void*>(d_toplp)})
          cudaFree(p);
      }
      for (auto* h : heads) flashspec_lm_head_destroy(h);
      for (auto* w : weights) cudaFree(w);
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
      const Row& r = results[i];
      std::fprintf(f,
                   "    {\"V\": %d, \"d\": %d, \"rows\": %d, \"gemm_ms\": %.5f, \"plain_ms\": %.5f, \"chain_ms\": %.5f, "
                   "\"chain_logprobs_ms\": %.5f, \"top_p_ms\": %.5f, \"chain_over_plain\": %.4f, "
                   "\"chain_over_gemm\": %.4f, \"top_p_beyond_candidates\": %.4f, \"plain_eager_ms\": %.5f, "
                   "\"top_p_eager_ms\": %.5f}%s\n",
                   r.vocab, r.d, r.rows, r.gemm, r.plain, r.chain, r.logprobs, r.top_p, r.chain / r.plain,
                   r.chain / r.gemm, r.beyond, r.plain_eager, r.top_p_eager, i + 1 < results.size() ? "," : "");
    }
    std::fprintf(f, "  ]\n}\n");
    std::fclose(f);
  }
  flashspec_context_destroy(ctx);
  return 0;
}
