// The work-unit sequence of a CTA.
//
// The producer and the consumers never exchange which unit or which stage comes next: each role
// iterates its own WorkScheduler (run_producer's unit loop, the consumers' in kernel.cuh or
// run_narrow_consumers), which walks this CTA's units in one order (work_unit) and counts the units
// and pairs before the current one, and both roles derive each mbarrier's stage and parity from those
// counts through the same cursor (PipelineState, pipeline.cuh).
#pragma once

#include <cstdint>

#include <sparse_mla/params.cuh>
#include <sparse_mla/sm90/prefill/pipeline.cuh>
#include <sparse_mla/sm90/prefill/traits.cuh>

namespace sparse_mla::sm90::prefill {

// A work item is a query token and a block of up to B_H of its heads; a work unit is what a CTA
// takes at a time: unit u is item u, except in the tail split (split.cuh), where each item from
// split_begin on is cut into split_parts units, each a range of its pairs. A CTA processes the units
// blockIdx.x, blockIdx.x + gridDim.x, ... (one CTA per SM), so the producer
// gathers the next unit's Q and first blocks while the consumers finish the current one (no CTA
// launch or pipeline fill between units). Both head blocks of a token are neighbouring items: they
// run at the same time on neighbouring CTAs and gather the same rows, the second from L2.
// With the grouped tile (tiles/grouped.cuh) an item is a token group: q_row is its first token, num_heads
// the tile rows that exist (h_q per token of the group), and the slots are the entries of its list.
// In a token-grouped call each launch's unit u is entry u of its own list (group_units, traits.cuh):
// the grouped launch's u-th group, the narrow launch's u-th token of the groups that run token by token.
struct WorkUnit {
  int item;        // the (token, head block) index
  int q_row;
  int head_begin;
  int num_heads;   // heads of this block that exist (the tile's other rows are zero and not stored)
  int part;        // which part of a split item this unit is; 0 when the item is not split
  int slot_begin;  // the unit's first slot (a multiple of 2 * B_TOPK)
  int n_slots;     // slots of the unit that can be valid: from slot_begin to min(topk_length, topk)
  int n_pairs;     // pairs of B_TOPK-row blocks covering n_slots (0 when there are none)
};

// Blocks of B_H heads per query token.
// (Not (h_q + B_H - 1) / B_H: that overflows int for h_q near INT32_MAX.)
__host__ __device__ __forceinline__ int num_head_blocks(const PrefillParams& params) {
  return params.h_q / B_H + (params.h_q % B_H != 0);
}

// Work items: (query token, 64-head block) pairs; work units: the items, the split ones counted per part.
__host__ __device__ __forceinline__ int64_t num_work_units(const PrefillParams& params) {
  const int64_t items = static_cast<int64_t>(params.s_q) * num_head_blocks(params);
  return params.split_begin + (items - params.split_begin) * params.split_parts;
}

// Token groups of the call (at most the grouped launch's work units).
__host__ __device__ __forceinline__ int num_token_groups(const PrefillParams& params) {
  return num_groups_of(params.s_q, params.group_size);
}

// The launch's work units: in a token-grouped call, the length of its list in group_units (written by
// the pre-pass, which ran before this launch on its stream; clamped to the list's room, which only
// counts that the pre-pass did not write, from a caller of prefill_fwd, exceed).
//
// The narrow launch reads the lists here and in work_unit without a griddepcontrol.wait of its own:
// the pre-pass is two grids back, and a wait would also wait for the grouped launch between them,
// which the narrow launch is meant to overlap. The lists are complete and visible to it all the
// same. It is launched with programmatic stream serialization behind the grouped launch
// (prefill_token_groups_fwd, entry.cuh; launch.cuh), so none of its CTAs starts before every CTA
// of the grouped grid has executed griddepcontrol.launch_dependents; each does that only after its
// griddepcontrol.wait returned (prefill_kernel, kernel.cuh), and that wait returns only once the
// pre-pass grid has completed and its memory operations are performed and made visible. So the
// pre-pass had completed, its writes performed, before the narrow grid began. The guarantee relied
// on is the one CUDA gives a grid that begins after another grid completed: that grid's writes are
// visible to it. griddepcontrol.wait states that visibility for the waiting grid; the narrow grid
// has it by the order of events above, which tests/cpu/test_launch_order.py checks in the headers.
template <Tile TILE>
__device__ __forceinline__ int num_launch_units(const PrefillParams& params) {
  if (params.group_units != nullptr) {
    constexpr bool GROUPED = TileTraits<TILE>::kGroups;
    const uint32_t room = GROUPED ? num_token_groups(params) : params.s_q;
    return static_cast<int>(min(static_cast<uint32_t>(__ldg(params.group_units + (GROUPED ? 0 : 1))), room));
  }
  return static_cast<int>(num_work_units(params));  // entry.cuh checks that the units fit an int
}

// Group `item` of the grouped launch, with `n_slots` list entries and `n_pairs` pairs (n_slots is
// the producer's only: the consumers take the unit from it, WorkScheduler::current_from_producer).
__device__ __forceinline__ WorkUnit group_unit_of(int item, int n_slots, int n_pairs, const PrefillParams& params) {
  WorkUnit w;
  w.item = item;
  w.q_row = w.item * params.group_size;
  w.head_begin = 0;
  w.num_heads = min(params.group_size, params.s_q - w.q_row) * params.h_q;
  w.part = 0;
  w.slot_begin = 0;
  w.n_slots = n_slots;
  w.n_pairs = n_pairs;
  return w;
}

// The grouped launch's unit u: the u-th group of its list.
__device__ __forceinline__ WorkUnit group_unit(int unit, const PrefillParams& params) {
  const int item = __ldg(params.group_units + GROUPED_UNITS + unit);
  const int n_slots = __ldg(params.group_length + item);  // >= 0: the group is in this launch's list
  return group_unit_of(item, n_slots, (n_slots + 2 * B_TOPK - 1) / (2 * B_TOPK), params);
}

// The split's runtime divisions (on the path between two units) run for split units only.
template <int TOPK, Tile TILE>
__device__ __forceinline__ WorkUnit work_unit(int unit, const PrefillParams& params, int head_blocks) {
  if constexpr (TileTraits<TILE>::kGroups) return group_unit(unit, params);
  constexpr int ITEM_PAIRS = (TOPK + 2 * B_TOPK - 1) / (2 * B_TOPK);
  // A token-grouped call's narrow launch: the unit-th token of its list (h_q <= 32: one item a token),
  // read without a wait of its own (num_launch_units says why the list is complete and visible).
  int item = TileTraits<TILE>::kNarrow && params.group_units != nullptr
                 ? __ldg(params.group_units + narrow_units_begin(params.s_q, params.group_size) + unit)
                 : unit;
  int part = 0, pair_begin = 0, pair_end = ITEM_PAIRS;
  if (unit >= params.split_begin) {
    const int parts = params.split_parts;
    item = params.split_begin + (unit - params.split_begin) / parts;
    part = unit - params.split_begin - (item - params.split_begin) * parts;
    pair_begin = part * ITEM_PAIRS / parts;
    pair_end = (part + 1) * ITEM_PAIRS / parts;
  }
  WorkUnit w;
  w.item = item;
  w.q_row = item / head_blocks;
  w.head_begin = (item - w.q_row * head_blocks) * B_H;
  w.num_heads = min(B_H, params.h_q - w.head_begin);
  w.part = part;
  const int item_slots =
      params.topk_length == nullptr ? TOPK : min(max(__ldg(params.topk_length + w.q_row), 0), TOPK);
  w.slot_begin = pair_begin * 2 * B_TOPK;
  w.n_slots = max(min(item_slots, pair_end * 2 * B_TOPK) - w.slot_begin, 0);
  w.n_pairs = (w.n_slots + 2 * B_TOPK - 1) / (2 * B_TOPK);
  return w;
}

// This CTA's walk through its work units: the current one, whether it is a part of a split item, and
// the counts the roles make their cursors from (QStage of the Q tile, KvStage of each pair).
// head_blocks and n_units are num_head_blocks and num_work_units of params, which the kernel computes
// once for both roles before the role split (computed in here, they compile to a different schedule).
// current() notes where the unit's pairs end and advance() moves the pair count there, so that the
// add sits ahead of the consumers' split merge: made in advance() from the unit, at the end of the
// consumers' loop, it compiles to a different schedule.
template <int TOPK, Tile TILE>
class WorkScheduler {
 public:
  __device__ __forceinline__ WorkScheduler(const PrefillParams& params, int head_blocks, int n_units)
      : params_(params), head_blocks_(head_blocks), n_units_(n_units), unit_(blockIdx.x) {}

  __device__ __forceinline__ bool has_work() const { return unit_ < n_units_; }
  __device__ __forceinline__ WorkUnit current() {
    const WorkUnit w = work_unit<TOPK, TILE>(unit_, params_, head_blocks_);
    pair_end_ = pair_base_ + w.n_pairs;
    return w;
  }
  // The grouped tile's consumers: the unit the producer computed and left in shared memory with its
  // q_full arrival (produce_unit), which the caller waited for (kernel.cuh), so that a unit's start
  // waits for no global load (the list's entry, then the group's length). `unit`: (group, pairs).
  __device__ __forceinline__ WorkUnit current_from_producer(int2 unit) {
    const WorkUnit w = group_unit_of(unit.x, 0, unit.y, params_);
    pair_end_ = pair_base_ + w.n_pairs;
    return w;
  }
  __device__ __forceinline__ bool is_split_part() const { return TileTraits<TILE>::kSplits && unit_ >= params_.split_begin; }
  __device__ __forceinline__ int unit_count() const { return unit_count_; }
  __device__ __forceinline__ int pair_base() const { return pair_base_; }
  __device__ __forceinline__ void advance() {
    unit_ += gridDim.x;
    ++unit_count_;
    pair_base_ = pair_end_;
  }

 private:
  const PrefillParams& params_;
  int head_blocks_, n_units_;
  int unit_;            // the current unit: blockIdx.x, blockIdx.x + gridDim.x, ...
  int unit_count_ = 0;  // this CTA's units before it
  int pair_base_ = 0;   // their pairs
  int pair_end_ = 0;    // pair_base_ plus the current unit's pairs (current())
};

}  // namespace sparse_mla::sm90::prefill
