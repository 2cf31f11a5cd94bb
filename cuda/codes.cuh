// 8-bit LM-head codes (e4m3, int8) as bf16 in registers, for the tensor
// cores: every e4m3 and int8 value is a bf16 value, so the conversions are
// exact, and a product with bf16 hidden rows in fp32 is the product with the
// codes' values.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "flashspec.h"

namespace flashspec {
namespace cuda {

// The packed bf16 pairs of four codes (elements 0,1 then 2,3 of the word).
template <flashspec_dtype kW>
__device__ __forceinline__ void codes_to_bf16x2(uint32_t word, uint32_t& lo, uint32_t& hi) {
  if constexpr (kW == FLASHSPEC_DTYPE_E4M3) {
    auto convert = [](uint32_t pair) {
      const __half2 h = __half2(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(pair), __NV_E4M3));
      const __nv_bfloat162 b = __float22bfloat162_rn(__half22float2(h));
      return *reinterpret_cast<const uint32_t*>(&b);
    };
    lo = convert(word & 0xffffu);
    hi = convert(word >> 16);
  } else {
    // int8 x: the bf16 0x43 ‖ (x & 0x7f) is 128 + (x & 0x7f) and 0x43 ‖
    // (x & 0x80) is 128 or 256, so their difference is x, exactly.
    auto convert = [](uint32_t spread) {
      const uint32_t magnitude = spread & 0xff7fff7fu, offset = spread & 0xff80ff80u;
      const __nv_bfloat162 b = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&magnitude),
                                       *reinterpret_cast<const __nv_bfloat162*>(&offset));
      return *reinterpret_cast<const uint32_t*>(&b);
    };
    lo = convert(__byte_perm(word, 0x4343u, 0x4140u));
    hi = convert(__byte_perm(word, 0x4343u, 0x4342u));
  }
}

constexpr bool is_codes(flashspec_dtype w) { return w == FLASHSPEC_DTYPE_E4M3 || w == FLASHSPEC_DTYPE_I8; }

}  // namespace cuda
}  // namespace flashspec
