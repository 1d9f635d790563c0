// How fast can an SM gather 576-byte kv rows out of L2 into shared memory? A standalone measurement
// (no torch): uniform random rows of a [rows x 576] byte table, 2,048 rows a token, gathered in
// stages of 64 rows, nothing consumed, by (a) 16-byte cp.async from every thread of a CTA, as the
// kernel's producer copies, or (b) one cp.async.bulk per row issued by one warp, completing on an
// mbarrier. Prints GB/s per configuration (CUDA events, the median of 9 launches after 2 warm-ups).
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -o gather_bin gather.cu && ./gather_bin
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

constexpr int ROW_BYTES = 576;
constexpr int TOPK = 2048;
constexpr int STAGE_ROWS = 64;
constexpr int CHUNKS = STAGE_ROWS * ROW_BYTES / 16;  // 2,304 16-byte copies a stage

__device__ __forceinline__ uint32_t smem(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }


// The token's indices come from shared memory, loaded a token ahead: each thread loads its share of
// the next token's indices into registers while the current token's stages run, and stores them
// into the other buffer afterwards, so no stage waits for an index load from L2.
template <int THREADS>
struct IndexPrefetch {
  static constexpr int PER_THREAD = TOPK / 4 / THREADS;  // int4 loads a thread
  int4 next[PER_THREAD];
  __device__ void load(const int* indices, int token, int tokens) {
    if (token >= tokens) return;
    const int4* src = reinterpret_cast<const int4*>(indices + static_cast<int64_t>(token) * TOPK);
    for (int i = 0; i < PER_THREAD; ++i) next[i] = src[i * THREADS + threadIdx.x];
  }
  __device__ void store(int* buffer) const {
    for (int i = 0; i < PER_THREAD; ++i) reinterpret_cast<int4*>(buffer)[i * THREADS + threadIdx.x] = next[i];
  }
};

// (a) Every thread of the CTA copies CHUNKS / THREADS chunks of a stage; S stages in flight per thread.
template <int THREADS, int S>
__global__ void __launch_bounds__(THREADS) gather_cp_async(const uint8_t* kv, const int* indices, int tokens) {
  extern __shared__ __align__(128) uint8_t stage_mem[];
  __shared__ __align__(16) int token_rows[2][TOPK];
  IndexPrefetch<THREADS> prefetch;
  prefetch.load(indices, blockIdx.x, tokens);
  prefetch.store(token_rows[0]);
  __syncthreads();
  int issued = 0, buffer = 0;
  for (int token = blockIdx.x; token < tokens; token += gridDim.x, buffer ^= 1) {
    prefetch.load(indices, token + gridDim.x, tokens);
    const int* rows = token_rows[buffer];
    for (int block = 0; block < TOPK / STAGE_ROWS; ++block) {
      uint8_t* dst = stage_mem + (issued % S) * (STAGE_ROWS * ROW_BYTES);
      for (int c = threadIdx.x; c < CHUNKS; c += THREADS) {
        const int r = c / (ROW_BYTES / 16), col = c % (ROW_BYTES / 16);
        const uint8_t* src = kv + static_cast<int64_t>(rows[block * STAGE_ROWS + r]) * ROW_BYTES + col * 16;
        asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(smem(dst + c * 16)), "l"(src) : "memory");
      }
      asm volatile("cp.async.commit_group;\n" ::: "memory");
      asm volatile("cp.async.wait_group %0;\n" ::"n"(S - 1) : "memory");
      ++issued;
    }
    prefetch.store(token_rows[buffer ^ 1]);
    __syncthreads();
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// (b) Warp 0 issues one bulk copy a row (rows padded to 592 bytes in shared memory), S stages each
// with its mbarrier; a stage is refilled once its previous copies completed.
template <int S>
__global__ void __launch_bounds__(32) gather_bulk(const uint8_t* kv, const int* indices, int tokens) {
  constexpr int PADDED = ROW_BYTES + 16;
  extern __shared__ __align__(128) uint8_t stage_mem[];
  __shared__ __align__(8) uint64_t full[S];
  const int lane = threadIdx.x;
  if (lane == 0)
    for (int s = 0; s < S; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem(&full[s])));
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  __shared__ __align__(16) int token_rows[2][TOPK];
  IndexPrefetch<32> prefetch;
  prefetch.load(indices, blockIdx.x, tokens);
  prefetch.store(token_rows[0]);
  __syncwarp();
  int issued = 0, buffer = 0;
  for (int token = blockIdx.x; token < tokens; token += gridDim.x, buffer ^= 1) {
    prefetch.load(indices, token + gridDim.x, tokens);
    const int* rows = token_rows[buffer];
    for (int block = 0; block < TOPK / STAGE_ROWS; ++block) {
      const int s = issued % S;
      if (issued >= S) {  // wait for this stage's previous fill (phase parity of its use count)
        const uint32_t parity = ((issued / S) - 1) & 1;
        asm volatile(
            "{\n.reg .pred p;\nW: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W;\n}\n" ::"r"(
                smem(&full[s])),
            "r"(parity)
            : "memory");
      }
      if (lane == 0)
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem(&full[s])),
                     "r"(STAGE_ROWS * ROW_BYTES)
                     : "memory");
      __syncwarp();
      uint8_t* dst = stage_mem + s * (STAGE_ROWS * PADDED);
      for (int r = lane; r < STAGE_ROWS; r += 32) {
        const uint8_t* src = kv + static_cast<int64_t>(rows[block * STAGE_ROWS + r]) * ROW_BYTES;
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                smem(dst + r * PADDED)),
            "l"(src), "r"(ROW_BYTES), "r"(smem(&full[s]))
            : "memory");
      }
      ++issued;
    }
    prefetch.store(token_rows[buffer ^ 1]);
    __syncwarp();
  }
  for (int k = issued > S ? issued - S : 0; k < issued; ++k) {  // drain
    const uint32_t parity = (k / S) & 1;
    asm volatile("{\n.reg .pred p;\nW2: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W2;\n}\n" ::"r"(
                     smem(&full[k % S])),
                 "r"(parity)
                 : "memory");
  }
}

#define CHECK(x)                                                                   \
  do {                                                                             \
    cudaError_t e = (x);                                                           \
    if (e != cudaSuccess) {                                                        \
      std::printf("%s failed: %s\n", #x, cudaGetErrorString(e));                   \
      return 1;                                                                    \
    }                                                                              \
  } while (0)

template <typename Kernel>
int time_kernel(const char* name, Kernel kernel, int grid, int threads, size_t smem_bytes, const uint8_t* kv,
                const int* idx, int tokens, int rows) {
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_bytes)));
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> ms;
  for (int rep = 0; rep < 11; ++rep) {
    cudaEventRecord(a);
    kernel<<<grid, threads, smem_bytes>>>(kv, idx, tokens);
    cudaEventRecord(b);
    CHECK(cudaEventSynchronize(b));
    float t;
    cudaEventElapsedTime(&t, a, b);
    if (rep >= 2) ms.push_back(t);
  }
  CHECK(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  const double bytes = static_cast<double>(tokens) * TOPK * ROW_BYTES;
  std::printf("%-34s rows %7d grid %4d smem %6zu KB: %.3f ms, %.0f GB/s\n", name, rows, grid, smem_bytes / 1024,
              ms[ms.size() / 2], bytes / (ms[ms.size() / 2] * 1e6));
  return 0;
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  std::printf("%s, %d SMs, L2 %d MB\n", prop.name, sms, prop.l2CacheSize >> 20);
  const int tokens = 4096;
  std::mt19937 rng(0);
  for (int rows : {8192, 131072}) {
    std::vector<int> h_idx(static_cast<size_t>(tokens) * TOPK);
    std::vector<int> perm(rows);
    for (int i = 0; i < rows; ++i) perm[i] = i;
    for (int t = 0; t < tokens; ++t) {  // distinct rows a token, as an indexer's top-k
      for (int k = 0; k < TOPK; ++k) std::swap(perm[k], perm[k + rng() % (rows - k)]);
      std::copy(perm.begin(), perm.begin() + TOPK, h_idx.begin() + static_cast<size_t>(t) * TOPK);
    }
    uint8_t* kv;
    int* idx;
    CHECK(cudaMalloc(&kv, static_cast<size_t>(rows) * ROW_BYTES));
    CHECK(cudaMemset(kv, 0x11, static_cast<size_t>(rows) * ROW_BYTES));
    CHECK(cudaMalloc(&idx, h_idx.size() * sizeof(int)));
    CHECK(cudaMemcpy(idx, h_idx.data(), h_idx.size() * sizeof(int), cudaMemcpyHostToDevice));
    const size_t stage = STAGE_ROWS * ROW_BYTES, padded = STAGE_ROWS * (ROW_BYTES + 16);
    time_kernel("cp.async 128 thr, 2 stages", gather_cp_async<128, 2>, sms, 128, 2 * stage, kv, idx, tokens, rows);
    time_kernel("cp.async 128 thr, 4 stages", gather_cp_async<128, 4>, sms, 128, 4 * stage, kv, idx, tokens, rows);
    time_kernel("cp.async 256 thr, 2 stages", gather_cp_async<256, 2>, sms, 256, 2 * stage, kv, idx, tokens, rows);
    time_kernel("cp.async 256 thr, 4 stages", gather_cp_async<256, 4>, sms, 256, 4 * stage, kv, idx, tokens, rows);
    time_kernel("cp.async 128 thr, 2 st, 2 CTA/SM", gather_cp_async<128, 2>, 2 * sms, 128, 2 * stage, kv, idx, tokens, rows);
    time_kernel("cp.async 256 thr, 2 st, 2 CTA/SM", gather_cp_async<256, 2>, 2 * sms, 256, 2 * stage, kv, idx, tokens, rows);
    time_kernel("bulk, 2 stages", gather_bulk<2>, sms, 32, 2 * padded, kv, idx, tokens, rows);
    time_kernel("bulk, 4 stages", gather_bulk<4>, sms, 32, 4 * padded, kv, idx, tokens, rows);
    time_kernel("bulk, 5 stages", gather_bulk<5>, sms, 32, 5 * padded, kv, idx, tokens, rows);
    time_kernel("bulk, 2 st, 2 CTA/SM", gather_bulk<2>, 2 * sms, 32, 2 * padded, kv, idx, tokens, rows);
    cudaFree(kv);
    cudaFree(idx);
  }
  return 0;
}
