#pragma once
// CPU kernels with a symbolic leading size (kiln::compile's dynamic shapes): one compile serves
// every batch size. The graph comes with that size set to a placeholder; the scheduler and the
// code generator treat dims of the placeholder size as read at launch (the last args slot
// points at the size). The kernels are generated a second time from the graph at another
// placeholder and must come out identical: a size that leaked into the code (a decision or a
// constant that depends on it) would show there, and the graph then stays specialised per size.
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/core/index_fault.hpp"
#include "kiln/backend/cpu_jit.hpp"
#include "kiln/backend/executor.hpp"
#include "kiln/backend/plan_cache.hpp"
#include "kiln/codegen/cpp.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/runtime/cpu_module.hpp"
#include "kiln/runtime/host_allocator.hpp"
#include "kiln/sched/schedule.hpp"

namespace kiln::backend {

namespace detail {

/// Kernels of one graph structure whose leading size is read at launch.
struct CpuSymbolicPlan {
  ir::Graph graph;  ///< at kSymbolicPlaceholder
  sched::Schedule schedule;
  std::shared_ptr<runtime::SharedLibrary> library;
  std::vector<codegen::CpuKernelFn> kernels;
  /// Bytes of each temporary: `bytes`, times the size when `symbolic`.
  struct TempSize {
    std::size_t bytes = 0;
    bool symbolic = false;
  };
  std::vector<TempSize> temps;
};

inline ir::Graph with_placeholder(const ir::Graph& g, std::int64_t from, std::int64_t to) {
  ir::Graph h = g;
  for (auto& n : h.nodes)
    for (auto& d : n.shape)
      if (d == from) d = to;
  h.rehash();
  return h;
}

/// The symbolic-size temporaries of `s` (a schedule of `g` at placeholder `p`), or nullopt with
/// `why` when one has the size as an inner dim.
inline std::optional<std::vector<CpuSymbolicPlan::TempSize>> symbolic_temps(const sched::Schedule& s, std::int64_t p,
                                                                            std::string& why) {
  std::vector<CpuSymbolicPlan::TempSize> temps;
  for (auto& t : s.temps) {
    CpuSymbolicPlan::TempSize ts;
    ts.bytes = itemsize(t.dtype);
    for (std::size_t d = 0; d < t.shape.size(); ++d) {
      if (t.shape[d] == p && d == 0)
        ts.symbolic = true;
      else if (t.shape[d] == p) {
        why = "a temporary has the symbolic size as an inner dim";
        return std::nullopt;
      } else {
        ts.bytes *= static_cast<std::size_t>(t.shape[d]);
      }
    }
    temps.push_back(ts);
  }
  return temps;
}

/// The plan of `g`, or null with `why` (a kernel or a temporary the size cannot be read in).
inline std::shared_ptr<const CpuSymbolicPlan> build_symbolic_plan(const ir::Graph& g, std::string& why) {
  const std::int64_t p = kSymbolicPlaceholder;
  auto plan = std::make_shared<CpuSymbolicPlan>();
  plan->graph = g;
  try {
    plan->schedule = sched::schedule(g, p);
    for (std::size_t k = 0; k < plan->schedule.kernels.size(); ++k)
      if (!sched::symbolic_kernel(plan->schedule, k, &why)) return nullptr;
    auto temps = symbolic_temps(plan->schedule, p, why);
    if (!temps) return nullptr;
    plan->temps = std::move(*temps);
    const std::string prefix = "kiln_sym_" + kiln::detail::hex64(g.key);
    codegen::CppSource src = codegen::generate_cpp(g, plan->schedule, prefix);
    // The same structure at another placeholder must give the same code (see the header).
    const std::int64_t q = p + 30;
    ir::Graph h = with_placeholder(g, p, q);
    codegen::CppSource other = codegen::generate_cpp(h, sched::schedule(h, q), prefix);
    if (other.source != src.source) {
      why = "the generated code depends on the size (it would be wrong for other sizes)";
      return nullptr;
    }
    plan->library = runtime::CpuModuleCache::instance().get(src.source);
    for (auto& name : src.entries)
      plan->kernels.push_back(reinterpret_cast<codegen::CpuKernelFn>(plan->library->symbol(name.c_str())));
  } catch (const CompileError&) {
    throw;
  } catch (const DTypeError&) {
    throw;
  } catch (const Error& e) {
    why = e.what();
    return nullptr;
  }
  return plan;
}

/// Symbolic plans by structure; a structure that cannot have one is remembered too (with why).
/// Leaked on purpose, like the plan cache: plans hold kernels other threads may be running.
inline RememberingPlanCache<ir::Graph, CpuSymbolicPlan>& cpu_symbolic_plans() {
  static auto* cache = new RememberingPlanCache<ir::Graph, CpuSymbolicPlan>;
  return *cache;
}

}  // namespace detail

using CpuSymbolicPlanPtr = std::shared_ptr<const detail::CpuSymbolicPlan>;

/// Kernels for `g`, a CPU graph whose dims of size kSymbolicPlaceholder stand for one leading
/// size read at launch (its leaves of that size contiguous): built once per structure and
/// cached. Null, with `why`, when some kernel cannot read the size at launch (the caller then
/// compiles per size). Throws CompileError / DTypeError as run_cpu_jit does.
inline CpuSymbolicPlanPtr cpu_symbolic_plan(const ir::Graph& g, std::string& why) {
  if (!g.device.is_cpu()) throw DeviceError("CPU JIT: the graph is on " + g.device.str() + "; it runs CPU graphs only");
  return detail::cpu_symbolic_plans().get(
      g.key, [&](const ir::Graph& built_for) { return ir::same_graph(built_for, g); },
      [&](std::string& w) { return detail::build_symbolic_plan(g, w); }, [&] { return g; }, why);
}

/// Launches `plan`'s kernels with the symbolic size `size` (>= 2) over `args` (laid out as for
/// run_cpu_jit on the graph at that size).
inline void run_cpu_symbolic(const detail::CpuSymbolicPlan& plan, const RunArgs& args, std::int64_t size) {
  const std::size_t leaves = plan.graph.num_leaves();
  if (args.outputs.size() != plan.graph.outputs.size() || args.inputs.size() < leaves)
    throw Error("CPU JIT: " + std::to_string(args.inputs.size()) + " inputs and " +
                std::to_string(args.outputs.size()) + " outputs for a graph of " + std::to_string(leaves) +
                " leaves and " + std::to_string(plan.graph.outputs.size()) + " outputs");
  std::vector<void*> argv(leaves + args.outputs.size() + plan.temps.size() + 1);
  for (std::size_t i = 0; i < leaves; ++i) argv[i] = const_cast<void*>(args.inputs[i]);
  for (std::size_t i = 0; i < args.outputs.size(); ++i) argv[leaves + i] = args.outputs[i];
  std::vector<StoragePtr> temps;
  for (std::size_t i = 0; i < plan.temps.size(); ++i) {
    const auto& t = plan.temps[i];
    temps.push_back(runtime::allocate_host(t.symbolic ? t.bytes * static_cast<std::size_t>(size) : t.bytes));
    argv[leaves + args.outputs.size() + i] = temps.back()->data;
  }
  long long s = size;
  argv.back() = &s;
  const int threads = detail::cpu_threads();
  for (auto fn : plan.kernels) {
    fn(argv.data(), threads);
    kiln::detail::counters().launches.fetch_add(1, std::memory_order_relaxed);
  }
  kiln::detail::raise_host_index_fault();
}

/// Forgets every CPU symbolic plan (clear_symbolic_plans(), in cuda_symbolic.hpp, forgets the
/// CUDA ones too: kiln::reset()).
inline void clear_cpu_symbolic_plans() { detail::cpu_symbolic_plans().clear(); }

}  // namespace kiln::backend
