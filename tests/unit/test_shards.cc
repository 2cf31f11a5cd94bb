// Vocabulary shards on the CPU backend: R ranks simulated in one process,
// each with the head of its slice, the records gathered by memcpy. A sharded
// verify emits the same tokens as the unsharded verify of the whole head,
// and sharded drafts give the same drafts, for every way of cutting the
// vocabulary; malformed gathers and calls that would need a second exchange
// are refused with their own status.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../common/make.h"
#include "flashspec.h"

namespace {

constexpr int kHidden = 24;
constexpr int kVocab = 1000;

struct Shard {
  int64_t begin, end;
  fstest::HeadPtr head;
};

class Shards : public ::testing::Test {
 protected:
  void SetUp() override {
    ctx_ = fstest::make_context(fstest::ContextOptions().seed(99).max_rows(512).max_requests(256).cpu_threads(2));
    std::mt19937_64 rng(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    weight_.resize(size_t(kVocab) * kHidden);
    for (float& w : weight_) w = normal(rng);
    flashspec_tensor w = flashspec_tensor_make(weight_.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, kVocab, kHidden);
    whole_ = fstest::make_head(ctx_.get(), w);
  }

  std::vector<Shard> cut(const std::vector<int64_t>& bounds) {
    std::vector<Shard> shards;
    for (size_t k = 0; k + 1 < bounds.size(); ++k) {
      flashspec_tensor w = flashspec_tensor_make(weight_.data() + bounds[k] * kHidden, FLASHSPEC_DTYPE_F32,
                                                 FLASHSPEC_MEMORY_HOST, bounds[k + 1] - bounds[k], kHidden);
      flashspec_lm_head* head = nullptr;
      EXPECT_EQ(flashspec_lm_head_create_shard(ctx_.get(), &w, FLASHSPEC_LM_HEAD_COPY, bounds[k], kVocab, &head),
                FLASHSPEC_OK)
          << flashspec_context_last_error(ctx_.get());
      shards.push_back({bounds[k], bounds[k + 1], fstest::HeadPtr(head)});
    }
    return shards;
  }

  fstest::ContextPtr ctx_;
  std::vector<float> weight_;
  fstest::HeadPtr whole_;
};

const std::vector<std::vector<int64_t>> kCuts = {
    {0, kVocab}, {0, 500, kVocab}, {0, 1, 999, kVocab}, {0, 137, 256, 700, 701, kVocab}};

TEST_F(Shards, ShardedVerifyEmitsTheUnshardedTokens) {
  std::mt19937_64 rng(2);
  std::normal_distribution<float> normal(0.0f, 0.6f);
  for (const bool tree : {false, true})
  for (float temperature : {0.0f, 0.7f, 1.3f}) {
    // A ragged batch of 60 requests with 0..4 drafts each; half of the
    // drafts are the target's argmax (accepted often), half random.
    const int R = 60;
    std::vector<int32_t> offsets(1, 0), drafts;
    for (int r = 0; r < R; ++r) offsets.push_back(offsets.back() + int32_t(rng() % 5));
    const int rows = offsets.back() + R;
    std::vector<float> hidden(size_t(rows) * kHidden);
    for (float& h : hidden) h = 3.0f * normal(rng);
    auto argmax = [&](int row) {
      int best = 0;
      float best_logit = -INFINITY;
      for (int i = 0; i < kVocab; ++i) {
        float l = 0.0f;
        for (int k = 0; k < kHidden; ++k) l += hidden[size_t(row) * kHidden + size_t(k)] * weight_[size_t(i) * kHidden + size_t(k)];
        if (l > best_logit) best_logit = l, best = i;
      }
      return best;
    };
    std::vector<int32_t> parents;  // trees: node j's token is drawn by its parent's row
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < offsets[size_t(r) + 1] - offsets[size_t(r)]; ++j) {
        const int parent = tree ? int(rng() % uint64_t(j + 1)) - 1 : j - 1;
        parents.push_back(parent);
        drafts.push_back(rng() % 4 ? int32_t(argmax(offsets[size_t(r)] + r + parent + 1)) : int32_t(rng() % kVocab));
      }
    std::vector<float> temperatures(size_t(R), temperature);
    std::vector<uint64_t> steps(size_t(R), 3);
    flashspec_tensor target = flashspec_tensor_make(hidden.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, rows, kHidden);
    flashspec_verify_batch batch;
    flashspec_verify_batch_init(&batch);
    batch.num_requests = R;
    batch.draft_offsets = offsets.data();
    batch.draft_tokens = drafts.data();
    batch.target_hidden = &target;
    batch.temperatures = temperatures.data();
    batch.steps = steps.data();
    batch.draft_parents = tree ? parents.data() : nullptr;

    std::vector<int32_t> accepted(static_cast<size_t>(R)), emitted(static_cast<size_t>(rows));
    flashspec_verify_result result;
    flashspec_verify_result_init(&result);
    result.accepted_counts = accepted.data();
    result.emitted_tokens = emitted.data();
    ASSERT_EQ(flashspec_verify_and_finalize(ctx_.get(), whole_.get(), &batch, &result), FLASHSPEC_OK)
        << flashspec_context_last_error(ctx_.get());
    int accepted_total = 0;
    for (int a : accepted) accepted_total += a;
    EXPECT_GT(accepted_total, 0) << "no draft was accepted: the comparison would miss the acceptance test";

    for (const auto& bounds : kCuts) {
      SCOPED_TRACE(std::string(tree ? "tree, " : "chain, ") + "T " + std::to_string(temperature) + ", " +
                   std::to_string(bounds.size() - 1) + " shards");
      std::vector<Shard> shards = cut(bounds);
      // Each rank writes its records; the "all-gather" concatenates them.
      std::vector<unsigned char> gathered(shards.size() * size_t(rows) * FLASHSPEC_SHARD_RECORD_BYTES);
      for (size_t k = 0; k < shards.size(); ++k) {
        std::vector<unsigned char> mine(size_t(rows) * FLASHSPEC_SHARD_RECORD_BYTES);
        ASSERT_EQ(flashspec_verify_shard(ctx_.get(), shards[k].head.get(), &batch, mine.data()), FLASHSPEC_OK)
            << flashspec_context_last_error(ctx_.get());
        std::memcpy(gathered.data() + k * mine.size(), mine.data(), mine.size());
      }
      std::vector<int32_t> sharded_accepted(static_cast<size_t>(R)), sharded_emitted(static_cast<size_t>(rows));
      flashspec_verify_result sharded;
      flashspec_verify_result_init(&sharded);
      sharded.accepted_counts = sharded_accepted.data();
      sharded.emitted_tokens = sharded_emitted.data();
      ASSERT_EQ(flashspec_finalize_shards(ctx_.get(), &batch, gathered.data(), int32_t(shards.size()), &sharded),
                FLASHSPEC_OK)
          << flashspec_context_last_error(ctx_.get());
      EXPECT_EQ(sharded_accepted, accepted);
      EXPECT_EQ(sharded_emitted, emitted);
    }
  }
}

TEST_F(Shards, ShardedDraftsEqualUnshardedDrafts) {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.8f);
  const int rows = 40;
  std::vector<float> hidden(size_t(rows) * kHidden);
  for (float& h : hidden) h = normal(rng);
  std::vector<float> temperatures(static_cast<size_t>(rows));
  for (int r = 0; r < rows; ++r) temperatures[size_t(r)] = r % 3 == 0 ? 0.0f : 0.5f + 0.05f * float(r);
  flashspec_draft_params params;
  flashspec_draft_params_init(&params);
  params.temperatures = temperatures.data();
  flashspec_tensor h = flashspec_tensor_make(hidden.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, rows, kHidden);
  std::vector<int32_t> tokens(static_cast<size_t>(rows));
  std::vector<float> scores(static_cast<size_t>(rows));
  ASSERT_EQ(flashspec_draft(ctx_.get(), whole_.get(), &h, &params, tokens.data(), scores.data()), FLASHSPEC_OK);
  for (const auto& bounds : kCuts) {
    std::vector<Shard> shards = cut(bounds);
    std::vector<unsigned char> gathered(shards.size() * size_t(rows) * FLASHSPEC_SHARD_RECORD_BYTES);
    for (size_t k = 0; k < shards.size(); ++k)
      ASSERT_EQ(flashspec_draft_shard(ctx_.get(), shards[k].head.get(), &h, &params,
                                      gathered.data() + k * size_t(rows) * FLASHSPEC_SHARD_RECORD_BYTES),
                FLASHSPEC_OK)
          << flashspec_context_last_error(ctx_.get());
    std::vector<int32_t> sharded_tokens(static_cast<size_t>(rows));
    std::vector<float> sharded_scores(static_cast<size_t>(rows));
    ASSERT_EQ(flashspec_draft_from_shards(ctx_.get(), &params, gathered.data(), int32_t(shards.size()), rows,
                                          sharded_tokens.data(), sharded_scores.data()),
              FLASHSPEC_OK)
        << flashspec_context_last_error(ctx_.get());
    EXPECT_EQ(sharded_tokens, tokens);
    for (int r = 0; r < rows; ++r) EXPECT_NEAR(sharded_scores[size_t(r)], scores[size_t(r)], 1e-5) << "row " << r;
  }
}

TEST_F(Shards, MalformedGathersAndUnshardableCallsAreRefused) {
  std::vector<Shard> shards = cut({0, 400, kVocab});
  std::vector<float> hidden(3 * kHidden, 0.1f);
  std::vector<int32_t> offsets = {0, 2}, drafts = {5, 6};
  flashspec_tensor target = flashspec_tensor_make(hidden.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, 3, kHidden);
  flashspec_verify_batch batch;
  flashspec_verify_batch_init(&batch);
  batch.num_requests = 1;
  batch.draft_offsets = offsets.data();
  batch.draft_tokens = drafts.data();
  batch.target_hidden = &target;
  const size_t bytes = 3 * FLASHSPEC_SHARD_RECORD_BYTES;
  std::vector<unsigned char> gathered(2 * bytes);
  ASSERT_EQ(flashspec_verify_shard(ctx_.get(), shards[0].head.get(), &batch, gathered.data()), FLASHSPEC_OK);
  ASSERT_EQ(flashspec_verify_shard(ctx_.get(), shards[1].head.get(), &batch, gathered.data() + bytes), FLASHSPEC_OK);
  std::vector<int32_t> accepted(1, 77), emitted(3, 77);
  flashspec_verify_result result;
  flashspec_verify_result_init(&result);
  result.accepted_counts = accepted.data();
  result.emitted_tokens = emitted.data();

  auto expect_refused = [&](flashspec_status status, flashspec_status expected, const char* argument) {
    EXPECT_EQ(status, expected) << flashspec_context_last_error(ctx_.get());
    EXPECT_EQ(std::string(flashspec_context_last_error(ctx_.get())).rfind(argument, 0), 0u)
        << flashspec_context_last_error(ctx_.get());
    EXPECT_EQ(accepted, std::vector<int32_t>(1, 77));
    EXPECT_EQ(emitted, std::vector<int32_t>(3, 77));
  };
  // One rank missing: the slices do not cover the vocabulary.
  expect_refused(flashspec_finalize_shards(ctx_.get(), &batch, gathered.data(), 1, &result),
                 FLASHSPEC_ERR_INVALID_ARGUMENT, "records");
  // Ranks out of vocabulary order.
  std::vector<unsigned char> swapped(gathered.size());
  std::memcpy(swapped.data(), gathered.data() + bytes, bytes);
  std::memcpy(swapped.data() + bytes, gathered.data(), bytes);
  expect_refused(flashspec_finalize_shards(ctx_.get(), &batch, swapped.data(), 2, &result),
                 FLASHSPEC_ERR_INVALID_ARGUMENT, "records");
  // Another record version.
  std::vector<unsigned char> versioned = gathered;
  const int32_t other_version = FLASHSPEC_SHARD_RECORD_VERSION + 1;
  std::memcpy(versioned.data() + 32, &other_version, sizeof other_version);
  expect_refused(flashspec_finalize_shards(ctx_.get(), &batch, versioned.data(), 2, &result),
                 FLASHSPEC_ERR_INVALID_ARGUMENT, "records");
  expect_refused(flashspec_finalize_shards(ctx_.get(), &batch, gathered.data(), 0, &result),
                 FLASHSPEC_ERR_OUT_OF_RANGE, "num_shards");
  expect_refused(flashspec_finalize_shards(ctx_.get(), &batch, nullptr, 2, &result), FLASHSPEC_ERR_NULL_POINTER,
                 "records");
  // An output overlapping the records.
  result.emitted_tokens = reinterpret_cast<int32_t*>(gathered.data());
  EXPECT_EQ(flashspec_finalize_shards(ctx_.get(), &batch, gathered.data(), 2, &result), FLASHSPEC_ERR_INVALID_ARGUMENT);
  result.emitted_tokens = emitted.data();
  // A draft token past the global vocabulary.
  drafts[1] = kVocab;
  expect_refused(flashspec_verify_shard(ctx_.get(), shards[0].head.get(), &batch, gathered.data()),
                 FLASHSPEC_ERR_OUT_OF_RANGE, "batch->draft_tokens");
  drafts[1] = 6;

  // Calls that would need a second exchange.
  std::vector<float> q(2 * kVocab, 0.0f);
  flashspec_tensor draft_logits = flashspec_tensor_make(q.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, 2, kVocab);
  batch.draft_logits = &draft_logits;
  expect_refused(flashspec_verify_shard(ctx_.get(), shards[0].head.get(), &batch, gathered.data()),
                 FLASHSPEC_ERR_UNSUPPORTED, "batch->draft_logits");
  batch.draft_logits = nullptr;
  batch.logprobs = 1;
  expect_refused(flashspec_verify_shard(ctx_.get(), shards[0].head.get(), &batch, gathered.data()),
                 FLASHSPEC_ERR_UNSUPPORTED, "batch->logprobs");
  batch.logprobs = 0;

  // A shard head is not a whole head.
  expect_refused(flashspec_verify_and_finalize(ctx_.get(), shards[0].head.get(), &batch, &result),
                 FLASHSPEC_ERR_INVALID_ARGUMENT, "head");
  std::vector<int32_t> tokens(3, 77);
  EXPECT_EQ(flashspec_draft(ctx_.get(), shards[1].head.get(), &target, nullptr, tokens.data(), nullptr),
            FLASHSPEC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(tokens, std::vector<int32_t>(3, 77));

  // Slices outside the vocabulary.
  flashspec_tensor w = flashspec_tensor_make(weight_.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, 100, kHidden);
  flashspec_lm_head* head = nullptr;
  EXPECT_EQ(flashspec_lm_head_create_shard(ctx_.get(), &w, FLASHSPEC_LM_HEAD_COPY, 950, kVocab, &head),
            FLASHSPEC_ERR_OUT_OF_RANGE);
  EXPECT_EQ(flashspec_lm_head_create_shard(ctx_.get(), &w, FLASHSPEC_LM_HEAD_COPY, -1, kVocab, &head),
            FLASHSPEC_ERR_OUT_OF_RANGE);
  EXPECT_EQ(flashspec_lm_head_create_shard(ctx_.get(), &w, FLASHSPEC_LM_HEAD_COPY, 0, FLASHSPEC_MAX_VOCAB + 1, &head),
            FLASHSPEC_ERR_OUT_OF_RANGE);
  EXPECT_EQ(head, nullptr);
  EXPECT_EQ(flashspec_lm_head_vocab_begin(shards[1].head.get()), 400);
  EXPECT_EQ(flashspec_lm_head_global_vocab_size(shards[1].head.get()), kVocab);
  EXPECT_EQ(flashspec_lm_head_vocab_size(shards[1].head.get()), kVocab - 400);
}

}  // namespace
