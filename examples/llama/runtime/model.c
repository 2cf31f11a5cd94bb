/* model.c — see model.h. */
#include "model.h"
#include "error.h"

#include <cblas.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"


typedef struct llama_layer {
  float* attn_norm; /* [d] */
  float* wq;        /* [n_head * head_dim, d] */
  float* wk;        /* [n_head_kv * head_dim, d] */
  float* wv;        /* [n_head_kv * head_dim, d] */
  float* wo;        /* [d, n_head * head_dim] */
  float* ffn_norm;  /* [d] */
  float* w_gate;    /* [ff, d] */
  float* w_up;      /* [ff, d] */
  float* w_down;    /* [d, ff] */
} llama_layer;

struct llama_model {
  llama_hparams hp;
  float* token_embd;  /* [vocab, d] */
  float* output_norm; /* [d] */
  llama_layer* layers;
  float* rope_inv_freq; /* [head_dim / 2]: base^(-2i / head_dim) */
};

struct llama_session {
  const llama_model* model;
  int32_t capacity;
  int32_t length;
  int32_t* tokens;  /* [capacity] */
  float* k_cache;   /* [layer][capacity][kv_dim] */
  float* v_cache;
  /* Scratch for up to `capacity` rows. */
  float* x;       /* [rows, d] residual stream */
  float* xn;      /* [rows, d] normed */
  float* q;       /* [rows, n_head * head_dim] */
  float* k;       /* [rows, kv_dim] */
  float* v;
  float* attn;    /* [rows, n_head * head_dim] */
  float* gate;    /* [rows, ff] */
  float* up;      /* [rows, ff] */
  float* scores;  /* [capacity] */
  float* out;     /* [rows, d] final-norm hidden rows */
};

/* Reads an integer hyperparameter in [min, max]. */
static int read_hparam(const gguf_file* file, const char* path, const char* key, int64_t min, int64_t max,
                       int32_t* out, char* err, size_t err_size) {
  uint64_t value;
  char detail[256];
  if (gguf_get_uint(file, key, &value, detail, sizeof detail) != 0) {
    llama_set_error(err, err_size, "%s: %s", path, detail);
    return -1;
  }
  if (value < (uint64_t)min || value > (uint64_t)max) {
    llama_set_error(err, err_size, "%s: metadata '%s' = %llu is outside [%lld, %lld]", path, key, (unsigned long long)value,
              (long long)min, (long long)max);
    return -1;
  }
  *out = (int32_t)value;
  return 0;
}

/* Finds tensor `name`, checks its shape (GGUF order: ne0 = the contiguous
 * dimension) and converts it to a new f32 array. */
static float* load_tensor(const gguf_file* file, const char* path, const char* name, uint64_t ne0, uint64_t ne1,
                          char* err, size_t err_size) {
  const gguf_tensor_info* t = gguf_find_tensor(file, name);
  if (t == NULL) {
    llama_set_error(err, err_size, "%s: tensor '%s' is missing", path, name);
    return NULL;
  }
  const uint32_t want_dims = ne1 == 1 ? 1 : 2;
  if (t->n_dims != want_dims || t->dims[0] != ne0 || t->dims[1] != ne1) {
    llama_set_error(err, err_size, "%s: tensor '%s' has shape [%llu, %llu, %llu, %llu] (%u dims), expected [%llu, %llu]",
              path, name, (unsigned long long)t->dims[0], (unsigned long long)t->dims[1],
              (unsigned long long)t->dims[2], (unsigned long long)t->dims[3], t->n_dims, (unsigned long long)ne0,
              (unsigned long long)ne1);
    return NULL;
  }
  if (t->type != GGUF_TENSOR_F32 && t->type != GGUF_TENSOR_F16) {
    llama_set_error(err, err_size, "%s: tensor '%s' has ggml type %u; only F32 (0) and F16 (1) are supported", path, name,
              t->type);
    return NULL;
  }
  float* data = (float*)malloc((size_t)(ne0 * ne1) * sizeof(float));
  if (data == NULL) {
    llama_set_error(err, err_size, "%s: out of memory for tensor '%s'", path, name);
    return NULL;
  }
  char detail[256];
  if (gguf_tensor_to_f32(file, t, data, ne0 * ne1, detail, sizeof detail) != 0) {
    llama_set_error(err, err_size, "%s: %s", path, detail);
    free(data);
    return NULL;
  }
  return data;
}

void llama_model_free(llama_model* model) {
  if (model == NULL) return;
  if (model->layers != NULL) {
    for (int32_t l = 0; l < model->hp.n_layer; ++l) {
      llama_layer* y = &model->layers[l];
      free(y->attn_norm); free(y->wq); free(y->wk); free(y->wv); free(y->wo);
      free(y->ffn_norm); free(y->w_gate); free(y->w_up); free(y->w_down);
    }
  }
  free(model->layers);
  free(model->token_embd);
  free(model->output_norm);
  free(model->rope_inv_freq);
  free(model);
}

static int load_hparams(const gguf_file* file, const char* path, llama_hparams* hp, char* err, size_t err_size) {
  char arch[64];
  char detail[256];
  if (gguf_get_string(file, "general.architecture", arch, sizeof arch, detail, sizeof detail) != 0) {
    llama_set_error(err, err_size, "%s: %s", path, detail);
    return -1;
  }
  if (strcmp(arch, "llama") != 0) {
    llama_set_error(err, err_size, "%s: general.architecture is '%s', not 'llama'", path, arch);
    return -1;
  }
  if (read_hparam(file, path, "llama.embedding_length", 2, 65536, &hp->n_embd, err, err_size) != 0 ||
      read_hparam(file, path, "llama.block_count", 1, 1024, &hp->n_layer, err, err_size) != 0 ||
      read_hparam(file, path, "llama.attention.head_count", 1, 65536, &hp->n_head, err, err_size) != 0 ||
      read_hparam(file, path, "llama.attention.head_count_kv", 1, 65536, &hp->n_head_kv, err, err_size) != 0 ||
      read_hparam(file, path, "llama.feed_forward_length", 1, 1 << 20, &hp->n_ff, err, err_size) != 0 ||
      read_hparam(file, path, "llama.context_length", 1, 1 << 20, &hp->n_ctx, err, err_size) != 0)
    return -1;
  if (hp->n_embd % hp->n_head != 0 || (hp->n_embd / hp->n_head) % 2 != 0) {
    llama_set_error(err, err_size, "%s: embedding_length %d is not n_head (%d) times an even head_dim", path, hp->n_embd,
              hp->n_head);
    return -1;
  }
  if (hp->n_head % hp->n_head_kv != 0) {
    llama_set_error(err, err_size, "%s: head_count %d is not a multiple of head_count_kv %d", path, hp->n_head,
              hp->n_head_kv);
    return -1;
  }
  hp->head_dim = hp->n_embd / hp->n_head;
  /* The vocabulary: llama.vocab_size when present (it must then match the
   * embedding), else the embedding's row count. */
  const gguf_tensor_info* embd = gguf_find_tensor(file, "token_embd.weight");
  if (embd == NULL) {
    llama_set_error(err, err_size, "%s: tensor 'token_embd.weight' is missing", path);
    return -1;
  }
  if (gguf_find_kv(file, "llama.vocab_size") != NULL) {
    if (read_hparam(file, path, "llama.vocab_size", 1, 1 << 24, &hp->n_vocab, err, err_size) != 0) return -1;
  } else if (embd->n_dims == 2 && embd->dims[1] <= (1u << 24)) {
    hp->n_vocab = (int32_t)embd->dims[1];
  } else {
    llama_set_error(err, err_size, "%s: llama.vocab_size is missing and token_embd.weight is not [d, vocab]", path);
    return -1;
  }
  double value;
  hp->rope_base = 10000.0f;
  if (gguf_find_kv(file, "llama.rope.freq_base") != NULL) {
    if (gguf_get_float(file, "llama.rope.freq_base", &value, detail, sizeof detail) != 0 || !(value > 1.0) ||
        !isfinite(value)) {
      llama_set_error(err, err_size, "%s: llama.rope.freq_base must be a finite float > 1", path);
      return -1;
    }
    hp->rope_base = (float)value;
  }
  hp->norm_eps = 1e-5f;
  if (gguf_find_kv(file, "llama.attention.layer_norm_rms_epsilon") != NULL) {
    if (gguf_get_float(file, "llama.attention.layer_norm_rms_epsilon", &value, detail, sizeof detail) != 0 ||
        !(value > 0.0) || !(value < 1.0)) {
      llama_set_error(err, err_size, "%s: llama.attention.layer_norm_rms_epsilon must be a float in (0, 1)", path);
      return -1;
    }
    hp->norm_eps = (float)value;
  }
  hp->bos_token = hp->eos_token = -1;
  int32_t token;
  if (gguf_find_kv(file, "tokenizer.ggml.bos_token_id") != NULL) {
    if (read_hparam(file, path, "tokenizer.ggml.bos_token_id", 0, hp->n_vocab - 1, &token, err, err_size) != 0)
      return -1;
    hp->bos_token = token;
  }
  if (gguf_find_kv(file, "tokenizer.ggml.eos_token_id") != NULL) {
    if (read_hparam(file, path, "tokenizer.ggml.eos_token_id", 0, hp->n_vocab - 1, &token, err, err_size) != 0)
      return -1;
    hp->eos_token = token;
  }
  return 0;
}

int llama_model_load(const char* path, llama_model** out, char* err, size_t err_size) {
  if (path == NULL || out == NULL) {
    llama_set_error(err, err_size, "llama_model_load: %s is NULL", path == NULL ? "path" : "out");
    return -1;
  }
  gguf_file* file = NULL;
  if (gguf_open(path, &file, err, err_size) != 0) return -1;
  const int status = llama_model_load_gguf(file, path, out, err, err_size);
  gguf_close(file);
  return status;
}

int llama_model_load_gguf(const gguf_file* file, const char* path, llama_model** out, char* err, size_t err_size) {
  if (file == NULL || path == NULL || out == NULL) {
    llama_set_error(err, err_size, "llama_model_load_gguf: %s is NULL", file == NULL ? "file" : path == NULL ? "name" : "out");
    return -1;
  }
  llama_model* m = (llama_model*)calloc(1, sizeof(llama_model));
  if (m == NULL) {
    llama_set_error(err, err_size, "%s: out of memory", path);
    return -1;
  }
  if (load_hparams(file, path, &m->hp, err, err_size) != 0) goto fail;
  const llama_hparams* hp = &m->hp;
  const uint64_t d = (uint64_t)hp->n_embd, q_dim = (uint64_t)hp->n_head * hp->head_dim,
                 kv_dim = (uint64_t)hp->n_head_kv * hp->head_dim, ff = (uint64_t)hp->n_ff;
  if ((m->token_embd = load_tensor(file, path, "token_embd.weight", d, (uint64_t)hp->n_vocab, err, err_size)) == NULL ||
      (m->output_norm = load_tensor(file, path, "output_norm.weight", d, 1, err, err_size)) == NULL)
    goto fail;
  if (gguf_find_tensor(file, "output.weight") != NULL) {
    llama_set_error(err, err_size, "%s: has 'output.weight'; this runtime needs a tied LM head (token_embd.weight)", path);
    goto fail;
  }
  m->layers = (llama_layer*)calloc((size_t)hp->n_layer, sizeof(llama_layer));
  if (m->layers == NULL) {
    llama_set_error(err, err_size, "%s: out of memory", path);
    goto fail;
  }
  for (int32_t l = 0; l < hp->n_layer; ++l) {
    llama_layer* y = &m->layers[l];
    char name[64];
#define LOAD(field, suffix, ne0, ne1)                                               \
  snprintf(name, sizeof name, "blk.%d." suffix, (int)l);                           \
  if ((y->field = load_tensor(file, path, name, (ne0), (ne1), err, err_size)) == NULL) goto fail;
    LOAD(attn_norm, "attn_norm.weight", d, 1)
    LOAD(wq, "attn_q.weight", d, q_dim)
    LOAD(wk, "attn_k.weight", d, kv_dim)
    LOAD(wv, "attn_v.weight", d, kv_dim)
    LOAD(wo, "attn_output.weight", q_dim, d)
    LOAD(ffn_norm, "ffn_norm.weight", d, 1)
    LOAD(w_gate, "ffn_gate.weight", d, ff)
    LOAD(w_up, "ffn_up.weight", d, ff)
    LOAD(w_down, "ffn_down.weight", ff, d)
#undef LOAD
  }
  m->rope_inv_freq = (float*)malloc(sizeof(float) * (size_t)(hp->head_dim / 2));
  if (m->rope_inv_freq == NULL) {
    llama_set_error(err, err_size, "%s: out of memory", path);
    goto fail;
  }
  for (int32_t i = 0; i < hp->head_dim / 2; ++i)
    m->rope_inv_freq[i] = (float)pow((double)hp->rope_base, -2.0 * i / hp->head_dim);
  *out = m;
  return 0;
fail:
  llama_model_free(m);
  return -1;
}

const llama_hparams* llama_model_hparams(const llama_model* model) { return model ? &model->hp : NULL; }
const float* llama_model_token_embedding(const llama_model* model) { return model ? model->token_embd : NULL; }
const float* llama_model_output_norm(const llama_model* model) { return model ? model->output_norm : NULL; }
const float* llama_model_rope_inv_freq(const llama_model* model) { return model ? model->rope_inv_freq : NULL; }

llama_layer_weights llama_model_layer(const llama_model* model, int32_t layer) {
  llama_layer_weights w = {0};
  if (model == NULL || layer < 0 || layer >= model->hp.n_layer) return w;
  const llama_layer* y = &model->layers[layer];
  w.attn_norm = y->attn_norm; w.wq = y->wq; w.wk = y->wk; w.wv = y->wv; w.wo = y->wo;
  w.ffn_norm = y->ffn_norm; w.w_gate = y->w_gate; w.w_up = y->w_up; w.w_down = y->w_down;
  return w;
}

void llama_session_free(llama_session* s) {
  if (s == NULL) return;
  free(s->tokens); free(s->k_cache); free(s->v_cache); free(s->x); free(s->xn); free(s->q); free(s->k);
  free(s->v); free(s->attn); free(s->gate); free(s->up); free(s->scores); free(s->out);
  free(s);
}

int llama_session_create(const llama_model* model, int32_t max_tokens, llama_session** out, char* err,
                         size_t err_size) {
  if (model == NULL || out == NULL) {
    llama_set_error(err, err_size, "llama_session_create: %s is NULL", model == NULL ? "model" : "out");
    return -1;
  }
  const llama_hparams* hp = &model->hp;
  if (max_tokens < 0 || max_tokens > hp->n_ctx) {
    llama_set_error(err, err_size, "llama_session_create: max_tokens %d is outside [0, n_ctx = %d]", max_tokens, hp->n_ctx);
    return -1;
  }
  const size_t capacity = (size_t)(max_tokens ? max_tokens : hp->n_ctx);
  const size_t d = (size_t)hp->n_embd, q_dim = (size_t)hp->n_head * (size_t)hp->head_dim,
               kv_dim = (size_t)hp->n_head_kv * (size_t)hp->head_dim, ff = (size_t)hp->n_ff,
               layers = (size_t)hp->n_layer;
  /* All sizes are products of values checked at load (≤ 2^20 each, at most
   * three factors), so they fit in 64 bits; calloc checks its own product. */
  llama_session* s = (llama_session*)calloc(1, sizeof(llama_session));
  if (s == NULL) goto oom;
  s->model = model;
  s->capacity = (int32_t)capacity;
  if ((s->tokens = (int32_t*)calloc(capacity, sizeof(int32_t))) == NULL ||
      (s->k_cache = (float*)calloc(layers * capacity, kv_dim * sizeof(float))) == NULL ||
      (s->v_cache = (float*)calloc(layers * capacity, kv_dim * sizeof(float))) == NULL ||
      (s->x = (float*)calloc(capacity, d * sizeof(float))) == NULL ||
      (s->xn = (float*)calloc(capacity, d * sizeof(float))) == NULL ||
      (s->q = (float*)calloc(capacity, q_dim * sizeof(float))) == NULL ||
      (s->k = (float*)calloc(capacity, kv_dim * sizeof(float))) == NULL ||
      (s->v = (float*)calloc(capacity, kv_dim * sizeof(float))) == NULL ||
      (s->attn = (float*)calloc(capacity, q_dim * sizeof(float))) == NULL ||
      (s->gate = (float*)calloc(capacity, ff * sizeof(float))) == NULL ||
      (s->up = (float*)calloc(capacity, ff * sizeof(float))) == NULL ||
      (s->scores = (float*)calloc(capacity, sizeof(float))) == NULL ||
      (s->out = (float*)calloc(capacity, d * sizeof(float))) == NULL)
    goto oom;
  *out = s;
  return 0;
oom:
  llama_session_free(s);
  llama_set_error(err, err_size, "llama_session_create: out of memory for a cache of %zu tokens", capacity);
  return -1;
}

int32_t llama_session_length(const llama_session* s) { return s ? s->length : 0; }
const int32_t* llama_session_tokens(const llama_session* s) { return s ? s->tokens : NULL; }
int32_t llama_session_capacity(const llama_session* s) { return s ? s->capacity : 0; }

int llama_session_truncate(llama_session* s, int32_t num_keep, char* err, size_t err_size) {
  if (s == NULL) {
    llama_set_error(err, err_size, "llama_session_truncate: session is NULL");
    return -1;
  }
  if (num_keep < 0 || num_keep > s->length) {
    llama_set_error(err, err_size, "llama_session_truncate: num_keep %d is outside [0, %d]", num_keep, s->length);
    return -1;
  }
  s->length = num_keep; /* the cache rows beyond are overwritten by later forwards */
  return 0;
}

/* out[r] = x[r] / rms(x[r]) * weight, for n rows of width d. */
static void rms_norm(const float* x, const float* weight, int32_t n, int32_t d, float eps, float* out) {
  for (int32_t r = 0; r < n; ++r) {
    const float* row = x + (size_t)r * d;
    double sum = 0.0;
    for (int32_t c = 0; c < d; ++c) sum += (double)row[c] * row[c];
    const float scale = (float)(1.0 / sqrt(sum / d + eps));
    for (int32_t c = 0; c < d; ++c) out[(size_t)r * d + c] = row[c] * scale * weight[c];
  }
}

/* y[n, out] = x[n, in] · Wᵀ (+ y when accumulate), W [out, in] row-major. */
static void matmul(const float* x, const float* w, int32_t n, int32_t in, int32_t out, int accumulate, float* y) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0f, x, in, w, in, accumulate ? 1.0f : 0.0f, y,
              out);
}

/* RoPE, GGML NORM type: within each head, rotate the adjacent pair
 * (v[2i], v[2i+1]) by pos · base^(−2i/head_dim). */
static void rope(float* v, int32_t n, int32_t heads, int32_t head_dim, int32_t first_pos, const float* inv_freq) {
  for (int32_t r = 0; r < n; ++r) {
    const float pos = (float)(first_pos + r);
    for (int32_t h = 0; h < heads; ++h) {
      float* head = v + ((size_t)r * heads + h) * head_dim;
      for (int32_t i = 0; i < head_dim / 2; ++i) {
        const float angle = pos * inv_freq[i];
        const float c = cosf(angle), s = sinf(angle);
        const float a = head[2 * i], b = head[2 * i + 1];
        head[2 * i] = a * c - b * s;
        head[2 * i + 1] = a * s + b * c;
      }
    }
  }
}

int llama_session_forward(llama_session* s, const int32_t* tokens, int32_t n, const float** hidden, char* err,
                          size_t err_size) {
  if (s == NULL || tokens == NULL || hidden == NULL) {
    llama_set_error(err, err_size, "llama_session_forward: %s is NULL", s == NULL ? "session" : tokens == NULL ? "tokens" : "hidden");
    return -1;
  }
  if (n < 1 || n > s->capacity - s->length) {
    llama_set_error(err, err_size, "llama_session_forward: %d tokens do not fit after %d in a cache of %d", n, s->length,
              s->capacity);
    return -1;
  }
  const llama_model* m = s->model;
  const llama_hparams* hp = &m->hp;
  for (int32_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= hp->n_vocab) {
      llama_set_error(err, err_size, "llama_session_forward: token %d at index %d is outside [0, %d)", tokens[i], i,
                hp->n_vocab);
      return -1;
    }
  const int32_t d = hp->n_embd, hd = hp->head_dim, q_dim = hp->n_head * hd, kv_dim = hp->n_head_kv * hd,
                ff = hp->n_ff, group = hp->n_head / hp->n_head_kv, p0 = s->length;
  const float scale = 1.0f / sqrtf((float)hd);

  for (int32_t i = 0; i < n; ++i)
    memcpy(s->x + (size_t)i * d, m->token_embd + (size_t)tokens[i] * d, sizeof(float) * (size_t)d);

  for (int32_t l = 0; l < hp->n_layer; ++l) {
    const llama_layer* y = &m->layers[l];
    float* k_cache = s->k_cache + (size_t)l * s->capacity * kv_dim;
    float* v_cache = s->v_cache + (size_t)l * s->capacity * kv_dim;

    rms_norm(s->x, y->attn_norm, n, d, hp->norm_eps, s->xn);
    matmul(s->xn, y->wq, n, d, q_dim, 0, s->q);
    matmul(s->xn, y->wk, n, d, kv_dim, 0, s->k);
    matmul(s->xn, y->wv, n, d, kv_dim, 0, s->v);
    rope(s->q, n, hp->n_head, hd, p0, m->rope_inv_freq);
    rope(s->k, n, hp->n_head_kv, hd, p0, m->rope_inv_freq);
    memcpy(k_cache + (size_t)p0 * kv_dim, s->k, sizeof(float) * (size_t)n * kv_dim);
    memcpy(v_cache + (size_t)p0 * kv_dim, s->v, sizeof(float) * (size_t)n * kv_dim);

    /* Causal attention: row i sees positions 0 .. p0 + i. */
    for (int32_t i = 0; i < n; ++i) {
      const int32_t visible = p0 + i + 1;
      for (int32_t h = 0; h < hp->n_head; ++h) {
        const float* q = s->q + (size_t)i * q_dim + (size_t)h * hd;
        const size_t kv_offset = (size_t)(h / group) * hd;
        float max_score = -INFINITY;
        for (int32_t t = 0; t < visible; ++t) {
          const float* k = k_cache + (size_t)t * kv_dim + kv_offset;
          float dot = 0.0f;
          for (int32_t c = 0; c < hd; ++c) dot += q[c] * k[c];
          s->scores[t] = dot * scale;
          if (s->scores[t] > max_score) max_score = s->scores[t];
        }
        float total = 0.0f;
        for (int32_t t = 0; t < visible; ++t) {
          s->scores[t] = expf(s->scores[t] - max_score);
          total += s->scores[t];
        }
        float* o = s->attn + (size_t)i * q_dim + (size_t)h * hd;
        memset(o, 0, sizeof(float) * (size_t)hd);
        for (int32_t t = 0; t < visible; ++t) {
          const float* v = v_cache + (size_t)t * kv_dim + kv_offset;
          const float weight = s->scores[t] / total;
          for (int32_t c = 0; c < hd; ++c) o[c] += weight * v[c];
        }
      }
    }
    matmul(s->attn, y->wo, n, q_dim, d, 1, s->x);

    rms_norm(s->x, y->ffn_norm, n, d, hp->norm_eps, s->xn);
    matmul(s->xn, y->w_gate, n, d, ff, 0, s->gate);
    matmul(s->xn, y->w_up, n, d, ff, 0, s->up);
    for (size_t e = 0; e < (size_t)n * ff; ++e) {
      const float g = s->gate[e];
      s->gate[e] = g / (1.0f + expf(-g)) * s->up[e]; /* silu(gate) · up */
    }
    matmul(s->gate, y->w_down, n, ff, d, 1, s->x);
  }
  rms_norm(s->x, m->output_norm, n, d, hp->norm_eps, s->out);
  memcpy(s->tokens + p0, tokens, sizeof(int32_t) * (size_t)n);
  s->length = p0 + n;
  *hidden = s->out;
  return 0;
}
