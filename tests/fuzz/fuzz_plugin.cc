// Fuzzes the plugin table: flashspec_get_api with any ABI version, the
// table's layout, and a program of operations run through the table on a
// few live objects (contexts, LM heads shared between contexts, summaries,
// drafters, an engine), created and destroyed in any order the header
// allows.
//
// Invariants:
//   - flashspec_get_api(v) is NULL unless v = FLASHSPEC_ABI_VERSION; then a
//     static table (the same pointer each time) whose struct_size is
//     sizeof(flashspec_api), whose abi_version is the library's, and whose
//     every entry is the exported function of that name;
//   - a call through the table returns what the direct call returns on the
//     same objects (the same status, the same outputs);
//   - every failed call leaves a message and its *out untouched.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "raw_calls.h"
#include "values.h"

using namespace fsfuzz;

namespace {

constexpr int kSlots = 3;

struct Live {
  flashspec_context* ctx[kSlots] = {};
  flashspec_lm_head* head[kSlots] = {};
  int head_ctx[kSlots] = {};      // the context a head was created on
  HostMatrix weight[kSlots];
  flashspec_summaries* summaries[kSlots] = {};
  int summaries_ctx[kSlots] = {};
  int summaries_rows[kSlots] = {};
  flashspec_drafter* drafter[kSlots] = {};
  int drafter_ctx[kSlots] = {};
  int drafter_head[kSlots] = {};  // −1: none
  flashspec_engine* engine = nullptr;
  int engine_ctx = -1, engine_head = -1;
  bool drafter_in_engine[kSlots] = {};
  int32_t max_rows[kSlots] = {};
};

const flashspec_api* api = nullptr;

void check_table() {
  FS_CHECK(api != nullptr, "flashspec_get_api(FLASHSPEC_ABI_VERSION) is NULL");
  FS_CHECK(api == flashspec_get_api(FLASHSPEC_ABI_VERSION), "flashspec_get_api gives another table each call");
  FS_CHECK(api->struct_size == sizeof(flashspec_api), "table struct_size %u, sizeof %zu", api->struct_size,
           sizeof(flashspec_api));
  FS_CHECK(api->abi_version == FLASHSPEC_ABI_VERSION && api->abi_version == flashspec_abi_version(),
           "table abi_version %u", api->abi_version);
#define FS_ENTRY(member, fn) \
  FS_CHECK(reinterpret_cast<const void*>(api->member) == reinterpret_cast<const void*>(&fn), "table entry " #member " is not " #fn)
  FS_ENTRY(version_number, flashspec_version_number);
  FS_ENTRY(version_string, flashspec_version_string);
  FS_ENTRY(status_string, flashspec_status_string);
  FS_ENTRY(context_params_init, flashspec_context_params_init);
  FS_ENTRY(context_create, flashspec_context_create);
  FS_ENTRY(context_destroy, flashspec_context_destroy);
  FS_ENTRY(context_last_error, flashspec_context_last_error);
  FS_ENTRY(context_synchronize, flashspec_context_synchronize);
  FS_ENTRY(lm_head_create, flashspec_lm_head_create);
  FS_ENTRY(lm_head_destroy, flashspec_lm_head_destroy);
  FS_ENTRY(draft_params_init, flashspec_draft_params_init);
  FS_ENTRY(draft, flashspec_draft);
  FS_ENTRY(verify_batch_init, flashspec_verify_batch_init);
  FS_ENTRY(verify_result_init, flashspec_verify_result_init);
  FS_ENTRY(summaries_create, flashspec_summaries_create);
  FS_ENTRY(summaries_destroy, flashspec_summaries_destroy);
  FS_ENTRY(verify, flashspec_verify);
  FS_ENTRY(finalize, flashspec_finalize);
  FS_ENTRY(verify_and_finalize, flashspec_verify_and_finalize);
  FS_ENTRY(ngram_params_init, flashspec_ngram_params_init);
  FS_ENTRY(drafter_create_ngram, flashspec_drafter_create_ngram);
  FS_ENTRY(callback_drafter_params_init, flashspec_callback_drafter_params_init);
  FS_ENTRY(drafter_create_callback, flashspec_drafter_create_callback);
  FS_ENTRY(drafter_destroy, flashspec_drafter_destroy);
  FS_ENTRY(engine_params_init, flashspec_engine_params_init);
  FS_ENTRY(engine_create, flashspec_engine_create);
  FS_ENTRY(engine_destroy, flashspec_engine_destroy);
  FS_ENTRY(generate_params_init, flashspec_generate_params_init);
  FS_ENTRY(generate_result_init, flashspec_generate_result_init);
  FS_ENTRY(engine_generate, flashspec_engine_generate);
  FS_ENTRY(engine_cancel, flashspec_engine_cancel);
  FS_ENTRY(engine_metrics_init, flashspec_engine_metrics_init);
  FS_ENTRY(engine_get_metrics, flashspec_engine_get_metrics);
  FS_ENTRY(engine_get_position_metrics, flashspec_engine_get_position_metrics);
  FS_ENTRY(arm_metrics_init, flashspec_arm_metrics_init);
  FS_ENTRY(engine_get_arm_metrics, flashspec_engine_get_arm_metrics);
  FS_ENTRY(engine_reset_metrics, flashspec_engine_reset_metrics);
  FS_ENTRY(abi_version_of_library, flashspec_abi_version);
  FS_ENTRY(status_name, flashspec_status_name);
  FS_ENTRY(tensor_make, flashspec_tensor_make);
  FS_ENTRY(context_last_cuda_error, flashspec_context_last_cuda_error);
  FS_ENTRY(context_backend, flashspec_context_backend);
  FS_ENTRY(cuda_device_count, flashspec_cuda_device_count);
  FS_ENTRY(lm_head_vocab_size, flashspec_lm_head_vocab_size);
  FS_ENTRY(lm_head_hidden_size, flashspec_lm_head_hidden_size);
  FS_ENTRY(philox4x32_10, flashspec_philox4x32_10);
  FS_ENTRY(rng_uniform, flashspec_rng_uniform);
#undef FS_ENTRY
}

// The *_init functions through the table fill what the direct ones fill.
template <class T>
void same_init(void (*through)(T*), void (*direct)(T*), const char* what) {
  T a, b;
  std::memset(&a, 0x5a, sizeof a);
  std::memset(&b, 0x5a, sizeof b);
  through(&a);
  direct(&b);
  FS_CHECK(std::memcmp(&a, &b, sizeof a) == 0, "%s through the table differs from the direct call", what);
  through(nullptr);
}

// A simple target for the engine: hidden = a fixed row per last token.
struct Target {
  int64_t d = 1;
  std::vector<float> rows;
  std::vector<float> table;
  static int forward(void* user, flashspec_target_call* call) {
    auto* t = static_cast<Target*>(user);
    t->rows.assign(size_t(call->num_rows * t->d), 0.0f);
    for (int32_t r = 0; r < call->num_rows; ++r) {
      const int32_t token = call->tokens[call->num_tokens - call->num_rows + r];
      for (int64_t c = 0; c < t->d; ++c) t->rows[size_t(r * t->d + c)] = t->table[size_t((token % 16) * t->d + c)];
    }
    call->hidden = flashspec_tensor_make(t->rows.data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, call->num_rows, t->d);
    return 0;
  }
};

int propose(void* user, flashspec_draft_call* call) {
  const int64_t vocab = *static_cast<int64_t*>(user);
  call->num_tokens = std::min<int32_t>(call->max_tokens, 2);
  for (int32_t i = 0; i < call->num_tokens; ++i) call->tokens[i] = int32_t((call->context_len + i) % vocab);
  return 0;
}

void expect_message(const flashspec_context* ctx, flashspec_status s, const char* call) {
  check_error_message(ctx, s, call);
  if (s != FLASHSPEC_OK)
    FS_CHECK(api->context_last_error(ctx) == flashspec_context_last_error(ctx),
             "%s: last_error through the table differs", call);
}

int pick_live(Input& in, flashspec_context* const* slots) {
  const int i = in.u8() % kSlots;
  return slots[i] ? i : -1;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  // Any ABI version: only the library's has a table.
  const uint32_t asked = in.u8() < 224 ? FLASHSPEC_ABI_VERSION : in.u32();
  const flashspec_api* t = flashspec_get_api(asked);
  FS_CHECK((asked == FLASHSPEC_ABI_VERSION) == (t != nullptr), "flashspec_get_api(%u) gave %p", asked,
           static_cast<const void*>(t));
  api = flashspec_get_api(FLASHSPEC_ABI_VERSION);
  check_table();
  same_init(api->context_params_init, flashspec_context_params_init, "context_params_init");
  same_init(api->draft_params_init, flashspec_draft_params_init, "draft_params_init");
  same_init(api->verify_batch_init, flashspec_verify_batch_init, "verify_batch_init");
  same_init(api->verify_result_init, flashspec_verify_result_init, "verify_result_init");
  same_init(api->ngram_params_init, flashspec_ngram_params_init, "ngram_params_init");
  same_init(api->callback_drafter_params_init, flashspec_callback_drafter_params_init, "callback_drafter_params_init");
  same_init(api->engine_params_init, flashspec_engine_params_init, "engine_params_init");
  same_init(api->generate_params_init, flashspec_generate_params_init, "generate_params_init");
  same_init(api->generate_result_init, flashspec_generate_result_init, "generate_result_init");
  same_init(api->engine_metrics_init, flashspec_engine_metrics_init, "engine_metrics_init");
  same_init(api->arm_metrics_init, flashspec_arm_metrics_init, "arm_metrics_init");

  Live live;
  Target target;
  int64_t drafter_vocab[kSlots] = {1, 1, 1};
  for (int op = 0; op < 24 && in.remaining() > 0; ++op) {
    const uint8_t kind = in.u8() % 16;
    const int i = in.u8() % kSlots;
    switch (kind) {
      case 0: {  // context create
        if (live.ctx[i]) break;
        flashspec_context_params p;
        api->context_params_init(&p);
        p.backend = FLASHSPEC_BACKEND_CPU;
        p.cpu_threads = int32_t(in.u8() % 3);
        p.seed = in.u64();
        p.max_rows = int32_t(4 + in.u8() % 13);
        p.max_requests = 4;
        if (in.u8() >= 240) p.max_rows = 0;  // refused
        flashspec_context* out = reinterpret_cast<flashspec_context*>(uintptr_t(0x5150));
        const flashspec_status s = api->context_create(&p, &out);
        expect_message(nullptr, s, "context_create");
        if (p.max_rows == 0) {
          FS_CHECK(s == FLASHSPEC_ERR_OUT_OF_RANGE && out == reinterpret_cast<flashspec_context*>(uintptr_t(0x5150)),
                   "context_create with max_rows 0 gave %s", name(s));
          break;
        }
        FS_CHECK(s == FLASHSPEC_OK, "context_create through the table failed: %s", name(s));
        live.ctx[i] = out;
        live.max_rows[i] = p.max_rows;
        break;
      }
      case 1: {  // context destroy, once nothing lives on it
        if (!live.ctx[i] || live.engine_ctx == i) break;
        bool used = false;
        for (int k = 0; k < kSlots; ++k)
          used = used || (live.head[k] && live.head_ctx[k] == i) || (live.summaries[k] && live.summaries_ctx[k] == i) ||
                 (live.drafter[k] && live.drafter_ctx[k] == i);
        if (used) break;
        FS_CHECK(api->context_synchronize(live.ctx[i]) == FLASHSPEC_OK, "context_synchronize failed");
        api->context_destroy(live.ctx[i]);
        live.ctx[i] = nullptr;
        break;
      }
      case 2: {  // LM head create
        const int c = pick_live(in, live.ctx);
        if (c < 0 || live.head[i]) break;
        MatrixSpec spec = read_matrix_spec(in, false);
        spec.mode = ValueMode::kNormal;
        const int64_t vocab = 1 + in.u8() % 32;
        const int64_t hidden = 1 + in.u8() % 8;
        build(live.weight[i], spec, vocab, hidden);
        const flashspec_tensor w = live.weight[i].view();
        flashspec_lm_head* out = nullptr;
        const flashspec_status s = api->lm_head_create(live.ctx[c], &w, FLASHSPEC_LM_HEAD_COPY, &out);
        expect_message(live.ctx[c], s, "lm_head_create");
        if (live.weight[i].misaligned())
          FS_CHECK(s == FLASHSPEC_ERR_UNSUPPORTED, "lm_head_create of misaligned weights through the table gave %s",
                   name(s));
        else
          FS_CHECK(s == FLASHSPEC_OK, "lm_head_create through the table failed: %s", name(s));
        if (s != FLASHSPEC_OK) break;
        live.head[i] = out;
        live.head_ctx[i] = c;
        break;
      }
      case 3: {  // LM head destroy, once no drafter or engine uses it
        if (!live.head[i] || live.engine_head == i) break;
        bool used = false;
        for (int k = 0; k < kSlots; ++k) used = used || (live.drafter[k] && live.drafter_head[k] == i);
        if (used) break;
        api->lm_head_destroy(live.head[i]);
        live.head[i] = nullptr;
        break;
      }
      case 4: {  // summaries create
        const int c = pick_live(in, live.ctx);
        if (c < 0 || live.summaries[i]) break;
        const int32_t rows = int32_t(1 + in.u8() % 16);
        flashspec_summaries* out = nullptr;
        const flashspec_status s = api->summaries_create(live.ctx[c], rows, 1 + rows / 4, &out);
        expect_message(live.ctx[c], s, "summaries_create");
        FS_CHECK(s == FLASHSPEC_OK, "summaries_create failed: %s", name(s));
        live.summaries[i] = out;
        live.summaries_ctx[i] = c;
        live.summaries_rows[i] = rows;
        break;
      }
      case 5:  // summaries destroy
        api->summaries_destroy(live.summaries[i]);
        live.summaries[i] = nullptr;
        break;
      case 6:    // draft, through the table and directly, on any context
      case 7: {  // verify_and_finalize, likewise
        const int c = pick_live(in, live.ctx);
        if (c < 0 || !live.head[i]) break;
        const HostMatrix& w = live.weight[i];
        const int32_t rows = int32_t(1 + in.u8() % 4);
        HostMatrix h;
        MatrixSpec spec = read_matrix_spec(in, false);
        spec.mode = ValueMode::kNormal;
        build(h, spec, rows, w.cols);
        const flashspec_tensor hv = h.view();
        if (kind == 6) {
          flashspec_draft_params p;
          api->draft_params_init(&p);
          p.temperature = in.u8() & 1 ? 0.0f : 0.75f;
          std::vector<int32_t> t1(static_cast<size_t>(rows), -9), t2(static_cast<size_t>(rows), -9);
          std::vector<float> s1(static_cast<size_t>(rows)), s2(static_cast<size_t>(rows));
          const flashspec_status a = api->draft(live.ctx[c], live.head[i], &hv, &p, t1.data(), s1.data());
          expect_message(live.ctx[c], a, "draft (table)");
          const flashspec_status b = flashspec_draft(live.ctx[c], live.head[i], &hv, &p, t2.data(), s2.data());
          FS_CHECK(a == b && t1 == t2 && std::memcmp(s1.data(), s2.data(), s1.size() * sizeof(float)) == 0,
                   "draft through the table (%s) differs from the direct call (%s)", name(a), name(b));
          // The hidden view is checked (alignment first) before its rows.
          if (h.misaligned()) FS_CHECK(a == FLASHSPEC_ERR_UNSUPPORTED, "draft of misaligned rows gave %s", name(a));
          else if (rows > live.max_rows[c]) FS_CHECK(a == FLASHSPEC_ERR_WORKSPACE_EXCEEDED, "draft over max_rows gave %s", name(a));
          else FS_CHECK(a == FLASHSPEC_OK, "draft failed: %s (%s)", name(a), flashspec_context_last_error(live.ctx[c]));
        } else {
          // One request of rows − 1 greedy drafts.
          std::vector<int32_t> offsets = {0, rows - 1}, drafts;
          for (int32_t k = 0; k + 1 < rows; ++k) drafts.push_back(int32_t(in.u8() % w.rows));
          flashspec_verify_batch b;
          api->verify_batch_init(&b);
          b.num_requests = 1;
          b.draft_offsets = offsets.data();
          b.draft_tokens = drafts.empty() ? nullptr : drafts.data();
          b.target_hidden = &hv;
          const float temperature = in.u8() & 1 ? 0.0f : 1.0f;
          b.temperatures = &temperature;
          std::vector<int32_t> acc1(1, -9), acc2(1, -9), em1(static_cast<size_t>(rows), -9), em2(static_cast<size_t>(rows), -9);
          flashspec_verify_result r1, r2;
          api->verify_result_init(&r1);
          api->verify_result_init(&r2);
          r1.accepted_counts = acc1.data();
          r1.emitted_tokens = em1.data();
          r2.accepted_counts = acc2.data();
          r2.emitted_tokens = em2.data();
          const flashspec_status a = api->verify_and_finalize(live.ctx[c], live.head[i], &b, &r1);
          expect_message(live.ctx[c], a, "verify_and_finalize (table)");
          const flashspec_status d = flashspec_verify_and_finalize(live.ctx[c], live.head[i], &b, &r2);
          FS_CHECK(a == d && acc1 == acc2 && em1 == em2,
                   "verify_and_finalize through the table (%s) differs from the direct call (%s)", name(a), name(d));
          // verify + finalize through the table, with summaries of the context.
          int sidx = -1;
          for (int k = 0; k < kSlots; ++k)
            if (live.summaries[k] && live.summaries_ctx[k] == c) sidx = k;
          if (sidx >= 0 && a == FLASHSPEC_OK) {
            std::vector<int32_t> acc3(1, -9), em3(static_cast<size_t>(rows), -9);
            flashspec_verify_result r3;
            api->verify_result_init(&r3);
            r3.accepted_counts = acc3.data();
            r3.emitted_tokens = em3.data();
            flashspec_status s = api->verify(live.ctx[c], live.head[i], &b, live.summaries[sidx]);
            expect_message(live.ctx[c], s, "verify (table)");
            if (rows > live.summaries_rows[sidx]) {
              FS_CHECK(s == FLASHSPEC_ERR_WORKSPACE_EXCEEDED, "verify into summaries of %d rows gave %s",
                       live.summaries_rows[sidx], name(s));
            } else {
              FS_CHECK(s == FLASHSPEC_OK, "verify through the table failed: %s", name(s));
              s = api->finalize(live.ctx[c], &b, live.summaries[sidx], &r3);
              expect_message(live.ctx[c], s, "finalize (table)");
              FS_CHECK(s == FLASHSPEC_OK && acc3 == acc1 && em3 == em1,
                       "verify + finalize through the table (%s) differs from verify_and_finalize", name(s));
            }
          }
        }
        break;
      }
      case 8: {  // drafter create
        const int c = pick_live(in, live.ctx);
        if (c < 0 || live.drafter[i]) break;
        flashspec_drafter* out = nullptr;
        flashspec_status s;
        live.drafter_head[i] = -1;
        if (in.u8() & 1) {
          flashspec_ngram_params p;
          api->ngram_params_init(&p);
          p.max_n = int32_t(1 + in.u8() % 4);
          s = api->drafter_create_ngram(live.ctx[c], &p, &out);
          expect_message(live.ctx[c], s, "drafter_create_ngram");
        } else {
          flashspec_callback_drafter_params p;
          api->callback_drafter_params_init(&p);
          p.draft = propose;
          p.user_data = &drafter_vocab[i];
          s = api->drafter_create_callback(live.ctx[c], &p, &out);
          expect_message(live.ctx[c], s, "drafter_create_callback");
        }
        FS_CHECK(s == FLASHSPEC_OK, "drafter create through the table failed: %s", name(s));
        live.drafter[i] = out;
        live.drafter_ctx[i] = c;
        break;
      }
      case 9:  // drafter destroy, unless an engine uses it
        if (live.drafter[i] && !live.drafter_in_engine[i]) {
          api->drafter_destroy(live.drafter[i]);
          live.drafter[i] = nullptr;
        }
        break;
      case 10: {  // engine create
        const int c = pick_live(in, live.ctx);
        if (c < 0 || live.engine || !live.head[i]) break;
        std::vector<flashspec_drafter*> drafters;
        std::vector<int> used;
        for (int k = 0; k < kSlots; ++k)
          if (live.drafter[k] && (in.u8() & 1)) {
            drafters.push_back(live.drafter[k]);
            used.push_back(k);
            drafter_vocab[k] = live.weight[i].rows;
          }
        target.d = live.weight[i].cols;
        target.table.resize(size_t(16 * target.d));
        Rng rng(in.u64());
        for (float& v : target.table) v = float(rng.normal());
        flashspec_engine_params p;
        api->engine_params_init(&p);
        p.target_forward = &Target::forward;
        p.target_user_data = &target;
        p.drafters = drafters.empty() ? nullptr : drafters.data();
        p.num_drafters = int32_t(drafters.size());
        p.default_draft_len = std::min(3, live.max_rows[c] - 1);
        flashspec_engine* out = nullptr;
        const flashspec_status s = api->engine_create(live.ctx[c], live.head[i], &p, &out);
        expect_message(live.ctx[c], s, "engine_create");
        FS_CHECK(s == FLASHSPEC_OK, "engine_create through the table failed: %s (%s)", name(s),
                 flashspec_context_last_error(live.ctx[c]));
        live.engine = out;
        live.engine_ctx = c;
        live.engine_head = i;
        for (int k : used) live.drafter_in_engine[k] = true;
        break;
      }
      case 11:  // engine destroy: its drafters are free again
        if (live.engine) {
          api->engine_destroy(live.engine);
          live.engine = nullptr;
          live.engine_ctx = live.engine_head = -1;
          for (bool& b : live.drafter_in_engine) b = false;
        }
        break;
      case 12:    // generate
      case 13: {  // cancel an idle engine (no effect), then generate
        if (!live.engine) break;
        if (kind == 13) api->engine_cancel(live.engine);
        const int64_t vocab = live.weight[live.engine_head].rows;
        std::vector<int32_t> prompt = {int32_t(in.u8() % vocab), int32_t(in.u8() % vocab)};
        flashspec_generate_params p;
        api->generate_params_init(&p);
        p.max_tokens = int32_t(1 + in.u8() % 8);
        p.temperature = in.u8() & 1 ? 0.0f : 1.0f;
        std::vector<int32_t> tokens(size_t(p.max_tokens), -9);
        flashspec_generate_result r;
        api->generate_result_init(&r);
        const flashspec_status s = api->engine_generate(live.engine, prompt.data(), 2, &p, tokens.data(), p.max_tokens, &r);
        expect_message(live.ctx[live.engine_ctx], s, "engine_generate (table)");
        FS_CHECK(s == FLASHSPEC_OK && r.num_tokens >= 1 && r.num_tokens <= p.max_tokens,
                 "generate through the table: %s, %d tokens (%s)", name(s), r.num_tokens,
                 flashspec_context_last_error(live.ctx[live.engine_ctx]));
        for (int32_t k = 0; k < r.num_tokens; ++k)
          FS_CHECK(tokens[size_t(k)] >= 0 && tokens[size_t(k)] < vocab, "generated token %d out of range", tokens[size_t(k)]);
        break;
      }
      case 14: {  // metrics through the table and directly
        if (!live.engine) break;
        flashspec_engine_metrics a, b;
        api->engine_metrics_init(&a);
        api->engine_metrics_init(&b);
        FS_CHECK(api->engine_get_metrics(live.engine, &a) == FLASHSPEC_OK &&
                     flashspec_engine_get_metrics(live.engine, &b) == FLASHSPEC_OK,
                 "get_metrics failed");
        FS_CHECK(a.steps == b.steps && a.emitted_tokens == b.emitted_tokens && a.num_arms == b.num_arms,
                 "get_metrics through the table differs");
        int32_t positions = -1;
        FS_CHECK(api->engine_get_position_metrics(live.engine, 0, nullptr, nullptr, &positions) == FLASHSPEC_OK &&
                     positions == a.num_positions,
                 "get_position_metrics");
        flashspec_arm_metrics am;
        api->arm_metrics_init(&am);
        const int32_t arm = int32_t(in.u8() % uint32_t(a.num_arms + 1));
        const flashspec_status s = api->engine_get_arm_metrics(live.engine, arm, &am);
        FS_CHECK((arm < a.num_arms) == (s == FLASHSPEC_OK), "get_arm_metrics(%d) of %d arms: %s", arm, a.num_arms, name(s));
        if (in.u8() & 1) FS_CHECK(api->engine_reset_metrics(live.engine) == FLASHSPEC_OK, "reset_metrics failed");
        break;
      }
      default: {  // strings and versions
        const int32_t s = int32_t(in.u8() % 18) - 1;  // −1 .. 16
        FS_CHECK(fsfuzz_table_status_string(api, s) == fsfuzz_status_string(s), "status_string through the table differs");
        FS_CHECK(api->version_number() == flashspec_version_number() &&
                     std::strcmp(api->version_string(), flashspec_version_string()) == 0,
                 "version through the table differs");
        break;
      }
    }
  }
  // Tear down in the order the header asks: engine, drafters, heads and
  // summaries, contexts.
  api->engine_destroy(live.engine);
  for (int k = 0; k < kSlots; ++k) api->drafter_destroy(live.drafter[k]);
  for (int k = 0; k < kSlots; ++k) api->lm_head_destroy(live.head[k]);
  for (int k = 0; k < kSlots; ++k) api->summaries_destroy(live.summaries[k]);
  for (int k = 0; k < kSlots; ++k) api->context_destroy(live.ctx[k]);
  return 0;
}
