// Test access to what the CUDA backend keeps on the device. Not part of the
// public API; the GPU tests link the internal core library.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "sampling/row_summary.h"

namespace flashspec {
namespace cuda {

// Copies the first `rows` row summaries of a CUDA SummaryStore to host
// memory (synchronises the device). Returns false if `store` is not a CUDA
// store or the copy failed.
bool read_summaries(const SummaryStore& store, int32_t rows, RowSummary* out);

// Evaluates gumbel_from_bits (util/philox.h) on the current device for every
// 32-bit word and compares it with bounds[word >> 24] (256 floats). Returns
// false if a CUDA call failed; else *violations is the number of words
// whose noise exceeds its bound (or is NaN) and *closest the smallest
// bound − noise (0 where any word exceeds its bound).
bool check_gumbel_bounds(const float* bounds, uint64_t* violations, float* closest);

// Lets the 17–64-row sm_90a weight-streaming scan take every call it can
// serve (on), whatever tuning::stream_wide_serves would pick, so tests reach
// it with heads small enough to check against the CPU backend; off (the
// default) restores the rule. Process-wide; set it between calls.
void serve_wide_rows_everywhere(bool on);
// serve_wide_rows_everywhere(true) for one object's scope.
struct WideRowsEverywhere {
  WideRowsEverywhere() { serve_wide_rows_everywhere(true); }
  ~WideRowsEverywhere() { serve_wide_rows_everywhere(false); }
  WideRowsEverywhere(const WideRowsEverywhere&) = delete;
  WideRowsEverywhere& operator=(const WideRowsEverywhere&) = delete;
};

}  // namespace cuda
}  // namespace flashspec
