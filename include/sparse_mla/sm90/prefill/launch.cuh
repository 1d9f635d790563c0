// Host-side launch of the SM90 prefill kernel for one (D_QK, TOPK) key.
#pragma once

#include <cuda_runtime.h>

#include <sparse_mla/params.cuh>
#include <sparse_mla/sm90/prefill/kernel.cuh>
#include <sparse_mla/sm90/prefill/scheduler.cuh>
#include <sparse_mla/sm90/prefill/tiles/select.cuh>
#include <sparse_mla/sm90/prefill/traits.cuh>

namespace sparse_mla::sm90 {

// Launches on `stream`; params.s_q > 0, indices with TOPK slots per row, the split fields consistent (entry.cuh)
// and the work units (scheduler.cuh) fit an int. `grouped`: the token groups' grouped launch
// (params.group_length is set, no tail split); otherwise the call's tokens one by one, only those of
// the groups that run token by token when params.group_length is set. A token-grouped launch sizes
// its grid for every group or token: the CTAs past its list's length have no unit.
// Returns the launch error; never synchronizes. LAYOUT: how the kv rows lie (gather.cuh).
template <int D_QK, int TOPK, prefill::KvLayout LAYOUT = prefill::KvLayout::kContiguous>
cudaError_t launch_prefill(const PrefillParams& params, bool grouped, cudaStream_t stream) {
  static_assert(D_QK == 512 || D_QK == 576, "d_qk must be 512 or 576");
  static_assert(TOPK > 0, "topk must be positive");
  // The tile decides which launches it runs (tiles/select.cuh); every tile's kernel is compiled, each
  // launched with its own storage's shared memory.
  const prefill::Tile tile = prefill::launch_tile(params, grouped);
  const auto kernel = prefill::with_tile(tile, [](auto t) {
    return prefill::prefill_kernel<D_QK, TOPK, decltype(t)::value, LAYOUT>;
  });
  const int smem_bytes = prefill::with_tile(tile, [](auto t) {
    return prefill::shared_storage_bytes<D_QK, decltype(t)::value, LAYOUT>();
  });
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err != cudaSuccess) return err;
  // Persistent CTAs: one per SM (the shared-memory plan allows no second), none without work.
  int device = 0, sms = 0;
  if ((err = cudaGetDevice(&device)) != cudaSuccess) return err;
  if ((err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess) return err;
  const int64_t units = grouped ? prefill::num_token_groups(params) : prefill::num_work_units(params);
  // A token-grouped call's launches follow the pre-pass with programmatic stream serialization: the
  // grouped launch's CTAs start as the pre-pass's leave their SMs and wait for it before they read its
  // lists; the launch behind it reads only those lists, complete once every grouped CTA has passed
  // that wait, and starts on the SMs the grouped launch's last round leaves idle (kernel.cuh). A split
  // call follows the zeroing of its counters the same way, and waits for it only where it counts a
  // part (split.cuh). Other calls follow the caller's kernels and launch plainly.
  const bool split = params.split_parts > 1;
  if (split) {
    const int split_items = static_cast<int>((units - params.split_begin) / params.split_parts);  // never grouped
    if ((err = prefill::launch_zero_counts(params.split_counters, split_items, stream)) != cudaSuccess) return err;
  }
  return prefill::launch_kernel(kernel, params, static_cast<unsigned>(units < sms ? units : sms), prefill::NUM_THREADS,
                                smem_bytes, stream, params.group_length != nullptr || split);
}

}  // namespace sparse_mla::sm90
