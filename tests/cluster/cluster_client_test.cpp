// client::ClusterClient and ClusterStream against shards in process (real gRPC servers on 127.0.0.1, each
// refusing the others' keys): calls are split by shard and merged back in input order; a shard that is gone
// fails only its own keys, which say UNAVAILABLE while the others succeed; a client whose shard list
// disagrees with the servers' gets WRONG_SHARD (and FAILED_PRECONDITION for unary calls) reported as it came,
// and check() names the disagreement; a malformed request is refused before anything is sent.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "gpukv/cluster.hpp"
#include "service/server.hpp"
#include "support/small_server.hpp"

namespace gpukv {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<server::Server> shard_server(std::uint32_t index, std::uint32_t count) {
  server::ServerOptions o = test::small_server_options();
  o.batcher.batch_size = 128;
  o.shard_index = index;
  o.shard_count = count;
  return std::make_unique<server::Server>(o);
}

class ClusterClientTest : public testing::Test {
 protected:
  // Starts `servers` shards that believe there are `server_count`, and a client over the first
  // `client_shards` of them.
  void start(std::uint32_t servers, std::uint32_t server_count, std::uint32_t client_shards) {
    for (std::uint32_t i = 0; i < servers; ++i) servers_.push_back(shard_server(i, server_count));
    client::ClusterOptions o;
    o.client.timeout = 5s;
    o.client.max_attempts = 2;
    o.client.first_backoff = 10ms;
    for (std::uint32_t i = 0; i < client_shards; ++i) o.targets.push_back("127.0.0.1:" + std::to_string(servers_[i]->port()));
    cluster_ = std::make_unique<client::ClusterClient>(o);
  }

  static std::vector<std::string> keys(int n, const std::string& prefix = "key") {
    std::vector<std::string> k;
    for (int i = 0; i < n; ++i) k.push_back(prefix + std::to_string(i));
    return k;
  }

  std::vector<std::unique_ptr<server::Server>> servers_;
  std::unique_ptr<client::ClusterClient> cluster_;
};

TEST_F(ClusterClientTest, BatchCallsAreSplitByShardAndMergedInInputOrder) {
  start(3, 3, 3);
  const std::vector<std::string> k = keys(300);
  std::vector<std::pair<std::string, std::string>> entries;
  for (const std::string& key : k) entries.emplace_back(key, "value of " + key);
  std::vector<v1::Result> put;
  ASSERT_TRUE(cluster_->batch_put(entries, false, &put).ok());
  ASSERT_EQ(put.size(), k.size());
  for (const v1::Result r : put) ASSERT_EQ(r, v1::RESULT_OK);

  // Every shard holds exactly its own keys.
  std::map<std::uint32_t, std::uint64_t> per_shard;
  for (const std::string& key : k) ++per_shard[cluster_->shard_of(key)];
  const auto all = cluster_->shard_stats();
  for (std::uint32_t s = 0; s < 3; ++s) {
    ASSERT_TRUE(all[s].status.ok());
    EXPECT_EQ(all[s].stats.tiers(0).items(), per_shard[s]) << "shard " << s;
    EXPECT_GT(per_shard[s], 50u) << "300 keys spread over 3 shards";
  }
  v1::StatsResponse total;
  ASSERT_TRUE(cluster_->stats(&total).ok());
  EXPECT_EQ(total.tiers(0).items(), k.size());
  EXPECT_EQ(total.shard_count(), 3u);
  EXPECT_TRUE(cluster_->check().ok());

  // Gets of present and absent keys, interleaved, repeated: results and values in input order.
  std::vector<std::string> asked;
  for (int i = 0; i < 300; ++i) {
    asked.push_back(k[(i * 7) % 300]);
    if (i % 5 == 0) asked.push_back("absent" + std::to_string(i));
  }
  std::vector<client::KeyResult> got;
  std::vector<client::ShardFailure> failures;
  ASSERT_TRUE(cluster_->batch_get(asked, &got, &failures).ok());
  EXPECT_TRUE(failures.empty());
  ASSERT_EQ(got.size(), asked.size());
  for (std::size_t i = 0; i < asked.size(); ++i) {
    if (asked[i].rfind("absent", 0) == 0) {
      EXPECT_EQ(got[i].result, v1::RESULT_NOT_FOUND) << asked[i];
    } else {
      EXPECT_EQ(got[i].result, v1::RESULT_OK) << asked[i];
      EXPECT_EQ(got[i].value, "value of " + asked[i]);
    }
  }

  std::vector<v1::Result> deleted;
  ASSERT_TRUE(cluster_->batch_delete({k[0], "absent", k[1], k[0]}, &deleted).ok());
  EXPECT_EQ(deleted, (std::vector<v1::Result>{v1::RESULT_OK, v1::RESULT_NOT_FOUND, v1::RESULT_OK, v1::RESULT_NOT_FOUND}));

  // Unary calls go to the owner.
  ASSERT_TRUE(cluster_->put("unary", "u").ok());
  std::optional<std::string> value;
  ASSERT_TRUE(cluster_->get("unary", &value).ok());
  EXPECT_EQ(value, "u");
  const std::uint32_t owner = cluster_->shard_of("unary");
  ASSERT_TRUE(cluster_->shard(owner).get("unary", &value).ok()) << "stored on its owner";
  EXPECT_EQ(value, "u");
  EXPECT_EQ(cluster_->shard((owner + 1) % 3).get("unary", &value).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(ClusterClientTest, AStreamKeepsEachKeysOrderAcrossGroupsAndShards) {
  start(3, 3, 3);
  auto stream = cluster_->stream({.timeout = 30s, .max_in_flight = 4});
  const std::vector<std::string> k = keys(40, "s");
  std::mutex m;
  std::condition_variable cv;
  std::vector<client::GroupResult> results(50);
  std::vector<grpc::Status> statuses(50);
  int answered = 0;
  for (int g = 0; g < 50; ++g) {
    client::OpGroup group;
    for (int j = 0; j < 8; ++j) {
      const std::string& key = k[(g * 3 + j) % 40];
      group.put(key, "g" + std::to_string(g)).get(key);
    }
    ASSERT_TRUE(stream->send(group, [&, g](const grpc::Status& s, client::GroupResult&& r) {
      std::lock_guard lock(m);
      statuses[g] = s;
      results[g] = std::move(r);
      ++answered;
      cv.notify_one();
    }).ok());
  }
  EXPECT_TRUE(stream->close().ok());
  std::unique_lock lock(m);
  ASSERT_EQ(answered, 50);
  // Each GET right after its PUT in the same group sees that PUT (the group's own value, never a later one).
  for (int g = 0; g < 50; ++g) {
    ASSERT_TRUE(statuses[g].ok());
    ASSERT_EQ(results[g].size(), 16u);
    for (int j = 0; j < 8; ++j) {
      EXPECT_EQ(results[g].result(2 * j), v1::RESULT_OK);
      EXPECT_EQ(results[g].result(2 * j + 1), v1::RESULT_OK);
      EXPECT_EQ(results[g].value(2 * j + 1), "g" + std::to_string(g)) << "group " << g << " op " << j;
    }
  }
}

TEST_F(ClusterClientTest, AShardThatIsGoneFailsOnlyItsOwnKeys) {
  start(3, 3, 3);
  const std::vector<std::string> k = keys(200);
  std::vector<std::pair<std::string, std::string>> entries;
  for (const std::string& key : k) entries.emplace_back(key, "v" + key);
  std::vector<v1::Result> put;
  ASSERT_TRUE(cluster_->batch_put(entries, false, &put).ok());
  const std::string dead_target = cluster_->target(1);
  servers_[1].reset();  // shard 1 drains and stops: its port refuses connections

  std::vector<client::KeyResult> got;
  std::vector<client::ShardFailure> failures;
  ASSERT_TRUE(cluster_->batch_get(k, &got, &failures).ok()) << "the call itself completes";
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].shard, 1u);
  EXPECT_EQ(failures[0].status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(failures[0].status.error_message().find(dead_target), std::string::npos) << failures[0].status.error_message();
  for (std::size_t i = 0; i < k.size(); ++i) {
    if (cluster_->shard_of(k[i]) == 1) {
      EXPECT_EQ(got[i].result, v1::RESULT_UNAVAILABLE) << k[i];
      EXPECT_EQ(got[i].value, "");
    } else {
      EXPECT_EQ(got[i].result, v1::RESULT_OK) << k[i];
      EXPECT_EQ(got[i].value, "v" + k[i]);
    }
  }

  // The same on a stream: one group spanning the shards.
  auto stream = cluster_->stream({.timeout = 30s});
  client::OpGroup group;
  for (const std::string& key : k) group.get(key);
  client::GroupResult result;
  ASSERT_TRUE(stream->call(group, &result).ok());
  for (std::size_t i = 0; i < k.size(); ++i) {
    EXPECT_EQ(result.result(i), cluster_->shard_of(k[i]) == 1 ? v1::RESULT_UNAVAILABLE : v1::RESULT_OK) << k[i];
  }
  const grpc::Status end = stream->close();
  EXPECT_EQ(end.error_code(), grpc::StatusCode::UNAVAILABLE) << "close() reports the failed shard's stream";
  EXPECT_NE(end.error_message().find("shard 1"), std::string::npos) << end.error_message();

  // A unary call of one of its keys fails, naming it; the other shards' keys still work.
  std::string dead_key, live_key;
  for (const std::string& key : k) (cluster_->shard_of(key) == 1 ? dead_key : live_key) = key;
  std::optional<std::string> value;
  const grpc::Status s = cluster_->get(dead_key, &value);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(s.error_message().find("shard 1"), std::string::npos) << s.error_message();
  ASSERT_TRUE(cluster_->get(live_key, &value).ok());
  EXPECT_EQ(value, "v" + live_key);
}

TEST_F(ClusterClientTest, AClientWithAStaleShardListGetsWrongShardNeverAWrongAnswer) {
  start(3, 3, 2);  // three shards, a client that knows two
  const grpc::Status check = cluster_->check();
  EXPECT_EQ(check.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(check.error_message().find("of 3"), std::string::npos) << check.error_message();

  const ShardMap servers_map(3);
  const std::vector<std::string> k = keys(100);
  std::vector<std::pair<std::string, std::string>> entries;
  for (const std::string& key : k) entries.emplace_back(key, "v");
  std::vector<v1::Result> put;
  ASSERT_TRUE(cluster_->batch_put(entries, false, &put).ok());
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < k.size(); ++i) {
    // The client sends each key to its two-shard owner; that server keeps it only if it owns it among three.
    const bool kept = servers_map.shard_of(k[i]) == cluster_->shard_of(k[i]);
    EXPECT_EQ(put[i], kept ? v1::RESULT_OK : v1::RESULT_WRONG_SHARD) << k[i];
    wrong += !kept;
  }
  EXPECT_GT(wrong, 10u);

  std::string misrouted;
  for (const std::string& key : k) {
    if (servers_map.shard_of(key) != cluster_->shard_of(key)) misrouted = key;
  }
  std::optional<std::string> value;
  const grpc::Status s = cluster_->get(misrouted, &value);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("belongs to shard " + std::to_string(servers_map.shard_of(misrouted))), std::string::npos)
      << s.error_message();
  EXPECT_NE(s.error_message().find("disagree"), std::string::npos) << s.error_message();

  v1::BatchGetRequest get;
  get.mutable_keys()->append(misrouted);
  get.add_key_lengths(static_cast<std::uint32_t>(misrouted.size()));
  v1::BatchGetResponse resp;
  ASSERT_TRUE(cluster_->batch_get(get, &resp).ok());
  EXPECT_EQ(resp.results(), std::string(1, static_cast<char>(v1::RESULT_WRONG_SHARD)));
  ASSERT_EQ(resp.owners_size(), 1);
  EXPECT_EQ(resp.owners(0), servers_map.shard_of(misrouted));
}

TEST_F(ClusterClientTest, AMalformedRequestIsRefusedBeforeAnythingIsSent) {
  start(2, 2, 2);
  v1::BatchPutRequest bad;
  bad.set_keys("abc");
  bad.add_key_lengths(2);
  bad.add_value_lengths(0);
  v1::BatchPutResponse resp;
  EXPECT_EQ(cluster_->batch_put(bad, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  auto stream = cluster_->stream();
  client::OpGroup empty;
  EXPECT_EQ(stream->send(empty, [](const grpc::Status&, client::GroupResult&&) {}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(stream->close().ok());
  v1::StatsResponse total;
  ASSERT_TRUE(cluster_->stats(&total).ok());
  EXPECT_EQ(total.operations(), 0u);
}

}  // namespace
}  // namespace gpukv
