/* How many tokens top-p and min-p keep on a real model's next-token
 * distributions: the share of positions where top-p alone (no top-k) keeps
 * more than FLASHSPEC_MAX_TOP_K tokens, the rows the CUDA backend continues
 * in two more passes over W (flashspec.h, "Sampling controls").
 *
 * The model is examples/llama's trained target (vocabulary 16000, trained on
 * Python's standard library); the text is read teacher-forced, every
 * position's distribution p = softmax(l / T) taken from the model's logits
 * (the tied LM head, in double), kept sets computed as the header defines
 * them: top-p keeps the smallest prefix of the tokens ranked by p (ties by
 * id) whose mass reaches top_p; min-p keeps the tokens with p ≥ min_p ·
 * max p.
 *
 * Usage: flashspec_nucleus_rate [--models DIR] [--windows N] [FILE...]
 *   DIR: tokenizer.model and target.gguf (default: the source tree's
 *   examples/llama/models); FILEs: text read in windows of the model's
 *   context (default: the .txt files of DIR/prompts; the corpus's held-out files, listed
 *   in DIR/corpus_files.txt under /usr/lib/python3.11, are the text the
 *   model was not trained on); N: at most N windows of each file (default:
 *   all).
 */
#include <cblas.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashspec.h"
#include "model.h"
#include "tokenizer.h"

#ifndef FLASHSPEC_LLAMA_MODELS
#define FLASHSPEC_LLAMA_MODELS "examples/llama/models"
#endif

enum { kTemperatures = 3, kTopPs = 2, kMinPs = 2, kMaxFiles = 4096 };
static const double temperatures[kTemperatures] = {0.7, 0.8, 1.0};
static const double top_ps[kTopPs] = {0.9, 0.95};
static const double min_ps[kMinPs] = {0.02, 0.05};

typedef struct sizes {
  int32_t* v;
  size_t n, cap;
} sizes;

static int push(sizes* s, int32_t value) {
  if (s->n == s->cap) {
    const size_t cap = s->cap ? 2 * s->cap : 1024;
    int32_t* v = (int32_t*)realloc(s->v, cap * sizeof *v);
    if (v == NULL) return -1;
    s->v = v;
    s->cap = cap;
  }
  s->v[s->n++] = value;
  return 0;
}

static int by_value(const void* a, const void* b) {
  const int32_t x = *(const int32_t*)a, y = *(const int32_t*)b;
  return (x > y) - (x < y);
}

typedef struct ranked {
  double p;
  int32_t id;
} ranked;

static int by_probability(const void* a, const void* b) {
  const ranked* x = (const ranked*)a;
  const ranked* y = (const ranked*)b;
  if (x->p != y->p) return x->p > y->p ? -1 : 1;
  return (x->id > y->id) - (x->id < y->id);
}

static void report(const char* what, sizes* s) {
  if (s->n == 0) return;
  qsort(s->v, s->n, sizeof *s->v, by_value);
  size_t beyond = 0;
  for (size_t i = 0; i < s->n; ++i) beyond += s->v[i] > FLASHSPEC_MAX_TOP_K;
  printf("%-22s positions %6zu | beyond %d: %6.2f %% | median %5d  p90 %5d  p99 %5d  max %5d\n", what, s->n,
         FLASHSPEC_MAX_TOP_K, 100.0 * (double)beyond / (double)s->n, s->v[s->n / 2], s->v[s->n * 9 / 10],
         s->v[s->n * 99 / 100], s->v[s->n - 1]);
}

static char* read_file(const char* path, size_t* length) {
  FILE* f = fopen(path, "rb");
  if (f == NULL) {
    fprintf(stderr, "flashspec_nucleus_rate: %s: %s\n", path, strerror(errno));
    return NULL;
  }
  size_t cap = 1 << 16, n = 0;
  char* text = (char*)malloc(cap + 1);
  while (text != NULL) {
    n += fread(text + n, 1, cap - n, f);
    if (n < cap) break;
    cap *= 2;
    char* grown = (char*)realloc(text, cap + 1);
    if (grown == NULL) free(text);
    text = grown;
  }
  const int failed = text == NULL || ferror(f);
  fclose(f);
  if (failed) {
    fprintf(stderr, "flashspec_nucleus_rate: %s: cannot read\n", path);
    free(text);
    return NULL;
  }
  text[n] = '\0';
  *length = n;
  return text;
}

static int by_name(const void* a, const void* b) { return strcmp(*(char* const*)a, *(char* const*)b); }

/* The .txt files of DIR/prompts, in name order. */
static int prompt_files(const char* models, char** files, int* count) {
  char dir_path[4096];
  snprintf(dir_path, sizeof dir_path, "%s/prompts", models);
  DIR* dir = opendir(dir_path);
  if (dir == NULL) {
    fprintf(stderr, "flashspec_nucleus_rate: %s: %s\n", dir_path, strerror(errno));
    return -1;
  }
  struct dirent* entry;
  while ((entry = readdir(dir)) != NULL && *count < kMaxFiles) {
    const size_t len = strlen(entry->d_name);
    if (len <= 4 || strcmp(entry->d_name + len - 4, ".txt") != 0) continue;
    const size_t size = strlen(dir_path) + len + 2;
    files[*count] = (char*)malloc(size);
    if (files[*count] == NULL) break;
    snprintf(files[*count], size, "%s/%s", dir_path, entry->d_name);
    ++*count;
  }
  closedir(dir);
  qsort(files, (size_t)*count, sizeof *files, by_name);
  return 0;
}

int main(int argc, char** argv) {
  const char* models = FLASHSPEC_LLAMA_MODELS;
  char* files[kMaxFiles];
  int num_files = 0, owned = 0;
  long max_windows = -1;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--models") == 0 && i + 1 < argc) {
      models = argv[++i];
    } else if (strcmp(argv[i], "--windows") == 0 && i + 1 < argc) {
      char* end = NULL;
      max_windows = strtol(argv[++i], &end, 10);
      if (end == argv[i] || *end != '\0' || max_windows < 1) {
        fprintf(stderr, "flashspec_nucleus_rate: --windows: a positive integer\n");
        return 2;
      }
    } else if (strcmp(argv[i], "--help") == 0 || strncmp(argv[i], "--", 2) == 0) {
      fprintf(strcmp(argv[i], "--help") == 0 ? stdout : stderr, "usage: %s [--models DIR] [--windows N] [FILE...]\n",
              argv[0]);
      return strcmp(argv[i], "--help") == 0 ? 0 : 2;
    } else if (num_files < kMaxFiles) {
      files[num_files++] = argv[i];
    }
  }
  if (num_files == 0) {
    if (prompt_files(models, files, &num_files) != 0) return 1;
    owned = 1;
  }

  char err[512], path[4096];
  llama_tokenizer* tokenizer = NULL;
  llama_model* model = NULL;
  snprintf(path, sizeof path, "%s/tokenizer.model", models);
  if (llama_tokenizer_load(path, &tokenizer, err, sizeof err) != 0) {
    fprintf(stderr, "flashspec_nucleus_rate: %s\n", err);
    return 1;
  }
  snprintf(path, sizeof path, "%s/target.gguf", models);
  if (llama_model_load(path, &model, err, sizeof err) != 0) {
    fprintf(stderr, "flashspec_nucleus_rate: %s\n", err);
    llama_tokenizer_free(tokenizer);
    return 1;
  }
  const llama_hparams* hp = llama_model_hparams(model);
  const int32_t vocab = hp->n_vocab, d = hp->n_embd, window = hp->n_ctx;
  const float* head = llama_model_token_embedding(model);
  float* logits = (float*)malloc((size_t)window * (size_t)vocab * sizeof(float));
  ranked* order = (ranked*)malloc((size_t)vocab * sizeof(ranked));
  sizes top_p_sizes[kTemperatures][kTopPs] = {{{0}}}, min_p_sizes[kTemperatures][kMinPs] = {{{0}}};
  int status = logits && order ? 0 : 1;

  for (int f = 0; f < num_files && status == 0; ++f) {
    size_t length = 0;
    char* text = read_file(files[f], &length);
    if (text == NULL) {
      status = 1;
      break;
    }
    int32_t count = 0;
    int32_t* ids = (int32_t*)malloc((length + 2) * sizeof(int32_t));
    if (ids == NULL || llama_tokenizer_encode(tokenizer, text, length, ids + 1, (int32_t)length + 1, &count, err,
                                              sizeof err) != 0) {
      fprintf(stderr, "flashspec_nucleus_rate: %s: %s\n", files[f], ids ? err : "out of memory");
      free(ids);
      free(text);
      status = 1;
      break;
    }
    ids[0] = llama_tokenizer_bos(tokenizer);
    const int32_t total = count + 1;
    /* Windows of the model's context, each starting with bos. */
    long windows = 0;
    for (int32_t start = 1; start < total && status == 0 && windows != max_windows; start += window - 1, ++windows) {
      const int32_t n = total - start < window - 1 ? total - start : window - 1;
      int32_t* tokens = (int32_t*)malloc((size_t)(n + 1) * sizeof(int32_t));
      llama_session* session = NULL;
      const float* hidden = NULL;
      if (tokens == NULL || llama_session_create(model, n + 1, &session, err, sizeof err) != 0) {
        fprintf(stderr, "flashspec_nucleus_rate: %s\n", tokens ? err : "out of memory");
        free(tokens);
        status = 1;
        break;
      }
      tokens[0] = ids[0];
      memcpy(tokens + 1, ids + start, (size_t)n * sizeof(int32_t));
      if (llama_session_forward(session, tokens, n + 1, &hidden, err, sizeof err) != 0) {
        fprintf(stderr, "flashspec_nucleus_rate: %s\n", err);
        status = 1;
      } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n + 1, vocab, d, 1.0f, hidden, d, head, d, 0.0f,
                    logits, vocab);
        for (int32_t row = 0; row <= n; ++row) {
          const float* l = logits + (size_t)row * (size_t)vocab;
          for (int t = 0; t < kTemperatures; ++t) {
            double top = -INFINITY, sum = 0.0;
            for (int32_t i = 0; i < vocab; ++i) top = fmax(top, (double)l[i] / temperatures[t]);
            for (int32_t i = 0; i < vocab; ++i) {
              order[i].p = exp((double)l[i] / temperatures[t] - top);
              order[i].id = i;
              sum += order[i].p;
            }
            // Only tokens with p ≥ 1e-7 are ranked when they hold more than
            // the largest top-p (the rest cannot be reached first); else all.
            int32_t listed = 0;
            double listed_mass = 0.0;
            for (int32_t i = 0; i < vocab; ++i) {
              const double p = order[i].p / sum;
              if (p >= 1e-7) {
                order[listed].p = p;
                order[listed].id = order[i].id;
                listed_mass += p;
                ++listed;
              }
            }
            if (listed_mass < top_ps[kTopPs - 1]) {
              for (int32_t i = 0; i < vocab; ++i) {
                order[i].p = exp((double)l[i] / temperatures[t] - top) / sum;
                order[i].id = i;
              }
              listed = vocab;
            }
            qsort(order, (size_t)listed, sizeof *order, by_probability);
            for (int k = 0; k < kTopPs; ++k) {
              double mass = 0.0;
              int32_t kept = vocab;
              for (int32_t i = 0; i < listed; ++i) {
                mass += order[i].p;
                if (mass >= top_ps[k]) {
                  kept = i + 1;
                  break;
                }
              }
              if (push(&top_p_sizes[t][k], kept) != 0) status = 1;
            }
            for (int k = 0; k < kMinPs; ++k) {
              int32_t kept = 0;
              while (kept < listed && order[kept].p >= min_ps[k] * order[0].p) ++kept;
              if (push(&min_p_sizes[t][k], kept) != 0) status = 1;
            }
          }
        }
      }
      llama_session_free(session);
      free(tokens);
    }
    free(ids);
    free(text);
  }

  if (status == 0) {
    printf("model %s/target.gguf: vocabulary %d, d %d; %d file(s)\n", models, vocab, d, num_files);
    char what[64];
    for (int t = 0; t < kTemperatures; ++t) {
      for (int k = 0; k < kTopPs; ++k) {
        snprintf(what, sizeof what, "T %.1f top-p %.2f", temperatures[t], top_ps[k]);
        report(what, &top_p_sizes[t][k]);
      }
      for (int k = 0; k < kMinPs; ++k) {
        snprintf(what, sizeof what, "T %.1f min-p %.2f", temperatures[t], min_ps[k]);
        report(what, &min_p_sizes[t][k]);
      }
    }
  }
  for (int t = 0; t < kTemperatures; ++t) {
    for (int k = 0; k < kTopPs; ++k) free(top_p_sizes[t][k].v);
    for (int k = 0; k < kMinPs; ++k) free(min_p_sizes[t][k].v);
  }
  if (owned)
    for (int f = 0; f < num_files; ++f) free(files[f]);
  free(order);
  free(logits);
  llama_model_free(model);
  llama_tokenizer_free(tokenizer);
  return status;
}
