"""The serving engines' pass before a contiguous FP8 prefill kernel, as a CUDA kernel of its own.

For a batch with a cached prefix, engines serving the DeepSeek-V3.2 family with an FP8 latent cache
gather every context row of the batch from the paged 656-byte cache on every layer, dequantize it
(e4m3 x its 128-column tile's float32 scale; rope bf16) and cast it to e4m3 at scale 1.0 (rope too),
then append topk zero rows, and call the contiguous kernel on that buffer. This is that pass, written
to move bytes as fast as the card copies them, so that a benchmark of the paged path against
"pass + contiguous kernel" does not rest on a slow stand-in: one thread per 16 output bytes, 16-byte
loads and stores, the row's scales read once per tile.

    python benchmarks/engine_pass.py            # checks it against sparse_mla.testing's torch emulation,
                                                # then times it and a device copy of the same rows

`engine_pass(kv_cache, rows, topk, d_qk)` returns ``[len(rows) + topk, 1, d_qk]`` float8_e4m3fn (the
rows in order, then topk zero rows) from ``kv_cache`` ``[num_blocks, block_size, 1, 656]`` (any 1-byte
dtype, rows of a block contiguous, the block stride a multiple of 16 bytes) and ``rows`` int32 flat
paged rows (``block * block_size + offset``).
"""

from __future__ import annotations

import argparse
import functools
import os
import pathlib
import sys

import torch

ROW_BYTES = 656  # 512 e4m3, 4 float32 tile scales, 64 bf16

_SOURCE = r"""
#include <cstdint>
#include <cuda_fp8.h>
#include <cuda_bf16.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

namespace {

constexpr int kRowBytes = 656;
constexpr int kScaleAt = 512, kRopeAt = 528;

__device__ __forceinline__ uint32_t pack4(float a, float b, float c, float d) {
  const __nv_fp8x2_storage_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  const __nv_fp8x2_storage_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

__device__ __forceinline__ float2 fp8x2_to_float2(uint16_t v) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v), __NV_E4M3);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

// Thread t of the grid writes 16-byte chunk t % chunks of output row t / chunks: chunks 0..31 are the
// 512 nope values (16 e4m3 read, times the tile's scale), chunks 32..35 the rope (16 bf16 read).
// Rows past n_rows are the appended zero rows.
__global__ void engine_pass_kernel(const uint8_t* __restrict__ cache, int64_t block_stride, int block_size,
                                   const int32_t* __restrict__ rows, int n_rows, int n_out, int chunks,
                                   uint4* __restrict__ out) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = t / chunks;
  const int c = static_cast<int>(t % chunks);
  if (row >= n_out) return;
  uint4 result = make_uint4(0, 0, 0, 0);
  if (row < n_rows) {
    const int flat = rows[row];
    const uint8_t* src = cache + static_cast<int64_t>(flat / block_size) * block_stride +
                         static_cast<int64_t>(flat % block_size) * kRowBytes;
    float v[16];
    if (c < 32) {
      const uint4 raw = *reinterpret_cast<const uint4*>(src + 16 * c);
      const float scale = *reinterpret_cast<const float*>(src + kScaleAt + 4 * (c / 8));
      const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
      for (int i = 0; i < 4; ++i) {
        const float2 a = fp8x2_to_float2(static_cast<uint16_t>(w[i] & 0xffff));
        const float2 b = fp8x2_to_float2(static_cast<uint16_t>(w[i] >> 16));
        v[4 * i] = a.x * scale; v[4 * i + 1] = a.y * scale; v[4 * i + 2] = b.x * scale; v[4 * i + 3] = b.y * scale;
      }
    } else {
      const uint4* rope = reinterpret_cast<const uint4*>(src + kRopeAt + 32 * (c - 32));
      const uint4 raw[2] = {rope[0], rope[1]};
      const __nv_bfloat16* b = reinterpret_cast<const __nv_bfloat16*>(raw);
      for (int i = 0; i < 16; ++i) v[i] = __bfloat162float(b[i]);
    }
    result = make_uint4(pack4(v[0], v[1], v[2], v[3]), pack4(v[4], v[5], v[6], v[7]),
                        pack4(v[8], v[9], v[10], v[11]), pack4(v[12], v[13], v[14], v[15]));
  }
  out[t] = result;
}

}  // namespace

void engine_pass(tvm::ffi::TensorView cache, tvm::ffi::TensorView rows, tvm::ffi::TensorView out) {
  const int d_qk = static_cast<int>(out.size(2));
  TVM_FFI_ICHECK(d_qk == 512 || d_qk == 576) << "d_qk must be 512 or 576";
  TVM_FFI_ICHECK(cache.ndim() == 4 && cache.size(3) == kRowBytes && cache.stride(1) == kRowBytes &&
                 cache.stride(3) == 1 && cache.stride(0) % 16 == 0) << "kv_cache: [blocks, block_size, 1, 656] rows";
  TVM_FFI_ICHECK(out.stride(0) == d_qk) << "out must be contiguous";
  const int chunks = d_qk / 16;
  const int n_rows = static_cast<int>(rows.size(0)), n_out = static_cast<int>(out.size(0));
  const int64_t threads = static_cast<int64_t>(n_out) * chunks;
  const int block = 256;
  const auto stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(out.device().device_type, out.device().device_id));
  engine_pass_kernel<<<static_cast<unsigned>((threads + block - 1) / block), block, 0, stream>>>(
      static_cast<const uint8_t*>(cache.data_ptr()), cache.stride(0), static_cast<int>(cache.size(1)),
      static_cast<const int32_t*>(rows.data_ptr()), n_rows, n_out, chunks, static_cast<uint4*>(out.data_ptr()));
}
"""


@functools.lru_cache(maxsize=None)
def _module():
    import tvm_ffi.cpp

    os.environ.setdefault("TVM_FFI_CUDA_ARCH_LIST", "9.0a")  # this script's process only
    build = pathlib.Path(os.environ.get("ENGINE_PASS_BUILD_DIR", "/tmp/sparse_mla_engine_pass"))
    build.mkdir(parents=True, exist_ok=True)
    return tvm_ffi.cpp.load_inline("engine_pass", cuda_sources=_SOURCE, functions=["engine_pass"],
                                   extra_cuda_cflags=["-O3"], build_directory=str(build))


def engine_pass(kv_cache: torch.Tensor, rows: torch.Tensor, topk: int, d_qk: int = 576) -> torch.Tensor:
    """The requantized contiguous buffer (see the module's docstring); launched on the current stream."""
    out = torch.empty((rows.shape[0] + topk, 1, d_qk), dtype=torch.float8_e4m3fn, device=kv_cache.device)
    _module().engine_pass(kv_cache.view(torch.uint8), rows, out)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[65536, 262144])
    args = parser.parse_args()
    from sparse_mla.testing import (engine_requantized_kv, median_time_ms, paged_indices, quantize_paged_cache,
                                    random_latent, shuffled_block_table)

    torch.manual_seed(0)
    for d_qk in (576, 512):  # correctness against the torch emulation, every byte
        n = 3000
        table = shuffled_block_table(n, 64, seed=0).cuda()
        num_blocks = 2 * ((n + 63) // 64)
        cache = quantize_paged_cache(random_latent(n, d_qk, seed=0).cuda(), 64, block_table=table, num_blocks=num_blocks)
        rows = paged_indices(torch.arange(n, dtype=torch.int32, device="cuda"), table, 64, n, num_blocks)
        expected, _ = engine_requantized_kv(cache, rows, d_qk)
        got = engine_pass(cache, rows, 2048, d_qk)
        assert torch.equal(got[:n].view(torch.uint8), expected.view(torch.uint8)), f"d_qk {d_qk}: differs"
        assert not got[n:].view(torch.uint8).any(), "the appended rows are not zero"
    print(f"{torch.cuda.get_device_name()}: the pass matches the torch emulation bit for bit (d_qk 576, 512)")
    print(f"{'rows':>8} {'pass us':>9} {'us / 64K rows':>14} {'pass GB/s':>10} {'copy GB/s':>10} {'pass / copy':>11}")
    for n in args.rows:
        blocks = (n + 63) // 64
        cache = torch.randint(0, 120, (blocks, 64, 1, ROW_BYTES), dtype=torch.uint8, device="cuda")
        cache[..., 512:528] = 0
        cache[..., 512:528].view(torch.float32).fill_(1.0 / 448)
        rows = torch.randperm(blocks, device="cuda").repeat_interleave(64)[:n].to(torch.int32) * 64 + \
            torch.arange(n, device="cuda", dtype=torch.int32) % 64
        pass_ms = median_time_ms(lambda: engine_pass(cache, rows, 2048), iters=30)
        src = torch.empty(n * ROW_BYTES, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        copy_ms = median_time_ms(lambda: dst.copy_(src), iters=30)
        moved = n * (ROW_BYTES + 576) + 2048 * 576
        pass_gbs, copy_gbs = moved / pass_ms / 1e6, 2 * n * ROW_BYTES / copy_ms / 1e6
        print(f"{n:>8} {pass_ms * 1e3:>9.1f} {pass_ms * 1e3 * 65536 / n:>14.1f} {pass_gbs:>10.0f} {copy_gbs:>10.0f} "
              f"{pass_gbs / copy_gbs:>11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
