// ClusterStream (gpukv/cluster.hpp): one Stream per shard behind one session.
//
// Locks: mutex_ guards the counts that callbacks change; send_mutex_ serialises senders while they split a
// group and hand its parts to the shards' streams (opening or replacing a shard's stream on the way). A
// sender first takes its room (a group in flight) under mutex_ alone, so that a callback, which may send
// from inside itself and must never wait for room, can never find send_mutex_ held by a sender that waits
// for room only callbacks can free. Under send_mutex_ nothing waits: each group hands at most one part to
// each shard's stream, and a shard's stream allows as many groups in flight as this session does, so
// try_send there always has room. The callbacks the shards' streams run capture a plain pointer to this
// state: close() returns only after every shard's stream has ended, which is after its last callback.
#include <atomic>
#include <condition_variable>
#include <mutex>

#include "gpukv/cluster.hpp"
#include "shard_split.hpp"

namespace gpukv::client {
namespace {

// The session whose callback this thread is running: send() from inside one must not wait for room.
thread_local const void* t_dispatching = nullptr;

}  // namespace

class ClusterStream::State {
 public:
  State(ClusterClient& cluster, const StreamOptions& options)
      : cluster_(cluster), options_(options), streams_(cluster.shard_count()), broken_(cluster.shard_count()) {
    if (options_.max_in_flight == 0) throw std::invalid_argument("max_in_flight must be at least 1");
    if (options_.timeout.count() == 0) options_.timeout = cluster.options().client.timeout;
  }

  grpc::Status submit(OpGroup& group, GroupCallback done, std::uint64_t* id, bool wait) {
    if (group.empty()) return {grpc::StatusCode::INVALID_ARGUMENT, "a group needs at least one operation"};
    if (!done) return {grpc::StatusCode::INVALID_ARGUMENT, "a group needs a callback"};
    auto pending = std::make_shared<Pending>();
    if (std::string error = detail::plan_split(cluster_.shard_map(), group.request_, &pending->plan); !error.empty()) {
      return {grpc::StatusCode::INVALID_ARGUMENT, "malformed group: " + error};
    }
    {
      std::unique_lock lock(mutex_);
      for (;;) {
        if (closing_) return {grpc::StatusCode::FAILED_PRECONDITION, "the stream is closed"};
        if (in_flight_ < options_.max_in_flight) break;
        if (t_dispatching == this || !wait) {
          return {grpc::StatusCode::RESOURCE_EXHAUSTED, std::to_string(in_flight_) + " groups in flight"};
        }
        ++waiters_;
        changed_.wait(lock);
        --waiters_;
      }
      ++in_flight_;
      ++active_;
    }
    std::unique_lock send_lock(send_mutex_);
    if (closed_streams_) {  // close() has taken the streams while this sender waited for the lock
      send_lock.unlock();
      std::lock_guard lock(mutex_);
      --in_flight_;
      --active_;
      if (waiters_ > 0) changed_.notify_all();
      return {grpc::StatusCode::FAILED_PRECONDITION, "the stream is closed"};
    }
    pending->id = next_id_++;
    if (id != nullptr) *id = pending->id;
    pending->done = std::move(done);
    pending->ops = group.size();
    const std::size_t parts = pending->plan.shards.size();
    pending->results.resize(parts);
    pending->status.assign(parts, grpc::Status::OK);
    pending->remaining.store(parts + 1);  // one more, held until every part is handed over
    std::vector<v1::StreamRequest> requests;
    if (parts == 1) {
      requests.push_back(std::move(group.request_));  // a group whose keys all belong to one shard goes as it is
    } else {
      detail::split_request(group.request_, pending->plan, &requests);
    }
    group.clear();
    for (std::size_t p = 0; p < parts; ++p) {
      const std::uint32_t shard = pending->plan.shards[p];
      OpGroup part;
      part.request_ = std::move(requests[p]);
      const grpc::Status sent = stream_to(shard).try_send(part, [this, pending, p, shard](const grpc::Status& s, GroupResult&& r) {
        part_done(*pending, p, shard, s, std::move(r));
      });
      if (!sent.ok()) {
        // Its stream has failed: ended (its final status), or still ending (CANCELLED, its final status not
        // known yet; the shard is unreachable all the same).
        const grpc::Status failed = sent.error_code() == grpc::StatusCode::CANCELLED
                                        ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "its stream failed: " + sent.error_message())
                                        : sent;
        part_done(*pending, p, shard, failed, GroupResult{});
      }
    }
    send_lock.unlock();  // the group's callback may run below, and may send
    arrive(*pending);
    return grpc::Status::OK;
  }

  // Idempotent; every callback has run when it returns.
  grpc::Status close() {
    {
      std::lock_guard lock(mutex_);
      closing_ = true;
    }
    if (t_dispatching == this) return {grpc::StatusCode::FAILED_PRECONDITION, "close() from inside a callback would wait forever"};
    std::vector<std::unique_ptr<Stream>> streams;
    {
      std::lock_guard send_lock(send_mutex_);  // no sender is between its parts
      closed_streams_ = true;
      for (auto& stream : streams_) {
        if (stream) streams.push_back(std::move(stream));
      }
      for (auto& stream : retired_) streams.push_back(std::move(stream));
      retired_.clear();
    }
    // Outside send_mutex_: a callback that sends meanwhile takes it, finds the session closing and returns.
    for (auto& stream : streams) note(stream->close());
    streams.clear();
    std::unique_lock lock(mutex_);
    ++waiters_;
    changed_.wait(lock, [&] { return active_ == 0; });
    --waiters_;
    return first_failure_;
  }

  void cancel() {
    std::lock_guard send_lock(send_mutex_);
    for (auto& stream : streams_) {
      if (stream) stream->cancel();
    }
  }

  std::size_t in_flight() const {
    std::lock_guard lock(mutex_);
    return in_flight_;
  }

  bool dispatching() const { return t_dispatching == this; }

 private:
  // A group in flight: its split, and its parts' answers until the last one arrives.
  struct Pending {
    detail::SplitPlan plan;
    std::uint64_t id = 0;
    std::size_t ops = 0;
    GroupCallback done;
    std::vector<GroupResult> results;   // per part
    std::vector<grpc::Status> status;   // per part
    std::atomic<std::size_t> remaining{0};
  };

  // send_mutex_ held. The shard's stream, opened now if it has none or its last one failed.
  Stream& stream_to(std::uint32_t shard) {
    if (streams_[shard] && broken_[shard].load(std::memory_order_acquire)) {
      retired_.push_back(std::move(streams_[shard]));  // closed (and waited for) by close(), never from a callback
    }
    if (!streams_[shard]) {
      broken_[shard].store(false, std::memory_order_relaxed);
      streams_[shard] = cluster_.shard(shard).stream({.timeout = options_.timeout, .max_in_flight = options_.max_in_flight});
    }
    return *streams_[shard];
  }

  void part_done(Pending& pending, std::size_t p, std::uint32_t shard, const grpc::Status& status, GroupResult&& result) {
    if (!status.ok()) {
      broken_[shard].store(true, std::memory_order_release);
      pending.status[p] = grpc::Status(status.error_code(), "shard " + std::to_string(shard) + " (" + cluster_.target(shard) +
                                                                "): " + status.error_message());
    } else {
      pending.results[p] = std::move(result);
      if (std::string error = detail::check_part(pending.results[p].response(), pending.plan.part_ops[p]); !error.empty()) {
        pending.status[p] = grpc::Status(grpc::StatusCode::INTERNAL, "shard " + std::to_string(shard) + ": malformed response: " + error);
      }
    }
    arrive(pending);
  }

  // The last part to arrive merges the group's answers and runs its callback.
  void arrive(Pending& pending) {
    if (pending.remaining.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    std::vector<v1::StreamResponse> parts;
    parts.reserve(pending.results.size());
    for (GroupResult& r : pending.results) parts.push_back(std::move(r.response_));
    v1::StreamResponse merged;
    if (parts.size() == 1 && pending.status[0].ok()) {
      merged = std::move(parts[0]);  // one shard's answer is the group's, in order already
    } else {
      detail::merge_responses(pending.plan, parts, pending.status, &merged);
    }
    merged.set_id(pending.id);
    GroupResult result;
    const std::string error = result.adopt(std::move(merged), pending.ops);  // built here, so it fits
    for (const grpc::Status& s : pending.status) note(s);
    const GroupCallback done = std::move(pending.done);
    {
      std::lock_guard lock(mutex_);
      --in_flight_;  // room for a sender, before the callback (which may itself send)
      if (waiters_ > 0) changed_.notify_all();
    }
    t_dispatching = this;
    done(error.empty() ? grpc::Status::OK : grpc::Status(grpc::StatusCode::INTERNAL, error), std::move(result));
    t_dispatching = nullptr;
    std::lock_guard lock(mutex_);
    --active_;
    if (waiters_ > 0) changed_.notify_all();  // under the lock: close() may return, and this object go, once it sees zero
  }

  void note(const grpc::Status& status) {
    if (status.ok()) return;
    std::lock_guard lock(mutex_);
    if (first_failure_.ok()) first_failure_ = status;
  }

  ClusterClient& cluster_;
  StreamOptions options_;

  std::mutex send_mutex_;  // one sender at a time; guards what follows up to mutex_
  std::vector<std::unique_ptr<Stream>> streams_;   // per shard; empty until its first part
  std::vector<std::unique_ptr<Stream>> retired_;   // failed streams, closed by close()
  std::vector<std::atomic<bool>> broken_;          // per shard: its stream failed a part (set by callbacks)
  std::uint64_t next_id_ = 1;
  bool closed_streams_ = false;                    // close() has taken the streams

  mutable std::mutex mutex_;  // guards everything below
  std::condition_variable changed_;  // room for a group, or a group finished
  int waiters_ = 0;
  std::size_t in_flight_ = 0;  // groups sent whose callback has not started
  std::size_t active_ = 0;     // groups sent whose callback has not returned
  bool closing_ = false;
  grpc::Status first_failure_;
};

ClusterStream::ClusterStream(ClusterClient& cluster, const StreamOptions& options)
    : state_(std::make_unique<State>(cluster, options)) {}

ClusterStream::~ClusterStream() {
  if (!closed_) state_->cancel();
  state_->close();
}

grpc::Status ClusterStream::send(OpGroup& group, GroupCallback done, std::uint64_t* id) {
  return state_->submit(group, std::move(done), id, /*wait=*/true);
}

grpc::Status ClusterStream::try_send(OpGroup& group, GroupCallback done, std::uint64_t* id) {
  return state_->submit(group, std::move(done), id, /*wait=*/false);
}

grpc::Status ClusterStream::call(OpGroup& group, GroupResult* result) {
  if (state_->dispatching()) return {grpc::StatusCode::FAILED_PRECONDITION, "call() from inside a callback would wait forever"};
  std::mutex m;
  std::condition_variable cv;
  bool answered = false;
  grpc::Status status;
  const grpc::Status sent = send(group, [&](const grpc::Status& s, GroupResult&& r) {
    std::lock_guard lock(m);
    status = s;
    *result = std::move(r);
    answered = true;
    cv.notify_one();
  });
  if (!sent.ok()) return sent;
  std::unique_lock lock(m);
  cv.wait(lock, [&] { return answered; });
  return status;
}

grpc::Status ClusterStream::close() {
  closed_ = true;
  return state_->close();
}

void ClusterStream::cancel() { state_->cancel(); }

std::size_t ClusterStream::in_flight() const { return state_->in_flight(); }

}  // namespace gpukv::client
