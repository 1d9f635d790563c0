// Does a softmax slow down when another warpgroup of the CTA issues wgmmas? (benchmarks/NOTES.md,
// Experiment 22: without lockstep, the leader's softmax took 2,288 cycles instead of 1,345.)
//
// One CTA per SM, two warpgroups. Warpgroup 1 loads the tensor cores in one of four ways (MODE);
// warpgroup 0 meanwhile times, with clock64, the two halves of the kernel's softmax for one block:
//   alu    32 x (FFMA -> MUFU.EX2 -> FADD) on registers, as write_probs does for its 32 logits;
//   store  the 8 shared stores of P, the proxy fence and the barrier of the warpgroup's 4 warps.
// MODE 0: warpgroup 1 idles. 1: it issues batches of 144 m64n64k32 SS wgmmas (8 pairs' Q.K^T) and
// waits after each. 2: the same, in batches of 18 (one Q.K^T at a time). 3: it loads V fragments
// with ldmatrix.trans + prmt in a loop (no tensor work). The load outlasts the bursts (the table
// prints both durations).
// Hypothesis: warpgroup 0's shared stores queue behind warpgroup 1's wgmmas waiting for the tensor
// pipe, so `store` grows by about the tensor work queued ahead of it in MODE 1, much less in MODE 2,
// and `alu` hardly changes.
//
// Build (CPU host):  nvcc -std=c++17 -arch=sm_90a -O3 -I include -I $CUTLASS/include \
//                    benchmarks/experiments/mio_queue/mio_queue.cu -o mio_queue
// ($CUTLASS: the `cutlass_library/source` directory of the nvidia-cutlass wheel.) Run: ./mio_queue
#include <cstdint>
#include <cstdio>

#include <cuda_runtime.h>

#include <sparse_mla/sm90/prefill/primitives.cuh>

#include "../clock_after.cuh"

namespace p = sparse_mla::sm90::prefill;

constexpr int TILE = 64 * 576;  // one gathered block (or Q) of the kernel, e4m3
constexpr int ROUNDS = 16;      // timed bursts per CTA
constexpr int REPEAT = 8;       // warpgroup 1 repeats its load, so that it outlasts the bursts

struct Timings {
  unsigned long long alu, store, bursts, busy;  // per burst (alu, store); all bursts; warpgroup 1's load
};

__device__ __forceinline__ void issue_qk(uint32_t q, uint32_t k, float (&s)[32], int steps) {
  cute::warpgroup_arrive();
  for (int kk = 0; kk < steps; ++kk) {
    const uint32_t step = static_cast<uint32_t>((((kk % 18) >> 1) * (64 * 64) + (kk & 1) * 32) >> 4);
    p::wgmma_64x64x32_ss(s, p::desc_sw64(p::desc_sw64_lo(q) + step), p::desc_sw64(p::desc_sw64_lo(k) + step), true);
  }
  cute::warpgroup_commit_batch();
}

template <int MODE>
__global__ void __launch_bounds__(256, 1) mio_queue_kernel(Timings* out) {
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t q = p::smem_addr(smem), k = q + TILE, probs = k + TILE;
  for (int i = threadIdx.x; i < (2 * TILE + 4096) / 16; i += blockDim.x) reinterpret_cast<uint4*>(smem)[i] = make_uint4(0, 0, 0, 0);
  cutlass::arch::fence_view_async_shared();
  __syncthreads();

  const int wg = threadIdx.x / 128, lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
  if (wg == 1) {
    float s[32];
#pragma unroll
    for (int j = 0; j < 32; ++j) s[j] = 0.f;
    const unsigned long long t0 = clock_after(0);
    if (MODE == 1) {
      for (int b = 0; b < REPEAT; ++b) {
        issue_qk(q, k, s, 144);
        cute::warpgroup_wait<0>();
      }
    } else if (MODE == 2) {
      for (int b = 0; b < 8 * REPEAT; ++b) {
        issue_qk(q, k, s, 18);
        cute::warpgroup_wait<0>();
      }
    } else if (MODE == 3) {
      uint32_t acc = 0;
      for (int r = 0; r < 256 * REPEAT; ++r) {
        uint32_t x[4];
        p::ldmatrix_x4_trans(k + lane * 64 + ((warp ^ ((lane >> 1) & 3)) << 4) + (r % 8) * 4096, x);
        acc ^= p::prmt(x[0], x[1], 0x6420) ^ p::prmt(x[2], x[3], 0x7531);
      }
      s[0] = __uint_as_float(acc);
    }
    p::fence_operands(s);
    const unsigned long long t1 = clock_after(__float_as_uint(s[0]) & 0);
    if (threadIdx.x == 128) out[blockIdx.x].busy = t1 - t0;
    if (s[0] == 1.f) out[blockIdx.x].alu = 0;  // keeps the accumulators alive
    return;
  }

  // Warpgroup 0: start the bursts once warpgroup 1 has queued work (~500 cycles in).
  const unsigned long long start = clock_after(0);
  while (clock_after(0) - start < 500) {
  }
  unsigned long long alu = 0, store = 0;
  float x[32];
#pragma unroll
  for (int j = 0; j < 32; ++j) x[j] = 0.001f * (threadIdx.x + j);
  const uint32_t row = probs + (16 * warp + lane / 4) * 64 + 4 * (lane % 4);
  for (int r = 0; r < ROUNDS; ++r) {
    const unsigned long long a0 = clock_after(__float_as_uint(x[0]));
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      x[j] = p::ex2(fmaf(x[j], 0.999f, -0.25f));
      sum += x[j];
    }
    const unsigned long long a1 = clock_after(__float_as_uint(sum));
#pragma unroll
    for (int g = 0; g < 8; ++g) p::st_shared_u32(row + 8 * 64 * (g / 4) + ((g % 4) << 4), __float_as_uint(x[g]) ^ static_cast<uint32_t>(a1));
    cutlass::arch::fence_view_async_shared();
    p::named_barrier_sync<1, 128>();
    const unsigned long long a2 = clock_after(0);
    alu += a1 - a0;
    store += a2 - a1;
  }
  const unsigned long long end = clock_after(static_cast<uint32_t>(store));
  if (threadIdx.x == 0) {
    out[blockIdx.x].bursts = end - start;
    out[blockIdx.x].alu = alu / ROUNDS;
    out[blockIdx.x].store = store / ROUNDS;
  }
}

template <int MODE>
void run(const char* name, int sms) {
  const int smem = 2 * TILE + 4096;
  cudaFuncSetAttribute(mio_queue_kernel<MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  Timings* out;
  cudaMalloc(&out, sms * sizeof(Timings));
  for (int rep = 0; rep < 3; ++rep) mio_queue_kernel<MODE><<<sms, 256, smem>>>(out);  // the last one counts
  Timings host[256];
  cudaMemcpy(host, out, sms * sizeof(Timings), cudaMemcpyDeviceToHost);
  const cudaError_t err = cudaGetLastError();
  unsigned long long alu = 0, store = 0, bursts = 0, busy = 0;
  for (int i = 0; i < sms; ++i) {
    alu += host[i].alu;
    store += host[i].store;
    bursts += host[i].bursts;
    busy += host[i].busy;
  }
  std::printf("%-38s alu %6llu  store %6llu  | all bursts %7llu, warpgroup 1 busy %7llu  %s\n", name, alu / sms,
              store / sms, bursts / sms, busy / sms, err == cudaSuccess ? "" : cudaGetErrorString(err));
  cudaFree(out);
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  if (sms > 256) sms = 256;
  std::printf("cycles per burst, mean over %d CTAs x %d bursts\n", sms, ROUNDS);
  run<0>("0: other warpgroup idle", sms);
  run<1>("1: 144 wgmmas in one batch", sms);
  run<2>("2: 8 batches of 18, wait after each", sms);
  run<3>("3: ldmatrix.trans + prmt loop", sms);
  return 0;
}
