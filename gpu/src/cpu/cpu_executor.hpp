// CpuExecutor: the primitives PassRunner asks of a backend (detail/pass_runner.hpp), run by a pool of host
// threads. The GPU backend's counterpart is cuda/cuda_executor.cuh.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "../detail/pass_runner.hpp"
#include "host_buffer.hpp"
#include "thread_pool.hpp"

namespace gpukv::detail {
namespace cpu {

class CpuExecutor {
 public:
  // Host threads walk a line as they walk a board (Walk::kAny: PassRunner::phase_walk).
  static constexpr bool kLineWalks = false;
  static constexpr bool kGroupsInBins = false;  // GroupOp groups every pass: host threads share one cache
  // Ops per chunk handed to a thread by the steps that probe the table: large enough to amortise the
  // hand-off, small enough to balance.
  static constexpr std::uint64_t kGrain = 2048;
  // The other steps of a pass (clearing the grouping table, which has at least twice as many entries as the
  // pass has ops; validating and grouping ops; settling tickets) cost a few nanoseconds an item: a pass of a
  // few thousand ops runs them on the calling thread rather than wake a worker for them. (Clean-up steps
  // run over whole tiers, millions of items, and split either way.)
  static constexpr std::uint64_t kLightGrain = 8192;

  CpuExecutor(ThreadPool& pool, Counters* counters) : pool_(pool), counters_(counters) {}

  // How many ops ahead a thread prefetches: stage 0 (board word) at 2x, stage 1 (slots) at 1x. Enough to
  // cover a cache miss to DRAM with the work of the ops in between.
  static constexpr std::uint64_t kPrefetchDistance = 8;

  // `gpu_threads` narrows a GPU launch; host threads have no such window to narrow. A step that plans its
  // ops (the probing step: F::Planned, plan(i), prefetch(i, planned, stage)) gets each op's prefetches run
  // ahead of it, from a plan worked out once per op and kept in a ring until the op runs.
  template <class F>
  void for_each(std::uint64_t n, const F& step, std::uint32_t /*gpu_threads*/ = 0) {
    if constexpr (requires { step.idle(); }) {
      if (step.idle()) return;  // the step before has joined, so the answer is final
    }
    constexpr std::uint64_t grain = (requires { F::kProbes; } ? kGrain : kLightGrain) / ops_per_item<F>();
    pool_.parallel_for(n, grain, [&](std::uint64_t begin, std::uint64_t end) {
      Tally tally;
      const auto& f = bound(step);
      if constexpr (requires { typename F::Planned; }) {
        constexpr std::uint64_t d = kPrefetchDistance;
        constexpr std::uint64_t ring = 4 * d;  // holds an op from its stage 0 (2d ahead) until it runs
        typename F::Planned planned[ring];
        const auto stage0 = [&](std::uint64_t i) {
          planned[i % ring] = f.plan(i);
          f.prefetch(i, planned[i % ring], 0);
        };
        for (std::uint64_t i = begin; i < std::min(begin + 2 * d, end); ++i) stage0(i);
        for (std::uint64_t i = begin; i < std::min(begin + d, end); ++i) f.prefetch(i, planned[i % ring], 1);
        for (std::uint64_t i = begin; i < end; ++i) {
          if (i + 2 * d < end) stage0(i + 2 * d);
          if (i + d < end) f.prefetch(i + d, planned[(i + d) % ring], 1);
          f(i, planned[i % ring], tally);
        }
      } else {
        for (std::uint64_t i = begin; i < end; ++i) f(i, tally);
      }
      add(tally);
    });
  }
  // Collaborative lanes are a SIMT schedule; host threads have no lanes to idle, so both modes are one loop.
  template <class F>
  void execute(std::uint64_t n, const F& f, const LanePolicy&) {
    for_each(n, f);
  }
  void zero(void* p, std::uint64_t bytes) { std::memset(p, 0, bytes); }
  void sort(std::uint64_t* keys, std::uint64_t n, int /*bits*/) { std::sort(keys, keys + n); }
  void exclusive_sum(unsigned long long* values, std::uint64_t n) { std::exclusive_scan(values, values + n, values, 0ULL); }
  Counters read_counters() const { return *counters_; }
  void write_counters(const Counters& c) { *counters_ = c; }
  // Every step has finished when its call returns: a snapshot is a copy.
  void snapshot_counters(int slot) { snapshots_[slot] = *counters_; }
  Counters* snapshot_slot(int slot) { return &snapshots_[slot]; }
  void snapshot_taken(int) {}
  Counters wait_snapshot(int slot) const { return snapshots_[slot]; }
  // Both tiers are host memory here.
  HostBuffer allocate(std::uint64_t bytes, bool /*host_tier*/) { return HostBuffer(bytes, /*nothrow=*/true); }

 private:
  // A step whose item covers several ops (StartPass::kChunk) gets as many ops to a chunk as any other.
  template <class F>
  static constexpr std::uint64_t ops_per_item() {
    if constexpr (requires { F::kChunk; }) {
      return F::kChunk;
    } else {
      return 1;
    }
  }

  // The step with the pass's flags from the counters, if it reads them (PassRef::bound): once per chunk.
  template <class F>
  static auto bound(const F& step) {
    if constexpr (requires { step.bound(); }) {
      return step.bound();
    } else {
      return step;
    }
  }

  void add(const Tally& t) {
    add_tally(t, counters_, [](long long delta, unsigned long long* counter) {
      // Two's-complement wrap makes adding a negative delta to an unsigned counter exact.
      if (delta != 0) {
        atomic_ref<unsigned long long>(*counter).fetch_add(static_cast<unsigned long long>(delta), memory_order_relaxed);
      }
    });
  }

  ThreadPool& pool_;
  Counters* counters_;
  Counters snapshots_[2] = {};
};

}  // namespace cpu
}  // namespace gpukv::detail
