// The device side of the fold: the rules themselves are sampling/fold.h,
// shared with the CPU backend; this file holds what only a GPU needs to apply
// them — the RNG word of a token, plans padded to a tile, and warp-wide
// merges in a fixed pattern so every run gives the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "sampling/fold.h"
#include "sampling/row_plan.h"
#include "util/philox.h"

namespace flashspec {
namespace cuda {

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
// the launch's rows, an inert plan whose outputs are never written.
__device__ __forceinline__ RowPlan plan_or_placeholder(const RowPlan* plans, int32_t row_base, int32_t rows,
                                                       int32_t row) {
  return row < rows ? plans[row_base + row] : inert_plan(FLASHSPEC_OK);
}

// A warp's sampled offers after the rest of its step (sampling/fold.h's
// fold_logit_mass, then may_reach or may_reach_merged): bit k of a lane's
// `pending` marks its logit k as waiting for its Gumbel transform. While any
// lane has one left, each such lane calls offer(k) for its lowest, so the
// warp runs the transform as often as its busiest lane needs it rather than
// once for each logit any lane needs it for. Numbering a row's tokens in
// increasing order offers them in that order.
template <class Offer>
__device__ __forceinline__ void offer_pending(unsigned pending, Offer&& offer) {
  while (__any_sync(0xffffffffu, pending)) {
    if (!pending) continue;
    const int k = __ffs(pending) - 1;
    pending &= pending - 1;
    offer(k);
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

// A Partial of x's fields where `first` holds, else of y's: field by field,
// since a select of whole structs is a select of their addresses, which
// puts both in local memory.
__device__ __forceinline__ Partial select_partial(bool first, const Partial& x, const Partial& y) {
  Partial r;
  r.m = first ? x.m : y.m;
  r.s = first ? x.s : y.s;
  r.best = first ? x.best : y.best;
  r.best_scaled = first ? x.best_scaled : y.best_scaled;
  r.token = first ? x.token : y.token;
  r.second = first ? x.second : y.second;
  r.tracked = first ? x.tracked : y.tracked;
  r.flags = first ? x.flags : y.flags;
  return r;
}

// Merge in a fixed pattern: the lower lane of each pair absorbs the upper
// one, so both end with the same (lower ∪ upper) in token order. One
// merge_partial of selected operands rather than a branch on the lane's
// side of the pair, which a warp whose lanes go both ways (every butterfly)
// ran twice: H200, ≤ 16-row sampled calls 0.5–3 µs faster, greedy ones at
// V = 151936 × 9–16 rows 1–4 µs slower (bench/RESULTS.md).
__device__ __forceinline__ void merge_with_lane(Partial& p, int mask, int lane) {
  const Partial q = shfl_xor_partial(p, mask);
  const bool lower = (lane & mask) == 0;
  Partial merged = select_partial(lower, p, q);
  merge_partial(merged, select_partial(lower, q, p));
  p = merged;
}

// One warp combines the `count` partials load(k), k = 0 … count − 1, in a
// fixed order; every lane returns the same result. Lane i merges partials
// i, i + 32, … in that order, loading kBatch of them before merging any
// (each merge would otherwise wait on its own round trip to L2), then the
// lanes merge in a butterfly, the lower lane's value always the left
// operand. Used by the combine kernel and by the residual phase, so both see
// the same log-sum-exp bit for bit, and by the ≤ 16-row scans' last CTA.
template <int kBatch, class Load>
__device__ __forceinline__ Partial warp_combine(int count, int lane, Load&& load) {
  Partial acc = empty_partial();
  for (int first = lane; first < count; first += 32 * kBatch) {
    Partial batch[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
      if (first + 32 * i < count) batch[i] = load(first + 32 * i);
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
      if (first + 32 * i < count) merge_partial(acc, batch[i]);
  }
  for (int mask = 1; mask < 32; mask <<= 1) merge_with_lane(acc, mask, lane);
  return acc;
}

// The same over partials[k * stride], written by an earlier kernel.
__device__ __forceinline__ Partial warp_combine(const Partial* partials, int count, int64_t stride, int lane) {
  return warp_combine<8>(count, lane, [&](int k) { return partials[int64_t(k) * stride]; });
}

__device__ __forceinline__ void warp_reduce_residual(Residual& r, int lane) {
  for (int mask = 1; mask < 32; mask <<= 1) {
    Residual o;
    o.best = __shfl_xor_sync(0xffffffffu, r.best, mask);
    o.token = __shfl_xor_sync(0xffffffffu, r.token, mask);
    o.second = __shfl_xor_sync(0xffffffffu, r.second, mask);
    o.pad = 0;
    if ((lane & mask) == 0) merge_residual(r, o);
    else {
      merge_residual(o, r);
      r = o;
    }
  }
}

// Log-sum-exp of q's scaled logits over a token range (stochastic drafts),
// as the scans leave it per group.
struct QPartial {
  float m;
  float s;
  int32_t nonfinite;
  int32_t pad;
};

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
