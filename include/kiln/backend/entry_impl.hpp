#pragma once
// The definitions of the backend's entry points (backend/entry.hpp): included by entry.hpp in
// header-only mode, compiled once into kiln::kiln_compiled (src/kiln_compiled.cpp) otherwise.
#include "kiln/backend/cpu_dynamic.hpp"
#include "kiln/backend/cpu_symbolic.hpp"
#include "kiln/backend/cuda.hpp"
#include "kiln/backend/cuda_symbolic.hpp"
#include "kiln/backend/dispatch.hpp"
#include "kiln/backend/entry.hpp"

namespace kiln::backend::entry {

KILN_ENTRY StoragePtr allocate(std::size_t bytes, Device device) { return backend::allocate(bytes, device); }

KILN_ENTRY void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes) {
  backend::copy_bytes(dst, dst_device, src, src_device, bytes);
}

KILN_ENTRY std::string memory_mismatch(const void* p, Device device) {
  return runtime::cuda_pointer_mismatch(p, device);
}

KILN_ENTRY void run(const ir::Graph& g, const RunArgs& args, Mode mode) { backend::run(g, args, mode); }

KILN_ENTRY std::string explain(const ir::Graph& g, Mode mode) { return backend::explain(g, mode); }

KILN_ENTRY void clear_caches() { backend::clear_caches(); }

KILN_ENTRY void clear_symbolic_state() {
  backend::clear_symbolic_plans();
  backend::clear_sizes_seen();
}

KILN_ENTRY bool cpu_uses_jit(Mode mode) { return backend::cpu_uses_jit(mode); }

KILN_ENTRY bool cuda_jit_available() { return backend::cuda_jit_available(); }

KILN_ENTRY std::shared_ptr<const PreparedGraph> prepare(ir::Graph g, Mode mode, CpuLaunchOptions launch,
                                                        bool auto_dynamic) {
  return std::make_shared<const PreparedGraph>(std::move(g), mode, launch, auto_dynamic);
}

KILN_ENTRY void run_prepared(const PreparedGraph& prepared, const RunArgs& args) { prepared.run(args); }

KILN_ENTRY std::shared_ptr<CudaGraphRunner> cuda_graph_runner(ir::Graph g, std::size_t max_instances, bool autotune) {
  // A graph with matrix products is captured as its steps (kernels and cuBLASLt calls).
  if (sched::has_library_calls(g)) return backend::step_cuda_graph_runner(std::move(g), max_instances, autotune);
  return std::make_shared<CudaGraphRunner>(std::move(g), max_instances, autotune);
}

KILN_ENTRY void run_cuda_graph_into(CudaGraphRunner& runner, const RunArgs& args) { runner.run_into(args); }

KILN_ENTRY void run_cuda_graph(CudaGraphRunner& runner, const std::vector<const void*>& inputs,
                               std::vector<StoragePtr>& outputs) {
  runner.run(inputs, outputs);
}

KILN_ENTRY GraphRun symbolic_runner(const ir::Graph& canonical, std::size_t probe, std::string& why) {
  if (sched::has_library_calls(canonical)) {
    why = "it holds a matrix product (library calls are planned for static sizes)";
    return nullptr;
  }
  if (canonical.device.is_cuda()) {
    // Kernels for 16-byte aligned buffers (fresh allocations are); other alignment classes get
    // theirs at their first run, or the graph at its size where they cannot have them.
    auto plan = backend::cuda_symbolic_plan(canonical, why);
    if (!plan) return nullptr;
    return [plan, probe](const ir::Graph& g, const RunArgs& a) {
      if (!backend::run_cuda_symbolic(*plan, a, g.nodes[probe].shape[0])) backend::run_cuda(g, a);
    };
  }
  auto plan = backend::cpu_symbolic_plan(canonical, why);
  if (!plan) return nullptr;
  return [plan, probe](const ir::Graph& g, const RunArgs& a) {
    backend::run_cpu_symbolic(*plan, a, g.nodes[probe].shape[0]);
  };
}

}  // namespace kiln::backend::entry
