/* model_cuda.h — the model of model.h run on a CUDA device with cuBLAS.
 *
 * A llama_cuda_model is an upload of a loaded llama_model (model.h stays the
 * one loader and description): every weight is copied to the device in f32,
 * the dtype the CPU forward computes in, so that the two forwards differ only
 * by the order of floating-point sums and greedy decoding agrees between them.
 * The token embedding on the device doubles as the tied LM head: a FlashSpec
 * CUDA context can borrow it (FLASHSPEC_LM_HEAD_BORROW).
 *
 * A llama_cuda_session is one sequence's device KV cache, [layer][position]
 * [n_head_kv * head_dim] for keys and for values, and the device scratch of a
 * forward. The forward is the CPU's (model.c) step for step: embedding
 * lookup, per layer RMSNorm, Q/K/V GEMMs over all the call's tokens (cuBLAS
 * sgemm, no TF32; K and V are written straight into the cache), RoPE of the
 * GGML NORM type on adjacent pairs with the model's inverse frequencies,
 * causal GQA attention over the cache (one block per token and head, online
 * softmax), output GEMM accumulated into the residual, RMSNorm, gate/up
 * GEMMs, SwiGLU, down GEMM accumulated; then the final RMSNorm. The hidden
 * rows it returns are device memory: FlashSpec's CUDA backend reads them
 * without a copy.
 *
 * Streams: all work of a model's sessions is enqueued on the stream given at
 * upload (the engine's context must use the same one, so that its verify
 * reads the rows after they are written); a forward returns without waiting
 * for the device. Only llama_cuda_session_forward's host token ids cross
 * from the host, and only llama_cuda_copy_to_host waits.
 *
 * Errors: functions returning int return 0 on success and -1 on failure,
 * with a message in err (err_size bytes). This header needs no CUDA headers:
 * streams are passed as void* (a cudaStream_t). */
#ifndef FLASHSPEC_LLAMA_MODEL_CUDA_H
#define FLASHSPEC_LLAMA_MODEL_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llama_cuda_model llama_cuda_model;
typedef struct llama_cuda_session llama_cuda_session;

/* Number of CUDA devices the CUDA runtime sees (0 when none or no driver). */
int llama_cuda_device_count(void);

/* A new non-blocking stream on the current device, and its end (NULL is a
 * no-op). */
int llama_cuda_stream_create(void** stream, char* err, size_t err_size);
void llama_cuda_stream_destroy(void* stream);
/* Device memory (cudaMalloc) and its release (NULL is a no-op). */
int llama_cuda_malloc(size_t bytes, void** out, char* err, size_t err_size);
void llama_cuda_free(void* device_pointer);
/* Copy bytes from device to host memory in stream order, then wait for the
 * stream. */
int llama_cuda_copy_to_host(void* host, const void* device, size_t bytes, void* stream, char* err, size_t err_size);
/* Copy bytes from host to device memory in stream order, then wait. */
int llama_cuda_copy_to_device(void* device, const void* host, size_t bytes, void* stream, char* err, size_t err_size);

/* Upload model's weights (the host model may be freed afterwards). stream:
 * the cudaStream_t of every session of this model; NULL = the legacy default
 * stream. */
int llama_cuda_model_upload(const llama_model* model, void* stream, llama_cuda_model** out, char* err,
                            size_t err_size);
void llama_cuda_model_free(llama_cuda_model* model); /* NULL is a no-op; waits for the stream */
const llama_hparams* llama_cuda_model_hparams(const llama_cuda_model* model);
/* token_embd.weight on the device, f32 [n_vocab, n_embd] row-major. */
const float* llama_cuda_model_token_embedding(const llama_cuda_model* model);

/* As llama_session_create / _free / _length / _capacity / _truncate. */
int llama_cuda_session_create(const llama_cuda_model* model, int32_t max_tokens, llama_cuda_session** out, char* err,
                              size_t err_size);
void llama_cuda_session_free(llama_cuda_session* session); /* NULL is a no-op; waits for the stream */
int32_t llama_cuda_session_length(const llama_cuda_session* session);
int32_t llama_cuda_session_capacity(const llama_cuda_session* session);
int llama_cuda_session_truncate(llama_cuda_session* session, int32_t num_keep, char* err, size_t err_size);
/* The host's record of the cache's token ids (valid until the next call):
 * entries appended by llama_cuda_session_forward_device are −1 (unknown to
 * the host) until llama_cuda_session_record_tokens names them. */
const int32_t* llama_cuda_session_tokens(const llama_cuda_session* session);
/* Record ids (in [0, n_vocab)) for cache positions [first, first + n) of
 * the current length, once the host has read them back. */
int llama_cuda_session_record_tokens(llama_cuda_session* session, int32_t first, const int32_t* ids, int32_t n,
                                     char* err, size_t err_size);

/* Append n tokens (host ids in [0, n_vocab)) in one batched forward, and
 * return the final-norm hidden rows of those n tokens, [n, n_embd] f32
 * row-major, in DEVICE memory owned by the session (valid until the next
 * forward; ready in stream order). */
int llama_cuda_session_forward(llama_cuda_session* session, const int32_t* tokens, int32_t n, const float** hidden,
                               char* err, size_t err_size);
/* The same with the ids in device memory (e.g. a token FlashSpec just
 * drafted on the device), without a host sync. The host cannot check them:
 * an id outside [0, n_vocab) gives that token a NaN embedding, hence NaN
 * hidden rows, which FlashSpec refuses. */
int llama_cuda_session_forward_device(llama_cuda_session* session, const int32_t* device_tokens, int32_t n,
                                      const float** hidden, char* err, size_t err_size);

#ifdef __cplusplus
}
#endif
#endif
