// 8-bit LM-head codes (e4m3, int8) as bf16 or f16 in registers, for the
// tensor cores: every e4m3 and int8 value is a bf16 and an f16 value, so the
// conversions are exact, and a product with bf16 (or f16) hidden rows in
// fp32 is the product with the codes' values.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "flashspec.h"

namespace flashspec {
namespace cuda {

// The packed f16 pairs of four e4m3 codes (elements 0,1 then 2,3 of the
// word), exact. Where the hardware converts (sm_89 on), each conversion
// takes a 16-bit half of the word as it lies (a register half as the
// source operand), where converting `word >> 16` costs a shift first.
__device__ __forceinline__ void e4m3_to_f16x2(uint32_t word, uint32_t& lo, uint32_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(word));
#else
  auto convert = [](uint32_t pair) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(pair), __NV_E4M3);
    return uint32_t(h.x) | uint32_t(h.y) << 16;
  };
  lo = convert(word & 0xffffu);
  hi = convert(word >> 16);
#endif
}

// The packed bf16 pairs of four codes (elements 0,1 then 2,3 of the word).
template <flashspec_dtype kW>
__device__ __forceinline__ void codes_to_bf16x2(uint32_t word, uint32_t& lo, uint32_t& hi) {
  if constexpr (kW == FLASHSPEC_DTYPE_E4M3) {
    auto convert = [](uint32_t pair) {
      const __nv_bfloat162 b = __float22bfloat162_rn(__half22float2(*reinterpret_cast<const __half2*>(&pair)));
      return *reinterpret_cast<const uint32_t*>(&b);
    };
    e4m3_to_f16x2(word, lo, hi);
    lo = convert(lo);
    hi = convert(hi);
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

// The packed f16 pairs of four codes (elements 0,1 then 2,3 of the word),
// exact: every e4m3 and int8 value is an f16 value. e4m3: one conversion
// per pair, where bf16 takes four (codes_to_bf16x2). int8 x: with its sign
// bit flipped, x + 128 in [0, 256) is the low byte of the f16 0x64 ‖
// (x + 128) = 1024 + 128 + x (f16's unit in the last place is 1 in
// [1024, 2048)), so subtracting 1152 leaves x: a byte permute, an xor and
// a subtraction per pair, where bf16 takes four instructions and a
// constant register per pair.
template <flashspec_dtype kW>
__device__ __forceinline__ void codes_to_f16x2(uint32_t word, uint32_t& lo, uint32_t& hi) {
  if constexpr (kW == FLASHSPEC_DTYPE_E4M3) {
    e4m3_to_f16x2(word, lo, hi);
  } else {
    // A pair's bytes spread over zero bytes, then one xor flips their sign
    // bits and writes the 0x64s (no constant register for the permute to
    // keep).
    auto convert = [](uint32_t spread) {
      const uint32_t biased = spread ^ 0x64806480u, offset = 0x64806480u;  // offset: the f16 pair (1152, 1152)
      const __half2 h = __hsub2(*reinterpret_cast<const __half2*>(&biased),
                                *reinterpret_cast<const __half2*>(&offset));
      return *reinterpret_cast<const uint32_t*>(&h);
    };
    lo = convert(__byte_perm(word, 0u, 0x4140u));
    hi = convert(__byte_perm(word, 0u, 0x4342u));
  }
}

constexpr bool is_codes(flashspec_dtype w) { return w == FLASHSPEC_DTYPE_E4M3 || w == FLASHSPEC_DTYPE_I8; }

// The k order of the 9–16-row TMA ring's 8-bit-code product (scan_stream.cu,
// box::multiply_code_stage). A stage holds 128 codes of each token (one
// 128-byte line); lane (g, t) of a warp reads 16-byte unit 2t + j of its
// tokens' lines whole (j = 0, 1) and takes bytes 4s … 4s + 3 of it as its
// wgmma A fragment's columns 2t, 2t + 1, 2t + 8, 2t + 9 of k16 step
// 4j + s — one 16-byte load per token for four steps, where the line's own
// order would take sixteen 2-byte loads. The product is a sum over k, so
// the hidden rows it meets are staged in the same order: column kappa of
// each kRingCodeBlock-column block holds the block's element
// ring_code_column(kappa), the one the fragment puts there.
constexpr int kRingCodeBlock = 128;
__host__ __device__ constexpr int ring_code_column(int kappa) {
  const int step = kappa / 16, k = kappa % 16;  // the k16 step and the column in it
  const int j = step / 4, s = step % 4, t = (k % 8) / 2, high = k / 8, e = k % 2;
  return 16 * (2 * t + j) + 4 * s + 2 * high + e;
}
// Columns of the hidden rows staged in that order: whole blocks.
__host__ __device__ constexpr int64_t ring_code_columns(int64_t k_pad) {
  return (k_pad + kRingCodeBlock - 1) / kRingCodeBlock * kRingCodeBlock;
}
// Every column of a block once, and a fragment's pairs (columns 2q, 2q + 1)
// are pairs of the block, which the staging copies as 32-bit words.
constexpr bool ring_code_order_holds() {
  bool seen[kRingCodeBlock] = {};
  for (int kappa = 0; kappa < kRingCodeBlock; ++kappa) {
    const int c = ring_code_column(kappa);
    if (c < 0 || c >= kRingCodeBlock || seen[c]) return false;
    if (kappa % 2 == 1 && c != ring_code_column(kappa - 1) + 1) return false;
    seen[c] = true;
  }
  return true;
}
static_assert(ring_code_order_holds(), "ring_code_column permutes a block, pairs kept");

}  // namespace cuda
}  // namespace flashspec
