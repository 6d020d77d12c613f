// The steps of one pass, each a per-item function object `f(i, tally)`. A CUDA kernel runs one as a thin
// grid-stride loop; the CPU backend runs the same object from its worker threads. Order within a pass:
//
//   BeginPass      once: reset the pass's counters, or halt the pass if the one before it needs the host
//   StartPass      every grouping-table entry an earlier pass left: clear it; every op: count the valid writes
//   GroupOp        every op, if the pass writes: validate, hash its key and enter it in the grouping table
//                  (the GPU's passes of 1M to 4M ops: in bins of shared memory, gpu/group_bins_kernel.cuh,
//                  whose first kernel may do StartPass's work too)
//   ExecuteOp      every op: run it now if its key is alone in the pass (validating it first in a pass
//                  without writes), else defer it
//   (sort the deferred ops by (group entry, op index))
//   ExecuteSegment every deferred op that starts a group entry: run that entry's ops in batch order
//   HostQueueKey   every op ExecuteOp left for the host tier: its host address, as a sort key
//   (sort them by host address)
//   ExecuteHostOp  every such op, in host-address order: walk both tiers and run it
//   CopyValues     every op, a few threads each (wide values on the GPU): a value ExecuteOp left to it
//   FinishPass     every op (if any left a pending[] entry): a BUSY ticket it left -> FULL or TOMBSTONE; the
//                  entry cleared
//
// A pass queued ahead of the host (PassRunner::run) runs BeginPass to ExecuteOp, then CopyValues and
// FinishPass unless it deferred ops or left ops to the host tier: the host runs those steps itself, after
// the sort and the host phase, and every step of the pass queued after it does nothing (halted).
#pragma once

#include <cstdint>

#include "batch_groups.hpp"
#include "engine.hpp"

namespace gpukv::detail {

template <class Ref>
GPUKV_HD_INLINE KeyWords batch_key(const Ref& table, const BatchRef& batch, std::uint64_t op) {
  return load_key(batch.key(op), batch.key_lens[op], table.key_words);
}

// Whether a pass must wait for the host: it was halted, or the pass before it deferred same-key ops or left
// ops to the host tier (their steps need the host's sort, and run before anything later touches the table).
// A failed optimistic pass (Counters::optimistic_failed) needs the host too: its undo, and its run again.
GPUKV_HD_INLINE bool host_first(const Counters& c) {
  return c.halted != 0 || c.conflicts != 0 || c.host_queued != 0 || c.optimistic_failed != 0;
}

// Opens a pass, before its other steps (one item): resets the pass's counters and works out which grouping
// entries StartPass must clear, or, if the pass must wait for the host, halts it: its steps then do nothing,
// and the host queues it again once it has finished the pass before (PassRunner::run). First it copies the
// counters as the pass before left them to `snapshot`, where the host reads them: on the GPU a launch fewer
// a pass than a copy of their own.
struct BeginPass {
  static constexpr const char* kName = "BeginPass";
  Counters* counters;
  Counters* snapshot;           // nullptr: none to take
  std::uint64_t ops;            // in the pass
  std::uint64_t max_items;      // the device tier's
  std::uint64_t group_entries;  // this pass's grouping-table size
  bool fresh_groups;            // the grouping table was just allocated, all zero
  bool in_bins;                 // this pass is grouped in bins (batch_groups.hpp), or marks no entry (optimistic)
  bool optimistic;              // the pass runs optimistically (PassRef::optimistic)
  GPUKV_HD void operator()(std::uint64_t, Tally&) const {
    Counters& c = *counters;
    if (snapshot != nullptr) *snapshot = c;
    if (host_first(c)) {
      c.halted = 1;
      return;
    }
    // The last pass that ran cleared what it found (StartPass, or the first kernel of grouping in bins), and
    // GroupOp filled its entries only if it had writes; grouped in bins, it marked entries only where ops
    // joined or a run overflowed. A halted pass changes none of these fields, so they describe the last pass
    // that ran.
    const bool left_none = c.grouped_in_bins != 0 && c.joined == 0 && c.group_overflow == 0;
    c.dirty_groups = fresh_groups || c.writes == 0 || left_none ? 0 : c.pass_groups;
    c.pass_groups = group_entries;
    c.grouped_in_bins = in_bins;
    // If every op of the pass could insert a new key and still fit in the device tier, no op needs to
    // reserve room atomically. Only a host tier that holds keys needs walking.
    c.checked = c.items + ops > max_items;
    c.host_live = c.host_items != 0;
    c.start_items = c.items;
    c.writes = 0;
    c.puts = 0;
    c.joined = 0;
    c.malformed = 0;
    c.group_overflow = 0;
    c.found = 0;
    c.pending = 0;
    // An optimistic pass whose new keys might not all fit, or whose walks would have to go on into the host
    // tier, fails at once: it runs again, grouped, having done nothing.
    c.optimistic_failed = optimistic && (c.checked || c.host_live);
  }
};

// A pass's counts of its valid writes (Counters::writes and Counters::puts) as one 32-bit word that an op of
// each kind adds to: writes in the low 16 bits, deletes above. One register where two counts took StartPass's
// GPU kernel from 40 registers to 47; a word sums at most 2^16 - 1 ops.
GPUKV_HD_INLINE std::uint32_t write_counts(std::uint8_t kind) {
  return kind == static_cast<std::uint8_t>(OpKind::kGet) ? 0u : kind == static_cast<std::uint8_t>(OpKind::kDelete) ? 0x10001u : 1u;
}
GPUKV_HD_INLINE void add_write_counts(std::uint32_t counts, Tally& tally) {
  tally.writes += counts & 0xFFFF;
  tally.puts += (counts & 0xFFFF) - (counts >> 16);
}

// Clears the grouping-table entries the last pass with writes left (BeginPass says how many) and counts the
// pass's valid writes (PUT, PUT_IF_ABSENT, DELETE), before any other step: the lane schedule depends on the
// mix, and a pass without writes needs no grouping. One sweep, so that counting costs no launch of its own.
// An item counts kChunk neighbouring ops, their kinds loaded at once: one op per item made every GPU
// thread wait for a DRAM round trip per op (16 us of a 367 us find pass, bench/RESULTS.md, "the fixed cost
// of a pass"). It clears kChunk entries `items` apart, so that a warp's stores fill whole lines.
struct StartPass {
  static constexpr const char* kName = "StartPass";
  static constexpr std::uint64_t kChunk = 16;
  // The GPU kernel's blocks an SM: 40 registers, no spills, where it took 42 and 5 blocks once it counted
  // PUTs too (Counters::puts). Its items wait on their kinds' loads, so residency sets its pace (at 4 blocks,
  // the step took 9% longer in a pass of finds: bench/RESULTS.md, run 241).
  static constexpr int kMinBlocks = 6;
  BatchRef batch;
  std::uint32_t* groups;
  const Counters* counters;
  std::uint64_t items;  // items_for(batch.size, a bound on the entries to clear)
  // An optimistic pass's (PassRef::optimistic): every PUT and PUT_IF_ABSENT is counted by its kind alone,
  // without the load of its lengths that valid() makes (the step took 30 us a pass of 4M PUTs with it, 19
  // without: H100, runs 289 and 292); the optimistic kernel answers malformed ops itself
  // (ExecuteOp::try_optimistic).
  bool kinds_only = false;
  static std::uint64_t items_for(std::uint64_t ops, std::uint64_t dirty) {
    return ((ops > dirty ? ops : dirty) + kChunk - 1) / kChunk;
  }
  GPUKV_HD bool idle() const { return counters->halted != 0; }
  GPUKV_HD void operator()(std::uint64_t item, Tally& tally) const {
    const std::uint64_t clear = counters->dirty_groups;
GPUKV_UNROLL
    for (std::uint64_t j = 0; j < kChunk; ++j) {
      if (item + j * items < clear) groups[item + j * items] = 0;
    }
    const std::uint64_t first = item * kChunk;
    if (first >= batch.size) return;
    std::uint8_t kinds[kChunk];
GPUKV_UNROLL
    for (std::uint64_t j = 0; j < kChunk; ++j) {
      kinds[j] = first + j < batch.size ? batch.ops[first + j] : static_cast<std::uint8_t>(OpKind::kGet);
    }
    std::uint32_t counts = 0;
GPUKV_UNROLL
    for (std::uint64_t j = 0; j < kChunk; ++j) {
      if (kinds[j] != static_cast<std::uint8_t>(OpKind::kGet) && (kinds_only || batch.valid(first + j))) {
        counts += write_counts(kinds[j]);
      }
    }
    add_write_counts(counts, tally);
  }
};

// A pass without writes: StartPass counted none. Then GETs commute (every order gives the same results, and
// the table does not change), so each runs at once with no hash and no grouping-table CAS, hot keys included
// (their walks share cache lines), and ExecuteOp validates it itself: GroupOp and group_of are not used.
GPUKV_HD_INLINE bool read_only(const PassRef& pass) { return pass.counters->writes == 0; }

// An op's row as grouping reads it: kind, key and value length, loaded before any of them is tested, so that
// one memory round trip brings them all (tested in turn, valid() and then the key, they took four round
// trips before the grouping CAS, and GroupOp ran 7% slower, writes 2%: H100, run 152).
struct OpRow {
  std::uint8_t kind;
  KeyWords key;
  std::uint32_t value_len;  // 0 where the batch has no value lengths
};
template <class Ref>
GPUKV_HD_INLINE OpRow load_row(const Engine<Ref>& e, std::uint64_t op) {
  return OpRow{e.batch.ops[op], batch_key(e.table, e.batch, op), e.batch.value_lens != nullptr ? e.batch.value_lens[op] : 0};
}

// Answers a malformed op kInvalid (its group kNoGroup) and counts it (an atomic of its own: malformed ops are
// rare, and a count in the tally would cost the probing kernels a register).
template <class Ref>
GPUKV_HD_INLINE void refuse_malformed(const Engine<Ref>& e, std::uint64_t op) {
  e.batch.set_status(op, OpStatus::kInvalid);
  e.pass.group_of[op] = kNoGroup;
  atomic_ref<unsigned long long>(e.pass.counters->malformed).fetch_add(1, memory_order_relaxed);
}

// A valid op's key, for grouping; a malformed op is refused and yields none.
template <class Ref>
GPUKV_HD_INLINE bool grouped_key(const Engine<Ref>& e, std::uint64_t op, KeyWords& key) {
  const OpRow row = load_row(e, op);
  key = row.key;
  if (e.batch.valid_row(row.kind, row.key.len, row.value_len)) return true;
  refuse_malformed(e, op);
  return false;
}

// Groups ops by key so that same-key ops take effect in batch order (a pass with writes only). kByBucket:
// the grouping table's probe order, groups_by_bucket() of its size (batch_groups.hpp). The GPU groups passes
// of 1M to 4M ops in bins instead (gpu/group_bins_kernel.cuh).
template <class Ref, bool kByBucket = false>
struct GroupOp {
  static constexpr const char* kName = "GroupOp";
  Engine<Ref> e;
  // Nothing to do in a pass without writes. Both executors ask once per thread or per step (Executor::
  // for_each) rather than once per op: launched over a pass's 4M ops to do nothing, GroupOp took 10 us of
  // a 367 us find pass (bench/RESULTS.md, "the fixed cost of a pass").
  GPUKV_HD bool idle() const { return e.pass.counters->halted != 0 || read_only(e.pass); }
  // The executors ask idle() before they run any op (Executor::for_each).
  GPUKV_HD void operator()(std::uint64_t op, Tally& tally) const {
    KeyWords key;
    if (!grouped_key(e, op, key)) return;
    bool joined = false;
    const std::uint64_t h = hash_key(key, e.table.key_words);
    e.pass.group_of[op] = kByBucket ? group_insert_by_bucket(e.pass.groups, e.pass.group_mask, h, joined)
                                    : group_insert_by_entry(e.pass.groups, e.pass.group_mask, h, joined);
    tally.joined += joined;
  }
};

// After an optimistic pass that failed (Counters::optimistic_failed; PassRunner): finds the slot of every key
// the pass inserted, a PUT or PUT_IF_ABSENT that it answered kOk (every other op of the pass is answered
// otherwise: ExecuteOp::try_optimistic), and keeps it for EraseOptimisticInserts in `slots` (n entries of
// the pass's scratch) as a pending_code(), or kNothingPending. A step of its own before any slot is erased:
// a walk stops at an EMPTY ticket, so one that an erase had already turned EMPTY could hide a later key.
template <class Ref>
struct FindOptimisticInserts {
  static constexpr const char* kName = "FindOptimisticInserts";
  Engine<Ref> e;
  std::uint64_t* slots;
  GPUKV_HD void operator()(std::uint64_t op, Tally& tally) const {
    slots[op] = kNothingPending;
    if (e.batch.status[op] != static_cast<std::uint8_t>(OpStatus::kOk) || !carries_value(e.batch.kind(op))) return;
    const KeyWords key = batch_key(e.table, e.batch, op);
    const ProbePlan plan = plan_probe(hash_key(key, e.table.key_words), e.table.units);
    Probe p = e.start(key, plan, e.template first_unit<Walk::kLineFromL2>(plan));
    while (!e.template step<false, Walk::kLineFromL2>(p, tally)) {
    }
    if (p.at.hit) slots[op] = pending_code(false, p.at.slot, p.code);
  }
};

// Then takes those keys out (Engine::erase_optimistic), leaving the table as it was before the pass.
template <class Ref>
struct EraseOptimisticInserts {
  static constexpr const char* kName = "EraseOptimisticInserts";
  Engine<Ref> e;
  const std::uint64_t* slots;
  GPUKV_HD void operator()(std::uint64_t op, Tally& tally) const {
    const std::uint64_t at = slots[op];
    if (at != kNothingPending) e.erase_optimistic(pending_slot(at), pending_ticket_code(at), tally);
  }
};

// An op's kind and, for a write, its value, loaded early (see ValueIn).
struct OpIn {
  OpKind kind;
  ValueIn value;
};

GPUKV_HD_INLINE OpIn load_op(const BatchRef& batch, std::uint64_t op) {
  OpIn in;
  in.kind = batch.kind(op);
  in.value = carries_value(in.kind) ? batch.value_in(op) : ValueIn{};
  return in;
}

// Yields exactly one op, whose kind and value are already in registers.
struct OneOp {
  static constexpr bool kAlone = true;
  static constexpr bool kAnswersWords = false;
  std::uint64_t op;
  OpIn in;
  bool done = false;
  GPUKV_HD_INLINE bool next(std::uint64_t& out) {
    if (done) return false;
    out = op;
    done = true;
    return true;
  }
  GPUKV_HD_INLINE OpKind kind(std::uint64_t) const { return in.kind; }
  GPUKV_HD_INLINE const ValueIn& value(std::uint64_t) const { return in.value; }
};

// OneOp whose op is a GET: its kind a constant, so that Engine::apply compiles to a lookup's answer alone
// (ExecuteOp::run_lookup).
struct OneGet : OneOp {
  GPUKV_HD_INLINE static constexpr OpKind kind(std::uint64_t) { return OpKind::kGet; }
};

// OneGet in a table with slot words whose values its ops copy themselves (the GPU's lookup kernel for such
// tables, lookup_kernel's kWords): a hit answers its value and word from the slot its walk found, where
// OneGet would leave both to CopyValues, which reads the slot again.
struct OneGetWithWord : OneGet {
  static constexpr bool kAnswersWords = true;
};

// Runs every op whose key is alone in the pass; defers the rest to the ordered phase. In three parts, so
// that the GPU's clStash scheduler (clstash_kernel.cuh) can interleave the walks of many ops per lane:
// begin() starts an op's walk, step() advances it, finish() applies the op.
//
// kWithHost false (the probing kernels): the walk covers the device tier, and an op that must touch the
// host tier (its key may be there, or it inserts a new key while the device tier is full) is left to the
// host phase. kWithHost true (ExecuteHostOp): the whole walk, host tier included.
template <class Ref, bool kWithHost = false>
struct ExecuteOp {
  static constexpr const char* kName = "ExecuteOp";
  static constexpr bool kProbes = true;  // probes the table: launched for residency (gpu_backend.cu)
  Engine<Ref> e;

  // A halted pass (BeginPass) runs nothing. The host phase's walks (kWithHost) never ask.
  GPUKV_HD bool idle() const { return e.pass.counters->halted != 0; }
  // With the pass's flags from the counters (PassRef::bound): the CPU executor runs this copy.
  ExecuteOp bound() const {
    ExecuteOp f = *this;
    f.e.pass = e.pass.bound();
    return f;
  }

  // Starts op's walk in `p`, returning true; or settles the op without a walk: a malformed op (already
  // answered) or one that shares its key with other ops of the pass (deferred). Either leaves its pending[]
  // entry as it is: kNothingPending.
  // kWalk: the walk's (step), which also says how its first unit's words are loaded.
  template <Walk kWalk = Walk::kAny>
  GPUKV_HD bool begin(std::uint64_t op, Probe& p) const {
    std::uint32_t entry;
    KeyWords key;
    if (!read_only(e.pass)) {
      if (all_alone_and_valid()) {
        key = batch_key(e.table, e.batch, op);
        entry = kUngrouped;
      } else {
        // The group entry first, then the key. Loading both at once measured 3% slower for inserts
        // (bench/RESULTS.md, "an op's reads issued together").
        entry = e.pass.group_of[op];
        if (entry == kNoGroup) return false;  // answered kInvalid
        key = batch_key(e.table, e.batch, op);
      }
    } else {
      // The key, its length and the op's kind in one memory round trip, then the test.
      key = batch_key(e.table, e.batch, op);
      entry = group_entry(op, key.len);
      if (entry == kNoGroup) return false;  // answered kInvalid
    }
    return begin_walk<kWalk>(op, entry, key, plan_probe(hash_key(key, e.table.key_words), e.table.units), p);
  }

  // Host threads only (CpuExecutor): an op's key and probe plan, worked out at the op's first prefetch stage
  // and kept until it runs, so that the key is loaded and hashed once rather than at every stage.
  struct Planned {
    KeyWords key;
    ProbePlan plan;
  };
  Planned plan(std::uint64_t op) const {
    const KeyWords key = batch_key(e.table, e.batch, op);
    return Planned{key, plan_probe(hash_key(key, e.table.key_words), e.table.units)};
  }
  // begin() with the op's Planned.
  bool begin(std::uint64_t op, const Planned& planned, Probe& p) const {
    const std::uint32_t entry = group_entry(op, planned.key.len);
    if (entry == kNoGroup) return false;  // answered kInvalid
    return begin_walk(op, entry, planned.key, planned.plan, p);
  }

  // kWalk: as in Engine::step; the kernel picks it once per thread (from the layout and compares_in_l2()).
  template <Walk kWalk = Walk::kAny>
  GPUKV_HD_INLINE bool step(Probe& p, Tally& tally) const {
    return e.template step<kWithHost, kWalk>(p, tally);
  }
  GPUKV_HD_INLINE bool compares_in_l2() const { return e.compares_in_l2(); }
  // Applies the op once its walk is over; `in` is load_op(op), loaded whenever suits the caller.
  // kWalk: the walk's (step). kSettle: as Engine::apply's.
  template <Walk kWalk = Walk::kAny, Settle kSettle = Settle::kWithoutPuts>
  GPUKV_HD void finish(std::uint64_t op, const Probe& p, const OpIn& in, Tally& tally) const {
    if constexpr (kWithHost) {
      e.template apply<true, kWalk, kSettle>(p, OneOp{op, in}, tally);
    } else if (defer_to_host(p, in) || !e.template apply<false, kWalk, kSettle>(p, OneOp{op, in}, tally)) {
      // Its host address is added by HostQueueKey: computing it here would cost the probing kernels registers.
      e.pass.host_queue[append_index(&e.pass.counters->host_queued)] = op;
    }
  }

  // Leaves an op that must touch host memory to the host phase, keyed by the host slot where its walk (or
  // its claim) begins. Random host accesses are bound by address translation (43.4 M/s over 8 GB, 749
  // M/s over 64 MB on an H100: bench/RESULTS.md, "the host tier (issue 4)"), so the phase runs them sorted by that address, and the threads in flight
  // touch a narrow window at a time.
  GPUKV_HD bool defer_to_host(const Probe& p, const OpIn& in) const {
    const bool inserts = carries_value(in.kind);
    return p.at.to_host || (!p.at.hit && inserts && e.host.units != 0 && e.device_full());
  }

  // Host threads only (CpuExecutor runs it a few ops ahead): Engine::prefetch_walk for op's plan.
  void prefetch(std::uint64_t, const Planned& planned, int stage) const { e.prefetch_walk(planned.plan, stage); }

  // Stash: one walk per thread. kSettle: as Engine::apply's.
  template <Walk kWalk, Settle kSettle = Settle::kWithoutPuts>
  GPUKV_HD void run(std::uint64_t op, Tally& tally) const {
    Probe p;
    if (begin<kWalk>(op, p)) walk<kWalk, kSettle>(op, p, tally);
  }
  // One try of an optimistic pass's op (PassRef::optimistic; the GPU's line), a PUT or
  // PUT_IF_ABSENT (optimistic_ready): returns false if it must be tried again (Engine::insert_optimistic).
  // Where it inserts its key, with no grouping before, it is answered kOk; where it finds its key present, or
  // no EMPTY ticket, it fails the pass and is answered anything but kOk, which tells FindOptimisticInserts
  // that it inserted nothing; the pass then runs again, grouped, and every op is answered again. A malformed
  // op is answered kInvalid here, as grouping would have, since it touches nothing.
  GPUKV_HD bool try_optimistic(std::uint64_t op, Tally& tally) const {
    const OpRow row = load_row(e, op);
    if (!e.batch.valid_row(row.kind, row.key.len, row.value_len)) {
      refuse_malformed(e, op);
      return true;
    }
    const ProbePlan plan = plan_probe(hash_key(row.key, e.table.key_words), e.table.units);
    Probe p = e.start(row.key, plan, e.template first_unit<Walk::kLineFromL2>(plan));
    switch (e.insert_optimistic(p, e.batch.value_in(op), tally)) {
      case Engine<Ref>::OptimisticTry::kInserted:
        e.batch.set_status(op, OpStatus::kOk);
        return true;
      case Engine<Ref>::OptimisticTry::kFailed:
        e.batch.set_status(op, OpStatus::kExists);
        fail_optimistic();
        return true;
      case Engine<Ref>::OptimisticTry::kAgain:
        break;
    }
    return false;
  }
  // Whether an optimistic pass may run: StartPass counted every op a PUT or PUT_IF_ABSENT, and BeginPass
  // found room for all of them and no host tier to walk. Fields that no thread changes while the kernel runs,
  // so that every thread answers every op it has or none does (FindOptimisticInserts trusts the answers).
  // fail_optimistic() where the pass may not run, unless it is halted (it then runs later, from its start), and
  // where an op of it fails.
  GPUKV_HD bool optimistic_ready() const {
    const Counters& c = *e.pass.counters;
    return c.halted == 0 && c.checked == 0 && c.host_live == 0 && c.writes == e.batch.size && c.puts == e.batch.size;
  }
  // Whether an optimistic pass that may not run as one holds GETs only (StartPass counted no write), and may run
  // them as a pass without writes does (run_lookup), with no grouping: the first pass of a call of GETs after
  // passes of new keys, under kAuto. Not where BeginPass failed the pass: it then runs again, whatever it
  // holds. The fields it reads no thread changes while the kernel runs (no thread that finds it true fails the
  // pass), so every thread gets the same answer.
  GPUKV_HD bool lookups_ready() const {
    const Counters& c = *e.pass.counters;
    return c.halted == 0 && c.host_live == 0 && c.writes == 0 && c.optimistic_failed == 0;
  }
  GPUKV_HD void fail_optimistic() const {
    if (e.pass.counters->halted == 0) {
      atomic_ref<unsigned long long>(e.pass.counters->optimistic_failed).store(1, memory_order_relaxed);
    }
  }
  // run() for a pass without writes (read_only), whose every op that is not malformed is a GET alone in the
  // pass: the GPU's lookup kernel, whose code then holds a lookup's walk and answer only. kFetchLine: the
  // first unit's whole line fetched into L2 (a line's hits, whose slot may lie in the line's other half).
  // kWords: a hit answers its slot word too, and its value, which it would otherwise leave to CopyValues
  // (OneGetWithWord).
  template <Walk kWalk = Walk::kAny, bool kFetchLine = false, bool kWords = false>
  GPUKV_HD void run_lookup(std::uint64_t op, Tally& tally) const {
    const KeyWords key = batch_key(e.table, e.batch, op);
    if (group_entry(op, key.len) == kNoGroup) return;  // answered kInvalid
    const ProbePlan plan = plan_probe(hash_key(key, e.table.key_words), e.table.units);
    Probe p = e.start(key, plan, e.template first_unit<kWalk, kFetchLine>(plan));
    while (!step<kWalk>(p, tally)) {
    }
    if (p.at.to_host) {
      e.pass.host_queue[append_index(&e.pass.counters->host_queued)] = op;
    } else {
      tally.found += p.at.hit;
      if constexpr (kWords) {
        e.template apply<false, kWalk>(p, OneGetWithWord{{{op, OpIn{}}}}, tally);
      } else {
        e.template apply<false, kWalk>(p, OneGet{{op, OpIn{}}}, tally);
      }
    }
  }
  // The same for an op CpuExecutor has planned.
  void operator()(std::uint64_t op, const Planned& planned, Tally& tally) const {
    Probe p;
    if (begin(op, planned, p)) walk(op, p, tally);
  }

 private:
  // A pass with writes in which grouping found no op that joined another's entry and no malformed op: every
  // op then runs now, and its group_of entry need not be read, which saves a memory round trip before its
  // key's (bench/RESULTS.md, issue 17, "no group entry read where every op is alone").
  GPUKV_HD_INLINE bool all_alone_and_valid() const {
    return e.pass.counters->joined == 0 && e.pass.counters->malformed == 0;
  }

  // The op's grouping entry, kUngrouped, or kNoGroup for a malformed op (answered kInvalid). `key_len` is
  // the op's, already loaded. In a pass without writes, a GET whose key length is valid is decided on that
  // and its kind; anything else loads the rest of its row (valid()).
  GPUKV_HD_INLINE std::uint32_t group_entry(std::uint64_t op, std::uint32_t key_len) const {
    if (!read_only(e.pass)) return e.pass.group_of[op];
    const bool get = e.batch.kind(op) == OpKind::kGet && key_len <= e.batch.key_width;
    if (get || e.batch.valid(op)) return kUngrouped;
    e.batch.set_status(op, OpStatus::kInvalid);
    return kNoGroup;
  }
  template <Walk kWalk = Walk::kAny>
  GPUKV_HD_INLINE bool begin_walk(std::uint64_t op, std::uint32_t entry, const KeyWords& key, const ProbePlan& plan,
                                  Probe& p) const {
    const UnitWords first = e.template first_unit<kWalk>(plan);
    // A pass in which no op joined another's entry has no shared entry: most passes with writes, each of
    // whose ops then saves a random read of the grouping table, which does not stay in L2 beside the walks'
    // traffic (bench/RESULTS.md, "Nsight Compute").
    if (entry != kUngrouped && e.pass.counters->joined != 0 && group_shared(e.pass.groups, entry)) {
      e.pass.conflicts[append_index(&e.pass.counters->conflicts)] = (std::uint64_t{entry} << 32) | op;
      return false;
    }
    e.start(p, key, plan, first);
    return true;
  }
  // Walks a begun op to its end and applies it. The op's kind and value are loaded before the walk, so that
  // their latency hides behind it rather than following the claim.
  template <Walk kWalk = Walk::kAny, Settle kSettle = Settle::kWithoutPuts>
  GPUKV_HD_INLINE void walk(std::uint64_t op, Probe& p, Tally& tally) const {
    const OpIn in = load_op(e.batch, op);
    while (!step<kWalk>(p, tally)) {
    }
    finish<kWalk, kSettle>(op, p, in, tally);
  }
};

// Turns a host-queue entry (an op) into its sort key: the host slot where the op's walk or claim begins,
// above the op.
template <class Ref>
struct HostQueueKey {
  static constexpr const char* kName = "HostQueueKey";
  Engine<Ref> e;
  GPUKV_HD void operator()(std::uint64_t i, Tally&) const {
    const std::uint64_t op = e.pass.host_queue[i];
    e.pass.host_queue[i] = (e.host_home(batch_key(e.table, e.batch, op)) << kHostQueueOpBits) | op;
  }
};

// Runs the ops ExecuteOp left for the host tier, in the order of `queue` (sorted by host address unless
// TableConfig::order_host is off). They are alone in the pass, so nobody else touches their keys: a GET or
// DELETE came here because its key is in no device slot, so its walk starts in the host tier; an insert
// walks both tiers again (it may still find room in the device tier). kWalk: PassRunner's phase_walk().
template <class Ref, Walk kWalk = Walk::kAny>
struct ExecuteHostOp {
  static constexpr const char* kName = "ExecuteHostOp";
  static constexpr bool kProbes = true;
  ExecuteOp<Ref, true> execute;
  const std::uint64_t* queue;
  ExecuteHostOp bound() const { return ExecuteHostOp{execute.bound(), queue}; }
  GPUKV_HD void operator()(std::uint64_t i, Tally& tally) const {
    const std::uint64_t op = queue[i] & ((std::uint64_t{1} << kHostQueueOpBits) - 1);
    Probe p;
    if (!execute.template begin<kWalk>(op, p)) return;
    const OpIn in = load_op(execute.e.batch, op);
    if (in.kind == OpKind::kGet || in.kind == OpKind::kDelete) execute.e.start_host_walk(p);
    while (!execute.template step<kWalk>(p, tally)) {
    }
    execute.template finish<kWalk>(op, p, in, tally);
  }
};

GPUKV_HD_INLINE std::uint32_t deferred_entry(std::uint64_t v) { return static_cast<std::uint32_t>(v >> 32); }
GPUKV_HD_INLINE std::uint64_t deferred_op(std::uint64_t v) { return v & 0xFFFFFFFFu; }

// Yields, in order, the ops of sorted[begin, end) whose key equals `key`.
template <class Ref>
struct SameKeyOps {
  static constexpr bool kAlone = false;
  static constexpr bool kAnswersWords = false;  // run with the host tier, where GETs answer words anyway
  const Ref* table;
  const BatchRef* batch;
  const std::uint64_t* sorted;
  std::uint64_t at;
  std::uint64_t end;
  KeyWords key;
  GPUKV_HD_INLINE OpKind kind(std::uint64_t op) const { return batch->kind(op); }
  GPUKV_HD_INLINE ValueIn value(std::uint64_t op) const { return batch->value_in(op); }
  GPUKV_HD bool next(std::uint64_t& out) {
    for (; at < end; ++at) {
      const std::uint64_t op = deferred_op(sorted[at]);
      if (keys_equal(batch_key(*table, *batch, op), key, table->key_words)) {
        out = op;
        ++at;
        return true;
      }
    }
    return false;
  }
  GPUKV_HD_INLINE static bool keys_equal(const KeyWords& a, const KeyWords& b, std::uint32_t words) {
    bool equal = a.len == b.len;
GPUKV_UNROLL
    for (std::uint32_t j = 0; j < kMaxKeyWords; ++j) {
      if (j < words) equal &= a.w[j] == b.w[j];
    }
    return equal;
  }
};

// Runs a group entry's deferred ops: the thread at the entry's first position does all of them, one key at
// a time (an entry almost always holds one key; several only if their hashes share a tag). kWalk: PassRunner's
// phase_walk().
template <class Ref, Walk kWalk = Walk::kAny>
struct ExecuteSegment {
  static constexpr const char* kName = "ExecuteSegment";
  static constexpr bool kProbes = true;
  Engine<Ref> e;
  std::uint64_t count;  // deferred ops, sorted
  ExecuteSegment bound() const {
    ExecuteSegment f = *this;
    f.e.pass = e.pass.bound();
    return f;
  }
  GPUKV_HD void operator()(std::uint64_t begin, Tally& tally) const {
    const std::uint64_t* sorted = e.pass.conflicts;
    const std::uint32_t entry = deferred_entry(sorted[begin]);
    if (begin > 0 && deferred_entry(sorted[begin - 1]) == entry) return;
    std::uint64_t end = begin + 1;
    while (end < count && deferred_entry(sorted[end]) == entry) ++end;

    for (std::uint64_t first = begin; first < end; ++first) {
      const KeyWords key = batch_key(e.table, e.batch, deferred_op(sorted[first]));
      bool seen = false;  // ran already as part of an earlier key of this entry
      for (std::uint64_t j = begin; j < first && !seen; ++j) {
        seen = SameKeyOps<Ref>::keys_equal(batch_key(e.table, e.batch, deferred_op(sorted[j])), key,
                                           e.table.key_words);
      }
      if (seen) continue;
      const ProbePlan plan = plan_probe(hash_key(key, e.table.key_words), e.table.units);
      e.template run_key<kWalk>(key, plan, e.template first_unit<kWalk>(plan),
                                  SameKeyOps<Ref>{&e.table, &e.batch, sorted, first, end, key}, tally);
    }
  }
};

// Copies the values ExecuteOp left to it (PassRef::copy_later): a GET's from its slot to the answer column,
// a PUT's from the batch into its key's slot (a new one, or over the old value); and their slot words, where
// the table keeps them (TableConfig::slot_word). `lanes` threads per op,
// neighbours in a warp, each moving 16 bytes at a time of the same value, so that a warp reads and writes a
// wide value as a few whole lines, where one thread copying 8 bytes after 8 bytes waited for each
// (bench/RESULTS.md, wide values). Runs once every op that leaves a pending[] entry has written it, just before
// FinishPass: nothing else in the pass reads or changes these slots (their keys are alone in the pass, new
// slots stay BUSY), and clean-up comes after.
template <class Ref>
struct CopyValues {
  static constexpr const char* kName = "CopyValues";
  // A GET's copy waits on a random read of its slot, so residency is what its rate needs: at 8 blocks an SM
  // (32 registers) the GPU holds every thread it can. Writing a PUT's whole slot let the compiler take 42, and
  // 16 B / 128 B hits ran 0.93x (H100, run 327).
  static constexpr int kMinBlocks = 8;
  Ref table;
  BatchRef batch;
  const std::uint64_t* pending;
  std::uint32_t lanes;  // threads per op
  const Counters* counters;
  bool queued;  // queued ahead of the host: nothing to do unless the pass finishes on the device
  GPUKV_HD bool idle() const { return queued && (host_first(*counters) || counters->pending == 0); }
  GPUKV_HD void operator()(std::uint64_t i, Tally&) const {
    const std::uint64_t op = i / lanes;
    const std::uint32_t lane = static_cast<std::uint32_t>(i % lanes);
    const std::uint64_t p = pending[op];
    if (!pending_has(p, kPendingGather | kPendingScatter | kPendingOverwrite)) return;
    // A GET's value goes from the slot to the answer. A PUT's goes into a new key's slot, or over an old
    // value, whose length changes here. On a board a PUT writes its slot whole, from its first sector:
    // lengths, key, value, zeros to the end of the value's last sector, and the slot's word. The walk left
    // even a new key's lengths and key to this step, so that each sector of the slot is written once, whole:
    // a sector written in part, by the walk and then by this step, costs HBM a read-modify-write each time
    // it leaves L2 (TableRef's layout note). 16 B / 128 B inserts 1.45-1.49x, 1 KiB 1.17x (H100, run 335). An
    // overwrite writes its key again as it was: nothing else reads the slot meanwhile (its key is alone in the
    // pass, and every walk of the pass has ended). In a line the walk stored a new key and its lengths.
    const std::uint64_t slot = pending_slot(p);
    const bool gather = pending_has(p, kPendingGather);
    const std::uint32_t len = gather ? table.load_lens(slot).value : batch.value_lens[op];
    const bool whole = !gather && table.slots_own_sectors();
    // The slot's head, its lengths and key, a word a lane: loaded before the value's words and stored after
    // them, so that the loads wait together. A second round of the copy loop for the head's words cost 1 KiB
    // overwrites 8% and overwrites of 8-byte values with words 18% (run 328); the head stored before the
    // loop, after its own load, 16 B / 128 B overwrites 10% (run 333). GpuBackend gives a board's table as
    // many lanes as the head has words (Geometry::copied_head_words); the loop at the end serves fewer (the
    // CPU backend's one). With that loop compiled out of the GPU's code (every backend giving enough lanes),
    // 1 KiB overwrites, mixed batches and hits ran 3-4% slower (run 334 against run 332, the same base): the
    // copy loop's code came out otherwise, why is not pinned down.
    const std::uint32_t head = whole ? table.header_words() + table.key_words : 0;
    const std::uint64_t mine = lane < head ? head_word(op, lane, len) : 0;
    if (lane == 0 && gather && batch.out_value_lens != nullptr) batch.out_value_lens[op] = len;
    if (lane == 0 && !whole && pending_has(p, kPendingOverwrite)) {
      table.store_value_len(slot, len, table.load_lens(slot).key);
    }
    // A slot's word goes with its value (Engine::store_slot_word says why here).
    if (lane == 0 && table.slot_word_offset != 0) {
      if (!gather) {
        *table.slot_word_at(slot) = batch.slot_word(op);
      } else if (batch.out_slot_words != nullptr) {
        batch.out_slot_words[op] = *table.slot_word_at(slot);
      }
    }
    // One copy loop for every kind of op: a warp holds ops of several kinds, and a loop of its own for some
    // of them ran mixed batches of 128-byte values 0.97x (run 329).
    copy(gather ? table.value_words_at(slot) : batch.value_words(op),
         gather ? batch.out_value_words(op) : table.value_words_at(slot), len,
         gather ? (len + 7) / 8 : table.stored_value_words(len), lane);
    std::uint64_t* const start = table.value_words_at(slot) - head;
    if (lane < head) start[lane] = mine;
    for (std::uint32_t w = lane + lanes; w < head; w += lanes) start[w] = head_word(op, w, len);
  }
  // Word `w` of a board slot's head for op's PUT of a value of `len` bytes: its lengths, then its key's words,
  // zero past the key's length (as load_key gives them).
  GPUKV_HD_INLINE std::uint64_t head_word(std::uint64_t op, std::uint32_t w, std::uint32_t len) const {
    const std::uint32_t key_len = batch.key_lens[op];
    if (w == 0) return std::uint64_t{key_len} | (std::uint64_t{len} << 32);
    const std::uint32_t begin = 8 * (w - 1);
    return key_len > begin ? reinterpret_cast<const std::uint64_t*>(batch.key(op))[w - 1] & byte_mask(key_len - begin) : 0;
  }

  // Writes `total` words to `to`: the `len` bytes at `from`, then zeros. This lane's share: 2 words of every
  // 2 * lanes. Both words are addressed from one pointer, a word apart, so that their loads go out together
  // before either is used: indexed as from[w] and from[w + 1] (which may wrap, for all the compiler knows),
  // the second took registers of its own, and at 32 the compiler masked the first word, waiting for its
  // load, before it issued the second. 1 KiB overwrites ran 1.04-1.05x this way, mixed batches 1.03x
  // and hits 1.02x (H100, run 336).
  GPUKV_HD_INLINE void copy(const std::uint64_t* from, std::uint64_t* to, std::uint32_t len, std::uint32_t total,
                            std::uint32_t lane) const {
    const std::uint32_t words = (len + 7) / 8;
    const std::uint64_t last_mask = byte_mask(len % 8 == 0 ? 8 : len % 8);
    for (std::uint32_t w = 2 * lane; w < total; w += 2 * lanes) {
      const std::uint64_t* const s = from + w;
      std::uint64_t a = w < words ? s[0] : 0;
      std::uint64_t b = w + 1 < words ? s[1] : 0;
      if (w + 1 == words) a &= last_mask;
      if (w + 2 == words) b &= last_mask;
      std::uint64_t* const d = to + w;
      d[0] = a;
      if (w + 1 < total) d[1] = b;
    }
  }
};

// Settles the tickets a pass left BUSY, indexed by op: no atomics on shared counters, one coalesced read. Clears
// every entry it finds, so that the next pass starts with none (kNothingPending).
template <class Ref>
struct FinishPass {
  static constexpr const char* kName = "FinishPass";
  Ref table;
  Ref host;
  std::uint64_t* pending;
  const Counters* counters;
  bool queued;  // as in CopyValues
  GPUKV_HD bool idle() const { return queued && (host_first(*counters) || counters->pending == 0); }
  GPUKV_HD void operator()(std::uint64_t op, Tally&) const {
    using Codec = typename Ref::Codec;
    const std::uint64_t p = pending[op];
    if (p == kNothingPending) return;
    pending[op] = kNothingPending;
    if (!pending_ticket(p)) return;
    const Board<Codec::kBits> board = (p & kPendingHostTier) != 0 ? host.board : table.board;
    const std::uint64_t slot = pending_slot(p);
    board.flip(slot / Codec::kPerWord, static_cast<int>(slot % Codec::kPerWord), Codec::kBusy, pending_ticket_code(p));
  }
};

}  // namespace gpukv::detail
