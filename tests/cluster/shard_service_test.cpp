// One shard of a three-shard cluster, in process over a real channel: a key of another shard sent straight to
// it (as a naive client or one with a stale shard list would) is refused, and nothing is stored for it. A
// unary call fails FAILED_PRECONDITION naming the owner (also in trailing metadata); in a batch or stream call
// that key alone gets RESULT_WRONG_SHARD with its owner listed, and the call's own keys run as usual. Stats
// and the metrics count the refused keys.
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "gpukv/v1/kv.grpc.pb.h"
#include "gpukv/v1/shard_map.hpp"
#include "../server/scrape.hpp"
#include "service/server.hpp"
#include "support/small_server.hpp"

namespace gpukv::server {
namespace {

using namespace std::chrono_literals;
namespace v1 = gpukv::v1;

constexpr std::uint32_t kShard = 1, kShards = 3;

class ShardServiceTest : public testing::Test {
 protected:
  void SetUp() override {
    ServerOptions o = test::small_server_options();
    o.batcher.batch_size = 256;
    o.shard_index = kShard;
    o.shard_count = kShards;
    server_ = std::make_unique<Server>(o);
    stub_ = v1::KeyValue::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->port()), grpc::InsecureChannelCredentials()));
    for (int i = 0; owned_.size() < 40 || foreign_.size() < 40; ++i) {
      const std::string key = "key" + std::to_string(i);
      (map_.shard_of(key) == kShard ? owned_ : foreign_).push_back(key);
    }
  }

  std::unique_ptr<grpc::ClientContext> context() {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + 10s);
    return c;
  }

  v1::StatsResponse stats() {
    v1::StatsResponse s;
    EXPECT_TRUE(stub_->Stats(context().get(), v1::StatsRequest{}, &s).ok());
    return s;
  }

  // Keys owned[0], foreign[0], owned[1], foreign[1], ... (n of each).
  std::vector<std::string> interleaved(std::size_t n) const {
    std::vector<std::string> keys;
    for (std::size_t i = 0; i < n; ++i) {
      keys.push_back(owned_[i]);
      keys.push_back(foreign_[i]);
    }
    return keys;
  }

  const ShardMap map_{kShards};
  std::unique_ptr<Server> server_;
  std::unique_ptr<v1::KeyValue::Stub> stub_;
  std::vector<std::string> owned_, foreign_;
};

TEST_F(ShardServiceTest, AUnaryCallOfAForeignKeyFailsNamingItsOwnerAndStoresNothing) {
  const std::string& key = foreign_[0];
  const std::uint32_t owner = map_.shard_of(key);
  v1::PutRequest put;
  put.set_key(key);
  put.set_value("v");
  v1::PutResponse put_resp;
  auto ctx = context();
  const grpc::Status s = stub_->Put(ctx.get(), put, &put_resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("belongs to shard " + std::to_string(owner)), std::string::npos) << s.error_message();
  EXPECT_NE(s.error_message().find("shard 1 of 3"), std::string::npos) << s.error_message();
  const auto& trailers = ctx->GetServerTrailingMetadata();
  const auto it = trailers.find("gpukv-owner-shard");
  ASSERT_NE(it, trailers.end());
  EXPECT_EQ(std::string(it->second.data(), it->second.size()), std::to_string(owner));

  v1::GetRequest get;
  get.set_key(key);
  v1::GetResponse get_resp;
  EXPECT_EQ(stub_->Get(context().get(), get, &get_resp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  v1::DeleteRequest del;
  del.set_key(key);
  v1::DeleteResponse del_resp;
  EXPECT_EQ(stub_->Delete(context().get(), del, &del_resp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);

  // An owned key is served as usual; the table holds it alone.
  put.set_key(owned_[0]);
  ASSERT_TRUE(stub_->Put(context().get(), put, &put_resp).ok());
  const v1::StatsResponse st = stats();
  EXPECT_EQ(st.tiers(0).items(), 1u);
  EXPECT_EQ(st.shard_index(), kShard);
  EXPECT_EQ(st.shard_count(), kShards);
  EXPECT_EQ(st.wrong_shard_keys(), 3u);
}

TEST_F(ShardServiceTest, ABatchAnswersForeignKeysWrongShardAndRunsItsOwn) {
  const std::vector<std::string> keys = interleaved(20);
  v1::BatchPutRequest put;
  for (const std::string& k : keys) {
    put.mutable_keys()->append(k);
    put.add_key_lengths(static_cast<std::uint32_t>(k.size()));
    put.mutable_values()->append("v:" + k);
    put.add_value_lengths(static_cast<std::uint32_t>(2 + k.size()));
  }
  v1::BatchPutResponse put_resp;
  ASSERT_TRUE(stub_->BatchPut(context().get(), put, &put_resp).ok());
  ASSERT_EQ(put_resp.results().size(), keys.size());
  std::vector<std::uint32_t> want_owners;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const bool own = i % 2 == 0;
    EXPECT_EQ(put_resp.results()[i], own ? v1::RESULT_OK : v1::RESULT_WRONG_SHARD) << keys[i];
    if (!own) want_owners.push_back(map_.shard_of(keys[i]));
  }
  EXPECT_EQ(std::vector<std::uint32_t>(put_resp.owners().begin(), put_resp.owners().end()), want_owners);
  EXPECT_EQ(stats().tiers(0).items(), 20u) << "only the owned keys are stored";

  // BatchGet: values of the owned keys, packed in request order; nothing for the foreign ones.
  v1::BatchGetRequest get;
  for (const std::string& k : keys) {
    get.mutable_keys()->append(k);
    get.add_key_lengths(static_cast<std::uint32_t>(k.size()));
  }
  v1::BatchGetResponse got;
  ASSERT_TRUE(stub_->BatchGet(context().get(), get, &got).ok());
  ASSERT_EQ(got.value_lengths_size(), static_cast<int>(keys.size()));
  std::size_t at = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const std::uint32_t len = got.value_lengths(static_cast<int>(i));
    if (i % 2 == 0) {
      EXPECT_EQ(got.results()[i], v1::RESULT_OK);
      EXPECT_EQ(got.values().substr(at, len), "v:" + keys[i]);
    } else {
      EXPECT_EQ(got.results()[i], v1::RESULT_WRONG_SHARD);
      EXPECT_EQ(len, 0u);
    }
    at += len;
  }
  EXPECT_EQ(at, got.values().size());
  EXPECT_EQ(std::vector<std::uint32_t>(got.owners().begin(), got.owners().end()), want_owners);

  // A batch of foreign keys alone never reaches the table.
  v1::BatchDeleteRequest del;
  for (std::size_t i = 0; i < 10; ++i) {
    del.mutable_keys()->append(foreign_[i]);
    del.add_key_lengths(static_cast<std::uint32_t>(foreign_[i].size()));
  }
  v1::BatchDeleteResponse del_resp;
  ASSERT_TRUE(stub_->BatchDelete(context().get(), del, &del_resp).ok());
  EXPECT_EQ(del_resp.results(), std::string(10, static_cast<char>(v1::RESULT_WRONG_SHARD)));
  EXPECT_EQ(del_resp.owners_size(), 10);
  const v1::StatsResponse st = stats();
  EXPECT_EQ(st.tiers(0).items(), 20u);
  EXPECT_EQ(st.wrong_shard_keys(), 20u + 20u + 10u);
}

TEST_F(ShardServiceTest, AStreamAnswersForeignOpsWrongShardInPlace) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  auto stream = stub_->Stream(&ctx);
  // Group 1: put owned[0], put foreign[0], get owned[0], get foreign[0]. Group 2: foreign keys only.
  v1::StreamRequest one;
  one.set_id(1);
  const auto add = [](v1::StreamRequest& r, v1::OpKind kind, const std::string& key, const std::string& value = "") {
    r.mutable_ops()->push_back(static_cast<char>(kind));
    r.mutable_keys()->append(key);
    r.add_key_lengths(static_cast<std::uint32_t>(key.size()));
    if (kind == v1::OP_PUT) {
      r.mutable_values()->append(value);
      r.add_value_lengths(static_cast<std::uint32_t>(value.size()));
    }
  };
  add(one, v1::OP_PUT, owned_[0], "mine");
  add(one, v1::OP_PUT, foreign_[0], "theirs");
  add(one, v1::OP_GET, owned_[0]);
  add(one, v1::OP_GET, foreign_[0]);
  v1::StreamRequest two;
  two.set_id(2);
  add(two, v1::OP_GET, foreign_[1]);
  add(two, v1::OP_DELETE, foreign_[2]);
  ASSERT_TRUE(stream->Write(one));
  ASSERT_TRUE(stream->Write(two));
  ASSERT_TRUE(stream->WritesDone());
  v1::StreamResponse r1, r2;
  ASSERT_TRUE(stream->Read(&r1));
  ASSERT_TRUE(stream->Read(&r2));
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(r1.id(), 1u);
  EXPECT_EQ(r1.results(), std::string({static_cast<char>(v1::RESULT_OK), static_cast<char>(v1::RESULT_WRONG_SHARD),
                                       static_cast<char>(v1::RESULT_OK), static_cast<char>(v1::RESULT_WRONG_SHARD)}));
  EXPECT_EQ(r1.values(), "mine");
  EXPECT_EQ(std::vector<std::uint32_t>(r1.value_lengths().begin(), r1.value_lengths().end()),
            (std::vector<std::uint32_t>{0, 0, 4, 0}));
  EXPECT_EQ(std::vector<std::uint32_t>(r1.owners().begin(), r1.owners().end()),
            (std::vector<std::uint32_t>{map_.shard_of(foreign_[0]), map_.shard_of(foreign_[0])}));
  EXPECT_EQ(r2.id(), 2u);
  EXPECT_EQ(r2.results(), std::string(2, static_cast<char>(v1::RESULT_WRONG_SHARD)));
  EXPECT_EQ(stats().tiers(0).items(), 1u);
}

TEST_F(ShardServiceTest, TheMetricsCountRefusedKeys) {
  v1::BatchGetRequest get;
  for (std::size_t i = 0; i < 7; ++i) {
    get.mutable_keys()->append(foreign_[i]);
    get.add_key_lengths(static_cast<std::uint32_t>(foreign_[i].size()));
  }
  v1::BatchGetResponse got;
  ASSERT_TRUE(stub_->BatchGet(context().get(), get, &got).ok());
  v1::GetRequest one;
  one.set_key(foreign_[0]);
  v1::GetResponse one_resp;
  EXPECT_EQ(stub_->Get(context().get(), one, &one_resp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  const std::string metrics = scrape(server_->metrics_port());
  EXPECT_NE(metrics.find("gpukv_wrong_shard_keys_total 8"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("gpukv_requests_total{code=\"FAILED_PRECONDITION\",method=\"Get\"} 1"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("gpukv_requests_total{code=\"OK\",method=\"BatchGet\"} 1"), std::string::npos) << metrics;
}

TEST(ShardServerOptions, AShardIndexOutsideTheCountIsRefused) {
  ServerOptions o;
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "127.0.0.1:0";
  o.table.backend = BackendKind::kCpu;
  o.table.capacity = 1024;
  o.shard_index = 3;
  o.shard_count = 3;
  EXPECT_THROW(Server{o}, std::invalid_argument);
}

}  // namespace
}  // namespace gpukv::server
