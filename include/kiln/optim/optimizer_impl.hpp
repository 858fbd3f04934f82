#pragma once
// The member function bodies of optim::Optimizer (optim/optimizer.hpp). Header-only mode includes them
// from that header (KILN_ENTRY is `inline`); compiled mode compiles them once into
// kiln::kiln_compiled (src/kiln_compiled.cpp), so users' translation units parse declarations.
#include "kiln/optim/optimizer.hpp"

namespace kiln::optim {

namespace detail {

KILN_ENTRY NodePtr slice_of(const StoragePtr& storage, std::int64_t offset, const Shape& shape, DType dtype,
                            Device device) {
  return ir::input(ir::BufferView{storage, offset, contiguous_strides(shape)}, shape, dtype, device);
}

KILN_ENTRY StoragePtr allocate_elements(std::int64_t numel, DType dtype, Device device, const char* what) {
  ir::Node n;
  n.shape = Shape{numel};
  n.dtype = dtype;
  n.device = device;
  return kiln::detail::allocate_value(n, what);
}

KILN_ENTRY NodePtr scalar_view(const NodePtr& scalars, std::int64_t index, const Shape& shape) {
  const ir::BufferView& b = *scalars->buffer;
  const std::int64_t offset = b.offset + (index == 0 ? 0 : index * b.strides.at(0));
  return ir::input(ir::BufferView{b.storage, offset, Strides(shape.size(), 0)}, shape, scalars->dtype, scalars->device);
}

KILN_ENTRY NodePtr scalars_tensor(const std::vector<double>& values, DType dtype, Device device) {
  const Shape shape{static_cast<std::int64_t>(values.size())};
  if (dtype == DType::Float64) return from_vector<double>(values, shape, device).node();
  std::vector<float> f(values.begin(), values.end());
  return from_vector<float>(f, shape, device).node();
}

KILN_ENTRY std::vector<NodePtr> coalesce(const std::vector<NodePtr>& nodes) {
  std::vector<NodePtr> out;
  std::vector<NodePtr> todo;
  std::set<const ir::Node*> seen;
  for (const NodePtr& n : nodes) {
    if (!n || !seen.insert(n.get()).second) continue;
    if (n->realized() && n->numel() > 0 && kiln::is_contiguous(n->shape, n->buffer->strides))
      todo.push_back(n);
    else
      out.push_back(n);
  }
  std::stable_sort(todo.begin(), todo.end(), [](const NodePtr& a, const NodePtr& b) {
    if (a->buffer->storage != b->buffer->storage)
      return std::less<const Storage*>()(a->buffer->storage.get(), b->buffer->storage.get());
    return a->buffer->offset < b->buffer->offset;
  });
  for (std::size_t i = 0; i < todo.size();) {
    std::size_t j = i + 1;
    std::int64_t end = todo[i]->buffer->offset + todo[i]->numel();
    while (j < todo.size() && todo[j]->buffer->storage == todo[i]->buffer->storage &&
           todo[j]->dtype == todo[i]->dtype && todo[j]->device == todo[i]->device && todo[j]->buffer->offset == end) {
      end += todo[j]->numel();
      ++j;
    }
    if (j == i + 1) {
      out.push_back(todo[i]);
    } else {
      const NodePtr& first = todo[i];
      out.push_back(ir::input(ir::BufferView{first->buffer->storage, first->buffer->offset, {1}},
                              Shape{end - first->buffer->offset}, first->dtype, first->device));
    }
    i = j;
  }
  return out;
}

KILN_ENTRY std::vector<NodePtr> defined_grads(const std::vector<Tensor>& params) {
  std::vector<NodePtr> grads;
  for (const Tensor& p : params) {
    if (!p.defined() || !p.node()->grad_leaf || !p.node()->grad_leaf->grad) continue;
    grads.push_back(p.node()->grad_leaf->grad);
  }
  kiln::detail::evaluate(grads);
  return grads;
}

}  // namespace detail

KILN_ENTRY void Optimizer::build_bucket_update(const ParamGroup& group, const detail::Bucket& b,
                                               const std::vector<const detail::Member*>& with_grad,
                                               const std::vector<std::vector<double>>& rows,
                                               std::vector<ir::NodePtr>& values,
                                               std::vector<ir::NodePtr>& destinations) const {
  const DType cd = detail::opmath(b.dtype);
  const std::size_t n_slots = b.state.size();
  bool flat = with_grad.size() == b.members.size();
  for (std::size_t i = 0; flat && i < with_grad.size(); ++i)
    flat = at_home(b, *with_grad[i]) && grad_at_home(b, *with_grad[i]) && rows[i] == rows[0];
  auto emit = [&](const ir::NodePtr& param, const ir::NodePtr& grad, const std::vector<ir::NodePtr>& slots,
                  const std::function<ir::NodePtr(int)>& scalar) {
    Update in;
    in.param = ir::cast(param, cd);
    in.grad = ir::cast(grad, cd);
    in.scalar = scalar;
    for (std::size_t s = 0; s < n_slots; ++s)
      in.state.push_back(slot_used(group, s) ? ir::cast(slots[s], cd) : nullptr);
    Updated out = update(group, in);
    if (out.param) {
      values.push_back(ir::cast(out.param, b.dtype));
      destinations.push_back(param);
    }
    for (std::size_t s = 0; s < out.state.size() && s < n_slots; ++s) {
      if (!out.state[s] || !slot_used(group, s)) continue;
      values.push_back(ir::cast(out.state[s], b.dtype));
      destinations.push_back(slots[s]);
    }
  };
  if (flat) {
    const Shape shape{b.numel};
    ir::NodePtr numbers = detail::scalars_tensor(rows[0], cd, b.device);
    std::vector<ir::NodePtr> slots(n_slots);
    for (std::size_t s = 0; s < n_slots; ++s)
      if (b.state[s]) slots[s] = detail::slice_of(b.state[s], 0, shape, b.dtype, b.device);
    emit(detail::slice_of(b.params, 0, shape, b.dtype, b.device),
         detail::slice_of(b.grads, 0, shape, b.dtype, b.device), slots,
         [numbers, shape](int k) { return detail::scalar_view(numbers, k, shape); });
    return;
  }
  // Each parameter with a gradient through its own slices; one row of numbers each.
  std::vector<double> all;
  for (const std::vector<double>& r : rows) all.insert(all.end(), r.begin(), r.end());
  ir::NodePtr numbers = detail::scalars_tensor(all, cd, b.device);
  const std::int64_t width = static_cast<std::int64_t>(rows[0].size());
  for (std::size_t i = 0; i < with_grad.size(); ++i) {
    const detail::Member& m = *with_grad[i];
    const Shape& shape = m.node->shape;
    std::vector<ir::NodePtr> slots(n_slots);
    for (std::size_t s = 0; s < n_slots; ++s)
      if (b.state[s]) slots[s] = detail::slice_of(b.state[s], m.offset, shape, b.dtype, b.device);
    const std::int64_t row = static_cast<std::int64_t>(i) * width;
    emit(m.node, m.node->grad_leaf->grad, slots,
         [numbers, shape, row](int k) { return detail::scalar_view(numbers, row + k, shape); });
  }
}

KILN_ENTRY void Optimizer::step() {
  kiln::detail::before_data_read("optimizer step()", std::source_location::current());
  kiln::detail::SuspendTrace eager;
  NoGradGuard off;
  std::vector<ir::NodePtr> values, destinations;
  std::vector<detail::ParamState*> stepped;
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    check_group_unchanged(gi);
    const ParamGroup& group = groups_[gi];
    for (detail::Bucket& b : buckets_[gi]) {
      ensure_state(b, group);
      std::vector<const detail::Member*> with_grad;
      for (const detail::Member& m : b.members) {
        check_member(gi, b, m);
        const std::shared_ptr<ir::GradLeaf>& leaf = m.node->grad_leaf;
        if (leaf && leaf->grad) with_grad.push_back(&m);
      }
      if (with_grad.empty()) continue;
      std::vector<std::vector<double>> rows;
      for (const detail::Member* m : with_grad) {
        detail::ParamState& ps = state_[gi][m->index];
        if (counts_steps()) ps.step += 1;
        rows.push_back(scalars(group, ps));
        stepped.push_back(&ps);
      }
      build_bucket_update(group, b, with_grad, rows, values, destinations);
    }
  }
  kiln::detail::evaluate_into_many(values, destinations);
  for (detail::ParamState* ps : stepped) ps->initialized = true;
}

KILN_ENTRY void Optimizer::zero_grad(bool set_to_none) {
  NoGradGuard off;
  std::vector<ir::NodePtr> realized;
  for (ParamGroup& g : groups_)
    for (Tensor& p : g.params) {
      const std::shared_ptr<ir::GradLeaf>& leaf = p.node()->grad_leaf;
      if (!leaf || !leaf->grad) continue;
      if (set_to_none) {
        leaf->grad.reset();
      } else if (leaf->grad->realized() && !kiln::detail::deferring_eval()) {
        realized.push_back(leaf->grad);
      } else {
        leaf->grad = ir::constant(0.0, leaf->grad->dtype, leaf->grad->shape, leaf->grad->device);
      }
    }
  if (realized.empty()) return;
  kiln::detail::before_data_read("zero_grad()", std::source_location::current());
  std::vector<ir::NodePtr> dests = detail::coalesce(realized), zeros;
  for (const ir::NodePtr& d : dests) zeros.push_back(ir::constant(0.0, d->dtype, d->shape, d->device));
  kiln::detail::evaluate_into_many(zeros, dests);
}

KILN_ENTRY void Optimizer::add_param_group(ParamGroup group) {
  check_options(group);
  if (group.params.empty()) throw ValueError(std::string(name()) + ": optimizer got an empty parameter list");
  for (std::size_t i = 0; i < group.params.size(); ++i) {
    const Tensor& p = group.params[i];
    const std::string what = std::string(name()) + ": parameter " + std::to_string(i) + " " + p.describe();
    if (!p.defined()) throw ValueError(what + " is undefined");
    if (!is_floating(p.dtype())) throw DTypeError(what + ": only tensors of floating point dtype can be optimized");
    if (!p.requires_grad()) throw ValueError(what + " does not require grad (call requires_grad_() first)");
    if (!p.is_leaf()) throw ValueError(what + ": can't optimize a non-leaf Tensor (it is computed from others)");
    for (std::size_t j = 0; j < i; ++j)
      if (group.params[j].node() == p.node())
        throw ValueError(what + " appears twice in the parameter group (at " + std::to_string(j) + " and " +
                         std::to_string(i) + ")");
    for (std::size_t g = 0; g < groups_.size(); ++g)
      for (const Tensor& q : groups_[g].params)
        if (q.node() == p.node())
          throw ValueError(what + " is already in parameter group " + std::to_string(g) +
                           " (some parameters appear in more than one parameter group)");
  }
  kiln::detail::before_data_read("add_param_group()", std::source_location::current());
  kiln::detail::SuspendTrace eager;
  NoGradGuard off;
  std::vector<ir::NodePtr> lazy;
  for (const Tensor& p : group.params) lazy.push_back(p.node());
  kiln::detail::evaluate(lazy);
  groups_.push_back(std::move(group));
  state_.emplace_back(groups_.back().params.size());
  buckets_.push_back(make_buckets(groups_.back()));
}

KILN_ENTRY nn::StateDict Optimizer::state_dict() const {
  nn::StateDict out;
  std::int64_t index = 0;
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    const ParamGroup& group = groups_[gi];
    std::vector<const detail::Member*> member_of(group.params.size());
    for (const detail::Bucket& b : buckets_[gi])
      for (const detail::Member& m : b.members) member_of[m.index] = &m;
    for (std::size_t pi = 0; pi < group.params.size(); ++pi, ++index) {
      const detail::ParamState& ps = state_[gi][pi];
      if (!ps.initialized) continue;
      const std::string prefix = "state." + std::to_string(index) + ".";
      if (counts_steps()) out.insert(prefix + "step", from_vector<std::int64_t>({ps.step}, Shape{}));
      const detail::Member& m = *member_of[pi];
      const detail::Bucket& b = bucket_of(gi, pi);
      const std::vector<std::string> names = slot_names();
      for (std::size_t s = 0; s < names.size(); ++s) {
        if (!slot_used(group, s) || !b.state[s]) continue;
        out.insert(prefix + names[s], Tensor(detail::slice_of(b.state[s], m.offset, m.node->shape, b.dtype, b.device)));
      }
    }
  }
  std::int64_t first = 0;
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    const ParamGroup& group = groups_[gi];
    const std::string prefix = "param_groups." + std::to_string(gi) + ".";
    std::vector<std::int64_t> ids;
    for (std::size_t pi = 0; pi < group.params.size(); ++pi) ids.push_back(first + static_cast<std::int64_t>(pi));
    first += static_cast<std::int64_t>(group.params.size());
    out.insert(prefix + "params", from_vector<std::int64_t>(ids, Shape{static_cast<std::int64_t>(ids.size())}));
    for (const Field& f : fields()) {
      if (f.real) out.insert(prefix + f.name, from_vector<double>({group.*f.real}, Shape{}));
      if (f.flag) out.insert(prefix + f.name, from_vector<std::int64_t>({group.*f.flag ? 1 : 0}, Shape{}));
      if (f.pair)
        out.insert(prefix + f.name, from_vector<double>({(group.*f.pair).first, (group.*f.pair).second}, Shape{2}));
    }
    if (group.initial_lr) out.insert(prefix + "initial_lr", from_vector<double>({*group.initial_lr}, Shape{}));
  }
  return out;
}

KILN_ENTRY void Optimizer::load_state_dict(const nn::StateDict& dict) {
  const std::vector<std::string> names = slot_names();
  std::vector<std::string> missing, unexpected, misshaped;
  std::int64_t total = 0;
  std::vector<std::pair<std::size_t, std::size_t>> where;  // global index -> (group, param)
  for (std::size_t gi = 0; gi < groups_.size(); ++gi)
    for (std::size_t pi = 0; pi < groups_[gi].params.size(); ++pi, ++total) where.emplace_back(gi, pi);
  auto shape_check = [&](const std::string& key, const Shape& want) {
    const Tensor* t = dict.find(key);
    if (!t) {
      missing.push_back(key);
      return false;
    }
    if (!t->defined() || t->shape() != want) {
      misshaped.push_back(key + " (expected " + want.str() + ", got " +
                          (t->defined() ? t->shape().str() : "undefined") + ")");
      return false;
    }
    return true;
  };
  // The groups' keys.
  std::vector<ParamGroup> loaded = groups_;
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    const std::string prefix = "param_groups." + std::to_string(gi) + ".";
    shape_check(prefix + "params", Shape{static_cast<std::int64_t>(groups_[gi].params.size())});
    for (const Field& f : fields()) {
      const std::string key = prefix + f.name;
      if (!shape_check(key, f.pair ? Shape{2} : Shape{})) continue;
      const Tensor& t = dict.at(key);
      if (f.real) loaded[gi].*f.real = t.to_vector<double>()[0];
      if (f.flag) loaded[gi].*f.flag = t.to_vector<double>()[0] != 0;
      if (f.pair) {
        std::vector<double> v = t.to_vector<double>();
        loaded[gi].*f.pair = {v[0], v[1]};
      }
    }
    if (const Tensor* t = dict.find(prefix + "initial_lr")) {
      if (t->defined() && t->shape() == Shape{})
        loaded[gi].initial_lr = t->to_vector<double>()[0];
      else
        misshaped.push_back(prefix + "initial_lr (expected [], got " +
                            (t->defined() ? t->shape().str() : std::string("undefined")) + ")");
    }
  }
  // Which parameters have state, and the keys nobody asked for.
  std::set<std::int64_t> with_state;
  for (const auto& [key, t] : dict) {
    (void)t;
    if (key.rfind("state.", 0) == 0) {
      const std::size_t dot = key.find('.', 6);
      std::int64_t i = -1;
      bool ok = dot != std::string::npos && dot > 6;
      for (std::size_t c = 6; ok && c < dot; ++c) ok = key[c] >= '0' && key[c] <= '9';
      if (ok) i = std::stoll(key.substr(6, dot - 6));
      const std::string slot = ok ? key.substr(dot + 1) : "";
      const bool known =
          (slot == "step" && counts_steps()) || std::find(names.begin(), names.end(), slot) != names.end();
      if (!ok || i >= total || !known) {
        unexpected.push_back(key);
        continue;
      }
      with_state.insert(i);
      continue;
    }
    if (key.rfind("param_groups.", 0) == 0) {
      const std::size_t dot = key.find('.', 13);
      bool ok = dot != std::string::npos && dot > 13;
      for (std::size_t c = 13; ok && c < dot; ++c) ok = key[c] >= '0' && key[c] <= '9';
      std::int64_t g = ok ? std::stoll(key.substr(13, dot - 13)) : -1;
      const std::string field = ok ? key.substr(dot + 1) : "";
      bool known = field == "params" || field == "initial_lr";
      for (const Field& f : fields()) known = known || field == f.name;
      if (!ok || g >= static_cast<std::int64_t>(groups_.size()) || !known) unexpected.push_back(key);
      continue;
    }
    unexpected.push_back(key);
  }
  for (std::int64_t i : with_state) {
    const auto [gi, pi] = where[static_cast<std::size_t>(i)];
    const Shape& shape = groups_[gi].params[pi].shape();
    const std::string prefix = "state." + std::to_string(i) + ".";
    if (counts_steps()) shape_check(prefix + "step", Shape{});
    for (std::size_t s = 0; s < names.size(); ++s) {
      const std::string key = prefix + names[s];
      if (slot_required(s) || dict.contains(key)) shape_check(key, shape);
    }
  }
  if (!missing.empty() || !unexpected.empty() || !misshaped.empty()) {
    auto list = [](const std::vector<std::string>& v) {
      std::string s;
      for (const std::string& k : v) s += (s.empty() ? "" : ", ") + k;
      return s;
    };
    std::string msg = std::string(name()) + ".load_state_dict: the state does not match this optimizer";
    if (!missing.empty()) msg += "; missing keys: " + list(missing);
    if (!unexpected.empty()) msg += "; unexpected keys: " + list(unexpected);
    if (!misshaped.empty()) msg += "; mis-shaped keys: " + list(misshaped);
    throw ValueError(msg);
  }
  for (const ParamGroup& g : loaded) check_options(g);
  // Everything checked: apply.
  kiln::detail::before_data_read("load_state_dict()", std::source_location::current());
  kiln::detail::SuspendTrace eager;
  NoGradGuard off;
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    std::vector<Tensor> params = std::move(groups_[gi].params);
    groups_[gi] = loaded[gi];
    groups_[gi].params = std::move(params);
  }
  for (std::size_t gi = 0; gi < groups_.size(); ++gi)
    for (detail::Bucket& b : buckets_[gi]) {
      std::vector<bool> loaded_slots(names.size(), false);  // slots the dict holds for a member
      for (const detail::Member& m : b.members)
        for (std::size_t s = 0; s < names.size(); ++s)
          loaded_slots[s] =
              loaded_slots[s] || dict.contains("state." + std::to_string(first_index(gi) + m.index) + "." + names[s]);
      ensure_state(b, groups_[gi], loaded_slots);
    }
  std::vector<ir::NodePtr> values, destinations;
  for (std::int64_t i = 0; i < total; ++i) {
    const auto [gi, pi] = where[static_cast<std::size_t>(i)];
    detail::Bucket& b = bucket_of(gi, pi);
    const detail::Member& m = member(gi, pi);
    detail::ParamState& ps = state_[gi][pi];
    const std::string prefix = "state." + std::to_string(i) + ".";
    const bool present = with_state.count(i) != 0;
    ps.initialized = present;
    ps.step = present && counts_steps() ? std::llround(dict.at(prefix + "step").to_vector<double>()[0]) : 0;
    for (std::size_t s = 0; s < names.size(); ++s) {
      if (!b.state[s]) continue;
      ir::NodePtr dest = detail::slice_of(b.state[s], m.offset, m.node->shape, b.dtype, b.device);
      const Tensor* t = present ? dict.find(prefix + names[s]) : nullptr;
      ir::NodePtr value =
          t ? ir::cast(t->to(b.device).node(), b.dtype) : ir::constant(0.0, b.dtype, dest->shape, b.device);
      values.push_back(value);
      destinations.push_back(dest);
    }
  }
  kiln::detail::evaluate_into_many(values, destinations);
}

KILN_ENTRY std::vector<detail::Bucket> Optimizer::make_buckets(const ParamGroup& group) {
  std::vector<detail::Bucket> buckets;
  for (std::size_t i = 0; i < group.params.size(); ++i) {
    const ir::NodePtr& node = group.params[i].node();
    detail::Bucket* b = nullptr;
    for (detail::Bucket& c : buckets)
      if (c.dtype == node->dtype && c.device == node->device) b = &c;
    if (!b) {
      buckets.emplace_back();
      b = &buckets.back();
      b->dtype = node->dtype;
      b->device = node->device;
      b->state.resize(slot_names().size());
    }
    b->members.push_back(detail::Member{i, node, b->numel});
    b->numel += node->numel();
  }
  for (detail::Bucket& b : buckets) {
    b.params = detail::allocate_elements(std::max<std::int64_t>(b.numel, 1), b.dtype, b.device, "optimizer");
    b.grads = detail::allocate_elements(std::max<std::int64_t>(b.numel, 1), b.dtype, b.device, "optimizer");
    // The values into the flat buffer, then each parameter node onto its slice; gradients
    // evaluated already move to their homes.
    std::vector<ir::NodePtr> values, destinations;
    std::vector<std::pair<ir::GradLeaf*, ir::NodePtr>> homed;
    for (const detail::Member& m : b.members) {
      values.push_back(m.node);
      destinations.push_back(detail::slice_of(b.params, m.offset, m.node->shape, b.dtype, b.device));
      ir::GradLeaf& leaf = *m.node->grad_leaf;
      if (leaf.grad && leaf.grad->realized()) {
        ir::NodePtr home = detail::slice_of(b.grads, m.offset, m.node->shape, b.dtype, b.device);
        values.push_back(ir::cast(leaf.grad, b.dtype));
        destinations.push_back(home);
        homed.emplace_back(&leaf, home);
      }
    }
    kiln::detail::evaluate_into_many(values, destinations);
    for (const detail::Member& m : b.members) {
      ir::Node& n = *m.node;
      n.buffer = ir::BufferView{b.params, m.offset, contiguous_strides(n.shape)};
      if (n.op == ir::Op::Input) n.hash = kiln::detail::hash_combine(n.local_hash, ir::leaf_hash(n));
      n.grad_leaf->home = ir::BufferView{b.grads, m.offset, contiguous_strides(n.shape)};
    }
    for (auto& [leaf, home] : homed) leaf->grad = home;
  }
  return buckets;
}

KILN_ENTRY void Optimizer::ensure_state(detail::Bucket& b, const ParamGroup& group, const std::vector<bool>& also) {
  std::vector<ir::NodePtr> zeros, flats;
  for (std::size_t s = 0; s < b.state.size(); ++s) {
    if (b.state[s] || !(slot_used(group, s) || (s < also.size() && also[s]))) continue;
    b.state[s] = detail::allocate_elements(std::max<std::int64_t>(b.numel, 1), b.dtype, b.device, "optimizer state");
    flats.push_back(detail::slice_of(b.state[s], 0, Shape{b.numel}, b.dtype, b.device));
    zeros.push_back(ir::constant(0.0, b.dtype, Shape{b.numel}, b.device));
  }
  kiln::detail::evaluate_into_many(zeros, flats);
}

KILN_ENTRY void Optimizer::check_group_unchanged(std::size_t gi) const {
  std::size_t count = 0;
  for (const detail::Bucket& b : buckets_[gi]) count += b.members.size();
  const std::vector<Tensor>& params = groups_[gi].params;
  bool same = params.size() == count;
  for (const detail::Bucket& b : buckets_[gi])
    for (const detail::Member& m : b.members)
      same = same && params[m.index].defined() && params[m.index].node() == m.node;
  if (!same)
    throw ValueError(std::string(name()) + ".step: the parameters of group " + std::to_string(gi) +
                     " were changed in param_groups(); add parameters with add_param_group");
}

KILN_ENTRY void Optimizer::check_member(std::size_t gi, const detail::Bucket& b, const detail::Member& m) const {
  const ir::Node& n = *m.node;
  if (n.dtype != b.dtype || !(n.device == b.device) || !n.realized() || !n.grad_leaf)
    throw ValueError(std::string(name()) + ".step: parameter " + std::to_string(m.index) + " of group " +
                     std::to_string(gi) + " was " + dtype_name(b.dtype) + " on " + b.device.str() +
                     " when the optimizer was made and is now " + dtype_name(n.dtype) + " on " + n.device.str() +
                     (n.realized() ? "" : " (not evaluated)") +
                     " (make the optimizer after moving or casting the model)");
}

KILN_ENTRY bool Optimizer::at_home(const detail::Bucket& b, const detail::Member& m) {
  const ir::BufferView& v = *m.node->buffer;
  return v.storage == b.params && v.offset == m.offset && kiln::is_contiguous(m.node->shape, v.strides);
}

KILN_ENTRY bool Optimizer::grad_at_home(const detail::Bucket& b, const detail::Member& m) {
  const ir::NodePtr& g = m.node->grad_leaf->grad;
  if (!g || !g->realized() || g->dtype != b.dtype) return false;
  const ir::BufferView& v = *g->buffer;
  return v.storage == b.grads && v.offset == m.offset && kiln::is_contiguous(g->shape, v.strides);
}

KILN_ENTRY std::size_t Optimizer::first_index(std::size_t gi) const {
  std::size_t n = 0;
  for (std::size_t g = 0; g < gi; ++g) n += groups_[g].params.size();
  return n;
}

KILN_ENTRY const detail::Member& Optimizer::member(std::size_t gi, std::size_t pi) const {
  for (const detail::Bucket& b : buckets_[gi])
    for (const detail::Member& m : b.members)
      if (m.index == pi) return m;
  throw InternalError("optimizer: no bucket holds the parameter");
}

KILN_ENTRY detail::Bucket& Optimizer::bucket_of(std::size_t gi, std::size_t pi) {
  for (detail::Bucket& b : buckets_[gi])
    for (const detail::Member& m : b.members)
      if (m.index == pi) return b;
  throw InternalError("optimizer: no bucket holds the parameter");
}

}  // namespace kiln::optim
