// The speculative engine against a synthetic target model: T = 0 equals
// plain greedy decoding token for token; T > 0 has the distribution of plain
// sampling (chi-square, with power shown on a sampler that skips the
// residual); metrics are consistent; budgets, stop tokens, cancellation and
// streaming behave; failing callbacks give clear errors and leave the
// engine usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine_support.h"

namespace {

using namespace fstest;

// ---- Host drafters ---------------------------------------------------------

// Proposes pseudo-random tokens, a function of the context only. Records the
// largest max_tokens it was asked for.
struct RandomDrafter {
  int32_t vocab = 0;
  int32_t largest_request = 0;
  int32_t max_allowed_seen = 0;
  enum class Fault { kNone, kReturnError, kThrow, kTooMany, kBadToken, kBadLogits } fault = Fault::kNone;
  int fail_at = -1;
  int calls = 0;
  bool with_logits = false;  // also return uniform draft logits (a LOGITS drafter)
  std::vector<float> logits;

  static int draft(void* user_data, flashspec_draft_call* call) {
    auto* self = static_cast<RandomDrafter*>(user_data);
    const int index = self->calls++;
    self->largest_request = std::max(self->largest_request, call->max_tokens);
    uint64_t h = 1469598103934665603ull;
    for (int32_t i = 0; i < call->context_len; ++i) h = (h ^ uint64_t(call->context[i])) * 1099511628211ull;
    Rng rng(h);
    call->num_tokens = call->max_tokens;
    for (int32_t j = 0; j < call->max_tokens; ++j) call->tokens[j] = rng.below(self->vocab);
    if (self->with_logits) {
      self->logits.assign(size_t(call->num_tokens) * size_t(self->vocab), 0.0f);
      call->logits = flashspec_tensor_make(self->logits.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST,
                                           call->num_tokens, self->vocab);
    }
    if (index == self->fail_at) {
      switch (self->fault) {
        case Fault::kReturnError: return -3;
        case Fault::kThrow: throw std::runtime_error("draft model failed");
        case Fault::kTooMany: call->num_tokens = call->max_tokens + 1; break;
        case Fault::kBadToken: call->tokens[0] = self->vocab + 5; break;
        case Fault::kBadLogits: call->logits.cols -= 1; break;
        case Fault::kNone: break;
      }
    }
    return 0;
  }
};

// A stochastic draft: q = softmax(row / T_d) with rows a function of the
// context and position; the host samples the tokens from q with its own
// generator.
struct LogitsDrafter {
  int32_t vocab = 0;
  float temperature = 1.0f;
  Rng rng{1};
  std::vector<float> logits;

  static int draft(void* user_data, flashspec_draft_call* call) {
    auto* self = static_cast<LogitsDrafter*>(user_data);
    const int32_t n = call->max_tokens;
    self->logits.assign(size_t(n) * size_t(self->vocab), 0.0f);
    for (int32_t j = 0; j < n; ++j) {
      Rng rows(uint64_t(call->context_len) * 131 + uint64_t(call->context[call->context_len - 1]) * 7 + uint64_t(j));
      float* row = self->logits.data() + size_t(j) * size_t(self->vocab);
      std::vector<double> q(static_cast<size_t>(self->vocab));
      double sum = 0.0;
      for (int32_t v = 0; v < self->vocab; ++v) {
        row[v] = float(rows.normal());
        sum += q[size_t(v)] = std::exp(double(row[v]) / self->temperature);
      }
      double u = self->rng.uniform() * sum;
      int32_t token = self->vocab - 1;
      for (int32_t v = 0; v < self->vocab; ++v) {
        if (u < q[size_t(v)]) {
          token = v;
          break;
        }
        u -= q[size_t(v)];
      }
      call->tokens[j] = token;
    }
    call->num_tokens = n;
    call->logits = flashspec_tensor_make(self->logits.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, n, self->vocab);
    return 0;
  }
};

// For the distribution tests: each draft token is the target's most likely
// next token with probability 0.6, else uniform; drawn from the host's own
// generator (reseeded per run), so acceptances and rejections are both
// common.
struct NoisyDrafter {
  const SyntheticModel* model = nullptr;
  Rng rng{1};
  std::vector<int32_t> sequence;

  static int draft(void* user_data, flashspec_draft_call* call) {
    auto* self = static_cast<NoisyDrafter*>(user_data);
    self->sequence.assign(call->context, call->context + call->context_len);
    const int32_t vocab = self->model->vocab();
    for (int32_t j = 0; j < call->max_tokens; ++j) {
      std::vector<double> p = self->model->probabilities(self->sequence.data(), int32_t(self->sequence.size()), 1.0);
      int32_t token = int32_t(std::max_element(p.begin(), p.end()) - p.begin());
      if (self->rng.uniform() >= 0.6) token = self->rng.below(vocab);
      call->tokens[j] = token;
      self->sequence.push_back(token);
    }
    call->num_tokens = call->max_tokens;
    return 0;
  }
};

// Draft hidden rows of the target itself, one per call (an autoregressive
// draft head that happens to be perfect): the fused greedy draft then
// proposes exactly the target's greedy tokens.
struct HiddenDrafter {
  const SyntheticModel* model = nullptr;
  std::vector<float> row;
  std::vector<int32_t> sequence;
  int calls = 0;

  static int draft(void* user_data, flashspec_draft_call* call) {
    auto* self = static_cast<HiddenDrafter*>(user_data);
    self->calls++;
    self->sequence.assign(call->context, call->context + call->context_len);
    self->sequence.insert(self->sequence.end(), call->drafted, call->drafted + call->num_drafted);
    self->row.assign(size_t(self->model->hidden()), 0.0f);
    self->model->hidden_row(self->sequence.data(), int32_t(self->sequence.size()), self->row.data());
    call->hidden = flashspec_tensor_make(self->row.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, 1,
                                         self->model->hidden());
    call->num_tokens = 1;
    return 0;
  }
};

// ---- Harness ------------------------------------------------------------------

struct Harness {
  ContextPtr ctx;
  SyntheticModel model;
  HeadPtr head;
  TargetHost host;
  RandomDrafter random;
  LogitsDrafter logits;
  HiddenDrafter hidden;
  NoisyDrafter noisy;
  std::vector<DrafterPtr> drafters;
  EnginePtr engine;
  flashspec_draft_len_rule draft_len_rule = FLASHSPEC_DRAFT_LEN_ARM;
  double target_row_cost = 0.02;

  Harness(int32_t vocab, int32_t d, uint64_t seed, float scale) : ctx(make_context(ContextOptions().cpu_threads(1).max_rows(64).max_requests(4))), model(vocab, d, seed, scale) {
    head = model.make_head(ctx.get());
    host.model = &model;
    random.vocab = vocab;
    logits.vocab = vocab;
    hidden.model = &model;
    noisy.model = &model;
  }

  flashspec_drafter* add_ngram(int32_t min_n = 1, int32_t max_n = 4) {
    flashspec_ngram_params p;
    flashspec_ngram_params_init(&p);
    p.min_n = min_n;
    p.max_n = max_n;
    flashspec_drafter* d = nullptr;
    EXPECT_EQ(flashspec_drafter_create_ngram(ctx.get(), &p, &d), FLASHSPEC_OK) << flashspec_context_last_error(ctx.get());
    drafters.emplace_back(d);
    return d;
  }

  flashspec_drafter* add_suffix(int32_t cache_max_tokens = 16384) {
    flashspec_suffix_params p;
    flashspec_suffix_params_init(&p);
    p.cache_max_tokens = cache_max_tokens;
    flashspec_drafter* d = nullptr;
    EXPECT_EQ(flashspec_drafter_create_suffix(ctx.get(), &p, &d), FLASHSPEC_OK) << flashspec_context_last_error(ctx.get());
    drafters.emplace_back(d);
    return d;
  }

  flashspec_drafter* add_callback(flashspec_draft_kind kind, flashspec_draft_fn fn, void* user_data) {
    flashspec_callback_drafter_params p;
    flashspec_callback_drafter_params_init(&p);
    p.kind = kind;
    p.draft = fn;
    p.user_data = user_data;
    p.draft_temperature = 1.0f;
    p.head = head.get();
    flashspec_drafter* d = nullptr;
    EXPECT_EQ(flashspec_drafter_create_callback(ctx.get(), &p, &d), FLASHSPEC_OK) << flashspec_context_last_error(ctx.get());
    drafters.emplace_back(d);
    return d;
  }

  // Drafters in the order added; arms over them.
  void build(const std::vector<flashspec_arm>& arms, flashspec_bandit_policy policy = FLASHSPEC_BANDIT_UCB1,
             bool with_rollback = true, int32_t max_context = 0, int32_t fixed_arm = 0) {
    std::vector<flashspec_drafter*> list;
    for (auto& d : drafters) list.push_back(d.get());
    flashspec_engine_params p;
    flashspec_engine_params_init(&p);
    p.target_forward = TargetHost::forward;
    p.target_rollback = with_rollback ? TargetHost::rollback : nullptr;
    p.target_user_data = &host;
    p.drafters = list.data();
    p.num_drafters = int32_t(list.size());
    p.arms = arms.data();
    p.num_arms = int32_t(arms.size());
    p.policy = policy;
    p.fixed_arm = fixed_arm;
    p.bandit_seed = 5;
    p.max_context = max_context;
    p.draft_len_rule = draft_len_rule;
    p.target_row_cost = target_row_cost;
    host.rollback_enabled = with_rollback;
    flashspec_engine* e = nullptr;
    ASSERT_EQ(flashspec_engine_create(ctx.get(), head.get(), &p, &e), FLASHSPEC_OK) << flashspec_context_last_error(ctx.get());
    engine.reset(e);
  }

  flashspec_status generate(const std::vector<int32_t>& prompt, flashspec_generate_params params,
                            std::vector<int32_t>& out, flashspec_generate_result& result) {
    out.assign(size_t(params.max_tokens), -1);
    flashspec_generate_result_init(&result);
    flashspec_status s = flashspec_engine_generate(engine.get(), prompt.data(), int32_t(prompt.size()), &params,
                                                   out.data(), int32_t(out.size()), &result);
    out.resize(size_t(std::max(0, result.num_tokens)));
    return s;
  }

  std::string error() const { return flashspec_context_last_error(ctx.get()); }
};

flashspec_generate_params greedy_params(int32_t max_tokens) {
  flashspec_generate_params p;
  flashspec_generate_params_init(&p);
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  return p;
}

const std::vector<int32_t> kPrompt = {3, 17, 5, 3, 17, 9, 22, 3, 17, 5};

void expect_consistent_metrics(flashspec_engine* engine) {
  flashspec_engine_metrics m;
  flashspec_engine_metrics_init(&m);
  ASSERT_EQ(flashspec_engine_get_metrics(engine, &m), FLASHSPEC_OK);
  EXPECT_LE(m.accepted_tokens, m.draft_tokens);
  EXPECT_LE(m.drafts, m.steps);
  EXPECT_LE(m.emitted_tokens, m.accepted_tokens + m.steps);
  EXPECT_GE(m.step_latency_p99_us, m.step_latency_p50_us);
  std::vector<uint64_t> drafted(static_cast<size_t>(m.num_positions)), accepted(size_t(m.num_positions));
  int32_t positions = -1;
  ASSERT_EQ(flashspec_engine_get_position_metrics(engine, m.num_positions, drafted.data(), accepted.data(), &positions),
            FLASHSPEC_OK);
  EXPECT_EQ(positions, m.num_positions);
  uint64_t drafted_sum = 0, accepted_sum = 0;
  for (int32_t j = 0; j < positions; ++j) {
    EXPECT_LE(accepted[size_t(j)], drafted[size_t(j)]) << "position " << j;
    if (j > 0) {
      EXPECT_LE(drafted[size_t(j)], drafted[size_t(j - 1)]) << "position " << j;
      EXPECT_LE(accepted[size_t(j)], accepted[size_t(j - 1)]) << "position " << j;
    }
    drafted_sum += drafted[size_t(j)];
    accepted_sum += accepted[size_t(j)];
  }
  EXPECT_EQ(drafted_sum, m.draft_tokens);
  EXPECT_EQ(accepted_sum, m.accepted_tokens);
  uint64_t pulls = 0, arm_drafted = 0;
  for (int32_t a = 0; a < m.num_arms; ++a) {
    flashspec_arm_metrics arm;
    flashspec_arm_metrics_init(&arm);
    ASSERT_EQ(flashspec_engine_get_arm_metrics(engine, a, &arm), FLASHSPEC_OK);
    EXPECT_LE(arm.accepted_tokens, arm.draft_tokens);
    EXPECT_LE(arm.draft_tokens, arm.pulls * uint64_t(arm.draft_len));
    pulls += arm.pulls;
    arm_drafted += arm.draft_tokens;
  }
  EXPECT_EQ(pulls, m.steps);
  EXPECT_EQ(arm_drafted, m.draft_tokens);
}

// ---- T = 0: exactly greedy decoding ---------------------------------------------

TEST(EngineGreedy, EqualsPlainGreedyDecodingWithEveryDrafterAndPolicy) {
  for (flashspec_bandit_policy policy : {FLASHSPEC_BANDIT_UCB1, FLASHSPEC_BANDIT_THOMPSON}) {
    for (bool with_rollback : {true, false}) {
      Harness h(48, 16, 1, 1.0f);
      h.add_ngram(1, 4);
      h.add_callback(FLASHSPEC_DRAFT_TOKENS, RandomDrafter::draft, &h.random);
      h.add_callback(FLASHSPEC_DRAFT_LOGITS, LogitsDrafter::draft, &h.logits);
      h.build({{0, 4}, {0, 2}, {1, 3}, {2, 2}, {-1, 0}}, policy, with_rollback);
      const int32_t count = 160;
      const std::vector<int32_t> expected = greedy_reference(h.ctx.get(), h.head.get(), h.model, kPrompt, count);
      std::vector<int32_t> out;
      flashspec_generate_result result;
      ASSERT_EQ(h.generate(kPrompt, greedy_params(count), out, result), FLASHSPEC_OK) << h.error();
      EXPECT_EQ(out, expected) << "policy " << policy << " rollback " << with_rollback;
      EXPECT_EQ(result.finish_reason, FLASHSPEC_FINISH_LENGTH);
      EXPECT_TRUE(h.host.protocol_error.empty()) << h.host.protocol_error;
      // The target's cache holds the sequence but its last token.
      std::vector<int32_t> sequence = kPrompt;
      sequence.insert(sequence.end(), out.begin(), out.end());
      ASSERT_LE(h.host.cache.size() + 1, sequence.size());
      EXPECT_TRUE(std::equal(h.host.cache.begin(), h.host.cache.begin() + (sequence.size() - 1), sequence.begin()));
      EXPECT_EQ(h.random.largest_request <= 3, true);
      expect_consistent_metrics(h.engine.get());
      flashspec_engine_metrics m;
      flashspec_engine_metrics_init(&m);
      ASSERT_EQ(flashspec_engine_get_metrics(h.engine.get(), &m), FLASHSPEC_OK);
      EXPECT_EQ(m.emitted_tokens, uint64_t(count));
      EXPECT_EQ(m.steps, uint64_t(result.steps));
    }
  }
}

TEST(EngineGreedy, NgramDraftingOnARepetitiveTextSavesSteps) {
  Harness h(48, 16, 1, 1.0f);
  h.add_ngram(1, 4);
  h.build({{0, 4}}, FLASHSPEC_BANDIT_FIXED);
  const int32_t count = 200;
  std::vector<int32_t> out;
  flashspec_generate_result result;
  ASSERT_EQ(h.generate(kPrompt, greedy_params(count), out, result), FLASHSPEC_OK) << h.error();
  EXPECT_EQ(out, greedy_reference(h.ctx.get(), h.head.get(), h.model, kPrompt, count));
  flashspec_engine_metrics m;
  flashspec_engine_metrics_init(&m);
  ASSERT_EQ(flashspec_engine_get_metrics(h.engine.get(), &m), FLASHSPEC_OK);
  EXPECT_GT(m.tokens_per_step, 1.5) << "acceptance " << m.acceptance_rate;
  EXPECT_LT(result.steps, count);
  expect_consistent_metrics(h.engine.get());
}

TEST(EngineGreedy, SuffixDrafterEqualsGreedyDecodingAndLearnsAcrossGenerations) {
  for (flashspec_draft_len_rule rule : {FLASHSPEC_DRAFT_LEN_ARM, FLASHSPEC_DRAFT_LEN_ADAPTIVE}) {
    Harness h(48, 16, 1, 1.0f);
    h.draft_len_rule = rule;
    h.add_suffix();
    h.build({{0, 6}}, FLASHSPEC_BANDIT_FIXED);
    const int32_t count = 200;
    const std::vector<int32_t> expected = greedy_reference(h.ctx.get(), h.head.get(), h.model, kPrompt, count);
    std::vector<int32_t> out;
    flashspec_generate_result first;
    ASSERT_EQ(h.generate(kPrompt, greedy_params(count), out, first), FLASHSPEC_OK) << h.error();
    EXPECT_EQ(out, expected) << "rule " << rule;
    EXPECT_TRUE(h.host.protocol_error.empty()) << h.host.protocol_error;
    expect_consistent_metrics(h.engine.get());
    flashspec_engine_metrics m;
    flashspec_engine_metrics_init(&m);
    ASSERT_EQ(flashspec_engine_get_metrics(h.engine.get(), &m), FLASHSPEC_OK);
    EXPECT_GT(m.tokens_per_step, 1.5) << "rule " << rule << ", acceptance " << m.acceptance_rate;
    // The second generation of the same prompt finds the whole first output
    // in the drafter's cache: still the greedy text, in fewer steps.
    flashspec_generate_result second;
    ASSERT_EQ(h.generate(kPrompt, greedy_params(count), out, second), FLASHSPEC_OK) << h.error();
    EXPECT_EQ(out, expected) << "rule " << rule;
    EXPECT_LT(second.steps, first.steps) << "rule " << rule;
  }
}

TEST(EngineGreedy, AdaptiveDraftLengthEqualsGreedyDecodingWithEveryDrafter) {
  Harness h(48, 16, 1, 1.0f);
  h.draft_len_rule = FLASHSPEC_DRAFT_LEN_ADAPTIVE;
  h.add_ngram(1, 4);
  h.add_suffix();
  h.add_callback(FLASHSPEC_DRAFT_TOKENS, RandomDrafter::draft, &h.random);
  h.add_callback(FLASHSPEC_DRAFT_LOGITS, LogitsDrafter::draft, &h.logits);
  h.build({{0, 8}, {1, 8}, {2, 4}, {3, 3}, {-1, 0}}, FLASHSPEC_BANDIT_UCB1);
  const int32_t count = 160;
  std::vector<int32_t> out;
  flashspec_generate_result result;
  ASSERT_EQ(h.generate(kPrompt, greedy_params(count), out, result), FLASHSPEC_OK) << h.error();
  EXPECT_EQ(out, greedy_reference(h.ctx.get(), h.head.get(), h.model, kPrompt, count));
  EXPECT_TRUE(h.host.protocol_error.empty()) << h.host.protocol_error;
  expect_consistent_metrics(h.engine.get());
}

// A drafter that is never right: the adaptive rule soon stops asking it
// (k = 0), where the arm's k would draft 4 tokens every step; a drafter that
// is always right gets the arm's whole k.
TEST(EngineLoop, AdaptiveDraftLengthFollowsTheAcceptance) {
  const int32_t count = 120;
  uint64_t drafted[2] = {0, 0};
  for (flashspec_draft_len_rule rule : {FLASHSPEC_DRAFT_LEN_ARM, FLASHSPEC_DRAFT_LEN_ADAPTIVE}) {
    Harness h(48, 16, 1, 1.0f);
    h.draft_len_rule = rule;
    h.target_row_cost = 0.1;
    h.add_callback(FLASHSPEC_DRAFT_TOKENS, RandomDrafter::draft, &h.random);
    h.build({{0, 4}}, FLASHSPEC_BANDIT_FIXED);
    std::vector<int32_t> out;
    flashspec_generate_result result;
    ASSERT_EQ(h.generate(kPrompt, greedy_params(count), out, result), FLASHSPEC_OK) << h.error();
    EXPECT_EQ(out, greedy_reference(h.ctx.get(), h.head.get(), h.model, kPrompt, count));
    flashspec_engine_metrics m;
    flashspec_engine_metrics_init(&m);
    ASSERT_EQ(flashspec_engine_get_metrics(h.engine.get(), &m), FLASHSPEC_OK);
    drafted[rule] = m.draft_tokens;
  }
  EXPECT_GT(drafted[FLASHSPEC_DRAFT_LEN_ARM], 300u);
  EXPECT_LT(drafted[FLASHSPEC_DRAFT_LEN_ADAPTIVE], 40u);

  Harness h(48, 16, 1, 1.0f);
  h.draft_len_rule = FLASHSPEC_DRAFT_LEN_ADAPTIVE;
  h.target_row_cost = 0.1;
  h.add_callback(FLASHSPEC_DRAFT_HIDDEN, HiddenDrafter::draft, &h.hidden);
  h.build({{0, 6}}, FLASHSPEC_BANDIT_FIXED);
  std::vector<int32_t> out;
  flashspec_generate_result result;
  ASSERT_EQ(h.generate(kPrompt, greedy_params(count), out, result), FLASHSPEC_OK) << h.error();
  std::vector<uint64_t> position_drafted(6), position_accepted(6);
  int32_t positions = 0;
  ASSERT_EQ(flashspec_engine_get_position_metrics(h.engine.get(), 6, position_drafted.data(), position_accepted.data(),
                                                  &positions),
            FLASHSPEC_OK);
  ASSERT_EQ(positions, 6);
  // Nearly every step drafts all six (the first few learn that they may).
  EXPECT_GE(position_drafted[5] + 3, uint64_t(result.steps));
}

// The tree proposal of a drafter whose engine is generating is refused.
TEST(EngineLoop, SuffixTreeProposalDuringGenerationIsRefused) {
  Harness h(48, 16, 1, 1.0f);
  flashspec_drafter* suffix = h.add_suffix();
  h.build({{0, 4}}, FLASHSPEC_BANDIT_FIXED);
  struct Probe {
    flashspec_drafter* drafter;
    flashspec_status status = FLASHSPEC_OK;
    static int on_token(void* user_data, int32_t token) {
      auto* self = static_cast<Probe*>(user_data);
      int32_t tokens[4], parents[4], count = 0;
      self->status = flashspec_suffix_drafter_propose_tree(self->drafter, &token, 1, 4, tokens, parents, &count);
      return 0;
    }
  } probe{suffix};
  flashspec_generate_params p = greedy_params(3);
  p.on_token = Probe::on_token;
  p.on_token_user_data = &probe;
  std::vector<int32_t> out;
  flashspec_generate_result result;
  ASSERT_EQ(h.generate(kPrompt, p, out, result), FLASHSPEC_OK) << h.error();
  EXPECT_EQ(probe.status, FLASHSPEC_ERR_INVALID_ARGUMENT);
  // Idle, the same call works.
  int32_t tokens[4], parents[4], count = -1;
  EXPECT_EQ(flashspec_suffix_drafter_propose_tree(suffix, kPrompt.data(), int32_t(kPrompt.size()), 4, tokens, parents,
                                                  &count),
            FLASHSPEC_OK);
  EXPECT_GE(count, 0);
}

TEST(EngineGreedy, HiddenRowDrafterOfThePerfectHeadIsAlwaysAccepted) {
  Harness h(40, 12, 3, 1.0f);
  h.add_callback(FLASHSPEC_DRAFT_HIDDEN, HiddenDrafter::draft, &h.hidden);
  h.build({{0, 3}}, FLASHSPEC_BANDIT_FIXED);
  const int32_t count = 41;
  std::vector<int32_t> out;
  flashspec_generate_result result;
  ASSERT_EQ(h.generate(kPrompt, greedy_params(count), out, result), FLASHSPEC_OK) << h.error();
  EXPECT_EQ(out, greedy_reference(h.ctx.get(), h.head.get(), h.model, kPrompt, count));
  flashspec_engine_metrics m;
  flashspec_engine_metrics_init(&m);
  ASSERT_EQ(flashspec_engine_get_metrics(h.engine.get(), &m), FLASHSPEC_OK);
  EXPECT_EQ(m.accepted_tokens, m.draft_tokens);
  EXPECT_EQ(m.steps, 11u);  // 10 steps of 3 drafts + 1 emit 40 tokens, then one more
  EXPECT_DOUBLE_EQ(m.acceptance_rate, 1.0);
}

// ---- T > 0: the distribution of plain sampling ---------------------------------------

constexpr int32_t kVocab = 5;
constexpr int32_t kLength = 3;
constexpr float kTemperature = 0.9f;
const std::vector<int32_t> kShortPrompt = {1, 3};

int32_t cell(const std::vector<int32_t>& tokens) {
  int32_t c = 0;
  for (int32_t t : tokens) c = c * kVocab + t;
  return c;
}

std::vector<double> exact_joint(const SyntheticModel& model) {
  std::vector<double> joint(size_t(std::pow(kVocab, kLength)), 0.0);
  for (size_t c = 0; c < joint.size(); ++c) {
    std::vector<int32_t> seq = kShortPrompt;
    double p = 1.0;
    size_t rest = c;
    std::vector<int32_t> tokens(kLength);
    for (int32_t i = kLength - 1; i >= 0; --i) {
      tokens[size_t(i)] = int32_t(rest % kVocab);
      rest /= kVocab;
    }
    for (int32_t t : tokens) {
      p *= model.probabilities(seq.data(), int32_t(seq.size()), kTemperature)[size_t(t)];
      seq.push_back(t);
    }
    joint[c] = p;
  }
  return joint;
}

// A deliberately wrong speculative sampler: at a rejection it emits a fresh
// sample from p instead of the residual. Drafts, hidden rows and verify are
// the real ones.
std::vector<int32_t> wrong_sampler_run(Harness& h, uint64_t seed) {
  std::vector<int32_t> seq = kShortPrompt, out;
  const int32_t d = h.model.hidden();
  for (uint64_t step = 0; int32_t(out.size()) < kLength; ++step) {
    const int32_t k = std::min(2, kLength - int32_t(out.size()) - 1);
    std::vector<int32_t> drafts(size_t(std::max(k, 1)));
    flashspec_draft_call call{};
    call.context = seq.data();
    call.context_len = int32_t(seq.size());
    call.max_tokens = k;
    call.tokens = drafts.data();
    if (k > 0) NoisyDrafter::draft(&h.noisy, &call);
    std::vector<int32_t> ext = seq;
    ext.insert(ext.end(), drafts.begin(), drafts.begin() + k);
    std::vector<float> rows(size_t(k + 1) * size_t(d));
    for (int32_t r = 0; r <= k; ++r) h.model.hidden_row(ext.data(), int32_t(seq.size()) + r, rows.data() + size_t(r) * size_t(d));
    flashspec_tensor hidden = flashspec_tensor_make(rows.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, k + 1, d);
    const int32_t offsets[2] = {0, k};
    const float temperature = kTemperature;
    flashspec_verify_batch batch;
    flashspec_verify_batch_init(&batch);
    batch.num_requests = 1;
    batch.draft_offsets = offsets;
    batch.draft_tokens = drafts.data();
    batch.target_hidden = &hidden;
    batch.temperatures = &temperature;
    batch.seeds = &seed;
    batch.steps = &step;
    int32_t accepted = -1;
    std::vector<int32_t> emitted(size_t(k + 1));
    flashspec_verify_result result;
    flashspec_verify_result_init(&result);
    result.accepted_counts = &accepted;
    result.emitted_tokens = emitted.data();
    EXPECT_EQ(flashspec_verify_and_finalize(h.ctx.get(), h.head.get(), &batch, &result), FLASHSPEC_OK) << h.error();
    if (accepted < k) {
      flashspec_tensor row = flashspec_tensor_make(rows.data() + size_t(accepted) * size_t(d), FLASHSPEC_DTYPE_F32,
                                                   FLASHSPEC_MEMORY_HOST, 1, d);
      flashspec_draft_params dp;
      flashspec_draft_params_init(&dp);
      dp.temperature = kTemperature;
      dp.seeds = &seed;
      dp.steps = &step;
      EXPECT_EQ(flashspec_draft(h.ctx.get(), h.head.get(), &row, &dp, &emitted[size_t(accepted)], nullptr), FLASHSPEC_OK);
    }
    for (int32_t j = 0; j <= accepted && int32_t(out.size()) < kLength; ++j) {
      out.push_back(emitted[size_t(j)]);
      seq.push_back(emitted[size_t(j)]);
    }
  }
  return out;
}

constexpr int32_t kRuns = 12000;

double engine_p_value(flashspec_draft_kind kind, bool ngram) {
  Harness h(kVocab, 6, 11, 0.45f);
  if (ngram)
    h.add_ngram(1, 2);
  else if (kind == FLASHSPEC_DRAFT_LOGITS)
    h.add_callback(kind, LogitsDrafter::draft, &h.logits);
  else
    h.add_callback(kind, NoisyDrafter::draft, &h.noisy);
  h.build({{0, 2}}, FLASHSPEC_BANDIT_FIXED);
  flashspec_generate_params p;
  flashspec_generate_params_init(&p);
  p.temperature = kTemperature;
  p.max_tokens = kLength;
  std::vector<double> counts(size_t(std::pow(kVocab, kLength)), 0.0);
  std::vector<int32_t> out;
  flashspec_generate_result result;
  for (int32_t run = 0; run < kRuns; ++run) {
    p.seed = 1000 + uint64_t(run);
    h.logits.rng = Rng(77 + uint64_t(run));
    h.noisy.rng = Rng(77 + uint64_t(run));
    EXPECT_EQ(h.generate(kShortPrompt, p, out, result), FLASHSPEC_OK) << h.error();
    if (out.size() != size_t(kLength)) return 0.0;
    counts[size_t(cell(out))] += 1.0;
  }
  flashspec_engine_metrics m;
  flashspec_engine_metrics_init(&m);
  EXPECT_EQ(flashspec_engine_get_metrics(h.engine.get(), &m), FLASHSPEC_OK);
  if (!ngram) {
    // Both acceptances and rejections must be common for the test to mean much.
    EXPECT_GT(m.acceptance_rate, 0.1);
    EXPECT_LT(m.acceptance_rate, 0.9);
  }
  const double p_value = chi_square_p_value(counts, exact_joint(h.model));
  std::printf("drafter %s: acceptance %.3f, tokens/step %.3f, chi-square p = %.4g\n",
              ngram ? "n-gram" : kind == FLASHSPEC_DRAFT_LOGITS ? "logits" : "point-mass", m.acceptance_rate,
              m.tokens_per_step, p_value);
  return p_value;
}

TEST(EngineSampling, PointMassDraftsKeepTheTargetDistribution) {
  EXPECT_GT(engine_p_value(FLASHSPEC_DRAFT_TOKENS, false), 1e-3);
}

TEST(EngineSampling, StochasticDraftsKeepTheTargetDistribution) {
  EXPECT_GT(engine_p_value(FLASHSPEC_DRAFT_LOGITS, false), 1e-3);
}

TEST(EngineSampling, NgramDraftsKeepTheTargetDistribution) {
  EXPECT_GT(engine_p_value(FLASHSPEC_DRAFT_TOKENS, true), 1e-3);
}

TEST(EngineSampling, TheTestRejectsASamplerThatSkipsTheResidual) {
  Harness h(kVocab, 6, 11, 0.45f);
  std::vector<double> counts(size_t(std::pow(kVocab, kLength)), 0.0);
  for (int32_t run = 0; run < kRuns; ++run) {
    h.noisy.rng = Rng(77 + uint64_t(run));
    counts[size_t(cell(wrong_sampler_run(h, 1000 + uint64_t(run))))] += 1.0;
  }
  const double p_value = chi_square_p_value(counts, exact_joint(h.model));
  std::printf("sampler without the residual: chi-square p = %.4g\n", p_value);
  EXPECT_LT(p_value, 1e-6);
}

TEST(EngineSampling, SameSeedSameTokensOtherSeedOtherTokens) {
  // Two engines alike (Thompson selection with the same bandit seed): the
  // same drafts, so the same seed gives the same tokens.
  auto run = [](uint64_t seed) {
    Harness h(48, 16, 1, 0.3f);
    h.add_ngram();
    h.add_callback(FLASHSPEC_DRAFT_TOKENS, RandomDrafter::draft, &h.random);
    h.build({{0, 3}, {1, 2}}, FLASHSPEC_BANDIT_THOMPSON);
    flashspec_generate_params p;
    flashspec_generate_params_init(&p);
    p.max_tokens = 40;
    p.seed = seed;
    std::vector<int32_t> out;
    flashspec_generate_result result;
    EXPECT_EQ(h.generate(kPrompt, p, out, result), FLASHSPEC_OK) << h.error();
    return out;
  };
  const std::vector<int32_t> a = run(9);
  EXPECT_EQ(a.size(), 40u);
  EXPECT_EQ(a, run(9));
  EXPECT_NE(a, run(10));
}

// ---- Budgets, stops, streaming, cancellation --------------------------------------------

struct Stream {
  std::vector<int32_t> tokens;
  int stop_after = -1;      // return non-zero after this many tokens
  int cancel_after = -1;    // flashspec_engine_cancel after this many tokens
  int reenter_after = -1;   // call generate on the same engine
  int throw_after = -1;
  flashspec_engine* engine = nullptr;
  flashspec_status reenter_status = FLASHSPEC_OK;

  static int on_token(void* user_data, int32_t token) {
    auto* self = static_cast<Stream*>(user_data);
    self->tokens.push_back(token);
    const int n = int(self->tokens.size());
    if (n == self->cancel_after) flashspec_engine_cancel(self->engine);
    if (n == self->throw_after) throw std::runtime_error("stream consumer failed");
    if (n == self->reenter_after) {
      const int32_t prompt[1] = {1};
      flashspec_generate_result r;
      flashspec_generate_result_init(&r);
      self->reenter_status = flashspec_engine_generate(self->engine, prompt, 1, nullptr, nullptr, 0, &r);
    }
    return n == self->stop_after ? 1 : 0;
  }
};

TEST(EngineLoop, DraftsNeverExceedTheRemainingBudget) {
  for (int32_t max_tokens : {1, 2, 5, 13}) {
    Harness h(48, 16, 1, 1.0f);
    h.add_callback(FLASHSPEC_DRAFT_HIDDEN, HiddenDrafter::draft, &h.hidden);
    h.build({{0, 6}}, FLASHSPEC_BANDIT_FIXED);
    std::vector<int32_t> out;
    flashspec_generate_result result;
    ASSERT_EQ(h.generate(kPrompt, greedy_params(max_tokens), out, result), FLASHSPEC_OK) << h.error();
    EXPECT_EQ(int32_t(out.size()), max_tokens);
    EXPECT_EQ(result.finish_reason, FLASHSPEC_FINISH_LENGTH);
    // Every draft is accepted here, so each step emits k + 1 tokens: a draft
    // longer than the budget would overshoot or be wasted.
    flashspec_engine_metrics m;
    flashspec_engine_metrics_init(&m);
    ASSERT_EQ(flashspec_engine_get_metrics(h.engine.get(), &m), FLASHSPEC_OK);
    EXPECT_EQ(m.accepted_tokens + m.steps, uint64_t(max_tokens)) << "max_tokens " << max_tokens;
    EXPECT_EQ(int32_t(h.host.cache.size()), int32_t(kPrompt.size()) + max_tokens - 1);
  }
  Harness h(48, 16, 1, 1.0f);
  h.add_callback(FLASHSPEC_DRAFT_TOKENS, RandomDrafter::draft, &h.random);
  h.build({{0, 8}}, FLASHSPEC_BANDIT_FIXED);
  std::vector<int32_t> out;
  flashspec_generate_result result;
  ASSERT_EQ(h.generate(kPrompt, greedy_params(3), out, result), FLASHSPEC_OK) << h.error();
  EXPECT_LE(h.random.largest_request, 2);
}

TEST(EngineLoop, MaxContextBoundsTheCache) {
  Harness h(48, 16, 1, 1.0f);
  h.add_callback(FLASHSPEC_DRAFT_HIDDEN, HiddenDrafter::draft, &h.hidden);
  h.build({{0, 4}}, FLASHSPEC_BANDIT_FIXED, true, int32_t(kPrompt.size()) + 6);
  std::vector<int32_t> out;
  flashspec_generate_result result;
  ASSERT_EQ(h.generate(kPrompt, greedy_params(50), out, result), FLASHSPEC_OK) << h.error();
  EXPECT_EQ(result.finish_reason, FLASHSPEC_FINISH_CONTEXT_FULL);
  EXPECT_EQ(int32_t(out.size()), 7);  // the cache holds prompt + 6; the 7th token is never fed
  EXPECT_LE(int32_t(h.host.cache.size()), int32_t(kPrompt.size()) + 6);
  EXPECT_EQ(out, greedy_reference(h.ctx.get(), h.head.get(), h.model, kPrompt, 7));
}

TEST(EngineLoop, StopTokenEndsTheGenerationAndIsIncluded) {
  Harness h(48, 16, 1, 1.0f);
  h.add_ngram();
  h.build({{0, 4}}, FLASHSPEC_BANDIT_FIXED);
  const std::vector<int32_t> expected = greedy_reference(h.ctx.get(), h.head.get(), h.model, kPrompt, 60);
  const int32_t stop = expected[20];
  const size_t first = size_t(std::find(expected.begin(), expected.end(), stop) - expected.begin());
  flashspec_generate_params p = greedy_params(60);
  const int32_t stops[2] = {47, stop};
  p.stop_tokens = stops;
  p.num_stop_tokens = (stop == 47) ? 1 : 2;
  Stream stream;
  p.on_token = Stream::on_token;
  p.on_token_user_data = &stream;
  std::vector<int32_t> out;
  flashspec_generate_result result;
  ASSERT_EQ(h.generate(kPrompt, p, out, result), FLASHSPEC_OK) << h.error();
  const size_t first_47 = size_t(std::find(expected.begin(), expected.end(), 47) - expected.begin());
  const size_t end = std::min(first, first_47) + 1;
  EXPECT_EQ(out, std::vector<int32_t>(expected.begin(), expected.begin() + end));
  EXPECT_EQ(stream.tokens, out);
  EXPECT_EQ(result.finish_reason, FLASHSPEC_FINISH_STOP_TOKEN);
}

TEST(EngineLoop, StreamingStopCancelAndReentry) {
  Harness h(48, 16, 1, 1.0f);
  h.add_ngram();
  h.build({{0, 4}}, FLASHSPEC_BANDIT_FIXED);
  const std::vector<int32_t> expected = greedy_reference(h.ctx.get(), h.head.get(), h.model, kPrompt, 50);
  std::vector<int32_t> out;
  flashspec_generate_result result;

  Stream stop;
  stop.stop_after = 9;
  flashspec_generate_params p = greedy_params(50);
  p.on_token = Stream::on_token;
  p.on_token_user_data = &stop;
  ASSERT_EQ(h.generate(kPrompt, p, out, result), FLASHSPEC_OK) << h.error();
  EXPECT_EQ(result.finish_reason, FLASHSPEC_FINISH_HOST_STOP);
  EXPECT_EQ(out, std::vector<int32_t>(expected.begin(), expected.begin() + 9));
  EXPECT_EQ(stop.tokens, out);

  Stream cancel;
  cancel.cancel_after = 12;
  cancel.engine = h.engine.get();
  p.on_token_user_data = &cancel;
  ASSERT_EQ(h.generate(kPrompt, p, out, result), FLASHSPEC_ERR_CANCELLED);
  EXPECT_EQ(result.finish_reason, FLASHSPEC_FINISH_CANCELLED);
  EXPECT_GE(out.size(), 12u);  // the step in flight completes
  EXPECT_LT(out.size(), 12u + 5u);
  EXPECT_EQ(out, std::vector<int32_t>(expected.begin(), expected.begin() + long(out.size())));
  EXPECT_NE(h.error().find("cancelled"), std::string::npos);

  Stream reenter;
  reenter.reenter_after = 3;
  reenter.engine = h.engine.get();
  p.on_token_user_data = &reenter;
  ASSERT_EQ(h.generate(kPrompt, p, out, result), FLASHSPEC_OK) << h.error();
  EXPECT_EQ(reenter.reenter_status, FLASHSPEC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(out, expected);

  Stream thrower;
  thrower.throw_after = 5;
  p.on_token_user_data = &thrower;
  ASSERT_EQ(h.generate(kPrompt, p, out, result), FLASHSPEC_ERR_CALLBACK);
  EXPECT_NE(h.error().find("token callback"), std::string::npos) << h.error();
  EXPECT_EQ(out.size(), 5u);

  // Streaming only.
  Stream only;
  p.on_token_user_data = &only;
  flashspec_generate_result_init(&result);
  ASSERT_EQ(flashspec_engine_generate(h.engine.get(), kPrompt.data(), int32_t(kPrompt.size()), &p, nullptr, 0, &result),
            FLASHSPEC_OK);
  EXPECT_EQ(only.tokens, expected);
  expect_consistent_metrics(h.engine.get());
}

// ---- Failing callbacks ----------------------------------------------------------------------

void expect_usable(Harness& h) {
  h.host.fault = TargetHost::Fault::kNone;
  h.host.fail_at = -1;
  h.host.rollback_fail_at = -1;
  h.random.fault = RandomDrafter::Fault::kNone;
  h.random.fail_at = -1;
  h.host.protocol_error.clear();
  std::vector<int32_t> out;
  flashspec_generate_result result;
  ASSERT_EQ(h.generate(kPrompt, greedy_params(30), out, result), FLASHSPEC_OK) << h.error();
  EXPECT_EQ(out, greedy_reference(h.ctx.get(), h.head.get(), h.model, kPrompt, 30));
  EXPECT_TRUE(h.host.protocol_error.empty()) << h.host.protocol_error;
  expect_consistent_metrics(h.engine.get());
}

TEST(EngineCallbacks, TargetFailuresAreReportedAndTheEngineStaysUsable) {
  struct Case {
    TargetHost::Fault fault;
    flashspec_status status;
    const char* message;
  };
  const Case cases[] = {
      {TargetHost::Fault::kReturnError, FLASHSPEC_ERR_CALLBACK, "target forward: reported failure (returned 42)"},
      {TargetHost::Fault::kThrow, FLASHSPEC_ERR_CALLBACK, "target forward: threw"},
      {TargetHost::Fault::kWrongRows, FLASHSPEC_ERR_CALLBACK, "target forward: hidden: has"},
      {TargetHost::Fault::kWrongCols, FLASHSPEC_ERR_CALLBACK, "columns, expected 16"},
      {TargetHost::Fault::kNullData, FLASHSPEC_ERR_CALLBACK, "target forward: hidden: data is NULL"},
      {TargetHost::Fault::kWrongMemory, FLASHSPEC_ERR_CALLBACK, "must be host memory"},
      {TargetHost::Fault::kNaN, FLASHSPEC_ERR_NON_FINITE, "non-finite"},
  };
  for (const Case& c : cases) {
    Harness h(48, 16, 1, 1.0f);
    h.add_ngram();
    h.build({{0, 4}}, FLASHSPEC_BANDIT_UCB1);
    h.host.fault = c.fault;
    h.host.fail_at = 3;
    std::vector<int32_t> out;
    flashspec_generate_result result;
    EXPECT_EQ(h.generate(kPrompt, greedy_params(30), out, result), c.status) << c.message;
    EXPECT_NE(h.error().find(c.message), std::string::npos) << h.error();
    EXPECT_EQ(result.finish_reason, FLASHSPEC_FINISH_NONE);
    EXPECT_EQ(result.steps, 3);
    const std::vector<int32_t> expected = greedy_reference(h.ctx.get(), h.head.get(), h.model, kPrompt, 30);
    EXPECT_EQ(out, std::vector<int32_t>(expected.begin(), expected.begin() + long(out.size())));
    expect_usable(h);
  }
}

TEST(EngineCallbacks, RollbackFailureIsReported) {
  Harness h(48, 16, 1, 1.0f);
  h.add_callback(FLASHSPEC_DRAFT_TOKENS, RandomDrafter::draft, &h.random);
  h.build({{0, 3}}, FLASHSPEC_BANDIT_FIXED);
  h.host.rollback_fail_at = 0;
  std::vector<int32_t> out;
  flashspec_generate_result result;
  EXPECT_EQ(h.generate(kPrompt, greedy_params(30), out, result), FLASHSPEC_ERR_CALLBACK);
  EXPECT_NE(h.error().find("target rollback: reported failure (returned 7)"), std::string::npos) << h.error();
  expect_usable(h);
}

TEST(EngineCallbacks, DrafterFailuresAreReportedAndTheEngineStaysUsable) {
  struct Case {
    RandomDrafter::Fault fault;
    flashspec_draft_kind kind;
    const char* message;
  };
  const Case cases[] = {
      {RandomDrafter::Fault::kReturnError, FLASHSPEC_DRAFT_TOKENS, "draft callback: reported failure (returned -3)"},
      {RandomDrafter::Fault::kThrow, FLASHSPEC_DRAFT_TOKENS, "draft callback: threw"},
      {RandomDrafter::Fault::kTooMany, FLASHSPEC_DRAFT_TOKENS, "draft callback: num_tokens is 4, outside [0, 3]"},
      {RandomDrafter::Fault::kBadToken, FLASHSPEC_DRAFT_TOKENS, "draft callback: token 0 is 53, outside [0, 48)"},
      {RandomDrafter::Fault::kBadLogits, FLASHSPEC_DRAFT_LOGITS, "draft callback: logits: has 47 columns, expected 48"},
  };
  for (const Case& c : cases) {
    Harness h(48, 16, 1, 1.0f);
    h.add_callback(c.kind, RandomDrafter::draft, &h.random);
    h.build({{0, 3}}, FLASHSPEC_BANDIT_FIXED);
    h.random.with_logits = c.kind == FLASHSPEC_DRAFT_LOGITS;
    h.random.fault = c.fault;
    h.random.fail_at = 2;
    std::vector<int32_t> out;
    flashspec_generate_result result;
    EXPECT_EQ(h.generate(kPrompt, greedy_params(30), out, result), FLASHSPEC_ERR_CALLBACK) << c.message;
    EXPECT_NE(h.error().find(c.message), std::string::npos) << h.error();
    EXPECT_EQ(result.steps, 2);
    expect_usable(h);
  }
}

}  // namespace
