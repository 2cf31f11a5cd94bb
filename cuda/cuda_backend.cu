// The CUDA backend: LM heads and summaries in device memory, and draft /
// verify / finalize as a short, fixed sequence of kernels on the context's
// stream (plans → staged hidden → scan → combine [→ finalize]). Everything a
// call needs is allocated at creation, so the hot path neither allocates nor
// synchronises and can be captured in a CUDA graph.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "combine.h"
#include "codes.cuh"
#include "controls.h"
#include "device_storage.h"
#include "dispatch.h"
#include "finalize.h"
#include "kernels/backend.h"
#include "kernels/cuda_module.h"
#include "prepare.h"
#include "sampling/gumbel_bounds.h"
#include "scan_gemm.h"
#include "util/dtype.h"
#include "util/status.h"

namespace flashspec {
namespace cuda {
namespace {

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendConfig& config)
      : device_(config.device_ordinal),
        stream_(static_cast<cudaStream_t>(config.cuda_stream)),
        max_rows_(config.max_rows) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
      cudaGetLastError();
      fail(FLASHSPEC_ERR_NO_DEVICE, Field::kBackend,
           "no CUDA device is usable (" + std::string(cudaGetErrorString(e)) + ")");
    }
    require(device_ < count, FLASHSPEC_ERR_NO_DEVICE, Field::kDeviceOrdinal,
            "device " + std::to_string(device_) + " does not exist (" + std::to_string(count) + " devices)");
    DeviceScope scope(device_);
    limits_ = configure_scans(device_);
    check_cuda(controls::configure(limits_.max_smem, &controls_smem_),
               "controlled streaming scan setup");
    check_cuda(finalize::configure(), "cudaFuncSetAttribute (finalize)");

    const size_t partials = size_t(tuning::kMaxGroups) * size_t(max_rows_);
    plans_.allocate(size_t(max_rows_) * sizeof(RowPlan), "cudaMalloc (row plans)");
    hidden_bad_.allocate(size_t(max_rows_) * sizeof(int32_t), "cudaMalloc (hidden flags)");
    partials_.allocate(partials * sizeof(Partial), "cudaMalloc (partials)");
    q_partials_.allocate(partials * sizeof(QPartial), "cudaMalloc (q partials)");
    residuals_.allocate(partials * sizeof(Residual), "cudaMalloc (residuals)");
    level_partials_.allocate(2 * partials * sizeof(QPartial), "cudaMalloc (residual chain partials)");
    row_drafts_.allocate(size_t(max_rows_) * sizeof(RowDrafts), "cudaMalloc (tried drafts)");
    tried_.allocate(size_t(max_rows_) * sizeof(int32_t), "cudaMalloc (tried drafts)");
    verdicts_.allocate(size_t(max_rows_) * sizeof(DraftVerdict), "cudaMalloc (draft verdicts)");
    flag_.allocate(sizeof(int32_t), "cudaMalloc (flag)");
    done_counter_.allocate(sizeof(int32_t), "cudaMalloc (scan counter)");
    shard_summaries_.allocate(size_t(max_rows_) * sizeof(RowSummary), "cudaMalloc (shard summaries)");
    shard_status_.allocate(sizeof(int32_t), "cudaMalloc (shard batch status)");
    check_cuda(cudaMemset(done_counter_.as<void>(), 0, sizeof(int32_t)), "cudaMemset (scan counter)");

    // Rows beyond the weight-streaming scan's, and every call with sampling
    // controls or logprobs (controls.h), go through cuBLAS, one vocabulary
    // chunk of logits at a time.
    {
      chunk_ = gemm_chunk_tokens(max_rows_);
      const size_t controls_bytes = controls::workspace_bytes(max_rows_, config.max_requests, chunk_);
      controls_storage_.allocate(controls_bytes, "cudaMalloc (sampling controls workspace)");
      controls_ = controls::carve_workspace(controls_storage_.as<void>(), max_rows_, config.max_requests, chunk_);
      // The cuBLAS scans fold one logits chunk on a side stream while cuBLAS
      // writes the next (scan_gemm.h).
      check_cuda(cudaStreamCreateWithFlags(&side_stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      for (cudaEvent_t* e : {&chunk_ready_[0], &chunk_ready_[1], &chunk_freed_[0], &chunk_freed_[1], &side_joined_})
        check_cuda(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
      // Two chunks of logits: the cuBLAS scans fold one while cuBLAS writes
      // the other (scan_gemm.h).
      chunk_logits_.allocate(2 * size_t(max_rows_) * size_t(chunk_) * sizeof(float), "cudaMalloc (logits chunks)");
      cublas_workspace_.allocate(tuning::kCublasWorkspaceBytes, "cudaMalloc (cuBLAS workspace)");
      // The Gumbel bounds the fold of a sampled row prunes with: the CPU
      // backend's table.
      const std::array<float, 256>& bounds = gumbel_bucket_bounds();
      gumbel_bounds_.allocate(sizeof bounds, "cudaMalloc (Gumbel bounds)");
      check_cuda(cudaMemcpy(gumbel_bounds_.as<void>(), bounds.data(), sizeof bounds, cudaMemcpyHostToDevice),
                 "cudaMemcpy (Gumbel bounds)");
      cublasHandle_t handle = nullptr;
      check_cublas(cublasCreate(&handle), "cublasCreate");
      cublasStatus_t bound = cublasSetStream(handle, stream_);
      if (bound == CUBLAS_STATUS_SUCCESS)
        bound = cublasSetWorkspace(handle, cublas_workspace_.as<void>(), cublas_workspace_.bytes());
      if (bound != CUBLAS_STATUS_SUCCESS) cublasDestroy(handle);
      check_cublas(bound, "cublasSetStream / cublasSetWorkspace");
      cublas_ = handle;
    }
  }

  ~CudaBackend() override {
    int previous = 0;
    if (cudaGetDevice(&previous) == cudaSuccess && previous != device_) cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    cudaGetLastError();
    if (cublas_) cublasDestroy(cublas_);
    for (cudaEvent_t e : {chunk_ready_[0], chunk_ready_[1], chunk_freed_[0], chunk_freed_[1], side_joined_})
      if (e) cudaEventDestroy(e);
    if (side_stream_) cudaStreamDestroy(side_stream_);
    for (DeviceBuffer* b : {&plans_, &hidden_bad_, &partials_, &q_partials_, &residuals_, &level_partials_,
                            &row_drafts_, &tried_, &verdicts_, &flag_, &done_counter_,
                            &staging_, &chunk_logits_, &cublas_workspace_, &gumbel_bounds_, &shard_summaries_,
                            &shard_status_, &controls_storage_, &ring_staging_})
      b->reset();
    if (previous != device_) cudaSetDevice(previous);
  }

  flashspec_backend kind() const override { return FLASHSPEC_BACKEND_CUDA; }
  int device() const override { return device_; }
  int last_cuda_error() const override { return last_error_; }

  std::unique_ptr<LmHeadStorage> create_lm_head(const flashspec_tensor& weight, flashspec_lm_head_flags flags,
                                                const float* host_scales) override {
    DeviceScope scope(device_);
    const size_t esize = dtype_size(weight.dtype);
    auto head = std::make_unique<CudaLmHead>();
    head->backend = FLASHSPEC_BACKEND_CUDA;
    head->device = device_;
    head->dtype = weight.dtype;
    head->vocab = weight.rows;
    head->hidden = weight.cols;
    // Tensor cores take 16-bit weights as they are and 8-bit codes through
    // exact bf16 conversions; fp32 weights go to the CUDA-core scan.
    const bool tensor_dtype = weight.dtype != FLASHSPEC_DTYPE_F32;
    const int64_t row_quantum = int64_t(16 / esize);  // elements per 16 bytes
    require(weight.rows <= INT32_MAX && weight.cols <= INT32_MAX, FLASHSPEC_ERR_OUT_OF_RANGE, Field::kWeight,
            "too large");
    if (weight.memory == FLASHSPEC_MEMORY_CUDA) check_device_pointer(weight.data);
    if (flags == FLASHSPEC_LM_HEAD_BORROW) {
      require(weight.memory == FLASHSPEC_MEMORY_CUDA, FLASHSPEC_ERR_DEVICE_MISMATCH, Field::kFlags,
              "BORROW needs device memory; host weights must be copied");
      head->data = weight.data;
      head->row_stride = weight.row_stride;
      const bool aligned16 = reinterpret_cast<uintptr_t>(weight.data) % 16 == 0 &&
                             (weight.row_stride * int64_t(esize)) % 16 == 0 && weight.cols % row_quantum == 0;
      head->tensor_cores = tensor_dtype && aligned16;
      head->d_load = int32_t(weight.cols);
    } else {
      // A copy with rows padded to 16 bytes (zeros), so every row is aligned
      // for 16-byte loads whatever the caller's layout.
      const int64_t ld = round_up(weight.cols, row_quantum);
      head->storage.allocate(size_t(weight.rows) * size_t(ld) * esize, "cudaMalloc (LM head)");
      if (ld != weight.cols)
        check_cuda(cudaMemsetAsync(head->storage.as<void>(), 0, head->storage.bytes(), stream_), "cudaMemsetAsync");
      check_cuda(cudaMemcpy2DAsync(head->storage.as<void>(), size_t(ld) * esize, weight.data,
                                   size_t(weight.row_stride) * esize, size_t(weight.cols) * esize,
                                   size_t(weight.rows),
                                   weight.memory == FLASHSPEC_MEMORY_CUDA ? cudaMemcpyDeviceToDevice
                                                                          : cudaMemcpyHostToDevice,
                                   stream_),
                 "cudaMemcpy2DAsync (LM head)");
      head->data = head->storage.as<void>();
      head->row_stride = ld;
      head->tensor_cores = tensor_dtype;
      head->d_load = int32_t(tensor_dtype ? round_up(weight.cols, row_quantum) : weight.cols);
    }
    if (host_scales) {
      head->row_scales.allocate(size_t(weight.rows) * sizeof(float), "cudaMalloc (LM head scales)");
      check_cuda(cudaMemcpyAsync(head->row_scales.as<void>(), host_scales, size_t(weight.rows) * sizeof(float),
                                 cudaMemcpyHostToDevice, stream_),
                 "cudaMemcpyAsync (LM head scales)");
      head->scales = head->row_scales.as<float>();
    }
    check_cuda(prepare::find_non_finite(head->data, head->dtype, head->vocab, head->hidden, head->row_stride,
                                        flag_.as<int32_t>(), stream_),
               "non-finite check (LM head)");
    int32_t found = 0;
    check_cuda(cudaMemcpyAsync(&found, flag_.as<int32_t>(), sizeof found, cudaMemcpyDeviceToHost, stream_),
               "cudaMemcpyAsync");
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    require(found == 0, FLASHSPEC_ERR_NON_FINITE, Field::kWeight, "holds a NaN or Inf value");
    reserve_staging(head->hidden);
    if (head->codes()) reserve_dequantized(head->hidden);
    if (head->codes()) reserve_ring_hidden(*head);
    return head;
  }

  std::unique_ptr<SummaryStore> create_summaries(int32_t max_rows, int32_t max_requests) override {
    DeviceScope scope(device_);
    auto store = std::make_unique<CudaSummaries>();
    store->backend = FLASHSPEC_BACKEND_CUDA;
    store->device = device_;
    store->max_rows = max_rows;
    store->max_requests = max_requests;
    store->rows.allocate(size_t(max_rows) * sizeof(RowSummary), "cudaMalloc (summaries)");
    store->batch_status.allocate(sizeof(int32_t), "cudaMalloc (summaries)");
    const size_t top = size_t(max_rows) * FLASHSPEC_MAX_TOP_LOGPROBS;
    store->top_tokens.allocate(top * sizeof(int32_t), "cudaMalloc (summaries)");
    store->top_logprobs.allocate(top * sizeof(float), "cudaMalloc (summaries)");
    store->drawing_rows.allocate(size_t(max_rows) * sizeof(int32_t), "cudaMalloc (summaries)");
    return store;
  }

  void draft(const LmHeadStorage& head_base, const DraftArgs& args) override {
    DeviceScope scope(device_);
    const auto& head = static_cast<const CudaLmHead&>(head_base);
    guard([&] {
      const bool tc = stage(head, *args.hidden, draft_may_sample(args), false, args.controls.present);
      check_cuda(prepare::draft_plans(args, head.vocab, plans_.as<RowPlan>(), stream_, true), "draft plans");
      if (args.controls.present) {
        controls::Outputs out = {};
        out.tokens_out = args.tokens_out;
        out.scores_out = args.scores_out;
        run_controlled(head, tc, args.rows, args.controls, args.rows, nullptr, 0, out, Field::kHidden);
        return;
      }
      StreamTail tail = stream_tail();
      tail.tokens_out = args.tokens_out;
      tail.scores_out = args.scores_out;
      const ScanOutcome scan =
          run_scan(limits_, workspace(head), head, tc, args.rows, draft_may_sample(args), nullptr, tail, stream_);
      if (!scan.combined)
        check_cuda(combine::draft_rows(sources(args.rows, scan.groups, nullptr), args.tokens_out, args.scores_out,
                                       stream_),
                   "draft combine");
    });
  }

  // The controlled pass with every row keeping its k best candidates, at
  // temperature 1 (the params' temperatures are not read).
  void draft_top_k(const LmHeadStorage& head_base, const DraftArgs& args, int32_t k, int32_t* tokens,
                   float* logprobs) override {
    DeviceScope scope(device_);
    const auto& head = static_cast<const CudaLmHead&>(head_base);
    guard([&] {
      DraftArgs at_one = args;
      at_one.temperature = 1.0f;
      at_one.temperatures = nullptr;
      const bool tc = stage(head, *args.hidden, true, false, true);
      check_cuda(prepare::draft_plans(at_one, head.vocab, plans_.as<RowPlan>(), stream_, true), "draft plans");
      controls::Outputs out = {};
      out.topk = k;
      out.topk_tokens = tokens;
      out.topk_logprobs = logprobs;
      run_controlled(head, tc, args.rows, args.controls, args.rows, nullptr, 0, out, Field::kHidden);
    });
  }

  void verify(const LmHeadStorage& head_base, const VerifyArgs& args, SummaryStore& store_base) override {
    DeviceScope scope(device_);
    const auto& head = static_cast<const CudaLmHead&>(head_base);
    auto& store = static_cast<CudaSummaries&>(store_base);
    guard([&] {
      const bool stochastic = has_draft_distribution(args);
      const bool controlled = args.controls.present || args.logprobs || args.top_logprobs > 0;
      const bool tc = stage(head, *args.target_hidden, verify_may_sample(args), stochastic, controlled);
      check_cuda(prepare::verify_plans(args, int32_t(head.vocab), nullptr, plans_.as<RowPlan>(),
                                       store.batch_status.as<int32_t>(), stream_, true,
                                       stochastic ? row_drafts_.as<RowDrafts>() : nullptr, tried_.as<int32_t>()),
                 "verify plans");
      store.top_n = args.top_logprobs;
      if (controlled) {
        controls::Outputs out = {};
        out.summaries = store.rows.as<RowSummary>();
        out.top_tokens = store.top_tokens.as<int32_t>();
        out.top_logprobs = store.top_logprobs.as<float>();
        run_controlled(head, tc, args.total_rows, args.controls, args.num_requests, store.batch_status.as<int32_t>(),
                       args.top_logprobs, out, Field::kHidden);
        return;
      }
      StreamTail tail = stream_tail();
      tail.batch_status = store.batch_status.as<int32_t>();
      tail.summaries = store.rows.as<RowSummary>();
      const StochasticDrafts drafts = stochastic_drafts(args);
      const StochasticDrafts* q = stochastic ? &drafts : nullptr;
      const ScanOutcome scan =
          run_scan(limits_, workspace(head), head, tc, args.total_rows, verify_may_sample(args), q, tail, stream_);
      if (!scan.combined)
        check_cuda(combine::verify_rows(sources(args.total_rows, scan.groups, q),
                                        store.batch_status.as<int32_t>(), store.rows.as<RowSummary>(), stream_),
                   "verify combine");
    });
  }

  void finalize(const VerifyArgs& args, const SummaryStore& store_base, const ResultArgs& result) override {
    DeviceScope scope(device_);
    const auto& store = static_cast<const CudaSummaries&>(store_base);
    guard([&] {
      const finalize::TopLogprobs top{store.top_tokens.as<int32_t>(), store.top_logprobs.as<float>(), store.top_n,
                                      store.drawing_rows.as<int32_t>()};
      check_cuda(finalize::requests(args, store.rows.as<RowSummary>(), store.batch_status.as<int32_t>(), result,
                                    top, stream_),
                 "finalize");
    });
  }

  // Vocabulary shards: the scans fold global token ids (ScanParams::
  // token_base), so a shard's partials are those of its slice of the whole
  // head; the records are their per-row merge. Device records are checked
  // per row when merged (a row that does not tile gets INVALID_ARGUMENT).
  void verify_records(const LmHeadStorage& head_base, const VerifyArgs& args, ShardRecord* records) override {
    DeviceScope scope(device_);
    const auto& head = static_cast<const CudaLmHead&>(head_base);
    guard([&] {
      check_cuda(prepare::verify_plans(args, int32_t(head.vocab_size), nullptr, plans_.as<RowPlan>(),
                                       shard_status_.as<int32_t>(), stream_),
                 "verify plans");
      scan_records(head, *args.target_hidden, args.total_rows, verify_may_sample(args), records);
    });
  }

  void draft_records(const LmHeadStorage& head_base, const DraftArgs& args, ShardRecord* records) override {
    DeviceScope scope(device_);
    const auto& head = static_cast<const CudaLmHead&>(head_base);
    guard([&] {
      check_cuda(prepare::draft_plans(args, head.vocab, plans_.as<RowPlan>(), stream_), "draft plans");
      scan_records(head, *args.hidden, args.rows, draft_may_sample(args), records);
    });
  }

  void finalize_records(const VerifyArgs& args, const ShardRecord* records, int32_t shards,
                        const ResultArgs& result) override {
    DeviceScope scope(device_);
    guard([&] {
      check_cuda(prepare::verify_plans(args, 0, &records[0].vocab_size, plans_.as<RowPlan>(),
                                       shard_status_.as<int32_t>(), stream_),
                 "verify plans");
      check_cuda(combine::summaries_from_records(plans_.as<RowPlan>(), records, shards, args.total_rows,
                                                 shard_status_.as<int32_t>(), shard_summaries_.as<RowSummary>(),
                                                 stream_),
                 "merge of shard records");
      check_cuda(finalize::requests(args, shard_summaries_.as<RowSummary>(), shard_status_.as<int32_t>(), result,
                                    finalize::TopLogprobs{}, stream_),
                 "finalize");
    });
  }

  void draft_from_records(const DraftArgs& args, const ShardRecord* records, int32_t shards) override {
    DeviceScope scope(device_);
    guard([&] {
      check_cuda(prepare::draft_plans(args, 0, plans_.as<RowPlan>(), stream_), "draft plans");
      check_cuda(combine::drafts_from_records(plans_.as<RowPlan>(), records, shards, args.rows, args.tokens_out,
                                              args.scores_out, stream_),
                 "merge of shard records");
    });
  }

  void synchronize() override {
    DeviceScope scope(device_);
    guard([&] { check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); });
  }

  void* allocate_staging(size_t bytes) override {
    DeviceScope scope(device_);
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, bytes), "cudaMalloc (staging)");
    return p;
  }

  void release_staging(void* data) noexcept override {
    if (!data) return;
    int previous = 0;
    if (cudaGetDevice(&previous) == cudaSuccess && previous != device_) cudaSetDevice(device_);
    cudaFree(data);
    if (previous != device_) cudaSetDevice(previous);
  }

  void copy_in(void* dst, const void* host_src, size_t bytes) override {
    DeviceScope scope(device_);
    guard([&] {
      check_cuda(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (staging)");
    });
  }

  void copy_out(void* host_dst, const void* src, size_t bytes) override {
    DeviceScope scope(device_);
    guard([&] {
      check_cuda(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync (staging)");
      check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    });
  }

 private:
  // Keeps the raw CUDA error of a failed call for
  // flashspec_context_last_cuda_error.
  template <class Body>
  void guard(Body&& body) {
    try {
      body();
    } catch (const Error& e) {
      last_error_ = e.cuda_error();
      throw;
    }
  }

  void check_device_pointer(const void* p) {
    cudaPointerAttributes attr{};
    cudaError_t e = cudaPointerGetAttributes(&attr, p);
    if (e != cudaSuccess) {
      cudaGetLastError();
      fail(FLASHSPEC_ERR_DEVICE_MISMATCH, Field::kWeight, "data is not CUDA memory");
    }
    require(attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged, FLASHSPEC_ERR_DEVICE_MISMATCH,
            Field::kWeight, "data is not device memory");
    require(attr.type == cudaMemoryTypeManaged || attr.device == device_, FLASHSPEC_ERR_DEVICE_MISMATCH,
            Field::kWeight,
            "data lives on device " + std::to_string(attr.device) + ", the context uses device " +
                std::to_string(device_));
  }

  // Staged hidden rows: [max_rows, k_pad] fp32 at most (the CUDA-core
  // path), then a float per row. An 8-bit head stages them in bf16, which
  // leaves room for the tile scan's f16 copies (TileHidden) in the second
  // half and their factors after it (stage).
  size_t staging_bytes(int64_t d) const {
    return size_t(max_rows_) * (size_t(round_up(d, 64)) * sizeof(float) + sizeof(float));
  }
  void reserve_staging(int64_t d) {
    const size_t need = staging_bytes(d);
    if (staging_.bytes() >= need) return;
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    staging_.allocate(need, "cudaMalloc (hidden staging)");
  }

  // The 8-bit-code TMA ring's copies of up to kStreamMaxRows staged rows
  // (RingHidden): bf16 and f16 rows of ring_code_columns(k_pad) values,
  // then the factors.
  size_t ring_hidden_bytes(int64_t k_pad) const {
    return size_t(tuning::kStreamMaxRows) * (2 * size_t(ring_code_columns(k_pad)) * 2 + sizeof(float));
  }
  void reserve_ring_hidden(const CudaLmHead& head) {
    const size_t need = ring_hidden_bytes(head.staged_columns());
    if (ring_staging_.bytes() >= need) return;
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    ring_staging_.allocate(need, "cudaMalloc (hidden rows for the 8-bit-code ring)");
  }

  // bf16 copies of an 8-bit head's codes, gemm_scan::kDequantTokens rows at
  // a time, for the cuBLAS scans (more than kStreamMaxRows rows, controls).
  void reserve_dequantized(int64_t d) {
    const size_t need = size_t(gemm_scan::kDequantTokens) * size_t(round_up(d, 16)) * 2;
    if (dequantized_.bytes() >= need) return;
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    dequantized_.allocate(need, "cudaMalloc (dequantised LM-head rows)");
  }

  // Stages the hidden rows; returns whether the tensor-core scans apply
  // (never for a stochastic draft of an 8-bit head, which the CUDA-core scan
  // serves: `stochastic`). Where run_scan may take the 8-bit-code TMA ring
  // (scan_reads_ring_order; not for `controlled` calls, which run_controlled
  // serves), the rows' copies it reads too (RingHidden), and where it may
  // take the tile scan for an 8-bit head (scan_reads_tile_f16; may_sample
  // as run_scan's), their f16 copies (TileHidden): workspace() hands them
  // on until the next call stages.
  bool stage(const CudaLmHead& head, const flashspec_tensor& hidden, bool may_sample, bool stochastic = false,
             bool controlled = false) {
    const int64_t k_pad = head.staged_columns();
    require(size_t(hidden.rows) * size_t(k_pad) * sizeof(float) <= staging_.bytes(), FLASHSPEC_ERR_WORKSPACE_EXCEEDED,
            Field::kHead, "its hidden size exceeds the staging this context reserved (create the head on this context)");
    const bool tc = head.tensor_cores && hidden.dtype == head.compute_dtype() && !(stochastic && head.codes());
    ring_hidden_ = RingHidden{};
    if (!stochastic && !controlled && scan_reads_ring_order(limits_, head, tc, int(hidden.rows)) &&
        ring_hidden_bytes(k_pad) <= ring_staging_.bytes()) {
      const size_t copy = size_t(tuning::kStreamMaxRows) * size_t(ring_code_columns(k_pad));
      ring_hidden_.bf16 = ring_staging_.as<uint16_t>();
      ring_hidden_.f16 = ring_hidden_.bf16 + copy;
      ring_hidden_.factors = reinterpret_cast<float*>(ring_hidden_.f16 + copy);
    }
    tile_hidden_ = TileHidden{};
    if (!stochastic && !controlled && scan_reads_tile_f16(limits_, head, tc, int(hidden.rows), may_sample) &&
        staging_bytes(k_pad) <= staging_.bytes()) {
      // Beyond the bf16 rows of max_rows_ rows: the f16 rows, then the factors.
      const size_t rows_values = size_t(max_rows_) * size_t(k_pad);
      tile_hidden_.f16 = staging_.as<uint16_t>() + rows_values;
      tile_hidden_.factors = reinterpret_cast<float*>(tile_hidden_.f16 + rows_values);
    }
    check_cuda(prepare::stage_hidden(hidden, int32_t(k_pad), !tc, staging_.as<void>(), hidden_bad_.as<int32_t>(),
                                     ring_hidden_, tile_hidden_, stream_),
               "stage hidden");
    return tc;
  }

  // The pass of a call with sampling controls or logprobs (plans written,
  // hidden rows staged): cuBLAS chunks over W in its own dtype, so the
  // hidden rows must have been staged in it.
  void run_controlled(const CudaLmHead& head, bool tc, int rows, const ControlsArgs& c, int32_t requests,
                      const int32_t* batch_status, int32_t top_n,
                      const controls::Outputs& out, Field field) {
    const bool wide = head.dtype == FLASHSPEC_DTYPE_F32;
    require(tc || wide, FLASHSPEC_ERR_UNSUPPORTED, field,
            "sampling controls and logprobs on the CUDA backend need hidden rows in the LM head's dtype (bf16 for "
            "an 8-bit head) and a 16-byte-aligned head");
    require(!head.codes() || dequantized_for(head), FLASHSPEC_ERR_WORKSPACE_EXCEEDED, Field::kHead,
            "an 8-bit head needs a workspace this context reserves when the head is created on it");
    const int64_t slices = (head.vocab + controls::kSliceTokens - 1) / controls::kSliceTokens;
    require(slices <= controls_.max_groups, FLASHSPEC_ERR_UNSUPPORTED, Field::kHead,
            "the vocabulary is too large for sampling controls on the CUDA backend (at most " +
                std::to_string(int64_t(controls_.max_groups) * controls::kSliceTokens) + " tokens)");
    controls::Pass p = {};
    p.w = head.data;
    p.ldw = head.row_stride;
    p.w_dtype = head.dtype;
    p.w_scale = head.scales;
    p.dequantized = dequantized_for(head);
    p.vocab = int32_t(head.vocab);
    p.d = int32_t(head.hidden);
    p.d_load = head.d_load;
    p.hidden = staging_.as<void>();
    p.k_pad = head.staged_columns();
    p.rows = rows;
    p.plans = plans_.as<RowPlan>();
    p.hidden_bad = hidden_bad_.as<int32_t>();
    p.controls = c;
    p.requests = requests;
    p.batch_status = batch_status;
    p.top_n = top_n;
    p.cublas = cublas_;
    p.chunks = chunk_pipeline();
    p.chunk = chunk_;
    p.stream_scan = tc;
    p.sm_count = limits_.sm_count;
    p.smem_limits = &controls_smem_;
    p.fused_scratch = chunk_logits_.as<void>();
    p.fused_scratch_bytes = chunk_logits_.bytes();
    const char* cublas_failure = nullptr;
    const cudaError_t e = controls::run(controls_, p, out, stream_, &cublas_failure);
    check_cuda(e, "sampling controls pass");
    if (cublas_failure) fail(FLASHSPEC_ERR_CUDA, std::string("sampling controls pass: ") + cublas_failure);
  }

  // The scan of a shard's rows (plans already written) into its records.
  void scan_records(const CudaLmHead& head, const flashspec_tensor& hidden, int rows, bool may_sample,
                    ShardRecord* records) {
    const bool tc = stage(head, hidden, may_sample);
    StreamTail tail = stream_tail();
    tail.records = records;
    tail.vocab_size = int32_t(head.vocab_size);
    const ScanOutcome scan = run_scan(limits_, workspace(head), head, tc, rows, may_sample, nullptr, tail, stream_);
    if (!scan.combined)
      check_cuda(combine::record_rows(sources(rows, scan.groups, nullptr), int32_t(head.vocab_begin),
                                      int32_t(head.vocab_begin + head.vocab), int32_t(head.vocab_size), records,
                                      stream_),
                 "shard records");
  }

  ScanWorkspace workspace(const CudaLmHead& head) const {
    return ScanWorkspace{plans_.as<RowPlan>(),       staging_.as<void>(),       ring_hidden_,
                         tile_hidden_,
                         partials_.as<Partial>(),    q_partials_.as<QPartial>(), residuals_.as<Residual>(),
                         max_rows_,                  cublas_,                    chunk_pipeline(),
                         dequantized_for(head),      gumbel_bounds_.as<float>()};
  }

  // The two logits buffers of the cuBLAS scans and what orders them.
  gemm_scan::ChunkPipeline chunk_pipeline() const {
    const int64_t capacity = int64_t(max_rows_) * int64_t(chunk_);
    float* first = chunk_logits_.as<float>();
    return gemm_scan::ChunkPipeline{{first, first ? first + capacity : nullptr},
                                    capacity,
                                    side_stream_,
                                    {chunk_ready_[0], chunk_ready_[1]},
                                    {chunk_freed_[0], chunk_freed_[1]},
                                    side_joined_};
  }

  // The bf16 rows an 8-bit head's cuBLAS scans use: NULL for other heads,
  // and for a head created on another context, which found none reserved
  // here (the cuBLAS scans then refuse it).
  uint16_t* dequantized_for(const CudaLmHead& head) const {
    const size_t need = size_t(gemm_scan::kDequantTokens) * size_t(head.d_load) * 2;
    return head.codes() && dequantized_.bytes() >= need ? dequantized_.as<uint16_t>() : nullptr;
  }

  StreamTail stream_tail() const {
    StreamTail tail = {};
    tail.done_counter = done_counter_.as<int32_t>();
    tail.hidden_bad = hidden_bad_.as<int32_t>();
    return tail;
  }

  // A verify batch's stochastic drafts as the scans and the combine read
  // them, with this context's lists and verdicts.
  StochasticDrafts stochastic_drafts(const VerifyArgs& args) const {
    StochasticDrafts d = {};
    if (args.draft_logits) {
      d.q_logits = args.draft_logits->data;
      d.q_dtype = args.draft_logits->dtype;
      d.q_ld = args.draft_logits->row_stride;
    }
    d.support_offsets = args.support_offsets;
    d.support_tokens = args.support_tokens;
    d.support_probs = args.support_probs;
    d.draft_tokens = args.draft_tokens;
    d.row_drafts = row_drafts_.as<RowDrafts>();
    d.tried = tried_.as<int32_t>();
    d.verdicts = verdicts_.as<DraftVerdict>();
    d.level_partials = level_partials_.as<QPartial>();
    return d;
  }

  combine::Sources sources(int rows, int groups, const StochasticDrafts* q) const {
    combine::Sources s = {};
    s.plans = plans_.as<RowPlan>();
    s.partials = partials_.as<Partial>();
    s.q_partials = q_partials_.as<QPartial>();
    s.residuals = residuals_.as<Residual>();
    s.hidden_bad = hidden_bad_.as<int32_t>();
    s.partial_stride = max_rows_;
    s.groups = groups;
    s.rows = rows;
    s.stochastic = q != nullptr;
    if (q) s.drafts = *q;
    return s;
  }

  int device_;
  cudaStream_t stream_;
  int32_t max_rows_;
  ScanLimits limits_;
  cublasHandle_t cublas_ = nullptr;  // many-row scans and calls with sampling controls
  int32_t chunk_ = 0;                // tokens per cuBLAS logits chunk
  DeviceBuffer chunk_logits_, cublas_workspace_, gumbel_bounds_;
  DeviceBuffer dequantized_;  // bf16 copies of 8-bit codes (reserve_dequantized)
  DeviceBuffer done_counter_;  // CTAs of a weight-streaming scan that have finished
  int last_error_ = 0;
  DeviceBuffer plans_, hidden_bad_, partials_, q_partials_, residuals_, flag_, staging_;
  DeviceBuffer ring_staging_;  // the code ring's copies of staged rows (reserve_ring_hidden)
  RingHidden ring_hidden_ = {};  // in ring_staging_: the last staged rows' copies, where staged (stage)
  TileHidden tile_hidden_ = {};  // in staging_: the last staged rows' f16 copies, where staged (stage)
  DeviceBuffer level_partials_, row_drafts_, tried_, verdicts_;  // stochastic drafts' residual chains
  DeviceBuffer shard_summaries_, shard_status_;  // finalize of gathered shard records
  DeviceBuffer controls_storage_;                // calls with sampling controls or logprobs
  controls::Workspace controls_ = {};
  controls::ScanSmemLimits controls_smem_ = {};  // the controlled streaming scans' (configure)
  cudaStream_t side_stream_ = nullptr;           // the controlled pass's folds
  cudaEvent_t chunk_ready_[2] = {}, chunk_freed_[2] = {}, side_joined_ = nullptr;
};

}  // namespace

std::unique_ptr<Backend> make_backend(const BackendConfig& config) { return std::make_unique<CudaBackend>(config); }

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

}  // namespace cuda
}  // namespace flashspec
