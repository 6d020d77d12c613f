#include "gpukv/stream.hpp"

#include "result_columns.hpp"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <string>

namespace gpukv::client {
namespace {

// The stream whose callback this thread is running: send() from inside a callback must not wait for room,
// because only the read side (which is running that very callback) can make it.
thread_local const void* t_dispatching = nullptr;

}  // namespace

OpGroup& OpGroup::add(v1::OpKind kind, std::string_view key, std::string_view value) {
  if (!v1::OpKind_IsValid(kind)) throw std::invalid_argument("unknown op kind " + std::to_string(static_cast<int>(kind)));
  request_.mutable_ops()->push_back(static_cast<char>(kind));
  request_.mutable_keys()->append(key);
  request_.add_key_lengths(static_cast<std::uint32_t>(key.size()));
  if (carries_value(kind)) {
    request_.mutable_values()->append(value);
    request_.add_value_lengths(static_cast<std::uint32_t>(value.size()));
  }
  return *this;
}

void OpGroup::clear() { request_.Clear(); }  // protobuf's Clear keeps string and repeated-field capacity

void OpGroup::reserve(std::size_t ops, std::size_t key_bytes, std::size_t value_bytes) {
  request_.mutable_ops()->reserve(ops);
  request_.mutable_keys()->reserve(key_bytes);
  request_.mutable_key_lengths()->Reserve(static_cast<int>(ops));
  request_.mutable_values()->reserve(value_bytes);
  request_.mutable_value_lengths()->Reserve(static_cast<int>(ops));
}

std::string GroupResult::adopt(v1::StreamResponse&& response, std::size_t ops) {
  std::string error = check_result_columns(ops, response.results(), response.value_lengths(), response.values());
  if (!error.empty()) return error;
  // A response without value lengths (no GET found anything) is as valid as one with a zero per op.
  offsets_.assign(ops + 1, 0);
  for (int i = 0; i < response.value_lengths_size(); ++i) {
    offsets_[static_cast<std::size_t>(i) + 1] = offsets_[static_cast<std::size_t>(i)] + response.value_lengths(i);
  }
  response_ = std::move(response);
  return {};
}

// The call's state. All of it is guarded by mutex_; gRPC is called outside the lock. The write side runs
// from callers' threads (send, close), so it holds a hold on the call from StartCall until no write can
// follow (WritesDone sent, or the stream broken); reads are started only before StartCall and from
// OnReadDone, one at a time, which also makes the callbacks of one stream run one at a time.
class Stream::Reactor final : public grpc::ClientBidiReactor<v1::StreamRequest, v1::StreamResponse> {
 public:
  Reactor(std::shared_ptr<grpc::Channel> channel, std::size_t max_in_flight)
      : channel_(std::move(channel)), max_in_flight_(max_in_flight) {}

  void start(v1::KeyValue::Stub& stub, std::chrono::milliseconds timeout) {
    if (timeout < std::chrono::hours(24 * 365)) context_.set_deadline(std::chrono::system_clock::now() + timeout);
    stub.async()->Stream(&context_, this);
    AddHold();
    StartRead(&incoming_);
    StartCall();
  }

  grpc::Status submit(OpGroup& group, GroupCallback done, std::uint64_t* id, bool wait) {
    if (group.empty()) return {grpc::StatusCode::INVALID_ARGUMENT, "a group needs at least one operation"};
    if (!done) return {grpc::StatusCode::INVALID_ARGUMENT, "a group needs a callback"};
    const bool in_callback = t_dispatching == this;
    WriteStep step;
    {
      std::unique_lock lock(mutex_);
      for (;;) {
        if (closing_) return {grpc::StatusCode::FAILED_PRECONDITION, "the stream is closed"};
        if (broken_) {
          if (done_) return final_;
          if (in_callback || !wait) return {grpc::StatusCode::CANCELLED, "the stream is ending"};
          wait_for_change(lock);
          continue;
        }
        if (in_flight_ < max_in_flight_) break;
        if (in_callback || !wait) {
          return {grpc::StatusCode::RESOURCE_EXHAUSTED, std::to_string(in_flight_) + " groups in flight"};
        }
        wait_for_change(lock);
      }
      const std::uint64_t group_id = next_id_++;
      if (id != nullptr) *id = group_id;
      group.request_.set_id(group_id);
      pending_.push_back(Pending{std::move(done), group.size(), false});
      ++in_flight_;
      writes_.push_back(std::move(group.request_));
      group.request_.Clear();
      step = next_write();
    }
    run(step);
    return grpc::Status::OK;
  }

  grpc::Status close() {
    WriteStep step;
    {
      std::lock_guard lock(mutex_);
      if (!closing_) {
        closing_ = true;
        step = next_write();
      }
    }
    run(step);
    if (t_dispatching == this) return {grpc::StatusCode::FAILED_PRECONDITION, "close() from inside a callback would wait forever"};
    return wait_done();
  }

  grpc::Status wait_done() {
    std::unique_lock lock(mutex_);
    while (!done_) wait_for_change(lock);
    return final_;
  }

  void cancel() { context_.TryCancel(); }

  bool done() const {
    std::lock_guard lock(mutex_);
    return done_;
  }

  std::size_t in_flight() const {
    std::lock_guard lock(mutex_);
    return in_flight_;
  }

  void OnWriteDone(bool ok) override {
    WriteStep step;
    {
      std::lock_guard lock(mutex_);
      writing_ = false;
      writes_.pop_front();
      if (!ok) broken_ = true;  // the call is over; its status comes with OnDone
      step = next_write();
    }
    run(step);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the server finished (after answering everything, or on an error), or the call broke
      WriteStep step;
      {
        std::lock_guard lock(mutex_);
        broken_ = true;
        step = next_write();
        notify_waiters();  // senders waiting for room learn that the stream is ending
      }
      run(step);
      return;
    }
    // The response is matched and taken apart under the lock, the callback runs outside it.
    GroupCallback done;
    GroupResult result;
    std::string error;
    bool matched = false;
    {
      std::lock_guard lock(mutex_);
      const std::uint64_t id = incoming_.id();
      matched = id >= first_id_ && id < next_id_ && !pending_[id - first_id_].answered;
      if (!matched) {
        if (protocol_error_.ok()) {
          protocol_error_ = grpc::Status(grpc::StatusCode::INTERNAL, "response for unknown request id " + std::to_string(id));
        }
      } else {
        Pending& p = pending_[id - first_id_];
        done = std::move(p.done);
        error = result.adopt(std::move(incoming_), p.ops);
        p.answered = true;
        --in_flight_;
        while (!pending_.empty() && pending_.front().answered) {
          pending_.pop_front();
          ++first_id_;
        }
        notify_waiters();  // room for a waiting sender
      }
      incoming_.Clear();
    }
    if (!matched) {
      context_.TryCancel();  // the read below then fails, and OnDone reports the protocol error
    } else {
      dispatch(done, error.empty() ? grpc::Status::OK : grpc::Status(grpc::StatusCode::INTERNAL, "malformed response: " + error),
               std::move(result));
    }
    StartRead(&incoming_);
  }

  void OnDone(const grpc::Status& status) override {
    std::vector<GroupCallback> unanswered;
    grpc::Status final_status;
    {
      std::lock_guard lock(mutex_);
      final_status = protocol_error_.ok() ? status : protocol_error_;
      if (final_status.ok() && in_flight_ > 0) {
        final_status = grpc::Status(grpc::StatusCode::INTERNAL,
                                    "the stream ended with " + std::to_string(in_flight_) + " groups unanswered");
      }
      for (Pending& p : pending_) {
        if (!p.answered) unanswered.push_back(std::move(p.done));
      }
      pending_.clear();
      in_flight_ = 0;
      writes_.clear();
      broken_ = true;
    }
    for (GroupCallback& done : unanswered) dispatch(done, final_status, GroupResult{});
    // Published only now, so that close() returns after the last callback; this is OnDone's last touch of
    // the object (the Stream may destroy it as soon as it sees done_). The reactor must not be destroyed here:
    // its ClientContext holds a reference to the channel, and the last one dropped on a gRPC callback thread
    // destroys the channel there, which can tear down gRPC's shared callback queue from one of its own
    // threads (the queue is then freed under that thread: "ref_counted.h assertion failed: prior > 0").
    std::lock_guard lock(mutex_);
    final_ = final_status;
    done_ = true;
    notify_waiters();
  }

 private:
  struct Pending {
    GroupCallback done;  // empty once answered
    std::size_t ops;     // the group's op count, to check its response against
    bool answered;
  };

  // What the write side does next, decided under the lock and carried out outside it.
  struct WriteStep {
    enum Kind { kNone, kWrite, kWritesDone, kReleaseHold } kind = kNone;
    const v1::StreamRequest* request = nullptr;  // for kWrite
  };

  // Lock held. One write is outstanding at a time; the hold is released exactly once, when no write can
  // follow.
  WriteStep next_write() {
    if (writing_ || !holding_) return {};
    if (broken_) {
      writes_.clear();  // never written; their groups fail with the stream's status in OnDone
      holding_ = false;
      return {WriteStep::kReleaseHold};
    }
    if (!writes_.empty()) {
      writing_ = true;
      return {WriteStep::kWrite, &writes_.front()};  // deque elements stay put while others are pushed
    }
    if (closing_) {
      holding_ = false;
      return {WriteStep::kWritesDone};
    }
    return {};
  }

  void run(const WriteStep& step) {
    switch (step.kind) {
      case WriteStep::kNone: break;
      case WriteStep::kWrite: StartWrite(step.request); break;
      case WriteStep::kWritesDone:
        StartWritesDone();
        RemoveHold();
        break;
      case WriteStep::kReleaseHold: RemoveHold(); break;
    }
  }

  // Lock held by both. Waiters are rare (a sender at the in-flight bound, close(), the destructor), so a
  // response notifies only when someone waits, and then under the lock: once done_ is set the Stream may
  // destroy this object, and the notification must not come after that.
  void wait_for_change(std::unique_lock<std::mutex>& lock) {
    ++waiters_;
    changed_.wait(lock);
    --waiters_;
  }
  void notify_waiters() {
    if (waiters_ > 0) changed_.notify_all();
  }

  void dispatch(GroupCallback& done, const grpc::Status& status, GroupResult&& result) {
    t_dispatching = this;
    done(status, std::move(result));
    t_dispatching = nullptr;
  }

  const std::shared_ptr<grpc::Channel> channel_;  // the call's channel lives as long as the call
  const std::size_t max_in_flight_;
  grpc::ClientContext context_;
  v1::StreamResponse incoming_;  // the read in progress; touched only by gRPC and OnReadDone

  mutable std::mutex mutex_;             // guards everything below
  std::condition_variable changed_;      // room for a group, the stream ending, or ended
  int waiters_ = 0;                      // threads waiting on changed_
  std::deque<v1::StreamRequest> writes_;  // accepted and not yet written; the front is being written while writing_
  std::deque<Pending> pending_;          // sent groups by id, from first_id_; the answered ones at the front pop
  std::uint64_t first_id_ = 1;           // the id of pending_.front()
  std::uint64_t next_id_ = 1;            // the id of the next group
  std::size_t in_flight_ = 0;            // groups accepted and not answered
  bool writing_ = false;                 // a StartWrite is outstanding
  bool holding_ = true;                  // the write side's hold on the call is still held
  bool closing_ = false;                 // close() was called: no more groups
  bool broken_ = false;                  // the call is ending: no more writes, no more groups
  bool done_ = false;                    // OnDone has run its callbacks; final_ is set
  grpc::Status protocol_error_;          // a response the stream could not match (the server's fault)
  grpc::Status final_;
};

Stream::Stream(v1::KeyValue::Stub& stub, std::shared_ptr<grpc::Channel> channel, std::chrono::milliseconds timeout,
               std::size_t max_in_flight) {
  if (max_in_flight == 0) throw std::invalid_argument("max_in_flight must be at least 1");
  reactor_ = std::make_shared<Reactor>(std::move(channel), max_in_flight);
  reactor_->start(stub, timeout);
}

Stream::~Stream() {
  if (!reactor_->done()) reactor_->cancel();
  reactor_->wait_done();
}

grpc::Status Stream::send(OpGroup& group, GroupCallback done, std::uint64_t* id) {
  return reactor_->submit(group, std::move(done), id, /*wait=*/true);
}

grpc::Status Stream::try_send(OpGroup& group, GroupCallback done, std::uint64_t* id) {
  return reactor_->submit(group, std::move(done), id, /*wait=*/false);
}

grpc::Status Stream::call(OpGroup& group, GroupResult* result) {
  if (t_dispatching == reactor_.get()) return {grpc::StatusCode::FAILED_PRECONDITION, "call() from inside a callback would wait forever"};
  std::mutex m;
  std::condition_variable cv;
  bool answered = false;
  grpc::Status status;
  grpc::Status sent = send(group, [&](const grpc::Status& s, GroupResult&& r) {
    std::lock_guard lock(m);
    status = s;
    *result = std::move(r);
    answered = true;
    cv.notify_one();  // under the lock: the waiter's locals (m, cv) die as soon as it sees `answered`
  });
  if (!sent.ok()) return sent;
  std::unique_lock lock(m);
  cv.wait(lock, [&] { return answered; });
  return status;
}

grpc::Status Stream::close() { return reactor_->close(); }

void Stream::cancel() { reactor_->cancel(); }

std::size_t Stream::in_flight() const { return reactor_->in_flight(); }

}  // namespace gpukv::client
