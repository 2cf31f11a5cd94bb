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
  bool tensor_cores = false;  // 16-bit, 16-byte-aligned rows, d_load % 8 == 0
  int32_t d_load = 0;         // columns a scan reads from each row
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
