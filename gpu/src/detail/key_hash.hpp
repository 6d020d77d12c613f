// Keys in registers and the hashes derived from them.
//
// A key is a byte string of at most key_width (8, 16 or 32) bytes. In registers it is up to four 64-bit
// words, zero-padded past its length, plus the length; the length takes part in the hash and in every
// comparison, so "ab" and "ab\0" are different keys. One 64-bit hash per key feeds everything else:
//
//   h  ──mulhi(h, N)──────────────▶ first probe unit      (high bits of h)
//   h2 = mix(h) ─mulhi(h2, N-1)+1─▶ double-hashing step   (high bits of h2; N prime, so every unit is visited)
//   h2 low 32 bits ───────────────▶ ticket info code      (see ticket_board.hpp)
//   h  ─────────────────────────▶ batch grouping         (see batch_groups.hpp)
//
// Multiplying by the range and keeping the high half maps a hash to [0, N) without a division (Stash
// Figure 5 uses __umulhi for the same reason).
#pragma once

#include <cstdint>

#include "hd.hpp"

namespace gpukv::detail {

inline constexpr std::uint32_t kMaxKeyWords = 4;  // 32-byte keys

struct KeyWords {
  std::uint64_t w[kMaxKeyWords];
  std::uint32_t len;  // bytes, 0..key_width
};

// Little-endian mask of the first `bytes` (0..8) bytes of a word.
GPUKV_HD_INLINE std::uint64_t byte_mask(std::uint32_t bytes) {
  return bytes >= 8 ? ~std::uint64_t{0} : ((std::uint64_t{1} << (8 * bytes)) - 1);
}

// Loads a key of `len` bytes stored at an 8-byte aligned address, zeroing the bytes past its length. The
// words are loaded whatever the length (a row of the key column always holds key_words of them), so that
// their loads and the length's are in flight together rather than one after the other.
GPUKV_HD_INLINE KeyWords load_key(const std::uint8_t* p, std::uint32_t len, std::uint32_t key_words) {
  KeyWords k;
  k.len = len;
  const auto* words = reinterpret_cast<const std::uint64_t*>(p);
GPUKV_UNROLL
  for (std::uint32_t j = 0; j < kMaxKeyWords; ++j) {
    const std::uint32_t begin = 8 * j;
    const std::uint32_t valid = len > begin ? len - begin : 0;
    k.w[j] = j < key_words ? words[j] & (valid > 0 ? byte_mask(valid) : 0) : 0;
  }
  return k;
}

GPUKV_HD_INLINE constexpr std::uint64_t mix64(std::uint64_t x) {  // MurmurHash3's finalizer: full avalanche
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

GPUKV_HD_INLINE constexpr std::uint64_t hash_key(const KeyWords& k, std::uint32_t key_words) {
  std::uint64_t h = 0x9E3779B97F4A7C15ULL ^ (std::uint64_t{k.len} * 0xC2B2AE3D27D4EB4FULL);
GPUKV_UNROLL
  for (std::uint32_t j = 0; j < kMaxKeyWords; ++j) {
    if (j < key_words) h = rotl64(h ^ (k.w[j] * 0x87C37B91114253D5ULL), 31) * 0x4CF5AD432745937FULL;
  }
  return mix64(h);
}

// Where a key's probe sequence starts, how it steps, and the info it leaves on the board.
struct ProbePlan {
  std::uint64_t first;  // unit index in [0, units)
  std::uint64_t step;   // in [1, units-1]
  std::uint32_t info;   // uniform 32-bit value; the ticket codec maps it to an info code
};

GPUKV_HD_INLINE constexpr std::uint64_t second_hash(std::uint64_t h) { return mix64(h ^ 0x2545F4914F6CDD1DULL); }

GPUKV_HD_INLINE ProbePlan plan_probe(std::uint64_t h, std::uint64_t units) {
  const std::uint64_t h2 = second_hash(h);
  return ProbePlan{mulhi64(h, units), 1 + mulhi64(h2, units - 1), static_cast<std::uint32_t>(h2)};
}

// The info (ProbePlan::info) of the key of `len` bytes that are all zero: what a line's EMPTY slot holds (see
// Engine's invariants, on claims made FULL at once).
GPUKV_HD_INLINE constexpr std::uint32_t zero_key_info(std::uint32_t len, std::uint32_t key_words) {
  KeyWords zero{{0, 0, 0, 0}, len};
  return static_cast<std::uint32_t>(second_hash(hash_key(zero, key_words)));
}

GPUKV_HD_INLINE std::uint64_t next_unit(std::uint64_t unit, std::uint64_t step, std::uint64_t units) {
  const std::uint64_t next = unit + step;  // unit < units and step < units, so this cannot overflow
  return next >= units ? next - units : next;
}

}  // namespace gpukv::detail
