#pragma once
// A cache of plans built once per graph structure (and whatever else decides the plan), that
// also remembers the structures that cannot have one, with the reason, so a failing build is
// not tried again on every call: the symbolic-size caches of the CPU and CUDA backends.
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "kiln/core/stats.hpp"

namespace kiln::backend::detail {

/// Plans of type Plan (null when the build failed) by a 64-bit key, each slot holding the
/// `Id` it was built for (keys can collide: lookups compare ids). Thread-safe; a build runs
/// outside the lock (a compile takes long and other structures must not wait for it).
template <class Id, class Plan>
class RememberingPlanCache {
 public:
  /// The plan of the slot under `key` whose id `same(id)` accepts, with its `why`; else
  /// `build(why)` (null with `why` on failure) stored under `key` with id `make_id()`.
  template <class Same, class Build, class MakeId>
  std::shared_ptr<const Plan> get(std::uint64_t key, Same&& same, Build&& build, MakeId&& make_id, std::string& why) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto range = slots_.equal_range(key);
      for (auto it = range.first; it != range.second; ++it)
        if (same(it->second.id)) {
          why = it->second.why;
          if (it->second.plan) kiln::detail::count_plan_hit();
          return it->second.plan;
        }
    }
    std::shared_ptr<const Plan> plan = build(why);
    std::lock_guard<std::mutex> lock(mu_);
    slots_.emplace(key, Slot{make_id(), plan, why});
    return plan;
  }

  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    slots_.clear();
  }

 private:
  struct Slot {
    Id id;
    std::shared_ptr<const Plan> plan;
    std::string why;
  };
  std::mutex mu_;
  std::unordered_multimap<std::uint64_t, Slot> slots_;
};

}  // namespace kiln::backend::detail
