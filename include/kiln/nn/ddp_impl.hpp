#pragma once
// The definitions of nn::DistributedDataParallel (nn/ddp.hpp). Header-only mode includes them
// from that header; compiled mode compiles them once into kiln::kiln_compiled.
#include <algorithm>
#include <unordered_set>

#include "kiln/autodiff/backward.hpp"
#include "kiln/core/hash.hpp"
#include "kiln/nn/ddp.hpp"
#include "kiln/tensor/creation.hpp"
#include "kiln/tensor/eval.hpp"
#include "kiln/tensor/functions.hpp"

namespace kiln::nn {

KILN_ENTRY DistributedDataParallel::DistributedDataParallel(std::shared_ptr<Module> module,
                                                            DistributedDataParallelOptions options)
    : options_(options), group_(options.process_group ? options.process_group : &distributed::default_group()) {
  if (!module) throw ValueError("DistributedDataParallel: the module is null");
  if (!(options_.bucket_cap_mb > 0))
    throw ValueError("DistributedDataParallel: bucket_cap_mb must be positive, not " +
                     std::to_string(options_.bucket_cap_mb));
  module_ = register_module("module", std::move(module));
  params_ = parameters();
  for (const Tensor& p : params_)
    if (!p.requires_grad() || !p.is_leaf() || !p.node()->grad_leaf)
      throw ValueError("DistributedDataParallel: parameter " + p.describe() + " is not a leaf that requires grad");
  check_replicas_agree();
  {
    NoGradGuard off;
    for (Tensor& p : params_) distributed::broadcast(p, 0, group_);
    for (Tensor& b : buffers()) distributed::broadcast(b, 0, group_);
  }
  make_buckets();
  marked_.assign(params_.size(), false);
  unused_.assign(params_.size(), false);
  for (std::size_t i = 0; i < params_.size(); ++i)
    hook_ids_.push_back(params_[i].register_post_accumulate_grad_hook([this, i](const Tensor&) { mark_ready(i); }));
  set_sync(true);
}

KILN_ENTRY DistributedDataParallel::~DistributedDataParallel() {
  for (std::size_t i = 0; i < params_.size() && i < hook_ids_.size(); ++i) {
    params_[i].remove_post_accumulate_grad_hook(hook_ids_[i]);
    if (const auto& leaf = params_[i].node()->grad_leaf) leaf->evaluation_group = -1;
  }
}

KILN_ENTRY void DistributedDataParallel::set_sync(bool on) {
  sync_ = on;
  // One rank has nothing to overlap with: its backward stays one graph.
  const bool split = on && group_->size() > 1 && buckets_.size() > 1;
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (const auto& leaf = params_[i].node()->grad_leaf)
      leaf->evaluation_group = split ? static_cast<int>(bucket_of_[i]) : -1;
}

/// Every rank must wrap the same parameters: a rank whose list differs would pair its buckets
/// with other tensors (or wait forever for a collective the others never call).
KILN_ENTRY void DistributedDataParallel::check_replicas_agree() {
  std::uint64_t h = kiln::detail::hash_combine(0x6b696c6e, params_.size());
  for (const Tensor& p : params_) {
    h = kiln::detail::hash_combine(h, static_cast<std::uint64_t>(p.dtype()));
    for (std::int64_t d : p.shape()) h = kiln::detail::hash_combine(h, static_cast<std::uint64_t>(d));
  }
  const std::vector<std::int64_t> v{static_cast<std::int64_t>(params_.size()), static_cast<std::int64_t>(h >> 1)};
  const Tensor mine = kiln::from_vector(v, Shape{2}, group_->device());
  Tensor all = kiln::empty(Shape{group_->size() * 2}, DType::Int64, group_->device());
  distributed::all_gather_into_tensor(all, mine, group_);
  const std::vector<std::int64_t> seen = all.to_vector<std::int64_t>();
  for (int r = 0; r < group_->size(); ++r)
    if (seen[2 * r] != v[0] || seen[2 * r + 1] != v[1])
      throw ValueError("DistributedDataParallel: rank " + std::to_string(group_->rank()) + " has " +
                       std::to_string(params_.size()) + " parameters and rank " + std::to_string(r) + " has " +
                       std::to_string(seen[2 * r]) +
                       (seen[2 * r] == v[0] ? " with other shapes or dtypes" : std::string()) +
                       ": every rank must wrap the same model");
}

KILN_ENTRY void DistributedDataParallel::make_buckets() {
  const auto cap = static_cast<std::int64_t>(options_.bucket_cap_mb * 1024 * 1024);
  bucket_of_.assign(params_.size(), 0);
  // Reverse registration order; one open bucket per dtype and device.
  std::vector<std::size_t> open;
  for (std::size_t k = params_.size(); k-- > 0;) {
    const Tensor& p = params_[k];
    std::size_t* found = nullptr;
    for (std::size_t& b : open)
      if (buckets_[b].dtype == p.dtype() && buckets_[b].device == p.device()) found = &b;
    const std::int64_t bytes = p.numel() * static_cast<std::int64_t>(itemsize(p.dtype()));
    if (found && buckets_[*found].numel * static_cast<std::int64_t>(itemsize(p.dtype())) + bytes > cap) {
      open.erase(open.begin() + (found - open.data()));
      found = nullptr;
    }
    if (!found) {
      buckets_.emplace_back();
      buckets_.back().dtype = p.dtype();
      buckets_.back().device = p.device();
      open.push_back(buckets_.size() - 1);
      found = &open.back();
    }
    Bucket& b = buckets_[*found];
    bucket_of_[k] = *found;
    b.members.push_back(k);
    b.offsets.push_back(b.numel);
    b.numel += p.numel();
  }
  for (Bucket& b : buckets_) {
    b.flat = kiln::empty(Shape{std::max<std::int64_t>(b.numel, 1)}, b.dtype, b.device);
    const StoragePtr& storage = b.flat.node()->buffer->storage;
    // The gradient homes: a fresh gradient is written straight into the bucket.
    for (std::size_t m = 0; m < b.members.size(); ++m) {
      ir::GradLeaf& leaf = *params_[b.members[m]].node()->grad_leaf;
      if (!leaf.home && !leaf.grad)
        leaf.home = ir::BufferView{storage, b.offsets[m], contiguous_strides(params_[b.members[m]].shape())};
    }
  }
}

KILN_ENTRY std::vector<std::vector<std::size_t>> DistributedDataParallel::bucket_indices() const {
  std::vector<std::vector<std::size_t>> out;
  for (const Bucket& b : buckets_) out.push_back(b.members);
  return out;
}

KILN_ENTRY void DistributedDataParallel::mark_ready(std::size_t param) {
  if (!sync_) return;
  if (marked_[param])
    throw ValueError("DistributedDataParallel: parameter " + std::to_string(param) +
                     " got a second gradient before its bucket was reduced (two backward passes without a "
                     "reduction between them: use no_sync() to accumulate)");
  marked_[param] = true;
  started_ = true;
  ++buckets_[bucket_of_[param]].ready;
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].ready == buckets_[next_bucket_].members.size())
    reduce(next_bucket_++);
  if (next_bucket_ == buckets_.size()) {  // the iteration is complete
    next_bucket_ = 0;
    started_ = false;
    marked_.assign(params_.size(), false);
    for (Bucket& b : buckets_) b.ready = 0;
    wait_for_reductions();
    unused_.assign(params_.size(), false);
  }
}

KILN_ENTRY void DistributedDataParallel::reduce(std::size_t index) {
  Bucket& b = buckets_[index];
  NoGradGuard off;
  ++reductions_;
  // In place when the gradients tile one span of one buffer (the bucket's own, through the
  // homes, or a fused optimizer's).
  std::vector<std::pair<std::int64_t, std::int64_t>> spans;  // (offset, numel)
  StoragePtr storage;
  bool in_place = true;
  for (std::size_t m : b.members) {
    const ir::NodePtr& g = params_[m].node()->grad_leaf->grad;
    if (!g || !g->realized() || g->dtype != b.dtype || !kiln::is_contiguous(g->shape, g->buffer->strides) ||
        (storage && g->buffer->storage != storage)) {
      in_place = false;
      break;
    }
    storage = g->buffer->storage;
    spans.emplace_back(g->buffer->offset, g->numel());
  }
  if (in_place) {
    std::sort(spans.begin(), spans.end());
    for (std::size_t i = 1; i < spans.size(); ++i)
      in_place = in_place && spans[i].first == spans[i - 1].first + spans[i - 1].second;
  }
  if (in_place && !spans.empty()) {
    ++in_place_;
    Tensor span(ir::input(ir::BufferView{storage, spans.front().first, {1}}, Shape{b.numel}, b.dtype, b.device));
    in_flight_.push_back({distributed::all_reduce(span, distributed::ReduceOp::Avg, group_, true), index, false});
    return;
  }
  // Otherwise through the bucket's buffer: the gradients in now, the averages out once reduced.
  std::vector<ir::NodePtr> values, destinations;
  const StoragePtr& flat = b.flat.node()->buffer->storage;
  for (std::size_t i = 0; i < b.members.size(); ++i) {
    const Tensor& p = params_[b.members[i]];
    const ir::NodePtr& g = p.node()->grad_leaf->grad;
    values.push_back(g ? ir::cast(g, b.dtype) : ir::constant(0.0, b.dtype, p.shape(), b.device));
    destinations.push_back(
        ir::input(ir::BufferView{flat, b.offsets[i], contiguous_strides(p.shape())}, p.shape(), b.dtype, b.device));
  }
  kiln::detail::evaluate_into_many(values, destinations);
  in_flight_.push_back({distributed::all_reduce(b.flat, distributed::ReduceOp::Avg, group_, true), index, true});
}

KILN_ENTRY void DistributedDataParallel::wait_for_reductions() {
  NoGradGuard off;
  std::vector<InFlight> in_flight = std::move(in_flight_);
  in_flight_.clear();
  // Which parameters some rank used (find_unused_parameters): those keep their average, the
  // others no gradient. One more collective, after the buckets, on every rank alike.
  std::vector<std::int32_t> used(params_.size(), 1);
  if (options_.find_unused_parameters) {
    for (std::size_t i = 0; i < params_.size(); ++i) used[i] = unused_[i] ? 0 : 1;
    Tensor any = kiln::from_vector(used, Shape{static_cast<std::int64_t>(used.size())}, group_->device());
    distributed::all_reduce(any, distributed::ReduceOp::Max, group_);
    used = any.to_vector<std::int32_t>();
  }
  for (InFlight& f : in_flight) {
    f.work->wait();
    if (!f.copied) continue;
    const Bucket& b = buckets_[f.bucket];
    const StoragePtr& flat = b.flat.node()->buffer->storage;
    for (std::size_t i = 0; i < b.members.size(); ++i) {
      const Tensor& p = params_[b.members[i]];
      Tensor reduced(
          ir::input(ir::BufferView{flat, b.offsets[i], contiguous_strides(p.shape())}, p.shape(), b.dtype, b.device));
      ir::NodePtr& g = p.node()->grad_leaf->grad;
      if (!g && !used[b.members[i]]) continue;  // no rank used it: no gradient, as in torch
      if (g && g->realized()) {
        Tensor(g).assign(reduced);
      } else {  // none, or a lazy one (inside a trace): a copy of the average becomes the gradient
        Tensor copy = kiln::empty(p.shape(), p.dtype(), p.device());
        copy.assign(reduced);
        g = copy.node();
      }
    }
  }
}

KILN_ENTRY Tensor DistributedDataParallel::forward(const Tensor& input) {
  if (started_) {
    std::string waiting;
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (!marked_[i]) waiting += (waiting.empty() ? "" : ", ") + std::to_string(i);
    throw ValueError("DistributedDataParallel: the previous backward left buckets unreduced: parameter(s) " + waiting +
                     " of parameters() got no gradient (every parameter must take part in the loss, or pass "
                     "find_unused_parameters = true)");
  }
  // A forward without a backward since (evaluation with grad mode on) leaves nothing behind.
  marked_.assign(params_.size(), false);
  unused_.assign(params_.size(), false);
  for (Bucket& b : buckets_) b.ready = 0;
  if (options_.broadcast_buffers) {
    NoGradGuard off;
    for (Tensor& b : buffers()) distributed::broadcast(b, 0, group_);
  }
  Tensor output = (*module_)(input);
  if (options_.find_unused_parameters && sync_ && output.defined() && output.requires_grad()) mark_unused(output);
  return output;
}

KILN_ENTRY void DistributedDataParallel::mark_unused(const Tensor& output) {
  // The parameters a backward from `output` reaches: the walk autodiff::backward_pass makes.
  std::unordered_set<const ir::Node*> seen, reached;
  std::vector<const ir::Node*> stack{output.node().get()};
  seen.insert(stack.back());
  while (!stack.empty()) {
    const ir::Node* n = stack.back();
    stack.pop_back();
    if (n->grad_leaf) {
      reached.insert(n);
      continue;
    }
    for (const ir::NodePtr& in : autodiff::gradient_inputs(*n))
      if (in->requires_grad && seen.insert(in.get()).second) stack.push_back(in.get());
  }
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (!reached.count(params_[i].node().get())) {
      unused_[i] = marked_[i] = true;
      ++buckets_[bucket_of_[i]].ready;
    }
}

}  // namespace kiln::nn
