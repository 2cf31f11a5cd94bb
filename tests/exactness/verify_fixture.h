// The fixture the speculative-verify exactness tests share: a CPU context
// seeded with the test's seed, the head it uploads, and one batch of
// requests verified on the library with every emitted token checked for
// range and for the accepted drafts.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "../common/context.h"
#include "flashspec.h"

#define FS_CHECK(call)                                                                  \
  do {                                                                                  \
    flashspec_status status_ = (call);                                                  \
    ASSERT_EQ(status_, FLASHSPEC_OK) << #call << ": " << flashspec_status_string(status_) \
                                     << " — " << flashspec_context_last_error(ctx_);    \
  } while (0)

namespace fstest {

// A hidden row of `hidden` normal entries whose logits against unit-scale
// weights have a standard deviation of about logit_scale.
inline std::vector<float> random_hidden(std::mt19937_64& rng, double logit_scale, int hidden) {
  std::normal_distribution<float> normal(0.0f, float(logit_scale / std::sqrt(double(hidden))));
  std::vector<float> h(static_cast<size_t>(hidden));
  for (float& x : h) x = normal(rng);
  return h;
}

class VerifyFixture : public ::testing::Test {
 protected:
  VerifyFixture(int hidden_size, uint64_t seed) : hidden_size_(hidden_size), seed_(seed) {}
  void SetUp() override {
    const auto options = fstest::ContextOptions().seed(seed_).max_rows(1 << 16).max_requests(1 << 14);
    ASSERT_EQ(fstest::create_context(options, &ctx_), FLASHSPEC_OK) << flashspec_context_last_error(nullptr);
  }
  void TearDown() override {
    flashspec_lm_head_destroy(head_);
    flashspec_context_destroy(ctx_);
  }

  // Verifies one batch of requests on the library; each request r has drafts
  // tokens[r], hidden rows rows[r] (n_r + 1 of them), stochastic draft logits
  // draft_logits[r] (n_r rows of V, empty for greedy drafts).
  void verify(const std::vector<std::vector<int>>& tokens, const std::vector<std::vector<float>>& rows,
              const std::vector<std::vector<float>>& draft_logits, int vocab, float temperature,
              float draft_temperature, uint64_t step, const std::vector<uint64_t>& request_ids,
              std::vector<std::vector<int>>* emitted) {
    const int32_t requests = int32_t(tokens.size());
    std::vector<int32_t> offsets(static_cast<size_t>(requests) + 1, 0), flat_tokens;
    std::vector<float> hidden, logits;
    for (int32_t r = 0; r < requests; ++r) {
      offsets[size_t(r) + 1] = offsets[size_t(r)] + int32_t(tokens[size_t(r)].size());
      flat_tokens.insert(flat_tokens.end(), tokens[size_t(r)].begin(), tokens[size_t(r)].end());
      hidden.insert(hidden.end(), rows[size_t(r)].begin(), rows[size_t(r)].end());
      logits.insert(logits.end(), draft_logits[size_t(r)].begin(), draft_logits[size_t(r)].end());
    }
    const bool stochastic = !logits.empty();
    std::vector<float> temperatures(static_cast<size_t>(requests), temperature), draft_temperatures(size_t(requests), draft_temperature);
    std::vector<uint64_t> steps(static_cast<size_t>(requests), step);
    flashspec_tensor target = flashspec_tensor_make(hidden.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST,
                                                    int64_t(hidden.size() / hidden_size_), hidden_size_);
    flashspec_tensor draft = flashspec_tensor_make(logits.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST,
                                                   offsets.back(), vocab);
    flashspec_verify_batch batch;
    flashspec_verify_batch_init(&batch);
    batch.num_requests = requests;
    batch.draft_offsets = offsets.data();
    batch.draft_tokens = flat_tokens.data();
    batch.target_hidden = &target;
    batch.draft_logits = stochastic ? &draft : nullptr;
    batch.temperatures = temperatures.data();
    batch.draft_temperatures = stochastic ? draft_temperatures.data() : nullptr;
    batch.request_ids = request_ids.data();
    batch.steps = steps.data();
    std::vector<int32_t> accepted(static_cast<size_t>(requests)), out(hidden.size() / hidden_size_);
    flashspec_verify_result result;
    flashspec_verify_result_init(&result);
    result.accepted_counts = accepted.data();
    result.emitted_tokens = out.data();
    FS_CHECK(flashspec_verify_and_finalize(ctx_, head_, &batch, &result));
    emitted->assign(size_t(requests), {});
    for (int32_t r = 0; r < requests; ++r) {
      ASSERT_GE(accepted[size_t(r)], 0);
      ASSERT_LE(accepted[size_t(r)], int32_t(tokens[size_t(r)].size()));
      const int32_t first = offsets[size_t(r)] + r;
      for (int32_t k = 0; k <= accepted[size_t(r)]; ++k) {
        ASSERT_GE(out[size_t(first + k)], 0);
        ASSERT_LT(out[size_t(first + k)], vocab);
        (*emitted)[size_t(r)].push_back(out[size_t(first + k)]);
      }
      for (int32_t k = 0; k < accepted[size_t(r)]; ++k) ASSERT_EQ(out[size_t(first + k)], tokens[size_t(r)][size_t(k)]);
    }
  }

  // Counts of the first two emitted tokens (y1, y2), at counts[y1·V + y2],
  // over one trial per entry of drafts: trial t verifies drafts[t] (one or
  // two tokens) from start_row, each drafted token x adding context_rows[x]
  // as the next hidden row and, for stochastic drafts, draft_z[V] then
  // draft_z[x0] as the draft logits; a request that emitted one token goes on
  // with a bonus-only step from context_rows[y1].
  void count_first_two(const std::vector<std::vector<int>>& drafts, const std::vector<float>& start_row,
                       const std::vector<std::vector<float>>& context_rows,
                       const std::vector<std::vector<float>>& draft_z, bool stochastic, int V, float temperature,
                       float draft_temperature, std::vector<int64_t>* counts_out) {
    std::vector<int64_t>& counts = *counts_out;
    const int trials = int(drafts.size());
    const int batch = 2048;
    for (int start = 0; start < trials; start += batch) {
      const int count = std::min(batch, trials - start);
      std::vector<std::vector<int>> tokens;
      std::vector<std::vector<float>> rows, logits;
      std::vector<uint64_t> ids;
      for (int t = start; t < start + count; ++t) {
        const auto& x = drafts[size_t(t)];
        tokens.push_back(x);
        std::vector<float> r = start_row;
        for (int token : x) r.insert(r.end(), context_rows[size_t(token)].begin(), context_rows[size_t(token)].end());
        rows.push_back(r);
        std::vector<float> z;
        if (stochastic) {
          z = draft_z[size_t(V)];
          if (x.size() > 1) z.insert(z.end(), draft_z[size_t(x[0])].begin(), draft_z[size_t(x[0])].end());
        }
        logits.push_back(z);
        ids.push_back(uint64_t(t));
      }
      std::vector<std::vector<int>> first;
      ASSERT_NO_FATAL_FAILURE(verify(tokens, rows, logits, V, temperature, draft_temperature, 0, ids, &first));
      // Requests that stopped after one token continue with a bonus-only step.
      std::vector<std::vector<int>> next_tokens;
      std::vector<std::vector<float>> next_rows, next_logits;
      std::vector<uint64_t> next_ids;
      std::vector<int> waiting;
      for (int k = 0; k < count; ++k) {
        if (first[size_t(k)].size() >= 2) {
          ++counts[size_t(first[size_t(k)][0] * V + first[size_t(k)][1])];
        } else {
          waiting.push_back(k);
          next_tokens.push_back({});
          next_rows.push_back(context_rows[size_t(first[size_t(k)][0])]);
          next_logits.push_back({});
          next_ids.push_back(ids[size_t(k)]);
        }
      }
      if (waiting.empty()) continue;
      std::vector<std::vector<int>> second;
      ASSERT_NO_FATAL_FAILURE(verify(next_tokens, next_rows, next_logits, V, temperature, draft_temperature, 1, next_ids, &second));
      for (size_t w = 0; w < waiting.size(); ++w)
        ++counts[size_t(first[size_t(waiting[w])][0] * V + second[w][0])];
    }
  }

  const int hidden_size_;
  const uint64_t seed_;
  flashspec_context* ctx_ = nullptr;
  flashspec_lm_head* head_ = nullptr;
};

}  // namespace fstest
