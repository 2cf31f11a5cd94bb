// The engine section of flashspec.h: drafters, engines, generation and
// metrics. Validation first, each failure naming its argument; the engine
// itself (src/engine) drives the context's backend directly.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "capi/guard.h"
#include "capi/handles.h"
#include "capi/params.h"
#include "capi/validate.h"
#include "engine/batch_engine.h"
#include "engine/callback_drafter.h"
#include "engine/engine.h"
#include "engine/lm_head_runner.h"
#include "engine/ngram_drafter.h"
#include "engine/suffix_drafter.h"
#include "flashspec.h"

using namespace flashspec;

struct flashspec_drafter {
  std::unique_ptr<Drafter> impl;
  flashspec_context* ctx = nullptr;         // where its own calls report errors
  const flashspec_lm_head* head = nullptr;  // HIDDEN callback drafters
  bool stochastic = false;                  // a LOGITS callback drafter
  const void* owner = nullptr;              // the engine or batched engine it serves, if any
  // Whether the drafter's own entry points must refuse now: its engine is
  // generating, or it serves a batched sequence (whose index they would
  // replace).
  bool (*owner_busy)(const void* owner) = nullptr;
};

struct flashspec_engine {
  flashspec_context* ctx = nullptr;
  std::unique_ptr<LmHeadRunner> runner;
  std::unique_ptr<Engine> engine;
  std::vector<flashspec_drafter*> drafters;
};

struct flashspec_batch_engine {
  flashspec_context* ctx = nullptr;
  std::unique_ptr<LmHeadRunner> runner;
  std::unique_ptr<BatchEngine> engine;
  // Each sequence's drafter handles, released when it leaves.
  std::vector<std::pair<uint64_t, std::vector<flashspec_drafter*>>> drafters;
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

// A drafter serves an engine or one sequence of a batched engine from
// creation or add_sequence until the engine is destroyed or the sequence
// removed.
void serve(flashspec_drafter* drafter, const flashspec_engine* engine) {
  drafter->owner = engine;
  drafter->owner_busy = [](const void* owner) { return static_cast<const flashspec_engine*>(owner)->engine->busy(); };
}
void serve(flashspec_drafter* drafter, const flashspec_batch_engine* engine) {
  drafter->owner = engine;
  drafter->owner_busy = [](const void*) { return true; };
}
void release(flashspec_drafter* drafter) {
  drafter->owner = nullptr;
  drafter->owner_busy = nullptr;
}
bool owner_busy(const flashspec_drafter& drafter) { return drafter.owner && drafter.owner_busy(drafter.owner); }

flashspec_status null_engine() {
  return guarded(nullptr, [] { fail(FLASHSPEC_ERR_NULL_POINTER, "engine: is NULL"); });
}

const BatchEngine::Slot* find_sequence(const flashspec_batch_engine& engine, uint64_t sequence_id) {
  const BatchEngine::Slot* slot = engine.engine->find(sequence_id);
  require(slot != nullptr, FLASHSPEC_ERR_OUT_OF_RANGE, "sequence_id",
          std::to_string(sequence_id) + " is not in the engine");
  return slot;
}

// The drafters of an engine or of one sequence: none NULL, none listed
// twice, none serving another engine or sequence, a HIDDEN drafter's head
// on this context with the target's vocabulary.
void validate_drafters(flashspec_context& ctx, flashspec_drafter* const* list, int32_t count, const std::string& list_name,
                       int64_t vocab, std::vector<flashspec_drafter*>& handles, std::vector<Drafter*>& impls) {
  if (count > 0)
    require(list != nullptr, FLASHSPEC_ERR_NULL_POINTER, list_name.c_str(),
            "is NULL while num_drafters is " + str(count));
  for (int32_t i = 0; i < count; ++i) {
    const std::string name = list_name + "[" + str(i) + "]";
    flashspec_drafter* drafter = list[i];
    require(drafter != nullptr, FLASHSPEC_ERR_NULL_POINTER, name.c_str(), "is NULL");
    require(drafter->owner == nullptr, FLASHSPEC_ERR_INVALID_ARGUMENT, name.c_str(),
            "already serves another engine or sequence");
    for (int32_t j = 0; j < i; ++j)
      require(list[j] != drafter, FLASHSPEC_ERR_INVALID_ARGUMENT, name.c_str(),
              "is listed twice (also at index " + str(j) + "); use two arms of one drafter instead");
    if (drafter->head) {
      validate_head(ctx, drafter->head, (name + " head").c_str());
      require(drafter->head->storage->vocab == vocab, FLASHSPEC_ERR_OUT_OF_RANGE, name.c_str(),
              "drafts over a vocabulary of " + str(drafter->head->storage->vocab) + ", the target's has " +
                  str(vocab));
    }
    handles.push_back(drafter);
    impls.push_back(drafter->impl.get());
  }
}

// The fields flashspec_engine_params and flashspec_batch_engine_params
// share (arms, policy, costs, max_context, the draft length rule), into
// either config.
template <class Params, class Config>
void validate_loop(const flashspec_context& ctx, const Params& p, int32_t num_drafters, Config& config) {
  const int32_t max_len = std::min<int32_t>(FLASHSPEC_MAX_DRAFT_LEN, ctx.max_rows - 1);
  if (p.arms) {
    require(p.num_arms >= 1 && p.num_arms <= 1024, FLASHSPEC_ERR_OUT_OF_RANGE, "params->num_arms",
            "must be in [1, 1024], got " + str(p.num_arms));
    for (int32_t a = 0; a < p.num_arms; ++a) {
      const flashspec_arm arm = p.arms[a];
      const std::string name = "params->arms[" + str(a) + "]";
      require(arm.draft_len >= 0 && arm.draft_len <= max_len, FLASHSPEC_ERR_OUT_OF_RANGE, name.c_str(),
              "draft_len " + str(arm.draft_len) + " is outside [0, " + str(max_len) +
                  "] (the context's max_rows − 1 and FLASHSPEC_MAX_DRAFT_LEN bound it)");
      if (arm.draft_len > 0)
        require(arm.drafter >= 0 && arm.drafter < num_drafters, FLASHSPEC_ERR_OUT_OF_RANGE, name.c_str(),
                "drafter " + str(arm.drafter) + " is outside [0, num_drafters = " + str(num_drafters) + ")");
      config.arms.push_back(Arm{arm.draft_len > 0 ? arm.drafter : -1, arm.draft_len});
    }
  } else {
    require(p.num_arms == 0, FLASHSPEC_ERR_NULL_POINTER, "params->arms",
            "is NULL while num_arms is " + str(p.num_arms));
    require(p.default_draft_len >= 0 && p.default_draft_len <= max_len, FLASHSPEC_ERR_OUT_OF_RANGE,
            "params->default_draft_len", "must be in [0, " + str(max_len) + "], got " + str(p.default_draft_len));
    for (int32_t i = 0; i < num_drafters; ++i)
      config.arms.push_back(p.default_draft_len > 0 ? Arm{i, p.default_draft_len} : Arm{-1, 0});
    if (config.arms.empty()) config.arms.push_back(Arm{-1, 0});
  }
  const int32_t num_arms = int32_t(config.arms.size());

  PolicyConfig& policy = config.policy;
  policy.num_arms = num_arms;
  switch (raw_enum(p.policy)) {
    case FLASHSPEC_BANDIT_UCB1:
      policy.kind = PolicyKind::kUcb1;
      require(std::isfinite(p.ucb_exploration) && p.ucb_exploration >= 0.0,
              FLASHSPEC_ERR_INVALID_ARGUMENT, "params->ucb_exploration", "must be finite and >= 0");
      policy.exploration = p.ucb_exploration;
      break;
    case FLASHSPEC_BANDIT_THOMPSON:
      policy.kind = PolicyKind::kThompson;
      policy.seed = p.bandit_seed;
      break;
    case FLASHSPEC_BANDIT_FIXED:
      policy.kind = PolicyKind::kFixed;
      require(p.fixed_arm >= 0 && p.fixed_arm < num_arms, FLASHSPEC_ERR_OUT_OF_RANGE,
              "params->fixed_arm", "is " + str(p.fixed_arm) + ", outside [0, " + str(num_arms) + ")");
      policy.fixed_arm = p.fixed_arm;
      break;
    case FLASHSPEC_BANDIT_ORACLE:
      policy.kind = PolicyKind::kOracle;
      require(p.oracle_rewards != nullptr, FLASHSPEC_ERR_NULL_POINTER, "params->oracle_rewards",
              "is NULL (the ORACLE policy needs one expected reward per arm)");
      for (int32_t a = 0; a < num_arms; ++a) {
        require(std::isfinite(p.oracle_rewards[a]), FLASHSPEC_ERR_INVALID_ARGUMENT, "params->oracle_rewards",
                "entry " + str(a) + " is not finite");
        policy.oracle_means.push_back(p.oracle_rewards[a]);
      }
      break;
    default:
      fail(FLASHSPEC_ERR_INVALID_ARGUMENT, "params->policy: unknown value " + str(raw_enum(p.policy)));
  }

  require(std::isfinite(p.target_step_cost) && p.target_step_cost > 0.0, FLASHSPEC_ERR_INVALID_ARGUMENT,
          "params->target_step_cost", "must be finite and > 0, got " + std::to_string(p.target_step_cost));
  check_cost(p.target_row_cost, "params->target_row_cost");
  config.cost.target_step_cost = p.target_step_cost;
  config.cost.target_row_cost = p.target_row_cost;
  require(p.max_context >= 0, FLASHSPEC_ERR_OUT_OF_RANGE, "params->max_context",
          "must be >= 0 (0 = unlimited), got " + str(p.max_context));
  config.max_context = p.max_context;
  switch (raw_enum(p.draft_len_rule)) {
    case FLASHSPEC_DRAFT_LEN_ARM: break;
    case FLASHSPEC_DRAFT_LEN_ADAPTIVE: config.adaptive_draft_len = true; break;
    default:
      fail(FLASHSPEC_ERR_INVALID_ARGUMENT, "params->draft_len_rule: unknown value " + str(raw_enum(p.draft_len_rule)));
  }
  require(std::isfinite(p.draft_len_memory) && p.draft_len_memory >= 1.0 && p.draft_len_memory <= 1e6,
          FLASHSPEC_ERR_INVALID_ARGUMENT, "params->draft_len_memory",
          "must be in [1, 1e6], got " + std::to_string(p.draft_len_memory));
  config.draft_len_memory = p.draft_len_memory;
}

EngineConfig validate_engine(flashspec_context& ctx, const flashspec_lm_head* target_head,
                             const flashspec_engine_params* params, std::vector<flashspec_drafter*>& drafters) {
  validate_head(ctx, target_head, "target_head");
  require(params != nullptr, FLASHSPEC_ERR_NULL_POINTER, "params", "is NULL (the target callbacks are required)");
  const flashspec_engine_params p = load_struct(
      params, [](flashspec_engine_params* q) { flashspec_engine_params_init(q); }, "params");
  require(p.target_forward != nullptr, FLASHSPEC_ERR_NULL_POINTER, "params->target_forward", "is NULL");

  EngineConfig config;
  config.target_head = target_head->storage.get();
  config.target_forward = p.target_forward;
  config.target_rollback = p.target_rollback;
  config.target_keep = p.target_keep;
  config.target_user_data = p.target_user_data;
  require(p.num_drafters >= 0 && p.num_drafters <= 1024, FLASHSPEC_ERR_OUT_OF_RANGE,
          "params->num_drafters", "must be in [0, 1024], got " + str(p.num_drafters));
  validate_drafters(ctx, p.drafters, p.num_drafters, "params->drafters", target_head->storage->vocab, drafters,
                    config.drafters);
  validate_loop(ctx, p, p.num_drafters, config);
  return config;
}

BatchEngineConfig validate_batch_engine(flashspec_context& ctx, const flashspec_lm_head* target_head,
                                        const flashspec_batch_engine_params* params) {
  validate_head(ctx, target_head, "target_head");
  require(params != nullptr, FLASHSPEC_ERR_NULL_POINTER, "params", "is NULL (the target callbacks are required)");
  const flashspec_batch_engine_params p = load_struct(params, flashspec_batch_engine_params_init, "params");
  require(p.target_forward != nullptr, FLASHSPEC_ERR_NULL_POINTER, "params->target_forward", "is NULL");

  BatchEngineConfig config;
  config.target_head = target_head->storage.get();
  config.target_forward = p.target_forward;
  config.target_rollback = p.target_rollback;
  config.target_keep = p.target_keep;
  config.target_user_data = p.target_user_data;
  require(p.num_drafters >= 0 && p.num_drafters <= 1024, FLASHSPEC_ERR_OUT_OF_RANGE,
          "params->num_drafters", "must be in [0, 1024], got " + str(p.num_drafters));
  config.num_drafters = p.num_drafters;
  validate_loop(ctx, p, p.num_drafters, config);

  // Every step must fit one verify pass of the context's workspace.
  int32_t longest = 0;
  for (const Arm& arm : config.arms) longest = std::max(longest, arm.draft_len);
  const int32_t fits = std::min(ctx.max_requests, ctx.max_rows / (longest + 1));
  require(p.max_sequences >= 0 && p.max_sequences <= fits, FLASHSPEC_ERR_OUT_OF_RANGE, "params->max_sequences",
          "is " + str(p.max_sequences) + ", outside [0, " + str(fits) +
              "] (the context's max_requests, and max_rows / (longest draft_len + 1))");
  config.max_sequences = p.max_sequences > 0 ? p.max_sequences : fits;
  return config;
}

// The prompt of a generation or a sequence.
void validate_prompt(const int32_t* prompt, int32_t prompt_len, int64_t vocab, int32_t max_context) {
  require(prompt != nullptr, FLASHSPEC_ERR_NULL_POINTER, "prompt", "is NULL");
  require(prompt_len >= 1, FLASHSPEC_ERR_OUT_OF_RANGE, "prompt_len", "must be >= 1, got " + str(prompt_len));
  for (int32_t i = 0; i < prompt_len; ++i)
    require(prompt[i] >= 0 && prompt[i] < vocab, FLASHSPEC_ERR_OUT_OF_RANGE, "prompt",
            "token " + str(i) + " is " + str(prompt[i]) + ", outside [0, " + str(vocab) + ")");
  if (max_context > 0)
    require(prompt_len <= max_context, FLASHSPEC_ERR_OUT_OF_RANGE, "prompt_len",
            str(prompt_len) + " exceeds the engine's max_context " + str(max_context));
}

// The fields flashspec_generate_params and flashspec_sequence_params share
// (temperature, seed, request id, budget, stop tokens); the caller sets
// on_token.
template <class Params>
GenerateConfig validate_generation(const Params& p, int64_t vocab) {
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
  GenerateConfig config;
  config.temperature = p.temperature;
  config.seed = p.seed;
  config.request_id = p.request_id;
  config.max_tokens = p.max_tokens;
  if (p.num_stop_tokens > 0) config.stop_tokens.assign(p.stop_tokens, p.stop_tokens + p.num_stop_tokens);
  return config;
}

GenerateConfig validate_generate(const flashspec_engine& engine, const int32_t* prompt, int32_t prompt_len,
                                 const flashspec_generate_params* params, int32_t* tokens_out,
                                 int32_t tokens_capacity, const flashspec_generate_result* result) {
  require(!engine.engine->busy(), FLASHSPEC_ERR_INVALID_ARGUMENT, "engine",
          "is already generating (flashspec_engine_generate called from one of its callbacks)");
  const flashspec_generate_params p = load_struct_or_defaults(params, flashspec_generate_params_init, "params");
  const int64_t vocab = engine.engine->vocab();
  validate_prompt(prompt, prompt_len, vocab, engine.engine->max_context());
  require(result != nullptr, FLASHSPEC_ERR_NULL_POINTER, "result", "is NULL");
  check_struct_size<flashspec_generate_result>(result->struct_size, "result");
  GenerateConfig config = validate_generation(p, vocab);
  require(tokens_capacity >= 0, FLASHSPEC_ERR_OUT_OF_RANGE, "tokens_capacity",
          "must be >= 0, got " + str(tokens_capacity));
  if (tokens_out == nullptr)
    require(tokens_capacity == 0, FLASHSPEC_ERR_NULL_POINTER, "tokens_out",
            "is NULL while tokens_capacity is " + str(tokens_capacity));
  else
    require(tokens_capacity >= p.max_tokens, FLASHSPEC_ERR_OUT_OF_RANGE, "tokens_capacity",
            str(tokens_capacity) + " is smaller than params->max_tokens " + str(p.max_tokens));
  if (p.on_token) {
    const flashspec_token_fn on_token = p.on_token;
    void* user_data = p.on_token_user_data;
    config.on_token = [on_token, user_data](int32_t token) { return on_token(user_data, token); };
  }
  return config;
}

void write_result(const GenerateProgress& progress, flashspec_generate_result* result) {
  flashspec_generate_result r;
  flashspec_generate_result_init(&r);
  r.num_tokens = progress.num_tokens;
  r.finish_reason = progress.finish_reason;
  r.steps = progress.steps;
  store_struct(r, result);
}

// Metrics out through the public structs; out->struct_size checked.
void store_engine_metrics(const Metrics& metrics, flashspec_engine_metrics* out) {
  const MetricsSnapshot s = metrics.snapshot();
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
  m.num_arms = int32_t(metrics.arms().size());
  store_struct(m, out);
}

void store_arm_metrics(const Arm& spec, const ArmStats& stats, flashspec_arm_metrics* out) {
  flashspec_arm_metrics m;
  flashspec_arm_metrics_init(&m);
  m.drafter = spec.drafter;
  m.draft_len = spec.draft_len;
  m.pulls = stats.pulls;
  m.draft_tokens = stats.draft_tokens;
  m.accepted_tokens = stats.accepted_tokens;
  m.mean_reward = stats.pulls ? stats.reward_sum / double(stats.pulls) : 0.0;
  m.mean_cost = stats.pulls ? stats.cost_sum / double(stats.pulls) : 0.0;
  store_struct(m, out);
}

// flashspec_engine_get_arm_metrics and its batched twin: arm `arm` of an
// engine handle (either kind) into out.
template <class Handle>
flashspec_status get_arm_metrics(const Handle* engine, int32_t arm, flashspec_arm_metrics* out) {
  if (!engine) return null_engine();
  return guarded(engine->ctx, [&] {
    require(out != nullptr, FLASHSPEC_ERR_NULL_POINTER, "out", "is NULL");
    check_struct_size<flashspec_arm_metrics>(out->struct_size, "out");
    const int32_t arms = int32_t(engine->engine->arms().size());
    require(arm >= 0 && arm < arms, FLASHSPEC_ERR_OUT_OF_RANGE, "arm",
            "is " + str(arm) + ", outside [0, " + str(arms) + ")");
    store_arm_metrics(engine->engine->arms()[size_t(arm)], engine->engine->metrics().arms()[size_t(arm)], out);
  });
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
    const flashspec_ngram_params p = load_struct_or_defaults(params, flashspec_ngram_params_init, "params");
    require(p.min_n >= 1 && p.min_n <= NgramDrafter::kMaxN, FLASHSPEC_ERR_OUT_OF_RANGE, "params->min_n",
            "must be in [1, " + str(NgramDrafter::kMaxN) + "], got " + str(p.min_n));
    require(p.max_n >= p.min_n && p.max_n <= NgramDrafter::kMaxN, FLASHSPEC_ERR_OUT_OF_RANGE, "params->max_n",
            "must be in [min_n, " + str(NgramDrafter::kMaxN) + "], got " + str(p.max_n));
    check_cost(p.call_cost, "params->call_cost");
    check_cost(p.token_cost, "params->token_cost");
    auto drafter = std::make_unique<flashspec_drafter>();
    drafter->impl = std::make_unique<NgramDrafter>(p.min_n, p.max_n, DrafterCost{p.call_cost, p.token_cost});
    drafter->ctx = ctx;
    *out = drafter.release();
  });
}

void flashspec_suffix_params_init(flashspec_suffix_params* params) {
  if (!params) return;
  const SuffixDrafterConfig defaults;
  *params = flashspec_suffix_params{};
  params->struct_size = sizeof(flashspec_suffix_params);
  params->max_match_len = defaults.max_match_len;
  params->max_depth = defaults.max_depth;
  params->min_probability = defaults.min_probability;
  params->cache_max_tokens = defaults.cache_max_tokens;
}

flashspec_status flashspec_drafter_create_suffix(flashspec_context* ctx, const flashspec_suffix_params* params,
                                                 flashspec_drafter** out) {
  if (!ctx) return null_context();
  return guarded(ctx, [&] {
    require(out != nullptr, FLASHSPEC_ERR_NULL_POINTER, "out", "is NULL");
    const flashspec_suffix_params p = load_struct_or_defaults(params, flashspec_suffix_params_init, "params");
    require(p.max_match_len >= 1 && p.max_match_len <= SuffixDrafter::kMaxMatchLen, FLASHSPEC_ERR_OUT_OF_RANGE,
            "params->max_match_len",
            "must be in [1, " + str(SuffixDrafter::kMaxMatchLen) + "], got " + str(p.max_match_len));
    require(p.max_depth >= 1 && p.max_depth <= SuffixDrafter::kMaxDepth, FLASHSPEC_ERR_OUT_OF_RANGE,
            "params->max_depth", "must be in [1, " + str(SuffixDrafter::kMaxDepth) + "], got " + str(p.max_depth));
    require(std::isfinite(p.min_probability) && p.min_probability >= 0.0 && p.min_probability <= 1.0,
            FLASHSPEC_ERR_OUT_OF_RANGE, "params->min_probability",
            "must be in [0, 1], got " + std::to_string(p.min_probability));
    require(p.cache_max_tokens >= 0 && p.cache_max_tokens <= SuffixDrafter::kMaxCacheTokens,
            FLASHSPEC_ERR_OUT_OF_RANGE, "params->cache_max_tokens",
            "must be in [0, " + str(SuffixDrafter::kMaxCacheTokens) + "], got " + str(p.cache_max_tokens));
    check_cost(p.call_cost, "params->call_cost");
    check_cost(p.token_cost, "params->token_cost");
    require(p.propose_trees == 0 || p.propose_trees == 1, FLASHSPEC_ERR_INVALID_ARGUMENT, "params->propose_trees",
            "must be 0 or 1, got " + str(p.propose_trees));
    SuffixDrafterConfig config;
    config.max_match_len = p.max_match_len;
    config.max_depth = p.max_depth;
    config.min_probability = p.min_probability;
    config.cache_max_tokens = p.cache_max_tokens;
    config.propose_trees = p.propose_trees == 1;
    config.cost = DrafterCost{p.call_cost, p.token_cost};
    auto drafter = std::make_unique<flashspec_drafter>();
    drafter->impl = std::make_unique<SuffixDrafter>(config);
    drafter->ctx = ctx;
    *out = drafter.release();
  });
}

flashspec_status flashspec_suffix_drafter_propose_tree(flashspec_drafter* drafter, const int32_t* context,
                                                       int32_t context_len, int32_t max_nodes, int32_t* tokens_out,
                                                       int32_t* parents_out, int32_t* num_nodes_out) {
  if (!drafter) return guarded(nullptr, [] { fail(FLASHSPEC_ERR_NULL_POINTER, "drafter: is NULL"); });
  return guarded(drafter->ctx, [&] {
    auto* suffix = dynamic_cast<SuffixDrafter*>(drafter->impl.get());
    require(suffix != nullptr, FLASHSPEC_ERR_INVALID_ARGUMENT, "drafter",
            "is not a suffix drafter (flashspec_drafter_create_suffix)");
    require(!owner_busy(*drafter), FLASHSPEC_ERR_INVALID_ARGUMENT, "drafter",
            "serves an engine that is generating, or a sequence of a batched engine");
    require(context != nullptr, FLASHSPEC_ERR_NULL_POINTER, "context", "is NULL");
    require(context_len >= 1, FLASHSPEC_ERR_OUT_OF_RANGE, "context_len", "must be >= 1, got " + str(context_len));
    for (int32_t i = 0; i < context_len; ++i)
      require(context[i] >= 0, FLASHSPEC_ERR_OUT_OF_RANGE, "context",
              "token " + str(i) + " is " + str(context[i]) + ", a token id must be >= 0");
    require(max_nodes >= 0 && max_nodes <= FLASHSPEC_MAX_DRAFT_LEN, FLASHSPEC_ERR_OUT_OF_RANGE, "max_nodes",
            "must be in [0, " + str(FLASHSPEC_MAX_DRAFT_LEN) + "], got " + str(max_nodes));
    if (max_nodes > 0) {
      require(tokens_out != nullptr, FLASHSPEC_ERR_NULL_POINTER, "tokens_out",
              "is NULL while max_nodes is " + str(max_nodes));
      require(parents_out != nullptr, FLASHSPEC_ERR_NULL_POINTER, "parents_out",
              "is NULL while max_nodes is " + str(max_nodes));
    }
    require(num_nodes_out != nullptr, FLASHSPEC_ERR_NULL_POINTER, "num_nodes_out", "is NULL");
    suffix->observe(context, context_len);
    SuffixTree tree;
    suffix->propose_tree(max_nodes, tree);
    std::copy(tree.tokens.begin(), tree.tokens.end(), tokens_out);
    std::copy(tree.parents.begin(), tree.parents.end(), parents_out);
    *num_nodes_out = int32_t(tree.tokens.size());
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
    const flashspec_callback_drafter_params p =
        load_struct(params, flashspec_callback_drafter_params_init, "params");
    const int32_t kind = raw_enum(p.kind);
    require(kind == FLASHSPEC_DRAFT_TOKENS || kind == FLASHSPEC_DRAFT_LOGITS || kind == FLASHSPEC_DRAFT_HIDDEN ||
                kind == FLASHSPEC_DRAFT_TREE,
            FLASHSPEC_ERR_INVALID_ARGUMENT, "params->kind", "unknown value " + str(kind));
    require(p.draft != nullptr, FLASHSPEC_ERR_NULL_POINTER, "params->draft", "is NULL");
    if (p.kind == FLASHSPEC_DRAFT_LOGITS)
      require(std::isfinite(p.draft_temperature) && p.draft_temperature > 0.0f,
              FLASHSPEC_ERR_INVALID_ARGUMENT, "params->draft_temperature",
              "must be finite and > 0 for LOGITS drafts, got " + std::to_string(p.draft_temperature));
    if (p.kind == FLASHSPEC_DRAFT_HIDDEN) validate_head(*ctx, p.head, "params->head");
    check_cost(p.call_cost, "params->call_cost");
    check_cost(p.token_cost, "params->token_cost");
    CallbackDrafterConfig config;
    config.kind = p.kind;
    config.draft = p.draft;
    config.user_data = p.user_data;
    config.draft_temperature = p.draft_temperature;
    config.head = p.kind == FLASHSPEC_DRAFT_HIDDEN ? p.head->storage.get() : nullptr;
    config.cost = DrafterCost{p.call_cost, p.token_cost};
    auto drafter = std::make_unique<flashspec_drafter>();
    drafter->impl = std::make_unique<CallbackDrafter>(config);
    drafter->head = p.kind == FLASHSPEC_DRAFT_HIDDEN ? p.head : nullptr;
    drafter->stochastic = p.kind == FLASHSPEC_DRAFT_LOGITS;
    drafter->ctx = ctx;
    *out = drafter.release();
  });
}

void flashspec_drafter_destroy(flashspec_drafter* drafter) { delete drafter; }

void flashspec_engine_params_init_sized(flashspec_engine_params* params, size_t size) {
  flashspec_engine_params defaults{};
  defaults.default_draft_len = 4;
  defaults.policy = FLASHSPEC_BANDIT_UCB1;
  defaults.ucb_exploration = 1.0;
  defaults.target_step_cost = 1.0;
  defaults.target_row_cost = 0.02;
  defaults.draft_len_memory = 64.0;
  defaults.draft_len_rule = FLASHSPEC_DRAFT_LEN_ARM;
  init_prefix(params, size, defaults);
}

flashspec_status flashspec_engine_create(flashspec_context* ctx, const flashspec_lm_head* target_head,
                                         const flashspec_engine_params* params, flashspec_engine** out) {
  if (!ctx) return null_context();
  return guarded(ctx, [&] {
    require(out != nullptr, FLASHSPEC_ERR_NULL_POINTER, "out", "is NULL");
    auto engine = std::make_unique<flashspec_engine>();
    EngineConfig config = validate_engine(*ctx, target_head, params, engine->drafters);
    engine->ctx = ctx;
    engine->runner = std::make_unique<LmHeadRunner>(*ctx->backend, ctx->max_rows, 1, ctx->seed);
    engine->engine = std::make_unique<Engine>(std::move(config), *engine->runner);
    for (flashspec_drafter* drafter : engine->drafters) serve(drafter, engine.get());
    *out = engine.release();
  });
}

void flashspec_engine_destroy(flashspec_engine* engine) {
  if (!engine) return;
  for (flashspec_drafter* drafter : engine->drafters) release(drafter);
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
    check_struct_size<flashspec_engine_metrics>(out->struct_size, "out");
    store_engine_metrics(engine->engine->metrics(), out);
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
  return get_arm_metrics(engine, arm, out);
}

flashspec_status flashspec_engine_reset_metrics(flashspec_engine* engine) {
  if (!engine) return null_engine();
  return guarded(engine->ctx, [&] {
    require(!engine->engine->busy(), FLASHSPEC_ERR_INVALID_ARGUMENT, "engine",
            "is generating; reset its metrics between generations");
    engine->engine->reset_metrics();
  });
}

// ---- The batched engine ------------------------------------------------------

void flashspec_batch_engine_params_init(flashspec_batch_engine_params* params) {
  if (!params) return;
  *params = flashspec_batch_engine_params{};
  params->struct_size = sizeof(flashspec_batch_engine_params);
  params->default_draft_len = 4;
  params->policy = FLASHSPEC_BANDIT_UCB1;
  params->ucb_exploration = 1.0;
  params->target_step_cost = 1.0;
  params->target_row_cost = 0.02;
  params->draft_len_memory = 64.0;
  params->draft_len_rule = FLASHSPEC_DRAFT_LEN_ARM;
}

flashspec_status flashspec_batch_engine_create(flashspec_context* ctx, const flashspec_lm_head* target_head,
                                               const flashspec_batch_engine_params* params,
                                               flashspec_batch_engine** out) {
  if (!ctx) return null_context();
  return guarded(ctx, [&] {
    require(out != nullptr, FLASHSPEC_ERR_NULL_POINTER, "out", "is NULL");
    BatchEngineConfig config = validate_batch_engine(*ctx, target_head, params);
    auto engine = std::make_unique<flashspec_batch_engine>();
    engine->ctx = ctx;
    engine->runner = std::make_unique<LmHeadRunner>(*ctx->backend, ctx->max_rows, config.max_sequences, ctx->seed);
    engine->engine = std::make_unique<BatchEngine>(std::move(config), *engine->runner);
    *out = engine.release();
  });
}

void flashspec_batch_engine_destroy(flashspec_batch_engine* engine) {
  if (!engine) return;
  for (auto& sequence : engine->drafters)
    for (flashspec_drafter* drafter : sequence.second) release(drafter);
  delete engine;
}

void flashspec_sequence_params_init(flashspec_sequence_params* params) {
  if (!params) return;
  *params = flashspec_sequence_params{};
  params->struct_size = sizeof(flashspec_sequence_params);
  params->temperature = 1.0f;
  params->max_tokens = 256;
}

flashspec_status flashspec_batch_engine_add_sequence(flashspec_batch_engine* engine, uint64_t sequence_id,
                                                     const int32_t* prompt, int32_t prompt_len,
                                                     const flashspec_sequence_params* params) {
  if (!engine) return null_engine();
  return guarded(engine->ctx, [&] {
    BatchEngine& batch = *engine->engine;
    require(!batch.busy(), FLASHSPEC_ERR_INVALID_ARGUMENT, "engine",
            "is running a step (add_sequence called from one of its callbacks)");
    const flashspec_sequence_params p = load_struct_or_defaults(params, flashspec_sequence_params_init, "params");
    const int64_t vocab = batch.vocab();
    validate_prompt(prompt, prompt_len, vocab, batch.config().max_context);
    GenerateConfig config = validate_generation(p, vocab);
    const int32_t expected = batch.config().num_drafters;
    require(p.num_drafters == expected, FLASHSPEC_ERR_OUT_OF_RANGE, "params->num_drafters",
            "is " + str(p.num_drafters) + ", the engine's arms index " + str(expected) + " drafters");
    std::vector<flashspec_drafter*> handles;
    std::vector<Drafter*> drafters;
    validate_drafters(*engine->ctx, p.drafters, p.num_drafters, "params->drafters", vocab, handles, drafters);
    for (size_t i = 0; i < handles.size(); ++i)
      require(!handles[i]->stochastic, FLASHSPEC_ERR_UNSUPPORTED,
              ("params->drafters[" + str(int64_t(i)) + "]").c_str(),
              "is a LOGITS drafter; a batched engine verifies point-mass drafts only");
    require(batch.find(sequence_id) == nullptr, FLASHSPEC_ERR_INVALID_ARGUMENT, "sequence_id",
            std::to_string(sequence_id) + " is already in the engine");
    require(batch.size() < batch.config().max_sequences, FLASHSPEC_ERR_WORKSPACE_EXCEEDED, "engine",
            "holds max_sequences = " + str(batch.config().max_sequences) +
                " sequences already; remove one first");
    if (p.on_token) {
      const flashspec_sequence_token_fn on_token = p.on_token;
      void* user_data = p.on_token_user_data;
      config.on_token = [on_token, user_data, sequence_id](int32_t token) {
        return on_token(user_data, sequence_id, token);
      };
    }
    engine->drafters.emplace_back(sequence_id, handles);
    try {
      batch.add(sequence_id, prompt, prompt_len, std::move(config), std::move(drafters));
    } catch (...) {
      engine->drafters.pop_back();
      throw;
    }
    for (flashspec_drafter* drafter : handles) serve(drafter, engine);
  });
}

flashspec_status flashspec_batch_engine_remove_sequence(flashspec_batch_engine* engine, uint64_t sequence_id) {
  if (!engine) return null_engine();
  return guarded(engine->ctx, [&] {
    require(!engine->engine->busy(), FLASHSPEC_ERR_INVALID_ARGUMENT, "engine",
            "is running a step (remove_sequence called from one of its callbacks)");
    require(engine->engine->remove(sequence_id), FLASHSPEC_ERR_OUT_OF_RANGE, "sequence_id",
            std::to_string(sequence_id) + " is not in the engine");
    auto& lists = engine->drafters;
    auto it = std::find_if(lists.begin(), lists.end(), [&](const auto& entry) { return entry.first == sequence_id; });
    for (flashspec_drafter* drafter : it->second) release(drafter);
    lists.erase(it);
  });
}

flashspec_status flashspec_batch_engine_step(flashspec_batch_engine* engine, int32_t* num_active_out) {
  if (!engine) return null_engine();
  return guarded(engine->ctx, [&] {
    require(!engine->engine->busy(), FLASHSPEC_ERR_INVALID_ARGUMENT, "engine",
            "is running a step (step called from one of its callbacks)");
    const int32_t active = engine->engine->step();
    if (num_active_out) *num_active_out = active;
  });
}

void flashspec_sequence_info_init(flashspec_sequence_info* info) {
  if (!info) return;
  *info = flashspec_sequence_info{};
  info->struct_size = sizeof(flashspec_sequence_info);
  info->status = FLASHSPEC_OK;
  info->finish_reason = FLASHSPEC_FINISH_NONE;
}

flashspec_status flashspec_batch_engine_get_sequence(const flashspec_batch_engine* engine, uint64_t sequence_id,
                                                     int32_t* tokens_out, int32_t capacity,
                                                     flashspec_sequence_info* info) {
  if (!engine) return null_engine();
  return guarded(engine->ctx, [&] {
    require(capacity >= 0, FLASHSPEC_ERR_OUT_OF_RANGE, "capacity", "must be >= 0, got " + str(capacity));
    if (capacity > 0)
      require(tokens_out != nullptr, FLASHSPEC_ERR_NULL_POINTER, "tokens_out",
              "is NULL while capacity is " + str(capacity));
    if (info) check_struct_size<flashspec_sequence_info>(info->struct_size, "info");
    const BatchEngine::Slot* slot = find_sequence(*engine, sequence_id);
    const GenerateProgress& progress = slot->sequence.progress();
    const std::vector<int32_t>& tokens = slot->sequence.tokens();
    const int32_t copied = std::min(capacity, progress.num_tokens);
    std::copy_n(tokens.begin() + slot->sequence.prompt_length(), copied, tokens_out);
    if (!info) return;
    flashspec_sequence_info i;
    flashspec_sequence_info_init(&i);
    i.active = slot->active ? 1 : 0;
    i.status = slot->status;
    i.finish_reason = slot->active ? FLASHSPEC_FINISH_NONE : progress.finish_reason;
    i.num_tokens = progress.num_tokens;
    i.steps = progress.steps;
    store_struct(i, info);
  });
}

const char* flashspec_batch_engine_sequence_error(const flashspec_batch_engine* engine, uint64_t sequence_id) {
  if (!engine) return nullptr;
  const BatchEngine::Slot* slot = engine->engine->find(sequence_id);
  return slot ? slot->error.c_str() : nullptr;
}

flashspec_status flashspec_batch_engine_get_metrics(const flashspec_batch_engine* engine,
                                                    flashspec_engine_metrics* out) {
  if (!engine) return null_engine();
  return guarded(engine->ctx, [&] {
    require(out != nullptr, FLASHSPEC_ERR_NULL_POINTER, "out", "is NULL");
    check_struct_size<flashspec_engine_metrics>(out->struct_size, "out");
    store_engine_metrics(engine->engine->metrics(), out);
  });
}

flashspec_status flashspec_batch_engine_get_sequence_metrics(const flashspec_batch_engine* engine,
                                                             uint64_t sequence_id, flashspec_engine_metrics* out) {
  if (!engine) return null_engine();
  return guarded(engine->ctx, [&] {
    require(out != nullptr, FLASHSPEC_ERR_NULL_POINTER, "out", "is NULL");
    check_struct_size<flashspec_engine_metrics>(out->struct_size, "out");
    store_engine_metrics(find_sequence(*engine, sequence_id)->metrics, out);
  });
}

flashspec_status flashspec_batch_engine_get_arm_metrics(const flashspec_batch_engine* engine, int32_t arm,
                                                        flashspec_arm_metrics* out) {
  return get_arm_metrics(engine, arm, out);
}

}  // extern "C"
