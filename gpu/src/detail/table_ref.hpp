// The table as the per-operation code sees it: a small, trivially copyable handle (cuco's *_ref) that kernels
// take by value and host threads share. It owns nothing.
//
// Slots: one per ticket, in the same order as the tickets, each
//
//   | key_len u32 | value_len u32 | key: key_width bytes | value: value_stride bytes |
//
// Two layouts (SlotLayout), told apart only by three strides, so that every function below serves both:
//
//   board: the tickets on a board of their own; slots `slot_stride` bytes apart, the stride rounded up to
//          whole 32-byte sectors (the unit GPU memory moves), so that a slot never straddles more sectors
//          than it must and a write covers every sector it touches completely (a partial sector write costs
//          HBM a read-modify-write). For 8-byte keys and values that is 32 bytes where 24 hold the data.
//   line:  probe unit u is the 128-byte line u: its ticket word, then unit_slots packed slots
//
//            | ticket word u | slot 8u | slot 8u+1 | ... | slot 8u+unit_slots-1 | (8-bit tickets)
//
//          A hit reads the ticket word and then its slot in the same line, which a lone thread finds in L2
//          when both sit in the line's first 64 bytes, where the board layout's slot is a second random DRAM
//          access (bench/RESULTS.md, "the memory cost of one operation"). The tickets past unit_slots stay
//          EMPTY and are masked out of every probe (lanes), so slot positions keep the board's numbering.
//
// Key and value are zero-padded past their lengths. The two lengths sit in separate 32-bit fields because
// they have different writers: key_len (with the key) is written only while the ticket is BUSY, value_len
// (with the value) also by an in-place overwrite that other threads' key comparisons must not race with.
//
// Probe units: the probe sequence runs over `units` (a prime) with double hashing. With Probing::kGroup a unit
// is one board word, all of its tickets matched in one load; with Probing::kSingle a unit is one ticket.
#pragma once

#include <cstdint>

#include "hd.hpp"
#include "key_hash.hpp"
#include "ticket_board.hpp"
#include "value_in.hpp"
#include "gpukv/types.hpp"

namespace gpukv::detail {

inline constexpr std::uint32_t kSlotHeaderBytes = 8;
inline constexpr std::uint32_t kSectorBytes = 32;
inline constexpr std::uint32_t kLineSlotsOffset = 8;  // a line's first slot follows its ticket word

constexpr std::uint32_t round_up_to_sectors(std::uint32_t bytes) {
  return (bytes + kSectorBytes - 1) / kSectorBytes * kSectorBytes;
}

// Stores two words at a 16-byte aligned address: one 16-byte store on the GPU, where each store instruction
// of a warp whose lanes write to different slots is a request per lane to L2. A value stored in pairs
// (store_value_words) made a board's inserts 3-4% faster and its overwrites 2-5%; the header and key stored
// in pairs too gained nothing and cost misses 1-2% (bench/RESULTS.md, 2026-11-26, "a slot's value stored
// in pairs of words").
GPUKV_HD_INLINE void store_pair(std::uint64_t* p, std::uint64_t a, std::uint64_t b) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<ulonglong2*>(p) = make_ulonglong2(a, b);
#else
  p[0] = a;
  p[1] = b;
#endif
}

GPUKV_HD_INLINE bool pair_aligned(const std::uint64_t* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15) == 0; }

// Bits: ticket size. P: probing unit. KeyWords_: 64-bit words per key (1, 2 or 4), a compile-time constant so
// that the code for 8-byte keys carries one word, not four.
template <int Bits, Probing P, std::uint32_t KeyWords_>
struct TableRef {
  using Codec = TicketCodec<Bits>;
  static constexpr Probing kProbing = P;
  static constexpr std::uint32_t key_words = KeyWords_;
  static_assert(KeyWords_ == 1 || KeyWords_ == 2 || KeyWords_ == 4);

  Board<Bits> board;
  std::uint8_t* slots;  // slot 0
  // Host tier only (nullptr in the device tier): one more byte of each key's info per slot, in GPU memory
  // beside the board. A ticket whose info code matches is checked against it before the host slot is
  // read, so a lookup reads host memory in vain about 1 time in 256 * (2^Bits - 3) instead of 1 in 2^Bits - 3.
  std::uint8_t* tags;
  std::uint64_t units;         // prime
  std::uint64_t positions;     // slot positions: kPerWord per board word (group probing), or units (single)
  std::uint64_t unit_lanes;    // group probing: the top bits of the fields that describe slots (all but in a line)
  std::uint32_t value_stride;  // value bytes per slot, a multiple of 8
  std::uint32_t slot_stride;   // bytes from a slot to the next of its word (>= kSlotHeaderBytes + 8 * key_words + value_stride)
  std::uint64_t word_slots_stride;  // bytes from a word's first slot to the next word's

  GPUKV_HD_INLINE std::uint64_t word_of(std::uint64_t unit) const {
    if constexpr (P == Probing::kGroup) {
      return unit;
    } else {
      return unit / Codec::kPerWord;
    }
  }
  // Top bits of the fields that belong to `unit` within its word.
  GPUKV_HD_INLINE std::uint64_t lanes_of(std::uint64_t unit) const {
    if constexpr (P == Probing::kGroup) {
      return unit_lanes;
    } else {
      return std::uint64_t{1} << ((unit % Codec::kPerWord) * Bits + Bits - 1);
    }
  }
  GPUKV_HD_INLINE static std::uint64_t slot_of(std::uint64_t word, int field) {
    return word * Codec::kPerWord + static_cast<std::uint64_t>(field);
  }

  // Whether every slot has its 32-byte sectors to itself, as on a board (the stride is whole sectors). In a
  // line, slots share sectors with their neighbours, so a lookup's L1 may hold part of a slot published
  // during the pass from before it was written: a kernel that publishes a line's new keys compares keys
  // from L2 (key_equals).
  GPUKV_HD_INLINE bool slots_own_sectors() const { return board.stride == 1; }

  GPUKV_HD_INLINE static std::uint8_t tag_of(std::uint32_t info) { return static_cast<std::uint8_t>(info); }

  GPUKV_HD_INLINE std::uint8_t* slot(std::uint64_t index) const {
    return slots + index / Codec::kPerWord * word_slots_stride + index % Codec::kPerWord * slot_stride;
  }
  GPUKV_HD_INLINE std::uint32_t* key_len(std::uint64_t index) const {
    return reinterpret_cast<std::uint32_t*>(slot(index));
  }
  GPUKV_HD_INLINE std::uint32_t* value_len(std::uint64_t index) const {
    return reinterpret_cast<std::uint32_t*>(slot(index)) + 1;
  }
  GPUKV_HD_INLINE std::uint64_t* key_words_at(std::uint64_t index) const {
    return reinterpret_cast<std::uint64_t*>(slot(index) + kSlotHeaderBytes);
  }
  GPUKV_HD_INLINE std::uint64_t* value_words_at(std::uint64_t index) const {
    return key_words_at(index) + key_words;
  }

  // Whether slot `index` holds key `k`. The length and the key words are loaded before either is tested, so
  // that one memory round trip brings both.
  //
  // kFromL2 (GPU code): load them from L2 (ld.global.cg), past the SM's L1. In a line, slots share sectors
  // with their neighbours, and a pass of inserts publishes new slots while it runs (Engine::commit): the L1
  // may hold a sector read before its new slot was written, and a compare against that copy could match a
  // key the slot no longer holds. L2 has the slot's bytes before its ticket turns FULL (the writer's
  // release), and the slot's address depends on the ticket loaded, so these loads are issued after it. The
  // asm is not volatile, so the compiler schedules them as it does plain loads.
  template <bool kFromL2 = false>
  GPUKV_HD_INLINE bool key_equals(std::uint64_t index, const KeyWords& k) const {
#if defined(__CUDA_ARCH__)
    if constexpr (kFromL2) {
      const std::uint64_t* words = reinterpret_cast<const std::uint64_t*>(slot(index));
      std::uint64_t header;  // key_len is its low half; value_len, the high half, is not compared
      asm("ld.global.cg.u64 %0, [%1];" : "=l"(header) : "l"(words));
      bool equal = static_cast<std::uint32_t>(header) == k.len;
GPUKV_UNROLL
      for (std::uint32_t j = 0; j < kMaxKeyWords; ++j) {
        if (j < key_words) {
          std::uint64_t word;
          asm("ld.global.cg.u64 %0, [%1];" : "=l"(word) : "l"(words + 1 + j));
          equal &= word == k.w[j];
        }
      }
      return equal;
    }
#endif
    const std::uint64_t* stored = key_words_at(index);
    bool equal = *key_len(index) == k.len;
GPUKV_UNROLL
    for (std::uint32_t j = 0; j < kMaxKeyWords; ++j) {
      if (j < key_words) equal &= stored[j] == k.w[j];
    }
    return equal;
  }
  // The value of a slot whose key only this thread may change (load_value: its length and first words in one
  // round trip).
  GPUKV_HD_INLINE ValueIn value_in(std::uint64_t index) const {
    return load_value(value_words_at(index), value_len(index), value_stride);
  }

  // Fills a slot nobody else reads (its ticket is BUSY): header, key and value in 8-byte stores, with zeros
  // to the end of the value's last sector so that every sector written is written whole.
  template <class Value>
  GPUKV_HD_INLINE void store_new(std::uint64_t index, const KeyWords& k, const Value& value) const {
    store_key(index, k, value.len);
    store_value_words(index, value);
  }
  // The header and key of a slot nobody else reads; its value's words follow (CopyValues).
  GPUKV_HD_INLINE void store_key(std::uint64_t index, const KeyWords& k, std::uint32_t value_len) const {
    auto* words = reinterpret_cast<std::uint64_t*>(slot(index));
    words[0] = std::uint64_t{k.len} | (std::uint64_t{value_len} << 32);
GPUKV_UNROLL
    for (std::uint32_t j = 0; j < kMaxKeyWords; ++j) {
      if (j < key_words) words[1 + j] = k.w[j];
    }
  }
  // Words of a value, with the stored value's zeros past its length to the end of its last sector: how
  // many words store_value_words writes for a value of `len` bytes.
  GPUKV_HD_INLINE std::uint32_t stored_value_words(std::uint32_t len) const {
    const std::uint32_t first_word = 1 + key_words;
    const std::uint32_t sector_end = round_up_to_sectors((first_word + (len + 7) / 8) * 8);
    return (sector_end < slot_stride ? sector_end : slot_stride) / 8 - first_word;
  }

  // Replaces the value of a slot whose key only this thread may change. value_len has its own 32-bit field:
  // other threads may be comparing key_len next to it.
  template <class Value>
  GPUKV_HD_INLINE void store_value(std::uint64_t index, const Value& value) const {
    *value_len(index) = value.len;
    store_value_words(index, value);
  }

 private:
  // `value` has len and word(j) (a ValueIn). The value's words, then zeros to the end of the last sector
  // touched (the value starts 8 + 8 * key_words bytes into the slot), or of the slot where it ends first (a
  // packed slot of the line layout); in pairs of words from the first 16-byte boundary (store_pair).
  template <class Value>
  GPUKV_HD_INLINE void store_value_words(std::uint64_t index, const Value& value) const {
    std::uint64_t* out = value_words_at(index);
    const std::uint32_t words = (value.len + 7) / 8;
    const std::uint64_t last_mask = byte_mask(value.len % 8 == 0 ? 8 : value.len % 8);
    const auto word = [&](std::uint32_t j) {
      return j >= words ? 0 : j + 1 == words ? value.word(j) & last_mask : value.word(j);
    };
    const std::uint32_t first_word = 1 + key_words;
    const std::uint32_t sector_end = round_up_to_sectors((first_word + words) * 8);
    const std::uint32_t total = (sector_end < slot_stride ? sector_end : slot_stride) / 8 - first_word;
    std::uint32_t j = 0;
    if (total != 0 && !pair_aligned(out)) {
      out[0] = word(0);
      j = 1;
    }
    for (; j + 1 < total; j += 2) store_pair(out + j, word(j), word(j + 1));
    if (j < total) out[j] = word(j);
  }
};

// Copies a value of `len` bytes between 8-byte aligned buffers, zeroing the bytes of its last word past the
// length so that stored and returned values are always clean.
GPUKV_HD_INLINE void copy_value(std::uint64_t* dst, const std::uint64_t* src, std::uint32_t len) {
  const std::uint32_t full = len / 8;
  for (std::uint32_t j = 0; j < full; ++j) dst[j] = src[j];
  if (len % 8 != 0) dst[full] = src[full] & byte_mask(len % 8);
}

}  // namespace gpukv::detail
