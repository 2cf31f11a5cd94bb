#include "engine/lm_head_runner.h"

#include <cstring>

namespace flashspec {

namespace {
size_t align16(size_t v) { return (v + 15) / 16 * 16; }
}  // namespace

LmHeadRunner::LmHeadRunner(Backend& backend, int32_t max_rows, uint64_t default_seed)
    : backend_(backend), max_rows_(max_rows), default_seed_(default_seed) {
  summaries_ = backend_.create_summaries(max_rows_, 1);
  if (memory() == FLASHSPEC_MEMORY_HOST) return;
  const size_t rows = size_t(max_rows_);
  layout_.offsets = 0;
  layout_.tokens = layout_.offsets + 2 * sizeof(int32_t);
  layout_.scalars = align16(layout_.tokens + rows * sizeof(int32_t));
  layout_.inputs_end = layout_.scalars + sizeof(Scalars);
  layout_.accepted = align16(layout_.inputs_end);
  layout_.emitted = layout_.accepted + sizeof(int32_t);
  layout_.bytes = layout_.emitted + rows * sizeof(int32_t);
  staging_ = backend_.allocate_staging(layout_.bytes);
  host_.resize(layout_.bytes);
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
  args.tokens_out = staging_ ? reinterpret_cast<int32_t*>(staged() + layout_.emitted) : tokens_out;
  backend_.draft(head, args);
  if (staging_) backend_.copy_out(tokens_out, args.tokens_out, size_t(hidden.rows) * sizeof(int32_t));
}

int32_t LmHeadRunner::verify(const LmHeadStorage& head, const SequenceVerify& request, int32_t* emitted) {
  const int32_t n = request.num_drafts;
  const int32_t offsets[2] = {0, n};
  Scalars scalars{request.temperature, request.draft_temperature, request.seed, request.request_id, request.step};
  int32_t accepted = -1;

  VerifyArgs args{};
  args.num_requests = 1;
  args.total_drafts = n;
  args.total_rows = n + 1;
  args.max_draft_len = n > 0 ? n : 1;
  args.target_hidden = request.hidden;
  args.draft_logits = request.draft_logits;
  args.default_seed = default_seed_;
  ResultArgs result{};
  if (!staging_) {
    args.draft_offsets = offsets;
    args.draft_tokens = n > 0 ? request.drafts : nullptr;
    args.temperatures = &scalars.temperature;
    args.draft_temperatures = &scalars.draft_temperature;
    args.seeds = &scalars.seed;
    args.request_ids = &scalars.request_id;
    args.steps = &scalars.step;
    result.accepted_counts = &accepted;
    result.emitted_tokens = emitted;
  } else {
    // Stage the inputs in one copy; read back the accepted count and the
    // n + 1 emitted slots, which are adjacent, in another.
    unsigned char* h = host_.data();
    std::memcpy(h + layout_.offsets, offsets, sizeof offsets);
    if (n > 0) std::memcpy(h + layout_.tokens, request.drafts, size_t(n) * sizeof(int32_t));
    std::memcpy(h + layout_.scalars, &scalars, sizeof scalars);
    backend_.copy_in(staged(), h, layout_.inputs_end);
    unsigned char* d = staged();
    const Scalars* ds = reinterpret_cast<const Scalars*>(d + layout_.scalars);
    args.draft_offsets = reinterpret_cast<const int32_t*>(d + layout_.offsets);
    args.draft_tokens = n > 0 ? reinterpret_cast<const int32_t*>(d + layout_.tokens) : nullptr;
    args.temperatures = &ds->temperature;
    args.draft_temperatures = &ds->draft_temperature;
    args.seeds = &ds->seed;
    args.request_ids = &ds->request_id;
    args.steps = &ds->step;
    result.accepted_counts = reinterpret_cast<int32_t*>(d + layout_.accepted);
    result.emitted_tokens = reinterpret_cast<int32_t*>(d + layout_.emitted);
  }
  backend_.verify(head, args, *summaries_);
  backend_.finalize(args, *summaries_, result);
  if (staging_) {
    unsigned char* h = host_.data();
    backend_.copy_out(h + layout_.accepted, staged() + layout_.accepted,
                      (layout_.emitted - layout_.accepted) + size_t(n + 1) * sizeof(int32_t));
    std::memcpy(&accepted, h + layout_.accepted, sizeof(int32_t));
    std::memcpy(emitted, h + layout_.emitted, size_t(n + 1) * sizeof(int32_t));
  }
  return accepted;
}

}  // namespace flashspec
