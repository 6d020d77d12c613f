// Host-tier benchmark (Stadium Hashing out of core): a table whose device tier is full and whose host tier
// (slots in pinned host memory, tickets in GPU memory) holds most keys. Measures, per setting:
//
//   host_insert    PUTs of new keys, all of which land in the host tier (it fills from 0 to --host_load)
//   host_get_hit   GETs of host-tier keys
//   host_get_miss  GETs of absent keys (the device and host ticket-boards answer them)
//   host_mixed     50% GET / 40% PUT overwrite / 5% PUT new / 5% DELETE, on host-tier keys
//
// with the host accesses each op made (TableStats host_reads + host_writes) and the reads the info bits
// avoided. Baseline in the same run: GPU random 16-byte reads of pinned host memory over windows of 64 MB,
// 1 GB and the host tier's size (749 / 109 / 43.4 M/s on an H100: bench/RESULTS.md, "the host tier (issue 4)").
//
//   host_tier_bench_gpu --kw=8 --vw=8 --device_gb=1 --host_gb=8 --host_load=0.8 --orders=walk,ordered
//
// order=walk is TableConfig::order_host = false (the host phase runs in batch order; before the host phase
// existed, host accesses happened in the walk, hence the name); order=ordered sorts it by host address.
//
// Prints "RESULT <workload> <fields...>" lines.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "gpu_bench_common.cuh"

namespace gpukv::bench {
namespace {

// Random 16-byte reads of a buffer (pinned host memory here), spread over its first `window` bytes.
__global__ void host_gather(const ulonglong2* data, std::uint64_t window_lines, std::uint64_t n, std::uint64_t* out) {
  std::uint64_t acc = 0;
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < n; i += std::uint64_t{gridDim.x} * blockDim.x) {
    const ulonglong2 v = data[dscramble(i) % window_lines];
    acc ^= v.x ^ v.y;
  }
  if (acc == 42) out[0] = acc;  // keeps the loads alive
}

void bench_host_random_reads(std::uint64_t bytes) {
  void* host = nullptr;
  CHECK(cudaHostAlloc(&host, bytes, cudaHostAllocMapped));
  CHECK(cudaMemset(host, 1, bytes));
  DeviceArray<std::uint64_t> out(1);
  Timer timer;
  for (std::uint64_t window : {std::uint64_t{64} << 20, std::uint64_t{1} << 30, bytes}) {
    if (window > bytes) continue;
    const std::uint64_t n = std::uint64_t{1} << 24;
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      timer.start();
      host_gather<<<4096, 256>>>(static_cast<const ulonglong2*>(host), window / 16, n, out.p);
      best = std::min(best, timer.stop_ms());
    }
    CHECK(cudaGetLastError());
    std::printf("RESULT %-14s window_bytes=%llu reads=%llu ms=%.3f mreads_per_s=%.1f\n", "hw_host_random_16B",
                static_cast<unsigned long long>(window), static_cast<unsigned long long>(n), best, n / best / 1e3);
    std::fflush(stdout);
  }
  CHECK(cudaFreeHost(host));
}

struct HostRun {
  std::uint32_t kw, vw, tickets;
  double device_gb, host_gb, host_load;
  bool ordered;
  std::uint32_t host_threads;
  std::uint64_t batch;
  int repeats;
};

std::string describe(const HostRun& r, const TableStats& s) {
  char buf[300];
  std::snprintf(buf, sizeof buf,
                "kw=%u vw=%u tickets=%u order=%s host_threads=%u device_slots=%llu host_slots=%llu host_bytes=%llu",
                r.kw, r.vw, r.tickets, r.ordered ? "ordered" : "walk", r.host_threads,
                static_cast<unsigned long long>(s.device.capacity), static_cast<unsigned long long>(s.host.capacity),
                static_cast<unsigned long long>(s.host.slot_bytes));
  return buf;
}

// Host traffic between two stats snapshots, per op.
std::string traffic(const TableStats& a, const TableStats& b, std::uint64_t ops, double ms) {
  const double reads = static_cast<double>(b.host_reads - a.host_reads);
  const double writes = static_cast<double>(b.host_writes - a.host_writes);
  const double avoided = static_cast<double>(b.host_avoided - a.host_avoided);
  char buf[200];
  std::snprintf(buf, sizeof buf, "host_reads_per_op=%.3f host_writes_per_op=%.3f avoided_per_op=%.3f host_maccess_per_s=%.1f",
                reads / ops, writes / ops, avoided / ops, (reads + writes) / ms / 1e3);
  return buf;
}

void bench_host_tier(const HostRun& r) {
  const std::uint32_t stride = value_stride(r.vw);
  TableConfig c;
  c.backend = BackendKind::kGpu;
  c.key_width = r.kw;
  c.value_width = r.vw;
  c.ticket_bits = r.tickets;
  // A board device tier, as in every run of this benchmark in bench/RESULTS.md (the default would pick the
  // line layout at 8 B / 8 B), sized in board slots below.
  c.slot_layout = SlotLayout::kBoard;
  c.max_load_factor = 0.95;
  c.order_host = r.ordered;
  c.host_phase_threads = r.host_threads;
  const std::uint64_t slot_bytes = (8 + r.kw + stride + 31) / 32 * 32;
  c.capacity = static_cast<std::uint64_t>(r.device_gb * (1 << 30)) / slot_bytes;
  c.host_capacity = static_cast<std::uint64_t>(r.host_gb * (1 << 30)) / slot_bytes;
  Table table(c);
  const TableStats empty = table.stats();
  const std::string name = describe(r, empty);
  const std::uint64_t device_keys = empty.device.max_items;
  const std::uint64_t host_keys = static_cast<std::uint64_t>(r.host_load * static_cast<double>(empty.host.capacity));
  const std::uint64_t b = r.batch;

  Batch batch(b, r.kw, stride);
  make_values<<<kGrid, kBlock>>>(batch.values.p, batch.value_lens.p, b, r.vw, stride, 11);
  Timer timer;

  // Fill the device tier (untimed), then the host tier (timed: every one of these PUTs lands there).
  fill_ops<<<kGrid, kBlock>>>(batch.ops.p, b, static_cast<std::uint8_t>(OpKind::kPut));
  for (std::uint64_t at = 0; at < device_keys; at += b) {
    const std::uint64_t n = std::min(b, device_keys - at);
    make_keys<<<kGrid, kBlock>>>(batch.keys.p, batch.key_lens.p, n, r.kw, at, 1);
    table.execute_on_device(batch.in(n), batch.out());
    expect_status(batch, n, OpStatus::kOk, "device fill");
  }
  double insert_ms = 0;
  const TableStats before_insert = table.stats();
  for (std::uint64_t at = 0; at < host_keys; at += b) {
    const std::uint64_t n = std::min(b, host_keys - at);
    make_keys<<<kGrid, kBlock>>>(batch.keys.p, batch.key_lens.p, n, r.kw, at, 3);
    CHECK(cudaDeviceSynchronize());
    timer.start();
    table.execute_on_device(batch.in(n), batch.out());
    insert_ms += timer.stop_ms();
    expect_status(batch, n, OpStatus::kOk, "host fill");
  }
  const TableStats filled = table.stats();
  if (filled.device.items != device_keys || filled.host.items != host_keys) {
    std::fprintf(stderr, "placement: device %llu of %llu, host %llu of %llu\n", static_cast<unsigned long long>(filled.device.items),
                 static_cast<unsigned long long>(device_keys), static_cast<unsigned long long>(filled.host.items),
                 static_cast<unsigned long long>(host_keys));
    std::exit(1);
  }
  print_result("host_insert", name, r.host_load, host_keys, insert_ms, traffic(before_insert, filled, host_keys, insert_ms));

  // GETs of host keys (the first b inserted: random places, as the keys are hashed), then of absent keys.
  const std::uint64_t n = std::min(b, host_keys);
  DeviceArray<std::uint8_t> hit_keys(n * r.kw), miss_keys(n * r.kw), lens(n);
  make_keys<<<kGrid, kBlock>>>(hit_keys.p, lens.p, n, r.kw, 0, 3);
  make_keys<<<kGrid, kBlock>>>(miss_keys.p, lens.p, n, r.kw, 0, 9);
  fill_ops<<<kGrid, kBlock>>>(batch.ops.p, n, static_cast<std::uint8_t>(OpKind::kGet));
  CHECK(cudaMemcpy(batch.key_lens.p, lens.p, n, cudaMemcpyDeviceToDevice));
  const auto timed = [&](const char* workload, const std::uint8_t* keys, OpStatus want) {
    double best = 1e30;
    std::string best_traffic;
    for (int rep = 0; rep < r.repeats; ++rep) {
      if (keys != nullptr) CHECK(cudaMemcpy(batch.keys.p, keys, n * r.kw, cudaMemcpyDeviceToDevice));
      CHECK(cudaDeviceSynchronize());
      const TableStats before = table.stats();
      timer.start();
      table.execute_on_device(batch.in(n), batch.out());
      const double ms = timer.stop_ms();
      expect_status(batch, n, want, workload);
      if (ms < best) {
        best = ms;
        best_traffic = traffic(before, table.stats(), n, ms);
      }
    }
    print_result(workload, name, r.host_load, n, best, best_traffic);
  };
  timed("host_get_hit", hit_keys.p, OpStatus::kOk);
  timed("host_get_miss", miss_keys.p, OpStatus::kNotFound);

  // Mixed, once (it changes the table): its new keys also land in the host tier.
  make_mixed<<<kGrid, kBlock>>>(batch.ops.p, batch.keys.p, hit_keys.p, miss_keys.p, n, r.kw);
  CHECK(cudaDeviceSynchronize());
  const TableStats before = table.stats();
  timer.start();
  table.execute_on_device(batch.in(n), batch.out());
  const double ms = timer.stop_ms();
  expect_status(batch, n, OpStatus::kOk, "host mixed");
  print_result("host_mixed", name, r.host_load, n, ms, traffic(before, table.stats(), n, ms));
}

}  // namespace
}  // namespace gpukv::bench

int main(int argc, char** argv) {
  using namespace gpukv::bench;
  const Flags flags(argc, argv);
  if (!gpukv::Table::gpu_available()) {
    std::printf("SKIPPED: no CUDA device; the host-tier benchmark did not run\n");
    return 0;
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("DEVICE %s sms=%d l2_mb=%d mem_gb=%.1f\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20,
              static_cast<double>(prop.totalGlobalMem) / (1 << 30));
  const double host_gb = std::atof(flags.str("host_gb", "8").c_str());
  if (flags.str("baseline", "1") == "1") bench_host_random_reads(static_cast<std::uint64_t>(host_gb * (1 << 30)));
  const std::string orders = flags.str("orders", "walk,ordered");
  for (std::uint64_t threads : flags.u64s("host_threads", "0")) {
    for (const char* order : {"walk", "ordered"}) {
      if (orders.find(order) == std::string::npos) continue;
      const bool ordered = std::string(order) == "ordered";
      if (!ordered && threads != flags.u64s("host_threads", "0")[0]) continue;  // the walk ignores host_threads
      HostRun r{static_cast<std::uint32_t>(flags.u64("kw", 8)), static_cast<std::uint32_t>(flags.u64("vw", 8)),
                static_cast<std::uint32_t>(flags.u64("tickets", 8)), std::atof(flags.str("device_gb", "1").c_str()),
                host_gb, std::atof(flags.str("host_load", "0.8").c_str()), ordered, static_cast<std::uint32_t>(threads),
                flags.u64("batch", std::uint64_t{1} << 22), static_cast<int>(flags.u64("repeats", 3))};
      bench_host_tier(r);
    }
  }
  return 0;
}
