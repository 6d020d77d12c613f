// Durability's snapshots: taking one while the table serves, and the thread that takes them on schedule and
// on request (durability.hpp describes the procedure and what it promises).
#include <algorithm>
#include <future>
#include <stdexcept>

#include "batch_record.hpp"
#include "durability.hpp"
#include "gpukv/batch.hpp"

namespace gpukv::server::persistence {
namespace {

// Bytes of items one range of the scan copies out: a range runs between batches, as a batch does, so it is
// kept short (about a millisecond of copying from the GPU). A snapshot holds one such buffer and two blocks
// of about the same size in host memory.
constexpr std::uint64_t kRangeBytes = 16 << 20;

// One range's items in host memory (pinned on the GPU backend, so the copy out runs at full speed): the
// input columns of a gpukv::Batch, laid out as export_items writes them.
class ItemBuffer {
 public:
  ItemBuffer(Table& table, std::uint64_t rows)
      : rows_(table, rows), columns_{rows_.keys(), rows_.key_lens(), rows_.values(), rows_.value_lens()} {}
  const ItemColumns& columns() const { return columns_; }

 private:
  Batch rows_;
  ItemColumns columns_;
};

// Clean-up held for a scan's life (Table::hold_cleanup).
class CleanupHold {
 public:
  explicit CleanupHold(Table& table) : table_(table) { table_.hold_cleanup(true); }
  ~CleanupHold() { table_.hold_cleanup(false); }
  CleanupHold(const CleanupHold&) = delete;
  CleanupHold& operator=(const CleanupHold&) = delete;

 private:
  Table& table_;
};

}  // namespace

SnapshotResult Durability::snapshot() {
  std::lock_guard one(snapshot_mutex_);
  return take_snapshot();
}

void Durability::request_snapshot(std::function<void(const SnapshotResult&)> done) {
  {
    std::lock_guard lock(requests_mutex_);
    requests_.push_back(std::move(done));
  }
  requests_changed_.notify_all();
}

void Durability::snapshot_loop() {
  const auto interval = options_.snapshot_interval;
  auto due = std::chrono::steady_clock::now() + interval;
  std::unique_lock lock(requests_mutex_);
  while (!stop_) {
    const auto woken = [&] { return stop_ || !requests_.empty(); };
    if (interval.count() > 0) {
      requests_changed_.wait_until(lock, due, woken);
    } else {
      requests_changed_.wait(lock, woken);
    }
    if (stop_) break;
    if (requests_.empty() && std::chrono::steady_clock::now() < due) continue;
    // Every request made before this snapshot starts is answered by it.
    std::vector<std::function<void(const SnapshotResult&)>> answering;
    answering.swap(requests_);
    lock.unlock();
    const SnapshotResult result = snapshot();
    for (const auto& done : answering) done(result);
    lock.lock();
    due = std::chrono::steady_clock::now() + interval;
  }
  SnapshotResult stopped;
  stopped.error = "the server is stopping";
  for (const auto& done : requests_) done(stopped);
}

SnapshotResult Durability::take_snapshot() {
  const auto start = std::chrono::steady_clock::now();
  SnapshotResult result;
  const auto finish = [&](std::string error) {
    result.error = std::move(error);
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (observers_.snapshotted) observers_.snapshotted(result);
    return result;
  };
  // 1. Every batch logged from here on lies at or after log_start.
  std::uint64_t log_start = recovery_.log.next_seq;  // without a log, nothing is appended after start-up
  if (log_) {
    std::lock_guard lock(log_mutex_);
    if (std::string error = log_->rotate(&log_start); !error.empty()) return finish("cannot start a new log segment: " + error);
  }
  // 2. The scan, with clean-up held so that untouched keys stay where they are.
  const TableConfig& config = table_.config();
  const LogShape shape{config.key_width, config.value_width};
  std::unique_ptr<SnapshotWriter> writer;
  try {
    writer = std::make_unique<SnapshotWriter>(options_.data_dir, shape, log_start);
  } catch (const std::exception& e) {
    return finish(e.what());
  }
  const CleanupHold hold(table_);
  const std::uint32_t stride = table_.value_stride();
  const std::uint64_t row_bytes = config.key_width + 1 + stride + 4;
  const std::uint64_t slots = table_.slot_count();
  const std::uint64_t range = std::min(slots, std::max<std::uint64_t>(1024, kRangeBytes / row_bytes));
  std::unique_ptr<ItemBuffer> items;
  BlockBuffer blocks[2];
  try {
    items = std::make_unique<ItemBuffer>(table_, range);
  } catch (const std::exception& e) {
    return finish(std::string("no memory for the snapshot's buffers: ") + e.what());
  }
  // A block is a batch record of PUTs: the same kind and status on every row.
  const std::vector<std::uint8_t> puts(range, static_cast<std::uint8_t>(OpKind::kPut));
  const std::vector<std::uint8_t> stored(range, static_cast<std::uint8_t>(OpStatus::kOk));
  const auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  // Range k is read out of the table and encoded into one block buffer while block k - 1 is written from the
  // other.
  std::future<std::string> writing;
  std::string error;
  int next = 0;
  for (std::uint64_t from = 0; from < slots && error.empty(); from += range) {
    if (abandon_) {
      error = "the server is stopping";
      break;
    }
    const ItemColumns& c = items->columns();
    std::size_t n = 0;
    auto begin = std::chrono::steady_clock::now();
    try {
      n = table_.export_items(from, range, c);
    } catch (const std::exception& e) {
      error = std::string("reading the table out: ") + e.what();
      break;
    }
    result.table_seconds += since(begin);
    if (n == 0) continue;
    begin = std::chrono::steady_clock::now();
    const BatchIn in{n, puts.data(), c.keys, c.key_lens, c.values, c.value_lens};
    const EncodedSize size = measure_writes(in, stored.data());
    std::uint8_t* block = nullptr;
    try {
      block = blocks[next].reserve(SnapshotWriter::block_room(size.bytes(), pack_slack(config.key_width, stride)));
    } catch (const std::bad_alloc&) {
      error = "no memory for a block of " + std::to_string(size.bytes()) + " bytes";
      break;
    }
    pack_writes(in, stored.data(), config.key_width, stride, size, block + SnapshotWriter::kPayloadOffset);
    const SnapshotWriter::Sealed sealed = writer->seal_block(block, size.bytes(), n);
    result.encode_seconds += since(begin);
    if (writing.valid()) error = writing.get();
    if (!error.empty()) break;
    writing = std::async(std::launch::async, [&, sealed] {
      const auto start = std::chrono::steady_clock::now();
      std::string e = writer->write_block(sealed);
      result.write_seconds += since(start);  // one write at a time: the futures order these
      return e;
    });
    next ^= 1;
  }
  if (writing.valid()) {
    std::string last = writing.get();
    if (error.empty()) error = std::move(last);
  }
  const auto syncing = std::chrono::steady_clock::now();
  if (error.empty()) error = writer->finish();
  result.sync_seconds = since(syncing);
  if (!error.empty()) return finish(error);
  result.path = writer->path();
  result.items = writer->items();
  result.bytes = writer->bytes();
  // 3. The snapshot is durable: what it supersedes can go. A failure here leaves files a later snapshot
  // removes; start-up skips them.
  std::error_code ec;
  for (const SnapshotFile& old : list_snapshots(options_.data_dir)) {
    if (old.log_start < log_start) std::filesystem::remove(old.path, ec);
  }
  const std::vector<SegmentFile> segments = list_segments(options_.data_dir);
  for (std::size_t i = 0; i + 1 < segments.size() && segments[i + 1].first_seq <= log_start; ++i) {
    std::filesystem::remove(segments[i].path, ec);
  }
  static_cast<void>(sync_directory(options_.data_dir));
  return finish({});
}

}  // namespace gpukv::server::persistence
