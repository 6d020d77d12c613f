// A fixed pool of worker threads that runs one parallel loop at a time: the CPU backend's "grid".
// The calling thread takes part, so a pool of N threads has N-1 workers. Small loops run on the caller alone.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace gpukv::detail {

class ThreadPool {
 public:
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
  std::condition_variable wake_;      // workers wait here for a new loop (generation_ changes)
  std::condition_variable finished_;  // the caller waits here for busy_ to reach 0
  std::uint64_t generation_ = 0;      // bumped per loop; guarded by mutex_
  unsigned busy_ = 0;                 // workers still inside the current loop; guarded by mutex_
  bool stop_ = false;                 // guarded by mutex_

  // The current loop; written by the caller before bumping generation_ under mutex_.
  const std::function<void(std::uint64_t, std::uint64_t)>* body_ = nullptr;
  std::uint64_t n_ = 0;
  std::uint64_t grain_ = 1;
  std::atomic<std::uint64_t> next_{0};  // next chunk start
};

}  // namespace gpukv::detail
