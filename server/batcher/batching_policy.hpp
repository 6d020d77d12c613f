// When the batcher launches a device batch: the decision as a pure function of the queue's state and the
// time, so that it is tested without sleeping (Triton's dynamic batcher does the same).
#pragma once

#include <chrono>
#include <cstddef>

namespace gpukv::server {

using Clock = std::chrono::steady_clock;

struct BatchDecision {
  bool launch;               // launch a batch now
  Clock::duration wait;      // otherwise, wait at most this long before deciding again
};

// pending_ops: operations waiting for their batch to close (queued, or in the filling batch); oldest: when
// the oldest of them arrived.
// A batch launches when it would be full, when the oldest operation has waited max_delay, or when the
// batcher is draining; with nothing queued there is nothing to wait for. With launch_when_idle, it also
// launches at once while the table has no batch running or staged (`table_idle`): waiting would only
// delay the first operations, and while a batch runs the next one fills as before.
inline BatchDecision decide_batch(std::size_t pending_ops, Clock::time_point oldest, Clock::time_point now,
                                  std::size_t batch_size, Clock::duration max_delay, bool draining,
                                  bool launch_when_idle = false, bool table_idle = false) {
  if (pending_ops == 0) return {false, Clock::duration::max()};
  if (pending_ops >= batch_size || draining || (launch_when_idle && table_idle)) return {true, Clock::duration::zero()};
  const Clock::duration waited = now - oldest;
  if (waited >= max_delay) return {true, Clock::duration::zero()};
  return {false, max_delay - waited};
}

}  // namespace gpukv::server
