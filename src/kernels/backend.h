// The interface each backend (CPU, CUDA) implements. Callers (the C API, the
// engine) hand it arguments that are valid by construction (kernels/args.h);
// a backend throws flashspec::Error on failure, tagged with the Field it is
// about rather than a public argument name, and writes no output before it
// has succeeded.
#pragma once

#include <cstdint>
#include <memory>

#include "flashspec.h"
#include "kernels/args.h"
#include "sampling/shard_record.h"

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
  // An 8-bit head (dtype E4M3 or I8): one fp32 scale per row, in the
  // backend's memory; a logit is scales[v] · (codes of row v · h). NULL for
  // 16/32-bit heads.
  const float* scales = nullptr;
  // A vocabulary shard holds global tokens [vocab_begin, vocab_begin +
  // vocab) of vocab_size; an unsharded head has vocab_begin 0 and
  // vocab_size == vocab.
  int64_t vocab_begin = 0;
  int64_t vocab_size = 0;
  bool sharded() const { return vocab_begin != 0 || vocab_size != vocab; }
};

// Summaries of up to max_rows target rows, in the backend's memory.
class SummaryStore {
 public:
  virtual ~SummaryStore() = default;
  flashspec_backend backend = FLASHSPEC_BACKEND_CPU;
  int device = -1;
  int32_t max_rows = 0;
  int32_t max_requests = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual flashspec_backend kind() const = 0;
  virtual int device() const = 0;
  // weight: bf16/fp16/fp32, or 8-bit codes with host_scales (host memory,
  // weight.rows entries, finite and ≥ 0); host_scales is NULL otherwise.
  virtual std::unique_ptr<LmHeadStorage> create_lm_head(const flashspec_tensor& weight,
                                                        flashspec_lm_head_flags flags,
                                                        const float* host_scales) = 0;
  virtual std::unique_ptr<SummaryStore> create_summaries(int32_t max_rows, int32_t max_requests) = 0;
  // The calls below take arguments whose shapes fit: head and summaries of
  // this backend, hidden rows of the head's hidden size, at most the
  // config's max_rows rows, a batch within the summaries' capacity. Values
  // in host memory are checked too (token ids, temperatures, offsets); values
  // in device memory only the device can check, so a device backend reports
  // those per row (RowSummary::status, accepted_counts[r] = −1).
  virtual void draft(const LmHeadStorage& head, const DraftArgs& args) = 0;
  // Fused top-k draft (flashspec.h: flashspec_draft_top_k); args validated,
  // 1 ≤ k ≤ FLASHSPEC_MAX_DRAFT_TOP_K; logprobs may be NULL.
  virtual void draft_top_k(const LmHeadStorage& head, const DraftArgs& args, int32_t k, int32_t* tokens,
                           float* logprobs) = 0;
  virtual void verify(const LmHeadStorage& head, const VerifyArgs& args, SummaryStore& summaries) = 0;
  virtual void finalize(const VerifyArgs& args, const SummaryStore& summaries, const ResultArgs& result) = 0;
  virtual void synchronize() = 0;

  // Vocabulary shards (flashspec.h): the pass over the head's slice writes
  // one record per row; finalize and draft merge the gathered records of
  // `shards` ranks ([shards][rows], in the backend's memory). The default
  // refuses with UNSUPPORTED.
  virtual void verify_records(const LmHeadStorage& head, const VerifyArgs& args, ShardRecord* records);
  virtual void draft_records(const LmHeadStorage& head, const DraftArgs& args, ShardRecord* records);
  virtual void finalize_records(const VerifyArgs& args, const ShardRecord* records, int32_t shards,
                                const ResultArgs& result);
  virtual void draft_from_records(const DraftArgs& args, const ShardRecord* records, int32_t shards);
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

// The memory a backend reads: host for the CPU backend, device for CUDA.
inline flashspec_memory backend_memory(const Backend& backend) {
  return backend.kind() == FLASHSPEC_BACKEND_CUDA ? FLASHSPEC_MEMORY_CUDA : FLASHSPEC_MEMORY_HOST;
}

struct BackendConfig {
  int device_ordinal;
  void* cuda_stream;
  int cpu_threads;
  int32_t max_rows;
  int32_t max_requests;
};

std::unique_ptr<Backend> make_cpu_backend(const BackendConfig& config);
// Defined in cuda/ when the library is built with CUDA; otherwise throws
// FLASHSPEC_ERR_NO_DEVICE (Field::kBackend).
std::unique_ptr<Backend> make_cuda_backend(const BackendConfig& config);
// Number of usable CUDA devices (0 without CUDA or without a device).
int cuda_device_count();

}  // namespace flashspec
