// Every CUDA call is checked; a failure becomes gpukv::Error carrying the call, file and line.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "gpukv/types.hpp"

namespace gpukv::detail {

[[noreturn]] inline void throw_cuda(cudaError_t err, const char* call, const char* file, int line) {
  const Error::Code code = err == cudaErrorMemoryAllocation ? Error::Code::kOutOfMemory : Error::Code::kCuda;
  throw Error(code, std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
                        cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

}  // namespace gpukv::detail

#define GPUKV_CUDA_CHECK(call)                                                      \
  do {                                                                              \
    const cudaError_t gpukv_err_ = (call);                                          \
    if (gpukv_err_ != cudaSuccess) ::gpukv::detail::throw_cuda(gpukv_err_, #call, __FILE__, __LINE__); \
  } while (0)
