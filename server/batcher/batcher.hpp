// The batcher: gathers the operations of every client call into fixed-size device batches and runs them on
// the table, keeping the order in which calls arrived (so operations on one key keep their order).
//
//   submit() ──▶ [filling batch] ──closed──▶ [closed batches, in order] ──▶ execution thread ──▶ answering
//        └──▶ queue (bounded) ──▶ staging thread ──┘                                        (results, done())
//
// Three batches in the table's host memory (pinned on the GPU backend): one fills while one runs and the
// one before it is answered. A call that arrives with nothing queued ahead of it and a batch filling
// reserves its rows and copies its packed columns into them on the caller's own thread (large calls
// outside the lock, so copies of different calls overlap): a batch is ready the moment it is closed.
// Otherwise (no batch free, or calls queued ahead) the call waits in the queue, and the staging thread moves
// queued calls into the next batch as one frees up. A batch is closed when full (by whichever thread fills
// it), when its oldest operation has waited max_delay (decide_batch, on the staging thread), or, with
// launch_when_idle, as soon as the table has nothing else to run (by the caller that finds it idle, or by
// the execution thread when the batch before ends). The thread that finishes a closed batch's
// last copy hands it to Table::prefetch, so its copy to the GPU overlaps the batch running now. The
// execution thread only executes: with completion_threads, runs of an executed batch's rows are answered
// (results written into their calls, done() run for each call whose last row it was) on those threads
// while the next batch runs; without, it answers each batch itself before the next. With a write-ahead log,
// a log thread takes each executed batch in turn, logs its writes and then answers it, and a fourth batch
// lets one fill, one run, one be logged and one be answered at once. A call larger than a batch spans
// consecutive batches, and is answered once all of its rows are.
//
// Each batch goes through one lifecycle, Free -> Filling -> Closed -> Ready -> Running [-> Logging] ->
// Answering -> Free (staged_batch.hpp); the batcher owns the threads and moves the batches along it. Shared
// state is annotated with the mutex that guards it, and clang's -Wthread-safety checks the annotations
// (tests/CMakeLists.txt, batcher_thread_safety).
//
// Knows nothing of gRPC: the service adapts calls to CallOps / CallResults (call.hpp).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "batch_report.hpp"
#include "batching_policy.hpp"
#include "call.hpp"
#include "gpukv/table.hpp"
#include "mutex.hpp"

namespace gpukv::server {

struct CallState;
struct Segment;
class StagedBatch;

// The most one staged batch holds, in bytes of its columns. A batch of batch_size operations at wide values
// would hold far more: 65536 operations of 64 KiB values stage 8.6 GB, and the three or four staged batches 26 GB
// or more of host memory (pinned on the GPU backend), for calls that rarely come that large. Such a table's
// batches take fewer operations (Batcher::batch_size()).
inline constexpr std::size_t kMaxStagedBatchBytes = std::size_t{256} << 20;

struct BatcherConfig {
  std::size_t batch_size = 65536;                  // operations per device batch, at most (kMaxStagedBatchBytes)
  Clock::duration max_delay = std::chrono::microseconds(200);  // longest an operation waits for a batch
  std::size_t max_queued_ops = 1 << 22;            // ops waiting for a batch beyond which submit() refuses calls
  // Threads that answer executed batches (write each call's results, then run its done()) while the next
  // batch runs, each taking a share of the batch's calls (runs of at least answer_rows rows, unless the run
  // already holds its share of the calls); 0: the execution thread answers each batch before running the
  // next. done()s of different calls may then run concurrently and in any order.
  unsigned completion_threads = 0;
  std::size_t answer_rows = 2048;  // fewer rows per run would cost more in hand-offs than they save
  // Launch a batch at once, however small, whenever the table has none running or staged (decide_batch).
  bool launch_when_idle = false;
};

// A write-ahead log of executed batches. encode() turns a batch's successful writes into its record, given
// its columns and its result column after it ran (empty if it wrote nothing); it runs on the execution
// thread, which has time to spare while the log thread writes. append() writes a record; sync() makes
// everything appended so far durable as the log's policy says (one fdatasync for all the batches appended
// since the last: group commit). append() and sync() return an error message, or empty.
struct BatchLog {
  std::function<void(const BatchIn& in, const std::uint8_t* status, std::string* record)> encode;
  std::function<std::string(const std::string& record)> append;
  std::function<std::string()> sync;
  explicit operator bool() const { return static_cast<bool>(append); }
};

class Batcher {
 public:
  // `table` must outlive the batcher; its max_batch must be at least config.batch_size. on_executed and
  // on_batch run on the execution thread: on_executed(table stats, ops) after each batch has run on the
  // table and before any of its calls is answered, so that a client holding an answer finds its batch in
  // them; on_batch after the batch's calls are answered, with its full report. `log` runs on a thread of its
  // own (encode() on the execution thread), for each batch in the order they ran, after the batch has run
  // and before any of its calls is answered: the next batch runs while one is logged, and a read is
  // answered only once every write it may have seen is logged. The log thread takes every batch waiting for
  // it at once, appends each and syncs them together. When the log fails, every call with a write in a batch
  // it failed fails (UNAVAILABLE, naming the log's error): its writes are in the table but not durable, so
  // none is acknowledged; calls of GETs only are answered as usual. When the table fails a batch, each of its
  // calls fails INTERNAL.
  Batcher(Table& table, BatcherConfig config, std::function<void(const BatchReport&)> on_batch = {},
          std::function<void(const TableStats&, std::size_t ops)> on_executed = {}, BatchLog log = {});
  ~Batcher();  // drains
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // Takes a call: into the filling batch at once (copying its columns on this thread) when nothing is
  // queued ahead of it, else into the queue. Refuses it (done runs at once, outside the lock) when the queue
  // is full or the batcher is draining. Never waits for a batch to run.
  void submit(Call call) ABSL_LOCKS_EXCLUDED(mutex_);

  // Stops accepting calls, runs everything queued, and returns once the last call is done.
  void drain() ABSL_LOCKS_EXCLUDED(mutex_, completion_mutex_, log_mutex_);

  // Operations waiting for their batch to close (queued, or in the filling batch). The queue bound applies
  // to these.
  std::size_t queued_ops() const ABSL_LOCKS_EXCLUDED(mutex_);
  // The queue bound: a call with more ops is always refused.
  std::size_t max_queued_ops() const { return config_.max_queued_ops; }
  // Operations per batch: config.batch_size, or fewer where that many would stage more than
  // kMaxStagedBatchBytes at the table's widths.
  std::size_t batch_size() const { return config_.batch_size; }

 private:
  struct StageWork;

  // The threads.
  void stage_loop() ABSL_LOCKS_EXCLUDED(mutex_);
  void execute_loop() ABSL_LOCKS_EXCLUDED(mutex_);
  void complete_loop() ABSL_LOCKS_EXCLUDED(completion_mutex_);
  // With a log: logs the executed batches, in order, then answers them (hand_out_answers).
  void log_loop() ABSL_LOCKS_EXCLUDED(log_mutex_);

  // Filling. Moves calls from the head of the queue into the filling batch, reserving their rows; refuses
  // calls whose deadline has passed; closes the batch if it is now full. Returns what the caller does
  // outside the lock.
  StageWork reserve_queued(Clock::time_point now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Refuses the expired calls and copies the reserved rows (giving the lock up meanwhile if they are many),
  // then accounts for the copy (and publishes the batch if it was closed and this was its last copy).
  void run_stage_work(StageWork& work) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Free -> Filling: takes a free batch as the filling one, if there is none and a batch is free.
  void open_filling() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Filling -> Closed: no more rows, queued for the execution thread; opens the next free batch. Returns the
  // closed batch if no copy into it is in flight (the caller publishes it), else nullptr.
  StagedBatch* close_filling() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Closed -> Ready, once every row is copied: starts it on its way to the GPU if it runs next (giving the
  // lock up meanwhile).
  void publish(StagedBatch& batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void prefetch(StagedBatch& batch);
  bool table_idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);  // no batch closed, ready or running
  std::size_t pending_ops() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);  // see queued_ops()

  // Running: the execution thread runs a batch on the table.
  void execute(StagedBatch& batch) ABSL_LOCKS_EXCLUDED(mutex_);
  void fail_writers(StagedBatch& batch, const std::string& error);
  // -> Answering: hands a batch's answering out, to the completion threads in runs of segments or, without
  // them, to the calling thread.
  void hand_out_answers(StagedBatch& batch) ABSL_LOCKS_EXCLUDED(mutex_, completion_mutex_);
  // Writes the results of segments [first, last) into their calls, completes each call whose last
  // segment this was, and frees the batch after its last run of segments.
  void answer(StagedBatch& batch, std::size_t first_segment, std::size_t last_segment) ABSL_LOCKS_EXCLUDED(mutex_);
  void complete(CallState* call);  // answers the call and deletes its state
  // Answering -> Free.
  void release(StagedBatch& batch) ABSL_LOCKS_EXCLUDED(mutex_);

  Table& table_;
  const BatcherConfig config_;
  const std::function<void(const BatchReport&)> on_batch_;
  const std::function<void(const TableStats&, std::size_t)> on_executed_;
  const BatchLog log_;
  const std::size_t batch_count_;  // staged batches: 3, or 4 with a log (one of them being logged)
  const std::uint32_t value_width_;
  std::vector<std::unique_ptr<StagedBatch>> batches_;  // every batch, for the batcher's lifetime

  // The queue and the batches before they run. A batch is in free_ (Free), is filling_ (Filling), is in
  // closed_ (Closed or Ready), or belongs to the thread running, logging or answering it.
  mutable Mutex mutex_;
  std::condition_variable queue_changed_;  // stage thread waits: a batch to time or to fill, draining
  std::condition_variable batch_ready_;    // execution thread waits: the oldest closed batch ready, or stopping
  std::condition_variable idle_;           // drain() waits: everything done
  std::deque<std::unique_ptr<CallState>> queue_ ABSL_GUARDED_BY(mutex_);
  std::size_t queued_ops_ ABSL_GUARDED_BY(mutex_) = 0;  // ops in queue_ not yet in a batch
  bool draining_ ABSL_GUARDED_BY(mutex_) = false;
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  bool executing_ ABSL_GUARDED_BY(mutex_) = false;  // a batch is Running
  std::size_t refusing_ ABSL_GUARDED_BY(mutex_) = 0;  // calls refused for their deadline whose done() has not returned
  std::vector<StagedBatch*> free_ ABSL_GUARDED_BY(mutex_);
  StagedBatch* filling_ ABSL_GUARDED_BY(mutex_) = nullptr;  // taking rows; null while every batch is busy
  std::deque<StagedBatch*> closed_ ABSL_GUARDED_BY(mutex_);  // in closing order, which is the order they run in
  std::deque<BatchReport> reports_ ABSL_GUARDED_BY(mutex_);  // of answered batches, for on_batch

  std::thread stager_;
  std::thread executor_;

  // Runs of an executed batch's segments waiting for a completion thread to answer them.
  struct AnswerJob {
    StagedBatch* batch;
    std::size_t first_segment, last_segment;
  };
  Mutex completion_mutex_;
  std::condition_variable completion_ready_;  // completion threads wait: jobs, or stopping
  std::deque<AnswerJob> answer_jobs_ ABSL_GUARDED_BY(completion_mutex_);
  bool completion_stop_ ABSL_GUARDED_BY(completion_mutex_) = false;
  std::vector<std::thread> completers_;

  // Executed batches waiting for the log thread, in the order they ran (with a log only).
  Mutex log_mutex_;
  std::condition_variable log_ready_;  // the log thread waits: a batch, or stopping
  std::deque<StagedBatch*> log_queue_ ABSL_GUARDED_BY(log_mutex_);
  bool log_stop_ ABSL_GUARDED_BY(log_mutex_) = false;
  std::thread logger_;
};

}  // namespace gpukv::server
