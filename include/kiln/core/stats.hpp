#pragma once
// Process-wide counters: what the JIT compiled, what the caches served, what was launched.
#include <atomic>
#include <cstdint>

namespace kiln {

/// A snapshot of kiln's counters since the start or the last reset_stats().
struct Stats {
  std::uint64_t compiles = 0;     ///< kernels compiled (host compiler or NVRTC)
  std::uint64_t memory_hits = 0;  ///< kernels found in the in-memory cache
  std::uint64_t disk_hits = 0;    ///< kernels loaded from the on-disk cache
  std::uint64_t launches = 0;     ///< kernels launched (the reference executor: primitives executed)
  std::uint64_t graphs = 0;       ///< graphs evaluated
};

namespace detail {
struct Counters {
  std::atomic<std::uint64_t> compiles{0}, memory_hits{0}, disk_hits{0}, launches{0}, graphs{0};
};
inline Counters& counters() {
  static Counters c;
  return c;
}
}  // namespace detail

/// Current counters.
inline Stats stats() {
  auto& c = detail::counters();
  return Stats{c.compiles.load(), c.memory_hits.load(), c.disk_hits.load(), c.launches.load(), c.graphs.load()};
}

/// Sets every counter to zero.
inline void reset_stats() {
  auto& c = detail::counters();
  c.compiles = 0;
  c.memory_hits = 0;
  c.disk_hits = 0;
  c.launches = 0;
  c.graphs = 0;
}

}  // namespace kiln
