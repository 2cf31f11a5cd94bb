// Hopper's warpgroup tensor-core instruction (wgmma.mma_async, sm_90a): a
// warpgroup (4 warps) multiplies a 64 × 16 tile of A by a 16 × N tile of B,
// both read from shared memory through descriptors, into N/2 fp32
// accumulators per thread. The scans use it with both operands K-major in
// the 128-byte swizzle a TMA box of 64 16-bit elements per row writes: row r
// of a tile at byte 128 r, its 16-byte unit u at unit u ^ (r mod 8), tiles
// starting on 1024-byte boundaries.
//
// The accumulators follow the mma.sync m16n8 layout warp by warp: warp w of
// the warpgroup holds rows 16 w + g and 16 w + g + 8 (g = lane / 4), and
// d[4 j + q] is row 16 w + g + 8 (q / 2), column 8 j + 2 (lane % 4) + q % 2.
//
// The instructions exist only in sm_90a code (__CUDA_ARCH_FEAT_SM90_ALL);
// elsewhere these compile to nothing and dispatch never launches their
// callers (FLASHSPEC_WGMMA, set by meson.build for an sm_90a target).
#pragma once

#include <cstdint>

namespace flashspec {
namespace cuda {
namespace wgmma {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FLASHSPEC_WGMMA_CODE 1
#else
#define FLASHSPEC_WGMMA_CODE 0
#endif

// The descriptor of a K-major tile at shared-memory address `address`
// (1024-byte aligned, plus 32 bytes per 16-element step along K inside the
// swizzled 128-byte rows): 128-byte swizzle, 1024 bytes between the 8-row
// groups of the swizzle pattern.
__device__ __forceinline__ uint64_t k_major_sw128(uint32_t address) {
  constexpr uint64_t kLeadingBytes = 16, kStrideBytes = 1024, kSwizzle128 = 1;
  return uint64_t((address >> 4) & 0x3FFF) | ((kLeadingBytes >> 4) << 16) | ((kStrideBytes >> 4) << 32) |
         (kSwizzle128 << 62);
}

// Moves the calling warpgroup's per-thread register budget to kRegisters (a
// multiple of 8 in [24, 256]): producers give theirs up and consumers take
// them (warp specialisation); every warp of the warpgroup calls it.
// FLASHSPEC_NO_REGISTER_SPLIT leaves every budget at the launch's (the
// consumers spill): a build for compute-sanitizer's racecheck and
// synccheck, which do not finish a kernel that moves registers.
template <int kRegisters>
__device__ __forceinline__ void raise_registers() {
#if FLASHSPEC_WGMMA_CODE && !defined(FLASHSPEC_NO_REGISTER_SPLIT)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
#endif
}
template <int kRegisters>
__device__ __forceinline__ void lower_registers() {
#if FLASHSPEC_WGMMA_CODE && !defined(FLASHSPEC_NO_REGISTER_SPLIT)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
#endif
}

// Orders the warpgroup's earlier register accesses before the next wgmma.
__device__ __forceinline__ void fence() {
#if FLASHSPEC_WGMMA_CODE
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void commit() {
#if FLASHSPEC_WGMMA_CODE
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

// Waits until at most kPending committed groups are unfinished (the
// finished ones' shared-memory reads included).
template <int kPending>
__device__ __forceinline__ void wait() {
#if FLASHSPEC_WGMMA_CODE
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}
__device__ __forceinline__ void wait_all() { wait<0>(); }

// d = A·Bᵀ + (accumulate ? d : 0), A 64 × 16 and B N × 16, both K-major.
// N = 8 and 16: W's tokens as A and up to 16 hidden rows as B; N = 64: up
// to 64 hidden rows as A and 64 of W's tokens as B (mma_k16_n64).
template <int kN, bool kBf16>
__device__ __forceinline__ void mma_k16(float (&d)[kN / 2], uint64_t a, uint64_t b, bool accumulate) {
  static_assert(kN == 8 || kN == 16, "the scans use N = 8 or 16 here, 64 in mma_k16_n64");
#if FLASHSPEC_WGMMA_CODE
  const int scale_d = accumulate ? 1 : 0;
  if constexpr (kN == 8) {
    if constexpr (kBf16)
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "l"(a), "l"(b), "r"(scale_d));
    else
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0,%1,%2,%3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "l"(a), "l"(b), "r"(scale_d));
  } else {
    if constexpr (kBf16)
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, p, 1, 1, 0, "
          "0;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
          : "l"(a), "l"(b), "r"(scale_d));
    else
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, p, 1, 1, 0, "
          "0;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
          : "l"(a), "l"(b), "r"(scale_d));
  }
#else
  (void)d, (void)a, (void)b, (void)accumulate;
#endif
}

// d = A·Bᵀ + (accumulate ? d : 0) with A, 64 × 16 bf16 (fp16 where not
// kBf16), in the calling thread's registers (the mma.sync m16n8k16 A
// fragment of its warp's 16 rows: a[0] row g, columns 2t, 2t + 1; a[1] row
// g + 8; a[2], a[3] the same at columns 2t + 8, 2t + 9) and B, N × 16 of
// the same type, K-major in shared memory. The registers are read while the
// MMA runs: the caller changes them only after a wait (wait<N>) that covers
// it.
template <bool kBf16>
__device__ __forceinline__ void mma_k16_n16_registers(float (&d)[8], const uint32_t (&a)[4], uint64_t b,
                                                      bool accumulate) {
#if FLASHSPEC_WGMMA_CODE
  const int scale_d = accumulate ? 1 : 0;
#define FLASHSPEC_WGMMA_M64N16K16_RS(TYPE)                                                                  \
  asm volatile(                                                                                            \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"                                                       \
      "wgmma.mma_async.sync.aligned.m64n16k16.f32." TYPE "." TYPE                                          \
      " {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, p, 1, 1, 0;\n}\n"                               \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])    \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d))
  if constexpr (kBf16)
    FLASHSPEC_WGMMA_M64N16K16_RS("bf16");
  else
    FLASHSPEC_WGMMA_M64N16K16_RS("f16");
#undef FLASHSPEC_WGMMA_M64N16K16_RS
#else
  (void)d, (void)a, (void)b, (void)accumulate;
#endif
}

// The N = 64 form of mma_k16 (32 accumulators per thread); TYPE: the PTX
// name of A's and B's element type.
#define FLASHSPEC_WGMMA_M64N64K16(TYPE)                                                                          \
  asm volatile(                                                                                                 \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                            \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " "                                          \
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                                                 \
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "                                      \
      "%32, %33, p, 1, 1, 0, 0;\n}\n"                                                                          \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),         \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),   \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])  \
      : "l"(a), "l"(b), "r"(scale_d))
template <bool kBf16>
__device__ __forceinline__ void mma_k16_n64(float (&d)[32], uint64_t a, uint64_t b, bool accumulate) {
#if FLASHSPEC_WGMMA_CODE
  const int scale_d = accumulate ? 1 : 0;
  if constexpr (kBf16)
    FLASHSPEC_WGMMA_M64N64K16("bf16");
  else
    FLASHSPEC_WGMMA_M64N64K16("f16");
#else
  (void)d, (void)a, (void)b, (void)accumulate;
#endif
}
#undef FLASHSPEC_WGMMA_M64N64K16

// The N = 128 form of mma_k16 (64 accumulators per thread): the many-row
// tile scan (scan_tiles.cu) takes 64 hidden rows per instruction as A and
// 128 of W's tokens as B.
template <bool kBf16>
__device__ __forceinline__ void mma_k16_n128(float (&d)[64], uint64_t a, uint64_t b, bool accumulate) {
#if FLASHSPEC_WGMMA_CODE
  const int scale_d = accumulate ? 1 : 0;
#define FLASHSPEC_WGMMA_M64N128K16(TYPE)                                                                              \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                           \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " {"                                      \
               "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                                               \
               "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"                                     \
               "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"                                     \
               "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"                                      \
               "}, %64, %65, p, 1, 1, 0, 0;\n}\n"                                                                     \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),      \
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
                 "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
                 "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
                 "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
                 "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
                 "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
                 "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
               : "l"(a), "l"(b), "r"(scale_d))
  if constexpr (kBf16)
    FLASHSPEC_WGMMA_M64N128K16("bf16");
  else
    FLASHSPEC_WGMMA_M64N128K16("f16");
#undef FLASHSPEC_WGMMA_M64N128K16
#else
  (void)d, (void)a, (void)b, (void)accumulate;
#endif
}

// The N = 256 form (128 accumulators per thread): the tile scan's 64-row
// tiles take 256 of W's tokens per instruction, so each stage's box of
// hidden rows serves twice the tokens.
template <bool kBf16>
__device__ __forceinline__ void mma_k16_n256(float (&d)[128], uint64_t a, uint64_t b, bool accumulate) {
#if FLASHSPEC_WGMMA_CODE
  const int scale_d = accumulate ? 1 : 0;
#define FLASHSPEC_WGMMA_M64N256K16(TYPE)                                                                               \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                                           \
               "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE " {"                                       \
               "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"                                                \
               "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"                                      \
               "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"                                      \
               "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"                                      \
               "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"                                      \
               "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"                                      \
               "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"                          \
               "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"                       \
               "}, %128, %129, p, 1, 1, 0, 0;\n}\n"                                                                    \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),       \
                 "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
                 "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
                 "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
                 "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
                 "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
                 "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
                 "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
                 "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
                 "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
                 "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
                 "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
                 "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
                 "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
                 "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
                 "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127]) \
               : "l"(a), "l"(b), "r"(scale_d))
  if constexpr (kBf16)
    FLASHSPEC_WGMMA_M64N256K16("bf16");
  else
    FLASHSPEC_WGMMA_M64N256K16("f16");
#undef FLASHSPEC_WGMMA_M64N256K16
#else
  (void)d, (void)a, (void)b, (void)accumulate;
#endif
}

}  // namespace wgmma
}  // namespace cuda
}  // namespace flashspec
