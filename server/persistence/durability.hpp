// A shard's data directory: what --data_dir and --wal turn on. At start, open() takes the directory (one
// server at a time: a lock file), replays the write-ahead log into the table, and opens a new log segment;
// then encode_batch(), append() and sync() are the batcher's BatchLog, logging each executed batch's
// successful writes before any of its calls is answered.
//
// Knows the table's API and files: no gRPC, no kernels.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "gpukv/table.hpp"
#include "log_file.hpp"

namespace gpukv::server::persistence {

enum class WalMode { kOff, kEverySecond, kEveryBatch };
// "off", "everysec" or "batch" (Redis' appendfsync no / everysec / always); throws std::invalid_argument.
WalMode parse_wal_mode(const std::string& text);
const char* to_string(WalMode mode);

struct DurabilityOptions {
  std::filesystem::path data_dir;  // empty: nothing is persisted
  WalMode wal = WalMode::kOff;
  bool recover_skip_corrupt = false;
};

// What start-up recovered.
struct Recovery {
  LogReplay log;
  std::uint64_t writes = 0;  // operations replayed
  std::chrono::duration<double> took{};
};

// Observers for metrics and logs (each may be empty): bytes appended, an append that failed, an fdatasync's
// seconds; and the replay's progress at start-up (writes and log bytes so far, seconds since it began),
// about once a second while it runs.
struct DurabilityObservers {
  std::function<void(std::size_t bytes)> appended;
  std::function<void()> failed;
  std::function<void(double seconds)> synced;
  std::function<void(std::uint64_t writes, std::uint64_t bytes, double seconds)> replaying;
};

class Durability {
 public:
  // Locks the directory (creating it if needed), replays its log into `table` in order, and opens the log
  // for appends. Throws std::runtime_error with the file and offset on damage (unless skip_corrupt), a
  // directory of other widths, a directory another server holds, or a replayed write the table refuses (a
  // table too small for the data).
  Durability(const DurabilityOptions& options, Table& table, DurabilityObservers observers);
  ~Durability();
  Durability(const Durability&) = delete;
  Durability& operator=(const Durability&) = delete;

  const Recovery& recovery() const { return recovery_; }
  // The batcher's BatchLog: encode_batch turns the batch's successful writes into a record's payload (empty
  // if it wrote nothing), append writes one, sync makes them durable as --wal says.
  void encode_batch(const BatchIn& in, const std::uint8_t* status, std::string* payload) const;
  std::string append(const std::string& payload);
  std::string sync();

 private:
  const DurabilityOptions options_;
  const std::uint32_t key_width_;
  const std::uint32_t value_stride_;
  DurabilityObservers observers_;
  // DIR/LOCK, held (flock) for the server's life; closed however construction ends.
  struct LockFile {
    int fd = -1;
    ~LockFile();
  } lock_;
  Recovery recovery_;
  std::unique_ptr<LogWriter> log_;
};

}  // namespace gpukv::server::persistence
