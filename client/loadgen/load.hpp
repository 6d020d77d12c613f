// gpukv-load's two ways of driving the server, and what they share: the settings and the running totals
// that the progress line and the final report read.
//
// Closed loop (run_closed_loop): each caller keeps one call (or, on a stream, --depth groups) in flight and
// sends the next when one returns, so the offered load follows the server's speed.
// Open loop (run_open_loop): calls arrive on a schedule at the target rate whatever the server does, and
// latency runs from each call's intended send time, so a stall shows up in the percentiles instead of
// quietly lowering the load (no coordinated omission).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "connection.hpp"
#include "gpukv/client.hpp"
#include "latency.hpp"
#include "workload.hpp"

namespace gpukv::load {

using Clock = std::chrono::steady_clock;

enum class Mode { kUnary, kBatch, kStream };

struct Settings {
  client::ClientOptions client;   // target, per-call timeout; no retries (measure the server)
  std::vector<std::string> targets;  // a cluster's shards (--targets); empty: the one server at client.target
  Mode mode = Mode::kUnary;
  std::uint32_t batch = 100;      // keys per batch call or per stream group
  std::uint32_t depth = 4;        // closed loop, stream mode: groups in flight per stream
  std::uint32_t callers = 16;     // concurrent callers, each with its own channel (and stream)
  // The callers this process runs: ids first_caller .. first_caller + own_callers - 1 of `callers` (several
  // load processes split them). Rates and bounds are per caller, so the processes add up to the settings.
  std::uint32_t first_caller = 0;
  std::uint32_t own_callers = 16;
  Clock::duration duration = std::chrono::seconds(10);
  Mix mix;
  std::string value;              // the value every write carries
  // Open loop only.
  double rate = 0;                // target operations (keys) per second, over all callers; 0: closed loop
  bool poisson = true;            // exponential gaps between arrivals; false: fixed gaps
  std::uint32_t max_outstanding = 4096;  // calls (or groups) in flight over all callers; arrivals beyond it are dropped
  Clock::duration late_after = std::chrono::milliseconds(1);  // an arrival sent later than this is counted late

  std::uint32_t keys_per_call() const { return mode == Mode::kUnary ? 1 : batch; }
};

// What a run counts: lock-free atomics and no pointers, so that it can live in memory shared by several
// load processes (--processes), all recording into the one copy.
struct Counters {
  // Completed calls (a stream group counts as a call).
  std::atomic<std::uint64_t> keys{0}, calls{0}, errors{0};
  std::atomic<std::uint64_t> full_ops{0};      // ops answered RESULT_FULL (table full, or a refused group)
  // Open loop: arrivals sent, dropped at the outstanding bound, and sent late (the sender fell behind).
  std::atomic<std::uint64_t> sent_keys{0}, sent_calls{0}, dropped{0}, late{0};
  std::atomic<std::int64_t> outstanding{0};
  std::atomic<std::int64_t> finished{0};       // when the last process's calls had all finished: Clock ticks from the start
  LatencyHistogram latency;
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "Counters are shared between processes");

// One process's view of a run: the counters (its own, or shared with the other load processes) and the
// first failure it met.
struct Totals {
  explicit Totals(Counters& c) : counts(c) {}

  void record(Clock::time_point from, std::uint64_t call_keys, const grpc::Status& status, std::uint64_t full = 0) {
    counts.latency.record(Clock::now() - from);
    counts.keys.fetch_add(call_keys, std::memory_order_relaxed);
    counts.calls.fetch_add(1, std::memory_order_relaxed);
    counts.full_ops.fetch_add(full, std::memory_order_relaxed);
    if (!status.ok()) error(status);
  }

  // Counts a failed call and keeps the first failure's message for the report.
  void error(const grpc::Status& status) {
    counts.errors.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard lock(mutex);
    if (first_error.empty()) {
      first_error = std::string(client::status_code_name(status.error_code())) + ": " + status.error_message();
    }
  }

  Counters& counts;
  std::mutex mutex;          // guards first_error
  std::string first_error;
};

// Both return once every call they started has finished.
void run_closed_loop(const Settings& settings, Totals& totals, Clock::time_point end);
void run_open_loop(const Settings& settings, Totals& totals, Clock::time_point start, Clock::time_point end);

// Ops answered RESULT_FULL in a packed result column.
inline std::uint64_t count_full(const std::string& results) {
  std::uint64_t n = 0;
  for (char r : results) n += r == static_cast<char>(v1::RESULT_FULL);
  return n;
}

// A call whose status is OK but some of whose ops failed on their shard (RESULT_UNAVAILABLE) or went to
// the wrong one (RESULT_WRONG_SHARD: --targets disagrees with the servers' --shard_count) counts as failed,
// with this status; OK otherwise.
inline grpc::Status failed_ops(const grpc::Status& status, const std::string& results) {
  if (!status.ok()) return status;
  std::uint64_t unavailable = 0, wrong = 0;
  for (char r : results) {
    unavailable += r == static_cast<char>(v1::RESULT_UNAVAILABLE);
    wrong += r == static_cast<char>(v1::RESULT_WRONG_SHARD);
  }
  if (wrong != 0) {
    return {grpc::StatusCode::FAILED_PRECONDITION,
            std::to_string(wrong) + " ops answered WRONG_SHARD: --targets does not match the servers' --shard_count"};
  }
  if (unavailable != 0) return {grpc::StatusCode::UNAVAILABLE, std::to_string(unavailable) + " ops failed on their shard"};
  return status;
}

}  // namespace gpukv::load
