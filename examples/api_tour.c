/*
 * api_tour.c — the README's API tour as a program: a context, an LM head,
 * a draft, and a verify of a ragged batch, on the CPU backend, with every
 * status checked. The weights and hidden rows are random stand-ins for a
 * real model's.
 *
 * Build against a build tree (from the repository root, after ./.ci/test):
 *   cc examples/api_tour.c -Iinclude -Lbuild/src -Wl,-rpath,"$PWD/build/src" -lflashspec -lm -o api_tour
 * or against an installed library:
 *   cc examples/api_tour.c $(pkg-config --cflags --libs flashspec) -lm -o api_tour
 */
#include <flashspec.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum { V = 1000, D = 64, R = 2, DRAFTS = 3 /* request 0: 2 drafts, request 1: 1 */ };

#define CHECK(ctx, call)                                                                  \
  do {                                                                                    \
    flashspec_status status_ = (call);                                                    \
    if (status_ != FLASHSPEC_OK) {                                                        \
      fprintf(stderr, "%s: %s: %s\n", #call, flashspec_status_name(status_),              \
              flashspec_context_last_error(ctx));                                         \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

static float random_value(void) { return (float)rand() / (float)RAND_MAX - 0.5f; }

int main(void) {
  static float weights[V * D], draft_hidden[R * D], target_hidden_rows[(DRAFTS + R) * D];
  for (int i = 0; i < V * D; ++i) weights[i] = random_value();
  for (int i = 0; i < R * D; ++i) draft_hidden[i] = random_value();
  for (int i = 0; i < (DRAFTS + R) * D; ++i) target_hidden_rows[i] = random_value();

  flashspec_context_params params;
  flashspec_context_params_init(&params); /* struct_size + defaults */
  params.backend = FLASHSPEC_BACKEND_CPU; /* or CUDA / AUTO */
  params.seed = 42;
  flashspec_context* ctx = NULL;
  if (flashspec_context_create(&params, &ctx) != FLASHSPEC_OK) {
    fprintf(stderr, "%s\n", flashspec_context_last_error(NULL));
    return 1;
  }

  /* Upload the LM head W [V, d]: bf16, fp16 or fp32, host or device memory. */
  flashspec_tensor w = flashspec_tensor_make(weights, FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, V, D);
  flashspec_lm_head* head = NULL;
  CHECK(ctx, flashspec_lm_head_create(ctx, &w, FLASHSPEC_LM_HEAD_COPY, &head));

  /* Draft: greedy (T = 0) or Gumbel-max sampled (T > 0), token + logit / log q. */
  flashspec_tensor hidden_rows = flashspec_tensor_make(draft_hidden, FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, R, D);
  flashspec_draft_params dp;
  flashspec_draft_params_init(&dp);
  int32_t tokens[R];
  float scores[R];
  CHECK(ctx, flashspec_draft(ctx, head, &hidden_rows, &dp, tokens, scores));
  printf("greedy drafts: %d (logit %.3f), %d (logit %.3f)\n", tokens[0], scores[0], tokens[1], scores[1]);

  /* Verify a ragged batch: request r drafted offsets[r+1]-offsets[r] tokens
     and brings that many + 1 target hidden rows. */
  const int32_t offsets[R + 1] = {0, 2, 3};
  const int32_t drafts[DRAFTS] = {tokens[0], tokens[1], tokens[0]};
  const float temps[R] = {0.8f, 0.0f}; /* 0 = greedy target */
  flashspec_tensor target_rows =
      flashspec_tensor_make(target_hidden_rows, FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, DRAFTS + R, D);
  flashspec_verify_batch batch;
  flashspec_verify_batch_init(&batch);
  batch.num_requests = R;
  batch.draft_offsets = offsets;       /* [R + 1] */
  batch.draft_tokens = drafts;         /* [offsets[R]] */
  batch.target_hidden = &target_rows;  /* [offsets[R] + R, d] */
  batch.temperatures = temps;          /* [R]; 0 = greedy target */
  int32_t accepted[R], emitted[DRAFTS + R];
  flashspec_verify_result result;
  flashspec_verify_result_init(&result);
  result.accepted_counts = accepted;   /* [R] */
  result.emitted_tokens = emitted;     /* [offsets[R] + R]; request r at offsets[r] + r */
  CHECK(ctx, flashspec_verify_and_finalize(ctx, head, &batch, &result));
  for (int r = 0; r < R; ++r) {
    printf("request %d: accepted %d of %d drafts, emitted", r, accepted[r], offsets[r + 1] - offsets[r]);
    for (int k = 0; k <= accepted[r]; ++k) printf(" %d", emitted[offsets[r] + r + k]);
    printf("\n");
  }

  flashspec_lm_head_destroy(head);
  flashspec_context_destroy(ctx);
  return 0;
}
