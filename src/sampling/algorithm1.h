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
    } else if (row.typical) {
      accept = row.draft_logit - row.lse > row.typical_log_threshold;
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

// The tree walk of a request whose drafts form a tree (flashspec.h, "Tree
// verify"). Point-mass drafts (stochastic false), and every walk at T = 0:
// at the current node, from the root, take the draw of its row; if a child
// (the first, by index) has that token move there, else emit it and stop.
// Stochastic drafts at T > 0 (SpecInfer's multi-step speculative sampling):
// try the node's children in index order, child k accepted iff log u_k <
// its row's node_log_ratio (u_k: ACCEPT_UNIFORM at position k, or the
// caller's uniforms[first_draft + k]); on acceptance move there, and when
// every child is rejected emit the row's candidate, the sample of the final
// residual (at a leaf: the bonus). Writes the path's tokens and the final
// token to emitted[0 .. depth], −1 to the rest of the n + 1 slots, and (each
// optional) the path's node indices, the emitted tokens' logprobs (under the
// row's p, 0 at T = 0) and raw logprobs, the row index that drew each slot
// (−1 past the end). Returns the depth, −1 if a row carries an error.
FS_HOST_DEVICE int32_t finalize_tree_request(const RequestView& r, const int32_t* draft_tokens, const int32_t* parents,
                                             const RowSummary* rows, int32_t* emitted, int32_t* accepted_nodes,
                                             float* logprobs, float* raw_logprobs, int32_t* drawing_rows,
                                             bool stochastic = false, const float* caller_uniforms = nullptr) {
  bool bad = false;
  for (int32_t j = 0; j <= r.num_drafts; ++j) bad = bad || rows[r.first_row + j].status != 0;
  const bool greedy = r.temperature == 0.0f;
  const bool sampled_children = stochastic && !greedy;
  int32_t depth = -1;
  if (!bad) {
    int32_t node = -1;  // the root
    depth = 0;
    for (;;) {
      const int32_t row = node + 1;
      const RowSummary& s = rows[r.first_row + row];
      int32_t next = -1;
      for (int32_t k = node + 1; k < r.num_drafts && next < 0; ++k) {
        if (parents[r.first_draft + k] != node) continue;
        const bool accept = sampled_children
                                ? acceptance_log_uniform(r, k, caller_uniforms) < rows[r.first_row + k + 1].node_log_ratio
                                : draft_tokens[r.first_draft + k] == s.candidate;
        if (accept) next = k;
      }
      if (drawing_rows) drawing_rows[depth] = row;
      if (next < 0) {
        emitted[depth] = s.candidate;
        if (logprobs) logprobs[depth] = greedy ? 0.0f : s.candidate_logit - s.lse;
        if (raw_logprobs) raw_logprobs[depth] = s.candidate_raw_logit - s.raw_lse;
        break;
      }
      const RowSummary& child = rows[r.first_row + next + 1];
      emitted[depth] = draft_tokens[r.first_draft + next];
      if (logprobs) logprobs[depth] = greedy ? 0.0f : sampled_children ? child.node_logp : s.candidate_logit - s.lse;
      if (raw_logprobs)
        raw_logprobs[depth] = sampled_children ? child.node_raw_logp : s.candidate_raw_logit - s.raw_lse;
      if (accepted_nodes) accepted_nodes[depth] = next;
      ++depth;
      node = next;
    }
  }
  for (int32_t k = depth + 1; k <= r.num_drafts; ++k) {
    emitted[k] = -1;
    if (logprobs) logprobs[k] = NAN;
    if (raw_logprobs) raw_logprobs[k] = NAN;
    if (drawing_rows) drawing_rows[k] = -1;
  }
  if (accepted_nodes)
    for (int32_t k = depth < 0 ? 0 : depth; k <= r.num_drafts; ++k) accepted_nodes[k] = -1;
  return depth;
}

// The log probabilities of the tokens finalize_request emitted for request
// r (`accepted` as it returned), written to slots 0 .. n of `logprobs`
// (under the row's controlled p; 0 at T = 0) and `raw_logprobs` (under the
// raw logits), either may be NULL; NaN in the slots without a token. Slot k
// was emitted by row k: the accepted draft k + 1, or the row's candidate.
FS_HOST_DEVICE void emitted_logprobs(const RequestView& r, const RowSummary* rows, int32_t accepted,
                                     float* logprobs, float* raw_logprobs) {
  for (int32_t k = 0; k <= r.num_drafts; ++k) {
    float logprob = NAN, raw = NAN;
    if (accepted >= 0 && k <= accepted) {
      const RowSummary& row = rows[r.first_row + k];
      const bool drafted = k < accepted;
      logprob = r.temperature == 0.0f ? 0.0f : (drafted ? row.draft_logit : row.candidate_logit) - row.lse;
      raw = (drafted ? row.draft_raw_logit : row.candidate_raw_logit) - row.raw_lse;
    }
    if (logprobs) logprobs[k] = logprob;
    if (raw_logprobs) raw_logprobs[k] = raw;
  }
}

}  // namespace flashspec
