// Closed loop: each caller thread waits for its call before sending the next (unary and batch modes through
// the client library's blocking calls), or keeps --depth groups in flight on its own stream (stream mode:
// send() waits for room, and each group's latency runs from the moment it was handed to send()).
#include <string>
#include <thread>
#include <vector>

#include "load.hpp"

namespace gpukv::load {
namespace {

void unary_or_batch(const Settings& s, Totals& totals, client::Client& client, Workload& work, Clock::time_point end) {
  std::vector<std::string> keys;
  std::vector<std::pair<std::string, std::string>> entries;
  std::vector<client::KeyResult> got;
  std::vector<v1::Result> results;
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
      entries.resize(s.batch);
      for (auto& [k, v] : entries) {
        k = work.next_key();
        v = s.value;
      }
      status = client.batch_put(entries, false, &results);
      for (v1::Result r : results) full += r == v1::RESULT_FULL;
    } else {
      keys.resize(s.batch);
      for (auto& k : keys) k = work.next_key();
      status = kind == v1::OP_GET ? client.batch_get(keys, &got) : client.batch_delete(keys, &results);
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
