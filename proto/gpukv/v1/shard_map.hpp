// The key-to-shard function of gpukv's cluster mode, written once: the server (which refuses keys it does
// not own), the client library, the gpukv CLI and gpukv-load all call it. README ("Cluster mode") defines it
// exactly, for clients in other languages:
//
//   slot  = CRC-16/XMODEM(key bytes) mod 16384      poly 0x1021, init 0, MSB first, no final xor
//                                                   (Redis Cluster's key slot, without hash tags)
//   shard = jump_consistent_hash(slot, shard_count) Lamping and Veach, "A Fast, Minimal Memory,
//                                                   Consistent Hash Algorithm" (2014), on 64-bit integers
//                                                   and IEEE doubles
//
// Why these: CRC-16/XMODEM is in every language's standard library or Redis client (Python's
// binascii.crc_hqx(key, 0)), and it is unrelated to the table's own key hash, so the keys one shard owns
// still spread over all of its table. A fixed slot space keeps a later move of slots between shards
// possible. Jump hashing gives each of N shards 1/N of the slots, and going from N to N+1 shards moves
// about 1/(N+1) of them (each to the new shard), where contiguous slot ranges would move about half.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace gpukv {

inline constexpr std::uint32_t kSlotCount = 16384;

// CRC-16/XMODEM of the key's bytes, mod kSlotCount.
std::uint32_t key_slot(std::string_view key);

// Lamping and Veach's jump consistent hash: a bucket in [0, buckets) for `key`; buckets >= 1.
std::uint32_t jump_consistent_hash(std::uint64_t key, std::uint32_t buckets);

// Slots to shards for one shard count, worked out once (16384 entries of 2 bytes, which stay in cache).
class ShardMap {
 public:
  // Throws std::invalid_argument unless 1 <= shard_count <= kSlotCount.
  explicit ShardMap(std::uint32_t shard_count);

  std::uint32_t shard_count() const { return shard_count_; }
  std::uint32_t shard_of_slot(std::uint32_t slot) const { return shard_of_slot_[slot]; }
  std::uint32_t shard_of(std::string_view key) const {
    return shard_count_ == 1 ? 0 : shard_of_slot_[key_slot(key)];
  }

 private:
  std::uint32_t shard_count_;
  std::vector<std::uint16_t> shard_of_slot_;
};

}  // namespace gpukv
