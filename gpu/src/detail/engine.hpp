// The per-key algorithm: the one copy of the table's logic, run by CUDA threads and by host threads alike.
//
// run_key() executes, in batch order, every op of one key in the current pass. It touches the table at most
// three times whatever the number of ops: one walk along the key's probe sequence (start/step), at most one
// claim of a new slot, and one commit (apply). In between, the ops are applied to a small state in
// registers (present? whose value?), so a hot key that appears thousands of times in a batch costs one walk,
// and intermediate values are never written.
//
// Two tiers (Stadium Hashing, "Efficient Out-of-core Performance"): the device tier and an optional host
// tier whose slots are in pinned host memory and whose ticket-board is in GPU memory. Both are TableRefs of
// one type. A key lives in at most one tier. The walk covers the device tier, then, if the key was not
// found and the host tier held keys when the pass began, the host tier: its tickets are in GPU memory, so a
// lookup they reject crosses no PCIe, and only a ticket whose info code and tag byte (table_ref.hpp) match
// costs a host read. A new key is placed in the device tier while it has room (max_load_factor), else in
// the host tier, with one host write. An overwrite or delete acts where the key is. The probing kernels
// walk the device tier only (step<false>, apply<false>); an op that must touch the host tier runs in the
// pass's host phase, sorted by host address (pass_ops.hpp).
//
// Invariants that make concurrent ops on different keys safe:
//  * A key lives in at most one slot of one tier, and only the thread running that key changes it in a pass
//    (for a key alone in the pass, CopyValues may finish the copy of its value in a later step of the pass;
//    pass_ops.hpp).
//  * Lookups stop at the first unit holding an EMPTY ticket. During a pass EMPTY tickets only disappear, or
//    appear in a unit that holds one already (clean-up runs between passes; the undo of a failed optimistic
//    pass gives back only the EMPTY tickets the pass took): no unit starts to stop walks, so an insert that
//    claims the first available ticket at or before that unit keeps every key reachable.
//  * In a line, a slot whose ticket is EMPTY has zero lengths and a zero key; in the device tier's board, a
//    zero lengths word: the table starts zeroed, and whatever turns a ticket EMPTY zeroes them first
//    (TableRef::empty_device_slot, TableRef::clear_line_slot): clean-up (CleanupExtract), the undo of a failed
//    optimistic pass, and a line's delete settled at once in a unit that holds an EMPTY ticket already
//    (frees_slot_at_once), where every walk stops anyway. Nothing else makes a ticket EMPTY.
//  * No lookup sees a half-written key or value. A new key's slot stays BUSY (skipped by every lookup) while
//    it is written. On the GPU's board, and in a line by a kernel whose compares read from L2 (the probing
//    step of a pass of inserts: compares_in_l2; the ordered and the host phase), its writer then publishes
//    it with a release (Board::publish; Board::load says why lookups of this kernel then see all of it, and
//    TableRef::key_equals why a line's compares must then read from L2); so does the kernel that runs a
//    mixed pass's PUTs apart (LanePolicy::split). In a line's kernels that compare from L2, but for that
//    last one, a key alone in the pass that takes an EMPTY ticket claims it FULL at once instead, and writes
//    its slot after: a reader of the same kernel that meets the ticket first compares its key against the
//    zero slot or the new key, neither of which is its own (same-key ops run in one thread), and reads no
//    value (full_claim_code says why, and which keys still go through BUSY). On a board, a key alone in the
//    pass whose slot CopyValues writes whole claims an EMPTY ticket FULL at once too: until CopyValues writes
//    it, a reader meets a zero lengths word there (whole_slot_full_code).
//    Any other new slot, and one whose value CopyValues writes later, stays BUSY until FinishPass publishes
//    it after the pass. A deleted slot stays BUSY until FinishPass makes it a TOMBSTONE, so nobody can reuse
//    it and rewrite its key while a reader that saw its old FULL ticket compares against it; on the GPU,
//    where no op that may claim a slot runs beside the delete (a pass without PUTs, or the kernel that runs a
//    mixed pass's other ops before its PUTs), it becomes a TOMBSTONE at once (commit, Settle), or in that
//    kernel EMPTY where frees_slot_at_once allows. An overwrite rewrites only the value, which only the key's
//    own thread reads. Everything else is ordered by kernel boundaries (on the CPU backend, by the thread
//    pool's join at the end of each step).
//  * An optimistic pass (PassRef::optimistic: PUTs only, not grouped, on the GPU's line) may
//    run two ops of one key at once. Only one of them inserts it: each claims an EMPTY ticket of the first
//    unit holding one, with a CAS that fails if the unit changed, and a walk that meets a claim it cannot
//    judge yet tries again (settled). Any op whose key is present fails the pass, which is then undone and
//    run again, grouped (insert_optimistic; PassRunner).
#pragma once

#include <cstdint>
#include <type_traits>

#include "batch_ref.hpp"
#include "hd.hpp"
#include "key_hash.hpp"
#include "table_ref.hpp"

namespace gpukv::detail {

// Where a key is, or where its insert into the device tier may begin.
struct Location {
  std::uint64_t slot = 0;          // valid if hit
  std::uint64_t claim_unit = 0;    // device tier: the first unit where an available ticket was seen
  std::uint64_t claim_probe = 0;   // its position in the probe sequence
  std::uint64_t claim_tickets = 0; // that unit's board word as seen then (claim() starts from it)
  bool hit = false;
  bool in_host = false;            // the walk went on into the host tier (and the hit, if any, is there)
  bool can_claim = false;          // an available device-tier ticket was seen on the probe sequence
  bool to_host = false;            // a device-tier-only walk (step<false>) ended where the host tier must be walked
  std::uint32_t host_avoided = 0;  // host slot reads the info bits ruled out (added to the tally by apply())
};

// A unit's board word and, for a line's walks on the GPU (Walk::kLine, kLineFromL2), its slots' lengths word,
// loaded with it; 0 otherwise.
struct UnitWords {
  std::uint64_t tickets;
  std::uint64_t lens;
};

// One key's walk along its probe sequence, resumable a unit at a time: Stash walks it to the end in one
// thread; clStash parks unfinished walks in shared memory and hands them to idle lanes (clstash_kernel.cuh).
struct Probe {
  KeyWords key;
  ProbePlan plan;         // the plan of the tier being walked (the info is the same in both tiers)
  std::uint64_t code;     // the key's info code
  std::uint64_t unit;     // the next unit to examine
  std::uint64_t probe;    // its position in the sequence
  UnitWords words;        // its words when probe == 0 (loaded early; later units load theirs); once the walk
                          // found its key in the device tier, the words of the key's unit; in a walk that
                          // compares from L2 (from_l2), once it saw where a new key may be claimed
                          // (claim_unit), that unit's (the walks that never claim keep their loop as it was:
                          // run 225 measured the lookup kernel's misses 4-5% slower with it)
  Location at;            // the outcome so far; final once step() returns true
};

// A new key's lengths, for a claim in a line that writes them with its ticket (claim_ticket; GPU only): one
// request to L2 less per insert, where an insert is bound by its requests (bench/RESULTS.md, issue 17, "an
// insert's stores merged"). `word`: the claim unit's lengths word as the walk loaded it.
struct LensClaim {
  std::uint64_t word;
  SlotLens lens;
  // Set wherever a LensClaim is passed, and tested by the claim at run time: the same test made at compile
  // time (a template parameter) measured the Stash kernel's passes of 65536 inserts 22% slower (run 229).
  bool wanted = false;
  bool stored = false;  // set when the claim wrote them
  // The key's FULL code, where an EMPTY ticket may be claimed as FULL at once (Engine::full_claim_code); 0
  // where every claim goes through BUSY. `full` is set when the claim took an EMPTY ticket that way.
  std::uint32_t full_code = 0;  // a FULL code: at most 8 bits
  bool full = false;
};

// claim_ticket's claim of ticket `field` of board word `word` (seen as `tickets`, this ticket as `code`)
// where the lengths are not written with it: an EMPTY ticket becomes `lens->full_code` rather than `to` if
// `lens` is given and that is not 0 (a board's slot that CopyValues writes whole: Engine::whole_slot_full_code).
// On the GPU only: the CPU backend makes no such claim (Engine::apply says why), and its claim stays as it was.
template <class Ref>
GPUKV_HD_INLINE bool claim_without_lens(const Ref& t, std::uint64_t word, int field, std::uint64_t& tickets,
                                        [[maybe_unused]] std::uint64_t code, std::uint64_t to,
                                        [[maybe_unused]] LensClaim* lens) {
#if defined(__CUDA_ARCH__)
  const bool full = lens != nullptr && lens->full_code != 0 && code == Ref::Codec::kEmpty;
  const bool claimed = t.board.claim(word, field, tickets, full ? lens->full_code : to);
  if (lens != nullptr) lens->full = claimed && full;
  return claimed;
#else
  return t.board.claim(word, field, tickets, to);
#endif
}

// Claims the first available ticket of tier `t` from `unit` (position `probe` of a sequence with `step`),
// whose board word the caller saw as `tickets`, setting it to `to` (BUSY unless the caller owns the step:
// see TicketBoard::claim). Returns false if none is left. A reused tombstone is subtracted from `tombstones`.
// `lens` (a line on the GPU, or null): the slot's lengths, written with the ticket if `lens->wanted` (the
// caller saw `unit`'s lengths word) and the GPU has a 16-byte CAS; `lens->stored` says whether they were.
// There, an EMPTY ticket becomes `lens->full_code` rather than `to` if that is not 0 (`lens->full` says so).
template <class Ref, class Count>
GPUKV_HD bool claim_ticket(const Ref& t, std::uint64_t unit, std::uint64_t probe, std::uint64_t step,
                           std::uint64_t tickets, std::uint64_t& slot, Count& tombstones,
                           std::uint64_t to = Ref::Codec::kBusy, [[maybe_unused]] LensClaim* lens = nullptr) {
  using Codec = typename Ref::Codec;
  const std::uint64_t first_probe = probe;  // a stale view of its word only costs a failed CAS, which refreshes it
  for (; probe < t.units; ++probe) {
    const std::uint64_t word = t.word_of(unit);
    const std::uint64_t lanes = t.lanes_of(unit);
    if (probe != first_probe) {
#if GPUKV_CLAIM_WITH_NEXT
      if (lens != nullptr && lens->wanted) {
        t.board.template load_with_next<false>(word, tickets, lens->word);
      } else {
        tickets = t.board.load(word);
      }
#else
      tickets = t.board.load(word);
#endif
    }
    for (std::uint64_t open = Codec::available(tickets) & lanes; open != 0; open = Codec::available(tickets) & lanes) {
      const int field = Codec::field_of(open);
      const std::uint64_t code = Codec::field_code(tickets, field);
      bool claimed;
#if GPUKV_CLAIM_WITH_NEXT
      if (lens != nullptr && lens->wanted) {
        std::uint64_t mask, bits;
        t.line_lens_bits(Ref::slot_of(word, field), lens->lens, mask, bits);
        const bool full = lens->full_code != 0 && code == Codec::kEmpty;
        claimed = lens->stored =
            t.board.claim_with_next(word, field, tickets, lens->word, mask, bits, full ? lens->full_code : to);
        lens->full = claimed && full;
      } else {
        claimed = claim_without_lens(t, word, field, tickets, code, to, lens);
      }
#else
      claimed = claim_without_lens(t, word, field, tickets, code, to, lens);
#endif
      if (claimed) {  // a failed claim refreshes `tickets`
        if (code == Codec::kTombstone) tombstones -= 1;
        slot = Ref::slot_of(word, field);
        return true;
      }
    }
    unit = next_unit(unit, step, t.units);
  }
  return false;
}

template <class Ref>
struct Engine {
  using Codec = typename Ref::Codec;

  Ref table;  // the device tier
  Ref host;   // the host tier; host.units == 0 when the table has none
  BatchRef batch;
  PassRef pass;

  // A device-tier unit's words as a walk of kind kWalk loads them (Walk).
  // kFetchLine: a line's whole line fetched into L2 with its words (Board::load_with_next); by default as the
  // walk does (fetches_line).
  template <Walk kWalk, bool kFetchLine = fetches_line(kWalk)>
  GPUKV_HD_INLINE UnitWords load_unit(std::uint64_t word) const {
    UnitWords u{0, 0};
    if constexpr (kWalk == Walk::kAny) {
      u.tickets = table.board.load(word);
    } else {
      table.board.template load_with_next<kFetchLine, loads_through_l1(kWalk)>(word, u.tickets, u.lens);
    }
    return u;
  }
  // The words of the plan's first unit: callers load them early, so that their latency overlaps other work.
  template <Walk kWalk = Walk::kAny, bool kFetchLine = fetches_line(kWalk)>
  GPUKV_HD_INLINE UnitWords first_unit(const ProbePlan& plan) const {
    return load_unit<kWalk, kFetchLine>(table.word_of(plan.first));
  }

  // A walk for `key` from the plan's first unit, whose words the caller loaded early (first_unit()), so that
  // their latency overlapped other work.
  GPUKV_HD_INLINE Probe start(const KeyWords& key, const ProbePlan& plan, UnitWords first) const {
    Probe p;
    start(p, key, plan, first);
    return p;
  }
  // The same, written into the caller's Probe field by field. A host thread that copied a whole Probe into
  // its own loaded it in 16-byte pieces straight after storing its fields 8 bytes at a time, and each such
  // load waited for the stores to reach the cache (see started_words).
  GPUKV_HD_INLINE void start(Probe& p, const KeyWords& key, const ProbePlan& plan, UnitWords first) const {
    p.key = key;
    p.plan = plan;
    p.code = Codec::info_code(plan.info);
    p.unit = plan.first;
    p.probe = 0;
    p.words = first;
    p.at = Location{};
  }

  // Host threads only: cache hints for the start of a key's walk in the device tier. A GPU hides the
  // latency of each op's board and slot reads behind its thousands of resident warps; a CPU thread runs one
  // op at a time, so CpuExecutor issues these a few ops ahead to keep several ops' misses in flight.
  // Stage 0: the key's first board word. Stage 1, issued once stage 0 has had time to land: the slots whose
  // tickets in that word carry the key's info code (the slot a hit will compare against).
  void prefetch_walk(const ProbePlan& plan, int stage) const {
    const std::uint64_t word = table.word_of(plan.first);
    if (stage == 0) {
      __builtin_prefetch(table.board.at(word));
      return;
    }
    const std::uint64_t code = Codec::info_code(plan.info);
    for (std::uint64_t m = Codec::match(table.board.load(word), code) & table.lanes_of(plan.first); m != 0; m &= m - 1) {
      __builtin_prefetch(table.slot(Ref::slot_of(word, Codec::field_of(m))));
    }
  }

  // Examines one unit of the walk. Returns true when the walk is over: the key was found, or a unit with an
  // EMPTY ticket (or the end of the sequence) proves it absent from every tier that may hold it. With
  // kWithHost false the walk covers the device tier only and, where the host tier would be next, ends with
  // at.to_host set: the probing kernels leave every host access to the host phase (pass_ops.hpp), so their
  // hot loop carries none of the host tier's registers.
  //
  // kWalk: how the device tier's units and compares are read (Walk): kLineFromL2 where compares_in_l2() says
  // so, kLine for a line's other walks on the GPU. A template parameter, chosen once per thread by the kernel,
  // rather than a test at every compare: that test, though the same in every lane, halved the lanes active
  // per instruction in the probing loop and cost finds up to 56% (bench/RESULTS.md, "a line's new keys
  // published in the pass"). The host tier, always a board, is walked as Walk::kAny.
  // kOptimistic: the walk of an optimistic pass's PUT (insert_optimistic), device tier and kLineFromL2 only.
  template <bool kWithHost = true, Walk kWalk = Walk::kAny, bool kOptimistic = false>
  GPUKV_HD bool step(Probe& p, Tally& tally) const {
    if constexpr (kOptimistic) {
      static_assert(!kWithHost && kWalk == Walk::kLineFromL2, "an optimistic pass walks a line's device tier");
      return step_in<false, false, kWalk, true>(table, p, tally);
    } else if constexpr (kWithHost) {
      // Two instantiations rather than a tier chosen at run time: neither the tiers nor the tally are ever
      // selected by reference, which would move them from registers to local memory.
      return p.at.in_host ? step_in<true, true, Walk::kAny>(host, p, tally)
                          : step_in<false, true, kWalk>(table, p, tally);
    } else {
      return step_in<false, false, kWalk>(table, p, tally);
    }
  }

  // Whether the probing step's device-tier compares read from L2 (step's kLineFromL2, picked by the kernel): on
  // the GPU, in a line, during a pass of inserts, one whose every op writes while the pass before added
  // keys (PassRef::inserts_expected). A kernel whose compares read from L2 publishes its new keys in the pass
  // (commit). A line's other passes keep FinishPass, because their compares through L1 are faster: by 7%
  // for a mixed batch's GETs, up to 10% for overwrites (bench/RESULTS.md, "a line's new keys published in
  // the pass").
  GPUKV_HD_INLINE bool compares_in_l2() const {
#if defined(__CUDA_ARCH__)
    return pass.inserts_expected && pass.counters->writes == batch.size;
#else
    return false;
#endif
  }

  // The words of a walk's first unit, loaded when it started (Probe::words). A walk of kAny has no lengths
  // word (0) and reads the ticket word alone: on the host, a 16-byte load of the two words, which start()
  // stored apart, cannot take them from the store buffer and waits for the stores to reach the cache; with
  // the Probe copied whole as well, finds in batches of 2048 on the CPU backend ran at 0.57-0.80x (2-core VM,
  // bench/RESULTS.md, 2026-11-28, "the CPU backend's walks").
  template <Walk kWalk>
  GPUKV_HD_INLINE static UnitWords started_words(const Probe& p) {
    if constexpr (kWalk == Walk::kAny) {
      return UnitWords{p.words.tickets, 0};
    } else {
      return p.words;
    }
  }

  template <bool kHost, bool kWithHost, Walk kWalk, bool kOptimistic = false>
  GPUKV_HD_INLINE bool step_in(const Ref& t, Probe& p, Tally& tally) const {
    if (p.probe >= t.units) return end_of_tier<kWithHost>(p);
    const std::uint64_t word = t.word_of(p.unit);
    const std::uint64_t lanes = t.lanes_of(p.unit);
    const UnitWords u = p.probe == 0 ? started_words<kHost ? Walk::kAny : kWalk>(p)
                                     : kHost ? UnitWords{t.board.load(word), 0} : load_unit<kWalk>(word);
    // An optimistic walk that cannot judge this unit yet ends here, having found nothing and no EMPTY ticket
    // short of the sequence's end: insert_optimistic tells it from the others by that.
    if constexpr (kOptimistic) {
      if (!settled(word, lanes, u, p)) return true;
    }
    const std::uint64_t tickets = u.tickets;
    std::uint64_t matches = Codec::match(tickets, p.code) & lanes;
    if constexpr (kHost) {
      // Stash Figure 4: every occupied ticket whose info differs is a host read not made, and so is every
      // match that the slot's tag byte rules out. Counted in the walk, added by apply().
      const std::uint64_t occupied =
          ~(Codec::empty(tickets) | Codec::match(tickets, Codec::kBusy) | Codec::match(tickets, Codec::kTombstone)) & lanes;
      std::uint32_t avoided = static_cast<std::uint32_t>(popcount(occupied & ~matches));
      if (t.tags != nullptr) {
        const std::uint8_t tag = Ref::tag_of(p.plan.info);
        for (std::uint64_t m = matches; m != 0; m &= m - 1) {
          if (t.tags[Ref::slot_of(word, Codec::field_of(m))] != tag) {
            matches &= ~(m & (~m + 1));
            avoided += 1;
          }
        }
      }
      p.at.host_avoided += avoided;
    }
    for (std::uint64_t m = matches; m != 0; m &= m - 1) {
      const std::uint64_t slot = Ref::slot_of(word, Codec::field_of(m));
      if constexpr (kHost) tally.host_reads += 1;
      if (t.template key_equals<kWalk>(slot, p.key, u.lens)) {
        p.at.hit = true;
        p.at.slot = slot;
        if constexpr (!kHost) p.words = u;  // the lengths word a line's hit reads its value's length from
        return true;
      }
    }
    // An optimistic pass claims EMPTY tickets only (insert_optimistic).
    if (!kHost && !p.at.can_claim && ((kOptimistic ? Codec::empty(tickets) : Codec::available(tickets)) & lanes) != 0) {
      p.at.can_claim = true;
      p.at.claim_unit = p.unit;
      p.at.claim_probe = p.probe;
      p.at.claim_tickets = tickets;
      if constexpr (from_l2(kWalk)) p.words = u;  // the lengths word a claim there writes (LensClaim)
    }
    if ((Codec::empty(tickets) & lanes) != 0) return end_of_tier<kWithHost>(p);
    p.unit = next_unit(p.unit, p.plan.step, t.units);
    p.probe += 1;
    return false;
  }

  // Skips the device tier: the walk goes straight on in the host tier (for a key known to be in no device
  // slot; the host tier must hold keys).
  GPUKV_HD_INLINE void start_host_walk(Probe& p) const { end_of_tier<true>(p); }

  // A tier's walk ended without finding the key. After the device tier, the host tier comes next if it may
  // hold the key: walked now, or (kWithHost false) left to the host phase. Returns true if the walk is over.
  template <bool kWithHost>
  GPUKV_HD_INLINE bool end_of_tier(Probe& p) const {
    if (p.at.in_host || !pass.walks_host()) return true;
    if constexpr (!kWithHost) {
      p.at.to_host = true;
      return true;
    }
    p.at.in_host = true;
    p.plan = plan_probe(hash_key(p.key, table.key_words), host.units);
    p.unit = p.plan.first;
    p.probe = 0;
    p.words = UnitWords{host.board.load(host.word_of(p.unit)), 0};
    return false;
  }

  // Whether an optimistic pass's walk may judge a unit (PassRef::optimistic), where no op's key is alone in
  // the pass by grouping: another op may be inserting this op's key meanwhile, and its claim shows as a BUSY
  // ticket, whose key is not known, or (one-word keys) as a FULL ticket of the key's code whose slot still
  // holds an EMPTY slot's zeros (full_claim_code). Each lasts until that op's next store or release; the walk
  // is then tried again (OptimisticTry::kAgain), and sees that key if it is this op's. A FULL ticket whose
  // slot holds zeros is a zero key, not a claim, where its code is the zero key's of the length its lengths
  // word gives (a claim made FULL at once never has that code: full_claim_code). A lengths word loaded from
  // before the claim (the slot was EMPTY, its lengths 0) gives length 0: over zeros, that is a zero key's code
  // such a claim never has either; over a stored key, no key of length 0 holds one. Either way the walk tries
  // again rather than compare against lengths that are not the key's.
  // Keys of more words are always claimed through BUSY, so their FULL tickets are published keys, which the
  // walk judges as any other (a zero key of 9 bytes or more among them: no one-word zero key's code applies).
  GPUKV_HD_INLINE bool settled(std::uint64_t word, std::uint64_t lanes, const UnitWords& u, const Probe& p) const {
    if ((Codec::match(u.tickets, Codec::kBusy) & lanes) != 0) return false;
    bool judged = true;
    if constexpr (Ref::key_words == 1) {
      for (std::uint64_t m = Codec::match(u.tickets, p.code) & lanes; m != 0; m &= m - 1) {
        const std::uint64_t slot = Ref::slot_of(word, Codec::field_of(m));
        const std::uint32_t len = table.line_key_len(u.lens, slot);
        if (table.key_words_zero(slot) ? p.code != zero_key_code(len) : len == 0) judged = false;
      }
    }
    return judged;
  }

  // An optimistic pass's PUT (PassRef::optimistic; GPU, a line), one try: walks from `p`'s
  // start and inserts the key (kInserted); or finds the key present (an earlier key, or another op of the
  // pass inserted it first) or no EMPTY ticket, and changes nothing (kFailed); or changes nothing and must be
  // tried again, from the start (kAgain): its walk met a unit it cannot judge yet (settled), or another op
  // took the ticket it claimed, which the next walk then meets. Never waits in a loop of its own: the op it
  // would wait for may be another lane of its warp, which the kernel lets finish its try first
  // (optimistic_kernel). The claim takes an EMPTY ticket of the unit where the walk ended, never a
  // TOMBSTONE, so that a failed pass's undo knows what each claimed ticket was (EraseOptimisticInserts); its
  // lengths go with the ticket, and the ticket is FULL at once where full_claim_code allows, as in a pass of
  // inserts. A pass's keys fit the device tier (BeginPass checked), so nothing reserves room. A walk that
  // stopped at a unit it could not judge has neither found the key nor seen an EMPTY ticket (it would have
  // ended there), and stopped short of its sequence's end: no field of its own, which would have grown every
  // Location, and with it the clStash kernel's stack (8 more bytes a thread, run 294).
  enum class OptimisticTry : std::uint8_t { kInserted, kFailed, kAgain };
  GPUKV_HD OptimisticTry insert_optimistic(Probe& p, const ValueIn& value, Tally& tally) const {
    while (!step<false, Walk::kLineFromL2, true>(p, tally)) {
    }
    if (p.at.hit) return OptimisticTry::kFailed;
    if (!p.at.can_claim) return p.probe < table.units ? OptimisticTry::kAgain : OptimisticTry::kFailed;
    const std::uint64_t word = table.word_of(p.at.claim_unit);
    std::uint64_t tickets = p.at.claim_tickets;
    const int field = Codec::field_of(Codec::empty(tickets) & table.lanes_of(p.at.claim_unit));
    const std::uint64_t slot = Ref::slot_of(word, field);
    const std::uint64_t full = full_claim_code(p);
#if GPUKV_CLAIM_WITH_NEXT
    std::uint64_t lens = p.words.lens, mask, bits;
    table.line_lens_bits(slot, SlotLens{p.key.len, value.len}, mask, bits);
    const bool lens_stored = true;
    const bool claimed = table.board.claim_with_next(word, field, tickets, lens, mask, bits, full != 0 ? full : Codec::kBusy);
#else
    const bool lens_stored = false;
    const bool claimed = table.board.claim(word, field, tickets, full != 0 ? full : Codec::kBusy);
#endif
    if (!claimed) return OptimisticTry::kAgain;
    tally.items += 1;
    table.template store_new<true>(slot, p.key, value, lens_stored);
    if (full == 0) table.board.publish(word, field, p.code);
    return OptimisticTry::kInserted;
  }

  // Takes out a key that a failed optimistic pass inserted, at `slot` under FULL `code`: the slot gets an
  // EMPTY slot's bytes, then its ticket turns EMPTY again, as it was before the claim (insert_optimistic).
  GPUKV_HD void erase_optimistic(std::uint64_t slot, std::uint64_t code, Tally& tally) const {
    table.clear_line_slot(slot);
    table.board.flip(slot / Codec::kPerWord, static_cast<int>(slot % Codec::kPerWord), code, Codec::kEmpty);
    tally.items -= 1;
  }

  // The FULL code with which a new key alone in its pass may claim an EMPTY ticket at once, skipping BUSY and
  // the publish after its slot is written (LensClaim::full_code), or 0 where it may not. A reader in the
  // same kernel that meets the FULL ticket before the slot's bytes reach it reads the bytes of an EMPTY
  // slot, which are zero in a line, lengths included (see the invariants above): it cannot take
  // them for its own key unless that key is zero bytes of the new key's length (or, if its load saw the
  // ticket but not the lengths word the claim wrote with it, of length 0) and carries the same code. Keys
  // whose code is one of those two codes therefore go through BUSY. One-word keys only, whose key a compare
  // reads in one load; never for a value that CopyValues writes after the probing step.
  GPUKV_HD_INLINE std::uint64_t full_claim_code(const Probe& p) const {
    if constexpr (Ref::key_words != 1) {
      return 0;
    } else {
      return pass.copy_later || zero_slot_may_match(p) ? 0 : p.code;
    }
  }
  // The FULL code with which a new key alone in its pass may claim an EMPTY board slot at once, where
  // CopyValues writes the slot whole after the probing step (the walk writes nothing of it), or 0. Until
  // then the slot holds what an EMPTY device-tier board slot holds: a zero lengths word (see the invariants
  // above). A reader of the pass that meets the FULL ticket compares its key's length against that zero, so
  // only the empty key could take the slot for its own: a key with the empty key's code goes through BUSY.
  // Such a claim saves FinishPass's publish, a second random atomic on the ticket's word (a 16 B / 128 B
  // insert's FinishPass took 1.9 of 12.2 ms, H100, run 337).
  GPUKV_HD_INLINE std::uint64_t whole_slot_full_code(const Probe& p) const {
    constexpr std::uint64_t kEmptyKeyCode = Codec::info_code(zero_key_info(0, Ref::key_words));
    return pass.copy_later && table.slots_own_sectors() && p.code != kEmptyKeyCode ? p.code : 0;
  }
  // Whether a deleted key's ticket in a line, settled at once by the kernel that runs a mixed pass's other ops
  // before its PUTs (commit, Settle::kAlways, in a pass with PUTs), turns EMPTY rather than TOMBSTONE: its unit
  // held an EMPTY ticket when the walk read it, so every walk that reaches the unit stops there whatever this
  // slot becomes, and no key has to move. No claim runs beside that kernel (the PUTs' kernel after it waits
  // for it to end: wait_for_earlier_kernels), so the EMPTY is still there. The slot first gets an EMPTY
  // slot's bytes (TableRef::empty_device_slot), which a reader of the same kernel that saw the key's FULL
  // ticket may compare against in any mix with the key's own (its lengths and its key are two loads): only
  // the zero key of the key's length, or the empty key, could then match, so a key with either's code stays a
  // TOMBSTONE, as full_claim_code rules for claims. One-word keys only: a key of several words is compared
  // word by word, and could match a mix of its words and zeros.
  // A tombstone costs no walk anything where its unit stops walks anyway; but only clean-up, a pass over the
  // whole tier, turns it EMPTY, and comes sooner the more there are: mixed batches in a steady state (5%
  // deletes) ran 1.025-1.028x, with half the clean-ups (H100, runs 373-374). Not in a pass without PUTs (which
  // the split kernels run after a mixed pass), nor on a board: the stores that zero the slot, a sector more
  // written back for each delete, cost a pass of deletes up to 8% in a line and 26% on a board (runs 373-374).
  GPUKV_HD_INLINE bool frees_slot_at_once(const Probe& p) const {
    if constexpr (Ref::key_words != 1) {
      return false;
    } else {
      return !table.slots_own_sectors() && (Codec::empty(p.words.tickets) & table.lanes_of(p.unit)) != 0 &&
             !zero_slot_may_match(p);
    }
  }
  // Whether a one-word key carries the code of a key that an EMPTY line slot's zeros, or a mix of them and the
  // key's own bytes, could match in a compare: the zero key of its length, or the empty key (a reader's loads
  // of the lengths and of the key may see different moments). Such a key's slot goes through BUSY where
  // others are claimed FULL at once (full_claim_code), and stays a TOMBSTONE where others are freed at once
  // (frees_slot_at_once).
  GPUKV_HD_INLINE static bool zero_slot_may_match(const Probe& p) {
    return p.code == zero_key_code(p.key.len) || p.code == zero_key_code(0);
  }
  // The code of the one-word zero key of `len` bytes (0 to 8; none, ~0, for longer). The codes, a byte each
  // by length, are worked out at compile time: a shift at run time rather than a hash of the zero key.
  GPUKV_HD_INLINE static std::uint64_t zero_key_code(std::uint32_t len) {
    constexpr std::uint64_t kOfLengths1To8 = [] {
      std::uint64_t codes = 0;
      for (std::uint32_t l = 1; l <= 8; ++l) codes |= Codec::info_code(zero_key_info(l, 1)) << (8 * (l - 1));
      return codes;
    }();
    constexpr std::uint64_t kOfLength0 = Codec::info_code(zero_key_info(0, 1));
    return len == 0 ? kOfLength0 : len <= 8 ? (kOfLengths1To8 >> (8 * (len - 1))) & 0xFF : ~std::uint64_t{0};
  }

  // Counts a new key against its tier's max_items. Unchecked passes cannot overflow the device tier (there
  // was room for every op when the pass began).
  GPUKV_HD bool reserve(bool in_host, Tally& tally) const {
    if (!pass.reserves() && !in_host) {
      tally.items += 1;
      return true;
    }
    atomic_ref<unsigned long long> items(in_host ? pass.counters->host_items : pass.counters->items);
    if (items.fetch_add(1, memory_order_relaxed) < (in_host ? pass.host_max_items : pass.max_items)) return true;
    items.fetch_sub(1, memory_order_relaxed);
    return false;
  }
  GPUKV_HD void unreserve(bool in_host, Tally& tally) const {
    if (!pass.reserves() && !in_host) {
      tally.items -= 1;
    } else {
      atomic_ref<unsigned long long>(in_host ? pass.counters->host_items : pass.counters->items)
          .fetch_sub(1, memory_order_relaxed);
    }
  }

  // True if a new key would now go to the host tier: the device tier is at its maximum load.
  GPUKV_HD bool device_full() const {
    return pass.reserves() &&
           atomic_ref<unsigned long long>(pass.counters->items).load(memory_order_relaxed) >= pass.max_items;
  }
  // The host-tier slot where a new key's claim would begin.
  GPUKV_HD std::uint64_t host_home(const KeyWords& key) const {
    return Ref::slot_of(host.word_of(plan_probe(hash_key(key, table.key_words), host.units).first), 0);
  }

  // Finds a slot for a new key: in the device tier while it has room, else in the host tier. Returns false
  // (and reserves nothing) if neither has room.
  // kWithHost false: the device tier only (the probing kernels leave the host tier to the host phase).
  // `lens`: as claim_ticket's, for a claim in the device tier.
  template <bool kWithHost>
  GPUKV_HD bool place(const Probe& p, std::uint64_t& slot, bool& in_host, Tally& tally, LensClaim* lens = nullptr) const {
    const Location& at = p.at;
    if (reserve(false, tally)) {
      // The device tier's step: the walk's plan, unless the walk went on into the host tier (then recomputed,
      // rather than carried through every walk in registers).
      const std::uint64_t step = at.in_host ? plan_probe(hash_key(p.key, table.key_words), table.units).step : p.plan.step;
      if (at.can_claim &&
          claim_ticket(table, at.claim_unit, at.claim_probe, step, at.claim_tickets, slot, tally.tombstones,
                       Codec::kBusy, lens)) {
        in_host = false;
        return true;
      }
      unreserve(false, tally);
    }
    if (!kWithHost || host.units == 0 || !reserve(true, tally)) return false;
    // The host walk, if there was one, saw no room before its end only if there is none: claim from the start.
    const ProbePlan plan = plan_probe(hash_key(p.key, table.key_words), host.units);
    if (claim_ticket(host, plan.first, 0, plan.step, host.board.load(host.word_of(plan.first)), slot,
                     tally.host_tombstones)) {
      in_host = true;
      return true;
    }
    unreserve(true, tally);
    return false;
  }

  // Slot words (TableConfig::slot_word). A table with words copies the values of its ops alone in their pass
  // after the probing step (PassRef::copy_later), and CopyValues moves their words with them, so that the
  // probing kernels hold no code for words at all: with a test of a kernel argument at each place a word is
  // stored or returned, they grew 5% and a table without words lost 1-3% on mixed batches, inserts and
  // deletes (H100, bench/RESULTS.md, issue 17, "an optional 8-byte word per slot"). Words are handled here
  // only in the phases that run an op with its host tier (kWithHost: keys of several ops, the host phase),
  // where a test costs nothing measurable, and in the lookup kernel built for tables with words
  // (Ops::kAnswersWords: OneGetWithWord), which answers a hit's value and word from the slot its walk read.
  // Stores, in tier `t`'s `slot`, the word of the write whose value the slot now holds (op `value_op`). The
  // slot's key is this thread's to change: the word is in place before the slot is published.
  GPUKV_HD_INLINE void store_slot_word(const Ref& t, std::uint64_t slot, std::uint64_t value_op) const {
    if (t.slot_word_offset != 0) *t.slot_word_at(slot) = batch.slot_word(value_op);
  }
  // A GET's slot word, where the caller asked for them: the word of the pass's latest write of the key if it
  // wrote (`written`, op `value_op`), else the word in tier `t`'s `slot`.
  GPUKV_HD_INLINE void write_get_word(std::uint64_t op, bool written, std::uint64_t value_op, const Ref& t,
                                      std::uint64_t slot) const {
    if (batch.out_slot_words != nullptr) {
      batch.out_slot_words[op] = written ? batch.slot_word(value_op) : *t.slot_word_at(slot);
    }
  }

  // A GET's answer: the slot's value, or the pass's latest write of this key.
  GPUKV_HD void write_get(std::uint64_t op, const ValueIn& value) const {
    if (batch.out_values == nullptr) return;
    std::uint64_t* out = batch.out_value_words(op);
    const std::uint32_t full = value.len / 8;
    for (std::uint32_t j = 0; j < full; ++j) out[j] = value.word(j);
    if (value.len % 8 != 0) out[full] = value.word(full) & byte_mask(value.len % 8);
    if (batch.out_value_lens != nullptr) batch.out_value_lens[op] = value.len;
  }

  // Runs the ops of one key, in order. `ops.next(i)` yields the op indices, all of them carrying this key;
  // `ops.kind(i)` and `ops.value(i)` give an op's kind and its value (a ValueIn); Ops::kAlone says whether
  // the key has exactly one op in the pass, Ops::kAnswersWords whether a GET answers its slot word here
  // where kWithHost is false (store_slot_word). `first` is first_unit<kWalk>(plan).
  // kWalk: as in step (the caller's choice).
  template <Walk kWalk, class Ops>
  GPUKV_HD void run_key(const KeyWords& key, const ProbePlan& plan, UnitWords first, Ops ops, Tally& tally) const {
    Probe p = start(key, plan, first);
    while (!step<true, kWalk>(p, tally)) {
    }
    apply<true, kWalk>(p, ops, tally);
  }

  // Applies a key's ops, in order, once its walk is over (step<kWithHost>() returned true). Returns true.
  // kWithHost false (the probing kernels: one op, walked in the device tier only): returns false, having
  // changed nothing, if the op inserts a new key and the device tier has no room left, so that the caller
  // leaves it to the host phase; the host tier's code is then compiled out of the probing kernels, whose
  // registers are tight. kWalk: the walk's (step), which says whether a new key may be published now.
  // kSettle: commit's. Where kWalk compares from L2 (from_l2), a new key alone in the pass may claim an EMPTY
  // ticket FULL at once (full_claim_code).
  template <bool kWithHost, Walk kWalk = Walk::kAny, Settle kSettle = Settle::kWithoutPuts, class Ops>
  GPUKV_HD bool apply(const Probe& p, Ops ops, Tally& tally) const {
    const Location& at = p.at;
    if (kWithHost && at.in_host) tally.host_avoided += static_cast<int>(at.host_avoided);

    std::uint64_t slot = at.slot;
    bool slot_in_host = kWithHost && at.hit && at.in_host;
    bool have_slot = at.hit;  // a slot that holds, or will hold, this key
    bool claimed = false;     // that slot was claimed in this run (BUSY until commit publishes it)
    bool present = at.hit;
    bool written = false;     // the current value is `value` (written in this pass), not the slot's
    bool gather = false;      // the (one) op is a GET whose value CopyValues copies
    ValueIn value{};
    // A line's walk that compares from L2 (on the GPU: passes of inserts, the ordered and host phases): a key
    // alone in the pass writes its lengths with its claim (claim_ticket), its value then known; p.words holds
    // the claim unit's lengths word (or, after a walk of the host tier, not: the claim's CAS then fails once
    // and retries with the word it found). Not in the other line walks: in the clStash kernel it spilled 56
    // bytes more a thread, for a mixed pass's few new keys.
    LensClaim lens_claim{p.words.lens, SlotLens{p.key.len, 0}};
    constexpr bool kLensInClaim = Ops::kAlone && from_l2(kWalk);
    // A board's walk (Walk::kAny) of a key alone in the pass whose slot CopyValues writes whole may claim an
    // EMPTY ticket FULL at once (whole_slot_full_code); the claim takes lens_claim for its full_code only. Not
    // in the kernels of mixed passes (clStash, Settle::kAtEnd; the split kernels, kAlways), whose few new
    // keys gain little from it: there the code for it spilled in the clStash kernel and grew the split
    // kernels by 2%, and mixed batches ran 0.965-0.994x at loads 0.5-0.9 (H100, run 338). Nor on the CPU
    // backend, whose only such slots are those of tables with slot words: there GCC left apply a call, and
    // finds, whose code had not changed, ran 0.70-0.84x (2-core VM); inlined by force, it still left
    // claim_ticket one, and inserts ran 0.92-0.97x (bench/RESULTS.md).
#if defined(__CUDA_ARCH__)
    constexpr bool kWholeSlotClaim = Ops::kAlone && kWalk == Walk::kAny && kSettle == Settle::kWithoutPuts;
#else
    constexpr bool kWholeSlotClaim = false;
#endif

    // The key's last op carries the commit's pending[] entry, if it leaves one; the others' stay
    // kNothingPending. `value_op`: the op whose value is `value` (where `written`).
    std::uint64_t op = 0, last_op = 0, value_op = 0;
    bool any = false;
    while (ops.next(op)) {
      last_op = op;
      any = true;
      switch (ops.kind(op)) {
        case OpKind::kGet:
          if (present) {
            if constexpr (kWithHost || Ops::kAnswersWords) {
              write_get_word(op, written, value_op, slot_in_host ? host : table, slot);
            }
            if (written) {
              write_get(op, value);
            } else if (kWithHost && slot_in_host) {
              write_get(op, host.value_in(slot));
            } else if (Ops::kAlone && !Ops::kAnswersWords && pass.copy_later && batch.out_values != nullptr) {
              gather = true;  // alone in the pass: nothing changes the slot before CopyValues reads it
            } else {
              write_get(op, table.template value_in<kWalk>(slot, p.words.lens));
            }
          }
          batch.set_status(op, present ? OpStatus::kOk : OpStatus::kNotFound);
          break;
        case OpKind::kPutIfAbsent:
          if (present) {
            batch.set_status(op, OpStatus::kExists);
            break;
          }
          [[fallthrough]];
        case OpKind::kPut:
          if (!have_slot) {
            // Null only where kLensInClaim is false at compile time: a pointer that may be null at run time put
            // the claim in local memory.
            lens_claim.wanted = kLensInClaim;
            lens_claim.lens.value = ops.value(op).len;
            if constexpr (kLensInClaim) lens_claim.full_code = static_cast<std::uint32_t>(full_claim_code(p));
            if constexpr (kWholeSlotClaim) lens_claim.full_code = static_cast<std::uint32_t>(whole_slot_full_code(p));
            if (!place<kWithHost>(p, slot, slot_in_host, tally, kLensInClaim || kWholeSlotClaim ? &lens_claim : nullptr)) {
              if (!kWithHost && host.units != 0) return false;  // only op of its key: nothing written yet
              batch.set_status(op, OpStatus::kFull);
              break;
            }
            have_slot = claimed = true;
          }
          present = true;
          written = true;
          value = ops.value(op);
          value_op = op;
          batch.set_status(op, OpStatus::kOk);
          break;
        case OpKind::kDelete:
          batch.set_status(op, present ? OpStatus::kOk : OpStatus::kNotFound);
          present = false;
          break;
      }
    }

    // Commit: the final state of the key reaches the table once. A deleted slot and a new one that are not
    // settled at once (see the invariants above) stay BUSY until FinishPass sets the code recorded here.
    std::uint64_t pending;
    if (kWithHost && slot_in_host) {
      pending = commit<true, Walk::kAny, kSettle, kWithHost>(host, p, slot, claimed, present, written, value, value_op,
                                                             tally);
    } else if (kWholeSlotClaim && lens_claim.full) {
      // A new key alone in the pass whose board slot its claim made FULL at once (which only a claim for a
      // slot that CopyValues writes does: whole_slot_full_code): CopyValues writes the slot whole, as over an
      // old value of the key, and no ticket is left to set.
      pending = kPendingOverwrite | (slot << 8);
    } else if (Ops::kAlone && pass.copy_later && claimed && present) {
      // A new key alone in the pass: its slot stays BUSY until FinishPass, after CopyValues wrote the value (and
      // its word), and on a board the lengths and key too (CopyValues says why). No walk reads
      // a BUSY ticket's slot.
      if (kWalk != Walk::kAny || !table.slots_own_sectors()) {
        table.template store_key<from_l2(kWalk)>(slot, p.key, value.len, kLensInClaim && lens_claim.stored);
      }
      pending = pending_code(false, slot, p.code) | kPendingScatter;
    } else if (Ops::kAlone && pass.copy_later && at.hit && present && written) {
      // An overwrite of a key alone in the pass: only its own op reads the value, and CopyValues writes it.
      pending = kPendingOverwrite | (slot << 8);
    } else {
      pending = commit<false, kWalk, kSettle, kWithHost>(table, p, slot, claimed, present, written, value, value_op, tally,
                                                         kLensInClaim && lens_claim.stored, kLensInClaim && lens_claim.full);
    }
    if (gather) pending = kPendingGather | (slot << 8);  // a GET changed nothing: no ticket is pending
    if (any && pending != kNothingPending) {
      tally.pending += 1;
      pass.pending[last_op] = pending;
    }
    return true;
  }

  // Writes a key's final state into tier `t`; returns what FinishPass must do (see apply()). `value_op`: the
  // op whose value is `value`. `lens_stored`: the claim wrote the new slot's lengths. `claimed_full`: the
  // claim made the ticket FULL (LensClaim::full), so there is nothing to publish. kSettle: when a deleted slot
  // becomes a TOMBSTONE. kWords: store the slot's word with its value (apply's kWithHost; in the probing
  // kernels a table with words stores no value here: see store_slot_word).
  template <bool kHost, Walk kWalk, Settle kSettle = Settle::kWithoutPuts, bool kWords = true>
  GPUKV_HD_INLINE std::uint64_t commit(const Ref& t, const Probe& p, std::uint64_t slot, bool claimed, bool present,
                                       bool written, const ValueIn& value, std::uint64_t value_op, Tally& tally,
                                       bool lens_stored = false, bool claimed_full = false) const {
    const auto forget = [&] {  // the key's slot becomes a tombstone
      if constexpr (kHost) {
        tally.host_items -= 1;
        tally.host_tombstones += 1;
      } else {
        tally.items -= 1;
        tally.tombstones += 1;
      }
      return pending_code(kHost, slot, Codec::kTombstone);
    };
    if (claimed) {
      if (!present) return forget();  // inserted and deleted within the pass (a key of several ops: never FULL)
      t.template store_new<from_l2(kWalk)>(slot, p.key, value, lens_stored);
      if constexpr (kWords) store_slot_word(t, slot, value_op);
      if (!kHost && claimed_full) return kNothingPending;
      if constexpr (kHost) {
        if (t.tags != nullptr) t.tags[slot] = Ref::tag_of(p.plan.info);  // read only once published
        tally.host_writes += 1;
      }
#if defined(__CUDA_ARCH__)
      // Published now, while the claim's line is still in L2: at the pass's end it would cost a second random
      // atomic per insert (FinishPass; bench/RESULTS.md, "inserts publish their own slots"). On a board, or
      // by a kernel whose compares read from L2 (from_l2): a line's slots share sectors, so lookups that
      // compare through L1 could see part of a slot from before it was written (TableRef::key_equals). GPU
      // code only: the CPU backend never publishes in the pass, and this branch compiled into its probing
      // loop, though never taken, cost its misses in small batches 9%.
      if (!kHost && (from_l2(kWalk) || t.slots_own_sectors())) {
        t.board.publish(slot / Codec::kPerWord, static_cast<int>(slot % Codec::kPerWord), p.code);
        return kNothingPending;
      }
#endif
      return pending_code(kHost, slot, p.code);
    }
    if (!p.at.hit) return kNothingPending;
    if (!present) {
      // Where no op that may claim a slot runs beside this one (a pass without PUTs, or a kernel that runs a
      // mixed pass's other ops before its PUTs), none can reuse this slot while a reader still compares
      // against it (see the invariants above): it becomes a TOMBSTONE at once (or EMPTY, in a mixed pass's
      // kernel, where frees_slot_at_once allows), and FinishPass, which would touch its line again from DRAM,
      // has nothing to do for it. GPU code only, as the publish above: on the CPU backend the test, though
      // never taken by a lookup, cost its finds and mixed batches 4-6% (2-core VM,
      // bench/results/2026-11-26-vm-cpu-table-ab-deletes-settle-on-cpu-not-kept.log).
#if defined(__CUDA_ARCH__)
      const bool settle = kSettle == Settle::kAlways || (kSettle == Settle::kWithoutPuts && pass.counters->puts == 0);
#else
      constexpr bool settle = false;
#endif
      if (!kHost && kSettle == Settle::kAlways && settle && pass.counters->puts != 0 && frees_slot_at_once(p)) {
        t.empty_device_slot(slot);
        t.board.flip(slot / Codec::kPerWord, static_cast<int>(slot % Codec::kPerWord), p.code, Codec::kEmpty);
        tally.items -= 1;
        return kNothingPending;
      }
      t.board.flip(slot / Codec::kPerWord, static_cast<int>(slot % Codec::kPerWord), p.code,
                   settle ? Codec::kTombstone : Codec::kBusy);
      const std::uint64_t pending = forget();
      return settle ? kNothingPending : pending;
    }
    if (written) {
      // In a line, the walk loaded the slot's lengths with its ticket (p.words): a value of the length the slot
      // holds leaves them as they are, one request to L2 less for the overwrite (overwrites 1.07-1.09x, runs
      // 232-235). Only in the kernels where overwrites run (Walk::kLine, and kLineFromL2NoFetch for a mixed
      // pass's PUTs): the kernel of a line's passes of inserts (Walk::kLineFromL2) keeps the code run 230
      // measured.
      bool same_len = false;
      if constexpr (!kHost && (kWalk == Walk::kLine || kWalk == Walk::kLineFromL2NoFetch)) {
        same_len = t.line_value_len(p.words.lens, slot) == value.len;
      }
      t.template store_value<from_l2(kWalk)>(slot, value, p.key.len, !same_len);
      if constexpr (kWords) store_slot_word(t, slot, value_op);
      if constexpr (kHost) tally.host_writes += 1;
    }
    return kNothingPending;
  }
};

}  // namespace gpukv::detail
