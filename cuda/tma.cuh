// Hopper's tensor-memory accelerator (TMA) and the shared-memory barriers
// that count its bytes: what the weight-streaming scan needs to move W into
// shared memory in whole boxes, with no registers holding loads in flight.
// Every function is a single PTX instruction (or a wait loop around one);
// on architectures before sm_90 they compile to nothing and their callers
// are never launched there (dispatch checks the device).
#pragma once

#include <cuda.h>

#include <cstdint>

namespace flashspec {
namespace cuda {
namespace tma {

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

// 16 bytes of shared memory at a 16-byte-aligned shared address; ordered
// after the barrier waits before it (the "memory" clobber).
__device__ __forceinline__ uint4 load_shared_16(uint32_t address) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(address)
               : "memory");
  return v;
}

// An mbarrier whose phases complete after `arrivals` arrivals (and the
// bytes any expect_tx announced).
__device__ __forceinline__ void barrier_init(uint64_t* bar, uint32_t arrivals) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(arrivals) : "memory");
#endif
}

// One arrival on `bar`.
__device__ __forceinline__ void barrier_arrive(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
#endif
}

// Makes initialised barriers visible to the copy engine (the async proxy).
__device__ __forceinline__ void barrier_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Makes this thread's stores to shared memory visible to the async proxy
// (the copy engine, warpgroup MMAs) after a barrier.
__device__ __forceinline__ void shared_stores_to_async_proxy() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Zeroes bytes [first_byte, panel_bytes) of each of `panels` panels of
// shared memory (panel i at panel(i), 16-byte aligned) with all the block's
// threads, and orders the zeros before the async proxy's later accesses
// (behind the caller's barrier). The scans' MMAs read rows past a launch's
// that their TMA boxes of just the launch's rows leave unwritten: boxes
// reaching past a tensor's rows, filled with zeros by the copy engine,
// arrive at a fraction of the rate (bench/RESULTS.md).
template <class Panel>
__device__ __forceinline__ void zero_panel_tails(int panels, int panel_bytes, int first_byte, Panel&& panel) {
  const int first_word = first_byte / 16, words = panel_bytes / 16 - first_word;
  for (int i = threadIdx.x; i < panels * words; i += blockDim.x)
    reinterpret_cast<uint4*>(panel(i / words))[first_word + i % words] = make_uint4(0u, 0u, 0u, 0u);
  shared_stores_to_async_proxy();
}

// Arrives on `bar` and tells it `bytes` more will land in this phase.
__device__ __forceinline__ void barrier_expect(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)),
               "r"(bytes)
               : "memory");
#endif
}

// Waits until the phase of `bar` with this parity has completed.
__device__ __forceinline__ void barrier_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n"
      "}\n" ::"r"(smem_address(bar)),
      "r"(parity)
      : "memory");
#endif
}

// An L2 policy that evicts first what it covers: for data read once (W),
// so that it does not push out what is read again.
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
#endif
  return policy;
}

// An L2 policy that keeps what it covers as long as it can: for data every
// CTA reads (the hidden rows).
__device__ __forceinline__ uint64_t evict_last_policy() {
  uint64_t policy = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
#endif
  return policy;
}

// Copies the box of a 2-D tensor map at coordinates (x, y) (innermost first)
// into shared memory at dst under the L2 policy `policy`; its bytes complete
// a phase of `bar`. Elements outside the tensor arrive as zeros (and count
// as bytes of the box).
__device__ __forceinline__ void load_box_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int x, int y,
                                            uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4}], [%2], %5;\n" ::"r"(smem_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_address(bar)), "r"(x), "r"(y), "l"(policy)
      : "memory");
#endif
}

// The same box copied into the shared memory of each CTA of the cluster
// in cta_mask (bit r: the CTA of rank r), at dst's offset in each; its bytes
// complete a phase of the barrier at bar's offset in each.
__device__ __forceinline__ void load_box_2d_multicast(void* dst, const CUtensorMap* map, uint64_t* bar, int x, int y,
                                                      uint16_t cta_mask, uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      ".L2::cache_hint [%0], [%1, {%3, %4}], [%2], %5, %6;\n" ::"r"(smem_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_address(bar)), "r"(x), "r"(y), "h"(cta_mask), "l"(policy)
      : "memory");
#endif
}

// This CTA's rank in its cluster.
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t rank = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
#endif
  return rank;
}

// One arrival on the barrier at bar's offset in the shared memory of the
// cluster's CTA of rank cta_rank (release at the CTA's scope, as
// barrier_arrive: what it orders is the arriving warp's finished MMAs'
// reads of a stage, not memory another CTA reads).
__device__ __forceinline__ void barrier_arrive_in(uint64_t* bar, uint32_t cta_rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(smem_address(bar)),
      "r"(cta_rank)
      : "memory");
#endif
}

// Waits until every thread of the cluster that has not exited has arrived
// here; what each did before is visible to all after.
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
#endif
}

}  // namespace tma
}  // namespace cuda
}  // namespace flashspec
