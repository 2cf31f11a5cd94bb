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

// The length n ≥ 1 of the kept prefix S, from x of the allowed tokens in
// rank order: ranked_x[0 .. count), where count ≥ min(top_k, allowed
// tokens) and, when top-k keeps every allowed token, count is all of them
// (top-p's mass is taken over the tokens top-k keeps). Sums run in rank
// order in fp32, so every backend finds the same n.
FS_HOST_DEVICE int32_t kept_count(const float* ranked_x, int32_t count, const RowControls& c) {
  const int32_t k = c.top_k < count ? c.top_k : count;
  const float x0 = ranked_x[0];
  int32_t n = k;
  if (c.top_p < 1.0f) {
    float mass = 0.0f;
    for (int32_t i = 0; i < k; ++i) mass += expf(ranked_x[i] - x0);
    const float target = c.top_p * mass;
    float cumulative = 0.0f;
    for (int32_t i = 0; i < k; ++i) {
      cumulative += expf(ranked_x[i] - x0);
      if (cumulative >= target) {
        n = i + 1;
        break;
      }
    }
  }
  if (c.min_p > 0.0f)
    for (int32_t i = 1; i < n; ++i)
      if (expf(ranked_x[i] - x0) < c.min_p) {
        n = i;
        break;
      }
  return n;
}

// The kept prefix's length n when the ranked tokens given, ranked_x[0 ..
// count), are only the first of more allowed tokens and top-k keeps all of
// them (the CUDA backend's candidate list): top-p's mass over every allowed
// token is `mass` = Σ exp(x − ranked_x[0]), summed elsewhere. Returns n, or
// −1 when the prefix would run past the tokens given.
FS_HOST_DEVICE int32_t kept_count_of_first(const float* ranked_x, int32_t count, float mass, const RowControls& c) {
  const float x0 = ranked_x[0];
  int32_t n = -1;
  if (c.top_p < 1.0f) {
    const float target = c.top_p * mass;
    float cumulative = 0.0f;
    for (int32_t i = 0; i < count; ++i) {
      cumulative += expf(ranked_x[i] - x0);
      if (cumulative >= target) {
        n = i + 1;
        break;
      }
    }
  }
  if (c.min_p > 0.0f) {
    const int32_t end = n < 0 ? count : n;
    for (int32_t i = 1; i < end; ++i)
      if (expf(ranked_x[i] - x0) < c.min_p) return i;
  }
  return n;
}

// log of typical acceptance's threshold min(ε, δ·exp(−H)) for a row whose
// controlled distribution has entropy H.
FS_HOST_DEVICE float typical_log_threshold(const RowControls& c, float entropy) {
  return fminf(logf(c.typical_epsilon), logf(c.typical_delta) - entropy);
}

}  // namespace flashspec
