// gpukv::client::ClusterClient: a client of a cluster of gpukv servers, one per shard, that sends every key
// to the shard that owns it (the key-to-shard function in gpukv/v1/shard_map.hpp; README, "Cluster mode").
//
//   gpukv::client::ClusterOptions options;
//   options.targets = gpukv::client::parse_targets("gpukv-{0..2}.gpukv-shards.gpukv.svc:50051");
//   gpukv::client::ClusterClient cluster(options);
//   cluster.put("user:1", "alice");                       // to the key's shard
//   cluster.batch_get(keys, &results);                    // split by shard, parts in parallel, merged in order
//   auto stream = cluster.stream();                       // one stream per shard behind one session
//
// Unary calls go to the key's shard through that shard's Client, with its deadline and its retries with
// backoff on UNAVAILABLE. Batch calls are split by shard; the parts are sent at once (on gRPC's callback
// API, each retried on UNAVAILABLE as a unary call is, the waits timed by gRPC alarms) and their answers are
// merged back in input order into a response of the plain call's shape. A shard that fails its part fails
// only its own keys: they get RESULT_UNAVAILABLE (RESULT_FULL when the shard refused the part as too much,
// RESOURCE_EXHAUSTED; nothing of it applied), the other keys their shard's answer, and the call reports
// which shards failed and why. A key the server says belongs to another shard (RESULT_WRONG_SHARD, or
// FAILED_PRECONDITION for a unary call) means this client's shard list disagrees with the servers': it is
// reported as it came, never retried, since sending it elsewhere would follow a map one of the two sides
// has wrong. check() compares each shard's own idea of its place with this client's.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpukv/client.hpp"
#include "gpukv/stream.hpp"
#include "gpukv/v1/kv.grpc.pb.h"
#include "gpukv/v1/shard_map.hpp"

namespace gpukv::client {

struct ClusterOptions {
  std::vector<std::string> targets;  // shard i's address (host:port) is targets[i]
  ClientOptions client;              // deadline, retries and TLS for every shard (its target is ignored)
};

// Targets from a list "host:port,host:port,...", where an item may hold one range {a..b} that expands to an
// item per number: "gpukv-{0..2}.gpukv-shards.gpukv.svc:50051" names three shards. Throws
// std::invalid_argument for an empty list, an empty item or a malformed range.
std::vector<std::string> parse_targets(std::string_view spec);

// A shard whose part of a batch call failed.
struct ShardFailure {
  std::uint32_t shard;
  grpc::Status status;  // its message names the shard and its target
};

// What a batch call did besides its per-key results: OK with no failures when every shard answered;
// otherwise the shards whose parts failed (their keys marked in the results). A malformed request is
// INVALID_ARGUMENT and nothing is sent.
struct BatchOutcome {
  grpc::Status status;
  std::vector<ShardFailure> failures;
  bool complete() const { return status.ok() && failures.empty(); }
};
using BatchDone = std::function<void(BatchOutcome&& outcome)>;

class ClusterStream;

class ClusterClient {
 public:
  // Throws std::invalid_argument without targets, or with more targets than slots.
  explicit ClusterClient(ClusterOptions options);

  std::uint32_t shard_count() const { return map_.shard_count(); }
  std::uint32_t shard_of(std::string_view key) const { return map_.shard_of(key); }
  const ShardMap& shard_map() const { return map_; }
  Client& shard(std::uint32_t i) { return *shards_[i]; }
  const std::string& target(std::uint32_t i) const { return options_.targets[i]; }
  const ClusterOptions& options() const { return options_; }

  // As Client's, on the key's shard. A key that shard refuses as another's fails with FAILED_PRECONDITION.
  grpc::Status get(std::string_view key, std::optional<std::string>* value);
  grpc::Status put(std::string_view key, std::string_view value, bool if_absent = false, v1::Result* result = nullptr);
  grpc::Status del(std::string_view key, bool* deleted = nullptr);

  // Packed forms, split and merged (see the top of this file). The status is OK unless the request is
  // malformed; `failures`, if given, receives the shards whose parts failed.
  grpc::Status batch_get(const v1::BatchGetRequest& request, v1::BatchGetResponse* response,
                         std::vector<ShardFailure>* failures = nullptr);
  grpc::Status batch_put(const v1::BatchPutRequest& request, v1::BatchPutResponse* response,
                         std::vector<ShardFailure>* failures = nullptr);
  grpc::Status batch_delete(const v1::BatchDeleteRequest& request, v1::BatchDeleteResponse* response,
                            std::vector<ShardFailure>* failures = nullptr);

  // The same without waiting: `done` runs once, on a gRPC thread (or on this one, for a malformed request),
  // after every part is answered and the response is merged. Request and response must stay valid until then.
  void batch_get_async(const v1::BatchGetRequest* request, v1::BatchGetResponse* response, BatchDone done);
  void batch_put_async(const v1::BatchPutRequest* request, v1::BatchPutResponse* response, BatchDone done);
  void batch_delete_async(const v1::BatchDeleteRequest* request, v1::BatchDeleteResponse* response, BatchDone done);

  // As Client's convenience forms; a key whose shard failed has RESULT_UNAVAILABLE (or RESULT_FULL).
  grpc::Status batch_get(const std::vector<std::string>& keys, std::vector<KeyResult>* results,
                         std::vector<ShardFailure>* failures = nullptr);
  grpc::Status batch_put(const std::vector<std::pair<std::string, std::string>>& entries, bool if_absent,
                         std::vector<v1::Result>* results, std::vector<ShardFailure>* failures = nullptr);
  grpc::Status batch_delete(const std::vector<std::string>& keys, std::vector<v1::Result>* results,
                            std::vector<ShardFailure>* failures = nullptr);

  // A stream session over every shard (ClusterStream below).
  std::unique_ptr<ClusterStream> stream(const StreamOptions& options = {});

  // Every shard's Stats, in shard order, each with its call's status.
  struct ShardStats {
    grpc::Status status;
    v1::StatsResponse stats;
  };
  std::vector<ShardStats> shard_stats();
  // The sum over the shards (items, capacity, bytes and tombstones per tier, counters); fails with the
  // first shard that fails (its message naming it). shard_index is 0 and shard_count this client's.
  grpc::Status stats(v1::StatsResponse* total);
  // Every shard's Stats against this client's map: each must say it is shard i of shard_count(). Returns
  // FAILED_PRECONDITION naming the first that does not, or the first shard's failure.
  grpc::Status check();
  // Serving when every shard answers SERVING.
  grpc::Status health(bool* serving);

 private:
  // Prefixes a shard's failure with its index and target.
  grpc::Status shard_status(std::uint32_t shard, const grpc::Status& status) const;
  // Adds what this client believes to a FAILED_PRECONDITION refusal of a unary call.
  grpc::Status unary_status(std::uint32_t shard, const grpc::Status& status) const;

  ClusterOptions options_;
  ShardMap map_;
  std::vector<std::unique_ptr<Client>> shards_;
};

// A stream session over the cluster, with Stream's interface (gpukv/stream.hpp): each group is split by shard,
// the parts go on one stream per shard (opened at its first part), and the group's callback gets the merged
// results once every part is answered, by the group's id. Operations on one key keep their order, since all
// of them go to one shard's stream in the order they were sent.
//
// A shard whose stream fails fails only its own operations: they come back RESULT_UNAVAILABLE in an
// otherwise OK result, and the next group with operations for that shard opens a new stream to it (nothing is
// sent again: a stream is never replayed). A group a shard refused (queue full, deadline, draining) comes back
// RESULT_FULL for that shard's operations, as on a single server. close() returns the first failure of any
// shard's stream, or OK.
class ClusterStream {
 public:
  ClusterStream(ClusterClient& cluster, const StreamOptions& options);
  ~ClusterStream();  // cancels what is still open, and waits for every callback
  ClusterStream(const ClusterStream&) = delete;
  ClusterStream& operator=(const ClusterStream&) = delete;

  grpc::Status send(OpGroup& group, GroupCallback done, std::uint64_t* id = nullptr);
  grpc::Status try_send(OpGroup& group, GroupCallback done, std::uint64_t* id = nullptr);
  grpc::Status call(OpGroup& group, GroupResult* result);
  grpc::Status close();
  void cancel();
  std::size_t in_flight() const;

 private:
  class State;
  std::unique_ptr<State> state_;
  bool closed_ = false;  // close() was called: the destructor does not cancel
};

}  // namespace gpukv::client
