#include "thread_pool.hpp"

#include <pthread.h>

#include <algorithm>

namespace gpukv::detail {
namespace {

// Spins until done() or ThreadPool::kSpin has passed; returns done(). Checks the clock every 64 rounds.
template <class Done>
bool spin_until(const Done& done) {
  const auto until = std::chrono::steady_clock::now() + ThreadPool::kSpin;
  for (unsigned round = 1;; ++round) {
    if (done()) return true;
    if (round % 64 == 0 && std::chrono::steady_clock::now() >= until) return false;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
}

// The chunk count and the next chunk share the cursor word, 32 bits each.
constexpr std::uint64_t kMaxChunks = 0xFFFFFFFFu;

}  // namespace

ThreadPool::ThreadPool(unsigned threads) {
  const unsigned total = threads == 0 ? std::max(1u, std::thread::hardware_concurrency()) : threads;
  workers_.reserve(total - 1);
  for (unsigned i = 1; i < total; ++i) {
    workers_.emplace_back([this] {
      pthread_setname_np(pthread_self(), "gpukv-cpu-pool");  // for per-thread tools (top -H, perf)
      work_loop();
    });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_.store(true);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunks() {
  std::uint64_t word = cursor_.load(std::memory_order_acquire);
  for (;;) {
    const std::uint64_t count = word >> 32, next = word & kMaxChunks;
    if (next >= count) return;
    // On failure `word` is reloaded: another thread claimed a chunk, or the loop changed.
    if (!cursor_.compare_exchange_weak(word, word + 1, std::memory_order_acquire, std::memory_order_acquire)) continue;
    const std::uint64_t begin = next * grain_;
    (*body_)(begin, std::min(n_, begin + grain_));
    if (chunks_done_.fetch_add(1, std::memory_order_acq_rel) + 1 == count) {
      std::lock_guard lock(mutex_);  // the caller sets caller_sleeping_ and checks chunks_done_ under the mutex
      if (caller_sleeping_) finished_.notify_one();
    }
    word = cursor_.load(std::memory_order_acquire);
  }
}

void ThreadPool::parallel_for(std::uint64_t n, std::uint64_t grain,
                              const std::function<void(std::uint64_t, std::uint64_t)>& body) {
  if (n == 0) return;
  grain = std::max<std::uint64_t>(1, grain);
  if (workers_.empty() || n <= grain) {
    body(0, n);
    return;
  }
  grain = std::max(grain, (n + kMaxChunks - 1) / kMaxChunks);
  const std::uint64_t chunks = (n + grain - 1) / grain;
  body_ = &body;
  n_ = n;
  grain_ = grain;
  chunks_done_.store(0, std::memory_order_relaxed);
  cursor_.store(chunks << 32, std::memory_order_release);  // the loop's fields above go with it
  bool wake;
  {
    // Under the mutex, so that a worker about to block either sees the new generation or is counted.
    std::lock_guard lock(mutex_);
    generation_.fetch_add(1, std::memory_order_release);
    wake = sleeping_workers_ != 0;
  }
  if (wake) wake_.notify_all();
  run_chunks();
  // Every chunk is claimed: wait for the ones other threads are still running.
  const auto all_done = [&] { return chunks_done_.load(std::memory_order_acquire) == chunks; };
  if (!spin_until(all_done)) {
    std::unique_lock lock(mutex_);
    caller_sleeping_ = true;
    finished_.wait(lock, all_done);
    caller_sleeping_ = false;
  }
}

void ThreadPool::work_loop() {
  std::uint64_t seen = 0;
  const auto called = [&] {
    return stop_.load(std::memory_order_relaxed) || generation_.load(std::memory_order_acquire) != seen;
  };
  for (;;) {
    if (!spin_until(called)) {
      std::unique_lock lock(mutex_);
      ++sleeping_workers_;
      wake_.wait(lock, called);
      --sleeping_workers_;
    }
    if (stop_.load()) return;
    seen = generation_.load(std::memory_order_acquire);
    run_chunks();  // finds nothing if the other threads have claimed every chunk already
  }
}

}  // namespace gpukv::detail
