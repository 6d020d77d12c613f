#include "batcher.hpp"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <stdexcept>

#include "staged_batch.hpp"

namespace gpukv::server {

// Three batches: one filling while one runs and the one before it is answered; with a write-ahead log, a
// fourth, being logged between running and being answered.
constexpr std::size_t kBatches = 3;
constexpr std::size_t kBatchesWithLog = 4;

namespace {

// The config with batch_size bounded so that a staged batch holds at most kMaxStagedBatchBytes at the table's
// widths. A row takes StagedBatch's columns: kind, key length, status, two value lengths, the key, the value
// in and the value out.
BatcherConfig bounded(BatcherConfig config, const Table& table) {
  const std::size_t row_bytes = 3 + 8 + table.config().key_width + 2 * std::size_t{table.value_stride()};
  config.batch_size = std::min(config.batch_size, std::max<std::size_t>(1, kMaxStagedBatchBytes / row_bytes));
  return config;
}

}  // namespace

constexpr const char* kExpired = "the deadline passed while the call was queued";

// Reserved rows up to this many are copied without giving up the lock.
constexpr std::size_t kRowsCopiedUnderLock = 256;

// Rows reserved under the lock, to copy (outside it if many), and calls refused for their deadline.
struct Batcher::StageWork {
  StagedBatch* batch = nullptr;
  std::size_t first_segment = 0, last_segment = 0;  // the reserved segments, in batch->segments
  std::size_t rows = 0;
  std::vector<std::unique_ptr<CallState>> expired;
};

Batcher::Batcher(Table& table, BatcherConfig config, std::function<void(const BatchReport&)> on_batch,
                 std::function<void(const TableStats&, std::size_t)> on_executed, BatchLog log)
    : table_(table),
      config_(bounded(config, table)),
      on_batch_(std::move(on_batch)),
      on_executed_(std::move(on_executed)),
      log_(std::move(log)),
      batch_count_(log_ ? kBatchesWithLog : kBatches),
      value_width_(table.config().value_width) {
  if (config_.batch_size == 0 || config_.batch_size > table.config().max_batch) {
    throw std::invalid_argument("batch_size must be 1.." + std::to_string(table.config().max_batch) +
                                " (the table's max_batch)");
  }
  for (std::size_t i = 0; i < batch_count_; ++i) {
    batches_.push_back(std::make_unique<StagedBatch>(table_, config_.batch_size));
    free_.push_back(batches_.back().get());
  }
  open_filling();
  // Named, so that per-thread tools (top -H, perf, /proc) tell them apart.
  stager_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "gpukv-stage");
    stage_loop();
  });
  executor_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "gpukv-execute");
    execute_loop();
  });
  if (log_) {
    logger_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "gpukv-log");
      log_loop();
    });
  }
  for (unsigned i = 0; i < config_.completion_threads; ++i) {
    completers_.emplace_back([this] {
      pthread_setname_np(pthread_self(), "gpukv-answer");
      complete_loop();
    });
  }
}

Batcher::~Batcher() { drain(); }

std::size_t Batcher::queued_ops() const {
  MutexLock lock(mutex_);
  return pending_ops();
}

std::size_t Batcher::pending_ops() const { return (filling_ != nullptr ? filling_->size : 0) + queued_ops_; }

bool Batcher::table_idle() const { return closed_.empty() && !executing_; }

void Batcher::open_filling() {
  if (filling_ != nullptr || free_.empty()) return;
  filling_ = free_.back();
  free_.pop_back();
  filling_->reset();
  filling_->move_to(BatchState::kFilling);
}

StagedBatch* Batcher::close_filling() {
  StagedBatch* batch = filling_;
  batch->move_to(BatchState::kClosed);
  // A call counts as queued until its first batch closes: if its deadline has passed by then, none of it
  // runs (and reserve_queued gives the rest of such a call no rows).
  const Clock::time_point now = Clock::now();
  for (Segment& s : batch->segments) {
    if (s.first_op == 0 && now > s.deadline) s.expired = s.call->expired = true;
  }
  closed_.push_back(batch);
  filling_ = nullptr;
  open_filling();
  return batch->copies == 0 ? batch : nullptr;
}

void Batcher::publish(StagedBatch& batch) {
  // The table keeps two prefetched uploads, and a new one replaces the older one not yet running: only the
  // batch that runs next is prefetched here; the execution thread prefetches the one after it when it
  // starts this one.
  const bool next = closed_.front() == &batch;
  batch.prefetched = next;
  // No other thread touches a closed batch with no copies in flight until it is ready, so the rejection of
  // expired calls' rows and the prefetch run outside the lock.
  mutex_.unlock();
  for (const Segment& s : batch.segments) {
    if (s.expired) batch.reject_rows(s);
  }
  if (next) prefetch(batch);
  mutex_.lock();
  batch.move_to(BatchState::kReady);
  batch_ready_.notify_one();
}

void Batcher::prefetch(StagedBatch& batch) {
  try {
    table_.prefetch(batch.in());
  } catch (const std::exception&) {
    // Only an early start: the batch's execute() copies for itself, and reports a table that failed.
  }
}

void Batcher::submit(Call call) {
  const std::size_t n = call.ops.count;
  if (n > config_.max_queued_ops) {  // could never be queued
    call.done(CallCode::kResourceExhausted, "the call has more operations than the queue holds");
    return;
  }
  auto state = std::make_unique<CallState>();
  state->call = std::move(call);
  const Clock::time_point now = Clock::now();
  state->arrived = now;
  const char* refusal = nullptr;
  CallCode code = CallCode::kOk;
  bool wake = false;
  MutexLock lock(mutex_);
  if (draining_) {
    refusal = "the server is draining";
    code = CallCode::kUnavailable;
  } else if (pending_ops() + n > config_.max_queued_ops) {
    refusal = "the queue is full";
    code = CallCode::kResourceExhausted;
  } else if (n != 0) {
    queued_ops_ += n;
    queue_.push_back(std::move(state));
    // Nothing queued ahead and a batch filling: reserve this call's rows and copy its columns here. Else the
    // call waits its turn: the staging thread already knows of the calls ahead, and the execution thread
    // wakes it when a batch frees up.
    if (queue_.size() == 1 && filling_ != nullptr) {
      StagedBatch* batch = filling_;
      const bool first_rows = batch->size == 0;
      StageWork work = reserve_queued(now);
      if (filling_ == batch && batch->size != 0) {  // still filling
        if (config_.launch_when_idle) {
          // Nothing to run: start it now. Else the execution thread closes it when the running batch ends.
          if (table_idle()) {
            if (StagedBatch* closed = close_filling()) publish(*closed);
          }
        } else if (first_rows) {
          wake = true;  // the staging thread times the batch from its first op
        }
      }
      if (!queue_.empty() && filling_ != nullptr) wake = true;  // the rest of a call larger than the room left
      run_stage_work(work);
    }
  }
  // Under the lock: once it is released, the call may be answered and the batcher drained and destroyed
  // before this thread runs again.
  if (wake) queue_changed_.notify_one();
  lock.unlock();
  if (state != nullptr) {  // refused or empty: finish outside the lock
    state->call.done(code, refusal != nullptr ? refusal : "");
  }
}

void Batcher::drain() {
  {
    MutexLock lock(mutex_);
    if (stopping_) return;
    draining_ = true;
  }
  queue_changed_.notify_all();
  {
    MutexLock lock(mutex_);
    // Every batch free (or the empty filling one): nothing queued, running or being answered.
    lock.wait(idle_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
      return queue_.empty() && free_.size() + 1 == batch_count_ && filling_ != nullptr && filling_->size == 0 && refusing_ == 0;
    });
    stopping_ = true;
  }
  queue_changed_.notify_all();
  batch_ready_.notify_all();
  if (stager_.joinable()) stager_.join();
  if (executor_.joinable()) executor_.join();
  {
    MutexLock lock(log_mutex_);  // every batch is free: none is waiting to be logged
    log_stop_ = true;
  }
  log_ready_.notify_all();
  if (logger_.joinable()) logger_.join();
  {
    MutexLock lock(completion_mutex_);  // every job is done: every batch is free
    completion_stop_ = true;
  }
  completion_ready_.notify_all();
  for (auto& t : completers_) t.join();
}

void Batcher::complete_loop() {
  MutexLock lock(completion_mutex_);
  for (;;) {
    lock.wait(completion_ready_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(completion_mutex_) {
      return !answer_jobs_.empty() || completion_stop_;
    });
    if (answer_jobs_.empty()) return;
    const AnswerJob job = answer_jobs_.front();
    answer_jobs_.pop_front();
    lock.unlock();
    answer(*job.batch, job.first_segment, job.last_segment);
    lock.lock();
  }
}

Batcher::StageWork Batcher::reserve_queued(Clock::time_point now) {
  StageWork work;
  StagedBatch& batch = *filling_;
  const std::size_t first_segment = batch.segments.size();
  while (!queue_.empty() && batch.size < config_.batch_size) {
    CallState& c = *queue_.front();
    const std::size_t count = c.call.ops.count;
    if (c.next_op == 0 && now > c.call.deadline) {  // not started: refuse it whole
      queued_ops_ -= count;
      ++refusing_;  // drain() waits until it is answered
      work.expired.push_back(std::move(queue_.front()));
      queue_.pop_front();
      continue;
    }
    if (c.expired) {
      // Its first batch closed after its deadline (a call that spans batches fills its first one, which
      // closes in the reservation that took its first rows): the rest of it takes no rows. Whoever answers
      // its last reserved rows completes it; here, if they have all been answered already.
      queued_ops_ -= count - c.next_op;
      CallState* state = queue_.front().release();
      queue_.pop_front();
      if (state->unanswered.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        ++refusing_;
        work.expired.emplace_back(state);
      }
      continue;
    }
    if (batch.size == 0) batch.oldest = c.arrived;
    const std::size_t take = std::min(count - c.next_op, config_.batch_size - batch.size);
    batch.segments.push_back(
        Segment{&c, c.next_op, take, batch.size, c.key_offset, c.value_offset, c.write_index, c.get_index, c.call.deadline});
    // A call that goes on in the next batch: advance its cursors past the ops taken (their bytes are copied
    // outside the lock). A call that ends here needs no cursors.
    const CallOps& ops = c.call.ops;
    for (std::size_t i = c.next_op; c.next_op + take < count && i < c.next_op + take; ++i) {
      c.key_offset += ops.key_lengths[i];
      const std::uint8_t kind = kind_at(ops, i);
      if (carries_value(kind)) c.value_offset += ops.value_lengths[c.write_index++];
      c.get_index += is_get(kind);
    }
    c.next_op += take;
    batch.size += take;
    queued_ops_ -= take;
    c.unanswered.fetch_add(1, std::memory_order_relaxed);
    if (c.next_op == count) {
      // Every op has a row: from here the call belongs to its segments, and the last one answered deletes it.
      c.unanswered.fetch_sub(1, std::memory_order_relaxed);
      static_cast<void>(queue_.front().release());
      queue_.pop_front();
    }
  }
  if (batch.segments.size() > first_segment) {
    work.batch = &batch;
    work.first_segment = first_segment;
    work.last_segment = batch.segments.size();
    work.rows = batch.size - batch.segments[first_segment].row;
    ++batch.copies;
    if (batch.size == config_.batch_size) close_filling();  // published after this copy
  }
  return work;
}

void Batcher::run_stage_work(StageWork& work) {
  if (work.batch == nullptr && work.expired.empty()) return;
  // Refuses the expired calls and copies the reserved rows; the rows are this thread's alone, and the calls'
  // columns do not change, so it needs no lock.
  StagedBatch::CopyCounts counts;
  Clock::duration copy_time{};
  const std::size_t refused = work.expired.size();
  const auto copy = [&](const Segment* segments) {
    for (auto& c : work.expired) c->call.done(CallCode::kDeadlineExceeded, kExpired);
    work.expired.clear();
    if (work.batch == nullptr) return;
    const Clock::time_point start = Clock::now();
    for (std::size_t k = 0; k < work.last_segment - work.first_segment; ++k) work.batch->copy_rows(segments[k], counts);
    copy_time = Clock::now() - start;
  };
  // A few rows copy faster than the lock is given up and taken back (and other threads wait on it less
  // than they would for the hand-off); refused calls are answered outside the lock.
  const auto first = work.batch != nullptr
                         ? work.batch->segments.begin() + static_cast<std::ptrdiff_t>(work.first_segment)
                         : std::vector<Segment>::iterator{};
  if (work.rows <= kRowsCopiedUnderLock && work.expired.empty()) {
    copy(work.batch != nullptr ? &*first : nullptr);
  } else {
    // Outside the lock, the batch's segment list may grow (and move) while these rows are copied: copy
    // them from a list of their own.
    std::vector<Segment> own;
    if (work.batch != nullptr) own.assign(first, first + static_cast<std::ptrdiff_t>(work.last_segment - work.first_segment));
    mutex_.unlock();
    copy(own.data());
    mutex_.lock();
  }
  if (refused != 0) {
    refusing_ -= refused;
    idle_.notify_all();
  }
  if (work.batch == nullptr) return;
  StagedBatch& batch = *work.batch;
  batch.writes += counts.writes;
  batch.gets += counts.gets;
  batch.stage_time += copy_time;
  if (--batch.copies == 0 && batch.state() == BatchState::kClosed) publish(batch);
}

void Batcher::stage_loop() {
  MutexLock lock(mutex_);
  for (;;) {
    if (stopping_) return;
    const Clock::time_point now = Clock::now();
    if (filling_ != nullptr && !queue_.empty()) {  // calls waited for a batch: move them in
      StageWork work = reserve_queued(now);
      run_stage_work(work);
      continue;
    }
    const std::size_t filled = filling_ != nullptr ? filling_->size : 0;
    const Clock::time_point oldest = filled != 0 ? filling_->oldest : queue_.empty() ? now : queue_.front()->arrived;
    const BatchDecision d = decide_batch(pending_ops(), oldest, now, config_.batch_size, config_.max_delay,
                                         draining_, config_.launch_when_idle, table_idle());
    if (d.launch && filled != 0) {
      if (StagedBatch* batch = close_filling()) publish(*batch);
      continue;
    }
    // Nothing to launch yet, or every batch busy (the execution thread wakes this one when one frees up).
    if (!d.launch && d.wait != Clock::duration::max()) {
      lock.wait_for(queue_changed_, d.wait);
    } else {
      lock.wait(queue_changed_);
    }
  }
}

void Batcher::execute_loop() {
  MutexLock lock(mutex_);
  for (;;) {
    lock.wait(batch_ready_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
      return (!closed_.empty() && closed_.front()->state() == BatchState::kReady) || !reports_.empty() || stopping_;
    });
    // Reports of answered batches go out here, between executions, so that on_batch (which updates the
    // metrics) never waits for one.
    while (!reports_.empty()) {
      const BatchReport report = reports_.front();
      reports_.pop_front();
      lock.unlock();
      if (on_batch_) on_batch_(report);
      lock.lock();
    }
    if (closed_.empty() || closed_.front()->state() != BatchState::kReady) {
      if (stopping_) return;
      continue;
    }
    StagedBatch* batch = closed_.front();
    closed_.pop_front();
    batch->move_to(BatchState::kRunning);
    executing_ = true;
    // The batch after this one, if ready and not yet on its way (publish prefetched only the next one).
    StagedBatch* after = !closed_.empty() && closed_.front()->state() == BatchState::kReady && !closed_.front()->prefetched
                             ? closed_.front()
                             : nullptr;
    if (after != nullptr) after->prefetched = true;
    lock.unlock();
    if (after != nullptr) prefetch(*after);
    execute(*batch);
    if (log_) {
      if (!batch->failed) log_.encode(batch->in(), batch->status(), &batch->log_record);
      // Logged and answered by the log thread, in order, while the next batch runs.
      batch->move_to(BatchState::kLogging);
      {
        MutexLock log_lock(log_mutex_);
        log_queue_.push_back(batch);
      }
      log_ready_.notify_one();
    } else if (completers_.empty()) {
      hand_out_answers(*batch);  // answered here, the batch keeps the table busy until then (launch_when_idle)
    }
    lock.lock();
    executing_ = false;
    // With launch_when_idle, a batch that filled while this one ran starts now.
    if (config_.launch_when_idle && closed_.empty() && filling_ != nullptr && filling_->size != 0) {
      if (StagedBatch* next = close_filling()) publish(*next);
    }
    if (!log_ && !completers_.empty()) {
      lock.unlock();
      hand_out_answers(*batch);
      lock.lock();
    }
  }
}

void Batcher::execute(StagedBatch& batch) {
  BatchReport& report = batch.report;
  report.ops = batch.size;
  report.stage_time = batch.stage_time;
  const Clock::time_point start = Clock::now();
  report.queue_delay = start - batch.oldest;
  try {
    table_.execute(batch.in(), batch.out());
  } catch (const std::exception& e) {
    // The table could not run the batch (a device fault): its calls fail, each completed once all its
    // segments are answered (a later batch may still be copying its columns).
    batch.failed = true;
    for (const Segment& s : batch.segments) {
      if (s.call->failure.empty()) {
        s.call->failure_code = CallCode::kInternal;
        s.call->failure = std::string("the table failed while running the call's batch (some of its operations "
                                      "may have been applied): ") + e.what();
      }
    }
  }
  batch.executed = Clock::now();
  report.execute_time = batch.executed - start;
  if (on_batch_ || on_executed_) report.table = table_.stats();
  if (on_executed_) on_executed_(report.table, batch.size);
}

void Batcher::log_loop() {
  MutexLock lock(log_mutex_);
  std::deque<StagedBatch*> group;
  for (;;) {
    lock.wait(log_ready_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(log_mutex_) { return !log_queue_.empty() || log_stop_; });
    if (log_queue_.empty()) return;
    group.swap(log_queue_);  // every batch waiting: one sync makes them all durable
    lock.unlock();
    // Batches are logged, and then answered, in the order they ran: a batch's reads may see the writes of
    // the batches before it, which are durable by the time it is answered.
    for (StagedBatch* batch : group) {
      if (batch->failed) continue;
      if (const std::string error = log_.append(batch->log_record); !error.empty()) fail_writers(*batch, error);
    }
    if (const std::string error = log_.sync(); !error.empty()) {
      for (StagedBatch* batch : group) {
        if (!batch->failed) fail_writers(*batch, error);
      }
    }
    for (StagedBatch* batch : group) hand_out_answers(*batch);
    group.clear();
    lock.lock();
  }
}

void Batcher::fail_writers(StagedBatch& batch, const std::string& error) {
  for (const Segment& s : batch.segments) {
    if (batch.writes_in(s) && s.call->failure.empty()) {
      s.call->failure_code = CallCode::kUnavailable;
      s.call->failure = "the write-ahead log failed, the call's writes are not durable: " + error;
    }
  }
}

void Batcher::hand_out_answers(StagedBatch& batch) {
  batch.move_to(BatchState::kAnswering);
  const std::size_t segments = batch.segments.size();
  if (completers_.empty()) {  // answered here, before the next batch runs
    batch.jobs_left.store(1, std::memory_order_relaxed);
    answer(batch, 0, segments);
    return;
  }
  // Contiguous runs of segments, one per completion thread: a run ends at its share of the rows (at least
  // answer_rows) or at its share of the segments, since each call whose last segment it answers gets its
  // response serialised and sent there, which outweighs its rows when calls are small.
  const std::size_t threads = completers_.size();
  const std::size_t rows_per_job = std::max({std::size_t{1}, config_.answer_rows, (batch.size + threads - 1) / threads});
  const std::size_t segments_per_job = (segments + threads - 1) / threads;
  std::vector<AnswerJob> jobs;
  for (std::size_t first = 0, rows = 0, i = 0; i < segments; ++i) {
    rows += batch.segments[i].count;
    if (rows >= rows_per_job || i + 1 - first >= segments_per_job || i + 1 == segments) {
      jobs.push_back(AnswerJob{&batch, first, i + 1});
      first = i + 1;
      rows = 0;
    }
  }
  batch.jobs_left.store(jobs.size(), std::memory_order_relaxed);
  {
    MutexLock lock(completion_mutex_);
    answer_jobs_.insert(answer_jobs_.end(), jobs.begin(), jobs.end());
  }
  if (jobs.size() == 1) {
    completion_ready_.notify_one();
  } else {
    completion_ready_.notify_all();
  }
}

void Batcher::answer(StagedBatch& batch, std::size_t first_segment, std::size_t last_segment) {
  ResultCounts counts{};
  for (std::size_t k = first_segment; k < last_segment; ++k) {
    const Segment& s = batch.segments[k];
    if (!batch.failed && !s.expired) batch.write_results(s, counts);
    if (s.call->unanswered.fetch_sub(1, std::memory_order_acq_rel) == 1) complete(s.call);
  }
  {
    std::lock_guard lock(batch.report_mutex);
    for (std::size_t kind = 0; kind < kOpKindCount; ++kind) {
      for (std::size_t status = 0; status < counts[kind].size(); ++status) batch.report.results[kind][status] += counts[kind][status];
    }
  }
  if (batch.jobs_left.fetch_sub(1, std::memory_order_acq_rel) == 1) release(batch);
}

void Batcher::complete(CallState* state) {
  const std::unique_ptr<CallState> c(state);
  if (c->expired) {
    c->call.done(CallCode::kDeadlineExceeded, kExpired);
  } else if (!c->failure.empty()) {
    c->call.done(c->failure_code, c->failure);
  } else {
    if (!c->packed) pack_values(*c->call.results, c->call.ops, value_width_);
    c->call.done(CallCode::kOk, "");
  }
}

void Batcher::release(StagedBatch& batch) {
  batch.report.answer_time = Clock::now() - batch.executed;
  MutexLock lock(mutex_);
  if (on_batch_) {
    reports_.push_back(batch.report);
    batch_ready_.notify_one();
  }
  batch.move_to(BatchState::kFree);
  free_.push_back(&batch);
  open_filling();
  // Queued calls have a batch to go into now: only then has the staging thread something new to do.
  if (!queue_.empty()) queue_changed_.notify_one();
  idle_.notify_all();
}

}  // namespace gpukv::server
