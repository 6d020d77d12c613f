// A snapshot on disk: every live item of the table as of its scan, in checksummed blocks.
//
// data_dir/snapshot-<log start, 16 hex digits>.snap, where the log start is the sequence number of the
// first log record the snapshot may not hold: start-up loads the newest snapshot, then replays the log from
// there. Layout (integers little-endian):
//
//   header (64 bytes): "GPUKVSNP" | u32 version | u32 key width | u32 value width | u32 0 | u64 log start |
//                      u64 items | u64 blocks | u64 unix seconds when written | u64 XXH3-64 of the 56 bytes before;
//                      zeros to 4096 bytes
//   blocks:            log records (log_file.hpp's framing: magic, payload length, number, payload, XXH3-64),
//                      numbered 0, 1, ...; each payload is a batch record (batch_record.hpp) of PUTs; each block
//                      starts at a multiple of 4096 bytes, zeros between the end of one and the start of the next
//   the file ends at the multiple of 4096 after the last block
//
// A block is a log record so that one framing, one checksum and one loader serve both files: loading a
// snapshot is replaying PUT records. Blocks are aligned so that each is written from its own buffer with
// direct I/O (O_DIRECT, where the file system has it): through the page cache, copying 15 GB into it held a
// snapshot to 0.7 GB/s on a disk that writes 1.4 GB/s (bench/RESULTS.md, run 42). The file is written under a
// temporary name, its header last, fsynced, renamed and its directory fsynced: a snapshot that exists under
// its name is whole, and damage found in it later is reported with the file's name and the offset.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "log_file.hpp"

namespace gpukv::server::persistence {

inline constexpr std::uint32_t kSnapshotVersion = 1;
inline constexpr std::size_t kSnapshotHeaderBytes = 64;
inline constexpr std::size_t kSnapshotAlign = 4096;  // of the header's room, of each block and of the file's end

constexpr std::uint64_t align_snapshot(std::uint64_t bytes) { return (bytes + kSnapshotAlign - 1) / kSnapshotAlign * kSnapshotAlign; }

// Memory for one block, aligned for direct I/O and grown on demand (what it held is not kept).
class BlockBuffer {
 public:
  std::uint8_t* reserve(std::size_t bytes);

 private:
  struct Free {
    void operator()(std::uint8_t* p) const;
  };
  std::unique_ptr<std::uint8_t, Free> data_;
  std::size_t capacity_ = 0;
};

struct SnapshotFile {
  std::filesystem::path path;
  std::uint64_t log_start = 0;
};
// The snapshots under `dir`, oldest first (by log start).
std::vector<SnapshotFile> list_snapshots(const std::filesystem::path& dir);
std::filesystem::path snapshot_path(const std::filesystem::path& dir, std::uint64_t log_start);

// Writes one snapshot, a block at a time: each block's payload is put in a buffer where the writer frames it
// (seal_block), then written (write_block), which may run on another thread while the next is sealed.
class SnapshotWriter {
 public:
  // Creates the temporary file. Throws std::runtime_error naming it if it cannot.
  SnapshotWriter(std::filesystem::path dir, LogShape shape, std::uint64_t log_start);
  ~SnapshotWriter();  // an unfinished snapshot's temporary file is removed
  SnapshotWriter(const SnapshotWriter&) = delete;
  SnapshotWriter& operator=(const SnapshotWriter&) = delete;

  // A block's payload starts kPayloadOffset bytes into its buffer, which needs block_room(payload bytes,
  // bytes the caller writes past the payload) bytes.
  static constexpr std::size_t kPayloadOffset = kRecordHeaderBytes;
  static std::size_t block_room(std::size_t payload_bytes, std::size_t slack);
  struct Sealed {
    const std::uint8_t* data;
    std::size_t bytes;  // a multiple of kSnapshotAlign
    std::uint64_t offset;
  };
  // Frames the payload in `block` as the next block, holding `items` PUTs: the record's header before it,
  // its checksum and zeros to the alignment after it.
  Sealed seal_block(std::uint8_t* block, std::size_t payload_bytes, std::uint64_t items);
  // Writes a sealed block at its place. Returns an error message, or empty.
  std::string write_block(const Sealed& block);
  // Writes the header, fsyncs, renames to the final name and fsyncs the directory. Returns an error message
  // (the snapshot then does not exist), or empty. After every write_block has returned.
  std::string finish();

  const std::filesystem::path& path() const { return path_; }
  std::uint64_t items() const { return items_; }
  std::uint64_t bytes() const { return bytes_; }

 private:
  const std::filesystem::path dir_;
  const LogShape shape_;
  const std::uint64_t log_start_;
  const std::filesystem::path path_, temp_;
  int fd_ = -1;
  std::uint64_t items_ = 0, blocks_ = 0, bytes_ = kSnapshotAlign;
  bool finished_ = false;
};

// What loading a snapshot found.
struct SnapshotLoad {
  std::filesystem::path path;  // empty: there was none
  std::uint64_t log_start = 1;  // where the log's replay starts
  std::uint64_t items = 0;      // PUTs handed over
  std::uint64_t bytes = 0;
  std::vector<std::string> skipped;  // damage passed over with skip_corrupt, each "file at offset N: why"
};

// Reads the snapshot `file` and hands each block's payload to `apply` (which returns an error message, or
// empty). Returns an error naming the file and offset (another version or widths, a damaged header or
// block, blocks missing, bytes past the last block, `apply`'s error), or empty. With skip_corrupt, a damaged
// block is reported in `load->skipped` and passed over.
std::string read_snapshot(const SnapshotFile& file, LogShape shape, bool skip_corrupt,
                          const std::function<std::string(std::string_view payload)>& apply, SnapshotLoad* load);

}  // namespace gpukv::server::persistence
