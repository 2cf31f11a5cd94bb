// FlashSpec kernel benchmark (bf16 LM heads).
//
// Per shape (V, d, rows) it measures, in one run on one card:
//   floor      LM-head bytes / the read bandwidth of a plain streaming kernel
//   gemm       cuBLAS logits alone (bf16 in, fp32 out, fp32 compute)
//   standard   the materialising path of serving engines: cuBLAS logits, then
//              softmax (probabilities written), acceptance, recovered-token
//              and bonus sampling as separate kernels
//   verify     flashspec_verify_and_finalize (greedy drafts, T = 1)
//   verify_g   the same batch at T = 0, said by greedy = 1
//   verify_0   the same batch at T = 0, said by temperatures of 0 in device
//              memory (which the backend cannot read without a sync)
//   draft_g    flashspec_draft, greedy
//   draft_s    flashspec_draft, sampled (T = 1)
//   tree       flashspec_verify_and_finalize of one request whose rows − 1
//              drafts form a binary tree (node k's parent (k − 1) / 2), T = 1;
//              against verify above, the chains of the same row count
// Each op is captured once per weight buffer into a CUDA graph; replays are
// timed with CUDA events (warm-up, then the median of --reps replays),
// rotating over ≥ 2 weight buffers where they fit so the L2 holds no W.
//
// Usage: flashspec_bench [--quick] [--only V d rows] [--reps N] [--json FILE]
// (the JSON file is written only when --json names it)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "../tests/common/context.h"
#include "common.cuh"
#include "flashspec.h"
#include "util/philox.h"

namespace {

struct Result {
  int vocab, d, rows, buffers;
  double floor_ms, gemm_ms, standard_ms, verify_ms, draft_g_ms, draft_s_ms;
  double verify_g_ms, verify_0_ms;
  double tree_ms;  // 0 for one row (no tree)
};

double measure_bandwidth(Timer& timer, const void* buf, size_t bytes, unsigned* sink, int sms) {
  std::vector<cudaGraphExec_t> g{timer.capture([&] {
    read_kernel<<<sms * 8, 512, 0, timer.stream>>>(static_cast<const uint4*>(buf), bytes / 16, sink);
  })};
  double ms = timer.median_ms(g);
  cudaGraphExecDestroy(g[0]);
  return double(bytes) / (ms * 1e-3);
}

}  // namespace

int main(int argc, char** argv) {
  BenchArgs args;
  if (!parse_bench_args(argc, argv, 50, 50, args)) return 2;
  const bool quick = args.quick;
  const int only_v = args.only_v, only_d = args.only_d, only_rows = args.only_rows, reps = args.reps;
  const std::string json = args.json;
  if (flashspec_cuda_device_count() == 0) {
    std::fprintf(stderr, "no CUDA device: nothing to measure\n");
    return 1;
  }
  const BenchDevice device;
  const cudaDeviceProp& prop = device.prop;
  cudaStream_t stream = device.stream;
  Timer timer{stream, reps};

  std::vector<int> vocabs = quick ? std::vector<int>{32000, 128256} : std::vector<int>{32000, 128256, 151936, 262144};
  std::vector<int> hiddens = quick ? std::vector<int>{4096} : std::vector<int>{2048, 4096, 8192};
  std::vector<int> row_counts = quick ? std::vector<int>{1, 5, 16, 64, 256} : std::vector<int>{1, 2, 5, 9, 16, 64, 256, 512};
  const int max_rows = 512;
  if (only_v > 0) {
    vocabs = {only_v};
    hiddens = {only_d};
    row_counts = {std::min(max_rows, std::max(1, only_rows))};
  }

  unsigned* sink;
  CUDA_OK(cudaMalloc(&sink, sizeof(unsigned)));
  // Read bandwidth on a buffer far larger than the L2.
  double bandwidth;
  {
    const size_t bytes = size_t(4) << 30;
    void* buf;
    CUDA_OK(cudaMalloc(&buf, bytes));
    fill_bf16<<<4096, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(buf), bytes / 2, 1.0f, 1);
    bandwidth = measure_bandwidth(timer, buf, bytes, sink, prop.multiProcessorCount);
    CUDA_OK(cudaFree(buf));
  }
  std::printf("device: %s (%d SMs), streaming read bandwidth %.0f GB/s\n", prop.name, prop.multiProcessorCount,
              bandwidth / 1e9);

  const auto options = fstest::ContextOptions(FLASHSPEC_BACKEND_CUDA)
                           .cuda_stream(stream)
                           .max_rows(max_rows)
                           .max_requests(max_rows)
                           .seed(1);
  flashspec_context* ctx = nullptr;
  FS_OK(nullptr, fstest::create_context(options, &ctx));

  std::vector<Result> results;
  for (int vocab : vocabs) {
    for (int d : hiddens) {
      const size_t w_bytes = size_t(vocab) * size_t(d) * 2;
      size_t free_b = 0, total_b = 0;
      CUDA_OK(cudaMemGetInfo(&free_b, &total_b));
      const size_t other = size_t(max_rows) * vocab * 8 + size_t(max_rows) * d * 2 + (size_t(1) << 30);
      int buffers = int(std::min<size_t>(3, (free_b > other ? free_b - other : 0) / w_bytes));
      buffers = std::max(1, buffers);
      std::vector<__nv_bfloat16*> weights(static_cast<size_t>(buffers));
      std::vector<flashspec_lm_head*> heads(static_cast<size_t>(buffers));
      const float w_scale = 3.0f * std::sqrt(3.0f / float(d));  // logits of a few units
      for (int b = 0; b < buffers; ++b) {
        CUDA_OK(cudaMalloc(&weights[size_t(b)], w_bytes));
        fill_bf16<<<4096, 256, 0, stream>>>(weights[size_t(b)], w_bytes / 2, w_scale, 100 + b);
        flashspec_tensor wt = flashspec_tensor_make(weights[size_t(b)], FLASHSPEC_DTYPE_BF16, FLASHSPEC_MEMORY_CUDA,
                                                    vocab, d);
        FS_OK(ctx, flashspec_lm_head_create(ctx, &wt, FLASHSPEC_LM_HEAD_BORROW, &heads[size_t(b)]));
      }
      __nv_bfloat16* hidden;
      float *logits, *probs;
      CUDA_OK(cudaMalloc(&hidden, size_t(max_rows) * d * 2));
      CUDA_OK(cudaMalloc(&logits, size_t(max_rows) * vocab * 4));
      CUDA_OK(cudaMalloc(&probs, size_t(max_rows) * vocab * 4));
      fill_bf16<<<1024, 256, 0, stream>>>(hidden, size_t(max_rows) * d, std::sqrt(3.0f), 7);
      CUDA_OK(cudaStreamSynchronize(stream));

      for (int rows : row_counts) {
        const BenchBatch batch(rows, vocab);
        const int n = batch.drafts_per_request, requests = batch.requests;
        int32_t* d_out;
        float* d_scores;
        CUDA_OK(cudaMalloc(&d_out, size_t(rows) * 4));
        CUDA_OK(cudaMalloc(&d_scores, size_t(rows) * 4));
        flashspec_tensor hv = flashspec_tensor_make(hidden, FLASHSPEC_DTYPE_BF16, FLASHSPEC_MEMORY_CUDA, rows, d);
        // The tree: one request, rows − 1 nodes, siblings' tokens distinct.
        const int nodes = rows - 1;
        std::vector<int32_t> tree_offsets{0, nodes}, parents(size_t(std::max(1, nodes))), tree_tokens(parents.size());
        for (int k = 0; k < nodes; ++k) {
          parents[size_t(k)] = k == 0 ? -1 : (k - 1) / 2;
          tree_tokens[size_t(k)] = int32_t((uint32_t(k) * 2654435761u + 17u) % uint32_t(vocab));
        }
        int32_t *d_tree_off, *d_tree_tok, *d_parents;
        CUDA_OK(cudaMalloc(&d_tree_off, 2 * 4));
        CUDA_OK(cudaMalloc(&d_tree_tok, tree_tokens.size() * 4));
        CUDA_OK(cudaMalloc(&d_parents, parents.size() * 4));
        CUDA_OK(cudaMemcpy(d_tree_off, tree_offsets.data(), 2 * 4, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(d_tree_tok, tree_tokens.data(), tree_tokens.size() * 4, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(d_parents, parents.data(), parents.size() * 4, cudaMemcpyHostToDevice));

        float* d_zero_temps;
        CUDA_OK(cudaMalloc(&d_zero_temps, size_t(requests) * 4));
        CUDA_OK(cudaMemset(d_zero_temps, 0, size_t(requests) * 4));
        std::vector<cudaGraphExec_t> gemm, standard, verify, verify_g, verify_0, draft_g, draft_s, tree;
        for (int b = 0; b < buffers; ++b) {
          auto run_gemm = [&] { device.gemm(weights[size_t(b)], hidden, logits, vocab, rows, d); };
          gemm.push_back(timer.capture(run_gemm));
          standard.push_back(timer.capture([&] {
            run_gemm();
            softmax_kernel<<<rows, kRowThreads, 0, stream>>>(logits, probs, vocab, 1.0f);
            accept_kernel<<<(requests + 127) / 128, 128, 0, stream>>>(probs, batch.tokens, requests, n, vocab,
                                                                      batch.accepted);
            if (n > 0)
              sample_kernel<<<requests * n, kRowThreads, 0, stream>>>(probs, batch.tokens, n, vocab, 0, d_out);
            sample_kernel<<<requests, kRowThreads, 0, stream>>>(probs, batch.tokens, n, vocab, 1,
                                                                d_out + requests * n);
          }));
          // The verify batches, each one call of flashspec_verify_and_finalize.
          auto capture_verify = [&](const flashspec_verify_batch& vb) {
            return timer.capture([&] {
              flashspec_verify_result res = batch.result();
              FS_OK(ctx, flashspec_verify_and_finalize(ctx, heads[size_t(b)], &vb, &res));
            });
          };
          const flashspec_verify_batch chains = batch.batch(&hv);
          flashspec_verify_batch greedy = chains, zeros = chains, one_tree = chains;
          greedy.greedy = 1;
          zeros.temperatures = d_zero_temps;
          one_tree.num_requests = 1;
          one_tree.draft_offsets = d_tree_off;
          one_tree.draft_tokens = d_tree_tok;
          one_tree.draft_parents = d_parents;
          one_tree.max_draft_len = nodes;
          verify.push_back(capture_verify(chains));
          verify_g.push_back(capture_verify(greedy));
          verify_0.push_back(capture_verify(zeros));
          if (nodes > 0) tree.push_back(capture_verify(one_tree));
          for (int sampled = 0; sampled < 2; ++sampled) {
            auto& list = sampled ? draft_s : draft_g;
            list.push_back(timer.capture([&] {
              flashspec_draft_params p;
              flashspec_draft_params_init(&p);
              p.memory = FLASHSPEC_MEMORY_CUDA;
              p.temperature = sampled ? 1.0f : 0.0f;
              FS_OK(ctx, flashspec_draft(ctx, heads[size_t(b)], &hv, &p, d_out, d_scores));
            }));
          }
        }
        Result res;
        res.vocab = vocab;
        res.d = d;
        res.rows = rows;
        res.buffers = buffers;
        res.floor_ms = double(w_bytes) / bandwidth * 1e3;
        res.gemm_ms = timer.median_ms(gemm);
        res.standard_ms = timer.median_ms(standard);
        res.verify_ms = timer.median_ms(verify);
        res.verify_g_ms = timer.median_ms(verify_g);
        res.verify_0_ms = timer.median_ms(verify_0);
        res.draft_g_ms = timer.median_ms(draft_g);
        res.draft_s_ms = timer.median_ms(draft_s);
        res.tree_ms = nodes > 0 ? timer.median_ms(tree) : 0.0;
        results.push_back(res);
        std::printf("V=%6d d=%5d rows=%3d | floor %.4f gemm %.4f std %.4f verify %.4f verify_g %.4f verify_0 %.4f "
                    "draft_g %.4f draft_s %.4f tree %.4f ms | verify/gemm %.3f verify_g/gemm %.3f "
                    "verify_0/gemm %.3f draft_g/gemm %.3f draft_s/gemm %.3f std/verify %.2f tree/verify %.3f\n",
                    vocab, d, rows, res.floor_ms, res.gemm_ms, res.standard_ms, res.verify_ms, res.verify_g_ms,
                    res.verify_0_ms, res.draft_g_ms, res.draft_s_ms, res.tree_ms, res.verify_ms / res.gemm_ms,
                    res.verify_g_ms / res.gemm_ms, res.verify_0_ms / res.gemm_ms, res.draft_g_ms / res.gemm_ms,
                    res.draft_s_ms / res.gemm_ms, res.standard_ms / res.verify_ms, res.tree_ms / res.verify_ms);
        std::fflush(stdout);
        for (auto* list : {&gemm, &standard, &verify, &verify_g, &verify_0, &draft_g, &draft_s, &tree})
          for (auto g : *list) cudaGraphExecDestroy(g);
        for (void* p : {static_cast<void*>(d_out), static_cast<void*>(d_scores), static_cast<void*>(d_zero_temps),
                        static_cast<void*>(d_tree_off),
                        static_cast<void*>(d_tree_tok), static_cast<void*>(d_parents)})
          cudaFree(p);
      }
      for (auto* h : heads) flashspec_lm_head_destroy(h);
      for (auto* w : weights) cudaFree(w);
      cudaFree(hidden);
      cudaFree(logits);
      cudaFree(probs);
    }
  }

  std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  FILE* f = json.empty() ? nullptr : std::fopen(json.c_str(), "w");
  if (!json.empty() && !f) std::fprintf(stderr, "cannot write %s\n", json.c_str());
  if (f) {
    std::fprintf(f, "{\n  \"device\": \"%s\",\n  \"date\": \"%s\",\n  \"read_bandwidth_GBps\": %.1f,\n  \"reps\": %d,\n"
                 "  \"results\": [\n", prop.name, date, bandwidth / 1e9, reps);
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      std::fprintf(f,
                   "    {\"V\": %d, \"d\": %d, \"rows\": %d, \"weight_buffers\": %d, \"floor_ms\": %.5f, "
                   "\"gemm_ms\": %.5f, \"standard_ms\": %.5f, \"verify_ms\": %.5f, \"draft_greedy_ms\": %.5f, "
                   "\"draft_sampled_ms\": %.5f, \"verify_over_gemm\": %.4f, \"draft_greedy_over_gemm\": %.4f, "
                   "\"draft_sampled_over_gemm\": %.4f, \"standard_over_verify\": %.4f, \"gemm_over_floor\": %.4f, "
                   "\"tree_ms\": %.5f, \"tree_over_verify\": %.4f, \"verify_greedy_ms\": %.5f, "
                   "\"verify_greedy_over_gemm\": %.4f, \"verify_zero_temperatures_ms\": %.5f, "
                   "\"verify_zero_temperatures_over_gemm\": %.4f}%s\n",
                   r.vocab, r.d, r.rows, r.buffers, r.floor_ms, r.gemm_ms, r.standard_ms, r.verify_ms, r.draft_g_ms,
                   r.draft_s_ms, r.verify_ms / r.gemm_ms, r.draft_g_ms / r.gemm_ms, r.draft_s_ms / r.gemm_ms,
                   r.standard_ms / r.verify_ms, r.gemm_ms / r.floor_ms, r.tree_ms, r.tree_ms / r.verify_ms,
                   r.verify_g_ms, r.verify_g_ms / r.gemm_ms, r.verify_0_ms, r.verify_0_ms / r.gemm_ms,
                   i + 1 < results.size() ? "," : "");
    }
    std::fprintf(f, "  ]\n}\n");
    std::fclose(f);
  }
  flashspec_context_destroy(ctx);
  cudaFree(sink);
  return 0;
}
