// Reading live items out of a tier (Table::export_items, a snapshot's source), between passes.
//
// One thread per slot of a range: a FULL ticket's slot is copied to the next place of the output columns,
// which a warp's threads take with one atomic between them (append_index_to). No ticket is BUSY between
// passes, so FULL, EMPTY and TOMBSTONE are the only states a scan meets, and the slots behind FULL tickets
// are settled. The output is the column layout of a batch of PUTs, so loading a snapshot is executing it.
#pragma once

#include <cstdint>

#include "engine.hpp"

namespace gpukv::detail {

template <class Ref>
struct ExportItem {
  static constexpr const char* kName = "ExportItem";
  Ref table;
  std::uint64_t first;          // the tier's slot of i = 0
  ItemColumns out;              // room for one item per slot of the range
  unsigned long long* count;    // the next free place in `out`, zeroed before
  GPUKV_HD void operator()(std::uint64_t i, Tally&) const {
    using Codec = typename Ref::Codec;
    const std::uint64_t slot = first + i;
    const std::uint64_t tickets = table.board.load(slot / Codec::kPerWord);
    if (Codec::field_code(tickets, static_cast<int>(slot % Codec::kPerWord)) < Codec::kFirstFull) return;
    const auto at = append_index_to(count);
    const SlotLens lens = table.load_lens(slot);
    const std::uint64_t* from = table.key_words_at(slot);
    out.key_lens[at] = static_cast<std::uint8_t>(lens.key);
    out.value_lens[at] = lens.value;
    auto* key = reinterpret_cast<std::uint64_t*>(out.keys) + at * Ref::key_words;
GPUKV_UNROLL
    for (std::uint32_t j = 0; j < Ref::key_words; ++j) key[j] = from[j];
    // The value's own bytes only (a wide value's stride is mostly padding), zeros to its last 8-byte boundary.
    auto* value = reinterpret_cast<std::uint64_t*>(out.values + at * table.value_stride);
    copy_value(value, from + Ref::key_words, lens.value);
    if (out.slot_words != nullptr) out.slot_words[at] = *table.slot_word_at(slot);
  }
};

}  // namespace gpukv::detail
