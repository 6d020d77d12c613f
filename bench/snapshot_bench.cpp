// Snapshot and load of a full table, in process: fills a table with N items (random 16-byte keys, full-width
// values), takes a snapshot through Durability (--wal=off), drops the file from the page cache, then starts a
// second table on the directory and times its load. While the snapshot runs, a thread keeps executing GET
// batches on the table: their rate beside the rate before the snapshot is what serving pays for it.
// Prints RESULT lines; the disk's own sequential rates come from dd in the same run (bench/device/snapshot_gpu.sh).
// Usage: snapshot_bench [--dir=/tmp/gpukv-snapshot-bench] [--items=100000000] [--value_width=128]
//   [--backend=gpu|cpu] [--load=0.9 (items / capacity)] [--keep=1 (leave the snapshot in --dir)]
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.hpp"
#include "gpukv/batch.hpp"
#include "gpukv/table.hpp"
#include "persistence/durability.hpp"

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::uint64_t mix(std::uint64_t x) {  // splitmix64: item i's key words
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A batch of up to `capacity` ops on items [first, first + rows): PUTs with full-width values, or GETs.
struct ItemOps {
  ItemOps(gpukv::Table& table, std::size_t capacity) : batch(table, capacity), rows(capacity) {}
  void fill(std::uint64_t first, gpukv::OpKind kind, std::uint32_t value_width) {
    const std::uint32_t stride = batch.value_stride();
    for (std::size_t i = 0; i < rows; ++i) {
      auto* k = reinterpret_cast<std::uint64_t*>(batch.keys() + i * 16);
      k[0] = mix(first + i);
      k[1] = mix(~(first + i));
      batch.ops()[i] = static_cast<std::uint8_t>(kind);
      batch.key_lens()[i] = 16;
      batch.value_lens()[i] = value_width;
      std::memset(batch.values() + i * stride, static_cast<int>((first + i) & 0xFF), value_width);
    }
  }
  gpukv::BatchIn in() const { return batch.in(0, rows); }
  gpukv::BatchOut out() const { return batch.out(0, rows); }
  std::uint8_t status(std::size_t i) const { return batch.statuses()[i]; }
  gpukv::Batch batch;
  std::size_t rows;
};

}  // namespace

int main(int argc, char** argv) {
  const gpukv::bench::Flags flags(argc, argv);
  using namespace gpukv;
  using namespace gpukv::server::persistence;
  const std::filesystem::path dir = flags.str("dir", "/tmp/gpukv-snapshot-bench");
  const std::uint64_t items = std::stoull(flags.str("items", "100000000"));
  const std::uint32_t value_width = static_cast<std::uint32_t>(std::stoul(flags.str("value_width", "128")));
  const std::string backend = flags.str("backend", "gpu");
  const double load = std::stod(flags.str("load", "0.9"));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);

  TableConfig config;
  config.backend = backend == "gpu" ? BackendKind::kGpu : BackendKind::kCpu;
  config.key_width = 16;
  config.value_width = value_width;
  config.capacity = static_cast<std::uint64_t>(static_cast<double>(items) / load);
  config.max_load_factor = 0.95;
  constexpr std::size_t kRows = 1 << 20;
  config.max_batch = kRows;
  auto table = std::make_unique<Table>(config);
  std::printf("device %s, %llu items, key 16 B, value %u B, capacity %llu slots\n", table->device_name().c_str(),
              static_cast<unsigned long long>(items), value_width, static_cast<unsigned long long>(config.capacity));
  auto fill_start = Clock::now();
  {
    ItemOps b(*table, kRows);
    for (std::uint64_t first = 0; first < items; first += kRows) {
      b.rows = static_cast<std::size_t>(std::min<std::uint64_t>(kRows, items - first));
      b.fill(first, OpKind::kPut, value_width);
      table->execute(b.in(), b.out());
      for (std::size_t i = 0; i < b.rows; ++i) {
        if (b.status(i) != 0) {
          std::fprintf(stderr, "fill: item %llu status %d\n", static_cast<unsigned long long>(first + i), b.status(i));
          return 1;
        }
      }
    }
  }
  std::printf("filled in %.1f s\n", seconds_since(fill_start));

  // GET batches of 10000 on one thread: before the snapshot, then while it runs.
  std::atomic<bool> snapshotting{false}, stop{false};
  std::atomic<std::uint64_t> gets_before{0}, gets_during{0};
  double before_seconds = 0, during_seconds = 0;
  std::thread reader([&] {
    ItemOps b(*table, 10000);
    std::uint64_t first = 0;
    const auto start = Clock::now();
    while (!snapshotting) {
      b.fill(first % items, OpKind::kGet, value_width);
      table->execute(b.in(), b.out());
      gets_before += b.rows;
      first += b.rows;
      if (seconds_since(start) > 3) break;
    }
    before_seconds = seconds_since(start);
    while (!snapshotting && !stop) std::this_thread::yield();
    const auto during = Clock::now();
    while (!stop) {
      b.fill(first % items, OpKind::kGet, value_width);
      table->execute(b.in(), b.out());
      gets_during += b.rows;
      first += b.rows;
    }
    during_seconds = seconds_since(during);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(3200));

  SnapshotResult snap;
  {
    Durability durability(DurabilityOptions{dir, WalMode::kOff, false}, *table, {});
    snapshotting = true;
    snap = durability.snapshot();
    stop = true;
    reader.join();
  }
  if (!snap.error.empty()) {
    std::fprintf(stderr, "snapshot failed: %s\n", snap.error.c_str());
    return 1;
  }
  std::printf("RESULT snapshot items=%llu bytes=%llu seconds=%.3f GBps=%.3f table_s=%.3f encode_s=%.3f write_s=%.3f sync_s=%.3f\n",
              static_cast<unsigned long long>(snap.items), static_cast<unsigned long long>(snap.bytes), snap.seconds,
              snap.bytes / snap.seconds / 1e9, snap.table_seconds, snap.encode_seconds, snap.write_seconds, snap.sync_seconds);
  std::printf("RESULT serving get_Mops_before=%.2f get_Mops_during_snapshot=%.2f\n", gets_before / before_seconds / 1e6,
              gets_during / during_seconds / 1e6);
  if (snap.items != items) {
    std::fprintf(stderr, "the snapshot holds %llu items, the table %llu\n", static_cast<unsigned long long>(snap.items),
                 static_cast<unsigned long long>(items));
    return 1;
  }

  // The file leaves the page cache (it is clean: fsynced), so the load reads the disk.
  const int fd = ::open(snap.path.c_str(), O_RDONLY);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  table.reset();
  table = std::make_unique<Table>(config);  // built before the clock starts: the load alone is timed
  const auto load_start = Clock::now();
  Recovery recovery;
  {
    Durability durability(DurabilityOptions{dir, WalMode::kOff, false}, *table, {});
    recovery = durability.recovery();
  }
  const double load_seconds = seconds_since(load_start);
  std::printf("RESULT load items=%llu bytes=%llu seconds=%.3f GBps=%.3f apply_s=%.3f table_s=%.3f read_waited_s=%.3f\n",
              static_cast<unsigned long long>(recovery.snapshot.items), static_cast<unsigned long long>(recovery.snapshot.bytes),
              load_seconds, recovery.snapshot.bytes / load_seconds / 1e9, recovery.apply_seconds, recovery.table_seconds,
              recovery.read_waited_seconds);
  // Every item back: a sample read and compared.
  ItemOps b(*table, 10000);
  std::uint64_t wrong = 0;
  for (std::uint64_t first = 0; first < items; first += items / 10) {
    b.rows = static_cast<std::size_t>(std::min<std::uint64_t>(10000, items - first));
    b.fill(first, OpKind::kGet, value_width);
    table->execute(b.in(), b.out());
    for (std::size_t i = 0; i < b.rows; ++i) {
      const std::uint32_t stride = b.batch.value_stride();
      wrong += b.status(i) != 0 || b.batch.out_value_lens()[i] != value_width ||
               std::memcmp(b.batch.out_values() + i * stride, b.batch.values() + i * stride, value_width) != 0;
    }
  }
  std::printf("RESULT check items=%llu sampled_wrong=%llu\n", static_cast<unsigned long long>(table->stats().device.items + table->stats().host.items),
              static_cast<unsigned long long>(wrong));
  if (flags.str("keep", "0") != std::string("1")) std::filesystem::remove_all(dir);
  return wrong == 0 && recovery.snapshot.items == items ? 0 : 1;
}
