#pragma once
// CUDA graphs through the driver API: a sequence of launches is captured once
// (cuStreamBeginCapture / cuStreamEndCapture), instantiated (cuGraphInstantiateWithFlags) and
// then replayed with one cuGraphLaunch, which costs the host about as much as one kernel
// launch whatever the number of kernels. The entry points are optional (a driver may lack
// them): cuda_graphs_available() says whether they are there.
//
// Capture happens on a private non-blocking stream per device, never on kiln's own stream:
// while a stream is capturing, work that any thread puts on it is recorded instead of run, so
// capturing on the shared stream would swallow other threads' copies and kernels. A replay
// is launched on kiln's stream, in order with everything else kiln does on the device.
#include <atomic>
#include <cstring>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/core/env.hpp"
#include "kiln/core/error.hpp"
#include "kiln/runtime/cuda_driver.hpp"

namespace kiln::runtime {

/// Process-wide CUDA graph counters (tests and benchmarks read them).
struct CudaGraphCounters {
  std::atomic<std::uint64_t> captures{0};  ///< graphs captured and instantiated
  std::atomic<std::uint64_t> replays{0};   ///< cuGraphLaunch calls
};
inline CudaGraphCounters& cuda_graph_counters() {
  static CudaGraphCounters c;
  return c;
}

/// True when the driver is usable and has every CUDA graph entry point kiln uses.
inline bool cuda_graphs_available() {
  const auto& s = detail::cuda_driver_state();
  return s.ok() && s.graphs_missing.empty();
}

/// Why CUDA graphs cannot be used (empty when they can).
inline std::string cuda_graphs_unavailable_reason() {
  const auto& s = detail::cuda_driver_state();
  if (!s.ok()) return "CUDA is unavailable: " + s.reason;
  if (!s.graphs_missing.empty()) return "the CUDA driver '" + s.path + "' lacks " + s.graphs_missing;
  return {};
}

namespace detail {

/// Destroys an executable graph and its graph (either may be null). For destructors: nothing
/// throws, and a failed destroy leaks the graph (at process teardown the driver answers
/// CUDA_ERROR_DEINITIALIZED anyway).
inline void destroy_graph(cu::CUgraphExec exec, cu::CUgraph graph) {
  const auto& api = cuda_driver_state().api;
  if (exec && api.graph_exec_destroy) api.graph_exec_destroy(exec);
  if (graph && api.graph_destroy) api.graph_destroy(graph);
}

/// The private stream graphs are captured on, one per device, made on first use and kept for
/// the life of the process (as kiln's own streams are). The mutex serialises captures on it.
struct CaptureStreams {
  std::mutex mu;
  std::vector<cu::CUstream> streams;
  std::vector<std::unique_ptr<std::mutex>> capture_mu;
};
inline CaptureStreams& capture_streams() {
  static CaptureStreams* s = new CaptureStreams;  // never destroyed (see CudaContext)
  return *s;
}

}  // namespace detail

/// One captured and instantiated CUDA graph on one device. Destroying it while a replay is in
/// flight is allowed: the driver frees an executing graph once it completes.
class CudaGraph {
 public:
  /// Captures the work that `record(stream)` enqueues on `stream` into a graph and
  /// instantiates it. `record` must enqueue only on the stream it is given, and must not
  /// allocate in stream order or synchronise. Throws DeviceError when the driver lacks CUDA
  /// graphs or a capture step fails (the capture is ended and discarded first).
  template <class Record>
  static std::unique_ptr<CudaGraph> capture(const CudaContext& ctx, Record&& record) {
    const auto& api = detail::require_cuda_driver("capture a CUDA graph");
    if (!cuda_graphs_available())
      throw DeviceError("kiln: cannot capture a CUDA graph: " + cuda_graphs_unavailable_reason());
    ctx.make_current();
    const std::string where = "on cuda:" + std::to_string(ctx.index);
    auto& cs = detail::capture_streams();
    cu::CUstream stream = nullptr;
    std::mutex* capture_mu = nullptr;
    {
      std::lock_guard<std::mutex> lock(cs.mu);
      const auto i = static_cast<std::size_t>(ctx.index);
      if (cs.streams.size() <= i) {
        cs.streams.resize(i + 1, nullptr);
        cs.capture_mu.resize(i + 1);
      }
      if (!cs.streams[i]) {
        // Non-blocking: a capturing stream that synchronised with the legacy default stream
        // (another thread's cudaMemcpy) would invalidate the capture.
        detail::cuda_check(api.stream_create(&cs.streams[i], cu::CU_STREAM_NON_BLOCKING), "cuStreamCreate", where);
        cs.capture_mu[i] = std::make_unique<std::mutex>();
      }
      stream = cs.streams[i];
      capture_mu = cs.capture_mu[i].get();
    }
    std::lock_guard<std::mutex> lock(*capture_mu);
    // Thread-local mode: other threads may keep calling the driver while this one captures.
    detail::cuda_check(api.stream_begin_capture(stream, cu::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                       "cuStreamBeginCapture", where);
    cu::CUgraph graph = nullptr;
    try {
      record(stream);
    } catch (...) {
      if (api.stream_end_capture(stream, &graph) == cu::CUDA_SUCCESS && graph) api.graph_destroy(graph);
      throw;
    }
    detail::cuda_check(api.stream_end_capture(stream, &graph), "cuStreamEndCapture", where);
    auto g = std::unique_ptr<CudaGraph>(new CudaGraph(ctx));
    g->graph_ = graph;
    detail::cuda_check(api.graph_instantiate(&g->exec_, graph, 0), "cuGraphInstantiateWithFlags", where);
    cuda_graph_counters().captures.fetch_add(1, std::memory_order_relaxed);
    return g;
  }

  ~CudaGraph() { detail::destroy_graph(exec_, graph_); }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  /// Replays the graph on the device's stream (kiln's stream), after the work queued there.
  void launch() const {
    ctx_->make_current();
    detail::cuda_check(detail::cuda_driver_state().api.graph_launch(exec_, ctx_->stream), "cuGraphLaunch",
                       [&] { return "on cuda:" + std::to_string(ctx_->index); });
    cuda_graph_counters().replays.fetch_add(1, std::memory_order_relaxed);
  }

 private:
  explicit CudaGraph(const CudaContext& ctx) : ctx_(&ctx) {}
  const CudaContext* ctx_;
  cu::CUgraph graph_ = nullptr;
  cu::CUgraphExec exec_ = nullptr;
};

/// Whether CudaLaunchGraph can be used: the driver has its entry points and
/// KILN_CUDA_LAUNCH_GRAPHS is not 0 (read once).
inline bool cuda_launch_graphs_available() {
  static const bool wanted = env::flag("KILN_CUDA_LAUNCH_GRAPHS", true);
  const auto& s = detail::cuda_driver_state();
  return wanted && s.ok() && s.launch_graphs_missing.empty();
}

/// A fixed sequence of kernels, run one after another, as an executable graph whose kernels
/// take one argument block (kiln's kernels take one struct of pointers by value). Queuing it
/// costs the host one cuGraphLaunch plus, when the argument bytes changed since the last
/// launch, one cuGraphExecKernelNodeSetParams per kernel: on an H200 with driver 580 that is
/// 1.1-1.3 us against 3.1-4.2 us for one cuLaunchKernel (docs/performance-gpu.md), so every
/// cached CUDA plan launches this way. Launches already queued keep the arguments they were
/// queued with (the driver snapshots node parameters per launch). Not thread-safe: the owner
/// serialises launches (CudaPlan uses a try-lock and launches plainly when it is taken).
class CudaLaunchGraph {
 public:
  struct Kernel {
    cu::CUfunction function = nullptr;
    unsigned grid = 1, block = 1, shared_bytes = 0;
  };

  /// Builds the graph for `kernels` on `ctx` with `arg_bytes` bytes of arguments, first set
  /// to `args`. Throws DeviceError when a driver call fails.
  static std::unique_ptr<CudaLaunchGraph> build(const CudaContext& ctx, const std::vector<Kernel>& kernels,
                                                const void* args, std::size_t arg_bytes) {
    const auto& api = detail::require_cuda_driver("build a CUDA launch graph");
    if (!cuda_launch_graphs_available())
      throw DeviceError("kiln: cannot build a CUDA launch graph: the driver lacks " +
                        detail::cuda_driver_state().launch_graphs_missing);
    ctx.make_current();
    const std::string where = "on cuda:" + std::to_string(ctx.index);
    auto g = std::unique_ptr<CudaLaunchGraph>(new CudaLaunchGraph(ctx));
    g->last_args_.assign(static_cast<const char*>(args), static_cast<const char*>(args) + arg_bytes);
    detail::cuda_check(api.graph_create(&g->graph_, 0), "cuGraphCreate", where);
    void* params[] = {g->last_args_.data()};
    cu::CUgraphNode previous = nullptr;
    for (const Kernel& k : kernels) {
      cu::KernelNodeParams p = node_params(k, params);
      cu::CUgraphNode node = nullptr;
      detail::cuda_check(
          api.graph_add_kernel_node(&node, g->graph_, previous ? &previous : nullptr, previous ? 1 : 0, &p),
          "cuGraphAddKernelNode_v2", where);
      g->nodes_.push_back(node);
      g->kernels_.push_back(k);
      previous = node;
    }
    detail::cuda_check(api.graph_instantiate(&g->exec_, g->graph_, 0), "cuGraphInstantiateWithFlags", where);
    return g;
  }

  ~CudaLaunchGraph() { detail::destroy_graph(exec_, graph_); }
  CudaLaunchGraph(const CudaLaunchGraph&) = delete;
  CudaLaunchGraph& operator=(const CudaLaunchGraph&) = delete;

  /// Queues the kernels on `stream` (of the graph's device; the context must be current) with
  /// the argument bytes at `args` (arg_bytes of them).
  void launch(const void* args, cu::CUstream stream) {
    const auto& api = detail::cuda_driver_state().api;
    if (std::memcmp(args, last_args_.data(), last_args_.size()) != 0) {
      std::memcpy(last_args_.data(), args, last_args_.size());
      void* params[] = {last_args_.data()};
      for (std::size_t i = 0; i < nodes_.size(); ++i) {
        cu::KernelNodeParams p = node_params(kernels_[i], params);
        detail::cuda_check(api.graph_exec_kernel_node_set_params(exec_, nodes_[i], &p),
                           "cuGraphExecKernelNodeSetParams_v2",
                           [&] { return "on cuda:" + std::to_string(ctx_->index); });
      }
    }
    detail::cuda_check(api.graph_launch(exec_, stream), "cuGraphLaunch", [&] {
      return "on cuda:" + std::to_string(ctx_->index) + " (a launch graph of " + std::to_string(nodes_.size()) +
             " kernel(s))";
    });
  }

  std::size_t size() const { return nodes_.size(); }

 private:
  explicit CudaLaunchGraph(const CudaContext& ctx) : ctx_(&ctx) {}
  static cu::KernelNodeParams node_params(const Kernel& k, void** params) {
    cu::KernelNodeParams p;
    p.func = k.function;
    p.grid_x = k.grid;
    p.block_x = k.block;
    p.shared_bytes = k.shared_bytes;
    p.kernel_params = params;
    return p;
  }
  const CudaContext* ctx_;
  cu::CUgraph graph_ = nullptr;
  cu::CUgraphExec exec_ = nullptr;
  std::vector<cu::CUgraphNode> nodes_;
  std::vector<Kernel> kernels_;
  std::vector<char> last_args_;  ///< the argument bytes the nodes hold now
};

}  // namespace kiln::runtime
