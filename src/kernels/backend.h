// The interface each backend (CPU, CUDA) implements. The C API validates
// arguments, then calls exactly one of these; a backend throws
// flashspec::Error on failure and writes no output before it has succeeded.
#pragma once

#include <cstdint>
#include <memory>

#include "flashspec.h"
#include "kernels/row_summary.h"

namespace flashspec {

// An uploaded LM head, [vocab, hidden] with row_stride elements per row.
class LmHeadStorage {
 public:
  virtual ~LmHeadStorage() = default;
  flashspec_backend backend = FLASHSPEC_BACKEND_CPU;
  int device = -1;  // CUDA device ordinal; −1 on the CPU
  flashspec_dtype dtype = FLASHSPEC_DTYPE_F32;
  int64_t vocab = 0;
  int64_t hidden = 0;
  int64_t row_stride = 0;
  const void* data = nullptr;  // in the backend's memory
};

// Summaries of up to max_rows target rows, in the backend's memory.
class SummaryStore {
 public:
  virtual ~SummaryStore() = default;
  flashspec_backend backend = FLASHSPEC_BACKEND_CPU;
  int device = -1;
  int32_t max_rows = 0;
  int32_t max_requests = 0;
  // Shape of the batch the last verify summarised (host-side bookkeeping),
  // so finalize can refuse a batch the summaries do not describe.
  int64_t verified_vocab = 0;
  int32_t verified_rows = 0;
  int32_t verified_requests = 0;
};

// A validated draft call. Arrays are per hidden row, in the backend's memory,
// NULL meaning the documented default.
struct DraftArgs {
  const flashspec_tensor* hidden;
  int32_t rows;
  float temperature;
  const float* temperatures;
  const uint64_t* seeds;
  const uint64_t* request_ids;
  const uint64_t* steps;
  const int32_t* positions;
  uint64_t default_seed;
  int32_t* tokens_out;
  float* scores_out;  // may be NULL
};

// A validated verify batch. total_drafts = draft_offsets[R]; total_rows =
// total_drafts + R.
struct VerifyArgs {
  int32_t num_requests;
  int32_t total_drafts;
  int32_t total_rows;
  int32_t max_draft_len;
  const int32_t* draft_offsets;
  const int32_t* draft_tokens;
  const flashspec_tensor* target_hidden;
  const flashspec_tensor* draft_logits;  // NULL: greedy drafts
  const float* temperatures;
  const float* draft_temperatures;
  const uint64_t* seeds;
  const uint64_t* request_ids;
  const uint64_t* steps;
  const float* accept_uniforms;
  uint64_t default_seed;
};

struct ResultArgs {
  int32_t* accepted_counts;
  int32_t* emitted_tokens;
  uint64_t* next_steps;  // may be NULL
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual flashspec_backend kind() const = 0;
  virtual int device() const = 0;
  virtual std::unique_ptr<LmHeadStorage> create_lm_head(const flashspec_tensor& weight,
                                                        flashspec_lm_head_flags flags) = 0;
  virtual std::unique_ptr<SummaryStore> create_summaries(int32_t max_rows, int32_t max_requests) = 0;
  virtual void draft(const LmHeadStorage& head, const DraftArgs& args) = 0;
  virtual void verify(const LmHeadStorage& head, const VerifyArgs& args, SummaryStore& summaries) = 0;
  virtual void finalize(const VerifyArgs& args, const SummaryStore& summaries, const ResultArgs& result) = 0;
  virtual void synchronize() = 0;
  virtual int last_cuda_error() const { return 0; }

  // Memory in the backend's own space, for callers that hold their index
  // arrays on the host and stage them (the engine). The defaults are host
  // memory, which is the CPU backend's space. copy_in is ordered with the
  // backend's work; copy_out waits for that work and for the copy.
  virtual void* allocate_staging(size_t bytes);
  virtual void release_staging(void* data) noexcept;
  virtual void copy_in(void* dst, const void* host_src, size_t bytes);
  virtual void copy_out(void* host_dst, const void* src, size_t bytes);
};

struct BackendConfig {
  int device_ordinal;
  void* cuda_stream;
  int cpu_threads;
  int32_t max_rows;
  int32_t max_requests;
};

std::unique_ptr<Backend> make_cpu_backend(const BackendConfig& config);
// Defined in cuda/ when the library is built with CUDA; otherwise throws
// FLASHSPEC_ERR_NO_DEVICE.
std::unique_ptr<Backend> make_cuda_backend(const BackendConfig& config);
// Number of usable CUDA devices (0 without CUDA or without a device).
int cuda_device_count();

}  // namespace flashspec
