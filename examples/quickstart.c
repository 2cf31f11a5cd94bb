/*
 * quickstart.c — FlashSpec in one page.
 *
 * Uploads a small random bf16 LM head, drafts a few tokens greedily from
 * "draft model" hidden rows, then verifies them against "target model"
 * hidden rows for a batch of two requests and prints what was accepted and
 * emitted. The hidden rows are random stand-ins for a real model's.
 *
 * It always runs on the CPU backend: with the CUDA backend every tensor and
 * array must live in device memory (cudaMalloc + cudaMemcpy), which this
 * page leaves out to stay plain C with no CUDA dependency.
 *
 * Build (installed library):  cc quickstart.c $(pkg-config --cflags --libs flashspec) -lm -o quickstart
 */
#include <flashspec.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { VOCAB = 4096, HIDDEN = 256, DRAFTS0 = 4, DRAFTS1 = 2, REQUESTS = 2 };
enum { TOTAL_DRAFTS = DRAFTS0 + DRAFTS1, TARGET_ROWS = TOTAL_DRAFTS + REQUESTS };

/* A small seeded generator (xorshift64*) and a normal sample from it. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double uniform01(void) {
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return ((double)((rng_state * 0x2545f4914f6cdd1dull) >> 11) + 0.5) / 9007199254740992.0;
}
static float normal(void) {
  return (float)(sqrt(-2.0 * log(uniform01())) * cos(6.283185307179586 * uniform01()));
}

/* fp32 → bf16, round to nearest even (inputs here are finite). */
static uint16_t to_bf16(float f) {
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}

/* Prints the failure and jumps to cleanup; ctx may be NULL (create). */
#define CHECK(call)                                                                      \
  do {                                                                                   \
    flashspec_status status_ = (call);                                                   \
    if (status_ != FLASHSPEC_OK) {                                                       \
      fprintf(stderr, "quickstart: %s failed: %s: %s\n", #call,                          \
              flashspec_status_name(status_), flashspec_context_last_error(ctx));        \
      goto done;                                                                         \
    }                                                                                    \
  } while (0)

int main(void) {
  int exit_code = 1;
  flashspec_context* ctx = NULL;
  flashspec_lm_head* head = NULL;
  flashspec_summaries* summaries = NULL;
  uint16_t* weight = malloc(sizeof(uint16_t) * VOCAB * HIDDEN);
  float* draft_hidden = malloc(sizeof(float) * TOTAL_DRAFTS * HIDDEN);
  float* target_hidden = malloc(sizeof(float) * TARGET_ROWS * HIDDEN);
  if (!weight || !draft_hidden || !target_hidden) {
    fprintf(stderr, "quickstart: out of memory\n");
    goto done;
  }
  printf("FlashSpec %s (ABI %u), CUDA devices: %d; this example uses the CPU backend\n",
         flashspec_version_string(), flashspec_abi_version(), flashspec_cuda_device_count());

  /* 1. A context: CPU backend, a seed for every random number it draws. */
  flashspec_context_params params;
  flashspec_context_params_init(&params);
  params.backend = FLASHSPEC_BACKEND_CPU;
  params.seed = 2024;
  CHECK(flashspec_context_create(&params, &ctx));

  /* 2. Upload the LM head W [V, d] in bf16 (copied into the head). */
  for (size_t i = 0; i < (size_t)VOCAB * HIDDEN; ++i) weight[i] = to_bf16(0.5f * normal());
  flashspec_tensor w = flashspec_tensor_make(weight, FLASHSPEC_DTYPE_BF16, FLASHSPEC_MEMORY_HOST, VOCAB, HIDDEN);
  CHECK(flashspec_lm_head_create(ctx, &w, FLASHSPEC_LM_HEAD_COPY, &head));
  printf("LM head: V = %lld, d = %lld, bf16\n", (long long)flashspec_lm_head_vocab_size(head),
         (long long)flashspec_lm_head_hidden_size(head));

  /* 3. Greedy drafts: one fused pass gives argmax token and its logit per
   *    row, without writing the [rows, V] logits. Rows 0..3 draft request 0,
   *    rows 4..5 request 1. */
  for (size_t i = 0; i < (size_t)TOTAL_DRAFTS * HIDDEN; ++i) draft_hidden[i] = normal();
  flashspec_tensor dh =
      flashspec_tensor_make(draft_hidden, FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, TOTAL_DRAFTS, HIDDEN);
  int32_t draft_tokens[TOTAL_DRAFTS];
  float draft_logits[TOTAL_DRAFTS];
  CHECK(flashspec_draft(ctx, head, &dh, NULL /* greedy */, draft_tokens, draft_logits));

  /* 4. Target rows. Request r has n_r drafts and n_r + 1 target rows: row j
   *    scores draft j + 1, the last row gives the bonus token. Here the
   *    target agrees with the drafter on its first rows (its hidden rows are
   *    the draft rows plus a little noise) and then diverges. */
  const int32_t offsets[REQUESTS + 1] = {0, DRAFTS0, DRAFTS0 + DRAFTS1};
  for (int r = 0; r < REQUESTS; ++r) {
    int n = offsets[r + 1] - offsets[r];
    for (int j = 0; j <= n; ++j) {
      float* row = target_hidden + (size_t)(offsets[r] + r + j) * HIDDEN;
      int agrees = (r == 0 && j < 3) || (r == 1 && j < 1);
      for (int c = 0; c < HIDDEN; ++c)
        row[c] = agrees ? draft_hidden[(size_t)(offsets[r] + j) * HIDDEN + c] + 0.01f * normal() : normal();
    }
  }
  flashspec_tensor th =
      flashspec_tensor_make(target_hidden, FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, TARGET_ROWS, HIDDEN);

  /* 5. The verify batch: request 0 decodes greedily (T = 0: output equals
   *    greedy decoding), request 1 samples at T = 0.8 (output distributed
   *    exactly as sampling from the target alone). */
  const float temperatures[REQUESTS] = {0.0f, 0.8f};
  const uint64_t request_ids[REQUESTS] = {100, 101};
  const uint64_t steps[REQUESTS] = {0, 0};
  flashspec_verify_batch batch;
  flashspec_verify_batch_init(&batch);
  batch.num_requests = REQUESTS;
  batch.draft_offsets = offsets;
  batch.draft_tokens = draft_tokens;
  batch.target_hidden = &th;
  batch.temperatures = temperatures;
  batch.request_ids = request_ids;
  batch.steps = steps;

  /* 6. Verify (one pass over W, per-row summaries only), then finalize
   *    (accept/reject, residual or bonus token). */
  CHECK(flashspec_summaries_create(ctx, TARGET_ROWS, REQUESTS, &summaries));
  CHECK(flashspec_verify(ctx, head, &batch, summaries));
  int32_t accepted[REQUESTS];
  int32_t emitted[TARGET_ROWS];
  uint64_t next_steps[REQUESTS];
  flashspec_verify_result result;
  flashspec_verify_result_init(&result);
  result.accepted_counts = accepted;
  result.emitted_tokens = emitted;
  result.next_steps = next_steps;
  CHECK(flashspec_finalize(ctx, &batch, summaries, &result));
  CHECK(flashspec_context_synchronize(ctx));

  /* 7. Report. Request r's tokens start at offsets[r] + r; the first
   *    accepted[r] + 1 are valid. */
  int total_accepted = 0;
  for (int r = 0; r < REQUESTS; ++r) {
    int n = offsets[r + 1] - offsets[r];
    if (accepted[r] < 0 || accepted[r] > n) {
      fprintf(stderr, "quickstart: accepted count %d out of range\n", accepted[r]);
      goto done;
    }
    printf("request %d (T = %.1f): drafted", r, temperatures[r]);
    for (int j = 0; j < n; ++j) printf(" %d", draft_tokens[offsets[r] + j]);
    printf("; accepted %d of %d; emitted", accepted[r], n);
    for (int j = 0; j <= accepted[r]; ++j) {
      int32_t token = emitted[offsets[r] + r + j];
      if (token < 0 || token >= VOCAB) {
        fprintf(stderr, "\nquickstart: emitted token %d out of range\n", token);
        goto done;
      }
      printf(" %d", token);
    }
    printf("; next step %llu\n", (unsigned long long)next_steps[r]);
    total_accepted += accepted[r];
  }
  printf("acceptance: %d of %d drafts (%.0f%%), %d tokens emitted in one verify pass\n", total_accepted,
         TOTAL_DRAFTS, 100.0 * total_accepted / TOTAL_DRAFTS, total_accepted + REQUESTS);
  exit_code = 0;

done:
  flashspec_summaries_destroy(summaries);
  flashspec_lm_head_destroy(head);
  flashspec_context_destroy(ctx);
  free(weight);
  free(draft_hidden);
  free(target_hidden);
  return exit_code;
}
