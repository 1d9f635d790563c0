// How fast do the kernel's wgmma shapes run, alone and beside each other, and what do they do to
// shared-memory stores and ldmatrix loads issued beside them? (benchmarks/NOTES.md, Experiment 27.)
//
// One CTA per SM, two warpgroups. Each warpgroup runs one load (Load below) for a fixed window of
// cycles and counts what it completed; its 4 warps agree on when the window ends (a bar.red.or per
// step), since a wgmma or a warpgroup barrier reached by only some of them faults or hangs. The rates say whether Q.K^T (m64n64k32, both operands in
// shared memory) is bound by the tensor cores or by shared-memory bandwidth, what m64n128k32 (Q read
// once for two blocks) would gain, and what a softmax's P stores (with and without the proxy fence
// that wgmma reads need) cost beside each wgmma shape.
//
// Build (CPU host):  nvcc -std=c++17 -arch=sm_90a -O3 -I include -I $CUTLASS/include \
//                    benchmarks/experiments/wgmma_rate/wgmma_rate.cu -o wgmma_rate
// ($CUTLASS: the `cutlass_library/source` directory of the nvidia-cutlass wheel.)
// Run:  ./wgmma_rate; for i in $(seq 0 20); do ./wgmma_rate $i; done   (the header, then one line each)
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#include <sparse_mla/sm90/prefill/primitives.cuh>

#include "../clock_after.cuh"

namespace p = sparse_mla::sm90::prefill;

constexpr int TILE = 64 * 576;              // one gathered block (or Q), e4m3
constexpr long long WINDOW = 400000;        // cycles each warpgroup keeps its load running

enum Load : int {
  kIdle,
  kSS64,         // Q.K^T of one block as the kernel issues it: 18 x m64n64k32 SS, then wait
  kSS128,        // Q.K^T of two blocks at once: 18 x m64n128k32 SS (B = both blocks), then wait
  kRS64,         // P.V of one block: 8 x m64n64k32 RS (A = V^T fragments in registers), then wait
  kLdmatrix,     // V fragments: 8 x ldmatrix.x4.trans + 4 prmt per step, as load_v_fragments
  kStoreFence,   // P of one block: 8 x st.shared.u32, fence.proxy.async, warpgroup barrier
  kStore,        // the same without the fence
};
constexpr const char* kNames[] = {"idle", "SS m64n64k32 x18", "SS m64n128k32 x18", "RS m64n64k32 x8",
                                  "ldmatrix.trans x8", "8 STS + fence + bar", "8 STS + bar"};
// Units per completed step: wgmmas, ldmatrix.x4 instructions, bursts.
constexpr int kUnits[] = {0, 18, 18, 8, 8, 1, 1};

struct Count {
  unsigned long long cycles, steps, latency;  // window actually run; steps completed; sum of step latencies
};

__device__ __forceinline__ void wgmma_64x128x32_ss(float (&d)[64], uint64_t da, uint64_t db) {
  cute::SM90::GMMA::MMA_64x128x32_F32E4M3E4M3_SS_TN<>::fma(
      da, db, d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10], d[11], d[12], d[13], d[14], d[15],
      d[16], d[17], d[18], d[19], d[20], d[21], d[22], d[23], d[24], d[25], d[26], d[27], d[28], d[29], d[30], d[31],
      d[32], d[33], d[34], d[35], d[36], d[37], d[38], d[39], d[40], d[41], d[42], d[43], d[44], d[45], d[46], d[47],
      d[48], d[49], d[50], d[51], d[52], d[53], d[54], d[55], d[56], d[57], d[58], d[59], d[60], d[61], d[62], d[63]);
}

template <int LOAD>
__device__ __forceinline__ Count run_load(uint32_t q, uint32_t kv, uint32_t probs, int wg, uint32_t zero) {
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
  float acc[64];
#pragma unroll
  for (int j = 0; j < 64; ++j) acc[j] = 0.f;
  uint32_t bits = 0;
  Count c{0, 0, 0};
  if (LOAD == kIdle) return c;
  const unsigned long long t0 = clock_after(0);
  unsigned long long now = t0;
  while (true) {
    const unsigned long long s0 = clock_after(bits);
    if (LOAD == kSS64 || LOAD == kSS128) {
      // Each warpgroup reads its own block (kv + wg * TILE) with N 64, or both blocks with N 128.
      const uint32_t dq = p::desc_sw64_lo(q), dk = p::desc_sw64_lo(kv + (LOAD == kSS64 ? wg * TILE : 0));
      cute::warpgroup_arrive();
#pragma unroll
      for (int kk = 0; kk < 18; ++kk) {
        const uint32_t sq = static_cast<uint32_t>(((kk >> 1) * (64 * 64) + (kk & 1) * 32) >> 4);
        const uint32_t sk = static_cast<uint32_t>(((kk >> 1) * ((LOAD == kSS64 ? 64 : 128) * 64) + (kk & 1) * 32) >> 4);
        if (LOAD == kSS64) {
          p::wgmma_64x64x32_ss(reinterpret_cast<float(&)[32]>(acc), p::desc_sw64(dq + sq), p::desc_sw64(dk + sk), true);
        } else {
          wgmma_64x128x32_ss(acc, p::desc_sw64(dq + sq), p::desc_sw64(dk + sk));
        }
      }
      cute::warpgroup_commit_batch();
      cute::warpgroup_wait<0>();
      p::fence_operands(acc);
      bits = __float_as_uint(acc[0]) & zero;
    } else if (LOAD == kRS64) {
      const uint32_t a[4] = {0x38383838u ^ lane, 0x30303030u, 0x34343434u, 0x3c3c3c3cu};
      const uint32_t dp = p::desc_sw64_lo(probs + wg * 4096);
      cute::warpgroup_arrive();
#pragma unroll
      for (int i = 0; i < 8; ++i) p::wgmma_64x64x32_rs(reinterpret_cast<float(&)[32]>(acc), a, p::desc_sw64(dp + (((i & 1) * 32) >> 4)));
      cute::warpgroup_commit_batch();
      cute::warpgroup_wait<0>();
      p::fence_operands(acc);
      bits = __float_as_uint(acc[0]) & zero;
    } else if (LOAD == kLdmatrix) {
      const uint32_t base = kv + wg * TILE + lane * 64 + ((warp ^ ((lane >> 1) & 3)) << 4);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        uint32_t x[4];
        p::ldmatrix_x4_trans(base + (i % 4) * (64 * 64) + (i / 4) * 32 * 64, x);
        bits ^= p::prmt(x[0], x[1], 0x6420) ^ p::prmt(x[0], x[1], 0x7531) ^ p::prmt(x[2], x[3], 0x6420) ^
                p::prmt(x[2], x[3], 0x7531);
      }
    } else {  // kStoreFence, kStore
      const uint32_t row = probs + 8192 + wg * 4096 + (16 * warp + lane / 4) * 64 + 4 * (lane % 4);
#pragma unroll
      for (int g = 0; g < 8; ++g) p::st_shared_u32(row + 8 * 64 * (g / 4) + ((g % 4) << 4), bits + g + static_cast<uint32_t>(now));
      if (LOAD == kStoreFence) cutlass::arch::fence_view_async_shared();
      if (wg == 0) p::named_barrier_sync<1, 128>();
      else p::named_barrier_sync<2, 128>();
    }
    now = clock_after(bits);
    c.latency += now - s0;
    ++c.steps;
    // The warps of a warpgroup read different clocks: they leave the loop together, since a wgmma
    // or a warpgroup barrier that only some of them reach faults or hangs.
    const bool done = now - t0 >= WINDOW;
    if (wg == 0 ? p::named_barrier_sync_or<3, 128>(done) : p::named_barrier_sync_or<4, 128>(done)) break;
  }
  c.cycles = now - t0;
  // Uses the accumulators (zero is 0 at run time, unknown to the compiler): ptxas drops wgmmas
  // whose results are never read.
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < 64; ++j) sum += acc[j];
  if ((__float_as_uint(sum) | bits) == (zero | 0x7fc00001u)) c.steps = 0;
  return c;
}

template <int L0, int L1>
__global__ void __launch_bounds__(256, 1) wgmma_rate_kernel(Count* out, uint32_t zero) {
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t q = p::smem_addr(smem), kv = q + TILE, probs = kv + 2 * TILE;
  // Small finite e4m3 values everywhere (0x00-0x3f: magnitudes below 2).
  for (int i = threadIdx.x; i < (3 * TILE + 16384) / 4; i += blockDim.x)
    reinterpret_cast<uint32_t*>(smem)[i] = (i * 0x9E3779B9u) & 0x3f3f3f3fu;
  cutlass::arch::fence_view_async_shared();
  __syncthreads();
  const int wg = threadIdx.x / 128;
  const Count c = wg == 0 ? run_load<L0>(q, kv, probs, 0, zero) : run_load<L1>(q, kv, probs, 1, zero);
  if (threadIdx.x % 128 == 0) out[2 * blockIdx.x + wg] = c;
}

template <int L0, int L1>
void run(int sms) {
  const int smem = 3 * TILE + 16384;
  cudaFuncSetAttribute(wgmma_rate_kernel<L0, L1>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  Count* out;
  cudaMalloc(&out, 2 * sms * sizeof(Count));
  for (int rep = 0; rep < 2; ++rep) wgmma_rate_kernel<L0, L1><<<sms, 256, smem>>>(out, 0u);  // the last one counts
  static Count host[512];
  cudaMemcpy(host, out, 2 * sms * sizeof(Count), cudaMemcpyDeviceToHost);
  const cudaError_t err = cudaGetLastError();
  std::printf("%-22s | %-22s |", kNames[L0], kNames[L1]);
  const int loads[2] = {L0, L1};
  for (int w = 0; w < 2; ++w) {
    double steps = 0, cycles = 0, latency = 0;
    for (int i = 0; i < sms; ++i) {
      steps += host[2 * i + w].steps;
      cycles += host[2 * i + w].cycles;
      latency += host[2 * i + w].latency;
    }
    if (loads[w] == kIdle || steps == 0) {
      std::printf(" %28s |", "");
      continue;
    }
    // Per unit: cycles per wgmma / ldmatrix; for the store bursts, the mean latency of one burst.
    const double per_unit = loads[w] >= kStoreFence ? latency / steps : cycles / (steps * kUnits[loads[w]]);
    std::printf(" wg%d %8.1f cyc/%-10s |", w, per_unit, loads[w] >= kStoreFence ? "burst" : (loads[w] == kLdmatrix ? "ldmatrix" : "wgmma"));
  }
  std::printf(" %s\n", err == cudaSuccess ? "" : cudaGetErrorString(err));
  cudaFree(out);
}

// Each configuration in its own process (`./wgmma_rate N`), so that a fault stays in its line.
int main(int argc, char** argv) {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  if (sms > 256) sms = 256;
  const int which = argc > 1 ? std::atoi(argv[1]) : -1;
  if (which < 0) {
    std::printf("one CTA per SM on %d SMs, %lld-cycle windows; ideal tensor rate: m64n64k32 32 cycles, m64n128k32 64\n", sms, WINDOW);
    std::printf("%-22s | %-22s | %-28s | %-28s |\n", "warpgroup 0", "warpgroup 1", "warpgroup 0", "warpgroup 1");
    return 0;
  }
  switch (which) {
    case 0: run<kSS64, kIdle>(sms); break;
    case 1: run<kSS64, kSS64>(sms); break;
    case 2: run<kSS128, kIdle>(sms); break;
    case 3: run<kSS128, kSS128>(sms); break;
    case 4: run<kRS64, kIdle>(sms); break;
    case 5: run<kRS64, kRS64>(sms); break;
    case 6: run<kSS64, kRS64>(sms); break;
    case 7: run<kLdmatrix, kIdle>(sms); break;
    case 8: run<kLdmatrix, kLdmatrix>(sms); break;
    case 9: run<kLdmatrix, kSS64>(sms); break;
    case 10: run<kLdmatrix, kSS128>(sms); break;
    case 11: run<kLdmatrix, kRS64>(sms); break;
    case 12: run<kStoreFence, kIdle>(sms); break;
    case 13: run<kStore, kIdle>(sms); break;
    case 14: run<kStoreFence, kSS64>(sms); break;
    case 15: run<kStore, kSS64>(sms); break;
    case 16: run<kStoreFence, kSS128>(sms); break;
    case 17: run<kStore, kSS128>(sms); break;
    case 18: run<kStoreFence, kRS64>(sms); break;
    case 19: run<kStore, kRS64>(sms); break;
    case 20: run<kStoreFence, kLdmatrix>(sms); break;
    default: return 1;
  }
  return 0;
}
