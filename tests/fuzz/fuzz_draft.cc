// Fuzzes flashspec_draft on the CPU backend: a small LM head (V ≤ 80,
// d ≤ 16) in any dtype, stride and alignment; hidden rows likewise; draft
// params with any temperatures, seeds, request ids, steps and positions;
// and a few planted invalid arguments.
//
// Invariants:
//   - the status is the one the planted arguments call for (expect.h); data
//     not aligned to its element size (head or hidden rows, any dtype) is
//     UNSUPPORTED; an error leaves tokens_out and scores_out untouched and a
//     message;
//   - no write past rows entries of either output (guard words);
//   - on success every token is in [0, V); at T = 0 it is the argmax of the
//     row's logits (within the fp32 error bound; an equal, smaller-id row of W
//     wins ties) and its score is its logit; at T > 0 it is the Gumbel-max of
//     l/T + g with g from flashspec_rng_uniform (DRAFT_NOISE), the documented
//     randomness contract, and its score is log q(x) ≤ 0;
//   - the same call again, on another context with another thread count, and
//     each row drafted alone with its effective values passed explicitly,
//     give the same bits.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "expect.h"
#include "fuzz_common.h"
#include "values.h"

using namespace fsfuzz;

namespace {

constexpr int64_t kMaxVocab = 80;
constexpr int64_t kMaxHidden = 16;
constexpr int32_t kMaxRows = 8;

// The row values the library resolves from params (NULL arrays: defaults).
struct RowValues {
  float temperature;
  uint64_t seed, request_id, step;
  int32_t position;
};

struct Draft {
  flashspec_status status;
  std::vector<int32_t> tokens;
  std::vector<float> scores;
};

// The Gumbel-max winner of row r under the randomness contract, as a check:
// x must score within the error bound of every other token.
void check_gumbel(const RowLogits& l, const RowValues& v, int32_t x, int64_t vocab, float inv_t, int64_t row) {
  const double eps = std::ldexp(1.0, -22);
  auto noise = [&](int64_t token) {
    const double u = flashspec_rng_uniform(v.seed, v.request_id, v.step, v.position, FLASHSPEC_RNG_DRAFT_NOISE,
                                           int32_t(token));
    return -std::log(-std::log(u));
  };
  const double scale = double(inv_t);
  const double gx = noise(x);
  const double sx = l.logit[size_t(x)] * scale + gx;
  for (int64_t t = 0; t < vocab; ++t) {
    if (t == x) continue;
    const double gt = noise(t);
    const double st = l.logit[size_t(t)] * scale + gt;
    const double slack = (l.bound[size_t(x)] + l.bound[size_t(t)]) * scale +
                         4 * eps * (std::fabs(l.logit[size_t(x)] * scale) + std::fabs(l.logit[size_t(t)] * scale)) +
                         1e-4 * (1.0 + std::fabs(gx) + std::fabs(gt));
    FS_CHECK(sx + slack >= st,
             "draft row %lld at T > 0: token %d (l/T + g = %.9g) is not the Gumbel-max; token %lld scores %.9g "
             "(seed %llu, request %llu, step %llu, position %d)",
             (long long)row, x, sx, (long long)t, st, (unsigned long long)v.seed, (unsigned long long)v.request_id,
             (unsigned long long)v.step, v.position);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  const uint64_t ctx_seed = in.u64();
  const int32_t threads_a = int32_t(in.range(0, 3));
  const int32_t threads_b = int32_t(in.range(0, 3));
  const int32_t max_rows = int32_t(in.range(kMaxRows, kMaxRows + 8));

  // The LM head.
  const int64_t vocab = in.range(1, kMaxVocab);
  const int64_t hidden_size = in.range(1, kMaxHidden);
  const MatrixSpec w_spec = read_matrix_spec(in, true);
  HostMatrix w;
  build(w, w_spec, vocab, hidden_size);

  // The hidden rows.
  const int32_t rows = int32_t(in.range(1, kMaxRows));
  const MatrixSpec h_spec = read_matrix_spec(in, true);
  HostMatrix h;
  build(h, h_spec, rows, hidden_size);

  // Params.
  const uint8_t params_mode = in.u8();  // ≥ 240: NULL params (greedy defaults)
  flashspec_draft_params params;
  flashspec_draft_params_init(&params);
  params.temperature = read_temperature(in, 0.0f);
  std::vector<float> temperatures(static_cast<size_t>(rows));
  std::vector<uint64_t> seeds(static_cast<size_t>(rows)), ids(static_cast<size_t>(rows)), steps(static_cast<size_t>(rows));
  std::vector<int32_t> positions(static_cast<size_t>(rows));
  const uint8_t arrays = in.u8();
  for (int32_t r = 0; r < rows; ++r) {
    temperatures[size_t(r)] = read_temperature(in, 1.0f);
    seeds[size_t(r)] = in.u64();
    ids[size_t(r)] = in.u64();
    steps[size_t(r)] = in.u64();
    positions[size_t(r)] = int32_t(in.range(0, FLASHSPEC_MAX_DRAFT_LEN));
  }
  if (arrays & 1) params.temperatures = temperatures.data();
  if (arrays & 2) params.seeds = seeds.data();
  if (arrays & 4) params.request_ids = ids.data();
  if (arrays & 8) params.steps = steps.data();
  if (arrays & 16) params.positions = positions.data();
  const bool with_scores = !(arrays & 32) || (arrays & 64);
  const bool use_params = params_mode < 240;

  Expect expect;

  // Contexts and the head: the head lives on context A and serves B too
  // (heads may be shared by contexts of the same device).
  Context a(make_context(ctx_seed, threads_a, max_rows, 4));
  Context b(make_context(ctx_seed, threads_b, max_rows, 4));
  {
    const flashspec_tensor wt = w.view();
    flashspec_lm_head* head = nullptr;
    const flashspec_status s = flashspec_lm_head_create(a.p, &wt, FLASHSPEC_LM_HEAD_COPY, &head);
    check_error_message(a.p, s, "flashspec_lm_head_create");
    // Alignment is checked before any value is read.
    if (w.misaligned()) {
      FS_CHECK(s == FLASHSPEC_ERR_UNSUPPORTED && head == nullptr,
               "LM head with data misaligned by %zu bytes (dtype %d): got %s, expected UNSUPPORTED", w.offset,
               int(w.dtype), name(s));
      return 0;
    }
    if (!w.all_finite()) {
      FS_CHECK(s == FLASHSPEC_ERR_NON_FINITE && head == nullptr, "LM head with a non-finite weight: got %s",
               name(s));
      return 0;
    }
    FS_CHECK(s == FLASHSPEC_OK && head != nullptr, "a valid LM head was refused: %s (%s)", name(s),
             flashspec_context_last_error(a.p));
    FS_CHECK(flashspec_lm_head_vocab_size(head) == vocab && flashspec_lm_head_hidden_size(head) == hidden_size,
             "LM head sizes %lld x %lld, expected %lld x %lld", (long long)flashspec_lm_head_vocab_size(head),
             (long long)flashspec_lm_head_hidden_size(head), (long long)vocab, (long long)hidden_size);
    Head owned(head);

    // Effective row values.
    std::vector<RowValues> values(static_cast<size_t>(rows));
    for (int32_t r = 0; r < rows; ++r) {
      RowValues& v = values[size_t(r)];
      v.temperature = !use_params ? 0.0f : (params.temperatures ? temperatures[size_t(r)] : params.temperature);
      v.seed = use_params && params.seeds ? seeds[size_t(r)] : ctx_seed;
      v.request_id = use_params && params.request_ids ? ids[size_t(r)] : uint64_t(r);
      v.step = use_params && params.steps ? steps[size_t(r)] : 0;
      v.position = use_params && params.positions ? positions[size_t(r)] : 0;
    }

    // Planted invalid arguments.
    flashspec_tensor hv = h.view();
    const flashspec_tensor* hidden_arg = &hv;
    flashspec_context* ctx_arg = a.p;
    const flashspec_lm_head* head_arg = head;
    bool null_tokens = false;
    if (h.misaligned()) expect.violate(FLASHSPEC_ERR_UNSUPPORTED, "hidden data misaligned");
    if (!h.all_finite()) expect.violate(FLASHSPEC_ERR_NON_FINITE, "non-finite hidden value");
    const int plants = in.u8() < 192 ? 0 : 1 + in.pick(2);
    for (int k = 0; k < plants; ++k) {
      switch (in.u8() % 20) {
        case 0: ctx_arg = nullptr; expect.violate(FLASHSPEC_ERR_NULL_POINTER, "ctx NULL"); break;
        case 1: head_arg = nullptr; expect.violate(FLASHSPEC_ERR_NULL_POINTER, "head NULL"); break;
        case 2: hidden_arg = nullptr; expect.violate(FLASHSPEC_ERR_NULL_POINTER, "hidden NULL"); break;
        case 3: hv.data = nullptr; expect.violate(FLASHSPEC_ERR_NULL_POINTER, "hidden->data NULL"); break;
        case 4: {
          static const int32_t bad[] = {3, -1, 0x7fffffff, 1000};
          set_raw(hv.dtype, bad[in.u8() % 4]);
          expect.violate(FLASHSPEC_ERR_DTYPE_MISMATCH, "hidden dtype unknown");
          break;
        }
        case 5: hv.memory = FLASHSPEC_MEMORY_CUDA; expect.violate(FLASHSPEC_ERR_DEVICE_MISMATCH, "hidden in CUDA memory"); break;
        case 6: set_raw(hv.memory, in.u8() & 1 ? -1 : 2); expect.violate(FLASHSPEC_ERR_INVALID_ARGUMENT, "hidden memory unknown"); break;
        case 7: hv.rows = -int64_t(in.u8() % 3); expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "hidden rows < 1"); break;
        case 8:
          hv.cols = hidden_size + 1 + in.u8() % 3;
          hv.row_stride = std::max(hv.row_stride, hv.cols);
          expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "hidden cols != d");
          break;
        case 9:
          if (hidden_size > 1) {
            hv.row_stride = hidden_size - 1;
            expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "row_stride < cols");
          }
          break;
        case 10: hv.row_stride = int64_t(1) << 62; expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "rows x row_stride overflows"); break;
        case 11: hv.rows = max_rows + 1 + in.u8() % 4; expect.violate(FLASHSPEC_ERR_WORKSPACE_EXCEEDED, "rows > max_rows"); break;
        case 12: null_tokens = true; expect.violate(FLASHSPEC_ERR_NULL_POINTER, "tokens_out NULL"); break;
        case 13:
          if (use_params)
            params.struct_size = in.u8() & 1 ? params.struct_size + 8 : params.struct_size - 4 * (1 + in.u8() % 4);
          break;
        case 14:
          if (use_params) {
            params.memory = FLASHSPEC_MEMORY_CUDA;
            expect.violate(FLASHSPEC_ERR_DEVICE_MISMATCH, "params->memory CUDA");
          }
          break;
        case 15:
          if (use_params) {
            set_raw(params.memory, in.u8() & 1 ? -1 : 5);
            expect.violate(FLASHSPEC_ERR_INVALID_ARGUMENT, "params->memory unknown");
          }
          break;
        case 16:
          if (use_params && params.positions) {
            const int64_t r = in.range(0, rows - 1);
            const uint8_t how = in.u8(), by = in.u8();
            positions[size_t(r)] = how & 1 ? -1 - by : FLASHSPEC_MAX_DRAFT_LEN + 1 + by;
          }
          break;
        case 17: plant_nonfinite(h, in); break;  // in place: hv still views h
        default: break;
      }
    }
    // Violations that depend on final values.
    if (!h.all_finite() && expect.count() == 0) expect.violate(FLASHSPEC_ERR_NON_FINITE, "non-finite hidden value");
    if (use_params) {
      if (!accepted_struct_size<flashspec_draft_params>(params.struct_size))
        expect.violate(FLASHSPEC_ERR_STRUCT_SIZE, "params->struct_size");
      if (!valid_temperature(params.temperature))
        expect.violate(FLASHSPEC_ERR_INVALID_ARGUMENT, "params->temperature invalid");
      if (params.temperatures)
        for (int32_t r = 0; r < rows; ++r)
          if (!valid_temperature(temperatures[size_t(r)]))
            expect.violate(FLASHSPEC_ERR_INVALID_ARGUMENT, "params->temperatures entry invalid");
      if (params.positions)
        for (int32_t r = 0; r < rows; ++r)
          if (positions[size_t(r)] < 0 || positions[size_t(r)] > FLASHSPEC_MAX_DRAFT_LEN)
            expect.violate(FLASHSPEC_ERR_OUT_OF_RANGE, "params->positions entry out of range");
    }
    // Logit overflow, row by row, when the call is otherwise valid.
    std::vector<RowLogits> logits;
    if (expect.valid() && h.all_finite()) {
      for (int32_t r = 0; r < rows; ++r) {
        logits.push_back(row_logits(w, h, r));
        const float t = values[size_t(r)].temperature;
        const bool greedy = t == 0.0f;
        const Overflow o = logit_overflow(logits.back(), greedy ? 1.0f : inverse(t), greedy);
        expect.nonfinite(!o.never, o.surely, "row " + std::to_string(r) + ": a logit" + (greedy ? "" : " divided by T"));
      }
    }

    // The call, with poisoned, guarded outputs.
    const size_t out_rows = size_t(std::max<int64_t>(rows, 1));
    Guarded<int32_t> tokens(out_rows);
    Guarded<float> scores(out_rows);
    tokens.poison();
    scores.poison();
    const flashspec_status s1 =
        flashspec_draft(ctx_arg, head_arg, hidden_arg, use_params ? &params : nullptr,
                        null_tokens ? nullptr : tokens.data(), with_scores ? scores.data() : nullptr);
    const flashspec_context* msg_ctx = ctx_arg;
    check_error_message(msg_ctx, s1, "flashspec_draft");
    expect.check(s1, "flashspec_draft", flashspec_context_last_error(msg_ctx));
    FS_CHECK(tokens.guards_intact(), "flashspec_draft wrote outside tokens_out[0 .. %d)", rows);
    FS_CHECK(scores.guards_intact(), "flashspec_draft wrote outside scores_out[0 .. %d)", rows);
    if (s1 != FLASHSPEC_OK) {
      FS_CHECK(tokens.untouched(), "flashspec_draft failed with %s but wrote tokens_out", name(s1));
      FS_CHECK(scores.untouched(), "flashspec_draft failed with %s but wrote scores_out", name(s1));
      return 0;
    }
    if (!with_scores) FS_CHECK(scores.untouched(), "flashspec_draft wrote scores_out although it was NULL");

    // Success: tokens and scores.
    for (int32_t r = 0; r < rows; ++r) {
      const int32_t x = tokens.get(size_t(r));
      FS_CHECK(x >= 0 && x < vocab, "draft row %d: token %d outside [0, %lld)", r, x, (long long)vocab);
      const RowValues& v = values[size_t(r)];
      const RowLogits& l = logits[size_t(r)];
      const float score = scores.get(size_t(r));
      if (with_scores) FS_CHECK(std::isfinite(score), "draft row %d: score %g is not finite", r, double(score));
      if (v.temperature == 0.0f) {
        for (int64_t t = 0; t < vocab; ++t)
          FS_CHECK(l.logit[size_t(x)] + l.bound[size_t(x)] >= l.logit[size_t(t)] - l.bound[size_t(t)],
                   "draft row %d at T = 0: token %d (logit %.9g) is not the argmax; token %lld has %.9g", r, x,
                   l.logit[size_t(x)], (long long)t, l.logit[size_t(t)]);
        const int64_t dup = smaller_duplicate(w, x);
        FS_CHECK(dup < 0, "draft row %d at T = 0: token %d chosen over token %lld, whose W row is equal (ties go to "
                 "the smallest id)", r, x, (long long)dup);
        if (with_scores)
          FS_CHECK(std::fabs(double(score) - l.logit[size_t(x)]) <= l.bound[size_t(x)],
                   "draft row %d at T = 0: score %.9g is not token %d's logit %.9g", r, double(score), x,
                   l.logit[size_t(x)]);
      } else {
        const float inv_t = inverse(v.temperature);
        check_gumbel(l, v, x, vocab, inv_t, r);
        if (with_scores) {
          // log q(x) = l_x/T − LSE(l/T).
          double m = -INFINITY;
          for (double lv : l.logit) m = std::max(m, lv * inv_t);
          double sum = 0.0;
          for (double lv : l.logit) sum += std::exp(lv * inv_t - m);
          const double ref = l.logit[size_t(x)] * inv_t - (m + std::log(sum));
          const double slack = 2.0 * l.max_bound * inv_t + 16 * std::ldexp(1.0, -24) * (std::fabs(m) + 1.0) * 2 +
                               16.0 * double(vocab) * std::ldexp(1.0, -24) + 1e-6;
          FS_CHECK(std::fabs(double(score) - ref) <= slack,
                   "draft row %d at T = %g: score %.9g is not log q(x) = %.9g (token %d)", r, double(v.temperature),
                   double(score), ref, x);
          FS_CHECK(double(score) <= slack, "draft row %d at T > 0: log q(x) = %.9g > 0", r, double(score));
        }
      }
    }

    // The same call again (context A), then on context B: the same bits.
    auto redo = [&](flashspec_context* ctx, const char* what) {
      Guarded<int32_t> t2(out_rows);
      Guarded<float> s2(out_rows);
      t2.poison();
      s2.poison();
      const flashspec_status s = flashspec_draft(ctx, head, hidden_arg, use_params ? &params : nullptr, t2.data(),
                                                 with_scores ? s2.data() : nullptr);
      check_error_message(ctx, s, what);
      FS_CHECK(s == FLASHSPEC_OK, "%s: the same draft failed with %s (%s)", what, name(s),
               flashspec_context_last_error(ctx));
      for (int32_t r = 0; r < rows; ++r) {
        FS_CHECK(t2.get(size_t(r)) == tokens.get(size_t(r)), "%s: row %d token %d, first call gave %d", what, r,
                 t2.get(size_t(r)), tokens.get(size_t(r)));
        if (with_scores)
          FS_CHECK(same_bits(s2.get(size_t(r)), scores.get(size_t(r))), "%s: row %d score %.9g, first call gave %.9g",
                   what, r, double(s2.get(size_t(r))), double(scores.get(size_t(r))));
      }
    };
    redo(a.p, "draft repeated on the same context");
    redo(b.p, "draft on a context with another thread count");

    // Each row alone, its effective values passed explicitly: independent
    // of batch neighbours, and the NULL arrays resolve to the documented
    // defaults (context seed, row index, step 0, position 0).
    for (int32_t r = 0; r < rows; ++r) {
      HostMatrix one;
      one.init(h.dtype, 1, hidden_size, 0, h.offset);
      for (int64_t c = 0; c < hidden_size; ++c) one.set(0, c, h.at(r, c));
      const flashspec_tensor ov = one.view();
      const RowValues& v = values[size_t(r)];
      flashspec_draft_params p1;
      flashspec_draft_params_init(&p1);
      p1.temperature = v.temperature;
      p1.seeds = &v.seed;
      p1.request_ids = &v.request_id;
      p1.steps = &v.step;
      p1.positions = &v.position;
      int32_t token = -7;
      float score = -7.0f;
      const flashspec_status s = flashspec_draft(b.p, head, &ov, &p1, &token, &score);
      FS_CHECK(s == FLASHSPEC_OK, "row %d drafted alone failed with %s (%s)", r, name(s),
               flashspec_context_last_error(b.p));
      FS_CHECK(token == tokens.get(size_t(r)), "row %d drafted alone gave token %d, in the batch %d", r, token,
               tokens.get(size_t(r)));
      if (with_scores)
        FS_CHECK(same_bits(score, scores.get(size_t(r))), "row %d drafted alone gave score %.9g, in the batch %.9g", r,
                 double(score), double(scores.get(size_t(r))));
    }
  }
  return 0;
}
