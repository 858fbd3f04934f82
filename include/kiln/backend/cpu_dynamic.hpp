#pragma once
// kiln::compile's automatic-dynamic rule for plain lazy evaluation on the CPU: the first size of
// a graph structure compiles kernels for that size; a second size of the same structure (only
// the leading size of the first output changed) compiles the symbolic-size kernels once, which
// then serve every later size. A loop over batch sizes therefore compiles twice, not per size.
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/backend/cpu_symbolic.hpp"
#include "kiln/core/log.hpp"

namespace kiln::backend {

namespace detail {

/// A graph's size-erased form: its first output's leading size `size` replaced by the
/// placeholder everywhere it occurs. Strides, attributes and constants are kept, so graphs
/// whose layout or numbers depend on the size erase to different structures (and stay static).
struct ErasedGraph {
  ir::Graph graph;
  std::int64_t size = 0;
};

inline std::optional<ErasedGraph> erase_leading_size(const ir::Graph& g) {
  if (g.outputs.empty()) return std::nullopt;
  const Shape& out = g.nodes[static_cast<std::size_t>(g.outputs[0])].shape;
  if (out.empty() || out[0] < 2 || out[0] == kSymbolicPlaceholder) return std::nullopt;
  for (auto& n : g.nodes)
    for (auto d : n.shape)
      if (d == kSymbolicPlaceholder) return std::nullopt;
  return ErasedGraph{with_placeholder(g, out[0], kSymbolicPlaceholder), out[0]};
}

/// The sizes each erased structure was met at: a second size turns on the symbolic plan.
class SizesSeen {
 public:
  static SizesSeen& instance() {
    static auto* seen = new SizesSeen;  // leaked on purpose, as the plan caches
    return *seen;
  }
  /// Records `size` for `erased`; true when the structure was met at another size before.
  bool another_size(const ir::Graph& erased, std::int64_t size, std::int64_t* before) {
    std::lock_guard<std::mutex> lock(mu_);
    auto range = seen_.equal_range(erased.key);
    for (auto it = range.first; it != range.second; ++it) {
      if (!ir::same_graph(it->second.graph, erased)) continue;
      if (it->second.dynamic) return true;
      if (it->second.first_size == size) return false;
      *before = it->second.first_size;
      it->second.dynamic = true;
      return true;
    }
    if (seen_.size() >= kMaxStructures) seen_.clear();  // a bound, not a policy: forgetting costs a static compile
    seen_.emplace(erased.key, Entry{erased, size, false});
    return false;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    seen_.clear();
  }

 private:
  static constexpr std::size_t kMaxStructures = 4096;
  struct Entry {
    ir::Graph graph;
    std::int64_t first_size;
    bool dynamic;
  };
  std::mutex mu_;
  std::unordered_multimap<std::uint64_t, Entry> seen_;
};

}  // namespace detail

/// The symbolic plan that runs `g` under the automatic-dynamic rule, with the size to launch
/// it at; a null plan when `g` is to be compiled for its own sizes (its structure was not met
/// at another size yet, or it cannot be symbolic: KILN_LOGS=recompiles says why).
struct DynamicRun {
  CpuSymbolicPlanPtr plan;
  std::int64_t size = 0;
};

inline DynamicRun cpu_dynamic_plan(const ir::Graph& g) {
  auto erased = detail::erase_leading_size(g);
  if (!erased) return {};
  std::int64_t before = 0;
  if (!detail::SizesSeen::instance().another_size(erased->graph, erased->size, &before)) return {};
  std::string why;
  CpuSymbolicPlanPtr plan = cpu_symbolic_plan(erased->graph, why);
  if (before != 0 && log_enabled(LogChannel::recompiles)) {
    const std::string head = "lazy graph " + kiln::detail::hex64(g.key) + ": leading size " + std::to_string(before) +
                             " -> " + std::to_string(erased->size) + ": ";
    log(LogChannel::recompiles, plan ? head + "compiling the symbolic-size kernels (one compile for every size)"
                                     : head + "stays per size (" + why + ")");
  }
  return {std::move(plan), erased->size};
}

/// Forgets the sizes met (kiln::reset()).
inline void clear_sizes_seen() { detail::SizesSeen::instance().clear(); }

}  // namespace kiln::backend
