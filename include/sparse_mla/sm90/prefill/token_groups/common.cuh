// What both pre-passes share: warp scans of counts, and a group's decision appended to the unit lists.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include <sparse_mla/params.cuh>
#include <sparse_mla/sm90/prefill/primitives.cuh>
#include <sparse_mla/sm90/prefill/token_groups/plan.cuh>
#include <sparse_mla/sm90/prefill/traits.cuh>

namespace sparse_mla::sm90::prefill {

// The sum of `value` over lanes 0 .. this lane, of the first LANES lanes (a power of 2).
template <int LANES>
__device__ __forceinline__ uint32_t inclusive_lane_scan(uint32_t value) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int d = 1; d < LANES; d *= 2) {
    const uint32_t from = __shfl_up_sync(0xffffffffu, value, d);
    if (lane >= d) value += from;
  }
  return value;
}
// Lane w < WARPS holding warp w's count: the counts of the warps before `warp` (x), and of all (y),
// in every lane.
template <int WARPS>
__device__ __forceinline__ uint2 scan_warp_counts(uint32_t count, int warp) {
  const uint32_t scan = inclusive_lane_scan<WARPS>(count);
  return make_uint2(__shfl_sync(0xffffffffu, scan - count, warp), __shfl_sync(0xffffffffu, scan, WARPS - 1));
}

// Group blockIdx.x's length (-1: it runs token by token), and the group, or its tokens, appended to
// the unit list of the launch that runs it.
__device__ __forceinline__ void decide_group(const TokenGroupParams& p, int32_t length) {
  wait_for_grid_ahead();  // prefill_kernel_zero_counts, ahead of the pre-pass (launch_token_groups)
  p.group_length[blockIdx.x] = length;
  if (length >= 0) {
    const uint32_t k = atomicAdd(p.group_units, 1);
    if (k < static_cast<uint32_t>(num_groups(p))) p.group_units[GROUPED_UNITS + k] = static_cast<int32_t>(blockIdx.x);
    return;
  }
  const int first_token = blockIdx.x * p.group_size, tokens = min(p.group_size, p.s_q - first_token);
  const uint32_t k = atomicAdd(p.group_units + 1, tokens);
  int32_t* narrow = p.group_units + narrow_units_begin(p.s_q, p.group_size);
  for (int t = 0; t < tokens; ++t) {
    if (k + t < static_cast<uint32_t>(p.s_q)) narrow[k + t] = first_token + t;
  }
}

}  // namespace sparse_mla::sm90::prefill
