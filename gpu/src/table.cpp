#include "gpukv/table.hpp"

#include <algorithm>
#include <cstdint>

#include "backend.hpp"

namespace gpukv {

const char* to_string(OpKind kind) {
  switch (kind) {
    case OpKind::kGet: return "GET";
    case OpKind::kPut: return "PUT";
    case OpKind::kPutIfAbsent: return "PUT_IF_ABSENT";
    case OpKind::kDelete: return "DELETE";
  }
  return "UNKNOWN";
}

const char* to_string(OpStatus status) {
  switch (status) {
    case OpStatus::kOk: return "OK";
    case OpStatus::kNotFound: return "NOT_FOUND";
    case OpStatus::kExists: return "EXISTS";
    case OpStatus::kFull: return "FULL";
    case OpStatus::kInvalid: return "INVALID";
  }
  return "UNKNOWN";
}

const char* to_string(BackendKind kind) {
  switch (kind) {
    case BackendKind::kAuto: return "auto";
    case BackendKind::kCpu: return "cpu";
    case BackendKind::kGpu: return "gpu";
  }
  return "unknown";
}

const char* to_string(Probing probing) { return probing == Probing::kGroup ? "group" : "single"; }

const char* to_string(SlotLayout layout) {
  switch (layout) {
    case SlotLayout::kBoard: return "board";
    case SlotLayout::kLine: return "line";
    case SlotLayout::kAuto: return "auto";
  }
  return "unknown";
}

const char* to_string(LaneMode mode) {
  switch (mode) {
    case LaneMode::kAuto: return "auto";
    case LaneMode::kStash: return "stash";
    case LaneMode::kClStash: return "clstash";
    case LaneMode::kSplit: return "split";
  }
  return "unknown";
}

const char* to_string(OptimisticInserts mode) {
  switch (mode) {
    case OptimisticInserts::kAuto: return "auto";
    case OptimisticInserts::kOff: return "off";
    case OptimisticInserts::kAlways: return "always";
  }
  return "unknown";
}

bool Table::gpu_available() { return detail::gpu_present(); }

void Table::check(const TableConfig& config) { static_cast<void>(detail::make_geometry(config)); }

Table::Table(const TableConfig& config) : config_(config) {
  backend_ = config.backend;
  if (backend_ == BackendKind::kAuto) backend_ = gpu_available() ? BackendKind::kGpu : BackendKind::kCpu;
  config_.slot_layout = detail::pick_slot_layout(config, backend_);
  const detail::Geometry geometry = detail::make_geometry(config_);
  if (backend_ == BackendKind::kGpu) {
    if (!gpu_available()) throw Error(Error::Code::kNoDevice, "backend gpu asked for, but no CUDA device is usable");
    impl_ = detail::make_gpu_backend(config_, geometry);
  } else {
    impl_ = detail::make_cpu_backend(config_, geometry);
  }
}

Table::~Table() = default;

void Table::run(const BatchIn& in, const BatchOut& out, bool on_device) {
  if (in.size == 0) return;
  if ((in.ops == nullptr || in.keys == nullptr || in.key_lens == nullptr || out.status == nullptr)) {
    throw Error(Error::Code::kInvalidArgument, "batch columns ops, keys, key_lens and status are required");
  }
  if ((out.values == nullptr) != (out.value_lens == nullptr)) {
    throw Error(Error::Code::kInvalidArgument, "BatchOut.values and BatchOut.value_lens go together");
  }
  if (!config_.slot_word && (in.slot_words != nullptr || out.slot_words != nullptr)) {
    throw Error(Error::Code::kInvalidArgument, "slot_words columns given to a table without slot words (TableConfig::slot_word)");
  }
  if (out.slot_words != nullptr && out.values == nullptr) {
    throw Error(Error::Code::kInvalidArgument, "BatchOut.slot_words needs BatchOut.values: a GET answers its word with its value");
  }
  const auto misaligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 8 != 0; };
  if (misaligned(in.keys) || misaligned(in.values) || misaligned(out.values) || misaligned(in.slot_words) ||
      misaligned(out.slot_words)) {
    throw Error(Error::Code::kInvalidArgument, "key, value and slot word columns must be 8-byte aligned");
  }
  std::lock_guard lock(mutex_);
  impl_->execute(in, out, on_device ? detail::Memory::kDevice : detail::Memory::kHost);
  impl_->batch_done(in.size);
}

void Table::execute(const BatchIn& in, const BatchOut& out) { run(in, out, false); }

HostMemory Table::allocate_host(std::size_t bytes) { return impl_->allocate_host(bytes); }

void Table::prefetch(const BatchIn& in) {
  if (in.size == 0 || in.size > config_.max_batch || in.ops == nullptr || in.keys == nullptr || in.key_lens == nullptr) return;
  impl_->prefetch(in);
}

void Table::execute_on_device(const BatchIn& in, const BatchOut& out) {
  if (backend_ != BackendKind::kGpu) {
    throw Error(Error::Code::kInvalidArgument, "execute_on_device needs the GPU backend");
  }
  run(in, out, true);
}

bool Table::cleanup() {
  std::lock_guard lock(mutex_);
  return impl_->cleanup();
}

std::uint64_t Table::slot_count() const {
  std::lock_guard lock(mutex_);
  return impl_->slot_count();
}

std::size_t Table::export_items(std::uint64_t from, std::uint64_t slots, const ItemColumns& out) {
  if (slots == 0) return 0;
  if (out.keys == nullptr || out.key_lens == nullptr || out.values == nullptr || out.value_lens == nullptr) {
    throw Error(Error::Code::kInvalidArgument, "export_items needs all four item columns");
  }
  if (!config_.slot_word && out.slot_words != nullptr) {
    throw Error(Error::Code::kInvalidArgument, "a slot_words column given to a table without slot words (TableConfig::slot_word)");
  }
  const auto misaligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 8 != 0; };
  if (misaligned(out.keys) || misaligned(out.values) || misaligned(out.value_lens) || misaligned(out.slot_words)) {
    throw Error(Error::Code::kInvalidArgument, "item columns must be 8-byte aligned");
  }
  std::lock_guard lock(mutex_);
  const std::uint64_t count = impl_->slot_count();
  if (from >= count) return 0;
  return impl_->export_items(from, std::min(slots, count - from), out);  // no end past the last slot, nor overflow
}

void Table::hold_cleanup(bool hold) {
  std::lock_guard lock(mutex_);
  impl_->hold_cleanup(hold);
}

TableStats Table::stats() const {
  std::lock_guard lock(mutex_);
  return impl_->stats();
}

std::string Table::device_name() const { return impl_->device_name(); }

}  // namespace gpukv
