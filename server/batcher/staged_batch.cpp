#include "staged_batch.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace gpukv::server {

const char* to_string(BatchState state) {
  switch (state) {
    case BatchState::kFree: return "Free";
    case BatchState::kFilling: return "Filling";
    case BatchState::kClosed: return "Closed";
    case BatchState::kReady: return "Ready";
    case BatchState::kRunning: return "Running";
    case BatchState::kLogging: return "Logging";
    case BatchState::kAnswering: return "Answering";
  }
  return "unknown";
}

namespace {

bool is_edge(BatchState from, BatchState to) {
  using S = BatchState;
  switch (from) {
    case S::kFree: return to == S::kFilling;
    case S::kFilling: return to == S::kClosed;
    case S::kClosed: return to == S::kReady;
    case S::kReady: return to == S::kRunning;
    case S::kRunning: return to == S::kLogging || to == S::kAnswering;
    case S::kLogging: return to == S::kAnswering;
    case S::kAnswering: return to == S::kFree;
  }
  return false;
}

// Copies a found value to `slot`, which has `width` bytes of room (the slot's size). The common widths go as
// fixed-size copies the compiler inlines, of the whole slot: a libc call per 8-byte value cost more than the
// copy, and the bytes past the value's length are overwritten by the next value or cut off at values_size.
void copy_value(char* slot, const std::uint8_t* value, std::uint32_t len, std::uint32_t width) {
  switch (width) {
    case 8: std::memcpy(slot, value, 8); return;
    case 16: std::memcpy(slot, value, 16); return;
    case 32: std::memcpy(slot, value, 32); return;
    case 64: std::memcpy(slot, value, 64); return;
    case 128: std::memcpy(slot, value, 128); return;
    default: std::memcpy(slot, value, len);
  }
}

}  // namespace

StagedBatch::StagedBatch(Table& table, std::size_t n, std::uint32_t key_width, std::uint32_t value_width,
                         std::uint32_t value_stride)
    : key_width_(key_width), value_width_(value_width), value_stride_(value_stride) {
  std::size_t bytes = 0;
  const auto column = [&](std::size_t size) {  // 8-byte aligned, as the table requires
    const std::size_t at = bytes;
    bytes += (size + 7) / 8 * 8;
    return at;
  };
  const std::size_t at_ops = column(n), at_key_lens = column(n), at_status = column(n);
  const std::size_t at_value_lens = column(n * 4), at_out_value_lens = column(n * 4);
  const std::size_t at_keys = column(n * key_width), at_values = column(n * value_stride);
  const std::size_t at_out_values = column(n * value_stride);
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
}

void StagedBatch::move_to(BatchState next) {
  if (!is_edge(state_, next)) {
    std::fprintf(stderr, "gpukv batcher: a staged batch moved from %s to %s\n", to_string(state_), to_string(next));
    std::abort();
  }
  state_ = next;
}

void StagedBatch::reset() {
  size = writes = gets = copies = 0;
  stage_time = {};
  segments.clear();
  prefetched = failed = false;
  report = BatchReport{};
}

void StagedBatch::copy_rows(const Segment& s, CopyCounts& counts) {
  const CallOps& ops = s.call->call.ops;
  std::size_t key_offset = s.key_offset, value_offset = s.value_offset, write_index = s.write_index;
  for (std::size_t j = 0; j < s.count; ++j) {
    const std::size_t i = s.first_op + j, row = s.row + j;
    const std::uint8_t kind = kind_at(ops, i);
    const std::uint32_t key_len = ops.key_lengths[i];
    const bool writes_value = carries_value(kind);
    const std::uint32_t value_len = writes_value ? ops.value_lengths[write_index] : 0;
    const bool valid = kind < kOpKindCount && key_len >= 1 && key_len <= key_width_ && value_len <= value_width_;
    ops_[row] = valid ? kind : kRejectedOp;
    key_lens_[row] = valid ? static_cast<std::uint8_t>(key_len) : 0;
    if (valid) std::memcpy(keys_ + row * key_width_, ops.keys.data() + key_offset, key_len);
    value_lens_[row] = valid ? value_len : 0;
    counts.writes += valid && writes_value;
    counts.gets += valid && is_get(kind);
    if (valid && value_len != 0) std::memcpy(values_ + row * value_stride_, ops.values.data() + value_offset, value_len);
    key_offset += key_len;
    if (writes_value) {
      value_offset += value_len;
      ++write_index;
    }
  }
}

void StagedBatch::reject_rows(const Segment& s) { std::memset(ops_ + s.row, kRejectedOp, s.count); }

bool StagedBatch::writes_in(const Segment& s) const {
  return std::any_of(ops_ + s.row, ops_ + s.row + s.count, [](std::uint8_t op) {
    return op == static_cast<std::uint8_t>(OpKind::kDelete) || carries_value(op);
  });
}

void StagedBatch::write_results(const Segment& s, ResultCounts& counts) const {
  CallState& c = *s.call;
  CallResults& r = *c.call.results;
  const CallOps& ops = c.call.ops;
  // Each segment writes only its own ops' entries, so segments of one call answered at once never meet. A
  // call's only segment packs its values as it goes; one of several writes each value at its GET's own slot
  // (the g-th GET's at g * value_width), and pack_values packs them once all are written.
  const bool whole = s.count == ops.count;
  std::memcpy(r.results + s.first_op, status_ + s.row, s.count);
  std::size_t at = whole ? 0 : s.get_index * value_width_;  // where the next GET's value goes
  for (std::size_t j = 0; j < s.count; ++j) {
    const std::size_t i = s.first_op + j, row = s.row + j;
    const std::uint8_t status = status_[row];
    const std::uint8_t kind = kind_at(ops, i);
    if (is_get(kind)) {
      if (status == static_cast<std::uint8_t>(OpStatus::kOk)) {
        const std::uint32_t len = out_value_lens_[row];
        copy_value(r.values + at, out_values_ + row * value_stride_, len, value_width_);
        r.value_lengths[i] = len;
        at += whole ? len : value_width_;
      } else if (!whole) {
        at += value_width_;
      }
    }
    if (kind < kOpKindCount && status < counts[kind].size()) counts[kind][status] += 1;
  }
  if (whole) {
    r.values_size = at;
    c.packed = true;
  }
}

void pack_values(CallResults& r, const CallOps& ops, std::uint32_t width) {
  // In place: a packed offset never exceeds its slot.
  std::size_t packed = 0;
  if (r.values != nullptr) {
    for (std::size_t i = 0, g = 0; i < ops.count; ++i) {
      if (!is_get(kind_at(ops, i))) continue;
      const std::uint32_t len = r.value_lengths[i];
      if (len != 0 && packed != g * width) std::memmove(r.values + packed, r.values + g * width, len);
      packed += len;
      ++g;
    }
  }
  r.values_size = packed;
}

}  // namespace gpukv::server
