// The exact CPU backend: one fused pass over the LM head per call.
//
// The vocabulary is cut into fixed tiles of kTileTokens tokens. Each tile
// converts each of its weight rows to fp32 once, scores it against every
// hidden row, and folds the tile into one Partial per row with the shared
// fold rules (sampling/fold.h). Partials are merged in tile order, so the
// result does not depend on how many threads ran the tiles. Greedy drafts
// need no vocabulary-sized scratch; only rows verifying a stochastic draft
// keep their scaled logits, because the residual max(p − q, 0) needs the
// row's final log-sum-exp before any token can be scored.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "sampling/algorithm1.h"
#include "sampling/fold.h"
#include "util/dtype.h"
#include "util/philox.h"
#include "util/status.h"
#include "util/thread_pool.h"

namespace flashspec {
namespace {

constexpr int64_t kTileTokens = 256;

class CpuLmHead final : public LmHeadStorage {
 public:
  std::vector<unsigned char> storage;
};

class CpuSummaries final : public SummaryStore {
 public:
  std::vector<RowSummary> rows;
};

// Fixed-order dot product: eight lanes, combined pairwise. The compiler can
// vectorise it without reassociating, so the sum is the same on every run.
float dot(const float* a, const float* b, int64_t n) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) lane[k] += a[i + k] * b[i + k];
  for (int k = 0; i < n; ++i, ++k) lane[k] += a[i] * b[i];
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

void convert_row(const void* row, flashspec_dtype dtype, int64_t n, float* out) {
  switch (dtype) {
    case FLASHSPEC_DTYPE_F32: std::memcpy(out, row, size_t(n) * sizeof(float)); break;
    case FLASHSPEC_DTYPE_BF16:
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(static_cast<const uint16_t*>(row)[i]);
      break;
    default:
      for (int64_t i = 0; i < n; ++i) out[i] = fp16_to_float(static_cast<const uint16_t*>(row)[i]);
      break;
  }
}

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

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendConfig& config)
      : pool_(config.cpu_threads > 0 ? config.cpu_threads
                                     : int(std::max(1u, std::thread::hardware_concurrency()))) {}

  flashspec_backend kind() const override { return FLASHSPEC_BACKEND_CPU; }
  int device() const override { return -1; }

  std::unique_ptr<LmHeadStorage> create_lm_head(const flashspec_tensor& weight,
                                                flashspec_lm_head_flags flags) override {
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
    std::vector<RowPlan> plans(static_cast<size_t>(args.rows));
    for (int32_t r = 0; r < args.rows; ++r) plans[size_t(r)] = draft_row_plan(draft_row_view(args, r));
    const std::vector<Partial> rows = scan(head, hidden, plans, {});
    for (int32_t r = 0; r < args.rows; ++r) require_finite_row(rows[size_t(r)], r);
    for (int32_t r = 0; r < args.rows; ++r)
      draft_outputs(plans[size_t(r)], rows[size_t(r)], FLASHSPEC_OK, args.tokens_out + r,
                    args.scores_out ? args.scores_out + r : nullptr);
  }

  void verify(const LmHeadStorage& head, const VerifyArgs& args, SummaryStore& store) override {
    auto& summaries = static_cast<CpuSummaries&>(store);
    std::vector<float> hidden = load_rows(*args.target_hidden, Field::kHidden);
    const bool stochastic = args.draft_logits != nullptr;

    std::vector<RowPlan> plans(static_cast<size_t>(args.total_rows));
    std::vector<float*> kept_rows(static_cast<size_t>(args.total_rows), nullptr);
    std::vector<float> kept;  // scaled logits of the rows that keep them
    if (stochastic) kept.resize(size_t(args.total_drafts) * size_t(head.vocab));
    for (int32_t r = 0; r < args.num_requests; ++r) {
      const RequestView req = request_view(args, r);
      for (int32_t j = 0; j <= req.num_drafts; ++j) {
        const RowPlan plan = verify_row_plan(req, j, args.draft_tokens, stochastic);
        plans[size_t(req.first_row + j)] = plan;
        if (plan.flags & kPlanKeep)
          kept_rows[size_t(req.first_row + j)] = kept.data() + size_t(plan.q_row) * size_t(head.vocab);
      }
    }
    const std::vector<Partial> rows = scan(head, hidden, plans, kept_rows);
    for (int32_t row = 0; row < args.total_rows; ++row) require_finite_row(rows[size_t(row)], row);

    std::vector<RowSummary> out(static_cast<size_t>(args.total_rows));
    for (int32_t row = 0; row < args.total_rows; ++row) {
      const RowPlan& plan = plans[size_t(row)];
      out[size_t(row)] = verify_summary(plan, rows[size_t(row)], FLASHSPEC_OK);
      if (plan.q_row >= 0) stochastic_row(head, args, plan, kept_rows[size_t(row)], out[size_t(row)]);
    }
    std::copy(out.begin(), out.end(), summaries.rows.begin());
  }

  void finalize(const VerifyArgs& args, const SummaryStore& store, const ResultArgs& result) override {
    const auto& summaries = static_cast<const CpuSummaries&>(store);
    for (int32_t r = 0; r < args.num_requests; ++r) {
      const RequestView req = request_view(args, r);
      int32_t accepted = finalize_request(req, args.draft_tokens, summaries.rows.data(), args.accept_uniforms,
                                          result.emitted_tokens + req.first_row);
      result.accepted_counts[r] = accepted;
      if (result.next_steps) result.next_steps[r] = req.step + 1;
    }
  }

  void synchronize() override {}

 private:
  // A row verifying a stochastic draft: q = softmax(z / T_d) from the
  // caller's draft logits row, log q of the drafted token and, when the row
  // kept its scaled logits (T > 0), the residual Gumbel-max over the tokens
  // with p > q (RESIDUAL_NOISE).
  static void stochastic_row(const LmHeadStorage& head, const VerifyArgs& args, const RowPlan& plan,
                             const float* kept, RowSummary& summary) {
    const int64_t vocab = head.vocab;
    std::vector<float> z(static_cast<size_t>(vocab));
    convert_row(row_pointer(*args.draft_logits, plan.q_row), args.draft_logits->dtype, vocab, z.data());
    float q_m = neg_inf(), q_s = 0.0f;
    for (int64_t i = 0; i < vocab; ++i) {
      if (!std::isfinite(z[size_t(i)])) fail(FLASHSPEC_ERR_NON_FINITE, Field::kDraftLogits, non_finite_at(plan.q_row, i));
      const float scaled = z[size_t(i)] * plan.inv_td;
      // As for the target rows: z/T_d = ±Inf would make log q NaN.
      if (!std::isfinite(scaled))
        fail(FLASHSPEC_ERR_NON_FINITE, Field::kDraftLogits,
             "row " + std::to_string(plan.q_row) +
                 ": a logit divided by the draft temperature overflows fp32 (draft temperature too small)");
      lse_add(q_m, q_s, scaled);
    }
    const float q_lse = lse_value(q_m, q_s);
    Residual residual = empty_residual();
    if (kept)
      for (int64_t i = 0; i < vocab; ++i)
        fold_residual(residual, kept[i] - summary.lse, z[size_t(i)] * plan.inv_td - q_lse, int32_t(i),
                      row_word(plan.key, int32_t(i)));
    stochastic_summary(summary, plan, z[size_t(plan.tracked)], q_lse, residual);
  }

  // One pass over the LM head for all rows: tiles in parallel, each folded
  // into one Partial per row, the tiles' partials merged in tile order.
  // kept_rows[r], where not NULL, receives row r's scaled logits [V].
  std::vector<Partial> scan(const LmHeadStorage& head, const std::vector<float>& hidden,
                            const std::vector<RowPlan>& plans, const std::vector<float*>& kept_rows) {
    const int64_t rows = int64_t(plans.size());
    const int64_t d = head.hidden;
    const int64_t tiles = (head.vocab + kTileTokens - 1) / kTileTokens;
    std::vector<Partial> partials(size_t(tiles * rows));
    const size_t element = dtype_size(head.dtype);
    pool_.parallel_for(tiles, [&](int64_t tile) {
      const int64_t begin = tile * kTileTokens;
      const int64_t count = std::min(kTileTokens, head.vocab - begin);
      std::vector<float> weight_row(static_cast<size_t>(d));
      std::vector<float> logits(size_t(rows * count));
      for (int64_t k = 0; k < count; ++k) {
        const void* src = static_cast<const unsigned char*>(head.data) + size_t((begin + k) * head.row_stride) * element;
        convert_row(src, head.dtype, d, weight_row.data());
        for (int64_t r = 0; r < rows; ++r) logits[size_t(r * count + k)] = dot(hidden.data() + r * d, weight_row.data(), d);
      }
      for (int64_t r = 0; r < rows; ++r) {
        const RowPlan& plan = plans[size_t(r)];
        const bool greedy = plan.flags & kPlanGreedy;
        float* kept = kept_rows.empty() ? nullptr : kept_rows[size_t(r)];
        Partial part = empty_partial();
        for (int64_t k = 0; k < count; ++k) {
          const int32_t token = int32_t(begin + k);
          const float l = logits[size_t(r * count + k)];
          fold_logit(part, plan, l, token, greedy ? 0u : row_word(plan.key, token));
          if (kept) kept[token] = l * plan.inv_t;
        }
        partials[size_t(tile * rows + r)] = part;
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
