// The narrow-head tiles (Tile::kNarrow, kNarrow16, kNarrow8): the consumers' pair loop and epilogue for
// h_q <= NARROW_HEADS (tensor-parallel ranks), with the logits computed transposed so that the tile's
// N, not its M, spans the heads.
//
// Per pair, consumer w (w = 0, 1), as in consumer.cuh but transposed:
//   S_w^T = K_w . Q^T          64 slots x NH heads of block w, e4m3 wgmma m64nNHk32 (SS), A = the
//                              block's rows, B = Q's first NH rows
//   P_w^T = 2^(S_w^T - reference[head]) -> e4m3 -> probs[pair % 2][w], stored as the wide tile
//          stores P (rows = heads, slots in the P.V K order), so P.V reads it the same way
//   O_w^T = O_w^T * alpha + V^T[256w .. 256w + 256) . [P_0 P_1]^T    m64nNHk32 (RS), V^T loaded into
//          registers right after the pair's softmax, when the pair goes back to the producer
// A thread's logits are 2 slots x NH / 4 heads; its heads (8j + 2c + e) are also its O^T columns, so the
// references, row sums and rescale factors of its heads live in its registers: alpha needs no shared
// memory. The maxima and sums of a head are reduced over the 8 threads of a column (shuffles over g)
// and, where needed, over the 4 warps and both consumers through shared memory.
//
// Fragments (g = lane / 4, c = lane % 4, warp q):
// - S^T accumulator s[4j + 2h + e]: slot 16q + g + 8h, head 8j + 2c + e (j < NH / 8).
// - O^T accumulator o[i][4j + 2h + e]: dim 256w + 64i + 16q + 2g + h, head 8j + 2c + e.
// - P in the P.V K order: slot 16G + r sits at K position 4(r' >> 1) + (r' & 1) + 2 (r >= 8), r' = r mod 8:
//   a thread's slots g and g + 8 of warp q are bytes 4(g >> 1) + (g & 1) and + 2 of chunk q; the
//   threads g and g ^ 1 (lanes l and l ^ 4) hold the 4 bytes of one group and swap half of them.
// No tail split: a narrow work unit is a whole item.
#pragma once

#include <cmath>
#include <cstdint>

#include <cuda_bf16.h>

#include <sparse_mla/params.cuh>
#include <sparse_mla/sm90/prefill/consumer.cuh>
#include <sparse_mla/sm90/prefill/finalize.cuh>
#include <sparse_mla/sm90/prefill/mma.cuh>
#include <sparse_mla/sm90/prefill/pipeline.cuh>
#include <sparse_mla/sm90/prefill/primitives.cuh>
#include <sparse_mla/sm90/prefill/scheduler.cuh>
#include <sparse_mla/sm90/prefill/swizzle.cuh>
#include <sparse_mla/sm90/prefill/traits.cuh>

namespace sparse_mla::sm90::prefill {

// The narrow tiles' own shared memory (SharedStorage, traits.cuh), sized for the widest of them.
template <typename Base>
struct NarrowSharedMembers : Base {
  float head_max[2][4][NARROW_HEADS];  // per consumer and warp, a head's max (exact path, epilogue)
  float head_sum[2][4][NARROW_HEADS];  // epilogue: per consumer and warp, a head's sum
  float head_reference[NARROW_HEADS];  // epilogue: each head's reference
};

// The narrow tiles' policy: NH heads of one token, no tail split, the copies arriving by themselves.
template <int NH>
struct NarrowTileTraits {
  static constexpr int kHeads = NH;
  static constexpr bool kNarrow = true;
  static constexpr bool kGroups = false;
  static constexpr bool kSplits = false;
  static constexpr bool kCopiesArrive = true;
  template <typename Base>
  using SharedMembers = NarrowSharedMembers<Base>;
};
template <>
struct TileTraits<Tile::kNarrow> : NarrowTileTraits<NARROW_HEADS> {};
template <>
struct TileTraits<Tile::kNarrow16> : NarrowTileTraits<NARROW_16_HEADS> {};
template <>
struct TileTraits<Tile::kNarrow8> : NarrowTileTraits<NARROW_8_HEADS> {};

// NH, the tile's heads (the N of Q.K^T and of P.V): 32 (Tile::kNarrow), 16 (Tile::kNarrow16) for
// h_q <= 16 or 8 (Tile::kNarrow8) for h_q <= 8, each halving the tensor work and the exponentials
// again; a thread's accumulator rows hold NH / 8 column groups j, NH / 2 registers per m64nNH tile.
template <int NH>
struct NarrowState {
  static constexpr int J = NH / 8, REGS = NH / 2;
  float o[4][REGS];         // O^T, see the fragment notes
  float reference[2 * J];   // per head 8j + 2c + e of this thread, at 2j + e (log2 units)
  float row_max[2 * J];     // running max of this thread's logits of the head
  float row_sum[2 * J];     // this thread's share of sum(P) relative to `reference`
  float alpha[2 * J];       // the pair's rescale factor of O per head
};

// S^T = K . Q^T for this consumer's block: the wide tile's descriptors with the operands swapped.
template <int D_QK, Tile TILE, int REGS, KvLayout LAYOUT>
__device__ __forceinline__ void issue_qk_narrow(const SharedStorage<D_QK, TILE, LAYOUT>& ss, int stage, int wg, float (&s)[REGS]) {
  constexpr int STEPS = D_QK / 32;
  const uint32_t dq = desc_sw64_lo(smem_addr(ss.q));
  const uint32_t dk = desc_sw64_lo(smem_addr(ss.kv[stage][wg]));
#pragma unroll
  for (int j = 0; j < REGS; ++j) s[j] = 0.f;
  cute::warpgroup_arrive();
#pragma unroll
  for (int kk = 0; kk < STEPS; ++kk) {
    const uint32_t step = static_cast<uint32_t>(((kk >> 1) * (B_TOPK * 64) + (kk & 1) * 32) >> 4);
    wgmma_ss(s, desc_sw64(dk + step), desc_sw64(dq + step), kk > 0);
  }
  cute::warpgroup_commit_batch();
}

// O^T += V^T . P^T for the pair's blocks (8 wgmmas each, one commit group): both at once, so that
// no instruction touches O between them (a fence on O while block 0's P.V runs would serialize
// the wgmmas).
template <int BLOCKS, int REGS>
__device__ __forceinline__ void issue_pv_narrow(float (&o)[4][REGS], const uint32_t (&a)[2][2][4][4], uint32_t probs0,
                                                uint32_t probs1) {
#pragma unroll
  for (int i = 0; i < 4; ++i) fence_operands(o[i]);
  cute::warpgroup_arrive();
#pragma unroll
  for (int b = 0; b < BLOCKS; ++b) {
    const uint32_t dp = desc_sw64_lo(b == 0 ? probs0 : probs1);
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
#pragma unroll
      for (int i = 0; i < 4; ++i) wgmma_rs(o[i], a[b][ks][i], desc_sw64(dp + ((ks * 32) >> 4)));
    }
  }
  cute::warpgroup_commit_batch();
}

// The max of x over the 8 threads of an accumulator column (lanes c, c + 4, .., c + 28), in each of them.
__device__ __forceinline__ float column_max(float x) {
  x = max_nan(x, __shfl_xor_sync(0xffffffffu, x, 4));
  x = max_nan(x, __shfl_xor_sync(0xffffffffu, x, 8));
  return max_nan(x, __shfl_xor_sync(0xffffffffu, x, 16));
}
__device__ __forceinline__ float column_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 4);
  x += __shfl_xor_sync(0xffffffffu, x, 8);
  return x + __shfl_xor_sync(0xffffffffu, x, 16);
}

// This thread's P of column group j (pk[e]: e4m3 of slots g (low byte) and g + 8 (high byte) for head
// 8j + 2c + e) into the P tile: even g keeps head e = 0 and gives e = 1 to its partner g + 1, which keeps
// e = 1; the group's bytes, in K order: even g's slot g, odd's, even's g + 8, odd's.
__device__ __forceinline__ void store_probs_group(const uint32_t (&pk)[2], uint32_t probs_row0, int c, int j, bool odd) {
  const uint32_t keep = odd ? pk[1] : pk[0];
  const uint32_t recv = __shfl_xor_sync(0xffffffffu, odd ? pk[0] : pk[1], 4);
  const uint32_t group = odd ? prmt(recv, keep, 0x5140) : prmt(keep, recv, 0x5140);
  st_shared_u32(probs_row0 + frag_col(c, j, odd ? 1 : 0) * 64, group);
}

// P^T of this thread's 2 slots x NH / 4 heads against `reference`, into the P tile (see the fragment
// notes); returns per head the sum of the unrounded P and the max of the (rounded) logits.
// `fused` is warp-uniform (the P exchange below is a shuffle).
template <bool FUSED, int NH_J>
__device__ __forceinline__ void write_probs_narrow(const float (&s)[4 * NH_J], uint32_t valid2, float scale_log2,
                                                   const float (&reference)[2 * NH_J], uint32_t probs_row0,
                                                   float (&psum)[2 * NH_J], float (&mloc)[2 * NH_J]) {
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const bool odd = (g & 1) != 0;
#pragma unroll
  for (int j = 0; j < NH_J; ++j) {
    uint32_t pk[2];  // [e]: e4m3 of slots g (low byte) and g + 8 (high byte) for head 8j + 2c + e
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int hh = 2 * j + e;
      const float base = reference[hh] == -INFINITY ? 0.f : reference[hh];
      float p[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float v = s[4 * j + 2 * h + e];
        const bool ok = ((valid2 >> h) & 1u) != 0;
        p[h] = ok ? ex2(FUSED ? fmaf(v, scale_log2, -base) : __fsub_rn(__fmul_rn(v, scale_log2), base)) : 0.f;
      }
      const float l0 = ((valid2 >> 0) & 1u) ? __fmul_rn(s[4 * j + e], scale_log2) : -INFINITY;
      const float l1 = ((valid2 >> 1) & 1u) ? __fmul_rn(s[4 * j + 2 + e], scale_log2) : -INFINITY;
      psum[hh] = p[0] + p[1];
      mloc[hh] = max_nan(l0, l1);
      pk[e] = to_e4m3x2(p[0], p[1]);
    }
    store_probs_group(pk, probs_row0, c, j, odd);
  }
}

// write_probs_narrow over paged rows (consumer.cuh's ScaledBlockLogits, transposed): this thread's 2
// slots h at their rows' logit multiplier mul[h] (scale_log2 * sigma), log2 sigma lg[h] and 1 / sigma
// inv[h]; P' = 2^(logit + lg - reference), the sums add P' / sigma, mloc gets the max of logit + lg
// and mlog that of the logits.
template <int NH_J>
__device__ __forceinline__ void write_probs_narrow_scaled(const float (&s)[4 * NH_J], uint32_t valid2,
                                                          const float (&mul)[2], const float (&lg)[2],
                                                          const float (&inv)[2], const float (&reference)[2 * NH_J],
                                                          uint32_t probs_row0, float (&psum)[2 * NH_J],
                                                          float (&mloc)[2 * NH_J], float (&mlog)[2 * NH_J]) {
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const bool odd = (g & 1) != 0;
#pragma unroll
  for (int j = 0; j < NH_J; ++j) {
    uint32_t pk[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int hh = 2 * j + e;
      const float base = reference[hh] == -INFINITY ? 0.f : reference[hh];
      float p[2], logit[2], t[2];
      psum[hh] = 0.f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const bool ok = ((valid2 >> h) & 1u) != 0;
        logit[h] = ok ? __fmul_rn(s[4 * j + 2 * h + e], mul[h]) : -INFINITY;
        t[h] = ok ? logit[h] + lg[h] : -INFINITY;
        p[h] = ok ? ex2(t[h] - base) : 0.f;
        if (ok) psum[hh] = fmaf(p[h], inv[h], psum[hh]);
      }
      mloc[hh] = max_nan(t[0], t[1]);
      mlog[hh] = max_nan(logit[0], logit[1]);
      pk[e] = to_e4m3x2(p[0], p[1]);
    }
    store_probs_group(pk, probs_row0, c, j, odd);
  }
}

// Online softmax of one pair, transposed (consumer.cuh's softmax_to_probs, per head column). `stage`:
// the pair's KV stage (paged rows: their row values).
template <int D_QK, Tile TILE, int NH, KvLayout LAYOUT>
__device__ __forceinline__ bool softmax_narrow(SharedStorage<D_QK, TILE, LAYOUT>& ss, const float (&s)[NH / 2], uint64_t valid_bits,
                                               int buf, float scale_log2, NarrowState<NH>& st,
                                               [[maybe_unused]] int stage) {
  constexpr int NH_J = NarrowState<NH>::J;
  constexpr bool SCALED = LAYOUT == KvLayout::kPaged;
  const auto [wg, warp, lane, g, c] = consumer_thread_of_index();  // no shuffles: consumer.cuh's softmax_to_probs
  const uint32_t valid2 = static_cast<uint32_t>((valid_bits >> (16 * warp + g)) & 1u) |
                          (static_cast<uint32_t>((valid_bits >> (16 * warp + g + 8)) & 1u) << 1);
  // Byte 4(g >> 1) of chunk `warp` (swizzled by the head row: (head >> 1) & 3 = c for every head of
  // this thread) of row 0; write_probs_narrow adds the head's row.
  const uint32_t probs_row0 = smem_addr(ss.probs[buf][wg]) + ((warp ^ c) << 4) + 4 * (g >> 1);
  bool fused = true;
#pragma unroll
  for (int hh = 0; hh < 2 * NH_J; ++hh) fused = fused && fabsf(st.reference[hh]) <= 0x1p22f;
  fused = __all_sync(0xffffffffu, fused);

  float mloc[2 * NH_J], psum[2 * NH_J];
  [[maybe_unused]] float mlog[2 * NH_J], mul[2], lg[2], inv[2];  // paged rows (write_probs_narrow_scaled)
  if constexpr (SCALED) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int slot = 16 * warp + g + 8 * h;
      mul[h] = ss.row_logit_scale[stage][wg][slot];
      lg[h] = ss.row_scale_log2[stage][wg][slot];
      inv[h] = ss.row_scale_inv[stage][wg][slot];
    }
    write_probs_narrow_scaled<NH_J>(s, valid2, mul, lg, inv, st.reference, probs_row0, psum, mloc, mlog);
  } else {
    if (fused) write_probs_narrow<true, NH_J>(s, valid2, scale_log2, st.reference, probs_row0, psum, mloc);
    else write_probs_narrow<false, NH_J>(s, valid2, scale_log2, st.reference, probs_row0, psum, mloc);
  }
  cutlass::arch::fence_view_async_shared();  // P: generic stores -> wgmma reads
  cute::warpgroup_wait<0>();  // this consumer's P.V of the previous pair's block 1: consumer.cuh
  bool moved = false;
#pragma unroll
  for (int hh = 0; hh < 2 * NH_J; ++hh) {
    if constexpr (SCALED) st.row_max[hh] = max_nan(st.row_max[hh], mlog[hh]);
    else st.row_max[hh] = max_nan(st.row_max[hh], mloc[hh]);
    moved = moved || mloc[hh] - st.reference[hh] > REFERENCE_SLACK;
  }
  if (!named_barrier_sync_or<kProbsReady, NUM_CONSUMER_THREADS>(moved)) {
#pragma unroll
    for (int hh = 0; hh < 2 * NH_J; ++hh) st.row_sum[hh] += psum[hh];
    return false;
  }

  // The exact path: each head's max over the 8 threads of its column, the 4 warps and both consumers.
#pragma unroll
  for (int hh = 0; hh < 2 * NH_J; ++hh) {
    mloc[hh] = column_max(mloc[hh]);
    if (g == 0) ss.head_max[wg][warp][frag_col(c, hh / 2, hh % 2)] = mloc[hh];
  }
  named_barrier_sync<kRowMaxReady, NUM_CONSUMER_THREADS>();
  bool rescale = false;
#pragma unroll
  for (int hh = 0; hh < 2 * NH_J; ++hh) {
    const int head = frag_col(c, hh / 2, hh % 2);
    float mx = ss.head_max[0][0][head];
#pragma unroll
    for (int k = 1; k < 8; ++k) mx = max_nan(mx, ss.head_max[k / 4][k % 4][head]);
    st.alpha[hh] = 1.f;
    if (mx - st.reference[hh] > REFERENCE_SLACK) {
      st.alpha[hh] = ex2(st.reference[hh] - mx);
      rescale = rescale || st.reference[hh] != -INFINITY;
      st.reference[hh] = mx;
    }
  }
  fused = true;
#pragma unroll
  for (int hh = 0; hh < 2 * NH_J; ++hh) fused = fused && fabsf(st.reference[hh]) <= 0x1p22f;
  fused = __all_sync(0xffffffffu, fused);
  float unused[2 * NH_J];
  if constexpr (SCALED) {
    float unused_logits[2 * NH_J];
    write_probs_narrow_scaled<NH_J>(s, valid2, mul, lg, inv, st.reference, probs_row0, psum, unused, unused_logits);
  } else {
    if (fused) write_probs_narrow<true, NH_J>(s, valid2, scale_log2, st.reference, probs_row0, psum, unused);
    else write_probs_narrow<false, NH_J>(s, valid2, scale_log2, st.reference, probs_row0, psum, unused);
  }
#pragma unroll
  for (int hh = 0; hh < 2 * NH_J; ++hh) st.row_sum[hh] = st.row_sum[hh] * st.alpha[hh] + psum[hh];
  cutlass::arch::fence_view_async_shared();
  return named_barrier_sync_or<kProbsReady, NUM_CONSUMER_THREADS>(rescale);
}

// One work unit's pairs with the narrow tile: the wide tile's pair loop (consumer.cuh), but a pair's
// V rows go into registers, and the pair back to the producer, as soon as its softmax is done:
//   QK(p + 1); P.V(p, block 0); P.V(p, block 1)   (V(p) from registers); wait for QK(p + 1)
//   softmax(p + 1)                                 (while both P.V run)
//   A = V^T(both blocks of p + 1); release pair p + 1
// The wide tile releases pair p only after it issued QK(p + 1), which waits for pair p + 1's rows,
// so the producer can refill a stage only once the next pair landed: one pair in flight. Here a
// pair's release waits for nothing the producer sends later, and the producer, whose copies arrive
// on kv_full by themselves (copies_arrive, traits.cuh: so each consumer fences after its wait),
// refills a stage as soon as it is released: two pairs in flight. It fits because the narrow O^T
// is half the wide one: O^T 64 + both blocks' V^T 64 + S^T 16 registers (NH 16: 32 + 64 + 8).
// A change to this order changes the happens-before model (NARROW_ORDER) in tests/cpu/pair_loop_model.py in the same commit
// (tests/cpu/test_model_matches_source.py compares the two).
template <int D_QK, int TOPK, Tile TILE, int NH, KvLayout LAYOUT>
__device__ __forceinline__ void run_narrow_mainloop(SharedStorage<D_QK, TILE, LAYOUT>& ss, float scale_log2, int n_pairs,
                                                    int pair_base, int unit_count, NarrowState<NH>& st) {
  constexpr int NH_J = NarrowState<NH>::J, NH_REGS = NarrowState<NH>::REGS;
  const auto [wg, warp, lane, g, c] = consumer_thread();
  constexpr bool ONE_BLOCK = one_block_tile<TOPK, Tile::kNarrow>();
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int k = 0; k < NH_REGS; ++k) st.o[i][k] = 0.f;
  }
#pragma unroll
  for (int hh = 0; hh < 2 * NH_J; ++hh) {
    st.reference[hh] = -INFINITY;
    st.row_max[hh] = -INFINITY;
    st.row_sum[hh] = 0.f;
    st.alpha[hh] = 1.f;
  }
  mbarrier_wait(&ss.q_full, QStage(unit_count).phase);
  if (n_pairs == 0) {
    mbarrier_arrive(&ss.q_empty);
    return;
  }
  const uint32_t v_lane_offset = static_cast<uint32_t>(4 * wg * (B_TOPK * 64) + lane * 64 + ((warp ^ sw64_xor(lane)) << 4));
  uint32_t a[2][2][4][4];  // V^T fragments of the pair whose P.V comes next, [block]
  // The pair's V rows into registers, then the pair back to the producer. Its Q.K^T is complete (its
  // softmax took the logits); the other block's rows were waited for by the other consumer: wait too,
  // so that this thread's ldmatrix reads are ordered after the copies. Every thread arrives,
  // releasing its own reads (ldmatrix, valid bits).
  const int other_block = 1 - wg;  // a lambda may not capture a structured binding before C++20
  const auto take_v = [&](const KvStage& stage) {
    mbarrier_wait(&ss.kv_full[stage.index][other_block], stage.phase);
    load_v_fragments(smem_addr(ss.kv[stage.index][0]), v_lane_offset, a[0]);
    mbarrier_arrive(&ss.kv_empty[stage.index][0]);
    if (!ONE_BLOCK) load_v_fragments(smem_addr(ss.kv[stage.index][1]), v_lane_offset, a[1]);
    mbarrier_arrive(&ss.kv_empty[stage.index][1]);
  };

  float s[NH_REGS];
  const KvStage first(pair_base);
  mbarrier_wait(&ss.kv_full[first.index][wg], first.phase);
  cutlass::arch::fence_view_async_shared();  // the copies (and Q) landed: generic writes -> wgmma reads
  if (!ONE_BLOCK || wg == 0) issue_qk_narrow(ss, first.index, wg, s);
  cute::warpgroup_wait<0>();
  fence_operands(s);
  bool rescale = softmax_narrow(ss, s, ss.valid[first.index][wg], 0, scale_log2, st, first.index);
  take_v(first);

  const auto rescale_o = [&] {  // alpha of this thread's own heads: no shared memory
#pragma unroll
    for (int j = 0; j < NH_J; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        st.o[i][4 * j + 0] *= st.alpha[2 * j];
        st.o[i][4 * j + 1] *= st.alpha[2 * j + 1];
        st.o[i][4 * j + 2] *= st.alpha[2 * j];
        st.o[i][4 * j + 3] *= st.alpha[2 * j + 1];
      }
    }
  };
  // Every pair but the last: its P.V beside the next pair's Q.K^T and softmax. The loop has no branch
  // on whether a next pair exists: with one, ptxas serialized the wgmmas (it could not tell that the
  // wait for Q.K^T alone follows an issued Q.K^T).
  for (int pair = 0; pair + 1 < n_pairs; ++pair) {
    const KvStage stage(pair_base + pair), next = stage.next();
    const int buf = pair % 2;
    if (rescale) rescale_o();
    mbarrier_wait(&ss.kv_full[next.index][wg], next.phase);
    cutlass::arch::fence_view_async_shared();  // as before the first Q.K^T
    if (!ONE_BLOCK || wg == 0) issue_qk_narrow(ss, next.index, wg, s);
    issue_pv_narrow<ONE_BLOCK ? 1 : 2>(st.o, a, smem_addr(ss.probs[buf][0]), smem_addr(ss.probs[buf][1]));
    // Q.K^T(p + 1) is the older group: retire it alone; the P.V run on under the softmax, whose
    // wait before its barrier retires them (the P buffers' order, as in consumer.cuh).
    cute::warpgroup_wait<1>();
    fence_operands(s);
    rescale = softmax_narrow(ss, s, ss.valid[next.index][wg], buf ^ 1, scale_log2, st, next.index);
    take_v(next);
#pragma unroll
    for (int i = 0; i < 4; ++i) fence_operands(st.o[i]);
  }
  // The last pair: the unit's last Q.K^T completed before its softmax, so Q may be replaced.
  mbarrier_arrive(&ss.q_empty);
  if (rescale) rescale_o();
  const int buf = (n_pairs - 1) % 2;
  issue_pv_narrow<ONE_BLOCK ? 1 : 2>(st.o, a, smem_addr(ss.probs[buf][0]), smem_addr(ss.probs[buf][1]));
  cute::warpgroup_wait<0>();
#pragma unroll
  for (int i = 0; i < 4; ++i) fence_operands(st.o[i]);
}

// The epilogue with the narrow tile (epilogue.cuh's store_outputs, per head column).
template <int D_QK, Tile TILE, int NH, KvLayout LAYOUT>
__device__ __forceinline__ void store_outputs_narrow(const PrefillParams& params, SharedStorage<D_QK, TILE, LAYOUT>& ss,
                                                     const NarrowState<NH>& st, int q_row, int num_heads) {
  constexpr int NH_J = NarrowState<NH>::J;
  const ConsumerThread thread = consumer_thread();
  const int wg = thread.wg, warp = thread.warp, g = thread.g, c = thread.c;
#pragma unroll
  for (int hh = 0; hh < 2 * NH_J; ++hh) {
    const float sum = column_sum(st.row_sum[hh]);
    const float mx = column_max(st.row_max[hh]);
    if (g == 0) {
      const int head = frag_col(c, hh / 2, hh % 2);
      ss.head_sum[wg][warp][head] = sum;
      ss.head_max[wg][warp][head] = mx;
      if (wg == 0 && warp == 0) ss.head_reference[head] = st.reference[hh];
    }
  }
  named_barrier_sync<kRowSumReady, NUM_CONSUMER_THREADS>();
  const int t = threadIdx.x;
  if (t < NH) {
    const int head = t;
    float sum = 0.f, row_max = -INFINITY;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      sum += ss.head_sum[k / 4][k % 4][head];
      row_max = max_nan(row_max, ss.head_max[k / 4][k % 4][head]);
    }
    const RowOutputs r = [&] {
      if constexpr (LAYOUT == KvLayout::kPaged) {  // each row's scale is in its P (consumer.cuh)
        return finalize_row(params, ss.head_reference[head], sum, row_max, 1.f, head, head < num_heads);
      } else {
        return finalize_row(params, ss.head_reference[head], sum, row_max, *params.kv_scale, head, head < num_heads);
      }
    }();
    ss.out_scale[head] = r.scale;
    if (head < num_heads) store_row_outputs(params, q_row, head, r);
  }
  named_barrier_sync<kRowSumReady, NUM_CONSUMER_THREADS>();

  const int dim0 = 256 * wg + 16 * warp + 2 * g;
  bf16* const base = params.out + static_cast<int64_t>(q_row) * params.out_stride_s +
                     static_cast<int64_t>(2 * c) * params.out_stride_h + dim0;
  const bool aligned = ((reinterpret_cast<uintptr_t>(params.out) | static_cast<uintptr_t>(params.out_stride_s) * 2 |
                         static_cast<uintptr_t>(params.out_stride_h) * 2) & 3) == 0;
#pragma unroll
  for (int j = 0; j < NH_J; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int head = frag_col(c, j, e);
      if (head >= num_heads) continue;
      const float sc = ss.out_scale[head];
      bf16* const dst = base + static_cast<int64_t>(8 * j + e) * params.out_stride_h;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const __nv_bfloat162 v = __floats2bfloat162_rn(st.o[i][4 * j + e] * sc, st.o[i][4 * j + 2 + e] * sc);
        if (aligned) {
          *reinterpret_cast<__nv_bfloat162*>(dst + 64 * i) = v;
        } else {
          dst[64 * i] = v.x;
          dst[64 * i + 1] = v.y;
        }
      }
    }
  }
}

// The consumer warpgroups' role with a narrow tile: each work unit's pairs, then its outputs (whole
// items only: the launch runs a split call with the wide tile).
template <int D_QK, int TOPK, Tile TILE, KvLayout LAYOUT>
__device__ __forceinline__ void run_narrow_consumers(const PrefillParams& params, SharedStorage<D_QK, TILE, LAYOUT>& ss, int head_blocks,
                                                     int n_units, float scale_log2) {
  WorkScheduler<TOPK, TILE> scheduler(params, head_blocks, n_units);
  for (; scheduler.has_work(); scheduler.advance()) {
    const WorkUnit w = scheduler.current();
    NarrowState<TileTraits<TILE>::kHeads> st;
    run_narrow_mainloop<D_QK, TOPK>(ss, scale_log2, w.n_pairs, scheduler.pair_base(), scheduler.unit_count(), st);
    store_outputs_narrow<D_QK>(params, ss, st, w.q_row, w.num_heads);
  }
}

}  // namespace sparse_mla::sm90::prefill
