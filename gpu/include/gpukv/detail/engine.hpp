// The per-key algorithm: the one copy of the table's logic, run by CUDA threads and by host threads alike.
//
// run_key() executes, in batch order, every op of one key in the current pass. It touches the table at most
// three times whatever the number of ops: one walk along the key's probe sequence (start/step), at most one
// claim of a new slot, and one commit (apply). In between, the ops are applied to a small state in
// registers (present? whose value?), so a hot key that appears thousands of times in a batch costs one walk,
// and intermediate values are never written.
//
// Invariants that make concurrent ops on different keys safe:
//  * A key lives in at most one slot, and only the thread running that key changes it in a pass.
//  * Lookups stop at the first unit holding an EMPTY ticket. EMPTY tickets only disappear during a pass
//    (clean-up runs between passes), so an insert that claims the first available ticket at or before that
//    unit keeps every key reachable.
//  * No thread reads a slot written in the same pass. A new key's slot stays BUSY (skipped by every lookup)
//    until FinishPass publishes it after the pass; a deleted slot stays BUSY until FinishPass makes it a
//    TOMBSTONE, so nobody can reuse it and rewrite its key while a reader that saw its old FULL ticket
//    compares against it; an overwrite rewrites only the value, which only the key's own thread reads. So a
//    lookup never sees a half-written key or value, and the pass needs no memory fences: kernel boundaries
//    order everything.
#pragma once

#include <cstdint>

#include "gpukv/detail/batch_ref.hpp"
#include "gpukv/detail/hd.hpp"
#include "gpukv/detail/key_hash.hpp"
#include "gpukv/detail/table_ref.hpp"

namespace gpukv::detail {

// Where a key is, or where its insert may begin.
struct Location {
  bool hit = false;
  std::uint64_t slot = 0;          // valid if hit
  bool can_claim = false;          // an available ticket was seen on the probe sequence
  std::uint64_t claim_unit = 0;    // the first unit where one was seen
  std::uint64_t claim_probe = 0;   // its position in the probe sequence
  std::uint64_t claim_tickets = 0; // that unit's board word as seen then (claim() starts from it)
};

// One key's walk along its probe sequence, resumable a unit at a time: Stash walks it to the end in one
// thread; clStash parks unfinished walks in shared memory and hands them to idle lanes (clstash_kernel.cuh).
struct Probe {
  KeyWords key;
  ProbePlan plan;
  std::uint64_t code;     // the key's info code
  std::uint64_t unit;     // the next unit to examine
  std::uint64_t probe;    // its position in the sequence
  std::uint64_t tickets;  // its board word when probe == 0 (loaded early); reloaded for later units
  Location at;            // the outcome so far; final once step() returns true
};

template <class Ref>
struct Engine {
  using Codec = typename Ref::Codec;

  Ref table;
  BatchRef batch;
  PassRef pass;

  // The board word of the plan's first unit: callers load it early, so that its latency overlaps other work.
  GPUKV_HD_INLINE std::uint64_t first_tickets(const ProbePlan& plan) const {
    return table.board.load(table.word_of(plan.first));
  }

  // A walk for `key` from the plan's first unit, whose board word `tickets` the caller loaded early
  // (first_tickets()), so that its latency overlapped other work.
  GPUKV_HD_INLINE Probe start(const KeyWords& key, const ProbePlan& plan, std::uint64_t tickets) const {
    Probe p;
    p.key = key;
    p.plan = plan;
    p.code = Codec::info_code(plan.info);
    p.unit = plan.first;
    p.probe = 0;
    p.tickets = tickets;
    return p;
  }

  // Examines one unit of the walk. Returns true when the walk is over: the key was found, or a unit with an
  // EMPTY ticket proves it absent, or every unit has been seen.
  GPUKV_HD bool step(Probe& p) const {
    if (p.probe >= table.units) return true;
    const std::uint64_t word = table.word_of(p.unit);
    const std::uint64_t lanes = table.lanes_of(p.unit);
    const std::uint64_t tickets = p.probe == 0 ? p.tickets : table.board.load(word);
    for (std::uint64_t matches = Codec::match(tickets, p.code) & lanes; matches != 0; matches &= matches - 1) {
      const std::uint64_t slot = Ref::slot_of(word, Codec::field_of(matches));
      if (table.key_equals(slot, p.key)) {
        p.at.hit = true;
        p.at.slot = slot;
        return true;
      }
    }
    if (!p.at.can_claim && (Codec::available(tickets) & lanes) != 0) {
      p.at.can_claim = true;
      p.at.claim_unit = p.unit;
      p.at.claim_probe = p.probe;
      p.at.claim_tickets = tickets;
    }
    if ((Codec::empty(tickets) & lanes) != 0) return true;
    p.unit = next_unit(p.unit, p.plan.step, table.units);
    p.probe += 1;
    return false;
  }

  // Claims the first available ticket from where the walk saw one. Returns false if none is left.
  GPUKV_HD bool claim(const Location& at, const ProbePlan& plan, std::uint64_t& slot, Tally& tally) const {
    if (!at.can_claim) return false;
    std::uint64_t unit = at.claim_unit;
    std::uint64_t tickets = at.claim_tickets;  // a stale view only costs a failed CAS, which refreshes it
    for (std::uint64_t probe = at.claim_probe; probe < table.units; ++probe) {
      const std::uint64_t word = table.word_of(unit);
      const std::uint64_t lanes = table.lanes_of(unit);
      if (probe != at.claim_probe) tickets = table.board.load(word);
      for (std::uint64_t open = Codec::available(tickets) & lanes; open != 0;
           open = Codec::available(tickets) & lanes) {
        const int field = Codec::field_of(open);
        const std::uint64_t code = Codec::field_code(tickets, field);
        if (table.board.claim(word, field, tickets)) {  // refreshes `tickets` when it fails
          if (code == Codec::kTombstone) tally.tombstones -= 1;
          slot = Ref::slot_of(word, field);
          return true;
        }
      }
      unit = next_unit(unit, plan.step, table.units);
    }
    return false;
  }

  // Counts a new key against max_items. Unchecked passes cannot overflow (the host saw room for every op).
  GPUKV_HD bool reserve(Tally& tally) const {
    if (!pass.checked) {
      tally.items += 1;
      return true;
    }
    atomic_ref<unsigned long long> items(pass.counters->items);
    if (items.fetch_add(1, memory_order_relaxed) < pass.max_items) return true;
    items.fetch_sub(1, memory_order_relaxed);
    return false;
  }
  GPUKV_HD void unreserve(Tally& tally) const {
    if (pass.checked) {
      atomic_ref<unsigned long long>(pass.counters->items).fetch_sub(1, memory_order_relaxed);
    } else {
      tally.items -= 1;
    }
  }

  // A GET's value: `len` bytes at `from` (the slot's value, or the pass's latest write of this key).
  GPUKV_HD void write_get(std::uint64_t op, const std::uint64_t* from, std::uint32_t len) const {
    if (batch.out_values == nullptr) return;
    copy_value(batch.out_value_words(op), from, len);
    if (batch.out_value_lens != nullptr) batch.out_value_lens[op] = len;
  }

  // Runs the ops of one key, in order. `ops.next(i)` yields the op indices, all of them carrying this key;
  // `ops.kind(i)` and `ops.value(i)` give an op's kind and its value (a ValueIn). `tickets` is
  // first_tickets(plan).
  template <class Ops>
  GPUKV_HD void run_key(const KeyWords& key, const ProbePlan& plan, std::uint64_t tickets, Ops ops,
                        Tally& tally) const {
    Probe p = start(key, plan, tickets);
    while (!step(p)) {
    }
    apply(p, ops, tally);
  }

  // Applies a key's ops, in order, once its walk is over (step() returned true).
  template <class Ops>
  GPUKV_HD void apply(const Probe& p, Ops ops, Tally& tally) const {
    const KeyWords& key = p.key;
    const ProbePlan& plan = p.plan;
    const std::uint64_t code = p.code;
    const Location& at = p.at;

    std::uint64_t slot = at.slot;
    bool have_slot = at.hit;  // a slot that holds, or will hold, this key
    bool claimed = false;     // that slot was claimed in this run (BUSY until commit)
    bool present = at.hit;
    bool written = false;     // the current value is `value` (written in this pass), not the slot's
    ValueIn value{};

    // Every op of the pass writes its pending[] entry; the key's last op carries the commit's entry.
    std::uint64_t op = 0, last_op = 0;
    bool any = false;
    while (ops.next(op)) {
      if (any) pass.pending[last_op] = kNothingPending;
      last_op = op;
      any = true;
      switch (ops.kind(op)) {
        case OpKind::kGet:
          if (present) {
            if (written) {
              write_get(op, value.words, value.len);
            } else {
              write_get(op, table.value_words_at(slot), *table.value_len(slot));
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
            if (!reserve(tally)) {
              batch.set_status(op, OpStatus::kFull);
              break;
            }
            if (!claim(at, plan, slot, tally)) {
              unreserve(tally);
              batch.set_status(op, OpStatus::kFull);
              break;
            }
            have_slot = claimed = true;
          }
          present = true;
          written = true;
          value = ops.value(op);
          batch.set_status(op, OpStatus::kOk);
          break;
        case OpKind::kDelete:
          batch.set_status(op, present ? OpStatus::kOk : OpStatus::kNotFound);
          present = false;
          break;
      }
    }

    // Commit: the final state of the key reaches the table once. A new or deleted slot stays BUSY until
    // FinishPass sets the code recorded here.
    std::uint64_t pending = kNothingPending;
    if (claimed) {
      if (present) {
        table.store_new(slot, key, value);
        pending = (slot << 8) | code;
      } else {  // inserted and deleted within the pass: the claimed slot becomes a tombstone
        pending = (slot << 8) | Codec::kTombstone;
        tally.items -= 1;
        tally.tombstones += 1;
      }
    } else if (at.hit) {
      if (present) {
        if (written) table.store_value(slot, value);
      } else {
        table.board.flip(slot / Codec::kPerWord, static_cast<int>(slot % Codec::kPerWord), code, Codec::kBusy);
        pending = (slot << 8) | Codec::kTombstone;
        tally.items -= 1;
        tally.tombstones += 1;
      }
    }
    if (pending != kNothingPending) tally.pending += 1;
    if (any) pass.pending[last_op] = pending;
  }
};

}  // namespace gpukv::detail
