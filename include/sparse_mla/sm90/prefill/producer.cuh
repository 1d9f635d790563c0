// The producer warpgroup: for each work unit of the CTA (its unit loop is run_producer's), produce_unit
// loads the unit's Q tile, then gathers the KV rows of every pair of blocks into a stage, NUM_STAGES
// pairs ahead of the consumers at most.
//
// Each of the 128 threads moves rows r and r + 32 of a 64-row tile (r = thread / 4), 16-byte chunks
// 4i + thread % 4 of each: four neighbouring threads read 64 contiguous bytes of a row (gather.cuh,
// which also holds the kv rows' layout). Invalid slots (index outside [0, s_kv), or past topk_length)
// are zero-filled by cp.async without reading their row; their bit in SharedStorage::valid is 0 so
// the consumers mask them out. The indices of the next pair are loaded before waiting for a free
// stage, so their latency hides behind that wait.
//
// Handoff: cp.async writes through the generic proxy and the consumers' Q.K^T reads Q and K through
// the async proxy (wgmma), so each thread waits for its copies to land, executes fence.proxy.async,
// and only then arrives on q_full / kv_full (a plain release; the consumers acquire it by waiting).
// Per pair, both blocks are issued before the first wait: block 0 (and, on a unit's first pair, Q)
// arrives once its group has landed while block 1's copies are still in flight, block 1 at the end of
// the pair. Waiting for each block before issuing the next is slower, most at long s_kv: block 1's
// refill then starts only when block 0's copies have landed. Deferring block 1 to the next pair
// would deadlock: consumer 1 issues Q.K^T on it before releasing the block that pair waits for.
// With the narrow tile the copies' landing arrives instead (copies_arrive, pipeline.cuh): the producer
// waits only for free stages, and each consumer fences after its wait (tiles/narrow.cuh).
#pragma once

#include <cstdint>

#include <sparse_mla/params.cuh>
#include <sparse_mla/sm90/prefill/gather.cuh>
#include <sparse_mla/sm90/prefill/pipeline.cuh>
#include <sparse_mla/sm90/prefill/primitives.cuh>
#include <sparse_mla/sm90/prefill/scheduler.cuh>
#include <sparse_mla/sm90/prefill/swizzle.cuh>
#include <sparse_mla/sm90/prefill/traits.cuh>

namespace sparse_mla::sm90::prefill {

// A producer thread's place, the same for every unit: its lane and warp in the producer warpgroup,
// its two rows of a 64-row tile, its 16-byte chunk in each 64-byte column block of them, and where
// that chunk of column block 0 lies in a swizzled tile (column block i lies i * B_TOPK * 64 further).
struct ProducerThread {
  int lane, warp;
  int chunk;
  int rows[2];
  uint32_t dst_offset[2];
};

__device__ __forceinline__ ProducerThread producer_thread() {
  const int t = threadIdx.x - NUM_CONSUMER_THREADS;
  ProducerThread pt;
  pt.lane = t % 32;
  pt.warp = t / 32;
  pt.chunk = t % 4;
  pt.rows[0] = t / 4;
  pt.rows[1] = t / 4 + 32;
#pragma unroll
  for (int k = 0; k < 2; ++k) pt.dst_offset[k] = swizzled_offset(pt.rows[k], pt.chunk, B_TOPK);
  return pt;
}

// The kv rows of `params` in layout LAYOUT (gather.cuh).
template <int D_QK, KvLayout LAYOUT>
__device__ __forceinline__ auto kv_rows(const PrefillParams& params) {
  if constexpr (LAYOUT == KvLayout::kPaged) {
    return PagedRows<D_QK>{reinterpret_cast<const uint8_t*>(params.kv), params.kv_block_stride, params.kv_block_size,
                           params.s_kv};
  } else {
    return ContiguousRows<D_QK>{reinterpret_cast<const uint8_t*>(params.kv), params.kv_stride_s, params.s_kv};
  }
}

// Paged rows: this thread's share of block b of the stage, whose copies landed, requantized to each
// row's scale (requantize_row), which the row's chunk-0 thread publishes for the consumers (released
// with the block's kv_full arrival, after the caller's fence).
template <int D_QK, typename Storage>
__device__ __forceinline__ void requantize_block(Storage& ss, const ProducerThread& pt, int stage, int b,
                                                 const PagedRows<D_QK>& kv, const int32_t (&index)[2],
                                                 float scale_log2) {
  __syncwarp();  // the row's scales, staged by its chunk-0 lane, are visible to its 3 neighbours
  const uint32_t tile = smem_addr(ss.kv[stage][b]);
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int row = pt.rows[k];
    const float sigma = requantize_row<D_QK>(tile + pt.dst_offset[k], ss.scale_stage[b][row],
                                             smem_addr(&ss.rope_stage[b][k][32 * pt.warp + pt.lane][0]),
                                             kv.holds(index[k]));
    if (pt.chunk == 0) {
      // Clamped as logit_scale_log2 is (traits.cuh): no logit overflows; NaN stays NaN.
      constexpr float LIMIT = 0x1p100f;
      const float logit_scale = scale_log2 * sigma;
      ss.row_logit_scale[stage][b][row] = logit_scale > LIMIT ? LIMIT : logit_scale < -LIMIT ? -LIMIT : logit_scale;
      ss.row_scale_log2[stage][b][row] = __log2f(sigma);
      ss.row_scale_inv[stage][b][row] = __frcp_rn(sigma);
    }
  }
}

// One work unit: its Q tile, then its pairs. `unit_count` counts the CTA's earlier units (the QStage of
// q_empty), `pair_base` their pairs (the KvStage of each pair).
template <int D_QK, int TOPK, Tile TILE, KvLayout LAYOUT>
__device__ __forceinline__ void produce_unit(const PrefillParams& params, SharedStorage<D_QK, TILE, LAYOUT>& ss,
                                             const ProducerThread& pt, const WorkUnit& w, int unit_count,
                                             int pair_base, [[maybe_unused]] float scale_log2) {
  // Copies of pt's fields: read through pt instead, the producer compiles to different code (every
  // test key's cubin changes).
  const int lane = pt.lane, warp = pt.warp, chunk = pt.chunk;
  const int rows[2] = {pt.rows[0], pt.rows[1]};
  const uint32_t dst_offset[2] = {pt.dst_offset[0], pt.dst_offset[1]};

  constexpr bool PAGED = LAYOUT == KvLayout::kPaged;
  const auto kv = kv_rows<D_QK, LAYOUT>(params);
  const int q_row = w.q_row, head_begin = w.head_begin, num_heads = w.num_heads;
  const int n_slots = w.n_slots, n_pairs = w.n_pairs;
  // The grouped tile's consumers take the unit from here (WorkScheduler::current_from_producer), in
  // the slot of the unit's parity: its previous unit, two before this one, was read by the consumers
  // before they arrived on that unit's q_empty, which this thread waited for before its previous
  // unit's Q; released by this thread's q_full arrival. (One slot, written after the q_empty wait
  // below, made the producer spill 72 bytes.)
  if constexpr (TileTraits<TILE>::kGroups) {
    if (lane == 0 && warp == 0) ss.group_unit[unit_count % 2] = make_int2(w.item, w.n_pairs);
  }
  // Q: rows past h_q are zero. Loaded once the consumers' last Q.K^T of the previous unit is done.
  {
    const QStage q(unit_count);
    if (q.reused()) mbarrier_wait(&ss.q_empty, q.empty_phase());
    const uint32_t q_tile = smem_addr(ss.q);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const bool valid = rows[k] < num_heads;
      const uint8_t* src = reinterpret_cast<const uint8_t*>(params.q) + static_cast<int64_t>(q_row) * params.q_stride_s +
                           (valid ? static_cast<int64_t>(head_begin + rows[k]) * params.q_stride_h : 0) + chunk * 16;
      if constexpr (TileTraits<TILE>::kGroups) {  // row r: head r % h_q of token q_row + r / h_q
        const int2 token_head = TileTraits<TILE>::row_token_head(params, q_row, head_begin, valid ? rows[k] : 0);
        src = reinterpret_cast<const uint8_t*>(params.q) + static_cast<int64_t>(token_head.x) * params.q_stride_s +
              static_cast<int64_t>(token_head.y) * params.q_stride_h + chunk * 16;
      }
      copy_row_chunks<D_QK>(q_tile + dst_offset[k], src, valid);
    }
    cp_async_commit();  // arrives with the first pair's block 0 (below), or now if the unit has none;
    if constexpr (copies_arrive<TILE, LAYOUT>()) {  // or the copies' landing arrives
      cp_async_arrive_noinc(&ss.q_full);  // the consumers fence after their waits (traits.cuh)
    } else if (n_pairs == 0) {
      cp_async_wait<0>();
      cutlass::arch::fence_view_async_shared();
      mbarrier_arrive(&ss.q_full);
    }
  }

  constexpr bool GROUPED = TileTraits<TILE>::kGroups;
  const int64_t list = GROUPED ? static_cast<int64_t>(w.item) * params.group_size * TOPK : static_cast<int64_t>(q_row) * TOPK;
  const int32_t* slot_indices = (GROUPED ? params.group_indices : params.indices) + list + w.slot_begin;
  auto load_index = [&](int slot) { return slot < n_slots ? __ldg(slot_indices + slot) : -1; };
  // A token group's masks (token_groups/): thread r < B_H copies, with each block's rows, the mask
  // of tile row r's token into row_valid[..][r] (a group's unit starts at its list's first entry).
  const int group_size = params.group_size, mask_row = 32 * warp + lane;
  const bool copies_mask = GROUPED && mask_row < B_H;
  const uint64_t* block_masks =
      GROUPED ? params.group_masks + static_cast<int64_t>(w.item) * group_mask_blocks(group_size * TOPK) * group_size +
                    min(mask_row / params.h_q, group_size - 1)
              : nullptr;

  int32_t index[2][2];  // [block of the pair][row k]
#pragma unroll
  for (int b = 0; b < 2; ++b) {
#pragma unroll
    for (int k = 0; k < 2; ++k) index[b][k] = load_index(b * B_TOPK + rows[k]);
  }

  for (int pair = 0; pair < n_pairs; ++pair) {
    const KvStage stage(pair_base + pair);
    int32_t next[2][2];
#pragma unroll
    for (int b = 0; b < 2; ++b) {
#pragma unroll
      for (int k = 0; k < 2; ++k) next[b][k] = load_index((2 * pair + 2 + b) * B_TOPK + rows[k]);
    }
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      if (stage.reused()) mbarrier_wait(&ss.kv_empty[stage.index][b], stage.empty_phase());
      const uint32_t tile = smem_addr(ss.kv[stage.index][b]);
      bool valid[2];
      if constexpr (PAGED) __syncwarp();  // the staging's last readers (requantize_block) are done
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        valid[k] = kv.holds(index[b][k]);
        if (one_block_tile<TOPK, TILE>() && b == 1) continue;  // never read: only its valid bits (0) and arrivals
        if constexpr (PAGED) {
          kv.copy_row(tile + dst_offset[k], smem_addr(&ss.scale_stage[b][rows[k]]),
                      smem_addr(&ss.rope_stage[b][k][32 * warp + lane][0]), index[b][k], valid[k], chunk);
        } else {
          kv.copy_row(tile + dst_offset[k], index[b][k], valid[k], chunk);
        }
      }
      if constexpr (GROUPED) {
        // Every entry of the list is valid and the masks are 0 past it: they are the valid bits.
        if (copies_mask) cp_async_8(smem_addr(&ss.row_valid[stage.index][b][mask_row]), block_masks + (2 * pair + b) * group_size);
        cp_async_commit();
      } else {
        // Where the copies arrive by themselves they need no group (committed too, they made the
        // producer spill 4 bytes in its kv_empty wait).
        if constexpr (copies_arrive<TILE, LAYOUT>()) cp_async_arrive_noinc(&ss.kv_full[stage.index][b]);
        else cp_async_commit();
        // Valid bits of rows 8 * warp + j and 32 + 8 * warp + j (j < 8): lane 4j holds row j's flag.
        // Released with lane 0's arrival below.
        const uint32_t low = __ballot_sync(0xffffffffu, __shfl_sync(0xffffffffu, valid[0], 4 * (lane & 7))) & 0xffu;
        const uint32_t high = __ballot_sync(0xffffffffu, __shfl_sync(0xffffffffu, valid[1], 4 * (lane & 7))) & 0xffu;
        if (lane == 0) {
          uint8_t* bytes = reinterpret_cast<uint8_t*>(&ss.valid[stage.index][b]);
          bytes[warp] = static_cast<uint8_t>(low);
          bytes[4 + warp] = static_cast<uint8_t>(high);
          if constexpr (copies_arrive<TILE, LAYOUT>()) mbarrier_arrive(&ss.kv_full[stage.index][b]);
        }
      }
    }
    if constexpr (!copies_arrive<TILE, LAYOUT>()) {
      // Block 0 (and Q before it) landed, block 1 may still be in flight: see the handoff above.
      cp_async_wait<1>();
      if constexpr (PAGED) requantize_block<D_QK>(ss, pt, stage.index, 0, kv, index[0], scale_log2);
      cutlass::arch::fence_view_async_shared();
      if (pair == 0) mbarrier_arrive(&ss.q_full);
      mbarrier_arrive(&ss.kv_full[stage.index][0]);
      cp_async_wait<0>();
      if constexpr (PAGED) {
        if (!one_block_tile<TOPK, TILE>()) requantize_block<D_QK>(ss, pt, stage.index, 1, kv, index[1], scale_log2);
      }
      cutlass::arch::fence_view_async_shared();
      mbarrier_arrive(&ss.kv_full[stage.index][1]);
    }
#pragma unroll
    for (int b = 0; b < 2; ++b) {
#pragma unroll
      for (int k = 0; k < 2; ++k) index[b][k] = next[b][k];
    }
  }
}

// The producer warpgroup's role: produce_unit for each of the CTA's work units.
template <int D_QK, int TOPK, Tile TILE, KvLayout LAYOUT>
__device__ __forceinline__ void run_producer(const PrefillParams& params, SharedStorage<D_QK, TILE, LAYOUT>& ss, int head_blocks,
                                             int n_units) {
  const ProducerThread pt = producer_thread();
  // Paged rows: the consumers' logit multiplier of each row is this times its scale (requantize_block).
  const float scale_log2 = LAYOUT == KvLayout::kPaged ? logit_scale_log2<LAYOUT>(params) : 0.f;
  WorkScheduler<TOPK, TILE> scheduler(params, head_blocks, n_units);
  for (; scheduler.has_work(); scheduler.advance()) {
    const WorkUnit w = scheduler.current();
    produce_unit<D_QK, TOPK, TILE>(params, ss, pt, w, scheduler.unit_count(), scheduler.pair_base(), scale_log2);
  }
  if constexpr (copies_arrive<TILE, LAYOUT>()) {  // no copy outlives its thread (they are not committed)
    cp_async_commit();
    cp_async_wait<0>();
  }
}

}  // namespace sparse_mla::sm90::prefill
