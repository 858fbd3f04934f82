#pragma once
// Stochastic gradient descent (torch.optim.SGD), fused (optim/optimizer.hpp).
#include <string>
#include <utility>
#include <vector>

#include "kiln/optim/optimizer.hpp"

namespace kiln::optim {

/// SGD's hyper-parameters (torch.optim.SGD's, same defaults):
/// `SGD opt(params, {.lr = 0.1, .momentum = 0.9});`
struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  bool maximize = false;
};

/// Stochastic gradient descent with momentum, as torch.optim.SGD: for each parameter p with a
/// gradient g,
///   g = maximize ? -g : g;  g += weight_decay * p (if weight_decay != 0);
///   if momentum != 0: b = (first step) ? g : momentum * b + (1 - dampening) * g;
///                     g = nesterov ? g + momentum * b : b;
///   p -= lr * g.
/// State: momentum_buffer (with momentum). Nesterov needs momentum > 0 and zero dampening;
/// negative lr, momentum or weight_decay are ValueErrors.
class SGD : public Optimizer {
 public:
  explicit SGD(std::vector<Tensor> params, SGDOptions options = {}) : defaults_(options) {
    add_param_group(std::move(params), options);
  }

  /// Adds a group with the optimizer's default hyper-parameters (those it was made with).
  void add_param_group(std::vector<Tensor> params) { add_param_group(std::move(params), defaults_); }
  /// Adds a group with its own hyper-parameters.
  void add_param_group(std::vector<Tensor> params, const SGDOptions& o);
  using Optimizer::add_param_group;

  /// The hyper-parameters the optimizer was made with.
  const SGDOptions& defaults() const { return defaults_; }

 protected:
  const char* name() const override { return "SGD"; }
  KILN_ENTRY void check_options(const ParamGroup& g) const override;
  KILN_ENTRY std::vector<Field> fields() const override;
  std::vector<std::string> slot_names() const override { return {"momentum_buffer"}; }
  bool slot_used(const ParamGroup& g, std::size_t) const override { return g.momentum != 0; }
  bool slot_required(std::size_t) const override { return true; }
  bool counts_steps() const override { return false; }

  // The numbers a step reads: lr, weight_decay, momentum, then the buffer's update b * keep + g *
  // take (keep = 0, take = 1 on the buffer's first step: b = g).
  KILN_ENTRY std::vector<double> scalars(const ParamGroup& g, const detail::ParamState& ps) const override;

  KILN_ENTRY Updated update(const ParamGroup& g, const Update& in) const override;

 private:
  SGDOptions defaults_;
};

}  // namespace kiln::optim

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/optim/sgd_impl.hpp"
#endif
