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

}  // namespace cuda
}  // namespace flashspec
