// What gpukv-load sends: keys drawn uniformly or by zipf from a key space, op kinds drawn from a mix, and
// one fixed value. Keys are written into a buffer ("key:<n>", or n's 8 bytes), so drawing one allocates
// nothing.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
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
  // Keys as n's 8 bytes (little-endian) rather than "key:<n>": for a server of 8-byte keys, where the text
  // form leaves 10^4 keys at most.
  bool binary_keys = false;
  // Mixed into every caller's draws: runs of the same seed draw the same keys caller by caller; another seed
  // draws others (a second load of new keys, say).
  std::uint64_t seed = 0;
};

class Workload {
 public:
  // Caller `caller`'s draws, the same in every run of the mix's seed. SplitMix64 steps its state by a fixed
  // odd constant, so two start states are one sequence shifted: the seed enters scrambled (0 stays 0), so that
  // seeds 1 and 2 start far apart on it rather than a few draws (seed * the constant is seed draws).
  Workload(const Mix& mix, std::uint32_t caller)
      : mix_(mix), state_(std::uint64_t{caller} * 7919 + 1 + scramble(mix.seed)) {}

  v1::OpKind next_kind() {
    const double r = uniform();
    return r < mix_.get ? v1::OP_GET : r < mix_.get + mix_.put ? v1::OP_PUT : v1::OP_DELETE;
  }

  // Valid until the next call.
  std::string_view next_key() {
    const std::uint64_t k = next_index();
    if (mix_.binary_keys) {
      std::memcpy(key_, &k, sizeof k);  // x86 and Arm servers are little-endian: every client writes the same bytes
      return {key_, sizeof k};
    }
    char* end = std::to_chars(key_ + 4, key_ + sizeof key_, k).ptr;
    return {key_, static_cast<std::size_t>(end - key_)};
  }

 private:
  // Zipf over [0, n) by inverting the continuous approximation of its CDF: cheap per draw, close enough to
  // concentrate load the way a skewed workload does.
  std::uint64_t next_index() {
    const std::uint64_t n = mix_.keys;
    if (!mix_.zipf) return static_cast<std::uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);  // [0, n)
    const double u = uniform(), s = mix_.zipf_exponent, dn = static_cast<double>(n);
    const double x = s == 1.0 ? std::pow(dn, u) : std::pow(u * (std::pow(dn, 1 - s) - 1) + 1, 1 / (1 - s));
    return std::min<std::uint64_t>(n - 1, static_cast<std::uint64_t>(std::max(1.0, x)) - 1);
  }

  // SplitMix64: a few instructions per draw, since gpukv-load shares the cores with the server it measures
  // (a Mersenne Twister and its distributions cost a tenth of a core at 10 M keys/s).
  std::uint64_t next() { return scramble(state_ += 0x9E3779B97F4A7C15ull); }
  // SplitMix64's output function.
  static std::uint64_t scramble(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)

  const Mix mix_;
  std::uint64_t state_;
  char key_[24] = {'k', 'e', 'y', ':'};  // binary keys overwrite the prefix: each Workload has one form
};

}  // namespace gpukv::load
