// The server's settings checked against sane bounds before anything starts: no port opens, no thread starts
// and nothing is allocated for a setting that cannot work (a --cpu_threads that would exhaust the host's
// process limit, a queue that refuses every call, a TLS certificate without its key).
#pragma once

#include <string>

#include "server.hpp"

namespace gpukv::server {

// An error message naming the flag, its bounds and the value given, or empty if every setting is usable.
// Covers the table's settings too (Table::check).
std::string check_options(const ServerOptions& options);

}  // namespace gpukv::server
