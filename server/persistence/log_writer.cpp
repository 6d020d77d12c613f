// LogWriter: appends records to a segment, with the sync policy's fdatasyncs (log_file.hpp).
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>

#include "log_file.hpp"
#include "log_io.hpp"

namespace gpukv::server::persistence {

using namespace io;

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
        // The fdatasync runs without the lock, which every write takes: a second's records can take over
        // 100 ms to reach the disk, and holding the lock meanwhile stalled the log thread for as long (a
        // p99.9 of 230-250 ms on an H100 host, bench/RESULTS.md run 47). A duplicate keeps the segment open
        // should a new one replace it meanwhile.
        const int fd = ::dup(state_->fd);
        const std::filesystem::path path = path_;
        lock.unlock();
        const auto start = std::chrono::steady_clock::now();
        std::string error;
        if (fd < 0 || ::fdatasync(fd) != 0) error = errno_text("cannot fdatasync", path);
        if (fd >= 0) ::close(fd);
        if (on_sync_) on_sync_(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        lock.lock();
        if (!error.empty()) {
          state_->sync_error = std::move(error);
          state_->dirty = true;
        } else {
          state_->sync_error.clear();
        }
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

std::string LogWriter::rotate(std::uint64_t* first_seq) {
  State& s = *state_;
  if (policy_ == SyncPolicy::kEverySecond) {
    std::lock_guard lock(s.mutex);
    if (s.fd >= 0 && s.dirty) {
      if (::fdatasync(s.fd) != 0) {
        s.sync_error = errno_text("cannot fdatasync", path_);  // what the background sync would have found
        return s.sync_error;
      }
      s.dirty = false;
    }
  } else if (s.synced_seq != next_seq_) {
    if (std::string error = sync(); !error.empty()) {
      failed_sync_ = error;  // the records the log thread wrote and has yet to sync are lost: its sync() says so
      return error;
    }
  }
  if (std::string error = open_segment(); !error.empty()) {
    s.new_segment_needed = true;
    return error;
  }
  *first_seq = next_seq_;
  return {};
}

std::string LogWriter::sync() {
  State& s = *state_;
  if (!failed_sync_.empty()) return std::exchange(failed_sync_, std::string());
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

}  // namespace gpukv::server::persistence
