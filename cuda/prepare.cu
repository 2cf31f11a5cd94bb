// Kernels that run before a scan: row plans (with the device-side argument
// checks the host cannot do on device memory) and the staging of hidden rows.
#include "codes.cuh"
#include "launch.cuh"
#include "prepare.h"
#include "sampling/algorithm1.h"
#include "sampling/draft_support.h"
#include "tuning.h"
#include "util/dtype.h"

namespace flashspec {
namespace cuda {
namespace prepare {
namespace {

constexpr int kPlanThreads = tuning::kPlanThreads;

__device__ bool valid_temperature(float t) { return isfinite(t) && t >= 0.0f; }

struct VerifyPlanArgs {
  VerifyArgs batch;  // device-resident arrays, not yet checked
  int32_t vocab;
  const int32_t* device_vocab;  // non-NULL: the vocabulary size is read here (gathered shard records)
  RowPlan* plans;
  int32_t* batch_status;
  // Stochastic drafts: the drafts each row tries, and their list.
  RowDrafts* row_drafts;  // [total_rows] or NULL
  int32_t* tried;         // [total_drafts]
};

// The status of draft k (0-based) of request v: its token id, its caller
// uniform, its tree parent, its sparse support (device memory: the rules of
// the C API's host checks, sampling/draft_support.h, with entries inside the
// support arrays, [0, offsets[total_drafts])).
__device__ int32_t draft_status(const VerifyArgs& b, const RequestView& v, int32_t k, int32_t vocab) {
  const int32_t d = v.first_draft + k, x = b.draft_tokens[d];
  if (x < 0 || x >= vocab) return FLASHSPEC_ERR_OUT_OF_RANGE;
  if (b.accept_uniforms && !(b.accept_uniforms[d] > 0.0f && b.accept_uniforms[d] < 1.0f))
    return FLASHSPEC_ERR_INVALID_ARGUMENT;
  if (b.draft_parents && (b.draft_parents[d] < -1 || b.draft_parents[d] >= k)) return FLASHSPEC_ERR_OUT_OF_RANGE;
  if (b.support_offsets) {
    const int32_t* off = b.support_offsets;
    if (off[0] != 0 || off[d] < 0 || off[d + 1] > off[b.total_drafts]) return FLASHSPEC_ERR_OUT_OF_RANGE;
    int32_t entry;
    double sum;
    const SupportFault fault =
        support_row_fault(b.support_tokens, b.support_probs, off[d], off[d + 1], x, vocab, &entry, &sum);
    if (fault != SupportFault::kNone) return support_fault_status(fault);
  }
  return FLASHSPEC_OK;
}

// One block: the offsets must be checked as a whole before any row is
// mapped to its request.
// Plans read only the caller's arrays, never what the kernel before them
// wrote, so after the staging kernel they run beside it (programmatic
// dependent launch): they wait for it only before they exit, and the scan
// that waits for them then finds both done.
__device__ void verify_plans_body(const VerifyPlanArgs& a);

__global__ void __launch_bounds__(kPlanThreads) verify_plans_kernel(const VerifyPlanArgs a) {
  pdl_trigger();
  verify_plans_body(a);
  pdl_wait();
}

__device__ void verify_plans_body(const VerifyPlanArgs& a) {
  const bool dense_q = a.batch.draft_logits != nullptr;
  __shared__ int bad_batch;
  if (threadIdx.x == 0) bad_batch = 0;
  for (int row = threadIdx.x; row < a.batch.total_rows; row += blockDim.x)
    a.plans[row] = inert_plan(FLASHSPEC_ERR_OUT_OF_RANGE);
  __syncthreads();
  for (int r = threadIdx.x; r < a.batch.num_requests; r += blockDim.x) {
    const int32_t lo = a.batch.draft_offsets[r], hi = a.batch.draft_offsets[r + 1];
    bool bad = lo < 0 || hi < lo || hi - lo > a.batch.max_draft_len || hi > a.batch.total_drafts;
    if (r == 0 && lo != 0) bad = true;
    if (r == a.batch.num_requests - 1 && hi != a.batch.total_drafts) bad = true;
    if (bad) atomicOr(&bad_batch, 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) *a.batch_status = bad_batch ? FLASHSPEC_ERR_OUT_OF_RANGE : FLASHSPEC_OK;
  if (bad_batch) return;
  const int32_t vocab = a.device_vocab ? *a.device_vocab : a.vocab;

  // One warp per request, its lanes over the drafts (a tree of 255 nodes is
  // one request): the request's status is that of its first faulty draft,
  // else of its temperatures, else of its control values.
  const int lane = int(threadIdx.x) & 31;
  for (int r = int(threadIdx.x) >> 5; r < a.batch.num_requests; r += int(blockDim.x) >> 5) {
    // Offsets are valid here, so the request's view is too.
    const RequestView v = request_view(a.batch, r);
    int32_t first_fault = 0x7fffffff;  // (draft << 8) | status of the lane's first faulty draft
    for (int32_t k = lane; k < v.num_drafts; k += 32) {
      const int32_t status = draft_status(a.batch, v, k, vocab);
      if (status != FLASHSPEC_OK) {
        first_fault = (k << 8) | status;
        break;
      }
    }
    first_fault = __reduce_min_sync(0xffffffffu, first_fault);
    if (lane != 0) continue;
    int32_t status = first_fault != 0x7fffffff ? (first_fault & 0xff) : FLASHSPEC_OK;
    if (status == FLASHSPEC_OK && !valid_temperature(v.temperature)) status = FLASHSPEC_ERR_INVALID_ARGUMENT;
    if (status == FLASHSPEC_OK && dense_q && !(valid_temperature(v.draft_temperature) && v.draft_temperature > 0.0f))
      status = FLASHSPEC_ERR_INVALID_ARGUMENT;
    if (status == FLASHSPEC_OK) status = control_values_status(a.batch.controls, r, vocab);
    // The request's status waits in its first row's plan: every plan of the
    // request ends with this status, so it reads the same before and after
    // that row's plan is written below.
    a.plans[v.first_row] = inert_plan(status);
  }
  __syncthreads();

  // One thread per row (a tree of 255 nodes is 256 rows of one request):
  // in rounds of blockDim rows, each thread reads its request's status,
  // then, after a barrier, writes its row's plan.
  const int32_t rows = a.batch.total_drafts + a.batch.num_requests;
  for (int32_t base = 0; base < rows; base += blockDim.x) {
    const int32_t row = base + int32_t(threadIdx.x);
    int32_t r = 0, status = FLASHSPEC_OK;
    if (row < rows) {
      // The request whose rows [offsets[r] + r, offsets[r + 1] + r + 1) hold
      // this row: offsets[r] + r increases strictly with r.
      int32_t lo = 0, hi = a.batch.num_requests - 1;
      while (lo < hi) {
        const int32_t mid = (lo + hi + 1) / 2;
        if (a.batch.draft_offsets[mid] + mid <= row) lo = mid;
        else hi = mid - 1;
      }
      r = lo;
      status = a.plans[a.batch.draft_offsets[r] + r].status;
    }
    __syncthreads();
    if (row < rows) {
      const RequestView v = request_view(a.batch, r);
      const int32_t j = row - v.first_row;
      // Under typical acceptance a rejecting row samples p itself (row_plan.h).
      const bool typical = j < v.num_drafts && a.batch.controls.present &&
                           typical_acceptance(row_controls(a.batch.controls, r, row));
      a.plans[row] = status == FLASHSPEC_OK ? batch_row_plan(a.batch, v, j, typical) : inert_plan(status);
      if (a.row_drafts) {
        RowDrafts rd = {0, 0, -1, 0};
        if (status == FLASHSPEC_OK) {
          rd.begin = drafts_tried_before(a.batch, v, j);
          rd.count = drafts_tried_at(a.batch, v, j, a.tried + rd.begin);
          if (a.batch.draft_parents && j > 0) rd.own = v.first_draft + j - 1;
        }
        a.row_drafts[row] = rd;
      }
    }
    __syncthreads();
  }
}

struct DraftPlanArgs {
  DraftArgs draft;  // device-resident arrays, not yet checked
  int64_t vocab;    // the controls' token ids are checked against it
  RowPlan* plans;
};

__device__ void draft_plan_row(const DraftPlanArgs& a, int r);

__global__ void draft_plans_kernel(const DraftPlanArgs a) {
  pdl_trigger();
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < a.draft.rows) draft_plan_row(a, r);
  pdl_wait();  // as verify_plans_kernel
}

__device__ void draft_plan_row(const DraftPlanArgs& a, int r) {
  const DraftRowView v = draft_row_view(a.draft, r);
  if (!valid_temperature(v.temperature))
    a.plans[r] = inert_plan(FLASHSPEC_ERR_INVALID_ARGUMENT);
  else if (v.position < 0 || v.position > FLASHSPEC_MAX_DRAFT_LEN)
    a.plans[r] = inert_plan(FLASHSPEC_ERR_OUT_OF_RANGE);
  else if (const int32_t status = control_values_status(a.draft.controls, r, a.vocab))
    a.plans[r] = inert_plan(status);
  else
    a.plans[r] = draft_row_plan(v);
}

// The f16 copies of an 8-bit head's hidden rows (RingHidden, TileHidden):
// row r times 2^k, the row's largest magnitude put in [2^15, 2^16) (f16's
// largest finite value is 65504). Every value is then exact in f16 if none
// falls below 2^-14 (29 binades under the largest), with a factor 2^-k
// that is a normal float; an all-zero row takes k = 0. The block's threads
// each note the biased bf16 exponents of their values (note_exponents),
// then row_f16_scaling combines them.
struct F16Scaling {
  bool fits;
  int k;
  __device__ float factor() const { return fits ? __int_as_float((127 - k) << 23) : 0.0f; }
  // A pair of bf16 values (a 32-bit word) as the pair of the scaled f16 copy.
  __device__ uint32_t pair(uint32_t bf16_pair) const {
    const float scale = __int_as_float((127 + k) << 23);
    auto to_f16 = [&](uint32_t bf16) {
      return uint32_t(__half_as_ushort(__float2half_rn(__uint_as_float(bf16 << 16) * scale)));
    };
    return to_f16(bf16_pair & 0xffffu) | to_f16(bf16_pair >> 16) << 16;
  }
};
__device__ __forceinline__ void note_exponents(uint32_t bf16_pair, int& biggest, int& smallest) {
  for (const uint32_t v : {bf16_pair & 0xffffu, bf16_pair >> 16})
    if (v & 0x7fffu) {  // nonzero: a subnormal's exponent 0 and Inf's or NaN's 255 never fit
      const int exponent = int(v >> 7) & 0xff;
      biggest = max(biggest, exponent);
      smallest = min(smallest, exponent);
    }
}
// The block's scaling from its threads' exponents (every thread calls it).
__device__ F16Scaling row_f16_scaling(int biggest, int smallest) {
  __shared__ int exponent_max, exponent_min;  // the row's nonzero values' biased bf16 exponents
  if (threadIdx.x == 0) exponent_max = 0, exponent_min = 255;
  __syncthreads();
  atomicMax(&exponent_max, biggest);
  atomicMin(&exponent_min, smallest);
  __syncthreads();
  const int top = exponent_max, bottom = exponent_min;
  __syncthreads();  // read by all before a later call's thread 0 resets them
  const bool zero = top == 0;
  return F16Scaling{zero || (top >= 16 && top <= 254 && bottom >= 1 && bottom >= top - 29), zero ? 0 : 142 - top};
}

// visit(q, word) for each pair q < pairs of a copy of the block's row of
// bf16 values (d of them) that this thread writes, word the row's pair of
// values there: columns column_of(2q) and + 1 (zero beyond d). kInFlight
// pairs' loads are issued before their visits; the row was just read by
// this block, so they are L1 hits.
template <class ColumnOf, class Visit>
__device__ __forceinline__ void each_row_pair(const uint16_t* __restrict__ row, int32_t d, int pairs,
                                              ColumnOf&& column_of, Visit&& visit) {
  constexpr int kInFlight = 4;
  auto gather = [&](int pair) {
    const int c = column_of(2 * pair);
    const uint32_t lo = c < d ? row[c] : 0u, hi = c + 1 < d ? row[c + 1] : 0u;
    return lo | hi << 16;
  };
  for (int first = threadIdx.x; first < pairs; first += kInFlight * blockDim.x) {
    uint32_t word[kInFlight];
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) word[i] = gather(first + i * int(blockDim.x));
#pragma unroll
    for (int i = 0; i < kInFlight; ++i)
      if (first + i * int(blockDim.x) < pairs) visit(first + i * int(blockDim.x), word[i]);
  }
}

// The block's row of bf16 values (d of them, row r of the launch) as the
// 8-bit-code TMA ring reads it (RingHidden): in the ring's k order (codes.cuh),
// zero beyond d, as 32-bit pairs (columns 2q and 2q + 1 of a copy are a
// pair of the row: ring_code_order_holds), the bf16 copy and the row's
// range of exponents in a first pass, then the f16 copy where it is exact,
// and the row's factor.
__device__ void stage_ring_hidden(const uint16_t* __restrict__ row, int32_t d, int32_t k_pad, const RingHidden& ring,
                                  int64_t r) {
  const int pairs = int(ring_code_columns(k_pad) / 2);
  const auto ring_column = [](int kappa) {
    return kappa / kRingCodeBlock * kRingCodeBlock + ring_code_column(kappa % kRingCodeBlock);
  };
  int biggest = 0, smallest = 255;
  uint32_t* const bf16_out = reinterpret_cast<uint32_t*>(ring.bf16) + r * pairs;
  each_row_pair(row, d, pairs, ring_column, [&](int q, uint32_t word) {
    bf16_out[q] = word;
    note_exponents(word, biggest, smallest);
  });
  const F16Scaling scaling = row_f16_scaling(biggest, smallest);
  if (threadIdx.x == 0) ring.factors[r] = scaling.factor();
  if (!scaling.fits) return;
  uint32_t* const f16_out = reinterpret_cast<uint32_t*>(ring.f16) + r * pairs;
  each_row_pair(row, d, pairs, ring_column, [&](int q, uint32_t word) { f16_out[q] = scaling.pair(word); });
}

// The same row as the tile scan reads it in f16 (TileHidden): in W's k
// order, k_pad values, zero beyond d.
__device__ void stage_tile_hidden(const uint16_t* __restrict__ row, int32_t d, int32_t k_pad, const TileHidden& tile,
                                  int64_t r) {
  const int pairs = k_pad / 2;
  const auto natural = [](int c) { return c; };
  int biggest = 0, smallest = 255;
  each_row_pair(row, d, pairs, natural, [&](int, uint32_t word) { note_exponents(word, biggest, smallest); });
  const F16Scaling scaling = row_f16_scaling(biggest, smallest);
  if (threadIdx.x == 0) tile.factors[r] = scaling.factor();
  if (!scaling.fits) return;
  uint32_t* const f16_out = reinterpret_cast<uint32_t*>(tile.f16) + r * pairs;
  each_row_pair(row, d, pairs, natural, [&](int q, uint32_t word) { f16_out[q] = scaling.pair(word); });
}

// One block per row, an element at a time: any dtype, stride and alignment.
__global__ void stage_hidden_kernel(const void* src, flashspec_dtype dtype, int64_t ld, int32_t d, int32_t k_pad,
                                    int32_t as_float, void* out, int32_t* bad, RingHidden ring,
                                    TileHidden tile) {
  pdl_trigger();  // the scan may launch now and wait for these rows
  const int64_t r = blockIdx.x;
  const size_t esize = dtype_size(dtype);
  const unsigned char* row = static_cast<const unsigned char*>(src) + r * ld * int64_t(esize);
  int found = 0;
  for (int c = threadIdx.x; c < k_pad; c += blockDim.x) {
    if (as_float) {
      float v = c < d ? load_as_float(row, dtype, c) : 0.0f;
      if (!isfinite(v)) found = 1;
      static_cast<float*>(out)[r * k_pad + c] = v;
    } else {
      uint16_t v = c < d ? reinterpret_cast<const uint16_t*>(row)[c] : uint16_t(0);
      if (c < d && !isfinite(load_as_float(row, dtype, c))) found = 1;
      static_cast<uint16_t*>(out)[r * k_pad + c] = v;
    }
  }
  if (ring.bf16) stage_ring_hidden(reinterpret_cast<const uint16_t*>(row), d, k_pad, ring, r);
  if (tile.f16) stage_tile_hidden(reinterpret_cast<const uint16_t*>(row), d, k_pad, tile, r);
  found = __syncthreads_or(found);
  if (threadIdx.x == 0) bad[r] = found;
}

// Element e of 16 bytes of a kSrc row, as fp32 (exact).
template <flashspec_dtype kSrc>
__device__ __forceinline__ float element_of(const uint4& v, int e) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
  if constexpr (kSrc == FLASHSPEC_DTYPE_F32) return __uint_as_float(words[e]);
  const uint16_t half = uint16_t(words[e / 2] >> (16 * (e & 1)));
  if constexpr (kSrc == FLASHSPEC_DTYPE_BF16) return bf16_to_float(half);
  return fp16_to_float(half);
}

// The same for rows of 16-byte groups (16-byte aligned, d a whole number of
// groups), a group per thread at a time and kGroupsInFlight groups' loads
// issued before their stores. The row is a few kilobytes, so the kernel's
// time is the latency of its loads: one element at a time, each load waiting
// for the store before it (which might alias it), took 6–7 µs at d = 4096,
// and the scan waits for these rows.
template <flashspec_dtype kSrc>
__global__ void stage_hidden_groups_kernel(const uint4* __restrict__ src, int64_t ld_groups, int32_t d,
                                           int32_t k_pad, int32_t as_float, void* __restrict__ out,
                                           int32_t* __restrict__ bad, RingHidden ring, TileHidden tile) {
  constexpr int kPer = kSrc == FLASHSPEC_DTYPE_F32 ? 4 : 8;  // elements per 16 bytes
  constexpr int kGroupsInFlight = 4;
  pdl_trigger();  // the scan may launch now and wait for these rows
  const int64_t r = blockIdx.x;
  const uint4* row = src + r * ld_groups;
  const int groups = d / kPer;
  int found = 0;
  for (int first = threadIdx.x; first < groups; first += kGroupsInFlight * blockDim.x) {
    uint4 v[kGroupsInFlight];
#pragma unroll
    for (int i = 0; i < kGroupsInFlight; ++i) {
      const int g = first + i * int(blockDim.x);
      v[i] = g < groups ? row[g] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < kGroupsInFlight; ++i) {
      const int g = first + i * int(blockDim.x);
      if (g >= groups) continue;
      float x[kPer];
#pragma unroll
      for (int e = 0; e < kPer; ++e) {
        x[e] = element_of<kSrc>(v[i], e);
        found |= !isfinite(x[e]);
      }
      if (as_float) {
        float4* dst = reinterpret_cast<float4*>(static_cast<float*>(out) + r * k_pad + int64_t(g) * kPer);
#pragma unroll
        for (int q = 0; q < kPer / 4; ++q) dst[q] = make_float4(x[4 * q], x[4 * q + 1], x[4 * q + 2], x[4 * q + 3]);
      } else {  // raw 16-bit values (kPer = 8)
        reinterpret_cast<uint4*>(static_cast<uint16_t*>(out) + r * k_pad)[g] = v[i];
      }
    }
  }
  for (int c = d + int(threadIdx.x); c < k_pad; c += blockDim.x) {
    if (as_float) static_cast<float*>(out)[r * k_pad + c] = 0.0f;
    else static_cast<uint16_t*>(out)[r * k_pad + c] = 0;
  }
  if (ring.bf16) stage_ring_hidden(reinterpret_cast<const uint16_t*>(row), d, k_pad, ring, r);
  if (tile.f16) stage_tile_hidden(reinterpret_cast<const uint16_t*>(row), d, k_pad, tile, r);
  found = __syncthreads_or(found);
  if (threadIdx.x == 0) bad[r] = found;
}

__global__ void non_finite_kernel(const void* data, flashspec_dtype dtype, int64_t rows, int64_t cols, int64_t ld,
                                  int32_t* found) {
  const size_t esize = dtype_size(dtype);
  int any = 0;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const unsigned char* row = static_cast<const unsigned char*>(data) + r * ld * int64_t(esize);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      if (!isfinite(load_as_float(row, dtype, c))) any = 1;
  }
  any = __syncthreads_or(any);
  if (threadIdx.x == 0 && any) atomicOr(found, 1);
}

}  // namespace

cudaError_t verify_plans(const VerifyArgs& args, int32_t vocab, const int32_t* device_vocab, RowPlan* plans,
                         int32_t* batch_status, cudaStream_t stream, bool after_staging, RowDrafts* row_drafts,
                         int32_t* tried) {
  VerifyPlanArgs a{args, vocab, device_vocab, plans, batch_status, row_drafts, tried};
  void* params[] = {&a};
  const void* kernel = reinterpret_cast<const void*>(&verify_plans_kernel);
  return after_staging ? launch_dependent(kernel, dim3(1), dim3(kPlanThreads), 0, stream, params)
                       : launch(kernel, dim3(1), dim3(kPlanThreads), 0, false, stream, params);
}

cudaError_t draft_plans(const DraftArgs& args, int64_t vocab, RowPlan* plans, cudaStream_t stream,
                        bool after_staging) {
  DraftPlanArgs a{args, vocab, plans};
  void* params[] = {&a};
  const void* kernel = reinterpret_cast<const void*>(&draft_plans_kernel);
  const dim3 grid(unsigned((args.rows + 127) / 128));
  return after_staging ? launch_dependent(kernel, grid, dim3(128), 0, stream, params)
                       : launch(kernel, grid, dim3(128), 0, false, stream, params);
}

cudaError_t stage_hidden(const flashspec_tensor& hidden, int32_t k_pad, bool as_float, void* out, int32_t* bad,
                         const RingHidden& ring, const TileHidden& tile, cudaStream_t stream) {
  if ((ring.bf16 || tile.f16) && (as_float || hidden.dtype != FLASHSPEC_DTYPE_BF16)) return cudaErrorInvalidValue;
  const int64_t esize = int64_t(dtype_size(hidden.dtype));
  const bool groups = (hidden.dtype == FLASHSPEC_DTYPE_F32 || hidden.dtype == FLASHSPEC_DTYPE_BF16 ||
                       hidden.dtype == FLASHSPEC_DTYPE_F16) &&
                      (as_float || esize == 2) && reinterpret_cast<uintptr_t>(hidden.data) % 16 == 0 && hidden.row_stride * esize % 16 == 0 &&
                      hidden.cols * esize % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0 &&
                      k_pad % 8 == 0;
  const dim3 grid(unsigned(hidden.rows)), block(256);
  const uint4* src = static_cast<const uint4*>(hidden.data);
  const int64_t ld_groups = hidden.row_stride * esize / 16;
  const int32_t d = int32_t(hidden.cols), f = as_float ? 1 : 0;
  if (!groups)
    stage_hidden_kernel<<<grid, block, 0, stream>>>(hidden.data, hidden.dtype, hidden.row_stride, d, k_pad, f, out,
                                                     bad, ring, tile);
  else if (hidden.dtype == FLASHSPEC_DTYPE_F32)
    stage_hidden_groups_kernel<FLASHSPEC_DTYPE_F32><<<grid, block, 0, stream>>>(src, ld_groups, d, k_pad, f, out, bad,
                                                                                ring, tile);
  else if (hidden.dtype == FLASHSPEC_DTYPE_BF16)
    stage_hidden_groups_kernel<FLASHSPEC_DTYPE_BF16><<<grid, block, 0, stream>>>(src, ld_groups, d, k_pad, f, out, bad,
                                                                                 ring, tile);
  else
    stage_hidden_groups_kernel<FLASHSPEC_DTYPE_F16><<<grid, block, 0, stream>>>(src, ld_groups, d, k_pad, f, out, bad,
                                                                                ring, tile);
  return cudaGetLastError();
}

cudaError_t find_non_finite(const void* data, flashspec_dtype dtype, int64_t rows, int64_t cols, int64_t ld,
                            int32_t* found, cudaStream_t stream) {
  cudaError_t e = cudaMemsetAsync(found, 0, sizeof(int32_t), stream);
  if (e != cudaSuccess) return e;
  const int64_t blocks = rows < 4096 ? rows : 4096;
  non_finite_kernel<<<unsigned(blocks), 256, 0, stream>>>(data, dtype, rows, cols, ld, found);
  return cudaGetLastError();
}

}  // namespace prepare
}  // namespace cuda
}  // namespace flashspec
