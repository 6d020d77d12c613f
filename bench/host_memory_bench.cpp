// The CPU backend's physical limit: random 8-byte reads of host memory, the access a lookup makes to its
// ticket word and to its slot. Independent reads (each address known ahead, optionally prefetched a few reads
// ahead, as the CPU backend prefetches its ops) show what the memory system sustains with many misses in
// flight; a dependent chain (each address read from the last) shows one miss's latency. The region is
// mmap'd with MADV_HUGEPAGE, as the table's board and slots are.
//
//   host_memory_bench --mb=1,16,128,1024 --prefetch=0,8,16
#include <sys/mman.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>

#include "bench_common.hpp"

namespace gpukv::bench {
namespace {

using Clock = std::chrono::steady_clock;

std::uint64_t xorshift(std::uint64_t& x) {
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return x;
}

void bench_region(std::uint64_t mb, const std::vector<double>& distances) {
  const std::size_t bytes = static_cast<std::size_t>(mb) << 20;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::fprintf(stderr, "cannot map %llu MB\n", static_cast<unsigned long long>(mb));
    std::exit(1);
  }
  madvise(p, bytes, MADV_HUGEPAGE);
  auto* a = static_cast<std::uint64_t*>(p);
  const std::size_t n = bytes / 8;
  std::uint64_t x = 0x9E3779B97F4A7C15ull;
  // Each word holds the index of the next in one cycle through every word (Sattolo's shuffle), so that the
  // dependent chain below visits the whole region instead of falling into a short cycle that stays cached.
  for (std::size_t i = 0; i < n; ++i) a[i] = i;
  for (std::size_t i = n - 1; i > 0; --i) std::swap(a[i], a[xorshift(x) % i]);
  constexpr std::size_t kReads = std::size_t{1} << 22;
  std::vector<std::uint64_t> index(kReads);
  for (auto& v : index) v = xorshift(x) % n;

  for (const double dd : distances) {
    const auto d = static_cast<std::size_t>(dd);
    std::uint64_t sum = 0;
    const auto t0 = Clock::now();
    for (std::size_t i = 0; i < kReads; ++i) {
      if (d != 0 && i + d < kReads) __builtin_prefetch(&a[index[i + d]]);
      sum += a[index[i]];
    }
    const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / kReads;
    std::printf("RESULT independent mb=%llu prefetch=%zu ns_per_read=%.1f mreads=%.1f (%llu)\n",
                static_cast<unsigned long long>(mb), d, ns, 1e3 / ns, static_cast<unsigned long long>(sum & 1));
  }
  constexpr std::size_t kChain = std::size_t{1} << 20;
  std::uint64_t at = 0;
  const auto t0 = Clock::now();
  for (std::size_t i = 0; i < kChain; ++i) at = a[at];
  const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / kChain;
  std::printf("RESULT dependent   mb=%llu ns_per_read=%.1f (%llu)\n", static_cast<unsigned long long>(mb), ns,
              static_cast<unsigned long long>(at & 1));
  std::fflush(stdout);
  munmap(p, bytes);
}

}  // namespace
}  // namespace gpukv::bench

int main(int argc, char** argv) {
  using namespace gpukv::bench;
  const Flags flags(argc, argv);
  const std::vector<double> distances = flags.doubles("prefetch", "0,8,16");
  for (const double mb : flags.doubles("mb", "1,16,128,1024")) bench_region(static_cast<std::uint64_t>(mb), distances);
  return 0;
}
