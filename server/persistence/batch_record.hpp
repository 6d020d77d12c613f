// What one executed batch wrote, as a write-ahead log record's payload: the batch's successful writes in its
// own column form, packed tight (variable-length keys and values, no row padding), in batch order so that a
// replay applies ops on one key in the order they took effect. PUT and PUT_IF_ABSENT that stored become PUT
// (a PUT_IF_ABSENT stored only because its key was absent, so a PUT there does the same); DELETE that removed
// a key stays DELETE; everything else (GETs, misses, refusals) changed nothing and is left out.
//
//   u32 count | u32 puts | count x u8 kind | count x u8 key length | puts x u32 value length |
//   keys, concatenated | values, concatenated                              (integers little-endian)
//
// Knows the table's column types only: no files, no gRPC.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "gpukv/types.hpp"

namespace gpukv::server::persistence {

// Appends the payload of the batch's successful writes to `out` (nothing if none); returns their count.
// `status` is the batch's result column; keys are key_width apart in `in`, values value_stride apart.
std::size_t encode_writes(const BatchIn& in, const std::uint8_t* status, std::uint32_t key_width, std::uint32_t value_stride,
                          std::string& out);

// encode_writes in two steps, for a caller that owns the memory (a snapshot's blocks, aligned for direct
// I/O): the payload's size, then the payload written at `to`, which needs size.bytes() plus pack_slack()
// bytes of room (keys and narrow values are copied whole, past their lengths).
struct EncodedSize {
  std::size_t count = 0, puts = 0, key_bytes = 0, value_bytes = 0;
  std::size_t bytes() const { return 8 + 2 * count + 4 * puts + key_bytes + value_bytes; }
};
EncodedSize measure_writes(const BatchIn& in, const std::uint8_t* status);
constexpr std::size_t pack_slack(std::uint32_t key_width, std::uint32_t value_stride) { return key_width + value_stride; }
void pack_writes(const BatchIn& in, const std::uint8_t* status, std::uint32_t key_width, std::uint32_t value_stride,
                 const EncodedSize& size, std::uint8_t* to);

// A payload's writes, pointing into the payload.
struct DecodedWrites {
  std::size_t count = 0;
  std::size_t puts = 0;
  const std::uint8_t* kinds = nullptr;
  const std::uint8_t* key_lengths = nullptr;
  const std::uint8_t* value_lengths = nullptr;  // puts x u32, little-endian, unaligned
  const std::uint8_t* keys = nullptr;
  const std::uint8_t* values = nullptr;
};

// Checks a payload against the table's widths (kinds, lengths, sizes that add up exactly) and points `out`
// into it. Returns an error message, or empty.
std::string decode_writes(std::string_view payload, std::uint32_t key_width, std::uint32_t value_width, DecodedWrites* out);

// Writes rows [0, writes.count) of a batch for Table::execute: `ops`, `key_lens`, `keys` (key_width apart),
// `value_lens` and `values` (value_stride apart), each with room for writes.count rows.
void expand_writes(const DecodedWrites& writes, std::uint32_t key_width, std::uint32_t value_stride, std::uint8_t* ops,
                   std::uint8_t* key_lens, std::uint8_t* keys, std::uint32_t* value_lens, std::uint8_t* values);

}  // namespace gpukv::server::persistence
