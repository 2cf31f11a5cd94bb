// The arguments of a backend call, valid by construction: the C API builds
// them after validating the public structs, the engine builds them from
// values it has checked. Array pointers live in the backend's memory; NULL
// means the documented default, which request_view and draft_row_view
// resolve, the one place that does.
#pragma once

#include <cstdint>

#include "flashspec.h"
#include "sampling/controls.h"
#include "sampling/row_plan.h"
#include "util/host_device.h"

namespace flashspec {

// The sampling controls of a call (flashspec_sampling_controls, validated);
// `present` false: none. Per-request arrays have one entry per request (per
// row of a draft call); the mask one row of mask_words words per hidden row.
struct ControlsArgs {
  bool present = false;
  const int32_t* top_k = nullptr;
  const float* top_p = nullptr;
  const float* min_p = nullptr;
  const int32_t* bias_offsets = nullptr;
  const int32_t* bias_tokens = nullptr;
  const float* bias_values = nullptr;
  const uint32_t* token_mask = nullptr;
  int32_t mask_words = 0;
  const float* typical_epsilon = nullptr;
  const float* typical_delta = nullptr;
  const float* repetition_penalty = nullptr;
};

// The controls of request `request`'s hidden row `row`, defaults resolved.
FS_HOST_DEVICE RowControls row_controls(const ControlsArgs& a, int32_t request, int32_t row) {
  RowControls c = no_controls();
  if (!a.present) return c;
  if (a.top_k) c.top_k = a.top_k[request];
  if (a.top_p) c.top_p = a.top_p[request];
  if (a.min_p) c.min_p = a.min_p[request];
  if (a.bias_offsets) {
    c.bias_tokens = a.bias_tokens + a.bias_offsets[request];
    c.bias_values = a.bias_values + a.bias_offsets[request];
    c.bias_count = a.bias_offsets[request + 1] - a.bias_offsets[request];
  }
  if (a.token_mask) c.mask = a.token_mask + int64_t(row) * a.mask_words;
  if (a.repetition_penalty) c.repetition_penalty = a.repetition_penalty[request];
  if (a.typical_epsilon) {
    c.typical_epsilon = a.typical_epsilon[request];
    c.typical_delta = a.typical_delta ? a.typical_delta[request] : sqrtf(c.typical_epsilon);
  }
  return c;
}

// The status of request `request`'s control values: FLASHSPEC_OK, or the
// status the C API gives the same value in host memory. Values in device
// memory are checked with this on the device, per request.
FS_HOST_DEVICE int32_t control_values_status(const ControlsArgs& a, int32_t request, int64_t vocab) {
  if (!a.present) return FLASHSPEC_OK;
  if (a.top_k) {
    const int32_t k = a.top_k[request];
    if (k < 1 || (k > FLASHSPEC_MAX_TOP_K && int64_t(k) < vocab)) return FLASHSPEC_ERR_OUT_OF_RANGE;
  }
  if (a.top_p && !(a.top_p[request] > 0.0f && a.top_p[request] <= 1.0f)) return FLASHSPEC_ERR_INVALID_ARGUMENT;
  if (a.min_p && !(a.min_p[request] >= 0.0f && a.min_p[request] <= 1.0f)) return FLASHSPEC_ERR_INVALID_ARGUMENT;
  if (a.repetition_penalty && !(a.repetition_penalty[request] > 0.0f && is_finite(a.repetition_penalty[request])))
    return FLASHSPEC_ERR_INVALID_ARGUMENT;
  if (a.typical_epsilon && !(a.typical_epsilon[request] >= 0.0f && a.typical_epsilon[request] <= 1.0f))
    return FLASHSPEC_ERR_INVALID_ARGUMENT;
  if (a.typical_delta && !(a.typical_delta[request] >= 0.0f && is_finite(a.typical_delta[request])))
    return FLASHSPEC_ERR_INVALID_ARGUMENT;
  if (a.bias_offsets) {
    const int32_t lo = a.bias_offsets[request], hi = a.bias_offsets[request + 1];
    if (lo < 0 || hi < lo || (request == 0 && lo != 0)) return FLASHSPEC_ERR_OUT_OF_RANGE;
    for (int32_t k = lo; k < hi; ++k) {
      if (a.bias_tokens[k] < 0 || int64_t(a.bias_tokens[k]) >= vocab) return FLASHSPEC_ERR_OUT_OF_RANGE;
      if (!is_finite(a.bias_values[k])) return FLASHSPEC_ERR_INVALID_ARGUMENT;
    }
  }
  return FLASHSPEC_OK;
}

// A draft call over `rows` hidden rows.
struct DraftArgs {
  const flashspec_tensor* hidden;
  int32_t rows;
  float temperature;           // for every row unless `temperatures` is given
  const float* temperatures;   // [rows] or NULL
  const uint64_t* seeds;       // [rows] or NULL: default_seed
  const uint64_t* request_ids; // [rows] or NULL: the row index
  const uint64_t* steps;       // [rows] or NULL: 0
  const int32_t* positions;    // [rows] or NULL: 0
  uint64_t default_seed;
  int32_t* tokens_out;         // [rows]
  float* scores_out;           // [rows] or NULL
  ControlsArgs controls;       // per row (row r is request r)
};

// Whether a draft call may have a sampled row: not where the one
// temperature is 0 for every row. A backend may take kernels tuned for
// greedy rows otherwise; the result is the same.
inline bool draft_may_sample(const DraftArgs& a) { return a.temperatures != nullptr || a.temperature != 0.0f; }

// A verify batch of num_requests requests; request r drafted
// draft_offsets[r + 1] − draft_offsets[r] tokens. total_drafts =
// draft_offsets[R]; total_rows = total_drafts + R.
struct VerifyArgs {
  int32_t num_requests;
  int32_t total_drafts;
  int32_t total_rows;
  int32_t max_draft_len;
  const int32_t* draft_offsets;      // [R + 1]
  const int32_t* draft_tokens;       // [total_drafts]
  const flashspec_tensor* target_hidden;  // [total_rows, d]
  const flashspec_tensor* draft_logits;   // [total_drafts, V], or NULL: point-mass drafts
  float temperature = 1.0f;          // for every request unless `temperatures` is given
  const float* temperatures;         // [R] or NULL: `temperature`
  const float* draft_temperatures;   // [R] or NULL: 1
  const uint64_t* seeds;             // [R] or NULL: default_seed
  const uint64_t* request_ids;       // [R] or NULL: the request index
  const uint64_t* steps;             // [R] or NULL: 0
  const float* accept_uniforms;      // [total_drafts] or NULL: Philox
  uint64_t default_seed;
  ControlsArgs controls;             // the target rows' p; mask rows = target rows
  ControlsArgs draft_controls;       // q of stochastic drafts; mask rows = draft rows
  bool logprobs = false;             // keep what finalize needs for the emitted logprobs
  int32_t top_logprobs = 0;          // keep each row's n tokens of largest raw logit
  const int32_t* draft_parents = nullptr;  // [total_drafts] a tree per request, or NULL: chains
  // Sparse q (validated: 1..FLASHSPEC_MAX_DRAFT_SUPPORT distinct tokens per
  // draft row, probabilities summing to 1 within the tolerance), or NULL.
  const int32_t* support_offsets = nullptr;  // [total_drafts + 1]
  const int32_t* support_tokens = nullptr;   // [support_offsets[total_drafts]]
  const float* support_probs = nullptr;      // [support_offsets[total_drafts]]
};

// Whether a verify batch may have a sampling row: not where the one
// temperature is 0 for every request (the C API's greedy batches, the
// engine's all-greedy steps). A backend may take kernels tuned for greedy
// rows otherwise; the result is the same.
inline bool verify_may_sample(const VerifyArgs& a) { return a.temperatures != nullptr || a.temperature != 0.0f; }

// Whether the drafts carry their distribution q (dense logits or a sparse
// support): stochastic drafts, verified against q; else point masses.
FS_HOST_DEVICE bool has_draft_distribution(const VerifyArgs& args) {
  return args.draft_logits != nullptr || args.support_offsets != nullptr;
}

// Whether node `node` (−1: the root) of request v's tree has a child.
FS_HOST_DEVICE bool tree_node_has_children(const VerifyArgs& args, const RequestView& v, int32_t node) {
  for (int32_t k = node + 1; k < v.num_drafts; ++k)
    if (args.draft_parents[v.first_draft + k] == node) return true;
  return false;
}

// The drafts row j of request v verifies, in the order they are tried, as
// batch draft indices written to out[0 ..) (room for v.num_drafts): a chain
// row's one draft, a tree node's children by increasing index. Returns the
// count.
FS_HOST_DEVICE int32_t drafts_tried_at(const VerifyArgs& args, const RequestView& v, int32_t j, int32_t* out) {
  if (!args.draft_parents) {
    if (j >= v.num_drafts) return 0;
    out[0] = v.first_draft + j;
    return 1;
  }
  int32_t count = 0;
  for (int32_t k = j; k < v.num_drafts; ++k)
    if (args.draft_parents[v.first_draft + k] == j - 1) out[count++] = v.first_draft + k;
  return count;
}

// Where row j's drafts (drafts_tried_at) start when request v's drafts are
// listed row by row: v.first_draft plus the drafts tried at earlier rows.
FS_HOST_DEVICE int32_t drafts_tried_before(const VerifyArgs& args, const RequestView& v, int32_t j) {
  if (!args.draft_parents) return v.first_draft + (j < v.num_drafts ? j : v.num_drafts);
  int32_t before = 0;
  for (int32_t k = 0; k < v.num_drafts; ++k) before += args.draft_parents[v.first_draft + k] < j - 1;
  return v.first_draft + before;
}

// Whether request v's drafts form a chain: no draft_parents, or node k's
// parent is k − 1 for every k. A chain given as a tree is verified as a
// chain (Algorithm 1, with its random numbers), so what a request emits never
// depends on whether its neighbours in the batch are trees.
FS_HOST_DEVICE bool request_is_chain(const VerifyArgs& args, const RequestView& v) {
  if (!args.draft_parents) return true;
  for (int32_t k = 0; k < v.num_drafts; ++k)
    if (args.draft_parents[v.first_draft + k] != k - 1) return false;
  return true;
}

// The plan of row j of request v: a tree row, or a chain's (Algorithm 1).
FS_HOST_DEVICE RowPlan batch_row_plan(const VerifyArgs& args, const RequestView& v, int32_t j, bool typical = false) {
  const bool stochastic = has_draft_distribution(args);
  if (request_is_chain(args, v)) return verify_row_plan(v, j, args.draft_tokens, stochastic, typical);
  return stochastic ? stochastic_tree_row_plan(v, j, tree_node_has_children(args, v, j - 1)) : tree_row_plan(v, j);
}

struct ResultArgs {
  int32_t* accepted_counts;  // [R]
  int32_t* emitted_tokens;   // [total_rows]
  uint64_t* next_steps;      // [R] or NULL
  float* logprobs = nullptr;        // [total_rows] or NULL
  float* raw_logprobs = nullptr;    // [total_rows] or NULL
  int32_t* top_tokens = nullptr;    // [total_rows, top_logprobs] or NULL
  float* top_logprobs = nullptr;    // [total_rows, top_logprobs] or NULL
  int32_t* accepted_nodes = nullptr;  // [total_rows] or NULL
};

// Request r of a verify batch whose offsets are valid.
FS_HOST_DEVICE RequestView request_view(const VerifyArgs& args, int32_t r) {
  RequestView v;
  v.index = r;
  v.first_draft = args.draft_offsets[r];
  v.num_drafts = args.draft_offsets[r + 1] - v.first_draft;
  v.first_row = v.first_draft + r;
  v.temperature = args.temperatures ? args.temperatures[r] : args.temperature;
  v.draft_temperature = args.draft_temperatures ? args.draft_temperatures[r] : 1.0f;
  v.seed = args.seeds ? args.seeds[r] : args.default_seed;
  v.request_id = args.request_ids ? args.request_ids[r] : uint64_t(r);
  v.step = args.steps ? args.steps[r] : 0;
  return v;
}

// Row r of a draft call.
FS_HOST_DEVICE DraftRowView draft_row_view(const DraftArgs& args, int32_t r) {
  DraftRowView v;
  v.row = r;
  v.temperature = args.temperatures ? args.temperatures[r] : args.temperature;
  v.seed = args.seeds ? args.seeds[r] : args.default_seed;
  v.request_id = args.request_ids ? args.request_ids[r] : uint64_t(r);
  v.step = args.steps ? args.steps[r] : 0;
  v.position = args.positions ? args.positions[r] : 0;
  return v;
}

}  // namespace flashspec
