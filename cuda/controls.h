// Sampling controls and logprobs on the device (flashspec.h, "Sampling
// controls"): the pass over the LM head for a call whose rows are analysed
// whole, without writing anything vocabulary-sized.
//
// A call of at most tuning::kStreamMaxRows rows whose head the
// weight-streaming scan reads, and whose controls carry top-k (or no top-p
// and min-p), reads W once in a controlled streaming scan (the loop of
// stream_tiles.cuh; a cooperative launch). Each CTA keeps its token range's
// logits [rows][range] in shared memory. When its warps are done they fold
// the range as the fold kernel below folds a slice (a ControlPartial per
// CTA) and, in the same pass, the CTA publishes per row two real candidate
// keys of its range (the largest raw logits among allowed tokens, as keys
// of x) and the two largest raw logits. After a grid-wide barrier each
// row's keep-th largest published key (keep ≤ 64) bounds the row's keep-th
// best candidate from below: the CTA lists only its candidates at or above
// it, at most keep of them, usually none or a few. After a second barrier
// CTA b takes rows b, b + grid, ...: it ranks the row's short list, folds
// the CTAs' partials and writes the row's summary with the summary kernel's
// code (below), in the shared memory the logits held; no kernel of the
// pass follows the scan. Rows without a bound (keep > 64) list their
// range's best keep and the finish selects by radix. Rows that continue (top-p or
// min-p past the list) take their later passes over logits the same loop
// computes, so the values they rank are the first pass's. The lists live
// in the cuBLAS chunks' buffers; a call whose lists or CTA ranges do not
// fit, or with top-p or min-p but no top-k (every row would list its whole
// range), takes the chunks.
//
// Other calls take the cuBLAS chunk path: cuBLAS
// writes one vocabulary chunk of logits [rows, chunk] into the L2-sized
// workspace, and a fold kernel reduces each 4096-token slice of it per row
// to a ControlPartial (log-sum-exps of x and of the raw logits, the sample
// of an untruncated row, the drafted token's x and raw logit, the allowed
// count) and, for a row that top-k, top-p or min-p truncates, to the slice's
// best `keep` candidates by (x, then smaller id). A merge kernel keeps each
// row's best `keep` candidates across slices after every chunk, so a row
// holds at most FLASHSPEC_MAX_TOP_K candidates however large V is. The fold
// and merge of one chunk run on a side stream while cuBLAS writes the next
// chunk into a second buffer. After
// the last chunk one block per row ranks its candidates and applies the
// controls with the shared rules of sampling/controls.h:
//   - top-k ≤ FLASHSPEC_MAX_TOP_K: the kept set lies among the candidates;
//     its length and mass are summed in rank order as on the CPU;
//   - top-p or min-p without such a top-k: the kept set is found among the
//     FLASHSPEC_MAX_TOP_K best tokens, top-p's mass over all allowed tokens
//     from the row's log-sum-exp. A row whose kept set is larger continues:
//     a second pass over W sums the mass of the tokens ranked after its list
//     into kMassBins fixed-point bins of x below the row's largest x (integer
//     sums: the same bits whatever the order), which gives the bin where the
//     cumulative mass reaches top-p's target; a third pass collects that
//     bin's tokens as candidates (the cut is found among them in rank order)
//     and folds the Gumbel-max, mass and Σ p·x of the tokens above it. Only
//     a bin of more than kCandidates tokens around the cut still fails with
//     FLASHSPEC_ERR_UNSUPPORTED. The host reads back one flag after the
//     first pass (a synchronise, in every call with top-p or min-p) and runs
//     the two passes only when a row continues. Under stream capture it
//     cannot read it, so a captured call does not continue: such rows fail
//     with FLASHSPEC_ERR_UNSUPPORTED, as every larger kept set did before.
// The sample of a truncated row is the Gumbel-max over its kept prefix with
// the noise of the RNG contract, recomputed for those tokens only.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "flashspec.h"
#include "kernels/args.h"
#include "sampling/fold.h"
#include "sampling/row_summary.h"
#include "scan_gemm.h"
#include "tuning.h"

namespace flashspec {
namespace cuda {
namespace controls {

// The dynamic shared memory a block of each controlled streaming scan may
// take with its tuned number of blocks per SM resident, per stream shape
// and W dtype (bf16, fp16, e4m3, int8); configure() finds it once per
// context, so a call only compares.
struct ScanSmemLimits {
  size_t bytes[tuning::kStreamShapeCount][4];
};

constexpr int32_t kSliceTokens = 4096;                 // tokens per fold block
constexpr int32_t kCandidates = FLASHSPEC_MAX_TOP_K;   // candidates a row keeps
constexpr int32_t kMaxBiasEntries = 4096;              // bias entries per request the device sorts
constexpr int32_t kMaxVocabulary = 1 << 20;            // the partials hold this many tokens' slices
constexpr int32_t kMaxSlicesPerChunk = 16;             // cuBLAS chunks of at most 65536 tokens
constexpr int32_t kMassBins = 4096;                    // bins of the top-p mass histogram below x0
constexpr float kMassBinNats = 32.0f;                  // ... covering x0 − 32 < x ≤ x0 (the last bin: below)

// Device scratch of the controlled path, sized at context creation.
struct Workspace {
  int32_t max_rows;
  int32_t max_requests;           // per-request bias scratch (≥ max_rows: draft rows are requests)
  int32_t slices_per_chunk;       // chunk / kSliceTokens
  int32_t max_groups;             // slices over the whole vocabulary the partials hold
  void* partials;                 // [max_groups][max_rows] ControlPartial
  uint64_t* slice_keys;           // [max_rows][slices_per_chunk][kCandidates]
  float* slice_raws;
  int32_t* slice_counts;          // [max_rows][slices_per_chunk]
  uint64_t* merged_keys;          // [2][max_rows][kCandidates]
  float* merged_raws;
  int32_t* merged_counts;         // [2][max_rows]
  uint64_t* thresholds;           // [max_rows]: the keep-th best key so far, 0 if fewer
  uint64_t* top_slice_keys;       // the same for the top raw logits: [max_rows][slices_per_chunk][20]
  float* top_slice_raws;
  int32_t* top_slice_counts;
  uint64_t* top_merged_keys;      // [2][max_rows][20]
  float* top_merged_raws;
  int32_t* top_merged_counts;
  uint64_t* top_thresholds;
  int32_t* bias_tokens;           // [max_requests][kMaxBiasEntries] sorted, distinct
  float* bias_values;             // their summed values
  int32_t* bias_counts;           // [max_requests], −1: more entries than the device sorts
  // Rows whose kept set runs past their candidate list (top-p or min-p
  // beyond kCandidates tokens) continue in two more passes (controls.cu).
  void* continuations;            // [max_rows]
  void* band_partials;            // [max_groups][max_rows]
  uint64_t* histograms;           // [max_rows][kMassBins]: fixed-point mass per bin
  int32_t* continue_flag;         // 1 when a row of the last first pass continues
};

// Bytes of each array of a workspace for `max_rows` rows, `max_requests`
// requests and cuBLAS chunks of `chunk` tokens, laid out one after another.
size_t workspace_bytes(int32_t max_rows, int32_t max_requests, int32_t chunk);
Workspace carve_workspace(void* base, int32_t max_rows, int32_t max_requests, int32_t chunk);

// What one controlled pass needs besides the workspace.
struct Pass {
  const void* w;                  // LM head [vocab, ldw], bf16/fp16 (hidden staged alike), fp32,
  int64_t ldw;                    // or 8-bit codes (hidden staged in bf16)
  flashspec_dtype w_dtype;
  const float* w_scale;           // 8-bit codes: [vocab] row scales
  uint16_t* dequantized;          // 8-bit codes: gemm_scan's conversion workspace
  int32_t vocab;
  int32_t d;
  int32_t d_load;                 // columns read from each row of W
  const void* hidden;             // staged hidden rows [rows, k_pad]
  int32_t k_pad;
  int32_t rows;
  const RowPlan* plans;           // [rows]
  const int32_t* hidden_bad;      // [rows]
  ControlsArgs controls;          // per request
  int32_t requests;               // requests the controls' arrays index
  const int32_t* batch_status;    // verify: the plans' batch status; NULL for a draft call
  int32_t top_n;                  // top raw logprobs per row
  cublasHandle_t cublas;           // bound to the pass's stream
  gemm_scan::ChunkPipeline chunks;  // two buffers of [rows, chunk] (side NULL: the first only)
  int32_t chunk;
  // The controlled streaming scan (≤ tuning::kStreamMaxRows rows): whether
  // the hidden rows are staged for it (the tensor-core scans apply), the
  // device's SMs, the scans' shared-memory limits (configure), and the
  // scratch its lists may take (the chunk buffers: fused_scratch_bytes of
  // them).
  bool stream_scan;
  int sm_count;
  const ScanSmemLimits* smem_limits;
  void* fused_scratch;
  size_t fused_scratch_bytes;
};

// Lets the controlled streaming scans use the shared memory a block may opt
// in to (max_smem, less their static shared memory) and writes how much of
// it each may take at its tuned occupancy into *limits; once per context.
cudaError_t configure(size_t max_smem, ScanSmemLimits* limits);

// Where a controlled pass writes: verify summaries (and the top raw tokens
// and logprobs, [rows][top_n]), a draft call's outputs, or a top-k draft's
// (topk > 0: each row's topk best tokens by x and their log-probabilities,
// [rows][topk]; its plans are at temperature 1 and nothing truncates).
struct Outputs {
  RowSummary* summaries;
  int32_t* top_tokens;
  float* top_logprobs;
  int32_t* tokens_out;
  float* scores_out;
  int32_t topk;
  int32_t* topk_tokens;
  float* topk_logprobs;  // may be NULL
};

// Enqueues the pass on `stream`. Returns a CUDA error, or (cudaSuccess) a
// cuBLAS failure named in *cublas_failure.
cudaError_t run(const Workspace& ws, const Pass& pass, const Outputs& out, cudaStream_t stream,
                const char** cublas_failure);

}  // namespace controls
}  // namespace cuda
}  // namespace flashspec
