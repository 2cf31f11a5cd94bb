// The controlled pass (controls.h): the controlled streaming scan (≤ 16
// rows), or cuBLAS chunks of logits, a fold per 4096-token slice, a merge of
// each row's candidates after every chunk, and one block per row that
// applies the controls and writes the row's summary (summarize_row, which
// the streaming scan's CTAs run too).
#include <algorithm>
#include <utility>

#include "controls.h"

#include <cooperative_groups.h>
#include "launch.cuh"
#include "scan_gemm.h"
#include "stream_tiles.cuh"
#include "tuning.h"
#include "sampling/controls.h"
#include "util/philox.h"

namespace flashspec {
namespace cuda {
namespace controls {
namespace {

static_assert(tuning::kGemmMaxChunkTokens <= kMaxSlicesPerChunk * kSliceTokens,
              "a merge block holds the candidate lists of one chunk's slices in registers");
constexpr int kFoldThreads = 256;
constexpr int kTokensPerThread = kSliceTokens / kFoldThreads;
static_assert(kTokensPerThread % 4 == 0, "each thread takes whole Philox blocks of four tokens");
constexpr int kRowThreads = 1024;  // merge and summary blocks: one candidate per thread
static_assert(kCandidates <= kRowThreads, "the summary block ranks one candidate per thread");
constexpr int kTopN = FLASHSPEC_MAX_TOP_LOGPROBS;
constexpr int kRankByCounting = 256;  // summary lists ranked by counting rather than sorted
constexpr int kBiasThreads = 256;

// One row's reduction over a token range (the controlled x = (l + bias)/T of
// the allowed tokens; T = 0: l + bias).
struct ControlPartial {
  float m, s, w;          // log-sum-exp of x (T > 0) as (max, Σ e^(x−m)), and Σ e^(x−m)·x
  float rm, rs;           // log-sum-exp of the raw logits
  float best, second;     // the sample of a row nothing truncates: Gumbel (T > 0) or x (T = 0) score
  float best_x, best_raw;
  int32_t token;          // −1: none
  float tracked_x;        // the drafted token's x (−Inf when masked) and raw logit
  float tracked_raw;
  int32_t allowed;        // allowed tokens
  int32_t flags;          // kPartial*
};

__device__ ControlPartial empty_control_partial() {
  ControlPartial p;
  p.m = neg_inf();
  p.s = 0.0f;
  p.w = 0.0f;
  p.rm = neg_inf();
  p.rs = 0.0f;
  p.best = neg_inf();
  p.second = neg_inf();
  p.best_x = 0.0f;
  p.best_raw = 0.0f;
  p.token = -1;
  p.tracked_x = neg_inf();
  p.tracked_raw = 0.0f;
  p.allowed = 0;
  p.flags = 0;
  return p;
}

// (m, s, w) ← (m, s, w) ∪ {x}: the log-sum-exp with Σ e^(x−m)·x beside it.
__device__ __forceinline__ void weighted_lse_add(float& m, float& s, float& w, float x) {
  if (x > m) {
    const float scale = expf(m - x);
    s = s * scale + 1.0f;
    w = w * scale + x;
    m = x;
  } else {
    const float e = expf(x - m);
    s += e;
    w += e * x;
  }
}

// A partial's sample (ControlPartial, BandPartial): offers a token with its
// score, x and raw logit; ties keep the earlier, smaller id.
template <class P>
__device__ __forceinline__ void offer_sample(P& part, float score, float x, float raw, int32_t token) {
  if (score > part.best) {
    part.second = part.best;
    part.best = score;
    part.best_x = x;
    part.best_raw = raw;
    part.token = token;
  } else if (score > part.second) {
    part.second = score;
  }
}

// a's sample ← a's ∪ b's; ties between winners go to the smaller token id.
template <class P>
__device__ __forceinline__ void merge_sample(P& a, const P& b) {
  const bool b_wins = b.token >= 0 && (a.token < 0 || b.best > a.best || (b.best == a.best && b.token < a.token));
  if (b_wins) {
    a.second = fmaxf(a.best, b.second);
    a.best = b.best;
    a.best_x = b.best_x;
    a.best_raw = b.best_raw;
    a.token = b.token;
  } else {
    a.second = fmaxf(a.second, b.best);
  }
}

// The block's partials merged as a tree in shared memory, in a fixed order;
// reduce[0] holds the result (every thread passes its own).
template <class P, class Merge>
__device__ void block_merge(P* reduce, const P& part, Merge merge) {
  reduce[threadIdx.x] = part;
  __syncthreads();
  for (int half = int(blockDim.x) / 2; half > 0; half >>= 1) {
    if (int(threadIdx.x) < half) merge(reduce[threadIdx.x], reduce[threadIdx.x + half]);
    __syncthreads();
  }
}

__device__ void merge_control_partial(ControlPartial& a, const ControlPartial& b) {
  if (b.m > a.m) {
    const float scale = expf(a.m - b.m);
    a.s = a.s * scale + b.s;
    a.w = a.w * scale + b.w;
    a.m = b.m;
  } else if (b.m != neg_inf()) {
    const float e = expf(b.m - a.m);
    a.s += b.s * e;
    a.w += b.w * e;
  }
  lse_merge(a.rm, a.rs, b.rm, b.rs);
  merge_sample(a, b);
  if (b.flags & kPartialTracked) {
    a.tracked_x = b.tracked_x;
    a.tracked_raw = b.tracked_raw;
  }
  a.allowed += b.allowed;
  a.flags |= b.flags;
}

// The warp's partials merged into lane 0's, lanes in a fixed order.
__device__ void warp_merge_control_partial(ControlPartial& part) {
  const int lane = threadIdx.x & 31;
#pragma unroll 1
  for (int offset = 16; offset > 0; offset >>= 1) {
    ControlPartial other;
    other.m = __shfl_down_sync(0xffffffffu, part.m, offset);
    other.s = __shfl_down_sync(0xffffffffu, part.s, offset);
    other.w = __shfl_down_sync(0xffffffffu, part.w, offset);
    other.rm = __shfl_down_sync(0xffffffffu, part.rm, offset);
    other.rs = __shfl_down_sync(0xffffffffu, part.rs, offset);
    other.best = __shfl_down_sync(0xffffffffu, part.best, offset);
    other.second = __shfl_down_sync(0xffffffffu, part.second, offset);
    other.best_x = __shfl_down_sync(0xffffffffu, part.best_x, offset);
    other.best_raw = __shfl_down_sync(0xffffffffu, part.best_raw, offset);
    other.token = __shfl_down_sync(0xffffffffu, part.token, offset);
    other.tracked_x = __shfl_down_sync(0xffffffffu, part.tracked_x, offset);
    other.tracked_raw = __shfl_down_sync(0xffffffffu, part.tracked_raw, offset);
    other.allowed = __shfl_down_sync(0xffffffffu, part.allowed, offset);
    other.flags = __shfl_down_sync(0xffffffffu, part.flags, offset);
    if (lane < offset) merge_control_partial(part, other);
  }
}

// A row whose kept set runs past its candidate list (the first pass's
// summary writes it; the second pass adds the crossing bin).
struct Continuation {
  int32_t active;       // 1: the row continues in the second and third passes
  int32_t bin;          // the bin where top-p's cumulative mass is reached; −1: none (min-p only,
                        // or every token is kept)
  float x0;             // the row's largest x
  float list_mass;      // Σ e^(x − x0) over the candidate list, in rank order (fp32)
  float target;         // top-p's mass target (top_p · Σ e^(x − x0) over the allowed tokens), +Inf without
  float min_p;          // 0: none
  uint64_t last_key;    // the list's last (smallest) key: every token ranked before is in the list
  float list_weighted;  // Σ e^(x − x0)·x over the list
  float best, second;   // the list's Gumbel-max sample (the excluded token skipped)
  float best_x, best_raw;
  int32_t token;
  int32_t pad;
};

// The third pass's reduction of one slice of a continuing row: the tokens
// ranked after the list and above the crossing bin (kept), and how many lie
// in the bin (its candidates go to the lists).
struct BandPartial {
  float mass, weighted;  // Σ e^(x − x0), Σ e^(x − x0)·x
  float best, second, best_x, best_raw;
  int32_t token;
  int32_t bin_count;
};

__device__ BandPartial empty_band_partial() {
  BandPartial b;
  b.mass = 0.0f;
  b.weighted = 0.0f;
  b.best = neg_inf();
  b.second = neg_inf();
  b.best_x = 0.0f;
  b.best_raw = 0.0f;
  b.token = -1;
  b.bin_count = 0;
  return b;
}

__device__ void merge_band_partial(BandPartial& a, const BandPartial& b) {
  a.mass += b.mass;
  a.weighted += b.weighted;
  a.bin_count += b.bin_count;
  merge_sample(a, b);
}

// The mass bin of x ≤ x0: kMassBins bins of kMassBinNats / kMassBins nats
// below x0, the last one open below.
__device__ __forceinline__ int mass_bin(float x, float x0) {
  const float d = (x0 - x) * (float(kMassBins) / kMassBinNats);
  return d >= float(kMassBins - 1) ? kMassBins - 1 : int(d);
}

// e^(x − x0) ≤ 1 in fixed point, 2^40 per unit: sums of them are exact and
// independent of their order.
constexpr double kMassUnit = 1099511627776.0;  // 2^40
__device__ __forceinline__ unsigned long long fixed_mass(float e) {
  return static_cast<unsigned long long>(double(e) * kMassUnit);
}

// Keys that order tokens as the controls rank them: larger x first, ties by
// smaller id; 0 is no key.
__device__ __forceinline__ uint32_t order_bits(float x) {
  const uint32_t u = __float_as_uint(x + 0.0f);  // −0 ranks as +0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ uint64_t rank_key(float x, int32_t token) {
  return (uint64_t(order_bits(x)) << 32) | uint64_t(0xffffffffu - uint32_t(token));
}
__device__ __forceinline__ float key_x(uint64_t key) {
  const uint32_t o = uint32_t(key >> 32);
  return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}
__device__ __forceinline__ int32_t key_token(uint64_t key) { return int32_t(0xffffffffu - uint32_t(key)); }

// What a row of the pass needs from its request: its controls (the bias
// entries sorted and summed by the bias kernel), and how many candidates it
// keeps: 0 when nothing truncates it (or T = 0, where the argmax is always
// kept), top-k when that bounds the kept set, else kCandidates.
struct RowSetup {
  RowPlan plan;
  RowControls c;
  int32_t request;
  bool greedy;
  int32_t keep;
  int32_t bias_status;
};

struct Lists {
  uint64_t* slice_keys;
  float* slice_raws;
  int32_t* slice_counts;
  uint64_t* merged_keys;
  float* merged_raws;
  int32_t* merged_counts;
  uint64_t* thresholds;
  int32_t capacity;  // entries per slice and per merged list
};

struct Common {
  const RowPlan* plans;
  ControlsArgs controls;
  const int32_t* bias_tokens;
  const float* bias_values;
  const int32_t* bias_counts;
  int32_t vocab;
  int32_t rows;
  int32_t slices;   // slices per chunk: the stride of the slice lists
  int32_t top_n;
  int32_t topk;     // a top-k draft: every row keeps its topk best candidates
  Lists candidates;
  Lists tops;
};

__device__ RowSetup row_setup(const Common& a, int row) {
  RowSetup r;
  r.plan = a.plans[row];
  r.greedy = r.plan.flags & kPlanGreedy;
  r.request = 0;
  r.c = no_controls();
  r.keep = 0;
  r.bias_status = FLASHSPEC_OK;
  if (r.plan.status != FLASHSPEC_OK) return r;  // an inert row: its request's arrays may not be read
  r.request = r.plan.request;
  r.c = row_controls(a.controls, r.request, row);
  if (a.controls.bias_offsets) {
    const int32_t count = a.bias_counts[r.request];
    r.bias_status = count < 0 ? FLASHSPEC_ERR_UNSUPPORTED : FLASHSPEC_OK;
    r.c.bias_tokens = a.bias_tokens + int64_t(r.request) * kMaxBiasEntries;
    r.c.bias_values = a.bias_values + int64_t(r.request) * kMaxBiasEntries;
    r.c.bias_count = count < 0 ? 0 : count;
  }
  if (a.topk > 0) r.keep = a.topk;
  else if (!r.greedy && truncates(r.c, a.vocab)) r.keep = r.c.top_k <= kCandidates ? r.c.top_k : kCandidates;
  return r;
}

// Index of the first sorted bias token ≥ token.
__device__ int32_t lower_bound(const int32_t* sorted, int32_t count, int32_t token) {
  int32_t lo = 0, hi = count;
  while (lo < hi) {
    const int32_t mid = (lo + hi) >> 1;
    if (sorted[mid] < token) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// x of an allowed token: its logit, repetition-penalised and biased when the
// row's sorted bias entries [blo, bhi) name it, divided by T (T > 0).
__device__ __forceinline__ float controlled_x(const RowSetup& r, float lv, int32_t token, int32_t blo, int32_t bhi) {
  float biased = lv;
  if (bhi > blo) {
    const int32_t at = blo + lower_bound(r.c.bias_tokens + blo, bhi - blo, token);
    if (at < bhi && r.c.bias_tokens[at] == token)
      biased = repetition_penalised(lv, r.c.repetition_penalty) + r.c.bias_values[at];
  }
  return r.greedy ? biased : biased * r.plan.inv_t;
}

// The per-token rules of a row's fold, one token into a ControlPartial: the
// raw logit's flags and tracking; for an allowed token its x, the count, its
// flags and tracking and, where `offers` (a row nothing truncates), the
// Gumbel-max sample (noise: the token's word). What a fold sums about a token
// it adds in on_raw(l) (every token) and on_allowed(x) (an allowed one).
// Returns whether the token is allowed, with its x in *x_out.
template <class OnRaw, class OnAllowed>
__device__ __forceinline__ bool fold_token_rules(ControlPartial& part, const RowSetup& r, float lv, int32_t token,
                                                 int32_t blo, int32_t bhi, bool offers, uint32_t noise, float* x_out,
                                                 OnRaw&& on_raw, OnAllowed&& on_allowed) {
  if (!is_finite(lv)) part.flags |= kPartialNonFinite;
  on_raw(lv);
  if (token == r.plan.tracked) {
    part.tracked_raw = lv;
    part.flags |= kPartialTracked;
  }
  if (!token_allowed(r.c, token)) return false;
  const float x = controlled_x(r, lv, token, blo, bhi);
  if (!is_finite(x)) part.flags |= is_finite(lv) ? kPartialScaleOverflow : kPartialNonFinite;
  ++part.allowed;
  if (token == r.plan.tracked) part.tracked_x = x;
  on_allowed(x);
  *x_out = x;
  if (offers && is_offered(r.plan, token))
    offer_sample(part, r.greedy ? x : x + gumbel_from_bits(noise), x, lv, token);
  return true;
}

// One token folded online (the fold kernel's rule): fold_token_rules with
// the log-sum-exps of the raw logit and of x added as it goes. Returns
// whether the token is a candidate (allowed, in a row that keeps
// candidates), with its x in *x_out.
__device__ __forceinline__ bool fold_token(ControlPartial& part, const RowSetup& r, float lv, int32_t token,
                                           int32_t blo, int32_t bhi, uint32_t noise, float* x_out) {
  const bool allowed = fold_token_rules(
      part, r, lv, token, blo, bhi, r.keep == 0, noise, x_out, [&](float l) { lse_add(part.rm, part.rs, l); },
      [&](float x) {
        if (!r.greedy) weighted_lse_add(part.m, part.s, part.w, x);
      });
  return allowed && r.keep > 0;
}

// ---- Block-wide selection of the K largest distinct keys -----------------

// Keys held by a block's threads, read round by round: round i of thread t
// gives one key (0: none). Every thread runs the same number of rounds.
struct RegisterKeys {
  const uint64_t* keys;  // the thread's kTokensPerThread keys
  __device__ static constexpr int rounds() { return kTokensPerThread; }
  __device__ uint64_t key(int i) const { return keys[i]; }
};

// A merge block's keys, loaded once into registers: the merged list and
// up to kMaxSlicesPerChunk slice lists of kCandidates each.
constexpr int kMergeKeysPerThread = (kCandidates * (kMaxSlicesPerChunk + 1) + kRowThreads - 1) / kRowThreads;
struct CachedKeys {
  uint64_t k[kMergeKeysPerThread];
  __device__ static constexpr int rounds() { return kMergeKeysPerThread; }
  __device__ uint64_t key(int i) const { return k[i]; }
};

// Keys of a row's lists in global memory: the merged list, then the slices'.
struct ListKeys {
  const uint64_t* merged;
  int32_t merged_count;
  const uint64_t* slices;    // slice s at slices + s * capacity
  const int32_t* counts;     // [slices] (shared memory)
  const int32_t* starts;     // running starts of the slices after the merged list (shared memory)
  int32_t slice_count;
  int32_t capacity;
  int32_t total;
  __device__ uint64_t at(int index) const {
    if (index < merged_count) return merged[index];
    int s = 0;
    while (s + 1 < slice_count && index >= starts[s + 1]) ++s;
    return slices[int64_t(s) * capacity + (index - starts[s])];
  }
  __device__ uint64_t key(int i) const {
    const int index = i * int(blockDim.x) + int(threadIdx.x);
    return index < total ? at(index) : 0;
  }
};

// The K-th largest of the block's nonzero keys (distinct, more than K of
// them): radix selection on 8-bit digits, most significant first, with
// warp-aggregated shared-memory histograms.
template <class Keys>
__device__ uint64_t kth_largest(const Keys& keys, int k, uint32_t* hist, int32_t* shared_pick) {
  uint64_t prefix = 0, mask = 0;
  int remaining = k;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < keys.rounds(); ++i) {
      const uint64_t key = keys.key(i);
      const bool match = key != 0 && (key & mask) == prefix;
      const uint32_t digit = uint32_t(key >> shift) & 255u;
      const unsigned active = __ballot_sync(0xffffffffu, match);
      if (match) {
        const unsigned same = __match_any_sync(active, digit);
        if (int(threadIdx.x & 31) == __ffs(same) - 1) atomicAdd(&hist[digit], uint32_t(__popc(same)));
      }
    }
    __syncthreads();
    // The digit holding the remaining-th largest key: warp 0 scans the bins
    // from the top, eight per lane.
    if (threadIdx.x < 32) {
      const int lane = int(threadIdx.x);
      uint32_t counts[8];
      int local = 0;
      for (int i = 0; i < 8; ++i) {
        counts[i] = hist[255 - (lane * 8 + i)];
        local += int(counts[i]);
      }
      int inclusive = local;
      for (int offset = 1; offset < 32; offset <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, inclusive, offset);
        if (lane >= offset) inclusive += v;
      }
      int above = inclusive - local;
      if (above < remaining && inclusive >= remaining) {
        int b = 255 - lane * 8;
        for (int i = 0; i < 8; ++i, --b) {
          if (above + int(counts[i]) >= remaining) break;
          above += int(counts[i]);
        }
        shared_pick[0] = b;
        shared_pick[1] = remaining - above;
      }
    }
    __syncthreads();
    prefix |= uint64_t(uint32_t(shared_pick[0])) << shift;
    mask |= uint64_t(255) << shift;
    remaining = shared_pick[1];
    __syncthreads();
  }
  return prefix;
}

// A position in an output list for each thread that takes an entry, in no
// particular order (the summary ranks the list).
__device__ __forceinline__ int append_position(bool take, int32_t* counter) {
  const unsigned takers = __ballot_sync(0xffffffffu, take);
  if (!takers) return -1;
  const int lane = int(threadIdx.x & 31);
  const int leader = __ffs(takers) - 1;
  int base = 0;
  if (lane == leader) base = atomicAdd(counter, __popc(takers));
  base = __shfl_sync(0xffffffffu, base, leader);
  return take ? base + __popc(takers & ((1u << lane) - 1u)) : -1;
}

// Writes the block's `keep` largest keys (with their raw logits) to
// out_keys/out_raws and their count to *out_count; keys below `floor` are
// out already. Returns the count.
template <class Keys, class Raw>
__device__ int select_into(const Keys& keys, Raw raw_of, int keep, uint64_t floor, uint64_t* out_keys,
                           float* out_raws, int32_t* out_count, uint32_t* hist, int32_t* shared) {
  // shared[0]: keys at or above floor; shared[1..2]: selection; shared[3]: written.
  if (threadIdx.x == 0) {
    shared[0] = 0;
    shared[3] = 0;
  }
  __syncthreads();
  int mine = 0;
#pragma unroll
  for (int i = 0; i < keys.rounds(); ++i) {
    const uint64_t key = keys.key(i);
    mine += key != 0 && key >= floor;
  }
  if (mine) atomicAdd(&shared[0], mine);
  __syncthreads();
  const int present = shared[0];
  uint64_t cut = floor > 0 ? floor : 1;
  if (present > keep) cut = kth_largest(keys, keep, hist, shared + 1);
#pragma unroll
  for (int i = 0; i < keys.rounds(); ++i) {
    const uint64_t key = keys.key(i);
    const bool take = key != 0 && key >= cut;
    const int at = append_position(take, &shared[3]);
    if (take) {
      out_keys[at] = key;
      out_raws[at] = raw_of(i);
    }
  }
  __syncthreads();
  const int written = shared[3];
  if (threadIdx.x == 0) *out_count = written;
  return written;
}

// ---- Bias entries: sorted by token, repeats summed in list order ---------

// What every chunked pass starts from, cleared by the bias kernel's first
// block: merged lists 0 and 1 empty, no thresholds, no continuing row.
struct PassReset {
  int32_t* merged_counts;      // [2][rows] each
  int32_t* top_merged_counts;
  uint64_t* thresholds;        // [rows] each
  uint64_t* top_thresholds;
  int32_t* continue_flag;
};

struct BiasArgs {
  PassReset reset;
  ControlsArgs controls;
  int32_t rows;
  const int32_t* batch_status;
  int32_t* bias_tokens;
  float* bias_values;
  int32_t* bias_counts;
};

constexpr int kBiasSort = kMaxBiasEntries;

__global__ void __launch_bounds__(kBiasThreads) bias_kernel(const BiasArgs a) {
  pdl_wait();  // launched dependent: may start before its predecessor ends
  const int r = blockIdx.x;
  if (r == 0) {
    for (int i = threadIdx.x; i < 2 * a.rows; i += blockDim.x) {
      a.reset.merged_counts[i] = 0;
      a.reset.top_merged_counts[i] = 0;
    }
    for (int i = threadIdx.x; i < a.rows; i += blockDim.x) {
      a.reset.thresholds[i] = 0;
      a.reset.top_thresholds[i] = 0;
    }
    if (threadIdx.x == 0) *a.reset.continue_flag = 0;
  }
  const bool bad_batch = a.batch_status && *a.batch_status != FLASHSPEC_OK;
  if (!a.controls.bias_offsets || bad_batch) return;
  __shared__ uint64_t entries[kBiasSort];
  const int32_t lo = a.controls.bias_offsets[r], hi = a.controls.bias_offsets[r + 1];
  const int32_t n = (lo >= 0 && hi > lo) ? hi - lo : 0;  // bad offsets fail the request's rows (plans)
  if (n > kMaxBiasEntries) {
    if (threadIdx.x == 0) a.bias_counts[r] = -1;
    return;
  }
  int size = 1;
  while (size < n) size <<= 1;
  for (int i = threadIdx.x; i < size; i += blockDim.x)
    entries[i] = i < n ? (uint64_t(uint32_t(a.controls.bias_tokens[lo + i])) << 32) | uint32_t(i) : ~uint64_t(0);
  __syncthreads();
  // Bitonic sort, ascending: by token, then by list position.
  for (int k = 2; k <= size; k <<= 1)
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < size; i += blockDim.x) {
        const int partner = i ^ j;
        if (partner > i) {
          const bool ascending = (i & k) == 0;
          const uint64_t x = entries[i], y = entries[partner];
          if ((x > y) == ascending) {
            entries[i] = y;
            entries[partner] = x;
          }
        }
      }
      __syncthreads();
    }
  if (threadIdx.x != 0) return;
  int32_t* tokens = a.bias_tokens + int64_t(r) * kMaxBiasEntries;
  float* values = a.bias_values + int64_t(r) * kMaxBiasEntries;
  int32_t count = 0;
  for (int i = 0; i < n; ++i) {
    const int32_t token = int32_t(entries[i] >> 32);
    const float value = a.controls.bias_values[lo + int32_t(uint32_t(entries[i]))];
    if (count > 0 && tokens[count - 1] == token) {
      values[count - 1] += value;
    } else {
      tokens[count] = token;
      values[count] = 0.0f + value;  // as the host sums: 0, then each entry in list order
      ++count;
    }
  }
  a.bias_counts[r] = count;
}

// ---- The fold of one slice of a chunk ------------------------------------

// The row's sorted bias entries [range[0], range[1]) that name tokens in
// [first, last), in the block's shared `range` (thread 0 searches).
__device__ void slice_bias_range(const RowSetup& r, int32_t first, int32_t last, int32_t* range) {
  if (threadIdx.x == 0) {
    range[0] = lower_bound(r.c.bias_tokens, r.c.bias_count, first);
    range[1] = lower_bound(r.c.bias_tokens, r.c.bias_count, last);
  }
  __syncthreads();
}

struct FoldArgs {
  Common common;
  const float* logits;  // [rows][chunk_ld]
  int32_t chunk_ld;
  int32_t v0;           // global id of the chunk's first token
  int32_t count;        // tokens in the chunk
  ControlPartial* partials;
  int32_t partial_stride;
  int32_t group_base;
};

__global__ void __launch_bounds__(kFoldThreads) fold_kernel(const FoldArgs a) {
  pdl_wait();  // launched dependent: may start before its predecessor ends
  const int row = blockIdx.y, s = blockIdx.x;
  const RowSetup r = row_setup(a.common, row);
  const int begin = s * kSliceTokens, end = min(a.count, begin + kSliceTokens);
  const float* l = a.logits + int64_t(row) * a.chunk_ld;

  __shared__ int32_t bias_range[2];
  __shared__ ControlPartial reduce[kFoldThreads];
  __shared__ uint32_t hist[256];
  __shared__ int32_t shared[4];
  slice_bias_range(r, a.v0 + begin, a.v0 + end, bias_range);
  const bool inert = r.plan.status != FLASHSPEC_OK;
  const int32_t blo = bias_range[0], bhi = bias_range[1];

  ControlPartial part = empty_control_partial();
  float raw[kTokensPerThread];
  uint64_t key[kTokensPerThread];
#pragma unroll
  for (int q = 0; q < kTokensPerThread / 4; ++q) {
    const int base = begin + (q * kFoldThreads + int(threadIdx.x)) * 4;
    const int32_t token0 = a.v0 + base;
    Philox4 noise = {{0, 0, 0, 0}};
    const bool sampled = !inert && !r.greedy && r.keep == 0 && base < end;
    if (sampled) {
      if ((token0 & 3) == 0) noise = row_block(r.plan.key, uint32_t(token0) >> 2);
      else
        for (int k = 0; k < 4; ++k) noise.v[k] = row_word(r.plan.key, token0 + k);
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int idx = q * 4 + k, i = base + k;
      raw[idx] = neg_inf();
      key[idx] = 0;
      if (inert || i >= end) continue;
      const int32_t token = token0 + k;
      const float lv = l[i];
      raw[idx] = lv;
      float x;
      if (fold_token(part, r, lv, token, blo, bhi, noise.v[k], &x)) key[idx] = rank_key(x, token);
    }
  }

  block_merge(reduce, part, merge_control_partial);
  if (threadIdx.x == 0) a.partials[int64_t(a.group_base + s) * a.partial_stride + row] = reduce[0];
  if (inert) return;

  const Common& c = a.common;
  if (r.keep > 0) {
    const Lists& list = c.candidates;
    const int64_t at = (int64_t(row) * c.slices + s) * list.capacity;
    select_into(RegisterKeys{key}, [&](int i) { return raw[i]; }, r.keep, list.thresholds[row],
                list.slice_keys + at, list.slice_raws + at, list.slice_counts + row * c.slices + s, hist, shared);
  }
  if (c.top_n > 0) {
#pragma unroll
    for (int i = 0; i < kTokensPerThread; ++i) {
      const int q = i / 4, k = i % 4;
      const int tok = begin + (q * kFoldThreads + int(threadIdx.x)) * 4 + k;
      key[i] = tok < end ? rank_key(raw[i], a.v0 + tok) : 0;
    }
    const Lists& list = c.tops;
    const int64_t at = (int64_t(row) * c.slices + s) * list.capacity;
    select_into(RegisterKeys{key}, [&](int i) { return raw[i]; }, c.top_n, list.thresholds[row],
                list.slice_keys + at, list.slice_raws + at, list.slice_counts + row * c.slices + s, hist, shared);
  }
}

// ---- The merge of a chunk's slice lists into each row's list -------------

struct MergeArgs {
  Common common;
  int32_t slices_in_chunk;
  int32_t from;  // merged list read (0 or 1); the other is written
  const Continuation* continuing;  // third pass: only continuing rows, candidates only; else NULL
};

__device__ void merge_list(const Lists& list, int row, int slices, int slices_in_chunk, int from, int keep,
                           uint32_t* hist, int32_t* shared, int32_t* counts, int32_t* starts) {
  const int to = 1 - from;
  const int64_t merged_from = (int64_t(from) * gridDim.x + row) * list.capacity;
  const int64_t merged_to = (int64_t(to) * gridDim.x + row) * list.capacity;
  const int32_t merged_count = list.merged_counts[from * gridDim.x + row];
  if (int(threadIdx.x) < slices_in_chunk) counts[threadIdx.x] = list.slice_counts[row * slices + threadIdx.x];
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t running = merged_count;
    for (int s = 0; s < slices_in_chunk; ++s) {
      starts[s] = running;
      running += counts[s];
    }
    shared[0] = running;
  }
  __syncthreads();
  const int total = shared[0];
  __syncthreads();
  const uint64_t* slice_keys = list.slice_keys + int64_t(row) * slices * list.capacity;
  const float* slice_raws = list.slice_raws + int64_t(row) * slices * list.capacity;
  const ListKeys listed{list.merged_keys + merged_from, merged_count, slice_keys, counts, starts, slices_in_chunk,
                        list.capacity, total};
  CachedKeys keys;
#pragma unroll
  for (int i = 0; i < kMergeKeysPerThread; ++i) keys.k[i] = listed.key(i);
  const float* merged_raws = list.merged_raws + merged_from;
  auto raw_of = [&](int i) {
    const int index = i * int(blockDim.x) + int(threadIdx.x);
    if (index < merged_count) return merged_raws[index];
    int s = 0;
    while (s + 1 < slices_in_chunk && index >= starts[s + 1]) ++s;
    return slice_raws[int64_t(s) * list.capacity + (index - starts[s])];
  };
  const int written = select_into(keys, raw_of, keep, 0, list.merged_keys + merged_to, list.merged_raws + merged_to,
                                  list.merged_counts + to * gridDim.x + row, hist, shared);
  // The keep-th best key so far bounds every later slice's candidates.
  __shared__ unsigned long long least;
  if (threadIdx.x == 0) least = ~0ull;
  __syncthreads();
  if (written == keep)
    for (int i = threadIdx.x; i < written; i += blockDim.x) atomicMin(&least, list.merged_keys[merged_to + i]);
  __syncthreads();
  if (threadIdx.x == 0) list.thresholds[row] = written == keep ? least : 0;
  __syncthreads();
}

__global__ void __launch_bounds__(kRowThreads) merge_kernel(const MergeArgs a) {
  pdl_wait();  // launched dependent: may start before its predecessor ends
  const int row = blockIdx.x;
  const RowSetup r = row_setup(a.common, row);
  if (r.plan.status != FLASHSPEC_OK) return;
  if (a.continuing && !a.continuing[row].active) return;
  __shared__ uint32_t hist[256];
  __shared__ int32_t shared[4];
  __shared__ int32_t counts[64], starts[64];
  if (r.keep > 0)
    merge_list(a.common.candidates, row, a.common.slices, a.slices_in_chunk, a.from, r.keep, hist, shared, counts,
               starts);
  if (a.common.top_n > 0 && !a.continuing)
    merge_list(a.common.tops, row, a.common.slices, a.slices_in_chunk, a.from, a.common.top_n, hist, shared, counts,
               starts);
}

// ---- The second and third passes of continuing rows -----------------------

struct PassArgs {
  Common common;
  const float* logits;  // [rows][chunk_ld]
  int32_t chunk_ld;
  int32_t v0;
  int32_t count;
  Continuation* continuing;  // [rows]
  uint64_t* histograms;      // [rows][kMassBins]
  BandPartial* band;         // [groups][band_stride]
  int32_t band_stride;
  int32_t group_base;
};

// The tokens of a continuing row that its kept set may still take: allowed,
// ranked after its list, and kept by min-p. Calls take(i, token, x, raw,
// e = e^(x − x0)) for each of the slice's tokens, in increasing order per
// thread (thread t takes tokens t, t + blockDim, ...).
template <class Take>
__device__ void continuing_tokens(const PassArgs& a, const RowSetup& r, const Continuation& k, int begin, int end,
                                  int32_t blo, int32_t bhi, Take take) {
  const float* l = a.logits + int64_t(blockIdx.y) * a.chunk_ld;
#pragma unroll
  for (int q = 0; q < kTokensPerThread; ++q) {
    const int i = begin + q * kFoldThreads + int(threadIdx.x);
    if (i >= end) continue;
    const int32_t token = a.v0 + i;
    if (!token_allowed(r.c, token)) continue;
    const float lv = l[i];
    const float x = controlled_x(r, lv, token, blo, bhi);
    if (rank_key(x, token) >= k.last_key) continue;  // in the list: kept already
    const float e = expf(x - k.x0);
    if (k.min_p > 0.0f && e < k.min_p) continue;  // min-p's cut, as kept_count applies it
    take(q, token, x, lv, e);
  }
}

// Second pass: each continuing row with a top-p target sums its remaining
// tokens' fixed-point mass per bin.
__global__ void __launch_bounds__(kFoldThreads) mass_histogram_kernel(const PassArgs a) {
  pdl_wait();
  const int row = blockIdx.y, s = blockIdx.x;
  const Continuation k = a.continuing[row];
  if (!k.active || !(k.target < INFINITY)) return;
  const RowSetup r = row_setup(a.common, row);
  const int begin = s * kSliceTokens, end = min(a.count, begin + kSliceTokens);
  __shared__ unsigned long long hist[kMassBins];
  __shared__ int32_t bias_range[2];
  for (int b = threadIdx.x; b < kMassBins; b += blockDim.x) hist[b] = 0;
  slice_bias_range(r, a.v0 + begin, a.v0 + end, bias_range);
  continuing_tokens(a, r, k, begin, end, bias_range[0], bias_range[1],
                    [&](int, int32_t, float x, float, float e) { atomicAdd(&hist[mass_bin(x, k.x0)], fixed_mass(e)); });
  __syncthreads();
  unsigned long long* out = reinterpret_cast<unsigned long long*>(a.histograms) + int64_t(row) * kMassBins;
  for (int b = threadIdx.x; b < kMassBins; b += blockDim.x)
    if (hist[b]) atomicAdd(out + b, hist[b]);
}

// After the second pass: the first bin at whose end the cumulative mass (the
// list's, then the bins' in order) reaches the target. One warp per row.
__global__ void crossing_kernel(Continuation* continuing, const uint64_t* histograms) {
  pdl_wait();
  const int row = blockIdx.x, lane = int(threadIdx.x);
  const Continuation k = continuing[row];
  if (!k.active) return;
  int32_t bin = -1;
  if (k.target < INFINITY) {
    constexpr int kPerLane = kMassBins / 32;
    const uint64_t* h = histograms + int64_t(row) * kMassBins + lane * kPerLane;
    uint64_t local = 0;
    for (int b = 0; b < kPerLane; ++b) local += h[b];
    uint64_t inclusive = local;
    for (int offset = 1; offset < 32; offset <<= 1) {
      const uint64_t v = __shfl_up_sync(0xffffffffu, inclusive, offset);
      if (lane >= offset) inclusive += v;
    }
    const double target = double(k.target);
    const unsigned reached = __ballot_sync(0xffffffffu, double(k.list_mass) + double(inclusive) / kMassUnit >= target);
    if (reached) {
      const int first = __ffs(reached) - 1;
      if (lane == first) {
        uint64_t cumulative = inclusive - local;
        for (int b = 0; b < kPerLane; ++b) {
          cumulative += h[b];
          if (double(k.list_mass) + double(cumulative) / kMassUnit >= target) {
            bin = lane * kPerLane + b;
            break;
          }
        }
      }
      bin = __shfl_sync(0xffffffffu, bin, first);
    }
  }
  if (lane == 0) continuing[row].bin = bin;
}

// Third pass: the tokens above the crossing bin are kept (their mass, Σ
// e^(x − x0)·x and Gumbel-max fold here); the bin's tokens become candidates.
__global__ void __launch_bounds__(kFoldThreads) band_kernel(const PassArgs a) {
  pdl_wait();
  const int row = blockIdx.y, s = blockIdx.x;
  const Common& c = a.common;
  const Lists& list = c.candidates;
  const Continuation k = a.continuing[row];
  if (!k.active) return;
  const RowSetup r = row_setup(c, row);
  const int begin = s * kSliceTokens, end = min(a.count, begin + kSliceTokens);
  __shared__ int32_t bias_range[2];
  __shared__ BandPartial reduce[kFoldThreads];
  __shared__ uint32_t hist[256];
  __shared__ int32_t shared[4];
  slice_bias_range(r, a.v0 + begin, a.v0 + end, bias_range);
  BandPartial part = empty_band_partial();
  uint64_t key[kTokensPerThread];
  float raw[kTokensPerThread];
#pragma unroll
  for (int q = 0; q < kTokensPerThread; ++q) {
    key[q] = 0;
    raw[q] = neg_inf();
  }
  continuing_tokens(a, r, k, begin, end, bias_range[0], bias_range[1],
                    [&](int q, int32_t token, float x, float lv, float e) {
                      const int b = mass_bin(x, k.x0);
                      if (k.bin >= 0 && b > k.bin) return;  // beyond the cut
                      if (k.bin >= 0 && b == k.bin) {       // the cut lies among these
                        key[q] = rank_key(x, token);
                        raw[q] = lv;
                        ++part.bin_count;
                        return;
                      }
                      part.mass += e;
                      part.weighted += e * x;
                      if (!is_offered(r.plan, token)) return;
                      offer_sample(part, x + gumbel_from_bits(row_word(r.plan.key, token)), x, lv, token);
                    });
  block_merge(reduce, part, merge_band_partial);
  if (threadIdx.x == 0) a.band[int64_t(a.group_base + s) * a.band_stride + row] = reduce[0];
  const int64_t at = (int64_t(row) * c.slices + s) * list.capacity;
  select_into(RegisterKeys{key}, [&](int i) { return raw[i]; }, kCandidates, list.thresholds[row],
              list.slice_keys + at, list.slice_raws + at, list.slice_counts + row * c.slices + s, hist, shared);
}

// ---- The controlled weight-streaming scan (≤ 16 rows) ---------------------
//
// One kernel reads W once, as the plain verify's scan does (stream_tiles.cuh),
// and keeps its CTA's logits [rows][cta_tokens] in shared memory instead of
// writing them out. When the CTA's warps are done they fold its range as
// fold_kernel folds a slice (one ControlPartial per CTA and row; a row's
// range split over several warps when there are fewer rows than warps) and,
// in the same pass over the logits, find the two real keys per row
// (candidates and raw logits) the CTA publishes; then it waits at a
// grid-wide barrier. The keep-th largest published key bounds the row's
// keep-th best candidate from below, so the CTA appends to the row's flat
// list only its candidates at or above it (at most keep). After a second
// grid barrier CTA b finishes rows b, b + grid, ...: it ranks the row's list,
// folds the CTAs' partials and writes the row's summary as the summary
// kernel does after the cuBLAS chunks (one summarize_row), in the shared
// memory the logits held, so no kernel follows the scan.

// What the summary of a row reads and writes (summary_kernel, and the
// controlled streaming scan's finish).
struct SummaryArgs {
  Common common;
  const ControlPartial* partials;
  int32_t partial_stride;
  int32_t groups;
  int32_t final_list;  // merged candidate list holding the last chunk's merge
  int32_t tops_list;   // merged top-logits list holding the first pass's last merge
  const int32_t* hidden_bad;
  Outputs out;
  // First pass (continued = 0): rows whose kept set runs past their list
  // write their Continuation, set *continue_flag and no output yet. After
  // the third pass (continued = 1) only those rows run: their candidates are
  // the crossing bin's tokens, `band` the kept tokens above it.
  int32_t continued;
  Continuation* continuing;
  int32_t* continue_flag;
  const BandPartial* band;
  int32_t band_stride;
  int32_t band_groups;
};

struct FusedArgs {
  ScanParams scan;            // W, the staged hidden rows, vocab, rows (row_base 0)
  SummaryArgs summary;        // the rows' controls (summary.common) and where their summaries go
  ControlPartial* merged;     // [rows]: each row's folded partial, for the later passes of a continuing row
  int32_t cta_tokens;         // shared-memory logits per row (the largest CTA range)
  ControlPartial* partials;   // [groups][rows]
  uint64_t* keys;             // candidates: [rows][capacity], appended
  float* raws;
  int32_t* counts;            // [rows]
  int32_t capacity;
  uint64_t* top_keys;         // top raw logits: [rows][top_capacity], appended
  float* top_raws;
  int32_t* top_counts;
  int32_t top_capacity;
  uint64_t* slots;            // [rows][groups][2]: each CTA's two best candidate keys of a row
  uint64_t* top_slots;        // the same for the top raw logits
};

__device__ __forceinline__ int warp_sum(int v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

constexpr int kSelectBuffer = 128;  // a warp's compacted candidates (keys) in shared memory
constexpr int kBoundKeep = 64;      // the largest keep a bound from lanes' best two keys serves

// The keep-th largest of the 64 keys the lanes hold (two each, distinct; 0:
// none), on every lane; 0 when keep > 64 or fewer than keep are there.
__device__ uint64_t kth_of_lane_pairs(uint64_t first, uint64_t second, int keep) {
  if (keep > kBoundKeep) return 0;
  int rank_first = 0, rank_second = 0;
#pragma unroll 2
  for (int source = 0; source < 32; ++source) {
    const uint64_t a = __shfl_sync(0xffffffffu, first, source), b = __shfl_sync(0xffffffffu, second, source);
    rank_first += (a > first) + (b > first);
    rank_second += (a > second) + (b > second);
  }
  const bool first_is = first != 0 && rank_first == keep - 1, second_is = second != 0 && rank_second == keep - 1;
  const unsigned holders = __ballot_sync(0xffffffffu, first_is || second_is);
  if (!holders) return 0;
  const int holder = __ffs(holders) - 1;
  const uint64_t mine = first_is ? first : second;
  return __shfl_sync(0xffffffffu, mine, holder);
}

// The warp's best `keep` of n items by key (distinct 64-bit keys, larger
// first; 0: absent): key(i) gives item i's. Lane 0 reserves their count
// with reserve(count) (its result, a base, is broadcast); then
// emit(i, key, base + slot) runs for each, slots 0, 1, ... in no particular
// order. `buffer` and `items` hold kSelectBuffer keys and item indices.
//
// Usually few items have a key (the caller's bound cut the rest): one pass
// compacts them, with their indices, and ranks them against each other.
// When more than kSelectBuffer have one, a lower bound of the keep-th key
// comes cheaply from the lanes' own best two keys (keep ≤ 64): the keep-th
// largest of those 64 keys has at least keep keys at or above it. The keys
// at or above it, usually not many more than keep, are compacted and
// ranked the same way; more than kSelectBuffer of them are cut by bisection
// on the keys instead.
template <class Key, class Reserve, class Emit>
__device__ void warp_select(int n, int keep, Key key, uint64_t* buffer, int32_t* items, Reserve reserve, Emit emit) {
  const int lane = threadIdx.x & 31;
  const unsigned below = (1u << lane) - 1u;
  {
    int filled = 0;
    bool fits = true;
    // Lane L reads items 4L .. 4L + 3 of each 128; a block of 128 with no
    // key on any lane (the usual case) costs one vote.
    for (int start = 0; start < n && fits; start += 128) {
      uint64_t k[4];
      bool any = false;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int i = start + 4 * lane + q;
        k[q] = i < n ? key(i) : 0;
        any |= k[q] != 0;
      }
      if (!__any_sync(0xffffffffu, any)) continue;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const unsigned has = __ballot_sync(0xffffffffu, k[q] != 0);
        if (filled + __popc(has) > kSelectBuffer) {
          fits = false;  // the same on every lane
          break;
        }
        if (k[q]) {
          buffer[filled + __popc(has & below)] = k[q];
          items[filled + __popc(has & below)] = start + 4 * lane + q;
        }
        filled += __popc(has);
      }
    }
    __syncwarp();
    if (fits) {
      const int total = min(filled, keep);
      int base = 0;
      if (lane == 0 && total > 0) base = reserve(total);
      base = __shfl_sync(0xffffffffu, base, 0);
      int slot = base;
      for (int start = 0; start < filled; start += 32) {
        const int j = start + lane;
        const uint64_t mine = j < filled ? buffer[j] : 0;
        int rank = 0;
        if (j < filled && filled > keep)
          for (int m = 0; m < filled; ++m) rank += buffer[m] > mine;
        const bool taken = j < filled && rank < keep;
        const unsigned takers = __ballot_sync(0xffffffffu, taken);
        if (taken) emit(items[j], mine, slot + __popc(takers & below));
        slot += __popc(takers);
      }
      __syncwarp();  // the buffers are read before the warp's next selection writes them
      return;
    }
  }
  uint64_t hi = 0, lo = ~uint64_t(0), first = 0, second = 0;
  int present = 0;
  for (int i = lane; i < n; i += 32) {
    const uint64_t k = key(i);
    if (!k) continue;
    ++present;
    hi = max(hi, k);
    lo = min(lo, k);
    if (k > first) {
      second = first;
      first = k;
    } else if (k > second) {
      second = k;
    }
  }
  present = warp_sum(present);
  for (int offset = 16; offset > 0; offset >>= 1) {
    hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, offset));
    lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, offset));
  }
  // The lanes' best two keys are real keys: the keep-th largest of them has
  // at least keep keys at or above it.
  const uint64_t bound = present > keep ? kth_of_lane_pairs(first, second, keep) : 0;
  const int total = min(present, keep);
  int base = 0;
  if (lane == 0 && total > 0) base = reserve(total);
  base = __shfl_sync(0xffffffffu, base, 0);
  if (total == 0) return;
  // Every key at or above `cut` is taken (exactly `total` of them).
  uint64_t cut = lo;
  if (present > keep) {
    const uint64_t floor = bound ? bound : lo;
    int above = 0;
    for (int i = lane; i < n; i += 32) above += key(i) >= floor;
    above = warp_sum(above);
    if (above <= kSelectBuffer) {
      // Compact the keys at or above the floor, then rank each against the others.
      int filled = 0;
      for (int start = 0; start < n; start += 32) {
        const int i = start + lane;
        const uint64_t k = i < n ? key(i) : 0;
        const bool in = k != 0 && k >= floor;
        const unsigned ins = __ballot_sync(0xffffffffu, in);
        if (in) buffer[filled + __popc(ins & below)] = k;
        filled += __popc(ins);
      }
      __syncwarp();
      uint64_t least = ~uint64_t(0);  // the smallest key ranked within keep
      for (int j = lane; j < filled; j += 32) {
        const uint64_t mine = buffer[j];
        int rank = 0;
        for (int i = 0; i < filled; ++i) rank += buffer[i] > mine;
        if (rank < keep) least = min(least, mine);
      }
      for (int offset = 16; offset > 0; offset >>= 1) least = min(least, __shfl_xor_sync(0xffffffffu, least, offset));
      __syncwarp();  // the buffer is read before the warp's next selection writes it
      cut = least;
    } else {
      // The largest v with at least keep keys ≥ v, by bisection below the
      // bits hi and the floor share.
      const uint64_t differ = hi ^ floor;
      const int top = differ ? 63 - __clzll(differ) : -1;
      uint64_t v = top < 0 ? hi : top == 63 ? 0 : hi & ~((uint64_t(2) << top) - 1);
      for (int bit = top; bit >= 0; --bit) {
        const uint64_t trial = v | (uint64_t(1) << bit);
        int count = 0;
        for (int i = lane; i < n; i += 32) count += key(i) >= trial;
        if (warp_sum(count) >= keep) v = trial;
      }
      cut = v;
    }
  }
  int slot = base;
  for (int start = 0; start < n; start += 32) {
    const int i = start + lane;
    const uint64_t k = i < n ? key(i) : 0;
    const bool taken = k != 0 && k >= cut;
    const unsigned takers = __ballot_sync(0xffffffffu, taken);
    if (taken) emit(i, k, slot + __popc(takers & below));
    slot += __popc(takers);
  }
}

// What a warp reports of its part of a row: the two largest candidate keys
// and raw-logit keys of a few of its tokens (published before the folds),
// then its ControlPartial.
struct PartFold {
  ControlPartial part;
  uint64_t best, next;          // candidates (x)
  uint64_t raw_best, raw_next;  // top raw logits
};

__device__ void insert_top2(uint64_t k, uint64_t& best, uint64_t& next) {
  if (k > best) {
    next = best;
    best = k;
  } else if (k > next) {
    next = k;
  }
}

// The two largest of every lane's (best, next), on every lane.
__device__ void warp_top2(uint64_t& best, uint64_t& next) {
#pragma unroll 1
  for (int offset = 16; offset > 0; offset >>= 1) {
    const uint64_t b = __shfl_xor_sync(0xffffffffu, best, offset), n = __shfl_xor_sync(0xffffffffu, next, offset);
    const uint64_t hi = max(best, b);
    next = max(min(best, b), max(next, n));
    best = hi;
  }
}

// The keys a part publishes: its two candidate keys, in order again (a bias
// or the scale by 1/T may reorder what the raw logits ranked), and its two
// best raw keys.
__device__ void publish(PartFold& f, uint64_t candidate_a, uint64_t candidate_b, uint64_t raw_best,
                        uint64_t raw_next) {
  f.best = max(candidate_a, candidate_b);
  f.next = min(candidate_a, candidate_b);
  f.raw_best = raw_best;
  f.raw_next = raw_next;
}

// Logits l[base .. base + 4) of a range ending at `end` (base a multiple of
// 4; l 16-byte aligned); a token at or past end reads as 0.
__device__ __forceinline__ void load_four(const float* l, int base, int end, float* lv) {
  if (base + 4 <= end) {
    const float4 four = *reinterpret_cast<const float4*>(l + base);
    lv[0] = four.x;
    lv[1] = four.y;
    lv[2] = four.z;
    lv[3] = four.w;
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) lv[k] = base + k < end ? l[base + k] : 0.0f;
  }
}

// fold_and_pick for a truncated row whose every token in the part is a
// candidate with x = l · scale (no mask, no bias entry in the part): the
// first pass finds the warp's largest and second-largest logit, the second
// sums against the largest and forms keys only for logits at or above the
// second (every lane compares with the same floor, so the warp rarely
// diverges). The lanes' sums meet in lane 0 in a fixed order.
__device__ PartFold fold_and_pick_unmasked(const RowSetup& r, const float* l, int32_t v0, int begin, int end,
                                           float scale) {
  const int lane = threadIdx.x & 31;
  float high = neg_inf(), second = neg_inf(), low = INFINITY, non_finite = 0.0f;  // l · 0: NaN for a non-finite l
  for (int base = begin + lane * 4; base < end; base += 128) {
    float lv[4];
    load_four(l, base, end, lv);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (base + k >= end) break;
      second = fmaxf(second, fminf(high, lv[k]));
      high = fmaxf(high, lv[k]);
      low = fminf(low, lv[k]);
      non_finite += lv[k] * 0.0f;
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other_high = __shfl_xor_sync(0xffffffffu, high, offset);
    const float other_second = __shfl_xor_sync(0xffffffffu, second, offset);
    second = fmaxf(fmaxf(second, other_second), fminf(high, other_high));
    high = fmaxf(high, other_high);
    low = fminf(low, __shfl_xor_sync(0xffffffffu, low, offset));
  }
  const float raw_max = high, x_max = raw_max * scale;
  const bool weighted = !r.greedy;
  float raw_sum = 0.0f, sum = 0.0f, weighted_sum = 0.0f;
  uint64_t best = 0, next = 0;
  for (int base = begin + lane * 4; base < end && raw_max != neg_inf(); base += 128) {
    float lv[4];
    load_four(l, base, end, lv);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (base + k >= end) break;
      raw_sum += expf(lv[k] - raw_max);
      if (weighted) {
        const float x = lv[k] * scale;
        const float e = expf(x - x_max);
        sum += e;
        weighted_sum += e * x;
      }
      if (lv[k] >= second) insert_top2(rank_key(lv[k], v0 + base + k), best, next);
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    raw_sum += __shfl_down_sync(0xffffffffu, raw_sum, offset);
    sum += __shfl_down_sync(0xffffffffu, sum, offset);
    weighted_sum += __shfl_down_sync(0xffffffffu, weighted_sum, offset);
  }
  warp_top2(best, next);
  PartFold f;
  ControlPartial& part = f.part;
  part = empty_control_partial();
  if (begin < end) {
    part.rm = raw_max;
    part.rs = raw_sum;
    if (weighted) {
      part.m = x_max;
      part.s = sum;
      part.w = weighted_sum;
    }
    part.allowed = end - begin;
    if (__any_sync(0xffffffffu, non_finite != 0.0f)) part.flags |= kPartialNonFinite;  // NaN != 0
    else if (!is_finite(x_max) || !is_finite(low * scale)) part.flags |= kPartialScaleOverflow;
    const int tracked = r.plan.tracked - (v0 + begin);
    if (tracked >= 0 && tracked < end - begin) {
      part.tracked_raw = l[begin + tracked];
      part.tracked_x = part.tracked_raw * scale;
      part.flags |= kPartialTracked;
    }
  }
  // Every token is a candidate: the best two keys of x are those of the
  // logits.
  auto as_candidate = [&](uint64_t raw_key) {
    if (!raw_key) return uint64_t(0);
    const float x = key_x(raw_key) * scale;
    return is_finite(x) ? rank_key(x, key_token(raw_key)) : uint64_t(0);
  };
  publish(f, as_candidate(best), as_candidate(next), best, next);
  return f;
}

// A warp's part [begin, end) of a row of the CTA's range (begin a multiple
// of 4; the range starts at v0, a multiple of 16), in two passes over its
// logits: its fold (lane 0 returns the ControlPartial, lanes merged in a
// fixed order), and the keys the CTA publishes before the grid's barrier,
// on every lane: the two largest raw logits of all its tokens (tops) and of
// its allowed ones, turned into candidate keys (real keys of allowed
// tokens, though with a bias not always the part's largest x).
//
// The first pass applies fold_token_rules and finds the part's largest raw
// logit and x (and the counts, flags, keys and a sample); the second sums
// e^(l − max) and e^(x − max) against them, so no token rescales a running
// sum and no lane's branches diverge on whether a token raised the maximum.
// The part's log-sum-exps are those of the online fold up to rounding.
__device__ PartFold fold_and_pick(const RowSetup& r, const float* l, int32_t v0, int begin, int end) {
  const int lane = threadIdx.x & 31;
  const bool inert = r.plan.status != FLASHSPEC_OK;
  int32_t blo = 0, bhi = 0;
  if (!inert && r.c.bias_count > 0) {
    if (lane == 0) {
      blo = lower_bound(r.c.bias_tokens, r.c.bias_count, v0 + begin);
      bhi = lower_bound(r.c.bias_tokens, r.c.bias_count, v0 + end);
    }
    blo = __shfl_sync(0xffffffffu, blo, 0);
    bhi = __shfl_sync(0xffffffffu, bhi, 0);
  }
  PartFold f;
  ControlPartial& part = f.part;
  part = empty_control_partial();
  uint64_t any_best = 0, any_next = 0, allowed_best = 0, allowed_next = 0;
  const bool offers = !inert && r.keep == 0;  // the row's sample comes from the fold
  const bool sampled = offers && !r.greedy;
  const float scale = r.greedy ? 1.0f : r.plan.inv_t;  // x = l · scale where no bias entry names the token
  if (!inert && !offers && !r.c.mask && bhi == blo) return fold_and_pick_unmasked(r, l, v0, begin, end, scale);
  // Lane L takes the blocks of four tokens begin + 4L, + 128, ... (a
  // Philox block each).
  auto four_logits = [&](int base, float* lv) { load_four(l, base, end, lv); };
  float raw_max = neg_inf(), x_max = neg_inf();
  for (int base = begin + lane * 4; base < end && !inert; base += 128) {
    const int32_t token0 = v0 + base;
    Philox4 noise = {{0, 0, 0, 0}};
    if (sampled) noise = row_block(r.plan.key, uint32_t(token0) >> 2);
    float lv[4];
    four_logits(base, lv);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (base + k >= end) break;
      const int32_t token = token0 + k;
      const uint64_t key = rank_key(lv[k], token);
      float x;
      fold_token_rules(
          part, r, lv[k], token, blo, bhi, offers, noise.v[k], &x,
          [&](float l) {
            raw_max = fmaxf(raw_max, l);
            insert_top2(key, any_best, any_next);
          },
          [&](float x_allowed) {
            x_max = fmaxf(x_max, x_allowed);
            insert_top2(key, allowed_best, allowed_next);
          });
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    raw_max = fmaxf(raw_max, __shfl_xor_sync(0xffffffffu, raw_max, offset));
    x_max = fmaxf(x_max, __shfl_xor_sync(0xffffffffu, x_max, offset));
  }
  // Every lane of the warp sums against the same maxima, so the lanes'
  // merge below adds their sums (each scale is e^0).
  const bool weighted = !r.greedy && x_max != neg_inf();
  const bool every_x = !r.c.mask && bhi == blo;
  float raw_sum = 0.0f, sum = 0.0f, weighted_sum = 0.0f;
  for (int base = begin + lane * 4; base < end && !inert && raw_max != neg_inf(); base += 128) {
    const int32_t token0 = v0 + base;
    float lv[4];
    four_logits(base, lv);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (base + k >= end) break;
      raw_sum += expf(lv[k] - raw_max);
      if (!weighted || (!every_x && !token_allowed(r.c, token0 + k))) continue;
      const float x = every_x ? lv[k] * scale : controlled_x(r, lv[k], token0 + k, blo, bhi);
      const float e = expf(x - x_max);
      sum += e;
      weighted_sum += e * x;
    }
  }
  part.rm = raw_max;
  part.rs = raw_sum;
  if (weighted) {
    part.m = x_max;
    part.s = sum;
    part.w = weighted_sum;
  }
  warp_merge_control_partial(part);
  auto as_candidate = [&](uint64_t raw_key) {
    if (!raw_key) return uint64_t(0);
    const int32_t token = key_token(raw_key);
    const float x = controlled_x(r, key_x(raw_key), token, 0, r.c.bias_count);
    return is_finite(x) ? rank_key(x, token) : uint64_t(0);
  };
  publish(f, as_candidate(allowed_best), as_candidate(allowed_next), any_best, any_next);
  warp_top2(f.best, f.next);
  warp_top2(f.raw_best, f.raw_next);
  return f;
}

// A lower bound of a row's keep-th key over the whole vocabulary from the
// keys the CTAs published (two each, 0 where a CTA's range had none): the
// keep-th largest of the lanes' two largest published keys, 0 when keep >
// 64 or fewer than keep keys are there. Any published key is a
// real token's, so at least keep keys lie at or above it; every CTA may
// drop its keys below it.
__device__ uint64_t published_bound(const uint64_t* slots, int count, int keep) {
  if (keep > kBoundKeep) return 0;
  // Eight loads in flight per lane: the slots were written by other CTAs
  // just before the barrier, so each is a trip to L2.
  constexpr int kLoads = 8;
  uint64_t best = 0, next = 0;
  for (int i = threadIdx.x & 31; i < count; i += 32 * kLoads) {
    uint64_t keys[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) keys[u] = i + 32 * u < count ? __ldcg(slots + i + 32 * u) : 0;
#pragma unroll
    for (int u = 0; u < kLoads; ++u) insert_top2(keys[u], best, next);
  }
  return kth_of_lane_pairs(best, next, keep);
}

// The CTA's tail for one row, by the row's `warps` warps (this one is
// part_index of them) after they folded their parts (parts[0 .. warps) in
// token order): three jobs, job j by warp j mod warps: the candidates (0)
// and the top raw logits (1) the bound from the keys every CTA published
// does not rule out, at most keep of them, appended to the row's lists,
// and the CTA's partial (2).
__device__ void finish_row(const FusedArgs& a, const RowSetup& r, int row, const PartFold* parts, int warps,
                           int part_index, const float* l, uint64_t* buffer, int32_t* items, int32_t v0, int n) {
  const Common& c = a.summary.common;
  const int lane = threadIdx.x & 31;
  auto mine = [&](int job) { return job % warps == part_index; };
  if (mine(2) && lane == 0) {
    ControlPartial part = parts[0].part;
    for (int w = 1; w < warps; ++w) merge_control_partial(part, parts[w].part);
    a.partials[int64_t(blockIdx.x) * c.rows + row] = part;
  }
  if (r.plan.status != FLASHSPEC_OK) return;
  // A token's key is rank_key(x_of(i), token) (x_of: NaN for a token that
  // is not a candidate); a float compare with the bound's x rules out the
  // most of them before their keys are formed.
  auto select = [&](int keep, auto x_of, const uint64_t* slots, uint64_t* keys, float* raws, int32_t* count,
                    int32_t capacity) {
    const uint64_t bound = published_bound(slots, 2 * int(gridDim.x), keep);
    const float bound_x = bound ? key_x(bound) : neg_inf();
    warp_select(
        n, keep,
        [&](int i) {
          const float x = x_of(i);
          if (!(x >= bound_x)) return uint64_t(0);
          const uint64_t k = rank_key(x, v0 + i);
          return k >= bound ? k : uint64_t(0);
        },
        buffer, items, [&](int total) { return atomicAdd(count, total); },
        [&](int i, uint64_t key, int at) {
          if (at < capacity) {
            keys[at] = key;
            raws[at] = l[i];
          }
        });
  };
  const int64_t slot_row = int64_t(row) * gridDim.x * 2;
  if (mine(0) && r.keep > 0) {
    // A candidate's x, as the folds compute it (allowed tokens only).
    int32_t blo = 0, bhi = 0;
    if (r.c.bias_count > 0) {
      if (lane == 0) {
        blo = lower_bound(r.c.bias_tokens, r.c.bias_count, v0);
        bhi = lower_bound(r.c.bias_tokens, r.c.bias_count, v0 + n);
      }
      blo = __shfl_sync(0xffffffffu, blo, 0);
      bhi = __shfl_sync(0xffffffffu, bhi, 0);
    }
    uint64_t* keys = a.keys + int64_t(row) * a.capacity;
    float* raws = a.raws + int64_t(row) * a.capacity;
    if (!r.c.mask && bhi == blo) {
      const float scale = r.greedy ? 1.0f : r.plan.inv_t;
      select(r.keep, [&](int i) { return l[i] * scale; }, a.slots + slot_row, keys, raws, a.counts + row,
             a.capacity);
    } else {
      select(
          r.keep,
          [&](int i) {
            const int32_t token = v0 + i;
            return token_allowed(r.c, token) ? controlled_x(r, l[i], token, blo, bhi) : NAN;
          },
          a.slots + slot_row, keys, raws, a.counts + row, a.capacity);
    }
  }
  if (mine(1) && c.top_n > 0)
    select(c.top_n, [&](int i) { return l[i]; }, a.top_slots + slot_row,
           a.top_keys + int64_t(row) * a.top_capacity, a.top_raws + int64_t(row) * a.top_capacity,
           a.top_counts + row, a.top_capacity);
}


// The logits of a chunk of W's rows [rows][ld], as the controlled streaming
// scan computes them: a continuing row's later passes must see the very
// values its first pass ranked (cuBLAS sums in another order).
template <flashspec_dtype kW, int kShape>
__global__ void __launch_bounds__(stream::kThreads, tuning::stream_shape(is_codes(kW), kShape).min_blocks)
    stream_logits_kernel(const ScanParams p, float* out, int32_t ld) {
  constexpr int kNT = tuning::stream_shape(is_codes(kW), kShape).row_groups;
  const stream::WarpRun run = stream::warp_run(p.vocab);
  stream::prefetch_run_start<kW>(p, run);
  pdl_wait();
  pdl_trigger();
  stream::stream_tiles<kW, kShape>(p, run.first_tile, run.tiles, [](int) {}, [&](int tok_a, auto&& logit) {
    stream::each_logit<kNT>(p, tok_a, logit, [&](int row, int token, float l) { out[int64_t(row) * ld + token] = l; });
  });
}

struct StreamLogits {
  template <flashspec_dtype kW, int kShape>
  static const void* of() {
    return reinterpret_cast<const void*>(&stream_logits_kernel<kW, kShape>);
  }
};

const void* logits_kernel(int shape, flashspec_dtype w_dtype) {
  return stream::kernel_for<StreamLogits>(shape, w_dtype);
}

// A row's flat list in global memory, read round by round by a block.
struct FlatKeys {
  const uint64_t* keys;
  int32_t count;
  int32_t rounds_;
  __device__ int rounds() const { return rounds_; }
  __device__ uint64_t key(int i) const {
    const int index = i * int(blockDim.x) + int(threadIdx.x);
    return index < count ? keys[index] : 0;
  }
};

// The same, loaded once into registers (at most blockDim.x * kFlatCached keys).
constexpr int kFlatCached = 16;
struct CachedFlatKeys {
  uint64_t k[kFlatCached];
  __device__ static constexpr int rounds() { return kFlatCached; }
  __device__ uint64_t key(int i) const { return k[i]; }
};

// A CTA's shared memory while it merges a row's lists and partials.
struct MergeShared {
  ControlPartial reduce[stream::kWarps];
  float maxima[2][stream::kWarps];
  uint64_t staged[stream::kThreads];
  uint32_t hist[256];
  int32_t shared[4];
};

// Where the scan's finish hands summarize_row a candidate list it already
// ranked (SummaryShared's ranked keys and order; count −1: none handed).
struct RankedHandoff {
  uint64_t* ranked;
  int16_t* order;
  int32_t* count;
};

// The first half of the scan's finish of one row, by a whole CTA after the
// second grid barrier: the CTAs' partials folded in a fixed order into
// *merged (and a.merged[row]), and the row's flat lists cut to its best keep
// candidates and top_n raw logits: merged list 0 of each. A short candidate
// list is written in rank order and handed over ranked as well. An inert
// row reads nothing (*merged: empty).
__device__ void merge_row(const FusedArgs& a, const RowSetup& r, int row, MergeShared& sh, ControlPartial* merged,
                          const RankedHandoff& handoff) {
  constexpr int kThreads = stream::kThreads;
  const Common& c = a.summary.common;
  const int t = int(threadIdx.x), warp = t >> 5, lane = t & 31;
  if (t == 0) *handoff.count = -1;
  if (r.plan.status != FLASHSPEC_OK) {
    if (t == 0) *merged = empty_control_partial();
    return;
  }
  // The CTAs' partials are first brought to the row's largest m and rm, so
  // that the merges below add sums (no lane's branch differs); each warp
  // folds its lanes' partials, then the first warp the warps'.
  ControlPartial part = empty_control_partial();
  for (int g = t; g < int(gridDim.x); g += kThreads) merge_control_partial(part, a.partials[int64_t(g) * c.rows + row]);
  float m = part.m, rm = part.rm;
  for (int offset = 16; offset > 0; offset >>= 1) {
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    rm = fmaxf(rm, __shfl_xor_sync(0xffffffffu, rm, offset));
  }
  if (lane == 0) {
    sh.maxima[0][warp] = m;
    sh.maxima[1][warp] = rm;
  }
  __syncthreads();
  for (int w = 0; w < stream::kWarps; ++w) {
    m = fmaxf(m, sh.maxima[0][w]);
    rm = fmaxf(rm, sh.maxima[1][w]);
  }
  if (part.m != neg_inf()) {
    const float e = expf(part.m - m);
    part.s *= e;
    part.w *= e;
    part.m = m;
  }
  if (part.rm != neg_inf()) {
    part.rs *= expf(part.rm - rm);
    part.rm = rm;
  }
  warp_merge_control_partial(part);
  if (lane == 0) sh.reduce[warp] = part;
  __syncthreads();
  if (warp == 0) {
    part = lane < stream::kWarps ? sh.reduce[lane] : empty_control_partial();
    warp_merge_control_partial(part);
    if (lane == 0) {
      *merged = part;
      a.merged[row] = part;
    }
  }
  auto cut = [&](const Lists& list, const uint64_t* keys, const float* raws, int32_t count, int keep,
                 const RankedHandoff* ranked) {
    const int64_t to = int64_t(row) * list.capacity;  // merged list 0
    if (count <= kThreads) {
      // A short list (the scan's bound cut most candidates): each thread
      // ranks one key against the others and writes it at its rank.
      if (t < count) sh.staged[t] = __ldcg(keys + t);
      __syncthreads();
      if (t < count) {
        const uint64_t mine = sh.staged[t];
        int rank = 0;
        for (int j = 0; j < count; ++j) rank += sh.staged[j] > mine;
        if (rank < keep) {
          list.merged_keys[to + rank] = mine;
          list.merged_raws[to + rank] = __ldcg(raws + t);
          if (ranked) {
            ranked->ranked[rank] = mine;
            ranked->order[rank] = int16_t(rank);
          }
        }
      }
      if (t == 0) {
        list.merged_counts[row] = min(count, keep);
        if (ranked) *ranked->count = min(count, keep);
      }
      __syncthreads();  // the staged keys are free again
      return;
    }
    // Longer lists (keep above the bound's reach, or CTAs that found too few
    // published keys): radix selection, in registers where they fit.
    const FlatKeys flat{keys, count, (count + kThreads - 1) / kThreads};
    auto raw_of = [&](int i) { return raws[i * kThreads + t]; };
    if (flat.rounds() <= kFlatCached) {
      CachedFlatKeys cached;
#pragma unroll
      for (int i = 0; i < kFlatCached; ++i) cached.k[i] = flat.key(i);
      select_into(cached, raw_of, keep, 0, list.merged_keys + to, list.merged_raws + to, list.merged_counts + row,
                  sh.hist, sh.shared);
    } else {
      select_into(flat, raw_of, keep, 0, list.merged_keys + to, list.merged_raws + to, list.merged_counts + row,
                  sh.hist, sh.shared);
    }
  };
  if (r.keep > 0) {
    const int32_t count = min(__ldcg(a.counts + row), a.capacity);
    cut(c.candidates, a.keys + int64_t(row) * a.capacity, a.raws + int64_t(row) * a.capacity, count, r.keep,
        &handoff);
  }
  if (c.top_n > 0) {
    const int32_t count = min(__ldcg(a.top_counts + row), a.top_capacity);
    cut(c.tops, a.top_keys + int64_t(row) * a.top_capacity, a.top_raws + int64_t(row) * a.top_capacity, count,
        c.top_n, nullptr);
  }
}

// ---- Each row's summary ---------------------------------------------------


// (best, second, token) of a block, ties towards the smaller token.
struct Winner {
  float best, second;
  int32_t token;
  int32_t index;
};

__device__ void merge_winner(Winner& a, const Winner& b) {
  const bool b_wins = b.token >= 0 && (a.token < 0 || b.best > a.best || (b.best == a.best && b.token < a.token));
  if (b_wins) {
    a.second = fmaxf(a.best, b.second);
    a.best = b.best;
    a.token = b.token;
    a.index = b.index;
  } else {
    a.second = fmaxf(a.second, b.best);
  }
}

// A block's shared memory while it writes a row's summary; `all` holds the
// row's folded partial when summarize_row begins.
template <int kThreads>
struct SummaryShared {
  ControlPartial all;
  BandPartial above;  // continued rows: the kept tokens above the crossing bin
  int32_t continues;  // first pass: this row continues
  int32_t ranked_count;  // ≥ 0: ranked and order hold the row's candidates already ranked (the scan's finish)
  uint64_t ranked[kCandidates];
  int16_t order[kCandidates];
  float ranked_x[kCandidates];
  float weights[kCandidates];  // e^(x_i − x_0) of the ranked candidates
  uint64_t listed[kRankByCounting];
  Winner winners[kThreads / 32];
  float sums[kThreads / 32];
  int32_t kept, status_shared, candidate_count;
  float lse_shared;
};

// One row's summary by a block of kThreads threads (summary_kernel's, and
// the controlled streaming scan's after its second grid barrier): the
// controls applied to its ranked candidates, the sample, the logprobs.
template <int kThreads>
__device__ void summarize_row(const SummaryArgs& a, const RowSetup& r, int row, SummaryShared<kThreads>& sh) {
  const Common& c = a.common;
  const bool continued = a.continued != 0;
  ControlPartial& all = sh.all;
  BandPartial& above = sh.above;
  int32_t& continues = sh.continues;
  uint64_t* ranked = sh.ranked;
  int16_t* order = sh.order;
  float* ranked_x = sh.ranked_x;
  int32_t &kept = sh.kept, &status_shared = sh.status_shared, &candidate_count = sh.candidate_count;
  float& lse_shared = sh.lse_shared;
  const bool handed = sh.ranked_count >= 0;  // the candidates come ranked
  if (threadIdx.x == 0) {
    const ControlPartial& p = all;
    const bool live = r.plan.status == FLASHSPEC_OK;
    // Both loads issue before either is needed.
    const int32_t hidden_bad = live ? a.hidden_bad[row] : 0;
    const int32_t listed = live && r.keep > 0 && !handed ? c.candidates.merged_counts[a.final_list * c.rows + row]
                                                         : sh.ranked_count;
    int32_t status = r.plan.status;
    if (status == FLASHSPEC_OK) status = r.bias_status;
    if (status == FLASHSPEC_OK && (hidden_bad || (p.flags & (kPartialNonFinite | kPartialScaleOverflow))))
      status = FLASHSPEC_ERR_NON_FINITE;
    if (status == FLASHSPEC_OK && p.allowed == 0) status = FLASHSPEC_ERR_INVALID_ARGUMENT;  // the mask allows nothing
    status_shared = status;
    candidate_count = (status == FLASHSPEC_OK && r.keep > 0) ? listed : 0;
    continues = 0;
    if (continued) {
      BandPartial b = empty_band_partial();
      for (int g = 0; g < a.band_groups; ++g) merge_band_partial(b, a.band[int64_t(g) * a.band_stride + row]);
      above = b;
    } else if (a.continuing) {
      a.continuing[row].active = 0;
    }
  }
  __syncthreads();

  // A truncated row: rank its candidates, descending (a short list: each
  // thread counts the keys above its own; else a bitonic sort).
  const int n_c = candidate_count;
  const int64_t list_at = (int64_t(a.final_list) * c.rows + row) * c.candidates.capacity;
  if ((n_c > 0 && !handed) || (continued && status_shared == FLASHSPEC_OK)) {
    const bool counted = n_c <= kRankByCounting;
    uint64_t* listed = sh.listed;
    for (int i = threadIdx.x; i < kCandidates; i += kThreads) {
      const uint64_t key = i < n_c ? c.candidates.merged_keys[list_at + i] : 0;
      if (counted && i < n_c) listed[i] = key;
      if (!counted || i >= n_c) ranked[i] = key;
      order[i] = int16_t(i);
    }
    __syncthreads();
    for (int i = threadIdx.x; counted && i < n_c; i += kThreads) {
      const uint64_t mine = listed[i];
      int rank = 0;
      for (int j = 0; j < n_c; ++j) rank += listed[j] > mine;
      ranked[rank] = mine;
      order[rank] = int16_t(i);
    }
    int size = 1;
    while (!counted && size < n_c) size <<= 1;
    if (counted) size = 0;
    __syncthreads();
    for (int k = 2; k <= size; k <<= 1)
      for (int j = k >> 1; j > 0; j >>= 1) {
        for (int i = threadIdx.x; i < size; i += kThreads) {
          const int partner = i ^ j;
          if (partner <= i) continue;
          const bool descending = (i & k) == 0;
          const uint64_t x = ranked[i], y = ranked[partner];
          if ((x < y) == descending) {
            ranked[i] = y;
            ranked[partner] = x;
            const int16_t t = order[i];
            order[i] = order[partner];
            order[partner] = t;
          }
        }
        __syncthreads();
      }
  }
  if (n_c > 0 || (continued && status_shared == FLASHSPEC_OK)) {
    // Each candidate's x and weight e^(x − x_0), which the kept count and
    // the kept mass below sum in rank order.
    const float x0 = n_c > 0 ? key_x(ranked[0]) : 0.0f;
    for (int i = threadIdx.x; i < n_c; i += kThreads) {
      ranked_x[i] = key_x(ranked[i]);
      sh.weights[i] = expf(ranked_x[i] - x0);
    }
    __syncthreads();
    if (threadIdx.x == 0 && c.topk == 0 && !continued) {
      const int32_t k = min(int64_t(r.c.top_k), int64_t(all.allowed)) <= n_c ? 1 : 0;
      const float mass = all.s * expf(all.m - ranked_x[0]);
      const PrecomputedWeights weights{sh.weights};
      int32_t n = k ? kept_count_weighted(weights, n_c, r.c) : kept_count_of_first_weighted(weights, n_c, mass, r.c);
      // The kept set runs past the list: keep all of it for now; the row
      // continues (only top-p and min-p leave n < 0).
      if (n < 0) {
        continues = a.continuing ? 1 : 0;
        if (!a.continuing) status_shared = FLASHSPEC_ERR_UNSUPPORTED;
      }
      n = n < 0 ? (continues ? n_c : 0) : n;
      float s = 0.0f;
      for (int32_t i = 0; i < n; ++i) s += sh.weights[i];
      kept = n;
      lse_shared = n > 0 ? ranked_x[0] + logf(s) : 0.0f;
      if (continues) {
        Continuation& cont = a.continuing[row];
        cont.x0 = ranked_x[0];
        cont.list_mass = s;
        cont.target = r.c.top_p < 1.0f ? r.c.top_p * mass : INFINITY;
        cont.min_p = r.c.min_p;
        cont.last_key = ranked[n_c - 1];
        cont.bin = -1;
      }
    }
    if (threadIdx.x == 0 && continued) {
      // The cut among the crossing bin's tokens, in rank order, the
      // cumulative mass carried from the list and the tokens above the bin.
      const Continuation& cont = a.continuing[row];
      float cumulative = cont.list_mass + above.mass;
      int32_t n = 0;
      if (cont.bin >= 0) {
        n = -1;
        for (int32_t i = 0; i < n_c && n < 0; ++i) {
          cumulative += expf(ranked_x[i] - cont.x0);
          if (cumulative >= cont.target) n = i + 1;
        }
        if (n < 0) {
          // Not reached within the listed tokens: a rounding short of the
          // target keeps the whole bin; a bin of more tokens than the list
          // holds cannot be cut here.
          if (above.bin_count > n_c) status_shared = FLASHSPEC_ERR_UNSUPPORTED;
          n = n_c;
        }
      }
      float s = cont.list_mass + above.mass;
      for (int32_t i = 0; i < n; ++i) s += expf(ranked_x[i] - cont.x0);
      kept = n;
      lse_shared = cont.x0 + logf(s);
    }
    __syncthreads();
  }
  if (c.topk > 0) {  // a top-k draft: the ranked candidates and their log p at temperature 1
    if (threadIdx.x == 0) {
      const bool ok = status_shared == FLASHSPEC_OK;
      const float row_lse = lse_value(all.m, all.s);
      for (int i = 0; i < c.topk; ++i) {
        const int64_t at = int64_t(row) * c.topk + i;
        a.out.topk_tokens[at] = ok && i < n_c ? key_token(ranked[i]) : -1;
        if (a.out.topk_logprobs) a.out.topk_logprobs[at] = !ok ? NAN : i < n_c ? ranked_x[i] - row_lse : neg_inf();
      }
    }
    return;
  }
  const int32_t status = status_shared;
  const bool truncated = (n_c > 0 || continued) && status == FLASHSPEC_OK;
  const float lse = truncated ? lse_shared : (r.greedy ? 0.0f : lse_value(all.m, all.s));

  // The sample: over the kept prefix for a truncated row, else the fold's.
  Winner w{all.best, all.second, all.token, -1};
  float best_x = all.best_x, best_raw = all.best_raw;
  float entropy = 0.0f, weighted_total = 0.0f;
  const bool typical = status == FLASHSPEC_OK && !r.greedy && r.plan.tracked >= 0 && typical_acceptance(r.c);
  if (truncated) {
    Winner mine{neg_inf(), neg_inf(), -1, -1};
    float weighted = 0.0f;
    for (int i = threadIdx.x; i < kept; i += kThreads) {
      const int32_t token = key_token(ranked[i]);
      const float x = ranked_x[i];
      weighted += expf(x - lse) * x;
      if (!is_offered(r.plan, token)) continue;
      merge_winner(mine, Winner{x + gumbel_from_bits(row_word(r.plan.key, token)), neg_inf(), token, i});
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
      Winner other;
      other.best = __shfl_down_sync(0xffffffffu, mine.best, offset);
      other.second = __shfl_down_sync(0xffffffffu, mine.second, offset);
      other.token = __shfl_down_sync(0xffffffffu, mine.token, offset);
      other.index = __shfl_down_sync(0xffffffffu, mine.index, offset);
      merge_winner(mine, other);
      weighted += __shfl_down_sync(0xffffffffu, weighted, offset);
    }
    if ((threadIdx.x & 31) == 0) {
      sh.winners[threadIdx.x >> 5] = mine;
      sh.sums[threadIdx.x >> 5] = weighted;
    }
    __syncthreads();
    w = Winner{neg_inf(), neg_inf(), -1, -1};
    weighted = 0.0f;
    for (int k = 0; k < kThreads / 32; ++k) {
      merge_winner(w, sh.winners[k]);
      weighted += sh.sums[k];
    }
    if (w.index >= 0) {
      best_x = ranked_x[w.index];
      best_raw = c.candidates.merged_raws[list_at + order[w.index]];
    }
    if (continued) {
      // With the list's sample and that of the tokens above the bin.
      // merge_sample carries each winner's x and raw logit with it.
      const Continuation& cont = a.continuing[row];
      BandPartial sample = empty_band_partial(), bin = empty_band_partial();
      sample.best = cont.best;
      sample.second = cont.second;
      sample.best_x = cont.best_x;
      sample.best_raw = cont.best_raw;
      sample.token = cont.token;
      bin.best = w.best;
      bin.second = w.second;
      bin.best_x = best_x;
      bin.best_raw = best_raw;
      bin.token = w.token;
      merge_sample(sample, above);
      merge_sample(sample, bin);
      w = Winner{sample.best, sample.second, sample.token, -1};
      best_x = sample.best_x;
      best_raw = sample.best_raw;
      weighted += (cont.list_weighted + above.weighted) * expf(cont.x0 - lse);
    }
    weighted_total = weighted;
    entropy = lse - weighted;
  } else if (typical) {
    entropy = lse - all.w / all.s;
  }
  if (threadIdx.x != 0) return;
  if (continues) {
    // The first pass of a continuing row: its list's share of the sample;
    // the row's outputs come after the third pass.
    Continuation& cont = a.continuing[row];
    cont.best = w.best;
    cont.second = w.second;
    cont.token = w.token;
    cont.best_x = best_x;
    cont.best_raw = best_raw;
    cont.list_weighted = weighted_total * expf(lse - cont.x0);
    cont.active = 1;
    *a.continue_flag = 1;
    return;
  }

  // The drafted token is kept if allowed and, in a truncated row, ranked
  // within the prefix (a continued row: in its list, above the crossing bin,
  // or within the bin's kept tokens; and not cut by min-p).
  float draft_x = all.tracked_x;
  if (continued && draft_x != neg_inf()) {
    const Continuation& cont = a.continuing[row];
    const uint64_t key = rank_key(draft_x, r.plan.tracked);
    bool kept_token = key >= cont.last_key;
    if (!kept_token && !(cont.min_p > 0.0f && expf(draft_x - cont.x0) < cont.min_p)) {
      const int b = mass_bin(draft_x, cont.x0);
      kept_token = cont.bin < 0 || b < cont.bin || (b == cont.bin && kept > 0 && key >= ranked[kept - 1]);
    }
    if (!kept_token) draft_x = neg_inf();
  } else if (truncated && draft_x != neg_inf() && rank_key(draft_x, r.plan.tracked) < ranked[kept - 1]) {
    draft_x = neg_inf();
  }

  if (a.out.summaries) {
    RowSummary s = verify_summary(r.plan, empty_partial(), status);  // every field set, then this row's
    s.lse = lse;
    s.draft_logit = r.plan.tracked >= 0 ? draft_x : 0.0f;
    s.draft_logq = 0.0f;
    s.candidate = w.token;
    s.candidate_gap = winner_gap(w.best, w.second);
    s.status = status;
    s.typical = typical ? 1 : 0;
    s.typical_log_threshold = typical ? typical_log_threshold(r.c, entropy) : 0.0f;
    s.candidate_logit = best_x;
    s.raw_lse = lse_value(all.rm, all.rs);
    s.draft_raw_logit = r.plan.tracked >= 0 ? all.tracked_raw : 0.0f;
    s.candidate_raw_logit = w.token >= 0 ? best_raw : 0.0f;
    a.out.summaries[row] = s;
  } else {
    const bool ok = status == FLASHSPEC_OK && w.token >= 0;
    a.out.tokens_out[row] = ok ? w.token : -1;
    if (a.out.scores_out) a.out.scores_out[row] = !ok ? NAN : (r.greedy ? best_x : best_x - lse);
  }

  // The row's top raw logits, ranked (a short insertion sort).
  if (c.top_n > 0 && a.out.top_tokens) {
    const int64_t at = (int64_t(a.tops_list) * c.rows + row) * c.tops.capacity;
    const int32_t count = status == FLASHSPEC_OK ? c.tops.merged_counts[a.tops_list * c.rows + row] : 0;
    uint64_t keys[kTopN];
    float raws[kTopN];
    for (int i = 0; i < count; ++i) {
      uint64_t key = c.tops.merged_keys[at + i];
      float raw = c.tops.merged_raws[at + i];
      int j = i;
      for (; j > 0 && keys[j - 1] < key; --j) {
        keys[j] = keys[j - 1];
        raws[j] = raws[j - 1];
      }
      keys[j] = key;
      raws[j] = raw;
    }
    const float raw_lse = lse_value(all.rm, all.rs);
    for (int i = 0; i < c.top_n; ++i) {
      a.out.top_tokens[int64_t(row) * c.top_n + i] = i < count ? key_token(keys[i]) : -1;
      a.out.top_logprobs[int64_t(row) * c.top_n + i] = i < count ? raws[i] - raw_lse : neg_inf();
    }
  }
}

__global__ void __launch_bounds__(kRowThreads) summary_kernel(const SummaryArgs a) {
  pdl_wait();  // launched dependent: may start before its predecessor ends
  const int row = blockIdx.x;
  const RowSetup r = row_setup(a.common, row);
  if (a.continued && !a.continuing[row].active) return;  // the first pass wrote this row
  __shared__ ControlPartial groups[kMaxVocabulary / kSliceTokens];
  __shared__ SummaryShared<kRowThreads> sh;
  if (r.plan.status == FLASHSPEC_OK)
    for (int g = threadIdx.x; g < a.groups; g += blockDim.x)
      groups[g] = a.partials[int64_t(g) * a.partial_stride + row];
  __syncthreads();
  if (threadIdx.x == 0) {
    ControlPartial p = empty_control_partial();
    if (r.plan.status == FLASHSPEC_OK)
      for (int g = 0; g < a.groups; ++g) merge_control_partial(p, groups[g]);
    sh.all = p;
    sh.ranked_count = -1;
  }
  __syncthreads();
  summarize_row(a, r, row, sh);
}

// The controlled streaming scan's shared memory after its second grid
// barrier, in place of its logits.
struct FinishShared {
  MergeShared merge;
  SummaryShared<stream::kThreads> summary;
};

template <flashspec_dtype kW, int kShape>
__global__ void __launch_bounds__(stream::kThreads, tuning::stream_shape(is_codes(kW), kShape).min_blocks)
    fused_stream_kernel(const FusedArgs a) {
  constexpr int kNT = tuning::stream_shape(is_codes(kW), kShape).row_groups;
  extern __shared__ float fused_smem[];  // logits [rows][cta_tokens], each warp's selection buffer; then FinishShared
  // A cooperative launch, after the kernels before it have finished (a
  // programmatic launch of this barrier kernel measured far slower).
  pdl_trigger();  // the finalize may launch now; it waits for this grid to finish
  const ScanParams& p = a.scan;
  const int warp = int(threadIdx.x) >> 5;
  const int64_t grid_warps = int64_t(gridDim.x) * stream::kWarps;
  const stream::WarpRun run = stream::warp_run(p.vocab);
  const int32_t cta_first = stream::first_tile_of(int64_t(blockIdx.x) * stream::kWarps, grid_warps, p.vocab) * 16;
  const int32_t cta_end =
      min(p.vocab, stream::first_tile_of(int64_t(blockIdx.x + 1) * stream::kWarps, grid_warps, p.vocab) * 16);
  float* logits = fused_smem;
  const int stride = a.cta_tokens;
  // The rows' setups (plans, controls: a chain of dependent loads) are read
  // while W streams.
  __shared__ RowSetup setups[stream::kMaxRows];
  if (int(threadIdx.x) < p.rows) setups[threadIdx.x] = row_setup(a.summary.common, int(threadIdx.x));
  stream::stream_tiles<kW, kShape>(p, run.first_tile, run.tiles, [](int) {}, [&](int tok_a, auto&& logit) {
    stream::each_logit<kNT>(p, tok_a, logit,
                            [&](int row, int token, float l) { logits[row * stride + (token - cta_first)] = l; });
  });
  __syncthreads();
  // Then each warp's kSelectBuffer keys, then each warp's kSelectBuffer
  // item indices (8-byte aligned: stride is a multiple of 16).
  uint64_t* buffers = reinterpret_cast<uint64_t*>(fused_smem + int64_t(p.rows) * stride);
  uint64_t* buffer = buffers + warp * kSelectBuffer;
  int32_t* items = reinterpret_cast<int32_t*>(buffers + stream::kWarps * kSelectBuffer) + warp * kSelectBuffer;
  // Rows go in rounds of at most kWarps rows; a round of fewer rows gives
  // each row several warps (its parts of the range, in order).
  // parts[round][warp] holds a warp's part of a row until the row's
  // selection after the grid's barrier.
  static_assert(stream::kMaxRows <= 2 * stream::kWarps, "at most two rounds of rows");
  __shared__ PartFold parts[2][stream::kWarps];
  const int lane = int(threadIdx.x) & 31, n = cta_end - cta_first;
  const int rounds = (p.rows + stream::kWarps - 1) / stream::kWarps;
  auto round_rows = [&](int round) { return min(stream::kWarps, p.rows - round * stream::kWarps); };
  // First each warp folds its parts, and every row's two best keys of this
  // CTA are published, for every CTA's selection after the grid's barrier.
  for (int round = 0; round < rounds; ++round) {
    const int per_row = stream::kWarps / round_rows(round);
    const int slot = warp / per_row, part_index = warp % per_row;
    const int row = round * stream::kWarps + slot;
    const bool active = slot < round_rows(round);
    if (active) {
      const int begin = int(int64_t(n) * part_index / per_row) & ~3;
      const int end = part_index + 1 == per_row ? n : int(int64_t(n) * (part_index + 1) / per_row) & ~3;
      const PartFold f = fold_and_pick(setups[row], logits + row * stride, cta_first, begin, end);
      if (lane == 0) parts[round][warp] = f;
    }
    __syncthreads();
    if (active && part_index == 0 && lane == 0) {
      uint64_t best = 0, next = 0, raw_best = 0, raw_next = 0;
      for (int w = warp; w < warp + per_row; ++w) {
        insert_top2(parts[round][w].best, best, next);
        insert_top2(parts[round][w].next, best, next);
        insert_top2(parts[round][w].raw_best, raw_best, raw_next);
        insert_top2(parts[round][w].raw_next, raw_best, raw_next);
      }
      const int64_t at = (int64_t(row) * gridDim.x + blockIdx.x) * 2;
      __stcg(a.slots + at, best);
      __stcg(a.slots + at + 1, next);
      __stcg(a.top_slots + at, raw_best);
      __stcg(a.top_slots + at + 1, raw_next);
    }
  }
  // The lists start empty (their counts grow after the barrier). Every
  // CTA's keys are published before any CTA selects (a cooperative launch:
  // all CTAs are resident); the CTAs reach here at about the same time, at
  // the end of their share of W.
  if (blockIdx.x == 0 && int(threadIdx.x) < p.rows) {
    a.counts[threadIdx.x] = 0;
    a.top_counts[threadIdx.x] = 0;
    if (threadIdx.x == 0) *a.summary.continue_flag = 0;  // set after the second barrier
  }
  cooperative_groups::this_grid().sync();
  for (int round = 0; round < rounds; ++round) {
    const int per_row = stream::kWarps / round_rows(round);
    const int slot = warp / per_row, part_index = warp % per_row;
    const int row = round * stream::kWarps + slot;
    if (slot < round_rows(round))
      finish_row(a, setups[row], row, parts[round] + (warp - part_index), per_row, part_index, logits + row * stride,
                 buffer, items, cta_first, n);
  }
  // Every CTA's partials and lists are in: CTA b finishes rows b, b + grid,
  // ... in the shared memory the logits held.
  cooperative_groups::this_grid().sync();
  FinishShared& finish = *reinterpret_cast<FinishShared*>(fused_smem);
  for (int row = blockIdx.x; row < p.rows; row += gridDim.x) {
    merge_row(a, setups[row], row, finish.merge, &finish.summary.all,
              RankedHandoff{finish.summary.ranked, finish.summary.order, &finish.summary.ranked_count});
    __syncthreads();
    summarize_row(a.summary, setups[row], row, finish.summary);
    __syncthreads();
  }
}

struct FusedScan {
  template <flashspec_dtype kW, int kShape>
  static const void* of() {
    return reinterpret_cast<const void*>(&fused_stream_kernel<kW, kShape>);
  }
};

const void* fused_kernel(int shape, flashspec_dtype w_dtype) { return stream::kernel_for<FusedScan>(shape, w_dtype); }

int64_t align(int64_t v) { return (v + 255) / 256 * 256; }

}  // namespace

size_t workspace_bytes(int32_t max_rows, int32_t max_requests, int32_t chunk) {
  Workspace ws = carve_workspace(nullptr, max_rows, max_requests, chunk);
  return size_t(reinterpret_cast<uintptr_t>(ws.continue_flag) + align(sizeof(int32_t)));
}

Workspace carve_workspace(void* base, int32_t max_rows, int32_t max_requests, int32_t chunk) {
  Workspace ws = {};
  ws.max_rows = max_rows;
  ws.max_requests = std::max(max_requests, max_rows);
  ws.slices_per_chunk = (chunk + kSliceTokens - 1) / kSliceTokens;
  ws.max_groups = kMaxVocabulary / kSliceTokens;
  uintptr_t at = reinterpret_cast<uintptr_t>(base);
  auto take = [&at](int64_t bytes) {
    const uintptr_t p = at;
    at += uintptr_t(align(bytes));
    return reinterpret_cast<void*>(p);
  };
  const int64_t rows = max_rows, slices = ws.slices_per_chunk;
  ws.partials = take(int64_t(ws.max_groups) * rows * int64_t(sizeof(ControlPartial)));
  ws.slice_keys = static_cast<uint64_t*>(take(rows * slices * kCandidates * 8));
  ws.slice_raws = static_cast<float*>(take(rows * slices * kCandidates * 4));
  ws.slice_counts = static_cast<int32_t*>(take(rows * slices * 4));
  ws.merged_keys = static_cast<uint64_t*>(take(2 * rows * kCandidates * 8));
  ws.merged_raws = static_cast<float*>(take(2 * rows * kCandidates * 4));
  ws.merged_counts = static_cast<int32_t*>(take(2 * rows * 4));
  ws.thresholds = static_cast<uint64_t*>(take(rows * 8));
  ws.top_slice_keys = static_cast<uint64_t*>(take(rows * slices * kTopN * 8));
  ws.top_slice_raws = static_cast<float*>(take(rows * slices * kTopN * 4));
  ws.top_slice_counts = static_cast<int32_t*>(take(rows * slices * 4));
  ws.top_merged_keys = static_cast<uint64_t*>(take(2 * rows * kTopN * 8));
  ws.top_merged_raws = static_cast<float*>(take(2 * rows * kTopN * 4));
  ws.top_merged_counts = static_cast<int32_t*>(take(2 * rows * 4));
  ws.top_thresholds = static_cast<uint64_t*>(take(rows * 8));
  ws.bias_tokens = static_cast<int32_t*>(take(int64_t(ws.max_requests) * kMaxBiasEntries * 4));
  ws.bias_values = static_cast<float*>(take(int64_t(ws.max_requests) * kMaxBiasEntries * 4));
  ws.bias_counts = static_cast<int32_t*>(take(int64_t(ws.max_requests) * 4));
  ws.continuations = take(rows * int64_t(sizeof(Continuation)));
  ws.band_partials = take(int64_t(ws.max_groups) * rows * int64_t(sizeof(BandPartial)));
  ws.histograms = static_cast<uint64_t*>(take(rows * kMassBins * 8));
  ws.continue_flag = static_cast<int32_t*>(take(4));
  return ws;
}

namespace {

// The W dtypes the controlled streaming scan reads, in ScanSmemLimits' order.
constexpr flashspec_dtype kStreamDtypes[] = {FLASHSPEC_DTYPE_BF16, FLASHSPEC_DTYPE_F16, FLASHSPEC_DTYPE_E4M3,
                                             FLASHSPEC_DTYPE_I8};
int w_dtype_index(flashspec_dtype dtype) {
  return dtype == FLASHSPEC_DTYPE_F16 ? 1 : dtype == FLASHSPEC_DTYPE_E4M3 ? 2 : dtype == FLASHSPEC_DTYPE_I8 ? 3 : 0;
}

// Where the controlled streaming scan of a call goes: its partials, lists
// and published keys, carved from the cuBLAS chunks' buffers (which it does
// not use); kernel NULL when the call
// takes the chunks: more rows than the scan serves, W or hidden rows it does
// not read, a CTA range whose logits do not fit in shared memory at the
// scan's occupancy, or lists larger than the buffers.
struct FusedLayout {
  const void* kernel = nullptr;
  int shape = 0;
  int max_blocks = 0;  // CTAs the scan's occupancy allows
  int blocks = 0;
  int32_t cta_tokens = 0;
  size_t smem = 0;
  ControlPartial* partials = nullptr;
  uint64_t* keys = nullptr;
  float* raws = nullptr;
  int32_t capacity = 0;
  uint64_t* top_keys = nullptr;
  float* top_raws = nullptr;
  int32_t top_capacity = 0;
  int32_t* counts = nullptr;  // [2][rows]: candidates, then top raw logits
  uint64_t* slots = nullptr;  // [2][rows][blocks][2]: published keys, candidates then top raw logits
};

// The streaming loop's view of W's rows [v0, v0 + count).
ScanParams stream_params(const Pass& p, int32_t v0, int32_t count) {
  ScanParams s = {};
  const int64_t element = is_codes(p.w_dtype) ? 1 : 2;
  s.w = static_cast<const unsigned char*>(p.w) + int64_t(v0) * p.ldw * element;
  s.ldw = p.ldw;
  s.w_dtype = p.w_dtype;
  s.w_scale = p.w_scale ? p.w_scale + v0 : nullptr;
  s.vocab = count;
  s.d_load = p.d_load;
  s.k_pad = p.k_pad;
  s.h = p.hidden;
  s.rows = p.rows;
  s.plans = p.plans;
  return s;
}

FusedLayout fused_layout(const Pass& p, const Outputs& out) {
  FusedLayout f;
  const bool streams = p.w_dtype == FLASHSPEC_DTYPE_BF16 || p.w_dtype == FLASHSPEC_DTYPE_F16 || is_codes(p.w_dtype);
  if (!p.stream_scan || !streams || p.rows > tuning::kStreamMaxRows || p.sm_count <= 0) return f;
  // Top-p or min-p without top-k keeps kCandidates candidates a row, beyond
  // the published bound's reach: every CTA would list its whole range. Such
  // calls, and top-k drafts of more than kBoundKeep tokens, take the chunks.
  if ((p.controls.top_p || p.controls.min_p) && !p.controls.top_k) return f;
  if (out.topk > kBoundKeep) return f;
  const int shape = tuning::stream_shape_for(p.rows);
  const int per_sm = tuning::stream_shape(is_codes(p.w_dtype), shape).min_blocks;
  const int64_t tiles = (int64_t(p.vocab) + 15) / 16;
  const int blocks = int(std::max<int64_t>(
      1, std::min<int64_t>(int64_t(p.sm_count) * per_sm, (tiles + stream::kWarps - 1) / stream::kWarps)));
  // A CTA's range is a difference of floors of multiples of tiles / blocks:
  // at most ⌈tiles / blocks⌉ tiles.
  const int32_t cta_tokens = int32_t((tiles + blocks - 1) / blocks * 16);
  const size_t smem = std::max(size_t(p.rows) * size_t(cta_tokens) * sizeof(float) +
                                   size_t(stream::kWarps) * kSelectBuffer * (sizeof(uint64_t) + sizeof(int32_t)),
                               sizeof(FinishShared));
  if (smem > p.smem_limits->bytes[shape][w_dtype_index(p.w_dtype)]) return f;
  const int64_t capacity = int64_t(blocks) * std::min<int32_t>(kCandidates, cta_tokens);
  const int64_t top_capacity = p.top_n > 0 ? int64_t(blocks) * std::min<int32_t>(kTopN, cta_tokens) : 0;
  uintptr_t at = reinterpret_cast<uintptr_t>(p.fused_scratch);
  auto take = [&at](int64_t bytes) {
    const uintptr_t q = at;
    at += uintptr_t(align(bytes));
    return reinterpret_cast<void*>(q);
  };
  f.partials = static_cast<ControlPartial*>(take(int64_t(blocks) * p.rows * int64_t(sizeof(ControlPartial))));
  f.keys = static_cast<uint64_t*>(take(p.rows * capacity * 8));
  f.raws = static_cast<float*>(take(p.rows * capacity * 4));
  f.top_keys = static_cast<uint64_t*>(take(p.rows * top_capacity * 8));
  f.top_raws = static_cast<float*>(take(p.rows * top_capacity * 4));
  f.counts = static_cast<int32_t*>(take(2 * p.rows * 4));
  f.slots = static_cast<uint64_t*>(take(4 * int64_t(p.rows) * blocks * 8));
  if (at - reinterpret_cast<uintptr_t>(p.fused_scratch) > p.fused_scratch_bytes) return FusedLayout{};
  f.kernel = fused_kernel(shape, p.w_dtype);
  f.shape = shape;
  f.max_blocks = p.sm_count * per_sm;
  f.blocks = blocks;
  f.cta_tokens = cta_tokens;
  f.smem = smem;
  f.capacity = int32_t(capacity);
  f.top_capacity = int32_t(top_capacity);
  return f;
}

}  // namespace

cudaError_t configure(size_t max_smem, ScanSmemLimits* limits) {
  cudaFuncAttributes attributes{};
  cudaError_t e = cudaSuccess;
  for (int shape = 0; shape < tuning::kStreamShapeCount; ++shape)
    for (flashspec_dtype dtype : kStreamDtypes) {
      const void* kernel = fused_kernel(shape, dtype);
      if ((e = cudaFuncGetAttributes(&attributes, kernel)) != cudaSuccess) return e;
      const size_t opt_in = max_smem - std::min(max_smem, attributes.sharedSizeBytes);
      if ((e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(opt_in))) != cudaSuccess)
        return e;
      size_t resident = 0;  // per block, with the shape's blocks per SM resident
      e = cudaOccupancyAvailableDynamicSMemPerBlock(&resident, kernel,
                                                    tuning::stream_shape(is_codes(dtype), shape).min_blocks,
                                                    stream::kThreads);
      if (e != cudaSuccess) return e;
      limits->bytes[shape][w_dtype_index(dtype)] = std::min(opt_in, resident);
    }
  return cudaSuccess;
}

cudaError_t run(const Workspace& ws, const Pass& p, const Outputs& out, cudaStream_t stream,
                const char** cublas_failure) {
  *cublas_failure = nullptr;
  const int32_t slices_total = (p.vocab + kSliceTokens - 1) / kSliceTokens;
  if (slices_total > ws.max_groups || p.rows > ws.max_rows || p.requests > ws.max_requests ||
      ws.slices_per_chunk > kMaxSlicesPerChunk)
    return cudaErrorInvalidValue;
  cudaError_t e = cudaSuccess;

  // Every kernel of the pass launches as a programmatic dependent (it waits
  // in pdl_wait()); a fold that follows an event wait launches plainly.
  auto launch_on = [](const void* kernel, dim3 grid, int threads, cudaStream_t on, void* args, bool dependent) {
    void* params[] = {args};
    return dependent ? launch_dependent(kernel, grid, dim3(unsigned(threads)), 0, on, params)
                     : launch(kernel, grid, dim3(unsigned(threads)), 0, false, on, params);
  };
  const FusedLayout fused = fused_layout(p, out);
  // The bias kernel also clears what a chunked pass starts from
  // (PassReset), so no memset node sits between the kernels of a captured
  // call. The streaming scan clears what it needs itself: without bias
  // entries it is the pass's first kernel.
  if (!fused.kernel || p.controls.bias_offsets) {
    BiasArgs b{PassReset{ws.merged_counts, ws.top_merged_counts, ws.thresholds, ws.top_thresholds, ws.continue_flag},
               p.controls, p.rows, p.batch_status, ws.bias_tokens, ws.bias_values, ws.bias_counts};
    e = launch_on(reinterpret_cast<const void*>(&bias_kernel), dim3(unsigned(p.requests)), kBiasThreads, stream, &b,
                  true);
    if (e != cudaSuccess) return e;
  }

  Common common = {};
  common.plans = p.plans;
  common.controls = p.controls;
  common.bias_tokens = ws.bias_tokens;
  common.bias_values = ws.bias_values;
  common.bias_counts = ws.bias_counts;
  common.vocab = p.vocab;
  common.rows = p.rows;
  common.slices = ws.slices_per_chunk;
  common.top_n = p.top_n;
  common.topk = out.topk;
  common.candidates = Lists{ws.slice_keys,  ws.slice_raws,    ws.slice_counts, ws.merged_keys,
                            ws.merged_raws, ws.merged_counts, ws.thresholds,   kCandidates};
  common.tops = Lists{ws.top_slice_keys,  ws.top_slice_raws,    ws.top_slice_counts, ws.top_merged_keys,
                      ws.top_merged_raws, ws.top_merged_counts, ws.top_thresholds,   kTopN};
  // The merged lists are indexed [list][rows][capacity] with this call's row
  // count as the stride (merge and summary kernels use gridDim / rows).

  // Two logits buffers: while the side stream folds and merges one chunk,
  // cuBLAS writes the next into the other buffer on the pass's stream
  // (events order the buffers' reuse; the whole pass stays capturable).
  const bool pipelined = p.chunks.pipelined();
  const int32_t chunk = p.chunk;
  const gemm_scan::Product product{p.cublas, p.w,      p.ldw,    p.w_dtype, p.w_scale, p.dequantized,
                                   p.d,      p.d_load, p.hidden, p.k_pad,   p.rows};
  int group = 0, from = 0, index = 0;
  // Rows whose top-p or min-p kept set runs past their candidate list
  // continue (controls.h): only top-p and min-p can, and only outside stream
  // capture, where the host cannot learn whether a row did before it records
  // the passes (a captured call's such rows fail with UNSUPPORTED instead).
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if ((e = cudaStreamIsCapturing(stream, &capture)) != cudaSuccess) return e;
  const bool may_continue =
      out.topk == 0 && (p.controls.top_p || p.controls.min_p) && capture == cudaStreamCaptureStatusNone;
  auto* continuing = may_continue ? static_cast<Continuation*>(ws.continuations) : nullptr;
  auto* band = static_cast<BandPartial*>(ws.band_partials);
  if (fused.kernel) {
    // ≤ 16 rows: one read of W by the controlled streaming scan, which also
    // merges its CTAs' lists and partials (merged lists 0, one partial per
    // row in ws.partials) and writes the rows' summaries.
    FusedArgs f = {};
    f.scan = stream_params(p, 0, p.vocab);
    // The finish hands summarize_row each row's partial itself (no groups).
    f.summary = SummaryArgs{common, nullptr, 0, 0, 0, 0, p.hidden_bad, out, 0, continuing, ws.continue_flag,
                            band, ws.max_rows, 0};
    f.merged = static_cast<ControlPartial*>(ws.partials);
    f.cta_tokens = fused.cta_tokens;
    f.partials = fused.partials;
    f.keys = fused.keys;
    f.raws = fused.raws;
    f.counts = fused.counts;
    f.capacity = fused.capacity;
    f.top_keys = fused.top_keys;
    f.top_raws = fused.top_raws;
    f.top_counts = fused.counts + p.rows;
    f.top_capacity = fused.top_capacity;
    f.slots = fused.slots;
    f.top_slots = fused.slots + 2 * int64_t(p.rows) * fused.blocks;
    void* scan_args[] = {&f};
    e = launch(fused.kernel, dim3(unsigned(fused.blocks)), dim3(unsigned(stream::kThreads)), fused.smem, true, stream,
               scan_args);
    if (e != cudaSuccess) return e;
    group = 1;
  }
  for (int32_t v0 = 0; v0 < p.vocab && !fused.kernel; v0 += chunk, ++index) {
    float* logits = nullptr;
    if ((e = p.chunks.acquire(index, stream, &logits)) != cudaSuccess) return e;
    const int32_t count = std::min(chunk, p.vocab - v0);
    const gemm_scan::Status status = gemm_scan::logits_chunk(product, v0, count, logits, chunk, stream);
    if (status.cuda != cudaSuccess) return status.cuda;
    if (status.what) {
      *cublas_failure = status.what;
      return cudaSuccess;
    }
    cudaStream_t fold_stream = stream;
    if ((e = p.chunks.hand_over(index, stream, &fold_stream)) != cudaSuccess) return e;
    const int slices = (count + kSliceTokens - 1) / kSliceTokens;
    FoldArgs f{common, logits, chunk, v0, count, static_cast<ControlPartial*>(ws.partials), ws.max_rows, group};
    e = launch_on(reinterpret_cast<const void*>(&fold_kernel), dim3(unsigned(slices), unsigned(p.rows)),
                  kFoldThreads, fold_stream, &f, !pipelined);
    if (e != cudaSuccess) return e;
    if ((e = p.chunks.release(index)) != cudaSuccess) return e;
    MergeArgs m{common, slices, from, nullptr};
    e = launch_on(reinterpret_cast<const void*>(&merge_kernel), dim3(unsigned(p.rows)), kRowThreads, fold_stream, &m,
                  true);
    if (e != cudaSuccess) return e;
    from = 1 - from;
    group += slices;
  }
  if (!fused.kernel) {
    if ((e = p.chunks.join(stream)) != cudaSuccess) return e;  // the side stream's work back
    SummaryArgs s{common, static_cast<const ControlPartial*>(ws.partials), ws.max_rows, group, from, from,
                  p.hidden_bad, out, 0, continuing, ws.continue_flag, band, ws.max_rows, 0};
    e = launch_on(reinterpret_cast<const void*>(&summary_kernel), dim3(unsigned(p.rows)), kRowThreads, stream, &s,
                  !pipelined);
    if (e != cudaSuccess) return e;
  }
  if (!may_continue) return cudaSuccess;
  int32_t flag = 0;
  if ((e = cudaMemcpyAsync(&flag, ws.continue_flag, sizeof flag, cudaMemcpyDeviceToHost, stream)) != cudaSuccess)
    return e;
  if ((e = cudaStreamSynchronize(stream)) != cudaSuccess) return e;
  if (!flag) return cudaSuccess;
  if ((e = cudaMemsetAsync(ws.histograms, 0, size_t(p.rows) * kMassBins * 8, stream)) != cudaSuccess) return e;
  // Pass two: the mass histograms.
  float* logits = p.chunks.logits[0];
  auto pass_over_w = [&](auto&& fold_chunk) -> cudaError_t {
    int32_t groups = 0;
    for (int32_t v0 = 0; v0 < p.vocab; v0 += chunk) {
      const int32_t count = std::min(chunk, p.vocab - v0);
      if (fused.kernel) {  // the logits the first pass ranked
        ScanParams sp = stream_params(p, v0, count);
        float* out_logits = logits;
        int32_t ld = chunk;
        void* args[] = {&sp, &out_logits, &ld};
        const int64_t warps = (int64_t(count) + 15) / 16;
        const int blocks = int(std::min<int64_t>(fused.max_blocks, (warps + stream::kWarps - 1) / stream::kWarps));
        const cudaError_t err = launch_dependent(logits_kernel(fused.shape, p.w_dtype), dim3(unsigned(blocks)),
                                                 dim3(unsigned(stream::kThreads)), 0, stream, args);
        if (err != cudaSuccess) return err;
      } else {
        const gemm_scan::Status status = gemm_scan::logits_chunk(product, v0, count, logits, chunk, stream);
        if (status.cuda != cudaSuccess) return status.cuda;
        if (status.what) {
          *cublas_failure = status.what;
          return cudaSuccess;
        }
      }
      const int slices = (count + kSliceTokens - 1) / kSliceTokens;
      PassArgs pa{common, logits, chunk, v0, count, continuing, ws.histograms, band, ws.max_rows, groups};
      cudaError_t err = fold_chunk(pa, slices);
      if (err != cudaSuccess) return err;
      groups += slices;
    }
    return cudaSuccess;
  };
  e = pass_over_w([&](PassArgs& pa, int slices) {
    return launch_on(reinterpret_cast<const void*>(&mass_histogram_kernel), dim3(unsigned(slices), unsigned(p.rows)),
                     kFoldThreads, stream, &pa, true);
  });
  if (e != cudaSuccess || *cublas_failure) return e;
  {
    uint64_t* histograms = ws.histograms;
    void* params[] = {&continuing, &histograms};
    e = launch_dependent(reinterpret_cast<const void*>(&crossing_kernel), dim3(unsigned(p.rows)), dim3(32), 0, stream,
                         params);
    if (e != cudaSuccess) return e;
  }
  // Pass three: the kept tokens above each crossing bin, the bin's tokens
  // as candidates in fresh lists.
  for (auto [ptr, bytes] : {std::pair<void*, size_t>{ws.merged_counts, size_t(ws.max_rows) * 8},
                            std::pair<void*, size_t>{ws.thresholds, size_t(ws.max_rows) * 8}})
    if ((e = cudaMemsetAsync(ptr, 0, bytes, stream)) != cudaSuccess) return e;
  int candidates_from = 0;
  e = pass_over_w([&](PassArgs& pa, int slices) {
    cudaError_t err = launch_on(reinterpret_cast<const void*>(&band_kernel), dim3(unsigned(slices), unsigned(p.rows)),
                                kFoldThreads, stream, &pa, true);
    if (err != cudaSuccess) return err;
    MergeArgs m{common, slices, candidates_from, continuing};
    err = launch_on(reinterpret_cast<const void*>(&merge_kernel), dim3(unsigned(p.rows)), kRowThreads, stream, &m,
                    true);
    candidates_from = 1 - candidates_from;
    return err;
  });
  if (e != cudaSuccess || *cublas_failure) return e;
  SummaryArgs finish{common, static_cast<const ControlPartial*>(ws.partials), ws.max_rows, group, candidates_from,
                     from, p.hidden_bad, out, 1, continuing, ws.continue_flag, band, ws.max_rows, slices_total};
  return launch_on(reinterpret_cast<const void*>(&summary_kernel), dim3(unsigned(p.rows)), kRowThreads, stream,
                   &finish, true);
}

}  // namespace controls
}  // namespace cuda
}  // namespace flashspec
