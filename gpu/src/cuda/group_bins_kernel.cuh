// Grouping in bins: the grouping step of a large pass with writes, done bin by bin in shared memory
// (detail/batch_groups.hpp says why, and what a bin key holds). Three steps, launched by
// CudaExecutor::group_in_bins:
//
//   bin_scatter_kernel  every op: validate it, hash its key, and append its bin key to its bin's run (a
//                       block counts a tile's ops per bin in shared memory, then reserves each bin's share of
//                       the run with one atomic; a tile's columns of 8-byte keys are copied into shared memory
//                       while the tile before is stored); and StartPass's work, for which the pass then
//                       launches no kernel: clear the grouping entries the last pass marked, count the
//                       pass's valid writes
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
#include <cuda_pipeline.h>

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
// The rows a thread loads together (OpRow) where the columns are not staged (StagedColumns), for keys of
// `key_words` words. Two ops' rows of 8-byte keys in flight at once: BinScatter 73 -> 67 us a pass of 4M
// inserts, writes 1.006-1.014x (H100, run 252). More rows, or two of wider keys, take the kernel past its 64
// registers, and it spills (four rows of 8-byte keys measured level, eight 0.95x).
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

// A tile's columns in shared memory (bin_scatter_kernel's staged form, for 8-byte keys): copied in by
// asynchronous copies issued as soon as the tile before has been read, so that they arrive while that tile
// is counted, scanned and stored. Loaded into registers instead, a tile's rows were waited for at each op's
// first use (56% of the kernel's stall samples, run 239), and at most two ops' rows fit in flight. Staged:
// BinScatter 67 -> 63 us a pass of 4M inserts, other writes 1.003-1.009x (H100, run 280); the kernel is
// then bound by its instructions and barriers, not by its loads.
struct StagedColumns {
  std::uint64_t keys[kScatterTile];
  std::uint32_t value_lens[kScatterTile];
  std::uint8_t kinds[kScatterTile];
  std::uint8_t key_lens[kScatterTile];
};
constexpr int kStagedBytes = sizeof(StagedColumns);  // 56 KB: with the kernel's own 38, two blocks an SM

// A pass's columns of one-word keys can be staged where every column it has starts 16-byte aligned (the
// copies move 16 bytes each): device and pinned allocations are, and so is a pass that begins a multiple of
// 16 ops into one.
inline bool stageable(const BatchRef& b) {
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  return aligned(b.ops) && aligned(b.keys) && aligned(b.key_lens) && (b.value_lens == nullptr || aligned(b.value_lens));
}

// This thread's share of the copies of `bytes` bytes from `from` to `to`, 16 at a time; the last copy reads
// only the bytes left and fills the rest with zeros.
__device__ __forceinline__ void stage_column(void* to, const void* from, std::uint32_t bytes) {
  for (std::uint32_t at = threadIdx.x * 16; at < bytes; at += kScatterThreads * 16) {
    const std::uint32_t left = bytes - at;
    __pipeline_memcpy_async(static_cast<char*>(to) + at, static_cast<const char*>(from) + at, 16, left < 16 ? 16 - left : 0);
  }
}

// Starts the copies of the columns of the tile at `tile` (the ops from there up to n).
__device__ __forceinline__ void stage_tile(StagedColumns& s, const BatchRef& b, std::uint64_t tile, std::uint64_t n) {
  const auto ops = static_cast<std::uint32_t>(n - tile < kScatterTile ? n - tile : kScatterTile);
  stage_column(s.kinds, b.ops + tile, ops);
  stage_column(s.key_lens, b.key_lens + tile, ops);
  stage_column(s.keys, b.keys + tile * 8, ops * 8);
  if (b.value_lens != nullptr) stage_column(s.value_lens, b.value_lens + tile, ops * 4);
  __pipeline_commit();
}

// kStaged: the tiles' columns staged in shared memory (StagedColumns, stageable()), which the launch gives
// as kStagedBytes of dynamic shared memory; else each thread loads its ops' rows itself.
template <class Ref, bool kStaged>
__global__ void __launch_bounds__(kScatterThreads, 2) bin_scatter_kernel(std::uint64_t n, Engine<Ref> e, BinRuns runs,
                                                                         Counters* counters) {
  static_assert(!kStaged || Ref::key_words == 1, "StagedColumns holds one-word keys");
  using Scan = cub::BlockScan<std::uint32_t, kScatterThreads>;
  extern __shared__ uint4 dynamic_shared[];
  StagedColumns& columns = *reinterpret_cast<StagedColumns*>(dynamic_shared);
  __shared__ std::uint32_t tile_count[1 << kMaxBinBits];  // the tile's keys per bin
  __shared__ std::uint32_t tile_first[1 << kMaxBinBits];  // where a bin's keys begin in `staged`
  __shared__ std::uint32_t run_at[1 << kMaxBinBits];      // where they go in the bin's run
  __shared__ std::uint64_t staged[kScatterTile];          // the tile's keys, by bin
  __shared__ typename Scan::TempStorage scan;
  __shared__ std::uint32_t tile_keys;
  static_assert(kScatterThreads >= 1 << kMaxBinBits, "a thread for every bin");
  wait_for_earlier_kernels();
  if (counters->halted != 0) return;
  // StartPass's clearing, in whole 16-byte stores (the entries to clear are a power of two, at least 64, and
  // the table is 16-byte aligned). Kernel boundaries order it before the grouping that marks entries.
  auto* const groups = reinterpret_cast<uint4*>(e.pass.groups);
  for (std::uint64_t i = std::uint64_t{blockIdx.x} * kScatterThreads + threadIdx.x; i < counters->dirty_groups / 4;
       i += std::uint64_t{gridDim.x} * kScatterThreads) {
    groups[i] = make_uint4(0, 0, 0, 0);
  }
  // StartPass's counts (write_counts), added to the counters at the end (the steps after this kernel read
  // them: read_only, the lane schedule, a delete's settling). A 32-bit word rather than a Tally's counts,
  // which would take the kernel past 64 registers; a thread counts at most 2^22 / 512 ops.
  std::uint32_t counts = 0;
  const std::uint32_t bins = std::uint32_t{1} << runs.bin_bits;
  const std::uint32_t bin_of_thread = threadIdx.x;  // past the last bin: none
  const std::uint64_t tile_stride = std::uint64_t{gridDim.x} * kScatterTile;
  if constexpr (kStaged) stage_tile(columns, e.batch, std::uint64_t{blockIdx.x} * kScatterTile, n);
  for (std::uint64_t tile = std::uint64_t{blockIdx.x} * kScatterTile; tile < n; tile += tile_stride) {
    if (bin_of_thread < bins) tile_count[bin_of_thread] = 0;
    if constexpr (kStaged) __pipeline_wait_prior(0);  // this thread's copies of the tile's columns
    __syncthreads();
    std::uint64_t key[kScatterOps];
    std::uint32_t place[kScatterOps];
    // The thread's j-th op of the tile, whose row is loaded: validated, its bin key worked out, and counted
    // in its bin.
    const auto enter = [&](int j, const OpRow& row) {
      const std::uint64_t op = tile + static_cast<std::uint64_t>(j) * kScatterThreads + threadIdx.x;
      const bool valid = op < n && e.batch.valid_row(row.kind, row.key.len, row.value_len);
      key[j] = valid ? bin_key(hash_key(row.key, e.table.key_words), op, runs.bin_bits) : kNoBinKey;
      if (valid) {
        counts += write_counts(row.kind);
        e.pass.group_of[op] = kUngrouped;
        place[j] = atomicAdd(&tile_count[runs.bin_of(key[j])], 1u);
      } else if (op < n) {
        refuse_malformed(e, op);
      }
    };
    if constexpr (kStaged) {
#pragma unroll
      for (int j = 0; j < kScatterOps; ++j) {
        const std::uint32_t at = j * kScatterThreads + threadIdx.x;
        const bool has_values = e.batch.value_lens != nullptr;
        enter(j, OpRow{columns.kinds[at], load_key(reinterpret_cast<const std::uint8_t*>(&columns.keys[at]), columns.key_lens[at], 1),
                       has_values ? columns.value_lens[at] : 0});
      }
    } else {
      // The rows of the thread's ops, kScatterLoads at a time, are loaded before any of them is used, so that
      // their loads are in flight together: where each op's hash and store to group_of came before the next
      // op's loads, the compiler issued the loads one op after the other, a memory round trip an op (Nsight
      // Compute, run 239).
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
        for (int i = 0; i < kScatterLoads; ++i) enter(group + i, row[i]);
      }
    }
    __syncthreads();
    // Every thread has read its rows: the next tile's columns may come in while this one is stored.
    if constexpr (kStaged) {
      if (tile + tile_stride < n) stage_tile(columns, e.batch, tile + tile_stride, n);
    }
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
  Tally tally;
  add_write_counts(counts, tally);
  flush_tally(tally, counters);
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
