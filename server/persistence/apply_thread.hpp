// Start-up's loading in two stages: the reading thread reads and checks records (the disk, the checksums)
// and queues a copy of each payload; this class's thread decodes them into batches and runs those on the
// table. Read and applied in turn, a 15 GB snapshot loaded at 0.9 GB/s on a disk that reads 1.5 GB/s
// (bench/RESULTS.md, run 43); the applying takes about 7 s of its 10 (run 46). Private to
// server/persistence.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace gpukv::server::persistence {

class ApplyThread {
 public:
  explicit ApplyThread(std::function<std::string(std::string_view payload)> apply)
      : apply_(std::move(apply)), thread_([this] { run(); }) {}
  ~ApplyThread() {
    {
      std::lock_guard lock(mutex_);
      closed_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  ApplyThread(const ApplyThread&) = delete;
  ApplyThread& operator=(const ApplyThread&) = delete;

  // Queues a copy of the payload, labelled for an error message ("snapshot block 3"); waits while kDepth are
  // queued. Returns kStopped once an apply has failed (finish() says why), else empty.
  std::string submit(std::string_view payload, std::string label) {
    std::unique_lock lock(mutex_);
    const auto asked = std::chrono::steady_clock::now();
    changed_.wait(lock, [&] { return queue_.size() < kDepth || !error_.empty(); });
    waited_ += std::chrono::steady_clock::now() - asked;
    if (!error_.empty()) return kStopped;
    Item item;
    if (!spare_.empty()) {  // a buffer an earlier payload used: its pages are mapped already
      item.payload = std::move(spare_.back());
      spare_.pop_back();
    }
    lock.unlock();
    item.payload.assign(payload);
    item.label = std::move(label);
    lock.lock();
    queue_.push_back(std::move(item));
    changed_.notify_all();
    return {};
  }

  // Waits until everything queued is applied; returns the first failure ("label: why"), or empty.
  std::string finish() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return (queue_.empty() && !busy_) || !error_.empty(); });
    return error_;
  }

  static constexpr const char* kStopped = "loading stopped";

  // Where the time went, once finished: applying (this thread busy), and submit() waiting for room (the
  // reading thread held up by the applying).
  double busy_seconds() const { return std::chrono::duration<double>(busy_time_).count(); }
  double waited_seconds() const { return std::chrono::duration<double>(waited_).count(); }

 private:
  static constexpr std::size_t kDepth = 3;
  struct Item {
    std::string payload, label;
  };

  void run() {
    std::unique_lock lock(mutex_);
    while (true) {
      changed_.wait(lock, [&] { return !queue_.empty() || closed_; });
      if (queue_.empty()) return;
      Item item = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      changed_.notify_all();
      lock.unlock();
      const auto start = std::chrono::steady_clock::now();
      std::string error = error_.empty() ? apply_(item.payload) : std::string();
      busy_time_ += std::chrono::steady_clock::now() - start;
      lock.lock();
      busy_ = false;
      if (!error.empty() && error_.empty()) error_ = item.label + ": " + error;
      spare_.push_back(std::move(item.payload));
      changed_.notify_all();
    }
  }

  const std::function<std::string(std::string_view)> apply_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Item> queue_;
  std::vector<std::string> spare_;
  std::string error_;
  bool busy_ = false;
  bool closed_ = false;
  std::chrono::steady_clock::duration busy_time_{}, waited_{};  // busy_time_: this thread's alone
  std::thread thread_;  // last: started once the rest is built
};

}  // namespace gpukv::server::persistence
