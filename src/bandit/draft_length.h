// The adaptive draft length: each step, the k that maximises the expected
// tokens per unit cost of the step, from live per-position acceptance
// estimates of the drafter (flashspec_draft_len_rule ADAPTIVE).
//
// With a_j the probability that draft position j is accepted given that
// positions 0 .. j − 1 were, a draft of k tokens emits on average
//   E[tokens](k) = 1 + Σ_{j<k} Π_{i≤j} a_i
// (the +1: the recovered or bonus token), at the cost of the engine's cost
// model (bandit/reward.h) for k drafted tokens. The rule plays
//   k* = argmax_{0 ≤ k ≤ K} E[tokens](k) / cost(k)   (ties: the smaller k)
// with K the arm's draft length.
//
// a_j is estimated from the steps that drafted position j: accepted if the
// step accepted more than j drafts, rejected if it accepted exactly j (a
// position after the first rejection is not a trial). Counts decay by a
// factor (1 − 1/memory) per step, so the estimates follow the text
// (a quote being copied, then free prose). Each estimate is smoothed
// towards the one of the position before it (1/2 for position 0) with the
// weight of kPriorTrials trials:
//   a_j = (accepted_j + kPriorTrials · a_{j−1}) / (trials_j + kPriorTrials).
// So a position without recent trials is taken to be as good as the one
// before it (the constant-rate assumption of Leviathan et al.), which is
// what makes the rule try a longer draft when the drafts so far go well; a
// plain prior of 1/2 would stop it short of its best k whenever drafted
// rows are not nearly free.
#pragma once

#include <cstdint>
#include <vector>

#include "bandit/reward.h"

namespace flashspec {

class DraftLengthRule {
 public:
  static constexpr double kPriorTrials = 2.0;

  // memory ≥ 1: the steps the estimates remember.
  DraftLengthRule(const CostModel& model, const DrafterCost& cost, double memory)
      : model_(model), cost_(cost), keep_(1.0 - 1.0 / memory) {}

  // k* in [0, max_len] for the current estimates.
  int32_t choose(int32_t max_len) const;
  // One verify step of the drafter: drafted tokens and accepted ones.
  void record(int32_t drafted, int32_t accepted);
  // The estimate a_j.
  double acceptance(int32_t position) const;

  // The argmax above for given conditional acceptances a[0 .. max_len).
  static int32_t best_length(const CostModel& model, const DrafterCost& cost, const std::vector<double>& acceptance,
                             int32_t max_len);

 private:
  CostModel model_;
  DrafterCost cost_;
  double keep_;  // decay factor per step
  std::vector<double> accepted_;  // decayed counts per position
  std::vector<double> trials_;
};

}  // namespace flashspec
