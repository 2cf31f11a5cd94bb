// The CPU benchmark: FlashSpec's fused CPU draft and verify against an
// OpenBLAS GEMM of the same LM head, on one machine, in one run.
//
// For each shape (V, d, rows) it times, with the same number of threads:
//   sgemm          cblas_sgemm: logits [rows, V] = hidden [rows, d] · Wᵀ, fp32,
//                  logits only (no softmax, no sampling);
//   verify_t1      flashspec_verify_and_finalize, one request with rows − 1
//                  greedy drafts (rows target rows), temperature 1;
//   verify_t0      the same at temperature 0;
//   draft_greedy   flashspec_draft of rows hidden rows, temperature 0;
//   draft_t1       flashspec_draft, temperature 1 (Gumbel-max and log q);
// each the median of --reps runs after --warmup runs, the hidden rows rotated
// over a few sets. The fused calls run on heads of the dtypes asked for
// (--dtypes): an f32 head is the same W the GEMM reads; a bf16/f16 head is W
// rounded to that dtype, while the GEMM still reads the f32 W (OpenBLAS has
// no half-precision GEMM here), so those ratios compare against f32 traffic.
// One line per shape and dtype gives the times and the ratios fused ÷ sgemm;
// --json writes every number.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "flashspec.h"

namespace {

struct Options {
  int threads = 2;
  int reps = 7;
  int warmup = 2;
  double max_weight_gb = 4.0;  // shapes whose f32 W is larger are skipped
  std::vector<int64_t> vocabs{16000, 32000, 128256};
  std::vector<int64_t> hiddens{512, 2048, 4096};
  std::vector<int32_t> rows{1, 2, 4, 5, 8, 16};
  std::vector<flashspec_dtype> dtypes{FLASHSPEC_DTYPE_F32, FLASHSPEC_DTYPE_BF16};
  std::string json_path = "cpu_bench.json";
};

const char* dtype_name(flashspec_dtype t) {
  switch (t) {
    case FLASHSPEC_DTYPE_F32: return "f32";
    case FLASHSPEC_DTYPE_BF16: return "bf16";
    case FLASHSPEC_DTYPE_F16: return "f16";
    default: return "?";
  }
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "flashspec_cpu_bench: %s\n"
               "usage: flashspec_cpu_bench [--threads N] [--reps N] [--warmup N] [--vocab V,V,...]\n"
               "       [--hidden d,d,...] [--rows r,r,...] [--dtypes f32,bf16,f16] [--max-weight-gb G]\n"
               "       [--json PATH]\n",
               why);
  std::exit(2);
}

template <typename T>
std::vector<T> parse_list(const char* text) {
  std::vector<T> out;
  std::string s(text);
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    char* end = nullptr;
    long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v <= 0) usage(("bad list item '" + item + "'").c_str());
    out.push_back(T(v));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage(("missing value after " + a).c_str());
      return argv[++i];
    };
    if (a == "--threads") o.threads = std::atoi(value());
    else if (a == "--reps") o.reps = std::atoi(value());
    else if (a == "--warmup") o.warmup = std::atoi(value());
    else if (a == "--max-weight-gb") o.max_weight_gb = std::atof(value());
    else if (a == "--vocab") o.vocabs = parse_list<int64_t>(value());
    else if (a == "--hidden") o.hiddens = parse_list<int64_t>(value());
    else if (a == "--rows") o.rows = parse_list<int32_t>(value());
    else if (a == "--json") o.json_path = value();
    else if (a == "--dtypes") {
      o.dtypes.clear();
      std::string s = value();
      for (size_t start = 0; start <= s.size();) {
        size_t comma = s.find(',', start);
        std::string t = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        if (t == "f32") o.dtypes.push_back(FLASHSPEC_DTYPE_F32);
        else if (t == "bf16") o.dtypes.push_back(FLASHSPEC_DTYPE_BF16);
        else if (t == "f16") o.dtypes.push_back(FLASHSPEC_DTYPE_F16);
        else usage(("unknown dtype '" + t + "'").c_str());
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else usage(("unknown argument " + a).c_str());
  }
  if (o.threads < 1 || o.reps < 1 || o.warmup < 0) usage("threads and reps must be ≥ 1, warmup ≥ 0");
  return o;
}

// splitmix64: fast enough to fill gigabytes of weights.
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform_pm1() { return float(int64_t(next() >> 40) - (int64_t(1) << 23)) * (1.0f / float(1 << 23)); }
};

uint16_t to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);  // round to nearest even (inputs are finite)
}

uint16_t to_f16(float f) {
  // Inputs lie in (−1, 1) and are far from the subnormal range after scaling.
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  int32_t exponent = int32_t((x >> 23) & 0xff) - 127 + 15;
  uint32_t mantissa = x & 0x7fffffu;
  if (exponent <= 0) return uint16_t(sign);  // flush the tiny to zero
  uint32_t half = sign | (uint32_t(exponent) << 10) | (mantissa >> 13);
  uint32_t rest = mantissa & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
  return uint16_t(half);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Median seconds of `reps` calls of run(rep) after `warmup` calls.
double time_median(int warmup, int reps, const std::function<void(int)>& run) {
  for (int i = 0; i < warmup; ++i) run(i);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto start = std::chrono::steady_clock::now();
    run(warmup + i);
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return median(t);
}

void check(flashspec_status s, flashspec_context* ctx, const char* what) {
  if (s != FLASHSPEC_OK) {
    std::fprintf(stderr, "%s failed: %s: %s\n", what, flashspec_status_string(s), flashspec_context_last_error(ctx));
    std::exit(1);
  }
}

struct Result {
  int64_t vocab, hidden;
  int32_t rows;
  const char* dtype;
  double sgemm, verify_t1, verify_t0, draft_greedy, draft_t1;
};

constexpr int kHiddenSets = 4;  // hidden rows rotated so no call reuses the last one's

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  openblas_set_num_threads(o.threads);
  flashspec_context_params params;
  flashspec_context_params_init(&params);
  params.backend = FLASHSPEC_BACKEND_CPU;
  params.cpu_threads = o.threads;
  params.seed = 1234;
  flashspec_context* ctx = nullptr;
  check(flashspec_context_create(&params, &ctx), nullptr, "flashspec_context_create");

  const int32_t max_rows = *std::max_element(o.rows.begin(), o.rows.end());
  std::printf("# flashspec %s, OpenBLAS %s, %d threads, median of %d after %d warm-up\n",
              flashspec_version_string(), openblas_get_config(), o.threads, o.reps, o.warmup);
  std::printf("# times in ms; ratios fused / sgemm (sgemm on the f32 W for every head dtype)\n");
  std::printf("%-7s %-5s %-5s %-4s %9s %9s %9s %9s %9s | %7s %7s %7s %7s\n", "V", "d", "dtype", "rows", "sgemm",
              "ver_t1", "ver_t0", "dr_gr", "dr_t1", "ver_t1", "ver_t0", "dr_gr", "dr_t1");
  std::fflush(stdout);
  std::vector<Result> results;
  for (int64_t d : o.hiddens) {
    for (int64_t V : o.vocabs) {
      const double weight_gb = double(V) * double(d) * 4.0 / 1e9;
      if (weight_gb > o.max_weight_gb) {
        std::printf("# V=%lld d=%lld skipped: f32 W is %.1f GB (> --max-weight-gb %.1f)\n", (long long)V,
                    (long long)d, weight_gb, o.max_weight_gb);
        continue;
      }
      // W scaled so logits have a standard deviation of about 2, hidden
      // values uniform in (−1, 1).
      Rng rng{uint64_t(V * 131 + d)};
      const float w_scale = 2.0f * std::sqrt(3.0f) * std::sqrt(3.0f / float(d));
      std::vector<float> w(size_t(V * d));
      for (float& x : w) x = rng.uniform_pm1() * w_scale;
      std::vector<float> hidden(size_t(kHiddenSets) * size_t(max_rows) * size_t(d));
      for (float& x : hidden) x = rng.uniform_pm1();
      std::vector<float> logits(static_cast<size_t>(max_rows) * size_t(V));

      // Heads of every dtype first, so each row count times the GEMM and
      // then the fused calls back to back (the machine's load drifts).
      std::vector<flashspec_lm_head*> heads;
      for (flashspec_dtype dtype : o.dtypes) {
        std::vector<uint16_t> half;
        const void* weight_data = w.data();
        if (dtype != FLASHSPEC_DTYPE_F32) {
          half.resize(w.size());
          for (size_t i = 0; i < w.size(); ++i) half[i] = dtype == FLASHSPEC_DTYPE_BF16 ? to_bf16(w[i]) : to_f16(w[i]);
          weight_data = half.data();
        }
        flashspec_tensor weight = flashspec_tensor_make(weight_data, dtype, FLASHSPEC_MEMORY_HOST, V, d);
        flashspec_lm_head* head = nullptr;
        check(flashspec_lm_head_create(ctx, &weight, FLASHSPEC_LM_HEAD_COPY, &head), ctx, "flashspec_lm_head_create");
        heads.push_back(head);
      }

      for (int32_t rows : o.rows) {
        const double sgemm = time_median(o.warmup, o.reps, [&](int rep) {
          const float* h = hidden.data() + size_t(rep % kHiddenSets) * size_t(max_rows) * size_t(d);
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, int(V), int(d), 1.0f, h, int(d), w.data(),
                      int(d), 0.0f, logits.data(), int(V));
        });
        // OpenBLAS's workers spin for a while after a call (about 2^28
        // cycles); pause until they sleep, so they do not take the cores
        // from the fused calls timed next.
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        for (size_t di = 0; di < o.dtypes.size(); ++di) {
          const flashspec_dtype dtype = o.dtypes[di];
          flashspec_lm_head* head = heads[di];
          auto hidden_view = [&](int rep) {
            return flashspec_tensor_make(hidden.data() + size_t(rep % kHiddenSets) * size_t(max_rows) * size_t(d),
                                         FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, rows, d);
          };
          // One request, rows − 1 point-mass drafts, random draft tokens.
          std::vector<int32_t> offsets{0, rows - 1};
          std::vector<int32_t> drafts(size_t(std::max(rows - 1, 1)));
          for (int32_t& t : drafts) t = int32_t(rng.next() % uint64_t(V));
          std::vector<int32_t> accepted(1), emitted(static_cast<size_t>(rows));
          std::vector<uint64_t> next_steps(1);
          auto verify = [&](float temperature) {
            return time_median(o.warmup, o.reps, [&](int rep) {
              flashspec_tensor h = hidden_view(rep);
              flashspec_verify_batch batch;
              flashspec_verify_batch_init(&batch);
              batch.num_requests = 1;
              batch.draft_offsets = offsets.data();
              batch.draft_tokens = drafts.data();
              batch.target_hidden = &h;
              batch.temperatures = &temperature;
              uint64_t step = uint64_t(rep);
              batch.steps = &step;
              flashspec_verify_result result;
              flashspec_verify_result_init(&result);
              result.accepted_counts = accepted.data();
              result.emitted_tokens = emitted.data();
              result.next_steps = next_steps.data();
              check(flashspec_verify_and_finalize(ctx, head, &batch, &result), ctx, "flashspec_verify_and_finalize");
            });
          };
          std::vector<int32_t> tokens(static_cast<size_t>(rows));
          std::vector<float> scores(static_cast<size_t>(rows));
          std::vector<int32_t> positions(static_cast<size_t>(rows));
          for (int32_t r = 0; r < rows; ++r) positions[size_t(r)] = r;
          auto draft = [&](float temperature) {
            return time_median(o.warmup, o.reps, [&](int rep) {
              flashspec_tensor h = hidden_view(rep);
              flashspec_draft_params dp;
              flashspec_draft_params_init(&dp);
              dp.temperature = temperature;
              dp.positions = positions.data();
              std::vector<uint64_t> steps(static_cast<size_t>(rows), uint64_t(rep));
              dp.steps = steps.data();
              check(flashspec_draft(ctx, head, &h, &dp, tokens.data(), scores.data()), ctx, "flashspec_draft");
            });
          };
          Result r{V, d, rows, dtype_name(dtype), sgemm, verify(1.0f), verify(0.0f), draft(0.0f),
                   draft(1.0f)};
          results.push_back(r);
          std::printf("%-7lld %-5lld %-5s %-4d %9.3f %9.3f %9.3f %9.3f %9.3f | %7.2f %7.2f %7.2f %7.2f\n",
                      (long long)V, (long long)d, r.dtype, rows, r.sgemm * 1e3, r.verify_t1 * 1e3,
                      r.verify_t0 * 1e3, r.draft_greedy * 1e3, r.draft_t1 * 1e3, r.verify_t1 / r.sgemm,
                      r.verify_t0 / r.sgemm, r.draft_greedy / r.sgemm, r.draft_t1 / r.sgemm);
          std::fflush(stdout);
        }
      }
      for (flashspec_lm_head* head : heads) flashspec_lm_head_destroy(head);
    }
  }
  flashspec_context_destroy(ctx);

  FILE* f = std::fopen(o.json_path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "cannot write %s\n", o.json_path.c_str());
    return 1;
  }
  std::fprintf(f, "{\n  \"flashspec\": \"%s\",\n  \"openblas\": \"%s\",\n  \"threads\": %d,\n  \"reps\": %d,\n"
                  "  \"warmup\": %d,\n  \"unit\": \"seconds (median)\",\n  \"results\": [\n",
               flashspec_version_string(), openblas_get_config(), o.threads, o.reps, o.warmup);
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    std::fprintf(f,
                 "    {\"vocab\": %lld, \"hidden\": %lld, \"rows\": %d, \"head_dtype\": \"%s\", \"sgemm_f32\": %.9g, "
                 "\"verify_t1\": %.9g, \"verify_t0\": %.9g, \"draft_greedy\": %.9g, \"draft_t1\": %.9g, "
                 "\"ratio_verify_t1\": %.4f, \"ratio_verify_t0\": %.4f, \"ratio_draft_greedy\": %.4f, "
                 "\"ratio_draft_t1\": %.4f}%s\n",
                 (long long)r.vocab, (long long)r.hidden, r.rows, r.dtype, r.sgemm, r.verify_t1, r.verify_t0,
                 r.draft_greedy, r.draft_t1, r.verify_t1 / r.sgemm, r.verify_t0 / r.sgemm, r.draft_greedy / r.sgemm,
                 r.draft_t1 / r.sgemm, i + 1 < results.size() ? "," : "");
  }
  std::fprintf(f, "  ]\n}\n");
  std::fclose(f);
  std::printf("# wrote %s\n", o.json_path.c_str());
  return 0;
}
