// Concurrency stress on the CPU backend: more worker threads than cores, large passes dominated by a few hot
// keys (long ordered segments) mixed with unique keys (the concurrent path), deletes and re-inserts near a
// full table so that tombstones pile up and the clean-up runs between passes, and several client threads
// calling the table at once. Checked against the model after every batch. Built and run under
// ThreadSanitizer by tests/run_all.sh (label "tsan"), where a data race fails the run.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "model.hpp"

namespace gpukv::test {
namespace {

TEST(TableStressTest, ManyThreadsHotKeysAndCleanupMatchModel) {
  TableConfig c;
  c.backend = BackendKind::kCpu;
  c.cpu_threads = 8;
  c.key_width = 16;
  c.value_width = 24;
  c.capacity = 6000;
  c.cleanup_tombstones = 0.05;
  c.max_batch = 5000;  // batches below span several passes
  Table table(c);
  const std::uint64_t max_items = table.stats().device.max_items;
  Model model(max_items);
  Generator gen(0xC0FFEE, c.key_width, c.value_width);
  const auto keys = gen.unique_keys(max_items * 2);
  std::vector<std::string> hot(4);
  for (auto& k : hot) k = keys[gen.next(static_cast<std::uint32_t>(keys.size()))];

  for (int batch = 0; batch < 60 && !HasFatalFailure(); ++batch) {
    std::vector<Op> ops;
    const std::size_t n = 8000 + gen.next(8000);
    for (std::size_t i = 0; i < n; ++i) {
      const double r = gen.uniform();
      const OpKind kind = r < 0.35 ? OpKind::kPut : r < 0.45 ? OpKind::kPutIfAbsent : r < 0.75 ? OpKind::kGet : OpKind::kDelete;
      const std::string& key = gen.next(4) == 0 ? hot[gen.next(4)] : keys[gen.next(static_cast<std::uint32_t>(keys.size()))];
      ops.push_back(Op{kind, key, kind == OpKind::kPut || kind == OpKind::kPutIfAbsent ? gen.value() : std::string()});
    }
    model.run(table, ops);
  }
  model.check_contents(table);
  EXPECT_GT(table.stats().cleanups, 0u);
  EXPECT_GT(table.stats().conflict_ops, 0u);
}

// Client threads calling one table concurrently, each on its own keys: calls are serialised by the table, and
// every thread's final values must be its last writes.
TEST(TableStressTest, ConcurrentCallersWithWorkerThreads) {
  TableConfig c;
  c.backend = BackendKind::kCpu;
  c.cpu_threads = 4;
  c.capacity = 40000;
  Table table(c);
  constexpr int kClients = 4, kRounds = 30, kKeys = 500;
  std::atomic<int> failures{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < kClients; ++t) {
    clients.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        std::vector<Op> ops;
        for (int i = 0; i < kKeys; ++i) {
          const std::string key = std::to_string(t) + ":" + std::to_string(i);
          ops.push_back(Op{OpKind::kPut, key, std::to_string(round)});
          ops.push_back(Op{OpKind::kGet, key, {}});
        }
        Columns cols(table, ops);
        table.execute(cols.in(), cols.out());
        for (int i = 0; i < kKeys; ++i) {
          if (cols.status(2 * i) != OpStatus::kOk || cols.value(2 * i + 1) != std::to_string(round)) failures++;
        }
      }
    });
  }
  for (auto& th : clients) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(table.stats().device.items, static_cast<std::uint64_t>(kClients * kKeys));
}

}  // namespace
}  // namespace gpukv::test
