/* drafter_bench — the suffix drafter against the n-gram drafter, and the
 * adaptive draft length against fixed k, on the trained Llama pair and the
 * shipped prompts (examples/llama/models), with the real target model at
 * T = 0 on the CPU.
 *
 *   flashspec_drafter_bench [--models DIR] [--max-tokens N] [--threads N]
 *
 * For each configuration (drafter × draft length rule) it generates
 * max_tokens tokens (default 128) after every prompt, in the order of the
 * files' names, and prints a Markdown table: tokens per step (steps are
 * target forwards, so this is the speed-up over plain decoding when a
 * forward costs the same for 1 and k + 1 rows), acceptance and tokens/s.
 * Tokens per step are deterministic at T = 0; tokens/s is this machine's.
 * Every configuration must emit plain greedy decoding's tokens: the program
 * fails (exit 1) otherwise.
 *
 * The suffix drafter runs twice: "cold" forgets earlier outputs before each
 * prompt (it drafts from the prompt and its own output only, like the
 * n-gram drafter), "warm" keeps them, so prompt i also drafts from the
 * outputs of prompts 0 .. i − 1 (never its own earlier run). */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "generate.h"
#include "model.h"
#include "tokenizer.h"

#ifndef FLASHSPEC_LLAMA_MODELS
#define FLASHSPEC_LLAMA_MODELS "examples/llama/models"
#endif

#define MAX_PROMPTS 16

typedef struct config {
  const char* name;
  llama_mode mode;
  int32_t draft_len;
  int adaptive;
  int warm; /* suffix: keep earlier prompts' outputs */
} config;

static const config kConfigs[] = {
    {"plain", LLAMA_MODE_PLAIN, 1, 0, 0},
    {"ngram k=2", LLAMA_MODE_NGRAM, 2, 0, 0},
    {"ngram k=4", LLAMA_MODE_NGRAM, 4, 0, 0},
    {"ngram k=8", LLAMA_MODE_NGRAM, 8, 0, 0},
    {"ngram adaptive k<=8", LLAMA_MODE_NGRAM, 8, 1, 0},
    {"suffix cold k=2", LLAMA_MODE_SUFFIX, 2, 0, 0},
    {"suffix cold k=4", LLAMA_MODE_SUFFIX, 4, 0, 0},
    {"suffix cold k=8", LLAMA_MODE_SUFFIX, 8, 0, 0},
    {"suffix cold adaptive k<=8", LLAMA_MODE_SUFFIX, 8, 1, 0},
    {"suffix warm k=8", LLAMA_MODE_SUFFIX, 8, 0, 1},
    {"suffix warm adaptive k<=8", LLAMA_MODE_SUFFIX, 8, 1, 1},
};
#define NUM_CONFIGS (sizeof kConfigs / sizeof kConfigs[0])

static int by_name(const void* a, const void* b) { return strcmp(*(char* const*)a, *(char* const*)b); }

static char* read_text(const char* path, size_t* length) {
  FILE* f = fopen(path, "rb");
  if (f == NULL) return NULL;
  char* text = NULL;
  size_t size = 0, cap = 0;
  for (;;) {
    if (size + 4096 + 1 > cap) {
      cap = (size + 4096 + 1) * 2;
      char* grown = (char*)realloc(text, cap);
      if (grown == NULL) break;
      text = grown;
    }
    const size_t got = fread(text + size, 1, 4096, f);
    size += got;
    if (got < 4096) break;
  }
  fclose(f);
  if (text) text[size] = '\0';
  *length = size;
  return text;
}

int main(int argc, char** argv) {
  const char* models = FLASHSPEC_LLAMA_MODELS;
  long max_tokens = 128, threads = 2;
  for (int i = 1; i < argc; ++i) {
    if (i + 1 >= argc) {
      fprintf(stderr, "usage: %s [--models DIR] [--max-tokens N] [--threads N]\n", argv[0]);
      return 2;
    }
    if (strcmp(argv[i], "--models") == 0) models = argv[++i];
    else if (strcmp(argv[i], "--max-tokens") == 0) max_tokens = strtol(argv[++i], NULL, 10);
    else if (strcmp(argv[i], "--threads") == 0) threads = strtol(argv[++i], NULL, 10);
    else {
      fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (max_tokens < 1 || max_tokens > 4096 || threads < 1 || threads > 1024) {
    fprintf(stderr, "--max-tokens must be in [1, 4096] and --threads in [1, 1024]\n");
    return 2;
  }
  char err[8192] = "";
  char path[4096];
  int status = 1;
  llama_tokenizer* tokenizer = NULL;
  llama_model* target = NULL;
  char* names[MAX_PROMPTS];
  int32_t* prompts[MAX_PROMPTS] = {0};
  int32_t prompt_lens[MAX_PROMPTS];
  int32_t* plain[MAX_PROMPTS] = {0};
  int32_t plain_lens[MAX_PROMPTS];
  int num_prompts = 0;
  int32_t* tokens = (int32_t*)malloc(sizeof(int32_t) * (size_t)max_tokens);

  snprintf(path, sizeof path, "%s/tokenizer.model", models);
  if (llama_tokenizer_load(path, &tokenizer, err, sizeof err) != 0) goto fail;
  snprintf(path, sizeof path, "%s/target.gguf", models);
  if (llama_model_load(path, &target, err, sizeof err) != 0) goto fail;
  const llama_hparams* hp = llama_model_hparams(target);
  const int32_t eos = hp->eos_token >= 0 ? hp->eos_token : llama_tokenizer_eos(tokenizer);
  const int32_t bos = hp->bos_token >= 0 ? hp->bos_token : llama_tokenizer_bos(tokenizer);

  snprintf(path, sizeof path, "%s/prompts", models);
  DIR* dir = opendir(path);
  if (dir == NULL) {
    snprintf(err, sizeof err, "%s: %s", path, strerror(errno));
    goto fail;
  }
  for (struct dirent* e; (e = readdir(dir)) != NULL && num_prompts < MAX_PROMPTS;) {
    const size_t n = strlen(e->d_name);
    if (n > 4 && strcmp(e->d_name + n - 4, ".txt") == 0) names[num_prompts++] = strdup(e->d_name);
  }
  closedir(dir);
  qsort(names, (size_t)num_prompts, sizeof names[0], by_name);
  for (int p = 0; p < num_prompts; ++p) {
    snprintf(path, sizeof path, "%s/prompts/%s", models, names[p]);
    size_t length = 0;
    char* text = read_text(path, &length);
    if (text == NULL) {
      snprintf(err, sizeof err, "%s cannot be read", path);
      goto fail;
    }
    int32_t count = 0;
    llama_tokenizer_encode(tokenizer, text, length, NULL, 0, &count, NULL, 0);
    prompts[p] = (int32_t*)malloc(sizeof(int32_t) * ((size_t)count + 1));
    const int rc = llama_tokenizer_encode(tokenizer, text, length, prompts[p] + 1, count, &count, err, sizeof err);
    free(text);
    if (rc != 0) goto fail;
    /* Keep the text's end when prompt + completion would not fit. */
    int32_t keep = count;
    if (keep + 1 + max_tokens > hp->n_ctx) keep = hp->n_ctx - 1 - (int32_t)max_tokens;
    memmove(prompts[p] + 1, prompts[p] + 1 + (count - keep), sizeof(int32_t) * (size_t)keep);
    prompts[p][0] = bos;
    prompt_lens[p] = keep + 1;
  }

  printf("flashspec_drafter_bench: %d prompts, %ld new tokens each, T = 0, %ld threads, CPU\n\n", num_prompts,
         max_tokens, threads);
  printf("| configuration | prompt | tokens/step | steps | acceptance | tok/s |\n|---|---|---|---|---|---|\n");
  for (size_t c = 0; c < NUM_CONFIGS; ++c) {
    const config* cfg = &kConfigs[c];
    llama_runner* runner = NULL;
    if (llama_runner_create(target, NULL, LLAMA_DEVICE_CPU, (int32_t)threads, cfg->draft_len, &runner, err,
                            sizeof err) != 0)
      goto fail;
    llama_runner_set_adaptive_draft_len(runner, cfg->adaptive);
    /* An untimed token first: threads started, weights touched. */
    llama_generation_stats stats;
    if (llama_runner_generate(runner, LLAMA_MODE_PLAIN, prompts[0], prompt_lens[0], 1, 0.0f, 0, eos, tokens, &stats,
                              err, sizeof err) != 0) {
      llama_runner_free(runner);
      goto fail;
    }
    int32_t total_tokens = 0, total_steps = 0;
    double total_seconds = 0.0;
    uint64_t drafted = 0, accepted = 0;
    for (int p = 0; p < num_prompts; ++p) {
      if (!cfg->warm) llama_runner_forget_outputs(runner);
      if (llama_runner_generate(runner, cfg->mode, prompts[p], prompt_lens[p], (int32_t)max_tokens, 0.0f, 0, eos,
                                tokens, &stats, err, sizeof err) != 0) {
        llama_runner_free(runner);
        goto fail;
      }
      if (c == 0) {
        plain[p] = (int32_t*)malloc(sizeof(int32_t) * (size_t)stats.num_tokens);
        memcpy(plain[p], tokens, sizeof(int32_t) * (size_t)stats.num_tokens);
        plain_lens[p] = stats.num_tokens;
      } else if (stats.num_tokens != plain_lens[p] ||
                 memcmp(tokens, plain[p], sizeof(int32_t) * (size_t)stats.num_tokens) != 0) {
        snprintf(err, sizeof err, "%s on %s emitted other tokens than plain greedy decoding", cfg->name, names[p]);
        llama_runner_free(runner);
        goto fail;
      }
      uint64_t d = 0, a = 0;
      for (int32_t j = 0; j < stats.num_positions; ++j) {
        d += stats.drafted[j];
        a += stats.accepted[j];
      }
      printf("| %s | %s | %.2f | %d | %.2f | %.0f |\n", cfg->name, names[p], stats.tokens_per_step, stats.steps,
             d ? (double)a / (double)d : 0.0, stats.tokens_per_second);
      total_tokens += stats.num_tokens;
      total_steps += stats.steps;
      total_seconds += stats.num_tokens / (stats.tokens_per_second > 0 ? stats.tokens_per_second : 1e300);
      drafted += d;
      accepted += a;
    }
    printf("| **%s** | **all** | **%.2f** | %d | %.2f | %.0f |\n", cfg->name,
           total_steps ? (double)total_tokens / total_steps : 0.0, total_steps,
           drafted ? (double)accepted / (double)drafted : 0.0, total_seconds > 0 ? total_tokens / total_seconds : 0.0);
    fflush(stdout);
    llama_runner_free(runner);
  }
  status = 0;
  goto done;
fail:
  fprintf(stderr, "flashspec_drafter_bench: %s\n", err);
done:
  for (int p = 0; p < num_prompts; ++p) {
    free(names[p]);
    free(prompts[p]);
    free(plain[p]);
  }
  free(tokens);
  llama_model_free(target);
  llama_tokenizer_free(tokenizer);
  return status;
}
