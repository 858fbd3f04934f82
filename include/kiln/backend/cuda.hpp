#pragma once
// The CUDA executor: a graph is scheduled into fused kernels (the same schedule as on the CPU),
// generated as one CUDA unit, compiled by NVRTC for the device's exact architecture
// (runtime::CudaModuleCache: memory, disk, NVRTC) and launched on the device's stream. Plans
// (schedule, loaded kernels, launch shapes, a scratch buffer for cross-block partials) are
// cached in-process by the graph's structural key plus the alignment of its buffers (vector
// loads need 16-byte aligned pointers, known only at run time), so evaluating the same
// structure again costs a hash lookup, a structural comparison and the launches. Launches are
// asynchronous: work is ordered on the device's stream, and reading results back synchronises.
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/backend/executor.hpp"
#include "kiln/codegen/cuda.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/hash.hpp"
#include "kiln/core/log.hpp"
#include "kiln/core/stats.hpp"
#include "kiln/ir/graph.hpp"
#include "kiln/runtime/cuda_driver.hpp"
#include "kiln/runtime/cuda_memory.hpp"
#include "kiln/runtime/cuda_module.hpp"
#include "kiln/sched/schedule.hpp"

namespace kiln::backend {

namespace detail {

/// Everything needed to run one graph structure on one device with one buffer alignment.
struct CudaPlan {
  ir::Graph graph;                  ///< the structure (compared on lookup: keys can collide)
  codegen::CudaAlignment alignment;  ///< which leaves and outputs were 16-byte aligned
  sched::Schedule schedule;
  std::vector<codegen::CudaKernelInfo> kernels;
  std::vector<runtime::cu::CUfunction> functions;
  std::vector<std::size_t> temp_bytes;
  std::size_t num_args = 0;
  StoragePtr scratch;  ///< cross-block partials; reused by every run (runs are ordered on the stream)
  int device = 0;
};

inline bool same_graph(const ir::Graph& a, const ir::Graph& b) {
  if (a.key != b.key || a.device != b.device || a.outputs != b.outputs || a.output_strides != b.output_strides ||
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

inline std::string cuda_hex(std::uint64_t k) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(k));
  return buf;
}

/// Overrides of the code generator's tuning knobs (0: the default); for benchmarks that
/// compare variants (plans made before a change keep their variant: clear_cuda_plans()).
struct CudaTuning {
  int pointwise_unroll = 0;
  int row_vectors_per_thread = 0;
  int split_blocks_per_sm = 0;
  int pointwise_unroll_heavy = 0;
  int row_cache_shared = 0;  ///< 1 on, -1 off
  int reciprocal_div = 0;    ///< 1 on, -1 off
  int column_vectors_per_thread = 0;
  int column_unroll = 0;
  int pointwise_lanes_heavy = 0;
};
inline CudaTuning& cuda_tuning() {
  static CudaTuning t;
  return t;
}

/// What code generation needs to know about cuda:`device`.
inline codegen::CudaTarget cuda_target(const runtime::CudaContext& ctx) {
  codegen::CudaTarget t;
  const CudaTuning& tune = cuda_tuning();
  if (tune.pointwise_unroll > 0) t.pointwise_unroll = tune.pointwise_unroll;
  if (tune.row_vectors_per_thread > 0) t.row_vectors_per_thread = tune.row_vectors_per_thread;
  if (tune.split_blocks_per_sm > 0) t.split_blocks_per_sm = tune.split_blocks_per_sm;
  if (tune.pointwise_unroll_heavy > 0) t.pointwise_unroll_heavy = tune.pointwise_unroll_heavy;
  if (tune.row_cache_shared != 0) t.row_cache_shared = tune.row_cache_shared > 0;
  if (tune.reciprocal_div != 0) t.reciprocal_div = tune.reciprocal_div > 0;
  if (tune.column_vectors_per_thread > 0) t.column_vectors_per_thread = tune.column_vectors_per_thread;
  if (tune.column_unroll > 0) t.column_unroll = tune.column_unroll;
  if (tune.pointwise_lanes_heavy > 0) t.pointwise_lanes_heavy = tune.pointwise_lanes_heavy;
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

inline std::shared_ptr<const CudaPlan> build_cuda_plan(const ir::Graph& g, const codegen::CudaAlignment& al) {
  auto plan = std::make_shared<CudaPlan>();
  plan->graph = g;
  plan->alignment = al;
  plan->device = g.device.index;
  runtime::CudaContext& ctx = runtime::cuda_context(g.device.index);
  plan->schedule = sched::schedule(g);
  if (log_enabled(LogChannel::schedule))
    log(LogChannel::schedule, "graph " + cuda_hex(g.key) + " on " + g.device.str() + ": " +
                                  std::to_string(plan->schedule.kernels.size()) + " kernel(s)\n" + plan->schedule.str(g));
  // The name carries the alignment class, so the two variants of one graph differ in source.
  std::string prefix = "kiln_" + cuda_hex(g.key) + "_" + cuda_hex(alignment_hash(al)).substr(0, 4);
  codegen::CudaSource src = codegen::generate_cuda(g, plan->schedule, prefix, cuda_target(ctx), al);
  auto& cache = runtime::CudaModuleCache::instance();
  for (auto& k : src.kernels) {
    runtime::cu::CUfunction fn = cache.get_function(src.source, k.name, g.device.index);
    if (k.shared_bytes > 48 * 1024) runtime::set_max_dynamic_shared(ctx, fn, static_cast<int>(k.shared_bytes));
    plan->functions.push_back(fn);
    if (log_enabled(LogChannel::schedule)) log(LogChannel::schedule, k.name + ": " + k.strategy);
  }
  plan->kernels = src.kernels;
  plan->num_args = src.num_args;
  for (auto& t : plan->schedule.temps)
    plan->temp_bytes.push_back(static_cast<std::size_t>(t.shape.numel()) * itemsize(t.dtype));
  if (src.scratch_bytes > 0) plan->scratch = runtime::allocate_cuda(src.scratch_bytes, g.device.index);
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

  std::shared_ptr<const CudaPlan> get(const ir::Graph& g, const codegen::CudaAlignment& al) {
    const std::uint64_t key = kiln::detail::hash_combine(g.key, alignment_hash(al));
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto range = plans_.equal_range(key);
      for (auto it = range.first; it != range.second; ++it)
        if (it->second->alignment.inputs == al.inputs && it->second->alignment.outputs == al.outputs &&
            same_graph(it->second->graph, g))
          return it->second;
    }
    // Built outside the lock: a compile takes long and other graphs must not wait for it (two
    // threads racing for one new graph share its compile through CudaModuleCache).
    auto plan = build_cuda_plan(g, al);
    std::lock_guard<std::mutex> lock(mu_);
    auto range = plans_.equal_range(key);
    for (auto it = range.first; it != range.second; ++it)
      if (it->second->alignment.inputs == al.inputs && it->second->alignment.outputs == al.outputs &&
          same_graph(it->second->graph, g))
        return it->second;
    plans_.emplace(key, plan);
    return plan;
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

/// How `g` runs on its GPU: the schedule, then one line per kernel (strategy, launch shape).
/// Compiles nothing when the plan is cached; otherwise generates the code (without compiling
/// or allocating) to describe it.
inline std::string explain_cuda(const ir::Graph& g) {
  sched::Schedule s = sched::schedule(g);
  std::string out = s.str(g);
  codegen::CudaTarget t;
  if (cuda_available() && g.device.is_cuda()) t = detail::cuda_target(runtime::cuda_context(g.device.index));
  codegen::CudaSource src = codegen::generate_cuda(g, s, "kiln_" + detail::cuda_hex(g.key), t);
  for (std::size_t k = 0; k < src.kernels.size(); ++k) out += "cuda kernel " + std::to_string(k) + ": " + src.kernels[k].strategy + "\n";
  return out;
}

/// Runs `g` on its CUDA device as fused, generated kernels: leaves are read from args.inputs
/// (device pointers), output i is written to args.outputs[i] with g.output_strides[i]. Returns
/// once the kernels are queued on the device's stream. Counts one launch per kernel. Throws
/// DeviceError when CUDA is unavailable (saying why) or the graph is not on a CUDA device,
/// CompileError when a kernel does not compile, DTypeError for a primitive on a dtype it is
/// not defined for.
inline void run_cuda(const ir::Graph& g, const RunArgs& args) {
  if (!g.device.is_cuda()) throw DeviceError("CUDA executor: the graph is on " + g.device.str() + "; it runs CUDA graphs only");
  if (!cuda_available())
    throw DeviceError("CUDA executor: cannot run a graph on " + g.device.str() + ": CUDA is unavailable: " + cuda_unavailable_reason());
  if (args.outputs.size() != g.outputs.size() || g.output_strides.size() != g.outputs.size())
    throw Error("CUDA executor: " + std::to_string(args.outputs.size()) + " output pointers for " +
                std::to_string(g.outputs.size()) + " outputs");
  if (args.inputs.size() < g.num_leaves())
    throw Error("CUDA executor: " + std::to_string(args.inputs.size()) + " input pointers for " +
                std::to_string(g.num_leaves()) + " leaves");
  std::shared_ptr<const detail::CudaPlan> plan = detail::CudaPlanCache::instance().get(g, detail::alignment_of(args));
  const runtime::CudaContext& ctx = runtime::cuda_context(plan->device);
  const std::size_t leaves = g.num_leaves();
  // The kernels' single argument: a struct of pointers, passed by value.
  void* small[16];
  std::vector<void*> big;
  void** argv = small;
  if (plan->num_args > 16) {
    big.resize(plan->num_args);
    argv = big.data();
  }
  for (std::size_t i = 0; i < leaves; ++i) argv[i] = const_cast<void*>(args.inputs[i]);
  for (std::size_t i = 0; i < args.outputs.size(); ++i) argv[leaves + i] = args.outputs[i];
  // Temporaries come from the device's memory pool and go back to it in stream order once
  // the kernels using them are done (their Storage is released when this function returns).
  std::vector<StoragePtr> temps;
  temps.reserve(plan->temp_bytes.size());
  for (std::size_t i = 0; i < plan->temp_bytes.size(); ++i) {
    temps.push_back(runtime::allocate_cuda(plan->temp_bytes[i], plan->device));
    argv[leaves + args.outputs.size() + i] = temps.back()->data;
  }
  argv[plan->num_args - 1] = plan->scratch ? plan->scratch->data : nullptr;
  void* params[] = {argv};
  for (std::size_t k = 0; k < plan->functions.size(); ++k) {
    const codegen::CudaKernelInfo& info = plan->kernels[k];
    runtime::launch_kernel(ctx, plan->functions[k], {info.grid, 1, 1}, {info.block, 1, 1}, info.shared_bytes, params);
    kiln::detail::counters().launches.fetch_add(1, std::memory_order_relaxed);
  }
}

/// Drops every cached CUDA plan (the compiled modules stay loaded).
inline void clear_cuda_plans() { detail::CudaPlanCache::instance().clear(); }

}  // namespace kiln::backend
