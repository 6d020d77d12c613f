// Closed loop: each caller keeps one call in flight and starts the next from the callback of the last one
// (unary and batch modes, on the stub's callback API), or keeps --depth groups in flight on its own stream
// (stream mode: send() waits for room, and each group's latency runs from the moment it was handed to
// send()).
#include <latch>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "load.hpp"

namespace gpukv::load {
namespace {

// Fills a batch request's key columns with the next `n` keys, reusing the request's buffers.
template <class Request>
void next_keys(Request& req, Workload& work, std::uint32_t n) {
  req.mutable_keys()->clear();
  req.mutable_key_lengths()->Clear();
  for (std::uint32_t i = 0; i < n; ++i) {
    const std::string_view k = work.next_key();
    req.mutable_keys()->append(k);
    req.add_key_lengths(static_cast<std::uint32_t>(k.size()));
  }
}

// One caller of the unary and batch modes: a chain of calls, each started from the callback of the one
// before, on the caller's own channels (one, or one per shard). No thread of ours waits on a call: a thread blocked per call costs a
// wake-up per call, and gpukv-load shares the machine's cores with the server it measures. The messages
// are reused from call to call, so the load generator builds no string per key.
class ChainedCaller {
 public:
  ChainedCaller(const Settings& s, Totals& totals, std::uint32_t id, Clock::time_point end, std::latch& running)
      : s_(s), totals_(totals), end_(end), running_(running), connection_(s.client, s.targets), work_(s.mix, id) {}

  void start() { next(); }

 private:
  void next() {
    if (Clock::now() >= end_) {
      context_.reset();  // here, in the last call's callback (as gRPC's examples do), not by another thread later
      running_.count_down();  // the last touch of this object
      return;
    }
    context_.emplace();
    context_->set_deadline(std::chrono::system_clock::now() + s_.client.timeout);
    const v1::OpKind kind = work_.next_kind();
    started_ = Clock::now();
    if (s_.mode == Mode::kUnary) {
      const std::string_view key = work_.next_key();
      auto* stub = connection_.unary_stub(key);
      if (kind == v1::OP_GET) {
        get_.set_key(key.data(), key.size());
        stub->Get(&*context_, &get_, &get_resp_, [this](grpc::Status st) { finished(st, 0); });
      } else if (kind == v1::OP_PUT) {
        put_.set_key(key.data(), key.size());
        put_.set_value(s_.value);
        stub->Put(&*context_, &put_, &put_resp_,
                  [this](grpc::Status st) { finished(st, 0); });  // a full table answers RESOURCE_EXHAUSTED
      } else {
        del_.set_key(key.data(), key.size());
        stub->Delete(&*context_, &del_, &del_resp_, [this](grpc::Status st) { finished(st, 0); });
      }
    } else if (kind == v1::OP_PUT) {
      next_keys(batch_put_, work_, s_.batch);
      if (batch_put_.value_lengths_size() != static_cast<int>(s_.batch)) {  // every write carries s.value
        batch_put_.mutable_values()->clear();
        batch_put_.mutable_value_lengths()->Clear();
        for (std::uint32_t i = 0; i < s_.batch; ++i) {
          batch_put_.mutable_values()->append(s_.value);
          batch_put_.add_value_lengths(static_cast<std::uint32_t>(s_.value.size()));
        }
      }
      connection_.batch_put(&*context_, &batch_put_, &batch_put_resp_, [this](grpc::Status st) {
        finished(failed_ops(st, batch_put_resp_.results()), st.ok() ? count_full(batch_put_resp_.results()) : 0);
      });
    } else if (kind == v1::OP_GET) {
      next_keys(batch_get_, work_, s_.batch);
      connection_.batch_get(&*context_, &batch_get_, &batch_get_resp_,
                            [this](grpc::Status st) { finished(failed_ops(st, batch_get_resp_.results()), 0); });
    } else {
      next_keys(batch_del_, work_, s_.batch);
      connection_.batch_delete(&*context_, &batch_del_, &batch_del_resp_,
                               [this](grpc::Status st) { finished(failed_ops(st, batch_del_resp_.results()), 0); });
    }
  }

  void finished(const grpc::Status& status, std::uint64_t full) {
    totals_.record(started_, s_.keys_per_call(), status, full);
    next();
  }

  const Settings& s_;
  Totals& totals_;
  const Clock::time_point end_;
  std::latch& running_;
  Connection connection_;
  Workload work_;
  std::optional<grpc::ClientContext> context_;  // a context serves one call: a fresh one per call
  Clock::time_point started_;
  v1::GetRequest get_;
  v1::GetResponse get_resp_;
  v1::PutRequest put_;
  v1::PutResponse put_resp_;
  v1::DeleteRequest del_;
  v1::DeleteResponse del_resp_;
  v1::BatchGetRequest batch_get_;
  v1::BatchGetResponse batch_get_resp_;
  v1::BatchPutRequest batch_put_;
  v1::BatchPutResponse batch_put_resp_;
  v1::BatchDeleteRequest batch_del_;
  v1::BatchDeleteResponse batch_del_resp_;
};

void stream(const Settings& s, Totals& totals, Connection& connection, Workload& work, Clock::time_point end) {
  auto stream = connection.stream({.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()) + s.client.timeout,
                               .max_in_flight = s.depth});
  client::OpGroup group;
  while (Clock::now() < end) {
    group.reserve(s.batch, s.batch * 12, s.batch * s.value.size());
    for (std::uint32_t i = 0; i < s.batch; ++i) group.add(work.next_kind(), work.next_key(), s.value);
    const auto start = Clock::now();
    const grpc::Status sent = stream->send(group, [&totals, start](const grpc::Status& status, client::GroupResult&& r) {
      totals.record(start, r.size(), failed_ops(status, r.response().results()), count_full(r.response().results()));
    });
    if (!sent.ok()) {  // the stream has ended: its status is reported below
      break;
    }
  }
  if (const grpc::Status end_status = stream->close(); !end_status.ok()) totals.error(end_status);
}

}  // namespace

void run_closed_loop(const Settings& s, Totals& totals, Clock::time_point end) {
  if (s.mode != Mode::kStream) {
    std::vector<std::unique_ptr<ChainedCaller>> callers;
    std::latch running(s.own_callers);
    for (std::uint32_t id = s.first_caller; id < s.first_caller + s.own_callers; ++id) {
      callers.push_back(std::make_unique<ChainedCaller>(s, totals, id, end, running));
    }
    for (auto& c : callers) c->start();
    running.wait();
    return;
  }
  std::vector<std::thread> threads;
  for (std::uint32_t id = s.first_caller; id < s.first_caller + s.own_callers; ++id) {
    threads.emplace_back([&, id] {
      Connection connection(s.client, s.targets);
      Workload work(s.mix, id);
      stream(s, totals, connection, work, end);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace gpukv::load
