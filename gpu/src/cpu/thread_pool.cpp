#include "thread_pool.hpp"

#include <algorithm>

namespace gpukv::detail {

ThreadPool::ThreadPool(unsigned threads) {
  const unsigned total = threads == 0 ? std::max(1u, std::thread::hardware_concurrency()) : threads;
  workers_.reserve(total - 1);
  for (unsigned i = 1; i < total; ++i) workers_.emplace_back([this] { work_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunks() {
  for (;;) {
    const std::uint64_t begin = next_.fetch_add(grain_, std::memory_order_relaxed);
    if (begin >= n_) return;
    (*body_)(begin, std::min(n_, begin + grain_));
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
  {
    std::lock_guard lock(mutex_);
    body_ = &body;
    n_ = n;
    grain_ = grain;
    next_.store(0, std::memory_order_relaxed);
    busy_ = static_cast<unsigned>(workers_.size());
    ++generation_;
  }
  wake_.notify_all();
  run_chunks();
  std::unique_lock lock(mutex_);
  finished_.wait(lock, [this] { return busy_ == 0; });
  body_ = nullptr;
}

void ThreadPool::work_loop() {
  std::uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_chunks();
    bool last;
    {
      std::lock_guard lock(mutex_);
      last = --busy_ == 0;
    }
    if (last) finished_.notify_one();
  }
}

}  // namespace gpukv::detail
