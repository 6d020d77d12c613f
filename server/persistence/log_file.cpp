// The log's layout on disk: segment names and listing, records, and the directory fsync (log_file.hpp).
#include "log_file.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdio>

#include "log_io.hpp"

namespace gpukv::server::persistence {

using namespace io;

std::filesystem::path segment_path(const std::filesystem::path& dir, std::uint64_t first_seq) {
  return numbered_path(dir, "wal-", first_seq, ".log");
}

std::vector<SegmentFile> list_segments(const std::filesystem::path& dir) {
  std::vector<SegmentFile> segments;
  for (auto& [path, first_seq] : list_numbered(dir, "wal-", ".log")) segments.push_back({std::move(path), first_seq});
  return segments;
}

std::string encode_record(std::uint64_t seq, std::string_view payload) {
  std::string r;
  r.reserve(kRecordHeaderBytes + payload.size() + kRecordTrailerBytes);
  r.assign(kRecordHeaderBytes, '\0');
  r.append(payload);
  seal_record(seq, r);
  return r;
}

void seal_record(std::uint64_t seq, std::string& record) {
  const std::size_t payload = record.size() - kRecordHeaderBytes;
  put_u32(record.data(), kRecordMagic);
  put_u32(record.data() + 4, 0);
  put_u64(record.data() + 8, payload);
  put_u64(record.data() + 16, seq);
  char checksum[kRecordTrailerBytes];
  put_u64(checksum, XXH3_64bits(record.data() + 8, 16 + payload));
  record.append(checksum, kRecordTrailerBytes);
}

std::string sync_directory(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno_text("cannot open directory", dir);
  const bool ok = ::fsync(fd) == 0;
  const std::string error = ok ? std::string() : errno_text("cannot fsync directory", dir);
  ::close(fd);
  return error;
}

}  // namespace gpukv::server::persistence
