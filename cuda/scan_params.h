// What a scan launch is given. A scan launch is a persistent grid: CTA c
// serves row block c % row_blocks and the contiguous token range of group
// c / row_blocks. Each CTA leaves one Partial per row in
// partials[group * partial_stride + row]; the combine folds the groups in
// order (or the weight-streaming scan's last CTA does, StreamTail).
#pragma once

#include <cstdint>

#include "flashspec.h"
#include "sampling/fold.h"
#include "sampling/row_plan.h"
#include "sampling/row_summary.h"
#include "sampling/shard_record.h"
#include "warp_fold.cuh"

namespace flashspec {
namespace cuda {

// The stochastic drafts a row verifies, in the order they are tried
// (drafts_tried_at): tried[begin .. begin + count) of the call's list, which
// prepare::verify_plans writes; `own` is the draft of the tree node whose row
// this is (−1: a root or chain row), whose verdict its summary carries.
struct RowDrafts {
  int32_t begin;
  int32_t count;
  int32_t own;
  int32_t pad;
};

// A stochastic draft as the row that tries it judged it (written by the CTA
// whose token range holds the drafted token x): log r(x) − log q(x), r the
// running residual when x is tried, and log p(x) under that row's p.
struct DraftVerdict {
  float log_ratio;
  float logp;
};

// Stochastic drafts' inputs to a scan (cooperative launches only): dense q
// (draft_logits, row d for draft d) or sparse supports, the drafts each row
// tries, and where verdicts and the residual chain's partial sums go.
struct StochasticDrafts {
  const void* q_logits;            // dense: [drafts, q_ld] or NULL
  flashspec_dtype q_dtype;
  int64_t q_ld;
  const int32_t* support_offsets;  // sparse: [drafts + 1] or NULL
  const int32_t* support_tokens;
  const float* support_probs;
  const int32_t* draft_tokens;     // [drafts]
  const RowDrafts* row_drafts;     // [rows], by global row
  const int32_t* tried;            // [drafts]
  DraftVerdict* verdicts;          // [drafts]
  QPartial* level_partials;        // [2][groups][partial_stride]: the residual chain's sums
};

// An 8-bit head's staged hidden rows (at most tuning::kStreamMaxRows) as the
// 9–16-row TMA ring reads them: in its k order (ring_code_column,
// codes.cuh), [rows, ring_code_columns(k_pad)] 16-bit values each. bf16:
// the rows as they are. f16: row r times 2^k_r, k_r putting the row's
// largest magnitude in [2^15, 2^16), which f16 holds exactly where every
// nonzero value of the row is then at least 2^-14 (a row spanning at most
// 2^29); factors[r] = 2^-k_r there, else 0. Where every row's factor is
// nonzero the ring multiplies the f16 copy, converting codes to f16 in
// fewer instructions than to bf16 (codes.cuh), and the factor takes the
// scaling off the finished logit (exactly: a power of two).
struct RingHidden {
  uint16_t* bf16;
  uint16_t* f16;
  float* factors;
};

// An 8-bit head's staged hidden rows as the tile scan (scan_tiles.h) reads
// them where its products are in f16: [rows, k_pad] f16 values in W's k
// order, row r times 2^k_r with factors[r] = 2^-k_r, or 0 where f16 cannot
// hold the row exactly (the rule of RingHidden's f16 copy). A CTA whose
// tile of rows all have factors multiplies in f16; one with a row that
// has none multiplies the bf16 rows.
struct TileHidden {
  uint16_t* f16;
  float* factors;
};

struct ScanParams {
  const void* w;          // LM head, [vocab, ldw]
  int64_t ldw;            // elements per weight row
  flashspec_dtype w_dtype;
  const float* w_scale;   // 8-bit codes: [vocab] row scales, each logit's factor; else NULL
  int32_t vocab;
  int32_t token_base;     // global id of W's first row (a vocabulary shard's vocab_begin, else 0):
                          // folds, noise and candidates use global ids
  int32_t d_load;         // columns read from W (multiple of 8 on the mma path)
  int32_t k_pad;          // staged hidden columns (multiple of 32; of 64 for 8-bit codes), zero beyond d
  const void* h;          // staged hidden rows, [total rows, k_pad]
  RingHidden ring_hidden;  // 8-bit codes at 9–16 rows: the TMA ring's copies of the rows; NULL where not staged
  TileHidden tile_hidden;  // 8-bit codes from 17 rows: the tile scan's f16 copies of the rows; NULL where not staged
  int32_t rows;           // rows in this launch
  int32_t row_base;       // first global row of this launch
  const RowPlan* plans;   // indexed by global row
  const float* gumbel_bounds;  // [256] sampling/gumbel_bounds.h, for folds that skip noise that cannot matter
  Partial* partials;      // [groups][partial_stride]
  int32_t partial_stride;
  int32_t groups;
  int32_t row_blocks;
  // Stochastic drafts (cooperative launches only).
  int32_t stochastic;
  StochasticDrafts drafts;
  QPartial* q_partials;   // [groups][partial_stride], by draft index: q's log-sum-exp
  Residual* residuals;    // [groups][partial_stride], by row
  int32_t slice;          // kept tokens per row in shared memory
};

// Where the weight-streaming scan's last CTA writes the combined rows (it
// combines its own rows, so no combine kernel follows it): verify summaries,
// draft outputs, or a shard's records.
struct StreamTail {
  int32_t* done_counter;        // device int, 0 between launches
  const int32_t* hidden_bad;    // [rows] from the staging kernel
  const int32_t* batch_status;  // verify: the batch-level status; NULL for a draft
  RowSummary* summaries;        // verify: output
  int32_t* tokens_out;          // draft: output
  float* scores_out;            // draft: output, may be NULL
  ShardRecord* records;         // shard calls: the output instead of the two above
  int32_t vocab_size;           // shard calls: the global vocabulary
};

}  // namespace cuda
}  // namespace flashspec
