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
#include "record_reader.hpp"

namespace gpukv::server::persistence {

using namespace io;

std::string read_log(const std::filesystem::path& dir, LogShape shape, bool skip_corrupt, std::uint64_t from_seq,
                     const std::function<std::string(std::uint64_t seq, std::string_view payload)>& apply, LogReplay* replay) {
  const std::vector<SegmentFile> segments = list_segments(dir);
  // A segment's records end before the next segment's first, so segments whose successor starts at or
  // before from_seq hold nothing to replay (a snapshot covers them; they are removed once it is durable).
  std::size_t first = 0;
  while (first + 1 < segments.size() && segments[first + 1].first_seq <= from_seq) ++first;
  if (first < segments.size() && segments[first].first_seq > from_seq) {
    const std::string where = segments[first].path.string() + ": records " + std::to_string(from_seq) + " to " +
                              std::to_string(segments[first].first_seq - 1) +
                              " are missing (the log starts after them, and no snapshot covers them)";
    if (!skip_corrupt) return where;
    replay->skipped.push_back(where);
  }
  std::optional<std::uint64_t> expected;
  for (std::size_t i = first; i < segments.size(); ++i) {
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
    if (std::string error = other_widths(name, LogShape{get_u32(header + 12), get_u32(header + 16)}, shape); !error.empty()) {
      return error;
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
      if (r.seq >= from_seq) {
        if (std::string error = apply(r.seq, r.payload); !error.empty()) {
          return name + " at offset " + std::to_string(offset) + ", record " + std::to_string(r.seq) + ": " + error;
        }
        ++replay->records;
        replay->bytes += r.length;
      }
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
  replay->next_seq = std::max(expected.value_or(from_seq), from_seq);
  return {};
}

}  // namespace gpukv::server::persistence
