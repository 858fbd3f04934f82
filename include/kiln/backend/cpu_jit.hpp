#pragma once
// The CPU JIT executor: a graph is scheduled into fused kernels, generated as one C++/OpenMP
// translation unit, compiled (runtime::CpuModuleCache: memory, disk, compiler) and launched.
// Plans (schedule + loaded kernel pointers) are cached in-process by the graph's structural
// key, so evaluating the same structure again costs a hash lookup, a structural comparison
// and the launches.
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <sstream>
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
#include "kiln/runtime/autotune.hpp"
#include "kiln/runtime/cpu_module.hpp"
#include "kiln/runtime/host_allocator.hpp"
#include "kiln/sched/schedule.hpp"

namespace kiln::backend {

/// How a CPU plan launches its kernels: kiln::compile's modes on the CPU.
struct CpuLaunchOptions {
  /// "reduce-overhead": one call of the graph entry runs every kernel inside one OpenMP
  /// parallel region (a barrier between kernels), instead of one call and one region per kernel.
  bool graph_entry = false;
  /// "max-autotune*": each kernel's thread count (and a split reduction's chunking) is timed on
  /// the first run and the fastest kept; the choice is stored in the disk cache beside the kernels.
  /// PreparedGraph applies it to CUDA graphs too: their kernels' code-generation knobs are timed
  /// (backend/cuda.hpp, tune_cuda_plan).
  bool autotune = false;
  /// "max-autotune": the graph entry is timed too, against the tuned kernels one by one.
  bool autotune_graph = false;
  bool operator==(const CpuLaunchOptions&) const = default;
};

namespace detail {

/// Everything needed to run one graph structure: its schedule and its loaded kernels.
struct CpuPlan {
  ir::Graph graph;  ///< the structure (compared on lookup: keys can collide)
  sched::Schedule schedule;
  std::shared_ptr<runtime::SharedLibrary> library;
  std::vector<codegen::CpuKernelFn> kernels;
  std::vector<std::size_t> temp_bytes;
  CpuLaunchOptions options;
  /// Set when the plan runs through the graph entry (one call per run).
  codegen::CpuKernelFn graph_fn = nullptr;
  codegen::CpuKernelFn graph_entry = nullptr;  ///< the module's graph entry, when it has one
  std::vector<int> threads;                    ///< team size of each kernel
  std::vector<std::int64_t> chunks;            ///< chunk count of each kernel's split reduction (tuned)
  /// Modules of tuned kernel variants (a different chunking is a different compile).
  std::vector<std::shared_ptr<runtime::SharedLibrary>> variants;
  std::string tune_key;  ///< autotune: the key of the stored choice
  bool tuned = false;    ///< autotune: the launch configuration is settled (timed or loaded)
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

inline void apply_tuning(CpuPlan& plan, const std::string& record);

/// Keeps the OpenMP runtime that kernel modules brought in loaded for good. The program itself
/// rarely links it: when kiln::reset() drops the last module, dlclose would unload it while its
/// idle worker threads still sit in its code (a crash at the next wake-up or at exit).
inline void pin_openmp_runtime() {
  static std::atomic<bool> pinned{false};
  if (pinned.load(std::memory_order_relaxed)) return;
  for (const char* name : {"libgomp.so.1", "libomp.so", "libomp.so.5", "libiomp5.so"})
    if (void* h = ::dlopen(name, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE)) {
      ::dlclose(h);  // drops the reference just taken; RTLD_NODELETE keeps the library mapped
      pinned.store(true, std::memory_order_relaxed);
    }
}

inline std::shared_ptr<const CpuPlan> build_cpu_plan(const ir::Graph& g, const CpuLaunchOptions& options = {}) {
  auto plan = std::make_shared<CpuPlan>();
  plan->graph = g;
  plan->options = options;
  plan->schedule = sched::schedule(g);
  if (log_enabled(LogChannel::schedule))
    log(LogChannel::schedule, "graph " + kiln::detail::hex64(g.key) + ": " + std::to_string(plan->schedule.kernels.size()) +
                                  " kernel(s)\n" + plan->schedule.str(g));
  codegen::CppOptions copt;
  copt.graph_entry = options.graph_entry || options.autotune_graph;
  codegen::CppSource src = codegen::generate_cpp(g, plan->schedule, "kiln_" + kiln::detail::hex64(g.key), copt);
  auto& modules = runtime::CpuModuleCache::instance();
  plan->library = modules.get(src.source);
  pin_openmp_runtime();
  for (auto& name : src.entries)
    plan->kernels.push_back(reinterpret_cast<codegen::CpuKernelFn>(plan->library->symbol(name.c_str())));
  if (!src.graph_entry.empty())
    plan->graph_entry = reinterpret_cast<codegen::CpuKernelFn>(plan->library->symbol(src.graph_entry.c_str()));
  if (options.graph_entry) plan->graph_fn = plan->graph_entry;
  for (auto& t : plan->schedule.temps)
    plan->temp_bytes.push_back(static_cast<std::size_t>(t.shape.numel()) * itemsize(t.dtype));
  plan->threads.assign(plan->kernels.size(), cpu_threads());
  for (auto& k : plan->schedule.kernels) plan->chunks.push_back(k.loops.chunks);
  if (options.autotune) {
    // The choice depends on the code (the module's key spells out source, compiler, flags and
    // machine), on the threads available and on whether the graph entry competes.
    plan->tune_key = "kiln autotune cpu v1\nthreads: " + std::to_string(cpu_threads()) +
                     "\ngraph entry: " + (options.autotune_graph ? "timed" : "off") + "\n" + modules.key_text(src.source);
    if (auto record = runtime::load_tuning(plan->tune_key)) apply_tuning(*plan, *record);
  }
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

  std::shared_ptr<const CpuPlan> get(const ir::Graph& g, const CpuLaunchOptions& options = {}) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto p = find(g, options)) {
        kiln::detail::count_plan_hit();
        return p;
      }
    }
    // Built outside the lock: a compile takes long and other graphs must not wait for it
    // (two threads racing for one new graph share its compile through CpuModuleCache).
    auto plan = build_cpu_plan(g, options);
    std::lock_guard<std::mutex> lock(mu_);
    if (auto p = find(g, options)) return p;
    plans_.emplace(g.key, plan);
    return plan;
  }

  /// The plan of `g`'s structure if it was built (a plan hit), else null; builds nothing.
  std::shared_ptr<const CpuPlan> lookup(const ir::Graph& g, const CpuLaunchOptions& options = {}) {
    std::lock_guard<std::mutex> lock(mu_);
    auto p = find(g, options);
    if (p) kiln::detail::count_plan_hit();
    return p;
  }

  /// Replaces the plan of `plan`'s structure and options (autotune: the tuned plan).
  void replace(std::shared_ptr<const CpuPlan> plan) {
    std::lock_guard<std::mutex> lock(mu_);
    auto range = plans_.equal_range(plan->graph.key);
    for (auto it = range.first; it != range.second; ++it)
      if (it->second->options == plan->options && same_structure(it->second->graph, plan->graph)) {
        it->second = std::move(plan);
        return;
      }
    plans_.emplace(plan->graph.key, std::move(plan));
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
  std::shared_ptr<const CpuPlan> find(const ir::Graph& g, const CpuLaunchOptions& options) const {
    auto range = plans_.equal_range(g.key);
    for (auto it = range.first; it != range.second; ++it)
      if (it->second->options == options && same_structure(it->second->graph, g)) return it->second;
    return nullptr;
  }

  mutable std::mutex mu_;
  std::unordered_multimap<std::uint64_t, std::shared_ptr<const CpuPlan>> plans_;
};

}  // namespace detail

/// Whether the CPU JIT can build new kernels here (a working host compiler was found).
inline bool cpu_jit_available() { return runtime::CpuModuleCache::instance().compiler() != nullptr; }

/// The kernel grouping of `g` as text: one line per kernel (kind, iteration space, strategy),
/// then what it reduces and stores.
inline std::string explain_schedule(const ir::Graph& g) { return sched::explain_schedule(g); }

/// The compiled plan of `g`'s structure (schedule + loaded kernels), built on first use and
/// cached in-process; callers that evaluate one structure repeatedly may keep it and call
/// run_cpu_plan, skipping the lookup.
/// `options` selects how the kernels launch (kiln::compile's modes); an autotuned plan whose
/// choice is not stored yet runs as the default until tune_cpu_plan settles it.
using CpuPlanPtr = std::shared_ptr<const detail::CpuPlan>;
inline CpuPlanPtr cpu_plan(const ir::Graph& g, const CpuLaunchOptions& options = {}) {
  if (!g.device.is_cpu()) throw DeviceError("CPU JIT: the graph is on " + g.device.str() + "; it runs CPU graphs only");
  return detail::CpuPlanCache::instance().get(g, options);
}

namespace detail {

/// The kernels' argument array: leaves, outputs, then temporaries (allocated here and kept
/// alive by `temps`).
struct CpuArgv {
  void* small[32];
  std::vector<void*> big;
  std::vector<StoragePtr> temps;
  void** argv = small;
};

inline void bind_cpu_args(const CpuPlan& plan, const RunArgs& args, CpuArgv& a) {
  const ir::Graph& g = plan.graph;
  if (args.outputs.size() != g.outputs.size())
    throw Error("CPU JIT: " + std::to_string(args.outputs.size()) + " output pointers for " + std::to_string(g.outputs.size()) +
                " outputs");
  const std::size_t leaves = g.num_leaves();
  if (args.inputs.size() < leaves)
    throw Error("CPU JIT: " + std::to_string(args.inputs.size()) + " input pointers for " + std::to_string(leaves) + " leaves");
  const std::size_t total = leaves + args.outputs.size() + plan.temp_bytes.size();
  if (total > 32) {
    a.big.resize(total);
    a.argv = a.big.data();
  }
  void** argv = a.argv;
  for (std::size_t i = 0; i < leaves; ++i) argv[i] = const_cast<void*>(args.inputs[i]);
  for (std::size_t i = 0; i < args.outputs.size(); ++i) argv[leaves + i] = args.outputs[i];
  if (!plan.temp_bytes.empty()) {
    a.temps.reserve(plan.temp_bytes.size());
    for (std::size_t i = 0; i < plan.temp_bytes.size(); ++i) {
      a.temps.push_back(runtime::allocate_host(plan.temp_bytes[i]));
      argv[leaves + args.outputs.size() + i] = a.temps.back()->data;
    }
  }
}

/// Pieces a pointwise kernel's shared loop is dealt in by its round-robin candidate.
inline constexpr std::int64_t kPointwisePieces = 16;

/// Kernel `k` of `plan` compiled with `chunks` pieces of its split reduction (a pointwise
/// kernel: its shared loop dealt round-robin in `chunks` pieces), from a module of its own
/// (the module cache and the disk cache serve it again later).
inline codegen::CpuKernelFn chunk_variant(const CpuPlan& plan, std::size_t k, std::int64_t chunks,
                                          std::vector<std::shared_ptr<runtime::SharedLibrary>>& keep) {
  sched::Schedule s = plan.schedule;
  sched::LoopPlan& p = s.kernels[k].loops;
  codegen::CppOptions copt;
  copt.only_kernel = static_cast<int>(k);
  if (s.kernels[k].kind == sched::KernelKind::Pointwise) {
    copt.pointwise_pieces = chunks;
  } else {
    std::int64_t e0 = 1;
    for (int d : p.groups[static_cast<std::size_t>(p.red_groups.front())]) e0 *= s.kernels[k].space[static_cast<std::size_t>(d)];
    p.chunk_len = (e0 + chunks - 1) / chunks;
    p.chunks = (e0 + p.chunk_len - 1) / p.chunk_len;
  }
  codegen::CppSource src = codegen::generate_cpp(plan.graph, s, "kiln_" + kiln::detail::hex64(plan.graph.key) + "_c" + std::to_string(chunks), copt);
  keep.push_back(runtime::CpuModuleCache::instance().get(src.source));
  return reinterpret_cast<codegen::CpuKernelFn>(keep.back()->symbol(src.entries.at(0).c_str()));
}

/// The chunk counts worth timing for kernel `k`: a split reduction's, the scheduler's x {1/2,
/// 1, 2}; a parallel pointwise kernel's, one contiguous block per thread (1, the default) or
/// kPointwisePieces dealt round-robin.
inline std::vector<std::int64_t> chunk_candidates(const sched::Kernel& k) {
  std::vector<std::int64_t> c{k.loops.chunks};
  if (k.kind == sched::KernelKind::Pointwise) {
    if (k.loops.parallel && k.loops.chunks == 1) c.push_back(kPointwisePieces);
    return c;
  }
  if (k.loops.chunks <= 1 || k.loops.red_groups.empty()) return c;
  std::int64_t e0 = 1;
  for (int d : k.loops.groups[static_cast<std::size_t>(k.loops.red_groups.front())]) e0 *= k.space[static_cast<std::size_t>(d)];
  for (std::int64_t v : {k.loops.chunks / 2, k.loops.chunks * 2})
    if (v >= 1 && v <= e0 && std::find(c.begin(), c.end(), v) == c.end()) c.push_back(v);
  return c;
}

/// Team sizes worth timing: 1..n (powers of two and n itself on larger machines).
inline std::vector<int> thread_candidates(int n) {
  std::vector<int> t{n};
  for (int i = 1; i < n; ++i)
    if (n <= 8 || (i & (i - 1)) == 0) t.push_back(i);
  return t;
}

inline std::string tuning_record(const CpuPlan& plan, bool graph) {
  std::string r = "graph " + std::to_string(graph ? 1 : 0) + "\n";
  for (std::size_t k = 0; k < plan.kernels.size(); ++k)
    r += std::to_string(plan.threads[k]) + " " + std::to_string(plan.chunks[k]) + "\n";
  return r;
}

/// Applies a stored choice (tuning_record's text) to `plan`; a record that does not fit the
/// plan leaves it untuned (it is tuned again and overwritten).
inline void apply_tuning(CpuPlan& plan, const std::string& record) {
  std::istringstream in(record);
  std::string word;
  int graph = 0;
  if (!(in >> word >> graph) || word != "graph") return;
  std::vector<int> threads(plan.kernels.size());
  std::vector<std::int64_t> chunks(plan.kernels.size());
  for (std::size_t k = 0; k < plan.kernels.size(); ++k)
    if (!(in >> threads[k] >> chunks[k]) || threads[k] < 1 || chunks[k] < 1) return;
  if (graph && !plan.graph_entry) return;
  for (std::size_t k = 0; k < plan.kernels.size(); ++k) {
    if (chunks[k] != plan.schedule.kernels[k].loops.chunks) {
      auto cands = chunk_candidates(plan.schedule.kernels[k]);
      if (std::find(cands.begin(), cands.end(), chunks[k]) == cands.end()) return;
      plan.kernels[k] = chunk_variant(plan, k, chunks[k], plan.variants);
    }
  }
  plan.threads = threads;
  plan.chunks = chunks;
  if (graph) plan.graph_fn = plan.graph_entry;
  plan.tuned = true;
}

}  // namespace detail

/// Launches `plan`'s kernels over `args` (laid out as for run_cpu_jit on the plan's graph):
/// one call of the graph entry when the plan has one, else each kernel with its team size.
inline void run_cpu_plan(const detail::CpuPlan& plan, const RunArgs& args) {
  detail::CpuArgv a;
  detail::bind_cpu_args(plan, args, a);
  if (plan.graph_fn) {
    plan.graph_fn(a.argv, detail::cpu_threads());
    kiln::detail::counters().launches.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  for (std::size_t k = 0; k < plan.kernels.size(); ++k) {
    plan.kernels[k](a.argv, plan.threads[k]);
    kiln::detail::counters().launches.fetch_add(1, std::memory_order_relaxed);
  }
}

/// Times `plan`'s launch configurations on the buffers of `args` and returns the tuned plan
/// (also stored: in the plan cache, in memory and in the disk cache). Inputs are only read;
/// outputs and temporaries are private copies, so a kernel writing in place runs as often as
/// the timing needs without changing the caller's data. Per kernel, in schedule order: team
/// sizes 1..cpu_threads() and, for split reductions, the scheduler's chunk count x {1/2, 1, 2}
/// (each chunking another compile); with options.autotune_graph the graph entry then competes
/// with the tuned kernels. The default configuration is always a candidate and is kept unless
/// beaten clearly (runtime::pick_fastest).
inline CpuPlanPtr tune_cpu_plan(const detail::CpuPlan& plan, const RunArgs& args) {
  using clock = std::chrono::steady_clock;
  auto start = clock::now();
  auto tuned = std::make_shared<detail::CpuPlan>(plan);
  const ir::Graph& g = plan.graph;
  // Another user of the same graph may have tuned it since this plan was built.
  if (auto record = runtime::load_tuning(plan.tune_key)) {
    detail::apply_tuning(*tuned, *record);
    if (tuned->tuned) {
      detail::CpuPlanCache::instance().replace(tuned);
      return tuned;
    }
  }
  RunArgs priv;
  priv.inputs = args.inputs;
  std::vector<StoragePtr> outs;
  for (std::size_t i = 0; i < g.outputs.size(); ++i) {
    const ir::GraphNode& n = g.nodes[static_cast<std::size_t>(g.outputs[i])];
    std::int64_t span = detail::span_elements(n.shape, g.output_strides[i]);
    if (span < 0) {  // an output walked backwards: not timed, the default stays
      tuned->tuned = true;
      return tuned;
    }
    outs.push_back(runtime::allocate_host(static_cast<std::size_t>(std::max<std::int64_t>(span, 1)) * itemsize(n.dtype)));
    priv.outputs.push_back(outs.back()->data);
  }
  detail::CpuArgv a;
  detail::bind_cpu_args(plan, priv, a);
  void** argv = a.argv;
  std::string report;
  for (std::size_t k = 0; k < plan.kernels.size(); ++k) {
    const sched::Kernel& kern = plan.schedule.kernels[k];
    std::vector<int> teams = kern.loops.parallel ? detail::thread_candidates(detail::cpu_threads()) : std::vector<int>{plan.threads[k]};
    std::vector<std::int64_t> chunkings = kern.loops.parallel ? detail::chunk_candidates(kern) : std::vector<std::int64_t>{kern.loops.chunks};
    if (teams.size() * chunkings.size() <= 1) {  // nothing to choose: the kernel still runs once
      plan.kernels[k](argv, plan.threads[k]);
      continue;
    }
    struct Choice {
      codegen::CpuKernelFn fn;
      int threads;
      std::int64_t chunks;
    };
    std::vector<Choice> choices;
    std::vector<std::function<void()>> runs;
    for (std::int64_t c : chunkings) {
      codegen::CpuKernelFn fn = c == kern.loops.chunks ? plan.kernels[k] : detail::chunk_variant(plan, k, c, tuned->variants);
      for (int t : teams) {
        choices.push_back({fn, t, c});
        runs.push_back([fn, t, argv] { fn(argv, t); });
      }
    }
    std::vector<double> times;
    std::size_t best = runtime::pick_fastest(runs, {}, &times);
    tuned->kernels[k] = choices[best].fn;
    tuned->threads[k] = choices[best].threads;
    tuned->chunks[k] = choices[best].chunks;
    // The chosen configuration writes this kernel's results last, for the kernels after it.
    choices[best].fn(argv, choices[best].threads);
    report += "\n  kernel " + std::to_string(k) + ": threads " + std::to_string(choices[best].threads) + ", chunks " +
              std::to_string(choices[best].chunks) + " (" + std::to_string(times[best] * 1e6) + " us; default " +
              std::to_string(times[0] * 1e6) + " us, " + std::to_string(runs.size()) + " candidates, first round)";
  }
  bool graph = false;
  if (plan.options.autotune_graph && plan.graph_entry) {
    const detail::CpuPlan* t = tuned.get();
    std::vector<std::function<void()>> runs{
        [t, argv] {
          for (std::size_t k = 0; k < t->kernels.size(); ++k) t->kernels[k](argv, t->threads[k]);
        },
        [t, argv] { t->graph_entry(argv, detail::cpu_threads()); }};
    std::vector<double> times;
    graph = runtime::pick_fastest(runs, {}, &times) == 1;
    report += "\n  graph entry: " + std::string(graph ? "chosen" : "not chosen") + " (" + std::to_string(times[1] * 1e6) +
              " us; kernels one by one " + std::to_string(times[0] * 1e6) + " us, first round)";
  }
  if (graph) tuned->graph_fn = tuned->graph_entry;
  tuned->tuned = true;
  runtime::store_tuning(plan.tune_key, detail::tuning_record(*tuned, graph));
  log(LogChannel::cache, "autotune " + runtime::detail::autotune_tag(plan.tune_key) + ": graph " + kiln::detail::hex64(g.key) +
                             " tuned in " + std::to_string(std::chrono::duration<double, std::milli>(clock::now() - start).count()) +
                             " ms" + report);
  detail::CpuPlanCache::instance().replace(tuned);
  return tuned;
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
