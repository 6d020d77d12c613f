// Optional per-step GPU timing (GPUKV_PROFILE_STEPS=1): CUDA events around every kernel and copy step of
// the backend, summed per step and printed to stderr as one line per batch call. Off by default; when off
// it records nothing.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "cuda_check.hpp"

namespace gpukv::detail {

class StepClock {
 public:
  StepClock() {
    const char* env = std::getenv("GPUKV_PROFILE_STEPS");
    on_ = env != nullptr && env[0] == '1';
  }
  ~StepClock() {
    for (auto& p : pool_) cudaEventDestroy(p);
  }

  // Prints the steps since the last report and starts over. A step named `step.part` (one kernel of a step
  // that launches several) is printed as it is and summed into `step`, which earlier reports printed whole.
  void report(std::uint64_t ops) {
    if (!on_) return;
    collect();
    std::map<std::string, Total> steps = totals_;
    for (const auto& [name, t] : totals_) {
      const std::size_t dot = name.find('.');
      if (dot == std::string::npos) continue;
      Total& whole = steps[name.substr(0, dot)];
      whole.ms += t.ms;
      whole.calls = std::max(whole.calls, t.calls);
    }
    double total = 0;
    std::string line;
    for (const auto& [name, t] : steps) {
      if (name.find('.') == std::string::npos) total += t.ms;
      char buf[96];
      std::snprintf(buf, sizeof buf, " %s=%.3fms/%llu", name.c_str(), t.ms, static_cast<unsigned long long>(t.calls));
      line += buf;
    }
    std::fprintf(stderr, "PROFILE ops=%llu gpu_steps_ms=%.3f%s\n", static_cast<unsigned long long>(ops), total, line.c_str());
    totals_.clear();
  }
  StepClock(const StepClock&) = delete;
  StepClock& operator=(const StepClock&) = delete;

  void begin(cudaStream_t stream, const char* name) {
    if (!on_) return;
    pending_.push_back(Pending{name, event(), event()});
    GPUKV_CUDA_CHECK(cudaEventRecord(pending_.back().start, stream));
  }
  void end(cudaStream_t stream) {
    if (!on_) return;
    GPUKV_CUDA_CHECK(cudaEventRecord(pending_.back().stop, stream));
  }
  // Waits for the recorded steps to finish and adds them to the totals.
  void collect() {
    if (!on_) return;
    for (const Pending& p : pending_) {
      float ms = 0;
      GPUKV_CUDA_CHECK(cudaEventSynchronize(p.stop));
      GPUKV_CUDA_CHECK(cudaEventElapsedTime(&ms, p.start, p.stop));
      Total& t = totals_[p.name];
      t.ms += ms;
      t.calls += 1;
      free_.push_back(p.start);
      free_.push_back(p.stop);
    }
    pending_.clear();
  }

 private:
  struct Pending {
    const char* name;
    cudaEvent_t start, stop;
  };
  struct Total {
    double ms = 0;
    std::uint64_t calls = 0;
  };
  cudaEvent_t event() {
    if (!free_.empty()) {
      cudaEvent_t e = free_.back();
      free_.pop_back();
      return e;
    }
    cudaEvent_t e;
    GPUKV_CUDA_CHECK(cudaEventCreate(&e));
    pool_.push_back(e);
    return e;
  }

  bool on_ = false;
  std::vector<Pending> pending_;
  std::vector<cudaEvent_t> free_;
  std::vector<cudaEvent_t> pool_;
  std::map<std::string, Total> totals_;
};

}  // namespace gpukv::detail
