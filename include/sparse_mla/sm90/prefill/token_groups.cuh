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
// Multiplicity: a row that a token selects n times counts n times in that token's softmax. A group in
// which some token selects a row more than once (a real indexer never does: its rows are distinct)
// runs its tokens one by one (group_length -1), where every occurrence counts.
//
// The list of a group may hold more entries than its tokens' valid slots shared save: when it holds
// more than max_union_ratio entries per valid slot of the group, the group runs its tokens one by one
// too (its list not written). Everything here is a function of the group's own rows: the lists, and
// with them the outputs, are bitwise the same on every launch. Each group is then appended, by one
// atomic, to the unit list of the launch that runs it (group_units, traits.cuh): the order of a list
// varies between launches, but where a group or token runs does not change its outputs.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include <sparse_mla/params.cuh>
#include <sparse_mla/sm90/prefill/traits.cuh>

namespace sparse_mla::sm90::prefill {

constexpr int GROUP_THREADS = 512;
constexpr int MAX_GROUP_SLOTS = 16384;  // G * TOPK at most: a slot's and an entry's owner byte each
// kv rows of the owner map at most (a byte each): with more kv rows, the map covers them in chunks of
// this many, and the group's slots are walked once per chunk.
constexpr int MAX_MAP_ROWS = 196608;
static_assert(MAX_GROUP <= 8, "a row's owner bits fit a byte");

// Rows of a group's owner map: every kv row, rounded up to whole 16-byte vectors and to at least 32
// words (an insert of a slot outside the map ORs 0 into word `lane`), or a chunk.
__host__ __device__ constexpr int group_map_rows(int s_kv) {
  return s_kv <= 128 ? 128 : s_kv <= MAX_MAP_ROWS - 15 ? (s_kv + 15) / 16 * 16 : MAX_MAP_ROWS;
}
// Shared memory of a group's CTA: the map, each slot's and each entry's owner byte, the warps'
// counts, the tokens' lengths.
__host__ __device__ constexpr int group_shared_bytes(int slots, int map_rows) {
  return map_rows + 2 * ((slots + 15) / 16 * 16) + (GROUP_THREADS / 32) * 4 + MAX_GROUP * 4;
}
static_assert(group_shared_bytes(MAX_GROUP_SLOTS, MAX_MAP_ROWS) <= SHARED_MEMORY_PER_BLOCK, "the largest map fits");

// The call's groups: one CTA each.
__host__ __device__ __forceinline__ int num_groups(const TokenGroupParams& p) {
  return p.s_q / p.group_size + (p.s_q % p.group_size != 0);
}

// Group blockIdx.x's length (-1: it runs token by token), and the group, or its tokens, appended to
// the unit list of the launch that runs it. (Counts that were not zero at launch are a caller's
// error; the bounds keep it from writing outside the lists.)
__device__ __forceinline__ void decide_group(const TokenGroupParams& p, int32_t length) {
  p.group_length[blockIdx.x] = length;
  if (length >= 0) {
    const uint32_t k = atomicAdd(p.group_units, 1);
    if (k < static_cast<uint32_t>(num_groups(p))) p.group_units[GROUPED_UNITS + k] = static_cast<int32_t>(blockIdx.x);
    return;
  }
  const int first_token = blockIdx.x * p.group_size, tokens = min(p.group_size, p.s_q - first_token);
  const uint32_t k = atomicAdd(p.group_units + 1, tokens);
  int32_t* narrow = p.group_units + narrow_units_begin(p.s_q, p.group_size);
  for (int t = 0; t < tokens; ++t) {
    if (k + t < static_cast<uint32_t>(p.s_q)) narrow[k + t] = first_token + t;
  }
}

// One CTA per group. The owner map is indexed by kv row: bit t of row r says that token t selected
// r, so inserting a slot is one shared-memory atomicOr, with no probing, and the old value says
// whether the token had the row already. Warp w takes a contiguous range of the group's slots in
// (token, slot) order, its lanes consecutive slots (row r of the warp: 32 slots), so that index
// loads and list stores are coalesced and a ballot gives each entry its place. The pass is bound by
// the issue of its instructions: the work per slot is a few of them, a batch of rows' index loads is
// in flight one batch ahead (the first while the map is cleared), and a group that falls back writes
// no list.
// (Named like the prefill kernel, so that one kernel-name filter of the sanitizer tests takes both.)
template <int TOPK>
__global__ void __launch_bounds__(GROUP_THREADS, 3) prefill_kernel_token_groups(const __grid_constant__ TokenGroupParams p) {
  constexpr int WARPS = GROUP_THREADS / 32;
  constexpr int ROWS = MAX_GROUP_SLOTS / GROUP_THREADS;  // a warp's rows of 32 slots, at most
  // Rows whose loads are in flight together (fewer where slot / TOPK is not a shift: registers).
  constexpr int BATCH = (TOPK & (TOPK - 1)) == 0 ? 8 : 4;
  static_assert(ROWS % BATCH == 0, "whole batches");
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int group_size = p.group_size;
  const int slots = group_size * TOPK, padded_slots = (slots + 15) / 16 * 16;
  const uint32_t map_rows = group_map_rows(p.s_kv);
  extern __shared__ __align__(16) uint8_t shared[];
  uint8_t* map = shared;                                 // bit t of row r - chunk: token t selected kv row r
  uint8_t* slot_owner = map + map_rows;                  // the owner bits of the entry a slot makes, or 0
  uint8_t* entry_owner = slot_owner + padded_slots;      // the owner bits of each entry of the list
  uint32_t* warp_sums = reinterpret_cast<uint32_t*>(entry_owner + padded_slots);
  int* lengths = reinterpret_cast<int*>(warp_sums + WARPS);  // each token's valid slots

  // The group's slots are contiguous in `indices`; the tail group's slots past s_q have none.
  const int first_token = blockIdx.x * group_size;
  const int per_warp = ((slots + WARPS - 1) / WARPS + 31) / 32 * 32;
  const int begin = warp * per_warp, end = min(begin + per_warp, slots);
  const int loaded = min(end, min(p.s_q - first_token, group_size) * TOPK);
  const int32_t* group_in = p.indices + static_cast<int64_t>(first_token) * TOPK;
  if (threadIdx.x < group_size) {
    const int token = first_token + threadIdx.x;
    lengths[threadIdx.x] = token >= p.s_q               ? 0
                           : p.topk_length == nullptr ? TOPK
                                                      : min(max(__ldg(p.topk_length + token), 0), TOPK);
  }
  for (int v = threadIdx.x; v < padded_slots / 16; v += GROUP_THREADS) reinterpret_cast<uint4*>(slot_owner)[v] = uint4{};

  // Calls f(slot, token, kv row, valid) for each of the warp's slots, a batch of rows at a time, the
  // index loads one batch ahead; `before` runs once the first batch's loads are issued.
  const auto for_each_slot = [&](auto&& before, auto&& f) {
    int32_t index[BATCH], next[BATCH];
    const auto load_batch = [&](int32_t(&to)[BATCH], int r0) {
      const int first = begin + 32 * r0 + lane;
      const int32_t* from = group_in + first;  // one address, the rows at fixed offsets from it
#pragma unroll
      for (int i = 0; i < BATCH; ++i) to[i] = first + 32 * i < loaded ? __ldg(from + 32 * i) : -1;
    };
    load_batch(next, 0);
    before();
#pragma unroll 1
    for (int r0 = 0; r0 < ROWS; r0 += BATCH) {
      if (begin + 32 * r0 >= end) break;  // warp-uniform
#pragma unroll
      for (int i = 0; i < BATCH; ++i) index[i] = next[i];
      if (r0 + BATCH < ROWS && begin + 32 * (r0 + BATCH) < end) load_batch(next, r0 + BATCH);
#pragma unroll
      for (int i = 0; i < BATCH; ++i) {
        const int slot = begin + 32 * (r0 + i) + lane;
        const uint32_t t = static_cast<uint32_t>(slot) / TOPK;
        const int32_t key = index[i];
        f(slot, t, key, slot < end && key >= 0 && key < p.s_kv && slot - static_cast<int>(t) * TOPK < lengths[t]);
      }
    }
  };

  // Per chunk of kv rows (one, unless s_kv > MAX_MAP_ROWS): insert every valid slot whose row lies in
  // it, then let the slot of the lowest token that selected the row make the row's entry.
  // The thread's entries (low 16 bits) and valid slots (high 16 bits), in one register: each at most
  // MAX_GROUP_SLOTS < 2^16 in a warp, and the pre-pass has no register to spare.
  uint32_t counts = 0;
  uint32_t chunk = 0;
  for (; chunk < static_cast<uint32_t>(p.s_kv); chunk += map_rows) {
    uint32_t duplicate = 0;  // nonzero: a token selected a row twice
    for_each_slot(
        [&] {
          for (uint32_t v = threadIdx.x; v < map_rows / 16; v += GROUP_THREADS) reinterpret_cast<uint4*>(map)[v] = uint4{};
          __syncthreads();
        },
        [&](int, uint32_t t, int32_t key, bool valid) {
          // Branch-free, so that a batch's atomics issue back to back (up to 5% faster than a
          // branch around each): a slot that is not valid, or whose row lies outside the chunk,
          // ORs 0 into its lane's own word (no two lanes of a warp on one word).
          const uint32_t row = static_cast<uint32_t>(key) - chunk;
          const bool in = valid && row < map_rows;
          const uint32_t bits = in ? (1u << t) << (8 * (row & 3)) : 0u;
          duplicate |= atomicOr(reinterpret_cast<uint32_t*>(map) + (in ? row / 4 : static_cast<uint32_t>(lane)), bits) & bits;
          if (chunk == 0) counts += static_cast<uint32_t>(valid) << 16;
        });
    if (__syncthreads_or(duplicate != 0)) break;  // block-uniform: a token selected a row twice
    for_each_slot([] {}, [&](int slot, uint32_t t, int32_t key, bool valid) {
      const uint32_t row = static_cast<uint32_t>(key) - chunk;
      const uint32_t owners = valid && row < map_rows ? map[row] : 0u;
      if (owners != 0 && static_cast<uint32_t>(__ffs(owners) - 1) == t) {
        slot_owner[slot] = static_cast<uint8_t>(owners);
        ++counts;
      }
    });
    __syncthreads();  // the map is read: the next chunk may clear it
  }

  // The warps' counts scanned: each entry's place in the list.
#pragma unroll
  for (int d = 16; d > 0; d /= 2) {
    counts += __shfl_xor_sync(0xffffffffu, counts, d);
  }
  if (lane == 0) warp_sums[warp] = counts;
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
  const bool token_repeats_row = chunk < static_cast<uint32_t>(p.s_kv);  // the chunks' loop stopped early
  const bool pays = !token_repeats_row &&
                    (entries == 0 || static_cast<float>(entries) <= p.max_union_ratio * static_cast<float>(group_valid_slots));
  if (threadIdx.x == 0) decide_group(p, pays ? static_cast<int32_t>(entries) : -1);
  if (!pays) return;  // its tokens run one by one: no list is read
  // Each entry's kv row goes to the list, its owner bits to entry_owner.
  const int64_t list = static_cast<int64_t>(blockIdx.x) * slots;
#pragma unroll 4
  for (int base = begin; base < end; base += 32) {
    const int slot = base + lane;
    const uint32_t owner = slot < end ? slot_owner[slot] : 0u;
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
  uint64_t* masks = p.group_masks + static_cast<int64_t>(blockIdx.x) * group_mask_blocks(slots) * group_size;
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
    if (lane < group_size) masks[block * group_size + lane] = mask;
  }
}

// Launches the pre-pass for p.group_size * TOPK <= MAX_GROUP_SLOTS on `stream`; never synchronizes.
template <int TOPK>
cudaError_t launch_token_groups(const TokenGroupParams& p, cudaStream_t stream) {
  const int smem_bytes = group_shared_bytes(p.group_size * TOPK, group_map_rows(p.s_kv));
  auto kernel = prefill_kernel_token_groups<TOPK>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err != cudaSuccess) return err;
  kernel<<<num_groups(p), GROUP_THREADS, smem_bytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace sparse_mla::sm90::prefill
