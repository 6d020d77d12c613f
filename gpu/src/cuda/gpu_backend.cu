// The GPU backend's entry points: is a device usable, and the backend for a configuration's key width
// (instantiated in gpu_backend_key*.cu).
#include <cuda_runtime.h>

#include "../backend.hpp"

namespace gpukv::detail {

bool gpu_present() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error for us, the CPU backend takes over
    return false;
  }
  return count > 0;
}

std::unique_ptr<Backend> make_gpu_backend(const TableConfig& config, const Geometry& geometry) {
  return by_key_width(geometry, [&](auto key_words) { return make_gpu_backend_for<key_words.value>(config, geometry); });
}

}  // namespace gpukv::detail
