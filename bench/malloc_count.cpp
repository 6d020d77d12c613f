// A malloc counter to preload into a server (LD_PRELOAD): every malloc adds one to a counter, and SIGUSR1
// prints "MALLOCS <count>" to stderr. bench/server_ab.sh reads it before and after a load run to give the
// allocations per call, a figure the 2-core VM's changing speed leaves untouched. It counts malloc (which
// operator new calls) only: calloc, realloc and aligned allocations are not counted, so the figure is a
// lower bound, comparable between builds.
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstddef>
#include <cstdio>

extern "C" void* __libc_malloc(std::size_t size);

namespace {

std::atomic<unsigned long> mallocs{0};

void report(int) {
  char line[64];
  const int length = std::snprintf(line, sizeof line, "MALLOCS %lu\n", mallocs.load());
  // write is async-signal-safe; snprintf of an integer does not allocate or lock in glibc.
  if (length > 0) static_cast<void>(!write(STDERR_FILENO, line, static_cast<std::size_t>(length)));
}

__attribute__((constructor)) void install() { std::signal(SIGUSR1, report); }

}  // namespace

extern "C" void* malloc(std::size_t size) {
  mallocs.fetch_add(1, std::memory_order_relaxed);
  return __libc_malloc(size);
}
