// Cluster mode on the server: which keys of a call belong to other shards, and how a call with such keys
// runs. The keys this shard owns go to the batcher as a call of their own (their columns copied out); the
// foreign ones are answered WRONG_SHARD and never reach the table. A call whose keys are all owned (every
// call from a routing client) runs as it came, and a server that is not sharded checks nothing.
//
// Knows nothing of gRPC: the service passes CallOps and CallResults, and writes the owners into its response.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "batcher/call.hpp"
#include "gpukv/v1/shard_map.hpp"

namespace gpukv::server {

// This server's place in the cluster.
class ShardFilter {
 public:
  // Throws std::invalid_argument unless shard_index < shard_count (ShardMap checks the count).
  ShardFilter(std::uint32_t shard_index, std::uint32_t shard_count);

  std::uint32_t index() const { return index_; }
  std::uint32_t count() const { return map_.shard_count(); }
  std::uint32_t owner(std::string_view key) const { return map_.shard_of(key); }

  // The ops of `ops` whose keys belong to other shards: their positions (ascending) and owners. Empty when
  // not sharded. The key lengths must add up to the keys (check_columns).
  struct Foreign {
    std::vector<std::uint32_t> ops;
    std::vector<std::uint32_t> owners;
  };
  Foreign foreign_ops(const CallOps& ops) const;

 private:
  std::uint32_t index_;
  ShardMap map_;
};

// The result byte of a foreign key (v1::RESULT_WRONG_SHARD; the table's own codes end before it).
inline constexpr char kWrongShard = 5;

// A call with foreign keys: the owned ops as a call of their own, and how their results go back into the
// whole call's result columns. The call's memory must outlive this object, and this object the owned call.
class OwnedPart {
 public:
  // `results` is where the whole call's results go (its value lengths zeroed, as CallResults says);
  // `foreign` holds the positions ShardFilter::foreign_ops found, ascending.
  OwnedPart(const CallOps& ops, CallResults* results, std::vector<std::uint32_t> foreign);

  // The owned ops (empty when every key is foreign: nothing to run) and where the batcher writes their
  // results. Their values go straight to the whole call's value buffer: foreign keys have no value, so the
  // owned GETs' values packed in order are the call's.
  const CallOps& ops() const { return owned_; }
  CallResults* results() { return &owned_results_; }

  // After the owned call succeeded (or at once if it is empty): puts its results in their places, marks the
  // foreign keys kWrongShard, and sets the call's values_size.
  void scatter();
  const std::vector<std::uint32_t>& foreign() const { return foreign_; }

 private:
  CallOps owned_;
  std::string kinds_, keys_, values_;                          // the owned ops' columns
  std::vector<std::uint32_t> key_lengths_, value_lengths_;
  CallResults* call_results_;                                   // the whole call's
  CallResults owned_results_;
  std::string results_;                                         // the owned ops' result bytes
  std::vector<std::uint32_t> owned_value_lengths_;
  std::vector<std::uint32_t> foreign_;
  std::size_t count_;                                           // ops in the whole call
};

}  // namespace gpukv::server
