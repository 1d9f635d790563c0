// Litmus test: do the tensor cores (async proxy) ever read a stage that cp.async (generic proxy) has
// just refilled, as the prefill kernel refills it, before the new bytes are visible to them?
//
// One stage of the kernel's layout (64 rows x 64 e4m3, the 64-byte swizzle, 1024-byte aligned) is
// refilled over and over by a producer warpgroup through the kernel's own load path (cp_async_16 into
// swizzled_offset, then an mbarrier handoff), alternately with rows of 1.0 and of 2.0. A consumer
// warpgroup waits for each refill and reads the stage at once with an SS wgmma (Q = 1.0, one k-step:
// every accumulator is 32 x the stage's value); a result equal to the other pattern, or to neither,
// is stale. Each CTA counts stale refills; every SM runs one CTA.
//
// Modes (argv[1]):
//   noinc     today's kernel: cp.async.mbarrier.arrive.noinc, no proxy fence
//   producer  cp.async.wait_all, fence.proxy.async.shared::cta, then a plain arrive
//   consumer  noinc arrive; the consumer fences after its wait, before the wgmma
// Also printed: the consumer's mean cycles per refill, i.e. the handoff latency each mode adds.
//
// Build and run on an SM90 GPU (nvcc 12.3+, CUTLASS headers from the nvidia-cutlass wheel):
//   nvcc -std=c++17 -arch=sm_90a -O3 -I include -I $CUTLASS/include \
//        benchmarks/experiments/proxy_fence/litmus.cu -o litmus && ./litmus noinc && ./litmus producer
#include <cstdio>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

#include <sparse_mla/sm90/prefill/primitives.cuh>
#include <sparse_mla/sm90/prefill/traits.cuh>

using namespace sparse_mla::sm90::prefill;

enum Mode { kNoinc = 0, kProducer = 1, kConsumer = 2 };
constexpr int ROWS = 64, ROW_BYTES = 64, TILE = ROWS * ROW_BYTES;
constexpr uint8_t E4M3_ONE = 0x38, E4M3_TWO = 0x40;

struct Shared {
  alignas(1024) uint8_t q[TILE];
  alignas(1024) uint8_t kv[TILE];
  uint64_t kv_full, kv_empty;
};

__global__ void __launch_bounds__(256, 1) litmus(const uint8_t* patterns, int refills, int mode,
                                                 unsigned long long* stale, unsigned long long* cycles) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  Shared& ss = *reinterpret_cast<Shared*>(smem_raw);
  const int t = threadIdx.x % 128;
  if (threadIdx.x < 128) {
    for (int i = t; i < TILE; i += 128) ss.q[i] = E4M3_ONE;  // swizzle-free: every byte is 1.0
  }
  if (threadIdx.x == 0) {
    ClusterBarrier::init(&ss.kv_full, 128);
    ClusterBarrier::init(&ss.kv_empty, 128);
  }
  cutlass::arch::fence_view_async_shared();  // Q: generic stores -> wgmma reads
  __syncthreads();

  if (threadIdx.x >= 128) {  // producer: two 16-byte chunks per thread per refill
    for (int i = 0; i < refills; ++i) {
      if (i > 0) mbarrier_wait(&ss.kv_empty, (i - 1) & 1);
      const uint8_t* src = patterns + (i & 1) * TILE;
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int chunk = t + 128 * k, row = chunk / 4, c = chunk % 4;
        cp_async_16(smem_addr(ss.kv) + swizzled_offset(row, c, ROWS), src + row * ROW_BYTES + c * 16, true);
      }
      if (mode == kProducer) {
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        cutlass::arch::fence_view_async_shared();
        mbarrier_arrive(&ss.kv_full);
      } else {
        cutlass::arch::cpasync_barrier_arrive_noinc(&ss.kv_full);
      }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
  } else {  // consumer
    unsigned long long bad = 0;
    const long long start = clock64();
    for (int i = 0; i < refills; ++i) {
      mbarrier_wait(&ss.kv_full, i & 1);
      if (mode == kConsumer) cutlass::arch::fence_view_async_shared();
      float d[32];
#pragma unroll
      for (int j = 0; j < 32; ++j) d[j] = 0.f;
      cute::warpgroup_arrive();
      wgmma_64x64x32_ss(d, desc_sw64(desc_sw64_lo(smem_addr(ss.q))), desc_sw64(desc_sw64_lo(smem_addr(ss.kv))), false);
      cute::warpgroup_commit_batch();
      cute::warpgroup_wait<0>();
      fence_operands(d);
      const float expected = (i & 1) ? 64.f : 32.f;  // 32 x 2.0 or 32 x 1.0
      bool ok = true;
#pragma unroll
      for (int j = 0; j < 32; ++j) ok = ok && d[j] == expected;
      bad += !ok;
      mbarrier_arrive(&ss.kv_empty);
    }
    const long long elapsed = clock64() - start;
    atomicAdd(stale, bad);
    if (t == 0) atomicAdd(cycles, static_cast<unsigned long long>(elapsed));
  }
}

int main(int argc, char** argv) {
  const char* names[] = {"noinc", "producer", "consumer"};
  int mode = -1;
  for (int m = 0; m < 3; ++m) {
    if (argc > 1 && std::strcmp(argv[1], names[m]) == 0) mode = m;
  }
  if (mode < 0) {
    std::fprintf(stderr, "usage: %s noinc|producer|consumer [refills per CTA]\n", argv[0]);
    return 2;
  }
  const int refills = argc > 2 ? std::atoi(argv[2]) : 200000;
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  std::vector<uint8_t> host(2 * TILE);
  std::memset(host.data(), E4M3_ONE, TILE);
  std::memset(host.data() + TILE, E4M3_TWO, TILE);
  uint8_t* patterns;
  unsigned long long* counters;
  cudaMalloc(&patterns, host.size());
  cudaMalloc(&counters, 2 * sizeof(unsigned long long));
  cudaMemcpy(patterns, host.data(), host.size(), cudaMemcpyHostToDevice);
  cudaMemset(counters, 0, 2 * sizeof(unsigned long long));
  const int smem = sizeof(Shared) + 1024;
  cudaFuncSetAttribute(litmus, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  litmus<<<sms, 256, smem>>>(patterns, refills, mode, counters, counters + 1);
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    std::fprintf(stderr, "kernel failed: %s\n", cudaGetErrorString(err));
    return 1;
  }
  unsigned long long result[2];
  cudaMemcpy(result, counters, sizeof(result), cudaMemcpyDeviceToHost);
  std::printf("mode %-8s CTAs %d refills/CTA %d: stale results %llu of %llu (thread x refill), %.0f cycles per refill\n",
              names[mode], sms, refills, result[0], 128ull * sms * refills, double(result[1]) / sms / refills);
  return 0;
}
