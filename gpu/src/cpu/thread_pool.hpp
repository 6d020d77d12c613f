// A fixed pool of worker threads that runs one parallel loop at a time: the CPU backend's "grid".
// The calling thread takes part, so a pool of N threads has N-1 workers. Small loops run on the caller alone.
//
// A pass is several loops back to back (a few microseconds apart), and a batch is one or a few passes. So
// a worker that finishes a loop, and a caller waiting for the workers, spin for a short while before they
// block: a wake-up costs a context switch, which on a virtual machine costs tens of microseconds, and
// blocking between the loops of one pass cost the server about a quarter of its CPU (perf, 2-core VM).
// The spin is short, so a pool idle between batches gives its cores back to the rest of the process.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace gpukv::detail {

class ThreadPool {
 public:
  // How long a thread spins for the next loop (a worker) or for the workers (the caller) before it blocks.
  static constexpr std::chrono::microseconds kSpin{20};

  explicit ThreadPool(unsigned threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  unsigned threads() const { return static_cast<unsigned>(workers_.size()) + 1; }

  // Calls body(begin, end) over [0, n) in chunks of `grain`, from all threads; returns when all are done.
  // Not reentrant: one loop at a time (the table serialises its passes).
  void parallel_for(std::uint64_t n, std::uint64_t grain, const std::function<void(std::uint64_t, std::uint64_t)>& body);

 private:
  void work_loop();
  void run_chunks();

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;      // workers block here for a new loop (generation_ changes)
  std::condition_variable finished_;  // the caller blocks here for busy_ to reach 0
  unsigned sleeping_workers_ = 0;     // workers blocked on wake_; guarded by mutex_
  bool caller_sleeping_ = false;      // the caller is blocked on finished_; guarded by mutex_

  // Bumped per loop (release) after the loop's fields below are written; changed under mutex_.
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<unsigned> busy_{0};     // workers still inside the current loop
  std::atomic<bool> stop_{false};

  // The current loop: written by the caller before it bumps generation_, read by workers after.
  const std::function<void(std::uint64_t, std::uint64_t)>* body_ = nullptr;
  std::uint64_t n_ = 0;
  std::uint64_t grain_ = 1;
  std::atomic<std::uint64_t> next_{0};  // next chunk start
};

}  // namespace gpukv::detail
