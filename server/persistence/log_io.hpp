// What the log's writer and reader share: the byte layout's integers (little-endian), the segment header,
// and whole-buffer file I/O that retries short transfers. Private to server/persistence.
#pragma once

#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>

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
