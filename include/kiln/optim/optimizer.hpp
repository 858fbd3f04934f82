#pragma once
// The optimizer base (torch.optim.Optimizer) and the flat-buffer machinery that makes every
// optimizer of this folder fused, as torch's fused=True: one update kernel per group of
// parameters of one dtype and device, whatever the number of parameters.
//
// How. When a parameter group is added, its parameters are split into buckets (one dtype, one
// device each). A bucket moves the storage of its parameters into one flat buffer (each
// parameter's node is repointed at its slice, so every Tensor handle sharing the node sees it),
// keeps the optimizer's state (momentum, exp_avg, ...) as flat buffers of the same layout, and
// gives each parameter's GradLeaf a gradient home: its slice of one flat gradient buffer, where
// Tensor::backward writes a fresh gradient. A step over a bucket whose parameters all have their
// gradient at home and share their per-step scalars is then one pointwise graph over four or
// five flat tensors (parameters, gradients, state), written in place: one kernel, at memory
// speed. The per-step scalars (lr, bias corrections, ...) are elements of a small tensor made
// each step, read by the kernel, never literals in its code: a scheduler changing lr recompiles
// nothing. A bucket where some parameters lack a gradient (or have one elsewhere) updates those
// that have one, each through its slices, still in one evaluation.
//
// Consequences worth knowing. The optimizer owns where its parameters live: make it after
// Module::to (which replaces parameter storage; the optimizer then reports the parameter as
// moved) and before kiln::compile traces a model whose parameters it holds (a replay may keep
// views of the storage the parameters had when traced). A gradient at home is overwritten by the
// next backward after zero_grad(): copy grad() to keep its values.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <source_location>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/decomp/decompose.hpp"
#include "kiln/nn/state_dict.hpp"
#include "kiln/tensor/autograd.hpp"
#include "kiln/tensor/creation.hpp"
#include "kiln/tensor/eval.hpp"

namespace kiln::optim {

/// One parameter group (an entry of torch's optimizer.param_groups): its parameters and the
/// hyper-parameters of every optimizer kiln has; each optimizer reads its own (SGD: lr,
/// momentum, dampening, weight_decay, nesterov, maximize; Adam and AdamW: lr, betas, eps,
/// weight_decay, amsgrad, maximize) and leaves the others alone. Schedulers set `lr`; any of
/// them may be changed between steps (a change of lr, betas, eps, momentum, dampening or a
/// nonzero weight_decay recompiles nothing). Change `params` only through add_param_group.
struct ParamGroup {
  std::vector<Tensor> params;
  double lr = 1e-3;
  double weight_decay = 0;
  bool maximize = false;
  double momentum = 0;                          ///< SGD
  double dampening = 0;                         ///< SGD
  bool nesterov = false;                        ///< SGD
  std::pair<double, double> betas{0.9, 0.999};  ///< Adam, AdamW
  double eps = 1e-8;                            ///< Adam, AdamW
  bool amsgrad = false;                         ///< Adam, AdamW
  /// The lr when the first scheduler was made for the optimizer (torch's group["initial_lr"]):
  /// the base of the schedulers' closed forms. Unset until then.
  std::optional<double> initial_lr;
};

namespace detail {

using ir::NodePtr;

/// The dtype an update computes in (PyTorch's opmath): float32 for the half types.
inline DType opmath(DType d) { return d == DType::Float64 ? DType::Float64 : DType::Float32; }

// The decompositions' node builders, plus the one they lack.
using decomp::add;
using decomp::div;
using decomp::mul;
using decomp::sub;
using decomp::detail::neg;
inline NodePtr maximum(const NodePtr& a, const NodePtr& b) { return ir::binary(ir::Op::Maximum, a, b); }
inline NodePtr sqrt(const NodePtr& a) { return ir::unary(ir::Op::Sqrt, a); }

/// Elements [offset, offset + numel(shape)) of `storage`, row-major as `shape`.
KILN_ENTRY NodePtr slice_of(const StoragePtr& storage, std::int64_t offset, const Shape& shape, DType dtype,
                            Device device);

/// New memory for `numel` elements of `dtype` on `device`.
KILN_ENTRY StoragePtr allocate_elements(std::int64_t numel, DType dtype, Device device, const char* what);

/// Element `index` of the realized 1-d (or 0-d, index 0) `scalars`, broadcast (stride 0) to `shape`: a per-step
/// number the kernel reads from memory.
KILN_ENTRY NodePtr scalar_view(const NodePtr& scalars, std::int64_t index, const Shape& shape);

/// A realized 1-d tensor of `values` as `dtype` on `device`.
KILN_ENTRY NodePtr scalars_tensor(const std::vector<double>& values, DType dtype, Device device);

/// `nodes` (realized, distinct) with every run of them that tiles one contiguous range of one
/// storage (row-major, one dtype, adjacent) merged into one flat node over the range: the
/// gradients of a fused optimizer's bucket become one tensor, so that clipping, unscaling and
/// zeroing them is one kernel.
KILN_ENTRY std::vector<NodePtr> coalesce(const std::vector<NodePtr>& nodes);

/// The gradient nodes of `params` that are defined, evaluated (under NoGradGuard).
KILN_ENTRY std::vector<NodePtr> defined_grads(const std::vector<Tensor>& params);

/// A parameter of a bucket: where in the group and in the flat buffers it is.
struct Member {
  std::size_t index = 0;  ///< in the group's params
  NodePtr node;
  std::int64_t offset = 0;  ///< elements into the bucket's flat buffers
};

/// The parameters of one group with one dtype and device, and their flat buffers.
struct Bucket {
  DType dtype = DType::Float32;
  Device device = Device::cpu();
  std::vector<Member> members;
  std::int64_t numel = 0;
  StoragePtr params, grads;
  std::vector<StoragePtr> state;  ///< per state slot of the optimizer; null until first needed
};

/// Per-parameter bookkeeping on the host.
struct ParamState {
  std::int64_t step = 0;     ///< updates made (the optimizers that count steps)
  bool initialized = false;  ///< the state slots hold this parameter's state
};

}  // namespace detail

/// The base of kiln's optimizers (torch.optim.Optimizer): parameter groups, step, zero_grad,
/// state_dict. Parameters must be floating leaves that require grad (DTypeError, ValueError);
/// a parameter whose grad() is undefined at a step is skipped, its state unchanged. Not
/// copyable (it owns where its parameters live); schedulers keep a reference to it.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// One update of every parameter that has a gradient: one fused evaluation (one kernel per
  /// bucket of parameters of one group, dtype and device when all of them have a gradient).
  /// Inside a function kiln::compile traces it is a graph break (it writes in place).
  void step();

  /// Resets the gradients of every parameter (torch's zero_grad): with `set_to_none` (the
  /// default) grad() becomes undefined (a gradient home is kept: the next backward writes
  /// there); else the defined gradients are set to zeros in place (one kernel per bucket).
  void zero_grad(bool set_to_none = true);

  /// The parameter groups: their parameters and hyper-parameters (set `lr` and the others here).
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }

  /// Adds a group of parameters with its own hyper-parameters (all of them: the group's values
  /// are used as given). Its parameters must be new to the optimizer (ValueError), floating
  /// (DTypeError) leaves that require grad (ValueError); its hyper-parameters are checked as
  /// the optimizer's constructor checks them (ValueError).
  void add_param_group(ParamGroup group);

  /// The optimizer's state as flat names (torch's state_dict, flattened), for checkpoints:
  ///   state.<i>.<slot>             the state tensors of parameter i (numbered across groups in
  ///                                order), of its shape and dtype: momentum_buffer (SGD);
  ///                                exp_avg, exp_avg_sq, max_exp_avg_sq with amsgrad (Adam, AdamW).
  ///                                They share the optimizer's memory (clone to keep a snapshot).
  ///   state.<i>.step               int64, 0-d: updates made (Adam, AdamW)
  ///   param_groups.<g>.params      int64 [n]: the indices i of the group's parameters
  ///   param_groups.<g>.<option>    float64 0-d (lr, weight_decay, momentum, dampening, eps,
  ///                                initial_lr once a scheduler set it), float64 [2] (betas),
  ///                                int64 0-d 0/1 (nesterov, amsgrad, maximize).
  /// A parameter that has not been updated has no state entries.
  nn::StateDict state_dict() const;

  /// Loads what state_dict() saved (of an optimizer of the same kind over parameters of the same
  /// shapes, grouped alike): hyper-parameters, steps and state tensors (cast to each parameter's
  /// dtype, copied to its device). Every key and shape is checked before anything changes: a
  /// ValueError lists the missing, unexpected and mis-shaped keys. A parameter without state
  /// entries starts afresh.
  void load_state_dict(const nn::StateDict& dict);

 protected:
  Optimizer() = default;

  /// A hyper-parameter of the group as state_dict names it: one of the three members is set.
  struct Field {
    const char* name;
    double ParamGroup::*real = nullptr;
    bool ParamGroup::*flag = nullptr;
    std::pair<double, double> ParamGroup::*pair = nullptr;
  };

  /// The optimizer's name in errors ("SGD", "Adam", "AdamW").
  virtual const char* name() const = 0;
  /// Throws ValueError for hyper-parameters the optimizer rejects.
  virtual void check_options(const ParamGroup& group) const = 0;
  /// The hyper-parameters the optimizer reads (state_dict's param_groups entries besides params).
  virtual std::vector<Field> fields() const = 0;
  /// The names of the state slots (flat buffers of the parameters' layout).
  virtual std::vector<std::string> slot_names() const = 0;
  /// Whether slot `s` is read and written by a step with `group`'s options.
  virtual bool slot_used(const ParamGroup& group, std::size_t s) const = 0;
  /// Whether a parameter's saved state must hold slot `s` (else it may: zeros when absent).
  virtual bool slot_required(std::size_t s) const = 0;
  /// Whether the optimizer counts each parameter's updates (saved as state.<i>.step).
  virtual bool counts_steps() const = 0;
  /// The per-step numbers of one parameter's update (its step already counted): the kernel
  /// reads them as `Update::scalar(k)`.
  virtual std::vector<double> scalars(const ParamGroup& group, const detail::ParamState& ps) const = 0;

  /// The inputs of one update (a parameter or a bucket's flat parameters), in the dtype the
  /// update computes in.
  struct Update {
    ir::NodePtr param, grad;
    std::vector<ir::NodePtr> state;  ///< per slot; null for slots not used
    std::function<ir::NodePtr(int)> scalar;
  };
  /// The new values (null: unchanged) of the parameter and of each slot.
  struct Updated {
    ir::NodePtr param;
    std::vector<ir::NodePtr> state;
  };
  /// The update's graph: lazy nodes of the inputs' shape and dtype.
  virtual Updated update(const ParamGroup& group, const Update& in) const = 0;

 private:
  std::vector<detail::Bucket> make_buckets(const ParamGroup& group);

  /// Allocates (zeroed: one graph) the state slots `group`'s options use, or those in `also`.
  void ensure_state(detail::Bucket& b, const ParamGroup& group, const std::vector<bool>& also = {});

  void check_group_unchanged(std::size_t gi) const;

  void check_member(std::size_t gi, const detail::Bucket& b, const detail::Member& m) const;

  /// Whether the parameter node still lives at its slice of the bucket's flat buffer.
  static bool at_home(const detail::Bucket& b, const detail::Member& m);
  static bool grad_at_home(const detail::Bucket& b, const detail::Member& m);

  void build_bucket_update(const ParamGroup& group, const detail::Bucket& b,
                           const std::vector<const detail::Member*>& with_grad,
                           const std::vector<std::vector<double>>& rows, std::vector<ir::NodePtr>& values,
                           std::vector<ir::NodePtr>& destinations) const;

  /// The index state_dict gives the first parameter of group `gi`.
  std::size_t first_index(std::size_t gi) const;
  const detail::Member& member(std::size_t gi, std::size_t pi) const;
  detail::Bucket& bucket_of(std::size_t gi, std::size_t pi);
  const detail::Bucket& bucket_of(std::size_t gi, std::size_t pi) const {
    return const_cast<Optimizer*>(this)->bucket_of(gi, pi);
  }

  std::vector<ParamGroup> groups_;
  std::vector<std::vector<detail::Bucket>> buckets_;    ///< per group
  std::vector<std::vector<detail::ParamState>> state_;  ///< per group, per parameter
};

}  // namespace kiln::optim

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/optim/optimizer_impl.hpp"
#endif
