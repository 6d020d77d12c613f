// Slot words (TableConfig::slot_word), on every backend present: what a user of the word is promised. A write
// stores its op's word with its value and a hit returns the word of the key's latest write, in batch order
// inside a pass; the word follows its key through clean-up and into export_items; a table without words
// refuses word columns, changing nothing; and words cost a table without them no memory: the board keeps
// them in its slots' sector padding where there is room, the line gives them room it would otherwise give
// to slots. The model tests (table_model_test.cpp) run words through long random sequences.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model.hpp"

namespace gpukv::test {
namespace {

class SlotWordTest : public testing::TestWithParam<BackendKind> {
 protected:
  void SetUp() override {
    if (GetParam() == BackendKind::kGpu && !Table::gpu_available()) {
      GTEST_SKIP() << "SKIPPED: no CUDA device on this machine; GPU slot word tests did not run";
    }
  }
  TableConfig config(bool slot_word, SlotLayout layout = SlotLayout::kAuto, std::uint32_t key_width = 8,
                     std::uint32_t value_width = 8) const {
    TableConfig c;
    c.backend = GetParam();
    c.key_width = key_width;
    c.value_width = value_width;
    c.capacity = 4096;
    c.slot_layout = layout;
    c.slot_word = slot_word;
    return c;
  }
};

Op put(std::string k, std::string v, std::uint64_t word) { return Op{OpKind::kPut, std::move(k), std::move(v), word}; }
Op get(std::string k) { return Op{OpKind::kGet, std::move(k), {}}; }
Op del(std::string k) { return Op{OpKind::kDelete, std::move(k), {}}; }

// Runs `ops` and returns the batch's answers.
Columns run(Table& table, const std::vector<Op>& ops) {
  Columns cols(table, ops);
  table.execute(cols.in(), cols.out());
  return cols;
}

TEST_P(SlotWordTest, HitsReturnTheWordOfTheKeysLatestWriteInBatchOrder) {
  for (const SlotLayout layout : {SlotLayout::kBoard, SlotLayout::kLine}) {
    SCOPED_TRACE(to_string(layout));
    Table table(config(true, layout));
    // Within one pass: each GET sees the word of the PUT before it; a PUT_IF_ABSENT of a present key keeps
    // the word; a key deleted and written again takes the new write's word.
    Columns a = run(table, {put("k", "v1", 11), get("k"), put("k", "v2", 22), get("k"),
                            Op{OpKind::kPutIfAbsent, "k", "v3", 33}, get("k"), del("k"), put("k", "v4", 44), get("k"),
                            put("other", "o", ~std::uint64_t{0}), get("other")});
    EXPECT_EQ(a.slot_word(1), 11u);
    EXPECT_EQ(a.slot_word(3), 22u);
    EXPECT_EQ(a.status(4), OpStatus::kExists);
    EXPECT_EQ(a.slot_word(5), 22u);
    EXPECT_EQ(a.slot_word(8), 44u);
    EXPECT_EQ(a.slot_word(10), ~std::uint64_t{0});
    // In later passes, from the slot; an overwrite replaces the word with its value.
    Columns b = run(table, {get("k"), get("other")});
    EXPECT_EQ(b.value(0), "v4");
    EXPECT_EQ(b.slot_word(0), 44u);
    EXPECT_EQ(b.slot_word(1), ~std::uint64_t{0});
    run(table, {put("k", "v5", 55)});
    EXPECT_EQ(run(table, {get("k")}).slot_word(0), 55u);
    // A write without a word column stores 0.
    Batch no_words(table, 2);
    no_words.set(0, OpKind::kPut, "k", "v6");
    no_words.set(1, OpKind::kGet, "k");
    BatchIn in = no_words.in(0, 2);
    in.slot_words = nullptr;
    table.execute(in, no_words.out(0, 2));
    EXPECT_EQ(no_words.out_slot_words()[1], 0u);
    EXPECT_EQ(run(table, {get("k")}).slot_word(0), 0u);
  }
}

// Values of every length up to the width, next to their words: the value's zero padding never reaches the
// word, and a word never reaches the next slot (in a line, slots are packed).
TEST_P(SlotWordTest, WordsAndValuesOfEveryLengthKeepApart) {
  for (const SlotLayout layout : {SlotLayout::kBoard, SlotLayout::kLine}) {
    for (const std::uint32_t value_width : {8u, 13u, 16u}) {
      SCOPED_TRACE(testing::Message() << to_string(layout) << " value_width " << value_width);
      Table table(config(true, layout, 8, value_width));
      Model model(table.stats().device.max_items);
      std::vector<Op> ops;
      for (std::uint32_t i = 0; i < 600; ++i) {
        ops.push_back(put("key" + std::to_string(i), std::string(i % (value_width + 1), static_cast<char>('a' + i % 26)),
                          0x0101010101010101ull * (i % 255 + 1)));
      }
      model.run(table, ops);
      // Overwritten with other lengths and words.
      for (std::uint32_t i = 0; i < 600; i += 3) {
        ops[i].value = std::string((i + 5) % (value_width + 1), 'z');
        ops[i].word = ~std::uint64_t{i};
      }
      model.run(table, ops);
      model.check_contents(table);
      model.check_export(table, table.slot_count());
    }
  }
}

// Passes of GETs alone, one after another. On the GPU the first runs in a probing kernel, which leaves each
// hit's value and word to CopyValues; the later ones run in the lookup kernel, which in a table of values of 16
// bytes or fewer answers both itself: with the first line fetched where the pass before mostly hit, without
// where it mostly missed. Wider values go to CopyValues from every kernel. Every answer is the model's,
// whichever kernel gave it.
TEST_P(SlotWordTest, PassesOfGetsAloneAnswerTheirWords) {
  for (const SlotLayout layout : {SlotLayout::kBoard, SlotLayout::kLine}) {
    for (const std::uint32_t value_width : {8u, 16u, 128u}) {
      if (layout == SlotLayout::kLine && value_width > 16) continue;  // a line of fewer than 3 slots is refused
      SCOPED_TRACE(testing::Message() << to_string(layout) << " value_width " << value_width);
      Table table(config(true, layout, 8, value_width));
      Model model(table.stats().device.max_items);
      std::vector<Op> fill, hits, misses;
      for (std::uint32_t i = 0; i < 1500; ++i) {
        const std::string key = "k" + std::to_string(i), absent = "a" + std::to_string(i);  // 8 bytes at most
        fill.push_back(put(key, std::string(i % (value_width + 1), static_cast<char>('a' + i % 26)), 0x9E3779B97F4A7C15ull * i));
        hits.push_back(get(i % 10 == 9 ? absent : key));
        misses.push_back(get(i % 10 == 9 ? key : absent));
      }
      model.run(table, fill);
      for (int round = 0; round < 3; ++round) {
        model.run(table, hits);
        model.run(table, misses);
        model.run(table, hits);
      }
    }
  }
}

// Clean-up moves keys between slots: each takes its word along.
TEST_P(SlotWordTest, WordsFollowTheirKeysThroughCleanUp) {
  for (const SlotLayout layout : {SlotLayout::kBoard, SlotLayout::kLine}) {
    SCOPED_TRACE(to_string(layout));
    Table table(config(true, layout));
    Model model(table.stats().device.max_items);
    std::vector<Op> fill, drop;
    for (std::uint32_t i = 0; i < 3000; ++i) fill.push_back(put("key" + std::to_string(i), "v" + std::to_string(i), i * 7919ull));
    for (std::uint32_t i = 0; i < 3000; i += 2) drop.push_back(del("key" + std::to_string(i)));
    model.run(table, fill);
    model.run(table, drop);
    const std::uint64_t before = table.stats().cleanups;
    ASSERT_TRUE(table.cleanup());
    EXPECT_EQ(table.stats().cleanups, before + 1);
    EXPECT_EQ(table.stats().device.tombstones, 0u);
    model.check_contents(table);
    model.check_export(table, 1000);
  }
}

// Batches staged the way the server's batcher stages them: in the table's host memory, prefetched before they
// run (on the GPU the word columns travel with the others; the CPU backend ignores prefetch).
TEST_P(SlotWordTest, PrefetchedBatchesCarryTheirWords) {
  Table table(config(true));
  constexpr std::size_t kRows = 3000;
  Batch puts(table, kRows), gets(table, kRows);
  for (std::size_t i = 0; i < kRows; ++i) {
    puts.set(i, OpKind::kPut, "key" + std::to_string(i), "v" + std::to_string(i));
    puts.slot_words()[i] = 0x9E3779B97F4A7C15ull * (i + 1);
    gets.set(i, OpKind::kGet, "key" + std::to_string(i));
  }
  table.prefetch(puts.in(0, kRows));
  table.prefetch(gets.in(0, kRows));
  table.execute(puts.in(0, kRows), puts.out(0, kRows));
  table.execute(gets.in(0, kRows), gets.out(0, kRows));
  for (std::size_t i = 0; i < kRows; ++i) {
    ASSERT_EQ(puts.status(i), OpStatus::kOk) << i;
    ASSERT_EQ(gets.status(i), OpStatus::kOk) << i;
    ASSERT_EQ(gets.value(i), "v" + std::to_string(i)) << i;
    ASSERT_EQ(gets.out_slot_words()[i], 0x9E3779B97F4A7C15ull * (i + 1)) << i;
  }
}

// A table without words refuses their columns with a clear error and changes nothing.
TEST_P(SlotWordTest, ATableWithoutWordsRefusesWordColumns) {
  Table table(config(false));
  Columns cols(table, {put("k", "v", 1)});
  std::uint64_t words[1] = {7};
  BatchIn in = cols.in();
  in.slot_words = words;
  try {
    table.execute(in, cols.out());
    FAIL() << "a word column was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Error::Code::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("slot_word"), std::string::npos) << e.what();
  }
  BatchOut out = cols.out();
  out.slot_words = words;
  EXPECT_THROW(table.execute(cols.in(), out), Error);
  EXPECT_EQ(table.stats().device.items, 0u);
  EXPECT_EQ(run(table, {get("k")}).status(0), OpStatus::kNotFound);
  HostMemory keys = table.allocate_host(8), key_lens = table.allocate_host(8), values = table.allocate_host(8),
             value_lens = table.allocate_host(8);
  const ItemColumns items{keys.data(), key_lens.data(), values.data(), reinterpret_cast<std::uint32_t*>(value_lens.data()),
                          words};
  EXPECT_THROW(table.export_items(0, 1, items), Error);
}

// What words cost in memory. A board slot of 8-byte keys and values is one 32-byte sector either way (24
// bytes of data, the word in the padding); a line of them holds 4 slots of 24 bytes instead of 7 of 16, so
// the default layout is then the board; and a line that would hold fewer than kMinLineSlots is refused,
// naming the word.
TEST_P(SlotWordTest, WordsTakeTheBoardsPaddingAndALinesRoom) {
  const TableStats board_without = Table(config(false, SlotLayout::kBoard)).stats();
  const TableStats board_with = Table(config(true, SlotLayout::kBoard)).stats();
  EXPECT_EQ(board_with.device.slot_bytes, board_without.device.slot_bytes);
  EXPECT_EQ(board_with.device.board_bytes, board_without.device.board_bytes);
  EXPECT_EQ(board_with.device.capacity, board_without.device.capacity);

  for (const auto& [slot_word, per_line] : {std::pair{false, 7u}, std::pair{true, 4u}}) {
    const TableStats line = Table(config(slot_word, SlotLayout::kLine)).stats();
    ASSERT_EQ(line.device.capacity % per_line, 0u) << slot_word;
    EXPECT_EQ(line.device.slot_bytes, line.device.capacity / per_line * kLineBytes) << slot_word;
  }
  Table auto_with(config(true));
  EXPECT_EQ(auto_with.config().slot_layout, SlotLayout::kBoard);

  try {
    Table refused(config(true, SlotLayout::kLine, 16, 16));  // 40-byte slots: 2 a line
    FAIL() << "a line of 2 slots was built";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Error::Code::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("slot word"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(Table(config(false, SlotLayout::kLine, 16, 16)));  // 32-byte slots: 3 a line
}

INSTANTIATE_TEST_SUITE_P(Backends, SlotWordTest, testing::Values(BackendKind::kCpu, BackendKind::kGpu),
                         [](const testing::TestParamInfo<BackendKind>& i) { return std::string(to_string(i.param)); });

}  // namespace
}  // namespace gpukv::test
