// The table against std::unordered_map over long random mixed sequences: inserts, overwrites,
// PUT_IF_ABSENT, deletes and re-inserts, batches without PUTs, hot keys repeated inside one batch, fills up
// to the maximum load factor and past it (kFull), across key widths, value widths, ticket sizes, probing
// schemes, slot layouts and backends, with one tier and with a host tier that the device tier spills into.
// Now and then the table is read out whole (export_items, a snapshot's source) and compared with the model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "model.hpp"

namespace gpukv::test {
namespace {

struct ModelCase {
  BackendKind backend;
  std::uint32_t key_width;
  std::uint32_t value_width;
  std::uint32_t ticket_bits;
  Probing probing;
  std::uint64_t capacity;
  std::uint64_t ops;
  std::uint32_t max_batch = 1 << 20;
  unsigned cpu_threads = 0;
  double max_load = 0.95;
  LaneMode lanes = LaneMode::kAuto;
  std::uint64_t host_capacity = 0;  // host-tier slots (0: none)
  bool order_host = true;           // the host phase sorted by host address (else in batch order)
  std::uint32_t host_phase_threads = 0;
  SlotLayout layout = SlotLayout::kBoard;  // the device tier's
  // Runs of three batches that only write, mostly new keys: on the GPU, a line's pass of writes that follows
  // one of inserts publishes new keys while it runs and compares keys from L2 (Engine::compares_in_l2),
  // where other passes leave them to FinishPass.
  bool write_batches = false;
  // Runs of three batches of PUTs alone, mostly of new keys, some of keys the table holds or the batch
  // repeats: on the GPU, passes that run optimistically (TableConfig::optimistic_inserts) and passes whose
  // optimistic run fails and is run again, grouped.
  bool put_batches = false;
  OptimisticInserts optimistic = OptimisticInserts::kAuto;
  bool slot_word = false;  // TableConfig::slot_word: every write carries a word, every hit returns it
};

std::string case_name(const ModelCase& c) {
  return std::string(to_string(c.backend)) + "_k" + std::to_string(c.key_width) + "_v" + std::to_string(c.value_width) +
         "_t" + std::to_string(c.ticket_bits) + "_" + to_string(c.probing) + "_cap" + std::to_string(c.capacity) +
         "_b" + std::to_string(c.max_batch) + "_lf" + std::to_string(static_cast<int>(c.max_load * 100)) + "_" +
         to_string(c.lanes) + (c.host_capacity != 0 ? "_host" + std::to_string(c.host_capacity) : "") +
         (c.order_host ? "" : "_unordered") +
         (c.host_phase_threads != 0 ? "_hostthreads" + std::to_string(c.host_phase_threads) : "") +
         (c.layout != SlotLayout::kBoard ? std::string("_") + to_string(c.layout) : "") +
         (c.write_batches ? "_writebatches" : "") + (c.put_batches ? "_putbatches" : "") +
         (c.optimistic != OptimisticInserts::kAuto ? std::string("_optimistic") + to_string(c.optimistic) : "") +
         (c.slot_word ? "_word" : "");
}
std::string param_name(const testing::TestParamInfo<ModelCase>& info) { return case_name(info.param); }
// How gtest prints a case (its default dumps the struct's bytes, padding included).
void PrintTo(const ModelCase& c, std::ostream* os) { *os << case_name(c); }

// Scales the op counts: GPUKV_TEST_SCALE=10 runs ten times longer sequences (the TSan build uses less).
double scale() {
  const char* s = std::getenv("GPUKV_TEST_SCALE");
  return s ? std::max(0.01, std::atof(s)) : 1.0;
}

// Drives the table through phases: fill to the limit (and past it), churn with deletes and re-inserts
// near the limit, drain, refill. Every batch is checked against the model; the contents are checked
// in full every few batches and at the end.
void run_model_sequence(const ModelCase& c, std::uint64_t seed) {
  TableConfig config;
  config.backend = c.backend;
  config.key_width = c.key_width;
  config.value_width = c.value_width;
  config.ticket_bits = c.ticket_bits;
  config.probing = c.probing;
  config.capacity = c.capacity;
  config.max_load_factor = c.max_load;
  config.max_batch = c.max_batch;
  config.cpu_threads = c.cpu_threads;
  config.lanes = c.lanes;
  config.host_capacity = c.host_capacity;
  config.order_host = c.order_host;
  config.host_phase_threads = c.host_phase_threads;
  config.slot_layout = c.layout;
  config.optimistic_inserts = c.optimistic;
  config.slot_word = c.slot_word;
  Table table(config);
  const std::uint64_t max_items = total_max_items(table.stats());
  Model model(max_items);
  Generator gen(seed, c.key_width, c.value_width);

  // More distinct keys than fit, so the fill phase runs into kFull.
  const std::vector<std::string> keys = gen.unique_keys(max_items + max_items / 4 + 16);
  std::vector<std::string> hot(8);
  for (auto& k : hot) k = keys[gen.next(static_cast<std::uint32_t>(keys.size()))];

  const std::uint64_t total = static_cast<std::uint64_t>(static_cast<double>(c.ops) * scale());
  std::uint64_t done = 0;
  int batch_no = 0;
  bool filling = true;
  std::uint64_t fulls_before = 0;  // kFull answers when the current fill phase began
  while (done < total) {
    const double load = static_cast<double>(model.map().size()) / static_cast<double>(max_items);
    if (filling && model.fulls() > fulls_before) filling = false;  // filled until writes were refused
    if (!filling && load < 0.3) {
      filling = true;
      fulls_before = model.fulls();
    }
    // Write-heavy while filling, delete-heavy while draining; some of everything, but for the batches of
    // writes alone that write_batches asks for, and every fourth batch while draining, which has no PUT of
    // either kind (on the GPU its deletes settle their slots in their pass: Engine::commit).
    const bool writes_only = c.write_batches && batch_no % 6 < 3;
    const bool puts_only = c.put_batches && batch_no % 6 < 3;
    const bool no_puts = !puts_only && !filling && batch_no % 4 == 3;
    const double put = puts_only ? 1.0 : no_puts ? 0.0 : writes_only ? 0.85 : filling ? 0.55 : 0.20,
                 pia = puts_only || no_puts ? 0.0 : 0.10, get = puts_only || writes_only ? 0.0 : filling ? 0.25 : 0.35;
    const std::uint32_t size_class = gen.next(10);
    const std::uint64_t n = size_class == 0 ? 1 : size_class < 4 ? 1 + gen.next(64) : 1 + gen.next(4096);
    std::vector<Op> ops;
    ops.reserve(n);
    for (std::uint64_t i = 0; i < n; ++i) {
      const double r = gen.uniform();
      const OpKind kind = r < put ? OpKind::kPut : r < put + pia ? OpKind::kPutIfAbsent
                        : r < put + pia + get ? OpKind::kGet : OpKind::kDelete;
      const std::string& key = gen.next(10) == 0 ? hot[gen.next(8)] : keys[gen.next(static_cast<std::uint32_t>(keys.size()))];
      const bool writes = kind == OpKind::kPut || kind == OpKind::kPutIfAbsent;
      ops.push_back(Op{kind, key, writes ? gen.value() : std::string(), writes && c.slot_word ? gen.word() : 0});
    }
    model.run(table, ops);
    if (testing::Test::HasFatalFailure()) return;
    done += n;
    if (++batch_no % 50 == 0) {
      model.check_contents(table);
      if (testing::Test::HasFatalFailure()) return;
    }
    if (batch_no % 200 == 0) {
      model.check_export(table, 1 + gen.next(static_cast<std::uint32_t>(table.slot_count())));
      if (testing::Test::HasFatalFailure()) return;
    }
  }
  model.check_contents(table);
  model.check_export(table, table.slot_count());
  const TableStats stats = table.stats();
  testing::Test::RecordProperty("fulls", std::to_string(model.fulls()));
  testing::Test::RecordProperty("cleanups", std::to_string(stats.cleanups));
  testing::Test::RecordProperty("conflict_ops", std::to_string(stats.conflict_ops));
  // The workload itself must have reached the cases it is for (shortened runs, as under TSan, may not fill).
  if (scale() >= 1.0) EXPECT_GT(model.fulls(), 0u) << "the sequence never filled the table";
  EXPECT_GT(stats.conflict_ops, 0u) << "no batch repeated a key";
  if (c.host_capacity != 0) {
    // The sequence filled the device tier, spilled, and exercised the host tier's every path.
    EXPECT_GT(stats.host_writes, 0u) << "no key ever reached the host tier";
    EXPECT_GT(stats.host_reads, 0u);
    // Every ticket size rules reads out: a 2-bit ticket has a single FULL code, but the tag byte still
    // tells keys apart.
    EXPECT_GT(stats.host_avoided, 0u);
  }
  if (c.put_batches && c.backend == BackendKind::kGpu && c.layout == SlotLayout::kLine && c.value_width <= 16 &&
      c.host_capacity == 0 && c.optimistic != OptimisticInserts::kOff && !c.slot_word) {
    // Passes ran optimistically, and some of them (a key the table held, or one the batch repeated) failed
    // and ran again; the model checks above say that either way every answer was batch order's.
    EXPECT_GT(stats.optimistic_passes, stats.optimistic_failures) << "no pass ran optimistically to its end";
    EXPECT_GT(stats.optimistic_failures, 0u) << "no optimistic pass failed";
  }
  testing::Test::RecordProperty("optimistic_passes", std::to_string(stats.optimistic_passes));
  testing::Test::RecordProperty("optimistic_failures", std::to_string(stats.optimistic_failures));
}

class TableModelTest : public testing::TestWithParam<ModelCase> {
 protected:
  void SetUp() override {
    if (GetParam().backend == BackendKind::kGpu && !Table::gpu_available()) {
      GTEST_SKIP() << "SKIPPED: no CUDA device on this machine; GPU model tests did not run";
    }
  }
};

TEST_P(TableModelTest, RandomMixedSequenceMatchesModel) { run_model_sequence(GetParam(), 0x5EED0000 + GetParam().capacity); }

std::vector<ModelCase> cases(BackendKind backend, double ops_scale) {
  const auto ops = [&](std::uint64_t n) { return static_cast<std::uint64_t>(static_cast<double>(n) * ops_scale); };
  std::vector<ModelCase> v;
  // Every ticket size with both probing schemes, 8-byte keys and values.
  for (std::uint32_t bits : {2u, 4u, 8u}) {
    for (Probing p : {Probing::kGroup, Probing::kSingle}) v.push_back({backend, 8, 8, bits, p, 3000, ops(250000)});
  }
  // Key and value widths, including values that are not a multiple of 8 bytes and 1 KiB values.
  v.push_back({backend, 16, 128, 8, Probing::kGroup, 4000, ops(250000)});
  v.push_back({backend, 32, 8, 4, Probing::kGroup, 4000, ops(250000)});
  v.push_back({backend, 32, 1024, 8, Probing::kGroup, 1500, ops(80000)});
  v.push_back({backend, 16, 100, 2, Probing::kSingle, 2000, ops(150000)});
  v.push_back({backend, 8, 13, 8, Probing::kSingle, 2000, ops(150000)});
  // Small passes (a batch spans many), a full load factor of 1.0, and a larger table.
  v.push_back({backend, 8, 8, 8, Probing::kGroup, 2000, ops(150000), /*max_batch=*/97});
  v.push_back({backend, 16, 16, 4, Probing::kGroup, 2000, ops(150000), 1 << 20, 0, /*max_load=*/1.0});
  v.push_back({backend, 8, 8, 8, Probing::kGroup, 60000, ops(1000000)});
  // Two tiers: the device tier fills and new keys spill to the host tier; the churn then deletes, overwrites
  // and re-inserts keys in both, with both tiers close to full.
  const auto tiered = [&](ModelCase c, std::uint64_t host) {
    c.host_capacity = host;
    v.push_back(c);
  };
  tiered({backend, 8, 8, 8, Probing::kGroup, 1000, ops(250000)}, 3000);
  tiered({backend, 16, 128, 4, Probing::kSingle, 700, ops(150000)}, 2000);
  tiered({backend, 32, 8, 2, Probing::kGroup, 500, ops(150000), /*max_batch=*/97}, 1500);
  tiered({backend, 8, 13, 8, Probing::kGroup, 2000, ops(150000), 1 << 20, 0, /*max_load=*/1.0}, 600);
  tiered({backend, 8, 8, 8, Probing::kGroup, 20000, ops(1000000)}, 60000);
  ModelCase in_the_walk{backend, 16, 16, 8, Probing::kGroup, 1000, ops(150000)};
  in_the_walk.order_host = false;
  tiered(in_the_walk, 3000);
  ModelCase narrow{backend, 8, 8, 4, Probing::kGroup, 1000, ops(150000)};
  narrow.host_phase_threads = 256;
  tiered(narrow, 3000);
  // The line layout (tickets and slots of a unit in one line): every ticket size, the widths whose slots
  // fill a line to 5, 3 and 3 slots (one with a value that is not a multiple of 8), small passes, a full load
  // factor, a larger table, and a device tier of lines spilling into a host tier on a board.
  const auto lined = [&](ModelCase c, std::uint64_t host = 0) {
    c.layout = SlotLayout::kLine;
    c.host_capacity = host;
    v.push_back(c);
  };
  for (std::uint32_t bits : {2u, 4u, 8u}) lined({backend, 8, 8, bits, Probing::kGroup, 3000, ops(250000)});
  lined({backend, 16, 8, 8, Probing::kGroup, 3000, ops(200000)});
  lined({backend, 8, 13, 4, Probing::kGroup, 2000, ops(150000), /*max_batch=*/97});
  lined({backend, 16, 16, 8, Probing::kGroup, 2000, ops(150000), 1 << 20, 0, /*max_load=*/1.0});
  lined({backend, 8, 8, 8, Probing::kGroup, 60000, ops(1000000)});
  lined({backend, 8, 8, 8, Probing::kGroup, 1000, ops(250000)}, 3000);
  for (std::uint32_t key_width : {8u, 16u}) {
    ModelCase writes{backend, key_width, 8, 8, Probing::kGroup, 20000, ops(400000)};
    writes.write_batches = true;
    lined(writes);
  }
  // Batches of PUTs alone in a line of 8-byte keys and values: on the GPU, optimistic passes (kAuto after a
  // pass of new keys, kAlways for every pass of PUTs), and the same batches never optimistic; small passes;
  // a load factor of 1.0, whose fill meets passes with no room for all their keys; 16-byte keys (a line has
  // no room for wider ones), claimed through BUSY where one-word keys may be claimed FULL at once
  // (Engine::full_claim_code).
  for (OptimisticInserts mode : {OptimisticInserts::kAuto, OptimisticInserts::kAlways, OptimisticInserts::kOff}) {
    ModelCase puts{backend, 8, 8, 8, Probing::kGroup, 20000, ops(400000)};
    puts.put_batches = true;
    puts.optimistic = mode;
    lined(puts);
  }
  {
    ModelCase small{backend, 8, 8, 8, Probing::kGroup, 3000, ops(200000), /*max_batch=*/97, 0, /*max_load=*/1.0};
    small.put_batches = true;
    small.optimistic = OptimisticInserts::kAlways;
    lined(small);
    ModelCase wide{backend, 16, 8, 8, Probing::kGroup, 4000, ops(150000)};
    wide.put_batches = true;
    wide.optimistic = OptimisticInserts::kAlways;
    lined(wide);
    ModelCase wide_full{backend, 16, 8, 8, Probing::kGroup, 3000, ops(150000), /*max_batch=*/97, 0, /*max_load=*/1.0};
    wide_full.put_batches = true;
    wide_full.optimistic = OptimisticInserts::kAlways;
    lined(wide_full);
  }
  // Slot words (TableConfig::slot_word): on a board of 8-byte keys and values, in the slot's sector padding;
  // behind wide values, with a host tier; in a line (24-byte slots, 4 a line), alone, in small passes,
  // spilling into a host tier, and in batches of PUTs alone (which a table with words never runs
  // optimistically). Then each lane schedule of the GPU with words.
  const auto worded = [&](ModelCase c, std::uint64_t host = 0, SlotLayout layout = SlotLayout::kBoard) {
    c.slot_word = true;
    c.host_capacity = host;
    c.layout = layout;
    v.push_back(c);
  };
  worded({backend, 8, 8, 8, Probing::kGroup, 3000, ops(250000)});
  worded({backend, 16, 128, 4, Probing::kSingle, 700, ops(150000)}, 2000);
  worded({backend, 8, 8, 8, Probing::kGroup, 3000, ops(250000)}, 0, SlotLayout::kLine);
  worded({backend, 8, 13, 4, Probing::kGroup, 2000, ops(150000), /*max_batch=*/97}, 0, SlotLayout::kLine);
  worded({backend, 8, 8, 8, Probing::kGroup, 1000, ops(250000)}, 3000, SlotLayout::kLine);
  {
    ModelCase puts{backend, 8, 8, 8, Probing::kGroup, 20000, ops(400000)};
    puts.put_batches = true;
    puts.optimistic = OptimisticInserts::kAlways;
    worded(puts, 0, SlotLayout::kLine);
  }
  if (backend == BackendKind::kGpu) {
    for (LaneMode lanes : {LaneMode::kStash, LaneMode::kClStash, LaneMode::kSplit}) {
      worded({backend, 8, 8, 8, Probing::kGroup, 20000, ops(500000), 1 << 20, 0, 0.95, lanes}, 0, SlotLayout::kLine);
      worded({backend, 16, 128, 4, Probing::kSingle, 4000, ops(200000), 1 << 20, 0, 0.95, lanes});
    }
  }
  if (backend == BackendKind::kGpu) {
    // Each lane schedule of the GPU's probing step on its own for the whole sequence (kSplit: every mixed pass
    // split by kind, whatever its size and layout).
    for (LaneMode lanes : {LaneMode::kStash, LaneMode::kClStash, LaneMode::kSplit}) {
      v.push_back({backend, 8, 8, 8, Probing::kGroup, 20000, ops(500000), 1 << 20, 0, 0.95, lanes});
      v.push_back({backend, 16, 128, 4, Probing::kSingle, 4000, ops(200000), 1 << 20, 0, 0.95, lanes});
      v.push_back({backend, 32, 8, 2, Probing::kGroup, 4000, ops(200000), 1 << 20, 0, 1.0, lanes});
      tiered({backend, 8, 8, 8, Probing::kGroup, 4000, ops(300000), 1 << 20, 0, 0.95, lanes}, 12000);
      lined({backend, 8, 8, 8, Probing::kGroup, 20000, ops(500000), 1 << 20, 0, 0.95, lanes});
      lined({backend, 16, 8, 4, Probing::kGroup, 4000, ops(300000), 1 << 20, 0, 0.95, lanes}, 12000);
      // A line of one-word keys spilling into a host tier: under kSplit, the split kernels' own walks
      // (Walk::kLineFetched, kLineFromL2NoFetch) beside the host phase.
      lined({backend, 8, 8, 8, Probing::kGroup, 4000, ops(300000), 1 << 20, 0, 0.95, lanes}, 12000);
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cpu, TableModelTest, testing::ValuesIn(cases(BackendKind::kCpu, 1.0)), param_name);
INSTANTIATE_TEST_SUITE_P(Gpu, TableModelTest, testing::ValuesIn(cases(BackendKind::kGpu, 4.0)), param_name);

}  // namespace
}  // namespace gpukv::test
