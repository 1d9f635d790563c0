// Token groups: the pre-pass that lets G adjacent query tokens share one 64-row tile.
//
// With h_q <= 32 heads (a tensor-parallel rank), a tile of one token leaves 64 - h_q of its rows
// empty. Neighbouring tokens of a real indexer select mostly the same kv rows, so the grouped tile
// (Tile::kGrouped) stacks G = min(MAX_GROUP, 64 / h_q) tokens into one tile (row t * h_q + h: head h
// of token t), gathers the union of their selections once and masks each row to its own token's
// slots. prefill_kernel_token_groups lists, per group, that union: each distinct valid kv row once, with the
// set of the group's tokens that selected it (its owner bits), in the order of first occurrence in
// the tokens' slot lists (token 0's, then token 1's, ...).
//
// Multiplicity: a row that a token selects n times counts n times in that token's softmax. A row
// that some token selects more than once is listed once per occurrence for each such token, owned
// by that token alone; the shared entry keeps only the tokens that selected it once.
//
// The list of a group may hold more entries than its tokens' valid slots shared save: when it holds
// more than max_union_ratio entries per valid slot of the group, the group runs its tokens one by one
// (group_length -1). Everything here is a function of the group's own rows: the lists, and with them
// the outputs, are bitwise the same on every launch.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include <sparse_mla/params.cuh>
#include <sparse_mla/sm90/prefill/traits.cuh>

namespace sparse_mla::sm90::prefill {

constexpr int GROUP_THREADS = 512;
// G * TOPK at most: the hash table holds twice that many 6-byte entries in shared memory (192 KB),
// beside 2 bytes per slot.
constexpr int MAX_GROUP_SLOTS = 16384;
constexpr uint32_t EMPTY_KEY = 0xffffffffu;  // no valid index is: s_kv <= INT32_MAX

// Entries of a group's hash table: a power of two, at least twice the group's slots (so a probe is short).
__host__ __device__ constexpr int group_table_log2(int slots) {
  int log2 = 1;
  while ((1 << log2) < 2 * slots) ++log2;
  return log2;
}
// Shared memory of a group's CTA: keys, 2-byte flags, each slot's 2-byte entry, the warps' counts.
__host__ __device__ constexpr int group_table_bytes(int slots) {
  return (1 << group_table_log2(slots)) * 6 + (slots + (slots & 1)) * 2 + (GROUP_THREADS / 32) * 4;
}
static_assert(group_table_bytes(MAX_GROUP_SLOTS) <= SHARED_MEMORY_PER_BLOCK, "the largest table fits");

// One CTA per group. Warp w takes a contiguous range of the group's slots in (token, slot) order,
// its lanes consecutive slots, so that index loads and list stores are coalesced and a ballot gives
// each entry its place. A thread's shared-memory round trips (probe, claim, owner bits) are issued for
// a batch of slots before any result is used, and two CTAs share an SM where the table allows.
// (Named like the prefill kernel, so that one kernel-name filter of the sanitizer tests takes both.)
template <int TOPK>
__global__ void __launch_bounds__(GROUP_THREADS, 2) prefill_kernel_token_groups(const __grid_constant__ TokenGroupParams p) {
  constexpr int WARPS = GROUP_THREADS / 32;
  constexpr int BATCH = 8;                  // slots per lane in flight
  constexpr uint16_t NO_ENTRY = 0xffffu;   // an invalid slot (table entries are < 2^15)
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int group_size = p.group_size;
  const int slots = group_size * TOPK;
  const int table_log2 = group_table_log2(slots);
  const uint32_t table_mask = (1u << table_log2) - 1;
  extern __shared__ uint32_t table[];
  uint32_t* keys = table;                                                   // the kv row, or EMPTY_KEY
  uint16_t* flags = reinterpret_cast<uint16_t*>(keys + (1 << table_log2));  // owners | owners with duplicates << 8
  uint16_t* slot_entry = flags + (1 << table_log2);                         // each slot's entry, or NO_ENTRY
  uint32_t* warp_sums = reinterpret_cast<uint32_t*>(slot_entry + slots + (slots & 1));

  for (int e = threadIdx.x; e < (1 << table_log2); e += GROUP_THREADS) {
    keys[e] = EMPTY_KEY;
    flags[e] = 0;
  }
  __syncthreads();

  const int first_token = blockIdx.x * group_size;
  const int per_warp = ((slots + WARPS - 1) / WARPS + 31) / 32 * 32;
  const int begin = warp * per_warp, end = min(begin + per_warp, slots);

  // Insert every valid slot (a read first: most rows are already in, selected by a neighbour); a
  // token that meets its own bit again has the row more than once.
  for (int batch = begin; batch < end; batch += 32 * BATCH) {
    int32_t index[BATCH];
    uint32_t e[BATCH];
    bool placed[BATCH];
#pragma unroll
    for (int i = 0; i < BATCH; ++i) {
      const int slot = batch + 32 * i + lane, t = slot / TOPK, j = slot - t * TOPK;
      const int token = first_token + t;
      index[i] = -1;
      if (slot < end && token < p.s_q) {
        const int length = p.topk_length == nullptr ? TOPK : min(max(__ldg(p.topk_length + token), 0), TOPK);
        if (j < length) index[i] = __ldg(p.indices + static_cast<int64_t>(token) * TOPK + j);
      }
    }
#pragma unroll
    for (int i = 0; i < BATCH; ++i) {
      placed[i] = index[i] < 0 || index[i] >= p.s_kv;  // an invalid slot has no entry
      e[i] = (static_cast<uint32_t>(index[i]) * 2654435761u) >> (32 - table_log2);
    }
    for (bool searching = true; searching;) {
      uint32_t found[BATCH];
#pragma unroll
      for (int i = 0; i < BATCH; ++i) found[i] = placed[i] ? 0u : keys[e[i]];
#pragma unroll
      for (int i = 0; i < BATCH; ++i) {
        if (!placed[i] && found[i] == EMPTY_KEY) found[i] = atomicCAS(keys + e[i], EMPTY_KEY, static_cast<uint32_t>(index[i]));
      }
      searching = false;
#pragma unroll
      for (int i = 0; i < BATCH; ++i) {
        if (placed[i]) continue;
        if (found[i] == EMPTY_KEY || found[i] == static_cast<uint32_t>(index[i])) {
          placed[i] = true;
        } else {
          e[i] = (e[i] + 1) & table_mask;
          searching = true;
        }
      }
    }
    uint32_t before[BATCH];
#pragma unroll
    for (int i = 0; i < BATCH; ++i) {
      const int slot = batch + 32 * i + lane, t = slot / TOPK;
      const bool valid = slot < end && index[i] >= 0 && index[i] < p.s_kv;
      before[i] = valid ? atomicOr(reinterpret_cast<uint32_t*>(flags) + e[i] / 2, (1u << t) << (16 * (e[i] & 1))) : 0u;
      if (slot < end) slot_entry[slot] = valid ? static_cast<uint16_t>(e[i]) : NO_ENTRY;
    }
#pragma unroll
    for (int i = 0; i < BATCH; ++i) {
      const int t = (batch + 32 * i + lane) / TOPK, shift = 16 * (e[i] & 1);
      if ((before[i] >> shift) & (1u << t)) atomicOr(reinterpret_cast<uint32_t*>(flags) + e[i] / 2, (1u << (8 + t)) << shift);
    }
  }
  __syncthreads();

  // Which slots make an entry of the list: a duplicated row's every occurrence, for its token alone;
  // otherwise, once per row, the slot of the lowest token among those that selected it once. Counted
  // per warp, the warps' counts scanned, then each entry written at its place.
  const auto owner_of = [&](int slot) -> uint32_t {
    if (slot >= end) return 0u;
    const uint32_t e = slot_entry[slot];
    if (e == NO_ENTRY) return 0u;
    const int t = slot / TOPK;
    const uint32_t f = flags[e];
    const uint32_t once = (f & 0xffu) & ~(f >> 8);
    if ((f >> (8 + t)) & 1u) return 1u << t;
    return __ffs(once) - 1 == t ? once : 0u;
  };
  uint32_t emit = 0, valid = 0;
#pragma unroll 4
  for (int slot = begin + lane; slot < end; slot += 32) {
    emit += owner_of(slot) != 0;
    valid += slot_entry[slot] != NO_ENTRY;
  }
#pragma unroll
  for (int d = 16; d > 0; d /= 2) {
    emit += __shfl_xor_sync(0xffffffffu, emit, d);
    valid += __shfl_xor_sync(0xffffffffu, valid, d);
  }
  if (lane == 0) warp_sums[warp] = emit | (valid << 16);  // each at most MAX_GROUP_SLOTS < 2^16
  __syncthreads();
  uint32_t at = 0, total = 0;
  for (int w = 0; w < WARPS; ++w) {
    const uint32_t sums = warp_sums[w];
    at += w < warp ? sums & 0xffffu : 0u;
    total += sums;
  }
  const int64_t list = static_cast<int64_t>(blockIdx.x) * slots;
  for (int base = begin; base < end; base += 32) {
    const int slot = base + lane;
    const uint32_t owner = owner_of(slot);
    const uint32_t ballot = __ballot_sync(0xffffffffu, owner != 0);
    if (owner != 0) {
      const uint32_t place = at + __popc(ballot & ((1u << lane) - 1));
      p.group_indices[list + place] = static_cast<int32_t>(keys[slot_entry[slot]]);
      p.group_owners[list + place] = static_cast<uint8_t>(owner);
    }
    at += __popc(ballot);
  }
  if (threadIdx.x == 0) {
    const uint32_t entries = total & 0xffffu, valid_slots = total >> 16;
    // A group without valid slots runs grouped: its rows' outputs are those of empty rows either way.
    const bool pays = entries == 0 || static_cast<float>(entries) <= p.max_union_ratio * static_cast<float>(valid_slots);
    p.group_length[blockIdx.x] = pays ? static_cast<int32_t>(entries) : -1;
  }
}

// Launches the pre-pass for p.group_size * TOPK <= MAX_GROUP_SLOTS on `stream`; never synchronizes.
template <int TOPK>
cudaError_t launch_token_groups(const TokenGroupParams& p, cudaStream_t stream) {
  const int slots = p.group_size * TOPK;
  const int smem_bytes = group_table_bytes(slots);
  auto kernel = prefill_kernel_token_groups<TOPK>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err != cudaSuccess) return err;
  const int groups = p.s_q / p.group_size + (p.s_q % p.group_size != 0);
  kernel<<<groups, GROUP_THREADS, smem_bytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace sparse_mla::sm90::prefill
