// The pipeline between the producer and the consumers: the mbarriers of SharedStorage (traits.cuh) that
// hand the Q tile and the KV stages over, how many arrivals complete each, and the cursors from which
// both roles derive each barrier's stage and parity.
#pragma once

#include <cstdint>

#include <sparse_mla/sm90/prefill/traits.cuh>

namespace sparse_mla::sm90::prefill {

// How the producer hands a block over (producer.cuh). The wide and grouped tiles: each producer thread
// waits for its copies to land, fences them for the async proxy and arrives. The narrow tiles: the
// copies' landing arrives by itself (cp.async.mbarrier.arrive.noinc), lane 0 of each warp arrives
// once more after writing the valid bits, and each consumer fences after its wait; so the producer
// never waits for a copy, and with the narrow consumers' early release (tiles/narrow.cuh) two pairs' copies
// are in flight. The wide tile's consumers could not use it: there the fence on every Q.K^T's path
// costs more than the producer's waits (docs/lab.md, Experiment 35), and they release a pair only
// after the next one arrived, so one pair is in flight either way.
// Paged rows (KvLayout::kPaged) never arrive by themselves: the producer requantizes them once they
// landed (gather.cuh), so it waits for them at every tile.
template <Tile TILE, KvLayout LAYOUT = KvLayout::kContiguous>
constexpr bool copies_arrive() { return TileTraits<TILE>::kCopiesArrive && LAYOUT == KvLayout::kContiguous; }
// Arrivals that complete q_full and kv_full: one per producer thread (once its copies landed and were
// fenced, or its copies' landing), on kv_full where the copies arrive by themselves also lane 0 of
// each producer warp after its valid bits (otherwise its one arrival comes after them).
template <Tile TILE, KvLayout LAYOUT = KvLayout::kContiguous>
constexpr int kv_full_arrivals() {
  return NUM_PRODUCER_THREADS + (copies_arrive<TILE, LAYOUT>() ? NUM_PRODUCER_THREADS / 32 : 0);
}
constexpr int Q_FULL_ARRIVALS = NUM_PRODUCER_THREADS;
// Every consumer thread arrives on kv_empty and q_empty, so that each thread's own shared-memory
// reads are released to the producer (an arrival by one lane would release only that lane's).
constexpr int KV_EMPTY_ARRIVALS = NUM_CONSUMER_THREADS;
constexpr int Q_EMPTY_ARRIVALS = NUM_CONSUMER_THREADS;

// A position in a ring of STAGES buffers that mbarriers hand between the roles (CUTLASS's
// PipelineState): the buffer `index` to use and the parity `phase` of its mbarrier phase to wait for,
// both derived from the count of the CTA's earlier uses of the ring, across work units. A cursor is
// made from the count where it is used rather than stepped by an advance: where the index and the
// phase are computed shapes the pair loops' SASS, and this keeps them where the kernel computed them
// before the cursor existed (the stepped form compiles to a different schedule).
template <int STAGES>
struct PipelineState {
  int count;       // uses of the ring by this CTA before this one
  int index;       // the buffer
  uint32_t phase;  // parity of the phase that fills the buffer this time (kv_full, q_full)

  __device__ __forceinline__ explicit PipelineState(int count)
      : count(count), index(count % STAGES), phase((count / STAGES) & 1) {}
  // The buffer was used before: its refill waits for the release of that use (kv_empty, q_empty), at
  // parity empty_phase().
  __device__ __forceinline__ bool reused() const { return count >= STAGES; }
  __device__ __forceinline__ uint32_t empty_phase() const { return ((count / STAGES) - 1) & 1; }
  __device__ __forceinline__ PipelineState next() const { return PipelineState(count + 1); }
};
using QStage = PipelineState<1>;            // the Q tile: one buffer, q_full and q_empty
using KvStage = PipelineState<NUM_STAGES>;  // the KV stages, one pair of blocks each: kv_full, kv_empty

}  // namespace sparse_mla::sm90::prefill
