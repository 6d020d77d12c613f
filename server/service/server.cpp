#include "server.hpp"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>

#include <fstream>
#include <sstream>
#include <stdexcept>

namespace gpukv::server {
namespace {

constexpr const char* kServiceName = "gpukv.v1.KeyValue";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::shared_ptr<grpc::ServerCredentials> credentials(const ServerOptions& o) {
  if (o.tls_cert.empty() && o.tls_key.empty()) return grpc::InsecureServerCredentials();
  if (o.tls_cert.empty() || o.tls_key.empty()) throw std::invalid_argument("TLS needs both a certificate and a key");
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({read_file(o.tls_key), read_file(o.tls_cert)});
  if (!o.tls_client_ca.empty()) {  // mutual TLS: the handshake fails for a client without a certificate of this CA
    ssl.pem_root_certs = read_file(o.tls_client_ca);
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

void set_health(grpc::Server& server, bool serving) {
  if (auto* health = server.GetHealthCheckService()) {
    health->SetServingStatus("", serving);
    health->SetServingStatus(kServiceName, serving);
  }
}

}  // namespace

Server::Server(const ServerOptions& options) : options_(options) {
  Table::check(options_.table);  // a bad table setting before any port opens
  metrics_ = std::make_unique<Metrics>(options_.metrics_listen);
  service_ = std::make_unique<KvService>(
      options_.table.key_width, options_.table.value_width, ShardFilter(options_.shard_index, options_.shard_count),
      options_.limits, [m = metrics_.get()](const char* method, grpc::StatusCode code) { m->on_request(method, code); },
      [m = metrics_.get()](std::size_t keys) { m->on_wrong_shard(keys); },
      [m = metrics_.get()](const char* limit) { m->on_limit(limit); });
  if (!options_.auth_token_file.empty()) {
    service_->require_token(BearerToken::from_file(options_.auth_token_file));
    if (options_.tls_cert.empty()) {
      spdlog::warn(
          "--auth_token_file without --tls_cert: the token crosses the network in plaintext, readable by anyone on the path");
    }
  }
  if (!options_.durability.data_dir.empty()) {
    // Set before serving; the data directory is ready only once it is loaded.
    service_->set_snapshotter([this](KvService::SnapshotDone done) {
      persistence::Durability* d = durability_ready_.load();
      if (d == nullptr) {
        persistence::SnapshotResult loading;
        loading.error = "the server is still loading its data directory";
        done(loading);
      } else {
        d->request_snapshot(std::move(done));
      }
    });
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();  // v1alpha
  reflection_v1_ = std::make_unique<ReflectionV1>(std::vector<std::string>{
      kServiceName, "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"});
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options_.listen, credentials(options_), &port_);
  builder.RegisterService(service_.get());
  builder.RegisterService(reflection_v1_.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(options_.limits.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options_.limits.max_message_bytes));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, static_cast<int>(options_.limits.max_calls_per_connection));
  if (options_.limits.max_connection_idle.count() > 0) {  // the client reconnects on its next call
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                               static_cast<int>(options_.limits.max_connection_idle.count() * 1000));
  }
  grpc_ = builder.BuildAndStart();
  if (grpc_ == nullptr || port_ == 0) throw std::runtime_error("cannot listen on " + options_.listen);
  set_health(*grpc_, false);
  spdlog::info("listening on port {} (metrics on port {}); building the table", port_, metrics_->port());

  table_ = std::make_unique<Table>(options_.table);
  BatchLog log;
  if (!options_.durability.data_dir.empty()) {
    spdlog::info("recovering {} (--wal={})", options_.durability.data_dir.string(),
                 persistence::to_string(options_.durability.wal));
    Metrics* m = metrics_.get();
    durability_ = std::make_unique<persistence::Durability>(
        options_.durability, *table_,
        persistence::DurabilityObservers{[m](std::size_t bytes) { m->on_wal_append(bytes); }, [m] { m->on_wal_failure(); },
                                         [m](double seconds) { m->on_wal_sync(seconds); },
                                         [m](std::uint64_t writes, std::uint64_t bytes, double seconds) {
                                           m->on_recovery(seconds, writes);
                                           spdlog::info("loading: {} writes, {:.2f} GB in {:.0f} s", writes, bytes / 1e9,
                                                        seconds);
                                         },
                                         [m](const persistence::SnapshotResult& r) {
                                           m->on_snapshot(r.error.empty(), r.seconds, r.bytes, r.items);
                                           if (r.error.empty()) {
                                             spdlog::info(
                                                 "snapshot {}: {} items, {:.3f} GB in {:.2f} s (reading the table {:.2f} s, "
                                                 "encoding {:.2f} s, writing {:.2f} s, final fsync {:.2f} s)",
                                                 r.path.string(), r.items, r.bytes / 1e9, r.seconds, r.table_seconds,
                                                 r.encode_seconds, r.write_seconds, r.sync_seconds);
                                           } else {
                                             spdlog::error("snapshot failed after {:.2f} s: {}", r.seconds, r.error);
                                           }
                                         }});
    const persistence::Recovery& r = durability_->recovery();
    metrics_->on_recovery(r.took.count(), r.snapshot.items + r.writes);
    metrics_->on_snapshot_schedule(static_cast<double>(options_.durability.snapshot_interval.count()));
    if (!r.snapshot.path.empty()) {
      spdlog::info("loaded {} items from {} ({:.3f} GB)", r.snapshot.items, r.snapshot.path.string(), r.snapshot.bytes / 1e9);
    }
    spdlog::info("recovered {} writes from {} log records in {} segments; loading took {:.3f} s", r.writes, r.log.records,
                 r.log.segments, r.took.count());
    if (!r.log.torn.empty())
      spdlog::warn("dropped a torn last log record (a write cut short, never acknowledged): {}", r.log.torn);
    for (const std::string& lost : r.snapshot.skipped)
      spdlog::error("--recover_skip_corrupt passed over damage, its items lost: {}", lost);
    for (const std::string& lost : r.log.skipped)
      spdlog::error("--recover_skip_corrupt passed over damage, its writes lost: {}", lost);
    if (options_.durability.wal == persistence::WalMode::kOff) {
      spdlog::warn(
          "--data_dir without --wal: a restart keeps the newest snapshot; writes since it are lost if the server is killed");
    }
    durability_ready_ = durability_.get();
    log.encode = [d = durability_.get()](const BatchIn& in, const std::uint8_t* status, std::string* record) {
      d->encode_batch(in, status, record);
    };
    log.append = [d = durability_.get()](const std::string& record) { return d->append(record); };
    log.sync = [d = durability_.get()] { return d->sync(); };
  }
  const TableStats stats = table_->stats();
  metrics_->on_table(stats, 0);  // before the batcher's thread takes over the metrics
  batcher_ = std::make_unique<Batcher>(
      *table_, options_.batcher, [this](const BatchReport& report) { metrics_->on_batch(report, batcher_->queued_ops()); },
      [this](const TableStats& stats, std::size_t ops) { service_->update_stats(stats, ops); }, std::move(log));
  service_->attach(batcher_.get(), stats, to_string(table_->backend()), table_->device_name());
  set_health(*grpc_, true);
  spdlog::info("serving: backend {} ({}), key width {} B, value width {} B, slot layout {}, capacity {} slots ({} keys at "
               "the maximum load)",
               to_string(table_->backend()), table_->device_name(), options_.table.key_width, options_.table.value_width,
               to_string(table_->config().slot_layout), stats.device.capacity, stats.device.max_items);
  if (options_.shard_count > 1) spdlog::info("shard {} of {}", options_.shard_index, options_.shard_count);
  if (batcher_->batch_size() < options_.batcher.batch_size) {
    spdlog::info("batches of {} operations, not --batch_size={}: at {} B values a batch stages at most {} MiB",
                 batcher_->batch_size(), options_.batcher.batch_size, options_.table.value_width, kMaxStagedBatchBytes >> 20);
  }
}

Server::~Server() { shutdown(std::chrono::seconds(5)); }

std::string Server::backend() const { return to_string(table_->backend()); }

void Server::shutdown(std::chrono::milliseconds grace) {
  if (stopped_) return;
  stopped_ = true;
  spdlog::info("draining");
  set_health(*grpc_, false);
  service_->detach();  // new calls: UNAVAILABLE
  batcher_->drain();   // queued calls run to completion
  grpc_->Shutdown(std::chrono::system_clock::now() + grace);
  grpc_->Wait();
  if (durability_) {
    // After the last call: a restart loads this and nothing of the log (without --wal, the only way the
    // writes since the last scheduled snapshot are kept).
    spdlog::info("taking the shutdown snapshot");
    static_cast<void>(durability_->snapshot());
  }
  spdlog::info("stopped");
}

}  // namespace gpukv::server
