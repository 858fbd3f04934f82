#pragma once
// Gradients for Tensor users, in libtorch's tape style (requires_grad_, backward, grad, the
// guards, autograd::grad) and in the functional style of JAX and MLX (kiln::grad,
// kiln::value_and_grad). The recording and the rules are the autodiff stage's
// (autodiff/backward.hpp, autodiff/vjp.hpp); this file checks the user's requests, seeds the
// backward, and evaluates the gradients together (one graph: they fuse with each other and
// with whatever of the forward is still lazy).
#include <array>
#include <cmath>
#include <cstddef>
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kiln/autodiff/grad_mode.hpp"
#include "kiln/core/linkage.hpp"
#include "kiln/tensor/creation.hpp"
#include "kiln/tensor/eval.hpp"

namespace kiln {

/// Turns gradient recording off on this thread while it lives (torch.no_grad()): tensors
/// computed inside need no grad, and shape ops of evaluated tensors are views again.
class NoGradGuard {
 public:
  NoGradGuard() = default;

 private:
  autodiff::GradModeScope scope_{false};
};

/// Turns gradient recording back on while it lives (torch.enable_grad()), inside a NoGradGuard.
class EnableGradGuard {
 public:
  EnableGradGuard() = default;

 private:
  autodiff::GradModeScope scope_{true};
};

/// Whether this thread records gradients (torch.is_grad_enabled()).
inline bool is_grad_enabled() { return ir::detail::grad_mode(); }

namespace detail {

/// The seed of a backward from `output`: `gradient` cast to the output's dtype, or 1 for a
/// single-element output. `what` names the call in errors.
KILN_ENTRY ir::NodePtr backward_seed(const Tensor& output, const Tensor& gradient, const std::string& what);

/// The nodes of a backward from `outputs` (seeded by `grad_outputs`, or 1s) to `inputs`, lazy;
/// an input the outputs do not depend on gets null.
KILN_ENTRY std::vector<ir::NodePtr> gradient_nodes(const std::vector<Tensor>& outputs,
                                                   const std::vector<Tensor>& inputs,
                                                   const std::vector<Tensor>& grad_outputs, bool retain_graph,
                                                   const std::string& what);

/// Whether gradient home `home` can hold a gradient of leaf `n` (its memory is on n's device and
/// large enough: a leaf moved or cast since the home was given falls back to new memory).
KILN_ENTRY bool home_holds(const ir::BufferView& home, const ir::Node& n);

/// Evaluates `nodes` together (one graph) unless kiln::compile is tracing; null entries stay.
KILN_ENTRY void evaluate_together(const std::vector<ir::NodePtr>& nodes);

/// Evaluates each values[i] into destinations[i] a group at a time (groups[i]; increasing
/// order, group -1 last), one graph per group, calling `done(group)` after each. A lazy node a
/// later group needs as well is realized by the first graph that computes it, so no node is
/// computed twice (the backward's evaluation groups, ir::GradLeaf::evaluation_group).
KILN_ENTRY void evaluate_in_groups(const std::vector<ir::NodePtr>& values, const std::vector<ir::NodePtr>& destinations,
                                   const std::vector<int>& groups, const std::function<void(int)>& done);

}  // namespace detail

inline bool Tensor::requires_grad() const { return node_ && node_->requires_grad; }

inline bool Tensor::is_leaf() const { return !requires_grad() || node_->grad_leaf != nullptr; }

template <class D>
bool Expr<D>::requires_grad() const {
  return Tensor(derived()).requires_grad();
}
template <class D>
void Expr<D>::backward(const Tensor& gradient, bool retain_graph) const {
  Tensor(derived()).backward(gradient, retain_graph);
}
template <class D>
void Expr<D>::backward() const {
  Tensor(derived()).backward();
}
template <class D>
Tensor Expr<D>::detach() const {
  return Tensor(derived()).detach();
}

namespace autograd {

/// The gradients of `outputs` with respect to `inputs` (torch.autograd.grad): each output
/// weighted by the same index of `grad_outputs` (omitted: 1, for single-element outputs), the
/// inputs' grad() untouched. An input the outputs do not depend on is an AutogradError, or an
/// undefined Tensor with `allow_unused`. Without `retain_graph` the recorded graph is freed.
KILN_ENTRY std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                                    const std::vector<Tensor>& grad_outputs = {}, bool retain_graph = false,
                                    bool allow_unused = false);

/// torch.autograd.gradcheck: the gradients of `f` at `inputs` by backward against float64
/// central differences. The floating inputs are copied to float64 leaves that require grad
/// (integer inputs pass through unchanged); f's output y is projected on a fixed random v of
/// its shape, and each element's analytic d(sum(y v))/dx is compared with (s(x + eps) - s(x -
/// eps)) / 2 eps: |analytic - numeric| <= atol + rtol |numeric|. Returns true, or throws an
/// AutogradError naming the input, the element and both values. Costs two evaluations of f
/// per input element: meant for small inputs.
template <class F>
bool gradcheck(F f, const std::vector<Tensor>& inputs, double eps = 1e-6, double atol = 1e-5, double rtol = 1e-3) {
  std::vector<Tensor> xs;
  std::vector<std::size_t> checked_inputs;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!is_floating(inputs[i].dtype())) {
      xs.push_back(inputs[i]);
      continue;
    }
    // A float64 copy of the values with storage of its own, outside any graph.
    Tensor x = from_vector<double>(inputs[i].to_vector<double>(), inputs[i].shape(), inputs[i].device());
    x.requires_grad_();
    xs.push_back(x);
    checked_inputs.push_back(i);
  }
  Tensor y = f(xs);
  if (!y.defined() || !is_floating(y.dtype()))
    throw AutogradError("gradcheck: the function must return a floating tensor, not " + y.describe());
  Tensor v;
  {
    NoGradGuard off;
    v = randn(y.shape(), 20260, DType::Float64, y.device()).eval();
  }
  std::vector<Tensor> wrt;
  for (std::size_t i : checked_inputs) wrt.push_back(xs[i]);
  std::vector<Tensor> analytic;
  if (y.requires_grad()) {
    analytic = grad({y}, wrt, {v}, false, true);
  } else {
    analytic.resize(wrt.size());
  }
  NoGradGuard off;
  auto projected = [&](std::vector<Tensor> args) {
    return sum(f(args).to(DType::Float64) * v).template item<double>();
  };
  for (std::size_t k = 0; k < checked_inputs.size(); ++k) {
    const std::size_t at = checked_inputs[k];
    const Tensor& x = xs[at];
    std::vector<double> values = x.to_vector<double>();
    std::vector<double> got = analytic[k].defined() ? analytic[k].to(DType::Float64).to_vector<double>()
                                                    : std::vector<double>(values.size(), 0.0);
    for (std::size_t e = 0; e < values.size(); ++e) {
      std::vector<Tensor> args = xs;
      std::vector<double> moved = values;
      moved[e] = values[e] + eps;
      args[at] = from_vector<double>(moved, x.shape(), x.device());
      const double up = projected(args);
      moved[e] = values[e] - eps;
      args[at] = from_vector<double>(moved, x.shape(), x.device());
      const double down = projected(args);
      const double numeric = (up - down) / (2 * eps);
      const bool both_nan = got[e] != got[e] && numeric != numeric;
      if (!both_nan && !(std::abs(got[e] - numeric) <= atol + rtol * std::abs(numeric)))
        throw AutogradError("gradcheck: input " + std::to_string(at) + " " + x.describe() + ", element " +
                            std::to_string(e) + ": backward gives " + std::to_string(got[e]) +
                            ", central differences " + std::to_string(numeric));
    }
  }
  return true;
}

}  // namespace autograd

/// The value of a scalar function and its gradients with respect to the arguments numbered by
/// `argnums` (JAX's and MLX's value_and_grad): `value_and_grad(f)(x, y)` returns
/// `{f(x, y), {df/dx}}`. The arguments are not marked (f sees detached copies that require grad);
/// an argument f does not use gets zeros. The value and the gradients are evaluated together.
template <class F>
auto value_and_grad(F f, std::vector<int> argnums = {0}) {
  return [f = std::move(f), argnums = std::move(argnums)](const auto&... args) {
    constexpr std::size_t n = sizeof...(args);
    std::array<Tensor, n> call{Tensor(args)...};
    std::vector<Tensor> wrt;
    for (int a : argnums) {
      if (a < 0 || static_cast<std::size_t>(a) >= n)
        throw ValueError("value_and_grad: argnum " + std::to_string(a) + " is out of range for a call of " +
                         std::to_string(n) + " argument(s)");
      Tensor marked = call[static_cast<std::size_t>(a)].detach();
      marked.requires_grad_();
      call[static_cast<std::size_t>(a)] = marked;
      wrt.push_back(marked);
    }
    Tensor value;
    {
      EnableGradGuard on;
      value = std::apply(f, call);
    }
    if (!value.defined() || value.numel() != 1)
      throw AutogradError("value_and_grad: the function must return a single-element tensor, not " + value.describe());
    std::vector<ir::NodePtr> nodes;
    if (value.requires_grad()) nodes = detail::gradient_nodes({value}, wrt, {}, false, "value_and_grad");
    nodes.resize(wrt.size());
    {
      NoGradGuard off;
      for (std::size_t i = 0; i < nodes.size(); ++i)
        if (!nodes[i]) nodes[i] = ir::constant(0.0, wrt[i].dtype(), wrt[i].shape(), wrt[i].device());
      nodes.push_back(value.detach().node());
    }
    detail::evaluate_together(nodes);  // the value and the gradients: one graph
    std::vector<Tensor> grads;
    for (std::size_t i = 0; i + 1 < nodes.size(); ++i) grads.push_back(Tensor(nodes[i]));
    return std::pair<Tensor, std::vector<Tensor>>{Tensor(nodes.back()), std::move(grads)};
  };
}

/// The gradients of a scalar function with respect to the arguments numbered by `argnums`
/// (JAX's grad): `grad(f)(x, y)` returns `{df/dx}`, one Tensor per argnum.
template <class F>
auto grad(F f, std::vector<int> argnums = {0}) {
  return [vg = value_and_grad(std::move(f), std::move(argnums))](const auto&... args) { return vg(args...).second; };
}

}  // namespace kiln

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/tensor/autograd_impl.hpp"
#endif
