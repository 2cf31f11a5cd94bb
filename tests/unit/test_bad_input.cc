// Bad input, one table per entry point: each case must return its specific
// status, leave a message in flashspec_context_last_error that names the
// argument, and leave every output untouched (poisoned canaries unchanged;
// summaries still giving the previous result).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "support.h"

namespace {

using namespace fstest;

constexpr int32_t kPoison = 0x7eadbeef;
constexpr uint64_t kPoison64 = 0x7eadbeef7eadbeefull;
constexpr int64_t kVocab = 300;  // two CPU tiles
constexpr int64_t kHidden = 8;
constexpr int32_t kMaxRows = 16;
constexpr int32_t kMaxRequests = 4;
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

float poison_float() {
  float f;
  std::memcpy(&f, &kPoison, sizeof f);
  return f;
}

bool is_poison(float f) {
  int32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits == kPoison;
}

// Stores any int in an enum object, as a C caller may; C++ code must not
// assign it through the enum type (negative values are outside its range).
template <class Enum>
void set_raw(Enum& field, int32_t value) {
  static_assert(sizeof(Enum) == sizeof(int32_t), "32-bit enums");
  std::memcpy(&field, &value, sizeof value);
}

// Checks status and message of one failed call. ctx NULL: the message is the
// thread's (flashspec_context_last_error(NULL)).
void expect_failure(const std::string& name, flashspec_status got, flashspec_status want,
                    const flashspec_context* ctx, const char* argument) {
  EXPECT_EQ(got, want) << name << ": got " << flashspec_status_name(got) << ", want " << flashspec_status_name(want)
                       << " (message: " << flashspec_context_last_error(ctx) << ")";
  const std::string message = flashspec_context_last_error(ctx);
  EXPECT_NE(message.find(argument), std::string::npos)
      << name << ": message \"" << message << "\" does not name " << argument;
}

// ---------------------------------------------------------------------------
// flashspec_context_create
// ---------------------------------------------------------------------------
TEST(BadInput, ContextCreate) {
  struct Case {
    const char* name;
    flashspec_status status;
    const char* argument;
    std::function<void(flashspec_context_params&, bool& null_out)> mutate;
  };
  std::vector<Case> cases = {
      {"out NULL", FLASHSPEC_ERR_NULL_POINTER, "out", [](auto&, bool& n) { n = true; }},
      {"struct_size 0", FLASHSPEC_ERR_STRUCT_SIZE, "params->struct_size", [](auto& p, bool&) { p.struct_size = 0; }},
      {"struct_size smaller", FLASHSPEC_ERR_STRUCT_SIZE, "params->struct_size",
       [](auto& p, bool&) { p.struct_size = sizeof(flashspec_context_params) - 4; }},
      {"struct_size larger", FLASHSPEC_ERR_STRUCT_SIZE, "params->struct_size",
       [](auto& p, bool&) { p.struct_size = sizeof(flashspec_context_params) + 8; }},
      {"backend 3", FLASHSPEC_ERR_INVALID_ARGUMENT, "params->backend",
       [](auto& p, bool&) { p.backend = flashspec_backend(3); }},
      {"backend -1", FLASHSPEC_ERR_INVALID_ARGUMENT, "params->backend",
       [](auto& p, bool&) { set_raw(p.backend, -1); }},
      {"device_ordinal -1", FLASHSPEC_ERR_INVALID_ARGUMENT, "params->device_ordinal",
       [](auto& p, bool&) { p.device_ordinal = -1; }},
      {"cpu_threads -1", FLASHSPEC_ERR_INVALID_ARGUMENT, "params->cpu_threads",
       [](auto& p, bool&) { p.cpu_threads = -1; }},
      {"cpu_threads 1025", FLASHSPEC_ERR_INVALID_ARGUMENT, "params->cpu_threads",
       [](auto& p, bool&) { p.cpu_threads = 1025; }},
      {"max_rows 0", FLASHSPEC_ERR_OUT_OF_RANGE, "params->max_rows", [](auto& p, bool&) { p.max_rows = 0; }},
      {"max_rows -5", FLASHSPEC_ERR_OUT_OF_RANGE, "params->max_rows", [](auto& p, bool&) { p.max_rows = -5; }},
      {"max_rows 2^24+1", FLASHSPEC_ERR_OUT_OF_RANGE, "params->max_rows",
       [](auto& p, bool&) { p.max_rows = (1 << 24) + 1; }},
      {"max_requests 0", FLASHSPEC_ERR_OUT_OF_RANGE, "params->max_requests",
       [](auto& p, bool&) { p.max_requests = 0; }},
      {"max_requests INT32_MIN", FLASHSPEC_ERR_OUT_OF_RANGE, "params->max_requests",
       [](auto& p, bool&) { p.max_requests = std::numeric_limits<int32_t>::min(); }},
  };
  if (flashspec_cuda_device_count() == 0)
    cases.push_back({"CUDA backend without a device", FLASHSPEC_ERR_NO_DEVICE, "params->backend",
                     [](auto& p, bool&) { p.backend = FLASHSPEC_BACKEND_CUDA; }});

  // The unmutated call succeeds, so every failure below is the mutation's.
  {
    flashspec_context_params p;
    flashspec_context_params_init(&p);
    p.backend = FLASHSPEC_BACKEND_CPU;
    flashspec_context* ctx = nullptr;
    ASSERT_EQ(flashspec_context_create(&p, &ctx), FLASHSPEC_OK);
    EXPECT_EQ(flashspec_context_backend(ctx), FLASHSPEC_BACKEND_CPU);
    EXPECT_STREQ(flashspec_context_last_error(ctx), "");
    flashspec_context_destroy(ctx);
  }
  for (const Case& c : cases) {
    flashspec_context_params p;
    flashspec_context_params_init(&p);
    p.backend = FLASHSPEC_BACKEND_CPU;
    bool null_out = false;
    c.mutate(p, null_out);
    flashspec_context* out = reinterpret_cast<flashspec_context*>(uintptr_t(kPoison));
    flashspec_status s = flashspec_context_create(&p, null_out ? nullptr : &out);
    expect_failure(c.name, s, c.status, nullptr, c.argument);
    EXPECT_EQ(out, reinterpret_cast<flashspec_context*>(uintptr_t(kPoison))) << c.name << ": *out was written";
  }
  // NULL params means all defaults.
  flashspec_context* ctx = nullptr;
  ASSERT_EQ(flashspec_context_create(nullptr, &ctx), FLASHSPEC_OK);
  flashspec_context_destroy(ctx);
}

// ---------------------------------------------------------------------------
// Shared fixture: a CPU context and a valid LM head.
// ---------------------------------------------------------------------------
class BadInputWithHead : public ::testing::Test {
 protected:
  void SetUp() override {
    ctx_ = make_context(ContextOptions().cpu_threads(2).seed(7).max_rows(kMaxRows).max_requests(kMaxRequests));
    Rng rng(51);
    w_ = random_matrix(FLASHSPEC_DTYPE_F32, kVocab, kHidden, rng, 1.0);
    head_ = make_head(ctx_.get(), w_.view());
    ASSERT_TRUE(head_);
  }
  flashspec_context* ctx() { return ctx_.get(); }
  ContextPtr ctx_;
  Matrix w_;
  HeadPtr head_;
};

// ---------------------------------------------------------------------------
// flashspec_lm_head_create
// ---------------------------------------------------------------------------
TEST_F(BadInputWithHead, LmHeadCreate) {
  struct Call {
    flashspec_context* ctx;
    flashspec_tensor weight;
    bool null_weight = false, null_out = false;
    flashspec_lm_head_flags flags = FLASHSPEC_LM_HEAD_COPY;
    std::vector<float> f32;
    std::vector<uint16_t> half;
  };
  struct Case {
    const char* name;
    flashspec_status status;
    const char* argument;
    std::function<void(Call&)> mutate;
  };
  const std::vector<Case> cases = {
      {"ctx NULL", FLASHSPEC_ERR_NULL_POINTER, "ctx", [](Call& c) { c.ctx = nullptr; }},
      {"weight NULL", FLASHSPEC_ERR_NULL_POINTER, "weight", [](Call& c) { c.null_weight = true; }},
      {"weight->data NULL", FLASHSPEC_ERR_NULL_POINTER, "weight", [](Call& c) { c.weight.data = nullptr; }},
      {"out NULL", FLASHSPEC_ERR_NULL_POINTER, "out", [](Call& c) { c.null_out = true; }},
      {"rows 0", FLASHSPEC_ERR_OUT_OF_RANGE, "weight", [](Call& c) { c.weight.rows = 0; }},
      {"rows -1", FLASHSPEC_ERR_OUT_OF_RANGE, "weight", [](Call& c) { c.weight.rows = -1; }},
      {"cols 0", FLASHSPEC_ERR_OUT_OF_RANGE, "weight", [](Call& c) { c.weight.cols = 0; }},
      {"cols -8", FLASHSPEC_ERR_OUT_OF_RANGE, "weight", [](Call& c) { c.weight.cols = -8; }},
      {"rows above FLASHSPEC_MAX_VOCAB", FLASHSPEC_ERR_OUT_OF_RANGE, "weight",
       [](Call& c) { c.weight.rows = FLASHSPEC_MAX_VOCAB + 1; }},
      {"cols above FLASHSPEC_MAX_HIDDEN", FLASHSPEC_ERR_OUT_OF_RANGE, "weight",
       [](Call& c) { c.weight.cols = FLASHSPEC_MAX_HIDDEN + 1, c.weight.row_stride = c.weight.cols; }},
      {"row_stride < cols", FLASHSPEC_ERR_OUT_OF_RANGE, "weight", [](Call& c) { c.weight.row_stride = kHidden - 1; }},
      {"row_stride negative", FLASHSPEC_ERR_OUT_OF_RANGE, "weight", [](Call& c) { c.weight.row_stride = -kHidden; }},
      {"rows * row_stride overflows", FLASHSPEC_ERR_OUT_OF_RANGE, "weight",
       [](Call& c) { c.weight.rows = int64_t(1) << 20, c.weight.row_stride = int64_t(1) << 60; }},
      {"dtype 3", FLASHSPEC_ERR_DTYPE_MISMATCH, "weight", [](Call& c) { c.weight.dtype = flashspec_dtype(3); }},
      {"dtype -1", FLASHSPEC_ERR_DTYPE_MISMATCH, "weight", [](Call& c) { set_raw(c.weight.dtype, -1); }},
      {"memory 9", FLASHSPEC_ERR_INVALID_ARGUMENT, "weight", [](Call& c) { c.weight.memory = flashspec_memory(9); }},
      {"device memory on the CPU backend", FLASHSPEC_ERR_DEVICE_MISMATCH, "weight",
       [](Call& c) { c.weight.memory = FLASHSPEC_MEMORY_CUDA; }},
      {"BORROW on the CPU backend", FLASHSPEC_ERR_DEVICE_MISMATCH, "flags",
       [](Call& c) { c.flags = FLASHSPEC_LM_HEAD_BORROW; }},
      {"flags 2", FLASHSPEC_ERR_INVALID_ARGUMENT, "flags", [](Call& c) { c.flags = flashspec_lm_head_flags(2); }},
      {"memory -1", FLASHSPEC_ERR_INVALID_ARGUMENT, "weight", [](Call& c) { set_raw(c.weight.memory, -1); }},
      {"NaN weight (f32)", FLASHSPEC_ERR_NON_FINITE, "weight", [](Call& c) { c.f32[5 * kHidden + 3] = kNaN; }},
      {"Inf weight in the last row (f32)", FLASHSPEC_ERR_NON_FINITE, "weight",
       [](Call& c) { c.f32[(kVocab - 1) * kHidden + kHidden - 1] = -kInf; }},
      {"NaN weight (bf16)", FLASHSPEC_ERR_NON_FINITE, "weight",
       [](Call& c) {
         c.half.assign(size_t(kVocab * kHidden), flashspec::float_to_bf16(0.25f));
         c.half[17] = 0x7fc0;
         c.weight.data = c.half.data(), c.weight.dtype = FLASHSPEC_DTYPE_BF16;
       }},
      {"Inf weight (f16)", FLASHSPEC_ERR_NON_FINITE, "weight",
       [](Call& c) {
         c.half.assign(size_t(kVocab * kHidden), flashspec::float_to_fp16(0.25f));
         c.half[299 * kHidden] = 0x7c00;
         c.weight.data = c.half.data(), c.weight.dtype = FLASHSPEC_DTYPE_F16;
       }},
  };
  auto fresh = [&] {
    Call c;
    c.ctx = ctx();
    c.f32 = w_.f32;
    c.weight = flashspec_tensor_make(nullptr, FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, kVocab, kHidden);
    return c;
  };
  auto call = [](Call& c, flashspec_lm_head** out) {
    return flashspec_lm_head_create(c.ctx, c.null_weight ? nullptr : &c.weight, c.flags, c.null_out ? nullptr : out);
  };
  {
    Call c = fresh();
    c.weight.data = c.f32.data();
    flashspec_lm_head* out = nullptr;
    ASSERT_EQ(call(c, &out), FLASHSPEC_OK) << flashspec_context_last_error(ctx());
    flashspec_lm_head_destroy(out);
  }
  for (const Case& k : cases) {
    Call c = fresh();
    c.weight.data = c.f32.data();
    k.mutate(c);
    flashspec_lm_head* out = reinterpret_cast<flashspec_lm_head*>(uintptr_t(kPoison));
    flashspec_status s = call(c, &out);
    expect_failure(k.name, s, k.status, c.ctx, k.argument);
    EXPECT_EQ(out, reinterpret_cast<flashspec_lm_head*>(uintptr_t(kPoison))) << k.name << ": *out was written";
  }
  // NaN in the padding between rows is never read.
  std::vector<float> padded(size_t(kVocab * (kHidden + 3)), kNaN);
  for (int64_t r = 0; r < kVocab; ++r)
    for (int64_t c = 0; c < kHidden; ++c) padded[size_t(r * (kHidden + 3) + c)] = w_.f32[size_t(r * kHidden + c)];
  flashspec_tensor t = flashspec_tensor_make(padded.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, kVocab, kHidden);
  t.row_stride = kHidden + 3;
  flashspec_lm_head* out = nullptr;
  EXPECT_EQ(flashspec_lm_head_create(ctx(), &t, FLASHSPEC_LM_HEAD_COPY, &out), FLASHSPEC_OK)
      << flashspec_context_last_error(ctx());
  flashspec_lm_head_destroy(out);
}

// ---------------------------------------------------------------------------
// flashspec_draft
// ---------------------------------------------------------------------------
TEST_F(BadInputWithHead, Draft) {
  constexpr int64_t kRows = 3;
  struct Call {
    flashspec_context* ctx;
    const flashspec_lm_head* head;
    flashspec_tensor hidden;
    flashspec_draft_params params;
    bool null_hidden = false, null_params = false, null_tokens = false;
    std::vector<float> data;
    std::vector<uint16_t> half;
    std::vector<float> temps;
    std::vector<int32_t> positions;
  };
  struct Case {
    const char* name;
    flashspec_status status;
    const char* argument;
    std::function<void(Call&)> mutate;
  };
  const std::vector<Case> cases = {
      {"ctx NULL", FLASHSPEC_ERR_NULL_POINTER, "ctx", [](Call& c) { c.ctx = nullptr; }},
      {"head NULL", FLASHSPEC_ERR_NULL_POINTER, "head", [](Call& c) { c.head = nullptr; }},
      {"hidden NULL", FLASHSPEC_ERR_NULL_POINTER, "hidden", [](Call& c) { c.null_hidden = true; }},
      {"hidden->data NULL", FLASHSPEC_ERR_NULL_POINTER, "hidden", [](Call& c) { c.hidden.data = nullptr; }},
      {"tokens_out NULL", FLASHSPEC_ERR_NULL_POINTER, "tokens_out", [](Call& c) { c.null_tokens = true; }},
      {"params->struct_size 0", FLASHSPEC_ERR_STRUCT_SIZE, "params->struct_size",
       [](Call& c) { c.params.struct_size = 0; }},
      {"params->struct_size larger", FLASHSPEC_ERR_STRUCT_SIZE, "params->struct_size",
       [](Call& c) { c.params.struct_size = sizeof(flashspec_draft_params) + 4; }},
      {"rows 0", FLASHSPEC_ERR_OUT_OF_RANGE, "hidden", [](Call& c) { c.hidden.rows = 0; }},
      {"rows -2", FLASHSPEC_ERR_OUT_OF_RANGE, "hidden", [](Call& c) { c.hidden.rows = -2; }},
      {"cols 0", FLASHSPEC_ERR_OUT_OF_RANGE, "hidden", [](Call& c) { c.hidden.cols = 0; }},
      {"cols != d", FLASHSPEC_ERR_OUT_OF_RANGE, "hidden",
       [](Call& c) { c.hidden.cols = kHidden - 1, c.hidden.row_stride = kHidden - 1; }},
      {"row_stride < cols", FLASHSPEC_ERR_OUT_OF_RANGE, "hidden", [](Call& c) { c.hidden.row_stride = kHidden - 2; }},
      {"rows * row_stride overflows", FLASHSPEC_ERR_OUT_OF_RANGE, "hidden",
       [](Call& c) { c.hidden.rows = int64_t(1) << 40, c.hidden.row_stride = int64_t(1) << 40; }},
      {"more rows than max_rows", FLASHSPEC_ERR_WORKSPACE_EXCEEDED, "hidden",
       [](Call& c) {
         c.data.assign(size_t((kMaxRows + 1) * kHidden), 0.5f);
         c.hidden.data = c.data.data(), c.hidden.rows = kMaxRows + 1;
       }},
      {"dtype 3", FLASHSPEC_ERR_DTYPE_MISMATCH, "hidden", [](Call& c) { c.hidden.dtype = flashspec_dtype(3); }},
      {"memory 5", FLASHSPEC_ERR_INVALID_ARGUMENT, "hidden", [](Call& c) { c.hidden.memory = flashspec_memory(5); }},
      {"hidden in device memory", FLASHSPEC_ERR_DEVICE_MISMATCH, "hidden->memory",
       [](Call& c) { c.hidden.memory = FLASHSPEC_MEMORY_CUDA; }},
      {"params->memory device", FLASHSPEC_ERR_DEVICE_MISMATCH, "params->memory",
       [](Call& c) { c.params.memory = FLASHSPEC_MEMORY_CUDA; }},
      {"params->memory 4", FLASHSPEC_ERR_INVALID_ARGUMENT, "params->memory",
       [](Call& c) { c.params.memory = flashspec_memory(4); }},
      {"params->memory -1", FLASHSPEC_ERR_INVALID_ARGUMENT, "params->memory",
       [](Call& c) { set_raw(c.params.memory, -1); }},
      {"hidden dtype -7", FLASHSPEC_ERR_DTYPE_MISMATCH, "hidden", [](Call& c) { set_raw(c.hidden.dtype, -7); }},
      {"temperature -1", FLASHSPEC_ERR_INVALID_ARGUMENT, "params->temperature",
       [](Call& c) { c.params.temperature = -1.0f; }},
      {"temperature NaN", FLASHSPEC_ERR_INVALID_ARGUMENT, "params->temperature",
       [](Call& c) { c.params.temperature = kNaN; }},
      {"temperature Inf", FLASHSPEC_ERR_INVALID_ARGUMENT, "params->temperature",
       [](Call& c) { c.params.temperature = kInf; }},
      {"temperatures[2] -0.5", FLASHSPEC_ERR_INVALID_ARGUMENT, "params->temperatures",
       [](Call& c) { c.temps = {1.0f, 1.0f, -0.5f}, c.params.temperatures = c.temps.data(); }},
      {"temperatures[0] NaN", FLASHSPEC_ERR_INVALID_ARGUMENT, "params->temperatures",
       [](Call& c) { c.temps = {kNaN, 1.0f, 1.0f}, c.params.temperatures = c.temps.data(); }},
      {"positions[1] -1", FLASHSPEC_ERR_OUT_OF_RANGE, "params->positions",
       [](Call& c) { c.positions = {0, -1, 0}, c.params.positions = c.positions.data(); }},
      {"positions[2] above FLASHSPEC_MAX_DRAFT_LEN", FLASHSPEC_ERR_OUT_OF_RANGE, "params->positions",
       [](Call& c) { c.positions = {0, 1, FLASHSPEC_MAX_DRAFT_LEN + 1}, c.params.positions = c.positions.data(); }},
      {"NaN hidden value", FLASHSPEC_ERR_NON_FINITE, "hidden", [](Call& c) { c.data[kHidden + 2] = kNaN; }},
      {"Inf hidden value in the last row", FLASHSPEC_ERR_NON_FINITE, "hidden",
       [](Call& c) { c.data[(kRows - 1) * kHidden + kHidden - 1] = kInf; }},
      {"NaN hidden value (bf16)", FLASHSPEC_ERR_NON_FINITE, "hidden",
       [](Call& c) {
         c.half.assign(size_t(kRows * kHidden), flashspec::float_to_bf16(0.5f));
         c.half[3] = 0xffc1;
         c.hidden.data = c.half.data(), c.hidden.dtype = FLASHSPEC_DTYPE_BF16;
       }},
      {"logits overflow fp32", FLASHSPEC_ERR_NON_FINITE, "hidden",
       [](Call& c) {
         for (float& v : c.data) v = 3e38f;
       }},
      {"temperature too small for the logits", FLASHSPEC_ERR_NON_FINITE, "temperature",
       [](Call& c) { c.params.temperature = 1e-40f; }},
  };
  Rng rng(52);
  Matrix good = random_matrix(FLASHSPEC_DTYPE_F32, kRows, kHidden, rng, 1.0);
  auto fresh = [&] {
    Call c;
    c.ctx = ctx();
    c.head = head_.get();
    c.data = good.f32;
    c.hidden = flashspec_tensor_make(nullptr, FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, kRows, kHidden);
    flashspec_draft_params_init(&c.params);
    c.params.temperature = 0.7f;
    return c;
  };
  auto run = [](Call& c, int32_t* tokens, float* scores) {
    return flashspec_draft(c.ctx, c.head, c.null_hidden ? nullptr : &c.hidden, c.null_params ? nullptr : &c.params,
                           c.null_tokens ? nullptr : tokens, scores);
  };
  {
    Call c = fresh();
    c.hidden.data = c.data.data();
    std::vector<int32_t> tokens(kRows, kPoison);
    std::vector<float> scores(kRows, poison_float());
    ASSERT_EQ(run(c, tokens.data(), scores.data()), FLASHSPEC_OK) << flashspec_context_last_error(ctx());
    for (int32_t t : tokens) EXPECT_NE(t, kPoison);
  }
  for (const Case& k : cases) {
    Call c = fresh();
    c.hidden.data = c.data.data();
    k.mutate(c);
    std::vector<int32_t> tokens(kMaxRows + 1, kPoison);
    std::vector<float> scores(kMaxRows + 1, poison_float());
    flashspec_status s = run(c, tokens.data(), scores.data());
    expect_failure(k.name, s, k.status, c.ctx, k.argument);
    for (size_t i = 0; i < tokens.size(); ++i) {
      EXPECT_EQ(tokens[i], kPoison) << k.name << ": tokens_out[" << i << "] written";
      EXPECT_TRUE(is_poison(scores[i])) << k.name << ": scores_out[" << i << "] written";
    }
  }
}

// ---------------------------------------------------------------------------
// flashspec_draft_top_k: its own arguments (k, refused controls, outputs of
// [rows, k]); hidden and params are checked by flashspec_draft's table.
// ---------------------------------------------------------------------------
TEST_F(BadInputWithHead, DraftTopK) {
  constexpr int64_t kRows = 3;
  constexpr int32_t kK = 4;
  struct Call {
    flashspec_context* ctx;
    const flashspec_lm_head* head;
    flashspec_tensor hidden;
    flashspec_draft_params params;
    flashspec_sampling_controls controls;
    int32_t k = kK;
    bool null_hidden = false, null_tokens = false;
    bool logprobs_in_tokens = false;  // logprobs_out points into tokens_out's [rows, k]
    bool logprobs_in_hidden = false;
    std::vector<float> data;
    std::vector<int32_t> top_k{2, 2, 2}, bias_offsets{0, 1, 1, 1}, bias_tokens{0};
    std::vector<float> probabilities{0.5f, 0.5f, 0.5f}, bias_values{1.0f};
    std::vector<uint32_t> mask;
  };
  struct Case {
    const char* name;
    flashspec_status status;
    const char* argument;
    std::function<void(Call&)> mutate;
  };
  const std::vector<Case> cases = {
      {"ctx NULL", FLASHSPEC_ERR_NULL_POINTER, "ctx", [](Call& c) { c.ctx = nullptr; }},
      {"head NULL", FLASHSPEC_ERR_NULL_POINTER, "head", [](Call& c) { c.head = nullptr; }},
      {"hidden NULL", FLASHSPEC_ERR_NULL_POINTER, "hidden", [](Call& c) { c.null_hidden = true; }},
      {"tokens_out NULL", FLASHSPEC_ERR_NULL_POINTER, "tokens_out", [](Call& c) { c.null_tokens = true; }},
      {"k 0", FLASHSPEC_ERR_OUT_OF_RANGE, "k", [](Call& c) { c.k = 0; }},
      {"k -1", FLASHSPEC_ERR_OUT_OF_RANGE, "k", [](Call& c) { c.k = -1; }},
      {"k 17", FLASHSPEC_ERR_OUT_OF_RANGE, "k", [](Call& c) { c.k = FLASHSPEC_MAX_DRAFT_TOP_K + 1; }},
      {"cols != d", FLASHSPEC_ERR_OUT_OF_RANGE, "hidden",
       [](Call& c) { c.hidden.cols = kHidden - 1, c.hidden.row_stride = kHidden - 1; }},
      {"more rows than max_rows", FLASHSPEC_ERR_WORKSPACE_EXCEEDED, "hidden",
       [](Call& c) {
         c.data.assign(size_t((kMaxRows + 1) * kHidden), 0.5f);
         c.hidden.data = c.data.data(), c.hidden.rows = kMaxRows + 1;
       }},
      {"params->struct_size larger", FLASHSPEC_ERR_STRUCT_SIZE, "params->struct_size",
       [](Call& c) { c.params.struct_size = sizeof(flashspec_draft_params) + 4; }},
      {"controls->top_k", FLASHSPEC_ERR_INVALID_ARGUMENT, "params->controls->top_k",
       [](Call& c) { c.controls.top_k = c.top_k.data(); }},
      {"controls->top_k 0 (refused before its values)", FLASHSPEC_ERR_INVALID_ARGUMENT, "params->controls->top_k",
       [](Call& c) { c.top_k = {0, 0, 0}, c.controls.top_k = c.top_k.data(); }},
      {"controls->top_p", FLASHSPEC_ERR_INVALID_ARGUMENT, "params->controls->top_p",
       [](Call& c) { c.controls.top_p = c.probabilities.data(); }},
      {"controls->min_p", FLASHSPEC_ERR_INVALID_ARGUMENT, "params->controls->min_p",
       [](Call& c) { c.controls.min_p = c.probabilities.data(); }},
      {"controls->typical_epsilon", FLASHSPEC_ERR_INVALID_ARGUMENT, "params->controls->typical_epsilon",
       [](Call& c) { c.controls.typical_epsilon = c.probabilities.data(); }},
      {"controls->struct_size 0", FLASHSPEC_ERR_STRUCT_SIZE, "params->controls",
       [](Call& c) { c.controls.struct_size = 0; }},
      {"controls->bias_tokens out of range", FLASHSPEC_ERR_OUT_OF_RANGE, "params->controls->bias_tokens",
       [](Call& c) { c.bias_tokens = {int32_t(kVocab)}; }},
      {"controls->mask_words wrong", FLASHSPEC_ERR_OUT_OF_RANGE, "params->controls->mask_words",
       [](Call& c) {
         c.mask.assign(size_t(kRows * 10), ~0u);
         c.controls.token_mask = c.mask.data(), c.controls.mask_words = 9;
       }},
      {"a mask row allows no token", FLASHSPEC_ERR_INVALID_ARGUMENT, "params->controls->token_mask",
       [](Call& c) {
         const int32_t words = int32_t((kVocab + 31) / 32);
         c.mask.assign(size_t(kRows * words), ~0u);
         std::fill(c.mask.begin() + words, c.mask.begin() + 2 * words, 0u);
         c.controls.token_mask = c.mask.data();
       }},
      {"tokens_out overlaps logprobs_out", FLASHSPEC_ERR_INVALID_ARGUMENT, "tokens_out",
       [](Call& c) { c.logprobs_in_tokens = true; }},
      {"logprobs_out overlaps hidden", FLASHSPEC_ERR_INVALID_ARGUMENT, "logprobs_out",
       [](Call& c) { c.logprobs_in_hidden = true; }},
      {"NaN hidden value", FLASHSPEC_ERR_NON_FINITE, "hidden", [](Call& c) { c.data[kHidden + 2] = kNaN; }},
  };
  Rng rng(53);
  Matrix good = random_matrix(FLASHSPEC_DTYPE_F32, kRows, kHidden, rng, 1.0);
  auto fresh = [&] {
    Call c;
    c.ctx = ctx();
    c.head = head_.get();
    c.data = good.f32;
    c.hidden = flashspec_tensor_make(nullptr, FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, kRows, kHidden);
    flashspec_draft_params_init(&c.params);
    flashspec_sampling_controls_init(&c.controls);
    return c;
  };
  // The output buffers hold [rows, k] with room past the end; a case's
  // pointers lie inside them (or, for the aliasing cases, on an input).
  constexpr size_t kSlots = size_t(kRows * kK) * 2;
  auto run = [&](Call& c, int32_t* tokens, float* logprobs) {
    c.hidden.data = c.data.data();
    c.controls.bias_offsets = c.bias_offsets.data();
    c.controls.bias_tokens = c.bias_tokens.data();
    c.controls.bias_values = c.bias_values.data();
    c.params.controls = &c.controls;
    float* scores = logprobs;
    if (c.logprobs_in_tokens) scores = reinterpret_cast<float*>(tokens + 1);
    if (c.logprobs_in_hidden) scores = c.data.data();
    return flashspec_draft_top_k(c.ctx, c.head, c.null_hidden ? nullptr : &c.hidden, &c.params, c.k,
                                 c.null_tokens ? nullptr : tokens, scores);
  };
  {
    Call c = fresh();
    std::vector<int32_t> tokens(kSlots, kPoison);
    std::vector<float> logprobs(kSlots, poison_float());
    ASSERT_EQ(run(c, tokens.data(), logprobs.data()), FLASHSPEC_OK) << flashspec_context_last_error(ctx());
    for (size_t i = 0; i < kSlots; ++i) {
      const bool inside = i < size_t(kRows * kK);
      EXPECT_EQ(tokens[i] != kPoison, inside) << "tokens_out[" << i << "]";
      EXPECT_EQ(!is_poison(logprobs[i]), inside) << "logprobs_out[" << i << "]";
    }
  }
  for (const Case& k : cases) {
    Call c = fresh();
    k.mutate(c);
    std::vector<int32_t> tokens(kSlots, kPoison);
    std::vector<float> logprobs(kSlots, poison_float());
    const std::vector<float> hidden_before = c.data;
    flashspec_status s = run(c, tokens.data(), logprobs.data());
    expect_failure(k.name, s, k.status, c.ctx, k.argument);
    for (size_t i = 0; i < kSlots; ++i) {
      EXPECT_EQ(tokens[i], kPoison) << k.name << ": tokens_out[" << i << "] written";
      EXPECT_TRUE(is_poison(logprobs[i])) << k.name << ": logprobs_out[" << i << "] written";
    }
    EXPECT_EQ(std::memcmp(hidden_before.data(), c.data.data(), c.data.size() * sizeof(float)), 0)
        << k.name << ": hidden written";
  }
}

// ---------------------------------------------------------------------------
// flashspec_summaries_create
// ---------------------------------------------------------------------------
TEST_F(BadInputWithHead, SummariesCreate) {
  struct Case {
    const char* name;
    flashspec_status status;
    const char* argument;
    bool null_ctx, null_out;
    int32_t max_rows, max_requests;
  };
  const std::vector<Case> cases = {
      {"ctx NULL", FLASHSPEC_ERR_NULL_POINTER, "ctx", true, false, 8, 2},
      {"out NULL", FLASHSPEC_ERR_NULL_POINTER, "out", false, true, 8, 2},
      {"max_rows 0", FLASHSPEC_ERR_OUT_OF_RANGE, "max_rows", false, false, 0, 1},
      {"max_rows -1", FLASHSPEC_ERR_OUT_OF_RANGE, "max_rows", false, false, -1, 1},
      {"max_rows 2^24+1", FLASHSPEC_ERR_OUT_OF_RANGE, "max_rows", false, false, (1 << 24) + 1, 1},
      {"max_requests 0", FLASHSPEC_ERR_OUT_OF_RANGE, "max_requests", false, false, 8, 0},
      {"max_requests -3", FLASHSPEC_ERR_OUT_OF_RANGE, "max_requests", false, false, 8, -3},
      {"max_requests > max_rows", FLASHSPEC_ERR_OUT_OF_RANGE, "max_requests", false, false, 8, 9},
  };
  flashspec_summaries* ok = nullptr;
  ASSERT_EQ(flashspec_summaries_create(ctx(), 8, 2, &ok), FLASHSPEC_OK);
  flashspec_summaries_destroy(ok);
  for (const Case& k : cases) {
    flashspec_summaries* out = reinterpret_cast<flashspec_summaries*>(uintptr_t(kPoison));
    flashspec_context* c = k.null_ctx ? nullptr : ctx();
    flashspec_status s = flashspec_summaries_create(c, k.max_rows, k.max_requests, k.null_out ? nullptr : &out);
    expect_failure(k.name, s, k.status, c, k.argument);
    EXPECT_EQ(out, reinterpret_cast<flashspec_summaries*>(uintptr_t(kPoison))) << k.name;
  }
}

// ---------------------------------------------------------------------------
// Verify-batch tables: flashspec_verify, flashspec_finalize,
// flashspec_verify_and_finalize.
// ---------------------------------------------------------------------------
// Everything one verify/finalize call reads, owned, so a case can break any
// part of it. Two requests: 2 drafts and 1 draft, 5 target rows; T = 0, so
// a finalize outcome pins down the summaries exactly.
struct BatchCall {
  flashspec_context* ctx = nullptr;
  const flashspec_lm_head* head = nullptr;
  flashspec_summaries* summaries = nullptr;
  std::vector<int32_t> offsets{0, 2, 3};
  std::vector<int32_t> tokens;
  std::vector<float> hidden_data;
  std::vector<float> temps{0.0f, 0.0f};
  std::vector<float> draft_temps{1.0f, 1.0f};
  std::vector<float> uniforms{0.5f, 0.5f, 0.5f};
  std::vector<float> q_data;  // [3, V] draft logits when a case asks for them
  flashspec_tensor hidden{};
  flashspec_tensor q{};
  flashspec_verify_batch batch{};
  bool null_batch = false, null_result = false, null_summaries = false;
  flashspec_verify_result result{};
  std::vector<int32_t> accepted, emitted;
  std::vector<uint64_t> next_steps;

  void build(flashspec_context* c, const flashspec_lm_head* h, const std::vector<float>& rows,
             const std::vector<int32_t>& drafts) {
    ctx = c;
    head = h;
    hidden_data = rows;
    tokens = drafts;
    hidden = flashspec_tensor_make(hidden_data.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, 5, kHidden);
    flashspec_verify_batch_init(&batch);
    batch.num_requests = 2;
    batch.draft_offsets = offsets.data();
    batch.draft_tokens = tokens.data();
    batch.target_hidden = &hidden;
    batch.temperatures = temps.data();
    accepted.assign(kMaxRequests + 2, kPoison);
    emitted.assign(kMaxRows + 2, kPoison);
    next_steps.assign(kMaxRequests + 2, kPoison64);
    flashspec_verify_result_init(&result);
    result.accepted_counts = accepted.data();
    result.emitted_tokens = emitted.data();
    result.next_steps = next_steps.data();
  }
  void use_draft_logits() {
    q_data.assign(size_t(3 * kVocab), 0.1f);
    q = flashspec_tensor_make(q_data.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, 3, kVocab);
    batch.draft_logits = &q;
  }
  // Sparse q: each draft row's support is its drafted token (q 0.5) and two
  // others (0.3, 0.2).
  std::vector<int32_t> support_offsets{0, 3, 6, 9}, support_tokens;
  std::vector<float> support_probs;
  void use_draft_support() {
    support_tokens.clear();
    support_probs.clear();
    for (int32_t x : tokens) {
      support_tokens.insert(support_tokens.end(), {x, int32_t((x + 1) % kVocab), int32_t((x + 2) % kVocab)});
      support_probs.insert(support_probs.end(), {0.5f, 0.3f, 0.2f});
    }
    batch.draft_support_offsets = support_offsets.data();
    batch.draft_support_tokens = support_tokens.data();
    batch.draft_support_probs = support_probs.data();
  }
  // Request 0's drafts as a tree: node 1 a child of node 0.
  std::vector<int32_t> parents{-1, 0, -1};
  void use_tree() { batch.draft_parents = parents.data(); }
  const flashspec_verify_batch* batch_ptr() const { return null_batch ? nullptr : &batch; }
  const flashspec_verify_result* result_ptr() const { return null_result ? nullptr : &result; }
  flashspec_summaries* summaries_ptr() const { return null_summaries ? nullptr : summaries; }
  bool outputs_untouched() const {
    for (int32_t v : accepted)
      if (v != kPoison) return false;
    for (int32_t v : emitted)
      if (v != kPoison) return false;
    for (uint64_t v : next_steps)
      if (v != kPoison64) return false;
    return true;
  }
};

struct BatchCase {
  const char* name;
  flashspec_status status;
  const char* argument;
  std::function<void(BatchCall&)> mutate;
};

// Cases about the batch alone: every entry point that takes a batch must
// refuse them all.
std::vector<BatchCase> batch_cases() {
  return {
      {"ctx NULL", FLASHSPEC_ERR_NULL_POINTER, "ctx", [](BatchCall& c) { c.ctx = nullptr; }},
      {"batch NULL", FLASHSPEC_ERR_NULL_POINTER, "batch", [](BatchCall& c) { c.null_batch = true; }},
      {"batch->struct_size 0", FLASHSPEC_ERR_STRUCT_SIZE, "batch->struct_size",
       [](BatchCall& c) { c.batch.struct_size = 0; }},
      {"batch->struct_size larger", FLASHSPEC_ERR_STRUCT_SIZE, "batch->struct_size",
       [](BatchCall& c) { c.batch.struct_size = sizeof(flashspec_verify_batch) + 8; }},
      {"batch->memory device", FLASHSPEC_ERR_DEVICE_MISMATCH, "batch->memory",
       [](BatchCall& c) { c.batch.memory = FLASHSPEC_MEMORY_CUDA; }},
      {"batch->memory 3", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->memory",
       [](BatchCall& c) { c.batch.memory = flashspec_memory(3); }},
      {"batch->memory -1", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->memory",
       [](BatchCall& c) { set_raw(c.batch.memory, -1); }},
      {"num_requests 0", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->num_requests",
       [](BatchCall& c) { c.batch.num_requests = 0; }},
      {"num_requests -1", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->num_requests",
       [](BatchCall& c) { c.batch.num_requests = -1; }},
      {"num_requests above the context's max_requests", FLASHSPEC_ERR_WORKSPACE_EXCEEDED, "batch->num_requests",
       [](BatchCall& c) { c.batch.num_requests = kMaxRequests + 1; }},
      {"draft_offsets NULL", FLASHSPEC_ERR_NULL_POINTER, "batch->draft_offsets",
       [](BatchCall& c) { c.batch.draft_offsets = nullptr; }},
      {"draft_tokens NULL", FLASHSPEC_ERR_NULL_POINTER, "batch->draft_tokens",
       [](BatchCall& c) { c.batch.draft_tokens = nullptr; }},
      {"target_hidden NULL", FLASHSPEC_ERR_NULL_POINTER, "batch->target_hidden",
       [](BatchCall& c) { c.batch.target_hidden = nullptr; }},
      {"target_hidden->data NULL", FLASHSPEC_ERR_NULL_POINTER, "batch->target_hidden",
       [](BatchCall& c) { c.hidden.data = nullptr; }},
      {"target_hidden rows 0", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->target_hidden",
       [](BatchCall& c) { c.hidden.rows = 0; }},
      {"target_hidden rows < num_requests", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->target_hidden",
       [](BatchCall& c) { c.hidden.rows = 1; }},
      {"target_hidden row_stride < cols", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->target_hidden",
       [](BatchCall& c) { c.hidden.row_stride = 3; }},
      {"target_hidden rows * row_stride overflows", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->target_hidden",
       [](BatchCall& c) { c.hidden.rows = int64_t(1) << 31, c.hidden.row_stride = int64_t(1) << 40; }},
      {"target_hidden dtype 7", FLASHSPEC_ERR_DTYPE_MISMATCH, "batch->target_hidden",
       [](BatchCall& c) { c.hidden.dtype = flashspec_dtype(7); }},
      {"target_hidden in device memory", FLASHSPEC_ERR_DEVICE_MISMATCH, "batch->target_hidden->memory",
       [](BatchCall& c) { c.hidden.memory = FLASHSPEC_MEMORY_CUDA; }},
      {"draft_offsets[0] not 0", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->draft_offsets",
       [](BatchCall& c) { c.offsets = {1, 2, 3}; }},
      {"draft_offsets decreasing", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->draft_offsets",
       [](BatchCall& c) { c.offsets = {0, 3, 2}; }},
      {"draft_offsets[R] does not match target_hidden rows", FLASHSPEC_ERR_OUT_OF_RANGE, "draft_offsets",
       [](BatchCall& c) { c.offsets = {0, 1, 2}; }},
      {"target_hidden has one row too many", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->target_hidden",
       [](BatchCall& c) {
         c.hidden_data.resize(6 * kHidden, 0.5f);
         c.hidden.data = c.hidden_data.data(), c.hidden.rows = 6;
       }},
      {"n_r above max_draft_len", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->draft_offsets",
       [](BatchCall& c) { c.batch.max_draft_len = 1; }},
      {"max_draft_len -1", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->max_draft_len",
       [](BatchCall& c) { c.batch.max_draft_len = -1; }},
      {"max_draft_len above FLASHSPEC_MAX_DRAFT_LEN", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->max_draft_len",
       [](BatchCall& c) { c.batch.max_draft_len = FLASHSPEC_MAX_DRAFT_LEN + 1; }},
      {"temperatures[1] -1", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->temperatures",
       [](BatchCall& c) { c.temps[1] = -1.0f; }},
      {"temperatures[0] NaN", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->temperatures",
       [](BatchCall& c) { c.temps[0] = kNaN; }},
      {"temperatures[0] Inf", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->temperatures",
       [](BatchCall& c) { c.temps[0] = kInf; }},
      {"draft_temperatures[0] 0", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->draft_temperatures",
       [](BatchCall& c) { c.draft_temps[0] = 0.0f, c.batch.draft_temperatures = c.draft_temps.data(); }},
      {"draft_temperatures[1] -2", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->draft_temperatures",
       [](BatchCall& c) { c.draft_temps[1] = -2.0f, c.batch.draft_temperatures = c.draft_temps.data(); }},
      {"draft_temperatures[1] NaN", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->draft_temperatures",
       [](BatchCall& c) { c.draft_temps[1] = kNaN, c.batch.draft_temperatures = c.draft_temps.data(); }},
      {"greedy 2", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->greedy", [](BatchCall& c) { c.batch.greedy = 2; }},
      {"greedy -1", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->greedy", [](BatchCall& c) { c.batch.greedy = -1; }},
      {"greedy with temperatures", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->temperatures",
       [](BatchCall& c) { c.batch.greedy = 1; }},
      {"accept_uniforms[1] 0", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->accept_uniforms",
       [](BatchCall& c) { c.uniforms[1] = 0.0f, c.batch.accept_uniforms = c.uniforms.data(); }},
      {"accept_uniforms[2] 1", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->accept_uniforms",
       [](BatchCall& c) { c.uniforms[2] = 1.0f, c.batch.accept_uniforms = c.uniforms.data(); }},
      {"accept_uniforms[0] NaN", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->accept_uniforms",
       [](BatchCall& c) { c.uniforms[0] = kNaN, c.batch.accept_uniforms = c.uniforms.data(); }},
      {"draft_logits rows != draft_offsets[R]", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->draft_logits",
       [](BatchCall& c) { c.use_draft_logits(), c.q.rows = 2; }},
      {"draft_logits in device memory", FLASHSPEC_ERR_DEVICE_MISMATCH, "batch->draft_logits->memory",
       [](BatchCall& c) { c.use_draft_logits(), c.q.memory = FLASHSPEC_MEMORY_CUDA; }},
      {"draft_logits dtype 3", FLASHSPEC_ERR_DTYPE_MISMATCH, "batch->draft_logits",
       [](BatchCall& c) { c.use_draft_logits(), c.q.dtype = flashspec_dtype(3); }},
  };
}

// Cases that need the head (vocabulary, hidden size) or run the pass.
std::vector<BatchCase> verify_cases() {
  return {
      {"head NULL", FLASHSPEC_ERR_NULL_POINTER, "head", [](BatchCall& c) { c.head = nullptr; }},
      {"draft token -1", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->draft_tokens", [](BatchCall& c) { c.tokens[1] = -1; }},
      {"draft token V", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->draft_tokens",
       [](BatchCall& c) { c.tokens[2] = int32_t(kVocab); }},
      {"target_hidden cols != d", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->target_hidden",
       [](BatchCall& c) { c.hidden.cols = kHidden / 2, c.hidden.row_stride = kHidden; }},
      {"draft_logits cols != V", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->draft_logits",
       [](BatchCall& c) { c.use_draft_logits(), c.q.cols = kVocab - 1, c.q.row_stride = kVocab; }},
      {"NaN in a target hidden row", FLASHSPEC_ERR_NON_FINITE, "batch->target_hidden",
       [](BatchCall& c) { c.hidden_data[4 * kHidden + 1] = kNaN; }},
      {"Inf in a target hidden row", FLASHSPEC_ERR_NON_FINITE, "batch->target_hidden",
       [](BatchCall& c) { c.hidden_data[0] = -kInf; }},
      {"target logits overflow fp32", FLASHSPEC_ERR_NON_FINITE, "batch->target_hidden",
       [](BatchCall& c) {
         for (int64_t i = 2 * kHidden; i < 3 * kHidden; ++i) c.hidden_data[size_t(i)] = 3e38f;
       }},
      {"temperature too small for the logits", FLASHSPEC_ERR_NON_FINITE, "batch->temperatures",
       [](BatchCall& c) { c.temps[1] = 1e-40f; }},
      {"NaN in the draft logits (after the pass)", FLASHSPEC_ERR_NON_FINITE, "batch->draft_logits",
       [](BatchCall& c) {
         c.use_draft_logits();
         c.temps = {1.0f, 1.0f};
         c.q_data[2 * kVocab + 77] = kNaN;
       }},
      {"Inf in the draft logits", FLASHSPEC_ERR_NON_FINITE, "batch->draft_logits",
       [](BatchCall& c) {
         c.use_draft_logits();
         c.temps = {0.5f, 2.0f};
         c.q_data[5] = kInf;
       }},
      // Sparse draft distributions.
      {"draft support without its tokens", FLASHSPEC_ERR_NULL_POINTER, "batch->draft_support_tokens",
       [](BatchCall& c) { c.use_draft_support(), c.batch.draft_support_tokens = nullptr; }},
      {"draft support probs without offsets", FLASHSPEC_ERR_NULL_POINTER, "batch->draft_support_offsets",
       [](BatchCall& c) { c.use_draft_support(), c.batch.draft_support_offsets = nullptr; }},
      {"draft support and draft logits", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->draft_support_offsets",
       [](BatchCall& c) { c.use_draft_support(), c.use_draft_logits(); }},
      {"draft support with draft controls", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->draft_controls",
       [](BatchCall& c) {
         static const int32_t top_k[2] = {2, 2};
         static flashspec_sampling_controls controls;
         flashspec_sampling_controls_init(&controls);
         controls.top_k = top_k;
         c.use_draft_support();
         c.batch.draft_controls = &controls;
       }},
      {"draft support offsets[0] != 0", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->draft_support_offsets",
       [](BatchCall& c) { c.use_draft_support(), c.support_offsets[0] = 1; }},
      {"draft support k = 0", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->draft_support_offsets",
       [](BatchCall& c) { c.use_draft_support(), c.support_offsets = {0, 3, 3, 6}; }},
      {"draft support k > 64", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->draft_support_offsets",
       [](BatchCall& c) {
         c.use_draft_support();
         c.support_offsets = {0, 65, 68, 71};
         c.support_tokens.clear();
         c.support_probs.clear();
         for (int32_t i = 0; i < 71; ++i) c.support_tokens.push_back(i), c.support_probs.push_back(3.0f / 71.0f);
         c.batch.draft_support_tokens = c.support_tokens.data();
         c.batch.draft_support_probs = c.support_probs.data();
       }},
      {"draft support token -1", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->draft_support_tokens",
       [](BatchCall& c) { c.use_draft_support(), c.support_tokens[4] = -1; }},
      {"draft support token V", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->draft_support_tokens",
       [](BatchCall& c) { c.use_draft_support(), c.support_tokens[8] = int32_t(kVocab); }},
      {"draft support token repeated", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->draft_support_tokens",
       [](BatchCall& c) { c.use_draft_support(), c.support_tokens[5] = c.support_tokens[4]; }},
      {"draft support prob negative", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->draft_support_probs",
       [](BatchCall& c) { c.use_draft_support(), c.support_probs[1] = -0.3f, c.support_probs[0] = 1.1f; }},
      {"draft support prob NaN", FLASHSPEC_ERR_NON_FINITE, "batch->draft_support_probs",
       [](BatchCall& c) { c.use_draft_support(), c.support_probs[7] = kNaN; }},
      {"draft support prob Inf", FLASHSPEC_ERR_NON_FINITE, "batch->draft_support_probs",
       [](BatchCall& c) { c.use_draft_support(), c.support_probs[2] = kInf; }},
      {"draft support sums to 0.99", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->draft_support_probs",
       [](BatchCall& c) { c.use_draft_support(), c.support_probs[5] = 0.19f; }},
      {"draft support sums to 1.01", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->draft_support_probs",
       [](BatchCall& c) { c.use_draft_support(), c.support_probs[3] = 0.51f; }},
      {"drafted token outside its support", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->draft_tokens",
       [](BatchCall& c) { c.use_draft_support(), c.support_tokens[3] = (c.tokens[1] + 7) % int32_t(kVocab); }},
      {"drafted token with q = 0", FLASHSPEC_ERR_INVALID_ARGUMENT, "batch->draft_tokens",
       [](BatchCall& c) {
         c.use_draft_support();
         c.support_probs[6] = 0.0f, c.support_probs[7] = 0.8f;
       }},
      // Stochastic trees: the parents rule holds for them as for point masses.
      {"stochastic tree parent after its child", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->draft_parents",
       [](BatchCall& c) { c.use_draft_support(), c.use_tree(), c.parents[0] = 1; }},
      {"stochastic tree node its own parent", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->draft_parents",
       [](BatchCall& c) { c.use_draft_logits(), c.use_tree(), c.parents[1] = 1; }},
      {"stochastic tree parent below -1", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->draft_parents",
       [](BatchCall& c) { c.use_draft_support(), c.use_tree(), c.parents[2] = -2; }},
  };
}

class BadInputBatch : public BadInputWithHead {
 protected:
  void SetUp() override {
    BadInputWithHead::SetUp();
    Rng rng(53);
    // Two sets of target rows; drafts are the argmaxes of the first, so the
    // good batch accepts every draft, and summaries of the second set would
    // give a different outcome.
    Matrix first = random_matrix(FLASHSPEC_DTYPE_F32, 5, kHidden, rng, 1.0);
    Matrix second = random_matrix(FLASHSPEC_DTYPE_F32, 5, kHidden, rng, 1.0);
    good_rows_ = first.f32;
    other_rows_ = second.f32;
    std::vector<int32_t> argmaxes;
    for (int64_t r = 0; r < 5; ++r) argmaxes.push_back(argmax(reference_logits(w_, first, r).logit));
    good_drafts_ = {argmaxes[0], argmaxes[1], argmaxes[3]};  // rows 0,1 score request 0; row 3 request 1
    expected_accepted_ = {2, 1};
    expected_emitted_ = {argmaxes[0], argmaxes[1], argmaxes[2], argmaxes[3], argmaxes[4]};
    flashspec_summaries* raw = nullptr;
    ASSERT_EQ(flashspec_summaries_create(ctx(), kMaxRows, kMaxRequests, &raw), FLASHSPEC_OK);
    summaries_.reset(raw);
  }

  // A good call on the first rows.
  BatchCall good_call() {
    BatchCall c;
    c.build(ctx(), head_.get(), good_rows_, good_drafts_);
    c.summaries = summaries_.get();
    return c;
  }
  // The same batch shape on the other rows: what a failing case starts from.
  BatchCall other_call() {
    BatchCall c;
    c.build(ctx(), head_.get(), other_rows_, good_drafts_);
    c.summaries = summaries_.get();
    return c;
  }

  void verify_good() {
    BatchCall c = good_call();
    ASSERT_EQ(flashspec_verify(ctx(), head_.get(), &c.batch, summaries_.get()), FLASHSPEC_OK)
        << flashspec_context_last_error(ctx());
  }

  // Finalize of the good batch on the summaries gives the good outcome.
  void expect_summaries_hold_good_batch(const std::string& name) {
    BatchCall c = good_call();
    ASSERT_EQ(flashspec_finalize(ctx(), &c.batch, summaries_.get(), &c.result), FLASHSPEC_OK)
        << name << ": " << flashspec_context_last_error(ctx());
    EXPECT_EQ(std::vector<int32_t>(c.accepted.begin(), c.accepted.begin() + 2), expected_accepted_)
        << name << ": summaries changed by a failed call";
    EXPECT_EQ(std::vector<int32_t>(c.emitted.begin(), c.emitted.begin() + 5), expected_emitted_)
        << name << ": summaries changed by a failed call";
  }

  std::vector<float> good_rows_, other_rows_;
  std::vector<int32_t> good_drafts_, expected_accepted_, expected_emitted_;
  SummariesPtr summaries_;
};

TEST_F(BadInputBatch, GoodBatchIsAccepted) {
  verify_good();
  expect_summaries_hold_good_batch("good batch");
  // The other rows really give another outcome, so the check above can fail.
  BatchCall other = other_call();
  ASSERT_EQ(flashspec_verify(ctx(), head_.get(), &other.batch, summaries_.get()), FLASHSPEC_OK);
  BatchCall c = good_call();
  ASSERT_EQ(flashspec_finalize(ctx(), &c.batch, summaries_.get(), &c.result), FLASHSPEC_OK);
  EXPECT_NE(std::vector<int32_t>(c.emitted.begin(), c.emitted.begin() + 5), expected_emitted_);
}

TEST_F(BadInputBatch, SparseSupportsAndStochasticTreesAreAccepted) {
  // The cases above break one thing each of these good batches.
  for (bool tree : {false, true}) {
    BatchCall c = good_call();
    if (tree) c.use_tree();
    // Repeated sibling tokens are allowed in a stochastic tree: its
    // children are independent draws (flashspec.h, "Tree verify").
    if (tree) c.tokens[1] = c.tokens[0], c.parents[1] = -1;
    c.use_draft_support();
    c.temps = {1.0f, 0.7f};
    ASSERT_EQ(flashspec_verify_and_finalize(c.ctx, c.head, &c.batch, &c.result), FLASHSPEC_OK)
        << flashspec_context_last_error(c.ctx);
    EXPECT_GE(c.accepted[0], 0);
    EXPECT_GE(c.accepted[1], 0);
  }
}

TEST_F(BadInputBatch, Verify) {
  std::vector<BatchCase> cases = batch_cases();
  for (BatchCase& k : verify_cases()) cases.push_back(k);
  cases.push_back({"summaries NULL", FLASHSPEC_ERR_NULL_POINTER, "summaries",
                   [](BatchCall& c) { c.null_summaries = true; }});
  flashspec_summaries* small_rows = nullptr;
  flashspec_summaries* small_requests = nullptr;
  ASSERT_EQ(flashspec_summaries_create(ctx(), 4, 2, &small_rows), FLASHSPEC_OK);
  ASSERT_EQ(flashspec_summaries_create(ctx(), 16, 1, &small_requests), FLASHSPEC_OK);
  SummariesPtr keep_rows(small_rows), keep_requests(small_requests);
  cases.push_back({"more rows than the summaries hold", FLASHSPEC_ERR_WORKSPACE_EXCEEDED, "summaries",
                   [small_rows](BatchCall& c) { c.summaries = small_rows; }});
  cases.push_back({"more requests than the summaries hold", FLASHSPEC_ERR_WORKSPACE_EXCEEDED, "summaries",
                   [small_requests](BatchCall& c) { c.summaries = small_requests; }});
  // Summaries larger than the context: the context's max_rows still bounds a
  // verify, on every backend (17 rows here, max_rows 16).
  flashspec_summaries* large = nullptr;
  ASSERT_EQ(flashspec_summaries_create(ctx(), 2 * kMaxRows, kMaxRequests, &large), FLASHSPEC_OK);
  SummariesPtr keep_large(large);
  cases.push_back({"more rows than the context's max_rows", FLASHSPEC_ERR_WORKSPACE_EXCEEDED, "batch->target_hidden",
                   [large](BatchCall& c) {
                     c.summaries = large;
                     c.offsets = {0, 8, 15};
                     c.tokens.assign(15, 1);
                     c.hidden_data.assign(17 * kHidden, 0.25f);
                     c.batch.draft_tokens = c.tokens.data();
                     c.hidden.data = c.hidden_data.data(), c.hidden.rows = 17;
                   }});
  for (const BatchCase& k : cases) {
    verify_good();
    BatchCall c = other_call();
    k.mutate(c);
    flashspec_status s = flashspec_verify(c.ctx, c.head, c.batch_ptr(), c.summaries_ptr());
    expect_failure(k.name, s, k.status, c.ctx, k.argument);
    expect_summaries_hold_good_batch(k.name);
  }
}

TEST_F(BadInputBatch, Finalize) {
  std::vector<BatchCase> cases = batch_cases();
  cases.push_back({"summaries NULL", FLASHSPEC_ERR_NULL_POINTER, "summaries",
                   [](BatchCall& c) { c.null_summaries = true; }});
  cases.push_back({"draft token -1", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->draft_tokens",
                   [](BatchCall& c) { c.tokens[0] = -1; }});
  cases.push_back({"draft token V", FLASHSPEC_ERR_OUT_OF_RANGE, "batch->draft_tokens",
                   [](BatchCall& c) { c.tokens[2] = int32_t(kVocab); }});
  cases.push_back({"result NULL", FLASHSPEC_ERR_NULL_POINTER, "result", [](BatchCall& c) { c.null_result = true; }});
  cases.push_back({"result->struct_size 0", FLASHSPEC_ERR_STRUCT_SIZE, "result->struct_size",
                   [](BatchCall& c) { c.result.struct_size = 0; }});
  cases.push_back({"result->struct_size larger", FLASHSPEC_ERR_STRUCT_SIZE, "result->struct_size",
                   [](BatchCall& c) { c.result.struct_size = sizeof(flashspec_verify_result) + 4; }});
  cases.push_back({"result->memory device", FLASHSPEC_ERR_DEVICE_MISMATCH, "result->memory",
                   [](BatchCall& c) { c.result.memory = FLASHSPEC_MEMORY_CUDA; }});
  cases.push_back({"result->memory -1", FLASHSPEC_ERR_INVALID_ARGUMENT, "result->memory",
                   [](BatchCall& c) { set_raw(c.result.memory, -1); }});
  cases.push_back({"result->accepted_counts NULL", FLASHSPEC_ERR_NULL_POINTER, "result->accepted_counts",
                   [](BatchCall& c) { c.result.accepted_counts = nullptr; }});
  cases.push_back({"result->emitted_tokens NULL", FLASHSPEC_ERR_NULL_POINTER, "result->emitted_tokens",
                   [](BatchCall& c) { c.result.emitted_tokens = nullptr; }});
  // Batches the summaries do not describe.
  cases.push_back({"fewer requests than verified", FLASHSPEC_ERR_INVALID_ARGUMENT, "summaries",
                   [](BatchCall& c) { c.batch.num_requests = 1, c.hidden.rows = 3; }});
  cases.push_back({"same shape, other draft lengths", FLASHSPEC_ERR_INVALID_ARGUMENT, "summaries",
                   [](BatchCall& c) { c.offsets = {0, 1, 3}; }});
  cases.push_back({"same shape, other draft tokens", FLASHSPEC_ERR_INVALID_ARGUMENT, "summaries",
                   [](BatchCall& c) { c.tokens[1] = (c.tokens[1] + 1) % int32_t(kVocab); }});
  cases.push_back({"same shape, other temperatures", FLASHSPEC_ERR_INVALID_ARGUMENT, "summaries",
                   [](BatchCall& c) { c.temps[0] = 1.0f; }});
  cases.push_back({"same shape, other seeds", FLASHSPEC_ERR_INVALID_ARGUMENT, "summaries",
                   [](BatchCall& c) {
                     static const uint64_t seeds[2] = {1, 2};
                     c.batch.seeds = seeds;
                   }});
  for (const BatchCase& k : cases) {
    verify_good();
    BatchCall c = good_call();
    k.mutate(c);
    flashspec_status s = flashspec_finalize(c.ctx, c.batch_ptr(), c.summaries_ptr(), c.result_ptr());
    expect_failure(k.name, s, k.status, c.ctx, k.argument);
    EXPECT_TRUE(c.outputs_untouched()) << k.name << ": result arrays written";
    expect_summaries_hold_good_batch(k.name);
  }
  // Summaries that were never verified describe no batch.
  flashspec_summaries* fresh = nullptr;
  ASSERT_EQ(flashspec_summaries_create(ctx(), kMaxRows, kMaxRequests, &fresh), FLASHSPEC_OK);
  SummariesPtr keep(fresh);
  BatchCall c = good_call();
  expect_failure("never verified", flashspec_finalize(ctx(), &c.batch, fresh, &c.result),
                 FLASHSPEC_ERR_INVALID_ARGUMENT, ctx(), "summaries");
  EXPECT_TRUE(c.outputs_untouched());
}

TEST_F(BadInputBatch, VerifyAndFinalize) {
  std::vector<BatchCase> cases = batch_cases();
  for (BatchCase& k : verify_cases()) cases.push_back(k);
  cases.push_back({"result NULL", FLASHSPEC_ERR_NULL_POINTER, "result", [](BatchCall& c) { c.null_result = true; }});
  cases.push_back({"result->struct_size 3", FLASHSPEC_ERR_STRUCT_SIZE, "result->struct_size",
                   [](BatchCall& c) { c.result.struct_size = 3; }});
  cases.push_back({"result->memory device", FLASHSPEC_ERR_DEVICE_MISMATCH, "result->memory",
                   [](BatchCall& c) { c.result.memory = FLASHSPEC_MEMORY_CUDA; }});
  cases.push_back({"result->accepted_counts NULL", FLASHSPEC_ERR_NULL_POINTER, "result->accepted_counts",
                   [](BatchCall& c) { c.result.accepted_counts = nullptr; }});
  cases.push_back({"result->emitted_tokens NULL", FLASHSPEC_ERR_NULL_POINTER, "result->emitted_tokens",
                   [](BatchCall& c) { c.result.emitted_tokens = nullptr; }});
  // The context's own workspace (max_rows 16): 2 requests with 8 + 7 drafts
  // need 17 rows.
  cases.push_back({"more rows than the context's max_rows", FLASHSPEC_ERR_WORKSPACE_EXCEEDED, "workspace",
                   [](BatchCall& c) {
                     c.offsets = {0, 8, 15};
                     c.tokens.assign(15, 1);
                     c.hidden_data.assign(17 * kHidden, 0.25f);
                     c.batch.draft_tokens = c.tokens.data();
                     c.hidden.data = c.hidden_data.data(), c.hidden.rows = 17;
                   }});
  {
    BatchCall c = good_call();
    ASSERT_EQ(flashspec_verify_and_finalize(ctx(), head_.get(), &c.batch, &c.result), FLASHSPEC_OK);
    EXPECT_EQ(std::vector<int32_t>(c.emitted.begin(), c.emitted.begin() + 5), expected_emitted_);
    EXPECT_EQ(c.next_steps[0], 1u);
  }
  for (const BatchCase& k : cases) {
    BatchCall c = other_call();
    k.mutate(c);
    flashspec_status s = flashspec_verify_and_finalize(c.ctx, c.head, c.batch_ptr(), c.result_ptr());
    expect_failure(k.name, s, k.status, c.ctx, k.argument);
    EXPECT_TRUE(c.outputs_untouched()) << k.name << ": result arrays written";
  }
}

// ---------------------------------------------------------------------------
// NULL no-ops and NULL queries
// ---------------------------------------------------------------------------
TEST(BadInput, InitAndDestroyAcceptNull) {
  flashspec_context_params_init(nullptr);
  flashspec_draft_params_init(nullptr);
  flashspec_verify_batch_init(nullptr);
  flashspec_verify_result_init(nullptr);
  flashspec_context_destroy(nullptr);
  flashspec_lm_head_destroy(nullptr);
  flashspec_summaries_destroy(nullptr);
  EXPECT_EQ(flashspec_lm_head_vocab_size(nullptr), 0);
  EXPECT_EQ(flashspec_lm_head_hidden_size(nullptr), 0);
  EXPECT_EQ(flashspec_context_synchronize(nullptr), FLASHSPEC_ERR_NULL_POINTER);
  EXPECT_EQ(flashspec_context_last_cuda_error(nullptr), 0);
  EXPECT_NE(flashspec_context_last_error(nullptr), nullptr);

  // The *_init functions fill struct_size and the documented defaults.
  flashspec_context_params cp;
  std::memset(&cp, 0xab, sizeof cp);
  flashspec_context_params_init(&cp);
  EXPECT_EQ(cp.struct_size, sizeof cp);
  EXPECT_EQ(cp.backend, FLASHSPEC_BACKEND_AUTO);
  EXPECT_EQ(cp.seed, 0u);
  EXPECT_EQ(cp.cpu_threads, 0);
  EXPECT_EQ(cp.max_rows, 512);
  EXPECT_EQ(cp.max_requests, 512);
  flashspec_draft_params dp;
  std::memset(&dp, 0xab, sizeof dp);
  flashspec_draft_params_init(&dp);
  EXPECT_EQ(dp.struct_size, sizeof dp);
  EXPECT_EQ(dp.memory, FLASHSPEC_MEMORY_HOST);
  EXPECT_EQ(dp.temperature, 0.0f);
  EXPECT_EQ(dp.temperatures, nullptr);
  EXPECT_EQ(dp.positions, nullptr);
  flashspec_verify_batch vb;
  std::memset(&vb, 0xab, sizeof vb);
  flashspec_verify_batch_init(&vb);
  EXPECT_EQ(vb.struct_size, sizeof vb);
  EXPECT_EQ(vb.num_requests, 0);
  EXPECT_EQ(vb.draft_offsets, nullptr);
  EXPECT_EQ(vb.draft_logits, nullptr);
  EXPECT_EQ(vb.accept_uniforms, nullptr);
  EXPECT_EQ(vb.max_draft_len, 0);
  flashspec_verify_result vr;
  std::memset(&vr, 0xab, sizeof vr);
  flashspec_verify_result_init(&vr);
  EXPECT_EQ(vr.struct_size, sizeof vr);
  EXPECT_EQ(vr.accepted_counts, nullptr);
  EXPECT_EQ(vr.next_steps, nullptr);
}

}  // namespace
