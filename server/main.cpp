// gpukv-server: the gpukv gRPC service. Every flag can also be set through the environment as GPUKV_<FLAG>
// (for example GPUKV_CAPACITY=1000000); a flag given on the command line wins over the environment.
// SIGTERM or SIGINT drains the server: health turns NOT_SERVING, queued calls finish, a last snapshot is
// taken (with --data_dir), then it exits.
#include <absl/flags/flag.h>
#include <absl/flags/parse.h>
#include <absl/flags/reflection.h>
#include <absl/flags/usage.h>
#include <absl/strings/match.h>
#include <absl/synchronization/mutex.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <vector>
#include <cstdio>
#include <cctype>
#include <csignal>
#include <cstdlib>
#include <string>
#include <thread>

#include "service/option_checks.hpp"
#include "service/server.hpp"
#include "service/shard_index.hpp"

ABSL_FLAG(std::string, listen, "0.0.0.0:50051", "gRPC address (host:port; port 0 picks a free port)");
ABSL_FLAG(std::string, metrics_listen, "0.0.0.0:9464", "Prometheus metrics address (host:port)");
ABSL_FLAG(std::string, backend, "auto", "table backend: auto (GPU if present), gpu or cpu");
ABSL_FLAG(std::uint64_t, capacity, 1 << 24, "device-tier slots (GPU memory; host memory on the CPU backend)");
ABSL_FLAG(std::uint64_t, host_capacity, 0,
          "host-tier slots in pinned host memory, used once the device tier is full (0: no host tier)");
ABSL_FLAG(std::uint32_t, key_width, 16, "largest key, bytes: 8, 16 or 32");
ABSL_FLAG(std::uint32_t, value_width, 128, "largest value, bytes: 8 to 65536");
ABSL_FLAG(std::uint32_t, ticket_bits, 8, "ticket size on the ticket-board: 2, 4 or 8");
ABSL_FLAG(std::string, slot_layout, "auto",
          "where the device tier keeps its tickets: board (apart from the slots), line (each probe unit one "
          "128-byte line of tickets, lengths and slots; needs key_width + value_width <= 32) or auto (line on a "
          "GPU where a line holds 7 slots: key_width 8, value_width 8; else board)");
ABSL_FLAG(std::string, optimistic_inserts, "auto",
          "GPU passes of PUTs run without grouping their keys first, where the device tier is a line of 8- or "
          "16-byte keys and values of up to 16 bytes with no host tier: auto (after a pass that inserted only new keys), "
          "off, or always (a pass that meets a key already present is undone and run again, grouped)");
ABSL_FLAG(double, max_load_factor, 0.95, "live keys / slots beyond which new keys are refused");
ABSL_FLAG(double, cleanup_headroom, 0.5,
          "share of a full tier's EMPTY headroom its tombstones may take before it is cleaned (higher: fewer "
          "clean-ups under heavy churn, longer lookups of absent keys in between)");
ABSL_FLAG(std::uint32_t, batch_size, 65536, "operations per device batch");
ABSL_FLAG(std::uint32_t, max_queue_delay, 200, "microseconds an operation may wait for its batch to fill");
ABSL_FLAG(std::uint64_t, max_queued_ops, 1 << 22, "operations queued beyond which calls get RESOURCE_EXHAUSTED");
ABSL_FLAG(std::uint32_t, cpu_threads, 0, "CPU backend worker threads (0: one per core)");
ABSL_FLAG(int, completion_threads, -1,
          "threads that answer an executed batch (write results into its calls, serialise and send responses) "
          "while the next batch runs; 0: the execution thread answers each batch before the next; -1: a "
          "quarter of the cores, at most 4, and 0 below 8 cores");
ABSL_FLAG(bool, launch_when_idle, false,
          "launch a batch at once, however small, whenever the table has none running or staged (otherwise a "
          "partial batch waits out --max_queue_delay)");
ABSL_FLAG(std::string, tls_cert, "", "TLS certificate (PEM); plaintext when empty");
ABSL_FLAG(std::string, tls_key, "", "TLS private key (PEM)");
ABSL_FLAG(std::string, tls_client_ca, "",
          "mutual TLS: CA certificate (PEM) that client certificates must be signed by; clients without one fail the "
          "handshake (needs --tls_cert); empty: no client certificate asked");
ABSL_FLAG(std::string, auth_token_file, "",
          "file holding a bearer token (16 to 4096 visible ASCII characters) that every KeyValue call must carry as "
          "metadata 'authorization: Bearer <token>', or be answered UNAUTHENTICATED; health checks and reflection "
          "stay open; empty: no token asked");
ABSL_FLAG(std::uint64_t, max_message_bytes, 64 << 20,
          "the largest request or response (bytes, 1 MiB to 1 GiB); a larger request is refused RESOURCE_EXHAUSTED by "
          "gRPC, a read whose values could not fit a response is refused before it runs");
ABSL_FLAG(std::uint64_t, max_concurrent_calls, 16384,
          "unary calls in flight (read and not yet answered) beyond which new ones are refused RESOURCE_EXHAUSTED");
ABSL_FLAG(std::uint64_t, max_streams, 1024, "Stream calls open at once beyond which new ones are refused RESOURCE_EXHAUSTED");
ABSL_FLAG(std::uint64_t, max_calls_per_connection, 1024,
          "calls (HTTP/2 streams) one connection may have open at once; a client's further calls wait for one to end");
ABSL_FLAG(std::uint32_t, max_connection_idle_s, 3600,
          "seconds a connection without calls is kept before the server closes it (the client reconnects on its next "
          "call); 0: kept until the client closes it");
ABSL_FLAG(std::uint32_t, shutdown_grace_ms, 10000, "on shutdown, how long calls in flight may still run");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error or off");
ABSL_FLAG(std::string, data_dir, "",
          "directory that keeps the table across restarts (its snapshots and write-ahead log); empty: nothing is kept");
ABSL_FLAG(std::string, wal, "off",
          "write-ahead log with --data_dir: batch (each write durable before it is acknowledged; the batches waiting "
          "share one fdatasync), everysec (fdatasync once a second: a machine crash loses up to a second) or off "
          "(snapshots only: a kill loses the writes since the newest one)");
ABSL_FLAG(std::uint32_t, snapshot_interval, 3600,
          "seconds between snapshots of the table with --data_dir (0: only on request and at shutdown); a snapshot "
          "bounds the log a restart replays");
ABSL_FLAG(bool, recover_skip_corrupt, false,
          "at start-up, pass over damaged log records (losing their writes) instead of refusing to start");
ABSL_FLAG(std::uint32_t, shard_count, 1,
          "cluster mode: the number of shards (servers) the keys are spread over; 1: not sharded");
ABSL_FLAG(std::string, shard_index, "0",
          "cluster mode: this server's shard, 0 .. shard_count - 1, or 'auto' for the ordinal of a StatefulSet pod "
          "(the number its host name ends in, as in gpukv-3); keys of other shards are refused");

namespace {

// The environment variable that sets a flag: GPUKV_ and the flag's name in capitals.
std::string environment_name(absl::string_view flag) {
  std::string var = "GPUKV_";
  for (char c : flag) var += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return var;
}

// GPUKV_<NAME> for every flag, applied before the command line so that explicit flags win.
void apply_environment() {
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    const std::string var = environment_name(name);
    const char* value = std::getenv(var.c_str());
    if (value == nullptr) continue;
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      spdlog::critical("{}={}: {}", var, value, error);
      std::exit(2);
    }
  }
}

// --help: every flag of the server (those defined in this file; --helpfull adds gRPC's and Abseil's), with its
// default and the variable that sets it, in name order.
void print_help() {
  std::vector<absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::EndsWith(flag->Filename(), "server/main.cpp")) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(), [](auto* a, auto* b) { return a->Name() < b->Name(); });
  std::printf("gpukv-server: a key-value service whose table lives on a GPU\n\n"
              "Every flag can also be set by the environment variable beside it; the command line wins.\n\n");
  for (const absl::CommandLineFlag* flag : flags) {
    std::printf("  --%s=%s    [%s]\n      %s\n", std::string(flag->Name()).c_str(), flag->DefaultValue().c_str(),
                environment_name(flag->Name()).c_str(), flag->Help().c_str());
  }
}

// The value among `choices` whose name (the table library's to_string) is `value`, given for --`flag`; any
// other value stops the server with a message naming the choices in the order given.
template <class E>
E parse_choice(const char* flag, const std::string& value, std::initializer_list<E> choices) {
  std::string names;
  std::size_t i = 0;
  for (const E choice : choices) {
    if (value == gpukv::to_string(choice)) return choice;
    names += i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ";
    names += gpukv::to_string(choice);
    ++i;
  }
  spdlog::critical("--{} must be {}, got '{}'", flag, names, value);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("gpukv-server: a key-value service whose table lives on a GPU");
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      print_help();
      return 0;
    }
  }
  apply_environment();
  absl::ParseCommandLine(argc, argv);
  spdlog::set_level(spdlog::level::from_str(absl::GetFlag(FLAGS_log_level)));
  // Debian builds Abseil without NDEBUG, which leaves absl::Mutex's lock-order graph on; gRPC takes absl
  // mutexes on every call, and keeping the graph cost about 7% of the server's CPU at 20 K unary calls/s.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // A write past a file size limit fails with EFBIG (the log reports it) instead of killing the server.
  std::signal(SIGXFSZ, SIG_IGN);

  // Signals are taken synchronously by this thread: block them before any other thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  gpukv::server::ServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.table.backend = parse_choice("backend", absl::GetFlag(FLAGS_backend),
                                       {gpukv::BackendKind::kAuto, gpukv::BackendKind::kGpu, gpukv::BackendKind::kCpu});
  options.table.capacity = absl::GetFlag(FLAGS_capacity);
  options.table.host_capacity = absl::GetFlag(FLAGS_host_capacity);
  options.table.key_width = absl::GetFlag(FLAGS_key_width);
  options.table.value_width = absl::GetFlag(FLAGS_value_width);
  options.table.ticket_bits = absl::GetFlag(FLAGS_ticket_bits);
  options.table.slot_layout = parse_choice("slot_layout", absl::GetFlag(FLAGS_slot_layout),
                                           {gpukv::SlotLayout::kBoard, gpukv::SlotLayout::kLine, gpukv::SlotLayout::kAuto});
  options.table.optimistic_inserts = parse_choice(
      "optimistic_inserts", absl::GetFlag(FLAGS_optimistic_inserts),
      {gpukv::OptimisticInserts::kAuto, gpukv::OptimisticInserts::kOff, gpukv::OptimisticInserts::kAlways});
  options.table.max_load_factor = absl::GetFlag(FLAGS_max_load_factor);
  options.table.cleanup_headroom = absl::GetFlag(FLAGS_cleanup_headroom);
  options.table.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  options.batcher.batch_size = absl::GetFlag(FLAGS_batch_size);
  options.table.max_batch = std::max<std::uint32_t>(options.table.max_batch, options.batcher.batch_size);
  options.batcher.max_delay = std::chrono::microseconds(absl::GetFlag(FLAGS_max_queue_delay));
  options.batcher.max_queued_ops = absl::GetFlag(FLAGS_max_queued_ops);
  if (const int threads = absl::GetFlag(FLAGS_completion_threads); threads >= 0) {
    options.batcher.completion_threads = static_cast<unsigned>(threads);
  } else {  // on a small machine a hand-off per batch costs more than it frees
    const unsigned cores = std::thread::hardware_concurrency();
    options.batcher.completion_threads = cores >= 8 ? std::min(4u, cores / 4) : 0;
  }
  options.batcher.launch_when_idle = absl::GetFlag(FLAGS_launch_when_idle);
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  options.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  options.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  options.limits.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.limits.max_calls = absl::GetFlag(FLAGS_max_concurrent_calls);
  options.limits.max_streams = absl::GetFlag(FLAGS_max_streams);
  options.limits.max_calls_per_connection = absl::GetFlag(FLAGS_max_calls_per_connection);
  options.limits.max_connection_idle = std::chrono::seconds(absl::GetFlag(FLAGS_max_connection_idle_s));

  try {
    options.shard_count = absl::GetFlag(FLAGS_shard_count);
    options.shard_index = gpukv::server::parse_shard_index(absl::GetFlag(FLAGS_shard_index), gpukv::server::host_name());
    options.durability.data_dir = absl::GetFlag(FLAGS_data_dir);
    options.durability.wal = gpukv::server::persistence::parse_wal_mode(absl::GetFlag(FLAGS_wal));
    options.durability.recover_skip_corrupt = absl::GetFlag(FLAGS_recover_skip_corrupt);
    options.durability.snapshot_interval = std::chrono::seconds(absl::GetFlag(FLAGS_snapshot_interval));
    // Every setting, before any port opens or any thread starts.
    if (const std::string error = gpukv::server::check_options(options); !error.empty()) {
      spdlog::critical("{}", error);
      return 2;
    }
    if (options.durability.data_dir.empty() && options.durability.wal != gpukv::server::persistence::WalMode::kOff) {
      throw std::invalid_argument("--wal needs --data_dir, the directory the log is written to");
    }
    gpukv::server::Server server(options);
    std::printf("gpukv-server listening on port %d, metrics on port %d, backend %s\n", server.port(), server.metrics_port(),
                server.backend().c_str());
    std::fflush(stdout);
    int signal = 0;
    sigwait(&signals, &signal);
    spdlog::info("signal {}: shutting down", signal);
    server.shutdown(std::chrono::milliseconds(absl::GetFlag(FLAGS_shutdown_grace_ms)));
  } catch (const std::exception& e) {
    spdlog::critical("{}", e.what());
    return 1;
  }
  return 0;
}
