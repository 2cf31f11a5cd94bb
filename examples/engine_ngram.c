/* engine_ngram.c — the speculative engine on the CPU with a synthetic target
 * model and the built-in n-gram (prompt lookup) drafter.
 *
 * The "model" is a fixed random LM head W [V, d] and token embeddings E; the
 * hidden row after a context is E[t−1] + 0.6 E[t−2] + 0.3 E[t−3], so greedy
 * text falls into loops that prompt lookup drafts well. The host keeps the
 * target's "KV cache" (here: the token list) and rolls it back when the
 * engine says so. Three arms (n-gram with k = 2, 4, 8) and a no-draft arm
 * are chosen by UCB1; the program prints the tokens, tokens per step, the
 * per-position acceptance and each arm's statistics.
 *
 * Build: meson setup build && ninja -C build && ./build/examples/engine_ngram
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashspec.h"

#define VOCAB 64
#define HIDDEN 32
#define MAX_TOKENS 256
#define MAX_CONTEXT 1024

typedef struct model {
  float weight[VOCAB * HIDDEN];
  float embed[VOCAB * HIDDEN];
  int32_t cache[MAX_CONTEXT]; /* the target's KV cache, as tokens */
  int32_t cache_len;
  float rows[(MAX_CONTEXT) * HIDDEN];
  int forwards;
} model;

static uint64_t rng_state = 12345;
static double uniform(void) {
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return ((double)(rng_state >> 11) + 0.5) / 9007199254740992.0;
}
static float normal(void) { return (float)(sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform())); }

static void hidden_row(const model* m, const int32_t* context, int32_t length, float* out) {
  static const float decay[3] = {1.0f, 0.6f, 0.3f};
  memset(out, 0, sizeof(float) * HIDDEN);
  for (int back = 0; back < 3 && back < length; ++back) {
    const float* e = m->embed + (size_t)context[length - 1 - back] * HIDDEN;
    for (int c = 0; c < HIDDEN; ++c) out[c] += decay[back] * e[c];
  }
}

/* Append call->tokens to the cache (after dropping anything beyond
 * num_past) and return the hidden rows of the last num_rows positions. */
static int target_forward(void* user_data, flashspec_target_call* call) {
  model* m = (model*)user_data;
  if (call->num_past > m->cache_len || call->num_past + call->num_tokens > MAX_CONTEXT) return 1;
  m->cache_len = call->num_past;
  memcpy(m->cache + m->cache_len, call->tokens, sizeof(int32_t) * (size_t)call->num_tokens);
  m->cache_len += call->num_tokens;
  for (int32_t r = 0; r < call->num_rows; ++r)
    hidden_row(m, m->cache, m->cache_len - call->num_rows + 1 + r, m->rows + (size_t)r * HIDDEN);
  call->hidden = flashspec_tensor_make(m->rows, FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, call->num_rows, HIDDEN);
  m->forwards++;
  return 0;
}

static int target_rollback(void* user_data, int32_t num_keep) {
  model* m = (model*)user_data;
  if (num_keep > m->cache_len) return 1;
  m->cache_len = num_keep;
  return 0;
}

static int print_token(void* user_data, int32_t token) {
  int* printed = (int*)user_data;
  printf("%d%s", token, (++*printed % 24) ? " " : "\n");
  return 0;
}

#define CHECK(call)                                                                           \
  do {                                                                                        \
    flashspec_status s_ = (call);                                                             \
    if (s_ != FLASHSPEC_OK) {                                                                 \
      fprintf(stderr, "%s failed: %s: %s\n", #call, flashspec_status_name(s_),               \
              flashspec_context_last_error(ctx));                                             \
      return 1;                                                                               \
    }                                                                                         \
  } while (0)

int main(void) {
  static model m;
  for (int i = 0; i < VOCAB * HIDDEN; ++i) m.weight[i] = normal();
  for (int i = 0; i < VOCAB * HIDDEN; ++i) m.embed[i] = normal();

  flashspec_context* ctx = NULL;
  flashspec_context_params cp;
  flashspec_context_params_init(&cp);
  cp.backend = FLASHSPEC_BACKEND_CPU;
  cp.max_rows = 16;
  CHECK(flashspec_context_create(&cp, &ctx));

  flashspec_tensor w = flashspec_tensor_make(m.weight, FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, VOCAB, HIDDEN);
  flashspec_lm_head* head = NULL;
  CHECK(flashspec_lm_head_create(ctx, &w, FLASHSPEC_LM_HEAD_COPY, &head));

  flashspec_ngram_params np;
  flashspec_ngram_params_init(&np);
  np.min_n = 1;
  np.max_n = 4;
  flashspec_drafter* ngram = NULL;
  CHECK(flashspec_drafter_create_ngram(ctx, &np, &ngram));

  const flashspec_arm arms[4] = {{0, 2}, {0, 4}, {0, 8}, {-1, 0}};
  flashspec_drafter* drafters[1] = {ngram};
  flashspec_engine_params ep;
  flashspec_engine_params_init(&ep);
  ep.target_forward = target_forward;
  ep.target_rollback = target_rollback;
  ep.target_user_data = &m;
  ep.drafters = drafters;
  ep.num_drafters = 1;
  ep.arms = arms;
  ep.num_arms = 4;
  ep.policy = FLASHSPEC_BANDIT_UCB1;
  ep.target_row_cost = 0.05;
  ep.max_context = MAX_CONTEXT;
  flashspec_engine* engine = NULL;
  CHECK(flashspec_engine_create(ctx, head, &ep, &engine));

  const int32_t prompt[] = {7, 21, 3, 7, 21, 40, 3, 7, 21, 3};
  int printed = 0;
  flashspec_generate_params gp;
  flashspec_generate_params_init(&gp);
  gp.temperature = 0.0f; /* greedy: the output equals plain greedy decoding */
  gp.max_tokens = MAX_TOKENS;
  gp.on_token = print_token;
  gp.on_token_user_data = &printed;
  int32_t tokens[MAX_TOKENS];
  flashspec_generate_result result;
  flashspec_generate_result_init(&result);
  printf("tokens:\n");
  CHECK(flashspec_engine_generate(engine, prompt, (int32_t)(sizeof prompt / sizeof prompt[0]), &gp, tokens, MAX_TOKENS,
                                  &result));
  printf("\n\n%d tokens in %d steps (%d target forwards)\n", result.num_tokens, result.steps, m.forwards);

  flashspec_engine_metrics metrics;
  flashspec_engine_metrics_init(&metrics);
  CHECK(flashspec_engine_get_metrics(engine, &metrics));
  printf("tokens/step %.3f, acceptance rate %.3f, mean accepted length %.3f, step latency p50 %.1f us, p99 %.1f us\n",
         metrics.tokens_per_step, metrics.acceptance_rate, metrics.mean_accepted_length, metrics.step_latency_p50_us,
         metrics.step_latency_p99_us);

  uint64_t drafted[16], accepted[16];
  int32_t positions = 0;
  CHECK(flashspec_engine_get_position_metrics(engine, 16, drafted, accepted, &positions));
  printf("per-position acceptance:\n");
  for (int32_t j = 0; j < positions && j < 16; ++j)
    printf("  position %d: %llu / %llu = %.3f\n", j + 1, (unsigned long long)accepted[j],
           (unsigned long long)drafted[j], drafted[j] ? (double)accepted[j] / (double)drafted[j] : 0.0);

  printf("arms (UCB1):\n");
  for (int32_t a = 0; a < metrics.num_arms; ++a) {
    flashspec_arm_metrics am;
    flashspec_arm_metrics_init(&am);
    CHECK(flashspec_engine_get_arm_metrics(engine, a, &am));
    printf("  arm %d (drafter %d, k = %d): %llu steps, %llu/%llu accepted, mean reward %.3f tokens/cost\n", a,
           am.drafter, am.draft_len, (unsigned long long)am.pulls, (unsigned long long)am.accepted_tokens,
           (unsigned long long)am.draft_tokens, am.mean_reward);
  }

  flashspec_engine_destroy(engine);
  flashspec_drafter_destroy(ngram);
  flashspec_lm_head_destroy(head);
  flashspec_context_destroy(ctx);
  return 0;
}
