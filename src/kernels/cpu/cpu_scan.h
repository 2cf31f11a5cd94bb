// The two halves of the CPU backend's pass over one vocabulary tile: the
// tile's logits for every hidden row (a register-blocked kernel, AVX2/FMA
// where the CPU has it, else portable code computing the same bits), and
// each row's fold of them into a Partial (sampling/fold.h's rules, with the
// Gumbel noise of tokens that cannot place computed not at all).
#pragma once

#include <cstdint>

#include "flashspec.h"
#include "sampling/fold.h"
#include "sampling/row_plan.h"

namespace flashspec {
namespace cpu {

// Converts n values of a row in `dtype` (f32, bf16, f16, or 8-bit codes
// before their scale) to fp32, exactly.
void convert_row(const void* row, flashspec_dtype dtype, int64_t n, float* out);

// Rows [0, count) of an LM head (or of a tile of it) in its own dtype;
// row_stride in elements.
struct WeightRows {
  const void* data;
  flashspec_dtype dtype;
  int64_t row_stride;
  const float* scales;  // 8-bit codes: the rows' scales (row k: scales[k]); else NULL
};

// logits[r · count + k] = W[k] · hidden[r] for r < rows, k < count (8-bit
// codes: scales[k] · (codes of W[k] · hidden[r]), the scale applied to the
// finished sum); hidden is [rows, d] fp32, contiguous. Every logit is the same function of its two
// vectors, whatever count, rows or the kernel: lane j of eight accumulates
// w_i·h_i for i ≡ j (mod 8) with fused multiply-adds in increasing i, and
// the lanes are summed ((0+1)+(2+3))+((4+5)+(6+7)). So a token's logit does
// not depend on its tile, its batch or the machine's vector width.
void tile_logits(const WeightRows& w, int64_t count, const float* hidden, int64_t rows, int64_t d, float* logits);

// The kernels tile_logits chooses from, for tests: the portable one always,
// the AVX2 one where the CPU has AVX2, FMA and F16C (else it returns false
// and writes nothing).
void tile_logits_portable(const WeightRows& w, int64_t count, const float* hidden, int64_t rows, int64_t d,
                          float* logits);
bool tile_logits_avx2(const WeightRows& w, int64_t count, const float* hidden, int64_t rows, int64_t d,
                      float* logits);
// "avx2" or "portable": what tile_logits runs on this machine.
const char* tile_logits_kernel();

// Σ exp(x[k] − m) over k < n (x[k] ≤ m, all finite): lane j of eight sums
// k ≡ j (mod 8) in increasing k, lanes summed as in a logit; exp is a
// polynomial with fused multiply-adds (within 2 ulp of exp; terms below
// e^−87 count as e^−87, which cannot move a sum that holds exp(0) = 1).
// The AVX2 kernel gives the portable kernel's bits (false: no AVX2).
float sum_exp(const float* x, int64_t n, float m);
float sum_exp_portable(const float* x, int64_t n, float m);
bool sum_exp_avx2(const float* x, int64_t n, float m, float* sum);

// The Philox words of blocks first_block .. first_block + n − 1 of a row
// (row_block of util/philox.h): words[4 i + j] = row_block(key,
// first_block + i).v[j]. Eight blocks at a time with AVX2.
void row_words(const RngRowKey& key, uint32_t first_block, int64_t n, uint32_t* words);

// An upper bound of gumbel_from_bits(x) over every x with x >> 24 == bucket
// (non-decreasing in bucket), and the bound over all x (bucket 255).
float gumbel_bucket_bound(uint32_t bucket);
float gumbel_max_bound();

// One row's Partial over tokens first_token .. first_token + count − 1 with
// logits l. Exactly fold_logit token by token in increasing order, except
// the log-sum-exp: each chunk of 256 tokens gives (m = max l/T, s =
// sum_exp(l/T, m)), and the chunks are merged in order by lse_merge. With
// `prune`, a token whose score l/T + g cannot exceed the runner-up so far
// (bounded by gumbel_bucket_bound) gets no noise: its score would change
// nothing, so the Partial is bit-identical to the unpruned one.
// `noised`, where not NULL, is increased by the number of tokens whose
// Gumbel noise was computed. `kernel` picks the vector code where the CPU
// has it (kBest) or the portable code (tests compare the two).
enum class Kernel { kBest, kPortable };
Partial fold_tile(const RowPlan& plan, const float* l, int64_t count, int32_t first_token, bool prune = true,
                  int64_t* noised = nullptr, Kernel kernel = Kernel::kBest);

// scaled[k] = l[k] · inv_t for k < n; *max = their max, as std::max takes
// it in token order (so a zero max has the sign of the first zero). False
// when a scaled value is not finite (then *max means nothing).
bool scale_row(const float* l, int64_t n, float inv_t, float* scaled, float* max, Kernel kernel = Kernel::kBest);

// Bit j (j < n ≤ 32) set where x[j] + bound_j > runner_up: bound_j is
// gumbel_bucket_bound(words[j] >> 24), or max_bound where words is NULL
// (bounds: the 256 bucket bounds).
uint32_t may_place(const float* x, const uint32_t* words, int64_t n, float runner_up, const float* bounds,
                   float max_bound, Kernel kernel = Kernel::kBest);

}  // namespace cpu
}  // namespace flashspec
