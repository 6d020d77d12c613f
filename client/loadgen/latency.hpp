// A latency histogram that many threads record into without a lock: log-linear buckets (128 per power of
// two above 128 ns, so a percentile is within 1/64 of the true value), fixed size, so an open-loop run of
// any length and rate costs the same memory.
#pragma once

#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>

namespace gpukv::load {

class LatencyHistogram {
 public:
  void record(std::chrono::nanoseconds latency) {
    const std::int64_t ns = latency.count();
    counts_[index(ns < 0 ? 0 : static_cast<std::uint64_t>(ns))].fetch_add(1, std::memory_order_relaxed);
  }

  std::uint64_t count() const {
    std::uint64_t n = 0;
    for (const auto& c : counts_) n += c.load(std::memory_order_relaxed);
    return n;
  }

  // The p-quantile (0 < p <= 1) in microseconds; 0 when empty.
  double percentile_us(double p) const {
    const std::uint64_t total = count();
    if (total == 0) return 0;
    const auto rank = static_cast<std::uint64_t>(p * static_cast<double>(total - 1)) + 1;
    std::uint64_t seen = 0;
    for (std::size_t i = 0; i < counts_.size(); ++i) {
      seen += counts_[i].load(std::memory_order_relaxed);
      if (seen >= rank) return static_cast<double>(value(i)) / 1000.0;
    }
    return static_cast<double>(value(counts_.size() - 1)) / 1000.0;
  }

 private:
  static constexpr int kSubBits = 7;
  static constexpr std::uint64_t kSub = 1u << kSubBits;  // exact below kSub ns
  static constexpr std::uint64_t kHalf = kSub / 2;

  // Values of kSub and above keep their top kSubBits bits: bucket kSub + (shift - 1) * kHalf + (top - kHalf).
  static std::size_t index(std::uint64_t ns) {
    if (ns < kSub) return static_cast<std::size_t>(ns);
    const int shift = (63 - std::countl_zero(ns)) - kSubBits + 1;
    const std::uint64_t top = ns >> shift;  // in [kHalf, kSub)
    return static_cast<std::size_t>(kSub + static_cast<std::uint64_t>(shift - 1) * kHalf + (top - kHalf));
  }
  // The middle of bucket i, in nanoseconds.
  static std::uint64_t value(std::size_t i) {
    if (i < kSub) return i;
    const std::uint64_t j = i - kSub;
    const std::uint64_t shift = j / kHalf + 1;
    const std::uint64_t top = j % kHalf + kHalf;
    return (top << shift) + (std::uint64_t{1} << (shift - 1));
  }

  std::array<std::atomic<std::uint64_t>, kSub + (64 - kSubBits) * kHalf> counts_{};
};

}  // namespace gpukv::load
