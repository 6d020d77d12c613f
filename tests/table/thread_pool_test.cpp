// The CPU backend's thread pool: every index of every loop runs exactly once, and its writes are visible to
// the caller when parallel_for returns, whichever thread ran it. Loops come back to back and are often just
// above one chunk, so that workers wake while a loop is ending or after it has ended (the caller never
// waits for them) and must claim nothing of a loop that is not theirs. More threads than cores. Run under
// ThreadSanitizer by tests/run_all.sh (the name matches its "Stress" filter), where a worker that read a
// loop's fields without ordering fails the run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include "cpu/thread_pool.hpp"

namespace gpukv::detail {
namespace {

TEST(ThreadPoolStressTest, EveryIndexRunsOnceAndIsVisibleOnReturn) {
  ThreadPool pool(6);
  ASSERT_EQ(pool.threads(), 6u);
  std::mt19937_64 rng(42);
  std::vector<std::uint32_t> runs(1 << 15);  // plain ints: each index is written by one thread only
  const int loops = 4000;
  for (int loop = 0; loop < loops; ++loop) {
    const std::uint64_t grain = 1 + rng() % 64;
    // Mostly one or two chunks (the race between a late worker and the next loop), sometimes many.
    const std::uint64_t n = rng() % 8 == 0 ? 1 + rng() % runs.size() : 1 + rng() % (2 * grain + 1);
    std::fill(runs.begin(), runs.begin() + static_cast<std::ptrdiff_t>(n), 0u);
    pool.parallel_for(n, grain, [&](std::uint64_t begin, std::uint64_t end) {
      ASSERT_LT(begin, end);
      ASSERT_LE(end, n);
      ASSERT_LE(end - begin, grain);
      for (std::uint64_t i = begin; i < end; ++i) runs[i] += 1;
    });
    for (std::uint64_t i = 0; i < n; ++i) {
      ASSERT_EQ(runs[i], 1u) << "loop " << loop << " (n " << n << ", grain " << grain << "): index " << i;
    }
  }
}

TEST(ThreadPoolStressTest, SmallLoopsRunOnTheCaller) {
  ThreadPool pool(4);
  const std::thread::id caller = std::this_thread::get_id();
  int calls = 0;
  pool.parallel_for(100, 100, [&](std::uint64_t begin, std::uint64_t end) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    EXPECT_EQ(begin, 0u);
    EXPECT_EQ(end, 100u);
    ++calls;
  });
  EXPECT_EQ(calls, 1);
  pool.parallel_for(0, 1, [&](std::uint64_t, std::uint64_t) { ++calls; });
  EXPECT_EQ(calls, 1);
}

TEST(ThreadPoolStressTest, OneThreadRunsEverythingOnTheCaller) {
  ThreadPool pool(1);
  const std::thread::id caller = std::this_thread::get_id();
  std::uint64_t sum = 0;
  pool.parallel_for(10000, 7, [&](std::uint64_t begin, std::uint64_t end) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    for (std::uint64_t i = begin; i < end; ++i) sum += i;
  });
  EXPECT_EQ(sum, 10000ull * 9999 / 2);
}

}  // namespace
}  // namespace gpukv::detail
