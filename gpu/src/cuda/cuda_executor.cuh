// CudaExecutor: the primitives PassRunner asks of a backend (detail/pass_runner.hpp), as CUDA launches,
// CUB sorts and scans and copies on one stream; and the CUDA handles the backend holds. The CPU backend's
// counterpart is cpu/cpu_executor.hpp.
#pragma once

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "cuda_check.hpp"
#include "device_memory.hpp"
#include "group_bins_kernel.cuh"
#include "kernels.cuh"
#include "step_clock.hpp"

namespace gpukv::detail {
namespace gpu {
// Internal linkage: each gpu_backend_key*.cu has its own copy of these kernels and helpers.
namespace {

struct StreamHandle {
  cudaStream_t stream = nullptr;
  StreamHandle() {
    // A blocking stream: work on the legacy default stream (a caller's timing events) orders with it.
    GPUKV_CUDA_CHECK(cudaStreamCreate(&stream));
  }
  ~StreamHandle() { cudaStreamDestroy(stream); }
  StreamHandle(const StreamHandle&) = delete;
  StreamHandle& operator=(const StreamHandle&) = delete;
};

struct EventHandle {
  cudaEvent_t event = nullptr;
  EventHandle() { GPUKV_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming)); }
  ~EventHandle() { cudaEventDestroy(event); }
  EventHandle(const EventHandle&) = delete;
  EventHandle& operator=(const EventHandle&) = delete;
};

// The smallest pass that kAuto splits by kind (LanePolicy::split) after a mixed pass. The split saves the
// pass-end step's random atomics on lines that have left L2, and costs a second kernel's walks end to end after
// the first's. Mixed passes, line, loads 0.5 / 0.9, split against clStash, one binary (H100, runs 365-366):
// 256K ops 0.95 / 0.89x, 320K 0.98 / 0.87x, 384K 0.98 / 0.85x, 448K 1.01 / 0.93x, 512K 1.04 / 1.02x, 1M
// 1.09 / 1.17x, 2M 1.10 / 1.30x. Runs 257-264, before the split kernels' later changes, had put it at 2M.
// 16 B / 128 B values, which CopyValues copies, 0.97 / 0.99x at 4M: such passes are not split.
constexpr std::uint64_t kSplitMinOps = std::uint64_t{1} << 19;
// The smallest pass whose mix is not known (LanePolicy::mix_unknown) for which kAuto launches the split kernels
// too: a pure pass then pays an idle launch (about 2.5 us), which pays back where a mixed pass in clStash costs
// much more than split (passes of 4M ops at 0.9: 0.81 ms against 0.60).
constexpr std::uint64_t kSplitUnknownMixMinOps = (std::uint64_t{1} << 21) + 1;
// Blocks an SM of the lookup kernel for a line's hits below 0.8 load (LanePolicy::low_load), never more than the
// Stash kernel holds (its grid, which the hits run on at higher loads).
constexpr int kLowLoadHitBlocks = 3;

class CudaExecutor {
 public:
  // A line's ordered and host phases walk as Walk::kLineFromL2 (PassRunner::phase_walk).
  static constexpr bool kLineWalks = true;
  // Passes of 1M to 4M ops group their ops in bins (group_in_bins).
  static constexpr bool kGroupsInBins = true;
  CudaExecutor(cudaStream_t stream, int device, int sm_count, Counters* counters)
      : stream_(stream),
        sm_count_(sm_count),
        early_launch_(compute_major(device) >= 9),
        counters_(counters),
        readback_(sizeof(Counters)),
        snapshots_(2 * sizeof(Counters), "counter snapshots", GpuMemory::kMappedHost) {}

  // `max_threads` (0: no limit) caps the grid below what fits on the device.
  template <class F>
  void for_each(std::uint64_t n, const F& f, std::uint32_t max_threads = 0) {
    if (n == 0) return;
    std::uint64_t needed = (n + kBlockThreads - 1) / kBlockThreads;
    if (max_threads != 0) needed = std::min<std::uint64_t>(needed, (max_threads + kBlockThreads - 1) / kBlockThreads);
    const int grid = static_cast<int>(std::min<std::uint64_t>(needed, resident_blocks<for_each_kernel<F>>(sm_count_)));
    clock_.begin(stream_, F::kName);
    launch(for_each_kernel<F>, grid, n, f, counters_);
    clock_.end(stream_);
  }

  // ExecuteOp with one walk per lane (Stash) or with collaborative lanes (clStash), as `policy` decides, in
  // the kernels built for the table's layout (Walk).
  // Each kernel is a step of its own on the step clock (ExecuteOp.<kernel>), idle ones included.
  template <class Ref>
  void execute(std::uint64_t n, const ExecuteOp<Ref>& f, LanePolicy policy) {
    if (n == 0) return;
    if constexpr (Ref::kProbing == Probing::kGroup) {  // the only probing a line has
      if (!f.e.table.slots_own_sectors()) {
        execute_walks<Walk::kLine>(n, f, policy);
        return;
      }
    }
    execute_walks<Walk::kAny>(n, f, policy);
  }

  template <Walk kWalk, class Ref>
  void execute_walks(std::uint64_t n, const ExecuteOp<Ref>& f, LanePolicy policy) {
    const std::uint64_t needed = (n + kBlockThreads - 1) / kBlockThreads;
    if constexpr (kWalk == Walk::kLine) {
      if (f.e.pass.optimistic) {  // its kernel alone (PassRef::optimistic)
        launch_probing<optimistic_kernel<Ref>>("ExecuteOp.optimistic", n, f, policy, needed);
        return;
      }
    }
    // Under kAuto, only a pass of at least kSplitMinOps ops (kSplitUnknownMixMinOps where its mix is unknown)
    // whose values the probing step copies (below, and where CopyValues copies wide values, clStash measured
    // better).
    const std::uint64_t split_min = policy.mix_unknown ? kSplitUnknownMixMinOps : kSplitMinOps;
    policy.kinds_apart = policy.kinds_apart &&
                         (policy.mode == LaneMode::kSplit || (n >= split_min && !f.e.pass.copy_later));
    if constexpr (kWalk == Walk::kLine) {
      // Under kAuto, a line's pass after one of inserts runs in Stash lanes, whatever it turns out to hold: the
      // clStash kernel, which would return at once in a pass of inserts, is not launched. A mixed pass then
      // runs in the Stash kernel once; the pass after it expects its mix. Except where the split kernels are
      // launched for a pass whose mix is unknown (LanePolicy::mix_unknown, a call's first passes): the policy
      // then picks on the device, and a mixed pass runs split.
      if (f.e.pass.inserts_expected && policy.mode == LaneMode::kAuto && !(policy.kinds_apart && policy.mix_unknown)) {
        policy.mode = LaneMode::kStash;
      }
    }
    // The lookup kernel pays for its launch only in a pass with more ops than the Stash kernel holds at once:
    // in a smaller one (the service's batches) more resident blocks change nothing. But in a table whose
    // lookups answer their slot words, where it saves CopyValues' second read of every hit's slot.
    const std::uint64_t stash_grid = static_cast<std::uint64_t>(resident_blocks<stash_kernel<Ref, kWalk>>(sm_count_));
    const bool words = answers_words_in_lookups(f.e.table);
    policy.lookups = policy.lookups && policy.mode != LaneMode::kClStash && (needed > stash_grid || words);
    if (policy.lookups) {
      // A pass without writes (LanePolicy::lookups_miss says with how many blocks). A line's lookups that are
      // expected to hit fetch their first line whole: a hit's slot may lie in its other 64-byte half, which
      // a second DRAM access would bring (line hits at loads 0.8-0.95 1.05-1.06x, H100 run 192); a miss
      // needs the ticket word only, and lost up to 20% to the fetch (run 149). The lookups expected to hit walk
      // through L1 (Walk::kLineReadOnly). Misses keep kLine: through L1 they ran level at 8 B / 8 B and
      // 0.98-0.99x at 16 B / 8 B (H200, run 392).
      const auto lookups = [&]<bool kWords>() {
        if (policy.lookups_miss) {
          launch_probing<lookup_kernel<Ref, kWalk, false, kWords>>("ExecuteOp.lookup", n, f, policy, needed);
        } else if constexpr (kWalk == Walk::kLine) {
          const std::uint64_t grid =
              policy.low_load ? std::min<std::uint64_t>(stash_grid, std::uint64_t{kLowLoadHitBlocks} * sm_count_) : stash_grid;
          launch_probing<lookup_kernel<Ref, Walk::kLineReadOnly, true, kWords>>("ExecuteOp.lookup", n, f, policy, grid);
        } else {
          launch_probing<lookup_kernel<Ref, kWalk, false, kWords>>("ExecuteOp.lookup", n, f, policy, stash_grid);
        }
      };
      if (words) {
        lookups.template operator()<true>();
      } else {
        lookups.template operator()<false>();
      }
    }
    // A pass that runs split whatever its mix (LanePolicy::splits_any_mix) launches neither lane schedule: each
    // launch, though its kernel returns at once, cost 5 us a pass on the step clock (H100, run 297); mixed
    // batches 1.008-1.009x without them (run 306).
    const bool split_only = policy.splits_any_mix();
    if (policy.mode != LaneMode::kClStash && !split_only) {
      launch_probing<stash_kernel<Ref, kWalk>>("ExecuteOp.stash", n, f, policy, needed);
    }
    if (policy.may_collaborate() && !split_only) {
      launch_probing<clstash_kernel<Ref, kWalk>>("ExecuteOp.clstash", n, f, policy, needed);
    }
    // A mixed pass split by kind (LanePolicy::kinds_apart: launched for a pass that may turn out mixed, which runs
    // in them if it does, or whatever its mix under LanePolicy::splits_any_mix). A line's PUTs compare from L2,
    // and so publish their new keys in the pass: with compares through L1, FinishPass publishing them took 0.74
    // ms per 17 mixed passes of a line at load 0.5, of the 0.94 it took for clStash's deletes and new keys, and
    // mixed passes gained 1.4-3.4% where they gain 2.4-6.8% (H100, run 258).
    if (policy.kinds_apart) {
      // In a line, the GETs and deletes fetch each line whole and walk through L1 (Walk::kLineFetched), and the
      // PUTs of one-word keys do not fetch it (kLineFromL2NoFetch): Walk says why, and what each measured.
      constexpr Walk kOthersWalk = kWalk == Walk::kLine ? Walk::kLineFetched : kWalk;
      launch_probing<split_kernel<Ref, kOthersWalk, false>>("ExecuteOp.split_others", n, f, policy, needed);
      constexpr Walk kPutsWalk = kWalk != Walk::kLine ? kWalk : Ref::key_words == 1 ? Walk::kLineFromL2NoFetch : Walk::kLineFromL2;
      launch_probing<split_kernel<Ref, kPutsWalk, true>>("ExecuteOp.split_puts", n, f, policy, needed);
    }
    if constexpr (kWalk == Walk::kLine) {
      // A line's passes of inserts (Engine::compares_in_l2), if the pass before was one too.
      if (f.e.pass.inserts_expected) launch_probing<stash_kernel<Ref, Walk::kLineFromL2>>("ExecuteOp.inserts", n, f, policy, needed);
    }
  }

  // One probing kernel over a grid of resident blocks, timed as step `name`.
  template <auto Kernel, class Ref>
  void launch_probing(const char* name, std::uint64_t n, const ExecuteOp<Ref>& f, const LanePolicy& policy,
                      std::uint64_t needed) {
    const int grid = static_cast<int>(std::min<std::uint64_t>(needed, resident_blocks<Kernel>(sm_count_)));
    clock_.begin(stream_, name);
    launch(Kernel, grid, n, f, policy, counters_);
    clock_.end(stream_);
  }

  void zero(void* p, std::uint64_t bytes) {
    clock_.begin(stream_, "zero");
    GPUKV_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
    clock_.end(stream_);
  }

  // Radix sort of the low `top` bits only: the callers' keys have nothing above them.
  void sort(std::uint64_t* keys, std::uint64_t n, int top) {
    if (n > sort_capacity_) {
      std::size_t bytes = 0;
      cub::DoubleBuffer<std::uint64_t> none(nullptr, nullptr);
      // Sized for all 64 bits, so that any caller's bit range fits the same scratch.
      GPUKV_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(nullptr, bytes, none, static_cast<int>(n), 0, 64));
      GPUKV_CUDA_CHECK(cudaStreamSynchronize(stream_));
      sort_temp_ = GpuBuffer(bytes, "sort scratch");
      sort_alt_ = GpuBuffer(n * sizeof(std::uint64_t), "sort scratch");
      sort_capacity_ = n;
    }
    clock_.begin(stream_, "sort");
    cub::DoubleBuffer<std::uint64_t> buffers(keys, sort_alt_.as<std::uint64_t>());
    std::size_t bytes = sort_temp_.bytes();
    GPUKV_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(sort_temp_.data(), bytes, buffers, static_cast<int>(n), 0,
                                                    static_cast<int>(top), stream_));
    if (buffers.Current() != keys) {
      GPUKV_CUDA_CHECK(cudaMemcpyAsync(keys, buffers.Current(), n * sizeof(std::uint64_t), cudaMemcpyDeviceToDevice, stream_));
    }
    clock_.end(stream_);
  }

  // Grouping in bins (detail/batch_groups.hpp, group_bins_kernel.cuh): every op's bin key appended to its
  // bin's run, a block per bin that groups the run in shared memory, and the ops of any bin whose run
  // overflowed grouped apart. The runs (50 MB) are reserved beforehand (reserve_bins). The first kernel does
  // StartPass's work too: PassRunner launches no StartPass for a pass grouped in bins.
  template <class Ref>
  void group_in_bins(const Engine<Ref>& e, std::uint64_t n, int bin_bits) {
    reserve_bins<Ref>();
    const BinRuns runs{bin_runs_.as<std::uint64_t>(), bin_lengths_.as<std::uint32_t>(), bin_bits};
    const std::uint64_t tiles = (n + kScatterTile - 1) / kScatterTile;
    const auto scatter = [&]<bool kStaged, int kShared>() {
      constexpr auto kKernel = bin_scatter_kernel<Ref, kStaged>;
      const int grid = static_cast<int>(std::min<std::uint64_t>(tiles, resident_blocks<kKernel, kScatterThreads, kShared>(sm_count_)));
      launch_blocks(kKernel, grid, kScatterThreads, kShared, n, e, runs, counters_);
    };
    clock_.begin(stream_, "BinScatter");
    // One-word keys whose columns start 16-byte aligned have them staged in shared memory (StagedColumns).
    if constexpr (Ref::key_words == 1) {
      if (stageable(e.batch)) {
        scatter.template operator()<true, kStagedBytes>();
      } else {
        scatter.template operator()<false, 0>();
      }
    } else {
      scatter.template operator()<false, 0>();
    }
    clock_.end(stream_);
    clock_.begin(stream_, "GroupBins");
    launch_blocks(group_bins_kernel<Ref>, 1 << bin_bits, kBinThreads, kBinTableBytes, e, runs, counters_);
    clock_.end(stream_);
    for_each(n, GroupOverflowOp<Ref>{e, runs});
  }

  // The runs of grouping in bins (50 MB) and the kernels' shared memory, for a table whose passes may be
  // grouped in bins: GpuBackend reserves them with the scratch of a pass that large, rather than at the first
  // pass grouped in bins, which may come calls later (after a fill of optimistic passes) and would pay for it.
  template <class Ref>
  void reserve_bins() {
    if (!bin_runs_.empty()) return;
    GPUKV_CUDA_CHECK(cudaStreamSynchronize(stream_));  // no kernel still reading what the allocation may move
    bin_runs_ = GpuBuffer((std::uint64_t{1} << kMaxBinBits) * kBinRunCapacity * sizeof(std::uint64_t), "grouping bins");
    bin_lengths_ = GpuBuffer((std::uint64_t{1} << kMaxBinBits) * kRunLengthStride * sizeof(std::uint32_t), "grouping bins");
    GPUKV_CUDA_CHECK(cudaMemset(bin_lengths_.data(), 0, bin_lengths_.bytes()));
    // The attributes belong to the device the executor runs on.
    GPUKV_CUDA_CHECK(cudaFuncSetAttribute(group_bins_kernel<Ref>, cudaFuncAttributeMaxDynamicSharedMemorySize, kBinTableBytes));
    if constexpr (Ref::key_words == 1) {
      GPUKV_CUDA_CHECK(
          cudaFuncSetAttribute(bin_scatter_kernel<Ref, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kStagedBytes));
    }
  }

  // In place (CUB's scan allows the output to be the input). Only clean-ups use it, so its scratch is
  // allocated each time.
  void exclusive_sum(unsigned long long* values, std::uint64_t n) {
    std::size_t bytes = 0;
    GPUKV_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, bytes, values, values, n, stream_));
    GPUKV_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const GpuBuffer temp(std::max<std::size_t>(bytes, 1), "scan scratch");
    clock_.begin(stream_, "scan");
    GPUKV_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp.data(), bytes, values, values, n, stream_));
    clock_.end(stream_);
    GPUKV_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  Counters read_counters() {
    Counters* to = readback_.as<Counters>();
    GPUKV_CUDA_CHECK(cudaMemcpyAsync(to, counters_, sizeof(Counters), cudaMemcpyDeviceToHost, stream_));
    GPUKV_CUDA_CHECK(cudaStreamSynchronize(stream_));
    clock_.collect();
    return *to;
  }

  // A kernel rather than a copy, so that the kernels on either side of it still launch early.
  void snapshot_counters(int slot) {
    launch(copy_counters_kernel, 1, static_cast<const Counters*>(counters_), snapshot_slot(slot));
    snapshot_taken(slot);
  }
  Counters* snapshot_slot(int slot) { return snapshots_.as<Counters>() + slot; }
  void snapshot_taken(int slot) { GPUKV_CUDA_CHECK(cudaEventRecord(snapshot_done_[slot].event, stream_)); }
  Counters wait_snapshot(int slot) {
    GPUKV_CUDA_CHECK(cudaEventSynchronize(snapshot_done_[slot].event));
    return snapshots_.as<Counters>()[slot];
  }

  void write_counters(const Counters& c) {
    launch(set_counters_kernel, 1, counters_, c);
  }

  void report(std::uint64_t ops) { clock_.report(ops); }

  // The host tier's clean-up scratch is pinned host memory too: it can be as large as the tier.
  GpuBuffer allocate(std::uint64_t bytes, bool host_tier) {
    GPUKV_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return GpuBuffer::try_allocate(bytes, host_tier ? GpuMemory::kMappedHost : GpuMemory::kDevice);
  }

 private:
  static int compute_major(int device) {
    int major = 0;
    GPUKV_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    return major;
  }

  static constexpr int kBinTableBytes = kBinSlots * sizeof(std::uint32_t);  // group_bins_kernel's table

  // Launches a kernel of kBlockThreads-thread blocks on the stream. From compute capability 9.0 its blocks
  // may start while the kernel before it drains: each waits for it first (wait_for_earlier_kernels).
  template <class... Params, class... Args>
  void launch(void (*kernel)(Params...), int grid, Args&&... args) {
    launch_blocks(kernel, grid, kBlockThreads, 0, std::forward<Args>(args)...);
  }
  // The same with blocks of `threads` threads and `shared` bytes of dynamic shared memory.
  template <class... Params, class... Args>
  void launch_blocks(void (*kernel)(Params...), int grid, int threads, int shared, Args&&... args) {
    cudaLaunchAttribute early{};
    early.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    early.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(grid));
    config.blockDim = dim3(static_cast<unsigned>(threads));
    config.dynamicSmemBytes = static_cast<std::size_t>(shared);
    config.stream = stream_;
    config.attrs = &early;
    config.numAttrs = early_launch_ ? 1 : 0;
    GPUKV_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
  }

  cudaStream_t stream_;
  int sm_count_;
  bool early_launch_;
  Counters* counters_;
  PinnedBuffer readback_;
  GpuBuffer snapshots_;  // mapped host memory: written by copy_counters_kernel
  EventHandle snapshot_done_[2];
  std::uint64_t sort_capacity_ = 0;  // keys the sort scratch holds
  GpuBuffer sort_temp_;
  GpuBuffer sort_alt_;
  GpuBuffer bin_runs_;  // group_in_bins: BinRuns::keys
  GpuBuffer bin_lengths_;  // BinRuns::lengths
  StepClock clock_;
};

}  // namespace
}  // namespace gpu
}  // namespace gpukv::detail
