// The structs of flashspec.h that start with struct_size, across library
// versions. They only ever grow at their end, so a caller built against an
// older header passes a shorter struct: the library reads the prefix that
// caller knows and keeps the defaults of the rest; a struct the library
// fills is written only as far as the caller's struct_size.
#pragma once

#include <cstddef>
#include <cstring>
#include <string>

#include "flashspec.h"
#include "util/status.h"

namespace flashspec {

// The size of T's first published layout: sizeof(T) for a struct that has
// not grown since; a grown struct specialises this with the sizeof of a
// frozen copy of its first layout, so callers of either header keep working.
template <class T>
struct FirstLayout {
  static constexpr size_t size = sizeof(T);
};

// The 0.1 layouts of the structs that grew in 0.2 (sampling controls and
// logprobs appended).
namespace layout_0_1 {
struct DraftParams {
  uint32_t struct_size;
  flashspec_memory memory;
  float temperature;
  const float* temperatures;
  const uint64_t* seeds;
  const uint64_t* request_ids;
  const uint64_t* steps;
  const int32_t* positions;
};
struct VerifyBatch {
  uint32_t struct_size;
  flashspec_memory memory;
  int32_t num_requests;
  const int32_t* draft_offsets;
  const int32_t* draft_tokens;
  const flashspec_tensor* target_hidden;
  const flashspec_tensor* draft_logits;
  const float* temperatures;
  const float* draft_temperatures;
  const uint64_t* seeds;
  const uint64_t* request_ids;
  const uint64_t* steps;
  const float* accept_uniforms;
  int32_t max_draft_len;
};
struct VerifyResult {
  uint32_t struct_size;
  flashspec_memory memory;
  int32_t* accepted_counts;
  int32_t* emitted_tokens;
  uint64_t* next_steps;
};
}  // namespace layout_0_1

// The 0.2 layout of flashspec_engine_params (draft_len_rule appended in 0.3).
namespace layout_0_2 {
struct EngineParams {
  uint32_t struct_size;
  flashspec_target_forward_fn target_forward;
  flashspec_target_rollback_fn target_rollback;
  void* target_user_data;
  flashspec_drafter* const* drafters;
  int32_t num_drafters;
  const flashspec_arm* arms;
  int32_t num_arms;
  int32_t default_draft_len;
  flashspec_bandit_policy policy;
  uint64_t bandit_seed;
  double ucb_exploration;
  int32_t fixed_arm;
  const double* oracle_rewards;
  double target_step_cost;
  double target_row_cost;
  int32_t max_context;
};
}  // namespace layout_0_2

template <>
struct FirstLayout<flashspec_draft_params> {
  static constexpr size_t size = sizeof(layout_0_1::DraftParams);
};
template <>
struct FirstLayout<flashspec_verify_batch> {
  static constexpr size_t size = sizeof(layout_0_1::VerifyBatch);
};
template <>
struct FirstLayout<flashspec_verify_result> {
  static constexpr size_t size = sizeof(layout_0_1::VerifyResult);
};
template <>
struct FirstLayout<flashspec_engine_params> {
  static constexpr size_t size = sizeof(layout_0_2::EngineParams);
};
// Past the 0.2 struct's tail padding too: a 0.2 struct_size must not cover
// any appended field.
static_assert(offsetof(flashspec_engine_params, draft_len_memory) >= sizeof(layout_0_2::EngineParams),
              "appended only");
static_assert(offsetof(flashspec_draft_params, controls) >= sizeof(layout_0_1::DraftParams), "appended only");
static_assert(offsetof(flashspec_verify_batch, controls) >= sizeof(layout_0_1::VerifyBatch), "appended only");
static_assert(offsetof(flashspec_verify_result, logprobs) >= sizeof(layout_0_1::VerifyResult), "appended only");

// A struct_size between T's first published size and today's.
template <class T>
void check_struct_size(uint32_t given, const std::string& argument) {
  const size_t first = FirstLayout<T>::size, current = sizeof(T);
  if (given >= first && given <= current) return;
  const std::string accepted = first == current ? "expected " + std::to_string(current)
                                                : "expected " + std::to_string(first) + " to " + std::to_string(current);
  fail(FLASHSPEC_ERR_STRUCT_SIZE, argument + "->struct_size: is " + std::to_string(given) + ", " + accepted +
                                      " (call the matching *_init first)");
}

// *given as today's T: its first struct_size bytes over the defaults that
// `init` fills in a whole T (for a struct that has grown, a lambda calling
// its *_init macro, not the 0.1 *_init symbol). `argument` names the struct
// ("params", "batch").
template <class T, class Init>
T load_struct(const T* given, Init init, const std::string& argument) {
  require(given != nullptr, FLASHSPEC_ERR_NULL_POINTER, argument.c_str(), "is NULL");
  check_struct_size<T>(given->struct_size, argument);
  T loaded;
  init(&loaded);
  std::memcpy(static_cast<void*>(&loaded), static_cast<const void*>(given), given->struct_size);
  loaded.struct_size = sizeof(T);
  return loaded;
}

// The same where NULL means "all defaults".
template <class T, class Init>
T load_struct_or_defaults(const T* given, Init init, const std::string& argument) {
  if (given) return load_struct(given, init, argument);
  T defaults;
  init(&defaults);
  return defaults;
}

// The defaults of an *_init_sized call: `defaults` written into *out as far
// as `size` bytes (at most sizeof(T)), with struct_size the bytes written.
// NULL, or a size without room for struct_size, writes nothing.
template <class T>
void init_prefix(T* out, size_t size, T defaults) {
  if (!out || size < sizeof(uint32_t)) return;
  const size_t bytes = size < sizeof(T) ? size : sizeof(T);
  defaults.struct_size = uint32_t(bytes);
  std::memcpy(static_cast<void*>(out), static_cast<const void*>(&defaults), bytes);
}

// Writes `value` into the caller's *out, as far as out->struct_size (checked
// with check_struct_size before any work).
template <class T>
void store_struct(const T& value, T* out) {
  const uint32_t size = out->struct_size;
  std::memcpy(static_cast<void*>(out), static_cast<const void*>(&value), size);
  out->struct_size = size;
}

}  // namespace flashspec
