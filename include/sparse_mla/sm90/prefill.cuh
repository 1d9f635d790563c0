// FP8 sparse MLA prefill on SM90: the first, exact kernel (fp32 math on CUDA cores).
//
// It computes SPEC §3 exactly as written (fp8 -> fp32 conversion is exact, every product and sum is
// fp32, softmax uses expf/logf), so it doubles as the on-device reference for the later wgmma kernel,
// which will replace the internals of `launch_prefill` behind the same interface.
//
// Alignment relied on (the caller must guarantee it; entry.cuh / validate.py check it):
//   - q and kv data pointers are 16-byte aligned, and q_stride_s, q_stride_h, kv_stride_s are
//     multiples of 16 elements (fp8: elements == bytes): Q and KV rows are moved with 16-byte loads.
//   - Nothing beyond natural element alignment for out, max_logits, lse, indices, topk_length,
//     attn_sink, q_scale, kv_scale (out is written one bf16 at a time, so any element stride works).
//
// Launch: grid (s_q, ceil(h_q / B_H)), NUM_THREADS threads, ~31 KB static shared memory (under the
// 48 KB default, so no cudaFuncSetAttribute and no per-device/per-thread host state), no host sync.
// gridDim.y caps h_q at 65535 * B_H; a larger h_q makes the launch fail with a returned error.
#pragma once

#include <cmath>
#include <cstdint>

#include <cuda_runtime.h>

#include <sparse_mla/params.cuh>
#include <sparse_mla/sm90/fp8.cuh>

namespace sparse_mla::sm90 {

constexpr int D_V = 512;          // out uses the first D_V columns of each kv row
constexpr int B_H = 16;           // query heads per CTA
constexpr int B_TOPK = 32;        // topk slots gathered and processed per chunk
constexpr int NUM_THREADS = 256;  // 8 warps

// Thread roles (see prefill_kernel) tie these together: in the logit/softmax stage a half warp owns
// one head and each of its 16 lanes owns two slots; in the P.V stage each thread owns two adjacent
// output columns for all B_H heads.
static_assert(NUM_THREADS == B_H * 16, "logit stage: 16 threads (half a warp) per head");
static_assert(B_TOPK == 2 * 16, "logit stage: each of a head's 16 threads owns two slots");
static_assert(NUM_THREADS * 2 == D_V, "P.V stage: each thread owns two output columns");
static_assert(B_H % 4 == 0, "P.V stage reads per-head values as float4");

template <int D_QK>
struct PrefillSmem {
  // A KV row is D_QK bytes; D_QK % 128 == 64 for 576 and 0 for 512, so unpadded rows would put the
  // 16-byte loads of 8 consecutive slots (one shared-memory phase) on 2 or 1 distinct bank groups.
  // Padding by 16 bytes makes the row stride an odd multiple of 16 modulo 128: 8 distinct groups.
  static constexpr int KV_STRIDE = D_QK + 16;
  // Probabilities are stored slot-major so the P.V stage reads a slot's B_H values as float4
  // broadcasts; the +4 spreads the softmax stage's transposed writes over more banks.
  static constexpr int P_STRIDE = B_H + 4;

  alignas(16) uint8_t q[B_H * D_QK];             // this CTA's Q rows, raw e4m3 (zero past h_q)
  alignas(16) uint8_t kv[B_TOPK * KV_STRIDE];    // the chunk's gathered KV rows (zero if invalid)
  alignas(16) float p[B_TOPK * P_STRIDE];        // p[slot][head] = exp(s - running max)
  alignas(16) float alpha[B_H];                  // per head rescale of the accumulators
  alignas(16) float out_scale[B_H];              // per head kv_scale / l * sink factor (0: no valid slot)
  int32_t kv_row[B_TOPK];                        // the chunk's KV row per slot, -1 if invalid
};

// even += q.x * k.x + q.z * k.z; odd += q.y * k.y + q.w * k.w (two chains for instruction parallelism).
__device__ __forceinline__ void dot4_accumulate(const float4 q, const float4 k, float2& acc) {
  acc.x = fmaf(q.x, k.x, acc.x);
  acc.y = fmaf(q.y, k.y, acc.y);
  acc.x = fmaf(q.z, k.z, acc.x);
  acc.y = fmaf(q.w, k.w, acc.y);
}

template <int D_QK, int TOPK>
__global__ void __launch_bounds__(NUM_THREADS) prefill_kernel(const __grid_constant__ PrefillParams params) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 900)
  __trap();  // built for the wrong target: fail loudly instead of computing garbage
#else
  using Smem = PrefillSmem<D_QK>;
  constexpr int VECS_PER_ROW = D_QK / 16;  // 16-byte vectors per Q or KV row
  __shared__ Smem smem;

  const int tid = threadIdx.x;
  const int q_row = blockIdx.x;  // query token i; s_q lives on gridDim.x (no 65535 limit)
  const int head_begin = blockIdx.y * B_H;
  const int num_heads = min(B_H, params.h_q - head_begin);  // last head block is partial

  // Q rows of this head block. Heads past h_q are never read: they are zero, which keeps their
  // (unwritten) softmax finite.
  const uint8_t* q_base =
      reinterpret_cast<const uint8_t*>(params.q) + static_cast<int64_t>(q_row) * params.q_stride_s;
  for (int v = tid; v < B_H * VECS_PER_ROW; v += NUM_THREADS) {
    const int h = v / VECS_PER_ROW;
    const int c = (v % VECS_PER_ROW) * 16;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (h < num_heads) {
      x = __ldg(reinterpret_cast<const uint4*>(
          q_base + static_cast<int64_t>(head_begin + h) * params.q_stride_h + c));
    }
    *reinterpret_cast<uint4*>(&smem.q[h * D_QK + c]) = x;
  }
  // (Made visible to the logit stage by the first chunk's barriers.)

  // Slots at or past n_slots are invalid, so chunks past it are skipped: this covers topk_length
  // (negative -> 0 slots, above TOPK -> all) and the ragged last chunk when TOPK % B_TOPK != 0.
  int n_slots = TOPK;
  if (params.topk_length != nullptr) {
    n_slots = min(max(params.topk_length[q_row], 0), TOPK);
  }

  // One multiplier turns a raw fp8 dot product into a natural-log logit. Folded in double so that no
  // fp32 intermediate can overflow or underflow when the product itself is representable (e.g.
  // sm_scale * kv_scale = 1e40 with q_scale = 1e-30 would be inf in fp32 in that order).
  const float logit_scale = static_cast<float>(static_cast<double>(params.sm_scale) *
                                               static_cast<double>(*params.q_scale) *
                                               static_cast<double>(*params.kv_scale));

  const int32_t* slot_indices = params.indices + static_cast<int64_t>(q_row) * TOPK;
  const uint8_t* kv_base = reinterpret_cast<const uint8_t*>(params.kv);

  // Logit/softmax role: half warp `sm_head` owns one head; lane `slot0` owns slots slot0, slot0+16.
  // The online-softmax state (running max m, running sum l) of that head is replicated, bit for bit,
  // in its 16 threads (xor-butterfly reductions give every lane the same value).
  const int sm_head = tid / 16;
  const int slot0 = tid % 16;
  const int slot1 = slot0 + 16;
  float m = -INFINITY;
  float l = 0.f;

  // P.V role: output columns col, col + 1 of all B_H heads, in registers.
  const int col = tid * 2;
  float acc[B_H][2];
#pragma unroll
  for (int h = 0; h < B_H; ++h) acc[h][0] = acc[h][1] = 0.f;

  for (int base = 0; base < n_slots; base += B_TOPK) {
    // 1. Validity of the chunk's slots. Safe to overwrite kv_row: its last readers (previous chunk's
    //    logit stage) finished before the previous chunk's third barrier.
    if (tid < B_TOPK) {
      const int slot = base + tid;
      int32_t row = -1;
      if (slot < n_slots) {
        const int32_t index = slot_indices[slot];
        if (index >= 0 && index < params.s_kv) row = index;
      }
      smem.kv_row[tid] = row;
    }
    __syncthreads();  // kv_row visible; previous chunk's P.V is done reading smem.kv and smem.p

    // 2. Gather the valid KV rows; invalid slots are zero-filled and their row is never dereferenced
    //    (zero, not stale data: a NaN times p == 0 would poison the accumulators). All loads are
    //    issued before any store so they are in flight together.
    {
      constexpr int GATHER_VECS = B_TOPK * VECS_PER_ROW;
      constexpr int GATHER_ITERS = (GATHER_VECS + NUM_THREADS - 1) / NUM_THREADS;
      uint4 staged[GATHER_ITERS];
#pragma unroll
      for (int it = 0; it < GATHER_ITERS; ++it) {
        const int v = tid + it * NUM_THREADS;
        staged[it] = make_uint4(0, 0, 0, 0);
        if (v < GATHER_VECS) {
          const int32_t row = smem.kv_row[v / VECS_PER_ROW];
          if (row >= 0) {
            staged[it] = __ldg(reinterpret_cast<const uint4*>(
                kv_base + static_cast<int64_t>(row) * params.kv_stride_s + (v % VECS_PER_ROW) * 16));
          }
        }
      }
#pragma unroll
      for (int it = 0; it < GATHER_ITERS; ++it) {
        const int v = tid + it * NUM_THREADS;
        if (v < GATHER_VECS) {
          *reinterpret_cast<uint4*>(
              &smem.kv[(v / VECS_PER_ROW) * Smem::KV_STRIDE + (v % VECS_PER_ROW) * 16]) = staged[it];
        }
      }
    }
    __syncthreads();  // gathered rows (and, on the first chunk, Q) visible

    // 3. Logits over all D_QK columns, then one online-softmax step per head.
    {
      const uint8_t* q_s = smem.q + sm_head * D_QK;
      const uint8_t* kv0 = smem.kv + slot0 * Smem::KV_STRIDE;
      const uint8_t* kv1 = smem.kv + slot1 * Smem::KV_STRIDE;
      float2 dot0 = make_float2(0.f, 0.f);
      float2 dot1 = make_float2(0.f, 0.f);
#pragma unroll 2
      for (int c = 0; c < D_QK; c += 16) {
        const uint4 qv = *reinterpret_cast<const uint4*>(q_s + c);
        const uint4 k0 = *reinterpret_cast<const uint4*>(kv0 + c);
        const uint4 k1 = *reinterpret_cast<const uint4*>(kv1 + c);
        const uint32_t qw[4] = {qv.x, qv.y, qv.z, qv.w};
        const uint32_t k0w[4] = {k0.x, k0.y, k0.z, k0.w};
        const uint32_t k1w[4] = {k1.x, k1.y, k1.z, k1.w};
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          const float4 qf = fp8x4_to_float4(qw[w]);
          dot4_accumulate(qf, fp8x4_to_float4(k0w[w]), dot0);
          dot4_accumulate(qf, fp8x4_to_float4(k1w[w]), dot1);
        }
      }
      // Invalid slots become -inf by selection (never by arithmetic on their zero-filled rows).
      const float s0 = smem.kv_row[slot0] >= 0 ? (dot0.x + dot0.y) * logit_scale : -INFINITY;
      const float s1 = smem.kv_row[slot1] >= 0 ? (dot1.x + dot1.y) * logit_scale : -INFINITY;

      // Reductions stay inside the head's half warp (xor offsets < 16).
      float chunk_max = fmaxf(s0, s1);
#pragma unroll
      for (int offset = 8; offset > 0; offset /= 2) {
        chunk_max = fmaxf(chunk_max, __shfl_xor_sync(0xffffffffu, chunk_max, offset));
      }
      const float m_new = fmaxf(m, chunk_max);
      // While no valid slot has been seen, m_new is -inf and exp(-inf - -inf) would be NaN: keep
      // alpha = 1 (the accumulators are still exactly 0) and p = 0 instead.
      float alpha = 1.f;
      float p0 = 0.f;
      float p1 = 0.f;
      if (m_new != -INFINITY) {
        alpha = expf(m - m_new);  // 0 when m is still -inf
        p0 = expf(s0 - m_new);    // 0 for an invalid slot
        p1 = expf(s1 - m_new);
      }
      float p_sum = p0 + p1;
#pragma unroll
      for (int offset = 8; offset > 0; offset /= 2) {
        p_sum += __shfl_xor_sync(0xffffffffu, p_sum, offset);
      }
      l = l * alpha + p_sum;
      m = m_new;

      smem.p[slot0 * Smem::P_STRIDE + sm_head] = p0;
      smem.p[slot1 * Smem::P_STRIDE + sm_head] = p1;
      if (slot0 == 0) smem.alpha[sm_head] = alpha;
    }
    __syncthreads();  // p and alpha visible to the P.V stage

    // 4. acc = acc * alpha + P . V. Slots past n_slots have p == 0 exactly, so the ragged tail is
    //    skipped without changing the result.
    {
      float alpha[B_H];
#pragma unroll
      for (int h4 = 0; h4 < B_H / 4; ++h4) {
        const float4 a = reinterpret_cast<const float4*>(smem.alpha)[h4];
        alpha[4 * h4 + 0] = a.x;
        alpha[4 * h4 + 1] = a.y;
        alpha[4 * h4 + 2] = a.z;
        alpha[4 * h4 + 3] = a.w;
      }
#pragma unroll
      for (int h = 0; h < B_H; ++h) {
        acc[h][0] *= alpha[h];
        acc[h][1] *= alpha[h];
      }
      const int chunk_slots = min(B_TOPK, n_slots - base);
#pragma unroll 2
      for (int j = 0; j < chunk_slots; ++j) {
        const float2 v = fp8x2_to_float2(
            *reinterpret_cast<const uint16_t*>(smem.kv + j * Smem::KV_STRIDE + col));
        const float4* p4 = reinterpret_cast<const float4*>(smem.p + j * Smem::P_STRIDE);
#pragma unroll
        for (int h4 = 0; h4 < B_H / 4; ++h4) {
          const float4 p = p4[h4];
          acc[4 * h4 + 0][0] = fmaf(p.x, v.x, acc[4 * h4 + 0][0]);
          acc[4 * h4 + 0][1] = fmaf(p.x, v.y, acc[4 * h4 + 0][1]);
          acc[4 * h4 + 1][0] = fmaf(p.y, v.x, acc[4 * h4 + 1][0]);
          acc[4 * h4 + 1][1] = fmaf(p.y, v.y, acc[4 * h4 + 1][1]);
          acc[4 * h4 + 2][0] = fmaf(p.z, v.x, acc[4 * h4 + 2][0]);
          acc[4 * h4 + 2][1] = fmaf(p.z, v.y, acc[4 * h4 + 2][1]);
          acc[4 * h4 + 3][0] = fmaf(p.w, v.x, acc[4 * h4 + 3][0]);
          acc[4 * h4 + 3][1] = fmaf(p.w, v.y, acc[4 * h4 + 3][1]);
        }
      }
    }
    // No barrier here: the next chunk's first barrier orders this stage's reads of smem.kv, smem.p
    // and smem.alpha before their next writes (gather and logit stage both come after it).
  }

  // Epilogue: statistics and the per-head output scale, from one thread per head.
  const int64_t stats_row = static_cast<int64_t>(q_row);
  if (slot0 == 0) {
    const int head = head_begin + sm_head;
    float out_scale = 0.f;  // no valid slot: out = 0 exactly, with or without a sink
    float lse = INFINITY;   // and lse = +inf, max_logits = m = -inf
    if (m != -INFINITY) {   // then l >= 1 (the max slot contributes exp(0))
      lse = m + logf(l);
      // The accumulators hold sum p * raw fp8 V: dequantize V here (V = kv * kv_scale) and normalize.
      out_scale = *params.kv_scale / l;
      if (params.attn_sink != nullptr && head < params.h_q) {
        // exp(lse) / (exp(lse) + exp(sink)): sink -inf -> 1; +inf or 1e30 -> 1 / inf = 0; -1e30 -> 1.
        out_scale *= 1.f / (1.f + expf(params.attn_sink[head] - lse));
      }
    }
    smem.out_scale[sm_head] = out_scale;
    if (head < params.h_q) {
      params.max_logits[stats_row * params.max_logits_stride_s +
                        static_cast<int64_t>(head) * params.max_logits_stride_h] = m;
      params.lse[stats_row * params.lse_stride_s + static_cast<int64_t>(head) * params.lse_stride_h] =
          lse;
    }
  }
  __syncthreads();  // out_scale visible

  bf16* out_row = params.out + static_cast<int64_t>(q_row) * params.out_stride_s;
#pragma unroll
  for (int h = 0; h < B_H; ++h) {
    if (h < num_heads) {
      const float out_scale = smem.out_scale[h];
      bf16* dst = out_row + static_cast<int64_t>(head_begin + h) * params.out_stride_h + col;
      dst[0] = __float2bfloat16_rn(acc[h][0] * out_scale);
      dst[1] = __float2bfloat16_rn(acc[h][1] * out_scale);
    }
  }
#endif
}

// Launches the prefill for one (D_QK, TOPK) key on `stream`. params.s_q > 0; params.topk == TOPK.
// Returns the launch error; never synchronizes.
template <int D_QK, int TOPK>
cudaError_t launch_prefill(const PrefillParams& params, cudaStream_t stream) {
  static_assert(D_QK == 512 || D_QK == 576, "d_qk must be 512 or 576");
  static_assert(D_QK >= D_V && D_QK % 16 == 0, "rows are moved in 16-byte vectors; V is the prefix");
  static_assert(TOPK > 0, "topk must be positive");
  const dim3 grid(static_cast<unsigned>(params.s_q), static_cast<unsigned>((params.h_q - 1) / B_H + 1));
  prefill_kernel<D_QK, TOPK><<<grid, NUM_THREADS, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace sparse_mla::sm90
