// The gRPC service in process, over a real channel to 127.0.0.1: unary, batch and stream calls, every error
// code the API promises, a full table, draining, and the Prometheus endpoint.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "gpukv/v1/kv.grpc.pb.h"
#include "scrape.hpp"
#include "service/metrics.hpp"
#include "service/server.hpp"

namespace gpukv::server {
namespace {

using namespace std::chrono_literals;
namespace v1 = gpukv::v1;

ServerOptions small_server(std::uint64_t capacity = 4096) {
  ServerOptions o;
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "127.0.0.1:0";
  o.table.backend = BackendKind::kCpu;
  o.table.capacity = capacity;
  o.table.key_width = 16;
  o.table.value_width = 32;
  o.batcher.batch_size = 1024;
  o.batcher.max_delay = 200us;
  return o;
}

class ServiceTest : public testing::Test {
 protected:
  void start(const ServerOptions& o) {
    server_ = std::make_unique<Server>(o);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->port()), grpc::InsecureChannelCredentials());
    stub_ = v1::KeyValue::NewStub(channel_);
  }
  std::unique_ptr<grpc::ClientContext> context(std::chrono::milliseconds timeout = 10000ms) {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + timeout);
    return c;
  }
  grpc::Status put(const std::string& key, const std::string& value, bool if_absent = false, v1::Result* result = nullptr) {
    v1::PutRequest req;
    req.set_key(key);
    req.set_value(value);
    req.set_if_absent(if_absent);
    v1::PutResponse resp;
    auto status = stub_->Put(context().get(), req, &resp);
    if (result != nullptr) *result = resp.result();
    return status;
  }
  // found == false and an OK status for a miss.
  grpc::Status get(const std::string& key, bool* found, std::string* value) {
    v1::GetRequest req;
    req.set_key(key);
    v1::GetResponse resp;
    auto status = stub_->Get(context().get(), req, &resp);
    *found = resp.found();
    *value = resp.value();
    return status;
  }

  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KeyValue::Stub> stub_;
};

void add_key(std::string& keys, google::protobuf::RepeatedField<std::uint32_t>* lengths, const std::string& key) {
  keys += key;
  lengths->Add(static_cast<std::uint32_t>(key.size()));
}

TEST_F(ServiceTest, UnaryPutGetDeleteAndAMissIsNotAnError) {
  start(small_server());
  bool found = true;
  std::string value;
  ASSERT_TRUE(get("absent", &found, &value).ok());
  EXPECT_FALSE(found);
  ASSERT_TRUE(put("k", "v1").ok());
  ASSERT_TRUE(get("k", &found, &value).ok());
  EXPECT_TRUE(found);
  EXPECT_EQ(value, "v1");
  v1::Result result;
  ASSERT_TRUE(put("k", "v2", /*if_absent=*/true, &result).ok());
  EXPECT_EQ(result, v1::RESULT_EXISTS);
  ASSERT_TRUE(get("k", &found, &value).ok());
  EXPECT_EQ(value, "v1");
  v1::DeleteRequest del;
  del.set_key("k");
  v1::DeleteResponse deleted;
  ASSERT_TRUE(stub_->Delete(context().get(), del, &deleted).ok());
  EXPECT_TRUE(deleted.deleted());
  ASSERT_TRUE(stub_->Delete(context().get(), del, &deleted).ok());
  EXPECT_FALSE(deleted.deleted());
}

TEST_F(ServiceTest, BadKeysAndValuesAreInvalidArgumentAndChangeNothing) {
  start(small_server());
  EXPECT_EQ(put("", "v").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(put(std::string(17, 'k'), "v").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(put("k", std::string(33, 'v')).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  bool found = true;
  std::string value;
  EXPECT_EQ(get("", &found, &value).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(get("k", &found, &value).ok());
  EXPECT_FALSE(found);

  // A malformed batch (lengths that do not add up) fails whole; a bad key in a batch fails only itself.
  v1::BatchPutRequest bad;
  bad.set_keys("abc");
  bad.add_key_lengths(5);
  bad.add_value_lengths(0);
  v1::BatchPutResponse bad_resp;
  EXPECT_EQ(stub_->BatchPut(context().get(), bad, &bad_resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::BatchPutRequest mixed;
  for (const std::string& k : {std::string("good"), std::string(), std::string(20, 'x')}) {
    add_key(*mixed.mutable_keys(), mixed.mutable_key_lengths(), k);
    mixed.add_value_lengths(1);
    mixed.mutable_values()->append("v");
  }
  v1::BatchPutResponse mixed_resp;
  ASSERT_TRUE(stub_->BatchPut(context().get(), mixed, &mixed_resp).ok());
  ASSERT_EQ(mixed_resp.results().size(), 3u);
  EXPECT_EQ(mixed_resp.results()[0], v1::RESULT_OK);
  EXPECT_EQ(mixed_resp.results()[1], v1::RESULT_INVALID);
  EXPECT_EQ(mixed_resp.results()[2], v1::RESULT_INVALID);
}

TEST_F(ServiceTest, BatchCallsAnswerInRequestOrderAndTheLastPutWins) {
  start(small_server());
  v1::BatchPutRequest puts;
  for (int i = 0; i < 500; ++i) {
    add_key(*puts.mutable_keys(), puts.mutable_key_lengths(), "key" + std::to_string(i));
    const std::string v = "value" + std::to_string(i);
    puts.mutable_values()->append(v);
    puts.add_value_lengths(static_cast<std::uint32_t>(v.size()));
  }
  add_key(*puts.mutable_keys(), puts.mutable_key_lengths(), "key7");  // repeated: the last one wins
  puts.mutable_values()->append("last");
  puts.add_value_lengths(4);
  v1::BatchPutResponse put_resp;
  ASSERT_TRUE(stub_->BatchPut(context().get(), puts, &put_resp).ok());
  ASSERT_EQ(put_resp.results().size(), 501u);
  for (char r : put_resp.results()) EXPECT_EQ(r, v1::RESULT_OK);

  v1::BatchGetRequest gets;
  for (int i = 0; i < 510; ++i) add_key(*gets.mutable_keys(), gets.mutable_key_lengths(), "key" + std::to_string(i));
  v1::BatchGetResponse get_resp;
  ASSERT_TRUE(stub_->BatchGet(context().get(), gets, &get_resp).ok());
  ASSERT_EQ(get_resp.results().size(), 510u);
  ASSERT_EQ(get_resp.value_lengths_size(), 510);
  std::size_t offset = 0;
  for (int i = 0; i < 510; ++i) {
    const std::uint32_t len = get_resp.value_lengths(i);
    if (i >= 500) EXPECT_EQ(len, 0u) << "a miss has no value";
    const std::string v = get_resp.values().substr(offset, len);
    offset += len;
    if (i >= 500) {
      EXPECT_EQ(get_resp.results()[i], v1::RESULT_NOT_FOUND);
    } else {
      EXPECT_EQ(get_resp.results()[i], v1::RESULT_OK);
      EXPECT_EQ(v, i == 7 ? "last" : "value" + std::to_string(i));
    }
  }
  EXPECT_EQ(offset, get_resp.values().size()) << "the values hold exactly the found ones";

  v1::BatchDeleteRequest dels;
  add_key(*dels.mutable_keys(), dels.mutable_key_lengths(), "key1");
  add_key(*dels.mutable_keys(), dels.mutable_key_lengths(), "nope");
  v1::BatchDeleteResponse del_resp;
  ASSERT_TRUE(stub_->BatchDelete(context().get(), dels, &del_resp).ok());
  EXPECT_EQ(del_resp.results(), std::string({static_cast<char>(v1::RESULT_OK), static_cast<char>(v1::RESULT_NOT_FOUND)}));
}

TEST_F(ServiceTest, AFullTableRefusesWritesAndKeepsItsKeys) {
  start(small_server(200));
  v1::StatsResponse stats;
  ASSERT_TRUE(stub_->Stats(context().get(), v1::StatsRequest{}, &stats).ok());
  const std::uint64_t max_items = stats.tiers(0).max_items();
  v1::BatchPutRequest puts;
  for (std::uint64_t i = 0; i < max_items + 10; ++i) {
    add_key(*puts.mutable_keys(), puts.mutable_key_lengths(), "k" + std::to_string(i));
    puts.mutable_values()->append("v");
    puts.add_value_lengths(1);
  }
  v1::BatchPutResponse resp;
  ASSERT_TRUE(stub_->BatchPut(context().get(), puts, &resp).ok());
  std::size_t full = 0;
  for (char r : resp.results()) full += r == v1::RESULT_FULL;
  EXPECT_EQ(full, 10u);
  EXPECT_EQ(put("one-more", "v").error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  bool found = false;
  std::string value;
  ASSERT_TRUE(get("k0", &found, &value).ok());
  EXPECT_TRUE(found);
  ASSERT_TRUE(stub_->Stats(context().get(), v1::StatsRequest{}, &stats).ok());
  EXPECT_EQ(stats.tiers(0).items(), max_items);
  EXPECT_EQ(stats.backend(), "cpu");
}

// Stats takes the table's figures before a batch's calls are answered: a client sees its own writes.
TEST_F(ServiceTest, StatsCountsAnAnsweredWriteAtOnce) {
  start(small_server(1000));
  for (int i = 1; i <= 100; ++i) {
    ASSERT_TRUE(put("seen" + std::to_string(i), "v").ok());
    v1::StatsResponse stats;
    ASSERT_TRUE(stub_->Stats(context().get(), v1::StatsRequest{}, &stats).ok());
    ASSERT_EQ(stats.tiers(0).items(), static_cast<std::uint64_t>(i));
    ASSERT_EQ(stats.operations(), static_cast<std::uint64_t>(i));
  }
}

TEST_F(ServiceTest, StreamAnswersEveryRequestWithItsIdInOrder) {
  start(small_server());
  grpc::ClientContext ctx;
  auto stream = stub_->Stream(&ctx);
  // Ops on one key across pipelined requests: put, get, put-if-absent (exists), delete, get.
  const std::vector<std::pair<v1::OpKind, std::string>> ops = {
      {v1::OP_PUT, "a"}, {v1::OP_GET, ""}, {v1::OP_PUT_IF_ABSENT, "b"}, {v1::OP_DELETE, ""}, {v1::OP_GET, ""}};
  for (std::size_t i = 0; i < ops.size(); ++i) {
    v1::StreamRequest req;
    req.set_id(100 + i);
    req.mutable_ops()->push_back(static_cast<char>(ops[i].first));
    add_key(*req.mutable_keys(), req.mutable_key_lengths(), "same");
    if (ops[i].first == v1::OP_PUT || ops[i].first == v1::OP_PUT_IF_ABSENT) {
      req.set_values(ops[i].second);
      req.add_value_lengths(static_cast<std::uint32_t>(ops[i].second.size()));
    }
    ASSERT_TRUE(stream->Write(req));
  }
  stream->WritesDone();
  std::vector<v1::StreamResponse> responses;
  v1::StreamResponse resp;
  while (stream->Read(&resp)) responses.push_back(resp);
  ASSERT_TRUE(stream->Finish().ok());
  ASSERT_EQ(responses.size(), ops.size());
  for (std::size_t i = 0; i < responses.size(); ++i) EXPECT_EQ(responses[i].id(), 100 + i);
  EXPECT_EQ(responses[1].values(), "a");
  EXPECT_EQ(responses[2].results()[0], v1::RESULT_EXISTS);
  EXPECT_EQ(responses[3].results()[0], v1::RESULT_OK);
  EXPECT_EQ(responses[4].results()[0], v1::RESULT_NOT_FOUND);
  // gpukv_requests_total counts calls finished: this stream once, whatever its requests.
  const std::string metrics = scrape(server_->metrics_port());
  EXPECT_NE(metrics.find("gpukv_requests_total{code=\"OK\",method=\"Stream\"} 1\n"), std::string::npos) << metrics;
}

// Room for every GET's value is reserved before any is found, so a read whose answer could not fit a message
// is refused at once, naming the limit, rather than holding memory for an answer it could never send: 5000
// GETs at 64 KiB values would reserve 328 MB. A call that fits is answered, and nothing else changes.
TEST_F(ServiceTest, AReadWhoseAnswerCouldNotFitAMessageIsRefusedWithTheLimit) {
  ServerOptions o = small_server(1024);
  o.table.value_width = 65536;
  o.batcher.batch_size = 64;
  start(o);
  ASSERT_TRUE(put("k1", std::string(65536, 'v')).ok());
  const auto batch_get = [&](int keys, v1::BatchGetResponse* resp) {
    v1::BatchGetRequest req;
    for (int i = 0; i < keys; ++i) add_key(*req.mutable_keys(), req.mutable_key_lengths(), "k" + std::to_string(i));
    return stub_->BatchGet(context().get(), req, resp);
  };
  v1::BatchGetResponse resp;
  const grpc::Status refused = batch_get(5000, &resp);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(refused.error_message().find("over the 67108864 bytes a response carries (--max_message_bytes)"), std::string::npos)
      << refused.error_message();
  ASSERT_TRUE(batch_get(1000, &resp).ok()) << "1000 x 64 KiB fits";
  EXPECT_EQ(resp.results()[1], v1::RESULT_OK);
  EXPECT_EQ(resp.values().size(), 65536u);  // only what was found is sent
}

TEST_F(ServiceTest, ACallWhoseDeadlinePassesWhileQueuedIsNotApplied) {
  ServerOptions o = small_server();
  o.batcher.max_delay = 500ms;  // a lone op waits half a second for its batch
  start(o);
  auto ctx = context(20ms);
  v1::PutRequest req;
  req.set_key("late");
  req.set_value("v");
  v1::PutResponse resp;
  EXPECT_EQ(stub_->Put(ctx.get(), req, &resp).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  std::this_thread::sleep_for(700ms);  // past the batch that would have held it
  bool found = true;
  std::string value;
  ASSERT_TRUE(get("late", &found, &value).ok());
  EXPECT_FALSE(found);
}

// A call larger than a batch is answered from several batches (its values packed once all are in), with
// misses among its keys.
TEST_F(ServiceTest, ABatchGetSpanningBatchesPacksItsValuesInKeyOrder) {
  ServerOptions o = small_server(16384);
  o.batcher.batch_size = 512;
  start(o);
  v1::BatchPutRequest puts;
  for (int i = 0; i < 3000; i += 3) {  // every third key
    add_key(*puts.mutable_keys(), puts.mutable_key_lengths(), "span" + std::to_string(i));
    const std::string v = "v" + std::to_string(i);
    puts.mutable_values()->append(v);
    puts.add_value_lengths(static_cast<std::uint32_t>(v.size()));
  }
  v1::BatchPutResponse put_resp;
  ASSERT_TRUE(stub_->BatchPut(context().get(), puts, &put_resp).ok());
  v1::BatchGetRequest gets;
  for (int i = 0; i < 3000; ++i) add_key(*gets.mutable_keys(), gets.mutable_key_lengths(), "span" + std::to_string(i));
  v1::BatchGetResponse resp;
  ASSERT_TRUE(stub_->BatchGet(context().get(), gets, &resp).ok());
  ASSERT_EQ(resp.results().size(), 3000u);
  ASSERT_EQ(resp.value_lengths_size(), 3000);
  std::string expected_values;
  for (int i = 0; i < 3000; ++i) {
    const bool present = i % 3 == 0;
    EXPECT_EQ(resp.results()[i], present ? v1::RESULT_OK : v1::RESULT_NOT_FOUND) << i;
    const std::string v = present ? "v" + std::to_string(i) : "";
    EXPECT_EQ(resp.value_lengths(i), v.size()) << i;
    expected_values += v;
  }
  EXPECT_EQ(resp.values(), expected_values);
}

// A call with more ops than the queue holds is refused before its response is sized for it: here, sizing it
// would take 1 M values of 64 KiB (64 GiB).
TEST_F(ServiceTest, ACallLargerThanTheQueueIsRefusedBeforeItsResponseIsSized) {
  ServerOptions o = small_server(64);
  o.table.value_width = 65536;
  o.batcher.batch_size = 4;
  o.batcher.max_queued_ops = 1000;
  start(o);
  constexpr int kOps = 1 << 20;
  v1::BatchGetRequest big;
  big.mutable_keys()->assign(kOps, 'k');
  big.mutable_key_lengths()->Resize(kOps, 1);
  v1::BatchGetResponse resp;
  EXPECT_EQ(stub_->BatchGet(context().get(), big, &resp).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);

  grpc::ClientContext ctx;
  auto stream = stub_->Stream(&ctx);
  v1::StreamRequest req;
  req.set_id(1);
  req.mutable_ops()->assign(kOps, static_cast<char>(v1::OP_GET));
  req.set_keys(big.keys());
  *req.mutable_key_lengths() = big.key_lengths();
  ASSERT_TRUE(stream->Write(req));
  stream->WritesDone();
  v1::StreamResponse answer;
  ASSERT_TRUE(stream->Read(&answer));
  EXPECT_EQ(answer.id(), 1u);
  EXPECT_EQ(answer.results(), std::string(kOps, static_cast<char>(v1::RESULT_FULL)));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  bool found = true;
  std::string value;
  ASSERT_TRUE(get("k", &found, &value).ok());  // the server is still serving
  EXPECT_FALSE(found);
}

TEST_F(ServiceTest, AFullQueueIsResourceExhausted) {
  ServerOptions o = small_server();
  o.batcher.max_queued_ops = 4;
  start(o);
  v1::BatchGetRequest big;
  for (int i = 0; i < 5; ++i) add_key(*big.mutable_keys(), big.mutable_key_lengths(), "k" + std::to_string(i));
  v1::BatchGetResponse resp;
  EXPECT_EQ(stub_->BatchGet(context().get(), big, &resp).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
}

TEST_F(ServiceTest, DrainFinishesQueuedCallsThenRefusesNewOnes) {
  ServerOptions o = small_server();
  o.batcher.max_delay = 300ms;
  start(o);
  // A call queued behind the delay when the drain starts still completes.
  grpc::Status queued_status;
  std::thread caller([&] { queued_status = put("queued", "v"); });
  std::this_thread::sleep_for(50ms);
  server_->shutdown(5000ms);
  caller.join();
  EXPECT_TRUE(queued_status.ok()) << queued_status.error_message();
  EXPECT_EQ(put("after", "v").error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(ServiceTest, MetricsCountOperationsAndRequests) {
  start(small_server());
  ASSERT_TRUE(put("m", "v").ok());
  bool found = false;
  std::string value;
  ASSERT_TRUE(get("m", &found, &value).ok());
  const std::string metrics = scrape(server_->metrics_port());
  EXPECT_NE(metrics.find("gpukv_operations_total{kind=\"PUT\",result=\"OK\"} 1"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("gpukv_requests_total{code=\"OK\",method=\"Get\"} 1"), std::string::npos) << metrics;
  EXPECT_EQ(metrics.find("method=\"Stream\""), std::string::npos) << "no stream yet";
  EXPECT_NE(metrics.find("gpukv_batch_execution_seconds_count"), std::string::npos);
  EXPECT_NE(metrics.find("gpukv_batch_staging_seconds_count"), std::string::npos);
  EXPECT_NE(metrics.find("gpukv_batch_answer_seconds_count"), std::string::npos);
  EXPECT_NE(metrics.find("gpukv_items{tier=\"device\"} 1"), std::string::npos);
}

// Batches are reported as their calls are answered, which completion threads can make other than the order
// they ran in. The counters of the table's running totals (host-tier accesses, optimistic passes) must end at
// the newest totals, adding nothing for a report older than one already seen, and the gauges must show the
// latest batch to run. A GPU server with four completion threads once counted 125 * 2^64 optimistic passes
// kept: each older report added its negative difference, unsigned.
TEST(MetricsTest, TheTablesTotalsAreFollowedWhateverOrderBatchesAreAnsweredIn) {
  Metrics metrics("127.0.0.1:0");
  const auto stats = [](std::uint64_t batches, std::uint64_t passes, std::uint64_t failures, std::uint64_t reads,
                        std::uint64_t items) {
    TableStats s;
    s.batches = batches;
    s.optimistic_passes = passes;
    s.optimistic_failures = failures;
    s.host_reads = reads;
    s.device.items = items;
    return s;
  };
  const TableStats older = stats(10, 6, 1, 100, 50), newer = stats(20, 12, 2, 300, 80);
  metrics.on_table(stats(0, 0, 0, 0, 0), 0);
  metrics.on_table(newer, 0);
  metrics.on_table(older, 0);  // answered after the newer batch
  std::string body = scrape(metrics.port());
  EXPECT_NE(body.find("gpukv_optimistic_passes_total{outcome=\"kept\"} 10\n"), std::string::npos) << body;
  EXPECT_NE(body.find("gpukv_optimistic_passes_total{outcome=\"redone\"} 2\n"), std::string::npos) << body;
  EXPECT_NE(body.find("gpukv_host_tier_accesses_total{kind=\"read\"} 300\n"), std::string::npos) << body;
  EXPECT_NE(body.find("gpukv_items{tier=\"device\"} 80\n"), std::string::npos) << body;
  metrics.on_table(stats(25, 15, 2, 310, 90), 0);
  body = scrape(metrics.port());
  EXPECT_NE(body.find("gpukv_optimistic_passes_total{outcome=\"kept\"} 13\n"), std::string::npos) << body;
  EXPECT_NE(body.find("gpukv_host_tier_accesses_total{kind=\"read\"} 310\n"), std::string::npos) << body;
  EXPECT_NE(body.find("gpukv_items{tier=\"device\"} 90\n"), std::string::npos) << body;
}

// The requests counter takes the status a call ends with: a unary Put that meets a full table ran in its batch
// with an OK status and ends RESOURCE_EXHAUSTED (the error-ratio alert of deploy/prometheus reads this).
TEST_F(ServiceTest, MetricsCountTheStatusACallEndsWith) {
  start(small_server(200));
  v1::StatsResponse stats;
  ASSERT_TRUE(stub_->Stats(context().get(), v1::StatsRequest{}, &stats).ok());
  v1::BatchPutRequest puts;
  for (std::uint64_t i = 0; i < stats.tiers(0).max_items(); ++i) {
    add_key(*puts.mutable_keys(), puts.mutable_key_lengths(), "k" + std::to_string(i));
    puts.mutable_values()->append("v");
    puts.add_value_lengths(1);
  }
  v1::BatchPutResponse resp;
  ASSERT_TRUE(stub_->BatchPut(context().get(), puts, &resp).ok());
  ASSERT_EQ(put("one-more", "v").error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  const std::string metrics = scrape(server_->metrics_port());
  EXPECT_NE(metrics.find("gpukv_requests_total{code=\"RESOURCE_EXHAUSTED\",method=\"Put\"} 1"), std::string::npos)
      << metrics;
  EXPECT_EQ(metrics.find("gpukv_requests_total{code=\"OK\",method=\"Put\"}"), std::string::npos) << metrics;
}

}  // namespace
}  // namespace gpukv::server
