// The gpukv server: the table, the batcher, the gRPC service (with health checking and reflection v1 and
// v1alpha) and the
// metrics endpoint, started and stopped in the right order.
//
// Start: metrics and gRPC listen first, health NOT_SERVING and calls UNAVAILABLE while the table is built
// (a large table takes a while to allocate) and the data directory, if any, is replayed into it; then the
// service is attached and health turns SERVING.
// Shutdown: health NOT_SERVING, new calls UNAVAILABLE, every queued call finished, then gRPC shuts down
// with a deadline for whatever is still in flight; with a data directory, a last snapshot is taken.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "batcher/batcher.hpp"
#include "persistence/durability.hpp"
#include "kv_service.hpp"
#include "metrics.hpp"
#include "reflection_v1.hpp"

namespace gpukv::server {

struct ServerOptions {
  std::string listen = "0.0.0.0:50051";          // gRPC; port 0 picks a free port
  std::string metrics_listen = "0.0.0.0:9464";   // Prometheus /metrics; port 0 picks a free port
  TableConfig table;
  BatcherConfig batcher;
  std::string tls_cert;  // PEM files; plaintext when both are empty
  std::string tls_key;
  std::string tls_client_ca;    // PEM of the CA client certificates must be signed by (mutual TLS); empty: none asked
  std::string auth_token_file;  // the bearer token every call must carry (bearer_token.hpp); empty: none
  ServiceLimits limits;
  // Cluster mode: this server is shard shard_index of shard_count and refuses the keys of the others.
  std::uint32_t shard_index = 0;
  std::uint32_t shard_count = 1;
  // Persistence: with a data directory, start-up replays its log and executed batches' writes are logged.
  persistence::DurabilityOptions durability;
};

class Server {
 public:
  // Returns once the table is built and the service is SERVING. Throws on a bad setting or a port in use.
  explicit Server(const ServerOptions& options);
  ~Server();

  int port() const { return port_; }
  int metrics_port() const { return metrics_->port(); }
  std::string backend() const;

  // Drains and stops; calls still running after `grace` are cancelled. Idempotent.
  void shutdown(std::chrono::milliseconds grace);

 private:
  ServerOptions options_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<KvService> service_;
  std::unique_ptr<ReflectionV1> reflection_v1_;
  std::unique_ptr<grpc::Server> grpc_;
  std::unique_ptr<Table> table_;
  std::unique_ptr<persistence::Durability> durability_;  // after the table, before the batcher that logs to it
  std::atomic<persistence::Durability*> durability_ready_{nullptr};  // for the Snapshot call, once loaded
  std::unique_ptr<Batcher> batcher_;
  int port_ = 0;
  bool stopped_ = false;
};

}  // namespace gpukv::server
