// A row's outputs besides out, one definition for every tile: from the row's softmax state (its
// reference, the sum of its P relative to it and the max of its logits, reduced over the threads,
// consumers and, in the tail split, parts that hold them) its lse, max_logits and output scale.
#pragma once

#include <cmath>
#include <cstdint>

#include <sparse_mla/params.cuh>

namespace sparse_mla::sm90::prefill {

struct RowOutputs {
  float scale;      // of the row's O (with P relative to the reference): kv_scale / sum, and the sink's factor
  float lse;        // natural log
  float max_logit;  // natural log units
};

// `reference` is -inf while the row has had no valid slot; head: the row's head (the sink's index);
// `exists`: the row is one of the call's (rows past h_q are zero and never stored). kv_scale is the
// call's *params.kv_scale by reference, so that each tile reads it where it always has (the 64-row
// epilogue once for both of a thread's rows, the narrow one only for a row with a valid slot); passed
// as a value, the narrow epilogue's load moves ahead of the branch and its code changes. The three
// outputs are locals returned together: assigned to a RowOutputs member by member, the 32-head tile
// compiles to different code too.
__device__ __forceinline__ RowOutputs finalize_row(const PrefillParams& params, float reference, float sum,
                                                   float row_max, const float& kv_scale, int head, bool exists) {
  constexpr float LN2 = 0.6931471805599453f;
  float scale = 0.f, lse = INFINITY, mx = -INFINITY;  // a row with no valid slot
  if (reference == -INFINITY && isnan(row_max)) {
    // Valid slots whose logits are all NaN: NaN, as out, lse and max_logits of any NaN row.
    scale = lse = mx = NAN;
  } else if (reference != -INFINITY) {
    // Approximate intrinsics (a few ulps; sum lies in [2^-1/4, 2^8.25 * topk], the max logit's P
    // being at least 2^-1/4): no slow-path calls. A NaN logit makes sum, and so all three, NaN.
    lse = (reference + __log2f(sum)) * LN2;
    mx = row_max * LN2;
    scale = __fdividef(kv_scale, sum);
    // A sink of +inf gives 1 / inf = 0: the row's output is zero.
    if (params.attn_sink != nullptr && exists) scale *= __fdividef(1.f, 1.f + __expf(params.attn_sink[head] - lse));
  }
  return {scale, lse, mx};
}

// The row's max_logits and lse, head `head` of query token `token`.
__device__ __forceinline__ void store_row_outputs(const PrefillParams& params, int token, int head,
                                                  const RowOutputs& r) {
  params.max_logits[static_cast<int64_t>(token) * params.max_logits_stride_s +
                    static_cast<int64_t>(head) * params.max_logits_stride_h] = r.max_logit;
  params.lse[static_cast<int64_t>(token) * params.lse_stride_s + static_cast<int64_t>(head) * params.lse_stride_h] = r.lse;
}

}  // namespace sparse_mla::sm90::prefill
