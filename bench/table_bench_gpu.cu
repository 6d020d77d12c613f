// GPU table benchmark: insert, find (all hits), find (all misses), overwrite, a mixed batch (50% GET / 45%
// PUT / 5% DELETE) and delete at several load factors, timed with CUDA events around the table's batch call
// (every pass of the call: grouping, execution, host round trips). Inputs and outputs stay in GPU memory, as
// in cuco's bulk API. In the same run it measures the baselines: device-to-device copy bandwidth, random
// 8-byte reads, and a linear-probing 8B/8B table of the cuco static_map kind (thread per key, 64-bit CAS on
// the key).
// --parts=churn holds a full table under deletes and new keys (bench_churn): what its clean-ups cost.
// --parts=steady runs mixed batches for a while on a table at each load (bench_steady_mixed): their steady
// rate, tombstones and clean-ups included (--cleanup_tombstones: the tombstone share that triggers a clean-up,
// TableConfig::cleanup_tombstones; its default unless given; --steady_probe_every=K: GETs of live keys and of
// absent ones timed before every K-th batch).
//
//   table_bench_gpu --n=134217728 --kw=8 --vw=8 --loads=0.5,0.8,0.9,0.95 --tickets=8 --probing=group
//                   --layouts=board,line   (slot layouts, each measured at every load in turn)
//                   --mixed_keys=spread    (the mixed batch's keys from every age of the fill; first: the first
//                                           half inserted, as measured before 2026-11-27)
//                   --slot_word=1          (--parts=table: a table with slot words, TableConfig::slot_word;
//                                           every write carries one, every GET answers one)
//                   --mixed_order=by_kind  (the mixed batch's kinds sorted within each pass of max_batch ops,
//                                           a diagnostic; by_class: GETs and deletes first, then PUTs, each
//                                           class's kinds scrambled; scrambled by default)
//
// Prints one line per measurement: "RESULT <workload> <fields...>" (see print_result).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "gpu_bench_common.cuh"

namespace gpukv::bench {
namespace {

struct TableRun {
  std::uint32_t kw, vw, tickets;
  Probing probing;
  LaneMode lanes;
  std::uint32_t max_batch;
  double load;
  std::uint64_t n;
  int repeats;
  SlotLayout layout = SlotLayout::kBoard;
  // The keys of the mixed batch and of the deletes after it: spread over every age of the fill (spread_index),
  // or (false) the first inserted half, and the deletes from the second half, as before 2026-11-27: at high
  // load the keys inserted first sit nearer their home units than the keys of the pure batches, all of them.
  bool spread_mixed = true;
  bool slot_word = false;  // TableConfig::slot_word, every write carrying a word and every GET answering one
  std::string mixed_order = "scrambled";  // or by_kind, by_class: sorted within each pass (make_mixed)
};

// Copies keys spread_index(first + i, count) of `from` (count keys of kw bytes) to `to`, for i < n.
__global__ void select_spread_keys(std::uint8_t* to, const std::uint8_t* from, std::uint64_t first, std::uint64_t n,
                                   std::uint64_t count, std::uint32_t kw) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < n; i += std::uint64_t{gridDim.x} * blockDim.x) {
    const auto* src = reinterpret_cast<const std::uint64_t*>(from + spread_index(first + i, count) * kw);
    auto* dst = reinterpret_cast<std::uint64_t*>(to + i * kw);
    for (std::uint32_t j = 0; j < kw / 8; ++j) dst[j] = src[j];
  }
}

std::string describe(const TableRun& r) {
  char buf[240];
  std::snprintf(buf, sizeof buf, "kw=%u vw=%u tickets=%u probing=%s layout=%s lanes=%s max_batch=%u%s", r.kw, r.vw,
                r.tickets, to_string(r.probing), to_string(r.layout), to_string(r.lanes), r.max_batch,
                r.slot_word ? " slot_word=1" : "");
  return buf;
}

TableConfig table_config(const TableRun& r) {
  TableConfig c;
  c.backend = BackendKind::kGpu;
  c.key_width = r.kw;
  c.value_width = r.vw;
  c.ticket_bits = r.tickets;
  c.probing = r.probing;
  c.slot_layout = r.layout;
  c.lanes = r.lanes;
  c.max_batch = r.max_batch;
  c.max_load_factor = 1.0;
  c.capacity = static_cast<std::uint64_t>(static_cast<double>(r.n) / r.load);
  c.slot_word = r.slot_word;
  return c;
}

// One table configuration at one load: insert, find hits, find misses, overwrite, mixed, delete. Best of
// `repeats`.
void bench_table(const TableRun& r) {
  const std::uint32_t stride = value_stride(r.vw);
  TableConfig config = table_config(r);
  const std::string name = describe(r);

  // Keys sized for the table's real capacity (rounded up to prime units), so the load is what was asked.
  std::uint64_t fill;
  {
    Table probe(config);
    fill = static_cast<std::uint64_t>(r.load * static_cast<double>(probe.stats().device.capacity));
  }
  Batch batch(fill, r.kw, stride, r.slot_word);
  DeviceArray<std::uint8_t> hit_keys(fill * r.kw), miss_keys(fill * r.kw), lens(fill);
  make_keys<<<kGrid, kBlock>>>(hit_keys.p, lens.p, fill, r.kw, 0, 1);
  make_keys<<<kGrid, kBlock>>>(miss_keys.p, lens.p, fill, r.kw, 0, 2);
  make_values<<<kGrid, kBlock>>>(batch.values.p, batch.value_lens.p, fill, r.vw, stride, 7);
  CHECK(cudaMemcpy(batch.key_lens.p, lens.p, fill, cudaMemcpyDeviceToDevice));
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());

  Timer timer;
  double best_insert = 1e30, best_hit = 1e30, best_miss = 1e30, best_overwrite = 1e30, best_mixed = 1e30,
         best_delete = 1e30;
  double bytes_per_pair = 0;
  std::uint64_t passes = 0, delete_cleanups = 0;
  const std::uint64_t mixed_n = fill / 2;
  const std::uint64_t delete_n = mixed_n / 10;
  // Runs the first `count` ops of the batch columns on `table`, timed; every op must end with `want`.
  const auto timed = [&](Table& table, std::uint64_t count, OpStatus want, const char* what) {
    CHECK(cudaDeviceSynchronize());
    timer.start();
    table.execute_on_device(batch.in(count), batch.out());
    const double ms = timer.stop_ms();
    expect_status(batch, count, want, what);
    return ms;
  };
  const auto set_ops = [&](std::uint64_t count, OpKind kind) {
    fill_ops<<<kGrid, kBlock>>>(batch.ops.p, count, static_cast<std::uint8_t>(kind));
  };
  const auto set_keys = [&](const DeviceArray<std::uint8_t>& keys, std::uint64_t first, std::uint64_t count) {
    CHECK(cudaMemcpy(batch.keys.p, keys.p + first * r.kw, count * r.kw, cudaMemcpyDeviceToDevice));
  };
  for (int rep = 0; rep < r.repeats; ++rep) {
    Table table(config);
    // Insert every key (all PUTs of new keys).
    set_ops(fill, OpKind::kPut);
    set_keys(hit_keys, 0, fill);
    best_insert = std::min(best_insert, timed(table, fill, OpStatus::kOk, "insert"));
    const TableStats s = table.stats();
    bytes_per_pair = static_cast<double>(s.device.board_bytes + s.device.slot_bytes) / static_cast<double>(s.device.items);
    passes = s.batches;

    // Find, all hits.
    set_ops(fill, OpKind::kGet);
    best_hit = std::min(best_hit, timed(table, fill, OpStatus::kOk, "find hit"));

    // Find, all misses.
    set_keys(miss_keys, 0, fill);
    best_miss = std::min(best_miss, timed(table, fill, OpStatus::kNotFound, "find miss"));

    // Overwrite: a PUT of every inserted key.
    set_ops(fill, OpKind::kPut);
    set_keys(hit_keys, 0, fill);
    best_overwrite = std::min(best_overwrite, timed(table, fill, OpStatus::kOk, "overwrite"));

    // Mixed: 50% GET, 40% PUT overwrite, 5% PUT new, 5% DELETE, over half of the inserted keys (spread over
    // the fill unless r.spread_mixed is off: the first half).
    make_mixed<<<kGrid, kBlock>>>(batch.ops.p, batch.keys.p, hit_keys.p, miss_keys.p, mixed_n, r.kw,
                                  r.spread_mixed ? fill : 0, r.mixed_order != "scrambled" ? r.max_batch : 0,
                                  r.mixed_order == "by_class");
    best_mixed = std::min(best_mixed, timed(table, mixed_n, OpStatus::kOk, "mixed"));

    // Delete: keys of the half the mixed batch left alone, as many as would leave a clean-up out.
    set_ops(delete_n, OpKind::kDelete);
    if (r.spread_mixed) {
      select_spread_keys<<<kGrid, kBlock>>>(batch.keys.p, hit_keys.p, mixed_n, delete_n, fill, r.kw);
    } else {
      set_keys(hit_keys, mixed_n, delete_n);
    }
    const std::uint64_t cleanups_before = table.stats().cleanups;
    best_delete = std::min(best_delete, timed(table, delete_n, OpStatus::kOk, "delete"));
    delete_cleanups = table.stats().cleanups - cleanups_before;
  }
  char extra[160];
  std::snprintf(extra, sizeof extra, "bytes_per_pair=%.1f passes=%llu", bytes_per_pair, static_cast<unsigned long long>(passes));
  print_result("insert", name, r.load, fill, best_insert, extra);
  print_result("find_hit", name, r.load, fill, best_hit, "");
  print_result("find_miss", name, r.load, fill, best_miss, "");
  print_result("overwrite", name, r.load, fill, best_overwrite, "");
  std::snprintf(extra, sizeof extra, "cleanups=%llu", static_cast<unsigned long long>(delete_cleanups));
  print_result("delete", name, r.load, delete_n, best_delete, extra);
  // The mixed batch against the same ops in pure batches: the time its shares of GET hits, overwrites, new
  // keys and deletes take there (time-weighted), over the time it took.
  const double pure_ms = static_cast<double>(mixed_n) * (0.50 * best_hit / fill + 0.40 * best_overwrite / fill +
                                                         0.05 * best_insert / fill + 0.05 * best_delete / delete_n);
  const double avg_rate = 0.5 * (fill / best_insert + fill / best_hit);
  const std::string order = r.mixed_order == "scrambled" ? "" : " mixed_order=" + r.mixed_order;
  std::snprintf(extra, sizeof extra, "efficiency_vs_pure=%.2f efficiency_vs_avg_insert_find=%.2f mixed_keys=%s%s",
                pure_ms / best_mixed, (mixed_n / best_mixed) / avg_rate, r.spread_mixed ? "spread" : "first",
                order.c_str());
  print_result("mixed", name, r.load, mixed_n, best_mixed, extra);
}

// Fills `table` with keys 0..count-1 of key space 5 (PUTs in one call); every op must end kOk. The batch's
// columns are freed on return, so that the clean-ups that follow find memory for the keys they displace.
void fill_with_keys(Table& table, const TableRun& r, std::uint64_t count, const char* what) {
  const std::uint32_t stride = value_stride(r.vw);
  Batch fill(count, r.kw, stride);
  make_keys<<<kGrid, kBlock>>>(fill.keys.p, fill.key_lens.p, count, r.kw, 0, 5);
  make_values<<<kGrid, kBlock>>>(fill.values.p, fill.value_lens.p, count, r.vw, stride, 11);
  fill_ops<<<kGrid, kBlock>>>(fill.ops.p, count, static_cast<std::uint8_t>(OpKind::kPut));
  CHECK(cudaDeviceSynchronize());
  table.execute_on_device(fill.in(count), fill.out());
  expect_status(fill, count, OpStatus::kOk, what);
}

// Churn on a full tier: the table is filled to max_items, then every round deletes the `share` of its
// keys written longest ago, writes as many new keys, and looks up as many absent keys. Deletes leave
// tombstones; the keys written after them take EMPTY slots (or reuse a tombstone on their walk), so the
// EMPTY headroom of the tier shrinks until a clean-up runs (once tombstones take the cleanup_headroom share
// of it, or reach the tombstone share of the tier). Lookups of absent keys end only at an EMPTY ticket:
// they show what a crowded tier costs. Every round is timed whole; rounds in which a clean-up ran are set
// against those in which none did, so the line gives the churn rate with and without clean-ups and what
// one clean-up costs.
void bench_churn(const TableRun& r, double max_load, double headroom_share, double share, int rounds) {
  const std::uint32_t stride = value_stride(r.vw);
  TableConfig config = table_config(r);
  config.capacity = r.n;
  config.max_load_factor = max_load;
  config.cleanup_headroom = headroom_share;
  Table table(config);
  const TableStats s0 = table.stats();
  const std::uint64_t full = s0.device.max_items;
  const std::uint64_t d = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(share * static_cast<double>(full)));
  fill_with_keys(table, r, full, "churn fill");

  Batch batch(d, r.kw, stride);
  make_values<<<kGrid, kBlock>>>(batch.values.p, batch.value_lens.p, d, r.vw, stride, 13);
  Timer timer;
  // One batch of d ops of one kind on keys first..first+d of a key space, timed; every op must get `want`.
  const auto timed = [&](OpKind kind, std::uint64_t first, std::uint64_t space, OpStatus want, const char* what) {
    make_keys<<<kGrid, kBlock>>>(batch.keys.p, batch.key_lens.p, d, r.kw, first, space);
    fill_ops<<<kGrid, kBlock>>>(batch.ops.p, d, static_cast<std::uint8_t>(kind));
    CHECK(cudaDeviceSynchronize());
    timer.start();
    table.execute_on_device(batch.in(d), batch.out());
    const double ms = timer.stop_ms();
    expect_status(batch, d, want, what);
    return ms;
  };
  double ms_clean = 0, ms_plain = 0;
  int rounds_clean = 0;
  std::uint64_t oldest = 0, cleanups = 0;
  for (int round = 0; round < rounds; ++round) {
    const std::uint64_t before = table.stats().cleanups;
    // The d keys written longest ago go (key space 5), d new ones come after the newest, and d keys never
    // written (key space 6) are looked up.
    // (Statements, not one sum: the operands of + run in no fixed order.)
    double ms = timed(OpKind::kDelete, oldest, 5, OpStatus::kOk, "churn delete");
    ms += timed(OpKind::kPut, oldest + full, 5, OpStatus::kOk, "churn put");
    ms += timed(OpKind::kGet, round * d, 6, OpStatus::kNotFound, "churn get miss");
    oldest += d;
    const std::uint64_t ran = table.stats().cleanups - before;
    cleanups += ran;
    if (ran != 0) {
      ms_clean += ms;
      rounds_clean += 1;
    } else {
      ms_plain += ms;
    }
  }
  const TableStats s = table.stats();
  const int rounds_plain = rounds - rounds_clean;
  // Without a round free of clean-ups there is nothing to set them against: nan, not a made-up figure.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double plain_round = rounds_plain != 0 ? ms_plain / rounds_plain : nan;
  const double per_cleanup = cleanups != 0 ? (ms_clean - rounds_clean * plain_round) / static_cast<double>(cleanups) : 0.0;
  char extra[400];
  std::snprintf(extra, sizeof extra,
                "max_load=%.2f cleanup_headroom=%.2f share=%.3f rounds=%d cleanups=%llu cleanups_skipped=%llu rounds_plain=%d plain_gops=%.3f "
                "cleanup_ms=%.3f tombstones_end=%llu items_end=%llu",
                max_load, headroom_share, share, rounds, static_cast<unsigned long long>(cleanups),
                static_cast<unsigned long long>(s.cleanups_skipped - s0.cleanups_skipped), rounds_plain,
                rounds_plain != 0 ? 3.0 * d * rounds_plain / ms_plain / 1e6 : nan, per_cleanup,
                static_cast<unsigned long long>(s.device.tombstones), static_cast<unsigned long long>(s.device.items));
  print_result("churn", describe(r), static_cast<double>(full) / static_cast<double>(s0.device.capacity), 3 * d * rounds,
               ms_clean + ms_plain, extra);
}

// One batch of bench_steady_mixed: d ops (a multiple of 20) on the live keys oldest..oldest+live-1 of key space
// 5. Op i: where i % 20 is 0, a DELETE of key oldest + i / 20 (the keys written longest ago); where 1, a PUT of
// the new key oldest + live + i / 20; else a GET (50 of every 90) or a PUT over a live key past the deleted
// ones, taken in turn from `turn * d` on, so that no key appears twice and the batch has no same-key ops.
__global__ void make_mixed_round(std::uint8_t* ops, std::uint8_t* keys, std::uint8_t* key_lens, std::uint64_t d,
                                 std::uint32_t kw, std::uint64_t oldest, std::uint64_t live, std::uint64_t turn) {
  const std::uint64_t churned = d / 20;
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < d; i += std::uint64_t{gridDim.x} * blockDim.x) {
    std::uint64_t index;
    if (i % 20 == 0) {
      ops[i] = static_cast<std::uint8_t>(OpKind::kDelete);
      index = oldest + i / 20;
    } else if (i % 20 == 1) {
      ops[i] = static_cast<std::uint8_t>(OpKind::kPut);
      index = oldest + live + i / 20;
    } else {
      ops[i] = static_cast<std::uint8_t>(dscramble(i ^ (turn << 32)) % 90 < 50 ? OpKind::kGet : OpKind::kPut);
      index = oldest + churned + (turn * d + i) % (live - churned);
    }
    write_key(keys + i * kw, kw, 5, index);
    key_lens[i] = static_cast<std::uint8_t>(kw);
  }
}

// d GETs of keys taken at random from first..first+span-1 of key space `space`: a batch that times the walks
// of a steady state's hits (its live keys) or misses (a space never written), changing nothing.
__global__ void make_probe_round(std::uint8_t* ops, std::uint8_t* keys, std::uint8_t* key_lens, std::uint64_t d,
                                 std::uint32_t kw, std::uint64_t space, std::uint64_t first, std::uint64_t span,
                                 std::uint64_t salt) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < d; i += std::uint64_t{gridDim.x} * blockDim.x) {
    ops[i] = static_cast<std::uint8_t>(OpKind::kGet);
    write_key(keys + i * kw, kw, space, first + dscramble(i ^ (salt << 32)) % span);
    key_lens[i] = static_cast<std::uint8_t>(kw);
  }
}

// Mixed batches in a steady state: the table filled with n keys at the run's load, then `rounds` batches of
// max_batch ops (one pass each), 50% GETs and 40% overwrites of live keys, 5% deletes of the keys written
// longest ago and 5% new keys, so that the live keys stay n (make_mixed_round). Unlike bench_table's one mixed
// batch, this includes what a long mixed workload's tombstones cost: the walks of new keys they lengthen, and
// the clean-ups that remove the tombstones new keys have not reused. Every op must end kOk. `probe_every` > 0:
// before every probe_every-th batch, a batch of GETs of live keys and one of absent keys, timed apart and
// printed as STEADY_PROBE lines: how the walks of hits and of misses (as long as a new key's) change between
// clean-ups.
void bench_steady_mixed(const TableRun& r, int rounds, double cleanup_tombstones, int probe_every) {
  const std::uint32_t stride = value_stride(r.vw);
  // The default maximum load (TableConfig), where bench_table's 1.0 lets a batch of new keys fill the table: a
  // tier at max_items keeps its headroom EMPTY, and its tombstones are cleaned once they take their share of
  // it (cleanup_headroom); at 1.0 there is no headroom, and a walk may meet no EMPTY ticket for long.
  TableConfig config = table_config(r);
  config.max_load_factor = TableConfig{}.max_load_factor;
  config.cleanup_tombstones = cleanup_tombstones;
  if (r.load >= config.max_load_factor) {
    std::printf("SKIPPED steady_mixed at load %.2f: not below the maximum load %.2f\n", r.load, config.max_load_factor);
    return;
  }
  Table table(config);
  const std::uint64_t live = r.n;
  fill_with_keys(table, r, live, "steady fill");
  const std::uint64_t d = r.max_batch / 20 * 20;
  Batch batch(d, r.kw, stride);
  make_values<<<kGrid, kBlock>>>(batch.values.p, batch.value_lens.p, d, r.vw, stride, 13);
  const TableStats s0 = table.stats();
  Timer timer;
  double ms = 0;
  std::uint64_t oldest = 0;
  for (int round = 0; round < rounds; ++round) {
    if (probe_every > 0 && round % probe_every == 0) {
      double probe_ms[2];
      for (int miss = 0; miss < 2; ++miss) {
        make_probe_round<<<kGrid, kBlock>>>(batch.ops.p, batch.keys.p, batch.key_lens.p, d, r.kw, miss != 0 ? 6 : 5,
                                            miss != 0 ? 0 : oldest, live, static_cast<std::uint64_t>(round));
        CHECK(cudaDeviceSynchronize());
        timer.start();
        table.execute_on_device(batch.in(d), batch.out());
        probe_ms[miss] = timer.stop_ms();
        expect_status(batch, d, miss != 0 ? OpStatus::kNotFound : OpStatus::kOk, "steady probe");
      }
      const TableStats now = table.stats();
      std::printf("STEADY_PROBE layout=%s load=%.3f cleanup_tombstones=%.3f round=%d hit_gops=%.3f miss_gops=%.3f "
                  "cleanups=%llu tombstones=%llu\n",
                  to_string(r.layout), r.load, cleanup_tombstones, round, d / probe_ms[0] / 1e6, d / probe_ms[1] / 1e6,
                  static_cast<unsigned long long>(now.cleanups - s0.cleanups),
                  static_cast<unsigned long long>(now.device.tombstones));
    }
    make_mixed_round<<<kGrid, kBlock>>>(batch.ops.p, batch.keys.p, batch.key_lens.p, d, r.kw, oldest, live,
                                        static_cast<std::uint64_t>(round));
    CHECK(cudaDeviceSynchronize());
    timer.start();
    table.execute_on_device(batch.in(d), batch.out());
    ms += timer.stop_ms();
    expect_status(batch, d, OpStatus::kOk, "steady mixed");
    oldest += d / 20;
  }
  const TableStats s = table.stats();
  char extra[200];
  std::snprintf(extra, sizeof extra, "rounds=%d cleanup_tombstones=%.3f cleanups=%llu tombstones_end=%llu items_end=%llu",
                rounds, cleanup_tombstones,
                static_cast<unsigned long long>(s.cleanups - s0.cleanups), static_cast<unsigned long long>(s.device.tombstones),
                static_cast<unsigned long long>(s.device.items));
  print_result("steady_mixed", describe(r), r.load, d * static_cast<std::uint64_t>(rounds), ms, extra);
}

// ---- Baselines measured in the same run ----

__global__ void gather_kernel(const std::uint64_t* data, std::uint64_t words, std::uint64_t n, std::uint64_t* out) {
  std::uint64_t acc = 0;
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < n; i += std::uint64_t{gridDim.x} * blockDim.x) {
    acc ^= data[dscramble(i) % words];
  }
  if (acc == 42) out[0] = acc;  // keeps the loads alive
}

void bench_hardware() {
  const std::uint64_t bytes = std::uint64_t{2} << 30;
  DeviceArray<std::uint8_t> a(bytes), b(bytes);
  CHECK(cudaMemset(a.p, 1, bytes));
  Timer timer;
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    timer.start();
    CHECK(cudaMemcpy(b.p, a.p, bytes, cudaMemcpyDeviceToDevice));
    best = std::min(best, timer.stop_ms());
  }
  std::printf("RESULT %-14s bytes=%llu ms=%.3f gbps_read_plus_write=%.1f\n", "hw_d2d_copy",
              static_cast<unsigned long long>(bytes), best, 2.0 * bytes / best / 1e6);
  const std::uint64_t words = bytes / 8, n = std::uint64_t{1} << 28;
  DeviceArray<std::uint64_t> out(1);
  best = 1e30;
  for (int i = 0; i < 3; ++i) {
    timer.start();
    gather_kernel<<<4096, 256>>>(reinterpret_cast<const std::uint64_t*>(a.p), words, n, out.p);
    best = std::min(best, timer.stop_ms());
  }
  CHECK(cudaGetLastError());
  std::printf("RESULT %-14s window_bytes=%llu reads=%llu ms=%.3f greads_per_s=%.2f\n", "hw_random_8B",
              static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(n), best, n / best / 1e6);
  std::fflush(stdout);
}

// A linear-probing table of 16-byte slots {key, value}, thread per key, CAS on the key: the shape of
// cuco::static_map with linear_probing<1>. Empty key = ~0.
constexpr std::uint64_t kEmptyKey = ~std::uint64_t{0};

__global__ void lp_insert(unsigned long long* slots, std::uint64_t cap, const std::uint64_t* keys, std::uint64_t n) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < n; i += std::uint64_t{gridDim.x} * blockDim.x) {
    const std::uint64_t k = keys[i];
    std::uint64_t pos = __umul64hi(dscramble(k), cap);
    for (;;) {
      const unsigned long long old = atomicCAS(&slots[2 * pos], kEmptyKey, k);
      if (old == kEmptyKey || old == k) {
        slots[2 * pos + 1] = k + 1;
        break;
      }
      pos = pos + 1 == cap ? 0 : pos + 1;
    }
  }
}

__global__ void lp_find(const unsigned long long* slots, std::uint64_t cap, const std::uint64_t* keys, std::uint64_t n,
                        std::uint64_t* out) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < n; i += std::uint64_t{gridDim.x} * blockDim.x) {
    const std::uint64_t k = keys[i];
    std::uint64_t pos = __umul64hi(dscramble(k), cap), v = 0;
    for (;;) {
      const ulonglong2 slot = *reinterpret_cast<const ulonglong2*>(&slots[2 * pos]);
      if (slot.x == k) {
        v = slot.y;
        break;
      }
      if (slot.x == kEmptyKey) break;
      pos = pos + 1 == cap ? 0 : pos + 1;
    }
    out[i] = v;
  }
}

void bench_linear_probing(std::uint64_t n, const std::vector<double>& loads, int repeats) {
  DeviceArray<std::uint64_t> keys(n), misses(n), out(n);
  DeviceArray<std::uint8_t> lens(n);
  make_keys<<<kGrid, kBlock>>>(reinterpret_cast<std::uint8_t*>(keys.p), lens.p, n, 8, 0, 1);
  make_keys<<<kGrid, kBlock>>>(reinterpret_cast<std::uint8_t*>(misses.p), lens.p, n, 8, 0, 2);
  CHECK(cudaDeviceSynchronize());
  Timer timer;
  for (double load : loads) {
    const std::uint64_t cap = static_cast<std::uint64_t>(static_cast<double>(n) / load);
    DeviceArray<unsigned long long> slots(2 * cap);
    double ins = 1e30, hit = 1e30, miss = 1e30;
    for (int rep = 0; rep < repeats; ++rep) {
      CHECK(cudaMemset(slots.p, 0xFF, 2 * cap * sizeof(unsigned long long)));
      timer.start();
      lp_insert<<<kGrid * 8, kBlock>>>(slots.p, cap, keys.p, n);
      ins = std::min(ins, timer.stop_ms());
      timer.start();
      lp_find<<<kGrid * 8, kBlock>>>(slots.p, cap, keys.p, n, out.p);
      hit = std::min(hit, timer.stop_ms());
      timer.start();
      lp_find<<<kGrid * 8, kBlock>>>(slots.p, cap, misses.p, n, out.p);
      miss = std::min(miss, timer.stop_ms());
    }
    CHECK(cudaGetLastError());
    print_result("lp_insert", "baseline=linear_probing_cg1 kw=8 vw=8", load, n, ins, "");
    print_result("lp_find_hit", "baseline=linear_probing_cg1 kw=8 vw=8", load, n, hit, "");
    print_result("lp_find_miss", "baseline=linear_probing_cg1 kw=8 vw=8", load, n, miss, "");
  }
}

// The Stash / clStash switch point (Stash section III.C.2, Figure 13): fill an empty table in chunks of 5%
// of its capacity with each lane schedule and time every chunk; clStash pays off from the load at which its
// chunks become faster.
void bench_switch(const TableRun& base, int repeats) {
  const std::uint32_t stride = value_stride(base.vw);
  for (LaneMode lanes : {LaneMode::kStash, LaneMode::kClStash}) {
    TableRun r = base;
    r.lanes = lanes;
    r.load = 1.0;
    const TableConfig config = table_config(r);
    std::uint64_t capacity;
    {
      Table probe(config);
      capacity = probe.stats().device.capacity;
    }
    const std::uint64_t chunk = capacity / 20;
    Batch batch(chunk, r.kw, stride);
    DeviceArray<std::uint8_t> lens(chunk);
    fill_ops<<<kGrid, kBlock>>>(batch.ops.p, chunk, static_cast<std::uint8_t>(OpKind::kPut));
    make_values<<<kGrid, kBlock>>>(batch.values.p, batch.value_lens.p, chunk, r.vw, stride, 3);
    CHECK(cudaDeviceSynchronize());
    std::vector<double> best(19, 1e30);
    Timer timer;
    for (int rep = 0; rep < repeats; ++rep) {
      Table table(config);
      for (int c = 0; c < 19; ++c) {  // up to 95%
        make_keys<<<kGrid, kBlock>>>(batch.keys.p, batch.key_lens.p, chunk, r.kw, c * chunk, 9);
        CHECK(cudaDeviceSynchronize());
        timer.start();
        table.execute_on_device(batch.in(chunk), batch.out());
        best[c] = std::min(best[c], timer.stop_ms());
        expect_status(batch, chunk, OpStatus::kOk, "switch fill");
      }
    }
    for (int c = 0; c < 19; ++c) {
      print_result("switch_insert", describe(r), (c + 1) * 0.05, chunk, best[c], "");
    }
  }
}

Probing parse_probing(const std::string& s) { return s == "single" ? Probing::kSingle : Probing::kGroup; }
std::vector<SlotLayout> parse_layouts(const std::string& s) {
  std::vector<SlotLayout> out;
  for (std::size_t at = 0; at <= s.size();) {
    const std::size_t comma = std::min(s.find(',', at), s.size());
    out.push_back(s.substr(at, comma - at) == "line" ? SlotLayout::kLine : SlotLayout::kBoard);
    at = comma + 1;
  }
  return out;
}
LaneMode parse_lanes(const std::string& s) {
  if (s == "stash") return LaneMode::kStash;
  if (s == "clstash") return LaneMode::kClStash;
  return s == "split" ? LaneMode::kSplit : LaneMode::kAuto;
}

}  // namespace
}  // namespace gpukv::bench

int main(int argc, char** argv) {
  using namespace gpukv::bench;
  const Flags flags(argc, argv);
  if (!gpukv::Table::gpu_available()) {
    std::printf("SKIPPED: no CUDA device; the GPU table benchmark did not run\n");
    return 0;
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("DEVICE %s sms=%d l2_mb=%d mem_gb=%.1f\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20,
              static_cast<double>(prop.totalGlobalMem) / (1 << 30));
  const std::vector<double> loads = flags.doubles("loads", "0.5,0.8,0.9,0.95");
  const std::uint64_t n = flags.u64("n", std::uint64_t{1} << 27);
  const int repeats = static_cast<int>(flags.u64("repeats", 3));
  const std::string parts = flags.str("parts", "hw,lp,table");  // also: switch, churn, steady
  const std::string mixed_order = flags.str("mixed_order", "scrambled");
  if (mixed_order != "scrambled" && mixed_order != "by_kind" && mixed_order != "by_class") {
    std::fprintf(stderr, "--mixed_order must be scrambled, by_kind or by_class, not %s\n", mixed_order.c_str());
    return 2;
  }
  if (parts.find("hw") != std::string::npos) bench_hardware();
  if (parts.find("lp") != std::string::npos) bench_linear_probing(flags.u64("lp_n", n), loads, repeats);
  if (parts.find("switch") != std::string::npos) {
    for (std::uint64_t tickets : flags.u64s("tickets", "8")) {
      TableRun r{static_cast<std::uint32_t>(flags.u64("kw", 8)), static_cast<std::uint32_t>(flags.u64("vw", 8)),
                 static_cast<std::uint32_t>(tickets), parse_probing(flags.str("probing", "group")), gpukv::LaneMode::kAuto,
                 static_cast<std::uint32_t>(flags.u64s("max_batch", "4194304")[0]), 1.0, n, repeats};
      bench_switch(r, repeats);
    }
  }
  if (parts.find("churn") != std::string::npos) {
    TableRun r{static_cast<std::uint32_t>(flags.u64("kw", 8)), static_cast<std::uint32_t>(flags.u64("vw", 8)),
               static_cast<std::uint32_t>(flags.u64s("tickets", "8")[0]), parse_probing(flags.str("probing", "group")),
               parse_lanes(flags.str("lanes", "auto")), static_cast<std::uint32_t>(flags.u64s("max_batch", "4194304")[0]),
               1.0, n, repeats, parse_layouts(flags.str("layouts", "board"))[0]};
    for (double headroom : flags.doubles("churn_headroom", "0.5")) {
      for (double share : flags.doubles("churn_shares", "0.01")) {
        bench_churn(r, flags.doubles("churn_max_load", "0.95")[0], headroom, share, static_cast<int>(flags.u64("churn_rounds", 40)));
      }
    }
  }
  if (parts.find("steady") != std::string::npos) {
    for (double load : loads) {
      for (gpukv::SlotLayout layout : parse_layouts(flags.str("layouts", "board"))) {
        TableRun r{static_cast<std::uint32_t>(flags.u64("kw", 8)), static_cast<std::uint32_t>(flags.u64("vw", 8)),
                   static_cast<std::uint32_t>(flags.u64s("tickets", "8")[0]), parse_probing(flags.str("probing", "group")),
                   parse_lanes(flags.str("lanes", "auto")), static_cast<std::uint32_t>(flags.u64s("max_batch", "4194304")[0]),
                   load, n, repeats, layout};
        for (double share : flags.doubles("cleanup_tombstones", std::to_string(gpukv::TableConfig{}.cleanup_tombstones))) {
          bench_steady_mixed(r, static_cast<int>(flags.u64("steady_rounds", 200)), share,
                             static_cast<int>(flags.u64("steady_probe_every", 0)));
        }
      }
    }
  }
  if (parts.find("table") != std::string::npos) {
    for (std::uint64_t tickets : flags.u64s("tickets", "8")) {
      for (std::uint64_t max_batch : flags.u64s("max_batch", "4194304")) {
        for (double load : loads) {
          for (gpukv::SlotLayout layout : parse_layouts(flags.str("layouts", "board"))) {
            TableRun r{static_cast<std::uint32_t>(flags.u64("kw", 8)), static_cast<std::uint32_t>(flags.u64("vw", 8)),
                       static_cast<std::uint32_t>(tickets), parse_probing(flags.str("probing", "group")),
                       parse_lanes(flags.str("lanes", "auto")), static_cast<std::uint32_t>(max_batch), load, n, repeats,
                       layout, flags.str("mixed_keys", "spread") != "first", flags.u64("slot_word", 0) != 0,
                       mixed_order};
            bench_table(r);
          }
        }
      }
    }
  }
  return 0;
}
