// Checks the result columns a server sent back against the request they answer, before the client reads
// them by index: the batch calls' responses and the stream's are checked alike.
#pragma once

#include <google/protobuf/repeated_field.h>

#include <cstdint>
#include <string>

namespace gpukv::client {

// One result per op; no value lengths (nothing found) or one per op; value lengths that add up to the
// values. Returns what is wrong, or empty.
inline std::string check_result_columns(std::size_t ops, const std::string& results,
                                        const google::protobuf::RepeatedField<std::uint32_t>& value_lengths,
                                        const std::string& values) {
  if (results.size() != ops) return std::to_string(results.size()) + " results for " + std::to_string(ops) + " ops";
  if (!value_lengths.empty() && static_cast<std::size_t>(value_lengths.size()) != ops) {
    return std::to_string(value_lengths.size()) + " value_lengths for " + std::to_string(ops) + " ops";
  }
  std::uint64_t bytes = 0;
  for (const std::uint32_t len : value_lengths) bytes += len;
  if (bytes != values.size()) {
    return "value_lengths add up to " + std::to_string(bytes) + " bytes, values has " + std::to_string(values.size());
  }
  return {};
}

// The batch calls without values (BatchPut, BatchDelete): one result per op.
inline std::string check_result_columns(std::size_t ops, const std::string& results) {
  return check_result_columns(ops, results, {}, {});
}

}  // namespace gpukv::client
