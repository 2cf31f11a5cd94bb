// Fuzzes what verify takes beyond plain temperature: sampling controls (top-k,
// top-p, min-p, logit bias with a repetition penalty, per-row token masks,
// typical acceptance), logprob outputs, tree verify (draft_parents) and
// vocabulary shards (flashspec_verify_shard + flashspec_finalize_shards), on
// ragged host batches (CPU backend, V ≤ 48, d ≤ 6, R ≤ 4 requests of 0..5
// drafts), with planted invalid values.
//
// Invariants:
//   - a planted invalid value (k < 1 or 1024 < k < V, p outside (0, 1],
//     min-p outside [0, 1], a bias token outside [0, V), a non-finite bias,
//     a repetition penalty ≤ 0 or infinite, a mask row allowing nothing, a
//     wrong mask_words, bad parents, logprobs ∉ {0, 1}, top_logprobs outside
//     [0, 20], typical acceptance with a tree, a draft token outside [0, V))
//     makes the call fail; a batch without one succeeds;
//   - an error leaves every output untouched and a message; no output is
//     written past its documented size (guard words);
//   - on success, per request: accepted in [0, n]; a chain's emitted tokens
//     start with its first `accepted` drafts; a tree's accepted_nodes are a
//     path from the root whose tokens are the emitted ones; the last token is
//     in [0, V) and allowed by the mask of the row that drew it; −1 after;
//     logprobs ≤ 0 and finite on emitted slots, NaN after; top tokens
//     distinct, in range, by non-increasing raw logprob;
//   - a shardable batch (no controls, no logprobs) verified in 1..3 shards
//     cut anywhere gives the unsharded tokens wherever the acceptance test
//     did not decide differently (T = 0 requests entirely).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "fuzz_common.h"

using namespace fsfuzz;

namespace {

constexpr int64_t kMaxVocab = 48;
constexpr int64_t kMaxHidden = 6;
constexpr int32_t kMaxRequests = 4;
constexpr int32_t kMaxDrafts = 5;
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

struct Batch {
  int64_t vocab = 1, hidden = 1;
  int32_t requests = 1;
  std::vector<float> weight, rows;
  std::vector<int32_t> offsets, tokens, parents;
  std::vector<float> temperatures;
  bool tree = false;
  bool must_fail = false;
};

float pick_float(Input& in, std::initializer_list<float> values) {
  const int i = in.pick(int(values.size()) + 1);
  if (i == int(values.size())) return in.f32();
  return *(values.begin() + i);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  Batch b;
  Rng rng(in.u64());
  b.vocab = in.range(1, kMaxVocab);
  b.hidden = in.range(1, kMaxHidden);
  b.requests = int32_t(in.range(1, kMaxRequests));
  b.tree = in.chance(96);
  b.offsets.push_back(0);
  for (int32_t r = 0; r < b.requests; ++r) {
    const int32_t n = int32_t(in.range(0, kMaxDrafts));
    for (int32_t k = 0; k < n; ++k) {
      int32_t token = int32_t(in.range(0, b.vocab - 1));
      if (in.chance(4)) {
        token = in.chance(128) ? -1 : int32_t(b.vocab);
        b.must_fail = true;
      }
      b.tokens.push_back(token);
      int32_t parent = int32_t(in.range(-1, k - 1));
      if (b.tree && in.chance(4)) {
        parent = in.chance(128) ? k : -2;
        b.must_fail = true;
      }
      b.parents.push_back(parent);
    }
    b.offsets.push_back(int32_t(b.tokens.size()));
    b.temperatures.push_back(pick_float(in, {0.0f, 0.5f, 1.0f, 2.0f}));
  }
  for (float t : b.temperatures)
    if (!(t >= 0.0f) || !std::isfinite(t)) b.must_fail = true;
  const bool small_t = std::any_of(b.temperatures.begin(), b.temperatures.end(),
                                   [](float t) { return t > 0.0f && t < 0.05f; });
  const int32_t total_rows = b.offsets.back() + b.requests;
  b.weight.resize(size_t(b.vocab * b.hidden));
  for (float& w : b.weight) w = float(rng.normal());
  b.rows.resize(size_t(total_rows * b.hidden));
  for (float& h : b.rows) h = float(rng.normal());

  // Controls.
  const bool with_controls = in.chance(160);
  std::vector<int32_t> top_k(size_t(b.requests)), bias_offsets(1, 0), bias_tokens;
  std::vector<float> top_p(size_t(b.requests)), min_p(size_t(b.requests)), bias_values, repetition(size_t(b.requests)),
      typical_epsilon(size_t(b.requests), 0.0f);
  const int32_t words = int32_t((b.vocab + 31) / 32);
  std::vector<uint32_t> mask(size_t(total_rows * words), 0xffffffffu);
  flashspec_sampling_controls controls;
  flashspec_sampling_controls_init(&controls);
  bool typical = false, masked = false;
  if (with_controls) {
    for (int32_t r = 0; r < b.requests; ++r) {
      const int32_t options[] = {FLASHSPEC_TOP_K_ALL, 1, 3, int32_t(b.vocab), 0, -1, 1025, int32_t(in.u32())};
      top_k[size_t(r)] = options[in.pick(8)];
      const int32_t k = top_k[size_t(r)];
      if (k < 1 || (k > FLASHSPEC_MAX_TOP_K && k < b.vocab)) b.must_fail = true;
      top_p[size_t(r)] = pick_float(in, {1.0f, 0.9f, 0.3f, 0.0f, 1.5f, kNaN});
      if (!(top_p[size_t(r)] > 0.0f && top_p[size_t(r)] <= 1.0f)) b.must_fail = true;
      min_p[size_t(r)] = pick_float(in, {0.0f, 0.1f, 1.0f, -0.1f, 1.1f, kNaN});
      if (!(min_p[size_t(r)] >= 0.0f && min_p[size_t(r)] <= 1.0f)) b.must_fail = true;
      repetition[size_t(r)] = pick_float(in, {1.0f, 1.3f, 0.5f, 0.0f, kInf});
      if (!(repetition[size_t(r)] > 0.0f && std::isfinite(repetition[size_t(r)]))) b.must_fail = true;
      const int32_t entries = int32_t(in.range(0, 3));
      for (int32_t e = 0; e < entries; ++e) {
        int32_t token = int32_t(in.range(0, b.vocab - 1));
        if (in.chance(6)) {
          token = int32_t(b.vocab) + int32_t(in.range(0, 3));
          b.must_fail = true;
        }
        float value = float(in.range(-40, 40)) / 8.0f;
        if (in.chance(6)) {
          value = in.chance(128) ? kNaN : -kInf;
          b.must_fail = true;
        }
        bias_tokens.push_back(token);
        bias_values.push_back(value);
      }
      bias_offsets.push_back(int32_t(bias_tokens.size()));
      if (in.chance(24)) {
        typical = true;
        typical_epsilon[size_t(r)] = float(in.range(1, 20)) / 20.0f;
      }
    }
    if (typical && b.tree && !b.parents.empty()) b.must_fail = true;
    masked = in.chance(128);
    if (masked) {
      for (int32_t row = 0; row < total_rows; ++row) {
        uint32_t* m = mask.data() + size_t(row) * size_t(words);
        for (int32_t w = 0; w < words; ++w) m[w] = in.u32() | uint32_t(rng.next());
        if (in.chance(6)) std::fill(m, m + words, 0u);
        // A row allowing nothing (bits past V do not count) must fail.
        bool any = false;
        for (int64_t t = 0; t < b.vocab; ++t) any = any || ((m[t >> 5] >> (t & 31)) & 1u);
        if (!any) b.must_fail = true;
      }
    }
    controls.top_k = top_k.data();
    controls.top_p = top_p.data();
    controls.min_p = min_p.data();
    controls.repetition_penalty = repetition.data();
    controls.bias_offsets = bias_offsets.data();
    controls.bias_tokens = bias_tokens.empty() ? nullptr : bias_tokens.data();
    controls.bias_values = bias_values.empty() ? nullptr : bias_values.data();
    controls.token_mask = masked ? mask.data() : nullptr;
    controls.mask_words = in.chance(8) ? words + 1 : (in.chance(128) ? words : 0);
    if (masked && controls.mask_words == words + 1) b.must_fail = true;
    if (typical) controls.typical_epsilon = typical_epsilon.data();
  }
  int32_t logprobs = in.chance(128) ? 1 : 0;
  if (in.chance(4)) {
    logprobs = 2;
    b.must_fail = true;
  }
  int32_t top_n = int32_t(in.range(0, 4));
  if (in.chance(4)) {
    top_n = in.chance(128) ? -1 : FLASHSPEC_MAX_TOP_LOGPROBS + 1;
    b.must_fail = true;
  }
  const int32_t top_alloc = std::max(top_n, 0);

  const auto options_ctx = [&] {
    flashspec_context_params p;
    flashspec_context_params_init(&p);
    p.backend = FLASHSPEC_BACKEND_CPU;
    p.seed = rng.next();
    p.cpu_threads = 1;
    p.max_rows = 64;
    p.max_requests = 8;
    return p;
  }();
  flashspec_context* ctx = nullptr;
  FS_CHECK(flashspec_context_create(&options_ctx, &ctx) == FLASHSPEC_OK, "context_create failed");
  flashspec_lm_head* head = nullptr;
  flashspec_tensor w = flashspec_tensor_make(b.weight.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, b.vocab, b.hidden);
  FS_CHECK(flashspec_lm_head_create(ctx, &w, FLASHSPEC_LM_HEAD_COPY, &head) == FLASHSPEC_OK, "lm_head_create failed");

  flashspec_tensor target = flashspec_tensor_make(b.rows.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, total_rows, b.hidden);
  flashspec_verify_batch batch;
  flashspec_verify_batch_init(&batch);
  batch.num_requests = b.requests;
  batch.draft_offsets = b.offsets.data();
  batch.draft_tokens = b.tokens.empty() ? nullptr : b.tokens.data();
  batch.target_hidden = &target;
  batch.temperatures = b.temperatures.data();
  batch.draft_parents = b.tree && !b.parents.empty() ? b.parents.data() : nullptr;
  batch.controls = with_controls ? &controls : nullptr;
  batch.logprobs = logprobs;
  batch.top_logprobs = top_n;

  Guarded<int32_t> accepted{size_t(b.requests)}, emitted{size_t(total_rows)}, nodes{size_t(total_rows)},
      top_tokens{size_t(total_rows * top_alloc)};
  Guarded<float> lp{size_t(total_rows)}, raw_lp{size_t(total_rows)}, top_lp{size_t(total_rows * top_alloc)};
  for (auto* g : {&accepted, &emitted, &nodes, &top_tokens}) g->poison();
  for (auto* g : {&lp, &raw_lp, &top_lp}) g->poison();
  flashspec_verify_result result;
  flashspec_verify_result_init(&result);
  result.accepted_counts = accepted.data();
  result.emitted_tokens = emitted.data();
  result.accepted_nodes = nodes.data();
  if (logprobs == 1) {
    result.logprobs = lp.data();
    result.raw_logprobs = raw_lp.data();
  }
  if (top_n > 0) {
    result.top_tokens = top_tokens.data();
    result.top_logprobs = top_lp.data();
  }
  const flashspec_status status = flashspec_verify_and_finalize(ctx, head, &batch, &result);
  check_error_message(ctx, status, "verify_and_finalize");
  for (auto* g : {&accepted, &emitted, &nodes, &top_tokens}) FS_CHECK(g->guards_intact(), "an output written past its end");
  for (auto* g : {&lp, &raw_lp, &top_lp}) FS_CHECK(g->guards_intact(), "an output written past its end");
  if (b.must_fail) FS_CHECK(status != FLASHSPEC_OK, "a planted invalid value was accepted");
  if (status != FLASHSPEC_OK) {
    for (auto* g : {&accepted, &emitted, &nodes, &top_tokens}) FS_CHECK(g->untouched(), "an output written on error");
    for (auto* g : {&lp, &raw_lp, &top_lp}) FS_CHECK(g->untouched(), "an output written on error");
    FS_CHECK(b.must_fail || (small_t && status == FLASHSPEC_ERR_NON_FINITE) ||
                 (with_controls && status == FLASHSPEC_ERR_NON_FINITE),
             "a valid batch failed with %s: %s", name(status), flashspec_context_last_error(ctx));
  } else {
    for (int32_t r = 0; r < b.requests; ++r) {
      const int32_t n = b.offsets[size_t(r) + 1] - b.offsets[size_t(r)], first = b.offsets[size_t(r)] + r;
      const int32_t a = accepted.get(size_t(r));
      FS_CHECK(a >= 0 && a <= n, "request %d accepted %d of %d", r, a, n);
      int32_t parent = -1, drawing_row = 0;
      for (int32_t k = 0; k <= n; ++k) {
        const int32_t token = emitted.get(size_t(first + k));
        if (k > a) {
          FS_CHECK(token == -1 && nodes.get(size_t(first + k)) == -1, "request %d slot %d past the end is set", r, k);
          if (logprobs == 1) FS_CHECK(std::isnan(lp.get(size_t(first + k))), "a logprob past the end is not NaN");
          continue;
        }
        FS_CHECK(token >= 0 && token < b.vocab, "request %d slot %d token %d out of range", r, k, token);
        if (masked) {
          const uint32_t* m = mask.data() + size_t(first + drawing_row) * size_t(words);
          FS_CHECK((m[token >> 5] >> (token & 31)) & 1u, "request %d slot %d emitted masked token %d", r, k, token);
        }
        if (logprobs == 1) {
          const float v = lp.get(size_t(first + k)), raw = raw_lp.get(size_t(first + k));
          FS_CHECK(std::isfinite(v) && v <= 1e-5f && std::isfinite(raw) && raw <= 1e-5f,
                   "request %d slot %d logprobs %g %g", r, k, double(v), double(raw));
        }
        for (int32_t i = 0; i < top_n; ++i) {
          const size_t s = size_t(first + k) * size_t(top_n) + size_t(i);
          const int32_t t = top_tokens.get(s);
          FS_CHECK(i >= b.vocab ? t == -1 : (t >= 0 && t < b.vocab), "top token %d out of range", t);
          if (i > 0 && i < b.vocab) {
            FS_CHECK(t != top_tokens.get(s - 1), "a repeated top token");
            FS_CHECK(top_lp.get(s) <= top_lp.get(s - 1), "top logprobs not sorted");
          }
        }
        if (k == a) break;
        // An accepted draft.
        const int32_t node = nodes.get(size_t(first + k));
        if (b.tree) {
          FS_CHECK(node >= 0 && node < n && b.parents[size_t(b.offsets[size_t(r)] + node)] == parent,
                   "request %d: accepted node %d is not a child of %d", r, node, parent);
          parent = node;
          drawing_row = node + 1;
        } else {
          FS_CHECK(node == k, "a chain's accepted node %d at slot %d", node, k);
          drawing_row = k + 1;
        }
        FS_CHECK(token == b.tokens[size_t(b.offsets[size_t(r)] + node)], "request %d slot %d is not the draft", r, k);
      }
    }

    // Shards: only batches that shard (no controls, no logprobs).
    if (!with_controls && logprobs == 0 && top_n == 0 && b.vocab >= 2) {
      const int32_t shards = int32_t(in.range(1, std::min<int64_t>(3, b.vocab)));
      std::vector<int64_t> cuts = {0};
      for (int32_t k = 1; k < shards; ++k) cuts.push_back(std::max(cuts.back() + 1, in.range(cuts.back() + 1, b.vocab - (shards - k))));
      cuts.push_back(b.vocab);
      std::vector<uint8_t> gathered(size_t(shards) * size_t(total_rows) * FLASHSPEC_SHARD_RECORD_BYTES);
      for (int32_t k = 0; k < shards; ++k) {
        flashspec_tensor slice = flashspec_tensor_make(b.weight.data() + cuts[size_t(k)] * b.hidden, FLASHSPEC_DTYPE_F32,
                                                       FLASHSPEC_MEMORY_HOST, cuts[size_t(k) + 1] - cuts[size_t(k)], b.hidden);
        flashspec_lm_head* shard = nullptr;
        FS_CHECK(flashspec_lm_head_create_shard(ctx, &slice, FLASHSPEC_LM_HEAD_COPY, cuts[size_t(k)], b.vocab, &shard) ==
                     FLASHSPEC_OK,
                 "lm_head_create_shard: %s", flashspec_context_last_error(ctx));
        const flashspec_status s = flashspec_verify_shard(
            ctx, shard, &batch, gathered.data() + size_t(k) * size_t(total_rows) * FLASHSPEC_SHARD_RECORD_BYTES);
        FS_CHECK(s == FLASHSPEC_OK, "verify_shard failed where verify succeeded: %s", flashspec_context_last_error(ctx));
        flashspec_lm_head_destroy(shard);
      }
      Guarded<int32_t> s_accepted{size_t(b.requests)}, s_emitted{size_t(total_rows)};
      s_accepted.poison();
      s_emitted.poison();
      flashspec_verify_result sharded;
      flashspec_verify_result_init(&sharded);
      sharded.accepted_counts = s_accepted.data();
      sharded.emitted_tokens = s_emitted.data();
      FS_CHECK(flashspec_finalize_shards(ctx, &batch, gathered.data(), shards, &sharded) == FLASHSPEC_OK,
               "finalize_shards failed: %s", flashspec_context_last_error(ctx));
      FS_CHECK(s_accepted.guards_intact() && s_emitted.guards_intact(), "finalize_shards wrote past an output");
      for (int32_t r = 0; r < b.requests; ++r) {
        const int32_t n = b.offsets[size_t(r) + 1] - b.offsets[size_t(r)], first = b.offsets[size_t(r)] + r;
        // Chains at T > 0 compare log u with a log-sum-exp summed in another
        // order: there the accepted counts may differ by fp32 rounding.
        const bool exact = b.temperatures[size_t(r)] == 0.0f || b.tree;
        if (!exact && s_accepted.get(size_t(r)) != accepted.get(size_t(r))) continue;
        FS_CHECK(s_accepted.get(size_t(r)) == accepted.get(size_t(r)), "request %d: sharded accepted %d, unsharded %d", r,
                 s_accepted.get(size_t(r)), accepted.get(size_t(r)));
        for (int32_t k = 0; k <= n; ++k)
          FS_CHECK(s_emitted.get(size_t(first + k)) == emitted.get(size_t(first + k)),
                   "request %d slot %d: sharded %d, unsharded %d", r, k, s_emitted.get(size_t(first + k)),
                   emitted.get(size_t(first + k)));
      }
    }
  }
  flashspec_lm_head_destroy(head);
  flashspec_context_destroy(ctx);
  return 0;
}
