// Snapshots, against what a user of --data_dir is promised:
// - A restart loads the newest snapshot and replays the log after it: the table comes back as the last
//   acknowledged writes left it, whatever ran while the snapshot was being taken.
// - A snapshot taken while batches run holds every key no batch touched meanwhile exactly once, with its value.
// - Both tiers: a table that spilled to the host tier comes back with every item.
// - Without a log (--wal=off) a snapshot is what a restart keeps.
// - A durable snapshot removes the log segments and snapshots it supersedes; a crash's temporary files are
//   removed at start.
// - A snapshot cut short or with a flipped byte stops start-up with the file's name and the offset;
//   --recover_skip_corrupt passes over the damaged block. One of other widths is refused naming both.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpukv/table.hpp"
#include "persistence/batch_record.hpp"
#include "persistence/durability.hpp"
#include "persistence/snapshot_file.hpp"

namespace gpukv::server::persistence {
namespace {

namespace fs = std::filesystem;
using Items = std::map<std::string, std::string>;

constexpr std::uint32_t kKeyWidth = 16, kValueWidth = 40;

// One op of a batch.
struct Write {
  OpKind kind;
  std::string key, value;
};

// A table with a data directory, driven as the batcher drives it: execute a batch, log its successful writes,
// sync, and only then count them as acknowledged (in `acknowledged`).
class Shard {
 public:
  Shard(const fs::path& dir, WalMode wal, std::uint64_t capacity = 4096, std::uint64_t host_capacity = 0, bool skip_corrupt = false) {
    TableConfig config;
    config.backend = BackendKind::kCpu;
    config.capacity = capacity;
    config.host_capacity = host_capacity;
    config.key_width = kKeyWidth;
    config.value_width = kValueWidth;
    config.cpu_threads = 2;
    table_ = std::make_unique<Table>(config);
    durability_ = std::make_unique<Durability>(DurabilityOptions{dir, wal, skip_corrupt}, *table_, DurabilityObservers{});
  }
  Table& table() { return *table_; }
  Durability& durability() { return *durability_; }

  // Runs the writes as one batch; adds the acknowledged ones to `acknowledged`.
  void run(const std::vector<Write>& writes, Items* acknowledged) {
    const std::size_t n = writes.size();
    const std::uint32_t stride = table_->value_stride();
    std::vector<std::uint64_t> keys(n * kKeyWidth / 8 + 1), values(n * stride / 8 + 1);
    std::vector<std::uint8_t> ops(n), key_lens(n), status(n);
    std::vector<std::uint32_t> value_lens(n);
    auto* key_bytes = reinterpret_cast<std::uint8_t*>(keys.data());
    auto* value_bytes = reinterpret_cast<std::uint8_t*>(values.data());
    for (std::size_t i = 0; i < n; ++i) {
      ops[i] = static_cast<std::uint8_t>(writes[i].kind);
      key_lens[i] = static_cast<std::uint8_t>(writes[i].key.size());
      std::memcpy(key_bytes + i * kKeyWidth, writes[i].key.data(), writes[i].key.size());
      value_lens[i] = static_cast<std::uint32_t>(writes[i].value.size());
      std::memcpy(value_bytes + i * stride, writes[i].value.data(), writes[i].value.size());
    }
    const BatchIn in{n, ops.data(), key_bytes, key_lens.data(), value_bytes, value_lens.data()};
    table_->execute(in, BatchOut{status.data(), nullptr, nullptr});
    std::string record;
    durability_->encode_batch(in, status.data(), &record);
    ASSERT_EQ(durability_->append(record), "");
    ASSERT_EQ(durability_->sync(), "");
    for (std::size_t i = 0; i < n; ++i) {
      if (status[i] != static_cast<std::uint8_t>(OpStatus::kOk)) continue;
      if (writes[i].kind == OpKind::kDelete) {
        acknowledged->erase(writes[i].key);
      } else {
        (*acknowledged)[writes[i].key] = writes[i].value;
      }
    }
  }

 private:
  std::unique_ptr<Table> table_;
  std::unique_ptr<Durability> durability_;
};

// Everything in the table, read out whole.
Items contents(Table& table) {
  const std::uint64_t slots = table.slot_count();
  const std::uint32_t stride = table.value_stride();
  HostMemory keys = table.allocate_host(slots * kKeyWidth), key_lens = table.allocate_host(slots);
  HostMemory values = table.allocate_host(slots * stride), value_lens = table.allocate_host(slots * 4);
  const ItemColumns out{keys.data(), key_lens.data(), values.data(), reinterpret_cast<std::uint32_t*>(value_lens.data())};
  const std::size_t n = table.export_items(0, slots, out);
  Items items;
  for (std::size_t i = 0; i < n; ++i) {
    items[std::string(reinterpret_cast<const char*>(out.keys) + i * kKeyWidth, out.key_lens[i])] =
        std::string(reinterpret_cast<const char*>(out.values) + i * stride, out.value_lens[i]);
  }
  return items;
}

// Random PUTs and DELETEs over keys "k0" .. "k<key_count - 1>".
std::vector<Write> random_writes(std::mt19937& rng, std::size_t n, std::uint32_t key_count, std::uint32_t first_key = 0) {
  std::vector<Write> writes;
  for (std::size_t i = 0; i < n; ++i) {
    const std::string key = "k" + std::to_string(first_key + rng() % key_count);
    if (rng() % 4 == 0) {
      writes.push_back({OpKind::kDelete, key, {}});
    } else {
      writes.push_back({OpKind::kPut, key, std::string(rng() % (kValueWidth + 1), static_cast<char>('a' + rng() % 26))});
    }
  }
  return writes;
}

class SnapshotDir : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("gpukv-snapshot-test-" + std::to_string(getpid()) + "-" +
                                        testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // A data directory holding a snapshot of `items` random writes (and nothing after it); returns the items.
  Items make_snapshot(std::size_t items, std::uint64_t capacity = 4096) {
    Items model;
    std::mt19937 rng(5);
    Shard shard(dir_, WalMode::kEveryBatch, capacity);
    for (std::size_t done = 0; done < items; done += 100) shard.run(random_writes(rng, 100, 3000), &model);
    const SnapshotResult r = shard.durability().snapshot();
    EXPECT_EQ(r.error, "");
    EXPECT_EQ(r.items, model.size());
    return model;
  }
  fs::path dir_;
};

TEST_F(SnapshotDir, ASnapshotAndTheLogAfterItRestoreTheTable) {
  Items model;
  std::mt19937 rng(1);
  {
    Shard shard(dir_, WalMode::kEveryBatch);
    for (int b = 0; b < 30; ++b) shard.run(random_writes(rng, 1 + rng() % 200, 2000), &model);
    const SnapshotResult r = shard.durability().snapshot();
    ASSERT_EQ(r.error, "");
    EXPECT_EQ(r.items, model.size());
    EXPECT_EQ(fs::file_size(r.path), r.bytes);
    for (int b = 0; b < 30; ++b) shard.run(random_writes(rng, 1 + rng() % 200, 2000), &model);
  }
  // One snapshot, and the log from its start on: the segments before it are gone.
  const auto snapshots = list_snapshots(dir_);
  ASSERT_EQ(snapshots.size(), 1u);
  for (const SegmentFile& s : list_segments(dir_)) EXPECT_GE(s.first_seq, snapshots[0].log_start) << s.path;
  Shard again(dir_, WalMode::kEveryBatch);
  EXPECT_EQ(again.durability().recovery().snapshot.path, snapshots[0].path);
  EXPECT_EQ(again.durability().recovery().log.records, 30u) << "only the records after the snapshot are replayed";
  EXPECT_EQ(contents(again.table()), model);
}

TEST_F(SnapshotDir, ASnapshotTakenWhileBatchesRunHoldsEveryUntouchedKeyAndTheLogCompletesIt) {
  Items model;
  std::mt19937 rng(2);
  auto serving = std::make_unique<Shard>(dir_, WalMode::kEveryBatch, 20000);
  Shard& shard = *serving;
  // Keys k0..k3999 are written once and then left alone; k4000..k7999 churn throughout.
  std::vector<Write> steady;
  for (int k = 0; k < 4000; ++k) steady.push_back({OpKind::kPut, "k" + std::to_string(k), "steady" + std::to_string(k)});
  shard.run(steady, &model);
  for (int b = 0; b < 20; ++b) shard.run(random_writes(rng, 300, 4000, 4000), &model);
  const Items untouched = model;
  std::atomic<bool> stop{false};
  std::atomic<int> batches_during{0};
  Items churned = model;
  std::thread writer([&] {
    std::mt19937 wrng(3);
    while (!stop) {
      shard.run(random_writes(wrng, 200, 4000, 4000), &churned);
      ++batches_during;
    }
  });
  SnapshotResult r;
  // Snapshots until batches demonstrably ran during one (a 20000-slot scan is quick).
  for (int attempt = 0; attempt < 50; ++attempt) {
    const int before = batches_during;
    r = shard.durability().snapshot();
    ASSERT_EQ(r.error, "");
    if (batches_during - before >= 2) break;
  }
  stop = true;
  writer.join();
  model = churned;
  // The snapshot file alone: every untouched key once, with its value.
  Items in_file;
  std::map<std::string, int> times;
  SnapshotLoad load;
  ASSERT_EQ(read_snapshot(list_snapshots(dir_).back(), LogShape{kKeyWidth, kValueWidth}, false,
                          [&](std::string_view payload) {
                            DecodedWrites w;
                            if (std::string e = decode_writes(payload, kKeyWidth, kValueWidth, &w); !e.empty()) return e;
                            // Expanded into columns, as loading does, to read keys and values back.
                            std::vector<std::uint8_t> ops(w.count), key_lens(w.count), keys(w.count * kKeyWidth),
                                values(w.count * value_stride(kValueWidth));
                            std::vector<std::uint32_t> value_lens(w.count);
                            expand_writes(w, kKeyWidth, value_stride(kValueWidth), ops.data(), key_lens.data(), keys.data(),
                                          value_lens.data(), values.data());
                            for (std::size_t i = 0; i < w.count; ++i) {
                              const std::string key(reinterpret_cast<const char*>(&keys[i * kKeyWidth]), key_lens[i]);
                              in_file[key] = std::string(reinterpret_cast<const char*>(&values[i * value_stride(kValueWidth)]),
                                                         value_lens[i]);
                              ++times[key];
                            }
                            return std::string();
                          },
                          &load),
            "");
  for (int k = 0; k < 4000; ++k) {
    const std::string key = "k" + std::to_string(k);
    EXPECT_EQ(times[key], 1) << key;
    EXPECT_EQ(in_file[key], untouched.at(key)) << key;
  }
  // The snapshot and the log after it: exactly the acknowledged state.
  serving.reset();
  Shard again(dir_, WalMode::kEveryBatch, 20000);
  EXPECT_EQ(contents(again.table()), model);
}

TEST_F(SnapshotDir, BothTiersComeBackWithEveryItem) {
  Items model;
  std::mt19937 rng(4);
  {
    Shard shard(dir_, WalMode::kOff, 500, 2000);
    std::vector<Write> fill;
    for (int k = 0; k < 1500; ++k) fill.push_back({OpKind::kPut, "k" + std::to_string(k), "v" + std::to_string(k)});
    shard.run(fill, &model);
    shard.run(random_writes(rng, 300, 1500), &model);
    ASSERT_GT(shard.table().stats().host.items, 0u) << "the table did not spill";
    ASSERT_EQ(shard.durability().snapshot().error, "");
  }
  Shard again(dir_, WalMode::kOff, 500, 2000);
  EXPECT_EQ(contents(again.table()), model);
  EXPECT_GT(again.table().stats().host.items, 0u);
}

TEST_F(SnapshotDir, WithoutALogTheLastSnapshotIsWhatARestartKeeps) {
  Items at_snapshot, model;
  std::mt19937 rng(6);
  {
    Shard shard(dir_, WalMode::kOff);
    shard.run(random_writes(rng, 500, 1000), &model);
    ASSERT_EQ(shard.durability().snapshot().error, "");
    at_snapshot = model;
    shard.run(random_writes(rng, 500, 1000), &model);
    EXPECT_TRUE(list_segments(dir_).empty()) << "--wal=off writes no log";
  }
  Shard again(dir_, WalMode::kOff);
  EXPECT_EQ(contents(again.table()), at_snapshot);
}

TEST_F(SnapshotDir, ANewSnapshotRemovesWhatItSupersedesAndStartRemovesTemporaryFiles) {
  Items model;
  std::mt19937 rng(7);
  {
    Shard shard(dir_, WalMode::kEveryBatch);
    for (int round = 0; round < 3; ++round) {
      shard.run(random_writes(rng, 100, 500), &model);
      ASSERT_EQ(shard.durability().snapshot().error, "");
      EXPECT_EQ(list_snapshots(dir_).size(), 1u);
      EXPECT_EQ(list_segments(dir_).size(), 1u);
    }
  }
  std::ofstream(dir_ / "snapshot-00000000000000ff.snap.tmp") << "a crash left this";
  Shard again(dir_, WalMode::kEveryBatch);
  EXPECT_FALSE(fs::exists(dir_ / "snapshot-00000000000000ff.snap.tmp"));
  EXPECT_EQ(contents(again.table()), model);
}

TEST_F(SnapshotDir, ASnapshotRequestIsAnsweredByASnapshotThatStartsAfterIt) {
  Items model;
  std::mt19937 rng(8);
  Shard shard(dir_, WalMode::kOff);
  shard.run(random_writes(rng, 300, 1000), &model);
  std::promise<SnapshotResult> answered;
  shard.durability().request_snapshot([&](const SnapshotResult& r) { answered.set_value(r); });
  const SnapshotResult r = answered.get_future().get();
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.items, model.size());
}

TEST_F(SnapshotDir, ACutShortSnapshotStopsStartNamingFileAndOffset) {
  const Items model = make_snapshot(400);
  const fs::path file = list_snapshots(dir_).back().path;
  const auto size = fs::file_size(file);
  const std::string whole = [&] {
    std::ifstream in(file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  // Every length short of whole, in steps that visit the header, block headers, payloads and checksums.
  for (std::uintmax_t cut = 0; cut < size; cut += (cut < 200 ? 1 : 97)) {
    std::ofstream(file, std::ios::binary | std::ios::trunc).write(whole.data(), static_cast<std::streamsize>(cut));
    try {
      Shard shard(dir_, WalMode::kEveryBatch);
      ADD_FAILURE() << "a snapshot cut to " << cut << " of " << size << " bytes was accepted";
    } catch (const std::runtime_error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(file.string() + " at offset "), std::string::npos) << what;
    }
  }
  std::ofstream(file, std::ios::binary | std::ios::trunc).write(whole.data(), static_cast<std::streamsize>(whole.size()));
  Shard shard(dir_, WalMode::kEveryBatch);
  EXPECT_EQ(contents(shard.table()), model);
}

TEST_F(SnapshotDir, AFlippedByteStopsStartUnlessSkipCorruptWhichLosesOnlyThatBlock) {
  // A table of enough slots for several ranges of the scan: a snapshot of several blocks.
  constexpr std::uint64_t kSlots = 1 << 20;
  const Items model = make_snapshot(2000, kSlots);
  const fs::path file = list_snapshots(dir_).back().path;
  {
    std::fstream f(file, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(static_cast<std::streamoff>(kSnapshotAlign + 100));
    char c = 0;
    f.read(&c, 1);
    f.seekp(static_cast<std::streamoff>(kSnapshotAlign + 100));
    c = static_cast<char>(c ^ 0x40);
    f.write(&c, 1);
  }
  try {
    Shard shard(dir_, WalMode::kEveryBatch, kSlots);
    ADD_FAILURE() << "a damaged snapshot was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(file.string() + " at offset 4096: a record whose checksum does not match"), std::string::npos)
        << e.what();
  }
  Shard shard(dir_, WalMode::kEveryBatch, kSlots, 0, /*skip_corrupt=*/true);
  const std::vector<std::string>& skipped = shard.durability().recovery().snapshot.skipped;
  ASSERT_EQ(skipped.size(), 2u) << "the damaged block, and the item count it leaves short";
  EXPECT_NE(skipped[0].find(file.string() + " at offset 4096"), std::string::npos) << skipped[0];
  // The first block is lost; the blocks after it are loaded.
  EXPECT_GT(shard.table().stats().device.items, 0u);
  EXPECT_LT(shard.table().stats().device.items, model.size());
}

TEST_F(SnapshotDir, ASnapshotOfOtherWidthsIsRefusedWithBoth) {
  make_snapshot(100);
  TableConfig config;
  config.backend = BackendKind::kCpu;
  config.key_width = 32;
  config.value_width = kValueWidth;
  Table table(config);
  try {
    Durability durability(DurabilityOptions{dir_, WalMode::kOff, false}, table, {});
    ADD_FAILURE() << "a snapshot of other widths was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("key width 16 and value width 40; this server has key width 32"), std::string::npos) << e.what();
  }
}

// A table too small for the data: start-up stops, saying so and where, instead of serving part of it.
TEST_F(SnapshotDir, ATableTooSmallForTheSnapshotStopsStartWithTheReason) {
  const Items model = make_snapshot(2000);
  ASSERT_GT(model.size(), 1000u);
  try {
    Shard shard(dir_, WalMode::kEveryBatch, 1000);
    ADD_FAILURE() << "a snapshot of " << model.size() << " items loaded into 1000 slots";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the table refused a logged write (FULL)"), std::string::npos) << what;
    EXPECT_NE(what.find("--capacity"), std::string::npos) << what;
  }
}

TEST_F(SnapshotDir, AnEmptyDirectoryStartsEmptyAndSnapshotsAnEmptyTable) {
  {
    Shard shard(dir_, WalMode::kEveryBatch);
    EXPECT_TRUE(shard.durability().recovery().snapshot.path.empty());
    const SnapshotResult r = shard.durability().snapshot();
    ASSERT_EQ(r.error, "");
    EXPECT_EQ(r.items, 0u);
  }
  Shard again(dir_, WalMode::kEveryBatch);
  EXPECT_EQ(again.table().stats().device.items, 0u);
  EXPECT_FALSE(again.durability().recovery().snapshot.path.empty());
}

}  // namespace
}  // namespace gpukv::server::persistence
