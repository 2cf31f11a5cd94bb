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

// Converts every 8-bit code of `dtype` (FLASHSPEC_DTYPE_E4M3 or _I8, code
// c at index c) on the current device as the scans do (codes.cuh:
// codes_to_bf16x2, codes_to_f16x2) and widens the results to float in
// as_bf16[256] and as_f16[256]. Returns false if a CUDA call failed.
bool convert_every_code(flashspec_dtype dtype, float* as_bf16, float* as_f16);
// Lets the sm_90a weight-streaming scans that move W through the
// tensor-memory accelerator (9–16 rows and 17–64 rows) take every call they
// can serve (on), whatever tuning::stream_box_serves and
// tuning::stream_wide_serves would pick, so tests reach them with heads
// small enough to check against the CPU backend; off (the default) restores
// the rules. Process-wide; set it between calls.
void serve_ring_scans_everywhere(bool on);
// One of these switches (`set`) turned on for one object's scope.
template <void (*set)(bool)>
struct SwitchedOn {
  SwitchedOn() { set(true); }
  ~SwitchedOn() { set(false); }
  SwitchedOn(const SwitchedOn&) = delete;
  SwitchedOn& operator=(const SwitchedOn&) = delete;
};
using RingScansEverywhere = SwitchedOn<serve_ring_scans_everywhere>;

// Lets only the cuBLAS chunks serve scans of more than 64 rows (on), so
// that tests reach them on sm_90a, where the tile scan serves greedy
// launches; off (the default) restores the rules. Process-wide; set it
// between calls.
void serve_many_rows_by_chunks(bool on);
using ManyRowsByChunks = SwitchedOn<serve_many_rows_by_chunks>;

}  // namespace cuda
}  // namespace flashspec
