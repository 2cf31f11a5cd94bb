// Sampling controls: the rules that turn a row's logits into the
// distribution that is sampled and verified (flashspec.h, "Sampling
// controls"), shared by every backend so they keep one definition.
//
// The order: bias, mask, temperature, then top-k, top-p and min-p over the
// ranking of x = (l + bias) / T (larger x first, ties by smaller token id),
// and softmax over the kept prefix S of that ranking.
#pragma once

#include <cmath>
#include <cstdint>

#include "flashspec.h"
#include "util/host_device.h"

namespace flashspec {

// One row's controls, defaults resolved (kernels/args.h: row_controls).
struct RowControls {
  int32_t top_k;               // FLASHSPEC_TOP_K_ALL (or ≥ V): no truncation
  float top_p;                 // 1: none
  float min_p;                 // 0: none
  const int32_t* bias_tokens;  // the request's bias entries
  const float* bias_values;
  int32_t bias_count;
  const uint32_t* mask;        // the row's packed allowed-token bits, or NULL
  float typical_epsilon;       // > 0: typical acceptance (target rows of a verify)
  float typical_delta;
  float repetition_penalty;    // r for the tokens of the bias entries; 1: none
};

FS_HOST_DEVICE RowControls no_controls() {
  RowControls c;
  c.top_k = FLASHSPEC_TOP_K_ALL;
  c.top_p = 1.0f;
  c.min_p = 0.0f;
  c.bias_tokens = nullptr;
  c.bias_values = nullptr;
  c.bias_count = 0;
  c.mask = nullptr;
  c.typical_epsilon = 0.0f;
  c.typical_delta = 0.0f;
  c.repetition_penalty = 1.0f;
  return c;
}

// A penalised token's logit before its bias: l / r for l > 0, else l · r
// (llama.cpp's and vLLM's repetition penalty).
FS_HOST_DEVICE float repetition_penalised(float l, float r) { return l > 0.0f ? l / r : l * r; }

FS_HOST_DEVICE bool token_allowed(const RowControls& c, int32_t token) {
  return !c.mask || ((c.mask[token >> 5] >> (token & 31)) & 1u);
}

// Whether top-k, top-p or min-p can drop an allowed token of a vocabulary
// of `vocab` tokens.
FS_HOST_DEVICE bool truncates(const RowControls& c, int64_t vocab) {
  return int64_t(c.top_k) < vocab || c.top_p < 1.0f || c.min_p > 0.0f;
}

FS_HOST_DEVICE bool typical_acceptance(const RowControls& c) { return c.typical_epsilon > 0.0f; }

// The ranking of the controls: does (xa, a) come before (xb, b)?
FS_HOST_DEVICE bool ranks_before(float xa, int32_t a, float xb, int32_t b) {
  return xa > xb || (xa == xb && a < b);
}

// The weights e^(x_i − x_0) of ranked candidates, computed where they are
// read (RankedWeights) or read from an array that holds exactly those
// values (PrecomputedWeights: a caller that needs each weight more than
// once, or computes them in parallel).
struct RankedWeights {
  const float* ranked_x;
  FS_HOST_DEVICE float operator()(int32_t i) const { return expf(ranked_x[i] - ranked_x[0]); }
};
struct PrecomputedWeights {
  const float* weights;
  FS_HOST_DEVICE float operator()(int32_t i) const { return weights[i]; }
};

// Top-p's cut: the first n with weight(0) + … + weight(n − 1) ≥ target,
// summed in rank order in fp32, n ≤ count; `none` when the sum stays below.
// The weights are read four at a time ahead of the sums (a device thread's
// reads then overlap), the sums taken one by one in order.
template <class Weights>
FS_HOST_DEVICE int32_t kept_by_mass(const Weights& weight, int32_t count, float target, int32_t none) {
  float cumulative = 0.0f;
  for (int32_t i = 0; i < count; i += 4) {
    float w[4];
    for (int32_t q = 0; q < 4; ++q) w[q] = i + q < count ? weight(i + q) : 0.0f;
    for (int32_t q = 0; q < 4 && i + q < count; ++q) {
      cumulative += w[q];
      if (cumulative >= target) return i + q + 1;
    }
  }
  return none;
}

// Min-p's cut: the first i in [1, end) with weight(i) < min_p; `none`
// when there is none.
template <class Weights>
FS_HOST_DEVICE int32_t cut_by_min_p(const Weights& weight, int32_t end, float min_p, int32_t none) {
  for (int32_t i = 1; i < end; i += 4) {
    float w[4];
    for (int32_t q = 0; q < 4; ++q) w[q] = i + q < end ? weight(i + q) : min_p;
    for (int32_t q = 0; q < 4; ++q)
      if (w[q] < min_p) return i + q;
  }
  return none;
}

// The length n ≥ 1 of the kept prefix S, from the weights e^(x_i − x_0) of
// the allowed tokens in rank order, i < count, where count ≥ min(top_k,
// allowed tokens) and, when top-k keeps every allowed token, count is all
// of them (top-p's mass is taken over the tokens top-k keeps). Sums run in
// rank order in fp32, so every backend finds the same n.
template <class Weights>
FS_HOST_DEVICE int32_t kept_count_weighted(const Weights& weight, int32_t count, const RowControls& c) {
  const int32_t k = c.top_k < count ? c.top_k : count;
  int32_t n = k;
  if (c.top_p < 1.0f) {
    float mass = 0.0f;
    for (int32_t i = 0; i < k; ++i) mass += weight(i);
    n = kept_by_mass(weight, k, c.top_p * mass, k);
  }
  if (c.min_p > 0.0f) n = cut_by_min_p(weight, n, c.min_p, n);
  return n;
}

// kept_count_weighted from x of the allowed tokens in rank order:
// ranked_x[0 .. count).
FS_HOST_DEVICE int32_t kept_count(const float* ranked_x, int32_t count, const RowControls& c) {
  return kept_count_weighted(RankedWeights{ranked_x}, count, c);
}

// The kept prefix's length n when the ranked tokens given (their weights
// e^(x_i − x_0), i < count) are only the first of more allowed tokens and
// top-k keeps all of them (the CUDA backend's candidate list): top-p's mass
// over every allowed token is `mass` = Σ exp(x − x_0), summed elsewhere.
// Returns n, or −1 when the prefix would run past the tokens given.
template <class Weights>
FS_HOST_DEVICE int32_t kept_count_of_first_weighted(const Weights& weight, int32_t count, float mass,
                                                    const RowControls& c) {
  int32_t n = -1;
  if (c.top_p < 1.0f) n = kept_by_mass(weight, count, c.top_p * mass, -1);
  if (c.min_p > 0.0f) {
    const int32_t end = n < 0 ? count : n;
    const int32_t cut = cut_by_min_p(weight, end, c.min_p, -1);
    if (cut >= 0) return cut;
  }
  return n;
}

// log of typical acceptance's threshold min(ε, δ·exp(−H)) for a row whose
// controlled distribution has entropy H.
FS_HOST_DEVICE float typical_log_threshold(const RowControls& c, float entropy) {
  return fminf(logf(c.typical_epsilon), logf(c.typical_delta) - entropy);
}

}  // namespace flashspec
