// What one table operation's memory accesses cost on this GPU, apart from any table: the physical budget a
// slot layout is designed against (issue 17). Each pattern is one thread (or one tile) per operation, as a
// lookup or insert runs: read the op's key from a coalesced column, hash it to a random 128-byte line of a
// window far larger than L2, make the accesses the pattern names, write one coalesced answer word.
//
//   sector          read 8 B of the line                                    (a miss that ends at one ticket word)
//   two_lines       read 8 B, then 8 B of another random line, dependent    (a hit today: ticket word, then slot)
//   same_line_<o>   read 8 B at offset 0, then 8 B at offset o, dependent   (a hit with tickets and slots in one line)
//   same_line_96_pf same_line_96 whose first read fetches the whole line into L2 (ld .L2::128B)
//   line_thread     one thread reads the whole line, 8 x 16 B at once
//   line_tile8      8 threads read the line, 16 B each, one op per tile
//   cas_far         read 8 B, CAS it, store 32 B to another random line     (an insert today, before its publish)
//   cas_same_<o>    read 8 B, CAS it, store 32 B at offset o of the line    (an insert with tickets and slots in one line)
//   xor_random      an atomic XOR on 8 B of a random line                   (today's pass-end publish of a new slot)
//   pub_far         cas_far, then an atomic XOR with release on the CAS'd word (a board insert with its publish)
//   pub_same_8      read 8 B, CAS it, store 24 B at offset 8 of the line, then the release XOR on the word
//                   (a line insert into its unit's first slot, publish included)
//   pub_same_8_rlx  pub_same_8 with a relaxed XOR (what the release costs)
//   pub_same_56     pub_same_8 into the bytes 56-79 (a slot that covers parts of two sectors the read did not
//                   bring into L2)
//   pub_same_56_pf  pub_same_56 whose read fetches the whole line into L2 (ld .L2::128B)
//
// Dependent means the second address is computed from the first load's value (always zero here), so the
// second access cannot issue before the first returns, as in a real probe.
//
//   access_paths_bench_gpu [--window_gb=4] [--ops=134217728] [--repeats=3]
#include <cuda/atomic>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "gpu_bench_common.cuh"

namespace gpukv::bench {
namespace {

constexpr std::uint64_t kLineWords = 16;  // 128 B

__device__ __forceinline__ std::uint64_t line_of(std::uint64_t key, std::uint64_t lines) {
  return __umul64hi(dscramble(key), lines);
}

enum class Pattern {
  kSector, kTwoLines, kSameLine, kSameLineFetched, kLineThread, kCasFar, kCasSame, kXorRandom,
  kPubFar, kPubSame, kPubSameRelaxed, kPubSameLine
};

template <Pattern P>
__global__ void access_kernel(std::uint64_t* data, std::uint64_t lines, const std::uint64_t* keys, std::uint64_t n,
                              std::uint32_t offset_words, std::uint64_t* out) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < n; i += std::uint64_t{gridDim.x} * blockDim.x) {
    const std::uint64_t key = keys[i];
    std::uint64_t* line = data + line_of(key, lines) * kLineWords;
    std::uint64_t v = 0;
    if constexpr (P == Pattern::kSector) {
      v = line[0];
    } else if constexpr (P == Pattern::kTwoLines) {
      const std::uint64_t t = line[0];
      v = data[line_of(key ^ 0x5bd1e995 ^ t, lines) * kLineWords + 1];
    } else if constexpr (P == Pattern::kSameLine || P == Pattern::kSameLineFetched) {
      std::uint64_t t;
      if constexpr (P == Pattern::kSameLineFetched) {
        asm volatile("ld.relaxed.gpu.global.L2::128B.u64 %0, [%1];" : "=l"(t) : "l"(line) : "memory");
      } else {
        t = line[0];
      }
      v = line[offset_words + (t & 1)];
    } else if constexpr (P == Pattern::kLineThread) {
      const auto* l = reinterpret_cast<const ulonglong2*>(line);
      ulonglong2 w[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) w[j] = l[j];
#pragma unroll
      for (int j = 0; j < 8; ++j) v ^= w[j].x ^ w[j].y;
    } else if constexpr (P == Pattern::kCasFar || P == Pattern::kCasSame) {
      const std::uint64_t t = line[0];
      v = atomicCAS(reinterpret_cast<unsigned long long*>(line), t, t + 1);
      std::uint64_t* slot = P == Pattern::kCasFar ? data + line_of(key ^ 0x5bd1e995, lines) * kLineWords + 4
                                                  : line + offset_words;
      auto* s = reinterpret_cast<ulonglong2*>(slot);
      s[0] = make_ulonglong2(key, key + 1);
      s[1] = make_ulonglong2(0, 0);
    } else if constexpr (P == Pattern::kXorRandom) {
      atomicXor(reinterpret_cast<unsigned long long*>(line), 1ULL);
    } else if constexpr (P == Pattern::kPubFar || P == Pattern::kPubSame || P == Pattern::kPubSameRelaxed ||
                         P == Pattern::kPubSameLine) {
      std::uint64_t t;
      if constexpr (P == Pattern::kPubSameLine) {
        asm volatile("ld.relaxed.gpu.global.L2::128B.u64 %0, [%1];" : "=l"(t) : "l"(line) : "memory");
      } else {
        t = line[0];
      }
      v = atomicCAS(reinterpret_cast<unsigned long long*>(line), t, t + 1);
      if constexpr (P == Pattern::kPubFar) {
        auto* s = reinterpret_cast<ulonglong2*>(data + line_of(key ^ 0x5bd1e995, lines) * kLineWords + 4);
        s[0] = make_ulonglong2(key, key + 1);
        s[1] = make_ulonglong2(0, 0);
      } else {
        // A slot's header, key and value: 24 bytes from word offset_words (1 or 7), the last 16 aligned.
        line[offset_words] = key;
        reinterpret_cast<ulonglong2*>(line + offset_words + 1)[0] = make_ulonglong2(key + 1, key + 2);
      }
      cuda::atomic_ref<std::uint64_t, cuda::thread_scope_device> word(line[0]);
      word.fetch_xor(2, P == Pattern::kPubSameRelaxed ? cuda::memory_order_relaxed : cuda::memory_order_release);
    }
    out[i] = v;
  }
}

// One op per tile of 8 lanes: lane r reads bytes [16r, 16r + 16) of the op's line.
__global__ void line_tile8_kernel(const std::uint64_t* data, std::uint64_t lines, const std::uint64_t* keys, std::uint64_t n,
                                  std::uint64_t* out) {
  const unsigned rank = threadIdx.x & 7;
  for (std::uint64_t t = (blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x) / 8; t < n;
       t += std::uint64_t{gridDim.x} * blockDim.x / 8) {
    const std::uint64_t key = keys[t];
    const auto* line = reinterpret_cast<const ulonglong2*>(data + line_of(key, lines) * kLineWords);
    const ulonglong2 w = line[rank];
    std::uint64_t v = w.x ^ w.y;
    for (int o = 4; o > 0; o /= 2) v ^= __shfl_xor_sync(0xFFFFFFFFu, v, o, 8);
    if (rank == 0) out[t] = v;
  }
}

template <class Launch>
double best_ms(int repeats, const Launch& launch) {
  Timer timer;
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    timer.start();
    launch();
    best = std::min(best, timer.stop_ms());
  }
  CHECK(cudaGetLastError());
  return best;
}

void report(const char* name, std::uint64_t window, std::uint64_t ops, double ms) {
  std::printf("RESULT %-14s window_bytes=%llu ops=%llu ms=%.3f gops=%.2f\n", name, static_cast<unsigned long long>(window),
              static_cast<unsigned long long>(ops), ms, static_cast<double>(ops) / ms / 1e6);
  std::fflush(stdout);
}

}  // namespace
}  // namespace gpukv::bench

int main(int argc, char** argv) {
  using namespace gpukv::bench;
  const Flags flags(argc, argv);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device; the access-path benchmark did not run\n");
    return 0;
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("DEVICE %s sms=%d l2_mb=%d mem_gb=%.1f\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20,
              static_cast<double>(prop.totalGlobalMem) / (1 << 30));
  const std::uint64_t window = static_cast<std::uint64_t>(flags.u64("window_gb", 4)) << 30;
  const std::uint64_t n = flags.u64("ops", std::uint64_t{1} << 27);
  const int repeats = static_cast<int>(flags.u64("repeats", 3));
  const std::uint64_t lines = window / 128;

  DeviceArray<std::uint64_t> data(window / 8), keys(n), out(n);
  CHECK(cudaMemset(data.p, 0, window));
  DeviceArray<std::uint8_t> lens(n);
  make_keys<<<kGrid, kBlock>>>(reinterpret_cast<std::uint8_t*>(keys.p), lens.p, n, 8, 0, 1);
  CHECK(cudaDeviceSynchronize());

  int per_sm = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, access_kernel<Pattern::kTwoLines>, kBlock, 0));
  const int grid = per_sm * prop.multiProcessorCount;
  const auto run = [&](const char* name, auto kernel, std::uint32_t offset_words) {
    report(name, window, n, best_ms(repeats, [&] { kernel<<<grid, kBlock>>>(data.p, lines, keys.p, n, offset_words, out.p); }));
  };
  run("sector", access_kernel<Pattern::kSector>, 0);
  run("two_lines", access_kernel<Pattern::kTwoLines>, 0);
  run("same_line_8", access_kernel<Pattern::kSameLine>, 1);
  run("same_line_32", access_kernel<Pattern::kSameLine>, 4);
  run("same_line_64", access_kernel<Pattern::kSameLine>, 8);
  run("same_line_96", access_kernel<Pattern::kSameLine>, 12);
  run("same_line_96_pf", access_kernel<Pattern::kSameLineFetched>, 12);
  run("line_thread", access_kernel<Pattern::kLineThread>, 0);
  report("line_tile8", window, n, best_ms(repeats, [&] { line_tile8_kernel<<<grid, kBlock>>>(data.p, lines, keys.p, n, out.p); }));
  run("cas_far", access_kernel<Pattern::kCasFar>, 0);
  run("cas_same_32", access_kernel<Pattern::kCasSame>, 4);
  run("cas_same_64", access_kernel<Pattern::kCasSame>, 8);
  run("cas_same_96", access_kernel<Pattern::kCasSame>, 12);
  run("xor_random", access_kernel<Pattern::kXorRandom>, 0);
  run("pub_far", access_kernel<Pattern::kPubFar>, 0);
  run("pub_same_8", access_kernel<Pattern::kPubSame>, 1);
  run("pub_same_8_rlx", access_kernel<Pattern::kPubSameRelaxed>, 1);
  run("pub_same_56", access_kernel<Pattern::kPubSame>, 7);
  run("pub_same_56_pf", access_kernel<Pattern::kPubSameLine>, 7);
  return 0;
}
