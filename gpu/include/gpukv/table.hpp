// gpukv::Table: a key-value table on a GPU (or, without one, on host threads) that executes batches of mixed
// GET / PUT / PUT_IF_ABSENT / DELETE operations in one pass.
//
//   gpukv::TableConfig config;           // key/value widths, capacity, ticket size, max load factor...
//   gpukv::Table table(config);          // picks the GPU when present (config.backend = kAuto)
//   table.execute(batch_in, batch_out);  // synchronous; results in batch order
//
// Semantics of a batch: operations on different keys run concurrently; operations on the same key take
// effect in batch order; every operation gets a status (types.hpp). A write that finds no room reports
// kFull and changes nothing; a malformed operation reports kInvalid and changes nothing.
//
// The algorithm, its invariants and the ticket-board layout are described in detail/engine.hpp and
// detail/ticket_board.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "gpukv/types.hpp"

namespace gpukv {

namespace detail {
class Backend;
}

// Host memory for batch columns, from Table::allocate_host(): pinned (page-locked) on the GPU backend, so that
// the table's copies run by DMA at full link speed and asynchronously; ordinary memory on the CPU backend.
// Zeroed, 8-byte aligned, owned; it may outlive the table.
class HostMemory {
 public:
  using Release = void (*)(void*);
  HostMemory() = default;
  HostMemory(std::uint8_t* data, std::size_t bytes, Release release) : data_(data, Free{release}), bytes_(bytes) {}
  std::uint8_t* data() const { return data_.get(); }
  std::size_t bytes() const { return bytes_; }

 private:
  struct Free {
    Release release;
    void operator()(std::uint8_t* p) const { release(p); }
  };
  std::unique_ptr<std::uint8_t, Free> data_{nullptr, Free{nullptr}};
  std::size_t bytes_ = 0;
};

class Table {
 public:
  // Throws Error: kInvalidArgument for a bad setting, kNoDevice if the GPU backend is asked for and none is
  // present, kOutOfMemory if the table does not fit.
  explicit Table(const TableConfig& config);
  // Checks the settings as the constructor does, building and allocating nothing: a server checks its flags
  // before it opens a port. Throws Error(kInvalidArgument) naming the setting and its bounds.
  static void check(const TableConfig& config);
  ~Table();
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;

  // Executes a batch held in host memory, of any size (batches beyond config.max_batch run as consecutive
  // passes, in order). Thread-safe: concurrent calls are serialised.
  void execute(const BatchIn& in, const BatchOut& out);

  // Host memory for batch columns that execute() copies fastest (see HostMemory). Throws Error(kOutOfMemory).
  HostMemory allocate_host(std::size_t bytes);
  // Starts copying a batch's input columns to the GPU ahead of the execute() that will run it, on a stream
  // of its own, so that the copy overlaps the batch running now: a server stages the next batch while one
  // runs. `in` must fit one pass (in.size <= config.max_batch; larger batches are not prefetched) and stay
  // unchanged until an execute() with the same columns has returned; that execute() then waits for the copy
  // instead of making it. Returns at once; thread-safe, also while execute() runs. The CPU backend has nothing
  // to copy and ignores it.
  void prefetch(const BatchIn& in);
  // As execute(), with every column in GPU memory (GPU backend only): for in-process GPU users and the
  // benchmark, which time the table without host-device copies.
  void execute_on_device(const BatchIn& in, const BatchOut& out);

  // Runs the tombstone clean-up now (it also runs automatically). Returns false if it could not get memory
  // or clean-up is held (hold_cleanup).
  bool cleanup();

  // Reading the table out, a range of slots at a time (a snapshot, streamed while batches keep running):
  // slot positions [0, slot_count()) cover the device tier's slots, then the host tier's.
  std::uint64_t slot_count() const;
  // Copies the live items of slot positions [from, from + slots) into `out`, host memory with room for
  // `slots` items (allocate_host's is copied into fastest), in no particular order; returns how many there
  // were. Runs between passes, like a batch: a scan taken in ranges lets batches run between them.
  std::size_t export_items(std::uint64_t from, std::uint64_t slots, const ItemColumns& out);
  // Clean-up moves keys between slots, so that a scan in ranges could miss a key or see it twice. While
  // held (hold_cleanup(true) once per hold_cleanup(false) to come), clean-up waits: a scan then sees every
  // key that no batch wrote or deleted meanwhile exactly once, with its value. Tombstones pile up meanwhile,
  // and are cleaned after the last hold ends.
  void hold_cleanup(bool hold);

  TableStats stats() const;
  BackendKind backend() const { return backend_; }
  std::string device_name() const;
  const TableConfig& config() const { return config_; }
  std::uint32_t value_stride() const { return gpukv::value_stride(config_.value_width); }

  // True if a CUDA device is usable by this build.
  static bool gpu_available();

 private:
  void run(const BatchIn& in, const BatchOut& out, bool on_device);

  TableConfig config_;
  BackendKind backend_;
  mutable std::mutex mutex_;  // serialises passes: batches take effect in call order
  std::unique_ptr<detail::Backend> impl_;
};

}  // namespace gpukv
