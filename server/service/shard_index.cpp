#include "shard_index.hpp"

#include <unistd.h>

#include <cctype>
#include <charconv>
#include <climits>
#include <stdexcept>

namespace gpukv::server {
namespace {

// A decimal number in [0, 2^32) with nothing else around it.
bool parse_number(std::string_view s, std::uint32_t* value) {
  if (s.empty() || s.size() > 10) return false;
  const auto [end, error] = std::from_chars(s.data(), s.data() + s.size(), *value);
  return error == std::errc() && end == s.data() + s.size();
}

}  // namespace

std::uint32_t parse_shard_index(const std::string& flag, const std::string& hostname) {
  std::uint32_t index = 0;
  if (flag != "auto") {
    if (!parse_number(flag, &index)) throw std::invalid_argument("--shard_index must be a number or 'auto', got '" + flag + "'");
    return index;
  }
  const std::size_t dash = hostname.rfind('-');
  if (dash == std::string::npos || !parse_number(std::string_view(hostname).substr(dash + 1), &index)) {
    throw std::invalid_argument("--shard_index=auto takes the ordinal from a StatefulSet pod's host name such as gpukv-3, but this "
                                "host is named '" + hostname + "'");
  }
  return index;
}

std::string host_name() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof name - 1) != 0) return {};
  return name;
}

}  // namespace gpukv::server
