/* generate.c — see generate.h. */
#define _POSIX_C_SOURCE 200809L
#include "generate.h"
#include "error.h"

#include <cblas.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flashspec.h"

#ifdef LLAMA_WITH_CUDA
#include "model_cuda.h"
#endif

/* One model's KV cache on the runner's device: exactly one of the two is set. */
typedef struct model_session {
  llama_session* cpu;
#ifdef LLAMA_WITH_CUDA
  llama_cuda_session* cuda;
#endif
} model_session;

struct llama_runner {
  const llama_model* target;
  const llama_model* draft;
  llama_device device;
  flashspec_memory memory;       /* where hidden rows live: the device's */
  int32_t draft_len;
  double draft_token_cost; /* a draft token's cost, in target forwards */
  flashspec_context* ctx;        /* the engine's */
  flashspec_lm_head* target_head;
  model_session target_session;
  flashspec_context* draft_ctx;  /* the draft model's own (flashspec_draft in its callback) */
  flashspec_lm_head* draft_head;
  model_session draft_session;
#ifdef LLAMA_WITH_CUDA
  void* stream;                  /* CUDA: the one stream of both models and both contexts */
  llama_cuda_model* target_cuda;
  llama_cuda_model* draft_cuda;
  int32_t* device_drafts;        /* CUDA: [LLAMA_MAX_DRAFT] tokens drafted in one step */
#endif
  flashspec_drafter* suffix;     /* the suffix mode's drafter, kept across generations
                                    (its cache of earlier outputs) until
                                    llama_runner_forget_outputs */
  flashspec_draft_len_rule draft_len_rule;
  double prompt_seconds;         /* the last generation's prompt forward */
  char callback_error[512];      /* what a callback's failure was */
};

/* Most tokens the draft model drafts in one step: the largest k of any arm
 * (draft_len ≤ 64). */
#define LLAMA_MAX_DRAFT 64


const char* llama_mode_name(llama_mode mode) {
  switch (mode) {
    case LLAMA_MODE_PLAIN: return "plain";
    case LLAMA_MODE_NGRAM: return "ngram";
    case LLAMA_MODE_DRAFT: return "draft";
    case LLAMA_MODE_BANDIT: return "bandit";
    case LLAMA_MODE_SUFFIX: return "suffix";
  }
  return NULL;
}

const char* llama_device_name(llama_device device) {
  switch (device) {
    case LLAMA_DEVICE_CPU: return "cpu";
    case LLAMA_DEVICE_CUDA: return "cuda";
  }
  return NULL;
}

int llama_cuda_usable(void) {
#ifdef LLAMA_WITH_CUDA
  return flashspec_cuda_device_count() > 0 && llama_cuda_device_count() > 0;
#else
  return 0;
#endif
}

/* ---- A model's session on the runner's device ---------------------------- */

static void session_free(model_session* s) {
  llama_session_free(s->cpu);
  s->cpu = NULL;
#ifdef LLAMA_WITH_CUDA
  llama_cuda_session_free(s->cuda);
  s->cuda = NULL;
#endif
}

static int32_t session_length(const model_session* s) {
#ifdef LLAMA_WITH_CUDA
  if (s->cuda != NULL) return llama_cuda_session_length(s->cuda);
#endif
  return llama_session_length(s->cpu);
}

static int32_t session_capacity(const model_session* s) {
#ifdef LLAMA_WITH_CUDA
  if (s->cuda != NULL) return llama_cuda_session_capacity(s->cuda);
#endif
  return llama_session_capacity(s->cpu);
}

static const int32_t* session_tokens(const model_session* s) {
#ifdef LLAMA_WITH_CUDA
  if (s->cuda != NULL) return llama_cuda_session_tokens(s->cuda);
#endif
  return llama_session_tokens(s->cpu);
}

static int session_truncate(model_session* s, int32_t num_keep, char* err, size_t err_size) {
#ifdef LLAMA_WITH_CUDA
  if (s->cuda != NULL) return llama_cuda_session_truncate(s->cuda, num_keep, err, err_size);
#endif
  return llama_session_truncate(s->cpu, num_keep, err, err_size);
}

/* Host token ids in; hidden rows out in the device's memory. */
static int session_forward(model_session* s, const int32_t* tokens, int32_t n, const float** hidden, char* err,
                           size_t err_size) {
#ifdef LLAMA_WITH_CUDA
  if (s->cuda != NULL) return llama_cuda_session_forward(s->cuda, tokens, n, hidden, err, err_size);
#endif
  return llama_session_forward(s->cpu, tokens, n, hidden, err, err_size);
}

/* ---- Runner --------------------------------------------------------------- */

/* Multiply-adds per token of a forward plus its LM head: the cost model's
 * ratio of a draft token to a target forward. */
static double flops_per_token(const llama_hparams* hp) {
  const double d = hp->n_embd, q = (double)hp->n_head * hp->head_dim, kv = (double)hp->n_head_kv * hp->head_dim;
  return hp->n_layer * (d * (2 * q + 2 * kv) + 3 * d * hp->n_ff) + (double)hp->n_vocab * d;
}

/* The tied LM head: a copy of the host embedding on the CPU; on CUDA a
 * borrow of the device embedding the model upload already holds. */
static int make_head(flashspec_context* ctx, const llama_model* model, const float* device_embedding,
                     flashspec_lm_head** out, char* err, size_t err_size) {
  const llama_hparams* hp = llama_model_hparams(model);
  const int on_device = device_embedding != NULL;
  const flashspec_tensor w =
      flashspec_tensor_make(on_device ? device_embedding : llama_model_token_embedding(model), FLASHSPEC_DTYPE_F32,
                            on_device ? FLASHSPEC_MEMORY_CUDA : FLASHSPEC_MEMORY_HOST, hp->n_vocab, hp->n_embd);
  const flashspec_status s =
      flashspec_lm_head_create(ctx, &w, on_device ? FLASHSPEC_LM_HEAD_BORROW : FLASHSPEC_LM_HEAD_COPY, out);
  if (s != FLASHSPEC_OK) {
    llama_set_error(err, err_size, "flashspec_lm_head_create: %s: %s", flashspec_status_name(s),
              flashspec_context_last_error(ctx));
    return -1;
  }
  return 0;
}

static int make_context(const llama_runner* r, int32_t threads, flashspec_context** out, char* err, size_t err_size) {
  flashspec_context_params cp;
  flashspec_context_params_init(&cp);
  cp.backend = r->device == LLAMA_DEVICE_CUDA ? FLASHSPEC_BACKEND_CUDA : FLASHSPEC_BACKEND_CPU;
  cp.cpu_threads = threads;
#ifdef LLAMA_WITH_CUDA
  cp.cuda_stream = r->stream;
#endif
  const flashspec_status s = flashspec_context_create(&cp, out);
  if (s != FLASHSPEC_OK) {
    llama_set_error(err, err_size, "flashspec_context_create: %s: %s", flashspec_status_name(s),
              flashspec_context_last_error(NULL));
    return -1;
  }
  return 0;
}

/* The model's session, its LM head and (for the draft) its context, on the
 * runner's device. */
static int make_model_parts(llama_runner* r, const llama_model* model, int is_draft, model_session* session,
                            flashspec_lm_head** head, char* err, size_t err_size) {
  flashspec_context* ctx = is_draft ? r->draft_ctx : r->ctx;
  if (r->device == LLAMA_DEVICE_CPU)
    return llama_session_create(model, 0, &session->cpu, err, err_size) != 0 ||
                   make_head(ctx, model, NULL, head, err, err_size) != 0
               ? -1
               : 0;
#ifdef LLAMA_WITH_CUDA
  llama_cuda_model** uploaded = is_draft ? &r->draft_cuda : &r->target_cuda;
  if (llama_cuda_model_upload(model, r->stream, uploaded, err, err_size) != 0 ||
      llama_cuda_session_create(*uploaded, 0, &session->cuda, err, err_size) != 0 ||
      make_head(ctx, model, llama_cuda_model_token_embedding(*uploaded), head, err, err_size) != 0)
    return -1;
  return 0;
#else
  (void)model; (void)session; (void)head;
  llama_set_error(err, err_size, "this runtime was built without CUDA");
  return -1;
#endif
}

void llama_runner_free(llama_runner* r) {
  if (r == NULL) return;
  flashspec_drafter_destroy(r->suffix);
  session_free(&r->target_session);
  session_free(&r->draft_session);
  flashspec_lm_head_destroy(r->target_head); /* before the models they borrow from */
  flashspec_lm_head_destroy(r->draft_head);
  flashspec_context_destroy(r->ctx);
  flashspec_context_destroy(r->draft_ctx);
#ifdef LLAMA_WITH_CUDA
  llama_cuda_model_free(r->target_cuda);
  llama_cuda_model_free(r->draft_cuda);
  llama_cuda_free(r->device_drafts);
  llama_cuda_stream_destroy(r->stream);
#endif
  free(r);
}

int llama_runner_create(const llama_model* target, const llama_model* draft, llama_device device, int32_t threads,
                        int32_t draft_len, llama_runner** out, char* err, size_t err_size) {
  if (target == NULL || out == NULL) {
    llama_set_error(err, err_size, "llama_runner_create: %s is NULL", target == NULL ? "target" : "out");
    return -1;
  }
  if (llama_device_name(device) == NULL) {
    llama_set_error(err, err_size, "unknown device %d", (int)device);
    return -1;
  }
  if (device == LLAMA_DEVICE_CUDA && !llama_cuda_usable()) {
#ifdef LLAMA_WITH_CUDA
    llama_set_error(err, err_size, "device cuda: no CUDA device (CUDA runtime: %d, FlashSpec's CUDA backend: %d)",
              llama_cuda_device_count(), flashspec_cuda_device_count());
#else
    llama_set_error(err, err_size, "device cuda: this runtime was built without CUDA (configure with -Dcuda=enabled)");
#endif
    return -1;
  }
  if (threads < 1 || threads > 1024) {
    llama_set_error(err, err_size, "threads %d is outside [1, 1024]", threads);
    return -1;
  }
  if (draft_len < 1 || draft_len > LLAMA_MAX_DRAFT) {
    llama_set_error(err, err_size, "draft length %d is outside [1, %d]", draft_len, LLAMA_MAX_DRAFT);
    return -1;
  }
  if (draft != NULL && llama_model_hparams(draft)->n_vocab != llama_model_hparams(target)->n_vocab) {
    llama_set_error(err, err_size, "the draft model's vocabulary (%d) differs from the target's (%d)",
              llama_model_hparams(draft)->n_vocab, llama_model_hparams(target)->n_vocab);
    return -1;
  }
  llama_runner* r = (llama_runner*)calloc(1, sizeof(llama_runner));
  if (r == NULL) {
    llama_set_error(err, err_size, "out of memory");
    return -1;
  }
  r->target = target;
  r->draft = draft;
  r->device = device;
  r->memory = device == LLAMA_DEVICE_CUDA ? FLASHSPEC_MEMORY_CUDA : FLASHSPEC_MEMORY_HOST;
  r->draft_len = draft_len;
  r->draft_len_rule = FLASHSPEC_DRAFT_LEN_ARM;
  if (device == LLAMA_DEVICE_CPU) openblas_set_num_threads(threads);
#ifdef LLAMA_WITH_CUDA
  if (device == LLAMA_DEVICE_CUDA &&
      (llama_cuda_stream_create(&r->stream, err, err_size) != 0 ||
       llama_cuda_malloc(sizeof(int32_t) * LLAMA_MAX_DRAFT, (void**)&r->device_drafts, err, err_size) != 0))
    goto fail;
#endif
  if (make_context(r, threads, &r->ctx, err, err_size) != 0 ||
      make_model_parts(r, target, 0, &r->target_session, &r->target_head, err, err_size) != 0)
    goto fail;
  if (draft != NULL) {
    if (make_context(r, threads, &r->draft_ctx, err, err_size) != 0 ||
        make_model_parts(r, draft, 1, &r->draft_session, &r->draft_head, err, err_size) != 0)
      goto fail;
    r->draft_token_cost = flops_per_token(llama_model_hparams(draft)) / flops_per_token(llama_model_hparams(target));
  }
  *out = r;
  return 0;
fail:
  llama_runner_free(r);
  return -1;
}

/* ---- Engine callbacks ---------------------------------------------------- */

static double now_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int target_forward(void* user_data, flashspec_target_call* call) {
  llama_runner* r = (llama_runner*)user_data;
  const llama_hparams* hp = llama_model_hparams(r->target);
  const float* hidden = NULL;
  const double start = now_seconds();
  if (session_truncate(&r->target_session, call->num_past, r->callback_error, sizeof r->callback_error) != 0 ||
      session_forward(&r->target_session, call->tokens, call->num_tokens, &hidden, r->callback_error,
                      sizeof r->callback_error) != 0)
    return 1;
  if (call->num_past == 0) { /* the prompt's forward */
#ifdef LLAMA_WITH_CUDA
    /* Its time is only known once the device has run it: one wait per
     * generation, for the prompt/generation split of the statistics. */
    if (r->device == LLAMA_DEVICE_CUDA &&
        flashspec_context_synchronize(r->ctx) != FLASHSPEC_OK) {
      snprintf(r->callback_error, sizeof r->callback_error, "prompt forward: %s", flashspec_context_last_error(r->ctx));
      return 1;
    }
#endif
    r->prompt_seconds = now_seconds() - start;
  }
  call->hidden = flashspec_tensor_make(hidden + (size_t)(call->num_tokens - call->num_rows) * hp->n_embd,
                                       FLASHSPEC_DTYPE_F32, r->memory, call->num_rows, hp->n_embd);
  return 0;
}

static int target_rollback(void* user_data, int32_t num_keep) {
  llama_runner* r = (llama_runner*)user_data;
  return session_truncate(&r->target_session, num_keep, r->callback_error, sizeof r->callback_error) != 0;
}

/* Greedy draft of the token after hidden row `row` into `token_out` (host
 * memory on the CPU, device memory on CUDA). */
static int draft_one(llama_runner* r, const float* row, int32_t* token_out) {
  const int32_t d = llama_model_hparams(r->draft)->n_embd;
  const flashspec_tensor view = flashspec_tensor_make(row, FLASHSPEC_DTYPE_F32, r->memory, 1, d);
  flashspec_draft_params params;
  flashspec_draft_params_init(&params);
  params.memory = r->memory;
  const flashspec_status st = flashspec_draft(r->draft_ctx, r->draft_head, &view, &params, token_out, NULL);
  if (st != FLASHSPEC_OK) {
    snprintf(r->callback_error, sizeof r->callback_error, "flashspec_draft: %s: %s", flashspec_status_name(st),
             flashspec_context_last_error(r->draft_ctx));
    return 1;
  }
  return 0;
}

/* The draft model as a drafter: bring its cache in step with the sequence,
 * then draft greedily token by token. On CUDA each drafted token stays on the
 * device and feeds the next forward from there; the step's tokens come to
 * the host in one copy at the end (the engine needs them there). */
static int draft_model_tokens(void* user_data, flashspec_draft_call* call) {
  llama_runner* r = (llama_runner*)user_data;
  model_session* s = &r->draft_session;
  const int32_t d = llama_model_hparams(r->draft)->n_embd;
  call->num_tokens = 0;
  if (call->context_len > session_capacity(s)) return 0; /* beyond the draft model's context: no draft */
  /* Reuse the longest cached prefix, but forward at least the last token:
   * its hidden row drafts the first token. */
  const int32_t* cached = session_tokens(s);
  int32_t keep = 0;
  while (keep < session_length(s) && keep < call->context_len - 1 && cached[keep] == call->context[keep]) keep++;
  const float* hidden = NULL;
  if (session_truncate(s, keep, r->callback_error, sizeof r->callback_error) != 0 ||
      session_forward(s, call->context + keep, call->context_len - keep, &hidden, r->callback_error,
                      sizeof r->callback_error) != 0)
    return 1;
  const float* row = hidden + (size_t)(call->context_len - keep - 1) * d;
  const int32_t max_tokens = call->max_tokens < LLAMA_MAX_DRAFT ? call->max_tokens : LLAMA_MAX_DRAFT;
  if (r->device == LLAMA_DEVICE_CPU) {
    for (;;) {
      if (draft_one(r, row, &call->tokens[call->num_tokens]) != 0) return 1;
      const int32_t token = call->tokens[call->num_tokens++];
      if (call->num_tokens == max_tokens || session_length(s) == session_capacity(s)) return 0;
      if (session_forward(s, &token, 1, &row, r->callback_error, sizeof r->callback_error) != 0) return 1;
    }
  }
#ifdef LLAMA_WITH_CUDA
  int32_t n = 0;
  for (;;) {
    if (draft_one(r, row, r->device_drafts + n) != 0) return 1;
    n++;
    if (n == max_tokens || session_length(s) == session_capacity(s)) break;
    if (llama_cuda_session_forward_device(s->cuda, r->device_drafts + n - 1, 1, &row, r->callback_error,
                                          sizeof r->callback_error) != 0)
      return 1;
  }
  if (llama_cuda_copy_to_host(call->tokens, r->device_drafts, sizeof(int32_t) * (size_t)n, r->stream,
                              r->callback_error, sizeof r->callback_error) != 0)
    return 1;
  /* All but the last drafted token went through the draft model: the host
   * now knows their ids (a −1 from a device-side NaN is refused here). */
  if (llama_cuda_session_record_tokens(s->cuda, session_length(s) - (n - 1), call->tokens, n - 1, r->callback_error,
                                       sizeof r->callback_error) != 0)
    return 1;
  if (call->tokens[n - 1] < 0) {
    snprintf(r->callback_error, sizeof r->callback_error, "flashspec_draft: no token for a non-finite draft row");
    return 1;
  }
  call->num_tokens = n;
#endif
  return 0;
}

/* ---- Generation ----------------------------------------------------------- */

#define CHECK_FS(call, ctx)                                                                                 \
  do {                                                                                                      \
    const flashspec_status s_ = (call);                                                                     \
    if (s_ != FLASHSPEC_OK) {                                                                               \
      llama_set_error(err, err_size, "%s: %s: %s%s%s", #call, flashspec_status_name(s_),                         \
                flashspec_context_last_error(ctx), r->callback_error[0] ? ": " : "", r->callback_error);   \
      goto done;                                                                                            \
    }                                                                                                       \
  } while (0)

void llama_runner_set_adaptive_draft_len(llama_runner* r, int adaptive) {
  if (r) r->draft_len_rule = adaptive ? FLASHSPEC_DRAFT_LEN_ADAPTIVE : FLASHSPEC_DRAFT_LEN_ARM;
}

void llama_runner_forget_outputs(llama_runner* r) {
  if (r == NULL) return;
  flashspec_drafter_destroy(r->suffix);
  r->suffix = NULL;
}

int llama_runner_generate(llama_runner* r, llama_mode mode, const int32_t* prompt, int32_t prompt_len,
                          int32_t max_tokens, float temperature, uint64_t seed, int32_t stop_token,
                          int32_t* tokens_out, llama_generation_stats* stats, char* err, size_t err_size) {
  if (r == NULL || prompt == NULL || tokens_out == NULL || stats == NULL) {
    llama_set_error(err, err_size, "llama_runner_generate: %s is NULL",
              r == NULL ? "runner" : prompt == NULL ? "prompt" : tokens_out == NULL ? "tokens_out" : "stats");
    return -1;
  }
  if (llama_mode_name(mode) == NULL) {
    llama_set_error(err, err_size, "unknown mode %d", (int)mode);
    return -1;
  }
  if ((mode == LLAMA_MODE_DRAFT) && r->draft == NULL) {
    llama_set_error(err, err_size, "the draft mode needs a draft model");
    return -1;
  }
  int status = -1;
  r->callback_error[0] = '\0';
  r->prompt_seconds = 0.0;
  flashspec_drafter* ngram = NULL;
  flashspec_drafter* draft = NULL;
  flashspec_engine* engine = NULL;
  flashspec_ngram_params np;
  flashspec_ngram_params_init(&np);
  np.min_n = 1;
  np.max_n = 4;
  flashspec_callback_drafter_params dp;
  flashspec_callback_drafter_params_init(&dp);
  dp.kind = FLASHSPEC_DRAFT_TOKENS;
  dp.draft = draft_model_tokens;
  dp.user_data = r;
  dp.token_cost = r->draft_token_cost;

  flashspec_drafter* drafters[3];
  const char* drafter_names[3];
  int32_t num_drafters = 0, ngram_index = -1, draft_index = -1, suffix_index = -1;
  if (mode == LLAMA_MODE_SUFFIX) {
    if (r->suffix == NULL) CHECK_FS(flashspec_drafter_create_suffix(r->ctx, NULL, &r->suffix), r->ctx);
    suffix_index = num_drafters;
    drafter_names[num_drafters] = "suffix";
    drafters[num_drafters++] = r->suffix;
  }
  if (mode == LLAMA_MODE_NGRAM || mode == LLAMA_MODE_BANDIT) {
    CHECK_FS(flashspec_drafter_create_ngram(r->ctx, &np, &ngram), r->ctx);
    ngram_index = num_drafters;
    drafter_names[num_drafters] = "ngram";
    drafters[num_drafters++] = ngram;
  }
  if (mode == LLAMA_MODE_DRAFT || (mode == LLAMA_MODE_BANDIT && r->draft != NULL)) {
    CHECK_FS(flashspec_drafter_create_callback(r->ctx, &dp, &draft), r->ctx);
    draft_index = num_drafters;
    drafter_names[num_drafters] = "draft model";
    drafters[num_drafters++] = draft;
  }
  flashspec_arm arms[LLAMA_MAX_ARMS];
  int32_t num_arms = 0;
  switch (mode) {
    case LLAMA_MODE_PLAIN: arms[num_arms++] = (flashspec_arm){-1, 0}; break;
    case LLAMA_MODE_NGRAM: arms[num_arms++] = (flashspec_arm){ngram_index, r->draft_len}; break;
    case LLAMA_MODE_DRAFT: arms[num_arms++] = (flashspec_arm){draft_index, r->draft_len}; break;
    case LLAMA_MODE_SUFFIX: arms[num_arms++] = (flashspec_arm){suffix_index, r->draft_len}; break;
    case LLAMA_MODE_BANDIT:
      arms[num_arms++] = (flashspec_arm){ngram_index, 2};
      arms[num_arms++] = (flashspec_arm){ngram_index, 4};
      arms[num_arms++] = (flashspec_arm){ngram_index, 8};
      if (draft_index >= 0) {
        arms[num_arms++] = (flashspec_arm){draft_index, 2};
        arms[num_arms++] = (flashspec_arm){draft_index, 4};
      }
      arms[num_arms++] = (flashspec_arm){-1, 0};
      break;
  }
  flashspec_engine_params ep;
  flashspec_engine_params_init(&ep);
  ep.target_forward = target_forward;
  ep.target_rollback = target_rollback;
  ep.target_user_data = r;
  ep.drafters = drafters;
  ep.num_drafters = num_drafters;
  ep.arms = arms;
  ep.num_arms = num_arms;
  ep.policy = mode == LLAMA_MODE_BANDIT ? FLASHSPEC_BANDIT_UCB1 : FLASHSPEC_BANDIT_FIXED;
  ep.fixed_arm = 0;
  ep.max_context = session_capacity(&r->target_session);
  ep.draft_len_rule = r->draft_len_rule;
  CHECK_FS(flashspec_engine_create(r->ctx, r->target_head, &ep, &engine), r->ctx);

  flashspec_generate_params gp;
  flashspec_generate_params_init(&gp);
  gp.temperature = temperature;
  gp.seed = seed;
  gp.max_tokens = max_tokens;
  gp.stop_tokens = stop_token >= 0 ? &stop_token : NULL;
  gp.num_stop_tokens = stop_token >= 0 ? 1 : 0;
  flashspec_generate_result result;
  flashspec_generate_result_init(&result);
  const double start = now_seconds();
  CHECK_FS(flashspec_engine_generate(engine, prompt, prompt_len, &gp, tokens_out, max_tokens, &result), r->ctx);
  const double seconds = now_seconds() - start;

  {
    memset(stats, 0, sizeof *stats);
    stats->num_tokens = result.num_tokens;
    stats->steps = result.steps;
    stats->finished_by_stop_token = result.finish_reason == FLASHSPEC_FINISH_STOP_TOKEN;
    stats->seconds = seconds;
    stats->prompt_seconds = r->prompt_seconds;
    const double generation_seconds = seconds - r->prompt_seconds;
    stats->tokens_per_second = generation_seconds > 0 ? result.num_tokens / generation_seconds : 0.0;
    flashspec_engine_metrics metrics;
    flashspec_engine_metrics_init(&metrics);
    CHECK_FS(flashspec_engine_get_metrics(engine, &metrics), r->ctx);
    stats->tokens_per_step = metrics.tokens_per_step;
    stats->acceptance_rate = metrics.acceptance_rate;
    CHECK_FS(flashspec_engine_get_position_metrics(engine, LLAMA_MAX_POSITIONS, stats->drafted, stats->accepted,
                                                   &stats->num_positions),
             r->ctx);
    if (stats->num_positions > LLAMA_MAX_POSITIONS) stats->num_positions = LLAMA_MAX_POSITIONS;
    stats->num_arms = num_arms;
    for (int32_t a = 0; a < num_arms; ++a) {
      flashspec_arm_metrics am;
      flashspec_arm_metrics_init(&am);
      CHECK_FS(flashspec_engine_get_arm_metrics(engine, a, &am), r->ctx);
      stats->arms[a] = (llama_arm_stats){am.drafter, am.drafter >= 0 ? drafter_names[am.drafter] : "none",
                                         am.draft_len, am.pulls, am.draft_tokens, am.accepted_tokens};
    }
  }
  status = 0;
done:
  flashspec_engine_destroy(engine);
  flashspec_drafter_destroy(ngram);
  flashspec_drafter_destroy(draft);
  return status;
}
