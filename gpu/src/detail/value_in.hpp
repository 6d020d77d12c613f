// A value in registers: its length, its first two words (a whole 8- or 16-byte value) and where the rest is.
// Used for the values a batch writes and for the values a hit reads from a slot.
#pragma once

#include <cstdint>

#include "hd.hpp"

namespace gpukv::detail {

struct ValueIn {
  std::uint32_t len;
  std::uint64_t head[2];
  const std::uint64_t* words;
  // Selects rather than indexes head[]: a run-time index would move the array to local memory.
  GPUKV_HD_INLINE std::uint64_t word(std::uint32_t j) const { return j == 0 ? head[0] : j == 1 ? head[1] : words[j]; }
};

// A value of `len` bytes (the caller's load, which is issued with these) whose words start at `words`, where
// `stride` bytes (at least 8: value_stride) are readable. The head words are loaded whatever the length, in
// the same breath as the length: loaded once the length said they were wanted, they waited for it, a second
// memory round trip for every op (bench/RESULTS.md, "an op's reads issued together"). Words past the length
// are never used unmasked.
GPUKV_HD_INLINE ValueIn load_value(const std::uint64_t* words, std::uint32_t len, std::uint32_t stride) {
  ValueIn v;
  v.words = words;
  v.len = len;
  v.head[0] = words[0];
  v.head[1] = stride > 8 ? words[1] : 0;
  return v;
}

}  // namespace gpukv::detail
