// Parallel tombstone clean-up (Hashinator, section 2.5.3), between passes.
//
// Tombstones keep lookups walking: a lookup stops only at an EMPTY ticket. Clean-up restores short probes
// without a full rehash:
//
//   1. CleanupExtract, one thread per slot: every TOMBSTONE becomes EMPTY; every key that is not in
//      the first unit of its own probe sequence is copied out to a buffer and its ticket becomes EMPTY. A
//      line's slot that becomes EMPTY is zeroed (lengths and key), and a device-tier board slot's lengths.
//      Keys in their first unit stay: a lookup finds them with its first probe, whatever else is empty.
//   2. CleanupReinsert, one thread per extracted key: insert it again by the normal claim path.
//
// Each tier is cleaned on its own (CleanupWord holds one tier), and its keys stay in it.
//
// Every extraction must finish before any reinsertion (a reinserted key must not be overtaken by an EMPTY
// made later on its sequence), hence two steps. CleanupCount sizes the buffer first, per region of
// kCleanupRegionSlots slots; an exclusive sum of those counts gives each region its run of the buffer, so
// that extracting threads take buffer places from one counter per region rather than all from one (one
// counter served 18 M extractions from a 2^27-slot tier in 5.9 ms). A warp's threads in one region add to
// its counter with one atomic between them.
#pragma once

#include <cstdint>

#include "engine.hpp"

namespace gpukv::detail {

template <class Ref>
struct CleanupWord {
  using Codec = typename Ref::Codec;
  Ref table;
  bool device_tier;

  GPUKV_HD_INLINE KeyWords stored_key(std::uint64_t slot) const {
    KeyWords k;
    k.len = table.load_lens(slot).key;
    const std::uint64_t* words = table.key_words_at(slot);
GPUKV_UNROLL
    for (std::uint32_t j = 0; j < kMaxKeyWords; ++j) k.w[j] = j < table.key_words ? words[j] : 0;
    return k;
  }
  GPUKV_HD_INLINE std::uint64_t unit_of_slot(std::uint64_t slot) const {
    if constexpr (Ref::kProbing == Probing::kGroup) {
      return slot / Codec::kPerWord;
    } else {
      return slot;
    }
  }
  // Zeroes what the claims that make a ticket FULL at once rely on (Engine's invariants) in a device-tier slot
  // whose ticket clean-up turns EMPTY (TableRef::empty_device_slot). The host tier's board slots, in host
  // memory, which no claim makes FULL at once, keep their bytes.
  GPUKV_HD_INLINE void zero_emptied_slot(std::uint64_t slot) const {
    if (device_tier) table.empty_device_slot(slot);
  }
  // A FULL ticket whose key is not in its first probe unit.
  GPUKV_HD_INLINE bool displaced(std::uint64_t slot) const {
    const ProbePlan plan = plan_probe(hash_key(stored_key(slot), table.key_words), table.units);
    return plan.first != unit_of_slot(slot);
  }
};

// The scan steps run a thread per slot, so that a warp reads the keys of 32 neighbouring slots (one
// contiguous run of memory) rather than one slot in each of 32 board words' runs of slots: with a thread per
// board word, counting read the keys of a 2^27-slot tier at about 410 GB/s.

// Slots per region of the extraction buffer: a region's threads share one counter for their places.
inline constexpr std::uint64_t kCleanupRegionSlots = 1 << 14;

// Bytes of an extracted slot in the buffer: its lengths as a board slot holds them (key_len | value_len << 32),
// then its key and value.
template <class Ref>
GPUKV_HD_INLINE std::uint64_t record_bytes(const Ref& table) {
  return 8 + table.data_bytes();
}

template <class Ref>
struct CleanupCount {
  static constexpr const char* kName = "CleanupCount";
  CleanupWord<Ref> w;
  unsigned long long* regions;  // displaced keys per region, zeroed before
  GPUKV_HD void operator()(std::uint64_t slot, Tally& tally) const {
    using Codec = typename Ref::Codec;
    const std::uint64_t tickets = w.table.board.load(slot / Codec::kPerWord);
    const int field = static_cast<int>(slot % Codec::kPerWord);
    if (Codec::field_code(tickets, field) >= Codec::kFirstFull && w.displaced(slot)) {
      ++tally.extracted;
      static_cast<void>(append_index_to(&regions[slot / kCleanupRegionSlots]));  // counts it in its region
    }
  }
};

template <class Ref>
struct CleanupExtract {
  static constexpr const char* kName = "CleanupExtract";
  CleanupWord<Ref> w;
  std::uint8_t* buffer;         // extracted slots, record_bytes() each
  unsigned long long* regions;  // each region's next place in the buffer
  GPUKV_HD void operator()(std::uint64_t slot, Tally& tally) const {
    using Codec = typename Ref::Codec;
    const std::uint64_t word = slot / Codec::kPerWord;
    const int field = static_cast<int>(slot % Codec::kPerWord);
    // The threads of a word's other slots may flip their own tickets meanwhile; this one's stays as read.
    const std::uint64_t code = Codec::field_code(w.table.board.load(word), field);
    if (code == Codec::kTombstone) {
      w.zero_emptied_slot(slot);
      w.table.board.flip(word, field, code, Codec::kEmpty);
    } else if (code >= Codec::kFirstFull && w.displaced(slot)) {
      const auto index = append_index_to(&regions[slot / kCleanupRegionSlots]);
      const SlotLens lens = w.table.load_lens(slot);
      const std::uint64_t* from = w.table.key_words_at(slot);
      auto* to = reinterpret_cast<std::uint64_t*>(buffer + index * record_bytes(w.table));
      to[0] = std::uint64_t{lens.key} | (std::uint64_t{lens.value} << 32);
      for (std::uint32_t j = 0; j < w.table.data_bytes() / 8; ++j) to[1 + j] = from[j];
      w.zero_emptied_slot(slot);
      w.table.board.flip(word, field, code, Codec::kEmpty);
      ++tally.extracted;
    }
  }
};

template <class Ref>
struct CleanupReinsert {
  static constexpr const char* kName = "CleanupReinsert";
  CleanupWord<Ref> w;
  const std::uint8_t* buffer;
  Counters* counters;
  GPUKV_HD void operator()(std::uint64_t i, Tally&) const {
    using Codec = typename Ref::Codec;
    const Ref& table = w.table;
    const auto* from = reinterpret_cast<const std::uint64_t*>(buffer + i * record_bytes(table));
    KeyWords key;
    key.len = static_cast<std::uint32_t>(from[0] & 0xFFFFFFFFu);
GPUKV_UNROLL
    for (std::uint32_t j = 0; j < kMaxKeyWords; ++j) key.w[j] = j < table.key_words ? from[1 + j] : 0;
    const ProbePlan plan = plan_probe(hash_key(key, table.key_words), table.units);
    std::uint64_t slot;
    long long tombstones = 0;  // none left: clean-up turned them all EMPTY
    // Claimed straight as FULL (no BUSY step, one atomic less): nothing reads the tier during clean-up, and
    // the kernel boundary makes the slot's bytes visible with its ticket.
    if (!claim_ticket(table, plan.first, 0, plan.step, table.board.load(table.word_of(plan.first)), slot, tombstones,
                      Codec::info_code(plan.info))) {
      // Cannot happen: every extracted key left an EMPTY behind in its tier.
      atomic_ref<unsigned long long>(counters->lost).fetch_add(1, memory_order_relaxed);
      return;
    }
    table.store_lens(slot, SlotLens{key.len, static_cast<std::uint32_t>(from[0] >> 32)});
    std::uint64_t* to = table.key_words_at(slot);
    for (std::uint32_t j = 0; j < table.data_bytes() / 8; ++j) to[j] = from[1 + j];
    if (table.tags != nullptr) table.tags[slot] = Ref::tag_of(plan.info);
  }
};

}  // namespace gpukv::detail
