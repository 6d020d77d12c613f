// The server's Prometheus metrics, served by prometheus-cpp on their own address. Names carry the gpukv_
// prefix and their unit; durations are histograms in seconds.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <grpcpp/support/status.h>

#include <array>
#include <atomic>
#include <memory>
#include <string>

#include "batcher/batcher.hpp"

namespace gpukv::server {

class Metrics {
 public:
  // Starts serving /metrics on `address` ("host:port", port 0 picks one); throws if it cannot bind.
  explicit Metrics(const std::string& address);
  ~Metrics();

  int port() const;
  void on_request(const char* method, grpc::StatusCode code);
  void on_wrong_shard(std::size_t keys);
  // A call refused for a limit of the server: "calls" (--max_concurrent_calls) or "streams" (--max_streams).
  void on_limit(const char* limit);
  // The write-ahead log (any thread): bytes appended, a batch it failed, one fdatasync's time; start-up's
  // replay.
  void on_wal_append(std::size_t bytes);
  void on_wal_failure();
  void on_wal_sync(double seconds);
  void on_recovery(double seconds, std::uint64_t writes);
  // Snapshots (any thread): the interval they are taken at (0: none on schedule), set once at start with the
  // time the count towards the next starts from; and each one taken (ok) or failed.
  void on_snapshot_schedule(double interval_seconds);
  void on_snapshot(bool ok, double seconds, std::uint64_t bytes, std::uint64_t items);
  // After each batch: the batch's figures and the table's state after it (report.table), in the order batches
  // are answered, which need not be the order they ran in. on_table: the table's state alone (at start).
  // Called from one thread at a time.
  void on_batch(const BatchReport& report, std::size_t queued_ops);
  void on_table(const TableStats& table, std::size_t queued_ops);

 public:
  static constexpr std::size_t kStatusNames = 10;  // the names status_code_name gives

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& requests_;
  // requests_'s counters, found once per method and status: Family::Add builds a label map and takes the
  // family's lock, and on_request runs for every call.
  static constexpr std::array<const char*, 9> kMethods{"Get", "Put", "Delete", "BatchGet", "BatchPut", "BatchDelete", "Stream", "Stats",
                                                         "Snapshot"};
  std::array<std::array<std::atomic<prometheus::Counter*>, kStatusNames>, kMethods.size()> request_counters_{};
  prometheus::Family<prometheus::Counter>& operations_;
  prometheus::Counter& batches_;
  prometheus::Histogram& batch_size_;
  prometheus::Histogram& queue_delay_;
  prometheus::Histogram& batch_time_;
  prometheus::Histogram& stage_time_;
  prometheus::Histogram& answer_time_;
  // operations_'s counters by [kind][result], added when first seen (so that the scrape lists only the
  // pairs that occurred) and then kept: Family::Add costs a label map and a lock, several times per batch.
  std::array<std::array<prometheus::Counter*, 5>, kOpKindCount> operation_counters_{};
  prometheus::Family<prometheus::Gauge>& items_;
  prometheus::Family<prometheus::Gauge>& capacity_;
  prometheus::Gauge& device_items_;
  prometheus::Gauge& device_capacity_;
  prometheus::Gauge* host_items_ = nullptr;  // added once the table reports a host tier
  prometheus::Gauge* host_capacity_ = nullptr;
  prometheus::Gauge& tombstones_;
  prometheus::Gauge& queued_;
  // Host-tier traffic; the table keeps running totals, the counters grow by the difference.
  prometheus::Family<prometheus::Counter>& host_accesses_;
  prometheus::Counter& host_reads_;
  prometheus::Counter& host_writes_;
  prometheus::Counter& host_avoided_;
  // Passes of PUTs the GPU ran without grouping them by key (TableConfig::optimistic_inserts): kept, or taken
  // back and run again, grouped (a key the pass repeats, or one already present).
  prometheus::Family<prometheus::Counter>& optimistic_passes_;
  prometheus::Counter& optimistic_kept_;
  prometheus::Counter& optimistic_redone_;
  prometheus::Counter& wrong_shard_;
  prometheus::Family<prometheus::Counter>& limit_refusals_;
  prometheus::Counter& refused_calls_;
  prometheus::Counter& refused_streams_;
  prometheus::Counter& wal_bytes_;
  prometheus::Counter& wal_failures_;
  prometheus::Histogram& wal_fsync_;
  prometheus::Gauge& recovery_seconds_;
  prometheus::Gauge& recovery_writes_;
  prometheus::Family<prometheus::Counter>& snapshots_;
  prometheus::Counter& snapshots_ok_;
  prometheus::Counter& snapshots_failed_;
  prometheus::Histogram& snapshot_seconds_;
  prometheus::Gauge& snapshot_bytes_;
  prometheus::Gauge& snapshot_items_;
  prometheus::Gauge& snapshot_last_success_;
  prometheus::Gauge& snapshot_interval_;
  // The table's running totals that counters follow, as high as any report has carried them, and the passes
  // of the report the gauges show. Reports come in the order their batches were answered, which completion
  // threads make other than the order the batches ran in: an older total can follow a newer one, and must add
  // nothing (the difference, unsigned, added 2^64 at a time on an H100 server with four completion threads,
  // run 302).
  struct SeenTotals {
    std::uint64_t batches = 0;
    std::uint64_t host_reads = 0;
    std::uint64_t host_writes = 0;
    std::uint64_t host_avoided = 0;
    std::uint64_t optimistic_kept = 0;
    std::uint64_t optimistic_redone = 0;
  };
  SeenTotals seen_;
  // Adds to `counter` what `total` grew by past `seen`, and raises `seen` to it.
  static void grow(prometheus::Counter& counter, std::uint64_t total, std::uint64_t& seen);
  std::unique_ptr<prometheus::Exposer> exposer_;
};

const char* status_code_name(grpc::StatusCode code);
// The position of status_code_name(code) among the names it gives (0 .. kStatusNames - 1).
std::size_t status_code_index(grpc::StatusCode code);

}  // namespace gpukv::server
