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

constexpr int GROUP_THREADS = 1024;
// G * TOPK at most: the hash table holds twice that many 6-byte entries in shared memory (192 KB).
constexpr int MAX_GROUP_SLOTS = 16384;
constexpr uint32_t EMPTY_KEY = 0xffffffffu;  // no valid index is: s_kv <= INT32_MAX

// Entries of a group's hash table: a power of two, at least twice the group's slots (so a probe is short).
__host__ __device__ constexpr int group_table_log2(int slots) {
  int log2 = 1;
  while ((1 << log2) < 2 * slots) ++log2;
  return log2;
}
__host__ __device__ constexpr int group_table_bytes(int slots) {
  return (1 << group_table_log2(slots)) * 6 + 32 * 4;  // keys, 2-byte flags, the scan's warp sums
}
static_assert(group_table_bytes(MAX_GROUP_SLOTS) <= SHARED_MEMORY_PER_BLOCK, "the largest table fits");

// The exclusive prefix sum of `value` over the CTA's threads in thread order, and the total.
__device__ __forceinline__ uint32_t exclusive_scan(uint32_t value, uint32_t* warp_sums, uint32_t& total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  uint32_t inclusive = value;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const uint32_t up = __shfl_up_sync(0xffffffffu, inclusive, d);
    if (lane >= d) inclusive += up;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    uint32_t sum = warp_sums[lane];
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const uint32_t up = __shfl_up_sync(0xffffffffu, sum, d);
      if (lane >= d) sum += up;
    }
    warp_sums[lane] = sum;  // inclusive over warps
  }
  __syncthreads();
  total = warp_sums[GROUP_THREADS / 32 - 1];
  return inclusive - value + (warp > 0 ? warp_sums[warp - 1] : 0u);
}

// One CTA per group. Thread i takes the group's slots [i * per, (i + 1) * per) in (token, slot) order.
// (Named like the prefill kernel, so that one kernel-name filter of the sanitizer tests takes both.)
template <int TOPK>
__global__ void __launch_bounds__(GROUP_THREADS, 1) prefill_kernel_token_groups(const __grid_constant__ TokenGroupParams p) {
  constexpr int MAX_PER = (MAX_GROUP_SLOTS + GROUP_THREADS - 1) / GROUP_THREADS;
  constexpr uint32_t NO_ENTRY = 0xffffffffu;
  const int group_size = p.group_size;
  const int slots = group_size * TOPK;
  const int table_log2 = group_table_log2(slots);
  const uint32_t table_mask = (1u << table_log2) - 1;
  extern __shared__ uint32_t table[];
  uint32_t* keys = table;                                  // the kv row, or EMPTY_KEY
  uint16_t* flags = reinterpret_cast<uint16_t*>(keys + (1 << table_log2));  // owners | owners with duplicates << 8
  uint32_t* warp_sums = keys + (1 << table_log2) + (1 << table_log2) / 2;
  for (int e = threadIdx.x; e < (1 << table_log2); e += GROUP_THREADS) {
    keys[e] = EMPTY_KEY;
    flags[e] = 0;
  }
  __syncthreads();

  // Insert every valid slot; a token that meets its own bit again has the row more than once.
  const int first_token = blockIdx.x * group_size;
  const int per = (slots + GROUP_THREADS - 1) / GROUP_THREADS;
  uint32_t entry[MAX_PER];  // the slot's table entry, NO_ENTRY for an invalid slot
#pragma unroll
  for (int i = 0; i < MAX_PER; ++i) {
    entry[i] = NO_ENTRY;
    const int slot = threadIdx.x * per + i;
    if (i >= per || slot >= slots) continue;
    const int t = slot / TOPK, j = slot - t * TOPK;
    const int token = first_token + t;
    if (token >= p.s_q) continue;
    const int length = p.topk_length == nullptr ? TOPK : min(max(__ldg(p.topk_length + token), 0), TOPK);
    if (j >= length) continue;
    const int32_t index = __ldg(p.indices + static_cast<int64_t>(token) * TOPK + j);
    if (index < 0 || index >= p.s_kv) continue;
    uint32_t e = (static_cast<uint32_t>(index) * 2654435761u) >> (32 - table_log2);
    for (;;) {
      const uint32_t old = atomicCAS(keys + e, EMPTY_KEY, static_cast<uint32_t>(index));
      if (old == EMPTY_KEY || old == static_cast<uint32_t>(index)) break;
      e = (e + 1) & table_mask;
    }
    uint32_t* word = reinterpret_cast<uint32_t*>(flags) + e / 2;
    const int shift = 16 * (e & 1);
    const uint32_t before = atomicOr(word, (1u << t) << shift);
    if ((before >> shift) & (1u << t)) atomicOr(word, (1u << (8 + t)) << shift);
    entry[i] = e;
  }
  __syncthreads();

  // Which slots make an entry of the list: a duplicated row's every occurrence, for its token alone;
  // otherwise, once per row, the slot of the lowest token among those that selected it once.
  uint32_t emit = 0, valid = 0;
  uint8_t owners[MAX_PER];
#pragma unroll
  for (int i = 0; i < MAX_PER; ++i) {
    owners[i] = 0;
    if (entry[i] == NO_ENTRY) continue;
    const int t = (threadIdx.x * per + i) / TOPK;
    const uint32_t f = flags[entry[i]];
    const uint32_t once = (f & 0xffu) & ~(f >> 8);
    if ((f >> (8 + t)) & 1u) owners[i] = static_cast<uint8_t>(1u << t);
    else if (__ffs(once) - 1 == t) owners[i] = static_cast<uint8_t>(once);
    emit += owners[i] != 0;
    ++valid;
  }
  // Both counts in one scan: each is at most MAX_GROUP_SLOTS < 2^16 per group.
  uint32_t total;
  uint32_t at = exclusive_scan(emit | (valid << 16), warp_sums, total) & 0xffffu;
  const int64_t list = static_cast<int64_t>(blockIdx.x) * slots;
#pragma unroll
  for (int i = 0; i < MAX_PER; ++i) {
    if (owners[i] == 0) continue;
    p.group_indices[list + at] = static_cast<int32_t>(keys[entry[i]]);
    p.group_owners[list + at] = owners[i];
    ++at;
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
