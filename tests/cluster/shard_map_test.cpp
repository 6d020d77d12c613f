// The key-to-shard function and what parses cluster settings: the slot is Redis Cluster's key slot, jump
// hashing spreads slots evenly and moves about 1/(N+1) of them from N to N+1 shards, target lists expand
// ranges, --shard_index=auto reads a StatefulSet ordinal, and the server's split of a call into the ops it
// owns puts every result back in its place. (The agreement with README's definition, implemented in Python,
// is tests/e2e/test_cluster_e2e.py.)
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "gpukv/cluster.hpp"
#include "gpukv/v1/shard_map.hpp"
#include "service/shard_filter.hpp"
#include "service/shard_index.hpp"

namespace gpukv {
namespace {

TEST(KeySlot, IsRedisClustersKeySlot) {
  // CRC-16/XMODEM's check value, and slots Redis documents for CLUSTER KEYSLOT.
  EXPECT_EQ(key_slot("123456789"), 0x31C3u);
  EXPECT_EQ(key_slot("foo"), 12182u);
  EXPECT_EQ(key_slot("somekey"), 11058u);
  EXPECT_EQ(key_slot("hello"), 866u);
  EXPECT_EQ(key_slot(std::string("\0\xff", 2)), key_slot(std::string("\0\xff", 2)));
  EXPECT_NE(key_slot("ab"), key_slot(std::string("ab\0", 3))) << "length is part of a key";
  for (int i = 0; i < 1000; ++i) EXPECT_LT(key_slot("key:" + std::to_string(i)), kSlotCount);
}

// CRC-16/XMODEM one bit at a time, as its definition reads: the reference for the table-driven key_slot.
std::uint32_t bitwise_slot(std::string_view key) {
  std::uint32_t crc = 0;
  for (const char c : key) {
    crc ^= static_cast<std::uint32_t>(static_cast<std::uint8_t>(c)) << 8;
    for (int bit = 0; bit < 8; ++bit) crc = ((crc & 0x8000) != 0 ? (crc << 1) ^ 0x1021 : crc << 1) & 0xFFFF;
  }
  return crc % kSlotCount;
}

TEST(KeySlot, EqualsTheBitwiseDefinitionForEveryLengthAndByte) {
  std::mt19937_64 rng(16384);
  for (int round = 0; round < 20000; ++round) {
    std::string key(rng() % 80, '\0');  // every length up to past the 8-byte blocks, with a tail of each size
    for (char& c : key) c = static_cast<char>(rng());
    ASSERT_EQ(key_slot(key), bitwise_slot(key)) << "length " << key.size();
  }
}

TEST(JumpConsistentHash, MatchesKnownValuesAndStaysInRange) {
  EXPECT_EQ(jump_consistent_hash(0, 1), 0u);
  EXPECT_EQ(jump_consistent_hash(12182, 3), 2u);
  EXPECT_EQ(jump_consistent_hash(866, 10), 3u);
  EXPECT_EQ(jump_consistent_hash(1ull << 63, 1000), 453u);
  for (std::uint64_t k = 0; k < 1000; ++k) EXPECT_LT(jump_consistent_hash(k * 7919, 7), 7u);
}

TEST(ShardMap, GivesEachShardAnEqualShareOfTheSlots) {
  for (const std::uint32_t n : {1u, 2u, 3u, 5u, 8u, 16u, 100u}) {
    const ShardMap map(n);
    std::vector<std::uint32_t> slots(n, 0);
    for (std::uint32_t s = 0; s < kSlotCount; ++s) ++slots[map.shard_of_slot(s)];
    const double share = static_cast<double>(kSlotCount) / n;
    for (std::uint32_t i = 0; i < n; ++i) {
      EXPECT_NEAR(slots[i], share, 0.15 * share + 8) << n << " shards, shard " << i;
    }
  }
}

TEST(ShardMap, GrowingByOneShardMovesAboutItsShareAndOnlyToTheNewShard) {
  for (std::uint32_t n = 1; n < 12; ++n) {
    const ShardMap before(n), after(n + 1);
    std::uint32_t moved = 0;
    for (std::uint32_t s = 0; s < kSlotCount; ++s) {
      if (before.shard_of_slot(s) == after.shard_of_slot(s)) continue;
      ++moved;
      EXPECT_EQ(after.shard_of_slot(s), n) << "slot " << s << " moved between old shards going from " << n << " to " << n + 1;
    }
    const double expected = static_cast<double>(kSlotCount) / (n + 1);
    EXPECT_NEAR(moved, expected, 0.1 * expected) << n << " -> " << n + 1 << " shards";
  }
}

TEST(ShardMap, RefusesAShardCountOutsideTheSlots) {
  EXPECT_THROW(ShardMap(0), std::invalid_argument);
  EXPECT_THROW(ShardMap(kSlotCount + 1), std::invalid_argument);
  EXPECT_EQ(ShardMap(kSlotCount).shard_count(), kSlotCount);
  const ShardMap one(1);
  EXPECT_EQ(one.shard_of("anything"), 0u);
}

TEST(ParseTargets, ExpandsRangesAndRejectsMalformedLists) {
  using client::parse_targets;
  EXPECT_EQ(parse_targets("a:1"), (std::vector<std::string>{"a:1"}));
  EXPECT_EQ(parse_targets("a:1, b:2"), (std::vector<std::string>{"a:1", "b:2"}));
  EXPECT_EQ(parse_targets("gpukv-{0..2}.gpukv-shards.gpukv.svc:50051"),
            (std::vector<std::string>{"gpukv-0.gpukv-shards.gpukv.svc:50051", "gpukv-1.gpukv-shards.gpukv.svc:50051",
                                      "gpukv-2.gpukv-shards.gpukv.svc:50051"}));
  EXPECT_EQ(parse_targets("127.0.0.1:{7000..7001},h:9"), (std::vector<std::string>{"127.0.0.1:7000", "127.0.0.1:7001", "h:9"}));
  for (const char* bad : {"", "a:1,", ",a:1", "x-{1..0}", "x-{0..}", "x-{a..b}", "x-{0..1", "x-}", "x-{0..1}{0..1}"}) {
    EXPECT_THROW(parse_targets(bad), std::invalid_argument) << bad;
  }
}

TEST(ParseShardIndex, TakesANumberOrAStatefulSetOrdinal) {
  using server::parse_shard_index;
  EXPECT_EQ(parse_shard_index("0", "anything"), 0u);
  EXPECT_EQ(parse_shard_index("7", "anything"), 7u);
  EXPECT_EQ(parse_shard_index("auto", "gpukv-3"), 3u);
  EXPECT_EQ(parse_shard_index("auto", "my-gpukv-12"), 12u);
  for (const char* bad_flag : {"", "-1", "1x", "x", "99999999999"}) {
    EXPECT_THROW(parse_shard_index(bad_flag, "gpukv-0"), std::invalid_argument) << bad_flag;
  }
  for (const char* bad_host : {"gpukv", "gpukv-", "gpukv-3a", "localhost"}) {
    try {
      parse_shard_index("auto", bad_host);
      ADD_FAILURE() << bad_host << " was taken";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(bad_host), std::string::npos) << e.what();
    }
  }
}

// The server's split: a mixed call's owned ops run as their own call, and their results, value lengths and
// packed values land where the whole call expects them; foreign ops read WRONG_SHARD.
TEST(OwnedPart, PutsTheOwnedOpsResultsBackInTheirPlaces) {
  const server::ShardFilter filter(1, 3);
  std::vector<std::string> keys;
  for (int i = 0; keys.size() < 12; ++i) keys.push_back("k" + std::to_string(i));
  std::string kinds, packed_keys, values;
  std::vector<std::uint32_t> key_lengths, value_lengths;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const OpKind kind = i % 3 == 0 ? OpKind::kPut : i % 3 == 1 ? OpKind::kGet : OpKind::kDelete;
    kinds.push_back(static_cast<char>(kind));
    packed_keys += keys[i];
    key_lengths.push_back(static_cast<std::uint32_t>(keys[i].size()));
    if (kind == OpKind::kPut) {
      values += "value" + std::to_string(i);
      value_lengths.push_back(static_cast<std::uint32_t>(("value" + std::to_string(i)).size()));
    }
  }
  server::CallOps ops{keys.size(), kinds, OpKind::kGet, packed_keys, key_lengths.data(), values, value_lengths.data()};
  const server::ShardFilter::Foreign foreign = filter.foreign_ops(ops);
  ASSERT_FALSE(foreign.ops.empty());
  ASSERT_LT(foreign.ops.size(), keys.size()) << "pick keys that shard 1 owns too";
  for (std::size_t j = 0; j < foreign.ops.size(); ++j) {
    EXPECT_NE(foreign.owners[j], 1u);
    EXPECT_EQ(foreign.owners[j], filter.owner(keys[foreign.ops[j]]));
  }

  std::string results(keys.size(), '\x7f'), out_values(64 * keys.size(), '\0');
  std::vector<std::uint32_t> out_lengths(keys.size(), 0);
  server::CallResults whole{results.data(), out_values.data(), out_lengths.data()};
  server::OwnedPart part(ops, &whole, foreign.ops);
  const server::CallOps& owned = part.ops();
  ASSERT_EQ(owned.count, keys.size() - foreign.ops.size());
  // Answer the owned call as the batcher would: op j gets result j % 2, each found GET a value "v<j>".
  server::CallResults* r = part.results();
  std::size_t packed = 0;
  std::map<std::string, std::string> found;  // key -> value given
  std::size_t key_offset = 0;
  for (std::size_t j = 0; j < owned.count; ++j) {
    const std::string key(owned.keys.substr(key_offset, owned.key_lengths[j]));
    key_offset += owned.key_lengths[j];
    r->results[j] = static_cast<char>(j % 2);
    if (server::is_get(server::kind_at(owned, j)) && j % 2 == 0) {
      const std::string v = "v" + std::to_string(j);
      std::copy(v.begin(), v.end(), r->values + packed);
      r->value_lengths[j] = static_cast<std::uint32_t>(v.size());
      packed += v.size();
      found[key] = v;
    }
  }
  r->values_size = packed;
  part.scatter();

  std::size_t next_foreign = 0, j = 0, value_at = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (next_foreign < foreign.ops.size() && foreign.ops[next_foreign] == i) {
      EXPECT_EQ(results[i], server::kWrongShard) << i;
      EXPECT_EQ(out_lengths[i], 0u) << i;
      ++next_foreign;
      continue;
    }
    EXPECT_EQ(results[i], static_cast<char>(j % 2)) << i;
    const auto it = found.find(keys[i]);
    const std::string expected = it == found.end() ? "" : it->second;
    EXPECT_EQ(out_lengths[i], expected.size()) << i;
    EXPECT_EQ(out_values.substr(value_at, out_lengths[i]), expected) << i;
    value_at += out_lengths[i];
    ++j;
  }
  EXPECT_EQ(whole.values_size, packed);
}

}  // namespace
}  // namespace gpukv
