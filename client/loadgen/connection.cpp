#include "connection.hpp"

namespace gpukv::load {
namespace {

template <class StreamType>
class StreamOf final : public GroupStream {
 public:
  explicit StreamOf(std::unique_ptr<StreamType> stream) : stream_(std::move(stream)) {}
  grpc::Status send(client::OpGroup& group, client::GroupCallback done) override { return stream_->send(group, std::move(done)); }
  grpc::Status try_send(client::OpGroup& group, client::GroupCallback done) override {
    return stream_->try_send(group, std::move(done));
  }
  grpc::Status close() override { return stream_->close(); }

 private:
  std::unique_ptr<StreamType> stream_;
};

// A cluster call's outcome as one status: OK only if every shard answered.
grpc::Status status_of(const client::BatchOutcome& outcome) {
  if (!outcome.status.ok() || outcome.failures.empty()) return outcome.status;
  return outcome.failures.front().status;
}

}  // namespace

Connection::Connection(const client::ClientOptions& options, const std::vector<std::string>& targets) {
  if (targets.empty()) {
    client_ = std::make_unique<client::Client>(options);
  } else {
    client_ = std::make_unique<client::ClusterClient>(client::ClusterOptions{targets, options});
  }
}

v1::KeyValue::Stub::async_interface* Connection::unary_stub(std::string_view key) {
  if (auto* one = std::get_if<std::unique_ptr<client::Client>>(&client_)) return (*one)->stub().async();
  auto& cluster = *std::get<std::unique_ptr<client::ClusterClient>>(client_);
  return cluster.shard(cluster.shard_of(key)).stub().async();
}

void Connection::batch_get(grpc::ClientContext* context, const v1::BatchGetRequest* request, v1::BatchGetResponse* response,
                           Done done) {
  if (auto* one = std::get_if<std::unique_ptr<client::Client>>(&client_)) {
    (*one)->stub().async()->BatchGet(context, request, response, std::move(done));
    return;
  }
  std::get<std::unique_ptr<client::ClusterClient>>(client_)->batch_get_async(
      request, response, [done = std::move(done)](client::BatchOutcome&& o) { done(status_of(o)); });
}

void Connection::batch_put(grpc::ClientContext* context, const v1::BatchPutRequest* request, v1::BatchPutResponse* response,
                           Done done) {
  if (auto* one = std::get_if<std::unique_ptr<client::Client>>(&client_)) {
    (*one)->stub().async()->BatchPut(context, request, response, std::move(done));
    return;
  }
  std::get<std::unique_ptr<client::ClusterClient>>(client_)->batch_put_async(
      request, response, [done = std::move(done)](client::BatchOutcome&& o) { done(status_of(o)); });
}

void Connection::batch_delete(grpc::ClientContext* context, const v1::BatchDeleteRequest* request,
                              v1::BatchDeleteResponse* response, Done done) {
  if (auto* one = std::get_if<std::unique_ptr<client::Client>>(&client_)) {
    (*one)->stub().async()->BatchDelete(context, request, response, std::move(done));
    return;
  }
  std::get<std::unique_ptr<client::ClusterClient>>(client_)->batch_delete_async(
      request, response, [done = std::move(done)](client::BatchOutcome&& o) { done(status_of(o)); });
}

std::unique_ptr<GroupStream> Connection::stream(const client::StreamOptions& options) {
  if (auto* one = std::get_if<std::unique_ptr<client::Client>>(&client_)) {
    return std::make_unique<StreamOf<client::Stream>>((*one)->stream(options));
  }
  return std::make_unique<StreamOf<client::ClusterStream>>(std::get<std::unique_ptr<client::ClusterClient>>(client_)->stream(options));
}

}  // namespace gpukv::load
