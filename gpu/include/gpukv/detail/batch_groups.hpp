// Grouping a pass's operations by key, so that operations on one key take effect in batch order while all
// other operations run concurrently.
//
// Before the table is touched, every op enters its key hash into a small open-addressing table (a power of
// two, at least twice the pass size, so it stays in the GPU's L2 for passes of up to about a million ops).
// An entry is one 64-bit word:
//
//   | tag: hash bits 24..63 (40 bits) | count: 24 bits |        0 = empty
//
// After the grouping pass an op whose entry counts 1 shares its key with no other op of the pass and runs at
// once. The others are deferred: sorted by (entry, op index) and run one entry at a time, in index order, by
// one thread (see ExecuteSegment). Two different keys may share an entry (same tag on one probe chain); that
// only serialises them, it never reorders or merges their effects.
#pragma once

#include <cstdint>

#include "gpukv/detail/hd.hpp"

namespace gpukv::detail {

inline constexpr std::uint64_t kGroupCountBits = 24;
inline constexpr std::uint64_t kGroupCountMask = (std::uint64_t{1} << kGroupCountBits) - 1;
inline constexpr std::uint64_t kMaxPassOps = kGroupCountMask;  // a count must not overflow into the tag

// Adds one op with key hash h; returns its entry index.
GPUKV_HD_INLINE std::uint32_t group_insert(std::uint64_t* groups, std::uint64_t mask, std::uint64_t h) {
  const std::uint64_t tag = h & ~kGroupCountMask;
  for (std::uint64_t pos = h & mask;; pos = (pos + 1) & mask) {
    atomic_ref<std::uint64_t> entry(groups[pos]);
    std::uint64_t seen = entry.load(memory_order_relaxed);
    if (seen == 0) {
      if (entry.compare_exchange_strong(seen, tag | 1, memory_order_relaxed)) return static_cast<std::uint32_t>(pos);
    }
    if ((seen & ~kGroupCountMask) == tag) {
      entry.fetch_add(1, memory_order_relaxed);
      return static_cast<std::uint32_t>(pos);
    }
  }
}

GPUKV_HD_INLINE std::uint64_t group_count(const std::uint64_t* groups, std::uint32_t entry) {
  return groups[entry] & kGroupCountMask;
}

}  // namespace gpukv::detail
