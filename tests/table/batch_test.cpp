// gpukv::Batch, the owned batch columns: set() refuses what a row cannot hold and then changes nothing; in()
// and out() are views of a range of rows, so a batch run in slices gives what the whole batch gives; on the
// GPU backend the columns are pinned host memory and run the same way.
#include <gtest/gtest.h>

#include <string>

#include "gpukv/batch.hpp"
#include "gpukv/table.hpp"

namespace gpukv {
namespace {

TableConfig config(BackendKind backend) {
  TableConfig c;
  c.backend = backend;
  c.capacity = 4096;
  c.key_width = 16;
  c.value_width = 12;  // a stride of 16: values do not fill their stride
  return c;
}

class BatchTest : public testing::TestWithParam<BackendKind> {
 protected:
  void SetUp() override {
    if (GetParam() == BackendKind::kGpu && !Table::gpu_available()) {
      GTEST_SKIP() << "SKIPPED: no CUDA device on this machine; the GPU Batch tests did not run";
    }
  }
};

TEST_P(BatchTest, SetRefusesWhatARowCannotHoldAndChangesNothing) {
  Table table(config(GetParam()));
  Batch b(table, 4);
  b.set(0, OpKind::kPut, "key", "value");
  EXPECT_THROW(b.set(4, OpKind::kGet, "key"), Error) << "a row past the capacity";
  EXPECT_THROW(b.set(0, OpKind::kGet, ""), Error) << "an empty key";
  EXPECT_THROW(b.set(0, OpKind::kGet, std::string(17, 'k')), Error) << "a key past key_width";
  EXPECT_THROW(b.set(0, OpKind::kPut, "key", std::string(13, 'v')), Error) << "a value past value_width";
  EXPECT_THROW(b.in(2, 3), Error) << "a range past the capacity";
  EXPECT_THROW(b.out(5, 0), Error);
  // Row 0 is as the first set() left it.
  EXPECT_EQ(b.ops()[0], static_cast<std::uint8_t>(OpKind::kPut));
  EXPECT_EQ(b.key_lens()[0], 3);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(b.keys()), 3), "key");
  EXPECT_EQ(b.value_lens()[0], 5u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(b.values()), 5), "value");
  // A GET carries no value: its length is zero whatever is passed.
  b.set(1, OpKind::kGet, "key", "ignored");
  EXPECT_EQ(b.value_lens()[1], 0u);
}

TEST_P(BatchTest, SlicesRunAsTheWholeBatchDoes) {
  Table table(config(GetParam()));
  const std::size_t n = 300;
  Batch puts(table, n);
  for (std::size_t i = 0; i < n; ++i) puts.set(i, OpKind::kPut, "k" + std::to_string(i), "v" + std::to_string(i));
  // Three slices of uneven sizes, in order.
  for (const auto [first, count] : {std::pair<std::size_t, std::size_t>{0, 7}, {7, 200}, {207, 93}}) {
    table.execute(puts.in(first, count), puts.out(first, count));
  }
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(puts.status(i), OpStatus::kOk) << i;

  Batch gets(table, n + 1);
  for (std::size_t i = 0; i < n; ++i) gets.set(i, OpKind::kGet, "k" + std::to_string(i));
  gets.set(n, OpKind::kGet, "absent");
  table.execute(gets.in(0, n + 1), gets.out(0, n + 1));
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(gets.status(i), OpStatus::kOk) << i;
    ASSERT_EQ(gets.value(i), "v" + std::to_string(i)) << i;
  }
  EXPECT_EQ(gets.status(n), OpStatus::kNotFound);
  // An empty slice and an empty batch run and change nothing.
  Batch none(table, 0);
  table.execute(none.in(0, 0), none.out(0, 0));
  table.execute(gets.in(n + 1, 0), gets.out(n + 1, 0));
  EXPECT_EQ(table.stats().device.items, n);
}

INSTANTIATE_TEST_SUITE_P(Backends, BatchTest, testing::Values(BackendKind::kCpu, BackendKind::kGpu),
                         [](const auto& info) { return info.param == BackendKind::kCpu ? "cpu" : "gpu"; });

}  // namespace
}  // namespace gpukv
