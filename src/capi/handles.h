// The structs behind the opaque handles of flashspec.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "flashspec.h"
#include "kernels/backend.h"

namespace flashspec {
// What the last verify into a summaries object described, so finalize can
// refuse a batch the summaries do not describe: its shape, and a fingerprint
// of the host-visible arrays that verify and finalize both read (offsets,
// tokens, temperatures, seeds, request ids, steps; unknown for device-memory
// batches).
struct VerifiedBatch {
  int64_t vocab = 0;
  int32_t rows = 0;
  int32_t requests = 0;
  bool fingerprint_known = false;
  uint64_t fingerprint = 0;
  bool logprobs = false;      // kept what the emitted tokens' logprobs need
  int32_t top_logprobs = 0;   // top raw-logit tokens kept per row
};
}  // namespace flashspec

struct flashspec_context {
  std::unique_ptr<flashspec::Backend> backend;
  std::unique_ptr<flashspec::SummaryStore> own_summaries;  // for verify_and_finalize
  std::string last_error;
  int last_cuda_error = 0;
  uint64_t seed = 0;
  int32_t max_rows = 0;
  int32_t max_requests = 0;
};

struct flashspec_lm_head {
  std::unique_ptr<flashspec::LmHeadStorage> storage;
};

struct flashspec_summaries {
  std::unique_ptr<flashspec::SummaryStore> store;
  const flashspec_context* owner = nullptr;  // the context that created them, the only one that may use them
  flashspec::VerifiedBatch verified;  // what store describes
};
