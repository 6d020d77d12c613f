#include "batcher.hpp"

#include <pthread.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace gpukv::server {

// Two staging batches: one filling while the other runs.
constexpr std::size_t kBatches = 2;

// Kind byte of a staged op that failed validation: the table answers it kInvalid and changes nothing.
constexpr std::uint8_t kRejectedOp = 0xFF;

struct Batcher::CallState {
  Call call;
  Clock::time_point arrived;
  // Where staging resumes for a call that spans batches (touched by the staging thread only).
  std::size_t next_op = 0;
  std::size_t key_offset = 0;
  std::size_t value_offset = 0;
  std::size_t write_index = 0;
  bool failed = false;         // done() already ran with an error (execution thread only)
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
};

// A device batch in the table's column layout, plus which call each row answers. The columns are carved from
// one block of the table's host memory (pinned on the GPU backend), so that the table copies them by DMA and
// can prefetch a staged batch while the previous one runs.
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
  std::size_t size = 0;
  std::size_t writes = 0, gets = 0;  // valid PUTs and GETs staged
  Clock::time_point oldest{};
  Clock::duration stage_time{};
  std::vector<Segment> segments;
  std::vector<std::unique_ptr<CallState>> owned;  // calls whose last ops are in this batch

  // A batch without writes leaves out the value columns, and one without GETs the result values: the GPU
  // backend copies only the columns given.
  BatchIn in() const {
    return BatchIn{size, ops, keys, key_lens, writes != 0 ? values : nullptr, writes != 0 ? value_lens : nullptr};
  }
  BatchOut out() const { return BatchOut{status, gets != 0 ? out_values : nullptr, gets != 0 ? out_value_lens : nullptr}; }
};

Batcher::Batcher(Table& table, BatcherConfig config, std::function<void(const BatchReport&)> on_batch)
    : table_(table),
      config_(config),
      on_batch_(std::move(on_batch)),
      key_width_(table.config().key_width),
      value_width_(table.config().value_width),
      value_stride_(table.value_stride()) {
  if (config_.batch_size == 0 || config_.batch_size > table.config().max_batch) {
    throw std::invalid_argument("batch_size must be 1.." + std::to_string(table.config().max_batch) +
                                " (the table's max_batch)");
  }
  for (std::size_t i = 0; i < kBatches; ++i) {
    free_.push_back(std::make_unique<StagedBatch>(table_, config_.batch_size, key_width_, value_stride_));
  }
  // Named, so that per-thread tools (top -H, perf, /proc) tell them apart.
  stager_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "gpukv-stage");
    stage_loop();
  });
  executor_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "gpukv-execute");
    execute_loop();
  });
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
  return queued_ops_;
}

void Batcher::submit(Call call) {
  const std::size_t n = call.ops.count;
  call.results->results.assign(n, static_cast<char>(OpStatus::kInvalid));
  call.results->values.clear();
  if (call.ops.kinds.empty() && call.ops.kind == OpKind::kGet) call.results->values.reserve(n * value_width_);
  call.results->value_lengths.assign(n, 0);
  auto state = std::make_unique<CallState>();
  state->call = std::move(call);
  state->arrived = Clock::now();
  const char* refusal = nullptr;
  CallCode code = CallCode::kOk;
  bool wake = false;
  {
    std::lock_guard lock(mutex_);
    if (draining_) {
      refusal = "the server is draining";
      code = CallCode::kUnavailable;
    } else if (queued_ops_ + n > config_.max_queued_ops) {
      refusal = n > config_.max_queued_ops ? "the call has more operations than the queue holds" : "the queue is full";
      code = CallCode::kResourceExhausted;
    } else if (n == 0) {
      code = CallCode::kOk;  // nothing to do: answered at once below
    } else {
      // The staging thread's decision changes only when the queue stops being empty or fills a batch:
      // waking it for every call would cost a context switch per call and decide nothing.
      wake = queued_ops_ == 0 || (queued_ops_ < config_.batch_size && queued_ops_ + n >= config_.batch_size);
      queued_ops_ += n;
      queue_.push_back(std::move(state));
    }
  }
  if (state != nullptr) {  // refused or empty: finish outside the lock
    state->call.done(code, refusal != nullptr ? refusal : "");
    return;
  }
  if (wake) queue_changed_.notify_one();
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
    idle_.wait(lock, [&] { return queue_.empty() && staged_.empty() && free_.size() == kBatches; });
    stopping_ = true;
  }
  queue_changed_.notify_all();
  batch_ready_.notify_all();
  if (stager_.joinable()) stager_.join();
  if (executor_.joinable()) executor_.join();
  {
    std::unique_lock lock(completion_mutex_);
    completion_idle_.wait(lock, [&] { return completions_.empty() && completing_ == 0; });
    completion_stop_ = true;
  }
  completion_ready_.notify_all();
  for (auto& t : completers_) t.join();
}

void Batcher::complete_loop() {
  std::unique_lock lock(completion_mutex_);
  for (;;) {
    completion_ready_.wait(lock, [&] { return !completions_.empty() || completion_stop_; });
    if (completions_.empty()) return;
    std::unique_ptr<CallState> c = std::move(completions_.front());
    completions_.pop_front();
    ++completing_;
    lock.unlock();
    c->call.done(CallCode::kOk, "");
    c.reset();
    lock.lock();
    --completing_;
    if (completions_.empty() && completing_ == 0) completion_idle_.notify_all();
  }
}

std::vector<std::unique_ptr<Batcher::CallState>> Batcher::fill(StagedBatch& batch, Clock::time_point now) {
  std::vector<std::unique_ptr<CallState>> expired;
  batch.size = 0;
  batch.writes = batch.gets = 0;
  batch.segments.clear();
  batch.owned.clear();
  while (!queue_.empty() && batch.size < config_.batch_size) {
    CallState& c = *queue_.front();
    const std::size_t count = c.call.ops.count;
    if (c.next_op == 0 && now > c.call.deadline) {  // not started: refuse it whole
      queued_ops_ -= count;
      expired.push_back(std::move(queue_.front()));
      queue_.pop_front();
      continue;
    }
    if (batch.size == 0) batch.oldest = c.arrived;
    const std::size_t take = std::min(count - c.next_op, config_.batch_size - batch.size);
    batch.segments.push_back(Segment{&c, c.next_op, take, batch.size, c.key_offset, c.value_offset, c.write_index});
    // A call that goes on in the next batch: advance its cursors past the ops taken (their bytes are copied
    // later, outside the lock). A call that ends here needs no cursors.
    const CallOps& ops = c.call.ops;
    for (std::size_t i = c.next_op; c.next_op + take < count && i < c.next_op + take; ++i) {
      c.key_offset += ops.key_lengths[i];
      const auto kind = static_cast<OpKind>(ops.kinds.empty() ? static_cast<std::uint8_t>(ops.kind) : ops.kinds[i]);
      if (kind == OpKind::kPut || kind == OpKind::kPutIfAbsent) c.value_offset += ops.value_lengths[c.write_index++];
    }
    c.next_op += take;
    batch.size += take;
    queued_ops_ -= take;
    if (c.next_op == count) {
      batch.owned.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
  }
  return expired;
}

void Batcher::stage_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    if (stopping_) return;
    const Clock::time_point now = Clock::now();
    const Clock::time_point oldest = queue_.empty() ? now : queue_.front()->arrived;
    // While this thread decides it holds no batch, so every batch not free is staged or running.
    const bool table_idle = free_.size() == kBatches;
    const BatchDecision d = decide_batch(queued_ops_, oldest, now, config_.batch_size, config_.max_delay, draining_,
                                         config_.launch_when_idle, table_idle);
    if (!d.launch) {
      if (d.wait == Clock::duration::max()) {
        queue_changed_.wait(lock);
      } else {
        queue_changed_.wait_for(lock, d.wait);
      }
      continue;
    }
    if (free_.empty()) {  // both batches busy: wait for the execution thread
      queue_changed_.wait(lock);
      continue;
    }
    std::unique_ptr<StagedBatch> batch = std::move(free_.back());
    free_.pop_back();
    std::vector<std::unique_ptr<CallState>> expired = fill(*batch, now);
    lock.unlock();

    for (auto& c : expired) c->call.done(CallCode::kDeadlineExceeded, "the deadline passed while the call was queued");
    // Copy the columns into the batch. Only the staging thread touches a call's columns and cursors.
    const Clock::time_point copy_start = Clock::now();
    for (const Segment& s : batch->segments) {
      const CallOps& ops = s.call->call.ops;
      std::size_t key_offset = s.key_offset, value_offset = s.value_offset, write_index = s.write_index;
      for (std::size_t j = 0; j < s.count; ++j) {
        const std::size_t i = s.first_op + j, row = s.row + j;
        const std::uint8_t kind = ops.kinds.empty() ? static_cast<std::uint8_t>(ops.kind) : static_cast<std::uint8_t>(ops.kinds[i]);
        const std::uint32_t key_len = ops.key_lengths[i];
        const bool writes = kind == static_cast<std::uint8_t>(OpKind::kPut) || kind == static_cast<std::uint8_t>(OpKind::kPutIfAbsent);
        const std::uint32_t value_len = writes ? ops.value_lengths[write_index] : 0;
        const bool valid = kind < kOpKindCount && key_len >= 1 && key_len <= key_width_ && value_len <= value_width_;
        batch->ops[row] = valid ? kind : kRejectedOp;
        batch->key_lens[row] = valid ? static_cast<std::uint8_t>(key_len) : 0;
        if (valid) std::memcpy(batch->keys + row * key_width_, ops.keys.data() + key_offset, key_len);
        batch->value_lens[row] = valid ? value_len : 0;
        batch->writes += valid && writes;
        batch->gets += valid && kind == static_cast<std::uint8_t>(OpKind::kGet);
        if (valid && value_len != 0) {
          std::memcpy(batch->values + row * value_stride_, ops.values.data() + value_offset, value_len);
        }
        key_offset += key_len;
        if (writes) {
          value_offset += value_len;
          ++write_index;
        }
      }
    }

    batch->stage_time = Clock::now() - copy_start;
    // On the GPU backend its input starts on its way to the GPU now, while the previous batch runs.
    if (batch->size != 0) table_.prefetch(batch->in());

    lock.lock();
    if (batch->size == 0) {  // every call in it had expired
      free_.push_back(std::move(batch));
      idle_.notify_all();
      continue;
    }
    staged_.push_back(std::move(batch));
    batch_ready_.notify_one();
  }
}

void Batcher::execute_loop() {
  for (;;) {
    std::unique_ptr<StagedBatch> batch;
    {
      std::unique_lock lock(mutex_);
      batch_ready_.wait(lock, [&] { return !staged_.empty() || stopping_; });
      if (staged_.empty()) return;
      batch = std::move(staged_.front());
      staged_.pop_front();
    }
    finish_batch(*batch);
    {
      std::lock_guard lock(mutex_);
      free_.push_back(std::move(batch));
    }
    queue_changed_.notify_one();
    idle_.notify_all();
  }
}

void Batcher::finish_batch(StagedBatch& batch) {
  BatchReport report;
  report.ops = batch.size;
  report.stage_time = batch.stage_time;
  const Clock::time_point start = Clock::now();
  report.queue_delay = start - batch.oldest;
  try {
    table_.execute(batch.in(), batch.out());
  } catch (const std::exception& e) {
    // The table could not run the batch (a device fault): its calls fail; none is answered twice.
    for (const Segment& s : batch.segments) {
      CallState& c = *s.call;
      if (!c.failed) {
        c.failed = true;
        c.call.done(CallCode::kUnavailable, std::string("the table failed: ") + e.what());
      }
    }
    batch.owned.clear();
    return;
  }
  const Clock::time_point executed = Clock::now();
  report.execute_time = executed - start;

  for (const Segment& s : batch.segments) {
    CallState& c = *s.call;
    if (c.failed) continue;  // answered with an error in an earlier batch: its results may be gone
    CallResults& r = *c.call.results;
    const CallOps& ops = c.call.ops;
    for (std::size_t j = 0; j < s.count; ++j) {
      const std::size_t i = s.first_op + j, row = s.row + j;
      const std::uint8_t status = batch.status[row];
      r.results[i] = static_cast<char>(status);
      const std::uint8_t kind = ops.kinds.empty() ? static_cast<std::uint8_t>(ops.kind) : static_cast<std::uint8_t>(ops.kinds[i]);
      if (kind == static_cast<std::uint8_t>(OpKind::kGet) && status == static_cast<std::uint8_t>(OpStatus::kOk)) {
        const std::uint32_t len = batch.out_value_lens[row];
        r.values.append(reinterpret_cast<const char*>(batch.out_values + row * value_stride_), len);
        r.value_lengths[i] = len;
      }
      if (kind < kOpKindCount && status < report.results[kind].size()) report.results[kind][status] += 1;
    }
  }
  // The calls whose last rows were in this batch have every result now (their earlier rows ran in earlier
  // batches). A call that failed in an earlier batch was answered then.
  if (completers_.empty()) {
    for (auto& c : batch.owned) {
      if (!c->failed) c->call.done(CallCode::kOk, "");
    }
  } else {
    std::size_t handed = 0;
    {
      std::lock_guard lock(completion_mutex_);
      for (auto& c : batch.owned) {
        if (c->failed) continue;
        completions_.push_back(std::move(c));
        ++handed;
      }
    }
    if (handed == 1) {
      completion_ready_.notify_one();
    } else if (handed > 1) {
      completion_ready_.notify_all();
    }
  }
  batch.owned.clear();
  report.answer_time = Clock::now() - executed;
  if (on_batch_) on_batch_(report);
}

}  // namespace gpukv::server
