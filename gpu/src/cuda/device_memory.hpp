// Owning handles for GPU-reachable memory (device memory, mapped pinned host memory) and pinned host memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "cuda_check.hpp"

namespace gpukv::detail {

struct CudaFreeHost {
  void operator()(void* p) const { cudaFreeHost(p); }
};

// Where a GpuBuffer lives: device memory, or pinned host memory mapped into the GPU's address space (the
// host tier's slots: kernels read and write it over PCIe).
enum class GpuMemory : std::uint8_t { kDevice, kMappedHost };

// Frees a GpuBuffer's memory the way it was allocated.
struct GpuRelease {
  GpuMemory where = GpuMemory::kDevice;
  void operator()(void* p) const { where == GpuMemory::kDevice ? cudaFree(p) : cudaFreeHost(p); }
};

// Memory that kernels can reach, owned.
class GpuBuffer {
 public:
  GpuBuffer() = default;
  // Throws Error(kOutOfMemory) naming `what` if the allocation fails.
  GpuBuffer(std::uint64_t bytes, const char* what, GpuMemory where = GpuMemory::kDevice) : bytes_(bytes) {
    if (bytes == 0) return;
    const cudaError_t err = allocate(bytes, where);
    if (err != cudaSuccess) {
      throw Error(Error::Code::kOutOfMemory, std::string("cannot allocate ") + std::to_string(bytes) + " bytes of " +
                                                 (where == GpuMemory::kDevice ? "GPU memory" : "pinned host memory") +
                                                 " for " + what + ": " + cudaGetErrorString(err));
    }
  }
  // Returns an empty buffer instead of throwing when memory is short.
  static GpuBuffer try_allocate(std::uint64_t bytes, GpuMemory where = GpuMemory::kDevice) {
    GpuBuffer b;
    b.bytes_ = bytes;
    if (bytes != 0) b.allocate(bytes, where);
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
  cudaError_t allocate(std::uint64_t bytes, GpuMemory where) {
    void* p = nullptr;
    // Mapped pinned memory: with unified addressing its device pointer is its host pointer, so kernels use
    // it as it is; cudaHostGetDevicePointer makes that explicit rather than assumed.
    cudaError_t err = where == GpuMemory::kDevice ? cudaMalloc(&p, bytes)
                                                  : cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
    void* device = p;
    if (err == cudaSuccess && where == GpuMemory::kMappedHost) {
      err = cudaHostGetDevicePointer(&device, p, 0);
      if (err != cudaSuccess || device != p) {
        cudaFreeHost(p);
        if (err == cudaSuccess) err = cudaErrorNotSupported;  // kernels and host would need different pointers
        p = nullptr;
      }
    }
    if (err != cudaSuccess) {
      cudaGetLastError();  // an allocation failure is not sticky; clear it
      return err;
    }
    ptr_ = std::unique_ptr<void, GpuRelease>(p, GpuRelease{where});
    return cudaSuccess;
  }

  std::unique_ptr<void, GpuRelease> ptr_;
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
