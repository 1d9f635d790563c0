// The wide tile (Tile::kWide): 64 heads of one query token, for h_q > NARROW_HEADS and for every call
// with a tail split. It runs the 64-row pair loop (consumer.cuh) and epilogue (epilogue.cuh) with one
// mask for every row of a block (BlockMask).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include <sparse_mla/params.cuh>
#include <sparse_mla/sm90/prefill/traits.cuh>

namespace sparse_mla::sm90::prefill {

// The wide tile's own shared memory (SharedStorage, traits.cuh): no members, but bytes kept free. When
// every tile's storage held every tile's members, the narrow tiles' (as many bytes as these) came
// before the barriers, and the wide tile measured slower with its barriers moved up by that much
// (docs/lab.md, per-tile shared storage): they stay where they were, until a layout without the free
// bytes measures as fast.
template <typename Base>
struct WideSharedMembers : Base {
  uint8_t unused[2176];
};

// Which of this thread's logits of a block have a valid slot: the wide tile's mask, one for all rows.
struct BlockMask {
  static constexpr bool kSharedByTokens = false;  // see RowMask
  uint64_t valid;  // the block's valid bits, shifted so that bit 8j + e is slot 8j + 2c + e
  // s[k]'s slot is valid (k = 4j + 2h + e).
  __device__ __forceinline__ bool is_valid(int k) const { return ((valid >> (8 * (k / 4) + (k & 1))) & 1u) != 0; }
};

template <>
struct TileTraits<Tile::kWide> {
  static constexpr int kHeads = B_H;
  static constexpr bool kNarrow = false;
  static constexpr bool kGroups = false;
  static constexpr bool kSplits = true;
  static constexpr bool kCopiesArrive = false;
  template <typename Base>
  using SharedMembers = WideSharedMembers<Base>;
  // Tile row `row` holds head head_begin + row of token q_row. Rows from num_heads on do not exist
  // (zero in Q, never stored).
  __device__ __forceinline__ static int2 row_token_head(const PrefillParams&, int q_row, int head_begin, int row) {
    return make_int2(q_row, head_begin + row);
  }
};

}  // namespace sparse_mla::sm90::prefill
