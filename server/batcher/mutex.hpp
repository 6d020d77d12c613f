// std::mutex with Abseil's thread-safety annotations, so that clang's -Wthread-safety checks which state each
// mutex guards (ABSL_GUARDED_BY) and which functions need it held (ABSL_EXCLUSIVE_LOCKS_REQUIRED). libstdc++'s
// std::mutex carries no annotations; absl::Mutex does, but would also change the waits, which the batcher's
// latency figures were measured with (bench/RESULTS.md). MutexLock is a std::unique_lock underneath, so
// std::condition_variable waits on it as before.
#pragma once

#include <absl/base/thread_annotations.h>

#include <condition_variable>
#include <mutex>

namespace gpukv::server {

class ABSL_LOCKABLE Mutex {
 public:
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mutex_.lock(); }
  void unlock() ABSL_UNLOCK_FUNCTION() { mutex_.unlock(); }
  // Tells the analysis that the caller holds the mutex (where it cannot follow, e.g. a lambda run under it).
  void assert_held() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
  friend class MutexLock;
  std::mutex mutex_;
};

// Holds a Mutex for its scope; unlock() and lock() give it up for a while and take it back.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex& mutex) ABSL_EXCLUSIVE_LOCK_FUNCTION(mutex) : lock_(mutex.mutex_) {}
  ~MutexLock() ABSL_UNLOCK_FUNCTION() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void unlock() ABSL_UNLOCK_FUNCTION() { lock_.unlock(); }
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { lock_.lock(); }

  // Waits on `cv`, giving the mutex up meanwhile; held again on return.
  void wait(std::condition_variable& cv) { cv.wait(lock_); }
  template <class Predicate>
  void wait(std::condition_variable& cv, Predicate ready) {
    cv.wait(lock_, ready);
  }
  template <class Duration>
  void wait_for(std::condition_variable& cv, Duration d) {
    cv.wait_for(lock_, d);
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace gpukv::server
