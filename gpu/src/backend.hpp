// The interface both backends implement behind gpukv::Table, and the helpers they share.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <type_traits>

#include "geometry.hpp"
#include "detail/batch_ref.hpp"
#include "detail/pass_runner.hpp"
#include "detail/table_ref.hpp"
#include "gpukv/table.hpp"
#include "gpukv/types.hpp"

namespace gpukv::detail {

enum class Memory { kHost, kDevice };

class Backend {
 public:
  virtual ~Backend() = default;
  // A batch of any size, run as passes of at most config.max_batch ops. Synchronous: every result is written
  // on return.
  virtual void execute(const BatchIn& in, const BatchOut& out, Memory memory) = 0;
  // Table::allocate_host and Table::prefetch (a backend with nothing to copy ignores the latter).
  virtual HostMemory allocate_host(std::size_t bytes) = 0;
  virtual void prefetch(const BatchIn& /*in*/) {}
  // Called once a batch call (all its passes) has finished.
  virtual void batch_done(std::uint64_t /*ops*/) {}
  virtual bool cleanup() = 0;
  // Table::slot_count, export_items (`out` in host memory) and hold_cleanup.
  virtual std::uint64_t slot_count() const = 0;
  virtual std::uint64_t export_items(std::uint64_t from, std::uint64_t slots, const ItemColumns& out) = 0;
  virtual void hold_cleanup(bool hold) = 0;
  virtual TableStats stats() const = 0;
  virtual std::string device_name() const = 0;
};

std::unique_ptr<Backend> make_gpu_backend(const TableConfig& config, const Geometry& geometry);
bool gpu_present();

// Calls f(TableRef<Bits, P, KeyWords>{}) for the configuration's ticket size and probing, with the key
// width fixed by the caller: the one place where runtime settings become template arguments. Backends
// instantiate one key width per translation unit, so the builds of the three run in parallel.
template <std::uint32_t KeyWords, class F>
decltype(auto) with_table_type(const TableConfig& config, F&& f) {
  const bool group = config.probing == Probing::kGroup;
  switch (config.ticket_bits) {
    case 2:
      return group ? f(TableRef<2, Probing::kGroup, KeyWords>{}) : f(TableRef<2, Probing::kSingle, KeyWords>{});
    case 4:
      return group ? f(TableRef<4, Probing::kGroup, KeyWords>{}) : f(TableRef<4, Probing::kSingle, KeyWords>{});
    default:
      return group ? f(TableRef<8, Probing::kGroup, KeyWords>{}) : f(TableRef<8, Probing::kSingle, KeyWords>{});
  }
}

// The backends' factories for one key width (KeyWords = key_width / 8); each width is instantiated in a
// translation unit of its own (src/cpu/cpu_backend_key*.cpp, src/cuda/gpu_backend_key*.cu).
template <std::uint32_t KeyWords>
std::unique_ptr<Backend> make_cpu_backend_for(const TableConfig& config, const Geometry& geometry);
template <std::uint32_t KeyWords>
std::unique_ptr<Backend> make_gpu_backend_for(const TableConfig& config, const Geometry& geometry);

// Calls make(std::integral_constant<std::uint32_t, KeyWords>{}) for the geometry's key width.
template <class Make>
std::unique_ptr<Backend> by_key_width(const Geometry& geometry, Make&& make) {
  switch (geometry.key_words) {
    case 1: return make(std::integral_constant<std::uint32_t, 1>{});
    case 2: return make(std::integral_constant<std::uint32_t, 2>{});
    default: return make(std::integral_constant<std::uint32_t, 4>{});
  }
}

// A tier's TableRef over its memory: `board` (board_bytes()) and `slots` (slot_bytes()); in the line
// layout the tickets are in `slots` and `board` is unused. A tier that does not exist (capacity 0) gets
// units == 0 and null pointers; `tags` is null for the device tier.
template <class Ref>
Ref make_table_ref(const Geometry& g, const TierGeometry& tier, std::uint64_t* board, std::uint8_t* slots,
                   std::uint8_t* tags) {
  using Codec = typename Ref::Codec;
  Ref ref;
  if (tier.layout == SlotLayout::kLine) {
    ref.board.words = reinterpret_cast<std::uint64_t*>(slots);
    ref.board.stride = kLineBytes / sizeof(std::uint64_t);
    ref.slots = slots == nullptr ? nullptr : slots + kLineSlotsOffset;
    ref.lens = slots == nullptr ? nullptr : slots + kLineLensOffset;
    ref.lens_stride = tier.len_bits / 4;  // two lengths per slot
  } else {
    ref.board.words = board;
    ref.board.stride = 1;
    ref.slots = slots == nullptr ? nullptr : slots + kSlotHeaderBytes;
    ref.lens = slots;
    ref.lens_stride = tier.slot_stride;
  }
  ref.len_bits = tier.len_bits;
  ref.tags = tags;
  ref.units = tier.units;
  ref.positions = tier.positions;
  ref.unit_lanes = 0;
  for (std::uint32_t field = 0; field < tier.unit_slots && field < Codec::kPerWord; ++field) {
    ref.unit_lanes |= std::uint64_t{1} << (field * Codec::kBits + Codec::kBits - 1);
  }
  ref.value_stride = g.value_stride;
  ref.slot_stride = tier.slot_stride;
  ref.word_slots_stride = tier.word_slots_stride;
  ref.slot_word_offset = tier.slot_word_offset;
  ref.value_fill_end = tier.value_fill_end;
  return ref;
}

inline TierLimits limits_of(const TierGeometry& t) {
  return TierLimits{t.capacity, t.max_items, t.cleanup_tombstones, t.crowded_tombstones};
}

inline std::unique_ptr<Backend> make_cpu_backend(const TableConfig& config, const Geometry& geometry) {
  return by_key_width(geometry, [&](auto key_words) { return make_cpu_backend_for<key_words.value>(config, geometry); });
}

// Ops [begin, begin + n) of a batch's columns (n clipped at its end), for a backend that runs a batch in
// host memory one pass at a time.
inline BatchIn part_of(const BatchIn& in, std::uint64_t begin, std::uint64_t n, std::uint32_t key_width,
                       std::uint32_t value_stride) {
  return BatchIn{std::min<std::uint64_t>(n, in.size - begin),
                 in.ops + begin,
                 in.keys + begin * key_width,
                 in.key_lens + begin,
                 in.values == nullptr ? nullptr : in.values + begin * value_stride,
                 in.value_lens == nullptr ? nullptr : in.value_lens + begin,
                 in.slot_words == nullptr ? nullptr : in.slot_words + begin};
}
inline BatchOut part_of(const BatchOut& out, std::uint64_t begin, std::uint32_t value_stride) {
  return BatchOut{out.status + begin, out.values == nullptr ? nullptr : out.values + begin * value_stride,
                  out.value_lens == nullptr ? nullptr : out.value_lens + begin,
                  out.slot_words == nullptr ? nullptr : out.slot_words + begin};
}

inline BatchRef make_batch_ref(const TableConfig& c, const Geometry& g, const BatchIn& in, const BatchOut& out) {
  return BatchRef{in.size,      in.ops,     in.keys,        in.key_lens,     in.values,
                  in.value_lens, out.status, out.values,     out.value_lens,  in.slot_words,
                  out.slot_words, c.key_width, c.value_width, g.value_stride};
}

inline TableStats make_stats(const Geometry& g, const Counters& c, const PassStats& p) {
  const auto tier = [&](const TierGeometry& t, std::uint64_t items, std::uint64_t tombstones) {
    TierStats s;
    s.items = items;
    s.tombstones = tombstones;
    s.capacity = t.capacity;
    s.max_items = t.max_items;
    s.board_bytes = t.board_bytes() + t.tag_bytes;
    s.slot_bytes = t.slot_bytes();
    return s;
  };
  TableStats s;
  s.device = tier(g.device, c.items, c.tombstones);
  s.host = tier(g.host, c.host_items, c.host_tombstones);
  s.host_reads = c.host_reads;
  s.host_writes = c.host_writes;
  s.host_avoided = c.host_avoided;
  s.batches = p.passes;
  s.conflict_ops = p.conflict_ops;
  s.cleanups = p.cleanups;
  s.cleanups_skipped = p.cleanups_skipped;
  s.optimistic_passes = p.optimistic_passes;
  s.optimistic_failures = p.optimistic_failures;
  return s;
}

}  // namespace gpukv::detail
