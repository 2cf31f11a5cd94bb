// The speculative engine on a CUDA context: the host's model hands back
// device rows, the engine stages its index arrays, and the tokens equal the
// CPU engine's, step for step (same seed), at T = 0 and T > 0.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdio>
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
  int fail() {
    failed = true;
    return 1;
  }
};

struct Generation {
  std::vector<int32_t> tokens;
  flashspec_engine_metrics metrics;
};

Generation generate(flashspec_backend backend, float temperature, const SyntheticModel& model) {
  Generation run;
  ContextPtr ctx = make_context(ContextOptions(backend).seed(11).max_rows(64));
  if (!ctx) return run;
  // The head is uploaded from host memory; the CUDA backend copies it to the device.
  HeadPtr head = model.make_head(ctx.get());
  flashspec_drafter* d = nullptr;
  EXPECT_EQ(flashspec_drafter_create_ngram(ctx.get(), nullptr, &d), FLASHSPEC_OK) << flashspec_context_last_error(ctx.get());
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
  return run;
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

}  // namespace
