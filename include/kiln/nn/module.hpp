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
  KILN_ENTRY virtual Tensor forward(const Tensor& input);

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
  /// The direct submodules, in registration order (one registered under two names: once).
  std::vector<Module*> children() const;
  std::vector<std::pair<std::string, Module*>> named_children() const;
  /// This module and every submodule, depth first (this one first); a module shared by two
  /// parents or names is listed once, under the first name that reaches it (torch's).
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

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/nn/module_impl.hpp"
#endif
