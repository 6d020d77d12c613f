// read_log: replays the segments of a data directory in order, telling a torn last record from damage
// (log_file.hpp).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <limits>
#include <optional>

#include "log_file.hpp"
#include "log_io.hpp"

namespace gpukv::server::persistence {
namespace {

using namespace io;

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
