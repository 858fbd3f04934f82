#pragma once
// The seam where backends plug in: run a captured graph over bound buffers.
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

}  // namespace kiln::backend
