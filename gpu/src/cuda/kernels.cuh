// The GPU's kernels: every pass step is a grid-stride kernel around one of the per-operation function objects
// the CPU backend runs too (detail/pass_ops.hpp, detail/cleanup.hpp), and the probing step has two lane
// schedules (Stash here, clStash in clstash_kernel.cuh). Launched by CudaExecutor (cuda_executor.cuh).
#pragma once

#include <algorithm>
#include <cstdint>

#include "../detail/pass_runner.hpp"
#include "clstash_kernel.cuh"
#include "cuda_check.hpp"

namespace gpukv::detail {
namespace gpu {
// Internal linkage: each gpu_backend_key*.cu has its own copy of these kernels and helpers.
namespace {

constexpr int kBlockThreads = 256;

// Blocks per SM the compiler must fit (it caps registers accordingly). The probing kernels are bound by
// memory latency, so residency matters more than a few spilled registers; tuned on an H200 (RESULTS.md).
#ifndef GPUKV_PROBE_MIN_BLOCKS
#define GPUKV_PROBE_MIN_BLOCKS 4
#endif
// The lookup kernel (a pass without writes) holds a lookup's walk and answer only: 40 registers, so 6 blocks
// fit an SM where the Stash kernel's 64 allow 4. The host runs all of them for passes of mostly misses
// (LanePolicy::lookups_miss).
#ifndef GPUKV_LOOKUP_MIN_BLOCKS
#define GPUKV_LOOKUP_MIN_BLOCKS 6
#endif
// clStash keeps a shelf of walks in registers and shared memory; it spills at 64 registers (4 blocks). With 3
// blocks (85 registers) mixed batches ran 11-12% faster on an H100 than with 4 (bench/RESULTS.md, run 5).
#ifndef GPUKV_CLSTASH_MIN_BLOCKS
#define GPUKV_CLSTASH_MIN_BLOCKS 3
#endif
template <class F>
constexpr int min_blocks() {
  if constexpr (requires { F::kProbes; }) {
    return GPUKV_PROBE_MIN_BLOCKS;
  } else if constexpr (requires { F::kMinBlocks; }) {
    return F::kMinBlocks;
  } else {
    return 1;
  }
}

// Waits until the kernels before this one in the stream have finished and their writes are visible.
// CudaExecutor launches every kernel with programmatic stream serialization, so that its blocks take the
// SMs as the kernel before drains, rather than after a launch gap once it has ended (about 3 us at each of
// a pass's steps: bench/RESULTS.md, "the fixed cost of a pass"). Every kernel calls this before it reads
// or writes anything.
__device__ __forceinline__ void wait_for_earlier_kernels() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Adds each warp's tallies to the counters with one atomic per counter per warp. A kernel changes few of a
// tally's fields: a vote skips the sum of a field that is zero in every lane, whose five 64-bit shuffles
// each kernel's last warps otherwise wait on, field after field.
__device__ __forceinline__ void flush_delta(long long delta, unsigned long long* counter) {
  if (!__any_sync(0xFFFFFFFFu, delta != 0)) return;
  for (int offset = 16; offset > 0; offset /= 2) delta += __shfl_xor_sync(0xFFFFFFFFu, delta, offset);
  // Two's-complement wrap makes adding a negative delta to an unsigned counter exact.
  if ((threadIdx.x & 31) == 0 && delta != 0) atomicAdd(counter, static_cast<unsigned long long>(delta));
}

__device__ __forceinline__ void flush_tally(const Tally& tally, Counters* counters) {
  add_tally(tally, counters, [](long long delta, unsigned long long* counter) { flush_delta(delta, counter); });
}

// Runs f(i, tally) for i in [0, n) over the whole grid.
template <class F>
__device__ __forceinline__ void grid_stride(std::uint64_t n, const F& f, Tally& tally) {
  const std::uint64_t stride = std::uint64_t{gridDim.x} * blockDim.x;
  for (std::uint64_t i = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) f(i, tally);
}

// Runs f(i, tally) for the i in [0, n) that want(i) picks, over the whole grid, 32 at a time in each warp:
// a warp looks at 32 ops a turn and queues those it picks in shared memory until it holds a warp's worth,
// so that no lane idles beside another's walk (a mixed pass split by kind, LanePolicy::split).
template <class Want, class F>
__device__ __forceinline__ void grid_stride_packed(std::uint64_t n, const Want& want, const F& f, Tally& tally) {
  constexpr int kWarps = kBlockThreads / 32;
  __shared__ std::uint32_t queues[kWarps][64];  // a pass's ops fit 32 bits (kMaxPassOps)
  std::uint32_t* const queue = queues[threadIdx.x / 32];
  const unsigned lane = threadIdx.x % 32;
  const unsigned below = (1u << lane) - 1;
  unsigned queued = 0;  // the same in every lane; below 32 between turns
  const std::uint64_t stride = std::uint64_t{gridDim.x} * kBlockThreads;
  const std::uint64_t first = std::uint64_t{blockIdx.x} * kBlockThreads + threadIdx.x / 32 * 32;  // the warp's
  for (std::uint64_t base = first; base < n; base += stride) {
    const std::uint64_t op = base + lane;
    const bool picked = op < n && want(op);
    const unsigned pick = __ballot_sync(0xFFFFFFFFu, picked);
    if (picked) queue[queued + __popc(pick & below)] = static_cast<std::uint32_t>(op);
    queued += __popc(pick);
    __syncwarp();
    if (queued >= 32) {
      queued -= 32;
      const std::uint32_t mine = queue[queued + lane];
      __syncwarp();  // read before the next turn writes there
      f(mine, tally);
    }
  }
  __syncwarp();
  if (lane < queued) f(queue[lane], tally);
}

template <class F>
__global__ void __launch_bounds__(kBlockThreads, min_blocks<F>()) for_each_kernel(std::uint64_t n, F f, Counters* counters) {
  wait_for_earlier_kernels();
  if constexpr (requires { f.idle(); }) {
    if (f.idle()) return;  // the same answer in every thread, and nothing to tally
  }
  Tally tally;
  grid_stride(n, f, tally);
  flush_tally(tally, counters);
}

// The two lane schedules of the probing step, launched back to back: each reads the counters StartPass left
// (the same values in every thread) and returns at once unless the hybrid picked it (or the pass is
// halted). Two kernels rather than one with a branch, so that clStash's register pressure does not spill
// into the Stash loop. Under Stash lanes, a pass without writes runs in a kernel of its own (lookup_kernel)
// where the host launched it (LanePolicy::lookups).
//
// Each kernel is built for one kind of walk (Walk), which the host picks by the table's layout: kAny for a
// board, kLine for a line. A line's passes of inserts compare keys from L2 (Engine::compares_in_l2): a third
// kernel (kLineFromL2), launched only for a line's pass that follows one of inserts
// (PassRef::inserts_expected), runs them, with Stash lanes whatever the policy (which picks Stash for such
// passes under group probing, the only probing a line has). A kernel apart, not a branch in one kernel: with
// both walk loops in one kernel, board inserts, which never read from L2, ran 5% slower (bench/RESULTS.md,
// "a line's new keys published in the pass").
// A line's insert kernel (Walk::kLineFromL2) fits 3 blocks an SM, at 71 registers: inserts 1.016-1.029x at
// loads 0.5-0.95 against 4 blocks at 64 registers, where it was tuned with the other walks (H100, run 284;
// why is not pinned down: its SASS went from 3536 instructions to 3504 only, and no spills either way). At
// 5 blocks (48 registers) it spilled and ran 0.78x.
#ifndef GPUKV_INSERT_MIN_BLOCKS
#define GPUKV_INSERT_MIN_BLOCKS 3
#endif
template <class Ref, Walk kWalk>
__global__ void __launch_bounds__(kBlockThreads, kWalk == Walk::kLineFromL2 ? GPUKV_INSERT_MIN_BLOCKS : GPUKV_PROBE_MIN_BLOCKS)
    stash_kernel(std::uint64_t n, ExecuteOp<Ref> f, LanePolicy policy, Counters* counters) {
  wait_for_earlier_kernels();
  constexpr bool kFromL2 = kWalk == Walk::kLineFromL2;
  if (f.idle() || f.compares_in_l2() != kFromL2 ||
      (!kFromL2 && (policy.collaborative(*counters) || policy.split(*counters) ||
                    (policy.lookups && read_only(f.e.pass))))) {
    return;
  }
  Tally tally;
  grid_stride(n, [&f](std::uint64_t op, Tally& t) { f.template run<kWalk>(op, t); }, tally);
  flush_tally(tally, counters);
}

// Writes zeros over op's answer length, and over its answer value where that is one word, ahead of the op's
// own answer (a GET's, written later by the same warp, after a __syncwarp) or in place of it (the answers of
// other ops are unspecified: BatchOut). The GETs' and deletes' kernel of a pass with GETs writes them for
// every op of a turn, 32 in a row, so that each 32-byte sector of those columns is first written whole: a
// sector first written in part is read from DRAM to fill it. H100, run 357, a pass of 4M scrambled ops at
// load 0.5: the kernel read 357 MB where it read 395 and wrote 83 where it wrote 71, 198 us where it took
// 214; mixed batches 1.030 / 1.015 / 1.007 / 1.000x at loads 0.5 / 0.8 / 0.9 / 0.95 (run 358). A value of two
// words is left alone: a GET's answer leaves its stride past its 8-byte boundary untouched (BatchOut).
__device__ __forceinline__ void clear_answer(const BatchRef& b, std::uint64_t op) {
  if (b.out_values != nullptr && b.value_stride == 8) *b.out_value_words(op) = 0;
  if (b.out_value_lens != nullptr) b.out_value_lens[op] = 0;
}

// A mixed pass split by kind (LanePolicy::split), in two kernels launched one after the other: the ops other
// than PUTs (kPuts false), whose deletes settle at once (no PUT runs beside them: Settle::kAlways, which the
// PUT kernel, running no delete, takes too), then the PUTs, which in a line compare from L2 and so publish
// their new keys in the pass (Walk::kLineFromL2NoFetch for one-word keys, kLineFromL2 for two-word ones; a new
// key of one word that takes an EMPTY ticket claims it FULL at once, Engine::full_claim_code). Claims made
// FULL at once in a kLineFromL2 kernel took registers from the packed loop and cost mixed passes 0.6-0.9%
// (H100, run 270); in the kLineFromL2NoFetch kernel they are part of the form measured in runs 315-317, at 64
// registers with no spill. Kernels of their own rather than a branch in the Stash kernels: with the packed loop
// beside the plain one, the kLineFromL2 kernel (a line's inserts) spilled 24 bytes a thread.
template <class Ref, Walk kWalk, bool kPuts>
__global__ void __launch_bounds__(kBlockThreads, GPUKV_PROBE_MIN_BLOCKS)
    split_kernel(std::uint64_t n, ExecuteOp<Ref> f, LanePolicy policy, Counters* counters) {
  wait_for_earlier_kernels();
  if (f.idle() || !policy.split(*counters)) return;
  Tally tally;
  // Only where the pass holds GETs: a pass of deletes that runs split (after a mixed one) answers no value.
  const bool clears = !kPuts && f.e.pass.counters->writes < n;
  grid_stride_packed(
      n,
      [&f, clears](std::uint64_t op) {
        if (clears) clear_answer(f.e.batch, op);
        return carries_value(f.e.batch.ops[op]) == kPuts;
      },
      [&f](std::uint64_t op, Tally& t) { f.template run<kWalk, Settle::kAlways>(op, t); }, tally);
  flush_tally(tally, counters);
}

// An optimistic pass (PassRef::optimistic): its PUTs, with no grouping before them, one per thread
// (ExecuteOp::try_optimistic). Built as a line's insert kernel is, at 3 blocks an SM. A try that must be
// made again (it met a claim another op has not finished) is made in the warp's next round, after a
// __syncwarp: the op it waits for may be another lane of the warp, and a lane looping on its own could hold
// that lane at the loop's reconvergence before its store. Every lane runs the warp's rounds, its ops taken
// a warp at a time, so that no lane leaves the loop before the others.
template <class Ref>
__global__ void __launch_bounds__(kBlockThreads, GPUKV_INSERT_MIN_BLOCKS)
    optimistic_kernel(std::uint64_t n, ExecuteOp<Ref> f, LanePolicy, Counters* counters) {
  wait_for_earlier_kernels();
  if (!f.optimistic_ready()) {
    if (f.lookups_ready()) {
      // A pass of GETs only: its lookups run here, where failing the pass would halt the pass queued after it
      // and run this one again (hits after inserts 0.98x at 16 B / 8 B, runs 308-309).
      Tally tally;
      grid_stride(n, [&f](std::uint64_t op, Tally& t) { f.template run_lookup<Walk::kLineReadOnly>(op, t); }, tally);
      flush_tally(tally, counters);
      return;
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) f.fail_optimistic();
    return;
  }
  Tally tally;
  const std::uint64_t stride = std::uint64_t{gridDim.x} * kBlockThreads;
  for (std::uint64_t op = std::uint64_t{blockIdx.x} * kBlockThreads + threadIdx.x; op - threadIdx.x % 32 < n; op += stride) {
    bool pending = op < n;
    while (__any_sync(0xFFFFFFFFu, pending)) {
      if (pending) pending = !f.try_optimistic(op, tally);
      __syncwarp();
    }
  }
  flush_tally(tally, counters);
}

// A pass without writes under Stash lanes: one lookup per thread, in a kernel of its own whose registers are
// a lookup's only, so that more of its warps can be resident (H100, run 141: passes of misses 1.02-1.11x
// with 6 blocks per SM against the Stash kernel's 4, passes of hits level with 4). kFetchLine: each lookup's
// first line fetched whole (ExecuteOp::run_lookup), for a line's passes expected to hit (LanePolicy::
// lookups_miss false). kWords: for a table with slot words whose values its ops copy themselves
// (answers_words_in_lookups): a hit answers its value and word from the slot its walk read. The other
// kernels leave both to CopyValues, which reads the slot a second time, at random: so that they hold no
// code for words (Engine::store_slot_word says what that code cost), and so that this lookup kernel, which
// tables without words launch, holds none either. In a line, the lookups expected to hit walk through L1
// (Walk::kLineReadOnly): nothing writes the table while the kernel runs.
template <class Ref, Walk kWalk, bool kFetchLine = false, bool kWords = false>
__global__ void __launch_bounds__(kBlockThreads, GPUKV_LOOKUP_MIN_BLOCKS)
    lookup_kernel(std::uint64_t n, ExecuteOp<Ref> f, LanePolicy policy, Counters* counters) {
  wait_for_earlier_kernels();
  if (f.idle() || !read_only(f.e.pass) || policy.collaborative(*counters)) return;
  Tally tally;
  grid_stride(n, [&f](std::uint64_t op, Tally& t) { f.template run_lookup<kWalk, kFetchLine, kWords>(op, t); }, tally);
  flush_tally(tally, counters);
}

// Values of this many bytes or fewer are copied by the op that reads or writes them, which has them in hand;
// wider ones by several threads of CopyValues together (GpuBackend's copy_lanes).
constexpr std::uint32_t kValueBytesCopiedByOp = 16;

// Whether a pass without writes answers its hits' slot words in the lookup kernel (lookup_kernel's kWords): a
// table with words whose values are narrow enough for the op to copy (CopyValues copies wider ones better,
// and their words with them).
template <class Ref>
bool answers_words_in_lookups(const Ref& table) {
  return table.slot_word_offset != 0 && table.value_stride <= kValueBytesCopiedByOp;
}

template <class Ref, Walk kWalk>
__global__ void __launch_bounds__(kBlockThreads, GPUKV_CLSTASH_MIN_BLOCKS)
    clstash_kernel(std::uint64_t n, ExecuteOp<Ref> f, LanePolicy policy, Counters* counters) {
  wait_for_earlier_kernels();
  if (f.idle() || f.compares_in_l2() || !policy.collaborative(*counters)) return;
  Tally tally;
  clstash_execute<kBlockThreads, kWalk>(n, f, tally);
  flush_tally(tally, counters);
}

__global__ void set_counters_kernel(Counters* counters, Counters value) {
  wait_for_earlier_kernels();
  *counters = value;
}

// A copy of the counters into host memory the kernel can reach (mapped), for the host to read once an
// event after it has completed.
__global__ void copy_counters_kernel(const Counters* counters, Counters* to) {
  wait_for_earlier_kernels();
  *to = *counters;
}

// Blocks of a kernel that fit on the device at once: the grid of a grid-stride launch. Computed once per
// kernel (the kernel is the template argument, so kernels of one signature get separate answers), for
// blocks of `kThreads` threads with `kShared` bytes of dynamic shared memory (which the kernel's attribute
// must allow first).
template <auto Kernel, int kThreads = kBlockThreads, int kShared = 0>
int resident_blocks(int sm_count) {
  static const int per_sm = [] {
    int blocks = 0;
    GPUKV_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, Kernel, kThreads, kShared));
    return std::max(1, blocks);
  }();
  return per_sm * sm_count;
}

}  // namespace
}  // namespace gpu
}  // namespace gpukv::detail
