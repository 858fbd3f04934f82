#pragma once
// The backend's entry points: everything the front end (tensor/, compile/) asks of the
// scheduler, the code generators, the runtime and the executors, as plain functions over
// captured graphs and bound buffers. It is the one door between the two halves of the library:
//
//   header-only (the default): the definitions (backend/entry_impl.hpp) are included below, and
//     every translation unit compiles the whole pipeline;
//   compiled (KILN_COMPILED_LIBRARY defined, linking kiln::kiln_compiled): they are declared
//     here only and defined once in the library (src/kiln_compiled.cpp), so a user's
//     translation unit parses the front end and the expression templates it instantiates, not
//     the ~15k lines behind this door.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/backend/executor.hpp"
#include "kiln/core/linkage.hpp"
#include "kiln/core/device.hpp"
#include "kiln/core/storage.hpp"
#include "kiln/ir/graph.hpp"

namespace kiln::backend {

/// Runs a captured graph over bound buffers (what kiln::compile's backends return).
using GraphRun = std::function<void(const ir::Graph&, const RunArgs&)>;

namespace entry {

/// A new buffer of `bytes` on `device`.
KILN_ENTRY StoragePtr allocate(std::size_t bytes, Device device);
/// Copies `bytes` between any two devices (blocking).
KILN_ENTRY void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes);
/// Why memory at `p` cannot be viewed as a tensor of `device` ("" when it can, or when nothing
/// can tell): host memory given as a GPU's, or a GPU's memory given as another device's.
KILN_ENTRY std::string memory_mismatch(const void* p, Device device);
/// Runs `g` with the executor `mode` selects for its device.
KILN_ENTRY void run(const ir::Graph& g, const RunArgs& args, Mode mode);
/// How `g` would be run (its kernels), as text.
KILN_ENTRY std::string explain(const ir::Graph& g, Mode mode);
/// Drops every compiled plan and kernel the executors keep in memory.
KILN_ENTRY void clear_caches();
/// Drops the symbolic-size plans and the leading sizes lazy evaluation's automatic-dynamic rule
/// has seen.
KILN_ENTRY void clear_symbolic_state();
/// True when CPU graphs run as compiled kernels under `mode` (a host compiler was found).
KILN_ENTRY bool cpu_uses_jit(Mode mode);
/// True when CUDA graphs can be compiled and run (a driver, a device and NVRTC).
KILN_ENTRY bool cuda_jit_available();

/// `g` bound once to the executor `mode` selects (PreparedGraph), for a caller that runs one
/// structure many times; `auto_dynamic` lets a structure already met at another leading size
/// run its symbolic-size plan.
KILN_ENTRY std::shared_ptr<const PreparedGraph> prepare(ir::Graph g, Mode mode, CpuLaunchOptions launch = {},
                                                        bool auto_dynamic = false);
/// Runs a prepared graph.
KILN_ENTRY void run_prepared(const PreparedGraph& prepared, const RunArgs& args);

/// A CUDA graph of `g`'s launches (CudaGraphRunner), with at most `max_instances` instances.
KILN_ENTRY std::shared_ptr<CudaGraphRunner> cuda_graph_runner(ir::Graph g, std::size_t max_instances, bool autotune);
/// Replays it into caller-owned outputs.
KILN_ENTRY void run_cuda_graph_into(CudaGraphRunner& runner, const RunArgs& args);
/// Replays it with its own static outputs, returned in `outputs`.
KILN_ENTRY void run_cuda_graph(CudaGraphRunner& runner, const std::vector<const void*>& inputs,
                               std::vector<StoragePtr>& outputs);

/// A runner of `canonical` (a graph whose leading size is kSymbolicPlaceholder) at any leading
/// size, read from node `probe` of the concrete graph on each run; empty, with the reason in
/// `why`, when the graph cannot have symbolic-size kernels.
KILN_ENTRY GraphRun symbolic_runner(const ir::Graph& canonical, std::size_t probe, std::string& why);

}  // namespace entry

/// A GraphRun-shaped callable around a CudaGraphRunner (kiln::compile's "kiln" backend in
/// "reduce-overhead" on CUDA); called with caller-owned outputs it copies the results there,
/// and kiln::compile's replays find it (std::function::target) to take the results as they are.
struct CudaGraphRunFn {
  std::shared_ptr<CudaGraphRunner> runner;
  void operator()(const ir::Graph&, const RunArgs& args) const { entry::run_cuda_graph_into(*runner, args); }
};

}  // namespace kiln::backend

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/backend/entry_impl.hpp"
#endif
