// Bad input for every engine entry point: each case returns its specific
// status, a message that starts with the argument's name, leaves outputs
// untouched, and calls no host callback. Plus NULL no-ops and the plugin
// table.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "engine_support.h"

namespace {

using namespace fstest;

using api_engine_params_init_fn = void (*)(flashspec_engine_params*);

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

TEST_F(EngineApi, SuffixDrafterCreate) {
  struct Case {
    const char* label;
    std::function<void(flashspec_suffix_params&)> edit;
    flashspec_status status;
    const char* argument;
  };
  const Case cases[] = {
      {"struct_size", [](flashspec_suffix_params& p) { p.struct_size = 7; }, FLASHSPEC_ERR_STRUCT_SIZE, "params->struct_size"},
      {"max_match_len 0", [](flashspec_suffix_params& p) { p.max_match_len = 0; }, FLASHSPEC_ERR_OUT_OF_RANGE, "params->max_match_len"},
      {"max_match_len 65", [](flashspec_suffix_params& p) { p.max_match_len = 65; }, FLASHSPEC_ERR_OUT_OF_RANGE, "params->max_match_len"},
      {"max_depth 0", [](flashspec_suffix_params& p) { p.max_depth = 0; }, FLASHSPEC_ERR_OUT_OF_RANGE, "params->max_depth"},
      {"max_depth 65", [](flashspec_suffix_params& p) { p.max_depth = 65; }, FLASHSPEC_ERR_OUT_OF_RANGE, "params->max_depth"},
      {"min_probability < 0", [](flashspec_suffix_params& p) { p.min_probability = -0.1; }, FLASHSPEC_ERR_OUT_OF_RANGE, "params->min_probability"},
      {"min_probability > 1", [](flashspec_suffix_params& p) { p.min_probability = 1.5; }, FLASHSPEC_ERR_OUT_OF_RANGE, "params->min_probability"},
      {"min_probability NaN", [](flashspec_suffix_params& p) { p.min_probability = std::nan(""); }, FLASHSPEC_ERR_OUT_OF_RANGE, "params->min_probability"},
      {"cache_max_tokens < 0", [](flashspec_suffix_params& p) { p.cache_max_tokens = -1; }, FLASHSPEC_ERR_OUT_OF_RANGE, "params->cache_max_tokens"},
      {"cache_max_tokens > 2^24", [](flashspec_suffix_params& p) { p.cache_max_tokens = (1 << 24) + 1; }, FLASHSPEC_ERR_OUT_OF_RANGE, "params->cache_max_tokens"},
      {"call_cost < 0", [](flashspec_suffix_params& p) { p.call_cost = -1; }, FLASHSPEC_ERR_INVALID_ARGUMENT, "params->call_cost"},
      {"token_cost inf", [](flashspec_suffix_params& p) { p.token_cost = INFINITY; }, FLASHSPEC_ERR_INVALID_ARGUMENT, "params->token_cost"},
  };
  for (const Case& c : cases) {
    flashspec_suffix_params p;
    flashspec_suffix_params_init(&p);
    c.edit(p);
    flashspec_drafter* sentinel = reinterpret_cast<flashspec_drafter*>(uintptr_t(0x1234));
    flashspec_drafter* out = sentinel;
    EXPECT_NAMED(flashspec_drafter_create_suffix(ctx.get(), &p, &out), c.status, ctx.get(), c.argument, c.label);
    EXPECT_EQ(out, sentinel) << c.label;
  }
  flashspec_drafter* out = nullptr;
  EXPECT_NAMED(flashspec_drafter_create_suffix(nullptr, nullptr, &out), FLASHSPEC_ERR_NULL_POINTER, nullptr, "ctx", "ctx");
  EXPECT_NAMED(flashspec_drafter_create_suffix(ctx.get(), nullptr, nullptr), FLASHSPEC_ERR_NULL_POINTER, ctx.get(), "out", "out");
  // The extremes of every range are accepted.
  flashspec_suffix_params p;
  flashspec_suffix_params_init(&p);
  EXPECT_EQ(p.max_match_len, 16);
  EXPECT_EQ(p.max_depth, 16);
  EXPECT_DOUBLE_EQ(p.min_probability, 0.1);
  EXPECT_EQ(p.cache_max_tokens, 16384);
  p.max_match_len = 64;
  p.max_depth = 1;
  p.min_probability = 0.0;
  p.cache_max_tokens = 0;
  ASSERT_EQ(flashspec_drafter_create_suffix(ctx.get(), &p, &out), FLASHSPEC_OK) << message_of(ctx.get());
  flashspec_drafter_destroy(out);
}

TEST_F(EngineApi, SuffixTreeProposal) {
  flashspec_drafter* raw = nullptr;
  ASSERT_EQ(flashspec_drafter_create_suffix(ctx.get(), nullptr, &raw), FLASHSPEC_OK);
  DrafterPtr suffix(raw);
  DrafterPtr other = ngram();
  const std::vector<int32_t> context = {4, 1, 4, 2, 4, 1, 4, 3, 4};
  const std::vector<int32_t> negative = {4, -1, 4};
  std::vector<int32_t> tokens(8, -7), parents(8, -7);
  int32_t count = -7;
  struct Case {
    const char* label;
    flashspec_drafter* drafter;
    const int32_t* context;
    int32_t context_len;
    int32_t max_nodes;
    int32_t* tokens;
    int32_t* parents;
    int32_t* count;
    flashspec_status status;
    const char* argument;
  };
  const int32_t n = int32_t(context.size());
  const Case cases[] = {
      {"not a suffix drafter", other.get(), context.data(), n, 8, tokens.data(), parents.data(), &count, FLASHSPEC_ERR_INVALID_ARGUMENT, "drafter"},
      {"context NULL", suffix.get(), nullptr, n, 8, tokens.data(), parents.data(), &count, FLASHSPEC_ERR_NULL_POINTER, "context"},
      {"context_len 0", suffix.get(), context.data(), 0, 8, tokens.data(), parents.data(), &count, FLASHSPEC_ERR_OUT_OF_RANGE, "context_len"},
      {"negative token", suffix.get(), negative.data(), 3, 8, tokens.data(), parents.data(), &count, FLASHSPEC_ERR_OUT_OF_RANGE, "context"},
      {"max_nodes < 0", suffix.get(), context.data(), n, -1, tokens.data(), parents.data(), &count, FLASHSPEC_ERR_OUT_OF_RANGE, "max_nodes"},
      {"max_nodes too large", suffix.get(), context.data(), n, FLASHSPEC_MAX_DRAFT_LEN + 1, tokens.data(), parents.data(), &count, FLASHSPEC_ERR_OUT_OF_RANGE, "max_nodes"},
      {"tokens_out NULL", suffix.get(), context.data(), n, 8, nullptr, parents.data(), &count, FLASHSPEC_ERR_NULL_POINTER, "tokens_out"},
      {"parents_out NULL", suffix.get(), context.data(), n, 8, tokens.data(), nullptr, &count, FLASHSPEC_ERR_NULL_POINTER, "parents_out"},
      {"num_nodes_out NULL", suffix.get(), context.data(), n, 8, tokens.data(), parents.data(), nullptr, FLASHSPEC_ERR_NULL_POINTER, "num_nodes_out"},
  };
  for (const Case& c : cases) {
    EXPECT_NAMED(flashspec_suffix_drafter_propose_tree(c.drafter, c.context, c.context_len, c.max_nodes, c.tokens,
                                                       c.parents, c.count),
                 c.status, ctx.get(), c.argument, c.label);
    EXPECT_EQ(tokens, std::vector<int32_t>(8, -7)) << c.label;
    EXPECT_EQ(parents, std::vector<int32_t>(8, -7)) << c.label;
    EXPECT_EQ(count, -7) << c.label;
  }
  EXPECT_NAMED(flashspec_suffix_drafter_propose_tree(nullptr, context.data(), n, 8, tokens.data(), parents.data(), &count),
               FLASHSPEC_ERR_NULL_POINTER, nullptr, "drafter", "drafter NULL");

  // After "4" came 1 twice, 2 and 3 once each: three children of the root,
  // the most frequent first; then what followed "4 1" (4, twice).
  ASSERT_EQ(flashspec_suffix_drafter_propose_tree(suffix.get(), context.data(), n, 8, tokens.data(), parents.data(),
                                                  &count),
            FLASHSPEC_OK)
      << message_of(ctx.get());
  ASSERT_GE(count, 4);
  EXPECT_EQ(tokens[0], 1);
  EXPECT_EQ(parents[0], -1);
  EXPECT_EQ(tokens[1], 4);
  EXPECT_EQ(parents[1], 0);
  for (int32_t i = 0; i < count; ++i) EXPECT_LT(parents[size_t(i)], i);
  // max_nodes 0 only indexes; the outputs may be NULL.
  int32_t zero = -1;
  EXPECT_EQ(flashspec_suffix_drafter_propose_tree(suffix.get(), context.data(), n, 0, nullptr, nullptr, &zero), FLASHSPEC_OK);
  EXPECT_EQ(zero, 0);
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
      {"draft_len_rule", [](flashspec_engine_params& p) { p.draft_len_rule = flashspec_draft_len_rule(2); }, FLASHSPEC_ERR_INVALID_ARGUMENT, "params->draft_len_rule"},
      {"draft_len_memory < 1", [](flashspec_engine_params& p) { p.draft_len_memory = 0.5; }, FLASHSPEC_ERR_INVALID_ARGUMENT, "params->draft_len_memory"},
      {"draft_len_memory NaN", [](flashspec_engine_params& p) { p.draft_len_memory = std::nan(""); }, FLASHSPEC_ERR_INVALID_ARGUMENT, "params->draft_len_memory"},
      {"struct_size past today's", [](flashspec_engine_params& p) { p.struct_size = sizeof(flashspec_engine_params) + 8; }, FLASHSPEC_ERR_STRUCT_SIZE, "params->struct_size"},
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

// A caller built against the 0.2 header passes the 0.2 layout: its
// struct_size is accepted and the appended fields keep their defaults (an
// out-of-range value past that size is never read).
TEST_F(EngineApi, EngineParamsOfThe02LayoutAreAccepted) {
  flashspec_engine_params p;
  std::memset(static_cast<void*>(&p), 0xff, sizeof p);
  const api_engine_params_init_fn old_init = flashspec_get_api(FLASHSPEC_ABI_VERSION)->engine_params_init;
  old_init(&p);  // the 0.2 symbol: fills the 0.2 layout only
  EXPECT_LT(p.struct_size, sizeof(flashspec_engine_params));
  EXPECT_LE(p.struct_size, offsetof(flashspec_engine_params, draft_len_memory));
  EXPECT_EQ(p.default_draft_len, 4);
  p.target_forward = forward_never;
  p.target_user_data = &callbacks;
  flashspec_engine* out = nullptr;
  ASSERT_EQ(flashspec_engine_create(ctx.get(), head.get(), &p, &out), FLASHSPEC_OK) << message_of(ctx.get());
  flashspec_engine_destroy(out);
  // The sized init writes no byte past the size asked for.
  flashspec_engine_params q;
  std::memset(static_cast<void*>(&q), 0xab, sizeof q);
  flashspec_engine_params_init_sized(&q, offsetof(flashspec_engine_params, draft_len_memory));
  EXPECT_EQ(q.struct_size, offsetof(flashspec_engine_params, draft_len_memory));
  unsigned char tail[sizeof(double)];
  std::memcpy(tail, &q.draft_len_memory, sizeof tail);
  for (unsigned char b : tail) EXPECT_EQ(b, 0xab);
  flashspec_engine_params_init(&q);
  EXPECT_EQ(q.struct_size, sizeof(flashspec_engine_params));
  EXPECT_EQ(q.draft_len_rule, FLASHSPEC_DRAFT_LEN_ARM);
  EXPECT_DOUBLE_EQ(q.draft_len_memory, 64.0);
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
  flashspec_suffix_params_init(nullptr);
  flashspec_engine_params_init_sized(nullptr, sizeof(flashspec_engine_params));
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
  EXPECT_EQ(api->suffix_params_init, &flashspec_suffix_params_init);
  EXPECT_EQ(api->drafter_create_suffix, &flashspec_drafter_create_suffix);
  EXPECT_EQ(api->suffix_drafter_propose_tree, &flashspec_suffix_drafter_propose_tree);
  EXPECT_EQ(api->engine_params_init_sized, &flashspec_engine_params_init_sized);
}

}  // namespace
