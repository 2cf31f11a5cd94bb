// The scan for many rows (> 16): the product is compute-bound there, so the
// vocabulary is walked in chunks of a few ten thousand tokens, cuBLAS writes
// one chunk's logits [rows, chunk] into one of two workspaces that stay in
// L2, and a fold kernel reduces them to per-row partials on a side stream
// while cuBLAS writes the next chunk into the other. W is read once;
// nothing vocabulary-sized is ever written.
//
// The fold gives each thread four consecutive tokens of one row, so one
// Philox block serves four Gumbel draws, gives noise only to tokens that
// could place (fold_slice_sampled), and writes one Partial per (row, slice
// of the chunk); slices are numbered in token order, so the combine folds
// them exactly like the other scans' groups.
#include <type_traits>

#include "codes.cuh"
#include "launch.cuh"
#include "scan_gemm.h"
#include "tuning.h"
#include "util/dtype.h"
#include "warp_fold.cuh"

namespace flashspec {
namespace cuda {
namespace gemm_scan {
namespace {

constexpr int kThreads = tuning::kGemmFoldThreads;
constexpr int kTokensPerThread = tuning::kGemmTokensPerThread;
constexpr int32_t kSliceTokens = tuning::kGemmSliceTokens;

// e^(a − b) for a ≤ b, the log-sum-exp's terms: the difference (exact where
// a and b are close, as for the terms that matter), one rounding into base
// 2, then the special-function unit's 2^x (about 2 ulp; terms below 2^−126
// are flushed to 0, which a sum of at least 1 cannot see). Three
// instructions where expf takes about eight, four times per step.
__device__ __forceinline__ float exp_of_difference(float a, float b) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"((a - b) * 1.4426950408889634f));
  return y;
}

// The four logits of a thread's step at `base` (tokens past `end` as −inf)
// and the mask of those in the slice. Chunks and slices are multiples of 4
// tokens, so a whole step is one aligned 16-byte load. kWhole: the caller
// knows the step lies in the slice, and the mask is the constant 0xf.
template <bool kWhole>
__device__ __forceinline__ unsigned load_step(const float* l, int base, int end, float (&x)[kTokensPerThread]) {
  static_assert(kTokensPerThread == 4, "one 16-byte load per thread step");
  if (kWhole || base + kTokensPerThread <= end) {
    const float4 v = *reinterpret_cast<const float4*>(l + base);
    x[0] = v.x;
    x[1] = v.y;
    x[2] = v.z;
    x[3] = v.w;
    return 0xfu;
  }
  unsigned valid = 0;
#pragma unroll
  for (int k = 0; k < kTokensPerThread; ++k) {
    const bool in = base + k < end;
    x[k] = in ? l[base + k] : neg_inf();
    valid |= in ? 1u << k : 0u;
  }
  return valid;
}

// Runs step(std::true_type{}) for a thread step at `base` that lies wholly
// in the slice (every step before the slice's last round), where the mask is
// a constant and its tests compile away, and step(std::false_type{}) for the
// others.
template <class Step>
__device__ __forceinline__ void by_extent(int base, int end, Step&& step) {
  if (base + kTokensPerThread <= end) step(std::true_type{});
  else step(std::false_type{});
}

// Where the plan's tracked token is one of a step's tokens in the slice,
// its (scaled) logit x[k] into the partial.
__device__ __forceinline__ void track_step(Partial& part, const RowPlan& plan, int32_t token0, unsigned valid,
                                           const float (&x)[kTokensPerThread]) {
  const uint32_t tracked_offset = uint32_t(plan.tracked - token0);
  if (tracked_offset < uint32_t(kTokensPerThread) && ((valid >> tracked_offset) & 1u)) {
    part.tracked = x[0];
#pragma unroll
    for (int k = 1; k < kTokensPerThread; ++k)
      if (tracked_offset == uint32_t(k)) part.tracked = x[k];
    part.flags |= kPartialTracked;
  }
}

// Folds logits [begin, end) of one greedy row (token v0 + i at l[i]); each
// thread takes four consecutive tokens at a time, in token order, so the
// partial is fold_logit's bit for bit: a greedy row's score is its logit,
// with no scaling, log-sum-exp or noise. The per-token work is predicated,
// not branched (tokens past the slice's end, and the excluded token, offer
// −inf, which changes nothing), and the candidates are taken by selects.
__device__ __forceinline__ void fold_slice_greedy(Partial& part, const RowPlan& plan, const float* l, int begin,
                                                  int end, int32_t v0) {
  for (int base = begin + threadIdx.x * kTokensPerThread; base < end; base += kThreads * kTokensPerThread) {
    const auto step = [&](auto whole) {
      const int32_t token0 = v0 + base;
      float x[kTokensPerThread];
      const unsigned valid = load_step<decltype(whole)::value>(l, base, end, x);
      bool bad = false;
#pragma unroll
      for (int k = 0; k < kTokensPerThread; ++k) bad |= ((valid >> k) & 1u) && !is_finite(x[k]);
      if (bad) part.flags |= kPartialNonFinite;  // unscaled: a non-finite score is a non-finite logit
      track_step(part, plan, token0, valid, x);
#pragma unroll
      for (int k = 0; k < kTokensPerThread; ++k) {
        const bool offered = ((valid >> k) & 1u) && is_offered(plan, token0 + k);
        offer_candidate<OfferForm::kSelects>(part, offered ? x[k] : neg_inf(), x[k], token0 + k);
      }
    };
    by_extent(base, end, step);
  }
}

// The same for a sampled row (T > 0), with the result of fold_logit token by
// token except for the log-sum-exp's rounding (each step's four scaled
// logits raise the running max once, then add one exp each), but noise only
// where it can matter. A token whose l/T plus the bound of its RNG word's
// bucket (sampling/gumbel_bounds.h) stays below `floor`, the largest
// runner-up of the warp's lanes so far, scores below the slice's final
// runner-up: it can be neither the slice's winner nor its runner-up, so the
// CTA's merged Partial is the one every token's noise would give. A lane
// whose four tokens stay below floor with the largest bound skips the
// step's Philox block too. Every lane of the warp runs every step (the
// floor is a warp reduction).
//
// The per-token work is predicated, not branched: a step's tokens past the
// slice's end count as −inf and are masked out of the flags, the tracked
// logit and the candidates. The tokens that do need noise form a mask per
// lane, and the warp takes one of each lane's in turn, so it evaluates the
// Gumbel transform as often as its busiest lane needs it rather than once
// for every token position any lane needs; a lane offers its tokens in
// token order, as fold_logit would.
__device__ __forceinline__ void fold_slice_sampled(Partial& part, const RowPlan& plan, const float* l, int begin,
                                                   int end, int32_t v0, const float* bounds) {
  static_assert(kTokensPerThread == 4, "one Philox block per thread step");
  const float max_bound = bounds[255];
  float floor = neg_inf();
  for (int step = begin; step < end; step += kThreads * kTokensPerThread) {
    const int base = step + threadIdx.x * kTokensPerThread;
    const int32_t token0 = v0 + base;
    float x[kTokensPerThread];
    uint32_t words[kTokensPerThread] = {0, 0, 0, 0};
    unsigned pending = 0;  // the tokens whose noise is to be drawn and offered
    const auto fold_step = [&](auto whole) {
      const unsigned valid = load_step<decltype(whole)::value>(l, base, end, x);
      float step_max = neg_inf();
      bool maybe = false, bad = false;
#pragma unroll
      for (int k = 0; k < kTokensPerThread; ++k) {
        x[k] *= plan.inv_t;  // −inf stays −inf (inv_t > 0)
        bad |= ((valid >> k) & 1u) && !is_finite(x[k]);
        step_max = fmaxf(step_max, x[k]);
        maybe |= !(x[k] + max_bound < floor);
      }
      if (bad) {  // rare: which flag, from the raw logits
#pragma unroll
        for (int k = 0; k < kTokensPerThread; ++k)
          if (((valid >> k) & 1u) && !is_finite(x[k]))
            part.flags |= is_finite(l[base + k]) ? kPartialScaleOverflow : kPartialNonFinite;
      }
      track_step(part, plan, token0, valid, x);
      if (step_max > part.m) {
        part.s *= exp_of_difference(part.m, step_max);
        part.m = step_max;
      }
#pragma unroll
      for (int k = 0; k < kTokensPerThread; ++k) {
        const float e = exp_of_difference(x[k], part.m);  // NaN where both are −inf: masked
        part.s += ((valid >> k) & 1u) ? e : 0.0f;
      }
      if (maybe) {
        Philox4 noise;
        // Tokens 4b .. 4b+3 share one Philox block; token0 is a multiple of 4
        // unless a shard starts off one.
        if ((token0 & 3) == 0) noise = row_block(plan.key, uint32_t(token0) >> 2);
        else
          for (int k = 0; k < kTokensPerThread; ++k) noise.v[k] = noise_word(plan.key, token0 + k);
#pragma unroll
        for (int k = 0; k < kTokensPerThread; ++k) {
          words[k] = noise.v[k];
          const bool offer =
              ((valid >> k) & 1u) && is_offered(plan, token0 + k) && !(x[k] + bounds[words[k] >> 24] < floor);
          pending |= offer ? 1u << k : 0u;
        }
      }
    };
    // Whole steps skip about 18 of the 94 instructions of a step whose
    // tokens all stay below the floor. The warp reconverges after either
    // kind, before it offers its pending tokens and reduces the floor
    // (warp-wide votes and shuffles).
    by_extent(base, end, fold_step);
    offer_pending(pending, [&](int k) {
      float xk = x[0];
      uint32_t wk = words[0];
#pragma unroll
      for (int j = 1; j < kTokensPerThread; ++j)
        if (k == j) {
          xk = x[j];
          wk = words[j];
        }
      // The partial is in registers: candidates by selects (OfferForm).
      offer_candidate<OfferForm::kSelects>(part, xk + gumbel_from_bits(wk), xk, token0 + k);
    });
    float runner_up = part.second;
    for (int mask = 16; mask > 0; mask >>= 1)
      runner_up = fmaxf(runner_up, __shfl_xor_sync(0xffffffffu, runner_up, mask));
    floor = runner_up;
  }
}

__global__ void __launch_bounds__(kThreads) fold_chunk_kernel(const float* logits, int32_t chunk_ld, int32_t v0,
                                                                int32_t count, int32_t slice, const RowPlan* plans,
                                                                int32_t row_base, Partial* partials,
                                                                int32_t partial_stride, int32_t group_base,
                                                                const float* gumbel_bounds) {
  static_assert(kThreads == 256, "one thread per Gumbel bucket bound");
  __shared__ float bounds[256];
  bounds[threadIdx.x] = gumbel_bounds[threadIdx.x];  // written when the context was made
  __syncthreads();
  pdl_wait();
  const int row = blockIdx.y;
  const int s = blockIdx.x;
  const RowPlan plan = plans[row_base + row];
  const bool greedy = plan.flags & kPlanGreedy;
  const float* l = logits + int64_t(row) * chunk_ld;
  const int begin = s * slice, end = min(count, begin + slice);

  // One loop per row kind, so the greedy loop carries no noise and no
  // scaling.
  Partial part = empty_partial();
  if (greedy) fold_slice_greedy(part, plan, l, begin, end, v0);
  else fold_slice_sampled(part, plan, l, begin, end, v0, bounds);

  __shared__ Partial warp_parts[kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int mask = 1; mask < 32; mask <<= 1) merge_with_lane(part, mask, lane);
  if (lane == 0) warp_parts[warp] = part;
  __syncthreads();
  if (threadIdx.x == 0) {
    Partial all = warp_parts[0];
    for (int w = 1; w < kThreads / 32; ++w) merge_partial(all, warp_parts[w]);
    partials[int64_t(group_base + s) * partial_stride + row_base + row] = all;
  }
}

const char* cublas_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "cuBLAS error";
  }
}

// 8-bit codes of `count` rows → bf16 rows of `columns` elements (a multiple
// of 16; the head's rows are 16-byte aligned and zero-padded to it): each
// thread converts one 16-byte vector of codes into two of bf16, exactly.
template <flashspec_dtype kW>
__global__ void dequantize_kernel(const uint8_t* codes, int64_t ldw, int32_t count, int32_t columns,
                                  uint16_t* out) {
  const int32_t vectors = columns / 16;
  const int64_t total = int64_t(count) * vectors;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / vectors, vector = i % vectors;
    const uint4 in = __ldg(reinterpret_cast<const uint4*>(codes + row * ldw) + vector);
    uint4 lo, hi;
    codes_to_bf16x2<kW>(in.x, lo.x, lo.y);
    codes_to_bf16x2<kW>(in.y, lo.z, lo.w);
    codes_to_bf16x2<kW>(in.z, hi.x, hi.y);
    codes_to_bf16x2<kW>(in.w, hi.z, hi.w);
    uint4* dst = reinterpret_cast<uint4*>(out + row * columns) + 2 * vector;
    dst[0] = lo;
    dst[1] = hi;
  }
}

// Row i of the chunk (token v0 + i) times its scale, in every hidden row.
__global__ void scale_kernel(float* logits, int32_t ld, int32_t count, const float* scales) {
  float* row = logits + int64_t(blockIdx.y) * ld;
  for (int32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x)
    row[i] *= scales[i];
}

cudaDataType cuda_type(flashspec_dtype dtype) {
  switch (dtype) {
    case FLASHSPEC_DTYPE_F32: return CUDA_R_32F;
    case FLASHSPEC_DTYPE_F16: return CUDA_R_16F;
    default: return CUDA_R_16BF;  // bf16, and 8-bit codes converted to bf16
  }
}

}  // namespace

Status logits_chunk(const Product& g, int32_t v0, int32_t count, float* logits, int32_t ld, cudaStream_t stream) {
  const float alpha = 1.0f, beta = 0.0f;
  const cudaDataType type = cuda_type(g.w_dtype);
  const bool codes = dtype_is_8bit(g.w_dtype);
  const int64_t element = int64_t(dtype_size(g.w_dtype));
  // Column-major view: C[count, rows] = W_chunkᵀ-as-stored · H, i.e. row r
  // of `logits` holds the logits of hidden row r over the chunk.
  const int32_t step = codes ? kDequantTokens : count;
  for (int32_t done = 0; done < count; done += step) {
    const int32_t n = std::min(step, count - done);
    const void* w = static_cast<const unsigned char*>(g.w) + int64_t(v0 + done) * g.ldw * element;
    int ldw = int(g.ldw);
    if (codes) {
      const int64_t vectors = int64_t(n) * (g.d_load / 16);
      const unsigned blocks = unsigned(std::min<int64_t>((vectors + 255) / 256, 4096));
      const uint8_t* src = static_cast<const uint8_t*>(w);
      if (g.w_dtype == FLASHSPEC_DTYPE_E4M3)
        dequantize_kernel<FLASHSPEC_DTYPE_E4M3><<<blocks, 256, 0, stream>>>(src, g.ldw, n, g.d_load, g.dequantized);
      else
        dequantize_kernel<FLASHSPEC_DTYPE_I8><<<blocks, 256, 0, stream>>>(src, g.ldw, n, g.d_load, g.dequantized);
      const cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess) return Status{e, "conversion of 8-bit codes"};
      w = g.dequantized;
      ldw = g.d_load;
    }
    const cublasStatus_t s = cublasGemmEx(g.handle, CUBLAS_OP_T, CUBLAS_OP_N, n, g.rows, g.d, &alpha, w, type, ldw,
                                          g.h, type, g.k_pad, &beta, logits + done, CUDA_R_32F, ld,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) return Status{cudaSuccess, cublas_name(s)};
  }
  if (codes) {
    const unsigned blocks = unsigned(std::min<int32_t>((count + 255) / 256, 64));
    scale_kernel<<<dim3(blocks, unsigned(g.rows)), 256, 0, stream>>>(logits, ld, count, g.w_scale + v0);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return Status{e, "row scales of 8-bit codes"};
  }
  return Status{cudaSuccess, nullptr};
}

int32_t chunk_tokens(int32_t rows, int64_t capacity) {
  const int64_t slice = kSliceTokens;
  const int64_t fit = std::min<int64_t>(tuning::kGemmMaxChunkTokens, capacity / std::max(1, rows)) / slice * slice;
  return int32_t(std::max(slice, fit));
}

int32_t slice_tokens(int32_t count, int32_t rows) {
  int32_t slice = kSliceTokens;
  while (slice < tuning::kGemmMaxSliceTokens &&
         int64_t((count + 2 * slice - 1) / (2 * slice)) * rows >= tuning::kGemmFoldMinBlocks)
    slice *= 2;
  return slice;
}

int product_sms(int32_t rows, int sm_count) {
  if (rows > tuning::kGemmSharedSmsMaxRows || sm_count < 2 * tuning::kGemmFoldSms) return 0;
  return sm_count - tuning::kGemmFoldSms;
}

int groups_for(int32_t vocab, int32_t chunk, int32_t rows) {
  int groups = 0;
  for (int32_t v0 = 0; v0 < vocab; v0 += chunk) {
    const int32_t count = std::min(chunk, vocab - v0);
    const int32_t slice = slice_tokens(count, rows);
    groups += (count + slice - 1) / slice;
  }
  return groups;
}

Status scan(const Request& r, cudaStream_t stream) {
  const ScanParams& p = r.p;
  const Product product{r.handle, p.w,       p.ldw, p.w_dtype, p.w_scale, r.dequantized, r.d, p.d_load,
                        static_cast<const unsigned char*>(p.h) + int64_t(p.row_base) * p.k_pad * 2,
                        p.k_pad,  p.rows};
  const ChunkPipeline& chunks = r.chunks;
  // Where the rows make the product a weight stream and there is more than
  // one chunk, every chunk's product leaves SMs to the fold of the chunk
  // before it (tuning::kGemmFoldSms); otherwise cuBLAS takes them all,
  // whatever an earlier call left on the handle.
  const bool shared_sms = chunks.pipelined() && r.product_sms > 0 && r.chunk < p.vocab;
  const cublasStatus_t target = cublasSetSmCountTarget(r.handle, shared_sms ? r.product_sms : 0);
  if (target != CUBLAS_STATUS_SUCCESS) return Status{cudaSuccess, cublas_name(target)};
  int group = 0, index = 0;
  for (int32_t v0 = 0; v0 < p.vocab; v0 += r.chunk, ++index) {
    const int32_t count = std::min(r.chunk, p.vocab - v0);
    float* buffer = nullptr;
    cudaError_t e = chunks.acquire(index, stream, &buffer);
    if (e != cudaSuccess) return Status{e, "order of the logits buffers"};
    const Status status = logits_chunk(product, v0, count, buffer, r.chunk, stream);
    if (status.cuda != cudaSuccess || status.what) return status;
    cudaStream_t fold_stream = stream;
    if ((e = chunks.hand_over(index, stream, &fold_stream)) != cudaSuccess)
      return Status{e, "order of the logits buffers"};
    int32_t slice = slice_tokens(count, p.rows);
    const int slices = (count + slice - 1) / slice;
    const float* logits = buffer;
    int32_t chunk_ld = r.chunk, row_base = p.row_base, stride = p.partial_stride;
    const RowPlan* plans = p.plans;
    Partial* partials = p.partials;
    int32_t first = p.token_base + v0, n = count, group_base = group;
    const float* bounds = r.gumbel_bounds;
    void* args[] = {&logits,   &chunk_ld, &first,  &n,          &slice,     &plans,
                    &row_base, &partials, &stride, &group_base, &bounds};
    // On the side stream the fold follows an event, not the product itself,
    // so it is an ordinary launch there.
    e = chunks.pipelined() ? launch_with(reinterpret_cast<const void*>(&fold_chunk_kernel), dim3(slices, p.rows),
                                         dim3(kThreads), 0, fold_stream, args, nullptr)
                           : launch_dependent(reinterpret_cast<const void*>(&fold_chunk_kernel),
                                              dim3(slices, p.rows), dim3(kThreads), 0, stream, args);
    if (e != cudaSuccess) return Status{e, "fold of a logits chunk"};
    if ((e = chunks.release(index)) != cudaSuccess) return Status{e, "order of the logits buffers"};
    group += slices;
  }
  if (shared_sms) {  // the handle's other products (the controlled pass) use every SM
    const cublasStatus_t s = cublasSetSmCountTarget(r.handle, 0);
    if (s != CUBLAS_STATUS_SUCCESS) return Status{cudaSuccess, cublas_name(s)};
  }
  const cudaError_t e = chunks.join(stream);
  return Status{e, e != cudaSuccess ? "order of the logits buffers" : nullptr};
}

}  // namespace gemm_scan
}  // namespace cuda
}  // namespace flashspec
