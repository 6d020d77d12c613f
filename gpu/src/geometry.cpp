#include "geometry.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "detail/batch_groups.hpp"
#include "detail/table_ref.hpp"

namespace gpukv::detail {
namespace {

[[noreturn]] void reject(const std::string& what) { throw Error(Error::Code::kInvalidArgument, what); }

// Bytes of a slot's word (TableConfig::slot_word).
std::uint32_t slot_word_bytes(const TableConfig& c) { return c.slot_word ? 8 : 0; }

bool is_prime(std::uint64_t n) {
  if (n < 2) return false;
  if (n % 2 == 0) return n == 2;
  for (std::uint64_t d = 3; d * d <= n; d += 2) {
    if (n % d == 0) return false;
  }
  return true;
}

// A tier of `slots` slots asked for: a prime number of probe units, and the limits derived from it.
TierGeometry tier_geometry(const TableConfig& c, std::uint64_t slots, SlotLayout layout) {
  TierGeometry t;
  t.layout = layout;
  const std::uint32_t per_word = 64 / c.ticket_bits;
  // A slot is its key and value, and its word where the table keeps one (TableConfig::slot_word). On a board,
  // behind its two 32-bit lengths and rounded up to whole 32-byte sectors; in a line, packed after the ticket
  // word and the word of the line's lengths (table_ref.hpp).
  const std::uint32_t vstride = value_stride(c.value_width);
  const std::uint32_t word_bytes = slot_word_bytes(c);
  t.slot_word_offset = word_bytes == 0 ? 0 : c.key_width + vstride;
  if (layout == SlotLayout::kLine) {
    t.slot_stride = c.key_width + vstride + word_bytes;
    t.len_bits = line_len_bits(c.key_width, vstride);
    t.unit_slots = line_slots(c.key_width, vstride, per_word, word_bytes);
    t.word_slots_stride = kLineBytes;
    t.value_fill_end = word_bytes == 0 ? t.slot_stride : t.slot_word_offset;
  } else {
    t.slot_stride = round_up_to_sectors(kSlotHeaderBytes + c.key_width + vstride + word_bytes);
    t.value_fill_end = word_bytes == 0 ? t.slot_stride : kSlotHeaderBytes + t.slot_word_offset;
    t.len_bits = kBoardLenBits;
    t.unit_slots = c.probing == Probing::kGroup ? per_word : 1;
    t.word_slots_stride = per_word * t.slot_stride;
  }
  if (c.probing == Probing::kGroup) {
    t.units = next_prime(std::max<std::uint64_t>(2, (slots + t.unit_slots - 1) / t.unit_slots));
    t.capacity = t.units * t.unit_slots;
    t.positions = t.units * per_word;
  } else {
    t.units = next_prime(std::max<std::uint64_t>(2, slots));
    t.capacity = t.units;
    t.positions = t.units;
  }
  t.board_words = (t.positions + per_word - 1) / per_word;
  t.max_items = static_cast<std::uint64_t>(std::floor(c.max_load_factor * static_cast<double>(t.capacity)));
  t.cleanup_tombstones =
      std::max<std::uint64_t>(1, static_cast<std::uint64_t>(std::ceil(c.cleanup_tombstones * static_cast<double>(t.capacity))));
  t.crowded_tombstones =
      static_cast<std::uint64_t>(std::floor(c.cleanup_headroom * static_cast<double>(t.capacity - t.max_items)));
  return t;
}

}  // namespace

std::uint64_t next_prime(std::uint64_t n) {
  while (!is_prime(n)) ++n;
  return n;
}

Geometry make_geometry(const TableConfig& c) {
  if (c.key_width != 8 && c.key_width != 16 && c.key_width != 32) {
    reject("key_width must be 8, 16 or 32 bytes, got " + std::to_string(c.key_width));
  }
  if (c.value_width < 8 || c.value_width > kMaxValueWidth) {
    reject("value_width must be 8.." + std::to_string(kMaxValueWidth) + " bytes, got " +
           std::to_string(c.value_width));
  }
  if (c.ticket_bits != 2 && c.ticket_bits != 4 && c.ticket_bits != 8) {
    reject("ticket_bits must be 2, 4 or 8, got " + std::to_string(c.ticket_bits) +
           " (a ticket must tell EMPTY, BUSY, TOMBSTONE and FULL apart, which takes 2 bits)");
  }
  constexpr std::uint64_t kMaxCapacity = std::uint64_t{1} << 40;
  if (c.capacity == 0 || c.capacity > kMaxCapacity) {
    reject("capacity must be 1.." + std::to_string(kMaxCapacity) + " slots, got " + std::to_string(c.capacity));
  }
  if (!(c.max_load_factor > 0.0 && c.max_load_factor <= 1.0)) reject("max_load_factor must be in (0, 1]");
  if (!(c.cleanup_tombstones > 0.0 && c.cleanup_tombstones <= 1.0)) reject("cleanup_tombstones must be in (0, 1]");
  if (!(c.cleanup_headroom > 0.0 && c.cleanup_headroom <= 1.0)) reject("cleanup_headroom must be in (0, 1]");
  if (!(c.clstash_load <= 1.0)) reject("clstash_load must be <= 1 (negative: the measured default)");
  if (c.max_batch == 0 || c.max_batch > kMaxPassOps) {
    reject("max_batch must be 1.." + std::to_string(kMaxPassOps) + ", got " + std::to_string(c.max_batch));
  }
  // Host slot indices must fit the 40 bits a host-queue entry gives them (batch_ref.hpp).
  constexpr std::uint64_t kMaxHostCapacity = std::uint64_t{1} << 39;
  if (c.host_capacity > kMaxHostCapacity) {
    reject("host_capacity must be 0.." + std::to_string(kMaxHostCapacity) + " slots, got " +
           std::to_string(c.host_capacity));
  }
  if (c.slot_layout == SlotLayout::kLine) {
    if (c.probing != Probing::kGroup) reject("slot_layout line needs group probing: a line is one probe unit");
    const std::uint32_t vstride = value_stride(c.value_width);
    if (line_slots(c.key_width, vstride, 64 / c.ticket_bits, slot_word_bytes(c)) < kMinLineSlots) {
      reject("slot_layout line holds " + std::to_string(kMinLineSlots) + " or more slots of key_width + value_width bytes" +
             (c.slot_word ? " and a slot word" : "") + " in the " + std::to_string(kLineBytes - kLineSlotsOffset) +
             " bytes a " + std::to_string(kLineBytes) + "-byte line has after its ticket and length words; key_width " +
             std::to_string(c.key_width) + " and value_width " + std::to_string(c.value_width) + " make a slot of " +
             std::to_string(c.key_width + vstride + slot_word_bytes(c)) + " bytes: use slot_layout board");
    }
  }
  Geometry g;
  g.key_words = c.key_width / 8;
  g.value_stride = value_stride(c.value_width);
  const SlotLayout device_layout = c.slot_layout == SlotLayout::kLine ? SlotLayout::kLine : SlotLayout::kBoard;
  g.device = tier_geometry(c, c.capacity, device_layout);
  if (c.host_capacity != 0) {
    g.host = tier_geometry(c, c.host_capacity, SlotLayout::kBoard);
    g.host.tag_bytes = g.host.capacity;
  }
  return g;
}

SlotLayout pick_slot_layout(const TableConfig& c, BackendKind backend) {
  if (c.slot_layout != SlotLayout::kAuto) return c.slot_layout;
  const bool tickets_valid = c.ticket_bits == 2 || c.ticket_bits == 4 || c.ticket_bits == 8;  // checked later
  const bool lines_fit = c.probing == Probing::kGroup && tickets_valid &&
                         line_slots(c.key_width, value_stride(c.value_width), 64 / c.ticket_bits, slot_word_bytes(c)) >=
                             kAutoLineSlots;
  return backend == BackendKind::kGpu && lines_fit ? SlotLayout::kLine : SlotLayout::kBoard;
}

}  // namespace gpukv::detail
