// Which tile a launch runs (launch.cuh asks here; python/sparse_mla/launch.py mirrors the choice in
// NARROW_TILES and Plan.tiles), and that tile as a template argument for the kernel's instantiation.
#pragma once

#include <type_traits>

#include <sparse_mla/params.cuh>
#include <sparse_mla/sm90/prefill/tiles/grouped.cuh>
#include <sparse_mla/sm90/prefill/tiles/narrow.cuh>
#include <sparse_mla/sm90/prefill/tiles/wide.cuh>
#include <sparse_mla/sm90/prefill/traits.cuh>

namespace sparse_mla::sm90::prefill {

// A token-grouped call's grouped launch runs the grouped tile. Any other launch of at most
// NARROW_HEADS heads runs the narrowest narrow tile that holds them, each halving the tensor work of
// the one above; the rest, and every split call (only the wide tile has a tail split), the wide tile.
inline Tile launch_tile(const PrefillParams& params, bool grouped) {
  if (grouped) return Tile::kGrouped;
  const bool narrow = params.h_q <= TileTraits<Tile::kNarrow>::kHeads && params.split_parts == 1;
  if (!narrow) return Tile::kWide;
  if (params.h_q <= TileTraits<Tile::kNarrow8>::kHeads) return Tile::kNarrow8;
  return params.h_q <= TileTraits<Tile::kNarrow16>::kHeads ? Tile::kNarrow16 : Tile::kNarrow;
}

// f(std::integral_constant<Tile, tile>()), the run-time tile handed to f as a constant: f instantiates
// what it needs for every tile, and the call returns what it returns for this one.
template <typename F>
auto with_tile(Tile tile, F&& f) {
  switch (tile) {
    case Tile::kNarrow: return f(std::integral_constant<Tile, Tile::kNarrow>());
    case Tile::kNarrow16: return f(std::integral_constant<Tile, Tile::kNarrow16>());
    case Tile::kNarrow8: return f(std::integral_constant<Tile, Tile::kNarrow8>());
    case Tile::kGrouped: return f(std::integral_constant<Tile, Tile::kGrouped>());
    case Tile::kWide: break;
  }
  return f(std::integral_constant<Tile, Tile::kWide>());
}

}  // namespace sparse_mla::sm90::prefill
