// CPU backend benchmark: the same workloads as table_bench_gpu (insert, find hits, find misses, mixed) on
// the CPU backend, beside the baseline measured in the same run: std::unordered_map behind one mutex, driven
// by as many threads as the backend uses, each taking the lock per operation.
//
//   table_bench_cpu --n=2097152 --loads=0.5,0.8,0.9,0.95 --batch=65536 [--vw=8] [--layout=board|line]
//   table_bench_cpu --steady_rounds=R ...   mixed batches in a steady state instead (bench_steady)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bench_common.hpp"
#include "gpukv/batch.hpp"
#include "gpukv/table.hpp"

namespace gpukv::bench {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

void print_result(const char* workload, const std::string& config, double load, std::uint64_t ops, double ms) {
  std::printf("RESULT %-14s %s load=%.3f ops=%llu ms=%.1f mops=%.2f\n", workload, config.c_str(), load,
              static_cast<unsigned long long>(ops), ms, static_cast<double>(ops) / ms / 1e3);
  std::fflush(stdout);
}

// 8-byte keys: row i's key is one word.
void set_keys(Batch& b, const std::vector<std::uint64_t>& keys, std::uint64_t n) {
  std::memcpy(b.keys(), keys.data(), n * 8);
}
void set_ops(Batch& b, OpKind kind, std::uint64_t n) { std::memset(b.ops(), static_cast<int>(kind), n); }

// Runs the whole batch through the table in calls of `batch` ops, as a server would hand them over.
double run_batches(Table& table, Batch& b, std::uint64_t n, std::uint64_t batch, OpStatus want, const char* what) {
  const auto t0 = Clock::now();
  for (std::uint64_t at = 0; at < n; at += batch) {
    const std::uint64_t count = std::min(batch, n - at);
    table.execute(b.in(at, count), b.out(at, count));
  }
  const double ms = ms_since(t0);
  for (std::uint64_t i = 0; i < n; ++i) {
    if (b.status(i) != want) {
      std::fprintf(stderr, "%s: op %llu got %s, expected %s\n", what, static_cast<unsigned long long>(i),
                   to_string(b.status(i)), to_string(want));
      std::exit(1);
    }
  }
  return ms;
}

void make_mixed(Batch& b, const std::vector<std::uint64_t>& hits, const std::vector<std::uint64_t>& misses, std::uint64_t n) {
  auto* keys = reinterpret_cast<std::uint64_t*>(b.keys());
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint32_t r = static_cast<std::uint32_t>(scramble(i ^ 0xABCDEF) % 100);
    b.ops()[i] = r < 50 ? 0 : r < 95 ? 1 : 3;
    keys[i] = r >= 90 && r < 95 ? misses[i] : hits[i];
  }
}

void bench_table(std::uint64_t n, double load, std::uint64_t batch, unsigned threads, std::uint32_t value_width,
                 SlotLayout layout) {
  TableConfig c;
  c.backend = BackendKind::kCpu;
  c.slot_layout = layout;
  c.cpu_threads = threads;
  c.value_width = value_width;
  c.max_load_factor = 1.0;
  c.capacity = static_cast<std::uint64_t>(static_cast<double>(n) / load);
  Table table(c);
  const std::uint64_t fill = static_cast<std::uint64_t>(load * static_cast<double>(table.stats().device.capacity));
  std::vector<std::uint64_t> hits(fill), misses(fill);
  for (std::uint64_t i = 0; i < fill; ++i) {
    hits[i] = scramble((1ULL << 40) | i);
    misses[i] = scramble((2ULL << 40) | i);
  }
  Batch b(table, fill);
  // Every page of the result columns touched before any timing: allocate_host's zeroed memory is mapped on
  // first write, and the first timed batch to write a column would pay its page faults.
  std::memset(b.statuses(), 0, fill);
  std::memset(b.out_values(), 0, fill * b.value_stride());
  std::memset(b.out_value_lens(), 0, fill * sizeof(std::uint32_t));
  for (std::uint64_t i = 0; i < fill; ++i) {
    std::memcpy(b.values() + i * b.value_stride(), &i, std::min<std::uint32_t>(8, value_width));
    b.key_lens()[i] = 8;
    b.value_lens()[i] = value_width;
  }
  const std::string name = "backend=cpu threads=" + std::to_string(threads) + " batch=" + std::to_string(batch) +
                           " vw=" + std::to_string(value_width) + " layout=" + to_string(layout);

  set_ops(b, OpKind::kPut, fill);
  set_keys(b, hits, fill);
  print_result("insert", name, load, fill, run_batches(table, b, fill, batch, OpStatus::kOk, "insert"));
  set_ops(b, OpKind::kGet, fill);
  print_result("find_hit", name, load, fill, run_batches(table, b, fill, batch, OpStatus::kOk, "find hit"));
  set_keys(b, misses, fill);
  print_result("find_miss", name, load, fill, run_batches(table, b, fill, batch, OpStatus::kNotFound, "find miss"));
  const std::uint64_t mixed_n = fill / 2;
  make_mixed(b, hits, misses, mixed_n);
  print_result("mixed", name, load, mixed_n, run_batches(table, b, mixed_n, batch, OpStatus::kOk, "mixed"));
}

// Mixed batches in a steady state (--steady_rounds=R), as table_bench_gpu --parts=steady runs them: a table at
// the default maximum load filled with n keys at `load`, then R batches of `batch` ops (a multiple of 20): 5%
// deletes of the keys written longest ago, 5% new keys, and GETs (50 of every 90) or overwrites of the live keys
// past the deleted ones, no key twice in a batch. Its rate includes the clean-ups that its tombstones bring.
void bench_steady(std::uint64_t n, double load, std::uint64_t batch, unsigned threads, SlotLayout layout, int rounds) {
  TableConfig c;
  c.backend = BackendKind::kCpu;
  c.slot_layout = layout;
  c.cpu_threads = threads;
  c.capacity = static_cast<std::uint64_t>(static_cast<double>(n) / load);
  if (load >= c.max_load_factor) {
    std::printf("SKIPPED steady_mixed at load %.2f: not below the maximum load %.2f\n", load, c.max_load_factor);
    return;
  }
  Table table(c);
  const auto key_of = [](std::uint64_t index) { return scramble((1ULL << 40) | index); };
  {
    Batch fill(table, n);
    for (std::uint64_t i = 0; i < n; ++i) {
      reinterpret_cast<std::uint64_t*>(fill.keys())[i] = key_of(i);
      fill.key_lens()[i] = 8;
      std::memcpy(fill.values() + i * fill.value_stride(), &i, 8);
      fill.value_lens()[i] = 8;
    }
    set_ops(fill, OpKind::kPut, n);
    run_batches(table, fill, n, batch, OpStatus::kOk, "steady fill");
  }
  const std::uint64_t d = batch / 20 * 20, churned = d / 20;
  Batch b(table, d);
  std::memset(b.statuses(), 0, d);  // every page of the result columns touched before any timing
  std::memset(b.out_values(), 0, d * b.value_stride());
  std::memset(b.out_value_lens(), 0, d * sizeof(std::uint32_t));
  for (std::uint64_t i = 0; i < d; ++i) {
    std::memcpy(b.values() + i * b.value_stride(), &i, 8);
    b.value_lens()[i] = 8;
    b.key_lens()[i] = 8;
  }
  const std::uint64_t cleanups_before = table.stats().cleanups;
  std::uint64_t oldest = 0;
  double ms = 0;
  auto* keys = reinterpret_cast<std::uint64_t*>(b.keys());
  for (int round = 0; round < rounds; ++round) {
    const auto turn = static_cast<std::uint64_t>(round);
    for (std::uint64_t i = 0; i < d; ++i) {
      std::uint64_t index;
      if (i % 20 == 0) {
        b.ops()[i] = static_cast<std::uint8_t>(OpKind::kDelete);
        index = oldest + i / 20;
      } else if (i % 20 == 1) {
        b.ops()[i] = static_cast<std::uint8_t>(OpKind::kPut);
        index = oldest + n + i / 20;
      } else {
        b.ops()[i] = static_cast<std::uint8_t>(scramble(i ^ (turn << 32)) % 90 < 50 ? OpKind::kGet : OpKind::kPut);
        index = oldest + churned + (turn * d + i) % (n - churned);
      }
      keys[i] = key_of(index);
    }
    ms += run_batches(table, b, d, d, OpStatus::kOk, "steady mixed");
    oldest += churned;
  }
  const TableStats s = table.stats();
  const std::string name = "backend=cpu threads=" + std::to_string(threads) + " batch=" + std::to_string(d) +
                           " layout=" + to_string(layout) + " rounds=" + std::to_string(rounds) +
                           " cleanups=" + std::to_string(s.cleanups - cleanups_before);
  print_result("steady_mixed", name, load, d * static_cast<std::uint64_t>(rounds), ms);
}

// The baseline: std::unordered_map under one mutex, `threads` threads each taking the lock per operation.
template <class Op>
double run_locked(unsigned threads, std::uint64_t n, Op op) {
  std::vector<std::thread> pool;
  const auto t0 = Clock::now();
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (std::uint64_t i = t; i < n; i += threads) op(i);
    });
  }
  for (auto& th : pool) th.join();
  return ms_since(t0);
}

void bench_baseline(std::uint64_t n, double load, unsigned threads) {
  std::unordered_map<std::uint64_t, std::uint64_t> map;
  map.reserve(static_cast<std::size_t>(static_cast<double>(n) / load));
  std::mutex mutex;
  std::vector<std::uint64_t> hits(n), misses(n);
  for (std::uint64_t i = 0; i < n; ++i) {
    hits[i] = scramble((1ULL << 40) | i);
    misses[i] = scramble((2ULL << 40) | i);
  }
  const std::string name = "baseline=std::unordered_map+mutex threads=" + std::to_string(threads);
  std::atomic<std::uint64_t> found{0};
  print_result("insert", name, load, n, run_locked(threads, n, [&](std::uint64_t i) {
    std::lock_guard lock(mutex);
    map[hits[i]] = i;
  }));
  print_result("find_hit", name, load, n, run_locked(threads, n, [&](std::uint64_t i) {
    std::lock_guard lock(mutex);
    found.fetch_add(map.count(hits[i]), std::memory_order_relaxed);
  }));
  print_result("find_miss", name, load, n, run_locked(threads, n, [&](std::uint64_t i) {
    std::lock_guard lock(mutex);
    found.fetch_add(map.count(misses[i]), std::memory_order_relaxed);
  }));
  print_result("mixed", name, load, n / 2, run_locked(threads, n / 2, [&](std::uint64_t i) {
    const std::uint32_t r = static_cast<std::uint32_t>(scramble(i ^ 0xABCDEF) % 100);
    std::lock_guard lock(mutex);
    if (r < 50) {
      found.fetch_add(map.count(hits[i]), std::memory_order_relaxed);
    } else if (r < 90) {
      map[hits[i]] = i;
    } else if (r < 95) {
      map[misses[i]] = i;
    } else {
      map.erase(hits[i]);
    }
  }));
  std::printf("# baseline lookups found %llu keys\n", static_cast<unsigned long long>(found.load()));
}

}  // namespace
}  // namespace gpukv::bench

int main(int argc, char** argv) {
  using namespace gpukv::bench;
  const Flags flags(argc, argv);
  const std::uint64_t n = flags.u64("n", std::uint64_t{1} << 21);
  const std::uint64_t batch = flags.u64("batch", 65536);
  const unsigned threads = static_cast<unsigned>(flags.u64("threads", std::max(1u, std::thread::hardware_concurrency())));
  // Value width, a multiple of 8 (the baseline's values stay 8 bytes).
  const auto value_width = static_cast<std::uint32_t>(flags.u64("vw", 8) / 8 * 8);
  std::printf("DEVICE cpu hardware_threads=%u\n", std::thread::hardware_concurrency());
  const bool line = flags.str("layout", "board") == "line";
  const gpukv::SlotLayout layout = line ? gpukv::SlotLayout::kLine : gpukv::SlotLayout::kBoard;
  const int steady_rounds = static_cast<int>(flags.u64("steady_rounds", 0));
  for (double load : flags.doubles("loads", "0.5,0.8,0.9,0.95")) {
    if (steady_rounds > 0) {
      bench_steady(n, load, batch, threads, layout, steady_rounds);
      continue;
    }
    bench_table(n, load, batch, threads, value_width, layout);
    bench_baseline(n, load, threads);
  }
  return 0;
}
