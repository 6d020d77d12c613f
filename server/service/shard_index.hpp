// --shard_index: a number, or "auto", which takes the ordinal a Kubernetes StatefulSet gives its pod (the
// pod's name, and so its hostname, is <statefulset>-<ordinal>, e.g. gpukv-3).
#pragma once

#include <cstdint>
#include <string>

namespace gpukv::server {

// The shard index `flag` names, given this host's name for "auto". Throws std::invalid_argument with a
// message naming the flag when it is neither a number nor "auto", or when the host name ends in no ordinal.
std::uint32_t parse_shard_index(const std::string& flag, const std::string& hostname);

// This host's name (gethostname).
std::string host_name();

}  // namespace gpukv::server
