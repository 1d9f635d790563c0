// The consumers' epilogue of the 64-row tiles (tiles/wide.cuh, tiles/grouped.cuh): full row sums,
// max_logits and lse, and the bf16 output.
//
// Row sums and maxima are split between the consumers (each summed its own blocks' P) and across
// the 4 threads of a row; consumer 0 turns them into the statistics and the per-head output scale,
// which every thread then applies to its O^T fragment (dims 2g, 2g + 1 of 16 heads per 64-dim tile).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>

#include <sparse_mla/params.cuh>
#include <sparse_mla/sm90/prefill/finalize.cuh>
#include <sparse_mla/sm90/prefill/primitives.cuh>
#include <sparse_mla/sm90/prefill/scheduler.cuh>
#include <sparse_mla/sm90/prefill/tiles/grouped.cuh>
#include <sparse_mla/sm90/prefill/traits.cuh>

namespace sparse_mla::sm90::prefill {

template <int D_QK, Tile TILE, KvLayout LAYOUT>
__device__ __forceinline__ void store_outputs(const PrefillParams& params, SharedStorage<D_QK, TILE, LAYOUT>& ss,
                                              const ConsumerState& st, int q_row, int head_begin, int num_heads) {
  const ConsumerThread thread = consumer_thread();  // named fields: the store lambda below captures c
  const int wg = thread.wg, warp = thread.warp, g = thread.g, c = thread.c;

  float row_sum[2] = {st.row_sum[0], st.row_sum[1]};
  float row_max[2] = {st.row_max[0], st.row_max[1]};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_sum[h] = quad_sum(row_sum[h]);
    row_max[h] = quad_max(row_max[h]);
    if (c == 0) {
      ss.row_sum[wg][frag_row(warp, g, h)] = row_sum[h];
      ss.row_max[wg][frag_row(warp, g, h)] = row_max[h];
    }
  }
  named_barrier_sync<kRowSumReady, NUM_CONSUMER_THREADS>();
  if (wg == 0) {
    const float kv_scale = LAYOUT == KvLayout::kPaged ? 1.f : *params.kv_scale;  // paged: in each row's P (consumer.cuh)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = frag_row(warp, g, h);
      const int2 token_head = TileTraits<TILE>::row_token_head(params, q_row, head_begin, row);
      const int token = token_head.x, head = token_head.y;
      const float sum = ss.row_sum[0][row] + ss.row_sum[1][row];
      const float row_max = max_nan(ss.row_max[0][row], ss.row_max[1][row]);
      const RowOutputs r = finalize_row(params, st.reference[h], sum, row_max, kv_scale, head, row < num_heads);
      if (c == 0) {
        ss.out_scale[row] = r.scale;
        if (row < num_heads) store_row_outputs(params, token, head, r);
      }
    }
  }
  named_barrier_sync<kRowSumReady, NUM_CONSUMER_THREADS>();

  // Thread's pairs of dims: 2g, 2g + 1 of 64-dim tile i, heads 8j + 2c + e.
  const int dim0 = CONSUMER_D_V * wg + 16 * warp + 2 * g;
  bf16* const base = params.out + static_cast<int64_t>(q_row) * params.out_stride_s +
                     static_cast<int64_t>(head_begin + 2 * c) * params.out_stride_h + dim0;
  // Every pair is 4-byte aligned when the tensor and its strides are (dim0 is even): one 4-byte store
  // per pair, else two 2-byte stores. One branch per item, not per store.
  const bool aligned = ((reinterpret_cast<uintptr_t>(params.out) | static_cast<uintptr_t>(params.out_stride_s) * 2 |
                         static_cast<uintptr_t>(params.out_stride_h) * 2) & 3) == 0;
  const GroupRows group_rows(params.h_q);  // only the grouped tile's rows_by_token stores read this
  // Heads frag_col(c, j, e), written out here: through the function, the loop's addressing compiles
  // to different code.
  const auto store = [&](auto aligned_pairs, auto rows_by_token) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 scale = *reinterpret_cast<const float2*>(&ss.out_scale[8 * j + 2 * c]);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (8 * j + 2 * c + e >= num_heads) continue;
        const float sc = e == 0 ? scale.x : scale.y;
        bf16* dst = base + static_cast<int64_t>(8 * j + e) * params.out_stride_h;
        if constexpr (decltype(rows_by_token)::value) {
          const int2 token_head = group_rows.token_head(q_row, 8 * j + 2 * c + e);
          dst = params.out + static_cast<int64_t>(token_head.x) * params.out_stride_s +
                static_cast<int64_t>(token_head.y) * params.out_stride_h + dim0;
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const __nv_bfloat162 v = __floats2bfloat162_rn(st.o[i][4 * j + e] * sc, st.o[i][4 * j + 2 + e] * sc);
          if constexpr (decltype(aligned_pairs)::value) {
            *reinterpret_cast<__nv_bfloat162*>(dst + 64 * i) = v;
          } else {
            dst[64 * i] = v.x;
            dst[64 * i + 1] = v.y;
          }
        }
      }
    }
  };
  // A token group's row r (head r % h_q of token q_row + r / h_q, head_begin 0) lies r * out_stride_h
  // past its first token's row where out_stride_s == h_q * out_stride_h (a [s_q, h_q, d_v] output):
  // there it is stored as the wide tile stores head r. Other strides find each row's token.
  if constexpr (TileTraits<TILE>::kGroups) {
    if (params.out_stride_s != static_cast<int64_t>(params.h_q) * params.out_stride_h) {
      if (aligned) store(std::true_type{}, std::true_type{}); else store(std::false_type{}, std::true_type{});
      return;
    }
  }
  if (aligned) store(std::true_type{}, std::false_type{}); else store(std::false_type{}, std::false_type{});
}

}  // namespace sparse_mla::sm90::prefill
