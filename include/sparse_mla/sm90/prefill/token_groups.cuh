// Token groups: the pre-pass that lets G adjacent query tokens share one 64-row tile.
//
// With h_q <= 32 heads (a tensor-parallel rank), a tile of one token leaves 64 - h_q of its rows
// empty. Neighbouring tokens of a real indexer select mostly the same kv rows, so the grouped tile
// (Tile::kGrouped) stacks G = min(MAX_GROUP, 64 / h_q) tokens into one tile (row t * h_q + h: head h
// of token t), gathers the union of their selections once and masks each row to its own token's
// slots. prefill_kernel_token_groups lists, per group, that union: each distinct valid kv row once, in the
// order of first occurrence in the tokens' slot lists (token 0's, then token 1's, ...), and the set
// of the group's tokens that selected it (its owner bits) as the grouped tile's producer copies them:
// per block of 64 entries, one 64-bit mask per token (group_masks, bit r: entry r of the block).
//
// Multiplicity: a row that a token selects n times counts n times in that token's softmax. A row
// that some token selects more than once is listed once per occurrence for each such token, owned
// by that token alone; the shared entry keeps only the tokens that selected it once.
//
// The list of a group may hold more entries than its tokens' valid slots shared save: when it holds
// more than max_union_ratio entries per valid slot of the group, the group runs its tokens one by one
// (group_length -1, its list not written). Everything here is a function of the group's own rows:
// the lists, and with them the outputs, are bitwise the same on every launch.
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
// Shared memory of a group's CTA: keys, 2-byte flags, each slot's 2-byte entry, the warps' counts, the
// tokens' lengths.
__host__ __device__ constexpr int group_table_bytes(int slots) {
  return (1 << group_table_log2(slots)) * 6 + (slots + (slots & 1)) * 2 + (GROUP_THREADS / 32) * 4 + MAX_GROUP * 4;
}
static_assert(group_table_bytes(MAX_GROUP_SLOTS) <= SHARED_MEMORY_PER_BLOCK, "the largest table fits");
static_assert(MAX_GROUP <= 8, "an entry's owner bits fit a byte (the keys' memory holds them)");

// One CTA per group; two share an SM where the table allows. Warp w takes a contiguous range of the
// group's slots in (token, slot) order, its lanes consecutive slots (row r of the warp: 32 slots),
// so that index loads and list stores are coalesced and a ballot gives each entry its place. The
// work per slot is kept to a few instructions, since the pass is bound by their issue: every index
// load is in flight while the table is cleared, a row's first probe and claim are issued for a batch
// of rows before any result is used (only a collision walks on, alone), and a group that falls back
// writes no list.
// (Named like the prefill kernel, so that one kernel-name filter of the sanitizer tests takes both.)
template <int TOPK>
__global__ void __launch_bounds__(GROUP_THREADS, 2) prefill_kernel_token_groups(const __grid_constant__ TokenGroupParams p) {
  constexpr int WARPS = GROUP_THREADS / 32;
  constexpr int ROWS = MAX_GROUP_SLOTS / GROUP_THREADS;  // a warp's rows of 32 slots, at most
  // Rows whose round trips are in flight together (fewer where slot / TOPK is not a shift: registers).
  constexpr int BATCH = (TOPK & (TOPK - 1)) == 0 ? 8 : 4;
  constexpr uint16_t NO_ENTRY = 0xffffu;                  // an invalid slot (table entries are < 2^15)
  static_assert(ROWS % BATCH == 0, "whole batches");
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int group_size = p.group_size;
  const int slots = group_size * TOPK;
  const int table_log2 = group_table_log2(slots), table_entries = 1 << table_log2;
  const uint32_t table_mask = table_entries - 1;
  extern __shared__ __align__(16) uint32_t table[];
  uint32_t* keys = table;                                                // the kv row, or EMPTY_KEY
  uint16_t* flags = reinterpret_cast<uint16_t*>(keys + table_entries);   // owners | owners with duplicates << 8
  uint16_t* slot_entry = flags + table_entries;                          // each slot's entry, or NO_ENTRY
  uint32_t* warp_sums = reinterpret_cast<uint32_t*>(slot_entry + slots + (slots & 1));
  int* lengths = reinterpret_cast<int*>(warp_sums + WARPS);              // each token's valid slots

  // The group's slots are contiguous in `indices`; the tail group's slots past s_q have none.
  const int first_token = blockIdx.x * group_size;
  const int per_warp = ((slots + WARPS - 1) / WARPS + 31) / 32 * 32;
  const int begin = warp * per_warp, end = min(begin + per_warp, slots);
  const int loaded = min(end, min(p.s_q - first_token, group_size) * TOPK);
  const int32_t* group_in = p.indices + static_cast<int64_t>(first_token) * TOPK;
  // A batch's index loads are issued one batch ahead: the first while the table is cleared.
  const auto load_batch = [&](int32_t(&index)[BATCH], int r0) {
#pragma unroll
    for (int i = 0; i < BATCH; ++i) {
      const int slot = begin + 32 * (r0 + i) + lane;
      index[i] = slot < loaded ? __ldg(group_in + slot) : -1;
    }
  };
  int32_t index[BATCH], next[BATCH];
  load_batch(next, 0);
  if (threadIdx.x < group_size) {
    const int token = first_token + threadIdx.x;
    lengths[threadIdx.x] = token >= p.s_q               ? 0
                           : p.topk_length == nullptr ? TOPK
                                                      : min(max(__ldg(p.topk_length + token), 0), TOPK);
  }
  // table_entries >= 4: a multiple of the vectors'.
  for (int v = threadIdx.x; v < table_entries / 4; v += GROUP_THREADS) {
    reinterpret_cast<uint4*>(keys)[v] = make_uint4(EMPTY_KEY, EMPTY_KEY, EMPTY_KEY, EMPTY_KEY);
    reinterpret_cast<uint2*>(flags)[v] = make_uint2(0u, 0u);
  }
  __syncthreads();

  // Insert every valid slot: find its row's entry, claiming an empty one, then set the token's owner
  // bit; a token that meets its own bit again has the row more than once.
  uint32_t valid_slots = 0;
#pragma unroll 1
  for (int r0 = 0; r0 < ROWS; r0 += BATCH) {
    if (begin + 32 * r0 >= end) break;  // warp-uniform
#pragma unroll
    for (int i = 0; i < BATCH; ++i) index[i] = next[i];
    if (r0 + BATCH < ROWS && begin + 32 * (r0 + BATCH) < end) load_batch(next, r0 + BATCH);
    uint32_t e[BATCH], found[BATCH];
    bool valid[BATCH];
#pragma unroll
    for (int i = 0; i < BATCH; ++i) {
      const int slot = begin + 32 * (r0 + i) + lane;
      const uint32_t t = static_cast<uint32_t>(slot) / TOPK;
      const int32_t key = index[i];
      valid[i] = slot < end && key >= 0 && key < p.s_kv && slot - t * TOPK < lengths[t];
      e[i] = (static_cast<uint32_t>(key) * 2654435761u) >> (32 - table_log2);
      found[i] = valid[i] ? keys[e[i]] : 0u;
    }
#pragma unroll
    for (int i = 0; i < BATCH; ++i) {
      if (valid[i] && found[i] == EMPTY_KEY) found[i] = atomicCAS(keys + e[i], EMPTY_KEY, static_cast<uint32_t>(index[i]));
    }
#pragma unroll
    for (int i = 0; i < BATCH; ++i) {
      const uint32_t key = static_cast<uint32_t>(index[i]);
      while (valid[i] && found[i] != EMPTY_KEY && found[i] != key) {  // a collision: walk on
        e[i] = (e[i] + 1) & table_mask;
        found[i] = keys[e[i]];
        if (found[i] == EMPTY_KEY) found[i] = atomicCAS(keys + e[i], EMPTY_KEY, key);
      }
      // The lanes meet again here: the rest of the batch would otherwise run once for each set of
      // lanes that walked (measured: twice the instructions of the whole pass).
      __syncwarp();
    }
    uint32_t before[BATCH];
#pragma unroll
    for (int i = 0; i < BATCH; ++i) {
      const int slot = begin + 32 * (r0 + i) + lane;
      const uint32_t t = static_cast<uint32_t>(slot) / TOPK;
      before[i] = valid[i] ? atomicOr(reinterpret_cast<uint32_t*>(flags) + e[i] / 2, (1u << t) << (16 * (e[i] & 1))) : 0u;
      if (slot < end) slot_entry[slot] = valid[i] ? static_cast<uint16_t>(e[i]) : NO_ENTRY;
      valid_slots += valid[i];
    }
#pragma unroll
    for (int i = 0; i < BATCH; ++i) {
      const uint32_t t = static_cast<uint32_t>(begin + 32 * (r0 + i) + lane) / TOPK, shift = 16 * (e[i] & 1);
      if ((before[i] >> shift) & (1u << t)) atomicOr(reinterpret_cast<uint32_t*>(flags) + e[i] / 2, (1u << (8 + t)) << shift);
    }
  }
  __syncthreads();

  // Which slots make an entry of the list: a duplicated row's every occurrence, for its token alone;
  // otherwise, once per row, the slot of the lowest token among those that selected it once. A thread
  // decides for its own slots and keeps the answer, the entry's owner bits (0: none), in place of the
  // slot's table entry; the warps' counts are scanned, then each entry is written at its place.
  uint32_t emit = 0;
#pragma unroll 4
  for (int base = begin; base < end; base += 32) {
    const int slot = base + lane;
    if (slot >= end) break;
    const uint32_t e = slot_entry[slot];
    uint32_t owner = 0;
    if (e != NO_ENTRY) {
      const uint32_t t = static_cast<uint32_t>(slot) / TOPK, f = flags[e];
      const uint32_t once = (f & 0xffu) & ~(f >> 8);
      owner = (f >> (8 + t)) & 1u ? 1u << t : __ffs(once) - 1 == t ? once : 0u;
    }
    slot_entry[slot] = static_cast<uint16_t>(owner);
    emit += owner != 0;
  }
#pragma unroll
  for (int d = 16; d > 0; d /= 2) {
    emit += __shfl_xor_sync(0xffffffffu, emit, d);
    valid_slots += __shfl_xor_sync(0xffffffffu, valid_slots, d);
  }
  if (lane == 0) warp_sums[warp] = emit | (valid_slots << 16);  // each at most MAX_GROUP_SLOTS < 2^16
  __syncthreads();
  uint32_t at = 0, total = 0;
#pragma unroll
  for (int w = 0; w < WARPS; ++w) {
    const uint32_t sums = warp_sums[w];
    at += w < warp ? sums & 0xffffu : 0u;
    total += sums;
  }
  const uint32_t entries = total & 0xffffu, group_valid_slots = total >> 16;
  // A group without valid slots runs grouped: its rows' outputs are those of empty rows either way.
  const bool pays = entries == 0 || static_cast<float>(entries) <= p.max_union_ratio * static_cast<float>(group_valid_slots);
  if (threadIdx.x == 0) p.group_length[blockIdx.x] = pays ? static_cast<int32_t>(entries) : -1;
  if (!pays) return;  // its tokens run one by one: no list is read
  // Each entry's kv row goes to the list, its owner bits to entry_owner (the keys are no longer read).
  uint8_t* entry_owner = reinterpret_cast<uint8_t*>(keys);
  const int64_t list = static_cast<int64_t>(blockIdx.x) * slots;
#pragma unroll 4
  for (int base = begin; base < end; base += 32) {
    const int slot = base + lane;
    const uint32_t owner = slot < end ? slot_entry[slot] : 0u;
    const uint32_t ballot = __ballot_sync(0xffffffffu, owner != 0);
    if (owner != 0) {
      const uint32_t place = at + __popc(ballot & ((1u << lane) - 1));
      p.group_indices[list + place] = __ldg(group_in + slot);  // the slot's own kv row
      entry_owner[place] = static_cast<uint8_t>(owner);
    }
    at += __popc(ballot);
  }
  __syncthreads();

  // The owner bits transposed, block by block: token t's mask is a ballot of bit t over the block's
  // entries (0 past the list, up to the end of its last pair).
  const int words = group_mask_words(group_size);
  uint64_t* masks = p.group_masks + static_cast<int64_t>(blockIdx.x) * group_mask_blocks(slots) * words;
  const int list_blocks = group_mask_blocks(static_cast<int>(entries));
  for (int block = warp; block < list_blocks; block += WARPS) {
    const uint32_t entry = block * B_TOPK + lane;
    const uint32_t low = entry < entries ? entry_owner[entry] : 0u, high = entry + 32 < entries ? entry_owner[entry + 32] : 0u;
    uint64_t mask = 0;
#pragma unroll
    for (int t = 0; t < MAX_GROUP; ++t) {
      if (t >= group_size) break;
      const uint32_t low_bits = __ballot_sync(0xffffffffu, (low >> t) & 1u);
      const uint32_t high_bits = __ballot_sync(0xffffffffu, (high >> t) & 1u);
      if (lane == t) mask = (static_cast<uint64_t>(high_bits) << 32) | low_bits;
    }
    if (lane < words) masks[block * words + lane] = mask;
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
