// Shared by the benchmark programs: flag parsing and result lines.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace gpukv::bench {

// --name=value flags; anything else is an error.
class Flags {
 public:
  Flags(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      const char* a = argv[i];
      if (std::strncmp(a, "--", 2) != 0 || std::strchr(a, '=') == nullptr) {
        std::fprintf(stderr, "bad argument '%s' (flags are --name=value)\n", a);
        std::exit(2);
      }
      const char* eq = std::strchr(a, '=');
      names_.emplace_back(a + 2, eq);
      values_.emplace_back(eq + 1);
    }
  }
  std::string str(const char* name, const std::string& fallback) const {
    for (std::size_t i = 0; i < names_.size(); ++i) {
      if (names_[i] == name) return values_[i];
    }
    return fallback;
  }
  std::uint64_t u64(const char* name, std::uint64_t fallback) const {
    const std::string v = str(name, "");
    return v.empty() ? fallback : std::strtoull(v.c_str(), nullptr, 0);
  }
  std::vector<double> doubles(const char* name, const std::string& fallback) const {
    std::vector<double> out;
    std::string v = str(name, fallback);
    for (std::size_t at = 0; at < v.size();) {
      std::size_t comma = v.find(',', at);
      if (comma == std::string::npos) comma = v.size();
      out.push_back(std::atof(v.substr(at, comma - at).c_str()));
      at = comma + 1;
    }
    return out;
  }
  std::vector<std::uint64_t> u64s(const char* name, const std::string& fallback) const {
    std::vector<std::uint64_t> out;
    for (double d : doubles(name, fallback)) out.push_back(static_cast<std::uint64_t>(d));
    return out;
  }

 private:
  std::vector<std::string> names_;
  std::vector<std::string> values_;
};

// splitmix64: a bijection on 64-bit integers, so distinct inputs give distinct keys.
inline constexpr std::uint64_t scramble(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace gpukv::bench
