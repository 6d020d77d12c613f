// Grouping in bins: the grouping step of a large pass with writes, done bin by bin in shared memory
// (detail/batch_groups.hpp says why, and what a bin key holds). Three steps, launched by
// CudaExecutor::group_in_bins:
//
//   bin_scatter_kernel  every op: validate it, hash its key, and append its bin key to its bin's run (a
//                       block counts a tile's ops per bin in shared memory, then reserves each bin's share of
//                       the run with one atomic); and, where PassRunner asks (`starts_pass`), StartPass's
//                       work, for which the pass then launches no kernel: clear the grouping entries the last
//                       pass marked, count the pass's valid writes
//   group_bins_kernel   every bin, a block each: enter the run's keys in a table of shared memory; an op
//                       whose key an earlier entry holds joins it, and both ops' groups become that entry
//   GroupOverflowOp     every op, if a run overflowed: an op of such a bin enters the grouping table as
//                       GroupOp's do (entry by entry, over the bins' marks), so its bin costs no more than
//                       before; the ops of other bins return at once
//
// The only global accesses are streams (the batch's columns, the runs) and, for the rare op whose key another
// op of the pass carries, a few stores.
#pragma once

#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "kernels.cuh"

namespace gpukv::detail {
namespace gpu {
// Internal linkage: each gpu_backend_key*.cu has its own copy of these kernels and helpers.
namespace {

constexpr std::uint32_t kBinSlots = std::uint32_t{1} << kBinSlotBits;
// A bin's run holds up to 3/4 of its table's entries: its keys then keep probe chains short, and every probe
// ends at an empty entry. A fuller bin (1.5x the mean of 16K keys of a 4M-op pass, which only skewed keys
// bring) has its ops grouped apart (GroupOverflowOp). 50 MB for 256 runs.
constexpr std::uint32_t kBinRunCapacity = kBinSlots / 4 * 3;
// bin_scatter_kernel's tile: 16 ops per bin of 256 on average, so that a bin's share of a tile costs one
// global atomic per 16 ops and goes out as 128 contiguous bytes; 8 ops a thread, whose loads are in flight
// together (with 16, the kernel took 90 registers and 2 blocks of 256 threads an SM, and waited on memory).
constexpr int kScatterThreads = 512;
constexpr int kScatterOps = 8;
// The rows a thread loads together (OpRow), for keys of `key_words` words. Two ops' rows of 8-byte keys in
// flight at once: BinScatter 73 -> 67 us a pass of 4M inserts, writes 1.006-1.014x (H100, run 252). More
// rows, or two of wider keys, take the kernel past its 64 registers, and it spills (four rows of 8-byte keys
// measured level, eight 0.95x).
constexpr int scatter_loads(std::uint32_t key_words) { return key_words == 1 ? 2 : 1; }
constexpr std::uint32_t kScatterTile = kScatterThreads * kScatterOps;
// Run lengths a cache line apart: the atomics of every tile on them would otherwise queue at a few L2 slices.
constexpr std::uint32_t kRunLengthStride = 32;
constexpr std::uint64_t kNoBinKey = ~std::uint64_t{0};  // no key in that place of a tile (a malformed op, or past n)
constexpr int kBinThreads = 1024;  // group_bins_kernel's blocks: one an SM, by its table

// The runs' memory (the executor's): 2^kMaxBinBits runs of kBinRunCapacity keys, and for each (a line
// apart) its length, which bin_scatter_kernel counts up and group_bins_kernel, having read it, sets back to
// 0 for the next pass, and whether it overflowed in this pass, which group_bins_kernel sets.
struct BinRuns {
  std::uint64_t* keys;
  std::uint32_t* lengths;
  int bin_bits;
  __device__ std::uint32_t bin_of(std::uint64_t key) const {
    return static_cast<std::uint32_t>(key >> kBinShift) & ((std::uint32_t{1} << bin_bits) - 1);
  }
  __device__ std::uint32_t& length(std::uint32_t bin) const { return lengths[bin * kRunLengthStride]; }
  __device__ std::uint32_t& overflowed(std::uint32_t bin) const { return lengths[bin * kRunLengthStride + 1]; }
};

template <class Ref>
__global__ void __launch_bounds__(kScatterThreads, 2) bin_scatter_kernel(std::uint64_t n, Engine<Ref> e, BinRuns runs,
                                                                         bool starts_pass, Counters* counters) {
  using Scan = cub::BlockScan<std::uint32_t, kScatterThreads>;
  __shared__ std::uint32_t tile_count[1 << kMaxBinBits];  // the tile's keys per bin
  __shared__ std::uint32_t tile_first[1 << kMaxBinBits];  // where a bin's keys begin in `staged`
  __shared__ std::uint32_t run_at[1 << kMaxBinBits];      // where they go in the bin's run
  __shared__ std::uint64_t staged[kScatterTile];          // the tile's keys, by bin
  __shared__ typename Scan::TempStorage scan;
  __shared__ std::uint32_t tile_keys;
  static_assert(kScatterThreads >= 1 << kMaxBinBits, "a thread for every bin");
  wait_for_earlier_kernels();
  if (counters->halted != 0 || (!starts_pass && read_only(e.pass))) return;
  if (starts_pass) {
    // StartPass's clearing, in whole 16-byte stores (the entries to clear are a power of two, at least 64,
    // and the table is 16-byte aligned). Kernel boundaries order it before the grouping that marks entries.
    const std::uint64_t threads = std::uint64_t{gridDim.x} * kScatterThreads;
    auto* const groups = reinterpret_cast<uint4*>(e.pass.groups);
    for (std::uint64_t i = std::uint64_t{blockIdx.x} * kScatterThreads + threadIdx.x;
         i < counters->dirty_groups / 4; i += threads) {
      groups[i] = make_uint4(0, 0, 0, 0);
    }
  }
  // StartPass's counts (write_counts), added to the counters where this kernel does StartPass's work (the
  // steps after it read them: read_only, the lane schedule, a delete's settling). A 32-bit word rather than a
  // Tally's counts, which would take the kernel past 64 registers; a thread counts at most 2^22 / 512 ops.
  std::uint32_t counts = 0;
  const std::uint32_t bins = std::uint32_t{1} << runs.bin_bits;
  const std::uint32_t bin_of_thread = threadIdx.x;  // past the last bin: none
  for (std::uint64_t tile = std::uint64_t{blockIdx.x} * kScatterTile; tile < n;
       tile += std::uint64_t{gridDim.x} * kScatterTile) {
    if (bin_of_thread < bins) tile_count[bin_of_thread] = 0;
    __syncthreads();
    // The rows of the thread's ops, kScatterLoads at a time, are loaded before any of them is used, so that
    // their loads are in flight together: where each op's hash and store to group_of came before the next
    // op's loads, the compiler issued the loads one op after the other, a memory round trip an op (Nsight
    // Compute, run 239).
    std::uint64_t key[kScatterOps];
    std::uint32_t place[kScatterOps];
    constexpr int kScatterLoads = scatter_loads(Ref::key_words);
#pragma unroll
    for (int group = 0; group < kScatterOps; group += kScatterLoads) {
      OpRow row[kScatterLoads];
#pragma unroll
      for (int i = 0; i < kScatterLoads; ++i) {
        const std::uint64_t op = tile + static_cast<std::uint64_t>(group + i) * kScatterThreads + threadIdx.x;
        if (op < n) row[i] = load_row(e, op);
      }
      if constexpr (kScatterLoads > 1) {
        asm volatile("" ::: "memory");  // the compiler moves none of these loads below this line
      }
#pragma unroll
      for (int i = 0; i < kScatterLoads; ++i) {
        const int j = group + i;
        const std::uint64_t op = tile + static_cast<std::uint64_t>(j) * kScatterThreads + threadIdx.x;
        const bool valid = op < n && e.batch.valid_row(row[i].kind, row[i].key.len, row[i].value_len);
        key[j] = valid ? bin_key(hash_key(row[i].key, e.table.key_words), op, runs.bin_bits) : kNoBinKey;
        if (valid) {
          counts += write_counts(row[i].kind);
          e.pass.group_of[op] = kUngrouped;
          place[j] = atomicAdd(&tile_count[runs.bin_of(key[j])], 1u);
        } else if (op < n) {
          refuse_malformed(e, op);
        }
      }
    }
    __syncthreads();
    // Each bin's share: its place among the tile's keys, and in its run (one atomic a bin).
    const std::uint32_t count = bin_of_thread < bins ? tile_count[bin_of_thread] : 0;
    std::uint32_t first = 0, total = 0;
    Scan(scan).ExclusiveSum(count, first, total);
    if (bin_of_thread < bins) {
      tile_first[bin_of_thread] = first;
      run_at[bin_of_thread] = count != 0 ? atomicAdd(&runs.length(bin_of_thread), count) : 0;
    }
    if (threadIdx.x == 0) tile_keys = total;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kScatterOps; ++j) {
      if (key[j] != kNoBinKey) staged[tile_first[runs.bin_of(key[j])] + place[j]] = key[j];
    }
    __syncthreads();
    // Neighbouring threads store a bin's keys to neighbouring places of its run.
    for (std::uint32_t i = threadIdx.x; i < tile_keys; i += kScatterThreads) {
      const std::uint64_t k = staged[i];
      const std::uint32_t bin = runs.bin_of(k);
      const std::uint32_t at = run_at[bin] + (i - tile_first[bin]);
      // Past the capacity the key is dropped, and the run's length says so: group_bins_kernel then marks the
      // bin overflowed, and GroupOverflowOp groups all of its ops.
      if (at < kBinRunCapacity) runs.keys[std::uint64_t{bin} * kBinRunCapacity + at] = k;
    }
    __syncthreads();  // tile_count and staged are reused by the next tile
  }
  if (starts_pass) {
    Tally tally;
    add_write_counts(counts, tally);
    flush_tally(tally, counters);
  }
}

// A table entry: the tag's bits above those that pick its home bucket, then 1 + the key's index in its run
// (0: empty). Where those bits match, the two keys are compared.
constexpr int kBinIndexBits = 15;
constexpr std::uint32_t kBinIndexMask = (std::uint32_t{1} << kBinIndexBits) - 1;
// A key probes its bin's table a bucket of 4 entries (one 16-byte load of shared memory) at a time, from the
// bucket its tag's bits 2..14 pick: mostly one probe a key, where an entry at a time took under two on
// average and a warp as many turns as its longest chain (GroupBins 58 -> 42 us a pass of 4M inserts, writes
// 1.02x; H100, run 249). An entry keeps the tag's bits 15..31.
constexpr std::uint32_t kBinBucket = 4;
static_assert(kBinRunCapacity < kBinIndexMask, "a run's index + 1 fits an entry");
static_assert(kBinIndexBits == kBinSlotBits, "an entry keeps the tag's bits above those that pick its home bucket");

template <class Ref>
__global__ void __launch_bounds__(kBinThreads) group_bins_kernel(Engine<Ref> e, BinRuns runs, Counters* counters) {
  extern __shared__ std::uint32_t table[];
  wait_for_earlier_kernels();
  if (counters->halted != 0) return;
  // Where bin_scatter_kernel counted the writes, it filled the runs before it knew whether the pass has any:
  // a pass without writes only empties them.
  const bool has_writes = !read_only(e.pass);
  const std::uint32_t bin = blockIdx.x;
  if (has_writes) {
    for (std::uint32_t i = threadIdx.x; i < kBinSlots; i += blockDim.x) table[i] = 0;
  }
  const std::uint32_t length = runs.length(bin);
  const bool overflowed = has_writes && length > kBinRunCapacity;
  __syncthreads();  // every thread has read the length before it is reset
  if (threadIdx.x == 0) {
    runs.length(bin) = 0;
    runs.overflowed(bin) = overflowed;
    if (overflowed) atomicExch(&counters->group_overflow, 1ull);
  }
  if (!has_writes || overflowed) return;
  const std::uint64_t* run = runs.keys + std::uint64_t{bin} * kBinRunCapacity;
  Tally tally;
  // One probe of the table for a key (`index` in the run): the bucket of kBinBucket entries at `first`, read
  // in one load. Its taken entries are a prefix (a key takes the first empty entry it sees, and entries are
  // never cleared in a pass), so the key joins an entry whose tag bits match and whose key is the same, or
  // takes the first empty entry with a CAS. Returns kEntered, kNextBucket (the bucket is full), or
  // kSameBucket (another op took that entry first, maybe one of the same key: look again). A stale or torn
  // load can only show taken entries as empty; its CAS then lands on a taken entry and fails, or on the first
  // empty one, so the taken entries stay a prefix.
  enum Probed { kEntered, kNextBucket, kSameBucket };
  const auto probe = [&](std::uint64_t key, std::uint32_t index, std::uint32_t first) {
    const std::uint64_t op = key & kBinOpMask;
    const std::uint32_t mine = (static_cast<std::uint32_t>(key >> 32) >> kBinSlotBits << kBinIndexBits) | (index + 1);
    const uint4 bucket = *reinterpret_cast<const uint4*>(&table[first]);
    const std::uint32_t seen[kBinBucket] = {bucket.x, bucket.y, bucket.z, bucket.w};
    std::uint32_t taken = 0, same_tag = 0;
#pragma unroll
    for (std::uint32_t j = 0; j < kBinBucket; ++j) {
      taken += seen[j] != 0;
      if (seen[j] != 0 && (seen[j] ^ mine) >> kBinIndexBits == 0) same_tag |= 1u << j;
    }
#pragma unroll
    for (std::uint32_t j = 0; j < kBinBucket; ++j) {
      if ((same_tag >> j & 1) == 0) continue;
      // Rare: the same tag bits, so compare the keys.
      const std::uint64_t other = run[(seen[j] & kBinIndexMask) - 1] & kBinOpMask;
      if (SameKeyOps<Ref>::keys_equal(batch_key(e.table, e.batch, op), batch_key(e.table, e.batch, other),
                                      e.table.key_words)) {
        // A second op of the key: both are in the entry, which ExecuteOp then finds shared.
        const std::uint32_t entry = (bin << kBinSlotBits) | (first + j);
        e.pass.group_of[op] = entry;
        e.pass.group_of[other] = entry;
        e.pass.groups[entry] = kGroupShared;
        tally.joined += 1;
        return kEntered;
      }
    }
    if (taken == kBinBucket) return kNextBucket;
    return atomicCAS(&table[first + taken], 0u, mine) == 0 ? kEntered : kSameBucket;
  };
  const auto home = [](std::uint64_t key) { return static_cast<std::uint32_t>(key >> 32) & (kBinSlots - kBinBucket); };
  const auto load = [&](std::uint32_t i) { return i < length ? run[i] : std::uint64_t{0}; };
  // A thread enters the keys threadIdx.x, + kBinThreads, ... of the run, one probe a turn of the loop, and
  // takes up its next key as soon as one is in: with a whole key a turn, a warp waited for its longest
  // probe chain at every key (about 11 probes where the mean is under 2), and with buckets too GroupBins
  // took 3.4x as long, though each key was loaded eight turns ahead (run 249). Its next key is loaded while
  // it enters the current one (six keys ahead measured level, run 199).
  std::uint32_t index = threadIdx.x;
  std::uint64_t key = load(index);
  std::uint64_t next = load(index + kBinThreads);
  std::uint32_t first = home(key);
  while (index < length) {
    const Probed r = probe(key, index, first);
    if (r == kEntered) {
      index += kBinThreads;
      key = next;
      next = load(index + kBinThreads);
      first = home(key);
    } else if (r == kNextBucket) {
      first = (first + kBinBucket) & (kBinSlots - 1);
    }
  }
  flush_tally(tally, counters);
}

// After group_bins_kernel, if a run overflowed (Counters::group_overflow): groups the ops of every bin whose run
// overflowed, entry by entry in the grouping table from their hash's entry on (group_insert_by_entry), where
// they take no entry the bins marked: those hold no tag. Every op of a key is in one bin, so its ops are
// grouped either here or by its bin's block, never by both. A malformed op was answered by bin_scatter_kernel.
template <class Ref>
struct GroupOverflowOp {
  static constexpr const char* kName = "GroupOverflowOp";
  Engine<Ref> e;
  BinRuns runs;
  __device__ bool idle() const { return e.pass.counters->halted != 0 || e.pass.counters->group_overflow == 0; }
  __device__ void operator()(std::uint64_t op, Tally& tally) const {
    if (e.pass.group_of[op] == kNoGroup) return;
    const std::uint64_t h = hash_key(batch_key(e.table, e.batch, op), e.table.key_words);
    if (runs.overflowed(static_cast<std::uint32_t>(h) & ((std::uint32_t{1} << runs.bin_bits) - 1)) == 0) return;
    bool joined = false;
    e.pass.group_of[op] = group_insert_by_entry(e.pass.groups, e.pass.group_mask, h, joined);
    tally.joined += joined;
  }
};

}  // namespace
}  // namespace gpu
}  // namespace gpukv::detail
