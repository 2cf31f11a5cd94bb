// The CUDA backend's objects behind the backend interface: an LM head and a
// summaries store in device memory.
#pragma once

#include "device_memory.h"
#include "kernels/backend.h"

namespace flashspec {
namespace cuda {

class CudaLmHead final : public LmHeadStorage {
 public:
  DeviceBuffer storage;       // empty for a borrowed head
  DeviceBuffer row_scales;    // 8-bit heads: fp32 [vocab] (`scales` points here)
  // 16-bit or 8-bit codes, 16-byte-aligned rows, d_load % (16 bytes) == 0:
  // the tensor-core scans apply (to hidden rows staged in W's 16-bit dtype,
  // bf16 for 8-bit codes).
  bool tensor_cores = false;
  int32_t d_load = 0;         // columns a scan reads from each row
  bool codes() const { return dtype == FLASHSPEC_DTYPE_E4M3 || dtype == FLASHSPEC_DTYPE_I8; }
  // The 16-bit dtype hidden rows take for the tensor-core scans.
  flashspec_dtype compute_dtype() const { return codes() ? FLASHSPEC_DTYPE_BF16 : dtype; }
  // Columns of a staged hidden row (zeros beyond d): whole 32-element chunks
  // of a 16-bit weight-streaming tile, 64-element ones for 8-bit codes.
  int32_t staged_columns() const { return int32_t((hidden + (codes() ? 63 : 31)) / (codes() ? 64 : 32) * (codes() ? 64 : 32)); }
};

class CudaSummaries final : public SummaryStore {
 public:
  DeviceBuffer rows;          // RowSummary[max_rows]
  DeviceBuffer batch_status;  // int32_t: what the verify plans found of the batch as a whole
  DeviceBuffer top_tokens;    // int32_t[max_rows][FLASHSPEC_MAX_TOP_LOGPROBS]: each row's top raw tokens
  DeviceBuffer top_logprobs;  // float, alike
  DeviceBuffer drawing_rows;  // int32_t[max_rows]: finalize's scratch, the row that drew each slot
  int32_t top_n = 0;          // top raw tokens per row the last verify kept
};

}  // namespace cuda
}  // namespace flashspec
