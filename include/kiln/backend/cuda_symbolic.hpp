#pragma once
// CUDA kernels with a symbolic leading size (kiln::compile's dynamic shapes): one NVRTC compile
// serves every batch size, as cpu_symbolic.hpp does on the CPU. The graph comes with that size
// set to kSymbolicPlaceholder; the scheduler and the code generator treat dims of the
// placeholder size as read at launch (codegen::CudaSource: the kernels' argument struct ends
// with the size, their index math is 64-bit, and each kernel's grid is a function of the size,
// CudaKernelInfo::grid_rule). The unit is generated a second time from the graph at another
// placeholder and must come out identical, launch shapes included: a size that leaked into the
// code would show there, and the graph then stays specialised per size (compiled per size by
// backend/cuda.hpp). Plans are per alignment class of the buffers, as CudaPlanCache's.
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/backend/cpu_symbolic.hpp"
#include "kiln/backend/cuda.hpp"
#include "kiln/backend/executor.hpp"
#include "kiln/backend/plan_cache.hpp"
#include "kiln/codegen/cuda.hpp"
#include "kiln/core/log.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/runtime/cuda_memory.hpp"
#include "kiln/runtime/cuda_module.hpp"
#include "kiln/sched/schedule.hpp"

namespace kiln::backend {

namespace detail {

/// Kernels of one graph structure, for one alignment class, whose leading size is read at launch.
struct CudaSymbolicPlan {
  ir::Graph graph;                   ///< at kSymbolicPlaceholder
  codegen::CudaAlignment alignment;  ///< per leaf and output (never empty)
  sched::Schedule schedule;
  std::vector<codegen::CudaKernelInfo> kernels;
  std::vector<runtime::cu::CUfunction> functions;
  /// Bytes of each temporary: `bytes`, times the size when `symbolic`.
  std::vector<CpuSymbolicPlan::TempSize> temps;
  std::size_t num_args = 0;  ///< pointers in the argument struct (the size follows them)
  std::size_t leaves = 0;
  StoragePtr scratch;  ///< cross-block partials of the unit's static kernels (runs are ordered on the stream)
  int device = 0;
};

/// Every leaf and output of `g` 16-byte aligned unless `al` says otherwise, spelled out.
inline codegen::CudaAlignment explicit_alignment(const ir::Graph& g, const codegen::CudaAlignment& al) {
  codegen::CudaAlignment out;
  const std::size_t leaves = g.num_leaves();
  for (std::size_t i = 0; i < leaves; ++i) out.inputs.push_back(al.input(static_cast<int>(i)) ? 1 : 0);
  for (std::size_t o = 0; o < g.outputs.size(); ++o) out.outputs.push_back(al.output(static_cast<int>(o)) ? 1 : 0);
  return out;
}

inline bool same_launch(const codegen::CudaKernelInfo& a, const codegen::CudaKernelInfo& b) {
  return a.name == b.name && a.grid == b.grid && a.block == b.block && a.shared_bytes == b.shared_bytes &&
         a.grid_rule.units_per_size == b.grid_rule.units_per_size &&
         a.grid_rule.size_divisor == b.grid_rule.size_divisor &&
         a.grid_rule.units_per_block == b.grid_rule.units_per_block && a.grid_rule.max_grid == b.grid_rule.max_grid;
}

/// The CUDA unit of `g` (a graph whose dims of size kSymbolicPlaceholder stand for the symbolic
/// size) with that size read at launch, for `target` and `al`; `schedule` receives its
/// schedule. Nullopt, with `why`, when some kernel or temporary cannot read the size at launch
/// or the code depends on the size (generated again at another placeholder, it differs).
/// Throws DTypeError as generate_cuda does. Needs no GPU (the tests call it).
inline std::optional<codegen::CudaSource> cuda_symbolic_source(const ir::Graph& g, const std::string& prefix,
                                                               const codegen::CudaTarget& target,
                                                               const codegen::CudaAlignment& al,
                                                               sched::Schedule& schedule, std::string& why) {
  const std::int64_t p = kSymbolicPlaceholder;
  try {
    schedule = sched::schedule(g, p);
    for (std::size_t k = 0; k < schedule.kernels.size(); ++k)
      if (!sched::symbolic_kernel(schedule, k, &why)) return std::nullopt;
    if (!symbolic_temps(schedule, p, why)) return std::nullopt;
    codegen::CudaSource src = codegen::generate_cuda(g, schedule, prefix, target, al);
    // The same structure at another placeholder must give the same unit (see the header).
    const std::int64_t q = p + 30;
    ir::Graph h = with_placeholder(g, p, q);
    codegen::CudaSource other = codegen::generate_cuda(h, sched::schedule(h, q), prefix, target, al);
    bool same = other.source == src.source && other.scratch_bytes == src.scratch_bytes &&
                other.kernels.size() == src.kernels.size();
    for (std::size_t k = 0; same && k < src.kernels.size(); ++k) same = same_launch(src.kernels[k], other.kernels[k]);
    if (!same) {
      why = "the generated CUDA code depends on the size (it would be wrong for other sizes)";
      return std::nullopt;
    }
    return src;
  } catch (const DTypeError&) {
    throw;
  } catch (const Error& e) {
    why = e.what();
    return std::nullopt;
  }
}

/// The plan of `g` for alignment class `al` (explicit), or null with `why`.
inline std::shared_ptr<const CudaSymbolicPlan> build_cuda_symbolic_plan(const ir::Graph& g,
                                                                        const codegen::CudaAlignment& al,
                                                                        std::string& why) {
  auto plan = std::make_shared<CudaSymbolicPlan>();
  plan->graph = g;
  plan->alignment = al;
  plan->device = g.device.index;
  plan->leaves = g.num_leaves();
  runtime::CudaContext& ctx = runtime::cuda_context(g.device.index);
  // The name carries the alignment class, so the variants of one graph differ in source.
  const std::string prefix =
      "kiln_sym_" + kiln::detail::hex64(g.key) + "_" + kiln::detail::hex64(alignment_hash(al)).substr(0, 4);
  auto src = cuda_symbolic_source(g, prefix, cuda_target(ctx), al, plan->schedule, why);
  if (!src) return nullptr;
  plan->temps = *symbolic_temps(plan->schedule, kSymbolicPlaceholder, why);
  if (log_enabled(LogChannel::schedule))
    log(LogChannel::schedule, "graph " + kiln::detail::hex64(g.key) + " on " + g.device.str() +
                                  ", symbolic size n: " + std::to_string(plan->schedule.kernels.size()) +
                                  " kernel(s)\n" + plan->schedule.str(g));
  auto& cache = runtime::CudaModuleCache::instance();
  for (auto& k : src->kernels) {
    runtime::cu::CUfunction fn = cache.get_function(src->source, k.name, g.device.index);
    if (k.shared_bytes > 48 * 1024) runtime::set_max_dynamic_shared(ctx, fn, static_cast<int>(k.shared_bytes));
    plan->functions.push_back(fn);
    if (log_enabled(LogChannel::schedule)) log(LogChannel::schedule, k.name + ": " + k.strategy);
  }
  plan->kernels = src->kernels;
  plan->num_args = src->num_args;
  if (src->scratch_bytes > 0) plan->scratch = runtime::allocate_cuda(src->scratch_bytes, g.device.index);
  return plan;
}

/// What a CUDA symbolic plan is built for: a structure and an alignment class.
struct CudaSymbolicId {
  ir::Graph graph;
  codegen::CudaAlignment alignment;
};

/// Symbolic plans by structure and alignment class; a structure that cannot have one is
/// remembered too (with why). Leaked on purpose, like the plan cache: plans hold device memory
/// and kernels that may be queued when static destructors run.
inline RememberingPlanCache<CudaSymbolicId, CudaSymbolicPlan>& cuda_symbolic_plans() {
  static auto* cache = new RememberingPlanCache<CudaSymbolicId, CudaSymbolicPlan>;
  return *cache;
}

/// The symbolic plan of `g` for alignment class `al` (explicit: explicit_alignment), from the
/// cache or built now.
inline std::shared_ptr<const CudaSymbolicPlan> cached_cuda_symbolic_plan(const ir::Graph& g,
                                                                         const codegen::CudaAlignment& al,
                                                                         std::string& why) {
  return cuda_symbolic_plans().get(
      kiln::detail::hash_combine(g.key, alignment_hash(al)),
      [&](const CudaSymbolicId& id) {
        return id.alignment.inputs == al.inputs && id.alignment.outputs == al.outputs && ir::same_graph(id.graph, g);
      },
      [&](std::string& w) { return build_cuda_symbolic_plan(g, al, w); },
      [&] {
        return CudaSymbolicId{g, al};
      },
      why);
}

/// Whether `plan`'s kernels may run on these buffers: every buffer it reads or writes with
/// vectors is 16-byte aligned.
inline bool admits(const CudaSymbolicPlan& plan, const RunArgs& args) {
  for (std::size_t i = 0; i < plan.leaves; ++i)
    if (plan.alignment.inputs[i] && !aligned16(args.inputs[i])) return false;
  for (std::size_t o = 0; o < args.outputs.size(); ++o)
    if (plan.alignment.outputs[o] && !aligned16(args.outputs[o])) return false;
  return true;
}

}  // namespace detail

using CudaSymbolicPlanPtr = std::shared_ptr<const detail::CudaSymbolicPlan>;

/// Kernels for `g`, a CUDA graph whose dims of size kSymbolicPlaceholder stand for one leading
/// size read at launch (its leaves of that size contiguous), for buffers of alignment class
/// `al` (default: all 16-byte aligned): compiled once per structure and class, and cached.
/// Null, with `why`, when some kernel cannot read the size at launch (the caller then compiles
/// per size). Throws CompileError / DTypeError / DeviceError as run_cuda does.
inline CudaSymbolicPlanPtr cuda_symbolic_plan(const ir::Graph& g, std::string& why,
                                              const codegen::CudaAlignment& al = {}) {
  if (!g.device.is_cuda())
    throw DeviceError("CUDA executor: the graph is on " + g.device.str() + "; it runs CUDA graphs only");
  if (!cuda_available())
    throw DeviceError("CUDA executor: cannot run a graph on " + g.device.str() +
                      ": CUDA is unavailable: " + cuda_unavailable_reason());
  return detail::cached_cuda_symbolic_plan(g, detail::explicit_alignment(g, al), why);
}

/// Queues `plan`'s kernels on kiln's stream of its device with the symbolic size `size` over
/// `args` (laid out as for run_cuda on the graph at that size): temporaries sized for `size`,
/// each kernel's grid computed for it. A buffer that is not 16-byte aligned where `plan`
/// expects it takes the plan of its alignment class (built on first use); returns false,
/// launching nothing, when that class cannot have symbolic kernels (the caller then runs the
/// graph at its size). Counts one launch per kernel.
inline bool run_cuda_symbolic(const detail::CudaSymbolicPlan& plan, const RunArgs& args, std::int64_t size) {
  detail::check_cuda_run(plan.graph, args, plan.leaves);
  const detail::CudaSymbolicPlan* use = &plan;
  CudaSymbolicPlanPtr other;
  if (!detail::admits(plan, args)) {
    codegen::CudaAlignment al;
    for (std::size_t i = 0; i < plan.leaves; ++i) al.inputs.push_back(detail::aligned16(args.inputs[i]) ? 1 : 0);
    for (auto p : args.outputs) al.outputs.push_back(detail::aligned16(p) ? 1 : 0);
    std::string why;
    other = detail::cached_cuda_symbolic_plan(plan.graph, al, why);
    if (!other) return false;
    use = other.get();
  }
  const detail::CudaSymbolicPlan& pl = *use;
  const runtime::CudaContext& ctx = runtime::cuda_context(pl.device);
  // Temporaries: one block from the device's memory pool per run, given back in stream order
  // once the kernels using it are done (when `temps` is released on return).
  std::vector<std::size_t> offsets;
  std::size_t total = 0;
  for (auto& t : pl.temps) {
    offsets.push_back(total);
    const std::size_t bytes = t.symbolic ? t.bytes * static_cast<std::size_t>(size) : t.bytes;
    total += (bytes + 255) / 256 * 256;
  }
  StoragePtr temps;
  if (total > 0) temps = runtime::allocate_cuda(total, pl.device);
  // The kernels' single argument, passed by value: the pointers, then the size (CudaSource).
  std::vector<std::uint64_t> words(pl.num_args + 1, 0);
  auto put = [&](std::size_t i, const void* p) { std::memcpy(&words[i], &p, sizeof p); };
  const std::size_t nout = args.outputs.size();
  for (std::size_t i = 0; i < pl.leaves; ++i) put(i, args.inputs[i]);
  for (std::size_t i = 0; i < nout; ++i) put(pl.leaves + i, args.outputs[i]);
  for (std::size_t i = 0; i < offsets.size(); ++i)
    put(pl.leaves + nout + i, temps ? static_cast<char*>(temps->data) + offsets[i] : nullptr);
  put(pl.num_args - 1, pl.scratch ? pl.scratch->data : nullptr);
  const long long n = size;
  std::memcpy(&words[pl.num_args], &n, sizeof n);
  void* params[] = {words.data()};
  const auto& api = runtime::detail::cuda_driver_state().api;
  ctx.make_current();
  for (std::size_t k = 0; k < pl.functions.size(); ++k) {
    const codegen::CudaKernelInfo& info = pl.kernels[k];
    const unsigned grid = info.grid_for(size);
    runtime::detail::cuda_check(api.launch_kernel(pl.functions[k], grid, 1, 1, info.block, 1, 1, info.shared_bytes,
                                                  ctx.stream, params, nullptr),
                                "cuLaunchKernel", [&] {
                                  return "on cuda:" + std::to_string(ctx.index) + " with grid (" +
                                         std::to_string(grid) + ",1,1) block (" + std::to_string(info.block) +
                                         ",1,1), " + std::to_string(info.shared_bytes) +
                                         " bytes of dynamic shared memory and symbolic size " + std::to_string(size);
                                });
    kiln::detail::counters().launches.fetch_add(1, std::memory_order_relaxed);
  }
  return true;
}

/// Forgets every CUDA symbolic plan (the compiled modules stay loaded).
inline void clear_cuda_symbolic_plans() { detail::cuda_symbolic_plans().clear(); }

/// Forgets every symbolic plan, CPU and CUDA (kiln::reset()).
inline void clear_symbolic_plans() {
  clear_cpu_symbolic_plans();
  clear_cuda_symbolic_plans();
}

}  // namespace kiln::backend
