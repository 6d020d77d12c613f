#include "gpukv/v1/shard_map.hpp"

#include <array>
#include <stdexcept>
#include <string>

namespace gpukv {
namespace {

// CRC-16/XMODEM, slicing by 8: kCrc16[k][x] is the CRC of byte x followed by k zero bytes, so eight bytes
// fold into the CRC with eight independent table reads instead of a chain of eight dependent steps (a
// sharded client hashes every key of every call: byte at a time, this was 13% of gpukv-load's CPU against
// two shards). kCrc16[0] is the classic byte-at-a-time table.
using Crc16Tables = std::array<std::array<std::uint16_t, 256>, 8>;
constexpr Crc16Tables crc16_tables() {
  Crc16Tables t{};
  for (std::uint32_t byte = 0; byte < 256; ++byte) {
    std::uint32_t crc = byte << 8;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 0x8000) != 0 ? (crc << 1) ^ 0x1021 : crc << 1;
    t[0][byte] = static_cast<std::uint16_t>(crc);
  }
  for (std::size_t k = 1; k < t.size(); ++k) {
    for (std::uint32_t byte = 0; byte < 256; ++byte) {
      const std::uint16_t prev = t[k - 1][byte];
      t[k][byte] = static_cast<std::uint16_t>((prev << 8) ^ t[0][prev >> 8]);
    }
  }
  return t;
}
constexpr Crc16Tables kCrc16 = crc16_tables();

constexpr std::uint16_t crc16(std::string_view bytes) {
  std::uint32_t crc = 0;
  const auto at = [&bytes](std::size_t i) { return static_cast<std::uint8_t>(bytes[i]); };
  std::size_t i = 0;
  // The CRC register (16 bits, most significant first) is the first two bytes' worth of the next block.
  for (; i + 8 <= bytes.size(); i += 8) {
    crc = kCrc16[7][at(i) ^ (crc >> 8)] ^ kCrc16[6][at(i + 1) ^ (crc & 0xFF)] ^ kCrc16[5][at(i + 2)] ^ kCrc16[4][at(i + 3)] ^
          kCrc16[3][at(i + 4)] ^ kCrc16[2][at(i + 5)] ^ kCrc16[1][at(i + 6)] ^ kCrc16[0][at(i + 7)];
  }
  for (; i < bytes.size(); ++i) crc = ((crc << 8) ^ kCrc16[0][(crc >> 8) ^ at(i)]) & 0xFFFF;
  return static_cast<std::uint16_t>(crc);
}
// The check value of CRC-16/XMODEM (the CRC of "123456789") pins the tables, through both loops.
static_assert(crc16("123456789") == 0x31C3, "CRC-16/XMODEM check value");
static_assert(crc16("") == 0, "CRC-16/XMODEM of nothing");
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
