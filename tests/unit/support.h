// Helpers of the unit tests: the float64 reference logits with a rigorous
// fp32 accumulation error bound, argmax and log-sum-exp over them, and a host
// verify batch with its outcome. Handles, Rng, contexts, LM heads and
// matrices come from ../common.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../common/handles.h"
#include "../common/make.h"
#include "../common/matrix.h"
#include "../common/rng.h"
#include "flashspec.h"

namespace fstest {

// Exact float64 logits of one hidden row, and for each logit the bound on
// the error of any fp32 evaluation of the same dot product: the products and
// the d − 1 additions each round once (unit roundoff 2^-24), whatever the
// summation order, so |fl(l) − l| ≤ γ_(d+1) Σ|w h| with γ_n = n u / (1 − n u).
struct ReferenceLogits {
  std::vector<double> logit;
  std::vector<double> error_bound;
  double max_error = 0.0;
};

inline ReferenceLogits reference_logits(const Matrix& w, const Matrix& hidden, int64_t row) {
  ReferenceLogits out;
  out.logit.resize(size_t(w.rows));
  out.error_bound.resize(size_t(w.rows));
  const double u = std::ldexp(1.0, -24);
  const double n = double(w.cols + 1);
  const double gamma = n * u / (1.0 - n * u);
  for (int64_t v = 0; v < w.rows; ++v) {
    double sum = 0.0, magnitude = 0.0;
    for (int64_t c = 0; c < w.cols; ++c) {
      double p = w.at(v, c) * hidden.at(row, c);
      sum += p;
      magnitude += std::fabs(p);
    }
    out.logit[size_t(v)] = sum;
    // A tiny absolute term covers the float64 reference's own rounding.
    out.error_bound[size_t(v)] = gamma * magnitude + 1e-12 * (1.0 + magnitude);
    out.max_error = std::max(out.max_error, out.error_bound[size_t(v)]);
  }
  return out;
}

// Index of the largest value, ties → smallest index.
inline int32_t argmax(const std::vector<double>& values) {
  int32_t best = 0;
  for (size_t i = 1; i < values.size(); ++i)
    if (values[i] > values[size_t(best)]) best = int32_t(i);
  return best;
}

// The largest value over all indices but `best`; −Inf if there is none.
inline double runner_up(const std::vector<double>& values, int32_t best) {
  double m = -INFINITY;
  for (size_t i = 0; i < values.size(); ++i)
    if (int32_t(i) != best) m = std::max(m, values[i]);
  return m;
}

inline double log_sum_exp(const std::vector<double>& values, double scale) {
  double m = -INFINITY;
  for (double v : values) m = std::max(m, v * scale);
  double s = 0.0;
  for (double v : values) s += std::exp(v * scale - m);
  return m + std::log(s);
}

// A host verify batch that owns its arrays. Request r has drafts[r] and
// hidden rows [first_row(r), first_row(r) + drafts[r].size()].
struct HostBatch {
  std::vector<std::vector<int32_t>> drafts;
  Matrix hidden;  // [Σ(n_r + 1), d]
  std::vector<float> temperatures;
  std::vector<uint64_t> seeds, request_ids, steps;
  // Stochastic drafts: one row of draft logits per draft token, in order.
  bool has_draft_logits = false;
  Matrix draft_logits;
  std::vector<float> draft_temperatures;

  std::vector<int32_t> offsets, tokens;
  flashspec_tensor hidden_view{}, draft_logits_view{};

  int64_t first_row(size_t r) const {
    int64_t row = 0;
    for (size_t k = 0; k < r; ++k) row += int64_t(drafts[k].size()) + 1;
    return row;
  }
  int64_t total_rows() const { return first_row(drafts.size()); }

  // Fills the C struct; pointers stay valid while this object lives
  // unchanged. Empty optional arrays are passed as NULL.
  flashspec_verify_batch view() {
    offsets.assign(1, 0);
    tokens.clear();
    for (const auto& d : drafts) {
      tokens.insert(tokens.end(), d.begin(), d.end());
      offsets.push_back(int32_t(tokens.size()));
    }
    hidden_view = hidden.view();
    flashspec_verify_batch b;
    flashspec_verify_batch_init(&b);
    b.num_requests = int32_t(drafts.size());
    b.draft_offsets = offsets.data();
    b.draft_tokens = tokens.empty() ? nullptr : tokens.data();
    b.target_hidden = &hidden_view;
    b.temperatures = temperatures.empty() ? nullptr : temperatures.data();
    b.seeds = seeds.empty() ? nullptr : seeds.data();
    b.request_ids = request_ids.empty() ? nullptr : request_ids.data();
    b.steps = steps.empty() ? nullptr : steps.data();
    if (has_draft_logits) {
      draft_logits_view = draft_logits.view();
      b.draft_logits = &draft_logits_view;
      b.draft_temperatures = draft_temperatures.empty() ? nullptr : draft_temperatures.data();
    }
    return b;
  }
};

struct Outcome {
  std::vector<int32_t> accepted;
  std::vector<std::vector<int32_t>> emitted;  // per request, its n_r + 1 slots
  std::vector<uint64_t> next_steps;
  bool operator==(const Outcome& o) const {
    return accepted == o.accepted && emitted == o.emitted && next_steps == o.next_steps;
  }
};

inline Outcome verify_and_finalize(flashspec_context* ctx, flashspec_lm_head* head, HostBatch& hb) {
  flashspec_verify_batch b = hb.view();
  const size_t R = hb.drafts.size();
  std::vector<int32_t> accepted(R, -9), emitted(size_t(hb.total_rows()), -9);
  std::vector<uint64_t> next(R, 0);
  flashspec_verify_result res;
  flashspec_verify_result_init(&res);
  res.accepted_counts = accepted.data();
  res.emitted_tokens = emitted.data();
  res.next_steps = next.data();
  flashspec_status s = flashspec_verify_and_finalize(ctx, head, &b, &res);
  EXPECT_EQ(s, FLASHSPEC_OK) << flashspec_context_last_error(ctx);
  Outcome out;
  out.accepted = accepted;
  out.next_steps = next;
  for (size_t r = 0; r < R; ++r) {
    auto first = emitted.begin() + hb.first_row(r);
    out.emitted.emplace_back(first, first + int64_t(hb.drafts[r].size()) + 1);
  }
  return out;
}

inline const char* dtype_name(flashspec_dtype t) {
  return t == FLASHSPEC_DTYPE_F32 ? "f32" : t == FLASHSPEC_DTYPE_BF16 ? "bf16" : "f16";
}

}  // namespace fstest
