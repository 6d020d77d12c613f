// The host tier, on every backend present: where new keys go (the device tier until it is at its maximum
// load, then the host tier), that a key stays in its tier when it is overwritten and is freed where it is,
// mixed batches over both tiers, both tiers full, the host tier's clean-up, and the host-traffic counters
// (reads, writes, reads the ticket-board avoided) that the service exports.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model.hpp"

namespace gpukv::test {
namespace {

class TableTierTest : public testing::TestWithParam<BackendKind> {
 protected:
  void SetUp() override {
    if (GetParam() == BackendKind::kGpu && !Table::gpu_available()) {
      GTEST_SKIP() << "SKIPPED: no CUDA device on this machine; GPU host-tier tests did not run";
    }
  }
  TableConfig config(std::uint64_t device = 1000, std::uint64_t host = 4000, std::uint32_t ticket_bits = 8) const {
    TableConfig c;
    c.backend = GetParam();
    c.key_width = 16;
    c.value_width = 24;
    c.capacity = device;
    c.host_capacity = host;
    c.ticket_bits = ticket_bits;
    return c;
  }
};

Op put(std::string k, std::string v) { return Op{OpKind::kPut, std::move(k), std::move(v)}; }
Op put_if_absent(std::string k, std::string v) { return Op{OpKind::kPutIfAbsent, std::move(k), std::move(v)}; }
Op get(std::string k) { return Op{OpKind::kGet, std::move(k), {}}; }
Op del(std::string k) { return Op{OpKind::kDelete, std::move(k), {}}; }

std::string key(std::uint64_t i) { return "key-" + std::to_string(i); }
std::string value(std::uint64_t i, int version = 0) { return "v" + std::to_string(version) + "-" + std::to_string(i); }

std::vector<Op> puts(std::uint64_t begin, std::uint64_t end, int version = 0) {
  std::vector<Op> ops;
  for (std::uint64_t i = begin; i < end; ++i) ops.push_back(put(key(i), value(i, version)));
  return ops;
}
std::vector<Op> gets(std::uint64_t begin, std::uint64_t end) {
  std::vector<Op> ops;
  for (std::uint64_t i = begin; i < end; ++i) ops.push_back(get(key(i)));
  return ops;
}

// Keys [0, device_max) fill the device tier; keys [device_max, device_max + host_keys) go to the host tier.
// Two batches: within one batch, which new keys get the device tier's last room is a race between
// concurrent ops (on a GPU, not batch order), so a single batch would not say which key lives where.
void fill_tiers(Table& table, Model& model, std::uint64_t device_max, std::uint64_t host_keys) {
  model.run(table, puts(0, device_max));
  model.run(table, puts(device_max, device_max + host_keys));
  ASSERT_EQ(table.stats().device.items, device_max);
  ASSERT_EQ(table.stats().host.items, host_keys);
}

TEST_P(TableTierTest, NewKeysFillTheDeviceTierFirstThenSpill) {
  Table table(config());
  const TableStats empty = table.stats();
  ASSERT_GT(empty.host.capacity, 0u);
  const std::uint64_t device_max = empty.device.max_items;
  Model model(total_max_items(empty));

  model.run(table, puts(0, device_max));
  TableStats s = table.stats();
  EXPECT_EQ(s.device.items, device_max);
  EXPECT_EQ(s.host.items, 0u);
  EXPECT_EQ(s.host_writes, 0u) << "no host write before the device tier is full";

  model.run(table, puts(device_max, device_max + 300));
  s = table.stats();
  EXPECT_EQ(s.device.items, device_max);
  EXPECT_EQ(s.host.items, 300u);
  EXPECT_EQ(s.host_writes, 300u) << "an insert into the host tier writes host memory once";

  // Room freed in the device tier takes the next new keys; the host tier keeps what it has.
  std::vector<Op> deletes;
  for (std::uint64_t i = 0; i < 50; ++i) deletes.push_back(del(key(i)));
  model.run(table, deletes);
  model.run(table, puts(10000, 10050));
  s = table.stats();
  EXPECT_EQ(s.device.items, device_max);
  EXPECT_EQ(s.host.items, 300u);
  model.check_contents(table);
}

TEST_P(TableTierTest, AKeyStaysInItsTier) {
  Table table(config());
  const std::uint64_t device_max = table.stats().device.max_items;
  Model model(total_max_items(table.stats()));
  fill_tiers(table, model, device_max, 200);
  const std::uint64_t host_key = device_max + 7, device_key = 3;

  const TableStats before = table.stats();
  model.run(table, {put(key(host_key), "new host value"), put(key(device_key), "new device value")});
  TableStats s = table.stats();
  EXPECT_EQ(s.device.items, before.device.items);
  EXPECT_EQ(s.host.items, before.host.items);
  EXPECT_EQ(s.host_writes, before.host_writes + 1) << "the overwrite of a host key writes it where it is";

  model.run(table, {put_if_absent(key(host_key), "x"), put_if_absent(key(device_key), "x"), get(key(host_key))});

  // Deleting a host key frees host room, not device room; the key is gone from both.
  model.run(table, {del(key(host_key)), get(key(host_key))});
  s = table.stats();
  EXPECT_EQ(s.device.items, before.device.items);
  EXPECT_EQ(s.host.items, before.host.items - 1);
  // Re-inserted while the device tier is full, it goes back to the host tier.
  model.run(table, {put(key(host_key), "again"), get(key(host_key))});
  EXPECT_EQ(table.stats().host.items, before.host.items);
  model.check_contents(table);
}

TEST_P(TableTierTest, OneBatchMixesBothTiers) {
  Table table(config());
  const std::uint64_t device_max = table.stats().device.max_items;
  Model model(total_max_items(table.stats()));
  model.run(table, puts(0, device_max + 500));
  // Every kind of op on device keys, host keys and absent keys, repeated keys included, in one pass.
  Generator gen(77, 16, 24);
  for (int round = 0; round < 30; ++round) {
    std::vector<Op> ops;
    for (int i = 0; i < 400; ++i) {
      const std::uint64_t k = gen.next(static_cast<std::uint32_t>(device_max + 900));
      const std::uint32_t r = gen.next(10);
      if (r < 4) {
        ops.push_back(get(key(k)));
      } else if (r < 7) {
        ops.push_back(put(key(k), gen.value()));
      } else if (r < 8) {
        ops.push_back(put_if_absent(key(k), gen.value()));
      } else {
        ops.push_back(del(key(k)));
      }
    }
    model.run(table, ops);
    ASSERT_FALSE(HasFatalFailure()) << "round " << round;
  }
  model.check_contents(table);
  EXPECT_GT(table.stats().host.items, 0u);
}

TEST_P(TableTierTest, BothTiersFullRefuseWritesAndLoseNothing) {
  Table table(config(500, 1500));
  const TableStats empty = table.stats();
  const std::uint64_t total = total_max_items(empty);
  Model model(total);
  model.run(table, puts(0, total));
  ASSERT_EQ(total_items(table.stats()), total);

  const TableStats full = table.stats();
  Columns cols(table, puts(total, total + 100));
  table.execute(cols.in(), cols.out());
  for (std::size_t i = 0; i < 100; ++i) ASSERT_EQ(cols.status(i), OpStatus::kFull) << i;
  const TableStats after = table.stats();
  EXPECT_EQ(after.device.items, full.device.items);
  EXPECT_EQ(after.host.items, full.host.items);
  EXPECT_EQ(after.host_writes, full.host_writes) << "a refused write touches no host memory";
  // Overwrites of stored keys still work in both tiers.
  model.run(table, {put(key(1), "still writable"), put(key(total - 1), "here too")});
  model.check_contents(table);
}

TEST_P(TableTierTest, HostTrafficOnlyWhereNeeded) {
  Table table(config(1000, 20000));
  const std::uint64_t device_max = table.stats().device.max_items;
  const std::uint64_t host_keys = 15000;
  Model model(total_max_items(table.stats()));
  fill_tiers(table, model, device_max, host_keys);

  // Lookups of absent keys: the host tier's tickets reject almost all of them without a host read.
  TableStats before = table.stats();
  Columns misses(table, gets(1000000, 1010000));
  table.execute(misses.in(), misses.out());
  for (std::size_t i = 0; i < 10000; ++i) ASSERT_EQ(misses.status(i), OpStatus::kNotFound);
  TableStats after = table.stats();
  const std::uint64_t miss_reads = after.host_reads - before.host_reads;
  // An 8-bit ticket and the tag byte let through about 1 foreign slot in 253 * 256; a miss passes ~10.
  EXPECT_LT(miss_reads, 50u);
  EXPECT_GT(after.host_avoided - before.host_avoided, 10000u) << "the walks passed occupied host slots";
  EXPECT_EQ(after.host_writes, before.host_writes);

  // Lookups of host keys: one read each, plus the rare ticket that matched a foreign key.
  before = after;
  model.run(table, gets(device_max, device_max + host_keys));
  after = table.stats();
  const std::uint64_t hit_reads = after.host_reads - before.host_reads;
  EXPECT_GE(hit_reads, host_keys);
  EXPECT_LT(hit_reads, host_keys + host_keys / 200);

  // Lookups of device keys never reach the host tier.
  before = after;
  model.run(table, gets(0, device_max));
  after = table.stats();
  EXPECT_EQ(after.host_reads, before.host_reads);
  EXPECT_EQ(after.host_avoided, before.host_avoided);
}

TEST_P(TableTierTest, NoHostWalkWhileTheHostTierIsEmpty) {
  Table table(config());
  Model model(total_max_items(table.stats()));
  model.run(table, puts(0, 500));
  model.run(table, gets(0, 1000));
  const TableStats s = table.stats();
  EXPECT_EQ(s.host_reads + s.host_avoided + s.host_writes, 0u);
}

TEST_P(TableTierTest, HostTierCleanupKeepsEveryKey) {
  TableConfig c = config(500, 3000);
  c.cleanup_tombstones = 0.05;  // clean-ups run often: about every 150 host-tier deletions
  Table table(c);
  const std::uint64_t device_max = table.stats().device.max_items;
  Model model(total_max_items(table.stats()));
  fill_tiers(table, model, device_max, 2500);
  const std::uint64_t cleanups_before = table.stats().cleanups;
  // Churn in the host tier: delete and re-insert so that tombstones pile up there and get cleaned.
  for (int round = 0; round < 8; ++round) {
    std::vector<Op> ops;
    for (std::uint64_t i = device_max; i < device_max + 2500; i += 3 + round % 2) ops.push_back(del(key(i)));
    model.run(table, ops);
    model.run(table, puts(device_max, device_max + 2500, round + 1));
    ASSERT_FALSE(HasFatalFailure()) << "round " << round;
  }
  EXPECT_GT(table.stats().cleanups, cleanups_before) << "no clean-up ran";
  model.check_contents(table);
  // An explicit clean-up empties both tiers of tombstones.
  model.run(table, {del(key(device_max + 1)), del(key(2))});
  ASSERT_TRUE(table.cleanup());
  EXPECT_EQ(table.stats().device.tombstones, 0u);
  EXPECT_EQ(table.stats().host.tombstones, 0u);
  model.check_contents(table);
}

TEST_P(TableTierTest, SizesAndSettings) {
  TableConfig none = config(1000, 0);
  Table plain(none);
  EXPECT_EQ(plain.stats().host.capacity, 0u);
  EXPECT_EQ(plain.stats().host.max_items, 0u);
  const TableStats s = Table(config(1000, 5000)).stats();
  EXPECT_GE(s.host.capacity, 5000u);
  EXPECT_GT(s.host.board_bytes, 0u);
  EXPECT_EQ(s.host.slot_bytes, s.host.capacity * (s.device.slot_bytes / s.device.capacity));
  TableConfig huge = config(1000, std::uint64_t{1} << 41);
  EXPECT_THROW(Table{huge}, Error);
}

INSTANTIATE_TEST_SUITE_P(Backends, TableTierTest, testing::Values(BackendKind::kCpu, BackendKind::kGpu),
                         [](const testing::TestParamInfo<BackendKind>& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace gpukv::test
