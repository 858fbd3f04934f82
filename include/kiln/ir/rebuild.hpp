#pragma once
// The inverse of capture: a captured graph turned back into lazy nodes over given leaves. A
// compiled function's backward is kept as a captured graph (what its shape is does not depend
// on the call) and rebuilt over each call's buffers and incoming gradient when a backward
// reaches it; the rebuilt nodes then fuse with the rest of that backward like any lazy work.
#include <string>
#include <vector>

#include "kiln/ir/builder.hpp"
#include "kiln/ir/graph.hpp"

namespace kiln::ir {

/// Lazy nodes for `graph`'s outputs, its Input leaves bound to `leaves` (by leaf index; a leaf
/// may be lazy too, and must have the captured leaf's shape and dtype).
inline std::vector<NodePtr> rebuild(const Graph& graph, const std::vector<NodePtr>& leaves) {
  std::vector<NodePtr> made(graph.nodes.size());
  for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
    const GraphNode& g = graph.nodes[i];
    if (g.op == Op::Input) {
      const NodePtr& leaf = leaves.at(static_cast<std::size_t>(g.leaf));
      if (!leaf || leaf->shape != g.shape || leaf->dtype != g.dtype)
        detail::invariant_failed("rebuild: leaf " + std::to_string(g.leaf) + " does not match " +
                                 std::string(dtype_name(g.dtype)) + g.shape.str());
      made[i] = leaf;
      continue;
    }
    std::vector<NodePtr> inputs;
    inputs.reserve(g.inputs.size());
    for (std::int32_t k : g.inputs) inputs.push_back(made[static_cast<std::size_t>(k)]);
    Node n = blank(g.op, g.dtype, graph.device, g.shape, std::move(inputs));
    n.attrs = g.attrs;
    made[i] = finish(std::move(n));
  }
  std::vector<NodePtr> outputs;
  outputs.reserve(graph.outputs.size());
  for (std::int32_t o : graph.outputs) outputs.push_back(made[static_cast<std::size_t>(o)]);
  return outputs;
}

}  // namespace kiln::ir
