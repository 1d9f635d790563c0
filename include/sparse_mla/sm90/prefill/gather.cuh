// The producer's row gather (producer.cuh): where a kv row lies in global memory, whether a slot's index
// names one, and how a producer thread copies its share of a row into a 64-byte swizzled tile. The
// layout of the rows is this file's policy, not the tiles': produce_unit takes a kv row only through
// ContiguousRows, so that another layout of the cache (paged FP8 rows with their per-column-block
// scales, say) is one more type with the same members, and every tile runs on it unchanged.
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

}  // namespace sparse_mla::sm90::prefill
