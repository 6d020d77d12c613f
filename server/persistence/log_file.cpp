#include "log_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

namespace gpukv::server::persistence {
namespace {

constexpr char kSegmentMagic[8] = {'G', 'P', 'U', 'K', 'V', 'L', 'O', 'G'};

void put_u32(char* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
void put_u64(char* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
std::uint32_t get_u32(const char* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(static_cast<std::uint8_t>(p[i])) << (8 * i);
  return v;
}
std::uint64_t get_u64(const char* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(static_cast<std::uint8_t>(p[i])) << (8 * i);
  return v;
}

std::string errno_text(const std::string& what, const std::filesystem::path& path) {
  return what + " " + path.string() + ": " + std::strerror(errno);
}

std::string encode_header(LogShape shape, std::uint64_t first_seq) {
  std::string h(kSegmentHeaderBytes, '\0');
  std::memcpy(h.data(), kSegmentMagic, 8);
  put_u32(h.data() + 8, kLogVersion);
  put_u32(h.data() + 12, shape.key_width);
  put_u32(h.data() + 16, shape.value_width);
  put_u64(h.data() + 24, first_seq);
  put_u64(h.data() + 32, XXH3_64bits(h.data(), 32));
  return h;
}

// Writes all of `bytes`, or returns an error message.
std::string write_all(int fd, std::string_view bytes, const std::filesystem::path& path) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_text("cannot write", path);
    }
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return {};
}

// Reads exactly `size` bytes at `offset`; false on a short read or an error.
bool read_at(int fd, std::uint64_t offset, char* out, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::pread(fd, out, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    out += n;
    size -= static_cast<std::size_t>(n);
    offset += static_cast<std::uint64_t>(n);
  }
  return true;
}

// A segment's bytes through a large buffer: records are read in place, with no read or allocation per record
// (which held replay to about 0.3 GB/s of log).
class SegmentReader {
 public:
  SegmentReader(int fd, std::uint64_t size) : fd_(fd), size_(size) {}
  std::uint64_t size() const { return size_; }
  // The file's bytes [offset, offset + n), valid until the next call; empty (and `ok` false) past the end
  // or on a read error.
  std::string_view bytes(std::uint64_t offset, std::uint64_t n, bool* ok) {
    *ok = offset <= size_ && n <= size_ - offset;
    if (!*ok) return {};
    if (offset < start_ || offset + n > start_ + buffer_.size()) {
      const std::uint64_t take = std::min<std::uint64_t>(size_ - offset, std::max<std::uint64_t>(n, kChunk));
      buffer_.resize(take);
      start_ = offset;
      if (!read_at(fd_, offset, buffer_.data(), take)) {
        buffer_.clear();
        *ok = false;
        return {};
      }
    }
    return std::string_view(buffer_).substr(offset - start_, n);
  }

 private:
  static constexpr std::uint64_t kChunk = 16 << 20;
  const int fd_;
  const std::uint64_t size_;
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
RecordAt read_record(SegmentReader& in, std::uint64_t offset) {
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

// The offset of the first valid record after `offset`, if any.
std::optional<std::uint64_t> next_valid_record(int fd, std::uint64_t offset, std::uint64_t size) {
  char magic[4];
  put_u32(magic, kRecordMagic);
  std::string rest(size - offset, '\0');
  if (!read_at(fd, offset, rest.data(), rest.size())) return std::nullopt;
  SegmentReader in(fd, size);
  for (std::size_t at = rest.find(std::string_view(magic, 4), 1); at != std::string::npos; at = rest.find(std::string_view(magic, 4), at + 1)) {
    if (read_record(in, offset + at).error.empty()) return offset + at;
  }
  return std::nullopt;
}

}  // namespace

std::filesystem::path segment_path(const std::filesystem::path& dir, std::uint64_t first_seq) {
  char name[32];
  std::snprintf(name, sizeof name, "wal-%016llx.log", static_cast<unsigned long long>(first_seq));
  return dir / name;
}

std::vector<SegmentFile> list_segments(const std::filesystem::path& dir) {
  std::vector<SegmentFile> segments;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.size() != 24 || name.rfind("wal-", 0) != 0 || name.substr(20) != ".log") continue;
    const std::string hex = name.substr(4, 16);
    if (hex.find_first_not_of("0123456789abcdef") != std::string::npos) continue;
    segments.push_back({entry.path(), std::stoull(hex, nullptr, 16)});
  }
  std::sort(segments.begin(), segments.end(), [](const SegmentFile& a, const SegmentFile& b) { return a.first_seq < b.first_seq; });
  return segments;
}

std::string encode_record(std::uint64_t seq, std::string_view payload) {
  std::string r(kRecordHeaderBytes + payload.size() + kRecordTrailerBytes, '\0');
  put_u32(r.data(), kRecordMagic);
  put_u64(r.data() + 8, payload.size());
  put_u64(r.data() + 16, seq);
  std::memcpy(r.data() + kRecordHeaderBytes, payload.data(), payload.size());
  put_u64(r.data() + kRecordHeaderBytes + payload.size(), XXH3_64bits(r.data() + 8, 16 + payload.size()));
  return r;
}

std::string sync_directory(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno_text("cannot open directory", dir);
  const bool ok = ::fsync(fd) == 0;
  const std::string error = ok ? std::string() : errno_text("cannot fsync directory", dir);
  ::close(fd);
  return error;
}

// The open segment, and with kEverySecond the thread that syncs it. mutex guards fd and sync_error against
// that thread; the appending thread alone touches the rest.
struct LogWriter::State {
  std::mutex mutex;
  std::condition_variable wake;
  int fd = -1;
  std::uint64_t end = 0;           // bytes of whole records (and the header) in the open segment
  bool cut_needed = false;         // a failed write may have left part of a record past `end`
  bool new_segment_needed = true;  // none open yet, or the last fdatasync failed
  bool dirty = false;              // written since the last sync
  bool stop = false;
  std::string sync_error;          // the background sync's failure, until a sync succeeds
  std::uint64_t synced_seq = 0;    // kEveryBatch: the records before this number are on disk
  std::thread syncer;
};

LogWriter::LogWriter(std::filesystem::path dir, LogShape shape, std::uint64_t first_seq, SyncPolicy policy)
    : dir_(std::move(dir)), shape_(shape), policy_(policy), next_seq_(first_seq), state_(std::make_unique<State>()) {
  if (std::string error = open_segment(); !error.empty()) throw std::runtime_error(error);
  if (policy_ == SyncPolicy::kEverySecond) {
    state_->syncer = std::thread([this] {
      std::unique_lock lock(state_->mutex);
      while (!state_->stop) {
        state_->wake.wait_for(lock, std::chrono::seconds(1), [&] { return state_->stop; });
        if (!state_->dirty || state_->fd < 0) continue;
        state_->dirty = false;
        const auto start = std::chrono::steady_clock::now();
        if (::fdatasync(state_->fd) != 0) {
          state_->sync_error = errno_text("cannot fdatasync", path_);
          state_->dirty = true;
        } else {
          state_->sync_error.clear();
        }
        if (on_sync_) on_sync_(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
    });
  }
}

LogWriter::~LogWriter() {
  {
    std::lock_guard lock(state_->mutex);
    state_->stop = true;
  }
  state_->wake.notify_all();
  if (state_->syncer.joinable()) state_->syncer.join();
  if (state_->fd >= 0) {
    ::fdatasync(state_->fd);
    ::close(state_->fd);
  }
}

std::string LogWriter::open_segment() {
  const std::filesystem::path final_path = segment_path(dir_, next_seq_);
  const std::filesystem::path temp = final_path.string() + ".tmp";
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_text("cannot create", temp);
  std::string error = write_all(fd, encode_header(shape_, next_seq_), temp);
  if (error.empty() && ::fsync(fd) != 0) error = errno_text("cannot fsync", temp);
  if (error.empty() && ::rename(temp.c_str(), final_path.c_str()) != 0) error = errno_text("cannot rename to", final_path);
  if (error.empty()) error = sync_directory(dir_);
  if (!error.empty()) {
    ::close(fd);
    ::unlink(temp.c_str());
    return error;
  }
  std::lock_guard lock(state_->mutex);
  if (state_->fd >= 0) ::close(state_->fd);  // its records are synced, or its failed sync is why we are here
  state_->fd = fd;
  state_->end = kSegmentHeaderBytes;
  state_->cut_needed = false;
  state_->new_segment_needed = false;
  state_->dirty = false;
  state_->sync_error.clear();
  state_->synced_seq = next_seq_;
  path_ = final_path;
  return {};
}

std::string LogWriter::sync_now() {
  const auto start = std::chrono::steady_clock::now();
  if (::fdatasync(state_->fd) != 0) return errno_text("cannot fdatasync", path_);
  if (on_sync_) on_sync_(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return {};
}

std::string LogWriter::write(std::string_view payload) {
  State& s = *state_;
  if (policy_ == SyncPolicy::kEverySecond) {
    std::lock_guard lock(s.mutex);
    if (!s.sync_error.empty()) {
      s.new_segment_needed = true;  // what the failed sync left on disk is unknown: go on in a new file
      return s.sync_error;
    }
  }
  if (s.new_segment_needed) {
    if (std::string error = open_segment(); !error.empty()) return error;
  }
  if (s.cut_needed) {
    if (::ftruncate(s.fd, static_cast<off_t>(s.end)) != 0) return errno_text("cannot cut a partly written record from", path_);
    if (::lseek(s.fd, static_cast<off_t>(s.end), SEEK_SET) < 0) return errno_text("cannot seek in", path_);
    s.cut_needed = false;
  }
  const std::string record = encode_record(next_seq_, payload);
  if (std::string error = write_all(s.fd, record, path_); !error.empty()) {
    s.cut_needed = true;
    return error;
  }
  if (policy_ == SyncPolicy::kEverySecond) {
    std::lock_guard lock(s.mutex);
    s.dirty = true;
  }
  s.end += record.size();
  ++next_seq_;
  return {};
}

std::string LogWriter::sync() {
  State& s = *state_;
  if (policy_ == SyncPolicy::kEverySecond) {
    std::lock_guard lock(s.mutex);
    return s.sync_error;
  }
  if (s.synced_seq == next_seq_) return {};
  if (std::string error = sync_now(); !error.empty()) {
    // Whether the records since the last sync are on disk is unknown: the next segment starts at the first
    // of them, which supersedes them (read_log reads no segment past the next one's first number).
    next_seq_ = s.synced_seq;
    s.new_segment_needed = true;
    return error;
  }
  s.synced_seq = next_seq_;
  return {};
}

std::string LogWriter::append(std::string_view payload) {
  if (std::string error = write(payload); !error.empty()) return error;
  return policy_ == SyncPolicy::kEveryBatch ? sync() : std::string();
}

std::string read_log(const std::filesystem::path& dir, LogShape shape, bool skip_corrupt,
                     const std::function<std::string(std::uint64_t seq, std::string_view payload)>& apply, LogReplay* replay) {
  const std::vector<SegmentFile> segments = list_segments(dir);
  std::optional<std::uint64_t> expected;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const SegmentFile& segment = segments[i];
    const bool newest = i + 1 == segments.size();
    // Records from the next segment's first number on were superseded: the writer moved to a new segment
    // after failing to make them durable, so none of them was acknowledged.
    const std::uint64_t limit = newest ? std::numeric_limits<std::uint64_t>::max() : segments[i + 1].first_seq;
    const std::string name = segment.path.string();
    const int fd = ::open(segment.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno_text("cannot open", segment.path);
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd};
    struct stat st {};
    if (::fstat(fd, &st) != 0) return errno_text("cannot stat", segment.path);
    const auto size = static_cast<std::uint64_t>(st.st_size);
    char header[kSegmentHeaderBytes];
    if (size < kSegmentHeaderBytes || !read_at(fd, 0, header, sizeof header) || std::memcmp(header, kSegmentMagic, 8) != 0 ||
        XXH3_64bits(header, 32) != get_u64(header + 32)) {
      return name + " at offset 0: not a gpukv log segment, or its header is damaged";
    }
    if (get_u32(header + 8) != kLogVersion) {
      return name + " at offset 8: log format version " + std::to_string(get_u32(header + 8)) + ", this server reads version " +
             std::to_string(kLogVersion);
    }
    const LogShape written{get_u32(header + 12), get_u32(header + 16)};
    if (written.key_width != shape.key_width || written.value_width != shape.value_width) {
      return name + " was written with key width " + std::to_string(written.key_width) + " and value width " +
             std::to_string(written.value_width) + "; this server has key width " + std::to_string(shape.key_width) +
             " and value width " + std::to_string(shape.value_width) + " (start it with those, or with another --data_dir)";
    }
    if (get_u64(header + 24) != segment.first_seq) return name + " at offset 24: its header names another first record";
    if (expected && segment.first_seq > *expected) {
      return name + ": records " + std::to_string(*expected) + " to " + std::to_string(segment.first_seq - 1) + " are missing";
    }
    expected = segment.first_seq;
    ++replay->segments;
    SegmentReader in(fd, size);
    std::uint64_t offset = kSegmentHeaderBytes;
    while (offset < size && *expected < limit) {
      RecordAt r = read_record(in, offset);
      // A whole record out of order is damage wherever it is; only a broken record can be a torn write.
      const bool out_of_order = r.error.empty() && r.seq != *expected;
      if (out_of_order) r.error = "record " + std::to_string(r.seq) + " where " + std::to_string(*expected) + " was due";
      if (!r.error.empty()) {
        const std::optional<std::uint64_t> later = next_valid_record(fd, offset, size);
        if (newest && !later && !out_of_order) {
          // A torn last write: never acknowledged. Cut it off, so that appends never follow it.
          replay->torn = name + " at offset " + std::to_string(offset) + ", " + std::to_string(size - offset) + " bytes";
          const int wfd = ::open(segment.path.c_str(), O_WRONLY | O_CLOEXEC);
          if (wfd < 0 || ::ftruncate(wfd, static_cast<off_t>(offset)) != 0 || ::fsync(wfd) != 0) {
            const std::string error = errno_text("cannot cut the torn record from", segment.path);
            if (wfd >= 0) ::close(wfd);
            return error;
          }
          ::close(wfd);
          break;
        }
        const std::string where = name + " at offset " + std::to_string(offset) + ": " + r.error;
        if (!skip_corrupt) return where + " (--recover_skip_corrupt passes over damaged records, losing them)";
        replay->skipped.push_back(where);
        if (!later) break;
        offset = *later;
        expected = read_record(in, offset).seq;
        continue;
      }
      if (r.seq >= limit) break;
      if (std::string error = apply(r.seq, r.payload); !error.empty()) {
        return name + " at offset " + std::to_string(offset) + ", record " + std::to_string(r.seq) + ": " + error;
      }
      ++replay->records;
      replay->bytes += r.length;
      offset += r.length;
      expected = r.seq + 1;
    }
    if (!newest && *expected < limit) {
      const std::string where = name + ": records " + std::to_string(*expected) + " to " + std::to_string(limit - 1) +
                                " are missing (this segment ends before them, the next starts after them)";
      if (!skip_corrupt) return where;
      replay->skipped.push_back(where);
    }
    if (!newest) expected = limit;
  }
  replay->next_seq = expected.value_or(1);
  return {};
}

}  // namespace gpukv::server::persistence
