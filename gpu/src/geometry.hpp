// Sizes derived from a TableConfig, computed and validated once on the host.
#pragma once

#include <cstdint>

#include "gpukv/types.hpp"

namespace gpukv::detail {

// One tier's sizes. A tier with capacity 0 does not exist.
//
// Slots are numbered by position: word * tickets-per-word + field, the ticket that describes them. In the
// line layout a unit holds fewer slots than its word has tickets; the other tickets stay EMPTY and are never
// claimed, so positions run past capacity.
struct TierGeometry {
  SlotLayout layout = SlotLayout::kBoard;
  std::uint64_t units = 0;          // probe units, a prime
  std::uint64_t capacity = 0;       // slots that can hold keys
  std::uint64_t positions = 0;      // slot positions (Table::slot_count's share)
  std::uint64_t board_words = 0;    // 64-bit ticket words
  std::uint32_t unit_slots = 0;     // slots per probe unit
  std::uint32_t slot_stride = 0;    // bytes from one slot to the next within a unit
  std::uint32_t len_bits = 0;       // bits of each of a slot's two lengths (TableRef::len_bits)
  std::uint32_t word_slots_stride = 0;  // bytes from a word's first slot to the next word's
  std::uint32_t slot_word_offset = 0;   // bytes from a slot's key to its word (TableConfig::slot_word); 0: none
  std::uint32_t value_fill_end = 0;     // TableRef::value_fill_end
  std::uint64_t board_bytes() const { return layout == SlotLayout::kLine ? 0 : board_words * sizeof(std::uint64_t); }
  // The slots' memory; in the line layout, the tickets' too.
  std::uint64_t slot_bytes() const {
    return layout == SlotLayout::kLine ? units * std::uint64_t{kLineBytes} : positions * slot_stride;
  }
  std::uint64_t tag_bytes = 0;      // host tier: a tag byte per slot beside the board (table_ref.hpp)
  std::uint64_t max_items = 0;      // live keys allowed
  std::uint64_t cleanup_tombstones = 0;  // tombstones that trigger a clean-up
  std::uint64_t crowded_tombstones = 0;  // past max_items, tombstones that trigger a clean-up (cleanup_headroom)
};

struct Geometry {
  std::uint32_t key_words = 0;      // key_width / 8
  std::uint32_t value_stride = 0;   // value bytes per slot and per batch entry
  TierGeometry device;
  TierGeometry host;
  // Words at the start of a device-tier slot that CopyValues writes for a PUT beside its value, a word a
  // lane where it has that many (GpuBackend's copy_lanes): on a board the slot's lengths and key (CopyValues
  // says why), in a line none.
  std::uint32_t copied_head_words() const { return device.layout == SlotLayout::kBoard ? 1 + key_words : 0; }
};

// Throws Error(kInvalidArgument) with a message naming the bad setting. A slot_layout of kAuto is checked as
// kBoard, which it falls back to (pick_slot_layout).
Geometry make_geometry(const TableConfig& config);

// The device tier's layout for a table on `backend` (kGpu or kCpu): config.slot_layout, or for kAuto the one
// SlotLayout describes.
SlotLayout pick_slot_layout(const TableConfig& config, BackendKind backend);

// Smallest prime >= n (n >= 2).
std::uint64_t next_prime(std::uint64_t n);

}  // namespace gpukv::detail
