#include "testing.h"

#include <cuda_runtime.h>

#include "device_storage.h"

namespace flashspec {
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
}  // namespace flashspec
