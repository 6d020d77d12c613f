// The in-process server most service tests start: 127.0.0.1 with free ports, the CPU backend, 4096 slots,
// 16-byte keys and 32-byte values. Tests change what they are about.
#pragma once

#include "service/server.hpp"

namespace gpukv::test {

inline server::ServerOptions small_server_options() {
  server::ServerOptions o;
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "127.0.0.1:0";
  o.table.backend = BackendKind::kCpu;
  o.table.capacity = 4096;
  o.table.key_width = 16;
  o.table.value_width = 32;
  return o;
}

}  // namespace gpukv::test
