#pragma once
// The definitions of the loss functions (tensor/losses.hpp). Header-only mode includes them from
// that header (KILN_ENTRY is `inline`); compiled mode compiles them once into kiln::kiln_compiled
// (src/kiln_compiled.cpp), so users' translation units parse the declarations only.
#include "kiln/tensor/losses.hpp"
#include "kiln/tensor/indexing.hpp"
#include "kiln/tensor/ops.hpp"

namespace kiln {
namespace detail {

KILN_ENTRY decomp::Reduction parse_reduction(const std::string& reduction, const char* op, const Tensor& input) {
  if (reduction == "mean") return decomp::Reduction::Mean;
  if (reduction == "sum") return decomp::Reduction::Sum;
  if (reduction == "none") return decomp::Reduction::None;
  throw ValueError(std::string(op) + ": \"" + reduction + "\" is not a valid value for reduction (\"mean\", \"sum\" or " +
                   "\"none\"; input " + describe(input) + ")");
}

KILN_ENTRY Tensor fold_loss(const Tensor& per_element, decomp::Reduction reduction) {
  switch (reduction) {
    case decomp::Reduction::Mean:
      return mean(per_element);
    case decomp::Reduction::Sum:
      return sum(per_element);
    case decomp::Reduction::None:
      break;
  }
  return per_element;
}

/// ShapeError naming `op`, both operands' dtypes and shapes unless they broadcast (the
/// binary ops' own check).
KILN_ENTRY void check_loss_broadcast(const Tensor& a, const Tensor& b, const char* op) {
  (void)broadcast_small(SmallShape::from(a.shape(), op), SmallShape::from(b.shape(), op), op, a.dtype(), b.dtype());
}

/// The two operands of an elementwise loss in their common floating dtype (float32 under
/// autocast), broadcast-checked; `reduction` parsed. Throws naming `op`.
struct LossOperands {
  Tensor input, target;
  decomp::Reduction reduction;
};
KILN_ENTRY LossOperands loss_operands(const Tensor& input_in, const Tensor& target_in, const std::string& reduction,
                                      const char* op) {
  Tensor input = fp32_operand(input_in), target = fp32_operand(target_in);
  check_same_device(input.device(), target.device(), op);
  const DType dt = promote_types(input.dtype(), target.dtype());
  if (!is_floating(dt))
    throw DTypeError(std::string(op) + ": expected floating point input and target, got " + describe(input) + " and " +
                     describe(target));
  check_loss_broadcast(input, target, op);
  return {input.to(dt), target.to(dt), parse_reduction(reduction, op, input)};
}

}  // namespace detail

KILN_ENTRY Tensor cross_entropy(const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& options) {
  Tensor l = detail::fp32_operand(logits);
  return detail::cross_entropy_checked(l, targets, options.ignore_index,
                                       detail::parse_reduction(options.reduction, "cross_entropy", l),
                                       options.label_smoothing);
}

KILN_ENTRY Tensor nll_loss(const Tensor& log_probs, const Tensor& targets, std::int64_t ignore_index,
                           const std::string& reduction) {
  const char* op = "nll_loss";
  Tensor lp = detail::fp32_operand(log_probs);
  Tensor t = detail::to_tensor(targets);
  const decomp::Reduction r = detail::parse_reduction(reduction, op, lp);
  detail::check_class_operands(lp, t, ignore_index, op);
  // Ignored rows pick class 0 and count 0 (their values, even NaN, never reach the sum).
  Tensor t64 = t.to(DType::Int64);
  Tensor valid = t64 != ignore_index;
  Tensor at = where(valid, t64, 0);
  // A gather of its own site, so that a target out of range read on a GPU is reported as
  // nll_loss's (the device-side check names the site).
  Tensor picked = reshape(detail::gather_nodes(lp, reshape(at, {lp.shape()[0], 1}).node(), 1, ir::GatherSite::NllLoss),
                          {lp.shape()[0]});
  Tensor rows = where(valid, -picked, 0.0);
  switch (r) {
    case decomp::Reduction::None:
      return rows;
    case decomp::Reduction::Sum:
      return sum(rows);
    case decomp::Reduction::Mean:
      break;
  }
  return sum(rows) / sum(valid.to(rows.dtype()));
}

KILN_ENTRY Tensor kl_div(const Tensor& input, const Tensor& target, const std::string& reduction, bool log_target) {
  const char* op = "kl_div";
  if (!is_floating(input.dtype()) || !is_floating(target.dtype()))
    throw DTypeError(std::string(op) + ": integral inputs are not supported, got input " + detail::describe(input) +
                     " and target " + detail::describe(target));
  const bool batchmean = reduction == "batchmean";
  auto o = detail::loss_operands(input, target, batchmean ? "sum" : reduction, op);
  const Tensor& t = o.target;
  Tensor per_element;
  if (log_target) {
    per_element = exp(t) * (t - o.input);
  } else {
    const Tensor zero = t == 0;  // xlogy(t, t): 0 at t = 0 (its log reads 1 there)
    per_element = where(zero, 0.0, t * log(where(zero, 1.0, t))) - t * o.input;
  }
  Tensor loss = detail::fold_loss(per_element, o.reduction);
  if (batchmean && input.dim() > 0) loss = loss / static_cast<double>(input.shape()[0]);
  return loss;
}

KILN_ENTRY Tensor mse_loss(const Tensor& input, const Tensor& target, const std::string& reduction) {
  auto o = detail::loss_operands(input, target, reduction, "mse_loss");
  return detail::fold_loss(square(o.input - o.target), o.reduction);
}

KILN_ENTRY Tensor l1_loss(const Tensor& input, const Tensor& target, const std::string& reduction) {
  auto o = detail::loss_operands(input, target, reduction, "l1_loss");
  return detail::fold_loss(abs(o.input - o.target), o.reduction);
}

KILN_ENTRY Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, const std::string& reduction,
                                 double beta) {
  auto o = detail::loss_operands(input, target, reduction, "smooth_l1_loss");
  if (beta < 0) throw ValueError("smooth_l1_loss: beta must be non-negative, got " + std::to_string(beta));
  Tensor d = abs(o.input - o.target);
  if (beta == 0) return detail::fold_loss(d, o.reduction);
  return detail::fold_loss(where(d < beta, d * d * (0.5 / beta), d - 0.5 * beta), o.reduction);
}

KILN_ENTRY Tensor huber_loss(const Tensor& input, const Tensor& target, const std::string& reduction, double delta) {
  auto o = detail::loss_operands(input, target, reduction, "huber_loss");
  if (!(delta > 0)) throw ValueError("huber_loss: delta must be positive, got " + std::to_string(delta));
  Tensor d = abs(o.input - o.target);
  return detail::fold_loss(where(d < delta, d * d * 0.5, (d - 0.5 * delta) * delta), o.reduction);
}

KILN_ENTRY Tensor binary_cross_entropy(const Tensor& input, const Tensor& target, const std::string& reduction) {
  auto o = detail::loss_operands(input, target, reduction, "binary_cross_entropy");
  // Each log clamped at -100, as PyTorch (log(0) would make the loss infinite).
  Tensor log_x = maximum(log(o.input), -100.0), log_1mx = maximum(log1p(-o.input), -100.0);
  return detail::fold_loss(-(o.target * log_x + (1.0 - o.target) * log_1mx), o.reduction);
}

KILN_ENTRY Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                                   const std::string& reduction, const Tensor& pos_weight) {
  auto o = detail::loss_operands(input, target, reduction, "binary_cross_entropy_with_logits");
  const Tensor& x = o.input;
  const Tensor& t = o.target;
  // log(1 + exp(-x)) = log1p(exp(-|x|)) + max(-x, 0): no overflow for either sign. At x = 0 the
  // maximum's tie gives half its gradient, which with |x|' = 0 there makes d/dx = sigmoid(0) - t.
  Tensor softplus_neg = log1p(exp(-abs(x))) + maximum(-x, 0.0);
  if (!pos_weight.defined()) return detail::fold_loss((1.0 - t) * x + softplus_neg, o.reduction);
  Tensor pw = detail::fp32_operand(pos_weight);
  detail::check_same_device(x.device(), pw.device(), "binary_cross_entropy_with_logits");
  detail::check_loss_broadcast(x, pw, "binary_cross_entropy_with_logits");
  pw = pw.to(x.dtype());
  return detail::fold_loss((1.0 - t) * x + (1.0 + (pw - 1.0) * t) * softplus_neg, o.reduction);
}

}  // namespace kiln
