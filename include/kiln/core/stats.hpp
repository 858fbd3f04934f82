#pragma once
// Process-wide counters: what the JIT compiled, what the caches served, what was launched.
#include <atomic>
#include <cstdint>

namespace kiln {

/// A snapshot of kiln's counters since the start or the last reset_stats().
/// A graph evaluated again whose plan is reused counts one plan_hit and no kernel lookup at
/// all (memory_hits stays put): "did this hit a cache?" is plan_hits + memory_hits + disk_hits.
struct Stats {
  std::uint64_t compiles = 0;     ///< kernels compiled (host compiler or NVRTC)
  std::uint64_t memory_hits = 0;  ///< kernels found in the in-memory kernel cache (a new plan's lookups)
  std::uint64_t disk_hits = 0;    ///< kernels loaded from the on-disk cache
  std::uint64_t launches = 0;     ///< kernels launched (the reference executor: primitives executed)
  std::uint64_t graphs = 0;       ///< graphs evaluated
  std::uint64_t plan_hits = 0;    ///< graphs whose whole plan (schedule and loaded kernels) was reused
  std::uint64_t library_calls = 0;  ///< library products run (CBLAS, cuBLASLt; the reference executor's count as launches)
};

namespace detail {
struct Counters {
  std::atomic<std::uint64_t> compiles{0}, memory_hits{0}, disk_hits{0}, launches{0}, graphs{0}, plan_hits{0},
      library_calls{0};
};
inline Counters& counters() {
  static Counters c;
  return c;
}
}  // namespace detail

/// Current counters.
inline Stats stats() {
  auto& c = detail::counters();
  return Stats{c.compiles.load(), c.memory_hits.load(), c.disk_hits.load(), c.launches.load(),
               c.graphs.load(),    c.plan_hits.load(),   c.library_calls.load()};
}

/// Sets every counter to zero.
inline void reset_stats() {
  auto& c = detail::counters();
  c.compiles = 0;
  c.memory_hits = 0;
  c.disk_hits = 0;
  c.launches = 0;
  c.graphs = 0;
  c.plan_hits = 0;
  c.library_calls = 0;
}

namespace detail {
inline void count_plan_hit() { counters().plan_hits.fetch_add(1, std::memory_order_relaxed); }
}  // namespace detail

}  // namespace kiln
