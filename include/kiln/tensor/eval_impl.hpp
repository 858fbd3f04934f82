#pragma once
// The definitions of evaluation and reading (tensor/eval.hpp). Header-only mode includes them from that
// header (KILN_ENTRY is `inline`); compiled mode compiles them once into kiln::kiln_compiled
// (src/kiln_compiled.cpp), so users' translation units parse the declarations only.
#include "kiln/tensor/eval.hpp"

namespace kiln {
namespace detail {

KILN_ENTRY Backend backend_from_env() {
  std::string v = env::get("KILN_BACKEND", "auto");
  if (v == "eager" || v == "reference") return Backend::Eager;
  if (v == "jit") return Backend::Jit;
  return Backend::Auto;
}

KILN_ENTRY Backend& backend_mode() {
  static Backend mode = backend_from_env();
  return mode;
}

KILN_ENTRY StoragePtr allocate_value(const ir::Node& n, const char* op) {
  const std::int64_t bytes =
      checked_numel(n.shape, op, itemsize(n.dtype)) * static_cast<std::int64_t>(itemsize(n.dtype));
  try {
    return allocate(static_cast<std::size_t>(bytes), n.device);
  } catch (const OutOfMemoryError& e) {
    throw OutOfMemoryError(std::string(op) + ": cannot allocate " + dtype_name(n.dtype) + n.shape.str() + " (" +
                           std::to_string(bytes) + " bytes) on " + n.device.str() + ": " + e.what());
  } catch (const std::bad_alloc&) {
    throw OutOfMemoryError(std::string(op) + ": cannot allocate " + dtype_name(n.dtype) + n.shape.str() + " (" +
                           std::to_string(bytes) + " bytes) on " + n.device.str());
  }
}

KILN_ENTRY void run_graph_with(const ir::Graph& g, const backend::RunArgs& args, Backend mode) {
  if (log_enabled(LogChannel::graph)) log(LogChannel::graph, "evaluating graph\n" + g.str());
  backend::entry::run(g, args, mode);
}

KILN_ENTRY const void* leaf_pointer(const ir::Node& n) {
  return static_cast<const char*>(n.buffer->storage->data) +
         n.buffer->offset * static_cast<std::int64_t>(itemsize(n.dtype));
}

KILN_ENTRY std::vector<const Storage*>& donated_storages() {
  static thread_local std::vector<const Storage*> storages;
  return storages;
}

KILN_ENTRY void mark_donated(ir::Captured& c) {
  const std::vector<const Storage*>& donated = donated_storages();
  if (donated.empty()) return;
  // A storage two leaves view (a value and its reshape) is kept: the plan tracks reads per leaf.
  std::unordered_map<const Storage*, int> leaves_of;
  for (const ir::NodePtr& l : c.leaves) ++leaves_of[l->buffer->storage.get()];
  for (std::size_t l = 0; l < c.leaves.size(); ++l) {
    const Storage* st = c.leaves[l]->buffer->storage.get();
    if (leaves_of[st] == 1 && std::find(donated.begin(), donated.end(), st) != donated.end())
      c.graph.donated.push_back(static_cast<std::int32_t>(l));
  }
  if (!c.graph.donated.empty()) c.graph.rehash();
}

KILN_ENTRY void evaluate_group(const std::vector<ir::NodePtr>& roots, Device device) {
  ir::Captured c = ir::capture(roots, device);
  mark_donated(c);
  backend::RunArgs args;
  for (auto& leaf : c.leaves) args.inputs.push_back(leaf_pointer(*leaf));
  std::vector<StoragePtr> storages;
  for (auto& r : roots) {
    storages.push_back(allocate_value(*r, "eval"));
    args.outputs.push_back(storages.back()->data);
  }
  run_graph(c.graph, args);
  counters().graphs++;
  for (std::size_t i = 0; i < roots.size(); ++i) {
    roots[i]->buffer = ir::BufferView{storages[i], 0, contiguous_strides(roots[i]->shape)};
    // The subgraph is no longer needed (let its memory go), unless gradients flow through it:
    // then it is the tape a backward walks.
    const ir::Node& r = *roots[i];
    if (!r.requires_grad || r.grad_leaf || r.graph_freed) roots[i]->inputs.clear();
  }
}

KILN_ENTRY void evaluate(const std::vector<ir::NodePtr>& roots) {
  std::vector<ir::NodePtr> todo;
  std::unordered_set<const ir::Node*> seen;
  for (auto& r : roots)
    if (r && !r->realized() && seen.insert(r.get()).second) todo.push_back(r);
  while (!todo.empty()) {
    Device d = todo.front()->device;
    std::vector<ir::NodePtr> group, rest;
    for (auto& r : todo) (r->device == d ? group : rest).push_back(r);
    evaluate_group(group, d);
    todo.swap(rest);
  }
}

KILN_ENTRY ir::NodePtr maybe_eval_big(ir::NodePtr node) {
  if (node && !node->realized() && !deferring_eval() && (node->depth > kMaxLazyDepth || node->count > kMaxLazyNodes))
    evaluate({node});
  return node;
}

KILN_ENTRY bool has_self_overlap(const Shape& shape, const Strides& strides) {
  if (shape.numel() == 0) return false;
  for (std::size_t i = 0; i < shape.size(); ++i)
    if (shape[i] > 1 && strides[i] == 0) return true;
  return false;
}

KILN_ENTRY void evaluate_pending_reads(const std::vector<const Storage*>& storages,
                                       const std::vector<ir::NodePtr>& values) {
  std::vector<ir::NodePtr> pending;
  for (std::size_t i = 0; i < storages.size(); ++i) {
    const Storage* s = storages[i];
    if (!s || std::find(storages.begin(), storages.begin() + static_cast<std::ptrdiff_t>(i), s) !=
                  storages.begin() + static_cast<std::ptrdiff_t>(i))
      continue;
    std::lock_guard<std::mutex> lock(storage_lock(s));
    auto& readers = const_cast<Storage*>(s)->lazy_readers;
    for (const std::weak_ptr<ir::Node>& w : readers)
      if (ir::NodePtr p = w.lock(); p && !p->realized()) pending.push_back(std::move(p));
    readers.clear();
  }
  if (pending.empty()) return;
  // The lazy nodes under the values, and how many input edges of theirs reach each one.
  std::unordered_map<const ir::Node*, long> edges;
  std::unordered_set<const ir::Node*> roots;
  std::vector<const ir::Node*> stack;
  for (const ir::NodePtr& v : values)
    if (v && !v->realized() && roots.insert(v.get()).second) stack.push_back(v.get());
  std::unordered_set<const ir::Node*> seen(roots.begin(), roots.end());
  while (!stack.empty()) {
    const ir::Node* n = stack.back();
    stack.pop_back();
    for (const ir::NodePtr& in : n->inputs) {
      if (in->realized()) continue;
      ++edges[in.get()];
      if (seen.insert(in.get()).second) stack.push_back(in.get());
    }
  }
  std::vector<ir::NodePtr> todo;
  std::unordered_set<const ir::Node*> queued;
  for (ir::NodePtr& p : pending) {
    if (roots.count(p.get()) || !queued.insert(p.get()).second) continue;
    auto e = edges.find(p.get());
    // Held only by the values' graphs (its one reference here aside): computed by the write.
    if (e != edges.end() && p.use_count() - static_cast<long>(std::count(pending.begin(), pending.end(), p)) == e->second)
      continue;
    todo.push_back(p);
  }
  pending.clear();
  if (!todo.empty()) evaluate(todo);
}

KILN_ENTRY void prepare_write(const ir::NodePtr& destination, const std::vector<ir::NodePtr>& values) {
  if (!destination->realized()) {
    // The chain of lazy views down to the tensor they view (a flip, step < 0, is a copy in PyTorch).
    std::vector<ir::Node*> chain;
    ir::NodePtr base = destination;
    while (!base->realized() && !base->requires_grad && base->inputs.size() == 1 &&
           (base->op == ir::Op::Reshape || base->op == ir::Op::Permute || base->op == ir::Op::Broadcast ||
            (base->op == ir::Op::Slice && base->attrs.ints.at(2) > 0))) {
      chain.push_back(base.get());
      base = base->inputs[0];
    }
    if (!chain.empty()) {
      evaluate({base});
      std::vector<ir::StridedLayout> layouts(chain.size());
      ir::StridedLayout at{base->buffer->offset, base->buffer->strides};
      const Shape* in = &base->shape;
      bool ok = !base->placeholder;
      for (std::size_t i = chain.size(); ok && i-- > 0;) {
        std::optional<ir::StridedLayout> l = ir::view_layout(chain[i]->op, chain[i]->attrs, *in, at, chain[i]->shape);
        if (!l) ok = false;
        else layouts[i] = at = std::move(*l), in = &chain[i]->shape;
      }
      if (ok) {
        const StoragePtr storage = base->buffer->storage;
        for (std::size_t i = chain.size(); i-- > 0;) {
          if (chain[i]->realized()) continue;
          chain[i]->buffer = ir::BufferView{storage, layouts[i].offset, layouts[i].strides};
          chain[i]->inputs.clear();
        }
      }
    }
    if (!destination->realized()) evaluate({destination});
  }
  if (destination->realized()) {
    evaluate_pending_reads({destination->buffer->storage.get()}, values);
    ++destination->buffer->storage->version;
  }
}

KILN_ENTRY void evaluate_into(const ir::NodePtr& value, const ir::NodePtr& destination) {
  const ir::BufferView& dst = *destination->buffer;
  ir::Captured c = ir::capture({value}, destination->device);
  bool aliased = false, unsafe_alias = false;
  bool pointwise_only = std::all_of(c.graph.nodes.begin(), c.graph.nodes.end(), [](const ir::GraphNode& n) {
    return ir::op_kind(n.op) != ir::OpKind::Reduce && ir::op_kind(n.op) != ir::OpKind::IndexMap &&
           ir::op_kind(n.op) != ir::OpKind::Gather && ir::op_kind(n.op) != ir::OpKind::Scatter &&
           ir::op_kind(n.op) != ir::OpKind::Scan && ir::op_kind(n.op) != ir::OpKind::Sort &&
           ir::op_kind(n.op) != ir::OpKind::Contract && ir::op_kind(n.op) != ir::OpKind::Attention;
  });
  for (auto& leaf : c.leaves) {
    if (leaf->buffer->storage != dst.storage) continue;
    aliased = true;
    // Reading an element only at the index it is written to is safe in any executor.
    if (!pointwise_only || leaf->buffer->offset != dst.offset || leaf->buffer->strides != dst.strides)
      unsafe_alias = true;
  }
  if (aliased && unsafe_alias) {
    // Compute into a fresh temporary first, then copy: the graph reads what it overwrites.
    // The captured graph itself is run into new memory: `value` may be a realized view of the
    // destination (x.assign(transpose(x))), which evaluating would leave where it is.
    StoragePtr st = allocate_value(*value, "assign");
    backend::RunArgs targs;
    for (auto& leaf : c.leaves) targs.inputs.push_back(leaf_pointer(*leaf));
    targs.outputs.push_back(st->data);
    run_graph(c.graph, targs);
    counters().graphs++;
    evaluate_into(ir::input(ir::BufferView{st, 0, contiguous_strides(value->shape)}, value->shape, value->dtype,
                            destination->device),
                  destination);
    return;
  }
  c.graph.output_strides[0] = dst.strides;
  c.graph.rehash();
  backend::RunArgs args;
  for (auto& leaf : c.leaves) args.inputs.push_back(leaf_pointer(*leaf));
  args.outputs.push_back(static_cast<char*>(dst.storage->data) +
                         dst.offset * static_cast<std::int64_t>(itemsize(destination->dtype)));
  run_graph(c.graph, args);
  counters().graphs++;
}

KILN_ENTRY ViewSpan view_span(const ir::Node& n) {
  const ir::BufferView& b = *n.buffer;
  const auto es = static_cast<std::int64_t>(itemsize(n.dtype));
  if (n.numel() == 0) return {b.storage.get(), 0, 0};
  std::int64_t lo = b.offset, hi = b.offset;
  for (std::size_t i = 0; i < n.shape.size(); ++i) {
    const std::int64_t extent = (n.shape[i] - 1) * b.strides[i];
    (extent < 0 ? lo : hi) += extent;
  }
  return {b.storage.get(), lo * es, (hi + 1) * es};
}

KILN_ENTRY bool same_view(const ir::Node& a, const ir::Node& b) {
  return a.buffer->storage == b.buffer->storage && a.buffer->offset == b.buffer->offset && a.dtype == b.dtype &&
         a.shape == b.shape && a.buffer->strides == b.buffer->strides;
}

KILN_ENTRY void evaluate_into_many(const std::vector<ir::NodePtr>& values,
                                   const std::vector<ir::NodePtr>& destinations) {
  if (values.size() != destinations.size())
    throw InternalError("evaluate_into_many: " + std::to_string(values.size()) + " values for " +
                        std::to_string(destinations.size()) + " destinations");
  std::vector<ir::NodePtr> vals, dsts;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const ir::Node& v = *values[i];
    const ir::Node& d = *destinations[i];
    if (!d.realized() || v.shape != d.shape || v.dtype != d.dtype || !(v.device == d.device))
      throw InternalError("evaluate_into_many: value " + std::string(dtype_name(v.dtype)) + v.shape.str() + " on " +
                          v.device.str() + " for destination " + dtype_name(d.dtype) + d.shape.str() + " on " +
                          d.device.str() + (d.realized() ? "" : " (not evaluated)"));
    if (d.numel() == 0) continue;
    vals.push_back(values[i]);
    dsts.push_back(destinations[i]);
  }
  if (vals.empty()) return;
  {
    std::vector<const Storage*> written;
    for (const ir::NodePtr& d : dsts) written.push_back(d->buffer->storage.get());
    evaluate_pending_reads(written, vals);
    for (const ir::NodePtr& d : dsts) ++d->buffer->storage->version;
  }
  // One graph per device.
  const Device device = dsts.front()->device;
  if (std::any_of(dsts.begin(), dsts.end(), [&](const ir::NodePtr& d) { return !(d->device == device); })) {
    std::vector<ir::NodePtr> here_v, here_d, rest_v, rest_d;
    for (std::size_t i = 0; i < vals.size(); ++i) {
      const bool here = dsts[i]->device == device;
      (here ? here_v : rest_v).push_back(vals[i]);
      (here ? here_d : rest_d).push_back(dsts[i]);
    }
    evaluate_into_many(here_v, here_d);
    evaluate_into_many(rest_v, rest_d);
    return;
  }
  const std::size_t n_out = vals.size();
  std::vector<ViewSpan> spans;
  for (const ir::NodePtr& d : dsts) spans.push_back(view_span(*d));
  for (std::size_t i = 0; i < n_out; ++i)
    for (std::size_t j = i + 1; j < n_out; ++j)
      if (spans_overlap(spans[i], spans[j]))
        throw ValueError("evaluate_into_many: destinations " + std::to_string(i) + " (" + dtype_name(dsts[i]->dtype) +
                         dsts[i]->shape.str() + ") and " + std::to_string(j) + " (" + dtype_name(dsts[j]->dtype) +
                         dsts[j]->shape.str() + ") share memory");
  ir::Captured c = ir::capture(vals, device);
  mark_donated(c);
  const std::vector<ir::GraphNode>& nodes = c.graph.nodes;
  // The destination each leaf is exactly (-1: none; -2: it overlaps one otherwise).
  std::vector<int> alias_of(c.leaves.size(), -1);
  bool unsafe = false, any_alias = false;
  for (std::size_t l = 0; l < c.leaves.size(); ++l) {
    const ViewSpan ls = view_span(*c.leaves[l]);
    for (std::size_t k = 0; k < n_out; ++k) {
      if (!spans_overlap(ls, spans[k])) continue;
      any_alias = true;
      if (alias_of[l] == -1 && same_view(*c.leaves[l], *dsts[k])) {
        alias_of[l] = static_cast<int>(k);
      } else {
        unsafe = true;
      }
    }
  }
  if (any_alias && !unsafe) {
    const bool pointwise_only = std::all_of(nodes.begin(), nodes.end(), [](const ir::GraphNode& n) {
      return ir::op_kind(n.op) == ir::OpKind::Leaf || ir::is_pointwise(n.op);
    });
    // The aliased leaves each node is computed from (sorted, usually none or a few).
    std::vector<std::vector<int>> from(nodes.size());
    for (std::size_t i = 0; i < nodes.size() && !unsafe; ++i) {
      const ir::GraphNode& n = nodes[i];
      if (n.op == ir::Op::Input) {
        if (alias_of[static_cast<std::size_t>(n.leaf)] >= 0) from[i].push_back(n.leaf);
        continue;
      }
      for (std::int32_t in : n.inputs) {
        const std::vector<int>& f = from[static_cast<std::size_t>(in)];
        std::vector<int> merged;
        std::set_union(from[i].begin(), from[i].end(), f.begin(), f.end(), std::back_inserter(merged));
        from[i].swap(merged);
      }
      // Read other than at the index written (a reduction, a view, a gather): unsafe in place.
      if (!from[i].empty() && !ir::is_pointwise(n.op)) unsafe = true;
    }
    for (std::size_t l = 0; l < c.leaves.size() && !unsafe; ++l) {
      const int k = alias_of[l];
      if (k < 0) continue;
      bool others = false, own = false, same_shape = true;
      for (std::size_t o = 0; o < n_out; ++o) {
        const std::vector<int>& f = from[static_cast<std::size_t>(c.graph.outputs[o])];
        if (!std::binary_search(f.begin(), f.end(), static_cast<int>(l))) continue;
        (static_cast<int>(o) == k ? own : others) = true;
        same_shape = same_shape && dsts[o]->shape == dsts[static_cast<std::size_t>(k)]->shape;
      }
      if (others && !(pointwise_only && own && same_shape)) unsafe = true;
    }
  }
  backend::RunArgs args;
  for (auto& leaf : c.leaves) args.inputs.push_back(leaf_pointer(*leaf));
  if (unsafe) {
    // Into new memory first, then copied: the graph reads what it overwrites.
    std::vector<ir::NodePtr> temps;
    for (const ir::NodePtr& v : vals) {
      StoragePtr st = allocate_value(*v, "evaluate_into");
      args.outputs.push_back(st->data);
      temps.push_back(ir::input(ir::BufferView{st, 0, contiguous_strides(v->shape)}, v->shape, v->dtype, device));
    }
    run_graph(c.graph, args);
    counters().graphs++;
    evaluate_into_many(temps, dsts);
    return;
  }
  for (std::size_t o = 0; o < n_out; ++o) {
    c.graph.output_strides[o] = dsts[o]->buffer->strides;
    args.outputs.push_back(const_cast<void*>(leaf_pointer(*dsts[o])));
  }
  c.graph.rehash();
  run_graph(c.graph, args);
  counters().graphs++;
}

KILN_ENTRY ir::NodePtr contiguous_copy(const ir::NodePtr& node) {
  ir::Captured c = ir::capture({node}, node->device);  // the output is the leaf itself: a copy
  StoragePtr st = allocate_value(*node, "contiguous");
  backend::RunArgs args;
  for (auto& leaf : c.leaves) args.inputs.push_back(leaf_pointer(*leaf));
  args.outputs.push_back(st->data);
  run_graph(c.graph, args);
  return ir::input(ir::BufferView{st, 0, contiguous_strides(node->shape)}, node->shape, node->dtype, node->device);
}

KILN_ENTRY void copy_to_host_contiguous(const ir::NodePtr& node, void* out) {
  std::size_t es = itemsize(node->dtype);
  std::int64_t n = node->numel();
  if (n == 0) return;
  if (!node->device.is_cpu()) {
    ir::NodePtr src = kiln::is_contiguous(node->shape, node->buffer->strides) ? node : contiguous_copy(node);
    backend::entry::copy_bytes(out, Device::cpu(), leaf_pointer(*src), src->device, static_cast<std::size_t>(n) * es);
    return;
  }
  const ir::BufferView& b = *node->buffer;
  const char* base = static_cast<const char*>(b.storage->data) + b.offset * static_cast<std::int64_t>(es);
  if (kiln::is_contiguous(node->shape, b.strides)) {
    std::memcpy(out, base, static_cast<std::size_t>(n) * es);
    return;
  }
  const Shape& s = node->shape;
  std::vector<std::int64_t> idx(s.size(), 0);
  char* o = static_cast<char*>(out);
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t off = 0;
    for (std::size_t d = 0; d < s.size(); ++d) off += idx[d] * b.strides[d];
    std::memcpy(o + i * static_cast<std::int64_t>(es), base + off * static_cast<std::int64_t>(es), es);
    for (std::size_t d = s.size(); d-- > 0;) {
      if (++idx[d] < s[d]) break;
      idx[d] = 0;
    }
  }
}

}  // namespace detail
}  // namespace kiln

namespace kiln {

KILN_ENTRY void eval(const std::vector<Tensor>& tensors) {
  std::vector<ir::NodePtr> nodes;
  for (auto& t : tensors) nodes.push_back(t.node());
  if (!detail::deferring_eval()) detail::evaluate(nodes);
}

KILN_ENTRY Tensor Tensor::to(DType dtype) const {
  checked();
  return Tensor(ir::cast(node_, dtype));
}

KILN_ENTRY Tensor Tensor::to(Device device) const {
  if (device == this->device()) return *this;
  eval();
  ir::NodePtr src = node_;
  if (!kiln::is_contiguous(shape(), src->buffer->strides)) src = detail::contiguous_copy(src);
  std::size_t bytes = static_cast<std::size_t>(numel()) * itemsize(dtype());
  ir::Node target = *src;
  target.device = device;
  StoragePtr st = detail::allocate_value(target, "to");
  backend::entry::copy_bytes(st->data, device, detail::leaf_pointer(*src), src->device, bytes);
  return Tensor(ir::input(ir::BufferView{st, 0, contiguous_strides(shape())}, shape(), dtype(), device));
}

}  // namespace kiln

namespace kiln {
namespace detail {

KILN_ENTRY bool broadcasts_to(const SmallShape& from, const Shape& to) {
  if (from.rank > to.size()) return false;
  for (std::size_t i = 0; i < from.rank; ++i) {
    std::int64_t d = from.dims[from.rank - 1 - i];
    if (d != 1 && d != to[to.size() - 1 - i]) return false;
  }
  return true;
}

KILN_ENTRY void check_assign_destination(const Tensor& destination) {
  const ir::Node& n = *destination.node();
  // PyTorch: "a leaf Variable that requires grad is being used in an in-place operation". A
  // graph built on the leaf before the write would read the new value, and its gradient the old.
  if (n.grad_leaf && n.requires_grad && ir::detail::grad_mode())
    throw AutogradError("assign: the destination " + destination.describe() +
                        " is a leaf that requires grad; write it under NoGradGuard (as an optimizer "
                        "step does), or write a detach()ed copy");
  if (!n.realized() && n.requires_grad && !n.grad_leaf && ir::detail::grad_mode())
    throw AutogradError("assign: the destination " + destination.describe() +
                        " is computed from tensors that require grad (a view of one records its own node "
                        "while gradients are recorded); write under NoGradGuard, where views of evaluated "
                        "tensors share their storage");
  // An evaluated one: the write is not recorded on the tape, so a backward through it would use
  // the new values where its rule saved the old ones (exp's saved output, say) and give a wrong
  // gradient. PyTorch records it; kiln refuses it rather than differentiate the wrong function.
  if (n.realized() && n.requires_grad && !n.grad_leaf && ir::detail::grad_mode())
    throw AutogradError("assign: the destination " + destination.describe() +
                        " is computed from tensors that require grad, and an in-place write into it is not "
                        "recorded for gradients; compute the new value out of place (y = y * 2), or write "
                        "under NoGradGuard (then the gradient does not see the write)");
}

}  // namespace detail
}  // namespace kiln
