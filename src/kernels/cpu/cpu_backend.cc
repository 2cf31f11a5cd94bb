// The exact CPU backend: one fused pass over the LM head per call.
//
// The vocabulary is cut into fixed tiles of kTileTokens tokens. Each tile
// converts each of its weight rows to fp32 once, scores it against every
// hidden row, and reduces the tile to a TilePartial per row (online
// log-sum-exp, running Gumbel/argmax winner and runner-up, the drafted
// token's logit). Partials are combined in tile order, so the result does not
// depend on how many threads ran the tiles. Greedy drafts need no
// vocabulary-sized scratch; only rows verifying a stochastic draft keep their
// scaled logits, because the residual max(p − q, 0) needs the row's final
// log-sum-exp before any token can be scored.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "sampling/algorithm1.h"
#include "util/dtype.h"
#include "util/philox.h"
#include "util/status.h"
#include "util/thread_pool.h"

namespace flashspec {
namespace {

constexpr int64_t kTileTokens = 256;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();

class CpuLmHead final : public LmHeadStorage {
 public:
  std::vector<unsigned char> storage;
};

class CpuSummaries final : public SummaryStore {
 public:
  std::vector<RowSummary> rows;
};

// What the scan must produce for one hidden row.
struct RowPlan {
  bool greedy = true;            // T = 0: plain argmax of the logits
  float inv_temperature = 1.0f;  // 1/T for T > 0; scores are l * (1/T)
  int32_t tracked_token = -1;    // report this token's scaled logit
  int32_t excluded_token = -1;   // never the Gumbel candidate (greedy-draft residual)
  RngRowKey noise_key{};         // Gumbel noise of the candidate (T > 0)
  float* kept_logits = nullptr;  // [V] scaled logits, stochastic-draft rows only
};

struct TilePartial {
  float max_scaled;      // max of l/T in the tile
  double sum_exp;        // Σ exp(l/T − max_scaled)
  float best_score;      // Gumbel score (T > 0) or logit (T = 0) of the winner
  float best_scaled;     // the winner's l/T (T > 0) or l (T = 0)
  int32_t best_token;
  float second_score;    // runner-up score
  float tracked_scaled;  // l/T of the tracked token, if in this tile
  bool has_tracked;
  bool finite;         // every logit l is finite
  bool scaled_finite;  // every l/T is finite (a tiny T can overflow it)
};

struct RowResult {
  float lse;
  float best_score;
  float best_scaled;
  int32_t best_token;
  float second_score;
  float tracked_scaled;
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

// Rows converted to fp32, checked for NaN/Inf.
std::vector<float> load_rows(const flashspec_tensor& t, const char* argument) {
  std::vector<float> out(size_t(t.rows * t.cols));
  for (int64_t r = 0; r < t.rows; ++r) {
    float* dst = out.data() + r * t.cols;
    convert_row(row_pointer(t, r), t.dtype, t.cols, dst);
    for (int64_t c = 0; c < t.cols; ++c)
      if (!std::isfinite(dst[c]))
        fail(FLASHSPEC_ERR_NON_FINITE, std::string(argument) + ": non-finite value at row " +
                                           std::to_string(r) + ", column " + std::to_string(c));
  }
  return out;
}

void update_winner(float score, float scaled, int32_t token, TilePartial& p) {
  if (score > p.best_score) {
    p.second_score = p.best_score;
    p.best_score = score;
    p.best_scaled = scaled;
    p.best_token = token;
  } else if (score > p.second_score) {
    p.second_score = score;
  }
}

// Reduces scaled logits of one row over tokens [begin, begin + count).
TilePartial reduce_tile(const RowPlan& plan, const float* logits, int64_t begin, int64_t count) {
  TilePartial p{kNegInf, 0.0, kNegInf, 0.0f, -1, kNegInf, 0.0f, false, true, true};
  for (int64_t k = 0; k < count; ++k) {
    float l = logits[k];
    if (!std::isfinite(l)) p.finite = false;
    int32_t token = int32_t(begin + k);
    float scaled = plan.greedy ? l : l * plan.inv_temperature;
    if (!std::isfinite(scaled)) p.scaled_finite = false;
    if (token == plan.tracked_token) {
      p.tracked_scaled = scaled;
      p.has_tracked = true;
    }
    if (plan.kept_logits) plan.kept_logits[token] = scaled;
    if (!plan.greedy) p.max_scaled = std::max(p.max_scaled, scaled);
    if (token == plan.excluded_token) continue;
    float score = scaled;
    if (!plan.greedy) score += gumbel_from_bits(row_word(plan.noise_key, token));
    update_winner(score, scaled, token, p);
  }
  if (!plan.greedy)
    for (int64_t k = 0; k < count; ++k) p.sum_exp += std::exp(double(logits[k] * plan.inv_temperature - p.max_scaled));
  return p;
}

// Names of the arguments a non-finite logit is blamed on, per call.
struct ScanArguments {
  const char* hidden;
  const char* temperature;
};

RowResult combine_tiles(const RowPlan& plan, const TilePartial* partials, int64_t tiles, int64_t row_count,
                        int64_t row, const ScanArguments& names) {
  TilePartial acc = partials[0];
  for (int64_t t = 1; t < tiles; ++t) {
    const TilePartial& p = partials[t * row_count];
    if (!p.finite) acc.finite = false;
    if (!p.scaled_finite) acc.scaled_finite = false;
    if (p.has_tracked) {
      acc.tracked_scaled = p.tracked_scaled;
      acc.has_tracked = true;
    }
    if (!plan.greedy) {
      float m = std::max(acc.max_scaled, p.max_scaled);
      acc.sum_exp = acc.sum_exp * std::exp(double(acc.max_scaled - m)) + p.sum_exp * std::exp(double(p.max_scaled - m));
      acc.max_scaled = m;
    }
    // Earlier tiles hold smaller ids, so a tie keeps the accumulated winner.
    if (p.best_score > acc.best_score) {
      acc.second_score = std::max(acc.best_score, p.second_score);
      acc.best_score = p.best_score;
      acc.best_scaled = p.best_scaled;
      acc.best_token = p.best_token;
    } else {
      acc.second_score = std::max(acc.second_score, p.best_score);
    }
  }
  if (!acc.finite)
    fail(FLASHSPEC_ERR_NON_FINITE, std::string(names.hidden) + ": row " + std::to_string(row) +
                                       " gives a logit that overflows fp32");
  // l/T = ±Inf would make the log-sum-exp Inf − Inf = NaN and the winner a
  // tie among infinities: refuse the row instead of returning either.
  if (!acc.scaled_finite)
    fail(FLASHSPEC_ERR_NON_FINITE, std::string(names.temperature) + ": row " + std::to_string(row) +
                                       ": a logit divided by the temperature overflows fp32 (temperature too small)");
  RowResult r;
  r.lse = plan.greedy ? 0.0f : float(double(acc.max_scaled) + std::log(acc.sum_exp));
  r.best_score = acc.best_score;
  r.best_scaled = acc.best_scaled;
  r.best_token = acc.best_token;
  r.second_score = acc.second_score;
  r.tracked_scaled = acc.tracked_scaled;
  return r;
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
    require(weight.memory == FLASHSPEC_MEMORY_HOST, FLASHSPEC_ERR_DEVICE_MISMATCH, "weight",
            "the CPU backend reads host memory only");
    require(flags == FLASHSPEC_LM_HEAD_COPY, FLASHSPEC_ERR_DEVICE_MISMATCH, "flags",
            "BORROW is for device memory of the CUDA backend");
    auto head = std::make_unique<CpuLmHead>();
    size_t element = dtype_size(weight.dtype);
    size_t row_bytes = size_t(weight.cols) * element;
    try {
      head->storage.resize(size_t(weight.rows) * row_bytes);
    } catch (const std::bad_alloc&) {
      fail(FLASHSPEC_ERR_OUT_OF_MEMORY, "weight: cannot allocate a host copy of the LM head");
    }
    std::vector<float> check(static_cast<size_t>(weight.cols));
    for (int64_t r = 0; r < weight.rows; ++r) {
      const void* src = row_pointer(weight, r);
      convert_row(src, weight.dtype, weight.cols, check.data());
      for (int64_t c = 0; c < weight.cols; ++c)
        if (!std::isfinite(check[size_t(c)]))
          fail(FLASHSPEC_ERR_NON_FINITE, "weight: non-finite value at row " + std::to_string(r) + ", column " +
                                             std::to_string(c));
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
    std::vector<float> hidden = load_rows(*args.hidden, "hidden");
    std::vector<RowPlan> plans(static_cast<size_t>(args.rows));
    for (int32_t r = 0; r < args.rows; ++r) {
      float t = args.temperatures ? args.temperatures[r] : args.temperature;
      RowPlan& plan = plans[size_t(r)];
      plan.greedy = (t == 0.0f);
      if (!plan.greedy) {
        plan.inv_temperature = 1.0f / t;
        plan.noise_key = make_row_key(args.seeds ? args.seeds[r] : args.default_seed,
                                      args.request_ids ? args.request_ids[r] : uint64_t(r),
                                      args.steps ? args.steps[r] : 0, args.positions ? args.positions[r] : 0,
                                      FLASHSPEC_RNG_DRAFT_NOISE);
      }
    }
    std::vector<RowResult> results = scan(head, hidden, plans, {"hidden", "params->temperature"});
    for (int32_t r = 0; r < args.rows; ++r) {
      const RowResult& res = results[size_t(r)];
      args.tokens_out[r] = res.best_token;
      if (args.scores_out)
        args.scores_out[r] = plans[size_t(r)].greedy ? res.best_scaled : res.best_scaled - res.lse;
    }
  }

  void verify(const LmHeadStorage& head, const VerifyArgs& args, SummaryStore& store) override {
    auto& summaries = static_cast<CpuSummaries&>(store);
    std::vector<float> hidden = load_rows(*args.target_hidden, "batch->target_hidden");
    const bool stochastic = args.draft_logits != nullptr;
    std::vector<float> kept;  // scaled logits of rows verifying a stochastic draft
    if (stochastic) kept.resize(size_t(args.total_drafts) * size_t(head.vocab));

    std::vector<RowPlan> plans(static_cast<size_t>(args.total_rows));
    for (int32_t r = 0; r < args.num_requests; ++r) {
      RequestView req = request_view(args, r);
      for (int32_t j = 0; j <= req.num_drafts; ++j) {
        RowPlan& plan = plans[size_t(req.first_row + j)];
        plan.greedy = (req.temperature == 0.0f);
        plan.inv_temperature = plan.greedy ? 1.0f : 1.0f / req.temperature;
        bool bonus = (j == req.num_drafts);
        if (!bonus) {
          plan.tracked_token = args.draft_tokens[req.first_draft + j];
          if (stochastic && !plan.greedy) plan.kept_logits = kept.data() + size_t(req.first_draft + j) * size_t(head.vocab);
          else if (!plan.greedy) plan.excluded_token = plan.tracked_token;
        }
        if (!plan.greedy)
          plan.noise_key = make_row_key(req.seed, req.request_id, req.step, j,
                                        bonus ? FLASHSPEC_RNG_BONUS_NOISE : FLASHSPEC_RNG_RESIDUAL_NOISE);
      }
    }
    std::vector<RowResult> results = scan(head, hidden, plans, {"batch->target_hidden", "batch->temperatures"});

    std::vector<RowSummary> out(static_cast<size_t>(args.total_rows));
    for (int32_t r = 0; r < args.num_requests; ++r) {
      RequestView req = request_view(args, r);
      for (int32_t j = 0; j <= req.num_drafts; ++j) {
        const int32_t row = req.first_row + j;
        const RowResult& res = results[size_t(row)];
        RowSummary& s = out[size_t(row)];
        s.lse = res.lse;
        s.draft_logit = (j < req.num_drafts) ? res.tracked_scaled : 0.0f;
        s.draft_logq = 0.0f;
        s.candidate = res.best_token;
        s.candidate_gap = (res.second_score == kNegInf) ? kPosInf : res.best_score - res.second_score;
        s.status = 0;
        if (stochastic && j < req.num_drafts) {
          float draft_t = args.draft_temperatures ? args.draft_temperatures[r] : 1.0f;
          stochastic_residual(head, args, req, j, 1.0f / draft_t, res, plans[size_t(row)], s);
        }
      }
    }
    std::copy(out.begin(), out.end(), summaries.rows.begin());
  }

  void finalize(const VerifyArgs& args, const SummaryStore& store, const ResultArgs& result) override {
    const auto& summaries = static_cast<const CpuSummaries&>(store);
    for (int32_t r = 0; r < args.num_requests; ++r) {
      RequestView req = request_view(args, r);
      int32_t accepted = finalize_request(req, args.draft_tokens, summaries.rows.data(), args.accept_uniforms,
                                          result.emitted_tokens + req.first_row);
      result.accepted_counts[r] = accepted;
      if (result.next_steps) result.next_steps[r] = req.step + 1;
    }
  }

  void synchronize() override {}

 private:
  // Exact residual of a stochastic draft at draft position j: q = softmax(z / T_d)
  // from the caller's draft logits row, then the Gumbel-max over tokens with
  // p > q of log(p − q) + g (RESIDUAL_NOISE), using the row's kept logits.
  static void stochastic_residual(const LmHeadStorage& head, const VerifyArgs& args, const RequestView& req,
                                  int32_t j, float inv_draft_t, const RowResult& res, const RowPlan& plan,
                                  RowSummary& s) {
    const int64_t vocab = head.vocab;
    const int32_t drafted = args.draft_tokens[req.first_draft + j];
    std::vector<float> q_scaled(static_cast<size_t>(vocab));
    convert_row(row_pointer(*args.draft_logits, req.first_draft + j), args.draft_logits->dtype, vocab,
                q_scaled.data());
    float q_max = kNegInf;
    for (int64_t i = 0; i < vocab; ++i) {
      if (!std::isfinite(q_scaled[size_t(i)]))
        fail(FLASHSPEC_ERR_NON_FINITE, "batch->draft_logits: non-finite value at row " +
                                           std::to_string(req.first_draft + j) + ", column " + std::to_string(i));
      q_scaled[size_t(i)] *= inv_draft_t;
      q_max = std::max(q_max, q_scaled[size_t(i)]);
    }
    double q_sum = 0.0;
    for (int64_t i = 0; i < vocab; ++i) q_sum += std::exp(double(q_scaled[size_t(i)] - q_max));
    const float q_lse = float(double(q_max) + std::log(q_sum));
    s.draft_logq = q_scaled[size_t(drafted)] - q_lse;
    if (plan.greedy) return;  // T = 0: the candidate is the argmax already

    // Residual scores; the bonus-style p-sample stays as the fallback for an
    // empty residual (p ≤ q everywhere), which exact arithmetic never reaches.
    float best = kNegInf, second = kNegInf;
    int32_t best_token = -1;
    for (int64_t i = 0; i < vocab; ++i) {
      float log_p = plan.kept_logits[i] - res.lse;
      float log_q = q_scaled[size_t(i)] - q_lse;
      if (!(log_p > log_q)) continue;
      float log_residual = log_p + std::log1p(-std::exp(log_q - log_p));
      float score = log_residual + gumbel_from_bits(row_word(plan.noise_key, int32_t(i)));
      if (score > best) {
        second = best;
        best = score;
        best_token = int32_t(i);
      } else if (score > second) {
        second = score;
      }
    }
    if (best_token < 0) return;
    s.candidate = best_token;
    s.candidate_gap = (second == kNegInf) ? kPosInf : best - second;
  }

  // One pass over the LM head for all rows: tiles in parallel, partials
  // combined in tile order.
  std::vector<RowResult> scan(const LmHeadStorage& head, const std::vector<float>& hidden,
                              const std::vector<RowPlan>& plans, const ScanArguments& names) {
    const int64_t rows = int64_t(plans.size());
    const int64_t d = head.hidden;
    const int64_t tiles = (head.vocab + kTileTokens - 1) / kTileTokens;
    std::vector<TilePartial> partials(size_t(tiles * rows));
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
      for (int64_t r = 0; r < rows; ++r)
        partials[size_t(tile * rows + r)] = reduce_tile(plans[size_t(r)], logits.data() + r * count, begin, count);
    });
    std::vector<RowResult> results(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r)
      results[size_t(r)] = combine_tiles(plans[size_t(r)], partials.data() + r, tiles, rows, r, names);
    return results;
  }

  ThreadPool pool_;
};

}  // namespace

void* Backend::allocate_staging(size_t bytes) { return ::operator new(bytes); }
void Backend::release_staging(void* data) noexcept { ::operator delete(data); }
void Backend::copy_in(void* dst, const void* host_src, size_t bytes) { std::memcpy(dst, host_src, bytes); }
void Backend::copy_out(void* host_dst, const void* src, size_t bytes) { std::memcpy(host_dst, src, bytes); }

std::unique_ptr<Backend> make_cpu_backend(const BackendConfig& config) {
  return std::make_unique<CpuBackend>(config);
}

}  // namespace flashspec
