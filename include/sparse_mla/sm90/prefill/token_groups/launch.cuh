// Token groups: the pre-pass that lets G adjacent query tokens share one 64-row tile.
//
// With h_q <= 32 heads (a tensor-parallel rank), a tile of one token leaves 64 - h_q of its rows
// empty. Neighbouring tokens of a real indexer select mostly the same kv rows, so the grouped tile
// (tiles/grouped.cuh) stacks G = min(MAX_GROUP, 64 / h_q) tokens into one tile (row t * h_q + h: head h
// of token t), gathers the union of their selections once and masks each row to its own token's
// slots. prefill_kernel_token_groups (owner_map.cuh) lists, per group, that union: each distinct valid kv row once,
// first the rows that every token of the group selected, then the others, each part in the order of
// first occurrence in the tokens' slot lists (token 0's, then token 1's, ...; past map_capacity kv
// rows, so chunk by chunk of the owner map), and the set
// of the group's tokens that selected it (its owner bits) as the grouped tile's producer copies them:
// per block of 64 entries, one 64-bit mask per token (group_masks, bit r: entry r of the block).
//
// Multiplicity: a row that a token selects n times counts n times in that token's softmax. A group in
// which some token selects a row more than once (a real indexer never does: its rows are distinct)
// runs its tokens one by one (group_length -1), where every occurrence counts.
//
// Groups of two (h_q 17-32) have a pre-pass of their own, prefill_kernel_token_groups_of_two, which
// writes the same lists from two bitmaps of the kv rows (pairs.cuh).
//
// The list of a group may hold more entries than its tokens' valid slots shared save: when it holds
// more than max_union_ratio entries per valid slot of the group, the group runs its tokens one by one
// too (its list not read). Everything here is a function of the group's own rows: the lists, and
// with them the outputs, are bitwise the same on every launch. Each group is then appended, by one
// atomic, to the unit list of the launch that runs it (group_units, traits.cuh): the order of a list
// varies between launches, but where a group or token runs does not change its outputs.
#pragma once

#include <cuda_runtime.h>

#include <sparse_mla/params.cuh>
#include <sparse_mla/sm90/prefill/primitives.cuh>
#include <sparse_mla/sm90/prefill/token_groups/owner_map.cuh>
#include <sparse_mla/sm90/prefill/token_groups/pairs.cuh>
#include <sparse_mla/sm90/prefill/token_groups/plan.cuh>

namespace sparse_mla::sm90::prefill {

// Launches the zeroing of the unit lists' two counts (prefill_kernel_zero_counts), then the pre-pass
// for p.group_size * TOPK <= MAX_GROUP_SLOTS, one CTA per group, on `stream`; never synchronizes. The
// pre-pass may start as soon as the zeroing has begun, and waits for it only where it appends to the
// counts (decide_group).
template <int TOPK>
cudaError_t launch_token_groups(const TokenGroupParams& p, cudaStream_t stream) {
  if constexpr (max_group_size(TOPK) < 2) {
    return cudaErrorInvalidValue;  // no group of TOPK slots fits: the pre-pass is not compiled
  } else {
    cudaError_t err = launch_zero_counts(p.group_units, 2, stream);
    if (err != cudaSuccess) return err;
    if constexpr (PAIR_KERNEL<TOPK>) {
      if (pair_bitmaps_fit<TOPK>(p.group_size, p.s_kv)) {
        const int smem_bytes = pair_shared_bytes(p.s_kv);
        err = cudaFuncSetAttribute(prefill_kernel_token_groups_of_two<TOPK>,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
        if (err != cudaSuccess) return err;
        return launch_kernel(prefill_kernel_token_groups_of_two<TOPK>, p, num_groups(p), GROUP_THREADS, smem_bytes,
                             stream, true);
      }
    }
    const int bits = group_map_bits<TOPK>(p.group_size, p.s_kv);
    int device = 0, sms = 0;
    err = cudaGetDevice(&device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err != cudaSuccess) return err;
    const int threads = group_threads<TOPK>(p.group_size, p.s_kv, bits, num_groups(p) <= sms);
    const int smem_bytes = group_cta_bytes<TOPK>(p.group_size, p.s_kv, bits, threads);
    auto kernel = prefill_kernel_token_groups<TOPK, 8, GROUP_THREADS>;
    if (threads == WIDE_GROUP_THREADS) kernel = prefill_kernel_token_groups<TOPK, 8, WIDE_GROUP_THREADS>;
    if constexpr (GROUP_CTAS_PER_SM<TOPK> == 3) {
      if (bits == 2) kernel = prefill_kernel_token_groups<TOPK, 2, GROUP_THREADS>;
      if (bits == 4) kernel = prefill_kernel_token_groups<TOPK, 4, GROUP_THREADS>;
    }
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
    if (err != cudaSuccess) return err;
    return launch_kernel(kernel, p, num_groups(p), threads, smem_bytes, stream, true);
  }
}

}  // namespace sparse_mla::sm90::prefill
