// The CPU backend for 8-byte keys (one key width per translation unit keeps builds parallel).
#include "cpu_backend.hpp"

namespace gpukv::detail {
template std::unique_ptr<Backend> make_cpu_backend_for<1>(const TableConfig&, const Geometry&);
}  // namespace gpukv::detail
