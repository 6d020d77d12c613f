#include "gpukv/v1/shard_map.hpp"

#include <array>
#include <stdexcept>
#include <string>

namespace gpukv {
namespace {

// CRC-16/XMODEM a byte at a time: crc = (crc << 8) ^ table[(crc >> 8) ^ byte].
constexpr std::array<std::uint16_t, 256> crc16_table() {
  std::array<std::uint16_t, 256> table{};
  for (std::uint32_t byte = 0; byte < 256; ++byte) {
    std::uint32_t crc = byte << 8;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 0x8000) != 0 ? (crc << 1) ^ 0x1021 : crc << 1;
    table[byte] = static_cast<std::uint16_t>(crc);
  }
  return table;
}
constexpr std::array<std::uint16_t, 256> kCrc16 = crc16_table();
// The check value of CRC-16/XMODEM (the CRC of "123456789") pins the table.
constexpr std::uint16_t crc16(std::string_view bytes) {
  std::uint16_t crc = 0;
  for (const char c : bytes) {
    crc = static_cast<std::uint16_t>((crc << 8) ^ kCrc16[((crc >> 8) ^ static_cast<std::uint8_t>(c)) & 0xFF]);
  }
  return crc;
}
static_assert(crc16("123456789") == 0x31C3, "CRC-16/XMODEM check value");
static_assert(kSlotCount <= 65536 && (kSlotCount & (kSlotCount - 1)) == 0, "slots are the low bits of the CRC");

}  // namespace

std::uint32_t key_slot(std::string_view key) { return crc16(key) & (kSlotCount - 1); }

std::uint32_t jump_consistent_hash(std::uint64_t key, std::uint32_t buckets) {
  std::int64_t b = -1, j = 0;
  while (j < static_cast<std::int64_t>(buckets)) {
    b = j;
    key = key * 2862933555777941757ULL + 1;
    j = static_cast<std::int64_t>(static_cast<double>(b + 1) *
                                  (static_cast<double>(std::int64_t{1} << 31) / static_cast<double>((key >> 33) + 1)));
  }
  return static_cast<std::uint32_t>(b);
}

ShardMap::ShardMap(std::uint32_t shard_count) : shard_count_(shard_count), shard_of_slot_(kSlotCount) {
  if (shard_count == 0 || shard_count > kSlotCount) {
    throw std::invalid_argument("shard count must be 1.." + std::to_string(kSlotCount) + ", got " + std::to_string(shard_count));
  }
  for (std::uint32_t slot = 0; slot < kSlotCount; ++slot) {
    shard_of_slot_[slot] = static_cast<std::uint16_t>(jump_consistent_hash(slot, shard_count));
  }
}

}  // namespace gpukv
