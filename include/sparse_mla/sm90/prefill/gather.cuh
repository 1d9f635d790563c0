// The producer's row gather (producer.cuh): where a kv row lies in global memory, whether a slot's index
// names one, and how a producer thread copies its share of a row into a 64-byte swizzled tile. The
// layout of the rows is this file's policy, not the tiles': produce_unit takes a kv row only through
// ContiguousRows or PagedRows (KvLayout, traits.cuh), and every tile runs on either; paged rows add a
// step after their copies land, requantize_row, and a scale per row that the consumers fold in.
#pragma once

#include <cstdint>

#include <sparse_mla/sm90/prefill/primitives.cuh>
#include <sparse_mla/sm90/prefill/traits.cuh>

namespace sparse_mla::sm90::prefill {

// A thread's share of one row of D_QK e4m3 bytes, `src` its first chunk (chunk c of column block 0),
// into its place `dst` (swizzled_offset of its row and chunk) of a tile: chunk c of each 64-byte
// column block, the blocks B_TOPK * 64 bytes apart in the tile. Zero-filled without reading the row
// where !valid. Q's rows, which the call's q tensor lays out, come this way too.
template <int D_QK>
__device__ __forceinline__ void copy_row_chunks(uint32_t dst, const uint8_t* src, bool valid) {
  constexpr int ROW_CHUNKS = D_QK / 64;      // 16-byte chunks of a row moved by one thread
  constexpr int BLOCK_STRIDE = B_TOPK * 64;  // bytes between 64-byte column blocks of a tile
#pragma unroll
  for (int i = 0; i < ROW_CHUNKS; ++i) cp_async_16(dst + i * BLOCK_STRIDE, src + i * 64, valid);
}

// The kv layout of PrefillParams: row i is D_QK contiguous e4m3 bytes at rows + i * stride, for
// 0 <= i < count. An index outside that range (the caller's -1 padding, or out of bounds) is an
// invalid slot: zero-filled, its valid bit 0, never read.
template <int D_QK>
struct ContiguousRows {
  const uint8_t* rows;
  int64_t stride;  // bytes
  int count;

  __device__ __forceinline__ bool holds(int index) const { return index >= 0 && index < count; }

  // Row `index`'s share of this thread (its chunk `chunk` of each column block) into its place `dst`
  // of a tile; `valid` is holds(index), which the producer also needs for the valid bits.
  __device__ __forceinline__ void copy_row(uint32_t dst, int index, bool valid, int chunk) const {
    const uint8_t* src = rows + (valid ? static_cast<int64_t>(index) * stride : 0) + chunk * 16;
    copy_row_chunks<D_QK>(dst, src, valid);
  }
};

// The engines' paged FP8 cache (KvLayout::kPaged): row i of `count` lies at block i / block_size of
// the cache, row i % block_size of it, ROW_BYTES a row: 512 e4m3 "nope" values in 4 tiles of 128
// columns, tile b's values times its float32 scale (bytes 512 + 4b), then (D_QK 576) the 64 "rope"
// values in bf16. An index outside [0, count) is an invalid slot, as in ContiguousRows.
//
// The tile holds one e4m3 row at one scale per row (the consumers fold it into the row's logit and
// P, consumer.cuh), so the producer requantizes each row after its copies landed (requantize_row):
// the row scale sigma is the largest of its tile scales and of its rope's amax / 448, the tiles whose
// scale is sigma keep their bytes, every other value is rounded once to e4m3 at sigma (through an
// fp16 product, whose 2^-11 relative rounding is far below e4m3's 2^-4), rope included.
template <int D_QK>
struct PagedRows {
  static constexpr int ROW_BYTES = 656;
  static constexpr int SCALES_AT = D_V;           // 4 float32 tile scales
  static constexpr int ROPE_AT = SCALES_AT + 16;  // 64 bf16
  const uint8_t* cache;
  int64_t block_stride;  // bytes between blocks; rows of a block are ROW_BYTES apart
  int block_size;
  int count;

  __device__ __forceinline__ bool holds(int index) const { return index >= 0 && index < count; }

  // Row `index`'s share of this thread into its place `dst` of a tile (its chunk `chunk` of each of the
  // 8 nope column blocks), its rope values 16 * chunk .. + 15 (32 bytes) to `rope_dst` and, for chunk
  // 0, the row's 4 scales to `scale_dst`: all zero-filled without reading the row where !valid.
  __device__ __forceinline__ void copy_row(uint32_t dst, uint32_t scale_dst, uint32_t rope_dst, int index, bool valid,
                                           int chunk) const {
    const uint32_t u = valid ? static_cast<uint32_t>(index) : 0u, b = static_cast<uint32_t>(block_size);
    const uint8_t* src = cache + static_cast<int64_t>(u / b) * block_stride + static_cast<int64_t>(u % b) * ROW_BYTES;
    copy_row_chunks<D_V>(dst, src + chunk * 16, valid);
    if (chunk == 0) cp_async_16(scale_dst, src + SCALES_AT, valid);
    if constexpr (D_QK > D_V) {
      cp_async_16(rope_dst, src + ROPE_AT + 32 * chunk, valid);
      cp_async_16(rope_dst + 16, src + ROPE_AT + 32 * chunk + 16, valid);
    }
  }
};

// The smallest row scale: a row whose tiles and rope are all (near) zero, an unwritten row say, gets
// this one, so that 1 / sigma and log2(sigma) stay finite (values below 448 * 2^-100 read as zero).
constexpr float MIN_ROW_SCALE = 0x1p-100f;

// 16 e4m3 values times f (0 <= f <= 1), rounded to e4m3 again.
__device__ __forceinline__ uint4 scale_e4m3x16(uint4 v, float f) {
  uint32_t w[4] = {v.x, v.y, v.z, v.w};
  uint32_t f2;
  asm("{\n.reg .f16 h;\ncvt.rn.f16.f32 h, %1;\nmov.b32 %0, {h, h};\n}\n" : "=r"(f2) : "f"(f));
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t lo, hi;
    asm("{\n.reg .b16 a, b;\n.reg .b32 x, y;\nmov.b32 {a, b}, %2;\n"
        "cvt.rn.f16x2.e4m3x2 x, a;\ncvt.rn.f16x2.e4m3x2 y, b;\n"
        "mul.rn.f16x2 %0, x, %3;\nmul.rn.f16x2 %1, y, %3;\n}\n"
        : "=r"(lo), "=r"(hi) : "r"(w[i]), "r"(f2));
    uint16_t a, b;
    asm("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;\n" : "=h"(a) : "r"(lo));
    asm("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;\n" : "=h"(b) : "r"(hi));
    w[i] = static_cast<uint32_t>(a) | (static_cast<uint32_t>(b) << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Two bf16 (one 32-bit word, the first in the low half) as floats.
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// This thread's share of a paged row whose copies (PagedRows::copy_row) landed and whose scales are
// visible to it: requantizes its nope chunks (at `dst`, as copied) to the row scale sigma and writes
// its rope values, read from `rope_src`, as e4m3 at sigma into column block 8. Every lane of the warp
// calls it (the row's 4 threads exchange their rope maxima). Returns sigma; NaN where a scale or a rope
// value is NaN, so that the row reads as NaN. (The rope is read twice, not held: the producer has 40
// registers.)
template <int D_QK>
__device__ __forceinline__ float requantize_row(uint32_t dst, float4 scales, uint32_t rope_src, bool valid) {
  constexpr int BLOCK_STRIDE = B_TOPK * 64;
  constexpr uint32_t ROPE_BLOCK = (D_V / 64) * BLOCK_STRIDE;  // the rope's column block in the tile
  float sigma = max_nan(max_nan(scales.x, scales.y), max_nan(scales.z, scales.w));
  if constexpr (D_QK > D_V) {
    float amax = 0.f;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint4 r = ld_shared_v4(rope_src + 16 * half);
      const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) amax = max_nan(amax, max_nan(fabsf(bf16_lo(w[i])), fabsf(bf16_hi(w[i]))));
    }
    sigma = max_nan(sigma, quad_max(amax) * (1.f / 448.f));
  }
  if (!(sigma >= MIN_ROW_SCALE) && !isnan(sigma)) sigma = MIN_ROW_SCALE;
  if (!valid) {  // zero-filled nope; the rope's column block was not copied: zero it (never read unmasked)
    if constexpr (D_QK > D_V) st_shared_v4(dst + ROPE_BLOCK, make_uint4(0u, 0u, 0u, 0u));
    return sigma;
  }
  const float inv = __frcp_rn(sigma);
#pragma unroll
  for (int i = 0; i < D_V / 64; ++i) {
    const float s = i < 2 ? scales.x : i < 4 ? scales.y : i < 6 ? scales.z : scales.w;
    if (s == sigma) continue;  // the row's own scale: its bytes stand
    const uint32_t at = dst + i * BLOCK_STRIDE;
    st_shared_v4(at, scale_e4m3x16(ld_shared_v4(at), s * inv));
  }
  if constexpr (D_QK > D_V) {
    uint32_t out[4];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint4 r = ld_shared_v4(rope_src + 16 * half);
      const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
      for (int i = 0; i < 4; i += 2) {
        out[2 * half + i / 2] = to_e4m3x2(bf16_lo(w[i]) * inv, bf16_hi(w[i]) * inv) |
                                (to_e4m3x2(bf16_lo(w[i + 1]) * inv, bf16_hi(w[i + 1]) * inv) << 16);
      }
    }
    st_shared_v4(dst + ROPE_BLOCK, make_uint4(out[0], out[1], out[2], out[3]));
  }
  return sigma;
}

}  // namespace sparse_mla::sm90::prefill
