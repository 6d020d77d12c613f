#include "batch_record.hpp"

#include <cstring>

namespace gpukv::server::persistence {
namespace {

constexpr auto kPut = static_cast<std::uint8_t>(OpKind::kPut);
constexpr auto kDelete = static_cast<std::uint8_t>(OpKind::kDelete);

void store_u32(std::uint8_t* p, std::uint32_t v) {
  p[0] = static_cast<std::uint8_t>(v);
  p[1] = static_cast<std::uint8_t>(v >> 8);
  p[2] = static_cast<std::uint8_t>(v >> 16);
  p[3] = static_cast<std::uint8_t>(v >> 24);
}
std::uint32_t get_u32(const std::uint8_t* p) {
  return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 | static_cast<std::uint32_t>(p[2]) << 16 |
         static_cast<std::uint32_t>(p[3]) << 24;
}

// The kind a row is logged as, or 0 for a row that changed nothing.
std::uint8_t logged_kind(std::uint8_t op, std::uint8_t status) {
  if (status != static_cast<std::uint8_t>(OpStatus::kOk)) return 0;
  if (carries_value(op)) return kPut;  // PUT_IF_ABSENT that stored is logged as the PUT it was
  return op == kDelete ? kDelete : 0;
}

}  // namespace

namespace {

// Copies `n` bytes by copying `Width` (a compile-time size, so the copy is a few vector moves, not a call):
// the bytes past n are garbage the next copy overwrites, or slack trimmed at the end.
template <std::size_t Width>
void copy_over(std::uint8_t* to, const std::uint8_t* from) {
  std::memcpy(to, from, Width);
}

// The keys of the logged rows, packed, each copied whole (key_width bytes) and advanced by its length.
template <std::size_t KeyWidth>
std::uint8_t* pack_keys(const BatchIn& in, const std::uint8_t* status, std::uint8_t* to) {
  for (std::size_t i = 0; i < in.size; ++i) {
    if (logged_kind(in.ops[i], status[i]) == 0) continue;
    copy_over<KeyWidth>(to, in.keys + i * KeyWidth);
    to += in.key_lens[i];
  }
  return to;
}

}  // namespace

EncodedSize measure_writes(const BatchIn& in, const std::uint8_t* status) {
  EncodedSize size;
  for (std::size_t i = 0; i < in.size; ++i) {
    const std::uint8_t kind = logged_kind(in.ops[i], status[i]);
    size.count += kind != 0;
    size.key_bytes += kind != 0 ? in.key_lens[i] : 0;
    size.puts += kind == kPut;
    size.value_bytes += kind == kPut ? in.value_lens[i] : 0;
  }
  return size;
}

void pack_writes(const BatchIn& in, const std::uint8_t* status, std::uint32_t key_width, std::uint32_t value_stride,
                 const EncodedSize& size, std::uint8_t* to) {
  // The small columns in one pass over the rows, then the keys and the values; keys (and values up to 64
  // bytes wide) are copied whole and the cursor advanced by their length, so that no copy is a call
  // (byte-at-a-time appends cost 45 ns a write, wal_bench).
  std::uint8_t* kinds = to;
  store_u32(kinds, static_cast<std::uint32_t>(size.count));
  store_u32(kinds + 4, static_cast<std::uint32_t>(size.puts));
  kinds += 8;
  std::uint8_t* lengths = kinds + size.count;
  std::uint8_t* value_lengths = lengths + size.count;
  std::uint8_t* keys = value_lengths + 4 * size.puts;
  std::uint8_t* value = keys + size.key_bytes;
  for (std::size_t i = 0; i < in.size; ++i) {
    const std::uint8_t kind = logged_kind(in.ops[i], status[i]);
    if (kind == 0) continue;
    *kinds++ = kind;
    *lengths++ = in.key_lens[i];
    if (kind == kPut) {
      store_u32(value_lengths, in.value_lens[i]);
      value_lengths += 4;
    }
  }
  switch (key_width) {
    case 8: pack_keys<8>(in, status, keys); break;
    case 16: pack_keys<16>(in, status, keys); break;
    case 32: pack_keys<32>(in, status, keys); break;
    default:
      for (std::size_t i = 0; i < in.size; ++i) {
        if (logged_kind(in.ops[i], status[i]) == 0) continue;
        std::memcpy(keys, in.keys + i * key_width, in.key_lens[i]);
        keys += in.key_lens[i];
      }
  }
  for (std::size_t i = 0; i < in.size; ++i) {
    if (logged_kind(in.ops[i], status[i]) != kPut) continue;
    const std::uint8_t* from = in.values + i * value_stride;
    switch (value_stride) {
      case 8: copy_over<8>(value, from); break;
      case 16: copy_over<16>(value, from); break;
      case 32: copy_over<32>(value, from); break;
      case 64: copy_over<64>(value, from); break;
      default: std::memcpy(value, from, in.value_lens[i]);
    }
    value += in.value_lens[i];
  }
}

std::size_t encode_writes(const BatchIn& in, const std::uint8_t* status, std::uint32_t key_width, std::uint32_t value_stride,
                          std::string& out) {
  const EncodedSize size = measure_writes(in, status);
  if (size.count == 0) return 0;
  const std::size_t start = out.size();
  out.resize(start + size.bytes() + pack_slack(key_width, value_stride));
  pack_writes(in, status, key_width, value_stride, size, reinterpret_cast<std::uint8_t*>(out.data() + start));
  out.resize(start + size.bytes());
  return size.count;
}

std::string decode_writes(std::string_view payload, std::uint32_t key_width, std::uint32_t value_width, DecodedWrites* out) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(payload.data());
  const std::size_t size = payload.size();
  if (size < 8) return "a record of " + std::to_string(size) + " bytes is shorter than its counts";
  DecodedWrites w;
  w.count = get_u32(p);
  w.puts = get_u32(p + 4);
  if (w.count == 0 || w.puts > w.count) return "a record counts " + std::to_string(w.count) + " writes and " + std::to_string(w.puts) + " puts";
  const std::size_t columns = 8 + 2 * w.count + 4 * w.puts;
  if (size < columns) return "a record of " + std::to_string(size) + " bytes is shorter than its columns";
  w.kinds = p + 8;
  w.key_lengths = w.kinds + w.count;
  w.value_lengths = w.key_lengths + w.count;
  std::size_t puts = 0, key_bytes = 0, value_bytes = 0;
  for (std::size_t i = 0; i < w.count; ++i) {
    if (w.kinds[i] != kPut && w.kinds[i] != kDelete) return "write " + std::to_string(i) + " has kind " + std::to_string(w.kinds[i]);
    if (w.key_lengths[i] > key_width) {
      return "write " + std::to_string(i) + " has a key of " + std::to_string(w.key_lengths[i]) + " bytes, over the key width " +
             std::to_string(key_width);
    }
    key_bytes += w.key_lengths[i];
    puts += w.kinds[i] == kPut;
  }
  if (puts != w.puts) return "a record counts " + std::to_string(w.puts) + " puts and holds " + std::to_string(puts);
  for (std::size_t j = 0; j < w.puts; ++j) {
    const std::uint32_t len = get_u32(w.value_lengths + 4 * j);
    if (len > value_width) {
      return "put " + std::to_string(j) + " has a value of " + std::to_string(len) + " bytes, over the value width " + std::to_string(value_width);
    }
    value_bytes += len;
  }
  if (size != columns + key_bytes + value_bytes) {
    return "a record of " + std::to_string(size) + " bytes whose columns add up to " + std::to_string(columns + key_bytes + value_bytes);
  }
  w.keys = p + columns;
  w.values = w.keys + key_bytes;
  *out = w;
  return {};
}

void expand_writes(const DecodedWrites& writes, std::uint32_t key_width, std::uint32_t value_stride, std::uint8_t* ops,
                   std::uint8_t* key_lens, std::uint8_t* keys, std::uint32_t* value_lens, std::uint8_t* values) {
  const std::uint8_t* key = writes.keys;
  const std::uint8_t* value = writes.values;
  for (std::size_t i = 0, put = 0; i < writes.count; ++i) {
    ops[i] = writes.kinds[i];
    key_lens[i] = writes.key_lengths[i];
    std::memcpy(keys + i * key_width, key, writes.key_lengths[i]);
    key += writes.key_lengths[i];
    value_lens[i] = 0;
    if (writes.kinds[i] == kPut) {
      value_lens[i] = get_u32(writes.value_lengths + 4 * put++);
      std::memcpy(values + i * value_stride, value, value_lens[i]);
      value += value_lens[i];
    }
  }
}

}  // namespace gpukv::server::persistence
