// Device-side building blocks shared by every CUDA kernel of the backend:
// the per-row plan a scan follows, the per-row partial a scan leaves behind,
// and the exact rules that fold logits and partials together. One copy of
// these rules keeps the scan, the residual phase and the combine identical.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "flashspec.h"
#include "kernels/row_summary.h"
#include "util/dtype.h"
#include "util/philox.h"

namespace flashspec {
namespace cuda {

constexpr int32_t kPlanGreedy = 1;  // T = 0: argmax of the raw logits
constexpr int32_t kPlanKeep = 2;    // stochastic draft row with T > 0: residual needs the row's logits

// What a scan computes for one row; written by the prepare kernels.
struct RowPlan {
  float inv_t;        // 1/T (T > 0); 1 for greedy rows
  int32_t flags;      // kPlan*
  int32_t tracked;    // token whose scaled logit is reported, or −1
  int32_t excluded;   // token never chosen as candidate, or −1
  RngRowKey key;      // Gumbel noise of the candidate (T > 0)
  int32_t status;     // flashspec_status found while preparing (0 = valid)
  int32_t q_row;      // row of draft_logits for a stochastic draft row, else −1
  float inv_td;       // 1/T_d of q
};

constexpr int32_t kPartialTracked = 1;
constexpr int32_t kPartialNonFinite = 2;

// Reduction of a row over a token range. The log-sum-exp is kept online
// (m, s = Σ exp(x − m)); the top-2 breaks ties towards the smaller token.
struct Partial {
  float m;
  float s;
  float best;
  float best_scaled;
  int32_t token;
  float second;
  float tracked;
  int32_t flags;
};

// Log-sum-exp of q's scaled logits over a token range (stochastic drafts).
struct QPartial {
  float m;
  float s;
  int32_t nonfinite;
  int32_t pad;
};

// Best residual candidate over a token range (stochastic drafts).
struct Residual {
  float best;
  int32_t token;
  float second;
  int32_t pad;
};

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000); }

// Word `index` (a runtime value) of a Philox block, without a local-memory
// array.
__device__ __forceinline__ uint32_t philox_word(const Philox4& b, int index) {
  return index == 0 ? b.v[0] : index == 1 ? b.v[1] : index == 2 ? b.v[2] : b.v[3];
}

// The RNG word of `token` on a row: row_word() of util/philox.h, same value.
__device__ __forceinline__ uint32_t noise_word(const RngRowKey& key, int32_t token) {
  return philox_word(row_block(key, uint32_t(token) >> 2), token & 3);
}

// The plan of row `row` of a launch (global index row_base + row), or, past
// the launch's rows, a greedy placeholder whose outputs are never written.
__device__ __forceinline__ RowPlan plan_or_placeholder(const RowPlan* plans, int32_t row_base, int32_t rows,
                                                       int32_t row) {
  if (row < rows) return plans[row_base + row];
  RowPlan plan = RowPlan{};
  plan.inv_t = 1.0f;
  plan.flags = kPlanGreedy;
  plan.tracked = -1;
  plan.excluded = -1;
  plan.q_row = -1;
  return plan;
}

__device__ __forceinline__ Partial empty_partial() {
  Partial p;
  p.m = neg_inf();
  p.s = 0.0f;
  p.best = neg_inf();
  p.best_scaled = 0.0f;
  p.token = -1;
  p.second = neg_inf();
  p.tracked = 0.0f;
  p.flags = 0;
  return p;
}

__device__ __forceinline__ void lse_add(float& m, float& s, float x) {
  if (x > m) {
    s = s * expf(m - x) + 1.0f;
    m = x;
  } else {
    s += expf(x - m);
  }
}

__device__ __forceinline__ void lse_merge(float& m, float& s, float bm, float bs) {
  if (bm > m) {
    s = s * expf(m - bm) + bs;
    m = bm;
  } else if (bm != neg_inf()) {
    s += bs * expf(bm - m);
  }
}

// Folds one logit l of token `token` into p, as the CPU backend does. `noise`
// is the token's RNG word (ignored for greedy rows). Tokens reach a given
// partial in increasing order, so a strict comparison keeps the smallest id.
__device__ __forceinline__ void fold_logit(Partial& p, const RowPlan& plan, float l, int32_t token,
                                           uint32_t noise) {
  if (!isfinite(l)) p.flags |= kPartialNonFinite;
  const bool greedy = plan.flags & kPlanGreedy;
  const float scaled = greedy ? l : l * plan.inv_t;
  if (token == plan.tracked) {
    p.tracked = scaled;
    p.flags |= kPartialTracked;
  }
  if (!greedy) lse_add(p.m, p.s, scaled);
  if (token == plan.excluded) return;
  const float score = greedy ? scaled : scaled + gumbel_from_bits(noise);
  if (score > p.best) {
    p.second = p.best;
    p.best = score;
    p.best_scaled = scaled;
    p.token = token;
  } else if (score > p.second) {
    p.second = score;
  }
}

// a ← a ∪ b; ties between winners go to the smaller token id.
__device__ __forceinline__ void merge_partial(Partial& a, const Partial& b) {
  lse_merge(a.m, a.s, b.m, b.s);
  if (b.flags & kPartialTracked) a.tracked = b.tracked;
  a.flags |= b.flags;
  const bool b_wins = b.token >= 0 && (a.token < 0 || b.best > a.best || (b.best == a.best && b.token < a.token));
  if (b_wins) {
    a.second = fmaxf(a.best, b.second);
    a.best = b.best;
    a.best_scaled = b.best_scaled;
    a.token = b.token;
  } else {
    a.second = fmaxf(a.second, b.best);
  }
}

__device__ __forceinline__ Partial shfl_xor_partial(const Partial& p, int mask) {
  Partial q;
  q.m = __shfl_xor_sync(0xffffffffu, p.m, mask);
  q.s = __shfl_xor_sync(0xffffffffu, p.s, mask);
  q.best = __shfl_xor_sync(0xffffffffu, p.best, mask);
  q.best_scaled = __shfl_xor_sync(0xffffffffu, p.best_scaled, mask);
  q.token = __shfl_xor_sync(0xffffffffu, p.token, mask);
  q.second = __shfl_xor_sync(0xffffffffu, p.second, mask);
  q.tracked = __shfl_xor_sync(0xffffffffu, p.tracked, mask);
  q.flags = __shfl_xor_sync(0xffffffffu, p.flags, mask);
  return q;
}

// Merge in a fixed pattern so every run gives the same bits: the lower lane
// of each pair absorbs the upper one.
__device__ __forceinline__ void merge_with_lane(Partial& p, int mask, int lane) {
  Partial q = shfl_xor_partial(p, mask);
  if ((lane & mask) == 0) merge_partial(p, q);
  else {
    merge_partial(q, p);
    p = q;
  }
}

__device__ __forceinline__ void merge_residual(Residual& a, const Residual& b) {
  const bool b_wins = b.token >= 0 && (a.token < 0 || b.best > a.best || (b.best == a.best && b.token < a.token));
  if (b_wins) {
    a.second = fmaxf(a.best, b.second);
    a.best = b.best;
    a.token = b.token;
  } else {
    a.second = fmaxf(a.second, b.best);
  }
}

// One warp combines the `count` partials partials[k * stride] in a fixed
// order; every lane returns the same result. Used by the combine kernel and
// by the residual phase, so both see the same log-sum-exp bit for bit.
__device__ __forceinline__ Partial warp_combine(const Partial* partials, int count, int64_t stride, int lane) {
  Partial acc = empty_partial();
  for (int k = lane; k < count; k += 32) merge_partial(acc, partials[int64_t(k) * stride]);
  for (int mask = 1; mask < 32; mask <<= 1) merge_with_lane(acc, mask, lane);
  return shfl_xor_partial(acc, 0);
}

// Folds the lanes' (m, s, bad) in a fixed pattern; lane 0 holds the result.
__device__ __forceinline__ void warp_reduce_q(float& m, float& s, int& bad, int lane) {
  for (int mask = 1; mask < 32; mask <<= 1) {
    float om = __shfl_xor_sync(0xffffffffu, m, mask);
    float os = __shfl_xor_sync(0xffffffffu, s, mask);
    int ob = __shfl_xor_sync(0xffffffffu, bad, mask);
    if ((lane & mask) == 0) lse_merge(m, s, om, os);
    else {
      float mm = om, ss = os;
      lse_merge(mm, ss, m, s);
      m = mm;
      s = ss;
    }
    bad |= ob;
  }
}

__device__ __forceinline__ void warp_combine_q(const QPartial* q, int count, int64_t stride, int lane, float& m,
                                               float& s, int& nonfinite) {
  m = neg_inf();
  s = 0.0f;
  nonfinite = 0;
  for (int k = lane; k < count; k += 32) {
    QPartial v = q[int64_t(k) * stride];
    lse_merge(m, s, v.m, v.s);
    nonfinite |= v.nonfinite;
  }
  warp_reduce_q(m, s, nonfinite, lane);
  m = __shfl_sync(0xffffffffu, m, 0);
  s = __shfl_sync(0xffffffffu, s, 0);
  nonfinite = __shfl_sync(0xffffffffu, nonfinite, 0);
}

__device__ __forceinline__ float load_element(const void* base, flashspec_dtype dtype, int64_t index) {
  return load_as_float(base, dtype, index);
}

// The contiguous, 8-aligned token range of group g of `groups`.
__device__ __forceinline__ void group_range(int32_t vocab, int32_t groups, int32_t g, int32_t& begin,
                                            int32_t& end) {
  const int64_t blocks = (int64_t(vocab) + 7) / 8;
  begin = int32_t((blocks * g) / groups) * 8;
  end = int32_t((blocks * (g + 1)) / groups) * 8;
  if (end > vocab) end = vocab;
  if (begin > vocab) begin = vocab;
}

}  // namespace cuda
}  // namespace flashspec
