// The statistical check of bench/prototypes/block_noise_tile_scan.patch
// (bench/RESULTS.md, "Noise keyed by 128-token vocabulary blocks …"): one
// hidden row repeated over `rows` rows, `calls` sampled drafts (T = 1) with
// distinct request ids, the tokens' chi-square against softmax(l) (l in
// double from the same bf16 values) and against softmax(l / 1.1), a wrong
// sampler it must reject, and the largest |log q − (l_x − LSE)|. Not part of
// the build; from the repository root, after `meson setup build && ninja -C
// build`:
//   g++ -O2 -std=c++17 -Iinclude -I/usr/local/cuda/include bench/prototypes/block_noise_check.cc \
//     -o block_noise_check -Lbuild/src -lflashspec -L/usr/local/cuda/lib64 -lcudart -Wl,-rpath,build/src
//   ./block_noise_check V rows calls      (defaults 1000 64 2000)
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <flashspec.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#define OK(x) do { flashspec_status s_ = (x); if (s_ != FLASHSPEC_OK) { std::printf("fail %s: %s\n", #x, flashspec_context_last_error(ctx)); return 1; } } while (0)

int main(int argc, char** argv) {
  const int V = argc > 1 ? std::atoi(argv[1]) : 1000, d = 128, rows = argc > 2 ? std::atoi(argv[2]) : 64;
  const int calls = argc > 3 ? std::atoi(argv[3]) : 2000;
  std::mt19937 gen(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<__nv_bfloat16> w(size_t(V) * d), h(size_t(rows) * d);
  std::vector<float> hv(d);
  for (auto& x : hv) x = nd(gen);
  for (size_t i = 0; i < w.size(); ++i) w[i] = __float2bfloat16(nd(gen) * 0.12f);
  for (int r = 0; r < rows; ++r) for (int k = 0; k < d; ++k) h[size_t(r) * d + k] = __float2bfloat16(hv[size_t(k)]);
  std::vector<double> l(static_cast<size_t>(V));
  double mx = -1e300;
  for (int i = 0; i < V; ++i) {
    double acc = 0;
    for (int k = 0; k < d; ++k) acc += double(__bfloat162float(w[size_t(i) * d + k])) * double(__bfloat162float(h[size_t(k)]));
    l[size_t(i)] = acc;
    mx = std::max(mx, acc);
  }
  auto softmax = [&](double t) {
    std::vector<double> p(static_cast<size_t>(V));
    double s = 0;
    for (int i = 0; i < V; ++i) s += p[size_t(i)] = std::exp((l[size_t(i)] - mx) / t);
    for (auto& x : p) x /= s;
    return p;
  };
  const std::vector<double> p = softmax(1.0), wrong = softmax(1.1);
  double lse = 0;
  for (int i = 0; i < V; ++i) lse += std::exp(l[size_t(i)] - mx);
  lse = mx + std::log(lse);
  double pmax = 0;
  for (double x : p) pmax = std::max(pmax, x);
  std::printf("V=%d rows=%d calls=%d pmax=%.4f\n", V, rows, calls, pmax);

  flashspec_context_params cp;
  flashspec_context_params_init(&cp);
  cp.backend = FLASHSPEC_BACKEND_CUDA;
  cp.max_rows = rows;
  cp.max_requests = rows;
  flashspec_context* ctx = nullptr;
  OK(flashspec_context_create(&cp, &ctx));
  void *dw, *dh, *dout, *dscore, *dreq;
  cudaMalloc(&dw, w.size() * 2); cudaMalloc(&dh, h.size() * 2);
  cudaMalloc(&dout, size_t(rows) * 4); cudaMalloc(&dscore, size_t(rows) * 4); cudaMalloc(&dreq, size_t(rows) * 8);
  cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dh, h.data(), h.size() * 2, cudaMemcpyHostToDevice);
  flashspec_tensor wt = flashspec_tensor_make(dw, FLASHSPEC_DTYPE_BF16, FLASHSPEC_MEMORY_CUDA, V, d);
  flashspec_tensor ht = flashspec_tensor_make(dh, FLASHSPEC_DTYPE_BF16, FLASHSPEC_MEMORY_CUDA, rows, d);
  flashspec_lm_head* head = nullptr;
  OK(flashspec_lm_head_create(ctx, &wt, FLASHSPEC_LM_HEAD_BORROW, &head));
  std::vector<long> count(static_cast<size_t>(V));
  std::vector<uint64_t> req(static_cast<size_t>(rows));
  std::vector<int32_t> tok(static_cast<size_t>(rows));
  std::vector<float> score(static_cast<size_t>(rows));
  double worst_score = 0;
  long bad = 0;
  for (int c = 0; c < calls; ++c) {
    for (int r = 0; r < rows; ++r) req[size_t(r)] = uint64_t(c) * uint64_t(rows) + uint64_t(r);
    cudaMemcpy(dreq, req.data(), req.size() * 8, cudaMemcpyHostToDevice);
    flashspec_draft_params dp;
    flashspec_draft_params_init(&dp);
    dp.memory = FLASHSPEC_MEMORY_CUDA;
    dp.temperature = 1.0f;
    dp.request_ids = static_cast<const uint64_t*>(dreq);
    OK(flashspec_draft(ctx, head, &ht, &dp, static_cast<int32_t*>(dout), static_cast<float*>(dscore)));
    OK(flashspec_context_synchronize(ctx));
    cudaMemcpy(tok.data(), dout, size_t(rows) * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(score.data(), dscore, size_t(rows) * 4, cudaMemcpyDeviceToHost);
    for (int r = 0; r < rows; ++r) {
      const int x = tok[size_t(r)];
      if (x < 0 || x >= V) { ++bad; continue; }
      ++count[size_t(x)];
      worst_score = std::max(worst_score, std::fabs(double(score[size_t(r)]) - (l[size_t(x)] - lse)));
    }
  }
  const double n = double(calls) * rows;
  auto chi2 = [&](const std::vector<double>& q, int* dof) {
    double chi = 0, eo = 0, oo = 0;
    int bins = 0;
    for (int i = 0; i < V; ++i) {
      const double e = n * q[size_t(i)];
      if (e >= 5) { chi += (count[size_t(i)] - e) * (count[size_t(i)] - e) / e; ++bins; }
      else { eo += e; oo += double(count[size_t(i)]); }
    }
    if (eo > 0) { chi += (oo - eo) * (oo - eo) / eo; ++bins; }
    *dof = bins - 1;
    return chi;
  };
  int dof1 = 0, dof2 = 0;
  const double c1 = chi2(p, &dof1), c2 = chi2(wrong, &dof2);
  std::printf("bad tokens %ld; chi2 vs softmax(l) %.1f on %d dof (z %.2f); vs softmax(l/1.1) %.1f on %d dof (z %.2f); "
              "max |score - (l_x - LSE)| %.2e\n",
              bad, c1, dof1, (c1 - dof1) / std::sqrt(2.0 * dof1), c2, dof2, (c2 - dof2) / std::sqrt(2.0 * dof2),
              worst_score);
  flashspec_lm_head_destroy(head);
  flashspec_context_destroy(ctx);
  return 0;
}
