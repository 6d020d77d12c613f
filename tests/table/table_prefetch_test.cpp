// Batches in the table's host memory (Table::allocate_host: pinned on the GPU backend) run through
// Table::prefetch the way the server's batcher runs them: the next batch is staged and prefetched while the
// current one executes. Every result is checked against the model, including batches whose columns were
// refilled and prefetched again, prefetches that were never executed, and more prefetches than the backend
// has upload slots. On the CPU backend prefetch() does nothing and the same sequences must pass.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "model.hpp"

namespace gpukv::test {
namespace {

// One batch's columns (a gpukv::Batch, in the table's host memory), refilled in place as the batcher reuses
// its staging batches, so that the backend sees the same pointers again.
class HostBatch {
 public:
  HostBatch(Table& table, std::size_t capacity) : batch_(table, capacity) {}

  // Copies a batch's ops into the columns (every byte of its rows written, as Columns writes them).
  void fill(Table& table, const std::vector<Op>& ops) {
    ASSERT_LE(ops.size(), batch_.capacity());
    const Columns cols(table, ops);
    const BatchIn src = cols.in();
    size_ = ops.size();
    std::memcpy(batch_.ops(), src.ops, size_);
    std::memcpy(batch_.key_lens(), src.key_lens, size_);
    std::memcpy(batch_.keys(), src.keys, size_ * batch_.key_width());
    std::memcpy(batch_.values(), src.values, size_ * batch_.value_stride());
    std::memcpy(batch_.value_lens(), src.value_lens, size_ * sizeof(std::uint32_t));
    std::memset(batch_.statuses(), 0xEE, size_);  // poison: every status must be written
  }

  BatchIn in() const { return batch_.in(0, size_); }
  BatchOut out() const { return batch_.out(0, size_); }

  // The results, into a Columns of the same ops, for Model::check.
  void results_to(Columns& cols) const {
    const BatchOut dst = cols.out();
    std::memcpy(dst.status, batch_.statuses(), size_);
    std::memcpy(dst.values, batch_.out_values(), size_ * batch_.value_stride());
    std::memcpy(dst.value_lens, batch_.out_value_lens(), size_ * sizeof(std::uint32_t));
  }

 private:
  Batch batch_;
  std::size_t size_ = 0;
};

class TablePrefetchTest : public testing::TestWithParam<BackendKind> {
 protected:
  void SetUp() override {
    if (GetParam() == BackendKind::kGpu && !Table::gpu_available()) {
      GTEST_SKIP() << "SKIPPED: no CUDA device on this machine; GPU prefetch tests did not run";
    }
  }
  TableConfig config() const {
    TableConfig c;
    c.backend = GetParam();
    c.key_width = 16;
    c.value_width = 24;
    c.capacity = 4096;
    c.max_batch = 512;
    return c;
  }

  // Executes `batch` (holding `ops`) and checks its results against the model.
  static void execute_and_check(Table& table, Model& model, const HostBatch& batch, const std::vector<Op>& ops) {
    table.execute(batch.in(), batch.out());
    Columns cols(table, ops);
    batch.results_to(cols);
    model.check(cols, ops);
  }
};

std::vector<Op> random_ops(Generator& gen, const std::vector<std::string>& keys, std::size_t n) {
  std::vector<Op> ops;
  for (std::size_t i = 0; i < n; ++i) {
    const std::string& k = keys[gen.next(static_cast<std::uint32_t>(keys.size()))];
    const std::uint32_t r = gen.next(100);
    const OpKind kind = r < 40 ? OpKind::kGet : r < 80 ? OpKind::kPut : r < 90 ? OpKind::kPutIfAbsent : OpKind::kDelete;
    ops.push_back(Op{kind, k, kind == OpKind::kPut || kind == OpKind::kPutIfAbsent ? gen.value() : std::string()});
  }
  return ops;
}

// The batcher's pipeline: batch i+1 is filled and prefetched before batch i executes, in two buffers used in
// turn. Now and then a third buffer is prefetched too and never executed: more prefetches than the GPU
// backend's two upload slots, and slots held by prefetches that never run.
TEST_P(TablePrefetchTest, PipelinedBatchesMatchTheModel) {
  Table table(config());
  Model model(table.stats().device.max_items);
  Generator gen(7, 16, 24);
  const std::vector<std::string> keys = gen.unique_keys(1500);
  HostBatch a(table, 512), b(table, 512), extra(table, 512);
  HostBatch* current = &a;
  HostBatch* next = &b;
  std::vector<Op> current_ops = random_ops(gen, keys, 1 + gen.next(512));
  current->fill(table, current_ops);
  table.prefetch(current->in());
  for (int step = 0; step < 60; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    std::vector<Op> next_ops = random_ops(gen, keys, 1 + gen.next(512));
    next->fill(table, next_ops);
    table.prefetch(next->in());
    if (step % 3 == 0) {  // staged, never executed: must change nothing
      extra.fill(table, random_ops(gen, keys, 512));
      table.prefetch(extra.in());
    }
    execute_and_check(table, model, *current, current_ops);
    if (HasFatalFailure()) return;
    if (step % 5 == 0) {  // prefetched after a batch ran, never executed: its slot must not stay taken
      extra.fill(table, random_ops(gen, keys, 100));
      table.prefetch(extra.in());
    }
    std::swap(current, next);
    current_ops = std::move(next_ops);
  }
  execute_and_check(table, model, *current, current_ops);
  model.check_contents(table);
}

// A buffer refilled and prefetched again before it ran: execute() must run the new columns, not the first copy.
TEST_P(TablePrefetchTest, RefilledAndPrefetchedAgainRunsTheNewColumns) {
  Table table(config());
  Model model(table.stats().device.max_items);
  HostBatch batch(table, 512);
  batch.fill(table, {Op{OpKind::kPut, "key", "first"}});
  table.prefetch(batch.in());
  const std::vector<Op> second = {Op{OpKind::kPut, "key", "second"}, Op{OpKind::kGet, "key", {}}};
  batch.fill(table, second);
  table.prefetch(batch.in());
  execute_and_check(table, model, batch, second);
  model.check_contents(table);
}

// A prefetched batch that runs after other batches (executed without a prefetch) still runs its own columns,
// and a batch larger than one pass is not prefetched but runs as usual.
TEST_P(TablePrefetchTest, PrefetchedBatchRunsAfterOthers) {
  Table table(config());
  Model model(table.stats().device.max_items);
  Generator gen(11, 16, 24);
  const std::vector<std::string> keys = gen.unique_keys(800);
  HostBatch early(table, 512), other(table, 512), large(table, 2000);
  const std::vector<Op> early_ops = random_ops(gen, keys, 512);
  early.fill(table, early_ops);
  table.prefetch(early.in());
  for (int i = 0; i < 3; ++i) {
    const std::vector<Op> ops = random_ops(gen, keys, 300);
    other.fill(table, ops);
    execute_and_check(table, model, other, ops);
  }
  const std::vector<Op> large_ops = random_ops(gen, keys, 2000);
  large.fill(table, large_ops);
  table.prefetch(large.in());  // 2000 > max_batch: ignored
  execute_and_check(table, model, large, large_ops);
  execute_and_check(table, model, early, early_ops);
  model.check_contents(table);
}

INSTANTIATE_TEST_SUITE_P(Backends, TablePrefetchTest, testing::Values(BackendKind::kCpu, BackendKind::kGpu),
                         [](const testing::TestParamInfo<BackendKind>& info) { return std::string(to_string(info.param)); });

}  // namespace
}  // namespace gpukv::test
