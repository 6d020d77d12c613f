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
  const std::uint32_t key_width = rows_.key_width(), value_width = rows_.value_width(), stride = rows_.value_stride();
  std::size_t key_offset = s.key_offset, value_offset = s.value_offset, write_index = s.write_index;
  for (std::size_t j = 0; j < s.count; ++j) {
    const std::size_t i = s.first_op + j, row = s.row + j;
    const std::uint8_t kind = kind_at(ops, i);
    const std::uint32_t key_len = ops.key_lengths[i];
    const bool writes_value = carries_value(kind);
    const std::uint32_t value_len = writes_value ? ops.value_lengths[write_index] : 0;
    const bool valid = kind < kOpKindCount && key_len >= 1 && key_len <= key_width && value_len <= value_width;
    rows_.ops()[row] = valid ? kind : kRejectedOp;
    rows_.key_lens()[row] = valid ? static_cast<std::uint8_t>(key_len) : 0;
    if (valid) std::memcpy(rows_.keys() + row * key_width, ops.keys.data() + key_offset, key_len);
    rows_.value_lens()[row] = valid ? value_len : 0;
    counts.writes += valid && writes_value;
    counts.gets += valid && is_get(kind);
    if (valid && value_len != 0) std::memcpy(rows_.values() + row * stride, ops.values.data() + value_offset, value_len);
    key_offset += key_len;
    if (writes_value) {
      value_offset += value_len;
      ++write_index;
    }
  }
}

void StagedBatch::reject_rows(const Segment& s) { std::memset(rows_.ops() + s.row, kRejectedOp, s.count); }

bool StagedBatch::writes_in(const Segment& s) const {
  const std::uint8_t* ops = rows_.ops();
  return std::any_of(ops + s.row, ops + s.row + s.count, [](std::uint8_t op) {
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
  const std::uint32_t value_width = rows_.value_width(), stride = rows_.value_stride();
  const std::uint8_t* statuses = rows_.statuses();
  std::memcpy(r.results + s.first_op, statuses + s.row, s.count);
  std::size_t at = whole ? 0 : s.get_index * value_width;  // where the next GET's value goes
  for (std::size_t j = 0; j < s.count; ++j) {
    const std::size_t i = s.first_op + j, row = s.row + j;
    const std::uint8_t status = statuses[row];
    const std::uint8_t kind = kind_at(ops, i);
    if (is_get(kind)) {
      if (status == static_cast<std::uint8_t>(OpStatus::kOk)) {
        const std::uint32_t len = rows_.out_value_lens()[row];
        copy_value(r.values + at, rows_.out_values() + row * stride, len, value_width);
        r.value_lengths[i] = len;
        at += whole ? len : value_width;
      } else if (!whole) {
        at += value_width;
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
