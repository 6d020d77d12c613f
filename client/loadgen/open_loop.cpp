// Open loop: each caller thread owns a share (1 / --callers) of the arrival schedule and sends every
// arrival when it is due without waiting for earlier ones: unary and batch calls through the stub's callback
// API, stream groups through the client library's Stream (try_send). Latency runs from the arrival's
// intended time, so a sender that falls behind, a queue in the server or a stall all count. In-flight calls
// are bounded (--max_outstanding, shared equally by the callers); an arrival that finds its caller at the
// bound is dropped and counted, and one sent more than --late_us after its time is counted late.
#include <grpcpp/grpcpp.h>

#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "load.hpp"

namespace gpukv::load {
namespace {

// The calls' response types that carry per-op results, for counting FULL answers and ops that failed on
// their shard.
std::uint64_t full_ops(const v1::BatchPutResponse& r) { return count_full(r.results()); }
template <class Response>
std::uint64_t full_ops(const Response&) { return 0; }
template <class Response>
grpc::Status call_status(const grpc::Status& status, const Response& r) {
  if constexpr (requires { r.results(); }) return failed_ops(status, r.results());
  return status;
}

class OpenLoopCaller {
 public:
  OpenLoopCaller(const Settings& s, Totals& totals, std::uint32_t id, Clock::time_point start, Clock::time_point end)
      : s_(s), totals_(totals), id_(id), start_(start), end_(end), connection_(s.client, s.targets), work_(s.mix, id),
        bound_(std::max<std::uint32_t>(1, s.max_outstanding / s.callers)) {}

  void run() {
    std::mt19937_64 rng(id_ * 104729 + 7);
    const double calls_per_s = s_.rate / s_.keys_per_call() / s_.callers;
    std::exponential_distribution<double> exponential(calls_per_s);
    const auto gap = [&] {
      return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s_.poisson ? exponential(rng) : 1 / calls_per_s));
    };
    if (s_.mode == Mode::kStream) open_stream();
    // Fixed arrivals start staggered across callers, so together they still arrive evenly.
    Clock::time_point next = start_ + (s_.poisson ? gap() : gap() * id_ / s_.callers);
    for (; next < end_; next += gap()) {
      if (next > Clock::now()) std::this_thread::sleep_until(next);
      if (in_flight_.load(std::memory_order_relaxed) >= bound_) {
        totals_.counts.dropped.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      if (Clock::now() - next > s_.late_after) totals_.counts.late.fetch_add(1, std::memory_order_relaxed);
      send(next);
    }
    if (stream_) close_stream();
    // Every call has a deadline, so this ends.
    while (in_flight_.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

 private:
  void send(Clock::time_point intended) {
    if (s_.mode == Mode::kStream) {
      send_group(intended);
      return;
    }
    const v1::OpKind kind = work_.next_kind();
    if (s_.mode == Mode::kUnary) {
      const std::string_view key = work_.next_key();
      auto* stub = connection_.unary_stub(key);
      if (kind == v1::OP_GET) {
        v1::GetRequest req;
        req.set_key(std::string(key));
        start_call<v1::GetResponse>(std::move(req), intended, [stub](auto* c, auto* q, auto* r, auto done) { stub->Get(c, q, r, std::move(done)); });
      } else if (kind == v1::OP_PUT) {
        v1::PutRequest req;
        req.set_key(std::string(key));
        req.set_value(s_.value);
        start_call<v1::PutResponse>(std::move(req), intended, [stub](auto* c, auto* q, auto* r, auto done) { stub->Put(c, q, r, std::move(done)); });
      } else {
        v1::DeleteRequest req;
        req.set_key(std::string(key));
        start_call<v1::DeleteResponse>(std::move(req), intended, [stub](auto* c, auto* q, auto* r, auto done) { stub->Delete(c, q, r, std::move(done)); });
      }
      return;
    }
    std::string keys;
    google::protobuf::RepeatedField<std::uint32_t> lengths;
    lengths.Reserve(static_cast<int>(s_.batch));
    for (std::uint32_t i = 0; i < s_.batch; ++i) {
      const std::string_view k = work_.next_key();
      keys.append(k);
      lengths.Add(static_cast<std::uint32_t>(k.size()));
    }
    if (kind == v1::OP_PUT) {
      v1::BatchPutRequest req;
      req.set_keys(std::move(keys));
      *req.mutable_key_lengths() = std::move(lengths);
      req.mutable_values()->reserve(s_.batch * s_.value.size());
      for (std::uint32_t i = 0; i < s_.batch; ++i) {
        req.mutable_values()->append(s_.value);
        req.add_value_lengths(static_cast<std::uint32_t>(s_.value.size()));
      }
      start_call<v1::BatchPutResponse>(std::move(req), intended, [this](auto* c, auto* q, auto* r, auto done) { connection_.batch_put(c, q, r, std::move(done)); });
    } else if (kind == v1::OP_GET) {
      v1::BatchGetRequest req;
      req.set_keys(std::move(keys));
      *req.mutable_key_lengths() = std::move(lengths);
      start_call<v1::BatchGetResponse>(std::move(req), intended, [this](auto* c, auto* q, auto* r, auto done) { connection_.batch_get(c, q, r, std::move(done)); });
    } else {
      v1::BatchDeleteRequest req;
      req.set_keys(std::move(keys));
      *req.mutable_key_lengths() = std::move(lengths);
      start_call<v1::BatchDeleteResponse>(std::move(req), intended, [this](auto* c, auto* q, auto* r, auto done) { connection_.batch_delete(c, q, r, std::move(done)); });
    }
  }

  // One unary or batch call on the callback API; its state lives until its callback.
  template <class Response, class Request, class Launch>
  void start_call(Request&& request, Clock::time_point intended, Launch launch) {
    struct Call {
      grpc::ClientContext context;
      Request request;
      Response response;
    };
    auto* call = new Call;
    call->request = std::move(request);
    call->context.set_deadline(std::chrono::system_clock::now() + s_.client.timeout);
    begin();
    launch(&call->context, &call->request, &call->response, [this, call, intended](grpc::Status status) {
      totals_.record(intended, s_.keys_per_call(), call_status(status, call->response), status.ok() ? full_ops(call->response) : 0);
      delete call;
      end_call();
    });
    sent_one();
  }

  void send_group(Clock::time_point intended) {
    group_.reserve(s_.batch, s_.batch * 12, s_.batch * s_.value.size());
    for (std::uint32_t i = 0; i < s_.batch; ++i) group_.add(work_.next_kind(), work_.next_key(), s_.value);
    begin();
    const grpc::Status sent = stream_->try_send(group_, [this, intended](const grpc::Status& status, client::GroupResult&& r) {
      totals_.record(intended, r.size(), failed_ops(status, r.response().results()), count_full(r.response().results()));
      end_call();
    });
    if (sent.ok()) {
      sent_one();
      return;
    }
    end_call();
    group_.clear();
    if (sent.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {  // not below the bound, but never silently
      totals_.counts.dropped.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    // The stream has ended (its deadline, or the server went away): this arrival fails, the next one gets a
    // new stream.
    totals_.counts.calls.fetch_add(1, std::memory_order_relaxed);
    totals_.error(sent);
    close_stream();
    open_stream();
  }

  // Before a call starts (its callback may run at once, and must find itself counted).
  void begin() {
    in_flight_.fetch_add(1, std::memory_order_relaxed);
    totals_.counts.outstanding.fetch_add(1, std::memory_order_relaxed);
  }
  void sent_one() {
    totals_.counts.sent_calls.fetch_add(1, std::memory_order_relaxed);
    totals_.counts.sent_keys.fetch_add(s_.keys_per_call(), std::memory_order_relaxed);
  }
  // The last touch of this object by a callback: run() waits for in_flight_ to reach zero before returning.
  void end_call() {
    totals_.counts.outstanding.fetch_sub(1, std::memory_order_relaxed);
    in_flight_.fetch_sub(1, std::memory_order_release);
  }

  void open_stream() {
    stream_ = connection_.stream({.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(end_ - Clock::now()) + s_.client.timeout,
                              .max_in_flight = bound_});
  }
  void close_stream() {
    if (const grpc::Status status = stream_->close(); !status.ok()) totals_.error(status);
  }

  const Settings& s_;
  Totals& totals_;
  const std::uint32_t id_;
  const Clock::time_point start_, end_;
  Connection connection_;
  Workload work_;
  const std::uint32_t bound_;          // this caller's share of --max_outstanding
  std::atomic<std::uint32_t> in_flight_{0};
  std::unique_ptr<GroupStream> stream_;  // stream mode
  client::OpGroup group_;
};

}  // namespace

void run_open_loop(const Settings& s, Totals& totals, Clock::time_point start, Clock::time_point end) {
  std::vector<std::thread> threads;
  for (std::uint32_t id = s.first_caller; id < s.first_caller + s.own_callers; ++id) {
    threads.emplace_back([&, id] { OpenLoopCaller(s, totals, id, start, end).run(); });
  }
  for (auto& t : threads) t.join();
}

}  // namespace gpukv::load
