// CUDA-graph capture of verify_and_finalize (steps read from and advanced on
// the device: two replays draw fresh noise and each matches the CPU backend
// at its step), and bad device-resident input reported per request (or per
// draft row) on the device instead of a silent wrong token.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "capi/handles.h"
#include "gpu_support.h"
#include "testing.h"

using namespace fstest;

namespace {

class GpuGraph : public ::testing::Test {
 protected:
  void SetUp() override { FSGPU_SKIP_WITHOUT_DEVICE(); }
};

// A CUDA context on its own non-blocking stream and a CPU context with the
// same seed, each holding the LM head w.
struct ContextPair {
  cudaStream_t stream = nullptr;
  ContextPtr gpu, cpu;
  HeadPtr gpu_head, cpu_head;

  ContextPair(const Matrix& w, uint64_t seed) {
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return;
    gpu = make_context(ContextOptions(FLASHSPEC_BACKEND_CUDA).seed(seed).cuda_stream(stream));
    cpu = make_context(ContextOptions(FLASHSPEC_BACKEND_CPU).seed(seed));
    if (gpu && cpu) {
      gpu_head = make_head(gpu.get(), w.view(), FLASHSPEC_LM_HEAD_COPY);
      cpu_head = make_head(cpu.get(), w.view(), FLASHSPEC_LM_HEAD_COPY);
    }
  }
  ~ContextPair() {
    gpu_head.reset();
    gpu.reset();
    if (stream) cudaStreamDestroy(stream);
  }
  bool ready() const { return gpu_head && cpu_head; }

  // verify_and_finalize captured once on the stream; NULL (and a test
  // failure) if the capture fails.
  cudaGraphExec_t capture(const flashspec_verify_batch& batch, flashspec_verify_result& result) {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return nullptr;
    const flashspec_status st = flashspec_verify_and_finalize(gpu.get(), gpu_head.get(), &batch, &result);
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    EXPECT_EQ(st, FLASHSPEC_OK) << flashspec_context_last_error(gpu.get());
    EXPECT_EQ(ended, cudaSuccess);
    if (st == FLASHSPEC_OK && ended == cudaSuccess) {
      EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    }
    if (graph) cudaGraphDestroy(graph);
    return exec;
  }
};

TEST_F(GpuGraph, ReplaysAdvanceStepsAndMatchCpu) {
  // 192 rows over two cuBLAS chunks (at most 65536 tokens each): the captured
  // graph holds the scan's two streams (the first chunk folded beside the
  // second chunk's product).
  constexpr int kReq = 48, kN = 3, kVocab = 70001, kD = 64, kRows = kReq * (kN + 1);
  Rng rng(4242);
  Matrix w = random_matrix(FLASHSPEC_DTYPE_BF16, kVocab, kD, rng, 3.0 / 8.0);
  Matrix h = random_matrix(FLASHSPEC_DTYPE_BF16, kRows, kD, rng, 1.0);
  std::vector<int32_t> offsets(kReq + 1), tokens(kReq * kN);
  for (int r = 0; r <= kReq; ++r) offsets[size_t(r)] = r * kN;
  for (auto& t : tokens) t = rng.below(kVocab);
  std::vector<uint64_t> steps(kReq, 5);

  ContextPair pair(w, 31337);
  ASSERT_TRUE(pair.ready());

  DevMatrix hd(h);
  flashspec_tensor hv = hd.view();
  Dev<int32_t> d_off(offsets), d_tok(tokens), d_acc(kReq), d_emit(kRows);
  Dev<uint64_t> d_steps(steps);
  flashspec_verify_batch b;
  flashspec_verify_batch_init(&b);
  b.memory = FLASHSPEC_MEMORY_CUDA;
  b.num_requests = kReq;
  b.draft_offsets = d_off.ptr();
  b.draft_tokens = d_tok.ptr();
  b.target_hidden = &hv;
  b.steps = d_steps.ptr();
  b.max_draft_len = kN;
  flashspec_verify_result res;
  flashspec_verify_result_init(&res);
  res.memory = FLASHSPEC_MEMORY_CUDA;
  res.accepted_counts = d_acc.ptr();
  res.emitted_tokens = d_emit.ptr();
  res.next_steps = d_steps.ptr();  // aliases batch.steps: each replay advances it

  cudaGraphExec_t exec = pair.capture(b, res);
  ASSERT_NE(exec, nullptr);

  std::vector<std::vector<int32_t>> emitted, accepted;
  std::vector<std::vector<flashspec::RowSummary>> summaries;
  for (int replay = 0; replay < 2; ++replay) {
    FSGPU_CUDA(cudaGraphLaunch(exec, pair.stream));
    FSGPU_CUDA(cudaStreamSynchronize(pair.stream));
    emitted.push_back(d_emit.get());
    accepted.push_back(d_acc.get());
    std::vector<flashspec::RowSummary> rs(static_cast<size_t>(kRows));
    ASSERT_TRUE(flashspec::cuda::read_summaries(*pair.gpu->own_summaries, kRows, rs.data()));
    summaries.push_back(rs);
  }
  EXPECT_EQ(d_steps.get(), std::vector<uint64_t>(kReq, 7));
  EXPECT_NE(emitted[0], emitted[1]) << "two replays drew the same tokens: steps did not advance on the device";

  for (int replay = 0; replay < 2; ++replay) {
    std::vector<uint64_t> cpu_steps(kReq, 5 + uint64_t(replay));
    flashspec_tensor chv = h.view();
    flashspec_verify_batch cb;
    flashspec_verify_batch_init(&cb);
    cb.num_requests = kReq;
    cb.draft_offsets = offsets.data();
    cb.draft_tokens = tokens.data();
    cb.target_hidden = &chv;
    cb.steps = cpu_steps.data();
    cb.max_draft_len = kN;
    std::vector<int32_t> acc(kReq), emit(kRows);
    flashspec_verify_result cr;
    flashspec_verify_result_init(&cr);
    cr.accepted_counts = acc.data();
    cr.emitted_tokens = emit.data();
    FSGPU_OK(pair.cpu.get(), flashspec_verify_and_finalize(pair.cpu.get(), pair.cpu_head.get(), &cb, &cr));
    int near_ties = 0;
    for (int r = 0; r < kReq; ++r) {
      bool same = acc[size_t(r)] == accepted[size_t(replay)][size_t(r)];
      for (int k = 0; k <= kN && same; ++k)
        same = emit[size_t(r * (kN + 1) + k)] == emitted[size_t(replay)][size_t(r * (kN + 1) + k)];
      if (same) continue;
      const int stop = std::min(acc[size_t(r)], accepted[size_t(replay)][size_t(r)]);
      const flashspec::RowSummary& s = summaries[size_t(replay)][size_t(r * (kN + 1) + stop)];
      double margin = s.candidate_gap;
      if (acc[size_t(r)] != accepted[size_t(replay)][size_t(r)]) {
        double log_u = std::log(flashspec_rng_uniform(31337, uint64_t(r), 5 + uint64_t(replay), stop,
                                                      FLASHSPEC_RNG_ACCEPT_UNIFORM, 0));
        margin = std::fabs(log_u - (s.draft_logit - s.lse));
      }
      EXPECT_LT(margin, kNearTie) << "replay " << replay << " request " << r << " differs from the CPU step";
      ++near_ties;
    }
    EXPECT_LE(near_ties, 1) << "replay " << replay;
  }
  cudaGraphExecDestroy(exec);
}

// Stochastic trees with sparse q (SpecInfer's rule, several barriers per
// scan) captured once and replayed: each replay matches the CPU backend at
// its step, emitted tokens and accepted paths.
TEST_F(GpuGraph, StochasticTreeReplaysMatchCpu) {
  constexpr int kReq = 12, kN = 5, kVocab = 1999, kD = 64, kRows = kReq * (kN + 1), kSupport = 8;
  const int32_t tree[kN] = {-1, -1, 0, 0, 1};  // two children at the root, two below node 0
  Rng rng(777);
  Matrix w = random_matrix(FLASHSPEC_DTYPE_BF16, kVocab, kD, rng, 3.0 / 8.0);
  Matrix h = random_matrix(FLASHSPEC_DTYPE_BF16, kRows, kD, rng, 1.0);
  std::vector<int32_t> offsets(kReq + 1), tokens, parents, support_offsets(1, 0), support_tokens;
  std::vector<float> support_probs;
  for (int r = 0; r <= kReq; ++r) offsets[size_t(r)] = r * kN;
  for (int k = 0; k < kReq * kN; ++k) {
    // q: the target's kSupport most likely tokens at the node's parent row,
    // with the target's odds, perturbed; x one of them.
    parents.push_back(tree[k % kN]);
    const int row = (k / kN) * (kN + 1) + tree[k % kN] + 1;
    std::vector<std::pair<double, int32_t>> ranked;
    for (int32_t t = 0; t < kVocab; ++t) ranked.push_back({-exact_logit(w, h, row, t), t});
    std::partial_sort(ranked.begin(), ranked.begin() + kSupport, ranked.end());
    double sum = 0.0;
    std::vector<double> q(kSupport);
    for (int e = 0; e < kSupport; ++e) sum += (q[size_t(e)] = std::exp(-ranked[size_t(e)].first + 0.3 * rng.normal()));
    for (int e = 0; e < kSupport; ++e) {
      support_tokens.push_back(ranked[size_t(e)].second);
      support_probs.push_back(float(q[size_t(e)] / sum));
    }
    tokens.push_back(support_tokens[size_t(support_offsets.back() + rng.below(3))]);
    support_offsets.push_back(int32_t(support_tokens.size()));
  }
  std::vector<uint64_t> steps(kReq, 5);

  ContextPair pair(w, 4711);
  ASSERT_TRUE(pair.ready());

  DevMatrix hd(h);
  flashspec_tensor hv = hd.view();
  Dev<int32_t> d_off(offsets), d_tok(tokens), d_par(parents), d_so(support_offsets), d_st(support_tokens),
      d_acc(kReq), d_emit(kRows), d_nodes(kRows);
  Dev<float> d_sp(support_probs);
  Dev<uint64_t> d_steps(steps);
  flashspec_verify_batch b;
  flashspec_verify_batch_init(&b);
  b.memory = FLASHSPEC_MEMORY_CUDA;
  b.num_requests = kReq;
  b.draft_offsets = d_off.ptr();
  b.draft_tokens = d_tok.ptr();
  b.target_hidden = &hv;
  b.steps = d_steps.ptr();
  b.max_draft_len = kN;
  b.draft_parents = d_par.ptr();
  b.draft_support_offsets = d_so.ptr();
  b.draft_support_tokens = d_st.ptr();
  b.draft_support_probs = d_sp.ptr();
  flashspec_verify_result res;
  flashspec_verify_result_init(&res);
  res.memory = FLASHSPEC_MEMORY_CUDA;
  res.accepted_counts = d_acc.ptr();
  res.emitted_tokens = d_emit.ptr();
  res.accepted_nodes = d_nodes.ptr();
  res.next_steps = d_steps.ptr();

  cudaGraphExec_t exec = pair.capture(b, res);
  ASSERT_NE(exec, nullptr);

  int near_ties = 0, accepted_total = 0;
  for (int replay = 0; replay < 2; ++replay) {
    FSGPU_CUDA(cudaGraphLaunch(exec, pair.stream));
    FSGPU_CUDA(cudaStreamSynchronize(pair.stream));
    const std::vector<int32_t> emitted = d_emit.get(), accepted = d_acc.get(), nodes = d_nodes.get();
    std::vector<flashspec::RowSummary> rs(static_cast<size_t>(kRows));
    ASSERT_TRUE(flashspec::cuda::read_summaries(*pair.gpu->own_summaries, kRows, rs.data()));

    std::vector<uint64_t> cpu_steps(kReq, 5 + uint64_t(replay));
    flashspec_tensor chv = h.view();
    flashspec_verify_batch cb = b;
    cb.memory = FLASHSPEC_MEMORY_HOST;
    cb.draft_offsets = offsets.data();
    cb.draft_tokens = tokens.data();
    cb.target_hidden = &chv;
    cb.steps = cpu_steps.data();
    cb.draft_parents = parents.data();
    cb.draft_support_offsets = support_offsets.data();
    cb.draft_support_tokens = support_tokens.data();
    cb.draft_support_probs = support_probs.data();
    std::vector<int32_t> acc(kReq), emit(kRows), path(kRows);
    flashspec_verify_result cr;
    flashspec_verify_result_init(&cr);
    cr.accepted_counts = acc.data();
    cr.emitted_tokens = emit.data();
    cr.accepted_nodes = path.data();
    FSGPU_OK(pair.cpu.get(), flashspec_verify_and_finalize(pair.cpu.get(), pair.cpu_head.get(), &cb, &cr));
    for (int r = 0; r < kReq; ++r) {
      ASSERT_GE(accepted[size_t(r)], 0) << "replay " << replay << " request " << r;
      accepted_total += accepted[size_t(r)];
      bool same = acc[size_t(r)] == accepted[size_t(r)];
      for (int k = 0; k <= kN && same; ++k) {
        const size_t slot = size_t(r * (kN + 1) + k);
        same = emit[slot] == emitted[slot] && path[slot] == nodes[slot];
      }
      if (same) continue;
      // Only a near-tie may part them: a row's draw or a child's test.
      double margin = 1e300;
      for (int j = 0; j <= kN; ++j) margin = std::min(margin, double(rs[size_t(r * (kN + 1) + j)].candidate_gap));
      for (int k = 0; k < kN; ++k) {
        const double log_u = std::log(flashspec_rng_uniform(4711, uint64_t(r), 5 + uint64_t(replay), k,
                                                            FLASHSPEC_RNG_ACCEPT_UNIFORM, 0));
        margin = std::min(margin, std::fabs(log_u - double(rs[size_t(r * (kN + 1) + k + 1)].node_log_ratio)));
      }
      EXPECT_LT(margin, kNearTie) << "replay " << replay << " request " << r << " differs from the CPU step";
      ++near_ties;
    }
  }
  EXPECT_EQ(d_steps.get(), std::vector<uint64_t>(kReq, 7));
  EXPECT_LE(near_ties, 1);
  EXPECT_GT(accepted_total, 0);
  cudaGraphExecDestroy(exec);
}

// A small valid batch of two requests (2 and 1 drafts) whose device copy a
// test then corrupts in one place.
struct SmallBatch {
  static constexpr int kVocab = 300, kD = 32;
  Rng rng{99};
  Matrix w = random_matrix(FLASHSPEC_DTYPE_BF16, kVocab, kD, rng, 0.5);
  Matrix h = random_matrix(FLASHSPEC_DTYPE_BF16, 5, kD, rng, 1.0);
  std::vector<int32_t> offsets{0, 2, 3}, tokens{3, 7, 11};
  std::vector<float> temps{1.0f, 0.7f};
  std::vector<float> uniforms{0.5f, 0.25f, 0.75f};
  // Stochastic drafts when not empty: [3, kVocab] fp32 draft logits.
  std::vector<float> draft_logits;
  std::vector<float> draft_temps{1.0f, 1.0f};
  // Sparse draft supports when not empty (one row per draft).
  std::vector<int32_t> support_offsets, support_tokens;
  std::vector<float> support_probs;
};

struct Outcome {
  std::vector<int32_t> accepted, emitted;
};

Outcome run_batch(SmallBatch& s, int max_draft_len = 0) {
  Outcome out;
  auto ctx = make_context(ContextOptions(FLASHSPEC_BACKEND_CUDA).seed(5));
  EXPECT_TRUE(ctx);
  if (!ctx) return out;
  auto head = make_head(ctx.get(), s.w.view(), FLASHSPEC_LM_HEAD_COPY);
  DevMatrix hd(s.h);
  flashspec_tensor hv = hd.view();
  Dev<int32_t> d_off(s.offsets), d_tok(s.tokens), d_acc(2), d_emit(5);
  Dev<float> d_temps(s.temps), d_u(s.uniforms);
  flashspec_verify_batch b;
  flashspec_verify_batch_init(&b);
  b.memory = FLASHSPEC_MEMORY_CUDA;
  b.num_requests = 2;
  b.draft_offsets = d_off.ptr();
  b.draft_tokens = d_tok.ptr();
  b.target_hidden = &hv;
  b.temperatures = d_temps.ptr();
  b.accept_uniforms = d_u.ptr();
  b.max_draft_len = max_draft_len;
  Dev<float> d_q(s.draft_logits.empty() ? std::vector<float>(1) : s.draft_logits), d_td(s.draft_temps);
  flashspec_tensor qv = flashspec_tensor_make(d_q.ptr(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_CUDA, 3, SmallBatch::kVocab);
  if (!s.draft_logits.empty()) {
    b.draft_logits = &qv;
    b.draft_temperatures = d_td.ptr();
  }
  Dev<int32_t> d_so(s.support_offsets.empty() ? std::vector<int32_t>(1) : s.support_offsets),
      d_st(s.support_tokens.empty() ? std::vector<int32_t>(1) : s.support_tokens);
  Dev<float> d_sp(s.support_probs.empty() ? std::vector<float>(1) : s.support_probs);
  if (!s.support_offsets.empty()) {
    b.draft_support_offsets = d_so.ptr();
    b.draft_support_tokens = d_st.ptr();
    b.draft_support_probs = d_sp.ptr();
  }
  flashspec_verify_result res;
  flashspec_verify_result_init(&res);
  res.memory = FLASHSPEC_MEMORY_CUDA;
  res.accepted_counts = d_acc.ptr();
  res.emitted_tokens = d_emit.ptr();
  flashspec_status st = flashspec_verify_and_finalize(ctx.get(), head.get(), &b, &res);
  EXPECT_EQ(st, FLASHSPEC_OK) << "device-side errors are reported per request, not as a status: "
                              << flashspec_context_last_error(ctx.get());
  EXPECT_EQ(flashspec_context_synchronize(ctx.get()), FLASHSPEC_OK);
  out.accepted = d_acc.get();
  out.emitted = d_emit.get();
  return out;
}

class GpuBadInput : public ::testing::Test {
 protected:
  void SetUp() override { FSGPU_SKIP_WITHOUT_DEVICE(); }
};

TEST_F(GpuBadInput, ValidBatchEmitsTokens) {
  SmallBatch s;
  Outcome o = run_batch(s);
  ASSERT_EQ(o.accepted.size(), 2u);
  EXPECT_GE(o.accepted[0], 0);
  EXPECT_GE(o.accepted[1], 0);
  EXPECT_GE(o.emitted[size_t(o.accepted[0])], 0);
}

TEST_F(GpuBadInput, TokenOutOfRangeFailsOnlyItsRequest) {
  SmallBatch s;
  s.tokens[2] = SmallBatch::kVocab;  // request 1
  Outcome o = run_batch(s);
  EXPECT_GE(o.accepted[0], 0);
  EXPECT_EQ(o.accepted[1], -1);
  EXPECT_EQ(o.emitted[3], -1);
  EXPECT_EQ(o.emitted[4], -1);
  s.tokens[2] = -4;
  o = run_batch(s);
  EXPECT_EQ(o.accepted[1], -1);
}

TEST_F(GpuBadInput, BadTemperatureFailsItsRequest) {
  SmallBatch s;
  s.temps[0] = std::nanf("");
  Outcome o = run_batch(s);
  EXPECT_EQ(o.accepted[0], -1);
  EXPECT_GE(o.accepted[1], 0);
  s.temps[0] = 1.0f;
  s.temps[1] = -0.5f;
  o = run_batch(s);
  EXPECT_GE(o.accepted[0], 0);
  EXPECT_EQ(o.accepted[1], -1);
}

TEST_F(GpuBadInput, BadUniformFailsItsRequest) {
  SmallBatch s;
  s.uniforms[1] = 1.0f;
  Outcome o = run_batch(s);
  EXPECT_EQ(o.accepted[0], -1);
  EXPECT_GE(o.accepted[1], 0);
}

TEST_F(GpuBadInput, NonFiniteHiddenFailsItsRequest) {
  SmallBatch s;
  s.h.set(4, 7, std::nanf(""));  // request 1's bonus row
  Outcome o = run_batch(s);
  EXPECT_GE(o.accepted[0], 0);
  EXPECT_EQ(o.accepted[1], -1);
  s.h.set(4, 7, 0.0f);
  s.h.set(0, 3, INFINITY);  // request 0's first row
  o = run_batch(s);
  EXPECT_EQ(o.accepted[0], -1);
  EXPECT_GE(o.accepted[1], 0);
}

TEST_F(GpuBadInput, LogitsThatOverflowAtTheTemperatureFailTheirRequest) {
  SmallBatch s;
  s.temps[1] = 1e-38f;  // every |l| > 3.4 overflows l / T
  Outcome o = run_batch(s);
  EXPECT_GE(o.accepted[0], 0);
  EXPECT_EQ(o.accepted[1], -1);
}

TEST_F(GpuBadInput, DraftLogitsThatOverflowAtTheDraftTemperatureFailTheirRequest) {
  SmallBatch s;
  Rng rng(7);
  s.draft_logits.resize(size_t(3) * SmallBatch::kVocab);
  for (float& z : s.draft_logits) z = float(rng.normal());
  s.draft_temps = {0.5f, 0.5f};
  Outcome o = run_batch(s);
  EXPECT_GE(o.accepted[0], 0);
  EXPECT_GE(o.accepted[1], 0);
  s.draft_logits[size_t(2) * SmallBatch::kVocab + 17] = 3.0e38f;  // request 1's draft row: finite, / T_d overflows
  o = run_batch(s);
  EXPECT_GE(o.accepted[0], 0);
  EXPECT_EQ(o.accepted[1], -1);
}

// Sparse supports in device memory are checked on the device by the host
// check's rules (sampling/draft_support.h): each fault fails its request.
TEST_F(GpuBadInput, BadSparseSupportFailsItsRequest) {
  auto valid = [] {
    SmallBatch s;
    // Drafts 3 and 7 (request 0), 11 (request 1).
    s.support_offsets = {0, 2, 5, 6};
    s.support_tokens = {3, 9, 7, 1, 2, 11};
    s.support_probs = {0.6f, 0.4f, 0.5f, 0.25f, 0.25f, 1.0f};
    return s;
  };
  SmallBatch s = valid();
  Outcome o = run_batch(s);
  EXPECT_GE(o.accepted[0], 0);
  EXPECT_GE(o.accepted[1], 0);
  struct Fault {
    const char* what;
    std::function<void(SmallBatch&)> corrupt;
    int failed;  // the request that fails
  };
  const Fault faults[] = {
      {"token out of range", [](SmallBatch& b) { b.support_tokens[1] = SmallBatch::kVocab; }, 0},
      {"token repeated", [](SmallBatch& b) { b.support_tokens[4] = 1; }, 0},
      {"negative probability", [](SmallBatch& b) { b.support_probs[5] = -1.0f; }, 1},
      {"NaN probability", [](SmallBatch& b) { b.support_probs[3] = std::nanf(""); }, 0},
      {"sum not 1", [](SmallBatch& b) { b.support_probs[5] = 0.5f; }, 1},
      {"drafted token missing", [](SmallBatch& b) { b.support_tokens[5] = 12; }, 1},
      {"drafted token with q = 0",
       [](SmallBatch& b) {
         b.support_probs[0] = 0.0f;
         b.support_probs[1] = 1.0f;
       },
       0},
      {"empty row", [](SmallBatch& b) { b.support_offsets = {0, 2, 5, 5}; }, 1},
      {"row of more than 64 entries", [](SmallBatch& b) { b.support_offsets = {0, 2, 5, 90}; }, 1},
      {"row past the arrays' end", [](SmallBatch& b) { b.support_offsets = {0, 7, 5, 6}; }, 0},
  };
  for (const Fault& f : faults) {
    SmallBatch bad = valid();
    f.corrupt(bad);
    o = run_batch(bad);
    EXPECT_EQ(o.accepted[size_t(f.failed)], -1) << f.what;
    EXPECT_GE(o.accepted[size_t(1 - f.failed)], 0) << f.what;
  }
}

TEST_F(GpuBadInput, InconsistentOffsetsFailTheBatch) {
  SmallBatch s;
  s.offsets = {0, 2, 4};  // offsets[R] = 4 but target_hidden implies 3 drafts
  Outcome o = run_batch(s);
  EXPECT_EQ(o.accepted, (std::vector<int32_t>{-1, -1}));
  EXPECT_EQ(o.emitted, (std::vector<int32_t>(5, -1)));
  s.offsets = {0, 3, 2};  // decreasing
  o = run_batch(s);
  EXPECT_EQ(o.accepted, (std::vector<int32_t>{-1, -1}));
}

TEST_F(GpuBadInput, DraftLengthBeyondMaxFailsTheBatch) {
  SmallBatch s;
  Outcome o = run_batch(s, 1);  // request 0 has 2 drafts
  EXPECT_EQ(o.accepted, (std::vector<int32_t>{-1, -1}));
}

TEST_F(GpuBadInput, DraftRowsReportBadInputAsMinusOne) {
  Rng rng(3);
  Matrix w = random_matrix(FLASHSPEC_DTYPE_BF16, 500, 48, rng, 0.5);
  Matrix h = random_matrix(FLASHSPEC_DTYPE_BF16, 4, 48, rng, 1.0);
  h.set(2, 5, std::nanf(""));
  auto ctx = make_context(ContextOptions(FLASHSPEC_BACKEND_CUDA).seed(1));
  ASSERT_TRUE(ctx);
  auto head = make_head(ctx.get(), w.view(), FLASHSPEC_LM_HEAD_COPY);
  DevMatrix hd(h);
  flashspec_tensor hv = hd.view();
  std::vector<float> temps{1.0f, -1.0f, 0.5f, 0.0f};
  std::vector<int32_t> positions{0, 0, 0, 2000};
  Dev<float> d_temps(temps), d_scores(4);
  Dev<int32_t> d_pos(positions), d_tokens(4);
  flashspec_draft_params p;
  flashspec_draft_params_init(&p);
  p.memory = FLASHSPEC_MEMORY_CUDA;
  p.temperatures = d_temps.ptr();
  p.positions = d_pos.ptr();
  FSGPU_OK(ctx.get(), flashspec_draft(ctx.get(), head.get(), &hv, &p, d_tokens.ptr(), d_scores.ptr()));
  FSGPU_OK(ctx.get(), flashspec_context_synchronize(ctx.get()));
  std::vector<int32_t> tokens = d_tokens.get();
  std::vector<float> scores = d_scores.get();
  EXPECT_GE(tokens[0], 0);
  EXPECT_TRUE(std::isfinite(scores[0]));
  EXPECT_EQ(tokens[1], -1);  // negative temperature
  EXPECT_TRUE(std::isnan(scores[1]));
  EXPECT_EQ(tokens[2], -1);  // NaN hidden value
  EXPECT_EQ(tokens[3], -1);  // position beyond FLASHSPEC_MAX_DRAFT_LEN
}

TEST_F(GpuBadInput, NonFiniteWeightIsRejectedAtCreation) {
  Rng rng(8);
  Matrix w = random_matrix(FLASHSPEC_DTYPE_F16, 64, 16, rng, 1.0);
  w.set(63, 15, INFINITY);
  auto ctx = make_context(ContextOptions(FLASHSPEC_BACKEND_CUDA).seed(1));
  ASSERT_TRUE(ctx);
  flashspec_lm_head* head = nullptr;
  flashspec_tensor wv = w.view();
  EXPECT_EQ(flashspec_lm_head_create(ctx.get(), &wv, FLASHSPEC_LM_HEAD_COPY, &head), FLASHSPEC_ERR_NON_FINITE);
  EXPECT_EQ(head, nullptr);
  DevMatrix wd(w);
  flashspec_tensor wdv = wd.view();
  EXPECT_EQ(flashspec_lm_head_create(ctx.get(), &wdv, FLASHSPEC_LM_HEAD_BORROW, &head), FLASHSPEC_ERR_NON_FINITE);
  // Borrowing host memory is a device mismatch.
  EXPECT_EQ(flashspec_lm_head_create(ctx.get(), &wv, FLASHSPEC_LM_HEAD_BORROW, &head), FLASHSPEC_ERR_DEVICE_MISMATCH);
}

}  // namespace
