// A fixed pool of worker threads that runs one parallel loop at a time: the CPU backend's "grid".
// The calling thread takes part, so a pool of N threads has N-1 workers. Small loops run on the caller alone.
//
// A loop is cut into chunks that threads claim one at a time, and the caller returns once every chunk has
// run, whoever ran it: it never waits for a worker that has not woken yet. On a machine whose cores are
// busy with other work (the server's gRPC threads, its clients), a worker can take a hundred microseconds or
// more to be scheduled; had the caller waited for each worker to check in, every loop of a pass would have
// cost that much (on the 2-core VM a batch of 2048 GETs took twice as long with a pool of two threads as
// with one). A worker that wakes after the chunks are gone finds nothing to claim and goes back to waiting.
//
// A pass is several loops back to back (a few microseconds apart), and a batch is one or a few passes. So
// a worker that finishes a loop, and a caller waiting for the chunks others claimed, spin for a short while
// before they block: a wake-up costs a context switch, which on a virtual machine costs tens of
// microseconds. The spin is short, so a pool idle between batches gives its cores back to the process.
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
  // How long a thread spins for the next loop (a worker) or for the chunks others run (the caller) before
  // it blocks.
  static constexpr std::chrono::microseconds kSpin{20};

  explicit ThreadPool(unsigned threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  unsigned threads() const { return static_cast<unsigned>(workers_.size()) + 1; }

  // Calls body(begin, end) over [0, n) in chunks of `grain` (more if n needs over 2^32 chunks), from all
  // threads; returns when all are done. Not reentrant: one loop at a time (the table serialises its passes).
  void parallel_for(std::uint64_t n, std::uint64_t grain, const std::function<void(std::uint64_t, std::uint64_t)>& body);

 private:
  void work_loop();
  // Claims and runs chunks of the published loop until none is left.
  void run_chunks();

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;      // workers block here for a new loop (generation_ changes)
  std::condition_variable finished_;  // the caller blocks here for chunks_done_ to reach the loop's chunks
  unsigned sleeping_workers_ = 0;     // workers blocked on wake_; guarded by mutex_
  bool caller_sleeping_ = false;      // the caller is blocked on finished_; guarded by mutex_

  std::atomic<std::uint64_t> generation_{0};  // bumped per loop, under mutex_: wakes the workers
  std::atomic<bool> stop_{false};

  // The chunk cursor: the loop's chunk count in the high 32 bits, the next unclaimed chunk in the low 32.
  // A claim is a compare-exchange of the whole word, so it succeeds only on a chunk that exists in the
  // loop published now: between loops next == count, and a worker that read the word of a loop that has
  // since ended fails its exchange (or, should a new loop's word equal it exactly, claims a real chunk of
  // that loop, whose fields it reads only after the claim).
  std::atomic<std::uint64_t> cursor_{0};
  std::atomic<std::uint64_t> chunks_done_{0};  // chunks of the current loop that have run

  // The current loop: written by the caller before it publishes cursor_ (release), read after a claim.
  const std::function<void(std::uint64_t, std::uint64_t)>* body_ = nullptr;
  std::uint64_t n_ = 0;
  std::uint64_t grain_ = 1;
};

}  // namespace gpukv::detail
