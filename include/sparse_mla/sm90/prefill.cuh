// FP8 sparse MLA prefill on SM90: tensor-core kernel (wgmma, sm_90a) with exact fp32 logits.
//
// Drop-in replacement for the exact fp32 kernel, same interface and semantics (SPEC §3, §4).
//
// Numerics. FP8 wgmma sums its products at reduced precision (about 14 bits), which moves the lse of
// a single-slot row by ~2e-4 relative and flips near-tied maxima of very peaked softmaxes. So Q.K^T
// runs on f16 wgmma instead: every e4m3 value converts exactly to f16 (cvt.rn.f16x2.e4m3x2), f16 x f16
// products are exact, and the accumulation is fp32, so the logits match an fp32 dot product of the
// dequantized inputs to fp32 rounding. P.V stays on FP8 wgmma: P rounded to e4m3 is the documented
// out-error floor (SPEC §8); V (e4m3) is exact.
//
// Work decomposition: one CTA per (query token, 64-head block), 256 threads = 2 warpgroups (WG0, WG1).
// topk is processed in chunks of B_TOPK = 64 KV rows, gathered with 16-byte cp.async (zero-filled,
// never dereferenced for invalid slots) into one fp8 staging tile G: thread t moves row t / 4, 16-byte
// chunks 4i + t % 4. The gather of chunk c + 1 is issued as soon as G has been consumed for chunk c,
// so it overlaps chunk c's Q.K^T, softmax and P.V. Iteration c:
//   P.V(c - 1)  (c > 0) O_w = O_w * alpha + P . VT[256w .. 256w + 256)^T, wgmma m64n256k32 e4m3 (SS),
//        WG w owns output columns [256w, 256w + 256); committed, not yet waited for
//   validity bits of this thread's 8 S columns and the gather index of chunk c + 2 (loaded while the
//        barrier below waits)
//   [G]  G(c) landed (cp.async.wait_group 0 + barrier); WG w writes K16 = f16(G) for its tokens
//        [32w, 32w + 32) (P.V(c - 1) reads only VT and P)
//   [K]  (named barrier 1 + w, the WG's 128 threads) its K16 rows complete; issue
//        S_w = Q16[64 x D_QK] . K16[32w .. 32w + 32)^T, wgmma m64n32k16 f16 -> f32 (SS), D_QK / 16
//        steps, one group; wait_group 1 (P.V(c - 1) done, S_w in flight); WG w transposes the V
//        columns [256w, 256w + 256) of G into VT
//   [C]  G read, VT complete; issue the gather of chunk c + 1 into G; wait_group 0 (S_w)
//   online softmax in the exp2 domain; row maxima of the two WGs exchanged through MAX
//   [A]  both maxima visible; P (e4m3, 64 x 64) written by both WGs (their token halves)
//   [B]  P complete
// After the loop: P.V of the last chunk, waited for. P.V is issued at the top of the next iteration
// rather than at the end of its own one because a wgmma group left in flight across the loop's back
// edge makes ptxas serialize every wgmma of the kernel (C7515).
// [G], [C], [A], [B] are __syncthreads (all 256 threads). Generic-proxy writes that wgmma (async
// proxy) reads are fenced with fence.proxy.async before the barrier that publishes them: Q16 before
// [G] of chunk 0 (each WG reads all 64 Q rows), K16 before [K], VT before [C], P before [B].
// Hazards this order covers: K16 rows of WG w are written and read only by WG w, and its Q.K^T(c - 1)
// was waited for before its softmax; VT half w is written and read only by WG w, after its own
// wait for P.V(c - 1); P(c) is written after [A](c), and both WGs waited for P.V(c - 1) before [C](c);
// G is overwritten (gather of c + 1) only after [C](c), when every read of it is done; MAX is written
// before [A](c + 1) and read between [A](c) and [B](c), so [G](c + 1) and [C](c + 1) separate them.
//
// Shared memory (byte offsets from a 1024-byte aligned base; D = D_QK):
//   Q16  64 x D f16        73,728 B at D = 576   Q of this CTA's heads (zero past h_q), K-major
//   K16  64 x D f16        73,728 B              the chunk's K rows as f16, K-major
//   G    64 x D e4m3       36,864 B              gather staging tile (zero rows for invalid slots)
//   VT   512 x 64 e4m3     32,768 B              V^T of the chunk (rows = output columns), K-major
//   P    64 x 64 e4m3       4,096 B              probabilities (rows = heads), K-major
//   MAX  float [2 wg][64],  L float [2 wg][64]   row-max exchange, final row sums
// Total 223,232 B (incl. 1,024 B alignment slack) at D = 576, 202,752 B at D = 512 (limit 232,448).
//
// Operand tile layout (verified on the H200 for e4m3 by wgmma_v0 and for f16 by this kernel's GPU
// tier; the same bytes for both): every K-major tile
// of R rows is stored as column blocks of 64 bytes, block b at b * R * 64, row r at r * 64 inside it,
// and the 16-byte chunk c (0..3) of a row at ((c ^ ((r >> 1) & 3)) * 16): the 64-byte swizzle (CuTe
// Swizzle<2,4,3>) on tile bases aligned to 1024 bytes. wgmma's canonical layouts are defined in
// 16-byte units whatever the element type, so the same tiles serve e4m3 (k32) and f16 (k16): one k-step
// is 32 bytes of every row either way. Descriptor: layout type 2 (B64), SBO = 512 (8 rows x 64 B),
// LBO unused (1); k-step kk starts at block kk / 2, byte (kk % 2) * 32. WG1's Q.K^T operand starts
// 32 rows (2,048 B, a multiple of the 512-byte swizzle period) into K16. G uses the same layout (as in
// wgmma_v0, whose VT transpose carries over); it is read by ordinary loads only.
//
// Alignment relied on (checked by entry.cuh / validate.py): q and kv 16-byte aligned with strides
// that are multiples of 16 elements (16-byte loads and cp.async of Q and KV rows). out is written as
// bf16 pairs when the row start is 4-byte aligned, else one bf16 at a time.
//
// Launch: grid (s_q, ceil(h_q / 64)), 256 threads, one CTA per SM (dynamic shared memory above).
#pragma once

#include <cmath>
#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <sparse_mla/params.cuh>

namespace sparse_mla::sm90 {

constexpr int D_V = 512;
constexpr int B_H = 64;          // query heads per CTA (the wgmma M)
constexpr int B_TOPK = 64;       // KV rows per chunk
constexpr int NUM_THREADS = 256; // 2 warpgroups

namespace wgk {

template <int D_QK>
struct Layout {
  static constexpr int Q_BYTES = B_H * D_QK * 2;
  static constexpr int K_BYTES = B_TOPK * D_QK * 2;
  static constexpr int G_BYTES = B_TOPK * D_QK;
  static constexpr int VT_BYTES = D_V * B_TOPK;
  static constexpr int P_BYTES = B_H * B_TOPK;
  static constexpr int Q_OFF = 0;
  static constexpr int K_OFF = Q_OFF + Q_BYTES;
  static constexpr int G_OFF = K_OFF + K_BYTES;
  static constexpr int VT_OFF = G_OFF + G_BYTES;
  static constexpr int P_OFF = VT_OFF + VT_BYTES;
  static constexpr int MAX_OFF = P_OFF + P_BYTES;       // float [2 wg][64 rows]
  static constexpr int L_OFF = MAX_OFF + 2 * 64 * 4;    // float [2 wg][64 rows]
  static constexpr int TOTAL = L_OFF + 2 * 64 * 4;
  static constexpr int ALLOC = TOTAL + 1024;  // slack for aligning the base to 1024
  static_assert(Q_BYTES % 1024 == 0 && K_BYTES % 1024 == 0 && G_BYTES % 1024 == 0 &&
                VT_BYTES % 1024 == 0 && P_BYTES % 1024 == 0, "operand tiles stay 1024-byte aligned");
  static_assert(ALLOC <= 232448, "fits the 227 KB per-block shared-memory limit");
};

// Byte offset of 16-byte chunk `chunk` (along K) of row `row` in a 64B-swizzled tile of `rows` rows.
__device__ __forceinline__ uint32_t sw64(int row, int chunk, int rows) {
  return static_cast<uint32_t>((chunk >> 2) * (rows * 64) + row * 64 + (((chunk & 3) ^ ((row >> 1) & 3)) << 4));
}

__device__ __forceinline__ uint64_t desc_sw64(uint32_t smem_addr) {
  uint64_t d = static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>(1) << 16;          // LBO (unused: swizzled K-major)
  d |= static_cast<uint64_t>(512 >> 4) << 32;   // SBO: 8 rows x 64 B
  d |= static_cast<uint64_t>(2) << 62;          // 64-byte swizzle
  return d;
}

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int src_size = valid ? 16 : 0;  // 0: zero-fill, nothing is read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_size)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
template <int ID>
__device__ __forceinline__ void warpgroup_barrier() {  // the 128 threads of one warpgroup
  asm volatile("bar.sync %0, 128;\n" ::"n"(ID) : "memory");
}
template <int N>
__device__ __forceinline__ void fence_operand(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}
// rows a, b, c, d of 4 bytes each -> columns: out[k] = {a.k, b.k, c.k, d.k} (lowest byte first).
__device__ __forceinline__ void transpose4x4(uint32_t a, uint32_t b, uint32_t c, uint32_t d, uint32_t (&o)[4]) {
  const uint32_t t0 = prmt(a, b, 0x5140), t1 = prmt(c, d, 0x5140);
  const uint32_t t2 = prmt(a, b, 0x7362), t3 = prmt(c, d, 0x7362);
  o[0] = prmt(t0, t1, 0x5410);
  o[1] = prmt(t0, t1, 0x7632);
  o[2] = prmt(t2, t3, 0x5410);
  o[3] = prmt(t2, t3, 0x7632);
}
// Two e4m3 (lowest byte first) -> two f16 (lowest half first), exact.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t packed) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(packed & 0xffffu), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}
// 16 e4m3 values -> 32 bytes of f16 at tile + lo and tile + hi (two 16-byte chunks).
__device__ __forceinline__ void store_as_f16(uint8_t* tile, uint32_t lo_off, uint32_t hi_off, uint4 v) {
  const uint4 lo = make_uint4(e4m3x2_to_f16x2(v.x), e4m3x2_to_f16x2(v.x >> 16), e4m3x2_to_f16x2(v.y),
                              e4m3x2_to_f16x2(v.y >> 16));
  const uint4 hi = make_uint4(e4m3x2_to_f16x2(v.z), e4m3x2_to_f16x2(v.z >> 16), e4m3x2_to_f16x2(v.w),
                              e4m3x2_to_f16x2(v.w >> 16));
  *reinterpret_cast<uint4*>(tile + lo_off) = lo;
  *reinterpret_cast<uint4*>(tile + hi_off) = hi;
}

__device__ __forceinline__ void wgmma_m64n32k16_f16(float (&d)[16], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_m64n256k32_e4m3(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

}  // namespace wgk

template <int D_QK, int TOPK>
__global__ void __launch_bounds__(NUM_THREADS, 1) prefill_kernel(const __grid_constant__ PrefillParams params) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 900 || !defined(__CUDA_ARCH_FEAT_SM90_ALL))
  __trap();  // built for the wrong target (wgmma needs sm_90a)
#else
  using namespace wgk;
  using L = Layout<D_QK>;
  constexpr int QK_STEPS = D_QK / 16;   // f16 k16 steps (32 bytes each)
  constexpr int ROW_ITERS = D_QK / 64;  // 16-byte e4m3 chunks per thread when 4 threads move a row
  static_assert(B_H == B_TOPK && NUM_THREADS == 4 * B_TOPK && D_QK % 64 == 0,
                "row movers: thread t moves e4m3 chunks 4i + t % 4 of row t / 4 of Q, G and K16");
  constexpr float LN2 = 0.6931471805599453f;

  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base_addr = (raw_addr + 1023u) & ~1023u;
  uint8_t* base = smem_raw + (base_addr - raw_addr);
  const uint32_t q_addr = base_addr + L::Q_OFF;
  const uint32_t k_addr = base_addr + L::K_OFF;
  const uint32_t g_addr = base_addr + L::G_OFF;
  const uint32_t vt_addr = base_addr + L::VT_OFF;
  const uint32_t p_addr = base_addr + L::P_OFF;
  uint8_t* q_ptr = base + L::Q_OFF;
  uint8_t* k_ptr = base + L::K_OFF;
  const uint8_t* g_ptr = base + L::G_OFF;
  uint8_t* vt_ptr = base + L::VT_OFF;
  uint8_t* p_ptr = base + L::P_OFF;
  float* max_buf = reinterpret_cast<float*>(base + L::MAX_OFF);
  float* l_buf = reinterpret_cast<float*>(base + L::L_OFF);

  const int tid = threadIdx.x;
  const int wg = tid / 128;          // warpgroup: owns tokens [32wg, 32wg+32) of S, columns [256wg, +256) of O
  const int wtid = tid % 128;
  const int warp = wtid / 32;        // warp inside the warpgroup
  const int lane = tid % 32;
  const int row0 = warp * 16 + lane / 4;  // accumulator rows row0 and row0 + 8
  const int q_row = blockIdx.x;
  const int head_begin = blockIdx.y * B_H;
  const int num_heads = min(B_H, params.h_q - head_begin);

  int n_slots = TOPK;
  if (params.topk_length != nullptr) n_slots = min(max(params.topk_length[q_row], 0), TOPK);
  const int n_chunks = (n_slots + B_TOPK - 1) / B_TOPK;

  const float scale2 = static_cast<float>(static_cast<double>(params.sm_scale) *
                                          static_cast<double>(*params.q_scale) *
                                          static_cast<double>(*params.kv_scale) * 1.4426950408889634);
  const int32_t* slot_indices = params.indices + static_cast<int64_t>(q_row) * TOPK;
  const uint8_t* kv_base = reinterpret_cast<const uint8_t*>(params.kv);
  const int s_kv = params.s_kv;

  // Row-mover role (Q load, gather, K16 conversion): row mv_row, e4m3 chunks 4i + mv_j (i < ROW_ITERS).
  // In a 64-row swizzled tile, e4m3 chunk 4i + j sits at sw64(r, j) + i * 4096 and its f16 chunks
  // 8i + 2j and 8i + 2j + 1 at sw64(r, 2j) + i * 8192 and sw64(r, 2j + 1) + i * 8192.
  const int mv_row = tid / 4, mv_j = tid % 4;
  const uint32_t mv_g = sw64(mv_row, mv_j, B_TOPK);
  const uint32_t mv_lo = sw64(mv_row, 2 * mv_j, B_TOPK), mv_hi = sw64(mv_row, 2 * mv_j + 1, B_TOPK);

  // The index of this thread's gather row in chunk c (-1 past the slot count). Loaded two chunks
  // ahead, so the gather is issued without waiting for it.
  auto gather_index = [&](int c) {
    const int slot = c * B_TOPK + mv_row;
    return slot < n_slots ? __ldg(slot_indices + slot) : -1;
  };
  // Gather a chunk into G: each thread one row's chunks, 16 bytes per cp.async, zero-fill for an
  // invalid slot (its row is never read).
  auto issue_gather = [&](int32_t idx) {
    const bool valid = idx >= 0 && idx < s_kv;
    const uint8_t* src = kv_base + (valid ? static_cast<int64_t>(idx) * params.kv_stride_s : 0) + mv_j * 16;
#pragma unroll
    for (int i = 0; i < ROW_ITERS; ++i) cp_async_16(g_addr + mv_g + i * (B_TOPK * 64), src + i * 64, valid);
    cp_async_commit();
  };

  if (n_chunks > 0) {
    issue_gather(gather_index(0));
    // Q: 64 rows (zero past num_heads) -> Q16.
    const bool q_valid = mv_row < num_heads;
    const uint8_t* q_src = reinterpret_cast<const uint8_t*>(params.q) + static_cast<int64_t>(q_row) * params.q_stride_s +
                           (q_valid ? static_cast<int64_t>(head_begin + mv_row) * params.q_stride_h : 0) + mv_j * 16;
    uint4 qv[ROW_ITERS];
#pragma unroll
    for (int i = 0; i < ROW_ITERS; ++i) {
      qv[i] = q_valid ? __ldg(reinterpret_cast<const uint4*>(q_src + i * 64)) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int i = 0; i < ROW_ITERS; ++i) store_as_f16(q_ptr, mv_lo + i * (B_H * 128), mv_hi + i * (B_H * 128), qv[i]);
    fence_proxy_async();  // Q16 -> wgmma; every WG reads all 64 rows: published by chunk 0's [G]
  }

  float o[128];
  float s[16];  // Q.K^T accumulators (each chunk's first k-step ignores their old value)
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
#pragma unroll
  for (int j = 0; j < 16; ++j) s[j] = 0.f;
  float m[2] = {-INFINITY, -INFINITY};  // running max, log2 domain (rows row0, row0 + 8)
  float l[2] = {0.f, 0.f};              // this thread's partial running sum
  float alpha[2] = {0.f, 0.f};          // rescale of O for the pending P.V

  // O = O * alpha + P . V (this WG's 256 columns), committed, not waited for. It is issued at the top
  // of the next chunk's iteration (and after the loop for the last chunk) and waited for in the same
  // iteration: a wgmma group left in flight across the loop's back edge makes ptxas serialize every
  // wgmma of the kernel (C7515).
  auto issue_pv = [&]() {
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
    fence_operand(o);  // keeps the rescale before wgmma.fence
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      wgmma_m64n256k32_e4m3(o, desc_sw64(p_addr + kk * 32), desc_sw64(vt_addr + wg * 256 * 64 + kk * 32), 1);
    }
    wgmma_commit();
    fence_operand(o);
  };

  int32_t idx_next = gather_index(1);  // gather index of chunk c + 1
  for (int c = 0; c < n_chunks; ++c) {
    if (c > 0) issue_pv();  // P.V of chunk c - 1 (P and VT complete since [B] of chunk c - 1)
    const int32_t idx_next2 = gather_index(c + 2);

    // Validity of this thread's 8 tokens: 32wg + 8nb + 2(lane%4) + e.
    uint32_t valid_bits = 0;
#pragma unroll
    for (int nb = 0; nb < 4; ++nb) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int slot = c * B_TOPK + wg * 32 + nb * 8 + 2 * (lane & 3) + e;
        int32_t idx = -1;
        if (slot < n_slots) idx = __ldg(slot_indices + slot);
        if (idx >= 0 && idx < s_kv) valid_bits |= 1u << (nb * 2 + e);
      }
    }

    cp_async_wait_all();
    __syncthreads();  // [G] G(c) visible to everyone

    // K16 = f16(G) for this WG's 32 rows (row tid / 4); P.V(c - 1) may still run (it reads VT and P).
#pragma unroll
    for (int i = 0; i < ROW_ITERS; ++i) {
      store_as_f16(k_ptr, mv_lo + i * (B_TOPK * 128), mv_hi + i * (B_TOPK * 128),
                   *reinterpret_cast<const uint4*>(g_ptr + mv_g + i * (B_TOPK * 64)));
    }

    fence_proxy_async();           // K16 (and Q16): generic writes -> wgmma (async proxy) reads
    if (wg == 0) {                 // [K] this WG's 32 K16 rows complete
      warpgroup_barrier<1>();
    } else {
      warpgroup_barrier<2>();
    }

    // S = Q . K^T for this WG's 32 tokens, f16 operands, fp32 accumulation; in flight during the VT
    // transpose and [C].
    {
      // Step kk adds its byte offset / 16 to the start-address field (addresses < 256 KB: no carry out
      // of the 14-bit field). The opaque bases keep ptxas from hoisting all 2 * QK_STEPS descriptors
      // out of the chunk loop into registers.
      uint64_t dq = desc_sw64(q_addr), dk = desc_sw64(k_addr + wg * 32 * 64);
      asm volatile("" : "+l"(dq), "+l"(dk));
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < QK_STEPS; ++kk) {
        wgmma_m64n32k16_f16(s, dq + (((kk >> 1) * (B_H * 64) + (kk & 1) * 32) >> 4),
                            dk + (((kk >> 1) * (B_TOPK * 64) + (kk & 1) * 32) >> 4), kk > 0 ? 1 : 0);
      }
      wgmma_commit();
    }

    // This WG's P.V of the previous chunk read VT half wg and P: finish it (Q.K^T(c), committed
    // after it, may stay in flight) before rewriting them.
    wgmma_wait<1>();
    fence_operand(o);

    // V^T for this WG's 256 columns: thread owns 16 columns x 8 tokens.
    {
      const int tg = wtid & 7, cg = wtid >> 3;  // a warp: 8 token groups x 4 column groups (4-way store conflicts, not 16)
      const int d0 = wg * 256 + cg * 16;
      const int t0 = tg * 8;
      uint32_t x[8][4];
#pragma unroll
      for (int r = 0; r < 8; ++r) {
        const uint4 v = *reinterpret_cast<const uint4*>(g_ptr + sw64(t0 + r, d0 / 16, B_TOPK));
        x[r][0] = v.x; x[r][1] = v.y; x[r][2] = v.z; x[r][3] = v.w;
      }
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        uint32_t lo[4], hi[4];
        transpose4x4(x[0][q], x[1][q], x[2][q], x[3][q], lo);
        transpose4x4(x[4][q], x[5][q], x[6][q], x[7][q], hi);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int d = d0 + 4 * q + k;
          const uint32_t off = static_cast<uint32_t>(d * 64 + ((((t0 >> 4)) ^ ((d >> 1) & 3)) << 4) + (t0 & 15));
          *reinterpret_cast<uint2*>(vt_ptr + off) = make_uint2(lo[k], hi[k]);
        }
      }
    }
    fence_proxy_async();  // VT: generic writes -> wgmma (async proxy) reads
    __syncthreads();      // [C] VT complete, G fully read

    if (c + 1 < n_chunks) issue_gather(idx_next);
    idx_next = idx_next2;

    wgmma_wait_all();  // Q.K^T(c), the only group left
    fence_operand(s);

    // Online softmax (log2 domain).
    float t[16];  // logits, log2 domain (a copy: the wgmma accumulators are never redefined)
    float mloc[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const bool v = (valid_bits >> ((j >> 2) * 2 + (j & 1))) & 1u;
      t[j] = v ? s[j] * scale2 : -INFINITY;
      mloc[(j >> 1) & 1] = fmaxf(mloc[(j >> 1) & 1], t[j]);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mloc[h] = fmaxf(mloc[h], __shfl_xor_sync(0xffffffffu, mloc[h], 1));
      mloc[h] = fmaxf(mloc[h], __shfl_xor_sync(0xffffffffu, mloc[h], 2));
    }
    if ((lane & 3) == 0) {
      max_buf[wg * 64 + row0] = mloc[0];
      max_buf[wg * 64 + row0 + 8] = mloc[1];
    }
    __syncthreads();  // [A] both halves' maxima visible
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float other = max_buf[(1 - wg) * 64 + row0 + 8 * h];
      const float m_new = fmaxf(m[h], fmaxf(mloc[h], other));
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      alpha[h] = ex2(m[h] - m_use);  // 0 while m is -inf (accumulators are still 0)
      m[h] = m_new;
      mloc[h] = m_use;
    }
    float psum[2] = {0.f, 0.f};
#pragma unroll
    for (int nb = 0; nb < 4; ++nb) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float p0 = ex2(t[nb * 4 + h * 2 + 0] - mloc[h]);
        const float p1 = ex2(t[nb * 4 + h * 2 + 1] - mloc[h]);
        psum[h] += p0 + p1;
        const __nv_fp8x2_storage_t pk = __nv_cvt_float2_to_fp8x2(make_float2(p0, p1), __NV_SATFINITE, __NV_E4M3);
        const int row = row0 + 8 * h;
        const int tok = wg * 32 + nb * 8 + 2 * (lane & 3);
        const uint32_t off = static_cast<uint32_t>(row * 64 + ((((tok >> 4)) ^ ((row >> 1) & 3)) << 4) + (tok & 15));
        *reinterpret_cast<uint16_t*>(p_ptr + off) = static_cast<uint16_t>(pk);
      }
    }
    l[0] = l[0] * alpha[0] + psum[0];
    l[1] = l[1] * alpha[1] + psum[1];
    fence_proxy_async();
    __syncthreads();  // [B] P complete (both halves)
  }
  if (n_chunks > 0) {
    issue_pv();
    wgmma_wait_all();
    fence_operand(o);
  }

  // Epilogue: full row sums, statistics, output.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }
  if ((lane & 3) == 0) {
    l_buf[wg * 64 + row0] = l[0];
    l_buf[wg * 64 + row0 + 8] = l[1];
  }
  __syncthreads();
  const float kv_scale = *params.kv_scale;
  float out_scale[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + 8 * h;
    const float lsum = l_buf[row] + l_buf[64 + row];
    const int head = head_begin + row;
    float os = 0.f, lse = INFINITY, mx = -INFINITY;
    if (m[h] != -INFINITY) {
      lse = (m[h] + log2f(lsum)) * LN2;
      mx = m[h] * LN2;
      os = kv_scale / lsum;
      if (params.attn_sink != nullptr && head < params.h_q) {
        os *= 1.f / (1.f + expf(params.attn_sink[head] - lse));
      }
    }
    out_scale[h] = os;
    if (wg == 0 && (lane & 3) == 0 && row < num_heads) {
      params.max_logits[static_cast<int64_t>(q_row) * params.max_logits_stride_s +
                        static_cast<int64_t>(head) * params.max_logits_stride_h] = mx;
      params.lse[static_cast<int64_t>(q_row) * params.lse_stride_s + static_cast<int64_t>(head) * params.lse_stride_h] = lse;
    }
  }
  bf16* out_row = params.out + static_cast<int64_t>(q_row) * params.out_stride_s;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + 8 * h;
    if (row < num_heads) {
      bf16* dst_row = out_row + static_cast<int64_t>(head_begin + row) * params.out_stride_h + wg * 256 + 2 * (lane & 3);
      const bool aligned = (reinterpret_cast<uintptr_t>(dst_row) & 3) == 0;
#pragma unroll
      for (int nb = 0; nb < 32; ++nb) {
        const float v0 = o[nb * 4 + h * 2 + 0] * out_scale[h];
        const float v1 = o[nb * 4 + h * 2 + 1] * out_scale[h];
        bf16* dst = dst_row + nb * 8;
        if (aligned) {
          *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(v0, v1);
        } else {
          dst[0] = __float2bfloat16_rn(v0);
          dst[1] = __float2bfloat16_rn(v1);
        }
      }
    }
  }
#endif
}

// Launches the prefill for one (D_QK, TOPK) key on `stream`. params.s_q > 0; params.topk == TOPK.
// Returns the launch error; never synchronizes.
template <int D_QK, int TOPK>
cudaError_t launch_prefill(const PrefillParams& params, cudaStream_t stream) {
  static_assert(D_QK == 512 || D_QK == 576, "d_qk must be 512 or 576");
  static_assert(TOPK > 0, "topk must be positive");
  constexpr int smem_bytes = wgk::Layout<D_QK>::ALLOC;
  cudaError_t err = cudaFuncSetAttribute(prefill_kernel<D_QK, TOPK>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(params.s_q), static_cast<unsigned>((params.h_q - 1) / B_H + 1));
  prefill_kernel<D_QK, TOPK><<<grid, NUM_THREADS, smem_bytes, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace sparse_mla::sm90
