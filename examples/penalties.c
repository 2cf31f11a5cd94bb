/* Sampling controls as a runtime uses them: repetition, frequency and
 * presence penalties computed from the tokens generated so far, then
 * llama.cpp's default chain (top-k 40, top-p 0.95, min-p 0.05,
 * temperature 0.8), a grammar-style token mask, and logprobs, in one
 * speculative step on the CPU backend.
 *
 * The penalties, as the two runtimes define them, for a token t that
 * occurred c_t > 0 times in the window they look at:
 *   llama.cpp (last penalty_last_n tokens):
 *     l_t ← l_t / repeat_penalty if l_t > 0, else l_t · repeat_penalty;
 *     l_t ← l_t − c_t · frequency_penalty − presence_penalty.
 *   vLLM (repetition over prompt and output tokens; frequency and presence
 *   over output tokens only):
 *     the same repetition rule, then l_t − c_t · frequency − presence.
 * FlashSpec takes them per request as: the tokens to penalise in the bias
 * list, each with value −(c_t · frequency + presence) (0 for a prompt token
 * that only the repetition penalty touches), and repetition_penalty.
 *
 * Build (from the repository root, after `meson setup build && ninja -C build`):
 *   cc examples/penalties.c -Iinclude -Lbuild/src -lflashspec -lm -o penalties
 *   LD_LIBRARY_PATH=build/src ./penalties */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashspec.h"

enum { V = 1000, D = 64, DRAFTS = 3, HISTORY = 40, LAST_N = 64 };

static float frand(uint64_t* state) {
  *state = *state * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((*state >> 40) & 0xffffff) / 16777216.0f - 0.5f;
}

#define CHECK(call)                                                                   \
  do {                                                                                \
    flashspec_status s_ = (call);                                                     \
    if (s_ != FLASHSPEC_OK) {                                                         \
      fprintf(stderr, "%s: %s (%s)\n", #call, flashspec_status_name(s_),              \
              flashspec_context_last_error(ctx));                                     \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)

int main(void) {
  static float weight[V * D], hidden[(DRAFTS + 1) * D];
  uint64_t state = 42;
  for (int i = 0; i < V * D; ++i) weight[i] = frand(&state);
  for (int i = 0; i < (DRAFTS + 1) * D; ++i) hidden[i] = 4.0f * frand(&state);

  flashspec_context_params params;
  flashspec_context_params_init(&params);
  params.backend = FLASHSPEC_BACKEND_CPU;
  params.seed = 7;
  flashspec_context* ctx = NULL;
  if (flashspec_context_create(&params, &ctx) != FLASHSPEC_OK) {
    fprintf(stderr, "context: %s\n", flashspec_context_last_error(NULL));
    return 1;
  }
  flashspec_lm_head* head = NULL;
  flashspec_tensor w = flashspec_tensor_make(weight, FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, V, D);
  CHECK(flashspec_lm_head_create(ctx, &w, FLASHSPEC_LM_HEAD_COPY, &head));

  /* The tokens generated so far, and llama.cpp's penalty parameters. */
  int32_t history[HISTORY];
  for (int i = 0; i < HISTORY; ++i) history[i] = (int32_t)((i * 37 + 11) % 50);
  const float repeat_penalty = 1.1f, frequency_penalty = 0.1f, presence_penalty = 0.2f;
  int32_t count[V];
  memset(count, 0, sizeof count);
  for (int i = HISTORY > LAST_N ? HISTORY - LAST_N : 0; i < HISTORY; ++i) ++count[history[i]];
  int32_t bias_tokens[V];
  float bias_values[V];
  int32_t num_bias = 0;
  for (int t = 0; t < V; ++t)
    if (count[t] > 0) {
      bias_tokens[num_bias] = t;
      bias_values[num_bias] = -((float)count[t] * frequency_penalty + presence_penalty);
      ++num_bias;
    }

  /* A grammar-style mask per target row: here, odd token ids only. */
  const int words = (V + 31) / 32;
  static uint32_t mask[(DRAFTS + 1) * ((V + 31) / 32)];
  for (int i = 0; i < (DRAFTS + 1) * words; ++i) mask[i] = 0xaaaaaaaau;

  /* One request. */
  int32_t top_k = 40, bias_offsets[2] = {0, num_bias};
  float top_p = 0.95f, min_p = 0.05f, temperature = 0.8f;
  flashspec_sampling_controls controls;
  flashspec_sampling_controls_init(&controls);
  controls.top_k = &top_k;
  controls.top_p = &top_p;
  controls.min_p = &min_p;
  controls.bias_offsets = bias_offsets;
  controls.bias_tokens = bias_tokens;
  controls.bias_values = bias_values;
  controls.repetition_penalty = &repeat_penalty;
  controls.token_mask = mask;

  /* Draft three tokens greedily under the same controls (a stand-in for a
   * draft model: here the target's own rows 0..2). */
  int32_t drafts[DRAFTS];
  flashspec_draft_params draft_params;
  flashspec_draft_params_init(&draft_params);
  int32_t row_top_k[DRAFTS] = {40, 40, 40}, row_offsets[DRAFTS + 1];
  float row_top_p[DRAFTS] = {0.95f, 0.95f, 0.95f}, row_min_p[DRAFTS] = {0.05f, 0.05f, 0.05f};
  float row_repeat[DRAFTS] = {1.1f, 1.1f, 1.1f};
  static int32_t row_bias_tokens[DRAFTS * V];
  static float row_bias_values[DRAFTS * V];
  row_offsets[0] = 0;
  for (int r = 0; r < DRAFTS; ++r) { /* a draft call has one "request" per row */
    memcpy(row_bias_tokens + r * num_bias, bias_tokens, sizeof(int32_t) * (size_t)num_bias);
    memcpy(row_bias_values + r * num_bias, bias_values, sizeof(float) * (size_t)num_bias);
    row_offsets[r + 1] = (r + 1) * num_bias;
  }
  flashspec_sampling_controls draft_controls = controls;
  draft_controls.top_k = row_top_k;
  draft_controls.top_p = row_top_p;
  draft_controls.min_p = row_min_p;
  draft_controls.bias_offsets = row_offsets;
  draft_controls.bias_tokens = row_bias_tokens;
  draft_controls.bias_values = row_bias_values;
  draft_controls.repetition_penalty = row_repeat;
  draft_params.controls = &draft_controls;
  flashspec_tensor draft_rows = flashspec_tensor_make(hidden, FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, DRAFTS, D);
  CHECK(flashspec_draft(ctx, head, &draft_rows, &draft_params, drafts, NULL));

  /* Verify them at T = 0.8 with logprobs and the top 5 raw logprobs. */
  int32_t offsets[2] = {0, DRAFTS};
  flashspec_tensor target = flashspec_tensor_make(hidden, FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, DRAFTS + 1, D);
  flashspec_verify_batch batch;
  flashspec_verify_batch_init(&batch);
  batch.num_requests = 1;
  batch.draft_offsets = offsets;
  batch.draft_tokens = drafts;
  batch.target_hidden = &target;
  batch.temperatures = &temperature;
  batch.controls = &controls;
  batch.logprobs = 1;
  batch.top_logprobs = 5;
  int32_t accepted = 0, emitted[DRAFTS + 1], top_tokens[(DRAFTS + 1) * 5];
  float logprobs[DRAFTS + 1], raw_logprobs[DRAFTS + 1], top_logprobs[(DRAFTS + 1) * 5];
  flashspec_verify_result result;
  flashspec_verify_result_init(&result);
  result.accepted_counts = &accepted;
  result.emitted_tokens = emitted;
  result.logprobs = logprobs;
  result.raw_logprobs = raw_logprobs;
  result.top_tokens = top_tokens;
  result.top_logprobs = top_logprobs;
  CHECK(flashspec_verify_and_finalize(ctx, head, &batch, &result));

  printf("drafted %d %d %d, accepted %d\n", drafts[0], drafts[1], drafts[2], accepted);
  for (int k = 0; k <= accepted; ++k) {
    if (emitted[k] % 2 == 0) {
      fprintf(stderr, "token %d is masked out\n", emitted[k]);
      return 1;
    }
    printf("token %4d  log p %.4f  raw log p %.4f  top:", emitted[k], logprobs[k], raw_logprobs[k]);
    for (int i = 0; i < 5; ++i) printf(" %d (%.2f)", top_tokens[k * 5 + i], top_logprobs[k * 5 + i]);
    printf("\n");
  }
  flashspec_lm_head_destroy(head);
  flashspec_context_destroy(ctx);
  return 0;
}
