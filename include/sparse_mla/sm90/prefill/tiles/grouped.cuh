// The grouped tile (Tile::kGrouped): a token group of G = min(MAX_GROUP, B_H / h_q) adjacent query
// tokens in one 64-row tile, row t * h_q + h holding head h of the group's token t, over the union of
// the tokens' selections (the pre-pass lists it, token_groups/), each row masked to its own token's
// slots. It runs the 64-row pair loop (consumer.cuh) and epilogue (epilogue.cuh) with this file's
// row masks, and takes its work units from the pre-pass's list (scheduler.cuh, group_unit).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include <sparse_mla/params.cuh>
#include <sparse_mla/sm90/prefill/primitives.cuh>
#include <sparse_mla/sm90/prefill/traits.cuh>

namespace sparse_mla::sm90::prefill {

// The grouped tile's own shared memory (SharedStorage, traits.cuh).
template <typename Base>
struct GroupedSharedMembers : Base {
  uint64_t row_valid[NUM_STAGES][2][B_H];  // bit r of [stage][block][row]: slot r of the block is valid
                                           // for the token of tile row `row` (its mask, copied by
                                           // cp.async; rows past the group's take its last token's:
                                           // they are zero in Q and never stored)
  int2 group_unit[2];  // [unit count % 2]: the unit's group and pairs, from the producer to the
                       // consumers (producer.cuh, before its q_full arrival)
};

// The grouped tile's mask: rows h = 0, 1 of the thread belong to different tokens, each with its own
// slots. Only the thread's 16 slots per row are kept, in one register (the pair loop has none to spare).
struct RowMask {
  // The block holds the union of several tokens' rows, and P.V multiplies every row of the tile with
  // every gathered row: a NaN in a row's V would reach, through 0 x NaN, the tokens that did not
  // select it. So the softmax clears V's NaNs where a block may hold one (softmax_to_probs,
  // clear_v_nans).
  static constexpr bool kSharedByTokens = true;
  uint32_t valid;  // bit 8 (j % 4) + 4 (j / 4) + 2h + e: slot 8j + 2c + e is valid for row h
  __device__ __forceinline__ bool is_valid(int k) const {
    const int j = k / 4;
    return ((valid >> (8 * (j % 4) + 4 * (j / 4) + 2 * ((k >> 1) & 1) + (k & 1))) & 1u) != 0;
  }

  // From the valid bits of the block for each row's token (bit r: slot r).
  __device__ __forceinline__ static RowMask of_rows(uint64_t row0, uint64_t row1, int c) {
    const auto thread_bits = [c](uint64_t bits) {  // slot 8j + 2c + e at bit 8 (j % 4) + 4 (j / 4) + e
      const uint32_t lo = (static_cast<uint32_t>(bits) >> (2 * c)) & 0x03030303u;
      const uint32_t hi = (static_cast<uint32_t>(bits >> 32) >> (2 * c)) & 0x03030303u;
      return lo | (hi << 4);
    };
    return {thread_bits(row0) | (thread_bits(row1) << 2)};
  }
};

// Zero every e4m3 NaN byte (S.1111.111) of the V columns (the first D_V of each row) of one gathered
// block, by the 128 threads of its consumer. Adding 1 to a byte's low 7 bits carries into its bit 7
// exactly when they are all ones; prmt's sign mode (selector 8 + i) spreads bit 7 of byte i over it.
// In shared memory, in the softmax's rare exact path: clearing the V fragments in the pair loop's
// registers instead put a branch on every pair's path into P.V, which slowed every grouped call
// (docs/lab.md, Experiment 127).
template <int D_QK, Tile TILE, KvLayout LAYOUT>
__device__ __forceinline__ void clear_v_nans(SharedStorage<D_QK, TILE, LAYOUT>& ss, int stage, int wg) {
  constexpr int V_VECTORS = B_TOPK * D_V / 16;  // column blocks 0 .. D_V / 64: the tile's first bytes
  uint4* const tile = reinterpret_cast<uint4*>(ss.kv[stage][wg]);
  const auto cleared = [](uint32_t x) { return x & ~prmt((x & 0x7f7f7f7fu) + 0x01010101u, 0u, 0xba98u); };
#pragma unroll 1
  for (int v = static_cast<int>(threadIdx.x) % 128; v < V_VECTORS; v += 128) {
    const uint4 x = tile[v];
    tile[v] = make_uint4(cleared(x.x), cleared(x.y), cleared(x.z), cleared(x.w));
  }
}

// The grouped tile's valid bits of this thread's two rows for consumer wg's block of stage `stage`, as
// the producer copied them (one word per row's token). The pair loop loads them before it issues the
// pair's Q.K^T and turns them into a RowMask after, so that the loads' latency passes behind the
// wgmma issue: loaded after it, they waited behind the tensor cores' shared-memory reads (ncu found
// the shifts that take them stalled; at the softmax's start they delayed it too, and the mask lived
// in spilled registers). frag_row(warp, g, 0) comes from the thread index
// alone: through consumer_thread()'s warp shuffle, the loads would wait for the shuffle.
struct RowValidWords {
  uint64_t row0, row1;
  __device__ __forceinline__ RowMask mask() const { return RowMask::of_rows(row0, row1, static_cast<int>(threadIdx.x) & 3); }
};
template <int D_QK, KvLayout LAYOUT>
__device__ __forceinline__ RowValidWords grouped_row_words(const SharedStorage<D_QK, Tile::kGrouped, LAYOUT>& ss, int stage,
                                                           int wg) {
  const int tid = static_cast<int>(threadIdx.x), row = ((tid >> 1) & 0x30) | ((tid >> 2) & 7);
  return {ss.row_valid[stage][wg][row], ss.row_valid[stage][wg][row + 8]};
}

// TileTraits<Tile::kGrouped>::row_token_head without a division per row: row / h_q is (row * inverse) >> 16 with
// inverse = floor(65535 / h_q) + 1 (2^16 / h_q where h_q is a power of two, its ceiling otherwise),
// exact while row * h_q < 2^16 (rows < B_H, h_q <= NARROW_HEADS). The epilogue maps 16 rows a thread
// per unit, and a division each is a visible share of a grouped call (docs/lab.md, Experiment 101).
// The producer's two rows a unit keep row_token_head: with this form its 40 registers spilled.
struct GroupRows {
  int h_q, inverse;
  __device__ __forceinline__ explicit GroupRows(int h_q) : h_q(h_q), inverse(65535 / h_q + 1) {}
  __device__ __forceinline__ int2 token_head(int q_row, int row) const {
    const int token = (row * inverse) >> 16;
    return make_int2(q_row + token, row - token * h_q);
  }
};

template <>
struct TileTraits<Tile::kGrouped> {
  static constexpr int kHeads = B_H;
  static constexpr bool kNarrow = false;
  static constexpr bool kGroups = true;
  static constexpr bool kSplits = false;
  static constexpr bool kCopiesArrive = false;
  template <typename Base>
  using SharedMembers = GroupedSharedMembers<Base>;
  // Tile row `row` (q_row the group's first token, head_begin 0) holds head row % h_q of token
  // q_row + row / h_q. Rows from num_heads on do not exist (zero in Q, never stored).
  __device__ __forceinline__ static int2 row_token_head(const PrefillParams& params, int q_row, int, int row) {
    return make_int2(q_row + row / params.h_q, row % params.h_q);
  }
};

}  // namespace sparse_mla::sm90::prefill
