// The 64-byte swizzle of every operand tile (SharedStorage, traits.cuh) and the wgmma descriptors
// that read it.
#pragma once

#include <cstdint>

#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/swizzle.hpp>

#include <sparse_mla/sm90/prefill/traits.cuh>

namespace sparse_mla::sm90::prefill {

// The 64-byte swizzle, its one definition: inside a 64-byte column block, the 16-byte chunk index of
// row `row` is XORed with sw64_xor(row).
__host__ __device__ constexpr int sw64_xor(int row) { return (row >> 1) & 3; }

// Byte offset of 16-byte chunk `chunk` (of the row's D / 16) of row `row` in a swizzled tile of `rows` rows.
__host__ __device__ __forceinline__ constexpr uint32_t swizzled_offset(int row, int chunk, int rows) {
  return static_cast<uint32_t>((chunk >> 2) * (rows * 64) + row * 64 + (((chunk & 3) ^ sw64_xor(row)) << 4));
}

// Inside a column block it is CuTe's Swizzle<2, 4, 3> (bits 7-8 of the byte offset XORed into bits
// 4-5), the layout wgmma's 64-byte swizzle mode reads; the pattern repeats every 8 rows (512 bytes).
constexpr bool swizzle_is_cute_sw64() {
  for (int row = 0; row < 8; ++row) {
    for (int chunk = 0; chunk < 4; ++chunk) {
      if (swizzled_offset(row, chunk, B_TOPK) != cute::Swizzle<2, 4, 3>{}(static_cast<uint32_t>(row * 64 + chunk * 16))) return false;
    }
  }
  return true;
}
static_assert(swizzle_is_cute_sw64(), "swizzled_offset is the 64-byte swizzle wgmma reads");

// wgmma shared-memory descriptor of a K-major 64-byte-swizzled tile, from cute::GmmaDescriptor's
// fields: the leading byte offset (unused for swizzled K-major: 1 by convention), the stride byte
// offset (from one 8-row group to the next: 8 rows x 64 B), base offset 0 (tiles are 1024-byte
// aligned, so each starts a 512-byte swizzle repeat), the 64-byte swizzle mode, and start address 0
// (desc_sw64_lo adds it).
// The compiler folds them into two constants; no static_assert can check those, as a constant
// expression may not read the union's desc_ after writing its bit fields.
__device__ __forceinline__ cute::GmmaDescriptor gmma_desc_sw64_fields() {
  cute::GmmaDescriptor desc;
  desc.bitfield.leading_byte_offset_ = 1;
  desc.bitfield.stride_byte_offset_ = (8 * 64) >> 4;
  desc.bitfield.base_offset_ = 0;
  desc.bitfield.layout_type_ = static_cast<uint8_t>(cute::SM90::GMMA::LayoutType::B64);
  return desc;
}

// The descriptor in two halves. The low half holds the start address (bits 0-13, in 16-byte units)
// and the leading byte offset; the high half, the same for every tile, the stride byte offset and
// the swizzle mode. Stepping through a tile adds to the low half only: start addresses stay below
// 2^14 units (228 KB), so the add never carries out of its field.
__device__ __forceinline__ uint32_t desc_sw64_lo(uint32_t addr) {
  return ((addr & 0x3FFFF) >> 4) | gmma_desc_sw64_fields().reg32_[0];
}
__device__ __forceinline__ uint64_t desc_sw64(uint32_t lo) {
  return (static_cast<uint64_t>(gmma_desc_sw64_fields().reg32_[1]) << 32) | lo;
}

}  // namespace sparse_mla::sm90::prefill
