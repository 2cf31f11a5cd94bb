// Sampling controls and logprobs on the CUDA backend against the exact CPU
// backend, same seed, token for token: each control alone and llama.cpp's
// default chain, greedy and sampled rows, chains and trees, ≤ 16 rows and
// more, vocabularies of one and of several cuBLAS chunks; the emitted
// tokens' logprobs and the top raw logprobs; fused drafts with controls;
// control values in device memory that only the device can check; a kept
// set larger than the device's candidate list; graph capture. A differing
// token is accepted only at a near-tie (the CUDA summary's candidate gap or
// acceptance margin below kNearTie), counted, as in test_cuda_parity.cc.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "../exactness/reference_controls.h"
#include "capi/handles.h"
#include "gpu_support.h"
#include "testing.h"

using namespace fstest;

namespace {

struct ControlsCase {
  flashspec_dtype dtype;  // W and hidden rows
  int vocab, d, requests, max_n;
  float temperature;      // a third of the requests are greedy
  int top_k;              // 0: no top-k array; else every other request (the rest keep all)
  float top_p;            // 0: no top-p array
  float min_p;            // 0: no min-p array
  bool bias, mask, typical, tree;
  int top_n;              // top raw logprobs (0: none; logprobs always asked for)
  double w_scale = 3.0;   // larger: more peaked rows
  flashspec_dtype stored = kUnquantised;  // E4M3/I8: an 8-bit head quantised from W
  // > 0: the W rows of tokens [vocab / 3, vocab / 3 + clustered) are scaled
  // up fourfold and every other one repeats its predecessor (exact ties),
  // so one stretch of ids, within one or two CTAs of the streaming scan,
  // holds most of every row's best tokens.
  int clustered = 0;
};

// The per-request controls of a case, host side, and their device copies.
struct CaseControls {
  std::vector<int32_t> top_k, bias_offsets, bias_tokens;
  std::vector<float> top_p, min_p, bias_values, penalty, typical_eps;
  std::vector<uint32_t> mask;
  int32_t words = 0;
};

CaseControls make_controls(const ControlsCase& c, const std::vector<int32_t>& offsets, Rng& rng) {
  CaseControls k;
  const int rows = offsets.back() + c.requests;
  k.words = (c.vocab + 31) / 32;
  k.bias_offsets.push_back(0);
  for (int r = 0; r < c.requests; ++r) {
    k.top_k.push_back(r % 2 == 0 ? c.top_k : FLASHSPEC_TOP_K_ALL);
    k.top_p.push_back(r % 4 == 3 ? 1.0f : c.top_p);
    k.min_p.push_back(r % 5 == 4 ? 0.0f : c.min_p);
    k.penalty.push_back(r % 3 == 1 ? 1.0f : 1.3f);
    k.typical_eps.push_back(r % 2 == 1 ? 0.25f : 0.0f);
    const int entries = c.bias ? rng.below(6) : 0;
    for (int e = 0; e < entries; ++e) {
      k.bias_tokens.push_back(rng.below(std::min(c.vocab, 64)) + (e % 2 ? c.vocab / 2 : 0));
      k.bias_values.push_back(float(rng.uniform() * 6.0 - 3.0));
    }
    if (c.bias && r % 3 == 0) {  // a repeated token: its entries add up
      k.bias_tokens.push_back(3);
      k.bias_values.push_back(1.5f);
      k.bias_tokens.push_back(3);
      k.bias_values.push_back(0.75f);
    }
    k.bias_offsets.push_back(int32_t(k.bias_tokens.size()));
  }
  if (c.mask) {
    k.mask.assign(static_cast<size_t>(rows) * size_t(k.words), 0);
    for (int row = 0; row < rows; ++row)
      for (int i = 0; i < c.vocab; ++i)
        if (rng.below(10) < 7) k.mask[size_t(row) * k.words + size_t(i / 32)] |= 1u << (i % 32);
  }
  return k;
}

flashspec_sampling_controls host_view(const ControlsCase& c, const CaseControls& k) {
  flashspec_sampling_controls s;
  flashspec_sampling_controls_init(&s);
  if (c.top_k) s.top_k = k.top_k.data();
  if (c.top_p > 0) s.top_p = k.top_p.data();
  if (c.min_p > 0) s.min_p = k.min_p.data();
  if (c.bias) {
    s.bias_offsets = k.bias_offsets.data();
    s.bias_tokens = k.bias_tokens.data();
    s.bias_values = k.bias_values.data();
    s.repetition_penalty = k.penalty.data();
  }
  if (c.mask) s.token_mask = k.mask.data();
  if (c.typical) s.typical_epsilon = k.typical_eps.data();
  return s;
}

// Device copies of every array a controls struct may name.
struct DeviceControls {
  Dev<int32_t> top_k, bias_offsets, bias_tokens;
  Dev<float> top_p, min_p, bias_values, penalty, typical_eps;
  Dev<uint32_t> mask;
  explicit DeviceControls(const CaseControls& k)
      : top_k(k.top_k), bias_offsets(k.bias_offsets), bias_tokens(with_one(k.bias_tokens)), top_p(k.top_p),
        min_p(k.min_p), bias_values(with_one(k.bias_values)), penalty(k.penalty), typical_eps(k.typical_eps),
        mask(with_one(k.mask)) {}
  template <class T>
  static std::vector<T> with_one(const std::vector<T>& v) {
    return v.empty() ? std::vector<T>(1) : v;
  }
  flashspec_sampling_controls view(const flashspec_sampling_controls& host) const {
    flashspec_sampling_controls s = host;
    if (s.top_k) s.top_k = top_k.ptr();
    if (s.top_p) s.top_p = top_p.ptr();
    if (s.min_p) s.min_p = min_p.ptr();
    if (s.bias_offsets) {
      s.bias_offsets = bias_offsets.ptr();
      s.bias_tokens = bias_tokens.ptr();
      s.bias_values = bias_values.ptr();
    }
    if (s.repetition_penalty) s.repetition_penalty = penalty.ptr();
    if (s.token_mask) s.token_mask = mask.ptr();
    if (s.typical_epsilon) s.typical_epsilon = typical_eps.ptr();
    return s;
  }
};

struct Outcome {
  int near_ties = 0, accepted = 0, rejections = 0, compared_logprobs = 0;
};

Outcome run_controls_parity(const ControlsCase& c) {
  Outcome out;
  Rng rng(4242 + c.vocab + c.requests * 7 + c.top_k * 3 + int(c.top_p * 100) + int(c.min_p * 1000) +
          (c.bias ? 11 : 0) + (c.mask ? 13 : 0) + (c.tree ? 17 : 0));
  Matrix w = random_matrix(c.dtype, c.vocab, c.d, rng, c.w_scale / std::sqrt(double(c.d)));
  for (int i = 0; i < c.clustered; ++i) {
    const int token = c.vocab / 3 + i, source = i % 2 == 1 ? token - 1 : token;
    for (int k = 0; k < c.d; ++k)
      w.set(token, k, i % 2 == 1 ? w.exact[size_t(source * c.d + k)] : 4.0 * w.exact[size_t(token * c.d + k)]);
  }
  const Matrix reference = dequantised(w, c.stored);
  std::vector<int32_t> offsets(1, 0), tokens, parents;
  std::vector<float> temps;
  std::vector<uint64_t> seeds, ids, steps;
  for (int r = 0; r < c.requests; ++r) {
    const int n = rng.below(c.max_n + 1);
    offsets.push_back(offsets.back() + n);
    temps.push_back(r % 3 == 2 ? 0.0f : c.temperature * float(0.8 + 0.2 * (r % 3)));
    seeds.push_back(0x5eed + uint64_t(r % 3));
    ids.push_back(uint64_t(r) * 13 + 5);
    steps.push_back(uint64_t(r % 4));
  }
  const int total_drafts = offsets.back(), rows = total_drafts + c.requests;
  Matrix h = random_matrix(c.dtype, rows, c.d, rng, 1.0);
  for (int r = 0; r < c.requests; ++r)
    for (int j = 0; j < offsets[size_t(r + 1)] - offsets[size_t(r)]; ++j) {
      const int parent = c.tree ? rng.below(j + 1) - 1 : j - 1;
      if (c.tree) parents.push_back(parent);
      const int row = offsets[size_t(r)] + r + parent + 1;
      int32_t best = 0;
      double best_logit = -1e300;
      for (int i = 0; i < c.vocab; ++i) {
        const double l = exact_logit(reference, h, row, i);
        if (l > best_logit) best_logit = l, best = i;
      }
      tokens.push_back(rng.below(3) == 0 ? rng.below(c.vocab) : best);
    }
  if (tokens.empty()) tokens.push_back(0);
  if (parents.empty()) parents.push_back(-1);
  const CaseControls k = make_controls(c, offsets, rng);
  const flashspec_sampling_controls hc = host_view(c, k);

  auto cpu = make_context(ContextOptions(FLASHSPEC_BACKEND_CPU).seed(31));
  auto gpu = make_context(ContextOptions(FLASHSPEC_BACKEND_CUDA).seed(31).max_rows(std::max(rows, 1)));
  EXPECT_TRUE(cpu && gpu);
  if (!cpu || !gpu) return out;
  flashspec_tensor wv = w.view();
  auto cpu_head = make_case_head(cpu.get(), wv, FLASHSPEC_LM_HEAD_COPY, c.stored);
  auto gpu_head = make_case_head(gpu.get(), wv, FLASHSPEC_LM_HEAD_COPY, c.stored);
  flashspec_tensor hv = h.view();
  flashspec_verify_batch hb;
  flashspec_verify_batch_init(&hb);
  hb.num_requests = c.requests;
  hb.draft_offsets = offsets.data();
  hb.draft_tokens = tokens.data();
  hb.target_hidden = &hv;
  hb.temperatures = temps.data();
  hb.seeds = seeds.data();
  hb.request_ids = ids.data();
  hb.steps = steps.data();
  hb.draft_parents = c.tree ? parents.data() : nullptr;
  hb.controls = &hc;
  hb.logprobs = 1;
  hb.top_logprobs = c.top_n;
  const size_t n_top = static_cast<size_t>(rows) * size_t(std::max(c.top_n, 1));
  std::vector<int32_t> cpu_acc(size_t(c.requests)), cpu_emit(static_cast<size_t>(rows)), cpu_top(n_top);
  std::vector<float> cpu_lp(static_cast<size_t>(rows)), cpu_raw(static_cast<size_t>(rows)), cpu_toplp(n_top);
  flashspec_verify_result hr;
  flashspec_verify_result_init(&hr);
  hr.accepted_counts = cpu_acc.data();
  hr.emitted_tokens = cpu_emit.data();
  hr.logprobs = cpu_lp.data();
  hr.raw_logprobs = cpu_raw.data();
  if (c.top_n) {
    hr.top_tokens = cpu_top.data();
    hr.top_logprobs = cpu_toplp.data();
  }
  const flashspec_status cs = flashspec_verify_and_finalize(cpu.get(), cpu_head.get(), &hb, &hr);
  EXPECT_EQ(cs, FLASHSPEC_OK) << flashspec_context_last_error(cpu.get());
  if (cs != FLASHSPEC_OK) return out;

  DevMatrix hd(h);
  flashspec_tensor hdv = hd.view();
  const DeviceControls dk(k);
  const flashspec_sampling_controls dc = dk.view(hc);
  Dev<int32_t> d_off(offsets), d_tok(tokens), d_parents(parents), d_acc(size_t(c.requests)),
      d_emit(static_cast<size_t>(rows)), d_top(n_top);
  Dev<float> d_temps(temps), d_lp(static_cast<size_t>(rows)), d_raw(static_cast<size_t>(rows)), d_toplp(n_top);
  Dev<uint64_t> d_seeds(seeds), d_ids(ids), d_steps(steps);
  flashspec_verify_batch db = hb;
  db.memory = FLASHSPEC_MEMORY_CUDA;
  db.draft_offsets = d_off.ptr();
  db.draft_tokens = d_tok.ptr();
  db.target_hidden = &hdv;
  db.temperatures = d_temps.ptr();
  db.seeds = d_seeds.ptr();
  db.request_ids = d_ids.ptr();
  db.steps = d_steps.ptr();
  db.draft_parents = c.tree ? d_parents.ptr() : nullptr;
  db.controls = &dc;
  flashspec_verify_result dr;
  flashspec_verify_result_init(&dr);
  dr.memory = FLASHSPEC_MEMORY_CUDA;
  dr.accepted_counts = d_acc.ptr();
  dr.emitted_tokens = d_emit.ptr();
  dr.logprobs = d_lp.ptr();
  dr.raw_logprobs = d_raw.ptr();
  if (c.top_n) {
    dr.top_tokens = d_top.ptr();
    dr.top_logprobs = d_toplp.ptr();
  }
  flashspec_summaries* sums_raw = nullptr;
  EXPECT_EQ(flashspec_summaries_create(gpu.get(), rows, c.requests, &sums_raw), FLASHSPEC_OK);
  SummariesPtr sums(sums_raw);
  flashspec_status gs = flashspec_verify(gpu.get(), gpu_head.get(), &db, sums.get());
  if (gs == FLASHSPEC_OK) gs = flashspec_finalize(gpu.get(), &db, sums.get(), &dr);
  if (gs == FLASHSPEC_OK) gs = flashspec_context_synchronize(gpu.get());
  EXPECT_EQ(gs, FLASHSPEC_OK) << flashspec_context_last_error(gpu.get());
  if (gs != FLASHSPEC_OK) return out;
  const std::vector<int32_t> gpu_acc = d_acc.get(), gpu_emit = d_emit.get(), gpu_top = d_top.get();
  const std::vector<float> gpu_lp = d_lp.get(), gpu_raw = d_raw.get(), gpu_toplp = d_toplp.get();
  std::vector<flashspec::RowSummary> rs(static_cast<size_t>(rows));
  EXPECT_TRUE(flashspec::cuda::read_summaries(*sums->store, rows, rs.data()));

  for (int r = 0; r < c.requests; ++r) {
    const int first = offsets[size_t(r)], n = offsets[size_t(r + 1)] - first, row0 = first + r;
    for (int j = 0; j <= n; ++j) EXPECT_EQ(rs[size_t(row0 + j)].status, 0) << "request " << r << " row " << j;
    EXPECT_GE(gpu_acc[size_t(r)], 0) << "request " << r;
    if (gpu_acc[size_t(r)] < 0) continue;
    out.accepted += gpu_acc[size_t(r)];
    if (gpu_acc[size_t(r)] < n) ++out.rejections;
    bool same = cpu_acc[size_t(r)] == gpu_acc[size_t(r)];
    for (int s = 0; s <= n && same; ++s) same = cpu_emit[size_t(row0 + s)] == gpu_emit[size_t(row0 + s)];
    if (same) {
      // The same tokens: the same logprobs (fp32 on both sides) and top tokens.
      for (int s = 0; s <= gpu_acc[size_t(r)]; ++s) {
        const size_t slot = size_t(row0 + s);
        // Raw logprobs against the float64 softmax of the exact logits (a
        // chain's slot s is drawn by row s): the CPU's sequential fp32 sum
        // over a large vocabulary is itself off by more than 1e-4.
        std::vector<double> raw_ref;
        const int32_t token = gpu_emit[slot];
        if (!c.tree) {
          std::vector<double> l(static_cast<size_t>(c.vocab));
          for (int i = 0; i < c.vocab; ++i) l[size_t(i)] = exact_logit(reference, h, int64_t(slot), i);
          raw_ref = raw_log_softmax(l);
          EXPECT_NEAR(gpu_raw[slot], raw_ref[size_t(token)], 1e-4) << "request " << r << " slot " << s;
          // The controlled logprob against the float64 controls.
          if (temps[size_t(r)] > 0.0f) {
            ReferenceControls rc;
            if (c.top_k && k.top_k[size_t(r)] != FLASHSPEC_TOP_K_ALL) rc.top_k = k.top_k[size_t(r)];
            if (c.top_p > 0) rc.top_p = k.top_p[size_t(r)];
            if (c.min_p > 0) rc.min_p = k.min_p[size_t(r)];
            if (c.bias) {
              for (int e = k.bias_offsets[size_t(r)]; e < k.bias_offsets[size_t(r + 1)]; ++e)
                rc.bias.emplace_back(k.bias_tokens[size_t(e)], k.bias_values[size_t(e)]);
              rc.repetition = k.penalty[size_t(r)];
            }
            if (c.mask) {
              rc.allowed.resize(size_t(c.vocab));
              for (int i = 0; i < c.vocab; ++i)
                rc.allowed[size_t(i)] = (k.mask[slot * size_t(k.words) + size_t(i / 32)] >> (i % 32)) & 1u;
            }
            const double p_ref = controlled(l, temps[size_t(r)], rc)[size_t(token)];
            if (p_ref > 0.0) {
              EXPECT_NEAR(gpu_lp[slot], std::log(p_ref), 1e-4)
                  << "request " << r << " slot " << s << " token " << token << " T " << temps[size_t(r)] << " k "
                  << k.top_k[size_t(r)] << " (CPU " << cpu_lp[slot] << ")";
            } else {
              EXPECT_EQ(gpu_lp[slot], -INFINITY) << "request " << r << " slot " << s;
            }
          }
        } else {
          EXPECT_NEAR(gpu_raw[slot], cpu_raw[slot], 1e-4) << "request " << r << " slot " << s;
          if (std::isinf(cpu_lp[slot])) {
            EXPECT_EQ(gpu_lp[slot], cpu_lp[slot]) << "request " << r << " slot " << s;
          } else {
            EXPECT_NEAR(gpu_lp[slot], cpu_lp[slot], 1e-4) << "request " << r << " slot " << s;
          }
        }
        ++out.compared_logprobs;
        for (int i = 0; i < c.top_n; ++i) {
          const size_t t = slot * size_t(c.top_n) + size_t(i);
          EXPECT_EQ(gpu_top[t], cpu_top[t]) << "request " << r << " slot " << s << " top " << i;
          if (gpu_top[t] == cpu_top[t] && gpu_top[t] >= 0) {
            EXPECT_NEAR(gpu_toplp[t], raw_ref.empty() ? cpu_toplp[t] : raw_ref[size_t(gpu_top[t])], 1e-4);
          }
        }
      }
      for (int s = gpu_acc[size_t(r)] + 1; s <= n; ++s) EXPECT_TRUE(std::isnan(gpu_lp[size_t(row0 + s)]));
      continue;
    }
    // Different walks: the row where they part must be decided by a near-tie.
    double margin = 1e300;
    if (c.tree) {
      for (int j = 0; j <= n; ++j) margin = std::min(margin, double(rs[size_t(row0 + j)].candidate_gap));
    } else {
      const int stop = std::min(cpu_acc[size_t(r)], gpu_acc[size_t(r)]);
      const flashspec::RowSummary& s = rs[size_t(row0 + stop)];
      if (cpu_acc[size_t(r)] == gpu_acc[size_t(r)] || temps[size_t(r)] == 0.0f) {
        margin = s.candidate_gap;
      } else if (s.typical) {
        margin = std::fabs((s.draft_logit - s.lse) - s.typical_log_threshold);
      } else {
        const double log_u = std::log(flashspec_rng_uniform(seeds[size_t(r)], ids[size_t(r)], steps[size_t(r)], stop,
                                                            FLASHSPEC_RNG_ACCEPT_UNIFORM, 0));
        margin = std::fabs(log_u - (s.draft_logit - s.lse));
      }
    }
    EXPECT_LT(margin, kNearTie) << "request " << r << " differs (CPU accepted " << cpu_acc[size_t(r)] << ", CUDA "
                                << gpu_acc[size_t(r)] << ") without a near-tie (margin " << margin << ")";
    ++out.near_ties;
  }
  std::printf("[ controls ] V=%d rows=%d k=%d p=%.2f min_p=%.2f%s%s%s%s top_n=%d: %d accepted, %d rejections, "
              "%d near-tie(s), %d logprob slots compared\n",
              c.vocab, rows, c.top_k, c.top_p, c.min_p, c.bias ? " bias" : "", c.mask ? " mask" : "",
              c.typical ? " typical" : "", c.tree ? " tree" : "", c.top_n, out.accepted, out.rejections, out.near_ties,
              out.compared_logprobs);
  EXPECT_LE(out.near_ties, std::max(1, c.requests / 50));
  return out;
}

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override { FSGPU_SKIP_WITHOUT_DEVICE(); }
};

constexpr flashspec_dtype kBf16 = FLASHSPEC_DTYPE_BF16;

// llama.cpp's default chain: top-k 40, top-p 0.95, min-p 0.05, T 0.8.
TEST_F(Gpu, LlamaCppChainMatchesCpu) {
  int accepted = 0, rejections = 0;
  for (int requests : {4, 40}) {
    const Outcome o = run_controls_parity({kBf16, 3001, 128, requests, 3, 0.8f, 40, 0.95f, 0.05f, false, false,
                                           false, false, 0});
    accepted += o.accepted;
    rejections += o.rejections;
  }
  EXPECT_GT(accepted, 0);
  EXPECT_GT(rejections, 0);
}

TEST_F(Gpu, EachControlAloneMatchesCpu) {
  for (int requests : {5, 30}) {
    run_controls_parity({kBf16, 2503, 96, requests, 3, 1.0f, 1, 0, 0, false, false, false, false, 0});       // top-k 1
    run_controls_parity({kBf16, 2503, 96, requests, 3, 1.0f, 7, 0, 0, false, false, false, false, 0});       // top-k 7
    run_controls_parity({kBf16, 2503, 96, requests, 3, 1.0f, 1024, 0, 0, false, false, false, false, 0});  // top-k 1024
    run_controls_parity({kBf16, 2503, 96, requests, 3, 1.0f, 0, 0.9f, 0, false, false, false, false, 0, 6.0});  // top-p
    run_controls_parity({kBf16, 2503, 96, requests, 3, 1.0f, 0, 0, 0.1f, false, false, false, false, 0, 6.0});  // min-p
    run_controls_parity({kBf16, 2503, 96, requests, 3, 1.0f, 0, 0, 0, true, false, false, false, 0});        // bias
    run_controls_parity({kBf16, 2503, 96, requests, 3, 1.0f, 0, 0, 0, false, true, false, false, 0});        // mask
    run_controls_parity({kBf16, 2503, 96, requests, 3, 1.0f, 0, 0, 0, false, false, true, false, 0});        // typical
  }
}

TEST_F(Gpu, EveryControlTogetherMatchesCpu) {
  run_controls_parity({kBf16, 3001, 128, 6, 3, 0.9f, 40, 0.9f, 0.05f, true, true, true, false, 5});
  run_controls_parity({kBf16, 3001, 128, 40, 3, 0.9f, 40, 0.9f, 0.05f, true, true, true, false, 20});
  run_controls_parity({FLASHSPEC_DTYPE_F16, 2003, 72, 12, 2, 1.1f, 300, 0.95f, 0.02f, true, true, false, false, 3});
}

TEST_F(Gpu, TreesWithControlsMatchCpu) {
  run_controls_parity({kBf16, 2503, 96, 5, 5, 0.8f, 40, 0.95f, 0.05f, true, true, false, true, 4});
  run_controls_parity({kBf16, 2503, 96, 20, 5, 0.8f, 40, 0.95f, 0.05f, true, false, false, true, 0});
}

// 8-bit heads: the controlled pass's cuBLAS chunks over bf16 copies of the
// codes, each logit times its row's scale.
TEST_F(Gpu, QuantisedHeadsWithControlsMatchCpu) {
  for (flashspec_dtype stored : {FLASHSPEC_DTYPE_E4M3, FLASHSPEC_DTYPE_I8}) {
    ControlsCase c{kBf16, 9001, 96, 6, 3, 0.8f, 40, 0.95f, 0.05f, true, true, false, false, 5};
    c.stored = stored;
    run_controls_parity(c);
    c.requests = 30;
    c.vocab = 70001;
    run_controls_parity(c);
  }
}

// The controlled streaming scan (≤ 16 rows): best tokens packed into one
// stretch of ids with exact ties among them (the CTAs there keep their own
// best `keep`; the rest find a bound in the keys every CTA published), top-k
// below and above the bound's reach (64), 8-bit heads, and a vocabulary of
// a few tiles (two CTAs, each finishing several rows).
TEST_F(Gpu, StreamingScanWithClusteredTokensMatchesCpu) {
  for (int requests : {2, 4, 7})  // 5, 7 and 13 rows
    run_controls_parity({kBf16, 211, 64, requests, 3, 0.8f, 40, 0.95f, 0.05f, true, true, false, false, 4});
  for (int top_k : {40, 64, 100}) {
    ControlsCase c{kBf16, 30011, 64, 4, 3, 0.9f, top_k, 0.95f, 0.0f, true, false, false, false, 6};
    c.clustered = 600;
    run_controls_parity(c);
  }
  ControlsCase masked{kBf16, 30011, 64, 4, 3, 0.9f, 40, 0.9f, 0.05f, false, true, false, true, 0};
  masked.clustered = 300;
  run_controls_parity(masked);
  for (flashspec_dtype stored : {FLASHSPEC_DTYPE_E4M3, FLASHSPEC_DTYPE_I8}) {
    ControlsCase q{kBf16, 9001, 96, 4, 3, 0.8f, 40, 0.95f, 0.05f, true, true, false, false, 5};
    q.stored = stored;
    run_controls_parity(q);
  }
}

// Logprobs alone, in fp32 (cuBLAS in full fp32 on the device).
TEST_F(Gpu, LogprobsWithoutControlsMatchCpu) {
  const Outcome o = run_controls_parity({FLASHSPEC_DTYPE_F32, 1500, 64, 10, 3, 1.0f, 0, 0, 0, false, false, false,
                                         false, FLASHSPEC_MAX_TOP_LOGPROBS});
  EXPECT_GT(o.compared_logprobs, 0);
}

// Vocabularies of several cuBLAS chunks, and the real ones.
TEST_F(Gpu, LargeVocabulariesMatchCpu) {
  run_controls_parity({kBf16, 70001, 64, 5, 2, 0.8f, 40, 0.95f, 0.05f, true, true, false, false, 8});
  run_controls_parity({kBf16, 70001, 64, 24, 2, 1.0f, 1024, 0, 0, false, false, false, false, 0});
  run_controls_parity({kBf16, 128256, 64, 3, 2, 0.8f, 40, 0.95f, 0.05f, true, false, false, false, 4});
}

// Fused drafts with controls, greedy and sampled rows.
// Flat rows without top-k keep more tokens than the candidate list (the
// passes that continue them serve drafts too).
TEST_F(Gpu, DraftsWithControlsMatchCpu) {
  for (const bool flat : {false, true})
  for (int rows : {3, 16, 40}) {
    Rng rng(900 + rows);
    const int vocab = flat ? 20011 : 3001, d = 96;
    Matrix w = random_matrix(kBf16, vocab, d, rng, (flat ? 1.0 : 3.0) / std::sqrt(double(d)));
    Matrix h = random_matrix(kBf16, rows, d, rng, 1.0);
    const ControlsCase c{kBf16, vocab, d, rows, 0, 1.0f, flat ? 0 : 40, 0.9f, 0.05f, true, true, false, false, 0};
    const CaseControls kr = make_controls(c, std::vector<int32_t>{0}, rng);  // no drafts: a mask row per row
    const flashspec_sampling_controls hc = host_view(c, kr);
    std::vector<float> temps(static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) temps[size_t(r)] = r % 4 == 3 ? 0.0f : 0.9f;
    auto cpu = make_context(ContextOptions(FLASHSPEC_BACKEND_CPU).seed(5));
    auto gpu = make_context(ContextOptions(FLASHSPEC_BACKEND_CUDA).seed(5).max_rows(64));
    ASSERT_TRUE(cpu && gpu);
    flashspec_tensor wv = w.view(), hv = h.view();
    auto cpu_head = make_head(cpu.get(), wv);
    auto gpu_head = make_head(gpu.get(), wv);
    flashspec_draft_params hp;
    flashspec_draft_params_init(&hp);
    hp.temperatures = temps.data();
    hp.controls = &hc;
    std::vector<int32_t> cpu_tokens(static_cast<size_t>(rows));
    std::vector<float> cpu_scores(static_cast<size_t>(rows));
    FSGPU_OK(cpu.get(), flashspec_draft(cpu.get(), cpu_head.get(), &hv, &hp, cpu_tokens.data(), cpu_scores.data()));
    DevMatrix hd(h);
    flashspec_tensor hdv = hd.view();
    const DeviceControls dk(kr);
    const flashspec_sampling_controls dc = dk.view(hc);
    Dev<float> d_temps(temps), d_scores(static_cast<size_t>(rows));
    Dev<int32_t> d_tokens(static_cast<size_t>(rows));
    flashspec_draft_params dp = hp;
    dp.memory = FLASHSPEC_MEMORY_CUDA;
    dp.temperatures = d_temps.ptr();
    dp.controls = &dc;
    FSGPU_OK(gpu.get(), flashspec_draft(gpu.get(), gpu_head.get(), &hdv, &dp, d_tokens.ptr(), d_scores.ptr()));
    FSGPU_OK(gpu.get(), flashspec_context_synchronize(gpu.get()));
    const std::vector<int32_t> gpu_tokens = d_tokens.get();
    const std::vector<float> gpu_scores = d_scores.get();
    int differ = 0;
    for (int r = 0; r < rows; ++r) {
      if (gpu_tokens[size_t(r)] == cpu_tokens[size_t(r)]) {
        EXPECT_NEAR(gpu_scores[size_t(r)], cpu_scores[size_t(r)], 1e-3) << "row " << r;
        continue;
      }
      ++differ;
    }
    EXPECT_LE(differ, 1) << rows << (flat ? " flat" : "") << " rows";
  }
}

// The fused top-k draft: each row's k best tokens by l + bias over the
// allowed tokens and their log-probabilities, as the CPU backend gives them.
TEST_F(Gpu, DraftTopKMatchesCpu) {
  for (int vocab : {3001, 70001})
    for (int rows : {3, 16, 40}) {
      Rng rng(1300 + vocab + rows);
      const int d = 64;
      Matrix w = random_matrix(kBf16, vocab, d, rng, 3.0 / std::sqrt(double(d)));
      Matrix h = random_matrix(kBf16, rows, d, rng, 1.0);
      const ControlsCase c{kBf16, vocab, d, rows, 0, 1.0f, 0, 0, 0, true, true, false, false, 0};
      const CaseControls k = make_controls(c, std::vector<int32_t>{0}, rng);  // a mask row per row
      const flashspec_sampling_controls hc = host_view(c, k);
      auto cpu = make_context(ContextOptions(FLASHSPEC_BACKEND_CPU).seed(5));
      auto gpu = make_context(ContextOptions(FLASHSPEC_BACKEND_CUDA).seed(5).max_rows(64));
      ASSERT_TRUE(cpu && gpu);
      flashspec_tensor wv = w.view(), hv = h.view();
      auto cpu_head = make_head(cpu.get(), wv);
      auto gpu_head = make_head(gpu.get(), wv);
      DevMatrix hd(h);
      flashspec_tensor hdv = hd.view();
      const DeviceControls dk(k);
      const flashspec_sampling_controls dc = dk.view(hc);
      for (int top : {1, 5, FLASHSPEC_MAX_DRAFT_TOP_K}) {
        const size_t n = size_t(rows) * size_t(top);
        flashspec_draft_params hp;
        flashspec_draft_params_init(&hp);
        hp.controls = &hc;
        std::vector<int32_t> cpu_tokens(n);
        std::vector<float> cpu_lp(n);
        FSGPU_OK(cpu.get(), flashspec_draft_top_k(cpu.get(), cpu_head.get(), &hv, &hp, top, cpu_tokens.data(),
                                                  cpu_lp.data()));
        flashspec_draft_params dp = hp;
        dp.memory = FLASHSPEC_MEMORY_CUDA;
        dp.controls = &dc;
        Dev<int32_t> d_tokens(n);
        Dev<float> d_lp(n);
        FSGPU_OK(gpu.get(), flashspec_draft_top_k(gpu.get(), gpu_head.get(), &hdv, &dp, top, d_tokens.ptr(),
                                                  d_lp.ptr()));
        FSGPU_OK(gpu.get(), flashspec_context_synchronize(gpu.get()));
        const std::vector<int32_t> gpu_tokens = d_tokens.get();
        const std::vector<float> gpu_lp = d_lp.get();
        int swapped = 0;
        for (size_t i = 0; i < n; ++i) {
          if (gpu_tokens[i] != cpu_tokens[i]) {  // two neighbours in rank that nearly tie
            ++swapped;
            EXPECT_NEAR(gpu_lp[i], cpu_lp[i], kNearTie) << "V " << vocab << " row " << i / size_t(top);
            continue;
          }
          EXPECT_NEAR(gpu_lp[i], cpu_lp[i], 1e-4) << "V " << vocab << " slot " << i;
        }
        EXPECT_LE(swapped, 2) << "V " << vocab << " rows " << rows << " k " << top;
      }
    }
}

// A device batch of `requests` requests without drafts (one row each)
// under `controls`, and its device result arrays.
struct BonusOnlyCall {
  flashspec_verify_batch batch;
  flashspec_verify_result result;
  BonusOnlyCall(int requests, const flashspec_tensor* hidden, const int32_t* offsets,
                const flashspec_sampling_controls* controls, int32_t* accepted, int32_t* emitted) {
    flashspec_verify_batch_init(&batch);
    batch.memory = FLASHSPEC_MEMORY_CUDA;
    batch.num_requests = requests;
    batch.draft_offsets = offsets;
    batch.target_hidden = hidden;
    batch.controls = controls;
    flashspec_verify_result_init(&result);
    result.memory = FLASHSPEC_MEMORY_CUDA;
    result.accepted_counts = accepted;
    result.emitted_tokens = emitted;
  }
};

// Control values in device memory are checked on the device: a request
// with a bad value (or a mask that allows nothing) fails alone, with the
// status in its rows' summaries; the others are verified.
TEST_F(Gpu, BadDeviceControlValuesFailTheirRequestOnly) {
  const int vocab = 1000, d = 64, requests = 6;
  Rng rng(77);
  Matrix w = random_matrix(kBf16, vocab, d, rng, 0.3);
  Matrix h = random_matrix(kBf16, requests, d, rng, 1.0);  // no drafts: one row per request
  std::vector<int32_t> offsets(requests + 1, 0), top_k{40, 0, 40, 40, 40, 40}, bias_offsets{0, 0, 0, 0, 1, 1, 2};
  std::vector<int32_t> bias_tokens{vocab + 5, 4};
  std::vector<float> top_p{0.9f, 0.9f, 1.5f, 0.9f, 0.9f, 0.9f}, bias_values{1.0f, NAN};
  const int words = (vocab + 31) / 32;
  std::vector<uint32_t> mask(size_t(requests) * words, 0xffffffffu);
  for (int i = 0; i < words; ++i) mask[size_t(1) * words + i] = 0;  // request 1: top-k 0 and an empty mask
  // Request 0 is valid; 1: top-k 0; 2: top-p 1.5; 3: bias token out of range;
  // 4: valid; 5: a NaN bias value.
  Dev<int32_t> d_off(offsets), d_k(top_k), d_boff(bias_offsets), d_btok(bias_tokens), d_acc(requests),
      d_emit(requests);
  Dev<float> d_p(top_p), d_bval(bias_values);
  Dev<uint32_t> d_mask(mask);
  auto gpu = make_context(ContextOptions(FLASHSPEC_BACKEND_CUDA).seed(1));
  ASSERT_TRUE(gpu);
  flashspec_tensor wv = w.view();
  auto head = make_head(gpu.get(), wv);
  DevMatrix hd(h);
  flashspec_tensor hdv = hd.view();
  flashspec_sampling_controls dc;
  flashspec_sampling_controls_init(&dc);
  dc.top_k = d_k.ptr();
  dc.top_p = d_p.ptr();
  dc.bias_offsets = d_boff.ptr();
  dc.bias_tokens = d_btok.ptr();
  dc.bias_values = d_bval.ptr();
  dc.token_mask = d_mask.ptr();
  const BonusOnlyCall call(requests, &hdv, d_off.ptr(), &dc, d_acc.ptr(), d_emit.ptr());
  const flashspec_verify_batch& db = call.batch;
  const flashspec_verify_result& dr = call.result;
  FSGPU_OK(gpu.get(), flashspec_verify_and_finalize(gpu.get(), head.get(), &db, &dr));
  FSGPU_OK(gpu.get(), flashspec_context_synchronize(gpu.get()));
  const std::vector<int32_t> acc = d_acc.get(), emit = d_emit.get();
  const std::vector<int32_t> expect{0, -1, -1, -1, 0, -1};
  for (int r = 0; r < requests; ++r) {
    EXPECT_EQ(acc[size_t(r)], expect[size_t(r)]) << "request " << r;
    if (expect[size_t(r)] == 0) EXPECT_GE(emit[size_t(r)], 0) << "request " << r;
    else EXPECT_EQ(emit[size_t(r)], -1) << "request " << r;
  }
  // A valid top-k with an empty mask alone fails its request too.
  top_k[1] = 40;
  d_k.put(top_k);
  FSGPU_OK(gpu.get(), flashspec_verify_and_finalize(gpu.get(), head.get(), &db, &dr));
  FSGPU_OK(gpu.get(), flashspec_context_synchronize(gpu.get()));
  EXPECT_EQ(d_acc.get()[1], -1);
}

// Top-p or min-p without top-k on flat rows keep more tokens than the
// device's candidate list: those rows continue in two more passes over W (a
// mass histogram, then the crossing bin's tokens) and match the CPU backend,
// several cuBLAS chunks, with bias, mask, typical acceptance and top logprobs.
TEST_F(Gpu, KeptSetsBeyondTheCandidateListMatchCpu) {
  run_controls_parity({kBf16, 70001, 64, 6, 2, 1.0f, 0, 0.9f, 0, false, false, false, false, 0, 1.0});  // top-p
  run_controls_parity({kBf16, 20011, 64, 8, 2, 1.0f, 0, 0, 0.05f, false, false, false, false, 0, 1.0});  // min-p
  run_controls_parity({kBf16, 20011, 96, 8, 3, 0.9f, 0, 0.9f, 0.01f, true, true, true, false, 4, 1.0});
  run_controls_parity({kBf16, 20011, 96, 30, 3, 1.2f, 0, 0.95f, 0, true, false, false, false, 0, 1.5});
  run_controls_parity({kBf16, 20011, 96, 6, 4, 0.8f, 0, 0.8f, 0.02f, false, true, false, true, 2, 1.0});  // trees
  // With a top-k array (≤ 16 rows: the controlled streaming scan), the
  // requests without top-k continue over logits the streaming loop computes.
  run_controls_parity({kBf16, 20011, 64, 4, 3, 1.0f, 40, 0.9f, 0.01f, true, false, false, false, 3, 1.0});
  run_controls_parity({kBf16, 70001, 64, 3, 2, 1.0f, 10, 0.9f, 0, false, true, false, false, 0, 1.0});
}

// Only a crossing bin (1/128 nat of x) holding more tokens than the list can
// still not be cut: nearly flat rows over 70001 tokens fail that request with
// UNSUPPORTED in its rows' summaries (the CPU backend serves it); a peaked
// request beside it is served.
TEST_F(Gpu, CrossingBinBeyondTheCandidateListIsUnsupported) {
  const int vocab = 70001, d = 64, requests = 2;
  Rng rng(8);
  Matrix w = random_matrix(kBf16, vocab, d, rng, 0.001);  // nearly flat rows
  Matrix h = random_matrix(kBf16, requests, d, rng, 1.0);
  std::vector<int32_t> offsets(requests + 1, 0);
  std::vector<float> top_p{0.5f, 0.001f};  // request 1's nucleus is its argmax
  Dev<int32_t> d_off(offsets), d_acc(requests), d_emit(requests);
  Dev<float> d_p(top_p);
  auto gpu = make_context(ContextOptions(FLASHSPEC_BACKEND_CUDA).seed(1));
  ASSERT_TRUE(gpu);
  flashspec_tensor wv = w.view();
  auto head = make_head(gpu.get(), wv);
  DevMatrix hd(h);
  flashspec_tensor hdv = hd.view();
  flashspec_sampling_controls dc;
  flashspec_sampling_controls_init(&dc);
  dc.top_p = d_p.ptr();
  const BonusOnlyCall call(requests, &hdv, d_off.ptr(), &dc, d_acc.ptr(), d_emit.ptr());
  const flashspec_verify_batch& db = call.batch;
  const flashspec_verify_result& dr = call.result;
  flashspec_summaries* sums_raw = nullptr;
  FSGPU_OK(gpu.get(), flashspec_summaries_create(gpu.get(), requests, requests, &sums_raw));
  SummariesPtr sums(sums_raw);
  FSGPU_OK(gpu.get(), flashspec_verify(gpu.get(), head.get(), &db, sums.get()));
  FSGPU_OK(gpu.get(), flashspec_finalize(gpu.get(), &db, sums.get(), &dr));
  FSGPU_OK(gpu.get(), flashspec_context_synchronize(gpu.get()));
  std::vector<flashspec::RowSummary> rs(requests);
  ASSERT_TRUE(flashspec::cuda::read_summaries(*sums->store, requests, rs.data()));
  EXPECT_EQ(rs[0].status, FLASHSPEC_ERR_UNSUPPORTED);
  EXPECT_EQ(d_acc.get()[0], -1);
  EXPECT_EQ(rs[1].status, FLASHSPEC_OK);
  EXPECT_EQ(d_acc.get()[1], 0);
}

// Under stream capture the host cannot learn whether a row continues, so a
// captured call does not: its flat top-p row fails with UNSUPPORTED, while
// the same call made eagerly serves it (the peaked row beside it both ways).
TEST_F(Gpu, CapturedCallsDoNotContinue) {
  const int vocab = 5000, d = 64, requests = 2;
  Rng rng(8);
  Matrix w = random_matrix(kBf16, vocab, d, rng, 0.01);  // nearly flat rows: top-p 0.99 keeps ~4950 tokens
  Matrix h = random_matrix(kBf16, requests, d, rng, 1.0);
  std::vector<int32_t> offsets(requests + 1, 0);
  std::vector<float> top_p{0.99f, 0.001f};
  Dev<int32_t> d_off(offsets), d_acc(requests), d_emit(requests);
  Dev<float> d_p(top_p);
  cudaStream_t stream;
  FSGPU_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    auto gpu = make_context(ContextOptions(FLASHSPEC_BACKEND_CUDA).seed(1).cuda_stream(stream));
    ASSERT_TRUE(gpu);
    flashspec_tensor wv = w.view();
    auto head = make_head(gpu.get(), wv);
    DevMatrix hd(h);
    flashspec_tensor hdv = hd.view();
    flashspec_sampling_controls dc;
    flashspec_sampling_controls_init(&dc);
    dc.top_p = d_p.ptr();
    const BonusOnlyCall call(requests, &hdv, d_off.ptr(), &dc, d_acc.ptr(), d_emit.ptr());
    FSGPU_OK(gpu.get(), flashspec_verify_and_finalize(gpu.get(), head.get(), &call.batch, &call.result));
    FSGPU_OK(gpu.get(), flashspec_context_synchronize(gpu.get()));
    EXPECT_EQ(d_acc.get(), (std::vector<int32_t>{0, 0})) << "eager: both requests served";

    cudaGraph_t graph;
    FSGPU_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const flashspec_status st = flashspec_verify_and_finalize(gpu.get(), head.get(), &call.batch, &call.result);
    FSGPU_CUDA(cudaStreamEndCapture(stream, &graph));
    ASSERT_EQ(st, FLASHSPEC_OK) << flashspec_context_last_error(gpu.get());
    cudaGraphExec_t exec;
    FSGPU_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    FSGPU_CUDA(cudaGraphLaunch(exec, stream));
    FSGPU_CUDA(cudaStreamSynchronize(stream));
    EXPECT_EQ(d_acc.get(), (std::vector<int32_t>{-1, 0})) << "captured: the flat request is UNSUPPORTED";
    std::vector<flashspec::RowSummary> rs(requests);
    ASSERT_TRUE(flashspec::cuda::read_summaries(*gpu->own_summaries, requests, rs.data()));
    EXPECT_EQ(rs[0].status, FLASHSPEC_ERR_UNSUPPORTED);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
}

// The controlled pass (cuBLAS chunks, folds, merges, summaries) is captured
// in a CUDA graph and replayed with new inputs.
TEST_F(Gpu, ControlledVerifyCapturesInAGraph) {
  const int vocab = 3001, d = 96, requests = 3, n = 2, rows = requests * (n + 1);
  Rng rng(3);
  Matrix w = random_matrix(kBf16, vocab, d, rng, 3.0 / std::sqrt(double(d)));
  Matrix h = random_matrix(kBf16, rows, d, rng, 1.0);
  std::vector<int32_t> offsets{0, n, 2 * n, 3 * n}, tokens(size_t(requests * n), 7), top_k(requests, 40);
  std::vector<float> temps(requests, 0.8f), top_p(requests, 0.95f), min_p(requests, 0.05f);
  cudaStream_t stream;
  FSGPU_CUDA(cudaStreamCreate(&stream));
  auto gpu = make_context(ContextOptions(FLASHSPEC_BACKEND_CUDA).seed(2).cuda_stream(stream));
  ASSERT_TRUE(gpu);
  flashspec_tensor wv = w.view();
  auto head = make_head(gpu.get(), wv);
  DevMatrix hd(h);
  flashspec_tensor hdv = hd.view();
  Dev<int32_t> d_off(offsets), d_tok(tokens), d_k(top_k), d_acc(requests), d_emit(static_cast<size_t>(rows));
  Dev<float> d_temps(temps), d_p(top_p), d_minp(min_p), d_lp(static_cast<size_t>(rows));
  flashspec_sampling_controls dc;
  flashspec_sampling_controls_init(&dc);
  dc.top_k = d_k.ptr();
  dc.top_p = d_p.ptr();
  dc.min_p = d_minp.ptr();
  flashspec_verify_batch db;
  flashspec_verify_batch_init(&db);
  db.memory = FLASHSPEC_MEMORY_CUDA;
  db.num_requests = requests;
  db.draft_offsets = d_off.ptr();
  db.draft_tokens = d_tok.ptr();
  db.target_hidden = &hdv;
  db.temperatures = d_temps.ptr();
  db.controls = &dc;
  db.logprobs = 1;
  flashspec_verify_result dr;
  flashspec_verify_result_init(&dr);
  dr.memory = FLASHSPEC_MEMORY_CUDA;
  dr.accepted_counts = d_acc.ptr();
  dr.emitted_tokens = d_emit.ptr();
  dr.logprobs = d_lp.ptr();
  // Eager run first: the reference.
  FSGPU_OK(gpu.get(), flashspec_verify_and_finalize(gpu.get(), head.get(), &db, &dr));
  FSGPU_OK(gpu.get(), flashspec_context_synchronize(gpu.get()));
  const std::vector<int32_t> eager = d_emit.get();
  const std::vector<float> eager_lp = d_lp.get();
  cudaGraph_t graph;
  FSGPU_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const flashspec_status s = flashspec_verify_and_finalize(gpu.get(), head.get(), &db, &dr);
  FSGPU_CUDA(cudaStreamEndCapture(stream, &graph));
  ASSERT_EQ(s, FLASHSPEC_OK) << flashspec_context_last_error(gpu.get());
  cudaGraphExec_t exec;
  FSGPU_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  d_emit.put(std::vector<int32_t>(static_cast<size_t>(rows), -7));
  FSGPU_CUDA(cudaGraphLaunch(exec, stream));
  FSGPU_CUDA(cudaStreamSynchronize(stream));
  EXPECT_EQ(d_emit.get(), eager);
  const std::vector<float> replay_lp = d_lp.get();
  for (int i = 0; i < rows; ++i)
    if (!std::isnan(eager_lp[size_t(i)])) {
      EXPECT_EQ(replay_lp[size_t(i)], eager_lp[size_t(i)]) << i;
    }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  gpu.reset();
  cudaStreamDestroy(stream);
}

}  // namespace
