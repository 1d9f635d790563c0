// The consumer warpgroups of the 64-row tiles (tiles/wide.cuh, tiles/grouped.cuh): Q.K^T, online
// softmax and P.V for each pair of gathered blocks.
//
// Per pair, consumer w (w = 0, 1):
//   S_w  = Q . K_w^T           64 heads x 64 slots of block w, e4m3 wgmma (SS), fp32 accumulators
//   P_w  = 2^(S_w - reference) -> e4m3 -> probs[pair % 2][w]; [kProbsReady, also: did a logit of
//          the pair exceed its row's reference by more than the slack?]
//   only if so: row maxima -> row_max[w]; [kRowMaxReady]; new references from max(row_max[0],
//          row_max[1]); P_w again; alpha -> alpha[w]; [kProbsReady]
//   O_w^T = O_w^T * alpha + V^T[256w .. 256w + 256) . [P_0 P_1]^T
// Software pipeline (iteration p; the tensor cores always have queued work except around waits):
//   rescale O (rare); Q.K^T(p + 1); A0 = V^T(block 0 of p); release block 0; P.V(p, block 0); wait
//   A1 = V^T(block 1 of p); release block 1; P.V(p, block 1)
//   softmax(p + 1) -> P(p + 1)         (while P.V(p, block 1) runs); wait; kProbsReady
// A block is released as soon as its rows are in registers, so the producer refills it early.
// What orders each shared buffer (a change to this order, or to the producer's, changes the
// happens-before model in tests/cpu/pair_loop_model.py in the same commit, and its tests must pass:
// test_model_matches_source.py compares the model with this file's statements):
// - probs[b][w]: written by consumer w in softmax(p) for b = p % 2, read by both consumers' P.V(p).
//   Its next writer, softmax(p + 2), runs after the kProbsReady of softmax(p + 1), which each
//   consumer reaches only after retiring its P.V(p) (block 0's before softmax(p + 1), block 1's
//   inside it, before the barrier).
// - KV stages and Q: cp.async writes that the producer waits for and fences for the async proxy
//   before arriving on kv_full / q_full (producer.cuh); released through kv_empty / q_empty by every
//   consumer thread once its Q.K^T and ldmatrix reads of them are done.
// Only P.V of block 0 and Q.K^T run together: ptxas frees wgmma operand registers only at a
// wait_group 0, and O (128) + A (2 x 32) + S (32) would not fit the 232-register budget.
// P.V is computed transposed (O^T = V^T . P^T) so that V needs no transpose in shared memory: the
// A operand V^T comes from registers, loaded from the gathered rows with ldmatrix.trans and two byte
// permutes, and the B operand is P as written (rows = heads, K-major). fp8 wgmma reads only K-major
// shared operands, so the usual O = P . V would need V^T stored in shared memory (a transpose pass of
// 64 KB of shared-memory traffic per block).
//
// Fragment bookkeeping (g = lane / 4, c = lane % 4, warp q of the warpgroup):
// - S accumulator s[4j + 2h + e]: head 16q + g + 8h, slot 8j + 2c + e.
// - ldmatrix.trans of 16-byte chunk ch of rows 32ks + lane gives x[m] = {row 8m + 2c: dims 2g, 2g+1;
//   row 8m + 2c + 1: dims 2g, 2g+1}; prmt(x[0], x[1], 0x6420) is the A register of M-row g (dim
//   16ch + 2g) over K positions 4c..4c+3 = rows {2c, 2c+1, 8+2c, 9+2c}; 0x7531 gives M-row g + 8
//   (dim 16ch + 2g + 1). So the K order of P.V is a fixed permutation of each 16 rows, and P is
//   stored in that order (softmax_to_probs).
// - O^T accumulator o[i][4j + 2h + e]: dim 256w + 64i + 16q + 2g + h, head 8j + 2c + e.
#pragma once

#include <cmath>
#include <cstdint>

#include <sparse_mla/params.cuh>
#include <sparse_mla/sm90/prefill/mma.cuh>
#include <sparse_mla/sm90/prefill/pipeline.cuh>
#include <sparse_mla/sm90/prefill/primitives.cuh>
#include <sparse_mla/sm90/prefill/scheduler.cuh>
#include <sparse_mla/sm90/prefill/swizzle.cuh>
#include <sparse_mla/sm90/prefill/tiles/grouped.cuh>
#include <sparse_mla/sm90/prefill/tiles/wide.cuh>
#include <sparse_mla/sm90/prefill/traits.cuh>

namespace sparse_mla::sm90::prefill {

template <int D_QK, Tile TILE, KvLayout LAYOUT>
__device__ __forceinline__ void issue_qk(const SharedStorage<D_QK, TILE, LAYOUT>& ss, int stage, int wg, float (&s)[32]) {
  constexpr int STEPS = D_QK / 32;
  // Step kk starts at column block kk / 2, byte (kk % 2) * 32 of every row; descriptors count 16 B.
  const uint32_t dq = desc_sw64_lo(smem_addr(ss.q));
  const uint32_t dk = desc_sw64_lo(smem_addr(ss.kv[stage][wg]));
  // The first step ignores the accumulators (scale-d 0), but the atom's asm reads them: giving them a
  // value here ends the live range of the previous logits, which would otherwise pin 32 registers.
#pragma unroll
  for (int j = 0; j < 32; ++j) s[j] = 0.f;
  cute::warpgroup_arrive();
#pragma unroll
  for (int kk = 0; kk < STEPS; ++kk) {
    const uint32_t step = static_cast<uint32_t>(((kk >> 1) * (B_TOPK * 64) + (kk & 1) * 32) >> 4);
    wgmma_ss(s, desc_sw64(dq + step), desc_sw64(dk + step), kk > 0);
  }
  cute::warpgroup_commit_batch();
}

// The A fragments of V^T for one block: [k-step][64-dim tile][register].
__device__ __forceinline__ void load_v_fragments(uint32_t tile, uint32_t lane_offset, uint32_t (&a)[2][4][4]) {
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t x[4];
      ldmatrix_x4_trans(tile + lane_offset + i * (B_TOPK * 64) + ks * 32 * 64, x);
      a[ks][i][0] = prmt(x[0], x[1], 0x6420);
      a[ks][i][1] = prmt(x[0], x[1], 0x7531);
      a[ks][i][2] = prmt(x[2], x[3], 0x6420);
      a[ks][i][3] = prmt(x[2], x[3], 0x7531);
    }
  }
}

// O^T += V^T . P^T for one block (8 wgmmas, one commit group); `probs` is the block's P tile.
__device__ __forceinline__ void issue_pv(float (&o)[4][32], const uint32_t (&a)[2][4][4], uint32_t probs) {
  const uint32_t dp = desc_sw64_lo(probs);
#pragma unroll
  for (int i = 0; i < 4; ++i) fence_operands(o[i]);
  cute::warpgroup_arrive();
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
#pragma unroll
    for (int i = 0; i < 4; ++i) wgmma_rs(o[i], a[ks][i], desc_sw64(dp + ((ks * 32) >> 4)));
  }
  cute::warpgroup_commit_batch();
}

// This thread's logits of one block and what it needs to turn them into P.
template <typename MaskType>
struct BlockLogits {
  using Mask = MaskType;
  const float (&s)[32];  // raw Q.K^T accumulators, see the fragment notes
  Mask mask;             // BlockMask, or RowMask in a token group
  float scale_log2;      // logit = s * scale_log2 (log2 units)

  __device__ __forceinline__ bool is_valid(int k) const { return mask.is_valid(k); }

  // P = 2^(logit - reference) as e4m3 into this thread's 4-byte groups of its P tile (rows
  // 16 warp + g + 8h, slots 16G + 4c .. + 3 for G < 4, in the P.V K order); returns the row sums of
  // the unrounded P.
  // One FMA per slot gives logit - reference with a single rounding. The max the reference comes
  // from is of rounded logits, which may lie half an ulp below the FMA's exact product: for
  // |reference| <= 2^22 that is at most 1/4, and P <= 2^(REFERENCE_SLACK + 1/4) stays in e4m3's
  // range. Beyond (absurd scales) P is taken from the rounded logits, as the max was.
  __device__ __forceinline__ void write_probs(bool all_valid, const float (&reference)[2], uint32_t probs, int swz,
                                              float (&psum)[2], float (&mloc)[2]) const {
    constexpr float FUSED_REFERENCE_LIMIT = 0x1p22f;
    const bool fused = fabsf(reference[0]) <= FUSED_REFERENCE_LIMIT && fabsf(reference[1]) <= FUSED_REFERENCE_LIMIT;
    if (all_valid) {
      if (fused) write_probs<true, true>(reference, probs, swz, psum, mloc);
      else write_probs<true, false>(reference, probs, swz, psum, mloc);
    } else {
      if (fused) write_probs<false, true>(reference, probs, swz, psum, mloc);
      else write_probs<false, false>(reference, probs, swz, psum, mloc);
    }
  }

  template <bool ALL_VALID, bool FUSED>
  __device__ __forceinline__ void write_probs(const float (&reference)[2], uint32_t probs, int swz, float (&psum)[2],
                                              float (&mloc)[2]) const {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float base = reference[h] == -INFINITY ? 0.f : reference[h];  // -inf: no valid slot yet
      const auto logit = [&](int k) { return ALL_VALID || is_valid(k) ? __fmul_rn(s[k], scale_log2) : -INFINITY; };
      const auto prob = [&](int k) {
        if (!ALL_VALID && !is_valid(k)) return 0.f;
        return ex2(FUSED ? fmaf(s[k], scale_log2, -base) : __fsub_rn(__fmul_rn(s[k], scale_log2), base));
      };
      psum[h] = 0.f;
      float m = -INFINITY;
#pragma unroll
      for (int grp = 0; grp < 4; ++grp) {
        const int k0 = 8 * grp + 2 * h, k2 = 8 * grp + 4 + 2 * h;
        const float p0 = prob(k0), p1 = prob(k0 + 1), p2 = prob(k2), p3 = prob(k2 + 1);
        psum[h] += (p0 + p1) + (p2 + p3);
        st_shared_u32(probs + 8 * h * 64 + ((grp ^ swz) << 4), to_e4m3x2(p0, p1) | (to_e4m3x2(p2, p3) << 16));
        // A tree per group: the chain to the row max is 6 deep, not 16. NaN-propagating, so that a
        // NaN logit makes max_logits NaN too (the reference moves only on a true comparison, never to NaN).
        m = max_nan(m, max_nan(max_nan(logit(k0), logit(k0 + 1)), max_nan(logit(k2), logit(k2 + 1))));
      }
      mloc[h] = m;
    }
  }
};

// BlockLogits of a block of paged rows (KvLayout::kPaged), each row j at its own scale sigma_j
// (gather.cuh, requantize_row): logit_j = s_j * scale_log2 * sigma_j, and the row's value vector is
// sigma_j times its e4m3 values, so P.V takes P_j * sigma_j. Both fold into one exponent: this writes
// P'_j = 2^(t_j - reference) with t_j = logit_j + log2(sigma_j), so that the references, the slack
// and the rescaling of O run on t unchanged (P' <= 2^slack as P is), while the row sums add
// P'_j / sigma_j = 2^(logit_j - reference), the softmax's denominator relative to the same
// reference, and the row maxima (max_logits) take the logits. With sigma_j in [2^-100, 2^100]
// (MIN_ROW_SCALE) every sum stays a normal float: P'_j / sigma_j <= 2^(8.25 + 100).
template <typename MaskType>
struct ScaledBlockLogits {
  using Mask = MaskType;
  const float (&s)[32];
  Mask mask;
  // Shared address of this thread's slots' row values (requantize_block, producer.cuh): float 16G + e
  // (+ 8) from it is slot 16G + 2c + e (+ 8) of the block's scale_log2 * sigma_j, then log2(sigma_j) and
  // 1 / sigma_j each LOG2_AT and INV_AT bytes further (PagedMembers, traits.cuh).
  uint32_t row_values;
  static constexpr uint32_t LOG2_AT = NUM_STAGES * 2 * B_TOPK * 4, INV_AT = 2 * LOG2_AT;

  __device__ __forceinline__ bool is_valid(int k) const { return mask.is_valid(k); }

  // As BlockLogits::write_probs, with P' and the sums above; mloc gets the max of t (for the
  // references), mlog the max of the logits.
  __device__ __forceinline__ void write_probs(bool all_valid, const float (&reference)[2], uint32_t probs, int swz,
                                              float (&psum)[2], float (&mloc)[2], float (&mlog)[2]) const {
    if (all_valid) write_probs<true>(reference, probs, swz, psum, mloc, mlog);
    else write_probs<false>(reference, probs, swz, psum, mloc, mlog);
  }

  template <bool ALL_VALID>
  __device__ __forceinline__ void write_probs(const float (&reference)[2], uint32_t probs, int swz, float (&psum)[2],
                                              float (&mloc)[2], float (&mlog)[2]) const {
    float base[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      base[h] = reference[h] == -INFINITY ? 0.f : reference[h];  // -inf: no valid slot yet
      psum[h] = 0.f;
      mloc[h] = mlog[h] = -INFINITY;
    }
#pragma unroll
    for (int grp = 0; grp < 4; ++grp) {
      // Slots 16G + 2c + e and 16G + 8 + 2c + e: s[8G + 2h + e] and s[8G + 4 + 2h + e] of both rows h.
      // The row values are loaded for each row h again: held across both, they spilled.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mul[4], lg[4], inv[4];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const uint32_t at = row_values + 4 * (16 * grp + 8 * half);
          const float2 m = ld_shared_f32x2(at), l = ld_shared_f32x2(at + LOG2_AT), i = ld_shared_f32x2(at + INV_AT);
          mul[2 * half] = m.x, mul[2 * half + 1] = m.y;
          lg[2 * half] = l.x, lg[2 * half + 1] = l.y;
          inv[2 * half] = i.x, inv[2 * half + 1] = i.y;
        }
        const int k0 = 8 * grp + 2 * h, k2 = 8 * grp + 4 + 2 * h;
        const int k[4] = {k0, k0 + 1, k2, k2 + 1};
        float p[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const bool ok = ALL_VALID || is_valid(k[i]);
          const float logit = ok ? __fmul_rn(s[k[i]], mul[i]) : -INFINITY;
          const float t = ok ? logit + lg[i] : -INFINITY;  // a masked row's scale may be NaN (token groups)
          mlog[h] = max_nan(mlog[h], logit);
          mloc[h] = max_nan(mloc[h], t);
          p[i] = ok ? ex2(t - base[h]) : 0.f;
          // Not 0 * inv for a masked slot: in a token group the row may be another token's, its
          // scale NaN (its V's NaNs are cleared, clear_v_nans; its inv is not).
          if (ok) psum[h] = fmaf(p[i], inv[i], psum[h]);
        }
        st_shared_u32(probs + 8 * h * 64 + ((grp ^ swz) << 4), to_e4m3x2(p[0], p[1]) | (to_e4m3x2(p[2], p[3]) << 16));
      }
    }
  }
};

// Online softmax of one pair: logits s and valid bits of this consumer's block of the pair (stage
// `stage` of the ring; in a token group, row_mask: each row's token's) -> P in probs[buf][wg], running
// statistics in st. Returns whether O must be rescaled (by alpha[wg]) before the pair's P.V.
// Fast path: P is written against the current references straight away, without exchanging row
// maxima between the consumers; one barrier then tells whether any logit of the pair exceeded its
// row's reference by more than the slack. Only then (the first pair of a unit, and rarely after)
// the exact path exchanges the maxima, moves the references and writes P again.
// (`wg` is the caller's: recomputed here, the valid bits' load would wait for its shuffle. The rest
// comes from the thread index without consumer_thread()'s shuffles, whose latency the first P
// addresses waited for, at every tile. Passed from the pair loop instead, it is
// recomputed anyway, no register being left to hold it, and the grouped tile spills.)
template <Tile TILE, int D_QK, KvLayout LAYOUT>
__device__ __forceinline__ bool softmax_to_probs(SharedStorage<D_QK, TILE, LAYOUT>& ss, const float (&s)[32], int stage, int wg,
                                                 int buf, float scale_log2, ConsumerState& st, RowMask row_mask) {
  const ConsumerThread thread = consumer_thread_of_index();
  if constexpr (LAYOUT == KvLayout::kPaged) {
    const uint32_t row_values = smem_addr(&ss.row_logit_scale[stage][wg][2 * thread.c]);
    if constexpr (TileTraits<TILE>::kGroups) {
      return softmax_to_probs(ss, ScaledBlockLogits<RowMask>{s, row_mask, row_values}, row_mask.valid == ~0u, stage,
                              buf, thread, st);
    } else {
      const uint64_t valid_bits = ss.valid[stage][wg];
      return softmax_to_probs(ss, ScaledBlockLogits<BlockMask>{s, {valid_bits >> (2 * thread.c)}, row_values},
                              valid_bits == ~0ull, stage, buf, thread, st);
    }
  } else if constexpr (TileTraits<TILE>::kGroups) {
    return softmax_to_probs(ss, BlockLogits<RowMask>{s, row_mask, scale_log2}, row_mask.valid == ~0u, stage, buf,
                            thread, st);
  } else {
    const uint64_t valid_bits = ss.valid[stage][wg];
    return softmax_to_probs(ss, BlockLogits<BlockMask>{s, {valid_bits >> (2 * thread.c)}, scale_log2},
                            valid_bits == ~0ull, stage, buf, thread, st);
  }
}

// The same from the block's logits and whether all of this thread's slots are valid (the common case:
// no masking).
template <int D_QK, Tile TILE, typename Logits, KvLayout LAYOUT>
__device__ __forceinline__ bool softmax_to_probs(SharedStorage<D_QK, TILE, LAYOUT>& ss, const Logits& logits, bool all_valid,
                                                 int stage, int buf, const ConsumerThread& thread, ConsumerState& st) {
  using Mask = typename Logits::Mask;
  constexpr bool SCALED = LAYOUT == KvLayout::kPaged;
  const int wg = thread.wg, warp = thread.warp, g = thread.g, c = thread.c;
  const uint32_t probs = smem_addr(ss.probs[buf][wg]) + frag_row(warp, g, 0) * 64 + 4 * c;
  const int swz = sw64_xor(g);  // the same for rows frag_row(warp, g, h) of both h

  // P against the current references, and in the same pass the max of this thread's (rounded) logits.
  float mloc[2], psum[2];
  [[maybe_unused]] float mlog[2];  // scaled rows: the max of the logits, mloc that of t
  if constexpr (SCALED) logits.write_probs(all_valid, st.reference, probs, swz, psum, mloc, mlog);
  else logits.write_probs(all_valid, st.reference, probs, swz, psum, mloc);
  cutlass::arch::fence_view_async_shared();  // P: generic stores -> wgmma reads
  // This consumer's P.V of the previous pair's block 1 (the wgmma group in flight) reads
  // probs[buf ^ 1][1], which consumer 1 overwrites with the P of the pair after this one as soon as
  // both have passed the barrier below: retire it before arriving (the barrier then orders the
  // tensor cores' reads before those stores). Block 0's P.V was retired before this softmax.
  cute::warpgroup_wait<0>();
  bool moved = false, nan = false;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if constexpr (SCALED) st.row_max[h] = max_nan(st.row_max[h], mlog[h]);
    else st.row_max[h] = max_nan(st.row_max[h], mloc[h]);
    // A difference, not mloc > reference + slack: the sum rounds to the reference itself once
    // |reference| >= 2^27. False while mloc is -inf or NaN.
    moved = moved || mloc[h] - st.reference[h] > REFERENCE_SLACK;
    nan = nan || isnan(mloc[h]);
  }
  // A NaN in a gathered row's V columns (K's first D_V) is NaN in its logit of every row of the tile,
  // and the row is in the block because some row's token selected it: that row's max is NaN. So a
  // pair whose rows' maxima are all numbers has no NaN in V; one that may takes the exact path, where
  // it is cleared.
  if constexpr (Mask::kSharedByTokens) moved = moved || nan;
  if (!named_barrier_sync_or<kProbsReady, NUM_CONSUMER_THREADS>(moved)) {
#pragma unroll
    for (int h = 0; h < 2; ++h) st.row_sum[h] += psum[h];
    return false;
  }

  // The exact path: the pair's row maxima, from the 4 threads of a row and both consumers.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mloc[h] = quad_max(mloc[h]);
    if (c == 0) ss.row_max[wg][frag_row(warp, g, h)] = mloc[h];
  }
  if constexpr (Mask::kSharedByTokens) {
    // The V columns' NaNs cleared before the kProbsReady below, after which both consumers read the
    // block's V. The rows that selected a NaN row keep their NaN logit, so their P, O, max and lse are
    // NaN as without the clearing; for every other row the row's P is 0 and now multiplies a number.
    if (named_barrier_sync_or<kRowMaxReady, NUM_CONSUMER_THREADS>(nan)) clear_v_nans(ss, stage, wg);
  } else {
    named_barrier_sync<kRowMaxReady, NUM_CONSUMER_THREADS>();
  }
  // Both consumers derive the same reference and alpha from the same two maxima.
  bool rescale = false;
  float alpha[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float mx = max_nan(mloc[h], ss.row_max[1 - wg][frag_row(warp, g, h)]);
    alpha[h] = 1.f;
    if (mx - st.reference[h] > REFERENCE_SLACK) {  // false while mx is -inf or NaN
      alpha[h] = ex2(st.reference[h] - mx);            // 0 from -inf: O and the sum are still 0
      rescale = rescale || st.reference[h] != -INFINITY;
      st.reference[h] = mx;
    }
  }
  float unused[2];
  if constexpr (SCALED) {
    float unused_logits[2];
    logits.write_probs(all_valid, st.reference, probs, swz, psum, unused, unused_logits);
  } else {
    logits.write_probs(all_valid, st.reference, probs, swz, psum, unused);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    st.row_sum[h] = st.row_sum[h] * alpha[h] + psum[h];
    if (c == 0) ss.alpha[wg][frag_row(warp, g, h)] = alpha[h];
  }
  cutlass::arch::fence_view_async_shared();  // P: generic stores -> wgmma reads
  return named_barrier_sync_or<kProbsReady, NUM_CONSUMER_THREADS>(rescale);
}

// One work unit's pairs. `pair_base` counts the pairs of the CTA's earlier units (the KvStage of each
// pair), `unit_count` the units (the QStage of q_full).
template <int D_QK, int TOPK, Tile TILE, KvLayout LAYOUT>
__device__ __forceinline__ void run_consumer_mainloop(SharedStorage<D_QK, TILE, LAYOUT>& ss, float scale_log2, int n_pairs,
                                                      int pair_base, int unit_count, ConsumerState& st) {
  const auto [wg, warp, lane, g, c] = consumer_thread();
  constexpr bool ONE_BLOCK = one_block_tile<TOPK, TILE>();  // block 1 of every pair is empty and never read

#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int k = 0; k < 32; ++k) st.o[i][k] = 0.f;
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    st.reference[h] = -INFINITY;
    st.row_max[h] = -INFINITY;
    st.row_sum[h] = 0.f;
  }
  mbarrier_wait(&ss.q_full, QStage(unit_count).phase);
  if (n_pairs == 0) {
    mbarrier_arrive(&ss.q_empty);
    return;
  }

  // This thread's ldmatrix row (slot 32ks + lane) and 16-byte chunk (16wg + 4i + warp) of a KV tile.
  // It is swizzled_offset(lane, 16wg + warp, B_TOPK), written out: through the function the pair loop
  // compiles to different code.
  const uint32_t v_lane_offset = static_cast<uint32_t>(4 * wg * (B_TOPK * 64) + lane * 64 + ((warp ^ sw64_xor(lane)) << 4));

  float s[32];
  const KvStage first(pair_base);  // the unit's first pair
  mbarrier_wait(&ss.kv_full[first.index][wg], first.phase);
  // In a one-block tile consumer 1 issues no Q.K^T: block 1's valid bits are all 0, so the softmax
  // masks each of its logits before using it, whatever s holds.
  RowMask row_mask{};  // the grouped tile's, of the pair whose softmax comes next
  [[maybe_unused]] RowValidWords row_words{};
  if constexpr (TileTraits<TILE>::kGroups) row_words = grouped_row_words(ss, first.index, wg);
  if (!ONE_BLOCK || wg == 0) issue_qk(ss, first.index, wg, s);
  if constexpr (TileTraits<TILE>::kGroups) row_mask = row_words.mask();
  cute::warpgroup_wait<0>();
  fence_operands(s);
  // Q is released as soon as the unit's last Q.K^T is retired (here, or in the loop after block 0's
  // P.V), half a pair before the last pair's P.V begins, so that the producer loads the next unit's
  // Q earlier (docs/lab.md, Experiments 99 and 124).
  if (n_pairs == 1) mbarrier_arrive(&ss.q_empty);
  bool rescale = softmax_to_probs<TILE>(ss, s, first.index, wg, 0, scale_log2, st, row_mask);

  for (int pair = 0; pair < n_pairs; ++pair) {
    const KvStage stage(pair_base + pair);
    const int buf = pair % 2;
    const bool has_next = pair + 1 < n_pairs;

    if (rescale) {  // P.V of the previous pair is complete: O may be rewritten
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float2 a = *reinterpret_cast<const float2*>(&ss.alpha[wg][frag_col(c, j, 0)]);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          st.o[i][4 * j + 0] *= a.x;
          st.o[i][4 * j + 1] *= a.y;
          st.o[i][4 * j + 2] *= a.x;
          st.o[i][4 * j + 3] *= a.y;
        }
      }
    }
    // The next pair's Q.K^T first: the tensor cores run it while V of block 0 is loaded.
    if (has_next) {
      mbarrier_wait(&ss.kv_full[stage.next().index][wg], stage.next().phase);
      if constexpr (TileTraits<TILE>::kGroups) row_words = grouped_row_words(ss, stage.next().index, wg);
      if (!ONE_BLOCK || wg == 0) issue_qk(ss, stage.next().index, wg, s);
      if constexpr (TileTraits<TILE>::kGroups) row_mask = row_words.mask();
    }
    // The other block's rows were waited for by the other consumer; wait too (it has completed), so
    // that this thread's ldmatrix reads are ordered after the copies.
    mbarrier_wait(&ss.kv_full[stage.index][1 - wg], stage.phase);
    {
      uint32_t a[2][4][4];
      load_v_fragments(smem_addr(ss.kv[stage.index][0]), v_lane_offset, a);
      // Block 0's Q.K^T finished in the previous iteration and its V rows are in registers now.
      // Every thread arrives, releasing its own reads (ldmatrix, valid bits) to the producer.
      mbarrier_arrive(&ss.kv_empty[stage.index][0]);
      issue_pv(st.o, a, smem_addr(ss.probs[buf][0]));
      cute::warpgroup_wait<0>();
      fence_operands(s);
    }
    // That wait retired the next pair's Q.K^T: where it was the unit's last, Q may be replaced.
    if (pair + 2 == n_pairs) mbarrier_arrive(&ss.q_empty);
    if constexpr (ONE_BLOCK) {
      mbarrier_arrive(&ss.kv_empty[stage.index][1]);
    } else {
      uint32_t a[2][4][4];
      load_v_fragments(smem_addr(ss.kv[stage.index][1]), v_lane_offset, a);
      mbarrier_arrive(&ss.kv_empty[stage.index][1]);  // as block 0 above
      issue_pv(st.o, a, smem_addr(ss.probs[buf][1]));
    }
    if (has_next) rescale = softmax_to_probs<TILE>(ss, s, stage.next().index, wg, buf ^ 1, scale_log2, st, row_mask);
    cute::warpgroup_wait<0>();
#pragma unroll
    for (int i = 0; i < 4; ++i) fence_operands(st.o[i]);
  }
}

}  // namespace sparse_mla::sm90::prefill
