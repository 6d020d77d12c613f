// The batcher against the real table (CPU backend): the batching decision (a pure function, no sleeps),
// full and timed-out batches, calls spanning batches, arrival order across calls on one key, deadlines,
// the queue bound, malformed ops, draining, and many concurrent callers checked against a model; on a GPU,
// a real device fault failing a call INTERNAL.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <future>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "batcher/batcher.hpp"

namespace gpukv::server {
namespace {

using namespace std::chrono_literals;

// ---- decide_batch -------------------------------------------------------------------------------------

TEST(DecideBatch, NothingQueuedWaitsForever) {
  const auto t = Clock::time_point{} + 1s;
  const BatchDecision d = decide_batch(0, t, t, 8, 100us, false);
  EXPECT_FALSE(d.launch);
  EXPECT_EQ(d.wait, Clock::duration::max());
}

TEST(DecideBatch, FullBatchLaunchesAtOnce) {
  const auto t = Clock::time_point{} + 1s;
  EXPECT_TRUE(decide_batch(8, t, t, 8, 100us, false).launch);
  EXPECT_TRUE(decide_batch(9, t, t, 8, 100us, false).launch);
}

TEST(DecideBatch, PartialBatchWaitsOutTheDelayOfItsOldestOp) {
  const auto oldest = Clock::time_point{} + 1s;
  const BatchDecision early = decide_batch(3, oldest, oldest + 30us, 8, 100us, false);
  EXPECT_FALSE(early.launch);
  EXPECT_EQ(early.wait, 70us);
  EXPECT_TRUE(decide_batch(3, oldest, oldest + 100us, 8, 100us, false).launch);
  EXPECT_TRUE(decide_batch(3, oldest, oldest + 1s, 8, 100us, false).launch);
}

TEST(DecideBatch, DrainingLaunchesWhateverIsQueued) {
  const auto t = Clock::time_point{} + 1s;
  EXPECT_TRUE(decide_batch(1, t, t, 8, 1h, true).launch);
  EXPECT_FALSE(decide_batch(0, t, t, 8, 1h, true).launch);
}

TEST(DecideBatch, AnIdleTableTakesAPartialBatchAtOnceOnlyWhenAskedTo) {
  const auto t = Clock::time_point{} + 1s;
  EXPECT_TRUE(decide_batch(1, t, t, 8, 1h, false, /*launch_when_idle=*/true, /*table_idle=*/true).launch);
  const BatchDecision busy = decide_batch(1, t, t + 30us, 8, 100us, false, true, /*table_idle=*/false);
  EXPECT_FALSE(busy.launch);  // a batch is running: the next one fills as usual
  EXPECT_EQ(busy.wait, 70us);
  EXPECT_FALSE(decide_batch(1, t, t, 8, 1h, false, /*launch_when_idle=*/false, true).launch);
  EXPECT_FALSE(decide_batch(0, t, t, 8, 1h, false, true, true).launch);
}

// ---- the batcher --------------------------------------------------------------------------------------

// The value width of the tables these tests build (cpu_table).
constexpr std::uint32_t kValueWidth = 32;

// One call's packed columns and results, and a future for its completion.
struct TestCall {
  std::string kinds, keys, values;
  std::vector<std::uint32_t> key_lengths, value_lengths;
  // Where the batcher writes the results: garbage before, so that a result it fails to write shows.
  std::string out_results, out_values;
  std::vector<std::uint32_t> out_value_lengths;
  CallResults results;
  std::promise<CallCode> promise;
  std::future<CallCode> future = promise.get_future();
  std::string message;  // what done() said, written before the future is ready
  std::uint32_t value_width = kValueWidth;  // of the table the call goes to: room for each GET's value

  TestCall& op(OpKind kind, const std::string& key, const std::string& value = {}) {
    kinds.push_back(static_cast<char>(kind));
    keys += key;
    key_lengths.push_back(static_cast<std::uint32_t>(key.size()));
    if (carries_value(kind)) {
      values += value;
      value_lengths.push_back(static_cast<std::uint32_t>(value.size()));
    }
    return *this;
  }
  Call call(Clock::time_point deadline = Clock::time_point::max()) {
    Call c;
    c.ops = CallOps{key_lengths.size(), kinds, OpKind::kGet, keys, key_lengths.data(), values, value_lengths.data()};
    out_results.assign(c.ops.count, '\x7f');
    out_values.assign(get_count(c.ops) * value_width, '?');
    out_value_lengths.assign(c.ops.count, 0);
    results = CallResults{out_results.data(), out_values.data(), out_value_lengths.data()};
    c.results = &results;
    c.deadline = deadline;
    c.done = [this](CallCode code, std::string_view why) {
      message = why;
      promise.set_value(code);
    };
    return c;
  }
  CallCode wait() {
    // A generous bound so that a lost call fails the test instead of hanging it; not a speed check.
    if (future.wait_for(30s) != std::future_status::ready) return static_cast<CallCode>(-1);
    return future.get();
  }
  OpStatus status(std::size_t i) const { return static_cast<OpStatus>(out_results[i]); }
  // The value of the GET at op i (values are packed in op order).
  std::string value(std::size_t i) const {
    std::size_t offset = 0;
    for (std::size_t j = 0; j < i; ++j) offset += out_value_lengths[j];
    EXPECT_LE(offset + out_value_lengths[i], results.values_size);
    return out_values.substr(offset, out_value_lengths[i]);
  }
};

TableConfig cpu_table(std::uint64_t capacity = 1 << 16) {
  TableConfig c;
  c.backend = BackendKind::kCpu;
  c.capacity = capacity;
  c.key_width = 16;
  c.value_width = kValueWidth;
  c.max_batch = 1 << 16;
  return c;
}

TEST(Batcher, FullBatchesRunWithoutWaitingForTheDelay) {
  Table table(cpu_table());
  BatcherConfig bc;
  bc.batch_size = 4;
  bc.max_delay = 1h;  // only full batches can launch
  Batcher batcher(table, bc);
  std::vector<TestCall> calls(8);
  for (std::size_t i = 0; i < calls.size(); ++i) batcher.submit(calls[i].op(OpKind::kPut, "k" + std::to_string(i), "v").call());
  for (auto& c : calls) {
    ASSERT_EQ(c.wait(), CallCode::kOk);
    EXPECT_EQ(c.status(0), OpStatus::kOk);
  }
}

// At wide values a batch of batch_size operations would stage gigabytes (65536 of 64 KiB values: 8.6 GB, three
// staged batches 26 GB): batches then take fewer operations, at most kMaxStagedBatchBytes of columns, and a call
// larger than one such batch still runs whole, over several.
TEST(Batcher, AtWideValuesABatchTakesFewerOperationsAndACallSpansBatches) {
  TableConfig tc = cpu_table(1 << 12);
  tc.value_width = 65536;
  Table table(tc);
  BatcherConfig bc;
  bc.batch_size = 65536;
  bc.max_delay = 1ms;
  Batcher batcher(table, bc);
  const std::size_t row = 3 + 8 + 16 + 2 * std::size_t{table.value_stride()};
  EXPECT_EQ(batcher.batch_size(), kMaxStagedBatchBytes / row);
  EXPECT_LT(batcher.batch_size() * row, kMaxStagedBatchBytes + row);
  BatcherConfig narrow;
  narrow.batch_size = 65536;
  Table narrow_table(cpu_table());
  EXPECT_EQ(Batcher(narrow_table, narrow).batch_size(), 65536u) << "at 16 B keys and narrow values nothing changes";

  TestCall put;  // more PUTs than a batch takes
  const std::size_t n = batcher.batch_size() + 10;
  for (std::size_t i = 0; i < n; ++i) put.op(OpKind::kPut, "w" + std::to_string(i), std::string(65536, static_cast<char>('a' + i % 26)));
  batcher.submit(put.call());
  ASSERT_EQ(put.wait(), CallCode::kOk);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(put.status(i), OpStatus::kOk) << i;
  TestCall get;
  get.value_width = tc.value_width;
  get.op(OpKind::kGet, "w0").op(OpKind::kGet, "w" + std::to_string(n - 1));
  batcher.submit(get.call());
  ASSERT_EQ(get.wait(), CallCode::kOk);
  EXPECT_EQ(get.value(0), std::string(65536, 'a'));
  EXPECT_EQ(get.value(1), std::string(65536, static_cast<char>('a' + (n - 1) % 26)));
}

// A lone PUT, then a lone GET of its key, each in a batch of its own far below batch_size: both run, and the
// GET finds the value.
void lone_calls_run(const BatcherConfig& bc) {
  Table table(cpu_table());
  Batcher batcher(table, bc);
  TestCall put, get;
  batcher.submit(put.op(OpKind::kPut, "key", "value").call());
  ASSERT_EQ(put.wait(), CallCode::kOk);
  batcher.submit(get.op(OpKind::kGet, "key").call());
  ASSERT_EQ(get.wait(), CallCode::kOk);
  EXPECT_EQ(get.status(0), OpStatus::kOk);
  EXPECT_EQ(get.value(0), "value");
}

TEST(Batcher, WithLaunchWhenIdleALoneCallDoesNotWaitOutTheDelay) {
  BatcherConfig bc;
  bc.batch_size = 1000;
  bc.max_delay = 1h;  // without launch_when_idle, this call would wait an hour
  bc.launch_when_idle = true;
  lone_calls_run(bc);
}

TEST(Batcher, PartialBatchRunsOnceItsDelayPasses) {
  BatcherConfig bc;
  bc.batch_size = 1000;
  bc.max_delay = 2ms;
  lone_calls_run(bc);
}

TEST(Batcher, CallsOnOneKeyTakeEffectInArrivalOrder) {
  Table table(cpu_table());
  BatcherConfig bc;
  bc.batch_size = 3;  // the calls below span several batches
  bc.max_delay = 1ms;
  Batcher batcher(table, bc);
  std::vector<TestCall> calls(7);
  batcher.submit(calls[0].op(OpKind::kPut, "k", "v1").call());
  batcher.submit(calls[1].op(OpKind::kGet, "k").call());
  batcher.submit(calls[2].op(OpKind::kPut, "k", "v2").op(OpKind::kPutIfAbsent, "k", "no").call());
  batcher.submit(calls[3].op(OpKind::kGet, "k").call());
  batcher.submit(calls[4].op(OpKind::kDelete, "k").op(OpKind::kGet, "k").call());
  batcher.submit(calls[5].op(OpKind::kPutIfAbsent, "k", "v3").call());
  batcher.submit(calls[6].op(OpKind::kGet, "k").call());
  for (auto& c : calls) ASSERT_EQ(c.wait(), CallCode::kOk);
  EXPECT_EQ(calls[1].value(0), "v1");
  EXPECT_EQ(calls[2].status(1), OpStatus::kExists);
  EXPECT_EQ(calls[3].value(0), "v2");
  EXPECT_EQ(calls[4].status(0), OpStatus::kOk);
  EXPECT_EQ(calls[4].status(1), OpStatus::kNotFound);
  EXPECT_EQ(calls[5].status(0), OpStatus::kOk);
  EXPECT_EQ(calls[6].value(0), "v3");
}

// Calls answered by the execution thread (0), or by completion threads, several per batch and across batches,
// with batches also launched whenever the table is idle.
struct Answering {
  unsigned completion_threads;
  bool launch_when_idle;
};
class BatcherCompletion : public testing::TestWithParam<Answering> {
 protected:
  static BatcherConfig answering(std::size_t batch_size, Clock::duration max_delay, std::size_t answer_rows) {
    BatcherConfig bc;
    bc.batch_size = batch_size;
    bc.max_delay = max_delay;
    bc.completion_threads = GetParam().completion_threads;
    bc.launch_when_idle = GetParam().launch_when_idle;
    bc.answer_rows = answer_rows;
    return bc;
  }
};
INSTANTIATE_TEST_SUITE_P(Threads, BatcherCompletion,
                         testing::Values(Answering{0, false}, Answering{0, true}, Answering{3, false}, Answering{3, true}),
                         [](const testing::TestParamInfo<Answering>& i) {
                           return (i.param.completion_threads == 0 ? std::string("answered_by_the_execution_thread")
                                                                   : "completion_threads_" + std::to_string(i.param.completion_threads)) +
                                  (i.param.launch_when_idle ? "_launch_when_idle" : "");
                         });

TEST_P(BatcherCompletion, ACallLargerThanABatchSpansBatchesInOrder) {
  Table table(cpu_table());
  // Runs of 3 rows: several threads answer each batch, and a call's batches at once.
  Batcher batcher(table, answering(16, 1ms, 3));
  TestCall puts, gets;
  for (int i = 0; i < 100; ++i) puts.op(OpKind::kPut, "key" + std::to_string(i), "value" + std::to_string(i));
  for (int i = 0; i < 100; ++i) gets.op(OpKind::kGet, "key" + std::to_string(i % 7 == 3 ? 1000 + i : i));
  batcher.submit(puts.call());
  batcher.submit(gets.call());
  ASSERT_EQ(puts.wait(), CallCode::kOk);
  ASSERT_EQ(gets.wait(), CallCode::kOk);
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(puts.status(i), OpStatus::kOk);
    if (i % 7 == 3) {
      EXPECT_EQ(gets.status(i), OpStatus::kNotFound);
    } else {
      EXPECT_EQ(gets.value(i), "value" + std::to_string(i));
    }
  }
}

// A GPU fault while a call's batch runs fails the call INTERNAL, naming the table's failure: some of its ops
// may have been applied, and a client retries only UNAVAILABLE. The fault is real: a batch whose columns point
// at unmapped device memory makes the GPU fault, which leaves the process's CUDA context unusable for good,
// so the scenario runs in a process of its own (a death test, re-executed rather than forked: CUDA does not
// survive a fork) and reports through its exit code; it ends with _Exit, as no CUDA call can clean up.
TEST(BatcherGpu, ATableFailureFailsTheCallWithInternal) {
  if (!Table::gpu_available()) {
    GTEST_SKIP() << "SKIPPED: no CUDA device on this machine; the GPU fault test did not run";
  }
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto scenario = [] {
    TableConfig tc = cpu_table();
    tc.backend = BackendKind::kGpu;
    Table table(tc);
    Batcher batcher(table, BatcherConfig{});
    TestCall before;
    batcher.submit(before.op(OpKind::kPut, "k", "v").call());
    if (before.wait() != CallCode::kOk) std::_Exit(2);
    // The fault: the table's kernels read columns at an address no allocation holds.
    const auto* nowhere = reinterpret_cast<const std::uint8_t*>(std::uintptr_t{1} << 20);
    bool threw = false;
    try {
      table.execute_on_device(BatchIn{1, nowhere, nowhere, nowhere, nullptr, nullptr},
                              BatchOut{const_cast<std::uint8_t*>(nowhere), nullptr, nullptr});
    } catch (const Error&) {
      threw = true;
    }
    if (!threw) std::_Exit(3);
    TestCall after;
    batcher.submit(after.op(OpKind::kPut, "k", "w").call());
    const CallCode code = after.wait();
    std::fprintf(stderr, "code %d: %s\n", static_cast<int>(code), after.message.c_str());
    std::_Exit(code == CallCode::kInternal && after.message.find("the table failed") != std::string::npos ? 0 : 4);
  };
  EXPECT_EXIT(scenario(), ::testing::ExitedWithCode(0), "code 4: the table failed");
}

// The write-ahead log hook: it sees every executed batch with its results, and syncs it, before any call is
// answered; when the sync fails, the calls that wrote fail (UNAVAILABLE, never acknowledged) while a
// GET-only call in the same batch is answered.
TEST(Batcher, TheLogSeesEachBatchBeforeItsCallsAreAnsweredAndItsFailureFailsTheWriters) {
  Table table(cpu_table());
  BatcherConfig bc;
  bc.batch_size = 3;
  bc.max_delay = 1h;  // the three calls below share one batch
  std::atomic<bool> failing{false};
  std::atomic<int> logged_writes{0}, answered_before_log{0};
  std::vector<TestCall*> in_batch;  // set before the batch's calls are submitted
  BatchLog log;
  log.encode = [&](const BatchIn& in, const std::uint8_t* status, std::string* record) {
    *record = std::to_string(in.size);  // what append sees is what encode made of the same batch
    for (std::size_t i = 0; i < in.size; ++i) logged_writes += in.ops[i] != 0 && status[i] == 0;
  };
  log.append = [&](const std::string& record) -> std::string {
    EXPECT_EQ(record, "3");
    return {};
  };
  log.sync = [&]() -> std::string {
    for (TestCall* t : in_batch) answered_before_log += t->future.wait_for(0s) == std::future_status::ready;
    return failing ? "no space left on device" : "";
  };
  Batcher batcher(table, bc, {}, {}, log);
  {
    TestCall a, b, c;
    in_batch = {&a, &b, &c};
    batcher.submit(a.op(OpKind::kPut, "x", "1").call());
    batcher.submit(b.op(OpKind::kPut, "y", "2").call());
    batcher.submit(c.op(OpKind::kDelete, "x").call());
    for (TestCall* t : {&a, &b, &c}) ASSERT_EQ(t->wait(), CallCode::kOk);
    EXPECT_EQ(logged_writes.load(), 3);
    EXPECT_EQ(answered_before_log.load(), 0);
  }
  failing = true;
  TestCall put, del, get;
  in_batch.clear();
  batcher.submit(put.op(OpKind::kPut, "z", "3").call());
  batcher.submit(del.op(OpKind::kDelete, "x").call());  // a delete that finds nothing is a write all the same
  batcher.submit(get.op(OpKind::kGet, "y").call());
  EXPECT_EQ(put.wait(), CallCode::kUnavailable);
  EXPECT_NE(put.message.find("no space left on device"), std::string::npos) << put.message;
  EXPECT_EQ(del.wait(), CallCode::kUnavailable);
  ASSERT_EQ(get.wait(), CallCode::kOk) << "a call of GETs alone is answered";
  EXPECT_EQ(get.status(0), OpStatus::kOk);
  EXPECT_EQ(get.value(0), "2");
}

TEST(Batcher, MalformedOpsAreRejectedAloneAndChangeNothing) {
  Table table(cpu_table());
  Batcher batcher(table, BatcherConfig{});
  TestCall call, check;
  call.op(OpKind::kPut, "", "empty key")
      .op(OpKind::kPut, std::string(17, 'k'), "key too long")
      .op(OpKind::kPut, "long-value", std::string(33, 'v'))
      .op(static_cast<OpKind>(7), "bad-kind")
      .op(OpKind::kPut, "fine", "ok");
  batcher.submit(call.call());
  ASSERT_EQ(call.wait(), CallCode::kOk);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(call.status(i), OpStatus::kInvalid) << i;
  EXPECT_EQ(call.status(4), OpStatus::kOk);
  batcher.submit(check.op(OpKind::kGet, "long-value").op(OpKind::kGet, "fine").call());
  ASSERT_EQ(check.wait(), CallCode::kOk);
  EXPECT_EQ(check.status(0), OpStatus::kNotFound);
  EXPECT_EQ(check.value(1), "ok");
  EXPECT_EQ(table.stats().device.items, 1u);
}

TEST(Batcher, ExpiredDeadlineFailsTheCallAndAppliesNothing) {
  Table table(cpu_table());
  Batcher batcher(table, BatcherConfig{});
  TestCall late, check;
  batcher.submit(late.op(OpKind::kPut, "late", "v").call(Clock::now() - 1ms));
  EXPECT_EQ(late.wait(), CallCode::kDeadlineExceeded);
  batcher.submit(check.op(OpKind::kGet, "late").call());
  ASSERT_EQ(check.wait(), CallCode::kOk);
  EXPECT_EQ(check.status(0), OpStatus::kNotFound);
}

// A call counts as queued until its batch closes: one whose deadline passes while its rows sit copied in the
// filling batch is refused and changes nothing, while the call that fills the batch runs.
TEST(Batcher, ADeadlinePassingBeforeTheBatchClosesFailsTheCallAndAppliesNothing) {
  Table table(cpu_table());
  BatcherConfig bc;
  bc.batch_size = 8;
  bc.max_delay = 1h;  // only a full batch closes
  Batcher batcher(table, bc);
  TestCall early, filler;
  batcher.submit(early.op(OpKind::kPut, "early", "v").op(OpKind::kPut, "early2", "v").call(Clock::now() + 2ms));
  std::this_thread::sleep_for(20ms);  // past early's deadline, with its batch still filling
  for (int i = 0; i < 6; ++i) filler.op(OpKind::kPut, "f" + std::to_string(i), "v");
  batcher.submit(filler.call());  // fills the batch: it closes
  EXPECT_EQ(early.wait(), CallCode::kDeadlineExceeded);
  ASSERT_EQ(filler.wait(), CallCode::kOk);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(filler.status(i), OpStatus::kOk);
  batcher.drain();
  EXPECT_EQ(table.stats().device.items, 6u);
}

TEST(Batcher, FullQueueRefusesCallsAndDrainRunsWhatWasQueued) {
  Table table(cpu_table());
  BatcherConfig bc;
  bc.batch_size = 64;
  bc.max_delay = 1h;  // queued ops stay queued until the drain
  bc.max_queued_ops = 10;
  Batcher batcher(table, bc);
  TestCall queued, refused, too_big, after;
  for (int i = 0; i < 8; ++i) queued.op(OpKind::kPut, "q" + std::to_string(i), "v");
  batcher.submit(queued.call());
  for (int i = 0; i < 5; ++i) refused.op(OpKind::kPut, "r" + std::to_string(i), "v");
  batcher.submit(refused.call());
  EXPECT_EQ(refused.wait(), CallCode::kResourceExhausted);
  for (int i = 0; i < 11; ++i) too_big.op(OpKind::kGet, "x");
  batcher.submit(too_big.call());
  EXPECT_EQ(too_big.wait(), CallCode::kResourceExhausted);
  EXPECT_EQ(batcher.queued_ops(), 8u);

  batcher.drain();
  EXPECT_EQ(queued.wait(), CallCode::kOk);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(queued.status(i), OpStatus::kOk);
  batcher.submit(after.op(OpKind::kGet, "q0").call());
  EXPECT_EQ(after.wait(), CallCode::kUnavailable);
  EXPECT_EQ(table.stats().device.items, 8u);
}

TEST(Batcher, ReportsEveryBatch) {
  Table table(cpu_table());
  BatcherConfig bc;
  bc.batch_size = 5;
  bc.max_delay = 1ms;
  std::mutex mutex;
  std::uint64_t ops = 0, puts_ok = 0;
  {
    Batcher batcher(table, bc, [&](const BatchReport& r) {
      std::lock_guard lock(mutex);
      ops += r.ops;
      puts_ok += r.results[static_cast<int>(OpKind::kPut)][static_cast<int>(OpStatus::kOk)];
    });
    TestCall call;
    for (int i = 0; i < 12; ++i) call.op(OpKind::kPut, "k" + std::to_string(i), "v");
    batcher.submit(call.call());
    ASSERT_EQ(call.wait(), CallCode::kOk);
  }
  EXPECT_EQ(ops, 12u);
  EXPECT_EQ(puts_ok, 12u);
}

// on_executed runs after the batch ran and before any of its calls is answered: a call's done() finds its
// own batch's ops in the table's figures.
TEST(Batcher, ReportsTheTableBeforeAnsweringTheBatch) {
  Table table(cpu_table());
  BatcherConfig bc;
  bc.batch_size = 4;
  bc.max_delay = 100us;
  bc.completion_threads = 2;
  std::atomic<std::uint64_t> items{0}, ops{0};
  Batcher batcher(table, bc, {}, [&](const TableStats& s, std::size_t n) {
    items.store(s.device.items);
    ops.fetch_add(n);
  });
  for (int i = 0; i < 50; ++i) {
    TestCall call;
    call.op(OpKind::kPut, "k" + std::to_string(i), "v");
    std::uint64_t seen_items = 0, seen_ops = 0;
    Call c = call.call();
    c.done = [&](CallCode code, std::string_view) {
      seen_items = items.load();
      seen_ops = ops.load();
      call.promise.set_value(code);
    };
    batcher.submit(std::move(c));
    ASSERT_EQ(call.wait(), CallCode::kOk);
    EXPECT_EQ(seen_items, static_cast<std::uint64_t>(i + 1));
    EXPECT_EQ(seen_ops, static_cast<std::uint64_t>(i + 1));
  }
}

// Many client threads, each on its own keys, random mixed calls of min_ops..max_ops ops; each thread's
// results must match its own model exactly (its calls run in the order it submitted them).
void concurrent_clients_match_their_models(BatcherConfig bc, int calls_per_client, int min_ops, int max_ops) {
  Table table(cpu_table(1 << 15));
  Batcher batcher(table, bc);
  constexpr int kClients = 6;
  const int kCalls = calls_per_client;
  std::vector<std::thread> clients;
  std::vector<std::string> failures(kClients);
  for (int t = 0; t < kClients; ++t) {
    clients.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::map<std::string, std::string> model;
      // Several calls in flight at once, checked in submission order.
      for (int round = 0; round < kCalls / 5 && failures[t].empty(); ++round) {
        std::vector<TestCall> calls(5);
        std::vector<std::vector<std::pair<OpKind, std::string>>> expect(5);
        for (auto& c : calls) {
          const int n = min_ops + static_cast<int>(rng() % static_cast<unsigned>(max_ops - min_ops + 1));
          for (int i = 0; i < n; ++i) {
            const std::string key = std::to_string(t) + "/" + std::to_string(rng() % 64);
            const OpKind kind = static_cast<OpKind>(rng() % 4);
            c.op(kind, key, "v" + std::to_string(rng() % 1000));
          }
          batcher.submit(c.call());
        }
        for (auto& c : calls) {
          if (c.wait() != CallCode::kOk) {
            failures[t] = "call failed";
            return;
          }
          std::size_t found_bytes = 0;
          for (std::uint32_t len : c.out_value_lengths) found_bytes += len;
          if (c.results.values_size != found_bytes) failures[t] = "the values are not packed";
          std::size_t key_at = 0, value_at = 0, write = 0;
          for (std::size_t i = 0; i < c.key_lengths.size(); ++i) {
            const std::string key = c.keys.substr(key_at, c.key_lengths[i]);
            key_at += c.key_lengths[i];
            const auto kind = static_cast<OpKind>(c.kinds[i]);
            std::string value;
            if (carries_value(kind)) {
              value = c.values.substr(value_at, c.value_lengths[write]);
              value_at += c.value_lengths[write++];
            }
            const bool present = model.count(key) != 0;
            OpStatus want = OpStatus::kOk;
            switch (kind) {
              case OpKind::kGet:
                want = present ? OpStatus::kOk : OpStatus::kNotFound;
                if (present && c.value(i) != model[key]) failures[t] = "wrong value for " + key;
                if (!present && c.out_value_lengths[i] != 0) failures[t] = "a value for the absent " + key;
                break;
              case OpKind::kPut:
                model[key] = value;
                break;
              case OpKind::kPutIfAbsent:
                want = present ? OpStatus::kExists : OpStatus::kOk;
                if (!present) model[key] = value;
                break;
              case OpKind::kDelete:
                want = present ? OpStatus::kOk : OpStatus::kNotFound;
                model.erase(key);
                break;
            }
            if (c.status(i) != want) failures[t] = "wrong status for " + key;
          }
        }
      }
    });
  }
  for (auto& c : clients) c.join();
  for (int t = 0; t < kClients; ++t) EXPECT_EQ(failures[t], "") << "client " << t;
}

TEST_P(BatcherCompletion, ConcurrentClientsMatchTheirModels) {
  concurrent_clients_match_their_models(answering(256, 200us, 16), 150, 1, 40);
}

// Calls of hundreds of ops: their rows are copied outside the lock, several copiers fill one batch at once,
// and batches close (full, or on time) while copies are in flight.
TEST_P(BatcherCompletion, ConcurrentLargeCallsMatchTheirModels) {
  concurrent_clients_match_their_models(answering(2048, 100us, 64), 25, 257, 1500);
}

}  // namespace
}  // namespace gpukv::server
