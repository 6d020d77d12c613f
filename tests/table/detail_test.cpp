// Direct tests of pieces of the table's algorithm (gpu/src/detail) that the model tests reach only through
// whole batches: the ticket codec's SWAR matching, the key hash and probe plan, the batch grouping of
// same-key operations, which new keys may claim a line's EMPTY ticket FULL at once, and the zeros clean-up
// leaves in a line's emptied slots. Each is checked against a plain per-field or per-key computation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "backend.hpp"
#include "detail/batch_groups.hpp"
#include "detail/cleanup.hpp"
#include "detail/engine.hpp"
#include "detail/key_hash.hpp"
#include "detail/ticket_board.hpp"
#include "geometry.hpp"

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


// ---- a line's claims made FULL at once, and the zeros they rely on ----------------------------------------

using LineRef = TableRef<8, Probing::kGroup, 1>;

Probe probe_of(std::uint64_t word, std::uint32_t len) {
  Probe p{};
  p.key = KeyWords{{word & byte_mask(len), 0, 0, 0}, len};
  p.code = LineRef::Codec::info_code(plan_probe(hash_key(p.key, 1), 1009).info);
  return p;
}

// A reader that meets a ticket claimed FULL at once may read the slot's zeros (and, its lengths word loaded
// before the claim's, a key length of 0) instead of the new key. So a key may claim that way only if its
// code differs from the codes of the zero key of its length and of the empty key; a value CopyValues writes
// later, or a key of more than one word, never does.
TEST(FullClaims, OnlyKeysAZeroSlotCannotPassForClaimFullAtOnce) {
  Engine<LineRef> e{};
  PassRef pass{};
  pass.copy_later = false;
  e.pass = pass;
  const auto zero_code = [](std::uint32_t len) { return probe_of(0, len).code; };
  std::mt19937_64 rng(11);
  int full = 0, zero_like = 0;
  for (std::uint32_t len = 0; len <= 8; ++len) {
    EXPECT_EQ(e.full_claim_code(probe_of(0, len)), 0u) << "the zero key of length " << len;
    for (int i = 0; i < 20000; ++i) {
      const Probe p = probe_of(rng(), len);
      const bool like_zero = p.code == zero_code(len) || p.code == zero_code(0);
      if (like_zero && p.key.w[0] != 0) ++zero_like;
      ASSERT_EQ(e.full_claim_code(p), like_zero ? 0 : p.code) << "length " << len << " code " << p.code;
      full += !like_zero;
    }
  }
  EXPECT_GT(zero_like, 100) << "keys sharing a zero key's code were met";
  EXPECT_GT(full, 150000);
  e.pass.copy_later = true;
  EXPECT_EQ(e.full_claim_code(probe_of(0x1234, 8)), 0u) << "a value CopyValues writes later";
  Engine<TableRef<8, Probing::kGroup, 2>> wide{};
  wide.pass = pass;
  Probe p = probe_of(0x1234, 8);
  EXPECT_EQ(wide.full_claim_code(p), 0u) << "a key of two words";
}

// Clean-up leaves every line slot whose ticket it turns EMPTY with zero lengths and a zero key, as a new
// table has them: both the tombstones it clears and the keys it extracts to place again. A 600-slot line
// tier in host memory, filled to 0.8 with keys of 8 bytes, a third of them then deleted.
TEST(FullClaims, CleanupZeroesTheLineSlotsItEmpties) {
  using Codec = LineRef::Codec;
  TableConfig config;
  config.backend = BackendKind::kCpu;
  config.key_width = 8;
  config.value_width = 8;
  config.capacity = 600;
  config.slot_layout = SlotLayout::kLine;
  const Geometry g = make_geometry(config);
  ASSERT_EQ(g.device.layout, SlotLayout::kLine);
  std::vector<std::uint64_t> memory(g.device.slot_bytes() / 8, 0);
  const auto t = make_table_ref<LineRef>(g, g.device, nullptr, reinterpret_cast<std::uint8_t*>(memory.data()), nullptr);
  std::mt19937_64 rng(13);
  std::vector<std::uint64_t> slots;
  long long tombstones = 0;
  for (std::uint64_t i = 0; i < g.device.capacity * 8 / 10; ++i) {
    const KeyWords key{{rng() | 1, 0, 0, 0}, 8};
    const ProbePlan plan = plan_probe(hash_key(key, 1), t.units);
    std::uint64_t slot;
    ASSERT_TRUE(claim_ticket(t, plan.first, 0, plan.step, t.board.load(t.word_of(plan.first)), slot, tombstones,
                             Codec::info_code(plan.info)));
    t.store_lens(slot, SlotLens{8, 8});
    t.key_words_at(slot)[0] = key.w[0];
    t.value_words_at(slot)[0] = ~key.w[0];
    slots.push_back(slot);
  }
  for (std::size_t i = 0; i < slots.size(); i += 3) {
    const std::uint64_t word = slots[i] / Codec::kPerWord;
    const int field = static_cast<int>(slots[i] % Codec::kPerWord);
    t.board.flip(word, field, Codec::field_code(t.board.load(word), field), Codec::kTombstone);
  }
  const CleanupWord<LineRef> w{t, /*device_tier=*/true};  // a line is always the device tier
  std::vector<unsigned long long> regions(t.positions / kCleanupRegionSlots + 1, 0);
  Tally tally;
  for (std::uint64_t slot = 0; slot < t.positions; ++slot) CleanupCount<LineRef>{w, regions.data()}(slot, tally);
  unsigned long long at = 0;
  for (auto& r : regions) at += std::exchange(r, at);
  std::vector<std::uint8_t> buffer(static_cast<std::size_t>(at) * record_bytes(t) + 8);
  for (std::uint64_t slot = 0; slot < t.positions; ++slot) {
    CleanupExtract<LineRef>{w, buffer.data(), regions.data()}(slot, tally);
  }
  std::uint64_t emptied = 0;
  for (const std::uint64_t slot : slots) {
    if (Codec::field_code(t.board.load(slot / Codec::kPerWord), static_cast<int>(slot % Codec::kPerWord)) != Codec::kEmpty) {
      continue;
    }
    ++emptied;
    const SlotLens lens = t.load_lens(slot);
    EXPECT_EQ(lens.key, 0u) << "slot " << slot;
    EXPECT_EQ(lens.value, 0u) << "slot " << slot;
    EXPECT_EQ(t.key_words_at(slot)[0], 0u) << "slot " << slot;
  }
  EXPECT_EQ(emptied, (slots.size() + 2) / 3 + at) << "every tombstone and every extracted key left an EMPTY";
  EXPECT_GT(at, 0u) << "some keys were extracted";
}

}  // namespace
}  // namespace gpukv::detail
