// What the batcher reports after each batch (for metrics).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "batching_policy.hpp"
#include "gpukv/types.hpp"

namespace gpukv::server {

using ResultCounts = std::array<std::array<std::uint64_t, 5>, kOpKindCount>;  // [kind][OpStatus]

struct BatchReport {
  std::size_t ops = 0;
  Clock::duration queue_delay{};  // how long the batch's oldest operation waited before the batch started
  Clock::duration stage_time{};   // copying the calls' columns into the batch, summed over the threads that did
  Clock::duration execute_time{};
  Clock::duration answer_time{};  // from executed to the last of its calls answered (results written, done() run)
  ResultCounts results{};         // [kind][OpStatus] counts
  TableStats table{};             // the table's figures right after the batch ran
};

}  // namespace gpukv::server
