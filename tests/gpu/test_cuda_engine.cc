// The speculative engines on a CUDA context: the host's model hands back
// device rows, the engine stages its index arrays, and the tokens equal the
// CPU engine's, step for step (same seed), at T = 0 and T > 0 — for the
// single engine and for the batched engine's sequences.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdio>
#include <map>
#include <memory>
#include <vector>

#include "engine_support.h"
#include "flashspec.h"

namespace {

using namespace fstest;

// The target model running "on the GPU": the synthetic model's hidden rows,
// copied into device memory as a model there would leave them.
struct DeviceTarget {
  TargetHost host;
  float* rows = nullptr;
  size_t capacity = 0;
  bool failed = false;

  ~DeviceTarget() { cudaFree(rows); }

  static int forward(void* user_data, flashspec_target_call* call) {
    auto* self = static_cast<DeviceTarget*>(user_data);
    const int rc = TargetHost::forward(&self->host, call);
    if (rc != 0) return rc;
    const size_t count = size_t(call->hidden.rows) * size_t(call->hidden.cols);
    if (count > self->capacity) {
      cudaFree(self->rows);
      self->rows = nullptr;
      if (cudaMalloc(&self->rows, count * sizeof(float)) != cudaSuccess) return self->fail();
      self->capacity = count;
    }
    if (cudaMemcpy(self->rows, call->hidden.data, count * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess)
      return self->fail();
    call->hidden.data = self->rows;
    call->hidden.memory = FLASHSPEC_MEMORY_CUDA;
    return 0;
  }
  static int rollback(void* user_data, int32_t keep) {
    return TargetHost::rollback(&static_cast<DeviceTarget*>(user_data)->host, keep);
  }
  static int keep(void* user_data, int32_t num_past, const int32_t* keep, int32_t num_keep) {
    return TargetHost::keep(&static_cast<DeviceTarget*>(user_data)->host, num_past, keep, num_keep);
  }
  int fail() {
    failed = true;
    return 1;
  }
};

struct Generation {
  std::vector<int32_t> tokens;
  flashspec_engine_metrics metrics;
  int tree_forwards = 0;
};

// trees: the drafter is a suffix drafter proposing trees, and the host keeps
// the accepted path (target_keep); else an n-gram drafter's chains.
Generation generate(flashspec_backend backend, float temperature, const SyntheticModel& model,
                    bool trees = false) {
  Generation run;
  ContextPtr ctx = make_context(ContextOptions(backend).seed(11).max_rows(64));
  if (!ctx) return run;
  // The head is uploaded from host memory; the CUDA backend copies it to the device.
  HeadPtr head = model.make_head(ctx.get());
  flashspec_drafter* d = nullptr;
  if (trees) {
    flashspec_suffix_params sp;
    flashspec_suffix_params_init(&sp);
    sp.propose_trees = 1;
    sp.min_probability = 0.05;
    EXPECT_EQ(flashspec_drafter_create_suffix(ctx.get(), &sp, &d), FLASHSPEC_OK)
        << flashspec_context_last_error(ctx.get());
  } else {
    EXPECT_EQ(flashspec_drafter_create_ngram(ctx.get(), nullptr, &d), FLASHSPEC_OK)
        << flashspec_context_last_error(ctx.get());
  }
  DrafterPtr ngram(d);

  DeviceTarget device_target;
  TargetHost host_target;
  device_target.host.model = &model;
  host_target.model = &model;
  const bool cuda = backend == FLASHSPEC_BACKEND_CUDA;

  flashspec_arm arms[] = {{0, 2}, {0, 4}, {0, 6}, {-1, 0}};
  flashspec_drafter* drafters[] = {ngram.get()};
  flashspec_engine_params ep;
  flashspec_engine_params_init(&ep);
  ep.target_forward = cuda ? DeviceTarget::forward : TargetHost::forward;
  ep.target_rollback = cuda ? DeviceTarget::rollback : TargetHost::rollback;
  ep.target_user_data = cuda ? static_cast<void*>(&device_target) : static_cast<void*>(&host_target);
  if (trees) ep.target_keep = cuda ? DeviceTarget::keep : TargetHost::keep;
  ep.drafters = drafters;
  ep.num_drafters = 1;
  ep.arms = arms;
  ep.num_arms = 4;
  ep.policy = FLASHSPEC_BANDIT_UCB1;
  ep.bandit_seed = 5;
  flashspec_engine* e = nullptr;
  EXPECT_EQ(flashspec_engine_create(ctx.get(), head.get(), &ep, &e), FLASHSPEC_OK) << flashspec_context_last_error(ctx.get());
  EnginePtr engine(e);
  if (!engine) return run;

  const std::vector<int32_t> prompt = {3, 17, 5, 3, 17, 9, 22, 3, 17, 5};
  flashspec_generate_params gp;
  flashspec_generate_params_init(&gp);
  gp.temperature = temperature;
  gp.seed = 7;
  gp.max_tokens = 96;
  flashspec_generate_result result;
  flashspec_generate_result_init(&result);
  run.tokens.assign(96, -1);
  EXPECT_EQ(flashspec_engine_generate(engine.get(), prompt.data(), int32_t(prompt.size()), &gp, run.tokens.data(), 96,
                                      &result),
            FLASHSPEC_OK)
      << flashspec_context_last_error(ctx.get());
  run.tokens.resize(size_t(std::max(0, result.num_tokens)));
  EXPECT_FALSE(device_target.failed);
  EXPECT_EQ(device_target.host.protocol_error, "");
  EXPECT_EQ(host_target.protocol_error, "");
  flashspec_engine_metrics_init(&run.metrics);
  EXPECT_EQ(flashspec_engine_get_metrics(engine.get(), &run.metrics), FLASHSPEC_OK);
  run.tree_forwards = cuda ? device_target.host.tree_forwards : host_target.tree_forwards;
  return run;
}

// The batched target: one KV cache per sequence id; the ragged forward's
// hidden rows are computed on the host and, for a CUDA context, handed back
// in device memory.
struct BatchTarget {
  const SyntheticModel* model = nullptr;
  bool device = false;
  std::map<uint64_t, std::vector<int32_t>> caches;
  std::vector<float> rows;
  float* device_rows = nullptr;
  size_t capacity = 0;
  bool failed = false;

  ~BatchTarget() { cudaFree(device_rows); }

  static int forward(void* user_data, flashspec_batch_target_call* call) {
    auto* self = static_cast<BatchTarget*>(user_data);
    const int32_t d = self->model->hidden();
    self->rows.assign(size_t(call->num_rows) * size_t(d), 0.0f);
    for (int32_t s = 0; s < call->num_sequences; ++s) {
      std::vector<int32_t>& cache = self->caches[call->sequence_ids[s]];
      cache.resize(size_t(std::min<int64_t>(call->num_past[s], int64_t(cache.size()))));
      cache.insert(cache.end(), call->tokens + call->token_offsets[s], call->tokens + call->token_offsets[s + 1]);
      const int32_t num_rows = call->row_offsets[s + 1] - call->row_offsets[s];
      for (int32_t r = 0; r < num_rows; ++r)
        self->model->hidden_row(cache.data(), int32_t(cache.size()) - num_rows + 1 + r,
                                self->rows.data() + size_t(call->row_offsets[s] + r) * size_t(d));
    }
    call->hidden = flashspec_tensor_make(self->rows.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST,
                                         call->num_rows, d);
    if (!self->device) return 0;
    const size_t count = self->rows.size();
    if (count > self->capacity) {
      cudaFree(self->device_rows);
      self->device_rows = nullptr;
      if (cudaMalloc(&self->device_rows, count * sizeof(float)) != cudaSuccess) return self->fail();
      self->capacity = count;
    }
    if (cudaMemcpy(self->device_rows, self->rows.data(), count * sizeof(float), cudaMemcpyHostToDevice) !=
        cudaSuccess)
      return self->fail();
    call->hidden.data = self->device_rows;
    call->hidden.memory = FLASHSPEC_MEMORY_CUDA;
    return 0;
  }
  static int rollback(void* user_data, uint64_t id, int32_t keep) {
    auto* self = static_cast<BatchTarget*>(user_data);
    std::vector<int32_t>& cache = self->caches[id];
    cache.resize(size_t(std::max(0, std::min<int32_t>(keep, int32_t(cache.size())))));
    return 0;
  }
  int fail() {
    failed = true;
    return 1;
  }
};

struct BatchEngineDeleter {
  void operator()(flashspec_batch_engine* e) const { flashspec_batch_engine_destroy(e); }
};

// Three sequences (different prompts, seeds and budgets) through one batched
// engine; each sequence's tokens.
std::vector<std::vector<int32_t>> batch_generate(flashspec_backend backend, float temperature,
                                                 const SyntheticModel& model) {
  const std::vector<std::vector<int32_t>> prompts = {
      {3, 17, 5, 3, 17, 9, 22, 3, 17, 5}, {40, 41, 42, 40, 41, 42, 40}, {7, 1, 7, 2, 7, 1, 7, 2, 7}};
  std::vector<std::vector<int32_t>> tokens(prompts.size());
  ContextPtr ctx = make_context(ContextOptions(backend).seed(11).max_rows(64).max_requests(8));
  if (!ctx) return tokens;
  HeadPtr head = model.make_head(ctx.get());
  std::vector<DrafterPtr> drafters;
  BatchTarget target;
  target.model = &model;
  target.device = backend == FLASHSPEC_BACKEND_CUDA;
  flashspec_arm arms[] = {{0, 2}, {0, 4}, {0, 6}, {-1, 0}};
  flashspec_batch_engine_params bp;
  flashspec_batch_engine_params_init(&bp);
  bp.target_forward = BatchTarget::forward;
  bp.target_rollback = BatchTarget::rollback;
  bp.target_user_data = &target;
  bp.num_drafters = 1;
  bp.arms = arms;
  bp.num_arms = 4;
  bp.policy = FLASHSPEC_BANDIT_UCB1;
  bp.bandit_seed = 5;
  flashspec_batch_engine* e = nullptr;
  EXPECT_EQ(flashspec_batch_engine_create(ctx.get(), head.get(), &bp, &e), FLASHSPEC_OK)
      << flashspec_context_last_error(ctx.get());
  std::unique_ptr<flashspec_batch_engine, BatchEngineDeleter> engine(e);
  if (!engine) return tokens;
  std::vector<flashspec_drafter*> lists(prompts.size(), nullptr);  // one drafter per sequence
  for (size_t s = 0; s < prompts.size(); ++s) {
    EXPECT_EQ(flashspec_drafter_create_ngram(ctx.get(), nullptr, &lists[s]), FLASHSPEC_OK);
    drafters.emplace_back(lists[s]);
    flashspec_sequence_params sp;
    flashspec_sequence_params_init(&sp);
    sp.drafters = &lists[s];
    sp.num_drafters = 1;
    sp.temperature = temperature;
    sp.seed = 7 + s;
    sp.request_id = s;
    sp.max_tokens = 48 + 16 * int32_t(s);
    EXPECT_EQ(flashspec_batch_engine_add_sequence(engine.get(), 100 + s, prompts[s].data(),
                                                  int32_t(prompts[s].size()), &sp),
              FLASHSPEC_OK)
        << flashspec_context_last_error(ctx.get());
  }
  int32_t active = 1;
  for (int i = 0; i < 1000 && active > 0; ++i)
    EXPECT_EQ(flashspec_batch_engine_step(engine.get(), &active), FLASHSPEC_OK)
        << flashspec_context_last_error(ctx.get());
  for (size_t s = 0; s < prompts.size(); ++s) {
    flashspec_sequence_info info;
    flashspec_sequence_info_init(&info);
    EXPECT_EQ(flashspec_batch_engine_get_sequence(engine.get(), 100 + s, nullptr, 0, &info), FLASHSPEC_OK);
    tokens[s].assign(size_t(std::max(0, info.num_tokens)), -1);
    EXPECT_EQ(flashspec_batch_engine_get_sequence(engine.get(), 100 + s, tokens[s].data(), int32_t(tokens[s].size()),
                                                  nullptr),
              FLASHSPEC_OK);
  }
  EXPECT_FALSE(target.failed);
  engine.reset();
  return tokens;
}

class GpuEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    if (flashspec_cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: the engine's CUDA path is not exercised";
  }
};

TEST_F(GpuEngine, GreedyGenerationMatchesTheCpuEngine) {
  SyntheticModel model(97, 32, 3, 0.6f);
  Generation cpu = generate(FLASHSPEC_BACKEND_CPU, 0.0f, model);
  Generation gpu = generate(FLASHSPEC_BACKEND_CUDA, 0.0f, model);
  ASSERT_EQ(cpu.tokens.size(), 96u);
  EXPECT_EQ(gpu.tokens, cpu.tokens);
  EXPECT_EQ(gpu.metrics.accepted_tokens, cpu.metrics.accepted_tokens);
  EXPECT_GT(gpu.metrics.accepted_tokens, 0u);
  std::printf("[ engine ] CUDA, T = 0: %d tokens in %llu steps, %llu drafts accepted\n", int(gpu.tokens.size()),
              (unsigned long long)gpu.metrics.steps, (unsigned long long)gpu.metrics.accepted_tokens);
}

TEST_F(GpuEngine, SampledGenerationMatchesTheCpuEngine) {
  SyntheticModel model(97, 32, 4, 0.6f);
  Generation cpu = generate(FLASHSPEC_BACKEND_CPU, 0.8f, model);
  Generation gpu = generate(FLASHSPEC_BACKEND_CUDA, 0.8f, model);
  ASSERT_EQ(cpu.tokens.size(), 96u);
  EXPECT_EQ(gpu.tokens, cpu.tokens);
  EXPECT_EQ(gpu.metrics.steps, cpu.metrics.steps);
}

// Tree steps (a suffix drafter's trees, the host keeping the accepted path)
// on a CUDA context: the engine stages parents and accepted nodes on the
// device, and its tokens equal the CPU engine's at T = 0 and T > 0.
TEST_F(GpuEngine, TreeGenerationMatchesTheCpuEngine) {
  SyntheticModel model(97, 32, 3, 0.6f);
  for (float temperature : {0.0f, 0.8f}) {
    Generation cpu = generate(FLASHSPEC_BACKEND_CPU, temperature, model, true);
    Generation gpu = generate(FLASHSPEC_BACKEND_CUDA, temperature, model, true);
    ASSERT_EQ(cpu.tokens.size(), 96u);
    EXPECT_EQ(gpu.tokens, cpu.tokens) << "T " << temperature;
    EXPECT_EQ(gpu.metrics.steps, cpu.metrics.steps) << "T " << temperature;
    EXPECT_GT(gpu.tree_forwards, 0) << "T " << temperature;
    EXPECT_GT(gpu.metrics.accepted_tokens, 0u) << "T " << temperature;
    std::printf("[ engine ] CUDA trees, T = %.1f: %d tokens in %llu steps (%d tree forwards), %llu drafts accepted\n",
                temperature, int(gpu.tokens.size()), (unsigned long long)gpu.metrics.steps, gpu.tree_forwards,
                (unsigned long long)gpu.metrics.accepted_tokens);
  }
}

TEST_F(GpuEngine, BatchedSequencesMatchTheCpuBatchedEngine) {
  SyntheticModel model(97, 32, 3, 0.6f);
  for (float temperature : {0.0f, 0.8f}) {
    const auto cpu = batch_generate(FLASHSPEC_BACKEND_CPU, temperature, model);
    const auto gpu = batch_generate(FLASHSPEC_BACKEND_CUDA, temperature, model);
    for (size_t s = 0; s < cpu.size(); ++s) {
      EXPECT_EQ(cpu[s].size(), size_t(48 + 16 * s)) << "sequence " << s << " T " << temperature;
      EXPECT_EQ(gpu[s], cpu[s]) << "sequence " << s << " T " << temperature;
    }
  }
}

}  // namespace
