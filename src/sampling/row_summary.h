// What one pass over the LM head leaves behind for one target row: a few
// numbers instead of a vocabulary-sized vector. Written by every backend's
// verify, read by the Algorithm 1 finalize.
#pragma once

#include <cstdint>

namespace flashspec {

struct RowSummary {
  // log-sum-exp of l/T over the vocabulary (T > 0); unused for T = 0.
  float lse;
  // l_x / T for the drafted token x scored by this row (T = 0: l_x). Rows
  // that give the bonus token have no drafted token: 0.
  float draft_logit;
  // log q(x) of a stochastic draft (0 for greedy, point-mass drafts).
  float draft_logq;
  // The token emitted if this row is where verification stops: for a row
  // that scores a draft, the residual sample; for the bonus row, the bonus
  // sample; for T = 0, the argmax (ties → smallest id).
  int32_t candidate;
  // Score gap between the candidate and the runner-up (Gumbel score, or
  // logit for T = 0); +Inf when there is no runner-up. Parity tests use it to
  // recognise near-ties between backends.
  float candidate_gap;
  // 0 when the row is valid; else a flashspec_status found on the device
  // (bad token id, non-finite input) that makes finalize emit nothing.
  int32_t status;
  // Typical acceptance (opt-in, not exact): 1 when the row accepts its draft
  // iff log p(x) > typical_log_threshold instead of Algorithm 1's test.
  int32_t typical;
  float typical_log_threshold;
  // For logprobs: the candidate's x = (l + bias)/T (T = 0: unused), the
  // log-sum-exp of the raw logits l, and the raw logits of the drafted token
  // and of the candidate.
  float candidate_logit;
  float raw_lse;
  float draft_raw_logit;
  float candidate_raw_logit;
  // Stochastic trees, on the row of node k (row k + 1), about node k's own
  // token x_k as its parent's row verifies it: log r(x_k) − log q_k(x_k),
  // r the parent's running residual when x_k is tried (−Inf: never
  // accepted), and log p(x_k) under the parent's controlled and raw logits.
  float node_log_ratio;
  float node_logp;
  float node_raw_logp;
};

}  // namespace flashspec
