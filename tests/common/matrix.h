// Host matrices for the tests: a row-major [rows, cols] matrix stored in one
// dtype, with an optional row stride, and the exact value of every element
// (what the library reads) kept as double; and random matrices from Rng.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "flashspec.h"
#include "rng.h"
#include "util/dtype.h"

namespace fstest {

struct Matrix {
  flashspec_dtype dtype = FLASHSPEC_DTYPE_F32;
  int64_t rows = 0, cols = 0;
  int64_t stride = 0;           // elements from one row's start to the next's (≥ cols)
  std::vector<float> f32;       // F32: the stored elements, [rows, stride]
  std::vector<uint16_t> half;   // BF16 / F16: their bits, [rows, stride]
  std::vector<double> exact;    // [rows, cols]

  Matrix() = default;
  // All elements 0 (padding past cols included). row_stride 0 means cols.
  Matrix(flashspec_dtype t, int64_t r, int64_t c, int64_t row_stride = 0)
      : dtype(t), rows(r), cols(c), stride(row_stride ? row_stride : c), exact(size_t(r * c)) {
    if (t == FLASHSPEC_DTYPE_F32) f32.resize(size_t(r * stride));
    else half.resize(size_t(r * stride));
  }
  // Stores v rounded to the dtype; the exact value is what was stored.
  void set(int64_t r, int64_t c, double v) {
    const size_t i = size_t(r * stride + c);
    double& e = exact[size_t(r * cols + c)];
    switch (dtype) {
      case FLASHSPEC_DTYPE_F32: f32[i] = float(v); e = f32[i]; break;
      case FLASHSPEC_DTYPE_BF16:
        half[i] = flashspec::float_to_bf16(float(v));
        e = flashspec::bf16_to_float(half[i]);
        break;
      default:
        half[i] = flashspec::float_to_fp16(float(v));
        e = flashspec::fp16_to_float(half[i]);
        break;
    }
  }
  double at(int64_t r, int64_t c) const { return exact[size_t(r * cols + c)]; }
  void copy_row(int64_t to, const Matrix& from, int64_t from_row) {
    for (int64_t c = 0; c < cols; ++c) set(to, c, from.at(from_row, c));
  }
  const void* data() const {
    return dtype == FLASHSPEC_DTYPE_F32 ? static_cast<const void*>(f32.data()) : static_cast<const void*>(half.data());
  }
  size_t size_bytes() const { return f32.size() * sizeof(float) + half.size() * sizeof(uint16_t); }
  // The host tensor over this matrix.
  flashspec_tensor view() const {
    flashspec_tensor t = flashspec_tensor_make(data(), dtype, FLASHSPEC_MEMORY_HOST, rows, cols);
    t.row_stride = stride;
    return t;
  }
};

// Elements scale · N(0, 1), drawn row by row.
inline Matrix random_matrix(flashspec_dtype dtype, int64_t rows, int64_t cols, Rng& rng, double scale,
                            int64_t stride = 0) {
  Matrix m(dtype, rows, cols, stride);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) m.set(r, c, scale * rng.normal());
  return m;
}

}  // namespace fstest
