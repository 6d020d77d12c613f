// The client library's Stream against a real server in process (CPU backend, a real channel to 127.0.0.1):
// per-key order and id matching with many groups in flight, the in-flight bound, the stream's deadline,
// closing and cancelling, a server draining mid-stream, bad input, and a misbehaving server's responses.
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpukv/client.hpp"
#include "service/server.hpp"
#include "support/small_server.hpp"

namespace gpukv::client {
namespace {

using namespace std::chrono_literals;

server::ServerOptions small_server(std::chrono::microseconds max_delay = 200us) {
  server::ServerOptions o = test::small_server_options();
  o.batcher.batch_size = 1024;
  o.batcher.max_delay = max_delay;
  o.batcher.completion_threads = 2;  // groups answered on several threads, responses still in order
  return o;
}

ClientOptions options_for(int port) {
  ClientOptions o;
  o.target = "127.0.0.1:" + std::to_string(port);
  o.timeout = 10s;
  return o;
}

// Counts callbacks and lets a test wait for a number of them.
class Latch {
 public:
  void count_down() {
    std::lock_guard lock(m_);
    ++count_;
    cv_.notify_all();
  }
  bool wait_for(int n, std::chrono::milliseconds timeout) {
    std::unique_lock lock(m_);
    return cv_.wait_for(lock, timeout, [&] { return count_ >= n; });
  }
  int count() {
    std::lock_guard lock(m_);
    return count_;
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int count_ = 0;
};

TEST(ClientStream, PipelinedGroupsKeepPerKeyOrderAndComeBackUnderTheirIds) {
  server::Server server(small_server());
  Client client(options_for(server.port()));
  auto stream = client.stream({.timeout = 30s, .max_in_flight = 8});

  // One writer on a handful of keys, so every result is known when the group is built: the model is applied
  // in send order, which is the order the server must apply them in.
  std::mt19937_64 rng(42);
  std::map<std::string, std::string> model;
  struct Expected {
    std::vector<v1::Result> results;
    std::vector<std::string> values;
  };
  std::mutex m;                              // guards the two below (callbacks run on gRPC threads)
  std::vector<std::uint64_t> answered_id;    // per group, the id its response carried
  std::vector<std::string> failures;
  std::vector<std::uint64_t> sent_id;        // per group, the id send() gave it
  Latch answered;
  const int kGroups = 300;
  answered_id.assign(kGroups, 0);
  for (int g = 0; g < kGroups; ++g) {
    OpGroup group;
    Expected e;
    const int n = 1 + static_cast<int>(rng() % 20);
    for (int i = 0; i < n; ++i) {
      const std::string key = "k" + std::to_string(rng() % 5);
      const std::string value = "v" + std::to_string(g) + "." + std::to_string(i);
      const auto it = model.find(key);
      switch (rng() % 4) {
        case 0:
          group.get(key);
          e.results.push_back(it == model.end() ? v1::RESULT_NOT_FOUND : v1::RESULT_OK);
          e.values.push_back(it == model.end() ? "" : it->second);
          break;
        case 1:
          group.put(key, value);
          model[key] = value;
          e.results.push_back(v1::RESULT_OK);
          e.values.emplace_back();
          break;
        case 2:
          group.put_if_absent(key, value);
          e.results.push_back(it == model.end() ? v1::RESULT_OK : v1::RESULT_EXISTS);
          if (it == model.end()) model[key] = value;
          e.values.emplace_back();
          break;
        default:
          group.del(key);
          e.results.push_back(it == model.end() ? v1::RESULT_NOT_FOUND : v1::RESULT_OK);
          if (it != model.end()) model.erase(key);
          e.values.emplace_back();
      }
    }
    std::uint64_t id = 0;
    const grpc::Status s = stream->send(group, [&, g, e = std::move(e)](const grpc::Status& status, GroupResult&& r) {
      std::lock_guard lock(m);
      answered_id[g] = r.id();
      if (!status.ok() || r.size() != e.results.size()) {
        failures.push_back("group " + std::to_string(g) + ": " + status.error_message());
      } else {
        for (std::size_t i = 0; i < r.size(); ++i) {
          if (r.result(i) != e.results[i] || r.value(i) != e.values[i]) {
            failures.push_back("group " + std::to_string(g) + " op " + std::to_string(i) + ": got " +
                               v1::Result_Name(r.result(i)) + " '" + std::string(r.value(i)) + "', want " +
                               v1::Result_Name(e.results[i]) + " '" + e.values[i] + "'");
          }
        }
      }
      answered.count_down();
    }, &id);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_TRUE(group.empty());  // sent groups are left empty for reuse
    if (!sent_id.empty()) EXPECT_GT(id, sent_id.back());
    sent_id.push_back(id);
    EXPECT_LE(stream->in_flight(), 8u);
  }
  const grpc::Status end = stream->close();
  EXPECT_TRUE(end.ok()) << end.error_message();
  EXPECT_EQ(answered.count(), kGroups);  // close() returns after the last callback
  std::lock_guard lock(m);
  EXPECT_EQ(answered_id, sent_id);       // each callback got the response to its own group
  for (const std::string& f : failures) ADD_FAILURE() << f;
}

TEST(ClientStream, CallReturnsValuesAndABadKeyFailsOnlyItsOwnOp) {
  server::Server server(small_server());
  Client client(options_for(server.port()));
  auto stream = client.stream();
  OpGroup group;
  group.put("a", std::string("x\0y", 3)).get("a").get("missing").put(std::string(17, 'k'), "v").put_if_absent("a", "z");
  GroupResult r;
  ASSERT_TRUE(stream->call(group, &r).ok());
  ASSERT_EQ(r.size(), 5u);
  EXPECT_EQ(r.result(0), v1::RESULT_OK);
  EXPECT_EQ(r.result(1), v1::RESULT_OK);
  EXPECT_EQ(r.value(1), std::string_view("x\0y", 3));
  EXPECT_EQ(r.result(2), v1::RESULT_NOT_FOUND);
  EXPECT_EQ(r.value(2), "");
  EXPECT_EQ(r.result(3), v1::RESULT_INVALID);  // key longer than the server's 16 bytes
  EXPECT_EQ(r.result(4), v1::RESULT_EXISTS);
  EXPECT_TRUE(stream->close().ok());
  EXPECT_TRUE(stream->close().ok());  // idempotent
}

TEST(ClientStream, BadInputIsRefusedAndNothingIsSent) {
  server::Server server(small_server());
  Client client(options_for(server.port()));
  EXPECT_THROW(client.stream({.max_in_flight = 0}), std::invalid_argument);
  OpGroup group;
  EXPECT_THROW(group.add(static_cast<v1::OpKind>(9), "k"), std::invalid_argument);
  EXPECT_TRUE(group.empty());
  auto stream = client.stream();
  const auto ignore = [](const grpc::Status&, GroupResult&&) {};
  EXPECT_EQ(stream->send(group, ignore).error_code(), grpc::StatusCode::INVALID_ARGUMENT);  // empty
  group.put("k", "v");
  EXPECT_EQ(stream->send(group, nullptr).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(group.size(), 1u);  // untouched by a refusal
  EXPECT_TRUE(stream->close().ok());
  EXPECT_EQ(stream->send(group, ignore).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(group.size(), 1u);
  std::optional<std::string> value;
  ASSERT_TRUE(client.get("k", &value).ok());
  EXPECT_FALSE(value.has_value());
}

TEST(ClientStream, TrySendRefusesBeyondTheInFlightBound) {
  server::Server server(small_server(300ms));  // lone groups wait 300 ms for their batch
  Client client(options_for(server.port()));
  auto stream = client.stream({.max_in_flight = 2});
  Latch answered;
  const auto count = [&](const grpc::Status& s, GroupResult&&) {
    EXPECT_TRUE(s.ok()) << s.error_message();
    answered.count_down();
  };
  for (int i = 0; i < 2; ++i) {
    OpGroup g;
    g.put("k" + std::to_string(i), "v");
    ASSERT_TRUE(stream->try_send(g, count).ok());
  }
  OpGroup third;
  third.put("k2", "v");
  EXPECT_EQ(stream->try_send(third, count).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(third.size(), 1u);
  ASSERT_TRUE(stream->send(third, count).ok());  // waits for room instead
  EXPECT_TRUE(stream->close().ok());
  EXPECT_EQ(answered.count(), 3);
}

TEST(ClientStream, TheDeadlineEndsTheStreamAndItsLateGroupsAreNotApplied) {
  server::Server server(small_server(400ms));
  Client client(options_for(server.port()));
  auto stream = client.stream({.timeout = 50ms});
  OpGroup group;
  group.put("late", "v");
  std::atomic<bool> refused{false};
  ASSERT_TRUE(stream->send(group, [&](const grpc::Status& s, GroupResult&& r) {
    // Either the stream ended first, or the server answered that it could not run the group.
    refused = s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED || (s.ok() && r.result(0) == v1::RESULT_FULL);
  }).ok());
  EXPECT_EQ(stream->close().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(refused);
  std::this_thread::sleep_for(500ms);  // past the batch that would have held the group
  std::optional<std::string> value;
  ASSERT_TRUE(client.get("late", &value).ok());
  EXPECT_FALSE(value.has_value());
}

TEST(ClientStream, DestroyingAnOpenStreamCancelsItsUnansweredGroups) {
  server::Server server(small_server(300ms));
  Client client(options_for(server.port()));
  grpc::Status seen;
  {
    auto stream = client.stream();
    OpGroup group;
    group.get("k");
    ASSERT_TRUE(stream->send(group, [&](const grpc::Status& s, GroupResult&&) { seen = s; }).ok());
  }  // the callback has run when the destructor returns
  EXPECT_EQ(seen.error_code(), grpc::StatusCode::CANCELLED);
}

TEST(ClientStream, AServerDrainingMidStreamRefusesGroupsAndEndsTheStreamUnavailable) {
  server::Server server(small_server());
  Client client(options_for(server.port()));
  auto stream = client.stream({.timeout = 30s, .max_in_flight = 4});
  std::atomic<int> accepted{0}, applied{0}, refused{0}, failed{0}, callbacks{0};
  std::atomic<bool> stop{false};
  std::mutex m;
  std::vector<std::string> unexpected;
  std::thread sender([&] {
    for (int g = 0; !stop; ++g) {
      OpGroup group;
      for (int i = 0; i < 10; ++i) group.put("d" + std::to_string(g) + ":" + std::to_string(i), "v");
      const grpc::Status s = stream->send(group, [&](const grpc::Status& status, GroupResult&& r) {
        ++callbacks;
        if (!status.ok()) {
          ++failed;
          if (status.error_code() != grpc::StatusCode::UNAVAILABLE && status.error_code() != grpc::StatusCode::CANCELLED) {
            std::lock_guard lock(m);
            unexpected.push_back("group failed with " + status.error_message());
          }
          stop = true;
          return;
        }
        std::size_t ok = 0, full = 0;
        for (std::size_t i = 0; i < r.size(); ++i) {
          ok += r.result(i) == v1::RESULT_OK;
          full += r.result(i) == v1::RESULT_FULL;
        }
        if (ok == r.size()) {
          ++applied;
        } else if (full == r.size()) {  // refused whole: the server is draining
          ++refused;
          stop = true;
        } else {
          std::lock_guard lock(m);
          unexpected.push_back("a group partly applied");
        }
      });
      if (!s.ok()) break;  // the stream has ended
      ++accepted;
    }
  });
  while (applied < 20) std::this_thread::sleep_for(1ms);
  std::thread drain([&] { server.shutdown(5000ms); });
  sender.join();
  const grpc::Status end = stream->close();
  drain.join();
  EXPECT_TRUE(end.ok() || end.error_code() == grpc::StatusCode::UNAVAILABLE) << end.error_message();
  EXPECT_EQ(callbacks.load(), accepted.load());  // every accepted group answered exactly once
  EXPECT_EQ(applied + refused + failed, accepted.load());
  EXPECT_GE(applied.load(), 20);
  for (const std::string& u : unexpected) ADD_FAILURE() << u;
}

// A server that answers every stream request wrongly: with an id nobody sent, or with too few results. Its
// batch calls answer with one result too few (BatchPut), or with value lengths that do not add up to the
// values (BatchGet).
class WrongServer final : public v1::KeyValue::CallbackService {
 public:
  explicit WrongServer(bool wrong_id) : wrong_id_(wrong_id) {}
  grpc::ServerUnaryReactor* BatchGet(grpc::CallbackServerContext* ctx, const v1::BatchGetRequest* req,
                                     v1::BatchGetResponse* resp) override {
    resp->set_results(std::string(static_cast<std::size_t>(req->key_lengths_size()), '\0'));
    resp->mutable_value_lengths()->Resize(req->key_lengths_size(), 100);
    resp->set_values("short");
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* BatchPut(grpc::CallbackServerContext* ctx, const v1::BatchPutRequest* req,
                                     v1::BatchPutResponse* resp) override {
    resp->set_results(std::string(static_cast<std::size_t>(req->key_lengths_size()) - 1, '\0'));
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerBidiReactor<v1::StreamRequest, v1::StreamResponse>* Stream(grpc::CallbackServerContext*) override {
    class Reactor final : public grpc::ServerBidiReactor<v1::StreamRequest, v1::StreamResponse> {
     public:
      explicit Reactor(bool wrong_id) : wrong_id_(wrong_id) { StartRead(&request_); }
      void OnReadDone(bool ok) override {
        if (!ok) {
          Finish(grpc::Status::OK);
          return;
        }
        response_.set_id(wrong_id_ ? request_.id() + 1000 : request_.id());
        response_.set_results(std::string(wrong_id_ ? request_.ops().size() : 0, '\0'));
        StartWrite(&response_);
      }
      void OnWriteDone(bool) override { StartRead(&request_); }
      void OnDone() override { delete this; }

     private:
      const bool wrong_id_;
      v1::StreamRequest request_;
      v1::StreamResponse response_;
    };
    return new Reactor(wrong_id_);
  }

 private:
  const bool wrong_id_;
};

// Serves `service` on a free port of 127.0.0.1 (written to *port).
std::unique_ptr<grpc::Server> serve(grpc::Service& service, int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), port);
  builder.RegisterService(&service);
  return builder.BuildAndStart();
}

grpc::Status run_against_wrong_server(bool wrong_id, grpc::Status* group_status) {
  WrongServer service(wrong_id);
  int port = 0;
  auto server = serve(service, &port);
  Client client(options_for(port));
  auto stream = client.stream();
  OpGroup group;
  group.get("a").get("b");
  GroupResult r;
  *group_status = stream->call(group, &r);
  const grpc::Status end = stream->close();
  server->Shutdown(std::chrono::system_clock::now() + 1s);
  return end;
}

TEST(ClientStream, AResponseForAnUnknownIdFailsTheStream) {
  grpc::Status group_status;
  const grpc::Status end = run_against_wrong_server(/*wrong_id=*/true, &group_status);
  EXPECT_EQ(end.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_NE(end.error_message().find("unknown request id 1001"), std::string::npos) << end.error_message();
  EXPECT_EQ(group_status.error_code(), grpc::StatusCode::INTERNAL);  // its group was never answered
}

TEST(ClientStream, AMalformedResponseFailsItsGroup) {
  grpc::Status group_status;
  const grpc::Status end = run_against_wrong_server(/*wrong_id=*/false, &group_status);
  EXPECT_TRUE(end.ok()) << end.error_message();
  EXPECT_EQ(group_status.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_NE(group_status.error_message().find("0 results for 2 ops"), std::string::npos)
      << group_status.error_message();
}

TEST(ClientBatch, AMalformedResponseIsAnErrorNotARead) {
  WrongServer service(false);
  int port = 0;
  auto server = serve(service, &port);
  Client client(options_for(port));
  std::vector<KeyResult> got;
  const grpc::Status get = client.batch_get({"a", "b"}, &got);
  EXPECT_EQ(get.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_NE(get.error_message().find("value_lengths add up to 200 bytes, values has 5"), std::string::npos) << get.error_message();
  std::vector<v1::Result> put;
  const grpc::Status status = client.batch_put({{"a", "1"}, {"b", "2"}}, false, &put);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_NE(status.error_message().find("1 results for 2 ops"), std::string::npos) << status.error_message();
  server->Shutdown(std::chrono::system_clock::now() + 1s);
}

}  // namespace
}  // namespace gpukv::client
