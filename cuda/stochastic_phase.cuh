// The residual phase of stochastic drafts, shared by the tiled scans
// (scan_mma.cu, scan_simt.cu). Those scans run cooperatively (row_blocks = 1):
// each CTA keeps its token range's scaled logits of the rows that need a
// residual in shared memory, publishes its partials, waits at a grid-wide
// barrier, and then scores the residual max(p − q, 0) of its range locally:
// W is read once and no vocabulary-sized vector is written.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "scan_params.h"
#include "util/dtype.h"
#include "warp_fold.cuh"

namespace flashspec {
namespace cuda {

// The residual phase; every thread of the CTA calls it after the CTA's
// partials are in global memory. kept: [rows][slice] scaled logits of the
// CTA's range; scratch: 2 * rows + 4 * warps floats.
__device__ __forceinline__ void stochastic_phase(const ScanParams& p, int group, int begin, int end, const RowPlan* plans,
                                 const float* kept, float* scratch) {
  namespace cg = cooperative_groups;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
  float* lse_p = scratch;                   // [rows]
  float* lse_q = scratch + p.rows;          // [rows]
  float* red = scratch + 2 * p.rows;        // [warps * 4]

  // 1. Log-sum-exp of q's scaled logits over this range, per draft row.
  for (int lr = 0; lr < p.rows; ++lr) {
    const RowPlan& plan = plans[lr];
    if (plan.q_row < 0) continue;  // uniform across the block
    const void* qrow = static_cast<const unsigned char*>(p.q_logits) +
                       (int64_t(plan.q_row) * p.q_ld) * int64_t(dtype_size(p.q_dtype));
    float m = neg_inf(), s = 0.0f;
    int bad = 0;
    for (int i = begin + tid; i < end; i += blockDim.x) {
      // A non-finite logit, or one that overflows when divided by T_d.
      const float scaled = load_as_float(qrow, p.q_dtype, i) * plan.inv_td;
      if (!isfinite(scaled)) bad = 1;
      lse_add(m, s, scaled);
    }
    warp_reduce_q(m, s, bad, lane);
    if (lane == 0) {
      red[warp * 4 + 0] = m;
      red[warp * 4 + 1] = s;
      red[warp * 4 + 2] = __int_as_float(bad);
    }
    __syncthreads();
    if (tid == 0) {
      float am = neg_inf(), as = 0.0f;
      int ab = 0;
      for (int w = 0; w < warps; ++w) {
        lse_merge(am, as, red[w * 4 + 0], red[w * 4 + 1]);
        ab |= __float_as_int(red[w * 4 + 2]);
      }
      QPartial out;
      out.m = am;
      out.s = as;
      out.nonfinite = ab;
      out.pad = 0;
      p.q_partials[int64_t(group) * p.partial_stride + p.row_base + lr] = out;
    }
    __syncthreads();
  }

  // 2. Every range's partials are published.
  __threadfence();
  cg::this_grid().sync();

  // 3. Each kept row's final log-sum-exps, folded exactly as the combine does.
  for (int lr = warp; lr < p.rows; lr += warps) {
    const RowPlan& plan = plans[lr];
    if (!(plan.flags & kPlanKeep)) continue;
    Partial all = warp_combine(p.partials + p.row_base + lr, p.groups, p.partial_stride, lane);
    float qm, qs;
    int qbad;
    warp_combine_q(p.q_partials + p.row_base + lr, p.groups, p.partial_stride, lane, qm, qs, qbad);
    if (lane == 0) {
      lse_p[lr] = lse_value(all.m, all.s);
      lse_q[lr] = lse_value(qm, qs);
    }
  }
  __syncthreads();

  // 4. Residual Gumbel-max over this range: tokens with p > q, score
  //    log(p − q) + g, RESIDUAL_NOISE.
  for (int lr = 0; lr < p.rows; ++lr) {
    const RowPlan& plan = plans[lr];
    if (!(plan.flags & kPlanKeep)) continue;
    const void* qrow = static_cast<const unsigned char*>(p.q_logits) +
                       (int64_t(plan.q_row) * p.q_ld) * int64_t(dtype_size(p.q_dtype));
    const float lp = lse_p[lr], lq = lse_q[lr];
    Residual r = empty_residual();
    for (int i = begin + tid; i < end; i += blockDim.x) {
      const float log_p = kept[int64_t(lr) * p.slice + (i - begin)] - lp;
      const float log_q = load_as_float(qrow, p.q_dtype, i) * plan.inv_td - lq;
      fold_residual(r, log_p, log_q, i, noise_word(plan.key, i));
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
  }
}

}  // namespace cuda
}  // namespace flashspec
