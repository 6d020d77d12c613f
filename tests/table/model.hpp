// Test harness: batches built from readable ops, and a reference model (std::unordered_map) that replays a
// batch sequentially and checks every per-op result of the table against it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <ostream>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "gpukv/batch.hpp"
#include "gpukv/table.hpp"

namespace gpukv {
// How gtest prints a backend parameter (found by argument-dependent lookup, so in the enum's namespace).
inline void PrintTo(BackendKind kind, std::ostream* os) { *os << to_string(kind); }
}  // namespace gpukv

namespace gpukv::test {

struct Op {
  OpKind kind;
  std::string key;
  std::string value;       // PUT / PUT_IF_ABSENT
  std::uint64_t word = 0;  // PUT / PUT_IF_ABSENT on a table with slot words (TableConfig::slot_word)
};

// A batch of test ops in a gpukv::Batch, filled through its raw columns: with garbage past every key and value
// (the table must ignore it), keys longer than the width cut (their lengths kept, so the table refuses them),
// and every result poisoned (each must be written).
class Columns {
 public:
  Columns(Table& table, const std::vector<Op>& ops) : n_(ops.size()), batch_(table, ops.size()) {
    const std::uint32_t key_width = batch_.key_width(), stride = batch_.value_stride();
    for (std::size_t i = 0; i < std::max<std::size_t>(n_, 1); ++i) {
      batch_.statuses()[i] = 0xEE;
      batch_.out_value_lens()[i] = 0xDEADBEEF;
      if (batch_.out_slot_words() != nullptr) batch_.out_slot_words()[i] = 0xBAD0BAD0BAD0BAD0;
    }
    for (std::size_t i = 0; i < n_; ++i) {
      const Op& op = ops[i];
      batch_.ops()[i] = static_cast<std::uint8_t>(op.kind);
      batch_.key_lens()[i] = static_cast<std::uint8_t>(op.key.size());
      std::uint8_t* key = batch_.keys() + i * key_width;
      std::memset(key, 0xA5, key_width);
      std::memcpy(key, op.key.data(), std::min<std::size_t>(op.key.size(), key_width));
      batch_.value_lens()[i] = static_cast<std::uint32_t>(op.value.size());
      std::uint8_t* value = batch_.values() + i * stride;
      std::memset(value, 0x5A, stride);
      std::memcpy(value, op.value.data(), std::min<std::size_t>(op.value.size(), stride));
      if (batch_.slot_words() != nullptr) batch_.slot_words()[i] = op.word;
    }
  }

  BatchIn in() const { return batch_.in(0, n_); }
  BatchOut out() { return batch_.out(0, n_); }
  std::uint8_t* raw_ops() { return batch_.ops(); }
  std::uint8_t* raw_key_lens() { return batch_.key_lens(); }
  std::uint32_t* raw_value_lens() { return batch_.value_lens(); }

  OpStatus status(std::size_t i) const { return batch_.status(i); }
  std::string value(std::size_t i) const { return std::string(batch_.value(i)); }
  bool has_slot_words() const { return batch_.out_slot_words() != nullptr; }
  std::uint64_t slot_word(std::size_t i) const { return batch_.out_slot_words()[i]; }
  std::uint8_t raw_status(std::size_t i) const { return batch_.statuses()[i]; }

 private:
  std::size_t n_;
  Batch batch_;
};

// Every live item of the table, read out with export_items in ranges of `range` slots; a key met twice fails.
// `words`, for a table with slot words: each key's word.
inline std::unordered_map<std::string, std::string> exported(Table& table, std::uint64_t range,
                                                             std::unordered_map<std::string, std::uint64_t>* words = nullptr) {
  const TableConfig& c = table.config();
  const std::uint32_t stride = value_stride(c.value_width);
  HostMemory keys = table.allocate_host(range * c.key_width), key_lens = table.allocate_host(range);
  HostMemory values = table.allocate_host(range * stride), value_lens = table.allocate_host(range * 4);
  HostMemory slot_words = table.allocate_host(words != nullptr ? range * 8 : 0);
  const ItemColumns out{keys.data(), key_lens.data(), values.data(), reinterpret_cast<std::uint32_t*>(value_lens.data()),
                        words != nullptr ? reinterpret_cast<std::uint64_t*>(slot_words.data()) : nullptr};
  std::unordered_map<std::string, std::string> items;
  const std::uint64_t slots = table.slot_count();
  for (std::uint64_t from = 0; from < slots; from += range) {
    const std::size_t n = table.export_items(from, range, out);
    EXPECT_LE(n, range);
    for (std::size_t i = 0; i < n; ++i) {
      std::string key(reinterpret_cast<const char*>(out.keys) + i * c.key_width, out.key_lens[i]);
      std::string value(reinterpret_cast<const char*>(out.values) + i * stride, out.value_lens[i]);
      // Zeros past the value to its 8-byte boundary, as a GET's: values come out clean.
      for (std::uint32_t b = out.value_lens[i]; b % 8 != 0; ++b) EXPECT_EQ(out.values[i * stride + b], 0) << "value padding";
      if (words != nullptr) (*words)[key] = out.slot_words[i];
      EXPECT_TRUE(items.emplace(std::move(key), std::move(value)).second) << "a key exported twice";
    }
  }
  return items;
}

// The reference: a hash map, applied one op at a time in batch order.
// Live keys and the most keys the table takes, over both tiers.
inline std::uint64_t total_items(const TableStats& s) { return s.device.items + s.host.items; }
inline std::uint64_t total_max_items(const TableStats& s) { return s.device.max_items + s.host.max_items; }

class Model {
 public:
  explicit Model(std::uint64_t max_items) : max_items_(max_items) {}

  // Runs ops on the table, replays them on the model and checks every result. A kFull answer is accepted
  // only for a write of a new key in a batch whose new keys could have filled the table (which of them get
  // room is a race between concurrent ops); the op must then have changed nothing, as the model does.
  // `malformed(i)`, where given, picks ops that carry a value and are made malformed first (a value length
  // past the value width): each must be answered kInvalid and change nothing.
  void run(Table& table, const std::vector<Op>& ops, const std::function<bool(std::size_t)>& malformed = {}) {
    Columns cols(table, ops);
    for (std::size_t i = 0; malformed && i < ops.size(); ++i) {
      if (malformed(i)) cols.raw_value_lens()[i] = table.config().value_width + 1;
    }
    table.execute(cols.in(), cols.out());
    check(cols, ops, malformed);
    if (testing::Test::HasFatalFailure()) return;
    const TableStats stats = table.stats();
    ASSERT_EQ(total_items(stats), map_.size()) << "the table's live-key count drifted from the model";
    ASSERT_LE(stats.device.items, stats.device.max_items) << "the device tier went past its maximum load";
    ASSERT_LE(stats.host.items, stats.host.max_items) << "the host tier went past its maximum load";
  }

  // `malformed(i)`, where given: the caller made op i malformed in `cols`, so it must be answered kInvalid and
  // change nothing.
  void check(const Columns& cols, const std::vector<Op>& ops, const std::function<bool(std::size_t)>& malformed = {}) {
    std::uint64_t new_key_writes = 0;
    for (const Op& op : ops) {
      if ((op.kind == OpKind::kPut || op.kind == OpKind::kPutIfAbsent) && !map_.count(op.key)) ++new_key_writes;
    }
    const bool may_fill = map_.size() + new_key_writes > max_items_;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const Op& op = ops[i];
      const OpStatus got = cols.status(i);
      if (malformed && malformed(i)) {
        ASSERT_EQ(got, OpStatus::kInvalid) << "op " << i << " was made malformed";
        continue;
      }
      auto it = map_.find(op.key);
      const bool present = it != map_.end();
      SCOPED_TRACE("op " + std::to_string(i) + " " + to_string(op.kind) + " key len " + std::to_string(op.key.size()));
      switch (op.kind) {
        case OpKind::kGet:
          if (present) {
            ASSERT_EQ(got, OpStatus::kOk);
            ASSERT_EQ(cols.value(i), it->second);
            if (cols.has_slot_words()) ASSERT_EQ(cols.slot_word(i), words_.at(op.key)) << "slot word";
          } else {
            ASSERT_EQ(got, OpStatus::kNotFound);
          }
          break;
        case OpKind::kPutIfAbsent:
          if (present) {
            ASSERT_EQ(got, OpStatus::kExists);
            break;
          }
          [[fallthrough]];
        case OpKind::kPut:
          if (!present && got == OpStatus::kFull) {
            ASSERT_TRUE(may_fill) << "kFull with room left: " << map_.size() << " of " << max_items_;
            ++fulls_;
            break;
          }
          ASSERT_EQ(got, OpStatus::kOk);
          map_[op.key] = op.value;
          words_[op.key] = op.word;
          break;
        case OpKind::kDelete:
          ASSERT_EQ(got, present ? OpStatus::kOk : OpStatus::kNotFound);
          if (present) map_.erase(it);
          words_.erase(op.key);
          break;
      }
    }
    // Only at the end of the batch: ops on different keys are concurrent, so a delete that comes later in
    // the batch may have made the room an earlier insert used.
    ASSERT_LE(map_.size(), max_items_);
  }

  // Replays writes the caller ran itself and saw answered kOk (a batch with malformed ops among them, whose
  // answers it checked op by op).
  void record(const std::vector<Op>& ops) {
    for (const Op& op : ops) {
      if (op.kind == OpKind::kPut || (op.kind == OpKind::kPutIfAbsent && !map_.count(op.key))) {
        map_[op.key] = op.value;
        words_[op.key] = op.word;
      }
      if (op.kind == OpKind::kDelete) {
        map_.erase(op.key);
        words_.erase(op.key);
      }
    }
  }

  // Reads every model key back from the table, and checks the table holds nothing else (by item count).
  void check_contents(Table& table) {
    std::vector<Op> gets;
    gets.reserve(map_.size());
    for (const auto& [k, v] : map_) gets.push_back(Op{OpKind::kGet, k, {}});
    Columns cols(table, gets);
    table.execute(cols.in(), cols.out());
    std::size_t i = 0;
    for (const auto& [k, v] : map_) {
      ASSERT_EQ(cols.status(i), OpStatus::kOk) << "key of length " << k.size() << " lost";
      ASSERT_EQ(cols.value(i), v);
      if (cols.has_slot_words()) ASSERT_EQ(cols.slot_word(i), words_.at(k)) << "slot word";
      ++i;
    }
    ASSERT_EQ(total_items(table.stats()), map_.size());
  }

  // Reads the whole table out with export_items, in ranges of `range` slots (a snapshot's scan), and checks
  // it holds exactly the model's items: each key once, with its value.
  void check_export(Table& table, std::uint64_t range) {
    std::unordered_map<std::string, std::uint64_t> words;
    const bool with_words = table.config().slot_word;
    ASSERT_EQ(exported(table, range, with_words ? &words : nullptr), map_)
        << "the table's items, read out in ranges of " << range << " slots";
    if (with_words) ASSERT_EQ(words, words_) << "the table's slot words, read out in ranges of " << range << " slots";
  }

  const std::unordered_map<std::string, std::string>& map() const { return map_; }
  std::uint64_t fulls() const { return fulls_; }

 private:
  std::unordered_map<std::string, std::string> map_;
  std::unordered_map<std::string, std::uint64_t> words_;  // each key's slot word (TableConfig::slot_word)
  std::uint64_t max_items_;
  std::uint64_t fulls_ = 0;
};

// Random keys and values with the shapes that break tables: every length from 0 to the width, zero bytes,
// and keys that differ only in trailing zeros.
class Generator {
 public:
  Generator(std::uint64_t seed, std::uint32_t key_width, std::uint32_t value_width)
      : rng_(seed), key_width_(key_width), value_width_(value_width) {}

  std::vector<std::string> unique_keys(std::size_t n) {
    std::unordered_map<std::string, bool> seen;
    std::vector<std::string> keys;
    keys.reserve(n);
    while (keys.size() < n) {
      std::string k = key();
      if (seen.emplace(k, true).second) keys.push_back(std::move(k));
    }
    return keys;
  }

  std::string key() {
    const std::uint32_t shape = next(16);
    std::uint32_t len = shape == 0 ? next(key_width_ + 1) : key_width_ - next(std::min(4u, key_width_));
    std::string k(len, '\0');
    for (auto& c : k) c = static_cast<char>(next(256));
    if (shape == 1 && len > 0) k.back() = '\0';  // a trailing zero: must differ from the shorter key
    if (shape == 2) k.assign(len, '\0');          // all zeros of some length
    return k;
  }

  std::string value() {
    const std::uint32_t shape = next(8);
    const std::uint32_t len = shape == 0 ? 0 : shape == 1 ? value_width_ : next(value_width_ + 1);
    std::string v(len, '\0');
    for (auto& c : v) c = static_cast<char>(next(256));
    return v;
  }

  // A slot word: zero, all ones, or any.
  std::uint64_t word() {
    const std::uint32_t shape = next(8);
    return shape == 0 ? 0 : shape == 1 ? ~std::uint64_t{0} : rng_();
  }

  std::uint32_t next(std::uint32_t bound) { return std::uniform_int_distribution<std::uint32_t>(0, bound - 1)(rng_); }
  double uniform() { return std::uniform_real_distribution<double>(0, 1)(rng_); }
  std::mt19937_64& rng() { return rng_; }

 private:
  std::mt19937_64 rng_;
  std::uint32_t key_width_;
  std::uint32_t value_width_;
};

}  // namespace gpukv::test
