// The rules of flashspec.h that are not about one argument: struct_size
// across versions, enum values from C, alignment, aliasing of outputs,
// summaries that follow their context, overflow of draft logits, what
// last_error reports, and a context whose worker threads cannot start.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <dirent.h>
#include <string>
#include <vector>

#include "capi/params.h"
#include "support.h"

namespace {

using namespace fstest;

constexpr int64_t kVocab = 40;
constexpr int64_t kHidden = 12;

class Contracts : public ::testing::Test {
 protected:
  void SetUp() override {
    ctx_ = make_context(ContextOptions().cpu_threads(2).seed(3).max_rows(16).max_requests(4));
    Rng rng(17);
    w_ = random_matrix(FLASHSPEC_DTYPE_F32, kVocab, kHidden, rng, 0.5);
    head_ = make_head(ctx_.get(), w_.view());
    hb_.drafts = {{1, 2}, {3}};
    hb_.hidden = random_matrix(FLASHSPEC_DTYPE_F32, 5, kHidden, rng, 1.0);
    hb_.temperatures = {1.0f, 0.7f};
  }
  flashspec_context* ctx() { return ctx_.get(); }
  std::string error() { return flashspec_context_last_error(ctx()); }

  ContextPtr ctx_;
  Matrix w_;
  HeadPtr head_;
  HostBatch hb_;
};

// ---- struct_size ---------------------------------------------------------

// A struct that grew: its first published layout ended at `b`.
struct Grown {
  uint32_t struct_size;
  int32_t a;
  double b;
  int32_t c;  // appended
  float d;    // appended
};
struct GrownFirstLayout {
  uint32_t struct_size;
  int32_t a;
  double b;
};
void grown_init(Grown* g) {
  *g = Grown{sizeof(Grown), 1, 2.0, 3, 4.0f};
}

}  // namespace

template <>
struct flashspec::FirstLayout<Grown> {
  static constexpr size_t size = sizeof(GrownFirstLayout);
};

namespace {

TEST(StructSize, AnOlderCallersPrefixIsReadAndTheRestDefaulted) {
  GrownFirstLayout old{sizeof(GrownFirstLayout), 10, 20.0};
  const Grown loaded = flashspec::load_struct(reinterpret_cast<const Grown*>(&old), grown_init, "params");
  EXPECT_EQ(loaded.struct_size, sizeof(Grown));
  EXPECT_EQ(loaded.a, 10);
  EXPECT_EQ(loaded.b, 20.0);
  EXPECT_EQ(loaded.c, 3);
  EXPECT_EQ(loaded.d, 4.0f);

  Grown current{sizeof(Grown), 10, 20.0, 30, 40.0f};
  const Grown full = flashspec::load_struct(&current, grown_init, "params");
  EXPECT_EQ(full.c, 30);
  EXPECT_EQ(full.d, 40.0f);
}

TEST(StructSize, SizesBelowTheFirstOrAboveTodaysAreRefused) {
  for (uint32_t size : {0u, uint32_t(sizeof(GrownFirstLayout) - 1), uint32_t(sizeof(Grown) + 8)}) {
    Grown g{size, 1, 2.0, 3, 4.0f};
    try {
      flashspec::load_struct(&g, grown_init, "params");
      ADD_FAILURE() << "size " << size << " accepted";
    } catch (const flashspec::Error& e) {
      EXPECT_EQ(e.status(), FLASHSPEC_ERR_STRUCT_SIZE);
      EXPECT_NE(std::string(e.what()).find("params->struct_size"), std::string::npos) << e.what();
    }
  }
}

TEST(StructSize, AFilledStructIsWrittenOnlyAsFarAsTheCallersSize) {
  struct Bytes {
    GrownFirstLayout old;
    unsigned char guard[16];
  } out;
  std::memset(&out, 0xab, sizeof out);
  out.old.struct_size = sizeof(GrownFirstLayout);
  const Grown value{sizeof(Grown), 5, 6.0, 7, 8.0f};
  flashspec::store_struct(value, reinterpret_cast<Grown*>(&out.old));
  EXPECT_EQ(out.old.struct_size, sizeof(GrownFirstLayout));
  EXPECT_EQ(out.old.a, 5);
  EXPECT_EQ(out.old.b, 6.0);
  for (unsigned char byte : out.guard) EXPECT_EQ(byte, 0xab);
}

TEST(StructSize, EveryPublicStructAcceptsItsPublishedSizesOnly) {
  // No struct has grown since its first release: each accepts exactly
  // today's size, through the public entry points.
  flashspec_context_params p;
  flashspec_context_params_init(&p);
  p.backend = FLASHSPEC_BACKEND_CPU;
  flashspec_context* c = nullptr;
  p.struct_size = sizeof(p) - 4;
  EXPECT_EQ(flashspec_context_create(&p, &c), FLASHSPEC_ERR_STRUCT_SIZE);
  p.struct_size = sizeof(p) + 4;
  EXPECT_EQ(flashspec_context_create(&p, &c), FLASHSPEC_ERR_STRUCT_SIZE);
  EXPECT_EQ(c, nullptr);
  p.struct_size = sizeof(p);
  ASSERT_EQ(flashspec_context_create(&p, &c), FLASHSPEC_OK);
  flashspec_context_destroy(c);
}

// ---- enum values a C caller may store ------------------------------------

template <class Enum>
Enum enum_of(int32_t raw) {
  Enum e;
  std::memcpy(&e, &raw, sizeof e);
  return e;
}

TEST(Enums, OutOfRangeValuesAreReportedAsSignedNumbersAndNeverUsed) {
  EXPECT_STREQ(flashspec_status_string(enum_of<flashspec_status>(-1)), "unknown status");
  EXPECT_STREQ(flashspec_status_name(enum_of<flashspec_status>(-1)), "FLASHSPEC_UNKNOWN_STATUS");
  EXPECT_STREQ(flashspec_status_name(enum_of<flashspec_status>(1 << 20)), "FLASHSPEC_UNKNOWN_STATUS");
  EXPECT_TRUE(std::isnan(flashspec_rng_uniform(1, 2, 3, 0, enum_of<flashspec_rng_purpose>(-1), 0)));
  EXPECT_TRUE(std::isnan(flashspec_rng_uniform(1, 2, 3, 0, enum_of<flashspec_rng_purpose>(0), 0)));
  EXPECT_TRUE(std::isnan(flashspec_rng_uniform(1, 2, 3, 0, enum_of<flashspec_rng_purpose>(5), 0)));
  const double u = flashspec_rng_uniform(1, 2, 3, 0, FLASHSPEC_RNG_ACCEPT_UNIFORM, 0);
  EXPECT_GT(u, 0.0);
  EXPECT_LT(u, 1.0);
}

int never_called_draft(void*, flashspec_draft_call*) { return 1; }
int never_called_forward(void*, flashspec_target_call*) { return 1; }

TEST_F(Contracts, EngineEnumsFromCAreReadAsSignedIntegers) {
  flashspec_callback_drafter_params cp;
  flashspec_callback_drafter_params_init(&cp);
  cp.draft = never_called_draft;
  cp.kind = enum_of<flashspec_draft_kind>(-1);
  flashspec_drafter* d = nullptr;
  EXPECT_EQ(flashspec_drafter_create_callback(ctx(), &cp, &d), FLASHSPEC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(error().find("params->kind: unknown value -1"), std::string::npos) << error();

  flashspec_engine_params ep;
  flashspec_engine_params_init(&ep);
  ep.target_forward = never_called_forward;
  ep.policy = enum_of<flashspec_bandit_policy>(-1);
  flashspec_engine* e = nullptr;
  EXPECT_EQ(flashspec_engine_create(ctx(), head_.get(), &ep, &e), FLASHSPEC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(error().find("params->policy: unknown value -1"), std::string::npos) << error();
}

// A target whose hidden rows carry a dtype a C host could store: −1.
int forward_with_bad_dtype(void* user, flashspec_target_call* call) {
  static std::vector<float> rows;
  rows.assign(size_t(call->num_rows) * size_t(kHidden), 0.5f);
  call->hidden = flashspec_tensor_make(rows.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, call->num_rows,
                                       kHidden);
  const int32_t bad = *static_cast<const int32_t*>(user);
  std::memcpy(&call->hidden.dtype, &bad, sizeof bad);
  return 0;
}

TEST_F(Contracts, ACallbackViewsUnknownDtypeIsACallbackError) {
  int32_t bad_dtype = -1;
  flashspec_engine_params ep;
  flashspec_engine_params_init(&ep);
  ep.target_forward = forward_with_bad_dtype;
  ep.target_user_data = &bad_dtype;
  flashspec_engine* raw = nullptr;
  ASSERT_EQ(flashspec_engine_create(ctx(), head_.get(), &ep, &raw), FLASHSPEC_OK) << error();
  EnginePtr engine(raw);
  const int32_t prompt[] = {1, 2};
  flashspec_generate_result result;
  flashspec_generate_result_init(&result);
  EXPECT_EQ(flashspec_engine_generate(engine.get(), prompt, 2, nullptr, nullptr, 0, &result), FLASHSPEC_ERR_CALLBACK);
  EXPECT_NE(error().find("target forward: hidden: unknown dtype -1"), std::string::npos) << error();
}

// ---- alignment -----------------------------------------------------------

TEST_F(Contracts, MisalignedSixteenBitDataIsRefused) {
  Rng rng(5);
  Matrix h = random_matrix(FLASHSPEC_DTYPE_BF16, 2, kHidden + 1, rng, 1.0);
  // Row data starting one byte into the buffer: an odd address.
  std::vector<unsigned char> bytes(size_t(h.size_bytes()) + 2);
  std::memcpy(bytes.data() + 1, h.data(), size_t(h.size_bytes()));
  flashspec_tensor t = flashspec_tensor_make(bytes.data() + 1, FLASHSPEC_DTYPE_BF16, FLASHSPEC_MEMORY_HOST, 2, kHidden);
  std::vector<int32_t> tokens(2, -7);
  EXPECT_EQ(flashspec_draft(ctx(), head_.get(), &t, nullptr, tokens.data(), nullptr), FLASHSPEC_ERR_UNSUPPORTED);
  EXPECT_NE(error().find("hidden: data is not aligned"), std::string::npos) << error();
  EXPECT_EQ(tokens, std::vector<int32_t>(2, -7));

  flashspec_lm_head* head = nullptr;
  flashspec_tensor wt = flashspec_tensor_make(bytes.data() + 1, FLASHSPEC_DTYPE_F16, FLASHSPEC_MEMORY_HOST, 2, kHidden);
  EXPECT_EQ(flashspec_lm_head_create(ctx(), &wt, FLASHSPEC_LM_HEAD_COPY, &head), FLASHSPEC_ERR_UNSUPPORTED);
  EXPECT_EQ(head, nullptr);
}

// ---- aliasing ------------------------------------------------------------

struct ResultArrays {
  std::vector<int32_t> accepted = std::vector<int32_t>(2, -9);
  std::vector<int32_t> emitted = std::vector<int32_t>(5, -9);
  std::vector<uint64_t> next = std::vector<uint64_t>(2, 0);
  flashspec_verify_result view() {
    flashspec_verify_result r;
    flashspec_verify_result_init(&r);
    r.accepted_counts = accepted.data();
    r.emitted_tokens = emitted.data();
    r.next_steps = next.data();
    return r;
  }
};

TEST_F(Contracts, OutputsThatOverlapTheBatchAreRefused) {
  hb_.steps = {4, 9};
  struct Case {
    const char* name;
    const char* output;
    void (*alias)(flashspec_verify_batch&, flashspec_verify_result&);
  };
  const Case cases[] = {
      {"emitted over draft tokens", "result->emitted_tokens",
       [](flashspec_verify_batch& b, flashspec_verify_result& r) { r.emitted_tokens = const_cast<int32_t*>(b.draft_tokens); }},
      {"emitted over offsets", "result->emitted_tokens",
       [](flashspec_verify_batch& b, flashspec_verify_result& r) { r.emitted_tokens = const_cast<int32_t*>(b.draft_offsets); }},
      {"accepted over offsets", "result->accepted_counts",
       [](flashspec_verify_batch& b, flashspec_verify_result& r) { r.accepted_counts = const_cast<int32_t*>(b.draft_offsets); }},
      {"accepted inside emitted", "result->accepted_counts",
       [](flashspec_verify_batch&, flashspec_verify_result& r) { r.accepted_counts = r.emitted_tokens + 2; }},
      {"next steps over seeds", "result->next_steps",
       [](flashspec_verify_batch& b, flashspec_verify_result& r) {
         static uint64_t seeds[2] = {1, 2};
         b.seeds = seeds;
         r.next_steps = seeds;
       }},
      {"next steps shifted over steps", "result->next_steps",
       [](flashspec_verify_batch& b, flashspec_verify_result& r) {
         static uint64_t steps[3] = {4, 9, 0};
         b.steps = steps;
         r.next_steps = steps + 1;
       }},
      {"emitted over the hidden rows", "result->emitted_tokens",
       [](flashspec_verify_batch& b, flashspec_verify_result& r) {
         r.emitted_tokens = static_cast<int32_t*>(const_cast<void*>(b.target_hidden->data));
       }},
  };
  for (const Case& c : cases) {
    flashspec_verify_batch b = hb_.view();
    ResultArrays arrays;
    flashspec_verify_result r = arrays.view();
    c.alias(b, r);
    EXPECT_EQ(flashspec_verify_and_finalize(ctx(), head_.get(), &b, &r), FLASHSPEC_ERR_INVALID_ARGUMENT) << c.name;
    // The message names the overlap; which of two overlapping outputs it
    // names first depends on where the allocator put the other arrays.
    EXPECT_NE(error().find("overlaps"), std::string::npos) << c.name << ": " << error();
    EXPECT_NE(error().find(c.output), std::string::npos) << c.name << ": " << error();
  }
  // next_steps may be the steps array itself.
  flashspec_verify_batch b = hb_.view();
  ResultArrays arrays;
  flashspec_verify_result r = arrays.view();
  r.next_steps = hb_.steps.data();
  ASSERT_EQ(flashspec_verify_and_finalize(ctx(), head_.get(), &b, &r), FLASHSPEC_OK) << error();
  EXPECT_EQ(hb_.steps, (std::vector<uint64_t>{5, 10}));
}

TEST_F(Contracts, DraftOutputsThatOverlapItsInputsAreRefused) {
  flashspec_tensor h = hb_.hidden.view();
  std::vector<int32_t> tokens(5, -7);
  std::vector<float> scores(5, 0.0f);
  EXPECT_EQ(flashspec_draft(ctx(), head_.get(), &h, nullptr, tokens.data(),
                            reinterpret_cast<float*>(tokens.data()) + 1),
            FLASHSPEC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(error().find("tokens_out: overlaps scores_out"), std::string::npos) << error();
  EXPECT_EQ(flashspec_draft(ctx(), head_.get(), &h, nullptr,
                            static_cast<int32_t*>(const_cast<void*>(h.data)), scores.data()),
            FLASHSPEC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(error().find("tokens_out: overlaps hidden"), std::string::npos) << error();
}

// ---- summaries follow their context ----------------------------------------

TEST_F(Contracts, SummariesOfAnotherContextAreRefused) {
  ContextPtr other = make_context(ContextOptions().cpu_threads(1).seed(3).max_rows(16).max_requests(4));
  flashspec_summaries* raw = nullptr;
  ASSERT_EQ(flashspec_summaries_create(other.get(), 16, 4, &raw), FLASHSPEC_OK);
  SummariesPtr foreign(raw);
  flashspec_verify_batch b = hb_.view();
  EXPECT_EQ(flashspec_verify(ctx(), head_.get(), &b, foreign.get()), FLASHSPEC_ERR_INVALID_ARGUMENT);
  EXPECT_NE(error().find("summaries: belong to another context"), std::string::npos) << error();
  ResultArrays arrays;
  flashspec_verify_result r = arrays.view();
  EXPECT_EQ(flashspec_finalize(ctx(), &b, foreign.get(), &r), FLASHSPEC_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(arrays.accepted, std::vector<int32_t>(2, -9));
}

// ---- draft logits --------------------------------------------------------

TEST_F(Contracts, DraftLogitsThatOverflowAtTheDraftTemperatureAreRefused) {
  Rng rng(9);
  hb_.has_draft_logits = true;
  hb_.draft_logits = random_matrix(FLASHSPEC_DTYPE_F32, 3, kVocab, rng, 1.0);
  hb_.draft_logits.set(1, 7, 3.0e38);  // finite, but / T_d overflows
  hb_.draft_temperatures = {0.5f, 0.5f};
  flashspec_verify_batch b = hb_.view();
  ResultArrays arrays;
  flashspec_verify_result r = arrays.view();
  EXPECT_EQ(flashspec_verify_and_finalize(ctx(), head_.get(), &b, &r), FLASHSPEC_ERR_NON_FINITE);
  EXPECT_NE(error().find("batch->draft_logits: row 1"), std::string::npos) << error();
  EXPECT_EQ(arrays.accepted, std::vector<int32_t>(2, -9));
}

TEST_F(Contracts, EmptyDraftLogitsOfABatchWithoutDraftsAreAccepted) {
  hb_.drafts = {{}, {}};
  hb_.hidden = Matrix(FLASHSPEC_DTYPE_F32, 2, kHidden);
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t c = 0; c < kHidden; ++c) hb_.hidden.set(r, c, 0.1 * double(r + c));
  flashspec_verify_batch b = hb_.view();
  static const float none = 0.0f;
  flashspec_tensor q = flashspec_tensor_make(&none, FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, 0, kVocab);
  b.draft_logits = &q;
  ResultArrays arrays;
  arrays.emitted.assign(2, -9);
  flashspec_verify_result r = arrays.view();
  ASSERT_EQ(flashspec_verify_and_finalize(ctx(), head_.get(), &b, &r), FLASHSPEC_OK) << error();
  EXPECT_EQ(arrays.accepted, (std::vector<int32_t>{0, 0}));
  for (int32_t t : arrays.emitted) EXPECT_TRUE(t >= 0 && t < kVocab) << t;
  // A [0, V'] view of another vocabulary is still refused.
  q.cols = kVocab + 1;
  EXPECT_EQ(flashspec_verify_and_finalize(ctx(), head_.get(), &b, &r), FLASHSPEC_ERR_OUT_OF_RANGE);
}

// ---- last_error ----------------------------------------------------------

TEST_F(Contracts, LastErrorReportsTheMostRecentCall) {
  std::vector<int32_t> tokens(1);
  EXPECT_EQ(flashspec_draft(ctx(), head_.get(), nullptr, nullptr, tokens.data(), nullptr), FLASHSPEC_ERR_NULL_POINTER);
  EXPECT_NE(error(), "");
  EXPECT_EQ(flashspec_context_synchronize(ctx()), FLASHSPEC_OK);
  EXPECT_EQ(error(), "");  // as the header says: "" after a call that succeeded

  // Calls without a context report on the thread's message.
  flashspec_lm_head* head = nullptr;
  flashspec_tensor w = w_.view();
  EXPECT_EQ(flashspec_lm_head_create(nullptr, &w, FLASHSPEC_LM_HEAD_COPY, &head), FLASHSPEC_ERR_NULL_POINTER);
  EXPECT_STREQ(flashspec_context_last_error(nullptr), "ctx: is NULL");
  flashspec_generate_result result;
  flashspec_generate_result_init(&result);
  EXPECT_EQ(flashspec_engine_generate(nullptr, nullptr, 0, nullptr, nullptr, 0, &result), FLASHSPEC_ERR_NULL_POINTER);
  EXPECT_STREQ(flashspec_context_last_error(nullptr), "engine: is NULL");
}

// ---- a context whose worker threads cannot start ---------------------------

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
int threads_of_this_process() {
  int count = 0;
  if (DIR* dir = opendir("/proc/self/task")) {
    while (dirent* entry = readdir(dir))
      if (entry->d_name[0] != '.') ++count;
    closedir(dir);
  }
  return count;
}

TEST(ThreadPool, ACreateThatCannotStartItsThreadsFailsAndLeavesNoneRunning) {
  // In a child process: an address-space limit leaves room for a few thread
  // stacks, not 1023; the create must return (an alarm catches a hang).
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    alarm(60);
    const int before = threads_of_this_process();
    rlimit limit{};
    getrlimit(RLIMIT_AS, &limit);
    limit.rlim_cur = rlim_t(256) << 20;  // 256 MiB; each thread stack reserves 8 MiB
    if (setrlimit(RLIMIT_AS, &limit) != 0) _exit(10);
    flashspec_context_params p;
    flashspec_context_params_init(&p);
    p.backend = FLASHSPEC_BACKEND_CPU;
    p.cpu_threads = 1024;
    p.max_rows = 4;
    p.max_requests = 4;
    flashspec_context* ctx = nullptr;
    const flashspec_status s = flashspec_context_create(&p, &ctx);
    if (s != FLASHSPEC_ERR_OUT_OF_MEMORY) _exit(11);
    if (ctx != nullptr) _exit(12);
    if (std::string(flashspec_context_last_error(nullptr)).find("params->cpu_threads") != 0) _exit(13);
    if (threads_of_this_process() != before) _exit(14);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child did not exit (signal " << WTERMSIG(status) << "; a hang ends in SIGALRM)";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10 setrlimit failed, 11 wrong status, 12 context written, 13 message does "
                                       "not name params->cpu_threads, 14 threads left running";
}
#endif

}  // namespace
