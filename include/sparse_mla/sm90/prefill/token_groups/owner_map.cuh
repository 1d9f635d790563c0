// The pre-pass of groups of any size: an owner map of the kv rows, filled token by token.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include <sparse_mla/params.cuh>
#include <sparse_mla/sm90/prefill/primitives.cuh>
#include <sparse_mla/sm90/prefill/token_groups/common.cuh>
#include <sparse_mla/sm90/prefill/token_groups/plan.cuh>
#include <sparse_mla/sm90/prefill/traits.cuh>

namespace sparse_mla::sm90::prefill {

// The (token, warp) counts of a chunk scanned by warp 0, each lane 4 (or fewer) of them in order:
// before[k] holds the sum of the counts before (token, warp) k, before[MAX_GROUP * WARPS] all of them.
template <int WARPS>
__device__ __forceinline__ void scan_token_counts(const uint32_t* counts, uint32_t* before, int tokens, int lane) {
  constexpr int PER_LANE = MAX_GROUP * WARPS / 32;
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

// The pre-pass of one group (prefill_kernel_token_groups, below) in named phases. OwnerMapCta holds
// the CTA's values and the owner map's operations; the phases are the functions after it, which the
// kernel composes. A phase takes the kernel's values by reference: passed by value, or read from
// OwnerMapCta's members, the same statements compile to other code (another schedule, other
// registers) than the pre-pass whose speed was measured. For the same reason the loops that deal the
// later tokens' units and that write the masks stay in the kernel: in a function of their own (or a
// lambda), they compile to other code.

// A group's CTA: its tokens, this thread's place among their slots, the parts of its shared memory
// (the owner map, each entry's owner bits, the counts and their scans, the tokens' lengths), and the
// owner map's operations.
template <int TOPK, int MAP_BITS, int THREADS>
struct OwnerMapCta {
  static constexpr int WARPS = THREADS / 32;
  static constexpr uint32_t WORD_ROWS = 32 / MAP_BITS, OWNER_MASK = (1u << MAP_BITS) - 1;  // kv rows per map word
  static constexpr int WARP_ROWS = GROUP_WARP_ROWS<TOPK, THREADS>;
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
  static constexpr bool MARKS_AT_ONCE = THREADS == WIDE_GROUP_THREADS;
  static constexpr int KEY_TOKENS = MARKS_AT_ONCE ? max_group_size(TOPK) : 1;
  // The thread's slots of every token where it marks them at once; in rounds, [0] holds those of the
  // token whose round is next, and after the rounds token 0's again.
  using Keys = int32_t[KEY_TOKENS][WARP_ROWS];
  // The thread's slots that make an entry, one bit per (token, row): a register or two.
  using NewBits = std::conditional_t<(max_group_size(TOPK) * WARP_ROWS <= 32), uint32_t, uint64_t>;
  static_assert(max_group_size(TOPK) * WARP_ROWS <= 64, "one bit per token and row");
  static_assert(max_group_size(TOPK) * TOPK <= MAX_GROUP_SLOTS, "the group's counts fit the 16-bit halves of counts");
  // Whether the thread's row i of 32 slots lies inside TOPK: always where the warps' rows tile TOPK
  // exactly (topk 2048), which ptxas cannot tell from the thread index.
  static constexpr bool ROWS_TILE_TOPK = WARP_ROWS * 32 * WARPS == TOPK;

  // Where a token's slot (holding kv row `key`) lies in a chunk's map, if it is valid there.
  struct MapSlot {
    bool valid, in;  // valid: a slot of the token's length and a kv row; in: and in the chunk
    uint32_t row, shift;
  };

  int lane, warp;
  int group_size, slots;
  uint32_t map_rows, map_bytes;  // a chunk's kv rows, and the map's bytes
  uint8_t* shared;
  // Bit MAP_BITS * (r % WORD_ROWS) + t of word r / WORD_ROWS (r: kv row - chunk): token t selected it.
  uint32_t* map;
  uint8_t* entry_owner;  // the owner bits of each entry of the list
  // Per (token, warp): the entries its slots make (low 16 bits) and its valid slots (high 16 bits).
  uint32_t* counts;
  uint32_t* before;         // the same, summed over the (token, warp)s before
  uint32_t* common_counts;  // per warp: token 0's entries that every token owns
  int* lengths;             // each token's valid slots
  // The group's slots are contiguous in `indices`; the tail group has fewer tokens.
  int first_token, tokens;
  int first_slot;  // of the thread's first row, in a token
  const int32_t* group_in;
  int32_t* group_list;

  // The values in this order, and each token's valid slots loaded here into `lengths` (read after the
  // map's first clearing, a barrier later): in another order, they compile to another schedule.
  __device__ __forceinline__ OwnerMapCta(const TokenGroupParams& p, uint8_t* shared) : shared(shared) {
    lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    group_size = p.group_size;
    slots = group_size * TOPK;
    const int padded_slots = (slots + 15) / 16 * 16;
    map_rows = group_map_rows(p.s_kv, MAP_BITS), map_bytes = group_map_bytes(map_rows, MAP_BITS);
    map = reinterpret_cast<uint32_t*>(shared);
    entry_owner = shared + map_bytes;
    counts = reinterpret_cast<uint32_t*>(entry_owner + padded_slots);
    before = counts + MAX_GROUP * WARPS;
    common_counts = before + MAX_GROUP * WARPS + 1;
    lengths = reinterpret_cast<int*>(common_counts + WARPS);
    first_token = blockIdx.x * group_size, tokens = min(group_size, p.s_q - first_token);
    first_slot = warp * WARP_ROWS * 32 + lane;
    group_in = p.indices + static_cast<int64_t>(first_token) * TOPK + first_slot;
    if (threadIdx.x < group_size) {
      const int token = first_token + threadIdx.x;
      lengths[threadIdx.x] = token >= p.s_q               ? 0
                             : p.topk_length == nullptr ? TOPK
                                                        : min(max(__ldg(p.topk_length + token), 0), TOPK);
    }
    group_list = p.group_indices + static_cast<int64_t>(blockIdx.x) * slots;
  }

  // The owner bits of row r of the chunk's map.
  __device__ __forceinline__ uint32_t owners_of(uint32_t r) const {
    if constexpr (MAP_BITS == 8) return shared[r];
    else return (map[r / WORD_ROWS] >> (MAP_BITS * (r % WORD_ROWS))) & OWNER_MASK;
  }
  __device__ __forceinline__ bool in_topk(int i) const { return ROWS_TILE_TOPK || first_slot + 32 * i < TOPK; }
  // Token t's slots of this thread (-1 past its slots).
  __device__ __forceinline__ void load_token(int32_t (&to)[WARP_ROWS], int t) const {
#pragma unroll
    for (int i = 0; i < WARP_ROWS; ++i) to[i] = in_topk(i) ? __ldg(group_in + t * TOPK + 32 * i) : -1;
  }
  // A token's slot `slot` of kv row `key`, of `length` valid slots, in the chunk's map. The kernel's
  // parameters are passed, not kept: read through a member, they compile to other code.
  __device__ __forceinline__ MapSlot map_slot_at(const TokenGroupParams& p, int32_t key, int slot, int length,
                                                 uint32_t chunk) const {
    const bool valid = slot < length && static_cast<uint32_t>(key) < static_cast<uint32_t>(p.s_kv);
    const uint32_t row = static_cast<uint32_t>(key) - chunk;
    return MapSlot{valid, valid && row < map_rows, row, MAP_BITS * (row % WORD_ROWS)};
  }
  // The same of the thread's slot of row i.
  __device__ __forceinline__ MapSlot map_slot(const TokenGroupParams& p, int32_t key, int i, int length,
                                              uint32_t chunk) const {
    return map_slot_at(p, key, first_slot + 32 * i, length, chunk);
  }
  // Token t's slot into the map; the word's old value. Branch-free, so that the atomics issue back to
  // back: a slot that is not valid, or whose row lies outside the chunk, ORs 0 into its lane's own
  // word (no two lanes on one word).
  __device__ __forceinline__ uint32_t mark(const MapSlot& s, int t, uint32_t& duplicate) const {
    const uint32_t bits = s.in ? (1u << t) << s.shift : 0u;
    const uint32_t old = atomicOr(map + (s.in ? s.row / WORD_ROWS : static_cast<uint32_t>(lane)), bits);
    duplicate |= old & bits;
    return old;
  }
  // `makes`: the slot of token t's row i makes its row's entry (no token before t selected the row):
  // its bit in `made`, and its counts in `count` (its valid slots counted in the first chunk).
  __device__ __forceinline__ static void count_made(NewBits& made, uint32_t chunk, const MapSlot& s, int t, int i,
                                                    bool makes, uint32_t& count) {
    made |= static_cast<NewBits>(makes) << (t * WARP_ROWS + i);
    count += static_cast<uint32_t>(makes) | (chunk == 0 && s.valid ? 1u << 16 : 0u);
  }

  // Every token's slots into the chunk's map before one barrier, then each slot's owners read back
  // (MARKS_AT_ONCE): the slots that make an entry into `made`, the counts of each (token, warp), a
  // barrier after. False where a token selected a row twice (block-uniform): the group does not pay.
  __device__ __forceinline__ bool mark_at_once(const TokenGroupParams& p, const Keys& keys, uint32_t chunk,
                                               NewBits& made) const {
    uint32_t duplicate = 0;
#pragma unroll
    for (int t = 0; t < KEY_TOKENS; ++t) {
      if (t >= tokens) break;
#pragma unroll
      for (int i = 0; i < WARP_ROWS; ++i) mark(map_slot(p, keys[t][i], i, lengths[t], chunk), t, duplicate);
    }
    if (__syncthreads_or(duplicate != 0)) return false;  // block-uniform: a token selected a row twice
#pragma unroll
    for (int t = 0; t < KEY_TOKENS; ++t) {
      if (t >= tokens) break;
      uint32_t count = 0;
#pragma unroll
      for (int i = 0; i < WARP_ROWS; ++i) {
        const MapSlot s = map_slot(p, keys[t][i], i, lengths[t], chunk);
        count_made(made, chunk, s, t, i, s.in && (owners_of(s.row) & ((1u << t) - 1)) == 0, count);
      }
      count = __reduce_add_sync(0xffffffffu, count);
      if (lane == 0) counts[t * WARPS + warp] = count;
    }
    __syncthreads();
    return true;
  }
  // The (token, warp)s' counts summed into `before`, a barrier after; returns the chunk's entries (low
  // 16 bits) and valid slots (high 16 bits, counted in the first chunk only).
  __device__ __forceinline__ uint32_t scan_counts() const {
    if (warp == 0) scan_token_counts<WARPS>(counts, before, tokens, lane);
    __syncthreads();
    return before[MAX_GROUP * WARPS];
  }
};

// Where a chunk's entries go in the list: after the `chunk_begin` entries of the chunks before, its
// common entries (of rows that `everyone` of the tokens selected), then the rest; `common_before`:
// the common entries of the warps before this one, `all_common`: of all.
struct ChunkPlaces {
  const uint32_t &chunk, &chunk_begin, &common_before, &all_common, &everyone;
};

// The chunk's map cleared, a barrier after.
template <int THREADS>
__device__ __forceinline__ void clear_map(uint32_t* const& map, const uint32_t& map_bytes) {
  for (uint32_t v = threadIdx.x; v < map_bytes / 16; v += THREADS) reinterpret_cast<uint4*>(map)[v] = uint4{};
  __syncthreads();
}

// OwnerMapCta::mark_at_once in rounds, a token at a time, a barrier after each: a slot makes its row's
// entry where its atomic's old value has no owner. keys[0] ends holding token 0's slots again, for
// the list. `pays` turns false where a token selected a row twice (block-uniform).
template <int TOPK, typename Cta>
__device__ __forceinline__ void mark_in_rounds(const Cta& g, const TokenGroupParams& p, typename Cta::Keys& keys,
                                               const uint32_t& chunk, typename Cta::NewBits& made, bool& pays,
                                               const int& tokens, int* const& lengths, const int32_t* const& group_in,
                                               const int& lane, const int& warp, uint32_t* const& counts) {
  for (int t = 0; t < tokens; ++t) {
    const int length = lengths[t];
    const int32_t* next_in = group_in + (t + 1 < tokens ? t + 1 : 0) * TOPK;
    uint32_t duplicate = 0, count = 0;
#pragma unroll
    for (int i = 0; i < Cta::WARP_ROWS; ++i) {
      const typename Cta::MapSlot s = g.map_slot(p, keys[0][i], i, length, chunk);
      const uint32_t old = g.mark(s, t, duplicate);
      // The register is free: the next token's slot of this row (after the last, token 0's, for the
      // list), in flight during the round's rest.
      keys[0][i] = g.in_topk(i) ? __ldg(next_in + 32 * i) : -1;
      Cta::count_made(made, chunk, s, t, i, s.in && ((old >> s.shift) & Cta::OWNER_MASK) == 0, count);
    }
    count = __reduce_add_sync(0xffffffffu, count);
    if (lane == 0) counts[t * Cta::WARPS + warp] = count;
    if (__syncthreads_or(duplicate != 0)) {  // block-uniform: a token selected a row twice
      pays = false;
      break;
    }
  }
}

// The entries of the rows that every token of the group selected go first, then the others, each
// part in the order above: a block of the first part is valid for every row of the tile, so the
// grouped tile's softmax takes its unmasked path there, whatever order the tokens' slots come in
// (in ascending kv-row order, first occurrence alone mixes the two parts, and the grouped tile
// runs slower: docs/lab.md, Experiment 52). Such an entry is token 0's. Counts them per warp (a
// barrier), then every warp scans the warps' counts itself: the common entries of the warps before
// this one (x) and of all (y).
template <typename Cta>
__device__ __forceinline__ uint2 count_common(const Cta& g, const typename Cta::Keys& keys,
                                              const typename Cta::NewBits& made, const uint32_t& chunk,
                                              const uint32_t& everyone, const int& lane, const int& warp,
                                              uint32_t* const& common_counts) {
  uint32_t common = 0;
#pragma unroll
  for (int i = 0; i < Cta::WARP_ROWS; ++i) {
    const bool makes = ((made >> i) & 1u) != 0;
    common += __popc(__ballot_sync(0xffffffffu, makes && g.owners_of(static_cast<uint32_t>(keys[0][i]) - chunk) == everyone));
  }
  if (lane == 0) common_counts[warp] = common;
  __syncthreads();
  return scan_warp_counts<Cta::WARPS>(lane < Cta::WARPS ? common_counts[lane] : 0u, warp);
}

// Token t's entries: the slots of its rows that made one, placed by ballots in the order of first
// occurrence; key_of(i) is the kv row of the thread's slot of row i (read where it makes one).
template <typename Cta, typename KeyOf>
__device__ __forceinline__ void list_token(const Cta& g, int t, KeyOf key_of, const typename Cta::NewBits& made,
                                           const ChunkPlaces& c, uint32_t* const& before, const int& warp,
                                           const int& lane, int32_t* const& group_list, uint8_t* const& entry_owner) {
  constexpr int WARP_ROWS = Cta::WARP_ROWS;
  const uint32_t entries_before = before[t * Cta::WARPS + warp] & 0xffffu,
                 common_here = t == 0 ? c.common_before : c.all_common;
  uint32_t at_common = c.chunk_begin + common_here, at_rest = c.chunk_begin + c.all_common + (entries_before - common_here);
#pragma unroll
  for (int i = 0; i < WARP_ROWS; ++i) {
    const bool makes = ((made >> (t * WARP_ROWS + i)) & 1u) != 0;
    if (!__any_sync(0xffffffffu, makes)) continue;  // warp-uniform: most rows of tokens past the first
    const int32_t key = key_of(i);
    const uint32_t owners = makes ? g.owners_of(static_cast<uint32_t>(key) - c.chunk) : 0u;
    const uint32_t common_ballot = __ballot_sync(0xffffffffu, owners == c.everyone);
    const uint32_t rest_ballot = __ballot_sync(0xffffffffu, makes && owners != c.everyone);
    if (makes) {
      const uint32_t below = (1u << lane) - 1;
      const uint32_t at = owners == c.everyone ? at_common + __popc(common_ballot & below) : at_rest + __popc(rest_ballot & below);
      group_list[at] = key;
      entry_owner[at] = static_cast<uint8_t>(owners);
    }
    at_common += __popc(common_ballot);
    at_rest += __popc(rest_ballot);
  }
}

// Every token's entries, where they were marked at once.
template <typename Cta>
__device__ __forceinline__ void list_tokens_at_once(const Cta& g, const typename Cta::Keys& keys,
                                                    const typename Cta::NewBits& made, const ChunkPlaces& places,
                                                    const int& tokens, uint32_t* const& before, const int& warp,
                                                    const int& lane, int32_t* const& group_list,
                                                    uint8_t* const& entry_owner) {
#pragma unroll
  for (int t = 0; t < Cta::KEY_TOKENS; ++t) {
    if (t < tokens) list_token(g, t, [&](int i) { return keys[t][i]; }, made, places, before, warp, lane, group_list, entry_owner);
  }
}

// Token t's mask of a block, in lane t: a ballot of bit t of the owners of the block's entries r
// (`low`) and r + 32 (`high`) over the lanes r.
__device__ __forceinline__ uint64_t block_mask(const uint32_t& low, const uint32_t& high, const int& group_size,
                                               const int& lane) {
  uint64_t mask = 0;
#pragma unroll
  for (int t = 0; t < MAX_GROUP; ++t) {
    if (t >= group_size) break;
    const uint32_t low_bits = __ballot_sync(0xffffffffu, (low >> t) & 1u);
    const uint32_t high_bits = __ballot_sync(0xffffffffu, (high >> t) & 1u);
    if (lane == t) mask = (static_cast<uint64_t>(high_bits) << 32) | low_bits;
  }
  return mask;
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
// CTA alone on its SM (WIDE_GROUP_THREADS) marks every token's slots at once instead
// (OwnerMapCta::MARKS_AT_ONCE), with the same entries. A group that falls back writes no list (but
// for the chunks before the one where it is known, past map_capacity kv rows).
// (Named like the prefill kernel, so that one kernel-name filter of the sanitizer tests takes both.)
template <int TOPK, int MAP_BITS, int THREADS>
__global__ void __launch_bounds__(THREADS, (GROUP_CTAS_PER_SM<TOPK, THREADS>))
    prefill_kernel_token_groups(const __grid_constant__ TokenGroupParams p) {
  allow_dependent_grid();  // the grouped launch waits for this grid before it reads (kernel.cuh)
  using Cta = OwnerMapCta<TOPK, MAP_BITS, THREADS>;
  constexpr int WARPS = Cta::WARPS, WARP_ROWS = Cta::WARP_ROWS;
  extern __shared__ __align__(16) uint8_t shared[];
  const Cta g(p, shared);
  // The values the phases take by reference (see above).
  const int lane = g.lane, warp = g.warp;
  const int group_size = g.group_size;
  const int slots = g.slots;
  const uint32_t map_rows = g.map_rows, map_bytes = g.map_bytes;
  uint32_t* map = g.map;
  uint8_t* entry_owner = g.entry_owner;
  uint32_t* counts = g.counts;
  uint32_t* before = g.before;
  uint32_t* common_counts = g.common_counts;
  int* lengths = g.lengths;
  const int tokens = g.tokens;
  const int32_t* group_in = g.group_in;
  int32_t* const group_list = g.group_list;

  // Per chunk of kv rows (one, unless s_kv > map_capacity): the marks, then the entries the chunk's
  // slots made appended to the list, each with its owner bits from the map: less time than three
  // passes over the slots (docs/lab.md, Experiment 52).
  // Entries 0 .. first_common - 1 (the first chunk's common ones) are every token's.
  uint32_t entries = 0, group_valid_slots = 0, first_common = 0;
  bool pays = true;
  typename Cta::Keys keys;
#pragma unroll
  for (int t = 0; t < Cta::KEY_TOKENS; ++t) {
    if (t == 0 || t < tokens) g.load_token(keys[t], t);  // a group has its token 0
  }
  for (uint32_t chunk = 0; chunk < static_cast<uint32_t>(p.s_kv) && pays; chunk += map_rows) {
    clear_map<THREADS>(map, map_bytes);
    typename Cta::NewBits made = 0;
    if constexpr (Cta::MARKS_AT_ONCE) {
      if (!g.mark_at_once(p, keys, chunk, made)) {
        pays = false;
        break;
      }
    } else {
      mark_in_rounds<TOPK>(g, p, keys, chunk, made, pays, tokens, lengths, group_in, lane, warp, counts);
      if (!pays) break;
    }
    const uint32_t sums = g.scan_counts();
    const uint32_t chunk_begin = entries;
    entries += sums & 0xffffu;
    if (chunk == 0) group_valid_slots = sums >> 16;
    // A group without valid slots runs grouped: its rows' outputs are those of empty rows either way.
    // Entries only grow, so a chunk's count that does not pay decides the group.
    pays = entries == 0 || static_cast<float>(entries) <= p.max_union_ratio * static_cast<float>(group_valid_slots);
    if (!pays) break;
    const uint32_t everyone = (1u << tokens) - 1;
    const uint2 common_scan = count_common(g, keys, made, chunk, everyone, lane, warp, common_counts);
    const uint32_t common_before = common_scan.x, all_common = common_scan.y;
    if (chunk == 0) first_common = all_common;
    const ChunkPlaces places{chunk, chunk_begin, common_before, all_common, everyone};
    if constexpr (Cta::MARKS_AT_ONCE) {
      list_tokens_at_once(g, keys, made, places, tokens, before, warp, lane, group_list, entry_owner);
    } else {
      list_token(g, 0, [&](int i) { return keys[0][i]; }, made, places, before, warp, lane, group_list, entry_owner);
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
              later[i] = Cta::ROWS_TILE_TOPK || unit_slot + 32 * i < TOPK ? __ldg(group_in + (t * TOPK + (owner - warp) * WARP_ROWS * 32 + 32 * i)) : -1;
            }
            uint32_t at = chunk_begin + (before[unit] & 0xffffu);
#pragma unroll
            for (int i = 0; i < WARP_ROWS; ++i) {
              const typename Cta::MapSlot s = g.map_slot_at(p, later[i], unit_slot + 32 * i, lengths[t], chunk);
              const uint32_t owners = s.in ? g.owners_of(s.row) : 0u;
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
          list_token(g, t, [&](int i) { return later[i]; }, made, places, before, warp, lane, group_list, entry_owner);
        }
      }
    }
    __syncthreads();  // the map is read: the next chunk may clear it
  }
  if (threadIdx.x == 0) decide_group(p, pays ? static_cast<int32_t>(entries) : -1);
  if (!pays) return;  // its tokens run one by one: no list is read

  // The owner bits transposed, block by block (block_mask; 0 past the list, up to the end of its last
  // pair); a block of common entries alone (most of them, at realistic overlap) is every token's.
  uint64_t* masks = p.group_masks + static_cast<int64_t>(blockIdx.x) * group_mask_blocks(slots) * group_size;
  const int list_blocks = group_mask_blocks(static_cast<int>(entries));
  for (int block = warp; block < list_blocks; block += WARPS) {
    if ((block + 1) * B_TOPK <= static_cast<int>(first_common)) {  // warp-uniform
      if (lane < group_size) masks[block * group_size + lane] = lane < tokens ? ~0ull : 0ull;
      continue;
    }
    const uint32_t entry = block * B_TOPK + lane;
    const uint32_t low = entry < entries ? entry_owner[entry] : 0u, high = entry + 32 < entries ? entry_owner[entry + 32] : 0u;
    const uint64_t mask = block_mask(low, high, group_size, lane);
    if (lane < group_size) masks[block * group_size + lane] = mask;
  }
}

}  // namespace sparse_mla::sm90::prefill
