// The tvm-ffi entry points of one kernel module: check -> device guard -> stream -> launch.
//
// The Python package generates, per kernel key (d_qk, topk, arch), a translation unit that includes
// this header and exports one entry per launch plan (sparse_mla/launch.py): `prefill_fwd` (every work
// item whole, no token groups), `prefill_split_fwd` (a tail split) and `prefill_token_groups_fwd` (the
// token groups' pre-pass and both launches), the pre-pass alone (`token_groups_fwd`, which launches
// no prefill kernel) and the key string. None takes a flag or a list it does not use. Python has already validated
// every argument before any compiler runs; the checks here repeat what the kernel relies on, so that a module can
// never be fed tensors it was not built for (defence in depth), and raise typed errors instead of
// crashing. Nothing here synchronizes the device.
#pragma once

#include <cstdint>
#include <utility>

#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/extra/cuda/device_guard.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/optional.h>

#include <sparse_mla/params.cuh>
#include <sparse_mla/sm90/prefill/launch.cuh>
#include <sparse_mla/sm90/prefill/token_groups/launch.cuh>

namespace sparse_mla {

namespace ffi = tvm::ffi;

namespace detail {

// The kernel counts work items (query token, 64-head block) and units in int, with room for its CTA
// stride.
constexpr int64_t kMaxItems = INT32_MAX - (1 << 20);

inline bool has_dtype(const ffi::TensorView& t, int code, int bits) {
  DLDataType d = t.dtype();
  return d.code == code && d.bits == bits && d.lanes == 1;
}

// Checks one tensor's device, dtype and shape; -1 in `shape` accepts any extent.
inline void check_tensor(const ffi::TensorView& t, const char* name, const DLDevice& device, int code,
                         int bits, std::initializer_list<int64_t> shape) {
  if (t.device().device_type != kDLCUDA || t.device().device_id != device.device_id) {
    TVM_FFI_THROW(ValueError) << name << " must be on q's device cuda:" << device.device_id;
  }
  if (!has_dtype(t, code, bits)) {
    TVM_FFI_THROW(ValueError) << name << " has the wrong dtype (code " << int(t.dtype().code)
                              << ", " << int(t.dtype().bits) << " bits)";
  }
  if (t.ndim() != static_cast<int>(shape.size())) {
    TVM_FFI_THROW(ValueError) << name << " must have " << shape.size() << " dimensions, got "
                              << t.ndim();
  }
  int dim = 0;
  for (int64_t extent : shape) {
    if (extent >= 0 && t.size(dim) != extent) {
      TVM_FFI_THROW(ValueError) << name << ".shape[" << dim << "] must be " << extent << ", got "
                                << t.size(dim);
    }
    ++dim;
  }
  if (t.ndim() > 0 && t.size(-1) > 1 && t.stride(-1) != 1) {
    TVM_FFI_THROW(ValueError) << name << " must have a contiguous last dimension";
  }
}

inline void check_contiguous(const ffi::TensorView& t, const char* name) {
  int64_t expected = 1;
  for (int dim = t.ndim() - 1; dim >= 0; --dim) {
    if (t.size(dim) > 1 && t.stride(dim) != expected) {
      TVM_FFI_THROW(ValueError) << name << " must be contiguous";
    }
    expected *= t.size(dim);
  }
}

template <typename T>
T* data_of(const ffi::TensorView& t) {
  return reinterpret_cast<T*>(static_cast<char*>(t.data_ptr()) + t.byte_offset());
}

// The kernel gathers q and kv rows with 16-byte vector loads.
inline void check_aligned_rows(const ffi::TensorView& t, const char* name) {
  bool aligned = reinterpret_cast<uintptr_t>(data_of<char>(t)) % 16 == 0;
  for (int dim = 0; dim + 1 < t.ndim(); ++dim) {
    aligned = aligned && (t.size(dim) <= 1 || t.stride(dim) % 16 == 0);  // a size-1 dim is never stepped
  }
  if (!aligned) {
    TVM_FFI_THROW(ValueError) << name << " must start at a 16-byte boundary with strides that are "
                              << "multiples of 16 elements (except the last dimension's)";
  }
}

// Two elements of an output never share an address (a zero stride, say): the kernel would write both.
// Taking dimensions by increasing stride, each stride must step past everything the smaller ones span.
inline void check_no_self_overlap(const ffi::TensorView& t, const char* name) {
  int64_t strides[3], sizes[3];
  int n = 0;
  for (int dim = 0; dim < t.ndim() && n < 3; ++dim) {
    if (t.size(dim) > 1) {
      strides[n] = t.stride(dim);
      sizes[n++] = t.size(dim);
    }
  }
  for (int i = 1; i < n; ++i) {  // insertion sort by stride
    for (int j = i; j > 0 && strides[j] < strides[j - 1]; --j) {
      std::swap(strides[j], strides[j - 1]);
      std::swap(sizes[j], sizes[j - 1]);
    }
  }
  int64_t span = 1;
  for (int i = 0; i < n; ++i) {
    if (strides[i] < span) TVM_FFI_THROW(ValueError) << name << " must not overlap itself";
    span += strides[i] * (sizes[i] - 1);
  }
}

// A token group of group_size tokens of h_q heads with TOPK slots each: 2 .. MAX_GROUP tokens that fit
// one tile and the pre-pass's table.
template <int TOPK>
void check_group_size(int64_t h_q, int64_t group_size) {
  using sm90::prefill::B_H;
  using sm90::prefill::MAX_GROUP;
  using sm90::prefill::MAX_GROUP_SLOTS;
  if (group_size < 2 || group_size > MAX_GROUP || group_size * h_q > B_H || group_size * TOPK > MAX_GROUP_SLOTS) {
    TVM_FFI_THROW(ValueError) << "inconsistent token groups: group_size " << group_size << " with h_q " << h_q
                              << " and topk " << TOPK << " (2 to " << MAX_GROUP << " tokens of at most " << B_H
                              << " rows and " << MAX_GROUP_SLOTS << " slots)";
  }
}

// The token groups' lists (sm90/prefill/token_groups/) as tensors: group_indices int32
// [ceil(s_q / G), G * TOPK], group_masks int64 [ceil(s_q / G), group_mask_blocks(G * TOPK), G]
// (traits.cuh), group_length int32 [ceil(s_q / G)], group_units int32 [group_units_size(s_q, G)]
// (traits.cuh).
template <int TOPK>
void check_token_group_lists(int64_t s_q, int64_t group_size, const DLDevice& device,
                             const ffi::TensorView& group_indices, const ffi::TensorView& group_masks,
                             const ffi::TensorView& group_length, const ffi::TensorView& group_units) {
  const int64_t n_groups = sm90::prefill::num_groups_of(s_q, group_size);
  check_tensor(group_indices, "group_indices", device, kDLInt, 32, {n_groups, group_size * TOPK});
  check_contiguous(group_indices, "group_indices");
  check_tensor(group_masks, "group_masks", device, kDLInt, 64,
               {n_groups, sm90::prefill::group_mask_blocks(static_cast<int>(group_size) * TOPK), group_size});
  check_contiguous(group_masks, "group_masks");
  check_tensor(group_length, "group_length", device, kDLInt, 32, {n_groups});
  check_contiguous(group_length, "group_length");
  check_tensor(group_units, "group_units", device, kDLInt, 32, {sm90::prefill::group_units_size(s_q, group_size)});
  check_contiguous(group_units, "group_units");
}

// A call's scratch memory (the tail split's parts and counters, the token groups' lists): one uint8
// tensor of at least the bytes its layout below needs, at a 16-byte boundary, which the Python side
// takes from torch's caching allocator in one allocation (each costs the host microseconds) and the
// entry carves, every piece at a 16-byte boundary (the merge moves float4s). launch.py's
// scratch_bytes computes the same sizes.
constexpr int64_t align16(int64_t bytes) { return (bytes + 15) / 16 * 16; }

inline uint8_t* scratch_of(const ffi::TensorView& scratch, int64_t bytes, const DLDevice& device) {
  check_tensor(scratch, "scratch", device, kDLUInt, 8, {-1});
  uint8_t* const base = data_of<uint8_t>(scratch);
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0) {
    TVM_FFI_THROW(ValueError) << "scratch must start at a 16-byte boundary";
  }
  if (scratch.size(0) < bytes) {
    TVM_FFI_THROW(ValueError) << "scratch holds " << scratch.size(0) << " bytes; this call needs " << bytes;
  }
  return base;
}

// The tail split's: the parts' states, float [split_items, split_parts, PART_FLOATS], then one int32
// counter per split item.
inline int64_t split_workspace_bytes(int64_t split_items, int64_t split_parts) {
  return split_items * split_parts * sm90::prefill::PART_FLOATS * static_cast<int64_t>(sizeof(float));
}

// The token groups' lists, in a call's scratch or in token_groups_fwd's tensors.
struct TokenGroupLists {
  uint64_t* masks;
  int32_t* indices;
  int32_t* length;
  int32_t* units;
};

// Where a call's scratch holds them: group_masks at 0, then group_indices, group_length and
// group_units, shaped as check_token_group_lists says.
struct TokenGroupLayout {
  int64_t indices_at, length_at, units_at, bytes;
};

template <int TOPK>
TokenGroupLayout token_group_layout(int64_t s_q, int64_t group_size) {
  const int64_t groups = sm90::prefill::num_groups_of(s_q, group_size);
  const int64_t mask_words = groups * sm90::prefill::group_mask_blocks(static_cast<int>(group_size) * TOPK) * group_size;
  TokenGroupLayout layout;
  layout.indices_at = align16(mask_words * 8);
  layout.length_at = layout.indices_at + align16(groups * group_size * TOPK * 4);
  layout.units_at = layout.length_at + align16(groups * 4);
  layout.bytes = layout.units_at + sm90::prefill::group_units_size(s_q, group_size) * 4;
  return layout;
}

// The selections: indices [s_q, 1, TOPK] int32 (s_q -1: any), contiguous; topk_length [s_q] int32 or None.
template <int TOPK>
void check_selections(const ffi::TensorView& indices, const ffi::Optional<ffi::TensorView>& topk_length,
                      const DLDevice& device, int64_t s_q) {
  check_tensor(indices, "indices", device, kDLInt, 32, {s_q, 1, TOPK});
  check_contiguous(indices, "indices");
  if (topk_length.has_value()) {
    check_tensor(*topk_length, "topk_length", device, kDLInt, 32, {indices.size(0)});
    check_contiguous(*topk_length, "topk_length");
  }
}

}  // namespace detail

namespace detail {

// A dequantization scale: one float32 element on q's device, of any rank (read on the device).
inline void check_scale(const ffi::TensorView& t, const char* name, const DLDevice& device) {
  if (t.device().device_type != kDLCUDA || t.device().device_id != device.device_id) {
    TVM_FFI_THROW(ValueError) << name << " must be on q's device cuda:" << device.device_id;
  }
  if (!has_dtype(t, kDLFloat, 32)) {
    TVM_FFI_THROW(ValueError) << name << " has the wrong dtype (code " << int(t.dtype().code) << ", "
                              << int(t.dtype().bits) << " bits)";
  }
  if (t.numel() != 1) TVM_FFI_THROW(ValueError) << name << " must have exactly one element, got " << t.numel();
}

constexpr int kFloat8E4M3FN = 10;  // DLPack's code for float8_e4m3fn

// q [s_q, h_q, D_QK] e4m3 on a CUDA device; returns that device.
template <int D_QK>
DLDevice checked_q_device(const ffi::TensorView& q) {
  const DLDevice device = q.device();
  if (device.device_type != kDLCUDA) TVM_FFI_THROW(ValueError) << "q must be a CUDA tensor";
  check_tensor(q, "q", device, kFloat8E4M3FN, 8, {-1, -1, D_QK});
  return device;
}

// The checks every launch relies on besides its kv rows' (s_kv of them), then the kernel's parameters
// of a call without a tail split or token groups (launch_prefill), kv's fields left for the caller; the
// split and grouped entries add theirs.
template <int D_QK, int TOPK>
PrefillParams call_params(const ffi::TensorView& q, int64_t s_kv, const ffi::TensorView& indices,
                          const ffi::TensorView& q_scale, const ffi::Optional<ffi::TensorView>& attn_sink,
                          const ffi::Optional<ffi::TensorView>& topk_length, const ffi::TensorView& out,
                          const ffi::TensorView& max_logits, const ffi::TensorView& lse, double sm_scale) {
  const DLDevice device = q.device();
  const int64_t s_q = q.size(0), h_q = q.size(1);
  check_selections<TOPK>(indices, topk_length, device, s_q);
  check_scale(q_scale, "q_scale", device);
  check_tensor(out, "out", device, kDLBfloat, 16, {s_q, h_q, D_V});
  check_tensor(max_logits, "max_logits", device, kDLFloat, 32, {s_q, h_q});
  check_tensor(lse, "lse", device, kDLFloat, 32, {s_q, h_q});
  check_no_self_overlap(out, "out");
  check_no_self_overlap(max_logits, "max_logits");
  check_no_self_overlap(lse, "lse");
  if (attn_sink.has_value()) {
    check_tensor(*attn_sink, "attn_sink", device, kDLFloat, 32, {h_q});
    check_contiguous(*attn_sink, "attn_sink");
  }
  const int64_t items = s_q * ((h_q + 63) / 64);
  if (h_q < 1 || s_kv < 1 || s_kv > INT32_MAX || h_q > INT32_MAX || items > kMaxItems) {
    TVM_FFI_THROW(ValueError) << "shape out of the supported domain: s_q " << s_q << ", h_q " << h_q
                              << ", s_kv " << s_kv << " (s_q * ceil(h_q / 64) must not exceed " << kMaxItems << ")";
  }
  check_aligned_rows(q, "q");

  PrefillParams params{};
  params.s_q = static_cast<int>(s_q);
  params.s_kv = static_cast<int>(s_kv);
  params.h_q = static_cast<int>(h_q);
  params.q = data_of<const fp8_e4m3>(q);
  params.q_stride_s = q.stride(0);
  params.q_stride_h = q.stride(1);
  params.indices = data_of<const int32_t>(indices);
  params.topk_length =
      topk_length.has_value() ? data_of<const int32_t>(*topk_length) : nullptr;
  params.attn_sink = attn_sink.has_value() ? data_of<const float>(*attn_sink) : nullptr;
  params.q_scale = data_of<const float>(q_scale);
  params.sm_scale = sm_scale;
  params.out = data_of<bf16>(out);
  params.out_stride_s = out.stride(0);
  params.out_stride_h = out.stride(1);
  params.max_logits = data_of<float>(max_logits);
  params.max_logits_stride_s = max_logits.stride(0);
  params.max_logits_stride_h = max_logits.stride(1);
  params.lse = data_of<float>(lse);
  params.lse_stride_s = lse.stride(0);
  params.lse_stride_h = lse.stride(1);
  params.split_begin = static_cast<int>(items);  // no item split
  params.split_parts = 1;
  params.group_size = 1;  // no token groups
  return params;
}

// call_params of a call over contiguous kv rows: kv [s_kv, 1, D_QK] e4m3 at one scale, kv_scale.
template <int D_QK, int TOPK>
PrefillParams prefill_params(const ffi::TensorView& q, const ffi::TensorView& kv, const ffi::TensorView& indices,
                             const ffi::TensorView& q_scale, const ffi::TensorView& kv_scale,
                             const ffi::Optional<ffi::TensorView>& attn_sink,
                             const ffi::Optional<ffi::TensorView>& topk_length, const ffi::TensorView& out,
                             const ffi::TensorView& max_logits, const ffi::TensorView& lse, double sm_scale) {
  const DLDevice device = checked_q_device<D_QK>(q);
  check_tensor(kv, "kv", device, kFloat8E4M3FN, 8, {-1, 1, D_QK});
  check_scale(kv_scale, "kv_scale", device);
  PrefillParams params = call_params<D_QK, TOPK>(q, kv.size(0), indices, q_scale, attn_sink, topk_length, out,
                                                 max_logits, lse, sm_scale);
  check_aligned_rows(kv, "kv");
  params.kv = data_of<const fp8_e4m3>(kv);
  params.kv_stride_s = kv.stride(0);
  params.kv_scale = data_of<const float>(kv_scale);
  return params;
}

// call_params of a call over the engines' paged cache (sm90/prefill/gather.cuh, PagedRows): kv_cache
// [num_blocks, block_size, 1, 656] of any 1-byte dtype, each block's rows contiguous, blocks at a
// stride of whole 16-byte units (the producer copies 16-byte chunks), starting at a 16-byte boundary.
template <int D_QK, int TOPK>
PrefillParams paged_prefill_params(const ffi::TensorView& q, const ffi::TensorView& kv_cache,
                                   const ffi::TensorView& indices, const ffi::TensorView& q_scale,
                                   const ffi::Optional<ffi::TensorView>& attn_sink,
                                   const ffi::Optional<ffi::TensorView>& topk_length, const ffi::TensorView& out,
                                   const ffi::TensorView& max_logits, const ffi::TensorView& lse, double sm_scale) {
  constexpr int kRowBytes = sm90::prefill::PagedRows<D_QK>::ROW_BYTES;
  const DLDevice device = checked_q_device<D_QK>(q);
  if (kv_cache.device().device_type != kDLCUDA || kv_cache.device().device_id != device.device_id) {
    TVM_FFI_THROW(ValueError) << "kv_cache must be on q's device cuda:" << device.device_id;
  }
  if (kv_cache.dtype().bits != 8 || kv_cache.dtype().lanes != 1) {
    TVM_FFI_THROW(ValueError) << "kv_cache must have a 1-byte dtype, got " << int(kv_cache.dtype().bits) << " bits";
  }
  if (kv_cache.ndim() != 4 || kv_cache.size(2) != 1 || kv_cache.size(3) != kRowBytes) {
    TVM_FFI_THROW(ValueError) << "kv_cache must be [num_blocks, block_size, 1, " << kRowBytes << "]";
  }
  const int64_t num_blocks = kv_cache.size(0), block_size = kv_cache.size(1);
  if (kv_cache.stride(3) != 1 || (block_size > 1 && kv_cache.stride(1) != kRowBytes)) {
    TVM_FFI_THROW(ValueError) << "kv_cache's rows must be contiguous within a block (" << kRowBytes << " bytes apart)";
  }
  if (reinterpret_cast<uintptr_t>(data_of<char>(kv_cache)) % 16 != 0 || (num_blocks > 1 && kv_cache.stride(0) % 16 != 0)) {
    TVM_FFI_THROW(ValueError) << "kv_cache must start at a 16-byte boundary with a block stride that is a multiple of 16";
  }
  PrefillParams params = call_params<D_QK, TOPK>(q, num_blocks * block_size, indices, q_scale, attn_sink, topk_length,
                                                 out, max_logits, lse, sm_scale);
  params.kv = data_of<const fp8_e4m3>(kv_cache);
  params.kv_stride_s = kRowBytes;
  params.kv_block_size = static_cast<int>(block_size);
  params.kv_block_stride = kv_cache.stride(0);
  return params;
}

// A tail split (sm90/prefill/split.cuh) into `params` of an ordinary call: the work items from
// split_begin on cut into split_parts (2 .. MAX_SPLIT_PARTS) parts, whose states and counters `scratch`
// holds (scratch_of).
inline void set_tail_split(PrefillParams& params, int64_t split_begin, int64_t split_parts,
                           const ffi::TensorView& scratch, const DLDevice& device) {
  using sm90::prefill::MAX_SPLIT_PARTS;
  const int64_t items = params.split_begin;
  const int64_t split_items = items - split_begin;
  if (split_parts < 2 || split_parts > MAX_SPLIT_PARTS || split_begin < 0 || split_items < 1 ||
      split_begin + split_items * split_parts > kMaxItems) {
    TVM_FFI_THROW(ValueError) << "inconsistent tail split: split_begin " << split_begin << ", split_parts "
                              << split_parts << " for " << items << " work items";
  }
  const int64_t workspace_bytes = split_workspace_bytes(split_items, split_parts);
  uint8_t* const base = scratch_of(scratch, workspace_bytes + split_items * 4, device);
  params.split_begin = static_cast<int>(split_begin);
  params.split_parts = static_cast<int>(split_parts);
  params.split_workspace = reinterpret_cast<float*>(base);
  params.split_counters = reinterpret_cast<int32_t*>(base + workspace_bytes);
}

// The caller's current stream on q's device, as tvm-ffi took it from torch.
inline cudaStream_t current_stream(const DLDevice& device) {
  return static_cast<cudaStream_t>(TVMFFIEnvGetStream(device.device_type, device.device_id));
}

// A launch the CUDA runtime refused raises sparse_mla.KernelLaunchError in Python (the package registers
// this error kind with tvm-ffi when it loads a module).
inline void check_launch(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    TVM_FFI_THROW(SparseMLAKernelLaunchError) << "sparse_mla " << what << " launch failed: " << cudaGetErrorString(status);
  }
}

}  // namespace detail

// An ordinary call: every work item whole, no token groups. q [s_q, h_q, D_QK] e4m3; kv [s_kv, 1, D_QK]
// e4m3; indices [s_q, 1, TOPK] int32; q_scale, kv_scale one f32 element each; attn_sink [h_q] f32 or
// None; topk_length [s_q] int32 or None; out [s_q, h_q, D_V = 512] bf16; max_logits, lse [s_q, h_q] f32.
// Launches on the stream tvm-ffi took from torch (the caller's current stream).
template <int D_QK, int TOPK>
void prefill_fwd(ffi::TensorView q, ffi::TensorView kv, ffi::TensorView indices, ffi::TensorView q_scale,
                 ffi::TensorView kv_scale, ffi::Optional<ffi::TensorView> attn_sink,
                 ffi::Optional<ffi::TensorView> topk_length, ffi::TensorView out, ffi::TensorView max_logits,
                 ffi::TensorView lse, double sm_scale) {
  const PrefillParams params = detail::prefill_params<D_QK, TOPK>(q, kv, indices, q_scale, kv_scale, attn_sink,
                                                                  topk_length, out, max_logits, lse, sm_scale);
  if (params.s_q == 0) return;
  ffi::CUDADeviceGuard device_guard(q.device().device_id);
  detail::check_launch(sm90::launch_prefill<D_QK, TOPK>(params, false, detail::current_stream(q.device())),
                       "prefill kernel");
}

// A call with a tail split (sm90/prefill/split.cuh), arguments as prefill_fwd's, then: the work items
// (items = s_q * ceil(h_q / 64)) from split_begin on are cut into split_parts (2 .. MAX_SPLIT_PARTS)
// parts; `scratch` (detail::scratch_of) holds the parts' states and the counters, which the launch
// zeroes first.
template <int D_QK, int TOPK>
void prefill_split_fwd(ffi::TensorView q, ffi::TensorView kv, ffi::TensorView indices, ffi::TensorView q_scale,
                       ffi::TensorView kv_scale, ffi::Optional<ffi::TensorView> attn_sink,
                       ffi::Optional<ffi::TensorView> topk_length, ffi::TensorView out, ffi::TensorView max_logits,
                       ffi::TensorView lse, double sm_scale, int64_t split_begin, int64_t split_parts,
                       ffi::TensorView scratch) {
  PrefillParams params = detail::prefill_params<D_QK, TOPK>(q, kv, indices, q_scale, kv_scale, attn_sink,
                                                            topk_length, out, max_logits, lse, sm_scale);
  detail::set_tail_split(params, split_begin, split_parts, scratch, q.device());
  ffi::CUDADeviceGuard device_guard(q.device().device_id);
  detail::check_launch(sm90::launch_prefill<D_QK, TOPK>(params, false, detail::current_stream(q.device())),
                       "prefill kernel");
}

// An ordinary call over the engines' paged FP8 cache (sm90/prefill/gather.cuh, PagedRows): arguments as
// prefill_fwd's, with kv_cache [num_blocks, block_size, 1, 656] (any 1-byte dtype) for kv and no
// kv_scale (each row carries its scales); indices name rows block * block_size + offset.
template <int D_QK, int TOPK>
void prefill_paged_fwd(ffi::TensorView q, ffi::TensorView kv_cache, ffi::TensorView indices, ffi::TensorView q_scale,
                       ffi::Optional<ffi::TensorView> attn_sink, ffi::Optional<ffi::TensorView> topk_length,
                       ffi::TensorView out, ffi::TensorView max_logits, ffi::TensorView lse, double sm_scale) {
  const PrefillParams params = detail::paged_prefill_params<D_QK, TOPK>(q, kv_cache, indices, q_scale, attn_sink,
                                                                        topk_length, out, max_logits, lse, sm_scale);
  if (params.s_q == 0) return;
  ffi::CUDADeviceGuard device_guard(q.device().device_id);
  detail::check_launch(sm90::launch_prefill<D_QK, TOPK, sm90::prefill::KvLayout::kPaged>(
                           params, false, detail::current_stream(q.device())),
                       "prefill kernel");
}

// prefill_paged_fwd with a tail split, its last arguments as prefill_split_fwd's.
template <int D_QK, int TOPK>
void prefill_paged_split_fwd(ffi::TensorView q, ffi::TensorView kv_cache, ffi::TensorView indices,
                             ffi::TensorView q_scale, ffi::Optional<ffi::TensorView> attn_sink,
                             ffi::Optional<ffi::TensorView> topk_length, ffi::TensorView out,
                             ffi::TensorView max_logits, ffi::TensorView lse, double sm_scale, int64_t split_begin,
                             int64_t split_parts, ffi::TensorView scratch) {
  PrefillParams params = detail::paged_prefill_params<D_QK, TOPK>(q, kv_cache, indices, q_scale, attn_sink,
                                                                  topk_length, out, max_logits, lse, sm_scale);
  detail::set_tail_split(params, split_begin, split_parts, scratch, q.device());
  ffi::CUDADeviceGuard device_guard(q.device().device_id);
  detail::check_launch(sm90::launch_prefill<D_QK, TOPK, sm90::prefill::KvLayout::kPaged>(
                           params, false, detail::current_stream(q.device())),
                       "prefill kernel");
}

namespace detail {

// The pre-pass's parameters (launch_token_groups) into `lists`, its selections and domain checked (the
// group size by the caller, check_group_size).
template <int TOPK>
TokenGroupParams token_group_params(const ffi::TensorView& indices, const ffi::Optional<ffi::TensorView>& topk_length,
                                    int64_t s_kv, int64_t group_size, double max_union_ratio,
                                    const TokenGroupLists& lists) {
  const DLDevice device = indices.device();
  if (device.device_type != kDLCUDA) TVM_FFI_THROW(ValueError) << "indices must be a CUDA tensor";
  check_selections<TOPK>(indices, topk_length, device, -1);
  const int64_t s_q = indices.size(0);
  if (group_size < 2 || s_kv < 1 || s_kv > INT32_MAX || s_q > INT32_MAX || !(max_union_ratio >= 0)) {
    TVM_FFI_THROW(ValueError) << "token groups out of the supported domain: group_size " << group_size << ", s_kv "
                              << s_kv << ", s_q " << s_q << ", max_union_ratio " << max_union_ratio;
  }
  TokenGroupParams params{};
  params.s_q = static_cast<int>(s_q);
  params.s_kv = static_cast<int>(s_kv);
  params.group_size = static_cast<int>(group_size);
  params.indices = data_of<const int32_t>(indices);
  params.topk_length = topk_length.has_value() ? data_of<const int32_t>(*topk_length) : nullptr;
  params.max_union_ratio = static_cast<float>(max_union_ratio);
  params.group_indices = lists.indices;
  params.group_masks = lists.masks;
  params.group_length = lists.length;
  params.group_units = lists.units;
  return params;
}

}  // namespace detail

// The token groups' lists (sm90/prefill/token_groups/) for a call with indices [s_q, 1, TOPK]
// int32, topk_length [s_q] int32 or None and s_kv kv rows, into the tensors check_token_group_lists
// describes: the pre-pass alone, for tests and tools that read its lists. A group whose list holds
// more than max_union_ratio entries per valid slot gets group_length -1, and its list is not read
// (left as it was, but past map_capacity kv rows, where the chunks before the one that decides it are
// written). Each group is appended to a unit list of group_units, whose two counts
// (group_units[0:2]) the launch zeroes first. Launches on the caller's current stream.
template <int TOPK>
void token_groups_fwd(ffi::TensorView indices, ffi::Optional<ffi::TensorView> topk_length, int64_t s_kv,
                      int64_t h_q, int64_t group_size, double max_union_ratio, ffi::TensorView group_indices,
                      ffi::TensorView group_masks, ffi::TensorView group_length, ffi::TensorView group_units) {
  const detail::TokenGroupLists lists{detail::data_of<uint64_t>(group_masks), detail::data_of<int32_t>(group_indices),
                                      detail::data_of<int32_t>(group_length), detail::data_of<int32_t>(group_units)};
  const TokenGroupParams params =
      detail::token_group_params<TOPK>(indices, topk_length, s_kv, group_size, max_union_ratio, lists);
  detail::check_group_size<TOPK>(h_q, group_size);
  detail::check_token_group_lists<TOPK>(params.s_q, group_size, indices.device(), group_indices, group_masks,
                                        group_length, group_units);
  if (params.s_q == 0) return;
  ffi::CUDADeviceGuard device_guard(indices.device().device_id);
  detail::check_launch(sm90::prefill::launch_token_groups<TOPK>(params, detail::current_stream(indices.device())),
                       "token-group kernel");
}

namespace detail {

// The token groups of a call whose checked parameters are `params` (s_kv rows): the pre-pass into the
// lists in `scratch`, then the grouped launch and the launch of the other groups' tokens, with no tail
// split, on the caller's stream; every argument checked before the first launch.
template <int D_QK, int TOPK, sm90::prefill::KvLayout LAYOUT>
void launch_token_groups_call(PrefillParams params, const ffi::TensorView& q, const ffi::TensorView& indices,
                              const ffi::Optional<ffi::TensorView>& topk_length, int64_t group_size,
                              double max_union_ratio, const ffi::TensorView& scratch) {
  check_group_size<TOPK>(q.size(1), group_size);  // before the layout, which assumes a sane group
  const TokenGroupLayout layout = token_group_layout<TOPK>(q.size(0), group_size);
  uint8_t* const base = scratch_of(scratch, layout.bytes, q.device());
  const TokenGroupLists lists{reinterpret_cast<uint64_t*>(base), reinterpret_cast<int32_t*>(base + layout.indices_at),
                              reinterpret_cast<int32_t*>(base + layout.length_at),
                              reinterpret_cast<int32_t*>(base + layout.units_at)};
  const TokenGroupParams groups =
      token_group_params<TOPK>(indices, topk_length, params.s_kv, group_size, max_union_ratio, lists);
  params.group_size = static_cast<int>(group_size);
  params.group_indices = lists.indices;
  params.group_masks = lists.masks;
  params.group_length = lists.length;
  params.group_units = lists.units;
  if (params.s_q == 0) return;
  ffi::CUDADeviceGuard device_guard(q.device().device_id);
  const cudaStream_t stream = current_stream(q.device());
  check_launch(sm90::prefill::launch_token_groups<TOPK>(groups, stream), "token-group kernel");
  check_launch(sm90::launch_prefill<D_QK, TOPK, LAYOUT>(params, true, stream), "prefill kernel");
  check_launch(sm90::launch_prefill<D_QK, TOPK, LAYOUT>(params, false, stream), "prefill kernel");
}

}  // namespace detail

// A token-grouped call, arguments as prefill_fwd's, then group_size and max_union_ratio as
// token_groups_fwd's and `scratch` (detail::scratch_of), which holds the lists: the pre-pass into the
// lists, then the grouped launch and the launch of the other groups' tokens, with no tail split, in
// one crossing of the FFI (each crossing converts and checks its arguments again). The only entries
// that launch the grouped tile (this and its paged twin): its lists are always the pre-pass's of this
// call, on its stream. Every argument is checked before the first launch.
template <int D_QK, int TOPK>
void prefill_token_groups_fwd(ffi::TensorView q, ffi::TensorView kv, ffi::TensorView indices,
                              ffi::TensorView q_scale, ffi::TensorView kv_scale,
                              ffi::Optional<ffi::TensorView> attn_sink, ffi::Optional<ffi::TensorView> topk_length,
                              ffi::TensorView out, ffi::TensorView max_logits, ffi::TensorView lse, double sm_scale,
                              int64_t group_size, double max_union_ratio, ffi::TensorView scratch) {
  const PrefillParams params = detail::prefill_params<D_QK, TOPK>(q, kv, indices, q_scale, kv_scale, attn_sink,
                                                                  topk_length, out, max_logits, lse, sm_scale);
  detail::launch_token_groups_call<D_QK, TOPK, sm90::prefill::KvLayout::kContiguous>(
      params, q, indices, topk_length, group_size, max_union_ratio, scratch);
}

// prefill_token_groups_fwd over the paged cache, arguments as prefill_paged_fwd's, then as
// prefill_token_groups_fwd's last three.
template <int D_QK, int TOPK>
void prefill_paged_token_groups_fwd(ffi::TensorView q, ffi::TensorView kv_cache, ffi::TensorView indices,
                                    ffi::TensorView q_scale, ffi::Optional<ffi::TensorView> attn_sink,
                                    ffi::Optional<ffi::TensorView> topk_length, ffi::TensorView out,
                                    ffi::TensorView max_logits, ffi::TensorView lse, double sm_scale,
                                    int64_t group_size, double max_union_ratio, ffi::TensorView scratch) {
  const PrefillParams params = detail::paged_prefill_params<D_QK, TOPK>(q, kv_cache, indices, q_scale, attn_sink,
                                                                        topk_length, out, max_logits, lse, sm_scale);
  detail::launch_token_groups_call<D_QK, TOPK, sm90::prefill::KvLayout::kPaged>(
      params, q, indices, topk_length, group_size, max_union_ratio, scratch);
}

}  // namespace sparse_mla
