// Bad input for every engine entry point: each case returns its specific
// status, a message that starts with the argument's name, leaves outputs
// untouched, and calls no host callback. Plus NULL no-ops and the plugin
// table.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "engine_support.h"

namespace {

using namespace fstest;

int forward_never(void* user_data, flashspec_target_call*) {
  ++*static_cast<int*>(user_data);
  return 1;
}
int draft_never(void* user_data, flashspec_draft_call*) {
  ++*static_cast<int*>(user_data);
  return 1;
}

std::string message_of(flashspec_context* ctx) { return flashspec_context_last_error(ctx); }

void expect_named(flashspec_status got, flashspec_status want, const std::string& message, const std::string& argument,
                  const std::string& label) {
  EXPECT_EQ(got, want) << label << ": " << message;
  EXPECT_EQ(message.rfind(argument + ":", 0), 0u) << label << ": message \"" << message << "\" should name " << argument;
}

// The status is taken before the message is read.
#define EXPECT_NAMED(call, want, message_ctx, argument, label)                  \
  do {                                                                          \
    const flashspec_status status_ = (call);                                    \
    expect_named(status_, want, message_of(message_ctx), argument, label);      \
  } while (0)

struct Fixture : ::testing::Test {
  ContextPtr ctx = make_context(ContextOptions().cpu_threads(1).max_rows(16).max_requests(4));
  SyntheticModel model{32, 8, 3, 1.0f};
  HeadPtr head = model.make_head(ctx.get());
  int callbacks = 0;

  DrafterPtr ngram() {
    flashspec_drafter* d = nullptr;
    EXPECT_EQ(flashspec_drafter_create_ngram(ctx.get(), nullptr, &d), FLASHSPEC_OK);
    return DrafterPtr(d);
  }
};

using EngineApi = Fixture;

TEST_F(EngineApi, NgramDrafterCreate) {
  struct Case {
    const char* label;
    std::function<void(flashspec_ngram_params&)> edit;
    flashspec_status status;
    const char* argument;
  };
  const Case cases[] = {
      {"struct_size", [](flashspec_ngram_params& p) { p.struct_size = 3; }, FLASHSPEC_ERR_STRUCT_SIZE, "params->struct_size"},
      {"min_n 0", [](flashspec_ngram_params& p) { p.min_n = 0; }, FLASHSPEC_ERR_OUT_OF_RANGE, "params->min_n"},
      {"max_n < min_n", [](flashspec_ngram_params& p) { p.min_n = 3; p.max_n = 2; }, FLASHSPEC_ERR_OUT_OF_RANGE, "params->max_n"},
      {"max_n 33", [](flashspec_ngram_params& p) { p.max_n = 33; }, FLASHSPEC_ERR_OUT_OF_RANGE, "params->max_n"},
      {"call_cost < 0", [](flashspec_ngram_params& p) { p.call_cost = -1; }, FLASHSPEC_ERR_INVALID_ARGUMENT, "params->call_cost"},
      {"token_cost NaN", [](flashspec_ngram_params& p) { p.token_cost = std::nan(""); }, FLASHSPEC_ERR_INVALID_ARGUMENT, "params->token_cost"},
  };
  for (const Case& c : cases) {
    flashspec_ngram_params p;
    flashspec_ngram_params_init(&p);
    c.edit(p);
    flashspec_drafter* sentinel = reinterpret_cast<flashspec_drafter*>(uintptr_t(0x1234));
    flashspec_drafter* out = sentinel;
    EXPECT_NAMED(flashspec_drafter_create_ngram(ctx.get(), &p, &out), c.status, ctx.get(), c.argument, c.label);
    EXPECT_EQ(out, sentinel) << c.label;
  }
  flashspec_drafter* out = nullptr;
  EXPECT_NAMED(flashspec_drafter_create_ngram(nullptr, nullptr, &out), FLASHSPEC_ERR_NULL_POINTER, nullptr, "ctx", "ctx");
  EXPECT_NAMED(flashspec_drafter_create_ngram(ctx.get(), nullptr, nullptr), FLASHSPEC_ERR_NULL_POINTER, ctx.get(), "out", "out");
  EXPECT_EQ(out, nullptr);
}

TEST_F(EngineApi, CallbackDrafterCreate) {
  SyntheticModel other(31, 8, 4, 1.0f);
  HeadPtr other_head = other.make_head(ctx.get());
  struct Case {
    const char* label;
    std::function<void(flashspec_callback_drafter_params&)> edit;
    flashspec_status status;
    const char* argument;
  };
  const Case cases[] = {
      {"struct_size", [](flashspec_callback_drafter_params& p) { p.struct_size += 8; }, FLASHSPEC_ERR_STRUCT_SIZE, "params->struct_size"},
      {"kind", [](flashspec_callback_drafter_params& p) { p.kind = flashspec_draft_kind(9); }, FLASHSPEC_ERR_INVALID_ARGUMENT, "params->kind"},
      {"draft NULL", [](flashspec_callback_drafter_params& p) { p.draft = nullptr; }, FLASHSPEC_ERR_NULL_POINTER, "params->draft"},
      {"T_d 0", [](flashspec_callback_drafter_params& p) { p.kind = FLASHSPEC_DRAFT_LOGITS; p.draft_temperature = 0.0f; }, FLASHSPEC_ERR_INVALID_ARGUMENT, "params->draft_temperature"},
      {"T_d NaN", [](flashspec_callback_drafter_params& p) { p.kind = FLASHSPEC_DRAFT_LOGITS; p.draft_temperature = std::nanf(""); }, FLASHSPEC_ERR_INVALID_ARGUMENT, "params->draft_temperature"},
      {"head NULL", [](flashspec_callback_drafter_params& p) { p.kind = FLASHSPEC_DRAFT_HIDDEN; p.head = nullptr; }, FLASHSPEC_ERR_NULL_POINTER, "params->head"},
      {"call_cost inf", [](flashspec_callback_drafter_params& p) { p.call_cost = INFINITY; }, FLASHSPEC_ERR_INVALID_ARGUMENT, "params->call_cost"},
      {"token_cost < 0", [](flashspec_callback_drafter_params& p) { p.token_cost = -0.5; }, FLASHSPEC_ERR_INVALID_ARGUMENT, "params->token_cost"},
  };
  for (const Case& c : cases) {
    flashspec_callback_drafter_params p;
    flashspec_callback_drafter_params_init(&p);
    p.draft = draft_never;
    p.user_data = &callbacks;
    c.edit(p);
    flashspec_drafter* sentinel = reinterpret_cast<flashspec_drafter*>(uintptr_t(0x1234));
    flashspec_drafter* out = sentinel;
    EXPECT_NAMED(flashspec_drafter_create_callback(ctx.get(), &p, &out), c.status, ctx.get(), c.argument, c.label);
    EXPECT_EQ(out, sentinel) << c.label;
  }
  flashspec_callback_drafter_params p;
  flashspec_callback_drafter_params_init(&p);
  p.draft = draft_never;
  flashspec_drafter* out = nullptr;
  EXPECT_NAMED(flashspec_drafter_create_callback(nullptr, &p, &out), FLASHSPEC_ERR_NULL_POINTER, nullptr, "ctx", "ctx");
  EXPECT_NAMED(flashspec_drafter_create_callback(ctx.get(), nullptr, &out), FLASHSPEC_ERR_NULL_POINTER, ctx.get(), "params", "params");
  EXPECT_NAMED(flashspec_drafter_create_callback(ctx.get(), &p, nullptr), FLASHSPEC_ERR_NULL_POINTER, ctx.get(), "out", "out");

  // A HIDDEN drafter over a head with another vocabulary is refused by the engine.
  p.kind = FLASHSPEC_DRAFT_HIDDEN;
  p.head = other_head.get();
  ASSERT_EQ(flashspec_drafter_create_callback(ctx.get(), &p, &out), FLASHSPEC_OK);
  DrafterPtr hidden(out);
  flashspec_drafter* list[1] = {hidden.get()};
  flashspec_engine_params e;
  flashspec_engine_params_init(&e);
  e.target_forward = forward_never;
  e.drafters = list;
  e.num_drafters = 1;
  flashspec_engine* engine = nullptr;
  EXPECT_NAMED(flashspec_engine_create(ctx.get(), head.get(), &e, &engine), FLASHSPEC_ERR_OUT_OF_RANGE,
               ctx.get(), "params->drafters[0]", "vocabulary");
  EXPECT_EQ(engine, nullptr);
  EXPECT_EQ(callbacks, 0);
}

TEST_F(EngineApi, EngineCreate) {
  DrafterPtr a = ngram(), b = ngram();
  flashspec_drafter* two[2] = {a.get(), b.get()};
  flashspec_drafter* twice[2] = {a.get(), a.get()};
  flashspec_drafter* with_null[2] = {a.get(), nullptr};
  const flashspec_arm arms[2] = {{0, 3}, {1, 2}};
  const flashspec_arm too_long[1] = {{0, 16}};  // max_rows 16: k ≤ 15
  const flashspec_arm bad_drafter[1] = {{2, 1}};
  const double nan_rewards[2] = {1.0, std::nan("")};
  struct Case {
    const char* label;
    std::function<void(flashspec_engine_params&)> edit;
    flashspec_status status;
    const char* argument;
  };
  const Case cases[] = {
      {"struct_size", [](flashspec_engine_params& p) { p.struct_size = 0; }, FLASHSPEC_ERR_STRUCT_SIZE, "params->struct_size"},
      {"forward NULL", [](flashspec_engine_params& p) { p.target_forward = nullptr; }, FLASHSPEC_ERR_NULL_POINTER, "params->target_forward"},
      {"num_drafters < 0", [](flashspec_engine_params& p) { p.num_drafters = -1; }, FLASHSPEC_ERR_OUT_OF_RANGE, "params->num_drafters"},
      {"drafters NULL", [](flashspec_engine_params& p) { p.drafters = nullptr; }, FLASHSPEC_ERR_NULL_POINTER, "params->drafters"},
      {"drafter NULL", [&](flashspec_engine_params& p) { p.drafters = with_null; }, FLASHSPEC_ERR_NULL_POINTER, "params->drafters[1]"},
      {"drafter twice", [&](flashspec_engine_params& p) { p.drafters = twice; }, FLASHSPEC_ERR_INVALID_ARGUMENT, "params->drafters[1]"},
      {"arms NULL", [](flashspec_engine_params& p) { p.arms = nullptr; }, FLASHSPEC_ERR_NULL_POINTER, "params->arms"},
      {"num_arms 0", [](flashspec_engine_params& p) { p.num_arms = 0; }, FLASHSPEC_ERR_OUT_OF_RANGE, "params->num_arms"},
      {"draft_len > max_rows - 1", [&](flashspec_engine_params& p) { p.arms = too_long; p.num_arms = 1; }, FLASHSPEC_ERR_OUT_OF_RANGE, "params->arms[0]"},
      {"arm drafter", [&](flashspec_engine_params& p) { p.arms = bad_drafter; p.num_arms = 1; }, FLASHSPEC_ERR_OUT_OF_RANGE, "params->arms[0]"},
      {"default_draft_len", [](flashspec_engine_params& p) { p.arms = nullptr; p.num_arms = 0; p.default_draft_len = -1; }, FLASHSPEC_ERR_OUT_OF_RANGE, "params->default_draft_len"},
      {"policy", [](flashspec_engine_params& p) { p.policy = flashspec_bandit_policy(17); }, FLASHSPEC_ERR_INVALID_ARGUMENT, "params->policy"},
      {"ucb_exploration", [](flashspec_engine_params& p) { p.ucb_exploration = -1.0; }, FLASHSPEC_ERR_INVALID_ARGUMENT, "params->ucb_exploration"},
      {"fixed_arm", [](flashspec_engine_params& p) { p.policy = FLASHSPEC_BANDIT_FIXED; p.fixed_arm = 2; }, FLASHSPEC_ERR_OUT_OF_RANGE, "params->fixed_arm"},
      {"oracle NULL", [](flashspec_engine_params& p) { p.policy = FLASHSPEC_BANDIT_ORACLE; }, FLASHSPEC_ERR_NULL_POINTER, "params->oracle_rewards"},
      {"oracle NaN", [&](flashspec_engine_params& p) { p.policy = FLASHSPEC_BANDIT_ORACLE; p.oracle_rewards = nan_rewards; }, FLASHSPEC_ERR_INVALID_ARGUMENT, "params->oracle_rewards"},
      {"step cost 0", [](flashspec_engine_params& p) { p.target_step_cost = 0.0; }, FLASHSPEC_ERR_INVALID_ARGUMENT, "params->target_step_cost"},
      {"row cost < 0", [](flashspec_engine_params& p) { p.target_row_cost = -0.1; }, FLASHSPEC_ERR_INVALID_ARGUMENT, "params->target_row_cost"},
      {"max_context < 0", [](flashspec_engine_params& p) { p.max_context = -1; }, FLASHSPEC_ERR_OUT_OF_RANGE, "params->max_context"},
  };
  for (const Case& c : cases) {
    flashspec_engine_params p;
    flashspec_engine_params_init(&p);
    p.target_forward = forward_never;
    p.target_user_data = &callbacks;
    p.drafters = two;
    p.num_drafters = 2;
    p.arms = arms;
    p.num_arms = 2;
    c.edit(p);
    flashspec_engine* sentinel = reinterpret_cast<flashspec_engine*>(uintptr_t(0x1234));
    flashspec_engine* out = sentinel;
    EXPECT_NAMED(flashspec_engine_create(ctx.get(), head.get(), &p, &out), c.status, ctx.get(), c.argument, c.label);
    EXPECT_EQ(out, sentinel) << c.label;
  }
  flashspec_engine_params p;
  flashspec_engine_params_init(&p);
  p.target_forward = forward_never;
  p.target_user_data = &callbacks;
  p.drafters = two;
  p.num_drafters = 2;
  flashspec_engine* out = nullptr;
  EXPECT_NAMED(flashspec_engine_create(nullptr, head.get(), &p, &out), FLASHSPEC_ERR_NULL_POINTER, nullptr, "ctx", "ctx");
  EXPECT_NAMED(flashspec_engine_create(ctx.get(), nullptr, &p, &out), FLASHSPEC_ERR_NULL_POINTER, ctx.get(), "target_head", "head");
  EXPECT_NAMED(flashspec_engine_create(ctx.get(), head.get(), nullptr, &out), FLASHSPEC_ERR_NULL_POINTER, ctx.get(), "params", "params");
  EXPECT_NAMED(flashspec_engine_create(ctx.get(), head.get(), &p, nullptr), FLASHSPEC_ERR_NULL_POINTER, ctx.get(), "out", "out");

  // A drafter serves one engine at a time; destroying the engine frees it.
  ASSERT_EQ(flashspec_engine_create(ctx.get(), head.get(), &p, &out), FLASHSPEC_OK) << message_of(ctx.get());
  EnginePtr first(out);
  flashspec_engine* second = nullptr;
  EXPECT_NAMED(flashspec_engine_create(ctx.get(), head.get(), &p, &second), FLASHSPEC_ERR_INVALID_ARGUMENT,
               ctx.get(), "params->drafters[0]", "shared drafter");
  first.reset();
  ASSERT_EQ(flashspec_engine_create(ctx.get(), head.get(), &p, &second), FLASHSPEC_OK) << message_of(ctx.get());
  flashspec_engine_destroy(second);
  EXPECT_EQ(callbacks, 0);
}

struct GenerateFixture : Fixture {
  EnginePtr engine;
  std::vector<int32_t> prompt = {1, 2, 3};

  void SetUp() override {
    flashspec_engine_params p;
    flashspec_engine_params_init(&p);
    p.target_forward = forward_never;
    p.target_user_data = &callbacks;
    p.max_context = 8;
    flashspec_engine* e = nullptr;
    ASSERT_EQ(flashspec_engine_create(ctx.get(), head.get(), &p, &e), FLASHSPEC_OK) << message_of(ctx.get());
    engine.reset(e);
  }
};

using EngineGenerateApi = GenerateFixture;

TEST_F(EngineGenerateApi, BadInputLeavesOutputsUntouched) {
  const int32_t bad_stop[1] = {32};
  const std::vector<int32_t> long_prompt(9, 1);
  struct Args {
    const int32_t* prompt;
    int32_t prompt_len;
    flashspec_generate_params params;
    bool pass_params;
    int32_t* tokens;
    int32_t capacity;
    flashspec_generate_result* result;
  };
  struct Case {
    const char* label;
    std::function<void(Args&)> edit;
    flashspec_status status;
    const char* argument;
  };
  std::vector<int32_t> tokens(8, -5);
  flashspec_generate_result result;
  const Case cases[] = {
      {"prompt NULL", [](Args& a) { a.prompt = nullptr; }, FLASHSPEC_ERR_NULL_POINTER, "prompt"},
      {"prompt_len 0", [](Args& a) { a.prompt_len = 0; }, FLASHSPEC_ERR_OUT_OF_RANGE, "prompt_len"},
      {"prompt token", [](Args& a) { static const int32_t p[2] = {1, 32}; a.prompt = p; a.prompt_len = 2; }, FLASHSPEC_ERR_OUT_OF_RANGE, "prompt"},
      {"negative token", [](Args& a) { static const int32_t p[1] = {-1}; a.prompt = p; a.prompt_len = 1; }, FLASHSPEC_ERR_OUT_OF_RANGE, "prompt"},
      {"prompt > max_context", [&](Args& a) { a.prompt = long_prompt.data(); a.prompt_len = 9; }, FLASHSPEC_ERR_OUT_OF_RANGE, "prompt_len"},
      {"result NULL", [](Args& a) { a.result = nullptr; }, FLASHSPEC_ERR_NULL_POINTER, "result"},
      {"result struct_size", [](Args& a) { a.result->struct_size = 1; }, FLASHSPEC_ERR_STRUCT_SIZE, "result->struct_size"},
      {"params struct_size", [](Args& a) { a.params.struct_size = 4; }, FLASHSPEC_ERR_STRUCT_SIZE, "params->struct_size"},
      {"temperature < 0", [](Args& a) { a.params.temperature = -1.0f; }, FLASHSPEC_ERR_INVALID_ARGUMENT, "params->temperature"},
      {"temperature NaN", [](Args& a) { a.params.temperature = std::nanf(""); }, FLASHSPEC_ERR_INVALID_ARGUMENT, "params->temperature"},
      {"max_tokens 0", [](Args& a) { a.params.max_tokens = 0; }, FLASHSPEC_ERR_OUT_OF_RANGE, "params->max_tokens"},
      {"num_stop_tokens < 0", [](Args& a) { a.params.num_stop_tokens = -2; }, FLASHSPEC_ERR_OUT_OF_RANGE, "params->num_stop_tokens"},
      {"stop_tokens NULL", [](Args& a) { a.params.num_stop_tokens = 1; }, FLASHSPEC_ERR_NULL_POINTER, "params->stop_tokens"},
      {"stop token", [&](Args& a) { a.params.stop_tokens = bad_stop; a.params.num_stop_tokens = 1; }, FLASHSPEC_ERR_OUT_OF_RANGE, "params->stop_tokens"},
      {"capacity < 0", [](Args& a) { a.capacity = -1; }, FLASHSPEC_ERR_OUT_OF_RANGE, "tokens_capacity"},
      {"tokens NULL", [](Args& a) { a.tokens = nullptr; }, FLASHSPEC_ERR_NULL_POINTER, "tokens_out"},
      {"capacity < max_tokens", [](Args& a) { a.params.max_tokens = 9; }, FLASHSPEC_ERR_OUT_OF_RANGE, "tokens_capacity"},
  };
  for (const Case& c : cases) {
    flashspec_generate_result_init(&result);
    result.num_tokens = 77;
    result.steps = 78;
    Args a{prompt.data(), 3, {}, true, tokens.data(), 8, &result};
    flashspec_generate_params_init(&a.params);
    a.params.max_tokens = 8;
    c.edit(a);
    const flashspec_status s = flashspec_engine_generate(engine.get(), a.prompt, a.prompt_len,
                                                         a.pass_params ? &a.params : nullptr, a.tokens, a.capacity, a.result);
    EXPECT_NAMED(s, c.status, ctx.get(), c.argument, c.label);
    EXPECT_EQ(result.num_tokens, 77) << c.label;
    EXPECT_EQ(result.steps, 78) << c.label;
    EXPECT_EQ(tokens, std::vector<int32_t>(8, -5)) << c.label;
  }
  EXPECT_EQ(callbacks, 0);
  flashspec_generate_result_init(&result);
  EXPECT_NAMED(flashspec_engine_generate(nullptr, prompt.data(), 3, nullptr, tokens.data(), 8, &result),
               FLASHSPEC_ERR_NULL_POINTER, nullptr, "engine", "engine");
}

TEST_F(EngineGenerateApi, MetricsQueries) {
  flashspec_engine_metrics m;
  flashspec_engine_metrics_init(&m);
  EXPECT_NAMED(flashspec_engine_get_metrics(nullptr, &m), FLASHSPEC_ERR_NULL_POINTER, nullptr, "engine", "engine");
  EXPECT_NAMED(flashspec_engine_get_metrics(engine.get(), nullptr), FLASHSPEC_ERR_NULL_POINTER, ctx.get(), "out", "out");
  m.struct_size = 8;
  m.steps = 99;
  EXPECT_NAMED(flashspec_engine_get_metrics(engine.get(), &m), FLASHSPEC_ERR_STRUCT_SIZE, ctx.get(), "out->struct_size", "size");
  EXPECT_EQ(m.steps, 99u);
  flashspec_engine_metrics_init(&m);
  ASSERT_EQ(flashspec_engine_get_metrics(engine.get(), &m), FLASHSPEC_OK);
  EXPECT_EQ(m.steps, 0u);
  EXPECT_EQ(m.num_arms, 1);  // no drafters: one plain-decoding arm

  uint64_t drafted[2] = {5, 5}, accepted[2] = {5, 5};
  int32_t positions = -3;
  EXPECT_NAMED(flashspec_engine_get_position_metrics(nullptr, 2, drafted, accepted, &positions), FLASHSPEC_ERR_NULL_POINTER,
               nullptr, "engine", "engine");
  EXPECT_NAMED(flashspec_engine_get_position_metrics(engine.get(), -1, drafted, accepted, &positions),
               FLASHSPEC_ERR_OUT_OF_RANGE, ctx.get(), "capacity", "capacity");
  EXPECT_NAMED(flashspec_engine_get_position_metrics(engine.get(), 2, nullptr, accepted, &positions),
               FLASHSPEC_ERR_NULL_POINTER, ctx.get(), "drafted", "drafted");
  EXPECT_NAMED(flashspec_engine_get_position_metrics(engine.get(), 2, drafted, nullptr, &positions),
               FLASHSPEC_ERR_NULL_POINTER, ctx.get(), "accepted", "accepted");
  EXPECT_EQ(positions, -3);
  EXPECT_EQ(drafted[0], 5u);
  ASSERT_EQ(flashspec_engine_get_position_metrics(engine.get(), 0, nullptr, nullptr, &positions), FLASHSPEC_OK);
  EXPECT_EQ(positions, 0);

  flashspec_arm_metrics arm;
  flashspec_arm_metrics_init(&arm);
  EXPECT_NAMED(flashspec_engine_get_arm_metrics(nullptr, 0, &arm), FLASHSPEC_ERR_NULL_POINTER, nullptr, "engine", "engine");
  EXPECT_NAMED(flashspec_engine_get_arm_metrics(engine.get(), 0, nullptr), FLASHSPEC_ERR_NULL_POINTER, ctx.get(), "out", "out");
  EXPECT_NAMED(flashspec_engine_get_arm_metrics(engine.get(), 1, &arm), FLASHSPEC_ERR_OUT_OF_RANGE, ctx.get(), "arm", "arm");
  EXPECT_NAMED(flashspec_engine_get_arm_metrics(engine.get(), -1, &arm), FLASHSPEC_ERR_OUT_OF_RANGE, ctx.get(), "arm", "arm");
  arm.struct_size = 1;
  EXPECT_NAMED(flashspec_engine_get_arm_metrics(engine.get(), 0, &arm), FLASHSPEC_ERR_STRUCT_SIZE, ctx.get(), "out->struct_size", "size");
  flashspec_arm_metrics_init(&arm);
  ASSERT_EQ(flashspec_engine_get_arm_metrics(engine.get(), 0, &arm), FLASHSPEC_OK);
  EXPECT_EQ(arm.drafter, -1);
  EXPECT_EQ(arm.draft_len, 0);

  EXPECT_NAMED(flashspec_engine_reset_metrics(nullptr), FLASHSPEC_ERR_NULL_POINTER, nullptr, "engine", "engine");
  EXPECT_EQ(flashspec_engine_reset_metrics(engine.get()), FLASHSPEC_OK);
}

TEST(EngineApiNull, InitDestroyAndCancelAcceptNull) {
  flashspec_ngram_params_init(nullptr);
  flashspec_callback_drafter_params_init(nullptr);
  flashspec_engine_params_init(nullptr);
  flashspec_generate_params_init(nullptr);
  flashspec_generate_result_init(nullptr);
  flashspec_engine_metrics_init(nullptr);
  flashspec_arm_metrics_init(nullptr);
  flashspec_drafter_destroy(nullptr);
  flashspec_engine_destroy(nullptr);
  flashspec_engine_cancel(nullptr);
  flashspec_engine_params p;
  flashspec_engine_params_init(&p);
  EXPECT_EQ(p.struct_size, sizeof(flashspec_engine_params));
  EXPECT_EQ(p.policy, FLASHSPEC_BANDIT_UCB1);
  EXPECT_EQ(p.default_draft_len, 4);
  EXPECT_DOUBLE_EQ(p.target_step_cost, 1.0);
  flashspec_generate_params g;
  flashspec_generate_params_init(&g);
  EXPECT_EQ(g.struct_size, sizeof(flashspec_generate_params));
  EXPECT_FLOAT_EQ(g.temperature, 1.0f);
  EXPECT_EQ(g.max_tokens, 256);
}

TEST(EngineApiPlugin, TheTableCarriesTheEngineFunctions) {
  const flashspec_api* api = flashspec_get_api(FLASHSPEC_ABI_VERSION);
  ASSERT_NE(api, nullptr);
  EXPECT_EQ(api->struct_size, sizeof(flashspec_api));
  EXPECT_EQ(api->drafter_create_ngram, &flashspec_drafter_create_ngram);
  EXPECT_EQ(api->drafter_create_callback, &flashspec_drafter_create_callback);
  EXPECT_EQ(api->engine_create, &flashspec_engine_create);
  EXPECT_EQ(api->engine_generate, &flashspec_engine_generate);
  EXPECT_EQ(api->engine_cancel, &flashspec_engine_cancel);
  EXPECT_EQ(api->engine_get_metrics, &flashspec_engine_get_metrics);
  EXPECT_EQ(api->engine_get_position_metrics, &flashspec_engine_get_position_metrics);
  EXPECT_EQ(api->engine_get_arm_metrics, &flashspec_engine_get_arm_metrics);
  EXPECT_EQ(api->engine_reset_metrics, &flashspec_engine_reset_metrics);
  EXPECT_EQ(api->engine_destroy, &flashspec_engine_destroy);
  EXPECT_EQ(api->drafter_destroy, &flashspec_drafter_destroy);
}

}  // namespace
