// Parameters of one sparse MLA prefill call, as the kernels see them.
//
// A plain struct passed by value to the kernel. Every pointer is a device pointer; every stride is
// counted in elements of its tensor's dtype. The caller (entry.cuh) has already checked shapes,
// dtypes, devices and that each tensor's last dimension is contiguous.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp8.h>

namespace sparse_mla {

using fp8_e4m3 = __nv_fp8_e4m3;
using bf16 = __nv_bfloat16;

// d_v: the "nope" part of each latent row (its first 512 dims) is also the value vector.
constexpr int D_V = 512;

struct PrefillParams {
  int s_q;   // query tokens (rows of q); > 0 when a kernel is launched
  int s_kv;  // rows of the latent KV cache; an index is valid only in [0, s_kv)
  int h_q;   // query heads; any positive value, the kernel masks its last head block

  const fp8_e4m3* q;    // [s_q, h_q, d_qk], last dimension contiguous
  int64_t q_stride_s;   // elements between q[i] and q[i + 1]
  int64_t q_stride_h;   // elements between q[i, h] and q[i, h + 1]
  const fp8_e4m3* kv;   // [s_kv, 1, d_qk], last dimension contiguous
  int64_t kv_stride_s;  // elements between kv[r] and kv[r + 1]

  // topk, the slots per query row, is no field: it is the kernel's TOPK template value.
  const int32_t* indices;      // [s_q, 1, topk], contiguous; any int32 value, invalid ones never read
  const int32_t* topk_length;  // [s_q] or nullptr; slot j of row i is used only if j < topk_length[i]
  const float* attn_sink;      // [h_q] or nullptr; one extra logit per head with a zero value vector
  const float* q_scale;        // [1], dequantization scale of q (read on the device: no host sync)
  const float* kv_scale;       // [1], dequantization scale of kv
  double sm_scale;             // softmax scale applied to <Q, K> (natural-log units); |sm_scale| <= 2^99

  bf16* out;                 // [s_q, h_q, D_V], last dimension contiguous
  int64_t out_stride_s;
  int64_t out_stride_h;
  float* max_logits;         // [s_q, h_q]; -inf for a row with no valid slot
  int64_t max_logits_stride_s;
  int64_t max_logits_stride_h;
  float* lse;                // [s_q, h_q]; natural log, +inf for a row with no valid slot
  int64_t lse_stride_s;
  int64_t lse_stride_h;

  // Tail split (sm90/prefill/split.cuh): the work items from `split_begin` on (the last, partial
  // round of the persistent CTAs) are each cut into `split_parts` ranges of topk that run on
  // different CTAs; the CTA that finishes an item's last part merges the parts. split_parts == 1:
  // no split, and the two pointers are unused.
  int split_begin;             // first split work item, in [0, s_q * ceil(h_q / 64)]
  int split_parts;             // parts per split item, 1 .. 4
  float* split_workspace;      // [items - split_begin, split_parts, PART_FLOATS] fp32 partial states
  int32_t* split_counters;     // [items - split_begin], zeroed by launch_prefill: parts of each item finished

  // Token groups (sm90/prefill/token_groups/), for h_q <= 32: query tokens G * k .. G * k + G - 1
  // (G = group_size) form group k, whose union of valid slots prefill_kernel_token_groups lists once. A group
  // whose list has group_length[k] >= 0 entries runs in the grouped launch, one 64-row tile for all
  // its tokens; a group with group_length[k] < 0 (the union would not pay) runs its tokens one by one
  // in the other launch. Each launch takes its units from its own list in group_units (the pre-pass
  // appends each group to one of them), so that neither walks the other's. group_length == nullptr:
  // no groups.
  int group_size;                 // G, 2 .. MAX_GROUP (traits.cuh); 1 without groups
  const int32_t* group_indices;   // [ceil(s_q / G), G * TOPK]: the union's kv rows, those of every token first (token_groups/)
  // [ceil(s_q / G), group_mask_blocks(G * TOPK), G]: bit r of [k][b][t]: entry
  // B_TOPK * b + r of group k's list is a slot of its token t (token_groups/)
  const uint64_t* group_masks;
  const int32_t* group_length;    // [ceil(s_q / G)]: entries of the group's list, or -1
  const int32_t* group_units;     // [group_units_size(s_q, G)]: the pre-pass's two unit lists (token_groups/)

  // The paged layout (sm90/prefill/gather.cuh, PagedRows): kv is the cache's first byte, s_kv its rows
  // (blocks * kv_block_size), and row i lies at block i / kv_block_size, row i % kv_block_size of it.
  // kv_stride_s and kv_scale are unused (each row carries its scales).
  int kv_block_size;
  int64_t kv_block_stride;  // bytes
};

// The arguments of the pre-pass that builds the token groups' lists (token_groups/).
struct TokenGroupParams {
  int s_q, s_kv;
  int group_size;                 // G, 2 .. MAX_GROUP
  const int32_t* indices;         // as PrefillParams::indices
  const int32_t* topk_length;     // as PrefillParams::topk_length
  // A group runs grouped only if its list has at most this many entries per valid slot of its rows
  // (about the narrow tile's cost per slot relative to the grouped tile's); above, group_length is -1.
  float max_union_ratio;
  int32_t* group_indices;
  uint64_t* group_masks;
  int32_t* group_length;
  int32_t* group_units;           // its two counts zeroed by launch_token_groups
};

}  // namespace sparse_mla
