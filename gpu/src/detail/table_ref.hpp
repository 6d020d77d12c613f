// The table as the per-operation code sees it: a small, trivially copyable handle (cuco's *_ref) that kernels
// take by value and host threads share. It owns nothing.
//
// Slots: one per ticket, in the same order as the tickets, each a key (key_width bytes) and a value
// (value_stride bytes), in a table with slot words (TableConfig::slot_word) then an 8-byte word
// (slot_word_at), with the two lengths kept apart from them (`lens`). Two layouts (SlotLayout), told apart
// only by a few strides and the lengths' width, so that every function below serves both:
//
//   board: the tickets on a board of their own; each slot behind its lengths
//
//            | key_len u32 | value_len u32 | key | value |
//
//          `slot_stride` bytes apart, the stride rounded up to whole 32-byte sectors (the unit GPU memory
//          moves), so that a slot never straddles more sectors than it must and a write covers every sector it
//          touches completely (a partial sector write costs HBM a read-modify-write). For 8-byte keys and
//          values that is 32 bytes where 24 hold the data.
//   line:  probe unit u is the 128-byte line u: its ticket word, a word of the lengths of its slots, then
//          unit_slots slots of key and value, packed
//
//            | ticket word u | lengths word u | slot 8u | slot 8u+1 | ... | slot 8u+unit_slots-1 | (8-bit tickets)
//
//          A slot's lengths are a byte (8-byte keys and values: a nibble each, 7 slots of 16 bytes) or two
//          bytes (a byte each, at most 4 slots). A hit reads the ticket word and then its slot in the same
//          line, which a lone thread finds in L2 when both sit in the line's first 64 bytes, where the board
//          layout's slot is a second random DRAM access (bench/RESULTS.md, "the memory cost of one
//          operation"); the lengths sit in the ticket word's sector. The tickets past unit_slots stay EMPTY and
//          are masked out of every probe (lanes), so slot positions keep the board's numbering.
//
// Key and value are zero-padded past their lengths. The two lengths have different writers: key_len is
// written only while the ticket is BUSY, value_len also by an in-place overwrite, which other threads' key
// comparisons must not race with: on a board they are separate 32-bit fields; in a line the host backend
// reads and writes them with relaxed atomics of their own width (a nibble shares its byte with the other),
// and the GPU, whose plain accesses of different bytes do not tear, reads the lengths word whole.
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

inline constexpr std::uint32_t kSlotHeaderBytes = 8;   // a board slot's lengths, before its key
inline constexpr std::uint32_t kSectorBytes = 32;
inline constexpr std::uint32_t kLineLensOffset = 8;    // a line's lengths word follows its ticket word
inline constexpr std::uint32_t kLineSlotsOffset = 16;  // and its first slot follows the lengths word
inline constexpr std::uint32_t kBoardLenBits = 32;     // TableRef::len_bits on a board

// The width of each length in a line whose slots hold a key of `key_width` and a value of `value_stride` bytes:
// a nibble where both fit one (8-byte keys, values of at most 8 bytes), so that 7 slots of 16 bytes share the
// lengths word, else a byte.
constexpr std::uint32_t line_len_bits(std::uint32_t key_width, std::uint32_t value_stride) {
  return key_width < 16 && value_stride < 16 ? 4 : 8;
}
// Slots a line holds: as many as fit after the ticket and lengths words, whose lengths fit the lengths word,
// and which have tickets in a word of `per_word`. `word_bytes`: a slot's word after its value (8 with
// TableConfig::slot_word, else 0).
constexpr std::uint32_t line_slots(std::uint32_t key_width, std::uint32_t value_stride, std::uint32_t per_word,
                                   std::uint32_t word_bytes) {
  const std::uint32_t by_bytes = (kLineBytes - kLineSlotsOffset) / (key_width + value_stride + word_bytes);
  const std::uint32_t by_lens = 64 / (2 * line_len_bits(key_width, value_stride));
  const std::uint32_t fit = by_bytes < by_lens ? by_bytes : by_lens;
  return fit < per_word ? fit : per_word;
}

// How a walk reads its units' tickets, its slots' lengths and its keys: chosen at compile time by the kernel
// or phase that runs it, the same in every thread (Engine::step).
enum class Walk : std::uint8_t {
  // Lengths loaded where the layout keeps them when a compare needs them, keys through L1: every walk on the
  // host (either layout), and a board's walks on the GPU, which read a slot's lengths from its header.
  kAny,
  // A line on the GPU: its lengths word loaded with its ticket word (one 16-byte load of the line's first
  // sector), so that a compare and a hit's value cost no request for their lengths (Board::load_with_next).
  kLine,
  // kLine in a kernel that publishes new keys while it runs (a line's passes of inserts, its ordered and host
  // phases): the whole line fetched into L2 with the ticket word (Board::load_with_next), keys compared from
  // L2. A lengths word loaded with a ticket that turned FULL in this kernel may miss that slot's lengths (the
  // two halves of a vector load are not one access): the slot holds another thread's key, which no walk of
  // this pass looks for (a pass's same-key ops run in one thread), so a stale length can only fail a compare
  // that had to fail. (Where the claim made the ticket FULL at once, a stale length is the zero slot's 0:
  // Engine::full_claim_code keeps the empty key's code out of such claims.)
  kLineFromL2,
  // kLineFromL2 with each unit's first sector loaded alone, as kLine loads it, no line fetched whole: the
  // kernel that runs a mixed pass's PUTs of one-word keys apart (LanePolicy::split), nine in ten of which
  // overwrite a key the table holds, whose slot is one sector of the line. Against kLineFromL2 (H100): mixed
  // batches 1.016-1.030x over the keys inserted first, 1.002-1.010x over keys of every age, and mixed batches
  // in a steady state (bench_steady_mixed) 1.00-1.02x (runs 315-317). Two-word keys keep kLineFromL2: their
  // kernel spilled 24 bytes a thread without the fetch, and ran mixed batches 0.986-0.997x (run 316).
  kLineFromL2NoFetch,
  // kLine with each unit's whole line fetched into L2 with its words (Board::load_with_next), loaded by weak
  // loads, through L1, as kLineReadOnly loads them: the kernel that runs a mixed pass's GETs and deletes apart
  // (LanePolicy::split). A key's slot may lie in its line's other 64-byte half, which a second DRAM access would
  // bring, as for the lookups of passes expected to hit. H100, run 317, against kLine over keys of every age:
  // mixed batches 1.006 / 1.021 / 1.023 / 1.025x at loads 0.5 / 0.8 / 0.9 / 0.95, mixed batches in a steady
  // state 1.025-1.030x; a pass of deletes after a mixed one, which runs split, 0.961x at 0.5, level above.
  // Its deletes write the table while it runs, but no op claims a slot beside them, so a stale view from L1 can
  // only show another key's ticket FULL, or its slot as it was, where a delete has changed them: a walk then
  // compares against a key that is not its own (or, where the delete freed the slot, against zeros or a mix of
  // zeros and the key, which frees_slot_at_once keeps from the keys they could match), and never misses an
  // EMPTY that would stop it, since a freed slot's unit held an EMPTY already and no EMPTY is taken in this
  // kernel. A key's own ticket and slot change only in its own thread. Through L1 against past it (H200, run
  // 402): mixed batches 1.029 / 1.028 / 1.017 / 1.006x at loads 0.5 / 0.8 / 0.9 / 0.95 (16 B / 8 B: 1.030 /
  // 0.995x at 0.5 / 0.9), but a pass of deletes alone after a mixed one 0.971 / 0.980x at 0.9 / 0.95. Through
  // L1 only in a pass with GETs, the kernel holding both loops, lost most of the gain (mixed 1.015 / 1.004 /
  // 0.998x, run 403; 8 bytes of stack where there were none).
  kLineFetched,
  // kLine where nothing writes the table while the kernel runs: the lookups of a pass without writes expected
  // to hit (the lookup kernel that fetches their first line; the optimistic kernel where its pass holds GETs
  // only, a call's first after inserts). Its units' words are loaded by weak loads (Board::load_with_next's
  // kWeak), through the SM's L1 rather than past it, so that the line's first sector, which holds slot 0 (at
  // 8 B / 8 B; at 16 B / 8 B its key) beside the ticket and lengths words, is in L1 for the compare and the
  // value that follow, where a relaxed load left them to a round trip to L2. Against kLine (H200, run 393):
  // hits 1.125 / 1.115 / 1.097 / 1.087x at loads 0.5 / 0.8 / 0.9 / 0.95, at 16 B / 8 B 1.092 / 1.037x (0.5,
  // 0.9). Misses, which compare few keys, gain nothing from it and keep kLine (CudaExecutor).
  kLineReadOnly,
};

// Whether a walk compares keys from L2 and publishes its new keys in the pass (kLineFromL2 and
// kLineFromL2NoFetch): its claims write a line's lengths with the ticket (LensClaim), and its kernel's stores
// of lengths are relaxed (TableRef's kFromL2 stores).
constexpr bool from_l2(Walk w) { return w == Walk::kLineFromL2 || w == Walk::kLineFromL2NoFetch; }

// Whether a walk fetches each unit's whole line into L2 with its words (Board::load_with_next): kLineFromL2
// and kLineFetched; kLine and kLineFromL2NoFetch load the first sector alone.
constexpr bool fetches_line(Walk w) { return w == Walk::kLineFromL2 || w == Walk::kLineFetched; }
// Whether a walk loads its units' words through L1 (Board::load_with_next's kWeak): kLineReadOnly and
// kLineFetched.
constexpr bool loads_through_l1(Walk w) { return w == Walk::kLineReadOnly || w == Walk::kLineFetched; }

// When a delete's slot becomes a TOMBSTONE (Engine::commit): at once, while its line is in L2, or at the
// pass's end (FinishPass), so that no insert reuses the slot and rewrites its key while a reader that saw its
// old FULL ticket compares against it. Chosen at compile time by the kernel that runs the delete.
enum class Settle : std::uint8_t {
  kAtEnd,         // always at the pass's end (the clStash kernel, whose registers are full)
  kWithoutPuts,   // at once in a pass without PUTs, which claims no slot
  kAlways,        // at once: no op that may claim a slot runs beside this kernel (a mixed pass's other ops)
};

// A slot's two lengths.
struct SlotLens {
  std::uint32_t key;
  std::uint32_t value;
};

constexpr std::uint32_t round_up_to_sectors(std::uint32_t bytes) {
  return (bytes + kSectorBytes - 1) / kSectorBytes * kSectorBytes;
}

// Stores two words at a 16-byte aligned address: one 16-byte store on the GPU, where each store instruction
// of a warp whose lanes write to different slots is a request per lane to L2. A value stored in pairs
// (store_value_words) made a board's inserts 3-4% faster and its overwrites 2-5% (bench/RESULTS.md,
// 2026-11-26, "a slot's value stored in pairs of words"). A board slot's header and first key word go in one
// 16-byte store too, but as PTX (TableRef::store_key), which the compiler can neither split nor merge.
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
  std::uint8_t* slots;  // slot 0's key (its value follows it)
  std::uint8_t* lens;   // slot 0's lengths
  // Host tier only (nullptr in the device tier): one more byte of each key's info per slot, in GPU memory
  // beside the board. A ticket whose info code matches is checked against it before the host slot is
  // read, so a lookup reads host memory in vain about 1 time in 256 * (2^Bits - 3) instead of 1 in 2^Bits - 3.
  std::uint8_t* tags;
  std::uint64_t units;         // prime
  std::uint64_t positions;     // slot positions: kPerWord per board word (group probing), or units (single)
  std::uint64_t unit_lanes;    // group probing: the top bits of the fields that describe slots (all but in a line)
  std::uint32_t value_stride;  // value bytes per slot, a multiple of 8
  std::uint32_t slot_stride;   // bytes from a slot to the next of its word (>= 8 * key_words + value_stride)
  std::uint32_t lens_stride;   // bytes from a slot's lengths to the next's of its word: slot_stride on a board
  std::uint32_t len_bits;      // bits of each length: kBoardLenBits on a board, 4 or 8 in a line
  std::uint64_t word_slots_stride;  // bytes from a word's first slot (and lengths) to the next word's
  std::uint32_t slot_word_offset;   // bytes from a slot's key to its word (TableConfig::slot_word); 0: none
  // Bytes from a slot's start (a board slot's lengths, a line slot's key) to where a stored value's zeros stop
  // (stored_value_words): slot_stride, or with a slot word, the word's place, which the value's zeros must
  // leave alone. A field, not a test of slot_word_offset, so that a table without words runs the same code.
  std::uint32_t value_fill_end;

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

  // Slot `index`'s key (its first byte).
  GPUKV_HD_INLINE std::uint8_t* slot(std::uint64_t index) const {
    return slots + index / Codec::kPerWord * word_slots_stride + index % Codec::kPerWord * slot_stride;
  }
  GPUKV_HD_INLINE std::uint64_t* key_words_at(std::uint64_t index) const {
    return reinterpret_cast<std::uint64_t*>(slot(index));
  }
  GPUKV_HD_INLINE std::uint64_t* value_words_at(std::uint64_t index) const {
    return key_words_at(index) + key_words;
  }
  // Slot `index`'s word (where slot_word_offset != 0).
  GPUKV_HD_INLINE std::uint64_t* slot_word_at(std::uint64_t index) const {
    return reinterpret_cast<std::uint64_t*>(slot(index) + slot_word_offset);
  }
  // Slot `index`'s lengths: key_len in the low len_bits bits, value_len in the next.
  GPUKV_HD_INLINE std::uint8_t* lens_at(std::uint64_t index) const {
    return lens + index / Codec::kPerWord * word_slots_stride + index % Codec::kPerWord * lens_stride;
  }

  // Both lengths of a slot whose key only this thread may change, or that nobody changes meanwhile.
  GPUKV_HD_INLINE SlotLens load_lens(std::uint64_t index) const {
#if defined(__CUDA_ARCH__)
    return lens_of(*lens_word_at(index), index);
#else
    const std::uint8_t* p = lens_at(index);
    if (len_bits == kBoardLenBits) {
      return SlotLens{*reinterpret_cast<const std::uint32_t*>(p), *reinterpret_cast<const std::uint32_t*>(p + 4)};
    }
    const std::uint32_t key = host_load_len_byte(p);
    if (len_bits == 8) return SlotLens{key, host_load_len_byte(p + 1)};
    return SlotLens{key & 0xFu, key >> 4};
#endif
  }
  // A slot's key length, as a host thread's compare reads it while the key's owner may be changing the value's
  // length (key_equals; a GPU walk takes the lengths from its unit's words or a board slot's header).
  GPUKV_HD_INLINE std::uint32_t load_key_len(std::uint64_t index) const {
    const std::uint8_t* p = lens_at(index);
    if (len_bits == kBoardLenBits) return *reinterpret_cast<const std::uint32_t*>(p);
    const std::uint32_t key = host_load_len_byte(p);
    return len_bits == 8 ? key : key & 0xFu;
  }

  // Whether slot `index` holds key `k`. The lengths and the key words are loaded before either is tested, so
  // that one memory round trip brings both; a line's walks pass in the lengths word they loaded with the
  // unit's tickets (`lens_word`), so that the compare costs no request for it.
  //
  // kLineFromL2 (GPU code): load the key from L2 (ld.global.cg), past the SM's L1. In a line, slots share
  // sectors with their neighbours, and a pass of inserts publishes new slots while it runs (Engine::commit):
  // the L1 may hold a sector read before its new slot was written, and a compare against that copy could
  // match a key the slot no longer holds. L2 has the slot's bytes before its ticket turns FULL (the writer's
  // release), and the slot's address depends on the ticket loaded, so these loads are issued after it; or,
  // where the claim made the ticket FULL at once, L2 holds the slot's zeros or its new key, and neither can
  // match (Engine::full_claim_code). The asm is not volatile, so the compiler schedules them as it does
  // plain loads.
  template <Walk kWalk = Walk::kAny>
  GPUKV_HD_INLINE bool key_equals(std::uint64_t index, const KeyWords& k, [[maybe_unused]] std::uint64_t lens_word = 0) const {
    const std::uint64_t* stored = key_words_at(index);
#if defined(__CUDA_ARCH__)
    bool equal = (kWalk == Walk::kAny ? board_lens(stored).key : line_lens(lens_word, index).key) == k.len;
GPUKV_UNROLL
    for (std::uint32_t j = 0; j < kMaxKeyWords; ++j) {
      if (j < key_words) {
        std::uint64_t word;
        if constexpr (from_l2(kWalk)) {
          asm("ld.global.cg.u64 %0, [%1];" : "=l"(word) : "l"(stored + j));
        } else {
          word = stored[j];
        }
        equal &= word == k.w[j];
      }
    }
    return equal;
#else
    bool equal = load_key_len(index) == k.len;
GPUKV_UNROLL
    for (std::uint32_t j = 0; j < kMaxKeyWords; ++j) {
      if (j < key_words) equal &= stored[j] == k.w[j];
    }
    return equal;
#endif
  }
  // The value of a slot whose key only this thread may change (its length and first words in one round
  // trip; a line's walks pass in the lengths word they loaded, as to key_equals).
  template <Walk kWalk = Walk::kAny>
  GPUKV_HD_INLINE ValueIn value_in(std::uint64_t index, [[maybe_unused]] std::uint64_t lens_word = 0) const {
    const std::uint64_t* words = value_words_at(index);
#if defined(__CUDA_ARCH__)
    const std::uint64_t* key = words - key_words;
    return load_value(words, kWalk == Walk::kAny ? board_lens(key).value : line_lens(lens_word, index).value, value_stride);
#else
    return load_value(words, load_lens(index).value, value_stride);
#endif
  }

  // kFromL2, on the stores below: the caller is a kernel whose walks compare from L2 (from_l2(Walk)), the
  // only kernels where a claim writes a line's lengths word with a 16-byte CAS (Engine::place,
  // Board::claim_with_next). Their stores of lengths are then relaxed (a CAS is atomic only against the
  // strong accesses it races with), and a line slot of a one-word key is stored with its value's first word
  // in one 16-byte store. Every other kernel keeps the plain stores, and none of this code: with it, the
  // board's clStash kernel took 1100 instructions more, and its mixed passes ran 2% slower at load 0.9.

  // Fills a slot nobody else reads (its ticket is BUSY): lengths, key and value, with zeros to the end of the
  // value's last sector so that every sector written is written whole. `lens_stored`: the slot's lengths are
  // in place already (its claim wrote them).
  template <bool kFromL2 = false, class Value>
  GPUKV_HD_INLINE void store_new(std::uint64_t index, const KeyWords& k, const Value& value, bool lens_stored = false) const {
#if defined(__CUDA_ARCH__)
    if constexpr (kFromL2 && KeyWords_ == 1) {
      // A line slot whose one-word key starts a 16-byte pair (every slot of 8-byte keys and values): the key
      // and the value's first word in one store, where apart they were two requests to L2.
      if (len_bits != kBoardLenBits && pair_aligned(key_words_at(index))) {
        if (!lens_stored) store_lens<true>(index, SlotLens{k.len, value.len});
        store_value_words(index, value, &k.w[0]);
        return;
      }
    }
#endif
    store_key<kFromL2>(index, k, value.len, lens_stored);
    store_value_words(index, value);
  }
  // The lengths and key of a slot nobody else reads; its value's words follow (CopyValues).
  // On a board, the header and the key's first word go out in one 16-byte store (a board slot starts a
  // sector), written as PTX so that the compiler neither splits it nor shares the key's store with the line's
  // path: with the header and key stored apart (two 8-byte stores the compiler had placed in different
  // blocks), the host tier's inserts wrote 1.5x the host-memory sectors and ran 12% slower (Nsight Compute,
  // bench/RESULTS.md, issue 17, "a line's lengths in a word of their own").
  template <bool kFromL2 = false>
  GPUKV_HD_INLINE void store_key(std::uint64_t index, const KeyWords& k, std::uint32_t value_len,
                                 bool lens_stored = false) const {
    std::uint64_t* words = key_words_at(index);
    if (len_bits == kBoardLenBits) {
      const std::uint64_t header = std::uint64_t{k.len} | (std::uint64_t{value_len} << 32);
#if defined(__CUDA_ARCH__)
      asm volatile("st.global.v2.u64 [%0], {%1, %2};" ::"l"(words - 1), "l"(header), "l"(k.w[0]) : "memory");
#else
      words[-1] = header;
      words[0] = k.w[0];
#endif
GPUKV_UNROLL
      for (std::uint32_t j = 1; j < kMaxKeyWords; ++j) {
        if (j < key_words) words[j] = k.w[j];
      }
      return;
    }
    if (!lens_stored) store_lens<kFromL2>(index, SlotLens{k.len, value_len});
GPUKV_UNROLL
    for (std::uint32_t j = 0; j < kMaxKeyWords; ++j) {
      if (j < key_words) words[j] = k.w[j];
    }
  }
  // Whether a line slot's key words are all zero, read from L2 past the SM's L1 (as key_equals' kLineFromL2):
  // the bytes of an EMPTY slot, or of a slot whose claim has not yet stored its key (Engine::settled).
  GPUKV_HD_INLINE bool key_words_zero(std::uint64_t index) const {
    const std::uint64_t* stored = key_words_at(index);
    std::uint64_t any = 0;
GPUKV_UNROLL
    for (std::uint32_t j = 0; j < kMaxKeyWords; ++j) {
      if (j < key_words) {
        std::uint64_t word;
#if defined(__CUDA_ARCH__)
        asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(word) : "l"(stored + j) : "memory");
#else
        word = atomic_ref<std::uint64_t>(*const_cast<std::uint64_t*>(stored + j)).load(memory_order_relaxed);
#endif
        any |= word;
      }
    }
    return any == 0;
  }
  // Gives a device-tier slot whose ticket turns EMPTY what an EMPTY slot holds (Engine's invariants): in a line,
  // zero lengths and a zero key; on a board, a zero lengths word. Its ticket is the caller's to change after,
  // and nobody else writes the slot meanwhile (a line's lengths are bytes of their own: other threads store
  // their slots' lengths beside them).
  GPUKV_HD_INLINE void empty_device_slot(std::uint64_t index) const {
    store_lens(index, SlotLens{0, 0});
    if (slots_own_sectors()) return;
    std::uint64_t* words = key_words_at(index);
GPUKV_UNROLL
    for (std::uint32_t j = 0; j < kMaxKeyWords; ++j) {
      if (j < key_words) words[j] = 0;
    }
  }
  // Gives a line slot back the bytes of an EMPTY one: zero key, value and lengths (a key an optimistic pass
  // inserted, taken out again: EraseOptimisticInserts). Its ticket is the caller's to change. Other threads
  // clear other slots' lengths in the same word meanwhile, hence the atomic AND.
  GPUKV_HD_INLINE void clear_line_slot(std::uint64_t index) const {
    std::uint64_t* words = key_words_at(index);
    for (std::uint32_t j = 0; j < data_bytes() / 8; ++j) words[j] = 0;
    std::uint64_t mask, bits;
    line_lens_bits(index, SlotLens{0, 0}, mask, bits);
    atomic_ref<std::uint64_t>(*const_cast<std::uint64_t*>(lens_word_at(index))).fetch_and(~mask, memory_order_relaxed);
  }
  // In a line, a slot's lengths as bits of its line's lengths word (`bits`, in place under `mask`), for a claim
  // that writes them with its ticket (Board::claim_with_next).
  GPUKV_HD_INLINE void line_lens_bits(std::uint64_t index, SlotLens l, std::uint64_t& mask, std::uint64_t& bits) const {
    const std::uint32_t shift = static_cast<std::uint32_t>(index % Codec::kPerWord) * lens_stride * 8;
    mask = ((std::uint64_t{1} << (2 * len_bits)) - 1) << shift;
    bits = (std::uint64_t{l.key} | (std::uint64_t{l.value} << len_bits)) << shift;
  }
  // Both lengths of a slot nobody else reads (a key clean-up re-places). In a line, only this slot's bytes
  // of the lengths word: other threads fill their slots of the line meanwhile. A board slot's header is the
  // word before its key.
  template <bool kFromL2 = false>
  GPUKV_HD_INLINE void store_lens(std::uint64_t index, SlotLens l) const {
    if (len_bits == kBoardLenBits) {
      key_words_at(index)[-1] = std::uint64_t{l.key} | (std::uint64_t{l.value} << 32);
      return;
    }
    std::uint8_t* p = lens_at(index);
    if (len_bits == 8) {
#if defined(__CUDA_ARCH__)
      const auto both = static_cast<std::uint16_t>(l.key | (l.value << 8));  // one store
      if constexpr (kFromL2) {
        asm volatile("st.relaxed.gpu.global.u16 [%0], %1;" ::"l"(p), "h"(both) : "memory");
      } else {
        *reinterpret_cast<std::uint16_t*>(p) = both;
      }
#else
      store_len_byte(p, static_cast<std::uint8_t>(l.key));
      store_len_byte(p + 1, static_cast<std::uint8_t>(l.value));
#endif
    } else {
      store_len_byte<kFromL2>(p, static_cast<std::uint8_t>(l.key | (l.value << 4)));
    }
  }
  // Changes the value length of a slot whose key (of `key_len` bytes) only this thread may change, leaving
  // its key length as it is for the compares of other threads (a nibble is rewritten with its byte). On a
  // board, through lens_at() like the loads of the lengths: CopyValues' overwrites of 16 B / 128 B slots,
  // which load the header just before, ran 1.28x with this store than with the same store addressed from
  // the key (runs 176-179 in bench/RESULTS.md, issue 17, "a line's lengths in a word of their own"; why the
  // generated code differs so is not found).
  template <bool kFromL2 = false>
  GPUKV_HD_INLINE void store_value_len(std::uint64_t index, std::uint32_t value_len, std::uint32_t key_len) const {
    std::uint8_t* p = lens_at(index);
    if (len_bits == kBoardLenBits) {
      reinterpret_cast<std::uint32_t*>(p)[1] = value_len;
    } else if (len_bits == 8) {
      store_len_byte<kFromL2>(p + 1, static_cast<std::uint8_t>(value_len));
    } else {
      store_len_byte<kFromL2>(p, static_cast<std::uint8_t>(key_len | (value_len << 4)));
    }
  }
  // Words of a value, with the stored value's zeros past its length to the end of its last sector: how
  // many words store_value_words writes for a value of `len` bytes.
  // Counted from the slot's first sector: on a board its lengths, before the key; in a line its key.
  GPUKV_HD_INLINE std::uint32_t stored_value_words(std::uint32_t len) const {
    const std::uint32_t first_word = header_words() + key_words;
    const std::uint32_t sector_end = round_up_to_sectors((first_word + (len + 7) / 8) * 8);
    return (sector_end < value_fill_end ? sector_end : value_fill_end) / 8 - first_word;
  }
  // Bytes of a slot's key, value and word (if it has one, it follows the value): what clean-up moves, behind a
  // word of lengths (CleanupExtract).
  GPUKV_HD_INLINE std::uint32_t data_bytes() const {
    return key_words * 8 + value_stride + (slot_word_offset != 0 ? 8 : 0);
  }

  // Replaces the value of a slot whose key (of `key_len` bytes) only this thread may change. `store_len`
  // false: the slot holds a value of this length already.
  template <bool kFromL2 = false, class Value>
  GPUKV_HD_INLINE void store_value(std::uint64_t index, const Value& value, std::uint32_t key_len,
                                   bool store_len = true) const {
    if (store_len) store_value_len<kFromL2>(index, value.len, key_len);
    store_value_words(index, value);
  }
  // A line slot's value length out of its line's lengths word (`lens_word`, loaded with the tickets).
  GPUKV_HD_INLINE std::uint32_t line_value_len(std::uint64_t lens_word, std::uint64_t index) const {
    return line_lens(lens_word, index).value;
  }
  // The same for its key length.
  GPUKV_HD_INLINE std::uint32_t line_key_len(std::uint64_t lens_word, std::uint64_t index) const {
    return line_lens(lens_word, index).key;
  }
  // Words of lengths at the start of a slot's stride: one on a board, none in a line.
  GPUKV_HD_INLINE std::uint32_t header_words() const { return len_bits == kBoardLenBits ? 1 : 0; }

 private:
  // The 8-byte aligned word holding a slot's lengths: its header on a board, the line's lengths word.
  GPUKV_HD_INLINE const std::uint64_t* lens_word_at(std::uint64_t index) const {
    return reinterpret_cast<const std::uint64_t*>(reinterpret_cast<std::uintptr_t>(lens_at(index)) & ~std::uintptr_t{7});
  }
  // GPU walks (Walk): a board slot's lengths, in its header before its key (`key`). Only a board's walks run
  // as Walk::kAny on the GPU (CudaExecutor runs a line's as kLine or kLineFromL2), so that they read the
  // header without the address arithmetic of lens_at().
  GPUKV_HD_INLINE static SlotLens board_lens(const std::uint64_t* key) {
    const auto* header = reinterpret_cast<const std::uint32_t*>(key) - 2;
    return SlotLens{header[0], header[1]};
  }
  // A line slot's lengths out of its line's lengths word (`lens_word`, loaded with the tickets).
  GPUKV_HD_INLINE SlotLens line_lens(std::uint64_t lens_word, std::uint64_t index) const {
    const std::uint32_t shift = static_cast<std::uint32_t>(index % Codec::kPerWord) * lens_stride * 8;
    const std::uint64_t mask = (std::uint64_t{1} << len_bits) - 1;
    return SlotLens{static_cast<std::uint32_t>((lens_word >> shift) & mask),
                    static_cast<std::uint32_t>((lens_word >> (shift + len_bits)) & mask)};
  }
  // Slot `index`'s lengths out of its lengths word: shifts and masks, the same code for both layouts.
  GPUKV_HD_INLINE SlotLens lens_of(std::uint64_t word, std::uint64_t index) const {
    const std::uint32_t shift = static_cast<std::uint32_t>(reinterpret_cast<std::uintptr_t>(lens_at(index)) & 7) * 8;
    const std::uint64_t mask = (std::uint64_t{1} << len_bits) - 1;
    return SlotLens{static_cast<std::uint32_t>((word >> shift) & mask),
                    static_cast<std::uint32_t>((word >> (shift + len_bits)) & mask)};
  }
  // A byte of a line's lengths word. On the host, a relaxed atomic: other threads write their own slots'
  // bytes of the word, and an overwrite rewrites the byte whose key nibble a compare reads. On the GPU, a
  // relaxed store where a claim's 16-byte CAS may cover the word meanwhile (kFromL2, above).
  GPUKV_HD_INLINE static std::uint32_t host_load_len_byte(const std::uint8_t* p) {
    return atomic_ref<std::uint8_t>(*const_cast<std::uint8_t*>(p)).load(memory_order_relaxed);
  }
  template <bool kFromL2 = false>
  GPUKV_HD_INLINE static void store_len_byte(std::uint8_t* p, std::uint8_t v) {
#if defined(__CUDA_ARCH__)
    if constexpr (kFromL2) {
      asm volatile("st.relaxed.gpu.global.u8 [%0], %1;" ::"l"(p), "r"(static_cast<std::uint32_t>(v)) : "memory");
    } else {
      *p = v;
    }
#else
    atomic_ref<std::uint8_t>(*p).store(v, memory_order_relaxed);
#endif
  }

  // `value` has len and word(j) (a ValueIn). The value's words, then zeros to the end of the last sector
  // touched (stored_value_words), or of the slot where it ends first (a packed slot of the line layout); in
  // pairs of words from the first 16-byte boundary (store_pair).
  // `key`: a one-word key whose slot starts a 16-byte pair, stored with the value's first word (store_new).
  template <class Value>
  GPUKV_HD_INLINE void store_value_words(std::uint64_t index, const Value& value, const std::uint64_t* key = nullptr) const {
    std::uint64_t* out = value_words_at(index);
    const std::uint32_t words = (value.len + 7) / 8;
    const std::uint64_t last_mask = byte_mask(value.len % 8 == 0 ? 8 : value.len % 8);
    const auto word = [&](std::uint32_t j) {
      return j >= words ? 0 : j + 1 == words ? value.word(j) & last_mask : value.word(j);
    };
    const std::uint32_t total = stored_value_words(value.len);
    std::uint32_t j = 0;
    if (key != nullptr) {  // the value does not start a pair: its key does
      store_pair(out - 1, *key, word(0));
      j = 1;
    } else if (total != 0 && !pair_aligned(out)) {
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
