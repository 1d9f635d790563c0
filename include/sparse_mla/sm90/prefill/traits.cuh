// Tile sizes, thread roles, register budgets and the shared-memory plan of the SM90 prefill kernel.
//
// Work decomposition: one work item per (query token, block of B_H = 64 heads), walked by persistent
// CTAs as work units (scheduler.cuh); 3 warpgroups.
//   WG0, WG1 (consumers)  Q.K^T, online softmax and P.V. topk is walked in pairs of B_TOPK = 64-row
//                         blocks: WG w computes the logits of block w of the pair (all 64 heads), and
//                         owns output columns [256w, 256w + 256) of both blocks' P.V.
//   WG2 (producer)        loads each unit's Q, then gathers the KV rows of each pair into a stage.
// The producer runs NUM_STAGES pairs ahead of the consumers at most; stages are handed over with
// mbarriers per block (kv_full: rows landed; kv_empty: both consumers finished reading them).
#pragma once

#include <cstdint>

#include <sparse_mla/params.cuh>

namespace sparse_mla::sm90::prefill {

constexpr int B_H = 64;          // heads per CTA: the M of Q.K^T and the N of P.V
constexpr int NARROW_HEADS = 32; // h_q up to this runs a narrow-head tile (tiles/narrow.cuh)
constexpr int NARROW_16_HEADS = 16;  // and up to this, the one of 16 heads
constexpr int NARROW_8_HEADS = 8;    // and up to this, the one of 8 heads
constexpr int MAX_GROUP = 8;     // query tokens per token group at most (token_groups/): one owner bit each
constexpr int B_TOPK = 64;       // KV rows per block; a consumer takes one block of each pair
constexpr int NUM_STAGES = 2;    // pairs of gathered blocks in flight
constexpr int NUM_CONSUMER_THREADS = 256;  // WG0 and WG1
constexpr int NUM_PRODUCER_THREADS = 128;  // WG2
constexpr int NUM_THREADS = NUM_CONSUMER_THREADS + NUM_PRODUCER_THREADS;
constexpr int CONSUMER_D_V = D_V / 2;      // output columns of each consumer's O^T
// The consumers' tile, one kernel instantiation each (kernel.cuh).
enum class Tile {
  kWide,     // 64 heads of one query token (tiles/wide.cuh)
  kNarrow,   // up to NARROW_HEADS heads of one token, logits transposed (tiles/narrow.cuh)
  kGrouped,  // a token group: rows t * h_q + h hold head h of the group's token t (tiles/grouped.cuh)
  kNarrow16, // kNarrow with 16 heads, for h_q <= 16 (last, so that the others keep their mangled names)
  kNarrow8,  // kNarrow with 8 heads, for h_q <= 8
};
// How the kv rows lie in global memory (gather.cuh), one kernel instantiation each: D_QK contiguous
// e4m3 bytes a row at one per-tensor scale, or the engines' paged 656-byte rows (512 e4m3 in 4 tiles
// of 128 with a float32 scale each, then 64 bf16 rope), which the producer requantizes per row.
enum class KvLayout {
  kContiguous,
  kPaged,
};
// A tile's policy, specialized in its file under tiles/: what the shared roles (producer, pair loops,
// epilogue, scheduler, kernel) ask of the tile, instead of which tile it is.
//   kHeads          the tile's heads of one token: B_H, or a narrow tile's N of Q.K^T and P.V
//   kNarrow         the consumers run the transposed pair loop and epilogue of tiles/narrow.cuh, and the
//                   launch of a token-grouped call's single tokens (scheduler.cuh, work_unit)
//   kGroups         a work item is a token group, each tile row masked to its token's slots
//   kSplits         the tile runs the tail split (split.cuh)
//   kCopiesArrive   how the producer hands a block over (copies_arrive, pipeline.cuh)
//   row_token_head  the query token and head of a tile row
//   SharedMembers   SharedMembers<Base>: Base, the shared memory every tile has before the tile's
//                   own members, then those members (SharedStorage)
template <Tile TILE>
struct TileTraits;

// A token group's masks (the pre-pass, token_groups/, writes them, the grouped tile's producer copies them): per
// block of B_TOPK entries of the group's list, for every block a pair can read (group_mask_blocks of a
// list of `slots` entries), one 64-bit word per token t of the group (bit r: entry r of the block is
// a slot of token t).
__host__ __device__ constexpr int group_mask_blocks(int slots) { return (slots + 2 * B_TOPK - 1) / (2 * B_TOPK) * 2; }

// The token groups' unit lists (the pre-pass, token_groups/, appends, the two launches read): [0] the groups of
// the grouped launch, [1] the tokens of the other launch, then the grouped launch's groups from
// GROUPED_UNITS (at most ceil(s_q / G)), then the other launch's tokens (at most s_q).
constexpr int GROUPED_UNITS = 2;
// Groups of group_size adjacent tokens in s_q tokens, the last one short where they do not divide
// (int on the device, int64_t in the entry's checks).
template <typename Int>
__host__ __device__ constexpr Int num_groups_of(Int s_q, Int group_size) {
  return s_q / group_size + (s_q % group_size != 0);
}
__host__ __device__ constexpr int64_t narrow_units_begin(int64_t s_q, int64_t group_size) {
  return GROUPED_UNITS + (s_q + group_size - 1) / group_size;  // num_groups_of; this form keeps the measured SASS
}
__host__ __device__ constexpr int64_t group_units_size(int64_t s_q, int64_t group_size) {
  return narrow_units_begin(s_q, group_size) + s_q;
}

// topk <= B_TOPK: every work unit is one pair whose block 1 holds no slot. That block is neither
// gathered nor multiplied: consumer 1 only takes part in the softmax's barriers, with P = 0. Not in a
// token group, whose list holds up to MAX_GROUP * TOPK slots.
template <int TOPK, Tile TILE>
constexpr bool one_block_tile() { return TOPK <= B_TOPK && !TileTraits<TILE>::kGroups; }
// setmaxnreg budgets: 2 x 232 + 40 = 504 = 3 x 168, the registers the CTA is launched with
// (__launch_bounds__(384, 1) caps a thread at 168); setmaxnreg.inc waits forever if the producer
// did not free what the consumers take.
constexpr int CONSUMER_REGS = 232;
constexpr int PRODUCER_REGS = 40;
constexpr int REGISTERS_PER_SM = 65536;  // the SM90 register file, 32-bit registers
constexpr int REGISTER_ALLOC_UNIT = 8;   // a thread's registers are allocated in steps of 8
static_assert(2 * CONSUMER_REGS + PRODUCER_REGS <=
                  3 * ((REGISTERS_PER_SM / NUM_THREADS) / REGISTER_ALLOC_UNIT * REGISTER_ALLOC_UNIT),
              "the warpgroups' registers after setmaxnreg fit in the CTA's launch allocation");
// The softmax keeps a reference max per head and moves it only when a new logit exceeds it by more
// than this (log2 units), so O is rescaled rarely; P = 2^(logit - reference) <= 2^(8 + 1/4) = 304
// (the 1/4: BlockLogits::write_probs) stays inside e4m3's range (448).
constexpr float REFERENCE_SLACK = 8.f;

// sm_scale * q_scale * kv_scale * log2(e), the multiplier from a raw Q.K^T sum to a logit in log2
// units, folded in double and clamped to +-2^100: a raw sum is below D_QK * 448^2 < 2^27 in
// magnitude, so no logit overflows fp32 and no inf - inf makes a NaN. The clamp binds only past
// |sm_scale * q_scale * kv_scale| = 2^100 / log2(e) (about 8.8e29; the host refuses |sm_scale| > 2^99):
// out is then still the softmax's (at that temperature, its argmax), max_logits and lse saturate.
// Paged rows have no kv_scale: each row's own scale multiplies its logits (consumer.cuh).
template <KvLayout LAYOUT>
__device__ __forceinline__ float logit_scale_log2(const PrefillParams& params) {
  constexpr double LOG2E = 1.4426950408889634;
  constexpr double LIMIT = 0x1p100;
  double folded;
  if constexpr (LAYOUT == KvLayout::kPaged) {
    folded = params.sm_scale * static_cast<double>(*params.q_scale) * LOG2E;
  } else {
    folded = params.sm_scale * static_cast<double>(*params.q_scale) * static_cast<double>(*params.kv_scale) * LOG2E;
  }
  return static_cast<float>(folded > LIMIT ? LIMIT : folded < -LIMIT ? -LIMIT : folded);  // NaN stays NaN
}

// Named barriers (id 0 is __syncthreads); each spans the 256 consumer threads.
enum NamedBarrierId : int {
  kRowMaxReady = 1,  // both consumers' block row maxima are in SharedStorage::row_max
  kProbsReady = 2,   // both blocks' P (and alpha) are in shared memory, fenced for wgmma
  kRowSumReady = 3,  // epilogue: row sums and maxima, then output scales, are in shared memory
  kSplitMerge = 4,   // split.cuh: this part is published; then, whether this CTA merges the item
};

// The kernel's shared memory, SharedStorage<D_QK, TILE> below: a chain of parts, each deriving from the
// one before and laid out after it. The operand tiles and the per-row state come first, every tile's;
// then the tile's own members (TileTraits<TILE>::SharedMembers, in its file under tiles/); then the
// tail split's flag and the pipeline's mbarriers, every tile's again. A chain and not several base
// classes: every part starts at the storage's address, so each member is that address plus a
// constant (through a base class at another offset, the compiler tests the storage's address for
// null at every access, and the code changes).
//
// Every operand tile is K-major with the 64-byte swizzle: column blocks of 64 bytes, block b at
// b * rows * 64, row r at r * 64 inside it, 16-byte chunk c (0..3) of the block at
// (c ^ ((r >> 1) & 3)) * 16. Tiles are 1024-byte aligned (the swizzle repeats every 512 bytes).
template <int D_QK>
struct SharedOperands {
  static constexpr int TILE_BYTES = B_TOPK * D_QK;  // 64 rows of D_QK e4m3
  static_assert(B_H == B_TOPK, "Q and KV tiles share one layout");

  alignas(1024) uint8_t q[TILE_BYTES];                   // this CTA's 64 heads of q (zero past h_q)
  alignas(1024) uint8_t kv[NUM_STAGES][2][TILE_BYTES];   // gathered rows [stage][block of the pair];
                                                         // zero rows for invalid slots (never read)
  alignas(1024) uint8_t probs[2][2][B_H * B_TOPK];       // e4m3 P [pair % 2][block]: rows are heads,
                                                         // columns slots in the P.V K order (consumer.cuh);
                                                         // double-buffered: P of pair p + 1 is written
                                                         // while P.V of pair p still reads pair p's
};
// Per-row state: the blocks' valid bits, and the softmax's and the epilogue's per-head exchanges
// between the consumers. With a base class it is no POD, so (Itanium C++ ABI) a class derived from it
// lays out its members from out_scale's end, in SharedRows' padding to a multiple of 1,024 bytes: the
// tile's own members follow the rows directly.
template <int D_QK>
struct SharedRows : SharedOperands<D_QK> {
  uint64_t valid[NUM_STAGES][2];                         // bit r: row r of kv[stage][block] is a valid slot
  float row_max[2][B_H];    // consumer w's row maxima (log2 units): of its block when a reference
                            // moves, of all its blocks in the epilogue
  float alpha[2][B_H];      // rescale factor of O per head for the pair (a copy per consumer)
  float row_sum[2][B_H];    // epilogue: each consumer's row sums
  float out_scale[B_H];     // epilogue: per-head output scale
};
// The paged layout's members (gather.cuh, PagedRows): where the producer stages each row's scales and
// rope before it requantizes the row into its tile, and each gathered row's scale, which the
// consumers fold into its logit and its P (consumer.cuh).
template <typename Base>
struct PagedMembers : Base {
  float4 scale_stage[2][B_TOPK];                            // [block of the pair][row]: the 4 tile scales
  uint4 rope_stage[2][2][NUM_PRODUCER_THREADS][2];          // [block][row k][producer thread]: its 16 bf16
  float row_logit_scale[NUM_STAGES][2][B_TOPK];             // scale_log2 * sigma_j (the row's values: e4m3 * sigma_j)
  float row_scale_log2[NUM_STAGES][2][B_TOPK];              // log2(sigma_j)
  float row_scale_inv[NUM_STAGES][2][B_TOPK];               // 1 / sigma_j
};
static_assert(sizeof(PagedMembers<SharedRows<576>>::row_logit_scale) == NUM_STAGES * 2 * B_TOPK * 4,
              "ScaledBlockLogits finds the row values' arrays one after the other");
template <KvLayout LAYOUT, typename Base>
struct LayoutMembersOf {
  using type = Base;  // contiguous rows: nothing, the storage is the same type as without layouts
};
template <typename Base>
struct LayoutMembersOf<KvLayout::kPaged, Base> {
  using type = PagedMembers<Base>;
};
// The kernel's shared memory with tile TILE and kv layout LAYOUT. The tile's own members sit between
// the rows (and the layout's members) and the barriers, where the wide tile keeps free bytes that hold
// its barriers where they were measured (tiles/wide.cuh).
template <int D_QK, Tile TILE, KvLayout LAYOUT = KvLayout::kContiguous>
struct SharedStorage
    : TileTraits<TILE>::template SharedMembers<typename LayoutMembersOf<LAYOUT, SharedRows<D_QK>>::type> {
  int split_last;           // split.cuh: this CTA finished the item's last part and merges it
  uint64_t q_full;                       // Q of the CTA's current work unit landed (Q_FULL_ARRIVALS)
  uint64_t q_empty;                      // the consumers' last Q.K^T of the work unit is done
                                         // (Q_EMPTY_ARRIVALS)
  uint64_t kv_full[NUM_STAGES][2];       // a block's rows landed and its valid bits are written
                                         // (kv_full_arrivals)
  uint64_t kv_empty[NUM_STAGES][2];      // both consumers have read the block's rows into registers
                                         // and finished their Q.K^T on it (KV_EMPTY_ARRIVALS)
};

// Accumulators and softmax state a consumer thread carries from its pair loop (consumer.cuh) to the
// tail split's merge (split.cuh) and the epilogue (epilogue.cuh).
struct ConsumerState {
  float o[4][32];      // O^T, see the fragment notes in consumer.cuh
  float reference[2];  // per head row g, g + 8 of this thread: the max P is relative to (log2 units)
  float row_max[2];    // the running max of this thread's logits (log2 units); rows are reduced in the epilogue
  float row_sum[2];    // this thread's share of sum(P) relative to `reference`
};

// One part's state in the tail split's workspace (split.cuh), in fp32: every consumer thread's O^T
// fragment (float4 k of thread t at 4 * (k * 256 + t), so that a warp's stores are contiguous), its
// row statistics {row_sum[0], row_sum[1], row_max[0], row_max[1]}, then the reference of each of the
// 64 heads. The Python side allocates [items - split_begin, split_parts, PART_FLOATS]
// (SPLIT_PART_FLOATS there).
constexpr int PART_O_FLOATS = NUM_CONSUMER_THREADS * static_cast<int>(sizeof(ConsumerState::o) / sizeof(float));
constexpr int PART_STAT_FLOATS = NUM_CONSUMER_THREADS * 4;  // row_sum and row_max of 2 rows
constexpr int PART_FLOATS = PART_O_FLOATS + PART_STAT_FLOATS + B_H;
constexpr int MAX_SPLIT_PARTS = 4;

// The dynamic shared memory of tile TILE's kernel (launch.cuh), checked against the limit where the
// kernel is instantiated (kernel.cuh).
template <int D_QK, Tile TILE, KvLayout LAYOUT = KvLayout::kContiguous>
constexpr int shared_storage_bytes() {
  return static_cast<int>(sizeof(SharedStorage<D_QK, TILE, LAYOUT>));
}
constexpr int SHARED_MEMORY_PER_BLOCK = 232448;  // SM90's opt-in limit of dynamic shared memory, 227 KB

}  // namespace sparse_mla::sm90::prefill
