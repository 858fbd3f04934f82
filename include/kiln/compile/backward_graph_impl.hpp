#pragma once
// The definitions of the backward graph builder (compile/backward_graph.hpp). Header-only mode includes them from that
// header (KILN_ENTRY is `inline`); compiled mode compiles them once into kiln::kiln_compiled
// (src/kiln_compiled.cpp), so users' translation units parse the declarations only.
#include <unordered_map>

#include "kiln/autodiff/backward.hpp"
#include "kiln/compile/backward_graph.hpp"
#include "kiln/sched/steps.hpp"

namespace kiln::detail {

KILN_ENTRY int argument_of_storage(const StoragePtr& st, const std::vector<const Tensor*>& args) {
  for (std::size_t i = 0; i < args.size(); ++i) {
    const Tensor& t = *args[i];
    if (t.defined() && t.is_evaluated() && t.node()->buffer->storage == st) return static_cast<int>(i);
  }
  return -1;
}

KILN_ENTRY bool save_for_backward(ir::Op op) {
  switch (ir::op_kind(op)) {
    case ir::OpKind::Reduce:
    case ir::OpKind::Contract:
    case ir::OpKind::Gather:
    case ir::OpKind::Scatter:
    case ir::OpKind::Scan:
    case ir::OpKind::Sort:
    case ir::OpKind::Attention:
      return true;
    default:
      return false;
  }
}

// A product plus a bias broadcast over its rows (a linear's output, the product reshaped or
// not): the backward reads it as it is (attention's q, k and v sliced from it in place, the
// gelu's input), so it is kept rather than the product under it, which the backward would
// add the bias to again. The same bytes either way.
inline bool is_linear_output(const ir::Node& n) {
  if (n.op != ir::Op::Add || n.inputs.size() != 2) return false;
  for (std::size_t k = 0; k < 2; ++k) {
    const ir::Node* x = n.inputs[k].get();
    while (x->op == ir::Op::Reshape && !x->realized() && !x->inputs.empty()) x = x->inputs[0].get();
    const ir::Node& other = *n.inputs[1 - k];
    if (x->op == ir::Op::MatMul && !x->realized() && other.op == ir::Op::Broadcast && !other.inputs.empty() &&
        other.inputs[0]->shape.numel() * 16 <= n.shape.numel())
      return true;
  }
  return false;
}

KILN_ENTRY PendingBackward trace_backward(const std::vector<Tensor>& outs, const std::vector<const Tensor*>& args) {
  PendingBackward p;
  // The forward's lazy nodes, and the inputs that require grad: realized ones, and leaves
  // marked while still lazy (randn(...).requires_grad_()), which are evaluated now: the graph
  // must read the parameter's storage, which an optimizer then updates in place, rather than
  // recompute its initial value on every call.
  std::unordered_set<const ir::Node*> forward, seen_input;
  std::vector<ir::NodePtr> lazy_leaves;
  {
    std::vector<ir::NodePtr> stack;
    for (const Tensor& t : outs)
      if (t.defined() && !t.is_evaluated()) stack.push_back(t.node());
    while (!stack.empty()) {
      ir::NodePtr n = std::move(stack.back());
      stack.pop_back();
      if (n->realized() || n->grad_leaf) {
        if (n->requires_grad && seen_input.insert(n.get()).second) {
          if (!n->realized()) lazy_leaves.push_back(n);
          p.grad_inputs.push_back(n);
        }
        continue;
      }
      if (!forward.insert(n.get()).second) continue;
      for (const ir::NodePtr& in : n->inputs) stack.push_back(in);
      if (n->custom_gradient)
        for (const ir::NodePtr& c : n->custom_gradient->companions) stack.push_back(c);
    }
  }
  if (!lazy_leaves.empty()) evaluate(lazy_leaves);
  for (const ir::NodePtr& n : p.grad_inputs) {
    GradInput g;
    for (std::size_t k = 0; k < args.size(); ++k)
      if (args[k]->defined() && args[k]->node() == n) g.arg = static_cast<int>(k);
    if (g.arg < 0) g.constant = n;
    p.inputs.push_back(std::move(g));
  }
  // Whether the recorded graph behind `root` was freed by a backward that did not retain it.
  auto freed_behind = [](const ir::NodePtr& root) {
    std::unordered_set<const ir::Node*> seen;
    std::vector<const ir::Node*> stack{root.get()};
    while (!stack.empty()) {
      const ir::Node* n = stack.back();
      stack.pop_back();
      if (!seen.insert(n).second) continue;
      if (n->graph_freed) return true;
      if (n->grad_leaf) continue;
      for (const ir::NodePtr& in : autodiff::gradient_inputs(*n))
        if (in->requires_grad) stack.push_back(in.get());
    }
    return false;
  };
  // One backward per result that requires grad, seeded by a placeholder leaf (never read: the
  // graph is only captured, and its rebuild binds the real gradient there).
  for (std::size_t i = 0; i < outs.size(); ++i) {
    const Tensor& t = outs[i];
    if (!t.defined() || !t.requires_grad()) continue;
    if (freed_behind(t.node())) {
      p.freed.push_back(i);
      continue;
    }
    PendingBackward::PerResult r;
    r.result = i;
    r.seed = std::make_shared<Storage>();
    r.seed->device = t.device();
    ir::NodePtr seed =
        ir::input(ir::BufferView{r.seed, 0, contiguous_strides(t.shape())}, t.shape(), t.dtype(), t.device());
    seed->placeholder = true;
    std::vector<autodiff::Reached> reached =
        autodiff::backward_pass({t.node()}, {seed}, p.grad_inputs, true, "kiln::compile (backward)", true);
    for (std::size_t k = 0; k < p.grad_inputs.size(); ++k)
      for (const autodiff::Reached& hit : reached)
        if (hit.node == p.grad_inputs[k]) {
          r.grads.push_back(hit.grad);
          r.input_of.push_back(k);
        }
    p.results.push_back(std::move(r));
  }
  // The forward values the gradients read and that are costly to recompute: products,
  // reductions and the like by their kind, then the branch points that recomputing would make
  // read too much (saved_branch_points).
  auto kept = [&](const ir::Node& n) { return save_for_backward(n.op) || is_linear_output(n); };
  std::unordered_set<const ir::Node*> chosen;
  auto walk = [&](std::vector<ir::NodePtr>* needed_pointwise) {
    p.saved.clear();
    std::unordered_set<const ir::Node*> seen;
    std::vector<ir::NodePtr> stack;
    for (auto& r : p.results)
      for (auto& g : r.grads) stack.push_back(g);
    while (!stack.empty()) {
      ir::NodePtr n = std::move(stack.back());
      stack.pop_back();
      if (n->realized() || !seen.insert(n.get()).second) continue;
      const bool in_forward = forward.count(n.get()) != 0;
      if (in_forward && (kept(*n) || chosen.count(n.get()))) {
        p.saved.push_back(n);
        continue;
      }
      if (in_forward && needed_pointwise && ir::is_pointwise(n->op)) needed_pointwise->push_back(n);
      for (const ir::NodePtr& in : n->inputs) stack.push_back(in);
    }
  };
  std::vector<ir::NodePtr> needed;
  walk(&needed);
  for (const ir::NodePtr& n : saved_branch_points(needed, forward, kept)) chosen.insert(n.get());
  if (!chosen.empty()) walk(nullptr);  // what the chosen values make unnecessary is not kept
  return p;
}

KILN_ENTRY std::vector<ir::NodePtr> saved_branch_points(std::vector<ir::NodePtr> needed,
                                                        const std::unordered_set<const ir::Node*>& forward,
                                                        const std::function<bool(const ir::Node&)>& kept) {
  // How many forward values read each forward node.
  std::unordered_map<const ir::Node*, int> forward_users;
  for (const ir::Node* n : forward)
    for (const ir::NodePtr& in : n->inputs) ++forward_users[in.get()];
  // Inputs before their users, so that a value decided on counts as memory for those above it.
  std::sort(needed.begin(), needed.end(), [](const ir::NodePtr& a, const ir::NodePtr& b) { return a->depth < b->depth; });
  std::unordered_set<const ir::Node*> chosen;
  std::vector<ir::NodePtr> out;
  for (const ir::NodePtr& n : needed) {
    if (chosen.count(n.get())) continue;
    auto users = forward_users.find(n.get());
    if (users == forward_users.end() || users->second < 2) continue;
    const std::int64_t large = std::max<std::int64_t>(1, n->shape.numel() / 16);
    std::unordered_set<const ir::Node*> seen{n.get()}, reads;
    std::vector<const ir::Node*> stack;
    for (const ir::NodePtr& in : n->inputs) stack.push_back(in.get());
    while (!stack.empty() && reads.size() < sched::detail::kRecomputeReadLimit) {
      const ir::Node* x = stack.back();
      stack.pop_back();
      if (!seen.insert(x).second) continue;
      const bool memory = x->realized() || !forward.count(x) || kept(*x) || chosen.count(x);
      if (memory) {
        if (x->shape.numel() >= large) reads.insert(x);
        continue;
      }
      for (const ir::NodePtr& in : x->inputs) stack.push_back(in.get());  // constants and iotas: free
    }
    if (reads.size() >= sched::detail::kRecomputeReadLimit) {
      chosen.insert(n.get());
      out.push_back(n);
    }
  }
  return out;
}

KILN_ENTRY std::shared_ptr<const CompiledBackward> capture_backward(PendingBackward& pending,
                                                                    const std::vector<Tensor>& saved,
                                                                    std::size_t saved_first,
                                                                    const std::vector<const Tensor*>& args) {
  auto cb = std::make_shared<CompiledBackward>();
  cb->inputs = pending.inputs;
  cb->saved_first = saved_first;
  // The traced nodes take the forward's buffers, so that capture stops at them.
  for (std::size_t j = 0; j < pending.saved.size(); ++j) pending.saved[j]->buffer = *saved[j].node()->buffer;
  for (auto& r : pending.results) {
    if (r.grads.empty()) continue;
    ResultBackward rb;
    rb.result = r.result;
    rb.input_of_output = r.input_of;
    ir::Captured c = ir::capture(r.grads, r.grads.front()->device);
    rb.graph = std::move(c.graph);
    for (std::size_t l = 0; l < c.leaves.size(); ++l) {
      const ir::Node& leaf = *c.leaves[l];
      const StoragePtr& st = leaf.buffer->storage;
      BackwardLeaf bl;
      bl.shape = leaf.shape;
      bl.strides = leaf.buffer->strides;
      bl.dtype = leaf.dtype;
      bl.offset = leaf.buffer->offset;
      if (st == r.seed) {
        bl.kind = BackwardLeaf::Kind::Seed;
        rb.seed_leaf = static_cast<std::int32_t>(l);
      } else if (auto s = std::find_if(saved.begin(), saved.end(),
                                       [&](const Tensor& v) { return v.node()->buffer->storage == st; });
                 s != saved.end()) {
        bl.kind = BackwardLeaf::Kind::Saved;
        bl.index = static_cast<int>(s - saved.begin());
      } else if ((bl.index = argument_of_storage(st, args)) >= 0) {
        bl.kind = BackwardLeaf::Kind::Arg;
        bl.offset -= args[static_cast<std::size_t>(bl.index)]->node()->buffer->offset;
      } else {
        bl.constant = c.leaves[l];
      }
      rb.leaves.push_back(std::move(bl));
    }
    cb->results.push_back(std::move(rb));
  }
  // The traced nodes are lazy again: the first call's saved values are that call's, not the
  // entry's (the traced result still holds these nodes).
  for (const ir::NodePtr& n : pending.saved) n->buffer.reset();
  return cb;
}

KILN_ENTRY void mark_graph_freed(Tensor& result) {
  if (!result.defined()) return;
  result.node()->requires_grad = true;
  result.node()->graph_freed = true;
}

KILN_ENTRY void attach_backward(const std::shared_ptr<const CompiledBackward>& cb, std::vector<Tensor>& results,
                                const std::vector<const Tensor*>& args) {
  std::vector<ir::NodePtr> inputs;
  for (const GradInput& g : cb->inputs)
    inputs.push_back(g.arg >= 0 ? args[static_cast<std::size_t>(g.arg)]->node() : g.constant);
  for (const ResultBackward& rb : cb->results) {
    std::vector<ir::NodePtr> leaves(rb.leaves.size());
    for (std::size_t l = 0; l < rb.leaves.size(); ++l) {
      const BackwardLeaf& bl = rb.leaves[l];
      // A saved value or an argument, or a view of it (a transpose): this call's buffer.
      auto view_of = [&](const ir::Node& v) {
        return ir::input(ir::BufferView{v.buffer->storage, v.buffer->offset + bl.offset, bl.strides}, bl.shape,
                         bl.dtype, v.device);
      };
      if (bl.kind == BackwardLeaf::Kind::Saved)
        leaves[l] = view_of(*results[cb->saved_first + static_cast<std::size_t>(bl.index)].node());
      else if (bl.kind == BackwardLeaf::Kind::Arg)
        leaves[l] = view_of(*args[static_cast<std::size_t>(bl.index)]->node());
      else if (bl.kind == BackwardLeaf::Kind::Constant)
        leaves[l] = bl.constant;  // the seed's is bound by the rule
    }
    // The rule holds the graph (shared by every call of the entry) and this call's leaves; the
    // backward frees both (with the saved values) when it has run through the result.
    auto shared = std::shared_ptr<const ResultBackward>(cb, &rb);
    std::vector<ir::NodePtr> rule_inputs = inputs;
    auto rule = [shared, leaves = std::move(leaves), n_inputs = inputs.size()](const ir::NodePtr& result,
                                                                               const ir::NodePtr& grad) {
      std::vector<ir::NodePtr> bound = leaves;
      if (shared->seed_leaf >= 0)
        bound[static_cast<std::size_t>(shared->seed_leaf)] =
            grad->dtype == result->dtype ? grad : ir::cast(grad, result->dtype);
      std::vector<ir::NodePtr> outs = ir::rebuild(shared->graph, bound);
      std::vector<ir::NodePtr> grads(n_inputs);
      for (std::size_t o = 0; o < outs.size(); ++o) {
        ir::NodePtr& slot = grads[shared->input_of_output[o]];
        slot = slot ? ir::binary(ir::Op::Add, slot, outs[o]) : outs[o];
      }
      return grads;
    };
    ir::Node& out = *results[rb.result].node();
    out.requires_grad = true;
    out.custom_gradient =
        std::make_shared<ir::CustomGradient>(ir::CustomGradient{std::move(rule_inputs), std::move(rule), {}});
  }
}

}  // namespace kiln::detail
