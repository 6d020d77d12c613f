#include "option_checks.hpp"

#include <algorithm>
#include <filesystem>
#include <stdexcept>
#include <thread>

#include "bearer_token.hpp"

namespace gpukv::server {
namespace {

std::string bound(const char* flag, const std::string& bounds, const std::string& got) {
  return std::string("--") + flag + " must be " + bounds + ", got " + got;
}

}  // namespace

std::string check_options(const ServerOptions& o) {
  try {
    Table::check(o.table);
  } catch (const Error& e) {
    return e.what();
  }
  // Each worker is a thread: past a few per core they add nothing but contention, and a hundred thousand of
  // them exhausted the host's process limit for every other program.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const unsigned max_threads = std::min(1024u, 4 * cores);
  if (o.table.cpu_threads > max_threads) {
    return bound("cpu_threads", "0 (one per core) to " + std::to_string(max_threads) + " (four per core here)",
                 std::to_string(o.table.cpu_threads));
  }
  if (o.batcher.batch_size < 1 || o.batcher.batch_size > (1u << 24) - 1) {
    return bound("batch_size", "1 to 16777215 operations", std::to_string(o.batcher.batch_size));
  }
  // A call with more operations than the queue holds is refused: a queue shorter than one batch refuses the
  // calls a batch is made for (0 refused every call).
  if (o.batcher.max_queued_ops < o.batcher.batch_size) {
    return bound("max_queued_ops", "at least --batch_size (" + std::to_string(o.batcher.batch_size) + ")",
                 std::to_string(o.batcher.max_queued_ops));
  }
  if (o.batcher.max_delay > std::chrono::seconds(1)) {
    return bound("max_queue_delay", "at most 1000000 microseconds",
                 std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(o.batcher.max_delay).count()));
  }
  if (o.batcher.completion_threads > 256) {
    return bound("completion_threads", "-1 (by the core count) to 256", std::to_string(o.batcher.completion_threads));
  }
  if (o.limits.max_message_bytes < (1u << 20) || o.limits.max_message_bytes > (1u << 30)) {
    return bound("max_message_bytes", "1048576 (1 MiB) to 1073741824 (1 GiB)", std::to_string(o.limits.max_message_bytes));
  }
  if (o.limits.max_calls < 1 || o.limits.max_calls > 1000000) {
    return bound("max_concurrent_calls", "1 to 1000000", std::to_string(o.limits.max_calls));
  }
  if (o.limits.max_streams < 1 || o.limits.max_streams > 100000) {
    return bound("max_streams", "1 to 100000", std::to_string(o.limits.max_streams));
  }
  if (o.limits.max_calls_per_connection < 1 || o.limits.max_calls_per_connection > 100000) {
    return bound("max_calls_per_connection", "1 to 100000", std::to_string(o.limits.max_calls_per_connection));
  }
  if (o.limits.max_connection_idle > std::chrono::hours(24 * 24)) {  // gRPC takes milliseconds in an int
    return bound("max_connection_idle_s", "0 to 2073600 (24 days)", std::to_string(o.limits.max_connection_idle.count()));
  }
  if (o.shard_count < 1 || o.shard_index >= o.shard_count) {
    return "--shard_index must be below --shard_count (" + std::to_string(o.shard_count) + "), got " +
           std::to_string(o.shard_index);
  }
  if (o.tls_cert.empty() != o.tls_key.empty()) return "--tls_cert and --tls_key go together: give both, or neither for plaintext";
  if (!o.tls_client_ca.empty() && o.tls_cert.empty()) {
    return "--tls_client_ca asks clients for certificates during the TLS handshake: it needs --tls_cert and --tls_key";
  }
  for (const std::string& file : {o.tls_cert, o.tls_key, o.tls_client_ca}) {
    std::error_code ec;
    if (!file.empty() && !std::filesystem::is_regular_file(file, ec)) return "cannot read the TLS file " + file;
  }
  if (!o.auth_token_file.empty()) {
    try {
      static_cast<void>(BearerToken::from_file(o.auth_token_file));
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
  }
  return {};
}

}  // namespace gpukv::server
