// The host side of a pass and of a clean-up, written once for both backends. An Executor supplies the few
// primitives that differ between a GPU and a pool of host threads:
//
//   for_each(n, f, threads) run f(i, tally) for i in [0, n) (on at most `threads` GPU threads if not 0),
//                           then add every thread's tally to the counters; nothing if f has idle() and it
//                           is true (asked once per thread or per call, not per item)
//   execute(n, f, policy)   for_each for ExecuteOp; the GPU picks its lane schedule by LanePolicy
//   zero(p, bytes)          clear scratch
//   sort(keys, n, bits)     sort 64-bit keys ascending by their low `bits` bits (the rest are zero)
//   group_in_bins(e, n, b)  the GPU only (Exec::kGroupsInBins): group a pass's ops in 2^b bins
//                           (batch_groups.hpp), as GroupOp would, and do StartPass's work first
//   read_counters()         wait for all submitted work, return the counters
//   write_counters(c)       set the counters (ordered after submitted work)
//   snapshot_counters(s)    copy the counters, once the work submitted so far is done, into readback slot s
//                           (0 or 1) without waiting for it
//   snapshot_slot(s)        where slot s lies, for a step to copy the counters to; snapshot_taken(s) after
//                           that step is submitted: the copy snapshot_counters(s) would have made
//   wait_snapshot(s)        wait for that copy and return it
//   allocate(bytes, host)   scratch for clean-up (`host`: for the host tier, in host memory the kernels can
//                           reach); an object with data(), empty() on failure
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <optional>

#include "cleanup.hpp"
#include "export.hpp"
#include "pass_ops.hpp"
#include "gpukv/types.hpp"

namespace gpukv::detail {

// Scratch for one pass of up to n operations (sizes from scratch_bytes()). The backends allocate `groups` and
// `pending` zeroed; PassRunner leaves them so after every pass.
struct PassScratch {
  std::uint32_t* groups;      // group_entries(n) entries
  std::uint32_t* group_of;    // n
  std::uint64_t* conflicts;   // n
  std::uint64_t* pending;     // n, all kNothingPending between passes
  std::uint64_t* host_queue;  // n
  std::uint64_t ops;          // n
};

// Grouping table size for a pass of n ops: a power of two, at least 2n, so probe chains stay short.
inline std::uint64_t group_entries(std::uint64_t n) { return std::bit_ceil(std::max<std::uint64_t>(64, 2 * n)); }

// Byte sizes of the PassScratch arrays for a pass of n ops, in declaration order.
struct ScratchBytes {
  std::uint64_t groups, group_of, conflicts, pending, host_queue;
};
inline ScratchBytes scratch_bytes(std::uint64_t n) {
  return ScratchBytes{group_entries(n) * sizeof(std::uint32_t), n * sizeof(std::uint32_t), n * sizeof(std::uint64_t),
                      n * sizeof(std::uint64_t), n * sizeof(std::uint64_t)};
}

// Deferred same-key ops are (group entry << 32 | op) with entries below 2^25 (group_entries(kMaxPassOps)).
inline constexpr int kConflictSortBits = 32 + 25;

// A pass of `ops` ops, `writes` of them valid writes, mixes reads and writes: the lane schedules treat it apart.
GPUKV_HD_INLINE bool mixes_reads_and_writes(std::uint64_t writes, std::uint64_t ops) {
  return writes * 10 >= ops && writes * 10 <= ops * 9;
}

// When the GPU's probing step uses collaborative lanes (clStash). Decided on the device from the counters
// StartPass leaves, so that no host round trip sits between the steps. Measured on an H200
// (bench/RESULTS.md): clStash wins for passes that mix reads and writes at every load, and for single-ticket
// probing past about 0.9 load; plain Stash wins for pure lookups and pure inserts with group probing.
//
// A pass without writes under Stash lanes runs in the GPU's lookup kernel if the host launched it
// (`lookups`: the last finished pass had no writes, and CudaExecutor launches it only for a pass with more
// ops than the Stash kernel holds at once; else the Stash kernel runs the pass, and a pass that writes pays
// no launch for it). `lookups_miss` sizes that kernel: when most lookups of the last pass without
// writes missed, every block that fits runs, because a miss's walk is a chain of ticket words and more warps
// in flight shorten it; when most hit, as many blocks as the Stash kernel runs, because a hit reads its slot
// through L1, which more warps thrash (H100, run 141: 6 blocks per SM against 4, misses up to 1.11x, hits
// down to 0.92x). Below 0.8 load (`low_load`), where most hits end in their first unit, whose first sector a
// line's hits keep in L1 (Walk::kLineReadOnly), fewer still: 3 blocks an SM against 4, hits 1.049 / 1.038 /
// 1.029 / 1.002x at loads 0.5 / 0.6 / 0.7 / 0.8, but 0.979 / 0.969x at 0.9 / 0.95, where more of their walks go
// on (H200, runs 394-395).
//
// A mixed pass splits its ops by kind instead (`split`), where the host launched the kernels for it
// (`kinds_apart`; under kAuto: after a mixed pass, a pass of at least 512K ops whose values the probing step
// copies, CudaExecutor's kSplitMinOps; where no pass of the call has finished yet (`mix_unknown`), one of more
// than 2M ops, kSplitUnknownMixMinOps; under kSplit: every pass): its other ops first, in a Stash kernel whose
// deletes settle at once (Settle::kAlways), as no op that may claim a slot runs beside them (in a line, each
// line fetched whole and walked through L1: Walk::kLineFetched); then its PUTs, in a Stash kernel that in a
// line compares from L2 and so publishes their new keys in the pass (Walk::kLineFromL2NoFetch for one-word
// keys). Each kernel packs its warps with ops of its kind. Same-key ops are deferred as in every pass, so the
// order of the two kernels reorders nothing. Where clStash left a mixed pass's deletes (and a line's new keys)
// BUSY for FinishPass, a second random atomic each on a line that has left L2, the split leaves it nothing:
// mixed passes of 4M ops 1.02-1.07x (H100, bench/RESULTS.md, run 260).
struct LanePolicy {
  LaneMode mode;
  std::uint64_t items_from;  // clStash from this many live keys
  std::uint64_t ops;         // ops in the pass
  bool lookups = false;       // the lookup kernel is launched for the pass
  bool lookups_miss = false;  // the last pass without writes found under half of its keys
  bool kinds_apart = false;   // the kernels of a mixed pass split by kind are launched for the pass
  // Under kAuto, where no load of the table reaches items_from (group probing: default_clstash_load): a pass
  // launched split by kind runs split whatever its mix turns out to be, and neither the Stash nor the clStash
  // kernel is launched for it (CudaExecutor), unless its mix is unknown (mix_unknown: the Stash kernel is then
  // launched too, and the split kernels run the pass only if it is mixed). The two kernels run any mix
  // correctly (see above); a pass that is not mixed after all pays only the packing of its warps.
  bool split_any_mix = false;
  // Under kAuto: the pass's mix is not known from a pass of its own call, and the last finished pass was not
  // mixed. A call's first pass (or its grouped run after a failed optimistic try) and its second, unless that
  // one was halted and queued again, are queued before any pass of the call has finished. The split kernels
  // are launched beside the lane schedule, and the device runs the pass in whichever its mix picks: a mixed
  // call after a pure one ran its first two passes in the clStash kernel, 0.81 ms a pass at load 0.9 where
  // split ones took 0.60 (H100, run 351). Such a pass does not run split whatever its mix: a pure pass runs
  // where it would have, and the split kernels return at once.
  bool mix_unknown = false;
  // The device tier's live keys were under 0.8 of its capacity as the last pass finished: the lookup kernel of
  // a line's passes expected to hit runs fewer blocks (see above).
  bool low_load = false;
  // Every kernel of the step must get the same answer: from the pass's mix (StartPass) and the live keys as
  // the pass began. `items` itself grows while the Stash kernel inserts, and a pass that carried it past
  // items_from ran its ops in the clStash kernel too (TableEdgeTest, APassThatCrossesTheLaneSwitchRunsEachOpOnce).
  GPUKV_HD_INLINE bool collaborative(const Counters& c) const {
    if (mode != LaneMode::kAuto) return mode == LaneMode::kClStash;
    return (mixes_reads_and_writes(c.writes, ops) && !kinds_apart) || c.start_items >= items_from;
  }
  // The pass runs split by kind whatever its mix (split_any_mix, launched for it, and its mix not unknown):
  // neither lane schedule need be launched for it.
  GPUKV_HD_INLINE bool splits_any_mix() const {
    return kinds_apart && mode == LaneMode::kAuto && split_any_mix && !mix_unknown;
  }
  // The clStash kernel may run the pass: under kAuto, not where the split kernels are launched and no load of
  // the table reaches items_from (collaborative() is then false whatever the counters say).
  GPUKV_HD_INLINE bool may_collaborate() const {
    return mode == LaneMode::kClStash || (mode == LaneMode::kAuto && !(kinds_apart && split_any_mix));
  }
  // The pass runs split by kind: mixed and launched for it (under kAuto, below the load that switches to
  // clStash), or splits_any_mix.
  GPUKV_HD_INLINE bool split(const Counters& c) const {
    if (splits_any_mix()) return true;
    if (!kinds_apart || !mixes_reads_and_writes(c.writes, ops)) return false;
    return mode == LaneMode::kSplit || (mode == LaneMode::kAuto && c.start_items < items_from);
  }
};

// The measured default switch load for a probing scheme (TableConfig::clstash_load < 0). Group probing has
// no crossover up to 0.95 for inserts, so load alone never switches it (2.0 is beyond any table's load).
inline double default_clstash_load(Probing probing) { return probing == Probing::kSingle ? 0.90 : 2.0; }

// A tier's limits, from its geometry.
struct TierLimits {
  std::uint64_t capacity = 0;            // slots that can hold keys
  std::uint64_t max_items = 0;           // live keys allowed
  std::uint64_t cleanup_tombstones = 0;  // tombstones that trigger a clean-up
  std::uint64_t crowded_tombstones = 0;  // tombstones past max_items that trigger one (see crowded())
};

// How the host tier's accesses run (TableConfig::order_host, host_phase_threads).
struct HostPhase {
  bool ordered = true;
  std::uint32_t threads = 0;
};

struct PassStats {
  std::uint64_t passes = 0;
  std::uint64_t conflict_ops = 0;
  std::uint64_t cleanups = 0;
  std::uint64_t cleanups_skipped = 0;  // clean-ups that found no memory for the displaced keys
  std::uint64_t optimistic_passes = 0;
  std::uint64_t optimistic_failures = 0;
};

template <class Ref, class Exec>
class PassRunner {
 public:
  // `host` has units == 0 when the table has no host tier.
  // `copy_lanes`: threads per op that copy the values of ops alone in their pass after the probing step
  // (CopyValues); 0: each op copies its own value. `optimistic`: TableConfig::optimistic_inserts.
  PassRunner(Ref table, Ref host, Exec& exec, Counters* counters, TierLimits device_limits, TierLimits host_limits,
             HostPhase host_phase, LaneMode lanes, double clstash_load, std::uint32_t copy_lanes = 0,
             OptimisticInserts optimistic = OptimisticInserts::kOff)
      : table_(table),
        host_(host),
        exec_(exec),
        counters_(counters),
        lanes_(lanes),
        clstash_items_(static_cast<std::uint64_t>((clstash_load < 0 ? default_clstash_load(Ref::kProbing) : clstash_load) *
                                                  static_cast<double>(device_limits.capacity))),
        capacity_(device_limits.capacity),
        host_capacity_(host_limits.capacity),
        max_items_(device_limits.max_items),
        host_max_items_(host_limits.max_items),
        host_phase_(host_phase),
        copy_lanes_(copy_lanes),
        optimistic_(optimistic),
        host_sort_bits_(std::bit_width(host.positions) + kHostQueueOpBits),
        crowded_tombstones_{device_limits.crowded_tombstones, host_limits.crowded_tombstones},
        cleanup_{TierCleanup(device_limits.cleanup_tombstones), TierCleanup(host_limits.cleanup_tombstones)} {}

  // Executes a batch as consecutive passes of at most `pass_ops` ops, with scratch for at least
  // min(batch.size, pass_ops) ops. Returns when every result is written.
  //
  // Passes are queued one ahead of the host: while the device runs pass k, the host waits for the counters
  // of pass k-1. A pass that deferred no op and left none to the host tier (the usual case) needs nothing
  // more from the host, so the device does not wait for the host's round trip between passes (1.00-1.03x
  // on the GPU with passes of 4M ops; most of the idle time between passes was the launches, which
  // CudaExecutor now starts early: bench/RESULTS.md, "a pass's fixed cost"). A pass that did leave work to
  // the host halts the pass queued after it (BeginPass); the host finishes the pass, then queues the halted
  // one again.
  void run(const BatchRef& batch, const PassScratch& scratch, std::uint64_t pass_ops) {
    if (batch.size == 0) return;
    if (unfinished_) {
      // The last call threw (a CUDA error, no memory for the sort) and may have left a pass's host work
      // marked undone, which would halt every pass from now on, and pending[] entries no FinishPass
      // cleared: finish what the device holds and clear both.
      exec_.zero(scratch.pending, scratch.ops * sizeof(std::uint64_t));
      known_ = exec_.read_counters();
      known_.conflicts = 0;
      known_.host_queued = 0;
      known_.halted = 0;
      exec_.write_counters(known_);
    }
    unfinished_ = true;
    unsnapped_ = -1;
    mix_from_call_ = false;
    if (scratch.groups != groups_seen_) {
      // A new grouping table is all zero (the backends zero it when they allocate it). The first pass of a
      // call is never halted (the last call finished every pass), so its BeginPass sees this.
      groups_seen_ = scratch.groups;
      fresh_groups_ = true;
      dirty_bound_ = 0;
    }
    const std::uint64_t passes = (batch.size + pass_ops - 1) / pass_ops;
    std::optional<Queued> before;  // queued, not yet finished
    for (std::uint64_t k = 0; k < passes;) {
      const Queued pass = queue(batch.part(k * pass_ops, pass_ops), scratch, k + 1 < passes);
      if (before) {
        const bool halted = finish(*before, scratch);
        before.reset();
        if (halted) {  // `pass` did nothing: queue it again
          unsnapped_ = -1;  // nobody reads its counters
          maybe_cleanups();
          continue;
        }
        if (cleanup_due()) {  // clean-up needs every queued pass finished
          finish(pass, scratch);
          maybe_cleanups();
          ++k;
          continue;
        }
      }
      before = pass;
      ++k;
    }
    if (before) {
      finish(*before, scratch);
      maybe_cleanups();
    }
    unfinished_ = false;
  }

  // Removes every tombstone of both tiers and re-places displaced keys. Returns false if a tier's scratch
  // for its displaced keys could not be allocated (that tier is then unchanged).
  // Nor while clean-up is held.
  bool cleanup() {
    if (cleanup_holds_ != 0) return false;
    const bool device = cleanup_tier(false);
    return (!has_host() || cleanup_tier(true)) && device;
  }

  // Table::hold_cleanup: a count, so that overlapping scans each hold it.
  void hold_cleanup(bool hold) {
    if (hold) {
      ++cleanup_holds_;
    } else if (cleanup_holds_ != 0) {
      --cleanup_holds_;
    }
  }

  std::uint64_t slot_count() const { return table_.positions + host_.positions; }

  // Copies the live items of slot positions [from, from + n) (the device tier's slots, then the host
  // tier's) to `out`, memory the executor's threads write, with room for n items; returns how many.
  std::uint64_t export_items(std::uint64_t from, std::uint64_t n, ItemColumns out) {
    const std::uint64_t end = std::min(from + n, slot_count());
    std::uint64_t count = 0;
    for (const bool in_host : {false, true}) {
      const Ref t = in_host ? host_ : table_;
      const std::uint64_t base = in_host ? table_.positions : 0;  // the tier's first position
      const std::uint64_t begin = std::max(from, base), stop = std::min(end, base + t.positions);
      if (begin >= stop) continue;
      known_.extracted = 0;
      exec_.write_counters(known_);
      exec_.for_each(stop - begin, ExportItem<Ref>{t, begin - base, out, &counters_->extracted});
      const std::uint64_t found = exec_.read_counters().extracted;
      count += found;
      out.keys += found * (Ref::key_words * 8);
      out.key_lens += found;
      out.values += found * t.value_stride;
      out.value_lens += found;
      if (out.slot_words != nullptr) out.slot_words += found;
    }
    known_.extracted = 0;
    exec_.write_counters(known_);
    return count;
  }

  const Counters& counters() const { return known_; }
  const PassStats& stats() const { return stats_; }

 private:
  // Where a pass may run optimistically (PassRef::optimistic): the GPU's line walks.
  static constexpr bool kMayRunOptimistic = Exec::kLineWalks;

  struct TierCleanup {
    explicit TierCleanup(std::uint64_t tombstones) : step(std::max<std::uint64_t>(1, tombstones)), next(step) {}
    std::uint64_t step;  // tombstones that trigger a clean-up
    std::uint64_t next;  // the count at which the next one runs
    std::uint64_t crowded_retry = 0;  // after a failed clean-up of a crowded tier (or one short of EMPTY
                                      // tickets): tombstones to wait for
  };

  bool has_host() const { return host_.units != 0; }

  // A pass queued but not yet finished.
  struct Queued {
    BatchRef batch;
    PassRef pass;
    bool ahead;  // queued ahead of the host: CopyValues and FinishPass are queued too
    int slot;    // its counters' readback slot
  };

  // Queues a pass: its steps up to the probing step, and the rest too if `ahead`. What a pass needs of the
  // counters as it begins, BeginPass works out on the device. The pass's counters are read back by the next
  // pass's BeginPass, or by finish() if it comes first: passes of 65536 ops on the GPU, writes 1.02-1.12x
  // (H100, bench/RESULTS.md, run 278).
  // `grouped`: the pass is grouped whatever TableConfig::optimistic_inserts says (an optimistic pass that
  // failed, run again).
  Queued queue(const BatchRef& batch, const PassScratch& scratch, bool ahead, bool grouped = false) {
    const std::uint64_t n = batch.size;
    const std::uint64_t entries = group_entries(n);
    const bool optimistic = !grouped && runs_optimistic();
    const PassRef pass{scratch.groups, entries - 1, scratch.group_of, scratch.conflicts, scratch.pending,
                       scratch.host_queue, counters_, max_items_, host_max_items_, copy_lanes_ != 0,
                       /*checked=*/false, /*host_live=*/false,  // BeginPass sets them: PassRef::reserves()
                       /*inserts_expected=*/!table_.slots_own_sectors() && inserting_, optimistic};
    const Engine<Ref> engine{table_, host_, batch, pass};
    const int bin_bits = optimistic ? 0 : group_bins(entries);
    // The pass queued before this one has its counters copied by this pass's BeginPass.
    Counters* const snapshot = unsnapped_ >= 0 ? exec_.snapshot_slot(unsnapped_) : nullptr;
    exec_.for_each(1, BeginPass{counters_, snapshot, n, max_items_, entries, fresh_groups_, bin_bits != 0 || optimistic,
                                optimistic});
    if (snapshot != nullptr) exec_.snapshot_taken(unsnapped_);
    fresh_groups_ = false;
    // Grouping entries at or past dirty_bound_ are zero; BeginPass works out how many below it are not.
    // Grouping in bins does StartPass's work in its first kernel, a launch less a pass (writes 1.01-1.04x on
    // an H100, run 210), in every pass it groups. A pass is grouped in bins only where the last finished pass
    // wrote (group_bins), a call's first passes on the word of the call before: a call of one pass, as a long
    // mixed workload's are, saves StartPass's 33 us of its 740 (mixed batches in a steady state 1.03-1.06x,
    // deletes after a mixed batch 1.02-1.04x; H100, run 349). The cost falls on a call without writes after
    // one with: its first two passes scatter their ops, where StartPass's count would have let grouping return
    // at once (finds 0.99x where every call's first passes did so, run 210).
    if (bin_bits == 0) {
      const std::uint64_t start_items = StartPass::items_for(n, dirty_bound_);
      exec_.for_each(start_items, StartPass{batch, scratch.groups, counters_, start_items, optimistic});
    }
    dirty_bound_ = std::max(dirty_bound_, entries);
    // An optimistic pass has StartPass alone before its probing step: it clears what the pass before left in
    // the grouping table, and counts the writes that tell the optimistic kernel whether every op is a PUT.
    if (bin_bits != 0) {
      if constexpr (Exec::kGroupsInBins) exec_.group_in_bins(engine, n, bin_bits);
    } else if (!optimistic) {
      if (groups_by_bucket(entries)) {
        exec_.for_each(n, GroupOp<Ref, true>{engine});
      } else {
        exec_.for_each(n, GroupOp<Ref, false>{engine});
      }
    }
    const bool mix_unknown = lanes_ == LaneMode::kAuto && !mixed_expected_ && !mix_from_call_;
    exec_.execute(n, ExecuteOp<Ref>{engine},
                  LanePolicy{lanes_, clstash_items_, n, lookups_expected_, lookups_miss_,
                             lanes_ == LaneMode::kSplit || (lanes_ == LaneMode::kAuto && mixed_expected_) || mix_unknown,
                             clstash_items_ > capacity_, mix_unknown, 5 * known_.items < 4 * capacity_});
    if (ahead) {
      if (copy_lanes_ != 0) {
        exec_.for_each(n * copy_lanes_, CopyValues<Ref>{table_, batch, scratch.pending, copy_lanes_, counters_, true});
      }
      exec_.for_each(n, FinishPass<Ref>{table_, host_, scratch.pending, counters_, true});
    }
    slot_ ^= 1;
    unsnapped_ = slot_;  // copied by the next pass's BeginPass, or by finish() if none comes first
    return Queued{batch, pass, ahead, slot_};
  }

  // Waits for a queued pass's counters and runs whatever it left to the host. Returns whether the pass
  // queued after it was halted (it then did nothing, and must be queued again).
  bool finish(const Queued& q, const PassScratch& scratch) {
    if (unsnapped_ == q.slot) {  // the last pass queued
      exec_.snapshot_counters(q.slot);
      unsnapped_ = -1;
    }
    known_ = exec_.wait_snapshot(q.slot);
    if (q.pass.optimistic) {
      // A pass that held GETs only and was not failed by its BeginPass ran them as lookups
      // (ExecuteOp::lookups_ready): it stands, and is no optimistic pass of PUTs, kept or redone.
      if (known_.optimistic_failed != 0) {
        stats_.optimistic_passes += 1;
        return run_again_grouped(q, scratch);
      }
      if (known_.writes != 0) {
        stats_.optimistic_passes += 1;
        optimistic_after_ = 1;
      }
    }
    const std::uint64_t n = q.batch.size;
    // Whether the pass looked like one of inserts: every op wrote, and at least half of them added a key.
    // The passes queued from now on expect the same (PassRef::inserts_expected).
    const unsigned long long live = known_.items + known_.host_items;
    inserting_ = known_.writes == n && live >= live_before_ && 2 * (live - live_before_) >= known_.writes;
    // Whether every op inserted a new key, each alone in the pass: after such passes the next runs
    // optimistically (TableConfig::optimistic_inserts kAuto; runs_optimistic).
    const bool new_keys = known_.puts == n && live == live_before_ + n && known_.joined == 0 && known_.conflicts == 0 &&
                          known_.host_queued == 0;
    new_key_passes_ = new_keys ? new_key_passes_ + 1 : 0;
    live_before_ = live;
    // LanePolicy::lookups_miss, from a pass without writes (the GPU's lookup kernel counts the keys its
    // lookups found; the CPU backend counts none and never asks).
    lookups_expected_ = known_.writes == 0;
    writes_expected_ = known_.writes != 0;
    mixed_expected_ = mixes_reads_and_writes(known_.writes, n);
    mix_from_call_ = true;
    if (known_.writes == 0) lookups_miss_ = 2 * known_.found < n;
    const std::uint64_t deferred = known_.conflicts;
    const std::uint64_t host_ops = known_.host_queued;
    stats_.passes += 1;
    stats_.conflict_ops += deferred;
    const bool host_work = deferred != 0 || host_ops != 0;
    if (q.ahead && !host_work) return false;  // finished on the device
    const Engine<Ref> engine{table_, host_, q.batch, q.pass};
    phase_walk([&](auto walk) {
      constexpr Walk kWalk = decltype(walk)::value;
      if (deferred != 0) {
        exec_.sort(scratch.conflicts, deferred, kConflictSortBits);
        exec_.for_each(deferred, ExecuteSegment<Ref, kWalk>{engine, deferred});
      }
      if (host_ops != 0) {
        if (host_phase_.ordered) {
          exec_.for_each(host_ops, HostQueueKey<Ref>{engine});
          exec_.sort(scratch.host_queue, host_ops, host_sort_bits_);
        }
        exec_.for_each(host_ops, ExecuteHostOp<Ref, kWalk>{ExecuteOp<Ref, true>{engine}, scratch.host_queue},
                       host_phase_.threads);
      }
    });
    // Once every op that leaves a pending[] entry has written it. ExecuteOp's pending count includes the GETs
    // it left to CopyValues and its new keys; the host phase may place new keys in the device tier too.
    if (copy_lanes_ != 0 && (known_.pending != 0 || host_ops != 0)) {
      exec_.for_each(n * copy_lanes_, CopyValues<Ref>{table_, q.batch, scratch.pending, copy_lanes_, counters_, false});
    }
    // FinishPass completes the pass: it publishes the new slots their writers left BUSY, and turns deleted
    // ones into tombstones.
    if (known_.pending != 0 || host_work) {
      exec_.for_each(n, FinishPass<Ref>{table_, host_, scratch.pending, counters_, false});
    }
    if (!host_work) return false;
    // The later phases changed items and tombstones. The next pass may begin once these are clear.
    known_ = exec_.read_counters();
    known_.conflicts = 0;
    known_.host_queued = 0;
    known_.halted = 0;
    exec_.write_counters(known_);
    return q.ahead;
  }

  // Whether the next pass queued runs optimistically (PassRef::optimistic): on the GPU, in a line whose values
  // the probing step copies, with no host tier, as TableConfig::optimistic_inserts says.
  // kAuto: after a pass of new keys, or after two once a try has failed, until one succeeds: batches of new
  // keys taking turns with batches of other ops then fail once, not every other pass.
  bool runs_optimistic() const {
    if constexpr (kMayRunOptimistic) {
      if (table_.slots_own_sectors() || copy_lanes_ != 0 || has_host()) return false;
      return optimistic_ == OptimisticInserts::kAlways ||
             (optimistic_ == OptimisticInserts::kAuto && new_key_passes_ >= optimistic_after_);
    }
    return false;
  }

  // An optimistic pass that failed (Counters::optimistic_failed): takes out the keys it inserted, then runs
  // it again, grouped, and finishes it before anything else runs. The pass queued after it, if any, was
  // halted by its BeginPass (host_first), and is queued again by run(). Returns whether one was.
  bool run_again_grouped(const Queued& q, const PassScratch& scratch) {
    stats_.optimistic_failures += 1;
    optimistic_after_ = 2;
    if constexpr (kMayRunOptimistic) {
      if (known_.items != known_.start_items) {
        const Engine<Ref> engine{table_, host_, q.batch, q.pass};
        exec_.for_each(q.batch.size, FindOptimisticInserts<Ref>{engine, scratch.conflicts});
        exec_.for_each(q.batch.size, EraseOptimisticInserts<Ref>{engine, scratch.conflicts});
      }
    }
    known_ = exec_.read_counters();
    known_.optimistic_failed = 0;
    known_.halted = 0;
    exec_.write_counters(known_);
    unsnapped_ = -1;  // nobody reads the halted pass's counters
    finish(queue(q.batch, scratch, /*ahead=*/false, /*grouped=*/true), scratch);
    return q.ahead;
  }

  // The bins of a pass's grouping (batch_groups.hpp), or 0 for GroupOp: on the GPU, in a pass of 1M to 4M
  // ops expected to write (as the last finished pass did). A pass without writes then launches one kernel
  // that returns at once (GroupOp) where grouping in bins launches three.
  int group_bins(std::uint64_t entries) const {
    if constexpr (Exec::kGroupsInBins) {
      if (writes_expected_) return group_bin_bits(entries);
    }
    return 0;
  }

  // Calls f(std::integral_constant<Walk, kWalk>) with the walk of the phases after the probing step (the
  // ordered phase, the host phase): on the GPU (Exec::kLineWalks), kLineFromL2 in a line, whose new keys these
  // phases then publish at once (Engine::commit); Walk::kAny on a board and on the host. A kernel for each
  // rather than a branch in one: with the line's walk beside it, the board's host-phase kernel spilled 128
  // bytes of stack a thread, alone 32 (bench/RESULTS.md, issue 17, "a line's lengths in a word of their own").
  template <class F>
  void phase_walk(F&& f) const {
    if constexpr (Exec::kLineWalks && Ref::kProbing == Probing::kGroup) {
      if (!table_.slots_own_sectors()) {
        f(std::integral_constant<Walk, Walk::kLineFromL2>{});
        return;
      }
    }
    f(std::integral_constant<Walk, Walk::kAny>{});
  }

  unsigned long long& tombstones(bool in_host) { return in_host ? known_.host_tombstones : known_.tombstones; }

  // Whether the tier's tombstones have taken their share (TableConfig::cleanup_headroom, half by default) of
  // the headroom a full tier keeps EMPTY. A probe ends only at an EMPTY ticket, so in a tier held near
  // max_items (the device tier once the host tier takes the overflow) every lookup of an absent key walks
  // ever longer as deletes pile up, long before tombstones reach the `step` share of the capacity (in the
  // service's host-tier run of 2026-11-23, the device tier sat at max_items with 5% tombstones while a mixed
  // workload fell from 18.8 to 1.5 M ops/s in four seconds).
  bool crowded(bool in_host) const {
    const std::uint64_t items = in_host ? known_.host_items : known_.items;
    const std::uint64_t dead = in_host ? known_.host_tombstones : known_.tombstones;
    return dead != 0 && items + dead >= (in_host ? host_max_items_ : max_items_) + crowded_tombstones_[in_host];
  }
  // Whether the device tier's tombstones have taken 16/25 of the slots its live keys leave free (capacity -
  // items). Below max_items too, every walk of an absent key, and every new key's, lengthens as tombstones
  // take the place of EMPTY tickets: in mixed batches in a steady state at load 0.9, GETs of absent keys ran 3x
  // slower just before a clean-up than just after one (H200, run 381). crowded() covers a tier at max_items,
  // and the tombstone step (TableConfig::cleanup_tombstones) a tier at low load; at the loads between, the step
  // came late. Against the rules before, such batches at load 0.9 ran 1.06 / 1.09x on 2^22 / 2^24 slots in
  // batches of 65536 ops and level (1.00x) on 2^27 slots in batches of 4M, and level or faster at 0.85 and 0.93
  // (run 383). The share was swept (run 382): at half the free slots, 3% was lost at 0.93 on 2^27 slots, where
  // a clean-up costs 14 ms. The device tier only: the host tier's clean-up moves its slots across PCIe, and was
  // not measured so.
  bool short_of_empty() const {
    const std::uint64_t free = capacity_ > known_.items ? capacity_ - known_.items : 0;
    return known_.tombstones != 0 && 25 * known_.tombstones >= 16 * free;
  }
  // The slots a tier at max_items keeps EMPTY.
  std::uint64_t headroom(bool in_host) const {
    return in_host ? host_capacity_ - host_max_items_ : capacity_ - max_items_;
  }

  // Whether a tier's clean-up is due after the last finished pass.
  bool cleanup_due(bool in_host) const {
    const TierCleanup& c = cleanup_[in_host];
    if (cleanup_holds_ != 0) return false;  // a scan is reading the slots; the next pass after it ends cleans
    const std::uint64_t dead = in_host ? known_.host_tombstones : known_.tombstones;
    return dead >= c.next || ((crowded(in_host) || (!in_host && short_of_empty())) && dead >= c.crowded_retry);
  }
  bool cleanup_due() const { return cleanup_due(false) || (has_host() && cleanup_due(true)); }

  // Runs the clean-ups that are due; only with no pass queued.
  void maybe_cleanups() {
    maybe_cleanup(false);
    if (has_host()) maybe_cleanup(true);
  }

  void maybe_cleanup(bool in_host) {
    TierCleanup& c = cleanup_[in_host];
    if (!cleanup_due(in_host) || cleanup_tier(in_host)) return;
    stats_.cleanups_skipped += 1;
    // Try again once as many more have piled up (a crowded tier: once its headroom has lost another eighth).
    c.next = tombstones(in_host) + c.step;
    c.crowded_retry = tombstones(in_host) + std::max<std::uint64_t>(1, headroom(in_host) / 8);
  }

  bool cleanup_tier(bool in_host) {
    const Ref t = in_host ? host_ : table_;
    const CleanupWord<Ref> word{t, !in_host};
    const std::uint64_t regions = (t.positions + kCleanupRegionSlots - 1) / kCleanupRegionSlots;
    auto starts = exec_.allocate(regions * sizeof(unsigned long long), false);
    if (starts.empty()) return false;
    auto* region = reinterpret_cast<unsigned long long*>(starts.data());
    exec_.zero(region, regions * sizeof(unsigned long long));
    known_.extracted = 0;
    exec_.write_counters(known_);
    exec_.for_each(t.positions, CleanupCount<Ref>{word, region});
    const std::uint64_t displaced = exec_.read_counters().extracted;
    auto buffer = exec_.allocate(displaced * record_bytes(t), in_host);
    if (displaced != 0 && buffer.empty()) return false;
    exec_.exclusive_sum(region, regions);  // each region's first place in the buffer
    known_.extracted = 0;
    exec_.write_counters(known_);
    exec_.for_each(t.positions, CleanupExtract<Ref>{word, buffer.data(), region});
    exec_.for_each(displaced, CleanupReinsert<Ref>{word, buffer.data(), counters_});
    known_ = exec_.read_counters();
    if (known_.lost != 0 || known_.extracted != displaced) {
      throw Error(Error::Code::kInternal, "tombstone clean-up could not re-place every key");
    }
    tombstones(in_host) = 0;
    known_.extracted = 0;
    exec_.write_counters(known_);
    stats_.cleanups += 1;
    cleanup_[in_host].next = cleanup_[in_host].step;
    cleanup_[in_host].crowded_retry = 0;
    return true;
  }

  Ref table_;
  Ref host_;
  Exec& exec_;
  Counters* counters_;
  LaneMode lanes_;
  std::uint64_t clstash_items_;  // live keys from which kAuto switches to clStash
  std::uint64_t capacity_;       // the device tier's slots that can hold keys
  std::uint64_t host_capacity_;
  std::uint64_t max_items_;
  std::uint64_t host_max_items_;
  HostPhase host_phase_;
  std::uint32_t copy_lanes_;
  OptimisticInserts optimistic_;
  int host_sort_bits_;  // host-queue entries are below 2^host_sort_bits_
  const std::uint64_t crowded_tombstones_[2];  // device, host
  TierCleanup cleanup_[2];  // device, host
  Counters known_{};  // the counters as of the end of the last finished pass
  const std::uint32_t* groups_seen_ = nullptr;  // the grouping table of the last pass
  bool fresh_groups_ = false;                   // it is new: no pass has used it yet
  std::uint64_t dirty_bound_ = 0;               // its entries at or past this one are zero
  bool inserting_ = true;                       // the last finished pass looked like one of inserts
  // Finished passes in a row that inserted a new key for each of their ops (a table's first pass, often a
  // load, counts one before it), and how many a pass needs behind it to run optimistically (runs_optimistic).
  std::uint32_t new_key_passes_ = 1;
  std::uint32_t optimistic_after_ = 1;
  bool lookups_expected_ = true;                 // LanePolicy::lookups
  bool lookups_miss_ = false;                   // LanePolicy::lookups_miss
  bool writes_expected_ = true;                 // the last finished pass wrote (group_bins), or none has run
  bool mixed_expected_ = false;                 // the last finished pass was mixed (LanePolicy::kinds_apart)
  bool mix_from_call_ = false;                  // that pass is of the call under way (LanePolicy::mix_unknown)
  unsigned long long live_before_ = 0;          // items + host_items after the pass before it
  int slot_ = 0;                                // the readback slot of the last pass queued
  int unsnapped_ = -1;  // the slot of a queued pass whose counters no step has been asked to copy yet, or -1
  bool unfinished_ = false;                     // a call is under way, or the last one threw
  PassStats stats_;
  std::uint64_t cleanup_holds_ = 0;
};

}  // namespace gpukv::detail
