// clStash: Stadium Hashing with collaborative lanes (Khorasani et al., section III.C, Figure 12), for the
// pass step that walks the table (ExecuteOp).
//
// With one walk per lane (Stash), a warp steps until its longest walk ends, so lanes whose walk ended early
// idle. Here each warp keeps a shelf of up to 32 unfinished walks in shared memory. Every round, each lane
// takes a fresh op and advances its walk by one unit; lanes whose walk is not over put it on the shelf.
// When the shelf has no room for them, the lanes that are free take walks off the shelf instead and all
// lanes step again, until the unfinished walks fit. So every step a lane takes is a useful probe, at the cost
// of warp votes, prefix counts and shared-memory traffic per round: a win once walks are long and uneven
// (high load), a loss when almost every walk ends at its first unit. PassRunner switches between the two by
// table load (TableConfig::clstash_load, measured by bench/table_bench_gpu --parts=switch).
//
// The walk itself is the engine's (ExecuteOp::begin, Engine::step, ExecuteOp::finish): the same code the
// Stash kernel and the CPU backend run.
#pragma once

#include <cstdint>
#include <type_traits>

#include "../detail/pass_ops.hpp"

namespace gpukv::detail {

struct ShelvedWalk {
  Probe probe;
  std::uint64_t op;
};

template <int kBlockThreads, Walk kWalk, class Ref>
__device__ void clstash_execute(std::uint64_t n, const ExecuteOp<Ref>& f, Tally& tally) {
  constexpr int kWarps = kBlockThreads / 32;
  // Raw storage: a walk has default member initialisers, which __shared__ variables may not run.
  static_assert(std::is_trivially_copyable_v<ShelvedWalk>);
  __shared__ alignas(ShelvedWalk) unsigned char shelf_bytes[sizeof(ShelvedWalk) * 32 * kWarps];
  const unsigned lane = threadIdx.x % 32;
  const unsigned below = (1u << lane) - 1;  // lanes with a smaller index
  ShelvedWalk* shelf = reinterpret_cast<ShelvedWalk*>(shelf_bytes) + 32 * (threadIdx.x / 32);

  const std::uint64_t warps = std::uint64_t{gridDim.x} * kWarps;
  std::uint64_t next = (std::uint64_t{blockIdx.x} * kWarps + threadIdx.x / 32) * 32;  // this warp's fresh ops
  unsigned shelved = 0;  // walks on the shelf; the same in every lane

  ShelvedWalk w;
  // A walk taken off the shelf. A board's walks carry no lengths word (Walk::kAny): zeroed rather than copied,
  // so that it takes no register.
  const auto unshelve = [&w](const ShelvedWalk& from) {
    w = from;
    if constexpr (kWalk == Walk::kAny) w.probe.words.lens = 0;
  };
  bool walking = false;  // this lane holds an unfinished walk
  // Advances this lane's walk by one unit; applies the op when the walk ends.
  const auto advance = [&] {
    if (walking && f.template step<kWalk>(w.probe, tally)) {
      // The op is loaded only now: carrying it on the shelf would cost shared memory and registers. Its
      // deletes leave their slots to FinishPass even in a pass without PUTs (Settle::kAtEnd): the
      // test moved this kernel's registers (80, its cap) about and cost mixed passes 1.3% on a board (run 243),
      // and a pass of deletes alone runs in the Stash kernel.
      f.template finish<kWalk, Settle::kAtEnd>(w.op, w.probe, load_op(f.e.batch, w.op), tally);
      walking = false;
    }
  };

  while (next < n) {
    // Fig. 12 lines 3-9: every lane takes a fresh op and takes one step.
    w.op = next + lane;
    next += warps * 32;
    walking = w.op < n && f.template begin<kWalk>(w.op, w.probe);
    advance();
    unsigned unfinished = __ballot_sync(0xFFFFFFFFu, walking);
    // Lines 10-22: no room on the shelf for the unfinished walks, so free lanes take shelved walks and
    // everybody steps again.
    while (__popc(unfinished) + shelved > 32) {
      const unsigned free_lanes = ~unfinished;
      const unsigned takers = min(static_cast<unsigned>(__popc(free_lanes)), shelved);
      const unsigned rank = __popc(free_lanes & below);
      if (!walking && rank < takers) {
        unshelve(shelf[shelved - 1 - rank]);
        walking = true;
      }
      shelved -= takers;
      __syncwarp();
      advance();
      unfinished = __ballot_sync(0xFFFFFFFFu, walking);
    }
    // Lines 23-27: the unfinished walks go on the shelf.
    if (walking) shelf[shelved + __popc(unfinished & below)] = w;
    shelved += __popc(unfinished);
    walking = false;
    __syncwarp();
  }
  // The warp's fresh ops are used up: finish what is on the shelf, a walk per lane (Stash-style).
  while (shelved > 0) {
    const unsigned take = min(shelved, 32u);
    walking = lane < take;
    if (walking) unshelve(shelf[shelved - 1 - lane]);
    shelved -= take;
    __syncwarp();
    while (__any_sync(0xFFFFFFFFu, walking)) advance();
  }
}

}  // namespace gpukv::detail
