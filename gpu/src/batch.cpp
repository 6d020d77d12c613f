#include "gpukv/batch.hpp"

#include <cstring>
#include <string>

namespace gpukv {

Batch::Batch(Table& table, std::size_t capacity)
    : capacity_(capacity),
      key_width_(table.config().key_width),
      value_width_(table.config().value_width),
      value_stride_(table.value_stride()) {
  // One block, each column starting 8-byte aligned as the table requires; at least one row, so that an empty
  // batch's columns are not null.
  const std::size_t n = capacity == 0 ? 1 : capacity;
  std::size_t bytes = 0;
  const auto column = [&](std::size_t size) {
    const std::size_t at = bytes;
    bytes += (size + 7) / 8 * 8;
    return at;
  };
  const std::size_t at_ops = column(n), at_key_lens = column(n), at_status = column(n);
  const std::size_t at_value_lens = column(n * 4), at_out_value_lens = column(n * 4);
  const std::size_t at_keys = column(n * key_width_), at_values = column(n * value_stride_);
  const std::size_t at_out_values = column(n * value_stride_);
  const bool words = table.config().slot_word;
  const std::size_t at_slot_words = column(words ? n * 8 : 0), at_out_slot_words = column(words ? n * 8 : 0);
  memory_ = table.allocate_host(bytes);
  std::uint8_t* base = memory_.data();
  ops_ = base + at_ops;
  key_lens_ = base + at_key_lens;
  status_ = base + at_status;
  value_lens_ = reinterpret_cast<std::uint32_t*>(base + at_value_lens);
  out_value_lens_ = reinterpret_cast<std::uint32_t*>(base + at_out_value_lens);
  keys_ = base + at_keys;
  values_ = base + at_values;
  out_values_ = base + at_out_values;
  if (words) {
    slot_words_ = reinterpret_cast<std::uint64_t*>(base + at_slot_words);
    out_slot_words_ = reinterpret_cast<std::uint64_t*>(base + at_out_slot_words);
  }
}

void Batch::set(std::size_t row, OpKind kind, std::string_view key, std::string_view value) {
  if (row >= capacity_) {
    throw Error(Error::Code::kInvalidArgument,
                "row " + std::to_string(row) + " is past the batch's " + std::to_string(capacity_) + " rows");
  }
  if (key.empty() || key.size() > key_width_) {
    throw Error(Error::Code::kInvalidArgument, "a key has 1.." + std::to_string(key_width_) + " bytes, not " +
                                                   std::to_string(key.size()));
  }
  const bool writes = carries_value(kind);
  if (writes && value.size() > value_width_) {
    throw Error(Error::Code::kInvalidArgument, "a value has at most " + std::to_string(value_width_) + " bytes, not " +
                                                   std::to_string(value.size()));
  }
  ops_[row] = static_cast<std::uint8_t>(kind);
  key_lens_[row] = static_cast<std::uint8_t>(key.size());
  std::memcpy(keys_ + row * key_width_, key.data(), key.size());
  value_lens_[row] = writes ? static_cast<std::uint32_t>(value.size()) : 0;
  if (writes && !value.empty()) std::memcpy(values_ + row * value_stride_, value.data(), value.size());
}

void Batch::check_range(std::size_t first, std::size_t count) const {
  if (first > capacity_ || count > capacity_ - first) {
    throw Error(Error::Code::kInvalidArgument, "rows " + std::to_string(first) + ".." + std::to_string(first + count) +
                                                   " are past the batch's " + std::to_string(capacity_) + " rows");
  }
}

BatchIn Batch::in(std::size_t first, std::size_t count) const {
  check_range(first, count);
  return BatchIn{count,
                 ops_ + first,
                 keys_ + first * key_width_,
                 key_lens_ + first,
                 values_ + first * value_stride_,
                 value_lens_ + first,
                 slot_words_ == nullptr ? nullptr : slot_words_ + first};
}

BatchOut Batch::out(std::size_t first, std::size_t count) const {
  check_range(first, count);
  return BatchOut{status_ + first, out_values_ + first * value_stride_, out_value_lens_ + first,
                  out_slot_words_ == nullptr ? nullptr : out_slot_words_ + first};
}

}  // namespace gpukv
