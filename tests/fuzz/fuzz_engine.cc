// Fuzzes the engine: drafters (n-gram and TOKENS / LOGITS / HIDDEN / TREE
// callback drafters), engine creation with fuzzed params, and generations with fuzzed
// prompts and params, on a synthetic target model whose callbacks follow a
// fault schedule read from the input (failing returns, exceptions, bad
// views, non-finite values, cancellation, nested calls).
//
// Invariants:
//   - creation calls: the status the planted argument calls for, *out
//     untouched on error, a message;
//   - the callback protocol: struct sizes, tokens in range, the first
//     forward with num_past = 0, a tree step's parents (−1 before the
//     root's children, a node's parent at or after the root and before it;
//     each row computed from its token's path), a keep after a tree step
//     naming increasing indices of the last forward's tokens, the cache
//     rolled back to num_past, the
//     cache equal to the prompt, the streamed tokens and the drafts, never
//     more than max_context tokens; the draft call's context equal to the
//     sequence so far; max_tokens ≥ 1;
//   - generate: errors before generation leave tokens_out and the result
//     untouched and call no callback; otherwise the status is that of the
//     first failing callback (CALLBACK, NON_FINITE, CANCELLED), or OK;
//     tokens_out[0 .. num_tokens) equals the streamed tokens and nothing is
//     written past it; the finish reason agrees with the tokens; nested
//     generate and reset_metrics from a callback fail with INVALID_ARGUMENT;
//   - at T = 0 the tokens are the target's greedy tokens (flashspec_draft on
//     the same hidden rows), whatever the drafters proposed;
//   - metrics: steps and emitted tokens equal the sums of the results since
//     the last reset; accepted ≤ drafted; per-position counts non-increasing;
//   - the whole run replayed on another context with another thread count
//     gives the same statuses, results and tokens.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "expect.h"
#include "fuzz_common.h"
#include "values.h"

using namespace fsfuzz;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int32_t kMaxGenerations = 3;

// ---------------------------------------------------------------------------
// The script: everything read from the input, so a run can be replayed.
// ---------------------------------------------------------------------------
enum class Where : uint8_t { kForward, kRollback, kDraft, kToken, kCount };

struct Fault {
  Where where;
  int32_t index;  // the callback's call number within the generation
  uint8_t kind;
};

enum DrafterKind : uint8_t { kNgram, kTokens, kLogits, kHidden, kTree, kDrafterKinds };

struct DrafterSpec {
  DrafterKind kind = kNgram;
  int32_t min_n = 1, max_n = 4;
  uint8_t mode = 0;          // callback drafters: what they propose (TREE: and its shape)
  float draft_temperature = 1.0f;
  int32_t logits_dtype = FLASHSPEC_DTYPE_F32;
  bool own_head = false;     // HIDDEN: a second head rather than the target's
  bool all_rows = false;     // HIDDEN: all rows in one call
  double call_cost = 0.0, token_cost = 0.0;
};

struct GenerationSpec {
  std::vector<int32_t> prompt;
  float temperature = 0.0f;
  uint64_t seed = 0, request_id = 0;
  int32_t max_tokens = 1;
  std::vector<int32_t> stop_tokens;
  bool on_token = true;
  int32_t capacity_extra = 0;
  bool null_tokens_out = false;
  uint8_t plant = 0;  // 0: none; else a generate argument made invalid
  std::vector<Fault> faults;
  bool reset_metrics_after = false;
};

struct Script {
  uint64_t ctx_seed = 0;
  int32_t threads = 1, max_rows = 8;
  int64_t vocab = 2, d = 1;
  MatrixSpec w_spec;
  uint64_t model_seed = 0;
  int32_t hidden_dtype = FLASHSPEC_DTYPE_F32;
  std::vector<DrafterSpec> drafters;
  bool explicit_arms = false;
  std::vector<flashspec_arm> arms;
  int32_t default_draft_len = 4;
  int32_t policy = FLASHSPEC_BANDIT_UCB1;
  int32_t fixed_arm = 0;
  std::vector<double> oracle;
  uint64_t bandit_seed = 0;
  int32_t max_context = 0;
  bool with_rollback = true;
  bool with_keep = false;    // the keep callback of tree steps
  uint8_t create_plant = 0;  // 0: none
  std::vector<GenerationSpec> generations;
};

Script read_script(Input& in) {
  Script s;
  s.ctx_seed = in.u64();
  s.threads = int32_t(in.range(0, 2));
  s.max_rows = int32_t(in.range(2, 12));
  s.vocab = in.range(2, 40);
  s.d = in.range(1, 8);
  s.w_spec = read_matrix_spec(in, false);
  // The heads sit at an address aligned to their dtype (a misaligned head
  // is refused at creation: fuzz_api, fuzz_draft).
  s.w_spec.offset -= s.w_spec.offset % dtype_bytes(s.w_spec.dtype);
  s.model_seed = in.u64();
  s.hidden_dtype = int32_t(in.u8() % 3);
  const int32_t drafters = int32_t(in.u8() % 4);
  for (int32_t i = 0; i < drafters; ++i) {
    DrafterSpec d;
    d.kind = DrafterKind(in.u8() % kDrafterKinds);
    d.min_n = int32_t(in.range(1, 4));
    d.max_n = d.min_n + int32_t(in.u8() % 3);
    d.mode = in.u8();
    const uint8_t td = in.u8();
    d.draft_temperature = td == 0 ? 1.0f : (td < 128 ? 0.25f + float(td) / 64.0f : 0.5f);
    d.logits_dtype = int32_t(in.u8() % 3);
    d.own_head = in.u8() & 1;
    d.all_rows = in.u8() & 1;
    const uint8_t cost = in.u8();
    d.call_cost = cost & 1 ? 0.25 : 0.0;
    d.token_cost = cost & 2 ? 0.05 : 0.0;
    s.drafters.push_back(d);
  }
  s.explicit_arms = in.u8() & 1;
  const int32_t arms = int32_t(1 + in.u8() % 4);
  for (int32_t a = 0; a < arms; ++a) {
    flashspec_arm arm;
    arm.drafter = drafters > 0 ? int32_t(in.u8() % drafters) : 0;
    arm.draft_len = int32_t(in.u8() % 6);
    if (drafters == 0) arm.draft_len = 0;
    arm.draft_len = std::min(arm.draft_len, s.max_rows - 1);
    s.arms.push_back(arm);
  }
  s.default_draft_len = std::min(int32_t(in.u8() % 6), s.max_rows - 1);
  s.policy = int32_t(in.u8() % 4);
  s.fixed_arm = 0;
  s.bandit_seed = in.u64();
  for (int32_t a = 0; a < 4; ++a) s.oracle.push_back(double(in.u8()) / 16.0);
  const uint8_t mc = in.u8();
  s.max_context = mc < 160 ? 0 : int32_t(mc % 40);
  const uint8_t cache_fix = in.u8();
  s.with_rollback = !(cache_fix & 1);
  s.with_keep = (cache_fix & 2) != 0;
  s.create_plant = in.u8() < 224 ? 0 : uint8_t(1 + in.u8() % 24);
  const int32_t gens = int32_t(1 + in.u8() % kMaxGenerations);
  for (int32_t g = 0; g < gens; ++g) {
    GenerationSpec gs;
    const int32_t len = int32_t(in.range(1, 10));
    Rng rng(in.u64());
    const uint8_t pm = in.u8();
    for (int32_t i = 0; i < len; ++i)
      gs.prompt.push_back(pm < 128 ? int32_t(rng.below(s.vocab)) : int32_t((i % 3) % s.vocab));  // or a cycle
    gs.temperature = read_temperature(in, 0.0f);
    if (std::isfinite(gs.temperature) && gs.temperature > 0 && gs.temperature < 0.05f) gs.temperature = 0.05f;
    gs.seed = in.u64();
    gs.request_id = in.u64();
    gs.max_tokens = int32_t(in.range(1, 24));
    const int32_t stops = int32_t(in.u8() % 3);
    for (int32_t i = 0; i < stops; ++i) gs.stop_tokens.push_back(int32_t(in.u8() % s.vocab));
    const uint8_t flags = in.u8();
    gs.on_token = (flags & 7) != 7;
    gs.capacity_extra = (flags >> 3) & 3;
    gs.null_tokens_out = (flags & 0xE0) == 0xE0;
    gs.reset_metrics_after = in.u8() >= 200;
    gs.plant = in.u8() < 232 ? 0 : uint8_t(1 + in.u8() % 14);
    const int32_t faults = int32_t(in.u8() % 4);
    for (int32_t f = 0; f < faults; ++f) {
      Fault fault;
      fault.where = Where(in.u8() % uint8_t(Where::kCount));
      fault.index = int32_t(in.u8() % 24);
      fault.kind = in.u8();
      gs.faults.push_back(fault);
    }
    s.generations.push_back(gs);
  }
  return s;
}

// ---------------------------------------------------------------------------
// The synthetic target model: hidden(prefix) from token embeddings.
// ---------------------------------------------------------------------------
struct Model {
  int64_t vocab = 0, d = 0;
  HostMatrix w;
  std::vector<float> embed, drift;
  void init(const Script& s) {
    vocab = s.vocab;
    d = s.d;
    build(w, s.w_spec, vocab, d);
    Rng rng(s.model_seed);
    embed.resize(size_t(vocab * d));
    drift.resize(size_t(d));
    for (float& e : embed) e = float(rng.normal());
    for (float& u : drift) u = float(rng.normal()) * 0.1f;
  }
  void hidden(const int32_t* prefix, int64_t length, float* out) const {
    static const float kDecay[3] = {1.0f, 0.6f, 0.3f};
    for (int64_t c = 0; c < d; ++c) out[c] = drift[size_t(c)] * float(length % 7);
    for (int64_t back = 0; back < 3 && back < length; ++back) {
      const int32_t t = prefix[length - 1 - back];
      for (int64_t c = 0; c < d; ++c) out[c] += kDecay[back] * embed[size_t(t * d + c)];
    }
  }
};

// What one generation did, for the replay comparison.
struct GenerationTrace {
  flashspec_status status = FLASHSPEC_OK;
  flashspec_generate_result result{};
  std::vector<int32_t> tokens;
};

struct Trace {
  flashspec_status create_status = FLASHSPEC_OK;
  std::vector<GenerationTrace> generations;
};

class Run;

struct CallbackDrafter {
  Run* run = nullptr;
  int32_t index = 0;
  DrafterSpec spec;
  std::vector<int32_t> tokens_scratch;
  HostMatrix view;  // logits or hidden rows handed back
};

// ---------------------------------------------------------------------------
// One run of the script on a fresh context.
// ---------------------------------------------------------------------------
class Run {
 public:
  Run(const Script& script, const Model& model, int32_t threads) : s_(script), model_(model) {
    ctx_.p = make_context(s_.ctx_seed, threads, s_.max_rows, 4);
    ref_.p = make_context(s_.ctx_seed, 1, 4, 4);
    head_.p = make_head(ctx_.p, model_.w);
    ref_head_.p = make_head(ref_.p, model_.w);
    // A second head with the target's vocabulary for HIDDEN drafters.
    HostMatrix w2;
    MatrixSpec spec2 = s_.w_spec;
    spec2.seed ^= 0x5bd1e995u;
    spec2.duplicate_rows = false;
    spec2.mode = ValueMode::kNormal;
    build(w2, spec2, model_.vocab, model_.d);
    second_head_.p = make_head(ctx_.p, w2);
  }
  ~Run() {
    flashspec_engine_destroy(engine_);
    for (flashspec_drafter* d : drafters_) flashspec_drafter_destroy(d);
  }

  Trace go() {
    Trace trace;
    if (!create()) {
      trace.create_status = create_status_;
      return trace;
    }
    for (size_t g = 0; g < s_.generations.size(); ++g) trace.generations.push_back(generate(int32_t(g)));
    return trace;
  }

  // ---- callbacks ---------------------------------------------------------
  static int forward(void* user, flashspec_target_call* call) { return static_cast<Run*>(user)->on_forward(call); }
  static int rollback(void* user, int32_t keep) { return static_cast<Run*>(user)->on_rollback(keep); }
  static int keep(void* user, int32_t num_past, const int32_t* keep, int32_t num_keep) {
    return static_cast<Run*>(user)->on_keep(num_past, keep, num_keep);
  }
  static int draft(void* user, flashspec_draft_call* call) {
    auto* cd = static_cast<CallbackDrafter*>(user);
    return cd->run->on_draft(*cd, call);
  }
  static int token(void* user, int32_t t) { return static_cast<Run*>(user)->on_token(t); }

 private:
  // The fault scheduled for this call, if any (the first one listed).
  const Fault* fault_for(Where where, int32_t index) const {
    for (const Fault& f : gen_->faults)
      if (f.where == where && f.index == index) return &f;
    return nullptr;
  }
  // A fault that ends the generation with `status` fired now.
  void fatal(flashspec_status status, const std::string& what) {
    if (fatal_status_ == FLASHSPEC_OK) {
      fatal_status_ = status;
      fatal_what_ = what;
    }
  }
  // A fault in values the engine reads only when it verifies the step (after
  // the target forward): non-finite target rows (rank 0, read first), then
  // draft logits (rank 1).
  void at_verify(flashspec_status status, const std::string& what, int rank) {
    if (pending_status_ == FLASHSPEC_OK || rank < pending_rank_) {
      pending_status_ = status;
      pending_what_ = what;
      pending_rank_ = rank;
    }
  }
  // The step got past its verify (or the generation ended).
  void verified() {
    if (pending_status_ != FLASHSPEC_OK) fatal(pending_status_, pending_what_);
    pending_status_ = FLASHSPEC_OK;
  }
  [[noreturn]] void host_throw() { throw std::runtime_error("host callback failed"); }

  int on_forward(flashspec_target_call* call) {
    const int32_t index = forwards_++;
    ++callbacks_;
    FS_CHECK(!after_end_, "target forward called after the generation ended (%s)", fatal_what_.c_str());
    FS_CHECK(call->struct_size == sizeof(flashspec_target_call), "target call struct_size %u", call->struct_size);
    FS_CHECK(call->num_tokens >= 1 && call->num_rows >= 1 && call->num_rows <= call->num_tokens,
             "target call: %d tokens, %d rows", call->num_tokens, call->num_rows);
    FS_CHECK(call->num_past >= 0 && size_t(call->num_past) <= cache_.size(),
             "target call: num_past %d beyond the cache of %zu tokens", call->num_past, cache_.size());
    if (index == 0) FS_CHECK(call->num_past == 0, "the first target forward has num_past %d, not 0", call->num_past);
    if (s_.with_rollback && !rollback_failed_)
      FS_CHECK(size_t(call->num_past) == cache_.size(), "target call: num_past %d but rollback left %zu tokens",
               call->num_past, cache_.size());
    FS_CHECK(call->step == step_ || call->step == step_ + 1 || index == 0, "target call step %llu after step %llu",
             (unsigned long long)call->step, (unsigned long long)step_);
    step_ = call->step;
    for (int32_t i = 0; i < call->num_tokens; ++i)
      FS_CHECK(call->tokens[i] >= 0 && call->tokens[i] < model_.vocab, "target call token %d is %d", i,
               call->tokens[i]);
    // A tree step's parents: −1 up to the root, then a node's parent at or
    // after the root and before the node (flashspec.h, Tree steps).
    const int32_t root = call->num_tokens - call->num_rows;
    if (call->parents) {
      for (int32_t t = 0; t < call->num_tokens; ++t) {
        const int32_t parent = call->parents[t];
        FS_CHECK(t <= root ? parent == -1 : (parent == -1 || (parent >= root && parent < t)),
                 "target call: parents[%d] is %d (root at %d)", t, parent, root);
      }
    }
    cache_.resize(size_t(call->num_past));
    cache_.insert(cache_.end(), call->tokens, call->tokens + call->num_tokens);
    last_past_ = call->num_past;
    last_tokens_ = call->num_tokens;
    if (s_.max_context > 0)
      FS_CHECK(int64_t(cache_.size()) <= s_.max_context, "the target cache holds %zu tokens, max_context is %d",
               cache_.size(), s_.max_context);
    // The cache is the sequence so far, then the drafts of this step.
    if (gen_->on_token) {
      const size_t known = prompt_.size() + streamed_.size();
      FS_CHECK(cache_.size() - size_t(call->num_rows - 1) == known,
               "target call: the cache holds %zu tokens and %d rows are asked for, but the sequence has %zu",
               cache_.size(), call->num_rows, known);
      for (size_t i = 0; i < known; ++i)
        FS_CHECK(cache_[i] == (i < prompt_.size() ? prompt_[i] : streamed_[i - prompt_.size()]),
                 "target cache token %zu is %d, the sequence has %d", i, cache_[i],
                 i < prompt_.size() ? prompt_[i] : streamed_[i - prompt_.size()]);
    }
    // The rows.
    const int64_t d = model_.d;
    const Fault* f = fault_for(Where::kForward, index);
    const uint8_t kind = f ? f->kind % 14 : 255;
    const size_t offset = kind == 12 ? 1 + f->kind % 3 : 0;
    rows_.init(s_.hidden_dtype, call->num_rows, d, kind == 13 ? 3 : 0, offset);
    std::vector<float> h(static_cast<size_t>(d));
    for (int32_t r = 0; r < call->num_rows; ++r) {
      // Row r scores the path to token root + r: the cache before the call,
      // then the call's tokens along the parents (a chain: all before it).
      std::vector<int32_t> path;
      for (int32_t t = root + r; t >= 0; t = call->parents && call->parents[t] >= 0 ? call->parents[t] : t - 1)
        path.push_back(call->tokens[t]);
      std::vector<int32_t> context(cache_.begin(), cache_.begin() + call->num_past);
      context.insert(context.end(), path.rbegin(), path.rend());
      model_.hidden(context.data(), int64_t(context.size()), h.data());
      for (int64_t c = 0; c < d; ++c) rows_.set(r, c, h[size_t(c)]);
    }
    call->hidden = rows_.view();
    // 12: rows at an odd (or, for fp32, a 2 mod 4) address: a view the
    // engine refuses like any bad view (CALLBACK).
    if (kind == 12 && rows_.misaligned()) fatal(FLASHSPEC_ERR_CALLBACK, "target forward: misaligned rows");
    switch (kind) {
      case 0: fatal(FLASHSPEC_ERR_CALLBACK, "target forward returned 1"); return 1;
      case 1: fatal(FLASHSPEC_ERR_CALLBACK, "target forward threw"); host_throw();
      case 2: call->hidden.rows += 1; fatal(FLASHSPEC_ERR_CALLBACK, "target forward: one row too many"); break;
      case 3:
        call->hidden.cols = d > 1 ? d - 1 : d + 1;
        call->hidden.row_stride = std::max(call->hidden.row_stride, call->hidden.cols);
        fatal(FLASHSPEC_ERR_CALLBACK, "target forward: wrong cols");
        break;
      case 4: call->hidden.data = nullptr; fatal(FLASHSPEC_ERR_CALLBACK, "target forward: data NULL"); break;
      case 5:
        rows_.set(int64_t(f->kind / 16) % call->num_rows, 0, kNaN);
        at_verify(FLASHSPEC_ERR_NON_FINITE, "target forward: a NaN row", 0);
        break;
      case 6: call->hidden.memory = FLASHSPEC_MEMORY_CUDA; fatal(FLASHSPEC_ERR_CALLBACK, "target forward: device memory"); break;
      case 7: set_raw(call->hidden.memory, -1); fatal(FLASHSPEC_ERR_CALLBACK, "target forward: memory -1"); break;
      case 8: set_raw(call->hidden.dtype, -1); fatal(FLASHSPEC_ERR_CALLBACK, "target forward: dtype -1"); break;
      case 9: set_raw(call->hidden.dtype, 3); fatal(FLASHSPEC_ERR_CALLBACK, "target forward: dtype 3"); break;
      case 10:
        if (d > 1) {
          call->hidden.row_stride = d - 1;
          fatal(FLASHSPEC_ERR_CALLBACK, "target forward: row_stride < cols");
        }
        break;
      case 11: rows_.set(0, d - 1, INFINITY); at_verify(FLASHSPEC_ERR_NON_FINITE, "target forward: an Inf row", 0); break;
      default: break;  // 12: rows at an offset (above), 13: padded rows (valid)
    }
    return 0;
  }

  int on_rollback(int32_t keep) {
    const int32_t index = rollbacks_++;
    ++callbacks_;
    verified();
    FS_CHECK(keep >= 0 && size_t(keep) <= cache_.size(), "rollback to %d tokens of a cache of %zu", keep, cache_.size());
    if (gen_->on_token)
      FS_CHECK(size_t(keep) >= prompt_.size() + streamed_.size(), "rollback to %d drops the sequence's %zu tokens",
               keep, prompt_.size() + streamed_.size());
    const Fault* f = fault_for(Where::kRollback, index);
    if (f) {
      rollback_failed_ = true;
      if (f->kind & 1) {
        fatal(FLASHSPEC_ERR_CALLBACK, "target rollback threw");
        host_throw();
      }
      fatal(FLASHSPEC_ERR_CALLBACK, "target rollback returned 1");
      return 1;
    }
    cache_.resize(size_t(keep));
    return 0;
  }

  // A keep after a tree step (scheduled faults: those of the rollbacks, the
  // two counted together).
  int on_keep(int32_t num_past, const int32_t* keep, int32_t num_keep) {
    const int32_t index = rollbacks_++;
    ++callbacks_;
    verified();
    FS_CHECK(s_.with_keep, "keep called without a keep callback");
    FS_CHECK(num_past == last_past_ && size_t(last_past_) + size_t(last_tokens_) == cache_.size(),
             "keep(num_past %d) after a forward from %d of %d tokens, cache of %zu", num_past, last_past_,
             last_tokens_, cache_.size());
    FS_CHECK(num_keep >= 0 && num_keep < last_tokens_, "keep of %d tokens of %d", num_keep, last_tokens_);
    for (int32_t i = 0; i < num_keep; ++i)
      FS_CHECK(keep[i] >= 0 && keep[i] < last_tokens_ && (i == 0 || keep[i] > keep[i - 1]),
               "keep[%d] is %d of %d tokens", i, keep[i], last_tokens_);
    if (gen_->on_token)
      FS_CHECK(size_t(num_past) + size_t(num_keep) >= prompt_.size() + streamed_.size(),
               "keep of %d + %d tokens drops the sequence's %zu", num_past, num_keep,
               prompt_.size() + streamed_.size());
    const Fault* f = fault_for(Where::kRollback, index);
    if (f) {
      rollback_failed_ = true;
      if (f->kind & 1) {
        fatal(FLASHSPEC_ERR_CALLBACK, "target keep threw");
        host_throw();
      }
      fatal(FLASHSPEC_ERR_CALLBACK, "target keep returned 1");
      return 1;
    }
    std::vector<int32_t> kept(cache_.begin(), cache_.begin() + num_past);
    for (int32_t i = 0; i < num_keep; ++i) kept.push_back(cache_[size_t(num_past + keep[i])]);
    cache_ = kept;
    return 0;
  }

  // Greedy continuation of `context` under the target (on the reference
  // context), k tokens.
  std::vector<int32_t> greedy_continuation(std::vector<int32_t> context, int32_t k) {
    std::vector<int32_t> out;
    for (int32_t i = 0; i < k; ++i) {
      const int32_t t = greedy_next(context);
      out.push_back(t);
      context.push_back(t);
    }
    return out;
  }
  int32_t greedy_next(const std::vector<int32_t>& context) {
    HostMatrix row;
    row.init(s_.hidden_dtype, 1, model_.d, 0, 0);
    std::vector<float> h(static_cast<size_t>(model_.d));
    model_.hidden(context.data(), int64_t(context.size()), h.data());
    for (int64_t c = 0; c < model_.d; ++c) row.set(0, c, h[size_t(c)]);
    const flashspec_tensor v = row.view();
    int32_t token = -1;
    const flashspec_status st = flashspec_draft(ref_.p, ref_head_.p, &v, nullptr, &token, nullptr);
    FS_CHECK(st == FLASHSPEC_OK, "reference greedy draft failed: %s", name(st));
    return token;
  }

  int on_draft(CallbackDrafter& cd, flashspec_draft_call* call) {
    const int32_t index = drafts_++;
    ++callbacks_;
    FS_CHECK(call->struct_size == sizeof(flashspec_draft_call), "draft call struct_size %u", call->struct_size);
    FS_CHECK(call->max_tokens >= 1 && call->max_tokens <= s_.max_rows, "draft call max_tokens %d", call->max_tokens);
    FS_CHECK(call->context_len >= 1 && call->context != nullptr, "draft call context of %d tokens", call->context_len);
    if (gen_->on_token) {
      const size_t known = prompt_.size() + streamed_.size();
      FS_CHECK(size_t(call->context_len) == known, "draft call context of %d tokens, the sequence has %zu",
               call->context_len, known);
      for (size_t i = 0; i < known; ++i)
        FS_CHECK(call->context[i] == (i < prompt_.size() ? prompt_[i] : streamed_[i - prompt_.size()]),
                 "draft call context token %zu differs from the sequence", i);
    }
    std::vector<int32_t> context(call->context, call->context + call->context_len);
    const Fault* f = fault_for(Where::kDraft, index);
    const uint8_t kind = f ? f->kind % 12 : 255;
    if (kind == 0) {
      fatal(FLASHSPEC_ERR_CALLBACK, "draft callback returned 1");
      return 1;
    }
    if (kind == 1) {
      fatal(FLASHSPEC_ERR_CALLBACK, "draft callback threw");
      host_throw();
    }
    const int64_t vocab = model_.vocab, d = model_.d;
    if (cd.spec.kind == kHidden) {
      FS_CHECK(call->num_drafted >= 0 && (call->num_drafted == 0 || call->drafted != nullptr),
               "HIDDEN draft call: %d drafted", call->num_drafted);
      for (int32_t i = 0; i < call->num_drafted; ++i) context.push_back(call->drafted[i]);
      int32_t rows = cd.spec.all_rows ? call->max_tokens : 1;
      if (cd.spec.mode % 4 == 3 && call->num_drafted > 0) rows = 0;  // stop after one row
      cd.view.init(s_.hidden_dtype, std::max(rows, 1), d, 0, kind == 10 ? 1 : 0);  // 10: misaligned
      std::vector<float> h(static_cast<size_t>(d));
      std::vector<int32_t> guess = context;
      for (int32_t r = 0; r < rows; ++r) {
        model_.hidden(guess.data(), int64_t(guess.size()), h.data());
        for (int64_t c = 0; c < d; ++c) cd.view.set(r, c, cd.spec.mode % 4 == 1 ? -h[size_t(c)] : h[size_t(c)]);
        guess.push_back(guess.back());
      }
      call->num_tokens = rows;
      call->hidden = cd.view.view();
      call->hidden.rows = rows;
      if (rows > 0) {
        switch (kind) {
          case 2: call->num_tokens = call->max_tokens + 1; fatal(FLASHSPEC_ERR_CALLBACK, "HIDDEN drafter: num_tokens > max_tokens"); break;
          case 3: call->num_tokens = -1; fatal(FLASHSPEC_ERR_CALLBACK, "HIDDEN drafter: num_tokens -1"); break;
          case 4: case 5: call->hidden.rows = rows + 1; fatal(FLASHSPEC_ERR_CALLBACK, "HIDDEN drafter: wrong rows"); break;
          case 6: set_raw(call->hidden.dtype, -1); fatal(FLASHSPEC_ERR_CALLBACK, "HIDDEN drafter: dtype -1"); break;
          case 7: cd.view.set(0, 0, kNaN); fatal(FLASHSPEC_ERR_NON_FINITE, "HIDDEN drafter: a NaN row"); break;
          case 8: call->hidden.data = nullptr; fatal(FLASHSPEC_ERR_CALLBACK, "HIDDEN drafter: data NULL"); break;
          case 9: call->hidden.memory = FLASHSPEC_MEMORY_CUDA; fatal(FLASHSPEC_ERR_CALLBACK, "HIDDEN drafter: device memory"); break;
          case 10: fatal(FLASHSPEC_ERR_CALLBACK, "HIDDEN drafter: misaligned rows"); break;
          default: break;
        }
      }
      return 0;
    }
    // TOKENS, LOGITS and TREE.
    FS_CHECK(call->tokens != nullptr, "draft call: tokens buffer NULL");
    FS_CHECK((call->parents != nullptr) == (cd.spec.kind == kTree), "draft call: parents buffer %s for kind %d",
             call->parents ? "set" : "NULL", int(cd.spec.kind));
    int32_t n = 0;
    std::vector<int32_t> proposal;
    switch (cd.spec.mode % 4) {
      case 0: proposal = greedy_continuation(context, call->max_tokens); break;
      case 1: {
        Rng rng(cd.spec.mode * 7919u + uint64_t(index));
        for (int32_t i = 0; i < call->max_tokens; ++i) proposal.push_back(int32_t(rng.below(vocab)));
        break;
      }
      case 2:
        proposal = greedy_continuation(context, call->max_tokens);
        proposal[size_t(proposal.size() - 1)] = int32_t((proposal.back() + 1) % vocab);
        break;
      default: break;  // no draft
    }
    std::vector<int32_t> parents;
    if (cd.spec.kind == kTree) {
      // The tree's shape: a chain, random parents, or at each level a wrong
      // sibling before the proposal's token.
      const int32_t shape = (cd.spec.mode / 4) % 3;
      if (shape == 2) {
        std::vector<int32_t> right = proposal;
        proposal.clear();
        int32_t parent = -1;
        for (size_t j = 0; j < right.size() && int32_t(proposal.size()) + 2 <= call->max_tokens; ++j) {
          proposal.push_back(int32_t((right[j] + 1) % vocab));
          parents.push_back(parent);
          proposal.push_back(right[j]);
          parents.push_back(parent);
          parent = int32_t(proposal.size()) - 1;
        }
      } else {
        Rng rng(cd.spec.mode * 104729u + uint64_t(index));
        for (int32_t i = 0; i < int32_t(proposal.size()); ++i)
          parents.push_back(shape == 0 ? i - 1 : int32_t(rng.below(int64_t(i) + 1)) - 1);
      }
    }
    n = int32_t(proposal.size());
    for (int32_t i = 0; i < n; ++i) call->tokens[i] = proposal[size_t(i)];
    for (int32_t i = 0; i < int32_t(parents.size()); ++i) call->parents[i] = parents[size_t(i)];
    call->num_tokens = n;
    if (cd.spec.kind == kLogits && n > 0) {
      cd.view.init(cd.spec.logits_dtype, n, vocab, 0, kind == 11 ? 1 : 0);  // 11: misaligned
      std::vector<int32_t> prefix = context;
      std::vector<float> h(static_cast<size_t>(d));
      for (int32_t j = 0; j < n; ++j) {
        model_.hidden(prefix.data(), int64_t(prefix.size()), h.data());
        for (int64_t v = 0; v < vocab; ++v) {
          double l = 0.0;
          for (int64_t c = 0; c < d; ++c) l += double(h[size_t(c)]) * double(model_.w.at(v, c));
          cd.view.set(j, v, cd.spec.mode & 4 ? float(l) : float((v * 37 + j) % 11) * 0.3f);
        }
        prefix.push_back(proposal[size_t(j)]);
      }
      call->logits = cd.view.view();
      // Logits beyond the range of a 16-bit dtype are stored as ±Inf.
      if (!cd.view.all_finite()) at_verify(FLASHSPEC_ERR_NON_FINITE, "LOGITS drafter: a logit beyond its dtype's range", 1);
    }
    if (n > 0) {
      switch (kind) {
        case 2: call->num_tokens = call->max_tokens + 1; fatal(FLASHSPEC_ERR_CALLBACK, "drafter: num_tokens > max_tokens"); break;
        case 3: call->num_tokens = -1; fatal(FLASHSPEC_ERR_CALLBACK, "drafter: num_tokens -1"); break;
        case 4: call->tokens[0] = int32_t(vocab); fatal(FLASHSPEC_ERR_CALLBACK, "drafter: token out of range"); break;
        default: break;
      }
      if (cd.spec.kind == kTree && (kind == 5 || kind == 6)) {
        if (kind == 5)
          call->parents[n - 1] = n - 1;
        else
          call->parents[0] = -2;
        fatal(FLASHSPEC_ERR_CALLBACK, "TREE drafter: a parent out of range");
      }
      if (cd.spec.kind == kLogits && kind >= 5) {
        switch (kind) {
          case 5: call->logits.rows = n + 1; fatal(FLASHSPEC_ERR_CALLBACK, "LOGITS drafter: wrong rows"); break;
          case 6: set_raw(call->logits.dtype, -1); fatal(FLASHSPEC_ERR_CALLBACK, "LOGITS drafter: dtype -1"); break;
          case 7: cd.view.set(n - 1, 0, kNaN); at_verify(FLASHSPEC_ERR_NON_FINITE, "LOGITS drafter: a NaN logit", 1); break;
          case 8: call->logits.data = nullptr; fatal(FLASHSPEC_ERR_CALLBACK, "LOGITS drafter: data NULL"); break;
          case 9: {
            // z = 3e38 in one row: z / T_d overflows fp32 for T_d below about 0.88.
            if (cd.view.dtype == FLASHSPEC_DTYPE_F16) break;  // fp16 cannot hold it
            for (int64_t v = 0; v < vocab; ++v) cd.view.set(0, v, 3e38f);
            const double big = double(std::numeric_limits<float>::max());
            const double scaled = double(cd.view.at(0, 0)) * double(1.0f / cd.spec.draft_temperature);
            if (scaled > big * 1.01 && gen_->temperature > 0.0f)
              at_verify(FLASHSPEC_ERR_NON_FINITE, "LOGITS drafter: draft logits / T_d overflow fp32", 1);
            else if (scaled > big * 0.99)
              overflow_maybe_ = true;
            break;
          }
          case 10: call->logits.memory = FLASHSPEC_MEMORY_CUDA; fatal(FLASHSPEC_ERR_CALLBACK, "LOGITS drafter: device memory"); break;
          case 11: fatal(FLASHSPEC_ERR_CALLBACK, "LOGITS drafter: misaligned logits"); break;
          default: break;
        }
      }
    }
    return 0;
  }

  int on_token(int32_t t) {
    const int32_t index = int32_t(streamed_.size());
    ++callbacks_;
    verified();
    FS_CHECK(t >= 0 && t < model_.vocab, "token callback got %d, outside [0, %lld)", t, (long long)model_.vocab);
    streamed_.push_back(t);
    const Fault* f = fault_for(Where::kToken, index);
    if (!f) return 0;
    switch (f->kind % 6) {
      case 0: host_stopped_at_ = index; return 1 + f->kind / 6;
      case 1: fatal(FLASHSPEC_ERR_CALLBACK, "token callback threw"); host_throw();
      case 2:
        flashspec_engine_cancel(engine_);
        if (!cancel_pending_) {
          cancel_pending_ = true;
          cancel_at_ = index;
          steps_at_cancel_ = forwards_ + drafts_;
        }
        return 0;
      case 3: {
        const int32_t prompt[1] = {0};
        int32_t out[4] = {-5, -5, -5, -5};
        flashspec_generate_result result;
        flashspec_generate_result_init(&result);
        result.num_tokens = 12345;
        flashspec_generate_params p;
        flashspec_generate_params_init(&p);
        p.max_tokens = 4;
        const int before = callbacks_;
        const flashspec_status st = flashspec_engine_generate(engine_, prompt, 1, &p, out, 4, &result);
        FS_CHECK(st == FLASHSPEC_ERR_INVALID_ARGUMENT, "generate from a token callback of the same engine gave %s",
                 name(st));
        check_error_message(ctx_.p, st, "nested flashspec_engine_generate");
        FS_CHECK(result.num_tokens == 12345 && out[0] == -5 && callbacks_ == before,
                 "a refused nested generate wrote its outputs or called back");
        return 0;
      }
      case 4: {
        const flashspec_status st = flashspec_engine_reset_metrics(engine_);
        FS_CHECK(st == FLASHSPEC_ERR_INVALID_ARGUMENT, "reset_metrics during generation gave %s", name(st));
        check_error_message(ctx_.p, st, "flashspec_engine_reset_metrics (during generation)");
        return 0;
      }
      default: {
        flashspec_engine_metrics m;
        flashspec_engine_metrics_init(&m);
        const flashspec_status st = flashspec_engine_get_metrics(engine_, &m);
        FS_CHECK(st == FLASHSPEC_OK, "get_metrics from a token callback gave %s", name(st));
        return 0;
      }
    }
  }

  // ---- engine creation -------------------------------------------------------
  bool create() {
    // Drafters.
    callback_drafters_.clear();
    callback_drafters_.reserve(s_.drafters.size());
    for (size_t i = 0; i < s_.drafters.size(); ++i) {
      const DrafterSpec& spec = s_.drafters[i];
      flashspec_drafter* d = nullptr;
      flashspec_status st;
      if (spec.kind == kNgram) {
        flashspec_ngram_params p;
        flashspec_ngram_params_init(&p);
        p.min_n = spec.min_n;
        p.max_n = spec.max_n;
        p.call_cost = spec.call_cost;
        p.token_cost = spec.token_cost;
        st = flashspec_drafter_create_ngram(ctx_.p, &p, &d);
      } else {
        callback_drafters_.emplace_back(new CallbackDrafter);
        CallbackDrafter& cd = *callback_drafters_.back();
        cd.run = this;
        cd.index = int32_t(i);
        cd.spec = spec;
        flashspec_callback_drafter_params p;
        flashspec_callback_drafter_params_init(&p);
        p.kind = spec.kind == kTokens   ? FLASHSPEC_DRAFT_TOKENS
                 : spec.kind == kLogits ? FLASHSPEC_DRAFT_LOGITS
                 : spec.kind == kTree   ? FLASHSPEC_DRAFT_TREE
                                        : FLASHSPEC_DRAFT_HIDDEN;
        p.draft = &Run::draft;
        p.user_data = &cd;
        p.draft_temperature = spec.draft_temperature;
        p.head = spec.own_head ? second_head_.p : head_.p;
        p.call_cost = spec.call_cost;
        p.token_cost = spec.token_cost;
        st = flashspec_drafter_create_callback(ctx_.p, &p, &d);
      }
      FS_CHECK(st == FLASHSPEC_OK && d, "a valid drafter (kind %d) was refused: %s (%s)", int(spec.kind), name(st),
               flashspec_context_last_error(ctx_.p));
      drafters_.push_back(d);
    }

    flashspec_engine_params p;
    flashspec_engine_params_init(&p);
    p.target_forward = &Run::forward;
    p.target_rollback = s_.with_rollback ? &Run::rollback : nullptr;
    p.target_keep = s_.with_keep ? &Run::keep : nullptr;
    p.target_user_data = this;
    p.drafters = drafters_.empty() ? nullptr : drafters_.data();
    p.num_drafters = int32_t(drafters_.size());
    if (s_.explicit_arms) {
      p.arms = s_.arms.data();
      p.num_arms = int32_t(s_.arms.size());
    }
    p.default_draft_len = s_.default_draft_len;
    set_raw(p.policy, s_.policy);
    p.bandit_seed = s_.bandit_seed;
    p.fixed_arm = s_.fixed_arm;
    p.oracle_rewards = s_.oracle.data();
    p.max_context = s_.max_context;
    num_arms_ = s_.explicit_arms ? int32_t(s_.arms.size()) : std::max<int32_t>(1, int32_t(drafters_.size()));

    // A planted invalid argument.
    Expect expect;
    flashspec_context* c = ctx_.p;
    const flashspec_lm_head* h = head_.p;
    const flashspec_engine_params* pp = &p;
    bool null_out = false;
    std::vector<flashspec_drafter*> twice;
    std::vector<flashspec_arm> arms = s_.arms;
    const double nan_rewards[4] = {1.0, kNaN, 1.0, 1.0};
    switch (s_.create_plant) {
      case 0: break;
      case 1: c = nullptr; expect.violate(FLASHSPEC_ERR_NULL_POINTER, "ctx NULL"); break;
      case 2: h = nullptr; expect.violate(FLASHSPEC_ERR_NULL_POINTER, "target_head NULL"); break;
      case 3: pp = nullptr; expect.violate(FLASHSPEC_ERR_NULL_POINTER, "params NULL"); break;
      case 4: null_out = true; expect.violate(FLASHSPEC_ERR_NULL_POINTER, "out NULL"); break;
      case 5: p.struct_size += 8; expect.violate(FLASHSPEC_ERR_STRUCT_SIZE, "params->struct_size"); break;
      case 6: p.target_forward = nullptr; expect.violate(FLASHSPEC_ERR_NULL_POINTER, "target_forward NULL"); break;
      case 7:
        if (p.num_drafters > 0) p.drafters = nullptr, expect.violate(FLASHSPEC_ERR_NULL_POINTER, "drafters NULL");
        break;
      case 8: p.num_drafters = -1; expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "num_drafters < 0"); break;
      case 9:
        if (!drafters_.empty()) {
          twice = drafters_;
          twice.push_back(drafters_[0]);
          p.drafters = twice.data();
          p.num_drafters = int32_t(twice.size());
          expect.violate(FLASHSPEC_ERR_INVALID_ARGUMENT, "a drafter listed twice");
        }
        break;
      case 10:
        if (!drafters_.empty()) {
          twice = drafters_;
          twice[0] = nullptr;
          p.drafters = twice.data();
          expect.violate(FLASHSPEC_ERR_NULL_POINTER, "a drafter NULL");
        }
        break;
      case 11: p.arms = arms.data(); p.num_arms = 0; expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "num_arms 0"); break;
      case 12: p.arms = nullptr; p.num_arms = 2; expect.violate(FLASHSPEC_ERR_NULL_POINTER, "arms NULL with num_arms"); break;
      case 13:
        arms[0].draft_len = s_.max_rows;
        arms[0].drafter = 0;
        p.arms = arms.data();
        p.num_arms = int32_t(arms.size());
        expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "draft_len > max_rows - 1");
        break;
      case 14:
        arms[0].draft_len = 1;
        arms[0].drafter = p.num_drafters;
        p.arms = arms.data();
        p.num_arms = int32_t(arms.size());
        expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "an arm's drafter out of range");
        break;
      case 15:
        p.arms = nullptr, p.num_arms = 0;
        p.default_draft_len = s_.max_rows;
        expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "default_draft_len > max_rows - 1");
        break;
      case 16: set_raw(p.policy, 4 + int32_t(s_.bandit_seed % 3)); expect.violate(FLASHSPEC_ERR_INVALID_ARGUMENT, "policy unknown"); break;
      case 17: set_raw(p.policy, -1); expect.violate(FLASHSPEC_ERR_INVALID_ARGUMENT, "policy -1"); break;
      case 18: p.policy = FLASHSPEC_BANDIT_FIXED; p.fixed_arm = num_arms_; expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "fixed_arm out of range"); break;
      case 19: p.policy = FLASHSPEC_BANDIT_ORACLE; p.oracle_rewards = nullptr; expect.violate(FLASHSPEC_ERR_NULL_POINTER, "oracle_rewards NULL"); break;
      case 20:
        if (num_arms_ >= 2) {
          p.policy = FLASHSPEC_BANDIT_ORACLE;
          p.oracle_rewards = nan_rewards;
          expect.violate(FLASHSPEC_ERR_INVALID_ARGUMENT, "an oracle reward NaN");
        }
        break;
      case 21: p.target_step_cost = (s_.bandit_seed & 1) ? 0.0 : kNaN; expect.violate(FLASHSPEC_ERR_INVALID_ARGUMENT, "target_step_cost"); break;
      case 22: p.target_row_cost = -0.5; expect.violate(FLASHSPEC_ERR_INVALID_ARGUMENT, "target_row_cost < 0"); break;
      case 23: p.max_context = -1; expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "max_context < 0"); break;
      default:
        p.policy = FLASHSPEC_BANDIT_UCB1;
        p.ucb_exploration = -1.0;
        expect.violate(FLASHSPEC_ERR_INVALID_ARGUMENT, "ucb_exploration < 0");
        break;
    }
    // A HIDDEN drafter whose head has another vocabulary is refused too;
    // checked by the unit suite, here its head is always the target's size.
    Guarded<flashspec_engine*> out(1);
    out.poison();
    const int before = callbacks_;
    create_status_ = flashspec_engine_create(c, h, pp, null_out ? nullptr : out.data());
    check_error_message(c, create_status_, "flashspec_engine_create");
    expect.check(create_status_, "flashspec_engine_create", flashspec_context_last_error(c));
    FS_CHECK(out.guards_intact(), "flashspec_engine_create wrote past *out");
    FS_CHECK(callbacks_ == before, "flashspec_engine_create called a callback");
    if (create_status_ != FLASHSPEC_OK) {
      FS_CHECK(out.untouched(), "flashspec_engine_create failed with %s but wrote *out", name(create_status_));
      return false;
    }
    if (null_out) return false;
    engine_ = out.get(0);
    // A drafter serves one engine: a second engine over the same drafters
    // is refused.
    if (!drafters_.empty() && (s_.bandit_seed & 2)) {
      flashspec_engine* second = reinterpret_cast<flashspec_engine*>(uintptr_t(0x1234));
      const flashspec_status st = flashspec_engine_create(ctx_.p, head_.p, &p, &second);
      check_error_message(ctx_.p, st, "flashspec_engine_create (drafter of another engine)");
      FS_CHECK(st == FLASHSPEC_ERR_INVALID_ARGUMENT && second == reinterpret_cast<flashspec_engine*>(uintptr_t(0x1234)),
               "a second engine over drafters that serve one: %s", name(st));
    }
    flashspec_engine_metrics m;
    flashspec_engine_metrics_init(&m);
    FS_CHECK(flashspec_engine_get_metrics(engine_, &m) == FLASHSPEC_OK && m.num_arms == num_arms_ && m.steps == 0,
             "a new engine's metrics: %d arms (expected %d), %llu steps", m.num_arms, num_arms_,
             (unsigned long long)m.steps);
    return true;
  }

  // ---- one generation -------------------------------------------------------
  GenerationTrace generate(int32_t g) {
    const GenerationSpec& spec = s_.generations[size_t(g)];
    gen_ = &spec;
    prompt_ = spec.prompt;
    streamed_.clear();
    cache_.clear();
    forwards_ = rollbacks_ = drafts_ = 0;
    fatal_status_ = pending_status_ = FLASHSPEC_OK;
    fatal_what_.clear();
    pending_rank_ = 0;
    cancel_pending_ = false;
    cancel_at_ = host_stopped_at_ = -1;
    rollback_failed_ = false;
    after_end_ = false;
    overflow_maybe_ = false;
    step_ = 0;

    flashspec_generate_params p;
    flashspec_generate_params_init(&p);
    p.temperature = spec.temperature;
    p.seed = spec.seed;
    p.request_id = spec.request_id;
    p.max_tokens = spec.max_tokens;
    p.stop_tokens = spec.stop_tokens.empty() ? nullptr : spec.stop_tokens.data();
    p.num_stop_tokens = int32_t(spec.stop_tokens.size());
    p.on_token = spec.on_token ? &Run::token : nullptr;
    p.on_token_user_data = this;
    std::vector<int32_t> prompt = spec.prompt;
    const int32_t* prompt_arg = prompt.data();
    int32_t prompt_len = int32_t(prompt.size());
    int32_t capacity = spec.null_tokens_out ? 0 : spec.max_tokens + spec.capacity_extra;
    Guarded<int32_t> tokens(size_t(std::max(capacity, 1)));
    tokens.poison();
    int32_t* tokens_arg = spec.null_tokens_out ? nullptr : tokens.data();
    flashspec_generate_result result;
    flashspec_generate_result_init(&result);
    result.num_tokens = 0x7eadbeef;
    result.steps = 0x7eadbeef;
    flashspec_generate_result* result_arg = &result;
    const flashspec_generate_params* params_arg = &p;

    Expect expect;
    if (!valid_temperature(spec.temperature)) expect.violate(FLASHSPEC_ERR_INVALID_ARGUMENT, "params->temperature");
    std::vector<int32_t> stop_bad;
    switch (spec.plant) {
      case 0: break;
      case 1: prompt_arg = nullptr; expect.violate(FLASHSPEC_ERR_NULL_POINTER, "prompt NULL"); break;
      case 2: prompt_len = 0; expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "prompt_len 0"); break;
      case 3: prompt[prompt.size() - 1] = int32_t(model_.vocab); expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "a prompt token >= V"); break;
      case 4: prompt[0] = -1; expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "a prompt token < 0"); break;
      case 5: result_arg = nullptr; expect.violate(FLASHSPEC_ERR_NULL_POINTER, "result NULL"); break;
      case 6: result.struct_size += 4; expect.violate(FLASHSPEC_ERR_STRUCT_SIZE, "result->struct_size"); break;
      case 7: p.struct_size -= 8; expect.violate(FLASHSPEC_ERR_STRUCT_SIZE, "params->struct_size"); break;
      case 8: p.max_tokens = 0; expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "max_tokens 0"); break;
      case 9: p.num_stop_tokens = -1; expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "num_stop_tokens < 0"); break;
      case 10: p.stop_tokens = nullptr; p.num_stop_tokens = 2; expect.violate(FLASHSPEC_ERR_NULL_POINTER, "stop_tokens NULL"); break;
      case 11:
        stop_bad = {0, int32_t(model_.vocab)};
        p.stop_tokens = stop_bad.data();
        p.num_stop_tokens = 2;
        expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "a stop token >= V");
        break;
      case 12:
        if (!spec.null_tokens_out) capacity = spec.max_tokens - 1, expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "capacity < max_tokens");
        break;
      case 13: tokens_arg = nullptr; capacity = std::max(capacity, 1); expect.violate(FLASHSPEC_ERR_NULL_POINTER, "tokens_out NULL with a capacity"); break;
      default: capacity = -1; expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "capacity < 0"); break;
    }
    if (s_.max_context > 0 && int32_t(prompt.size()) > s_.max_context && prompt_len >= 1)
      expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "prompt longer than max_context");
    const flashspec_generate_result poisoned = result;
    const int before = callbacks_;
    const flashspec_status st =
        flashspec_engine_generate(engine_, prompt_arg, prompt_len, params_arg, tokens_arg, capacity, result_arg);
    after_end_ = true;
    verified();
    check_error_message(ctx_.p, st, "flashspec_engine_generate");
    FS_CHECK(tokens.guards_intact(), "flashspec_engine_generate wrote outside tokens_out[0 .. %d)", capacity);
    GenerationTrace trace;
    trace.status = st;
    if (!expect.valid()) {
      expect.check(st, "flashspec_engine_generate", flashspec_context_last_error(ctx_.p));
      FS_CHECK(tokens.untouched(), "generate refused its arguments (%s) but wrote tokens_out", name(st));
      FS_CHECK(std::memcmp(&result, &poisoned, sizeof result) == 0, "generate refused its arguments (%s) but wrote the result",
               name(st));
      FS_CHECK(callbacks_ == before, "generate refused its arguments (%s) but called a callback", name(st));
      trace.result = result;
      return trace;
    }
    // Generation ran.
    const char* message = flashspec_context_last_error(ctx_.p);
    FS_CHECK(result.struct_size == sizeof(flashspec_generate_result), "result struct_size changed");
    FS_CHECK(result.num_tokens != 0x7eadbeef && result.steps != 0x7eadbeef, "generate (%s) did not write the result",
             name(st));
    const int32_t n = result.num_tokens;
    FS_CHECK(n >= 0 && n <= spec.max_tokens, "generate emitted %d tokens, max_tokens %d", n, spec.max_tokens);
    FS_CHECK(result.steps >= 0 && result.steps <= n, "generate counts %d steps for %d tokens", result.steps, n);
    if (tokens_arg) {
      for (int32_t i = 0; i < n; ++i) {
        const int32_t t = tokens.get(size_t(i));
        FS_CHECK(t >= 0 && t < model_.vocab, "tokens_out[%d] = %d outside [0, %lld)", i, t, (long long)model_.vocab);
        trace.tokens.push_back(t);
      }
      FS_CHECK(tokens.poisoned_from(size_t(n)), "generate wrote tokens_out past its %d tokens", n);
    }
    if (spec.on_token) {
      FS_CHECK(int32_t(streamed_.size()) == n, "%zu tokens streamed, result says %d", streamed_.size(), n);
      if (tokens_arg)
        for (int32_t i = 0; i < n; ++i)
          FS_CHECK(streamed_[size_t(i)] == tokens.get(size_t(i)), "token %d: streamed %d, tokens_out %d", i,
                   streamed_[size_t(i)], tokens.get(size_t(i)));
      if (!tokens_arg) trace.tokens = streamed_;
    }

    // The status: that of the first failing callback.
    const bool cancelled = cancel_pending_ && fatal_status_ == FLASHSPEC_OK;
    if (fatal_status_ != FLASHSPEC_OK) {
      FS_CHECK(st == fatal_status_,
               "generate: %s should end it with %s, got %s (%s)", fatal_what_.c_str(), name(fatal_status_), name(st),
               message);
    } else if (cancelled) {
      FS_CHECK(st == FLASHSPEC_ERR_CANCELLED || st == FLASHSPEC_OK, "generate cancelled at token %d gave %s (%s)",
               cancel_at_, name(st), message);
      // The step in progress finishes; no further step starts.
      FS_CHECK(forwards_ + drafts_ == steps_at_cancel_ && n > cancel_at_,
               "generate went on after a cancel at token %d (%d more forward/draft calls, %d tokens)", cancel_at_,
               forwards_ + drafts_ - steps_at_cancel_, n);
      if (st == FLASHSPEC_ERR_CANCELLED)
        FS_CHECK(result.finish_reason == FLASHSPEC_FINISH_CANCELLED, "a cancelled generation has finish reason %d",
                 int(result.finish_reason));
    } else {
      FS_CHECK(st == FLASHSPEC_OK || (overflow_maybe_ && st == FLASHSPEC_ERR_NON_FINITE),
               "generate failed with %s without a failing callback (%s)", name(st), message);
    }
    if (st != FLASHSPEC_OK) {
      FS_CHECK(result.finish_reason == FLASHSPEC_FINISH_NONE ||
                   (st == FLASHSPEC_ERR_CANCELLED && result.finish_reason == FLASHSPEC_FINISH_CANCELLED),
               "a failed generation (%s) has finish reason %d", name(st), int(result.finish_reason));
    } else {
      // The finish reason agrees with the tokens.
      const bool last_is_stop = n > 0 && tokens_known(trace, n) &&
                                std::find(spec.stop_tokens.begin(), spec.stop_tokens.end(), trace.tokens.back()) !=
                                    spec.stop_tokens.end();
      switch (result.finish_reason) {
        case FLASHSPEC_FINISH_LENGTH: FS_CHECK(n == spec.max_tokens && !last_is_stop, "finish LENGTH after %d of %d tokens", n, spec.max_tokens); break;
        case FLASHSPEC_FINISH_STOP_TOKEN: FS_CHECK(!tokens_known(trace, n) || last_is_stop, "finish STOP_TOKEN, last token not a stop token"); break;
        case FLASHSPEC_FINISH_HOST_STOP: FS_CHECK(host_stopped_at_ == n - 1 && !last_is_stop, "finish HOST_STOP but the callback stopped at %d of %d", host_stopped_at_, n); break;
        case FLASHSPEC_FINISH_CONTEXT_FULL:
          FS_CHECK(s_.max_context > 0 && int64_t(spec.prompt.size()) + n > s_.max_context && n < spec.max_tokens,
                   "finish CONTEXT_FULL with %zu + %d tokens, max_context %d", spec.prompt.size(), n, s_.max_context);
          break;
        default: FS_CHECK(false, "a successful generation has finish reason %d", int(result.finish_reason));
      }
      FS_CHECK(n >= 1, "a successful generation emitted no token");
      if (tokens_known(trace, n))
        for (int32_t i = 0; i + 1 < n; ++i)
          FS_CHECK(std::find(spec.stop_tokens.begin(), spec.stop_tokens.end(), trace.tokens[size_t(i)]) == spec.stop_tokens.end(),
                   "generation went on after stop token %d at %d", trace.tokens[size_t(i)], i);
      if (result.finish_reason != FLASHSPEC_FINISH_HOST_STOP && host_stopped_at_ >= 0)
        FS_CHECK(host_stopped_at_ == n - 1 && last_is_stop, "the token callback asked to stop at %d, generation went on to %d",
                 host_stopped_at_, n);
    }
    if (spec.temperature == 0.0f && tokens_known(trace, n)) {
      // T = 0: the target's greedy tokens.
      std::vector<int32_t> context = spec.prompt;
      for (int32_t i = 0; i < n; ++i) {
        const int32_t ref = greedy_next(context);
        FS_CHECK(trace.tokens[size_t(i)] == ref, "at T = 0 token %d is %d, the target's greedy token is %d", i,
                 trace.tokens[size_t(i)], ref);
        context.push_back(ref);
      }
    }
    trace.result = result;
    sum_steps_ += uint64_t(std::max(result.steps, 0));
    sum_tokens_ += uint64_t(std::max(n, 0));
    check_metrics();
    if (spec.reset_metrics_after) {
      FS_CHECK(flashspec_engine_reset_metrics(engine_) == FLASHSPEC_OK, "reset_metrics failed");
      sum_steps_ = sum_tokens_ = 0;
      check_metrics();
    }
    return trace;
  }

  bool tokens_known(const GenerationTrace& t, int32_t n) const { return int32_t(t.tokens.size()) == n; }

  void check_metrics() {
    flashspec_engine_metrics m;
    flashspec_engine_metrics_init(&m);
    FS_CHECK(flashspec_engine_get_metrics(engine_, &m) == FLASHSPEC_OK, "get_metrics failed");
    FS_CHECK(m.steps == sum_steps_, "metrics: %llu steps, the results add up to %llu", (unsigned long long)m.steps,
             (unsigned long long)sum_steps_);
    FS_CHECK(m.emitted_tokens == sum_tokens_, "metrics: %llu emitted tokens, the results add up to %llu",
             (unsigned long long)m.emitted_tokens, (unsigned long long)sum_tokens_);
    FS_CHECK(m.accepted_tokens <= m.draft_tokens && m.drafts <= m.steps, "metrics: %llu accepted of %llu drafted, %llu drafts in %llu steps",
             (unsigned long long)m.accepted_tokens, (unsigned long long)m.draft_tokens, (unsigned long long)m.drafts,
             (unsigned long long)m.steps);
    FS_CHECK(m.num_arms == num_arms_, "metrics: %d arms, expected %d", m.num_arms, num_arms_);
    FS_CHECK(m.emitted_tokens <= m.accepted_tokens + m.steps, "metrics: %llu emitted > accepted + steps",
             (unsigned long long)m.emitted_tokens);
    int32_t positions = -1;
    std::vector<uint64_t> drafted(16, 77), accepted(16, 77);
    FS_CHECK(flashspec_engine_get_position_metrics(engine_, 16, drafted.data(), accepted.data(), &positions) == FLASHSPEC_OK,
             "get_position_metrics failed");
    FS_CHECK(positions == m.num_positions, "position metrics: %d positions, metrics say %d", positions, m.num_positions);
    for (int32_t j = 0; j < std::min(positions, 16); ++j) {
      FS_CHECK(accepted[size_t(j)] <= drafted[size_t(j)], "position %d: accepted %llu > drafted %llu", j,
               (unsigned long long)accepted[size_t(j)], (unsigned long long)drafted[size_t(j)]);
      if (j > 0)
        FS_CHECK(drafted[size_t(j)] <= drafted[size_t(j - 1)] && accepted[size_t(j)] <= accepted[size_t(j - 1)],
                 "position %d: counts increase", j);
    }
    for (int32_t j = std::min(positions, 16); j < 16; ++j)
      FS_CHECK(drafted[size_t(j)] == 77 && accepted[size_t(j)] == 77, "position metrics wrote past num_positions");
    uint64_t pulls = 0, arm_drafts = 0, arm_accepted = 0;
    for (int32_t a = 0; a < num_arms_; ++a) {
      flashspec_arm_metrics am;
      flashspec_arm_metrics_init(&am);
      FS_CHECK(flashspec_engine_get_arm_metrics(engine_, a, &am) == FLASHSPEC_OK, "get_arm_metrics(%d) failed", a);
      pulls += am.pulls;
      arm_drafts += am.draft_tokens;
      arm_accepted += am.accepted_tokens;
    }
    FS_CHECK(pulls == m.steps && arm_drafts == m.draft_tokens && arm_accepted == m.accepted_tokens,
             "arm metrics add up to %llu pulls / %llu drafted / %llu accepted, totals %llu / %llu / %llu",
             (unsigned long long)pulls, (unsigned long long)arm_drafts, (unsigned long long)arm_accepted,
             (unsigned long long)m.steps, (unsigned long long)m.draft_tokens, (unsigned long long)m.accepted_tokens);
    flashspec_arm_metrics am;
    flashspec_arm_metrics_init(&am);
    FS_CHECK(flashspec_engine_get_arm_metrics(engine_, num_arms_, &am) == FLASHSPEC_ERR_OUT_OF_RANGE,
             "get_arm_metrics of arm num_arms did not fail with OUT_OF_RANGE");
  }

  const Script& s_;
  const Model& model_;
  Context ctx_, ref_;
  Head head_, ref_head_, second_head_;
  std::vector<flashspec_drafter*> drafters_;
  std::vector<std::unique_ptr<CallbackDrafter>> callback_drafters_;
  flashspec_engine* engine_ = nullptr;
  flashspec_status create_status_ = FLASHSPEC_OK;
  int32_t num_arms_ = 0;
  uint64_t sum_steps_ = 0, sum_tokens_ = 0;

  // Per generation.
  const GenerationSpec* gen_ = nullptr;
  std::vector<int32_t> prompt_, streamed_, cache_;
  HostMatrix rows_;
  int32_t forwards_ = 0, rollbacks_ = 0, drafts_ = 0;  // rollbacks_: and keeps
  int32_t last_past_ = 0, last_tokens_ = 0;             // the last forward's num_past, num_tokens
  int callbacks_ = 0;
  flashspec_status fatal_status_ = FLASHSPEC_OK, pending_status_ = FLASHSPEC_OK;
  std::string fatal_what_, pending_what_;
  int pending_rank_ = 0;
  bool cancel_pending_ = false, rollback_failed_ = false, after_end_ = false,
       overflow_maybe_ = false;
  int32_t cancel_at_ = -1, host_stopped_at_ = -1, steps_at_cancel_ = 0;
  uint64_t step_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  const Script script = read_script(in);
  Model model;
  model.init(script);
  if (!model.w.all_finite()) return 0;
  const int32_t other_threads = script.threads == 1 ? 2 : 1;
  Trace first, second;
  {
    Run run(script, model, script.threads);
    first = run.go();
  }
  {
    Run run(script, model, other_threads);
    second = run.go();
  }
  // The replay on another thread count gives the same run.
  FS_CHECK(first.create_status == second.create_status, "replay: engine create %s then %s", name(first.create_status),
           name(second.create_status));
  FS_CHECK(first.generations.size() == second.generations.size(), "replay: another number of generations");
  for (size_t g = 0; g < first.generations.size(); ++g) {
    const GenerationTrace& a = first.generations[g];
    const GenerationTrace& b = second.generations[g];
    FS_CHECK(a.status == b.status, "replay of generation %zu: %s then %s", g, name(a.status), name(b.status));
    FS_CHECK(a.result.num_tokens == b.result.num_tokens && a.result.steps == b.result.steps &&
                 a.result.finish_reason == b.result.finish_reason,
             "replay of generation %zu: result %d tokens / %d steps / reason %d, then %d / %d / %d", g,
             a.result.num_tokens, a.result.steps, int(a.result.finish_reason), b.result.num_tokens, b.result.steps,
             int(b.result.finish_reason));
    FS_CHECK(a.tokens == b.tokens, "replay of generation %zu: other tokens", g);
  }
  return 0;
}
