// What a client call is to the batcher: its operations as packed columns (CallOps), where its results go
// (CallResults), how it ends (CallCode) and the callback that ends it (Call). The service adapts gRPC
// requests to these; the batcher knows nothing of gRPC.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>

#include "batching_policy.hpp"
#include "gpukv/types.hpp"

namespace gpukv::server {

// A call's operations as packed columns, the wire format of the batch and stream calls (a unary call is
// one op). The memory must stay valid until the call's done() has run.
struct CallOps {
  std::size_t count = 0;
  std::string_view kinds;                        // one OpKind byte per op; empty: every op is `kind`
  OpKind kind = OpKind::kGet;
  std::string_view keys;                         // concatenated
  const std::uint32_t* key_lengths = nullptr;    // `count` entries
  std::string_view values;                       // the write ops' values, concatenated in op order
  const std::uint32_t* value_lengths = nullptr;  // one per write op
};

// Op i's kind byte (a call without a kinds column has one kind for all); may be out of range: the batcher
// rejects such an op.
inline std::uint8_t kind_at(const CallOps& ops, std::size_t i) {
  return ops.kinds.empty() ? static_cast<std::uint8_t>(ops.kind) : static_cast<std::uint8_t>(ops.kinds[i]);
}
inline bool is_get(std::uint8_t kind) { return kind == static_cast<std::uint8_t>(OpKind::kGet); }
// An op that carries a value (carries_value, gpukv/types.hpp) has one entry of value_lengths.

// The number of GET ops in a call: the caller gives its results room for one value_width value per GET.
inline std::size_t get_count(const CallOps& ops) {
  if (ops.kinds.empty()) return is_get(static_cast<std::uint8_t>(ops.kind)) ? ops.count : 0;
  return static_cast<std::size_t>(std::count(ops.kinds.begin(), ops.kinds.end(), static_cast<char>(OpKind::kGet)));
}

// Where a call's results go: memory the caller owns and sizes (usually its response message's own fields, so
// that nothing is copied once the call is answered), valid until done() has run. With kOk, every op's
// result has been written, each GET that found its key has its length written, and the found values are
// packed in op order at the start of `values`.
struct CallResults {
  char* results = nullptr;                 // one OpStatus byte per op
  char* values = nullptr;                  // room for get_count(ops) * value_width bytes; null if no GETs
  std::uint32_t* value_lengths = nullptr;  // one per op, zeroed by the caller; may be null if no GETs
  std::size_t values_size = 0;             // written before done(kOk): the bytes of `values` used
};

enum class CallCode {
  kOk,
  kDeadlineExceeded,   // the deadline passed before the call's first batch closed; nothing of it was applied
  kUnavailable,        // the batcher is draining or stopped, or the write-ahead log failed the call's writes
  kResourceExhausted,  // the queue is full
  kInternal,           // the table failed while running the call's batch: some of its ops may have been
                       // applied, so it must not be retried as if nothing had happened
};

struct Call {
  CallOps ops;
  CallResults* results = nullptr;
  Clock::time_point deadline = Clock::time_point::max();
  // Runs exactly once: with kOk after every result is written, or with an error (nothing applied, unless the
  // table or the write-ahead log failed). It may run on the caller's thread inside submit() (a refusal), on
  // the execution thread, on the log thread or on a completion thread.
  std::function<void(CallCode, std::string_view message)> done;
};

}  // namespace gpukv::server
