// Grouping a pass's operations by key, so that operations on one key take effect in batch order while all
// other operations run concurrently.
//
// Before the table is touched, every op enters its key hash into a small open-addressing table (a power of
// two, at least twice the pass size: 32 MB for a pass of 4M ops, so it stays in the GPU's L2). An entry is
// one 32-bit word:
//
//   | tag: hash bits 32..62, top bit forced (31 bits) | shared: 1 bit |        0 = empty
//
// The first op of a tag claims an entry with a CAS; a later op with the same tag sets `shared`. After the
// grouping pass an op whose entry is not shared has a key no other op of the pass carries, and runs at once.
// The others are deferred: sorted by (entry, op index) and run one entry at a time, in index order, by one
// thread (see ExecuteSegment). Two different keys may share an entry (same tag on one probe chain); that
// only serialises them, it never reorders or merges their effects. GroupOp counts the ops that joined an
// entry (Counters::joined): in a pass where none did, no entry is shared, and ExecuteOp skips reading them.
#pragma once

#include <cstdint>

#include "hd.hpp"

namespace gpukv::detail {

// Deferred ops are sorted as (entry << 32 | op): entries must fit 32 bits, so a pass holds at most 2^24 ops
// (entries <= 2^25).
inline constexpr std::uint64_t kMaxPassOps = (std::uint64_t{1} << 24) - 1;
inline constexpr std::uint32_t kGroupShared = 1;

GPUKV_HD_INLINE std::uint32_t group_tag(std::uint64_t h) {
  return (static_cast<std::uint32_t>(h >> 32) | 0x80000000u) & ~kGroupShared;
}

// Adds one op with key hash h; returns its entry index, and sets `joined` if an earlier op holds the entry.
GPUKV_HD_INLINE std::uint32_t group_insert(std::uint32_t* groups, std::uint64_t mask, std::uint64_t h, bool& joined) {
  joined = false;
  const std::uint32_t tag = group_tag(h);
  for (std::uint64_t pos = h & mask;; pos = (pos + 1) & mask) {
    atomic_ref<std::uint32_t> entry(groups[pos]);
    // CAS without a load first: the entry is usually empty, and a failed CAS returns what is there.
    std::uint32_t seen = 0;
    if (entry.compare_exchange_strong(seen, tag, memory_order_relaxed)) return static_cast<std::uint32_t>(pos);
    if ((seen & ~kGroupShared) == tag) {
      joined = true;
      if ((seen & kGroupShared) == 0) entry.fetch_or(kGroupShared, memory_order_relaxed);
      return static_cast<std::uint32_t>(pos);
    }
  }
}

GPUKV_HD_INLINE bool group_shared(const std::uint32_t* groups, std::uint32_t entry) {
  return (groups[entry] & kGroupShared) != 0;
}

}  // namespace gpukv::detail
