#pragma once
// The seam where backends plug in: run a captured graph over bound buffers.
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
