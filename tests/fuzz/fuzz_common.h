// Shared pieces of the libFuzzer harnesses (tests/fuzz/fuzz_*.cc).
//
//   Input        reads the fuzz input front to back; past its end every read
//                gives 0, so a short (or empty) input is a valid, plain call.
//   Guarded<T>   an output buffer with guard words before and after it and a
//                poison value in every element: a write past the documented
//                size, or any write on an error path, is seen.
//   check()      an invariant; on violation prints what failed and aborts,
//                which libFuzzer reports as a crash with the input saved.
//   Host values  bf16/fp16 encodings, tensors the harnesses own, and the
//                float64 reference logits with the fp32 error bound.
//
// The harnesses use only the public header; they link the library's objects
// statically so the fuzzer sees its coverage.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "flashspec.h"

namespace fsfuzz {

// ---------------------------------------------------------------------------
// Invariant failures
// ---------------------------------------------------------------------------
[[noreturn]] inline void violation(const char* file, int line, const char* fmt, ...) {
  std::fprintf(stderr, "\nFLASHSPEC INVARIANT VIOLATED at %s:%d: ", file, line);
  va_list args;
  va_start(args, fmt);
  std::vfprintf(stderr, fmt, args);
  va_end(args);
  std::fprintf(stderr, "\n");
  std::fflush(stderr);
  std::abort();
}

#define FS_CHECK(cond, ...)                                      \
  do {                                                           \
    if (!(cond)) ::fsfuzz::violation(__FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

inline const char* name(flashspec_status s) { return flashspec_status_name(s); }

// Every status a call returns is one of the table's.
inline bool known_status(flashspec_status s) {
  const int32_t v = int32_t(s);
  return v >= 0 && v <= 15;
}

// A failed call leaves a message (on ctx, or the thread's for ctx NULL).
inline void check_error_message(const flashspec_context* ctx, flashspec_status s, const char* call) {
  FS_CHECK(known_status(s), "%s returned unknown status %d", call, int(s));
  if (s == FLASHSPEC_OK) return;
  const char* message = flashspec_context_last_error(ctx);
  FS_CHECK(message != nullptr, "%s failed with %s and last_error is NULL", call, name(s));
  FS_CHECK(message[0] != '\0', "%s failed with %s and an empty last_error message", call, name(s));
  FS_CHECK(s != FLASHSPEC_ERR_INTERNAL, "%s returned FLASHSPEC_ERR_INTERNAL: %s", call, message);
}

// ---------------------------------------------------------------------------
// Input
// ---------------------------------------------------------------------------
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  uint8_t u8() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint16_t u16() { return uint16_t(u8() | (uint16_t(u8()) << 8)); }
  uint32_t u32() { return uint32_t(u16()) | (uint32_t(u16()) << 16); }
  uint64_t u64() { return uint64_t(u32()) | (uint64_t(u32()) << 32); }
  float f32() {
    uint32_t bits = u32();
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  double f64() {
    uint64_t bits = u64();
    double f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  // An integer in [lo, hi]: one byte when the span fits one, else more.
  int64_t range(int64_t lo, int64_t hi) {
    const uint64_t span = uint64_t(hi - lo) + 1;
    uint64_t raw;
    if (span <= 0x100) raw = u8();
    else if (span <= 0x10000) raw = u16();
    else if (span <= 0x100000000ull) raw = u32();
    else raw = u64();
    return span == 0 ? int64_t(raw) : lo + int64_t(raw % span);
  }
  // One byte below `threshold` (of 256).
  bool chance(int threshold) { return u8() < threshold; }
  // A selector byte: 0 means "as planned"; otherwise a value in [1, n].
  int pick(int n) { return int(u8() % uint32_t(n)); }
  size_t remaining() const { return pos_ < size_ ? size_ - pos_ : 0; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// A small deterministic generator for bulk values (weights, hidden rows),
// seeded from the input, so the input stays small.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return (double(next() >> 11) + 0.5) * 0x1.0p-53; }
  double normal() { return std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform()); }
  int64_t below(int64_t n) { return n <= 0 ? 0 : int64_t(next() % uint64_t(n)); }

 private:
  uint64_t state_;
};

// ---------------------------------------------------------------------------
// Enum fields as a C caller may fill them
// ---------------------------------------------------------------------------
template <class Enum>
void set_raw(Enum& field, int32_t value) {
  static_assert(sizeof(Enum) == sizeof(int32_t), "flashspec enums are 32-bit");
  std::memcpy(&field, &value, sizeof value);
}

// ---------------------------------------------------------------------------
// Guarded output buffers
// ---------------------------------------------------------------------------
constexpr uint8_t kGuardByte = 0xA5;
constexpr size_t kGuardBytes = 64;

template <class T>
class Guarded {
 public:
  Guarded() { resize(0); }
  explicit Guarded(size_t count, size_t slack = 0) { resize(count, slack); }
  // count elements, then `slack` spare elements (also guarded), then guards.
  void resize(size_t count, size_t slack = 0) {
    count_ = count;
    slack_ = slack;
    bytes_.assign(kGuardBytes + (count + slack) * sizeof(T) + kGuardBytes, kGuardByte);
    snapshot_ = bytes_;
  }
  T* data() { return reinterpret_cast<T*>(bytes_.data() + kGuardBytes); }
  const T* data() const { return reinterpret_cast<const T*>(bytes_.data() + kGuardBytes); }
  size_t size() const { return count_; }
  T get(size_t i) const {
    T v;
    std::memcpy(&v, bytes_.data() + kGuardBytes + i * sizeof(T), sizeof(T));
    return v;
  }
  void set(size_t i, const T& v) { std::memcpy(bytes_.data() + kGuardBytes + i * sizeof(T), &v, sizeof(T)); }
  // Every element (the spare ones too) set to the poison bytes.
  void poison() {
    std::memset(bytes_.data() + kGuardBytes, 0x7E, (count_ + slack_) * sizeof(T));
    snapshot_.assign(bytes_.begin(), bytes_.end());
  }
  // Call after writing values: the current bytes become the reference for
  // untouched().
  void snapshot() { snapshot_.assign(bytes_.begin(), bytes_.end()); }
  bool untouched() const { return bytes_ == snapshot_; }
  // The guards, and the spare elements, hold what they held.
  bool guards_intact() const {
    for (size_t i = 0; i < kGuardBytes; ++i)
      if (bytes_[i] != kGuardByte || bytes_[bytes_.size() - 1 - i] != kGuardByte) return false;
    if (slack_ && !snapshot_.empty()) {
      const size_t begin = kGuardBytes + count_ * sizeof(T);
      const size_t end = begin + slack_ * sizeof(T);
      for (size_t i = begin; i < end; ++i)
        if (bytes_[i] != snapshot_[i]) return false;
    }
    return true;
  }
  // Elements [i, size) hold the poison bytes.
  bool poisoned_from(size_t i) const {
    for (size_t b = kGuardBytes + i * sizeof(T); b < kGuardBytes + count_ * sizeof(T); ++b)
      if (bytes_[b] != 0x7E) return false;
    return true;
  }
  bool element_poisoned(size_t i) const {
    for (size_t b = 0; b < sizeof(T); ++b)
      if (bytes_[kGuardBytes + i * sizeof(T) + b] != 0x7E) return false;
    return true;
  }

 private:
  size_t count_ = 0, slack_ = 0;
  std::vector<uint8_t> bytes_;
  std::vector<uint8_t> snapshot_;
};

// ---------------------------------------------------------------------------
// Host tensors
// ---------------------------------------------------------------------------
inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x0040u);
  return uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}
inline float bf16_to_float(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1fu) bits = sign | 0x7f800000u | (mantissa << 13);
  else if (exponent == 0) {
    float magnitude = float(mantissa) * 5.9604644775390625e-08f;
    return sign ? -magnitude : magnitude;
  } else bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
// Round to nearest even through float64 (exact enough for the test values).
inline uint16_t float_to_fp16(float value) {
  if (std::isnan(value)) return 0x7e00;
  const uint16_t sign = std::signbit(value) ? 0x8000 : 0;
  double a = std::fabs(double(value));
  if (a >= 65520.0) return uint16_t(sign | 0x7c00);
  if (a < std::ldexp(1.0, -14)) {  // subnormal: multiples of 2^-24
    double q = std::nearbyint(a * std::ldexp(1.0, 24));
    return uint16_t(sign | uint16_t(q));
  }
  int e;
  double m = std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
  double q = std::nearbyint(m * 2048.0);  // 11 significant bits
  if (q >= 2048.0) {
    q /= 2.0;
    ++e;
  }
  const uint32_t exponent = uint32_t(e - 1 + 15);
  if (exponent >= 31) return uint16_t(sign | 0x7c00);
  return uint16_t(sign | (exponent << 10) | (uint32_t(q) & 0x3ffu));
}

inline size_t dtype_bytes(int32_t dtype) { return dtype == FLASHSPEC_DTYPE_F32 ? 4 : 2; }

// A [rows, cols] host matrix stored in one dtype with a row stride and a byte
// offset from an aligned base (offset ≠ 0 makes the data misaligned), and
// the value of every element as the library reads it.
struct HostMatrix {
  int32_t dtype = FLASHSPEC_DTYPE_F32;
  int64_t rows = 0, cols = 0, stride = 0;
  size_t offset = 0;
  std::vector<uint8_t> storage;
  std::vector<float> value;  // [rows, cols], the stored values widened

  void init(int32_t t, int64_t r, int64_t c, int64_t extra_stride, size_t byte_offset) {
    dtype = t;
    rows = r;
    cols = c;
    stride = c + extra_stride;
    offset = byte_offset;
    storage.assign(offset + size_t(std::max<int64_t>(r, 1) * stride) * dtype_bytes(t) + 16, 0);
    value.assign(size_t(r * c), 0.0f);
  }
  uint8_t* base() { return storage.data() + offset; }
  const void* data() const { return storage.data() + offset; }
  void set(int64_t r, int64_t c, float v) {
    uint8_t* p = base() + size_t(r * stride + c) * dtype_bytes(dtype);
    float stored;
    if (dtype == FLASHSPEC_DTYPE_F32) {
      std::memcpy(p, &v, 4);
      stored = v;
    } else if (dtype == FLASHSPEC_DTYPE_BF16) {
      uint16_t h = float_to_bf16(v);
      std::memcpy(p, &h, 2);
      stored = bf16_to_float(h);
    } else {
      uint16_t h = float_to_fp16(v);
      std::memcpy(p, &h, 2);
      stored = fp16_to_float(h);
    }
    value[size_t(r * cols + c)] = stored;
  }
  float at(int64_t r, int64_t c) const { return value[size_t(r * cols + c)]; }
  bool all_finite() const {
    for (float v : value)
      if (!std::isfinite(v)) return false;
    return true;
  }
  flashspec_tensor view() const {
    flashspec_tensor t = flashspec_tensor_make(data(), FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, rows, cols);
    set_raw(t.dtype, dtype);
    t.row_stride = stride;
    return t;
  }
  bool misaligned() const { return offset % dtype_bytes(dtype) != 0; }
};

// How bulk values are drawn: most modes are moderate (no logit can
// overflow); the others reach the edges (ties, huge values).
enum class ValueMode : uint8_t {
  kNormal = 0,     // scale · N(0, 1)
  kSmallInts = 1,  // {−1, 0, 1}: many exact ties
  kZeros = 2,      // all zero: every logit ties
  kWide = 3,       // ±2^k for k in [−20, 20]
  kHuge = 4,       // magnitudes up to 3e38 (logits may overflow)
  kCount = 5,
};

inline float draw_value(Rng& rng, ValueMode mode, float scale) {
  switch (mode) {
    case ValueMode::kSmallInts: return float(rng.below(3) - 1);
    case ValueMode::kZeros: return 0.0f;
    case ValueMode::kWide: return float((rng.below(2) ? 1.0 : -1.0) * std::ldexp(1.0, int(rng.below(41)) - 20));
    case ValueMode::kHuge: return float((rng.below(2) ? 1.0 : -1.0) * std::ldexp(1.0 + rng.uniform(), int(rng.below(128))));
    default: return float(scale * rng.normal());
  }
}

// Fills m from rng in `mode`; `duplicate_rows` copies row 0 over some rows
// (exact ties of whole logits).
inline void fill(HostMatrix& m, Rng& rng, ValueMode mode, float scale, bool duplicate_rows = false) {
  for (int64_t r = 0; r < m.rows; ++r)
    for (int64_t c = 0; c < m.cols; ++c) m.set(r, c, draw_value(rng, mode, scale));
  if (duplicate_rows && m.rows > 1)
    for (int64_t r = 1; r < m.rows; ++r)
      if (rng.below(3) == 0)
        for (int64_t c = 0; c < m.cols; ++c) m.set(r, c, m.at(0, c));
}

// ---------------------------------------------------------------------------
// Reference logits
// ---------------------------------------------------------------------------
// l_v = Σ_c h_c w_vc in float64 (exact for these few terms up to rounding of
// 1e-16), with the bound γ_(d+1) Σ|h w| on the error of any fp32 evaluation
// of the same sum, whatever its order, as long as nothing overflows.
struct RowLogits {
  std::vector<double> logit, bound, magnitude;
  double max_logit = -INFINITY;   // max over v of l_v
  double max_magnitude = 0.0;     // max over v of Σ|h w|
  double max_bound = 0.0;
};

inline RowLogits row_logits(const HostMatrix& w, const HostMatrix& h, int64_t row) {
  RowLogits out;
  const double u = std::ldexp(1.0, -24);
  const double n = double(w.cols + 2);
  const double gamma = n * u / (1.0 - n * u);
  out.logit.resize(size_t(w.rows));
  out.bound.resize(size_t(w.rows));
  out.magnitude.resize(size_t(w.rows));
  for (int64_t v = 0; v < w.rows; ++v) {
    double sum = 0.0, mag = 0.0;
    for (int64_t c = 0; c < w.cols; ++c) {
      const double p = double(w.at(v, c)) * double(h.at(row, c));
      sum += p;
      mag += std::fabs(p);
    }
    out.logit[size_t(v)] = sum;
    out.magnitude[size_t(v)] = mag;
    // Products below the fp32 normal range round absolutely (2^-150 each).
    out.bound[size_t(v)] = gamma * mag + 1e-12 * mag + double(w.cols + 1) * 0x1.0p-149;
    out.max_logit = std::max(out.max_logit, sum);
    out.max_magnitude = std::max(out.max_magnitude, mag);
    out.max_bound = std::max(out.max_bound, out.bound[size_t(v)]);
  }
  return out;
}

// Rows v < x of W equal to row x, element for element: their logits are the
// same fp32 number, so an argmax must not pick x over them (ties go to the
// smallest id).
inline int64_t smaller_duplicate(const HostMatrix& w, int64_t x) {
  for (int64_t v = 0; v < x; ++v) {
    bool same = true;
    for (int64_t c = 0; c < w.cols && same; ++c) {
      float a = w.at(v, c), b = w.at(x, c);
      same = std::memcmp(&a, &b, sizeof a) == 0;
    }
    if (same) return v;
  }
  return -1;
}

// Whether an fp32 evaluation of the row's logits, and of the logits times
// inv_t (a float, as the library computes 1/T), must stay finite (`never`)
// or must overflow (`surely`); between the two, either may happen.
struct Overflow {
  bool never = true;
  bool surely = false;
};

inline Overflow logit_overflow(const RowLogits& l, float inv_t, bool greedy) {
  const double big = double(std::numeric_limits<float>::max());
  Overflow o;
  const double scale = greedy ? 1.0 : double(inv_t);
  if (!greedy && std::isinf(inv_t)) {
    o.never = false;
    o.surely = true;
    return o;
  }
  // Partial sums never exceed Σ|h w| (1 + γ); scaling adds one rounding.
  o.never = l.max_magnitude * 1.01 < big && l.max_magnitude * 1.01 * scale < big * 0.99;
  for (size_t v = 0; v < l.logit.size(); ++v) {
    const double low = std::fabs(l.logit[v]) - l.bound[v];
    if (low > big * 1.01 || (low > 0 && low * scale > big * 1.01)) o.surely = true;
  }
  return o;
}

// The library's 1/T for a positive T.
inline float inverse(float t) { return 1.0f / t; }

// ---------------------------------------------------------------------------
// Contexts
// ---------------------------------------------------------------------------
inline flashspec_context* make_context(uint64_t seed, int32_t threads, int32_t max_rows, int32_t max_requests) {
  flashspec_context_params p;
  flashspec_context_params_init(&p);
  p.backend = FLASHSPEC_BACKEND_CPU;
  p.seed = seed;
  p.cpu_threads = threads;
  p.max_rows = max_rows;
  p.max_requests = max_requests;
  flashspec_context* ctx = nullptr;
  const flashspec_status s = flashspec_context_create(&p, &ctx);
  FS_CHECK(s == FLASHSPEC_OK && ctx != nullptr, "a valid CPU context could not be created: %s (%s)", name(s),
           flashspec_context_last_error(nullptr));
  return ctx;
}

// Owning handles.
struct Context {
  flashspec_context* p = nullptr;
  Context() = default;
  explicit Context(flashspec_context* c) : p(c) {}
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  ~Context() { flashspec_context_destroy(p); }
};
struct Head {
  flashspec_lm_head* p = nullptr;
  Head() = default;
  explicit Head(flashspec_lm_head* h) : p(h) {}
  Head(const Head&) = delete;
  Head& operator=(const Head&) = delete;
  ~Head() { flashspec_lm_head_destroy(p); }
};
struct Summaries {
  flashspec_summaries* p = nullptr;
  Summaries() = default;
  Summaries(const Summaries&) = delete;
  Summaries& operator=(const Summaries&) = delete;
  ~Summaries() { flashspec_summaries_destroy(p); }
};

inline flashspec_lm_head* make_head(flashspec_context* ctx, const HostMatrix& w) {
  const flashspec_tensor t = w.view();
  flashspec_lm_head* head = nullptr;
  const flashspec_status s = flashspec_lm_head_create(ctx, &t, FLASHSPEC_LM_HEAD_COPY, &head);
  FS_CHECK(s == FLASHSPEC_OK && head, "a valid LM head [%lld, %lld] dtype %d could not be created: %s (%s)",
           (long long)w.rows, (long long)w.cols, int(w.dtype), name(s), flashspec_context_last_error(ctx));
  return head;
}

// struct_size: the library accepts every size from the struct's first
// published layout up to today's. The structs that grew in 0.2 started where
// their first appended field is; every other one has kept its 0.1 layout.
template <class T>
struct FirstSize {
  static constexpr size_t value = sizeof(T);
};
template <>
struct FirstSize<flashspec_draft_params> {
  static constexpr size_t value = offsetof(flashspec_draft_params, controls);
};
template <>
struct FirstSize<flashspec_verify_batch> {
  static constexpr size_t value = offsetof(flashspec_verify_batch, controls);
};
template <>
struct FirstSize<flashspec_verify_result> {
  static constexpr size_t value = offsetof(flashspec_verify_result, logprobs);
};

template <class T>
bool accepted_struct_size(uint32_t given) {
  return given >= FirstSize<T>::value && given <= sizeof(T);
}

// Float helpers.
inline bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }
inline float bits_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// An interesting float: the byte picks a class, the rest of the value comes
// from the input.
inline float interesting_float(Input& in) {
  switch (in.u8() % 16) {
    case 0: return 1.0f;
    case 1: return 0.0f;
    case 2: return -0.0f;
    case 3: return 0.5f;
    case 4: return 2.0f;
    case 5: return -1.0f;
    case 6: return std::numeric_limits<float>::quiet_NaN();
    case 7: return std::numeric_limits<float>::infinity();
    case 8: return -std::numeric_limits<float>::infinity();
    case 9: return std::numeric_limits<float>::denorm_min();
    case 10: return std::numeric_limits<float>::min();
    case 11: return std::numeric_limits<float>::max();
    case 12: return 1e-30f;
    case 13: return 0.999999940395f;  // the largest float below 1
    case 14: return float(in.u8()) / 16.0f;
    default: return in.f32();
  }
}

}  // namespace fsfuzz
