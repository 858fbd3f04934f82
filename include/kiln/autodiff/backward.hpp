#pragma once
// Reverse-mode differentiation over the lazy graph. The forward records itself: a node built
// (with grad mode on) from an input that requires grad requires grad too and keeps its inputs
// when it is realized (ir::finish, the evaluator). A backward walks the nodes that require grad
// from the roots in reverse topological order, applies each node's rule (vjp.hpp, or the
// composite's own rule where one is attached: ir::CustomGradient) to its summed gradient, and stops at the leaves the user marked (GradLeaf) and at the nodes asked for. The
// gradients it returns are lazy nodes: evaluated together, they are one graph, fused and compiled
// like a forward (a chain of pointwise rules becomes one kernel, reading the forward's realized
// values and recomputing its lazy ones). Without retain_graph, the walk then drops the inputs of
// the realized nodes it passed (freeing the saved values) and marks every node it passed, so a
// second backward through them is an AutogradError as in PyTorch.
#include <algorithm>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kiln/autodiff/grad_mode.hpp"
#include "kiln/autodiff/vjp.hpp"
#include "kiln/core/error.hpp"

namespace kiln::autodiff {

/// A node's description for errors: "mul float32[4, 3]".
inline std::string describe_node(const ir::Node& n) {
  return std::string(ir::op_name(n.op)) + " " + dtype_name(n.dtype) + n.shape.str();
}

/// What a backward walks from `n` to: a composite's own inputs where it has its own gradient
/// rule, else the node's inputs.
inline const std::vector<NodePtr>& gradient_inputs(const ir::Node& n) {
  return n.custom_gradient ? n.custom_gradient->inputs : n.inputs;
}

/// A node reached by a backward and its summed gradient (a lazy node).
struct Reached {
  NodePtr node, grad;
};

namespace backward_detail {

inline bool is_zero_constant(const NodePtr& n) {
  return n->op == Op::Constant && !n->realized() &&
         (is_floating(n->dtype) ? n->attrs.scalar == 0.0 : n->attrs.iscalar == 0);
}

/// a + b where both are concatenations along one axis and no position has a part that is not
/// zero in both (the gradients of disjoint slices of one value: q, k and v cut from one
/// product): the one concatenation of their nonzero parts, as PyTorch's backward of split
/// gives, instead of a sum of zero-padded pieces. Null where that does not hold.
inline NodePtr merge_disjoint_concats(const NodePtr& a, const NodePtr& b) {
  if (a->op != Op::Concat || b->op != Op::Concat || a->realized() || b->realized() ||
      a->attrs.ints.at(0) != b->attrs.ints.at(0) || a->shape != b->shape || a->dtype != b->dtype)
    return nullptr;
  const std::int64_t axis = a->attrs.ints[0];
  const auto ax = static_cast<std::size_t>(axis);
  struct Part {
    std::int64_t start, end;
    NodePtr node;
  };
  auto parts_of = [&](const NodePtr& c) {
    std::vector<Part> parts;
    std::int64_t at = 0;
    for (const NodePtr& x : c->inputs) {
      parts.push_back({at, at + x->shape[ax], x});
      at += x->shape[ax];
    }
    return parts;
  };
  const std::vector<Part> pa = parts_of(a), pb = parts_of(b);
  std::vector<std::int64_t> cuts;
  for (const auto* ps : {&pa, &pb})
    for (const Part& p : *ps) cuts.push_back(p.end);
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  // The part of `ps` covering [lo, hi) (each cut is a boundary of both, so one part covers it).
  auto covering = [](const std::vector<Part>& ps, std::int64_t lo) -> const Part& {
    for (const Part& p : ps)
      if (p.start <= lo && lo < p.end) return p;
    return ps.back();
  };
  std::vector<NodePtr> merged;
  std::int64_t lo = 0, zeros_from = -1;  // zeros_from: start of a run of zero pieces not yet emitted
  auto flush_zeros = [&](std::int64_t until) {
    if (zeros_from < 0) return;
    Shape sh = a->shape;
    sh[ax] = until - zeros_from;
    merged.push_back(ir::constant(0.0, a->dtype, sh, a->device));
    zeros_from = -1;
  };
  for (std::int64_t hi : cuts) {
    if (hi == lo) continue;
    const Part &x = covering(pa, lo), &y = covering(pb, lo);
    const bool x_zero = is_zero_constant(x.node), y_zero = is_zero_constant(y.node);
    if (!x_zero && !y_zero) return nullptr;
    if (x_zero && y_zero) {
      if (zeros_from < 0) zeros_from = lo;
    } else {
      flush_zeros(lo);
      const Part& p = x_zero ? y : x;
      merged.push_back(p.start == lo && p.end == hi ? p.node : ir::slice(p.node, axis, lo - p.start, hi - lo, 1));
    }
    lo = hi;
  }
  flush_zeros(lo);
  return ir::concat(merged, axis);
}

/// The sum of two gradients of one node.
inline NodePtr sum_gradients(const NodePtr& a, const NodePtr& b) {
  if (NodePtr merged = merge_disjoint_concats(a, b)) return merged;
  return ir::binary(Op::Add, a, b);
}

}  // namespace backward_detail

/// Gradients flowing back from `roots` (each seeded with the gradient of the same index in
/// `seeds`, of its shape and dtype) to the nodes in `wanted` and to every marked leaf reached,
/// in the walk's order (the same for the same graph, so the gradients' graph hashes alike run
/// to run). `what` names the call in errors. With `stop_at_wanted` the walk ends at the wanted
/// nodes as at marked leaves (a compiled function's backward: what lies before its inputs is
/// another graph's business).
inline std::vector<Reached> backward_pass(const std::vector<NodePtr>& roots, const std::vector<NodePtr>& seeds,
                                          const std::vector<NodePtr>& wanted, bool retain_graph, const char* what,
                                          bool stop_at_wanted = false) {
  GradModeScope no_grad(false);  // the gradient graph records nothing
  std::unordered_set<const ir::Node*> stop;
  for (const NodePtr& w : wanted) stop.insert(w.get());
  auto is_stop = [&](const ir::Node& n) { return n.grad_leaf != nullptr || stop.count(&n) != 0; };
  auto ends_walk = [&](const ir::Node& n) { return n.grad_leaf != nullptr || (stop_at_wanted && stop.count(&n) != 0); };
  // Reverse topological order: a node after every node that consumes it (iterative post-order).
  std::vector<NodePtr> order;
  std::unordered_set<const ir::Node*> seen;
  struct Frame {
    NodePtr node;
    std::size_t next;
  };
  for (const NodePtr& root : roots) {
    if (!root->requires_grad || !seen.insert(root.get()).second) continue;
    std::vector<Frame> stack{{root, 0}};
    while (!stack.empty()) {
      Frame& f = stack.back();
      const ir::Node& n = *f.node;
      if (n.graph_freed)
        throw AutogradError(std::string(what) + ": trying to backward through the graph a second time (" +
                            describe_node(n) + " was freed by an earlier backward); pass retain_graph = true to "
                            "the first backward to keep it");
      // Marked leaves end the walk; a wanted node that is not one passes its gradient on.
      const std::vector<NodePtr>& from = gradient_inputs(n);
      if (!ends_walk(n) && f.next < from.size()) {
        const NodePtr& child = from[f.next++];
        if (child->requires_grad && seen.insert(child.get()).second) stack.push_back({child, 0});
        continue;
      }
      order.push_back(f.node);
      stack.pop_back();
    }
  }
  std::unordered_map<const ir::Node*, NodePtr> grad;
  auto accumulate = [&](const NodePtr& node, const NodePtr& g) {
    NodePtr& slot = grad[node.get()];
    slot = slot ? backward_detail::sum_gradients(slot, g) : g;
  };
  for (std::size_t i = 0; i < roots.size(); ++i)
    if (roots[i]->requires_grad) accumulate(roots[i], seeds[i]);
  std::vector<Reached> out;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const NodePtr& n = *it;
    auto found = grad.find(n.get());
    if (found == grad.end()) continue;
    const NodePtr g = found->second;
    if (is_stop(*n)) out.push_back({n, g});
    if (ends_walk(*n)) continue;
    const std::vector<NodePtr>& from = gradient_inputs(*n);
    Grads in = n->custom_gradient ? n->custom_gradient->rule(n, g) : vjp(n, g);
    for (std::size_t k = 0; k < from.size() && k < in.size(); ++k)
      if (in[k] && from[k]->requires_grad) accumulate(from[k], in[k]);
  }
  if (!retain_graph) {
    for (const NodePtr& n : order) {
      if (n->grad_leaf) continue;
      n->graph_freed = true;
      // The saved values it held for its gradient are no longer needed: a composite's own
      // rule goes (with the nodes it captured), and a realized node's inputs.
      n->custom_gradient.reset();
      if (n->realized()) n->inputs.clear();
    }
  }
  return out;
}

}  // namespace kiln::autodiff
