#include "engine/lm_head_runner.h"

#include <algorithm>
#include <cstring>

namespace flashspec {

namespace {
size_t align16(size_t v) { return (v + 15) / 16 * 16; }

template <class T>
T* at(unsigned char* base, size_t offset) {
  return reinterpret_cast<T*>(base + offset);
}
}  // namespace

LmHeadRunner::LmHeadRunner(Backend& backend, int32_t max_rows, int32_t max_requests, uint64_t default_seed)
    : backend_(backend), max_rows_(max_rows), max_requests_(max_requests), default_seed_(default_seed) {
  summaries_ = backend_.create_summaries(max_rows_, max_requests_);
  const size_t rows = size_t(max_rows_), requests = size_t(max_requests_);
  layout_.offsets = 0;
  layout_.tokens = align16(layout_.offsets + (requests + 1) * sizeof(int32_t));
  layout_.parents = align16(layout_.tokens + rows * sizeof(int32_t));
  layout_.temperatures = align16(layout_.parents + rows * sizeof(int32_t));
  layout_.draft_temperatures = align16(layout_.temperatures + requests * sizeof(float));
  layout_.seeds = align16(layout_.draft_temperatures + requests * sizeof(float));
  layout_.request_ids = layout_.seeds + requests * sizeof(uint64_t);
  layout_.steps = layout_.request_ids + requests * sizeof(uint64_t);
  layout_.inputs_end = layout_.steps + requests * sizeof(uint64_t);
  layout_.accepted = align16(layout_.inputs_end);
  layout_.emitted = layout_.accepted + requests * sizeof(int32_t);
  layout_.accepted_nodes = layout_.emitted + rows * sizeof(int32_t);
  layout_.bytes = layout_.accepted_nodes + rows * sizeof(int32_t);
  host_.resize(layout_.bytes);
  if (memory() != FLASHSPEC_MEMORY_HOST) staging_ = backend_.allocate_staging(layout_.bytes);
}

LmHeadRunner::~LmHeadRunner() {
  if (staging_) backend_.release_staging(staging_);
}

void LmHeadRunner::draft_greedy(const LmHeadStorage& head, const flashspec_tensor& hidden, int32_t* tokens_out) {
  DraftArgs args{};
  args.hidden = &hidden;
  args.rows = int32_t(hidden.rows);
  args.temperature = 0.0f;
  args.default_seed = default_seed_;
  args.tokens_out = staging_ ? at<int32_t>(staged(), layout_.emitted) : tokens_out;
  backend_.draft(head, args);
  if (staging_) backend_.copy_out(tokens_out, args.tokens_out, size_t(hidden.rows) * sizeof(int32_t));
}

int32_t LmHeadRunner::verify(const LmHeadStorage& head, const SequenceVerify& request, int32_t* emitted,
                             int32_t* accepted_nodes) {
  const BatchVerify batch{&request, 1, request.hidden, request.draft_logits};
  int32_t accepted = -1;
  verify_batch(head, batch, &accepted, emitted, accepted_nodes);
  return accepted;
}

bool LmHeadRunner::verify_batch(const LmHeadStorage& head, const BatchVerify& batch, int32_t* accepted,
                                int32_t* emitted, int32_t* accepted_nodes) {
  // The arrays' host image: offsets, tokens (and a tree pass's parents) and
  // per-request scalars.
  unsigned char* h = host_.data();
  const int32_t count = batch.count;
  int32_t* offsets = at<int32_t>(h, layout_.offsets);
  int32_t* tokens = at<int32_t>(h, layout_.tokens);
  int32_t* parents = at<int32_t>(h, layout_.parents);
  bool trees = false;
  for (int32_t r = 0; r < count; ++r) trees = trees || (batch.requests[r].parents && batch.requests[r].num_drafts > 0);
  offsets[0] = 0;
  int32_t max_len = 1;
  bool may_sample = false;
  for (int32_t r = 0; r < count; ++r) {
    const SequenceVerify& q = batch.requests[r];
    if (q.num_drafts > 0) std::memcpy(tokens + offsets[r], q.drafts, size_t(q.num_drafts) * sizeof(int32_t));
    if (trees) {
      for (int32_t k = 0; k < q.num_drafts; ++k) parents[offsets[r] + k] = q.parents ? q.parents[k] : k - 1;
    }
    offsets[r + 1] = offsets[r] + q.num_drafts;
    max_len = std::max(max_len, q.num_drafts);
    at<float>(h, layout_.temperatures)[r] = q.temperature;
    may_sample = may_sample || q.temperature != 0.0f;
    at<float>(h, layout_.draft_temperatures)[r] = q.draft_temperature;
    at<uint64_t>(h, layout_.seeds)[r] = q.seed;
    at<uint64_t>(h, layout_.request_ids)[r] = q.request_id;
    at<uint64_t>(h, layout_.steps)[r] = q.step;
  }
  const int32_t total_drafts = offsets[count];
  const int32_t total_rows = total_drafts + count;

  // A host backend reads the image itself; a device backend reads a copy
  // staged in one transfer, and its results come back in another (the
  // accepted counts and emitted slots are adjacent).
  unsigned char* d = h;
  if (staging_) {
    backend_.copy_in(staged(), h, layout_.inputs_end);
    d = staged();
  }
  VerifyArgs args{};
  args.num_requests = count;
  args.total_drafts = total_drafts;
  args.total_rows = total_rows;
  args.max_draft_len = max_len;
  args.draft_offsets = at<const int32_t>(d, layout_.offsets);
  args.draft_tokens = total_drafts > 0 ? at<const int32_t>(d, layout_.tokens) : nullptr;
  args.target_hidden = batch.hidden;
  args.draft_logits = batch.draft_logits;
  // A step whose requests are all greedy says so with the one temperature,
  // so a backend may take kernels made for greedy rows.
  args.temperature = 0.0f;
  args.temperatures = may_sample ? at<const float>(d, layout_.temperatures) : nullptr;
  args.draft_temperatures = at<const float>(d, layout_.draft_temperatures);
  args.seeds = at<const uint64_t>(d, layout_.seeds);
  args.request_ids = at<const uint64_t>(d, layout_.request_ids);
  args.steps = at<const uint64_t>(d, layout_.steps);
  args.default_seed = default_seed_;
  args.draft_parents = trees && total_drafts > 0 ? at<const int32_t>(d, layout_.parents) : nullptr;
  ResultArgs result{};
  result.accepted_counts = staging_ ? at<int32_t>(d, layout_.accepted) : accepted;
  result.emitted_tokens = staging_ ? at<int32_t>(d, layout_.emitted) : emitted;
  if (args.draft_parents) result.accepted_nodes = staging_ ? at<int32_t>(d, layout_.accepted_nodes) : accepted_nodes;
  backend_.verify(head, args, *summaries_);
  backend_.finalize(args, *summaries_, result);
  if (staging_) {
    // The accepted counts, emitted tokens and a tree's accepted nodes are
    // adjacent: one transfer.
    const size_t end = args.draft_parents ? layout_.accepted_nodes + size_t(total_rows) * sizeof(int32_t)
                                          : layout_.emitted + size_t(total_rows) * sizeof(int32_t);
    backend_.copy_out(h + layout_.accepted, staged() + layout_.accepted, end - layout_.accepted);
    std::memcpy(accepted, h + layout_.accepted, size_t(count) * sizeof(int32_t));
    std::memcpy(emitted, h + layout_.emitted, size_t(total_rows) * sizeof(int32_t));
    if (args.draft_parents)
      std::memcpy(accepted_nodes, h + layout_.accepted_nodes, size_t(total_rows) * sizeof(int32_t));
  }
  return args.draft_parents != nullptr;
}

}  // namespace flashspec
