// Shared by the GPU benchmark programs: CUDA checks, device arrays, key/value generators, a CUDA-event
// timer, batch columns in GPU memory, result checks and RESULT lines.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench_common.hpp"
#include "gpukv/table.hpp"

namespace gpukv::bench {

#define CHECK(call)                                                                                     \
  do {                                                                                                  \
    cudaError_t e_ = (call);                                                                            \
    if (e_ != cudaSuccess) {                                                                            \
      std::fprintf(stderr, "%s failed at %s:%d: %s\n", #call, __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                                     \
    }                                                                                                   \
  } while (0)

template <class T>
struct DeviceArray {
  T* p = nullptr;
  std::uint64_t n = 0;
  explicit DeviceArray(std::uint64_t count) : n(count) { CHECK(cudaMalloc(&p, std::max<std::uint64_t>(1, count) * sizeof(T))); }
  ~DeviceArray() { cudaFree(p); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
};

__host__ __device__ inline std::uint64_t dscramble(std::uint64_t x) { return scramble(x); }

// Key `index` of a key space, written at `key`: full-width keys whose first word is a bijection of (space,
// index), so keys are unique.
__device__ inline void write_key(std::uint8_t* key, std::uint32_t kw, std::uint64_t space, std::uint64_t index) {
  auto* w = reinterpret_cast<std::uint64_t*>(key);
  const std::uint64_t id = (space << 40) | index;
  w[0] = dscramble(id);
  for (std::uint32_t j = 1; j < kw / 8; ++j) w[j] = dscramble(id ^ (0x1234567ULL * j));
}

// Keys first..first+n-1 of a key space (write_key).
__global__ void make_keys(std::uint8_t* keys, std::uint8_t* key_lens, std::uint64_t n, std::uint32_t kw,
                          std::uint64_t first, std::uint64_t space) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < n; i += std::uint64_t{gridDim.x} * blockDim.x) {
    write_key(keys + i * kw, kw, space, first + i);
    key_lens[i] = static_cast<std::uint8_t>(kw);
  }
}

__global__ void make_values(std::uint8_t* values, std::uint32_t* value_lens, std::uint64_t n, std::uint32_t vw,
                            std::uint32_t stride, std::uint64_t salt) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < n; i += std::uint64_t{gridDim.x} * blockDim.x) {
    auto* w = reinterpret_cast<std::uint64_t*>(values + i * stride);
    for (std::uint32_t j = 0; j < stride / 8; ++j) w[j] = dscramble(i * 131 + j + salt);
    value_lens[i] = vw;
  }
}

__global__ void fill_ops(std::uint8_t* ops, std::uint64_t n, std::uint8_t op) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < n; i += std::uint64_t{gridDim.x} * blockDim.x) ops[i] = op;
}

// Which of `count` inserted keys the i-th key of a spread selection is: (i * kSpreadStride) mod count, a
// bijection of [0, count) for any count below the stride (a prime), so that a selection of the first m
// indices takes m distinct keys from every age of the fill rather than the m inserted first.
constexpr std::uint64_t kSpreadStride = 2654435761u;
__host__ __device__ inline std::uint64_t spread_index(std::uint64_t i, std::uint64_t count) {
  return i * kSpreadStride % count;
}

// The mixed batch: op i works on key i of the inserted set (or, where `spread_over` is not 0, key
// spread_index(i, spread_over) of it), except the 5% of PUTs of new keys, which take key i of the miss set. So
// every key appears once and the batch holds no same-key conflicts. Kinds are scrambled over the batch; where
// `kind_runs` is not 0, they are sorted instead within each run of that many ops (a diagnostic: a pass whose
// ops come grouped by kind, in the same shares), or with `by_class`, only the ops a mixed pass's two split
// kernels run (GETs and deletes, then PUTs), each class's kinds scrambled within it.
__host__ __device__ inline std::uint32_t mixed_share(std::uint64_t i, std::uint64_t kind_runs, bool by_class) {
  const auto scrambled = [i](std::uint32_t of) { return static_cast<std::uint32_t>(dscramble(i ^ 0xABCDEF) % of); };
  if (kind_runs == 0) return scrambled(100);
  const auto sorted = static_cast<std::uint32_t>(i % kind_runs * 100 / kind_runs);
  if (!by_class) return sorted;
  if (sorted < 55) {
    const std::uint32_t s = scrambled(55);  // GETs 0..49, deletes 95..99
    return s < 50 ? s : 45 + s;
  }
  const std::uint32_t s = scrambled(45);  // overwrites 50..89, new keys 90..94
  return 50 + s;
}
__global__ void make_mixed(std::uint8_t* ops, std::uint8_t* keys, const std::uint8_t* hit_keys,
                           const std::uint8_t* miss_keys, std::uint64_t n, std::uint32_t kw, std::uint64_t spread_over = 0,
                           std::uint64_t kind_runs = 0, bool by_class = false) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < n; i += std::uint64_t{gridDim.x} * blockDim.x) {
    const std::uint32_t r = mixed_share(i, kind_runs, by_class);
    const bool new_key = r >= 90 && r < 95;
    ops[i] = r < 50 ? 0 : r < 95 ? 1 : 3;  // GET, PUT, DELETE
    const std::uint64_t k = new_key || spread_over == 0 ? i : spread_index(i, spread_over);
    const auto* src = reinterpret_cast<const std::uint64_t*>((new_key ? miss_keys : hit_keys) + k * kw);
    auto* dst = reinterpret_cast<std::uint64_t*>(keys + i * kw);
    for (std::uint32_t j = 0; j < kw / 8; ++j) dst[j] = src[j];
  }
}

__global__ void count_status(const std::uint8_t* status, std::uint64_t n, unsigned long long* counts) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < n; i += std::uint64_t{gridDim.x} * blockDim.x) {
    atomicAdd(&counts[status[i] < 5 ? status[i] : 5], 1ULL);
  }
}

inline constexpr int kGrid = 1024, kBlock = 256;

class Timer {
 public:
  Timer() {
    CHECK(cudaEventCreate(&start_));
    CHECK(cudaEventCreate(&stop_));
  }
  ~Timer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  void start() { CHECK(cudaEventRecord(start_, 0)); }
  double stop_ms() {
    CHECK(cudaEventRecord(stop_, 0));
    CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms;
  }

 private:
  cudaEvent_t start_, stop_;
};

inline void print_result(const char* workload, const std::string& config, double load, std::uint64_t ops, double ms,
                  const std::string& extra) {
  std::printf("RESULT %-14s %s load=%.3f ops=%llu ms=%.3f gops=%.3f%s%s\n", workload, config.c_str(), load,
              static_cast<unsigned long long>(ops), ms, static_cast<double>(ops) / ms / 1e6, extra.empty() ? "" : " ",
              extra.c_str());
  std::fflush(stdout);
}

// Device columns for a batch of n ops; `words`: slot word columns too (TableConfig::slot_word), every write's
// word 0x1111111111111111.
struct Batch {
  DeviceArray<std::uint8_t> ops, keys, key_lens, values, status, out_values;
  DeviceArray<std::uint32_t> value_lens, out_value_lens;
  DeviceArray<std::uint64_t> slot_words, out_slot_words;  // n words each, or none (n == 0)
  Batch(std::uint64_t n, std::uint32_t kw, std::uint32_t stride, bool words = false)
      : ops(n), keys(n * kw), key_lens(n), values(n * stride), status(n), out_values(n * stride), value_lens(n),
        out_value_lens(n), slot_words(words ? n : 0), out_slot_words(words ? n : 0) {
    if (words) CHECK(cudaMemset(slot_words.p, 0x11, n * sizeof(std::uint64_t)));
  }
  bool words() const { return slot_words.n != 0; }
  BatchIn in(std::uint64_t n) const {
    return BatchIn{n, ops.p, keys.p, key_lens.p, values.p, value_lens.p, words() ? slot_words.p : nullptr};
  }
  BatchOut out() const { return BatchOut{status.p, out_values.p, out_value_lens.p, words() ? out_slot_words.p : nullptr}; }
};

// Checks that every op of the batch got the expected status (a benchmark that fails silently measures nothing).
inline void expect_status(const Batch& b, std::uint64_t n, OpStatus want, const char* what) {
  DeviceArray<unsigned long long> counts(6);
  CHECK(cudaMemset(counts.p, 0, 6 * sizeof(unsigned long long)));
  count_status<<<kGrid, kBlock>>>(b.status.p, n, counts.p);
  unsigned long long h[6];
  CHECK(cudaMemcpy(h, counts.p, sizeof(h), cudaMemcpyDeviceToHost));
  if (h[static_cast<int>(want)] != n) {
    std::fprintf(stderr, "%s: expected %llu x %s, got ok=%llu notfound=%llu exists=%llu full=%llu invalid=%llu\n", what,
                 static_cast<unsigned long long>(n), to_string(want), h[0], h[1], h[2], h[3], h[4]);
    std::exit(1);
  }
}


}  // namespace gpukv::bench
