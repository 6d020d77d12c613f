// An owned batch of operations for Table::execute: the columns BatchIn and BatchOut describe (kinds, keys at
// key_width, key lengths, values at the table's value stride, value lengths, the results, and for a table
// with slot words a word per row in and out), 8-byte aligned,
// in memory the table copies from fastest (Table::allocate_host: pinned on the GPU backend), for up to
// `capacity` rows. Rows are filled with set() or through the raw columns; in() and out() are views of a
// range of rows, so one Batch can run in slices (a server's staging, a benchmark's passes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "gpukv/table.hpp"
#include "gpukv/types.hpp"

namespace gpukv {

class Batch {
 public:
  // Columns for `capacity` rows at `table`'s widths, from table.allocate_host (zeroed). The memory is the
  // batch's own and may outlive the table. Throws Error(kOutOfMemory).
  Batch(Table& table, std::size_t capacity);

  std::size_t capacity() const { return capacity_; }
  std::uint32_t key_width() const { return key_width_; }
  std::uint32_t value_width() const { return value_width_; }
  std::uint32_t value_stride() const { return value_stride_; }

  // Row `row`'s op: its kind, key and, for an op that carries a value (carries_value), its value. Throws
  // Error(kInvalidArgument), changing nothing, for a row past the capacity, a key of no bytes or more than
  // key_width, or a value longer than value_width.
  void set(std::size_t row, OpKind kind, std::string_view key, std::string_view value = {});

  // Views of rows [first, first + count) for Table::execute. Throws Error(kInvalidArgument) for a range past
  // the capacity.
  BatchIn in(std::size_t first, std::size_t count) const;
  BatchOut out(std::size_t first, std::size_t count) const;

  // A row's result after execute(): its status, and for a GET that found its key, the value.
  OpStatus status(std::size_t row) const { return static_cast<OpStatus>(status_[row]); }
  std::string_view value(std::size_t row) const {
    return {reinterpret_cast<const char*>(out_values_ + row * value_stride_), out_value_lens_[row]};
  }

  // The raw columns, for callers that fill many rows at once (row i's key at keys() + i * key_width(), its
  // value at values() + i * value_stride()).
  std::uint8_t* ops() const { return ops_; }
  std::uint8_t* keys() const { return keys_; }
  std::uint8_t* key_lens() const { return key_lens_; }
  std::uint8_t* values() const { return values_; }
  std::uint32_t* value_lens() const { return value_lens_; }
  std::uint8_t* statuses() const { return status_; }
  std::uint8_t* out_values() const { return out_values_; }
  std::uint32_t* out_value_lens() const { return out_value_lens_; }
  // Row i's slot word, which a write stores (zero unless set), and a GET's answer of it: null for a table
  // without slot words.
  std::uint64_t* slot_words() const { return slot_words_; }
  std::uint64_t* out_slot_words() const { return out_slot_words_; }

 private:
  void check_range(std::size_t first, std::size_t count) const;

  std::size_t capacity_;
  std::uint32_t key_width_, value_width_, value_stride_;
  HostMemory memory_;
  std::uint8_t *ops_, *key_lens_, *status_;
  std::uint32_t *value_lens_, *out_value_lens_;
  std::uint8_t *keys_, *values_, *out_values_;
  std::uint64_t* slot_words_ = nullptr;
  std::uint64_t* out_slot_words_ = nullptr;
};

}  // namespace gpukv
