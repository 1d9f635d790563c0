// How fast do the kernel's wgmma shapes run, alone and beside each other, and what do they do to
// shared-memory stores and ldmatrix loads issued beside them? (benchmarks/NOTES.md, Experiments 27, 30.)
//
// One CTA per SM, two warpgroups. Each warpgroup runs one load (Load below) for a fixed window of
// cycles and counts what it completed; its 4 warps agree on when the window ends (a bar.red.or per
// step), since a wgmma or a warpgroup barrier reached by only some of them faults or hangs. The rates say whether Q.K^T (m64n64k32, both operands in
// shared memory) is bound by the tensor cores or by shared-memory bandwidth, what m64n128k32 (Q read
// once for two blocks) would gain, and what a softmax's P stores (with and without the proxy fence
// that wgmma reads need) cost beside each wgmma shape. The last loads ask whether a block stored
// transposed (S^T = K . Q^T with K fragments from ldmatrix, O = P . V with V^T read by the wgmma)
// would run a pair's tensor work faster than today's form.
//
// Build (CPU host):  nvcc -std=c++17 -arch=sm_90a -O3 -I include -I $CUTLASS/include \
//                    benchmarks/experiments/wgmma_rate/wgmma_rate.cu -o wgmma_rate
// ($CUTLASS: the `cutlass_library/source` directory of the nvidia-cutlass wheel.)
// Run:  ./wgmma_rate; for i in $(seq 0 29); do ./wgmma_rate $i; done   (the header, then one line each)
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
  // A transposed-tile dataflow (NOTES, Experiment 30): S^T = K . Q^T and O = P . V, both RS.
  kRSK6,         // S^T of one block: K fragments by ldmatrix.trans + prmt, 6 k-steps at a time, each
                 // chunk issued as 6 x m64n64k32 RS (B = Q) and waited for before the next is loaded
  kRSK18,        // the same with all 18 k-steps loaded first (72 registers: the unchunked bound)
  kRS256,        // O = P . V of a pair: P fragments (4 ldmatrix.trans), 4 x m64n256k32 RS (B = V^T), wait
  // One consumer's tensor work of a pair, without softmax or gather:
  kPairToday,    // today's: Q.K^T (SS x18); V block 0 loaded; P.V block 0 (RS x8); wait; V block 1; P.V; wait
  kPairT2,       // the transposed tile's: O = P . V (kRS256) issued, then S^T as kRSK6 beside it
};
constexpr const char* kNames[] = {"idle", "SS m64n64k32 x18", "SS m64n128k32 x18", "RS m64n64k32 x8",
                                  "ldmatrix.trans x8", "8 STS + fence + bar", "8 STS + bar", "RS K-chunks 6 x3",
                                  "RS K 18 at once", "RS m64n256k32 x4", "pair, today",
                                  "pair, transposed tile"};
// Units per completed step: wgmmas, ldmatrix.x4 instructions, bursts, pairs.
constexpr int kUnits[] = {0, 18, 18, 8, 8, 1, 1, 18, 18, 4, 1, 1};

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

__device__ __forceinline__ void wgmma_64x256x32_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t db) {
#define D8(i) d[i], d[i + 1], d[i + 2], d[i + 3], d[i + 4], d[i + 5], d[i + 6], d[i + 7]
#define D32(i) D8(i), D8(i + 8), D8(i + 16), D8(i + 24)
  cute::SM90::GMMA::MMA_64x256x32_F32E4M3E4M3_RS_TN<>::fma(a[0], a[1], a[2], a[3], db, D32(0), D32(32), D32(64), D32(96));
#undef D32
#undef D8
}

// 4 A registers of one k-step from one ldmatrix.x4.trans, as load_v_fragments forms them.
__device__ __forceinline__ void a_fragment(uint32_t addr, uint32_t (&a)[4]) {
  uint32_t x[4];
  p::ldmatrix_x4_trans(addr, x);
  a[0] = p::prmt(x[0], x[1], 0x6420);
  a[1] = p::prmt(x[0], x[1], 0x7531);
  a[2] = p::prmt(x[2], x[3], 0x6420);
  a[3] = p::prmt(x[2], x[3], 0x7531);
}

// S^T of one block from K fragments in registers, CHUNK k-steps loaded and issued at a time; each
// chunk is waited for before the next one reuses its registers.
template <int CHUNK>
__device__ __forceinline__ uint32_t rs_k_block(float (&acc)[32], uint32_t q, uint32_t k_lane) {
  const uint32_t dq = p::desc_sw64_lo(q);
#pragma unroll
  for (int c0 = 0; c0 < 18; c0 += CHUNK) {
    uint32_t a[CHUNK][4];
#pragma unroll
    for (int t = 0; t < CHUNK; ++t) a_fragment(k_lane + (c0 + t) * 32 * 64, a[t]);
    cute::warpgroup_arrive();
#pragma unroll
    for (int t = 0; t < CHUNK; ++t) {
      const int kk = c0 + t;
      p::wgmma_64x64x32_rs(acc, a[t], p::desc_sw64(dq + static_cast<uint32_t>(((kk >> 1) * (64 * 64) + (kk & 1) * 32) >> 4)));
    }
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<0>();
    p::fence_operands(acc);
  }
  return __float_as_uint(acc[0]);
}

// O = P . V of a pair for one warpgroup's 256 dims, committed and not waited for: P fragments
// from a 128-row (slot) tile of 64-byte rows (heads), B = V^T in two column blocks of 256 rows.
__device__ __forceinline__ void issue_pv256(float (&o)[128], uint32_t p_lane, uint32_t v_tile) {
  const uint32_t dv = p::desc_sw64_lo(v_tile);
  uint32_t a[4][4];
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) a_fragment(p_lane + ks * 32 * 64, a[ks]);
  p::fence_operands(o);
  cute::warpgroup_arrive();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks)
    wgmma_64x256x32_rs(o, a[ks], p::desc_sw64(dv + static_cast<uint32_t>(((ks >> 1) * (256 * 64) + (ks & 1) * 32) >> 4)));
  cute::warpgroup_commit_batch();
}

template <int LOAD>
__device__ __forceinline__ Count run_load(uint32_t q, uint32_t kv, uint32_t probs, int wg, uint32_t zero) {
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
  float acc[128];
#pragma unroll
  for (int j = 0; j < 128; ++j) acc[j] = 0.f;
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
          wgmma_64x128x32_ss(reinterpret_cast<float(&)[64]>(acc), p::desc_sw64(dq + sq), p::desc_sw64(dk + sk));
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
    } else if (LOAD == kRSK6 || LOAD == kRSK18) {
      // The transposed tile of the block: 576 rows (dims) of 64 bytes (slots); rows 32kk + lane hold
      // k-step kk's fragments, read as load_v_fragments reads V.
      const uint32_t k_lane = kv + wg * TILE + lane * 64 + ((warp ^ ((lane >> 1) & 3)) << 4);
      bits = (LOAD == kRSK6 ? rs_k_block<6>(reinterpret_cast<float(&)[32]>(acc), q, k_lane)
                            : rs_k_block<18>(reinterpret_cast<float(&)[32]>(acc), q, k_lane)) & zero;
    } else if (LOAD == kRS256) {
      // P of the pair: 128 rows (slots) of 64 bytes (heads); V^T of this warpgroup's 256 dims.
      issue_pv256(acc, probs + wg * 8192 + lane * 64 + ((warp ^ ((lane >> 1) & 3)) << 4), kv + wg * 32768);
      cute::warpgroup_wait<0>();
      p::fence_operands(acc);
      bits = __float_as_uint(acc[0]) & zero;
    } else if (LOAD == kPairToday) {
      float s_acc[32];
#pragma unroll
      for (int j = 0; j < 32; ++j) s_acc[j] = 0.f;
      const uint32_t dq = p::desc_sw64_lo(q), dk = p::desc_sw64_lo(kv + wg * TILE);
      cute::warpgroup_arrive();
#pragma unroll
      for (int kk = 0; kk < 18; ++kk) {
        const uint32_t step = static_cast<uint32_t>(((kk >> 1) * (64 * 64) + (kk & 1) * 32) >> 4);
        p::wgmma_64x64x32_ss(s_acc, p::desc_sw64(dq + step), p::desc_sw64(dk + step), kk > 0);
      }
      cute::warpgroup_commit_batch();
      const uint32_t v_lane = kv + 4 * wg * (64 * 64) + lane * 64 + ((warp ^ ((lane >> 1) & 3)) << 4);
#pragma unroll
      for (int blk = 0; blk < 2; ++blk) {
        uint32_t a[2][4][4];
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
#pragma unroll
          for (int i = 0; i < 4; ++i) a_fragment(v_lane + blk * TILE + i * (64 * 64) + ks * 32 * 64, a[ks][i]);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) p::fence_operands(reinterpret_cast<float(&)[32]>(acc[32 * i]));
        cute::warpgroup_arrive();
        const uint32_t dp = p::desc_sw64_lo(probs + blk * 4096);
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
#pragma unroll
          for (int i = 0; i < 4; ++i)
            p::wgmma_64x64x32_rs(reinterpret_cast<float(&)[32]>(acc[32 * i]), a[ks][i], p::desc_sw64(dp + ((ks * 32) >> 4)));
        }
        cute::warpgroup_commit_batch();
        cute::warpgroup_wait<0>();
      }
      p::fence_operands(acc);
      p::fence_operands(s_acc);
      bits = (__float_as_uint(acc[0]) ^ __float_as_uint(s_acc[0])) & zero;
    } else if (LOAD == kPairT2) {
      float s_acc[32];
#pragma unroll
      for (int j = 0; j < 32; ++j) s_acc[j] = 0.f;
      issue_pv256(acc, probs + wg * 8192 + lane * 64 + ((warp ^ ((lane >> 1) & 3)) << 4), kv + wg * 32768);
      const uint32_t k_lane = kv + wg * TILE + lane * 64 + ((warp ^ ((lane >> 1) & 3)) << 4);
      bits = rs_k_block<6>(s_acc, q, k_lane) & zero;
      p::fence_operands(acc);
      bits ^= __float_as_uint(acc[0]) & zero;
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
  for (int j = 0; j < 128; ++j) sum += acc[j];
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
    // Per unit: cycles per wgmma / ldmatrix / pair; for the store bursts, the mean latency of one burst.
    const bool burst = loads[w] == kStoreFence || loads[w] == kStore;
    const double per_unit = burst ? latency / steps : cycles / (steps * kUnits[loads[w]]);
    const char* unit = burst ? "burst" : loads[w] == kLdmatrix ? "ldmatrix" : loads[w] >= kPairToday ? "pair" : "wgmma";
    std::printf(" wg%d %8.1f cyc/%-10s |", w, per_unit, unit);
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
    std::printf("one CTA per SM on %d SMs, %lld-cycle windows; ideal tensor rate: m64n64k32 32 cycles, m64n128k32 64, m64n256k32 128\n", sms, WINDOW);
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
    case 21: run<kRSK6, kIdle>(sms); break;
    case 22: run<kRSK6, kRSK6>(sms); break;
    case 23: run<kRSK18, kRSK18>(sms); break;
    case 24: run<kRS256, kIdle>(sms); break;
    case 25: run<kRS256, kRS256>(sms); break;
    case 26: run<kRSK6, kRS256>(sms); break;
    case 27: run<kSS64, kRS256>(sms); break;
    case 28: run<kPairToday, kPairToday>(sms); break;
    case 29: run<kPairT2, kPairT2>(sms); break;
    default: return 1;
  }
  return 0;
}
