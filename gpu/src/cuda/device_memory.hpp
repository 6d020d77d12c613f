// Owning handles for device and pinned host memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "cuda_check.hpp"

namespace gpukv::detail {

struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};
struct CudaFreeHost {
  void operator()(void* p) const { cudaFreeHost(p); }
};

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Throws Error(kOutOfMemory) naming `what` if the allocation fails.
  DeviceBuffer(std::uint64_t bytes, const char* what) : bytes_(bytes) {
    if (bytes == 0) return;
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
      cudaGetLastError();  // an allocation failure is not sticky; clear it
      throw Error(Error::Code::kOutOfMemory, std::string("cannot allocate ") + std::to_string(bytes) +
                                                 " bytes of GPU memory for " + what + ": " + cudaGetErrorString(err));
    }
    ptr_.reset(p);
  }
  // Returns an empty buffer instead of throwing when memory is short.
  static DeviceBuffer try_allocate(std::uint64_t bytes) {
    DeviceBuffer b;
    b.bytes_ = bytes;
    void* p = nullptr;
    if (bytes != 0 && cudaMalloc(&p, bytes) == cudaSuccess) b.ptr_.reset(p);
    if (b.ptr_ == nullptr) cudaGetLastError();
    return b;
  }
  bool empty() const { return ptr_ == nullptr; }
  std::uint64_t bytes() const { return bytes_; }
  std::uint8_t* data() const { return static_cast<std::uint8_t*>(ptr_.get()); }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_.get());
  }

 private:
  std::unique_ptr<void, CudaFree> ptr_;
  std::uint64_t bytes_ = 0;
};

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::uint64_t bytes) {
    void* p = nullptr;
    GPUKV_CUDA_CHECK(cudaMallocHost(&p, bytes));
    ptr_.reset(p);
  }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_.get());
  }

 private:
  std::unique_ptr<void, CudaFreeHost> ptr_;
};

}  // namespace gpukv::detail
