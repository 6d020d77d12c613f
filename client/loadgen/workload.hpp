// What gpukv-load sends: keys drawn uniformly or by zipf from a key space, op kinds drawn from a mix, and
// one fixed value. Keys are written into a buffer ("key:<n>"), so drawing one allocates nothing.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>

#include "gpukv/v1/kv.pb.h"

namespace gpukv::load {

struct Mix {
  std::uint64_t keys = 1000000;  // key space
  bool zipf = false;
  double zipf_exponent = 0.99;
  double get = 0.5;              // shares; the rest of 1 - get - put are DELETEs
  double put = 0.45;
};

class Workload {
 public:
  Workload(const Mix& mix, std::uint64_t seed) : mix_(mix), rng_(seed) {}

  v1::OpKind next_kind() {
    const double r = uniform_(rng_);
    return r < mix_.get ? v1::OP_GET : r < mix_.get + mix_.put ? v1::OP_PUT : v1::OP_DELETE;
  }

  // Valid until the next call.
  std::string_view next_key() {
    const std::uint64_t k = next_index();
    char* end = std::to_chars(key_ + 4, key_ + sizeof key_, k).ptr;
    return {key_, static_cast<std::size_t>(end - key_)};
  }

 private:
  // Zipf over [0, n) by inverting the continuous approximation of its CDF: cheap per draw, close enough to
  // concentrate load the way a skewed workload does.
  std::uint64_t next_index() {
    const std::uint64_t n = mix_.keys;
    if (!mix_.zipf) return std::uniform_int_distribution<std::uint64_t>(0, n - 1)(rng_);
    const double u = uniform_(rng_), s = mix_.zipf_exponent, dn = static_cast<double>(n);
    const double x = s == 1.0 ? std::pow(dn, u) : std::pow(u * (std::pow(dn, 1 - s) - 1) + 1, 1 / (1 - s));
    return std::min<std::uint64_t>(n - 1, static_cast<std::uint64_t>(std::max(1.0, x)) - 1);
  }

  const Mix mix_;
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> uniform_{0, 1};
  char key_[24] = {'k', 'e', 'y', ':'};
};

}  // namespace gpukv::load
