// Vocabulary-parallel verify across the GPUs of one host (bf16 LM heads):
// one process, one rank per visible GPU (R ranks), NCCL between them.
//
// Per shape (V, d, rows), in one run:
//   sharded   each rank: flashspec_verify_shard over its V/R slice, writing
//             its records straight into its slot of the gathered buffer; an
//             in-place ncclAllGather of the records (rows × 48 bytes per
//             rank); flashspec_finalize_shards (every rank gets the tokens)
//   gathered  what tensor-parallel engines do today: each rank computes its
//             slice's logits with cuBLAS, ncclAllGather of the fp32 logits
//             (rows × V/R × 4 bytes per rank), the [R][rows][V/R] → [rows][V]
//             copy an all-gather along the last dimension makes, then the
//             standard materialising verify (common.cuh) on every rank
//   half      one GPU's flashspec_verify_and_finalize on a head of V/R rows:
//             the single-GPU fused verify of the slice, the yardstick of
//             the sharded step at few rows
// A step is enqueued on every rank behind a kernel that spins on a host
// flag, and the flag is released once everything is queued, so no rank's
// time includes another's launch latency; a rank's time is measured with
// events on its own stream, a step's time is the slowest rank's, and each
// figure is the median over --reps steps. Bytes exchanged are those each
// rank receives from the others per step.
//
// Usage: flashspec_shard_bench [--quick] [--only V d rows] [--reps N] [--json FILE]
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "common.cuh"

namespace {

#define NCCL_OK(call)                                                                                \
  do {                                                                                               \
    ncclResult_t r_ = (call);                                                                        \
    if (r_ != ncclSuccess) {                                                                         \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, ncclGetErrorString(r_));     \
      std::exit(1);                                                                                  \
    }                                                                                                \
  } while (0)

constexpr size_t kRecord = FLASHSPEC_SHARD_RECORD_BYTES;

// Holds its stream until the host sets *flag.
__global__ void wait_for_release(const volatile int* flag) {
  while (*flag == 0) {
  }
}

struct Rank {
  int device;
  cudaStream_t stream;
  flashspec_context* ctx;
  cublasHandle_t blas;
  void* blas_ws;
  ncclComm_t comm;
  cudaEvent_t start, stop;
};

// Releases queued work on several streams at once and times each stream.
class Release {
 public:
  Release() {
    CUDA_OK(cudaHostAlloc(&flag_, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable));
  }
  ~Release() { cudaFreeHost(flag_); }
  // One timed step: `enqueue(k)` queues rank k's work; returns the slowest
  // rank's milliseconds.
  double step(std::vector<Rank>& ranks, const std::function<void(size_t)>& enqueue) {
    *flag_ = 0;
    int* device_flag = nullptr;
    for (size_t k = 0; k < ranks.size(); ++k) {
      CUDA_OK(cudaSetDevice(ranks[k].device));
      CUDA_OK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_flag), flag_, 0));
      wait_for_release<<<1, 1, 0, ranks[k].stream>>>(device_flag);
      CUDA_OK(cudaEventRecord(ranks[k].start, ranks[k].stream));
    }
    for (size_t k = 0; k < ranks.size(); ++k) {
      CUDA_OK(cudaSetDevice(ranks[k].device));
      enqueue(k);
    }
    for (size_t k = 0; k < ranks.size(); ++k) {
      CUDA_OK(cudaSetDevice(ranks[k].device));
      CUDA_OK(cudaEventRecord(ranks[k].stop, ranks[k].stream));
    }
    __atomic_store_n(flag_, 1, __ATOMIC_SEQ_CST);
    double slowest = 0.0;
    for (Rank& r : ranks) {
      CUDA_OK(cudaSetDevice(r.device));
      CUDA_OK(cudaStreamSynchronize(r.stream));
      float ms = 0.0f;
      CUDA_OK(cudaEventElapsedTime(&ms, r.start, r.stop));
      slowest = std::max(slowest, double(ms));
    }
    return slowest;
  }
  double median(std::vector<Rank>& ranks, int reps, const std::function<void(size_t)>& enqueue) {
    // One step with the streams running first: the first collective sets up
    // NCCL's connections and cuBLAS its workspace, which may synchronise a
    // device, and must not wait behind a held stream.
    for (size_t k = 0; k < ranks.size(); ++k) {
      CUDA_OK(cudaSetDevice(ranks[k].device));
      enqueue(k);
    }
    for (Rank& r : ranks) {
      CUDA_OK(cudaSetDevice(r.device));
      CUDA_OK(cudaStreamSynchronize(r.stream));
    }
    for (int w = 0; w < 3; ++w) step(ranks, enqueue);
    std::vector<double> ms;
    for (int r = 0; r < reps; ++r) ms.push_back(step(ranks, enqueue));
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }

 private:
  int* flag_ = nullptr;
};

struct Result {
  int vocab, d, rows, ranks;
  double sharded_ms, gathered_ms, half_ms;
  double sharded_bytes, gathered_bytes;
  int mismatches;
};

}  // namespace

int main(int argc, char** argv) {
  BenchArgs args;
  if (!parse_bench_args(argc, argv, 10, 30, args)) return 2;
  const bool quick = args.quick;
  const int only_v = args.only_v, only_d = args.only_d, only_rows = args.only_rows, reps = args.reps;
  const std::string json = args.json;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2) {
    std::fprintf(stderr, "this benchmark needs at least two CUDA devices (found %d)\n", devices);
    return 1;
  }
  const int R = devices;
  const int max_rows = 512;
  std::vector<Rank> ranks(static_cast<size_t>(R));
  std::vector<int> ids(static_cast<size_t>(R));
  std::vector<ncclComm_t> comms(static_cast<size_t>(R));
  for (int k = 0; k < R; ++k) ids[size_t(k)] = k;
  NCCL_OK(ncclCommInitAll(comms.data(), R, ids.data()));
  cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  for (int k = 0; k < R; ++k) {
    Rank& r = ranks[size_t(k)];
    r.device = k;
    r.comm = comms[size_t(k)];
    CUDA_OK(cudaSetDevice(k));
    CUDA_OK(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
    CUDA_OK(cudaEventCreate(&r.start));
    CUDA_OK(cudaEventCreate(&r.stop));
    CUBLAS_OK(cublasCreate(&r.blas));
    CUBLAS_OK(cublasSetStream(r.blas, r.stream));
    CUDA_OK(cudaMalloc(&r.blas_ws, 64u << 20));
    CUBLAS_OK(cublasSetWorkspace(r.blas, r.blas_ws, 64u << 20));
    flashspec_context_params params;
    flashspec_context_params_init(&params);
    params.backend = FLASHSPEC_BACKEND_CUDA;
    params.device_ordinal = k;
    params.cuda_stream = r.stream;
    params.max_rows = max_rows;
    params.max_requests = max_rows;
    params.seed = 1;
    FS_OK(nullptr, flashspec_context_create(&params, &r.ctx));
  }
  int nccl_version = 0;
  ncclGetVersion(&nccl_version);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::printf("devices: %d x %s, NCCL %d\n", R, prop.name, nccl_version);

  std::vector<int> vocabs = {128256, 151936};
  std::vector<int> hiddens = quick ? std::vector<int>{4096} : std::vector<int>{4096, 8192};
  std::vector<int> row_counts = quick ? std::vector<int>{1, 16, 64, 512} : std::vector<int>{1, 2, 5, 16, 64, 256, 512};
  if (only_v > 0) {
    vocabs = {only_v};
    hiddens = {only_d};
    row_counts = {std::min(max_rows, std::max(1, only_rows))};
  }
  Release release;
  std::vector<Result> results;
  for (int vocab : vocabs)
    for (int d : hiddens) {
      if (vocab % (4 * R) != 0) {
        std::fprintf(stderr, "V=%d is not a multiple of 4·R: skipped\n", vocab);
        continue;
      }
      const int slice = vocab / R;
      // Per rank: its slice of W, the hidden rows (the same on every rank,
      // as after the last tensor-parallel all-reduce), the gathered records,
      // and the gathered path's logits buffers.
      std::vector<__nv_bfloat16*> weight(static_cast<size_t>(R)), hidden(static_cast<size_t>(R));
      std::vector<unsigned char*> records(static_cast<size_t>(R));
      std::vector<float*> local(static_cast<size_t>(R)), gathered(static_cast<size_t>(R)), full(static_cast<size_t>(R)),
          probs(static_cast<size_t>(R));
      std::vector<flashspec_lm_head*> shard(static_cast<size_t>(R));
      flashspec_lm_head* half = nullptr;
      const float w_scale = 3.0f * std::sqrt(3.0f / float(d));
      for (int k = 0; k < R; ++k) {
        Rank& r = ranks[size_t(k)];
        CUDA_OK(cudaSetDevice(k));
        const size_t w_elems = size_t(slice) * size_t(d);
        CUDA_OK(cudaMalloc(&weight[size_t(k)], w_elems * 2));
        fill_bf16<<<4096, 256, 0, r.stream>>>(weight[size_t(k)], w_elems, w_scale, 100 + uint64_t(k));
        CUDA_OK(cudaMalloc(&hidden[size_t(k)], size_t(max_rows) * d * 2));
        fill_bf16<<<1024, 256, 0, r.stream>>>(hidden[size_t(k)], size_t(max_rows) * d, std::sqrt(3.0f), 7);
        CUDA_OK(cudaMalloc(&records[size_t(k)], size_t(R) * max_rows * kRecord));
        CUDA_OK(cudaMalloc(&local[size_t(k)], size_t(max_rows) * slice * 4));
        CUDA_OK(cudaMalloc(&gathered[size_t(k)], size_t(max_rows) * vocab * 4));
        CUDA_OK(cudaMalloc(&full[size_t(k)], size_t(max_rows) * vocab * 4));
        CUDA_OK(cudaMalloc(&probs[size_t(k)], size_t(max_rows) * vocab * 4));
        flashspec_tensor wt =
            flashspec_tensor_make(weight[size_t(k)], FLASHSPEC_DTYPE_BF16, FLASHSPEC_MEMORY_CUDA, slice, d);
        FS_OK(r.ctx, flashspec_lm_head_create_shard(r.ctx, &wt, FLASHSPEC_LM_HEAD_BORROW, int64_t(k) * slice, vocab,
                                                    &shard[size_t(k)]));
        if (k == 0) FS_OK(r.ctx, flashspec_lm_head_create(r.ctx, &wt, FLASHSPEC_LM_HEAD_BORROW, &half));
        CUDA_OK(cudaStreamSynchronize(r.stream));
      }

      for (int rows : row_counts) {
        // As bench.cu: rows % 4 == 0 → rows/4 requests of 3 drafts; else one
        // request of rows − 1 drafts.
        const int n = rows % 4 == 0 ? 3 : rows - 1;
        const int requests = rows / (n + 1);
        std::vector<int32_t> offsets(size_t(requests) + 1), tokens(size_t(std::max(1, requests * n)));
        for (int q = 0; q <= requests; ++q) offsets[size_t(q)] = q * n;
        for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 2654435761u) % uint32_t(vocab));
        std::vector<int32_t*> d_off(static_cast<size_t>(R)), d_tok(static_cast<size_t>(R)), d_acc(static_cast<size_t>(R)),
            d_emit(static_cast<size_t>(R)), d_out(static_cast<size_t>(R));
        std::vector<flashspec_tensor> hv(static_cast<size_t>(R));
        for (int k = 0; k < R; ++k) {
          CUDA_OK(cudaSetDevice(k));
          CUDA_OK(cudaMalloc(&d_off[size_t(k)], offsets.size() * 4));
          CUDA_OK(cudaMalloc(&d_tok[size_t(k)], tokens.size() * 4));
          CUDA_OK(cudaMalloc(&d_acc[size_t(k)], size_t(requests) * 4));
          CUDA_OK(cudaMalloc(&d_emit[size_t(k)], size_t(rows) * 4));
          CUDA_OK(cudaMalloc(&d_out[size_t(k)], size_t(rows) * 4));
          CUDA_OK(cudaMemcpy(d_off[size_t(k)], offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice));
          CUDA_OK(cudaMemcpy(d_tok[size_t(k)], tokens.data(), tokens.size() * 4, cudaMemcpyHostToDevice));
          hv[size_t(k)] = flashspec_tensor_make(hidden[size_t(k)], FLASHSPEC_DTYPE_BF16, FLASHSPEC_MEMORY_CUDA, rows, d);
        }
        auto batch_of = [&](size_t k) {
          flashspec_verify_batch b;
          flashspec_verify_batch_init(&b);
          b.memory = FLASHSPEC_MEMORY_CUDA;
          b.num_requests = requests;
          b.draft_offsets = d_off[k];
          b.draft_tokens = d_tok[k];
          b.target_hidden = &hv[k];
          b.max_draft_len = std::max(1, n);
          return b;
        };
        auto result_of = [&](size_t k) {
          flashspec_verify_result res;
          flashspec_verify_result_init(&res);
          res.memory = FLASHSPEC_MEMORY_CUDA;
          res.accepted_counts = d_acc[k];
          res.emitted_tokens = d_emit[k];
          return res;
        };
        // One thread drives every rank: each phase runs for all ranks in
        // turn, and the NCCL calls of all ranks go in one group.
        auto verify_shards = [&](size_t k) {
          const flashspec_verify_batch b = batch_of(k);
          FS_OK(ranks[k].ctx, flashspec_verify_shard(ranks[k].ctx, shard[k], &b, records[k] + k * size_t(rows) * kRecord));
        };
        auto gather_records = [&](size_t k) {  // in place: each rank's slot is its send buffer
          NCCL_OK(ncclAllGather(records[k] + k * size_t(rows) * kRecord, records[k], size_t(rows) * kRecord, ncclUint8,
                                ranks[k].comm, ranks[k].stream));
        };
        auto finalize_shards = [&](size_t k) {
          const flashspec_verify_batch b = batch_of(k);
          const flashspec_verify_result res = result_of(k);
          FS_OK(ranks[k].ctx, flashspec_finalize_shards(ranks[k].ctx, &b, records[k], R, &res));
        };
        const float one = 1.0f, zero = 0.0f;
        auto slice_logits = [&](size_t k) {
          CUBLAS_OK(cublasGemmEx(ranks[k].blas, CUBLAS_OP_T, CUBLAS_OP_N, slice, rows, d, &one, weight[k], CUDA_R_16BF,
                                 d, hidden[k], CUDA_R_16BF, d, &zero, local[k], CUDA_R_32F, slice, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
        };
        auto gather_logits = [&](size_t k) {
          NCCL_OK(ncclAllGather(local[k], gathered[k], size_t(rows) * slice, ncclFloat32, ranks[k].comm,
                                ranks[k].stream));
        };
        auto standard_verify = [&](size_t k) {
          for (int j = 0; j < R; ++j)
            CUDA_OK(cudaMemcpy2DAsync(full[k] + size_t(j) * slice, size_t(vocab) * 4,
                                      gathered[k] + size_t(j) * rows * slice, size_t(slice) * 4, size_t(slice) * 4,
                                      size_t(rows), cudaMemcpyDeviceToDevice, ranks[k].stream));
          cudaStream_t s = ranks[k].stream;
          softmax_kernel<<<rows, kRowThreads, 0, s>>>(full[k], probs[k], vocab, 1.0f);
          accept_kernel<<<(requests + 127) / 128, 128, 0, s>>>(probs[k], d_tok[k], requests, n, vocab, d_acc[k]);
          if (n > 0) sample_kernel<<<requests * n, kRowThreads, 0, s>>>(probs[k], d_tok[k], n, vocab, 0, d_out[k]);
          sample_kernel<<<requests, kRowThreads, 0, s>>>(probs[k], d_tok[k], n, vocab, 1, d_out[k] + requests * n);
        };
        auto for_all = [&](const std::function<void(size_t)>& phase) {
          for (size_t j = 0; j < ranks.size(); ++j) {
            CUDA_OK(cudaSetDevice(ranks[j].device));
            phase(j);
          }
        };
        auto collective = [&](const std::function<void(size_t)>& phase) {
          NCCL_OK(ncclGroupStart());
          for_all(phase);
          NCCL_OK(ncclGroupEnd());
        };
        // Release::step asks for rank k's work rank by rank; the whole step
        // is queued at the last rank's turn.
        auto whole_step = [&](const std::function<void()>& queue) {
          return [&ranks, queue](size_t k) {
            if (k + 1 == ranks.size()) queue();
          };
        };
        Result res;
        res.vocab = vocab;
        res.d = d;
        res.rows = rows;
        res.ranks = R;
        res.sharded_ms = release.median(ranks, reps, whole_step([&] {
          for_all(verify_shards);
          collective(gather_records);
          for_all(finalize_shards);
        }));
        // Every rank's finalize gives the same tokens.
        res.mismatches = 0;
        std::vector<int32_t> first(static_cast<size_t>(rows)), other(static_cast<size_t>(rows));
        for (int k = 0; k < R; ++k) {
          CUDA_OK(cudaSetDevice(k));
          CUDA_OK(cudaMemcpy(k == 0 ? first.data() : other.data(), d_emit[size_t(k)], size_t(rows) * 4,
                             cudaMemcpyDeviceToHost));
          if (k > 0)
            for (int i = 0; i < rows; ++i) res.mismatches += first[size_t(i)] != other[size_t(i)];
        }
        res.gathered_ms = release.median(ranks, reps, whole_step([&] {
          for_all(slice_logits);
          collective(gather_logits);
          for_all(standard_verify);
        }));
        std::vector<Rank> one_rank = {ranks[0]};
        res.half_ms = release.median(one_rank, reps, [&](size_t) {
          const flashspec_verify_batch b = batch_of(0);
          const flashspec_verify_result out = result_of(0);
          FS_OK(ranks[0].ctx, flashspec_verify_and_finalize(ranks[0].ctx, half, &b, &out));
        });
        res.sharded_bytes = double(R - 1) * rows * double(kRecord);
        res.gathered_bytes = double(R - 1) * rows * double(slice) * 4.0;
        results.push_back(res);
        std::printf("V=%6d d=%5d rows=%3d R=%d | sharded %.4f gathered %.4f half-V fused %.4f ms | gathered/sharded "
                    "%.2f sharded/half %.3f | bytes in per rank: records %.0f, logits %.0f%s\n",
                    vocab, d, rows, R, res.sharded_ms, res.gathered_ms, res.half_ms, res.gathered_ms / res.sharded_ms,
                    res.sharded_ms / res.half_ms, res.sharded_bytes, res.gathered_bytes,
                    res.mismatches ? " | RANKS DISAGREE" : "");
        std::fflush(stdout);
        for (int k = 0; k < R; ++k) {
          CUDA_OK(cudaSetDevice(k));
          for (void* p : {static_cast<void*>(d_off[size_t(k)]), static_cast<void*>(d_tok[size_t(k)]),
                          static_cast<void*>(d_acc[size_t(k)]), static_cast<void*>(d_emit[size_t(k)]),
                          static_cast<void*>(d_out[size_t(k)])})
            cudaFree(p);
        }
      }
      for (int k = 0; k < R; ++k) {
        CUDA_OK(cudaSetDevice(k));
        flashspec_lm_head_destroy(shard[size_t(k)]);
        for (void* p : {static_cast<void*>(weight[size_t(k)]), static_cast<void*>(hidden[size_t(k)]),
                        static_cast<void*>(records[size_t(k)]), static_cast<void*>(local[size_t(k)]),
                        static_cast<void*>(gathered[size_t(k)]), static_cast<void*>(full[size_t(k)]),
                        static_cast<void*>(probs[size_t(k)])})
          cudaFree(p);
      }
      flashspec_lm_head_destroy(half);
    }

  bool disagree = false;
  for (const Result& r : results) disagree |= r.mismatches != 0;
  std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  FILE* f = json.empty() ? nullptr : std::fopen(json.c_str(), "w");
  if (!json.empty() && !f) std::fprintf(stderr, "cannot write %s\n", json.c_str());
  if (f) {
    std::fprintf(f, "{\n  \"devices\": \"%d x %s\",\n  \"nccl\": %d,\n  \"date\": \"%s\",\n  \"reps\": %d,\n"
                 "  \"results\": [\n", R, prop.name, nccl_version, date, reps);
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      std::fprintf(f,
                   "    {\"V\": %d, \"d\": %d, \"rows\": %d, \"ranks\": %d, \"sharded_ms\": %.5f, "
                   "\"gathered_ms\": %.5f, \"half_vocab_fused_ms\": %.5f, \"gathered_over_sharded\": %.4f, "
                   "\"sharded_over_half\": %.4f, \"records_bytes_in_per_rank\": %.0f, "
                   "\"logits_bytes_in_per_rank\": %.0f, \"rank_mismatches\": %d}%s\n",
                   r.vocab, r.d, r.rows, r.ranks, r.sharded_ms, r.gathered_ms, r.half_ms,
                   r.gathered_ms / r.sharded_ms, r.sharded_ms / r.half_ms, r.sharded_bytes, r.gathered_bytes,
                   r.mismatches, i + 1 < results.size() ? "," : "");
    }
    std::fprintf(f, "  ]\n}\n");
    std::fclose(f);
  }
  for (Rank& r : ranks) {
    CUDA_OK(cudaSetDevice(r.device));
    flashspec_context_destroy(r.ctx);
    cublasDestroy(r.blas);
    cudaFree(r.blas_ws);
    ncclCommDestroy(r.comm);
  }
  return disagree ? 1 : 0;
}
