// What lets one copy of the table's algorithm compile for both backends: nvcc builds it into kernels, the
// host compiler into the CPU backend's loops. Atomics are libcu++'s cuda::atomic_ref, which maps to GPU
// atomics in device code and to the compiler's __atomic builtins (understood by ThreadSanitizer) on the host.
#pragma once

#include <cuda/atomic>
#include <cstdint>

#if defined(__CUDACC__)
#include <cooperative_groups.h>
#endif

#if defined(__CUDACC__)
#define GPUKV_HD __host__ __device__
#define GPUKV_HD_INLINE __host__ __device__ __forceinline__
#else
#define GPUKV_HD
#define GPUKV_HD_INLINE inline
#endif

// Unrolls the short fixed-bound loops over key words (at most kMaxKeyWords).
#if defined(__CUDA_ARCH__)
#define GPUKV_UNROLL _Pragma("unroll")
#elif defined(__CUDACC__)
#define GPUKV_UNROLL  // nvcc's host pass: the host compiler sees this code through nvcc's front end
#else
#define GPUKV_UNROLL _Pragma("GCC unroll 4")
#endif

namespace gpukv::detail {

// Board words, counters and the batch scratch are shared by every thread of one device (or one process).
template <class T>
using atomic_ref = cuda::atomic_ref<T, cuda::thread_scope_device>;

using cuda::memory_order_acq_rel;
using cuda::memory_order_acquire;
using cuda::memory_order_relaxed;
using cuda::memory_order_release;

GPUKV_HD_INLINE std::uint64_t mulhi64(std::uint64_t a, std::uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#else
  return static_cast<std::uint64_t>((static_cast<unsigned __int128>(a) * b) >> 64);
#endif
}

GPUKV_HD_INLINE int count_trailing_zeros(std::uint64_t x) {  // x != 0
#if defined(__CUDA_ARCH__)
  return __ffsll(static_cast<long long>(x)) - 1;
#else
  return __builtin_ctzll(x);
#endif
}

GPUKV_HD_INLINE int popcount(std::uint64_t x) {
#if defined(__CUDA_ARCH__)
  return __popcll(x);
#else
  return __builtin_popcountll(x);
#endif
}

// Reserves the next index of an append-only list whose length is *count. On the GPU the threads of a warp
// that append together take one atomic between them.
GPUKV_HD_INLINE unsigned long long append_index(unsigned long long* count) {
#if defined(__CUDA_ARCH__)
  const auto group = cooperative_groups::coalesced_threads();
  unsigned long long base = 0;
  if (group.thread_rank() == 0) base = atomicAdd(count, static_cast<unsigned long long>(group.size()));
  return group.shfl(base, 0) + group.thread_rank();
#else
  return atomic_ref<unsigned long long>(*count).fetch_add(1, memory_order_relaxed);
#endif
}

// append_index for threads of a warp that may append to different lists: those appending to the same one
// take one atomic between them (matching the lists costs a warp instruction that append_index saves).
GPUKV_HD_INLINE unsigned long long append_index_to(unsigned long long* count) {
#if defined(__CUDA_ARCH__)
  unsigned lane;
  asm("mov.u32 %0, %%laneid;" : "=r"(lane));
  const unsigned peers = __match_any_sync(__activemask(), reinterpret_cast<unsigned long long>(count));
  const int leader = __ffs(static_cast<int>(peers)) - 1;
  unsigned long long base = 0;
  if (static_cast<int>(lane) == leader) base = atomicAdd(count, static_cast<unsigned long long>(__popc(peers)));
  return __shfl_sync(peers, base, leader) + static_cast<unsigned>(__popc(peers & ((1u << lane) - 1u)));
#else
  return atomic_ref<unsigned long long>(*count).fetch_add(1, memory_order_relaxed);
#endif
}

GPUKV_HD_INLINE constexpr std::uint64_t rotl64(std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

}  // namespace gpukv::detail
