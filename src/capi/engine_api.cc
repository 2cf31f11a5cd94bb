// The engine section of flashspec.h: drafters, engines, generation and
// metrics. Validation first, each failure naming its argument; the engine
// itself (src/engine) drives the context's backend directly.
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "capi/guard.h"
#include "capi/handles.h"
#include "capi/validate.h"
#include "engine/callback_drafter.h"
#include "engine/engine.h"
#include "engine/lm_head_runner.h"
#include "engine/ngram_drafter.h"
#include "flashspec.h"

using namespace flashspec;

struct flashspec_drafter {
  std::unique_ptr<Drafter> impl;
  const flashspec_lm_head* head = nullptr;  // HIDDEN callback drafters
  const flashspec_engine* owner = nullptr;  // the engine it serves, if any
};

struct flashspec_engine {
  flashspec_context* ctx = nullptr;
  std::unique_ptr<LmHeadRunner> runner;
  std::unique_ptr<Engine> engine;
  std::vector<flashspec_drafter*> drafters;
};

namespace {

std::string str(int64_t v) { return std::to_string(v); }

void check_cost(double cost, const char* argument) {
  require(std::isfinite(cost) && cost >= 0.0, FLASHSPEC_ERR_INVALID_ARGUMENT, argument,
          "must be finite and >= 0, got " + std::to_string(cost));
}

flashspec_status null_context() {
  return guarded(nullptr, [] { fail(FLASHSPEC_ERR_NULL_POINTER, "ctx: is NULL"); });
}

flashspec_status null_engine() {
  return guarded(nullptr, [] { fail(FLASHSPEC_ERR_NULL_POINTER, "engine: is NULL"); });
}

EngineConfig validate_engine(flashspec_context& ctx, const flashspec_lm_head* target_head,
                             const flashspec_engine_params* params, std::vector<flashspec_drafter*>& drafters) {
  validate_head(ctx, target_head, "target_head");
  require(params != nullptr, FLASHSPEC_ERR_NULL_POINTER, "params", "is NULL (the target callbacks are required)");
  validate_struct_size(params->struct_size, sizeof(flashspec_engine_params), "params->struct_size");
  require(params->target_forward != nullptr, FLASHSPEC_ERR_NULL_POINTER, "params->target_forward", "is NULL");
  const int64_t vocab = target_head->storage->vocab;
  const int32_t max_len = std::min<int32_t>(FLASHSPEC_MAX_DRAFT_LEN, ctx.max_rows - 1);

  EngineConfig config;
  config.target_head = target_head->storage.get();
  config.target_forward = params->target_forward;
  config.target_rollback = params->target_rollback;
  config.target_user_data = params->target_user_data;

  require(params->num_drafters >= 0 && params->num_drafters <= 1024, FLASHSPEC_ERR_OUT_OF_RANGE,
          "params->num_drafters", "must be in [0, 1024], got " + str(params->num_drafters));
  if (params->num_drafters > 0)
    require(params->drafters != nullptr, FLASHSPEC_ERR_NULL_POINTER, "params->drafters",
            "is NULL while num_drafters is " + str(params->num_drafters));
  for (int32_t i = 0; i < params->num_drafters; ++i) {
    const std::string name = "params->drafters[" + str(i) + "]";
    flashspec_drafter* drafter = params->drafters[i];
    require(drafter != nullptr, FLASHSPEC_ERR_NULL_POINTER, name.c_str(), "is NULL");
    require(drafter->owner == nullptr, FLASHSPEC_ERR_INVALID_ARGUMENT, name.c_str(), "already serves another engine");
    for (int32_t j = 0; j < i; ++j)
      require(params->drafters[j] != drafter, FLASHSPEC_ERR_INVALID_ARGUMENT, name.c_str(),
              "is listed twice (also at index " + str(j) + "); use two arms of one drafter instead");
    if (drafter->head) {
      validate_head(ctx, drafter->head, (name + " head").c_str());
      require(drafter->head->storage->vocab == vocab, FLASHSPEC_ERR_OUT_OF_RANGE, name.c_str(),
              "drafts over a vocabulary of " + str(drafter->head->storage->vocab) + ", the target's has " +
                  str(vocab));
    }
    drafters.push_back(drafter);
    config.drafters.push_back(drafter->impl.get());
  }

  if (params->arms) {
    require(params->num_arms >= 1 && params->num_arms <= 1024, FLASHSPEC_ERR_OUT_OF_RANGE, "params->num_arms",
            "must be in [1, 1024], got " + str(params->num_arms));
    for (int32_t a = 0; a < params->num_arms; ++a) {
      const flashspec_arm arm = params->arms[a];
      const std::string name = "params->arms[" + str(a) + "]";
      require(arm.draft_len >= 0 && arm.draft_len <= max_len, FLASHSPEC_ERR_OUT_OF_RANGE, name.c_str(),
              "draft_len " + str(arm.draft_len) + " is outside [0, " + str(max_len) +
                  "] (the context's max_rows − 1 and FLASHSPEC_MAX_DRAFT_LEN bound it)");
      if (arm.draft_len > 0)
        require(arm.drafter >= 0 && arm.drafter < params->num_drafters, FLASHSPEC_ERR_OUT_OF_RANGE, name.c_str(),
                "drafter " + str(arm.drafter) + " is outside [0, num_drafters = " + str(params->num_drafters) + ")");
      config.arms.push_back(Arm{arm.draft_len > 0 ? arm.drafter : -1, arm.draft_len});
    }
  } else {
    require(params->num_arms == 0, FLASHSPEC_ERR_NULL_POINTER, "params->arms",
            "is NULL while num_arms is " + str(params->num_arms));
    require(params->default_draft_len >= 0 && params->default_draft_len <= max_len, FLASHSPEC_ERR_OUT_OF_RANGE,
            "params->default_draft_len", "must be in [0, " + str(max_len) + "], got " + str(params->default_draft_len));
    for (int32_t i = 0; i < params->num_drafters; ++i)
      config.arms.push_back(params->default_draft_len > 0 ? Arm{i, params->default_draft_len} : Arm{-1, 0});
    if (config.arms.empty()) config.arms.push_back(Arm{-1, 0});
  }
  const int32_t num_arms = int32_t(config.arms.size());

  PolicyConfig& policy = config.policy;
  policy.num_arms = num_arms;
  switch (params->policy) {
    case FLASHSPEC_BANDIT_UCB1:
      policy.kind = PolicyKind::kUcb1;
      require(std::isfinite(params->ucb_exploration) && params->ucb_exploration >= 0.0,
              FLASHSPEC_ERR_INVALID_ARGUMENT, "params->ucb_exploration", "must be finite and >= 0");
      policy.exploration = params->ucb_exploration;
      break;
    case FLASHSPEC_BANDIT_THOMPSON:
      policy.kind = PolicyKind::kThompson;
      policy.seed = params->bandit_seed;
      break;
    case FLASHSPEC_BANDIT_FIXED:
      policy.kind = PolicyKind::kFixed;
      require(params->fixed_arm >= 0 && params->fixed_arm < num_arms, FLASHSPEC_ERR_OUT_OF_RANGE,
              "params->fixed_arm", "is " + str(params->fixed_arm) + ", outside [0, " + str(num_arms) + ")");
      policy.fixed_arm = params->fixed_arm;
      break;
    case FLASHSPEC_BANDIT_ORACLE:
      policy.kind = PolicyKind::kOracle;
      require(params->oracle_rewards != nullptr, FLASHSPEC_ERR_NULL_POINTER, "params->oracle_rewards",
              "is NULL (the ORACLE policy needs one expected reward per arm)");
      for (int32_t a = 0; a < num_arms; ++a) {
        require(std::isfinite(params->oracle_rewards[a]), FLASHSPEC_ERR_INVALID_ARGUMENT, "params->oracle_rewards",
                "entry " + str(a) + " is not finite");
        policy.oracle_means.push_back(params->oracle_rewards[a]);
      }
      break;
    default:
      fail(FLASHSPEC_ERR_INVALID_ARGUMENT, "params->policy: unknown value " + str(int64_t(params->policy)));
  }

  require(std::isfinite(params->target_step_cost) && params->target_step_cost > 0.0, FLASHSPEC_ERR_INVALID_ARGUMENT,
          "params->target_step_cost", "must be finite and > 0, got " + std::to_string(params->target_step_cost));
  check_cost(params->target_row_cost, "params->target_row_cost");
  config.cost.target_step_cost = params->target_step_cost;
  config.cost.target_row_cost = params->target_row_cost;
  require(params->max_context >= 0, FLASHSPEC_ERR_OUT_OF_RANGE, "params->max_context",
          "must be >= 0 (0 = unlimited), got " + str(params->max_context));
  config.max_context = params->max_context;
  return config;
}

GenerateConfig validate_generate(const flashspec_engine& engine, const int32_t* prompt, int32_t prompt_len,
                                 const flashspec_generate_params* params, int32_t* tokens_out,
                                 int32_t tokens_capacity, const flashspec_generate_result* result) {
  require(!engine.engine->busy(), FLASHSPEC_ERR_INVALID_ARGUMENT, "engine",
          "is already generating (flashspec_engine_generate called from one of its callbacks)");
  flashspec_generate_params defaults;
  flashspec_generate_params_init(&defaults);
  if (params) validate_struct_size(params->struct_size, sizeof(flashspec_generate_params), "params->struct_size");
  const flashspec_generate_params& p = params ? *params : defaults;
  const int64_t vocab = engine.engine->vocab();

  require(prompt != nullptr, FLASHSPEC_ERR_NULL_POINTER, "prompt", "is NULL");
  require(prompt_len >= 1, FLASHSPEC_ERR_OUT_OF_RANGE, "prompt_len", "must be >= 1, got " + str(prompt_len));
  for (int32_t i = 0; i < prompt_len; ++i)
    require(prompt[i] >= 0 && prompt[i] < vocab, FLASHSPEC_ERR_OUT_OF_RANGE, "prompt",
            "token " + str(i) + " is " + str(prompt[i]) + ", outside [0, " + str(vocab) + ")");
  require(result != nullptr, FLASHSPEC_ERR_NULL_POINTER, "result", "is NULL");
  validate_struct_size(result->struct_size, sizeof(flashspec_generate_result), "result->struct_size");

  validate_temperature(p.temperature, "params->temperature");
  require(p.max_tokens >= 1, FLASHSPEC_ERR_OUT_OF_RANGE, "params->max_tokens", "must be >= 1, got " + str(p.max_tokens));
  require(p.num_stop_tokens >= 0, FLASHSPEC_ERR_OUT_OF_RANGE, "params->num_stop_tokens",
          "must be >= 0, got " + str(p.num_stop_tokens));
  if (p.num_stop_tokens > 0)
    require(p.stop_tokens != nullptr, FLASHSPEC_ERR_NULL_POINTER, "params->stop_tokens",
            "is NULL while num_stop_tokens is " + str(p.num_stop_tokens));
  for (int32_t i = 0; i < p.num_stop_tokens; ++i)
    require(p.stop_tokens[i] >= 0 && p.stop_tokens[i] < vocab, FLASHSPEC_ERR_OUT_OF_RANGE, "params->stop_tokens",
            "entry " + str(i) + " is " + str(p.stop_tokens[i]) + ", outside [0, " + str(vocab) + ")");

  require(tokens_capacity >= 0, FLASHSPEC_ERR_OUT_OF_RANGE, "tokens_capacity",
          "must be >= 0, got " + str(tokens_capacity));
  if (tokens_out == nullptr)
    require(tokens_capacity == 0, FLASHSPEC_ERR_NULL_POINTER, "tokens_out",
            "is NULL while tokens_capacity is " + str(tokens_capacity));
  else
    require(tokens_capacity >= p.max_tokens, FLASHSPEC_ERR_OUT_OF_RANGE, "tokens_capacity",
            str(tokens_capacity) + " is smaller than params->max_tokens " + str(p.max_tokens));
  const int32_t max_context = engine.engine->max_context();
  if (max_context > 0)
    require(prompt_len <= max_context, FLASHSPEC_ERR_OUT_OF_RANGE, "prompt_len",
            str(prompt_len) + " exceeds the engine's max_context " + str(max_context));

  GenerateConfig config;
  config.temperature = p.temperature;
  config.seed = p.seed;
  config.request_id = p.request_id;
  config.max_tokens = p.max_tokens;
  if (p.num_stop_tokens > 0) config.stop_tokens.assign(p.stop_tokens, p.stop_tokens + p.num_stop_tokens);
  config.on_token = p.on_token;
  config.on_token_user_data = p.on_token_user_data;
  return config;
}

void write_result(const GenerateProgress& progress, flashspec_generate_result* result) {
  result->num_tokens = progress.num_tokens;
  result->finish_reason = progress.finish_reason;
  result->steps = progress.steps;
}

}  // namespace

extern "C" {

void flashspec_ngram_params_init(flashspec_ngram_params* params) {
  if (!params) return;
  *params = flashspec_ngram_params{};
  params->struct_size = sizeof(flashspec_ngram_params);
  params->min_n = 1;
  params->max_n = 4;
}

flashspec_status flashspec_drafter_create_ngram(flashspec_context* ctx, const flashspec_ngram_params* params,
                                                flashspec_drafter** out) {
  if (!ctx) return null_context();
  return guarded(ctx, [&] {
    require(out != nullptr, FLASHSPEC_ERR_NULL_POINTER, "out", "is NULL");
    flashspec_ngram_params p;
    flashspec_ngram_params_init(&p);
    if (params) {
      validate_struct_size(params->struct_size, sizeof(flashspec_ngram_params), "params->struct_size");
      p = *params;
    }
    require(p.min_n >= 1 && p.min_n <= NgramDrafter::kMaxN, FLASHSPEC_ERR_OUT_OF_RANGE, "params->min_n",
            "must be in [1, " + str(NgramDrafter::kMaxN) + "], got " + str(p.min_n));
    require(p.max_n >= p.min_n && p.max_n <= NgramDrafter::kMaxN, FLASHSPEC_ERR_OUT_OF_RANGE, "params->max_n",
            "must be in [min_n, " + str(NgramDrafter::kMaxN) + "], got " + str(p.max_n));
    check_cost(p.call_cost, "params->call_cost");
    check_cost(p.token_cost, "params->token_cost");
    auto drafter = std::make_unique<flashspec_drafter>();
    drafter->impl = std::make_unique<NgramDrafter>(p.min_n, p.max_n, DrafterCost{p.call_cost, p.token_cost});
    *out = drafter.release();
  });
}

void flashspec_callback_drafter_params_init(flashspec_callback_drafter_params* params) {
  if (!params) return;
  *params = flashspec_callback_drafter_params{};
  params->struct_size = sizeof(flashspec_callback_drafter_params);
  params->kind = FLASHSPEC_DRAFT_TOKENS;
  params->draft_temperature = 1.0f;
}

flashspec_status flashspec_drafter_create_callback(flashspec_context* ctx,
                                                   const flashspec_callback_drafter_params* params,
                                                   flashspec_drafter** out) {
  if (!ctx) return null_context();
  return guarded(ctx, [&] {
    require(out != nullptr, FLASHSPEC_ERR_NULL_POINTER, "out", "is NULL");
    require(params != nullptr, FLASHSPEC_ERR_NULL_POINTER, "params", "is NULL (the draft callback is required)");
    validate_struct_size(params->struct_size, sizeof(flashspec_callback_drafter_params), "params->struct_size");
    require(params->kind == FLASHSPEC_DRAFT_TOKENS || params->kind == FLASHSPEC_DRAFT_LOGITS ||
                params->kind == FLASHSPEC_DRAFT_HIDDEN,
            FLASHSPEC_ERR_INVALID_ARGUMENT, "params->kind", "unknown value " + str(int64_t(params->kind)));
    require(params->draft != nullptr, FLASHSPEC_ERR_NULL_POINTER, "params->draft", "is NULL");
    if (params->kind == FLASHSPEC_DRAFT_LOGITS)
      require(std::isfinite(params->draft_temperature) && params->draft_temperature > 0.0f,
              FLASHSPEC_ERR_INVALID_ARGUMENT, "params->draft_temperature",
              "must be finite and > 0 for LOGITS drafts, got " + std::to_string(params->draft_temperature));
    if (params->kind == FLASHSPEC_DRAFT_HIDDEN) validate_head(*ctx, params->head, "params->head");
    check_cost(params->call_cost, "params->call_cost");
    check_cost(params->token_cost, "params->token_cost");
    CallbackDrafterConfig config;
    config.kind = params->kind;
    config.draft = params->draft;
    config.user_data = params->user_data;
    config.draft_temperature = params->draft_temperature;
    config.head = params->kind == FLASHSPEC_DRAFT_HIDDEN ? params->head->storage.get() : nullptr;
    config.cost = DrafterCost{params->call_cost, params->token_cost};
    auto drafter = std::make_unique<flashspec_drafter>();
    drafter->impl = std::make_unique<CallbackDrafter>(config);
    drafter->head = params->kind == FLASHSPEC_DRAFT_HIDDEN ? params->head : nullptr;
    *out = drafter.release();
  });
}

void flashspec_drafter_destroy(flashspec_drafter* drafter) { delete drafter; }

void flashspec_engine_params_init(flashspec_engine_params* params) {
  if (!params) return;
  *params = flashspec_engine_params{};
  params->struct_size = sizeof(flashspec_engine_params);
  params->default_draft_len = 4;
  params->policy = FLASHSPEC_BANDIT_UCB1;
  params->ucb_exploration = 1.0;
  params->target_step_cost = 1.0;
  params->target_row_cost = 0.02;
}

flashspec_status flashspec_engine_create(flashspec_context* ctx, const flashspec_lm_head* target_head,
                                         const flashspec_engine_params* params, flashspec_engine** out) {
  if (!ctx) return null_context();
  return guarded(ctx, [&] {
    require(out != nullptr, FLASHSPEC_ERR_NULL_POINTER, "out", "is NULL");
    auto engine = std::make_unique<flashspec_engine>();
    EngineConfig config = validate_engine(*ctx, target_head, params, engine->drafters);
    engine->ctx = ctx;
    engine->runner = std::make_unique<LmHeadRunner>(*ctx->backend, ctx->max_rows, ctx->seed);
    engine->engine = std::make_unique<Engine>(std::move(config), *engine->runner);
    for (flashspec_drafter* drafter : engine->drafters) drafter->owner = engine.get();
    *out = engine.release();
  });
}

void flashspec_engine_destroy(flashspec_engine* engine) {
  if (!engine) return;
  for (flashspec_drafter* drafter : engine->drafters) drafter->owner = nullptr;
  delete engine;
}

void flashspec_generate_params_init(flashspec_generate_params* params) {
  if (!params) return;
  *params = flashspec_generate_params{};
  params->struct_size = sizeof(flashspec_generate_params);
  params->temperature = 1.0f;
  params->max_tokens = 256;
}

void flashspec_generate_result_init(flashspec_generate_result* result) {
  if (!result) return;
  *result = flashspec_generate_result{};
  result->struct_size = sizeof(flashspec_generate_result);
  result->finish_reason = FLASHSPEC_FINISH_NONE;
}

flashspec_status flashspec_engine_generate(flashspec_engine* engine, const int32_t* prompt, int32_t prompt_len,
                                           const flashspec_generate_params* params, int32_t* tokens_out,
                                           int32_t tokens_capacity, flashspec_generate_result* result) {
  if (!engine) return null_engine();
  return guarded(engine->ctx, [&] {
    GenerateConfig config =
        validate_generate(*engine, prompt, prompt_len, params, tokens_out, tokens_capacity, result);
    FieldNames names{};
    names[size_t(Field::kTemperature)] = "params->temperature";
    try {
      naming_fields(names, [&] { engine->engine->generate(prompt, prompt_len, config, tokens_out); });
    } catch (...) {
      write_result(engine->engine->progress(), result);
      throw;
    }
    write_result(engine->engine->progress(), result);
  });
}

void flashspec_engine_cancel(flashspec_engine* engine) {
  if (engine) engine->engine->cancel();
}

void flashspec_engine_metrics_init(flashspec_engine_metrics* metrics) {
  if (!metrics) return;
  *metrics = flashspec_engine_metrics{};
  metrics->struct_size = sizeof(flashspec_engine_metrics);
}

flashspec_status flashspec_engine_get_metrics(const flashspec_engine* engine, flashspec_engine_metrics* out) {
  if (!engine) return null_engine();
  return guarded(engine->ctx, [&] {
    require(out != nullptr, FLASHSPEC_ERR_NULL_POINTER, "out", "is NULL");
    validate_struct_size(out->struct_size, sizeof(flashspec_engine_metrics), "out->struct_size");
    const MetricsSnapshot s = engine->engine->metrics().snapshot();
    flashspec_engine_metrics m;
    flashspec_engine_metrics_init(&m);
    m.steps = s.steps;
    m.drafts = s.drafts;
    m.draft_tokens = s.draft_tokens;
    m.accepted_tokens = s.accepted_tokens;
    m.emitted_tokens = s.emitted_tokens;
    m.acceptance_rate = s.acceptance_rate;
    m.mean_accepted_length = s.mean_accepted_length;
    m.tokens_per_step = s.tokens_per_step;
    m.step_latency_p50_us = s.latency_p50_seconds * 1e6;
    m.step_latency_p99_us = s.latency_p99_seconds * 1e6;
    m.num_positions = s.num_positions;
    m.num_arms = int32_t(engine->engine->arms().size());
    *out = m;
  });
}

flashspec_status flashspec_engine_get_position_metrics(const flashspec_engine* engine, int32_t capacity,
                                                       uint64_t* drafted, uint64_t* accepted,
                                                       int32_t* num_positions_out) {
  if (!engine) return null_engine();
  return guarded(engine->ctx, [&] {
    require(capacity >= 0, FLASHSPEC_ERR_OUT_OF_RANGE, "capacity", "must be >= 0, got " + str(capacity));
    if (capacity > 0) {
      require(drafted != nullptr, FLASHSPEC_ERR_NULL_POINTER, "drafted", "is NULL while capacity is " + str(capacity));
      require(accepted != nullptr, FLASHSPEC_ERR_NULL_POINTER, "accepted", "is NULL while capacity is " + str(capacity));
    }
    const Metrics& metrics = engine->engine->metrics();
    const int32_t positions = int32_t(metrics.position_drafted().size());
    for (int32_t j = 0; j < std::min(capacity, positions); ++j) {
      drafted[j] = metrics.position_drafted()[size_t(j)];
      accepted[j] = metrics.position_accepted()[size_t(j)];
    }
    if (num_positions_out) *num_positions_out = positions;
  });
}

void flashspec_arm_metrics_init(flashspec_arm_metrics* metrics) {
  if (!metrics) return;
  *metrics = flashspec_arm_metrics{};
  metrics->struct_size = sizeof(flashspec_arm_metrics);
}

flashspec_status flashspec_engine_get_arm_metrics(const flashspec_engine* engine, int32_t arm,
                                                  flashspec_arm_metrics* out) {
  if (!engine) return null_engine();
  return guarded(engine->ctx, [&] {
    require(out != nullptr, FLASHSPEC_ERR_NULL_POINTER, "out", "is NULL");
    validate_struct_size(out->struct_size, sizeof(flashspec_arm_metrics), "out->struct_size");
    const int32_t arms = int32_t(engine->engine->arms().size());
    require(arm >= 0 && arm < arms, FLASHSPEC_ERR_OUT_OF_RANGE, "arm",
            "is " + str(arm) + ", outside [0, " + str(arms) + ")");
    const Arm& spec = engine->engine->arms()[size_t(arm)];
    const ArmStats& stats = engine->engine->metrics().arms()[size_t(arm)];
    flashspec_arm_metrics m;
    flashspec_arm_metrics_init(&m);
    m.drafter = spec.drafter;
    m.draft_len = spec.draft_len;
    m.pulls = stats.pulls;
    m.draft_tokens = stats.draft_tokens;
    m.accepted_tokens = stats.accepted_tokens;
    m.mean_reward = stats.pulls ? stats.reward_sum / double(stats.pulls) : 0.0;
    m.mean_cost = stats.pulls ? stats.cost_sum / double(stats.pulls) : 0.0;
    *out = m;
  });
}

flashspec_status flashspec_engine_reset_metrics(flashspec_engine* engine) {
  if (!engine) return null_engine();
  return guarded(engine->ctx, [&] {
    require(!engine->engine->busy(), FLASHSPEC_ERR_INVALID_ARGUMENT, "engine",
            "is generating; reset its metrics between generations");
    engine->engine->reset_metrics();
  });
}

}  // extern "C"
