#include "shard_filter.hpp"

#include <stdexcept>

namespace gpukv::server {

ShardFilter::ShardFilter(std::uint32_t shard_index, std::uint32_t shard_count) : index_(shard_index), map_(shard_count) {
  if (shard_index >= shard_count) {
    throw std::invalid_argument("shard_index must be below shard_count (" + std::to_string(shard_count) + "), got " +
                                std::to_string(shard_index));
  }
}

ShardFilter::Foreign ShardFilter::foreign_ops(const CallOps& ops) const {
  Foreign foreign;
  if (map_.shard_count() == 1) return foreign;
  // The service has checked that key lengths add up to the keys.
  std::size_t offset = 0;
  for (std::size_t i = 0; i < ops.count; ++i) {
    const std::string_view key = ops.keys.substr(offset, ops.key_lengths[i]);
    offset += ops.key_lengths[i];
    if (const std::uint32_t owner = map_.shard_of(key); owner != index_) {
      foreign.ops.push_back(static_cast<std::uint32_t>(i));
      foreign.owners.push_back(owner);
    }
  }
  return foreign;
}

OwnedPart::OwnedPart(const CallOps& ops, CallResults* results, std::vector<std::uint32_t> foreign)
    : call_results_(results), foreign_(std::move(foreign)), count_(ops.count) {
  const std::size_t owned = ops.count - foreign_.size();
  key_lengths_.reserve(owned);
  if (!ops.kinds.empty()) kinds_.reserve(owned);
  std::size_t key_offset = 0, value_offset = 0, write_index = 0, next_foreign = 0;
  for (std::size_t i = 0; i < ops.count; ++i) {
    const std::uint8_t kind = kind_at(ops, i);
    const std::uint32_t key_len = ops.key_lengths[i];
    const bool write = carries_value(kind);
    const std::uint32_t value_len = write ? ops.value_lengths[write_index++] : 0;
    const bool is_foreign = next_foreign < foreign_.size() && foreign_[next_foreign] == i;
    if (is_foreign) {
      ++next_foreign;
    } else {
      if (!ops.kinds.empty()) kinds_.push_back(static_cast<char>(kind));
      keys_.append(ops.keys.substr(key_offset, key_len));
      key_lengths_.push_back(key_len);
      if (write) {
        values_.append(ops.values.substr(value_offset, value_len));
        value_lengths_.push_back(value_len);
      }
    }
    key_offset += key_len;
    value_offset += value_len;
  }
  owned_.count = owned;
  owned_.kinds = kinds_;
  owned_.kind = ops.kind;
  owned_.keys = keys_;
  owned_.key_lengths = key_lengths_.data();
  owned_.values = values_;
  owned_.value_lengths = value_lengths_.data();
  results_.assign(owned, '\0');
  owned_results_.results = results_.data();
  owned_results_.values = call_results_->values;
  if (call_results_->value_lengths != nullptr) {
    owned_value_lengths_.assign(owned, 0);
    owned_results_.value_lengths = owned_value_lengths_.data();
  }
}

void OwnedPart::scatter() {
  std::size_t next_foreign = 0, j = 0;
  for (std::size_t i = 0; i < count_; ++i) {
    if (next_foreign < foreign_.size() && foreign_[next_foreign] == i) {
      call_results_->results[i] = kWrongShard;
      ++next_foreign;
      continue;
    }
    call_results_->results[i] = results_[j];
    if (call_results_->value_lengths != nullptr) call_results_->value_lengths[i] = owned_value_lengths_[j];
    ++j;
  }
  call_results_->values_size = owned_results_.values_size;
}

}  // namespace gpukv::server
