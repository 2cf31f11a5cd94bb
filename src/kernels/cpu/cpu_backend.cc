// The exact CPU backend: one fused pass over the LM head per call.
//
// The vocabulary is cut into fixed tiles of kTileTokens tokens. Each tile
// scores its weight rows against every hidden row (cpu/cpu_scan.h: a
// register-blocked kernel whose logits do not depend on the tile) and folds
// the tile into one Partial per row with the shared fold rules
// (sampling/fold.h). Partials are merged in tile order, so the result does
// not depend on how many threads ran the tiles. Greedy drafts
// need no vocabulary-sized scratch. Rows verifying a stochastic draft keep
// their logits, because the residual max(p − q, 0) needs the row's final
// log-sum-exp before any token can be scored; so do the rows of a call with
// sampling controls or logprobs, whose kept set is known only once the
// whole row is (RowAnalysis below, on the rules of sampling/controls.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_scan.h"
#include "sampling/algorithm1.h"
#include "sampling/controls.h"
#include "sampling/draft_support.h"
#include "sampling/fold.h"
#include "util/dtype.h"
#include "util/philox.h"
#include "util/status.h"
#include "util/thread_pool.h"

namespace flashspec {
namespace {

constexpr int64_t kTileTokens = 512;

class CpuLmHead final : public LmHeadStorage {
 public:
  std::vector<unsigned char> storage;
  std::vector<float> row_scales;  // 8-bit heads
};

class CpuSummaries final : public SummaryStore {
 public:
  std::vector<RowSummary> rows;
  int32_t top_n = 0;                // top raw-logit tokens kept per row
  std::vector<int32_t> top_tokens;  // [rows, top_n]
  std::vector<float> top_logprobs;  // [rows, top_n]
};

using cpu::convert_row;

const void* row_pointer(const flashspec_tensor& t, int64_t row) {
  return static_cast<const unsigned char*>(t.data) + size_t(row * t.row_stride) * dtype_size(t.dtype);
}

std::string non_finite_at(int64_t row, int64_t column) {
  return "non-finite value at row " + std::to_string(row) + ", column " + std::to_string(column);
}

// Rows converted to fp32, checked for NaN/Inf.
std::vector<float> load_rows(const flashspec_tensor& t, Field field) {
  std::vector<float> out(size_t(t.rows * t.cols));
  for (int64_t r = 0; r < t.rows; ++r) {
    float* dst = out.data() + r * t.cols;
    convert_row(row_pointer(t, r), t.dtype, t.cols, dst);
    for (int64_t c = 0; c < t.cols; ++c)
      if (!std::isfinite(dst[c])) fail(FLASHSPEC_ERR_NON_FINITE, field, non_finite_at(r, c));
  }
  return out;
}

// A row's reduction may not be used if a logit, or a logit divided by the
// temperature, is not finite: l/T = ±Inf would make the log-sum-exp
// Inf − Inf = NaN and the winner a tie among infinities.
void require_finite_row(const Partial& all, int64_t row) {
  if (all.flags & kPartialNonFinite)
    fail(FLASHSPEC_ERR_NON_FINITE, Field::kHidden, "row " + std::to_string(row) + " gives a logit that overflows fp32");
  if (all.flags & kPartialScaleOverflow)
    fail(FLASHSPEC_ERR_NON_FINITE, Field::kTemperature,
         "row " + std::to_string(row) +
             ": a logit divided by the temperature overflows fp32 (temperature too small)");
}

// The log-sum-exp of a row analysed whole, in one pass: the online rule of
// sampling/fold.h with its running sum in float64. An fp32 running sum
// drifts with the number of terms (about 1e-4 in log space over 70001
// tokens, more over 128256); in float64 each term's fp32 exp carries the
// only rounding that matters, so the error does not grow with V. The terms
// are added in token or rank order, so the value does not depend on the
// thread count.
class LogSumExp {
 public:
  void add(float x) {
    if (x > m_) {
      s_ = s_ * std::exp(double(m_) - double(x)) + 1.0;
      m_ = x;
    } else {
      s_ += double(expf(x - m_));
    }
  }
  float value() const { return float(double(m_) + std::log(s_)); }

 private:
  float m_ = neg_inf();
  double s_ = 0.0;
};

// A row whose distribution needs its whole logits row: one with sampling
// controls, or of a call that returns logprobs. From the raw logits l it
// holds x = (l + bias) / T (T = 0: l + bias) for the allowed tokens, −Inf for
// masked ones, and the kept set S of the controls: every allowed token when
// nothing truncates, else the prefix of the ranking that ends at `cut`.
class RowAnalysis {
 public:
  // `logits` names the input in errors (the hidden rows, or draft logits).
  RowAnalysis(const float* raw, int64_t vocab, const RowControls& controls, const RowPlan& plan, int64_t row,
              Field logits)
      : raw_(raw), vocab_(vocab), greedy_(plan.flags & kPlanGreedy), x_(size_t(vocab)) {
    apply_bias_and_mask(controls, plan, row, logits);
    raw_lse_ = log_sum_exp_all(raw_);
    if (greedy_) return;
    truncated_ = truncates(controls, allowed_);
    if (!truncated_) {
      lse_ = log_sum_exp_all(x_.data());
      return;
    }
    select_kept(controls);
  }

  float x(int32_t token) const { return x_[size_t(token)]; }
  float raw(int32_t token) const { return raw_[token]; }
  float lse() const { return lse_; }
  float raw_lse() const { return raw_lse_; }

  bool kept(int32_t token) const {
    if (x_[size_t(token)] == neg_inf()) return false;
    return greedy_ || !truncated_ || token == cut_token_ || ranks_before(x(token), token, cut_x_, cut_token_);
  }

  // log p(token) under the controlled distribution (T > 0).
  float log_p(int32_t token) const { return kept(token) ? x(token) - lse_ : neg_inf(); }

  // The k kept tokens of largest x in rank order and their log p (T > 0);
  // slots past the kept tokens get −1 / −Inf.
  void top(int32_t k, int32_t* tokens, float* logprobs) const {
    std::vector<int32_t> ids;
    for (int64_t i = 0; i < vocab_; ++i)
      if (kept(int32_t(i))) ids.push_back(int32_t(i));
    const size_t n = std::min(size_t(k), ids.size());
    std::partial_sort(ids.begin(), ids.begin() + std::ptrdiff_t(n), ids.end(),
                      [this](int32_t a, int32_t b) { return ranks_before(x(a), a, x(b), b); });
    for (size_t i = 0; i < size_t(k); ++i) {
      tokens[i] = i < n ? ids[i] : -1;
      logprobs[i] = i < n ? log_p(ids[i]) : neg_inf();
    }
  }

  // H(p) = LSE − Σ p_i x_i over the kept set (T > 0).
  float entropy() const {
    double mean_x = 0.0;  // float64 for the reason LogSumExp gives
    for (int64_t i = 0; i < vocab_; ++i)
      if (kept(int32_t(i))) mean_x += double(expf(x_[size_t(i)] - lse_)) * double(x_[size_t(i)]);
    return float(double(lse_) - mean_x);
  }

  // The row's sample: argmax of x (T = 0), else Gumbel-max of x + g over
  // the kept set without plan.excluded; ties → smallest id.
  Partial winner(const RowPlan& plan) const {
    Partial best = empty_partial();
    for (int64_t i = 0; i < vocab_; ++i) {
      const int32_t token = int32_t(i);
      if (!kept(token) || !is_offered(plan, token)) continue;
      const float score = greedy_ ? x(token) : x(token) + gumbel_from_bits(row_word(plan.key, token));
      if (score > best.best) {
        best.second = best.best;
        best.best = score;
        best.best_scaled = x(token);
        best.token = token;
      } else if (score > best.second) {
        best.second = score;
      }
    }
    return best;
  }

 private:
  void apply_bias_and_mask(const RowControls& c, const RowPlan& plan, int64_t row, Field logits) {
    std::vector<float> bias;              // summed in list order
    std::vector<unsigned char> penalised;  // named by a bias entry
    if (c.bias_count > 0) {
      bias.assign(size_t(vocab_), 0.0f);
      penalised.assign(size_t(vocab_), 0);
      for (int32_t k = 0; k < c.bias_count; ++k) {
        bias[size_t(c.bias_tokens[k])] += c.bias_values[k];
        penalised[size_t(c.bias_tokens[k])] = 1;
      }
    }
    for (int64_t i = 0; i < vocab_; ++i) {
      if (!token_allowed(c, int32_t(i))) {
        x_[size_t(i)] = neg_inf();
        continue;
      }
      ++allowed_;
      const float l = bias.empty() ? raw_[i]
                                   : (penalised[size_t(i)] ? repetition_penalised(raw_[i], c.repetition_penalty)
                                                           : raw_[i]) +
                                         bias[size_t(i)];
      const float x = greedy_ ? l : l * plan.inv_t;
      if (!std::isfinite(x))
        fail(FLASHSPEC_ERR_NON_FINITE, logits == Field::kHidden ? Field::kTemperature : logits,
             "row " + std::to_string(row) + ": a logit plus its bias, divided by the temperature, overflows fp32");
      x_[size_t(i)] = x;
    }
    if (allowed_ == 0)
      fail(FLASHSPEC_ERR_INVALID_ARGUMENT, Field::kNone, "row " + std::to_string(row) + ": the token mask allows no token");
  }

  float log_sum_exp_all(const float* values) const {
    LogSumExp lse;
    for (int64_t i = 0; i < vocab_; ++i)
      if (values[i] != neg_inf()) lse.add(values[i]);
    return lse.value();
  }

  // Ranks as many allowed tokens as the controls need and cuts the prefix.
  void select_kept(const RowControls& c) {
    auto before = [this](int32_t a, int32_t b) { return ranks_before(x(a), a, x(b), b); };
    std::vector<int32_t> ranked;
    ranked.reserve(size_t(allowed_));
    const int64_t k = std::min<int64_t>(c.top_k, allowed_);
    if (c.top_p >= 1.0f && k == allowed_) {
      // min-p alone: only tokens within its window can be kept.
      float x0 = neg_inf();
      for (int64_t i = 0; i < vocab_; ++i) x0 = std::max(x0, x_[size_t(i)]);
      for (int64_t i = 0; i < vocab_; ++i)
        if (x_[size_t(i)] != neg_inf() && expf(x_[size_t(i)] - x0) >= c.min_p) ranked.push_back(int32_t(i));
      std::sort(ranked.begin(), ranked.end(), before);
    } else {
      for (int64_t i = 0; i < vocab_; ++i)
        if (x_[size_t(i)] != neg_inf()) ranked.push_back(int32_t(i));
      std::partial_sort(ranked.begin(), ranked.begin() + k, ranked.end(), before);
      ranked.resize(size_t(k));
    }
    std::vector<float> ranked_x(ranked.size());
    for (size_t i = 0; i < ranked.size(); ++i) ranked_x[i] = x(ranked[i]);
    const int32_t n = kept_count(ranked_x.data(), int32_t(ranked.size()), c);
    cut_token_ = ranked[size_t(n - 1)];
    cut_x_ = ranked_x[size_t(n - 1)];
    LogSumExp lse;
    for (int32_t i = 0; i < n; ++i) lse.add(ranked_x[size_t(i)]);
    lse_ = lse.value();
  }

  const float* raw_;
  int64_t vocab_;
  bool greedy_;
  std::vector<float> x_;
  int64_t allowed_ = 0;
  bool truncated_ = false;
  float cut_x_ = 0.0f;
  int32_t cut_token_ = -1;
  float lse_ = 0.0f;
  float raw_lse_ = 0.0f;
};

// The tokens of largest raw logit, ties by smaller id, and their raw log
// softmax: top_tokens[0 .. n), top_logprobs[0 .. n).
void top_raw_logprobs(const float* raw, int64_t vocab, float raw_lse, int32_t n, int32_t* top_tokens,
                      float* top_logprobs) {
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) ids[size_t(i)] = int32_t(i);
  const int64_t count = std::min<int64_t>(n, vocab);
  std::partial_sort(ids.begin(), ids.begin() + count, ids.end(),
                    [raw](int32_t a, int32_t b) { return ranks_before(raw[a], a, raw[b], b); });
  for (int32_t i = 0; i < n; ++i) {
    top_tokens[i] = i < count ? ids[size_t(i)] : -1;
    top_logprobs[i] = i < count ? raw[ids[size_t(i)]] - raw_lse : neg_inf();
  }
}

// log p of a verifying row's tokens: its controlled distribution when the
// row was analysed whole, else softmax(l / T) of its kept logits.
class TargetRow {
 public:
  explicit TargetRow(const RowAnalysis& analysis) : analysis_(&analysis) {}
  TargetRow(const float* logits, float inv_t, float lse) : logits_(logits), inv_t_(inv_t), lse_(lse) {}

  float log_p(int32_t token) const { return analysis_ ? analysis_->log_p(token) : logits_[token] * inv_t_ - lse_; }
  // What logprobs report: x and log p under the raw logits (analysed rows
  // only; a call that asks for logprobs analyses every row).
  float x(int32_t token) const { return analysis_ ? analysis_->x(token) : logits_[token] * inv_t_; }
  float raw(int32_t token) const { return analysis_ ? analysis_->raw(token) : 0.0f; }
  float raw_logp(int32_t token) const { return analysis_ ? analysis_->raw(token) - analysis_->raw_lse() : 0.0f; }

 private:
  const RowAnalysis* analysis_ = nullptr;
  const float* logits_ = nullptr;
  float inv_t_ = 1.0f, lse_ = 0.0f;
};

// q of one stochastic draft row: softmax(z / T_d) of the caller's draft
// logits row (under the draft controls when given), or the row's sparse
// support, zero elsewhere. A sparse q is its probabilities divided by their
// sum (validated within FLASHSPEC_DRAFT_SUPPORT_TOLERANCE of 1); no dense q
// row is built for it.
class DraftDistribution {
 public:
  DraftDistribution(const LmHeadStorage& head, const VerifyArgs& args, int32_t request, int32_t draft_row,
                    float inv_td) {
    if (args.support_offsets) {
      load_support(args, draft_row);
      return;
    }
    const int64_t vocab = head.vocab;
    z_.resize(size_t(vocab));
    convert_row(row_pointer(*args.draft_logits, draft_row), args.draft_logits->dtype, vocab, z_.data());
    for (int64_t i = 0; i < vocab; ++i)
      if (!std::isfinite(z_[size_t(i)])) fail(FLASHSPEC_ERR_NON_FINITE, Field::kDraftLogits, non_finite_at(draft_row, i));
    if (args.draft_controls.present) {
      RowPlan q_plan = inert_plan(FLASHSPEC_OK);
      q_plan.flags = 0;
      q_plan.inv_t = inv_td;
      analysis_ = std::make_unique<RowAnalysis>(z_.data(), vocab, row_controls(args.draft_controls, request, draft_row),
                                                q_plan, draft_row, Field::kDraftLogits);
      return;
    }
    inv_td_ = inv_td;
    float m = neg_inf(), s = 0.0f;
    for (int64_t i = 0; i < vocab; ++i) {
      const float scaled = z_[size_t(i)] * inv_td;
      // As for the target rows: z/T_d = ±Inf would make log q NaN.
      if (!std::isfinite(scaled))
        fail(FLASHSPEC_ERR_NON_FINITE, Field::kDraftLogits,
             "row " + std::to_string(draft_row) +
                 ": a logit divided by the draft temperature overflows fp32 (draft temperature too small)");
      lse_add(m, s, scaled);
    }
    lse_ = lse_value(m, s);
  }

  float log_q(int32_t token) const {
    if (!z_.empty()) return analysis_ ? analysis_->log_p(token) : z_[size_t(token)] * inv_td_ - lse_;
    auto at = std::lower_bound(support_.begin(), support_.end(), token,
                               [](const SupportEntry& e, int32_t t) { return e.token < t; });
    return at != support_.end() && at->token == token ? at->log_q : neg_inf();
  }

 private:
  struct SupportEntry {
    int32_t token;
    float log_q;
  };

  void load_support(const VerifyArgs& args, int32_t draft_row) {
    const int32_t begin = args.support_offsets[draft_row], end = args.support_offsets[draft_row + 1];
    const double sum = support_sum(args.support_probs, begin, end);
    for (int32_t e = begin; e < end; ++e)
      support_.push_back({args.support_tokens[e], support_log_q(args.support_probs, e, sum)});
    std::sort(support_.begin(), support_.end(),
              [](const SupportEntry& a, const SupportEntry& b) { return a.token < b.token; });
  }

  std::vector<float> z_;  // dense: the draft logits row
  std::unique_ptr<RowAnalysis> analysis_;
  float inv_td_ = 1.0f, lse_ = 0.0f;
  std::vector<SupportEntry> support_;  // sparse, by token
};

// A tree node's own draft as its parent's row verified it (RowSummary's
// node_* fields).
struct NodeVerdict {
  float log_ratio = neg_inf();
  float logp = 0.0f;
  float raw_logp = 0.0f;
};

// What a row's residual chain says about the drafts tried at it.
struct ResidualChain {
  std::vector<float> log_ratio;  // per child: log r_{i−1}(x_i) − log q_i(x_i)
  Residual residual;             // the sample of the final residual
};

// Multi-candidate speculative sampling at one row (SpecInfer): drafts x_1..x_k,
// x_i drawn from q_i, are tried in order against the running residual r_0 =
// p, r_i = norm(max(r_{i−1} − q_i, 0)), x_i accepted with probability
// min(1, r_{i−1}(x_i) / q_i(x_i)); a row whose drafts are all rejected emits
// a sample of r_k. Unnormalised in log space, log R_0 = log p, log R_i =
// log max(R_{i−1} − C_{i−1} q_i, 0), C_i = Σ R_i, so r_i = R_i / C_i. Nothing
// vocabulary-sized is written: each pass over the vocabulary recomputes a
// token's chain, k passes in all, O(V · k²/2) work for k drafts. One draft
// (a chain row) is Algorithm 1 to the bit: log R_0 − 0 − log q, and the
// residual fold of the chain rows. With a sparse q_i, R_i = R_{i−1} off its
// support (log q_i = −Inf there), so only support tokens are changed.
// `key`: the row's RESIDUAL_NOISE, or NULL to skip the final sample.
ResidualChain residual_chain(const TargetRow& p, const std::vector<const DraftDistribution*>& q,
                             const std::vector<int32_t>& tokens, int64_t vocab, const RngRowKey* key) {
  const size_t k = q.size();
  std::vector<float> log_c(k, 0.0f);  // log C_0 .. C_{k−1}; C_0 = Σ p = 1
  auto log_r = [&](int32_t token, size_t steps) {
    float a = p.log_p(token);
    for (size_t m = 0; m < steps; ++m) a = log_subtract(a, log_c[m] + q[m]->log_q(token));
    return a;
  };
  ResidualChain out;
  out.log_ratio.resize(k);
  out.residual = empty_residual();
  for (size_t i = 0; i < k; ++i) {
    out.log_ratio[i] = (log_r(tokens[i], i) - log_c[i]) - q[i]->log_q(tokens[i]);
    if (i + 1 == k) break;
    float m = neg_inf(), s = 0.0f;
    for (int64_t t = 0; t < vocab; ++t) {
      const float a = log_r(int32_t(t), i + 1);
      if (a != neg_inf()) lse_add(m, s, a);
    }
    log_c[i + 1] = lse_value(m, s);
  }
  if (key && k > 0)
    for (int64_t t = 0; t < vocab; ++t)
      fold_residual(out.residual, log_r(int32_t(t), k - 1), log_c[k - 1] + q[k - 1]->log_q(int32_t(t)), int32_t(t),
                    row_word(*key, int32_t(t)));
  return out;
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendConfig& config)
      : pool_(config.cpu_threads > 0 ? config.cpu_threads
                                     : int(std::max(1u, std::thread::hardware_concurrency()))) {}

  flashspec_backend kind() const override { return FLASHSPEC_BACKEND_CPU; }
  int device() const override { return -1; }

  std::unique_ptr<LmHeadStorage> create_lm_head(const flashspec_tensor& weight, flashspec_lm_head_flags flags,
                                                const float* host_scales) override {
    require(weight.memory == FLASHSPEC_MEMORY_HOST, FLASHSPEC_ERR_DEVICE_MISMATCH, Field::kWeight,
            "the CPU backend reads host memory only");
    require(flags == FLASHSPEC_LM_HEAD_COPY, FLASHSPEC_ERR_DEVICE_MISMATCH, Field::kFlags,
            "BORROW is for device memory of the CUDA backend");
    auto head = std::make_unique<CpuLmHead>();
    size_t element = dtype_size(weight.dtype);
    size_t row_bytes = size_t(weight.cols) * element;
    try {
      head->storage.resize(size_t(weight.rows) * row_bytes);
    } catch (const std::bad_alloc&) {
      fail(FLASHSPEC_ERR_OUT_OF_MEMORY, Field::kWeight, "cannot allocate a host copy of the LM head");
    }
    std::vector<float> check(static_cast<size_t>(weight.cols));
    for (int64_t r = 0; r < weight.rows; ++r) {
      const void* src = row_pointer(weight, r);
      convert_row(src, weight.dtype, weight.cols, check.data());
      for (int64_t c = 0; c < weight.cols; ++c)
        if (!std::isfinite(check[size_t(c)])) fail(FLASHSPEC_ERR_NON_FINITE, Field::kWeight, non_finite_at(r, c));
      std::memcpy(head->storage.data() + size_t(r) * row_bytes, src, row_bytes);
    }
    if (host_scales) {
      head->row_scales.assign(host_scales, host_scales + weight.rows);
      head->scales = head->row_scales.data();
    }
    head->backend = FLASHSPEC_BACKEND_CPU;
    head->dtype = weight.dtype;
    head->vocab = weight.rows;
    head->hidden = weight.cols;
    head->row_stride = weight.cols;
    head->data = head->storage.data();
    return head;
  }

  std::unique_ptr<SummaryStore> create_summaries(int32_t max_rows, int32_t max_requests) override {
    auto store = std::make_unique<CpuSummaries>();
    store->backend = FLASHSPEC_BACKEND_CPU;
    store->max_rows = max_rows;
    store->max_requests = max_requests;
    store->rows.resize(size_t(max_rows));
    return store;
  }

  void draft(const LmHeadStorage& head, const DraftArgs& args) override {
    std::vector<float> hidden = load_rows(*args.hidden, Field::kHidden);
    const int64_t vocab = head.vocab;
    std::vector<RowPlan> plans(static_cast<size_t>(args.rows));
    for (int32_t r = 0; r < args.rows; ++r) plans[size_t(r)] = draft_row_plan(draft_row_view(args, r));
    const bool analysed = args.controls.present;
    std::vector<float> kept(analysed ? size_t(args.rows) * size_t(vocab) : 0);
    std::vector<float*> kept_rows;
    if (analysed)
      for (int32_t r = 0; r < args.rows; ++r) kept_rows.push_back(kept.data() + size_t(r) * size_t(vocab));
    const std::vector<Partial> rows = scan(head, hidden, plans, kept_rows);
    for (int32_t r = 0; r < args.rows; ++r) require_finite_row(rows[size_t(r)], r);
    std::vector<int32_t> tokens(static_cast<size_t>(args.rows));
    std::vector<float> scores(static_cast<size_t>(args.rows));
    for (int32_t r = 0; r < args.rows; ++r) {
      const RowPlan& plan = plans[size_t(r)];
      if (!analysed) {
        draft_outputs(plan, rows[size_t(r)], FLASHSPEC_OK, &tokens[size_t(r)], &scores[size_t(r)]);
        continue;
      }
      const RowAnalysis a(kept_rows[size_t(r)], vocab, row_controls(args.controls, r, r), plan, r, Field::kHidden);
      const Partial w = a.winner(plan);
      tokens[size_t(r)] = w.token;
      scores[size_t(r)] = (plan.flags & kPlanGreedy) ? w.best_scaled : w.best_scaled - a.lse();
    }
    std::copy(tokens.begin(), tokens.end(), args.tokens_out);
    if (args.scores_out) std::copy(scores.begin(), scores.end(), args.scores_out);
  }

  void draft_top_k(const LmHeadStorage& head, const DraftArgs& args, int32_t k, int32_t* tokens_out,
                   float* logprobs_out) override {
    std::vector<float> hidden = load_rows(*args.hidden, Field::kHidden);
    const int64_t vocab = head.vocab;
    // The scan only keeps each row's logits (a greedy fold draws no noise);
    // the ranking and the log-sum-exp over the allowed tokens come from
    // RowAnalysis at temperature 1, which the validated controls never
    // truncate.
    const std::vector<RowPlan> scan_plans(size_t(args.rows), inert_plan(FLASHSPEC_OK));
    std::vector<float> kept(size_t(args.rows) * size_t(vocab));
    std::vector<float*> kept_rows;
    for (int32_t r = 0; r < args.rows; ++r) kept_rows.push_back(kept.data() + size_t(r) * size_t(vocab));
    const std::vector<Partial> rows = scan(head, hidden, scan_plans, kept_rows);
    for (int32_t r = 0; r < args.rows; ++r) require_finite_row(rows[size_t(r)], r);
    RowPlan softmax_plan = inert_plan(FLASHSPEC_OK);
    softmax_plan.flags = 0;
    softmax_plan.inv_t = 1.0f;
    const size_t slots = size_t(args.rows) * size_t(k);
    std::vector<int32_t> tokens(slots);
    std::vector<float> logprobs(slots);
    for (int32_t r = 0; r < args.rows; ++r) {
      const RowAnalysis a(kept_rows[size_t(r)], vocab, row_controls(args.controls, r, r), softmax_plan, r,
                          Field::kHidden);
      a.top(k, tokens.data() + size_t(r) * size_t(k), logprobs.data() + size_t(r) * size_t(k));
    }
    std::copy(tokens.begin(), tokens.end(), tokens_out);
    if (logprobs_out) std::copy(logprobs.begin(), logprobs.end(), logprobs_out);
  }

  void verify(const LmHeadStorage& head, const VerifyArgs& args, SummaryStore& store) override {
    auto& summaries = static_cast<CpuSummaries&>(store);
    std::vector<float> hidden = load_rows(*args.target_hidden, Field::kHidden);
    const bool stochastic = has_draft_distribution(args);
    const int64_t vocab = head.vocab;
    // Rows analysed whole (RowAnalysis) keep their logits; otherwise only
    // the rows that resample a stochastic draft's residual keep theirs.
    const bool analysed = args.controls.present || args.draft_controls.present || args.logprobs ||
                          args.top_logprobs > 0;

    std::vector<RowPlan> plans(static_cast<size_t>(args.total_rows));
    std::vector<int32_t> request_of(static_cast<size_t>(args.total_rows));
    std::vector<size_t> kept_slot(static_cast<size_t>(args.total_rows), SIZE_MAX);
    size_t kept_count = 0;
    for (int32_t r = 0; r < args.num_requests; ++r) {
      const RequestView req = request_view(args, r);
      for (int32_t j = 0; j <= req.num_drafts; ++j) {
        const int32_t row = req.first_row + j;
        const bool typical = analysed && j < req.num_drafts && typical_acceptance(row_controls(args.controls, r, row));
        const RowPlan plan = batch_row_plan(args, req, j, typical);
        plans[size_t(row)] = plan;
        request_of[size_t(row)] = r;
        if (analysed || (plan.flags & kPlanKeep)) kept_slot[size_t(row)] = kept_count++;
      }
    }
    std::vector<float> kept(kept_count * size_t(vocab));  // logits of the rows that keep them
    std::vector<float*> kept_rows(static_cast<size_t>(args.total_rows), nullptr);
    for (int32_t row = 0; row < args.total_rows; ++row)
      if (kept_slot[size_t(row)] != SIZE_MAX) kept_rows[size_t(row)] = kept.data() + kept_slot[size_t(row)] * size_t(vocab);
    const std::vector<Partial> rows = scan(head, hidden, plans, kept_rows);
    for (int32_t row = 0; row < args.total_rows; ++row) require_finite_row(rows[size_t(row)], row);

    std::vector<RowSummary> out(static_cast<size_t>(args.total_rows));
    const int32_t top_n = args.top_logprobs;
    std::vector<int32_t> top_tokens(size_t(args.total_rows) * size_t(top_n));
    std::vector<float> top_logprobs(top_tokens.size());
    std::vector<NodeVerdict> verdicts(static_cast<size_t>(args.total_drafts));
    std::vector<int32_t> drafts;
    for (int32_t row = 0; row < args.total_rows; ++row) {
      const RowPlan& plan = plans[size_t(row)];
      const int32_t request = request_of[size_t(row)];
      std::unique_ptr<RowAnalysis> analysis;
      if (analysed) {
        const RowControls c = row_controls(args.controls, request, row);
        analysis = std::make_unique<RowAnalysis>(kept_rows[size_t(row)], vocab, c, plan, row, Field::kHidden);
        out[size_t(row)] = analysed_summary(c, plan, *analysis);
        if (top_n > 0)
          top_raw_logprobs(kept_rows[size_t(row)], vocab, out[size_t(row)].raw_lse, top_n,
                           top_tokens.data() + size_t(row) * size_t(top_n),
                           top_logprobs.data() + size_t(row) * size_t(top_n));
      } else {
        out[size_t(row)] = verify_summary(plan, rows[size_t(row)], FLASHSPEC_OK);
      }
      if (!stochastic) continue;
      const RequestView req = request_view(args, request);
      tried_drafts(args, req, row - req.first_row, drafts);
      if (drafts.empty()) continue;
      const TargetRow p = analysis ? TargetRow(*analysis)
                                   : TargetRow(kept_rows[size_t(row)], plan.inv_t, out[size_t(row)].lse);
      verify_drafts(head, args, req, request, plan, p, drafts, out[size_t(row)], verdicts);
    }
    if (stochastic && args.draft_parents)
      for (int32_t r = 0; r < args.num_requests; ++r) {
        const RequestView req = request_view(args, r);
        for (int32_t k = 0; k < req.num_drafts; ++k) {
          const NodeVerdict& v = verdicts[size_t(req.first_draft + k)];
          RowSummary& node_row = out[size_t(req.first_row + k + 1)];
          node_row.node_log_ratio = v.log_ratio;
          node_row.node_logp = v.logp;
          node_row.node_raw_logp = v.raw_logp;
        }
      }
    std::copy(out.begin(), out.end(), summaries.rows.begin());
    summaries.top_n = top_n;
    summaries.top_tokens = std::move(top_tokens);
    summaries.top_logprobs = std::move(top_logprobs);
  }

  void finalize(const VerifyArgs& args, const SummaryStore& store, const ResultArgs& result) override {
    const auto& summaries = static_cast<const CpuSummaries&>(store);
    std::vector<int32_t> drawing_rows;
    for (int32_t r = 0; r < args.num_requests; ++r) {
      const RequestView req = request_view(args, r);
      const size_t first = size_t(req.first_row);
      auto at = [first](auto* out) { return out ? out + first : nullptr; };
      int32_t accepted;
      drawing_rows.assign(size_t(req.num_drafts) + 1, -1);
      if (!request_is_chain(args, req)) {
        accepted = finalize_tree_request(req, args.draft_tokens, args.draft_parents, summaries.rows.data(),
                                         result.emitted_tokens + first, at(result.accepted_nodes),
                                         at(result.logprobs), at(result.raw_logprobs), drawing_rows.data(),
                                         has_draft_distribution(args), args.accept_uniforms);
      } else {
        accepted = finalize_request(req, args.draft_tokens, summaries.rows.data(), args.accept_uniforms,
                                    result.emitted_tokens + first);
        if (result.logprobs || result.raw_logprobs)
          emitted_logprobs(req, summaries.rows.data(), accepted, at(result.logprobs), at(result.raw_logprobs));
        for (int32_t k = 0; k <= req.num_drafts; ++k) {
          const bool emitted = accepted >= 0 && k <= accepted;
          drawing_rows[size_t(k)] = emitted ? k : -1;
          if (result.accepted_nodes) result.accepted_nodes[first + size_t(k)] = emitted && k < accepted ? k : -1;
        }
      }
      result.accepted_counts[r] = accepted;
      if (result.next_steps) result.next_steps[r] = req.step + 1;
      // Slot k's top logprobs are those of the row that drew its token.
      const size_t n = size_t(summaries.top_n);
      for (int32_t k = 0; k <= req.num_drafts && n > 0; ++k) {
        const int32_t row = drawing_rows[size_t(k)];
        const size_t slot = (first + size_t(k)) * n, source = (first + size_t(row)) * n;
        for (size_t i = 0; i < n; ++i) {
          if (result.top_tokens) result.top_tokens[slot + i] = row >= 0 ? summaries.top_tokens[source + i] : -1;
          if (result.top_logprobs) result.top_logprobs[slot + i] = row >= 0 ? summaries.top_logprobs[source + i] : NAN;
        }
      }
    }
  }

  void verify_records(const LmHeadStorage& head, const VerifyArgs& args, ShardRecord* records) override {
    std::vector<float> hidden = load_rows(*args.target_hidden, Field::kHidden);
    std::vector<RowPlan> plans(static_cast<size_t>(args.total_rows));
    for (int32_t r = 0; r < args.num_requests; ++r) {
      const RequestView req = request_view(args, r);
      for (int32_t j = 0; j <= req.num_drafts; ++j) plans[size_t(req.first_row + j)] = batch_row_plan(args, req, j);
    }
    write_records(head, scan(head, hidden, plans, {}), records);
  }

  void draft_records(const LmHeadStorage& head, const DraftArgs& args, ShardRecord* records) override {
    std::vector<float> hidden = load_rows(*args.hidden, Field::kHidden);
    std::vector<RowPlan> plans(static_cast<size_t>(args.rows));
    for (int32_t r = 0; r < args.rows; ++r) plans[size_t(r)] = draft_row_plan(draft_row_view(args, r));
    write_records(head, scan(head, hidden, plans, {}), records);
  }

  void finalize_records(const VerifyArgs& args, const ShardRecord* records, int32_t shards,
                        const ResultArgs& result) override {
    CpuSummaries summaries;
    summaries.rows.resize(size_t(args.total_rows));
    for (int32_t r = 0; r < args.num_requests; ++r) {
      const RequestView req = request_view(args, r);
      for (int32_t j = 0; j <= req.num_drafts; ++j) {
        const int32_t row = req.first_row + j;
        const RowPlan plan = batch_row_plan(args, req, j);
        const Partial all = merge_records(records, shards, args.total_rows, row);
        summaries.rows[size_t(row)] = verify_summary(plan, all, row_status(plan, all, 0));
      }
    }
    finalize(args, summaries, result);
  }

  void draft_from_records(const DraftArgs& args, const ShardRecord* records, int32_t shards) override {
    std::vector<int32_t> tokens(static_cast<size_t>(args.rows));
    std::vector<float> scores(static_cast<size_t>(args.rows));
    for (int32_t r = 0; r < args.rows; ++r) {
      const RowPlan plan = draft_row_plan(draft_row_view(args, r));
      const Partial all = merge_records(records, shards, args.rows, r);
      require_finite_row(all, r);
      draft_outputs(plan, all, FLASHSPEC_OK, &tokens[size_t(r)], &scores[size_t(r)]);
    }
    std::copy(tokens.begin(), tokens.end(), args.tokens_out);
    if (args.scores_out) std::copy(scores.begin(), scores.end(), args.scores_out);
  }

  void synchronize() override {}

 private:
  // A shard's rows, checked as verify and draft check them, as records.
  static void write_records(const LmHeadStorage& head, const std::vector<Partial>& rows, ShardRecord* records) {
    for (size_t r = 0; r < rows.size(); ++r) require_finite_row(rows[r], int64_t(r));
    for (size_t r = 0; r < rows.size(); ++r)
      records[r] = shard_record(rows[r], head.vocab_begin, head.vocab_begin + head.vocab, head.vocab_size);
  }

  // The drafts row j of request v verifies (batch draft indices, in the
  // order they are tried): a chain row's one draft, a tree node's children.
  static void tried_drafts(const VerifyArgs& args, const RequestView& v, int32_t j, std::vector<int32_t>& drafts) {
    drafts.resize(size_t(v.num_drafts) + 1);
    drafts.resize(size_t(drafts_tried_at(args, v, j, drafts.data())));
  }

  // The stochastic drafts a row verifies, against its p: log q of a chain
  // row's draft (Algorithm 1 reads it in finalize); at T > 0 each tree
  // child's verdict and the row's residual candidate (residual_chain). An
  // empty residual (unreachable in exact arithmetic) leaves the row's
  // p-sample as its candidate.
  static void verify_drafts(const LmHeadStorage& head, const VerifyArgs& args, const RequestView& v,
                            int32_t request, const RowPlan& plan, const TargetRow& p,
                            const std::vector<int32_t>& drafts, RowSummary& s, std::vector<NodeVerdict>& verdicts) {
    std::vector<DraftDistribution> q;
    q.reserve(drafts.size());
    std::vector<const DraftDistribution*> q_of;
    std::vector<int32_t> tokens;
    for (int32_t d : drafts) {
      q.emplace_back(head, args, request, d, 1.0f / v.draft_temperature);
      q_of.push_back(&q.back());
      tokens.push_back(args.draft_tokens[d]);
      // Draft controls can give the drafted token q = 0 (an error of the
      // call); a dense row without them only underflows, which Algorithm 1
      // reads as p/q = +Inf (sparse supports are checked before the call).
      if (args.draft_controls.present && !(q.back().log_q(tokens.back()) > neg_inf()))
        fail(FLASHSPEC_ERR_INVALID_ARGUMENT, Field::kDraftLogits,
             "row " + std::to_string(d) + ": the drafted token has probability 0 under q (draft_controls)");
    }
    s.draft_logq = q.front().log_q(tokens.front());
    if (!(plan.flags & kPlanKeep)) return;  // T = 0 or typical acceptance: no residual
    const ResidualChain chain = residual_chain(p, q_of, tokens, head.vocab, &plan.key);
    for (size_t i = 0; i < drafts.size(); ++i)
      verdicts[size_t(drafts[i])] = {chain.log_ratio[i], p.log_p(tokens[i]), p.raw_logp(tokens[i])};
    if (chain.residual.token < 0) return;
    s.candidate = chain.residual.token;
    s.candidate_gap = winner_gap(chain.residual.best, chain.residual.second);
    s.candidate_logit = p.x(chain.residual.token);
    s.candidate_raw_logit = p.raw(chain.residual.token);
  }

  // The summary of a row analysed whole: the controlled p of its request,
  // its sample (the residual of a point-mass draft, the bonus, or the argmax),
  // and what logprobs and typical acceptance need.
  static RowSummary analysed_summary(const RowControls& c, const RowPlan& plan, const RowAnalysis& a) {
    const bool greedy = plan.flags & kPlanGreedy;
    RowSummary s = verify_summary(plan, empty_partial(), FLASHSPEC_OK);
    s.lse = greedy ? 0.0f : a.lse();
    if (plan.tracked >= 0) {
      s.draft_logit = a.kept(plan.tracked) ? a.x(plan.tracked) : neg_inf();
      s.draft_raw_logit = a.raw(plan.tracked);
    }
    const Partial w = a.winner(plan);
    s.candidate = w.token;
    s.candidate_gap = winner_gap(w.best, w.second);
    s.candidate_logit = w.best_scaled;
    s.candidate_raw_logit = w.token >= 0 ? a.raw(w.token) : 0.0f;
    s.raw_lse = a.raw_lse();
    if (!greedy && plan.tracked >= 0 && typical_acceptance(c)) {
      s.typical = 1;
      s.typical_log_threshold = typical_log_threshold(c, a.entropy());
    }
    return s;
  }

  // One pass over the LM head for all rows: tiles in parallel, each folded
  // into one Partial per row, the tiles' partials merged in tile order.
  // kept_rows[r], where not NULL, receives row r's logits [V].
  std::vector<Partial> scan(const LmHeadStorage& head, const std::vector<float>& hidden,
                            const std::vector<RowPlan>& plans, const std::vector<float*>& kept_rows) {
    const int64_t rows = int64_t(plans.size());
    const int64_t d = head.hidden;
    const int64_t tiles = (head.vocab + kTileTokens - 1) / kTileTokens;
    std::vector<Partial> partials(size_t(tiles * rows));
    const size_t element = dtype_size(head.dtype);
    const cpu::WeightRows weights{head.data, head.dtype, head.row_stride, head.scales};
    pool_.parallel_for(tiles, [&](int64_t tile) {
      const int64_t begin = tile * kTileTokens;
      const int64_t count = std::min(kTileTokens, head.vocab - begin);
      std::vector<float> logits(size_t(rows * count));
      const cpu::WeightRows tile_weights{
          static_cast<const unsigned char*>(weights.data) + size_t(begin * head.row_stride) * element, head.dtype,
          head.row_stride, head.scales ? head.scales + begin : nullptr};
      cpu::tile_logits(tile_weights, count, hidden.data(), rows, d, logits.data());
      for (int64_t r = 0; r < rows; ++r) {
        const float* row_logits = logits.data() + r * count;
        partials[size_t(tile * rows + r)] =
            cpu::fold_tile(plans[size_t(r)], row_logits, count, int32_t(head.vocab_begin + begin));
        if (!kept_rows.empty() && kept_rows[size_t(r)])
          std::copy(row_logits, row_logits + count, kept_rows[size_t(r)] + begin);
      }
    });
    std::vector<Partial> result(static_cast<size_t>(rows), empty_partial());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t t = 0; t < tiles; ++t) merge_partial(result[size_t(r)], partials[size_t(t * rows + r)]);
    return result;
  }

  ThreadPool pool_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const BackendConfig& config) {
  return std::make_unique<CpuBackend>(config);
}

}  // namespace flashspec
