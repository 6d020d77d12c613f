// Splitting a call's packed columns by shard and merging the shards' answers back in input order: what the
// cluster client's batch calls and its stream share. Templates over the request and response messages, which
// differ only in which columns they carry (ops for a stream, values for writes, values back for GETs).
#pragma once

#include <google/protobuf/repeated_field.h>
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gpukv/stream.hpp"
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
      for (const char k : *kinds) writes += carries_value(static_cast<v1::OpKind>(k));
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
  const char* key = request.keys().data();
  const std::uint32_t* key_len = request.key_lengths().data();
  for (std::size_t i = 0; i < n; ++i) {
    shard_of_op[i] = map.shard_of(std::string_view(key, key_len[i]));
    key += key_len[i];
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

// The parts' requests, their columns copied from the checked request in input order. Each column is sized
// once and filled with plain copies: per-key appends through protobuf's accessors cost more than the copies.
template <class Request>
void split_request(const Request& request, const SplitPlan& plan, std::vector<Request>* parts) {
  constexpr bool kOps = requires { request.ops(); };
  constexpr bool kValues = requires { request.values(); };
  const std::size_t part_count = plan.shards.size();
  const std::string* kinds = kinds_of(request);
  const std::uint32_t* key_len = request.key_lengths().data();
  const std::uint32_t* value_len = nullptr;
  if constexpr (kValues) value_len = request.value_lengths().data();
  const auto writes_at = [kinds](std::size_t i) { return kinds == nullptr || carries_value(static_cast<v1::OpKind>((*kinds)[i])); };

  struct Part {
    std::size_t key_bytes = 0, value_bytes = 0, writes = 0;
    char* key = nullptr;
    std::uint32_t* key_len = nullptr;
    char* kind = nullptr;
    char* value = nullptr;
    std::uint32_t* value_len = nullptr;
  };
  std::vector<Part> part(part_count);
  for (std::size_t i = 0, w = 0; i < plan.ops(); ++i) {
    Part& to = part[plan.part_of_op[i]];
    to.key_bytes += key_len[i];
    if constexpr (kValues) {
      if (writes_at(i)) {
        to.value_bytes += value_len[w++];
        ++to.writes;
      }
    }
  }
  parts->assign(part_count, Request{});
  for (std::size_t p = 0; p < part_count; ++p) {
    Request& r = (*parts)[p];
    Part& to = part[p];
    if constexpr (requires { request.if_absent(); }) r.set_if_absent(request.if_absent());
    r.mutable_keys()->resize(to.key_bytes);
    to.key = r.mutable_keys()->data();
    r.mutable_key_lengths()->Resize(static_cast<int>(plan.part_ops[p]), 0);
    to.key_len = r.mutable_key_lengths()->mutable_data();
    if constexpr (kOps) {
      r.mutable_ops()->resize(plan.part_ops[p]);
      to.kind = r.mutable_ops()->data();
    }
    if constexpr (kValues) {
      r.mutable_values()->resize(to.value_bytes);
      to.value = r.mutable_values()->data();
      r.mutable_value_lengths()->Resize(static_cast<int>(to.writes), 0);
      to.value_len = r.mutable_value_lengths()->mutable_data();
    }
  }
  const char* key = request.keys().data();
  const char* value = nullptr;
  if constexpr (kValues) value = request.values().data();
  for (std::size_t i = 0, w = 0; i < plan.ops(); ++i) {
    Part& to = part[plan.part_of_op[i]];
    std::memcpy(to.key, key, key_len[i]);
    to.key += key_len[i];
    key += key_len[i];
    *to.key_len++ = key_len[i];
    if constexpr (kOps) *to.kind++ = (*kinds)[i];
    if constexpr (kValues) {
      if (writes_at(i)) {
        const std::uint32_t len = value_len[w++];
        std::memcpy(to.value, value, len);
        to.value += len;
        value += len;
        *to.value_len++ = len;
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
// or an answer check_part refused) contributes failed_result() for each of its keys and no values. Like the
// split, each column is sized once and filled with plain copies.
template <class Response>
void merge_responses(const SplitPlan& plan, const std::vector<Response>& parts, const std::vector<grpc::Status>& status,
                     Response* out) {
  constexpr bool kValues = requires { out->values(); };
  const std::size_t n = plan.ops();
  // Where each part's next answer is read from (checked by check_part when its status is OK).
  struct Part {
    bool ok = false;
    char failed = 0;
    const char* result = nullptr;
    const std::uint32_t* value_len = nullptr;  // null when the part sent no value_lengths (all lengths 0)
    const char* value = nullptr;
    int owner = 0;
  };
  std::vector<Part> part(parts.size());
  std::size_t value_bytes = 0;
  for (std::size_t p = 0; p < parts.size(); ++p) {
    Part& from = part[p];
    from.ok = status[p].ok();
    from.failed = failed_result(status[p]);
    if (!from.ok) continue;
    from.result = parts[p].results().data();
    if constexpr (kValues) {
      if (!parts[p].value_lengths().empty()) from.value_len = parts[p].value_lengths().data();
      from.value = parts[p].values().data();
      value_bytes += parts[p].values().size();
    }
  }
  std::string* results = out->mutable_results();
  results->resize(n);
  char* result = results->data();
  out->mutable_owners()->Clear();
  char* value = nullptr;
  std::uint32_t* value_len = nullptr;
  if constexpr (kValues) {
    out->mutable_values()->resize(value_bytes);
    value = out->mutable_values()->data();
    out->mutable_value_lengths()->Resize(static_cast<int>(n), 0);
    value_len = out->mutable_value_lengths()->mutable_data();
  }
  for (std::size_t i = 0; i < n; ++i) {
    Part& from = part[plan.part_of_op[i]];
    if (!from.ok) {
      result[i] = from.failed;
      continue;  // value length stays 0
    }
    result[i] = *from.result++;
    if (result[i] == static_cast<char>(v1::RESULT_WRONG_SHARD)) out->add_owners(parts[plan.part_of_op[i]].owners(from.owner++));
    if constexpr (kValues) {
      const std::uint32_t len = from.value_len == nullptr ? 0 : *from.value_len++;
      std::memcpy(value, from.value, len);
      value += len;
      from.value += len;
      value_len[i] = len;
    }
  }
}

}  // namespace gpukv::client::detail
