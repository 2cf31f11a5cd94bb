// model_cuda.cu — see model_cuda.h. Each kernel below mirrors a step of
// llama_session_forward in model.c; the comments name the CPU function.
#include "model_cuda.h"
#include "error.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

namespace {


bool cuda_ok(cudaError_t e, const char* what, char* err, size_t err_size) {
  if (e == cudaSuccess) return true;
  llama_set_error(err, err_size, "%s: CUDA error %d (%s): %s", what, (int)e, cudaGetErrorName(e), cudaGetErrorString(e));
  return false;
}

bool cublas_ok(cublasStatus_t s, const char* what, char* err, size_t err_size) {
  if (s == CUBLAS_STATUS_SUCCESS) return true;
  llama_set_error(err, err_size, "%s: cuBLAS status %d (%s)", what, (int)s, cublasGetStatusString(s));
  return false;
}

struct DeviceLayer {
  float* attn_norm;
  float* wq;
  float* wk;
  float* wv;
  float* wo;
  float* ffn_norm;
  float* w_gate;
  float* w_up;
  float* w_down;
};

constexpr int kNormThreads = 256;
constexpr int kAttentionThreads = 128;  // also the tile of cache positions per pass
constexpr int kElementwiseThreads = 256;

// Block-wide sum or max of v (blockDim.x a multiple of 32, ≤ 1024); every
// thread gets the result. `scratch` holds 32 values; the block may reuse it
// after the call returns.
template <typename T, bool kMax>
__device__ T block_reduce(T v, T* scratch) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const T other = __shfl_xor_sync(0xffffffffu, v, offset);
    v = kMax ? (other > v ? other : v) : v + other;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T result = scratch[0];
  for (int w = 1; w < (int)(blockDim.x >> 5); ++w) result = kMax ? (scratch[w] > result ? scratch[w] : result) : result + scratch[w];
  __syncthreads();
  return result;
}

// x[r] = token_embd[tokens[r]] (the memcpy loop of llama_session_forward);
// an id outside [0, vocab) gives a NaN row.
__global__ void embed_kernel(const float* __restrict__ token_embd, const int32_t* __restrict__ tokens, int32_t vocab,
                             int32_t d, float* __restrict__ x) {
  const int32_t r = blockIdx.x;
  const int32_t token = tokens[r];
  const bool valid = token >= 0 && token < vocab;
  for (int32_t c = threadIdx.x; c < d; c += blockDim.x)
    x[(size_t)r * d + c] = valid ? token_embd[(size_t)token * d + c] : __int_as_float(0x7fc00000);
}

// rms_norm: one block per row; the sum of squares in double, as on the CPU.
__global__ void rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ weight, int32_t d, float eps,
                                float* __restrict__ out) {
  __shared__ double scratch[32];
  const float* row = x + (size_t)blockIdx.x * d;
  double sum = 0.0;
  for (int32_t c = threadIdx.x; c < d; c += blockDim.x) sum += (double)row[c] * row[c];
  sum = block_reduce<double, false>(sum, scratch);
  const float scale = (float)(1.0 / sqrt(sum / d + eps));
  for (int32_t c = threadIdx.x; c < d; c += blockDim.x) out[(size_t)blockIdx.x * d + c] = row[c] * scale * weight[c];
}

// rope: rows of `heads` heads of head_dim values each (row stride heads ·
// head_dim); thread (r, h, i) rotates the adjacent pair (2i, 2i+1) of head h
// of row r by (first_pos + r) · inv_freq[i].
__global__ void rope_kernel(float* __restrict__ v, int32_t n, int32_t heads, int32_t head_dim, int32_t first_pos,
                            const float* __restrict__ inv_freq) {
  const int32_t half = head_dim / 2;
  const size_t index = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (index >= (size_t)n * heads * half) return;
  const int32_t i = (int32_t)(index % half);
  const size_t head_index = index / half;  // r * heads + h
  const int32_t r = (int32_t)(head_index / heads);
  float* head = v + head_index * head_dim;
  const float pos = (float)(first_pos + r);
  const float angle = pos * inv_freq[i];
  const float c = cosf(angle), s = sinf(angle);
  const float a = head[2 * i], b = head[2 * i + 1];
  head[2 * i] = a * c - b * s;
  head[2 * i + 1] = a * s + b * c;
}

// The causal attention loop of llama_session_forward: block (i, h) computes
// row i's head h over cache positions 0 .. p0 + i, whose keys and values sit
// in head h / group of the cache. The CPU takes the max over all scores,
// then the softmax; here a block walks the positions in tiles of blockDim
// with an online softmax (running max m, running sum l, accumulator rescaled
// when m grows) — the same value up to rounding. Each thread computes one
// score per tile, with the dot product in the CPU's order; thread c owns the
// output components c, c + blockDim, ...
__global__ void attention_kernel(const float* __restrict__ q, const float* __restrict__ k_cache,
                                 const float* __restrict__ v_cache, float* __restrict__ attn, int32_t p0,
                                 int32_t n_head, int32_t head_dim, int32_t kv_dim, int32_t group, float scale) {
  extern __shared__ float shared[];
  float* q_s = shared;                      // [head_dim]
  float* acc_s = shared + head_dim;         // [head_dim]
  float* p_s = shared + 2 * head_dim;       // [blockDim]
  __shared__ float scratch[32];
  const int32_t i = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, threads = blockDim.x;
  const int32_t q_dim = n_head * head_dim;
  const size_t kv_offset = (size_t)(h / group) * head_dim;
  for (int32_t c = tid; c < head_dim; c += threads) {
    q_s[c] = q[(size_t)i * q_dim + (size_t)h * head_dim + c];
    acc_s[c] = 0.0f;
  }
  __syncthreads();
  const int32_t visible = p0 + i + 1;
  float m = -INFINITY, l = 0.0f;
  for (int32_t t0 = 0; t0 < visible; t0 += threads) {
    const int32_t t = t0 + tid;
    float score = -INFINITY;
    if (t < visible) {
      const float* k = k_cache + (size_t)t * kv_dim + kv_offset;
      float dot = 0.0f;
      for (int32_t c = 0; c < head_dim; ++c) dot += q_s[c] * k[c];
      score = dot * scale;
    }
    const float new_m = fmaxf(m, block_reduce<float, true>(score, scratch));  // finite: t0 < visible
    const float correction = expf(m - new_m);                                // 0 on the first tile
    const float p = t < visible ? expf(score - new_m) : 0.0f;
    p_s[tid] = p;
    l = l * correction + block_reduce<float, false>(p, scratch);  // its barrier also publishes p_s
    const int32_t tile = min(threads, visible - t0);
    for (int32_t c = tid; c < head_dim; c += threads) {
      float sum = 0.0f;
      for (int32_t j = 0; j < tile; ++j) sum += p_s[j] * v_cache[(size_t)(t0 + j) * kv_dim + kv_offset + c];
      acc_s[c] = acc_s[c] * correction + sum;
    }
    m = new_m;
    __syncthreads();  // p_s is rewritten by the next tile
  }
  for (int32_t c = tid; c < head_dim; c += threads)
    attn[(size_t)i * q_dim + (size_t)h * head_dim + c] = acc_s[c] / l;
}

// The SwiGLU loop: gate = silu(gate) · up.
__global__ void swiglu_kernel(float* __restrict__ gate, const float* __restrict__ up, size_t count) {
  const size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= count) return;
  const float g = gate[e];
  gate[e] = g / (1.0f + expf(-g)) * up[e];
}

unsigned blocks_for(size_t count, int threads) { return (unsigned)((count + threads - 1) / threads); }

}  // namespace

struct llama_cuda_model {
  llama_hparams hp;
  cudaStream_t stream;
  float* token_embd;     // [vocab, d]
  float* output_norm;    // [d]
  float* rope_inv_freq;  // [head_dim / 2]
  DeviceLayer* layers;   // host array of device pointers
};

struct llama_cuda_session {
  const llama_cuda_model* model;
  cublasHandle_t cublas;
  int32_t capacity;
  int32_t length;
  int32_t* tokens;    // host record [capacity]
  int32_t* ids;       // device [capacity]: the ids of the current call
  float* k_cache;     // device [layer][capacity][kv_dim]
  float* v_cache;
  float* x;           // device scratch, as llama_session's
  float* xn;
  float* q;
  float* attn;
  float* gate;
  float* up;
  float* out;
};

extern "C" {

int llama_cuda_device_count(void) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error of "no driver / no device"
    return 0;
  }
  return count;
}

int llama_cuda_stream_create(void** stream, char* err, size_t err_size) {
  if (stream == nullptr) {
    llama_set_error(err, err_size, "llama_cuda_stream_create: stream is NULL");
    return -1;
  }
  cudaStream_t s = nullptr;
  if (!cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", err, err_size))
    return -1;
  *stream = s;
  return 0;
}

void llama_cuda_stream_destroy(void* stream) {
  if (stream != nullptr) cudaStreamDestroy((cudaStream_t)stream);
}

int llama_cuda_malloc(size_t bytes, void** out, char* err, size_t err_size) {
  if (out == nullptr) {
    llama_set_error(err, err_size, "llama_cuda_malloc: out is NULL");
    return -1;
  }
  void* p = nullptr;
  if (!cuda_ok(cudaMalloc(&p, bytes), "cudaMalloc", err, err_size)) return -1;
  *out = p;
  return 0;
}

void llama_cuda_free(void* device_pointer) { cudaFree(device_pointer); }

int llama_cuda_copy_to_host(void* host, const void* device, size_t bytes, void* stream, char* err, size_t err_size) {
  if (host == nullptr || device == nullptr) {
    llama_set_error(err, err_size, "llama_cuda_copy_to_host: %s is NULL", host == nullptr ? "host" : "device");
    return -1;
  }
  const cudaStream_t s = (cudaStream_t)stream;
  if (!cuda_ok(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync to host", err,
               err_size) ||
      !cuda_ok(cudaStreamSynchronize(s), "cudaStreamSynchronize", err, err_size))
    return -1;
  return 0;
}

int llama_cuda_copy_to_device(void* device, const void* host, size_t bytes, void* stream, char* err,
                              size_t err_size) {
  if (host == nullptr || device == nullptr) {
    llama_set_error(err, err_size, "llama_cuda_copy_to_device: %s is NULL", host == nullptr ? "host" : "device");
    return -1;
  }
  const cudaStream_t s = (cudaStream_t)stream;
  if (!cuda_ok(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync to device", err,
               err_size) ||
      !cuda_ok(cudaStreamSynchronize(s), "cudaStreamSynchronize", err, err_size))
    return -1;
  return 0;
}

void llama_cuda_model_free(llama_cuda_model* m) {
  if (m == nullptr) return;
  cudaStreamSynchronize(m->stream);
  if (m->layers != nullptr) {
    for (int32_t l = 0; l < m->hp.n_layer; ++l) {
      DeviceLayer* y = &m->layers[l];
      cudaFree(y->attn_norm); cudaFree(y->wq); cudaFree(y->wk); cudaFree(y->wv); cudaFree(y->wo);
      cudaFree(y->ffn_norm); cudaFree(y->w_gate); cudaFree(y->w_up); cudaFree(y->w_down);
    }
  }
  free(m->layers);
  cudaFree(m->token_embd);
  cudaFree(m->output_norm);
  cudaFree(m->rope_inv_freq);
  free(m);
}

// A device copy of count floats from host memory.
static bool upload(const float* host, size_t count, const char* name, float** out, char* err, size_t err_size) {
  char what[96];
  snprintf(what, sizeof what, "uploading %s (%zu floats)", name, count);
  if (!cuda_ok(cudaMalloc((void**)out, count * sizeof(float)), what, err, err_size)) {
    *out = nullptr;
    return false;
  }
  return cuda_ok(cudaMemcpy(*out, host, count * sizeof(float), cudaMemcpyHostToDevice), what, err, err_size);
}

int llama_cuda_model_upload(const llama_model* model, void* stream, llama_cuda_model** out, char* err,
                            size_t err_size) {
  if (model == nullptr || out == nullptr) {
    llama_set_error(err, err_size, "llama_cuda_model_upload: %s is NULL", model == nullptr ? "model" : "out");
    return -1;
  }
  llama_cuda_model* m = (llama_cuda_model*)calloc(1, sizeof(llama_cuda_model));
  if (m == nullptr) {
    llama_set_error(err, err_size, "llama_cuda_model_upload: out of memory");
    return -1;
  }
  m->hp = *llama_model_hparams(model);
  m->stream = (cudaStream_t)stream;
  const llama_hparams& hp = m->hp;
  const size_t d = (size_t)hp.n_embd, q_dim = (size_t)hp.n_head * hp.head_dim,
               kv_dim = (size_t)hp.n_head_kv * hp.head_dim, ff = (size_t)hp.n_ff;
  if (!upload(llama_model_token_embedding(model), (size_t)hp.n_vocab * d, "token_embd.weight", &m->token_embd, err,
              err_size) ||
      !upload(llama_model_output_norm(model), d, "output_norm.weight", &m->output_norm, err, err_size) ||
      !upload(llama_model_rope_inv_freq(model), (size_t)hp.head_dim / 2, "RoPE frequencies", &m->rope_inv_freq, err,
              err_size))
    goto fail;
  m->layers = (DeviceLayer*)calloc((size_t)hp.n_layer, sizeof(DeviceLayer));
  if (m->layers == nullptr) {
    llama_set_error(err, err_size, "llama_cuda_model_upload: out of memory");
    goto fail;
  }
  for (int32_t l = 0; l < hp.n_layer; ++l) {
    const llama_layer_weights w = llama_model_layer(model, l);
    DeviceLayer* y = &m->layers[l];
    if (!upload(w.attn_norm, d, "attn_norm.weight", &y->attn_norm, err, err_size) ||
        !upload(w.wq, q_dim * d, "attn_q.weight", &y->wq, err, err_size) ||
        !upload(w.wk, kv_dim * d, "attn_k.weight", &y->wk, err, err_size) ||
        !upload(w.wv, kv_dim * d, "attn_v.weight", &y->wv, err, err_size) ||
        !upload(w.wo, d * q_dim, "attn_output.weight", &y->wo, err, err_size) ||
        !upload(w.ffn_norm, d, "ffn_norm.weight", &y->ffn_norm, err, err_size) ||
        !upload(w.w_gate, ff * d, "ffn_gate.weight", &y->w_gate, err, err_size) ||
        !upload(w.w_up, ff * d, "ffn_up.weight", &y->w_up, err, err_size) ||
        !upload(w.w_down, d * ff, "ffn_down.weight", &y->w_down, err, err_size))
      goto fail;
  }
  *out = m;
  return 0;
fail:
  llama_cuda_model_free(m);
  return -1;
}

const llama_hparams* llama_cuda_model_hparams(const llama_cuda_model* m) { return m ? &m->hp : nullptr; }
const float* llama_cuda_model_token_embedding(const llama_cuda_model* m) { return m ? m->token_embd : nullptr; }

void llama_cuda_session_free(llama_cuda_session* s) {
  if (s == nullptr) return;
  cudaStreamSynchronize(s->model->stream);
  if (s->cublas != nullptr) cublasDestroy(s->cublas);
  free(s->tokens);
  cudaFree(s->ids); cudaFree(s->k_cache); cudaFree(s->v_cache); cudaFree(s->x); cudaFree(s->xn); cudaFree(s->q);
  cudaFree(s->attn); cudaFree(s->gate); cudaFree(s->up); cudaFree(s->out);
  free(s);
}

int llama_cuda_session_create(const llama_cuda_model* model, int32_t max_tokens, llama_cuda_session** out, char* err,
                              size_t err_size) {
  if (model == nullptr || out == nullptr) {
    llama_set_error(err, err_size, "llama_cuda_session_create: %s is NULL", model == nullptr ? "model" : "out");
    return -1;
  }
  const llama_hparams& hp = model->hp;
  if (max_tokens < 0 || max_tokens > hp.n_ctx) {
    llama_set_error(err, err_size, "llama_cuda_session_create: max_tokens %d is outside [0, n_ctx = %d]", max_tokens,
              hp.n_ctx);
    return -1;
  }
  const size_t capacity = (size_t)(max_tokens ? max_tokens : hp.n_ctx);
  const size_t d = (size_t)hp.n_embd, q_dim = (size_t)hp.n_head * hp.head_dim,
               kv_dim = (size_t)hp.n_head_kv * hp.head_dim, ff = (size_t)hp.n_ff, layers = (size_t)hp.n_layer;
  llama_cuda_session* s = (llama_cuda_session*)calloc(1, sizeof(llama_cuda_session));
  if (s == nullptr) {
    llama_set_error(err, err_size, "llama_cuda_session_create: out of memory");
    return -1;
  }
  s->model = model;
  s->capacity = (int32_t)capacity;
  const char* what = "llama_cuda_session_create: device memory";
  if ((s->tokens = (int32_t*)calloc(capacity, sizeof(int32_t))) == nullptr) {
    llama_set_error(err, err_size, "llama_cuda_session_create: out of memory");
    goto fail;
  }
  if (!cuda_ok(cudaMalloc((void**)&s->ids, capacity * sizeof(int32_t)), what, err, err_size) ||
      !cuda_ok(cudaMalloc((void**)&s->k_cache, layers * capacity * kv_dim * sizeof(float)), what, err, err_size) ||
      !cuda_ok(cudaMalloc((void**)&s->v_cache, layers * capacity * kv_dim * sizeof(float)), what, err, err_size) ||
      !cuda_ok(cudaMalloc((void**)&s->x, capacity * d * sizeof(float)), what, err, err_size) ||
      !cuda_ok(cudaMalloc((void**)&s->xn, capacity * d * sizeof(float)), what, err, err_size) ||
      !cuda_ok(cudaMalloc((void**)&s->q, capacity * q_dim * sizeof(float)), what, err, err_size) ||
      !cuda_ok(cudaMalloc((void**)&s->attn, capacity * q_dim * sizeof(float)), what, err, err_size) ||
      !cuda_ok(cudaMalloc((void**)&s->gate, capacity * ff * sizeof(float)), what, err, err_size) ||
      !cuda_ok(cudaMalloc((void**)&s->up, capacity * ff * sizeof(float)), what, err, err_size) ||
      !cuda_ok(cudaMalloc((void**)&s->out, capacity * d * sizeof(float)), what, err, err_size))
    goto fail;
  if (!cublas_ok(cublasCreate(&s->cublas), "cublasCreate", err, err_size)) {
    s->cublas = nullptr;
    goto fail;
  }
  // fp32 GEMMs as the CPU's sgemm: no TF32 (CUBLAS_DEFAULT_MATH), on the model's stream.
  if (!cublas_ok(cublasSetMathMode(s->cublas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode", err, err_size) ||
      !cublas_ok(cublasSetStream(s->cublas, model->stream), "cublasSetStream", err, err_size))
    goto fail;
  *out = s;
  return 0;
fail:
  llama_cuda_session_free(s);
  return -1;
}

int32_t llama_cuda_session_length(const llama_cuda_session* s) { return s ? s->length : 0; }
int32_t llama_cuda_session_capacity(const llama_cuda_session* s) { return s ? s->capacity : 0; }
const int32_t* llama_cuda_session_tokens(const llama_cuda_session* s) { return s ? s->tokens : nullptr; }

int llama_cuda_session_truncate(llama_cuda_session* s, int32_t num_keep, char* err, size_t err_size) {
  if (s == nullptr) {
    llama_set_error(err, err_size, "llama_cuda_session_truncate: session is NULL");
    return -1;
  }
  if (num_keep < 0 || num_keep > s->length) {
    llama_set_error(err, err_size, "llama_cuda_session_truncate: num_keep %d is outside [0, %d]", num_keep, s->length);
    return -1;
  }
  s->length = num_keep;  // later forwards overwrite the cache rows beyond
  return 0;
}

int llama_cuda_session_record_tokens(llama_cuda_session* s, int32_t first, const int32_t* ids, int32_t n, char* err,
                                     size_t err_size) {
  if (s == nullptr || ids == nullptr) {
    llama_set_error(err, err_size, "llama_cuda_session_record_tokens: %s is NULL", s == nullptr ? "session" : "ids");
    return -1;
  }
  if (first < 0 || n < 0 || n > s->length - first) {
    llama_set_error(err, err_size, "llama_cuda_session_record_tokens: positions [%d, %d + %d) are outside [0, %d)", first,
              first, n, s->length);
    return -1;
  }
  for (int32_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= s->model->hp.n_vocab) {
      llama_set_error(err, err_size, "llama_cuda_session_record_tokens: token %d at index %d is outside [0, %d)", ids[i], i,
                s->model->hp.n_vocab);
      return -1;
    }
  memcpy(s->tokens + first, ids, sizeof(int32_t) * (size_t)n);
  return 0;
}

// y[n, out] = x[n, in] · Wᵀ (+ y when accumulate), W [out, in] row-major: in
// cuBLAS's column-major terms yᵀ [out, n] = op(W) [out, in] · xᵀ [in, n]
// with W read as its column-major transpose (lda = in).
static bool matmul(cublasHandle_t h, const float* x, const float* w, int32_t n, int32_t in, int32_t out,
                   bool accumulate, float* y, char* err, size_t err_size) {
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  return cublas_ok(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &alpha, w, in, x, in, &beta, y, out),
                   "cublasSgemm", err, err_size);
}

// The forward over n tokens whose ids are already in s->ids[0..n).
static int forward_ids(llama_cuda_session* s, int32_t n, const float** hidden, char* err, size_t err_size) {
  const llama_cuda_model* m = s->model;
  const llama_hparams& hp = m->hp;
  const cudaStream_t stream = m->stream;
  const int32_t d = hp.n_embd, hd = hp.head_dim, q_dim = hp.n_head * hd, kv_dim = hp.n_head_kv * hd, ff = hp.n_ff,
                group = hp.n_head / hp.n_head_kv, p0 = s->length;
  const float scale = 1.0f / sqrtf((float)hd);
  const size_t attention_shared = (size_t)(2 * hd + kAttentionThreads) * sizeof(float);
  if (attention_shared > 48 * 1024) {
    llama_set_error(err, err_size, "llama_cuda_session_forward: head_dim %d is too large for the attention kernel", hd);
    return -1;
  }

  embed_kernel<<<n, kNormThreads, 0, stream>>>(m->token_embd, s->ids, hp.n_vocab, d, s->x);
  for (int32_t l = 0; l < hp.n_layer; ++l) {
    const DeviceLayer* y = &m->layers[l];
    float* k_cache = s->k_cache + (size_t)l * s->capacity * kv_dim;
    float* v_cache = s->v_cache + (size_t)l * s->capacity * kv_dim;
    float* k_new = k_cache + (size_t)p0 * kv_dim;  // the new rows, written in place
    float* v_new = v_cache + (size_t)p0 * kv_dim;

    rms_norm_kernel<<<n, kNormThreads, 0, stream>>>(s->x, y->attn_norm, d, hp.norm_eps, s->xn);
    if (!matmul(s->cublas, s->xn, y->wq, n, d, q_dim, false, s->q, err, err_size) ||
        !matmul(s->cublas, s->xn, y->wk, n, d, kv_dim, false, k_new, err, err_size) ||
        !matmul(s->cublas, s->xn, y->wv, n, d, kv_dim, false, v_new, err, err_size))
      return -1;
    const size_t q_pairs = (size_t)n * hp.n_head * (hd / 2), k_pairs = (size_t)n * hp.n_head_kv * (hd / 2);
    rope_kernel<<<blocks_for(q_pairs, kElementwiseThreads), kElementwiseThreads, 0, stream>>>(
        s->q, n, hp.n_head, hd, p0, m->rope_inv_freq);
    rope_kernel<<<blocks_for(k_pairs, kElementwiseThreads), kElementwiseThreads, 0, stream>>>(
        k_new, n, hp.n_head_kv, hd, p0, m->rope_inv_freq);
    attention_kernel<<<dim3((unsigned)n, (unsigned)hp.n_head), kAttentionThreads, attention_shared, stream>>>(
        s->q, k_cache, v_cache, s->attn, p0, hp.n_head, hd, kv_dim, group, scale);
    if (!matmul(s->cublas, s->attn, y->wo, n, q_dim, d, true, s->x, err, err_size)) return -1;

    rms_norm_kernel<<<n, kNormThreads, 0, stream>>>(s->x, y->ffn_norm, d, hp.norm_eps, s->xn);
    if (!matmul(s->cublas, s->xn, y->w_gate, n, d, ff, false, s->gate, err, err_size) ||
        !matmul(s->cublas, s->xn, y->w_up, n, d, ff, false, s->up, err, err_size))
      return -1;
    const size_t count = (size_t)n * ff;
    swiglu_kernel<<<blocks_for(count, kElementwiseThreads), kElementwiseThreads, 0, stream>>>(s->gate, s->up, count);
    if (!matmul(s->cublas, s->gate, y->w_down, n, ff, d, true, s->x, err, err_size)) return -1;
  }
  rms_norm_kernel<<<n, kNormThreads, 0, stream>>>(s->x, m->output_norm, d, hp.norm_eps, s->out);
  // Launch errors (bad configuration) show here; faults inside kernels show
  // at the next synchronizing call, as CUDA reports them.
  if (!cuda_ok(cudaGetLastError(), "llama_cuda_session_forward: kernel launch", err, err_size)) return -1;
  s->length = p0 + n;
  *hidden = s->out;
  return 0;
}

static int check_forward_args(llama_cuda_session* s, const void* tokens, int32_t n, const float** hidden,
                              const char* fn, char* err, size_t err_size) {
  if (s == nullptr || tokens == nullptr || hidden == nullptr) {
    llama_set_error(err, err_size, "%s: %s is NULL", fn, s == nullptr ? "session" : tokens == nullptr ? "tokens" : "hidden");
    return -1;
  }
  if (n < 1 || n > s->capacity - s->length) {
    llama_set_error(err, err_size, "%s: %d tokens do not fit after %d in a cache of %d", fn, n, s->length, s->capacity);
    return -1;
  }
  return 0;
}

int llama_cuda_session_forward(llama_cuda_session* s, const int32_t* tokens, int32_t n, const float** hidden,
                               char* err, size_t err_size) {
  if (check_forward_args(s, tokens, n, hidden, "llama_cuda_session_forward", err, err_size) != 0) return -1;
  for (int32_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= s->model->hp.n_vocab) {
      llama_set_error(err, err_size, "llama_cuda_session_forward: token %d at index %d is outside [0, %d)", tokens[i], i,
                s->model->hp.n_vocab);
      return -1;
    }
  // Pageable source: the copy has read `tokens` when it returns.
  if (!cuda_ok(cudaMemcpyAsync(s->ids, tokens, sizeof(int32_t) * (size_t)n, cudaMemcpyHostToDevice, s->model->stream),
               "llama_cuda_session_forward: token upload", err, err_size))
    return -1;
  const int32_t p0 = s->length;
  if (forward_ids(s, n, hidden, err, err_size) != 0) return -1;
  memcpy(s->tokens + p0, tokens, sizeof(int32_t) * (size_t)n);
  return 0;
}

int llama_cuda_session_forward_device(llama_cuda_session* s, const int32_t* device_tokens, int32_t n,
                                      const float** hidden, char* err, size_t err_size) {
  if (check_forward_args(s, device_tokens, n, hidden, "llama_cuda_session_forward_device", err, err_size) != 0)
    return -1;
  if (!cuda_ok(cudaMemcpyAsync(s->ids, device_tokens, sizeof(int32_t) * (size_t)n, cudaMemcpyDeviceToDevice,
                               s->model->stream),
               "llama_cuda_session_forward_device: token copy", err, err_size))
    return -1;
  const int32_t p0 = s->length;
  if (forward_ids(s, n, hidden, err, err_size) != 0) return -1;
  for (int32_t i = 0; i < n; ++i) s->tokens[p0 + i] = -1;  // unknown to the host until recorded
  return 0;
}

}  // extern "C"
