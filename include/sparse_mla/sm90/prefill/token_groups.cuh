// Token groups: the pre-pass that lets G adjacent query tokens share one 64-row tile.
//
// With h_q <= 32 heads (a tensor-parallel rank), a tile of one token leaves 64 - h_q of its rows
// empty. Neighbouring tokens of a real indexer select mostly the same kv rows, so the grouped tile
// (Tile::kGrouped) stacks G = min(MAX_GROUP, 64 / h_q) tokens into one tile (row t * h_q + h: head h
// of token t), gathers the union of their selections once and masks each row to its own token's
// slots. prefill_kernel_token_groups lists, per group, that union: each distinct valid kv row once,
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
// writes the same lists from two bitmaps of the kv rows (below).
//
// The list of a group may hold more entries than its tokens' valid slots shared save: when it holds
// more than max_union_ratio entries per valid slot of the group, the group runs its tokens one by one
// too (its list not read). Everything here is a function of the group's own rows: the lists, and
// with them the outputs, are bitwise the same on every launch. Each group is then appended, by one
// atomic, to the unit list of the launch that runs it (group_units, traits.cuh): the order of a list
// varies between launches, but where a group or token runs does not change its outputs.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include <sparse_mla/params.cuh>
#include <sparse_mla/sm90/prefill/primitives.cuh>
#include <sparse_mla/sm90/prefill/traits.cuh>

namespace sparse_mla::sm90::prefill {

// Threads of a group's CTA: 512, three CTAs to an SM; 1024 where the owner map leaves an SM one CTA
// (a byte per row past ~100K kv rows: groups of 8 at s_kv 128K), so that the SM still has 32 warps
// to hide the rounds' latencies (group_threads).
constexpr int GROUP_THREADS = 512;
constexpr int WIDE_GROUP_THREADS = 1024;
constexpr int MAX_GROUP_SLOTS = 16384;  // G * TOPK at most: an entry's owner byte each
// The pre-passes count a group's entries and valid slots in the two 16-bit halves of one word, summed
// over the group's warps and tokens: neither count may reach the high half's bit 16.
static_assert(MAX_GROUP_SLOTS <= 0xffff, "a group's counts fit 16 bits");
// Bytes of the owner map at most. A kv row's owner bits take MAP_BITS = 8, 4 or 2 bits (group_map_bits).
// With more kv rows than the map holds (map_capacity), it covers them in chunks of that many, the
// group's slots are walked once per chunk, and the list holds each chunk's entries after the chunk
// before's.
constexpr int MAX_MAP_BYTES = 196608;
static_assert(MAX_GROUP <= 8, "a row's owner bits fit a byte");
// kv rows per chunk of the map.
__host__ __device__ constexpr int map_capacity(int bits) { return MAX_MAP_BYTES * 8 / bits; }

// Rows of a group's owner map: every kv row, rounded up to whole 16-byte vectors and to at least 32
// words (an insert of a slot outside the map ORs 0 into word `lane`), or a chunk.
__host__ __device__ constexpr int group_map_rows(int s_kv, int bits) {
  const int vector_rows = 128 / bits, min_rows = 32 * 32 / bits;
  return s_kv <= min_rows                             ? min_rows
         : s_kv <= map_capacity(bits) - vector_rows + 1 ? (s_kv + vector_rows - 1) / vector_rows * vector_rows
                                                        : map_capacity(bits);
}
__host__ __device__ constexpr int group_map_bytes(int map_rows, int bits) { return map_rows / 8 * bits; }
// Tokens per group at most with TOPK slots each.
__host__ __device__ constexpr int max_group_size(int topk) {
  return MAX_GROUP_SLOTS / topk < MAX_GROUP ? MAX_GROUP_SLOTS / topk : MAX_GROUP;
}
// Shared memory of a group's CTA of `threads`: the map, each entry's owner byte, the (token, warp)s'
// counts and their scan, the warps' counts of common entries, the tokens' lengths.
__host__ __device__ constexpr int group_shared_bytes(int slots, int map_bytes, int threads = GROUP_THREADS) {
  return map_bytes + (slots + 15) / 16 * 16 + ((2 * MAX_GROUP + 1) * (threads / 32) + 1) * 4 + MAX_GROUP * 4;
}
static_assert(group_shared_bytes(MAX_GROUP_SLOTS, MAX_MAP_BYTES, WIDE_GROUP_THREADS) <= SHARED_MEMORY_PER_BLOCK,
              "the largest map fits");

// A pre-pass warp's rows of 32 slots per token, in a CTA of THREADS.
template <int TOPK, int THREADS = GROUP_THREADS>
constexpr int GROUP_WARP_ROWS = ((TOPK + 31) / 32 + THREADS / 32 - 1) / (THREADS / 32);
// The pre-pass's CTAs per SM at most: of 512 threads three, two where a thread holds more than 4
// rows' slots (topk > 2048), which at 40 registers would spill; of 1024 threads one.
template <int TOPK, int THREADS = GROUP_THREADS>
constexpr int GROUP_CTAS_PER_SM = THREADS == WIDE_GROUP_THREADS ? 1 : GROUP_WARP_ROWS<TOPK> <= 4 ? 3 : 2;
constexpr int SHARED_MEMORY_PER_SM = 233472;  // SM90: 228 KB, of which 1 KB per CTA is the system's
// CTAs of `bytes` of shared memory each that fit an SM.
__host__ __device__ constexpr int ctas_per_sm(int bytes) { return SHARED_MEMORY_PER_SM / (bytes + 1024); }
// Shared memory of the pre-pass's CTA of `threads` for a group of `group_size` tokens, its map at `bits`.
template <int TOPK>
__host__ __device__ constexpr int group_cta_bytes(int group_size, int s_kv, int bits, int threads = GROUP_THREADS) {
  return group_shared_bytes(group_size * TOPK, group_map_bytes(group_map_rows(s_kv, bits), bits), threads);
}
// Bits of a kv row's owner field: a byte where the map at a byte per row leaves the SM its three
// CTAs; where it does not (s_kv past ~68K at topk 2048), 2 or 4 bits for groups of up to 2 or 4 tokens, so that at
// s_kv 128K three CTAs share an SM instead of one (docs/lab.md, Experiment 56). Only there: where a
// byte a row fits, the packed map is slower (more rows share a word, and reading a row's owners takes
// a shift). Past topk 2048 always a byte: packed, the kernel would spill.
template <int TOPK>
__host__ __device__ constexpr int group_map_bits(int group_size, int s_kv) {
  if (GROUP_CTAS_PER_SM<TOPK> < 3 || ctas_per_sm(group_cta_bytes<TOPK>(group_size, s_kv, 8)) >= 3) return 8;
  return group_size <= 2 ? 2 : group_size <= 4 ? 4 : 8;
}

// Threads of the pre-pass's CTAs: WIDE_GROUP_THREADS where the byte map leaves an SM one CTA of 512
// (docs/lab.md, Experiment 59), or where the call has at most one group an SM
// (`one_wave`: a short call, whose SMs get one CTA each whatever the map); a packed map (bits 2, 4)
// leaves an SM three.
template <int TOPK>
__host__ __device__ constexpr int group_threads(int group_size, int s_kv, int bits, bool one_wave) {
  return bits == 8 && (one_wave || ctas_per_sm(group_cta_bytes<TOPK>(group_size, s_kv, bits)) < 2)
             ? WIDE_GROUP_THREADS
             : GROUP_THREADS;
}

// The call's groups: one CTA each.
__host__ __device__ __forceinline__ int num_groups(const TokenGroupParams& p) { return num_groups_of(p.s_q, p.group_size); }

// The sum of `value` over lanes 0 .. this lane, of the first LANES lanes (a power of 2).
template <int LANES>
__device__ __forceinline__ uint32_t inclusive_lane_scan(uint32_t value) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int d = 1; d < LANES; d *= 2) {
    const uint32_t from = __shfl_up_sync(0xffffffffu, value, d);
    if (lane >= d) value += from;
  }
  return value;
}
// Lane w < WARPS holding warp w's count: the counts of the warps before `warp` (x), and of all (y),
// in every lane.
template <int WARPS>
__device__ __forceinline__ uint2 scan_warp_counts(uint32_t count, int warp) {
  const uint32_t scan = inclusive_lane_scan<WARPS>(count);
  return make_uint2(__shfl_sync(0xffffffffu, scan - count, warp), __shfl_sync(0xffffffffu, scan, WARPS - 1));
}

// Group blockIdx.x's length (-1: it runs token by token), and the group, or its tokens, appended to
// the unit list of the launch that runs it.
__device__ __forceinline__ void decide_group(const TokenGroupParams& p, int32_t length) {
  wait_for_grid_ahead();  // prefill_kernel_zero_counts, ahead of the pre-pass (launch_token_groups)
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

// One CTA per group. The owner map is indexed by kv row: bit t of row r's field says that token t
// selected r, so inserting a slot is one shared-memory atomicOr, with no probing, and its old value
// says whether the token had the row already (a duplicate) and whether an earlier token had it. The
// tokens are inserted one at a time, in order, a barrier after each (a round): a slot whose row's
// field was 0 makes the row's entry, so one pass over the slots finds every entry in order of first
// occurrence, and the list pass touches only the rows of 32 slots that make one (at realistic
// overlap, token 0's and few others). Warp w takes rows w * WARP_ROWS .. of 32 consecutive slots of
// each token, so that index loads are coalesced and a ballot places a row's entries; the next
// token's loads are in flight during a round, and after the last round token 0's are loaded again,
// for the list. The pass is bound by the issue of its instructions where three CTAs share an SM; a
// CTA alone on its SM (WIDE_GROUP_THREADS) marks every token's slots at once instead (MARKS_AT_ONCE,
// below), with the same entries. A group that falls back writes no list (but for the chunks before
// the one where it is known, past map_capacity kv rows).
// (Named like the prefill kernel, so that one kernel-name filter of the sanitizer tests takes both.)
template <int TOPK, int MAP_BITS, int THREADS>
__global__ void __launch_bounds__(THREADS, (GROUP_CTAS_PER_SM<TOPK, THREADS>))
    prefill_kernel_token_groups(const __grid_constant__ TokenGroupParams p) {
  allow_dependent_grid();  // the grouped launch waits for this grid before it reads (kernel.cuh)
  constexpr int WARPS = THREADS / 32;
  constexpr uint32_t WORD_ROWS = 32 / MAP_BITS, OWNER_MASK = (1u << MAP_BITS) - 1;  // kv rows per map word
  constexpr int WARP_ROWS = GROUP_WARP_ROWS<TOPK, THREADS>;
  // A CTA of WIDE_GROUP_THREADS has its SM to itself, so no other CTA's warps issue while its warps
  // wait at a barrier or for their loads. Its threads have the registers (64 a thread at most) to
  // hold every token's slots (G * WARP_ROWS: 16 at topk 2048, 18 at 2500; no spill at topk 7 to
  // 8192), loaded at once at its start, and it marks them all into the map before one barrier, then
  // reads each slot's row's owners back: the slot makes the row's entry where no token before its own
  // selected the row, which is what a round's old value says, so the entries and their order are the
  // rounds'. One barrier and one load latency instead of one of each a token (docs/lab.md,
  // Experiment 94); the later tokens' entries need no dependent load in the list pass either
  // (Experiment 67). Three CTAs of 512 threads share an SM, whose warps fill each
  // other's waits, and have no registers to spare (42 a thread at most, 39-40 used): they run rounds.
  constexpr bool MARKS_AT_ONCE = THREADS == WIDE_GROUP_THREADS;
  constexpr int KEY_TOKENS = MARKS_AT_ONCE ? max_group_size(TOPK) : 1;
  // The thread's slots that make an entry, one bit per (token, row): a register or two.
  using NewBits = std::conditional_t<(max_group_size(TOPK) * WARP_ROWS <= 32), uint32_t, uint64_t>;
  static_assert(max_group_size(TOPK) * WARP_ROWS <= 64, "one bit per token and row");
  static_assert(max_group_size(TOPK) * TOPK <= MAX_GROUP_SLOTS, "the group's counts fit the 16-bit halves of counts");
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int group_size = p.group_size;
  const int slots = group_size * TOPK, padded_slots = (slots + 15) / 16 * 16;
  const uint32_t map_rows = group_map_rows(p.s_kv, MAP_BITS), map_bytes = group_map_bytes(map_rows, MAP_BITS);
  extern __shared__ __align__(16) uint8_t shared[];
  // Bit MAP_BITS * (r % WORD_ROWS) + t of word r / WORD_ROWS (r: kv row - chunk): token t selected it.
  uint32_t* map = reinterpret_cast<uint32_t*>(shared);
  const auto owners_of = [&](uint32_t r) -> uint32_t {
    if constexpr (MAP_BITS == 8) return shared[r];
    else return (map[r / WORD_ROWS] >> (MAP_BITS * (r % WORD_ROWS))) & OWNER_MASK;
  };
  uint8_t* entry_owner = shared + map_bytes;             // the owner bits of each entry of the list
  // Per (token, warp): the entries its slots make (low 16 bits) and its valid slots (high 16 bits).
  uint32_t* counts = reinterpret_cast<uint32_t*>(entry_owner + padded_slots);
  uint32_t* before = counts + MAX_GROUP * WARPS;         // the same, summed over the (token, warp)s before
  uint32_t* common_counts = before + MAX_GROUP * WARPS + 1;  // per warp: token 0's entries that every token owns
  int* lengths = reinterpret_cast<int*>(common_counts + WARPS);  // each token's valid slots

  // The group's slots are contiguous in `indices`; the tail group has fewer tokens.
  const int first_token = blockIdx.x * group_size, tokens = min(group_size, p.s_q - first_token);
  const int first_slot = warp * WARP_ROWS * 32 + lane;  // of the thread's first row, in a token
  const int32_t* group_in = p.indices + static_cast<int64_t>(first_token) * TOPK + first_slot;
  if (threadIdx.x < group_size) {
    const int token = first_token + threadIdx.x;
    lengths[threadIdx.x] = token >= p.s_q               ? 0
                           : p.topk_length == nullptr ? TOPK
                                                      : min(max(__ldg(p.topk_length + token), 0), TOPK);
  }
  // Whether the thread's row i of 32 slots lies inside TOPK: always where the warps' rows tile TOPK
  // exactly (topk 2048), which ptxas cannot tell from the thread index.
  constexpr bool ROWS_TILE_TOPK = WARP_ROWS * 32 * WARPS == TOPK;
  const auto in_topk = [&](int i) { return ROWS_TILE_TOPK || first_slot + 32 * i < TOPK; };
  // Token t's slots of this thread (-1 past its slots).
  const auto load_token = [&](int32_t(&to)[WARP_ROWS], int t) {
#pragma unroll
    for (int i = 0; i < WARP_ROWS; ++i) to[i] = in_topk(i) ? __ldg(group_in + t * TOPK + 32 * i) : -1;
  };

  // Per chunk of kv rows (one, unless s_kv > map_capacity): the rounds, then the entries the chunk's
  // slots made appended to the list, each with its owner bits from the map: less time than three
  // passes over the slots (docs/lab.md, Experiment 52).
  int32_t* const group_list = p.group_indices + static_cast<int64_t>(blockIdx.x) * slots;
  // Entries 0 .. first_common - 1 (the first chunk's common ones) are every token's.
  uint32_t entries = 0, group_valid_slots = 0, first_common = 0;
  bool pays = true;
  // The thread's slots of every token where it marks them at once; in rounds, keys[0] holds those of
  // the token whose round is next, and after the rounds token 0's again.
  int32_t keys[KEY_TOKENS][WARP_ROWS];
#pragma unroll
  for (int t = 0; t < KEY_TOKENS; ++t) {
    if (t == 0 || t < tokens) load_token(keys[t], t);  // a group has its token 0
  }
  // Where a token's slot `slot` (holding kv row `key`) lies in this chunk's map, if it is valid there;
  // map_slot: the thread's slot of row i.
  struct MapSlot {
    bool valid, in;  // valid: a slot of the token's length and a kv row; in: and in the chunk
    uint32_t row, shift;
  };
  const auto map_slot_at = [&](int32_t key, int slot, int length, uint32_t chunk) {
    const bool valid = slot < length && static_cast<uint32_t>(key) < static_cast<uint32_t>(p.s_kv);
    const uint32_t row = static_cast<uint32_t>(key) - chunk;
    return MapSlot{valid, valid && row < map_rows, row, MAP_BITS * (row % WORD_ROWS)};
  };
  const auto map_slot = [&](int32_t key, int i, int length, uint32_t chunk) {
    return map_slot_at(key, first_slot + 32 * i, length, chunk);
  };
  for (uint32_t chunk = 0; chunk < static_cast<uint32_t>(p.s_kv) && pays; chunk += map_rows) {
    for (uint32_t v = threadIdx.x; v < map_bytes / 16; v += THREADS) reinterpret_cast<uint4*>(map)[v] = uint4{};
    __syncthreads();
    NewBits made = 0;
    // Token t's slot of row i into the map; the word's old value. Branch-free, so that the atomics
    // issue back to back: a slot that is not valid, or whose row lies outside the chunk, ORs 0 into
    // its lane's own word (no two lanes on one word).
    const auto mark = [&](const MapSlot& s, int t, uint32_t& duplicate) {
      const uint32_t bits = s.in ? (1u << t) << s.shift : 0u;
      const uint32_t old = atomicOr(map + (s.in ? s.row / WORD_ROWS : static_cast<uint32_t>(lane)), bits);
      duplicate |= old & bits;
      return old;
    };
    // `makes`: the slot makes its row's entry (no token before t selected the row).
    const auto count_made = [&](const MapSlot& s, int t, int i, bool makes, uint32_t& count) {
      made |= static_cast<NewBits>(makes) << (t * WARP_ROWS + i);
      count += static_cast<uint32_t>(makes) | (chunk == 0 && s.valid ? 1u << 16 : 0u);
    };
    if constexpr (MARKS_AT_ONCE) {
      uint32_t duplicate = 0;
#pragma unroll
      for (int t = 0; t < KEY_TOKENS; ++t) {
        if (t >= tokens) break;
#pragma unroll
        for (int i = 0; i < WARP_ROWS; ++i) mark(map_slot(keys[t][i], i, lengths[t], chunk), t, duplicate);
      }
      if (__syncthreads_or(duplicate != 0)) {  // block-uniform: a token selected a row twice
        pays = false;
        break;
      }
#pragma unroll
      for (int t = 0; t < KEY_TOKENS; ++t) {
        if (t >= tokens) break;
        uint32_t count = 0;
#pragma unroll
        for (int i = 0; i < WARP_ROWS; ++i) {
          const MapSlot s = map_slot(keys[t][i], i, lengths[t], chunk);
          count_made(s, t, i, s.in && (owners_of(s.row) & ((1u << t) - 1)) == 0, count);
        }
        count = __reduce_add_sync(0xffffffffu, count);
        if (lane == 0) counts[t * WARPS + warp] = count;
      }
      __syncthreads();
    } else {
      for (int t = 0; t < tokens; ++t) {
        const int length = lengths[t];
        const int32_t* next_in = group_in + (t + 1 < tokens ? t + 1 : 0) * TOPK;
        uint32_t duplicate = 0, count = 0;
#pragma unroll
        for (int i = 0; i < WARP_ROWS; ++i) {
          const MapSlot s = map_slot(keys[0][i], i, length, chunk);
          const uint32_t old = mark(s, t, duplicate);
          // The register is free: the next token's slot of this row (after the last, token 0's, for
          // the list), in flight during the round's rest.
          keys[0][i] = in_topk(i) ? __ldg(next_in + 32 * i) : -1;
          count_made(s, t, i, s.in && ((old >> s.shift) & OWNER_MASK) == 0, count);
        }
        count = __reduce_add_sync(0xffffffffu, count);
        if (lane == 0) counts[t * WARPS + warp] = count;
        if (__syncthreads_or(duplicate != 0)) {  // block-uniform: a token selected a row twice
          pays = false;
          break;
        }
      }
      if (!pays) break;
    }
    // The (token, warp) counts scanned by warp 0, each lane 4 (or fewer) of them in order.
    constexpr int PER_LANE = MAX_GROUP * WARPS / 32;
    if (warp == 0) {
      uint32_t c[PER_LANE], sum = 0;
#pragma unroll
      for (int k = 0; k < PER_LANE; ++k) {
        const int at = lane * PER_LANE + k;
        c[k] = at < tokens * WARPS ? counts[at] : 0u;
        sum += c[k];
      }
      const uint32_t scan = inclusive_lane_scan<32>(sum);
      uint32_t at = scan - sum;
#pragma unroll
      for (int k = 0; k < PER_LANE; ++k) {
        before[lane * PER_LANE + k] = at;
        at += c[k];
      }
      if (lane == 31) before[MAX_GROUP * WARPS] = scan;
    }
    __syncthreads();
    const uint32_t sums = before[MAX_GROUP * WARPS];
    const uint32_t chunk_begin = entries;
    entries += sums & 0xffffu;
    if (chunk == 0) group_valid_slots = sums >> 16;
    // A group without valid slots runs grouped: its rows' outputs are those of empty rows either way.
    // Entries only grow, so a chunk's count that does not pay decides the group.
    pays = entries == 0 || static_cast<float>(entries) <= p.max_union_ratio * static_cast<float>(group_valid_slots);
    if (!pays) break;
    // The entries of the rows that every token of the group selected go first, then the others, each
    // part in the order above: a block of the first part is valid for every row of the tile, so the
    // grouped tile's softmax takes its unmasked path there, whatever order the tokens' slots come in
    // (in ascending kv-row order, first occurrence alone mixes the two parts, and the grouped tile
    // runs slower: docs/lab.md, Experiment 52). Such an entry is token 0's.
    const uint32_t everyone = (1u << tokens) - 1;
    uint32_t common = 0;
#pragma unroll
    for (int i = 0; i < WARP_ROWS; ++i) {
      const bool makes = ((made >> i) & 1u) != 0;
      common += __popc(__ballot_sync(0xffffffffu, makes && owners_of(static_cast<uint32_t>(keys[0][i]) - chunk) == everyone));
    }
    if (lane == 0) common_counts[warp] = common;
    __syncthreads();
    // Every warp scans the warps' counts of common entries itself.
    const uint2 common_scan = scan_warp_counts<WARPS>(lane < WARPS ? common_counts[lane] : 0u, warp);
    const uint32_t common_before = common_scan.x, all_common = common_scan.y;
    if (chunk == 0) first_common = all_common;
    // Token t's entries: the slots of its rows that made one, placed by ballots in the order of
    // first occurrence; key_of(i) is the kv row of the thread's slot of row i (read where it makes one).
    const auto list_token = [&](int t, auto key_of) {
      const uint32_t entries_before = before[t * WARPS + warp] & 0xffffu, common_here = t == 0 ? common_before : all_common;
      uint32_t at_common = chunk_begin + common_here, at_rest = chunk_begin + all_common + (entries_before - common_here);
#pragma unroll
      for (int i = 0; i < WARP_ROWS; ++i) {
        const bool makes = ((made >> (t * WARP_ROWS + i)) & 1u) != 0;
        if (!__any_sync(0xffffffffu, makes)) continue;  // warp-uniform: most rows of tokens past the first
        const int32_t key = key_of(i);
        const uint32_t owners = makes ? owners_of(static_cast<uint32_t>(key) - chunk) : 0u;
        const uint32_t common_ballot = __ballot_sync(0xffffffffu, owners == everyone);
        const uint32_t rest_ballot = __ballot_sync(0xffffffffu, makes && owners != everyone);
        if (makes) {
          const uint32_t below = (1u << lane) - 1;
          const uint32_t at = owners == everyone ? at_common + __popc(common_ballot & below) : at_rest + __popc(rest_ballot & below);
          group_list[at] = key;
          entry_owner[at] = static_cast<uint8_t>(owners);
        }
        at_common += __popc(common_ballot);
        at_rest += __popc(rest_ballot);
      }
    };
    if constexpr (MARKS_AT_ONCE) {
#pragma unroll
      for (int t = 0; t < KEY_TOKENS; ++t) {
        if (t < tokens) list_token(t, [&](int i) { return keys[t][i]; });
      }
    } else {
      list_token(0, [&](int i) { return keys[0][i]; });
      // The later tokens' entries (none common: a row every token selected is token 0's) cluster
      // where the tokens' new rows sit in their selections, so that a few warps may hold most of
      // them (at realistic-glm overlap the busiest warp has 12-15 times the mean). Where the
      // busiest warp has more than 1.5 times the mean, the units of one warp's rows of one token
      // that made an entry are dealt to the warps in turn, the k-th to warp k mod WARPS: the dealt
      // warp reads the unit's slots again and each slot's owners from the map (a slot makes its
      // row's entry where no token before its own selected the row, what its round found) and
      // places them where their owner would have. Where the entries are spread evenly (uniform
      // selections) each warp lists its own, as dealing would, without the dealing's steps, which
      // slow uniform groups down (docs/lab.md, Experiments 114 and 115). Block-uniform: every warp
      // reads the same counts.
      uint32_t later_entries = 0;  // lane w: warp w's
      for (int t = 1; t < tokens; ++t) later_entries += lane < WARPS ? counts[t * WARPS + lane] & 0xffffu : 0u;
      const uint32_t busiest = __reduce_max_sync(0xffffffffu, later_entries);
      if (2 * WARPS * busiest > 3 * __reduce_add_sync(0xffffffffu, later_entries)) {
        const int later_units = (tokens - 1) * WARPS;
        const uint32_t below = (1u << lane) - 1;
        uint32_t dealt = 0;  // units that made an entry, in the batches before this one
        for (int batch = 0; batch < later_units; batch += 32) {
          const uint32_t unit_entries = batch + lane < later_units ? counts[WARPS + batch + lane] & 0xffffu : 0u;
          const uint32_t busy = __ballot_sync(0xffffffffu, unit_entries != 0);
          uint32_t mine = __ballot_sync(0xffffffffu, unit_entries != 0 && (dealt + __popc(busy & below)) % WARPS == warp);
          dealt += __popc(busy);
          while (mine != 0) {  // warp-uniform
            const int unit = WARPS + batch + __ffs(mine) - 1, t = unit / WARPS, owner = unit % WARPS;
            const int unit_slot = owner * WARP_ROWS * 32 + lane;
            mine &= mine - 1;
            // The unit's slots, addressed from this thread's own (the owner's distance): addressed
            // through `unit_slot - first_slot`, ptxas issued the rounds' next-token loads after their
            // atomics instead of before, and the rounds took longer.
            int32_t later[WARP_ROWS];
#pragma unroll
            for (int i = 0; i < WARP_ROWS; ++i) {
              later[i] = ROWS_TILE_TOPK || unit_slot + 32 * i < TOPK ? __ldg(group_in + (t * TOPK + (owner - warp) * WARP_ROWS * 32 + 32 * i)) : -1;
            }
            uint32_t at = chunk_begin + (before[unit] & 0xffffu);
#pragma unroll
            for (int i = 0; i < WARP_ROWS; ++i) {
              const MapSlot s = map_slot_at(later[i], unit_slot + 32 * i, lengths[t], chunk);
              const uint32_t owners = s.in ? owners_of(s.row) : 0u;
              const bool makes = s.in && (owners & ((1u << t) - 1)) == 0;
              const uint32_t ballot = __ballot_sync(0xffffffffu, makes);
              if (makes) {
                const uint32_t entry = at + __popc(ballot & below);
                group_list[entry] = later[i];
                entry_owner[entry] = static_cast<uint8_t>(owners);
              }
              at += __popc(ballot);
            }
          }
        }
      } else {
        for (int t = 1; t < tokens; ++t) {
          // Token t's slots that make an entry, loaded together: one load latency a token, not one a row.
          int32_t later[WARP_ROWS];
#pragma unroll
          for (int i = 0; i < WARP_ROWS; ++i) {
            later[i] = ((made >> (t * WARP_ROWS + i)) & 1u) != 0 ? __ldg(group_in + t * TOPK + 32 * i) : 0;
          }
          list_token(t, [&](int i) { return later[i]; });
        }
      }
    }
    __syncthreads();  // the map is read: the next chunk may clear it
  }
  if (threadIdx.x == 0) decide_group(p, pays ? static_cast<int32_t>(entries) : -1);
  if (!pays) return;  // its tokens run one by one: no list is read

  // The owner bits transposed, block by block: token t's mask is a ballot of bit t over the block's
  // entries (0 past the list, up to the end of its last pair); a block of common entries alone (most
  // of them, at realistic overlap) is every token's.
  uint64_t* masks = p.group_masks + static_cast<int64_t>(blockIdx.x) * group_mask_blocks(slots) * group_size;
  const int list_blocks = group_mask_blocks(static_cast<int>(entries));
  for (int block = warp; block < list_blocks; block += WARPS) {
    if ((block + 1) * B_TOPK <= static_cast<int>(first_common)) {  // warp-uniform
      if (lane < group_size) masks[block * group_size + lane] = lane < tokens ? ~0ull : 0ull;
      continue;
    }
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
// Words of one token's bitmap: every kv row, rounded up to whole 16-byte vectors and to at least 32
// words (an insert of a slot that is not valid ORs 0 into word `lane`).
__host__ __device__ constexpr int pair_bitmap_words(int s_kv) {
  const int words = (s_kv + 127) / 128 * 4;
  return words < 32 ? 32 : words;
}
// Shared memory of the groups-of-two pre-pass: the two bitmaps, and per warp two words of counts.
__host__ __device__ constexpr int pair_shared_bytes(int s_kv) {
  return (2 * pair_bitmap_words(s_kv) + 2 * (GROUP_THREADS / 32)) * 4;
}
// The groups-of-two pre-pass is built up to topk 4096: a thread holds both tokens' slots in
// registers, and at topk 8192 (32 of them) the kernel would spill.
template <int TOPK>
constexpr bool PAIR_KERNEL = GROUP_WARP_ROWS<TOPK> <= 8;
// Where it runs: groups of two whose kv rows prefill_kernel_token_groups's map holds in one chunk
// (so that the two kernels' lists are the same).
template <int TOPK>
__host__ __device__ constexpr bool pair_bitmaps_fit(int group_size, int s_kv) {
  return group_size == 2 && s_kv <= map_capacity(group_map_bits<TOPK>(group_size, s_kv));
}
// So it runs with at most map_capacity(2) kv rows (the map's fewest bits a row, group_map_bits): its
// bitmaps then fit a CTA's shared memory.
static_assert(pair_shared_bytes(map_capacity(2)) <= SHARED_MEMORY_PER_BLOCK, "the largest bitmaps fit");

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
  // Token t's mask of each block a pair reads: its ranges of the list, token 0's [0, own0_end),
  // token 1's [0, common) and [own0_end, entries).
  uint64_t* masks = p.group_masks + static_cast<int64_t>(blockIdx.x) * group_mask_blocks(2 * TOPK) * 2;
  const auto range_bits = [](uint32_t begin, uint32_t end, uint32_t block_begin) -> uint64_t {
    const uint32_t lo = min(max(begin, block_begin), block_begin + B_TOPK) - block_begin;
    const uint32_t hi = min(max(end, block_begin), block_begin + B_TOPK) - block_begin;
    if (hi <= lo) return 0;
    return (hi == B_TOPK ? ~0ull : (1ull << hi) - 1) & ~((1ull << lo) - 1);
  };
  const int list_blocks = group_mask_blocks(static_cast<int>(entries));
  for (int w = threadIdx.x; w < 2 * list_blocks; w += GROUP_THREADS) {
    const uint32_t block_begin = w / 2 * B_TOPK;
    masks[w] = w % 2 == 0 ? range_bits(0, own0_end, block_begin)
                          : range_bits(0, common, block_begin) | range_bits(own0_end, entries, block_begin);
  }
}

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
