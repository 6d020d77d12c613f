// The GPU backend: the table in device memory, each pass step a kernel (kernels.cuh) launched by
// CudaExecutor (cuda_executor.cuh) around the per-operation code the CPU backend runs too; batches that
// arrive in host memory are copied in (device_columns.cuh), ahead of their turn when prefetched. Included by
// gpu_backend_key*.cu, one key width each.
#pragma once

#include <algorithm>
#include <array>
#include <cstring>
#include <mutex>
#include <string>

#include "../backend.hpp"
#include "cuda_check.hpp"
#include "cuda_executor.cuh"
#include "device_columns.cuh"
#include "device_memory.hpp"

namespace gpukv::detail {
namespace gpu {
// Internal linkage: each gpu_backend_key*.cu has its own copy of these kernels and helpers.
namespace {

// Threads per op that copy a value after the probing step (CopyValues): a warp's worth at most, one per 16
// bytes. Values of two words or fewer are copied by the op itself, where they are already in hand, but in a
// table with slot words, whose words CopyValues moves (Engine::store_slot_word), except in the lookup kernel
// (answers_words_in_lookups). A PUT on a board writes its slot's head too, its lengths and key, a word a
// lane (CopyValues): `head_words` lanes at least (Geometry::copied_head_words).
std::uint32_t copy_lanes(std::uint32_t value_stride, bool slot_word, std::uint32_t head_words) {
  const std::uint32_t lanes = value_stride <= kValueBytesCopiedByOp ? (slot_word ? 1 : 0)
                                                                    : std::min<std::uint32_t>(32, (value_stride + 15) / 16);
  return lanes == 0 ? 0 : std::max(lanes, head_words);
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
        exec_(stream_.stream, device_, sm_count_of(device_), counters_.as<Counters>()),
        runner_(make_table_ref<Ref>(g, g.device, board_.as<std::uint64_t>(), slots_.data(), nullptr),
                make_table_ref<Ref>(g, g.host, host_board_.as<std::uint64_t>(), host_slots_.data(), host_tags_.data()),
                exec_,
                counters_.as<Counters>(), limits_of(g.device), limits_of(g.host),
                HostPhase{config.order_host, config.host_phase_threads}, config.lanes, config.clstash_load,
                copy_lanes(g.value_stride, config.slot_word, g.copied_head_words()),
                config.optimistic_inserts) {
    // Every ticket EMPTY, and every device-tier slot zero: in the line layout the tickets are among them, and
    // a claim may make a ticket FULL at once over an EMPTY slot's zeros (Engine's invariants). The host
    // tier's slots need no initialisation (they are read only behind a FULL ticket).
    if (!board_.empty()) exec_.zero(board_.data(), board_.bytes());
    exec_.zero(slots_.data(), slots_.bytes());
    if (!host_board_.empty()) exec_.zero(host_board_.data(), host_board_.bytes());
    exec_.write_counters(Counters{});
    GPUKV_CUDA_CHECK(cudaStreamSynchronize(stream_.stream));
  }

  ~GpuBackend() override { cudaStreamSynchronize(copy_stream_.stream); }  // no prefetch still reading host memory

  void execute(const BatchIn& in, const BatchOut& out, Memory memory) override {
    GPUKV_CUDA_CHECK(cudaSetDevice(device_));
    const std::uint64_t pass_ops = config_.max_batch;
    if (memory == Memory::kDevice) {
      const std::uint64_t first_pass = std::min<std::uint64_t>(in.size, pass_ops);
      runner_.run(make_batch_ref(config_, geometry_, in, out), scratch_for(first_pass), pass_ops);
      return;
    }
    for (std::uint64_t begin = 0; begin < in.size; begin += pass_ops) {
      execute_from_host(part_of(in, begin, pass_ops, config_.key_width, geometry_.value_stride),
                        part_of(out, begin, geometry_.value_stride));
    }
  }

  // One pass of a batch in host memory: its columns copied in (or taken from a prefetch), its answers out.
  void execute_from_host(const BatchIn& in, const BatchOut& out) {
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
      staging_.reserve(std::max<std::uint64_t>(n, 1024), config_.key_width, stride, config_.slot_word);
      run_in = staging_.copy_in(in, config_.key_width, stride, s);
      d_out = staging_.out();
    }
    if (out.values == nullptr) {
      d_out.values = nullptr;
      d_out.value_lens = nullptr;
    }
    if (out.slot_words == nullptr) d_out.slot_words = nullptr;
    runner_.run(make_batch_ref(config_, geometry_, run_in, d_out), scratch_for(n), n);
    GPUKV_CUDA_CHECK(cudaMemcpyAsync(out.status, d_out.status, n, cudaMemcpyDeviceToHost, s));
    if (out.values != nullptr) {
      // GET values are written only for found keys; copy the whole column (the rest is unspecified).
      GPUKV_CUDA_CHECK(cudaMemcpyAsync(out.values, d_out.values, n * stride, cudaMemcpyDeviceToHost, s));
      GPUKV_CUDA_CHECK(cudaMemcpyAsync(out.value_lens, d_out.value_lens, n * sizeof(std::uint32_t), cudaMemcpyDeviceToHost, s));
    }
    if (out.slot_words != nullptr) {
      GPUKV_CUDA_CHECK(cudaMemcpyAsync(out.slot_words, d_out.slot_words, n * sizeof(std::uint64_t), cudaMemcpyDeviceToHost, s));
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
    slot->device.reserve(std::max<std::uint64_t>(in.size, 1024), config_.key_width, geometry_.value_stride, config_.slot_word);
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
    staging_.reserve(std::max<std::uint64_t>(slots, 1024), config_.key_width, stride, config_.slot_word);
    const BatchIn d = staging_.in(slots);
    const ItemColumns gathered{const_cast<std::uint8_t*>(d.keys), const_cast<std::uint8_t*>(d.key_lens),
                               const_cast<std::uint8_t*>(d.values), const_cast<std::uint32_t*>(d.value_lens),
                               out.slot_words == nullptr ? nullptr : const_cast<std::uint64_t*>(d.slot_words)};
    const std::uint64_t n = runner_.export_items(from, slots, gathered);
    const cudaStream_t s = stream_.stream;
    GPUKV_CUDA_CHECK(cudaMemcpyAsync(out.keys, gathered.keys, n * config_.key_width, cudaMemcpyDeviceToHost, s));
    GPUKV_CUDA_CHECK(cudaMemcpyAsync(out.key_lens, gathered.key_lens, n, cudaMemcpyDeviceToHost, s));
    GPUKV_CUDA_CHECK(cudaMemcpyAsync(out.values, gathered.values, n * stride, cudaMemcpyDeviceToHost, s));
    GPUKV_CUDA_CHECK(cudaMemcpyAsync(out.value_lens, gathered.value_lens, n * sizeof(std::uint32_t), cudaMemcpyDeviceToHost, s));
    if (out.slot_words != nullptr) {
      GPUKV_CUDA_CHECK(cudaMemcpyAsync(out.slot_words, gathered.slot_words, n * sizeof(std::uint64_t), cudaMemcpyDeviceToHost, s));
    }
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
      exec_.zero(pending_.data(), pending_.bytes());  // kNothingPending
      host_queue_ = GpuBuffer(bytes.host_queue, "host-tier ops");
      if (group_bin_bits(group_entries(n)) != 0) exec_.template reserve_bins<Ref>();
      scratch_ops_ = n;
    }
    return PassScratch{groups_.as<std::uint32_t>(), group_of_.as<std::uint32_t>(), conflicts_.as<std::uint64_t>(),
                       pending_.as<std::uint64_t>(), host_queue_.as<std::uint64_t>(), scratch_ops_};
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
           a.value_lens == b.value_lens && a.slot_words == b.slot_words;
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
