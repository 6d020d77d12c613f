// Batches that arrive in host memory, as the server hands them to the table: what the copies cost, and how
// much of it pinned staging and Table::prefetch win back. Beside the table's rate on the same batches with
// every column already in GPU memory (execute_on_device), measured in the same run.
//
//   staging_bench_gpu --kw=16 --vw=8 --n=33554432 --load=0.5 --batch=65536 --batches=256 --repeats=3
//
// Modes, each over the same `batches` batches of `batch` ops (GET hits over the stored keys, then a mixed
// 50% GET / 45% PUT / 5% DELETE stream):
//   device    columns in GPU memory, execute_on_device: no copies (the ceiling)
//   pageable  columns in ordinary host memory (std::vector), execute(): the driver stages every copy
//   pinned    columns in Table::allocate_host memory, execute(): copies by DMA, but each batch waits for its
//             own input copy and result copy
//   prefetch  pinned, and batch i+1's input is prefetched before batch i executes (the batcher's pipeline):
//             the input copy overlaps the previous batch
// Bytes over PCIe per op: in 1 + kw + 1 (+ value stride + 4 for a batch with writes), out 1 + value stride
// + 4 (the value columns are copied whole); the limit is the link's 55 GB/s each way (a bulk copy between
// pinned host memory and the device on the lent H100 and H200 hosts, 2026-11-22).
#include <chrono>
#include <cstring>
#include <vector>

#include "gpu_bench_common.cuh"

namespace gpukv::bench {
namespace {

// A run of `batches` batches of `batch` ops, every column contiguous, in some kind of host memory.
struct HostColumns {
  std::uint64_t n = 0;
  std::uint32_t kw = 0, stride = 0;
  std::uint8_t *ops, *keys, *key_lens, *values, *status, *out_values;
  std::uint32_t *value_lens, *out_value_lens;

  // Carves the columns out of `base` (8-byte aligned, `bytes(n, kw, stride)` long).
  HostColumns(std::uint8_t* base, std::uint64_t count, std::uint32_t key_width, std::uint32_t value_stride)
      : n(count), kw(key_width), stride(value_stride) {
    std::uint8_t* p = base;
    const auto take = [&](std::uint64_t b) {
      std::uint8_t* at = p;
      p += (b + 7) / 8 * 8;
      return at;
    };
    ops = take(n);
    key_lens = take(n);
    status = take(n);
    keys = take(n * kw);
    values = take(n * stride);
    out_values = take(n * stride);
    value_lens = reinterpret_cast<std::uint32_t*>(take(n * 4));
    out_value_lens = reinterpret_cast<std::uint32_t*>(take(n * 4));
  }
  static std::uint64_t bytes(std::uint64_t n, std::uint32_t kw, std::uint32_t stride) {
    return n * (3 + kw + 2 * stride + 8) + 64;
  }
  // A batch without writes carries no value columns (as the server's batcher sends it).
  BatchIn in(std::uint64_t at, std::uint64_t count, bool writes) const {
    return BatchIn{count, ops + at, keys + at * kw, key_lens + at, writes ? values + at * stride : nullptr,
                   writes ? value_lens + at : nullptr};
  }
  BatchOut out(std::uint64_t at) const { return BatchOut{status + at, out_values + at * stride, out_value_lens + at}; }
  // The workload's input columns, from device columns.
  void load_from(const Batch& d) {
    CHECK(cudaMemcpy(ops, d.ops.p, n, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(keys, d.keys.p, n * kw, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(key_lens, d.key_lens.p, n, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(values, d.values.p, n * stride, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(value_lens, d.value_lens.p, n * 4, cudaMemcpyDeviceToHost));
  }
  void expect(OpStatus want, std::uint64_t count, const char* what) const {
    std::uint64_t wrong = 0;
    for (std::uint64_t i = 0; i < count; ++i) wrong += status[i] != static_cast<std::uint8_t>(want);
    if (wrong != 0) {
      std::fprintf(stderr, "%s: %llu of %llu ops did not answer %s\n", what, static_cast<unsigned long long>(wrong),
                   static_cast<unsigned long long>(count), to_string(want));
      std::exit(1);
    }
  }
};

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace
}  // namespace gpukv::bench

int main(int argc, char** argv) {
  using namespace gpukv;
  using namespace gpukv::bench;
  const Flags flags(argc, argv);
  const std::uint32_t kw = static_cast<std::uint32_t>(flags.u64("kw", 16));
  const std::uint32_t vw = static_cast<std::uint32_t>(flags.u64("vw", 8));
  const std::uint64_t stored = flags.u64("n", std::uint64_t{1} << 25);
  const double load = flags.doubles("load", "0.5").front();
  const std::uint64_t batch = flags.u64("batch", 65536);
  const std::uint64_t batches = flags.u64("batches", 256);
  const int repeats = static_cast<int>(flags.u64("repeats", 3));
  const std::uint32_t stride = value_stride(vw);
  const std::uint64_t total = batch * batches;
  if (total > stored) {
    std::fprintf(stderr, "batch * batches (%llu) must not exceed --n\n", static_cast<unsigned long long>(total));
    return 2;
  }

  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("DEVICE %s sms=%d\n", prop.name, prop.multiProcessorCount);

  TableConfig c;
  c.backend = BackendKind::kGpu;
  c.key_width = kw;
  c.value_width = vw;
  c.max_batch = static_cast<std::uint32_t>(std::max<std::uint64_t>(batch, 1 << 22));
  c.max_load_factor = 1.0;
  c.capacity = static_cast<std::uint64_t>(static_cast<double>(stored) / load);
  Table table(c);

  // Store `stored` keys; the workloads use the first `total` of them.
  Batch d(stored, kw, stride);
  DeviceArray<std::uint8_t> hit_keys(stored * kw), miss_keys(stored * kw);
  make_keys<<<kGrid, kBlock>>>(hit_keys.p, d.key_lens.p, stored, kw, 0, 1);
  make_keys<<<kGrid, kBlock>>>(miss_keys.p, d.key_lens.p, stored, kw, 0, 2);
  make_values<<<kGrid, kBlock>>>(d.values.p, d.value_lens.p, stored, vw, stride, 7);
  fill_ops<<<kGrid, kBlock>>>(d.ops.p, stored, static_cast<std::uint8_t>(OpKind::kPut));
  CHECK(cudaMemcpy(d.keys.p, hit_keys.p, stored * kw, cudaMemcpyDeviceToDevice));
  CHECK(cudaDeviceSynchronize());
  table.execute_on_device(d.in(stored), d.out());
  expect_status(d, stored, OpStatus::kOk, "fill");


  std::vector<std::uint64_t> pageable_words(HostColumns::bytes(total, kw, stride) / 8 + 1);
  HostMemory pinned_memory = table.allocate_host(HostColumns::bytes(total, kw, stride));
  HostColumns pageable(reinterpret_cast<std::uint8_t*>(pageable_words.data()), total, kw, stride);
  HostColumns pinned(pinned_memory.data(), total, kw, stride);

  for (const char* workload : {"get_hit", "mixed"}) {
    const bool mixed = std::strcmp(workload, "mixed") == 0;
    const std::uint64_t in_bytes = 1 + kw + 1 + (mixed ? stride + 4 : 0), out_bytes = 1 + stride + 4;
    const double link = 55e9;  // pinned host <-> device, each way, on the H100 hosts
    const double limit = std::min(link / static_cast<double>(in_bytes), link / static_cast<double>(out_bytes));
    char config[256];
    std::snprintf(config, sizeof config, "kw=%u vw=%u batch=%llu batches=%llu in_bytes_per_op=%llu out_bytes_per_op=%llu pcie_limit_gops=%.2f",
                  kw, vw, static_cast<unsigned long long>(batch), static_cast<unsigned long long>(batches),
                  static_cast<unsigned long long>(in_bytes), static_cast<unsigned long long>(out_bytes), limit / 1e9);
    // The workload's columns: on the device (for `device`), then copied into both kinds of host memory. The
    // mixed stream's writes overwrite stored keys and insert a few new ones, and its deletes remove stored
    // keys: replaying it leaves every op's status as it was, so every repeat checks the same results.
    CHECK(cudaMemcpy(d.keys.p, hit_keys.p, total * kw, cudaMemcpyDeviceToDevice));
    fill_ops<<<kGrid, kBlock>>>(d.ops.p, total, static_cast<std::uint8_t>(OpKind::kGet));
    if (mixed) make_mixed<<<kGrid, kBlock>>>(d.ops.p, d.keys.p, hit_keys.p, miss_keys.p, total, kw);
    CHECK(cudaDeviceSynchronize());
    pageable.load_from(d);
    pinned.load_from(d);
    // A mixed replay re-inserts the keys it deleted (PUT new keys and DELETEs flip between runs otherwise).
    const OpStatus want = OpStatus::kOk;

    for (const char* mode : {"device", "pageable", "pinned", "prefetch"}) {
      double best = 1e30;
      for (int rep = 0; rep < repeats; ++rep) {
        if (mixed) {  // restore the stored set: the previous replay deleted 5% of it and added new keys
          fill_ops<<<kGrid, kBlock>>>(d.ops.p, total, static_cast<std::uint8_t>(OpKind::kPut));
          CHECK(cudaMemcpy(d.keys.p, hit_keys.p, total * kw, cudaMemcpyDeviceToDevice));
          table.execute_on_device(d.in(total), d.out());
          Batch del(total, kw, stride);
          fill_ops<<<kGrid, kBlock>>>(del.ops.p, total, static_cast<std::uint8_t>(OpKind::kDelete));
          CHECK(cudaMemcpy(del.keys.p, miss_keys.p, total * kw, cudaMemcpyDeviceToDevice));
          CHECK(cudaMemcpy(del.key_lens.p, d.key_lens.p, total, cudaMemcpyDeviceToDevice));
          table.execute_on_device(del.in(total), del.out());
          make_mixed<<<kGrid, kBlock>>>(d.ops.p, d.keys.p, hit_keys.p, miss_keys.p, total, kw);
          CHECK(cudaDeviceSynchronize());
        }
        const HostColumns& h = std::strcmp(mode, "pageable") == 0 ? pageable : pinned;
        const double t0 = now_ms();
        if (std::strcmp(mode, "device") == 0) {
          for (std::uint64_t b = 0; b < batches; ++b) {
            const BatchIn in = d.in(total);
            table.execute_on_device(BatchIn{batch, in.ops + b * batch, in.keys + b * batch * kw, in.key_lens + b * batch,
                                            mixed ? in.values + b * batch * stride : nullptr, mixed ? in.value_lens + b * batch : nullptr},
                                    BatchOut{d.status.p + b * batch, d.out_values.p + b * batch * stride, d.out_value_lens.p + b * batch});
          }
        } else {
          const bool ahead = std::strcmp(mode, "prefetch") == 0;
          if (ahead) table.prefetch(h.in(0, batch, mixed));
          for (std::uint64_t b = 0; b < batches; ++b) {
            if (ahead && b + 1 < batches) table.prefetch(h.in((b + 1) * batch, batch, mixed));
            table.execute(h.in(b * batch, batch, mixed), h.out(b * batch));
          }
        }
        best = std::min(best, now_ms() - t0);
        if (std::strcmp(mode, "device") == 0) {
          expect_status(d, total, want, workload);
        } else {
          h.expect(want, total, workload);
        }
      }
      std::printf("RESULT %-8s %-8s %s ops=%llu ms=%.3f gops=%.3f\n", workload, mode, config,
                  static_cast<unsigned long long>(total), best, static_cast<double>(total) / best / 1e6);
      std::fflush(stdout);
    }
  }
  return 0;
}
