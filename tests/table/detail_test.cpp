// Direct tests of three pieces of the table's algorithm (gpu/src/detail) that the model tests reach only
// through whole batches: the ticket codec's SWAR matching, the key hash and probe plan, and the batch
// grouping of same-key operations. Each is checked against a plain per-field or per-key computation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "detail/batch_groups.hpp"
#include "detail/key_hash.hpp"
#include "detail/ticket_board.hpp"

namespace gpukv::detail {
namespace {

// ---- the ticket codec -----------------------------------------------------------------------------------

template <class T>
class TicketCodecTest : public ::testing::Test {};
template <int B>
struct Width {
  static constexpr int kBits = B;
};
using Widths = ::testing::Types<Width<2>, Width<4>, Width<8>>;
TYPED_TEST_SUITE(TicketCodecTest, Widths);

// The fields of `word` for which pred(code) holds, as the codec flags them: each field's top bit.
template <class Codec, class Pred>
std::uint64_t fields_where(std::uint64_t word, Pred pred) {
  std::uint64_t mask = 0;
  for (int f = 0; f < Codec::kPerWord; ++f) {
    if (pred(Codec::field_code(word, f))) mask |= std::uint64_t{1} << (f * Codec::kBits + Codec::kBits - 1);
  }
  return mask;
}

// The SWAR tests are exact, with no borrow between fields: over random words (and words of every code in
// every field, where borrows would show), match, empty and available flag exactly the fields a per-field
// comparison flags.
TYPED_TEST(TicketCodecTest, SwarMatchingFlagsExactlyTheFieldsHoldingTheCode) {
  using Codec = TicketCodec<TypeParam::kBits>;
  std::mt19937_64 rng(7);
  std::vector<std::uint64_t> words;
  for (int i = 0; i < 20000; ++i) words.push_back(rng());
  for (std::uint64_t c = 0; c <= Codec::kFieldMask; ++c) {
    words.push_back(c * Codec::broadcast(1));                        // every field c
    words.push_back((c * Codec::broadcast(1)) ^ Codec::kFieldMask);  // all but the lowest field c
  }
  for (const std::uint64_t word : words) {
    for (std::uint64_t code = 0; code <= Codec::kFieldMask; ++code) {
      ASSERT_EQ(Codec::match(word, code), fields_where<Codec>(word, [&](std::uint64_t f) { return f == code; }))
          << std::hex << word << " code " << code;
    }
    ASSERT_EQ(Codec::empty(word), fields_where<Codec>(word, [](std::uint64_t f) { return f == Codec::kEmpty; }));
    ASSERT_EQ(Codec::available(word),
              fields_where<Codec>(word, [](std::uint64_t f) { return f == Codec::kEmpty || f == Codec::kTombstone; }));
  }
}

TYPED_TEST(TicketCodecTest, FieldOfAMatchIsTheFieldThatHoldsTheCode) {
  using Codec = TicketCodec<TypeParam::kBits>;
  for (int field = 0; field < Codec::kPerWord; ++field) {
    const std::uint64_t word = Codec::kTombstone << (field * Codec::kBits);  // one tombstone, the rest EMPTY
    const std::uint64_t mask = Codec::match(word, Codec::kTombstone);
    ASSERT_NE(mask, 0u);
    EXPECT_EQ(Codec::field_of(mask), field);
    EXPECT_EQ(Codec::field_code(word, field), Codec::kTombstone);
  }
}

// Info codes are FULL codes (never EMPTY, BUSY or TOMBSTONE), and a uniform info spreads over all of them
// evenly: a foreign key's ticket matches with chance 1/(2^B - 3), as the board's design counts on.
TYPED_TEST(TicketCodecTest, InfoCodesAreFullCodesSpreadEvenly) {
  using Codec = TicketCodec<TypeParam::kBits>;
  EXPECT_EQ(Codec::info_code(0), Codec::kFirstFull);
  EXPECT_EQ(Codec::info_code(0xFFFFFFFFu), Codec::kFieldMask);
  std::mt19937 rng(11);
  std::vector<std::uint64_t> counts(Codec::kFieldMask + 1, 0);
  const int n = 1 << 20;
  for (int i = 0; i < n; ++i) ++counts[Codec::info_code(rng())];
  EXPECT_EQ(counts[Codec::kEmpty] + counts[Codec::kBusy] + counts[Codec::kTombstone], 0u);
  const double expected = static_cast<double>(n) / Codec::kFullCodes;
  for (std::uint64_t c = Codec::kFirstFull; c <= Codec::kFieldMask; ++c) {
    EXPECT_NEAR(static_cast<double>(counts[c]), expected, 0.06 * expected) << "code " << c;
  }
}

// ---- keys, their hash and probe plan ---------------------------------------------------------------------

// A key as the table stores it: at an 8-byte aligned address, with garbage past its length.
struct StoredKey {
  alignas(8) std::uint8_t bytes[32];
  explicit StoredKey(const std::string& key) {
    std::memset(bytes, 0xA5, sizeof bytes);
    key.copy(reinterpret_cast<char*>(bytes), sizeof bytes);
  }
};

std::uint64_t hash_of(const std::string& key, std::uint32_t key_words) {
  const StoredKey stored(key);
  return hash_key(load_key(stored.bytes, static_cast<std::uint32_t>(key.size()), key_words), key_words);
}

TEST(KeyHash, BytesPastTheLengthDoNotCountAndTheLengthDoes) {
  for (std::uint32_t key_words : {1u, 2u, 4u}) {
    StoredKey a("abc"), b("abc");
    b.bytes[5] = 0x11;  // garbage past the length differs
    EXPECT_EQ(hash_key(load_key(a.bytes, 3, key_words), key_words), hash_key(load_key(b.bytes, 3, key_words), key_words));
    const KeyWords k = load_key(b.bytes, 3, key_words);
    EXPECT_EQ(k.w[0], 0x636261u) << "bytes past the length are zeroed";
    // "ab" and "ab\0" are different keys.
    EXPECT_NE(hash_of("ab", key_words), hash_of(std::string("ab\0", 3), key_words));
    EXPECT_NE(hash_of("", key_words), hash_of(std::string("\0", 1), key_words));
  }
  EXPECT_NE(hash_of("12345678abcdefgh", 2), hash_of("12345678abcdefgX", 2)) << "the second word counts";
}

// The first probe unit spreads keys evenly over the units: 2^20 keys of a typical shape ("user:N") over 1000
// units pass a chi-square test of uniformity (999 degrees of freedom: mean 999, standard deviation 44.7; the
// bound is six deviations above, where a hash with a bias in its high bits lands far beyond).
TEST(KeyHash, FirstProbesSpreadSequentialKeysEvenly) {
  const std::uint64_t units = 1000;
  std::vector<int> counts(units, 0);
  const int n = 1 << 20;
  for (int i = 0; i < n; ++i) ++counts[plan_probe(hash_of("user:" + std::to_string(i), 2), units).first];
  const double mean = static_cast<double>(n) / units;
  double chi2 = 0;
  for (const int c : counts) chi2 += (c - mean) * (c - mean) / mean;
  const double dof = units - 1;
  EXPECT_LT(chi2, dof + 6 * std::sqrt(2 * dof)) << "first probe units are not uniform";
}

// Double hashing over a prime number of units visits every unit before it repeats one, for any key.
TEST(KeyHash, ProbeSequencesOverAPrimeVisitEveryUnit) {
  std::mt19937_64 rng(3);
  for (const std::uint64_t units : {2ull, 3ull, 101ull, 1009ull}) {
    for (int i = 0; i < 50; ++i) {
      const ProbePlan p = plan_probe(rng(), units);
      ASSERT_LT(p.first, units);
      ASSERT_GE(p.step, 1u);
      ASSERT_LE(p.step, units - 1);
      std::set<std::uint64_t> seen;
      std::uint64_t unit = p.first;
      for (std::uint64_t j = 0; j < units; ++j, unit = next_unit(unit, p.step, units)) {
        ASSERT_LT(unit, units);
        seen.insert(unit);
      }
      EXPECT_EQ(seen.size(), units) << "units " << units << " step " << p.step;
    }
  }
}

// ---- grouping a pass's ops by key -------------------------------------------------------------------------

// Every op of a key lands in one entry; an entry is shared exactly when two or more ops of the pass carry its
// tag (two keys whose hashes have the same tag bits share one, which only serialises them); every op but the
// first of a tag reports that it joined an entry.
// Both probe orders (GroupOp takes one by the table's size, groups_by_bucket).
class BatchGroups : public testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(ProbeOrders, BatchGroups, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& p) { return p.param ? "ByBucket" : "ByEntry"; });

TEST_P(BatchGroups, OpsOfOneKeyShareAnEntryAndOnlySharedEntriesAreFlagged) {
  const auto insert = GetParam() ? group_insert_by_bucket : group_insert_by_entry;
  std::mt19937_64 rng(5);
  const std::size_t ops = 20000;
  std::vector<std::uint64_t> keys(5000);
  for (auto& k : keys) k = rng();
  std::vector<std::uint64_t> hashes;
  for (std::size_t i = 0; i < ops; ++i) {
    // Most keys once, some several times, as a batch has them.
    hashes.push_back(i < 4000 ? keys[i] : keys[4000 + rng() % 1000]);
  }
  std::uint64_t size = 1;
  while (size < 2 * ops) size <<= 1;
  std::vector<std::uint32_t> groups(size, 0);
  std::vector<std::uint32_t> entry(ops);
  std::size_t joined = 0;
  for (std::size_t i = 0; i < ops; ++i) {
    bool j = false;
    entry[i] = insert(groups.data(), size - 1, hashes[i], j);
    joined += j;
  }

  std::map<std::uint32_t, int> tag_count;
  for (const std::uint64_t h : hashes) ++tag_count[group_tag(h)];
  std::map<std::uint64_t, std::uint32_t> entry_of_key;
  for (std::size_t i = 0; i < ops; ++i) {
    const auto [it, fresh] = entry_of_key.emplace(hashes[i], entry[i]);
    ASSERT_EQ(it->second, entry[i]) << "two ops of one key in different entries";
    ASSERT_EQ(groups[entry[i]] & ~kGroupShared, group_tag(hashes[i]));
    ASSERT_EQ(group_shared(groups.data(), entry[i]), tag_count[group_tag(hashes[i])] > 1) << "op " << i;
  }
  // Every op after the first of its tag joined an entry: the count that lets ExecuteOp skip the entries of
  // a pass where it is zero.
  std::size_t later_ops = 0;
  for (const auto& [tag, count] : tag_count) later_ops += static_cast<std::size_t>(count - 1);
  EXPECT_EQ(joined, later_ops);
  EXPECT_EQ(group_tag(0) & kGroupShared, 0u);
  EXPECT_NE(group_tag(0), 0u) << "a tag is never the empty entry";
}

}  // namespace
}  // namespace gpukv::detail
