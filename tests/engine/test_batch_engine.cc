// The batched engine against the single-sequence engine on a synthetic
// target: every sequence emits exactly what a fresh flashspec_engine_generate
// emits for it (T = 0 and T > 0, different prompts, budgets and draft
// lengths, sequences joining and leaving mid-run, a step retried after a
// failed forward); each sequence's bandit learns alone; one sequence's
// failing callback ends that sequence only; the suffix drafter and the
// adaptive draft length run per sequence; bad input gets specific statuses
// with outputs untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine_support.h"

namespace {

using namespace fstest;

// A TOKENS drafter: proposes pseudo-random tokens, a function of the
// context only (so a fresh copy in a single engine proposes the same).
// Fails from call fail_at on when set.
struct HashDrafter {
  int32_t vocab = 0;
  int calls = 0;
  int fail_at = -1;
  static int draft(void* user_data, flashspec_draft_call* call) {
    auto* self = static_cast<HashDrafter*>(user_data);
    if (self->fail_at >= 0 && self->calls++ >= self->fail_at) return -1;
    uint64_t h = 1469598103934665603ull;
    for (int32_t i = 0; i < call->context_len; ++i) h = (h ^ uint64_t(call->context[i])) * 1099511628211ull;
    Rng rng(h);
    call->num_tokens = call->max_tokens;
    for (int32_t j = 0; j < call->max_tokens; ++j) call->tokens[j] = rng.below(self->vocab);
    return 0;
  }
};

// What a sequence asks for, and what it got.
struct Request {
  uint64_t id;
  std::vector<int32_t> prompt;
  float temperature = 0.0f;
  uint64_t seed = 0;
  uint64_t request_id = 0;
  int32_t max_tokens = 24;
  std::vector<int32_t> stop_tokens;
};

struct Outcome {
  std::vector<int32_t> tokens;
  flashspec_sequence_info info{};
  flashspec_engine_metrics metrics{};
};

const std::vector<flashspec_arm> kArms = {{0, 2}, {0, 5}, {1, 3}, {0, 0}};

struct Fixture : ::testing::Test {
  static constexpr int32_t kVocab = 40, kHidden = 16;
  ContextPtr ctx = make_context(ContextOptions().cpu_threads(1).max_rows(64).max_requests(8));
  SyntheticModel model{kVocab, kHidden, 11, 0.8f};
  HeadPtr head = model.make_head(ctx.get());
  BatchTargetHost host;
  std::vector<DrafterPtr> drafters;
  std::vector<std::unique_ptr<HashDrafter>> hash_drafters;
  std::vector<flashspec_arm> arms = kArms;
  flashspec_bandit_policy policy = FLASHSPEC_BANDIT_UCB1;
  bool with_suffix = false;  // each sequence's first drafter: suffix instead of n-gram
  flashspec_draft_len_rule draft_len_rule = FLASHSPEC_DRAFT_LEN_ARM;
  BatchEnginePtr batch;

  void SetUp() override { host.model = &model; }

  std::string error() const { return flashspec_context_last_error(ctx.get()); }

  // The drafters one sequence brings: an n-gram (or suffix) drafter and a
  // hash drafter.
  std::vector<flashspec_drafter*> make_drafters(int hash_fail_at = -1) {
    flashspec_drafter* ngram = nullptr;
    if (with_suffix) {
      EXPECT_EQ(flashspec_drafter_create_suffix(ctx.get(), nullptr, &ngram), FLASHSPEC_OK) << error();
    } else {
      flashspec_ngram_params np;
      flashspec_ngram_params_init(&np);
      np.max_n = 3;
      EXPECT_EQ(flashspec_drafter_create_ngram(ctx.get(), &np, &ngram), FLASHSPEC_OK) << error();
    }
    drafters.emplace_back(ngram);
    hash_drafters.push_back(std::make_unique<HashDrafter>());
    hash_drafters.back()->vocab = kVocab;
    hash_drafters.back()->fail_at = hash_fail_at;
    flashspec_callback_drafter_params cp;
    flashspec_callback_drafter_params_init(&cp);
    cp.draft = HashDrafter::draft;
    cp.user_data = hash_drafters.back().get();
    flashspec_drafter* hash = nullptr;
    EXPECT_EQ(flashspec_drafter_create_callback(ctx.get(), &cp, &hash), FLASHSPEC_OK) << error();
    drafters.emplace_back(hash);
    return {ngram, hash};
  }

  void build(int32_t max_sequences = 0, bool with_rollback = true) {
    flashspec_batch_engine_params p;
    flashspec_batch_engine_params_init(&p);
    p.target_forward = BatchTargetHost::forward;
    p.target_rollback = with_rollback ? BatchTargetHost::rollback : nullptr;
    p.target_user_data = &host;
    p.num_drafters = 2;
    p.arms = arms.data();
    p.num_arms = int32_t(arms.size());
    p.policy = policy;
    p.bandit_seed = 5;
    p.max_sequences = max_sequences;
    p.draft_len_rule = draft_len_rule;
    flashspec_batch_engine* e = nullptr;
    ASSERT_EQ(flashspec_batch_engine_create(ctx.get(), head.get(), &p, &e), FLASHSPEC_OK) << error();
    batch.reset(e);
  }

  flashspec_sequence_params sequence_params(const Request& r, const std::vector<flashspec_drafter*>& list) {
    flashspec_sequence_params p;
    flashspec_sequence_params_init(&p);
    p.drafters = list.data();
    p.num_drafters = int32_t(list.size());
    p.temperature = r.temperature;
    p.seed = r.seed;
    p.request_id = r.request_id;
    p.max_tokens = r.max_tokens;
    p.stop_tokens = r.stop_tokens.data();
    p.num_stop_tokens = int32_t(r.stop_tokens.size());
    return p;
  }

  void add(const Request& r, int hash_fail_at = -1) { add_with(r, make_drafters(hash_fail_at)); }

  void add_with(const Request& r, const std::vector<flashspec_drafter*>& list) {
    const flashspec_sequence_params p = sequence_params(r, list);
    ASSERT_EQ(flashspec_batch_engine_add_sequence(batch.get(), r.id, r.prompt.data(), int32_t(r.prompt.size()), &p),
              FLASHSPEC_OK)
        << error();
  }

  int32_t step() {
    int32_t active = -1;
    EXPECT_EQ(flashspec_batch_engine_step(batch.get(), &active), FLASHSPEC_OK) << error();
    return active;
  }

  void run_to_end() {
    for (int i = 0; i < 1000 && step() > 0; ++i) {
    }
  }

  Outcome outcome(uint64_t id) {
    Outcome o;
    flashspec_sequence_info_init(&o.info);
    EXPECT_EQ(flashspec_batch_engine_get_sequence(batch.get(), id, nullptr, 0, &o.info), FLASHSPEC_OK) << error();
    o.tokens.assign(size_t(o.info.num_tokens), -1);
    EXPECT_EQ(flashspec_batch_engine_get_sequence(batch.get(), id, o.tokens.data(), int32_t(o.tokens.size()), nullptr),
              FLASHSPEC_OK)
        << error();
    flashspec_engine_metrics_init(&o.metrics);
    EXPECT_EQ(flashspec_batch_engine_get_sequence_metrics(batch.get(), id, &o.metrics), FLASHSPEC_OK) << error();
    return o;
  }

  // The same request through a fresh single engine with the same arms,
  // policy and (fresh) drafters. `warm_up`: generate once before, so the
  // policy starts with what it learned (what a shared bandit would do).
  Outcome single(const Request& r, const Request* warm_up = nullptr) {
    TargetHost target;
    target.model = &model;
    std::vector<flashspec_drafter*> list = make_drafters();
    flashspec_engine_params p;
    flashspec_engine_params_init(&p);
    p.target_forward = TargetHost::forward;
    p.target_rollback = TargetHost::rollback;
    p.target_user_data = &target;
    p.drafters = list.data();
    p.num_drafters = int32_t(list.size());
    p.arms = arms.data();
    p.num_arms = int32_t(arms.size());
    p.policy = policy;
    p.bandit_seed = 5;
    p.draft_len_rule = draft_len_rule;
    flashspec_engine* e = nullptr;
    Outcome o;
    EXPECT_EQ(flashspec_engine_create(ctx.get(), head.get(), &p, &e), FLASHSPEC_OK) << error();
    EnginePtr engine(e);
    auto generate = [&](const Request& q, std::vector<int32_t>& out, flashspec_generate_result& result) {
      flashspec_generate_params g;
      flashspec_generate_params_init(&g);
      g.temperature = q.temperature;
      g.seed = q.seed;
      g.request_id = q.request_id;
      g.max_tokens = q.max_tokens;
      g.stop_tokens = q.stop_tokens.data();
      g.num_stop_tokens = int32_t(q.stop_tokens.size());
      out.assign(size_t(q.max_tokens), -1);
      flashspec_generate_result_init(&result);
      EXPECT_EQ(flashspec_engine_generate(engine.get(), q.prompt.data(), int32_t(q.prompt.size()), &g, out.data(),
                                          int32_t(out.size()), &result),
                FLASHSPEC_OK)
          << error();
      out.resize(size_t(result.num_tokens));
    };
    flashspec_generate_result result;
    if (warm_up) {
      generate(*warm_up, o.tokens, result);
      EXPECT_EQ(flashspec_engine_reset_metrics(engine.get()), FLASHSPEC_OK);
    }
    generate(r, o.tokens, result);
    flashspec_sequence_info_init(&o.info);
    o.info.finish_reason = result.finish_reason;
    o.info.num_tokens = result.num_tokens;
    o.info.steps = result.steps;
    flashspec_engine_metrics_init(&o.metrics);
    EXPECT_EQ(flashspec_engine_get_metrics(engine.get(), &o.metrics), FLASHSPEC_OK);
    EXPECT_TRUE(target.protocol_error.empty()) << target.protocol_error;
    return o;
  }

  void expect_same_as_single(const Request& r) {
    const Outcome got = outcome(r.id);
    const Outcome want = single(r);
    EXPECT_EQ(got.tokens, want.tokens) << "sequence " << r.id;
    EXPECT_EQ(got.info.finish_reason, want.info.finish_reason) << "sequence " << r.id;
    EXPECT_EQ(got.info.steps, want.info.steps) << "sequence " << r.id;
    EXPECT_EQ(got.metrics.draft_tokens, want.metrics.draft_tokens) << "sequence " << r.id;
    EXPECT_EQ(got.metrics.accepted_tokens, want.metrics.accepted_tokens) << "sequence " << r.id;
  }
};

// Prompts of different lengths and texts (some periodic, for the n-gram
// drafter), budgets, and a stop token.
std::vector<Request> requests(float temperature) {
  const std::vector<std::pair<uint64_t, std::vector<int32_t>>> prompts = {
      {7, {3, 17, 5, 3, 17, 9, 22, 3, 17, 5}},
      {8, {1, 2, 3, 1, 2, 3, 1, 2}},
      {100, {30}},
      {9, {4, 8, 15, 16, 23, 4, 8, 15, 16, 23, 4, 8, 15, 16, 23, 4, 8, 15}},
      {3, {11, 12, 13, 14}}};
  const int32_t budgets[5] = {24, 9, 31, 40, 2};
  std::vector<Request> r(prompts.size());
  for (size_t i = 0; i < r.size(); ++i) {
    r[i].id = prompts[i].first;
    r[i].prompt = prompts[i].second;
    r[i].temperature = temperature;
    r[i].seed = 1000 + i;
    r[i].request_id = i;
    r[i].max_tokens = budgets[i];
  }
  r[3].stop_tokens = {5, 6};
  return r;
}

TEST_F(Fixture, GreedyEachSequenceEqualsItsSingleEngineRunAndGreedyDecoding) {
  build();
  const std::vector<Request> rs = requests(0.0f);
  for (const Request& r : rs) add(r);
  run_to_end();
  EXPECT_TRUE(host.protocol_error.empty()) << host.protocol_error;
  EXPECT_EQ(host.batch_sizes.front(), int32_t(rs.size()));
  for (const Request& r : rs) {
    expect_same_as_single(r);
    const Outcome got = outcome(r.id);
    EXPECT_EQ(got.info.active, 0);
    EXPECT_EQ(got.info.status, FLASHSPEC_OK);
    if (r.stop_tokens.empty()) {
      EXPECT_EQ(got.info.finish_reason, FLASHSPEC_FINISH_LENGTH);
      EXPECT_EQ(got.tokens, greedy_reference(ctx.get(), head.get(), model, r.prompt, r.max_tokens));
    }
  }
}

// Per sequence: its suffix drafter, and the adaptive rule's estimates of
// its drafters. At T = 0 each still emits its single-engine run, which is
// greedy decoding.
TEST_F(Fixture, SuffixDrafterAndAdaptiveDraftLengthEqualTheirSingleEngineRun) {
  with_suffix = true;
  draft_len_rule = FLASHSPEC_DRAFT_LEN_ADAPTIVE;
  build();
  const std::vector<Request> rs = requests(0.0f);
  for (const Request& r : rs) add(r);
  run_to_end();
  EXPECT_TRUE(host.protocol_error.empty()) << host.protocol_error;
  uint64_t accepted = 0;
  for (const Request& r : rs) {
    expect_same_as_single(r);
    const Outcome got = outcome(r.id);
    accepted += got.metrics.accepted_tokens;
    if (r.stop_tokens.empty())
      EXPECT_EQ(got.tokens, greedy_reference(ctx.get(), head.get(), model, r.prompt, r.max_tokens));
  }
  EXPECT_GT(accepted, 0u) << "the drafters never helped: the comparison would be vacuous";
}

// A batched sequence's suffix drafter sees its final sequence when it
// finishes: the drafter, moved to a new sequence with the same prompt,
// drafts the cached output, so the same greedy text takes fewer steps. A
// suffix drafter serving a sequence refuses tree proposals until the
// sequence leaves.
TEST_F(Fixture, ASuffixDrafterCachesItsFinishedSequenceForTheNext) {
  with_suffix = true;
  arms = {{0, 8}};
  policy = FLASHSPEC_BANDIT_FIXED;
  build();
  Request first;
  first.id = 1;
  first.prompt = {11, 12, 13, 14};
  first.max_tokens = 60;
  const std::vector<flashspec_drafter*> list = make_drafters();
  add_with(first, list);
  int32_t tokens[4], parents[4], count = -1;
  EXPECT_EQ(flashspec_suffix_drafter_propose_tree(list[0], first.prompt.data(), 4, 4, tokens, parents, &count),
            FLASHSPEC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(count, -1);
  run_to_end();
  const Outcome one = outcome(first.id);
  ASSERT_EQ(one.info.finish_reason, FLASHSPEC_FINISH_LENGTH);
  ASSERT_EQ(flashspec_batch_engine_remove_sequence(batch.get(), first.id), FLASHSPEC_OK) << error();

  Request second = first;
  second.id = 2;
  add_with(second, list);
  run_to_end();
  const Outcome two = outcome(second.id);
  EXPECT_EQ(two.tokens, one.tokens);
  EXPECT_EQ(two.tokens, greedy_reference(ctx.get(), head.get(), model, first.prompt, first.max_tokens));
  EXPECT_LT(two.info.steps, one.info.steps);
  ASSERT_EQ(flashspec_batch_engine_remove_sequence(batch.get(), second.id), FLASHSPEC_OK) << error();
  EXPECT_EQ(flashspec_suffix_drafter_propose_tree(list[0], first.prompt.data(), 4, 4, tokens, parents, &count),
            FLASHSPEC_OK)
      << error();
}

TEST_F(Fixture, BatchParamsRefuseABadDraftLengthRule) {
  flashspec_batch_engine_params p;
  flashspec_batch_engine_params_init(&p);
  EXPECT_EQ(p.draft_len_rule, FLASHSPEC_DRAFT_LEN_ARM);
  EXPECT_EQ(p.draft_len_memory, 64.0);
  p.target_forward = BatchTargetHost::forward;
  p.target_user_data = &host;
  flashspec_batch_engine* untouched = reinterpret_cast<flashspec_batch_engine*>(0x1);
  p.draft_len_rule = static_cast<flashspec_draft_len_rule>(7);
  EXPECT_EQ(flashspec_batch_engine_create(ctx.get(), head.get(), &p, &untouched), FLASHSPEC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(error().find("params->draft_len_rule"), std::string::npos) << error();
  p.draft_len_rule = FLASHSPEC_DRAFT_LEN_ADAPTIVE;
  for (double memory : {0.5, 2e6, std::nan("")}) {
    p.draft_len_memory = memory;
    EXPECT_EQ(flashspec_batch_engine_create(ctx.get(), head.get(), &p, &untouched), FLASHSPEC_ERR_INVALID_ARGUMENT);
    EXPECT_NE(error().find("params->draft_len_memory"), std::string::npos) << error();
  }
  EXPECT_EQ(untouched, reinterpret_cast<flashspec_batch_engine*>(0x1));
}

TEST_F(Fixture, SampledEachSequenceEqualsItsSingleEngineRunWithTheSameSeed) {
  build();
  const std::vector<Request> rs = requests(0.9f);
  for (const Request& r : rs) add(r);
  run_to_end();
  EXPECT_TRUE(host.protocol_error.empty()) << host.protocol_error;
  for (const Request& r : rs) expect_same_as_single(r);
  // The seeds matter: another seed gives other tokens for the longest one.
  Request other = rs[3];
  other.seed += 1;
  other.stop_tokens.clear();
  Request same = rs[3];
  same.stop_tokens.clear();
  EXPECT_NE(single(other).tokens, single(same).tokens);
}

TEST_F(Fixture, SequencesJoinAndLeaveMidRun) {
  build();
  std::vector<Request> rs = requests(0.7f);
  add(rs[0]);
  add(rs[1]);
  for (int i = 0; i < 3; ++i) step();
  add(rs[2]);  // joins with two sequences mid-run
  step();
  // Sequence 8 leaves before it finishes (cancelled by removal); its drafters
  // are free again and serve a new sequence.
  flashspec_sequence_info info;
  flashspec_sequence_info_init(&info);
  ASSERT_EQ(flashspec_batch_engine_get_sequence(batch.get(), 8, nullptr, 0, &info), FLASHSPEC_OK);
  const int32_t tokens_before_leaving = info.num_tokens;
  std::vector<int32_t> partial(static_cast<size_t>(tokens_before_leaving));
  ASSERT_EQ(flashspec_batch_engine_get_sequence(batch.get(), 8, partial.data(), int32_t(partial.size()), nullptr),
            FLASHSPEC_OK);
  ASSERT_EQ(flashspec_batch_engine_remove_sequence(batch.get(), 8), FLASHSPEC_OK) << error();
  EXPECT_EQ(flashspec_batch_engine_get_sequence(batch.get(), 8, nullptr, 0, &info), FLASHSPEC_ERR_OUT_OF_RANGE);
  add(rs[3]);
  step();
  add(rs[4]);
  run_to_end();
  EXPECT_TRUE(host.protocol_error.empty()) << host.protocol_error;
  for (const Request& r : {rs[0], rs[2], rs[3], rs[4]}) expect_same_as_single(r);
  // What sequence 8 emitted before it left is a prefix of its own run.
  const Outcome full = single(rs[1]);
  ASSERT_LE(partial.size(), full.tokens.size());
  EXPECT_TRUE(std::equal(partial.begin(), partial.end(), full.tokens.begin()));
  // A finished sequence stays readable until removed; then its id is free.
  ASSERT_EQ(flashspec_batch_engine_remove_sequence(batch.get(), 7), FLASHSPEC_OK) << error();
  rs[0].seed = 77;
  add(rs[0]);
  run_to_end();
  expect_same_as_single(rs[0]);
}

TEST_F(Fixture, EachSequenceLearnsItsOwnBandit) {
  // A late joiner plays the arms a fresh policy plays: its steps and drafts
  // equal a fresh single engine's, and differ from those of an engine whose
  // policy learned from another sequence first (a shared bandit).
  build();
  const std::vector<Request> rs = requests(0.8f);
  Request early = rs[3];
  early.stop_tokens.clear();
  add(early);
  for (int i = 0; i < 6; ++i) step();
  Request late = rs[0];
  add(late);
  run_to_end();
  expect_same_as_single(late);
  const Outcome got = outcome(late.id);
  const Outcome shared = single(late, &early);
  EXPECT_NE(std::make_pair(got.metrics.draft_tokens, got.tokens), std::make_pair(shared.metrics.draft_tokens, shared.tokens))
      << "a policy warmed by another sequence played the same arms: this test has no power";
  // The engine's arm statistics sum every sequence's.
  flashspec_engine_metrics total, a = outcome(early.id).metrics;
  flashspec_engine_metrics_init(&total);
  ASSERT_EQ(flashspec_batch_engine_get_metrics(batch.get(), &total), FLASHSPEC_OK);
  EXPECT_EQ(total.steps, a.steps + got.metrics.steps);
  EXPECT_EQ(total.draft_tokens, a.draft_tokens + got.metrics.draft_tokens);
  EXPECT_EQ(total.accepted_tokens, a.accepted_tokens + got.metrics.accepted_tokens);
  EXPECT_EQ(total.emitted_tokens, a.emitted_tokens + got.metrics.emitted_tokens);
  uint64_t pulls = 0;
  for (int32_t arm = 0; arm < int32_t(arms.size()); ++arm) {
    flashspec_arm_metrics m;
    flashspec_arm_metrics_init(&m);
    ASSERT_EQ(flashspec_batch_engine_get_arm_metrics(batch.get(), arm, &m), FLASHSPEC_OK);
    EXPECT_EQ(m.draft_len, arms[size_t(arm)].draft_len);
    pulls += m.pulls;
  }
  EXPECT_EQ(pulls, total.steps);
}

TEST_F(Fixture, AFailingDrafterEndsItsSequenceOnly) {
  build();
  const std::vector<Request> rs = requests(0.6f);
  add(rs[0]);
  add(rs[1], /*hash_fail_at=*/0);  // its hash drafter fails at its first call
  add(rs[2]);
  run_to_end();
  const Outcome failed = outcome(rs[1].id);
  EXPECT_EQ(failed.info.active, 0);
  EXPECT_EQ(failed.info.status, FLASHSPEC_ERR_CALLBACK);
  EXPECT_EQ(failed.info.finish_reason, FLASHSPEC_FINISH_NONE);
  EXPECT_NE(std::string(flashspec_batch_engine_sequence_error(batch.get(), rs[1].id)).find("draft callback"),
            std::string::npos);
  EXPECT_STREQ(flashspec_batch_engine_sequence_error(batch.get(), rs[0].id), "");
  // What it emitted before is a prefix of its own run.
  const Outcome full = single(rs[1]);
  ASSERT_LT(failed.tokens.size(), full.tokens.size());
  EXPECT_TRUE(std::equal(failed.tokens.begin(), failed.tokens.end(), full.tokens.begin()));
  expect_same_as_single(rs[0]);
  expect_same_as_single(rs[2]);
}

TEST_F(Fixture, AFailingRollbackEndsItsSequenceOnly) {
  build();
  const std::vector<Request> rs = requests(0.0f);
  host.fail_rollback_of = rs[3].id;
  add(rs[0]);
  add(rs[3]);
  run_to_end();
  const Outcome failed = outcome(rs[3].id);
  EXPECT_EQ(failed.info.status, FLASHSPEC_ERR_CALLBACK);
  EXPECT_NE(std::string(flashspec_batch_engine_sequence_error(batch.get(), rs[3].id)).find("target rollback"),
            std::string::npos);
  expect_same_as_single(rs[0]);
}

struct Streams {
  std::map<uint64_t, std::vector<int32_t>> tokens;
  uint64_t stop_id = ~0ull;
  uint64_t throw_id = ~0ull;
  flashspec_batch_engine* engine = nullptr;
  flashspec_status nested = FLASHSPEC_OK;
  static int on_token(void* user_data, uint64_t id, int32_t token) {
    auto* self = static_cast<Streams*>(user_data);
    self->tokens[id].push_back(token);
    if (self->engine) self->nested = flashspec_batch_engine_step(self->engine, nullptr);
    if (id == self->throw_id) throw std::runtime_error("host failed");
    return id == self->stop_id ? 1 : 0;
  }
};

TEST_F(Fixture, TokensStreamPerSequenceAndTheirCallbacksEndOnlyTheirOwn) {
  build();
  const std::vector<Request> rs = requests(0.5f);
  Streams streams;
  streams.stop_id = rs[0].id;
  streams.throw_id = rs[1].id;
  for (const Request& r : {rs[0], rs[1], rs[2]}) {
    const std::vector<flashspec_drafter*> list = make_drafters();
    flashspec_sequence_params p = sequence_params(r, list);
    p.on_token = Streams::on_token;
    p.on_token_user_data = &streams;
    ASSERT_EQ(flashspec_batch_engine_add_sequence(batch.get(), r.id, r.prompt.data(), int32_t(r.prompt.size()), &p),
              FLASHSPEC_OK)
        << error();
  }
  streams.engine = batch.get();
  step();
  streams.engine = nullptr;
  EXPECT_EQ(streams.nested, FLASHSPEC_ERR_INVALID_ARGUMENT);
  run_to_end();
  const Outcome stopped = outcome(rs[0].id), thrown = outcome(rs[1].id), normal = outcome(rs[2].id);
  EXPECT_EQ(stopped.info.finish_reason, FLASHSPEC_FINISH_HOST_STOP);
  EXPECT_EQ(stopped.info.status, FLASHSPEC_OK);
  EXPECT_EQ(stopped.tokens.size(), 1u);
  EXPECT_EQ(thrown.info.status, FLASHSPEC_ERR_CALLBACK);
  EXPECT_EQ(thrown.tokens.size(), 1u);
  expect_same_as_single(rs[2]);
  EXPECT_EQ(streams.tokens[rs[0].id], stopped.tokens);
  EXPECT_EQ(streams.tokens[rs[1].id], thrown.tokens);
  EXPECT_EQ(streams.tokens[rs[2].id], normal.tokens);
}

TEST_F(Fixture, AFailedForwardFailsTheStepAndARetryGoesOnExactly) {
  build();
  const std::vector<Request> rs = requests(0.9f);
  for (const Request& r : {rs[0], rs[1], rs[3]}) add(r);
  step();
  step();
  flashspec_sequence_info before;
  flashspec_sequence_info_init(&before);
  ASSERT_EQ(flashspec_batch_engine_get_sequence(batch.get(), rs[0].id, nullptr, 0, &before), FLASHSPEC_OK);
  host.fail_forward_at = host.forwards;
  int32_t active = -7;
  EXPECT_EQ(flashspec_batch_engine_step(batch.get(), &active), FLASHSPEC_ERR_CALLBACK);
  EXPECT_EQ(active, -7);
  EXPECT_NE(error().find("target forward"), std::string::npos) << error();
  flashspec_sequence_info after = before;
  ASSERT_EQ(flashspec_batch_engine_get_sequence(batch.get(), rs[0].id, nullptr, 0, &after), FLASHSPEC_OK);
  EXPECT_EQ(after.num_tokens, before.num_tokens);
  EXPECT_EQ(after.steps, before.steps);
  EXPECT_EQ(after.active, 1);
  run_to_end();
  EXPECT_TRUE(host.protocol_error.empty()) << host.protocol_error;
  for (const Request& r : {rs[0], rs[1], rs[3]}) expect_same_as_single(r);
}

TEST_F(Fixture, WithoutRollbackTheNextForwardTruncates) {
  build(0, /*with_rollback=*/false);
  const std::vector<Request> rs = requests(0.0f);
  for (const Request& r : rs) add(r);
  run_to_end();
  EXPECT_TRUE(host.protocol_error.empty()) << host.protocol_error;
  for (const Request& r : rs) expect_same_as_single(r);
}

TEST_F(Fixture, BadInputGetsSpecificStatusesAndLeavesOutputsUntouched) {
  build(/*max_sequences=*/2);
  const std::vector<Request> rs = requests(0.0f);
  const Request& r = rs[0];
  std::vector<flashspec_drafter*> list = make_drafters();
  flashspec_sequence_params p = sequence_params(r, list);
  auto add_with = [&](uint64_t id, const int32_t* prompt, int32_t len, const flashspec_sequence_params* params) {
    return flashspec_batch_engine_add_sequence(batch.get(), id, prompt, len, params);
  };
  EXPECT_EQ(flashspec_batch_engine_add_sequence(nullptr, 1, r.prompt.data(), 3, &p), FLASHSPEC_ERR_NULL_POINTER);
  EXPECT_EQ(add_with(1, nullptr, 3, &p), FLASHSPEC_ERR_NULL_POINTER);
  EXPECT_NE(error().find("prompt"), std::string::npos);
  EXPECT_EQ(add_with(1, r.prompt.data(), 0, &p), FLASHSPEC_ERR_OUT_OF_RANGE);
  const int32_t bad_token[2] = {1, kVocab};
  EXPECT_EQ(add_with(1, bad_token, 2, &p), FLASHSPEC_ERR_OUT_OF_RANGE);
  EXPECT_EQ(add_with(1, r.prompt.data(), 3, nullptr), FLASHSPEC_ERR_OUT_OF_RANGE);  // no drafters
  EXPECT_NE(error().find("params->num_drafters"), std::string::npos) << error();
  flashspec_sequence_params q = p;
  q.temperature = -1.0f;
  EXPECT_EQ(add_with(1, r.prompt.data(), 3, &q), FLASHSPEC_ERR_INVALID_ARGUMENT);
  q = p;
  q.max_tokens = 0;
  EXPECT_EQ(add_with(1, r.prompt.data(), 3, &q), FLASHSPEC_ERR_OUT_OF_RANGE);
  q = p;
  q.struct_size = 3;
  EXPECT_EQ(add_with(1, r.prompt.data(), 3, &q), FLASHSPEC_ERR_STRUCT_SIZE);
  std::vector<flashspec_drafter*> twice = {list[0], list[0]};
  q = p;
  q.drafters = twice.data();
  EXPECT_EQ(add_with(1, r.prompt.data(), 3, &q), FLASHSPEC_ERR_INVALID_ARGUMENT);
  std::vector<flashspec_drafter*> with_null = {list[0], nullptr};
  q.drafters = with_null.data();
  EXPECT_EQ(add_with(1, r.prompt.data(), 3, &q), FLASHSPEC_ERR_NULL_POINTER);
  EXPECT_NE(error().find("params->drafters[1]"), std::string::npos) << error();
  // A LOGITS drafter cannot share the batch's verify pass.
  flashspec_callback_drafter_params cp;
  flashspec_callback_drafter_params_init(&cp);
  cp.kind = FLASHSPEC_DRAFT_LOGITS;
  cp.draft = HashDrafter::draft;
  flashspec_drafter* logits = nullptr;
  ASSERT_EQ(flashspec_drafter_create_callback(ctx.get(), &cp, &logits), FLASHSPEC_OK);
  drafters.emplace_back(logits);
  std::vector<flashspec_drafter*> stochastic = {list[0], logits};
  q.drafters = stochastic.data();
  EXPECT_EQ(add_with(1, r.prompt.data(), 3, &q), FLASHSPEC_ERR_UNSUPPORTED);

  // Nothing above joined; a valid add does.
  ASSERT_EQ(add_with(1, r.prompt.data(), 3, &p), FLASHSPEC_OK) << error();
  // Its drafters serve it now; a duplicate id is refused.
  std::vector<flashspec_drafter*> others = make_drafters();
  q = p;
  EXPECT_EQ(add_with(2, r.prompt.data(), 3, &q), FLASHSPEC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(error().find("already serves"), std::string::npos) << error();
  q.drafters = others.data();
  EXPECT_EQ(add_with(1, r.prompt.data(), 3, &q), FLASHSPEC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(error().find("sequence_id"), std::string::npos) << error();
  ASSERT_EQ(add_with(2, r.prompt.data(), 3, &q), FLASHSPEC_OK) << error();
  std::vector<flashspec_drafter*> third = make_drafters();
  q.drafters = third.data();
  EXPECT_EQ(add_with(3, r.prompt.data(), 3, &q), FLASHSPEC_ERR_WORKSPACE_EXCEEDED);

  // Unknown ids, NULLs, bad capacities: outputs untouched.
  flashspec_sequence_info info;
  flashspec_sequence_info_init(&info);
  info.num_tokens = -99;
  int32_t poison = -5;
  EXPECT_EQ(flashspec_batch_engine_get_sequence(batch.get(), 42, &poison, 1, &info), FLASHSPEC_ERR_OUT_OF_RANGE);
  EXPECT_EQ(flashspec_batch_engine_get_sequence(batch.get(), 1, nullptr, 1, &info), FLASHSPEC_ERR_NULL_POINTER);
  EXPECT_EQ(flashspec_batch_engine_get_sequence(batch.get(), 1, &poison, -1, &info), FLASHSPEC_ERR_OUT_OF_RANGE);
  flashspec_sequence_info small = info;
  small.struct_size = 2;
  EXPECT_EQ(flashspec_batch_engine_get_sequence(batch.get(), 1, &poison, 1, &small), FLASHSPEC_ERR_STRUCT_SIZE);
  EXPECT_EQ(poison, -5);
  EXPECT_EQ(info.num_tokens, -99);
  EXPECT_EQ(flashspec_batch_engine_get_sequence(nullptr, 1, nullptr, 0, &info), FLASHSPEC_ERR_NULL_POINTER);
  EXPECT_EQ(flashspec_batch_engine_remove_sequence(batch.get(), 42), FLASHSPEC_ERR_OUT_OF_RANGE);
  EXPECT_NE(error().find("sequence_id"), std::string::npos) << error();
  EXPECT_EQ(flashspec_batch_engine_remove_sequence(nullptr, 1), FLASHSPEC_ERR_NULL_POINTER);
  EXPECT_EQ(flashspec_batch_engine_step(nullptr, nullptr), FLASHSPEC_ERR_NULL_POINTER);
  EXPECT_EQ(flashspec_batch_engine_sequence_error(batch.get(), 42), nullptr);
  EXPECT_EQ(flashspec_batch_engine_sequence_error(nullptr, 1), nullptr);
  flashspec_engine_metrics m;
  flashspec_engine_metrics_init(&m);
  EXPECT_EQ(flashspec_batch_engine_get_sequence_metrics(batch.get(), 42, &m), FLASHSPEC_ERR_OUT_OF_RANGE);
  EXPECT_EQ(flashspec_batch_engine_get_metrics(batch.get(), nullptr), FLASHSPEC_ERR_NULL_POINTER);
  flashspec_arm_metrics am;
  flashspec_arm_metrics_init(&am);
  EXPECT_EQ(flashspec_batch_engine_get_arm_metrics(batch.get(), int32_t(arms.size()), &am), FLASHSPEC_ERR_OUT_OF_RANGE);

  // Removing a sequence frees its drafters for another.
  ASSERT_EQ(flashspec_batch_engine_remove_sequence(batch.get(), 1), FLASHSPEC_OK) << error();
  ASSERT_EQ(add_with(3, r.prompt.data(), 3, &p), FLASHSPEC_OK) << error();
  int32_t active = -1;
  ASSERT_EQ(flashspec_batch_engine_step(batch.get(), &active), FLASHSPEC_OK) << error();
  EXPECT_EQ(active, 2);
}

TEST_F(Fixture, CreateChecksItsParamsAndTheWorkspace) {
  flashspec_batch_engine_params p;
  flashspec_batch_engine_params_init(&p);
  flashspec_batch_engine* e = reinterpret_cast<flashspec_batch_engine*>(0x1);
  EXPECT_EQ(flashspec_batch_engine_create(ctx.get(), head.get(), &p, &e), FLASHSPEC_ERR_NULL_POINTER);
  EXPECT_NE(error().find("params->target_forward"), std::string::npos) << error();
  p.target_forward = BatchTargetHost::forward;
  EXPECT_EQ(flashspec_batch_engine_create(nullptr, head.get(), &p, &e), FLASHSPEC_ERR_NULL_POINTER);
  EXPECT_EQ(flashspec_batch_engine_create(ctx.get(), nullptr, &p, &e), FLASHSPEC_ERR_NULL_POINTER);
  EXPECT_EQ(flashspec_batch_engine_create(ctx.get(), head.get(), nullptr, &e), FLASHSPEC_ERR_NULL_POINTER);
  // max_rows 64, max_requests 8: with k = 7 at most 8 sequences, k = 15 at most 4.
  p.num_drafters = 1;
  p.default_draft_len = 15;
  p.max_sequences = 5;
  EXPECT_EQ(flashspec_batch_engine_create(ctx.get(), head.get(), &p, &e), FLASHSPEC_ERR_OUT_OF_RANGE);
  EXPECT_NE(error().find("params->max_sequences"), std::string::npos) << error();
  p.max_sequences = -1;
  EXPECT_EQ(flashspec_batch_engine_create(ctx.get(), head.get(), &p, &e), FLASHSPEC_ERR_OUT_OF_RANGE);
  p.max_sequences = 0;
  p.num_drafters = -1;
  EXPECT_EQ(flashspec_batch_engine_create(ctx.get(), head.get(), &p, &e), FLASHSPEC_ERR_OUT_OF_RANGE);
  p.num_drafters = 1;
  p.policy = flashspec_bandit_policy(77);
  EXPECT_EQ(flashspec_batch_engine_create(ctx.get(), head.get(), &p, &e), FLASHSPEC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(e, reinterpret_cast<flashspec_batch_engine*>(0x1));
  p.policy = FLASHSPEC_BANDIT_UCB1;
  // 0: as many as fit (4 here); a fifth is refused.
  ASSERT_EQ(flashspec_batch_engine_create(ctx.get(), head.get(), &p, &e), FLASHSPEC_OK) << error();
  batch.reset(e);
  const std::vector<int32_t> prompt = {1, 2, 3};
  for (uint64_t id = 0; id < 5; ++id) {
    flashspec_ngram_params np;
    flashspec_ngram_params_init(&np);
    flashspec_drafter* d = nullptr;
    ASSERT_EQ(flashspec_drafter_create_ngram(ctx.get(), &np, &d), FLASHSPEC_OK);
    drafters.emplace_back(d);
    flashspec_sequence_params sp;
    flashspec_sequence_params_init(&sp);
    sp.drafters = &d;
    sp.num_drafters = 1;
    EXPECT_EQ(flashspec_batch_engine_add_sequence(batch.get(), id, prompt.data(), 3, &sp),
              id < 4 ? FLASHSPEC_OK : FLASHSPEC_ERR_WORKSPACE_EXCEEDED);
  }
}

}  // namespace
