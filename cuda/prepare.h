// Host launchers of the kernels that run before a scan: row plans (with the
// device-side checks of values only the device can read) and the staging of
// hidden rows. Each takes an explicit stream and returns the launch's
// cudaError_t.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/args.h"
#include "sampling/row_plan.h"
#include "scan_params.h"

namespace flashspec {
namespace cuda {
namespace prepare {

// Row plans of a verify batch; device-side checks of offsets, token ids,
// temperatures, uniforms and control values land in each plan's status and, for offsets that
// do not describe the batch, in *batch_status. Token ids are checked against
// *device_vocab when given (device memory), else against vocab.
// after_staging: the launch comes right after stage_hidden's and overlaps it
// (the kernel before it on the stream must be that staging kernel, which
// itself waited for all earlier work); else a plain launch.
// row_drafts, tried (stochastic drafts): the drafts each row tries
// (RowDrafts) and their list, written for every row.
cudaError_t verify_plans(const VerifyArgs& args, int32_t vocab, const int32_t* device_vocab, RowPlan* plans,
                         int32_t* batch_status, cudaStream_t stream, bool after_staging = false,
                         RowDrafts* row_drafts = nullptr, int32_t* tried = nullptr);

// Row plans of a draft call; invalid temperatures, positions or control
// values (checked against `vocab`) land in status. after_staging: as above.
cudaError_t draft_plans(const DraftArgs& args, int64_t vocab, RowPlan* plans, cudaStream_t stream,
                        bool after_staging = false);

// Copies hidden rows into `out` ([rows, k_pad], zero beyond d): as raw 16-bit
// values when as_float is false (the tensor-core path, same dtype as W), as
// fp32 otherwise. bad[r] = 1 if row r holds a NaN or Inf. Where ring.bf16
// is not NULL (bf16 rows, at most tuning::kStreamMaxRows, as_float false):
// the rows' copies the 8-bit-code TMA ring reads too (RingHidden, scan_params.h);
// where tile.f16 is not NULL (bf16 rows, as_float false): the rows' f16
// copies the tile scan reads (TileHidden).
cudaError_t stage_hidden(const flashspec_tensor& hidden, int32_t k_pad, bool as_float, void* out, int32_t* bad,
                         const RingHidden& ring, const TileHidden& tile, cudaStream_t stream);

// found = 1 if the [rows, cols] matrix (row stride ld) holds a NaN or Inf.
cudaError_t find_non_finite(const void* data, flashspec_dtype dtype, int64_t rows, int64_t cols, int64_t ld,
                            int32_t* found, cudaStream_t stream);

}  // namespace prepare
}  // namespace cuda
}  // namespace flashspec
