// Groups of two tokens (h_q 17-32) have three kinds of entry, each in the order of its slots: the
// rows both tokens selected (made by token 0), token 0's own, token 1's own. Their list and masks
// need no owner map and no rounds: with a bitmap of the kv rows each token selected (s_kv bits
// each), a slot's kind is one bit of the other token's bitmap, every slot of one kind is placed by
// a ballot and a scan of the warps' counts, and each token's mask is a range of the list: token 0
// owns its first common + own0 entries, token 1 the common ones and the last own1. The list and the
// masks are bitwise those of prefill_kernel_token_groups wherever its map holds the kv rows in one
// chunk (pair_bitmaps_fit), in less time where groups pay: far fewer instructions a thread than that
// kernel's rounds, list pass and masks (docs/lab.md, Experiment 76). Where no group pays (uniform
// selections) it is slightly slower: it classifies every slot before it knows.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include <sparse_mla/params.cuh>
#include <sparse_mla/sm90/prefill/primitives.cuh>
#include <sparse_mla/sm90/prefill/token_groups/common.cuh>
#include <sparse_mla/sm90/prefill/token_groups/plan.cuh>
#include <sparse_mla/sm90/prefill/traits.cuh>

namespace sparse_mla::sm90::prefill {

// Bits [begin, end) of the list that fall in the block of 64 entries from block_begin, as its mask.
__device__ __forceinline__ uint64_t range_bits(uint32_t begin, uint32_t end, uint32_t block_begin) {
  const uint32_t lo = min(max(begin, block_begin), block_begin + B_TOPK) - block_begin;
  const uint32_t hi = min(max(end, block_begin), block_begin + B_TOPK) - block_begin;
  if (hi <= lo) return 0;
  return (hi == B_TOPK ? ~0ull : (1ull << hi) - 1) & ~((1ull << lo) - 1);
}

// Token t's mask of each block a pair reads: its ranges of the list, token 0's [0, own0_end),
// token 1's [0, common) and [own0_end, entries).
template <int TOPK>
__device__ __forceinline__ void write_pair_masks(const TokenGroupParams& p, uint32_t common, uint32_t own0_end,
                                                 uint32_t entries) {
  uint64_t* masks = p.group_masks + static_cast<int64_t>(blockIdx.x) * group_mask_blocks(2 * TOPK) * 2;
  const int list_blocks = group_mask_blocks(static_cast<int>(entries));
  for (int w = threadIdx.x; w < 2 * list_blocks; w += GROUP_THREADS) {
    const uint32_t block_begin = w / 2 * B_TOPK;
    masks[w] = w % 2 == 0 ? range_bits(0, own0_end, block_begin)
                          : range_bits(0, common, block_begin) | range_bits(own0_end, entries, block_begin);
  }
}

// Four CTAs an SM up to topk 2048 (32 registers, no spills; its shared memory allows four up to s_kv
// ~229K): faster than three, as the loads' latency is what a CTA waits for.
template <int TOPK>
__global__ void __launch_bounds__(GROUP_THREADS, (GROUP_WARP_ROWS<TOPK> <= 4 ? 4 : 2))
    prefill_kernel_token_groups_of_two(const __grid_constant__ TokenGroupParams p) {
  allow_dependent_grid();  // as in prefill_kernel_token_groups
  constexpr int WARPS = GROUP_THREADS / 32, WARP_ROWS = GROUP_WARP_ROWS<TOPK>;
  static_assert(PAIR_KERNEL<TOPK>, "a thread's slots fit its registers, their kinds a word");
  static_assert(2 * TOPK <= MAX_GROUP_SLOTS, "the group's counts fit the 16-bit halves of warp_counts");
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const uint32_t words = pair_bitmap_words(p.s_kv);
  extern __shared__ __align__(16) uint32_t bitmap_words[];
  uint32_t* selected = bitmap_words;  // token t's bitmap: selected + t * words
  // Per warp, its counts of common (low 16 bits) and own0 entries, then of own1 entries and valid
  // slots: two 16-bit counts a word (a group has at most MAX_GROUP_SLOTS slots).
  uint32_t* warp_counts = bitmap_words + 2 * words;

  const int first_token = blockIdx.x * 2, tokens = min(2, p.s_q - first_token);
  const int first_slot = warp * WARP_ROWS * 32 + lane;  // of the thread's first row, in a token
  const int32_t* group_in = p.indices + static_cast<int64_t>(first_token) * TOPK + first_slot;
  constexpr bool ROWS_TILE_TOPK = WARP_ROWS * 32 * WARPS == TOPK;
  const auto in_topk = [&](int i) { return ROWS_TILE_TOPK || first_slot + 32 * i < TOPK; };
  // The thread's slots of both tokens (a tail group's missing token reads token 0's, and has no
  // valid slot), loaded before the bitmaps are cleared so that their latency overlaps the clearing
  // and its barrier.
  int32_t key[2][WARP_ROWS];
  int length[2];
#pragma unroll
  for (int t = 0; t < 2; ++t) {
    length[t] = t >= tokens ? 0 : p.topk_length == nullptr ? TOPK : min(max(__ldg(p.topk_length + first_token + t), 0), TOPK);
#pragma unroll
    for (int i = 0; i < WARP_ROWS; ++i) key[t][i] = in_topk(i) ? __ldg(group_in + min(t, tokens - 1) * TOPK + 32 * i) : -1;
  }
  for (uint32_t v = threadIdx.x; v < 2 * words / 4; v += GROUP_THREADS) reinterpret_cast<uint4*>(selected)[v] = uint4{};
  __syncthreads();
  // -1 where not valid (past its token's length, or not a kv row). Branch-free, so that the atomics
  // issue back to back (a slot that is not valid ORs 0 into word `lane`); the old word tells a token
  // that selected the row twice.
  uint32_t duplicate = 0;
#pragma unroll
  for (int t = 0; t < 2; ++t) {
#pragma unroll
    for (int i = 0; i < WARP_ROWS; ++i) {
      if (first_slot + 32 * i >= length[t] || static_cast<uint32_t>(key[t][i]) >= static_cast<uint32_t>(p.s_kv)) key[t][i] = -1;
      const int32_t k = key[t][i];
      const uint32_t bit = k >= 0 ? 1u << (k % 32) : 0u;
      duplicate |= atomicOr(selected + t * words + (k >= 0 ? k / 32 : lane), bit) & bit;
    }
  }
  if (__syncthreads_or(duplicate != 0)) {  // block-uniform: its tokens run one by one
    if (threadIdx.x == 0) decide_group(p, -1);
    return;
  }
  // Each slot's kind: a valid slot of token 0 is common where token 1 selected its row too, its own
  // (own0) where not; one of token 1 makes an entry (own1) only where token 0 did not select its row.
  // Bit i of `kinds`: the thread's slot of row i of token 0 is common; bit WARP_ROWS + i: that of
  // token 1 is own1.
  uint32_t kinds = 0, common_own0 = 0, own1_valid = 0;
#pragma unroll
  for (int t = 0; t < 2; ++t) {
#pragma unroll
    for (int i = 0; i < WARP_ROWS; ++i) {
      const int32_t k = key[t][i];
      const bool valid = k >= 0, other = valid && ((selected[(1 - t) * words + k / 32] >> (k % 32)) & 1u) != 0;
      if (t == 0) {
        kinds |= static_cast<uint32_t>(other) << i;
        common_own0 += other ? 1u : valid ? 1u << 16 : 0u;
      } else {
        kinds |= static_cast<uint32_t>(valid && !other) << (WARP_ROWS + i);
        own1_valid += valid && !other ? 1u : 0u;
      }
      own1_valid += valid ? 1u << 16 : 0u;
    }
  }
  common_own0 = __reduce_add_sync(0xffffffffu, common_own0);
  own1_valid = __reduce_add_sync(0xffffffffu, own1_valid);
  if (lane == 0) {
    warp_counts[warp] = common_own0;
    warp_counts[WARPS + warp] = own1_valid;
  }
  __syncthreads();
  // Every warp scans the warps' counts itself: those of the warps before it, and of all.
  uint32_t before[2], total[2];
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const uint2 scan = scan_warp_counts<WARPS>(lane < WARPS ? warp_counts[c * WARPS + lane] : 0u, warp);
    before[c] = scan.x;
    total[c] = scan.y;
  }
  const uint32_t common = total[0] & 0xffffu, own0_end = common + (total[0] >> 16);
  const uint32_t entries = own0_end + (total[1] & 0xffffu), valid_slots = total[1] >> 16;
  // A group without valid slots runs grouped: its rows' outputs are those of empty rows either way.
  const bool pays = entries == 0 || static_cast<float>(entries) <= p.max_union_ratio * static_cast<float>(valid_slots);
  if (threadIdx.x == 0) decide_group(p, pays ? static_cast<int32_t>(entries) : -1);
  if (!pays) return;  // its tokens run one by one: no list is read

  // Each kind's entries placed by ballots, in slot order: the warps' before, then the rows', lanes'.
  int32_t* list = p.group_indices + static_cast<int64_t>(blockIdx.x) * 2 * TOPK;
  uint32_t at_common = before[0] & 0xffffu, at_own0 = common + (before[0] >> 16), at_own1 = own0_end + (before[1] & 0xffffu);
  const uint32_t below = (1u << lane) - 1;
#pragma unroll
  for (int i = 0; i < WARP_ROWS; ++i) {
    const int32_t k = key[0][i];
    const bool is_common = ((kinds >> i) & 1u) != 0;
    const uint32_t commons = __ballot_sync(0xffffffffu, is_common), own0s = __ballot_sync(0xffffffffu, k >= 0) & ~commons;
    if (k >= 0) list[is_common ? at_common + __popc(commons & below) : at_own0 + __popc(own0s & below)] = k;
    at_common += __popc(commons);
    at_own0 += __popc(own0s);
  }
#pragma unroll
  for (int i = 0; i < WARP_ROWS; ++i) {
    const bool is_own1 = ((kinds >> (WARP_ROWS + i)) & 1u) != 0;
    const uint32_t own1s = __ballot_sync(0xffffffffu, is_own1);
    if (is_own1) list[at_own1 + __popc(own1s & below)] = key[1][i];
    at_own1 += __popc(own1s);
  }
  write_pair_masks<TOPK>(p, common, own0_end, entries);
}

}  // namespace sparse_mla::sm90::prefill
