// The CPU backend: the table in host memory, every pass step run by a pool of host threads over the same
// per-operation code the GPU runs (the pool's primitives: cpu_executor.hpp). Included by cpu_backend_key*.cpp,
// one key width each.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <numeric>
#include <thread>
#include <vector>

#include "../backend.hpp"
#include "cpu_executor.hpp"
#include "host_buffer.hpp"
#include "thread_pool.hpp"

namespace gpukv::detail {
namespace cpu {

template <class Ref>
class CpuBackend final : public Backend {
 public:
  CpuBackend(const TableConfig& config, const Geometry& g)
      : config_(config),
        geometry_(g),
        pool_(config.cpu_threads),
        board_(g.device.board_bytes()),
        slots_(g.device.slot_bytes()),
        host_board_(g.host.board_bytes()),
        host_slots_(g.host.slot_bytes()),
        host_tags_(g.host.tag_bytes),
        exec_(pool_, &counters_),
        runner_(make_table_ref<Ref>(g, g.device, board_.as<std::uint64_t>(), slots_.data(), nullptr),
                make_table_ref<Ref>(g, g.host, host_board_.as<std::uint64_t>(), host_slots_.data(), host_tags_.data()),
                exec_, &counters_,
                limits_of(g.device), limits_of(g.host), HostPhase{config.order_host, config.host_phase_threads},
                // A table with slot words copies its values after the probing step, words with them
                // (Engine::store_slot_word).
                config.lanes, config.clstash_load,
                /*copy_lanes=*/config.slot_word ? 1 : 0) {}

  void execute(const BatchIn& in, const BatchOut& out, Memory memory) override {
    if (memory != Memory::kHost) throw Error(Error::Code::kInvalidArgument, "the CPU backend takes host memory only");
    const std::uint64_t pass_ops = config_.max_batch;
    const std::uint64_t first_pass = std::min<std::uint64_t>(in.size, pass_ops);
    runner_.run(make_batch_ref(config_, geometry_, in, out), scratch_for(first_pass), pass_ops);
  }
  HostMemory allocate_host(std::size_t bytes) override {
    void* p = std::calloc(std::max<std::size_t>(bytes, 1), 1);  // malloc's alignment (16) covers the 8 needed
    if (p == nullptr) throw Error(Error::Code::kOutOfMemory, "cannot allocate " + std::to_string(bytes) + " bytes of host memory");
    return HostMemory(static_cast<std::uint8_t*>(p), bytes, std::free);
  }
  bool cleanup() override { return runner_.cleanup(); }
  std::uint64_t slot_count() const override { return runner_.slot_count(); }
  std::uint64_t export_items(std::uint64_t from, std::uint64_t slots, const ItemColumns& out) override {
    return runner_.export_items(from, slots, out);
  }
  void hold_cleanup(bool hold) override { runner_.hold_cleanup(hold); }
  TableStats stats() const override { return make_stats(geometry_, runner_.counters(), runner_.stats()); }
  std::string device_name() const override {
    return "cpu (" + std::to_string(pool_.threads()) + " threads)";
  }

 private:
  TableConfig config_;
  Geometry geometry_;
  ThreadPool pool_;
  HostBuffer board_;
  HostBuffer slots_;
  // The host tier: on this backend the same kind of memory as the "device" tier, with the same logic.
  HostBuffer host_board_;
  HostBuffer host_slots_;
  HostBuffer host_tags_;
  HostBuffer groups_;
  HostBuffer group_of_;
  HostBuffer conflicts_;
  HostBuffer pending_;
  HostBuffer host_queue_;
  // Pass scratch, grown to the largest pass seen so far.
  PassScratch scratch_for(std::uint64_t n) {
    if (n > scratch_ops_) {
      const ScratchBytes bytes = scratch_bytes(n);
      groups_ = HostBuffer(bytes.groups);  // zeroed by the kernel: PassRunner clears only what a pass leaves behind
      group_of_ = HostBuffer(bytes.group_of);
      conflicts_ = HostBuffer(bytes.conflicts);
      pending_ = HostBuffer(bytes.pending);  // zeroed by the kernel: kNothingPending
      host_queue_ = HostBuffer(bytes.host_queue);
      scratch_ops_ = n;
    }
    return PassScratch{groups_.as<std::uint32_t>(), group_of_.as<std::uint32_t>(), conflicts_.as<std::uint64_t>(),
                       pending_.as<std::uint64_t>(), host_queue_.as<std::uint64_t>(), scratch_ops_};
  }

  Counters counters_{};
  CpuExecutor exec_;
  PassRunner<Ref, CpuExecutor> runner_;
  std::uint64_t scratch_ops_ = 0;
};

}  // namespace cpu

template <std::uint32_t KeyWords>
std::unique_ptr<Backend> make_cpu_backend_for(const TableConfig& config, const Geometry& geometry) {
  return with_table_type<KeyWords>(config, [&](auto ref) -> std::unique_ptr<Backend> {
    return std::make_unique<cpu::CpuBackend<decltype(ref)>>(config, geometry);
  });
}

}  // namespace gpukv::detail
