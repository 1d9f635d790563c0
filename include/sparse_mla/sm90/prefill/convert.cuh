// Converting once the paged rows a call reads (the paged call's converting route, sparse_mla/launch.py).
//
// The paged kernel requantizes every row it gathers, per visit: a row that k tokens select is
// converted k times, on the producer's critical path. When the call's tokens select the same rows
// many times over (many tokens over one context), converting each distinct row once and running the
// contiguous kernel over the result costs less. Three launches do it, none synchronizing the host:
//
//   1. mark: one bit per cache row of every row some valid slot names (the marks, zeroed ahead of
//      it); the slot whose bit flip wins (atomicOr) reads that row's scale, and the call's
//      scale S becomes the largest of those (an atomicMax of the float's bits: non-negative floats
//      order as their bits).
//   2. count: per block of WORDS_PER_COUNT_BLOCK mark words, each word's offset within its block and
//      the block's count of marked rows.
//   3. convert: each marked row r, in increasing order, becomes row `slot(r)` (its rank among the
//      marked rows) of the converted rows, e4m3 at the one scale S; each slot of the call's indices
//      becomes slot(index), -1 where invalid. S is written for the contiguous kernel's kv_scale.
//
// The contiguous kernel then reads those rows, `capacity` of them (the caller sizes them for every
// distinct row the call can name: min(cache rows, s_q * TOPK)). The result is bitwise the same on
// every launch: the marks, the ranks and S are functions of the call's rows, not of the order in
// which threads ran.
//
// Numerics: one scale per call, S = the largest row scale of the rows it reads (a row scale is
// requantize_row's sigma: its largest tile scale, or its rope's amax / 448 if larger), never below
// MIN_ROW_SCALE. The tiles whose scale is S keep their bytes; every other value is rounded once more
// to e4m3 at S, as requantize_row rounds at sigma. A row's NaN stays in that row; a row whose scale
// is not finite does not enter S, and that tile reads as NaN, in its own row only.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include <sparse_mla/sm90/prefill/gather.cuh>
#include <sparse_mla/sm90/prefill/primitives.cuh>

namespace sparse_mla::sm90::prefill {

constexpr int CONVERT_THREADS = 256;
constexpr int WORDS_PER_THREAD = 16;
constexpr int WORDS_PER_COUNT_BLOCK = CONVERT_THREADS * WORDS_PER_THREAD;  // 262,144 cache rows

struct ConvertParams {
  const int32_t* indices;      // [s_q, 1, topk]
  const int32_t* topk_length;  // [s_q] or nullptr
  int64_t slots;               // s_q * topk
  const uint8_t* cache;        // as PagedRows
  int64_t block_stride;
  int block_size;
  int rows;                    // cache rows: blocks * block_size
  uint64_t* marks;             // [mark_words(rows)]
  uint32_t* scale_bits;        // [1]: the largest finite row scale's bits
  void* zeroed;                // the bytes holding marks and scale_bits, zeroed ahead of the mark launch
  int64_t zeroed_bytes;
  int32_t* word_offsets;       // [mark_words(rows)]: marked rows before the word, within its count block
  int32_t* block_counts;       // [count_blocks(rows)]: marked rows of each count block
  float* kv_scale;             // [1]: S, for the contiguous kernel
  int32_t* converted_indices;  // [s_q, 1, topk]
  uint8_t* converted;          // [capacity, D_QK] e4m3
  int capacity;                // converted rows available (>= the marked rows, the caller's sizing)
};

__host__ __device__ constexpr int64_t mark_words(int64_t rows) { return (rows + 63) / 64; }
__host__ __device__ constexpr int64_t count_blocks(int64_t rows) {
  return (mark_words(rows) + WORDS_PER_COUNT_BLOCK - 1) / WORDS_PER_COUNT_BLOCK;
}

// The row a slot names, or -1 where the slot is invalid (out of [0, rows) or past its topk_length).
template <int TOPK>
__device__ __forceinline__ int slot_row(const ConvertParams& p, int64_t slot) {
  const int index = p.indices[slot];
  if (index < 0 || index >= p.rows) return -1;
  if (p.topk_length != nullptr && static_cast<int>(slot % TOPK) >= p.topk_length[slot / TOPK]) return -1;
  return index;
}

__device__ __forceinline__ const uint8_t* paged_row(const ConvertParams& p, int row) {
  const uint32_t u = static_cast<uint32_t>(row), b = static_cast<uint32_t>(p.block_size);
  return p.cache + static_cast<int64_t>(u / b) * p.block_stride + static_cast<int64_t>(u % b) * 656;
}

__device__ __forceinline__ float finite_or_zero(float x) { return isfinite(x) ? x : 0.f; }

// A row's scale as requantize_row computes it, over the finite ones of its tile scales and rope amax.
template <int D_QK>
__device__ float row_scale(const uint8_t* row) {
  const float4 s = __ldg(reinterpret_cast<const float4*>(row + D_V));
  float sigma = fmaxf(fmaxf(finite_or_zero(s.x), finite_or_zero(s.y)), fmaxf(finite_or_zero(s.z), finite_or_zero(s.w)));
  if constexpr (D_QK > D_V) {
    const uint4* rope = reinterpret_cast<const uint4*>(row + D_V + 16);
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint4 r = __ldg(rope + i);
      const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) amax = fmaxf(amax, fmaxf(fabsf(bf16_lo(w[k])), fabsf(bf16_hi(w[k]))));
    }
    sigma = fmaxf(sigma, finite_or_zero(amax) * (1.f / 448.f));
  }
  return sigma;
}

template <int D_QK, int TOPK>
__global__ void __launch_bounds__(CONVERT_THREADS) prefill_kernel_convert_mark(const ConvertParams p) {
  float scale = 0.f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * CONVERT_THREADS;
  for (int64_t slot = blockIdx.x * static_cast<int64_t>(CONVERT_THREADS) + threadIdx.x; slot < p.slots;
       slot += stride) {
    const int row = slot_row<TOPK>(p, slot);
    if (row < 0) continue;
    unsigned long long* word = reinterpret_cast<unsigned long long*>(p.marks + (row >> 6));
    const unsigned long long bit = 1ull << (row & 63);
    if (*reinterpret_cast<volatile unsigned long long*>(word) & bit) continue;  // marked: skip the atomic
    if (atomicOr(word, bit) & bit) continue;  // another slot won this row
    scale = fmaxf(scale, row_scale<D_QK>(paged_row(p, row)));
  }
  // The block's largest, then one atomic where it raises S (most blocks' do not, once S is large).
  for (int offset = 16; offset > 0; offset /= 2) scale = fmaxf(scale, __shfl_xor_sync(0xffffffffu, scale, offset));
  __shared__ float warp_scale[CONVERT_THREADS / 32];
  if (threadIdx.x % 32 == 0) warp_scale[threadIdx.x / 32] = scale;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < CONVERT_THREADS / 32; ++w) scale = fmaxf(scale, warp_scale[w]);
    if (__float_as_uint(scale) > *reinterpret_cast<volatile uint32_t*>(p.scale_bits)) {
      atomicMax(p.scale_bits, __float_as_uint(scale));
    }
  }
}

// Exclusive prefix sum over the block's threads of `value`; the block's total in `total`.
__device__ __forceinline__ int block_exclusive_sum(int value, int& total) {
  __shared__ int warp_sums[CONVERT_THREADS / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int inclusive = value;
  for (int offset = 1; offset < 32; offset *= 2) {
    const int n = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += n;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  int before = 0;
  total = 0;
  for (int w = 0; w < CONVERT_THREADS / 32; ++w) {
    if (w < warp) before += warp_sums[w];
    total += warp_sums[w];
  }
  __syncthreads();  // warp_sums may be written again by the caller's next call
  return before + inclusive - value;
}

__global__ void __launch_bounds__(CONVERT_THREADS) prefill_kernel_convert_count(const ConvertParams p) {
  const int64_t words = mark_words(p.rows);
  const int64_t first = blockIdx.x * static_cast<int64_t>(WORDS_PER_COUNT_BLOCK) + threadIdx.x * WORDS_PER_THREAD;
  int count = 0;
#pragma unroll
  for (int i = 0; i < WORDS_PER_THREAD; ++i) {
    if (first + i < words) count += __popcll(p.marks[first + i]);
  }
  int total;
  int offset = block_exclusive_sum(count, total);
#pragma unroll
  for (int i = 0; i < WORDS_PER_THREAD; ++i) {
    if (first + i < words) {
      p.word_offsets[first + i] = offset;
      offset += __popcll(p.marks[first + i]);
    }
  }
  if (threadIdx.x == 0) p.block_counts[blockIdx.x] = total;
}

// 16 bytes of e4m3 values at scale s, at scale S (inv = 1 / S): the same bytes where s is S, e4m3 NaN
// where s is not finite (NaN or inf: the tile reads as NaN, as the paged kernel reads such a row).
__device__ __forceinline__ uint4 at_call_scale(uint4 v, float s, float scale, float inv) {
  if (!isfinite(s)) return make_uint4(0x7f7f7f7fu, 0x7f7f7f7fu, 0x7f7f7f7fu, 0x7f7f7f7fu);
  return s == scale ? v : scale_e4m3x16(v, s * inv);
}

// Row `row` of the cache as D_QK e4m3 bytes at scale S into `dst`.
template <int D_QK>
__device__ void convert_row(const uint8_t* row, uint8_t* dst, float scale, float inv) {
  const float4 s = __ldg(reinterpret_cast<const float4*>(row + D_V));
  const float tile_scale[4] = {s.x, s.y, s.z, s.w};
  const uint4* src = reinterpret_cast<const uint4*>(row);
  uint4* out = reinterpret_cast<uint4*>(dst);
#pragma unroll
  for (int tile = 0; tile < 4; ++tile) {
    uint4 v[8];
#pragma unroll
    for (int c = 0; c < 8; ++c) v[c] = __ldg(src + 8 * tile + c);
#pragma unroll
    for (int c = 0; c < 8; ++c) out[8 * tile + c] = at_call_scale(v[c], tile_scale[tile], scale, inv);
  }
  if constexpr (D_QK > D_V) {
    const uint4* rope = reinterpret_cast<const uint4*>(row + D_V + 16);
    uint4 r[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) r[i] = __ldg(rope + i);
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // 16 rope values (two 16-byte loads) -> 16 e4m3 bytes
      const uint32_t w[8] = {r[2 * i].x, r[2 * i].y, r[2 * i].z, r[2 * i].w,
                             r[2 * i + 1].x, r[2 * i + 1].y, r[2 * i + 1].z, r[2 * i + 1].w};
      uint32_t e[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        e[k] = to_e4m3x2(bf16_lo(w[2 * k]) * inv, bf16_hi(w[2 * k]) * inv) |
               (to_e4m3x2(bf16_lo(w[2 * k + 1]) * inv, bf16_hi(w[2 * k + 1]) * inv) << 16);
      }
      out[D_V / 16 + i] = make_uint4(e[0], e[1], e[2], e[3]);
    }
  }
}

// Dynamic shared memory: count_blocks(p.rows) int32 (at most 128: rows < 2^31), the blocks' exclusive
// prefix.
template <int D_QK, int TOPK>
__global__ void __launch_bounds__(CONVERT_THREADS) prefill_kernel_convert_rows(const ConvertParams p) {
  extern __shared__ int block_start[];
  const int blocks = static_cast<int>(count_blocks(p.rows));
  if (threadIdx.x == 0) {  // a few blocks in practice (one per 262,144 cache rows)
    int sum = 0;
    for (int b = 0; b < blocks; ++b) {
      block_start[b] = sum;
      sum += p.block_counts[b];
    }
  }
  __syncthreads();
  const float scale = fmaxf(__uint_as_float(*p.scale_bits), MIN_ROW_SCALE);
  const float inv = __frcp_rn(scale);
  if (blockIdx.x == 0 && threadIdx.x == 0) *p.kv_scale = scale;
  auto rank = [&](int row, uint64_t mark) {  // the marked row's place among the converted rows
    const int word = row >> 6;
    return block_start[word / WORDS_PER_COUNT_BLOCK] + p.word_offsets[word] +
           __popcll(mark & ((1ull << (row & 63)) - 1));
  };
  const int64_t stride = static_cast<int64_t>(gridDim.x) * CONVERT_THREADS;
  const int64_t first = blockIdx.x * static_cast<int64_t>(CONVERT_THREADS) + threadIdx.x;
  for (int64_t r = first; r < p.rows; r += stride) {
    const int row = static_cast<int>(r);
    const uint64_t mark = p.marks[row >> 6];
    if (!((mark >> (row & 63)) & 1)) continue;
    const int at = rank(row, mark);
    if (at < p.capacity) convert_row<D_QK>(paged_row(p, row), p.converted + static_cast<int64_t>(at) * D_QK, scale, inv);
  }
  for (int64_t slot = first; slot < p.slots; slot += stride) {
    const int row = slot_row<TOPK>(p, slot);
    const int at = row < 0 ? -1 : rank(row, p.marks[row >> 6]);
    p.converted_indices[slot] = at < p.capacity ? at : -1;
  }
}

// The zeroing of the marks and the three launches, on `stream`; the persistent grids have 8 CTAs an SM.
// Returns the first error; never synchronizes.
template <int D_QK, int TOPK>
cudaError_t launch_convert(const ConvertParams& p, cudaStream_t stream) {
  int device = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if ((err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess) return err;
  if ((err = cudaMemsetAsync(p.zeroed, 0, p.zeroed_bytes, stream)) != cudaSuccess) return err;
  const unsigned grid = static_cast<unsigned>(sms) * 8;
  if ((err = launch_kernel(prefill_kernel_convert_mark<D_QK, TOPK>, p, grid, CONVERT_THREADS, 0, stream, false)) != cudaSuccess) {
    return err;
  }
  const unsigned blocks = static_cast<unsigned>(count_blocks(p.rows));
  if ((err = launch_kernel(prefill_kernel_convert_count, p, blocks, CONVERT_THREADS, 0, stream, false)) != cudaSuccess) {
    return err;
  }
  return launch_kernel(prefill_kernel_convert_rows<D_QK, TOPK>, p, grid, CONVERT_THREADS, blocks * sizeof(int), stream, false);
}

}  // namespace sparse_mla::sm90::prefill
