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
// Knows nothing of gRPC: the service adapts calls to CallOps / CallResults.
#pragma once

#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "batching_policy.hpp"
#include "gpukv/table.hpp"

namespace gpukv::server {

// A call's operations as packed columns, the wire format of the batch and stream calls (a unary call is
// one op). The memory must stay valid until the call's done() has run.
struct CallOps {
  std::size_t count = 0;
  std::string_view kinds;                        // one OpKind byte per op; empty: every op is `kind`
  OpKind kind = OpKind::kGet;
  std::string_view keys;                         // concatenated
  const std::uint32_t* key_lengths = nullptr;    // `count` entries
  std::string_view values;                       // the write ops' values, concatenated in op order
  const std::uint32_t* value_lengths = nullptr;  // one per write op
};

// Op i's kind byte (a call without a kinds column has one kind for all); may be out of range: the batcher
// rejects such an op.
inline std::uint8_t kind_at(const CallOps& ops, std::size_t i) {
  return ops.kinds.empty() ? static_cast<std::uint8_t>(ops.kind) : static_cast<std::uint8_t>(ops.kinds[i]);
}
inline bool is_get(std::uint8_t kind) { return kind == static_cast<std::uint8_t>(OpKind::kGet); }
// An op that carries a value (carries_value, gpukv/types.hpp) has one entry of value_lengths.

// The number of GET ops in a call: the caller gives its results room for one value_width value per GET.
inline std::size_t get_count(const CallOps& ops) {
  if (ops.kinds.empty()) return is_get(static_cast<std::uint8_t>(ops.kind)) ? ops.count : 0;
  return static_cast<std::size_t>(std::count(ops.kinds.begin(), ops.kinds.end(), static_cast<char>(OpKind::kGet)));
}

// Where a call's results go: memory the caller owns and sizes (usually its response message's own fields, so
// that nothing is copied once the call is answered), valid until done() has run. With kOk, every op's
// result has been written, each GET that found its key has its length written, and the found values are
// packed in op order at the start of `values`.
struct CallResults {
  char* results = nullptr;                 // one OpStatus byte per op
  char* values = nullptr;                  // room for get_count(ops) * value_width bytes; null if no GETs
  std::uint32_t* value_lengths = nullptr;  // one per op, zeroed by the caller; may be null if no GETs
  std::size_t values_size = 0;             // written before done(kOk): the bytes of `values` used
};

enum class CallCode {
  kOk,
  kDeadlineExceeded,   // the deadline passed before the call's first batch closed; nothing of it was applied
  kUnavailable,        // the batcher is draining or stopped, or the write-ahead log failed the call's writes
  kResourceExhausted,  // the queue is full
  kInternal,           // the table failed while running the call's batch: some of its ops may have been
                       // applied, so it must not be retried as if nothing had happened
};

struct Call {
  CallOps ops;
  CallResults* results = nullptr;
  Clock::time_point deadline = Clock::time_point::max();
  // Runs exactly once: with kOk after every result is written, or with an error (nothing applied, unless the
  // table or the write-ahead log failed). It may run on the caller's thread inside submit() (a refusal), on the execution thread,
  // or on a completion thread.
  std::function<void(CallCode, std::string_view message)> done;
};

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

// What the execution thread reports after each batch (for metrics).
struct BatchReport {
  std::size_t ops = 0;
  Clock::duration queue_delay{};  // how long the batch's oldest operation waited before the batch started
  Clock::duration stage_time{};   // copying the calls' columns into the batch, summed over the threads that did
  Clock::duration execute_time{};
  Clock::duration answer_time{};  // from executed to the last of its calls answered (results written, done() run)
  std::array<std::array<std::uint64_t, 5>, kOpKindCount> results{};  // [kind][OpStatus] counts
  TableStats table{};  // the table's figures right after the batch ran
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
  // it at once, appends each and syncs them together. When the log fails, every call with a write in a batch it failed fails (UNAVAILABLE,
  // naming the log's error): its writes are in the table but not durable, so none is acknowledged; calls
  // of GETs only are answered as usual.
  Batcher(Table& table, BatcherConfig config, std::function<void(const BatchReport&)> on_batch = {},
          std::function<void(const TableStats&, std::size_t ops)> on_executed = {}, BatchLog log = {});
  ~Batcher();  // drains
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // Takes a call: into the filling batch at once (copying its columns on this thread) when nothing is
  // queued ahead of it, else into the queue. Refuses it (done runs at once, outside the lock) when the queue
  // is full or the batcher is draining. Never waits for a batch to run.
  void submit(Call call);

  // Stops accepting calls, runs everything queued, and returns once the last call is done.
  void drain();

  // Operations waiting for their batch to close (queued, or in the filling batch). The queue bound applies
  // to these.
  std::size_t queued_ops() const;
  // The queue bound: a call with more ops is always refused.
  std::size_t max_queued_ops() const { return config_.max_queued_ops; }
  // Operations per batch: config.batch_size, or fewer where that many would stage more than
  // kMaxStagedBatchBytes at the table's widths.
  std::size_t batch_size() const { return config_.batch_size; }

 private:
  struct CallState;
  struct Segment;
  struct StagedBatch;
  struct StageWork;

  void stage_loop();
  void execute_loop();
  void complete_loop();
  // With a log: logs the executed batches, in order, then answers them (hand_out_answers).
  void log_loop();
  void fail_writers(StagedBatch& batch, const std::string& error);
  // The helpers below that take the lock run with mutex_ held (they may release it for a while).
  // Moves calls from the head of the queue into the filling batch, reserving their rows; refuses calls whose
  // deadline has passed; closes the batch if it is now full. Returns what the caller does outside the lock.
  StageWork reserve_queued(Clock::time_point now);
  // Refuses the expired calls and copies the reserved rows outside the lock, then accounts for the copy
  // (and publishes the batch if it was closed and this was its last copy).
  void run_stage_work(std::unique_lock<std::mutex>& lock, StageWork& work);
  // Ends the filling batch: no more rows, queued for the execution thread. Opens the next free batch.
  // Returns the closed batch if no copy into it is in flight (the caller publishes it), else nullptr.
  StagedBatch* close_filling();
  void open_filling();
  // Starts a closed, fully copied batch on its way to the GPU and marks it ready for the execution thread.
  void publish(std::unique_lock<std::mutex>& lock, StagedBatch& batch);
  void prefetch(StagedBatch& batch);
  bool table_idle() const;  // no batch closed or running
  std::size_t pending_ops() const;  // see queued_ops()
  // The execution thread runs a batch on the table, then hands its answering out: to the completion
  // threads, in runs of segments, or, without them, to itself.
  void execute(StagedBatch& batch);
  void hand_out_answers(StagedBatch& batch);
  // Writes the results of segments [first, last) into their calls, completes each call whose last
  // segment this was, and frees the batch after its last run of segments. Runs without the lock.
  void answer(StagedBatch& batch, std::size_t first_segment, std::size_t last_segment);
  using ResultCounts = std::array<std::array<std::uint64_t, 5>, kOpKindCount>;  // [kind][OpStatus]
  void write_results(const StagedBatch& batch, const Segment& segment, ResultCounts& counts);
  void complete(CallState* call);  // answers the call and deletes its state
  void release(StagedBatch& batch);

  Table& table_;
  const BatcherConfig config_;
  const std::function<void(const BatchReport&)> on_batch_;
  const std::function<void(const TableStats&, std::size_t)> on_executed_;
  const BatchLog log_;
  const std::size_t batch_count_;  // staged batches: 3, or 4 with a log (one of them being logged)
  const std::uint32_t key_width_;
  const std::uint32_t value_width_;
  const std::uint32_t value_stride_;

  mutable std::mutex mutex_;
  std::condition_variable queue_changed_;  // stage thread waits: a batch to time or to fill, draining
  std::condition_variable batch_ready_;    // execution thread waits: the oldest closed batch ready, or stopping
  std::condition_variable idle_;           // drain() waits: everything done
  std::vector<std::unique_ptr<StagedBatch>> batches_;  // every batch, for the batcher's lifetime
  // All guarded by mutex_. Each batch is in exactly one of free_, filling_, closed_, or with the execution
  // thread, or being answered.
  std::deque<std::unique_ptr<CallState>> queue_;
  std::size_t queued_ops_ = 0;  // ops in queue_ not yet in a batch
  bool draining_ = false;
  bool stopping_ = false;
  bool executing_ = false;
  std::size_t refusing_ = 0;  // calls refused for their deadline whose done() has not yet returned
  std::vector<StagedBatch*> free_;
  StagedBatch* filling_ = nullptr;       // taking rows; null while every batch is busy
  std::deque<StagedBatch*> closed_;      // in closing order, which is the order they run in
  std::deque<BatchReport> reports_;      // of answered batches, for the execution thread to hand to on_batch

  std::thread stager_;
  std::thread executor_;

  // Runs of an executed batch's segments waiting for a completion thread to answer them.
  struct AnswerJob {
    StagedBatch* batch;
    std::size_t first_segment, last_segment;
  };
  std::mutex completion_mutex_;
  std::condition_variable completion_ready_;  // completion threads wait: jobs, or stopping
  std::deque<AnswerJob> answer_jobs_;         // guarded by completion_mutex_
  bool completion_stop_ = false;              // guarded by completion_mutex_
  std::vector<std::thread> completers_;

  // Executed batches waiting for the log thread, in the order they ran (with a log only).
  std::mutex log_mutex_;
  std::condition_variable log_ready_;     // the log thread waits: a batch, or stopping
  std::deque<StagedBatch*> log_queue_;    // guarded by log_mutex_
  bool log_stop_ = false;                 // guarded by log_mutex_
  std::thread logger_;
};

}  // namespace gpukv::server
