#pragma once
// The executor seam: memory, copies and graph execution for every device, chosen here so the
// front end never names a device-specific executor.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>

#include "kiln/backend/cpu_dynamic.hpp"
#include "kiln/backend/cpu_jit.hpp"
#include "kiln/backend/cuda.hpp"
#include "kiln/backend/executor.hpp"
#include "kiln/backend/reference.hpp"
#include "kiln/runtime/cuda_memory.hpp"
#include "kiln/runtime/host_allocator.hpp"
#include "kiln/sched/steps.hpp"

namespace kiln::backend {

/// A new buffer of `bytes` on `device` (defined with the device table below).
inline StoragePtr allocate(std::size_t bytes, Device device);

// Graphs holding library ops run as steps (backend/steps.hpp, included at the end).
inline void run_steps(const ir::Graph& g, const RunArgs& args, Mode mode);
inline std::string explain_steps(const ir::Graph& g, Mode mode);
class StepProgram;
inline std::shared_ptr<const StepProgram> make_step_program(const ir::Graph& g, Mode mode, CpuLaunchOptions launch);
inline void run_step_program(const StepProgram& p, const RunArgs& args);
inline void clear_step_programs();

/// Copies `bytes` between any two devices (blocking).
inline void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes) {
  if (bytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  // CUDA copies run in order on the device's stream (after every kernel queued there);
  // reading back to the host waits for them.
  if (src_device.is_cpu() && dst_device.is_cuda())
    return runtime::copy_host_to_device(dst, src, bytes, dst_device.index);
  if (src_device.is_cuda() && dst_device.is_cpu())
    return runtime::copy_device_to_host(dst, src, bytes, src_device.index);
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

/// Runs `g` one primitive at a time, each as a graph of its own on `run_one`, every
/// intermediate materialised on the graph's device: the eager executor of devices whose
/// kernels are generated (the reference executor only reads host memory).
template <class RunOne>
void run_op_by_op(const ir::Graph& g, const RunArgs& args, RunOne&& run_one) {
  struct Value {
    const void* data = nullptr;
    Strides strides;
  };
  std::vector<Value> values(g.nodes.size());
  std::vector<StoragePtr> keep;
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::GraphNode& n = g.nodes[i];
    if (n.op == ir::Op::Input) {
      values[i] = {args.inputs[static_cast<std::size_t>(n.leaf)], n.strides};
      continue;
    }
    ir::Graph one;
    one.device = g.device;
    RunArgs a;
    ir::GraphNode op = n;
    op.inputs.clear();
    for (auto in : n.inputs) {
      auto found = std::find(n.inputs.begin(), n.inputs.end(), in);
      std::int32_t first = static_cast<std::int32_t>(found - n.inputs.begin());
      if (first < static_cast<std::int32_t>(op.inputs.size())) {  // an input used twice is one leaf
        op.inputs.push_back(op.inputs[first]);
        continue;
      }
      ir::GraphNode leaf;
      leaf.op = ir::Op::Input;
      leaf.dtype = g.nodes[in].dtype;
      leaf.shape = g.nodes[in].shape;
      leaf.strides = values[in].strides;
      leaf.leaf = static_cast<std::int32_t>(a.inputs.size());
      a.inputs.push_back(values[in].data);
      op.inputs.push_back(static_cast<std::int32_t>(one.nodes.size()));
      one.nodes.push_back(std::move(leaf));
    }
    one.nodes.push_back(op);
    one.outputs.push_back(static_cast<std::int32_t>(one.nodes.size() - 1));
    // A graph output is written in place; everything else into a new row-major buffer. An
    // output written over a leaf's memory (Graph::overwrites) is copied there at the end, once
    // every op has read the leaf.
    auto out = std::find(g.outputs.begin(), g.outputs.end(), static_cast<std::int32_t>(i));
    const bool over_a_leaf =
        out != g.outputs.end() && std::any_of(g.overwrites.begin(), g.overwrites.end(), [&](const auto& ol) {
          return ol.first == static_cast<std::int32_t>(out - g.outputs.begin());
        });
    if (out != g.outputs.end() && !over_a_leaf) {
      std::size_t k = static_cast<std::size_t>(out - g.outputs.begin());
      one.output_strides.push_back(g.output_strides[k]);
      a.outputs.push_back(args.outputs[k]);
    } else {
      one.output_strides.push_back(contiguous_strides(n.shape));
      keep.push_back(allocate(static_cast<std::size_t>(n.shape.numel()) * itemsize(n.dtype), g.device));
      a.outputs.push_back(keep.back()->data);
    }
    one.rehash();
    run_one(one, a);
    values[i] = {a.outputs[0], one.output_strides[0]};
  }
  // Outputs that are leaves, or that appear twice, still need their copy.
  for (std::size_t k = 0; k < g.outputs.size(); ++k) {
    std::int32_t o = g.outputs[k];
    if (values[o].data == args.outputs[k]) continue;
    ir::Graph copy;
    copy.device = g.device;
    ir::GraphNode leaf;
    leaf.op = ir::Op::Input;
    leaf.dtype = g.nodes[o].dtype;
    leaf.shape = g.nodes[o].shape;
    leaf.strides = values[o].strides;
    leaf.leaf = 0;
    copy.nodes.push_back(std::move(leaf));
    copy.outputs.push_back(0);
    copy.output_strides.push_back(g.output_strides[k]);
    copy.rehash();
    RunArgs a;
    a.inputs.push_back(values[o].data);
    a.outputs.push_back(args.outputs[k]);
    run_one(copy, a);
  }
}

/// Runs a CPU graph as compiled kernels: its plan when built, else the symbolic-size plan when
/// its structure already ran at another leading size (the automatic-dynamic rule of lazy
/// evaluation, cpu_dynamic.hpp), else a plan built for its sizes.
inline void run_cpu_lazy(const ir::Graph& g, const RunArgs& args) {
  if (auto plan = detail::CpuPlanCache::instance().lookup(g)) return run_cpu_plan(*plan, args);
  DynamicRun dynamic = cpu_dynamic_plan(g);
  if (dynamic.plan) return run_cpu_symbolic(*dynamic.plan, args, dynamic.size);
  run_cpu_jit(g, args);
}

/// What kiln needs of one kind of device: its memory, how its executors run a graph under a
/// mode, explain it and forget their plans. One row per Device::Kind (device_backend()); the
/// functions below read the row instead of naming devices, so a new kind of device is a row.
struct DeviceBackend {
  const char* name;
  StoragePtr (*allocate)(std::size_t bytes, int index);
  void (*run)(const ir::Graph& g, const RunArgs& args, Mode mode);
  std::string (*explain)(const ir::Graph& g, Mode mode);
  void (*clear_caches)();
};

namespace detail {
/// The host: the reference executor (Eager, or no compiler under Auto) or the CPU JIT.
inline DeviceBackend cpu_backend() {
  return {"cpu", [](std::size_t bytes, int) { return runtime::allocate_host(bytes); },
          [](const ir::Graph& g, const RunArgs& args, Mode mode) {
            if (!cpu_uses_jit(mode))
              run_reference(g, args);
            else if (sched::has_library_calls(g))
              run_steps(g, args, mode);
            else
              run_cpu_lazy(g, args);
          },
          [](const ir::Graph& g, Mode mode) {
            if (!cpu_uses_jit(mode)) return "reference executor: one launch per primitive\n" + g.str();
            return sched::has_library_calls(g) ? explain_steps(g, mode) : "CPU JIT kernels:\n" + explain_schedule(g);
          },
          [] {
            detail::CpuPlanCache::instance().clear();
            runtime::clear_autotune_memory();
            runtime::CpuModuleCache::instance().clear();
          }};
}
/// NVIDIA GPUs: generated kernels, fused, or one primitive at a time in eager mode; memory
/// stream-ordered from the device's pool (a DeviceError says why when CUDA is unavailable).
inline DeviceBackend cuda_backend() {
  return {"cuda", [](std::size_t bytes, int index) { return runtime::allocate_cuda(bytes, index); },
          [](const ir::Graph& g, const RunArgs& args, Mode mode) {
            auto run_jit = [](const ir::Graph& one, const RunArgs& a) {
              if (sched::has_library_calls(one))
                run_steps(one, a, Mode::Jit);
              else
                run_cuda(one, a);
            };
            if (mode == Mode::Eager) return run_op_by_op(g, args, run_jit);
            run_jit(g, args);
          },
          [](const ir::Graph& g, Mode mode) {
            return sched::has_library_calls(g) ? explain_steps(g, mode) : "CUDA kernels:\n" + explain_cuda(g);
          },
          [] {
            clear_cuda_plans();
            // The cubins held in memory too (a later use loads them from the disk cache);
            // modules already loaded stay loaded, since launches in flight may still use them.
            runtime::CudaModuleCache::instance().clear_memory();
          }};
}
}  // namespace detail

/// The row of `device`'s kind.
inline const DeviceBackend& device_backend(Device device) {
  static const std::array<DeviceBackend, 2> rows = {detail::cpu_backend(), detail::cuda_backend()};
  const auto k = static_cast<std::size_t>(device.kind);
  if (k >= rows.size()) throw DeviceError("no executor for device " + device.str());
  return rows[k];
}

/// A new buffer of `bytes` on `device`.
inline StoragePtr allocate(std::size_t bytes, Device device) {
  return device_backend(device).allocate(bytes, device.index);
}

/// Runs `g` with the executor `mode` selects for its device.
inline void run(const ir::Graph& g, const RunArgs& args, Mode mode) { device_backend(g.device).run(g, args, mode); }

/// A graph bound once to the executor `mode` selects, for callers that run one structure many
/// times (the typed fast path of assign, kiln::compile's replays): a run skips the plan lookup.
/// `launch` picks how CPU kernels launch (kiln::compile's modes; CUDA graphs ignore it here).
class PreparedGraph {
 public:
  /// `auto_dynamic`: a structure already met at another leading size runs its symbolic-size
  /// plan (the typed assign path of lazy evaluation; kiln::compile decides that itself).
  PreparedGraph(ir::Graph g, Mode mode, CpuLaunchOptions launch = {}, bool auto_dynamic = false)
      : graph_(std::move(g)), mode_(mode), launch_(launch) {
    if (sched::has_library_calls(graph_) && !(graph_.device.is_cpu() && !cpu_uses_jit(mode_)) &&
        !(graph_.device.is_cuda() && mode_ == Mode::Eager)) {
      steps_ = make_step_program(graph_, mode_, launch_);
      return;
    }
    if (!graph_.device.is_cpu() || !cpu_uses_jit(mode_)) return;
    if (auto_dynamic && !launch_.autotune) {
      if (auto p = detail::CpuPlanCache::instance().lookup(graph_, launch_)) {
        cpu_plan_ = std::move(p);
        return;
      }
      dynamic_ = cpu_dynamic_plan(graph_);
      if (dynamic_.plan) return;
    }
    cpu_plan_ = cpu_plan(graph_, launch_);
  }
  void run(const RunArgs& args) const {
    if (steps_) return run_step_program(*steps_, args);
    if (graph_.device.is_cuda() && mode_ != Mode::Eager) return run_cuda_bound(args);
    if (dynamic_.plan) return run_cpu_symbolic(*dynamic_.plan, args, dynamic_.size);
    if (!cpu_plan_) return backend::run(graph_, args, mode_);
    if (!launch_.autotune) return run_cpu_plan(*cpu_plan_, args);
    // Autotuned plans are settled by their first run (timed on these buffers, or the stored
    // choice was loaded when the plan was built); the plan pointer changes once, under the lock.
    CpuPlanPtr plan;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!cpu_plan_->tuned) cpu_plan_ = tune_cpu_plan(*cpu_plan_, args);
      plan = cpu_plan_;
    }
    run_cpu_plan(*plan, args);
  }
  const ir::Graph& graph() const { return graph_; }
  /// The CPU plan in use (null unless the graph runs on the CPU JIT).
  CpuPlanPtr cpu_plan_in_use() const {
    std::lock_guard<std::mutex> lock(mu_);
    return cpu_plan_;
  }

 private:
  // CUDA plans depend on the buffers' alignment too, known only per run: a few are bound here
  // (one per alignment class met), so a run reads the slots without a lock or a structural
  // comparison; a miss asks the process-wide plan cache once, under mu_.
  void run_cuda_bound(const RunArgs& args) const {
    detail::check_cuda_run(graph_, args, cuda_leaves_);
    std::uint64_t mask = 0;
    if (!detail::alignment_mask_of(args.inputs, cuda_leaves_, args.outputs, mask))
      return launch_.autotune ? run_cuda_autotuned(graph_, args) : run_cuda(graph_, args);
    for (const auto& slot : cuda_slots_) {
      const detail::CudaPlan* p = slot.load(std::memory_order_acquire);
      if (!p) break;
      if (p->alignment_mask == mask) return detail::run_cuda_plan(*p, args);
    }
    RunArgs leaves_only;  // the alignment class of the leaves and outputs alone, as the slots key it
    leaves_only.inputs.assign(args.inputs.begin(), args.inputs.begin() + static_cast<std::ptrdiff_t>(cuda_leaves_));
    leaves_only.outputs = args.outputs;
    // max-autotune: the tuned plan (timed on these buffers the first time).
    std::shared_ptr<const detail::CudaPlan> plan =
        launch_.autotune ? detail::tuned_cuda_plan(graph_, detail::alignment_of(leaves_only), args)
                         : detail::CudaPlanCache::instance().get(graph_, detail::alignment_of(leaves_only));
    {
      // When every slot is taken, later runs of this class keep asking the plan cache.
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& slot : cuda_slots_) {
        const detail::CudaPlan* p = slot.load(std::memory_order_acquire);
        if (p && p->alignment_mask == mask) break;
        if (!p) {
          cuda_plans_.push_back(plan);
          slot.store(plan.get(), std::memory_order_release);
          break;
        }
      }
    }
    detail::run_cuda_plan(*plan, args);
  }

  ir::Graph graph_;
  Mode mode_;
  CpuLaunchOptions launch_;
  mutable std::mutex mu_;
  mutable CpuPlanPtr cpu_plan_;
  DynamicRun dynamic_;  ///< set instead of cpu_plan_ when the symbolic-size plan runs this graph
  std::shared_ptr<const StepProgram> steps_;  ///< set when the graph holds library ops
  std::size_t cuda_leaves_ = graph_.num_leaves();
  mutable std::array<std::atomic<const detail::CudaPlan*>, 4> cuda_slots_{};
  mutable std::vector<std::shared_ptr<const detail::CudaPlan>> cuda_plans_;  // owns what the slots point to
};

/// How `g` would be run (its kernels), as text.
inline std::string explain(const ir::Graph& g, Mode mode) { return device_backend(g.device).explain(g, mode); }

/// Drops every compiled plan and kernel the executors keep in memory, on every kind of device.
inline void clear_caches() {
  for (Device d : {Device::cpu(), Device::cuda(0)}) device_backend(d).clear_caches();
  clear_step_programs();
}

}  // namespace kiln::backend

#include "kiln/backend/steps.hpp"
