// What the log's writer and reader share: the byte layout's integers (little-endian), the segment header,
// and whole-buffer file I/O that retries short transfers. Private to server/persistence.
#pragma once

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "log_file.hpp"

namespace gpukv::server::persistence::io {

inline constexpr char kSegmentMagic[8] = {'G', 'P', 'U', 'K', 'V', 'L', 'O', 'G'};

inline void put_u32(char* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
inline void put_u64(char* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
inline std::uint32_t get_u32(const char* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(static_cast<std::uint8_t>(p[i])) << (8 * i);
  return v;
}
inline std::uint64_t get_u64(const char* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(static_cast<std::uint8_t>(p[i])) << (8 * i);
  return v;
}

inline std::string errno_text(const std::string& what, const std::filesystem::path& path) {
  return what + " " + path.string() + ": " + std::strerror(errno);
}

// Files named <prefix><16 hex digits><suffix> (log segments, snapshots): the path for a number, and those
// under `dir`, by number, with their numbers.
inline std::filesystem::path numbered_path(const std::filesystem::path& dir, std::string_view prefix, std::uint64_t number,
                                           std::string_view suffix) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(number));
  return dir / (std::string(prefix) + hex + std::string(suffix));
}
inline std::vector<std::pair<std::filesystem::path, std::uint64_t>> list_numbered(const std::filesystem::path& dir,
                                                                                 std::string_view prefix, std::string_view suffix) {
  std::vector<std::pair<std::filesystem::path, std::uint64_t>> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.size() != prefix.size() + 16 + suffix.size() || name.rfind(prefix, 0) != 0 || name.substr(prefix.size() + 16) != suffix) {
      continue;
    }
    const std::string hex = name.substr(prefix.size(), 16);
    if (hex.find_first_not_of("0123456789abcdef") != std::string::npos) continue;
    files.emplace_back(entry.path(), std::stoull(hex, nullptr, 16));
  }
  std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  return files;
}

// The message for a file written with other widths than this server's, or empty if they are the same.
inline std::string other_widths(const std::string& name, LogShape written, LogShape shape) {
  if (written.key_width == shape.key_width && written.value_width == shape.value_width) return {};
  return name + " was written with key width " + std::to_string(written.key_width) + " and value width " +
         std::to_string(written.value_width) + "; this server has key width " + std::to_string(shape.key_width) +
         " and value width " + std::to_string(shape.value_width) + " (start it with those, or with another --data_dir)";
}

inline std::string encode_header(LogShape shape, std::uint64_t first_seq) {
  std::string h(kSegmentHeaderBytes, '\0');
  std::memcpy(h.data(), kSegmentMagic, 8);
  put_u32(h.data() + 8, kLogVersion);
  put_u32(h.data() + 12, shape.key_width);
  put_u32(h.data() + 16, shape.value_width);
  put_u64(h.data() + 24, first_seq);
  put_u64(h.data() + 32, XXH3_64bits(h.data(), 32));
  return h;
}

// Writes all of `bytes`, or returns an error message.
inline std::string write_all(int fd, std::string_view bytes, const std::filesystem::path& path) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_text("cannot write", path);
    }
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return {};
}

// Reads exactly `size` bytes at `offset`; false on a short read or an error.
inline bool read_at(int fd, std::uint64_t offset, char* out, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::pread(fd, out, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    out += n;
    size -= static_cast<std::size_t>(n);
    offset += static_cast<std::uint64_t>(n);
  }
  return true;
}

}  // namespace gpukv::server::persistence::io
