// Algorithm 1 of Leviathan et al. (2023) on per-row summaries: the
// accept/reject walk of one request. One implementation, shared by the CPU
// finalize and the CUDA finalize kernel.
#pragma once

#include <cstdint>

#include "sampling/row_plan.h"
#include "sampling/row_summary.h"
#include "util/host_device.h"
#include "util/philox.h"

namespace flashspec {

// log u of the acceptance test at draft position j (0-based), from the
// caller's uniforms when given, else Philox ACCEPT_UNIFORM at (step, j).
FS_HOST_DEVICE float acceptance_log_uniform(const RequestView& r, int32_t j, const float* caller_uniforms) {
  if (caller_uniforms) return logf(caller_uniforms[r.first_draft + j]);
  RngRowKey key = make_row_key(r.seed, r.request_id, r.step, j, FLASHSPEC_RNG_ACCEPT_UNIFORM);
  return log_uniform_from_bits(row_word(key, 0));
}

// Walks the request; writes the accepted drafts and one more token to
// emitted[0 .. accepted], −1 to the rest of its n + 1 slots, and returns the
// accepted count (−1 if a row of the request carries a device-found error).
FS_HOST_DEVICE int32_t finalize_request(const RequestView& r, const int32_t* draft_tokens,
                                        const RowSummary* rows, const float* caller_uniforms,
                                        int32_t* emitted) {
  for (int32_t j = 0; j <= r.num_drafts; ++j) {
    if (rows[r.first_row + j].status != 0) {
      for (int32_t k = 0; k <= r.num_drafts; ++k) emitted[k] = -1;
      return -1;
    }
  }
  int32_t accepted = 0;
  int32_t final_token = rows[r.first_row + r.num_drafts].candidate;  // bonus unless a rejection
  for (int32_t j = 0; j < r.num_drafts; ++j) {
    const RowSummary& row = rows[r.first_row + j];
    int32_t drafted = draft_tokens[r.first_draft + j];
    bool accept;
    if (r.temperature == 0.0f) {
      accept = (drafted == row.candidate);
    } else {
      float log_ratio = (row.draft_logit - row.lse) - row.draft_logq;
      accept = acceptance_log_uniform(r, j, caller_uniforms) < log_ratio;
    }
    if (!accept) {
      // An empty residual (p ≤ q everywhere) is unreachable in exact
      // arithmetic; the verify pass then leaves the p-sample as candidate.
      final_token = row.candidate;
      break;
    }
    emitted[j] = drafted;
    ++accepted;
  }
  emitted[accepted] = final_token;
  for (int32_t k = accepted + 1; k <= r.num_drafts; ++k) emitted[k] = -1;
  return accepted;
}

}  // namespace flashspec
