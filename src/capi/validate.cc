#include "capi/validate.h"

#include "capi/params.h"

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "sampling/draft_support.h"
#include "util/dtype.h"
#include "util/status.h"

namespace flashspec {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

bool known_memory(const flashspec_memory& m) {
  const int32_t raw = raw_enum(m);
  return raw == FLASHSPEC_MEMORY_HOST || raw == FLASHSPEC_MEMORY_CUDA;
}

void validate_memory(const flashspec_memory& given, const Backend& backend, const char* argument) {
  require(known_memory(given), FLASHSPEC_ERR_INVALID_ARGUMENT, argument,
          "unknown flashspec_memory value " + str(raw_enum(given)));
  require(given == backend_memory(backend), FLASHSPEC_ERR_DEVICE_MISMATCH, argument,
          given == FLASHSPEC_MEMORY_HOST ? "host memory given to the CUDA backend, which reads device memory"
                                         : "device memory given to the CPU backend, which reads host memory");
}

// Optional per-request float array (host): each value a valid temperature.
void check_temperatures(const float* values, int32_t count, bool strictly_positive, const char* argument) {
  if (!values) return;
  for (int32_t i = 0; i < count; ++i) {
    float t = values[i];
    require(!std::isnan(t), FLASHSPEC_ERR_INVALID_ARGUMENT, argument, "entry " + str(i) + " is NaN");
    require(std::isfinite(t), FLASHSPEC_ERR_INVALID_ARGUMENT, argument, "entry " + str(i) + " is infinite");
    if (strictly_positive)
      require(t > 0.0f, FLASHSPEC_ERR_INVALID_ARGUMENT, argument, "entry " + str(i) + " must be > 0");
    else
      require(t >= 0.0f, FLASHSPEC_ERR_INVALID_ARGUMENT, argument, "entry " + str(i) + " must be >= 0");
  }
}

// The bytes an array or tensor occupies, for the aliasing rule.
struct Span {
  std::string name;
  uintptr_t begin;
  size_t bytes;
};

Span array_span(std::string name, const void* data, int64_t count, size_t element) {
  return Span{std::move(name), reinterpret_cast<uintptr_t>(data), data ? size_t(count) * element : 0};
}

Span tensor_span(const char* name, const flashspec_tensor* t) {
  if (!t || !t->data || t->rows == 0) return Span{name, 0, 0};
  const int64_t elements = (t->rows - 1) * t->row_stride + t->cols;
  return Span{name, reinterpret_cast<uintptr_t>(t->data), size_t(elements) * dtype_size(t->dtype)};
}

bool overlap(const Span& a, const Span& b) {
  return a.bytes && b.bytes && a.begin < b.begin + b.bytes && b.begin < a.begin + a.bytes;
}

// An output must not share memory with anything else the call reads or
// writes: the backends read inputs while writing outputs (on a GPU, in
// other threads), so an overlap would change the result.
template <class Spans>
void require_disjoint(const Span& output, const Spans& others) {
  for (const Span& other : others)
    require(!overlap(output, other), FLASHSPEC_ERR_INVALID_ARGUMENT, output.name.c_str(),
            "overlaps " + other.name + " (outputs may not alias the call's other arrays)");
}

void require_disjoint(const Span& output, std::initializer_list<Span> others) {
  require_disjoint<std::initializer_list<Span>>(output, others);
}

// Host draft tokens lie in [0, vocab).
void check_draft_tokens(const int32_t* tokens, int32_t count, int64_t vocab) {
  for (int32_t k = 0; k < count; ++k)
    require(tokens[k] >= 0 && tokens[k] < vocab, FLASHSPEC_ERR_OUT_OF_RANGE, "batch->draft_tokens",
            "entry " + str(k) + " is " + str(tokens[k]) + ", outside [0, " + str(vocab) + ")");
}

// A host batch's sparse draft distributions (flashspec.h, "Sparse draft
// distributions"): per draft row 1..FLASHSPEC_MAX_DRAFT_SUPPORT distinct
// tokens in [0, V) with finite probabilities ≥ 0 summing to 1 within
// FLASHSPEC_DRAFT_SUPPORT_TOLERANCE, the drafted token among them with q > 0.
// The drafted tokens are in range already.
void check_draft_supports(const VerifyArgs& a, int64_t vocab) {
  if (!a.support_offsets) return;
  const int32_t* off = a.support_offsets;
  require(off[0] == 0, FLASHSPEC_ERR_OUT_OF_RANGE, "batch->draft_support_offsets",
          "entry 0 must be 0, got " + str(off[0]));
  for (int32_t k = 0; k < a.total_drafts; ++k) {
    const int64_t count = int64_t(off[k + 1]) - int64_t(off[k]);
    require(count >= 1 && count <= FLASHSPEC_MAX_DRAFT_SUPPORT, FLASHSPEC_ERR_OUT_OF_RANGE,
            "batch->draft_support_offsets",
            "draft row " + str(k) + " has " + str(count) + " support tokens, expected 1.." +
                str(FLASHSPEC_MAX_DRAFT_SUPPORT));
  }
  for (int32_t k = 0; k < a.total_drafts; ++k) {
    int32_t e = 0;
    double sum = 0.0;
    const SupportFault fault = support_row_fault(a.support_tokens, a.support_probs, off[k], off[k + 1],
                                                 a.draft_tokens[k], vocab, &e, &sum);
    const auto status = flashspec_status(support_fault_status(fault));
    auto refuse = [status](const char* argument, const std::string& why) { require(false, status, argument, why); };
    const std::string where = "entry " + str(e) + " (draft row " + str(k) + ")";
    switch (fault) {
      case SupportFault::kNone:
      case SupportFault::kCount:  // checked above
        break;
      case SupportFault::kTokenRange:
        refuse("batch->draft_support_tokens",
               where + " is " + str(a.support_tokens[e]) + ", outside [0, " + str(vocab) + ")");
        break;
      case SupportFault::kDuplicate:
        refuse("batch->draft_support_tokens",
               "draft row " + str(k) + " names token " + str(a.support_tokens[e]) + " twice (entry " + str(e) + ")");
        break;
      case SupportFault::kNonFinite:
        refuse("batch->draft_support_probs", where + " is not finite");
        break;
      case SupportFault::kNegative:
        refuse("batch->draft_support_probs", where + " is negative");
        break;
      case SupportFault::kSum:
        refuse("batch->draft_support_probs",
               "draft row " + str(k) + " sums to " + std::to_string(sum) + ", not 1 within " +
                   std::to_string(FLASHSPEC_DRAFT_SUPPORT_TOLERANCE));
        break;
      case SupportFault::kDraftedMissing:
      case SupportFault::kDraftedZero:
        refuse("batch->draft_tokens",
               "entry " + str(k) + " (token " + str(a.draft_tokens[k]) + ") " +
                   (fault == SupportFault::kDraftedMissing ? "is not in its row's draft support"
                                                           : "has q = 0 in its row's draft support"));
        break;
    }
  }
}

// Checks of a controls struct that need no vocabulary: struct_size and the
// host values of the per-request arrays (the CUDA backend checks device
// values on the device). `rows` is the
// number of mask rows. The vocabulary-dependent checks follow in
// check_controls_for_vocab.
ControlsArgs load_controls(const flashspec_sampling_controls* given, int32_t requests,
                           bool host, bool allow_typical, const std::string& argument) {
  ControlsArgs a;
  if (!given) return a;
  const flashspec_sampling_controls c = load_struct(given, flashspec_sampling_controls_init, argument);
  auto name = [&argument](const char* field) { return argument + "->" + field; };
  if (!allow_typical)
    require(!c.typical_epsilon && !c.typical_delta, FLASHSPEC_ERR_INVALID_ARGUMENT, name("typical_epsilon").c_str(),
            "typical acceptance applies to a verify's target rows only (batch->controls)");
  require(c.typical_epsilon || !c.typical_delta, FLASHSPEC_ERR_INVALID_ARGUMENT, name("typical_delta").c_str(),
          "is given without typical_epsilon");
  require(c.bias_offsets || (!c.bias_tokens && !c.bias_values), FLASHSPEC_ERR_INVALID_ARGUMENT,
          name("bias_offsets").c_str(), "is NULL while bias_tokens or bias_values are given");
  require(c.mask_words >= 0, FLASHSPEC_ERR_OUT_OF_RANGE, name("mask_words").c_str(),
          "must be >= 0, got " + str(c.mask_words));
  if (host) {
    auto check_each = [&](const float* values, const char* field, bool (*ok)(float), const char* range) {
      if (!values) return;
      for (int32_t r = 0; r < requests; ++r)
        require(ok(values[r]), FLASHSPEC_ERR_INVALID_ARGUMENT, name(field).c_str(),
                "entry " + str(r) + " is " + std::to_string(values[r]) + ", must lie in " + range);
    };
    check_each(c.top_p, "top_p", [](float v) { return v > 0.0f && v <= 1.0f; }, "(0, 1]");
    check_each(c.min_p, "min_p", [](float v) { return v >= 0.0f && v <= 1.0f; }, "[0, 1]");
    check_each(c.typical_epsilon, "typical_epsilon", [](float v) { return v >= 0.0f && v <= 1.0f; }, "[0, 1]");
    check_each(c.typical_delta, "typical_delta", [](float v) { return v >= 0.0f && std::isfinite(v); }, "[0, inf)");
    check_each(c.repetition_penalty, "repetition_penalty", [](float v) { return v > 0.0f && std::isfinite(v); },
               "(0, inf)");
    if (c.top_k)
      for (int32_t r = 0; r < requests; ++r)
        require(c.top_k[r] >= 1, FLASHSPEC_ERR_OUT_OF_RANGE, name("top_k").c_str(),
                "entry " + str(r) + " is " + str(c.top_k[r]) + ", must be >= 1 (FLASHSPEC_TOP_K_ALL keeps every token)");
    if (c.bias_offsets) {
      const int32_t* off = c.bias_offsets;
      require(off[0] == 0, FLASHSPEC_ERR_OUT_OF_RANGE, name("bias_offsets").c_str(),
              "entry 0 must be 0, got " + str(off[0]));
      for (int32_t r = 0; r < requests; ++r)
        require(off[r + 1] >= off[r], FLASHSPEC_ERR_OUT_OF_RANGE, name("bias_offsets").c_str(),
                "decreases at entry " + str(r + 1) + " (" + str(off[r]) + " then " + str(off[r + 1]) + ")");
      if (off[requests] > 0) {
        require(c.bias_tokens != nullptr, FLASHSPEC_ERR_NULL_POINTER, name("bias_tokens").c_str(),
                "is NULL while bias_offsets name " + str(off[requests]) + " entries");
        require(c.bias_values != nullptr, FLASHSPEC_ERR_NULL_POINTER, name("bias_values").c_str(),
                "is NULL while bias_offsets name " + str(off[requests]) + " entries");
      }
      for (int32_t k = 0; k < off[requests]; ++k)
        require(std::isfinite(c.bias_values[k]), FLASHSPEC_ERR_INVALID_ARGUMENT, name("bias_values").c_str(),
                "entry " + str(k) + " is not finite");
    }
  }
  a.present = true;
  a.top_k = c.top_k;
  a.top_p = c.top_p;
  a.min_p = c.min_p;
  a.bias_offsets = c.bias_offsets;
  a.bias_tokens = c.bias_tokens;
  a.bias_values = c.bias_values;
  a.token_mask = c.token_mask;
  a.mask_words = c.mask_words;
  a.typical_epsilon = c.typical_epsilon;
  a.typical_delta = c.typical_delta;
  a.repetition_penalty = c.repetition_penalty;
  return a;
}

int32_t mask_words_for(int64_t vocab) { return int32_t((vocab + 31) / 32); }

// The checks of loaded controls against the vocabulary: top-k's bound, bias
// token ids, the mask's size and that each of its `mask_rows` rows allows a
// token. Resolves mask_words.
void check_controls_for_vocab(ControlsArgs& a, int32_t requests, int64_t mask_rows, int64_t vocab, bool host,
                              const std::string& argument) {
  if (!a.present) return;
  auto name = [&argument](const char* field) { return argument + "->" + field; };
  const int32_t words = mask_words_for(vocab);
  if (a.token_mask) {
    require(a.mask_words == 0 || a.mask_words == words, FLASHSPEC_ERR_OUT_OF_RANGE, name("mask_words").c_str(),
            "is " + str(a.mask_words) + ", a vocabulary of " + str(vocab) + " tokens needs " + str(words) +
                " words per row (or 0)");
  }
  a.mask_words = words;
  if (!host) return;
  if (a.top_k)
    for (int32_t r = 0; r < requests; ++r)
      require(a.top_k[r] <= FLASHSPEC_MAX_TOP_K || a.top_k[r] >= vocab, FLASHSPEC_ERR_OUT_OF_RANGE,
              name("top_k").c_str(),
              "entry " + str(r) + " is " + str(a.top_k[r]) + ": top-k truncates up to FLASHSPEC_MAX_TOP_K (" +
                  str(FLASHSPEC_MAX_TOP_K) + "); FLASHSPEC_TOP_K_ALL (or >= V) keeps every token");
  if (a.bias_offsets)
    for (int32_t k = 0; k < a.bias_offsets[requests]; ++k)
      require(a.bias_tokens[k] >= 0 && a.bias_tokens[k] < vocab, FLASHSPEC_ERR_OUT_OF_RANGE,
              name("bias_tokens").c_str(),
              "entry " + str(k) + " is " + str(a.bias_tokens[k]) + ", outside [0, " + str(vocab) + ")");
  if (a.token_mask)
    for (int64_t row = 0; row < mask_rows; ++row) {
      const uint32_t* m = a.token_mask + row * words;
      bool any = false;
      for (int32_t w = 0; w < words && !any; ++w) {
        const int64_t valid_bits = std::min<int64_t>(32, vocab - int64_t(w) * 32);
        const uint32_t valid = valid_bits == 32 ? 0xffffffffu : ((1u << valid_bits) - 1u);
        any = (m[w] & valid) != 0;
      }
      require(any, FLASHSPEC_ERR_INVALID_ARGUMENT, name("token_mask").c_str(),
              "row " + str(row) + " allows no token");
    }
}

// The bytes of a controls struct's arrays (host: the bias list's length is
// read from its offsets; device: its offsets only).
void add_controls_spans(const ControlsArgs& a, const char* prefix, int32_t requests, int64_t mask_rows, bool host,
                        std::vector<Span>& out) {
  if (!a.present) return;
  const int64_t bias = (a.bias_offsets && host) ? a.bias_offsets[requests] : 0;
  auto add = [&](const char* field, const void* data, int64_t count, size_t element) {
    out.push_back(array_span(std::string(prefix) + "->" + field, data, count, element));
  };
  add("top_k", a.top_k, requests, sizeof(int32_t));
  add("top_p", a.top_p, requests, sizeof(float));
  add("min_p", a.min_p, requests, sizeof(float));
  add("bias_offsets", a.bias_offsets, requests + 1, sizeof(int32_t));
  add("bias_tokens", a.bias_tokens, bias, sizeof(int32_t));
  add("bias_values", a.bias_values, bias, sizeof(float));
  add("token_mask", a.token_mask, mask_rows * a.mask_words, sizeof(uint32_t));
  add("typical_epsilon", a.typical_epsilon, requests, sizeof(float));
  add("typical_delta", a.typical_delta, requests, sizeof(float));
  add("repetition_penalty", a.repetition_penalty, requests, sizeof(float));
}

// FNV-1a of a host batch's offsets, tokens and effective per-request values.
uint64_t fingerprint(const VerifyArgs& args) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const void* data, size_t bytes) {
    const unsigned char* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  };
  mix(&args.num_requests, sizeof args.num_requests);
  mix(args.draft_offsets, sizeof(int32_t) * size_t(args.num_requests + 1));
  if (args.total_drafts > 0) mix(args.draft_tokens, sizeof(int32_t) * size_t(args.total_drafts));
  const int32_t tree = args.draft_parents != nullptr;
  mix(&tree, sizeof tree);
  if (tree && args.total_drafts > 0) mix(args.draft_parents, sizeof(int32_t) * size_t(args.total_drafts));
  for (int32_t r = 0; r < args.num_requests; ++r) {
    const RequestView v = request_view(args, r);
    const float t = v.temperature == 0.0f ? 0.0f : v.temperature;  // −0 and +0 are the same greedy request
    mix(&t, sizeof t);
    mix(&v.seed, sizeof v.seed);
    mix(&v.request_id, sizeof v.request_id);
    mix(&v.step, sizeof v.step);
  }
  return h;
}

// The checks of a batch that need no head. total_rows comes from
// target_hidden; host offsets are checked against it.
VerifyArgs validate_batch_common(const flashspec_context& ctx, const flashspec_verify_batch& b) {
  const flashspec_verify_batch* batch = &b;
  const Backend& backend = *ctx.backend;
  validate_memory(batch->memory, backend, "batch->memory");
  const int32_t requests = batch->num_requests;
  require(requests >= 1, FLASHSPEC_ERR_OUT_OF_RANGE, "batch->num_requests", "must be >= 1, got " + str(requests));
  require(requests <= ctx.max_requests, FLASHSPEC_ERR_WORKSPACE_EXCEEDED, "batch->num_requests",
          str(requests) + " exceeds the context's max_requests " + str(ctx.max_requests));
  require(batch->draft_offsets != nullptr, FLASHSPEC_ERR_NULL_POINTER, "batch->draft_offsets", "is NULL");
  require(batch->target_hidden != nullptr, FLASHSPEC_ERR_NULL_POINTER, "batch->target_hidden", "is NULL");
  validate_tensor(batch->target_hidden, "batch->target_hidden");
  validate_memory(batch->target_hidden->memory, backend, "batch->target_hidden->memory");

  const int64_t total_rows = batch->target_hidden->rows;
  require(total_rows >= requests, FLASHSPEC_ERR_OUT_OF_RANGE, "batch->target_hidden",
          "has " + str(total_rows) + " rows, fewer than num_requests " + str(requests));
  require(total_rows <= std::numeric_limits<int32_t>::max() / 2, FLASHSPEC_ERR_OUT_OF_RANGE,
          "batch->target_hidden", "too many rows: " + str(total_rows));
  const int32_t total_drafts = int32_t(total_rows - requests);
  int32_t max_draft_len = batch->max_draft_len == 0 ? FLASHSPEC_MAX_DRAFT_LEN : batch->max_draft_len;
  require(max_draft_len >= 1 && max_draft_len <= FLASHSPEC_MAX_DRAFT_LEN, FLASHSPEC_ERR_OUT_OF_RANGE,
          "batch->max_draft_len",
          "must be in [1, " + str(FLASHSPEC_MAX_DRAFT_LEN) + "] (or 0 for the default), got " + str(max_draft_len));
  if (total_drafts > 0)
    require(batch->draft_tokens != nullptr, FLASHSPEC_ERR_NULL_POINTER, "batch->draft_tokens",
            "is NULL while target_hidden implies " + str(total_drafts) + " draft tokens");

  require(batch->greedy == 0 || batch->greedy == 1, FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->greedy",
          "must be 0 or 1, got " + str(batch->greedy));
  require(!batch->greedy || !batch->temperatures, FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->temperatures",
          "must be NULL when batch->greedy is 1 (every request's temperature is 0)");

  const bool host = batch->memory == FLASHSPEC_MEMORY_HOST;
  if (host) {
    const int32_t* off = batch->draft_offsets;
    require(off[0] == 0, FLASHSPEC_ERR_OUT_OF_RANGE, "batch->draft_offsets", "entry 0 must be 0, got " + str(off[0]));
    for (int32_t r = 0; r < requests; ++r) {
      int64_t n = int64_t(off[r + 1]) - int64_t(off[r]);
      require(n >= 0, FLASHSPEC_ERR_OUT_OF_RANGE, "batch->draft_offsets",
              "decreases at entry " + str(r + 1) + " (" + str(off[r]) + " then " + str(off[r + 1]) + ")");
      require(n <= max_draft_len, FLASHSPEC_ERR_OUT_OF_RANGE, "batch->draft_offsets",
              "request " + str(r) + " has " + str(n) + " drafts, more than max_draft_len " + str(max_draft_len));
    }
    require(off[requests] == total_drafts, FLASHSPEC_ERR_OUT_OF_RANGE, "batch->target_hidden",
            "has " + str(total_rows) + " rows but draft_offsets[R] + R = " + str(int64_t(off[requests]) + requests));
    check_temperatures(batch->temperatures, requests, false, "batch->temperatures");
    check_temperatures(batch->draft_temperatures, requests, true, "batch->draft_temperatures");
    if (batch->accept_uniforms)
      for (int32_t k = 0; k < total_drafts; ++k) {
        float u = batch->accept_uniforms[k];
        require(u > 0.0f && u < 1.0f, FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->accept_uniforms",
                "entry " + str(k) + " must lie strictly inside (0, 1)");
      }
  }

  // A batch without drafts may pass draft logits of the documented shape
  // [0, V]: there is nothing to read, so the batch is verified as greedy.
  const bool empty_draft_logits = batch->draft_logits && total_drafts == 0 && batch->draft_logits->rows == 0;
  if (empty_draft_logits) {
    const flashspec_tensor& q = *batch->draft_logits;
    const int32_t dtype = raw_enum(q.dtype);
    require(dtype == FLASHSPEC_DTYPE_F32 || dtype == FLASHSPEC_DTYPE_BF16 || dtype == FLASHSPEC_DTYPE_F16,
            FLASHSPEC_ERR_DTYPE_MISMATCH, "batch->draft_logits", "unknown dtype " + str(dtype));
    validate_memory(q.memory, backend, "batch->draft_logits->memory");
    require(q.cols >= 1, FLASHSPEC_ERR_OUT_OF_RANGE, "batch->draft_logits", "cols must be >= 1, got " + str(q.cols));
  } else if (batch->draft_logits) {
    validate_tensor(batch->draft_logits, "batch->draft_logits");
    validate_memory(batch->draft_logits->memory, backend, "batch->draft_logits->memory");
    require(batch->draft_logits->rows == total_drafts, FLASHSPEC_ERR_OUT_OF_RANGE, "batch->draft_logits",
            "has " + str(batch->draft_logits->rows) + " rows, expected draft_offsets[R] = " + str(total_drafts));
  }

  require(batch->logprobs == 0 || batch->logprobs == 1, FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->logprobs",
          "must be 0 or 1, got " + str(batch->logprobs));
  require(batch->top_logprobs >= 0 && batch->top_logprobs <= FLASHSPEC_MAX_TOP_LOGPROBS, FLASHSPEC_ERR_OUT_OF_RANGE,
          "batch->top_logprobs",
          "must be in [0, " + str(FLASHSPEC_MAX_TOP_LOGPROBS) + "], got " + str(batch->top_logprobs));

  const bool sparse_q = batch->draft_support_offsets || batch->draft_support_tokens || batch->draft_support_probs;
  if (sparse_q) {
    require(batch->draft_support_offsets != nullptr, FLASHSPEC_ERR_NULL_POINTER, "batch->draft_support_offsets",
            "is NULL while draft_support_tokens or draft_support_probs is given");
    require(batch->draft_support_tokens != nullptr, FLASHSPEC_ERR_NULL_POINTER, "batch->draft_support_tokens",
            "is NULL while draft_support_offsets is given");
    require(batch->draft_support_probs != nullptr, FLASHSPEC_ERR_NULL_POINTER, "batch->draft_support_probs",
            "is NULL while draft_support_offsets is given");
    require(!batch->draft_logits, FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->draft_support_offsets",
            "a draft's q is either dense (draft_logits) or sparse (draft_support_*), not both");
  }

  VerifyArgs args;
  args.controls = load_controls(batch->controls, requests, host, true, "batch->controls");
  args.draft_controls = load_controls(batch->draft_controls, requests, host, false, "batch->draft_controls");
  require(!args.draft_controls.present || batch->draft_logits, FLASHSPEC_ERR_INVALID_ARGUMENT,
          "batch->draft_controls", "apply to stochastic drafts' q: give draft_logits too");
  if (backend.kind() == FLASHSPEC_BACKEND_CUDA && ((batch->draft_logits && !empty_draft_logits) || sparse_q)) {
    const char* analysed = args.draft_controls.present ? "batch->draft_controls"
                           : args.controls.present     ? "batch->controls"
                           : batch->logprobs           ? "batch->logprobs"
                           : batch->top_logprobs       ? "batch->top_logprobs"
                                                       : nullptr;
    require(!analysed, FLASHSPEC_ERR_UNSUPPORTED, analysed ? analysed : "",
            "the CUDA backend verifies stochastic drafts (draft_logits or sparse supports) without sampling "
            "controls or logprobs in this version (the CPU backend applies them)");
  }
  if (batch->draft_parents) {
    require(!args.controls.typical_epsilon, FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->controls->typical_epsilon",
            "typical acceptance does not apply to tree verify");
    if (host)
      for (int32_t r = 0; r < requests; ++r) {
        const int32_t first = batch->draft_offsets[r], n = batch->draft_offsets[r + 1] - first;
        for (int32_t k = 0; k < n; ++k) {
          const int32_t parent = batch->draft_parents[first + k];
          require(parent >= -1 && parent < k, FLASHSPEC_ERR_OUT_OF_RANGE, "batch->draft_parents",
                  "entry " + str(first + k) + " (node " + str(k) + " of request " + str(r) + ") is " + str(parent) +
                      ", outside [-1, " + str(k) + ")");
        }
      }
  }
  args.draft_parents = batch->draft_parents;
  if (sparse_q) {
    args.support_offsets = batch->draft_support_offsets;
    args.support_tokens = batch->draft_support_tokens;
    args.support_probs = batch->draft_support_probs;
  }
  args.logprobs = batch->logprobs != 0;
  args.top_logprobs = batch->top_logprobs;
  args.num_requests = requests;
  args.total_drafts = total_drafts;
  args.total_rows = int32_t(total_rows);
  args.max_draft_len = max_draft_len;
  args.draft_offsets = batch->draft_offsets;
  args.draft_tokens = batch->draft_tokens;
  args.target_hidden = batch->target_hidden;
  args.draft_logits = empty_draft_logits ? nullptr : batch->draft_logits;
  args.temperature = batch->greedy ? 0.0f : 1.0f;
  args.temperatures = batch->temperatures;
  args.draft_temperatures = batch->draft_temperatures;
  args.seeds = batch->seeds;
  args.request_ids = batch->request_ids;
  args.steps = batch->steps;
  args.accept_uniforms = batch->accept_uniforms;
  args.default_seed = ctx.seed;
  return args;
}

}  // namespace

const LmHeadStorage& validate_head(const flashspec_context& ctx, const flashspec_lm_head* head, const char* argument,
                                   bool shard_call) {
  require(head != nullptr, FLASHSPEC_ERR_NULL_POINTER, argument, "is NULL");
  const LmHeadStorage& storage = *head->storage;
  require(storage.backend == ctx.backend->kind() && storage.device == ctx.backend->device(),
          FLASHSPEC_ERR_DEVICE_MISMATCH, argument, "was created for another backend or device than this context's");
  require(shard_call || !storage.sharded(), FLASHSPEC_ERR_INVALID_ARGUMENT, argument,
          "is a vocabulary shard: it serves flashspec_verify_shard and flashspec_draft_shard");
  return storage;
}

void validate_temperature(float t, const char* argument) {
  require(!std::isnan(t), FLASHSPEC_ERR_INVALID_ARGUMENT, argument, "is NaN");
  require(std::isfinite(t), FLASHSPEC_ERR_INVALID_ARGUMENT, argument, "is infinite");
  require(t >= 0.0f, FLASHSPEC_ERR_INVALID_ARGUMENT, argument, "must be >= 0, got " + std::to_string(t));
}

void validate_tensor(const flashspec_tensor* t, const char* argument, bool codes_allowed) {
  require(t != nullptr, FLASHSPEC_ERR_NULL_POINTER, argument, "is NULL");
  require(t->data != nullptr, FLASHSPEC_ERR_NULL_POINTER, argument, "data is NULL");
  const int32_t dtype = raw_enum(t->dtype);
  const bool codes = dtype == FLASHSPEC_DTYPE_E4M3 || dtype == FLASHSPEC_DTYPE_I8;
  require(dtype == FLASHSPEC_DTYPE_F32 || dtype == FLASHSPEC_DTYPE_BF16 || dtype == FLASHSPEC_DTYPE_F16 ||
              (codes && codes_allowed),
          FLASHSPEC_ERR_DTYPE_MISMATCH, argument,
          (codes ? "8-bit dtype " + str(dtype) + " is for LM heads (flashspec_lm_head_create_quantized) only"
                 : "unknown dtype " + str(dtype)) +
              (codes_allowed ? " (bf16, fp16, fp32, e4m3 or int8)" : " (bf16, fp16 or fp32)"));
  require(reinterpret_cast<uintptr_t>(t->data) % dtype_size(t->dtype) == 0, FLASHSPEC_ERR_UNSUPPORTED, argument,
          "data is not aligned to its element size (" + str(int64_t(dtype_size(t->dtype))) + " bytes)");
  require(known_memory(t->memory), FLASHSPEC_ERR_INVALID_ARGUMENT, argument,
          "unknown memory " + str(raw_enum(t->memory)));
  require(t->rows >= 1, FLASHSPEC_ERR_OUT_OF_RANGE, argument, "rows must be >= 1, got " + str(t->rows));
  require(t->cols >= 1, FLASHSPEC_ERR_OUT_OF_RANGE, argument, "cols must be >= 1, got " + str(t->cols));
  require(t->row_stride >= t->cols, FLASHSPEC_ERR_OUT_OF_RANGE, argument,
          "row_stride " + str(t->row_stride) + " is smaller than cols " + str(t->cols));
  const int64_t limit = std::numeric_limits<int64_t>::max() / 8;
  require(t->row_stride <= limit / t->rows, FLASHSPEC_ERR_OUT_OF_RANGE, argument,
          "rows x row_stride overflows");
}

namespace {

// The params of a draft-like call over `rows` rows (defaults resolved, host
// values checked) as DraftArgs without hidden rows or outputs; `inputs`
// receives the spans of its arrays.
DraftArgs validate_draft_params(const flashspec_context& ctx, const flashspec_draft_params* params, int32_t rows,
                                int64_t vocab, std::vector<Span>& inputs) {
  const flashspec_draft_params p =
      load_struct_or_defaults(params, [](flashspec_draft_params* d) { flashspec_draft_params_init(d); }, "params");
  const Backend& backend = *ctx.backend;
  validate_memory(p.memory, backend, "params->memory");
  validate_temperature(p.temperature, "params->temperature");
  const bool host = p.memory == FLASHSPEC_MEMORY_HOST;
  if (host) {
    check_temperatures(p.temperatures, rows, false, "params->temperatures");
    if (p.positions)
      for (int32_t r = 0; r < rows; ++r)
        require(p.positions[r] >= 0 && p.positions[r] <= FLASHSPEC_MAX_DRAFT_LEN, FLASHSPEC_ERR_OUT_OF_RANGE,
                "params->positions",
                "entry " + str(r) + " is " + str(p.positions[r]) + ", outside [0, " + str(FLASHSPEC_MAX_DRAFT_LEN) + "]");
  }
  ControlsArgs controls = load_controls(p.controls, rows, host, false, "params->controls");
  if (vocab > 0) check_controls_for_vocab(controls, rows, rows, vocab, host, "params->controls");
  inputs.push_back(array_span("params->temperatures", p.temperatures, rows, sizeof(float)));
  inputs.push_back(array_span("params->seeds", p.seeds, rows, sizeof(uint64_t)));
  inputs.push_back(array_span("params->request_ids", p.request_ids, rows, sizeof(uint64_t)));
  inputs.push_back(array_span("params->steps", p.steps, rows, sizeof(uint64_t)));
  inputs.push_back(array_span("params->positions", p.positions, rows, sizeof(int32_t)));
  add_controls_spans(controls, "params->controls", rows, rows, host, inputs);

  DraftArgs args;
  args.hidden = nullptr;
  args.rows = rows;
  args.temperature = p.temperature;
  args.temperatures = p.temperatures;
  args.seeds = p.seeds;
  args.request_ids = p.request_ids;
  args.steps = p.steps;
  args.positions = p.positions;
  args.default_seed = ctx.seed;
  args.tokens_out = nullptr;
  args.scores_out = nullptr;
  args.controls = controls;
  return args;
}

// Hidden rows of a draft-like call for `head`.
void validate_draft_hidden(const flashspec_context& ctx, const LmHeadStorage& head, const flashspec_tensor* hidden) {
  validate_tensor(hidden, "hidden");
  validate_memory(hidden->memory, *ctx.backend, "hidden->memory");
  require(hidden->cols == head.hidden, FLASHSPEC_ERR_OUT_OF_RANGE, "hidden",
          "has " + str(hidden->cols) + " columns, the LM head's hidden size is " + str(head.hidden));
  require(hidden->rows <= ctx.max_rows, FLASHSPEC_ERR_WORKSPACE_EXCEEDED, "hidden",
          str(hidden->rows) + " rows exceed the context's max_rows " + str(ctx.max_rows));
}

// Gathered host records [shards][rows]: each of the documented version, and
// each row's slices tiling [0, V) in rank order. Returns V.
int64_t check_records(const ShardRecord* records, int32_t shards, int32_t rows) {
  const int32_t vocab = records[0].vocab_size;
  for (int32_t row = 0; row < rows; ++row) {
    const int32_t k = first_bad_record(records, shards, rows, row, vocab);
    if (k < 0) continue;
    require(k < shards, FLASHSPEC_ERR_INVALID_ARGUMENT, "records",
            "row " + str(row) + ": the slices cover [0, " + str(records[int64_t(shards - 1) * rows + row].vocab_end) +
                "), not the vocabulary of " + str(vocab));
    const ShardRecord& r = records[int64_t(k) * rows + row];
    require(r.version == FLASHSPEC_SHARD_RECORD_VERSION, FLASHSPEC_ERR_INVALID_ARGUMENT, "records",
            "record " + str(k) + " of row " + str(row) + " has version " + str(r.version) + ", this library reads " +
                str(FLASHSPEC_SHARD_RECORD_VERSION));
    const int32_t next = k == 0 ? 0 : records[int64_t(k - 1) * rows + row].vocab_end;
    require(false, FLASHSPEC_ERR_INVALID_ARGUMENT, "records",
            "row " + str(row) + ": the slice [" + str(r.vocab_begin) + ", " + str(r.vocab_end) + ") of V " +
                str(r.vocab_size) + " from rank " + str(k) + " does not continue [0, " + str(next) + ") of V " +
                str(vocab) + " (records are [num_shards][rows], ranks in vocabulary order)");
  }
  return vocab;
}

// The ranking of a top-k draft is of x = l + bias over every allowed token:
// a truncating or typical control would change which tokens exist, not
// their order, so none may be given (checked before the controls' values).
void refuse_truncating_controls(const flashspec_draft_params* params) {
  const flashspec_draft_params p =
      load_struct_or_defaults(params, [](flashspec_draft_params* d) { flashspec_draft_params_init(d); }, "params");
  if (!p.controls) return;
  const flashspec_sampling_controls c = load_struct(p.controls, flashspec_sampling_controls_init, "params->controls");
  const std::pair<const void*, const char*> refused[] = {{c.top_k, "params->controls->top_k"},
                                                         {c.top_p, "params->controls->top_p"},
                                                         {c.min_p, "params->controls->min_p"},
                                                         {c.typical_epsilon, "params->controls->typical_epsilon"},
                                                         {c.typical_delta, "params->controls->typical_delta"}};
  for (const auto& [given, name] : refused)
    require(given == nullptr, FLASHSPEC_ERR_INVALID_ARGUMENT, name,
            "must be NULL: flashspec_draft_top_k ranks every allowed token by l + bias");
}

// A draft-like call's outputs of `per_row` entries per row, disjoint from
// its inputs and each other; `scores_name` names the float output.
void require_draft_outputs_disjoint(const std::vector<Span>& inputs, int32_t rows, int32_t per_row,
                                    const int32_t* tokens_out, const char* scores_name, const float* scores_out) {
  const int64_t count = int64_t(rows) * per_row;
  const Span tokens = array_span("tokens_out", tokens_out, count, sizeof(int32_t));
  const Span scores = array_span(scores_name, scores_out, count, sizeof(float));
  require_disjoint(tokens, inputs);
  require_disjoint(tokens, {scores});
  require_disjoint(scores, inputs);
}

void set_draft_outputs(DraftArgs& args, const std::vector<Span>& inputs, int32_t* tokens_out, float* scores_out) {
  require_draft_outputs_disjoint(inputs, args.rows, 1, tokens_out, "scores_out", scores_out);
  args.tokens_out = tokens_out;
  args.scores_out = scores_out;
}

void require_records(const void* records, int32_t shards) {
  require(records != nullptr, FLASHSPEC_ERR_NULL_POINTER, "records", "is NULL");
  require(reinterpret_cast<uintptr_t>(records) % alignof(ShardRecord) == 0, FLASHSPEC_ERR_UNSUPPORTED, "records",
          "is not aligned to 4 bytes");
  require(shards >= 1, FLASHSPEC_ERR_OUT_OF_RANGE, "num_shards", "must be >= 1, got " + str(shards));
}

}  // namespace

DraftArgs validate_draft(const flashspec_context& ctx, const LmHeadStorage& head, const flashspec_tensor* hidden,
                         const flashspec_draft_params* params, int32_t* tokens_out, float* scores_out) {
  validate_draft_hidden(ctx, head, hidden);
  require(tokens_out != nullptr, FLASHSPEC_ERR_NULL_POINTER, "tokens_out", "is NULL");
  const int32_t rows = int32_t(hidden->rows);
  std::vector<Span> inputs = {tensor_span("hidden", hidden)};
  DraftArgs args = validate_draft_params(ctx, params, rows, head.vocab_size, inputs);
  set_draft_outputs(args, inputs, tokens_out, scores_out);
  args.hidden = hidden;
  return args;
}

DraftArgs validate_draft_top_k(const flashspec_context& ctx, const LmHeadStorage& head, const flashspec_tensor* hidden,
                               const flashspec_draft_params* params, int32_t k, const int32_t* tokens_out,
                               const float* logprobs_out) {
  validate_draft_hidden(ctx, head, hidden);
  require(k >= 1 && k <= FLASHSPEC_MAX_DRAFT_TOP_K, FLASHSPEC_ERR_OUT_OF_RANGE, "k",
          "must be in [1, FLASHSPEC_MAX_DRAFT_TOP_K = " + str(FLASHSPEC_MAX_DRAFT_TOP_K) + "], got " + str(k));
  require(tokens_out != nullptr, FLASHSPEC_ERR_NULL_POINTER, "tokens_out", "is NULL");
  const int32_t rows = int32_t(hidden->rows);
  std::vector<Span> inputs = {tensor_span("hidden", hidden)};
  refuse_truncating_controls(params);
  DraftArgs args = validate_draft_params(ctx, params, rows, head.vocab_size, inputs);
  require_draft_outputs_disjoint(inputs, rows, k, tokens_out, "logprobs_out", logprobs_out);
  args.hidden = hidden;
  return args;
}

DraftArgs validate_draft_shard(const flashspec_context& ctx, const LmHeadStorage& head,
                               const flashspec_tensor* hidden, const flashspec_draft_params* params,
                               const void* records) {
  validate_draft_hidden(ctx, head, hidden);
  require_records(records, 1);
  const int32_t rows = int32_t(hidden->rows);
  std::vector<Span> inputs = {tensor_span("hidden", hidden)};
  DraftArgs args = validate_draft_params(ctx, params, rows, head.vocab_size, inputs);
  require(!args.controls.present, FLASHSPEC_ERR_UNSUPPORTED, "params->controls",
          "sampling controls need the global ranking: shard calls do not take them");
  require_disjoint(array_span("records", records, rows, sizeof(ShardRecord)), inputs);
  args.hidden = hidden;
  return args;
}

DraftArgs validate_draft_from_shards(const flashspec_context& ctx, const flashspec_draft_params* params,
                                     const void* records, int32_t shards, int32_t rows, int32_t* tokens_out,
                                     float* scores_out) {
  require_records(records, shards);
  require(rows >= 1 && rows <= ctx.max_rows, FLASHSPEC_ERR_OUT_OF_RANGE, "rows",
          "must be in [1, the context's max_rows " + str(ctx.max_rows) + "], got " + str(rows));
  require(tokens_out != nullptr, FLASHSPEC_ERR_NULL_POINTER, "tokens_out", "is NULL");
  std::vector<Span> inputs = {array_span("records", records, int64_t(shards) * rows, sizeof(ShardRecord))};
  DraftArgs args = validate_draft_params(ctx, params, rows, 0, inputs);
  require(!args.controls.present, FLASHSPEC_ERR_UNSUPPORTED, "params->controls",
          "sampling controls need the global ranking: shard calls do not take them");
  if (ctx.backend->kind() == FLASHSPEC_BACKEND_CPU) check_records(static_cast<const ShardRecord*>(records), shards, rows);
  set_draft_outputs(args, inputs, tokens_out, scores_out);
  return args;
}

flashspec_verify_batch load_batch(const flashspec_verify_batch* batch) {
  return load_struct(batch, [](flashspec_verify_batch* d) { flashspec_verify_batch_init(d); }, "batch");
}

VerifyArgs validate_batch(const flashspec_context& ctx, const LmHeadStorage& head,
                          const flashspec_verify_batch& b, const SummaryStore* summaries,
                          const char* summaries_name) {
  const flashspec_verify_batch* batch = &b;
  VerifyArgs args = validate_batch_common(ctx, b);
  require(batch->target_hidden->cols == head.hidden, FLASHSPEC_ERR_OUT_OF_RANGE, "batch->target_hidden",
          "has " + str(batch->target_hidden->cols) + " columns, the LM head's hidden size is " + str(head.hidden));
  const int64_t vocab = head.vocab_size;
  if (batch->draft_logits)
    require(batch->draft_logits->cols == vocab, FLASHSPEC_ERR_OUT_OF_RANGE, "batch->draft_logits",
            "has " + str(batch->draft_logits->cols) + " columns, the vocabulary has " + str(vocab));
  if (batch->memory == FLASHSPEC_MEMORY_HOST) {
    check_draft_tokens(batch->draft_tokens, args.total_drafts, vocab);
    check_draft_supports(args, vocab);
  }
  if (summaries) {
    require(args.total_rows <= summaries->max_rows, FLASHSPEC_ERR_WORKSPACE_EXCEEDED, summaries_name,
            "hold " + str(summaries->max_rows) + " rows, the batch has " + str(args.total_rows));
    require(args.num_requests <= summaries->max_requests, FLASHSPEC_ERR_WORKSPACE_EXCEEDED, summaries_name,
            "hold " + str(summaries->max_requests) + " requests, the batch has " + str(args.num_requests));
  }
  require(args.total_rows <= ctx.max_rows, FLASHSPEC_ERR_WORKSPACE_EXCEEDED, "batch->target_hidden",
          "has " + str(args.total_rows) + " rows, more than the context's max_rows " + str(ctx.max_rows));
  const bool host = batch->memory == FLASHSPEC_MEMORY_HOST;
  check_controls_for_vocab(args.controls, args.num_requests, args.total_rows, vocab, host, "batch->controls");
  check_controls_for_vocab(args.draft_controls, args.num_requests, args.total_drafts, vocab, host,
                           "batch->draft_controls");
  return args;
}

// FNV-1a over the effective per-request values both verify and finalize
// read, so finalize can refuse a batch of the same shape that the summaries
// do not describe (their rows would be scored against the wrong tokens).
VerifiedBatch describe_batch(const LmHeadStorage& head, const flashspec_verify_batch& batch, const VerifyArgs& args) {
  VerifiedBatch v;
  v.vocab = head.vocab_size;
  v.rows = args.total_rows;
  v.requests = args.num_requests;
  v.logprobs = args.logprobs;
  v.top_logprobs = args.top_logprobs;
  if (batch.memory != FLASHSPEC_MEMORY_HOST) return v;  // not readable without a device sync
  v.fingerprint_known = true;
  v.fingerprint = fingerprint(args);
  return v;
}

VerifyArgs validate_batch_for_finalize(const flashspec_context& ctx, const flashspec_verify_batch& b,
                                       const VerifiedBatch& verified) {
  const flashspec_verify_batch* batch = &b;
  VerifyArgs args = validate_batch_common(ctx, b);
  require(verified.rows == args.total_rows && verified.requests == args.num_requests,
          FLASHSPEC_ERR_INVALID_ARGUMENT, "summaries",
          "describe a batch of " + str(verified.requests) + " requests and " + str(verified.rows) +
              " rows, not this one (verify it first)");
  // Finalize reads no control; their words per mask row size the arrays
  // an output may not overlap.
  args.controls.mask_words = mask_words_for(verified.vocab);
  args.draft_controls.mask_words = mask_words_for(verified.vocab);
  if (batch->memory == FLASHSPEC_MEMORY_HOST) {
    check_draft_tokens(batch->draft_tokens, args.total_drafts, verified.vocab);
    check_draft_supports(args, verified.vocab);
    require(!verified.fingerprint_known || fingerprint(args) == verified.fingerprint, FLASHSPEC_ERR_INVALID_ARGUMENT,
            "summaries",
            "describe another batch of the same shape (draft offsets, tokens, temperatures, seeds, request ids or "
            "steps differ; verify this batch first)");
  }
  return args;
}

namespace {
// The arrays a verify batch reads but its steps (which next_steps may be).
// `host`: the batch lives in host memory, where the bias list's length can
// be read from its offsets.
void batch_input_spans(const VerifyArgs& a, bool host, std::vector<Span>& inputs) {
  const int64_t R = a.num_requests;
  for (Span span : {array_span("batch->draft_offsets", a.draft_offsets, R + 1, sizeof(int32_t)),
                    array_span("batch->draft_tokens", a.draft_tokens, a.total_drafts, sizeof(int32_t)),
                    tensor_span("batch->target_hidden", a.target_hidden),
                    tensor_span("batch->draft_logits", a.draft_logits),
                    array_span("batch->temperatures", a.temperatures, R, sizeof(float)),
                    array_span("batch->draft_temperatures", a.draft_temperatures, R, sizeof(float)),
                    array_span("batch->seeds", a.seeds, R, sizeof(uint64_t)),
                    array_span("batch->request_ids", a.request_ids, R, sizeof(uint64_t)),
                    array_span("batch->accept_uniforms", a.accept_uniforms, a.total_drafts, sizeof(float)),
                    array_span("batch->draft_parents", a.draft_parents, a.total_drafts, sizeof(int32_t))})
    inputs.push_back(span);
  if (a.support_offsets) {
    const int64_t entries = host ? a.support_offsets[a.total_drafts] : 0;
    inputs.push_back(array_span("batch->draft_support_offsets", a.support_offsets, a.total_drafts + 1, sizeof(int32_t)));
    inputs.push_back(array_span("batch->draft_support_tokens", a.support_tokens, entries, sizeof(int32_t)));
    inputs.push_back(array_span("batch->draft_support_probs", a.support_probs, entries, sizeof(float)));
  }
  add_controls_spans(a.controls, "batch->controls", a.num_requests, a.total_rows, host, inputs);
  add_controls_spans(a.draft_controls, "batch->draft_controls", a.num_requests, a.total_drafts, host, inputs);
}
}  // namespace

void validate_result_disjoint(const VerifyArgs& a, const ResultArgs& out, bool host, const void* records,
                              int32_t shards) {
  const int64_t R = a.num_requests;
  const int64_t rows = a.total_rows;
  const int64_t top = int64_t(a.top_logprobs) * rows;
  const std::vector<Span> outputs = {
      array_span("result->accepted_counts", out.accepted_counts, R, sizeof(int32_t)),
      array_span("result->emitted_tokens", out.emitted_tokens, rows, sizeof(int32_t)),
      array_span("result->next_steps", out.next_steps, R, sizeof(uint64_t)),
      array_span("result->logprobs", out.logprobs, rows, sizeof(float)),
      array_span("result->raw_logprobs", out.raw_logprobs, rows, sizeof(float)),
      array_span("result->top_tokens", out.top_tokens, top, sizeof(int32_t)),
      array_span("result->top_logprobs", out.top_logprobs, top, sizeof(float)),
      array_span("result->accepted_nodes", out.accepted_nodes, rows, sizeof(int32_t))};
  std::vector<Span> inputs;
  batch_input_spans(a, host, inputs);
  if (records) inputs.push_back(array_span("records", records, int64_t(shards) * rows, sizeof(ShardRecord)));
  const Span steps = array_span("batch->steps", a.steps, R, sizeof(uint64_t));
  for (size_t i = 0; i < outputs.size(); ++i) {
    require_disjoint(outputs[i], inputs);
    require_disjoint(outputs[i], std::vector<Span>(outputs.begin() + long(i) + 1, outputs.end()));
  }
  // next_steps may be batch->steps itself (each request's step is read
  // before its next step is written), but not a shifted view of it.
  const Span& next_steps = outputs[2];
  for (const Span& output : outputs) {
    const bool next_steps_in_place = &output == &next_steps && output.begin == steps.begin && output.bytes == steps.bytes;
    if (!next_steps_in_place) require_disjoint(output, {steps});
  }
}

void validate_result_requests(const ResultArgs& out, bool logprobs_kept, int32_t top_logprobs_kept,
                              const char* source) {
  require(logprobs_kept || !out.logprobs, FLASHSPEC_ERR_INVALID_ARGUMENT, "result->logprobs",
          std::string("needs a verify that kept logprobs (") + source + "->logprobs = 1)");
  require(logprobs_kept || !out.raw_logprobs, FLASHSPEC_ERR_INVALID_ARGUMENT, "result->raw_logprobs",
          std::string("needs a verify that kept logprobs (") + source + "->logprobs = 1)");
  require(top_logprobs_kept > 0 || !out.top_tokens, FLASHSPEC_ERR_INVALID_ARGUMENT, "result->top_tokens",
          std::string("needs a verify that kept top logprobs (") + source + "->top_logprobs > 0)");
  require(top_logprobs_kept > 0 || !out.top_logprobs, FLASHSPEC_ERR_INVALID_ARGUMENT, "result->top_logprobs",
          std::string("needs a verify that kept top logprobs (") + source + "->top_logprobs > 0)");
}

namespace {
// What a shard verify or finalize refuses: the calls that need a second
// exchange.
void require_shardable(const VerifyArgs& args) {
  require(!args.draft_logits, FLASHSPEC_ERR_UNSUPPORTED, "batch->draft_logits",
          "stochastic drafts need the global log-sum-exp of p before the residual: shard calls take point-mass drafts");
  require(!args.support_offsets, FLASHSPEC_ERR_UNSUPPORTED, "batch->draft_support_offsets",
          "stochastic drafts need the global log-sum-exp of p before the residual: shard calls take point-mass drafts");
  require(!args.controls.present && !args.draft_controls.present, FLASHSPEC_ERR_UNSUPPORTED, "batch->controls",
          "sampling controls need the global ranking: shard calls do not take them");
  require(!args.logprobs && args.top_logprobs == 0, FLASHSPEC_ERR_UNSUPPORTED, "batch->logprobs",
          "logprobs need the raw log-sum-exp: shard calls do not return them");
}
}  // namespace

VerifyArgs validate_verify_shard(const flashspec_context& ctx, const LmHeadStorage& head,
                                 const flashspec_verify_batch& batch, const void* records) {
  VerifyArgs args = validate_batch(ctx, head, batch, nullptr, "");
  require_shardable(args);
  require_records(records, 1);
  std::vector<Span> inputs;
  batch_input_spans(args, batch.memory == FLASHSPEC_MEMORY_HOST, inputs);
  require_disjoint(array_span("records", records, args.total_rows, sizeof(ShardRecord)), inputs);
  return args;
}

VerifyArgs validate_finalize_shards(const flashspec_context& ctx, const flashspec_verify_batch& batch,
                                    const void* records, int32_t shards) {
  VerifyArgs args = validate_batch_common(ctx, batch);
  require_shardable(args);
  require_records(records, shards);
  if (batch.memory == FLASHSPEC_MEMORY_HOST) {
    const int64_t vocab = check_records(static_cast<const ShardRecord*>(records), shards, args.total_rows);
    check_draft_tokens(batch.draft_tokens, args.total_drafts, vocab);
  }
  return args;
}

ResultArgs validate_result(const flashspec_context& ctx, const flashspec_verify_result* given) {
  const flashspec_verify_result result = load_struct(given, [](flashspec_verify_result* d) { flashspec_verify_result_init(d); }, "result");
  validate_memory(result.memory, *ctx.backend, "result->memory");
  require(result.accepted_counts != nullptr, FLASHSPEC_ERR_NULL_POINTER, "result->accepted_counts", "is NULL");
  require(result.emitted_tokens != nullptr, FLASHSPEC_ERR_NULL_POINTER, "result->emitted_tokens", "is NULL");
  ResultArgs out{result.accepted_counts, result.emitted_tokens, result.next_steps};
  out.logprobs = result.logprobs;
  out.raw_logprobs = result.raw_logprobs;
  out.top_tokens = result.top_tokens;
  out.top_logprobs = result.top_logprobs;
  out.accepted_nodes = result.accepted_nodes;
  return out;
}

}  // namespace flashspec
