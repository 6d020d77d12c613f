// Stores and reads back keys through the installed table library (README, "Using the table"), on whichever
// backend the machine has: once through gpukv::Batch, once through columns of the program's own. Exits 0
// only if every result is what the table promises.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gpukv/batch.hpp"
#include "gpukv/table.hpp"

int main() {
  gpukv::TableConfig config;
  config.key_width = 16;
  config.value_width = 8;
  config.capacity = 1024;
  gpukv::Table table(config);
  const std::size_t n = 100;

  // An owned batch: set() fills a row, in() and out() are the views execute() takes.
  gpukv::Batch puts(table, n), gets(table, n);
  for (std::size_t i = 0; i < n; ++i) {
    puts.set(i, gpukv::OpKind::kPut, "key " + std::to_string(i), "v" + std::to_string(i));
    gets.set(i, gpukv::OpKind::kGet, "key " + std::to_string(i));
  }
  table.execute(puts.in(0, n), puts.out(0, n));
  table.execute(gets.in(0, n), gets.out(0, n));
  for (std::size_t i = 0; i < n; ++i) {
    if (puts.status(i) != gpukv::OpStatus::kOk) return std::fprintf(stderr, "put %zu failed\n", i), 1;
    if (gets.status(i) != gpukv::OpStatus::kOk || gets.value(i) != "v" + std::to_string(i)) {
      return std::fprintf(stderr, "get %zu: status %s\n", i, to_string(gets.status(i))), 1;
    }
  }

  // Columns of the program's own, 8-byte aligned as the table requires.
  const std::size_t stride = table.value_stride();
  std::vector<std::uint64_t> keys(n * 2), values(n * stride / 8 + 1), out_values(n * stride / 8 + 1);
  std::vector<std::uint8_t> key_lens(n, 16), status(n);
  std::vector<std::uint32_t> value_lens(n, 8), out_value_lens(n);
  for (std::size_t i = 0; i < n; ++i) {
    keys[i * 2] = i;
    keys[i * 2 + 1] = ~i;
    std::memcpy(reinterpret_cast<char*>(values.data()) + i * stride, &i, 8);
  }
  const auto run = [&](gpukv::OpKind kind) {
    std::vector<std::uint8_t> ops(n, static_cast<std::uint8_t>(kind));
    gpukv::BatchIn in{n,
                      ops.data(),
                      reinterpret_cast<const std::uint8_t*>(keys.data()),
                      key_lens.data(),
                      reinterpret_cast<const std::uint8_t*>(values.data()),
                      value_lens.data()};
    gpukv::BatchOut out{status.data(), reinterpret_cast<std::uint8_t*>(out_values.data()), out_value_lens.data()};
    table.execute(in, out);
  };
  run(gpukv::OpKind::kPut);
  for (std::size_t i = 0; i < n; ++i) {
    if (status[i] != static_cast<std::uint8_t>(gpukv::OpStatus::kOk)) return std::fprintf(stderr, "put %zu failed\n", i), 1;
  }
  run(gpukv::OpKind::kGet);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t got = 0;
    std::memcpy(&got, reinterpret_cast<const char*>(out_values.data()) + i * stride, 8);
    if (status[i] != static_cast<std::uint8_t>(gpukv::OpStatus::kOk) || out_value_lens[i] != 8 || got != i) {
      return std::fprintf(stderr, "get %zu: status %d, length %u, value %llu\n", i, status[i], out_value_lens[i],
                          static_cast<unsigned long long>(got)),
             1;
    }
  }
  std::printf("gpukv package: %zu keys stored and read back twice on the %s backend\n", 2 * n, to_string(table.backend()));
  return 0;
}
