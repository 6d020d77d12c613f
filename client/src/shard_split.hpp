// Splitting a call's packed columns by shard and merging the shards' answers back in input order: what the
// cluster client's batch calls and its stream share. Templates over the request and response messages, which
// differ only in which columns they carry (ops for a stream, values for writes, values back for GETs).
#pragma once

#include <google/protobuf/repeated_field.h>
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gpukv/v1/kv.pb.h"
#include "gpukv/v1/shard_map.hpp"
#include "result_columns.hpp"

namespace gpukv::client::detail {

// Which shard each op of a call goes to, and the parts that result: part p carries the ops of shard
// shards[p], in input order.
struct SplitPlan {
  static constexpr std::uint32_t kNoPart = std::numeric_limits<std::uint32_t>::max();
  std::vector<std::uint32_t> part_of_op;     // per op: its part
  std::vector<std::uint32_t> shards;         // per part: its shard, ascending
  std::vector<std::uint32_t> part_ops;       // per part: its op count
  std::size_t ops() const { return part_of_op.size(); }
};

inline bool is_write(char kind) { return kind == v1::OP_PUT || kind == v1::OP_PUT_IF_ABSENT; }

// The request's op kinds (a stream's ops column), or none for a batch call (one kind for all).
template <class Request>
const std::string* kinds_of(const Request& r) {
  if constexpr (requires { r.ops(); }) return &r.ops();
  return nullptr;
}

// Checks the request's columns (what the server would refuse as malformed) and plans its split. Returns an
// error message, or empty.
template <class Request>
std::string plan_split(const ShardMap& map, const Request& request, SplitPlan* plan) {
  const std::size_t n = static_cast<std::size_t>(request.key_lengths_size());
  const std::string* kinds = kinds_of(request);
  if (kinds != nullptr && kinds->size() != n) {
    return std::to_string(kinds->size()) + " ops but " + std::to_string(n) + " key_lengths";
  }
  std::uint64_t key_bytes = 0;
  for (const std::uint32_t len : request.key_lengths()) key_bytes += len;
  if (key_bytes != request.keys().size()) {
    return "key_lengths add up to " + std::to_string(key_bytes) + " bytes, keys has " + std::to_string(request.keys().size());
  }
  if constexpr (requires { request.values(); }) {
    std::size_t writes = n;  // a BatchPut: every op writes
    if (kinds != nullptr) {
      writes = 0;
      for (const char k : *kinds) writes += is_write(k);
    }
    if (static_cast<std::size_t>(request.value_lengths_size()) != writes) {
      return std::to_string(writes) + " write operations but " + std::to_string(request.value_lengths_size()) + " value_lengths";
    }
    std::uint64_t value_bytes = 0;
    for (const std::uint32_t len : request.value_lengths()) value_bytes += len;
    if (value_bytes != request.values().size()) {
      return "value_lengths add up to " + std::to_string(value_bytes) + " bytes, values has " + std::to_string(request.values().size());
    }
  }
  std::vector<std::uint32_t> part_of_shard(map.shard_count(), SplitPlan::kNoPart);
  plan->part_of_op.resize(n);
  plan->shards.clear();
  plan->part_ops.clear();
  std::vector<std::uint32_t> shard_of_op(n);
  std::size_t offset = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t len = request.key_lengths(static_cast<int>(i));
    shard_of_op[i] = map.shard_of(std::string_view(request.keys()).substr(offset, len));
    offset += len;
    part_of_shard[shard_of_op[i]] = 0;  // marks the shards that take part
  }
  for (std::uint32_t s = 0; s < map.shard_count(); ++s) {
    if (part_of_shard[s] == SplitPlan::kNoPart) continue;
    part_of_shard[s] = static_cast<std::uint32_t>(plan->shards.size());
    plan->shards.push_back(s);
  }
  plan->part_ops.assign(plan->shards.size(), 0);
  for (std::size_t i = 0; i < n; ++i) {
    plan->part_of_op[i] = part_of_shard[shard_of_op[i]];
    ++plan->part_ops[plan->part_of_op[i]];
  }
  return {};
}

// The parts' requests, their columns copied from the checked request in input order.
template <class Request>
void split_request(const Request& request, const SplitPlan& plan, std::vector<Request>* parts) {
  parts->assign(plan.shards.size(), Request{});
  for (std::size_t p = 0; p < parts->size(); ++p) {
    (*parts)[p].mutable_key_lengths()->Reserve(static_cast<int>(plan.part_ops[p]));
    if constexpr (requires { request.if_absent(); }) (*parts)[p].set_if_absent(request.if_absent());
  }
  const std::string* kinds = kinds_of(request);
  std::size_t key_offset = 0, value_offset = 0, write_index = 0;
  for (std::size_t i = 0; i < plan.ops(); ++i) {
    Request& part = (*parts)[plan.part_of_op[i]];
    const std::uint32_t key_len = request.key_lengths(static_cast<int>(i));
    part.mutable_keys()->append(request.keys(), key_offset, key_len);
    part.add_key_lengths(key_len);
    key_offset += key_len;
    if constexpr (requires { request.ops(); }) part.mutable_ops()->push_back((*kinds)[i]);
    if constexpr (requires { request.values(); }) {
      if (kinds == nullptr || is_write((*kinds)[i])) {
        const std::uint32_t value_len = request.value_lengths(static_cast<int>(write_index++));
        part.mutable_values()->append(request.values(), value_offset, value_len);
        part.add_value_lengths(value_len);
        value_offset += value_len;
      }
    }
  }
}

// What a key gets when its shard's part failed: RESULT_FULL if the shard refused the part whole
// (RESOURCE_EXHAUSTED: nothing of it applied), else RESULT_UNAVAILABLE (its outcome is unknown).
inline char failed_result(const grpc::Status& status) {
  return static_cast<char>(status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ? v1::RESULT_FULL : v1::RESULT_UNAVAILABLE);
}

// Checks a part's answer against its request before it is read by index: the result columns, and one owner
// per RESULT_WRONG_SHARD. Returns an error message, or empty.
template <class Response>
std::string check_part(const Response& response, std::size_t ops) {
  std::string error;
  if constexpr (requires { response.values(); }) {
    error = check_result_columns(ops, response.results(), response.value_lengths(), response.values());
  } else {
    error = check_result_columns(ops, response.results());
  }
  if (!error.empty()) return error;
  std::size_t wrong = 0;
  for (const char r : response.results()) wrong += r == static_cast<char>(v1::RESULT_WRONG_SHARD);
  if (wrong != static_cast<std::size_t>(response.owners_size())) {
    return std::to_string(response.owners_size()) + " owners for " + std::to_string(wrong) + " WRONG_SHARD results";
  }
  return {};
}

// Merges the parts' answers into one response in input order. A part whose status is not OK (a failed call,
// or an answer check_part refused) contributes failed_result() for each of its keys and no values.
template <class Response>
void merge_responses(const SplitPlan& plan, const std::vector<Response>& parts, const std::vector<grpc::Status>& status,
                     Response* out) {
  constexpr bool kValues = requires { out->values(); };
  const std::size_t n = plan.ops();
  std::string* results = out->mutable_results();
  results->resize(n);
  out->mutable_owners()->Clear();
  std::vector<std::size_t> next(parts.size(), 0), next_value(parts.size(), 0), next_owner(parts.size(), 0);
  if constexpr (kValues) {
    out->mutable_values()->clear();
    out->mutable_value_lengths()->Resize(static_cast<int>(n), 0);
  }
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t p = plan.part_of_op[i];
    const std::size_t at = next[p]++;
    if (!status[p].ok()) {
      (*results)[i] = failed_result(status[p]);
      if constexpr (kValues) out->set_value_lengths(static_cast<int>(i), 0);
      continue;
    }
    const Response& part = parts[p];
    (*results)[i] = part.results()[at];
    if ((*results)[i] == static_cast<char>(v1::RESULT_WRONG_SHARD)) {
      out->add_owners(part.owners(static_cast<int>(next_owner[p]++)));
    }
    if constexpr (kValues) {
      const std::uint32_t len = part.value_lengths().empty() ? 0 : part.value_lengths(static_cast<int>(at));
      out->set_value_lengths(static_cast<int>(i), len);
      out->mutable_values()->append(part.values(), next_value[p], len);
      next_value[p] += len;
    }
  }
}

}  // namespace gpukv::client::detail
