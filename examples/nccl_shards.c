/* Vocabulary-parallel verify on the GPUs of this host, with NCCL directly.
 *
 * One process drives R ranks, one per visible GPU (ncclCommInitAll). Rank k
 * holds rows [k·V/R, (k+1)·V/R) of the LM head W, as a tensor-parallel
 * engine's ParallelLMHead does. A verify step on every rank is:
 *   flashspec_verify_shard     its slice's pass, one 48-byte record per row,
 *                              written into its own slot of the gathered
 *                              buffer [R][rows]
 *   ncclAllGather (in place)   rows × 48 bytes from each rank, instead of
 *                              rows × V/R × 4 bytes of logits
 *   flashspec_finalize_shards  Algorithm 1 on the gathered records: every
 *                              rank gets the tokens
 * all on the rank's stream, with no host synchronisation (so the step can be
 * captured in a CUDA graph per rank). The example checks that every rank
 * emits what flashspec_verify_and_finalize of the whole head emits on GPU 0.
 *
 * Without a CUDA device it says so and exits with 77 (a skip). Built when
 * Meson finds NCCL (-Dnccl_root=DIR for the nvidia-nccl wheel's layout). */
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashspec.h"

#define VOCAB 32000
#define HIDDEN 512
#define REQUESTS 4
#define DRAFTS 3 /* per request */
#define ROWS (REQUESTS * (DRAFTS + 1))
#define MAX_RANKS 16

#define CHECK_CUDA(call)                                                                      \
  do {                                                                                        \
    cudaError_t e_ = (call);                                                                  \
    if (e_ != cudaSuccess) {                                                                  \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));   \
      exit(1);                                                                                \
    }                                                                                         \
  } while (0)
#define CHECK_NCCL(call)                                                                      \
  do {                                                                                        \
    ncclResult_t r_ = (call);                                                                 \
    if (r_ != ncclSuccess) {                                                                  \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, ncclGetErrorString(r_));   \
      exit(1);                                                                                \
    }                                                                                         \
  } while (0)
#define CHECK_FS(ctx, call)                                                                   \
  do {                                                                                        \
    flashspec_status s_ = (call);                                                             \
    if (s_ != FLASHSPEC_OK) {                                                                 \
      fprintf(stderr, "%s:%d %s: %s: %s\n", __FILE__, __LINE__, #call, flashspec_status_name(s_), \
              flashspec_context_last_error(ctx));                                             \
      exit(1);                                                                                \
    }                                                                                         \
  } while (0)

/* What one rank holds on its GPU. */
typedef struct Rank {
  cudaStream_t stream;
  flashspec_context* ctx;
  flashspec_lm_head* head; /* its slice */
  ncclComm_t comm;
  float* hidden;           /* [ROWS, HIDDEN], the same on every rank */
  int32_t *offsets, *drafts, *accepted, *emitted;
  unsigned char* records;  /* [R][ROWS] records */
} Rank;

static void* device_copy(const void* host, size_t bytes) {
  void* p = NULL;
  CHECK_CUDA(cudaMalloc(&p, bytes));
  CHECK_CUDA(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice));
  return p;
}

static flashspec_verify_batch batch_of(const Rank* r, const flashspec_tensor* hidden, const float* temperatures,
                                       const uint64_t* seeds) {
  flashspec_verify_batch b;
  flashspec_verify_batch_init(&b);
  b.memory = FLASHSPEC_MEMORY_CUDA;
  b.num_requests = REQUESTS;
  b.draft_offsets = r->offsets;
  b.draft_tokens = r->drafts;
  b.target_hidden = hidden;
  b.temperatures = temperatures;
  b.seeds = seeds;
  return b;
}

static flashspec_verify_result result_of(const Rank* r) {
  flashspec_verify_result res;
  flashspec_verify_result_init(&res);
  res.memory = FLASHSPEC_MEMORY_CUDA;
  res.accepted_counts = r->accepted;
  res.emitted_tokens = r->emitted;
  return res;
}

int main(void) {
  int ranks = 0;
  if (cudaGetDeviceCount(&ranks) != cudaSuccess || ranks == 0 || flashspec_cuda_device_count() == 0) {
    printf("SKIP: no CUDA device: the NCCL example needs one GPU or more\n");
    return 77;
  }
  if (ranks > MAX_RANKS) ranks = MAX_RANKS;
  const int slice = VOCAB / ranks, last_slice = VOCAB - slice * (ranks - 1);

  /* Host data: W, the hidden rows, and drafts (each request's drafts are
   * tokens the target likes more or less; the verify decides). */
  float* w = malloc(sizeof(float) * VOCAB * HIDDEN);
  float* h = malloc(sizeof(float) * ROWS * HIDDEN);
  if (!w || !h) return 1;
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < (size_t)VOCAB * HIDDEN; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    w[i] = ((float)(state >> 40) / 16777216.0f - 0.5f) * 0.3f;
  }
  for (size_t i = 0; i < (size_t)ROWS * HIDDEN; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    h[i] = ((float)(state >> 40) / 16777216.0f - 0.5f) * 2.0f;
  }
  int32_t offsets[REQUESTS + 1], drafts[REQUESTS * DRAFTS];
  for (int r = 0; r <= REQUESTS; ++r) offsets[r] = r * DRAFTS;
  for (int i = 0; i < REQUESTS * DRAFTS; ++i) drafts[i] = (int32_t)((i * 7919u) % VOCAB);
  const float temperatures[REQUESTS] = {0.0f, 0.7f, 1.0f, 1.3f};
  const uint64_t seeds[REQUESTS] = {1, 2, 3, 4};

  int devices[MAX_RANKS];
  ncclComm_t comms[MAX_RANKS];
  for (int k = 0; k < ranks; ++k) devices[k] = k;
  CHECK_NCCL(ncclCommInitAll(comms, ranks, devices));

  Rank rank[MAX_RANKS];
  flashspec_tensor hidden[MAX_RANKS];
  float* temps_dev[MAX_RANKS];
  uint64_t* seeds_dev[MAX_RANKS];
  const size_t record_bytes = FLASHSPEC_SHARD_RECORD_BYTES * (size_t)ROWS;
  for (int k = 0; k < ranks; ++k) {
    Rank* r = &rank[k];
    CHECK_CUDA(cudaSetDevice(k));
    CHECK_CUDA(cudaStreamCreateWithFlags(&r->stream, cudaStreamNonBlocking));
    flashspec_context_params params;
    flashspec_context_params_init(&params);
    params.backend = FLASHSPEC_BACKEND_CUDA;
    params.device_ordinal = k;
    params.cuda_stream = r->stream;
    params.seed = 2024;
    CHECK_FS(NULL, flashspec_context_create(&params, &r->ctx));
    const int64_t begin = (int64_t)k * slice;
    flashspec_tensor wt = flashspec_tensor_make(w + begin * HIDDEN, FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST,
                                                k + 1 == ranks ? last_slice : slice, HIDDEN);
    CHECK_FS(r->ctx, flashspec_lm_head_create_shard(r->ctx, &wt, FLASHSPEC_LM_HEAD_COPY, begin, VOCAB, &r->head));
    r->comm = comms[k];
    r->hidden = device_copy(h, sizeof(float) * ROWS * HIDDEN);
    r->offsets = device_copy(offsets, sizeof offsets);
    r->drafts = device_copy(drafts, sizeof drafts);
    CHECK_CUDA(cudaMalloc((void**)&r->accepted, sizeof(int32_t) * REQUESTS));
    CHECK_CUDA(cudaMalloc((void**)&r->emitted, sizeof(int32_t) * ROWS));
    CHECK_CUDA(cudaMalloc((void**)&r->records, record_bytes * (size_t)ranks));
    temps_dev[k] = device_copy(temperatures, sizeof temperatures);
    seeds_dev[k] = device_copy(seeds, sizeof seeds);
    hidden[k] = flashspec_tensor_make(r->hidden, FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_CUDA, ROWS, HIDDEN);
  }

  /* One sharded verify step, queued on every rank's stream. */
  for (int k = 0; k < ranks; ++k) {
    CHECK_CUDA(cudaSetDevice(k));
    flashspec_verify_batch b = batch_of(&rank[k], &hidden[k], temps_dev[k], seeds_dev[k]);
    CHECK_FS(rank[k].ctx, flashspec_verify_shard(rank[k].ctx, rank[k].head, &b, rank[k].records + k * record_bytes));
  }
  CHECK_NCCL(ncclGroupStart());
  for (int k = 0; k < ranks; ++k)
    CHECK_NCCL(ncclAllGather(rank[k].records + k * record_bytes, rank[k].records, record_bytes, ncclUint8,
                             rank[k].comm, rank[k].stream));
  CHECK_NCCL(ncclGroupEnd());
  for (int k = 0; k < ranks; ++k) {
    CHECK_CUDA(cudaSetDevice(k));
    flashspec_verify_batch b = batch_of(&rank[k], &hidden[k], temps_dev[k], seeds_dev[k]);
    flashspec_verify_result res = result_of(&rank[k]);
    CHECK_FS(rank[k].ctx, flashspec_finalize_shards(rank[k].ctx, &b, rank[k].records, ranks, &res));
  }

  /* The unsharded verify of the whole head on GPU 0, same seed. */
  CHECK_CUDA(cudaSetDevice(0));
  flashspec_context_params params;
  flashspec_context_params_init(&params);
  params.backend = FLASHSPEC_BACKEND_CUDA;
  params.seed = 2024;
  flashspec_context* whole_ctx = NULL;
  CHECK_FS(NULL, flashspec_context_create(&params, &whole_ctx));
  flashspec_tensor wt = flashspec_tensor_make(w, FLASHSPEC_DTYPE_F32, FLASHSPEC_MEMORY_HOST, VOCAB, HIDDEN);
  flashspec_lm_head* whole = NULL;
  CHECK_FS(whole_ctx, flashspec_lm_head_create(whole_ctx, &wt, FLASHSPEC_LM_HEAD_COPY, &whole));
  int32_t *ref_accepted = NULL, *ref_emitted = NULL;
  CHECK_CUDA(cudaMalloc((void**)&ref_accepted, sizeof(int32_t) * REQUESTS));
  CHECK_CUDA(cudaMalloc((void**)&ref_emitted, sizeof(int32_t) * ROWS));
  Rank ref = rank[0];
  ref.accepted = ref_accepted;
  ref.emitted = ref_emitted;
  flashspec_verify_batch b = batch_of(&ref, &hidden[0], temps_dev[0], seeds_dev[0]);
  flashspec_verify_result res = result_of(&ref);
  CHECK_FS(whole_ctx, flashspec_verify_and_finalize(whole_ctx, whole, &b, &res));
  CHECK_FS(whole_ctx, flashspec_context_synchronize(whole_ctx));

  int32_t want_accepted[REQUESTS], want_emitted[ROWS];
  CHECK_CUDA(cudaMemcpy(want_accepted, ref_accepted, sizeof want_accepted, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(want_emitted, ref_emitted, sizeof want_emitted, cudaMemcpyDeviceToHost));
  int failures = 0;
  for (int k = 0; k < ranks; ++k) {
    int32_t accepted[REQUESTS], emitted[ROWS];
    CHECK_CUDA(cudaSetDevice(k));
    CHECK_CUDA(cudaStreamSynchronize(rank[k].stream));
    CHECK_CUDA(cudaMemcpy(accepted, rank[k].accepted, sizeof accepted, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(emitted, rank[k].emitted, sizeof emitted, cudaMemcpyDeviceToHost));
    if (memcmp(accepted, want_accepted, sizeof accepted) || memcmp(emitted, want_emitted, sizeof emitted)) {
      fprintf(stderr, "rank %d emitted other tokens than the unsharded verify\n", k);
      ++failures;
    }
  }
  printf("%d rank(s), V = %d split in slices of %d, records of %d bytes per row (%zu bytes gathered per rank "
         "instead of %zu bytes of logits)\n",
         ranks, VOCAB, slice, FLASHSPEC_SHARD_RECORD_BYTES, record_bytes * (size_t)(ranks - 1),
         sizeof(float) * (size_t)ROWS * (size_t)slice * (size_t)(ranks - 1));
  for (int r = 0; r < REQUESTS; ++r) {
    printf("request %d (T = %.1f): %d of %d drafts accepted, emitted", r, temperatures[r], want_accepted[r], DRAFTS);
    for (int i = 0; i <= want_accepted[r]; ++i) printf(" %d", want_emitted[offsets[r] + r + i]);
    printf("\n");
  }
  printf(failures ? "FAILED: the ranks disagree with the unsharded verify\n"
                  : "every rank emitted the tokens of the unsharded verify\n");

  for (int k = 0; k < ranks; ++k) {
    CHECK_CUDA(cudaSetDevice(k));
    flashspec_lm_head_destroy(rank[k].head);
    flashspec_context_destroy(rank[k].ctx);
    cudaFree(rank[k].hidden);
    cudaFree(rank[k].offsets);
    cudaFree(rank[k].drafts);
    cudaFree(rank[k].accepted);
    cudaFree(rank[k].emitted);
    cudaFree(rank[k].records);
    cudaFree(temps_dev[k]);
    cudaFree(seeds_dev[k]);
    ncclCommDestroy(rank[k].comm);
    cudaStreamDestroy(rank[k].stream);
  }
  CHECK_CUDA(cudaSetDevice(0));
  flashspec_lm_head_destroy(whole);
  flashspec_context_destroy(whole_ctx);
  cudaFree(ref_accepted);
  cudaFree(ref_emitted);
  free(w);
  free(h);
  return failures ? 1 : 0;
}
