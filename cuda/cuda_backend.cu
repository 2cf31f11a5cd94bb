// The CUDA backend: LM heads and summaries in device memory, and draft /
// verify / finalize as a short, fixed sequence of kernels on the context's
// stream (plans → staged hidden → scan → combine [→ finalize]). Everything a
// call needs is allocated at creation, so the hot path neither allocates nor
// synchronises and can be captured in a CUDA graph.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/backend.h"
#include "scan.h"
#include "scan_gemm.h"
#include "steps.h"
#include "testing.h"
#include "util/dtype.h"
#include "util/status.h"

namespace flashspec {
namespace {

using cuda::Partial;
using cuda::QPartial;
using cuda::Residual;
using cuda::RowPlan;

// Most token-range groups a scan may use (sizes the partials workspace).
constexpr int kMaxGroups = 1024;

[[noreturn]] void cuda_fail(cudaError_t e, const std::string& what) {
  cudaGetLastError();  // clear a non-sticky error so the context stays usable
  const flashspec_status status = e == cudaErrorMemoryAllocation ? FLASHSPEC_ERR_OUT_OF_MEMORY : FLASHSPEC_ERR_CUDA;
  throw Error(status, what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")", int(e));
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) cuda_fail(e, what);
}

void check_cublas(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  const flashspec_status status = s == CUBLAS_STATUS_ALLOC_FAILED ? FLASHSPEC_ERR_OUT_OF_MEMORY : FLASHSPEC_ERR_CUDA;
  throw Error(status, std::string(what) + ": cuBLAS status " + std::to_string(int(s)));
}

// Makes the backend's device current for the scope of a call.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceScope() {
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

// Owns one device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }
  void allocate(size_t bytes, const char* what) {
    reset();
    if (bytes == 0) return;
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), what);
    ptr_ = p;
    bytes_ = bytes;
  }
  void reset() {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

class CudaLmHead final : public LmHeadStorage {
 public:
  DeviceBuffer storage;  // empty for a borrowed head
  bool tensor_cores = false;  // 16-bit, 16-byte-aligned rows, d_load % 8 == 0
  int32_t d_load = 0;
};

class CudaSummaries final : public SummaryStore {
 public:
  DeviceBuffer rows;          // RowSummary[max_rows]
  DeviceBuffer batch_status;  // int32_t
};

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
      fail(FLASHSPEC_ERR_NO_DEVICE, "params->backend: no CUDA device is usable (" +
                                        std::string(cudaGetErrorString(e)) + ")");
    }
    require(device_ < count, FLASHSPEC_ERR_NO_DEVICE, "params->device_ordinal",
            "device " + std::to_string(device_) + " does not exist (" + std::to_string(count) + " devices)");
    DeviceScope scope(device_);
    check(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device_), "cudaDeviceGetAttribute");
    int optin = 0;
    check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_), "cudaDeviceGetAttribute");
    max_smem_ = size_t(optin);

    // Every scan kernel may use all the shared memory a block can have.
    for (int bm : {16, 64, 128})
      for (bool bf16 : {true, false}) {
        const void* k = cuda::scan::mma_kernel(bm, bf16);
        check(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, optin), "cudaFuncSetAttribute");
      }
    check(cudaFuncSetAttribute(cuda::scan::simt_kernel(), cudaFuncAttributeMaxDynamicSharedMemorySize, optin),
          "cudaFuncSetAttribute");
    for (int i = 0; i < 3; ++i) {
      const int bm = i == 0 ? 16 : i == 1 ? 64 : 128;
      int blocks = 0;
      check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, cuda::scan::mma_kernel(bm, true),
                                                          cuda::scan::mma_threads(), cuda::scan::mma_base_smem(bm)),
            "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
      mma_blocks_per_sm_[i] = std::max(1, blocks);
    }
    // The weight-streaming scans re-read the hidden rows (up to 16 × d × 2
    // bytes) from L1 for every tile: ask for the smallest shared-memory
    // carveout that still holds their resident CTAs, leaving the rest to L1.
    int smem_per_sm = 0, reserved_per_block = 0;
    check(cudaDeviceGetAttribute(&smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device_),
          "cudaDeviceGetAttribute");
    check(cudaDeviceGetAttribute(&reserved_per_block, cudaDevAttrReservedSharedMemoryPerBlock, device_),
          "cudaDeviceGetAttribute");
    for (int i = 0; i < 2; ++i) {
      for (bool bf16 : {true, false}) {
        const void* kernel = cuda::scan::stream_kernel(i == 0 ? 8 : 16, bf16);
        int blocks = 0;
        check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, cuda::scan::stream_threads(), 0),
              "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
        blocks = std::max(1, blocks);
        cudaFuncAttributes attributes{};
        check(cudaFuncGetAttributes(&attributes, kernel), "cudaFuncGetAttributes");
        const int needed = blocks * (int(attributes.sharedSizeBytes) + reserved_per_block);
        const int percent = std::min(100, (100 * needed + smem_per_sm - 1) / std::max(1, smem_per_sm));
        check(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, percent),
              "cudaFuncSetAttribute (carveout)");
        check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, cuda::scan::stream_threads(), 0),
              "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
        if (bf16) stream_blocks_per_sm_[i] = std::max(1, blocks);
      }
    }
    int blocks = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, cuda::scan::simt_kernel(),
                                                        cuda::scan::simt_threads(), cuda::scan::simt_base_smem()),
          "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    simt_blocks_per_sm_ = std::max(1, blocks);

    plans_.allocate(size_t(max_rows_) * sizeof(RowPlan), "cudaMalloc (row plans)");
    hidden_bad_.allocate(size_t(max_rows_) * sizeof(int32_t), "cudaMalloc (hidden flags)");
    partials_.allocate(size_t(kMaxGroups) * size_t(max_rows_) * sizeof(Partial), "cudaMalloc (partials)");
    q_partials_.allocate(size_t(kMaxGroups) * size_t(max_rows_) * sizeof(QPartial), "cudaMalloc (q partials)");
    residuals_.allocate(size_t(kMaxGroups) * size_t(max_rows_) * sizeof(Residual), "cudaMalloc (residuals)");
    flag_.allocate(sizeof(int32_t), "cudaMalloc (flag)");
    done_counter_.allocate(sizeof(int32_t), "cudaMalloc (scan counter)");
    check(cudaMemset(done_counter_.as<void>(), 0, sizeof(int32_t)), "cudaMemset (scan counter)");

    // Many rows go through cuBLAS, one vocabulary chunk of logits at a time
    // in a workspace of about 64 MiB (L2-sized per chunk for typical rows).
    if (max_rows_ > cuda::scan::stream_max_rows()) {
      const int64_t slice = cuda::gemm_scan::slice_tokens();
      const int64_t fit = (int64_t(64) << 20) / (int64_t(max_rows_) * int64_t(sizeof(float)));
      chunk_ = int32_t(std::max<int64_t>(slice, std::min<int64_t>(65536, fit / slice * slice)));
      chunk_logits_.allocate(size_t(max_rows_) * size_t(chunk_) * sizeof(float), "cudaMalloc (logits chunk)");
      cublas_workspace_.allocate(size_t(32) << 20, "cudaMalloc (cuBLAS workspace)");
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
    plans_.reset();
    hidden_bad_.reset();
    partials_.reset();
    q_partials_.reset();
    residuals_.reset();
    flag_.reset();
    done_counter_.reset();
    staging_.reset();
    if (cublas_) cublasDestroy(cublas_);
    chunk_logits_.reset();
    cublas_workspace_.reset();
    if (previous != device_) cudaSetDevice(previous);
  }

  flashspec_backend kind() const override { return FLASHSPEC_BACKEND_CUDA; }
  int device() const override { return device_; }
  int last_cuda_error() const override { return last_error_; }

  std::unique_ptr<LmHeadStorage> create_lm_head(const flashspec_tensor& weight,
                                                flashspec_lm_head_flags flags) override {
    DeviceScope scope(device_);
    const size_t esize = dtype_size(weight.dtype);
    const bool sixteen = weight.dtype != FLASHSPEC_DTYPE_F32;
    auto head = std::make_unique<CudaLmHead>();
    head->backend = FLASHSPEC_BACKEND_CUDA;
    head->device = device_;
    head->dtype = weight.dtype;
    head->vocab = weight.rows;
    head->hidden = weight.cols;
    require(weight.rows <= INT32_MAX && weight.cols <= INT32_MAX, FLASHSPEC_ERR_OUT_OF_RANGE, "weight",
            "too large");
    if (weight.memory == FLASHSPEC_MEMORY_CUDA) check_device_pointer(weight.data, "weight");
    if (flags == FLASHSPEC_LM_HEAD_BORROW) {
      require(weight.memory == FLASHSPEC_MEMORY_CUDA, FLASHSPEC_ERR_DEVICE_MISMATCH, "flags",
              "BORROW needs device memory; host weights must be copied");
      require(reinterpret_cast<uintptr_t>(weight.data) % esize == 0, FLASHSPEC_ERR_UNSUPPORTED, "weight",
              "data is not aligned to its element size; no kernel can read it");
      head->data = weight.data;
      head->row_stride = weight.row_stride;
      const bool aligned16 = reinterpret_cast<uintptr_t>(weight.data) % 16 == 0 &&
                             (weight.row_stride * int64_t(esize)) % 16 == 0 && weight.cols % 8 == 0;
      head->tensor_cores = sixteen && aligned16;
      head->d_load = int32_t(weight.cols);
    } else {
      // A copy with rows padded to 16 bytes (zeros), so every row is aligned
      // for 16-byte loads whatever the caller's layout.
      const int64_t ld = round_up(weight.cols, int64_t(16 / esize));
      head->storage.allocate(size_t(weight.rows) * size_t(ld) * esize, "cudaMalloc (LM head)");
      if (ld != weight.cols)
        check(cudaMemsetAsync(head->storage.as<void>(), 0, head->storage.bytes(), stream_), "cudaMemsetAsync");
      check(cudaMemcpy2DAsync(head->storage.as<void>(), size_t(ld) * esize, weight.data,
                              size_t(weight.row_stride) * esize, size_t(weight.cols) * esize, size_t(weight.rows),
                              weight.memory == FLASHSPEC_MEMORY_CUDA ? cudaMemcpyDeviceToDevice
                                                                     : cudaMemcpyHostToDevice,
                              stream_),
            "cudaMemcpy2DAsync (LM head)");
      head->data = head->storage.as<void>();
      head->row_stride = ld;
      head->tensor_cores = sixteen;
      head->d_load = int32_t(sixteen ? round_up(weight.cols, 8) : weight.cols);
    }
    check(cuda::prepare::find_non_finite(head->data, head->dtype, head->vocab, head->hidden, head->row_stride,
                                         flag_.as<int32_t>(), stream_),
          "non-finite check (LM head)");
    int32_t found = 0;
    check(cudaMemcpyAsync(&found, flag_.as<int32_t>(), sizeof found, cudaMemcpyDeviceToHost, stream_),
          "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    require(found == 0, FLASHSPEC_ERR_NON_FINITE, "weight", "holds a NaN or Inf value");
    reserve_staging(head->hidden);
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
    return store;
  }

  void draft(const LmHeadStorage& head_base, const DraftArgs& args) override {
    DeviceScope scope(device_);
    const auto& head = static_cast<const CudaLmHead&>(head_base);
    guard([&] {
      require(args.rows <= max_rows_, FLASHSPEC_ERR_WORKSPACE_EXCEEDED, "hidden", "more rows than max_rows");
      check(cuda::prepare::draft_plans(args, plans_.as<RowPlan>(), stream_), "draft plans");
      const bool tc = stage(head, *args.hidden);
      cuda::scan::StreamTail tail = stream_tail();
      tail.tokens_out = args.tokens_out;
      tail.scores_out = args.scores_out;
      bool combined = false;
      const int groups = scan_all(head, tc, args.rows, nullptr, tail, &combined);
      if (!combined) {
        cuda::combine::Sources src = sources(args.rows, groups, nullptr);
        check(cuda::combine::draft_rows(src, args.tokens_out, args.scores_out, stream_), "draft combine");
      }
    });
  }

  void verify(const LmHeadStorage& head_base, const VerifyArgs& args, SummaryStore& store_base) override {
    DeviceScope scope(device_);
    const auto& head = static_cast<const CudaLmHead&>(head_base);
    auto& store = static_cast<CudaSummaries&>(store_base);
    guard([&] {
      require(args.total_rows <= max_rows_, FLASHSPEC_ERR_WORKSPACE_EXCEEDED, "batch->target_hidden",
              "more rows than the context's max_rows");
      check(cuda::prepare::verify_plans(args, int32_t(head.vocab), plans_.as<RowPlan>(),
                                        store.batch_status.as<int32_t>(), stream_),
            "verify plans");
      const bool tc = stage(head, *args.target_hidden);
      cuda::scan::StreamTail tail = stream_tail();
      tail.batch_status = store.batch_status.as<int32_t>();
      tail.summaries = store.rows.as<RowSummary>();
      bool combined = false;
      const int groups = scan_all(head, tc, args.total_rows, args.draft_logits, tail, &combined);
      if (!combined) {
        cuda::combine::Sources src = sources(args.total_rows, groups, args.draft_logits);
        check(cuda::combine::verify_rows(src, store.batch_status.as<int32_t>(), store.rows.as<RowSummary>(),
                                         stream_),
              "verify combine");
      }
    });
  }

  void finalize(const VerifyArgs& args, const SummaryStore& store_base, const ResultArgs& result) override {
    DeviceScope scope(device_);
    const auto& store = static_cast<const CudaSummaries&>(store_base);
    guard([&] {
      check(cuda::finalize::requests(args, store.rows.as<RowSummary>(), store.batch_status.as<int32_t>(), result,
                                     stream_),
            "finalize");
    });
  }

  void synchronize() override {
    DeviceScope scope(device_);
    guard([&] { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); });
  }

  void* allocate_staging(size_t bytes) override {
    DeviceScope scope(device_);
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "cudaMalloc (staging)");
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
      check(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (staging)");
    });
  }

  void copy_out(void* host_dst, const void* src, size_t bytes) override {
    DeviceScope scope(device_);
    guard([&] {
      check(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync (staging)");
      check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    });
  }

 private:
  template <class Body>
  void guard(Body&& body) {
    try {
      body();
    } catch (const Error& e) {
      last_error_ = e.cuda_error();
      throw;
    }
  }

  void check_device_pointer(const void* p, const char* argument) {
    cudaPointerAttributes attr{};
    cudaError_t e = cudaPointerGetAttributes(&attr, p);
    if (e != cudaSuccess) {
      cudaGetLastError();
      fail(FLASHSPEC_ERR_DEVICE_MISMATCH, std::string(argument) + ": data is not CUDA memory");
    }
    require(attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged, FLASHSPEC_ERR_DEVICE_MISMATCH,
            argument, "data is not device memory");
    require(attr.type == cudaMemoryTypeManaged || attr.device == device_, FLASHSPEC_ERR_DEVICE_MISMATCH, argument,
            "data lives on device " + std::to_string(attr.device) + ", the context uses device " +
                std::to_string(device_));
  }

  // Staged hidden rows: [max_rows, k_pad] fp32 at most (the CUDA-core path).
  void reserve_staging(int64_t d) {
    const size_t need = size_t(max_rows_) * size_t(round_up(d, 32)) * sizeof(float);
    if (staging_.bytes() >= need) return;
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    staging_.allocate(need, "cudaMalloc (hidden staging)");
  }

  // Stages the hidden rows; returns whether the tensor-core scan applies.
  bool stage(const CudaLmHead& head, const flashspec_tensor& hidden) {
    const int64_t k_pad = round_up(head.hidden, 32);
    require(size_t(hidden.rows) * size_t(k_pad) * sizeof(float) <= staging_.bytes(), FLASHSPEC_ERR_WORKSPACE_EXCEEDED,
            "head", "its hidden size exceeds the staging this context reserved (create the head on this context)");
    const bool tc = head.tensor_cores && hidden.dtype == head.dtype;
    check(cuda::prepare::stage_hidden(hidden, int32_t(k_pad), !tc, staging_.as<void>(), hidden_bad_.as<int32_t>(),
                                      stream_),
          "stage hidden");
    return tc;
  }

  cuda::ScanParams base_params(const CudaLmHead& head, int rows) const {
    cuda::ScanParams p = {};
    p.w = head.data;
    p.ldw = head.row_stride;
    p.w_dtype = head.dtype;
    p.vocab = int32_t(head.vocab);
    p.d_load = head.d_load;
    p.k_pad = int32_t(round_up(head.hidden, 32));
    p.h = staging_.as<void>();
    p.rows = rows;
    p.row_base = 0;
    p.plans = plans_.as<RowPlan>();
    p.partials = partials_.as<Partial>();
    p.partial_stride = max_rows_;
    p.q_partials = q_partials_.as<QPartial>();
    p.residuals = residuals_.as<Residual>();
    return p;
  }

  cuda::scan::StreamTail stream_tail() const {
    cuda::scan::StreamTail tail = {};
    tail.done_counter = done_counter_.as<int32_t>();
    tail.hidden_bad = hidden_bad_.as<int32_t>();
    return tail;
  }

  // Runs the scan(s) over all rows; returns the number of token groups.
  // *combined tells whether the scan also combined the rows into the
  // outputs named by `tail` (the weight-streaming scan does).
  int scan_all(const CudaLmHead& head, bool tc, int rows, const flashspec_tensor* q,
               const cuda::scan::StreamTail& tail, bool* combined) {
    *combined = false;
    cuda::ScanParams p = base_params(head, rows);
    const int max_groups = int(std::min<int64_t>(kMaxGroups, (head.vocab + 7) / 8));
    if (q) {
      p.stochastic = 1;
      p.q_logits = q->data;
      p.q_dtype = q->dtype;
      p.q_ld = q->row_stride;
      return scan_stochastic(head, tc, rows, p, max_groups);
    }
    if (tc && rows <= cuda::scan::stream_max_rows()) {
      const bool bf16 = head.dtype == FLASHSPEC_DTYPE_BF16;
      const int max_blocks = std::min(max_groups, sm_count_ * stream_blocks_per_sm_[rows <= 8 ? 0 : 1]);
      const int tiles_per_warp = cuda::scan::stream_tiles_per_warp(p.vocab, max_blocks);
      const int blocks = cuda::scan::stream_blocks(p.vocab, tiles_per_warp);
      p.groups = blocks;
      p.row_blocks = 1;
      check(cuda::scan::launch_stream(cuda::scan::stream_kernel(rows, bf16), p, tail, tiles_per_warp, blocks,
                                      stream_),
            "scan (weight stream)");
      *combined = true;
      return blocks;
    }
    if (tc && cublas_) {
      cuda::gemm_scan::Request r = {};
      r.handle = cublas_;
      r.w = p.w;
      r.ldw = p.ldw;
      r.w_dtype = p.w_dtype;
      r.vocab = p.vocab;
      r.d = int32_t(head.hidden);
      r.h = p.h;
      r.ldh = p.k_pad;
      r.rows = rows;
      r.row_base = 0;
      r.workspace = chunk_logits_.as<float>();
      r.chunk = chunk_;
      r.plans = p.plans;
      r.partials = p.partials;
      r.partial_stride = p.partial_stride;
      const cuda::gemm_scan::Status status = cuda::gemm_scan::scan(r, stream_);
      if (status.cuda != cudaSuccess) cuda_fail(status.cuda, std::string("scan (cuBLAS chunks): ") + status.what);
      if (status.what) fail(FLASHSPEC_ERR_CUDA, std::string("scan (cuBLAS chunks): cublasGemmEx: ") + status.what);
      return cuda::gemm_scan::groups_for(p.vocab, chunk_);
    }
    if (tc) {
      const int bm = rows <= 16 ? 16 : rows <= 64 ? 64 : 128;
      const int idx = bm == 16 ? 0 : bm == 64 ? 1 : 2;
      const int row_blocks = (rows + bm - 1) / bm;
      const int slots = sm_count_ * mma_blocks_per_sm_[idx];
      const int groups = std::max(1, std::min(max_groups, slots / row_blocks));
      p.groups = groups;
      p.row_blocks = row_blocks;
      check(cuda::scan::launch(cuda::scan::mma_kernel(bm, head.dtype == FLASHSPEC_DTYPE_BF16), p,
                               groups * row_blocks, cuda::scan::mma_threads(), cuda::scan::mma_base_smem(bm), false,
                               stream_),
            "scan (tensor cores)");
      return groups;
    }
    const int groups = std::max(1, std::min(max_groups, sm_count_ * simt_blocks_per_sm_));
    p.groups = groups;
    p.row_blocks = 1;
    for (int base = 0; base < rows; base += cuda::scan::kSimtRows) {
      p.row_base = base;
      p.rows = std::min(cuda::scan::kSimtRows, rows - base);
      check(cuda::scan::launch(cuda::scan::simt_kernel(), p, groups, cuda::scan::simt_threads(),
                               cuda::scan::simt_base_smem(), false, stream_),
            "scan (CUDA cores)");
    }
    return groups;
  }

  // Stochastic drafts: one CTA per SM (co-resident, cooperative launch), each
  // keeping its token range's scaled logits of the launch's rows in shared
  // memory. Rows beyond what fits go to further launches.
  int scan_stochastic(const CudaLmHead& head, bool tc, int rows, cuda::ScanParams p, int max_groups) {
    const int groups = std::max(1, std::min(max_groups, sm_count_));
    const int64_t slice = round_up(((head.vocab + 7) / 8 + groups - 1) / groups * 8, 8);
    const int bm = tc ? (rows <= 16 ? 16 : rows <= 64 ? 64 : 128) : cuda::scan::kSimtRows;
    const size_t base = tc ? cuda::scan::mma_base_smem(bm) : cuda::scan::simt_base_smem();
    const size_t per_row = size_t(slice) * sizeof(float);
    int fit = max_smem_ > base ? int((max_smem_ - base) / per_row) : 0;
    fit = std::min(fit, bm);
    if (tc) fit = std::min<int>(fit, int((cuda::scan::mma_scratch_capacity(bm) / sizeof(float) - 64) / 2));
    require(fit >= 1, FLASHSPEC_ERR_UNSUPPORTED, "batch->draft_logits",
            "the vocabulary (" + std::to_string(head.vocab) +
                ") is too large for the exact stochastic residual on this device: one row's share of the logits (" +
                std::to_string(per_row) + " bytes per CTA) does not fit in shared memory");
    p.groups = groups;
    p.row_blocks = 1;
    p.slice = int32_t(slice);
    for (int first = 0; first < rows; first += fit) {
      p.row_base = first;
      p.rows = std::min(fit, rows - first);
      const size_t smem = base + size_t(p.rows) * per_row;
      const void* kernel = tc ? cuda::scan::mma_kernel(bm, head.dtype == FLASHSPEC_DTYPE_BF16)
                              : cuda::scan::simt_kernel();
      const int threads = tc ? cuda::scan::mma_threads() : cuda::scan::simt_threads();
      check(cuda::scan::launch(kernel, p, groups, threads, smem, true, stream_), "scan (stochastic drafts)");
    }
    return groups;
  }

  cuda::combine::Sources sources(int rows, int groups, const flashspec_tensor* q) const {
    cuda::combine::Sources s = {};
    s.plans = plans_.as<RowPlan>();
    s.partials = partials_.as<Partial>();
    s.q_partials = q_partials_.as<QPartial>();
    s.residuals = residuals_.as<Residual>();
    s.hidden_bad = hidden_bad_.as<int32_t>();
    s.partial_stride = max_rows_;
    s.groups = groups;
    s.rows = rows;
    s.q_logits = q ? q->data : nullptr;
    s.q_dtype = q ? q->dtype : FLASHSPEC_DTYPE_F32;
    s.q_ld = q ? q->row_stride : 0;
    return s;
  }

  int device_;
  cudaStream_t stream_;
  int32_t max_rows_;
  int sm_count_ = 0;
  size_t max_smem_ = 0;
  int mma_blocks_per_sm_[3] = {1, 1, 1};
  int simt_blocks_per_sm_ = 1;
  int stream_blocks_per_sm_[2] = {1, 1};  // ≤ 8 rows, ≤ 16 rows
  cublasHandle_t cublas_ = nullptr;        // many-row scans; NULL when max_rows ≤ 16
  int32_t chunk_ = 0;                      // tokens per cuBLAS logits chunk
  DeviceBuffer chunk_logits_, cublas_workspace_;
  DeviceBuffer done_counter_;  // CTAs of a weight-streaming scan that have finished
  int last_error_ = 0;
  DeviceBuffer plans_, hidden_bad_, partials_, q_partials_, residuals_, flag_, staging_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const BackendConfig& config) {
  return std::make_unique<CudaBackend>(config);
}

namespace cuda {

bool read_summaries(const SummaryStore& store, int32_t rows, RowSummary* out) {
  if (store.backend != FLASHSPEC_BACKEND_CUDA || rows > store.max_rows) return false;
  const auto& s = static_cast<const CudaSummaries&>(store);
  if (cudaSetDevice(store.device) != cudaSuccess) return false;
  if (cudaDeviceSynchronize() != cudaSuccess) return false;
  return cudaMemcpy(out, s.rows.as<RowSummary>(), size_t(rows) * sizeof(RowSummary), cudaMemcpyDeviceToHost) ==
         cudaSuccess;
}

}  // namespace cuda

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

}  // namespace flashspec
