// Thread stress: many contexts on many threads sharing one LM head (the
// header lets contexts of one device share heads), each thread running
// drafts, verifies (verify_and_finalize, and verify + finalize into its own
// summaries) and engine generations, and comparing every result with the
// one computed single-threaded first. Alongside: a thread creating and
// destroying contexts and heads, a thread calling the [thread-safe]
// functions, and a thread cancelling another thread's generation.
//
// FLASHSPEC_STRESS_ROUNDS (default 4) and FLASHSPEC_STRESS_THREADS
// (default 8) size the run; the sanitizer build runs it under ThreadSanitizer
// with more rounds.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../engine/engine_support.h"

namespace {

using namespace fstest;

constexpr int32_t kVocab = 300;  // two CPU tiles of 256 tokens
constexpr int32_t kHidden = 24;
constexpr int32_t kItems = 24;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// The inputs of work item i: a draft call and a verify batch, both a
// function of i alone.
struct Item {
  // Draft.
  int32_t rows = 0;
  std::vector<float> hidden;  // [rows, d]
  std::vector<float> temperatures;
  std::vector<uint64_t> seeds, ids, steps;
  std::vector<int32_t> positions;
  // Verify.
  int32_t requests = 0;
  std::vector<int32_t> offsets, tokens;
  std::vector<float> target;  // [offsets[R] + R, d]
  std::vector<float> logits;  // [offsets[R], V] for stochastic items
  bool stochastic = false;
  std::vector<float> batch_temperatures;
  std::vector<uint64_t> batch_seeds;
  // Generation.
  std::vector<int32_t> prompt;
  float temperature = 0.0f;
  int32_t max_tokens = 0;
};

Item make_item(int32_t i) {
  Rng rng(0x51ab + uint64_t(i) * 7919);
  Item it;
  it.rows = 1 + i % 6;
  for (int32_t k = 0; k < it.rows * kHidden; ++k) it.hidden.push_back(float(rng.normal()));
  for (int32_t r = 0; r < it.rows; ++r) {
    it.temperatures.push_back(r % 3 == 0 ? 0.0f : (r % 3 == 1 ? 0.7f : 1.3f));
    it.seeds.push_back(rng.next());
    it.ids.push_back(uint64_t(i) * 100 + uint64_t(r));
    it.steps.push_back(uint64_t(r));
    it.positions.push_back(r);
  }
  it.requests = 1 + i % 4;
  it.offsets.push_back(0);
  for (int32_t r = 0; r < it.requests; ++r) it.offsets.push_back(it.offsets.back() + (i + r) % 5);
  const int32_t drafts = it.offsets.back(), rows = drafts + it.requests;
  for (int32_t k = 0; k < drafts; ++k) it.tokens.push_back(rng.below(kVocab));
  for (int32_t k = 0; k < rows * kHidden; ++k) it.target.push_back(float(rng.normal()));
  it.stochastic = (i % 2) == 1 && drafts > 0;
  if (it.stochastic)
    for (int32_t k = 0; k < drafts * kVocab; ++k) it.logits.push_back(float(rng.normal()));
  for (int32_t r = 0; r < it.requests; ++r) {
    it.batch_temperatures.push_back(r % 3 == 0 ? 0.0f : (r % 3 == 1 ? 1.0f : 0.6f));
    it.batch_seeds.push_back(rng.next());
  }
  for (int32_t k = 0; k < 3 + i % 5; ++k) it.prompt.push_back(rng.below(kVocab));
  it.temperature = i % 3 == 0 ? 0.0f : 1.0f;
  it.max_tokens = 6 + i % 7;
  return it;
}

// What item i gives.
struct Outcome {
  std::vector<int32_t> draft_tokens;
  std::vector<float> draft_scores;
  std::vector<int32_t> accepted, emitted;
  std::vector<uint64_t> next_steps;
  std::vector<int32_t> generated;
  flashspec_finish_reason finish = FLASHSPEC_FINISH_NONE;
  std::string error;  // empty: all calls succeeded
};

bool operator==(const Outcome& a, const Outcome& b) {
  return a.draft_tokens == b.draft_tokens &&
         std::memcmp(a.draft_scores.data(), b.draft_scores.data(), a.draft_scores.size() * sizeof(float)) == 0 &&
         a.draft_scores.size() == b.draft_scores.size() && a.accepted == b.accepted && a.emitted == b.emitted &&
         a.next_steps == b.next_steps && a.generated == b.generated && a.finish == b.finish && a.error == b.error;
}

// Runs item i on ctx with the shared head; verifies into `summaries` too.
Outcome run_item(const Item& it, flashspec_context* ctx, const flashspec_lm_head* head, flashspec_summaries* summaries,
                 const SyntheticModel& model) {
  Outcome out;
  auto fail = [&](const char* what, flashspec_status s) {
    out.error = std::string(what) + ": " + flashspec_status_name(s) + " " + flashspec_context_last_error(ctx);
  };
  // Draft.
  const flashspec_tensor h =
      flashspec_tensor_make(it.hidden.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, it.rows, kHidden);
  flashspec_draft_params dp;
  flashspec_draft_params_init(&dp);
  dp.temperatures = it.temperatures.data();
  dp.seeds = it.seeds.data();
  dp.request_ids = it.ids.data();
  dp.steps = it.steps.data();
  dp.positions = it.positions.data();
  out.draft_tokens.assign(size_t(it.rows), -1);
  out.draft_scores.assign(size_t(it.rows), 0.0f);
  flashspec_status s = flashspec_draft(ctx, head, &h, &dp, out.draft_tokens.data(), out.draft_scores.data());
  if (s != FLASHSPEC_OK) {
    fail("draft", s);
    return out;
  }
  // verify_and_finalize.
  const int32_t drafts = it.offsets.back(), rows = drafts + it.requests;
  const flashspec_tensor target =
      flashspec_tensor_make(it.target.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, rows, kHidden);
  const flashspec_tensor logits =
      flashspec_tensor_make(it.logits.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, drafts, kVocab);
  flashspec_verify_batch b;
  flashspec_verify_batch_init(&b);
  b.num_requests = it.requests;
  b.draft_offsets = it.offsets.data();
  b.draft_tokens = drafts > 0 ? it.tokens.data() : nullptr;
  b.target_hidden = &target;
  b.draft_logits = it.stochastic ? &logits : nullptr;
  b.temperatures = it.batch_temperatures.data();
  b.seeds = it.batch_seeds.data();
  out.accepted.assign(size_t(it.requests), -9);
  out.emitted.assign(size_t(rows), -9);
  out.next_steps.assign(size_t(it.requests), 0);
  flashspec_verify_result r;
  flashspec_verify_result_init(&r);
  r.accepted_counts = out.accepted.data();
  r.emitted_tokens = out.emitted.data();
  r.next_steps = out.next_steps.data();
  s = flashspec_verify_and_finalize(ctx, head, &b, &r);
  if (s != FLASHSPEC_OK) {
    fail("verify_and_finalize", s);
    return out;
  }
  // verify + finalize into the thread's summaries: the same outputs.
  std::vector<int32_t> accepted(size_t(it.requests), -9), emitted(size_t(rows), -9);
  flashspec_verify_result r2;
  flashspec_verify_result_init(&r2);
  r2.accepted_counts = accepted.data();
  r2.emitted_tokens = emitted.data();
  s = flashspec_verify(ctx, head, &b, summaries);
  if (s == FLASHSPEC_OK) s = flashspec_finalize(ctx, &b, summaries, &r2);
  if (s != FLASHSPEC_OK) {
    fail("verify + finalize", s);
    return out;
  }
  if (accepted != out.accepted || emitted != out.emitted) {
    out.error = "verify + finalize differs from verify_and_finalize";
    return out;
  }
  // A generation on a fresh engine (so its policy starts from nothing).
  TargetHost host;
  host.model = &model;
  flashspec_drafter* drafter = nullptr;
  s = flashspec_drafter_create_ngram(ctx, nullptr, &drafter);
  if (s != FLASHSPEC_OK) {
    fail("drafter_create_ngram", s);
    return out;
  }
  DrafterPtr drafter_owner(drafter);
  flashspec_engine_params ep;
  flashspec_engine_params_init(&ep);
  ep.target_forward = TargetHost::forward;
  ep.target_rollback = TargetHost::rollback;
  ep.target_user_data = &host;
  ep.drafters = &drafter;
  ep.num_drafters = 1;
  ep.default_draft_len = 3;
  flashspec_engine* engine = nullptr;
  s = flashspec_engine_create(ctx, head, &ep, &engine);
  if (s != FLASHSPEC_OK) {
    fail("engine_create", s);
    return out;
  }
  EnginePtr engine_owner(engine);
  flashspec_generate_params gp;
  flashspec_generate_params_init(&gp);
  gp.temperature = it.temperature;
  gp.seed = 1234;
  gp.max_tokens = it.max_tokens;
  out.generated.assign(size_t(it.max_tokens), -1);
  flashspec_generate_result res;
  flashspec_generate_result_init(&res);
  s = flashspec_engine_generate(engine, it.prompt.data(), int32_t(it.prompt.size()), &gp, out.generated.data(),
                                it.max_tokens, &res);
  if (s != FLASHSPEC_OK) {
    fail("generate", s);
    return out;
  }
  if (!host.protocol_error.empty()) out.error = "target protocol: " + host.protocol_error;
  out.generated.resize(size_t(res.num_tokens));
  out.finish = res.finish_reason;
  return out;
}

// First failure seen by any thread.
struct Failures {
  std::mutex mutex;
  std::atomic<int> count{0};
  std::string first;
  void add(const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex);
    if (count++ == 0) first = what;
  }
};

// For the canceller: a target whose forward takes a little time.
int slow_forward(void* user, flashspec_target_call* call) {
  std::this_thread::yield();
  return TargetHost::forward(user, call);
}

TEST(ThreadStress, ManyContextsShareOneHead) {
  const int rounds = env_int("FLASHSPEC_STRESS_ROUNDS", 4);
  const int workers = env_int("FLASHSPEC_STRESS_THREADS", 8);
  SyntheticModel model(kVocab, kHidden, 17, 0.5f);
  const flashspec_tensor w =
      flashspec_tensor_make(model.weight().data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, kVocab, kHidden);

  // The reference, single-threaded: one context of one CPU thread.
  ContextPtr home = make_context(ContextOptions().cpu_threads(1).seed(99).max_rows(32).max_requests(8));
  ASSERT_TRUE(home);
  HeadPtr shared = make_head(home.get(), w);
  ASSERT_TRUE(shared);
  std::vector<Item> items;
  std::vector<Outcome> expected;
  {
    SummariesPtr summaries;
    flashspec_summaries* s = nullptr;
    ASSERT_EQ(flashspec_summaries_create(home.get(), 32, 8, &s), FLASHSPEC_OK);
    summaries.reset(s);
    for (int32_t i = 0; i < kItems; ++i) {
      items.push_back(make_item(i));
      expected.push_back(run_item(items.back(), home.get(), shared.get(), summaries.get(), model));
      ASSERT_EQ(expected.back().error, "") << "item " << i;
    }
  }

  // The worker contexts (made here, used by one thread each).
  std::vector<ContextPtr> contexts;
  std::vector<SummariesPtr> summaries;
  for (int t = 0; t < workers; ++t) {
    contexts.push_back(make_context(ContextOptions().cpu_threads(1 + t % 3).seed(99).max_rows(32).max_requests(8)));
    ASSERT_TRUE(contexts.back());
    flashspec_summaries* s = nullptr;
    ASSERT_EQ(flashspec_summaries_create(contexts.back().get(), 32, 8, &s), FLASHSPEC_OK);
    summaries.emplace_back(s);
  }

  Failures failures;
  std::atomic<bool> done{false};
  std::atomic<long> checked{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < workers; ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < rounds; ++round)
        for (int32_t i = (t + round) % kItems, n = 0; n < kItems; i = (i + 1) % kItems, ++n) {
          if ((i + t) % 2 != 0) continue;  // half the items per thread and round
          const Outcome got = run_item(items[size_t(i)], contexts[size_t(t)].get(), shared.get(),
                                       summaries[size_t(t)].get(), model);
          if (!(got == expected[size_t(i)]))
            failures.add("thread " + std::to_string(t) + ", item " + std::to_string(i) + ": differs from the "
                         "single-threaded result" + (got.error.empty() ? "" : " (" + got.error + ")"));
          checked.fetch_add(1);
        }
    });

  // Churn: contexts and heads created, used and destroyed meanwhile.
  std::thread churn([&] {
    for (int k = 0; !done.load() || k < 4; ++k) {
      flashspec_context* ctx = nullptr;
      flashspec_context_params p;
      flashspec_context_params_init(&p);
      p.backend = FLASHSPEC_BACKEND_CPU;
      p.cpu_threads = 1 + k % 4;
      p.max_rows = 8;
      if (flashspec_context_create(&p, &ctx) != FLASHSPEC_OK) {
        failures.add(std::string("churn: context_create: ") + flashspec_context_last_error(nullptr));
        return;
      }
      flashspec_lm_head* head = nullptr;
      if (flashspec_lm_head_create(ctx, &w, FLASHSPEC_LM_HEAD_COPY, &head) != FLASHSPEC_OK) {
        failures.add(std::string("churn: lm_head_create: ") + flashspec_context_last_error(ctx));
      } else {
        // The churned head and the shared one give the same greedy token.
        const Item& it = items[size_t(k % kItems)];
        const flashspec_tensor h =
            flashspec_tensor_make(it.hidden.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, 1, kHidden);
        int32_t a = -1, b = -2;
        if (flashspec_draft(ctx, head, &h, nullptr, &a, nullptr) != FLASHSPEC_OK ||
            flashspec_draft(ctx, shared.get(), &h, nullptr, &b, nullptr) != FLASHSPEC_OK || a != b)
          failures.add("churn: the greedy token of a new head differs from the shared head's");
        flashspec_lm_head_destroy(head);
      }
      flashspec_context_destroy(ctx);
    }
  });

  // The [thread-safe] functions, from another thread.
  std::thread safe([&] {
    const flashspec_api* api = flashspec_get_api(FLASHSPEC_ABI_VERSION);
    for (long k = 0; !done.load() || k < 1000; ++k) {
      if (flashspec_get_api(FLASHSPEC_ABI_VERSION) != api || api->version_number() != flashspec_version_number() ||
          std::strcmp(flashspec_status_string(flashspec_status(k % 16)), api->status_string(flashspec_status(k % 16))) != 0)
        failures.add("thread-safe functions gave another answer");
      const double u = flashspec_rng_uniform(uint64_t(k), 1, 2, int32_t(k % 1024), FLASHSPEC_RNG_ACCEPT_UNIFORM, 3);
      if (!(u > 0.0 && u < 1.0)) failures.add("rng_uniform outside (0, 1)");
      flashspec_draft_params p;
      flashspec_draft_params_init(&p);
      flashspec_verify_batch b;
      flashspec_verify_batch_init(&b);
    }
  });

  // A generation cancelled from another thread: CANCELLED or OK, tokens in range.
  ContextPtr cancel_ctx = make_context(ContextOptions().cpu_threads(2).max_rows(16));
  ASSERT_TRUE(cancel_ctx);
  TargetHost cancel_host;
  cancel_host.model = &model;
  flashspec_engine_params ep;
  flashspec_engine_params_init(&ep);
  ep.target_forward = slow_forward;
  ep.target_rollback = TargetHost::rollback;
  ep.target_user_data = &cancel_host;
  flashspec_engine* cancel_engine = nullptr;
  ASSERT_EQ(flashspec_engine_create(cancel_ctx.get(), shared.get(), &ep, &cancel_engine), FLASHSPEC_OK);
  EnginePtr cancel_owner(cancel_engine);
  std::atomic<bool> generating{true};
  std::atomic<int> cancelled{0};
  std::thread generator([&] {
    for (int k = 0; k < 2 * rounds + 2; ++k) {
      const int32_t prompt[2] = {1, 2};
      std::vector<int32_t> tokens(64, -1);
      flashspec_generate_params gp;
      flashspec_generate_params_init(&gp);
      gp.max_tokens = 64;
      gp.seed = uint64_t(k);
      flashspec_generate_result res;
      flashspec_generate_result_init(&res);
      const flashspec_status s =
          flashspec_engine_generate(cancel_engine, prompt, 2, &gp, tokens.data(), 64, &res);
      if (s == FLASHSPEC_ERR_CANCELLED) {
        cancelled.fetch_add(1);
        if (res.finish_reason != FLASHSPEC_FINISH_CANCELLED) failures.add("a cancelled generation's finish reason");
      } else if (s != FLASHSPEC_OK) {
        failures.add(std::string("a generation cancelled from another thread: ") + flashspec_status_name(s));
      }
      for (int32_t j = 0; j < res.num_tokens; ++j)
        if (tokens[size_t(j)] < 0 || tokens[size_t(j)] >= kVocab) failures.add("a generated token out of range");
    }
    generating.store(false);
  });
  std::thread canceller([&] {
    while (generating.load()) {
      flashspec_engine_cancel(cancel_engine);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });

  for (std::thread& t : threads) t.join();
  done.store(true);
  churn.join();
  safe.join();
  generator.join();
  canceller.join();
  EXPECT_EQ(failures.count.load(), 0) << failures.count.load() << " failures; first: " << failures.first;
  EXPECT_GT(checked.load(), 0);
  std::printf("%ld items checked on %d threads over %d rounds; %d of %d generations cancelled\n", checked.load(),
              workers, rounds, cancelled.load(), 2 * rounds + 2);
  // Destroy order: engines, summaries and heads before their contexts.
  cancel_owner.reset();
  summaries.clear();
}

}  // namespace
