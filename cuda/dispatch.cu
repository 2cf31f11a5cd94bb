#include "dispatch.h"

#include <algorithm>
#include <atomic>
#include <string>

#include "codes.cuh"
#include "launch.cuh"
#include "scan.h"
#include "scan_gemm.h"
#include "scan_tiles.h"
#include "util/dtype.h"

namespace flashspec {
namespace cuda {
namespace {

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

std::atomic<bool> stream_rings_everywhere{false};
std::atomic<bool> many_row_chunks_only{false};

// Lets `kernel` have `dynamic` bytes of dynamic shared memory; false (and
// nothing set) where those and its static shared memory exceed max_smem.
bool opt_in_smem(const void* kernel, size_t dynamic, size_t max_smem) {
  cudaFuncAttributes attributes{};
  check_cuda(cudaFuncGetAttributes(&attributes, kernel), "cudaFuncGetAttributes");
  if (attributes.sharedSizeBytes + dynamic > max_smem) return false;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(dynamic)),
             "cudaFuncSetAttribute");
  return true;
}

// Partials per row a scan may write for `head`: at most one per 8 tokens.
int max_groups_for(const CudaLmHead& head) {
  return int(std::min<int64_t>(tuning::kMaxGroups, (head.vocab + 7) / 8));
}
// The TMA-ring scans' CTAs: one per SM.
int ring_ctas_for(const ScanLimits& limits, const CudaLmHead& head) {
  return std::min(max_groups_for(head), limits.sm_count);
}
int64_t row_bytes_of(const CudaLmHead& head) { return int64_t(head.d_load) * int64_t(dtype_size(head.dtype)); }
// Whether the 9–16-row TMA ring serves stream shape `shape` of `head`
// (tuning::stream_box_serves, or everywhere while the tests ask).
bool box_ring_serves(const ScanLimits& limits, const CudaLmHead& head, int shape) {
  return tuning::stream_box_serves(shape, row_bytes_of(head), head.vocab, ring_ctas_for(limits, head)) ||
         stream_rings_everywhere.load();
}

int occupancy(const void* kernel, int threads, size_t smem) {
  int blocks = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  return std::max(1, blocks);
}

ScanParams base_params(const ScanWorkspace& ws, const CudaLmHead& head, int rows) {
  ScanParams p = {};
  p.w = head.data;
  p.ldw = head.row_stride;
  p.w_dtype = head.dtype;
  p.w_scale = head.scales;
  p.vocab = int32_t(head.vocab);
  p.token_base = int32_t(head.vocab_begin);
  p.d_load = head.d_load;
  p.k_pad = head.staged_columns();
  p.h = ws.hidden;
  p.ring_hidden = ws.ring_hidden;
  p.tile_hidden = ws.tile_hidden;
  p.rows = rows;
  p.row_base = 0;
  p.plans = ws.plans;
  p.gumbel_bounds = ws.gumbel_bounds;
  p.partials = ws.partials;
  p.partial_stride = ws.max_rows;
  p.q_partials = ws.q_partials;
  p.residuals = ws.residuals;
  return p;
}

const void* mma_kernel_for(int shape, flashspec_dtype dtype) {
  const scan::MmaKernel& k = scan::mma_kernel(shape);
  return dtype == FLASHSPEC_DTYPE_BF16 ? k.bf16 : k.fp16;
}

cudaError_t launch_tiled(const void* kernel, const ScanParams& params, int grid, int threads, size_t smem,
                         bool cooperative, cudaStream_t stream) {
  ScanParams copy = params;
  void* args[] = {&copy};
  return launch(kernel, dim3(unsigned(grid)), dim3(unsigned(threads)), smem, cooperative, stream, args);
}

// Stochastic drafts: one CTA per SM (co-resident, cooperative launch), each
// keeping its token range's scaled logits of the launch's rows in shared
// memory. Rows beyond what fits go to further launches.
int scan_stochastic(const ScanLimits& limits, const CudaLmHead& head, bool tc, int rows, ScanParams p,
                    int max_groups, cudaStream_t stream) {
  const int groups = std::max(1, std::min(max_groups, limits.sm_count));
  const int64_t slice = round_up(((head.vocab + 7) / 8 + groups - 1) / groups * 8, 8);
  const int shape = tuning::mma_shape_for(rows);
  const scan::MmaKernel& mma = scan::mma_kernel(shape);
  const int bm = tc ? tuning::kMmaShapes[shape].bm : tuning::kSimtRows;
  const size_t base = tc ? mma.base_smem : scan::simt_base_smem();
  const size_t per_row = size_t(slice) * sizeof(float);
  int fit = limits.max_smem > base ? int((limits.max_smem - base) / per_row) : 0;
  fit = std::min(fit, bm);
  // The residual phase's scratch (2 floats per row, 64 for the warps) lives
  // in the tensor-core scan's pipeline buffers.
  if (tc) fit = std::min<int>(fit, int((mma.scratch_bytes / sizeof(float) - 64) / 2));
  require(fit >= 1, FLASHSPEC_ERR_UNSUPPORTED, Field::kDraftLogits,
          "the vocabulary (" + std::to_string(head.vocab) +
              ") is too large for the exact stochastic residual on this device: one row's share of the logits (" +
              std::to_string(per_row) + " bytes per CTA) does not fit in shared memory");
  p.groups = groups;
  p.row_blocks = 1;
  p.slice = int32_t(slice);
  const void* kernel = tc ? mma_kernel_for(shape, head.dtype) : scan::simt_kernel();
  const int threads = tc ? tuning::kMmaThreads : tuning::kSimtThreads;
  for (int first = 0; first < rows; first += fit) {
    p.row_base = first;
    p.rows = std::min(fit, rows - first);
    const size_t smem = base + size_t(p.rows) * per_row;
    check_cuda(launch_tiled(kernel, p, groups, threads, smem, true, stream), "scan (stochastic drafts)");
  }
  return groups;
}

// Whether the tile scan may serve `rows` rows of `head`: from 9 rows on
// sm_90a (8-bit heads: from 17), every row greedy (tuning.h:
// kTileScanMinRows, kTileScanMinCodeRows), unless the tests' switches give
// the ring scans every call they serve or the cuBLAS chunks the calls of
// more rows.
bool tiles_may_serve(const ScanLimits& limits, const CudaLmHead& head, bool tc, int rows, bool may_sample) {
  const int tiles_min_rows = head.codes() ? tuning::kTileScanMinCodeRows : tuning::kTileScanMinRows;
  return limits.tile_scan && tc && !may_sample && rows >= tiles_min_rows && !stream_rings_everywhere.load() &&
         (rows <= tuning::kStreamMaxRows || !many_row_chunks_only.load());
}

// The tile scan (scan_tiles.h) over `rows` rows, every one greedy
// (tiles_may_serve), where `head` allows it: a 16-bit or 8-bit head, rows
// of W and of the staged hidden rows that tensor maps can describe. False,
// and nothing launched, where it does not: another scan serves the call.
bool launch_tile_scan(const ScanLimits& limits, const CudaLmHead& head, int rows, int max_groups, ScanParams& p,
                      cudaStream_t stream) {
  // Tiles of rows in pairs share W's boxes (tuning.h: kTileScanPairs).
  const int tile_pairs = tuning::kTileScanPairs && !head.codes() ? limits.tile_pairs : 0;
  const tile_scan::Form form =
      tile_scan::form_for(head.dtype, rows, p.vocab, limits.sm_count, max_groups, tile_pairs);
  const void* kernel = tile_scan::kernel_for(head.dtype, form);
  tile_scan::TileMaps maps;
  if (!kernel || !tile_scan::encode_maps(p, form, &maps)) return false;
  p.groups = tile_scan::groups_for(form, rows, p.vocab, limits.sm_count, max_groups, tile_pairs);
  p.row_blocks = 1;
  check_cuda(tile_scan::launch(kernel, form, p, maps, stream), "scan (tiles)");
  return true;
}

}  // namespace

ScanLimits configure_scans(int device) {
  ScanLimits limits;
  check_cuda(cudaDeviceGetAttribute(&limits.sm_count, cudaDevAttrMultiProcessorCount, device),
             "cudaDeviceGetAttribute");
  int optin = 0;
  check_cuda(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
             "cudaDeviceGetAttribute");
  limits.max_smem = size_t(optin);

  // The tiled scans may use all the shared memory a block can have (kept
  // logits of stochastic drafts).
  for (int shape = 0; shape < tuning::kMmaShapeCount; ++shape) {
    const scan::MmaKernel& k = scan::mma_kernel(shape);
    for (const void* kernel : {k.bf16, k.fp16})
      check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin),
                 "cudaFuncSetAttribute");
    limits.mma_blocks_per_sm[shape] = occupancy(k.bf16, tuning::kMmaThreads, k.base_smem);
  }
  check_cuda(cudaFuncSetAttribute(scan::simt_kernel(), cudaFuncAttributeMaxDynamicSharedMemorySize, optin),
             "cudaFuncSetAttribute");
  limits.simt_blocks_per_sm = occupancy(scan::simt_kernel(), tuning::kSimtThreads, scan::simt_base_smem());

  // The weight-streaming scans re-read the hidden rows (up to 16 × d × 2
  // bytes) from L1 for every tile: ask for the smallest shared-memory
  // carveout that still holds their resident CTAs, leaving the rest to L1.
  int smem_per_sm = 0, reserved_per_block = 0;
  check_cuda(cudaDeviceGetAttribute(&smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device),
             "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&reserved_per_block, cudaDevAttrReservedSharedMemoryPerBlock, device),
             "cudaDeviceGetAttribute");
  for (int shape = 0; shape < tuning::kStreamShapeCount; ++shape)
    for (flashspec_dtype dtype : {FLASHSPEC_DTYPE_BF16, FLASHSPEC_DTYPE_F16, FLASHSPEC_DTYPE_E4M3, FLASHSPEC_DTYPE_I8}) {
      const void* kernel = scan::stream_kernel(shape, dtype);
      const int blocks = occupancy(kernel, tuning::kStreamThreads, 0);
      cudaFuncAttributes attributes{};
      check_cuda(cudaFuncGetAttributes(&attributes, kernel), "cudaFuncGetAttributes");
      const int needed = blocks * (int(attributes.sharedSizeBytes) + reserved_per_block);
      const int percent = std::min(100, (100 * needed + smem_per_sm - 1) / std::max(1, smem_per_sm));
      check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, percent),
                 "cudaFuncSetAttribute (carveout)");
      limits.stream_blocks_per_sm[shape][dtype] = occupancy(kernel, tuning::kStreamThreads, 0);
    }

#ifdef FLASHSPEC_WGMMA
  int major = 0, minor = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), "cudaDeviceGetAttribute");
  if (major == 9 && minor == 0) {
    limits.stream_box = limits.stream_box_codes = true;
    limits.stream_wide = true;
    for (flashspec_dtype dtype : {FLASHSPEC_DTYPE_BF16, FLASHSPEC_DTYPE_F16, FLASHSPEC_DTYPE_E4M3, FLASHSPEC_DTYPE_I8}) {
      for (int shape = 0; shape < tuning::kStreamShapeCount; ++shape)
        for (bool hand_off : {false, true}) {
          const void* kernel = scan::stream_box_kernel(shape, dtype, hand_off);
          bool& on = is_codes(dtype) ? limits.stream_box_codes : limits.stream_box;
          if (kernel && !opt_in_smem(kernel, scan::stream_box_smem(dtype), limits.max_smem)) on = false;
        }
      const void* wide = scan::stream_wide_kernel(dtype);
      if (wide && !opt_in_smem(wide, scan::stream_wide_smem(), limits.max_smem)) limits.stream_wide = false;
    }
    limits.tile_scan = true;
    for (flashspec_dtype dtype : {FLASHSPEC_DTYPE_BF16, FLASHSPEC_DTYPE_F16, FLASHSPEC_DTYPE_E4M3, FLASHSPEC_DTYPE_I8})
      for (tile_scan::Form form : tile_scan::kForms) {
        const void* kernel = tile_scan::kernel_for(dtype, form);
        if (kernel && !opt_in_smem(kernel, tile_scan::smem_bytes(dtype, form), limits.max_smem))
          limits.tile_scan = false;
      }
    if (limits.tile_scan)
      limits.tile_pairs = std::min(tile_scan::max_pairs(tile_scan::Form::kTile64x256Paired),
                                   tile_scan::max_pairs(tile_scan::Form::kTile128x128Paired));
  }
#endif
  return limits;
}

bool scan_reads_ring_order(const ScanLimits& limits, const CudaLmHead& head, bool tensor_cores, int rows) {
  if (!tensor_cores || !head.codes() || !limits.stream_box_codes || rows > tuning::kStreamMaxRows) return false;
  const int shape = tuning::stream_shape_for(rows);
  return scan::stream_box_kernel(shape, head.dtype, false) != nullptr && box_ring_serves(limits, head, shape);
}

bool scan_reads_tile_f16(const ScanLimits& limits, const CudaLmHead& head, bool tensor_cores, int rows,
                         bool may_sample) {
  return head.codes() && tiles_may_serve(limits, head, tensor_cores, rows, may_sample);
}

void set_stream_rings_everywhere(bool on) { stream_rings_everywhere.store(on); }

void set_many_row_chunks_only(bool on) { many_row_chunks_only.store(on); }

int32_t gemm_chunk_tokens(int32_t max_rows) {
  return gemm_scan::chunk_tokens(max_rows, int64_t(tuning::kGemmWorkspaceBytes / sizeof(float)));
}

ScanOutcome run_scan(const ScanLimits& limits, const ScanWorkspace& ws, const CudaLmHead& head, bool tc, int rows,
                     bool may_sample, const StochasticDrafts* drafts, const StreamTail& tail, cudaStream_t stream) {
  ScanParams p = base_params(ws, head, rows);
  const int max_groups = max_groups_for(head);
  if (drafts) {
    p.stochastic = 1;
    p.drafts = *drafts;
    return ScanOutcome{scan_stochastic(limits, head, tc, rows, p, max_groups, stream), false};
  }
  const int ring_ctas = ring_ctas_for(limits, head);
  const int64_t row_bytes = row_bytes_of(head);
  // The GEMM whose epilogue folds, where it serves, before the 9–16-row and
  // 17–64-row scans.
  if (tiles_may_serve(limits, head, tc, rows, may_sample) && launch_tile_scan(limits, head, rows, max_groups, p, stream))
    return ScanOutcome{p.groups, false};
  if (tc && rows <= tuning::kStreamMaxRows) {
    const int shape = tuning::stream_shape_for(rows);
    scan::StreamMaps maps;
    const int ring_blocks = scan::stream_blocks(p.vocab, ring_ctas);
    const bool hand_off = may_sample && tuning::stream_box_hands_off(p.vocab, ring_blocks);
    const bool box_on = head.codes() ? limits.stream_box_codes : limits.stream_box;
    const void* box = box_on ? scan::stream_box_kernel(shape, head.dtype, hand_off) : nullptr;
    if (box && box_ring_serves(limits, head, shape) && scan::stream_box_maps(p, &maps)) {
      const int blocks = ring_blocks;
      p.groups = blocks;
      p.row_blocks = 1;
      check_cuda(scan::launch_stream_box(box, p, tail, maps, blocks, stream), "scan (weight stream, TMA)");
      return ScanOutcome{blocks, true};
    }
    const int max_blocks = std::min(max_groups, limits.sm_count * limits.stream_blocks_per_sm[shape][head.dtype]);
    const int blocks = scan::stream_blocks(p.vocab, max_blocks);
    p.groups = blocks;
    p.row_blocks = 1;
    check_cuda(scan::launch_stream(scan::stream_kernel(shape, head.dtype), p, tail, blocks, stream),
               "scan (weight stream)");
    return ScanOutcome{blocks, true};
  }
  const void* wide = limits.stream_wide && tc && rows <= tuning::kStreamWideMaxRows
                         ? scan::stream_wide_kernel(head.dtype)
                         : nullptr;
  scan::StreamMaps wide_maps;
  if (wide && (tuning::stream_wide_serves(rows, p.vocab, row_bytes, ring_ctas) || stream_rings_everywhere.load()) &&
      scan::stream_box_maps(p, &wide_maps)) {
    const int blocks = scan::stream_blocks(p.vocab, ring_ctas);
    p.groups = blocks;
    p.row_blocks = 1;
    check_cuda(scan::launch_stream_wide(wide, p, tail, wide_maps, blocks, stream),
               "scan (weight stream, TMA, 17-64 rows)");
    return ScanOutcome{blocks, true};
  }
  if (tc && ws.cublas) {
    require(!head.codes() || ws.dequantized, FLASHSPEC_ERR_WORKSPACE_EXCEEDED, Field::kHead,
            "an 8-bit head needs a workspace this context reserves when the head is created on it");
    const int32_t chunk = gemm_scan::chunk_tokens(rows, ws.chunks.capacity);
    const gemm_scan::Request r{p,
                               int32_t(head.hidden),
                               ws.cublas,
                               ws.chunks,
                               chunk,
                               ws.dequantized,
                               ws.gumbel_bounds,
                               gemm_scan::product_sms(rows, limits.sm_count)};
    const gemm_scan::Status status = gemm_scan::scan(r, stream);
    if (status.cuda != cudaSuccess) cuda_fail(status.cuda, std::string("scan (cuBLAS chunks): ") + status.what);
    if (status.what) fail(FLASHSPEC_ERR_CUDA, std::string("scan (cuBLAS chunks): cublasGemmEx: ") + status.what);
    return ScanOutcome{gemm_scan::groups_for(p.vocab, chunk, rows), false};
  }
  if (tc && !head.codes()) {
    const int shape = tuning::mma_shape_for(rows);
    const int bm = tuning::kMmaShapes[shape].bm;
    const int row_blocks = (rows + bm - 1) / bm;
    const int slots = limits.sm_count * limits.mma_blocks_per_sm[shape];
    const int groups = std::max(1, std::min(max_groups, slots / row_blocks));
    p.groups = groups;
    p.row_blocks = row_blocks;
    check_cuda(launch_tiled(mma_kernel_for(shape, head.dtype), p, groups * row_blocks, tuning::kMmaThreads,
                            scan::mma_kernel(shape).base_smem, false, stream),
               "scan (tensor cores)");
    return ScanOutcome{groups, false};
  }
  const int groups = std::max(1, std::min(max_groups, limits.sm_count * limits.simt_blocks_per_sm));
  p.groups = groups;
  p.row_blocks = 1;
  for (int base = 0; base < rows; base += tuning::kSimtRows) {
    p.row_base = base;
    p.rows = std::min(tuning::kSimtRows, rows - base);
    check_cuda(launch_tiled(scan::simt_kernel(), p, groups, tuning::kSimtThreads, scan::simt_base_smem(), false,
                            stream),
               "scan (CUDA cores)");
  }
  return ScanOutcome{groups, false};
}

}  // namespace cuda
}  // namespace flashspec
