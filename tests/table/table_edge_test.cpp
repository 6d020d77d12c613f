// Edge cases of the table, on every backend present: empty and maximum-length keys and values, keys that
// differ only in trailing zeros, empty batches and batches of one, a full table, same-key order inside a
// batch, read-only batches (which skip grouping), malformed ops, tombstone clean-up under load, and bad
// settings.
#include <gtest/gtest.h>

#include <algorithm>
#include <initializer_list>
#include <random>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "detail/key_hash.hpp"
#include "model.hpp"

namespace gpukv::test {
namespace {

class TableEdgeTest : public testing::TestWithParam<BackendKind> {
 protected:
  void SetUp() override {
    if (GetParam() == BackendKind::kGpu && !Table::gpu_available()) {
      GTEST_SKIP() << "SKIPPED: no CUDA device on this machine; GPU edge tests did not run";
    }
  }
  TableConfig config(std::uint32_t key_width = 8, std::uint32_t value_width = 8, std::uint64_t capacity = 1024) const {
    TableConfig c;
    c.backend = GetParam();
    c.key_width = key_width;
    c.value_width = value_width;
    c.capacity = capacity;
    return c;
  }
  // Holds a full tier under churn and checks its tombstones never take more than their share of its headroom.
  void churn_a_full_tier(double headroom_share);
  // Churns a table whose keys[0, next_key) were written in order: each of `rounds` batches deletes the
  // `per_round` keys written longest ago (from `oldest` on), writes as many new keys and looks up as many absent
  // ones, each answer checked against the model. Returns the most tombstones the device tier held after a batch.
  std::uint64_t churn(Table& table, Model& model, Generator& gen, const std::vector<std::string>& keys,
                      std::size_t& oldest, std::size_t& next_key, int rounds, int per_round);
};

Op put(std::string k, std::string v) { return Op{OpKind::kPut, std::move(k), std::move(v)}; }
Op put_if_absent(std::string k, std::string v) { return Op{OpKind::kPutIfAbsent, std::move(k), std::move(v)}; }
Op get(std::string k) { return Op{OpKind::kGet, std::move(k), {}}; }
Op del(std::string k) { return Op{OpKind::kDelete, std::move(k), {}}; }

TEST_P(TableEdgeTest, EmptyBatchChangesNothing) {
  Table table(config());
  Columns cols(table, {});
  table.execute(cols.in(), cols.out());
  EXPECT_EQ(table.stats().device.items, 0u);
  EXPECT_EQ(table.stats().batches, 0u);
}

TEST_P(TableEdgeTest, BatchOfOne) {
  Table table(config());
  Model model(table.stats().device.max_items);
  model.run(table, {put("k", "v")});
  model.run(table, {get("k")});
  model.run(table, {del("k")});
  model.run(table, {get("k")});
  model.check_contents(table);
}

TEST_P(TableEdgeTest, EmptyAndMaximumLengthKeysAndValues) {
  for (std::uint32_t kw : {8u, 16u, 32u}) {
    for (std::uint32_t vw : {8u, 100u, 1024u}) {
      Table table(config(kw, vw));
      Model model(table.stats().device.max_items);
      const std::string max_key(kw, '\xff'), max_value(vw, '\x01');
      model.run(table, {put("", ""), put(max_key, max_value), put(std::string(kw, '\0'), max_value),
                        get(""), get(max_key), get(std::string(kw, '\0'))});
      model.run(table, {put("", max_value), put(max_key, ""), get(""), get(max_key)});
      model.check_contents(table);
      EXPECT_EQ(table.stats().device.items, 3u);
    }
  }
}

TEST_P(TableEdgeTest, KeysDifferingOnlyInTrailingZerosAreDistinct) {
  Table table(config(16, 8));
  Model model(table.stats().device.max_items);
  std::vector<Op> ops;
  for (std::size_t len = 0; len <= 16; ++len) ops.push_back(put(std::string(len, '\0'), "z" + std::to_string(len)));
  for (std::size_t len = 1; len <= 16; ++len) ops.push_back(put("a" + std::string(len - 1, '\0'), "a" + std::to_string(len)));
  model.run(table, ops);
  model.check_contents(table);
  EXPECT_EQ(table.stats().device.items, 33u);
}

TEST_P(TableEdgeTest, SameKeyOpsTakeEffectInBatchOrder) {
  Table table(config());
  Model model(table.stats().device.max_items);
  // One key through every transition, interleaved with other keys, in a single batch.
  std::vector<Op> ops = {get("k"),      put("k", "v1"), put("x", "x1"),  get("k"),        put_if_absent("k", "v2"),
                         put("k", "v3"), get("x"),       get("k"),        del("k"),         get("k"),
                         del("k"),      put_if_absent("k", "v4"),         get("k"),         del("x"),
                         put("x", "x2"), get("x"),       del("k"),        put("k", "v5"),   get("k")};
  model.run(table, ops);
  model.check_contents(table);
  // And a key that already exists before the batch: delete, re-insert, overwrite.
  model.run(table, {del("k"), get("k"), put_if_absent("k", "v6"), get("k"), put("k", "v7"), get("k")});
  model.check_contents(table);
}

// A batch larger than max_batch runs as consecutive passes, each queued before the host has seen the one
// before it. Promise: every pass sees the earlier passes of the call complete, including their same-key ops
// (which the host finishes after the pass) and the tombstone clean-ups that fall due in the middle of the
// call, so the answers are those of the whole batch run in order.
TEST_P(TableEdgeTest, PassesOfOneBatchSeeEveryEarlierPassComplete) {
  TableConfig c = config(8, 8, 2000);
  c.max_batch = 8;
  c.cleanup_tombstones = 0.01;
  Table table(c);
  Model model(table.stats().device.max_items);
  Generator gen(17, 8, 8);
  // Few enough keys that many passes repeat one and read the keys of the pass before; enough that deletes
  // leave tombstones behind.
  const auto keys = gen.unique_keys(300);
  std::vector<Op> ops;
  for (int i = 0; i < 4000; ++i) {
    const std::string& k = keys[gen.next(static_cast<std::uint32_t>(keys.size()))];
    const std::uint32_t kind = gen.next(10);
    ops.push_back(kind < 4 ? put(k, gen.value()) : kind < 7 ? get(k) : kind < 9 ? del(k) : put_if_absent(k, gen.value()));
  }
  model.run(table, ops);
  const TableStats after = table.stats();
  EXPECT_EQ(after.batches, 500u) << "each pass counted once, halted ones included";
  EXPECT_GT(after.conflict_ops, 0u);
  EXPECT_GE(after.cleanups, 1u) << "clean-ups fell due inside the call";
  model.check_contents(table);
}

// Promise: in a pass with writes, a GET sees exactly the writes of its key before it in the batch, also
// when the write and the GET run at the same moment (ops 2048 apart: different worker threads on the CPU,
// different warps on the GPU).
TEST_P(TableEdgeTest, GetsSeeExactlyTheWritesBeforeThemInTheirPass) {
  constexpr std::size_t kRun = 2048, kBlocks = 12;
  Table table(config(8, 8, 4 * kRun * kBlocks));
  Model model(table.stats().device.max_items);
  Generator gen(23, 8, 8);
  const auto keys = gen.unique_keys(kRun * kBlocks);
  std::vector<Op> fill;
  for (std::size_t i = 0; i < keys.size() / 2; ++i) fill.push_back(put(keys[i], gen.value()));
  model.run(table, fill);  // half the keys present: the writes below both insert and overwrite
  std::vector<Op> ops;
  for (std::size_t b = 0; b < kBlocks; ++b) {
    const bool writes_first = b % 2 == 0;
    for (int half = 0; half < 2; ++half) {
      for (std::size_t i = 0; i < kRun; ++i) {
        // The second half in reverse: its first ops meet the keys the first half reaches last.
        const std::size_t at = half == 0 ? i : kRun - 1 - i;
        const std::string& k = keys[(b * kRun + at * 7919) % keys.size()];
        const bool write = (half == 0) == writes_first;
        ops.push_back(!write ? get(k) : i % 5 == 0 ? del(k) : put(k, gen.value()));
      }
    }
  }
  model.run(table, ops);
  model.check_contents(table);
}

TEST_P(TableEdgeTest, FullTableRefusesNewKeysAndKeepsEverything) {
  Table table(config(8, 8, 200));
  const std::uint64_t max_items = table.stats().device.max_items;
  Model model(max_items);
  Generator gen(7, 8, 8);
  const auto keys = gen.unique_keys(max_items + 50);
  std::vector<Op> fill;
  for (const auto& k : keys) fill.push_back(put(k, gen.value()));
  model.run(table, fill);
  EXPECT_EQ(model.fulls(), 50u);
  EXPECT_EQ(table.stats().device.items, max_items);
  model.check_contents(table);

  // Full: new keys are refused, one at a time too; existing keys can still be overwritten and read.
  Columns refused(table, {put("new-key", "v"), put_if_absent("new-key2", "v")});
  table.execute(refused.in(), refused.out());
  EXPECT_EQ(refused.status(0), OpStatus::kFull);
  EXPECT_EQ(refused.status(1), OpStatus::kFull);
  model.run(table, {put(keys[0], "over"), put_if_absent(keys[1], "no"), get(keys[0])});
  model.check_contents(table);
  // Deleting one makes room for exactly one.
  model.run(table, {del(keys[2])});
  model.run(table, {put("one-more", "v")});
  Columns again(table, {put("two-more", "v")});
  table.execute(again.in(), again.out());
  EXPECT_EQ(again.status(0), OpStatus::kFull);
  model.check_contents(table);
}

TEST_P(TableEdgeTest, MalformedOpsAreRejectedAndChangeNothing) {
  Table table(config(8, 16));
  Model model(table.stats().device.max_items);
  model.run(table, {put("keep", "value")});
  std::vector<Op> ops = {put("a", "1"), put("bad-kind", "x"), put("long-key", "x"), put("long-val", "x"),
                         get("keep"), del("keep")};
  Columns cols(table, ops);
  cols.raw_ops()[1] = 9;          // unknown op kind
  cols.raw_key_lens()[2] = 9;     // key longer than key_width
  cols.raw_value_lens()[3] = 17;  // value longer than value_width
  cols.raw_ops()[5] = 200;        // the delete of "keep" becomes malformed: "keep" must survive
  table.execute(cols.in(), cols.out());
  EXPECT_EQ(cols.status(0), OpStatus::kOk);
  EXPECT_EQ(cols.status(1), OpStatus::kInvalid);
  EXPECT_EQ(cols.status(2), OpStatus::kInvalid);
  EXPECT_EQ(cols.status(3), OpStatus::kInvalid);
  EXPECT_EQ(cols.status(4), OpStatus::kOk);
  EXPECT_EQ(cols.value(4), "value");
  EXPECT_EQ(cols.status(5), OpStatus::kInvalid);
  Columns reads(table, {get("keep"), get("a"), get("bad-kind"), get("long-key"), get("long-val")});
  table.execute(reads.in(), reads.out());
  EXPECT_EQ(reads.status(0), OpStatus::kOk);
  EXPECT_EQ(reads.value(0), "value");
  EXPECT_EQ(reads.status(1), OpStatus::kOk);
  EXPECT_EQ(reads.status(2), OpStatus::kNotFound);
  EXPECT_EQ(reads.status(3), OpStatus::kNotFound);
  EXPECT_EQ(reads.status(4), OpStatus::kNotFound);
  EXPECT_EQ(table.stats().device.items, 2u);
}

// A pass without valid writes skips grouping (GETs commute): hot keys, misses and malformed ops in it must
// be answered as in any other pass; one valid write among the same GETs makes the pass grouped again.
TEST_P(TableEdgeTest, ReadOnlyBatchesAnswerLikeGroupedOnes) {
  Table table(config(8, 16));
  Model model(table.stats().device.max_items);
  std::vector<Op> fill;
  for (int i = 0; i < 300; ++i) fill.push_back(put("k" + std::to_string(i), "v" + std::to_string(i)));
  model.run(table, fill);
  std::vector<Op> reads;
  for (int i = 0; i < 600; ++i) reads.push_back(get(i % 3 == 0 ? std::string("k7") : "k" + std::to_string(i)));
  model.run(table, reads);  // hot key k7, hits below 300, misses above
  model.check_contents(table);

  // The only write is malformed: the pass is read-only, the write is refused, the GETs are answered.
  std::vector<Op> ops = {get("k1"), put("k1", "new"), get("k1"), get("k2"), get("absent")};
  Columns cols(table, ops);
  cols.raw_value_lens()[1] = 17;  // longer than value_width
  table.execute(cols.in(), cols.out());
  EXPECT_EQ(cols.status(1), OpStatus::kInvalid);
  for (int i : {0, 2}) {
    EXPECT_EQ(cols.status(i), OpStatus::kOk);
    EXPECT_EQ(cols.value(i), "v1");
  }
  EXPECT_EQ(cols.value(3), "v2");
  EXPECT_EQ(cols.status(4), OpStatus::kNotFound);

  // One valid write among the same reads: batch order holds around it.
  model.run(table, {get("k1"), get("k1"), put("k1", "new"), get("k1"), del("k2"), get("k2"), get("k7")});
  model.check_contents(table);
}

// On the GPU, a read-only pass with more ops than the Stash kernel holds at once runs in the lookup kernel
// once the pass before it had no writes, with the Stash kernel's blocks if most lookups of the last
// read-only pass hit and with every block that fits if most missed. Batches of hits, misses, misses and hits
// after a fill take each of those ways; every answer must match the model. (On the CPU backend, a smaller
// run of the same sequence.)
TEST_P(TableEdgeTest, LargeReadOnlyBatchesAnswerEveryGet) {
  const bool gpu = GetParam() == BackendKind::kGpu;
  const int keys = gpu ? 200000 : 20000;
  const int reads = gpu ? 300000 : 30000;  // on the GPU, over the 135168 threads an H100's Stash kernel holds
  TableConfig c = config(8, 8, 2 * static_cast<std::uint64_t>(keys));
  c.max_batch = 1 << 20;  // every batch is one pass
  Table table(c);
  Model model(table.stats().device.max_items);
  std::vector<Op> fill;
  for (int i = 0; i < keys; ++i) fill.push_back(put("k" + std::to_string(i), "v" + std::to_string(i)));
  model.run(table, fill);
  for (const bool mostly_hits : {true, false, false, true}) {
    std::vector<Op> ops;
    for (int i = 0; i < reads; ++i) {
      const bool hit = (i % 10 != 0) == mostly_hits;
      ops.push_back(get(hit ? "k" + std::to_string(static_cast<std::int64_t>(i) * 7919 % keys) : "m" + std::to_string(i)));
    }
    model.run(table, ops);
    if (HasFatalFailure()) return;
  }
  model.check_contents(table);
}

// n ops, 40% PUT, 30% GET, 20% DELETE and 10% PUT_IF_ABSENT, each on key_of(x) for the next x of a xorshift
// sequence from `seed`; a write's value is its op's index.
template <class KeyOf>
std::vector<Op> mixed_ops(int n, std::uint64_t seed, KeyOf key_of) {
  std::vector<Op> ops;
  ops.reserve(n);
  std::uint64_t x = seed;
  for (int i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::string k = key_of(x);
    const std::uint64_t kind = (x >> 32) % 10;
    ops.push_back(kind < 4 ? put(std::move(k), std::to_string(i)) : kind < 7 ? get(std::move(k))
                  : kind < 9 ? del(std::move(k)) : put_if_absent(std::move(k), std::to_string(i)));
  }
  return ops;
}

// A pass of more than 2M ops has a grouping table L2 does not hold: the CPU backend probes it a bucket of
// entries at a time where a smaller one is probed entry by entry, and the GPU groups the pass in bins of
// shared memory (batch_groups.hpp). Promise: its same-key ops still take effect in batch order: one pass of
// 2.2M mixed ops on 200000 keys (each about eleven times) matches the model op by op, on either backend.
TEST_P(TableEdgeTest, PassesGroupedByBucketKeepBatchOrder) {
  const int keys = 200000;
  const int n = 2200000;  // a grouping table of 2^23 entries
  TableConfig c = config(8, 8, 2 * static_cast<std::uint64_t>(keys));
  c.max_batch = 1 << 22;  // the batch is one pass
  Table table(c);
  Model model(table.stats().device.max_items);
  model.run(table, mixed_ops(n, 0x9E3779B97F4A7C15ull, [&](std::uint64_t x) { return "k" + std::to_string(x % keys); }));
  if (HasFatalFailure()) return;
  EXPECT_GT(table.stats().conflict_ops, 0u);
  model.check_contents(table);
}

// One pass of 1.1M ops, whose grouping the GPU does in 128 bins (batch_groups.hpp) of at most 24576 keys
// each. Promise: where the keys are many more in one bin (keys made to collide there, as a client could) or
// one key fills a bin, same-key ops still take effect in batch order and nothing is lost: the pass matches
// the model op by op, on either backend (the GPU groups that bin's ops apart, entry by entry).
TEST_P(TableEdgeTest, PassesWhoseKeysCrowdOneBinKeepBatchOrder) {
  const int n = 1100000;  // a grouping table of 2^22 entries: 128 bins
  std::vector<std::string> crowd;  // 30000 keys of 8 bytes in one bin
  for (std::uint64_t i = 0; crowd.size() < 30000; ++i) {
    const detail::KeyWords key = detail::load_key(reinterpret_cast<const std::uint8_t*>(&i), 8, 1);
    if ((detail::hash_key(key, 1) & 0xFF) == 0) crowd.emplace_back(reinterpret_cast<const char*>(&i), 8);
  }
  for (const bool one_key : {false, true}) {
    SCOPED_TRACE(one_key ? "one key" : "30000 keys of one bin");
    TableConfig c = config(8, 8, 100000);
    c.max_batch = 1 << 22;  // the batch is one pass
    Table table(c);
    Model model(table.stats().device.max_items);
    model.run(table, mixed_ops(n, 0x2545F4914F6CDD1Dull,
                               [&](std::uint64_t x) { return one_key ? crowd[0] : crowd[x % crowd.size()]; }));
    if (HasFatalFailure()) return;
    model.check_contents(table);
  }
}

// On the GPU, a pass of 1M to 4M ops after a pass with writes is grouped in bins; from the third pass of a
// call on, the first kernel of that grouping also counts the pass's writes and clears what the pass before
// left in the grouping table, and a pass that turns out to have none only empties the bins. ExecuteOp reads
// no grouping entry where grouping found every op alone and valid. Promise, for calls of three passes each
// (on the CPU backend, smaller ones): same-key ops take effect in batch order; in a call of distinct new keys
// with malformed ops among them, those are refused and change nothing and every other op is done; a call of
// GETs only, and a call whose last pass has GETs only, answer every key as the passes before left it.
TEST_P(TableEdgeTest, LargePassesAfterWritesKeepOrderAndRefuseMalformedOps) {
  const bool gpu = GetParam() == BackendKind::kGpu;
  const int pass = gpu ? 1100000 : 100000;  // on the GPU, a grouping table of 2^22 entries: 128 bins
  const int n = 3 * pass;
  const int keys = n / 4;
  TableConfig c = config(8, 8, 2 * static_cast<std::uint64_t>(n));
  c.max_batch = pass;
  Table table(c);
  Model model(table.stats().device.max_items);
  const auto key = [](char prefix, std::uint64_t i) { return prefix + std::to_string(i); };
  // About four ops a key: entries joined, which the next pass's grouping clears.
  model.run(table, mixed_ops(n, 0x853C49E6748FEA9Bull, [&](std::uint64_t x) { return key('k', x % keys); }));
  if (HasFatalFailure()) return;

  // Distinct new keys, one op in 997 malformed (a value longer than the width).
  std::vector<Op> puts;
  for (int i = 0; i < n; ++i) puts.push_back(put(key('n', i), "v" + std::to_string(i)));
  Columns cols(table, puts);
  for (int i = 0; i < n; i += 997) cols.raw_value_lens()[i] = 9;
  table.execute(cols.in(), cols.out());
  std::vector<Op> done;
  for (int i = 0; i < n; ++i) {
    if (i % 997 == 0) {
      ASSERT_EQ(cols.status(i), OpStatus::kInvalid) << "op " << i;
    } else {
      ASSERT_EQ(cols.status(i), OpStatus::kOk) << "op " << i;
      done.push_back(puts[i]);
    }
  }
  model.record(done);

  // Two passes of writes, then a pass of GETs only: grouped in bins that it then empties.
  std::vector<Op> ops = mixed_ops(2 * pass, 0x2545F4914F6CDD1Dull, [&](std::uint64_t x) { return key('k', x % keys); });
  for (int i = 0; i < pass; ++i) ops.push_back(get(key(i % 2 == 0 ? 'k' : 'n', static_cast<std::uint64_t>(i) * 7 % keys)));
  model.run(table, ops);
  if (HasFatalFailure()) return;

  // Writes again (their bins must start empty), then GETs only: every key of the calls above, the malformed
  // ops' (absent) among them.
  model.run(table, mixed_ops(n, 0x9E3779B97F4A7C15ull, [&](std::uint64_t x) { return key('k', x % keys); }));
  if (HasFatalFailure()) return;
  std::vector<Op> gets;
  for (int i = 0; i < keys; ++i) gets.push_back(get(key('k', i)));
  for (int i = 0; i < n; ++i) gets.push_back(get(key('n', i)));
  model.run(table, gets);
  if (HasFatalFailure()) return;
  model.check_contents(table);
}

// On the GPU, a pass grouped in bins whose columns all start 16-byte aligned has them copied into shared
// memory tile by tile (group_bins_kernel.cuh, StagedColumns), the last tile zero-filled past the pass's end;
// any other pass's ops load their own rows. Promise: a call of three such passes, the first aligned (the
// GPU's copy of a batch's columns starts so), the other two beginning an odd number of ops in, each ending
// mid-tile, with same-key ops and malformed ops in all three, answers every op as in batch order, refuses
// exactly the malformed ones, and leaves every key where the model says (on the CPU backend, smaller passes).
TEST_P(TableEdgeTest, PassesAlignedOrNotGroupTheSame) {
  const bool gpu = GetParam() == BackendKind::kGpu;
  const int pass = gpu ? 1100003 : 100003;
  const int n = 3 * pass;
  TableConfig c = config(8, 8, 2 * static_cast<std::uint64_t>(n));
  c.max_batch = pass;
  Table table(c);
  Model model(table.stats().device.max_items);
  const std::vector<Op> ops = mixed_ops(n, 0x4F1BBCDCBFA53E0Bull, [](std::uint64_t x) { return "k" + std::to_string(x % 300000); });
  // Malformed: the write with a value at every 1001st place from 5 that holds one.
  model.run(table, ops, [&](std::size_t i) { return i % 1001 == 5 && carries_value(ops[i].kind); });
  if (HasFatalFailure()) return;
  EXPECT_GT(table.stats().conflict_ops, 0u);
  model.check_contents(table);
}

// The group entries a pass leaves (group_of[], one per op place) are read again only as the pass that stores
// them means them. Promise, for calls of passes as large as above (on the GPU, grouped in bins; on the CPU
// backend, smaller ones): after a call whose passes join ops and refuse malformed ones, two calls of distinct
// new keys, and a call that joins ops and refuses malformed ones again, every op of that last call is
// answered as in batch order, its malformed ops (at other places than the first call's) are refused, and
// every key is where the model says.
TEST_P(TableEdgeTest, PassesReadOnlyTheGroupEntriesTheyStore) {
  const bool gpu = GetParam() == BackendKind::kGpu;
  const int pass = gpu ? 1100000 : 100000;
  const int n = 2 * pass;
  TableConfig c = config(8, 8, 8 * static_cast<std::uint64_t>(n));
  c.max_batch = pass;
  Table table(c);
  Model model(table.stats().device.max_items);
  const auto key = [](char prefix, std::uint64_t i) { return prefix + std::to_string(i); };
  // Joins, and malformed ops (a write's value longer than the width) at every 1000th place from
  // `malformed_from` that holds a write with a value.
  const auto joined_and_malformed = [&](std::uint64_t seed, int malformed_from) {
    const std::vector<Op> ops = mixed_ops(n, seed, [&](std::uint64_t x) { return key('k', x % (n / 4)); });
    model.run(table, ops, [&](std::size_t i) {
      const int at = static_cast<int>(i) - malformed_from;
      return at >= 0 && at % 1000 == 0 && carries_value(ops[i].kind);
    });
  };
  joined_and_malformed(0x853C49E6748FEA9Bull, 0);
  if (HasFatalFailure()) return;
  for (const char prefix : {'a', 'b'}) {
    std::vector<Op> puts;
    for (int i = 0; i < n; ++i) puts.push_back(put(key(prefix, i), "v" + std::to_string(i)));
    model.run(table, puts);
    if (HasFatalFailure()) return;
  }
  joined_and_malformed(0x2545F4914F6CDD1Dull, 500);
  if (HasFatalFailure()) return;
  model.check_contents(table);
}

// Under the hybrid lane schedule (LaneMode::kAuto), a pass runs in the Stash kernel or the clStash kernel by
// the table's load. Promise: a pass whose inserts carry the load past the switch (single probing's 0.9) runs
// each op once: its deletes each answer OK once, and every key is where the model says. (The GPU launches
// both kernels and each decides on the device; the CPU backend runs one loop.)
TEST_P(TableEdgeTest, APassThatCrossesTheLaneSwitchRunsEachOpOnce) {
  TableConfig c = config(8, 8, 4000);
  c.probing = Probing::kSingle;
  Table table(c);
  Model model(table.stats().device.max_items);
  const auto slots = static_cast<int>(table.stats().device.capacity);
  std::vector<Op> fill;
  for (int i = 0; i < slots * 85 / 100; ++i) fill.push_back(put("k" + std::to_string(i), "v"));
  model.run(table, fill);
  std::vector<Op> ops;  // writes only: new keys to 0.93 of the slots, and deletes of old ones
  for (int i = 0; i < slots * 8 / 100; ++i) {
    ops.push_back(put("n" + std::to_string(i), "w"));
    if (i % 4 == 0) ops.push_back(del("k" + std::to_string(i)));
  }
  model.run(table, ops);
  model.check_contents(table);
}

// Under the hybrid lane schedule, a pass of at least 2^19 ops (CudaExecutor's kSplitMinOps) that follows a
// mixed pass is launched split by kind on the GPU, and runs split whatever its own mix turns out to be: neither
// lane schedule is launched for it (LanePolicy::split_any_mix). Promise: such passes of every mix (only PUTs,
// only GETs, only deletes, writes without reads), each after a mixed one, answer every op as the model says,
// ops of one key in batch order, and leave the table holding exactly the model's keys.
TEST_P(TableEdgeTest, PassesAfterAMixedOneRunSplitWhateverTheirMix) {
  if (GetParam() == BackendKind::kCpu) GTEST_SKIP() << "SKIPPED on the CPU backend: only the GPU splits a pass by kind";
  constexpr std::size_t kOps = (std::size_t{1} << 21) + 50000;
  Table table(config(8, 8, std::uint64_t{8} << 20));
  Model model(table.stats().device.max_items);
  Generator gen(17, 8, 8);
  // Fewer keys than two batches' ops: most keys come back in later batches, and many twice in one.
  const auto keys = gen.unique_keys(std::size_t{3} << 20);
  std::mt19937_64 rng(5);
  // A batch of kOps random ops, `gets` and `puts` of every 100 GETs and PUTs, the rest deletes.
  const auto batch = [&](std::uint64_t gets, std::uint64_t puts) {
    std::vector<Op> ops;
    ops.reserve(kOps);
    for (std::size_t i = 0; i < kOps; ++i) {
      const std::uint64_t share = rng() % 100;
      const std::string& k = keys[rng() % keys.size()];
      ops.push_back(share < gets ? get(k) : share < gets + puts ? put(k, gen.value()) : del(k));
    }
    return ops;
  };
  model.run(table, batch(0, 100));
  const std::pair<std::uint64_t, std::uint64_t> mixes[] = {{0, 100}, {100, 0}, {0, 0}, {0, 80}};
  for (const auto& [gets, puts] : mixes) {
    SCOPED_TRACE("after a mixed pass: GETs " + std::to_string(gets) + "%, PUTs " + std::to_string(puts) + "%");
    model.run(table, batch(50, 45));
    ASSERT_FALSE(HasFatalFailure());
    model.run(table, batch(gets, puts));
    ASSERT_FALSE(HasFatalFailure());
  }
  model.check_contents(table);
}

// Under the hybrid lane schedule, a call's first two passes are queued before any pass of the call has
// finished, so their mix is not known. Where the pass before them was not mixed, the GPU launches the split
// kernels beside the lane schedule for them (LanePolicy::mix_unknown), and the device runs each pass in
// whichever its mix picks: split where it is mixed, else where a pure pass runs (the lookup, Stash or inserts
// kernel). Each call here is two passes of more than 2^21 ops (CudaExecutor's kSplitUnknownMixMinOps) on keys
// of its own, so that no op is deferred and the second pass is not halted, and so runs with its mix unknown
// too: pure GETs and pure deletes after a pure call, and mixed calls after a call of GETs, of deletes and of
// new keys (a line's inserts, tried optimistically first under OptimisticInserts::kAuto, at once under kOff).
// Promise: every op answers as the model says, and the table holds exactly the model's keys.
TEST_P(TableEdgeTest, ACallsFirstPassesRunAsTheirMixPicksAfterAPureCall) {
  if (GetParam() == BackendKind::kCpu) GTEST_SKIP() << "SKIPPED on the CPU backend: only the GPU splits a pass by kind";
  constexpr std::uint32_t kPassOps = (std::uint32_t{1} << 21) + 1000;
  constexpr std::size_t kCallOps = 2 * std::size_t{kPassOps};
  constexpr std::size_t kFill = std::size_t{3} << 20, kNewKeys = 100000;
  enum class Call { kFill, kNewKeys, kGets, kDeletes, kMixed };
  const auto run_calls = [&](OptimisticInserts optimistic, std::initializer_list<Call> calls) {
    TableConfig c = config(8, 8, std::uint64_t{8} << 20);
    c.max_batch = kPassOps;
    c.optimistic_inserts = optimistic;
    Table table(c);
    Model model(table.stats().device.max_items);
    Generator gen(23, 8, 8);
    // keys[0, kFill) are written first; the kNewKeys after them only by the call of new keys; the calls of
    // random ops take theirs, each key once, from the rest.
    const auto keys = gen.unique_keys(kFill + kNewKeys + kCallOps / 2);
    std::vector<std::size_t> random_keys(keys.size() - kNewKeys);
    for (std::size_t i = 0; i < random_keys.size(); ++i) random_keys[i] = i < kFill ? i : i + kNewKeys;
    std::mt19937_64 rng(7);
    for (const Call call : calls) {
      SCOPED_TRACE("call " + std::to_string(static_cast<int>(call)) + " (0 fill, 1 new keys, 2 GETs, 3 deletes, 4 mixed)");
      std::vector<Op> ops;
      if (call == Call::kFill || call == Call::kNewKeys) {
        const std::size_t first = call == Call::kFill ? 0 : kFill, n = call == Call::kFill ? kFill : kNewKeys;
        for (std::size_t i = first; i < first + n; ++i) ops.push_back(put(keys[i], gen.value()));
      } else {
        std::shuffle(random_keys.begin(), random_keys.end(), rng);
        for (std::size_t i = 0; i < kCallOps; ++i) {
          const std::string& k = keys[random_keys[i]];
          const std::uint64_t share = rng() % 100;
          if (call == Call::kGets || (call == Call::kMixed && share < 50)) {
            ops.push_back(get(k));
          } else if (call == Call::kMixed && share < 95) {
            ops.push_back(put(k, gen.value()));
          } else {
            ops.push_back(del(k));
          }
        }
      }
      model.run(table, ops);
      ASSERT_FALSE(HasFatalFailure());
    }
    EXPECT_EQ(table.stats().conflict_ops, 0u);  // no op deferred: no call's second pass was halted
    model.check_contents(table);
  };
  {
    SCOPED_TRACE("optimistic inserts kAuto");
    run_calls(OptimisticInserts::kAuto, {Call::kFill, Call::kGets, Call::kDeletes, Call::kMixed, Call::kNewKeys,
                                         Call::kMixed, Call::kGets, Call::kMixed});
  }
  if (HasFatalFailure()) return;
  SCOPED_TRACE("optimistic inserts kOff");
  run_calls(OptimisticInserts::kOff, {Call::kFill, Call::kNewKeys, Call::kMixed});
}

// A table whose every slot has held a key has no EMPTY ticket left, only tombstones, until a clean-up runs
// (held here). On the GPU a mixed pass split by kind (LanePolicy::split, every mixed pass under kSplit) runs
// its PUTs in a kernel of their own, where new keys then claim tombstones (through BUSY) while overwrites
// compare keys in the same lines. Promise: with room left for them, every new key of such batches is stored
// (kOk, never kFull), every answer is the model's, and the table holds exactly the model's keys.
TEST_P(TableEdgeTest, NewKeysOfMixedBatchesTakeTombstonesWhereNoSlotIsEmpty) {
  TableConfig c = config(8, 8, 3000);
  c.max_load_factor = 1.0;
  c.lanes = LaneMode::kSplit;
  Table table(c);
  table.hold_cleanup(true);
  const std::uint64_t slots = table.stats().device.capacity;
  Model model(table.stats().device.max_items);
  Generator gen(29, 8, 8);
  const auto keys = gen.unique_keys(slots * 2);
  std::vector<Op> fill;
  for (std::uint64_t i = 0; i < slots; ++i) fill.push_back(put(keys[i], gen.value()));
  model.run(table, fill);  // every slot: exactly as many keys as fit, so none may be refused
  ASSERT_FALSE(HasFatalFailure());
  std::vector<Op> deletes;
  for (std::uint64_t i = 0; i < slots; i += 2) deletes.push_back(del(keys[i]));
  model.run(table, deletes);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_EQ(table.stats().device.tombstones, (slots + 1) / 2);
  // Mixed batches: GETs and overwrites of the keys left, and new keys, a quarter of the slots in all.
  std::uint64_t next_new = slots;
  for (int batch = 0; batch < 4; ++batch) {
    std::vector<Op> ops;
    for (std::uint64_t i = 1; i < slots; i += 2) {
      ops.push_back(i % 4 == 1 ? get(keys[i]) : put(keys[i], gen.value()));
      if (i % 16 == 1) ops.push_back(put(keys[next_new++], gen.value()));
    }
    model.run(table, ops);
    ASSERT_FALSE(HasFatalFailure());
  }
  EXPECT_EQ(model.fulls(), 0u);
  EXPECT_EQ(table.stats().cleanups, 0u);
  model.check_contents(table);
  table.hold_cleanup(false);
}

// Keys of zero bytes (one of each length up to 8, the empty key among them) overwritten in mixed batches split
// by kind, beside many new keys, some of which share a zero key's ticket code. On the GPU the split's PUT kernel
// claims a new key's EMPTY ticket FULL at once, its slot's zeros visible until the key is stored, except where
// the key's code is a zero key's (Engine::full_claim_code). The zero keys are written in every other batch and
// read in the others, so that each is alone in its pass and runs in the kernel of PUTs. Promise: each zero
// key keeps its own latest value, and every answer is the model's.
TEST_P(TableEdgeTest, ZeroKeysKeepTheirValuesBesideNewKeysInMixedBatches) {
  TableConfig c = config(8, 8, 400000);
  c.lanes = LaneMode::kSplit;
  Table table(c);
  Model model(table.stats().device.max_items);
  Generator gen(31, 8, 8);
  std::vector<std::string> zeros;
  for (std::size_t len = 0; len <= 8; ++len) zeros.push_back(std::string(len, '\0'));
  const auto keys = gen.unique_keys(300000);
  const auto is_zero = [](const std::string& k) { return k.find_first_not_of('\0') == std::string::npos; };
  std::size_t next_new = 0;
  for (int batch = 0; batch < 12; ++batch) {
    std::vector<Op> ops;
    for (const auto& z : zeros) ops.push_back(batch % 2 == 0 ? put(z, gen.value()) : get(z));
    for (int i = 0; i < 20000 && next_new < keys.size(); ++i, ++next_new) {
      if (!is_zero(keys[next_new])) ops.push_back(put(keys[next_new], gen.value()));
      const std::string& old = keys[static_cast<std::size_t>(i) * 7 % (next_new + 1)];
      if (!is_zero(old)) ops.push_back(get(old));
    }
    model.run(table, ops);
    ASSERT_FALSE(HasFatalFailure());
  }
  model.check_contents(table);
}

// New keys whose board slots CopyValues writes whole (values wider than a walk copies, or slot words) claim
// EMPTY tickets FULL at once on the GPU, and their slots are written only after the walks of their pass
// (Engine::whole_slot_full_code; the CPU backend claims them BUSY, and runs the same pass as a check). Here
// they take the slots that a clean-up emptied of deleted keys, whose bytes those keys left there, while the
// same pass looks up the deleted keys, the empty key (whose code such claims avoid) and the keys still
// present. Promise: every answer is the model's; no lookup takes a slot just claimed for another key for its
// own.
TEST_P(TableEdgeTest, NewKeysInBoardSlotsEmptiedByCleanUpHideTheKeysDeletedThere) {
  for (const bool words : {false, true}) {
    SCOPED_TRACE(words ? "8 B / 8 B with slot words" : "16 B / 128 B");
    TableConfig c = config(words ? 8 : 16, words ? 8 : 128, 1 << 18);
    c.slot_layout = SlotLayout::kBoard;
    c.slot_word = words;
    Table table(c);
    const std::uint64_t max_items = table.stats().device.max_items;
    Model model(max_items);
    Generator gen(37, c.key_width, c.value_width);
    const auto keys = gen.unique_keys(max_items * 2);
    std::vector<Op> fill;
    for (std::uint64_t i = 0; i < max_items * 3 / 4; ++i) fill.push_back(put(keys[i], gen.value()));
    model.run(table, fill);
    ASSERT_FALSE(HasFatalFailure());
    std::vector<Op> deletes;
    for (std::uint64_t i = 0; i < fill.size(); i += 2) deletes.push_back(del(keys[i]));
    model.run(table, deletes);
    ASSERT_FALSE(HasFatalFailure());
    ASSERT_TRUE(table.cleanup());
    ASSERT_EQ(table.stats().device.tombstones, 0u);
    // One pass: the new keys first, so that most lookups run after the claims; then the deleted keys, the
    // empty key, and the keys left.
    std::vector<Op> ops;
    for (std::uint64_t i = 0; i < deletes.size(); ++i) ops.push_back(put(keys[fill.size() + i], gen.value()));
    for (std::uint64_t i = 0; i < fill.size(); ++i) ops.push_back(get(keys[i]));
    ops.push_back(get(""));
    model.run(table, ops);
    ASSERT_FALSE(HasFatalFailure());
    model.check_contents(table);
  }
}

// Under kAuto, the passes queued after passes of new keys run optimistically (TableConfig::optimistic_inserts),
// whatever they hold. Promise: a batch of GETs that comes next (hits and misses) is answered as the model says,
// and in the passes it was queued in: the GPU runs its lookups in the optimistic kernel rather than failing the
// pass and running it again (no failure is counted), and only the batches of PUTs count as optimistic passes.
// For keys of one word and of two, in a line. (Before, the GETs' pass failed and ran again.)
TEST_P(TableEdgeTest, GetsAfterNewKeysRunAsLookupsWithoutARedo) {
  for (const std::uint32_t key_width : {8u, 16u}) {
    SCOPED_TRACE("key_width " + std::to_string(key_width));
    TableConfig c = config(key_width, 8, 50000);
    c.slot_layout = SlotLayout::kLine;  // the default for 8-byte keys on the GPU, not for 16-byte ones
    Table table(c);
    Model model(table.stats().device.max_items);
    Generator gen(23, key_width, 8);
    const auto keys = gen.unique_keys(30000);
    for (std::size_t batch = 0; batch < 2; ++batch) {  // both optimistic: a new table's first pass tries too
      std::vector<Op> puts;
      for (std::size_t i = batch * 10000; i < (batch + 1) * 10000; ++i) puts.push_back(put(keys[i], gen.value()));
      model.run(table, puts);
      ASSERT_FALSE(HasFatalFailure());
    }
    std::vector<Op> gets;
    for (std::size_t i = 0; i < 30000; i += 2) gets.push_back(get(keys[i]));  // two thirds hit
    model.run(table, gets);
    ASSERT_FALSE(HasFatalFailure());
    const TableStats stats = table.stats();
    EXPECT_EQ(stats.optimistic_failures, 0u);
    if (GetParam() == BackendKind::kGpu) EXPECT_EQ(stats.optimistic_passes, 2u) << "the two batches of new keys";
    model.check_contents(table);
  }
}

TEST_P(TableEdgeTest, GetWithoutValueColumnsStillReportsStatus) {
  Table table(config());
  Columns writes(table, {put("k", "v")});
  table.execute(writes.in(), writes.out());
  Columns reads(table, {get("k"), get("missing")});
  BatchOut out = reads.out();
  out.values = nullptr;
  out.value_lens = nullptr;
  table.execute(reads.in(), out);
  EXPECT_EQ(reads.status(0), OpStatus::kOk);
  EXPECT_EQ(reads.status(1), OpStatus::kNotFound);
}

// A tier held at max_items under churn (deletes, and as many new keys): its tombstones eat the headroom a
// full tier keeps EMPTY, where every lookup of an absent key ends. The clean-up must run once they have taken
// their share of it (cleanup_headroom: the default half, and a quarter), long before the tombstone share (set
// high here) would trigger it.
TEST_P(TableEdgeTest, AFullTierIsCleanedBeforeItsTombstonesFillItsHeadroom) {
  for (const double share : {0.5, 0.25}) {
    SCOPED_TRACE(share);
    churn_a_full_tier(share);
  }
}

// On the GPU, in a line, the kernel that runs a mixed pass's GETs and deletes before its PUTs (every mixed
// pass under kSplit; a pass with PUTs) frees a deleted key's slot at once, its ticket EMPTY rather than a
// TOMBSTONE, where its unit holds an EMPTY ticket already (Engine::frees_slot_at_once): at a load of a third
// nearly every unit does. Zero keys of every length, whose codes could match the zeros a freed slot is given,
// keep their tombstones. Promise: in both layouts, with clean-up held, every answer is the model's (GETs of
// freed keys miss, keys put again into freed slots are found, zero keys round-trip), the table holds exactly
// the model's keys, and a line on the GPU leaves fewer tombstones than a tenth of its deletes (a board, and
// the CPU backend, one per delete).
TEST_P(TableEdgeTest, DeletesInUnitsThatHoldAnEmptyTicketFreeTheirSlots) {
  for (const SlotLayout layout : {SlotLayout::kLine, SlotLayout::kBoard}) {
    SCOPED_TRACE(to_string(layout));
    TableConfig c = config(8, 8, 30000);
    c.slot_layout = layout;
    c.lanes = LaneMode::kSplit;
    Table table(c);
    table.hold_cleanup(true);
    const std::uint64_t slots = table.stats().device.capacity;
    Model model(table.stats().device.max_items);
    Generator gen(31, 8, 8);
    const auto keys = gen.unique_keys(slots / 2);
    std::vector<std::string> zero_keys;
    for (std::size_t len = 0; len <= 8; ++len) zero_keys.emplace_back(len, '\0');
    const std::size_t live = slots / 3;
    std::vector<Op> fill;
    for (std::size_t i = 0; i < live; ++i) fill.push_back(put(keys[i], gen.value()));
    for (const auto& k : zero_keys) fill.push_back(put(k, gen.value()));
    model.run(table, fill);
    ASSERT_FALSE(HasFatalFailure());
    // A mixed pass: deletes of every other key and of every zero key, overwrites and GETs of the others.
    std::vector<Op> first;
    for (std::size_t i = 0; i < live; ++i) {
      first.push_back(i % 2 == 0 ? del(keys[i]) : i % 4 == 1 ? put(keys[i], gen.value()) : get(keys[i]));
    }
    for (const auto& k : zero_keys) first.push_back(del(k));
    // The keys deleted that the table holds: a short random key may be a zero key too, and not every zero key
    // is a valid key.
    std::unordered_set<std::string> deleted;
    for (const Op& op : first) {
      if (op.kind == OpKind::kDelete && model.map().count(op.key) != 0) deleted.insert(op.key);
    }
    const std::size_t present = deleted.size();
    std::size_t zero_present = 0;
    for (const auto& k : zero_keys) zero_present += deleted.count(k);
    model.run(table, first);
    ASSERT_FALSE(HasFatalFailure());
    const std::uint64_t tombstones = table.stats().device.tombstones;
    if (GetParam() == BackendKind::kGpu && layout == SlotLayout::kLine) {
      EXPECT_GE(tombstones, zero_present);
      EXPECT_LT(tombstones, present / 10);
    } else {
      EXPECT_EQ(tombstones, present);
    }
    // Mixed batches, each pass split by kind on the GPU: GETs of live and deleted keys, deletes of live
    // keys, and PUTs of deleted keys, of zero keys and of new keys, which may take the slots just freed.
    std::mt19937_64 rng(5);
    std::size_t next_new = live;
    for (int batch = 0; batch < 3; ++batch) {
      std::vector<Op> ops;
      for (std::size_t i = 0; i < live; i += 3) {
        const std::string& k = keys[(i + static_cast<std::size_t>(batch)) % live];
        const std::uint64_t share = rng() % 100;
        if (share < 50) {
          ops.push_back(get(k));
        } else if (share < 80) {
          ops.push_back(put(k, gen.value()));
        } else {
          ops.push_back(del(k));
        }
        if (i % 30 == 0 && next_new < keys.size()) ops.push_back(put(keys[next_new++], gen.value()));
      }
      for (std::size_t z = 0; z < zero_keys.size(); ++z) {
        ops.push_back(z % 3 == static_cast<std::size_t>(batch) ? put(zero_keys[z], gen.value()) : get(zero_keys[z]));
      }
      model.run(table, ops);
      ASSERT_FALSE(HasFatalFailure());
    }
    EXPECT_EQ(model.fulls(), 0u);
    model.check_contents(table);
  }
}

// A tier held at 0.85 of its capacity, below max_items, under churn (deletes, and as many new keys): its
// tombstones take the place of EMPTY tickets, where every walk of an absent or new key ends. With the tombstone
// step set high (cleanup_tombstones 0.5) and the crowded rule not due until tombstones reach 0.125 of the
// capacity, a clean-up must still run once they take 16/25 of the slots the live keys leave free (0.096 of the
// capacity; PassRunner::short_of_empty). Promise: tombstones never exceed that share by more than one batch's
// deletes, a clean-up runs, and the table holds exactly the model's keys.
TEST_P(TableEdgeTest, ATierBelowMaxItemsIsCleanedBeforeTombstonesTakeItsFreeSlots) {
  TableConfig c = config(8, 8, 5000);
  c.cleanup_tombstones = 0.5;
  Table table(c);
  const TableStats empty = table.stats();
  Model model(empty.device.max_items);
  Generator gen(41, 8, 8);
  const std::uint64_t live = empty.device.capacity * 85 / 100;
  const auto keys = gen.unique_keys(live * 3);
  std::vector<Op> fill;
  std::size_t next_key = 0;
  while (fill.size() < live) fill.push_back(put(keys[next_key++], gen.value()));
  model.run(table, fill);
  ASSERT_EQ(table.stats().device.items, live);
  const double bound = 16.0 / 25.0 * static_cast<double>(empty.device.capacity - live);
  std::size_t oldest = 0;
  const std::uint64_t most_tombstones = churn(table, model, gen, keys, oldest, next_key, 80, 40);
  const TableStats s = table.stats();
  EXPECT_GE(s.cleanups, 1u);
  EXPECT_LE(static_cast<double>(most_tombstones), bound + 40) << "capacity " << empty.device.capacity;
  model.check_contents(table);
}

void TableEdgeTest::churn_a_full_tier(double headroom_share) {
  TableConfig c = config(8, 8, 5000);
  c.cleanup_tombstones = 0.5;
  c.cleanup_headroom = headroom_share;
  Table table(c);
  const TableStats empty = table.stats();
  const std::uint64_t headroom = empty.device.capacity - empty.device.max_items;
  Model model(empty.device.max_items);
  Generator gen(12, 8, 8);
  const auto keys = gen.unique_keys(empty.device.max_items * 3);
  std::vector<Op> fill;
  std::size_t next_key = 0;
  while (fill.size() < empty.device.max_items) fill.push_back(put(keys[next_key++], gen.value()));
  model.run(table, fill);
  ASSERT_EQ(table.stats().device.items, empty.device.max_items);
  std::size_t oldest = 0;
  const std::uint64_t most_tombstones = churn(table, model, gen, keys, oldest, next_key, 40, 20);
  const TableStats s = table.stats();
  EXPECT_GE(s.cleanups, 1u);
  EXPECT_LE(static_cast<double>(most_tombstones), headroom_share * static_cast<double>(headroom) + 20) << "headroom " << headroom;
  model.check_contents(table);
}

std::uint64_t TableEdgeTest::churn(Table& table, Model& model, Generator& gen, const std::vector<std::string>& keys,
                                   std::size_t& oldest, std::size_t& next_key, int rounds, int per_round) {
  std::uint64_t most_tombstones = 0;
  for (int round = 0; round < rounds && !HasFatalFailure(); ++round) {
    std::vector<Op> ops;
    for (int i = 0; i < per_round; ++i) ops.push_back(del(keys[oldest++]));
    for (int i = 0; i < per_round; ++i) ops.push_back(put(keys[next_key++], gen.value()));
    for (int i = 0; i < per_round; ++i) ops.push_back(get(keys[next_key + static_cast<std::size_t>(i)]));  // absent
    model.run(table, ops);
    most_tombstones = std::max<std::uint64_t>(most_tombstones, table.stats().device.tombstones);
  }
  return most_tombstones;
}

TEST_P(TableEdgeTest, TombstoneCleanupUnderLoadLosesNothing) {
  TableConfig c = config(8, 8, 5000);
  c.cleanup_tombstones = 0.05;
  Table table(c);
  const std::uint64_t max_items = table.stats().device.max_items;
  Model model(max_items);
  Generator gen(11, 8, 8);
  const auto keys = gen.unique_keys(max_items * 2);
  // Fill to 90% of the table, then churn: delete a slice of present keys, insert as many absent ones.
  std::vector<Op> fill;
  std::size_t next_key = 0;
  while (fill.size() < max_items * 90 / 100) fill.push_back(put(keys[next_key++], gen.value()));
  model.run(table, fill);
  std::size_t oldest = 0;
  for (int round = 0; round < 20 && !HasFatalFailure(); ++round) {
    std::vector<Op> churn;
    for (int i = 0; i < 100; ++i) churn.push_back(del(keys[oldest++]));
    for (int i = 0; i < 100; ++i) churn.push_back(put(keys[next_key++ % keys.size()], gen.value()));
    for (int i = 0; i < 100; ++i) churn.push_back(get(keys[gen.next(static_cast<std::uint32_t>(next_key))]));
    model.run(table, churn);
  }
  const TableStats s = table.stats();
  EXPECT_GE(s.cleanups, 1u);
  EXPECT_LT(s.device.tombstones, c.cleanup_tombstones * static_cast<double>(s.device.capacity));
  model.check_contents(table);
  // An explicit clean-up keeps everything too.
  EXPECT_TRUE(table.cleanup());
  EXPECT_EQ(table.stats().device.tombstones, 0u);
  model.check_contents(table);
}

// A snapshot reads the table a range at a time while batches run between the ranges. Promise: with clean-up
// held, every key that no batch touched during the scan is read exactly once, with its value, however much
// the batches in between delete and insert (enough to have cleaned the table many times over).
TEST_P(TableEdgeTest, AScanInRangesSeesEveryUntouchedKeyOnceWhileBatchesChurn) {
  TableConfig c = config(8, 8, 5000);
  c.cleanup_tombstones = 0.02;
  Table table(c);
  const std::uint64_t max_items = table.stats().device.max_items;
  Model model(max_items);
  Generator gen(23, 8, 8);
  const auto keys = gen.unique_keys(max_items * 3);
  // Half the keys stay untouched; the other half churn.
  const std::size_t steady = max_items / 2;
  std::vector<Op> fill;
  for (std::size_t i = 0; i < steady + max_items / 4; ++i) fill.push_back(put(keys[i], gen.value()));
  model.run(table, fill);
  const auto before = model.map();
  const std::uint64_t cleanups_before = table.stats().cleanups;
  table.hold_cleanup(true);
  const std::uint64_t range = 97;
  HostMemory k = table.allocate_host(range * 8), kl = table.allocate_host(range), v = table.allocate_host(range * 8),
             vl = table.allocate_host(range * 4);
  const ItemColumns out{k.data(), kl.data(), v.data(), reinterpret_cast<std::uint32_t*>(vl.data())};
  std::unordered_map<std::string, int> seen;
  std::unordered_map<std::string, std::string> values;
  std::size_t next_churn = steady, next_new = steady + max_items / 4;
  for (std::uint64_t from = 0; from < table.slot_count() && !HasFatalFailure(); from += range) {
    const std::size_t n = table.export_items(from, range, out);
    for (std::size_t i = 0; i < n; ++i) {
      const std::string key(reinterpret_cast<const char*>(out.keys) + i * 8, out.key_lens[i]);
      ++seen[key];
      values[key] = std::string(reinterpret_cast<const char*>(out.values) + i * 8, out.value_lens[i]);
    }
    std::vector<Op> churn;
    for (int i = 0; i < 40; ++i) churn.push_back(del(keys[next_churn++]));
    for (int i = 0; i < 40; ++i) churn.push_back(put(keys[next_new++ % keys.size()], gen.value()));
    if (next_churn >= next_new) next_churn = steady;
    model.run(table, churn);
  }
  EXPECT_EQ(table.stats().cleanups, cleanups_before) << "clean-up ran while held";
  for (std::size_t i = 0; i < steady; ++i) {
    EXPECT_EQ(seen[keys[i]], 1) << "an untouched key read " << seen[keys[i]] << " times";
    EXPECT_EQ(values[keys[i]], before.at(keys[i]));
  }
  // Released, clean-up catches up with the tombstones, and nothing is lost.
  table.hold_cleanup(false);
  model.run(table, {put("after", "x")});
  EXPECT_GT(table.stats().cleanups, cleanups_before);
  model.check_contents(table);
  model.check_export(table, 1000);
}

TEST_P(TableEdgeTest, ConcurrentCallersAreSerialised) {
  Table table(config(8, 8, 20000));
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&table, t] {
      for (int round = 0; round < 20; ++round) {
        std::vector<Op> ops;
        for (int i = 0; i < 100; ++i) ops.push_back(put("t" + std::to_string(t) + "-" + std::to_string(i), std::to_string(round)));
        Columns cols(table, ops);
        table.execute(cols.in(), cols.out());
        for (int i = 0; i < 100; ++i) ASSERT_EQ(cols.status(i), OpStatus::kOk);
      }
    });
  }
  for (auto& c : callers) c.join();
  EXPECT_EQ(table.stats().device.items, 400u);
  Columns reads(table, {get("t0-0"), get("t3-99")});
  table.execute(reads.in(), reads.out());
  EXPECT_EQ(reads.value(0), "19");
  EXPECT_EQ(reads.value(1), "19");
}

TEST_P(TableEdgeTest, BadSettingsAreRejectedWithAClearError) {
  const auto rejects = [&](auto mutate, const char* needle) {
    TableConfig c = config();
    mutate(c);
    try {
      Table table(c);
      ADD_FAILURE() << "accepted a bad setting: " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Error::Code::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  rejects([](TableConfig& c) { c.key_width = 12; }, "key_width");
  rejects([](TableConfig& c) { c.value_width = 4; }, "value_width");
  rejects([](TableConfig& c) { c.ticket_bits = 1; }, "ticket_bits");
  rejects([](TableConfig& c) { c.ticket_bits = 3; }, "ticket_bits");
  rejects([](TableConfig& c) { c.capacity = 0; }, "capacity");
  rejects([](TableConfig& c) { c.max_load_factor = 1.5; }, "max_load_factor");
  rejects([](TableConfig& c) { c.cleanup_headroom = 0; }, "cleanup_headroom");
  rejects([](TableConfig& c) { c.cleanup_headroom = 1.5; }, "cleanup_headroom");
  rejects([](TableConfig& c) { c.max_batch = 0; }, "max_batch");
  rejects([](TableConfig& c) { c.slot_layout = SlotLayout::kLine; c.probing = Probing::kSingle; }, "group probing");
  // 8 + 32 + 32 bytes: one slot per 128-byte line.
  rejects([](TableConfig& c) { c.slot_layout = SlotLayout::kLine; c.key_width = 32; c.value_width = 32; }, "slot_layout board");
}

// The default layout (SlotLayout::kAuto) is picked by width and backend. Promise: on the GPU a table of 8-byte
// keys and 8-byte values (7 slots a line) gets the line layout, and any wider slot, single probing or
// the CPU backend gets the board; Table::config() and the stats say which (a line tier has no board), and a
// layout asked for by name is kept.
TEST_P(TableEdgeTest, DefaultLayoutIsPickedByWidthAndBackend) {
  struct Case {
    std::uint32_t key_width, value_width;
    Probing probing;
    bool line_on_gpu;
  };
  for (const Case k : {Case{8, 8, Probing::kGroup, true}, Case{8, 16, Probing::kGroup, false},
                       Case{16, 8, Probing::kGroup, false}, Case{8, 8, Probing::kSingle, false}}) {
    SCOPED_TRACE(testing::Message() << k.key_width << " / " << k.value_width << " " << to_string(k.probing));
    TableConfig c = config(k.key_width, k.value_width, 1000);
    c.probing = k.probing;
    ASSERT_EQ(c.slot_layout, SlotLayout::kAuto) << "the default";
    Table table(c);
    const bool line = k.line_on_gpu && GetParam() == BackendKind::kGpu;
    EXPECT_EQ(table.config().slot_layout, line ? SlotLayout::kLine : SlotLayout::kBoard);
    EXPECT_EQ(table.stats().device.board_bytes == 0, line);
    Model model(table.stats().device.max_items);
    model.run(table, {put("k", "v"), get("k"), del("k"), get("k"), put("k", "w")});
    model.check_contents(table);
  }
  TableConfig board = config();
  board.slot_layout = SlotLayout::kBoard;
  EXPECT_EQ(Table(board).config().slot_layout, SlotLayout::kBoard);
  EXPECT_STREQ(to_string(SlotLayout::kAuto), "auto");
}

// The line layout's memory: a unit is one 128-byte line holding its ticket word, its lengths word and as many
// packed slots as fit, with no board apart; every slot of it takes a key. 8-byte keys and values: 7 slots of
// 16 bytes, their lengths a nibble each; 16-byte keys: 4 slots of 24 bytes, a byte each. Values of every
// length from 0 to the width, overwritten with other lengths: a slot's lengths never disturb its
// neighbours', and an overwrite keeps its key's length.
TEST_P(TableEdgeTest, LineLayoutPacksAUnitIntoOneLine) {
  struct Widths {
    std::uint32_t key_width, value_width;
    std::uint64_t per_line;
  };
  for (const Widths w : {Widths{8, 8, 7}, Widths{16, 8, 4}}) {
    SCOPED_TRACE(testing::Message() << "key_width " << w.key_width);
    TableConfig c = config(w.key_width, w.value_width, 1000);
    c.slot_layout = SlotLayout::kLine;
    c.max_load_factor = 1.0;
    Table table(c);
    const TableStats s = table.stats();
    EXPECT_EQ(s.device.board_bytes, 0u);
    ASSERT_EQ(s.device.capacity % w.per_line, 0u);
    EXPECT_GE(s.device.capacity, 1000u);
    EXPECT_EQ(s.device.slot_bytes, s.device.capacity / w.per_line * kLineBytes);
    EXPECT_EQ(table.slot_count(), s.device.capacity / w.per_line * 8);  // positions keep the board's numbering
    const auto key = [](std::uint64_t i) { return "k" + std::to_string(i); };
    // `round` 0 or 1: i's value in that round, of length (i + round) % 9 (0 to 8 bytes).
    const auto value = [](std::uint64_t i, int round) {
      return (std::to_string(i) + "abcdefgh").substr(0, (i + round) % 9);
    };
    std::vector<Op> fill;
    for (std::uint64_t i = 0; i < s.device.capacity; ++i) fill.push_back(put(key(i), value(i, 0)));
    Columns all(table, fill);
    table.execute(all.in(), all.out());
    for (std::uint64_t i = 0; i < s.device.capacity; ++i) ASSERT_EQ(all.status(i), OpStatus::kOk) << i;
    Columns one_more(table, {put("one more", "x")});
    table.execute(one_more.in(), one_more.out());
    EXPECT_EQ(one_more.status(0), OpStatus::kFull);
    EXPECT_EQ(table.stats().device.items, s.device.capacity);
    // Every other key overwritten with a value of another length.
    std::vector<Op> overwrite;
    for (std::uint64_t i = 0; i < s.device.capacity; i += 2) overwrite.push_back(put(key(i), value(i, 1)));
    Columns over(table, overwrite);
    table.execute(over.in(), over.out());
    for (std::size_t j = 0; j < overwrite.size(); ++j) ASSERT_EQ(over.status(j), OpStatus::kOk) << j;
    // Packed slots sit side by side in a line: no write spilled into a neighbour.
    std::vector<Op> reads;
    for (std::uint64_t i = 0; i < s.device.capacity; ++i) reads.push_back(get(key(i)));
    Columns got(table, reads);
    table.execute(got.in(), got.out());
    for (std::uint64_t i = 0; i < s.device.capacity; ++i) {
      ASSERT_EQ(got.status(i), OpStatus::kOk) << i;
      ASSERT_EQ(got.value(i), value(i, i % 2 == 0 ? 1 : 0)) << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, TableEdgeTest, testing::Values(BackendKind::kCpu, BackendKind::kGpu),
                         [](const testing::TestParamInfo<BackendKind>& i) { return std::string(to_string(i.param)); });

}  // namespace
}  // namespace gpukv::test
