// The Hopper primitives the prefill kernel uses. CUTLASS/CuTe provides the wgmma atoms, the warpgroup
// fences, setmaxnreg and the mbarrier operations; this file adds what they lack: a compiler memory
// fence after mbarrier waits (CUTLASS's wait asm has no "memory" clobber, so plain shared loads could
// be hoisted above it), ldmatrix.trans, 32-bit-address shared stores, the 16-byte zero-filling cp.async with an L2 prefetch hint,
// and named barriers with an OR reduction. The wgmma atoms are mma.cuh's, the swizzle and its
// descriptors swizzle.cuh's.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

namespace sparse_mla::sm90::prefill {

using cutlass::arch::ClusterBarrier;

// Programmatic dependent launch (a token-grouped call's launches, launch.cuh). A grid launched with
// programmatic stream serialization may start once every CTA of the grid ahead of it in the stream
// has called allow_dependent_grid() or exited; wait_for_grid_ahead() blocks the thread until that grid
// has completed and its writes are visible. In a grid launched without it, both do nothing.
__device__ __forceinline__ void allow_dependent_grid() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
__device__ __forceinline__ void wait_for_grid_ahead() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

// Launches `kernel` on `stream`, with programmatic stream serialization where `after_grid_ahead`
// (the kernel then relies on the two calls above), plainly otherwise.
template <typename Kernel, typename Params>
cudaError_t launch_kernel(Kernel kernel, const Params& params, unsigned grid, unsigned threads, size_t smem_bytes,
                          cudaStream_t stream, bool after_grid_ahead) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute overlap;
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &overlap;
  config.numAttrs = after_grid_ahead ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, params);
}

// A call's counters (the tail split's, the token groups' unit lists'), zeroed ahead of the kernel that
// counts in them, which is launched after it with programmatic stream serialization and waits for it
// (wait_for_grid_ahead) only right before its first atomic: so that kernel's launch and everything
// it does before overlap this one's whole life, where a fill by the caller (torch.zeros) would sit
// ahead of it until its last block exited. Launched plainly, it begins after everything ahead of it on
// the stream, so what the counting kernel reads before its wait was written before this one began.
struct Counts {
  int32_t* data;
  int n;
};
static __global__ void prefill_kernel_zero_counts(const Counts counts) {
  allow_dependent_grid();
  for (int i = threadIdx.x; i < counts.n; i += blockDim.x) counts.data[i] = 0;
}
static cudaError_t launch_zero_counts(int32_t* data, int n, cudaStream_t stream) {
  return launch_kernel(prefill_kernel_zero_counts, Counts{data, n}, 1, 256, 0, stream, false);
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// A consumer thread's place: its warpgroup and warp in it, taken from lane 0 so that ptxas knows them
// warp-uniform and keeps them in uniform registers (recomputing them from threadIdx inside the pair
// loop costs an S2R each time), its lane, and the fragment coordinates g = lane / 4, c = lane % 4.
struct ConsumerThread {
  int wg, warp, lane, g, c;
};

__device__ __forceinline__ ConsumerThread consumer_thread() {
  const int lane = threadIdx.x % 32;
  return {cutlass::canonical_warp_group_idx(), cutlass::canonical_warp_idx_sync() % 4, lane, lane / 4, lane % 4};
}
// The same from the thread index alone, without the warp shuffles that tell the compiler wg and warp
// are warp-uniform: for the softmax, whose first addresses would wait for the shuffles' latency.
__device__ __forceinline__ ConsumerThread consumer_thread_of_index() {
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32;
  return {tid / 128, (tid / 32) % 4, lane, lane / 4, lane % 4};
}

// Waits for the phase with parity `phase` of an mbarrier; later shared-memory accesses stay after it.
__device__ __forceinline__ void mbarrier_wait(const uint64_t* bar, uint32_t phase) {
  ClusterBarrier::wait(bar, phase);
  asm volatile("" ::: "memory");
}

// Arrives on an mbarrier (release: this thread's earlier shared-memory accesses are ordered before the
// phase completes); the "memory" clobber keeps the compiler from moving plain accesses past it.
__device__ __forceinline__ void mbarrier_arrive(const uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

// 16 bytes global -> shared; an invalid source is zero-filled and never read. The hint lets L2 fetch
// the 128-byte block around the chunk: a gathered row of 576 bytes spans five such blocks (640
// bytes) but three of 256 bytes (768). Where kv does not fit L2 the narrow tiles gather at DRAM's
// pace, and the wider hint's extra bytes slow them; the wide tile is indifferent (docs/lab.md,
// Experiment 69).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_size)
               : "memory");
}

// 8 bytes global -> shared (through L1: neighbouring threads read the same word).
__device__ __forceinline__ void cp_async_8(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(src) : "memory");
}

// Arrives on an mbarrier once every cp.async this thread issued before has landed (the copies'
// completion is the arrival: the thread does not wait). The barrier's count includes it (noinc).
__device__ __forceinline__ void cp_async_arrive_noinc(const uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

// Closes this thread's group of cp.asyncs issued since the last commit.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most N of this thread's committed cp.async groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

template <int ID, int THREADS>
__device__ __forceinline__ void named_barrier_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(ID), "n"(THREADS) : "memory");
}

// bar.red.or: a barrier that also returns whether `pred` was true in any participating thread.
template <int ID, int THREADS>
__device__ __forceinline__ bool named_barrier_sync_or(bool pred) {
  uint32_t out;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\nbar.red.or.pred q, %2, %3, p;\nselp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(out)
      : "r"(static_cast<uint32_t>(pred)), "n"(ID), "n"(THREADS)
      : "memory");
  return out != 0;
}

// Four 8x8 b16 matrices, transposed: thread t receives, of matrix i (rows addressed by threads
// 8i..8i+7), the elements (row 2(t%4), column t/4) in the low half and (row 2(t%4)+1, column t/4)
// in the high half of x[i].
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t (&x)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])
               : "r"(addr)
               : "memory");
}

// A 4-byte shared store through a 32-bit shared address (a generic pointer would take 2 registers).
__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t value) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(value) : "memory");
}

// 16-byte shared load and store through a 32-bit shared address.
__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ void st_shared_v4(uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

__device__ __forceinline__ float2 ld_shared_f32x2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
  return v;
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t selector) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(selector));
  return r;
}

// max(a, b), NaN if either is (fmaxf returns the other operand): a NaN logit reaches max_logits as it
// reaches out and lse.
__device__ __forceinline__ float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// Fragment coordinates of a warpgroup's m64nNk32 accumulator, for warp `warp` of the warpgroup and
// g = lane / 4, c = lane % 4: a thread's element 4j + 2h + e lies at row frag_row(warp, g, h) and
// column frag_col(c, j, e). The S accumulator's rows are heads and its columns slots; the O^T
// accumulator's columns are heads (its rows, dims, are permuted: consumer.cuh).
__device__ __forceinline__ int frag_row(int warp, int g, int h) { return 16 * warp + g + 8 * h; }
__device__ __forceinline__ int frag_col(int c, int j, int e) { return 8 * j + 2 * c + e; }

// The max and the sum over the 4 threads of an accumulator row (lanes 4g .. 4g + 3), in each of them.
__device__ __forceinline__ float quad_max(float x) {
  x = max_nan(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return max_nan(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two floats -> two e4m3 (saturating to +-448), the first in the low byte.
__device__ __forceinline__ uint32_t to_e4m3x2(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;\n" : "=h"(r) : "f"(lo), "f"(hi));
  return r;
}

}  // namespace sparse_mla::sm90::prefill
