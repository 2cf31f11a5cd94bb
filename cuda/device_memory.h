// Host-side helpers of the CUDA backend: CUDA and cuBLAS errors as
// flashspec::Error, the current device for the scope of a call, and owning
// device allocations.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "util/status.h"

namespace flashspec {
namespace cuda {

// Throws the error `e` of the CUDA call `what`: OUT_OF_MEMORY for a failed
// allocation, else FLASHSPEC_ERR_CUDA carrying the raw cudaError_t. A
// non-sticky error is cleared so the context stays usable.
[[noreturn]] inline void cuda_fail(cudaError_t e, const std::string& what) {
  cudaGetLastError();
  const flashspec_status status = e == cudaErrorMemoryAllocation ? FLASHSPEC_ERR_OUT_OF_MEMORY : FLASHSPEC_ERR_CUDA;
  throw Error(status, what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")", int(e));
}

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) cuda_fail(e, what);
}

inline void check_cublas(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  const flashspec_status status = s == CUBLAS_STATUS_ALLOC_FAILED ? FLASHSPEC_ERR_OUT_OF_MEMORY : FLASHSPEC_ERR_CUDA;
  throw Error(status, std::string(what) + ": cuBLAS status " + std::to_string(int(s)));
}

// Makes `device` current for the scope, then restores the caller's device.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceScope() {
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

// Owns one device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }
  void allocate(size_t bytes, const char* what) {
    reset();
    if (bytes == 0) return;
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, bytes), what);
    ptr_ = p;
    bytes_ = bytes;
  }
  void reset() {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace cuda
}  // namespace flashspec
