// The tail split: the last, partial round of work items cut into parts that fill the idle CTAs.
//
// With one CTA per SM walking the work items in rounds of gridDim.x, s_q = 437 at h_q 64 runs 4
// rounds for 3.3 rounds of work. The split plan (`split_plan`, python/sparse_mla/launch.py) cuts each
// item of the last round into split_parts ranges of its pairs, each a work unit on another CTA
// (scheduler.cuh, work_unit).
// Every part publishes its softmax state (unnormalized O^T, row sums and maxima, references) to a
// workspace; the CTA that finishes an item's last part (a per-item counter) merges all parts in
// part order, so the result does not depend on which part finished last, and stores the outputs.
#pragma once

#include <cmath>
#include <cstdint>

#include <sparse_mla/params.cuh>
#include <sparse_mla/sm90/prefill/primitives.cuh>
#include <sparse_mla/sm90/prefill/scheduler.cuh>
#include <sparse_mla/sm90/prefill/traits.cuh>

namespace sparse_mla::sm90::prefill {

// Publishes this part's state; in the CTA that finishes the item's last part, replaces `st` with the
// merged state of all parts and returns true (the caller then stores the outputs). Consumer threads
// only; the CTA's earlier part of another item never shares a counter with this one.
template <int D_QK, Tile TILE, KvLayout LAYOUT>
__device__ __forceinline__ bool merge_split_parts(const PrefillParams& params, SharedStorage<D_QK, TILE, LAYOUT>& ss,
                                                  ConsumerState& st, const WorkUnit& w) {
  const auto [wg, warp, lane, g, c] = consumer_thread();
  const int t = threadIdx.x;
  const int parts = params.split_parts;
  float* const item_ws =
      params.split_workspace + static_cast<int64_t>(w.item - params.split_begin) * parts * PART_FLOATS;
  {
    float* const mine = item_ws + static_cast<int64_t>(w.part) * PART_FLOATS;
#pragma unroll
    for (int k = 0; k < 32; ++k) {
      const float* o = &st.o[k / 8][4 * (k % 8)];
      __stcg(reinterpret_cast<float4*>(mine) + k * NUM_CONSUMER_THREADS + t, make_float4(o[0], o[1], o[2], o[3]));
    }
    __stcg(reinterpret_cast<float4*>(mine + PART_O_FLOATS) + t,
           make_float4(st.row_sum[0], st.row_sum[1], st.row_max[0], st.row_max[1]));
    // Both consumers hold the same references: consumer 0 writes them, at heads frag_row(warp, g, h)
    // (written out: as one offset the address compiles to different code).
    if (wg == 0 && c == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) __stcg(mine + PART_O_FLOATS + PART_STAT_FLOATS + 16 * warp + g + 8 * h, st.reference[h]);
    }
  }
  // The classic last-block pattern: every thread's stores are fenced before the count goes up, and
  // the last part's reads come after its atomic saw every other part's increment.
  __threadfence();
  named_barrier_sync<kSplitMerge, NUM_CONSUMER_THREADS>();
  if (t == 0) {
    wait_for_grid_ahead();  // the counters' zeroing (launch.cuh)
    ss.split_last = atomicAdd(params.split_counters + (w.item - params.split_begin), 1) == parts - 1;
  }
  named_barrier_sync<kSplitMerge, NUM_CONSUMER_THREADS>();
  // Read through lane 0, so that ptxas knows the branch warp-uniform: a divergent exit from the unit
  // loop would move the pair loop's descriptor arithmetic out of the uniform registers.
  if (__shfl_sync(0xffffffffu, ss.split_last, 0) == 0) return false;
  __threadfence();

  // The merged reference of each head this thread touches: its 16 O^T heads 8j + 2c + e and its two
  // softmax rows 16 warp + g + 8h; every part's contribution is scaled by 2^(its reference - merged).
  const auto reference_of = [&](int p, int head) { return __ldcg(item_ws + p * PART_FLOATS + PART_O_FLOATS + PART_STAT_FLOATS + head); };
  const auto weight = [](float part_reference, float merged) {
    return part_reference == -INFINITY ? 0.f : ex2(part_reference - merged);  // no valid slot in the part: 0
  };
  float head_reference[16], row_reference[2];
#pragma unroll
  for (int j = 0; j < 16; ++j) head_reference[j] = -INFINITY;
  row_reference[0] = row_reference[1] = -INFINITY;
  for (int p = 0; p < parts; ++p) {
#pragma unroll
    for (int j = 0; j < 16; ++j) head_reference[j] = fmaxf(head_reference[j], reference_of(p, frag_col(c, j / 2, j % 2)));
#pragma unroll
    for (int h = 0; h < 2; ++h) row_reference[h] = fmaxf(row_reference[h], reference_of(p, frag_row(warp, g, h)));
  }
  // Parts in order, this CTA's own part read back like the others: the sums are bitwise the same
  // whichever part finished last.
  for (int p = 0; p < parts; ++p) {
    const float* const part = item_ws + static_cast<int64_t>(p) * PART_FLOATS;
    float head_weight[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) head_weight[j] = weight(reference_of(p, frag_col(c, j / 2, j % 2)), head_reference[j]);
#pragma unroll
    for (int k = 0; k < 32; ++k) {
      // o[4jj + 2h + e] holds head 8jj + 2c + e (jj = k % 8): weights head_weight[2jj + e].
      const float4 v = __ldcg(reinterpret_cast<const float4*>(part) + k * NUM_CONSUMER_THREADS + t);
      const float in[4] = {v.x, v.y, v.z, v.w};
      float* const o = &st.o[k / 8][4 * (k % 8)];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float wq = head_weight[2 * (k % 8) + q % 2];
        o[q] = p == 0 ? in[q] * wq : fmaf(in[q], wq, o[q]);
      }
    }
    const float4 stats = __ldcg(reinterpret_cast<const float4*>(part + PART_O_FLOATS) + t);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float wr = weight(reference_of(p, frag_row(warp, g, h)), row_reference[h]);
      const float sum = h == 0 ? stats.x : stats.y, mx = h == 0 ? stats.z : stats.w;
      st.row_sum[h] = p == 0 ? sum * wr : fmaf(sum, wr, st.row_sum[h]);
      st.row_max[h] = p == 0 ? mx : max_nan(st.row_max[h], mx);
    }
  }
  st.reference[0] = row_reference[0];
  st.reference[1] = row_reference[1];
  return true;
}

}  // namespace sparse_mla::sm90::prefill
