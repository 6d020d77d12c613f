#include "batcher.hpp"

#include <pthread.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <stdexcept>

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

// Kind byte of a staged op that failed validation: the table answers it kInvalid and changes nothing.
constexpr std::uint8_t kRejectedOp = 0xFF;

struct Batcher::CallState {
  Call call;
  Clock::time_point arrived;
  // Where reservation resumes for a call that spans batches (changed under the lock only).
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
struct Batcher::Segment {
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

// Rows reserved under the lock, to copy (outside it if many), and calls refused for their deadline.
struct Batcher::StageWork {
  StagedBatch* batch = nullptr;
  std::size_t first_segment = 0, last_segment = 0;  // the reserved segments, in batch->segments
  std::size_t rows = 0;
  std::vector<std::unique_ptr<CallState>> expired;
};

// A device batch in the table's column layout, plus which call each row answers. The columns are carved from
// one block of the table's host memory (pinned on the GPU backend), so that the table copies them by DMA and
// can prefetch a closed batch while the previous one runs.
struct Batcher::StagedBatch {
  StagedBatch(Table& table, std::size_t n, std::uint32_t key_width, std::uint32_t value_stride) {
    std::size_t bytes = 0;
    const auto column = [&](std::size_t size) {  // 8-byte aligned, as the table requires
      const std::size_t at = bytes;
      bytes += (size + 7) / 8 * 8;
      return at;
    };
    const std::size_t at_ops = column(n), at_key_lens = column(n), at_status = column(n);
    const std::size_t at_value_lens = column(n * 4), at_out_value_lens = column(n * 4);
    const std::size_t at_keys = column(n * key_width), at_values = column(n * value_stride), at_out_values = column(n * value_stride);
    memory = table.allocate_host(bytes);
    std::uint8_t* base = memory.data();
    ops = base + at_ops;
    key_lens = base + at_key_lens;
    status = base + at_status;
    value_lens = reinterpret_cast<std::uint32_t*>(base + at_value_lens);
    out_value_lens = reinterpret_cast<std::uint32_t*>(base + at_out_value_lens);
    keys = base + at_keys;
    values = base + at_values;
    out_values = base + at_out_values;
  }
  HostMemory memory;
  std::uint8_t *ops, *key_lens, *status;
  std::uint32_t *value_lens, *out_value_lens;
  std::uint8_t *keys, *values, *out_values;
  std::size_t size = 0;               // rows reserved
  std::size_t writes = 0, gets = 0;   // valid PUTs and GETs copied
  Clock::time_point oldest{};         // when the op in row 0 arrived
  Clock::duration stage_time{};       // copying, summed over the threads that copied
  std::vector<Segment> segments;
  std::size_t copies = 0;  // reservations whose rows are still being copied
  std::string log_record;  // with a write-ahead log: the batch's record, encoded after it ran
  bool closed = false;     // takes no more rows
  bool ready = false;      // closed and copied: the execution thread may take it
  bool prefetched = false; // handed to Table::prefetch
  // After execution: the table failed it, the report being put together, answering jobs not yet done.
  bool failed = false;
  Clock::time_point executed{};
  BatchReport report;
  std::mutex report_mutex;
  std::atomic<std::size_t> jobs_left{0};

  void reset() {
    size = writes = gets = copies = 0;
    stage_time = {};
    segments.clear();
    closed = ready = prefetched = failed = false;
    report = BatchReport{};
  }

  // A batch without writes leaves out the value columns, and one without GETs the result values: the GPU
  // backend copies only the columns given.
  BatchIn in() const {
    return BatchIn{size, ops, keys, key_lens, writes != 0 ? values : nullptr, writes != 0 ? value_lens : nullptr};
  }
  BatchOut out() const { return BatchOut{status, gets != 0 ? out_values : nullptr, gets != 0 ? out_value_lens : nullptr}; }
};

namespace {

struct CopyCounts {
  std::size_t writes = 0, gets = 0;
};

// Copies a found value to `slot`, which has `width` bytes of room (the slot's size). The common widths go as
// fixed-size copies the compiler inlines, of the whole slot: a libc call per 8-byte value cost more than the
// copy, and the bytes past the value's length are overwritten by the next value or cut off at values_size.
void copy_value(char* slot, const std::uint8_t* value, std::uint32_t len, std::uint32_t width) {
  switch (width) {
    case 8: std::memcpy(slot, value, 8); return;
    case 16: std::memcpy(slot, value, 16); return;
    case 32: std::memcpy(slot, value, 32); return;
    case 64: std::memcpy(slot, value, 64); return;
    case 128: std::memcpy(slot, value, 128); return;
    default: std::memcpy(slot, value, len);
  }
}

// Packs the GET values, written at fixed slots (the g-th GET at g * width) while the call's batches were
// answered, into op order with no gaps, as CallResults promises. In place: a packed offset never exceeds
// its slot.
void pack_values(CallResults& r, const CallOps& ops, std::uint32_t width) {
  std::size_t packed = 0;
  if (r.values != nullptr) {
    for (std::size_t i = 0, g = 0; i < ops.count; ++i) {
      if (!is_get(kind_at(ops, i))) continue;
      const std::uint32_t len = r.value_lengths[i];
      if (len != 0 && packed != g * width) std::memmove(r.values + packed, r.values + g * width, len);
      packed += len;
      ++g;
    }
  }
  r.values_size = packed;
}

}  // namespace

Batcher::Batcher(Table& table, BatcherConfig config, std::function<void(const BatchReport&)> on_batch,
                 std::function<void(const TableStats&, std::size_t)> on_executed, BatchLog log)
    : table_(table),
      config_(bounded(config, table)),
      on_batch_(std::move(on_batch)),
      on_executed_(std::move(on_executed)),
      log_(std::move(log)),
      batch_count_(log_ ? kBatchesWithLog : kBatches),
      key_width_(table.config().key_width),
      value_width_(table.config().value_width),
      value_stride_(table.value_stride()) {
  if (config_.batch_size == 0 || config_.batch_size > table.config().max_batch) {
    throw std::invalid_argument("batch_size must be 1.." + std::to_string(table.config().max_batch) +
                                " (the table's max_batch)");
  }
  for (std::size_t i = 0; i < batch_count_; ++i) {
    batches_.push_back(std::make_unique<StagedBatch>(table_, config_.batch_size, key_width_, value_stride_));
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
  std::lock_guard lock(mutex_);
  return pending_ops();
}

std::size_t Batcher::pending_ops() const { return (filling_ != nullptr ? filling_->size : 0) + queued_ops_; }

bool Batcher::table_idle() const { return closed_.empty() && !executing_; }

void Batcher::open_filling() {
  if (filling_ != nullptr || free_.empty()) return;
  filling_ = free_.back();
  free_.pop_back();
  filling_->reset();
}

Batcher::StagedBatch* Batcher::close_filling() {
  StagedBatch* batch = filling_;
  batch->closed = true;
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

void Batcher::publish(std::unique_lock<std::mutex>& lock, StagedBatch& batch) {
  // The table keeps two prefetched uploads, and a new one replaces the older one not yet running: only the
  // batch that runs next is prefetched here; the execution thread prefetches the one after it when it
  // starts this one.
  const bool next = closed_.front() == &batch;
  batch.prefetched = next;
  // No other thread touches a closed batch with no copies in flight until it is ready, so the rejection of
  // expired calls' rows and the prefetch run outside the lock.
  lock.unlock();
  for (const Segment& s : batch.segments) {
    if (s.expired) std::memset(batch.ops + s.row, kRejectedOp, s.count);
  }
  if (next) prefetch(batch);
  lock.lock();
  batch.ready = true;
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
  std::unique_lock lock(mutex_);
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
            if (StagedBatch* closed = close_filling()) publish(lock, *closed);
          }
        } else if (first_rows) {
          wake = true;  // the staging thread times the batch from its first op
        }
      }
      if (!queue_.empty() && filling_ != nullptr) wake = true;  // the rest of a call larger than the room left
      run_stage_work(lock, work);
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
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    draining_ = true;
  }
  queue_changed_.notify_all();
  {
    std::unique_lock lock(mutex_);
    // Every batch free (or the empty filling one): nothing queued, running or being answered.
    idle_.wait(lock, [&] {
      return queue_.empty() && free_.size() + 1 == batch_count_ && filling_ != nullptr && filling_->size == 0 && refusing_ == 0;
    });
    stopping_ = true;
  }
  queue_changed_.notify_all();
  batch_ready_.notify_all();
  if (stager_.joinable()) stager_.join();
  if (executor_.joinable()) executor_.join();
  {
    std::lock_guard lock(log_mutex_);  // every batch is free: none is waiting to be logged
    log_stop_ = true;
  }
  log_ready_.notify_all();
  if (logger_.joinable()) logger_.join();
  {
    std::lock_guard lock(completion_mutex_);  // every job is done: every batch is free
    completion_stop_ = true;
  }
  completion_ready_.notify_all();
  for (auto& t : completers_) t.join();
}

void Batcher::complete_loop() {
  std::unique_lock lock(completion_mutex_);
  for (;;) {
    completion_ready_.wait(lock, [&] { return !answer_jobs_.empty() || completion_stop_; });
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

namespace {

// Copies a run of one call's ops into the batch's columns; a malformed op becomes a rejected row. (A
// template only so that it can take the batcher's private types.)
template <class Batch, class Seg>
void copy_segment(Batch& batch, const Seg& s, const CallOps& ops, std::uint32_t key_width, std::uint32_t value_width,
                  std::uint32_t value_stride, CopyCounts& counts) {
  std::size_t key_offset = s.key_offset, value_offset = s.value_offset, write_index = s.write_index;
  for (std::size_t j = 0; j < s.count; ++j) {
    const std::size_t i = s.first_op + j, row = s.row + j;
    const std::uint8_t kind = kind_at(ops, i);
    const std::uint32_t key_len = ops.key_lengths[i];
    const bool writes = carries_value(kind);
    const std::uint32_t value_len = writes ? ops.value_lengths[write_index] : 0;
    const bool valid = kind < kOpKindCount && key_len >= 1 && key_len <= key_width && value_len <= value_width;
    batch.ops[row] = valid ? kind : kRejectedOp;
    batch.key_lens[row] = valid ? static_cast<std::uint8_t>(key_len) : 0;
    if (valid) std::memcpy(batch.keys + row * key_width, ops.keys.data() + key_offset, key_len);
    batch.value_lens[row] = valid ? value_len : 0;
    counts.writes += valid && writes;
    counts.gets += valid && is_get(kind);
    if (valid && value_len != 0) std::memcpy(batch.values + row * value_stride, ops.values.data() + value_offset, value_len);
    key_offset += key_len;
    if (writes) {
      value_offset += value_len;
      ++write_index;
    }
  }
}

}  // namespace

void Batcher::run_stage_work(std::unique_lock<std::mutex>& lock, StageWork& work) {
  if (work.batch == nullptr && work.expired.empty()) return;
  // A few rows copy faster than the lock is given up and taken back (and other threads wait on it less
  // than they would for the hand-off); refused calls are answered outside the lock.
  const bool under_lock = work.rows <= kRowsCopiedUnderLock && work.expired.empty();
  // Outside the lock, the batch's segment list may grow (and move) while these rows are copied: copy them
  // from a list of their own.
  std::vector<Segment> own;
  const Segment* segments = nullptr;
  if (work.batch != nullptr) {
    const auto first = work.batch->segments.begin() + static_cast<std::ptrdiff_t>(work.first_segment);
    if (!under_lock) own.assign(first, first + static_cast<std::ptrdiff_t>(work.last_segment - work.first_segment));
    segments = under_lock ? &*first : own.data();
  }
  if (!under_lock) lock.unlock();
  for (auto& c : work.expired) c->call.done(CallCode::kDeadlineExceeded, kExpired);
  const std::size_t refused = work.expired.size();
  work.expired.clear();
  CopyCounts counts;
  Clock::duration copy_time{};
  if (work.batch != nullptr) {
    // The rows are this thread's alone, and the calls' columns do not change: no lock needed.
    const Clock::time_point start = Clock::now();
    for (std::size_t k = 0; k < work.last_segment - work.first_segment; ++k) {
      const Segment& seg = segments[k];
      copy_segment(*work.batch, seg, seg.call->call.ops, key_width_, value_width_, value_stride_, counts);
    }
    copy_time = Clock::now() - start;
  }
  if (!under_lock) lock.lock();
  if (refused != 0) {
    refusing_ -= refused;
    idle_.notify_all();
  }
  if (work.batch == nullptr) return;
  StagedBatch& batch = *work.batch;
  batch.writes += counts.writes;
  batch.gets += counts.gets;
  batch.stage_time += copy_time;
  if (--batch.copies == 0 && batch.closed) publish(lock, batch);
}

void Batcher::stage_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    if (stopping_) return;
    const Clock::time_point now = Clock::now();
    if (filling_ != nullptr && !queue_.empty()) {  // calls waited for a batch: move them in
      StageWork work = reserve_queued(now);
      run_stage_work(lock, work);
      continue;
    }
    const std::size_t filled = filling_ != nullptr ? filling_->size : 0;
    const Clock::time_point oldest = filled != 0 ? filling_->oldest : queue_.empty() ? now : queue_.front()->arrived;
    const BatchDecision d = decide_batch(pending_ops(), oldest, now, config_.batch_size, config_.max_delay,
                                         draining_, config_.launch_when_idle, table_idle());
    if (d.launch && filled != 0) {
      if (StagedBatch* batch = close_filling()) publish(lock, *batch);
      continue;
    }
    // Nothing to launch yet, or every batch busy (the execution thread wakes this one when one frees up).
    if (!d.launch && d.wait != Clock::duration::max()) {
      queue_changed_.wait_for(lock, d.wait);
    } else {
      queue_changed_.wait(lock);
    }
  }
}

void Batcher::execute_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    batch_ready_.wait(lock, [&] { return (!closed_.empty() && closed_.front()->ready) || !reports_.empty() || stopping_; });
    // Reports of answered batches go out here, between executions, so that on_batch (which updates the
    // metrics) never waits for one.
    while (!reports_.empty()) {
      const BatchReport report = reports_.front();
      reports_.pop_front();
      lock.unlock();
      if (on_batch_) on_batch_(report);
      lock.lock();
    }
    if (closed_.empty() || !closed_.front()->ready) {
      if (stopping_) return;
      continue;
    }
    StagedBatch* batch = closed_.front();
    closed_.pop_front();
    executing_ = true;
    // The batch after this one, if ready and not yet on its way (publish prefetched only the next one).
    StagedBatch* after = !closed_.empty() && closed_.front()->ready && !closed_.front()->prefetched ? closed_.front() : nullptr;
    if (after != nullptr) after->prefetched = true;
    lock.unlock();
    if (after != nullptr) prefetch(*after);
    execute(*batch);
    if (log_) {
      if (!batch->failed) log_.encode(batch->in(), batch->status, &batch->log_record);
      // Logged and answered by the log thread, in order, while the next batch runs.
      {
        std::lock_guard log_lock(log_mutex_);
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
      if (StagedBatch* next = close_filling()) publish(lock, *next);
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
  std::unique_lock lock(log_mutex_);
  std::deque<StagedBatch*> group;
  for (;;) {
    log_ready_.wait(lock, [&] { return !log_queue_.empty() || log_stop_; });
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
    const bool writes = std::any_of(batch.ops + s.row, batch.ops + s.row + s.count, [](std::uint8_t op) {
      return op == static_cast<std::uint8_t>(OpKind::kDelete) || carries_value(op);
    });
    if (writes && s.call->failure.empty()) {
      s.call->failure_code = CallCode::kUnavailable;
      s.call->failure = "the write-ahead log failed, the call's writes are not durable: " + error;
    }
  }
}

void Batcher::hand_out_answers(StagedBatch& batch) {
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
    std::lock_guard lock(completion_mutex_);
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
    if (!batch.failed && !s.expired) write_results(batch, s, counts);
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

void Batcher::write_results(const StagedBatch& batch, const Segment& s, ResultCounts& counts) {
  CallState& c = *s.call;
  CallResults& r = *c.call.results;
  const CallOps& ops = c.call.ops;
  // Each segment writes only its own ops' entries, so segments of one call answered at once never meet. A
  // call's only segment packs its values as it goes; one of several writes each value at its GET's own slot
  // (the g-th GET's at g * value_width), and complete() packs them.
  const bool whole = s.count == ops.count;
  std::memcpy(r.results + s.first_op, batch.status + s.row, s.count);
  std::size_t at = whole ? 0 : s.get_index * value_width_;  // where the next GET's value goes
  for (std::size_t j = 0; j < s.count; ++j) {
    const std::size_t i = s.first_op + j, row = s.row + j;
    const std::uint8_t status = batch.status[row];
    const std::uint8_t kind = kind_at(ops, i);
    if (is_get(kind)) {
      if (status == static_cast<std::uint8_t>(OpStatus::kOk)) {
        const std::uint32_t len = batch.out_value_lens[row];
        copy_value(r.values + at, batch.out_values + row * value_stride_, len, value_width_);
        r.value_lengths[i] = len;
        at += whole ? len : value_width_;
      } else if (!whole) {
        at += value_width_;
      }
    }
    if (kind < kOpKindCount && status < counts[kind].size()) counts[kind][status] += 1;
  }
  if (whole) {
    r.values_size = at;
    c.packed = true;
  }
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
  std::unique_lock lock(mutex_);
  if (on_batch_) {
    reports_.push_back(batch.report);
    batch_ready_.notify_one();
  }
  free_.push_back(&batch);
  open_filling();
  // Queued calls have a batch to go into now: only then has the staging thread something new to do.
  if (!queue_.empty()) queue_changed_.notify_one();
  idle_.notify_all();
}

}  // namespace gpukv::server
