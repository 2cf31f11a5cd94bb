// The structs behind the opaque handles of flashspec.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "flashspec.h"
#include "kernels/backend.h"

namespace flashspec {
// What finalize checks a batch against: a fingerprint of the host-visible
// arrays that the verify pass and finalize both read (offsets, tokens,
// temperatures, seeds, request ids, steps). Unknown for device-memory batches.
struct VerifiedBatch {
  bool known = false;
  uint64_t fingerprint = 0;
};
}  // namespace flashspec

struct flashspec_context {
  std::unique_ptr<flashspec::Backend> backend;
  std::unique_ptr<flashspec::SummaryStore> own_summaries;  // for verify_and_finalize
  flashspec::VerifiedBatch own_verified;                   // what own_summaries describe
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
  flashspec::VerifiedBatch verified;  // what store describes
};
