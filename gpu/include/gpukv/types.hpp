// Public vocabulary of the gpukv table: operations, per-operation results, the table's settings and the
// column layout of a batch. Nothing here depends on CUDA, so the server and tests include it freely.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace gpukv {

// What one operation of a batch asks for. The values are part of the batch format (one byte per op).
enum class OpKind : std::uint8_t {
  kGet = 0,          // read the value of a key
  kPut = 1,          // insert the key, or overwrite its value if present
  kPutIfAbsent = 2,  // insert the key only if it is absent
  kDelete = 3,       // remove the key
};
inline constexpr std::uint8_t kOpKindCount = 4;

// Whether an op of this kind carries a value (PUT and PUT_IF_ABSENT): the batch's value columns hold one for it,
// and it may insert. The byte form takes a kind column's raw byte, where an unknown kind carries none.
constexpr bool carries_value(OpKind kind) { return kind == OpKind::kPut || kind == OpKind::kPutIfAbsent; }
constexpr bool carries_value(std::uint8_t kind) { return carries_value(static_cast<OpKind>(kind)); }

// The outcome of one operation. A miss is a result, not an error.
enum class OpStatus : std::uint8_t {
  kOk = 0,        // done; a GET also wrote the value
  kNotFound = 1,  // GET or DELETE of an absent key
  kExists = 2,    // PUT_IF_ABSENT of a present key; nothing changed
  kFull = 3,      // a write of a new key found no room; nothing changed
  kInvalid = 4,   // malformed operation (unknown kind, key or value too long); nothing changed
};

const char* to_string(OpKind kind);
const char* to_string(OpStatus status);

// Where the table runs. kAuto picks the GPU when one is present and the CPU otherwise.
enum class BackendKind : std::uint8_t { kAuto, kCpu, kGpu };

// How a probe visits the ticket-board. kGroup reads one 64-bit word of tickets per probe and matches all of
// them at once (SwissTable-style); kSingle visits one ticket per probe, as Stadium Hashing describes it.
enum class Probing : std::uint8_t { kGroup, kSingle };

// Where the device tier keeps its tickets. kBoard: on a ticket-board apart from the slots, as Stadium
// Hashing lays them out (the host tier always does: its board stays in GPU memory while its slots are in
// host memory). kLine: each probe unit is one 128-byte line holding its ticket word, a word of its slots'
// lengths and the slots it describes, so that a hit reads one line of memory where kBoard reads two; group
// probing only, and the line must hold at least kMinLineSlots slots of key_width + value_width bytes in the
// 112 bytes after those two words (7 slots for 8-byte keys and values; bench/RESULTS.md, issue 17).
// kAuto (the default): kLine on the GPU backend where a line holds kAutoLineSlots slots (key_width and
// value_width 8, group probing), kBoard otherwise. Measured on an H100 at 8 B / 8 B, the line runs
// hits 1.10-1.25x, inserts 1.00-1.11x and mixed batches 1.05-1.12x the board's, in 55% of its memory, and
// misses 0.81-0.93x; with wider slots (4 a line at 16 B / 8 B) the board wins nearly everything, and on the
// CPU backend, whose board stays in its caches, the board's misses run twice the line's at load 0.9
// (bench/RESULTS.md, issue 17, "the line as the default layout"). Table::config() reports the layout picked.
enum class SlotLayout : std::uint8_t { kBoard, kLine, kAuto };
inline constexpr std::uint32_t kAutoLineSlots = 7;
inline constexpr std::uint32_t kLineBytes = 128;
inline constexpr std::uint32_t kMinLineSlots = 3;

// How the GPU schedules the lanes of a warp for the probing step. kAuto is the hybrid: clStash for a pass
// that mixes reads and writes, or that begins with the table's load past TableConfig::clstash_load; Stash
// otherwise; but a pass of 512K ops or more that mixes reads and writes of values the probing step copies (16
// bytes or less) is split by kind, as kSplit splits every mixed pass: its other ops in one Stash kernel, then
// its PUTs in another (bench/RESULTS.md has the measurements behind this rule). A kLine tier's batches of new
// keys run Stash whatever the mode (their compares read from L2, in a kernel of their own), and under kAuto so
// does any pass of a kLine tier that follows a pass of new keys, but for a call's first passes of more than 2M
// ops, which run split if they turn out mixed. The CPU backend has no lanes and ignores it.
enum class LaneMode : std::uint8_t { kAuto, kStash, kClStash, kSplit };

// Whether the GPU may run a pass whose ops are all PUTs without grouping them by key first (an optimistic
// pass; on a kLine tier of 8- or 16-byte keys and values of 16 bytes or less, with no host tier and no slot
// words). Each PUT
// inserts its key if the table does not hold it; if one finds its key present (a key the pass repeats, or one
// inserted before), the keys the pass inserted are taken out again and the pass runs again, grouped, so the
// results are always those of batch order. A pass so tried that holds only GETs runs them as lookups. kAuto
// runs a pass optimistically where the pass before it only inserted new keys; kAlways tries every pass (for
// tests); kOff never. The CPU backend ignores it.
enum class OptimisticInserts : std::uint8_t { kAuto, kOff, kAlways };

const char* to_string(BackendKind kind);
const char* to_string(Probing probing);
const char* to_string(LaneMode mode);
const char* to_string(OptimisticInserts mode);
const char* to_string(SlotLayout layout);

struct TableConfig {
  std::uint32_t key_width = 8;         // bytes: 8, 16 or 32
  std::uint32_t value_width = 8;       // bytes: 8 .. kMaxValueWidth
  std::uint64_t capacity = 1 << 20;    // device-tier slots asked for; rounded up to a prime number of probe units
  // Host-tier slots asked for (0: no host tier). The host tier keeps its slots in pinned host memory mapped
  // into the GPU's address space and its ticket-board in GPU memory; new keys go there once the device tier
  // holds max_load_factor * capacity keys. On the CPU backend it is ordinary memory with the same logic.
  std::uint64_t host_capacity = 0;
  // A pass's host-tier accesses run in a phase of their own, by at most host_phase_threads GPU threads
  // (0: as many as fit), and with order_host sorted by host address, so that the threads in flight touch a
  // narrow window of host memory: random host access is bound by address translation, not bytes
  // (bench/RESULTS.md, "the host tier (issue 4)"). order_host = false keeps batch order (for measuring what the sort buys).
  bool order_host = true;
  std::uint32_t host_phase_threads = 0;
  std::uint32_t ticket_bits = 8;       // ticket size on the board: 2, 4 or 8 bits (see ticket_board.hpp)
  double max_load_factor = 0.95;       // live keys / slots beyond which a tier takes no new keys
  // Tombstones / capacity that triggers the parallel clean-up. The device tier is also cleaned once its
  // tombstones take 16/25 of the slots its live keys leave free (capacity - live keys), which comes first at
  // loads of about 0.85 to 0.93: a lookup ends only at an EMPTY ticket.
  double cleanup_tombstones = 0.10;
  // A tier is also cleaned once its tombstones take this share of the EMPTY slots a full tier keeps
  // (capacity - max_items): a lookup ends only at an EMPTY ticket, so a tier held near max_items under
  // deletes and new keys walks ever longer before then. Lower: shorter walks, more clean-ups.
  double cleanup_headroom = 0.5;
  Probing probing = Probing::kGroup;
  SlotLayout slot_layout = SlotLayout::kAuto;  // the device tier's; see SlotLayout
  BackendKind backend = BackendKind::kAuto;
  LaneMode lanes = LaneMode::kAuto;
  double clstash_load = -1;            // hybrid switch load; < 0: the measured default for the probing scheme
  OptimisticInserts optimistic_inserts = OptimisticInserts::kAuto;
  std::uint32_t max_batch = 1 << 22;   // ops per pass; larger batches run as consecutive passes, in order
  unsigned cpu_threads = 0;            // CPU backend worker threads; 0 = hardware concurrency
  int gpu_device = 0;                  // CUDA device ordinal for the GPU backend
  // Each slot carries an 8-byte word beside its value, for what a table keeps per key besides the value (an
  // expiry time, an eviction score). A PUT or PUT_IF_ABSENT that stores its value stores its op's word with it
  // (BatchIn::slot_words; 0 where that is null), a GET that finds its key returns the word
  // (BatchOut::slot_words), clean-up moves it with its key, and export_items reads it out
  // (ItemColumns::slot_words). The word sits in the slot after the value's stride: on a board, in the sector
  // padding where there is room (8-byte keys and values: 32 bytes a slot either way); in a line, 8 bytes more
  // a slot (4 slots of 8-byte keys and values a line, not 7, so kAuto then picks the board). A table with
  // words copies the values (and words) of the ops alone in their pass after the probing step, as it does
  // values wider than 16 bytes, and runs no pass optimistically (OptimisticInserts). Off (the default): the
  // slots are laid out, and the probing kernels compiled, as if the word did not exist.
  bool slot_word = false;
};

inline constexpr std::uint32_t kMaxValueWidth = 64 * 1024;

// Bytes between consecutive keys / values in a batch's columns. Values are padded to 8 bytes so that every
// value starts on an 8-byte boundary.
constexpr std::uint32_t value_stride(std::uint32_t value_width) { return (value_width + 7u) & ~7u; }

// A batch of operations as columns. Operation i has kind ops[i], key bytes keys[i*key_width ..+key_lens[i]]
// and, for writes, value bytes values[i*value_stride ..+value_lens[i]]. Bytes past a key's or value's length
// are ignored. All pointers must be 8-byte aligned. values/value_lens may be null if the batch has no writes.
struct BatchIn {
  std::size_t size = 0;
  const std::uint8_t* ops = nullptr;
  const std::uint8_t* keys = nullptr;
  const std::uint8_t* key_lens = nullptr;
  const std::uint8_t* values = nullptr;
  const std::uint32_t* value_lens = nullptr;
  // Op i's slot word (TableConfig::slot_word), stored by a PUT or PUT_IF_ABSENT with its value; null: 0. Only
  // for a table with slot words.
  const std::uint64_t* slot_words = nullptr;
};

// Per-operation results, same order as the batch. A GET with kOk wrote its value at
// values[i*value_stride] (zeros after it up to the next 8-byte boundary; the rest of the stride is
// untouched) and its length at value_lens[i]. The other ops' entries there are unspecified (a large mixed
// pass writes zeros over them on the GPU). values/value_lens may be null if the caller does not want GET
// values.
struct BatchOut {
  std::uint8_t* status = nullptr;  // OpStatus codes
  std::uint8_t* values = nullptr;
  std::uint32_t* value_lens = nullptr;
  // A GET with kOk writes its key's slot word at slot_words[i] (TableConfig::slot_word); the other ops'
  // entries are unspecified, as their values are. May be null; only for a table with slot words, and with
  // `values` (a GET answers its word with its value).
  std::uint64_t* slot_words = nullptr;
};

// Live items read out of a table (Table::export_items), in the column layout of a batch of PUTs: item i's key
// at keys[i*key_width] with its length in key_lens[i], its value at values[i*value_stride] (zero-padded to
// the next 8-byte boundary, as a GET's; the rest of the stride is untouched) with its length in value_lens[i].
// All pointers 8-byte aligned.
struct ItemColumns {
  std::uint8_t* keys = nullptr;
  std::uint8_t* key_lens = nullptr;
  std::uint8_t* values = nullptr;
  std::uint32_t* value_lens = nullptr;
  std::uint64_t* slot_words = nullptr;  // item i's slot word (TableConfig::slot_word); may be null
};

// One tier's occupancy and size.
struct TierStats {
  std::uint64_t items = 0;            // live keys
  std::uint64_t tombstones = 0;       // deleted slots not yet cleaned
  std::uint64_t capacity = 0;         // slots (0: the tier does not exist)
  std::uint64_t max_items = 0;        // floor(max_load_factor * capacity)
  std::uint64_t board_bytes = 0;      // ticket-board size (always in GPU memory on the GPU backend); 0 in the line layout
  std::uint64_t slot_bytes = 0;       // slot storage size (in the line layout, the tickets' too)
};

struct TableStats {
  TierStats device;                   // the device tier (GPU memory on the GPU backend)
  TierStats host;                     // the host tier; host.capacity == 0 if the table has none
  // Host-tier traffic since the table was created: slots read (key comparisons, each one access to host
  // memory), slots written (new keys and overwrites), and slots the ticket-board's info bits ruled out
  // without reading them (an occupied ticket on the walk whose info code differed from the key's).
  std::uint64_t host_reads = 0;
  std::uint64_t host_writes = 0;
  std::uint64_t host_avoided = 0;
  std::uint64_t batches = 0;          // device passes run
  std::uint64_t conflict_ops = 0;     // ops that shared their key with another op of the same pass
  std::uint64_t cleanups = 0;         // tombstone clean-ups run
  std::uint64_t cleanups_skipped = 0; // clean-ups that found no memory for the displaced keys (retried later)
  std::uint64_t optimistic_passes = 0;    // passes run without grouping (TableConfig::optimistic_inserts)
  std::uint64_t optimistic_failures = 0;  // of those, passes taken back and run again, grouped
};

// Errors the table's host API throws. Device code never throws; it reports per-operation statuses.
class Error : public std::runtime_error {
 public:
  enum class Code { kInvalidArgument, kOutOfMemory, kNoDevice, kCuda, kInternal };
  Error(Code code, const std::string& what) : std::runtime_error(what), code_(code) {}
  Code code() const { return code_; }

 private:
  Code code_;
};

}  // namespace gpukv
