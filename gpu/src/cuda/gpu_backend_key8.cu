// The GPU backend for 8-byte keys (one key width per translation unit keeps builds parallel).
#include "gpu_backend.cuh"

namespace gpukv::detail {
template std::unique_ptr<Backend> make_gpu_backend_for<1>(const TableConfig&, const Geometry&);
}  // namespace gpukv::detail
