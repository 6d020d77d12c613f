// Zeroed host memory for the CPU backend's tables and scratch, mapped straight from the kernel.
//
// Large buffers ask for transparent huge pages: every op touches a random board word and a random slot, and
// with 4 KiB pages a table of a few hundred MB misses the TLB on nearly every one of them (measured on the
// 2-core development VM, where a page walk is a nested one: the prefetch of a board word stalled the probing
// loop more than the cache misses themselves). With 2 MiB pages the same table needs a few hundred TLB entries.
// Fresh anonymous mappings are zero: a table starts EMPTY.
#pragma once

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <utility>

#include "gpukv/types.hpp"

namespace gpukv::detail::cpu {

class HostBuffer {
 public:
  static constexpr std::uint64_t kHugePage = std::uint64_t{2} << 20;

  HostBuffer() = default;
  // Throws Error(kOutOfMemory) if the memory cannot be mapped, unless `nothrow` (then empty()).
  explicit HostBuffer(std::uint64_t bytes, bool nothrow = false) {
    if (bytes == 0) return;
    // A buffer of a huge page or more is aligned to one, so that every 2 MiB of it is eligible (the board of
    // a 4 M-slot table is 4 MiB: on small pages its words alone missed the TLB), at the price of at most two
    // pages of address space.
    const bool huge = bytes >= kHugePage;
    const std::uint64_t length = huge ? (bytes + kHugePage - 1) / kHugePage * kHugePage : bytes;  // whole pages
    const std::uint64_t mapped = huge ? length + kHugePage : bytes;
    void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      if (nothrow) return;
      throw Error(Error::Code::kOutOfMemory, "cannot map " + std::to_string(bytes) + " bytes of host memory");
    }
    base_ = static_cast<std::uint8_t*>(p);
    mapped_ = mapped;
    data_ = base_;
    if (huge) {
      data_ = reinterpret_cast<std::uint8_t*>((reinterpret_cast<std::uintptr_t>(base_) + kHugePage - 1) & ~(kHugePage - 1));
      madvise(data_, length, MADV_HUGEPAGE);  // advice only: without THP the buffer works on small pages
    }
    // Fault every page in now, so that a table too large for memory fails here, not at its first write
    // under load. Kernels before 5.14 do not know the advice (EINVAL): their pages come on first touch.
    if (madvise(data_, length, MADV_POPULATE_WRITE) != 0 && errno != EINVAL) {
      munmap(base_, mapped_);
      base_ = data_ = nullptr;
      if (nothrow) return;
      throw Error(Error::Code::kOutOfMemory, "cannot populate " + std::to_string(bytes) + " bytes of host memory");
    }
  }
  ~HostBuffer() {
    if (base_ != nullptr) munmap(base_, mapped_);
  }
  HostBuffer(HostBuffer&& other) noexcept
      : base_(std::exchange(other.base_, nullptr)), data_(std::exchange(other.data_, nullptr)),
        mapped_(std::exchange(other.mapped_, 0)) {}
  HostBuffer& operator=(HostBuffer&& other) noexcept {
    if (this != &other) {
      this->~HostBuffer();
      base_ = std::exchange(other.base_, nullptr);
      data_ = std::exchange(other.data_, nullptr);
      mapped_ = std::exchange(other.mapped_, 0);
    }
    return *this;
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  bool empty() const { return data_ == nullptr; }
  std::uint8_t* data() const { return data_; }
  template <class T>
  T* as() const {
    return reinterpret_cast<T*>(data_);
  }

 private:
  std::uint8_t* base_ = nullptr;  // the mapping
  std::uint8_t* data_ = nullptr;  // its first huge-page boundary, or base_
  std::uint64_t mapped_ = 0;
};

}  // namespace gpukv::detail::cpu
