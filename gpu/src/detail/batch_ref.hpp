// One device pass as the per-operation code sees it: the batch's columns, the pass's scratch, and the
// table-wide counters. Trivially copyable; kernels take it by value.
#pragma once

#include <cstdint>

#include "hd.hpp"
#include "value_in.hpp"
#include "gpukv/types.hpp"

namespace gpukv::detail {

struct BatchRef {
  std::uint64_t size;
  const std::uint8_t* ops;
  const std::uint8_t* keys;        // stride key_width
  const std::uint8_t* key_lens;
  const std::uint8_t* values;      // stride value_stride
  const std::uint32_t* value_lens;
  std::uint8_t* status;
  std::uint8_t* out_values;        // stride value_stride; may be null
  std::uint32_t* out_value_lens;   // may be null
  const std::uint64_t* slot_words;  // a table's with slot words (TableRef::slot_word_offset); may be null
  std::uint64_t* out_slot_words;    // may be null
  std::uint32_t key_width;
  std::uint32_t value_width;
  std::uint32_t value_stride;

  GPUKV_HD_INLINE OpKind kind(std::uint64_t i) const { return static_cast<OpKind>(ops[i]); }
  GPUKV_HD_INLINE const std::uint8_t* key(std::uint64_t i) const { return keys + i * key_width; }
  GPUKV_HD_INLINE const std::uint64_t* value_words(std::uint64_t i) const {
    return reinterpret_cast<const std::uint64_t*>(values + i * value_stride);
  }
  GPUKV_HD_INLINE std::uint64_t* out_value_words(std::uint64_t i) const {
    return reinterpret_cast<std::uint64_t*>(out_values + i * value_stride);
  }
  GPUKV_HD_INLINE void set_status(std::uint64_t i, OpStatus s) const { status[i] = static_cast<std::uint8_t>(s); }
  // The slot word a write of op i stores (TableConfig::slot_word): its column's, or 0 without one.
  GPUKV_HD_INLINE std::uint64_t slot_word(std::uint64_t i) const { return slot_words == nullptr ? 0 : slot_words[i]; }
  // A write's value, loaded together with the op's other columns so that the latency overlaps the probe.
  GPUKV_HD_INLINE ValueIn value_in(std::uint64_t i) const { return load_value(value_words(i), value_lens[i], value_stride); }

  // Ops [begin, begin + n) of the batch, n clipped at its end: one pass of a larger batch.
  BatchRef part(std::uint64_t begin, std::uint64_t n) const {
    BatchRef p = *this;
    p.size = n < size - begin ? n : size - begin;
    p.ops += begin;
    p.keys += begin * key_width;
    p.key_lens += begin;
    if (values != nullptr) p.values += begin * value_stride;
    if (value_lens != nullptr) p.value_lens += begin;
    p.status += begin;
    if (out_values != nullptr) p.out_values += begin * value_stride;
    if (out_value_lens != nullptr) p.out_value_lens += begin;
    if (slot_words != nullptr) p.slot_words += begin;
    if (out_slot_words != nullptr) p.out_slot_words += begin;
    return p;
  }

  // A malformed op is answered kInvalid and touches nothing. valid_row() for an op whose row the caller has
  // loaded (value_len: anything where the op carries no value).
  GPUKV_HD_INLINE bool valid_row(std::uint8_t op, std::uint32_t key_len, std::uint32_t value_len) const {
    if (op >= kOpKindCount || key_len > key_width) return false;
    return !carries_value(op) || (values != nullptr && value_lens != nullptr && value_len <= value_width);
  }
  GPUKV_HD_INLINE bool valid(std::uint64_t i) const {
    const std::uint8_t op = ops[i];
    return valid_row(op, key_lens[i], carries_value(op) && value_lens != nullptr ? value_lens[i] : 0);
  }
};

// Table-wide counters in device (or host) memory, updated with atomics. items and tombstones count the
// device tier, host_items and host_tombstones the host tier.
struct Counters {
  unsigned long long items;       // live keys, including keys being written in the current pass
  unsigned long long tombstones;  // TOMBSTONE tickets plus the current pass's deletions that leave one
  unsigned long long host_items;
  unsigned long long host_tombstones;
  unsigned long long host_reads;    // since creation: host slots read (see TableStats)
  unsigned long long host_writes;   // since creation: host slots written
  unsigned long long host_avoided;  // since creation: host slot reads the info bits ruled out
  unsigned long long conflicts;   // this pass: ops deferred to the ordered phase
  unsigned long long pending;     // this pass: BUSY tickets that FinishPass must settle, and GETs left to CopyValues
  unsigned long long writes;      // this pass: valid PUT, PUT_IF_ABSENT and DELETE ops (StartPass, BinScatter)
  unsigned long long joined;      // this pass: ops that found their grouping entry taken (GroupOp, GroupBins)
  unsigned long long malformed;   // this pass: ops grouping answered kInvalid (refuse_malformed)
  unsigned long long group_overflow;  // this pass: a bin's ops did not fit its run (GroupBins), and are grouped apart
  unsigned long long found;       // this pass: GETs of a pass without writes that found their key (the GPU's lookup kernel)
  unsigned long long host_queued;  // this pass: ops left to the host phase
  // This pass, optimistic (PassRef::optimistic): it met an op it does not run (a key it holds, an op other
  // than a PUT) or could not begin (no room for every op): PassRunner takes out what it inserted and runs
  // it again, grouped.
  unsigned long long optimistic_failed;
  unsigned long long extracted;   // clean-up: keys copied out for reinsertion
  unsigned long long lost;        // clean-up: extracted keys that could not be re-placed (must stay 0)
  // Passes queued ahead of the host (PassRunner::run, BeginPass): the grouping-table entries of the last
  // pass that ran, the entries its StartPass clears, and whether a pass stopped because the pass before it
  // needs the host first.
  unsigned long long pass_groups;
  unsigned long long dirty_groups;
  unsigned long long halted;
  unsigned long long grouped_in_bins;  // the last pass that ran was grouped in bins (batch_groups.hpp)
  // Set by BeginPass for the pass, from the counters as the pass begins:
  unsigned long long checked;    // reserve each new key against max_items (the pass may fill the device tier)
  unsigned long long host_live;  // the host tier holds keys, so lookups must walk it too
  unsigned long long start_items;  // `items` (which the pass's probing step changes as it runs)
  // This pass: valid PUT and PUT_IF_ABSENT ops, the ops that may claim a slot (StartPass, BinScatter). In a
  // pass with none, a delete on the GPU settles its slot at once (Engine::commit).
  unsigned long long puts;
};

// What one thread changed, summed over its share of a pass and added to the Counters once.
struct Tally {
  long long items = 0;
  long long tombstones = 0;
  long long pending = 0;
  long long writes = 0;
  long long puts = 0;
  long long joined = 0;
  long long found = 0;
  // The host tier's, 32-bit: a thread's share of one kernel stays far below 2^31, and the probing kernels
  // hold every field in registers for their whole grid-stride loop.
  int host_items = 0;
  int host_tombstones = 0;
  int host_reads = 0;
  int host_writes = 0;
  int host_avoided = 0;
  // Clean-up's count of displaced keys. Summed like the others (one atomic per warp on the GPU): with an
  // atomic per board word on the one counter, counting took 11 ms of a 25 ms clean-up of 2^27 slots.
  long long extracted = 0;
};

// Calls add(delta, &counter) for every field of a tally: the one list both backends flush.
template <class Add>
GPUKV_HD_INLINE void add_tally(const Tally& t, Counters* c, Add&& add) {
  add(t.items, &c->items);
  add(t.tombstones, &c->tombstones);
  add(t.pending, &c->pending);
  add(t.writes, &c->writes);
  add(t.puts, &c->puts);
  add(t.joined, &c->joined);
  add(t.found, &c->found);
  add(t.host_items, &c->host_items);
  add(t.host_tombstones, &c->host_tombstones);
  add(t.host_reads, &c->host_reads);
  add(t.host_writes, &c->host_writes);
  add(t.host_avoided, &c->host_avoided);
  add(t.extracted, &c->extracted);
}

// What an op leaves for the end of its pass: nothing (kNothingPending, 0), or (flags | slot << 8 | code), slots
// being below 2^41 and codes never EMPTY, so that no entry is 0:
//   no flag            FinishPass sets the BUSY ticket of `slot` to `code` (FULL for a new key, TOMBSTONE
//                      for a deleted one); kPendingHostTier: a host-tier slot
//   kPendingScatter    CopyValues first writes the op's value into that new device-tier slot (on a board its
//                      lengths and key too: CopyValues)
//   kPendingOverwrite  CopyValues writes the op's value over the value of the device-tier slot (no ticket)
//   kPendingGather     CopyValues copies the device-tier slot's value to the GET's answer (no ticket)
//
// Between passes every entry is kNothingPending: the scratch starts zeroed, an op writes its entry only if it
// leaves something, and FinishPass clears each entry it finds. A pass whose ops leave nothing (lookups; new
// keys published in the pass; overwrites) then writes nothing to the array, where every op used to store 8
// bytes to say so.
inline constexpr std::uint64_t kNothingPending = 0;
inline constexpr std::uint64_t kPendingHostTier = std::uint64_t{1} << 62;
inline constexpr std::uint64_t kPendingGather = std::uint64_t{1} << 61;
inline constexpr std::uint64_t kPendingScatter = std::uint64_t{1} << 60;
inline constexpr std::uint64_t kPendingOverwrite = std::uint64_t{1} << 59;
inline constexpr std::uint64_t kPendingFlags = kPendingHostTier | kPendingGather | kPendingScatter | kPendingOverwrite;
GPUKV_HD_INLINE std::uint64_t pending_code(bool in_host, std::uint64_t slot, std::uint64_t code) {
  return (in_host ? kPendingHostTier : 0) | (slot << 8) | code;
}
GPUKV_HD_INLINE bool pending_has(std::uint64_t p, std::uint64_t flags) { return p != kNothingPending && (p & flags) != 0; }
// Whether FinishPass has a ticket to set.
GPUKV_HD_INLINE bool pending_ticket(std::uint64_t p) {
  return p != kNothingPending && (p & (kPendingGather | kPendingOverwrite)) == 0;
}
GPUKV_HD_INLINE std::uint64_t pending_slot(std::uint64_t p) {
  return (p & ~kPendingFlags) >> 8;
}
// The ticket code of an entry that has one (pending_ticket): what FinishPass sets it to.
GPUKV_HD_INLINE std::uint64_t pending_ticket_code(std::uint64_t p) { return p & 0xFF; }

// An entry of PassRef::host_queue is (host slot << kHostQueueOpBits | op): ops fit in 24 bits
// (kMaxPassOps) and slots in 40, so sorting entries sorts ops by host address.
inline constexpr int kHostQueueOpBits = 24;

// Sentinels in group_of[]: an op rejected as malformed; a valid op of a pass without writes (not grouped).
inline constexpr std::uint32_t kNoGroup = 0xFFFFFFFFu;
inline constexpr std::uint32_t kUngrouped = 0xFFFFFFFEu;

// A pass's scratch. See batch_groups.hpp for `groups`.
struct PassRef {
  std::uint32_t* groups;       // grouping table, group_mask + 1 entries
  std::uint64_t group_mask;
  std::uint32_t* group_of;     // op -> grouping table entry
  std::uint64_t* conflicts;    // deferred ops as (entry << 32 | op), sorted before the ordered phase
  std::uint64_t* pending;      // per op: what the pass's end does with it (a ticket, a gather), or kNothingPending
  std::uint64_t* host_queue;   // ops left to the host phase; HostQueueKey makes them (host slot << 24 | op)
  Counters* counters;
  std::uint64_t max_items;       // device tier
  std::uint64_t host_max_items;  // host tier (0 if there is none)
  // A GET of a key alone in the pass that finds its value in the device tier, and a PUT of a key alone in
  // the pass that writes a device-tier slot (a new one, or its key's own), leave the value's copy to
  // CopyValues, whose threads move a wide value together, rather than copying it word by word themselves.
  bool copy_later;
  // Counters::checked and host_live as BeginPass set them for the pass, copied in by bound() once per host
  // chunk: loaded from the counters for every op, they cost the CPU backend 4-9% on finds. A GPU thread
  // loads them for every op (an L1 hit): a bound copy of the step cost the clStash kernel a local-memory copy
  // of the whole step, the mixed batch 2-5% (bench/RESULTS.md, "a pass's fixed cost"). Read them through
  // reserves() and walks_host().
  bool checked;
  bool host_live;
  // A line's table, whose last finished pass looked like one of inserts (PassRunner): the probing step's
  // kernel that compares from L2 is launched for this pass too, and runs it if every op writes
  // (Engine::compares_in_l2).
  bool inserts_expected;
  // A pass of PUTs run without grouping (TableConfig::optimistic_inserts; ExecuteOp::try_optimistic).
  bool optimistic;

  GPUKV_HD_INLINE bool reserves() const {
#if defined(__CUDA_ARCH__)
    return counters->checked != 0;
#else
    return checked;
#endif
  }
  GPUKV_HD_INLINE bool walks_host() const {
#if defined(__CUDA_ARCH__)
    return counters->host_live != 0;
#else
    return host_live;
#endif
  }

  PassRef bound() const {
    PassRef p = *this;
    p.checked = counters->checked != 0;
    p.host_live = counters->host_live != 0;
    return p;
  }
};

}  // namespace gpukv::detail
