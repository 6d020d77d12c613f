// One call to one shard on the stub's callback API, retried on UNAVAILABLE with exponential backoff as
// Client's blocking calls are (ClientOptions: attempts, first backoff, a fresh deadline per attempt). The
// wait between attempts is a gRPC alarm, so no thread sleeps; the cluster client sends a batch's parts to
// their shards at once with these.
#pragma once

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>

#include "gpukv/client.hpp"

namespace gpukv::client::detail {

// Launch(stub_async, context, request, response, on_done) starts one attempt. The request and response must
// outlive the call; `done` runs once, with the last attempt's status.
template <class Request, class Response>
class PartCall {
 public:
  using Launch = std::function<void(v1::KeyValue::Stub::async_interface*, grpc::ClientContext*, const Request*, Response*,
                                    std::function<void(grpc::Status)>)>;

  PartCall(Client& client, Launch launch, const Request* request, Response* response, std::function<void(grpc::Status)> done)
      : client_(client), launch_(std::move(launch)), request_(request), response_(response), done_(std::move(done)),
        backoff_(client.options().first_backoff) {}

  void start() {
    ++attempt_;
    context_.emplace();
    context_->set_deadline(std::chrono::system_clock::now() + client_.options().timeout);
    launch_(client_.stub().async(), &*context_, request_, response_, [this](grpc::Status status) { finished(std::move(status)); });
  }

 private:
  void finished(grpc::Status status) {
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE || attempt_ >= client_.options().max_attempts) {
      done_(std::move(status));  // may destroy this object: nothing after it
      return;
    }
    // Destroying an alarm that has fired (even from its own callback) is safe: gRPC holds its own reference.
    alarm_ = std::make_unique<grpc::Alarm>();
    alarm_->Set(std::chrono::system_clock::now() + backoff_, [this](bool) { start(); });
    backoff_ *= 2;
  }

  Client& client_;
  const Launch launch_;
  const Request* request_;
  Response* response_;
  const std::function<void(grpc::Status)> done_;
  std::chrono::milliseconds backoff_;
  int attempt_ = 0;
  std::optional<grpc::ClientContext> context_;  // one per attempt
  std::unique_ptr<grpc::Alarm> alarm_;
};

}  // namespace gpukv::client::detail
