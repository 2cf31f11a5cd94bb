// How the engine reaches FlashSpec's fused LM head: the context's backend,
// driven through its internal interface (kernels/backend.h) with arguments
// the engine builds valid by construction. The engine keeps its index arrays
// (draft offsets and tokens, per-request values, results) on the host; for a
// device backend they are staged through one small buffer of the backend's
// memory, reserved with the engine, and the results copied back.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "flashspec.h"
#include "kernels/backend.h"

namespace flashspec {

// One sequence's verify: n drafts scored by n + 1 target hidden rows.
struct SequenceVerify {
  const int32_t* drafts;                  // [n], host memory, in [0, V)
  const int32_t* parents;                 // [n], host memory, a valid tree; NULL: a chain
  int32_t num_drafts;                     // n ≤ max_rows − 1
  const flashspec_tensor* hidden;         // [n + 1, d], the backend's memory, checked
  const flashspec_tensor* draft_logits;   // [n, V] of a stochastic draft, checked, or NULL
  float temperature;                      // ≥ 0, finite
  float draft_temperature;                // > 0, finite
  uint64_t seed, request_id, step;
};

// A ragged batch of sequences verified in one pass: request r's rows follow
// those of the requests before it (num_drafts + 1 each), and its drafts
// theirs. The requests' own hidden and draft_logits are not read. If any
// request is a tree, the pass verifies every request as a tree (a chain's
// parents are k − 1): one pass takes parents for all requests or for none.
struct BatchVerify {
  const SequenceVerify* requests;        // [count]
  int32_t count;                         // 1 ≤ count ≤ max_requests
  const flashspec_tensor* hidden;        // [Σ (n_r + 1), d] ≤ max_rows rows, checked
  const flashspec_tensor* draft_logits;  // [Σ n_r, V] of stochastic drafts, checked, or NULL
};

class LmHeadRunner {
 public:
  // The backend, max_rows and max_requests bound a verify batch (within the
  // context's); default_seed is the context's seed.
  LmHeadRunner(Backend& backend, int32_t max_rows, int32_t max_requests, uint64_t default_seed);
  ~LmHeadRunner();
  LmHeadRunner(const LmHeadRunner&) = delete;
  LmHeadRunner& operator=(const LmHeadRunner&) = delete;

  // Where hidden rows and logits must live for this backend.
  flashspec_memory memory() const { return backend_memory(backend_); }

  // Greedy fused draft: tokens_out[r] (host) = argmax of hidden row r · Wᵀ.
  // hidden has been checked (rows ≤ max_rows, head's hidden size).
  void draft_greedy(const LmHeadStorage& head, const flashspec_tensor& hidden, int32_t* tokens_out);

  // Verify and finalize one sequence (Algorithm 1, or the tree walk);
  // emitted[0 .. n] (host) receives the accepted drafts and one more token,
  // accepted_nodes[0 .. n] (host; a tree's, else untouched) the accepted
  // path's node indices, −1 past it. Returns the accepted count (a tree's
  // path depth). Errors carry the backend's Field tags.
  int32_t verify(const LmHeadStorage& head, const SequenceVerify& request, int32_t* emitted,
                 int32_t* accepted_nodes);

  // Verify and finalize a ragged batch in one pass: accepted[r] (host) gets
  // request r's accepted count (−1: a device backend found a row not
  // finite), emitted (host, one slot per row) its accepted drafts and one
  // more token at the offset of its first row, and, when the pass verified
  // trees, accepted_nodes (host, one slot per row) its path's node indices
  // there. Returns whether the pass verified trees.
  bool verify_batch(const LmHeadStorage& head, const BatchVerify& batch, int32_t* accepted, int32_t* emitted,
                    int32_t* accepted_nodes);

 private:
  // Byte offsets of the staged arrays; inputs first, so one copy stages them.
  struct Layout {
    size_t offsets, tokens, parents, temperatures, draft_temperatures, seeds, request_ids, steps, inputs_end,
        accepted, emitted, accepted_nodes, bytes;
  };
  unsigned char* staged() const { return static_cast<unsigned char*>(staging_); }

  Backend& backend_;
  int32_t max_rows_;
  int32_t max_requests_;
  uint64_t default_seed_;
  std::unique_ptr<SummaryStore> summaries_;
  Layout layout_{};
  void* staging_ = nullptr;          // the backend's memory; NULL for a host backend
  std::vector<unsigned char> host_;  // the staged arrays' host image (on every backend)
};

}  // namespace flashspec
