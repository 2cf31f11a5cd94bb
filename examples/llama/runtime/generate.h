/* generate.h — text generation with a target model and, optionally, a draft
 * model, through FlashSpec's speculative engine (flashspec.h only).
 *
 * Every mode runs the same engine loop; they differ in the arms it may play:
 *   plain   one k = 0 arm (no drafting), FIXED policy: plain decoding;
 *   ngram   the built-in prompt-lookup drafter with k = draft_len, FIXED;
 *   draft   the draft model as a callback drafter with k = draft_len, FIXED;
 *   bandit  UCB1 over n-gram k ∈ {2, 4, 8}, draft model k ∈ {2, 4} (when a
 *           draft model is given) and k = 0;
 *   suffix  the built-in suffix drafter with k = draft_len, FIXED. The
 *           runner keeps that drafter from one generation to the next, so
 *           it also drafts from the earlier generations' outputs (until
 *           llama_runner_forget_outputs).
 * The target's forward callback runs one batched forward over the tokens the
 * engine hands it (the prompt, or the pending token plus the drafts) and
 * points the engine at the final-norm hidden rows; FlashSpec's fused LM head
 * over the tied token embedding verifies them (Algorithm 1: at T = 0 the
 * output is the target's greedy text, at T > 0 it is distributed as sampling
 * from the target alone). The rollback callback truncates the KV cache.
 *
 * The draft-model drafter keeps its own KV cache in step with the sequence
 * (it reuses the longest common prefix and forwards the rest), and drafts
 * greedily with flashspec_draft on the draft model's LM head, on a FlashSpec
 * context of its own (the engine's context is busy during a step). */
#ifndef FLASHSPEC_LLAMA_GENERATE_H
#define FLASHSPEC_LLAMA_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum llama_mode {
  LLAMA_MODE_PLAIN = 0,
  LLAMA_MODE_NGRAM,
  LLAMA_MODE_DRAFT,
  LLAMA_MODE_BANDIT,
  LLAMA_MODE_SUFFIX
} llama_mode;
#define LLAMA_NUM_MODES 5

/* "plain", "ngram", "draft", "bandit", "suffix"; NULL for other values. */
const char* llama_mode_name(llama_mode mode);

typedef struct llama_runner llama_runner;

/* Where the models, the KV caches and FlashSpec run. CUDA: the runner
 * uploads both models (model_cuda.h, f32 weights), keeps the caches on the
 * device, and runs FlashSpec's CUDA backend on one stream with the LM heads
 * borrowing the device token embeddings; the hidden rows never leave the
 * device. */
typedef enum llama_device { LLAMA_DEVICE_CPU = 0, LLAMA_DEVICE_CUDA = 1 } llama_device;

/* "cpu", "cuda"; NULL for other values. */
const char* llama_device_name(llama_device device);
/* 1 when this runtime was built with CUDA and FlashSpec's CUDA backend sees
 * a device (flashspec_cuda_device_count() > 0), else 0: what --device auto
 * asks. */
int llama_cuda_usable(void);

/* draft may be NULL (then the draft and the bandit's draft arms are
 * unavailable). Both models must share the vocabulary size. threads: CPU
 * threads of OpenBLAS and FlashSpec (≥ 1). draft_len: k of the FIXED ngram
 * and draft modes (1..64). device CUDA fails with a message when
 * llama_cuda_usable() is 0. */
int llama_runner_create(const llama_model* target, const llama_model* draft, llama_device device, int32_t threads,
                        int32_t draft_len, llama_runner** out, char* err, size_t err_size);
void llama_runner_free(llama_runner* runner); /* NULL is a no-op */

/* adaptive ≠ 0: every mode's arms draft the k of FLASHSPEC_DRAFT_LEN_ADAPTIVE
 * (at most the arm's k) from the next generation on; 0: the arm's k (the
 * default). NULL is a no-op. */
void llama_runner_set_adaptive_draft_len(llama_runner* runner, int adaptive);
/* The suffix mode's next generation starts with an empty cache of earlier
 * outputs. NULL is a no-op. */
void llama_runner_forget_outputs(llama_runner* runner);

#define LLAMA_MAX_POSITIONS 16
#define LLAMA_MAX_ARMS 8

typedef struct llama_arm_stats {
  int32_t drafter;   /* -1: k = 0 */
  const char* drafter_name;
  int32_t draft_len;
  uint64_t pulls;
  uint64_t draft_tokens;
  uint64_t accepted_tokens;
} llama_arm_stats;

typedef struct llama_generation_stats {
  int32_t num_tokens;
  int32_t steps;
  int finished_by_stop_token;
  double seconds;             /* wall time of the whole generation, prompt included */
  double prompt_seconds;      /* of which the prompt's forward (the first target call) */
  double tokens_per_second;   /* num_tokens / (seconds − prompt_seconds) */
  double tokens_per_step;
  double acceptance_rate;     /* accepted / drafted tokens */
  int32_t num_positions;      /* entries of drafted/accepted (≤ LLAMA_MAX_POSITIONS) */
  uint64_t drafted[LLAMA_MAX_POSITIONS];
  uint64_t accepted[LLAMA_MAX_POSITIONS];
  int32_t num_arms;
  llama_arm_stats arms[LLAMA_MAX_ARMS];
} llama_generation_stats;

/* Generate up to max_tokens tokens after prompt (prompt_len ≥ 1 ids, starting
 * with bos) at temperature (≥ 0; 0 = greedy) with seed, stopping after
 * stop_token (< 0: none). The tokens go to tokens_out (capacity ≥
 * max_tokens); stats gets the count and the numbers. */
int llama_runner_generate(llama_runner* runner, llama_mode mode, const int32_t* prompt, int32_t prompt_len,
                          int32_t max_tokens, float temperature, uint64_t seed, int32_t stop_token,
                          int32_t* tokens_out, llama_generation_stats* stats, char* err, size_t err_size);

#ifdef __cplusplus
}
#endif
#endif
