/*
 * flashspec.h — FlashSpec: a fused LM head + speculative-decoding sampler.
 *
 * FlashSpec computes an LLM's LM head (logits = hidden · Wᵀ over the whole
 * vocabulary) and, in the same pass over W, everything speculative decoding
 * needs from those logits: greedy or sampled draft tokens, and the per-row
 * summaries that verify a batch of draft tokens and resample after a
 * rejection. No vocabulary-sized logits, probabilities or residuals are ever
 * written to memory. The emitted tokens are distributed exactly as sampling
 * from the target model alone (Leviathan et al. 2023, Algorithm 1).
 *
 * This header is the manual and the whole public API. Conventions:
 *   - Every function returns a flashspec_status; FLASHSPEC_OK is 0. On any
 *     error, every output argument is left untouched and
 *     flashspec_context_last_error() names the argument that was wrong.
 *   - Parameter structs begin with `uint32_t struct_size`; fill them with
 *     their *_init() function, then change the fields you need. Fields are
 *     only ever appended, so an older caller keeps working: the library
 *     reads a struct only as far as its struct_size. A struct that has grown
 *     has an *_init_sized(p, size) entry point, and its *_init(p) is a macro
 *     that passes the size of the struct this header declares, so the
 *     library writes exactly the caller's struct; the *_init symbol itself stays exported for binaries built
 *     against the first layout and fills that layout only.
 *   - Handles are opaque. Every *_destroy() accepts NULL.
 *   - Threading tags on every function:
 *       [thread-safe]          may be called from any thread at any time;
 *       [context-exclusive]    one thread at a time per context;
 *       [async on the context stream]  with the CUDA backend the work is
 *         enqueued on the context's stream and the call returns without
 *         waiting; outputs are ready after flashspec_context_synchronize()
 *         or any later work ordered on that stream. The CPU backend runs
 *         synchronously.
 *   - No C++ exception and no CUDA error state ever crosses this boundary.
 *
 * Randomness contract. Every random number is Philox4x32-10 with
 *   key     = (low 32 bits of seed, high 32 bits of seed)
 *   counter = (c0, c1, c2, c3) with
 *     c0 = purpose << 28 | position << 18 | token >> 2   (word = token & 3)
 *     c1 = low 32 bits of step
 *     c2 = low 32 bits of request id, c3 = high 32 bits of request id
 * where position is the row within the request (draft position; for the
 * acceptance uniform of a tree's stochastic child, its node index: see
 * Tree verify), and the purposes (flashspec_rng_purpose) are never shared. A uniform u in (0, 1) is
 * (x + 0.5) / 2^32 of one 32-bit word x; Gumbel noise is −log(−log u),
 * evaluated so that both tails are kept. Hence every token is a function of
 * (seed, request id, step, position, token) alone: independent of tiling,
 * threads, backend and batch neighbours.
 */
#ifndef FLASHSPEC_H
#define FLASHSPEC_H

#include <stddef.h>
#include <stdint.h>

/* ---------------------------------------------------------------------- */
/* Export macro                                                            */
/* ---------------------------------------------------------------------- */
#if defined(_WIN32)
#  define FLASHSPEC_VISIBLE
#elif defined(__GNUC__) && (__GNUC__ >= 4)
#  define FLASHSPEC_VISIBLE __attribute__((visibility("default")))
#else
#  define FLASHSPEC_VISIBLE
#endif
#ifndef FLASHSPEC_API
#  define FLASHSPEC_API FLASHSPEC_VISIBLE
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------- */
/* Version                                                                 */
/* ---------------------------------------------------------------------- */
#define FLASHSPEC_VERSION_MAJOR 0
#define FLASHSPEC_VERSION_MINOR 2
#define FLASHSPEC_VERSION_PATCH 0
#define FLASHSPEC_VERSION_NUMBER \
  (FLASHSPEC_VERSION_MAJOR * 10000 + FLASHSPEC_VERSION_MINOR * 100 + FLASHSPEC_VERSION_PATCH)
/* Bumped on every incompatible ABI change; equals the SONAME's number. */
#define FLASHSPEC_ABI_VERSION 0

/* [thread-safe] FLASHSPEC_VERSION_NUMBER of the library actually loaded. */
FLASHSPEC_API unsigned flashspec_version_number(void);
/* [thread-safe] "MAJOR.MINOR.PATCH" of the library actually loaded; static. */
FLASHSPEC_API const char* flashspec_version_string(void);
/* [thread-safe] FLASHSPEC_ABI_VERSION of the library actually loaded. */
FLASHSPEC_API unsigned flashspec_abi_version(void);

/* ---------------------------------------------------------------------- */
/* Status codes: numbers are pinned forever                                */
/* ---------------------------------------------------------------------- */
/* X(name, value, description) — one table generates the enum and strings. */
#define FLASHSPEC_STATUS_TABLE(X)                                                       \
  X(OK, 0, "success")                                                                   \
  X(ERR_INVALID_ARGUMENT, 1, "invalid argument")                                        \
  X(ERR_NULL_POINTER, 2, "required pointer or handle is NULL")                          \
  X(ERR_STRUCT_SIZE, 3, "struct_size is not a size this library accepts")               \
  X(ERR_OUT_OF_RANGE, 4, "token id, size or index outside its valid range")            \
  X(ERR_DTYPE_MISMATCH, 5, "unsupported or mismatched dtype")                           \
  X(ERR_DEVICE_MISMATCH, 6, "memory on the wrong device for this backend or head")      \
  X(ERR_NON_FINITE, 7, "non-finite (NaN or Inf) value in an input")                     \
  X(ERR_OUT_OF_MEMORY, 8, "out of memory")                                              \
  X(ERR_WORKSPACE_EXCEEDED, 9, "request exceeds the workspace reserved at creation")    \
  X(ERR_UNSUPPORTED, 10, "operation or configuration not supported")                    \
  X(ERR_NO_DEVICE, 11, "backend not available on this machine or build")               \
  X(ERR_CUDA, 12, "CUDA runtime or library error")                                      \
  X(ERR_CALLBACK, 13, "a host callback reported failure or returned bad sizes")         \
  X(ERR_CANCELLED, 14, "cancelled by the host")                                         \
  X(ERR_INTERNAL, 15, "internal error")

typedef enum flashspec_status {
#define FLASHSPEC_STATUS_ENUM_(name, value, text) FLASHSPEC_##name = value,
  FLASHSPEC_STATUS_TABLE(FLASHSPEC_STATUS_ENUM_)
#undef FLASHSPEC_STATUS_ENUM_
  FLASHSPEC_STATUS_FORCE_32BIT_ = 0x7fffffff
} flashspec_status;

/* [thread-safe] Static description of a status ("invalid argument"); an
 * unknown value gives "unknown status". Never NULL. */
FLASHSPEC_API const char* flashspec_status_string(flashspec_status status);
/* [thread-safe] Static name of a status ("FLASHSPEC_ERR_INVALID_ARGUMENT");
 * an unknown value gives "FLASHSPEC_UNKNOWN_STATUS". Never NULL. */
FLASHSPEC_API const char* flashspec_status_name(flashspec_status status);

/* ---------------------------------------------------------------------- */
/* Enumerations (fixed values)                                             */
/* ---------------------------------------------------------------------- */
typedef enum flashspec_backend {
  FLASHSPEC_BACKEND_AUTO = 0, /* CUDA when built and a device is present, else CPU */
  FLASHSPEC_BACKEND_CPU = 1,
  FLASHSPEC_BACKEND_CUDA = 2,
  FLASHSPEC_BACKEND_FORCE_32BIT_ = 0x7fffffff
} flashspec_backend;

typedef enum flashspec_dtype {
  FLASHSPEC_DTYPE_F32 = 0,
  FLASHSPEC_DTYPE_BF16 = 1,
  FLASHSPEC_DTYPE_F16 = 2,
  /* 8-bit LM-head codes, for flashspec_lm_head_create_quantized only (every
   * other tensor refuses them with FLASHSPEC_ERR_DTYPE_MISMATCH): */
  FLASHSPEC_DTYPE_E4M3 = 3, /* fp8 e4m3 (OCP "e4m3fn"): bias 7, 3 mantissa
                               bits, no Inf, 0x7f/0xff NaN, largest ±448 */
  FLASHSPEC_DTYPE_I8 = 4,   /* two's-complement int8 */
  FLASHSPEC_DTYPE_FORCE_32BIT_ = 0x7fffffff
} flashspec_dtype;

typedef enum flashspec_memory {
  FLASHSPEC_MEMORY_HOST = 0, /* ordinary host memory */
  FLASHSPEC_MEMORY_CUDA = 1, /* device memory of the context's CUDA device */
  FLASHSPEC_MEMORY_FORCE_32BIT_ = 0x7fffffff
} flashspec_memory;

/* Random-number purposes: the top 4 bits of counter word c0. */
typedef enum flashspec_rng_purpose {
  FLASHSPEC_RNG_DRAFT_NOISE = 1,    /* Gumbel noise of a sampled draft      */
  FLASHSPEC_RNG_ACCEPT_UNIFORM = 2, /* acceptance uniform of a position     */
  FLASHSPEC_RNG_RESIDUAL_NOISE = 3, /* Gumbel noise of the residual resample */
  FLASHSPEC_RNG_BONUS_NOISE = 4,    /* Gumbel noise of the bonus token      */
  FLASHSPEC_RNG_FORCE_32BIT_ = 0x7fffffff
} flashspec_rng_purpose;

/* Limits that follow from the counter layout above. */
#define FLASHSPEC_MAX_VOCAB (1 << 20)       /* V ≤ 2^20 tokens            */
#define FLASHSPEC_MAX_DRAFT_LEN 1023        /* drafts per request          */
#define FLASHSPEC_MAX_HIDDEN 65536          /* d ≤ 65536                   */

/* ---------------------------------------------------------------------- */
/* Tensor views                                                            */
/* ---------------------------------------------------------------------- */
/* A row-major 2-D view of memory the caller owns. Element (r, c) is at
 * data + (r * row_stride + c) * sizeof(dtype). row_stride ≥ cols, in
 * elements. data must be aligned to its element size (2 bytes for bf16 and
 * fp16, 4 for fp32): every call refuses a misaligned view with
 * FLASHSPEC_ERR_UNSUPPORTED (a callback's view with FLASHSPEC_ERR_CALLBACK).
 * This struct is frozen: it never grows. */
typedef struct flashspec_tensor {
  const void* data;
  flashspec_dtype dtype;
  flashspec_memory memory;
  int64_t rows;
  int64_t cols;
  int64_t row_stride;
} flashspec_tensor;

/* [thread-safe] A contiguous view (row_stride = cols). Never fails. */
FLASHSPEC_API flashspec_tensor flashspec_tensor_make(const void* data, flashspec_dtype dtype,
                                                     flashspec_memory memory, int64_t rows,
                                                     int64_t cols);

/* ---------------------------------------------------------------------- */
/* Context                                                                 */
/* ---------------------------------------------------------------------- */
/* A context owns a backend, its device, stream, workspace and the last error
 * message. [context-exclusive]: use one context per thread. */
typedef struct flashspec_context flashspec_context;

typedef struct flashspec_context_params {
  uint32_t struct_size;       /* sizeof(flashspec_context_params) */
  flashspec_backend backend;  /* default FLASHSPEC_BACKEND_AUTO */
  int32_t device_ordinal;     /* CUDA device; default 0 */
  void* cuda_stream;          /* cudaStream_t to use; NULL = the legacy default stream */
  uint64_t seed;              /* seed used where a call passes no seeds array; default 0 */
  int32_t cpu_threads;        /* CPU worker threads; 0 = one per hardware core (default) */
  int32_t max_rows;           /* workspace: most rows per draft/verify call; default 512.
                                 CUDA: it also reserves 32 MiB for cuBLAS, two logits chunks
                                 (4 · max_rows · chunk bytes each, at most 64 MiB) for many-row
                                 scans and calls with sampling controls, and about 0.25 MiB per
                                 row and 32 KiB per request for the controls' candidates */
  int32_t max_requests;       /* workspace: most requests per verify call; default 512 */
} flashspec_context_params;

/* [thread-safe] Fill params with defaults and set struct_size. NULL is a no-op. */
FLASHSPEC_API void flashspec_context_params_init(flashspec_context_params* params);

/* [thread-safe] Create a context. params may be NULL (all defaults).
 * Errors: NULL_POINTER (out), STRUCT_SIZE, INVALID_ARGUMENT (unknown
 * backend, negative device_ordinal, cpu_threads outside [0, 1024]),
 * OUT_OF_RANGE (max_rows or max_requests outside [1, 2^24]), NO_DEVICE
 * (CUDA asked for but no device, or no CUDA backend module: the message says
 * which), CUDA, OUT_OF_MEMORY (also: CPU worker threads that cannot start).
 * On error *out is untouched; there is no context to ask for a message, so
 * the message is kept per thread and read with
 * flashspec_context_last_error(NULL).
 * The CUDA backend is a separate module, libflashspec-cuda.so.<ABI>, that
 * this library loads the first time a CUDA or AUTO context is created or
 * flashspec_cuda_device_count is called: from its own directory, or from the
 * path in the environment variable FLASHSPEC_CUDA_MODULE. This library itself
 * needs no CUDA runtime; without the module (or the CUDA runtime it needs)
 * there is no CUDA device, and AUTO chooses the CPU. */
FLASHSPEC_API flashspec_status flashspec_context_create(const flashspec_context_params* params,
                                                        flashspec_context** out);
/* [context-exclusive] Waits for the context's outstanding work, then frees
 * it. NULL is a no-op. LM heads created on it must be destroyed first. */
FLASHSPEC_API void flashspec_context_destroy(flashspec_context* ctx);

/* [context-exclusive] The detail message of the most recent call on ctx:
 * "" when that call succeeded. With ctx NULL: of the most recent call on this
 * thread that had no context to report to (flashspec_context_create, or any
 * call given a NULL context or engine). Valid until the next such call. Never
 * NULL. */
FLASHSPEC_API const char* flashspec_context_last_error(const flashspec_context* ctx);
/* [context-exclusive] The raw cudaError_t behind the last FLASHSPEC_ERR_CUDA
 * (0 if none or CPU backend). */
FLASHSPEC_API int flashspec_context_last_cuda_error(const flashspec_context* ctx);
/* [context-exclusive] The backend actually chosen (never AUTO). */
FLASHSPEC_API flashspec_backend flashspec_context_backend(const flashspec_context* ctx);
/* [context-exclusive] Wait until all work enqueued on the context is done.
 * Errors: NULL_POINTER, CUDA. */
FLASHSPEC_API flashspec_status flashspec_context_synchronize(flashspec_context* ctx);
/* [thread-safe] Number of CUDA devices usable through the CUDA backend module
 * (0 without the module, the CUDA runtime or a device). */
FLASHSPEC_API int flashspec_cuda_device_count(void);

/* ---------------------------------------------------------------------- */
/* LM head                                                                 */
/* ---------------------------------------------------------------------- */
/* The weight W of the LM head, [V, d]. Immutable after creation; may be
 * shared by contexts of the same backend and device. */
typedef struct flashspec_lm_head flashspec_lm_head;

typedef enum flashspec_lm_head_flags {
  FLASHSPEC_LM_HEAD_COPY = 0,   /* copy W into memory the head owns (default) */
  FLASHSPEC_LM_HEAD_BORROW = 1, /* CUDA backend, device memory only: keep the
                                   caller's pointer; the caller keeps W alive
                                   and unchanged until the head is destroyed */
  FLASHSPEC_LM_HEAD_FLAGS_FORCE_32BIT_ = 0x7fffffff
} flashspec_lm_head_flags;

/* [context-exclusive] Upload an LM head. weight: rows = V (1..2^20), cols = d
 * (1..65536), dtype bf16/fp16/fp32, host memory or device memory (CUDA
 * backend). The stored dtype equals the given dtype.
 * Errors: NULL_POINTER (ctx, weight, weight->data, out), OUT_OF_RANGE
 * (rows/cols/row_stride), DTYPE_MISMATCH, DEVICE_MISMATCH (device memory for
 * the CPU backend, BORROW of host memory), UNSUPPORTED (data not aligned to
 * its element size), NON_FINITE (a NaN or Inf weight), OUT_OF_MEMORY, CUDA.
 * [async on the context stream] for the device-to-device copy. */
FLASHSPEC_API flashspec_status flashspec_lm_head_create(flashspec_context* ctx,
                                                        const flashspec_tensor* weight,
                                                        flashspec_lm_head_flags flags,
                                                        flashspec_lm_head** out);
/* [context-exclusive] Upload an 8-bit LM head: vocabulary row v is stored as
 * d codes q_v (stored = FLASHSPEC_DTYPE_E4M3 or FLASHSPEC_DTYPE_I8) and one
 * fp32 scale s_v, and its logit for a hidden row h is
 *     l_v = s_v · Σ_k h_k · q_vk      (fp32 sum of exact products).
 * The head IS the dequantised W = diag(s) · Q: every guarantee of the calls
 * (Algorithm 1's exactness, CPU == CUDA token for token, the controls) holds
 * for that W, and a scan reads one byte per weight — half of bf16.
 * weight: [V, d] (limits as flashspec_lm_head_create), either
 *   - bf16, fp16 or fp32, quantised here, row by row: amax_v = max_k |w_vk|,
 *     s_v = amax_v / 448 (e4m3) or amax_v / 127 (int8) — 1 where that is 0 —
 *     and q_vk = w_vk / s_v rounded to nearest, ties to even (e4m3 saturating
 *     at ±448, int8 clamped to ±127); scales must be NULL. A weight in device
 *     memory is quantised through a host copy; or
 *   - codes already in `stored` (any int8 value; no e4m3 NaN code), with
 *     scales: [V, 1] fp32, finite and ≥ 0, in the weight's memory.
 * flags: COPY, or BORROW for codes in device memory (the scales are copied).
 * On the CUDA backend, bf16 hidden rows take the tensor cores and other
 * hidden dtypes the fp32 CUDA-core scan (as do stochastic drafts); all
 * compute the l_v above. Up to 16 rows the weight-streaming scan reads the
 * codes once (0.5–0.7× the time of a bf16 head's cuBLAS GEMM at V ≥ 128k on
 * an H100). Beyond, on compute capability 9.0 with the library built for
 * sm_90a, launches whose rows are all greedy (drafts at temperature 0,
 * verify batches with greedy = 1) read the codes once as well, converted in
 * shared memory beside warpgroup MMAs: to f16, against the hidden rows in
 * f16 scaled by a power of two per row, where f16 holds every row of a
 * tile exactly (a row spanning at most 2^29), else to bf16 (H200, 64 rows:
 * e4m3 1.0–1.2×, int8 1.1–1.3× a bf16 head's cuBLAS GEMM); other many-row
 * launches run cuBLAS over exact bf16 copies of the codes, 4096 vocabulary
 * rows at a time, which costs more than a bf16 head (about 2.6–3.8× its
 * cuBLAS GEMM at 64 rows on an H100 and an H200). The copies' workspace (4096 × d × 2
 * bytes) is reserved on the context that creates the head; a many-row call
 * that needs it on another context fails with WORKSPACE_EXCEEDED. A
 * quantised head is unsharded.
 * Errors: those of flashspec_lm_head_create, plus DTYPE_MISMATCH (stored not
 * 8-bit; weight neither 16/32-bit nor `stored`; scales not fp32),
 * INVALID_ARGUMENT (scales given for a weight to quantise, or missing for
 * codes; scales not [V, 1]), NON_FINITE (a NaN e4m3 code, a non-finite or
 * negative scale), DEVICE_MISMATCH (scales in other memory than weight). */
FLASHSPEC_API flashspec_status flashspec_lm_head_create_quantized(flashspec_context* ctx,
                                                                  const flashspec_tensor* weight,
                                                                  const flashspec_tensor* scales,
                                                                  flashspec_dtype stored,
                                                                  flashspec_lm_head_flags flags,
                                                                  flashspec_lm_head** out);
/* [thread-safe] The head's stored dtype (bf16/fp16/fp32, or E4M3/I8 for a
 * quantised head); FLASHSPEC_DTYPE_F32 for NULL. */
FLASHSPEC_API flashspec_dtype flashspec_lm_head_dtype(const flashspec_lm_head* head);
/* [thread-safe while no call uses the head] NULL is a no-op. */
FLASHSPEC_API void flashspec_lm_head_destroy(flashspec_lm_head* head);
/* [thread-safe] V and d; 0 for NULL. */
FLASHSPEC_API int64_t flashspec_lm_head_vocab_size(const flashspec_lm_head* head);
FLASHSPEC_API int64_t flashspec_lm_head_hidden_size(const flashspec_lm_head* head);

/* ---------------------------------------------------------------------- */
/* Sampling controls                                                       */
/* ---------------------------------------------------------------------- */
#define FLASHSPEC_MAX_TOP_K 1024            /* largest top-k that truncates   */
#define FLASHSPEC_TOP_K_ALL 0x7fffffff      /* top-k that keeps every token   */
#define FLASHSPEC_MAX_TOP_LOGPROBS 20       /* top-n logprobs per row         */

/* What turns a row's logits l into the distribution p that a draft samples
 * and a verify verifies against, per request, in this order (the order of
 * vLLM's sampler; llama.cpp's chain with the temperature first):
 *   1. penalties and logit bias: for a token named by the request's bias
 *      entries, l_i becomes l_i / r if l_i > 0 else l_i · r (the
 *      repetition penalty r, once per token; r = 1: unchanged), plus the sum
 *      of its entries' values;
 *   2. token mask: a token whose bit is clear gets probability 0;
 *   3. temperature: x_i = (l_i + bias_i) / T over the allowed tokens;
 *   4. top-k: keep the k tokens of largest x;
 *   5. top-p: of those, keep the smallest prefix (by decreasing x) whose
 *      probability under softmax over the tokens top-k kept is ≥ p;
 *   6. min-p: of those, keep the tokens with p_i ≥ min_p · max_i p_i, i.e.
 *      x_i ≥ max x + log(min_p);
 *   7. p = softmax of x over the kept set S, 0 elsewhere.
 * Tokens are ranked by x, ties by token id (smaller first), so S is a prefix
 * of one fixed order and does not depend on tiling, backend or threads. p_j
 * in Algorithm 1 is this p, so verify stays exact: the emitted tokens are
 * distributed as sampling from p alone. With T = 0 the row is the argmax of
 * l + bias over the allowed tokens (ties → smallest id): greedy decoding over
 * the filtered set (top-k, top-p and min-p always keep that token).
 * Penalties as llama.cpp and vLLM define them: the host lists the tokens to
 * penalise (llama.cpp: the last penalty_last_n tokens; vLLM: prompt and
 * output tokens) with value −(count · frequency + presence) (0 for a token
 * that only the repetition penalty touches) and passes the repetition
 * penalty per request: examples/penalties.c.
 *
 * Per-request arrays have one entry per request of a verify batch (per row
 * of a draft call); a NULL array leaves its step out. The mask has one row
 * per hidden row the controls apply to: per target row of a verify
 * (draft_offsets[R] + R rows), per draft-logits row for draft_controls
 * (draft_offsets[R] rows), per hidden row of a draft call. Arrays live in
 * the memory of the call's batch or params. Both backends apply every
 * control, token for token alike (up to near-ties of fp32 rounding).
 *
 * Cost (CPU backend): still one read of W per call. A row with controls
 * keeps its logits in host scratch (4·V bytes per row) while the call
 * runs; top-k sorts k tokens, top-p without top-k sorts the allowed tokens.
 *
 * CUDA backend: a call with controls or logprobs reads W once and keeps
 * per row a few numbers and its best candidates by x: top-k of them with a
 * top-k ≤ FLASHSPEC_MAX_TOP_K, else FLASHSPEC_MAX_TOP_K; nothing
 * vocabulary-sized is written. Top-p's mass over all allowed tokens comes
 * from the row's log-sum-exp. A call of at most 16 rows whose controls
 * carry top_k (or none of top_k, top_p, min_p) and whose head the
 * weight-streaming scan reads (bf16, fp16, 8-bit codes) takes one streaming
 * pass: each block keeps its share of the logits on chip, every block
 * publishes its two best candidates per row, and a block lists only those
 * of its candidates the published ones do not rule out. Other calls walk
 * the vocabulary in cuBLAS chunks of logits held in the context's
 * workspace. A row with top-p or min-p (and no top-k ≤
 * FLASHSPEC_MAX_TOP_K) whose kept set holds more than FLASHSPEC_MAX_TOP_K
 * tokens continues, exactly, in two more passes over W: the first sums the
 * mass of its remaining tokens per 1/128-nat bin of x (in fixed point, so
 * the sums do not depend on order), which locates the bin where top-p's
 * cumulative mass is reached; the second keeps the tokens above that bin
 * (their mass and Gumbel-max fold as they stream) and ranks the bin's own
 * tokens to find the cut. Such a call costs about three reads of W, and
 * every call with top-p or min-p waits once for the device after the first
 * pass (to learn whether a row continues). Limits of this version, each
 * reported per request on the device (accepted_counts[r] = −1; the row's
 * summary status):
 *   - such a row in a call captured in a CUDA graph (the host cannot learn
 *     during capture whether it continues), or whose crossing bin holds
 *     more than FLASHSPEC_MAX_TOP_K tokens (nearly flat rows):
 *     FLASHSPEC_ERR_UNSUPPORTED;
 *   - more than 4096 bias entries in one request: FLASHSPEC_ERR_UNSUPPORTED;
 *   - control values out of range (device memory is checked on the
 *     device): the status the host check gives; a mask row that allows no
 *     token: FLASHSPEC_ERR_INVALID_ARGUMENT.
 * Stochastic drafts (draft_logits or sparse supports) take no controls,
 * draft_controls or logprobs there (FLASHSPEC_ERR_UNSUPPORTED at the call); the hidden rows
 * must be in the LM head's dtype (bf16/fp16 heads aligned for tensor cores,
 * or fp32) and V at most 1,048,576 (else FLASHSPEC_ERR_UNSUPPORTED).
 *
 * Typical acceptance (Medusa, Cai et al. 2024) is opt-in per request and is
 * NOT distribution-preserving: draft x_j is accepted iff p_j(x_j) >
 * min(ε, δ · exp(−H(p_j))), H the entropy of the controlled p_j, with no
 * uniform; at the first rejection the row emits a sample of p_j itself
 * (RESIDUAL_NOISE, the drafted token not excluded). The emitted tokens are
 * then not distributed as the target's. T = 0 requests ignore it. */
typedef struct flashspec_sampling_controls {
  uint32_t struct_size;
  const int32_t* top_k;         /* [R] 1..FLASHSPEC_MAX_TOP_K, or ≥ V / FLASHSPEC_TOP_K_ALL (no
                                   truncation); NULL: no top-k */
  const float* top_p;           /* [R] in (0, 1]; 1 keeps every token; NULL: no top-p */
  const float* min_p;           /* [R] in [0, 1]; 0 keeps every token; NULL: no min-p */
  const int32_t* bias_offsets;  /* [R + 1] non-decreasing from 0: request r's bias entries are
                                   [bias_offsets[r], bias_offsets[r + 1]); NULL: no bias */
  const int32_t* bias_tokens;   /* [bias_offsets[R]] token ids in [0, V); repeats add up */
  const float* bias_values;     /* [bias_offsets[R]] finite additive biases */
  const uint32_t* token_mask;   /* [rows, mask_words] xgrammar's packed layout: token i is
                                   allowed iff bit (i % 32) of word i / 32 of its row is set;
                                   bits past V are ignored. A row must allow a token. NULL:
                                   every token allowed */
  int32_t mask_words;           /* words per mask row, ceil(V / 32); 0 means ceil(V / 32) */
  const float* typical_epsilon; /* [R] ε ∈ (0, 1] turns on typical acceptance, 0 leaves
                                   Algorithm 1; NULL: off. A verify's target controls only */
  const float* typical_delta;   /* [R] δ ≥ 0 (Medusa uses √ε); NULL: δ = √ε */
  const float* repetition_penalty; /* [R] r > 0 for the tokens of the request's bias entries;
                                      NULL: 1 */
} flashspec_sampling_controls;

/* [thread-safe] Defaults: every pointer NULL (no control), mask_words 0. */
FLASHSPEC_API void flashspec_sampling_controls_init(flashspec_sampling_controls* controls);

/* ---------------------------------------------------------------------- */
/* Draft                                                                   */
/* ---------------------------------------------------------------------- */
/* Per-row randomness and temperature of a draft call. All arrays have one
 * entry per hidden row and live in `memory`; any array may be NULL: then
 * temperatures → `temperature`, seeds → the context's seed, request_ids →
 * the row index, steps → 0, positions → 0. */
typedef struct flashspec_draft_params {
  uint32_t struct_size;
  flashspec_memory memory;        /* where the arrays and outputs live; default HOST */
  float temperature;              /* default 0 (greedy) */
  const float* temperatures;      /* per row; 0 = greedy argmax for that row */
  const uint64_t* seeds;
  const uint64_t* request_ids;
  const uint64_t* steps;
  const int32_t* positions;       /* draft position of the row, 0..FLASHSPEC_MAX_DRAFT_LEN */
  /* Appended in 0.2. */
  const flashspec_sampling_controls* controls; /* per row; NULL: none. typical_* not allowed */
} flashspec_draft_params;

/* [thread-safe] Defaults: host memory, temperature 0, all arrays NULL.
 * Writes min(size, sizeof(flashspec_draft_params)) bytes and sets struct_size
 * to that; NULL is a no-op. */
FLASHSPEC_API void flashspec_draft_params_init_sized(flashspec_draft_params* params, size_t size);
/* The 0.1 entry point (fills the 0.1 layout only); the macro below is what a
 * caller compiled against this header calls. */
FLASHSPEC_API void flashspec_draft_params_init(flashspec_draft_params* params);
#define flashspec_draft_params_init(params) flashspec_draft_params_init_sized((params), sizeof(flashspec_draft_params))

/* [context-exclusive] [async on the context stream]
 * One fused pass per call: logits l = h·Wᵀ (fp32 accumulation) for each
 * hidden row, reduced on the fly to
 *   T = 0: tokens_out[r] = argmax l (ties → smallest id), scores_out[r] = l_x;
 *   T > 0: tokens_out[r] = argmax(l/T + g) with Gumbel noise g of purpose
 *          DRAFT_NOISE, scores_out[r] = log q(x) = l_x/T − LSE(l/T).
 * hidden: [rows, d], rows 1..max_rows, any supported dtype; tokens_out and
 * scores_out: rows entries each in params->memory (scores_out may be NULL).
 * params may be NULL (greedy).
 * Errors: NULL_POINTER, STRUCT_SIZE, OUT_OF_RANGE (rows, cols ≠ d, position),
 * INVALID_ARGUMENT (temperature < 0 or NaN), DTYPE_MISMATCH, DEVICE_MISMATCH,
 * NON_FINITE (a NaN/Inf hidden value; CPU backend, or host inputs; or a
 * logit, or a logit divided by T, beyond the fp32 range), WORKSPACE_EXCEEDED,
 * CUDA.
 * CUDA backend: values it can only see on the device (a temperature < 0 or
 * NaN, a position out of range, a NaN/Inf hidden value or logit) are not a
 * status: that row gets tokens_out[r] = −1 and scores_out[r] = NaN. */
FLASHSPEC_API flashspec_status flashspec_draft(flashspec_context* ctx, const flashspec_lm_head* head,
                                               const flashspec_tensor* hidden,
                                               const flashspec_draft_params* params,
                                               int32_t* tokens_out, float* scores_out);

#define FLASHSPEC_MAX_DRAFT_TOP_K 16
/* [context-exclusive] Fused top-k draft: for each hidden row, the k tokens of
 * largest x = l + bias over the allowed tokens (params->controls' bias,
 * repetition penalty and token mask apply; its top_k/top_p/min_p/typical
 * must be NULL), in rank order (larger x first, ties by smaller id), and
 * their log-probabilities x − log Σ_allowed exp(x) (softmax at temperature 1;
 * params' temperatures, seeds, request ids, steps and positions are not read).
 * One read of W. tokens_out: [rows, k];
 * logprobs_out: [rows, k] or NULL. A row with fewer than k allowed tokens
 * gets −1 / −Inf in the remaining slots. Errors: as flashspec_draft, plus
 * OUT_OF_RANGE (k outside [1, FLASHSPEC_MAX_DRAFT_TOP_K]) and
 * INVALID_ARGUMENT (params->controls with top_k, top_p, min_p or typical). */
/* Details: hidden, params and their memory are checked as for
 * flashspec_draft (host temperatures and positions included, though they do
 * not change the result); params may be NULL (no controls). NULL ctx, head,
 * hidden or tokens_out: NULL_POINTER. tokens_out and logprobs_out may not
 * overlap each other or any input (INVALID_ARGUMENT). On any error neither
 * output is written. k = 1 gives flashspec_draft's T = 0 token under the
 * same controls. CPU backend: each row keeps its logits in host scratch
 * (4·V bytes per row) while the call runs, as a draft with controls does.
 * CUDA backend: the pass of a call with sampling controls (see "Sampling
 * controls") with every row keeping its k best candidates: nothing
 * vocabulary-sized is written; the hidden rows must be in the LM head's
 * dtype. Device-found errors (bad control values in device memory, a mask
 * row allowing nothing, non-finite rows) give that row −1 / NaN. */
FLASHSPEC_API flashspec_status flashspec_draft_top_k(flashspec_context* ctx, const flashspec_lm_head* head,
                                                    const flashspec_tensor* hidden,
                                                    const flashspec_draft_params* params, int32_t k,
                                                    int32_t* tokens_out, float* logprobs_out);

/* ---------------------------------------------------------------------- */
/* Verify and finalize                                                     */
/* ---------------------------------------------------------------------- */
/* A ragged batch of R requests. Request r drafted n_r = draft_offsets[r+1] −
 * draft_offsets[r] tokens (0 ≤ n_r ≤ FLASHSPEC_MAX_DRAFT_LEN), stored at
 * draft_tokens[draft_offsets[r] .. draft_offsets[r+1]). Its n_r + 1 target
 * hidden rows start at row draft_offsets[r] + r of target_hidden: row j
 * (0 ≤ j < n_r) scores draft token j + 1, row n_r gives the bonus token.
 * target_hidden therefore has draft_offsets[R] + R rows.
 *
 * Drafts given by their tokens alone (no draft_logits, no sparse support)
 * are greedy, point-mass drafts: q(x) = 1. A stochastic draft passes
 * either its sparse support (draft_support_*, below) or draft_logits, a
 * [draft_offsets[R], V] fp32/bf16/fp16 view; its row k holds the logits the
 * draft token k was sampled from, and q = softmax(draft_logits row /
 * draft_temperature). Acceptance is then min(1, p/q) and the residual
 * max(p − q, 0) over the whole vocabulary, as Algorithm 1 requires.
 *
 * Index and per-request arrays live in `memory` (host, or device memory
 * with the CUDA backend). NULL optional arrays take the defaults named. */
typedef struct flashspec_verify_batch {
  uint32_t struct_size;
  flashspec_memory memory;
  int32_t num_requests;              /* R ≥ 1 */
  const int32_t* draft_offsets;      /* [R + 1], non-decreasing, starts at 0 */
  const int32_t* draft_tokens;       /* [draft_offsets[R]], each in [0, V) */
  const flashspec_tensor* target_hidden; /* [draft_offsets[R] + R, d] */
  const flashspec_tensor* draft_logits;  /* NULL = greedy drafts; else [draft_offsets[R], V] */
  const float* temperatures;         /* [R] target T ≥ 0; NULL → 1.0 */
  const float* draft_temperatures;   /* [R] T_d > 0 of q; NULL → 1.0 (stochastic drafts only) */
  const uint64_t* seeds;             /* [R]; NULL → the context's seed */
  const uint64_t* request_ids;       /* [R]; NULL → r */
  const uint64_t* steps;             /* [R]; NULL → 0 */
  const float* accept_uniforms;      /* [draft_offsets[R]] caller's uniforms in (0,1) for
                                        the acceptance tests; NULL → Philox ACCEPT_UNIFORM */
  int32_t max_draft_len;             /* ≥ every n_r; bounds the workspace. Default
                                        FLASHSPEC_MAX_DRAFT_LEN (0 means "use default") */
  /* Appended in 0.2. */
  const flashspec_sampling_controls* controls;       /* the target rows' p (see Sampling
                                                        controls); NULL: p = softmax(l / T) */
  const flashspec_sampling_controls* draft_controls; /* stochastic drafts: the controls q was
                                                        sampled under (mask rows = draft_logits
                                                        rows); NULL: q = softmax(z / T_d) */
  int32_t logprobs;                  /* 1: verify keeps what finalize needs to return the
                                        emitted tokens' logprobs; 0 (default): not asked */
  int32_t top_logprobs;              /* n ∈ [0, FLASHSPEC_MAX_TOP_LOGPROBS]: verify keeps each
                                        row's n tokens of largest raw logit for finalize */
  const int32_t* draft_parents;      /* [draft_offsets[R]] NULL: each request's drafts are a
                                        chain. Else a tree (see Tree verify below) */
  /* Appended in 0.3: sparse draft distributions (see below). All three or none;
   * not with draft_logits or draft_controls. */
  const int32_t* draft_support_offsets; /* [draft_offsets[R] + 1] non-decreasing from 0: draft
                                           row k's support is entries [offsets[k], offsets[k + 1]),
                                           1..FLASHSPEC_MAX_DRAFT_SUPPORT of them; NULL: none */
  const int32_t* draft_support_tokens;  /* [draft_support_offsets[draft_offsets[R]]] ids in [0, V),
                                           distinct within a row */
  const float* draft_support_probs;     /* the same length: q of each support token, finite and
                                           ≥ 0, each row summing to 1 within
                                           FLASHSPEC_DRAFT_SUPPORT_TOLERANCE */
  /* Appended in 0.3. */
  int32_t greedy;                       /* 1: every request's target is greedy (T = 0), as
                                           temperatures of 0 make it; temperatures must be NULL.
                                           0 (default): temperatures as above. See below */
} flashspec_verify_batch;

/* Greedy batches. A backend that reads device memory cannot see device
 * temperatures without a sync, so it must assume some row samples; with
 * greedy = 1 it knows none does and may take kernels made for greedy rows
 * (the CUDA backend: the tile scan, on sm_90a for more than 16 target rows
 * of point-mass drafts without controls or logprobs, bf16 or fp16 heads
 * and hidden rows). The result is the one temperatures of 0 give, token
 * for token, on either backend; finalize needs the same batch (greedy
 * included). A draft call says the same with
 * its one `temperature` 0 and no `temperatures`. Errors: INVALID_ARGUMENT
 * (greedy not 0 or 1; greedy = 1 with temperatures given, naming
 * "batch->temperatures"). */

/* Sparse draft distributions. A drafter that samples from its top-k (or
 * any truncated) distribution may pass q as that support instead of dense
 * logits: per draft row k, at most FLASHSPEC_MAX_DRAFT_SUPPORT token ids and
 * their probabilities; q = 0 off the support. The library divides each row
 * by its sum, so q is exactly normalised; verify is exact (the emitted
 * tokens are distributed as the target's) when the drafter sampled the
 * token from that truncated, renormalised q — not when it sampled from its
 * full distribution and passes only the top of it. Acceptance is min(1,
 * p(x)/q(x)), the residual max(p − q, 0): off the support it is p itself,
 * so only the support tokens are treated apart (Σ max(p − q, 0) = 1 −
 * Σ_support min(p, q)) and no dense q row is built. Same one read of W; the
 * rows that resample keep their logits while the call runs, as for
 * draft_logits. draft_temperatures is not read for a sparse q. A point-mass
 * draft is the support {x} with probability 1, so point-mass and
 * stochastic requests share one batch this way.
 * Errors (host batches, before anything is read): NULL_POINTER (one of the
 * three arrays given without the others), INVALID_ARGUMENT (draft_logits or
 * draft_controls given too; a token repeated within a row; a negative
 * probability; a row not summing to 1 within the tolerance; a drafted
 * token outside its row's support or with q = 0 there, naming
 * "batch->draft_tokens"), OUT_OF_RANGE (offsets[0] ≠ 0, a row with 0 or
 * more than FLASHSPEC_MAX_DRAFT_SUPPORT tokens, a token outside [0, V)),
 * NON_FINITE (a NaN or Inf probability). Device batches (CUDA backend) are
 * checked on the device by the same rules: a request with a bad support
 * fails alone (accepted_counts[r] = −1, its rows' status the one above).
 * The shard calls refuse sparse supports with FLASHSPEC_ERR_UNSUPPORTED. */
#define FLASHSPEC_MAX_DRAFT_SUPPORT 64
#define FLASHSPEC_DRAFT_SUPPORT_TOLERANCE 1e-3

/* Tree verify. With draft_parents, request r's n_r drafts are the nodes of
 * a tree: node k (0 ≤ k < n_r, its token draft_tokens[draft_offsets[r] + k])
 * has parent draft_parents[draft_offsets[r] + k], a node index in [−1, k)
 * (−1: a child of the root; parents come before their children, so there
 * are no cycles). The request's target rows are the root's (row 0) and one
 * per node (row k + 1: the target after the path to node k), so
 * target_hidden still has draft_offsets[R] + R rows. Siblings may repeat a
 * token.
 *
 * Point-mass drafts (neither draft_logits nor sparse supports): the rule,
 * exact whatever the tree (Algorithm 1 when the tree is a chain): at the
 * current node (the root first) draw y from p of its row; if a child has
 * token y (the first such child when siblings repeat a token), accept that
 * child and continue there; otherwise emit y and stop (at a leaf y is the
 * bonus token). Each row's draw uses BONUS_NOISE at position = its row
 * index. A request whose nodes form a chain (node k's parent k − 1 for
 * every k) is verified as a chain: Algorithm 1 with its random numbers and
 * its summaries, whatever the other requests of the batch are (a request's
 * randomness never depends on its neighbours).
 *
 * Stochastic multi-candidate drafts (draft_logits or sparse supports):
 * node k's token was sampled from q_k, its own draft row's
 * distribution, given the path to its parent and independently of its
 * siblings (siblings drawn i.i.d. from one q, or each from its own drafter,
 * as in SpecInfer, Miao et al. 2023, arXiv:2305.09781). At the current node,
 * with r = p of its row, the children are tried in the order they appear in
 * the batch (increasing node index): child c is accepted with probability
 * min(1, r(x_c) / q_c(x_c)), i.e. iff log u_c < log r(x_c) − log q_c(x_c);
 * after a rejection r ← norm(max(r − q_c, 0)). On acceptance the walk moves
 * to the child and continues; if every child is rejected it emits a sample
 * of the final r and stops; at a leaf it emits the bonus ~ p of the leaf's
 * row. The emitted sequence is distributed exactly as sampling from the
 * target alone. Siblings may repeat a token: the rule needs independent
 * draws (sampling with replacement), and de-duplicating them would bias
 * it; a repeated token is simply tried again against the updated r.
 * Random numbers: child k's uniform is ACCEPT_UNIFORM at position k (its
 * node index; batch->accept_uniforms[draft_offsets[r] + k] when given), the
 * residual sample of the node on row j is RESIDUAL_NOISE at position j, the
 * bonus of the leaf on row j BONUS_NOISE at position j. A stochastic chain
 * given as a tree (parents k − 1) therefore emits exactly what Algorithm 1
 * emits for it, and chains, point-mass drafts (sparse supports {x} with
 * q = 1) and stochastic trees mix in one batch. Cost: the one read of W; a
 * node with k stochastic children keeps its row's logits and scans them k
 * times (CPU: O(V · k²/2) arithmetic; CUDA: O(V · k), the kept logits turned
 * into the running residual in place in shared memory, with one grid-wide
 * barrier per level of the node with the most children, so k siblings cost
 * k − 1 barriers) and no vocabulary-sized vector besides the kept logits and
 * the children's dense draft logits rows.
 *
 * T = 0 (either kind): y is the argmax and the walk moves to the first child
 * with token y, so the path follows greedy decoding. finalize writes the
 * accepted path's tokens and the final token to emitted_tokens, the path's
 * node indices to result->accepted_nodes (optional), and the path's depth to
 * accepted_counts; logprobs and top logprobs are those of the rows that drew
 * (or verified) each emitted token. Trees take no typical acceptance; bad
 * parents are OUT_OF_RANGE (host) or a request error (device:
 * accepted_counts[r] = −1). */

/* [thread-safe] Defaults: host memory, all pointers NULL, num_requests 0.
 * Writes min(size, sizeof(flashspec_verify_batch)) bytes and sets struct_size
 * to that; NULL is a no-op. */
FLASHSPEC_API void flashspec_verify_batch_init_sized(flashspec_verify_batch* batch, size_t size);
/* The 0.1 entry point (fills the 0.1 layout only); the macro below is what a
 * caller compiled against this header calls. */
FLASHSPEC_API void flashspec_verify_batch_init(flashspec_verify_batch* batch);
#define flashspec_verify_batch_init(batch) flashspec_verify_batch_init_sized((batch), sizeof(flashspec_verify_batch))

/* The per-row summaries a verify pass produces and finalize consumes: for
 * each target row its log-sum-exp, the drafted token's logit, the best
 * residual (or bonus) Gumbel candidate, and for stochastic drafts a few
 * residual candidates. Sized at creation; lives where the backend computes.
 * Summaries belong to the context that created them: verify and finalize on
 * another context refuse them (INVALID_ARGUMENT naming "summaries"), and like
 * their context they are used by one thread at a time. */
typedef struct flashspec_summaries flashspec_summaries;

/* [context-exclusive] Reserve summaries for up to max_rows target rows and
 * max_requests requests. Errors: NULL_POINTER, OUT_OF_RANGE, OUT_OF_MEMORY, CUDA. */
FLASHSPEC_API flashspec_status flashspec_summaries_create(flashspec_context* ctx, int32_t max_rows,
                                                          int32_t max_requests,
                                                          flashspec_summaries** out);
/* [context-exclusive] NULL is a no-op. */
FLASHSPEC_API void flashspec_summaries_destroy(flashspec_summaries* summaries);

/* Where finalize writes. Arrays live in `memory`.
 *   accepted_counts[r]   number of draft tokens accepted, 0..n_r;
 *   emitted_tokens       [draft_offsets[R] + R]: request r's tokens start at
 *                        draft_offsets[r] + r; the first accepted_counts[r]+1
 *                        are valid (the accepted drafts, then the recovered
 *                        or bonus token); the rest are set to −1;
 *   next_steps[r]        (optional) steps[r] + 1, so a caller, or a replayed
 *                        CUDA graph, can feed it back as the next steps array
 *                        (it may be batch.steps itself).
 * Aliasing: no output array may share memory with another output or with any
 * array or tensor of the batch, except next_steps == batch.steps exactly;
 * finalize and verify_and_finalize refuse an overlap with INVALID_ARGUMENT
 * naming the output. */
typedef struct flashspec_verify_result {
  uint32_t struct_size;
  flashspec_memory memory;
  int32_t* accepted_counts;
  int32_t* emitted_tokens;
  uint64_t* next_steps;
  /* Appended in 0.2. Each optional; each needs the batch to have asked for it
   * (batch->logprobs, batch->top_logprobs), else INVALID_ARGUMENT. Slot k of
   * request r (index draft_offsets[r] + r + k, as emitted_tokens) is written
   * for k ≤ accepted_counts[r]; the rest get NaN (logprobs) or −1 (tokens).
   *   logprobs[k]          log p(token) under the controlled target
   *                        distribution the token was verified against (the
   *                        row's p; 0 for the token of a T = 0 row);
   *   raw_logprobs[k]      log softmax(l)(token) under the model's raw logits
   *                        (no bias, mask, temperature or truncation);
   *   top_tokens[k·n + i]  the n tokens of largest raw logit of the slot's
   *                        row, ties by smaller id (n = batch->top_logprobs);
   *   top_logprobs[k·n + i] their raw log softmax. */
  float* logprobs;                   /* [draft_offsets[R] + R] */
  float* raw_logprobs;               /* [draft_offsets[R] + R] */
  int32_t* top_tokens;               /* [draft_offsets[R] + R, n] */
  float* top_logprobs;               /* [draft_offsets[R] + R, n] */
  int32_t* accepted_nodes;           /* [draft_offsets[R] + R] tree verify: slot k < accepted
                                        holds the node index of the k-th accepted node, −1 the
                                        rest; a chain's accepted draft k is node k */
} flashspec_verify_result;

/* [thread-safe] Defaults: host memory, all pointers NULL.
 * Writes min(size, sizeof(flashspec_verify_result)) bytes and sets
 * struct_size to that; NULL is a no-op. */
FLASHSPEC_API void flashspec_verify_result_init_sized(flashspec_verify_result* result, size_t size);
/* The 0.1 entry point (fills the 0.1 layout only); the macro below is what a
 * caller compiled against this header calls. */
FLASHSPEC_API void flashspec_verify_result_init(flashspec_verify_result* result);
#define flashspec_verify_result_init(result) flashspec_verify_result_init_sized((result), sizeof(flashspec_verify_result))

/* [context-exclusive] [async on the context stream]
 * One pass over W for all Σ(n_r + 1) target rows, writing only the per-row
 * summaries. Validates every host-visible argument first. With the CUDA
 * backend and device-resident index arrays, out-of-range tokens or offsets
 * cannot be checked without a host sync: they are detected on the device and
 * finalize then reports the request as emitting nothing (accepted_counts[r]
 * = −1).
 * Errors: NULL_POINTER, STRUCT_SIZE, OUT_OF_RANGE (R, offsets, n_r, token ids,
 * rows of target_hidden or draft_logits, cols), INVALID_ARGUMENT (T < 0 or
 * NaN, T_d ≤ 0 or NaN, uniforms outside (0,1)), DTYPE_MISMATCH,
 * DEVICE_MISMATCH, NON_FINITE (a NaN or Inf hidden value or draft logit, or a
 * logit that overflows fp32 when divided by T or T_d; the CUDA backend reports
 * these per request, as above), WORKSPACE_EXCEEDED (more rows or requests
 * than the summaries hold, or more rows than the context's max_rows), CUDA,
 * UNSUPPORTED (below). A batch without drafts may give draft_logits as
 * [0, V] (or NULL).
 * CUDA backend limits. Tensor cores serve bf16 or fp16 heads with hidden rows
 * of the same dtype (borrowed heads: 16-byte-aligned rows, d % 8 == 0): up to
 * 16 rows stream W once through mma.sync with the reduction in registers
 * (on compute capability 9.0 with the library built for sm_90a, through
 * warpgroup MMAs instead where the vocabulary is large: 9–16 rows of W rows
 * of at least 4 KB, 32–64 rows of W rows of at least 16 KB); more rows go
 * through cuBLAS one vocabulary chunk at a time (the chunk's fp32 logits,
 * [rows, ≤ 64K tokens], land in a workspace of about 64 MiB reserved at
 * context creation and are folded before the next chunk; nothing
 * vocabulary-sized is written). Any other dtype combination
 * runs an exact fp32 CUDA-core scan that reads W once per 16 rows.
 * Stochastic drafts (dense or sparse q, chains or trees): every CTA (one per
 * SM) keeps its 1/SMs share of the scaled logits of the rows it verifies in
 * shared memory across grid-wide barriers, 4 · ⌈V / SMs⌉ bytes per row, in what the scan's own
 * pipeline leaves of a block's shared memory (at most 128 rows per pass; on
 * H100/H200 about 2–4 rows at V = 2^20 and 16 or more at V = 128256); more
 * rows take further passes, each reading W again. A vocabulary of which not
 * even one row's share fits returns UNSUPPORTED. The head must be created on
 * this context (its hidden size sizes the context's staging), else
 * WORKSPACE_EXCEEDED. */
FLASHSPEC_API flashspec_status flashspec_verify(flashspec_context* ctx, const flashspec_lm_head* head,
                                                const flashspec_verify_batch* batch,
                                                flashspec_summaries* summaries);

/* [context-exclusive] [async on the context stream]
 * Algorithm 1 on the summaries of the last flashspec_verify with the same
 * batch: for j = 1..n_r accept x_j iff log u_j < log p_j(x_j) − log q_j(x_j)
 * (T = 0: iff x_j is the argmax); at the first rejection emit the residual
 * candidate of that row and stop; if all are accepted emit the bonus token.
 * With the CUDA backend this runs on the device, with no host sync.
 * Errors: as flashspec_verify for the batch and result arguments;
 * INVALID_ARGUMENT naming "summaries" when they describe another batch
 * (never verified, another shape, or, for a host-memory batch, other
 * offsets, tokens, temperatures, seeds, request ids or steps). */
FLASHSPEC_API flashspec_status flashspec_finalize(flashspec_context* ctx,
                                                  const flashspec_verify_batch* batch,
                                                  const flashspec_summaries* summaries,
                                                  const flashspec_verify_result* result);

/* [context-exclusive] [async on the context stream] flashspec_verify then
 * flashspec_finalize with summaries the context keeps (sized by its
 * max_rows / max_requests). */
FLASHSPEC_API flashspec_status flashspec_verify_and_finalize(flashspec_context* ctx,
                                                             const flashspec_lm_head* head,
                                                             const flashspec_verify_batch* batch,
                                                             const flashspec_verify_result* result);

/* ---------------------------------------------------------------------- */
/* Vocabulary shards (tensor-parallel LM heads)                            */
/* ---------------------------------------------------------------------- */
/* Tensor parallelism splits an LM head by vocabulary: rank k holds rows
 * [vocab_begin, vocab_end) of a global vocabulary of V tokens. Instead of
 * all-gathering [rows, V] logits, each rank runs the fused pass over its
 * slice and writes a fixed-size record per row; the caller all-gathers the
 * records with its own communicator (NCCL, MPI, a memcpy) and any rank
 * finalizes from the gathered records. Token ids are global everywhere, and
 * the noise is keyed by global token id, so a sharded verify emits the same
 * tokens as the unsharded verify of the whole head, token for token (where
 * no two scores are within fp32 rounding of each other: the log-sum-exp is
 * summed in another order), and a sharded draft the same drafts.
 *
 * Record layout, version FLASHSPEC_SHARD_RECORD_VERSION, little-endian,
 * FLASHSPEC_SHARD_RECORD_BYTES bytes per row, in the memory of the call:
 *   float   m, s          online log-sum-exp of l/T over the slice: LSE =
 *                         m + log s (unused for T = 0 rows)
 *   float   best          the slice's winning score (l/T + Gumbel noise, or
 *                         l for T = 0), −Inf for an empty slice
 *   float   best_scaled   the winner's l/T (T = 0: l)
 *   int32   token         the winner's global id, −1 if none
 *   float   second        the runner-up's score
 *   float   tracked       l/T of the row's drafted token, if in this slice
 *   int32   flags         1: tracked is set; 2: a logit is NaN or ±Inf;
 *                         4: a logit overflowed fp32 when divided by T
 *   int32   version       FLASHSPEC_SHARD_RECORD_VERSION
 *   int32   vocab_begin, vocab_end, vocab_size   the slice and the global V
 * Records of one row merge in any order: log-sum-exps add, the larger score
 * wins (ties: the smaller token id). Point-mass (greedy) drafts, greedy and
 * sampled draft calls shard with this one exchange. Stochastic drafts, whose
 * residual max(p − q, 0) needs the global log-sum-exp of p before any token
 * can be scored, sampling controls (top-k/top-p/min-p need the global
 * ranking) and logprobs would need a second exchange: shard calls refuse
 * them with FLASHSPEC_ERR_UNSUPPORTED. Trees (draft_parents) shard like
 * chains. Both backends serve shards. On the CUDA backend every shard call
 * is stream-ordered and capturable in a CUDA graph, and records live in
 * device memory, so they are checked on the device as they are merged: a
 * request whose records have another version or do not tile the vocabulary
 * emits nothing (accepted_counts[r] = −1, as for the device-side checks of
 * flashspec_verify; a draft row gets token −1 and score NaN), and so does
 * one with a non-finite logit, which the CPU backend reports as NON_FINITE
 * when the shard's pass runs. */
#define FLASHSPEC_SHARD_RECORD_VERSION 1
#define FLASHSPEC_SHARD_RECORD_BYTES 48

/* [context-exclusive] An LM head holding the vocabulary slice [vocab_begin,
 * vocab_begin + weight->rows) of a global vocabulary of vocab_size tokens.
 * As flashspec_lm_head_create, plus OUT_OF_RANGE (vocab_begin < 0, the slice
 * past vocab_size, vocab_size > FLASHSPEC_MAX_VOCAB). A shard head serves
 * only the shard calls below; flashspec_draft and flashspec_verify refuse it
 * (INVALID_ARGUMENT naming "head"). */
FLASHSPEC_API flashspec_status flashspec_lm_head_create_shard(flashspec_context* ctx,
                                                              const flashspec_tensor* weight,
                                                              flashspec_lm_head_flags flags,
                                                              int64_t vocab_begin, int64_t vocab_size,
                                                              flashspec_lm_head** out);
/* [thread-safe] The first global token id of the head's slice (0 for an
 * unsharded head) and the global vocabulary size (the head's V when
 * unsharded); 0 for NULL. */
FLASHSPEC_API int64_t flashspec_lm_head_vocab_begin(const flashspec_lm_head* head);
FLASHSPEC_API int64_t flashspec_lm_head_global_vocab_size(const flashspec_lm_head* head);

/* [context-exclusive] [async on the context stream] The verify pass of one
 * rank over its slice: writes one record per target row to records
 * ([draft_offsets[R] + R] records, batch->memory). Draft tokens are global
 * ids in [0, vocab_size). Errors: as flashspec_verify, plus UNSUPPORTED
 * (draft_logits, controls, logprobs), NULL_POINTER
 * (records), INVALID_ARGUMENT (records overlapping an input). */
FLASHSPEC_API flashspec_status flashspec_verify_shard(flashspec_context* ctx, const flashspec_lm_head* head,
                                                      const flashspec_verify_batch* batch, void* records);

/* [context-exclusive] [async on the context stream] Algorithm 1 on the
 * gathered records of num_shards ranks: records is [num_shards][rows]
 * records (what an all-gather of each rank's records gives), rows =
 * draft_offsets[R] + R. Emits exactly what flashspec_verify_and_finalize on
 * the whole head would. Errors: as flashspec_finalize for the batch and
 * result; NULL_POINTER (records); OUT_OF_RANGE (num_shards < 1); and, for
 * host records, INVALID_ARGUMENT naming "records" when a record has another
 * version, or a row's slices do not tile [0, vocab_size) in rank order. */
FLASHSPEC_API flashspec_status flashspec_finalize_shards(flashspec_context* ctx,
                                                         const flashspec_verify_batch* batch,
                                                         const void* records, int32_t num_shards,
                                                         const flashspec_verify_result* result);

/* [context-exclusive] [async on the context stream] The draft pass of one
 * rank: one record per hidden row (params->memory). As flashspec_draft
 * (params may be NULL), plus UNSUPPORTED (controls). */
FLASHSPEC_API flashspec_status flashspec_draft_shard(flashspec_context* ctx, const flashspec_lm_head* head,
                                                     const flashspec_tensor* hidden,
                                                     const flashspec_draft_params* params, void* records);

/* [context-exclusive] [async on the context stream] The drafts from the
 * gathered records of num_shards ranks ([num_shards][rows]): tokens_out and
 * scores_out as flashspec_draft on the whole head, for the same params.
 * Errors: NULL_POINTER, STRUCT_SIZE, OUT_OF_RANGE (rows, num_shards),
 * INVALID_ARGUMENT (params' values, records as for finalize_shards),
 * NON_FINITE (a record flagging a non-finite logit). */
FLASHSPEC_API flashspec_status flashspec_draft_from_shards(flashspec_context* ctx,
                                                           const flashspec_draft_params* params,
                                                           const void* records, int32_t num_shards,
                                                           int32_t rows, int32_t* tokens_out,
                                                           float* scores_out);

/* ---------------------------------------------------------------------- */
/* Randomness, exposed for tests and for hosts that mirror the contract    */
/* ---------------------------------------------------------------------- */
/* [thread-safe] Philox4x32-10 of (counter, key): out[0..3]. NULL is a no-op. */
FLASHSPEC_API void flashspec_philox4x32_10(const uint32_t counter[4], const uint32_t key[2],
                                           uint32_t out[4]);
/* [thread-safe] The uniform in (0,1) of the contract for one token/purpose;
 * NaN for a purpose outside flashspec_rng_purpose. */
FLASHSPEC_API double flashspec_rng_uniform(uint64_t seed, uint64_t request_id, uint64_t step,
                                           int32_t position, flashspec_rng_purpose purpose,
                                           int32_t token);

/* ====================================================================== */
/* Engine: drafters, drafter selection, metrics and the speculative loop    */
/* ====================================================================== */
/* The engine runs speculative decoding for one sequence at a time on top of
 * the functions above. Each step it
 *   1. picks an arm — a (drafter, draft length k) pair — with a bandit policy;
 *   2. asks that drafter for up to k draft tokens (or a tree of up to k
 *      nodes: see Tree steps);
 *   3. asks the host's target model, through a callback, to append the
 *      pending tokens and the drafts to its KV cache and return the hidden
 *      rows that score them;
 *   4. verifies the drafts with the fused LM head and Algorithm 1 (the
 *      pass of flashspec_verify_and_finalize, on summaries the engine keeps,
 *      so the context's own are left as they were): the emitted tokens are
 *      distributed exactly
 *      as sampling from the target alone, and at temperature 0 they are the
 *      target's greedy tokens, whatever the drafter proposed;
 *   5. rolls the host's KV cache back past the rejected drafts (after a
 *      tree step: keeps the accepted path), streams the emitted tokens to
 *      the host, records metrics and rewards the arm.
 *
 * Backends: any. The views the host's callbacks return (target hidden rows,
 * draft logits or hidden rows) live in the backend's memory — device memory
 * for a CUDA context, where the host's model computes them. The engine's own
 * index arrays stay on the host; with the CUDA backend it stages them through
 * a buffer of max_rows entries reserved at engine creation (with summaries
 * for max_rows rows), and each step waits for its verify (the tokens stream
 * to the host).
 *
 * Lifetimes: an engine borrows its context, target LM head and drafters;
 * destroy the engine first. A drafter serves at most one engine.
 *
 * Callbacks are plain C function pointers with a void* user_data. They
 * return 0 on success; any other value (or, from a C++ host, an exception)
 * makes the engine call fail with FLASHSPEC_ERR_CALLBACK and a message
 * naming the callback. The engine stays usable after any failure. A
 * callback must not call flashspec_engine_generate on its own engine (that
 * call fails with FLASHSPEC_ERR_INVALID_ARGUMENT), and must not destroy the
 * engine, its drafters, its target LM head or its context while the engine is
 * generating (the generation in progress still uses them: undefined
 * behaviour); it may call flashspec_engine_cancel and any function on objects
 * the generation does not use. */
typedef struct flashspec_drafter flashspec_drafter;
typedef struct flashspec_engine flashspec_engine;

/* ---- Drafters ---------------------------------------------------------- */

/* Cost of a drafter in the bandit's cost model (see flashspec_engine_params):
 * call_cost per step it is asked, token_cost per token it proposes, both in
 * units of one target forward; ≥ 0 and finite. */

/* Built-in prompt-lookup drafter. Finds the longest suffix of the sequence
 * (prompt and emitted tokens) with length n in [min_n, max_n] that occurred
 * earlier, and proposes up to k tokens that followed its most recent earlier
 * occurrence. When that occurrence ends fewer than k tokens before the end
 * of the sequence, the copy runs on into the tokens it is proposing (so a
 * periodic text drafts its period again and again). No match: no draft, and
 * the step decodes one token. Its index is updated incrementally, O(max_n²)
 * per token, independent of the sequence length. */
typedef struct flashspec_ngram_params {
  uint32_t struct_size; /* sizeof(flashspec_ngram_params) */
  int32_t min_n;        /* shortest suffix matched, 1..32; default 1 */
  int32_t max_n;        /* longest suffix matched, min_n..32; default 4 */
  double call_cost;     /* default 0 */
  double token_cost;    /* default 0 */
} flashspec_ngram_params;

/* [thread-safe] Defaults as above. NULL is a no-op. */
FLASHSPEC_API void flashspec_ngram_params_init(flashspec_ngram_params* params);

/* [context-exclusive] Create an n-gram drafter. params may be NULL (defaults).
 * Errors: NULL_POINTER (ctx, out), STRUCT_SIZE, OUT_OF_RANGE (min_n, max_n),
 * INVALID_ARGUMENT (a cost negative or not finite). */
FLASHSPEC_API flashspec_status flashspec_drafter_create_ngram(flashspec_context* ctx,
                                                             const flashspec_ngram_params* params,
                                                             flashspec_drafter** out);

/* Built-in suffix drafter (SuffixDecoding, Oliaro et al., arXiv:2411.04975).
 * It indexes the current sequence (prompt and emitted tokens) and the
 * outputs of its earlier generations (a cache of at most cache_max_tokens
 * tokens: when an output would overflow it, the oldest outputs leave first;
 * an output longer than the whole cache keeps its last tokens) in suffix
 * tries with occurrence counts, updated incrementally (O(max_match_len +
 * max_depth) per token, never rebuilt). Each step it matches, in each index,
 * the longest suffix of the sequence (at most max_match_len tokens) that
 * occurred followed by a token, and grows a proposal from it by the counts:
 * the probability of a continuation token is its count over the count of
 * all continuations seen after that context, and a proposed token's score
 * is the product of these along its path (an estimate of the probability
 * that the target accepts it and everything before it). The engine gets a
 * chain: the most frequent continuation (ties: the smaller token id) while
 * the score stays ≥ min_probability, at most min(k, max_depth) tokens, so
 * the draft is as long as the counts are confident. Of the two indexes'
 * proposals, the one with the higher sum of scores (the expected accepted
 * tokens) wins; ties go to the current sequence. No match: no draft.
 * flashspec_suffix_drafter_propose_tree gives a tree instead, and with
 * propose_trees = 1 so does the engine's drafter each step: the tree of at
 * most k nodes that flashspec_suffix_drafter_propose_tree would give for the
 * sequence so far (its nodes of tokens outside the target's vocabulary
 * dropped with their subtrees), and the engine runs a tree step (see Tree
 * steps below), even when the tree has a single branch.
 * Memory: at most (max_match_len + max_depth) trie nodes of about 64 bytes
 * per indexed token, for the current sequence and for the cache. */
typedef struct flashspec_suffix_params {
  uint32_t struct_size;     /* sizeof(flashspec_suffix_params) */
  int32_t max_match_len;    /* longest suffix matched, 1..64; default 16 */
  int32_t max_depth;        /* longest path proposed, 1..64; default 16 */
  double min_probability;   /* least score of a proposed token, 0..1; default 0.1 */
  int32_t cache_max_tokens; /* tokens of earlier outputs kept, 0..2^24
                               (0: no cache); default 16384 */
  double call_cost;         /* default 0 */
  double token_cost;        /* default 0 */
  int32_t propose_trees;    /* in an engine: 0 (default) drafts chains; 1 drafts
                               trees of at most k nodes (the arm's k counts nodes) */
} flashspec_suffix_params;

/* [thread-safe] Defaults as above. NULL is a no-op. */
FLASHSPEC_API void flashspec_suffix_params_init(flashspec_suffix_params* params);

/* [context-exclusive] Create a suffix drafter. params may be NULL (defaults).
 * An engine hands it every generation's final sequence, which enters the
 * cache of earlier outputs (the tokens after the prompt); so does a batched
 * engine when the sequence the drafter serves finishes, fails or is removed
 * while active.
 * Errors: NULL_POINTER (ctx, out), STRUCT_SIZE, OUT_OF_RANGE (max_match_len,
 * max_depth, min_probability (or NaN), cache_max_tokens), INVALID_ARGUMENT
 * (a cost negative or not finite, propose_trees not 0 or 1). On error *out
 * is untouched. */
FLASHSPEC_API flashspec_status flashspec_drafter_create_suffix(flashspec_context* ctx,
                                                              const flashspec_suffix_params* params,
                                                              flashspec_drafter** out);

/* [context-exclusive: the drafter's context] A draft tree for a host that
 * verifies trees itself (flashspec_verify_batch's draft_parents; the engine
 * drafts chains). First the drafter indexes `context` (context_len ≥ 1
 * token ids ≥ 0; the drafter has no vocabulary and proposes only tokens it
 * has indexed): a context that extends the one it indexed last (here or in
 * an engine's generation) costs only its new tokens; any other starts a new
 * sequence, and the previous one's output (its tokens after the first
 * context it was given) enters the cache of earlier outputs. To hand a
 * finished sequence's last tokens to the cache, call once more with the
 * whole sequence and max_nodes 0.
 * Then it writes a tree of at most max_nodes nodes: node i has token
 * tokens_out[i] and parent parents_out[i], a node index in [−1, i) (−1: a
 * child of the last context token), parents before children, no two
 * children of a node with the same token. Nodes are added best first, by
 * the score above (so the first n nodes of a larger budget are the tree of
 * budget n), while the score is ≥ min_probability and the path at most
 * max_depth deep. *num_nodes_out gets the count (0: no match).
 * max_nodes 0..FLASHSPEC_MAX_DRAFT_LEN; tokens_out and parents_out hold
 * max_nodes entries (may be NULL when max_nodes is 0).
 * Errors: NULL_POINTER (drafter, context, tokens_out, parents_out,
 * num_nodes_out), INVALID_ARGUMENT (drafter is not a suffix drafter, its
 * engine is generating, or it serves a sequence of a batched engine, whose
 * index this call would replace), OUT_OF_RANGE (context_len, a context token < 0,
 * max_nodes). On error nothing is indexed and the outputs are untouched;
 * the message is the drafter context's flashspec_context_last_error. */
FLASHSPEC_API flashspec_status flashspec_suffix_drafter_propose_tree(flashspec_drafter* drafter,
                                                                    const int32_t* context, int32_t context_len,
                                                                    int32_t max_nodes, int32_t* tokens_out,
                                                                    int32_t* parents_out, int32_t* num_nodes_out);

/* What a callback drafter hands back. */
typedef enum flashspec_draft_kind {
  /* Tokens only: a greedy, point-mass draft (q(x) = 1). Draft models decoded
   * greedily, lookup tables, retrieval. */
  FLASHSPEC_DRAFT_TOKENS = 0,
  /* Tokens and, for each, the draft logits row it was sampled from:
   * q = softmax(row / draft_temperature). The host samples the tokens from q
   * itself; verification uses the whole row, so the result stays exact. */
  FLASHSPEC_DRAFT_LOGITS = 1,
  /* Draft hidden rows; FlashSpec drafts them greedily with its fused draft
   * (flashspec_draft at T = 0) over `head`. EAGLE / MTP / Medusa-style
   * heads that share an LM head: return one row per call (autoregressive)
   * or several at once (one per future position). */
  FLASHSPEC_DRAFT_HIDDEN = 2,
  /* A tree of point-mass drafts (Medusa / EAGLE-style token trees): tokens,
   * and for each node i its parent in call->parents, a node index in
   * [−1, i) (−1: a child of the last context token; parents come before
   * their children). Siblings may repeat a token (the first is tried). The
   * arm's k bounds the nodes. Each step with at least one node is a tree
   * step (see Tree steps below), even when the tree is shaped as a chain;
   * 0 nodes: no draft this step. */
  FLASHSPEC_DRAFT_TREE = 3,
  FLASHSPEC_DRAFT_KIND_FORCE_32BIT_ = 0x7fffffff
} flashspec_draft_kind;

/* One request to a callback drafter. The library fills the inputs and the
 * tokens buffer; the callback fills the outputs of its kind. */
typedef struct flashspec_draft_call {
  uint32_t struct_size;    /* sizeof(flashspec_draft_call), set by the library */
  const int32_t* context;  /* the sequence so far: prompt, then emitted tokens */
  int32_t context_len;     /* ≥ 1; within one generation the context only grows */
  const int32_t* drafted;  /* HIDDEN: the tokens drafted earlier in this step */
  int32_t num_drafted;     /* HIDDEN: their count (0 on the first call of a step) */
  int32_t max_tokens;      /* most tokens (TOKENS, LOGITS), nodes (TREE) or rows (HIDDEN)
                              to return, ≥ 1 */
  uint64_t step;           /* the engine's step within the generation */
  /* Outputs. */
  int32_t* tokens;         /* TOKENS, LOGITS, TREE: library buffer of max_tokens entries */
  int32_t num_tokens;      /* tokens written, or HIDDEN rows returned; 0..max_tokens
                              (0: no draft this step; HIDDEN: stop drafting) */
  flashspec_tensor logits; /* LOGITS: a [num_tokens, V] view of host-owned memory
                              (the backend's memory), valid until the step ends */
  flashspec_tensor hidden; /* HIDDEN: a [num_tokens, d of head] view of host-owned
                              memory, valid until the callback is called again */
  /* Appended in 0.3 (read only where struct_size covers it). */
  int32_t* parents;        /* TREE: library buffer of max_tokens entries; the
                              callback writes parents[0 .. num_tokens), each in
                              [−1, i) for node i. NULL for the other kinds */
} flashspec_draft_call;

/* Fill call's outputs; return 0 on success. Called once per step for TOKENS,
 * LOGITS and TREE, and for HIDDEN repeatedly until k tokens are drafted or
 * it returns 0 rows. A TREE callback's bad parent (outside [−1, i) for node
 * i) fails the step with FLASHSPEC_ERR_CALLBACK, the message naming the
 * node ("draft callback: node 3: parent 5 is outside [-1, 3) ..."). */
typedef int (*flashspec_draft_fn)(void* user_data, flashspec_draft_call* call);

typedef struct flashspec_callback_drafter_params {
  uint32_t struct_size;            /* sizeof(flashspec_callback_drafter_params) */
  flashspec_draft_kind kind;       /* default FLASHSPEC_DRAFT_TOKENS */
  flashspec_draft_fn draft;        /* required */
  void* user_data;                 /* passed to draft */
  float draft_temperature;         /* LOGITS: T_d > 0 of q; default 1 */
  const flashspec_lm_head* head;   /* HIDDEN: the LM head drafted with (may be the
                                      target's); borrowed, outlives the drafter */
  double call_cost;                /* default 0 */
  double token_cost;               /* default 0 */
} flashspec_callback_drafter_params;

/* [thread-safe] Defaults as above (draft NULL). NULL is a no-op. */
FLASHSPEC_API void flashspec_callback_drafter_params_init(flashspec_callback_drafter_params* params);

/* [context-exclusive] Create a drafter backed by a host callback.
 * Errors: NULL_POINTER (ctx, params, params->draft, params->head for HIDDEN,
 * out), STRUCT_SIZE, INVALID_ARGUMENT (unknown kind (TOKENS, LOGITS, HIDDEN and
 * TREE are known), draft_temperature ≤ 0
 * or not finite for LOGITS, a cost negative or not finite),
 * DEVICE_MISMATCH (head of another backend or device). */
FLASHSPEC_API flashspec_status flashspec_drafter_create_callback(
    flashspec_context* ctx, const flashspec_callback_drafter_params* params, flashspec_drafter** out);

/* [context-exclusive] Destroy a drafter that no engine uses any more.
 * NULL is a no-op. */
FLASHSPEC_API void flashspec_drafter_destroy(flashspec_drafter* drafter);

/* ---- The target model, as the engine sees it ---------------------------- */

/* One forward of the host's target model. */
typedef struct flashspec_target_call {
  uint32_t struct_size;   /* sizeof(flashspec_target_call), set by the library */
  const int32_t* tokens;  /* tokens to append to the KV cache */
  int32_t num_tokens;     /* ≥ 1 */
  int32_t num_past;       /* tokens the cache must hold before these: the host drops
                             any beyond (0: a new sequence, clear the cache) */
  int32_t num_rows;       /* hidden rows wanted: those of the last num_rows tokens,
                             1..num_tokens; row j scores the token after tokens
                             [0 .. num_tokens − num_rows + j] */
  uint64_t step;          /* the engine's step within the generation */
  /* Output: a [num_rows, d] view of the final hidden rows (the LM head's
   * input) in host-owned memory of the backend, any dtype; valid until the
   * step ends. */
  flashspec_tensor hidden;
  /* Appended in 0.3 (read only where struct_size covers it). */
  const int32_t* parents; /* NULL: a chain step (every token follows the one before).
                             A tree step: [num_tokens], see Tree steps below */
} flashspec_target_call;

/* Append call->tokens to the target's cache and point call->hidden at the
 * rows; return 0 on success. */
typedef int (*flashspec_target_forward_fn)(void* user_data, flashspec_target_call* call);
/* Optional: truncate the target's KV cache to its first num_keep tokens (the
 * rejected drafts are dropped). Without it, the host truncates to num_past
 * at the next forward. Return 0 on success. */
typedef int (*flashspec_target_rollback_fn)(void* user_data, int32_t num_keep);
/* Optional (appended in 0.3): after a tree step, keep the cache's first
 * num_past tokens (the forward's num_past), then of that forward's tokens
 * only those at indices keep[0 .. num_keep) (indices into call->tokens,
 * increasing), in that order, dropping the rest: the cache then holds
 * num_past + num_keep tokens. Return 0 on success. */
typedef int (*flashspec_target_keep_fn)(void* user_data, int32_t num_past, const int32_t* keep, int32_t num_keep);

/* Tree steps. A drafter that proposes a tree of at least one node (a TREE
 * callback drafter, a suffix drafter with propose_trees = 1) makes the step
 * a tree step:
 *   - The target forward gets, as for a chain, the m ≥ 1 tokens the cache
 *     lacks (the last of them is the root: the last token of the sequence),
 *     then the n draft nodes in node order, so num_tokens = m + n and
 *     num_rows = n + 1, and call->parents[num_tokens]: −1 for the m tokens
 *     the cache lacks (each follows the token before it), and for node i at
 *     index m + i the index in call->tokens of its parent: m − 1 (the root)
 *     for a child of the root, m + p for a child of node p. In general
 *     token t's predecessor is parents[t] when ≥ 0, else t − 1. The host
 *     runs the forward with tree attention: each token attends to the cache,
 *     the call's tokens before the first node, and its own ancestors (itself
 *     included), at the position of its depth (root position + depth in the
 *     tree), never to its siblings or cousins. Row 0 is the root's, row
 *     i + 1 node i's: the target after the path to node i, so the verify
 *     sees one row per node plus the root's.
 *   - Verify: the tree rule of flashspec_verify_batch's draft_parents (see
 *     Tree verify; exact, point-mass drafts), keyed as a chain step is. The
 *     emitted tokens are the accepted path's tokens, then one more.
 *   - The cache: the accepted path's nodes are generally not contiguous in
 *     the cache. With target_keep the engine calls it (when a token is
 *     dropped) with the forward's num_past and keep = the m tokens the cache
 *     lacked (0 .. m − 1), then the accepted nodes' indices (m + node), so
 *     the cache holds the sequence and the accepted path, as after a chain
 *     step. Without it, the cache is valid only up to the root and the
 *     nodes of the path that sit where a chain would put them (nodes 0, 1,
 *     .. d − 1 when the path is 0, 1, .. d − 1): the engine calls
 *     target_rollback (if set) with that length, and the next forward's
 *     num_past is that length, so it sends the accepted path's tokens again
 *     among the tokens the cache lacks. Either way the tokens are the same.
 *   - A chain step (the other drafters, and a step without drafts) passes
 *     no parents (a batched engine: all −1 when another sequence of the
 *     step drafted a tree) and keeps target_rollback's protocol as before;
 *     its random numbers are Algorithm 1's (a batched engine: see there).
 *   - Costs and rewards: a tree of n nodes whose accepted path is d deep
 *     counts as a chain of n drafts of which d were accepted: cost n + 1
 *     rows (plus the drafter's call cost and n times its token cost),
 *     reward (d + 1) / cost, and the metrics count n draft tokens and d
 *     accepted (per position: the tree had ≥ j + 1 nodes, the path was
 *     ≥ j + 1 deep). The ADAPTIVE draft length rule learns the same way and
 *     chooses the node budget k. This rewards a tree by the tokens it
 *     yields per row, which is what the forward costs.
 * A host that does not run tree attention must not give the engine a
 * drafter that proposes trees. */

/* ---- Drafter selection -------------------------------------------------- */

typedef enum flashspec_bandit_policy {
  /* UCB1 (Auer et al. 2002): each arm once, then the arm maximising
   * mean + ucb_exploration · sqrt(2 ln t / n_arm) on scaled rewards. */
  FLASHSPEC_BANDIT_UCB1 = 0,
  /* Thompson sampling with Beta posteriors: a scaled reward r becomes a
   * Bernoulli(r) outcome (Agrawal & Goyal 2012), each arm's posterior is
   * Beta(1 + successes, 1 + failures), and each step plays the arm with the
   * largest posterior draw. Draws are Philox of (bandit_seed, step, arm),
   * so the policy is deterministic given its seed. */
  FLASHSPEC_BANDIT_THOMPSON = 1,
  /* Always params->fixed_arm. */
  FLASHSPEC_BANDIT_FIXED = 2,
  /* Always the arm with the largest params->oracle_rewards entry (ties: the
   * smallest index); a yardstick for tests and experiments. */
  FLASHSPEC_BANDIT_ORACLE = 3,
  FLASHSPEC_BANDIT_FORCE_32BIT_ = 0x7fffffff
} flashspec_bandit_policy;

/* How many tokens a step drafts (appended in 0.3). */
typedef enum flashspec_draft_len_rule {
  /* The played arm's k. */
  FLASHSPEC_DRAFT_LEN_ARM = 0,
  /* Dynamic speculation length: the arm's k is the most, and each step
   * drafts the k in [0, arm's k] that maximises the expected tokens per
   * unit cost of the step,
   *   (1 + Σ_{j<k} Π_{i≤j} a_i) / cost(k)   (ties: the smaller k),
   * with cost(k) the cost model below for k draft tokens and a_j the live
   * estimate, per drafter, of the probability that draft position j is
   * accepted when positions 0 .. j − 1 were:
   *   a_j = (accepted_j + 2 a_{j−1}) / (trials_j + 2),  a_{−1} = 1/2,
   * over that drafter's recent steps (a step that accepted i of its drafts
   * is a trial of positions 0 .. i, accepted below i), whose counts decay
   * by 1/draft_len_memory per step. A position without recent trials is
   * thus taken to be as good as the one before it, so longer drafts are
   * tried when the shorter ones go well. k = 0 decodes without calling the
   * drafter. Steps of every arm of a drafter teach its estimates. */
  FLASHSPEC_DRAFT_LEN_ADAPTIVE = 1,
  FLASHSPEC_DRAFT_LEN_RULE_FORCE_32BIT_ = 0x7fffffff
} flashspec_draft_len_rule;

/* An arm: drafter index (into params->drafters) and draft length k. An arm
 * with k = 0 decodes without drafting (its drafter index is ignored). This
 * struct is frozen: it never grows. */
typedef struct flashspec_arm {
  int32_t drafter;
  int32_t draft_len;
} flashspec_arm;

/* The engine. Cost model and reward, per step of an arm whose drafter
 * proposed n tokens of which `accepted` were accepted:
 *   cost   = target_step_cost + target_row_cost · (n + 1)
 *          + drafter call_cost (if the drafter was asked) + drafter token_cost · n
 *   reward = (accepted + 1) / cost
 * i.e. tokens emitted per unit cost (the +1 is the token the target emits
 * every step), so the policy maximises throughput. Policies see the reward
 * divided by the largest reward any arm can earn, in [0, 1]. */
typedef struct flashspec_engine_params {
  uint32_t struct_size;                   /* sizeof(flashspec_engine_params) */
  flashspec_target_forward_fn target_forward;   /* required */
  flashspec_target_rollback_fn target_rollback; /* optional */
  void* target_user_data;
  flashspec_drafter* const* drafters;     /* [num_drafters], borrowed */
  int32_t num_drafters;                   /* ≥ 0; default 0 */
  const flashspec_arm* arms;              /* [num_arms]; NULL: one arm per drafter of
                                             length default_draft_len (none: one k = 0 arm) */
  int32_t num_arms;                       /* with arms; 1..1024 */
  int32_t default_draft_len;              /* default 4 */
  flashspec_bandit_policy policy;         /* default UCB1 */
  uint64_t bandit_seed;                   /* THOMPSON; default 0 */
  double ucb_exploration;                 /* UCB1; ≥ 0, default 1 */
  int32_t fixed_arm;                      /* FIXED; default 0 */
  const double* oracle_rewards;           /* ORACLE: expected reward per arm; required then */
  double target_step_cost;                /* > 0; default 1 */
  double target_row_cost;                 /* ≥ 0; default 0.02 (extra rows of a
                                             memory-bound forward are nearly free) */
  int32_t max_context;                    /* most tokens the target's cache holds;
                                             0 = unlimited (default) */
  /* Appended in 0.3. */
  double draft_len_memory;                /* ADAPTIVE: steps the acceptance estimates
                                             remember (their counts decay by
                                             1/draft_len_memory per step); 1..1e6,
                                             default 64 */
  flashspec_draft_len_rule draft_len_rule; /* default FLASHSPEC_DRAFT_LEN_ARM */
  flashspec_target_keep_fn target_keep;    /* optional: the cache after a tree step
                                              (see Tree steps); default NULL */
} flashspec_engine_params;

/* [thread-safe] Defaults as above (target_forward NULL).
 * Writes min(size, sizeof(flashspec_engine_params)) bytes and sets
 * struct_size to that; NULL is a no-op. */
FLASHSPEC_API void flashspec_engine_params_init_sized(flashspec_engine_params* params, size_t size);
/* The 0.2 entry point (fills the 0.2 layout only); the macro below is what a
 * caller compiled against this header calls. */
FLASHSPEC_API void flashspec_engine_params_init(flashspec_engine_params* params);
#define flashspec_engine_params_init(params) \
  flashspec_engine_params_init_sized((params), sizeof(flashspec_engine_params))

/* [context-exclusive] Create an engine whose target model has LM head
 * target_head. Draft lengths must satisfy k + 1 ≤ the context's max_rows and
 * k ≤ FLASHSPEC_MAX_DRAFT_LEN.
 * Errors: NULL_POINTER (ctx, target_head, params, params->target_forward,
 * params->drafters or an entry, params->oracle_rewards for ORACLE, out),
 * STRUCT_SIZE, OUT_OF_RANGE (num_drafters, num_arms, an arm's drafter or
 * draft_len, default_draft_len, fixed_arm, max_context), INVALID_ARGUMENT
 * (unknown policy or draft_len_rule, a cost, ucb_exploration or
 * draft_len_memory out of range, a drafter listed
 * twice or serving another engine, an oracle reward not finite),
 * DEVICE_MISMATCH (target_head or a drafter's head from another backend or
 * device), OUT_OF_MEMORY, CUDA. On error *out is untouched. */
FLASHSPEC_API flashspec_status flashspec_engine_create(flashspec_context* ctx,
                                                       const flashspec_lm_head* target_head,
                                                       const flashspec_engine_params* params,
                                                       flashspec_engine** out);
/* [context-exclusive] NULL is a no-op. Releases the engine's drafters, which
 * the caller then destroys (or gives to another engine). */
FLASHSPEC_API void flashspec_engine_destroy(flashspec_engine* engine);

/* ---- Generation --------------------------------------------------------- */

/* Return 0 to go on, anything else to stop after this token
 * (FLASHSPEC_FINISH_HOST_STOP). */
typedef int (*flashspec_token_fn)(void* user_data, int32_t token);

typedef struct flashspec_generate_params {
  uint32_t struct_size;         /* sizeof(flashspec_generate_params) */
  float temperature;            /* target T ≥ 0; 0 = greedy; default 1 */
  uint64_t seed;                /* Philox key of the verify steps; default 0 */
  uint64_t request_id;          /* default 0 */
  int32_t max_tokens;           /* new tokens, ≥ 1; default 256 */
  const int32_t* stop_tokens;   /* [num_stop_tokens], each in [0, V); may be NULL if 0 */
  int32_t num_stop_tokens;      /* default 0 */
  flashspec_token_fn on_token;  /* optional streaming callback, once per emitted token */
  void* on_token_user_data;
} flashspec_generate_params;

/* [thread-safe] Defaults as above. NULL is a no-op. */
FLASHSPEC_API void flashspec_generate_params_init(flashspec_generate_params* params);

typedef enum flashspec_finish_reason {
  FLASHSPEC_FINISH_NONE = 0,         /* not finished (a failure stopped it) */
  FLASHSPEC_FINISH_LENGTH = 1,       /* max_tokens emitted */
  FLASHSPEC_FINISH_STOP_TOKEN = 2,   /* a stop token was emitted (it is included) */
  FLASHSPEC_FINISH_HOST_STOP = 3,    /* on_token returned non-zero */
  FLASHSPEC_FINISH_CONTEXT_FULL = 4, /* the target's cache reached max_context */
  FLASHSPEC_FINISH_CANCELLED = 5,    /* flashspec_engine_cancel */
  FLASHSPEC_FINISH_FORCE_32BIT_ = 0x7fffffff
} flashspec_finish_reason;

typedef struct flashspec_generate_result {
  uint32_t struct_size;                  /* sizeof(flashspec_generate_result) */
  int32_t num_tokens;                    /* tokens emitted */
  flashspec_finish_reason finish_reason;
  int32_t steps;                         /* verify steps run */
} flashspec_generate_result;

/* [thread-safe] Zeroes the result and sets struct_size. NULL is a no-op. */
FLASHSPEC_API void flashspec_generate_result_init(flashspec_generate_result* result);

/* [context-exclusive] Generate up to params->max_tokens tokens after prompt
 * (prompt_len ≥ 1 tokens in [0, V)). The first target forward gets the whole
 * prompt with num_past = 0. The emitted tokens go to tokens_out (capacity ≥
 * max_tokens; tokens_out may be NULL only with capacity 0, for streaming
 * only) and, one by one, to on_token. params may be NULL (defaults).
 * The same prompt, params, seed and drafter proposals give the same tokens.
 * Errors before generation starts leave every output untouched:
 * NULL_POINTER (engine, prompt, result, stop_tokens with a count),
 * STRUCT_SIZE, OUT_OF_RANGE (prompt_len, a prompt or stop token id,
 * max_tokens, capacity, prompt longer than max_context), INVALID_ARGUMENT
 * (temperature < 0 or not finite; the engine is already generating).
 * Errors during generation: CALLBACK (a callback failed or returned bad
 * sizes, tokens or views; the message says which), CANCELLED
 * (flashspec_engine_cancel), NON_FINITE (a hidden row or draft logit), and
 * the errors of flashspec_verify_and_finalize and flashspec_draft. Then
 * tokens_out[0 .. result->num_tokens) and *result describe the tokens
 * emitted (and streamed) before the failure; the finish reason is NONE, or
 * CANCELLED. Metrics and the policy keep the steps that completed. */
FLASHSPEC_API flashspec_status flashspec_engine_generate(flashspec_engine* engine, const int32_t* prompt,
                                                         int32_t prompt_len,
                                                         const flashspec_generate_params* params,
                                                         int32_t* tokens_out, int32_t tokens_capacity,
                                                         flashspec_generate_result* result);

/* [thread-safe] Ask the generation in progress to stop: it returns
 * FLASHSPEC_ERR_CANCELLED before its next step. No effect when the engine is
 * idle (each generation starts uncancelled). NULL is a no-op. */
FLASHSPEC_API void flashspec_engine_cancel(flashspec_engine* engine);

/* ---- Metrics -------------------------------------------------------------- */

/* Totals since creation or the last reset. */
typedef struct flashspec_engine_metrics {
  uint32_t struct_size;          /* sizeof(flashspec_engine_metrics) */
  uint64_t steps;                /* verify steps */
  uint64_t drafts;               /* steps that verified ≥ 1 draft token */
  uint64_t draft_tokens;         /* draft tokens verified */
  uint64_t accepted_tokens;      /* of those, accepted (≤ draft_tokens) */
  uint64_t emitted_tokens;       /* tokens handed to the host */
  double acceptance_rate;        /* accepted_tokens / draft_tokens (0 if none) */
  double mean_accepted_length;   /* accepted_tokens / drafts (0 if none) */
  double tokens_per_step;        /* emitted_tokens / steps (0 if none) */
  double step_latency_p50_us;    /* wall time of a step (drafting, target forward,
                                    verify, rollback), from a log histogram with
                                    buckets 2^(1/16) wide: within ±2.2% */
  double step_latency_p99_us;
  int32_t num_positions;         /* longest draft verified: entries of the per-position counts */
  int32_t num_arms;
} flashspec_engine_metrics;

/* [thread-safe] Zeroes the struct and sets struct_size. NULL is a no-op. */
FLASHSPEC_API void flashspec_engine_metrics_init(flashspec_engine_metrics* metrics);

/* [context-exclusive] Snapshot of the totals into *out (out->struct_size
 * set by flashspec_engine_metrics_init).
 * Errors: NULL_POINTER (engine, out), STRUCT_SIZE. */
FLASHSPEC_API flashspec_status flashspec_engine_get_metrics(const flashspec_engine* engine,
                                                            flashspec_engine_metrics* out);

/* [context-exclusive] Per-position acceptance: drafted[j] = steps whose draft
 * had at least j + 1 tokens, accepted[j] = steps that accepted at least j + 1
 * (both non-increasing in j, accepted[j] ≤ drafted[j]); the acceptance rate
 * at position j is accepted[j] / drafted[j]. Fills entries 0 .. min(capacity,
 * num_positions) − 1; *num_positions_out (optional) gets num_positions.
 * Errors: NULL_POINTER (engine; drafted or accepted with capacity > 0),
 * OUT_OF_RANGE (capacity < 0). */
FLASHSPEC_API flashspec_status flashspec_engine_get_position_metrics(const flashspec_engine* engine,
                                                                     int32_t capacity, uint64_t* drafted,
                                                                     uint64_t* accepted,
                                                                     int32_t* num_positions_out);

/* Statistics of one arm. */
typedef struct flashspec_arm_metrics {
  uint32_t struct_size;      /* sizeof(flashspec_arm_metrics) */
  int32_t drafter;           /* the arm's drafter index (−1 for a k = 0 arm) */
  int32_t draft_len;         /* its k */
  uint64_t pulls;            /* steps it was played */
  uint64_t draft_tokens;
  uint64_t accepted_tokens;
  double mean_reward;        /* mean of (accepted + 1) / cost, unscaled; 0 if unplayed */
  double mean_cost;          /* 0 if unplayed */
} flashspec_arm_metrics;

/* [thread-safe] Zeroes the struct and sets struct_size. NULL is a no-op. */
FLASHSPEC_API void flashspec_arm_metrics_init(flashspec_arm_metrics* metrics);

/* [context-exclusive] Statistics of arm `arm` (0 .. num_arms − 1).
 * Errors: NULL_POINTER (engine, out), STRUCT_SIZE, OUT_OF_RANGE (arm). */
FLASHSPEC_API flashspec_status flashspec_engine_get_arm_metrics(const flashspec_engine* engine, int32_t arm,
                                                                flashspec_arm_metrics* out);

/* [context-exclusive] Zero all metrics (the policy keeps what it learned).
 * Errors: NULL_POINTER (engine), INVALID_ARGUMENT (called during generation). */
FLASHSPEC_API flashspec_status flashspec_engine_reset_metrics(flashspec_engine* engine);

/* ====================================================================== */
/* Batched engine: many sequences in one engine                             */
/* ====================================================================== */
/* A batched engine runs the engine's loop for many sequences at once, the
 * way a server's parallel slots share one model. Sequences join
 * (flashspec_batch_engine_add_sequence) and leave
 * (flashspec_batch_engine_remove_sequence) between steps; each
 * flashspec_batch_engine_step
 *   1. asks each active sequence's policy for an arm and that sequence's
 *      drafter for up to k draft tokens;
 *   2. calls the host's target forward ONCE for the ragged batch (per
 *      sequence: its id, num_past, the tokens to append, its rows), which
 *      returns one hidden tensor holding every sequence's rows;
 *   3. verifies every sequence in ONE fused pass (the backend's ragged
 *      verify batch);
 *   4. per sequence: rolls its KV cache back past its rejected drafts (or
 *      keeps a tree's accepted path),
 *      streams its tokens to its own token callback, records metrics,
 *      rewards its arm, and finishes it on a stop token, its max_tokens or
 *      the context.
 *
 * A sequence emits exactly the tokens that flashspec_engine_generate on a
 * fresh engine with the same engine parameters, drafters, prompt and
 * sequence params would emit, at any temperature: its steps draw their
 * randomness from its own (seed, request_id) and its own step count (the
 * contract of flashspec_rng_uniform), never from its neighbours, and it
 * runs the engine's own step rules. With tree steps (see Tree steps) the
 * step's one verify pass (one read of the LM head) takes draft parents for
 * every sequence when any sequence drafts a tree, a chain as parents k − 1,
 * which verify treats as the chain it is (Tree verify): the chain sequences
 * of such a step emit what a single engine would.
 *
 * Per sequence, not shared: the drafters (each sequence brings
 * num_drafters drafter handles of its own, so an n-gram drafter's index or
 * a callback drafter's user_data belongs to one sequence), and the bandit
 * policy: each sequence starts a fresh policy of the engine's kind, arms
 * and costs, and learns from its own steps only (acceptance depends on the
 * text: a prompt-lookup drafter that wins on one sequence may lose on the
 * next); so do the acceptance estimates of the ADAPTIVE draft length rule.
 * The arms themselves are the engine's. A sequence's drafters see its final
 * sequence (a suffix drafter caches it) when it finishes, fails or is
 * removed while active. Metrics are kept per
 * sequence and summed over all sequences (arm statistics included).
 *
 * Errors of one sequence end that sequence only: its drafter failing
 * (CALLBACK, or any error of a HIDDEN drafter's draft), its token callback
 * throwing, its target rollback or keep failing, or (CUDA backend) a non-finite row
 * of its own. It stops (flashspec_sequence_info: active 0, status the
 * error, finish reason NONE; flashspec_batch_engine_sequence_error the
 * message), its tokens so far stay readable, and the other sequences go on
 * in the same step. Errors of the step as a whole — the target forward
 * failing or returning a bad view, a verify error such as a non-finite row
 * on the CPU backend — make flashspec_batch_engine_step fail: no sequence
 * emits a token in that step, every sequence stays as it was (a later step
 * repeats it, with the same keys, after drafting again), and the host's
 * caches are corrected by num_past at the next forward.
 *
 * Stochastic (LOGITS) drafters are refused: one verify pass takes one
 * draft-logits tensor, and the host hands each sequence's rows separately.
 * Backends: any, as for the engine; the engine stages its index arrays
 * through a buffer of max_rows tokens and max_sequences requests reserved
 * at creation.
 *
 * Lifetimes and callbacks: as for flashspec_engine. A drafter serves one
 * sequence (or one engine) at a time, from add_sequence until that
 * sequence is removed or the engine destroyed. A callback must not add,
 * remove or step on its own batch engine (INVALID_ARGUMENT). */
typedef struct flashspec_batch_engine flashspec_batch_engine;

/* One forward of the host's target model over a ragged batch. Sequence s
 * (in the order the sequences joined) appends tokens[token_offsets[s] ..
 * token_offsets[s + 1]) to its own KV cache, which must hold num_past[s]
 * tokens before them (the host drops any beyond; 0: a new sequence, clear
 * its cache), and wants the rows row_offsets[s] .. row_offsets[s + 1] − 1
 * of hidden: those of its last (row_offsets[s + 1] − row_offsets[s])
 * tokens, scored as in flashspec_target_call. */
typedef struct flashspec_batch_target_call {
  uint32_t struct_size;          /* sizeof(flashspec_batch_target_call), set by the library */
  int32_t num_sequences;         /* ≥ 1 */
  const uint64_t* sequence_ids;  /* [num_sequences] */
  const int32_t* num_past;       /* [num_sequences] */
  const int32_t* token_offsets;  /* [num_sequences + 1], token_offsets[0] = 0 */
  const int32_t* tokens;         /* [num_tokens] */
  const int32_t* row_offsets;    /* [num_sequences + 1], row_offsets[0] = 0; each sequence ≥ 1 row */
  int32_t num_tokens;            /* token_offsets[num_sequences] */
  int32_t num_rows;              /* row_offsets[num_sequences] */
  uint64_t step;                 /* the batch engine's step count */
  /* Output: a [num_rows, d] view of the final hidden rows of every sequence,
   * in host-owned memory of the backend, any dtype; valid until the step
   * ends. */
  flashspec_tensor hidden;
  const int32_t* parents;        /* NULL: no sequence of this step drafted a tree. Else
                                    [num_tokens]: sequence s's entries
                                    parents[token_offsets[s] ..] are those of
                                    flashspec_target_call's parents for its own tokens
                                    (indices from its first token, token_offsets[s]); a
                                    chain sequence's are all −1 (see Tree steps) */
} flashspec_batch_target_call;

/* Append the tokens to each sequence's cache and point call->hidden at the
 * rows; return 0 on success. */
typedef int (*flashspec_batch_target_forward_fn)(void* user_data, flashspec_batch_target_call* call);
/* Optional: truncate sequence sequence_id's KV cache to its first num_keep
 * tokens. Without it, the host truncates to num_past at the next forward.
 * Return 0 on success. */
typedef int (*flashspec_batch_target_rollback_fn)(void* user_data, uint64_t sequence_id, int32_t num_keep);
/* Optional: after a tree step of sequence sequence_id, as
 * flashspec_target_keep_fn (keep indexes the sequence's own tokens of the
 * last forward, from token_offsets[s]). Return 0 on success. */
typedef int (*flashspec_batch_target_keep_fn)(void* user_data, uint64_t sequence_id, int32_t num_past,
                                              const int32_t* keep, int32_t num_keep);
/* Streaming: one call per emitted token of a sequence. Return 0 to go on,
 * anything else to finish that sequence after this token
 * (FLASHSPEC_FINISH_HOST_STOP). */
typedef int (*flashspec_sequence_token_fn)(void* user_data, uint64_t sequence_id, int32_t token);

/* The batched engine. Arms, policy, costs, max_context and the draft length
 * rule mean what they mean in flashspec_engine_params, applied to each
 * sequence; an arm's drafter indexes the drafters each sequence brings. */
typedef struct flashspec_batch_engine_params {
  uint32_t struct_size;                         /* sizeof(flashspec_batch_engine_params) */
  flashspec_batch_target_forward_fn target_forward;   /* required */
  flashspec_batch_target_rollback_fn target_rollback; /* optional */
  void* target_user_data;
  int32_t num_drafters;                   /* drafters each sequence brings, 0..1024; default 0 */
  const flashspec_arm* arms;              /* [num_arms]; NULL: one arm per drafter of
                                             length default_draft_len (none: one k = 0 arm) */
  int32_t num_arms;                       /* with arms; 1..1024 */
  int32_t default_draft_len;              /* default 4 */
  flashspec_bandit_policy policy;         /* default UCB1 */
  uint64_t bandit_seed;                   /* THOMPSON; default 0 */
  double ucb_exploration;                 /* UCB1; ≥ 0, default 1 */
  int32_t fixed_arm;                      /* FIXED; default 0 */
  const double* oracle_rewards;           /* ORACLE: expected reward per arm; required then */
  double target_step_cost;                /* > 0; default 1 */
  double target_row_cost;                 /* ≥ 0; default 0.02 */
  int32_t max_context;                    /* most tokens a sequence's cache holds; 0 = unlimited */
  int32_t max_sequences;                  /* most sequences at once, ≥ 0; 0 (default): as many
                                             as the context's workspace holds,
                                             min(max_requests, max_rows / (k_max + 1)) */
  double draft_len_memory;                /* as in flashspec_engine_params; default 64 */
  flashspec_draft_len_rule draft_len_rule; /* default FLASHSPEC_DRAFT_LEN_ARM; ADAPTIVE:
                                             each sequence keeps its own acceptance
                                             estimates per drafter */
  flashspec_batch_target_keep_fn target_keep; /* optional: a sequence's cache after its
                                                 tree steps (see Tree steps); NULL */
} flashspec_batch_engine_params;

/* [thread-safe] Defaults as above (target_forward NULL). NULL is a no-op. */
FLASHSPEC_API void flashspec_batch_engine_params_init(flashspec_batch_engine_params* params);

/* [context-exclusive] Create a batched engine whose target model has LM
 * head target_head. Draft lengths as for flashspec_engine_create; every
 * step fits the context's workspace: max_sequences · (k_max + 1) ≤ its
 * max_rows and max_sequences ≤ its max_requests (k_max the longest arm).
 * Errors: NULL_POINTER (ctx, target_head, params, params->target_forward,
 * params->oracle_rewards for ORACLE, out), STRUCT_SIZE, OUT_OF_RANGE
 * (num_drafters, num_arms, an arm's drafter or draft_len,
 * default_draft_len, fixed_arm, max_context, max_sequences),
 * INVALID_ARGUMENT (unknown policy or draft_len_rule, a cost,
 * ucb_exploration or draft_len_memory out of range, an oracle reward not
 * finite), DEVICE_MISMATCH (target_head),
 * OUT_OF_MEMORY, CUDA. On error *out is untouched. */
FLASHSPEC_API flashspec_status flashspec_batch_engine_create(flashspec_context* ctx,
                                                             const flashspec_lm_head* target_head,
                                                             const flashspec_batch_engine_params* params,
                                                             flashspec_batch_engine** out);
/* [context-exclusive] NULL is a no-op. Releases every sequence's drafters,
 * which the caller then destroys or reuses. */
FLASHSPEC_API void flashspec_batch_engine_destroy(flashspec_batch_engine* engine);

/* One sequence: its drafters and what flashspec_generate_params says for a
 * single generation. */
typedef struct flashspec_sequence_params {
  uint32_t struct_size;                /* sizeof(flashspec_sequence_params) */
  flashspec_drafter* const* drafters;  /* [num_drafters], borrowed while the sequence
                                          is in the engine; none of kind LOGITS */
  int32_t num_drafters;                /* the engine's num_drafters; default 0 */
  float temperature;                   /* target T ≥ 0; 0 = greedy; default 1 */
  uint64_t seed;                       /* Philox key of its verify steps; default 0 */
  uint64_t request_id;                 /* default 0: give sequences that share a seed
                                          distinct request ids for independent samples */
  int32_t max_tokens;                  /* new tokens, ≥ 1; default 256 */
  const int32_t* stop_tokens;          /* [num_stop_tokens], each in [0, V); may be NULL if 0 */
  int32_t num_stop_tokens;             /* default 0 */
  flashspec_sequence_token_fn on_token; /* optional streaming callback */
  void* on_token_user_data;
} flashspec_sequence_params;

/* [thread-safe] Defaults as above. NULL is a no-op. */
FLASHSPEC_API void flashspec_sequence_params_init(flashspec_sequence_params* params);

/* [context-exclusive] Add a sequence, identified by the host's sequence_id,
 * with prompt (prompt_len ≥ 1 tokens in [0, V)); it joins at the next step,
 * whose forward gets its whole prompt with num_past 0. params may be NULL
 * only when the engine has no drafters (defaults).
 * Errors (the engine unchanged): NULL_POINTER (engine, prompt, drafters or
 * an entry, stop_tokens with a count), STRUCT_SIZE, OUT_OF_RANGE
 * (prompt_len, a prompt or stop token id, max_tokens, num_drafters not the
 * engine's, prompt longer than max_context), INVALID_ARGUMENT (sequence_id
 * already in the engine, temperature < 0 or not finite, a drafter listed
 * twice or serving another engine or sequence, called from a callback of
 * this engine), UNSUPPORTED (a LOGITS drafter), DEVICE_MISMATCH (a HIDDEN
 * drafter's head of another backend or vocabulary), WORKSPACE_EXCEEDED
 * (max_sequences sequences are in the engine). */
FLASHSPEC_API flashspec_status flashspec_batch_engine_add_sequence(flashspec_batch_engine* engine,
                                                                   uint64_t sequence_id, const int32_t* prompt,
                                                                   int32_t prompt_len,
                                                                   const flashspec_sequence_params* params);

/* [context-exclusive] Remove a sequence, active (cancelling it) or
 * finished, and release its drafters; its tokens, info and metrics go with
 * it (its steps stay in the engine's totals). The host frees its KV cache.
 * Errors: NULL_POINTER (engine), OUT_OF_RANGE (sequence_id not in the
 * engine), INVALID_ARGUMENT (called from a callback of this engine). */
FLASHSPEC_API flashspec_status flashspec_batch_engine_remove_sequence(flashspec_batch_engine* engine,
                                                                      uint64_t sequence_id);

/* [context-exclusive] Run one step for every active sequence (see above).
 * *num_active_out (optional) gets the number of sequences still active
 * after it; with none active the step does nothing and returns OK. Errors
 * of one sequence end that sequence and are not returned here.
 * Errors: NULL_POINTER (engine), INVALID_ARGUMENT (called from a callback
 * of this engine), and for the step as a whole CALLBACK (the target
 * forward failed or returned a bad view), NON_FINITE, and the errors of
 * flashspec_verify_and_finalize. */
FLASHSPEC_API flashspec_status flashspec_batch_engine_step(flashspec_batch_engine* engine,
                                                           int32_t* num_active_out);

typedef struct flashspec_sequence_info {
  uint32_t struct_size;                  /* sizeof(flashspec_sequence_info) */
  int32_t active;                        /* 1 while steps still run it, else 0 */
  flashspec_status status;               /* OK, or the error that ended it */
  flashspec_finish_reason finish_reason; /* NONE while active or after an error */
  int32_t num_tokens;                    /* tokens emitted */
  int32_t steps;                         /* verify steps it took part in */
} flashspec_sequence_info;

/* [thread-safe] Zeroes the info and sets struct_size. NULL is a no-op. */
FLASHSPEC_API void flashspec_sequence_info_init(flashspec_sequence_info* info);

/* [context-exclusive] Where sequence sequence_id stands: *info (optional;
 * info->struct_size set by flashspec_sequence_info_init) and its emitted
 * tokens, the first min(capacity, num_tokens) of them into tokens_out.
 * Errors (outputs untouched): NULL_POINTER (engine; tokens_out with
 * capacity > 0), OUT_OF_RANGE (sequence_id not in the engine, capacity <
 * 0), STRUCT_SIZE. */
FLASHSPEC_API flashspec_status flashspec_batch_engine_get_sequence(const flashspec_batch_engine* engine,
                                                                   uint64_t sequence_id, int32_t* tokens_out,
                                                                   int32_t capacity,
                                                                   flashspec_sequence_info* info);

/* [context-exclusive] The message of the error that ended sequence
 * sequence_id ("" if none), valid until it is removed; NULL for a NULL
 * engine or an id not in the engine. */
FLASHSPEC_API const char* flashspec_batch_engine_sequence_error(const flashspec_batch_engine* engine,
                                                                uint64_t sequence_id);

/* [context-exclusive] Totals over every sequence since the engine was
 * created (each sequence's step counts once; latency is the wall time of
 * the batched step the sequence took part in), as in
 * flashspec_engine_get_metrics. Errors: NULL_POINTER (engine, out),
 * STRUCT_SIZE. */
FLASHSPEC_API flashspec_status flashspec_batch_engine_get_metrics(const flashspec_batch_engine* engine,
                                                                  flashspec_engine_metrics* out);
/* [context-exclusive] The same for sequence sequence_id alone.
 * Errors: NULL_POINTER (engine, out), STRUCT_SIZE, OUT_OF_RANGE
 * (sequence_id not in the engine). */
FLASHSPEC_API flashspec_status flashspec_batch_engine_get_sequence_metrics(
    const flashspec_batch_engine* engine, uint64_t sequence_id, flashspec_engine_metrics* out);
/* [context-exclusive] Statistics of arm `arm` summed over every sequence.
 * Errors: NULL_POINTER (engine, out), STRUCT_SIZE, OUT_OF_RANGE (arm). */
FLASHSPEC_API flashspec_status flashspec_batch_engine_get_arm_metrics(const flashspec_batch_engine* engine,
                                                                      int32_t arm, flashspec_arm_metrics* out);

/* ---------------------------------------------------------------------- */
/* Plugin entry                                                            */
/* ---------------------------------------------------------------------- */
/* A versioned, append-only table of the functions above, so a host can
 * dlopen the library and resolve a single symbol: every exported function
 * but flashspec_get_api itself has a member. Members are never reordered or
 * removed; new ones are appended and struct_size grows, so a host reads a
 * member only if struct_size covers it. */
typedef struct flashspec_api {
  uint32_t struct_size;
  uint32_t abi_version;
  unsigned (*version_number)(void);
  const char* (*version_string)(void);
  const char* (*status_string)(flashspec_status);
  void (*context_params_init)(flashspec_context_params*);
  flashspec_status (*context_create)(const flashspec_context_params*, flashspec_context**);
  void (*context_destroy)(flashspec_context*);
  const char* (*context_last_error)(const flashspec_context*);
  flashspec_status (*context_synchronize)(flashspec_context*);
  flashspec_status (*lm_head_create)(flashspec_context*, const flashspec_tensor*,
                                     flashspec_lm_head_flags, flashspec_lm_head**);
  void (*lm_head_destroy)(flashspec_lm_head*);
  void (*draft_params_init)(flashspec_draft_params*);
  flashspec_status (*draft)(flashspec_context*, const flashspec_lm_head*, const flashspec_tensor*,
                            const flashspec_draft_params*, int32_t*, float*);
  void (*verify_batch_init)(flashspec_verify_batch*);
  void (*verify_result_init)(flashspec_verify_result*);
  flashspec_status (*summaries_create)(flashspec_context*, int32_t, int32_t, flashspec_summaries**);
  void (*summaries_destroy)(flashspec_summaries*);
  flashspec_status (*verify)(flashspec_context*, const flashspec_lm_head*,
                             const flashspec_verify_batch*, flashspec_summaries*);
  flashspec_status (*finalize)(flashspec_context*, const flashspec_verify_batch*,
                               const flashspec_summaries*, const flashspec_verify_result*);
  flashspec_status (*verify_and_finalize)(flashspec_context*, const flashspec_lm_head*,
                                          const flashspec_verify_batch*,
                                          const flashspec_verify_result*);
  /* Engine (appended). */
  void (*ngram_params_init)(flashspec_ngram_params*);
  flashspec_status (*drafter_create_ngram)(flashspec_context*, const flashspec_ngram_params*,
                                           flashspec_drafter**);
  void (*callback_drafter_params_init)(flashspec_callback_drafter_params*);
  flashspec_status (*drafter_create_callback)(flashspec_context*, const flashspec_callback_drafter_params*,
                                              flashspec_drafter**);
  void (*drafter_destroy)(flashspec_drafter*);
  void (*engine_params_init)(flashspec_engine_params*);
  flashspec_status (*engine_create)(flashspec_context*, const flashspec_lm_head*,
                                    const flashspec_engine_params*, flashspec_engine**);
  void (*engine_destroy)(flashspec_engine*);
  void (*generate_params_init)(flashspec_generate_params*);
  void (*generate_result_init)(flashspec_generate_result*);
  flashspec_status (*engine_generate)(flashspec_engine*, const int32_t*, int32_t,
                                      const flashspec_generate_params*, int32_t*, int32_t,
                                      flashspec_generate_result*);
  void (*engine_cancel)(flashspec_engine*); /* [thread-safe] */
  void (*engine_metrics_init)(flashspec_engine_metrics*);
  flashspec_status (*engine_get_metrics)(const flashspec_engine*, flashspec_engine_metrics*);
  flashspec_status (*engine_get_position_metrics)(const flashspec_engine*, int32_t, uint64_t*, uint64_t*,
                                                  int32_t*);
  void (*arm_metrics_init)(flashspec_arm_metrics*);
  flashspec_status (*engine_get_arm_metrics)(const flashspec_engine*, int32_t, flashspec_arm_metrics*);
  flashspec_status (*engine_reset_metrics)(flashspec_engine*);
  /* Appended: the remaining exported functions (all but flashspec_get_api). */
  unsigned (*abi_version_of_library)(void); /* flashspec_abi_version */
  const char* (*status_name)(flashspec_status);
  flashspec_tensor (*tensor_make)(const void*, flashspec_dtype, flashspec_memory, int64_t, int64_t);
  int (*context_last_cuda_error)(const flashspec_context*);
  flashspec_backend (*context_backend)(const flashspec_context*);
  int (*cuda_device_count)(void);
  int64_t (*lm_head_vocab_size)(const flashspec_lm_head*);
  int64_t (*lm_head_hidden_size)(const flashspec_lm_head*);
  void (*philox4x32_10)(const uint32_t*, const uint32_t*, uint32_t*);
  double (*rng_uniform)(uint64_t, uint64_t, uint64_t, int32_t, flashspec_rng_purpose, int32_t);
  /* Appended in 0.2. The members draft_params_init, verify_batch_init and
   * verify_result_init above fill the 0.1 layouts; these fill `size` bytes. */
  void (*sampling_controls_init)(flashspec_sampling_controls*);
  void (*draft_params_init_sized)(flashspec_draft_params*, size_t);
  void (*verify_batch_init_sized)(flashspec_verify_batch*, size_t);
  void (*verify_result_init_sized)(flashspec_verify_result*, size_t);
  flashspec_status (*lm_head_create_shard)(flashspec_context*, const flashspec_tensor*, flashspec_lm_head_flags,
                                           int64_t, int64_t, flashspec_lm_head**);
  int64_t (*lm_head_vocab_begin)(const flashspec_lm_head*);
  int64_t (*lm_head_global_vocab_size)(const flashspec_lm_head*);
  flashspec_status (*verify_shard)(flashspec_context*, const flashspec_lm_head*, const flashspec_verify_batch*,
                                   void*);
  flashspec_status (*finalize_shards)(flashspec_context*, const flashspec_verify_batch*, const void*, int32_t,
                                      const flashspec_verify_result*);
  flashspec_status (*draft_shard)(flashspec_context*, const flashspec_lm_head*, const flashspec_tensor*,
                                  const flashspec_draft_params*, void*);
  flashspec_status (*draft_from_shards)(flashspec_context*, const flashspec_draft_params*, const void*, int32_t,
                                        int32_t, int32_t*, float*);
  /* Appended: the batched engine. */
  void (*batch_engine_params_init)(flashspec_batch_engine_params*);
  flashspec_status (*batch_engine_create)(flashspec_context*, const flashspec_lm_head*,
                                          const flashspec_batch_engine_params*, flashspec_batch_engine**);
  void (*batch_engine_destroy)(flashspec_batch_engine*);
  void (*sequence_params_init)(flashspec_sequence_params*);
  flashspec_status (*batch_engine_add_sequence)(flashspec_batch_engine*, uint64_t, const int32_t*, int32_t,
                                                const flashspec_sequence_params*);
  flashspec_status (*batch_engine_remove_sequence)(flashspec_batch_engine*, uint64_t);
  flashspec_status (*batch_engine_step)(flashspec_batch_engine*, int32_t*);
  void (*sequence_info_init)(flashspec_sequence_info*);
  flashspec_status (*batch_engine_get_sequence)(const flashspec_batch_engine*, uint64_t, int32_t*, int32_t,
                                                flashspec_sequence_info*);
  const char* (*batch_engine_sequence_error)(const flashspec_batch_engine*, uint64_t);
  flashspec_status (*batch_engine_get_metrics)(const flashspec_batch_engine*, flashspec_engine_metrics*);
  flashspec_status (*batch_engine_get_sequence_metrics)(const flashspec_batch_engine*, uint64_t,
                                                        flashspec_engine_metrics*);
  flashspec_status (*batch_engine_get_arm_metrics)(const flashspec_batch_engine*, int32_t,
                                                   flashspec_arm_metrics*);
  /* Appended in 0.3. The member engine_params_init above fills the 0.2
   * layout; engine_params_init_sized fills `size` bytes. */
  void (*suffix_params_init)(flashspec_suffix_params*);
  flashspec_status (*drafter_create_suffix)(flashspec_context*, const flashspec_suffix_params*,
                                            flashspec_drafter**);
  flashspec_status (*suffix_drafter_propose_tree)(flashspec_drafter*, const int32_t*, int32_t, int32_t, int32_t*,
                                                  int32_t*, int32_t*);
  void (*engine_params_init_sized)(flashspec_engine_params*, size_t);
  /* Appended: the fused top-k draft. */
  flashspec_status (*draft_top_k)(flashspec_context*, const flashspec_lm_head*, const flashspec_tensor*,
                                  const flashspec_draft_params*, int32_t, int32_t*, float*);
  /* Appended: 8-bit LM heads. */
  flashspec_status (*lm_head_create_quantized)(flashspec_context*, const flashspec_tensor*,
                                               const flashspec_tensor*, flashspec_dtype, flashspec_lm_head_flags,
                                               flashspec_lm_head**);
  flashspec_dtype (*lm_head_dtype)(const flashspec_lm_head*);
} flashspec_api;

/* [thread-safe] The table for abi_version, or NULL if this library cannot
 * serve that ABI (a host built against another major version). The table is
 * static and lives as long as the library is loaded. */
FLASHSPEC_API const flashspec_api* flashspec_get_api(unsigned abi_version);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLASHSPEC_H */
