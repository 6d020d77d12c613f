// The write-ahead log's records and files, against what a user of --data_dir is promised:
// - A batch's successful writes come back from the log exactly, in batch order; nothing else is logged.
// - Every record appended (and, with kEveryBatch, acknowledged) is read back, in order, after a restart.
// - A last record cut short at any byte (a crash mid-write) is dropped, everything before it is kept, and
//   the file is cut so that later appends follow whole records.
// - Damage anywhere else (a flipped byte in a middle record, a missing segment) stops recovery with the
//   file's name and the offset; --recover_skip_corrupt passes over it and says what it lost.
// - A log written with other widths is refused with a message naming both.
// - A failed write leaves no record behind, and the log takes appends again once writing works.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gpukv/table.hpp"
#include "persistence/batch_record.hpp"
#include "persistence/durability.hpp"
#include "persistence/log_file.hpp"

namespace gpukv::server::persistence {
namespace {

namespace fs = std::filesystem;

constexpr LogShape kShape{16, 32};

class LogDir : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("gpukv-log-test-" + std::to_string(getpid()) + "-" +
                                        testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Reads the whole log; returns the error (empty if none) and fills `payloads` with what was applied.
  std::string read(std::vector<std::string>* payloads, LogReplay* replay = nullptr, bool skip_corrupt = false,
                   LogShape shape = kShape, std::uint64_t from_seq = 1) {
    LogReplay local;
    if (replay == nullptr) replay = &local;
    payloads->clear();
    std::uint64_t last = 0;
    return read_log(dir_, shape, skip_corrupt, from_seq,
                    [&](std::uint64_t seq, std::string_view payload) {
                      EXPECT_GT(seq, last) << "records arrive in order";
                      last = seq;
                      payloads->emplace_back(payload);
                      return std::string();
                    },
                    replay);
  }

  static std::vector<std::string> payloads(int n, int seed) {
    std::mt19937 rng(seed);
    std::vector<std::string> out;
    for (int i = 0; i < n; ++i) {
      std::string p(1 + rng() % 300, '\0');
      for (char& c : p) c = static_cast<char>(rng());
      out.push_back(p);
    }
    return out;
  }

  std::vector<std::string> write(const std::vector<std::string>& records, SyncPolicy policy = SyncPolicy::kEveryBatch) {
    LogWriter writer(dir_, kShape, 1 + written_, policy);
    for (const std::string& p : records) {
      EXPECT_EQ(writer.append(p), "");
      ++written_;
    }
    return records;
  }

  fs::path dir_;
  std::uint64_t written_ = 0;
};

std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void put_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(BatchRecord, KeepsTheSuccessfulWritesInBatchOrderAndNothingElse) {
  constexpr std::uint32_t kKeyWidth = 16, kValueWidth = 32, kStride = 32;
  const std::vector<std::uint8_t> ops = {1, 0, 2, 3, 1, 2, 3, 1};
  const std::vector<std::uint8_t> status = {0, 0, 0, 0, 3, 2, 1, 0};  // OK, OK(get), OK, OK, FULL, EXISTS, NOT_FOUND, OK
  const std::size_t n = ops.size();
  std::vector<std::uint8_t> keys(n * kKeyWidth, 0xEE), key_lens(n), values(n * kStride, 0xDD);
  std::vector<std::uint32_t> value_lens(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    key_lens[i] = static_cast<std::uint8_t>(i % 2 == 0 ? i + 1 : kKeyWidth);
    for (std::size_t b = 0; b < key_lens[i]; ++b) keys[i * kKeyWidth + b] = static_cast<std::uint8_t>('a' + i);
    if (ops[i] == 1 || ops[i] == 2) {
      value_lens[i] = static_cast<std::uint32_t>(i == 7 ? 0 : 3 * i + 1);  // an empty value too
      for (std::size_t b = 0; b < value_lens[i]; ++b) values[i * kStride + b] = static_cast<std::uint8_t>('A' + i);
    }
  }
  const BatchIn in{n, ops.data(), keys.data(), key_lens.data(), values.data(), value_lens.data()};
  std::string payload = "prefix";
  ASSERT_EQ(encode_writes(in, status.data(), kKeyWidth, kStride, payload), 4u);  // rows 0, 2, 3, 7
  payload.erase(0, 6);

  DecodedWrites w;
  ASSERT_EQ(decode_writes(payload, kKeyWidth, kValueWidth, &w), "");
  ASSERT_EQ(w.count, 4u);
  std::vector<std::uint8_t> rops(4), rkey_lens(4), rkeys(4 * kKeyWidth), rvalues(4 * kStride);
  std::vector<std::uint32_t> rvalue_lens(4);
  expand_writes(w, kKeyWidth, kStride, rops.data(), rkey_lens.data(), rkeys.data(), rvalue_lens.data(), rvalues.data());
  const std::size_t rows[] = {0, 2, 3, 7};
  const std::uint8_t kinds[] = {1, 1, 3, 1};  // PUT_IF_ABSENT that stored is logged as PUT
  for (int j = 0; j < 4; ++j) {
    const std::size_t i = rows[j];
    EXPECT_EQ(rops[j], kinds[j]);
    ASSERT_EQ(rkey_lens[j], key_lens[i]);
    EXPECT_EQ(std::memcmp(&rkeys[j * kKeyWidth], &keys[i * kKeyWidth], key_lens[i]), 0);
    ASSERT_EQ(rvalue_lens[j], kinds[j] == 1 ? value_lens[i] : 0u);
    EXPECT_EQ(std::memcmp(&rvalues[j * kStride], &values[i * kStride], rvalue_lens[j]), 0);
  }

  std::string none;
  const std::vector<std::uint8_t> all_failed(n, 4);
  EXPECT_EQ(encode_writes(in, all_failed.data(), kKeyWidth, kStride, none), 0u);
  EXPECT_TRUE(none.empty()) << "a batch that changed nothing writes no record";
}

TEST(BatchRecord, RefusesPayloadsThatDoNotFitTheWidths) {
  const std::vector<std::uint8_t> ops = {1};
  const std::vector<std::uint8_t> status = {0};
  std::vector<std::uint8_t> keys(32, 'k'), key_lens = {20}, values(64, 'v');
  std::vector<std::uint32_t> value_lens = {40};
  const BatchIn in{1, ops.data(), keys.data(), key_lens.data(), values.data(), value_lens.data()};
  std::string payload;
  encode_writes(in, status.data(), 32, 64, payload);
  DecodedWrites w;
  EXPECT_EQ(decode_writes(payload, 32, 64, &w), "");
  EXPECT_NE(decode_writes(payload, 16, 64, &w).find("over the key width 16"), std::string::npos);
  EXPECT_NE(decode_writes(payload, 32, 32, &w).find("over the value width 32"), std::string::npos);
  EXPECT_NE(decode_writes(payload.substr(0, payload.size() - 1), 32, 64, &w), "");
  EXPECT_NE(decode_writes(payload + "x", 32, 64, &w), "");
}

TEST_F(LogDir, AnEmptyDirectoryHasNoRecords) {
  std::vector<std::string> got;
  LogReplay replay;
  ASSERT_EQ(read(&got, &replay), "");
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(replay.next_seq, 1u);
}

TEST_F(LogDir, EveryAppendedRecordIsReadBackInOrderAcrossSegments) {
  const auto first = write(payloads(50, 1));
  const auto second = write(payloads(30, 2), SyncPolicy::kEverySecond);  // a restart: a new segment
  std::vector<std::string> got;
  LogReplay replay;
  ASSERT_EQ(read(&got, &replay), "");
  std::vector<std::string> want = first;
  want.insert(want.end(), second.begin(), second.end());
  EXPECT_EQ(got, want);
  EXPECT_EQ(replay.segments, 2u);
  EXPECT_EQ(replay.next_seq, 81u);
  EXPECT_TRUE(replay.torn.empty());
}

TEST_F(LogDir, ALastRecordCutShortAtAnyByteIsDroppedAndCutFromTheFile) {
  const auto records = write(payloads(5, 3));
  const fs::path segment = list_segments(dir_).back().path;
  const std::string whole = file_bytes(segment);
  const std::size_t last = encode_record(5, records[4]).size();
  for (std::size_t cut = whole.size() - last; cut < whole.size(); ++cut) {
    put_bytes(segment, whole.substr(0, cut));
    std::vector<std::string> got;
    LogReplay replay;
    ASSERT_EQ(read(&got, &replay), "") << "cut at " << cut;
    ASSERT_EQ(got, std::vector<std::string>(records.begin(), records.begin() + 4)) << "cut at " << cut;
    EXPECT_EQ(replay.next_seq, 5u);
    EXPECT_EQ(replay.torn.empty(), cut == whole.size() - last) << "cut at " << cut << ": " << replay.torn;
    EXPECT_EQ(fs::file_size(segment), whole.size() - last) << "the torn bytes are cut off";
  }
  // Appends after recovery follow the whole records.
  LogWriter writer(dir_, kShape, 5, SyncPolicy::kEveryBatch);
  ASSERT_EQ(writer.append("after"), "");
  std::vector<std::string> got;
  ASSERT_EQ(read(&got), "");
  ASSERT_EQ(got.size(), 5u);
  EXPECT_EQ(got.back(), "after");
}

TEST_F(LogDir, AFlippedByteInAMiddleRecordStopsRecoveryNamingFileAndOffset) {
  const auto records = write(payloads(6, 4));
  const fs::path segment = list_segments(dir_).back().path;
  const std::string whole = file_bytes(segment);
  std::size_t offset = kSegmentHeaderBytes;
  for (int i = 0; i < 2; ++i) offset += encode_record(i + 1, records[i]).size();  // record 3 starts here
  std::mt19937 rng(5);
  for (int trial = 0; trial < 40; ++trial) {
    std::string damaged = whole;
    const std::size_t at = offset + rng() % encode_record(3, records[2]).size();
    damaged[at] = static_cast<char>(damaged[at] ^ (1 + rng() % 255));
    put_bytes(segment, damaged);
    std::vector<std::string> got;
    const std::string error = read(&got);
    ASSERT_NE(error, "") << "byte " << at;
    EXPECT_NE(error.find(segment.string()), std::string::npos) << error;
    EXPECT_NE(error.find("at offset " + std::to_string(offset)), std::string::npos) << error;
    EXPECT_EQ(fs::file_size(segment), whole.size()) << "damage is reported, never cut";

    // Skipping it keeps every other record, and says what was lost.
    LogReplay replay;
    ASSERT_EQ(read(&got, &replay, true), "");
    EXPECT_EQ(replay.skipped.size(), 1u);
    std::vector<std::string> want = records;
    want.erase(want.begin() + 2);
    EXPECT_EQ(got.size(), want.size());
  }
}

TEST_F(LogDir, AMissingSegmentIsReported) {
  write(payloads(3, 6));
  write(payloads(3, 7));
  write(payloads(3, 8));
  const auto segments = list_segments(dir_);
  ASSERT_EQ(segments.size(), 3u);
  fs::remove(segments[1].path);
  std::vector<std::string> got;
  const std::string error = read(&got);
  EXPECT_NE(error.find("records 4 to 6 are missing"), std::string::npos) << error;
}

TEST_F(LogDir, ALogOfOtherWidthsIsRefusedWithBoth) {
  write(payloads(2, 9));
  std::vector<std::string> got;
  const std::string error = read(&got, nullptr, false, LogShape{32, 32});
  EXPECT_NE(error.find("key width 16 and value width 32"), std::string::npos) << error;
  EXPECT_NE(error.find("key width 32 and value width 32"), std::string::npos) << error;
  EXPECT_TRUE(got.empty());
}

TEST_F(LogDir, RecordsAfterAFailedSyncAreSupersededByTheNextSegment) {
  // What a writer leaves when an fdatasync fails after record 3 was written: the record is in the old
  // segment (maybe on disk, never acknowledged) and the writer goes on in a segment that starts at 3.
  const auto before = payloads(3, 10);
  {
    LogWriter writer(dir_, kShape, 1, SyncPolicy::kEveryBatch);
    for (const auto& p : before) ASSERT_EQ(writer.append(p), "");
  }
  {
    LogWriter writer(dir_, kShape, 3, SyncPolicy::kEveryBatch);
    ASSERT_EQ(writer.append("third, again"), "");
    ASSERT_EQ(writer.append("fourth"), "");
  }
  std::vector<std::string> got;
  ASSERT_EQ(read(&got), "");
  EXPECT_EQ(got, (std::vector<std::string>{before[0], before[1], "third, again", "fourth"}));

  // What a failed fdatasync left of the superseded record is never read, damaged or not.
  const fs::path old_segment = list_segments(dir_).front().path;
  std::string bytes = file_bytes(old_segment);
  bytes[bytes.size() - 3] ^= 0x55;  // in record 3's checksum
  put_bytes(old_segment, bytes);
  ASSERT_EQ(read(&got), "");
  EXPECT_EQ(got.size(), 4u);
}

TEST_F(LogDir, RecordsWrittenTogetherAreMadeDurableByOneSync) {
  // Group commit: several records written, one sync for all of them. (A failed sync's aftermath, a newer
  // segment starting at the first unsynced record, is the test above.)
  LogWriter writer(dir_, kShape, 1, SyncPolicy::kEveryBatch);
  ASSERT_EQ(writer.append("one"), "");
  ASSERT_EQ(writer.write("two"), "");
  ASSERT_EQ(writer.write("three"), "");
  EXPECT_EQ(writer.next_seq(), 4u);
  EXPECT_EQ(writer.sync(), "");
  EXPECT_EQ(writer.sync(), "") << "nothing new to sync";
  std::vector<std::string> got;
  ASSERT_EQ(read(&got), "");
  EXPECT_EQ(got, (std::vector<std::string>{"one", "two", "three"}));
}

TEST_F(LogDir, AFailedWriteLeavesNoRecordAndTheLogWorksAgainOnceWritesDo) {
  // A file size limit makes writes past it fail part-way (EFBIG), as a full disk does (ENOSPC). In a child
  // process, so that the limit stays there.
  std::vector<std::string> records;
  for (int i = 0; i < 40; ++i) records.push_back(std::string(100, static_cast<char>('a' + i % 26)));  // one size: once one fails, all do
  const pid_t child = fork();
  if (child == 0) {
    signal(SIGXFSZ, SIG_IGN);
    int acknowledged = 0;
    {
      LogWriter writer(dir_, kShape, 1, SyncPolicy::kEveryBatch);
      rlimit limit{static_cast<rlim_t>(kSegmentHeaderBytes + 2000), RLIM_INFINITY};
      setrlimit(RLIMIT_FSIZE, &limit);
      int failures = 0;
      for (const std::string& p : records) {
        if (writer.append(p).empty()) {
          if (failures > 0) _exit(100);  // nothing fits past the limit
          ++acknowledged;
        } else {
          ++failures;
        }
      }
      if (failures == 0 || acknowledged == 0) _exit(101);
      limit.rlim_cur = RLIM_INFINITY;
      setrlimit(RLIMIT_FSIZE, &limit);
      if (!writer.append("after").empty()) _exit(102);  // space is back: the log takes appends again
    }
    _exit(acknowledged);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  const int acknowledged = WEXITSTATUS(status);
  // 2000 bytes past the header hold 15 records of 24 + 100 + 8 bytes; exit codes of 100 and up are failures.
  ASSERT_EQ(acknowledged, 2000 / static_cast<int>(encode_record(1, records[0]).size())) << "exit code " << acknowledged;
  std::vector<std::string> got;
  LogReplay replay;
  ASSERT_EQ(read(&got, &replay), "");
  std::vector<std::string> want(records.begin(), records.begin() + acknowledged);
  want.push_back("after");
  EXPECT_EQ(got, want) << "every acknowledged record, then the one after, and nothing of the failed ones";
  EXPECT_TRUE(replay.torn.empty()) << replay.torn;
}

// Start-up's replay: records written by batches of one size restore the same table when replayed in batches of
// another (records coalesced into one table batch, or split across several), with overwrites and deletes of
// one key across records and within one taking effect in log order.
TEST_F(LogDir, ReplayRestoresTheTableWhateverTheBatchSize) {
  constexpr std::uint32_t kKeyWidth = 16, kValueWidth = 32;
  std::map<std::string, std::string> model;
  std::mt19937 rng(12);
  {
    LogWriter writer(dir_, LogShape{kKeyWidth, kValueWidth}, 1, SyncPolicy::kEveryBatch);
    for (int record = 0; record < 30; ++record) {
      const std::size_t n = 1 + rng() % 200;
      std::vector<std::uint8_t> ops(n), key_lens(n), keys(n * kKeyWidth), values(n * kValueWidth), status(n, 0);
      std::vector<std::uint32_t> value_lens(n, 0);
      for (std::size_t i = 0; i < n; ++i) {
        const std::string key = "key" + std::to_string(rng() % 300);  // repeats, within and across records
        ops[i] = rng() % 4 == 0 ? static_cast<std::uint8_t>(OpKind::kDelete) : static_cast<std::uint8_t>(OpKind::kPut);
        key_lens[i] = static_cast<std::uint8_t>(key.size());
        std::memcpy(&keys[i * kKeyWidth], key.data(), key.size());
        if (ops[i] == static_cast<std::uint8_t>(OpKind::kPut)) {
          const std::string value = "r" + std::to_string(record) + "i" + std::to_string(i);
          value_lens[i] = static_cast<std::uint32_t>(value.size());
          std::memcpy(&values[i * kValueWidth], value.data(), value.size());
          model[key] = value;
        } else {
          status[i] = model.erase(key) != 0 ? 0 : 1;  // a delete of an absent key changed nothing
        }
      }
      std::string payload;
      encode_writes(BatchIn{n, ops.data(), keys.data(), key_lens.data(), values.data(), value_lens.data()}, status.data(), kKeyWidth,
                    kValueWidth, payload);
      ASSERT_EQ(writer.append(payload), "");
    }
  }
  for (const std::size_t max_batch : {7u, 64u, 100000u}) {
    TableConfig config;
    config.backend = BackendKind::kCpu;
    config.capacity = 4096;
    config.key_width = kKeyWidth;
    config.value_width = kValueWidth;
    config.max_batch = max_batch;
    Table table(config);
    {
      Durability durability(DurabilityOptions{dir_, WalMode::kOff, false}, table, {});
      EXPECT_EQ(durability.recovery().log.records, 30u);
    }
    EXPECT_EQ(table.stats().device.items, model.size()) << "max_batch " << max_batch;
    for (int k = 0; k < 300; ++k) {
      const std::string key = "key" + std::to_string(k);
      std::vector<std::uint8_t> keys(kKeyWidth, 0), values(table.value_stride(), 0), status(1);
      std::memcpy(keys.data(), key.data(), key.size());
      const std::uint8_t op = static_cast<std::uint8_t>(OpKind::kGet), len = static_cast<std::uint8_t>(key.size());
      std::uint32_t value_len = 0;
      table.execute(BatchIn{1, &op, keys.data(), &len, nullptr, nullptr}, BatchOut{status.data(), values.data(), &value_len});
      const auto it = model.find(key);
      if (it == model.end()) {
        EXPECT_EQ(status[0], static_cast<std::uint8_t>(OpStatus::kNotFound)) << key;
      } else {
        ASSERT_EQ(status[0], static_cast<std::uint8_t>(OpStatus::kOk)) << key;
        EXPECT_EQ(std::string(reinterpret_cast<const char*>(values.data()), value_len), it->second) << key << ", max_batch " << max_batch;
      }
    }
  }
}

}  // namespace
}  // namespace gpukv::server::persistence
