// Sparse draft distributions (flashspec.h, "Sparse draft distributions"):
// the rules a draft row's support must meet and the log q it gives each of
// its tokens. One implementation for the host checks, the CPU backend and
// the CUDA backend's device-side checks and residual phase.
#pragma once

#include <cmath>
#include <cstdint>

#include "flashspec.h"
#include "util/host_device.h"

namespace flashspec {

// What is wrong with one draft row's support, the first fault found.
enum class SupportFault : int32_t {
  kNone = 0,
  kCount,           // not 1..FLASHSPEC_MAX_DRAFT_SUPPORT entries
  kTokenRange,      // a token outside [0, V)
  kDuplicate,       // a token named twice
  kNonFinite,       // a NaN or Inf probability
  kNegative,        // a negative probability
  kSum,             // not summing to 1 within FLASHSPEC_DRAFT_SUPPORT_TOLERANCE
  kDraftedMissing,  // the drafted token is not in the support
  kDraftedZero,     // the drafted token has q = 0 there
};

// The status the C API gives a fault (device batches report it per request).
FS_HOST_DEVICE int32_t support_fault_status(SupportFault f) {
  switch (f) {
    case SupportFault::kNone: return FLASHSPEC_OK;
    case SupportFault::kCount:
    case SupportFault::kTokenRange: return FLASHSPEC_ERR_OUT_OF_RANGE;
    case SupportFault::kNonFinite: return FLASHSPEC_ERR_NON_FINITE;
    default: return FLASHSPEC_ERR_INVALID_ARGUMENT;
  }
}

// Checks entries [begin, end) of a support whose row drafted `drafted`;
// *entry gets the entry at fault (or the row's end for the row-wide faults)
// and *sum the probabilities' sum, accumulated in double in entry order.
FS_HOST_DEVICE SupportFault support_row_fault(const int32_t* tokens, const float* probs, int32_t begin, int32_t end,
                                              int32_t drafted, int64_t vocab, int32_t* entry, double* sum) {
  *entry = end;
  *sum = 0.0;
  const int64_t count = int64_t(end) - int64_t(begin);
  if (count < 1 || count > FLASHSPEC_MAX_DRAFT_SUPPORT) return SupportFault::kCount;
  double drafted_q = -1.0;
  for (int32_t e = begin; e < end; ++e) {
    *entry = e;
    const int32_t token = tokens[e];
    const float q = probs[e];
    if (token < 0 || int64_t(token) >= vocab) return SupportFault::kTokenRange;
    for (int32_t f = begin; f < e; ++f)
      if (tokens[f] == token) return SupportFault::kDuplicate;
    if (!is_finite(q)) return SupportFault::kNonFinite;
    if (q < 0.0f) return SupportFault::kNegative;
    *sum += double(q);
    if (token == drafted) drafted_q = double(q);
  }
  *entry = end;
  if (!(fabs(*sum - 1.0) <= FLASHSPEC_DRAFT_SUPPORT_TOLERANCE)) return SupportFault::kSum;
  if (drafted_q < 0.0) return SupportFault::kDraftedMissing;
  if (!(drafted_q > 0.0)) return SupportFault::kDraftedZero;
  return SupportFault::kNone;
}

// Σ q over a valid support row, in double, in entry order: the divisor that
// normalises it exactly.
FS_HOST_DEVICE double support_sum(const float* probs, int32_t begin, int32_t end) {
  double sum = 0.0;
  for (int32_t e = begin; e < end; ++e) sum += double(probs[e]);
  return sum;
}

// log q of support entry e of a row whose probabilities sum to `sum`
// (support_sum): log(q_e / sum) rounded to float, −Inf for q_e = 0.
FS_HOST_DEVICE float support_log_q(const float* probs, int32_t e, double sum) {
  const double q = double(probs[e]) / sum;
  return q > 0.0 ? float(log(q)) : neg_inf();
}

}  // namespace flashspec
