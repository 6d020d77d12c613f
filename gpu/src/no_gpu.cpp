// Built instead of the CUDA backend when CMake finds no CUDA toolkit (or GPUKV_ENABLE_CUDA=OFF, as in the
// ThreadSanitizer build): the table then runs on the CPU backend only.
#include "backend.hpp"

namespace gpukv::detail {

bool gpu_present() { return false; }

std::unique_ptr<Backend> make_gpu_backend(const TableConfig&, const Geometry&) {
  throw Error(Error::Code::kNoDevice, "this build of gpukv has no CUDA backend");
}

}  // namespace gpukv::detail
