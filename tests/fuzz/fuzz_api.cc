// Fuzzes the creation calls and the small functions of the C API: a short
// program of operations, each read from the input:
//   context create   fuzzed params (or NULL), out NULL;
//   thread failure   context create while the fuzz input makes the k-th
//                    thread start of the CPU pool fail (pthread_create is
//                    interposed below): OUT_OF_MEMORY naming
//                    params->cpu_threads, and no thread left running;
//   LM head create   fuzzed tensor (dtype, memory, sizes, stride, alignment,
//                    values) and flags, NULL arguments;
//   summaries create fuzzed sizes;
//   drafter create   n-gram and callback drafters with fuzzed params (kind,
//                    callback, draft temperature, head, costs);
//   status strings   any status value;
//   randomness       flashspec_rng_uniform against Philox of the documented
//                    counter layout; NaN for a purpose outside the enum;
//   NULL handling    every destroy(NULL), getters of NULL.
//
// Invariants: each status is the documented one for the planted argument
// (expect.h; misaligned weights: UNSUPPORTED), with a message; *out
// untouched on error and no write past it;
// created objects work (a context drafts; a head has its sizes, drafts the
// argmax, and keeps its own copy of W); create never hangs.
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "expect.h"
#include "fuzz_common.h"
#include "raw_calls.h"
#include "values.h"

using namespace fsfuzz;

// ---------------------------------------------------------------------------
// Thread start failures. This definition of pthread_create takes precedence
// over the C library's (and the sanitizer runtime's weak one, which it then
// calls), so the harness can make the k-th thread start fail with EAGAIN.
// ---------------------------------------------------------------------------
namespace {
std::atomic<int> g_fail_from{-1};  // −1: no failures; else thread starts ≥ this fail
std::atomic<int> g_started{0};
}  // namespace

extern "C" int __interceptor_pthread_create(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*)
    __attribute__((weak));

extern "C" int pthread_create(pthread_t* thread, const pthread_attr_t* attr, void* (*start)(void*), void* arg) {
  const int from = g_fail_from.load();
  if (from >= 0 && g_started.fetch_add(1) >= from) return EAGAIN;
  if (__interceptor_pthread_create) return __interceptor_pthread_create(thread, attr, start, arg);
  using Fn = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  static Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "pthread_create"));
  return real(thread, attr, start, arg);
}

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

// A context that works: a greedy draft over a tiny head gives its argmax.
void check_context_works(flashspec_context* ctx, const char* what) {
  FS_CHECK(flashspec_context_backend(ctx) == FLASHSPEC_BACKEND_CPU, "%s: backend %d, expected CPU", what,
           int(flashspec_context_backend(ctx)));
  FS_CHECK(flashspec_context_last_cuda_error(ctx) == 0, "%s: last_cuda_error %d on the CPU", what,
           flashspec_context_last_cuda_error(ctx));
  FS_CHECK(flashspec_context_synchronize(ctx) == FLASHSPEC_OK, "%s: synchronize failed", what);
  const float w[6] = {1, 0, 0, 1, 1, 1};  // V = 3, d = 2
  const float h[2] = {0.25f, 0.5f};       // logits 0.25, 0.5, 0.75
  const flashspec_tensor wt = flashspec_tensor_make(w, FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, 3, 2);
  const flashspec_tensor ht = flashspec_tensor_make(h, FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, 1, 2);
  Head head;
  flashspec_status s = flashspec_lm_head_create(ctx, &wt, FLASHSPEC_LM_HEAD_COPY, &head.p);
  FS_CHECK(s == FLASHSPEC_OK, "%s: a 3 x 2 head failed: %s (%s)", what, name(s), flashspec_context_last_error(ctx));
  int32_t token = -1;
  float score = 0;
  s = flashspec_draft(ctx, head.p, &ht, nullptr, &token, &score);
  FS_CHECK(s == FLASHSPEC_OK && token == 2 && score == 0.75f, "%s: greedy draft gave %s, token %d, score %g", what,
           name(s), token, double(score));
}

void op_context_create(Input& in) {
  const uint8_t mode = in.u8();
  const bool null_params = mode >= 240, null_out = mode == 239;
  flashspec_context_params p;
  flashspec_context_params_init(&p);
  Expect expect;
  const uint8_t backend_pick = in.u8();
  static const int32_t backends[] = {FLASHSPEC_BACKEND_AUTO, FLASHSPEC_BACKEND_CUDA, 3, -1, 0x7fffffff};
  const int32_t backend = backend_pick % 16 < 5 ? backends[backend_pick % 16] : int32_t(FLASHSPEC_BACKEND_CPU);
  set_raw(p.backend, backend);  // the harness never reads it back as the enum
  if (backend < 0 || backend > 2) expect.violate(FLASHSPEC_ERR_INVALID_ARGUMENT, "params->backend unknown");
  if (backend == FLASHSPEC_BACKEND_CUDA && flashspec_cuda_device_count() == 0)
    expect.violate(FLASHSPEC_ERR_NO_DEVICE, "CUDA backend without a device");
  if (backend == FLASHSPEC_BACKEND_CUDA && flashspec_cuda_device_count() > 0) return;  // not on a GPU here
  const uint8_t ordinal = in.u8();
  if (ordinal >= 250) p.device_ordinal = -1 - (ordinal & 1) * 1000;
  else p.device_ordinal = ordinal % 4;
  if (p.device_ordinal < 0) expect.violate(FLASHSPEC_ERR_INVALID_ARGUMENT, "params->device_ordinal < 0");
  if (backend == FLASHSPEC_BACKEND_AUTO && flashspec_cuda_device_count() > p.device_ordinal) return;
  p.cuda_stream = in.u8() >= 200 ? reinterpret_cast<void*>(uintptr_t(0x1000)) : nullptr;  // ignored on the CPU
  p.seed = in.u64();
  const uint8_t threads = in.u8();
  static const int32_t bad_threads[] = {-1, 1025, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
  if (threads >= 252) p.cpu_threads = bad_threads[threads - 252];
  else if (threads == 251) p.cpu_threads = 64;
  else p.cpu_threads = threads % 5;
  if (p.cpu_threads < 0 || p.cpu_threads > 1024) expect.violate(FLASHSPEC_ERR_INVALID_ARGUMENT, "params->cpu_threads");
  static const int32_t bad_sizes[] = {0, -1, (1 << 24) + 1, std::numeric_limits<int32_t>::min(),
                                      std::numeric_limits<int32_t>::max()};
  const uint8_t rows = in.u8(), requests = in.u8();
  p.max_rows = rows >= 250 ? bad_sizes[(rows - 250) % 5] : (rows == 249 ? (1 << 16) : 1 + rows % 64);
  p.max_requests = requests >= 250 ? bad_sizes[(requests - 250) % 5] : 1 + requests % 64;
  if (p.max_rows < 1 || p.max_rows > (1 << 24)) expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "params->max_rows");
  if (p.max_requests < 1 || p.max_requests > (1 << 24)) expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "params->max_requests");
  if (in.u8() >= 240) p.struct_size = uint32_t(in.u8()) * 4;
  if (!accepted_struct_size<flashspec_context_params>(p.struct_size)) expect.violate(FLASHSPEC_ERR_STRUCT_SIZE, "params->struct_size");
  if (null_params) {
    expect = Expect();
    if (flashspec_cuda_device_count() > 0) return;
  }
  if (null_out) expect.violate(FLASHSPEC_ERR_NULL_POINTER, "out NULL");

  Guarded<flashspec_context*> out(1);
  out.poison();
  const flashspec_status s = flashspec_context_create(null_params ? nullptr : &p, null_out ? nullptr : out.data());
  check_error_message(nullptr, s, "flashspec_context_create");
  expect.check(s, "flashspec_context_create", flashspec_context_last_error(nullptr));
  FS_CHECK(out.guards_intact(), "flashspec_context_create wrote past *out");
  if (s != FLASHSPEC_OK) {
    FS_CHECK(out.untouched(), "flashspec_context_create failed with %s but wrote *out", name(s));
    return;
  }
  if (null_out) return;
  Context ctx(out.get(0));
  FS_CHECK(ctx.p != nullptr, "flashspec_context_create returned OK and a NULL context");
  check_context_works(ctx.p, "a new context");
}

// The threads of this process (Linux: /proc/self/status), or −1.
int thread_count() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  int threads = -1;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "Threads: %d", &threads) == 1) break;
  std::fclose(f);
  return threads;
}

// The thread count once it is at most `expected`, or what it is after 5 s:
// a joined thread leaves the count a moment after pthread_join returns (the
// kernel wakes the joiner before it releases the task), a thread left
// running never does. (`expected` may itself count a thread of an earlier
// context that was still on its way out.)
int thread_count_settled(int expected) {
  int now = thread_count();
  for (int waited_ms = 0; now > expected && waited_ms < 5000; ++waited_ms) {
    usleep(1000);
    now = thread_count();
  }
  return now;
}

// Context creation while thread starts fail from the k-th on: at least one
// worker cannot start, so create fails with OUT_OF_MEMORY naming
// params->cpu_threads and stops the workers that did start.
void op_thread_failure(Input& in) {
  flashspec_context_params p;
  flashspec_context_params_init(&p);
  p.backend = FLASHSPEC_BACKEND_CPU;
  p.cpu_threads = int32_t(2 + in.u8() % 6);  // 1..7 worker threads
  p.max_rows = 4;
  p.max_requests = 4;
  const int fail_from = int(in.u8() % uint8_t(p.cpu_threads - 1));
  Guarded<flashspec_context*> out(1);
  out.poison();
  const int threads_before = thread_count();
  g_started.store(0);
  g_fail_from.store(fail_from);
  const flashspec_status s = flashspec_context_create(&p, out.data());
  g_fail_from.store(-1);
  const int threads_after = thread_count_settled(threads_before);
  check_error_message(nullptr, s, "flashspec_context_create (thread start failure)");
  FS_CHECK(out.guards_intact(), "flashspec_context_create wrote past *out");
  const char* message = flashspec_context_last_error(nullptr);
  FS_CHECK(s == FLASHSPEC_ERR_OUT_OF_MEMORY,
           "context create with %d of %d worker threads failing to start gave %s, expected "
           "FLASHSPEC_ERR_OUT_OF_MEMORY (%s)",
           p.cpu_threads - 1 - fail_from, p.cpu_threads - 1, name(s), message);
  FS_CHECK(std::strstr(message, "params->cpu_threads") != nullptr,
           "context create failing to start its threads: the message does not name params->cpu_threads (%s)",
           message);
  FS_CHECK(out.untouched(), "flashspec_context_create failed with %s but wrote *out", name(s));
  FS_CHECK(threads_after <= threads_before,
           "context create failing to start its threads left threads running (%d before, %d after)", threads_before,
           threads_after);
}

void op_lm_head(Input& in, flashspec_context* ctx) {
  Expect expect;
  const int64_t rows = 1 + in.u8() % 48, cols = 1 + in.u8() % 16;
  MatrixSpec spec = read_matrix_spec(in, false);
  HostMatrix w;
  build(w, spec, rows, cols);
  flashspec_tensor t = w.view();
  const flashspec_tensor* arg = &t;
  flashspec_context* c = ctx;
  bool null_out = false;
  int32_t flags = FLASHSPEC_LM_HEAD_COPY;
  const int plants = in.u8() < 150 ? 0 : 1 + in.pick(2);
  for (int k = 0; k < plants; ++k) {
    switch (in.u8() % 16) {
      case 0: c = nullptr; expect.violate(FLASHSPEC_ERR_NULL_POINTER, "ctx NULL"); break;
      case 1: arg = nullptr; expect.violate(FLASHSPEC_ERR_NULL_POINTER, "weight NULL"); break;
      case 2: t.data = nullptr; expect.violate(FLASHSPEC_ERR_NULL_POINTER, "weight->data NULL"); break;
      case 3: null_out = true; expect.violate(FLASHSPEC_ERR_NULL_POINTER, "out NULL"); break;
      case 4: set_raw(t.dtype, in.u8() & 1 ? -1 : 3); expect.violate(FLASHSPEC_ERR_DTYPE_MISMATCH, "dtype unknown"); break;
      case 5: t.memory = FLASHSPEC_MEMORY_CUDA; expect.violate(FLASHSPEC_ERR_DEVICE_MISMATCH, "device memory on the CPU"); break;
      case 6: set_raw(t.memory, in.u8() & 1 ? -1 : 2); expect.violate(FLASHSPEC_ERR_INVALID_ARGUMENT, "memory unknown"); break;
      case 7: t.rows = -int64_t(in.u8() % 2); expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "rows < 1"); break;
      case 8: t.rows = FLASHSPEC_MAX_VOCAB + 1; expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "rows > FLASHSPEC_MAX_VOCAB"); break;
      case 9: t.cols = -int64_t(in.u8() % 2); expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "cols < 1"); break;
      case 10:
        t.cols = FLASHSPEC_MAX_HIDDEN + 1;
        t.row_stride = t.cols;
        t.rows = 1;
        expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "cols > FLASHSPEC_MAX_HIDDEN");
        break;
      case 11:
        if (t.cols > 1) t.row_stride = t.cols - 1, expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "row_stride < cols");
        break;
      case 12: t.row_stride = std::numeric_limits<int64_t>::max() / 2; expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "rows x row_stride overflows"); break;
      case 13: flags = FLASHSPEC_LM_HEAD_BORROW; expect.violate(FLASHSPEC_ERR_DEVICE_MISMATCH, "BORROW on the CPU"); break;
      case 14: flags = in.u8() & 1 ? -1 : 2; expect.violate(FLASHSPEC_ERR_INVALID_ARGUMENT, "flags unknown"); break;
      default: plant_nonfinite(w, in); break;
    }
  }
  // Alignment is checked before any value is read.
  if (w.misaligned()) expect.violate(FLASHSPEC_ERR_UNSUPPORTED, "weight data misaligned");
  else if (!w.all_finite()) expect.violate(FLASHSPEC_ERR_NON_FINITE, "a non-finite weight");
  Guarded<flashspec_lm_head*> out(1);
  out.poison();
  const flashspec_status s = fsfuzz_lm_head_create(c, arg, flags, null_out ? nullptr : out.data());
  check_error_message(c, s, "flashspec_lm_head_create");
  expect.check(s, "flashspec_lm_head_create", flashspec_context_last_error(c));
  FS_CHECK(out.guards_intact(), "flashspec_lm_head_create wrote past *out");
  if (s != FLASHSPEC_OK) {
    FS_CHECK(out.untouched(), "flashspec_lm_head_create failed with %s but wrote *out", name(s));
    return;
  }
  if (null_out) return;
  Head head(out.get(0));
  FS_CHECK(flashspec_lm_head_vocab_size(head.p) == rows && flashspec_lm_head_hidden_size(head.p) == cols,
           "LM head of %lld x %lld reports %lld x %lld", (long long)rows, (long long)cols,
           (long long)flashspec_lm_head_vocab_size(head.p), (long long)flashspec_lm_head_hidden_size(head.p));
  // It drafts the argmax, and keeps its own copy of W.
  HostMatrix h;
  h.init(FLASHSPEC_DTYPE_F32, 1, cols, 0, 0);
  Rng rng(in.u64());
  for (int64_t c2 = 0; c2 < cols; ++c2) h.set(0, c2, float(rng.normal()));
  const flashspec_tensor hv = h.view();
  int32_t first = -1, second = -1;
  flashspec_status ds = flashspec_draft(ctx, head.p, &hv, nullptr, &first, nullptr);
  FS_CHECK(ds == FLASHSPEC_OK, "greedy draft on a new head failed: %s (%s)", name(ds), flashspec_context_last_error(ctx));
  const RowLogits l = row_logits(w, h, 0);
  for (int64_t v = 0; v < rows; ++v)
    FS_CHECK(l.logit[size_t(first)] + l.bound[size_t(first)] >= l.logit[size_t(v)] - l.bound[size_t(v)],
             "a new head's greedy draft %d is not the argmax (token %lld is larger)", first, (long long)v);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c2 = 0; c2 < cols; ++c2) w.set(r, c2, (r + c2) % 2 ? kNaN : 1e30f);
  ds = flashspec_draft(ctx, head.p, &hv, nullptr, &second, nullptr);
  FS_CHECK(ds == FLASHSPEC_OK && second == first,
           "a COPY head changed when the caller's weights did: %s, token %d then %d", name(ds), first, second);
}

void op_summaries(Input& in, flashspec_context* ctx) {
  Expect expect;
  static const int32_t bad[] = {0, -1, (1 << 24) + 1, std::numeric_limits<int32_t>::min()};
  const uint8_t r = in.u8(), q = in.u8(), mode = in.u8();
  const int32_t rows = r >= 252 ? bad[r - 252] : 1 + r % 64;
  const int32_t requests = q >= 252 ? bad[q - 252] : (q == 251 ? rows + 1 : 1 + q % 64);
  if (rows < 1 || rows > (1 << 24)) expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "max_rows");
  if (requests < 1 || requests > rows) expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "max_requests");
  flashspec_context* c = mode == 255 ? nullptr : ctx;
  if (!c) expect.violate(FLASHSPEC_ERR_NULL_POINTER, "ctx NULL");
  const bool null_out = mode == 254;
  if (null_out) expect.violate(FLASHSPEC_ERR_NULL_POINTER, "out NULL");
  Guarded<flashspec_summaries*> out(1);
  out.poison();
  const flashspec_status s = flashspec_summaries_create(c, rows, requests, null_out ? nullptr : out.data());
  check_error_message(c, s, "flashspec_summaries_create");
  expect.check(s, "flashspec_summaries_create", flashspec_context_last_error(c));
  FS_CHECK(out.guards_intact(), "flashspec_summaries_create wrote past *out");
  if (s != FLASHSPEC_OK) {
    FS_CHECK(out.untouched(), "flashspec_summaries_create failed with %s but wrote *out", name(s));
    return;
  }
  if (!null_out) flashspec_summaries_destroy(out.get(0));
}

double read_cost(Input& in) {
  switch (in.u8()) {
    case 250: return -1.0;
    case 251: return std::nan("");
    case 252: return INFINITY;
    case 253: return -0.0;
    case 254: return 1e300;
    default: return 0.0;
  }
}
bool valid_cost(double c) { return std::isfinite(c) && c >= 0.0; }

int never_called(void*, flashspec_draft_call*) {
  FS_CHECK(false, "a drafter's callback was called without an engine");
  return 1;
}

// Drafter creation, n-gram or callback, with fuzzed params.
void op_drafter(Input& in, flashspec_context* ctx, const flashspec_lm_head* head) {
  Expect expect;
  const uint8_t mode = in.u8(), nulls = in.u8();
  flashspec_context* c = nulls == 255 ? nullptr : ctx;
  if (!c) expect.violate(FLASHSPEC_ERR_NULL_POINTER, "ctx NULL");
  const bool null_out = nulls == 254;
  if (null_out) expect.violate(FLASHSPEC_ERR_NULL_POINTER, "out NULL");
  Guarded<flashspec_drafter*> out(1);
  out.poison();
  flashspec_status s;
  if (mode < 128) {
    flashspec_ngram_params p;
    flashspec_ngram_params_init(&p);
    static const int32_t bad_n[] = {0, -1, 33, std::numeric_limits<int32_t>::min()};
    const uint8_t a = in.u8(), b = in.u8();
    p.min_n = a >= 252 ? bad_n[a - 252] : 1 + a % 32;
    p.max_n = b >= 252 ? bad_n[b - 252] : std::min(32, p.min_n + b % 4);
    if (b == 251) p.max_n = int32_t(std::max<int64_t>(std::numeric_limits<int32_t>::min(), int64_t(p.min_n) - 1));
    p.call_cost = read_cost(in);
    p.token_cost = read_cost(in);
    if (in.u8() >= 250) p.struct_size += 8;
    const bool null_params = mode >= 120;
    if (!null_params) {
      if (!accepted_struct_size<flashspec_ngram_params>(p.struct_size))
        expect.violate(FLASHSPEC_ERR_STRUCT_SIZE, "params->struct_size");
      if (p.min_n < 1 || p.min_n > 32) expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "params->min_n");
      if (p.max_n < p.min_n || p.max_n > 32) expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "params->max_n");
      if (!valid_cost(p.call_cost)) expect.violate(FLASHSPEC_ERR_INVALID_ARGUMENT, "params->call_cost");
      if (!valid_cost(p.token_cost)) expect.violate(FLASHSPEC_ERR_INVALID_ARGUMENT, "params->token_cost");
    }
    s = flashspec_drafter_create_ngram(c, null_params ? nullptr : &p, null_out ? nullptr : out.data());
    check_error_message(c, s, "flashspec_drafter_create_ngram");
    expect.check(s, "flashspec_drafter_create_ngram", flashspec_context_last_error(c));
  } else {
    flashspec_callback_drafter_params p;
    flashspec_callback_drafter_params_init(&p);
    const uint8_t k = in.u8();
    static const int32_t kinds[] = {0, 1, 2, 3, 4, -1, 0x7fffffff};
    const int32_t kind = k < 240 ? int32_t(k % 4) : kinds[k % 7];
    set_raw(p.kind, kind);
    if (kind < 0 || kind > 3) expect.violate(FLASHSPEC_ERR_INVALID_ARGUMENT, "params->kind unknown");
    const uint8_t fn = in.u8();
    p.draft = fn == 255 ? nullptr : never_called;
    if (!p.draft) expect.violate(FLASHSPEC_ERR_NULL_POINTER, "params->draft NULL");
    p.draft_temperature = read_temperature(in, 1.0f);
    if (kind == FLASHSPEC_DRAFT_LOGITS && !valid_draft_temperature(p.draft_temperature))
      expect.violate(FLASHSPEC_ERR_INVALID_ARGUMENT, "params->draft_temperature");
    p.head = in.u8() == 255 ? nullptr : head;
    if (kind == FLASHSPEC_DRAFT_HIDDEN && !p.head) expect.violate(FLASHSPEC_ERR_NULL_POINTER, "params->head NULL");
    p.call_cost = read_cost(in);
    p.token_cost = read_cost(in);
    if (!valid_cost(p.call_cost)) expect.violate(FLASHSPEC_ERR_INVALID_ARGUMENT, "params->call_cost");
    if (!valid_cost(p.token_cost)) expect.violate(FLASHSPEC_ERR_INVALID_ARGUMENT, "params->token_cost");
    if (in.u8() >= 250) p.struct_size -= 8;
    if (!accepted_struct_size<flashspec_callback_drafter_params>(p.struct_size))
      expect.violate(FLASHSPEC_ERR_STRUCT_SIZE, "params->struct_size");
    const bool null_params = mode == 255;
    if (null_params) {
      expect = Expect();
      expect.violate(FLASHSPEC_ERR_NULL_POINTER, "params NULL");
      if (!c) expect.violate(FLASHSPEC_ERR_NULL_POINTER, "ctx NULL");
    }
    s = flashspec_drafter_create_callback(c, null_params ? nullptr : &p, null_out ? nullptr : out.data());
    check_error_message(c, s, "flashspec_drafter_create_callback");
    expect.check(s, "flashspec_drafter_create_callback", flashspec_context_last_error(c));
  }
  FS_CHECK(out.guards_intact(), "drafter create wrote past *out");
  if (s != FLASHSPEC_OK) {
    FS_CHECK(out.untouched(), "drafter create failed with %s but wrote *out", name(s));
    return;
  }
  if (!null_out) flashspec_drafter_destroy(out.get(0));
}

void op_status(Input& in) {
  int32_t value;
  const uint8_t k = in.u8();
  if (k < 200) value = int32_t(k % 20) - 2;  // −2 .. 17
  else value = int32_t(in.u32());
  const char* text = fsfuzz_status_string(value);
  const char* id = fsfuzz_status_name(value);
  FS_CHECK(text && id && text[0] && id[0], "status %d: NULL or empty string", value);
  FS_CHECK(text == fsfuzz_status_string(value) && id == fsfuzz_status_name(value), "status %d: strings not static", value);
  if (value >= 0 && value <= 15) {
    FS_CHECK(std::strcmp(text, "unknown status") != 0 && std::strncmp(id, "FLASHSPEC_", 10) == 0 &&
                 std::strcmp(id, "FLASHSPEC_UNKNOWN_STATUS") != 0,
             "status %d: '%s' / '%s'", value, text, id);
  } else {
    FS_CHECK(std::strcmp(text, "unknown status") == 0 && std::strcmp(id, "FLASHSPEC_UNKNOWN_STATUS") == 0,
             "unknown status %d: '%s' / '%s'", value, text, id);
  }
}

void op_rng(Input& in) {
  const uint64_t seed = in.u64(), id = in.u64(), step = in.u64();
  const uint8_t k = in.u8();
  const int32_t position = k < 240 ? int32_t(in.range(0, FLASHSPEC_MAX_DRAFT_LEN)) : int32_t(in.u32());
  const int32_t token = k < 240 ? int32_t(in.range(0, FLASHSPEC_MAX_VOCAB - 1)) : int32_t(in.u32());
  const uint8_t pk = in.u8();
  const int32_t purpose = pk < 240 ? 1 + pk % 4 : (pk < 248 ? int32_t(pk - 240) - 1 : int32_t(in.u32()));
  const double u = fsfuzz_rng_uniform(seed, id, step, position, purpose, token);
  if (purpose < FLASHSPEC_RNG_DRAFT_NOISE || purpose > FLASHSPEC_RNG_BONUS_NOISE) {
    FS_CHECK(std::isnan(u), "flashspec_rng_uniform with purpose %d (outside the enum) gave %.17g, not NaN", purpose,
             u);
    return;
  }
  FS_CHECK(u > 0.0 && u < 1.0, "flashspec_rng_uniform gave %.17g, outside (0, 1)", u);
  if (position < 0 || position > FLASHSPEC_MAX_DRAFT_LEN || token < 0 || token >= FLASHSPEC_MAX_VOCAB) return;
  // The documented layout.
  const uint32_t counter[4] = {(uint32_t(purpose) << 28) | (uint32_t(position) << 18) | (uint32_t(token) >> 2),
                               uint32_t(step), uint32_t(id), uint32_t(id >> 32)};
  const uint32_t key[2] = {uint32_t(seed), uint32_t(seed >> 32)};
  uint32_t out[4] = {0, 0, 0, 0};
  flashspec_philox4x32_10(counter, key, out);
  const double expected = (double(out[token & 3]) + 0.5) / 4294967296.0;
  FS_CHECK(u == expected,
           "flashspec_rng_uniform(seed %llu, id %llu, step %llu, position %d, purpose %d, token %d) = %.17g, the "
           "documented Philox counter gives %.17g",
           (unsigned long long)seed, (unsigned long long)id, (unsigned long long)step, position, purpose, token, u,
           expected);
  flashspec_philox4x32_10(nullptr, key, out);  // NULL: no-op
  flashspec_philox4x32_10(counter, nullptr, out);
  flashspec_philox4x32_10(counter, key, nullptr);
}

void op_nulls(Input& in) {
  (void)in;
  flashspec_context_destroy(nullptr);
  flashspec_lm_head_destroy(nullptr);
  flashspec_summaries_destroy(nullptr);
  flashspec_drafter_destroy(nullptr);
  flashspec_engine_destroy(nullptr);
  flashspec_engine_cancel(nullptr);
  flashspec_context_params_init(nullptr);
  flashspec_draft_params_init(nullptr);
  flashspec_verify_batch_init(nullptr);
  flashspec_verify_result_init(nullptr);
  flashspec_ngram_params_init(nullptr);
  flashspec_callback_drafter_params_init(nullptr);
  flashspec_engine_params_init(nullptr);
  flashspec_generate_params_init(nullptr);
  flashspec_generate_result_init(nullptr);
  flashspec_engine_metrics_init(nullptr);
  flashspec_arm_metrics_init(nullptr);
  FS_CHECK(flashspec_lm_head_vocab_size(nullptr) == 0 && flashspec_lm_head_hidden_size(nullptr) == 0,
           "sizes of a NULL head are not 0");
  FS_CHECK(flashspec_context_last_error(nullptr) != nullptr, "last_error(NULL) is NULL");
  FS_CHECK(flashspec_context_last_cuda_error(nullptr) == 0, "last_cuda_error(NULL) is not 0");
  FS_CHECK(flashspec_context_synchronize(nullptr) == FLASHSPEC_ERR_NULL_POINTER, "synchronize(NULL) is not NULL_POINTER");
  FS_CHECK(flashspec_cuda_device_count() >= 0, "negative CUDA device count");
  FS_CHECK(flashspec_version_number() == FLASHSPEC_VERSION_NUMBER && flashspec_abi_version() == FLASHSPEC_ABI_VERSION,
           "version %u / ABI %u differ from the header's", flashspec_version_number(), flashspec_abi_version());
  char expected[32];
  std::snprintf(expected, sizeof expected, "%d.%d.%d", FLASHSPEC_VERSION_MAJOR, FLASHSPEC_VERSION_MINOR,
                FLASHSPEC_VERSION_PATCH);
  FS_CHECK(std::strcmp(flashspec_version_string(), expected) == 0, "version string %s, header %s",
           flashspec_version_string(), expected);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  Context pool;  // the context of the head, summaries and drafter operations
  Head pool_head;
  for (int op = 0; op < 8 && (op == 0 || in.remaining() > 0); ++op) {
    const uint8_t kind = in.u8();
    if ((kind % 8 == 2 || kind % 8 == 3 || kind % 8 == 7) && !pool.p) {
      const uint64_t seed = in.u64();
      const int32_t threads = int32_t(in.u8() % 3);
      pool.p = make_context(seed, threads, 16, 4);
      const float w[4] = {1, 0, 0, 1};
      const flashspec_tensor wt = flashspec_tensor_make(w, FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, 2, 2);
      FS_CHECK(flashspec_lm_head_create(pool.p, &wt, FLASHSPEC_LM_HEAD_COPY, &pool_head.p) == FLASHSPEC_OK,
               "a 2 x 2 head failed");
    }
    switch (kind % 8) {
      case 0: op_context_create(in); break;
      case 1: op_thread_failure(in); break;
      case 2: op_lm_head(in, pool.p); break;
      case 3: op_summaries(in, pool.p); break;
      case 4: op_status(in); break;
      case 5: op_rng(in); break;
      case 6: op_nulls(in); break;
      default: op_drafter(in, pool.p, pool_head.p); break;
    }
  }
  return 0;
}
