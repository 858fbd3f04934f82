#pragma once
// The CPU JIT executor: a graph is scheduled into fused kernels, generated as one C++/OpenMP
// translation unit, compiled (runtime::CpuModuleCache: memory, disk, compiler) and launched.
// Plans (schedule + loaded kernel pointers) are cached in-process by the graph's structural
// key, so evaluating the same structure again costs a hash lookup, a structural comparison
// and the launches.
#include <dlfcn.h>
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kiln/core/duration.hpp"
#include "kiln/core/index_fault.hpp"
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
  std::vector<int> threads;                    ///< team size of each kernel (kernel_team, or tuned)
  std::vector<double> work;                    ///< estimated work of each kernel (kernel_work)
  int graph_team = 1;                          ///< team of the graph entry: the largest kernel team
  double graph_work = 0;                       ///< work of the graph entry: all kernels'
  std::vector<std::int64_t> chunks;            ///< chunk count of each kernel's split reduction (tuned)
  /// Modules of tuned kernel variants (a different chunking is a different compile).
  std::vector<std::shared_ptr<runtime::SharedLibrary>> variants;
  std::string tune_key;  ///< autotune: the key of the stored choice
  bool tuned = false;    ///< autotune: the launch configuration is settled (timed or loaded)
};

using runtime::available_cpus;

/// Threads of the kernels' OpenMP teams: KILN_NUM_THREADS, else the CPUs this process may run
/// on. The most a kernel gets; team_size and launch_team give kernels with less work fewer.
inline int cpu_threads() {
  static const int n = [] {
    return runtime::configured_cpu_threads();
  }();
  return n;
}

/// How kernels' teams are sized (KILN_THREAD_POLICY).
enum class ThreadPolicy : std::uint8_t {
  Auto,    ///< sized to the work; small and mid-size kernels shrink while the CPUs are busy
  Static,  ///< sized to the work only (no look at the machine's load)
  Fixed,   ///< every kernel the scheduler marks parallel gets cpu_threads(), libgomp as configured (the old behaviour)
};

inline ThreadPolicy parse_thread_policy(const std::string& v) {
  if (v == "fixed") return ThreadPolicy::Fixed;
  if (v == "static") return ThreadPolicy::Static;
  if (!v.empty() && v != "auto")
    runtime::detail::warn("KILN_THREAD_POLICY=" + v + " is not one of auto, static, fixed; using auto");
  return ThreadPolicy::Auto;
}

inline ThreadPolicy thread_policy() {
  static const ThreadPolicy p = parse_thread_policy(env::get("KILN_THREAD_POLICY"));
  return p;
}

/// Work per thread below which a thread costs more than it saves, in work units (kernel_work).
/// Measured on the 2-core machine (docs/performance.md, "Busy machines"): a team of 2 first
/// wins over one thread at about twice this, with the workers woken from sleep as they are
/// after libgomp's shortened spin (kSpinCount).
inline constexpr double kThreadWork = 0.5e6;

/// Work above which a kernel keeps its team on a busy machine: a kernel this long spans several
/// of the OS scheduler's time slices, so its threads' share of the CPUs outweighs waiting for
/// the slowest one at the barrier (measured as kThreadWork).
inline constexpr double kBusyWork = 16e6;

/// libgomp's spin count (`GOMP_SPINCOUNT`) under the auto and static policies: a thread waiting
/// at a barrier or for the next region spins this many pause instructions (about 15-20 us on the
/// 2-core machine), then sleeps. libgomp's default, 300000 (milliseconds), keeps idle workers
/// spinning long after a kernel; on a machine whose CPUs other programs want, they burn the
/// time slices that the team's other threads are waiting for.
inline constexpr const char* kSpinCount = "300";

/// Estimated work of kernel `k` of `s`, in units of one cheap vectorised operation on one
/// element: every value the kernel computes weighs its elements times 1 (cheap op), 4 (division,
/// square root) or 20 (transcendental function), the scheduler's recompute weights; every 4
/// bytes it loads (again in each pass over a row) or stores weigh 1. On the 2-core machine one
/// unit is about 0.04 ns of one core.
inline double kernel_work(const ir::Graph& g, const sched::Schedule& s, std::size_t k) {
  const sched::Kernel& kern = s.kernels[k];
  const double space = static_cast<double>(kern.space.numel());
  const double passes = kern.kind == sched::KernelKind::Reduce ? std::max(1, kern.passes) : 1;
  auto numel = [&](int n) { return static_cast<double>(g.nodes[static_cast<std::size_t>(n)].shape.numel()); };
  auto words = [&](int n) {
    return numel(n) * static_cast<double>(itemsize(g.nodes[static_cast<std::size_t>(n)].dtype)) / 4.0;
  };
  auto weight = [](ir::Op op) {
    switch (ir::op_info(op).cost) {
      case ir::CostClass::Transcendental:
        return 20.0;
      case ir::CostClass::Divide:
        return 4.0;
      case ir::CostClass::Cheap:
        return 1.0;
      case ir::CostClass::Free:
        return 0.0;
    }
    return 1.0;
  };
  std::vector<char> seen(g.nodes.size(), 0);
  double work = 0;
  std::function<void(int)> visit = [&](int n) {
    if (seen[static_cast<std::size_t>(n)]) return;
    seen[static_cast<std::size_t>(n)] = 1;
    const ir::GraphNode& node = g.nodes[static_cast<std::size_t>(n)];
    if (node.op == ir::Op::Input) {
      work += passes * words(n);
      return;
    }
    const bool here = ir::is_reduction(node.op) ? s.owner[static_cast<std::size_t>(n)] == static_cast<int>(k)
                                                : !sched::detail::reads_memory(s, n, static_cast<int>(k), g);
    if (!here) {  // written by another kernel: loaded
      work += passes * std::min(space, words(n));
      return;
    }
    // A reduction works on every element of its input; other values on their own elements
    // (a row-level value once per row).
    const double elements = ir::is_reduction(node.op) && !node.inputs.empty() ? numel(node.inputs[0]) : numel(n);
    work += weight(node.op) * std::min(space, elements);
    for (int i : node.inputs) visit(i);
  };
  for (const sched::Store& st : kern.stores) {
    work += words(st.node);
    visit(st.node);
  }
  for (int r : kern.reductions) visit(r);
  for (int r : kern.finals) visit(r);
  return work;
}

/// Iterations of kernel `kern`'s loop shared among its team (as codegen/cpp.hpp writes it): a
/// team larger than this leaves threads without work.
inline std::int64_t parallel_items(const sched::Kernel& kern) {
  const sched::LoopPlan& p = kern.loops;
  if (kern.kind == sched::KernelKind::Reduce) return std::max<std::int64_t>(1, p.tiles() * p.chunks);
  if (p.order.empty()) return 1;
  auto extent = [&](int gi) {
    std::int64_t e = 1;
    for (int d : p.groups[static_cast<std::size_t>(gi)]) e *= kern.space[static_cast<std::size_t>(d)];
    return e;
  };
  if (p.order.size() == 1) return extent(p.order[0]);
  // The outer loops merged while shorter than 16, as the code generator does.
  std::int64_t lead = extent(p.order[0]);
  for (std::size_t j = 1; lead < 16 && j + 1 < p.order.size(); ++j) lead *= extent(p.order[j]);
  return lead;
}

/// The team of a kernel with `work` units (kernel_work) and `items` shared iterations, given
/// `threads` (cpu_threads()): one thread per kThreadWork units, at least 1, at most `threads`
/// and `items`.
inline int team_size(double work, std::int64_t items, int threads) {
  const double by_work = std::floor(work / kThreadWork);
  const double most =
      static_cast<double>(std::min<std::int64_t>(std::max(threads, 1), std::max<std::int64_t>(items, 1)));
  return static_cast<int>(std::clamp(by_work, 1.0, most));
}

/// The team of kernel `k` of `s` under `policy` with `threads` at most: 1 for kernels the
/// scheduler left serial (they open no parallel region), `threads` for the others under the
/// fixed policy, else team_size.
inline int kernel_team(const ir::Graph& g, const sched::Schedule& s, std::size_t k, int threads, ThreadPolicy policy) {
  const sched::Kernel& kern = s.kernels[k];
  if (policy == ThreadPolicy::Fixed) return threads;
  if (!kern.loops.parallel) return 1;
  return team_size(kernel_work(g, s, k), parallel_items(kern), threads);
}

/// How many CPUs other programs keep busy, from the kernel's count of runnable tasks
/// (/proc/loadavg, "running/total"): sampled at a launch at most every 25 ms (a read costs
/// about 20 us), less this process's own threads in it, scaled to the CPUs this process may
/// use, smoothed over about 100 ms. On a machine without /proc/loadavg it reads 0.
class CpuLoad {
 public:
  static CpuLoad& instance() {
    static CpuLoad* load = new CpuLoad;  // leaked: kernels may launch during static destruction
    return *load;
  }

  /// CPUs free for a team (at least 0), sampling when the last sample is old.
  double free_cpus() {
    const std::int64_t now = now_ns();
    std::int64_t due = next_sample_.load(std::memory_order_relaxed);
    if (now >= due && next_sample_.compare_exchange_strong(due, now + kSampleNs, std::memory_order_relaxed))
      sample(now);
    return std::max(0.0, static_cast<double>(available_cpus()) - busy_.load(std::memory_order_relaxed));
  }

  /// Records that a team of `team` threads just finished: its workers may still be spinning
  /// (counted as running) for a while.
  void team_ended(int team) {
    last_team_.store(team, std::memory_order_relaxed);
    last_team_end_.store(now_ns(), std::memory_order_relaxed);
  }

  /// Other programs' busy CPUs as last smoothed (for logs and tests).
  double busy() const { return busy_.load(std::memory_order_relaxed); }

  /// Folds a sample of `running` runnable tasks (this thread included) taken `now` into the
  /// estimate; `own_spinning` of them are this process's idle workers still spinning.
  void fold(double running, int own_spinning, std::int64_t now) {
    std::lock_guard<std::mutex> lock(mu_);  // a slow read can overlap the next one
    static const double online = [] {
      long n = ::sysconf(_SC_NPROCESSORS_ONLN);
      return n > 0 ? static_cast<double>(n) : 1.0;
    }();
    double others = std::max(0.0, running - 1.0 - own_spinning);
    // Runnable tasks spread over the whole machine; this process competes on its share.
    others *= std::min(1.0, static_cast<double>(available_cpus()) / online);
    const std::int64_t last = last_sample_;
    last_sample_ = now;
    const double old = busy_.load(std::memory_order_relaxed);
    busy_.store(last == 0 || now - last > kForgetNs ? others : old + 0.25 * (others - old), std::memory_order_relaxed);
  }

 private:
  static constexpr std::int64_t kSampleNs = 25'000'000;
  static constexpr std::int64_t kForgetNs = 1'000'000'000;  // a sample this much older is not smoothed in

  static std::int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  void sample(std::int64_t now) {
    int fd = ::open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    char buf[128];
    ssize_t r = ::read(fd, buf, sizeof buf - 1);
    ::close(fd);
    if (r <= 0) return;
    buf[r] = '\0';
    // "0.52 0.58 0.59 3/512 12345": the fourth field counts the tasks running or runnable now.
    const char* p = buf;
    for (int field = 0; field < 3 && p; ++field) {
      p = std::strchr(p, ' ');
      if (p) ++p;
    }
    if (!p) return;
    const double running = std::strtod(p, nullptr);
    // Workers of a team that ended within libgomp's spin are still on a CPU. With kiln's short
    // spin that is well under a millisecond; with the user's own wait policy it can be long.
    const std::int64_t spin_ns = spin_limited() ? 1'000'000 : 1'000'000'000;
    const int team = last_team_.load(std::memory_order_relaxed);
    const bool spinning = team > 1 && now - last_team_end_.load(std::memory_order_relaxed) < spin_ns;
    fold(running, spinning ? team - 1 : 0, now);
  }

  static bool spin_limited();

  std::atomic<std::int64_t> next_sample_{0};
  std::atomic<std::int64_t> last_team_end_{0};
  std::atomic<int> last_team_{1};
  std::atomic<double> busy_{0.0};
  std::mutex mu_;
  std::int64_t last_sample_ = 0;  // guarded by mu_
};

/// Whether kiln set libgomp's spin count for this process (limit_openmp_spinning).
inline std::atomic<bool>& openmp_spin_set() {
  static std::atomic<bool> set{false};
  return set;
}

inline bool CpuLoad::spin_limited() { return openmp_spin_set().load(std::memory_order_relaxed); }

/// Shortens libgomp's spin-wait (GOMP_SPINCOUNT=kSpinCount) for this process, before kiln first
/// loads a kernel library: libgomp reads its settings once, when it is loaded, so this only
/// takes effect when the program has not loaded libgomp itself (built with -fopenmp) and
/// changes nothing the user chose (OMP_WAIT_POLICY or GOMP_SPINCOUNT set) or under the fixed
/// policy. The variable stays set, so child processes inherit it.
inline void limit_openmp_spinning() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (thread_policy() == ThreadPolicy::Fixed || env::raw("OMP_WAIT_POLICY") || env::raw("GOMP_SPINCOUNT")) return;
    if (void* h = ::dlopen("libgomp.so.1", RTLD_NOW | RTLD_NOLOAD)) {  // already loaded: too late
      ::dlclose(h);
      return;
    }
    // setenv is not safe against another thread reading the environment at that moment
    // (POSIX); it runs once, at kiln's first kernel, before any kernel thread exists.
    if (::setenv("GOMP_SPINCOUNT", kSpinCount, 0) == 0) openmp_spin_set().store(true, std::memory_order_relaxed);
  });
}

/// The team a kernel of static team `team` and `work` units launches with now: under the auto
/// policy, a kernel below kBusyWork gets no more threads than there are CPUs left free by other
/// programs (at least one): its threads would otherwise wait for time slices at each barrier.
inline int launch_team(int team, double work) {
  if (team <= 1 || work >= kBusyWork || thread_policy() != ThreadPolicy::Auto) return team;
  const double free = CpuLoad::instance().free_cpus();
  return std::clamp(static_cast<int>(free + 0.5), 1, team);
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
    log(LogChannel::schedule, "graph " + kiln::detail::hex64(g.key) + ": " +
                                  std::to_string(plan->schedule.kernels.size()) + " kernel(s)\n" +
                                  plan->schedule.str(g));
  codegen::CppOptions copt;
  copt.graph_entry = options.graph_entry || options.autotune_graph;
  codegen::CppSource src = codegen::generate_cpp(g, plan->schedule, "kiln_" + kiln::detail::hex64(g.key), copt);
  auto& modules = runtime::CpuModuleCache::instance();
  limit_openmp_spinning();
  plan->library = modules.get(src.source);
  pin_openmp_runtime();
  for (auto& name : src.entries)
    plan->kernels.push_back(reinterpret_cast<codegen::CpuKernelFn>(plan->library->symbol(name.c_str())));
  if (!src.graph_entry.empty())
    plan->graph_entry = reinterpret_cast<codegen::CpuKernelFn>(plan->library->symbol(src.graph_entry.c_str()));
  if (options.graph_entry) plan->graph_fn = plan->graph_entry;
  for (auto& t : plan->schedule.temps)
    plan->temp_bytes.push_back(static_cast<std::size_t>(t.shape.numel()) * itemsize(t.dtype));
  const ThreadPolicy policy = thread_policy();
  for (std::size_t k = 0; k < plan->schedule.kernels.size(); ++k) {
    plan->work.push_back(kernel_work(g, plan->schedule, k));
    plan->threads.push_back(kernel_team(g, plan->schedule, k, cpu_threads(), policy));
    plan->graph_team = std::max(plan->graph_team, plan->threads.back());
    plan->graph_work += plan->work.back();
  }
  if (policy == ThreadPolicy::Fixed) plan->graph_team = cpu_threads();
  for (auto& k : plan->schedule.kernels) plan->chunks.push_back(k.loops.chunks);
  if (log_enabled(LogChannel::schedule)) {
    std::string teams =
        "graph " + kiln::detail::hex64(g.key) + ": teams (of " + std::to_string(cpu_threads()) + " threads):";
    for (std::size_t k = 0; k < plan->threads.size(); ++k)
      teams += " kernel " + std::to_string(k) + " " + std::to_string(plan->threads[k]) + " (work " +
               std::to_string(static_cast<long long>(plan->work[k])) + ")";
    log(LogChannel::schedule, teams);
  }
  if (options.autotune) {
    // The choice depends on the code (the module's key spells out source, compiler, flags and
    // machine), on the threads available and on whether the graph entry competes.
    plan->tune_key = "kiln autotune cpu v1\nthreads: " + std::to_string(cpu_threads()) +
                     "\ngraph entry: " + (options.autotune_graph ? "timed" : "off") + "\n" +
                     modules.key_text(src.source);
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
      if (it->second->options == plan->options && ir::same_graph(it->second->graph, plan->graph)) {
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
      if (it->second->options == options && ir::same_graph(it->second->graph, g)) return it->second;
    return nullptr;
  }

  mutable std::mutex mu_;
  std::unordered_multimap<std::uint64_t, std::shared_ptr<const CpuPlan>> plans_;
};

}  // namespace detail

/// Whether the CPU JIT can build new kernels here (a working host compiler was found).
inline bool cpu_jit_available() {
  detail::limit_openmp_spinning();  // the compiler probe loads an OpenMP library
  return runtime::CpuModuleCache::instance().compiler() != nullptr;
}

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
    throw Error("CPU JIT: " + std::to_string(args.outputs.size()) + " output pointers for " +
                std::to_string(g.outputs.size()) + " outputs");
  const std::size_t leaves = g.num_leaves();
  if (args.inputs.size() < leaves)
    throw Error("CPU JIT: " + std::to_string(args.inputs.size()) + " input pointers for " + std::to_string(leaves) +
                " leaves");
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
    for (int d : p.groups[static_cast<std::size_t>(p.red_groups.front())])
      e0 *= s.kernels[k].space[static_cast<std::size_t>(d)];
    p.chunk_len = (e0 + chunks - 1) / chunks;
    p.chunks = (e0 + p.chunk_len - 1) / p.chunk_len;
  }
  codegen::CppSource src = codegen::generate_cpp(
      plan.graph, s, "kiln_" + kiln::detail::hex64(plan.graph.key) + "_c" + std::to_string(chunks), copt);
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
  for (int d : k.loops.groups[static_cast<std::size_t>(k.loops.red_groups.front())])
    e0 *= k.space[static_cast<std::size_t>(d)];
  for (std::int64_t v : {k.loops.chunks / 2, k.loops.chunks * 2})
    if (v >= 1 && v <= e0 && std::find(c.begin(), c.end(), v) == c.end()) c.push_back(v);
  return c;
}

/// Team sizes worth timing: `first` (the default; n when not given), then 1..n (powers of two
/// and n itself on larger machines).
inline std::vector<int> thread_candidates(int n, int first = 0) {
  if (first < 1) first = n;
  std::vector<int> t{first};
  for (int i = 1; i <= n; ++i)
    if ((n <= 8 || (i & (i - 1)) == 0 || i == n) && i != first) t.push_back(i);
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
/// one call of the graph entry when the plan has one, else each kernel with its team size, as
/// launch_team adjusts it to the machine's load.
inline void run_cpu_plan(const detail::CpuPlan& plan, const RunArgs& args) {
  detail::CpuArgv a;
  detail::bind_cpu_args(plan, args, a);
  auto launch = [](codegen::CpuKernelFn fn, void** argv, int team, double work) {
    const int n = detail::launch_team(team, work);
    fn(argv, n);
    if (n > 1) detail::CpuLoad::instance().team_ended(n);
    kiln::detail::counters().launches.fetch_add(1, std::memory_order_relaxed);
  };
  if (plan.graph_fn)
    launch(plan.graph_fn, a.argv, plan.graph_team, plan.graph_work);
  else
    for (std::size_t k = 0; k < plan.kernels.size(); ++k) launch(plan.kernels[k], a.argv, plan.threads[k], plan.work[k]);
  // A gather's index out of range (core/index_fault.hpp): the kernels read clamped elements, and
  // the run's results are not the user's to see.
  kiln::detail::raise_host_index_fault();
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
    outs.push_back(
        runtime::allocate_host(static_cast<std::size_t>(std::max<std::int64_t>(span, 1)) * itemsize(n.dtype)));
    priv.outputs.push_back(outs.back()->data);
  }
  detail::CpuArgv a;
  detail::bind_cpu_args(plan, priv, a);
  void** argv = a.argv;
  std::string report;
  for (std::size_t k = 0; k < plan.kernels.size(); ++k) {
    const sched::Kernel& kern = plan.schedule.kernels[k];
    std::vector<int> teams = kern.loops.parallel ? detail::thread_candidates(detail::cpu_threads(), plan.threads[k])
                                                 : std::vector<int>{plan.threads[k]};
    std::vector<std::int64_t> chunkings =
        kern.loops.parallel ? detail::chunk_candidates(kern) : std::vector<std::int64_t>{kern.loops.chunks};
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
      codegen::CpuKernelFn fn =
          c == kern.loops.chunks ? plan.kernels[k] : detail::chunk_variant(plan, k, c, tuned->variants);
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
    std::vector<std::function<void()>> runs{[t, argv] {
                                              for (std::size_t k = 0; k < t->kernels.size(); ++k)
                                                t->kernels[k](argv, t->threads[k]);
                                            },
                                            [t, argv] { t->graph_entry(argv, t->graph_team); }};
    std::vector<double> times;
    graph = runtime::pick_fastest(runs, {}, &times) == 1;
    report += "\n  graph entry: " + std::string(graph ? "chosen" : "not chosen") + " (" +
              std::to_string(times[1] * 1e6) + " us; kernels one by one " + std::to_string(times[0] * 1e6) +
              " us, first round)";
  }
  if (graph) tuned->graph_fn = tuned->graph_entry;
  tuned->tuned = true;
  runtime::store_tuning(plan.tune_key, detail::tuning_record(*tuned, graph));
  log(LogChannel::cache, "autotune " + runtime::detail::autotune_tag(plan.tune_key) + ": graph " +
                             kiln::detail::hex64(g.key) + " tuned in " +
                             std::to_string(std::chrono::duration<double, std::milli>(clock::now() - start).count()) +
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
    throw Error("CPU JIT: " + std::to_string(args.outputs.size()) + " output pointers for " +
                std::to_string(g.outputs.size()) + " outputs");
  CpuPlanPtr plan = cpu_plan(g);
  run_cpu_plan(*plan, args);
}

}  // namespace kiln::backend
