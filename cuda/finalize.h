// Host launcher of the Algorithm 1 finalize on the device: one thread per
// request runs the shared finalize_request (sampling/algorithm1.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/args.h"
#include "sampling/row_summary.h"

namespace flashspec {
namespace cuda {
namespace finalize {

// The top raw tokens and logprobs the verify kept per row ([rows][n]), and
// scratch for the row that drew each emitted slot ([rows]); n = 0: none.
struct TopLogprobs {
  const int32_t* tokens;
  const float* logprobs;
  int32_t n;
  int32_t* drawing_rows;
};

// Allows the tree finalize the shared memory of the largest tree; once per
// device, before the first call.
cudaError_t configure();

// A batch whose offsets the verify plans found invalid (*batch_status ≠ 0)
// emits −1 everywhere (NaN logprobs).
cudaError_t requests(const VerifyArgs& args, const RowSummary* rows, const int32_t* batch_status,
                     const ResultArgs& result, const TopLogprobs& top, cudaStream_t stream);

}  // namespace finalize
}  // namespace cuda
}  // namespace flashspec
