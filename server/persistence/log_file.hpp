// The write-ahead log on disk: numbered segment files of checksummed records, and the two sides that use
// them, a writer with an fsync policy and a reader that recovers what was written.
//
// A segment is data_dir/wal-<first sequence number, 16 hex digits>.log:
//
//   header (40 bytes): "GPUKVLOG" | u32 version | u32 key width | u32 value width | u32 0 |
//                      u64 first sequence number | u64 XXH3-64 of the 32 bytes before it
//   record:            u32 kRecordMagic | u32 0 | u64 payload length | u64 sequence number | payload |
//                      u64 XXH3-64 of the record from its payload length to the end of its payload
//                                                                               (integers little-endian)
//
// Sequence numbers run on without a gap from one record to the next and from one segment to the next, so
// that a lost record or segment is found, not skipped. The checksum comes last: a record cut short by a crash
// (the process or the machine died mid-write) has none, and was never acknowledged. The reader tells such a
// torn tail from damage in the middle by looking for a valid record after the bad one: only at the newest
// segment's end, with nothing valid after it, is a bad record a torn write, which it drops (and cuts from the
// file, so that appends never follow it); anywhere else it stops with the file's name and the offset.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace gpukv::server::persistence {

inline constexpr std::uint32_t kLogVersion = 1;
inline constexpr std::uint32_t kRecordMagic = 0x4C564B47;  // "GKVL"
inline constexpr std::size_t kSegmentHeaderBytes = 40;
inline constexpr std::size_t kRecordHeaderBytes = 24;
inline constexpr std::size_t kRecordTrailerBytes = 8;

// What a segment is for: the table widths its payloads were written with.
struct LogShape {
  std::uint32_t key_width = 0;
  std::uint32_t value_width = 0;
};

// The segments under `dir`, oldest first (by first sequence number); files of other names are ignored.
struct SegmentFile {
  std::filesystem::path path;
  std::uint64_t first_seq = 0;
};
std::vector<SegmentFile> list_segments(const std::filesystem::path& dir);
std::filesystem::path segment_path(const std::filesystem::path& dir, std::uint64_t first_seq);

// Encodes one record, ready to write.
std::string encode_record(std::uint64_t seq, std::string_view payload);
// The same in place: `record` holds kRecordHeaderBytes of room, then the payload; fills the header and appends
// the checksum (a large payload is not copied).
void seal_record(std::uint64_t seq, std::string& record);

enum class SyncPolicy {
  kEverySecond,  // records are written at once; a background thread fdatasyncs the segment once a second
  kEveryBatch,   // append() returns once its record is on disk (fdatasync): group commit, one per batch
};

// Appends records to a new segment. Not thread-safe: one execution thread appends.
class LogWriter {
 public:
  // Creates the segment for `first_seq` (written under a temporary name with its header, fsynced, renamed,
  // and the directory fsynced). Throws std::runtime_error naming the file if it cannot.
  LogWriter(std::filesystem::path dir, LogShape shape, std::uint64_t first_seq, SyncPolicy policy);
  ~LogWriter();  // a last fdatasync
  LogWriter(const LogWriter&) = delete;
  LogWriter& operator=(const LogWriter&) = delete;

  // Writes one record with the next sequence number (not yet synced with kEveryBatch). On a failure (no
  // space, an I/O error) returns a message, and the record is not in the log: a partly written one is cut
  // off before the next write. Writes after a failure try again, so the log works again once space
  // returns. With kEverySecond, a failure of the background fdatasync is returned by the writes that follow
  // it until one succeeds (and the next write opens a new segment).
  std::string write(std::string_view payload);
  // kEveryBatch: makes every record written so far durable (one fdatasync for all of them: group commit).
  // On a failure, whose effect the kernel does not tell, returns a message, and the records since the last
  // sync count as not written: the next write opens a new segment that starts at the first of them, and
  // read_log ignores them in the old one. kEverySecond: returns the background fdatasync's failure, if any.
  std::string sync();
  // write() then, with kEveryBatch, sync().
  std::string append(std::string_view payload);

  // Ends the open segment and opens the next, which starts at next_seq(), so that every record written
  // later lies in it or after (a snapshot's starting point; the older segments go once it is durable). The
  // old segment's records are made durable first: an unsynced record must not be left torn in a segment
  // that is no longer the newest. Returns next_seq() in `first_seq`, or a message; a failed sync of records
  // a kEveryBatch writer has not synced yet is also the next sync()'s failure (they count as not written).
  std::string rotate(std::uint64_t* first_seq);

  std::uint64_t next_seq() const { return next_seq_; }
  // Seconds each fdatasync took, for a latency histogram: set once, before the first append.
  void on_sync(std::function<void(double seconds)> observe) { on_sync_ = std::move(observe); }

 private:
  struct State;
  std::string open_segment();
  std::string sync_now();

  const std::filesystem::path dir_;
  const LogShape shape_;
  const SyncPolicy policy_;
  std::filesystem::path path_;
  std::uint64_t next_seq_;
  std::function<void(double)> on_sync_;
  std::string failed_sync_;  // a rotate()'s failed sync of records not yet synced, for the next sync()
  std::unique_ptr<State> state_;
};

// What reading the log found.
struct LogReplay {
  std::size_t segments = 0;
  std::uint64_t records = 0;
  std::uint64_t bytes = 0;     // of valid records
  std::uint64_t next_seq = 1;  // the sequence number the next record takes
  std::string torn;            // where a torn last record was dropped ("file at offset N, M bytes"), or empty
  std::vector<std::string> skipped;  // damage passed over with skip_corrupt, each "file at offset N: why"
};

// Reads the segments under `dir` in order and hands each valid record from `from_seq` on (the first record a
// snapshot does not hold; 1 without one) to `apply` (which returns an error message, or empty). Returns an
// error message naming the file and offset (a segment of other widths or version, damage before the newest
// segment's end, a gap in the sequence numbers or before from_seq, or `apply`'s error), or empty. With
// `skip_corrupt`, damage is reported in `replay->skipped` and the reader goes on at the next valid record
// instead. A torn last record is dropped and cut from its file.
std::string read_log(const std::filesystem::path& dir, LogShape shape, bool skip_corrupt, std::uint64_t from_seq,
                     const std::function<std::string(std::uint64_t seq, std::string_view payload)>& apply, LogReplay* replay);

// fsyncs a directory, so that a file created, renamed or removed in it stays so after a crash.
std::string sync_directory(const std::filesystem::path& dir);

}  // namespace gpukv::server::persistence
