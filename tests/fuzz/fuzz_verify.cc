// Fuzzes flashspec_verify, flashspec_finalize and
// flashspec_verify_and_finalize on ragged host batches (CPU backend, V ≤ 64,
// d ≤ 12, R ≤ 6 requests of 0..6 drafts): greedy and stochastic drafts,
// every optional array present or NULL, any temperatures, caller uniforms,
// outputs sharing memory with inputs or with each other, and planted
// invalid arguments.
//
// Invariants:
//   - the status is the one the planted arguments call for (expect.h); data
//     not aligned to its element size (head, target rows, draft logits; any
//     dtype) is UNSUPPORTED; a valid batch succeeds (or fails with
//     NON_FINITE only where a logit, or a draft logit over T_d, may overflow
//     fp32, and must then);
//   - an error leaves every output untouched (poisoned) and a message; no
//     output is written past its documented size (guard words);
//   - accepted_counts[r] in [0, n_r]; request r's emitted tokens are its
//     first accepted_counts[r] drafts, then one token in [0, V), then −1;
//     next_steps[r] = steps[r] + 1;
//   - verify_and_finalize ≡ verify + finalize: the same outputs on another
//     context with the same seed and another thread count (so also
//     independent of threads), with caller-owned summaries; both calls
//     write to separate output arrays;
//   - finalize refuses (INVALID_ARGUMENT, outputs untouched) a batch other
//     than the one verified: other offsets, tokens, temperatures, seeds,
//     request ids or steps; and summaries never verified; a refused finalize
//     or a failed verify leaves the summaries describing the last good batch;
//   - T = 0: the accepted count is the length of the drafts' prefix equal to
//     flashspec_draft's greedy tokens of the same rows, and the next token is
//     the greedy token of its row (the argmax within the fp32 error bound;
//     ties to the smallest id);
//   - each request verified alone, with its effective seed, id and step
//     passed explicitly, gives the same result (independent of neighbours);
//   - aliasing (flashspec_verify_result): an output that shares a byte with
//     another output or with any array or tensor of the batch is refused by
//     verify_and_finalize and finalize with INVALID_ARGUMENT naming the
//     output, every byte of the shared memory and the other outputs left as
//     they were; next_steps == batch.steps exactly, and arrays that only
//     touch end to end, are accepted and give the results of separate
//     arrays.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "expect.h"
#include "fuzz_common.h"
#include "values.h"

using namespace fsfuzz;

namespace {

constexpr int64_t kMaxVocab = 64;
constexpr int64_t kMaxHidden = 12;
constexpr int32_t kMaxRequests = 6;
constexpr int32_t kMaxDrafts = 6;
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// A host batch that owns its arrays.
struct Batch {
  int32_t requests = 0;
  std::vector<int32_t> offsets, tokens;
  HostMatrix hidden, logits;
  bool stochastic = false;
  std::vector<float> temps, dtemps, uniforms;
  std::vector<uint64_t> seeds, ids, steps;
  bool has_temps = false, has_dtemps = false, has_seeds = false, has_ids = false, has_steps = false,
       has_uniforms = false, null_tokens_when_empty = true;
  int32_t max_draft_len = 0;
  flashspec_tensor hv{}, lv{};

  int32_t total_drafts() const { return offsets[size_t(requests)]; }
  int32_t total_rows() const { return total_drafts() + requests; }
  int32_t n(int32_t r) const { return offsets[size_t(r + 1)] - offsets[size_t(r)]; }
  int32_t first_row(int32_t r) const { return offsets[size_t(r)] + r; }

  void refresh_views() {
    hv = hidden.view();
    lv = logits.view();
  }
  flashspec_verify_batch make() {
    flashspec_verify_batch b;
    flashspec_verify_batch_init(&b);
    b.num_requests = requests;
    b.draft_offsets = offsets.data();
    b.draft_tokens = tokens.empty() && null_tokens_when_empty ? nullptr : tokens.data();
    b.target_hidden = &hv;
    b.draft_logits = stochastic ? &lv : nullptr;
    b.temperatures = has_temps ? temps.data() : nullptr;
    b.draft_temperatures = has_dtemps ? dtemps.data() : nullptr;
    b.seeds = has_seeds ? seeds.data() : nullptr;
    b.request_ids = has_ids ? ids.data() : nullptr;
    b.steps = has_steps ? steps.data() : nullptr;
    b.accept_uniforms = has_uniforms ? uniforms.data() : nullptr;
    b.max_draft_len = max_draft_len;
    return b;
  }
  // Effective per-request values.
  float t(int32_t r) const { return has_temps ? temps[size_t(r)] : 1.0f; }
  float td(int32_t r) const { return has_dtemps ? dtemps[size_t(r)] : 1.0f; }
  uint64_t seed(int32_t r, uint64_t ctx_seed) const { return has_seeds ? seeds[size_t(r)] : ctx_seed; }
  uint64_t id(int32_t r) const { return has_ids ? ids[size_t(r)] : uint64_t(r); }
  uint64_t step(int32_t r) const { return has_steps ? steps[size_t(r)] : 0; }
};

// A result with poisoned, guarded arrays.
struct Result {
  Guarded<int32_t> accepted, emitted;
  Guarded<uint64_t> next;
  bool with_next = true;
  Result(int32_t requests, int32_t rows, bool next_steps)
      : accepted(size_t(std::max(requests, 1))), emitted(size_t(std::max(rows, 1))),
        next(size_t(std::max(requests, 1))), with_next(next_steps) {
    accepted.poison();
    emitted.poison();
    next.poison();
  }
  flashspec_verify_result make() {
    flashspec_verify_result r;
    flashspec_verify_result_init(&r);
    r.accepted_counts = accepted.data();
    r.emitted_tokens = emitted.data();
    r.next_steps = with_next ? next.data() : nullptr;
    return r;
  }
  bool untouched() const { return accepted.untouched() && emitted.untouched() && next.untouched(); }
  bool guards() const { return accepted.guards_intact() && emitted.guards_intact() && next.guards_intact(); }
};

// Outputs of one successful verify, for comparisons.
struct Outcome {
  std::vector<int32_t> accepted, emitted;
  std::vector<uint64_t> next;
};

Outcome read(const Guarded<int32_t>& accepted, const Guarded<int32_t>& emitted, const Guarded<uint64_t>* next,
             int32_t requests, int32_t rows) {
  Outcome o;
  for (int32_t r = 0; r < requests; ++r) o.accepted.push_back(accepted.get(size_t(r)));
  for (int32_t i = 0; i < rows; ++i) o.emitted.push_back(emitted.get(size_t(i)));
  if (next)
    for (int32_t r = 0; r < requests; ++r) o.next.push_back(next->get(size_t(r)));
  return o;
}

void same(const Outcome& a, const Outcome& b, const char* what) {
  for (size_t r = 0; r < a.accepted.size(); ++r)
    FS_CHECK(a.accepted[r] == b.accepted[r], "%s: request %zu accepted %d, expected %d", what, r, b.accepted[r],
             a.accepted[r]);
  for (size_t i = 0; i < a.emitted.size(); ++i)
    FS_CHECK(a.emitted[i] == b.emitted[i], "%s: emitted_tokens[%zu] is %d, expected %d", what, i, b.emitted[i],
             a.emitted[i]);
  for (size_t r = 0; r < std::min(a.next.size(), b.next.size()); ++r)
    FS_CHECK(a.next[r] == b.next[r], "%s: next_steps[%zu] is %llu, expected %llu", what, r,
             (unsigned long long)b.next[r], (unsigned long long)a.next[r]);
}

// ---------------------------------------------------------------------------
// Aliasing (flashspec_verify_result): some of the batch's arrays and the
// result's arrays laid out in one piece of memory.
// ---------------------------------------------------------------------------
enum class Layout : uint8_t {
  kNone,
  kNextOnSteps,        // next_steps == steps: allowed
  kEmittedOnTokens,    // emitted_tokens over draft_tokens: refused when there are drafts
  kAcceptedOnOffsets,  // accepted_counts inside draft_offsets: refused
  kNextShifted,        // next_steps one entry after steps: refused when R ≥ 2
  kAcceptedOnEmitted,  // accepted_counts over the last entry of emitted_tokens: refused
  kEmittedOnHidden,    // emitted_tokens over target_hidden's data: refused
  kNextOnSeeds,        // next_steps over seeds: refused
  kAcceptedOnTemps,    // accepted_counts over temperatures: refused
  kEndToEnd,           // tokens | emitted | accepted, steps | next, touching: allowed
};

Layout layout_for(int alias_kind, uint8_t out_mode) {
  if (alias_kind == 0) return Layout::kNone;
  if (alias_kind == 1) return Layout::kNextOnSteps;
  if (alias_kind == 2) return Layout::kEmittedOnTokens;
  return Layout(uint8_t(Layout::kAcceptedOnOffsets) + (out_mode >> 4) % 7);
}

// Lays out the arrays as `layout` says, runs `call` (verify_and_finalize or
// finalize of the batch `vb` describes; `expected` is its result with
// separate arrays) and checks the rule: an overlap is refused with
// INVALID_ARGUMENT naming the output and nothing written; an allowed layout
// gives the expected outputs, and no byte of the shared memory changes but
// those of the outputs.
template <class Call>
void check_aliasing(Layout layout, uint8_t pick, const Batch& batch, const flashspec_verify_batch& vb,
                    uint64_t ctx_seed, bool with_next, const Outcome& expected, const char* call_name,
                    const flashspec_context* ctx, Call call) {
  const int32_t R = batch.requests, D = batch.total_drafts(), rows = batch.total_rows();
  if (layout == Layout::kNone) return;
  if (!with_next && (layout == Layout::kNextOnSteps || layout == Layout::kNextShifted || layout == Layout::kNextOnSeeds))
    return;
  // The shared memory: 8-byte aligned, poisoned.
  std::vector<uint64_t> words(2048, 0x7E7E7E7E7E7E7E7Eull);
  uint8_t* base = reinterpret_cast<uint8_t*>(words.data());
  const size_t arena_bytes = words.size() * sizeof(uint64_t);
  auto put = [&](size_t at, const void* data, size_t bytes) {
    FS_CHECK(at + bytes <= arena_bytes, "aliasing layout does not fit its memory");
    if (bytes) std::memcpy(base + at, data, bytes);
    return base + at;
  };
  // The effective per-request values, as explicit arrays.
  std::vector<uint64_t> steps, seeds;
  std::vector<float> temps;
  for (int32_t r = 0; r < R; ++r) {
    steps.push_back(batch.step(r));
    seeds.push_back(batch.seed(r, ctx_seed));
    temps.push_back(batch.t(r));
  }
  flashspec_verify_batch ab = vb;
  flashspec_tensor hidden_view = *vb.target_hidden;
  Result separate(R, rows, with_next);
  flashspec_verify_result res = separate.make();
  // Where each output lives in the shared memory (SIZE_MAX: its own array).
  const size_t kOwn = SIZE_MAX;
  size_t accepted_at = kOwn, emitted_at = kOwn, next_at = kOwn;
  bool refused = true;
  const char* names[2] = {nullptr, nullptr};
  const char* what = "";
  switch (layout) {
    case Layout::kNextOnSteps:
      ab.steps = reinterpret_cast<const uint64_t*>(put(0, steps.data(), 8 * size_t(R)));
      next_at = 0;
      refused = false;
      what = "next_steps == steps";
      break;
    case Layout::kEmittedOnTokens:
      ab.draft_tokens = reinterpret_cast<const int32_t*>(put(0, batch.tokens.data(), 4 * size_t(D)));
      emitted_at = 0;
      refused = D > 0;
      names[0] = "result->emitted_tokens";
      what = "emitted_tokens over draft_tokens";
      break;
    case Layout::kAcceptedOnOffsets:
      ab.draft_offsets = reinterpret_cast<const int32_t*>(put(0, batch.offsets.data(), 4 * size_t(R + 1)));
      accepted_at = 4 * size_t(pick % (R + 1));
      names[0] = "result->accepted_counts";
      what = "accepted_counts inside draft_offsets";
      break;
    case Layout::kNextShifted:
      ab.steps = reinterpret_cast<const uint64_t*>(put(0, steps.data(), 8 * size_t(R)));
      next_at = 8;
      refused = R >= 2;
      names[0] = "result->next_steps";
      what = "next_steps one entry after steps";
      break;
    case Layout::kAcceptedOnEmitted:
      emitted_at = 0;
      accepted_at = 4 * size_t(rows - 1);
      names[0] = "result->accepted_counts";
      names[1] = "result->emitted_tokens";
      what = "accepted_counts over the last entry of emitted_tokens";
      break;
    case Layout::kEmittedOnHidden: {
      // The target rows copied (same dtype and stride) to start inside
      // emitted_tokens' range.
      const size_t bytes = size_t((hidden_view.rows - 1) * hidden_view.row_stride + hidden_view.cols) *
                           dtype_bytes(batch.hidden.dtype);
      hidden_view.data = put(4 * size_t(pick % rows), batch.hidden.data(), bytes);
      ab.target_hidden = &hidden_view;
      emitted_at = 0;
      names[0] = "result->emitted_tokens";
      what = "emitted_tokens over target_hidden";
      break;
    }
    case Layout::kNextOnSeeds:
      ab.seeds = reinterpret_cast<const uint64_t*>(put(0, seeds.data(), 8 * size_t(R)));
      next_at = 0;
      names[0] = "result->next_steps";
      what = "next_steps over seeds";
      break;
    case Layout::kAcceptedOnTemps:
      ab.temperatures = reinterpret_cast<const float*>(put(0, temps.data(), 4 * size_t(R)));
      accepted_at = 0;
      names[0] = "result->accepted_counts";
      what = "accepted_counts over temperatures";
      break;
    default: {  // kEndToEnd
      ab.draft_tokens = reinterpret_cast<const int32_t*>(put(0, batch.tokens.data(), 4 * size_t(D)));
      emitted_at = 4 * size_t(D);
      accepted_at = emitted_at + 4 * size_t(rows);
      const size_t steps_at = (accepted_at + 4 * size_t(R) + 7) / 8 * 8;
      ab.steps = reinterpret_cast<const uint64_t*>(put(steps_at, steps.data(), 8 * size_t(R)));
      if (with_next) next_at = steps_at + 8 * size_t(R);
      refused = false;
      what = "arrays touching end to end";
      break;
    }
  }
  if (accepted_at != kOwn) res.accepted_counts = reinterpret_cast<int32_t*>(base + accepted_at);
  if (emitted_at != kOwn) res.emitted_tokens = reinterpret_cast<int32_t*>(base + emitted_at);
  if (next_at != kOwn) res.next_steps = reinterpret_cast<uint64_t*>(base + next_at);
  const std::vector<uint64_t> before = words;

  const flashspec_status s = call(&ab, &res);
  const char* message = flashspec_context_last_error(ctx);
  check_error_message(ctx, s, call_name);
  FS_CHECK(separate.guards(), "%s with %s wrote past an output array", call_name, what);
  if (refused) {
    FS_CHECK(s == FLASHSPEC_ERR_INVALID_ARGUMENT, "%s with %s gave %s, expected INVALID_ARGUMENT (%s)", call_name, what,
             name(s), message);
    FS_CHECK(std::strstr(message, names[0]) || (names[1] && std::strstr(message, names[1])),
             "%s refused %s without naming %s%s%s: %s", call_name, what, names[0], names[1] ? " or " : "",
             names[1] ? names[1] : "", message);
    FS_CHECK(words == before && separate.untouched(), "%s refused %s but wrote memory", call_name, what);
    return;
  }
  FS_CHECK(s == FLASHSPEC_OK, "%s with %s (allowed) failed with %s (%s)", call_name, what, name(s), message);
  // The outputs, and the shared memory as it must now be.
  std::vector<uint64_t> after = before;
  uint8_t* want = reinterpret_cast<uint8_t*>(after.data());
  Outcome got;
  for (int32_t r = 0; r < R; ++r) {
    int32_t v;
    if (accepted_at == kOwn) v = separate.accepted.get(size_t(r));
    else std::memcpy(&v, base + accepted_at + 4 * size_t(r), 4);
    got.accepted.push_back(v);
    if (accepted_at != kOwn) std::memcpy(want + accepted_at + 4 * size_t(r), &expected.accepted[size_t(r)], 4);
  }
  for (int32_t i = 0; i < rows; ++i) {
    int32_t v;
    if (emitted_at == kOwn) v = separate.emitted.get(size_t(i));
    else std::memcpy(&v, base + emitted_at + 4 * size_t(i), 4);
    got.emitted.push_back(v);
    if (emitted_at != kOwn) std::memcpy(want + emitted_at + 4 * size_t(i), &expected.emitted[size_t(i)], 4);
  }
  for (int32_t r = 0; r < R; ++r) {
    uint64_t v;
    if (next_at == kOwn) v = separate.next.get(size_t(r));
    else std::memcpy(&v, base + next_at + 8 * size_t(r), 8);
    got.next.push_back(v);
    if (next_at != kOwn) std::memcpy(want + next_at + 8 * size_t(r), &expected.next[size_t(r)], 8);
  }
  if (!with_next) got.next.clear();
  const std::string label = std::string(call_name) + " with " + what + " vs. separate arrays";
  same(expected, got, label.c_str());
  FS_CHECK(words == after, "%s with %s: memory other than the outputs changed, or an output holds other values",
           call_name, what);
}

// Which planted argument, and on which path.
enum Plant : uint8_t {
  kCtxNull, kHeadNull, kBatchNull, kStructSize, kMemoryCuda, kMemoryUnknown, kRequestsZero, kRequestsOverCtx,
  kOffsetsNull, kTokensNull, kHiddenNull, kHiddenDataNull, kHiddenDtype, kHiddenMemory, kHiddenRows, kHiddenCols,
  kHiddenStride, kOffsetZero, kOffsetsDecrease, kMaxDraftLen, kTokenRange, kTemperature, kDraftTemperature,
  kUniform, kLogitsDtype, kLogitsRows, kLogitsCols, kLogitsMemory, kLogitsDataNull, kHiddenNaN, kLogitsNaN,
  kCtxMaxRows, kSummariesRows, kSummariesRequests, kResultNull, kResultStructSize, kResultMemory,
  kAcceptedNull, kEmittedNull, kSummariesNull, kPlantCount
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  const uint64_t ctx_seed = in.u64();
  const int32_t threads_a = int32_t(in.range(0, 3));
  const int32_t threads_b = int32_t(in.range(0, 3));
  const int64_t vocab = in.range(1, kMaxVocab);
  const int64_t d = in.range(1, kMaxHidden);
  const MatrixSpec w_spec = read_matrix_spec(in, true);
  const MatrixSpec h_spec = read_matrix_spec(in, true);

  Batch batch;
  batch.requests = int32_t(in.range(1, kMaxRequests));
  batch.offsets.assign(1, 0);
  for (int32_t r = 0; r < batch.requests; ++r) batch.offsets.push_back(batch.offsets.back() + int32_t(in.u8() % (kMaxDrafts + 1)));
  const int32_t total_drafts = batch.total_drafts();
  const int32_t total_rows = batch.total_rows();
  int32_t longest = 0;
  for (int32_t r = 0; r < batch.requests; ++r) longest = std::max(longest, batch.n(r));

  HostMatrix w;
  build(w, w_spec, vocab, d);
  build(batch.hidden, h_spec, total_rows, d);
  batch.refresh_views();
  std::vector<RowLogits> target(static_cast<size_t>(total_rows));
  for (int32_t i = 0; i < total_rows; ++i) target[size_t(i)] = row_logits(w, batch.hidden, i);

  // Drafts: the rows' (approximate) argmax, so greedy drafts get accepted,
  // or random tokens.
  const uint8_t token_mode = in.u8();
  Rng token_rng(in.u64());
  batch.tokens.resize(size_t(total_drafts));
  for (int32_t r = 0; r < batch.requests; ++r)
    for (int32_t j = 0; j < batch.n(r); ++j) {
      const RowLogits& l = target[size_t(batch.first_row(r) + j)];
      int32_t best = 0;
      for (int64_t v = 1; v < vocab; ++v)
        if (l.logit[size_t(v)] > l.logit[size_t(best)]) best = int32_t(v);
      const bool oracle = token_mode < 128 || (token_mode < 192 && token_rng.below(2));
      batch.tokens[size_t(batch.offsets[size_t(r)] + j)] = oracle ? best : int32_t(token_rng.below(vocab));
    }
  batch.null_tokens_when_empty = !(token_mode & 1);

  // Stochastic drafts: logits rows equal to the target's (q ≈ p) or random.
  const uint8_t stochastic_mode = in.u8();
  batch.stochastic = stochastic_mode & 1;
  const MatrixSpec q_spec = read_matrix_spec(in, true);
  build(batch.logits, q_spec, total_drafts, vocab);
  if (batch.stochastic && stochastic_mode < 128) {
    for (int32_t r = 0; r < batch.requests; ++r)
      for (int32_t j = 0; j < batch.n(r); ++j)
        for (int64_t v = 0; v < vocab; ++v)
          batch.logits.set(batch.offsets[size_t(r)] + j, v,
                           float(target[size_t(batch.first_row(r) + j)].logit[size_t(v)]));
  }

  // Per-request arrays.
  const uint8_t arrays = in.u8();
  batch.has_temps = arrays & 1;
  batch.has_dtemps = arrays & 2;
  batch.has_seeds = arrays & 4;
  batch.has_ids = arrays & 8;
  batch.has_steps = arrays & 16;
  batch.has_uniforms = arrays & 32;
  for (int32_t r = 0; r < batch.requests; ++r) {
    batch.temps.push_back(read_temperature(in, 0.0f));
    batch.dtemps.push_back(read_temperature(in, 1.0f));
    batch.seeds.push_back(in.u64());
    batch.ids.push_back(in.u64());
    batch.steps.push_back(in.u8() == 255 ? ~uint64_t(0) : in.u64());
  }
  for (int32_t k = 0; k < total_drafts; ++k) {
    const uint8_t u = in.u8();
    float value;
    switch (u) {
      case 0: value = 0.5f; break;
      case 1: value = 0.0f; break;
      case 2: value = 1.0f; break;
      case 3: value = kNaN; break;
      case 4: value = -0.25f; break;
      case 5: value = 1.5f; break;
      case 6: value = std::numeric_limits<float>::denorm_min(); break;
      case 7: value = 0.999999940395f; break;
      default: value = (float(u) + 0.5f) / 256.0f; break;
    }
    batch.uniforms.push_back(value);
  }
  const uint8_t mdl = in.u8();
  batch.max_draft_len = mdl < 128 ? 0 : int32_t(std::max(longest, 1) + mdl % 8);
  const uint8_t out_mode = in.u8();
  const bool with_next = !(out_mode & 1);
  // Aliasing checked after the first call succeeds: 0 none, 1 next_steps on
  // batch.steps, 2 emitted_tokens on draft_tokens, 3 another layout
  // (out_mode >> 4, see check_aliasing).
  const int alias_kind = (out_mode >> 1) & 3;
  const bool share_head = out_mode & 8;
  const uint8_t extra_rows = in.u8() % 4, extra_requests = in.u8() % 3;
  const uint8_t mismatch_kind = in.u8();
  const uint8_t follow_up = in.u8();

  // Plants.
  bool plant[kPlantCount] = {};
  const int plants = in.u8() < 160 ? 0 : 1 + in.pick(2);
  for (int k = 0; k < plants; ++k) plant[in.u8() % kPlantCount] = true;

  Expect both;  // for verify_and_finalize (A) and verify + finalize (B)
  Expect vf;    // B only

  // Contexts.
  const int32_t ctx_max_rows = plant[kCtxMaxRows] && total_rows > 1 ? total_rows - 1 : total_rows + int32_t(extra_rows);
  const int32_t ctx_max_requests =
      plant[kRequestsOverCtx] && batch.requests > 1 ? batch.requests - 1 : batch.requests + int32_t(extra_requests);
  if (plant[kCtxMaxRows] && total_rows > 1)
    both.violate(FLASHSPEC_ERR_WORKSPACE_EXCEEDED, "more rows than the context's max_rows");
  if (plant[kRequestsOverCtx] && batch.requests > 1)
    both.violate(FLASHSPEC_ERR_WORKSPACE_EXCEEDED, "more requests than the context's max_requests");
  Context a(make_context(ctx_seed, threads_a, ctx_max_rows, ctx_max_requests));
  Context b(make_context(ctx_seed, threads_b, ctx_max_rows, ctx_max_requests));
  Head head_a, head_b;
  {
    const flashspec_tensor wt = w.view();
    const flashspec_status s = flashspec_lm_head_create(a.p, &wt, FLASHSPEC_LM_HEAD_COPY, &head_a.p);
    check_error_message(a.p, s, "flashspec_lm_head_create");
    // Alignment is checked before any value is read.
    if (w.misaligned()) {
      FS_CHECK(s == FLASHSPEC_ERR_UNSUPPORTED, "LM head with data misaligned by %zu bytes (dtype %d): got %s", w.offset,
               int(w.dtype), name(s));
      return 0;
    }
    if (!w.all_finite()) {
      FS_CHECK(s == FLASHSPEC_ERR_NON_FINITE, "LM head with a non-finite weight: got %s", name(s));
      return 0;
    }
    FS_CHECK(s == FLASHSPEC_OK, "a valid LM head was refused: %s (%s)", name(s), flashspec_context_last_error(a.p));
    if (!share_head) head_b.p = make_head(b.p, w);
  }
  const flashspec_lm_head* hb = share_head ? head_a.p : head_b.p;

  // Summaries for B.
  Summaries summaries;
  {
    int32_t rows = total_rows + int32_t(extra_rows), reqs = batch.requests;
    if (plant[kSummariesRows] && total_rows > 1) {
      rows = total_rows - 1;
      vf.violate(FLASHSPEC_ERR_WORKSPACE_EXCEEDED, "summaries hold fewer rows");
    }
    if (plant[kSummariesRequests] && batch.requests > 1) {
      reqs = batch.requests - 1;
      vf.violate(FLASHSPEC_ERR_WORKSPACE_EXCEEDED, "summaries hold fewer requests");
    }
    reqs = std::min(reqs, rows);
    if (reqs < batch.requests && !(plant[kSummariesRequests] && batch.requests > 1))
      vf.violate(FLASHSPEC_ERR_WORKSPACE_EXCEEDED, "summaries hold fewer requests");
    Guarded<flashspec_summaries*> out(1);
    out.poison();
    const flashspec_status s = flashspec_summaries_create(b.p, rows, reqs, out.data());
    FS_CHECK(s == FLASHSPEC_OK, "flashspec_summaries_create(%d, %d) failed: %s (%s)", rows, reqs, name(s),
             flashspec_context_last_error(b.p));
    FS_CHECK(out.guards_intact(), "flashspec_summaries_create wrote past *out");
    summaries.p = out.get(0);
  }

  // Apply the plants to a copy of the batch: the arrays the calls see.
  Batch bad = batch;
  bad.refresh_views();
  uint32_t struct_size = sizeof(flashspec_verify_batch);
  int32_t memory = FLASHSPEC_MEMORY_HOST, num_requests = batch.requests, max_draft_len = batch.max_draft_len;
  bool offsets_null = false, tokens_null = false, hidden_null = false;
  bool batch_null = false, head_null = false, ctx_null = false, summaries_null = false, result_null = false;
  bool accepted_null = false, emitted_null = false;
  int32_t result_struct_delta = 0, result_memory = FLASHSPEC_MEMORY_HOST;
  if (plant[kCtxNull]) ctx_null = true, both.violate(FLASHSPEC_ERR_NULL_POINTER, "ctx NULL");
  if (plant[kHeadNull]) head_null = true, both.violate(FLASHSPEC_ERR_NULL_POINTER, "head NULL");
  if (plant[kBatchNull]) batch_null = true, both.violate(FLASHSPEC_ERR_NULL_POINTER, "batch NULL");
  if (plant[kSummariesNull]) summaries_null = true, vf.violate(FLASHSPEC_ERR_NULL_POINTER, "summaries NULL");
  if (plant[kResultNull]) result_null = true, both.violate(FLASHSPEC_ERR_NULL_POINTER, "result NULL");
  if (plant[kResultStructSize]) result_struct_delta = 8, both.violate(FLASHSPEC_ERR_STRUCT_SIZE, "result->struct_size");
  if (plant[kResultMemory]) result_memory = FLASHSPEC_MEMORY_CUDA, both.violate(FLASHSPEC_ERR_DEVICE_MISMATCH, "result in CUDA memory");
  if (plant[kAcceptedNull]) accepted_null = true, both.violate(FLASHSPEC_ERR_NULL_POINTER, "accepted_counts NULL");
  if (plant[kEmittedNull]) emitted_null = true, both.violate(FLASHSPEC_ERR_NULL_POINTER, "emitted_tokens NULL");
  if (plant[kStructSize]) struct_size += (in.u8() & 1) ? 8 : -4;
  if (!accepted_struct_size<flashspec_verify_batch>(struct_size))
    both.violate(FLASHSPEC_ERR_STRUCT_SIZE, "batch->struct_size");
  if (plant[kMemoryCuda]) memory = FLASHSPEC_MEMORY_CUDA, both.violate(FLASHSPEC_ERR_DEVICE_MISMATCH, "batch memory CUDA");
  else if (plant[kMemoryUnknown]) memory = in.u8() & 1 ? -1 : 2, both.violate(FLASHSPEC_ERR_INVALID_ARGUMENT, "batch memory unknown");
  if (plant[kRequestsZero]) num_requests = -int32_t(in.u8() % 2), both.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "num_requests < 1");
  if (plant[kOffsetsNull]) offsets_null = true, both.violate(FLASHSPEC_ERR_NULL_POINTER, "draft_offsets NULL");
  if (plant[kTokensNull] && total_drafts > 0) tokens_null = true, both.violate(FLASHSPEC_ERR_NULL_POINTER, "draft_tokens NULL");
  if (plant[kHiddenNull]) hidden_null = true, both.violate(FLASHSPEC_ERR_NULL_POINTER, "target_hidden NULL");
  if (plant[kHiddenDataNull]) bad.hv.data = nullptr, both.violate(FLASHSPEC_ERR_NULL_POINTER, "target_hidden->data NULL");
  if (plant[kHiddenDtype]) set_raw(bad.hv.dtype, in.u8() & 1 ? -1 : 3), both.violate(FLASHSPEC_ERR_DTYPE_MISMATCH, "target_hidden dtype unknown");
  if (plant[kHiddenMemory]) bad.hv.memory = FLASHSPEC_MEMORY_CUDA, both.violate(FLASHSPEC_ERR_DEVICE_MISMATCH, "target_hidden in CUDA memory");
  if (plant[kHiddenRows]) {
    bad.hv.rows += (in.u8() & 1) ? 1 : -1;
    both.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "target_hidden rows != draft_offsets[R] + R");
    // More rows than the offsets give imply drafts: a NULL draft_tokens may
    // be named instead.
    if (bad.hv.rows > total_rows && total_drafts == 0) both.allow(FLASHSPEC_ERR_NULL_POINTER);
  }
  if (plant[kHiddenCols]) {
    bad.hv.cols = d + 1;
    bad.hv.row_stride = std::max(bad.hv.row_stride, bad.hv.cols);
    both.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "target_hidden cols != d");
  } else if (plant[kHiddenStride] && d > 1) {
    bad.hv.row_stride = d - 1;
    both.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "target_hidden row_stride < cols");
  }
  if (plant[kOffsetZero]) {
    bad.offsets[0] = (in.u8() & 1) ? 1 : -1;
    both.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "draft_offsets[0] != 0");
  } else if (plant[kOffsetsDecrease] && batch.requests > 1 && batch.n(0) > 0) {
    bad.offsets[1] = bad.offsets[2] + 1;  // request 0 grows, request 1 goes negative
    both.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "draft_offsets decrease");
  }
  if (plant[kMaxDraftLen]) {
    const uint8_t k = in.u8() % 3;
    if (k == 0 && longest >= 2) max_draft_len = longest - 1;
    else if (k == 1) max_draft_len = FLASHSPEC_MAX_DRAFT_LEN + 1;
    else max_draft_len = -1 - in.u8();
    if (max_draft_len != batch.max_draft_len)
      both.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "a request has more drafts than max_draft_len, or it is out of range");
  }
  if (plant[kTokenRange] && total_drafts > 0) {
    static const int32_t bad_tokens[] = {-1, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
    const uint8_t k = in.u8() % 4;
    const int64_t at = in.range(0, total_drafts - 1);
    bad.tokens[size_t(at)] = k == 3 ? int32_t(vocab) : bad_tokens[k];
    both.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "a draft token outside [0, V)");
  }
  if (plant[kTemperature]) {
    bad.has_temps = true;
    static const float bad_t[] = {-1.0f, kNaN, INFINITY, -INFINITY};
    const int64_t r = in.range(0, batch.requests - 1);
    bad.temps[size_t(r)] = bad_t[in.u8() % 4];
  }
  if (plant[kDraftTemperature]) {
    bad.has_dtemps = true;
    static const float bad_td[] = {0.0f, -0.0f, -1.0f, kNaN, INFINITY};
    const int64_t r = in.range(0, batch.requests - 1);
    bad.dtemps[size_t(r)] = bad_td[in.u8() % 5];
  }
  if (plant[kUniform] && total_drafts > 0) {
    bad.has_uniforms = true;
    static const float bad_u[] = {0.0f, 1.0f, kNaN, -0.5f, 2.0f, INFINITY};
    const int64_t k = in.range(0, total_drafts - 1);
    bad.uniforms[size_t(k)] = bad_u[in.u8() % 6];
  }
  // Values the library reads decide these, whoever set them.
  if (bad.has_temps)
    for (int32_t r = 0; r < batch.requests; ++r)
      if (!valid_temperature(bad.temps[size_t(r)])) both.violate(FLASHSPEC_ERR_INVALID_ARGUMENT, "a temperature < 0, NaN or Inf");
  if (bad.has_dtemps)
    for (int32_t r = 0; r < batch.requests; ++r)
      if (!valid_draft_temperature(bad.dtemps[size_t(r)]))
        both.violate(FLASHSPEC_ERR_INVALID_ARGUMENT, "a draft temperature <= 0, NaN or Inf");
  if (bad.has_uniforms)
    for (int32_t k = 0; k < total_drafts; ++k)
      if (!(bad.uniforms[size_t(k)] > 0.0f && bad.uniforms[size_t(k)] < 1.0f))
        both.violate(FLASHSPEC_ERR_INVALID_ARGUMENT, "an acceptance uniform outside (0, 1)");
  if (batch.stochastic) {
    if (plant[kLogitsDtype]) set_raw(bad.lv.dtype, 7), both.violate(FLASHSPEC_ERR_DTYPE_MISMATCH, "draft_logits dtype unknown");
    if (plant[kLogitsRows]) bad.lv.rows += 1, both.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "draft_logits rows != draft_offsets[R]");
    if (plant[kLogitsCols]) {
      bad.lv.cols = vocab + 1;
      bad.lv.row_stride = std::max(bad.lv.row_stride, bad.lv.cols);
      both.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "draft_logits cols != V");
    }
    if (plant[kLogitsMemory]) bad.lv.memory = FLASHSPEC_MEMORY_CUDA, both.violate(FLASHSPEC_ERR_DEVICE_MISMATCH, "draft_logits in CUDA memory");
    // A [0, V] view (a batch without drafts) has no element to read: its
    // data pointer, NULL or misaligned, is not looked at.
    if (plant[kLogitsDataNull]) {
      bad.lv.data = nullptr;
      if (bad.lv.rows != 0) both.violate(FLASHSPEC_ERR_NULL_POINTER, "draft_logits->data NULL");
    }
    if (bad.lv.rows != 0 && batch.logits.misaligned())
      both.violate(FLASHSPEC_ERR_UNSUPPORTED, "draft_logits data misaligned");
    if (plant[kLogitsNaN] && total_drafts > 0) plant_nonfinite(bad.logits, in);  // in place: views stay valid
    if (!bad.logits.all_finite()) both.violate(FLASHSPEC_ERR_NON_FINITE, "a non-finite draft logit");
  }
  if (plant[kHiddenNaN]) plant_nonfinite(bad.hidden, in);
  if (!bad.hidden.all_finite()) both.violate(FLASHSPEC_ERR_NON_FINITE, "a non-finite target hidden value");
  if (batch.hidden.misaligned()) both.violate(FLASHSPEC_ERR_UNSUPPORTED, "target_hidden data misaligned");
  flashspec_verify_batch vb = bad.make();
  vb.struct_size = struct_size;
  set_raw(vb.memory, memory);
  vb.num_requests = num_requests;
  vb.max_draft_len = max_draft_len;
  if (offsets_null) vb.draft_offsets = nullptr;
  if (tokens_null) vb.draft_tokens = nullptr;
  if (hidden_null) vb.target_hidden = nullptr;

  // Logit overflow (of the batch's own values: planted ones fail validation).
  {
    for (int32_t r = 0; r < batch.requests; ++r) {
      const float t = batch.t(r);
      const bool greedy = t == 0.0f;
      for (int32_t j = 0; j <= batch.n(r); ++j) {
        const Overflow o = logit_overflow(target[size_t(batch.first_row(r) + j)], greedy ? 1.0f : inverse(t), greedy);
        both.nonfinite(!o.never, o.surely,
                       "request " + std::to_string(r) + ": a target logit" + (greedy ? "" : " divided by T"));
      }
      if (batch.stochastic) {
        const float inv_td = inverse(batch.td(r));
        double zmax = 0.0;
        for (int32_t j = 0; j < batch.n(r); ++j)
          for (int64_t v = 0; v < vocab; ++v)
            zmax = std::max(zmax, double(std::fabs(batch.logits.at(batch.offsets[size_t(r)] + j, v))));
        const double big = double(std::numeric_limits<float>::max());
        const bool surely = batch.n(r) > 0 && (std::isinf(inv_td) || zmax * double(inv_td) > big * 1.01);
        const bool possible = batch.n(r) > 0 && (std::isinf(inv_td) || zmax * double(inv_td) >= big * 0.99);
        // At T = 0 acceptance does not use q: overflow there may pass.
        both.nonfinite(possible, surely && !greedy,
                       "request " + std::to_string(r) + ": a draft logit divided by the draft temperature (T_d = " +
                           std::to_string(batch.td(r)) + ")");
      }
    }
  }

  // ---- verify_and_finalize on A ------------------------------------------
  Result ra(batch.requests, total_rows, with_next);
  flashspec_verify_result res_a = ra.make();
  res_a.struct_size += uint32_t(result_struct_delta);
  set_raw(res_a.memory, result_memory);
  if (accepted_null) res_a.accepted_counts = nullptr;
  if (emitted_null) res_a.emitted_tokens = nullptr;
  const flashspec_status s_a = flashspec_verify_and_finalize(ctx_null ? nullptr : a.p, head_null ? nullptr : head_a.p,
                                                             batch_null ? nullptr : &vb, result_null ? nullptr : &res_a);
  const flashspec_context* msg_a = ctx_null ? nullptr : a.p;
  check_error_message(msg_a, s_a, "flashspec_verify_and_finalize");
  both.check(s_a, "flashspec_verify_and_finalize", flashspec_context_last_error(msg_a));
  FS_CHECK(ra.guards(), "flashspec_verify_and_finalize wrote past an output array");
  if (s_a != FLASHSPEC_OK)
    FS_CHECK(ra.untouched(), "flashspec_verify_and_finalize failed with %s but wrote an output", name(s_a));

  // ---- verify + finalize on B ---------------------------------------------
  Result rb(batch.requests, total_rows, with_next);
  flashspec_verify_result res_b = rb.make();
  res_b.struct_size += uint32_t(result_struct_delta);
  set_raw(res_b.memory, result_memory);
  if (accepted_null) res_b.accepted_counts = nullptr;
  if (emitted_null) res_b.emitted_tokens = nullptr;
  flashspec_context* cb = ctx_null ? nullptr : b.p;
  const flashspec_verify_batch* vbb = batch_null ? nullptr : &vb;
  flashspec_status s_b = flashspec_verify(cb, head_null ? nullptr : hb, vbb, summaries_null ? nullptr : summaries.p);
  check_error_message(cb, s_b, "flashspec_verify");
  const bool verified = s_b == FLASHSPEC_OK;
  if (verified) {
    s_b = flashspec_finalize(cb, vbb, summaries.p, result_null ? nullptr : &res_b);
    check_error_message(cb, s_b, "flashspec_finalize");
  }
  FS_CHECK(rb.guards(), "flashspec_finalize wrote past an output array");
  if (s_b != FLASHSPEC_OK) FS_CHECK(rb.untouched(), "verify + finalize failed with %s but wrote an output", name(s_b));
  // B has A's violations plus its own (summaries): compare the two paths.
  if (vf.valid()) {
    FS_CHECK((s_a == FLASHSPEC_OK) == (s_b == FLASHSPEC_OK),
             "verify_and_finalize gave %s, verify + finalize %s on the same batch", name(s_a), name(s_b));
    // The two validate the result at different points, so with a planted
    // result argument either may stop at a logit overflow first.
    const bool order = both.nonfinite_possible() && (s_a == FLASHSPEC_ERR_NON_FINITE || s_b == FLASHSPEC_ERR_NON_FINITE);
    if (both.count() <= 1 && s_a != FLASHSPEC_OK && !order)
      FS_CHECK(s_a == s_b, "verify_and_finalize gave %s, verify + finalize %s on the same batch", name(s_a), name(s_b));
  } else {
    FS_CHECK(s_b != FLASHSPEC_OK, "verify accepted summaries too small for the batch (%s)", vf.first().c_str());
    if (both.valid() && vf.count() == 1)
      FS_CHECK(s_b == FLASHSPEC_ERR_WORKSPACE_EXCEEDED || s_b == FLASHSPEC_ERR_NULL_POINTER,
               "verify with %s gave %s", vf.first().c_str(), name(s_b));
  }
  if (plant[kSummariesNull] && both.valid()) FS_CHECK(s_b == FLASHSPEC_ERR_NULL_POINTER, "verify with summaries NULL gave %s", name(s_b));
  if (s_a != FLASHSPEC_OK) return 0;

  // ---- A succeeded: the outputs ----------------------------------------------
  const Outcome out_a = read(ra.accepted, ra.emitted, with_next ? &ra.next : nullptr, batch.requests, total_rows);
  for (int32_t r = 0; r < batch.requests; ++r) {
    const int32_t n = batch.n(r), acc = out_a.accepted[size_t(r)], first = batch.first_row(r);
    FS_CHECK(acc >= 0 && acc <= n, "request %d: accepted count %d outside [0, %d]", r, acc, n);
    for (int32_t j = 0; j < acc; ++j)
      FS_CHECK(out_a.emitted[size_t(first + j)] == batch.tokens[size_t(batch.offsets[size_t(r)] + j)],
               "request %d: emitted token %d is %d, but the accepted draft is %d", r, j,
               out_a.emitted[size_t(first + j)], batch.tokens[size_t(batch.offsets[size_t(r)] + j)]);
    const int32_t next = out_a.emitted[size_t(first + acc)];
    FS_CHECK(next >= 0 && next < vocab, "request %d: emitted token %d (after %d accepted) is %d, outside [0, %lld)",
             r, acc, acc, next, (long long)vocab);
    for (int32_t j = acc + 1; j <= n; ++j)
      FS_CHECK(out_a.emitted[size_t(first + j)] == -1, "request %d: emitted slot %d is %d, expected -1", r, j,
               out_a.emitted[size_t(first + j)]);
    if (with_next)
      FS_CHECK(out_a.next[size_t(r)] == batch.step(r) + 1, "request %d: next_steps %llu, expected steps + 1 = %llu",
               r, (unsigned long long)out_a.next[size_t(r)], (unsigned long long)(batch.step(r) + 1));
  }
  if (!with_next) FS_CHECK(ra.next.untouched(), "next_steps written although NULL");

  // ---- aliasing, verify_and_finalize on A ------------------------------------
  const Layout layout = layout_for(alias_kind, out_mode);
  const uint8_t alias_pick = in.u8();
  check_aliasing(layout, alias_pick, batch, vb, ctx_seed, with_next, out_a, "flashspec_verify_and_finalize", a.p,
                 [&](const flashspec_verify_batch* ab, const flashspec_verify_result* res) {
                   return flashspec_verify_and_finalize(a.p, head_a.p, ab, res);
                 });

  // ---- B ≡ A ----------------------------------------------------------------
  if (vf.valid()) {
    FS_CHECK(s_b == FLASHSPEC_OK, "verify + finalize failed (%s) where verify_and_finalize succeeded", name(s_b));
    const Outcome out_b = read(rb.accepted, rb.emitted, with_next ? &rb.next : nullptr, batch.requests, total_rows);
    same(out_b, out_a, "verify_and_finalize (context A) vs. verify + finalize (context B, other thread count)");

    // finalize refuses another batch than the one verified.
    Batch other = batch;
    const char* changed = nullptr;
    switch (mismatch_kind % 7) {
      case 0:
        if (total_drafts > 0 && vocab > 1) {
          const int32_t k = int32_t(in.range(0, total_drafts - 1));
          other.tokens[size_t(k)] = int32_t((other.tokens[size_t(k)] + 1) % vocab);
          changed = "a draft token";
        }
        break;
      case 1:
        if (batch.requests > 1) {
          // Move a draft from one request to a neighbour: same shape.
          for (int32_t r = 0; r + 1 < batch.requests && !changed; ++r)
            if (batch.n(r) > 0) {
              other.offsets[size_t(r + 1)] -= 1;
              changed = "the draft offsets";
            } else if (batch.n(r + 1) > 0) {
              other.offsets[size_t(r + 1)] += 1;
              changed = "the draft offsets";
            }
        }
        break;
      case 2: {
        const int32_t r = int32_t(in.range(0, batch.requests - 1));
        other.has_temps = true;
        for (int32_t q = 0; q < batch.requests; ++q) other.temps[size_t(q)] = batch.t(q);
        other.temps[size_t(r)] = batch.t(r) == 1.0f ? 2.0f : 1.0f;
        changed = "a temperature";
        break;
      }
      case 3: {
        const int32_t r = int32_t(in.range(0, batch.requests - 1));
        other.has_seeds = true;
        for (int32_t q = 0; q < batch.requests; ++q) other.seeds[size_t(q)] = batch.seed(q, ctx_seed);
        other.seeds[size_t(r)] += 1;
        changed = "a seed";
        break;
      }
      case 4: {
        const int32_t r = int32_t(in.range(0, batch.requests - 1));
        other.has_ids = true;
        for (int32_t q = 0; q < batch.requests; ++q) other.ids[size_t(q)] = batch.id(q);
        other.ids[size_t(r)] ^= 1;
        changed = "a request id";
        break;
      }
      case 5: {
        const int32_t r = int32_t(in.range(0, batch.requests - 1));
        other.has_steps = true;
        for (int32_t q = 0; q < batch.requests; ++q) other.steps[size_t(q)] = batch.step(q);
        other.steps[size_t(r)] += 1;
        changed = "a step";
        break;
      }
      default:
        break;
    }
    if (changed) {
      other.refresh_views();
      flashspec_verify_batch ob = other.make();
      bool within = true;
      for (int32_t r = 0; r < batch.requests; ++r)
        if (batch.max_draft_len > 0 && other.n(r) > batch.max_draft_len) within = false;
      Result rm(batch.requests, total_rows, with_next);
      flashspec_verify_result res_m = rm.make();
      const flashspec_status s = flashspec_finalize(b.p, &ob, summaries.p, &res_m);
      check_error_message(b.p, s, "flashspec_finalize (another batch)");
      FS_CHECK(s != FLASHSPEC_OK, "finalize accepted a batch with %s other than the one verified", changed);
      if (within)
        FS_CHECK(s == FLASHSPEC_ERR_INVALID_ARGUMENT,
                 "finalize of a batch with %s other than the one verified gave %s, expected INVALID_ARGUMENT (%s)",
                 changed, name(s), flashspec_context_last_error(b.p));
      FS_CHECK(rm.untouched() && rm.guards(), "finalize refused another batch (%s) but wrote an output", name(s));
    }

    // Aliasing, finalize on B: a refusal leaves the summaries (checked below).
    check_aliasing(layout, alias_pick, batch, vb, ctx_seed, with_next, out_a, "flashspec_finalize", b.p,
                   [&](const flashspec_verify_batch* ab, const flashspec_verify_result* res) {
                     return flashspec_finalize(b.p, ab, summaries.p, res);
                   });

    // A failed verify leaves the summaries describing the last good batch.
    if (follow_up & 1) {
      Batch broken = batch;
      broken.refresh_views();
      flashspec_verify_batch kb = broken.make();
      const char* how;
      if (total_drafts > 0 && (follow_up & 2)) {
        broken.tokens[0] = int32_t(vocab);
        kb = broken.make();
        how = "a token out of range";
      } else {
        broken.hidden.set(0, 0, kNaN);
        broken.refresh_views();
        kb = broken.make();
        how = "a NaN hidden value";
      }
      const flashspec_status s = flashspec_verify(b.p, hb, &kb, summaries.p);
      check_error_message(b.p, s, "flashspec_verify (broken batch)");
      FS_CHECK(s != FLASHSPEC_OK, "verify accepted a batch with %s", how);
    }
    // The verified batch still finalizes to the same outputs.
    {
      Result rr(batch.requests, total_rows, with_next);
      flashspec_verify_result res_r = rr.make();
      const flashspec_status s = flashspec_finalize(b.p, &vb, summaries.p, &res_r);
      FS_CHECK(s == FLASHSPEC_OK, "finalize of the verified batch failed after a refused call: %s (%s)", name(s),
               flashspec_context_last_error(b.p));
      same(out_a, read(rr.accepted, rr.emitted, with_next ? &rr.next : nullptr, batch.requests, total_rows),
           "finalize again after a refused finalize / failed verify");
    }
    // Summaries never verified describe no batch.
    if (follow_up & 4) {
      Summaries fresh;
      FS_CHECK(flashspec_summaries_create(b.p, total_rows, batch.requests, &fresh.p) == FLASHSPEC_OK,
               "summaries_create failed");
      Result rf(batch.requests, total_rows, with_next);
      flashspec_verify_result res_f = rf.make();
      const flashspec_status s = flashspec_finalize(b.p, &vb, fresh.p, &res_f);
      check_error_message(b.p, s, "flashspec_finalize (never verified)");
      FS_CHECK(s == FLASHSPEC_ERR_INVALID_ARGUMENT, "finalize on summaries never verified gave %s", name(s));
      FS_CHECK(rf.untouched() && rf.guards(), "finalize on summaries never verified wrote an output");
    }
  }

  // ---- T = 0: the greedy tokens of flashspec_draft ---------------------------
  {
    flashspec_tensor all = batch.hidden.view();
    Guarded<int32_t> greedy(static_cast<size_t>(total_rows));
    greedy.poison();
    const flashspec_status s = flashspec_draft(b.p, hb, &all, nullptr, greedy.data(), nullptr);
    FS_CHECK(s == FLASHSPEC_OK, "greedy draft over the batch's rows failed: %s (%s)", name(s),
             flashspec_context_last_error(b.p));
    for (int32_t r = 0; r < batch.requests; ++r) {
      if (batch.t(r) != 0.0f) continue;
      const int32_t first = batch.first_row(r), acc = out_a.accepted[size_t(r)];
      int32_t prefix = 0;
      while (prefix < batch.n(r) && batch.tokens[size_t(batch.offsets[size_t(r)] + prefix)] == greedy.get(size_t(first + prefix)))
        ++prefix;
      FS_CHECK(acc == prefix, "request %d at T = 0: accepted %d drafts, but the drafts equal the greedy tokens for %d",
               r, acc, prefix);
      const int32_t x = out_a.emitted[size_t(first + acc)];
      FS_CHECK(x == greedy.get(size_t(first + acc)),
               "request %d at T = 0: emitted %d after %d accepted, the greedy token of that row is %d", r, x, acc,
               greedy.get(size_t(first + acc)));
      const RowLogits& l = target[size_t(first + acc)];
      for (int64_t v = 0; v < vocab; ++v)
        FS_CHECK(l.logit[size_t(x)] + l.bound[size_t(x)] >= l.logit[size_t(v)] - l.bound[size_t(v)],
                 "request %d at T = 0: token %d is not the argmax of its row (token %lld: %.9g > %.9g)", r, x,
                 (long long)v, l.logit[size_t(v)], l.logit[size_t(x)]);
      FS_CHECK(smaller_duplicate(w, x) < 0, "request %d at T = 0: token %d chosen over an equal smaller id", r, x);
    }
  }

  // ---- each request alone --------------------------------------------------
  if (follow_up & 8) {
    for (int32_t r = 0; r < batch.requests; ++r) {
      Batch one;
      one.requests = 1;
      const int32_t n = batch.n(r), first = batch.first_row(r);
      one.offsets = {0, n};
      one.tokens.assign(batch.tokens.begin() + batch.offsets[size_t(r)], batch.tokens.begin() + batch.offsets[size_t(r)] + n);
      one.hidden.init(batch.hidden.dtype, n + 1, d, 0, batch.hidden.offset);
      for (int32_t j = 0; j <= n; ++j)
        for (int64_t c = 0; c < d; ++c) one.hidden.set(j, c, batch.hidden.at(first + j, c));
      one.stochastic = batch.stochastic;
      one.logits.init(batch.logits.dtype, n, vocab, 0, batch.logits.offset);
      for (int32_t j = 0; j < n; ++j)
        for (int64_t v = 0; v < vocab; ++v) one.logits.set(j, v, batch.logits.at(batch.offsets[size_t(r)] + j, v));
      one.has_temps = one.has_dtemps = one.has_seeds = one.has_ids = one.has_steps = true;
      one.temps = {batch.t(r)};
      one.dtemps = {batch.td(r)};
      one.seeds = {batch.seed(r, ctx_seed)};
      one.ids = {batch.id(r)};
      one.steps = {batch.step(r)};
      one.has_uniforms = batch.has_uniforms;
      if (batch.has_uniforms)
        one.uniforms.assign(batch.uniforms.begin() + batch.offsets[size_t(r)], batch.uniforms.begin() + batch.offsets[size_t(r)] + n);
      one.max_draft_len = 0;
      one.refresh_views();
      flashspec_verify_batch ob = one.make();
      Result ro(1, n + 1, true);
      flashspec_verify_result res_o = ro.make();
      const flashspec_status s = flashspec_verify_and_finalize(b.p, hb, &ob, &res_o);
      FS_CHECK(s == FLASHSPEC_OK, "request %d verified alone failed: %s (%s)", r, name(s),
               flashspec_context_last_error(b.p));
      FS_CHECK(ro.accepted.get(0) == out_a.accepted[size_t(r)], "request %d verified alone accepted %d, in the batch %d",
               r, ro.accepted.get(0), out_a.accepted[size_t(r)]);
      for (int32_t j = 0; j <= n; ++j)
        FS_CHECK(ro.emitted.get(size_t(j)) == out_a.emitted[size_t(first + j)],
                 "request %d verified alone: emitted slot %d is %d, in the batch %d", r, j, ro.emitted.get(size_t(j)),
                 out_a.emitted[size_t(first + j)]);
    }
  }
  return 0;
}
