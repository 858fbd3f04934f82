#pragma once
// The definitions of the autograd front end (tensor/autograd.hpp). Header-only mode includes them from that
// header (KILN_ENTRY is `inline`); compiled mode compiles them once into kiln::kiln_compiled
// (src/kiln_compiled.cpp), so users' translation units parse the declarations only.
#include <algorithm>
#include <atomic>
#include <functional>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "kiln/autodiff/backward.hpp"
#include "kiln/tensor/autograd.hpp"

namespace kiln {
namespace detail {

KILN_ENTRY ir::NodePtr backward_seed(const Tensor& output, const Tensor& gradient, const std::string& what) {
  if (!gradient.defined()) {
    if (output.numel() != 1)
      throw AutogradError(what + ": grad can be implicitly created only for scalar outputs; " + output.describe() +
                          " has " + std::to_string(output.numel()) + " elements: pass a gradient of its shape");
    return ir::constant(1.0, output.dtype(), output.shape(), output.device());
  }
  if (gradient.shape() != output.shape())
    throw ShapeError(what + ": the gradient " + gradient.describe() + " does not match the output " +
                     output.describe() + " (the shapes must be equal)");
  check_same_device(output.device(), gradient.device(), what.c_str());
  return ir::cast(gradient.node(), output.dtype());
}

KILN_ENTRY std::unordered_map<const Storage*, std::uint64_t> saved_versions_under(const std::vector<ir::NodePtr>& roots) {
  std::unordered_map<const Storage*, std::uint64_t> out;
  std::unordered_set<const ir::Node*> seen;
  std::vector<const ir::Node*> stack;
  for (const ir::NodePtr& r : roots)
    if (r && seen.insert(r.get()).second) stack.push_back(r.get());
  while (!stack.empty()) {
    const ir::Node* n = stack.back();
    stack.pop_back();
    if (!n->requires_grad) continue;
    for (const auto& [storage, version] : n->saved_versions) out.emplace(storage, version);
    for (const ir::NodePtr& in : n->inputs)
      if (seen.insert(in.get()).second) stack.push_back(in.get());
  }
  return out;
}

KILN_ENTRY void check_saved_versions(const std::unordered_map<const Storage*, std::uint64_t>& saved,
                                     const std::vector<autodiff::Reached>& reached, const char* what) {
  if (saved.empty()) return;
  std::unordered_set<const ir::Node*> seen;
  std::vector<const ir::Node*> stack;
  for (const autodiff::Reached& r : reached)
    if (r.grad && seen.insert(r.grad.get()).second) stack.push_back(r.grad.get());
  while (!stack.empty()) {
    const ir::Node* n = stack.back();
    stack.pop_back();
    if (n->realized()) {
      auto it = saved.find(n->buffer->storage.get());
      if (it != saved.end() && it->second != n->buffer->storage->version)
        throw AutogradError(std::string(what) +
                            ": one of the variables needed for gradient computation has been modified by an "
                            "inplace operation: " + dtype_name(n->dtype) + n->shape.str() + " is at version " +
                            std::to_string(n->buffer->storage->version) + "; expected version " +
                            std::to_string(it->second) + " instead");
      continue;
    }
    for (const ir::NodePtr& in : n->inputs)
      if (seen.insert(in.get()).second) stack.push_back(in.get());
  }
}

KILN_ENTRY std::vector<ir::NodePtr> gradient_nodes(const std::vector<Tensor>& outputs,
                                                   const std::vector<Tensor>& inputs,
                                                   const std::vector<Tensor>& grad_outputs, bool retain_graph,
                                                   const std::string& what) {
  if (outputs.empty()) throw AutogradError(what + ": no outputs to differentiate");
  if (!grad_outputs.empty() && grad_outputs.size() != outputs.size())
    throw AutogradError(what + ": " + std::to_string(grad_outputs.size()) + " grad_outputs for " +
                        std::to_string(outputs.size()) + " outputs");
  std::vector<ir::NodePtr> roots, seeds, wanted;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& o = outputs[i];
    if (!o.requires_grad())
      throw AutogradError(what + ": output " + std::to_string(i) + " " + o.describe() +
                          " does not require grad (nothing it was computed from requires grad, or it was "
                          "computed under NoGradGuard)");
    seeds.push_back(backward_seed(o, grad_outputs.empty() ? Tensor() : grad_outputs[i], what));
    roots.push_back(o.node());
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].requires_grad())
      throw AutogradError(what + ": input " + std::to_string(i) + " " + inputs[i].describe() +
                          " does not require grad");
    wanted.push_back(inputs[i].node());
  }
  const auto saved = saved_versions_under(roots);
  std::vector<autodiff::Reached> reached = autodiff::backward_pass(roots, seeds, wanted, retain_graph, what.c_str());
  check_saved_versions(saved, reached, what.c_str());
  std::vector<ir::NodePtr> out(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i)
    for (const autodiff::Reached& r : reached)
      if (r.node == wanted[i]) out[i] = r.grad;
  return out;
}

KILN_ENTRY bool home_holds(const ir::BufferView& home, const ir::Node& n) {
  const auto end = static_cast<std::size_t>(home.offset + n.numel()) * itemsize(n.dtype);
  return home.storage && home.storage->device == n.device && home.strides.size() == n.shape.size() &&
         home.offset >= 0 && end <= home.storage->bytes;
}

KILN_ENTRY void evaluate_in_groups(const std::vector<ir::NodePtr>& values, const std::vector<ir::NodePtr>& destinations,
                                   const std::vector<int>& groups, const std::function<void(int)>& done) {
  std::vector<int> order(groups);
  std::sort(order.begin(), order.end());
  order.erase(std::unique(order.begin(), order.end()), order.end());
  if (!order.empty() && order.front() == -1) std::rotate(order.begin(), order.begin() + 1, order.end());
  auto rank_of = [&](int g) { return std::find(order.begin(), order.end(), g) - order.begin(); };
  // The lazy nodes `roots` are computed from (realized nodes are where a graph starts).
  auto lazy_closure = [](const std::vector<ir::NodePtr>& roots) {
    std::unordered_map<const ir::Node*, ir::NodePtr> seen;
    std::vector<ir::NodePtr> stack;
    for (const ir::NodePtr& r : roots)
      if (!r->realized() && seen.emplace(r.get(), r).second) stack.push_back(r);
    while (!stack.empty()) {
      ir::NodePtr n = std::move(stack.back());
      stack.pop_back();
      for (const ir::NodePtr& in : n->inputs)
        if (!in->realized() && seen.emplace(in.get(), in).second) stack.push_back(in);
    }
    return seen;
  };
  for (std::size_t k = 0; k < order.size(); ++k) {
    std::vector<ir::NodePtr> vals, dsts, later;
    for (std::size_t i = 0; i < values.size(); ++i) {
      const auto at = rank_of(groups[i]);
      if (at == static_cast<std::ptrdiff_t>(k)) {
        vals.push_back(values[i]);
        dsts.push_back(destinations[i]);
      } else if (at > static_cast<std::ptrdiff_t>(k)) {
        later.push_back(values[i]);
      }
    }
    // The cut: nodes this graph computes that a later graph reads directly (a later value, or
    // an input of a node only later graphs compute) are realized now, into new memory, so no
    // later graph computes them again. Views and casts are cheaper recomputed than stored (an
    // expand would store its broadcast): the cut goes below them, to what they read, and
    // nowhere when that is realized already; so are nodes without inputs (constants).
    const auto mine = lazy_closure(vals), rest = lazy_closure(later);
    std::vector<ir::NodePtr> cut;
    std::unordered_set<const ir::Node*> in_cut;
    auto take = [&](ir::NodePtr n) {
      while (n->inputs.size() == 1 && (ir::op_kind(n->op) == ir::OpKind::IndexMap || n->op == ir::Op::Cast)) {
        if (n->inputs[0]->realized()) return;
        n = n->inputs[0];
      }
      if (!n->inputs.empty() && mine.count(n.get()) && in_cut.insert(n.get()).second) cut.push_back(n);
    };
    for (const ir::NodePtr& v : later) take(v);
    for (const auto& [node, ptr] : rest)
      if (!mine.count(node))
        for (const ir::NodePtr& in : ptr->inputs) take(in);
    std::vector<ir::NodePtr> cut_memory;
    for (const ir::NodePtr& n : cut) {
      StoragePtr st = allocate_value(*n, "backward");
      cut_memory.push_back(
          ir::input(ir::BufferView{st, 0, contiguous_strides(n->shape)}, n->shape, n->dtype, n->device));
      vals.push_back(n);
      dsts.push_back(cut_memory.back());
    }
    evaluate_into_many(vals, dsts);
    for (std::size_t c = 0; c < cut.size(); ++c) {  // as the evaluator leaves the nodes it realizes
      ir::Node& n = *cut[c];
      n.buffer = cut_memory[c]->buffer;
      if (!n.requires_grad || n.grad_leaf || n.graph_freed) n.inputs.clear();
    }
    done(order[k]);
  }
}

KILN_ENTRY void evaluate_together(const std::vector<ir::NodePtr>& nodes) {
  if (deferring_eval()) return;
  std::vector<ir::NodePtr> lazy;
  for (const ir::NodePtr& n : nodes)
    if (n && !n->realized()) lazy.push_back(n);
  if (!lazy.empty()) evaluate(lazy);
}

}  // namespace detail
}  // namespace kiln

namespace kiln {

KILN_ENTRY Tensor& Tensor::requires_grad_(bool requires_grad) {
  checked();
  ir::Node& n = *node_;
  if (requires_grad && !is_floating(n.dtype))
    throw DTypeError(std::string("requires_grad_: only tensors of floating point dtype can require gradients, not ") +
                     describe());
  if (n.requires_grad && !n.grad_leaf) {
    if (!requires_grad)
      throw AutogradError("requires_grad_(false): " + describe() +
                          " is computed from tensors that require grad; only leaves can stop requiring it (use "
                          "detach())");
    return *this;  // already recorded
  }
  if (requires_grad && !n.grad_leaf) n.grad_leaf = std::make_shared<ir::GradLeaf>();
  n.requires_grad = requires_grad;
  return *this;
}

KILN_ENTRY Tensor Tensor::grad() const {
  if (!node_ || !node_->grad_leaf || !node_->grad_leaf->grad) return Tensor();
  return Tensor(node_->grad_leaf->grad);
}

KILN_ENTRY Tensor& Tensor::zero_grad_() {
  if (!node_ || !node_->grad_leaf || !node_->grad_leaf->grad) return *this;
  ir::NodePtr& g = node_->grad_leaf->grad;
  if (g->realized() && !detail::deferring_eval()) {
    NoGradGuard off;
    Tensor(g).assign(0);
  } else {
    g = ir::constant(0.0, g->dtype, g->shape, g->device);
  }
  return *this;
}

KILN_ENTRY std::uint64_t Tensor::register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook) {
  checked();
  if (!node_->grad_leaf || !node_->requires_grad)
    throw AutogradError("register_post_accumulate_grad_hook: " + describe() +
                        " is not a leaf that requires grad (call requires_grad_() on a leaf)");
  static std::atomic<std::uint64_t> next_id{1};
  const std::uint64_t id = next_id.fetch_add(1, std::memory_order_relaxed);
  node_->grad_leaf->post_accumulate_hooks.emplace_back(
      id, [hook = std::move(hook)](const ir::NodePtr& leaf) { hook(Tensor(leaf)); });
  return id;
}

KILN_ENTRY void Tensor::remove_post_accumulate_grad_hook(std::uint64_t id) {
  if (!node_ || !node_->grad_leaf) return;
  auto& hooks = node_->grad_leaf->post_accumulate_hooks;
  std::erase_if(hooks, [id](const auto& h) { return h.first == id; });
}

KILN_ENTRY Tensor Tensor::detach() const {
  const ir::Node& n = checked();
  if (n.realized()) return Tensor(ir::input(*n.buffer, n.shape, n.dtype, n.device));
  auto copy = std::make_shared<ir::Node>(n);  // the same lazy value, outside the tape
  copy->requires_grad = false;
  copy->graph_freed = false;
  copy->grad_leaf.reset();
  ir::register_lazy_reader(copy);
  return Tensor(std::move(copy));
}

namespace detail {

// The storages of realized values that the graph under `roots` reads and nothing can read
// after it: a backward's donations (ir::Graph::donated), so that its plan may write a later
// value over them (the loss's gradient over the logits). Counted by references, so any holder
// it cannot account for keeps a value: `held_here[n]` references the caller holds itself
// (these count as the caller's, dropped after the evaluation), and `cleared_root`, if any, is a
// root realized by the evaluation whose inputs it then drops (the backward's own output).
// A storage is donated when its only holder is one realized node, that node is held only by
// nodes of the graph, and no node of the graph that outlives the evaluation (held from outside,
// hence evaluated later perhaps) reaches it.
inline std::vector<const Storage*> storages_read_last(const std::vector<ir::NodePtr>& roots,
                                                      const std::unordered_map<const ir::Node*, long>& held_here,
                                                      const ir::Node* cleared_root) {
  // The lazy nodes under the roots (raw pointers only: a copy of a NodePtr is a reference), and
  // how many of their input edges reach each node.
  std::unordered_map<const ir::Node*, long> edges;
  std::unordered_map<const ir::Node*, const ir::NodePtr*> ref;  // a reference to read use_count from
  std::vector<const ir::Node*> lazy, stack;
  for (const ir::NodePtr& r : roots)
    if (r && ref.emplace(r.get(), &r).second) stack.push_back(r.get());
  while (!stack.empty()) {
    const ir::Node* n = stack.back();
    stack.pop_back();
    if (n->realized()) continue;
    lazy.push_back(n);
    for (const ir::NodePtr& in : n->inputs) {
      ++edges[in.get()];
      if (ref.emplace(in.get(), &in).second) stack.push_back(in.get());
    }
  }
  auto uses = [&](const ir::Node* n) { return static_cast<long>(ref.at(n)->use_count()); };
  auto outside = [&](const ir::Node* n, long use_count) {
    auto e = edges.find(n);
    auto h = held_here.find(n);
    return use_count - (e == edges.end() ? 0 : e->second) - (h == held_here.end() ? 0 : h->second);
  };
  // Lazy nodes someone else holds may be evaluated later: what they reach is kept.
  std::unordered_set<const ir::Node*> kept;
  std::vector<const ir::Node*> todo;
  for (const ir::Node* n : lazy)
    if (n != cleared_root && outside(n, uses(n)) > 0 && kept.insert(n).second) todo.push_back(n);
  while (!todo.empty()) {
    const ir::Node* n = todo.back();
    todo.pop_back();
    if (n->realized()) continue;
    for (const ir::NodePtr& in : n->inputs)
      if (kept.insert(in.get()).second) todo.push_back(in.get());
  }
  std::vector<const Storage*> out;
  for (const auto& [n, r] : ref) {
    if (!n->realized() || kept.count(n) || !n->buffer->storage) continue;
    if (n->buffer->storage.use_count() != 1) continue;  // a view elsewhere shares the memory
    if (outside(n, uses(n)) != 0) continue;
    out.push_back(n->buffer->storage.get());
  }
  return out;
}

}  // namespace detail

KILN_ENTRY void Tensor::backward(const Tensor& gradient, bool retain_graph, std::source_location where) const {
  if (!requires_grad())
    throw AutogradError("backward: " + describe() +
                        " does not require grad (nothing it was computed from requires grad, or it was computed under "
                        "NoGradGuard)");
  ir::NodePtr seed = detail::backward_seed(*this, gradient, "backward");
  // Inside a trace: a graph break, and the backward runs for real (as torch.compile's Dynamo
  // breaks at backward()); a compiled forward called before backward() is what is compiled
  // with its backward.
  detail::before_data_read("backward()", where);
  detail::SuspendTrace eager;
  const auto saved = detail::saved_versions_under({node_});
  std::vector<autodiff::Reached> reached = autodiff::backward_pass({node_}, {seed}, {}, retain_graph, "backward");
  detail::check_saved_versions(saved, reached, "backward");
  NoGradGuard off;
  // The post-accumulate hooks run once every gradient is in place (the gradients are evaluated
  // together, as one graph), leaf by leaf in the order the walk reached them.
  // With evaluation groups (ir::GradLeaf::evaluation_group), the leaves of the groups `wanted`
  // accepts.
  auto run_hooks = [&reached](const auto& wanted) {
    for (const autodiff::Reached& r : reached)
      if (r.node->grad_leaf && wanted(r.node->grad_leaf->evaluation_group))
        for (auto hooks = r.node->grad_leaf->post_accumulate_hooks; auto& [id, hook] : hooks)  // a copy: a
          hook(r.node);                                                                         // hook may go
  };
  const auto every_group = [](int) { return true; };
  std::vector<ir::NodePtr> fresh;
  std::vector<std::shared_ptr<ir::GradLeaf>> fresh_leaves;
  // Gradients written into existing memory: a leaf's gradient home, or its grad() accumulated in
  // place. They and the fresh gradients are evaluated together (one graph).
  std::vector<ir::NodePtr> values, destinations;
  std::vector<int> groups, fresh_groups;  // each value's evaluation group
  const bool in_place_ok = !detail::deferring_eval();
  bool grouped = false;
  for (const autodiff::Reached& r : reached) {
    std::shared_ptr<ir::GradLeaf>& leaf = r.node->grad_leaf;
    if (!leaf) continue;
    grouped = grouped || leaf->evaluation_group >= 0;
    if (!leaf->grad && leaf->home && in_place_ok && detail::home_holds(*leaf->home, *r.node)) {
      ir::NodePtr home = ir::input(*leaf->home, r.node->shape, r.node->dtype, r.node->device);
      values.push_back(ir::cast(r.grad, r.node->dtype));
      destinations.push_back(home);
      groups.push_back(leaf->evaluation_group);
      leaf->grad = home;
      continue;
    }
    if (leaf->grad && leaf->grad->realized() && in_place_ok) {
      values.push_back(ir::binary(ir::Op::Add, leaf->grad, ir::cast(r.grad, leaf->grad->dtype)));  // in place
      destinations.push_back(leaf->grad);
      groups.push_back(leaf->evaluation_group);
      continue;
    }
    // A realized gradient may be another tensor's storage (the seed itself): copy it, since
    // later backward passes add into grad() in place.
    ir::NodePtr g = r.grad->realized() && in_place_ok ? detail::contiguous_copy(r.grad) : r.grad;
    leaf->grad = leaf->grad ? ir::binary(ir::Op::Add, leaf->grad, g) : g;
    fresh.push_back(leaf->grad);
    fresh_leaves.push_back(leaf);
    fresh_groups.push_back(leaf->evaluation_group);
  }
  grouped = grouped && in_place_ok;
  // The output itself is evaluated with its gradients (one graph, no second pass over the
  // forward): its value is the one the gradients are of, even when it is read after an optimizer
  // has updated the leaves in place (PyTorch's `loss.backward(); opt.step(); loss.item()`).
  const bool output_lazy = in_place_ok && !node_->realized();
  // The values this backward reads for the last time (the tape is spent: nothing else holds
  // them), which its plan may overwrite: the logits under a loss hold their own gradient.
  // Everything this function holds is counted as its own; one graph on one device only.
  auto read_last = [&](const std::vector<ir::NodePtr>& roots) -> std::vector<const Storage*> {
    if (retain_graph || !in_place_ok || roots.empty()) return {};
    for (const ir::NodePtr& r : roots)
      if (!(r->device == roots.front()->device)) return {};
    std::unordered_map<const ir::Node*, long> held;
    auto hold = [&held](const ir::NodePtr& p) {
      if (p) ++held[p.get()];
    };
    for (const autodiff::Reached& r : reached) {
      hold(r.node);
      hold(r.grad);
    }
    for (const std::shared_ptr<ir::GradLeaf>& leaf : fresh_leaves) hold(leaf->grad);
    hold(seed);
    for (const std::vector<ir::NodePtr>* v : {&values, &destinations, &fresh})
      for (const ir::NodePtr& p : *v) hold(p);
    return detail::storages_read_last(roots, held, node_.get());
  };
  if (values.empty() && !grouped) {
    if (output_lazy) fresh.push_back(node_);
    {
      detail::DonationScope donate(read_last(fresh));
      detail::evaluate_together(fresh);
    }
    run_hooks(every_group);
    return;
  }
  // The fresh gradients (and the output) join the graph of the in-place ones, each into new memory.
  auto into_new_memory = [&](const ir::NodePtr& g, int group) {
    StoragePtr st = detail::allocate_value(*g, "backward");
    ir::NodePtr dest = ir::input(ir::BufferView{st, 0, contiguous_strides(g->shape)}, g->shape, g->dtype, g->device);
    values.push_back(g);
    destinations.push_back(dest);
    groups.push_back(group);
    return dest;
  };
  for (std::size_t i = 0; i < fresh.size(); ++i)
    if (!fresh[i]->realized()) fresh_leaves[i]->grad = into_new_memory(fresh[i], fresh_groups[i]);
  ir::NodePtr output = output_lazy ? into_new_memory(node_, -1) : nullptr;
  auto finish_output = [&] {
    if (!output) return;
    node_->buffer = output->buffer;
    if (node_->graph_freed) node_->inputs.clear();  // as the evaluator does: the tape is spent
  };
  if (grouped) {
    // A graph per group, its leaves' hooks after it; the rest (and the output) last. Hooks of
    // leaves whose gradient was realized already (no value to evaluate) run with the rest.
    std::set<int> evaluated(groups.begin(), groups.end());
    detail::evaluate_in_groups(values, destinations, groups, [&](int group) {
      if (group == -1) finish_output();
      run_hooks([group](int g) { return g == group; });
    });
    run_hooks([&evaluated](int g) { return evaluated.count(g) == 0; });
    return;
  }
  {
    detail::DonationScope donate(read_last(values));
    detail::evaluate_into_many(values, destinations);
  }
  finish_output();
  run_hooks(every_group);
}

}  // namespace kiln

namespace kiln {
namespace autograd {

KILN_ENTRY std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                                    const std::vector<Tensor>& grad_outputs, bool retain_graph, bool allow_unused) {
  std::vector<ir::NodePtr> nodes =
      detail::gradient_nodes(outputs, inputs, grad_outputs, retain_graph, "autograd::grad");
  for (std::size_t i = 0; i < nodes.size(); ++i)
    if (!nodes[i] && !allow_unused)
      throw AutogradError("autograd::grad: input " + std::to_string(i) + " " + inputs[i].describe() +
                          " was not used to compute the outputs (pass allow_unused = true to get an undefined "
                          "gradient for it)");
  detail::evaluate_together(nodes);
  std::vector<Tensor> out;
  for (const ir::NodePtr& n : nodes) out.push_back(n ? Tensor(n) : Tensor());
  return out;
}

}  // namespace autograd
}  // namespace kiln
