// FP8 (e4m3) unpacking helpers shared by the SM90 kernels.
//
// Every e4m3 value (max 448, smallest subnormal 2^-9, 3 mantissa bits) is exactly representable in
// fp16, and every fp16 in fp32, so the hardware e4m3x2 -> f16x2 conversion (one `cvt` on SM90)
// followed by f16 -> f32 widening is exact: the kernels see the same numbers as `tensor.float()`.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace sparse_mla::sm90 {

// Two e4m3 values packed in 16 bits, lowest byte first (memory order) -> {x: first, y: second}.
__device__ __forceinline__ float2 fp8x2_to_float2(uint32_t packed) {
  const __half2_raw pair =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(packed & 0xffffu), __NV_E4M3);
  return __half22float2(__half2(pair));
}

// Four e4m3 values packed in 32 bits, lowest byte first -> {x, y, z, w} in memory order.
__device__ __forceinline__ float4 fp8x4_to_float4(uint32_t packed) {
  const float2 lo = fp8x2_to_float2(packed);
  const float2 hi = fp8x2_to_float2(packed >> 16);
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

}  // namespace sparse_mla::sm90
