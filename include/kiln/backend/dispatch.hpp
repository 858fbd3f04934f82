#pragma once
// The executor seam: memory, copies and graph execution for every device, chosen here so the
// front end never names a device-specific executor.
#include <cstring>
#include <string>

#include "kiln/backend/cpu_jit.hpp"
#include "kiln/backend/cuda.hpp"
#include "kiln/backend/executor.hpp"
#include "kiln/backend/reference.hpp"
#include "kiln/runtime/cuda_memory.hpp"
#include "kiln/runtime/host_allocator.hpp"

namespace kiln::backend {

/// A new buffer of `bytes` on `device`.
inline StoragePtr allocate(std::size_t bytes, Device device) {
  if (device.is_cpu()) return runtime::allocate_host(bytes);
  // Stream-ordered, from the device's pool; a DeviceError says why when CUDA is unavailable.
  if (device.is_cuda()) return runtime::allocate_cuda(bytes, device.index);
  throw DeviceError("cannot allocate " + std::to_string(bytes) + " bytes on " + device.str() + ": unknown device");
}

/// Copies `bytes` between any two devices (blocking).
inline void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes) {
  if (bytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  // CUDA copies run in order on the device's stream (after every kernel queued there);
  // reading back to the host waits for them.
  if (src_device.is_cpu() && dst_device.is_cuda()) return runtime::copy_host_to_device(dst, src, bytes, dst_device.index);
  if (src_device.is_cuda() && dst_device.is_cpu()) return runtime::copy_device_to_host(dst, src, bytes, src_device.index);
  if (src_device.is_cuda() && dst_device.is_cuda()) {
    if (src_device.index == dst_device.index) return runtime::copy_device_to_device(dst, src, bytes, src_device.index);
    // Between two GPUs: staged through the host.
    StoragePtr staging = runtime::allocate_host(bytes);
    runtime::copy_device_to_host(staging->data, src, bytes, src_device.index);
    runtime::copy_host_to_device(dst, staging->data, bytes, dst_device.index);
    runtime::synchronize_cuda(dst_device.index);
    return;
  }
  throw DeviceError("copy from " + src_device.str() + " to " + dst_device.str() + ": unknown device");
}

/// True when CPU graphs run as fused, compiled kernels under `mode`: Jit and Auto need a host
/// compiler (without one, Auto falls back to the reference executor after one warning).
inline bool cpu_uses_jit(Mode mode) {
  if (mode == Mode::Eager) return false;
  if (mode == Mode::Jit) return true;
  return cpu_jit_available();
}

/// Runs `g` with the executor `mode` selects for its device.
inline void run(const ir::Graph& g, const RunArgs& args, Mode mode) {
  // CUDA graphs always run as fused kernels (the reference executor reads host memory).
  if (g.device.is_cuda()) return run_cuda(g, args);
  if (!g.device.is_cpu()) throw DeviceError("no executor for device " + g.device.str());
  if (cpu_uses_jit(mode)) run_cpu_jit(g, args);
  else run_reference(g, args);
}

/// A graph bound once to the executor `mode` selects, for callers that run one structure many
/// times (the typed fast path of assign, kiln::compile's replays): a run skips the plan lookup.
class PreparedGraph {
 public:
  PreparedGraph(ir::Graph g, Mode mode) : graph_(std::move(g)), mode_(mode) {
    if (graph_.device.is_cpu() && cpu_uses_jit(mode_)) cpu_plan_ = cpu_plan(graph_);
  }
  void run(const RunArgs& args) const {
    if (cpu_plan_) run_cpu_plan(*cpu_plan_, args);
    else backend::run(graph_, args, mode_);
  }
  const ir::Graph& graph() const { return graph_; }

 private:
  ir::Graph graph_;
  Mode mode_;
  CpuPlanPtr cpu_plan_;  // CUDA plans also depend on the buffers' alignment: run_cuda looks them up
};

/// How `g` would be run (its kernels), as text.
inline std::string explain(const ir::Graph& g, Mode mode) {
  if (g.device.is_cuda()) return "CUDA kernels:\n" + explain_cuda(g);
  if (g.device.is_cpu() && cpu_uses_jit(mode)) return "CPU JIT kernels:\n" + explain_schedule(g);
  return "reference executor: one launch per primitive\n" + g.str();
}

/// Drops every compiled plan and kernel the executors keep in memory.
inline void clear_caches() {
  detail::CpuPlanCache::instance().clear();
  clear_cuda_plans();
  runtime::CpuModuleCache::instance().clear();
}

}  // namespace kiln::backend
