// Reading records (log_file.hpp's framing) from a file through a large buffer, shared by the log's reader
// and the snapshot's (a snapshot's blocks are records). Private to server/persistence.
#pragma once

#include <xxhash.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "log_io.hpp"

namespace gpukv::server::persistence::io {

// Reads a file sequentially through the page cache on a thread of its own, up to kAhead bytes past where its
// reader has reached, so that the reader's own reads find their pages there. The kernel's read-ahead
// (POSIX_FADV_SEQUENTIAL, and WILLNEED a few chunks ahead) kept the reader of a 15 GB snapshot at 0.9-1.1
// GB/s where the disk reads 1.3 GB/s, never held up by the applying (bench/RESULTS.md, run 45); with this
// thread it loads at 1.46-1.61 GB/s where dd reads 1.4-1.5 GB/s (run 46).
class ReadAhead {
 public:
  ReadAhead(int fd, std::uint64_t size) : fd_(fd), size_(size) {
    if (size_ > kStep) thread_ = std::thread([this] { run(); });  // a small file is read at once anyway
  }
  ~ReadAhead() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  ReadAhead(const ReadAhead&) = delete;
  ReadAhead& operator=(const ReadAhead&) = delete;

  // The reader has read up to `offset`.
  void reached(std::uint64_t offset) {
    {
      std::lock_guard lock(mutex_);
      reached_ = std::max(reached_, offset);
    }
    changed_.notify_all();
  }

 private:
  static constexpr std::uint64_t kStep = 8 << 20;
  static constexpr std::uint64_t kAhead = 256 << 20;

  void run() {
    std::string scratch(kStep, '\0');
    std::uint64_t at = 0;
    std::unique_lock lock(mutex_);
    while (at < size_) {
      changed_.wait(lock, [&] { return stop_ || at < reached_ + kAhead; });
      if (stop_) return;
      at = std::max(at, reached_);
      lock.unlock();
      const std::uint64_t n = std::min(kStep, size_ - at);
      const bool ok = read_at(fd_, at, scratch.data(), n);
      lock.lock();
      if (!ok) return;  // the reader's own read reports the error
      at += n;
    }
  }

  const int fd_;
  const std::uint64_t size_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::uint64_t reached_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

// A segment's bytes through a large buffer: records are read in place, with no read or allocation per record
// (which held replay to about 0.3 GB/s of log).
//
// The file is read ahead of the records by a thread of its own (ReadAhead), so that the disk reads while the
// caller checks and applies what it has.
class SegmentReader {
 public:
  SegmentReader(int fd, std::uint64_t size) : fd_(fd), size_(size), ahead_(fd, size) {}
  std::uint64_t size() const { return size_; }
  // The file's bytes [offset, offset + n), valid until the next call; empty (and `ok` false) past the end
  // or on a read error.
  std::string_view bytes(std::uint64_t offset, std::uint64_t n, bool* ok) {
    *ok = offset <= size_ && n <= size_ - offset;
    if (!*ok) return {};
    if (offset < start_ || offset + n > start_ + buffer_.size()) {
      const std::uint64_t take = std::min<std::uint64_t>(size_ - offset, std::max<std::uint64_t>(n, kChunk));
      // Bytes of the wanted stretch the buffer holds already (its tail) move to the front and are not read
      // again: a record that straddles the buffer's end is read once.
      std::uint64_t kept = 0;
      if (offset >= start_ && offset < start_ + buffer_.size()) {
        kept = start_ + buffer_.size() - offset;
        std::memmove(buffer_.data(), buffer_.data() + (offset - start_), kept);
      }
      buffer_.resize(take);
      start_ = offset;
      if (!read_at(fd_, offset + kept, buffer_.data() + kept, take - kept)) {
        buffer_.clear();
        *ok = false;
        return {};
      }
      ahead_.reached(offset + take);
    }
    return std::string_view(buffer_).substr(offset - start_, n);
  }

 private:
  static constexpr std::uint64_t kChunk = 16 << 20;
  const int fd_;
  const std::uint64_t size_;
  ReadAhead ahead_;
  std::string buffer_;
  std::uint64_t start_ = 0;
};

// A whole record at `offset`: its sequence number and payload (a view into the reader's buffer, valid until
// its next read), or why not.
struct RecordAt {
  std::uint64_t seq = 0;
  std::uint64_t length = 0;  // of the whole record
  std::string_view payload;
  std::string error;
};
inline RecordAt read_record(SegmentReader& in, std::uint64_t offset) {
  RecordAt r;
  bool ok = false;
  const std::string_view header = in.bytes(offset, kRecordHeaderBytes, &ok);
  if (!ok) {
    r.error = "a record header cut short";
    return r;
  }
  if (get_u32(header.data()) != kRecordMagic) {
    r.error = "no record starts here";
    return r;
  }
  const std::uint64_t payload_bytes = get_u64(header.data() + 8);
  const std::uint64_t seq = get_u64(header.data() + 16);
  const std::uint64_t room = in.size() - offset - kRecordHeaderBytes;  // for the payload and the checksum
  if (room < kRecordTrailerBytes || payload_bytes > room - kRecordTrailerBytes) {
    r.error = "a record of " + std::to_string(payload_bytes) + " payload bytes runs past the end of the file";
    return r;
  }
  // Length and sequence number, payload, checksum: contiguous in the file.
  const std::string_view body = in.bytes(offset + 8, 16 + payload_bytes + kRecordTrailerBytes, &ok);
  if (!ok) {
    r.error = "a record cut short";
    return r;
  }
  if (XXH3_64bits(body.data(), 16 + payload_bytes) != get_u64(body.data() + 16 + payload_bytes)) {
    r.error = "a record whose checksum does not match";
    return r;
  }
  r.seq = seq;
  r.length = kRecordHeaderBytes + payload_bytes + kRecordTrailerBytes;
  r.payload = body.substr(16, payload_bytes);
  return r;
}

// The offset of the first valid record after `offset`, if any: the rest of the file searched for the record
// magic a window at a time (a damaged 15 GB snapshot is not read into memory whole), each find checked.
inline std::optional<std::uint64_t> next_valid_record(int fd, std::uint64_t offset, std::uint64_t size) {
  constexpr std::uint64_t kWindow = 16 << 20;
  char magic[4];
  put_u32(magic, kRecordMagic);
  const std::string_view wanted(magic, 4);
  SegmentReader in(fd, size);
  std::string window;
  for (std::uint64_t from = offset + 1; from + 4 <= size; from += kWindow) {
    window.resize(std::min<std::uint64_t>(kWindow + 3, size - from));  // 3 more: a magic across the edge
    if (!read_at(fd, from, window.data(), window.size())) return std::nullopt;
    for (std::size_t at = window.find(wanted); at != std::string::npos && at < kWindow; at = window.find(wanted, at + 1)) {
      if (read_record(in, from + at).error.empty()) return from + at;
    }
  }
  return std::nullopt;
}

}  // namespace gpukv::server::persistence::io
