// The write-ahead log's own costs, apart from gRPC: per batch of PUTs (all successful), the time to encode
// its record, to append it (write), to fdatasync it, and a start-up's replay of the log into a table.
// Prints RESULT lines. Usage: wal_bench [--dir=/tmp/gpukv-wal-bench] [--rows=65536] [--batches=200]
//   [--backend=cpu|gpu] (the table the replay runs on)
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "gpukv/table.hpp"
#include "persistence/batch_record.hpp"
#include "persistence/durability.hpp"
#include "persistence/log_file.hpp"

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

int main(int argc, char** argv) {
  const gpukv::bench::Flags flags(argc, argv);
  using namespace gpukv;
  using namespace gpukv::server::persistence;
  const std::filesystem::path dir = flags.str("dir", "/tmp/gpukv-wal-bench");
  const std::size_t rows = std::stoul(flags.str("rows", "65536"));
  const int batches = std::stoi(flags.str("batches", "200"));
  const std::string backend = flags.str("backend", "cpu");
  constexpr std::uint32_t kKeyWidth = 16, kValueWidth = 8, kStride = 8;

  // One batch of PUTs of distinct 16-byte keys and 8-byte values, all OK; each round renames its keys.
  std::vector<std::uint8_t> ops(rows, static_cast<std::uint8_t>(OpKind::kPut)), key_lens(rows, kKeyWidth), status(rows, 0);
  std::vector<std::uint8_t> keys(rows * kKeyWidth), values(rows * kStride);
  std::vector<std::uint32_t> value_lens(rows, kValueWidth);
  std::mt19937_64 rng(1);
  for (auto& b : values) b = static_cast<std::uint8_t>(rng());
  const BatchIn in{rows, ops.data(), keys.data(), key_lens.data(), values.data(), value_lens.data()};

  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  double encode_s = 0, append_s = 0, sync_s = 0;
  std::size_t bytes = 0;
  {
    LogWriter writer(dir, LogShape{kKeyWidth, kValueWidth}, 1, SyncPolicy::kEveryBatch);
    writer.on_sync([&](double s) { sync_s += s; });
    std::string payload;
    for (int b = 0; b < batches; ++b) {
      for (std::size_t i = 0; i < rows; ++i) {
        const std::uint64_t k = static_cast<std::uint64_t>(b) * rows + i;
        std::memcpy(&keys[i * kKeyWidth], &k, 8);
      }
      auto t = Clock::now();
      payload.clear();
      encode_writes(in, status.data(), kKeyWidth, kStride, payload);
      encode_s += seconds_since(t);
      t = Clock::now();
      if (const std::string e = writer.append(payload); !e.empty()) {
        std::fprintf(stderr, "append: %s\n", e.c_str());
        return 1;
      }
      append_s += seconds_since(t);
      bytes += payload.size();
    }
  }
  const double writes = static_cast<double>(rows) * batches;
  std::printf("RESULT wal_append rows=%zu batches=%d bytes=%zu encode_ns_per_write=%.1f encode_GB_per_s=%.2f "
              "write_GB_per_s=%.2f fdatasync_ms_per_batch=%.3f append_total_writes_per_s=%.0f\n",
              rows, batches, bytes, 1e9 * encode_s / writes, bytes / encode_s / 1e9, bytes / (append_s - sync_s) / 1e9,
              1e3 * sync_s / batches, writes / (encode_s + append_s));

  TableConfig config;
  config.backend = backend == "gpu" ? BackendKind::kGpu : BackendKind::kCpu;
  config.capacity = static_cast<std::uint64_t>(writes / 0.8);
  config.key_width = kKeyWidth;
  config.value_width = kValueWidth;
  config.max_batch = std::max<std::size_t>(rows, 65536);
  Table table(config);
  const auto t = Clock::now();
  Durability durability(DurabilityOptions{dir, WalMode::kOff, false}, table, {});
  const double replay_s = seconds_since(t);
  std::printf("RESULT wal_replay backend=%s writes=%llu records=%llu GB=%.3f seconds=%.3f writes_per_s=%.0f GB_per_s=%.2f items=%llu\n",
              to_string(table.backend()), static_cast<unsigned long long>(durability.recovery().writes),
              static_cast<unsigned long long>(durability.recovery().log.records), durability.recovery().log.bytes / 1e9, replay_s,
              durability.recovery().writes / replay_s, durability.recovery().log.bytes / 1e9 / replay_s,
              static_cast<unsigned long long>(table.stats().device.items));
  std::filesystem::remove_all(dir);
  return 0;
}
