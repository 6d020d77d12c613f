#include "durability.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "batch_record.hpp"

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

// Replays one record's writes into the table, in max_batch pieces (a log written with a larger batch size
// than this server's), in order. Returns an error message, or empty.
std::string replay_writes(Table& table, const DecodedWrites& writes, HostMemory& columns, std::size_t rows) {
  const TableConfig& config = table.config();
  const std::uint32_t stride = table.value_stride();
  // The column block: ops | key_lens | status | value_lens | keys | values, each 8-byte aligned.
  const auto align = [](std::size_t n) { return (n + 7) / 8 * 8; };
  std::uint8_t* ops = columns.data();
  std::uint8_t* key_lens = ops + align(rows);
  std::uint8_t* status = key_lens + align(rows);
  auto* value_lens = reinterpret_cast<std::uint32_t*>(status + align(rows));
  std::uint8_t* keys = reinterpret_cast<std::uint8_t*>(value_lens) + align(rows * 4);
  std::uint8_t* values = keys + align(rows * config.key_width);
  // Expanded in pieces: a piece's rows are the record's next `n` writes.
  DecodedWrites rest = writes;
  while (rest.count > 0) {
    const std::size_t n = std::min(rest.count, rows);
    DecodedWrites piece = rest;
    piece.count = n;
    expand_writes(piece, config.key_width, stride, ops, key_lens, keys, value_lens, values);
    table.execute(BatchIn{n, ops, keys, key_lens, values, value_lens}, BatchOut{status, nullptr, nullptr});
    for (std::size_t i = 0; i < n; ++i) {
      const auto s = static_cast<OpStatus>(status[i]);
      if (ops[i] == static_cast<std::uint8_t>(OpKind::kPut) && s != OpStatus::kOk) {
        return std::string("the table refused a logged write (") + (s == OpStatus::kFull ? "FULL" : "status " + std::to_string(status[i])) +
               "): it is smaller than the data this directory holds; start with the --capacity (and --host_capacity) it was "
               "written with";
      }
    }
    // Advance past the piece: its kinds, key lengths, keys, and its puts' value lengths and values.
    std::size_t key_bytes = 0, puts = 0, value_bytes = 0;
    for (std::size_t i = 0; i < n; ++i) {
      key_bytes += rest.key_lengths[i];
      if (rest.kinds[i] == static_cast<std::uint8_t>(OpKind::kPut)) value_bytes += value_lens[i], ++puts;
    }
    rest.count -= n;
    rest.puts -= puts;
    rest.kinds += n;
    rest.key_lengths += n;
    rest.value_lengths += 4 * puts;
    rest.keys += key_bytes;
    rest.values += value_bytes;
  }
  return {};
}

}  // namespace

Durability::Durability(const DurabilityOptions& options, Table& table, DurabilityObservers observers)
    : options_(options), key_width_(table.config().key_width), value_stride_(table.value_stride()), observers_(std::move(observers)) {
  const auto start = std::chrono::steady_clock::now();
  std::error_code ec;
  std::filesystem::create_directories(options_.data_dir, ec);
  if (ec) throw std::runtime_error("cannot create --data_dir " + options_.data_dir.string() + ": " + ec.message());
  const std::filesystem::path lock_path = options_.data_dir / "LOCK";
  lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0) throw std::runtime_error("cannot open " + lock_path.string() + ": " + std::strerror(errno));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(lock_fd_);
    throw std::runtime_error("--data_dir " + options_.data_dir.string() + " is in use by another gpukv-server (" + lock_path.string() +
                             " is locked)");
  }

  const LogShape shape{table.config().key_width, table.config().value_width};
  const std::size_t rows = table.config().max_batch;
  const auto align = [](std::size_t n) { return (n + 7) / 8 * 8; };
  HostMemory columns = table.allocate_host(3 * align(rows) + align(rows * 4) + align(rows * table.config().key_width) +
                                           align(rows * table.value_stride()));
  const std::string error = read_log(
      options_.data_dir, shape, options_.recover_skip_corrupt,
      [&](std::uint64_t, std::string_view payload) {
        DecodedWrites writes;
        if (std::string bad = decode_writes(payload, shape.key_width, shape.value_width, &writes); !bad.empty()) return bad;
        recovery_.writes += writes.count;
        return replay_writes(table, writes, columns, rows);
      },
      &recovery_.log);
  if (!error.empty()) {
    ::close(lock_fd_);
    throw std::runtime_error("recovering --data_dir " + options_.data_dir.string() + ": " + error);
  }
  recovery_.took = std::chrono::steady_clock::now() - start;
  if (options_.wal != WalMode::kOff) {
    log_ = std::make_unique<LogWriter>(options_.data_dir, shape, recovery_.log.next_seq,
                                       options_.wal == WalMode::kEveryBatch ? SyncPolicy::kEveryBatch : SyncPolicy::kEverySecond);
    if (observers_.synced) log_->on_sync(observers_.synced);
  }
}

Durability::~Durability() {
  log_.reset();  // its last fdatasync
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

std::string Durability::log_batch(const BatchIn& in, const std::uint8_t* status) {
  if (!log_) return {};
  payload_.clear();
  if (encode_writes(in, status, key_width_, value_stride_, payload_) == 0) return {};
  std::string error = log_->append(payload_);
  if (!error.empty()) {
    if (observers_.failed) observers_.failed();
    return error;
  }
  if (observers_.appended) observers_.appended(payload_.size() + kRecordHeaderBytes + kRecordTrailerBytes);
  return {};
}

}  // namespace gpukv::server::persistence
