// The token groups' pre-pass (launch.cuh beside this file): its limits and the sizes of its CTAs, on
// the host and the device.
#pragma once

#include <cstdint>

#include <sparse_mla/params.cuh>
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

// The groups-of-two pre-pass (pairs.cuh).
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

}  // namespace sparse_mla::sm90::prefill
