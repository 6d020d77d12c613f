#include "gpukv/client.hpp"

#include "result_columns.hpp"

#include <grpcpp/generic/generic_stub.h>

#include <condition_variable>
#include <fstream>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace gpukv::client {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream content;
  content << in.rdbuf();
  return content.str();
}

std::shared_ptr<grpc::ChannelCredentials> credentials(const ClientOptions& o) {
  if (o.tls_ca.empty()) {
    if (!o.tls_cert.empty() || !o.tls_key.empty()) throw std::invalid_argument("a client certificate needs TLS: give tls_ca too");
    return grpc::InsecureChannelCredentials();
  }
  if (o.tls_cert.empty() != o.tls_key.empty()) throw std::invalid_argument("a client certificate needs its key, and a key its certificate");
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = read_file(o.tls_ca);
  if (!o.tls_cert.empty()) {
    ssl.pem_cert_chain = read_file(o.tls_cert);
    ssl.pem_private_key = read_file(o.tls_key);
  }
  return grpc::SslCredentials(ssl);
}

// Adds "authorization: Bearer <token>" to every call of a channel. An interceptor rather than call
// credentials: gRPC sends call credentials over TLS only, and a token also serves a plaintext server on a
// trusted network (a sidecar on 127.0.0.1).
class BearerTokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(const std::string& header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", header_);
    }
    methods->Proceed();
  }

 private:
  const std::string& header_;  // the factory's, which the channel keeps
};

class BearerTokenFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenFactory(const std::string& token) : header_("Bearer " + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(grpc::experimental::ClientRpcInfo*) override {
    return new BearerTokenInterceptor(header_);
  }

 private:
  const std::string header_;
};

// One Result byte per key, as the batch calls return them.
grpc::Status unpack_results(std::size_t ops, const std::string& packed, std::vector<v1::Result>* results) {
  if (std::string e = check_result_columns(ops, packed); !e.empty()) {
    return {grpc::StatusCode::INTERNAL, "malformed response: " + e};
  }
  results->clear();
  for (char r : packed) results->push_back(static_cast<v1::Result>(r));
  return grpc::Status::OK;
}

// gRPC's default 4 MiB limit on received messages would fail a large BatchGet; a server sends up to its
// --max_message_bytes (64 MiB unless set, at most 1 GiB).
// A server that went away (a shard restarted by Kubernetes, say) is tried again at most 5 s apart, where
// gRPC's default backoff grows to 2 minutes: calls fail fast (UNAVAILABLE) while it is down and find it
// again soon after it is back.
std::shared_ptr<grpc::Channel> make_channel(const ClientOptions& o) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(1 << 30);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 5000);
  if (o.auth_token.empty()) return grpc::CreateCustomChannel(o.target, credentials(o), args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<BearerTokenFactory>(o.auth_token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(o.target, credentials(o), args, std::move(interceptors));
}

}  // namespace

std::string read_token_file(const std::string& path) {
  std::string token = read_file(path);
  token.erase(token.find_last_not_of(" \t\r\n") + 1);
  return token;
}

const char* status_code_name(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "ERROR";
  }
}

void pack_keys(const std::vector<std::string>& keys, std::string* blob, google::protobuf::RepeatedField<std::uint32_t>* lengths) {
  lengths->Reserve(static_cast<int>(keys.size()));
  for (const std::string& k : keys) {
    blob->append(k);
    lengths->Add(static_cast<std::uint32_t>(k.size()));
  }
}

v1::BatchPutRequest pack_entries(const std::vector<std::pair<std::string, std::string>>& entries, bool if_absent) {
  v1::BatchPutRequest req;
  req.set_if_absent(if_absent);
  for (const auto& [k, v] : entries) {
    req.mutable_keys()->append(k);
    req.add_key_lengths(static_cast<std::uint32_t>(k.size()));
    req.mutable_values()->append(v);
    req.add_value_lengths(static_cast<std::uint32_t>(v.size()));
  }
  return req;
}

void unpack_get_results(const v1::BatchGetResponse& response, std::size_t keys, std::vector<KeyResult>* results) {
  results->clear();
  results->reserve(keys);
  std::size_t offset = 0;
  for (std::size_t i = 0; i < keys; ++i) {
    const std::uint32_t len = response.value_lengths().empty() ? 0 : response.value_lengths(static_cast<int>(i));
    results->push_back(KeyResult{static_cast<v1::Result>(response.results()[i]), response.values().substr(offset, len)});
    offset += len;
  }
}

Client::Client(ClientOptions options)
    : options_(std::move(options)), channel_(make_channel(options_)), stub_(v1::KeyValue::NewStub(channel_)) {}

std::unique_ptr<Stream> Client::stream(const StreamOptions& options) {
  return std::make_unique<Stream>(*stub_, channel_, options.timeout.count() == 0 ? options_.timeout : options.timeout,
                                  options.max_in_flight);
}

template <class Call>
grpc::Status Client::with_retries(Call&& call) {
  auto backoff = options_.first_backoff;
  for (int attempt = 1;; ++attempt) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + options_.timeout);
    grpc::Status status = call(context);
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE || attempt >= options_.max_attempts) return status;
    std::this_thread::sleep_for(backoff);
    backoff *= 2;
  }
}

grpc::Status Client::get(std::string_view key, std::optional<std::string>* value) {
  v1::GetRequest req;
  req.set_key(std::string(key));
  v1::GetResponse resp;
  grpc::Status s = with_retries([&](grpc::ClientContext& c) { return stub_->Get(&c, req, &resp); });
  if (s.ok()) *value = resp.found() ? std::optional<std::string>(resp.value()) : std::nullopt;
  return s;
}

grpc::Status Client::put(std::string_view key, std::string_view value, bool if_absent, v1::Result* result) {
  v1::PutRequest req;
  req.set_key(std::string(key));
  req.set_value(std::string(value));
  req.set_if_absent(if_absent);
  v1::PutResponse resp;
  grpc::Status s = with_retries([&](grpc::ClientContext& c) { return stub_->Put(&c, req, &resp); });
  if (s.ok() && result != nullptr) *result = resp.result();
  return s;
}

grpc::Status Client::del(std::string_view key, bool* deleted) {
  v1::DeleteRequest req;
  req.set_key(std::string(key));
  v1::DeleteResponse resp;
  grpc::Status s = with_retries([&](grpc::ClientContext& c) { return stub_->Delete(&c, req, &resp); });
  if (s.ok() && deleted != nullptr) *deleted = resp.deleted();
  return s;
}

grpc::Status Client::batch_get(const v1::BatchGetRequest& request, v1::BatchGetResponse* response) {
  return with_retries([&](grpc::ClientContext& c) { return stub_->BatchGet(&c, request, response); });
}

grpc::Status Client::batch_put(const v1::BatchPutRequest& request, v1::BatchPutResponse* response) {
  return with_retries([&](grpc::ClientContext& c) { return stub_->BatchPut(&c, request, response); });
}

grpc::Status Client::batch_delete(const v1::BatchDeleteRequest& request, v1::BatchDeleteResponse* response) {
  return with_retries([&](grpc::ClientContext& c) { return stub_->BatchDelete(&c, request, response); });
}

grpc::Status Client::batch_get(const std::vector<std::string>& keys, std::vector<KeyResult>* results) {
  v1::BatchGetRequest req;
  pack_keys(keys, req.mutable_keys(), req.mutable_key_lengths());
  v1::BatchGetResponse resp;
  grpc::Status s = batch_get(req, &resp);
  if (!s.ok()) return s;
  if (std::string e = check_result_columns(keys.size(), resp.results(), resp.value_lengths(), resp.values()); !e.empty()) {
    return {grpc::StatusCode::INTERNAL, "malformed response: " + e};
  }
  unpack_get_results(resp, keys.size(), results);
  return s;
}

grpc::Status Client::batch_put(const std::vector<std::pair<std::string, std::string>>& entries, bool if_absent,
                               std::vector<v1::Result>* results) {
  const v1::BatchPutRequest req = pack_entries(entries, if_absent);
  v1::BatchPutResponse resp;
  grpc::Status s = batch_put(req, &resp);
  if (s.ok()) s = unpack_results(entries.size(), resp.results(), results);
  return s;
}

grpc::Status Client::batch_delete(const std::vector<std::string>& keys, std::vector<v1::Result>* results) {
  v1::BatchDeleteRequest req;
  pack_keys(keys, req.mutable_keys(), req.mutable_key_lengths());
  v1::BatchDeleteResponse resp;
  grpc::Status s = batch_delete(req, &resp);
  if (s.ok()) s = unpack_results(keys.size(), resp.results(), results);
  return s;
}

grpc::Status Client::stats(v1::StatsResponse* stats) {
  return with_retries([&](grpc::ClientContext& c) { return stub_->Stats(&c, v1::StatsRequest{}, stats); });
}

grpc::Status Client::snapshot(v1::SnapshotResponse* snapshot, std::chrono::milliseconds timeout) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  return stub_->Snapshot(&context, v1::SnapshotRequest{}, snapshot);
}

grpc::Status Client::health(bool* serving) {
  // grpc.health.v1.Health/Check through the generic stub, the messages encoded by hand: the request is
  // {service: "gpukv.v1.KeyValue"} (field 1, a string), the reply {status: enum} (field 1, a varint;
  // SERVING = 1). This spares the client a copy of health.proto.
  const std::string service = "gpukv.v1.KeyValue";
  std::string request;
  request.push_back(0x0A);
  request.push_back(static_cast<char>(service.size()));
  request += service;
  grpc::GenericStub generic(channel_);
  grpc::Status status;
  std::string reply;
  status = with_retries([&](grpc::ClientContext& c) {
    grpc::Slice slice(request);
    grpc::ByteBuffer in(&slice, 1), out;
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    grpc::Status result;
    generic.UnaryCall(&c, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &in, &out, [&](grpc::Status s) {
      std::lock_guard lock(m);
      result = s;
      done = true;
      cv.notify_one();
    });
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return done; });
    if (result.ok()) {
      std::vector<grpc::Slice> slices;
      (void)out.Dump(&slices);
      reply.clear();
      for (const auto& s : slices) reply.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    return result;
  });
  if (status.ok()) *serving = reply.size() >= 2 && reply[0] == 0x08 && reply[1] == 0x01;
  return status;
}

}  // namespace gpukv::client
