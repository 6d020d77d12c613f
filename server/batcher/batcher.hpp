// The batcher: gathers the operations of every client call into fixed-size device batches and runs them on
// the table, keeping the order in which calls arrived (so operations on one key keep their order).
//
//   submit() ──▶ queue (bounded) ──▶ staging thread ──▶ [batch A | batch B] ──▶ execution thread ──▶ done()
//
// The staging thread cuts a batch when it is full or its oldest operation has waited max_delay
// (decide_batch), drops calls whose deadline has passed, and copies their packed columns into one of two
// staging batches; the execution thread runs the other on the table and hands each call its results. So
// one batch fills while the previous one runs. The staging batches are the table's host memory (pinned on
// the GPU backend), and a filled batch is handed to Table::prefetch, so its copy to the GPU also overlaps
// the batch running. A call larger than a batch spans consecutive batches. A call's done() (for the
// service: serialising the response and starting its send) runs on the execution thread or, with
// completion_threads, on threads of its own, so that the next batch starts while the last one's calls are
// answered.
//
// Knows nothing of gRPC: the service adapts calls to CallOps / CallResults.
#pragma once

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

// A call's results, written by the execution thread in op order.
struct CallResults {
  std::string results;                       // one OpStatus byte per op
  std::string values;                        // the values of the GETs that found their key, in op order
  std::vector<std::uint32_t> value_lengths;  // one per op; 0 unless a GET found its key
};

enum class CallCode {
  kOk,
  kDeadlineExceeded,   // the deadline passed while the call was queued; nothing of it was applied
  kUnavailable,        // the batcher is draining or stopped
  kResourceExhausted,  // the queue is full
};

struct Call {
  CallOps ops;
  CallResults* results = nullptr;  // sized by submit()
  Clock::time_point deadline = Clock::time_point::max();
  // Runs exactly once: with kOk after every result is written, or with an error and nothing applied.
  std::function<void(CallCode, std::string_view message)> done;
};

struct BatcherConfig {
  std::size_t batch_size = 65536;                  // operations per device batch
  Clock::duration max_delay = std::chrono::microseconds(200);  // longest an operation waits for a batch
  std::size_t max_queued_ops = 1 << 22;            // beyond this, submit() refuses calls
  // Threads that run the done() of calls a batch completed; 0: the execution thread runs them. done()s of
  // different calls may then run concurrently and in any order.
  unsigned completion_threads = 0;
  // Launch a batch at once, however small, whenever the table has none running or staged (decide_batch).
  bool launch_when_idle = false;
};

// What the execution thread reports after each batch (for metrics).
struct BatchReport {
  std::size_t ops = 0;
  Clock::duration queue_delay{};  // how long the batch's oldest operation waited before the batch started
  Clock::duration stage_time{};   // the staging thread copying the calls' columns into the batch
  Clock::duration execute_time{};
  Clock::duration answer_time{};  // the execution thread writing results into the calls and handing them on
  std::array<std::array<std::uint64_t, 5>, kOpKindCount> results{};  // [kind][OpStatus] counts
};

class Batcher {
 public:
  // `table` must outlive the batcher; its max_batch must be at least config.batch_size.
  Batcher(Table& table, BatcherConfig config, std::function<void(const BatchReport&)> on_batch = {});
  ~Batcher();  // drains
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // Queues a call. Refuses it (done runs at once, outside the lock) when the queue is full or the batcher
  // is draining.
  void submit(Call call);

  // Stops accepting calls, runs everything queued, and returns once the last call is done.
  void drain();

  std::size_t queued_ops() const;

 private:
  struct CallState;
  struct Segment;
  struct StagedBatch;

  void stage_loop();
  void execute_loop();
  // Fills `batch` from the head of the queue; returns the calls refused for their deadline. Lock held.
  std::vector<std::unique_ptr<CallState>> fill(StagedBatch& batch, Clock::time_point now);
  void finish_batch(StagedBatch& batch);
  void complete_loop();

  Table& table_;
  const BatcherConfig config_;
  const std::function<void(const BatchReport&)> on_batch_;
  const std::uint32_t key_width_;
  const std::uint32_t value_width_;
  const std::uint32_t value_stride_;

  mutable std::mutex mutex_;
  std::condition_variable queue_changed_;  // stage thread waits: calls arrived, a batch freed, draining
  std::condition_variable batch_ready_;    // execution thread waits: a staged batch, or stopping
  std::condition_variable idle_;           // drain() waits: everything done
  std::deque<std::unique_ptr<CallState>> queue_;  // guarded by mutex_
  std::size_t queued_ops_ = 0;                    // ops in queue_ not yet staged; guarded by mutex_
  std::size_t in_flight_ = 0;                     // calls taken from the queue and not yet done; guarded
  bool draining_ = false;                         // guarded by mutex_
  bool stopping_ = false;                         // guarded by mutex_
  std::vector<std::unique_ptr<StagedBatch>> free_;    // staging batches ready to fill; guarded
  std::deque<std::unique_ptr<StagedBatch>> staged_;   // filled, waiting for the execution thread; guarded

  std::thread stager_;
  std::thread executor_;

  // Calls whose results are all written, waiting for a completion thread to run their done().
  std::mutex completion_mutex_;
  std::condition_variable completion_ready_;  // completion threads wait: calls to complete, or stopping
  std::condition_variable completion_idle_;   // drain() waits: nothing left to complete
  std::deque<std::unique_ptr<CallState>> completions_;  // guarded by completion_mutex_
  std::size_t completing_ = 0;                // taken and not yet done; guarded by completion_mutex_
  bool completion_stop_ = false;              // guarded by completion_mutex_
  std::vector<std::thread> completers_;
};

}  // namespace gpukv::server
