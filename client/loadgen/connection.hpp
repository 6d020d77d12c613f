// What gpukv-load sends its calls through: one server (--target, client::Client) or a cluster (--targets,
// client::ClusterClient: unary calls go to their key's shard, batch calls and stream groups are split by
// shard and merged). The callers see one interface either way.
#pragma once

#include <functional>
#include <memory>
#include <string_view>
#include <variant>

#include "gpukv/client.hpp"
#include "gpukv/cluster.hpp"

namespace gpukv::load {

// A stream session on either kind of connection.
class GroupStream {
 public:
  virtual ~GroupStream() = default;
  virtual grpc::Status send(client::OpGroup& group, client::GroupCallback done) = 0;
  virtual grpc::Status try_send(client::OpGroup& group, client::GroupCallback done) = 0;
  virtual grpc::Status close() = 0;
};

class Connection {
 public:
  // A cluster when `targets` has entries, else one server at options.target.
  Connection(const client::ClientOptions& options, const std::vector<std::string>& targets);

  // The stub a unary call of `key` goes on (its shard's, on a cluster).
  v1::KeyValue::Stub::async_interface* unary_stub(std::string_view key);

  // A batch call; `done` gets OK, or the call's failure (on a cluster, the first failed shard's: its keys
  // failed and the others were answered). `context` carries the deadline to one server; a cluster's parts
  // take theirs from the options. Request and response must outlive the call.
  using Done = std::function<void(grpc::Status)>;
  void batch_get(grpc::ClientContext* context, const v1::BatchGetRequest* request, v1::BatchGetResponse* response, Done done);
  void batch_put(grpc::ClientContext* context, const v1::BatchPutRequest* request, v1::BatchPutResponse* response, Done done);
  void batch_delete(grpc::ClientContext* context, const v1::BatchDeleteRequest* request, v1::BatchDeleteResponse* response,
                    Done done);

  std::unique_ptr<GroupStream> stream(const client::StreamOptions& options);

 private:
  std::variant<std::unique_ptr<client::Client>, std::unique_ptr<client::ClusterClient>> client_;
};

}  // namespace gpukv::load
