// Tree steps in the engines (flashspec.h, Tree steps): a TREE callback
// drafter and the suffix drafter's trees, against a synthetic target whose
// tree forward gives each node the row of its own path. T = 0 equals plain
// greedy decoding (with the keep callback, with a rollback only, with
// neither), whichever child is right; T > 0 is reproducible and its first
// step is flashspec_verify_and_finalize on the same tree; the batched
// engine mixes tree and chain sequences; bad trees and a failing keep
// callback are CALLBACK errors that leave the engine usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "engine_support.h"

namespace {

using namespace fstest;

constexpr int32_t kVocab = 48, kHidden = 16;

int32_t argmax(const std::vector<double>& p) { return int32_t(std::max_element(p.begin(), p.end()) - p.begin()); }

// A Medusa-style tree that knows the target, right child last: at each
// level a decoy (a wrong token, with a child of its own), then the target's
// most likely token, whose subtree is the next level. At one level, a
// function of the context, the right child is left out, so the paths end
// at different depths. A function of the context alone, so fresh copies
// draft the same trees.
struct DecoyTreeDrafter {
  const SyntheticModel* model = nullptr;
  enum class Fault { kNone, kParentSelf, kParentAfter, kParentBelow, kParentUnset, kTooMany, kReturnError };
  Fault fault = Fault::kNone;
  int fail_at = -1;
  int calls = 0;
  bool chain_shaped = false;  // the right tokens only, each the child of the one before

  static int draft(void* user_data, flashspec_draft_call* call) {
    auto* self = static_cast<DecoyTreeDrafter*>(user_data);
    const int index = self->calls++;
    if (call->struct_size != sizeof(flashspec_draft_call) || call->parents == nullptr) return -100;
    const int32_t vocab = self->model->vocab();
    std::vector<int32_t> path(call->context, call->context + call->context_len);
    const int32_t miss_level = 1 + call->context_len % 4;
    std::vector<int32_t> tokens, parents;
    auto add = [&](int32_t token, int32_t parent) {
      tokens.push_back(token);
      parents.push_back(parent);
      return int32_t(tokens.size()) - 1;
    };
    const auto full = [&] { return int32_t(tokens.size()) >= call->max_tokens; };
    int32_t parent = -1;
    for (int32_t level = 0; !full(); ++level) {
      const int32_t right = argmax(self->model->probabilities(path.data(), int32_t(path.size()), 1.0));
      if (!self->chain_shaped) {
        const int32_t wrong = (right + 1 + level) % vocab;
        const int32_t decoy = add(wrong, parent);
        if (!full()) add((wrong * 7 + 3) % vocab, decoy);
        if (level == miss_level || full()) break;
      }
      parent = add(right, parent);
      path.push_back(right);
    }
    const int32_t n = int32_t(tokens.size());
    // kParentUnset: the last node's parent is left as the library wrote it.
    const bool unset = index == self->fail_at && self->fault == Fault::kParentUnset;
    for (int32_t i = 0; i < n; ++i) {
      call->tokens[i] = tokens[size_t(i)];
      if (!(unset && i == n - 1)) call->parents[i] = parents[size_t(i)];
    }
    call->num_tokens = n;
    if (index == self->fail_at) {
      switch (self->fault) {
        case Fault::kParentSelf: call->parents[2] = 2; break;
        case Fault::kParentAfter: call->parents[2] = 4; break;
        case Fault::kParentBelow: call->parents[2] = -3; break;
        case Fault::kTooMany: call->num_tokens = call->max_tokens + 1; break;
        case Fault::kReturnError: return -4;
        case Fault::kParentUnset: case Fault::kNone: break;
      }
    }
    return 0;
  }
};

// A TOKENS drafter: the target's most likely tokens, a chain.
struct ArgmaxChainDrafter {
  const SyntheticModel* model = nullptr;
  static int draft(void* user_data, flashspec_draft_call* call) {
    auto* self = static_cast<ArgmaxChainDrafter*>(user_data);
    std::vector<int32_t> path(call->context, call->context + call->context_len);
    for (int32_t j = 0; j < call->max_tokens; ++j) {
      call->tokens[j] = argmax(self->model->probabilities(path.data(), int32_t(path.size()), 1.0));
      path.push_back(call->tokens[j]);
    }
    call->num_tokens = call->max_tokens;
    return 0;
  }
};

// The cache modes of a tree engine's host.
enum class CacheMode { kKeep, kRollback, kNeither };

// A TargetHost whose keep callback also counts keeps of a path not in
// place (a gap among the kept indices).
struct TreeHost : TargetHost {
  int gapped_keeps = 0;
  static int keep_fn(void* user_data, int32_t num_past, const int32_t* keep, int32_t num_keep) {
    auto* self = static_cast<TreeHost*>(user_data);
    for (int32_t i = 1; i < num_keep; ++i)
      if (keep[i] != keep[i - 1] + 1) {
        self->gapped_keeps++;
        break;
      }
    return TargetHost::keep(user_data, num_past, keep, num_keep);
  }
};

struct Outcome {
  flashspec_status status = FLASHSPEC_OK;
  std::vector<int32_t> tokens;
  flashspec_generate_result result{};
  flashspec_engine_metrics metrics{};
  std::string error;
};

struct TreeEngine : ::testing::Test {
  ContextPtr ctx = make_context(ContextOptions().cpu_threads(1).max_rows(64).max_requests(8));
  SyntheticModel model{kVocab, kHidden, 3, 0.8f};
  HeadPtr head = model.make_head(ctx.get());

  std::string error() const { return flashspec_context_last_error(ctx.get()); }

  DrafterPtr callback_drafter(flashspec_draft_kind kind, flashspec_draft_fn fn, void* user_data) {
    flashspec_callback_drafter_params p;
    flashspec_callback_drafter_params_init(&p);
    p.kind = kind;
    p.draft = fn;
    p.user_data = user_data;
    flashspec_drafter* d = nullptr;
    EXPECT_EQ(flashspec_drafter_create_callback(ctx.get(), &p, &d), FLASHSPEC_OK) << error();
    return DrafterPtr(d);
  }

  DrafterPtr suffix_drafter(bool trees) {
    flashspec_suffix_params p;
    flashspec_suffix_params_init(&p);
    EXPECT_EQ(p.propose_trees, 0);
    p.propose_trees = trees ? 1 : 0;
    p.cache_max_tokens = 0;
    flashspec_drafter* d = nullptr;
    EXPECT_EQ(flashspec_drafter_create_suffix(ctx.get(), &p, &d), FLASHSPEC_OK) << error();
    return DrafterPtr(d);
  }

  // An engine with one arm (drafter, k), or a k = 0 arm without a drafter.
  EnginePtr engine(TreeHost& host, flashspec_drafter* drafter, int32_t k, CacheMode mode = CacheMode::kKeep) {
    host.model = &model;
    host.rollback_enabled = mode == CacheMode::kRollback;
    const flashspec_arm arm{0, drafter ? k : 0};
    flashspec_engine_params p;
    flashspec_engine_params_init(&p);
    p.target_forward = TargetHost::forward;
    p.target_rollback = mode == CacheMode::kRollback ? TargetHost::rollback : nullptr;
    p.target_keep = mode == CacheMode::kKeep ? TreeHost::keep_fn : nullptr;
    p.target_user_data = &host;
    p.drafters = drafter ? &drafter : nullptr;
    p.num_drafters = drafter ? 1 : 0;
    p.arms = &arm;
    p.num_arms = 1;
    p.policy = FLASHSPEC_BANDIT_FIXED;
    flashspec_engine* e = nullptr;
    EXPECT_EQ(flashspec_engine_create(ctx.get(), head.get(), &p, &e), FLASHSPEC_OK) << error();
    return EnginePtr(e);
  }

  Outcome generate(flashspec_engine* e, const std::vector<int32_t>& prompt, int32_t max_tokens, float temperature = 0.0f,
               uint64_t seed = 0, uint64_t request_id = 0) {
    flashspec_generate_params g;
    flashspec_generate_params_init(&g);
    g.temperature = temperature;
    g.seed = seed;
    g.request_id = request_id;
    g.max_tokens = max_tokens;
    Outcome run;
    run.tokens.assign(size_t(max_tokens), -1);
    flashspec_generate_result_init(&run.result);
    run.status = flashspec_engine_generate(e, prompt.data(), int32_t(prompt.size()), &g, run.tokens.data(),
                                           int32_t(run.tokens.size()), &run.result);
    run.error = error();
    run.tokens.resize(size_t(std::max(0, run.result.num_tokens)));
    flashspec_engine_metrics_init(&run.metrics);
    EXPECT_EQ(flashspec_engine_get_metrics(e, &run.metrics), FLASHSPEC_OK);
    return run;
  }
};

const std::vector<std::vector<int32_t>> kPrompts = {{3, 17, 5, 3, 17, 9, 22}, {1}, {4, 8, 15, 16, 23, 42 % kVocab}};

TEST_F(TreeEngine, GreedyTreeEqualsGreedyDecodingWithKeepRollbackOrNeither) {
  for (const std::vector<int32_t>& prompt : kPrompts) {
    const std::vector<int32_t> greedy = greedy_reference(ctx.get(), head.get(), model, prompt, 40);
    std::vector<Outcome> runs;
    for (CacheMode mode : {CacheMode::kKeep, CacheMode::kRollback, CacheMode::kNeither}) {
      DecoyTreeDrafter decoy{&model};
      DrafterPtr drafter = callback_drafter(FLASHSPEC_DRAFT_TREE, DecoyTreeDrafter::draft, &decoy);
      TreeHost host;
      EnginePtr e = engine(host, drafter.get(), 10, mode);
      runs.push_back(generate(e.get(), prompt, 40));
      const Outcome& run = runs.back();
      ASSERT_EQ(run.status, FLASHSPEC_OK) << run.error;
      EXPECT_EQ(run.tokens, greedy);
      EXPECT_TRUE(host.protocol_error.empty()) << host.protocol_error;
      EXPECT_EQ(uint64_t(host.tree_forwards), run.metrics.drafts);  // every step with drafts
      if (mode == CacheMode::kKeep) {
        // The right child comes after a decoy and its child: its path is
        // never where a chain would be, so every keep has a gap.
        EXPECT_GT(host.gapped_keeps, 0);
        EXPECT_EQ(host.refeeds, 0);
        EXPECT_EQ(host.rollbacks, 0);
      } else {
        EXPECT_EQ(host.keeps, 0);
        // Without a keep callback the accepted path is sent again.
        EXPECT_GT(host.refeeds, 0);
        if (mode == CacheMode::kRollback) EXPECT_GT(host.rollbacks, 0);
      }
    }
    // The same drafts and verifies whatever the cache does.
    for (const Outcome& run : runs) {
      EXPECT_EQ(run.result.steps, runs[0].result.steps);
      EXPECT_EQ(run.metrics.accepted_tokens, runs[0].metrics.accepted_tokens);
      EXPECT_EQ(run.metrics.draft_tokens, runs[0].metrics.draft_tokens);
      EXPECT_EQ(run.metrics.emitted_tokens, 40u);
    }
    // The right children were found below decoys: paths deeper than 1.
    EXPECT_GT(runs[0].metrics.accepted_tokens, uint64_t(runs[0].result.steps));
    EXPECT_LT(runs[0].result.steps, 20);
  }
}

TEST_F(TreeEngine, GreedyTreeChainAndNoDrafterEmitTheSameTokens) {
  const std::vector<int32_t>& prompt = kPrompts[0];
  DecoyTreeDrafter decoy{&model};
  ArgmaxChainDrafter chain{&model};
  DrafterPtr tree_drafter = callback_drafter(FLASHSPEC_DRAFT_TREE, DecoyTreeDrafter::draft, &decoy);
  DrafterPtr chain_drafter = callback_drafter(FLASHSPEC_DRAFT_TOKENS, ArgmaxChainDrafter::draft, &chain);
  TreeHost tree_host, chain_host, plain_host;
  EnginePtr tree_engine = engine(tree_host, tree_drafter.get(), 6);
  EnginePtr chain_engine = engine(chain_host, chain_drafter.get(), 4, CacheMode::kRollback);
  EnginePtr plain_engine = engine(plain_host, nullptr, 0);
  const Outcome tree = generate(tree_engine.get(), prompt, 33);
  const Outcome chain_run = generate(chain_engine.get(), prompt, 33);
  const Outcome plain = generate(plain_engine.get(), prompt, 33);
  ASSERT_EQ(tree.status, FLASHSPEC_OK) << tree.error;
  EXPECT_EQ(tree.tokens, chain_run.tokens);
  EXPECT_EQ(tree.tokens, plain.tokens);
  EXPECT_EQ(plain.result.steps, 33);
  // A chain step passes no parents.
  EXPECT_EQ(chain_host.tree_forwards, 0);
  EXPECT_EQ(plain_host.tree_forwards, 0);
  EXPECT_TRUE(chain_host.protocol_error.empty()) << chain_host.protocol_error;
}

// A tree shaped as a chain is still a tree step: with parents in the
// forward, the target rows and tokens of a chain.
TEST_F(TreeEngine, ChainShapedTreeIsATreeStepWithChainTokensAtTZero) {
  DecoyTreeDrafter decoy{&model};
  decoy.chain_shaped = true;
  DrafterPtr drafter = callback_drafter(FLASHSPEC_DRAFT_TREE, DecoyTreeDrafter::draft, &decoy);
  for (CacheMode mode : {CacheMode::kKeep, CacheMode::kNeither}) {
    TreeHost host;
    EnginePtr e = engine(host, drafter.get(), 5, mode);
    const Outcome run = generate(e.get(), kPrompts[2], 30);
    ASSERT_EQ(run.status, FLASHSPEC_OK) << run.error;
    EXPECT_EQ(run.tokens, greedy_reference(ctx.get(), head.get(), model, kPrompts[2], 30));
    EXPECT_EQ(uint64_t(host.tree_forwards), run.metrics.drafts);  // every step with drafts
    // Paths in place: nothing to send again, no gap to keep.
    EXPECT_EQ(host.refeeds, 0);
    EXPECT_EQ(host.gapped_keeps, 0);
    EXPECT_TRUE(host.protocol_error.empty()) << host.protocol_error;
    e.reset();
  }
}

// At T > 0 the first step is the tree verify of flashspec_verify_and_finalize
// on the same tree, rows and keys; the run is reproducible given its seed.
TEST_F(TreeEngine, SampledTreeStepIsVerifyAndFinalizeOfTheSameTree) {
  const std::vector<int32_t> prompt = kPrompts[0];
  const float temperature = 0.9f;
  const uint64_t request_id = 5;
  const int32_t k = 8;
  int checked_deeper = 0;
  std::vector<std::vector<int32_t>> outputs;
  for (uint64_t seed = 70; seed < 82; ++seed) {
    // The engine.
    DecoyTreeDrafter decoy{&model};
    DrafterPtr drafter = callback_drafter(FLASHSPEC_DRAFT_TREE, DecoyTreeDrafter::draft, &decoy);
    TreeHost host;
    EnginePtr e = engine(host, drafter.get(), k, seed % 2 ? CacheMode::kKeep : CacheMode::kNeither);
    const Outcome run = generate(e.get(), prompt, 24, temperature, seed, request_id);
    ASSERT_EQ(run.status, FLASHSPEC_OK) << run.error;
    EXPECT_TRUE(host.protocol_error.empty()) << host.protocol_error;
    const Outcome again = generate(e.get(), prompt, 24, temperature, seed, request_id);
    EXPECT_EQ(again.tokens, run.tokens) << "seed " << seed;
    outputs.push_back(run.tokens);

    // The first step by hand: the drafter's tree, each node's row from its
    // path, one tree verify keyed (seed, request_id, step 0).
    DecoyTreeDrafter fresh{&model};
    std::vector<int32_t> tokens(static_cast<size_t>(k)), parents(static_cast<size_t>(k));
    flashspec_draft_call call{};
    call.struct_size = sizeof(flashspec_draft_call);
    call.context = prompt.data();
    call.context_len = int32_t(prompt.size());
    call.max_tokens = k;
    call.tokens = tokens.data();
    call.parents = parents.data();
    ASSERT_EQ(DecoyTreeDrafter::draft(&fresh, &call), 0);
    const int32_t n = call.num_tokens;
    std::vector<float> rows(size_t(n + 1) * size_t(kHidden));
    model.hidden_row(prompt.data(), int32_t(prompt.size()), rows.data());
    for (int32_t i = 0; i < n; ++i) {
      std::vector<int32_t> path;
      for (int32_t j = i; j >= 0; j = parents[size_t(j)]) path.push_back(tokens[size_t(j)]);
      std::vector<int32_t> context = prompt;
      context.insert(context.end(), path.rbegin(), path.rend());
      model.hidden_row(context.data(), int32_t(context.size()), rows.data() + size_t(i + 1) * size_t(kHidden));
    }
    flashspec_tensor hidden = flashspec_tensor_make(rows.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, n + 1, kHidden);
    const int32_t offsets[2] = {0, n};
    const uint64_t step = 0;
    flashspec_verify_batch batch;
    flashspec_verify_batch_init(&batch);
    batch.num_requests = 1;
    batch.draft_offsets = offsets;
    batch.draft_tokens = tokens.data();
    batch.draft_parents = parents.data();
    batch.target_hidden = &hidden;
    batch.temperatures = &temperature;
    batch.seeds = &seed;
    batch.request_ids = &request_id;
    batch.steps = &step;
    int32_t depth = -1;
    std::vector<int32_t> emitted(size_t(n + 1)), nodes(size_t(n + 1));
    flashspec_verify_result result;
    flashspec_verify_result_init(&result);
    result.accepted_counts = &depth;
    result.emitted_tokens = emitted.data();
    result.accepted_nodes = nodes.data();
    ASSERT_EQ(flashspec_verify_and_finalize(ctx.get(), head.get(), &batch, &result), FLASHSPEC_OK) << error();
    ASSERT_GE(depth, 0);
    ASSERT_GE(run.tokens.size(), size_t(depth + 1));
    EXPECT_EQ(std::vector<int32_t>(run.tokens.begin(), run.tokens.begin() + depth + 1),
              std::vector<int32_t>(emitted.begin(), emitted.begin() + depth + 1))
        << "seed " << seed;
    if (depth >= 2) ++checked_deeper;
  }
  // Some first steps went below a decoy, and the seeds matter.
  EXPECT_GT(checked_deeper, 0);
  EXPECT_LT(std::count(outputs.begin(), outputs.end(), outputs[0]), int(outputs.size()));
}

// The suffix drafter's trees in an engine. The target counts (its greedy
// next token is the last one + 1, mod 16); in the prompt "0 1 2 3" was
// followed twice by 9 and once by 4, so the most frequent continuation is
// wrong and the second branch is right.
TEST_F(TreeEngine, SuffixTreesEqualGreedyAndAcceptMoreThanItsChains) {
  const int32_t vocab = 16;
  SyntheticModel counting(vocab, [](const int32_t* context, int32_t length) { return (context[length - 1] + 1) % 16; });
  ContextPtr c = make_context(ContextOptions().cpu_threads(1).max_rows(64).max_requests(4));
  HeadPtr h = counting.make_head(c.get());
  const std::vector<int32_t> prompt = {12, 0, 1, 2, 3, 9, 9, 13, 0, 1, 2, 3, 9, 14, 15, 0, 1, 2, 3, 4, 5, 6, 11, 0, 1, 2, 3};
  std::vector<int32_t> want;
  for (int32_t i = 0, t = 3; i < 30; ++i) want.push_back(t = (t + 1) % vocab);
  EXPECT_EQ(greedy_reference(c.get(), h.get(), counting, prompt, 30), want);

  uint64_t accepted[2] = {0, 0};
  int32_t steps[2] = {0, 0};
  for (int trees = 0; trees < 2; ++trees) {
    for (CacheMode mode : {CacheMode::kKeep, CacheMode::kNeither}) {
      flashspec_suffix_params sp;
      flashspec_suffix_params_init(&sp);
      sp.propose_trees = trees;
      sp.cache_max_tokens = 0;
      flashspec_drafter* raw = nullptr;
      ASSERT_EQ(flashspec_drafter_create_suffix(c.get(), &sp, &raw), FLASHSPEC_OK);
      DrafterPtr drafter(raw);
      TreeHost host;
      host.model = &counting;
      host.rollback_enabled = false;
      const flashspec_arm arm{0, 8};
      flashspec_engine_params p;
      flashspec_engine_params_init(&p);
      p.target_forward = TargetHost::forward;
      p.target_keep = mode == CacheMode::kKeep ? TreeHost::keep_fn : nullptr;
      p.target_user_data = &host;
      p.drafters = &raw;
      p.num_drafters = 1;
      p.arms = &arm;
      p.num_arms = 1;
      flashspec_engine* e = nullptr;
      ASSERT_EQ(flashspec_engine_create(c.get(), h.get(), &p, &e), FLASHSPEC_OK);
      EnginePtr engine_ptr(e);
      flashspec_generate_params g;
      flashspec_generate_params_init(&g);
      g.temperature = 0.0f;
      g.max_tokens = 30;
      std::vector<int32_t> out(30, -1);
      flashspec_generate_result result;
      flashspec_generate_result_init(&result);
      ASSERT_EQ(flashspec_engine_generate(e, prompt.data(), int32_t(prompt.size()), &g, out.data(), 30, &result),
                FLASHSPEC_OK)
          << flashspec_context_last_error(c.get());
      EXPECT_EQ(out, want) << "trees " << trees;
      EXPECT_TRUE(host.protocol_error.empty()) << host.protocol_error;
      EXPECT_EQ(host.tree_forwards > 0, trees == 1);
      flashspec_engine_metrics m;
      flashspec_engine_metrics_init(&m);
      ASSERT_EQ(flashspec_engine_get_metrics(e, &m), FLASHSPEC_OK);
      accepted[trees] = m.accepted_tokens;
      steps[trees] = result.steps;
    }
  }
  // The tree keeps the second branch: more of its drafts are accepted,
  // fewer steps.
  EXPECT_GT(accepted[1], accepted[0]);
  EXPECT_LT(steps[1], steps[0]);
}

// A suffix drafter that indexed tokens beyond the target's vocabulary (as a
// host's propose_tree calls may) proposes trees without them or their
// subtrees, and keeps the rest.
TEST_F(TreeEngine, SuffixTreesDropNodesOutsideTheVocabulary) {
  flashspec_suffix_params sp;
  flashspec_suffix_params_init(&sp);
  sp.propose_trees = 1;
  flashspec_drafter* raw = nullptr;
  ASSERT_EQ(flashspec_drafter_create_suffix(ctx.get(), &sp, &raw), FLASHSPEC_OK) << error();
  DrafterPtr drafter(raw);
  // A sequence whose output "1 2 60 5 1 2 60 6 1 2 7 9" enters the cache
  // when the next context starts a new one: after "1 2", 60 is the likelier
  // branch, outside a vocabulary of 48.
  const int32_t big = kVocab + 12;
  const std::vector<int32_t> first = {30, 31};
  std::vector<int32_t> sequence = first;
  for (int32_t t : {1, 2, big, 5, 1, 2, big, 6, 1, 2, 7, 9}) sequence.push_back(t);
  int32_t tokens[8], parents[8], n = -1;
  ASSERT_EQ(flashspec_suffix_drafter_propose_tree(raw, first.data(), 2, 0, tokens, parents, &n), FLASHSPEC_OK);
  ASSERT_EQ(flashspec_suffix_drafter_propose_tree(raw, sequence.data(), int32_t(sequence.size()), 0, tokens, parents,
                                                  &n),
            FLASHSPEC_OK);
  const std::vector<int32_t> prompt = {40, 1, 2};
  ASSERT_EQ(flashspec_suffix_drafter_propose_tree(raw, prompt.data(), 3, 8, tokens, parents, &n), FLASHSPEC_OK);
  ASSERT_GE(n, 3);
  EXPECT_EQ(tokens[0], big);  // the host's tree has it; the engine's must not
  TreeHost host;
  EnginePtr e = engine(host, raw, 8);
  const Outcome run = generate(e.get(), prompt, 9);
  ASSERT_EQ(run.status, FLASHSPEC_OK) << run.error;
  EXPECT_EQ(run.tokens, greedy_reference(ctx.get(), head.get(), model, prompt, 9));
  EXPECT_TRUE(host.protocol_error.empty()) << host.protocol_error;  // no token outside the vocabulary
  // Of the 8 best nodes (the big token, its subtree, then 7), node 7
  // stayed: the first step is a tree step of one node.
  EXPECT_GE(host.tree_forwards, 1);
  ASSERT_FALSE(host.forward_rows.empty());
  EXPECT_EQ(host.forward_rows[0], 2);
}

// Bad trees from a TREE callback: CALLBACK naming the node; the engine
// then generates as before.
TEST_F(TreeEngine, BadTreeFromTheCallbackIsCallbackNamingTheNode) {
  struct Case {
    DecoyTreeDrafter::Fault fault;
    const char* message;
  };
  const Case cases[] = {
      {DecoyTreeDrafter::Fault::kParentSelf, "draft callback: node 2: parent 2 is outside [-1, 2)"},
      {DecoyTreeDrafter::Fault::kParentAfter, "draft callback: node 2: parent 4 is outside [-1, 2)"},
      {DecoyTreeDrafter::Fault::kParentBelow, "draft callback: node 2: parent -3 is outside [-1, 2)"},
      {DecoyTreeDrafter::Fault::kParentUnset, "draft callback: node 5: parent -2 is outside [-1, 5)"},
      {DecoyTreeDrafter::Fault::kTooMany, "draft callback: num_tokens is 7, outside [0, 6]"},
      {DecoyTreeDrafter::Fault::kReturnError, "draft callback: reported failure (returned -4)"},
  };
  const std::vector<int32_t> greedy = greedy_reference(ctx.get(), head.get(), model, kPrompts[0], 20);
  for (const Case& c : cases) {
    DecoyTreeDrafter decoy{&model};
    decoy.fault = c.fault;
    decoy.fail_at = 1;
    DrafterPtr drafter = callback_drafter(FLASHSPEC_DRAFT_TREE, DecoyTreeDrafter::draft, &decoy);
    TreeHost host;
    EnginePtr e = engine(host, drafter.get(), 6);
    const Outcome bad = generate(e.get(), kPrompts[0], 20);
    EXPECT_EQ(bad.status, FLASHSPEC_ERR_CALLBACK) << c.message;
    EXPECT_NE(bad.error.find(c.message), std::string::npos) << bad.error;
    EXPECT_EQ(bad.result.steps, 1);
    // The first step's tokens stand.
    EXPECT_EQ(bad.tokens, std::vector<int32_t>(greedy.begin(), greedy.begin() + bad.result.num_tokens));
    const Outcome good = generate(e.get(), kPrompts[0], 20);
    ASSERT_EQ(good.status, FLASHSPEC_OK) << good.error;
    EXPECT_EQ(good.tokens, greedy);
    EXPECT_TRUE(host.protocol_error.empty()) << host.protocol_error;
  }
}

TEST_F(TreeEngine, FailingKeepCallbackIsCallbackAndTheEngineGoesOn) {
  DecoyTreeDrafter decoy{&model};
  DrafterPtr drafter = callback_drafter(FLASHSPEC_DRAFT_TREE, DecoyTreeDrafter::draft, &decoy);
  TreeHost host;
  host.keep_fail_at = 1;
  EnginePtr e = engine(host, drafter.get(), 6);
  const Outcome bad = generate(e.get(), kPrompts[1], 20);
  EXPECT_EQ(bad.status, FLASHSPEC_ERR_CALLBACK);
  EXPECT_NE(bad.error.find("target keep: reported failure (returned 7)"), std::string::npos) << bad.error;
  EXPECT_EQ(bad.result.finish_reason, FLASHSPEC_FINISH_NONE);
  const Outcome good = generate(e.get(), kPrompts[1], 20);
  ASSERT_EQ(good.status, FLASHSPEC_OK) << good.error;
  EXPECT_EQ(good.tokens, greedy_reference(ctx.get(), head.get(), model, kPrompts[1], 20));
  EXPECT_TRUE(host.protocol_error.empty()) << host.protocol_error;
}

TEST_F(TreeEngine, SuffixParamsProposeTreesIsZeroOrOne) {
  flashspec_suffix_params p;
  flashspec_suffix_params_init(&p);
  EXPECT_EQ(p.propose_trees, 0);
  p.propose_trees = 2;
  flashspec_drafter* d = reinterpret_cast<flashspec_drafter*>(&p);
  EXPECT_EQ(flashspec_drafter_create_suffix(ctx.get(), &p, &d), FLASHSPEC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(error().find("params->propose_trees"), std::string::npos) << error();
  EXPECT_EQ(d, reinterpret_cast<flashspec_drafter*>(&p));
}

// ---- The batched engine -----------------------------------------------------

struct BatchTree : TreeEngine {
  BatchTargetHost host;
  std::vector<DrafterPtr> drafters;
  std::vector<std::unique_ptr<DecoyTreeDrafter>> decoys;
  std::vector<std::unique_ptr<ArgmaxChainDrafter>> chains;
  BatchEnginePtr batch;

  flashspec_drafter* drafter_of(bool tree) {
    if (tree) {
      decoys.push_back(std::make_unique<DecoyTreeDrafter>());
      decoys.back()->model = &model;
      drafters.push_back(callback_drafter(FLASHSPEC_DRAFT_TREE, DecoyTreeDrafter::draft, decoys.back().get()));
    } else {
      chains.push_back(std::make_unique<ArgmaxChainDrafter>());
      chains.back()->model = &model;
      drafters.push_back(callback_drafter(FLASHSPEC_DRAFT_TOKENS, ArgmaxChainDrafter::draft, chains.back().get()));
    }
    return drafters.back().get();
  }

  void build(CacheMode mode, int32_t k) {
    host.model = &model;
    const flashspec_arm arm{0, k};
    flashspec_batch_engine_params p;
    flashspec_batch_engine_params_init(&p);
    p.target_forward = BatchTargetHost::forward;
    p.target_rollback = mode == CacheMode::kRollback ? BatchTargetHost::rollback : nullptr;
    p.target_keep = mode == CacheMode::kKeep ? BatchTargetHost::keep : nullptr;
    p.target_user_data = &host;
    p.num_drafters = 1;
    p.arms = &arm;
    p.num_arms = 1;
    p.policy = FLASHSPEC_BANDIT_FIXED;
    flashspec_batch_engine* e = nullptr;
    ASSERT_EQ(flashspec_batch_engine_create(ctx.get(), head.get(), &p, &e), FLASHSPEC_OK) << error();
    batch.reset(e);
  }

  void add(uint64_t id, bool tree, const std::vector<int32_t>& prompt, int32_t max_tokens, float temperature,
           uint64_t seed) {
    flashspec_drafter* d = drafter_of(tree);
    flashspec_sequence_params p;
    flashspec_sequence_params_init(&p);
    p.drafters = &d;
    p.num_drafters = 1;
    p.temperature = temperature;
    p.seed = seed;
    p.request_id = id;
    p.max_tokens = max_tokens;
    ASSERT_EQ(flashspec_batch_engine_add_sequence(batch.get(), id, prompt.data(), int32_t(prompt.size()), &p),
              FLASHSPEC_OK)
        << error();
  }

  void run_to_end() {
    int32_t active = 1;
    for (int i = 0; i < 200 && active > 0; ++i) ASSERT_EQ(flashspec_batch_engine_step(batch.get(), &active), FLASHSPEC_OK) << error();
  }

  std::vector<int32_t> tokens(uint64_t id, flashspec_sequence_info* info = nullptr) {
    flashspec_sequence_info i;
    flashspec_sequence_info_init(&i);
    std::vector<int32_t> out(64, -1);
    EXPECT_EQ(flashspec_batch_engine_get_sequence(batch.get(), id, out.data(), 64, &i), FLASHSPEC_OK) << error();
    out.resize(size_t(i.num_tokens));
    if (info) *info = i;
    return out;
  }

  // The same sequence through a fresh single engine.
  Outcome single(bool tree, const std::vector<int32_t>& prompt, int32_t max_tokens, int32_t k, float temperature,
             uint64_t seed, uint64_t id) {
    DecoyTreeDrafter decoy{&model};
    ArgmaxChainDrafter chain{&model};
    DrafterPtr drafter = tree ? callback_drafter(FLASHSPEC_DRAFT_TREE, DecoyTreeDrafter::draft, &decoy)
                              : callback_drafter(FLASHSPEC_DRAFT_TOKENS, ArgmaxChainDrafter::draft, &chain);
    TreeHost target;
    EnginePtr e = engine(target, drafter.get(), k);
    Outcome run = generate(e.get(), prompt, max_tokens, temperature, seed, id);
    EXPECT_TRUE(target.protocol_error.empty()) << target.protocol_error;
    return run;
  }
};

TEST_F(BatchTree, GreedyTreeAndChainSequencesMixAndEachEqualsItsSingleRun) {
  for (CacheMode mode : {CacheMode::kKeep, CacheMode::kRollback, CacheMode::kNeither}) {
    batch.reset();
    drafters.clear();
    host = BatchTargetHost{};
    build(mode, 7);
    const bool tree[3] = {true, false, true};
    const int32_t budgets[3] = {30, 25, 12};
    for (uint64_t s = 0; s < 3; ++s) add(s, tree[s], kPrompts[s], budgets[s], 0.0f, 0);
    run_to_end();
    EXPECT_TRUE(host.protocol_error.empty()) << host.protocol_error;
    EXPECT_GT(host.tree_forwards, 0);
    if (mode == CacheMode::kKeep) EXPECT_GT(host.keeps, 0);
    for (uint64_t s = 0; s < 3; ++s) {
      flashspec_sequence_info info;
      const std::vector<int32_t> got = tokens(s, &info);
      EXPECT_EQ(info.status, FLASHSPEC_OK);
      EXPECT_EQ(got, greedy_reference(ctx.get(), head.get(), model, kPrompts[s], budgets[s])) << "sequence " << s;
      const Outcome want = single(tree[s], kPrompts[s], budgets[s], 7, 0.0f, 0, s);
      EXPECT_EQ(got, want.tokens) << "sequence " << s;
      EXPECT_EQ(info.steps, want.result.steps) << "sequence " << s;
      flashspec_engine_metrics m;
      flashspec_engine_metrics_init(&m);
      ASSERT_EQ(flashspec_batch_engine_get_sequence_metrics(batch.get(), s, &m), FLASHSPEC_OK);
      EXPECT_EQ(m.accepted_tokens, want.metrics.accepted_tokens) << "sequence " << s;
    }
  }
}

// At T > 0 a tree sequence is verified by the tree rule in either engine:
// its tokens equal its single run whatever its neighbours draft.
TEST_F(BatchTree, SampledTreeSequencesEqualTheirSingleRuns) {
  build(CacheMode::kKeep, 6);
  const bool tree[3] = {true, false, true};
  for (uint64_t s = 0; s < 3; ++s) add(s, tree[s], kPrompts[s], 20, 0.8f, 40 + s);
  run_to_end();
  EXPECT_TRUE(host.protocol_error.empty()) << host.protocol_error;
  for (uint64_t s : {uint64_t(0), uint64_t(2)}) {
    const Outcome want = single(true, kPrompts[s], 20, 6, 0.8f, 40 + s, s);
    EXPECT_EQ(tokens(s), want.tokens) << "sequence " << s;
  }
  // The chain sequence alone in its batch: its single run too.
  batch.reset();
  drafters.clear();
  host = BatchTargetHost{};
  build(CacheMode::kKeep, 6);
  add(1, false, kPrompts[1], 20, 0.8f, 41);
  run_to_end();
  EXPECT_EQ(host.tree_forwards, 0) << "no tree drafted after the first batch";
  EXPECT_EQ(tokens(1), single(false, kPrompts[1], 20, 6, 0.8f, 41, 1).tokens);
}

TEST_F(BatchTree, FailingKeepEndsThatSequenceOnly) {
  build(CacheMode::kKeep, 6);
  host.fail_keep_of = 0;
  add(0, true, kPrompts[0], 20, 0.0f, 0);
  add(1, true, kPrompts[2], 20, 0.0f, 0);
  run_to_end();
  flashspec_sequence_info info;
  tokens(0, &info);
  EXPECT_EQ(info.status, FLASHSPEC_ERR_CALLBACK);
  EXPECT_NE(std::string(flashspec_batch_engine_sequence_error(batch.get(), 0)).find("target keep: reported failure"),
            std::string::npos);
  const std::vector<int32_t> other = tokens(1, &info);
  EXPECT_EQ(info.status, FLASHSPEC_OK);
  EXPECT_EQ(other, greedy_reference(ctx.get(), head.get(), model, kPrompts[2], 20));
}

}  // namespace
