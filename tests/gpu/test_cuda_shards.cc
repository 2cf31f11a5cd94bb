// Vocabulary shards on the CUDA backend: R ranks simulated on one device,
// each rank's head a slice of W, each rank's records written straight into
// its slot of the gathered buffer ([R][rows], what an all-gather leaves).
// A sharded verify emits the tokens of the unsharded verify of the whole
// head on the same device, and sharded drafts give the same drafts, for
// slices that start anywhere (off the 4-token Philox blocks too), through
// every scan: the weight-streaming scans (≤ 16 rows, 16-bit; up to 64 on
// sm_90a), the cuBLAS chunks (more rows) and the CUDA-core scan (fp32). A
// differing request is accepted only at a near-tie of the unsharded
// summaries (the log-sum-exp is merged in another order), and counted. Malformed device records are
// reported per request, and the whole sharded step replays from a graph.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <vector>

#include "capi/handles.h"
#include "gpu_support.h"
#include "testing.h"

using namespace fstest;

namespace {

constexpr size_t kRecord = FLASHSPEC_SHARD_RECORD_BYTES;

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override { FSGPU_SKIP_WITHOUT_DEVICE(); }
};

// The heads of the slices [cuts[k], cuts[k + 1]) of w on ctx.
std::vector<HeadPtr> shard_heads(flashspec_context* ctx, const Matrix& w, const std::vector<int64_t>& cuts) {
  std::vector<HeadPtr> heads;
  const size_t esize = w.dtype == FLASHSPEC_DTYPE_F32 ? 4 : 2;
  for (size_t k = 0; k + 1 < cuts.size(); ++k) {
    flashspec_tensor slice = flashspec_tensor_make(
        static_cast<const unsigned char*>(w.data()) + size_t(cuts[k] * w.stride) * esize, w.dtype,
        FLASHSPEC_MEMORY_HOST, cuts[k + 1] - cuts[k], w.cols);
    slice.row_stride = w.stride;
    flashspec_lm_head* head = nullptr;
    EXPECT_EQ(flashspec_lm_head_create_shard(ctx, &slice, FLASHSPEC_LM_HEAD_COPY, cuts[k], w.rows, &head),
              FLASHSPEC_OK)
        << flashspec_context_last_error(ctx);
    heads.emplace_back(head);
  }
  return heads;
}

// A ragged batch of point-mass drafts in device memory: each draft the
// target's argmax (often accepted) or any token; every third request T = 0.
struct Batch {
  std::vector<int32_t> offsets{0}, tokens, parents;
  std::vector<float> temps;
  std::vector<uint64_t> seeds, ids, steps;
  Matrix h;
  int requests = 0, rows = 0;

  Batch(const Matrix& w, int num_requests, int max_n, bool tree, float temperature, Rng& rng)
      : requests(num_requests) {
    for (int r = 0; r < requests; ++r) {
      offsets.push_back(offsets.back() + rng.below(max_n + 1));
      temps.push_back(r % 3 == 2 ? 0.0f : temperature * float(0.8 + 0.2 * (r % 3)));
      seeds.push_back(0x5eed + uint64_t(r % 4));
      ids.push_back(uint64_t(r) * 7 + 3);
      steps.push_back(uint64_t(r % 6));
    }
    rows = offsets.back() + requests;
    h = random_matrix(w.dtype, rows, w.cols, rng, 1.0);
    for (int r = 0; r < requests; ++r)
      for (int j = 0; j < offsets[size_t(r + 1)] - offsets[size_t(r)]; ++j) {
        const int parent = tree ? rng.below(j + 1) - 1 : j - 1;
        if (tree) parents.push_back(parent);
        const int row = offsets[size_t(r)] + r + parent + 1;
        int32_t best = 0;
        double best_logit = -1e300;
        for (int i = 0; i < w.rows; ++i) {
          const double l = exact_logit(w, h, row, i);
          if (l > best_logit) best_logit = l, best = i;
        }
        int32_t x = rng.below(3) == 0 ? rng.below(int(w.rows)) : best;
        // Siblings carry distinct tokens (drafts s < j of this request are
        // the last j entries before this one).
        auto taken_by_sibling = [&](int32_t token) {
          for (int s = 0; s < j; ++s)
            if (parents[parents.size() - 1 - size_t(j - s)] == parent && tokens[tokens.size() - size_t(j - s)] == token)
              return true;
          return false;
        };
        while (tree && taken_by_sibling(x)) x = (x + 1) % int32_t(w.rows);
        tokens.push_back(x);
      }
    if (tokens.empty()) tokens.push_back(0);
    if (parents.empty()) parents.push_back(-1);
  }
};

struct DeviceBatch {
  DevMatrix hd;
  flashspec_tensor hv;
  Dev<int32_t> off, tok, par;
  Dev<float> temps;
  Dev<uint64_t> seeds, ids, steps;
  flashspec_verify_batch b;

  DeviceBatch(const Batch& batch, bool tree)
      : hd(batch.h), hv(hd.view()), off(batch.offsets), tok(batch.tokens), par(batch.parents), temps(batch.temps),
        seeds(batch.seeds), ids(batch.ids), steps(batch.steps) {
    flashspec_verify_batch_init(&b);
    b.memory = FLASHSPEC_MEMORY_CUDA;
    b.num_requests = batch.requests;
    b.draft_offsets = off.ptr();
    b.draft_tokens = tok.ptr();
    b.target_hidden = &hv;
    b.temperatures = temps.ptr();
    b.seeds = seeds.ptr();
    b.request_ids = ids.ptr();
    b.steps = steps.ptr();
    b.draft_parents = tree ? par.ptr() : nullptr;
  }
};

struct DeviceResult {
  Dev<int32_t> acc, emit, nodes;
  flashspec_verify_result r;
  DeviceResult(int requests, int rows) : acc(size_t(requests)), emit(size_t(rows)), nodes(size_t(rows)) {
    flashspec_verify_result_init(&r);
    r.memory = FLASHSPEC_MEMORY_CUDA;
    r.accepted_counts = acc.ptr();
    r.emitted_tokens = emit.ptr();
    r.accepted_nodes = nodes.ptr();
  }
};

#define EXPECT_OK(ctx, call)                                                                                  \
  do {                                                                                                        \
    flashspec_status st_ = (call);                                                                            \
    EXPECT_EQ(st_, FLASHSPEC_OK) << #call << ": " << flashspec_status_name(st_) << ": "                       \
                                 << flashspec_context_last_error(ctx);                                        \
  } while (0)

// The sharded verify of every rank, then the finalize of the gathered records.
void sharded_step(flashspec_context* ctx, const std::vector<HeadPtr>& heads, const flashspec_verify_batch& b,
                  int rows, unsigned char* records, const flashspec_verify_result& out) {
  for (size_t k = 0; k < heads.size(); ++k)
    FSGPU_OK(ctx, flashspec_verify_shard(ctx, heads[k].get(), &b, records + k * size_t(rows) * kRecord));
  FSGPU_OK(ctx, flashspec_finalize_shards(ctx, &b, records, int32_t(heads.size()), &out));
}

struct VerifyCase {
  flashspec_dtype dtype;
  int vocab, d, requests, max_n;
  bool tree;
  float temperature;
  std::vector<int64_t> cuts;
  bool greedy = false;  // temperature 0, said by the batch's greedy = 1 instead of an array
};

struct Outcome {
  int accepted = 0, rejections = 0;
  Outcome& operator+=(const Outcome& o) {
    accepted += o.accepted;
    rejections += o.rejections;
    return *this;
  }
};

// The test's cases together both accept and reject drafts.
void expect_accepts_and_rejects(const Outcome& o) {
  EXPECT_GT(o.accepted, 0);
  EXPECT_GT(o.rejections, 0);
}

Outcome run_sharded_verify(const VerifyCase& c) {
  Rng rng(7100 + c.vocab + c.requests * 13 + int(c.cuts.size()) + (c.tree ? 5 : 0));
  const Matrix w = random_matrix(c.dtype, c.vocab, c.d, rng, 3.0 / std::sqrt(double(c.d)));
  const Batch batch(w, c.requests, c.max_n, c.tree, c.temperature, rng);
  auto ctx = make_context(ContextOptions(FLASHSPEC_BACKEND_CUDA).seed(7).max_rows(512).max_requests(256));
  if (!ctx) return {};
  flashspec_tensor wv = w.view();
  auto whole = make_head(ctx.get(), wv, FLASHSPEC_LM_HEAD_COPY);
  std::vector<HeadPtr> heads = shard_heads(ctx.get(), w, c.cuts);
  if (!whole) return {};
  for (const HeadPtr& head : heads)
    if (!head) return {};

  DeviceBatch db(batch, c.tree);
  if (c.greedy) {
    db.b.temperatures = nullptr;
    db.b.greedy = 1;
  }
  DeviceResult unsharded(batch.requests, batch.rows), sharded(batch.requests, batch.rows);
  flashspec_summaries* sums_raw = nullptr;
  EXPECT_OK(ctx.get(), flashspec_summaries_create(ctx.get(), batch.rows, batch.requests, &sums_raw));
  SummariesPtr sums(sums_raw);
  EXPECT_OK(ctx.get(), flashspec_verify(ctx.get(), whole.get(), &db.b, sums.get()));
  EXPECT_OK(ctx.get(), flashspec_finalize(ctx.get(), &db.b, sums.get(), &unsharded.r));
  Dev<unsigned char> records(heads.size() * size_t(batch.rows) * kRecord);
  sharded_step(ctx.get(), heads, db.b, batch.rows, records.ptr(), sharded.r);
  EXPECT_OK(ctx.get(), flashspec_context_synchronize(ctx.get()));

  std::vector<flashspec::RowSummary> rs(static_cast<size_t>(batch.rows));
  if (!flashspec::cuda::read_summaries(*sums->store, batch.rows, rs.data())) {
    ADD_FAILURE() << "read_summaries";
    return {};
  }
  const std::vector<int32_t> ua = unsharded.acc.get(), ue = unsharded.emit.get(), un = unsharded.nodes.get();
  const std::vector<int32_t> sa = sharded.acc.get(), se = sharded.emit.get(), sn = sharded.nodes.get();
  int near_ties = 0, accepted = 0, rejections = 0;
  for (int r = 0; r < batch.requests; ++r) {
    const int first = batch.offsets[size_t(r)], n = batch.offsets[size_t(r + 1)] - first, row0 = first + r;
    EXPECT_GE(ua[size_t(r)], 0) << "request " << r;
    EXPECT_GE(sa[size_t(r)], 0) << "request " << r << " of the sharded verify";
    accepted += sa[size_t(r)];
    rejections += sa[size_t(r)] < n;
    bool same = ua[size_t(r)] == sa[size_t(r)];
    for (int k = 0; k <= n && same; ++k)
      same = ue[size_t(row0 + k)] == se[size_t(row0 + k)] && un[size_t(row0 + k)] == sn[size_t(row0 + k)];
    if (same) continue;
    // A near-tie in the unsharded summaries: two candidates' scores, or an
    // acceptance test's two sides, within fp32 rounding of each other.
    double margin = 1e300;
    for (int j = 0; j <= n; ++j) {
      const flashspec::RowSummary& s = rs[size_t(row0 + j)];
      margin = std::min(margin, double(s.candidate_gap));
      if (j < n && batch.temps[size_t(r)] > 0.0f && !c.tree) {
        const double log_u = std::log(flashspec_rng_uniform(batch.seeds[size_t(r)], batch.ids[size_t(r)],
                                                            batch.steps[size_t(r)], j + 1,
                                                            FLASHSPEC_RNG_ACCEPT_UNIFORM, 0));
        margin = std::min(margin, std::fabs(log_u - (double(s.draft_logit) - double(s.lse))));
      }
    }
    EXPECT_LT(margin, kNearTie) << "request " << r << " differs between sharded and unsharded verify (accepted "
                                << sa[size_t(r)] << " vs " << ua[size_t(r)] << ") without a near-tie";
    ++near_ties;
  }
  std::printf("[ shards ] verify V=%d d=%d %s rows=%d ranks=%zu %s: %d accepted, %d rejections, %d near-tie(s)\n",
              c.vocab, c.d, c.dtype == FLASHSPEC_DTYPE_F32 ? "f32" : "bf16", batch.rows, heads.size(),
              c.tree ? "tree" : "chain", accepted, rejections, near_ties);
  EXPECT_LE(near_ties, std::max(1, c.requests / 50));
  return Outcome{accepted, rejections};
}

TEST_F(Gpu, ShardedVerifyWeightStreamScan) {
  // Up to 64 rows of bf16, slices off every alignment: the weight-streaming
  // scans as the rules pick them for these small heads (the register scan
  // up to 16 rows, cuBLAS chunks beyond), then the sm_90a TMA-ring scans
  // (9–16 and 17–64 rows) made to serve them.
  Outcome all;
  for (bool rings : {false, true}) {
    std::optional<flashspec::cuda::RingScansEverywhere> everywhere;
    if (rings) everywhere.emplace();
    for (const auto& cuts : std::vector<std::vector<int64_t>>{{0, 5003}, {0, 2500, 5003}, {0, 1, 2, 3, 5003},
                                                               {0, 777, 1531, 3001, 3002, 4095, 5003}})
      for (bool tree : {false, true})
        for (int requests : {1, 4, 12})
          all += run_sharded_verify({FLASHSPEC_DTYPE_BF16, 5003, 256, requests, 3, tree, 0.9f, cuts});
  }
  expect_accepts_and_rejects(all);
}

TEST_F(Gpu, ShardedVerifyCublasChunks) {
  // Hundreds of rows: the cuBLAS chunks, a chunk boundary inside a slice.
  Outcome all;
  for (const auto& cuts : std::vector<std::vector<int64_t>>{{0, 64000, 128256}, {0, 33333, 33335, 90001, 128256}})
    all += run_sharded_verify({FLASHSPEC_DTYPE_BF16, 128256, 256, 100, 4, false, 1.0f, cuts});
  all += run_sharded_verify({FLASHSPEC_DTYPE_BF16, 20011, 128, 60, 3, true, 0.8f, {0, 10001, 20011}});
  expect_accepts_and_rejects(all);
}

TEST_F(Gpu, ShardedVerifyGreedyBatches) {
  // Hundreds of rows of a greedy batch (greedy = 1): on sm_90a the tile
  // scan, for the whole head and for each slice.
  Outcome all;
  for (const auto& cuts : std::vector<std::vector<int64_t>>{{0, 64000, 128256}, {0, 33333, 33335, 90001, 128256}}) {
    VerifyCase c{FLASHSPEC_DTYPE_BF16, 128256, 256, 100, 4, false, 0.0f, cuts};
    c.greedy = true;
    all += run_sharded_verify(c);
  }
  VerifyCase tree{FLASHSPEC_DTYPE_BF16, 20011, 128, 60, 3, true, 0.0f, {0, 10001, 20011}};
  tree.greedy = true;
  all += run_sharded_verify(tree);
  expect_accepts_and_rejects(all);
}

TEST_F(Gpu, ShardedVerifyCudaCores) {
  Outcome all;
  for (const auto& cuts : std::vector<std::vector<int64_t>>{{0, 1000, 3001}, {0, 7, 1999, 2999, 3001}})
    all += run_sharded_verify({FLASHSPEC_DTYPE_F32, 3001, 96, 40, 3, false, 1.1f, cuts});
  expect_accepts_and_rejects(all);
}

TEST_F(Gpu, ShardedDraftsMatchUnsharded) {
  for (flashspec_dtype dtype : {FLASHSPEC_DTYPE_BF16, FLASHSPEC_DTYPE_F32})
    for (int rows : {1, 7, 16, 130})
      for (float temperature : {0.0f, 0.8f}) {
        Rng rng(8100 + rows + (dtype == FLASHSPEC_DTYPE_F32 ? 1 : 0));
        const int vocab = 9001, d = 128;
        const Matrix w = random_matrix(dtype, vocab, d, rng, 3.0 / std::sqrt(double(d)));
        const Matrix h = random_matrix(dtype, rows, d, rng, 1.0);
        auto ctx = make_context(ContextOptions(FLASHSPEC_BACKEND_CUDA).seed(3).max_rows(256));
        ASSERT_TRUE(ctx);
        flashspec_tensor wv = w.view();
        auto whole = make_head(ctx.get(), wv, FLASHSPEC_LM_HEAD_COPY);
        const std::vector<int64_t> cuts = {0, 3, 4444, 4445, 9001};
        std::vector<HeadPtr> heads = shard_heads(ctx.get(), w, cuts);
        DevMatrix hd(h);
        flashspec_tensor hv = hd.view();
        flashspec_draft_params params;
        flashspec_draft_params_init(&params);
        params.memory = FLASHSPEC_MEMORY_CUDA;
        params.temperature = temperature;
        Dev<int32_t> tokens(static_cast<size_t>(rows)), sharded_tokens(static_cast<size_t>(rows));
        Dev<float> scores(static_cast<size_t>(rows)), sharded_scores(static_cast<size_t>(rows));
        Dev<unsigned char> records(heads.size() * size_t(rows) * kRecord);
        FSGPU_OK(ctx.get(), flashspec_draft(ctx.get(), whole.get(), &hv, &params, tokens.ptr(), scores.ptr()));
        for (size_t k = 0; k < heads.size(); ++k)
          FSGPU_OK(ctx.get(), flashspec_draft_shard(ctx.get(), heads[k].get(), &hv, &params,
                                                    records.ptr() + k * size_t(rows) * kRecord));
        FSGPU_OK(ctx.get(), flashspec_draft_from_shards(ctx.get(), &params, records.ptr(), int32_t(heads.size()),
                                                        rows, sharded_tokens.ptr(), sharded_scores.ptr()));
        FSGPU_OK(ctx.get(), flashspec_context_synchronize(ctx.get()));
        const std::vector<int32_t> a = tokens.get(), b = sharded_tokens.get();
        const std::vector<float> sa = scores.get(), sb = sharded_scores.get();
        for (int r = 0; r < rows; ++r) {
          EXPECT_EQ(a[size_t(r)], b[size_t(r)]) << "row " << r << " T=" << temperature << " rows=" << rows;
          ASSERT_GE(b[size_t(r)], 0);
          EXPECT_NEAR(sa[size_t(r)], sb[size_t(r)], 1e-4) << "row " << r;
        }
      }
}

TEST_F(Gpu, MalformedDeviceRecordsFailTheirRequestOnly) {
  Rng rng(9100);
  const Matrix w = random_matrix(FLASHSPEC_DTYPE_BF16, 4000, 64, rng, 0.4);
  const Batch batch(w, 6, 2, false, 0.8f, rng);
  auto ctx = make_context(ContextOptions(FLASHSPEC_BACKEND_CUDA).seed(1));
  ASSERT_TRUE(ctx);
  std::vector<HeadPtr> heads = shard_heads(ctx.get(), w, {0, 1500, 4000});
  DeviceBatch db(batch, false);
  Dev<unsigned char> records(2 * size_t(batch.rows) * kRecord);
  for (size_t k = 0; k < 2; ++k)
    FSGPU_OK(ctx.get(), flashspec_verify_shard(ctx.get(), heads[k].get(), &db.b,
                                               records.ptr() + k * size_t(batch.rows) * kRecord));
  FSGPU_OK(ctx.get(), flashspec_context_synchronize(ctx.get()));
  const std::vector<unsigned char> good = records.get();
  const int bad_request = 2, bad_row = batch.offsets[bad_request] + bad_request;

  // Another version; a gap between the slices; rank 1's records given as rank 0's.
  for (int mutation = 0; mutation < 3; ++mutation) {
    std::vector<unsigned char> gathered = good;
    flashspec::ShardRecord rec;
    unsigned char* rank1 = gathered.data() + (size_t(batch.rows) + size_t(bad_row)) * kRecord;
    std::memcpy(&rec, rank1, kRecord);
    if (mutation == 0) rec.version = 2;
    if (mutation == 1) rec.vocab_begin += 1;
    if (mutation == 2) std::memcpy(&rec, gathered.data() + size_t(bad_row) * kRecord, kRecord);
    std::memcpy(rank1, &rec, kRecord);
    records.put(gathered);
    DeviceResult out(batch.requests, batch.rows);
    FSGPU_OK(ctx.get(), flashspec_finalize_shards(ctx.get(), &db.b, records.ptr(), 2, &out.r));
    FSGPU_OK(ctx.get(), flashspec_context_synchronize(ctx.get()));
    const std::vector<int32_t> acc = out.acc.get(), emit = out.emit.get();
    for (int r = 0; r < batch.requests; ++r) {
      if (r == bad_request) {
        EXPECT_EQ(acc[size_t(r)], -1) << "mutation " << mutation;
        EXPECT_EQ(emit[size_t(bad_row)], -1);
      } else {
        EXPECT_GE(acc[size_t(r)], 0) << "mutation " << mutation << " request " << r;
      }
    }
  }

  // Draft rows: a bad record gives token −1 and NaN in that row only.
  std::vector<unsigned char> gathered = good;
  flashspec::ShardRecord rec;
  std::memcpy(&rec, gathered.data() + (size_t(batch.rows) + 1) * kRecord, kRecord);
  rec.vocab_end -= 1;
  std::memcpy(gathered.data() + (size_t(batch.rows) + 1) * kRecord, &rec, kRecord);
  records.put(gathered);
  Dev<int32_t> tokens(static_cast<size_t>(batch.rows));
  Dev<float> scores(static_cast<size_t>(batch.rows));
  flashspec_draft_params params;
  flashspec_draft_params_init(&params);
  params.memory = FLASHSPEC_MEMORY_CUDA;
  FSGPU_OK(ctx.get(), flashspec_draft_from_shards(ctx.get(), &params, records.ptr(), 2, batch.rows, tokens.ptr(),
                                                  scores.ptr()));
  const std::vector<int32_t> t = tokens.get();
  const std::vector<float> s = scores.get();
  for (int r = 0; r < batch.rows; ++r) {
    if (r == 1) {
      EXPECT_EQ(t[size_t(r)], -1);
      EXPECT_TRUE(std::isnan(s[size_t(r)]));
    } else {
      EXPECT_GE(t[size_t(r)], 0) << "row " << r;
    }
  }
}

TEST_F(Gpu, ShardedStepReplaysFromAGraph) {
  Rng rng(9200);
  const Matrix w = random_matrix(FLASHSPEC_DTYPE_BF16, 12007, 128, rng, 3.0 / std::sqrt(128.0));
  const Batch batch(w, 5, 3, false, 0.9f, rng);
  cudaStream_t stream = nullptr;
  FSGPU_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    auto ctx = make_context(ContextOptions(FLASHSPEC_BACKEND_CUDA).seed(11).cuda_stream(stream));
    ASSERT_TRUE(ctx);
    std::vector<HeadPtr> heads = shard_heads(ctx.get(), w, {0, 6001, 12007});
    DeviceBatch db(batch, false);
    DeviceResult eager(batch.requests, batch.rows), graphed(batch.requests, batch.rows);
    Dev<unsigned char> records(2 * size_t(batch.rows) * kRecord);
    sharded_step(ctx.get(), heads, db.b, batch.rows, records.ptr(), eager.r);
    FSGPU_OK(ctx.get(), flashspec_context_synchronize(ctx.get()));

    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    FSGPU_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    sharded_step(ctx.get(), heads, db.b, batch.rows, records.ptr(), graphed.r);
    FSGPU_CUDA(cudaStreamEndCapture(stream, &graph));
    FSGPU_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 3; ++replay) {
      FSGPU_CUDA(cudaGraphLaunch(exec, stream));
      FSGPU_CUDA(cudaStreamSynchronize(stream));
      EXPECT_EQ(graphed.acc.get(), eager.acc.get()) << "replay " << replay;
      EXPECT_EQ(graphed.emit.get(), eager.emit.get()) << "replay " << replay;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
}

}  // namespace
