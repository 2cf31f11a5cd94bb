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
};

}  // namespace flashspec
