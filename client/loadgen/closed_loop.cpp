// Closed loop: each caller thread waits for its call before sending the next (unary and batch modes through
// the client library's blocking calls), or keeps --depth groups in flight on its own stream (stream mode:
// send() waits for room, and each group's latency runs from the moment it was handed to send()).
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

void unary_or_batch(const Settings& s, Totals& totals, client::Client& client, Workload& work, Clock::time_point end) {
  // Batch calls go through the client's packed forms, their messages reused from call to call: the load
  // generator shares the machine with the server, so it builds no string per key.
  v1::BatchGetRequest get_req;
  v1::BatchGetResponse get_resp;
  v1::BatchPutRequest put_req;
  v1::BatchPutResponse put_resp;
  v1::BatchDeleteRequest del_req;
  v1::BatchDeleteResponse del_resp;
  while (Clock::now() < end) {
    const v1::OpKind kind = work.next_kind();
    const auto start = Clock::now();
    grpc::Status status;
    std::uint64_t full = 0;
    if (s.mode == Mode::kUnary) {
      const std::string key(work.next_key());
      if (kind == v1::OP_GET) {
        std::optional<std::string> value;
        status = client.get(key, &value);
      } else if (kind == v1::OP_PUT) {
        status = client.put(key, s.value);
      } else {
        status = client.del(key);
      }
    } else if (kind == v1::OP_PUT) {
      next_keys(put_req, work, s.batch);
      put_req.mutable_values()->clear();
      put_req.mutable_value_lengths()->Clear();
      for (std::uint32_t i = 0; i < s.batch; ++i) {
        put_req.mutable_values()->append(s.value);
        put_req.add_value_lengths(static_cast<std::uint32_t>(s.value.size()));
      }
      status = client.batch_put(put_req, &put_resp);
      if (status.ok()) full = count_full(put_resp.results());
    } else if (kind == v1::OP_GET) {
      next_keys(get_req, work, s.batch);
      status = client.batch_get(get_req, &get_resp);
    } else {
      next_keys(del_req, work, s.batch);
      status = client.batch_delete(del_req, &del_resp);
    }
    totals.record(start, s.keys_per_call(), status, full);
  }
}

void stream(const Settings& s, Totals& totals, client::Client& client, Workload& work, Clock::time_point end) {
  auto stream = client.stream({.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()) + s.client.timeout,
                               .max_in_flight = s.depth});
  client::OpGroup group;
  while (Clock::now() < end) {
    group.reserve(s.batch, s.batch * 12, s.batch * s.value.size());
    for (std::uint32_t i = 0; i < s.batch; ++i) group.add(work.next_kind(), work.next_key(), s.value);
    const auto start = Clock::now();
    const grpc::Status sent = stream->send(group, [&totals, start](const grpc::Status& status, client::GroupResult&& r) {
      totals.record(start, r.size(), status, count_full(r.response().results()));
    });
    if (!sent.ok()) {  // the stream has ended: its status is reported below
      break;
    }
  }
  if (const grpc::Status end_status = stream->close(); !end_status.ok()) totals.error(end_status);
}

}  // namespace

void run_closed_loop(const Settings& s, Totals& totals, Clock::time_point end) {
  std::vector<std::thread> threads;
  for (std::uint32_t id = 0; id < s.callers; ++id) {
    threads.emplace_back([&, id] {
      client::Client client(s.client);
      Workload work(s.mix, id * 7919 + 1);
      if (s.mode == Mode::kStream) {
        stream(s, totals, client, work, end);
      } else {
        unary_or_batch(s, totals, client, work, end);
      }
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace gpukv::load
