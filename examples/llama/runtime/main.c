/* flashspec-llama — generates text with a Llama target model and a draft
 * model through FlashSpec's speculative engine, and reports tokens/s,
 * steps, tokens per step and per-position acceptance per mode.
 *
 *   flashspec-llama [--models DIR] [--prompt FILE] [--max-tokens N]
 *                   [--temperature T] [--seed S] [--threads N]
 *                   [--draft-len K] [--draft-len-rule arm|adaptive]
 *                   [--mode plain|ngram|draft|bandit|suffix|all]
 *                   [--device cpu|cuda|auto]
 *
 * DIR holds tokenizer.model, target.gguf, draft.gguf and prompts/ (*.txt)
 * (default: FLASHSPEC_LLAMA_MODELS, set at build time to the source tree's
 * examples/llama/models). The default prompt is the first .txt file of
 * prompts/ in name order. Generation starts with bos, stops at eos or max-tokens.
 * Both models run on the device chosen (auto: CUDA when this runtime was
 * built with CUDA and FlashSpec's CUDA backend has a device, else the CPU). */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "generate.h"
#include "model.h"
#include "tokenizer.h"

#ifndef FLASHSPEC_LLAMA_MODELS
#define FLASHSPEC_LLAMA_MODELS "examples/llama/models"
#endif

#define MAX_PROMPT_BYTES (1 << 20)

static void usage(FILE* out) {
  fprintf(out,
          "usage: flashspec-llama [options]\n"
          "  --models DIR        tokenizer.model, target.gguf, draft.gguf, prompts/ (default %s)\n"
          "  --prompt FILE       prompt text (default: the first DIR/prompts/*.txt)\n"
          "  --max-tokens N      new tokens, 1..100000 (default 128)\n"
          "  --temperature T     0 = greedy (default 0)\n"
          "  --seed S            sampling seed (default 0)\n"
          "  --threads N         CPU threads, 1..1024 (default 2)\n"
          "  --draft-len K       draft length of the ngram, draft and suffix modes, 1..64 (default 4)\n"
          "  --draft-len-rule R  arm (each step drafts the arm's k) or adaptive (the k that\n"
          "                      maximises expected tokens per cost, at most the arm's; default arm)\n"
          "  --mode M            plain, ngram, draft, bandit, suffix or all (default all)\n"
          "  --device D          cpu, cuda or auto (default auto: cuda when built with CUDA and a device is present)\n",
          FLASHSPEC_LLAMA_MODELS);
}

static int parse_long(const char* option, const char* text, long min, long max, long* out) {
  char* end = NULL;
  errno = 0;
  const long value = strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || value < min || value > max) {
    fprintf(stderr, "flashspec-llama: %s: '%s' is not an integer in [%ld, %ld]\n", option, text, min, max);
    return -1;
  }
  *out = value;
  return 0;
}

/* The first *.txt of dir/prompts in name order, into a malloc'ed path. */
static char* first_prompt(const char* models) {
  char dir_path[4096];
  snprintf(dir_path, sizeof dir_path, "%s/prompts", models);
  DIR* dir = opendir(dir_path);
  if (dir == NULL) {
    fprintf(stderr, "flashspec-llama: no --prompt given and %s cannot be read: %s\n", dir_path, strerror(errno));
    return NULL;
  }
  char best[1024] = "";
  struct dirent* entry;
  while ((entry = readdir(dir)) != NULL) {
    const size_t len = strlen(entry->d_name);
    if (len > 4 && len < sizeof best && strcmp(entry->d_name + len - 4, ".txt") == 0 &&
        (best[0] == '\0' || strcmp(entry->d_name, best) < 0))
      snprintf(best, sizeof best, "%s", entry->d_name);
  }
  closedir(dir);
  if (best[0] == '\0') {
    fprintf(stderr, "flashspec-llama: no --prompt given and %s holds no .txt file\n", dir_path);
    return NULL;
  }
  const size_t size = strlen(dir_path) + 1 + strlen(best) + 1;
  char* path = (char*)malloc(size);
  if (path != NULL) snprintf(path, size, "%s/%s", dir_path, best);
  return path;
}

static char* read_text(const char* path, size_t* length) {
  FILE* file = fopen(path, "rb");
  if (file == NULL) {
    fprintf(stderr, "flashspec-llama: %s: cannot open: %s\n", path, strerror(errno));
    return NULL;
  }
  char* text = (char*)malloc(MAX_PROMPT_BYTES + 1);
  size_t got = text ? fread(text, 1, MAX_PROMPT_BYTES + 1, file) : 0;
  const int failed = text == NULL || ferror(file);
  fclose(file);
  if (failed || got > MAX_PROMPT_BYTES) {
    fprintf(stderr, "flashspec-llama: %s: %s\n", path, failed ? "cannot read" : "longer than 1 MiB");
    free(text);
    return NULL;
  }
  text[got] = '\0';
  *length = got;
  return text;
}

typedef struct options {
  const char* models;
  const char* prompt;
  long max_tokens;
  double temperature;
  unsigned long long seed;
  long threads;
  long draft_len;
  int modes[LLAMA_NUM_MODES];
  int num_modes;
  int adaptive_draft_len;
  int device; /* -1: auto, else a llama_device */
} options;

static int parse_options(int argc, char** argv, options* o) {
  *o = (options){FLASHSPEC_LLAMA_MODELS, NULL, 128, 0.0, 0, 2, 4, {0, 1, 2, 3, 4}, LLAMA_NUM_MODES, 0, -1};
  for (int i = 1; i < argc; ++i) {
    const char* arg = argv[i];
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
      usage(stdout);
      exit(0);
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "flashspec-llama: %s: %s\n", arg, strncmp(arg, "--", 2) == 0 ? "missing value" : "unknown argument");
      return -1;
    }
    const char* value = argv[++i];
    if (strcmp(arg, "--models") == 0) {
      o->models = value;
    } else if (strcmp(arg, "--prompt") == 0) {
      o->prompt = value;
    } else if (strcmp(arg, "--max-tokens") == 0) {
      if (parse_long(arg, value, 1, 100000, &o->max_tokens) != 0) return -1;
    } else if (strcmp(arg, "--threads") == 0) {
      if (parse_long(arg, value, 1, 1024, &o->threads) != 0) return -1;
    } else if (strcmp(arg, "--draft-len") == 0) {
      if (parse_long(arg, value, 1, 64, &o->draft_len) != 0) return -1;
    } else if (strcmp(arg, "--seed") == 0) {
      char* end = NULL;
      errno = 0;
      o->seed = strtoull(value, &end, 10);
      if (errno != 0 || end == value || *end != '\0' || value[0] == '-') {
        fprintf(stderr, "flashspec-llama: --seed: '%s' is not an unsigned 64-bit integer\n", value);
        return -1;
      }
    } else if (strcmp(arg, "--temperature") == 0) {
      char* end = NULL;
      o->temperature = strtod(value, &end);
      if (end == value || *end != '\0' || !isfinite(o->temperature) || o->temperature < 0 || o->temperature > 100) {
        fprintf(stderr, "flashspec-llama: --temperature: '%s' is not a number in [0, 100]\n", value);
        return -1;
      }
    } else if (strcmp(arg, "--device") == 0) {
      if (strcmp(value, "auto") == 0) o->device = -1;
      else if (strcmp(value, "cpu") == 0) o->device = LLAMA_DEVICE_CPU;
      else if (strcmp(value, "cuda") == 0) o->device = LLAMA_DEVICE_CUDA;
      else {
        fprintf(stderr, "flashspec-llama: --device: '%s' is not cpu, cuda or auto\n", value);
        return -1;
      }
    } else if (strcmp(arg, "--draft-len-rule") == 0) {
      if (strcmp(value, "arm") == 0 || strcmp(value, "adaptive") == 0) {
        o->adaptive_draft_len = strcmp(value, "adaptive") == 0;
      } else {
        fprintf(stderr, "flashspec-llama: --draft-len-rule: '%s' is not arm or adaptive\n", value);
        return -1;
      }
    } else if (strcmp(arg, "--mode") == 0) {
      o->num_modes = 0;
      if (strcmp(value, "all") == 0) {
        for (int m = 0; m < LLAMA_NUM_MODES; ++m) o->modes[o->num_modes++] = m;
      } else {
        for (int m = 0; m < LLAMA_NUM_MODES; ++m)
          if (strcmp(value, llama_mode_name((llama_mode)m)) == 0) o->modes[o->num_modes++] = m;
        if (o->num_modes == 0) {
          fprintf(stderr, "flashspec-llama: --mode: '%s' is not plain, ngram, draft, bandit, suffix or all\n", value);
          return -1;
        }
      }
    } else {
      fprintf(stderr, "flashspec-llama: unknown option %s\n", arg);
      usage(stderr);
      return -1;
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  options o;
  if (parse_options(argc, argv, &o) != 0) return 2;
  char err[1024];
  char path[4096];
  int status = 1;
  llama_tokenizer* tokenizer = NULL;
  llama_model* target = NULL;
  llama_model* draft = NULL;
  llama_runner* runner = NULL;
  char* prompt_path = NULL;
  char* text = NULL;
  int32_t* prompt = NULL;
  int32_t* tokens = NULL;

  snprintf(path, sizeof path, "%s/tokenizer.model", o.models);
  if (llama_tokenizer_load(path, &tokenizer, err, sizeof err) != 0) goto fail;
  snprintf(path, sizeof path, "%s/target.gguf", o.models);
  if (llama_model_load(path, &target, err, sizeof err) != 0) goto fail;
  snprintf(path, sizeof path, "%s/draft.gguf", o.models);
  if (llama_model_load(path, &draft, err, sizeof err) != 0) goto fail;
  const llama_hparams* hp = llama_model_hparams(target);
  if (llama_tokenizer_vocab_size(tokenizer) != hp->n_vocab) {
    snprintf(err, sizeof err, "the tokenizer has %d pieces but target.gguf a vocabulary of %d",
             llama_tokenizer_vocab_size(tokenizer), hp->n_vocab);
    goto fail;
  }
  const llama_device device =
      o.device >= 0 ? (llama_device)o.device : llama_cuda_usable() ? LLAMA_DEVICE_CUDA : LLAMA_DEVICE_CPU;
  if (llama_runner_create(target, draft, device, (int32_t)o.threads, (int32_t)o.draft_len, &runner, err,
                          sizeof err) != 0)
    goto fail;
  llama_runner_set_adaptive_draft_len(runner, o.adaptive_draft_len);

  if (o.prompt == NULL && (o.prompt = prompt_path = first_prompt(o.models)) == NULL) goto quiet_fail;
  size_t text_len = 0;
  if ((text = read_text(o.prompt, &text_len)) == NULL) goto quiet_fail;
  /* bos, then the text; keep the text's end when prompt + completion would
   * not fit in the context. */
  const int32_t bos = hp->bos_token >= 0 ? hp->bos_token : llama_tokenizer_bos(tokenizer);
  const int32_t eos = hp->eos_token >= 0 ? hp->eos_token : llama_tokenizer_eos(tokenizer);
  int32_t count = 0;
  llama_tokenizer_encode(tokenizer, text, text_len, NULL, 0, &count, NULL, 0);
  prompt = (int32_t*)malloc(sizeof(int32_t) * ((size_t)count + 1));
  tokens = (int32_t*)malloc(sizeof(int32_t) * (size_t)o.max_tokens);
  if (prompt == NULL || tokens == NULL) {
    snprintf(err, sizeof err, "out of memory");
    goto fail;
  }
  if (llama_tokenizer_encode(tokenizer, text, text_len, prompt + 1, count, &count, err, sizeof err) != 0) goto fail;
  if (o.max_tokens >= hp->n_ctx) {
    fprintf(stderr, "note: --max-tokens %ld is lowered to %d (context %d, bos first)\n", o.max_tokens, hp->n_ctx - 1,
            hp->n_ctx);
    o.max_tokens = hp->n_ctx - 1;
  }
  int32_t keep = count;
  if (keep + 1 + o.max_tokens > hp->n_ctx) keep = hp->n_ctx - 1 - (int32_t)o.max_tokens;
  if (keep < count) {
    fprintf(stderr, "note: the prompt has %d tokens; its last %d are used (context %d, max tokens %ld)\n", count,
            keep, hp->n_ctx, o.max_tokens);
    memmove(prompt + 1, prompt + 1 + (count - keep), sizeof(int32_t) * (size_t)keep);
  }
  prompt[0] = bos;
  const int32_t prompt_len = keep + 1;

  printf("prompt: %s (%d tokens), models: %s, device %s, temperature %g, seed %llu, threads %ld\n", o.prompt,
         prompt_len, o.models, llama_device_name(device), o.temperature, o.seed, o.threads);
  double plain_tokens_per_second = 0.0;
  /* An untimed one-token run first, so the first timed mode does not pay
   * for starting OpenBLAS's and FlashSpec's threads and touching the weights. */
  {
    llama_generation_stats warm_up;
    if (llama_runner_generate(runner, LLAMA_MODE_PLAIN, prompt, prompt_len, 1, 0.0f, 0, eos, tokens, &warm_up, err,
                              sizeof err) != 0)
      goto fail;
  }
  for (int m = 0; m < o.num_modes; ++m) {
    const llama_mode mode = (llama_mode)o.modes[m];
    llama_generation_stats stats;
    if (llama_runner_generate(runner, mode, prompt, prompt_len, (int32_t)o.max_tokens, (float)o.temperature, o.seed,
                              eos, tokens, &stats, err, sizeof err) != 0)
      goto fail;
    char* completion = NULL;
    if (llama_tokenizer_decode(tokenizer, tokens, stats.num_tokens, &completion, NULL, err, sizeof err) != 0) goto fail;
    printf("\n=== mode %s ===\n%s\n---\n", llama_mode_name(mode), completion);
    free(completion);
    printf("prompt forward %.3f s, then %d tokens in %.3f s: %.1f tokens/s; %d steps, %.2f tokens/step",
           stats.prompt_seconds, stats.num_tokens, stats.seconds - stats.prompt_seconds, stats.tokens_per_second,
           stats.steps, stats.tokens_per_step);
    if (mode == LLAMA_MODE_PLAIN) plain_tokens_per_second = stats.tokens_per_second;
    if (mode != LLAMA_MODE_PLAIN && plain_tokens_per_second > 0) printf("; speedup vs plain %.2fx", stats.tokens_per_second / plain_tokens_per_second);
    printf("%s\n", stats.finished_by_stop_token ? " (stopped at eos)" : "");
    if (stats.num_positions > 0) {
      printf("acceptance %.3f; per position:", stats.acceptance_rate);
      for (int32_t j = 0; j < stats.num_positions; ++j)
        printf(" %d:%.2f", j + 1, stats.drafted[j] ? (double)stats.accepted[j] / (double)stats.drafted[j] : 0.0);
      printf("\n");
    }
    if (mode == LLAMA_MODE_BANDIT)
      for (int32_t a = 0; a < stats.num_arms; ++a)
        printf("  arm %s k=%d: %llu steps, %llu/%llu drafts accepted\n", stats.arms[a].drafter_name,
               stats.arms[a].draft_len, (unsigned long long)stats.arms[a].pulls,
               (unsigned long long)stats.arms[a].accepted_tokens, (unsigned long long)stats.arms[a].draft_tokens);
  }
  if (o.num_modes > 1 && plain_tokens_per_second <= 0) printf("(no plain run: no speedup to report)\n");
  status = 0;
  goto done;
fail:
  fprintf(stderr, "flashspec-llama: %s\n", err);
quiet_fail:
  status = 1;
done:
  free(tokens);
  free(prompt);
  free(text);
  free(prompt_path);
  llama_runner_free(runner);
  llama_model_free(draft);
  llama_model_free(target);
  llama_tokenizer_free(tokenizer);
  return status;
}
