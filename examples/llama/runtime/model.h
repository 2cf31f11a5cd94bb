/* model.h — a Llama model, as examples/llama/README.md specifies it, run on
 * the CPU in f32 with OpenBLAS.
 *
 * llama_model holds the weights (read from a GGUF file, F32 or F16 tensors
 * converted to f32) and is immutable after loading; llama_session holds one
 * sequence's KV cache, [layer][position][n_head_kv * head_dim] for keys and
 * for values, and the scratch buffers of a forward. Several sessions may share
 * one model.
 *
 * Forward: pre-norm blocks (RMSNorm, causal GQA attention with RoPE of the
 * GGML NORM type on adjacent pairs, SwiGLU FFN), then the final RMSNorm. All
 * tokens of a call go through one batched forward (one sgemm per weight);
 * the output is the final-norm hidden rows, the LM head's input. The LM head
 * is the token embedding (tied), which llama_model_token_embedding exposes.
 *
 * Errors: functions returning int return 0 on success and -1 on failure,
 * with a message in err (err_size bytes). */
#ifndef FLASHSPEC_LLAMA_MODEL_H
#define FLASHSPEC_LLAMA_MODEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llama_hparams {
  int32_t n_vocab;
  int32_t n_embd;     /* d */
  int32_t n_layer;
  int32_t n_head;
  int32_t n_head_kv;
  int32_t head_dim;   /* n_embd / n_head */
  int32_t n_ff;
  int32_t n_ctx;      /* context length: most tokens a session holds */
  float rope_base;
  float norm_eps;
  int32_t bos_token;  /* -1 when the file names none */
  int32_t eos_token;
} llama_hparams;

typedef struct llama_model llama_model;
typedef struct llama_session llama_session;

/* Load a GGUF file of architecture "llama". */
int llama_model_load(const char* path, llama_model** out, char* err, size_t err_size);
/* The same from a parsed file (gguf.h); name prefixes the error messages.
 * The model copies what it needs: file may be closed afterwards. */
struct gguf_file;
int llama_model_load_gguf(const struct gguf_file* file, const char* name, llama_model** out, char* err,
                          size_t err_size);
void llama_model_free(llama_model* model); /* NULL is a no-op */
const llama_hparams* llama_model_hparams(const llama_model* model);
/* token_embd.weight as f32, [n_vocab, n_embd] row-major: the tied LM head. */
const float* llama_model_token_embedding(const llama_model* model);

/* The weights as loaded (f32, row-major, GGUF names in comments), for other
 * backends that run the same model (model_cuda.h uploads them). A matrix
 * [out, in] maps a row of `in` values to `out` values: y = x · Wᵀ. */
typedef struct llama_layer_weights {
  const float* attn_norm; /* [d]                     blk.N.attn_norm.weight */
  const float* wq;        /* [n_head * head_dim, d]    blk.N.attn_q.weight */
  const float* wk;        /* [n_head_kv * head_dim, d] blk.N.attn_k.weight */
  const float* wv;        /* [n_head_kv * head_dim, d] blk.N.attn_v.weight */
  const float* wo;        /* [d, n_head * head_dim]    blk.N.attn_output.weight */
  const float* ffn_norm;  /* [d]                       blk.N.ffn_norm.weight */
  const float* w_gate;    /* [n_ff, d]                 blk.N.ffn_gate.weight */
  const float* w_up;      /* [n_ff, d]                 blk.N.ffn_up.weight */
  const float* w_down;    /* [d, n_ff]                 blk.N.ffn_down.weight */
} llama_layer_weights;
/* Layer `layer` (0 ≤ layer < n_layer); all NULL for a NULL model or a layer
 * out of range. */
llama_layer_weights llama_model_layer(const llama_model* model, int32_t layer);
/* output_norm.weight, [n_embd]. */
const float* llama_model_output_norm(const llama_model* model);
/* RoPE's inverse frequencies, [head_dim / 2]: rope_base^(−2i / head_dim),
 * computed once at load so that every backend rotates by the same angles. */
const float* llama_model_rope_inv_freq(const llama_model* model);

/* A session for up to max_tokens tokens (1..n_ctx; 0 = n_ctx). */
int llama_session_create(const llama_model* model, int32_t max_tokens, llama_session** out, char* err,
                         size_t err_size);
void llama_session_free(llama_session* session); /* NULL is a no-op */
/* Tokens in the cache, and the cache's token ids (valid until the next call). */
int32_t llama_session_length(const llama_session* session);
const int32_t* llama_session_tokens(const llama_session* session);
int32_t llama_session_capacity(const llama_session* session);
/* Drop all but the first num_keep tokens (0 ≤ num_keep ≤ length). */
int llama_session_truncate(llama_session* session, int32_t num_keep, char* err, size_t err_size);
/* Append n tokens (ids in [0, n_vocab)) to the cache in one batched forward
 * and return the final-norm hidden rows of those n tokens, [n, n_embd]
 * row-major, in *hidden (owned by the session, valid until the next
 * forward). */
int llama_session_forward(llama_session* session, const int32_t* tokens, int32_t n, const float** hidden,
                          char* err, size_t err_size);

#ifdef __cplusplus
}
#endif
#endif
