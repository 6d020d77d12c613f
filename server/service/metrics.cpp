#include "metrics.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

namespace gpukv::server {
namespace {

prometheus::Histogram::BucketBoundaries seconds_buckets() {  // 10 us .. ~10 s
  prometheus::Histogram::BucketBoundaries b;
  for (double s = 10e-6; s < 20.0; s *= 2) b.push_back(s);
  return b;
}

prometheus::Histogram::BucketBoundaries ops_buckets() {  // 1 .. 16M operations
  prometheus::Histogram::BucketBoundaries b;
  for (double n = 1; n <= (1 << 24); n *= 2) b.push_back(n);
  return b;
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

std::size_t status_code_index(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return 0;
    case grpc::StatusCode::CANCELLED: return 1;
    case grpc::StatusCode::INVALID_ARGUMENT: return 2;
    case grpc::StatusCode::DEADLINE_EXCEEDED: return 3;
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return 4;
    case grpc::StatusCode::UNAVAILABLE: return 5;
    case grpc::StatusCode::INTERNAL: return 6;
    case grpc::StatusCode::FAILED_PRECONDITION: return 7;  // a unary call of another shard's key
    case grpc::StatusCode::UNAUTHENTICATED: return 8;      // a call without the bearer token
    default: return 9;
  }
}

const char* status_code_name(grpc::StatusCode code) {
  static constexpr const char* kNames[] = {"OK", "CANCELLED", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
                                           "RESOURCE_EXHAUSTED", "UNAVAILABLE", "INTERNAL", "FAILED_PRECONDITION",
                                           "UNAUTHENTICATED", "OTHER"};
  static_assert(std::size(kNames) == Metrics::kStatusNames, "one name per index of status_code_index");
  return kNames[status_code_index(code)];
}

Metrics::Metrics(const std::string& address)
    : registry_(std::make_shared<prometheus::Registry>()),
      requests_(prometheus::BuildCounter()
                    .Name("gpukv_requests_total")
                    .Help("gRPC calls finished, by method and status code")
                    .Register(*registry_)),
      operations_(prometheus::BuildCounter()
                      .Name("gpukv_operations_total")
                      .Help("Table operations executed, by kind and result")
                      .Register(*registry_)),
      batches_(prometheus::BuildCounter().Name("gpukv_batches_total").Help("Device batches executed").Register(*registry_).Add({})),
      batch_size_(prometheus::BuildHistogram()
                      .Name("gpukv_batch_size_ops")
                      .Help("Operations per device batch")
                      .Register(*registry_)
                      .Add({}, ops_buckets())),
      queue_delay_(prometheus::BuildHistogram()
                       .Name("gpukv_queue_delay_seconds")
                       .Help("How long a batch's oldest operation waited in the queue")
                       .Register(*registry_)
                       .Add({}, seconds_buckets())),
      batch_time_(prometheus::BuildHistogram()
                      .Name("gpukv_batch_execution_seconds")
                      .Help("Time to execute one device batch on the table")
                      .Register(*registry_)
                      .Add({}, seconds_buckets())),
      stage_time_(prometheus::BuildHistogram()
                      .Name("gpukv_batch_staging_seconds")
                      .Help("Time spent copying one batch's operations from their calls into its staging buffers, summed over the threads that copied")
                      .Register(*registry_)
                      .Add({}, seconds_buckets())),
      answer_time_(prometheus::BuildHistogram()
                       .Name("gpukv_batch_answer_seconds")
                       .Help("Time from a batch's execution to the last of its calls answered (results written, responses started)")
                       .Register(*registry_)
                       .Add({}, seconds_buckets())),
      items_(prometheus::BuildGauge().Name("gpukv_items").Help("Live keys, by tier").Register(*registry_)),
      capacity_(prometheus::BuildGauge().Name("gpukv_capacity_slots").Help("Slots, by tier").Register(*registry_)),
      device_items_(items_.Add({{"tier", "device"}})),
      device_capacity_(capacity_.Add({{"tier", "device"}})),
      tombstones_(prometheus::BuildGauge().Name("gpukv_tombstones").Help("Deleted slots not yet cleaned").Register(*registry_).Add({})),
      queued_(prometheus::BuildGauge().Name("gpukv_queued_ops").Help("Operations waiting for a batch").Register(*registry_).Add({})),
      host_accesses_(prometheus::BuildCounter()
                         .Name("gpukv_host_tier_accesses_total")
                         .Help("Host-tier slot accesses: read (key comparisons), write (inserts and overwrites), "
                               "avoided (reads the ticket-board's info bits ruled out)")
                         .Register(*registry_)),
      host_reads_(host_accesses_.Add({{"kind", "read"}})),
      host_writes_(host_accesses_.Add({{"kind", "write"}})),
      host_avoided_(host_accesses_.Add({{"kind", "avoided"}})),
      optimistic_passes_(prometheus::BuildCounter()
                             .Name("gpukv_optimistic_passes_total")
                             .Help("Device passes of PUTs run without grouping their keys first (--optimistic_inserts): "
                                   "kept, or redone (a key was already present or repeated: the pass ran again, grouped)")
                             .Register(*registry_)),
      optimistic_kept_(optimistic_passes_.Add({{"outcome", "kept"}})),
      optimistic_redone_(optimistic_passes_.Add({{"outcome", "redone"}})),
      wrong_shard_(prometheus::BuildCounter()
                       .Name("gpukv_wrong_shard_keys_total")
                       .Help("Keys refused because they belong to another shard (a client with a stale or no shard map)")
                       .Register(*registry_)
                       .Add({})),
      limit_refusals_(prometheus::BuildCounter()
                          .Name("gpukv_limit_refusals_total")
                          .Help("Calls refused RESOURCE_EXHAUSTED for a limit of the server: unary calls in flight "
                                "(--max_concurrent_calls), open streams (--max_streams)")
                          .Register(*registry_)),
      refused_calls_(limit_refusals_.Add({{"limit", "calls"}})),
      refused_streams_(limit_refusals_.Add({{"limit", "streams"}})),
      wal_bytes_(prometheus::BuildCounter()
                     .Name("gpukv_wal_bytes_total")
                     .Help("Bytes appended to the write-ahead log (--data_dir with --wal)")
                     .Register(*registry_)
                     .Add({})),
      wal_failures_(prometheus::BuildCounter()
                        .Name("gpukv_wal_failures_total")
                        .Help("Batches whose writes the write-ahead log could not make durable (their write calls failed)")
                        .Register(*registry_)
                        .Add({})),
      wal_fsync_(prometheus::BuildHistogram()
                     .Name("gpukv_wal_fsync_seconds")
                     .Help("Time one fdatasync of the write-ahead log took")
                     .Register(*registry_)
                     .Add({}, seconds_buckets())),
      recovery_seconds_(prometheus::BuildGauge()
                            .Name("gpukv_recovery_seconds")
                            .Help("Time start-up took to replay the data directory into the table (while it runs: so far)")
                            .Register(*registry_)
                            .Add({})),
      recovery_writes_(prometheus::BuildGauge()
                           .Name("gpukv_recovery_writes")
                           .Help("Writes start-up loaded from the snapshot and replayed from the write-ahead log (while it runs: so far)")
                           .Register(*registry_)
                           .Add({})),
      snapshots_(prometheus::BuildCounter()
                     .Name("gpukv_snapshots_total")
                     .Help("Snapshots of the table written to the data directory, by result (ok, failed)")
                     .Register(*registry_)),
      snapshots_ok_(snapshots_.Add({{"result", "ok"}})),
      snapshots_failed_(snapshots_.Add({{"result", "failed"}})),
      snapshot_seconds_(prometheus::BuildHistogram()
                            .Name("gpukv_snapshot_seconds")
                            .Help("Time one snapshot took, from its log segment to its file made durable")
                            .Register(*registry_)
                            .Add({}, prometheus::Histogram::BucketBoundaries{0.01, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600})),
      snapshot_bytes_(prometheus::BuildGauge()
                          .Name("gpukv_snapshot_bytes")
                          .Help("Size of the newest snapshot written")
                          .Register(*registry_)
                          .Add({})),
      snapshot_items_(prometheus::BuildGauge()
                          .Name("gpukv_snapshot_items")
                          .Help("Items in the newest snapshot written")
                          .Register(*registry_)
                          .Add({})),
      snapshot_last_success_(prometheus::BuildGauge()
                                 .Name("gpukv_snapshot_last_success_timestamp_seconds")
                                 .Help("Unix time of the newest snapshot written (before the first: when the server started)")
                                 .Register(*registry_)
                                 .Add({})),
      snapshot_interval_(prometheus::BuildGauge()
                             .Name("gpukv_snapshot_interval_seconds")
                             .Help("How often snapshots are taken (--snapshot_interval; 0: not on a schedule)")
                             .Register(*registry_)
                             .Add({})),
      exposer_(std::make_unique<prometheus::Exposer>(address)) {
  exposer_->RegisterCollectable(registry_);
}

Metrics::~Metrics() {
  // The exposer's web server (civetweb) sees that it is asked to stop only when its accept loop's poll
  // returns, which it does every 2 seconds or when a connection arrives: without a knock on its port, every
  // server would take up to 2 s to stop. A thread connects and hangs up until the exposer is gone.
  const int port = this->port();
  std::atomic<bool> gone{false};
  std::thread knocker([&] {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    while (!gone.load()) {
      const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd >= 0) {
        (void)connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
        close(fd);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  exposer_.reset();
  gone.store(true);
  knocker.join();
}

int Metrics::port() const {
  const auto ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

void Metrics::on_request(const char* method, grpc::StatusCode code) {
  const std::size_t m = static_cast<std::size_t>(
      std::find_if(kMethods.begin(), kMethods.end(), [&](const char* name) { return std::strcmp(name, method) == 0; }) - kMethods.begin());
  if (m == kMethods.size()) {  // not a method of the service: look it up each time
    requests_.Add({{"method", method}, {"code", status_code_name(code)}}).Increment();
    return;
  }
  std::atomic<prometheus::Counter*>& slot = request_counters_[m][status_code_index(code)];
  prometheus::Counter* counter = slot.load(std::memory_order_acquire);
  if (counter == nullptr) {  // two threads may both look it up: Add gives both the same counter
    counter = &requests_.Add({{"method", method}, {"code", status_code_name(code)}});
    slot.store(counter, std::memory_order_release);
  }
  counter->Increment();
}

void Metrics::on_wrong_shard(std::size_t keys) { wrong_shard_.Increment(static_cast<double>(keys)); }

void Metrics::on_limit(const char* limit) {
  (std::string_view(limit) == "streams" ? refused_streams_ : refused_calls_).Increment();
}
void Metrics::on_wal_append(std::size_t bytes) { wal_bytes_.Increment(static_cast<double>(bytes)); }
void Metrics::on_wal_failure() { wal_failures_.Increment(); }
void Metrics::on_wal_sync(double seconds) { wal_fsync_.Observe(seconds); }
void Metrics::on_recovery(double seconds, std::uint64_t writes) {
  recovery_seconds_.Set(seconds);
  recovery_writes_.Set(static_cast<double>(writes));
}

void Metrics::on_snapshot_schedule(double interval_seconds) {
  snapshot_interval_.Set(interval_seconds);
  snapshot_last_success_.SetToCurrentTime();
}

void Metrics::on_snapshot(bool ok, double seconds, std::uint64_t bytes, std::uint64_t items) {
  snapshot_seconds_.Observe(seconds);
  if (!ok) {
    snapshots_failed_.Increment();
    return;
  }
  snapshots_ok_.Increment();
  snapshot_bytes_.Set(static_cast<double>(bytes));
  snapshot_items_.Set(static_cast<double>(items));
  snapshot_last_success_.SetToCurrentTime();
}

void Metrics::on_batch(const BatchReport& report, std::size_t queued_ops) {
  batches_.Increment();
  batch_size_.Observe(static_cast<double>(report.ops));
  queue_delay_.Observe(seconds(report.queue_delay));
  batch_time_.Observe(seconds(report.execute_time));
  stage_time_.Observe(seconds(report.stage_time));
  answer_time_.Observe(seconds(report.answer_time));
  for (std::size_t kind = 0; kind < report.results.size(); ++kind) {
    for (std::size_t result = 0; result < report.results[kind].size(); ++result) {
      const std::uint64_t n = report.results[kind][result];
      if (n == 0) continue;
      prometheus::Counter*& counter = operation_counters_[kind][result];
      if (counter == nullptr) {
        counter = &operations_.Add(
            {{"kind", to_string(static_cast<OpKind>(kind))}, {"result", to_string(static_cast<OpStatus>(result))}});
      }
      counter->Increment(static_cast<double>(n));
    }
  }
  on_table(report.table, queued_ops);
}

void Metrics::grow(prometheus::Counter& counter, std::uint64_t total, std::uint64_t& seen) {
  if (total <= seen) return;
  counter.Increment(static_cast<double>(total - seen));
  seen = total;
}

void Metrics::on_table(const TableStats& table, std::size_t queued_ops) {
  queued_.Set(static_cast<double>(queued_ops));
  grow(host_reads_, table.host_reads, seen_.host_reads);
  grow(host_writes_, table.host_writes, seen_.host_writes);
  grow(host_avoided_, table.host_avoided, seen_.host_avoided);
  grow(optimistic_kept_, table.optimistic_passes - table.optimistic_failures, seen_.optimistic_kept);
  grow(optimistic_redone_, table.optimistic_failures, seen_.optimistic_redone);
  // The gauges take the state of the latest batch to run (the most passes), not of the latest answered.
  if (table.batches < seen_.batches) return;
  seen_.batches = table.batches;
  device_items_.Set(static_cast<double>(table.device.items));
  device_capacity_.Set(static_cast<double>(table.device.capacity));
  if (table.host.capacity != 0) {
    if (host_items_ == nullptr) {
      host_items_ = &items_.Add({{"tier", "host"}});
      host_capacity_ = &capacity_.Add({{"tier", "host"}});
    }
    host_items_->Set(static_cast<double>(table.host.items));
    host_capacity_->Set(static_cast<double>(table.host.capacity));
  }
  tombstones_.Set(static_cast<double>(table.device.tombstones + table.host.tombstones));
}

}  // namespace gpukv::server
