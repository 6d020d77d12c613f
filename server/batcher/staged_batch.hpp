// A device batch staged in the table's host memory, the calls whose rows it holds, and its lifecycle.
//
//   Free ──open──▶ Filling ──close──▶ Closed ──last copy done──▶ Ready ──▶ Running ─┬──────────────▶ Answering
//    ▲                                                                               └──▶ Logging ──┘      │
//    └──────────────────────────────────── last run of its rows answered ◀─────────────────────────────────┘
//
//   Free       in the batcher's free list
//   Filling    taking calls' rows (at most one batch at a time); copies into reserved rows may be in flight
//   Closed     takes no more rows; copies still in flight
//   Ready      closed and every row copied: the execution thread may run it (it runs batches in closing order)
//   Running    on the table (the execution thread owns it)
//   Logging    its writes going to the write-ahead log (the log thread owns it; with a log only)
//   Answering  its results being written into its calls and the calls completed, in runs of rows
//
// The batcher moves batches between states (batcher.cpp); this file holds what a batch is and what is done
// to its rows: copying a call's ops in, writing results out.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "batch_report.hpp"
#include "call.hpp"
#include "gpukv/batch.hpp"
#include "gpukv/table.hpp"

namespace gpukv::server {

// A call inside the batcher, from submit() to done().
struct CallState {
  Call call;
  Clock::time_point arrived;
  // Where reservation resumes for a call that spans batches (changed under the batcher's lock only).
  std::size_t next_op = 0;
  std::size_t key_offset = 0;
  std::size_t value_offset = 0;
  std::size_t write_index = 0;
  std::size_t get_index = 0;  // GETs before next_op: where its next GET's value slot is
  // Segments not yet answered, plus one until its last op has a row (or the rest of an expired call is
  // dropped). Whoever brings it to zero completes the call (answers it and deletes this state): a call
  // spanning batches may be answered on several threads at once, and is completed once, after all its
  // results are written.
  std::atomic<std::size_t> unanswered{1};
  // Its deadline passed before its first batch closed (set under the lock when a batch closes): none of its
  // rows run, and it is answered DEADLINE_EXCEEDED.
  bool expired = false;
  // A batch with some of its ops failed (set before that batch is answered): the call is completed with this
  // code and message, kInternal for the table, kUnavailable for the write-ahead log; the first failure wins.
  CallCode failure_code = CallCode::kOk;
  std::string failure;
  bool packed = false;  // its values were written packed (it was answered in one segment)
};

// A run of one call's ops in a batch, with where their bytes start in the call's columns.
struct Segment {
  CallState* call;
  std::size_t first_op;
  std::size_t count;
  std::size_t row;  // the batch row of first_op
  std::size_t key_offset;
  std::size_t value_offset;
  std::size_t write_index;
  std::size_t get_index;
  Clock::time_point deadline;  // the call's, here so that closing a batch reads no call
  bool expired = false;        // the call's deadline passed before it started: its rows are rejected, not run
};

enum class BatchState { kFree, kFilling, kClosed, kReady, kRunning, kLogging, kAnswering };
const char* to_string(BatchState state);

// A device batch's columns for up to n rows (a gpukv::Batch: the table's host memory, pinned on the GPU
// backend, so that the table copies them by DMA and can prefetch a closed batch while the previous one
// runs), plus which call each row answers.
class StagedBatch {
 public:
  // Kind byte of a row whose op failed validation: the table answers it kInvalid and changes nothing.
  static constexpr std::uint8_t kRejectedOp = 0xFF;

  StagedBatch(Table& table, std::size_t n) : rows_(table, n) {}

  BatchState state() const { return state_; }
  // Moves along one edge of the lifecycle above; any other move is a bug in the batcher, and aborts.
  void move_to(BatchState next);

  // Back to empty, as the batch leaves Free.
  void reset();

  // A batch without writes leaves out the value columns, and one without GETs the result values: the GPU
  // backend copies only the columns given.
  BatchIn in() const {
    BatchIn in = rows_.in(0, size);
    if (writes == 0) in.values = nullptr, in.value_lens = nullptr;
    return in;
  }
  BatchOut out() const {
    BatchOut out = rows_.out(0, size);
    if (gets == 0) out.values = nullptr, out.value_lens = nullptr;
    return out;
  }
  const std::uint8_t* status() const { return rows_.statuses(); }

  struct CopyCounts {
    std::size_t writes = 0, gets = 0;  // valid ops that write, and GETs
  };
  // Copies a run of one call's ops into its rows; a malformed op becomes a rejected row. Only the thread
  // that reserved the rows touches them, so no lock is needed.
  void copy_rows(const Segment& segment, CopyCounts& counts);
  // Rejects a segment's rows (its call expired before its first batch closed).
  void reject_rows(const Segment& segment);
  // Whether any of a segment's rows writes (PUT, PUT_IF_ABSENT or DELETE).
  bool writes_in(const Segment& segment) const;
  // Writes the results of a segment's rows into its call, and counts them by kind and status.
  void write_results(const Segment& segment, ResultCounts& counts) const;

  // Filled under the batcher's lock while Filling, read by the threads that run and answer it after.
  std::size_t size = 0;              // rows reserved
  std::size_t writes = 0, gets = 0;  // valid ops that write, and GETs, copied
  Clock::time_point oldest{};        // when the op in row 0 arrived
  Clock::duration stage_time{};      // copying, summed over the threads that copied
  std::vector<Segment> segments;
  std::size_t copies = 0;  // reservations whose rows are still being copied
  bool prefetched = false; // handed to Table::prefetch (Ready only)

  // After running: the table failed it, the record for the write-ahead log, when it ran, its report, and
  // the runs of rows still to answer.
  bool failed = false;
  std::string log_record;
  Clock::time_point executed{};
  BatchReport report;
  std::mutex report_mutex;  // answering threads add their counts to report.results
  std::atomic<std::size_t> jobs_left{0};

 private:
  BatchState state_ = BatchState::kFree;
  Batch rows_;
};

// Packs the GET values of a call answered in several segments, written at fixed slots (the g-th GET's at
// g * width), into op order with no gaps, as CallResults promises.
void pack_values(CallResults& r, const CallOps& ops, std::uint32_t width);

}  // namespace gpukv::server
