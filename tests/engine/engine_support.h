// Shared by the engine tests (and the GPU suite's engine test): a
// synthetic target model (a fixed random LM head, hidden rows a
// deterministic function of the context) with host KV caches (one sequence,
// or a ragged batch) that check the engine's forward/rollback/keep
// protocol and run tree forwards (each row a function of its token's path),
// and exact reference decoders.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "../common/handles.h"
#include "../common/make.h"
#include "../common/rng.h"
#include "flashspec.h"

namespace fstest {

// A synthetic target: W [V, d] and token embeddings E [V, d] with N(0, 1)
// entries scaled by `scale`; the hidden row after a context is
//   h = E[t−1] + 0.6 E[t−2] + 0.3 E[t−3] + 0.1 · length · u
// (u a fixed vector), so the text tends to settle into cycles a prompt
// lookup can draft, while still depending on the whole context.
class SyntheticModel {
 public:
  SyntheticModel(int32_t vocab, int32_t hidden, uint64_t seed, float scale)
      : vocab_(vocab), hidden_(hidden), weight_(size_t(vocab) * size_t(hidden)), embed_(weight_.size()),
        drift_(size_t(hidden)) {
    Rng rng(seed);
    for (float& w : weight_) w = float(rng.normal()) * scale;
    for (float& e : embed_) e = float(rng.normal());
    for (float& u : drift_) u = float(rng.normal()) * 0.1f;
  }

  // A target whose greedy next token is rule(context): W = 4·I (V = d) and
  // the hidden row is the one-hot of rule(context), so the test writes the
  // text the target wants.
  using Rule = std::function<int32_t(const int32_t* context, int32_t length)>;
  SyntheticModel(int32_t vocab, Rule rule)
      : vocab_(vocab), hidden_(vocab), weight_(size_t(vocab) * size_t(vocab), 0.0f), rule_(std::move(rule)) {
    for (int32_t v = 0; v < vocab; ++v) weight_[size_t(v) * size_t(vocab) + size_t(v)] = 4.0f;
  }
  int32_t vocab() const { return vocab_; }
  int32_t hidden() const { return hidden_; }
  const std::vector<float>& weight() const { return weight_; }

  void hidden_row(const int32_t* context, int32_t length, float* out) const {
    if (rule_) {
      for (int32_t c = 0; c < hidden_; ++c) out[c] = 0.0f;
      out[rule_(context, length)] = 1.0f;
      return;
    }
    static const float kDecay[3] = {1.0f, 0.6f, 0.3f};
    for (int32_t c = 0; c < hidden_; ++c) out[c] = drift_[size_t(c)] * float(length % 7);
    for (int32_t back = 0; back < 3 && back < length; ++back) {
      const float* e = embed_.data() + size_t(context[length - 1 - back]) * size_t(hidden_);
      for (int32_t c = 0; c < hidden_; ++c) out[c] += kDecay[back] * e[c];
    }
  }

  // Exact target probabilities at temperature t > 0, in double.
  std::vector<double> probabilities(const int32_t* context, int32_t length, double t) const {
    std::vector<float> h(size_t(hidden_), 0.0f);
    hidden_row(context, length, h.data());
    std::vector<double> p(static_cast<size_t>(vocab_));
    double max_l = -1e300;
    for (int32_t v = 0; v < vocab_; ++v) {
      double l = 0.0;
      for (int32_t c = 0; c < hidden_; ++c) l += double(h[size_t(c)]) * double(weight_[size_t(v) * size_t(hidden_) + size_t(c)]);
      p[size_t(v)] = l / t;
      max_l = std::max(max_l, p[size_t(v)]);
    }
    double sum = 0.0;
    for (double& x : p) sum += (x = std::exp(x - max_l));
    for (double& x : p) x /= sum;
    return p;
  }

  // W as an LM head on ctx (copied from host memory).
  HeadPtr make_head(flashspec_context* ctx) const {
    return fstest::make_head(ctx, flashspec_tensor_make(weight_.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST,
                                                        vocab_, hidden_));
  }

 private:
  int32_t vocab_, hidden_;
  std::vector<float> weight_, embed_, drift_;
  Rule rule_;
};

// The context that row of token t of a forward scores: the cache's first
// num_past tokens, then the call's tokens on the path to t (token t's
// predecessor: parents[t] when parents is set and parents[t] ≥ 0, else
// t − 1), t included. A tree forward's rows so depend on each node's
// ancestors, never on its place among the call's tokens.
inline std::vector<int32_t> path_context(const int32_t* cache, int32_t num_past, const int32_t* tokens,
                                         const int32_t* parents, int32_t t) {
  std::vector<int32_t> path;
  for (int32_t i = t; i >= 0; i = parents && parents[i] >= 0 ? parents[i] : i - 1) path.push_back(tokens[i]);
  std::vector<int32_t> context(cache, cache + num_past);
  context.insert(context.end(), path.rbegin(), path.rend());
  return context;
}

// Checks a forward's parents (flashspec.h, Tree steps): −1 for the tokens
// before the root's children, a node's parent at or after the root and
// before the node. Returns "" or what is wrong.
inline std::string check_parents(const int32_t* parents, int32_t num_tokens, int32_t num_rows) {
  if (!parents) return "";
  const int32_t root = num_tokens - num_rows;
  for (int32_t t = 0; t < num_tokens; ++t) {
    const int32_t p = parents[t];
    if (t <= root ? p != -1 : (p != -1 && (p < root || p >= t))) return "parents[" + std::to_string(t) + "] = " + std::to_string(p);
  }
  return "";
}

// A keep callback's protocol (flashspec.h, Tree steps) on one cache whose
// last forward started at num_past with num_tokens tokens: applies it.
inline std::string apply_keep(std::vector<int32_t>& cache, int32_t last_past, int32_t last_tokens, int32_t num_past,
                              const int32_t* keep, int32_t num_keep) {
  if (num_past != last_past) return "keep: num_past is not the forward's";
  if (size_t(num_past) + size_t(last_tokens) != cache.size()) return "keep: not after a forward";
  std::vector<int32_t> kept(cache.begin(), cache.begin() + num_past);
  for (int32_t i = 0; i < num_keep; ++i) {
    if (keep[i] < 0 || keep[i] >= last_tokens || (i > 0 && keep[i] <= keep[i - 1])) return "keep: bad index";
    kept.push_back(cache[size_t(num_past + keep[i])]);
  }
  cache = kept;
  return "";
}

// The host side of the target: a KV cache of tokens; hidden rows from the
// model. Checks the engine's protocol on every call.
struct TargetHost {
  const SyntheticModel* model = nullptr;
  std::vector<int32_t> cache;
  std::vector<float> rows;
  bool rollback_enabled = true;  // engine told to call rollback
  int forwards = 0;
  int rollbacks = 0;
  int keeps = 0;
  int tree_forwards = 0;         // forwards with parents
  int refeeds = 0;               // forwards after the first that sent more than the root again
  std::vector<int32_t> forward_rows;  // num_rows of each forward
  int32_t last_past = 0, last_tokens = 0;
  int keep_fail_at = -1;
  std::string protocol_error;    // first violation seen
  // Fault injection: at forward call number fail_at (0-based), do `fault`.
  enum class Fault { kNone, kReturnError, kThrow, kWrongRows, kWrongCols, kNullData, kNaN, kWrongMemory };
  Fault fault = Fault::kNone;
  int fail_at = -1;
  int rollback_fail_at = -1;

  void note(const std::string& what) {
    if (protocol_error.empty()) protocol_error = what;
  }

  static int forward(void* user_data, flashspec_target_call* call) {
    auto* self = static_cast<TargetHost*>(user_data);
    return self->do_forward(call);
  }
  static int rollback(void* user_data, int32_t keep) {
    auto* self = static_cast<TargetHost*>(user_data);
    if (self->rollbacks++ == self->rollback_fail_at) return 7;
    if (keep < 0 || size_t(keep) > self->cache.size()) self->note("rollback past the cache");
    self->cache.resize(size_t(std::max(0, keep)));
    return 0;
  }
  static int keep(void* user_data, int32_t num_past, const int32_t* keep, int32_t num_keep) {
    auto* self = static_cast<TargetHost*>(user_data);
    if (self->keeps++ == self->keep_fail_at) return 7;
    const std::string error = apply_keep(self->cache, self->last_past, self->last_tokens, num_past, keep, num_keep);
    if (!error.empty()) self->note(error);
    return 0;
  }

  int do_forward(flashspec_target_call* call) {
    const int index = forwards++;
    if (call->struct_size != sizeof(flashspec_target_call)) note("struct_size");
    if (call->num_tokens < 1 || call->num_rows < 1 || call->num_rows > call->num_tokens) note("sizes");
    if (call->num_past < 0 || size_t(call->num_past) > cache.size()) note("num_past beyond the cache");
    if (rollback_enabled && call->num_past != 0 && size_t(call->num_past) != cache.size()) note("cache not rolled back to num_past");
    for (int32_t t = 0; t < call->num_tokens; ++t)
      if (call->tokens[t] < 0 || call->tokens[t] >= model->vocab()) note("a token outside the vocabulary");
    cache.resize(size_t(std::min<int64_t>(call->num_past, int64_t(cache.size()))));
    const std::string parents_error = check_parents(call->parents, call->num_tokens, call->num_rows);
    if (!parents_error.empty()) note(parents_error);
    if (call->parents) tree_forwards++;
    forward_rows.push_back(call->num_rows);
    if (call->num_past > 0 && call->num_tokens - call->num_rows > 0) refeeds++;
    last_past = int32_t(cache.size());
    last_tokens = call->num_tokens;
    const int32_t d = model->hidden();
    rows.assign(size_t(call->num_rows) * size_t(d), 0.0f);
    for (int32_t r = 0; r < call->num_rows; ++r) {
      const std::vector<int32_t> context = path_context(cache.data(), int32_t(cache.size()), call->tokens,
                                                        call->parents, call->num_tokens - call->num_rows + r);
      model->hidden_row(context.data(), int32_t(context.size()), rows.data() + size_t(r) * size_t(d));
    }
    cache.insert(cache.end(), call->tokens, call->tokens + call->num_tokens);
    call->hidden = flashspec_tensor_make(rows.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, call->num_rows, d);
    if (index == fail_at) {
      switch (fault) {
        case Fault::kReturnError: return 42;
        case Fault::kThrow: throw std::runtime_error("host model failed");
        case Fault::kWrongRows: call->hidden.rows += 1; break;
        case Fault::kWrongCols: call->hidden.cols -= 1; call->hidden.row_stride = call->hidden.cols; break;
        case Fault::kNullData: call->hidden.data = nullptr; break;
        case Fault::kNaN: rows[0] = std::nanf(""); break;
        case Fault::kWrongMemory: call->hidden.memory = FLASHSPEC_MEMORY_CUDA; break;
        case Fault::kNone: break;
      }
    }
    return 0;
  }
};

struct BatchEngineDeleter {
  void operator()(flashspec_batch_engine* e) const { flashspec_batch_engine_destroy(e); }
};
using BatchEnginePtr = std::unique_ptr<flashspec_batch_engine, BatchEngineDeleter>;

// The host side of a batched target: one KV cache of tokens per sequence
// id, hidden rows from the model (tree forwards too). Checks the ragged
// forward's protocol.
struct BatchTargetHost {
  const SyntheticModel* model = nullptr;
  std::map<uint64_t, std::vector<int32_t>> caches;
  std::map<uint64_t, std::pair<int32_t, int32_t>> last_forward;  // num_past, num_tokens
  std::vector<float> rows;
  std::string protocol_error;
  int forwards = 0;
  int tree_forwards = 0;               // forwards with parents
  int keeps = 0;
  int fail_forward_at = -1;            // forward call index that returns an error
  uint64_t fail_rollback_of = ~0ull;   // sequence whose rollbacks fail
  uint64_t fail_keep_of = ~0ull;       // sequence whose keeps fail
  std::vector<int32_t> batch_sizes;    // sequences per forward

  void note(const std::string& what) {
    if (protocol_error.empty()) protocol_error = what;
  }

  static int forward(void* user_data, flashspec_batch_target_call* call) {
    auto* self = static_cast<BatchTargetHost*>(user_data);
    if (self->forwards++ == self->fail_forward_at) return 9;
    if (call->struct_size != sizeof(flashspec_batch_target_call)) self->note("struct_size");
    if (call->token_offsets[0] != 0 || call->row_offsets[0] != 0) self->note("offsets start at 0");
    if (call->parents) self->tree_forwards++;
    self->batch_sizes.push_back(call->num_sequences);
    const int32_t d = self->model->hidden();
    self->rows.assign(size_t(call->num_rows) * size_t(d), 0.0f);
    for (int32_t s = 0; s < call->num_sequences; ++s) {
      std::vector<int32_t>& cache = self->caches[call->sequence_ids[s]];
      const int32_t past = call->num_past[s];
      if (past < 0 || size_t(past) > cache.size()) self->note("num_past beyond the cache");
      cache.resize(size_t(std::min<int64_t>(past, int64_t(cache.size()))));
      const int32_t* tokens = call->tokens + call->token_offsets[s];
      const int32_t* parents = call->parents ? call->parents + call->token_offsets[s] : nullptr;
      const int32_t n = call->token_offsets[s + 1] - call->token_offsets[s];
      const int32_t num_rows = call->row_offsets[s + 1] - call->row_offsets[s];
      if (num_rows < 1 || num_rows > n) self->note("rows of a sequence");
      const std::string parents_error = check_parents(parents, n, num_rows);
      if (!parents_error.empty()) self->note(parents_error);
      self->last_forward[call->sequence_ids[s]] = {int32_t(cache.size()), n};
      for (int32_t r = 0; r < num_rows; ++r) {
        const std::vector<int32_t> context =
            path_context(cache.data(), int32_t(cache.size()), tokens, parents, n - num_rows + r);
        self->model->hidden_row(context.data(), int32_t(context.size()),
                                self->rows.data() + size_t(call->row_offsets[s] + r) * size_t(d));
      }
      cache.insert(cache.end(), tokens, tokens + n);
    }
    call->hidden = flashspec_tensor_make(self->rows.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST,
                                         call->num_rows, d);
    return 0;
  }

  static int rollback(void* user_data, uint64_t id, int32_t keep) {
    auto* self = static_cast<BatchTargetHost*>(user_data);
    if (id == self->fail_rollback_of) return 3;
    std::vector<int32_t>& cache = self->caches[id];
    if (keep < 0 || size_t(keep) > cache.size()) self->note("rollback past the cache");
    cache.resize(size_t(std::max(0, keep)));
    return 0;
  }

  static int keep(void* user_data, uint64_t id, int32_t num_past, const int32_t* keep, int32_t num_keep) {
    auto* self = static_cast<BatchTargetHost*>(user_data);
    self->keeps++;
    if (id == self->fail_keep_of) return 5;
    const std::pair<int32_t, int32_t> last = self->last_forward[id];
    const std::string error = apply_keep(self->caches[id], last.first, last.second, num_past, keep, num_keep);
    if (!error.empty()) self->note(error);
    return 0;
  }
};

// Plain greedy decoding with the same LM head: flashspec_draft at T = 0 on
// the hidden row of the context.
inline std::vector<int32_t> greedy_reference(flashspec_context* ctx, const flashspec_lm_head* head,
                                             const SyntheticModel& model, std::vector<int32_t> context,
                                             int32_t count) {
  std::vector<int32_t> out;
  std::vector<float> h(size_t(model.hidden()));
  for (int32_t i = 0; i < count; ++i) {
    model.hidden_row(context.data(), int32_t(context.size()), h.data());
    flashspec_tensor view = flashspec_tensor_make(h.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, 1, model.hidden());
    int32_t token = -1;
    EXPECT_EQ(flashspec_draft(ctx, head, &view, nullptr, &token, nullptr), FLASHSPEC_OK)
        << flashspec_context_last_error(ctx);
    out.push_back(token);
    context.push_back(token);
  }
  return out;
}

// Upper tail of the chi-square distribution: Q(k/2, x/2).
inline double chi_square_sf(double x, double dof) {
  const double a = dof / 2.0, z = x / 2.0;
  if (z <= 0.0) return 1.0;
  const double log_prefix = a * std::log(z) - z - std::lgamma(a);
  if (z < a + 1.0) {  // series for P
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 10000; ++n) {
      term *= z / (a + n);
      sum += term;
      if (term < sum * 1e-15) break;
    }
    return 1.0 - sum * std::exp(log_prefix);
  }
  // Continued fraction for Q (Lentz).
  double b = z + 1.0 - a, c = 1e300, d = 1.0 / b, h = d;
  for (int i = 1; i < 10000; ++i) {
    const double an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    if (std::fabs(d) < 1e-300) d = 1e-300;
    c = b + an / c;
    if (std::fabs(c) < 1e-300) c = 1e-300;
    d = 1.0 / d;
    const double delta = d * c;
    h *= delta;
    if (std::fabs(delta - 1.0) < 1e-15) break;
  }
  return std::exp(log_prefix) * h;
}

// Pearson chi-square of observed counts against expected probabilities;
// cells with expected count < 5 are pooled into one. Returns the p-value.
inline double chi_square_p_value(const std::vector<double>& counts, const std::vector<double>& probs) {
  double total = 0.0;
  for (double c : counts) total += c;
  double stat = 0.0, pooled_obs = 0.0, pooled_exp = 0.0;
  int cells = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double expected = probs[i] * total;
    if (expected < 5.0) {
      pooled_obs += counts[i];
      pooled_exp += expected;
      continue;
    }
    stat += (counts[i] - expected) * (counts[i] - expected) / expected;
    ++cells;
  }
  if (pooled_exp > 0.0) {
    stat += (pooled_obs - pooled_exp) * (pooled_obs - pooled_exp) / std::max(pooled_exp, 1e-12);
    ++cells;
  }
  return chi_square_sf(stat, double(cells - 1));
}

}  // namespace fstest
