#pragma once
// The CPU JIT executor: a graph is scheduled into fused kernels, generated as one C++/OpenMP
// translation unit, compiled (runtime::CpuModuleCache: memory, disk, compiler) and launched.
// Plans (schedule + loaded kernel pointers) are cached in-process by the graph's structural
// key, so evaluating the same structure again costs a hash lookup, a structural comparison
// and the launches.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kiln/backend/executor.hpp"
#include "kiln/codegen/cpp.hpp"
#include "kiln/core/env.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/log.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/ir/graph.hpp"
#include "kiln/runtime/cpu_module.hpp"
#include "kiln/runtime/host_allocator.hpp"
#include "kiln/sched/schedule.hpp"

namespace kiln::backend {

namespace detail {

/// Everything needed to run one graph structure: its schedule and its loaded kernels.
struct CpuPlan {
  ir::Graph graph;  ///< the structure (compared on lookup: keys can collide)
  sched::Schedule schedule;
  std::shared_ptr<runtime::SharedLibrary> library;
  std::vector<codegen::CpuKernelFn> kernels;
  std::vector<std::size_t> temp_bytes;
};

inline bool same_structure(const ir::Graph& a, const ir::Graph& b) {
  if (a.key != b.key || !(a.device == b.device) || a.outputs != b.outputs || a.output_strides != b.output_strides ||
      a.nodes.size() != b.nodes.size())
    return false;
  for (std::size_t i = 0; i < a.nodes.size(); ++i) {
    const ir::GraphNode& x = a.nodes[i];
    const ir::GraphNode& y = b.nodes[i];
    if (x.op != y.op || x.dtype != y.dtype || x.shape != y.shape || !(x.attrs == y.attrs) || x.inputs != y.inputs ||
        x.leaf != y.leaf || x.strides != y.strides)
      return false;
  }
  return true;
}

inline std::string hex_key(std::uint64_t k) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(k));
  return buf;
}

inline std::shared_ptr<const CpuPlan> build_cpu_plan(const ir::Graph& g) {
  auto plan = std::make_shared<CpuPlan>();
  plan->graph = g;
  plan->schedule = sched::schedule(g);
  if (log_enabled(LogChannel::schedule))
    log(LogChannel::schedule, "graph " + hex_key(g.key) + ": " + std::to_string(plan->schedule.kernels.size()) +
                                  " kernel(s)\n" + plan->schedule.str(g));
  codegen::CppSource src = codegen::generate_cpp(g, plan->schedule, "kiln_" + hex_key(g.key));
  plan->library = runtime::CpuModuleCache::instance().get(src.source);
  for (auto& name : src.entries)
    plan->kernels.push_back(reinterpret_cast<codegen::CpuKernelFn>(plan->library->symbol(name.c_str())));
  for (auto& t : plan->schedule.temps)
    plan->temp_bytes.push_back(static_cast<std::size_t>(t.shape.numel()) * itemsize(t.dtype));
  return plan;
}

/// Thread-safe plan cache keyed by the graph's structural key.
class CpuPlanCache {
 public:
  static CpuPlanCache& instance() {
    // Leaked on purpose, like the module cache: plans hold kernels other threads may be running.
    static CpuPlanCache* cache = new CpuPlanCache;
    return *cache;
  }

  std::shared_ptr<const CpuPlan> get(const ir::Graph& g) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto range = plans_.equal_range(g.key);
      for (auto it = range.first; it != range.second; ++it)
        if (same_structure(it->second->graph, g)) return it->second;
    }
    // Built outside the lock: a compile takes long and other graphs must not wait for it
    // (two threads racing for one new graph share its compile through CpuModuleCache).
    auto plan = build_cpu_plan(g);
    std::lock_guard<std::mutex> lock(mu_);
    auto range = plans_.equal_range(g.key);
    for (auto it = range.first; it != range.second; ++it)
      if (same_structure(it->second->graph, g)) return it->second;
    plans_.emplace(g.key, plan);
    return plan;
  }

  /// Forgets every plan (kernels already running keep their module alive).
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    plans_.clear();
  }

  std::size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return plans_.size();
  }

 private:
  mutable std::mutex mu_;
  std::unordered_multimap<std::uint64_t, std::shared_ptr<const CpuPlan>> plans_;
};

/// Threads of the kernels' OpenMP teams: KILN_NUM_THREADS, else the hardware's count.
inline int cpu_threads() {
  static const int n = [] {
    long v = std::atol(env::get("KILN_NUM_THREADS", "0").c_str());
    if (v > 0) return static_cast<int>(v);
    unsigned h = std::thread::hardware_concurrency();
    return h ? static_cast<int>(h) : 1;
  }();
  return n;
}

}  // namespace detail

/// Whether the CPU JIT can build new kernels here (a working host compiler was found).
inline bool cpu_jit_available() { return runtime::CpuModuleCache::instance().compiler() != nullptr; }

/// The kernel grouping of `g` as text: one line per kernel (kind, iteration space, strategy),
/// then what it reduces and stores.
inline std::string explain_schedule(const ir::Graph& g) { return sched::explain_schedule(g); }

/// The compiled plan of `g`'s structure (schedule + loaded kernels), built on first use and
/// cached in-process; callers that evaluate one structure repeatedly may keep it and call
/// run_cpu_plan, skipping the lookup.
using CpuPlanPtr = std::shared_ptr<const detail::CpuPlan>;
inline CpuPlanPtr cpu_plan(const ir::Graph& g) {
  if (!g.device.is_cpu()) throw DeviceError("CPU JIT: the graph is on " + g.device.str() + "; it runs CPU graphs only");
  return detail::CpuPlanCache::instance().get(g);
}

/// Launches `plan`'s kernels over `args` (laid out as for run_cpu_jit on the plan's graph).
inline void run_cpu_plan(const detail::CpuPlan& plan, const RunArgs& args) {
  const ir::Graph& g = plan.graph;
  if (args.outputs.size() != g.outputs.size())
    throw Error("CPU JIT: " + std::to_string(args.outputs.size()) + " output pointers for " + std::to_string(g.outputs.size()) +
                " outputs");
  const std::size_t leaves = g.num_leaves();
  if (args.inputs.size() < leaves)
    throw Error("CPU JIT: " + std::to_string(args.inputs.size()) + " input pointers for " + std::to_string(leaves) + " leaves");
  const std::size_t total = leaves + args.outputs.size() + plan.temp_bytes.size();
  void* small[32];
  std::vector<void*> big;
  void** argv = small;
  if (total > 32) {
    big.resize(total);
    argv = big.data();
  }
  for (std::size_t i = 0; i < leaves; ++i) argv[i] = const_cast<void*>(args.inputs[i]);
  for (std::size_t i = 0; i < args.outputs.size(); ++i) argv[leaves + i] = args.outputs[i];
  std::vector<StoragePtr> temps;
  if (!plan.temp_bytes.empty()) {
    temps.reserve(plan.temp_bytes.size());
    for (std::size_t i = 0; i < plan.temp_bytes.size(); ++i) {
      temps.push_back(runtime::allocate_host(plan.temp_bytes[i]));
      argv[leaves + args.outputs.size() + i] = temps.back()->data;
    }
  }
  const int threads = detail::cpu_threads();
  for (auto fn : plan.kernels) {
    fn(argv, threads);
    kiln::detail::counters().launches.fetch_add(1, std::memory_order_relaxed);
  }
}

/// Runs `g` as fused, generated and compiled kernels: leaves are read from args.inputs, output
/// i is written to args.outputs[i] with g.output_strides[i]. Counts one launch per kernel.
/// Throws CompileError when a kernel cannot be built, DTypeError for a primitive on a dtype it
/// is not defined for, DeviceError unless the graph is on the CPU.
inline void run_cpu_jit(const ir::Graph& g, const RunArgs& args) {
  if (args.outputs.size() != g.outputs.size() || g.output_strides.size() != g.outputs.size())
    throw Error("CPU JIT: " + std::to_string(args.outputs.size()) + " output pointers for " + std::to_string(g.outputs.size()) +
                " outputs");
  CpuPlanPtr plan = cpu_plan(g);
  run_cpu_plan(*plan, args);
}

}  // namespace kiln::backend
