// The exported functions of flashspec.h: validation, then one backend call,
// inside guarded() so that no exception crosses the C boundary.
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "capi/guard.h"
#include "capi/handles.h"
#include "capi/params.h"
#include "capi/validate.h"
#include "flashspec.h"
#include "util/dtype.h"
#include "util/philox.h"
#include "util/quantize.h"

using namespace flashspec;

namespace flashspec {
std::string& thread_error_message() {
  thread_local std::string message;
  return message;
}
}  // namespace flashspec

namespace {

SummaryStore& checked_summaries(const flashspec_context& ctx, const flashspec_summaries* summaries) {
  require(summaries != nullptr, FLASHSPEC_ERR_NULL_POINTER, "summaries", "is NULL");
  SummaryStore& store = *summaries->store;
  require(store.backend == ctx.backend->kind() && store.device == ctx.backend->device(),
          FLASHSPEC_ERR_DEVICE_MISMATCH, "summaries", "were created for another backend or device than this context's");
  require(summaries->owner == &ctx, FLASHSPEC_ERR_INVALID_ARGUMENT, "summaries",
          "belong to another context (summaries are used with the context that created them)");
  return store;
}

// What a backend's Field tags are called in each call of this file.
FieldNames context_names() {
  FieldNames n{};
  n[size_t(Field::kBackend)] = "params->backend";
  n[size_t(Field::kDeviceOrdinal)] = "params->device_ordinal";
  n[size_t(Field::kCpuThreads)] = "params->cpu_threads";
  return n;
}

FieldNames lm_head_names() {
  FieldNames n{};
  n[size_t(Field::kWeight)] = "weight";
  n[size_t(Field::kFlags)] = "flags";
  return n;
}

FieldNames draft_names() {
  FieldNames n{};
  n[size_t(Field::kHead)] = "head";
  n[size_t(Field::kHidden)] = "hidden";
  n[size_t(Field::kTemperature)] = "params->temperature";
  return n;
}

FieldNames verify_names() {
  FieldNames n{};
  n[size_t(Field::kHead)] = "head";
  n[size_t(Field::kHidden)] = "batch->target_hidden";
  n[size_t(Field::kTemperature)] = "batch->temperatures";
  n[size_t(Field::kDraftLogits)] = "batch->draft_logits";
  return n;
}

}  // namespace

extern "C" {

void flashspec_context_params_init(flashspec_context_params* params) {
  if (!params) return;
  *params = flashspec_context_params{};
  params->struct_size = sizeof(flashspec_context_params);
  params->backend = FLASHSPEC_BACKEND_AUTO;
  params->device_ordinal = 0;
  params->cuda_stream = nullptr;
  params->seed = 0;
  params->cpu_threads = 0;
  params->max_rows = 512;
  params->max_requests = 512;
}

flashspec_status flashspec_context_create(const flashspec_context_params* params, flashspec_context** out) {
  return guarded(nullptr, [&] {
    require(out != nullptr, FLASHSPEC_ERR_NULL_POINTER, "out", "is NULL");
    const flashspec_context_params p = load_struct_or_defaults(params, flashspec_context_params_init, "params");
    const int32_t backend = raw_enum(p.backend);
    require(backend == FLASHSPEC_BACKEND_AUTO || backend == FLASHSPEC_BACKEND_CPU || backend == FLASHSPEC_BACKEND_CUDA,
            FLASHSPEC_ERR_INVALID_ARGUMENT, "params->backend", "unknown backend " + std::to_string(backend));
    require(p.device_ordinal >= 0, FLASHSPEC_ERR_INVALID_ARGUMENT, "params->device_ordinal", "must be >= 0");
    require(p.cpu_threads >= 0 && p.cpu_threads <= 1024, FLASHSPEC_ERR_INVALID_ARGUMENT, "params->cpu_threads",
            "must be in [0, 1024]");
    require(p.max_rows >= 1 && p.max_rows <= (1 << 24), FLASHSPEC_ERR_OUT_OF_RANGE, "params->max_rows",
            "must be in [1, 2^24]");
    require(p.max_requests >= 1 && p.max_requests <= (1 << 24), FLASHSPEC_ERR_OUT_OF_RANGE,
            "params->max_requests", "must be in [1, 2^24]");
    BackendConfig config{p.device_ordinal, p.cuda_stream, p.cpu_threads, p.max_rows, p.max_requests};
    auto ctx = std::make_unique<flashspec_context>();
    bool use_cuda = p.backend == FLASHSPEC_BACKEND_CUDA ||
                    (p.backend == FLASHSPEC_BACKEND_AUTO && cuda_device_count() > p.device_ordinal);
    ctx->backend = naming_fields(context_names(),
                                 [&] { return use_cuda ? make_cuda_backend(config) : make_cpu_backend(config); });
    ctx->seed = p.seed;
    ctx->max_rows = p.max_rows;
    ctx->max_requests = p.max_requests;
    ctx->own_summaries = ctx->backend->create_summaries(p.max_rows, p.max_requests);
    *out = ctx.release();
  });
}

void flashspec_context_destroy(flashspec_context* ctx) {
  if (!ctx) return;
  try {
    ctx->backend->synchronize();
  } catch (...) {
    // Destruction goes on: the device error, if any, is not the caller's to handle here.
  }
  delete ctx;
}

const char* flashspec_context_last_error(const flashspec_context* ctx) {
  return ctx ? ctx->last_error.c_str() : thread_error_message().c_str();
}

int flashspec_context_last_cuda_error(const flashspec_context* ctx) { return ctx ? ctx->last_cuda_error : 0; }

flashspec_backend flashspec_context_backend(const flashspec_context* ctx) {
  return ctx ? ctx->backend->kind() : FLASHSPEC_BACKEND_AUTO;
}

flashspec_status flashspec_context_synchronize(flashspec_context* ctx) {
  if (!ctx) return FLASHSPEC_ERR_NULL_POINTER;
  return guarded(ctx, [&] { ctx->backend->synchronize(); });
}

int flashspec_cuda_device_count(void) {
  try {
    return cuda_device_count();
  } catch (...) {
    return 0;
  }
}

namespace {
// Validates and uploads an LM head holding global tokens [vocab_begin,
// vocab_begin + weight->rows) of vocab_size (unsharded: 0 and rows).
// The checks every head's weight and flags pass (8-bit codes only where
// `codes_allowed`).
void validate_head_weight(const flashspec_tensor* weight, int32_t raw_flags, bool codes_allowed) {
  validate_tensor(weight, "weight", codes_allowed);
  require(weight->rows <= FLASHSPEC_MAX_VOCAB, FLASHSPEC_ERR_OUT_OF_RANGE, "weight",
          "rows (vocabulary) " + std::to_string(weight->rows) + " exceed FLASHSPEC_MAX_VOCAB");
  require(weight->cols <= FLASHSPEC_MAX_HIDDEN, FLASHSPEC_ERR_OUT_OF_RANGE, "weight",
          "cols (hidden size) " + std::to_string(weight->cols) + " exceed FLASHSPEC_MAX_HIDDEN");
  require(raw_flags == FLASHSPEC_LM_HEAD_COPY || raw_flags == FLASHSPEC_LM_HEAD_BORROW,
          FLASHSPEC_ERR_INVALID_ARGUMENT, "flags", "unknown value " + std::to_string(raw_flags));
}

void create_head(flashspec_context& ctx, const flashspec_tensor* weight, int32_t raw_flags,
                 int64_t vocab_begin, int64_t vocab_size, bool shard, flashspec_lm_head** out) {
  require(out != nullptr, FLASHSPEC_ERR_NULL_POINTER, "out", "is NULL");
  validate_head_weight(weight, raw_flags, false);
  if (shard) {
    require(vocab_size >= 1 && vocab_size <= FLASHSPEC_MAX_VOCAB, FLASHSPEC_ERR_OUT_OF_RANGE, "vocab_size",
            "must be in [1, FLASHSPEC_MAX_VOCAB], got " + std::to_string(vocab_size));
    require(vocab_begin >= 0 && vocab_begin + weight->rows <= vocab_size, FLASHSPEC_ERR_OUT_OF_RANGE,
            "vocab_begin",
            "the slice [" + std::to_string(vocab_begin) + ", " + std::to_string(vocab_begin + weight->rows) +
                ") does not lie in [0, vocab_size " + std::to_string(vocab_size) + ")");
  }
  auto head = std::make_unique<flashspec_lm_head>();
  const flashspec_lm_head_flags flags = flashspec_lm_head_flags(raw_flags);
  head->storage =
      naming_fields(lm_head_names(), [&] { return ctx.backend->create_lm_head(*weight, flags, nullptr); });
  head->storage->vocab_begin = vocab_begin;
  head->storage->vocab_size = vocab_size;
  *out = head.release();
}

// Rows of a tensor, copied into host memory as contiguous rows of cols
// elements (through the backend for device memory, which validation has
// matched to a CUDA context).
std::vector<unsigned char> host_rows(flashspec_context& ctx, const flashspec_tensor& t) {
  const size_t element = dtype_size(t.dtype);
  const size_t row_bytes = size_t(t.cols) * element, stride_bytes = size_t(t.row_stride) * element;
  const size_t span = size_t(t.rows - 1) * stride_bytes + row_bytes;
  std::vector<unsigned char> staged;
  const unsigned char* src = static_cast<const unsigned char*>(t.data);
  if (t.memory == FLASHSPEC_MEMORY_CUDA) {
    staged.resize(span);
    ctx.backend->copy_out(staged.data(), t.data, span);
    src = staged.data();
  }
  std::vector<unsigned char> rows(size_t(t.rows) * row_bytes);
  for (int64_t r = 0; r < t.rows; ++r)
    std::memcpy(rows.data() + size_t(r) * row_bytes, src + size_t(r) * stride_bytes, row_bytes);
  return rows;
}

void require_backend_memory(const flashspec_context& ctx, const flashspec_tensor& t, const char* argument) {
  require(t.memory == FLASHSPEC_MEMORY_HOST || ctx.backend->kind() == FLASHSPEC_BACKEND_CUDA,
          FLASHSPEC_ERR_DEVICE_MISMATCH, argument, "is in device memory, which the CPU backend cannot read");
}

void create_quantized_head(flashspec_context& ctx, const flashspec_tensor* weight, const flashspec_tensor* scales,
                           int32_t raw_stored, int32_t raw_flags, flashspec_lm_head** out) {
  require(out != nullptr, FLASHSPEC_ERR_NULL_POINTER, "out", "is NULL");
  require(raw_stored == FLASHSPEC_DTYPE_E4M3 || raw_stored == FLASHSPEC_DTYPE_I8, FLASHSPEC_ERR_DTYPE_MISMATCH,
          "stored", "must be FLASHSPEC_DTYPE_E4M3 or FLASHSPEC_DTYPE_I8, got " + std::to_string(raw_stored));
  const flashspec_dtype stored = flashspec_dtype(raw_stored);
  validate_head_weight(weight, raw_flags, true);
  require_backend_memory(ctx, *weight, "weight");
  const flashspec_lm_head_flags flags = flashspec_lm_head_flags(raw_flags);
  const int64_t vocab = weight->rows, d = weight->cols;
  std::vector<float> row_scales(static_cast<size_t>(vocab));
  std::vector<unsigned char> codes;
  flashspec_tensor upload = *weight;
  if (dtype_is_8bit(weight->dtype)) {
    require(weight->dtype == stored, FLASHSPEC_ERR_DTYPE_MISMATCH, "weight",
            "holds codes of the other 8-bit dtype than `stored`");
    require(scales != nullptr, FLASHSPEC_ERR_INVALID_ARGUMENT, "scales",
            "is NULL: pre-quantised codes need their rows' scales");
    validate_tensor(scales, "scales");
    require(scales->dtype == FLASHSPEC_DTYPE_F32, FLASHSPEC_ERR_DTYPE_MISMATCH, "scales", "must be fp32");
    require(scales->rows == vocab && scales->cols == 1, FLASHSPEC_ERR_INVALID_ARGUMENT, "scales",
            "must be [V, 1] = [" + std::to_string(vocab) + ", 1], got [" + std::to_string(scales->rows) + ", " +
                std::to_string(scales->cols) + "]");
    require(scales->memory == weight->memory, FLASHSPEC_ERR_DEVICE_MISMATCH, "scales",
            "must be in the same memory as weight");
    const std::vector<unsigned char> raw = host_rows(ctx, *scales);
    std::memcpy(row_scales.data(), raw.data(), raw.size());
    for (int64_t v = 0; v < vocab; ++v)
      require(std::isfinite(row_scales[size_t(v)]) && row_scales[size_t(v)] >= 0.0f, FLASHSPEC_ERR_NON_FINITE,
              "scales", "row " + std::to_string(v) + " is " + std::to_string(row_scales[size_t(v)]) +
                            " (scales must be finite and >= 0)");
  } else {
    require(scales == nullptr, FLASHSPEC_ERR_INVALID_ARGUMENT, "scales",
            "must be NULL: a bf16/fp16/fp32 weight is quantised here, which computes the scales");
    require(flags == FLASHSPEC_LM_HEAD_COPY, FLASHSPEC_ERR_INVALID_ARGUMENT, "flags",
            "BORROW keeps the caller's codes; a weight quantised here is always copied");
    const std::vector<unsigned char> rows = host_rows(ctx, *weight);
    const size_t row_bytes = size_t(d) * dtype_size(weight->dtype);
    std::vector<float> row(static_cast<size_t>(d));
    codes.resize(size_t(vocab) * size_t(d));
    for (int64_t v = 0; v < vocab; ++v) {
      const void* src = rows.data() + size_t(v) * row_bytes;
      for (int64_t k = 0; k < d; ++k) {
        row[size_t(k)] = load_as_float(src, weight->dtype, k);
        require(std::isfinite(row[size_t(k)]), FLASHSPEC_ERR_NON_FINITE, "weight",
                "row " + std::to_string(v) + ", column " + std::to_string(k) + " is not finite");
      }
      row_scales[size_t(v)] = quantize_row(row.data(), d, stored, codes.data() + size_t(v) * size_t(d));
    }
    upload = flashspec_tensor_make(codes.data(), stored, FLASHSPEC_MEMORY_HOST, vocab, d);
  }
  auto head = std::make_unique<flashspec_lm_head>();
  head->storage = naming_fields(lm_head_names(),
                                [&] { return ctx.backend->create_lm_head(upload, flags, row_scales.data()); });
  head->storage->vocab_begin = 0;
  head->storage->vocab_size = vocab;
  *out = head.release();
}

}  // namespace

flashspec_status flashspec_lm_head_create(flashspec_context* ctx, const flashspec_tensor* weight,
                                          flashspec_lm_head_flags flags, flashspec_lm_head** out) {
  if (!ctx) return guarded(nullptr, [] { fail(FLASHSPEC_ERR_NULL_POINTER, "ctx: is NULL"); });
  return guarded(ctx, [&] { create_head(*ctx, weight, raw_enum(flags), 0, weight ? weight->rows : 0, false, out); });
}

flashspec_status flashspec_lm_head_create_quantized(flashspec_context* ctx, const flashspec_tensor* weight,
                                                    const flashspec_tensor* scales, flashspec_dtype stored,
                                                    flashspec_lm_head_flags flags, flashspec_lm_head** out) {
  if (!ctx) return guarded(nullptr, [] { fail(FLASHSPEC_ERR_NULL_POINTER, "ctx: is NULL"); });
  return guarded(ctx, [&] { create_quantized_head(*ctx, weight, scales, raw_enum(stored), raw_enum(flags), out); });
}

flashspec_dtype flashspec_lm_head_dtype(const flashspec_lm_head* head) {
  return head ? head->storage->dtype : FLASHSPEC_DTYPE_F32;
}

flashspec_status flashspec_lm_head_create_shard(flashspec_context* ctx, const flashspec_tensor* weight,
                                                flashspec_lm_head_flags flags, int64_t vocab_begin,
                                                int64_t vocab_size, flashspec_lm_head** out) {
  if (!ctx) return guarded(nullptr, [] { fail(FLASHSPEC_ERR_NULL_POINTER, "ctx: is NULL"); });
  return guarded(ctx, [&] { create_head(*ctx, weight, raw_enum(flags), vocab_begin, vocab_size, true, out); });
}

int64_t flashspec_lm_head_vocab_begin(const flashspec_lm_head* head) { return head ? head->storage->vocab_begin : 0; }

int64_t flashspec_lm_head_global_vocab_size(const flashspec_lm_head* head) {
  return head ? head->storage->vocab_size : 0;
}

flashspec_status flashspec_verify_shard(flashspec_context* ctx, const flashspec_lm_head* head,
                                        const flashspec_verify_batch* batch, void* records) {
  if (!ctx) return guarded(nullptr, [] { fail(FLASHSPEC_ERR_NULL_POINTER, "ctx: is NULL"); });
  return guarded(ctx, [&] {
    const LmHeadStorage& storage = validate_head(*ctx, head, "head", true);
    const VerifyArgs args = validate_verify_shard(*ctx, storage, load_batch(batch), records);
    naming_fields(verify_names(),
                  [&] { ctx->backend->verify_records(storage, args, static_cast<ShardRecord*>(records)); });
  });
}

flashspec_status flashspec_finalize_shards(flashspec_context* ctx, const flashspec_verify_batch* batch,
                                           const void* records, int32_t num_shards,
                                           const flashspec_verify_result* result) {
  if (!ctx) return guarded(nullptr, [] { fail(FLASHSPEC_ERR_NULL_POINTER, "ctx: is NULL"); });
  return guarded(ctx, [&] {
    const VerifyArgs args = validate_finalize_shards(*ctx, load_batch(batch), records, num_shards);
    const ResultArgs out = validate_result(*ctx, result);
    validate_result_requests(out, false, 0, "batch");
    validate_result_disjoint(args, out, backend_memory(*ctx->backend) == FLASHSPEC_MEMORY_HOST, records, num_shards);
    naming_fields(verify_names(), [&] {
      ctx->backend->finalize_records(args, static_cast<const ShardRecord*>(records), num_shards, out);
    });
  });
}

flashspec_status flashspec_draft_shard(flashspec_context* ctx, const flashspec_lm_head* head,
                                       const flashspec_tensor* hidden, const flashspec_draft_params* params,
                                       void* records) {
  if (!ctx) return guarded(nullptr, [] { fail(FLASHSPEC_ERR_NULL_POINTER, "ctx: is NULL"); });
  return guarded(ctx, [&] {
    const LmHeadStorage& storage = validate_head(*ctx, head, "head", true);
    const DraftArgs args = validate_draft_shard(*ctx, storage, hidden, params, records);
    naming_fields(draft_names(),
                  [&] { ctx->backend->draft_records(storage, args, static_cast<ShardRecord*>(records)); });
  });
}

flashspec_status flashspec_draft_from_shards(flashspec_context* ctx, const flashspec_draft_params* params,
                                             const void* records, int32_t num_shards, int32_t rows,
                                             int32_t* tokens_out, float* scores_out) {
  if (!ctx) return guarded(nullptr, [] { fail(FLASHSPEC_ERR_NULL_POINTER, "ctx: is NULL"); });
  return guarded(ctx, [&] {
    const DraftArgs args = validate_draft_from_shards(*ctx, params, records, num_shards, rows, tokens_out, scores_out);
    naming_fields(draft_names(), [&] {
      ctx->backend->draft_from_records(args, static_cast<const ShardRecord*>(records), num_shards);
    });
  });
}

void flashspec_lm_head_destroy(flashspec_lm_head* head) { delete head; }

int64_t flashspec_lm_head_vocab_size(const flashspec_lm_head* head) { return head ? head->storage->vocab : 0; }

int64_t flashspec_lm_head_hidden_size(const flashspec_lm_head* head) { return head ? head->storage->hidden : 0; }

void flashspec_draft_params_init_sized(flashspec_draft_params* params, size_t size) {
  flashspec_draft_params defaults{};
  defaults.memory = FLASHSPEC_MEMORY_HOST;
  defaults.temperature = 0.0f;
  init_prefix(params, size, defaults);
}

flashspec_status flashspec_draft(flashspec_context* ctx, const flashspec_lm_head* head,
                                 const flashspec_tensor* hidden, const flashspec_draft_params* params,
                                 int32_t* tokens_out, float* scores_out) {
  if (!ctx) return guarded(nullptr, [] { fail(FLASHSPEC_ERR_NULL_POINTER, "ctx: is NULL"); });
  return guarded(ctx, [&] {
    const LmHeadStorage& storage = validate_head(*ctx, head, "head");
    DraftArgs args = validate_draft(*ctx, storage, hidden, params, tokens_out, scores_out);
    naming_fields(draft_names(), [&] { ctx->backend->draft(storage, args); });
  });
}

flashspec_status flashspec_draft_top_k(flashspec_context* ctx, const flashspec_lm_head* head,
                                       const flashspec_tensor* hidden, const flashspec_draft_params* params,
                                       int32_t k, int32_t* tokens_out, float* logprobs_out) {
  if (!ctx) return guarded(nullptr, [] { fail(FLASHSPEC_ERR_NULL_POINTER, "ctx: is NULL"); });
  return guarded(ctx, [&] {
    const LmHeadStorage& storage = validate_head(*ctx, head, "head");
    const DraftArgs args = validate_draft_top_k(*ctx, storage, hidden, params, k, tokens_out, logprobs_out);
    naming_fields(draft_names(), [&] { ctx->backend->draft_top_k(storage, args, k, tokens_out, logprobs_out); });
  });
}

void flashspec_sampling_controls_init(flashspec_sampling_controls* controls) {
  if (!controls) return;
  *controls = flashspec_sampling_controls{};
  controls->struct_size = sizeof(flashspec_sampling_controls);
}

void flashspec_verify_batch_init_sized(flashspec_verify_batch* batch, size_t size) {
  flashspec_verify_batch defaults{};
  defaults.memory = FLASHSPEC_MEMORY_HOST;
  init_prefix(batch, size, defaults);
}

void flashspec_verify_result_init_sized(flashspec_verify_result* result, size_t size) {
  flashspec_verify_result defaults{};
  defaults.memory = FLASHSPEC_MEMORY_HOST;
  init_prefix(result, size, defaults);
}

flashspec_status flashspec_summaries_create(flashspec_context* ctx, int32_t max_rows, int32_t max_requests,
                                            flashspec_summaries** out) {
  if (!ctx) return guarded(nullptr, [] { fail(FLASHSPEC_ERR_NULL_POINTER, "ctx: is NULL"); });
  return guarded(ctx, [&] {
    require(out != nullptr, FLASHSPEC_ERR_NULL_POINTER, "out", "is NULL");
    require(max_rows >= 1 && max_rows <= (1 << 24), FLASHSPEC_ERR_OUT_OF_RANGE, "max_rows",
            "must be in [1, 2^24], got " + std::to_string(max_rows));
    require(max_requests >= 1 && max_requests <= max_rows, FLASHSPEC_ERR_OUT_OF_RANGE, "max_requests",
            "must be in [1, max_rows], got " + std::to_string(max_requests));
    auto summaries = std::make_unique<flashspec_summaries>();
    summaries->store = ctx->backend->create_summaries(max_rows, max_requests);
    summaries->owner = ctx;
    *out = summaries.release();
  });
}

void flashspec_summaries_destroy(flashspec_summaries* summaries) { delete summaries; }

flashspec_status flashspec_verify(flashspec_context* ctx, const flashspec_lm_head* head,
                                  const flashspec_verify_batch* batch, flashspec_summaries* summaries) {
  if (!ctx) return guarded(nullptr, [] { fail(FLASHSPEC_ERR_NULL_POINTER, "ctx: is NULL"); });
  return guarded(ctx, [&] {
    SummaryStore& store = checked_summaries(*ctx, summaries);
    const LmHeadStorage& storage = validate_head(*ctx, head, "head");
    const flashspec_verify_batch b = load_batch(batch);
    const VerifyArgs args = validate_batch(*ctx, storage, b, &store, "summaries");
    const VerifiedBatch described = describe_batch(storage, b, args);
    naming_fields(verify_names(), [&] { ctx->backend->verify(storage, args, store); });
    summaries->verified = described;
  });
}

flashspec_status flashspec_finalize(flashspec_context* ctx, const flashspec_verify_batch* batch,
                                    const flashspec_summaries* summaries, const flashspec_verify_result* result) {
  if (!ctx) return guarded(nullptr, [] { fail(FLASHSPEC_ERR_NULL_POINTER, "ctx: is NULL"); });
  return guarded(ctx, [&] {
    const SummaryStore& store = checked_summaries(*ctx, summaries);
    const VerifyArgs args = validate_batch_for_finalize(*ctx, load_batch(batch), summaries->verified);
    const ResultArgs out = validate_result(*ctx, result);
    validate_result_requests(out, summaries->verified.logprobs, summaries->verified.top_logprobs, "batch");
    validate_result_disjoint(args, out, backend_memory(*ctx->backend) == FLASHSPEC_MEMORY_HOST);
    ctx->backend->finalize(args, store, out);
  });
}

flashspec_status flashspec_verify_and_finalize(flashspec_context* ctx, const flashspec_lm_head* head,
                                               const flashspec_verify_batch* batch,
                                               const flashspec_verify_result* result) {
  if (!ctx) return guarded(nullptr, [] { fail(FLASHSPEC_ERR_NULL_POINTER, "ctx: is NULL"); });
  return guarded(ctx, [&] {
    // Everything is validated before any work, once: the context's own
    // summaries then describe exactly this batch.
    const ResultArgs out = validate_result(*ctx, result);
    const LmHeadStorage& storage = validate_head(*ctx, head, "head");
    const VerifyArgs args = validate_batch(*ctx, storage, load_batch(batch), ctx->own_summaries.get(), "context workspace");
    validate_result_requests(out, args.logprobs, args.top_logprobs, "batch");
    validate_result_disjoint(args, out, backend_memory(*ctx->backend) == FLASHSPEC_MEMORY_HOST);
    naming_fields(verify_names(), [&] {
      ctx->backend->verify(storage, args, *ctx->own_summaries);
      ctx->backend->finalize(args, *ctx->own_summaries, out);
    });
  });
}

void flashspec_philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
  if (!counter || !key || !out) return;
  Philox4 r = philox4x32_10(counter[0], counter[1], counter[2], counter[3], key[0], key[1]);
  for (int i = 0; i < 4; ++i) out[i] = r.v[i];
}

double flashspec_rng_uniform(uint64_t seed, uint64_t request_id, uint64_t step, int32_t position,
                             flashspec_rng_purpose purpose, int32_t token) {
  const int32_t raw = raw_enum(purpose);
  if (raw < FLASHSPEC_RNG_DRAFT_NOISE || raw > FLASHSPEC_RNG_BONUS_NOISE) return std::nan("");
  RngRowKey key = make_row_key(seed, request_id, step, position, flashspec_rng_purpose(raw));
  return uniform_from_bits(row_word(key, token));
}

flashspec_tensor flashspec_tensor_make(const void* data, flashspec_dtype dtype, flashspec_memory memory,
                                       int64_t rows, int64_t cols) {
  flashspec_tensor t;
  t.data = data;
  t.dtype = dtype;
  t.memory = memory;
  t.rows = rows;
  t.cols = cols;
  t.row_stride = cols;
  return t;
}

}  // extern "C"
