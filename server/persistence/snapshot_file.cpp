// The snapshot file: its name, its writer and its reader (snapshot_file.hpp).
#include "snapshot_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <new>
#include <stdexcept>
#include <utility>

#include "log_io.hpp"
#include "record_reader.hpp"

namespace gpukv::server::persistence {

using namespace io;

namespace {

constexpr char kSnapshotMagic[8] = {'G', 'P', 'U', 'K', 'V', 'S', 'N', 'P'};

std::string encode_snapshot_header(LogShape shape, std::uint64_t log_start, std::uint64_t items, std::uint64_t blocks) {
  std::string h(kSnapshotHeaderBytes, '\0');
  std::memcpy(h.data(), kSnapshotMagic, 8);
  put_u32(h.data() + 8, kSnapshotVersion);
  put_u32(h.data() + 12, shape.key_width);
  put_u32(h.data() + 16, shape.value_width);
  put_u64(h.data() + 24, log_start);
  put_u64(h.data() + 32, items);
  put_u64(h.data() + 40, blocks);
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  put_u64(h.data() + 48, static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::seconds>(now).count()));
  put_u64(h.data() + 56, XXH3_64bits(h.data(), 56));
  return h;
}

}  // namespace

std::filesystem::path snapshot_path(const std::filesystem::path& dir, std::uint64_t log_start) {
  return numbered_path(dir, "snapshot-", log_start, ".snap");
}

std::vector<SnapshotFile> list_snapshots(const std::filesystem::path& dir) {
  std::vector<SnapshotFile> files;
  for (auto& [path, log_start] : list_numbered(dir, "snapshot-", ".snap")) files.push_back({std::move(path), log_start});
  return files;
}

std::uint8_t* BlockBuffer::reserve(std::size_t bytes) {
  if (bytes > capacity_) {
    void* p = nullptr;
    if (::posix_memalign(&p, kSnapshotAlign, align_snapshot(bytes)) != 0) throw std::bad_alloc();
    data_.reset(static_cast<std::uint8_t*>(p));
    capacity_ = align_snapshot(bytes);
  }
  return data_.get();
}

void BlockBuffer::Free::operator()(std::uint8_t* p) const { std::free(p); }

namespace {

// Writes all of `bytes` at `offset`. Direct I/O that the file system refuses (EINVAL) is turned off for the
// file and the write made through the page cache.
std::string pwrite_all(int fd, const std::uint8_t* bytes, std::size_t size, std::uint64_t offset, const std::filesystem::path& path) {
  while (size > 0) {
    const ssize_t n = ::pwrite(fd, bytes, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EINVAL && (::fcntl(fd, F_GETFL) & O_DIRECT) != 0) {
      if (::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_DIRECT) != 0) return errno_text("cannot write", path);
      continue;
    }
    if (n < 0) return errno_text("cannot write", path);
    bytes += n;
    size -= static_cast<std::size_t>(n);
    offset += static_cast<std::uint64_t>(n);
  }
  return {};
}

}  // namespace

SnapshotWriter::SnapshotWriter(std::filesystem::path dir, LogShape shape, std::uint64_t log_start)
    : dir_(std::move(dir)),
      shape_(shape),
      log_start_(log_start),
      path_(snapshot_path(dir_, log_start)),
      temp_(path_.string() + ".tmp") {
  const int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
  fd_ = ::open(temp_.c_str(), flags | O_DIRECT, 0644);
  if (fd_ < 0 && errno == EINVAL) fd_ = ::open(temp_.c_str(), flags, 0644);  // a file system without direct I/O
  if (fd_ < 0) throw std::runtime_error(errno_text("cannot create", temp_));
}

SnapshotWriter::~SnapshotWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!finished_) ::unlink(temp_.c_str());
}

std::size_t SnapshotWriter::block_room(std::size_t payload_bytes, std::size_t slack) {
  return align_snapshot(kPayloadOffset + payload_bytes + std::max(slack, kRecordTrailerBytes));
}

SnapshotWriter::Sealed SnapshotWriter::seal_block(std::uint8_t* block, std::size_t payload_bytes, std::uint64_t items) {
  char* b = reinterpret_cast<char*>(block);
  put_u32(b, kRecordMagic);
  put_u32(b + 4, 0);
  put_u64(b + 8, payload_bytes);
  put_u64(b + 16, blocks_);
  const std::size_t end = kRecordHeaderBytes + payload_bytes;
  put_u64(b + end, XXH3_64bits(b + 8, 16 + payload_bytes));
  const std::size_t bytes = align_snapshot(end + kRecordTrailerBytes);
  std::memset(b + end + kRecordTrailerBytes, 0, bytes - end - kRecordTrailerBytes);
  const Sealed sealed{block, bytes, bytes_};
  ++blocks_;
  items_ += items;
  bytes_ += bytes;
  return sealed;
}

std::string SnapshotWriter::write_block(const Sealed& block) {
  return pwrite_all(fd_, block.data, block.bytes, block.offset, temp_);
}

std::string SnapshotWriter::finish() {
  BlockBuffer buffer;
  std::uint8_t* header = buffer.reserve(kSnapshotAlign);
  std::memset(header, 0, kSnapshotAlign);
  const std::string h = encode_snapshot_header(shape_, log_start_, items_, blocks_);
  std::memcpy(header, h.data(), h.size());
  if (std::string error = pwrite_all(fd_, header, kSnapshotAlign, 0, temp_); !error.empty()) return error;
  if (::fsync(fd_) != 0) return errno_text("cannot fsync", temp_);
  if (::close(std::exchange(fd_, -1)) != 0) return errno_text("cannot close", temp_);
  if (::rename(temp_.c_str(), path_.c_str()) != 0) return errno_text("cannot rename to", path_);
  finished_ = true;
  return sync_directory(dir_);
}

std::string read_snapshot(const SnapshotFile& file, LogShape shape, bool skip_corrupt,
                          const std::function<std::string(std::string_view payload)>& apply, SnapshotLoad* load) {
  const std::string name = file.path.string();
  load->path = file.path;
  const int fd = ::open(file.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno_text("cannot open", file.path);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return errno_text("cannot stat", file.path);
  const auto size = static_cast<std::uint64_t>(st.st_size);
  char header[kSnapshotHeaderBytes];
  if (size < kSnapshotHeaderBytes || !read_at(fd, 0, header, sizeof header) || std::memcmp(header, kSnapshotMagic, 8) != 0 ||
      XXH3_64bits(header, 56) != get_u64(header + 56)) {
    return name + " at offset 0: not a gpukv snapshot, or its header is damaged";
  }
  if (get_u32(header + 8) != kSnapshotVersion) {
    return name + " at offset 8: snapshot format version " + std::to_string(get_u32(header + 8)) + ", this server reads version " +
           std::to_string(kSnapshotVersion);
  }
  if (std::string error = other_widths(name, LogShape{get_u32(header + 12), get_u32(header + 16)}, shape); !error.empty()) {
    return error;
  }
  load->log_start = get_u64(header + 24);
  if (load->log_start != file.log_start) return name + " at offset 24: its header names another log start than its name";
  const std::uint64_t items = get_u64(header + 32), blocks = get_u64(header + 40);

  SegmentReader in(fd, size);
  std::uint64_t offset = kSnapshotAlign, expected = 0, found_items = 0;
  const auto damaged = [&](const std::string& where) -> bool {
    if (!skip_corrupt) return false;
    load->skipped.push_back(where);
    return true;
  };
  while (offset < size) {
    RecordAt r = read_record(in, offset);
    if (r.error.empty() && r.seq != expected) r.error = "block " + std::to_string(r.seq) + " where " + std::to_string(expected) + " was due";
    if (!r.error.empty()) {
      const std::string where = name + " at offset " + std::to_string(offset) + ": " + r.error;
      if (!damaged(where)) return where + " (--recover_skip_corrupt passes over damaged blocks, losing their items)";
      const std::optional<std::uint64_t> later = next_valid_record(fd, offset, size);
      if (!later) return {};  // nothing valid after the damage: what was read is what there is
      offset = *later;
      expected = read_record(in, offset).seq;
      continue;
    }
    if (std::string error = apply(r.payload); !error.empty()) {
      return name + " at offset " + std::to_string(offset) + ", block " + std::to_string(r.seq) + ": " + error;
    }
    found_items += r.payload.size() >= 4 ? get_u32(r.payload.data()) : 0;
    load->bytes += r.length;
    offset = align_snapshot(offset + r.length);
    ++expected;
  }
  load->items = found_items;
  if (offset != size) {
    const std::string where = name + " at offset " + std::to_string(size) + ": the file ends where no block does (it was cut short)";
    if (!damaged(where)) return where;
  } else if (expected != blocks || found_items != items) {
    const std::string where = name + " at offset " + std::to_string(size) + ": the file ends after " + std::to_string(expected) +
                              " blocks holding " + std::to_string(found_items) + " items, its header promises " +
                              std::to_string(blocks) + " blocks holding " + std::to_string(items);
    if (!damaged(where)) return where;
  }
  return {};
}

}  // namespace gpukv::server::persistence
