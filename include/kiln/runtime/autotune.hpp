#pragma once
// Autotuning ("max-autotune"): time a few launch configurations of a kernel, keep the fastest,
// and remember the choice in memory and in the on-disk cache beside the kernels, so that a new
// process reuses it without timing anything. Device-neutral: a backend supplies the candidates
// as callables (the CPU backend: thread counts and reduction chunking; a CUDA backend may pass
// block sizes and rows per block the same way) and a key naming everything the choice depends
// on (the kernel's source, the compiler, the machine).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/core/duration.hpp"
#include "kiln/core/log.hpp"
#include "kiln/runtime/disk_cache.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::runtime {

/// Counters of the autotuner since the start (or reset_autotune_stats()).
struct AutotuneStats {
  std::uint64_t tunings = 0;      ///< choices made by timing candidates
  std::uint64_t timed_runs = 0;   ///< candidate runs timed
  std::uint64_t memory_hits = 0;  ///< choices found in this process
  std::uint64_t disk_hits = 0;    ///< choices loaded from the on-disk cache
};

/// How much timing one choice may cost.
struct AutotuneBudget {
  int max_reps = 5;      ///< timed runs per candidate (after one warm-up run)
  double seconds = 0.1;  ///< rough wall-time budget for all candidates of one choice (at least 3 runs each)
  double keep_default_margin = 0.03;  ///< another candidate must beat the default by this fraction
};

namespace detail {

struct AutotuneCounters {
  std::atomic<std::uint64_t> tunings{0}, timed_runs{0}, memory_hits{0}, disk_hits{0};
};
inline AutotuneCounters& autotune_counters() {
  static AutotuneCounters c;
  return c;
}

/// Choices made in this process, by key text.
class AutotuneMemory {
 public:
  static AutotuneMemory& instance() {
    static AutotuneMemory* m = new AutotuneMemory;  // leaked like the other caches
    return *m;
  }
  std::optional<std::string> find(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) return std::nullopt;
    return it->second;
  }
  void put(const std::string& key, std::string value) {
    std::lock_guard<std::mutex> lock(mu_);
    map_[key] = std::move(value);
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    map_.clear();
  }

 private:
  std::mutex mu_;
  std::unordered_map<std::string, std::string> map_;
};

inline std::string autotune_tag(const std::string& key) { return detail::hex64(kiln::detail::hash_string(key)); }

}  // namespace detail

/// Current autotuner counters.
inline AutotuneStats autotune_stats() {
  auto& c = detail::autotune_counters();
  return AutotuneStats{c.tunings.load(), c.timed_runs.load(), c.memory_hits.load(), c.disk_hits.load()};
}

inline void reset_autotune_stats() {
  auto& c = detail::autotune_counters();
  c.tunings = 0;
  c.timed_runs = 0;
  c.memory_hits = 0;
  c.disk_hits = 0;
}

/// Forgets the choices made or loaded in this process (the disk entries stay).
inline void clear_autotune_memory() { detail::AutotuneMemory::instance().clear(); }

/// The stored choice for `key` (a record written by store_tuning): this process's first, then
/// the disk cache (entries verified by key and checksum, as kernels are). Counts a hit.
inline std::optional<std::string> load_tuning(const std::string& key) {
  if (auto v = detail::AutotuneMemory::instance().find(key)) {
    detail::autotune_counters().memory_hits.fetch_add(1, std::memory_order_relaxed);
    return v;
  }
  DiskCache& disk = DiskCache::instance();
  if (auto v = disk.load(key, ".tune")) {
    detail::autotune_counters().disk_hits.fetch_add(1, std::memory_order_relaxed);
    log(LogChannel::cache,
        "autotune " + detail::autotune_tag(key) + ": disk hit " + disk.path_for(key, ".tune") + ": " + *v);
    detail::AutotuneMemory::instance().put(key, *v);
    return v;
  }
  return std::nullopt;
}

/// Remembers `record` as the choice for `key`, in memory and on disk (temporary file + rename).
inline void store_tuning(const std::string& key, const std::string& record) {
  detail::AutotuneMemory::instance().put(key, record);
  DiskCache::instance().store(key, ".tune", record);
}

/// Seconds one call of `run` takes: the minimum over `reps` timed calls after one warm-up
/// (the minimum is the least noisy estimate of what the configuration can do).
inline double time_candidate(const std::function<void()>& run, int reps) {
  using clock = std::chrono::steady_clock;
  run();
  double best = 1e300;
  for (int r = 0; r < std::max(1, reps); ++r) {
    auto t0 = clock::now();
    run();
    best = std::min(best, std::chrono::duration<double>(clock::now() - t0).count());
    detail::autotune_counters().timed_runs.fetch_add(1, std::memory_order_relaxed);
  }
  return best;
}

/// Index of the fastest of `n` candidates timed by `time(i, reps)` (seconds of one run of
/// candidate i: the best of `reps` timed runs, after any warm-up it needs). Candidate 0 is the
/// default configuration and is kept unless another beats it by budget.keep_default_margin in
/// the round over all candidates and again in confirming rounds of the two alone, interleaved
/// (timing noise, a page fault or another process must not make a tuned kernel slower than the
/// default). `times`, when given, receives each candidate's seconds from the first
/// round. The timer decides what a run is: host time for CPU kernels, CUDA events on the GPU.
inline std::size_t pick_fastest_by(std::size_t n, const std::function<double(std::size_t, int)>& time,
                                   const AutotuneBudget& budget = {}, std::vector<double>* times = nullptr) {
  if (n == 0) return 0;
  detail::autotune_counters().tunings.fetch_add(1, std::memory_order_relaxed);
  // A first round of the default alone: the buffers' first touch (page faults) must not count
  // against it, and its time sizes the repetitions so that all candidates fit the budget.
  time(0, 1);
  double first = time(0, 1);
  const double per_candidate = budget.seconds / static_cast<double>(n + 2);
  const int reps =
      std::clamp(static_cast<int>(per_candidate / std::max(first, 1e-7)) - 1, 2, std::max(2, budget.max_reps));
  std::vector<double> t(n);
  t[0] = std::min(first, time(0, reps));
  std::size_t best = 0;
  for (std::size_t i = 1; i < n; ++i) {
    t[i] = time(i, reps);
    if (t[i] < t[best] && t[i] < t[0] * (1.0 - budget.keep_default_margin)) best = i;
  }
  if (times) *times = t;
  if (best != 0) {
    // Confirming rounds, interleaved (default, best, default, best, ...) so that a change in
    // the machine's load between two measurements cannot decide: the candidate must win by the
    // margin in two of three pairs, and over the three pairs' best times too.
    int wins = 0;
    double best_default = 1e300, best_candidate = 1e300;
    for (int round = 0; round < 3; ++round) {
      const double d = time(0, reps), c = time(best, reps);
      wins += c < d * (1.0 - budget.keep_default_margin);
      best_default = std::min(best_default, d);
      best_candidate = std::min(best_candidate, c);
    }
    if (wins < 2 || !(best_candidate < best_default * (1.0 - budget.keep_default_margin))) best = 0;
  }
  return best;
}

/// pick_fastest_by with host time: each candidate is a callable that runs it to completion.
inline std::size_t pick_fastest(const std::vector<std::function<void()>>& candidates, const AutotuneBudget& budget = {},
                                std::vector<double>* times = nullptr) {
  return pick_fastest_by(
      candidates.size(), [&](std::size_t i, int reps) { return time_candidate(candidates[i], reps); }, budget, times);
}

}  // namespace kiln::runtime

KILN_COLD_CODE_END
