// Grouping a pass's operations by key, so that operations on one key take effect in batch order while all
// other operations run concurrently.
//
// Before the table is touched, every op enters its key hash into a small open-addressing table (a power of
// two, at least twice the pass size: 32 MB for a pass of 4M ops, so it stays in the GPU's L2). An entry is
// one 32-bit word:
//
//   | tag: hash bits 32..62, top bit forced (31 bits) | shared: 1 bit |        0 = empty
//
// An op probes the entries from its hash's on, one by one in a table L2 holds, a bucket of 8 (one 32-byte
// sector, loaded at once; `groups` is 16-byte aligned, as every device allocation is) at a time in a larger
// one (groups_by_bucket). The first op of a tag claims an entry with a CAS; a later op with the same tag sets
// `shared`. After the grouping pass an op whose entry is not shared has a key no other op of the pass
// carries, and runs at once. The others are deferred: sorted by (entry, op index) and run one entry at a
// time, in index order, by one thread (see ExecuteSegment). Two different keys may share an entry (same tag
// on one probe chain); that only serialises them, it never reorders or merges their effects. GroupOp counts
// the ops that joined an entry (Counters::joined): in a pass where none did, no entry is shared, and
// ExecuteOp skips reading them.
#pragma once

#include <bit>
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

// A probe examines a bucket of entries at once: 8 entries, one 32-byte sector, loaded together.
inline constexpr std::uint64_t kGroupBucket = 8;

// The entries of the bucket that starts at `first` (a multiple of kGroupBucket), as relaxed loads.
GPUKV_HD_INLINE void load_group_bucket(std::uint32_t* groups, std::uint64_t first, std::uint32_t (&e)[kGroupBucket]) {
#if defined(__CUDA_ARCH__)
  asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(e[0]), "=r"(e[1]), "=r"(e[2]), "=r"(e[3]) : "l"(groups + first) : "memory");
  asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(e[4]), "=r"(e[5]), "=r"(e[6]), "=r"(e[7]) : "l"(groups + first + 4) : "memory");
#else
GPUKV_UNROLL
  for (std::uint64_t j = 0; j < kGroupBucket; ++j) {
    e[j] = atomic_ref<std::uint32_t>(groups[first + j]).load(memory_order_relaxed);
  }
#endif
}

// Adds one op with key hash h to a table of mask + 1 entries; returns its entry index, and sets `joined` if
// an earlier op holds the entry. Probing entry by entry from the hash's, a CAS first: an op whose entry is
// empty takes it in one round trip.
GPUKV_HD_INLINE std::uint32_t group_insert_by_entry(std::uint32_t* groups, std::uint64_t mask, std::uint64_t h,
                                                    bool& joined) {
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

// group_insert_by_entry() probing a bucket at a time. A bucket's entries fill in order (an op takes the
// first empty one it sees, and entries are never cleared within a pass), so its taken entries are a prefix:
// the op looks for its tag there, or takes the first empty entry with a CAS. One load and one CAS per op,
// where probing entry by entry took a warp as many round trips as its longest chain.
GPUKV_HD_INLINE std::uint32_t group_insert_by_bucket(std::uint32_t* groups, std::uint64_t mask, std::uint64_t h,
                                                     bool& joined) {
  joined = false;
  const std::uint32_t tag = group_tag(h);
  std::uint64_t first = h & mask & ~(kGroupBucket - 1);
  for (;;) {
    std::uint32_t e[kGroupBucket];
    load_group_bucket(groups, first, e);
    std::uint32_t taken = 0, match = kGroupBucket, seen = 0;  // seen: the matching entry (indexed statically)
GPUKV_UNROLL
    for (std::uint32_t j = 0; j < kGroupBucket; ++j) {
      taken += e[j] != 0;
      if (match == kGroupBucket && (e[j] & ~kGroupShared) == tag) {
        match = j;
        seen = e[j];
      }
    }
    const std::uint32_t pos = static_cast<std::uint32_t>(first) + (match < kGroupBucket ? match : taken);
    if (match == kGroupBucket) {
      if (taken == kGroupBucket) {  // full: the next bucket
        first = (first + kGroupBucket) & mask;
        continue;
      }
      if (atomic_ref<std::uint32_t>(groups[pos]).compare_exchange_strong(seen, tag, memory_order_relaxed)) return pos;
      if ((seen & ~kGroupShared) != tag) continue;  // another tag took it first: look again
    }
    joined = true;
    if ((seen & kGroupShared) == 0) atomic_ref<std::uint32_t>(groups[pos]).fetch_or(kGroupShared, memory_order_relaxed);
    return pos;
  }
}

// Grouping tables of at least this many entries (32 MB: passes of more than 2M ops) are probed by bucket,
// smaller ones by entry: a table L2 holds answers a CAS at once, and most ops' first CAS takes their entry;
// a larger one is a DRAM access per probe. Every op of a pass probes the same way (GroupOp's kByBucket, a
// kernel of its own for each, picked by the host from the pass's size). H100 (runs 155, 158 and 160):
// GroupOp 17-20% faster by bucket over passes of 4M ops (writes 1.02-1.05x), but 16-25% slower over passes
// of 0.2M and 1.7M ops.
inline constexpr std::uint64_t kBucketProbeEntries = std::uint64_t{1} << 23;
inline bool groups_by_bucket(std::uint64_t entries) { return entries >= kBucketProbeEntries; }

// Grouping in bins: how the GPU groups a pass of 1M to 4M ops with writes. The grouping table's random loads
// and CASes are most of GroupOp's time (without them it took 1.1 of 5.9 ms per 2^27 inserts on an H100: run
// 193, a bound), because every SM reaches a 32 MB table at random across the fabric between the L2's two
// halves. So each op appends a bin key to its bin's run instead (a block stages a tile of them by bin in
// shared memory first, so that the runs are written as whole lines), and one block per bin then groups its
// run in a table of shared memory (gpu/group_bins_kernel.cuh). A bin key:
//
//   | hash bits 32..63: tag (32) | hash bits 0..7: bin (7 or 8 bits) | op (23) |
//
// Ops of one key share their bin and tag; two ops whose tags match are compared by their keys, so an entry
// holds one key only. An entry is bin << kBinSlotBits | its position in the bin's table, below
// group_entries(n); once a second op joins it, both ops' group_of[] name it and it is marked kGroupShared, so
// ExecuteOp reads it as it reads GroupOp's. Ops alone in the pass, nearly all, keep kUngrouped. The ops of a
// bin whose run overflows (keys made to collide, or one key with thousands of ops in the pass) are grouped
// after it as GroupOp groups, entry by entry in the grouping table, where they pass over the bins' marks.
inline constexpr int kBinSlotBits = 15;  // a bin's table: 2^15 entries of 4 bytes, 128 KB of shared memory
inline constexpr int kBinShift = 23;     // where a bin key's bin begins: a pass in bins has at most 2^22 ops
inline constexpr std::uint64_t kBinOpMask = (std::uint64_t{1} << kBinShift) - 1;
inline constexpr int kMaxBinBits = 8;    // bins: at most 256
// Grouping tables of 2^22 and 2^23 entries (passes of 1M to 4M ops) are grouped in 2^7 and 2^8 bins; larger
// passes, which only a max_batch above 4M makes, keep GroupOp, and so do smaller ones, whose table L2 holds.
// Bins of 64 KB tables (2^8 and 2^9 of them, two blocks an SM) measured level: GroupBins 11% shorter,
// bin_scatter_kernel 10% longer (run 202).
inline constexpr int kMinBinBits = 7;
inline int group_bin_bits(std::uint64_t entries) {
  const int bits = std::countr_zero(entries) - kBinSlotBits;
  return bits >= kMinBinBits && bits <= kMaxBinBits ? bits : 0;
}

GPUKV_HD_INLINE std::uint64_t bin_key(std::uint64_t h, std::uint64_t op, int bin_bits) {
  return (h >> 32 << 32) | ((h & ((std::uint64_t{1} << bin_bits) - 1)) << kBinShift) | op;
}

GPUKV_HD_INLINE bool group_shared(const std::uint32_t* groups, std::uint32_t entry) {
  return (groups[entry] & kGroupShared) != 0;
}

}  // namespace gpukv::detail
