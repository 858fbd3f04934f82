#pragma once
// The CUDA executor: a graph is scheduled into fused kernels (the same schedule as on the CPU),
// generated as one CUDA unit, compiled by NVRTC for the device's exact architecture
// (runtime::CudaModuleCache: memory, disk, NVRTC) and launched on the device's stream. Plans
// (schedule, loaded kernels, launch shapes, a scratch buffer for cross-block partials) are
// cached in-process by the graph's structural key plus the alignment of its buffers (vector
// loads need 16-byte aligned pointers, known only at run time), so evaluating the same
// structure again costs a hash lookup, a structural comparison and the launches; callers that
// run one structure many times bind its plans instead (PreparedGraph). Launches are
// asynchronous: work is ordered on the device's stream, and reading results back synchronises.
// CudaGraphRunner (the end of this file) replays a graph's launches as one CUDA graph.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/backend/executor.hpp"
#include "kiln/codegen/cuda.hpp"
#include "kiln/core/duration.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/hash.hpp"
#include "kiln/core/log.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/ir/graph.hpp"
#include "kiln/runtime/autotune.hpp"
#include "kiln/runtime/cuda_driver.hpp"
#include "kiln/runtime/cuda_graph.hpp"
#include "kiln/runtime/cuda_memory.hpp"
#include "kiln/runtime/cuda_module.hpp"
#include "kiln/sched/schedule.hpp"

namespace kiln::backend {

namespace detail {

// The tuning knobs are listed once, beside the kinds of kernel that read them: KILN_CUDA_TUNING_KNOBS
// (codegen/cuda/kinds.hpp).

/// Overrides of the code generator's tuning knobs (0: the default); for benchmarks that
/// compare variants (plans made before a change keep their variant: clear_cuda_plans()).
struct CudaTuning {
#define KILN_TUNING_MEMBER(name, kind, readers) int name = 0;
  KILN_CUDA_TUNING_KNOBS(KILN_TUNING_MEMBER)
#undef KILN_TUNING_MEMBER
};

/// Everything needed to run one graph structure on one device with one buffer alignment.
struct CudaPlan {
  ir::Graph graph;                   ///< the structure (compared on lookup: keys can collide)
  codegen::CudaAlignment alignment;  ///< which leaves and outputs were 16-byte aligned
  sched::Schedule schedule;
  std::vector<codegen::CudaKernelInfo> kernels;
  std::vector<runtime::cu::CUfunction> functions;
  std::vector<std::size_t> temp_bytes;
  std::size_t num_args = 0;
  std::size_t leaves = 0;  ///< graph.num_leaves(), counted once
  StoragePtr scratch;      ///< cross-block partials; reused by every run (runs are ordered on the stream)
  int device = 0;
  /// The alignment class as bits (inputs, then outputs), for callers that bind plans
  /// (PreparedGraph); meaningful only when mask_ok (at most 64 buffers).
  std::uint64_t alignment_mask = 0;
  bool mask_ok = false;
  /// Temporaries of one run, laid out in one block: byte offset of each (256-byte aligned).
  std::vector<std::size_t> temp_offsets;
  std::size_t temp_total = 0;
  /// max-autotune: a plan kept apart from the default one of its graph, whose kernels were
  /// generated with the knobs in `tuning` (per kernel) once `tuned` (timed, or loaded from the
  /// record stored under `tune_key`); until then it is the default configuration.
  bool autotune = false;
  bool tuned = false;
  std::vector<CudaTuning> tuning;
  std::string tune_key;
  /// The kernels as one launch graph (runtime::CudaLaunchGraph), made by the first plain run;
  /// runs that find it in use by another thread launch kernel by kernel.
  mutable std::mutex launch_mu;
  mutable std::unique_ptr<runtime::CudaLaunchGraph> launch_graph;
  mutable bool launch_graph_failed = false;  ///< building it failed once (logged): never again
};

/// The alignment bits of a run's buffers; false when there are more than 64 of them.
inline bool alignment_mask_of(const std::vector<const void*>& inputs, std::size_t num_inputs,
                              const std::vector<void*>& outputs, std::uint64_t& mask) {
  if (num_inputs + outputs.size() > 64) return false;
  std::uint64_t m = 0;
  std::size_t bit = 0;
  for (std::size_t i = 0; i < num_inputs; ++i, ++bit)
    if ((reinterpret_cast<std::uintptr_t>(inputs[i]) & 15u) == 0) m |= std::uint64_t(1) << bit;
  for (std::size_t i = 0; i < outputs.size(); ++i, ++bit)
    if ((reinterpret_cast<std::uintptr_t>(outputs[i]) & 15u) == 0) m |= std::uint64_t(1) << bit;
  mask = m;
  return true;
}

inline CudaTuning& cuda_tuning() {
  static CudaTuning t;
  return t;
}

/// The knobs of CudaTuning by name (autotune records and logs).
struct TuningField {
  const char* name;
  int CudaTuning::*member;
  unsigned readers;  ///< the kinds of kernel whose code it can change (codegen::knob_readers)
};
inline const std::vector<TuningField>& tuning_fields() {
  static const std::vector<TuningField> f = {
#define KILN_TUNING_FIELD(name, kind, readers) {#name, &CudaTuning::name, codegen::knob_readers(#name)},
      KILN_CUDA_TUNING_KNOBS(KILN_TUNING_FIELD)
#undef KILN_TUNING_FIELD
  };
  return f;
}

/// "name=value ..." of the knobs `t` sets, or "default".
inline std::string tuning_text(const CudaTuning& t) {
  std::string out;
  for (const auto& f : tuning_fields())
    if (t.*(f.member) != 0) out += (out.empty() ? "" : " ") + std::string(f.name) + "=" + std::to_string(t.*(f.member));
  return out.empty() ? "default" : out;
}

/// Parses tuning_text's output; false on anything else.
inline bool parse_tuning(const std::string& text, CudaTuning& t) {
  t = CudaTuning{};
  if (text == "default") return true;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find(' ', at);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(at, end - at);
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos) return false;
    const std::string name = item.substr(0, eq);
    int value = 0;
    try {
      std::size_t used = 0;
      value = std::stoi(item.substr(eq + 1), &used);
      if (used != item.size() - eq - 1) return false;
    } catch (...) {
      return false;
    }
    bool known = false;
    for (const auto& f : tuning_fields())
      if (name == f.name) {
        t.*(f.member) = value;
        known = true;
      }
    if (!known || value == 0) return false;
    at = end + 1;
  }
  return true;
}

/// Sets the knobs `tune` overrides (0: keep) in `t`.
inline void apply_tuning(codegen::CudaTarget& t, const CudaTuning& tune) {
  auto apply = [](auto& knob, int value, bool is_switch) {
    using Knob = std::remove_reference_t<decltype(knob)>;
    if (is_switch ? value != 0 : value > 0) knob = is_switch ? static_cast<Knob>(value > 0) : static_cast<Knob>(value);
  };
#define KILN_TUNING_APPLY(name, kind, readers) apply(t.name, tune.name, std::string_view(#kind) == "Switch");
  KILN_CUDA_TUNING_KNOBS(KILN_TUNING_APPLY)
#undef KILN_TUNING_APPLY
}

/// What code generation needs to know about cuda:`device` (with the process-wide overrides of
/// cuda_tuning(), for benchmarks of variants).
inline codegen::CudaTarget cuda_target(const runtime::CudaContext& ctx) {
  codegen::CudaTarget t;
  apply_tuning(t, cuda_tuning());
  t.cc_major = ctx.cc_major;
  t.cc_minor = ctx.cc_minor;
  t.sm_count = ctx.sm_count;
  t.max_threads_per_sm = ctx.max_threads_per_sm;
  t.max_shared_per_block_optin = std::max(ctx.max_shared_per_block, ctx.max_shared_per_block_optin);
  t.max_shared_per_sm = ctx.max_shared_per_sm;
  return t;
}

inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

inline std::uint64_t alignment_hash(const codegen::CudaAlignment& a) {
  std::uint64_t h = 0x5bd1e995u;
  for (char c : a.inputs) h = h * 3 + static_cast<std::uint64_t>(c != 0);
  for (char c : a.outputs) h = h * 3 + static_cast<std::uint64_t>(c != 0);
  return kiln::detail::hash_mix(h);
}

/// The kernels' names: the graph's key and the alignment class, so the variants of one graph
/// for two classes differ in source (autotune candidates share it: their kernels compare by code).
inline std::string cuda_kernel_prefix(const ir::Graph& g, const codegen::CudaAlignment& al) {
  return "kiln_" + kiln::detail::hex64(g.key) + "_" + kiln::detail::hex64(alignment_hash(al)).substr(0, 4);
}

/// Per kernel of `s`, the target of `ctx` with that kernel's knobs (`per_kernel` empty: the defaults).
inline std::vector<codegen::CudaTarget> cuda_targets(const runtime::CudaContext& ctx, const sched::Schedule& s,
                                                     const std::vector<CudaTuning>& per_kernel) {
  std::vector<codegen::CudaTarget> t(s.kernels.size(), cuda_target(ctx));
  for (std::size_t k = 0; k < t.size() && k < per_kernel.size(); ++k) apply_tuning(t[k], per_kernel[k]);
  return t;
}

/// Builds the plan of `g` for alignment class `al`: schedule, source (kernel k generated with
/// per_kernel[k]'s knobs when given), compiled and loaded kernels, temporaries, scratch.
/// `source` receives the generated source when not null.
inline std::shared_ptr<CudaPlan> build_cuda_plan(const ir::Graph& g, const codegen::CudaAlignment& al,
                                                 const std::vector<CudaTuning>& per_kernel = {},
                                                 std::string* source = nullptr) {
  auto plan = std::make_shared<CudaPlan>();
  plan->graph = g;
  plan->alignment = al;
  plan->device = g.device.index;
  plan->leaves = g.num_leaves();
  plan->tuning = per_kernel;
  runtime::CudaContext& ctx = runtime::cuda_context(g.device.index);
  plan->schedule = sched::schedule(g);
  if (log_enabled(LogChannel::schedule))
    log(LogChannel::schedule, "graph " + kiln::detail::hex64(g.key) + " on " + g.device.str() + ": " +
                                  std::to_string(plan->schedule.kernels.size()) + " kernel(s)\n" +
                                  plan->schedule.str(g));
  codegen::CudaSource src = codegen::generate_cuda(g, plan->schedule, cuda_kernel_prefix(g, al),
                                                   cuda_targets(ctx, plan->schedule, per_kernel), al);
  auto& cache = runtime::CudaModuleCache::instance();
  for (auto& k : src.kernels) {
    runtime::cu::CUfunction fn = cache.get_function(src.source, k.name, g.device.index);
    if (k.shared_bytes > 48 * 1024) runtime::set_max_dynamic_shared(ctx, fn, static_cast<int>(k.shared_bytes));
    plan->functions.push_back(fn);
    if (log_enabled(LogChannel::schedule)) log(LogChannel::schedule, k.name + ": " + k.strategy);
  }
  plan->kernels = src.kernels;
  plan->num_args = src.num_args;
  for (auto& t : plan->schedule.temps) {
    plan->temp_bytes.push_back(static_cast<std::size_t>(t.shape.numel()) * itemsize(t.dtype));
    plan->temp_offsets.push_back(plan->temp_total);
    plan->temp_total += (plan->temp_bytes.back() + 255) / 256 * 256;
  }
  if (al.inputs.size() + al.outputs.size() <= 64) {
    plan->mask_ok = true;
    std::size_t bit = 0;
    for (char c : al.inputs) plan->alignment_mask |= std::uint64_t(c != 0) << bit++;
    for (char c : al.outputs) plan->alignment_mask |= std::uint64_t(c != 0) << bit++;
  }
  if (src.scratch_bytes > 0) plan->scratch = runtime::allocate_cuda(src.scratch_bytes, g.device.index);
  if (source) *source = std::move(src.source);
  return plan;
}

/// The key of `g`'s autotune record: the device (its name and multiprocessors: the fastest
/// knobs follow the hardware) and the cubin key of the default source (kiln, NVRTC, arch,
/// options, the graph's code and alignment class).
inline std::string cuda_tune_key(const runtime::CudaContext& ctx, const std::string& default_source) {
  auto& cache = runtime::CudaModuleCache::instance();
  return "kiln autotune cuda v1\ndevice " + ctx.name + " sms " + std::to_string(ctx.sm_count) + "\n" +
         cache.cubin_key(default_source, runtime::cubin_arch_for(ctx.cc_major, ctx.cc_minor));
}

/// The record of a tuned plan: one line per kernel, its knobs (tuning_text).
inline std::string cuda_tuning_record(const std::vector<CudaTuning>& per_kernel) {
  std::string r = "cuda kernels " + std::to_string(per_kernel.size()) + "\n";
  for (const auto& t : per_kernel) r += tuning_text(t) + "\n";
  return r;
}

/// Parses cuda_tuning_record's text for `kernels` kernels; false when it does not fit.
inline bool parse_cuda_tuning_record(const std::string& record, std::size_t kernels, std::vector<CudaTuning>& out) {
  std::size_t at = record.find('\n');
  if (at == std::string::npos || record.substr(0, at) != "cuda kernels " + std::to_string(kernels)) return false;
  out.assign(kernels, CudaTuning{});
  for (std::size_t k = 0; k < kernels; ++k) {
    const std::size_t start = at + 1;
    at = record.find('\n', start);
    if (at == std::string::npos || !parse_tuning(record.substr(start, at - start), out[k])) return false;
  }
  return at + 1 == record.size();
}

/// An autotune plan of `g`: the stored choice when there is one (tuned), else the default
/// configuration waiting for tune_cuda_plan (not tuned).
inline std::shared_ptr<CudaPlan> build_autotune_plan(const ir::Graph& g, const codegen::CudaAlignment& al) {
  runtime::CudaContext& ctx = runtime::cuda_context(g.device.index);
  sched::Schedule sch = sched::schedule(g);
  const std::string key = cuda_tune_key(
      ctx, codegen::generate_cuda(g, sch, cuda_kernel_prefix(g, al), cuda_targets(ctx, sch, {}), al).source);
  std::shared_ptr<CudaPlan> plan;
  std::vector<CudaTuning> per_kernel;
  if (auto record = runtime::load_tuning(key);
      record && parse_cuda_tuning_record(*record, sch.kernels.size(), per_kernel)) {
    plan = build_cuda_plan(g, al, per_kernel);
    plan->tuned = true;
  } else {
    plan = build_cuda_plan(g, al);
  }
  plan->autotune = true;
  plan->tune_key = key;
  return plan;
}

/// Thread-safe plan cache keyed by the graph's structural key and the buffers' alignment.
class CudaPlanCache {
 public:
  static CudaPlanCache& instance() {
    // Leaked on purpose, like the module cache: plans hold device memory and kernels that may be
    // queued when static destructors run.
    static CudaPlanCache* cache = new CudaPlanCache;
    return *cache;
  }

  /// The plan of `g` for alignment class `al`; `autotune` asks for its max-autotune plan
  /// (build_autotune_plan), kept apart from the default one.
  std::shared_ptr<const CudaPlan> get(const ir::Graph& g, const codegen::CudaAlignment& al, bool autotune = false) {
    const std::uint64_t key = kiln::detail::hash_combine(g.key, alignment_hash(al));
    auto fits = [&](const CudaPlan& p) {
      return p.autotune == autotune && p.alignment.inputs == al.inputs && p.alignment.outputs == al.outputs;
    };
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto range = plans_.equal_range(key);
      // A caller that passes a plan's own graph (the object itself) needs no structural check.
      const std::shared_ptr<const CudaPlan>* hit = nullptr;
      for (auto it = range.first; it != range.second && !hit; ++it)
        if (&it->second->graph == &g && fits(*it->second)) hit = &it->second;
      for (auto it = range.first; it != range.second && !hit; ++it)
        if (fits(*it->second) && ir::same_graph(it->second->graph, g)) hit = &it->second;
      if (hit) {
        kiln::detail::count_plan_hit();
        return *hit;
      }
    }
    // Built outside the lock: a compile takes long and other graphs must not wait for it (two
    // threads racing for one new graph share its compile through CudaModuleCache).
    std::shared_ptr<const CudaPlan> plan = autotune ? build_autotune_plan(g, al) : build_cuda_plan(g, al);
    std::lock_guard<std::mutex> lock(mu_);
    auto range = plans_.equal_range(key);
    for (auto it = range.first; it != range.second; ++it)
      if (fits(*it->second) && ir::same_graph(it->second->graph, g)) return it->second;
    plans_.emplace(key, plan);
    return plan;
  }

  /// Puts `plan` (an autotune plan, now tuned) in place of the autotune plan of its structure.
  void replace(std::shared_ptr<const CudaPlan> plan) {
    const std::uint64_t key = kiln::detail::hash_combine(plan->graph.key, alignment_hash(plan->alignment));
    std::lock_guard<std::mutex> lock(mu_);
    auto range = plans_.equal_range(key);
    for (auto it = range.first; it != range.second; ++it)
      if (it->second->autotune == plan->autotune && it->second->alignment.inputs == plan->alignment.inputs &&
          it->second->alignment.outputs == plan->alignment.outputs && ir::same_graph(it->second->graph, plan->graph)) {
        it->second = std::move(plan);
        return;
      }
    plans_.emplace(key, std::move(plan));
  }

  /// Forgets every plan (kernels already queued keep their modules, which stay loaded).
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
  std::unordered_multimap<std::uint64_t, std::shared_ptr<const CudaPlan>> plans_;
};

/// The alignment class of a run's buffers, in a per-thread object reused by every call (a
/// cached launch allocates nothing).
inline const codegen::CudaAlignment& alignment_of(const RunArgs& args) {
  thread_local codegen::CudaAlignment al;
  al.inputs.clear();
  al.outputs.clear();
  for (auto p : args.inputs) al.inputs.push_back(aligned16(p));
  for (auto p : args.outputs) al.outputs.push_back(aligned16(p));
  return al;
}

}  // namespace detail

/// Whether CUDA graphs can run here: a driver and a device, and NVRTC to compile kernels.
inline bool cuda_jit_available() { return cuda_available() && runtime::nvrtc_available(); }

/// Compiles, in parallel threads, the cubins that `graphs` (CUDA graphs run one after another,
/// such as the segments of a step program) need when their buffers are 16-byte aligned, as
/// fresh allocations are: their first run then finds every cubin in memory instead of waiting
/// for NVRTC once per graph in turn (a model's first step meets dozens). Host work only (code
/// generation and NVRTC; nothing is loaded or allocated on the device). A compile error is left
/// for the graph's own run to raise with its context; a graph whose buffers turn out
/// misaligned compiles its own variant then.
inline void precompile_cuda_graphs(const std::vector<const ir::Graph*>& graphs) {
  if (graphs.size() < 2 || !cuda_jit_available()) return;
  struct Job {
    std::string source, arch, name;
  };
  std::vector<Job> jobs;
  auto& cache = runtime::CudaModuleCache::instance();
  for (const ir::Graph* g : graphs) {
    if (!g->device.is_cuda() || g->outputs.empty()) continue;
    const runtime::CudaContext& ctx = runtime::cuda_context(g->device.index);
    codegen::CudaAlignment al;
    al.inputs.assign(g->num_leaves(), 1);
    al.outputs.assign(g->outputs.size(), 1);
    try {
      sched::Schedule s = sched::schedule(*g);
      codegen::CudaSource src =
          codegen::generate_cuda(*g, s, detail::cuda_kernel_prefix(*g, al), detail::cuda_targets(ctx, s, {}), al);
      if (src.kernels.empty()) continue;
      jobs.push_back({std::move(src.source), runtime::cubin_arch_for(ctx.cc_major, ctx.cc_minor, cache.nvrtc_identity().archs),
                      src.kernels.front().name + ".cu"});
    } catch (const Error&) {
      // The graph's own run raises it, where its message has the context.
    }
  }
  if (jobs.size() < 2) return;
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i = next++; i < jobs.size(); i = next++) {
      try {
        cache.get_cubin(jobs[i].source, jobs[i].arch, {}, {}, jobs[i].name);
      } catch (...) {
        // As above: the run compiles it again and reports the error.
      }
    }
  };
  const std::size_t threads =
      std::min<std::size_t>(jobs.size(), std::max(1u, std::min(16u, std::thread::hardware_concurrency())));
  std::vector<std::thread> pool;
  for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
}

/// How `g` runs on its GPU: the schedule, then one line per kernel (strategy, launch shape).
/// Compiles nothing when the plan is cached; otherwise generates the code (without compiling
/// or allocating) to describe it.
inline std::string explain_cuda(const ir::Graph& g) {
  sched::Schedule s = sched::schedule(g);
  std::string out = s.str(g);
  codegen::CudaTarget t;
  if (cuda_available() && g.device.is_cuda()) t = detail::cuda_target(runtime::cuda_context(g.device.index));
  codegen::CudaSource src = codegen::generate_cuda(g, s, "kiln_" + kiln::detail::hex64(g.key), t);
  for (std::size_t k = 0; k < src.kernels.size(); ++k)
    out += "cuda kernel " + std::to_string(k) + ": " + src.kernels[k].strategy + "\n";
  return out;
}

namespace detail {

/// Throws what run_cuda throws for a graph that is not a CUDA graph, CUDA being unavailable,
/// or pointer counts that do not fit the graph.
inline void check_cuda_run(const ir::Graph& g, const RunArgs& args, std::size_t leaves) {
  if (!g.device.is_cuda()) [[unlikely]]
    throw DeviceError("CUDA executor: the graph is on " + g.device.str() + "; it runs CUDA graphs only");
  if (!cuda_available()) [[unlikely]]
    throw DeviceError("CUDA executor: cannot run a graph on " + g.device.str() +
                      ": CUDA is unavailable: " + cuda_unavailable_reason());
  if (args.outputs.size() != g.outputs.size() || g.output_strides.size() != g.outputs.size()) [[unlikely]]
    throw Error("CUDA executor: " + std::to_string(args.outputs.size()) + " output pointers for " +
                std::to_string(g.outputs.size()) + " outputs");
  if (args.inputs.size() < leaves) [[unlikely]]
    throw Error("CUDA executor: " + std::to_string(args.inputs.size()) + " input pointers for " +
                std::to_string(leaves) + " leaves");
}

/// Queues `plan`'s kernels on kiln's `stream` through the plan's launch graph (built on first
/// use); false when it cannot (launch graphs unavailable, building failed once, or another
/// thread is launching the plan right now), and the caller launches kernel by kernel.
inline bool launch_via_graph(const CudaPlan& plan, const runtime::CudaContext& ctx, void** argv, std::size_t arg_bytes,
                             runtime::cu::CUstream stream) {
  if (plan.launch_graph_failed || !runtime::cuda_launch_graphs_available()) return false;
  std::unique_lock<std::mutex> lock(plan.launch_mu, std::try_to_lock);
  if (!lock.owns_lock() || plan.launch_graph_failed) return false;
  if (!plan.launch_graph) {
    std::vector<runtime::CudaLaunchGraph::Kernel> ks;
    for (std::size_t k = 0; k < plan.functions.size(); ++k)
      ks.push_back({plan.functions[k], plan.kernels[k].grid, plan.kernels[k].block, plan.kernels[k].shared_bytes});
    try {
      plan.launch_graph = runtime::CudaLaunchGraph::build(ctx, ks, argv, arg_bytes);
    } catch (const Error& e) {
      plan.launch_graph_failed = true;
      log(LogChannel::perf,
          std::string("CUDA launch graph unavailable for a plan (kernels launch one by one): ") + e.what());
      return false;
    }
  }
  plan.launch_graph->launch(argv, stream);
  kiln::detail::counters().launches.fetch_add(plan.functions.size(), std::memory_order_relaxed);
  return true;
}

/// Queues `plan`'s kernels on `stream`: leaves read from inputs[0..leaves), outputs written to
/// outputs, temporaries at `temps` + plan.temp_offsets. Counts one launch per kernel queued on
/// kiln's stream (captured kernels run later, counted by their replays). Used
/// for plain runs (kiln's stream) and for CUDA graph capture (the capture stream).
inline void enqueue_cuda_plan(const CudaPlan& plan, const runtime::CudaContext& ctx, const void* const* inputs,
                              std::size_t leaves, void* const* outputs, std::size_t num_outputs, char* temps,
                              runtime::cu::CUstream stream) {
  // The kernels' single argument: a struct of pointers, passed by value.
  void* small[16];
  std::vector<void*> big;
  void** argv = small;
  if (plan.num_args > 16) {
    big.resize(plan.num_args);
    argv = big.data();
  }
  for (std::size_t i = 0; i < leaves; ++i) argv[i] = const_cast<void*>(inputs[i]);
  for (std::size_t i = 0; i < num_outputs; ++i) argv[leaves + i] = outputs[i];
  for (std::size_t i = 0; i < plan.temp_offsets.size(); ++i)
    argv[leaves + num_outputs + i] = temps + plan.temp_offsets[i];
  argv[plan.num_args - 1] = plan.scratch ? plan.scratch->data : nullptr;
  void* params[] = {argv};
  const auto& api = runtime::detail::cuda_driver_state().api;
  ctx.make_current();
  const bool capturing = stream != ctx.stream;
  // kiln's stream: the plan's launch graph (one cuGraphLaunch, arguments updated when they
  // changed) where the driver has them; a capture records plain launches.
  if (!capturing && launch_via_graph(plan, ctx, argv, plan.num_args * sizeof(void*), stream)) return;
  for (std::size_t k = 0; k < plan.functions.size(); ++k) {
    const codegen::CudaKernelInfo& info = plan.kernels[k];
    // The context was made current once above (runtime::launch_kernel would check it again
    // per kernel); the message is runtime::launch_kernel's.
    runtime::detail::cuda_check(
        api.launch_kernel(plan.functions[k], info.grid, 1, 1, info.block, 1, 1, info.shared_bytes, stream, params,
                          nullptr),
        "cuLaunchKernel", [&] {
          return "on cuda:" + std::to_string(ctx.index) + (capturing ? " while capturing a CUDA graph" : "") +
                 " with grid (" + std::to_string(info.grid) + ",1,1) block (" + std::to_string(info.block) +
                 ",1,1) and " + std::to_string(info.shared_bytes) + " bytes of dynamic shared memory";
        });
    if (!capturing) kiln::detail::counters().launches.fetch_add(1, std::memory_order_relaxed);
  }
}

/// Runs a plan on kiln's stream of its device with the buffers of `args` (already checked).
inline void run_cuda_plan(const CudaPlan& plan, const RunArgs& args) {
  const runtime::CudaContext& ctx = runtime::cuda_context(plan.device);
  // Temporaries: one block from the device's memory pool per run, given back in stream order
  // once the kernels using it are done (when `temps` is released on return).
  StoragePtr temps;
  if (!plan.temp_offsets.empty()) temps = runtime::allocate_cuda(plan.temp_total, plan.device);
  enqueue_cuda_plan(plan, ctx, args.inputs.data(), plan.leaves, args.outputs.data(), args.outputs.size(),
                    temps ? static_cast<char*>(temps->data) : nullptr, ctx.stream);
}

}  // namespace detail

/// Runs `g` on its CUDA device as fused, generated kernels: leaves are read from args.inputs
/// (device pointers), output i is written to args.outputs[i] with g.output_strides[i]. Returns
/// once the kernels are queued on the device's stream. Counts one launch per kernel. Throws
/// DeviceError when CUDA is unavailable (saying why) or the graph is not on a CUDA device,
/// CompileError when a kernel does not compile, DTypeError for a primitive on a dtype it is
/// not defined for.
inline void run_cuda(const ir::Graph& g, const RunArgs& args) {
  detail::check_cuda_run(g, args, g.num_leaves());
  std::shared_ptr<const detail::CudaPlan> plan = detail::CudaPlanCache::instance().get(g, detail::alignment_of(args));
  detail::run_cuda_plan(*plan, args);
}

namespace detail {

/// max-autotune's candidate knobs on CUDA, the default first: one knob moved at a time, around
/// the defaults (codegen::CudaTarget): block size (pointwise threads per block, threads per
/// row), rows per block (warp-per-row kernels), vector width (lanes of heavy kernels, column
/// vectors), unroll (pointwise, uncached rows, columns) and the split of reductions. A candidate that leaves a kernel's
/// code unchanged is not compiled or timed for it.
inline std::vector<CudaTuning> cuda_tuning_candidates() {
  std::vector<CudaTuning> c(1);
  auto one = [&](int CudaTuning::*knob, int value) {
    CudaTuning t;
    t.*knob = value;
    c.push_back(t);
  };
  one(&CudaTuning::pointwise_block, 128);
  one(&CudaTuning::pointwise_block, 512);
  one(&CudaTuning::warp_rows_per_block, 4);
  one(&CudaTuning::warp_rows_per_block, 16);
  one(&CudaTuning::warp_row_vectors, 4);
  one(&CudaTuning::warp_row_vectors, 8);
  one(&CudaTuning::pointwise_unroll, 1);
  one(&CudaTuning::pointwise_unroll, 4);
  one(&CudaTuning::pointwise_unroll_gather, 2);
  one(&CudaTuning::pointwise_unroll_gather, 8);
  one(&CudaTuning::pointwise_unroll_heavy, 2);
  one(&CudaTuning::pointwise_lanes_heavy, 1);
  one(&CudaTuning::pointwise_lanes_heavy, 4);
  one(&CudaTuning::row_vectors_per_thread, 2);
  one(&CudaTuning::row_vectors_per_thread, 8);
  one(&CudaTuning::row_cache_shared, 1);
  one(&CudaTuning::row_cache_load_keep, -1);
  one(&CudaTuning::row_vectors_per_thread_uncached, 16);
  one(&CudaTuning::row_vectors_per_thread_uncached, 64);
  one(&CudaTuning::row_unroll_uncached, 8);
  // Fully unrolled (32 vectors per thread): N6 0.994 x copy against 0.930, but NVRTC takes
  // about 3x as long (490 ms), so only max-autotune, which pays for it once, may choose it.
  one(&CudaTuning::row_unroll_uncached, 32);
  one(&CudaTuning::column_unroll, 2);
  one(&CudaTuning::column_unroll, 8);
  one(&CudaTuning::column_vectors_per_thread, 2);
  one(&CudaTuning::column_split_interleave, 1);
  one(&CudaTuning::split_blocks_per_sm, 2);
  one(&CudaTuning::split_blocks_per_sm, 8);
  return c;
}

/// Which autotune candidates are worth compiling for a graph: `candidates` (indices into the
/// list given, the default first) change the code of some kernel, and per kernel `variants`
/// lists the candidates (indices into `candidates`) that give it code no earlier one gave.
struct TuningVariants {
  std::vector<std::size_t> candidates;
  std::vector<std::vector<std::size_t>> variants;
};

/// TuningVariants of `s` (the schedule of `g`) for `base` (the device) and alignment class
/// `al`: code generation only, nothing compiled. Kernels compare by their code's hash.
inline TuningVariants cuda_tuning_variants(const ir::Graph& g, const sched::Schedule& s,
                                           const codegen::CudaTarget& base, const codegen::CudaAlignment& al,
                                           const std::vector<CudaTuning>& cands) {
  const std::size_t nk = s.kernels.size();
  TuningVariants v;
  v.variants.resize(nk);
  std::vector<std::vector<std::uint64_t>> seen(nk);
  const std::string prefix = cuda_kernel_prefix(g, al);
  // A candidate is generated only when some kernel's kind reads a knob it moves.
  unsigned kinds = 0;
  for (std::size_t k = 0; k < nk; ++k)
    kinds |= static_cast<unsigned>(codegen::cuda_kernel_kind(s, static_cast<int>(k), base));
  for (std::size_t c = 0; c < cands.size(); ++c) {
    unsigned readers = 0;
    bool moves = false;  // the default moves nothing and is always generated
    for (const auto& f : tuning_fields())
      if (cands[c].*(f.member) != 0) {
        moves = true;
        readers |= f.readers;
      }
    if (moves && !(readers & kinds)) continue;
    std::vector<codegen::CudaTarget> targets(nk, base);
    for (auto& t : targets) apply_tuning(t, cands[c]);
    codegen::CudaSource src = codegen::generate_cuda(g, s, prefix, targets, al);
    bool fresh = false;
    for (std::size_t k = 0; k < nk; ++k) {
      if (std::find(seen[k].begin(), seen[k].end(), src.kernels[k].code_hash) != seen[k].end()) continue;
      seen[k].push_back(src.kernels[k].code_hash);
      v.variants[k].push_back(v.candidates.size());
      fresh = true;
    }
    if (fresh) v.candidates.push_back(c);
  }
  return v;
}

/// Times the candidate configurations of `plan` (an autotune plan not tuned yet) per kernel on
/// the inputs of `args` and returns the tuned plan, also stored in the plan cache, in memory and
/// in the disk cache (runtime::store_tuning). Inputs are only read; outputs and temporaries are
/// private buffers (with the callers' 16-byte misalignment, so every variant sees the same
/// alignment class). Each candidate whose code differs for some kernel is compiled once; each
/// kernel is timed alone with CUDA events, in schedule order after the kernels before it ran,
/// over the variants of its code, and keeps the default unless beaten clearly
/// (runtime::pick_fastest_by). Kernels choosing different candidates make one more compile.
inline std::shared_ptr<const CudaPlan> tune_cuda_plan(const CudaPlan& plan, const RunArgs& args) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const ir::Graph& g = plan.graph;
  const int device = plan.device;
  runtime::CudaContext& ctx = runtime::cuda_context(device);
  const auto& api = runtime::detail::cuda_driver_state().api;
  auto settle = [&](std::shared_ptr<CudaPlan> p, std::vector<CudaTuning> per_kernel) {
    p->autotune = true;
    p->tuned = true;
    p->tuning = per_kernel;
    p->tune_key = plan.tune_key;
    runtime::store_tuning(plan.tune_key, cuda_tuning_record(per_kernel));
    CudaPlanCache::instance().replace(p);
    return std::shared_ptr<const CudaPlan>(p);
  };
  const std::size_t nk = plan.functions.size();

  // Private outputs (same misalignment as the caller's) and temporaries.
  std::vector<StoragePtr> keep;
  std::vector<void*> outputs;
  for (std::size_t o = 0; o < g.outputs.size(); ++o) {
    const ir::GraphNode& n = g.nodes[static_cast<std::size_t>(g.outputs[o])];
    const std::int64_t span =
        span_elements(n.shape, g.output_strides[o]) * static_cast<std::int64_t>(itemsize(n.dtype));
    if (span < 0) {  // an output walked backwards: not timed, the defaults stay
      auto p = build_cuda_plan(g, plan.alignment);
      return settle(p, std::vector<CudaTuning>(nk));
    }
    const std::uintptr_t mis = reinterpret_cast<std::uintptr_t>(args.outputs[o]) & 15u;
    keep.push_back(runtime::allocate_cuda(static_cast<std::size_t>(span) + 16, device));
    outputs.push_back(static_cast<char*>(keep.back()->data) + mis);
  }
  StoragePtr temps = plan.temp_total ? runtime::allocate_cuda(plan.temp_total, device) : nullptr;

  // Candidates whose code differs somewhere, compiled; per kernel, the distinct variants.
  const std::vector<CudaTuning> cands = cuda_tuning_candidates();
  struct Built {
    CudaTuning tuning;
    std::shared_ptr<CudaPlan> plan;
    std::vector<void*> argv;
  };
  std::vector<Built> built;
  const TuningVariants tv = cuda_tuning_variants(g, plan.schedule, cuda_target(ctx), plan.alignment, cands);
  const std::vector<std::vector<std::size_t>>& variants = tv.variants;
  for (std::size_t c : tv.candidates) {
    Built b;
    b.tuning = cands[c];
    b.plan = build_cuda_plan(g, plan.alignment, std::vector<CudaTuning>(nk, cands[c]));
    b.argv.assign(b.plan->num_args, nullptr);
    for (std::size_t i = 0; i < plan.leaves; ++i) b.argv[i] = const_cast<void*>(args.inputs[i]);
    for (std::size_t o = 0; o < outputs.size(); ++o) b.argv[plan.leaves + o] = outputs[o];
    for (std::size_t t = 0; t < plan.temp_offsets.size(); ++t)
      b.argv[plan.leaves + outputs.size() + t] = static_cast<char*>(temps->data) + plan.temp_offsets[t];
    b.argv[b.plan->num_args - 1] = b.plan->scratch ? b.plan->scratch->data : nullptr;
    built.push_back(std::move(b));
  }

  ctx.make_current();
  auto launch = [&](Built& b, std::size_t k) {
    void* params[] = {b.argv.data()};
    const codegen::CudaKernelInfo& info = b.plan->kernels[k];
    runtime::detail::cuda_check(api.launch_kernel(b.plan->functions[k], info.grid, 1, 1, info.block, 1, 1,
                                                  info.shared_bytes, ctx.stream, params, nullptr),
                                "cuLaunchKernel", "while autotuning");
  };
  runtime::cu::CUevent ev[2] = {nullptr, nullptr};
  for (auto& e : ev)
    runtime::detail::cuda_check(api.event_create(&e, runtime::cu::CU_EVENT_DEFAULT), "cuEventCreate", "autotune");
  struct Events {
    runtime::cu::CUevent* ev;
    ~Events() {
      const auto& a = runtime::detail::cuda_driver_state().api;
      for (int i = 0; i < 2; ++i)
        if (ev[i]) a.event_destroy(ev[i]);
    }
  } destroy{ev};
  // Seconds of kernel k of `b`: the best of `reps` event-timed launches after one warm-up.
  auto time_kernel = [&](Built& b, std::size_t k, int reps) {
    launch(b, k);
    double best = 1e300;
    for (int r = 0; r < std::max(1, reps); ++r) {
      runtime::detail::cuda_check(api.event_record(ev[0], ctx.stream), "cuEventRecord", "autotune");
      launch(b, k);
      runtime::detail::cuda_check(api.event_record(ev[1], ctx.stream), "cuEventRecord", "autotune");
      runtime::detail::cuda_check(api.event_synchronize(ev[1]), "cuEventSynchronize", "autotune");
      float ms = 0;
      runtime::detail::cuda_check(api.event_elapsed_time(&ms, ev[0], ev[1]), "cuEventElapsedTime", "autotune");
      best = std::min(best, ms * 1e-3);
      runtime::detail::autotune_counters().timed_runs.fetch_add(1, std::memory_order_relaxed);
    }
    return best;
  };

  std::vector<std::size_t> chosen(nk, 0);
  std::string report;
  runtime::AutotuneBudget budget;
  budget.max_reps = 10;
  for (std::size_t k = 0; k < nk; ++k) {
    const auto& v = variants[k];
    if (v.size() > 1) {
      std::vector<double> times;
      const std::size_t best = runtime::pick_fastest_by(
          v.size(), [&](std::size_t i, int reps) { return time_kernel(built[v[i]], k, reps); }, budget, &times);
      chosen[k] = v[best];
      report += "\n  kernel " + std::to_string(k) + ": " + tuning_text(built[chosen[k]].tuning) + " (" +
                std::to_string(times[best] * 1e6) + " us; default " + std::to_string(times[0] * 1e6) + " us, " +
                std::to_string(v.size()) + " variants)";
    }
    // The chosen variant writes this kernel's results last, for the kernels after it.
    launch(built[chosen[k]], k);
  }
  runtime::synchronize_cuda(device);
  std::vector<CudaTuning> per_kernel(nk);
  bool one_candidate = true;
  for (std::size_t k = 0; k < nk; ++k) {
    per_kernel[k] = built[chosen[k]].tuning;
    one_candidate = one_candidate && chosen[k] == chosen[0];
  }
  std::shared_ptr<CudaPlan> result =
      nk > 0 && one_candidate ? built[chosen[0]].plan : build_cuda_plan(g, plan.alignment, per_kernel);
  log(LogChannel::cache, "autotune " + runtime::detail::autotune_tag(plan.tune_key) + ": graph " +
                             kiln::detail::hex64(g.key) + " on " + g.device.str() + " tuned in " +
                             std::to_string(std::chrono::duration<double, std::milli>(clock::now() - start).count()) +
                             " ms, " + std::to_string(built.size()) + " candidate(s) compiled" + report);
  return settle(result, per_kernel);
}

inline std::mutex& cuda_tune_mutex() {
  static std::mutex m;
  return m;
}

/// The max-autotune plan of `g` for alignment class `al`, tuned on the buffers of `args` the
/// first time (one graph at a time: tuning times the GPU, which another tuning would disturb).
inline std::shared_ptr<const CudaPlan> tuned_cuda_plan(const ir::Graph& g, const codegen::CudaAlignment& al,
                                                       const RunArgs& args) {
  auto plan = CudaPlanCache::instance().get(g, al, true);
  if (plan->tuned) return plan;
  std::lock_guard<std::mutex> lock(cuda_tune_mutex());
  plan = CudaPlanCache::instance().get(g, al, true);
  if (plan->tuned) return plan;
  return tune_cuda_plan(*plan, args);
}

}  // namespace detail

/// Runs `g` as run_cuda does with its max-autotune plan: launch configurations timed per kernel
/// on these buffers the first time (the choice stored in the disk cache), reused after that.
inline void run_cuda_autotuned(const ir::Graph& g, const RunArgs& args) {
  detail::check_cuda_run(g, args, g.num_leaves());
  auto plan = detail::tuned_cuda_plan(g, detail::alignment_of(args), args);
  detail::run_cuda_plan(*plan, args);
}

/// Counters of one CudaGraphRunner.
struct CudaGraphStats {
  std::uint64_t captures = 0;      ///< graphs captured (new instances and re-captures)
  std::uint64_t replays = 0;       ///< runs served by one cuGraphLaunch
  std::uint64_t input_copies = 0;  ///< inputs copied into static buffers
  std::uint64_t plain_runs = 0;    ///< runs launched kernel by kernel (no CUDA graphs, or every instance busy)
  std::size_t instances = 0;       ///< captured instances held now
};

/// Work a CudaGraphRunner captures besides one graph's fused kernels: a graph run as steps
/// (generated kernels and library calls, backend/steps.hpp implements it).
class CudaCaptureWork {
 public:
  virtual ~CudaCaptureWork() = default;
  /// Makes ready, outside any capture, what recording over `bound` needs (kernels compiled,
  /// library plans chosen, temporaries allocated); may run the work once on these buffers.
  /// Returns what the recording reads and the replays keep alive.
  virtual std::shared_ptr<const void> prepare(const RunArgs& bound) const = 0;
  /// Enqueues the work over `bound` on `stream` (being captured), with prepare's result.
  virtual void record(const RunArgs& bound, const void* prepared, runtime::cu::CUstream stream) const = 0;
  /// Runs the work on kiln's stream, without a CUDA graph.
  virtual void run(const RunArgs& args) const = 0;
  /// Kernels and library calls one replay of a capture over `prepared` queues.
  virtual std::size_t kernels(const void* prepared) const = 0;
  virtual std::size_t library_calls(const void* prepared) const = 0;
};

/// "reduce-overhead" on CUDA: one graph's launches captured once into a CUDA graph and
/// replayed with one cuGraphLaunch (runtime/cuda_graph.hpp). A graph holding library calls
/// (matrix products) is captured as its steps: kernels and cuBLASLt calls in one graph.
///
/// Outputs: an instance writes into static output buffers that it owns, and a run hands those
/// buffers out as the results (no copy), as torch's CUDA graphs do. Unlike torch, a result is
/// never overwritten while it is alive: an instance is replayed only when nobody else holds
/// its output buffers (their Storage's use count); otherwise another instance is used or
/// captured (up to `max_instances`, so `y = f(x)` in a loop alternates between two), and
/// past that the run launches the kernels plainly into fresh buffers. Raw pointers taken from
/// a result (data_ptr) do not keep it alive: copy a result that must outlive the Tensor.
///
/// Inputs: an instance reads each input where it was when captured. A run whose input sits
/// elsewhere makes that input static: the instance is captured again reading a buffer of its
/// own, and every later run copies the input there first (cuMemcpyDtoDAsync, in stream order);
/// inputs that stay put (weights, the same tensor every call) cost nothing. Temporaries live in
/// the instance; cross-block scratch belongs to the plan (all runs are ordered on one stream).
///
/// Without the driver's CUDA graph entry points every run launches the kernels plainly, after
/// one log line (KILN_LOGS=perf).
class CudaGraphRunner {
 public:
  /// `autotune`: the captured kernels are the graph's max-autotune plan (timed per kernel on
  /// the first capture's buffers, or the stored choice): kiln::compile's "max-autotune" on CUDA.
  /// `work`: what is captured instead of the graph's fused kernels (a graph run as steps).
  explicit CudaGraphRunner(ir::Graph g, std::size_t max_instances = 2, bool autotune = false,
                           std::shared_ptr<const CudaCaptureWork> work = nullptr)
      : graph_(std::move(g)),
        max_instances_(std::max<std::size_t>(1, max_instances)),
        autotune_(autotune),
        work_(std::move(work)) {
    if (!graph_.device.is_cuda())
      throw DeviceError("CUDA graph runner: the graph is on " + graph_.device.str() + "; it runs CUDA graphs only");
    leaves_ = graph_.num_leaves();
    leaf_lead_.assign(leaves_, 0);
    leaf_span_.assign(leaves_, 0);
    for (auto& n : graph_.nodes) {
      if (n.op != ir::Op::Input) continue;
      auto [lead, span] = extent(n.shape, n.strides, itemsize(n.dtype));
      leaf_lead_[static_cast<std::size_t>(n.leaf)] = lead;
      leaf_span_[static_cast<std::size_t>(n.leaf)] = span;
    }
    for (std::size_t o = 0; o < graph_.outputs.size(); ++o) {
      const ir::GraphNode& n = graph_.nodes[static_cast<std::size_t>(graph_.outputs[o])];
      auto [lead, span] = extent(n.shape, graph_.output_strides[o], itemsize(n.dtype));
      if (lead != 0) throw Error("CUDA graph runner: output " + std::to_string(o) + " has negative strides");
      output_span_.push_back(span);
    }
    varying_.assign(leaves_, false);
  }
  CudaGraphRunner(const CudaGraphRunner&) = delete;
  CudaGraphRunner& operator=(const CudaGraphRunner&) = delete;

  const ir::Graph& graph() const { return graph_; }

  /// Runs the graph on `inputs` (device pointers, leaf order, offsets applied). `outputs`
  /// receives one Storage per graph output holding it at offset 0 with
  /// graph().output_strides[i]: an instance's static buffer (see the class comment) or a fresh
  /// one. Returns once the work is queued on the device's stream. Throws as run_cuda does.
  void run(const std::vector<const void*>& inputs, std::vector<StoragePtr>& outputs) {
    RunArgs probe;
    outputs.resize(graph_.outputs.size());
    if (inputs.size() < leaves_) {
      probe.inputs = inputs;
      probe.outputs.resize(graph_.outputs.size());
      detail::check_cuda_run(graph_, probe, leaves_);
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (!use_graphs()) return run_plain(inputs, outputs);
    Instance* pick = nullptr;
    Instance* recapture = nullptr;
    for (auto& inst : instances_) {
      if (!free(*inst)) continue;
      if (reads_in_place(*inst, inputs)) {
        pick = inst.get();
        break;
      }
      if (!recapture) recapture = inst.get();
    }
    if (!pick) {
      // Inputs that moved are copied from now on, in every instance captured from here.
      mark_varying(inputs);
      if (recapture) {
        pick = recapture;
      } else if (instances_.size() < max_instances_) {
        instances_.push_back(std::make_unique<Instance>());
        pick = instances_.back().get();
      } else {
        if (!warned_busy_) {
          log(LogChannel::perf, "CUDA graph of graph " + kiln::detail::hex64(graph_.key) + ": all " +
                                    std::to_string(instances_.size()) +
                                    " instances' outputs are still held; running the kernels plainly into new buffers");
          warned_busy_ = true;
        }
        return run_plain(inputs, outputs);
      }
      try {
        capture(*pick, inputs);
      } catch (...) {
        // A half-made instance must never be replayed: it goes, with whatever it allocated.
        for (auto it = instances_.begin(); it != instances_.end(); ++it)
          if (it->get() == pick) {
            instances_.erase(it);
            break;
          }
        throw;
      }
    }
    const runtime::CudaContext& ctx = runtime::cuda_context(graph_.device.index);
    const auto& api = runtime::detail::cuda_driver_state().api;
    for (std::size_t i = 0; i < leaves_; ++i) {
      if (!pick->static_inputs[i] || leaf_span_[i] == 0) continue;
      ctx.make_current();
      runtime::detail::cuda_check(
          api.memcpy_dtod_async(runtime::detail::device_address(pick->static_inputs[i]->data),
                                runtime::detail::device_address(static_cast<const char*>(inputs[i]) - leaf_lead_[i]),
                                leaf_span_[i], ctx.stream),
          "cuMemcpyDtoDAsync",
          [&] { return "copying input " + std::to_string(i) + " into a CUDA graph's static buffer"; });
      ++stats_.input_copies;
    }
    pick->exec->launch();
    ++stats_.replays;
    // The launch counter counts kernels queued on the device (a capture queues none).
    if (work_) {
      kiln::detail::counters().launches.fetch_add(work_->kernels(pick->work.get()), std::memory_order_relaxed);
      kiln::detail::counters().library_calls.fetch_add(work_->library_calls(pick->work.get()),
                                                       std::memory_order_relaxed);
    } else {
      kiln::detail::counters().launches.fetch_add(pick->plan->functions.size(), std::memory_order_relaxed);
    }
    for (std::size_t o = 0; o < outputs.size(); ++o) outputs[o] = pick->outputs[o];
  }

  /// Runs the graph and copies its results into args.outputs (written with the graph's
  /// output strides): for callers that own the output buffers.
  void run_into(const RunArgs& args) {
    detail::check_cuda_run(graph_, args, leaves_);
    std::vector<StoragePtr> outs;
    run(args.inputs, outs);
    const int device = graph_.device.index;
    for (std::size_t o = 0; o < outs.size(); ++o)
      runtime::copy_device_to_device(args.outputs[o], outs[o]->data, output_span_[o], device);
  }

  CudaGraphStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    CudaGraphStats s = stats_;
    s.instances = instances_.size();
    return s;
  }

 private:
  struct Instance {
    std::shared_ptr<const detail::CudaPlan> plan;
    std::vector<const void*> captured_inputs;  ///< where the graph reads input i
    std::vector<StoragePtr> static_inputs;  ///< non-null: input i is copied here first (at lead bytes before the read)
    std::vector<StoragePtr> outputs;
    StoragePtr temps;
    std::shared_ptr<const void> work;  ///< what the captured work keeps alive (CudaCaptureWork::prepare)
    std::unique_ptr<runtime::CudaGraph> exec;
  };

  /// Bytes before the first element (negative strides) and bytes spanned, of a strided view.
  static std::pair<std::size_t, std::size_t> extent(const Shape& shape, const Strides& strides, std::size_t item) {
    std::int64_t lo = 0, hi = 0;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == 0) return {0, 0};
      const std::int64_t reach = (shape[d] - 1) * strides[d];
      (reach < 0 ? lo : hi) += reach;
    }
    return {static_cast<std::size_t>(-lo) * item, static_cast<std::size_t>(hi - lo + 1) * item};
  }

  bool use_graphs() {
    if (graphs_checked_) return graphs_ok_;
    graphs_checked_ = true;
    graphs_ok_ = runtime::cuda_graphs_available();
    static std::atomic<bool> told{false};  // one line per process, not per graph
    if (!graphs_ok_ && cuda_available() && !told.exchange(true))
      log(LogChannel::perf, "reduce-overhead: CUDA graphs unavailable (" + runtime::cuda_graphs_unavailable_reason() +
                                "); launching kernels one by one");
    return graphs_ok_;
  }

  /// Nobody but this instance holds its outputs: a replay may overwrite them.
  static bool free(const Instance& inst) {
    for (auto& o : inst.outputs)
      if (o.use_count() > 1) return false;
    return true;
  }

  bool reads_in_place(const Instance& inst, const std::vector<const void*>& inputs) const {
    for (std::size_t i = 0; i < leaves_; ++i)
      if (!inst.static_inputs[i] && inst.captured_inputs[i] != inputs[i]) return false;
    return true;
  }

  void mark_varying(const std::vector<const void*>& inputs) {
    for (auto& inst : instances_)
      for (std::size_t i = 0; i < leaves_; ++i)
        if (!inst->static_inputs[i] && inst->captured_inputs[i] != inputs[i]) varying_[i] = true;
  }

  void capture(Instance& inst, const std::vector<const void*>& inputs) {
    const int device = graph_.device.index;
    const runtime::CudaContext& ctx = runtime::cuda_context(device);
    // The instance's buffers are replaced; the old ones go back to the pool in stream order,
    // after the replays that used them (an old executable graph is freed once it completes).
    inst.exec.reset();
    RunArgs bound;
    inst.captured_inputs.assign(leaves_, nullptr);
    inst.static_inputs.assign(leaves_, nullptr);
    for (std::size_t i = 0; i < leaves_; ++i) {
      if (varying_[i]) {
        inst.static_inputs[i] = runtime::allocate_cuda(leaf_span_[i], device);
        inst.captured_inputs[i] = static_cast<const char*>(inst.static_inputs[i]->data) + leaf_lead_[i];
      } else {
        inst.captured_inputs[i] = inputs[i];
      }
    }
    bound.inputs = inst.captured_inputs;
    inst.outputs.clear();
    for (std::size_t o = 0; o < graph_.outputs.size(); ++o) {
      inst.outputs.push_back(runtime::allocate_cuda(output_span_[o], device));
      bound.outputs.push_back(inst.outputs.back()->data);
    }
    if (work_) {
      inst.plan = nullptr;
      inst.temps = nullptr;
      inst.work = work_->prepare(bound);
      inst.exec = runtime::CudaGraph::capture(
          ctx, [&](runtime::cu::CUstream stream) { work_->record(bound, inst.work.get(), stream); });
      ++stats_.captures;
      if (log_enabled(LogChannel::perf))
        log(LogChannel::perf, "CUDA graph captured for graph " + kiln::detail::hex64(graph_.key) + ": " +
                                  std::to_string(work_->kernels(inst.work.get())) + " kernel(s) and " +
                                  std::to_string(work_->library_calls(inst.work.get())) + " library call(s), " +
                                  std::to_string(instances_.size()) + " instance(s)");
      return;
    }
    if (autotune_) {
      // Tuning times the kernels on the instance's buffers, before any input is copied in: the
      // range faults of its gathers are no user's (runtime::CudaContext::synchronize_discarding_faults).
      ctx.synchronize();
      inst.plan = detail::tuned_cuda_plan(graph_, detail::alignment_of(bound), bound);
      ctx.synchronize_discarding_faults();
    } else {
      inst.plan = detail::CudaPlanCache::instance().get(graph_, detail::alignment_of(bound));
    }
    inst.temps = inst.plan->temp_offsets.empty() ? nullptr : runtime::allocate_cuda(inst.plan->temp_total, device);
    char* temps = inst.temps ? static_cast<char*>(inst.temps->data) : nullptr;
    const detail::CudaPlan& plan = *inst.plan;
    inst.exec = runtime::CudaGraph::capture(ctx, [&](runtime::cu::CUstream stream) {
      detail::enqueue_cuda_plan(plan, ctx, bound.inputs.data(), leaves_, bound.outputs.data(), bound.outputs.size(),
                                temps, stream);
    });
    ++stats_.captures;
    if (log_enabled(LogChannel::perf)) {
      std::size_t copied = 0;
      for (auto& st : inst.static_inputs) copied += st != nullptr;
      log(LogChannel::perf, "CUDA graph captured for graph " + kiln::detail::hex64(graph_.key) + ": " +
                                std::to_string(plan.functions.size()) + " kernel(s), " + std::to_string(copied) +
                                " of " + std::to_string(leaves_) + " input(s) copied into static buffers, " +
                                std::to_string(instances_.size()) + " instance(s)");
    }
  }

  void run_plain(const std::vector<const void*>& inputs, std::vector<StoragePtr>& outputs) {
    RunArgs args;
    args.inputs.assign(inputs.begin(), inputs.begin() + static_cast<std::ptrdiff_t>(leaves_));
    for (std::size_t o = 0; o < graph_.outputs.size(); ++o) {
      outputs[o] = runtime::allocate_cuda(output_span_[o], graph_.device.index);
      args.outputs.push_back(outputs[o]->data);
    }
    if (work_)
      work_->run(args);
    else if (autotune_)
      run_cuda_autotuned(graph_, args);
    else
      run_cuda(graph_, args);
    ++stats_.plain_runs;
  }

  ir::Graph graph_;
  std::size_t max_instances_;
  bool autotune_ = false;
  std::shared_ptr<const CudaCaptureWork> work_;
  std::size_t leaves_ = 0;
  std::vector<std::size_t> leaf_lead_, leaf_span_, output_span_;
  std::vector<bool> varying_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Instance>> instances_;
  CudaGraphStats stats_;
  bool graphs_checked_ = false, graphs_ok_ = false, warned_busy_ = false;
};

/// Drops every cached CUDA plan (the compiled modules stay loaded).
inline void clear_cuda_plans() { detail::CudaPlanCache::instance().clear(); }

}  // namespace kiln::backend
