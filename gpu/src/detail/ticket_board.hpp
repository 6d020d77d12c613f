// The ticket-board: one ticket of B bits (B = 2, 4 or 8) per slot, packed into 64-bit words, kept apart
// from the slots and changed only by atomics on its words (Stadium Hashing, section III).
//
// A ticket is a small code rather than separate flag bits, so that every width can express the four states
// a concurrent table with deletes needs, and the rest of the code space carries info derived from the key:
//
//   0        EMPTY      never used since the last clean-up; a lookup that meets one stops
//   1        BUSY       claimed or deleted in the current pass and not yet settled: a new key's slot until
//                       its writer publishes it, a deleted one until the pass ends (on the GPU, only in
//                       a pass that may claim slots: Engine::commit); lookups pass over
//                       it and inserts may not take it (the Stash access bit). A line's new key alone in
//                       its pass may claim an EMPTY ticket FULL at once instead (Engine's invariants)
//   2        TOMBSTONE  deleted in an earlier pass; lookups pass over it, inserts reuse it
//   3..2^B-1 FULL       holds a key whose info code is this value (2^B - 3 codes: 1, 13 or 253)
//
// A code of 3..2^B-1 is the paper's "availability bit cleared plus info bits", with more info values for the
// same bits: the chance that a foreign key's ticket matches is 1/(2^B - 3) rather than 1/2^(B-1).
//
//   board word (B = 8):  | t7 | t6 | t5 | t4 | t3 | t2 | t1 | t0 |    ticket i of the word is bits [8i, 8i+8)
//
// Matching is SWAR: XOR the word with the wanted code broadcast to every field and find the zero fields,
// all tickets of a word in a handful of integer instructions (SwissTable compares its control bytes the same
// way). The zero-field test below is exact (no false positives from borrows), so match masks can be iterated.
#pragma once

#include <cstdint>

#include "hd.hpp"

// Board::claim_with_next: a 16-byte CAS, which the GPU has from sm_90 on. Code built for an earlier GPU
// claims a ticket alone and stores the lengths after it.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GPUKV_CLAIM_WITH_NEXT 1
#else
#define GPUKV_CLAIM_WITH_NEXT 0
#endif

namespace gpukv::detail {

template <int Bits>
struct TicketCodec {
  static_assert(Bits == 2 || Bits == 4 || Bits == 8, "a ticket needs at least 2 bits for its 4 states");

  static constexpr int kBits = Bits;
  static constexpr int kPerWord = 64 / Bits;
  static constexpr std::uint64_t kFieldMask = (std::uint64_t{1} << Bits) - 1;

  static constexpr std::uint64_t kEmpty = 0;
  static constexpr std::uint64_t kBusy = 1;
  static constexpr std::uint64_t kTombstone = 2;
  static constexpr std::uint64_t kFirstFull = 3;
  static constexpr std::uint32_t kFullCodes = (1u << Bits) - 3;

  static constexpr std::uint64_t broadcast(std::uint64_t field) {
    std::uint64_t word = 0;
    for (int i = 0; i < kPerWord; ++i) word |= field << (i * Bits);
    return word;
  }
  static constexpr std::uint64_t kLowBits = broadcast(kFieldMask >> 1);     // all but each field's top bit
  static constexpr std::uint64_t kTopBits = broadcast(std::uint64_t{1} << (Bits - 1));
  static constexpr std::uint64_t kNotTombstoneBit = broadcast(kFieldMask & ~kTombstone);

  // The top bit of every field of x that is zero. Exact: adding kLowBits to the low bits cannot carry out of
  // a field, so one field never disturbs its neighbour.
  GPUKV_HD_INLINE static std::uint64_t zero_fields(std::uint64_t x) {
    return ~(((x & kLowBits) + kLowBits) | x) & kTopBits;
  }
  GPUKV_HD_INLINE static std::uint64_t match(std::uint64_t word, std::uint64_t code) {
    return zero_fields(word ^ (code * broadcast(1)));
  }
  GPUKV_HD_INLINE static std::uint64_t empty(std::uint64_t word) { return zero_fields(word); }
  // EMPTY or TOMBSTONE: the codes that differ only in the tombstone bit.
  GPUKV_HD_INLINE static std::uint64_t available(std::uint64_t word) {
    return zero_fields(word & kNotTombstoneBit);
  }
  // Ticket index within its word of a field flagged in a mask from the functions above.
  GPUKV_HD_INLINE static int field_of(std::uint64_t mask) { return count_trailing_zeros(mask) / Bits; }
  GPUKV_HD_INLINE static std::uint64_t field_code(std::uint64_t word, int field) {
    return (word >> (field * Bits)) & kFieldMask;
  }
  GPUKV_HD_INLINE static constexpr std::uint64_t info_code(std::uint32_t info) {
    return kFirstFull + static_cast<std::uint32_t>((std::uint64_t{info} * kFullCodes) >> 32);
  }
};

// Board operations. Every change to a ticket is one atomic on its word; a plain store never touches a word
// that other threads may change.
template <int Bits>
struct Board {
  using Codec = TicketCodec<Bits>;
  std::uint64_t* words;
  std::uint64_t stride;  // 64-bit words from one ticket word to the next: 1 on a board, 16 in 128-byte lines

  GPUKV_HD_INLINE std::uint64_t* at(std::uint64_t word) const { return words + word * stride; }

  // Relaxed. A new key's ticket may turn FULL while the pass still runs (publish; on the GPU only,
  // Engine::commit), and a lookup that finds it FULL must see the slot its writer filled first. An
  // acquire load would say so in the memory model, but on the GPU it invalidates the SM's L1 at every probe,
  // and reading slots from L2 instead cost lookups 18-53% (bench/RESULTS.md, "inserts publish their own
  // slots"). What holds instead: the slot's address depends on the ticket loaded, so its load is
  // issued after this one returns; the writer's release has put the slot's bytes in L2 by then; and the SM's
  // L1 cannot hold them from before: on a board a slot has its 32-byte sectors to itself and no thread
  // reads them while the ticket is not FULL (and L1 starts empty with every kernel); in a line, whose slots
  // share sectors, a kernel that publishes new keys compares keys from L2 (TableRef::key_equals). Every
  // other ticket a lookup meets FULL was published by an earlier step, whose boundary orders the slot's
  // bytes before it.
  GPUKV_HD_INLINE std::uint64_t load(std::uint64_t word) const {
    return atomic_ref<std::uint64_t>(*at(word)).load(memory_order_relaxed);
  }

  // A line's ticket word and the word after it (its slots' lengths), in one 16-byte load of the line's first
  // sector (GPU; on the host, the ticket word alone and `next` 0: the host's walks load lengths apart).
  // Relaxed, as load().
  //
  // kFetchLine: the rest of the line fetched into L2 too (`.L2::128B`), for a unit whose slot an insert will
  // write. The slot's sectors are then in L2 whole when the insert stores into them, so that L2 writes them
  // back as whole sectors later, where a store into a sector L2 does not hold costs DRAM a read-modify-write
  // at eviction (a packed slot covers part of a sector).
  //
  // kWeak: a weak load, for a kernel in which nothing writes the table (Walk::kLineReadOnly), or nothing claims
  // a slot (Walk::kLineFetched: a mixed pass's GETs and deletes). A relaxed load at GPU scope passes the SM's
  // L1; a weak one leaves the sector there.
  template <bool kFetchLine, bool kWeak = false>
  GPUKV_HD_INLINE void load_with_next(std::uint64_t word, std::uint64_t& tickets, std::uint64_t& next) const {
#if defined(__CUDA_ARCH__)
    if constexpr (kWeak && kFetchLine) {
      asm volatile("ld.global.L2::128B.v2.u64 {%0, %1}, [%2];" : "=l"(tickets), "=l"(next) : "l"(at(word)));
    } else if constexpr (kWeak) {
      asm volatile("ld.global.v2.u64 {%0, %1}, [%2];" : "=l"(tickets), "=l"(next) : "l"(at(word)));
    } else if constexpr (kFetchLine) {
      asm volatile("ld.relaxed.gpu.global.L2::128B.v2.u64 {%0, %1}, [%2];"
                   : "=l"(tickets), "=l"(next) : "l"(at(word)) : "memory");
    } else {
      asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(tickets), "=l"(next) : "l"(at(word)) : "memory");
    }
#else
    tickets = load(word);
    next = 0;
#endif
  }

  // Turns an EMPTY or TOMBSTONE ticket into BUSY (or into `to`, where no thread can read the slot before
  // the step ends: clean-up). `seen` is the caller's latest view of the word and is refreshed when the word
  // changed underneath; returns false if the ticket was no longer available.
  GPUKV_HD_INLINE bool claim(std::uint64_t word, int field, std::uint64_t& seen, std::uint64_t to = Codec::kBusy) const {
    const int shift = field * Bits;
    const std::uint64_t code = (seen >> shift) & Codec::kFieldMask;
    const std::uint64_t desired = (seen & ~(Codec::kFieldMask << shift)) | (to << shift);
    return (code == Codec::kEmpty || code == Codec::kTombstone) &&
           atomic_ref<std::uint64_t>(*at(word)).compare_exchange_strong(seen, desired, memory_order_relaxed);
  }

#if GPUKV_CLAIM_WITH_NEXT
  // claim() that also sets bits of the word after the ticket word (a line's lengths word: the new slot's
  // lengths, so that no store of its own follows), in one 16-byte CAS of both words. `seen_next` is the
  // caller's latest view of that word; both views are refreshed when the CAS fails. Only the bits in
  // `next_mask` change, to `next_bits`: other threads' lengths in the word stay as the CAS finds them.
  GPUKV_HD_INLINE bool claim_with_next(std::uint64_t word, int field, std::uint64_t& seen, std::uint64_t& seen_next,
                                       std::uint64_t next_mask, std::uint64_t next_bits,
                                       std::uint64_t to = Codec::kBusy) const {
    const int shift = field * Bits;
    const std::uint64_t code = (seen >> shift) & Codec::kFieldMask;
    if (code != Codec::kEmpty && code != Codec::kTombstone) return false;
    const std::uint64_t desired = (seen & ~(Codec::kFieldMask << shift)) | (to << shift);
    const std::uint64_t desired_next = (seen_next & ~next_mask) | next_bits;
    std::uint64_t now, now_next;
    asm volatile(
        "{\n\t.reg .b128 d, b, c;\n\tmov.b128 b, {%2, %3};\n\tmov.b128 c, {%4, %5};\n\t"
        "atom.relaxed.gpu.global.cas.b128 d, [%6], b, c;\n\tmov.b128 {%0, %1}, d;\n\t}"
        : "=l"(now), "=l"(now_next)
        : "l"(seen), "l"(seen_next), "l"(desired), "l"(desired_next), "l"(at(word))
        : "memory");
    const bool claimed = now == seen && now_next == seen_next;
    seen = now;
    seen_next = now_next;
    return claimed;
  }
#endif

  // Turns the BUSY ticket of a slot this thread has just filled into FULL `code`. Release: the slot's bytes
  // are visible before the ticket that lets other lookups read them.
  GPUKV_HD_INLINE void publish(std::uint64_t word, int field, std::uint64_t code) const {
    atomic_ref<std::uint64_t>(*at(word)).fetch_xor((Codec::kBusy ^ code) << (field * Bits), memory_order_release);
  }

  // Changes a ticket this thread owns from one known code to another. XOR touches no other ticket and needs
  // no retry; the caller's ownership (BUSY, or the only thread that may change this key) makes it safe.
  GPUKV_HD_INLINE void flip(std::uint64_t word, int field, std::uint64_t from, std::uint64_t to) const {
    atomic_ref<std::uint64_t>(*at(word)).fetch_xor((from ^ to) << (field * Bits), memory_order_relaxed);
  }
};

}  // namespace gpukv::detail
