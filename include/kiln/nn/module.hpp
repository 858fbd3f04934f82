#pragma once
// kiln::nn::Module: the base of layers and models, in libtorch's shape. A module registers its
// parameters, buffers and submodules by name; parameters() and state_dict() walk that registry
// depth first in registration order (PyTorch's order and dotted names). Moving or copying a
// module keeps its registry pointing at its own members: an entry for a member is stored as
// its offset from the module, so `Sequential(Linear(4, 8), ReLU())` can move the layers into
// place. Operations that change a parameter (to(), load_state_dict()) change the tensor's
// node in place, so every handle of it (the member, the optimizer's list) sees the change.
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/compile/compile.hpp"
#include "kiln/nn/state_dict.hpp"
#include "kiln/tensor/autograd.hpp"
#include "kiln/tensor/creation.hpp"
#include "kiln/tensor/eval.hpp"

namespace kiln::nn {

class Module;
class CompiledModule;

namespace detail {

/// Where a registered object lives: a member of the module (its byte offset from the
/// module, so copies and moves of the module find their own member) or an object the
/// registry owns.
template <class T>
struct Slot {
  std::ptrdiff_t offset = 0;
  std::shared_ptr<T> owned;
};

/// Replaces the value behind `node` with `value`'s (realized) node, keeping the autograd
/// state: every Tensor handle sharing `node` sees the new storage, dtype or device.
inline void replace_in_place(const ir::NodePtr& node, const Tensor& value) {
  const ir::Node& v = *value.node();
  const bool requires_grad = node->requires_grad;
  std::shared_ptr<ir::GradLeaf> leaf = node->grad_leaf;
  *node = v;
  node->requires_grad = requires_grad;
  node->grad_leaf = std::move(leaf);
}

/// The seed the dropout layers of a compiled module draw from while it is traced (an argument
/// of the compiled function, so each call draws new masks) and how many draws the trace has
/// made; outside such a trace dropout draws from the global generator.
struct TracedRandomness {
  Tensor seed;
  std::int64_t draws = 0;
};
inline thread_local TracedRandomness* traced_randomness = nullptr;

/// A fresh Philox key from the global generator as a 0-dim int64 leaf on `device`: on the CPU a
/// kernel argument in host memory, on a GPU 8 bytes copied there. Either way every key runs the
/// same kernel. `op` names the caller in the error a kiln::compile trace gives (draws there
/// would replay one key).
inline ir::NodePtr fresh_key(const char* op, Device device) {
  const auto key = static_cast<std::int64_t>(kiln::detail::next_generator_key(op) >> 1);
  if (device.is_cpu()) return kiln::detail::number_leaf(key, DType::Int64, Shape{}, device);
  return from_vector<std::int64_t>({key}, Shape{}, device).node();
}

}  // namespace detail

/// The base of every layer and model (torch.nn.Module). A subclass registers what it owns in
/// its constructor and overrides `forward`.
class Module {
 public:
  Module() = default;
  Module(const Module& other) { copy_registry(other); }
  Module(Module&& other) noexcept { copy_registry(other); }
  Module& operator=(const Module& other) {
    if (this != &other) copy_registry(other);
    return *this;
  }
  Module& operator=(Module&& other) noexcept {
    if (this != &other) copy_registry(other);
    return *this;
  }
  virtual ~Module() = default;

  /// The module's computation. Subclasses with one tensor input override it; the base throws.
  virtual Tensor forward(const Tensor& input);

  /// forward(input), through the compiled function when compile() was called.
  Tensor operator()(const Tensor& input);

  /// The class name shown in errors and listings (the subclass's, where it overrides it).
  virtual std::string name() const { return "Module"; }

  // ---- registration ------------------------------------------------------------------------

  /// Registers `tensor` (a member of this module, or any tensor that outlives it) as the
  /// parameter `name`; it is made a leaf that requires grad when `requires_grad`.
  Tensor& register_parameter(const std::string& name, Tensor& tensor, bool requires_grad = true);
  /// Registers a tensor the module keeps itself; returns it (assign it to a member to use it).
  Tensor& register_parameter(const std::string& name, Tensor&& tensor, bool requires_grad = true);
  /// Registers a buffer: state that is saved in state_dict (when `persistent`) and moved by
  /// to(), but gets no gradient and is not a parameter.
  Tensor& register_buffer(const std::string& name, Tensor& tensor, bool persistent = true);
  Tensor& register_buffer(const std::string& name, Tensor&& tensor, bool persistent = true);
  /// Registers the member module `module` as the child `name`.
  template <class M>
  requires std::is_base_of_v<Module, M> M& register_module(const std::string& name, M& module) {
    check_name(name, "register_module");
    modules_.push_back({name, detail::Slot<Module>{offset_of(&module), nullptr}});
    return module;
  }
  /// Registers a module the registry co-owns (libtorch's shared_ptr form).
  template <class M>
  requires std::is_base_of_v<Module, M> std::shared_ptr<M> register_module(const std::string& name,
                                                                           std::shared_ptr<M> module) {
    check_name(name, "register_module");
    if (!module) throw ValueError("register_module: module '" + name + "' is null");
    modules_.push_back({name, detail::Slot<Module>{0, module}});
    return module;
  }

  // ---- walking ----------------------------------------------------------------------------

  /// Every parameter, depth first in registration order (each tensor once).
  std::vector<Tensor> parameters(bool recurse = true) const;
  /// Parameters by dotted name ("block.0.fc.weight"), as PyTorch names them.
  StateDict named_parameters(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  StateDict named_buffers(bool recurse = true) const;
  /// The direct submodules, in registration order.
  std::vector<Module*> children() const;
  std::vector<std::pair<std::string, Module*>> named_children() const;
  /// This module and every submodule, depth first (this one first).
  std::vector<Module*> modules();
  std::vector<std::pair<std::string, Module*>> named_modules(const std::string& prefix = "");

  // ---- state ------------------------------------------------------------------------------

  /// Training mode for this module and every submodule (Dropout drops only in training).
  Module& train(bool on = true);
  /// train(false).
  Module& eval() { return train(false); }
  bool is_training() const { return training_; }

  /// Moves every parameter and buffer (and existing gradients) to `device`, in place.
  Module& to(Device device);
  /// Casts every floating parameter and buffer (and existing gradients) to `dtype`, in place.
  Module& to(DType dtype);
  Module& to(Device device, DType dtype) { return to(device).to(dtype); }

  /// Drops (set_to_none, PyTorch's default) or zeroes the gradient of every parameter.
  void zero_grad(bool set_to_none = true);

  /// Parameters and persistent buffers by dotted name, in PyTorch's order.
  StateDict state_dict() const;
  /// Copies `state` into the parameters and buffers (values, not identity: the module keeps its
  /// tensors, devices and dtypes; values are cast). Every key is checked before anything is
  /// written: with `strict`, a missing or unexpected key is a ValueError naming them all; a
  /// shape mismatch always is.
  void load_state_dict(const StateDict& state, bool strict = true);

  // ---- compilation ------------------------------------------------------------------------

  /// Makes operator() run forward through kiln::compile (torch's `model.compile()`): traced
  /// once per guard (input shape/dtype/device, grad mode, which tensors require grad) and
  /// replayed; parameters are read from their storage at each call, so training updates them
  /// without recompiling. Dropout draws new masks on every call.
  void compile(CompileOptions options = {});
  /// Whether compile() was called (and to()/load have not dropped it since).
  bool is_compiled() const { return compiled_ != nullptr; }
  /// The compiled forward's counters (traces, recompiles, cache hits); zeros if not compiled.
  CompileStats compile_stats() const;
  /// kiln::explain of the compiled forward at `input` (its graph breaks and kernels).
  std::string explain(const Tensor& input);

 protected:
  bool training_ = true;

 private:
  struct TensorEntry {
    std::string name;
    detail::Slot<Tensor> slot;
    bool persistent = true;
  };
  struct ModuleEntry {
    std::string name;
    detail::Slot<Module> slot;
  };

  std::ptrdiff_t offset_of(const void* member) const {
    return reinterpret_cast<const char*>(member) - reinterpret_cast<const char*>(this);
  }
  template <class T>
  T* resolve(const detail::Slot<T>& s) const {
    if (s.owned) return s.owned.get();
    return reinterpret_cast<T*>(const_cast<char*>(reinterpret_cast<const char*>(this) + s.offset));
  }
  void copy_registry(const Module& other) {
    training_ = other.training_;
    parameters_ = other.parameters_;
    buffers_ = other.buffers_;
    modules_ = other.modules_;
    compiled_.reset();
    copy_compiled(other);
  }
  /// A copy of a compiled module is compiled with the same options (for itself: a compiled
  /// forward calls the module it was made for).
  void copy_compiled(const Module& other);
  void check_name(const std::string& name, const char* op) const;
  Tensor& add_tensor(std::vector<TensorEntry>& list, const std::string& name, detail::Slot<Tensor> slot,
                     bool persistent);
  void collect(const std::string& prefix, bool recurse, bool want_parameters, bool persistent_only,
               StateDict& out) const;
  /// Every parameter and buffer handle of this module tree, with its dotted name.
  std::vector<std::pair<std::string, Tensor*>> all_tensors(const std::string& prefix = "");
  /// Counts changes that invalidate traces of this tree (to() moving or casting parameters).
  void drop_compiled() {
    for (Module* m : modules()) ++m->layout_version_;
  }
  friend class CompiledModule;

  std::vector<TensorEntry> parameters_;
  std::vector<TensorEntry> buffers_;
  std::vector<ModuleEntry> modules_;
  std::uint64_t layout_version_ = 0;
  std::shared_ptr<CompiledModule> compiled_;
};

/// A module's forward compiled (what `model.compile()` installs and `kiln::compile(model)`
/// returns): one kiln::compile entry set per train/eval modes of the tree, the dropout key an
/// argument drawn afresh each call, the traces dropped when to() moves the parameters. Holds
/// the module by reference: it must outlive this.
class CompiledModule {
 public:
  CompiledModule(Module& module, CompileOptions options) : module_(&module), options_(std::move(options)) {}
  /// module.forward(input), compiled.
  Tensor operator()(const Tensor& input);
  /// The counters summed over the mode sets' entries.
  CompileStats stats() const;
  /// kiln::explain at `input` for the current modes.
  std::string explain(const Tensor& input);
  const CompileOptions& options() const { return options_; }
  Module& module() const { return *module_; }

 private:
  using Forward = Compiled<std::function<Tensor(const Tensor&, const Tensor&)>>;
  /// The compiled forward for the tree's current train/eval modes (a mode is part of what a
  /// trace bakes in, as torch.compile guards on it).
  Forward& for_current_modes();

  Module* module_;
  CompileOptions options_;
  std::uint64_t layout_version_ = 0;
  std::vector<std::pair<std::vector<bool>, std::shared_ptr<Forward>>> entries_;
};

// ---- definitions ----------------------------------------------------------------------------

inline Tensor Module::forward(const Tensor& input) {
  throw ValueError(name() + ": forward(Tensor) is not implemented (override it, or call the module's own forward with "
                            "its arguments); input " +
                   input.describe());
}

inline void Module::check_name(const std::string& name, const char* op) const {
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

inline Tensor& Module::add_tensor(std::vector<TensorEntry>& list, const std::string& name, detail::Slot<Tensor> slot,
                                  bool persistent) {
  list.push_back({name, std::move(slot), persistent});
  return *resolve(list.back().slot);
}

inline Tensor& Module::register_parameter(const std::string& name, Tensor& tensor, bool requires_grad) {
  check_name(name, "register_parameter");
  if (tensor.defined()) {
    tensor.eval();
    if (requires_grad) tensor.requires_grad_();
  }
  return add_tensor(parameters_, name, detail::Slot<Tensor>{offset_of(&tensor), nullptr}, true);
}

inline Tensor& Module::register_parameter(const std::string& name, Tensor&& tensor, bool requires_grad) {
  check_name(name, "register_parameter");
  auto owned = std::make_shared<Tensor>(std::move(tensor));
  if (owned->defined()) {
    owned->eval();
    if (requires_grad) owned->requires_grad_();
  }
  return add_tensor(parameters_, name, detail::Slot<Tensor>{0, std::move(owned)}, true);
}

inline Tensor& Module::register_buffer(const std::string& name, Tensor& tensor, bool persistent) {
  check_name(name, "register_buffer");
  if (tensor.defined()) tensor.eval();
  return add_tensor(buffers_, name, detail::Slot<Tensor>{offset_of(&tensor), nullptr}, persistent);
}

inline Tensor& Module::register_buffer(const std::string& name, Tensor&& tensor, bool persistent) {
  check_name(name, "register_buffer");
  auto owned = std::make_shared<Tensor>(std::move(tensor));
  if (owned->defined()) owned->eval();
  return add_tensor(buffers_, name, detail::Slot<Tensor>{0, std::move(owned)}, persistent);
}

inline void Module::collect(const std::string& prefix, bool recurse, bool want_parameters, bool persistent_only,
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
  for (const ModuleEntry& m : modules_) resolve(m.slot)->collect(prefix + m.name + ".", true, want_parameters,
                                                                   persistent_only, out);
}

inline StateDict Module::named_parameters(bool recurse) const {
  StateDict out;
  collect("", recurse, true, false, out);
  return out;
}

inline std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (const auto& [k, v] : named_parameters(recurse)) out.push_back(v);
  return out;
}

inline StateDict Module::named_buffers(bool recurse) const {
  StateDict out;
  collect("", recurse, false, false, out);
  return out;
}

inline std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (const auto& [k, v] : named_buffers(recurse)) out.push_back(v);
  return out;
}

inline std::vector<Module*> Module::children() const {
  std::vector<Module*> out;
  for (const ModuleEntry& m : modules_) out.push_back(resolve(m.slot));
  return out;
}

inline std::vector<std::pair<std::string, Module*>> Module::named_children() const {
  std::vector<std::pair<std::string, Module*>> out;
  for (const ModuleEntry& m : modules_) out.emplace_back(m.name, resolve(m.slot));
  return out;
}

inline std::vector<std::pair<std::string, Module*>> Module::named_modules(const std::string& prefix) {
  std::vector<std::pair<std::string, Module*>> out{{prefix, this}};
  for (const ModuleEntry& m : modules_)
    for (auto& sub : resolve(m.slot)->named_modules(prefix.empty() ? m.name : prefix + "." + m.name))
      out.push_back(std::move(sub));
  return out;
}

inline std::vector<Module*> Module::modules() {
  std::vector<Module*> out;
  for (auto& [k, m] : named_modules()) out.push_back(m);
  return out;
}

inline std::vector<std::pair<std::string, Tensor*>> Module::all_tensors(const std::string& prefix) {
  std::vector<std::pair<std::string, Tensor*>> out;
  for (TensorEntry& e : parameters_) out.emplace_back(prefix + e.name, resolve(e.slot));
  for (TensorEntry& e : buffers_) out.emplace_back(prefix + e.name, resolve(e.slot));
  for (ModuleEntry& m : modules_)
    for (auto& t : resolve(m.slot)->all_tensors(prefix + m.name + ".")) out.push_back(std::move(t));
  return out;
}

inline Module& Module::train(bool on) {
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

inline Module& Module::to(Device device) {
  drop_compiled();
  detail::convert_tensors(all_tensors(), [&](const Tensor& t) { return t.device() == device ? t : t.to(device); });
  return *this;
}

inline Module& Module::to(DType dtype) {
  if (!is_floating(dtype))
    throw DTypeError(std::string("Module::to: parameters can only be cast to a floating dtype, not ") +
                     dtype_name(dtype));
  drop_compiled();
  detail::convert_tensors(all_tensors(), [&](const Tensor& t) {
    return !is_floating(t.dtype()) || t.dtype() == dtype ? t : t.to(dtype);
  });
  return *this;
}

inline void Module::zero_grad(bool set_to_none) {
  for (Tensor& p : parameters()) {
    if (!p.node()->grad_leaf) continue;
    if (set_to_none)
      p.node()->grad_leaf->grad.reset();
    else
      p.zero_grad_();
  }
}

inline StateDict Module::state_dict() const {
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

inline void Module::load_state_dict(const StateDict& state, bool strict) {
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
      mismatched.push_back(k + " (checkpoint " + (v.defined() ? v.describe() : std::string("undefined")) +
                           ", model " + t->describe() + ")");
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

inline void Module::copy_compiled(const Module& other) {
  if (other.compiled_) compile(other.compiled_->options());
}

inline void Module::compile(CompileOptions options) {
  compiled_ = std::make_shared<CompiledModule>(*this, std::move(options));
}

inline Tensor Module::operator()(const Tensor& input) { return compiled_ ? (*compiled_)(input) : forward(input); }

inline CompileStats Module::compile_stats() const { return compiled_ ? compiled_->stats() : CompileStats{}; }

inline std::string Module::explain(const Tensor& input) {
  if (!compiled_) compile();
  return compiled_->explain(input);
}

inline CompiledModule::Forward& CompiledModule::for_current_modes() {
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

inline Tensor CompiledModule::operator()(const Tensor& input) {
  Forward& compiled = for_current_modes();
  // A fresh key per call, passed in as an argument: the traced graph reads it, so replays draw
  // new dropout masks without recompiling.
  return compiled(input, Tensor(detail::fresh_key("CompiledModule", input.device())));
}

inline CompileStats CompiledModule::stats() const {
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

inline std::string CompiledModule::explain(const Tensor& input) {
  Tensor seed = from_vector<std::int64_t>({0}, Shape{}, input.device());
  return kiln::explain(for_current_modes(), input, seed);
}

}  // namespace kiln::nn

namespace kiln {
/// `auto step = kiln::compile(model, options)` (torch.compile(model)): the model's forward
/// compiled as model.compile() compiles it, called through the returned handle (the model
/// itself keeps running eagerly; it must outlive the handle).
template <class M>
requires std::is_base_of_v<nn::Module, M> nn::CompiledModule compile(M& model, CompileOptions options = {}) {
  return nn::CompiledModule(model, std::move(options));
}
}  // namespace kiln

