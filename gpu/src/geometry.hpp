// Sizes derived from a TableConfig, computed and validated once on the host.
#pragma once

#include <cstdint>

#include "gpukv/types.hpp"

namespace gpukv::detail {

// One tier's sizes. A tier with capacity 0 does not exist.
struct TierGeometry {
  std::uint64_t units = 0;          // probe units, a prime
  std::uint64_t capacity = 0;       // slots
  std::uint64_t board_words = 0;    // 64-bit ticket words
  std::uint64_t tag_bytes = 0;      // host tier: a tag byte per slot beside the board (table_ref.hpp)
  std::uint64_t max_items = 0;      // live keys allowed
  std::uint64_t cleanup_tombstones = 0;  // tombstones that trigger a clean-up
  std::uint64_t crowded_tombstones = 0;  // past max_items, tombstones that trigger a clean-up (cleanup_headroom)
};

struct Geometry {
  std::uint32_t key_words = 0;      // key_width / 8
  std::uint32_t value_stride = 0;   // value bytes per slot and per batch entry
  std::uint32_t slot_stride = 0;    // bytes per slot (both tiers)
  TierGeometry device;
  TierGeometry host;
};

// Throws Error(kInvalidArgument) with a message naming the bad setting.
Geometry make_geometry(const TableConfig& config);

// Smallest prime >= n (n >= 2).
std::uint64_t next_prime(std::uint64_t n);

}  // namespace gpukv::detail
