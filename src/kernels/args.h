// The arguments of a backend call, valid by construction: the C API builds
// them after validating the public structs, the engine builds them from
// values it has checked. Array pointers live in the backend's memory; NULL
// means the documented default, which request_view and draft_row_view
// resolve, the one place that does.
#pragma once

#include <cstdint>

#include "flashspec.h"
#include "sampling/row_plan.h"
#include "util/host_device.h"

namespace flashspec {

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
};

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
  const float* temperatures;         // [R] or NULL: 1
  const float* draft_temperatures;   // [R] or NULL: 1
  const uint64_t* seeds;             // [R] or NULL: default_seed
  const uint64_t* request_ids;       // [R] or NULL: the request index
  const uint64_t* steps;             // [R] or NULL: 0
  const float* accept_uniforms;      // [total_drafts] or NULL: Philox
  uint64_t default_seed;
};

struct ResultArgs {
  int32_t* accepted_counts;  // [R]
  int32_t* emitted_tokens;   // [total_rows]
  uint64_t* next_steps;      // [R] or NULL
};

// Request r of a verify batch whose offsets are valid.
FS_HOST_DEVICE RequestView request_view(const VerifyArgs& args, int32_t r) {
  RequestView v;
  v.first_draft = args.draft_offsets[r];
  v.num_drafts = args.draft_offsets[r + 1] - v.first_draft;
  v.first_row = v.first_draft + r;
  v.temperature = args.temperatures ? args.temperatures[r] : 1.0f;
  v.draft_temperature = args.draft_temperatures ? args.draft_temperatures[r] : 1.0f;
  v.seed = args.seeds ? args.seeds[r] : args.default_seed;
  v.request_id = args.request_ids ? args.request_ids[r] : uint64_t(r);
  v.step = args.steps ? args.steps[r] : 0;
  return v;
}

// Row r of a draft call.
FS_HOST_DEVICE DraftRowView draft_row_view(const DraftArgs& args, int32_t r) {
  DraftRowView v;
  v.temperature = args.temperatures ? args.temperatures[r] : args.temperature;
  v.seed = args.seeds ? args.seeds[r] : args.default_seed;
  v.request_id = args.request_ids ? args.request_ids[r] : uint64_t(r);
  v.step = args.steps ? args.steps[r] : 0;
  v.position = args.positions ? args.positions[r] : 0;
  return v;
}

}  // namespace flashspec
