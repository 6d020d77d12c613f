#include "durability.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "apply_thread.hpp"
#include "batch_record.hpp"
#include "gpukv/batch.hpp"

namespace gpukv::server::persistence {

WalMode parse_wal_mode(const std::string& text) {
  if (text == "off") return WalMode::kOff;
  if (text == "everysec") return WalMode::kEverySecond;
  if (text == "batch") return WalMode::kEveryBatch;
  throw std::invalid_argument("--wal must be off, everysec or batch, got '" + text + "'");
}

const char* to_string(WalMode mode) {
  switch (mode) {
    case WalMode::kOff: return "off";
    case WalMode::kEverySecond: return "everysec";
    case WalMode::kEveryBatch: return "batch";
  }
  return "?";
}

namespace {

// Replays records into the table in batches of up to max_batch rows: consecutive records share a batch (a
// record holds one server batch's writes, often far fewer than max_batch, and each table batch has a fixed
// cost), and a record larger than a batch (a log written with a larger batch size) is split. Rows keep the
// log's order, and ops on one key take effect in batch order, so the table ends as the writes left it.
class Replayer {
 public:
  explicit Replayer(Table& table)
      : table_(table), rows_(table.config().max_batch), key_width_(table.config().key_width), stride_(table.value_stride()),
        batch_(table, rows_) {}

  // Adds a record's writes; runs a batch whenever one fills. Returns an error message, or empty.
  std::string add(DecodedWrites writes) {
    while (writes.count > 0) {
      if (pending_ == rows_) {
        if (std::string error = flush(); !error.empty()) return error;
      }
      DecodedWrites piece = writes;
      piece.count = std::min(writes.count, rows_ - pending_);
      expand_writes(piece, key_width_, stride_, batch_.ops() + pending_, batch_.key_lens() + pending_,
                    batch_.keys() + pending_ * key_width_, batch_.value_lens() + pending_, batch_.values() + pending_ * stride_);
      // Past the piece in the record: its kinds, key lengths and keys, and its puts' value lengths and values.
      std::size_t key_bytes = 0, puts = 0, value_bytes = 0;
      for (std::size_t i = 0; i < piece.count; ++i) {
        key_bytes += batch_.key_lens()[pending_ + i];
        if (batch_.ops()[pending_ + i] == static_cast<std::uint8_t>(OpKind::kPut)) {
          ++puts;
          value_bytes += batch_.value_lens()[pending_ + i];
        }
      }
      pending_ += piece.count;
      writes.count -= piece.count;
      writes.puts -= puts;
      writes.kinds += piece.count;
      writes.key_lengths += piece.count;
      writes.value_lengths += 4 * puts;
      writes.keys += key_bytes;
      writes.values += value_bytes;
    }
    return {};
  }

  // Runs the rows added since the last batch.
  std::string flush() {
    if (pending_ == 0) return {};
    const auto start = std::chrono::steady_clock::now();
    BatchOut out = batch_.out(0, pending_);
    out.values = nullptr;  // writes only: no values come back
    out.value_lens = nullptr;
    table_.execute(batch_.in(0, pending_), out);
    table_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (std::size_t i = 0; i < pending_; ++i) {
      const OpStatus s = batch_.status(i);
      if (batch_.ops()[i] == static_cast<std::uint8_t>(OpKind::kPut) && s != OpStatus::kOk) {
        return std::string("the table refused a logged write (") +
               (s == OpStatus::kFull ? "FULL" : "status " + std::to_string(static_cast<int>(s))) +
               "): it is smaller than the data this directory holds; start with the --capacity (and --host_capacity) it was "
               "written with";
      }
    }
    pending_ = 0;
    return {};
  }

  double table_seconds() const { return table_seconds_; }

 private:
  Table& table_;
  const std::size_t rows_;
  const std::uint32_t key_width_, stride_;
  Batch batch_;  // the rows of the next table batch
  std::size_t pending_ = 0;
  double table_seconds_ = 0;
};

}  // namespace

namespace {

// Temporary files a crash left behind (a snapshot or a segment being created): never whole, never read.
void remove_temporary_files(const std::filesystem::path& dir) {
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    const bool ours = name.rfind("snapshot-", 0) == 0 || name.rfind("wal-", 0) == 0;
    if (ours && name.size() > 4 && name.substr(name.size() - 4) == ".tmp") std::filesystem::remove(entry.path());
  }
}

}  // namespace

Durability::Durability(const DurabilityOptions& options, Table& table, DurabilityObservers observers)
    : options_(options),
      table_(table),
      key_width_(table.config().key_width),
      value_stride_(table.value_stride()),
      observers_(std::move(observers)) {
  const auto start = std::chrono::steady_clock::now();
  std::error_code ec;
  std::filesystem::create_directories(options_.data_dir, ec);
  if (ec) throw std::runtime_error("cannot create --data_dir " + options_.data_dir.string() + ": " + ec.message());
  const std::filesystem::path lock_path = options_.data_dir / "LOCK";
  lock_.fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_.fd < 0) throw std::runtime_error("cannot open " + lock_path.string() + ": " + std::strerror(errno));
  if (::flock(lock_.fd, LOCK_EX | LOCK_NB) != 0) {
    throw std::runtime_error("--data_dir " + options_.data_dir.string() + " is in use by another gpukv-server (" + lock_path.string() +
                             " is locked)");
  }
  remove_temporary_files(options_.data_dir);

  const LogShape shape{table.config().key_width, table.config().value_width};
  Replayer replayer(table);
  auto reported = start;
  std::uint64_t loaded = 0, bytes = 0;  // writes handed to the table and file bytes read, snapshot and log
  // Decodes one payload (a snapshot block or a log record) into the replayer, on the applying thread.
  ApplyThread applier([&](std::string_view payload) -> std::string {
    DecodedWrites writes;
    if (std::string bad = decode_writes(payload, shape.key_width, shape.value_width, &writes); !bad.empty()) return bad;
    loaded += writes.count;
    bytes += payload.size() + kRecordHeaderBytes + kRecordTrailerBytes;
    if (const auto now = std::chrono::steady_clock::now(); observers_.replaying && now - reported >= std::chrono::seconds(1)) {
      reported = now;
      observers_.replaying(loaded, bytes, std::chrono::duration<double>(now - start).count());
    }
    return replayer.add(writes);
  });
  // A failed apply stops the reading; its reason is the error to report.
  const auto fail = [&](const std::string& error) {
    std::string applied = applier.finish();
    throw std::runtime_error("recovering --data_dir " + options_.data_dir.string() + ": " + (applied.empty() ? error : applied));
  };
  // The newest snapshot only: the log before it is gone once it is durable, so an older one cannot stand in.
  const std::vector<SnapshotFile> snapshots = list_snapshots(options_.data_dir);
  if (!snapshots.empty()) {
    std::uint64_t block = 0;
    std::string error = read_snapshot(
        snapshots.back(), shape, options_.recover_skip_corrupt,
        [&](std::string_view payload) { return applier.submit(payload, snapshots.back().path.string() + ", block " + std::to_string(block++)); },
        &recovery_.snapshot);
    if (!error.empty()) fail(error);
  }
  std::string error = read_log(
      options_.data_dir, shape, options_.recover_skip_corrupt, recovery_.snapshot.log_start,
      [&](std::uint64_t seq, std::string_view payload) { return applier.submit(payload, "log record " + std::to_string(seq)); },
      &recovery_.log);
  if (!error.empty()) fail(error);
  if (error = applier.finish(); !error.empty()) fail(error);
  if (error = replayer.flush(); !error.empty()) fail(error);
  recovery_.writes = loaded - recovery_.snapshot.items;
  recovery_.apply_seconds = applier.busy_seconds();
  recovery_.table_seconds = replayer.table_seconds();
  recovery_.read_waited_seconds = applier.waited_seconds();
  recovery_.took = std::chrono::steady_clock::now() - start;
  if (options_.wal != WalMode::kOff) {
    log_ = std::make_unique<LogWriter>(options_.data_dir, shape, recovery_.log.next_seq,
                                       options_.wal == WalMode::kEveryBatch ? SyncPolicy::kEveryBatch : SyncPolicy::kEverySecond);
    if (observers_.synced) log_->on_sync(observers_.synced);
  }
  snapshotter_ = std::thread([this] { snapshot_loop(); });
}

Durability::~Durability() {
  {
    std::lock_guard lock(requests_mutex_);
    stop_ = true;
  }
  abandon_ = true;
  requests_changed_.notify_all();
  snapshotter_.join();
  log_.reset();  // its last fdatasync, then the lock
}

Durability::LockFile::~LockFile() {
  if (fd >= 0) ::close(fd);
}

void Durability::encode_batch(const BatchIn& in, const std::uint8_t* status, std::string* payload) const {
  payload->clear();
  if (log_) encode_writes(in, status, key_width_, value_stride_, *payload);
}

std::string Durability::append(const std::string& payload) {
  if (!log_ || payload.empty()) return {};
  std::lock_guard lock(log_mutex_);
  std::string error = log_->write(payload);
  if (!error.empty()) {
    if (observers_.failed) observers_.failed();
    return error;
  }
  if (observers_.appended) observers_.appended(payload.size() + kRecordHeaderBytes + kRecordTrailerBytes);
  return {};
}

std::string Durability::sync() {
  if (!log_) return {};
  std::lock_guard lock(log_mutex_);
  std::string error = log_->sync();
  if (!error.empty() && observers_.failed) observers_.failed();
  return error;
}

}  // namespace gpukv::server::persistence
