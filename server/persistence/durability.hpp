// A shard's data directory: what --data_dir, --wal and --snapshot_interval turn on. At start, the constructor
// takes the directory (one server at a time: a lock file), loads the newest snapshot into the table, replays
// the write-ahead log from where the snapshot ends, and opens a new log segment; then encode_batch(),
// append() and sync() are the batcher's BatchLog, logging each executed batch's successful writes before any
// of its calls is answered.
//
// Snapshots (snapshot_file.hpp) bound the log and the time a start takes. One is taken by a thread of its own
// every snapshot_interval, on request (request_snapshot, the admin RPC) and at shutdown (snapshot()):
//   1. the log moves to a new segment, which starts at sequence number S;
//   2. the table is read out a range of slots at a time (Table::export_items), with clean-up held, while
//      batches keep running between the ranges; each range is copied out of the GPU into a pinned buffer and
//      encoded into a block while the block before it is written (direct I/O, snapshot_file.hpp);
//   3. the file is made durable under its name, snapshot-S.snap; then older snapshots and the segments
//      before S are removed.
// A key no batch touched during the scan is read once, with its value. A key a batch wrote or deleted during
// the scan may be read with any value it had meanwhile, or missed, or read twice; every such batch ran after
// step 1 and is in the log from S on, whose replay over the snapshot leaves each key as its last write left
// it (logged writes are blind: PUT or DELETE). Without a log (--wal=off) a snapshot is all there is: a
// restart keeps what the last one read, and a clean shutdown takes one after the last call.
//
// Knows the table's API and files: no gRPC, no kernels.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gpukv/table.hpp"
#include "log_file.hpp"
#include "snapshot_file.hpp"

namespace gpukv::server::persistence {

enum class WalMode { kOff, kEverySecond, kEveryBatch };
// "off", "everysec" or "batch" (Redis' appendfsync no / everysec / always); throws std::invalid_argument.
WalMode parse_wal_mode(const std::string& text);
const char* to_string(WalMode mode);

struct DurabilityOptions {
  std::filesystem::path data_dir;  // empty: nothing is persisted
  WalMode wal = WalMode::kOff;
  bool recover_skip_corrupt = false;
  std::chrono::seconds snapshot_interval{0};  // 0: snapshots only on request and at shutdown
};

// What start-up recovered.
struct Recovery {
  SnapshotLoad snapshot;
  LogReplay log;
  std::uint64_t writes = 0;  // log operations replayed
  std::chrono::duration<double> took{};
  // Where the time went: decoding and applying on the applying thread (table_seconds of it running batches
  // on the table), and the reading thread held up waiting for it.
  double apply_seconds = 0;
  double table_seconds = 0;
  double read_waited_seconds = 0;
};

// What taking a snapshot did.
struct SnapshotResult {
  std::string error;  // empty: the snapshot is durable
  std::filesystem::path path;
  std::uint64_t items = 0;
  std::uint64_t bytes = 0;
  double seconds = 0;
  // Where the time went: reading ranges out of the table (batches wait meanwhile), encoding them into
  // blocks, writing the blocks (on a thread of its own, overlapped with the reading and encoding of the
  // next), and the final fsync.
  double table_seconds = 0;
  double encode_seconds = 0;
  double write_seconds = 0;
  double sync_seconds = 0;
};

// Observers for metrics and logs (each may be empty): bytes appended, an append that failed, an fdatasync's
// seconds; the loading's progress at start-up (snapshot items and log writes so far, bytes read, seconds
// since it began), about once a second while it runs; and each snapshot taken or failed.
struct DurabilityObservers {
  std::function<void(std::size_t bytes)> appended;
  std::function<void()> failed;
  std::function<void(double seconds)> synced;
  std::function<void(std::uint64_t writes, std::uint64_t bytes, double seconds)> replaying;
  std::function<void(const SnapshotResult&)> snapshotted;
};

class Durability {
 public:
  // Locks the directory (creating it if needed), loads its newest snapshot and replays its log into `table`
  // in order, opens the log for appends, and starts the snapshot thread. Throws std::runtime_error with the
  // file and offset on damage (unless skip_corrupt), a directory of other widths, a directory another server
  // holds, or a loaded write the table refuses (a table too small for the data).
  Durability(const DurabilityOptions& options, Table& table, DurabilityObservers observers);
  ~Durability();  // a snapshot in progress is abandoned (its temporary file removed)
  Durability(const Durability&) = delete;
  Durability& operator=(const Durability&) = delete;

  const Recovery& recovery() const { return recovery_; }

  // Takes a snapshot now, after any in progress, and returns when it is durable or has failed. Thread-safe.
  SnapshotResult snapshot();
  // Asks the snapshot thread for a snapshot that starts after this call; `done` runs on that thread with
  // its result. Returns at once.
  void request_snapshot(std::function<void(const SnapshotResult&)> done);
  // The batcher's BatchLog: encode_batch turns the batch's successful writes into a record's payload (empty
  // if it wrote nothing), append writes one, sync makes them durable as --wal says.
  void encode_batch(const BatchIn& in, const std::uint8_t* status, std::string* payload) const;
  std::string append(const std::string& payload);
  std::string sync();

 private:
  SnapshotResult take_snapshot();
  void snapshot_loop();

  const DurabilityOptions options_;
  Table& table_;
  const std::uint32_t key_width_;
  const std::uint32_t value_stride_;
  DurabilityObservers observers_;
  // DIR/LOCK, held (flock) for the server's life; closed however construction ends.
  struct LockFile {
    int fd = -1;
    ~LockFile();
  } lock_;
  Recovery recovery_;
  std::mutex log_mutex_;  // the log thread's appends and syncs against a snapshot's rotate
  std::unique_ptr<LogWriter> log_;

  std::mutex snapshot_mutex_;  // one snapshot at a time
  std::mutex requests_mutex_;  // guards requests_ and stop_
  std::condition_variable requests_changed_;
  std::vector<std::function<void(const SnapshotResult&)>> requests_;
  bool stop_ = false;
  std::atomic<bool> abandon_{false};  // the destructor stops a snapshot between ranges
  std::thread snapshotter_;
};

}  // namespace gpukv::server::persistence
