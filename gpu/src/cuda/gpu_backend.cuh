// The GPU backend: the table in device memory; every pass step is a grid-stride kernel around the same
// per-operation function objects the CPU backend runs (detail/pass_ops.hpp, detail/cleanup.hpp). Included
// by gpu_backend_key*.cu, one key width each.
#pragma once

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <mutex>
#include <string>

#include "../backend.hpp"
#include "clstash_kernel.cuh"
#include "cuda_check.hpp"
#include "device_memory.hpp"
#include "step_clock.hpp"

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
// clStash keeps a shelf of walks in registers and shared memory; it spills at 64 registers (4 blocks). With 3
// blocks (85 registers) mixed batches ran 11-12% faster on an H100 than with 4 (bench/RESULTS.md, run 5).
#ifndef GPUKV_CLSTASH_MIN_BLOCKS
#define GPUKV_CLSTASH_MIN_BLOCKS 3
#endif
template <class F>
constexpr int min_blocks() {
  if constexpr (requires { F::kProbes; }) {
    return GPUKV_PROBE_MIN_BLOCKS;
  } else {
    return 1;
  }
}

// Adds each warp's tallies to the counters with one atomic per counter per warp.
__device__ __forceinline__ void flush_delta(long long delta, unsigned long long* counter) {
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

template <class F>
__global__ void __launch_bounds__(kBlockThreads, min_blocks<F>()) for_each_kernel(std::uint64_t n, F f, Counters* counters) {
  Tally tally;
  grid_stride(n, f, tally);
  flush_tally(tally, counters);
}

// The two lane schedules of the probing step, launched back to back: each reads the counters StartPass left
// (the same values in every thread) and returns at once unless the hybrid picked it. Two kernels rather than
// one with a branch, so that clStash's register pressure does not spill into the Stash loop.
template <class Ref>
__global__ void __launch_bounds__(kBlockThreads, GPUKV_PROBE_MIN_BLOCKS)
    stash_kernel(std::uint64_t n, ExecuteOp<Ref> f, LanePolicy policy, Counters* counters) {
  if (policy.collaborative(*counters)) return;
  Tally tally;
  grid_stride(n, f, tally);
  flush_tally(tally, counters);
}

template <class Ref>
__global__ void __launch_bounds__(kBlockThreads, GPUKV_CLSTASH_MIN_BLOCKS)
    clstash_kernel(std::uint64_t n, ExecuteOp<Ref> f, LanePolicy policy, Counters* counters) {
  if (!policy.collaborative(*counters)) return;
  Tally tally;
  clstash_execute<kBlockThreads>(n, f, tally);
  flush_tally(tally, counters);
}

__global__ void set_counters_kernel(Counters* counters, Counters value) { *counters = value; }

// Blocks of a kernel that fit on the device at once: the grid of a grid-stride launch. Computed once per
// kernel (the kernel is the template argument, so kernels of one signature get separate answers).
template <auto Kernel>
int resident_blocks(int sm_count) {
  static const int per_sm = [] {
    int blocks = 0;
    GPUKV_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, Kernel, kBlockThreads, 0));
    return std::max(1, blocks);
  }();
  return per_sm * sm_count;
}

class CudaExecutor {
 public:
  CudaExecutor(cudaStream_t stream, int sm_count, Counters* counters)
      : stream_(stream), sm_count_(sm_count), counters_(counters), readback_(sizeof(Counters)) {}

  // `max_threads` (0: no limit) caps the grid below what fits on the device.
  template <class F>
  void for_each(std::uint64_t n, const F& f, std::uint32_t max_threads = 0) {
    if (n == 0) return;
    std::uint64_t needed = (n + kBlockThreads - 1) / kBlockThreads;
    if (max_threads != 0) needed = std::min<std::uint64_t>(needed, (max_threads + kBlockThreads - 1) / kBlockThreads);
    const int grid = static_cast<int>(std::min<std::uint64_t>(needed, resident_blocks<for_each_kernel<F>>(sm_count_)));
    clock_.begin(stream_, F::kName);
    for_each_kernel<<<grid, kBlockThreads, 0, stream_>>>(n, f, counters_);
    GPUKV_CUDA_CHECK_LAUNCH();
    clock_.end(stream_);
  }

  // ExecuteOp with one walk per lane (Stash) or with collaborative lanes (clStash), as `policy` decides.
  template <class Ref>
  void execute(std::uint64_t n, const ExecuteOp<Ref>& f, const LanePolicy& policy) {
    if (n == 0) return;
    const std::uint64_t needed = (n + kBlockThreads - 1) / kBlockThreads;
    clock_.begin(stream_, ExecuteOp<Ref>::kName);
    if (policy.mode != LaneMode::kClStash) {
      const int grid = static_cast<int>(std::min<std::uint64_t>(needed, resident_blocks<stash_kernel<Ref>>(sm_count_)));
      stash_kernel<Ref><<<grid, kBlockThreads, 0, stream_>>>(n, f, policy, counters_);
      GPUKV_CUDA_CHECK_LAUNCH();
    }
    if (policy.mode != LaneMode::kStash) {
      const int grid = static_cast<int>(std::min<std::uint64_t>(needed, resident_blocks<clstash_kernel<Ref>>(sm_count_)));
      clstash_kernel<Ref><<<grid, kBlockThreads, 0, stream_>>>(n, f, policy, counters_);
      GPUKV_CUDA_CHECK_LAUNCH();
    }
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
    GPUKV_CUDA_CHECK(cudaMemcpyAsync(readback_.as<Counters>(), counters_, sizeof(Counters), cudaMemcpyDeviceToHost, stream_));
    GPUKV_CUDA_CHECK(cudaStreamSynchronize(stream_));
    clock_.collect();
    return *readback_.as<Counters>();
  }

  void write_counters(const Counters& c) {
    set_counters_kernel<<<1, 1, 0, stream_>>>(counters_, c);
    GPUKV_CUDA_CHECK_LAUNCH();
  }

  void report(std::uint64_t ops) { clock_.report(ops); }

  // The host tier's clean-up scratch is pinned host memory too: it can be as large as the tier.
  GpuBuffer allocate(std::uint64_t bytes, bool host_tier) {
    GPUKV_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return GpuBuffer::try_allocate(bytes, host_tier ? GpuMemory::kMappedHost : GpuMemory::kDevice);
  }

 private:
  cudaStream_t stream_;
  int sm_count_;
  Counters* counters_;
  PinnedBuffer readback_;
  std::uint64_t sort_capacity_ = 0;  // keys the sort scratch holds
  GpuBuffer sort_temp_;
  GpuBuffer sort_alt_;
  StepClock clock_;
};

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

// Threads per op that copy a value after the probing step (CopyValues): a warp's worth at most, one per 16
// bytes. Values of two words or fewer are copied by the op itself, where they are already in hand.
std::uint32_t copy_lanes(std::uint32_t value_stride) {
  return value_stride <= 16 ? 0 : std::min<std::uint32_t>(32, (value_stride + 15) / 16);
}

int select_device(int ordinal) {
  GPUKV_CUDA_CHECK(cudaSetDevice(ordinal));
  return ordinal;
}

int sm_count_of(int device) {
  int count = 0;
  GPUKV_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

// A batch's columns in device memory, grown on demand for batches that arrive in host memory.
class DeviceColumns {
 public:
  void reserve(std::uint64_t n, std::uint32_t key_width, std::uint32_t value_stride) {
    if (n <= capacity_) return;
    ops_ = GpuBuffer(n, "batch ops");
    keys_ = GpuBuffer(n * key_width, "batch keys");
    key_lens_ = GpuBuffer(n, "batch key lengths");
    values_ = GpuBuffer(n * value_stride, "batch values");
    value_lens_ = GpuBuffer(n * sizeof(std::uint32_t), "batch value lengths");
    status_ = GpuBuffer(n, "batch results");
    out_values_ = GpuBuffer(n * value_stride, "batch result values");
    out_value_lens_ = GpuBuffer(n * sizeof(std::uint32_t), "batch result lengths");
    capacity_ = n;
  }
  BatchIn in(std::uint64_t n) const {
    return BatchIn{n, ops_.data(), keys_.data(), key_lens_.data(), values_.data(), value_lens_.as<std::uint32_t>()};
  }
  BatchOut out() const { return BatchOut{status_.data(), out_values_.data(), out_value_lens_.as<std::uint32_t>()}; }

  // Copies a batch's input columns from host memory into these, in stream order on `s`. Returns them as the
  // pass's input: without value columns if the batch has none.
  BatchIn copy_in(const BatchIn& in, std::uint32_t key_width, std::uint32_t value_stride, cudaStream_t s) const {
    const std::uint64_t n = in.size;
    BatchIn d = this->in(n);
    GPUKV_CUDA_CHECK(cudaMemcpyAsync(const_cast<std::uint8_t*>(d.ops), in.ops, n, cudaMemcpyHostToDevice, s));
    GPUKV_CUDA_CHECK(cudaMemcpyAsync(const_cast<std::uint8_t*>(d.keys), in.keys, n * key_width, cudaMemcpyHostToDevice, s));
    GPUKV_CUDA_CHECK(cudaMemcpyAsync(const_cast<std::uint8_t*>(d.key_lens), in.key_lens, n, cudaMemcpyHostToDevice, s));
    if (in.values != nullptr && in.value_lens != nullptr) {
      GPUKV_CUDA_CHECK(cudaMemcpyAsync(const_cast<std::uint8_t*>(d.values), in.values, n * value_stride, cudaMemcpyHostToDevice, s));
      GPUKV_CUDA_CHECK(cudaMemcpyAsync(const_cast<std::uint32_t*>(d.value_lens), in.value_lens, n * sizeof(std::uint32_t),
                                       cudaMemcpyHostToDevice, s));
    } else {
      d.values = nullptr;
      d.value_lens = nullptr;
    }
    return d;
  }

 private:
  std::uint64_t capacity_ = 0;
  GpuBuffer ops_, keys_, key_lens_, values_, value_lens_, status_, out_values_, out_value_lens_;
};

template <class Ref>
class GpuBackend final : public Backend {
 public:
  GpuBackend(const TableConfig& config, const Geometry& g)
      : config_(config),
        geometry_(g),
        device_(select_device(config.gpu_device)),
        board_(g.device.board_bytes(), "the ticket-board"),
        slots_(g.device.slot_bytes(), "the slots"),
        host_board_(g.host.board_bytes(), "the host tier's ticket-board"),
        host_slots_(g.host.slot_bytes(), "the host tier's slots", GpuMemory::kMappedHost),
        host_tags_(g.host.tag_bytes, "the host tier's tags"),
        counters_(sizeof(Counters), "counters"),
        exec_(stream_.stream, sm_count_of(device_), counters_.as<Counters>()),
        runner_(make_table_ref<Ref>(g, g.device, board_.as<std::uint64_t>(), slots_.data(), nullptr),
                make_table_ref<Ref>(g, g.host, host_board_.as<std::uint64_t>(), host_slots_.data(), host_tags_.data()),
                exec_,
                counters_.as<Counters>(), limits_of(g.device), limits_of(g.host),
                HostPhase{config.order_host, config.host_phase_threads}, config.lanes, config.clstash_load,
                copy_lanes(g.value_stride)) {
    // Every ticket EMPTY; slots need no initialisation (they are read only behind a FULL ticket), but in the
    // line layout the tickets are among them.
    if (!board_.empty()) exec_.zero(board_.data(), board_.bytes());
    if (g.device.layout == SlotLayout::kLine) exec_.zero(slots_.data(), slots_.bytes());
    if (!host_board_.empty()) exec_.zero(host_board_.data(), host_board_.bytes());
    exec_.write_counters(Counters{});
    GPUKV_CUDA_CHECK(cudaStreamSynchronize(stream_.stream));
  }

  ~GpuBackend() override { cudaStreamSynchronize(copy_stream_.stream); }  // no prefetch still reading host memory

  void execute(const BatchIn& in, const BatchOut& out, Memory memory) override {
    GPUKV_CUDA_CHECK(cudaSetDevice(device_));
    if (memory == Memory::kDevice) {
      runner_.run(make_batch_ref(config_, geometry_, in, out), scratch_for(in.size));
      return;
    }
    const std::uint64_t n = in.size;
    const std::uint32_t stride = geometry_.value_stride;
    const cudaStream_t s = stream_.stream;
    // The batch's input is on the GPU already, or on its way, if it was prefetched: wait for that copy.
    // Otherwise copy it now, in stream order.
    Upload* upload = take_upload(in);
    const auto release = [&] {
      if (upload == nullptr) return;
      std::lock_guard lock(uploads_mutex_);
      upload->state = Upload::State::kFree;
    };
    struct Release {
      const decltype(release)& f;
      ~Release() { f(); }
    } release_on_exit{release};  // also when a CUDA call throws
    BatchIn run_in;
    BatchOut d_out;
    if (upload != nullptr) {
      GPUKV_CUDA_CHECK(cudaStreamWaitEvent(s, upload->copied.event, 0));
      run_in = upload->device_in;
      d_out = upload->device.out();
    } else {
      staging_.reserve(std::max<std::uint64_t>(n, 1024), config_.key_width, stride);
      run_in = staging_.copy_in(in, config_.key_width, stride, s);
      d_out = staging_.out();
    }
    if (out.values == nullptr) {
      d_out.values = nullptr;
      d_out.value_lens = nullptr;
    }
    runner_.run(make_batch_ref(config_, geometry_, run_in, d_out), scratch_for(n));
    GPUKV_CUDA_CHECK(cudaMemcpyAsync(out.status, d_out.status, n, cudaMemcpyDeviceToHost, s));
    if (out.values != nullptr) {
      // GET values are written only for found keys; copy the whole column (the rest is unspecified).
      GPUKV_CUDA_CHECK(cudaMemcpyAsync(out.values, d_out.values, n * stride, cudaMemcpyDeviceToHost, s));
      GPUKV_CUDA_CHECK(cudaMemcpyAsync(out.value_lens, d_out.value_lens, n * sizeof(std::uint32_t), cudaMemcpyDeviceToHost, s));
    }
    GPUKV_CUDA_CHECK(cudaStreamSynchronize(s));
  }

  void batch_done(std::uint64_t ops) override { exec_.report(ops); }

  HostMemory allocate_host(std::size_t bytes) override {
    GPUKV_CUDA_CHECK(cudaSetDevice(device_));
    void* p = nullptr;
    // Portable: pinned for every CUDA context, whichever thread allocates.
    const cudaError_t err = cudaHostAlloc(&p, std::max<std::size_t>(bytes, 1), cudaHostAllocPortable);
    if (err != cudaSuccess) {
      cudaGetLastError();
      throw Error(Error::Code::kOutOfMemory, "cannot allocate " + std::to_string(bytes) +
                                                 " bytes of pinned host memory: " + cudaGetErrorString(err));
    }
    std::memset(p, 0, bytes);
    return HostMemory(static_cast<std::uint8_t*>(p), bytes, [](void* q) { cudaFreeHost(q); });
  }

  // Copies the batch's input into an upload slot on the copy stream: the slot that holds these columns
  // already (refilled since: copied again), else a free one, else the oldest prefetch not yet running (its
  // execute(), if it comes, copies for itself). With one slot running and the other prefetched, as in the
  // batcher, a new prefetch therefore takes the place of one that was never run.
  void prefetch(const BatchIn& in) override {
    GPUKV_CUDA_CHECK(cudaSetDevice(device_));
    std::lock_guard lock(uploads_mutex_);
    using State = Upload::State;
    Upload* slot = nullptr;
    for (Upload& u : uploads_) {
      if (u.state == State::kCopied && same_columns(u.host, in)) slot = &u;
    }
    for (Upload& u : uploads_) {
      if (slot == nullptr && u.state == State::kFree) slot = &u;
    }
    if (slot == nullptr) {
      for (Upload& u : uploads_) {
        if (u.state == State::kCopied && (slot == nullptr || u.sequence < slot->sequence)) slot = &u;
      }
    }
    if (slot == nullptr) return;  // every slot is running
    slot->device.reserve(std::max<std::uint64_t>(in.size, 1024), config_.key_width, geometry_.value_stride);
    slot->device_in = slot->device.copy_in(in, config_.key_width, geometry_.value_stride, copy_stream_.stream);
    GPUKV_CUDA_CHECK(cudaEventRecord(slot->copied.event, copy_stream_.stream));
    slot->host = in;
    slot->state = Upload::State::kCopied;
    slot->sequence = ++uploads_made_;
  }

  bool cleanup() override {
    GPUKV_CUDA_CHECK(cudaSetDevice(device_));
    return runner_.cleanup();
  }

  std::uint64_t slot_count() const override { return runner_.slot_count(); }

  // The items are gathered in the staging columns (the slots of both tiers are read where they live; only
  // FULL ones cross PCIe from the host tier), then copied to `out` whole, one copy per column.
  std::uint64_t export_items(std::uint64_t from, std::uint64_t slots, const ItemColumns& out) override {
    GPUKV_CUDA_CHECK(cudaSetDevice(device_));
    const std::uint32_t stride = geometry_.value_stride;
    staging_.reserve(std::max<std::uint64_t>(slots, 1024), config_.key_width, stride);
    const BatchIn d = staging_.in(slots);
    const ItemColumns gathered{const_cast<std::uint8_t*>(d.keys), const_cast<std::uint8_t*>(d.key_lens),
                               const_cast<std::uint8_t*>(d.values), const_cast<std::uint32_t*>(d.value_lens)};
    const std::uint64_t n = runner_.export_items(from, slots, gathered);
    const cudaStream_t s = stream_.stream;
    GPUKV_CUDA_CHECK(cudaMemcpyAsync(out.keys, gathered.keys, n * config_.key_width, cudaMemcpyDeviceToHost, s));
    GPUKV_CUDA_CHECK(cudaMemcpyAsync(out.key_lens, gathered.key_lens, n, cudaMemcpyDeviceToHost, s));
    GPUKV_CUDA_CHECK(cudaMemcpyAsync(out.values, gathered.values, n * stride, cudaMemcpyDeviceToHost, s));
    GPUKV_CUDA_CHECK(cudaMemcpyAsync(out.value_lens, gathered.value_lens, n * sizeof(std::uint32_t), cudaMemcpyDeviceToHost, s));
    GPUKV_CUDA_CHECK(cudaStreamSynchronize(s));
    return n;
  }

  void hold_cleanup(bool hold) override { runner_.hold_cleanup(hold); }

  TableStats stats() const override { return make_stats(geometry_, runner_.counters(), runner_.stats()); }

  std::string device_name() const override {
    cudaDeviceProp prop{};
    GPUKV_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    return std::string(prop.name) + " (" + std::to_string(prop.multiProcessorCount) + " SMs)";
  }

 private:
  TableConfig config_;
  Geometry geometry_;
  int device_;
  StreamHandle stream_;
  GpuBuffer board_;
  GpuBuffer slots_;
  GpuBuffer host_board_;  // the host tier's tickets stay in GPU memory: rejecting a key there costs no PCIe
  GpuBuffer host_slots_;  // mapped pinned host memory
  GpuBuffer host_tags_;   // beside the host tier's board, in GPU memory
  // Pass scratch, grown to the largest pass seen so far (growing waits for the stream first).
  PassScratch scratch_for(std::uint64_t n) {
    if (n > scratch_ops_) {
      GPUKV_CUDA_CHECK(cudaStreamSynchronize(stream_.stream));
      const ScratchBytes bytes = scratch_bytes(n);
      groups_ = GpuBuffer(bytes.groups, "batch grouping");
      exec_.zero(groups_.data(), groups_.bytes());  // PassRunner clears only what a pass leaves behind
      group_of_ = GpuBuffer(bytes.group_of, "batch grouping");
      conflicts_ = GpuBuffer(bytes.conflicts, "deferred ops");
      pending_ = GpuBuffer(bytes.pending, "pass results");
      host_queue_ = GpuBuffer(bytes.host_queue, "host-tier ops");
      scratch_ops_ = n;
    }
    return PassScratch{groups_.as<std::uint32_t>(), group_of_.as<std::uint32_t>(), conflicts_.as<std::uint64_t>(),
                       pending_.as<std::uint64_t>(), host_queue_.as<std::uint64_t>()};
  }

  // A batch's input copied to the GPU ahead of its execute() (Table::prefetch): two slots, so that the next
  // batch's copy runs while the current one executes.
  struct Upload {
    enum class State { kFree, kCopied, kRunning };
    State state = State::kFree;  // guarded by uploads_mutex_
    BatchIn host;                // the host columns copied, which execute() matches
    DeviceColumns device;
    BatchIn device_in;           // their copy, as the pass's input
    EventHandle copied;          // recorded on the copy stream after the copy
    std::uint64_t sequence = 0;  // when it was prefetched (the oldest is replaced first)
  };
  static bool same_columns(const BatchIn& a, const BatchIn& b) {
    return a.size == b.size && a.ops == b.ops && a.keys == b.keys && a.key_lens == b.key_lens && a.values == b.values &&
           a.value_lens == b.value_lens;
  }
  // The prefetched upload of exactly these columns, now marked running; or nullptr.
  Upload* take_upload(const BatchIn& in) {
    std::lock_guard lock(uploads_mutex_);
    for (Upload& u : uploads_) {
      if (u.state == Upload::State::kCopied && same_columns(u.host, in)) {
        u.state = Upload::State::kRunning;
        return &u;
      }
    }
    return nullptr;
  }

  StreamHandle copy_stream_;
  std::mutex uploads_mutex_;
  std::array<Upload, 2> uploads_;
  std::uint64_t uploads_made_ = 0;  // guarded by uploads_mutex_

  GpuBuffer counters_;
  CudaExecutor exec_;
  PassRunner<Ref, CudaExecutor> runner_;
  std::uint64_t scratch_ops_ = 0;
  GpuBuffer groups_;
  GpuBuffer group_of_;
  GpuBuffer conflicts_;
  GpuBuffer pending_;
  GpuBuffer host_queue_;
  DeviceColumns staging_;
};

}  // namespace
}  // namespace gpu

template <std::uint32_t KeyWords>
std::unique_ptr<Backend> make_gpu_backend_for(const TableConfig& config, const Geometry& geometry) {
  return with_table_type<KeyWords>(config, [&](auto ref) -> std::unique_ptr<Backend> {
    return std::make_unique<gpu::GpuBackend<decltype(ref)>>(config, geometry);
  });
}

}  // namespace gpukv::detail
