// gpukv-load: a load generator for the gpukv service.
//
//   gpukv-load --target=127.0.0.1:50051 --mode=batch --batch=100 --callers=64 --seconds=10
//     --keys=1000000 --distribution=zipf --get=0.5 --put=0.45
//   gpukv-load --mode=stream --rate=200000 --arrivals=poisson --max_outstanding=4096 ...
//   gpukv-load --targets='gpukv-{0..1}.gpukv-shards.gpukv.svc:50051' --mode=batch --batch=1000 ...
//
// Modes: a unary call per key (unary), a batch call of --batch keys with one op kind per call drawn from
// the mix (batch), or a packed group of --batch mixed ops on a bidirectional stream (stream).
// Without --rate the load is closed-loop: --callers callers each keep one call (stream: --depth groups) in
// flight. With --rate=N it is open-loop: N ops/s arrive (N / --batch calls or groups per second in batch
// and stream modes; Poisson or fixed gaps), latency is measured from each arrival's intended time, at most
// --max_outstanding calls are in flight and arrivals beyond that are dropped and counted (load.hpp).
// --processes=N splits the callers over N processes (one gRPC client each: a single client's callback
// threads can be the limit before the server is), all counting into one set of counters in shared memory.
// With --targets (or GPUKV_TARGETS) the load goes to a cluster through the sharded client: each unary call
// to its key's shard, each batch call and stream group split by shard and merged (gpukv/cluster.hpp); a
// call is counted failed when any of its shards failed it.
// Prints a progress line every second (stderr), then one RESULT line (stdout): rates, the latency
// percentiles of calls (or groups), errors, and for open loop the target, dropped and late arrivals.
#include <absl/flags/flag.h>
#include <absl/flags/parse.h>
#include <absl/flags/usage.h>
#include <absl/synchronization/mutex.h>

#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "load.hpp"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "server address");
ABSL_FLAG(std::string, tls_ca, "", "CA certificate (PEM) to trust; plaintext when empty");
ABSL_FLAG(std::string, tls_cert, "", "this client's certificate (PEM), for a server that asks for one (mutual TLS); with --tls_ca");
ABSL_FLAG(std::string, tls_key, "", "the private key (PEM) of --tls_cert");
ABSL_FLAG(std::string, token_file, "", "file holding the bearer token the server asks for (its --auth_token_file)");
ABSL_FLAG(std::string, targets, "",
          "a cluster's shards in shard order, host:port,... with {a..b} ranges (gpukv-{0..1}.gpukv-shards.gpukv.svc:50051); "
          "default $GPUKV_TARGETS; empty: the one server at --target");
ABSL_FLAG(std::string, mode, "unary", "unary, batch or stream");
ABSL_FLAG(std::uint32_t, batch, 100, "keys per batch call or per stream group");
ABSL_FLAG(std::uint32_t, depth, 4, "closed loop, stream mode: groups in flight per stream");
ABSL_FLAG(std::uint32_t, callers, 16, "concurrent callers, each with its own channel (and stream), over all processes");
ABSL_FLAG(std::uint32_t, processes, 1, "load processes the callers are split over (each its own gRPC client)");
ABSL_FLAG(double, seconds, 10, "run time");
ABSL_FLAG(std::uint64_t, keys, 1000000, "key space");
ABSL_FLAG(std::string, distribution, "uniform", "uniform or zipf");
ABSL_FLAG(std::string, key_format, "text",
          "text (\"key:<n>\") or binary (n's 8 bytes, little-endian: for a server of 8-byte keys, where text "
          "leaves 10^4 keys)");
ABSL_FLAG(double, zipf, 0.99, "zipf exponent");
ABSL_FLAG(std::uint64_t, seed, 0,
          "mixed into every caller's key draws: a run repeats the keys of an earlier run of the same seed, caller by "
          "caller; another seed draws others");
ABSL_FLAG(double, get, 0.5, "share of GETs");
ABSL_FLAG(double, put, 0.45, "share of PUTs (the rest are DELETEs)");
ABSL_FLAG(std::uint32_t, value_size, 8, "value bytes");
ABSL_FLAG(std::uint32_t, timeout_ms, 10000, "deadline of each call (a stream's: the run time plus this)");
ABSL_FLAG(double, rate, 0, "open loop: target ops (keys) per second over all callers; 0: closed loop");
ABSL_FLAG(std::string, arrivals, "poisson", "open loop: poisson or fixed gaps between arrivals");
ABSL_FLAG(std::uint32_t, max_outstanding, 4096, "open loop: calls (or groups) in flight, over all callers");
ABSL_FLAG(std::uint32_t, late_us, 1000, "open loop: an arrival sent later than this is counted late");

namespace {

using gpukv::load::Clock;
using gpukv::load::Mode;

// Reads and checks the flags; returns an error message, or empty.
std::string settings_from_flags(gpukv::load::Settings& s) {
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode == "unary") s.mode = Mode::kUnary;
  else if (mode == "batch") s.mode = Mode::kBatch;
  else if (mode == "stream") s.mode = Mode::kStream;
  else return "--mode must be unary, batch or stream, not '" + mode + "'";
  const std::string distribution = absl::GetFlag(FLAGS_distribution);
  if (distribution != "uniform" && distribution != "zipf") return "--distribution must be uniform or zipf";
  const std::string arrivals = absl::GetFlag(FLAGS_arrivals);
  if (arrivals != "poisson" && arrivals != "fixed") return "--arrivals must be poisson or fixed";
  const std::string key_format = absl::GetFlag(FLAGS_key_format);
  if (key_format != "text" && key_format != "binary") return "--key_format must be text or binary";
  s.client.target = absl::GetFlag(FLAGS_target);
  std::string targets = absl::GetFlag(FLAGS_targets);
  if (targets.empty() && std::getenv("GPUKV_TARGETS") != nullptr) targets = std::getenv("GPUKV_TARGETS");
  if (!targets.empty()) {
    try {
      s.targets = gpukv::client::parse_targets(targets);
    } catch (const std::exception& e) {
      return std::string("--targets: ") + e.what();
    }
  }
  s.client.timeout = std::chrono::milliseconds(absl::GetFlag(FLAGS_timeout_ms));
  s.client.max_attempts = 1;  // measure the server, not the retries
  s.client.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  s.client.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  s.client.tls_key = absl::GetFlag(FLAGS_tls_key);
  if (const std::string file = absl::GetFlag(FLAGS_token_file); !file.empty()) {
    try {
      s.client.auth_token = gpukv::client::read_token_file(file);
    } catch (const std::exception& e) {
      return std::string("--token_file: ") + e.what();
    }
  }
  s.batch = absl::GetFlag(FLAGS_batch);
  s.depth = absl::GetFlag(FLAGS_depth);
  s.callers = absl::GetFlag(FLAGS_callers);
  s.own_callers = s.callers;
  const double seconds = absl::GetFlag(FLAGS_seconds);
  s.duration = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  s.mix.keys = absl::GetFlag(FLAGS_keys);
  s.mix.zipf = distribution == "zipf";
  s.mix.zipf_exponent = absl::GetFlag(FLAGS_zipf);
  s.mix.get = absl::GetFlag(FLAGS_get);
  s.mix.put = absl::GetFlag(FLAGS_put);
  s.mix.binary_keys = key_format == "binary";
  s.mix.seed = absl::GetFlag(FLAGS_seed);
  s.value.assign(absl::GetFlag(FLAGS_value_size), 'v');
  s.rate = absl::GetFlag(FLAGS_rate);
  s.poisson = arrivals == "poisson";
  s.max_outstanding = absl::GetFlag(FLAGS_max_outstanding);
  s.late_after = std::chrono::microseconds(absl::GetFlag(FLAGS_late_us));
  if (s.batch == 0 || s.depth == 0 || s.callers == 0 || s.mix.keys == 0) return "--batch, --depth, --callers and --keys must be at least 1";
  if (!(seconds > 0)) return "--seconds must be positive";
  if (s.mix.get < 0 || s.mix.put < 0 || s.mix.get + s.mix.put > 1) return "--get and --put must be shares adding up to at most 1";
  if (!(s.rate >= 0)) return "--rate must be 0 (closed loop) or a positive rate";
  if (absl::GetFlag(FLAGS_processes) == 0 || absl::GetFlag(FLAGS_processes) > s.callers) return "--processes must be 1..--callers";
  if (s.rate > 0 && s.max_outstanding < s.callers) return "--max_outstanding must be at least --callers (each caller needs one)";
  return {};
}

void progress(const gpukv::load::Settings& s, const gpukv::load::Counters& t, Clock::time_point start, Clock::time_point end) {
  std::uint64_t last_keys = 0;
  for (auto tick = start + std::chrono::seconds(1); tick < end; tick += std::chrono::seconds(1)) {
    std::this_thread::sleep_until(tick);
    const std::uint64_t keys = t.keys.load();
    const double at = std::chrono::duration<double>(tick - start).count();
    if (s.rate > 0) {
      std::fprintf(stderr, "progress %.0fs: %.0f keys/s (target %.0f), p99 %.0f us, outstanding %lld, dropped %llu, late %llu, errors %llu\n",
                   at, static_cast<double>(keys - last_keys), s.rate, t.latency.percentile_us(0.99),
                   static_cast<long long>(t.outstanding.load()), static_cast<unsigned long long>(t.dropped.load()),
                   static_cast<unsigned long long>(t.late.load()), static_cast<unsigned long long>(t.errors.load()));
    } else {
      std::fprintf(stderr, "progress %.0fs: %.0f keys/s, p99 %.0f us, errors %llu\n", at, static_cast<double>(keys - last_keys),
                   t.latency.percentile_us(0.99), static_cast<unsigned long long>(t.errors.load()));
    }
    last_keys = keys;
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("gpukv-load: closed- or open-loop load on a gpukv server");
  absl::ParseCommandLine(argc, argv);
  // As in the server (server/main.cpp): Debian's Abseil keeps a lock-order graph for every absl::Mutex gRPC takes.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  gpukv::load::Settings s;
  if (const std::string error = settings_from_flags(s); !error.empty()) {
    std::fprintf(stderr, "gpukv-load: %s\n", error.c_str());
    return 2;
  }
  const std::uint32_t processes = absl::GetFlag(FLAGS_processes);
  // The counters every process records into: shared memory when there are several. Mapped, and the other
  // processes forked, before anything starts gRPC.
  void* shared = mmap(nullptr, sizeof(gpukv::load::Counters), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) {
    std::perror("gpukv-load: mmap");
    return 2;
  }
  auto* counters = new (shared) gpukv::load::Counters();
  const auto start = Clock::now();  // steady_clock is the system's monotonic clock: one timeline for all processes
  const auto end = start + s.duration;
  // Process p runs callers [p * callers / processes, (p + 1) * callers / processes); this one is process 0.
  std::vector<pid_t> children;
  std::uint32_t process = 0;
  for (std::uint32_t p = 1; p < processes; ++p) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("gpukv-load: fork");
      for (const pid_t child : children) kill(child, SIGTERM);
      for (const pid_t child : children) waitpid(child, nullptr, 0);
      return 2;
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGTERM);  // no load left running if the first process dies
      process = p;
      children.clear();
      break;
    }
    children.push_back(pid);
  }
  const auto caller_at = [&](std::uint64_t p) { return static_cast<std::uint32_t>(p * s.callers / processes); };
  s.first_caller = caller_at(process);
  s.own_callers = caller_at(process + 1) - s.first_caller;
  gpukv::load::Totals totals(*counters);
  std::thread reporter;
  if (process == 0) reporter = std::thread(progress, std::cref(s), std::cref(*counters), start, end);
  int code = 0;
  try {
    if (s.rate > 0) {
      gpukv::load::run_open_loop(s, totals, start, end);
    } else {
      gpukv::load::run_closed_loop(s, totals, end);
    }
  } catch (const std::exception& e) {  // a bad TLS file, say
    std::fprintf(stderr, "gpukv-load: %s\n", e.what());
    code = 2;
  }
  // The run ends when the last process's calls have finished (not when the children have exited).
  const std::int64_t finished = (Clock::now() - start).count();
  for (std::int64_t latest = counters->finished.load(); latest < finished && !counters->finished.compare_exchange_weak(latest, finished);) {
  }
  if (!totals.first_error.empty()) {
    std::fprintf(stderr, "gpukv-load: process %u: first failed call: %s\n", process, totals.first_error.c_str());
  }
  if (process != 0) {  // the first process reports for all
    std::fflush(nullptr);
    std::_Exit(code);
  }
  reporter.join();
  for (const pid_t child : children) {
    int status = 0;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) code = 2;
  }
  if (code == 2) return 2;
  const gpukv::load::Counters& c = *counters;
  const double elapsed = std::chrono::duration<double>(Clock::duration(c.finished.load())).count();
  const double window = std::chrono::duration<double>(s.duration).count();
  const auto u = [](const std::atomic<std::uint64_t>& a) { return static_cast<unsigned long long>(a.load()); };
  const char* mode = s.mode == Mode::kUnary ? "unary" : s.mode == Mode::kBatch ? "batch" : "stream";
  std::printf("RESULT load mode=%s batch=%u callers=%u processes=%u shards=%zu distribution=%s keys_per_s=%.0f calls_per_s=%.0f p50_us=%.0f p99_us=%.0f "
              "p999_us=%.0f errors=%llu full_ops=%llu total_calls=%llu total_keys=%llu",
              mode, s.keys_per_call(), s.callers, processes, std::max<std::size_t>(1, s.targets.size()), s.mix.zipf ? "zipf" : "uniform",
              static_cast<double>(c.keys.load()) / elapsed,
              static_cast<double>(c.calls.load()) / elapsed, c.latency.percentile_us(0.5),
              c.latency.percentile_us(0.99), c.latency.percentile_us(0.999), u(c.errors), u(c.full_ops), u(c.calls), u(c.keys));
  if (s.rate > 0) {
    std::printf(" loop=open arrivals=%s target_keys_per_s=%.0f sent_keys_per_s=%.0f dropped=%llu late=%llu max_outstanding=%u\n",
                s.poisson ? "poisson" : "fixed", s.rate, static_cast<double>(c.sent_keys.load()) / window, u(c.dropped),
                u(c.late), s.max_outstanding);
  } else {
    std::printf(" loop=closed depth=%u\n", s.mode == Mode::kStream ? s.depth : 1);
  }
  if (c.dropped.load() > 0) {
    std::fprintf(stderr, "gpukv-load: %llu arrivals dropped: %u calls were already in flight (--max_outstanding); the server did not keep up with --rate\n",
                 u(c.dropped), s.max_outstanding);
  }
  if (c.late.load() > 0) {
    std::fprintf(stderr, "gpukv-load: %llu arrivals sent more than %lld us after their time (this machine fell behind the schedule; latencies include the delay)\n",
                 u(c.late), static_cast<long long>(std::chrono::duration_cast<std::chrono::microseconds>(s.late_after).count()));
  }
  if (c.errors.load() > 0) std::fprintf(stderr, "gpukv-load: %llu calls failed\n", u(c.errors));
  return c.errors.load() == 0 ? 0 : 1;
}
