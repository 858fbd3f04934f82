#pragma once
// Adam and AdamW (torch.optim.Adam, torch.optim.AdamW), fused (optim/optimizer.hpp).
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "kiln/optim/optimizer.hpp"

namespace kiln::optim {

/// Adam's hyper-parameters (torch.optim.Adam's, same defaults):
/// `Adam opt(params, {.lr = 1e-3, .betas = {0.9, 0.95}});`
struct AdamOptions {
  double lr = 1e-3;
  std::pair<double, double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0;
  bool amsgrad = false;
  bool maximize = false;
};

/// AdamW's hyper-parameters (torch.optim.AdamW's: weight_decay defaults to 1e-2):
/// `AdamW opt(model.parameters(), {.lr = 3e-4, .weight_decay = 0.1});`
struct AdamWOptions {
  double lr = 1e-3;
  std::pair<double, double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
  bool maximize = false;
};

namespace detail {

/// Adam and AdamW: one algorithm, the weight decay added to the gradient (Adam, L2) or
/// decoupled from it (AdamW).
class AdamBase : public Optimizer {
 protected:
  explicit AdamBase(bool decoupled) : decoupled_(decoupled) {}

  template <class O>
  static ParamGroup group_of(std::vector<Tensor> params, const O& o) {
    ParamGroup g;
    g.params = std::move(params);
    g.lr = o.lr;
    g.betas = o.betas;
    g.eps = o.eps;
    g.weight_decay = o.weight_decay;
    g.amsgrad = o.amsgrad;
    g.maximize = o.maximize;
    return g;
  }

  const char* name() const override { return decoupled_ ? "AdamW" : "Adam"; }
  KILN_ENTRY void check_options(const ParamGroup& g) const override;
  KILN_ENTRY std::vector<Field> fields() const override;
  std::vector<std::string> slot_names() const override { return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}; }
  bool slot_used(const ParamGroup& g, std::size_t s) const override { return s < 2 || g.amsgrad; }
  bool slot_required(std::size_t s) const override { return s < 2; }
  bool counts_steps() const override { return true; }

  // The numbers a step reads: weight_decay, beta1, 1 - beta1, beta2, 1 - beta2,
  // lr / (1 - beta1^t), sqrt(1 - beta2^t), eps, 1 - lr * weight_decay (computed in double).
  KILN_ENTRY std::vector<double> scalars(const ParamGroup& g, const ParamState& ps) const override;

  KILN_ENTRY Updated update(const ParamGroup& g, const Update& in) const override;

 private:
  bool decoupled_;
};

}  // namespace detail

/// Adam, as torch.optim.Adam (weight decay as L2, added to the gradient): for each parameter p
/// with a gradient g, at its step t,
///   g = maximize ? -g : g;  g += weight_decay * p (if weight_decay != 0);
///   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2;  (amsgrad: vmax = max(vmax, v))
///   p -= lr / (1 - beta1^t) * m / (sqrt(v or vmax) / sqrt(1 - beta2^t) + eps).
/// State: exp_avg, exp_avg_sq (and max_exp_avg_sq with amsgrad), step. Negative lr, eps or
/// weight_decay and betas outside [0, 1) are ValueErrors.
class Adam : public detail::AdamBase {
 public:
  explicit Adam(std::vector<Tensor> params, AdamOptions options = {}) : AdamBase(false), defaults_(options) {
    add_param_group(std::move(params), options);
  }
  /// Adds a group with the optimizer's default hyper-parameters (those it was made with).
  void add_param_group(std::vector<Tensor> params) { add_param_group(std::move(params), defaults_); }
  /// Adds a group with its own hyper-parameters.
  void add_param_group(std::vector<Tensor> params, const AdamOptions& o) {
    Optimizer::add_param_group(group_of(std::move(params), o));
  }
  using Optimizer::add_param_group;
  /// The hyper-parameters the optimizer was made with.
  const AdamOptions& defaults() const { return defaults_; }

 private:
  AdamOptions defaults_;
};

/// AdamW, as torch.optim.AdamW: Adam with decoupled weight decay, p *= 1 - lr * weight_decay
/// before the Adam update (no decay added to the gradient).
class AdamW : public detail::AdamBase {
 public:
  explicit AdamW(std::vector<Tensor> params, AdamWOptions options = {}) : AdamBase(true), defaults_(options) {
    add_param_group(std::move(params), options);
  }
  /// Adds a group with the optimizer's default hyper-parameters (those it was made with).
  void add_param_group(std::vector<Tensor> params) { add_param_group(std::move(params), defaults_); }
  /// Adds a group with its own hyper-parameters.
  void add_param_group(std::vector<Tensor> params, const AdamWOptions& o) {
    Optimizer::add_param_group(group_of(std::move(params), o));
  }
  using Optimizer::add_param_group;
  /// The hyper-parameters the optimizer was made with.
  const AdamWOptions& defaults() const { return defaults_; }

 private:
  AdamWOptions defaults_;
};

}  // namespace kiln::optim

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/optim/adam_impl.hpp"
#endif
