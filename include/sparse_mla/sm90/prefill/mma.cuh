// The kernel's e4m3 wgmma atoms, one definition for every tile: D[64 x N] (+)= A[64 x 32] . B[N x 32]^T
// with fp32 accumulators, N = 2 x the accumulator registers of a thread (64 for the wide tile's Q.K^T
// and P.V, the narrow tiles' heads for theirs). B comes from shared memory (a descriptor, swizzle.cuh);
// A from shared memory too (SS) or from registers in the wgmma fragment layout (RS).
#pragma once

#include <cstdint>
#include <utility>

#include <cute/arch/mma_sm90_gmma.hpp>

namespace sparse_mla::sm90::prefill {

// CuTe's atoms of one N.
template <int N>
struct WgmmaE4M3;
template <>
struct WgmmaE4M3<64> {
  using SS = cute::SM90::GMMA::MMA_64x64x32_F32E4M3E4M3_SS_TN<>;
  using RS = cute::SM90::GMMA::MMA_64x64x32_F32E4M3E4M3_RS_TN<>;
};
template <>
struct WgmmaE4M3<32> {
  using SS = cute::SM90::GMMA::MMA_64x32x32_F32E4M3E4M3_SS_TN<>;
  using RS = cute::SM90::GMMA::MMA_64x32x32_F32E4M3E4M3_RS_TN<>;
};
template <>
struct WgmmaE4M3<16> {
  using SS = cute::SM90::GMMA::MMA_64x16x32_F32E4M3E4M3_SS_TN<>;
  using RS = cute::SM90::GMMA::MMA_64x16x32_F32E4M3E4M3_RS_TN<>;
};
template <>
struct WgmmaE4M3<8> {
  using SS = cute::SM90::GMMA::MMA_64x8x32_F32E4M3E4M3_SS_TN<>;
  using RS = cute::SM90::GMMA::MMA_64x8x32_F32E4M3E4M3_RS_TN<>;
};

template <int REGS, size_t... I>
__device__ __forceinline__ void wgmma_ss(float (&d)[REGS], uint64_t desc_a, uint64_t desc_b,
                                         cute::SM90::GMMA::ScaleOut scale_d, std::index_sequence<I...>) {
  WgmmaE4M3<2 * REGS>::SS::fma(desc_a, desc_b, d[I]..., scale_d);
}
template <int REGS, size_t... I>
__device__ __forceinline__ void wgmma_rs(float (&d)[REGS], const uint32_t (&a)[4], uint64_t desc_b,
                                         std::index_sequence<I...>) {
  WgmmaE4M3<2 * REGS>::RS::fma(a[0], a[1], a[2], a[3], desc_b, d[I]...);
}

// D (+)= A . B^T, both operands from shared memory; `accumulate` false ignores D's values.
template <int REGS>
__device__ __forceinline__ void wgmma_ss(float (&d)[REGS], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  wgmma_ss(d, desc_a, desc_b, accumulate ? cute::SM90::GMMA::ScaleOut::One : cute::SM90::GMMA::ScaleOut::Zero,
           std::make_index_sequence<REGS>{});
}

// D += A . B^T, A's four registers of the thread's fragment.
template <int REGS>
__device__ __forceinline__ void wgmma_rs(float (&d)[REGS], const uint32_t (&a)[4], uint64_t desc_b) {
  wgmma_rs(d, a, desc_b, std::make_index_sequence<REGS>{});
}

// Keeps the compiler from moving accesses to the accumulators across the wgmma fences.
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) cute::warpgroup_fence_operand(d[i]);
}

}  // namespace sparse_mla::sm90::prefill
