// gpukv::Client: a C++ client for the gpukv.v1 service. Every call carries a deadline; a call answered
// UNAVAILABLE (the server is starting or draining, or not reachable) is retried with exponential backoff,
// and no other failure is retried. Batch calls send packed columns; stream() opens a pipelined session
// (gpukv/stream.hpp), which is not retried.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpukv/stream.hpp"
#include "gpukv/v1/kv.grpc.pb.h"

namespace gpukv::client {

struct ClientOptions {
  std::string target = "127.0.0.1:50051";
  std::chrono::milliseconds timeout{5000};  // per attempt
  int max_attempts = 4;                     // 1 + retries on UNAVAILABLE
  std::chrono::milliseconds first_backoff{50};
  std::string tls_ca;                       // PEM of the CA to trust; plaintext when empty
  std::string tls_cert;                     // this client's certificate and key (PEM files), for a server that
  std::string tls_key;                      //   asks for one (mutual TLS); with tls_ca
  std::string auth_token;                   // sent with every call as "authorization: Bearer <token>"; none when empty
};

// A bearer token kept in a file, as the server's --auth_token_file reads it: the content less trailing white
// space. Throws std::runtime_error if the file cannot be read.
std::string read_token_file(const std::string& path);

// The result of one key in a batch, and its value for a GET that found it.
struct KeyResult {
  v1::Result result;
  std::string value;
};

class Client {
 public:
  explicit Client(ClientOptions options);

  // value is empty when the key is absent (a miss is not an error).
  grpc::Status get(std::string_view key, std::optional<std::string>* value);
  grpc::Status put(std::string_view key, std::string_view value, bool if_absent = false, v1::Result* result = nullptr);
  grpc::Status del(std::string_view key, bool* deleted = nullptr);

  // Packed forms: the caller builds the request's columns (pack_keys() below helps) and reads the response's
  // columns as they arrived, with no string per key: for callers that move many keys (gpukv-load).
  grpc::Status batch_get(const v1::BatchGetRequest& request, v1::BatchGetResponse* response);
  grpc::Status batch_put(const v1::BatchPutRequest& request, v1::BatchPutResponse* response);
  grpc::Status batch_delete(const v1::BatchDeleteRequest& request, v1::BatchDeleteResponse* response);

  grpc::Status batch_get(const std::vector<std::string>& keys, std::vector<KeyResult>* results);
  grpc::Status batch_put(const std::vector<std::pair<std::string, std::string>>& entries, bool if_absent,
                         std::vector<v1::Result>* results);
  grpc::Status batch_delete(const std::vector<std::string>& keys, std::vector<v1::Result>* results);

  // A Stream session; its deadline is options.timeout, or this client's timeout when that is zero. Throws
  // std::invalid_argument for max_in_flight 0.
  std::unique_ptr<Stream> stream(const StreamOptions& options = {});

  grpc::Status stats(v1::StatsResponse* stats);
  // Asks the server for a snapshot of its table and waits until it is durable, for at most `timeout` (a large
  // table takes minutes to write). Not retried: a second call would take a second snapshot.
  grpc::Status snapshot(v1::SnapshotResponse* snapshot, std::chrono::milliseconds timeout);
  // grpc.health.v1 Check of the gpukv service: serving is true when the server answers SERVING.
  grpc::Status health(bool* serving);

  v1::KeyValue::Stub& stub() { return *stub_; }
  const ClientOptions& options() const { return options_; }

 private:
  // Runs `call(context)` with a fresh deadline per attempt, retrying UNAVAILABLE with backoff.
  template <class Call>
  grpc::Status with_retries(Call&& call);

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::KeyValue::Stub> stub_;
};

// The name of a gRPC status code, for messages.
const char* status_code_name(grpc::StatusCode code);

// Packs keys into one bytes field and a length column, as the batch calls carry them.
void pack_keys(const std::vector<std::string>& keys, std::string* blob, google::protobuf::RepeatedField<std::uint32_t>* lengths);

// A BatchPut of key-value pairs, packed.
v1::BatchPutRequest pack_entries(const std::vector<std::pair<std::string, std::string>>& entries, bool if_absent);

// One KeyResult per key of a BatchGetResponse whose columns were checked for `keys` keys.
void unpack_get_results(const v1::BatchGetResponse& response, std::size_t keys, std::vector<KeyResult>* results);

}  // namespace gpukv::client
