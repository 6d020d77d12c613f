// Parallel tombstone clean-up (Hashinator, section 2.5.3), between passes.
//
// Tombstones keep lookups walking: a lookup stops only at an EMPTY ticket. Clean-up restores short probes
// without a full rehash:
//
//   1. CleanupExtract, one thread per board word: every TOMBSTONE becomes EMPTY; every key that is not in
//      the first unit of its own probe sequence is copied out to a buffer and its ticket becomes EMPTY.
//      Keys in their first unit stay: a lookup finds them with its first probe, whatever else is empty.
//   2. CleanupReinsert, one thread per extracted key: insert it again by the normal claim path.
//
// Each tier is cleaned on its own (CleanupWord holds one tier), and its keys stay in it.
//
// Every extraction must finish before any reinsertion (a reinserted key must not be overtaken by an EMPTY
// made later on its sequence), hence two steps. CleanupCount sizes the buffer first.
#pragma once

#include <cstdint>

#include "gpukv/detail/engine.hpp"

namespace gpukv::detail {

template <class Ref>
struct CleanupWord {
  using Codec = typename Ref::Codec;
  Ref table;

  GPUKV_HD_INLINE KeyWords stored_key(std::uint64_t slot) const {
    KeyWords k;
    k.len = *table.key_len(slot);
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
  // A FULL ticket whose key is not in its first probe unit.
  GPUKV_HD_INLINE bool displaced(std::uint64_t slot) const {
    const ProbePlan plan = plan_probe(hash_key(stored_key(slot), table.key_words), table.units);
    return plan.first != unit_of_slot(slot);
  }
  GPUKV_HD_INLINE bool in_table(std::uint64_t slot) const { return slot < table.capacity; }
};

template <class Ref>
struct CleanupCount {
  static constexpr const char* kName = "CleanupCount";
  CleanupWord<Ref> w;
  GPUKV_HD void operator()(std::uint64_t word, Tally& tally) const {
    using Codec = typename Ref::Codec;
    const std::uint64_t tickets = w.table.board.load(word);
    for (int field = 0; field < Codec::kPerWord; ++field) {
      const std::uint64_t slot = Ref::slot_of(word, field);
      if (w.in_table(slot) && Codec::field_code(tickets, field) >= Codec::kFirstFull && w.displaced(slot)) ++tally.extracted;
    }
  }
};

template <class Ref>
struct CleanupExtract {
  static constexpr const char* kName = "CleanupExtract";
  CleanupWord<Ref> w;
  std::uint8_t* buffer;  // extracted slots, slot_stride bytes each
  Counters* counters;
  GPUKV_HD void operator()(std::uint64_t word, Tally&) const {
    using Codec = typename Ref::Codec;
    const std::uint64_t tickets = w.table.board.load(word);
    std::uint64_t cleaned = tickets;
    for (int field = 0; field < Codec::kPerWord; ++field) {
      const std::uint64_t slot = Ref::slot_of(word, field);
      const std::uint64_t code = Codec::field_code(tickets, field);
      const std::uint64_t clear = ~(Codec::kFieldMask << (field * Codec::kBits));
      if (!w.in_table(slot)) continue;
      if (code == Codec::kTombstone) {
        cleaned &= clear;
      } else if (code >= Codec::kFirstFull && w.displaced(slot)) {
        const auto index = atomic_ref<unsigned long long>(counters->extracted).fetch_add(1, memory_order_relaxed);
        const auto* from = reinterpret_cast<const std::uint64_t*>(w.table.slot(slot));
        auto* to = reinterpret_cast<std::uint64_t*>(buffer + index * w.table.slot_stride);
        for (std::uint32_t j = 0; j < w.table.slot_stride / 8; ++j) to[j] = from[j];
        cleaned &= clear;
      }
    }
    // This thread is the only one touching this word during the step.
    if (cleaned != tickets) atomic_ref<std::uint64_t>(w.table.board.words[word]).store(cleaned, memory_order_relaxed);
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
    const auto* from = reinterpret_cast<const std::uint64_t*>(buffer + i * table.slot_stride);
    KeyWords key;
    key.len = static_cast<std::uint32_t>(from[0] & 0xFFFFFFFFu);
GPUKV_UNROLL
    for (std::uint32_t j = 0; j < kMaxKeyWords; ++j) key.w[j] = j < table.key_words ? from[1 + j] : 0;
    const ProbePlan plan = plan_probe(hash_key(key, table.key_words), table.units);
    std::uint64_t slot;
    long long tombstones = 0;  // none left: clean-up turned them all EMPTY
    if (!claim_ticket(table, plan.first, 0, plan.step, table.board.load(table.word_of(plan.first)), slot, tombstones)) {
      // Cannot happen: every extracted key left an EMPTY behind in its tier.
      atomic_ref<unsigned long long>(counters->lost).fetch_add(1, memory_order_relaxed);
      return;
    }
    auto* to = reinterpret_cast<std::uint64_t*>(table.slot(slot));
    for (std::uint32_t j = 0; j < table.slot_stride / 8; ++j) to[j] = from[j];
    if (table.tags != nullptr) table.tags[slot] = Ref::tag_of(plan.info);
    // Nothing reads the table during clean-up; the kernel boundary makes the slot visible with its ticket.
    table.board.flip(slot / Codec::kPerWord, static_cast<int>(slot % Codec::kPerWord), Codec::kBusy,
                     Codec::info_code(plan.info));
  }
};

}  // namespace gpukv::detail
