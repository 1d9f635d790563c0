// The SM90 FP8 sparse MLA prefill kernel: setup, then one role per warpgroup (traits.cuh).
//
// Numerics: Q.K^T and P.V run on e4m3 wgmma with fp32 accumulators (FP8 tensor-core accumulation
// carries a few units of 2^-9 relative error per logit); softmax in the exp2 domain with
// sm_scale * q_scale * kv_scale * log2(e) folded into one multiplier; P rounded to e4m3; the
// dequantization scale of V applied once in the epilogue. Paged rows (KvLayout::kPaged) carry a scale
// per row instead of kv_scale, folded into each row's logit and P (consumer.cuh, ScaledBlockLogits).
#pragma once

#include <cmath>
#include <cstdint>

#include <cuda_runtime.h>

#include <sparse_mla/params.cuh>
#include <sparse_mla/sm90/prefill/consumer.cuh>
#include <sparse_mla/sm90/prefill/epilogue.cuh>
#include <sparse_mla/sm90/prefill/pipeline.cuh>
#include <sparse_mla/sm90/prefill/primitives.cuh>
#include <sparse_mla/sm90/prefill/producer.cuh>
#include <sparse_mla/sm90/prefill/scheduler.cuh>
#include <sparse_mla/sm90/prefill/split.cuh>
#include <sparse_mla/sm90/prefill/tiles/grouped.cuh>
#include <sparse_mla/sm90/prefill/tiles/narrow.cuh>
#include <sparse_mla/sm90/prefill/tiles/wide.cuh>
#include <sparse_mla/sm90/prefill/traits.cuh>

namespace sparse_mla::sm90::prefill {

// Grid: one CTA per SM at most; each CTA walks its work units (scheduler.cuh: WorkScheduler, WorkUnit).
// TILE (traits.cuh, its policy TileTraits in tiles/): the wide tile; the narrow ones for h_q <=
// NARROW_HEADS (and <= 16), launched without a tail split; the grouped one over token groups, also
// without.
template <int D_QK, int TOPK, Tile TILE, KvLayout LAYOUT = KvLayout::kContiguous>
__global__ void __launch_bounds__(NUM_THREADS, 1) prefill_kernel(const __grid_constant__ PrefillParams params) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 900 || !defined(__CUDA_ARCH_FEAT_SM90_ALL))
  __trap();  // built for the wrong target (wgmma and setmaxnreg need sm_90a)
#else
  // The kernel has no static shared memory, so the dynamic allocation starts the CTA's window, which
  // is 1024-byte aligned. Declaring it so makes every shared address a constant: no base register.
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  auto& ss = *reinterpret_cast<SharedStorage<D_QK, TILE, LAYOUT>*>(smem_raw);
  static_assert(shared_storage_bytes<D_QK, TILE, LAYOUT>() <= SHARED_MEMORY_PER_BLOCK, "fits the per-block shared-memory limit");
  if ((smem_addr(smem_raw) & 1023u) != 0) __trap();  // the swizzled tiles rely on it

  // The grouped launch reads the pre-pass's lists: it waits for that grid (launch.cuh), then lets the
  // launch behind it start on the SMs its CTAs leave. In this order, before any read of the lists and
  // with no trigger elsewhere: the narrow launch behind reads the same lists with no wait of its own,
  // and they are visible to it because it starts only after every CTA here passed this wait
  // (num_launch_units, scheduler.cuh).
  using Traits = TileTraits<TILE>;
  if constexpr (Traits::kGroups) {
    wait_for_grid_ahead();
    allow_dependent_grid();
  }
  const int head_blocks = num_head_blocks(params);
  const int n_units = num_launch_units<TILE>(params);

  if (threadIdx.x == 0) {
    ClusterBarrier::init(&ss.q_full, Q_FULL_ARRIVALS);
    ClusterBarrier::init(&ss.q_empty, Q_EMPTY_ARRIVALS);
#pragma unroll
    for (int stage = 0; stage < NUM_STAGES; ++stage) {
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        ClusterBarrier::init(&ss.kv_full[stage][b], kv_full_arrivals<TILE, LAYOUT>());
        ClusterBarrier::init(&ss.kv_empty[stage][b], KV_EMPTY_ARRIVALS);
      }
    }
  }
  __syncthreads();

  // The roles' unit loops, side by side: the same units in the same order (scheduler.cuh).
  if (threadIdx.x >= NUM_CONSUMER_THREADS) {
    cutlass::arch::warpgroup_reg_dealloc<PRODUCER_REGS>();
    run_producer<D_QK, TOPK, TILE>(params, ss, head_blocks, n_units);
  } else {
    cutlass::arch::warpgroup_reg_alloc<CONSUMER_REGS>();
    const float scale_log2 = logit_scale_log2<LAYOUT>(params);
    if constexpr (Traits::kNarrow) {
      run_narrow_consumers<D_QK, TOPK, TILE>(params, ss, head_blocks, n_units, scale_log2);
    } else {
      WorkScheduler<TOPK, TILE> scheduler(params, head_blocks, n_units);
      // The unit's pairs, then (a split part) the merge, which leaves the outputs to the item's last
      // part, then the outputs. Written out here: as one consume_unit function, the loop compiles to
      // different code at topk 1 and 64.
      for (; scheduler.has_work(); scheduler.advance()) {
        WorkUnit w;
        if constexpr (Traits::kGroups) {
          // The unit from the producer (scheduler.cuh), written before its q_full arrival: the
          // mainloop's first wait, early.
          mbarrier_wait(&ss.q_full, QStage(scheduler.unit_count()).phase);
          w = scheduler.current_from_producer(ss.group_unit[scheduler.unit_count() % 2]);
        } else {
          w = scheduler.current();
        }
        ConsumerState st;
        run_consumer_mainloop<D_QK, TOPK, TILE>(ss, scale_log2, w.n_pairs, scheduler.pair_base(), scheduler.unit_count(), st);
        if (scheduler.is_split_part() && !merge_split_parts<D_QK>(params, ss, st, w)) continue;
        store_outputs<D_QK, TILE>(params, ss, st, w.q_row, w.head_begin, w.num_heads);
      }
    }
  }
  // A token-grouped call's launch of the tokens that run one by one starts beside the grouped launch:
  // it finishes after it, so that the call's outputs are all written when the caller's next kernel
  // starts. (In a split call the grid ahead is the counters' zeroing, long done.)
  if constexpr (!Traits::kGroups) wait_for_grid_ahead();
#endif
}

}  // namespace sparse_mla::sm90::prefill
