#pragma once
// The types every executor shares: the buffers bound to a graph, the executor modes, the CPU
// launch options of kiln::compile's modes.
#include <cstdint>
#include <vector>

#include "kiln/ir/graph.hpp"

namespace kiln::backend {

/// Pointers bound to a graph's leaves (in leaf order, offset already applied) and outputs
/// (in output order; each is written with graph.output_strides[i]).
struct RunArgs {
  std::vector<const void*> inputs;
  std::vector<void*> outputs;
};

/// Which executor runs graphs.
enum class Mode {
  Auto,   ///< the JIT when it is usable (a compiler / NVRTC found), else the reference executor
  Eager,  ///< the reference executor: op by op, every intermediate materialised
  Jit,    ///< fused, generated and compiled kernels
};

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
  /// Plan products as on a GPU, with cuBLASLt's epilogues (the training ones included), which
  /// the host's product then applies itself (runtime::apply_epilogue): a GPU's step plan run on
  /// the host, for tests. Slower than the host's own plans (the epilogue is a scalar loop).
  bool host_epilogues = false;
  bool operator==(const CpuLaunchOptions&) const = default;
};

/// The placeholder a symbolic leading size has in the graphs given to the symbolic-size plans
/// (large and odd, so that no static size is mistaken for it and no size-based choice is made
/// small; graphs that hold it as a real size are specialised instead).
inline constexpr std::int64_t kSymbolicPlaceholder = 1000003;

class PreparedGraph;    // backend/dispatch.hpp
class CudaGraphRunner;  // backend/cuda.hpp

namespace detail {

/// Elements spanned by a strided view of `shape` (0 when empty; -1 for negative strides, which
/// the autotuners' private output buffers do not support). Used to size buffers that stand in
/// for a graph's outputs.
inline std::int64_t span_elements(const Shape& shape, const Strides& strides) {
  std::int64_t span = 1;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) return 0;
    if (strides[d] < 0) return -1;
    span += (shape[d] - 1) * strides[d];
  }
  return span;
}

}  // namespace detail

}  // namespace kiln::backend
