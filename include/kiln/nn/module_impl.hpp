#pragma once
// The out-of-class definitions of nn::Module and nn::CompiledModule (nn/module.hpp). Header-only
// mode includes them from module.hpp (KILN_ENTRY is `inline`); compiled mode compiles them once
// into kiln::kiln_compiled (src/kiln_compiled.cpp), so a user's translation unit parses the
// declarations only.
#include "kiln/nn/module.hpp"

namespace kiln::nn {

KILN_ENTRY Tensor Module::forward(const Tensor& input) {
  throw ValueError(name() +
                   ": forward(Tensor) is not implemented (override it, or call the module's own forward with "
                   "its arguments); input " +
                   input.describe());
}

KILN_ENTRY void Module::check_name(const std::string& name, const char* op) const {
  if (name.empty() || name.find('.') != std::string::npos)
    throw ValueError(std::string(op) + ": name '" + name + "' must be non-empty and contain no '.'");
  auto taken = [&](const auto& list) {
    for (const auto& e : list)
      if (e.name == name) return true;
    return false;
  };
  if (taken(parameters_) || taken(buffers_) || taken(modules_))
    throw ValueError(std::string(op) + ": '" + name + "' is already registered in " + this->name());
}

KILN_ENTRY Tensor& Module::add_tensor(std::vector<TensorEntry>& list, const std::string& name,
                                      detail::Slot<Tensor> slot, bool persistent) {
  list.push_back({name, std::move(slot), persistent});
  return *resolve(list.back().slot);
}

KILN_ENTRY Tensor& Module::register_parameter(const std::string& name, Tensor& tensor, bool requires_grad) {
  check_name(name, "register_parameter");
  if (tensor.defined()) {
    tensor.eval();
    if (requires_grad) tensor.requires_grad_();
  }
  return add_tensor(parameters_, name, detail::Slot<Tensor>{offset_of(&tensor), nullptr}, true);
}

KILN_ENTRY Tensor& Module::register_parameter(const std::string& name, Tensor&& tensor, bool requires_grad) {
  check_name(name, "register_parameter");
  auto owned = std::make_shared<Tensor>(std::move(tensor));
  if (owned->defined()) {
    owned->eval();
    if (requires_grad) owned->requires_grad_();
  }
  return add_tensor(parameters_, name, detail::Slot<Tensor>{0, std::move(owned)}, true);
}

KILN_ENTRY Tensor& Module::register_buffer(const std::string& name, Tensor& tensor, bool persistent) {
  check_name(name, "register_buffer");
  if (tensor.defined()) tensor.eval();
  return add_tensor(buffers_, name, detail::Slot<Tensor>{offset_of(&tensor), nullptr}, persistent);
}

KILN_ENTRY Tensor& Module::register_buffer(const std::string& name, Tensor&& tensor, bool persistent) {
  check_name(name, "register_buffer");
  auto owned = std::make_shared<Tensor>(std::move(tensor));
  if (owned->defined()) owned->eval();
  return add_tensor(buffers_, name, detail::Slot<Tensor>{0, std::move(owned)}, persistent);
}

KILN_ENTRY void Module::collect(const std::string& prefix, bool recurse, bool want_parameters, bool persistent_only,
                                StateDict& out) const {
  for (const TensorEntry& e : want_parameters ? parameters_ : buffers_) {
    const Tensor& t = *resolve(e.slot);
    if (!t.defined() || (persistent_only && !e.persistent)) continue;
    // A tensor registered twice (a tied weight) is listed once, under its first name.
    bool seen = false;
    for (const auto& [k, v] : out) seen = seen || v.node() == t.node();
    if (!seen) out.insert(prefix + e.name, t);
  }
  if (!recurse) return;
  for (const ModuleEntry& m : modules_)
    resolve(m.slot)->collect(prefix + m.name + ".", true, want_parameters, persistent_only, out);
}

KILN_ENTRY StateDict Module::named_parameters(bool recurse) const {
  StateDict out;
  collect("", recurse, true, false, out);
  return out;
}

KILN_ENTRY std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (const auto& [k, v] : named_parameters(recurse)) out.push_back(v);
  return out;
}

KILN_ENTRY StateDict Module::named_buffers(bool recurse) const {
  StateDict out;
  collect("", recurse, false, false, out);
  return out;
}

KILN_ENTRY std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (const auto& [k, v] : named_buffers(recurse)) out.push_back(v);
  return out;
}

KILN_ENTRY std::vector<Module*> Module::children() const {
  std::vector<Module*> out;
  for (auto& [k, m] : named_children()) out.push_back(m);
  return out;
}

KILN_ENTRY std::vector<std::pair<std::string, Module*>> Module::named_children() const {
  // A module registered under two names (shared) is listed once, under the first, as torch.
  std::vector<std::pair<std::string, Module*>> out;
  for (const ModuleEntry& m : modules_) {
    Module* child = resolve(m.slot);
    bool seen = false;
    for (const auto& [k, c] : out) seen = seen || c == child;
    if (!seen) out.emplace_back(m.name, child);
  }
  return out;
}

KILN_ENTRY std::vector<std::pair<std::string, Module*>> Module::named_modules(const std::string& prefix) {
  // Depth first, each module once under the first name that reaches it (torch's
  // remove_duplicate): a shared submodule is not listed, or visited, twice.
  std::vector<std::pair<std::string, Module*>> out;
  struct Walk {
    static void run(Module* m, const std::string& name, std::vector<std::pair<std::string, Module*>>& out) {
      for (const auto& [k, seen] : out)
        if (seen == m) return;
      out.emplace_back(name, m);
      for (const ModuleEntry& c : m->modules_) run(m->resolve(c.slot), name.empty() ? c.name : name + "." + c.name, out);
    }
  };
  Walk::run(this, prefix, out);
  return out;
}

KILN_ENTRY std::vector<Module*> Module::modules() {
  std::vector<Module*> out;
  for (auto& [k, m] : named_modules()) out.push_back(m);
  return out;
}

KILN_ENTRY std::vector<std::pair<std::string, Tensor*>> Module::all_tensors(const std::string& prefix) {
  std::vector<std::pair<std::string, Tensor*>> out;
  for (TensorEntry& e : parameters_) out.emplace_back(prefix + e.name, resolve(e.slot));
  for (TensorEntry& e : buffers_) out.emplace_back(prefix + e.name, resolve(e.slot));
  for (ModuleEntry& m : modules_)
    for (auto& t : resolve(m.slot)->all_tensors(prefix + m.name + ".")) out.push_back(std::move(t));
  return out;
}

KILN_ENTRY Module& Module::train(bool on) {
  for (Module* m : modules()) m->training_ = on;
  return *this;
}

namespace detail {
/// Moves or casts every distinct tensor of `tensors` (and its gradient) with `convert`, in place.
template <class F>
void convert_tensors(const std::vector<std::pair<std::string, Tensor*>>& tensors, F convert) {
  std::vector<const ir::Node*> done;
  NoGradGuard off;
  for (const auto& [name, t] : tensors) {
    if (!t->defined()) continue;
    const ir::NodePtr& node = t->node();
    bool seen = false;
    for (const ir::Node* d : done) seen = seen || d == node.get();
    if (seen) continue;
    done.push_back(node.get());
    Tensor plain = t->detach();
    Tensor moved = convert(plain);
    if (moved.node() == plain.node()) continue;  // already there
    moved.eval();
    if (node->grad_leaf && node->grad_leaf->grad) {
      Tensor g(node->grad_leaf->grad);
      node->grad_leaf->grad = convert(g).eval().node();
    }
    replace_in_place(node, moved);
  }
}
}  // namespace detail

KILN_ENTRY Module& Module::to(Device device) {
  drop_compiled();
  detail::convert_tensors(all_tensors(), [&](const Tensor& t) { return t.device() == device ? t : t.to(device); });
  return *this;
}

KILN_ENTRY Module& Module::to(DType dtype) {
  if (!is_floating(dtype))
    throw DTypeError(std::string("Module::to: parameters can only be cast to a floating dtype, not ") +
                     dtype_name(dtype));
  drop_compiled();
  detail::convert_tensors(
      all_tensors(), [&](const Tensor& t) { return !is_floating(t.dtype()) || t.dtype() == dtype ? t : t.to(dtype); });
  return *this;
}

KILN_ENTRY void Module::zero_grad(bool set_to_none) {
  for (Tensor& p : parameters()) {
    if (!p.node()->grad_leaf) continue;
    if (set_to_none)
      p.node()->grad_leaf->grad.reset();
    else
      p.zero_grad_();
  }
}

KILN_ENTRY StateDict Module::state_dict() const {
  StateDict out;
  // PyTorch's order: each module's parameters, then its buffers, then its children's.
  struct Walk {
    static void run(const Module& m, const std::string& prefix, StateDict& out) {
      for (const TensorEntry& e : m.parameters_) {
        const Tensor& t = *m.resolve(e.slot);
        if (t.defined() && !out.contains(prefix + e.name)) out.insert(prefix + e.name, t.detach());
      }
      for (const TensorEntry& e : m.buffers_) {
        const Tensor& t = *m.resolve(e.slot);
        if (t.defined() && e.persistent) out.insert(prefix + e.name, t.detach());
      }
      for (const ModuleEntry& c : m.modules_) run(*m.resolve(c.slot), prefix + c.name + ".", out);
    }
  };
  Walk::run(*this, "", out);
  return out;
}

KILN_ENTRY void Module::load_state_dict(const StateDict& state, bool strict) {
  const StateDict mine = state_dict();
  std::vector<std::string> missing, unexpected, mismatched;
  for (const auto& [k, v] : mine)
    if (!state.contains(k)) missing.push_back(k);
  for (const auto& [k, v] : state) {
    const Tensor* t = mine.find(k);
    if (!t) {
      unexpected.push_back(k);
      continue;
    }
    if (!v.defined() || v.shape() != t->shape())
      mismatched.push_back(k + " (checkpoint " + (v.defined() ? v.describe() : std::string("undefined")) + ", model " +
                           t->describe() + ")");
  }
  auto join = [](const std::vector<std::string>& xs) {
    std::string s;
    for (const std::string& x : xs) s += (s.empty() ? "" : ", ") + x;
    return s;
  };
  std::string why;
  if (strict && !missing.empty()) why += " missing keys: " + join(missing) + ";";
  if (strict && !unexpected.empty()) why += " unexpected keys: " + join(unexpected) + ";";
  if (!mismatched.empty()) why += " mis-shaped: " + join(mismatched) + ";";
  if (!why.empty()) throw ValueError("load_state_dict: error(s) loading state into " + name() + ":" + why);
  NoGradGuard off;
  for (const auto& [k, v] : state) {
    const Tensor* t = mine.find(k);
    if (!t) continue;
    Tensor dest = *t;
    Tensor value = v.device() == dest.device() ? v : v.to(dest.device());
    dest.assign(value);
  }
}

KILN_ENTRY void Module::copy_compiled(const Module& other) {
  if (other.compiled_) compile(other.compiled_->options());
}

KILN_ENTRY void Module::compile(CompileOptions options) {
  compiled_ = std::make_shared<CompiledModule>(*this, std::move(options));
}

KILN_ENTRY Tensor Module::operator()(const Tensor& input) { return compiled_ ? (*compiled_)(input) : forward(input); }

KILN_ENTRY CompileStats Module::compile_stats() const { return compiled_ ? compiled_->stats() : CompileStats{}; }

KILN_ENTRY std::string Module::explain(const Tensor& input) {
  if (!compiled_) compile();
  return compiled_->explain(input);
}

KILN_ENTRY CompiledModule::Forward& CompiledModule::for_current_modes() {
  if (module_->layout_version_ != layout_version_) {  // the parameters moved: trace anew
    entries_.clear();
    layout_version_ = module_->layout_version_;
  }
  std::vector<bool> modes;
  for (Module* m : module_->modules()) modes.push_back(m->training_);
  for (auto& [k, c] : entries_)
    if (k == modes) return *c;
  // The traced forward reads the dropout key from its second argument (see operator()).
  Module* module = module_;
  auto fn = std::function<Tensor(const Tensor&, const Tensor&)>([module](const Tensor& input, const Tensor& seed) {
    detail::TracedRandomness randomness{seed, 0};
    struct Restore {
      detail::TracedRandomness* saved;
      ~Restore() { detail::traced_randomness = saved; }
    } restore{detail::traced_randomness};
    detail::traced_randomness = &randomness;
    return module->forward(input);
  });
  entries_.emplace_back(modes, std::make_shared<Forward>(std::move(fn), options_));
  return *entries_.back().second;
}

KILN_ENTRY Tensor CompiledModule::operator()(const Tensor& input) {
  Forward& compiled = for_current_modes();
  // A fresh key per call, passed in as an argument: the traced graph reads it, so replays draw
  // new dropout masks without recompiling.
  return compiled(input, Tensor(detail::fresh_key("CompiledModule", input.device())));
}

KILN_ENTRY CompileStats CompiledModule::stats() const {
  CompileStats total;
  for (const auto& [k, c] : entries_) {
    CompileStats s = c->stats();
    total.traces += s.traces;
    total.recompiles += s.recompiles;
    total.graph_breaks += s.graph_breaks;
    total.cache_hits += s.cache_hits;
    total.fallbacks += s.fallbacks;
  }
  return total;
}

KILN_ENTRY std::string CompiledModule::explain(const Tensor& input) {
  Tensor seed = from_vector<std::int64_t>({0}, Shape{}, input.device());
  return kiln::explain(for_current_modes(), input, seed);
}

}  // namespace kiln::nn
