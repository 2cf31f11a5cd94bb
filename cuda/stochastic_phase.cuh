// The residual phase of stochastic drafts, shared by the tiled scans
// (scan_mma.cu, scan_simt.cu). Those scans run cooperatively (row_blocks = 1):
// each CTA keeps its token range's scaled logits of the rows that need a
// residual in shared memory, publishes its partials, waits at a grid-wide
// barrier, and then works on its range locally: W is read once and no
// vocabulary-sized vector is written.
//
// A row tries drafts x_1..x_k (drafts_tried_at: a chain row's one draft, a
// tree node's children), x_i drawn from q_i, against the running residual
// (SpecInfer's multi-candidate rule, the CPU backend's residual_chain):
// log R_0 = log p, log R_i = log max(R_{i−1} − C_{i−1} q_i, 0), C_i = Σ R_i
// (C_0 = 1); x_i is judged with log r(x_i) − log q_i(x_i) = log R_{i−1}(x_i)
// − log C_{i−1} − log q_i(x_i), and the row's candidate is a Gumbel-max of
// R_{k−1} − C_{k−1} q_k with RESIDUAL_NOISE. The kept logits are turned into
// log R_i in place, level by level, with the same operations, in the same
// order, as the CPU backend applies to each token; each C_i is a grid-wide
// sum (one more barrier per level). A sparse q_i is −Inf off its support, so
// a level changes only its support's tokens there.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "sampling/draft_support.h"
#include "scan_params.h"
#include "util/dtype.h"
#include "warp_fold.cuh"

namespace flashspec {
namespace cuda {

// The CTA folds (m, s, bad) of its threads and returns the result on thread 0
// (other threads: unspecified). red: 4 * warps floats; ends with a barrier.
__device__ __forceinline__ void block_reduce_q(float& m, float& s, int& bad, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  warp_reduce_q(m, s, bad, lane);
  if (lane == 0) {
    red[warp * 4 + 0] = m;
    red[warp * 4 + 1] = s;
    red[warp * 4 + 2] = __int_as_float(bad);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float am = neg_inf(), as = 0.0f;
    int ab = 0;
    for (int w = 0; w < warps; ++w) {
      lse_merge(am, as, red[w * 4 + 0], red[w * 4 + 1]);
      ab |= __float_as_int(red[w * 4 + 2]);
    }
    m = am;
    s = as;
    bad = ab;
  }
  __syncthreads();
}

// A dense q row's scaled logit of local token i.
__device__ __forceinline__ float q_scaled(const StochasticDrafts& d, int32_t draft, float inv_td, int i) {
  const void* row = static_cast<const unsigned char*>(d.q_logits) + (int64_t(draft) * d.q_ld) * int64_t(dtype_size(d.q_dtype));
  return load_as_float(row, d.q_dtype, i) * inv_td;
}

// log q of `draft` at its drafted token x: dense from its log-sum-exp,
// sparse from its support.
__device__ __forceinline__ float drafted_log_q(const StochasticDrafts& d, int32_t draft, int32_t x_local, float inv_td,
                                              float q_lse) {
  if (d.q_logits) return q_scaled(d, draft, inv_td, x_local) - q_lse;
  const int32_t begin = d.support_offsets[draft], end = d.support_offsets[draft + 1];
  const double sum = support_sum(d.support_probs, begin, end);
  const int32_t x = d.draft_tokens[draft];
  for (int32_t e = begin; e < end; ++e)
    if (d.support_tokens[e] == x) return support_log_q(d.support_probs, e, sum);
  return neg_inf();  // unreachable: the supports were checked
}

// The residual phase; every thread of the CTA calls it after the CTA's
// partials are in global memory. kept: [rows][slice] scaled logits of the
// CTA's range; scratch: 2 * rows + 4 * warps floats.
__device__ __forceinline__ void stochastic_phase(const ScanParams& p, int group, int begin, int end, const RowPlan* plans,
                                                 float* kept, float* scratch) {
  namespace cg = cooperative_groups;
  const StochasticDrafts& d = p.drafts;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
  float* lse_p = scratch;            // [rows]
  float* log_c = scratch + p.rows;   // [rows]: log C of the row's current level
  float* red = scratch + 2 * p.rows; // [warps * 4]
  const int32_t base = p.token_base;
  auto row_drafts = [&](int lr) { return d.row_drafts[p.row_base + lr]; };
  auto keeps = [&](int lr) { return (plans[lr].flags & kPlanKeep) != 0; };

  // 1. Log-sum-exp of every dense q this launch's rows try, over this range
  //    (by draft index; the combine checks them for non-finite values).
  if (d.q_logits)
    for (int lr = 0; lr < p.rows; ++lr) {
      const RowDrafts rd = row_drafts(lr);
      for (int i = 0; i < rd.count; ++i) {
        const int32_t draft = d.tried[rd.begin + i];
        float m = neg_inf(), s = 0.0f;
        int bad = 0;
        for (int t = begin + tid; t < end; t += blockDim.x) {
          // A non-finite logit, or one that overflows when divided by T_d.
          const float scaled = q_scaled(d, draft, plans[lr].inv_td, t);
          if (!isfinite(scaled)) bad = 1;
          lse_add(m, s, scaled);
        }
        block_reduce_q(m, s, bad, red);
        if (tid == 0) p.q_partials[int64_t(group) * p.partial_stride + draft] = QPartial{m, s, bad, 0};
      }
    }

  // 2. Every range's partials are published.
  __threadfence();
  cg::this_grid().sync();

  // 3. Each kept row's log-sum-exp of p, folded exactly as the combine does.
  for (int lr = warp; lr < p.rows; lr += warps) {
    if (!keeps(lr)) continue;
    const Partial all = warp_combine(p.partials + p.row_base + lr, p.groups, p.partial_stride, lane);
    if (lane == 0) {
      lse_p[lr] = lse_value(all.m, all.s);
      log_c[lr] = 0.0f;
    }
  }
  __syncthreads();

  // 4. log R_0 = log p in place; each tried draft's log p(x).
  for (int lr = 0; lr < p.rows; ++lr) {
    if (!keeps(lr)) continue;
    float* row = kept + int64_t(lr) * p.slice;
    for (int t = begin + tid; t < end; t += blockDim.x) row[t - begin] -= lse_p[lr];
  }
  __syncthreads();
  for (int lr = 0; lr < p.rows; ++lr) {
    if (!keeps(lr)) continue;
    const RowDrafts rd = row_drafts(lr);
    const float* row = kept + int64_t(lr) * p.slice;
    for (int i = tid; i < rd.count; i += blockDim.x) {
      const int32_t draft = d.tried[rd.begin + i], x = d.draft_tokens[draft] - base;
      if (x >= begin && x < end) d.verdicts[draft].logp = row[x - begin];
    }
  }

  // 5. Level by level: judge draft i of each row that tries more than i
  //    drafts; then either take the row's residual sample (its last draft)
  //    or move its kept values to log R_{i+1} and sum them (C_{i+1}).
  int levels = 0;  // the most drafts a kept row of the launch tries
  for (int lr = 0; lr < p.rows; ++lr)
    if (keeps(lr)) levels = max(levels, row_drafts(lr).count);
  for (int i = 0; i < levels; ++i) {
    bool summed = false;
    for (int lr = 0; lr < p.rows; ++lr) {
      const RowDrafts rd = row_drafts(lr);
      if (!keeps(lr) || rd.count <= i) continue;
      const RowPlan& plan = plans[lr];
      const int32_t draft = d.tried[rd.begin + i], x = d.draft_tokens[draft] - base;
      float* row = kept + int64_t(lr) * p.slice;
      if (d.q_logits && warp == 0) {
        float qm, qs;
        int qbad;
        warp_combine_q(p.q_partials + draft, p.groups, p.partial_stride, lane, qm, qs, qbad);
        if (lane == 0) red[0] = lse_value(qm, qs);  // red is free between reductions
      }
      __syncthreads();
      const float c = log_c[lr], q_lse = d.q_logits ? red[0] : 0.0f;
      if (tid == 0 && x >= begin && x < end)
        d.verdicts[draft].log_ratio = (row[x - begin] - c) - drafted_log_q(d, draft, x, plan.inv_td, q_lse);
      __syncthreads();
      const bool last = i + 1 == rd.count;
      // log R ← log max(R − C q, 0): every token for a dense q; the
      // support's tokens in this range for a sparse one (−Inf elsewhere
      // leaves R as it is, as log_subtract(a, −Inf) = a).
      if (d.q_logits) {
        if (!last)
          for (int t = begin + tid; t < end; t += blockDim.x)
            row[t - begin] = log_subtract(row[t - begin], c + (q_scaled(d, draft, plan.inv_td, t) - q_lse));
      } else {
        const int32_t sb = d.support_offsets[draft], se = d.support_offsets[draft + 1];
        const double sum = support_sum(d.support_probs, sb, se);
        for (int32_t e = sb + tid; e < se; e += blockDim.x) {
          const int32_t t = d.support_tokens[e] - base;
          if (t >= begin && t < end)
            row[t - begin] = log_subtract(row[t - begin], c + support_log_q(d.support_probs, e, sum));
        }
        __syncthreads();
      }
      if (last) {
        // The residual sample over this range: fold_residual(log R, log(C q))
        // for a dense q; for a sparse q the subtraction is already in place,
        // and fold_residual(a − b, −Inf) is fold_residual(a, b) to the bit.
        Residual r = empty_residual();
        for (int t = begin + tid; t < end; t += blockDim.x) {
          const float log_cq = d.q_logits ? c + (q_scaled(d, draft, plan.inv_td, t) - q_lse) : neg_inf();
          fold_residual(r, row[t - begin], log_cq, base + t, noise_word(plan.key, base + t));
        }
        warp_reduce_residual(r, lane);
        if (lane == 0) {
          red[warp * 4 + 0] = r.best;
          red[warp * 4 + 1] = __int_as_float(r.token);
          red[warp * 4 + 2] = r.second;
        }
        __syncthreads();
        if (tid == 0) {
          Residual acc = empty_residual();
          for (int w = 0; w < warps; ++w) {
            Residual o;
            o.best = red[w * 4 + 0];
            o.token = __float_as_int(red[w * 4 + 1]);
            o.second = red[w * 4 + 2];
            o.pad = 0;
            merge_residual(acc, o);
          }
          p.residuals[int64_t(group) * p.partial_stride + p.row_base + lr] = acc;
        }
        __syncthreads();
      } else {
        __syncthreads();
        float m = neg_inf(), s = 0.0f;
        int bad = 0;
        for (int t = begin + tid; t < end; t += blockDim.x)
          if (row[t - begin] != neg_inf()) lse_add(m, s, row[t - begin]);
        block_reduce_q(m, s, bad, red);
        if (tid == 0)
          d.level_partials[(int64_t(i & 1) * p.groups + group) * p.partial_stride + p.row_base + lr] =
              QPartial{m, s, 0, 0};
        summed = true;
      }
    }
    // summed is the same in every CTA (it depends on the plans only).
    if (!summed) continue;
    __threadfence();
    cg::this_grid().sync();
    for (int lr = warp; lr < p.rows; lr += warps) {
      if (!keeps(lr) || row_drafts(lr).count <= i + 1) continue;
      float m, s;
      int bad;
      warp_combine_q(d.level_partials + int64_t(i & 1) * p.groups * p.partial_stride + p.row_base + lr, p.groups,
                     p.partial_stride, lane, m, s, bad);
      if (lane == 0) log_c[lr] = lse_value(m, s);
    }
    __syncthreads();
  }
}

}  // namespace cuda
}  // namespace flashspec
