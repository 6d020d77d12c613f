// A batch's columns in device memory, for batches that arrive in host memory.
#pragma once

#include <cstdint>

#include "cuda_check.hpp"
#include "device_memory.hpp"
#include "gpukv/types.hpp"

namespace gpukv::detail {
namespace gpu {
// Internal linkage: each gpu_backend_key*.cu has its own copy of these kernels and helpers.
namespace {

// A batch's columns in device memory, grown on demand for batches that arrive in host memory.
class DeviceColumns {
 public:
  // `slot_words`: the table keeps slot words (TableConfig::slot_word), and the batches carry columns of them.
  void reserve(std::uint64_t n, std::uint32_t key_width, std::uint32_t value_stride, bool slot_words) {
    if (n <= capacity_) return;
    ops_ = GpuBuffer(n, "batch ops");
    keys_ = GpuBuffer(n * key_width, "batch keys");
    key_lens_ = GpuBuffer(n, "batch key lengths");
    values_ = GpuBuffer(n * value_stride, "batch values");
    value_lens_ = GpuBuffer(n * sizeof(std::uint32_t), "batch value lengths");
    status_ = GpuBuffer(n, "batch results");
    out_values_ = GpuBuffer(n * value_stride, "batch result values");
    out_value_lens_ = GpuBuffer(n * sizeof(std::uint32_t), "batch result lengths");
    if (slot_words) {
      slot_words_ = GpuBuffer(n * sizeof(std::uint64_t), "batch slot words");
      out_slot_words_ = GpuBuffer(n * sizeof(std::uint64_t), "batch result slot words");
    }
    capacity_ = n;
  }
  // The slot word columns are null where reserve() made none.
  BatchIn in(std::uint64_t n) const {
    return BatchIn{n, ops_.data(), keys_.data(), key_lens_.data(), values_.data(), value_lens_.as<std::uint32_t>(),
                   slot_words_.as<std::uint64_t>()};
  }
  BatchOut out() const {
    return BatchOut{status_.data(), out_values_.data(), out_value_lens_.as<std::uint32_t>(), out_slot_words_.as<std::uint64_t>()};
  }

  // Copies a batch's input columns from host memory into these, in stream order on `s`. Returns them as the
  // pass's input: without value columns if the batch has none.
  BatchIn copy_in(const BatchIn& in, std::uint32_t key_width, std::uint32_t value_stride, cudaStream_t s) const {
    const std::uint64_t n = in.size;
    BatchIn d = this->in(n);
    GPUKV_CUDA_CHECK(cudaMemcpyAsync(const_cast<std::uint8_t*>(d.ops), in.ops, n, cudaMemcpyHostToDevice, s));
    GPUKV_CUDA_CHECK(cudaMemcpyAsync(const_cast<std::uint8_t*>(d.keys), in.keys, n * key_width, cudaMemcpyHostToDevice, s));
    GPUKV_CUDA_CHECK(cudaMemcpyAsync(const_cast<std::uint8_t*>(d.key_lens), in.key_lens, n, cudaMemcpyHostToDevice, s));
    if (in.values != nullptr && in.value_lens != nullptr) {
      GPUKV_CUDA_CHECK(cudaMemcpyAsync(const_cast<std::uint8_t*>(d.values), in.values, n * value_stride, cudaMemcpyHostToDevice, s));
      GPUKV_CUDA_CHECK(cudaMemcpyAsync(const_cast<std::uint32_t*>(d.value_lens), in.value_lens, n * sizeof(std::uint32_t),
                                       cudaMemcpyHostToDevice, s));
    } else {
      d.values = nullptr;
      d.value_lens = nullptr;
    }
    if (in.slot_words != nullptr) {
      GPUKV_CUDA_CHECK(cudaMemcpyAsync(const_cast<std::uint64_t*>(d.slot_words), in.slot_words, n * sizeof(std::uint64_t),
                                       cudaMemcpyHostToDevice, s));
    } else {
      d.slot_words = nullptr;
    }
    return d;
  }

 private:
  std::uint64_t capacity_ = 0;
  GpuBuffer ops_, keys_, key_lens_, values_, value_lens_, status_, out_values_, out_value_lens_, slot_words_, out_slot_words_;
};

}  // namespace
}  // namespace gpu
}  // namespace gpukv::detail
