#pragma once
// A captured graph: the part of the lazy DAG that one evaluation runs, flattened into a
// topologically ordered array that later stages (schedule, codegen, executors) read. Realized
// nodes become Input leaves whose data pointers are bound at run time, so one Graph (and every
// kernel made from it) serves any tensors of the same structure.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/linkage.hpp"
#include "kiln/ir/node.hpp"

namespace kiln::ir {

struct GraphNode {
  Op op;
  DType dtype;
  Shape shape;
  Attrs attrs;
  std::vector<std::int32_t> inputs;  ///< indices of earlier nodes
  std::int32_t leaf = -1;            ///< Input: index into Captured::leaves
  Strides strides;                   ///< Input: element strides of the bound buffer
};

struct Graph {
  Device device = Device::cpu();
  std::vector<GraphNode> nodes;         ///< topological order
  std::vector<std::int32_t> outputs;    ///< node index of each output
  std::vector<Strides> output_strides;  ///< layout each output is written in
  /// Leaves whose memory a run may overwrite once it has read them for the last time (sorted):
  /// values a backward reads that nothing holds after it, such as the logits a loss's gradient
  /// is computed from. The step planner writes a later value of the same size there.
  std::vector<std::int32_t> donated;
  /// Outputs written over a leaf's memory, {output, leaf} (a step plan's segment writing a
  /// donated leaf's last reader): every read of that leaf comes before the output is written,
  /// and the kernel writing it reads the leaf only at the element it writes. Scheduling refuses
  /// (Schedule::overwrite_refused) a graph where that cannot be arranged.
  std::vector<std::pair<std::int32_t, std::int32_t>> overwrites;
  std::uint64_t key = 0;  ///< structural hash of all of the above

  std::size_t num_leaves() const {
    std::size_t n = 0;
    for (auto& g : nodes) n += g.op == Op::Input;
    return n;
  }
  /// The Input nodes bound to leaf `leaf` (one in a captured graph; none if it is not read).
  std::vector<int> inputs_of(std::int32_t leaf) const {
    std::vector<int> found;
    for (std::size_t i = 0; i < nodes.size(); ++i)
      if (nodes[i].op == Op::Input && nodes[i].leaf == leaf) found.push_back(static_cast<int>(i));
    return found;
  }
  /// Computes `key` from the structure (called by capture; call again after editing).
  void rehash();
  /// Checks every primitive's invariants; throws kiln::Error describing the first violation.
  void verify() const;
  /// Text form, one node a line: "%3 = add(%1, %2) : float32[4, 4]".
  std::string str() const;
};

/// A graph plus the buffers its leaves are bound to and the nodes its outputs realize.
struct Captured {
  Graph graph;
  std::vector<NodePtr> leaves;  ///< realized nodes, in leaf order
  std::vector<NodePtr> roots;   ///< the nodes the outputs stand for
};

/// Whether two graphs are the same structure, node for node (equal keys first, then every
/// field a kernel depends on): what every plan and kernel cache confirms a key hit with.
KILN_ENTRY bool same_graph(const Graph& a, const Graph& b);

/// Flattens the lazy DAG under `roots` (stopping at realized nodes, which become leaves, and at
/// shape ops of realized nodes, which become leaves viewing the same storage: as_leaf_view),
/// merging structurally equal nodes (common-subexpression elimination through the hashes).
KILN_ENTRY Captured capture(const std::vector<NodePtr>& roots, Device device);

}  // namespace kiln::ir

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/ir/graph_impl.hpp"
#endif
