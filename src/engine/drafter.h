// The drafter interface: something that proposes the next few tokens of a
// sequence. The engine owns the loop; a drafter only proposes.
#pragma once

#include <cstdint>
#include <vector>

#include "bandit/reward.h"
#include "engine/lm_head_runner.h"
#include "flashspec.h"

namespace flashspec {

struct DraftRequest {
  const int32_t* context;  // the sequence so far: prompt, then emitted tokens
  int32_t length;
  int32_t max_tokens;      // propose at most this many, ≥ 1
  int64_t vocab;           // every proposed token must lie in [0, vocab)
  uint64_t step;           // the engine's step within the generation
};

struct DraftProposal {
  std::vector<int32_t> tokens;  // 0..max_tokens tokens
  // Empty: the tokens are a chain. Else a tree of point-mass drafts: node
  // i's parent, in [−1, i) (−1: the last context token).
  std::vector<int32_t> parents;
  // A stochastic draft: row j holds the logits token j was sampled from,
  // q = softmax(row / temperature). Point-mass drafts leave has_logits false.
  bool has_logits = false;
  flashspec_tensor logits{};
  float temperature = 1.0f;

  void clear() {
    tokens.clear();
    parents.clear();
    has_logits = false;
    logits = flashspec_tensor{};
    temperature = 1.0f;
  }
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  // A new sequence starts with this prompt.
  virtual void begin(const int32_t* prompt, int32_t length) = 0;
  // Proposes tokens to follow request.context. Between two begin() calls the
  // context only grows (its earlier tokens never change). Throws
  // flashspec::Error (FLASHSPEC_ERR_CALLBACK for a failing host callback).
  virtual void propose(const DraftRequest& request, LmHeadRunner& runner, DraftProposal& out) = 0;
  // The generation begun by the last begin() ended (finished or failed)
  // with this sequence: the prompt, then every token emitted. A drafter that
  // learns across generations reads it here; the default ignores it.
  virtual void finish(const int32_t* sequence, int32_t length) {
    (void)sequence;
    (void)length;
  }
  virtual DrafterCost cost() const = 0;
};

}  // namespace flashspec
