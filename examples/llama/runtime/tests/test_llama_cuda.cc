// The CUDA forward and CUDA generation against the CPU's (suite llama).
// Arguments: the fixtures directory and the models directory. Exits 77
// (skipped) when there is no CUDA device or FlashSpec's CUDA backend is
// missing.
//
// Tolerance of the hidden rows: both forwards hold f32 weights and compute in
// f32; they differ only in the order of the sums (cuBLAS against OpenBLAS
// GEMMs, an online softmax against a two-pass one, device cosf/sinf within
// 2 ulp). Each such sum has a relative error of order sqrt(K) · 2^-24 ≈ 1e-6
// for K ≤ 4096, growing by a small factor per layer; the final-norm rows
// have RMS ≈ 1 (times the norm weight). A bound of 1e-3 · max(1, |row|max)
// leaves two orders of magnitude over that, while any indexing slip (a wrong
// head, pair, position or cache row) moves the rows by O(1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "flashspec.h"
#include "generate.h"
#include "model.h"
#include "model_cuda.h"
#include "model_ptr.h"
#include "tokenizer.h"

namespace {

std::string g_fixtures;
std::string g_models;

// A model on the CPU and its upload, with one session each.
struct Both {
  ModelPtr host;
  llama_session* cpu = nullptr;
  llama_cuda_model* device = nullptr;
  llama_cuda_session* cuda = nullptr;
  explicit Both(const std::string& path) : host(path) {
    char err[512] = "";
    if (host.model == nullptr) return;
    EXPECT_EQ(llama_session_create(host.model, 0, &cpu, err, sizeof err), 0) << err;
    EXPECT_EQ(llama_cuda_model_upload(host.model, nullptr, &device, err, sizeof err), 0) << err;
    if (device != nullptr) {
      EXPECT_EQ(llama_cuda_session_create(device, 0, &cuda, err, sizeof err), 0) << err;
    }
  }
  ~Both() {
    llama_cuda_session_free(cuda);
    llama_cuda_model_free(device);
    llama_session_free(cpu);
  }
  bool ok() const { return cpu != nullptr && cuda != nullptr; }
};

// The models to compare: the fixtures, and the shipped pair when present.
std::vector<std::string> model_paths() {
  std::vector<std::string> paths = {g_fixtures + "/target.gguf", g_fixtures + "/draft.gguf"};
  for (const char* name : {"/target.gguf", "/draft.gguf"})
    if (std::ifstream(g_models + name)) paths.push_back(g_models + name);
  return paths;
}

// Compares n rows of the CUDA forward (device) with the CPU's (host); prints
// the worst element.
void expect_rows_agree(const float* device_rows, const float* host_rows, int32_t n, int32_t d, const std::string& what) {
  std::vector<float> got(size_t(n) * d);
  char err[512] = "";
  ASSERT_EQ(llama_cuda_copy_to_host(got.data(), device_rows, got.size() * sizeof(float), nullptr, err, sizeof err), 0)
      << err;
  double worst = 0, scale = 1;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    scale = std::max(scale, double(std::fabs(host_rows[i])));
    const double diff = std::fabs(double(got[i]) - host_rows[i]);
    if (!(diff <= worst)) {  // NaN counts as worst
      worst = diff;
      at = i;
    }
  }
  EXPECT_LE(worst, 1e-3 * scale) << what << ": worst |cuda − cpu| = " << worst << " at row " << at / size_t(d)
                                  << ", column " << at % size_t(d) << " (cuda " << got[at] << ", cpu "
                                  << host_rows[at] << "), row scale " << scale;
}

TEST(CudaForward, MatchesTheCpuBatchedChunkedAndAfterRollback) {
  for (const std::string& path : model_paths()) {
    SCOPED_TRACE(path);
    Both m(path);
    ASSERT_TRUE(m.ok());
    const llama_hparams* hp = llama_model_hparams(m.host.model);
    const int32_t d = hp->n_embd, n = std::min<int32_t>(hp->n_ctx, 96);
    std::mt19937 rng(7);
    std::vector<int32_t> tokens(static_cast<size_t>(n));
    for (int32_t& t : tokens) t = int32_t(rng() % uint32_t(hp->n_vocab));
    char err[512] = "";
    const float* cpu = nullptr;
    const float* cuda = nullptr;
    // One batched forward of the whole sequence.
    ASSERT_EQ(llama_session_forward(m.cpu, tokens.data(), n, &cpu, err, sizeof err), 0) << err;
    ASSERT_EQ(llama_cuda_session_forward(m.cuda, tokens.data(), n, &cuda, err, sizeof err), 0) << err;
    expect_rows_agree(cuda, cpu, n, d, "batched");
    const std::vector<float> batched(cpu, cpu + size_t(n) * d);
    // Chunks of 1, 2, 3, ... tokens through the device cache, against the batched CPU rows.
    ASSERT_EQ(llama_cuda_session_truncate(m.cuda, 0, err, sizeof err), 0) << err;
    for (int32_t at = 0, chunk = 1; at < n; at += chunk, ++chunk) {
      const int32_t len = std::min(chunk, n - at);
      ASSERT_EQ(llama_cuda_session_forward(m.cuda, tokens.data() + at, len, &cuda, err, sizeof err), 0) << err;
      expect_rows_agree(cuda, batched.data() + size_t(at) * d, len, d, "chunk at " + std::to_string(at));
    }
    EXPECT_EQ(llama_cuda_session_length(m.cuda), n);
    // Rollback: wrong tokens, truncate, the right ones.
    ASSERT_EQ(llama_cuda_session_truncate(m.cuda, n / 2, err, sizeof err), 0) << err;
    const std::vector<int32_t> wrong(5, 7);
    ASSERT_EQ(llama_cuda_session_forward(m.cuda, wrong.data(), 5, &cuda, err, sizeof err), 0) << err;
    EXPECT_EQ(llama_cuda_session_tokens(m.cuda)[n / 2], 7);
    ASSERT_EQ(llama_cuda_session_truncate(m.cuda, n / 2, err, sizeof err), 0) << err;
    ASSERT_EQ(llama_cuda_session_forward(m.cuda, tokens.data() + n / 2, n - n / 2, &cuda, err, sizeof err), 0)
        << err;
    expect_rows_agree(cuda, batched.data() + size_t(n / 2) * d, n - n / 2, d, "after rollback");
    // Bad calls: a message naming the argument, the cache untouched.
    const int32_t bad[2] = {1, hp->n_vocab};
    EXPECT_NE(llama_cuda_session_forward(m.cuda, bad, 2, &cuda, err, sizeof err), 0);
    EXPECT_NE(std::string(err).find("at index 1"), std::string::npos) << err;
    EXPECT_EQ(llama_cuda_session_length(m.cuda), n);
    EXPECT_NE(llama_cuda_session_truncate(m.cuda, n + 1, err, sizeof err), 0) << "past the cached tokens";
    // Fill the cache to its capacity (the context may hold more than n):
    // one more token is refused.
    const int32_t capacity = llama_cuda_session_capacity(m.cuda);
    for (int32_t len = llama_cuda_session_length(m.cuda); len < capacity; ++len)
      ASSERT_EQ(llama_cuda_session_forward(m.cuda, tokens.data(), 1, &cuda, err, sizeof err), 0) << err;
    EXPECT_NE(llama_cuda_session_forward(m.cuda, tokens.data(), 1, &cuda, err, sizeof err), 0) << "cache is full";
    EXPECT_EQ(llama_cuda_session_length(m.cuda), capacity);
  }
}

// Device-resident token ids give the same rows as host ids.
TEST(CudaForward, DeviceTokensEqualHostTokens) {
  Both m(g_fixtures + "/target.gguf");
  ASSERT_TRUE(m.ok());
  const int32_t d = llama_model_hparams(m.host.model)->n_embd;
  const std::vector<int32_t> tokens = {1, 100, 200, 300, 100, 200};
  char err[512] = "";
  const float* cpu = nullptr;
  const float* cuda = nullptr;
  ASSERT_EQ(llama_session_forward(m.cpu, tokens.data(), 6, &cpu, err, sizeof err), 0) << err;
  ASSERT_EQ(llama_cuda_session_forward(m.cuda, tokens.data(), 3, &cuda, err, sizeof err), 0) << err;
  // Tokens 3..5 one at a time from a device copy of them.
  int32_t* device_tokens = nullptr;
  ASSERT_EQ(llama_cuda_malloc(3 * sizeof(int32_t), reinterpret_cast<void**>(&device_tokens), err, sizeof err), 0);
  ASSERT_EQ(llama_cuda_copy_to_device(device_tokens, tokens.data() + 3, 3 * sizeof(int32_t), nullptr, err, sizeof err),
            0)
      << err;
  for (int32_t i = 0; i < 3; ++i) {
    ASSERT_EQ(llama_cuda_session_forward_device(m.cuda, device_tokens + i, 1, &cuda, err, sizeof err), 0) << err;
    expect_rows_agree(cuda, cpu + size_t(3 + i) * d, 1, d, "device token " + std::to_string(i));
    EXPECT_EQ(llama_cuda_session_tokens(m.cuda)[3 + i], -1);
  }
  ASSERT_EQ(llama_cuda_session_record_tokens(m.cuda, 3, tokens.data() + 3, 3, err, sizeof err), 0) << err;
  EXPECT_EQ(std::vector<int32_t>(llama_cuda_session_tokens(m.cuda), llama_cuda_session_tokens(m.cuda) + 6), tokens);
  const int32_t bad = -1;
  EXPECT_NE(llama_cuda_session_record_tokens(m.cuda, 5, &bad, 1, err, sizeof err), 0);
  EXPECT_NE(llama_cuda_session_record_tokens(m.cuda, 5, tokens.data(), 2, err, sizeof err), 0);
  llama_cuda_free(device_tokens);
}

std::vector<int32_t> generate(llama_runner* runner, llama_mode mode, const std::vector<int32_t>& prompt,
                              int32_t max_tokens) {
  std::vector<int32_t> tokens(size_t(max_tokens), 0);
  llama_generation_stats stats;
  char err[512] = "";
  EXPECT_EQ(llama_runner_generate(runner, mode, prompt.data(), int32_t(prompt.size()), max_tokens, 0.0f, 0, -1,
                                  tokens.data(), &stats, err, sizeof err),
            0)
      << llama_mode_name(mode) << ": " << err;
  tokens.resize(size_t(stats.num_tokens));
  return tokens;
}

// The first prompt of DIR/prompts in name order, as bos + its tokens, cut to
// `keep` tokens.
std::vector<int32_t> prompt_tokens(const std::string& dir, const llama_model* model, size_t keep) {
  std::vector<std::string> names;
  if (DIR* d = opendir((dir + "/prompts").c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name.size() > 4 && name.substr(name.size() - 4) == ".txt") names.push_back(name);
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  std::vector<int32_t> prompt = {llama_model_hparams(model)->bos_token >= 0 ? llama_model_hparams(model)->bos_token : 1};
  if (names.empty()) return prompt;
  std::ifstream in(dir + "/prompts/" + names[0]);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  llama_tokenizer* t = nullptr;
  char err[512] = "";
  EXPECT_EQ(llama_tokenizer_load((dir + "/tokenizer.model").c_str(), &t, err, sizeof err), 0) << err;
  std::vector<int32_t> ids(text.size() + 16);
  int32_t count = 0;
  EXPECT_EQ(llama_tokenizer_encode(t, text.data(), text.size(), ids.data(), int32_t(ids.size()), &count, err,
                                   sizeof err),
            0)
      << err;
  llama_tokenizer_free(t);
  ids.resize(size_t(count));
  if (ids.size() + 1 > keep) ids.erase(ids.begin(), ids.end() - std::ptrdiff_t(keep - 1));
  prompt.insert(prompt.end(), ids.begin(), ids.end());
  return prompt;
}

// At T = 0 every mode on CUDA emits the CPU's plain greedy tokens; where they
// part, the message gives the position and the CPU target's logit margin
// between the two tokens there (a near-tie shows as a margin of ~1e-5).
TEST(CudaGeneration, GreedyTokensEqualTheCpuInEveryMode) {
  std::vector<std::string> dirs = {g_fixtures};
  if (std::ifstream(g_models + "/target.gguf") && std::ifstream(g_models + "/draft.gguf")) dirs.push_back(g_models);
  for (const std::string& dir : dirs) {
    SCOPED_TRACE(dir);
    ModelPtr target(dir + "/target.gguf"), draft(dir + "/draft.gguf");
    ASSERT_NE(target.model, nullptr);
    ASSERT_NE(draft.model, nullptr);
    const llama_hparams* hp = llama_model_hparams(target.model);
    const int32_t max_tokens = std::min<int32_t>(64, hp->n_ctx / 2);
    const std::vector<int32_t> prompt = prompt_tokens(dir, target.model, size_t(hp->n_ctx - max_tokens - 1));
    char err[512] = "";
    llama_runner* cpu = nullptr;
    llama_runner* cuda = nullptr;
    ASSERT_EQ(llama_runner_create(target.model, draft.model, LLAMA_DEVICE_CPU, 2, 4, &cpu, err, sizeof err), 0) << err;
    ASSERT_EQ(llama_runner_create(target.model, draft.model, LLAMA_DEVICE_CUDA, 2, 4, &cuda, err, sizeof err), 0)
        << err;
    const std::vector<int32_t> want = generate(cpu, LLAMA_MODE_PLAIN, prompt, max_tokens);
    ASSERT_EQ(want.size(), size_t(max_tokens)) << "the CPU stopped early";
    for (llama_mode mode : {LLAMA_MODE_PLAIN, LLAMA_MODE_NGRAM, LLAMA_MODE_DRAFT, LLAMA_MODE_BANDIT}) {
      const std::vector<int32_t> got = generate(cuda, mode, prompt, max_tokens);
      if (got == want) continue;
      size_t at = 0;
      while (at < got.size() && at < want.size() && got[at] == want[at]) ++at;
      std::string detail = "lengths " + std::to_string(got.size()) + " and " + std::to_string(want.size());
      if (at < got.size() && at < want.size()) {
        // The CPU target's logits of the two tokens after prompt + want[0..at).
        std::vector<int32_t> context = prompt;
        context.insert(context.end(), want.begin(), want.begin() + std::ptrdiff_t(at));
        llama_session* s = nullptr;
        const float* hidden = nullptr;
        EXPECT_EQ(llama_session_create(target.model, 0, &s, err, sizeof err), 0) << err;
        EXPECT_EQ(llama_session_forward(s, context.data(), int32_t(context.size()), &hidden, err, sizeof err), 0);
        const float* row = hidden + (context.size() - 1) * size_t(hp->n_embd);
        const float* e = llama_model_token_embedding(target.model);
        double lw = 0, lg = 0;
        for (int32_t c = 0; c < hp->n_embd; ++c) {
          lw += double(row[c]) * e[size_t(want[at]) * hp->n_embd + c];
          lg += double(row[c]) * e[size_t(got[at]) * hp->n_embd + c];
        }
        llama_session_free(s);
        detail = "first difference at token " + std::to_string(at) + ": cpu " + std::to_string(want[at]) +
                 " (logit " + std::to_string(lw) + "), cuda " + std::to_string(got[at]) + " (logit " +
                 std::to_string(lg) + "), margin " + std::to_string(lw - lg);
      }
      ADD_FAILURE() << llama_mode_name(mode) << " on CUDA differs from plain on the CPU: " << detail;
    }
    llama_runner_free(cuda);
    llama_runner_free(cpu);
  }
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s FIXTURES_DIR MODELS_DIR\n", argv[0]);
    return 2;
  }
  g_fixtures = argv[1];
  g_models = argv[2];
  if (!llama_cuda_usable()) {
    std::printf("SKIP: no CUDA device (CUDA runtime sees %d, FlashSpec's CUDA backend sees %d)\n",
                llama_cuda_device_count(), flashspec_cuda_device_count());
    return 77;
  }
  return RUN_ALL_TESTS();
}
