#pragma once
// The definitions of the loss functions (tensor/losses.hpp). Header-only mode includes them from
// that header (KILN_ENTRY is `inline`); compiled mode compiles them once into kiln::kiln_compiled
// (src/kiln_compiled.cpp), so users' translation units parse the declarations only.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <vector>

#include "kiln/tensor/losses.hpp"
#include "kiln/tensor/activations.hpp"
#include "kiln/tensor/composites.hpp"
#include "kiln/tensor/eval.hpp"
#include "kiln/tensor/indexing.hpp"
#include "kiln/tensor/ops.hpp"
#include "kiln/tensor/shape_ops.hpp"

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

/// The dtype of one of torch's composite losses over `xs` (each as autocast's float32 list
/// gives it): their common dtype, float32 where that is integral (torch's arithmetic with the
/// float margin or eps makes it so). Bool operands are a DTypeError naming `op`, as torch's
/// subtraction and negation refuse them.
KILN_ENTRY DType composite_loss_dtype(const std::vector<Tensor>& xs, const char* op) {
  DType dt = xs.front().dtype();
  for (const Tensor& x : xs) {
    check_same_device(xs.front().device(), x.device(), op);
    if (x.dtype() == DType::Bool) {
      std::string all;
      for (const Tensor& y : xs) all += (all.empty() ? "" : ", ") + describe(y);
      throw DTypeError(std::string(op) + ": bool operands are not supported (torch's subtraction refuses them), got " +
                       all);
    }
    dt = promote_types(dt, x.dtype());
  }
  return is_floating(dt) ? dt : DType::Float32;
}

/// ShapeError naming `op` unless the tensors have one rank (torch's check before broadcasting).
KILN_ENTRY void require_same_rank(const std::vector<Tensor>& xs, const std::vector<const char*>& names,
                                  const char* op) {
  for (const Tensor& x : xs) {
    if (x.dim() == xs.front().dim()) continue;
    std::string all;
    for (std::size_t i = 0; i < xs.size(); ++i) all += (i ? ", " : "") + std::string(names[i]) + " " + describe(xs[i]);
    throw ShapeError(std::string(op) + ": all input tensors should have the same number of dimensions, got " + all);
  }
}

/// pairwise_distance with errors naming `op` (triplet_margin_loss reports its own name).
KILN_ENTRY Tensor pairwise_distance_of(const Tensor& x1_in, const Tensor& x2_in, double p, double eps, bool keepdim,
                                       const char* op) {
  const Tensor x1 = to_tensor(x1_in), x2 = to_tensor(x2_in);
  const DType dt = composite_loss_dtype({x1, x2}, op);
  check_loss_broadcast(x1, x2, op);
  // torch's at::norm(x1 - x2 + eps, p, last dim): the difference in the operands' dtype, the norm
  // (autocast's float32 op) over the last dim of the broadcast shape.
  const Tensor d = fp32_operand(x1.to(dt) - x2.to(dt) + eps);
  const std::int64_t rank = std::max(x1.dim(), x2.dim());
  return rank == 0 ? linalg::vector_norm(d, p, {}, keepdim) : linalg::vector_norm(d, p, Axes{rank - 1}, keepdim);
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

KILN_ENTRY Tensor margin_ranking_loss(const Tensor& input1_in, const Tensor& input2_in, const Tensor& target_in,
                                      double margin, const std::string& reduction) {
  const char* op = "margin_ranking_loss";
  const Tensor input1 = detail::fp32_operand(input1_in), input2 = detail::fp32_operand(input2_in),
               target = detail::fp32_operand(target_in);
  const decomp::Reduction r = detail::parse_reduction(reduction, op, input1);
  detail::require_same_rank({input1, input2, target}, {"input1", "input2", "target"}, op);
  const DType dt = detail::composite_loss_dtype({input1, input2, target}, op);
  detail::check_loss_broadcast(input1, input2, op);
  detail::check_loss_broadcast(input1, target, op);
  detail::check_loss_broadcast(input2, target, op);
  const Tensor t = target.to(dt);
  return detail::fold_loss(clamp_min(-t * (input1.to(dt) - input2.to(dt)) + margin, 0.0), r);
}

KILN_ENTRY Tensor soft_margin_loss(const Tensor& input_in, const Tensor& target_in, const std::string& reduction) {
  const char* op = "soft_margin_loss";
  const Tensor input = detail::fp32_operand(input_in), target = detail::fp32_operand(target_in);
  const decomp::Reduction r = detail::parse_reduction(reduction, op, input);
  detail::check_same_device(input.device(), target.device(), op);
  if (!is_floating(input.dtype()))
    throw DTypeError(std::string(op) + ": expected a floating point input (the loss has its dtype), got input " +
                     detail::describe(input) + " and target " + detail::describe(target));
  detail::check_loss_broadcast(input, target, op);
  // torch multiplies target into a buffer of input's shape and dtype in place: target must
  // broadcast to that shape, and the product is rounded to input's dtype.
  if (broadcast_shapes(input.shape(), target.shape(), op) != input.shape())
    throw ShapeError(std::string(op) + ": target " + detail::describe(target) + " must broadcast to input's shape (" +
                     detail::describe(input) + ")");
  const Tensor z = (-input * target).to(input.dtype());
  return detail::fold_loss(log1p(exp(z)), r);
}

KILN_ENTRY Tensor hinge_embedding_loss(const Tensor& input_in, const Tensor& target_in, double margin,
                                       const std::string& reduction) {
  const char* op = "hinge_embedding_loss";
  const Tensor input = detail::fp32_operand(input_in), target = detail::to_tensor(target_in);
  const decomp::Reduction r = detail::parse_reduction(reduction, op, input);
  detail::check_same_device(input.device(), target.device(), op);
  const Tensor x = input.to(detail::composite_loss_dtype({input}, op));
  detail::check_loss_broadcast(x, target, op);
  return detail::fold_loss(where(target != 1, clamp_min(margin - x, 0.0), 0.0) + where(target != -1, x, 0.0), r);
}

KILN_ENTRY Tensor poisson_nll_loss(const Tensor& input_in, const Tensor& target_in, bool log_input, bool full,
                                   double eps, const std::string& reduction) {
  const char* op = "poisson_nll_loss";
  const Tensor input = detail::fp32_operand(input_in), target = detail::fp32_operand(target_in);
  const decomp::Reduction r = detail::parse_reduction(reduction, op, input);
  const DType dt = detail::composite_loss_dtype({input, target}, op);
  detail::check_loss_broadcast(input, target, op);
  const Tensor x = input.to(dt), t = target.to(dt);
  Tensor loss = log_input ? Tensor(exp(x) - t * x) : Tensor(x - t * log(x + eps));
  if (full) {
    // torch's masked_fill of the whole term where target <= 1: written the same way (not reading
    // a safe value there), so that target's gradient is torch's too (NaN at target 0).
    const Tensor stirling = t * log(t) - t + 0.5 * log(2.0 * std::numbers::pi * t);
    loss = loss + where(t <= 1.0, 0.0, stirling);
  }
  return detail::fold_loss(loss, r);
}

KILN_ENTRY Tensor gaussian_nll_loss(const Tensor& input_in, const Tensor& target_in, const Tensor& var_in, bool full,
                                    double eps, const std::string& reduction) {
  const char* op = "gaussian_nll_loss";
  const Tensor input = detail::to_tensor(input_in), target = detail::to_tensor(target_in);
  Tensor var = detail::to_tensor(var_in);
  // var's shape first, then the reduction, then var's sign, in torch's order.
  const Shape& xs = input.shape();
  const Shape vs = var.shape();
  if (vs != xs) {
    const Shape lead = xs.empty() ? Shape{} : Shape(std::vector<std::int64_t>(xs.begin(), xs.end() - 1));
    if (vs == lead) {
      var = var.unsqueeze(-1);  // one variance per row: broadcast along the last dim
    } else if (vs.empty() || Shape(std::vector<std::int64_t>(vs.begin(), vs.end() - 1)) != lead || vs.back() != 1) {
      throw ValueError(std::string(op) +
                       ": var is of incorrect size: expected input's shape, it without its last "
                       "dim, or it with last dim 1; got var " +
                       detail::describe(var) + " for input " + detail::describe(input));
    }
  }
  const decomp::Reduction r = detail::parse_reduction(reduction, op, input);
  const DType dt = detail::composite_loss_dtype({input, target, var}, op);
  detail::check_loss_broadcast(input, target, op);
  detail::check_loss_broadcast(input, var, op);
  detail::check_loss_broadcast(target, var, op);
  // torch reads var here (torch.any(var < 0)).
  if (any(var < 0).item<bool>())
    throw ValueError(std::string(op) + ": var has negative entry/entries (var " + detail::describe(var) + ")");
  const Tensor v = var.to(dt);
  // torch clamps a clone of var in place under no_grad: the value is eps below it, the gradient
  // passes to var unchanged. v - v.detach() is an exact 0 that carries it.
  const Tensor vc = where(v < eps, (v - v.detach()) + eps, v);
  Tensor loss = 0.5 * (log(vc) + square(input.to(dt) - target.to(dt)) / vc);
  if (full) loss = loss + 0.5 * std::log(2.0 * std::numbers::pi);
  return detail::fold_loss(loss, r);
}

KILN_ENTRY Tensor cosine_embedding_loss(const Tensor& input1_in, const Tensor& input2_in, const Tensor& target_in,
                                        double margin, const std::string& reduction) {
  const char* op = "cosine_embedding_loss";
  const Tensor input1 = detail::fp32_operand(input1_in), input2 = detail::fp32_operand(input2_in),
               target = detail::to_tensor(target_in);
  const decomp::Reduction r = detail::parse_reduction(reduction, op, input1);
  detail::check_same_device(input1.device(), target.device(), op);
  const std::string operands = "input1 " + detail::describe(input1) + ", input2 " + detail::describe(input2) +
                               ", target " + detail::describe(target);
  if (target.dim() > 1)
    throw ShapeError(std::string(op) + ": 0D or 1D target tensor expected, multi-target not supported; got " +
                     operands);
  const std::int64_t want = target.dim() + 1;
  if (input1.dim() != want || input2.dim() != want)
    throw ShapeError(std::string(op) + ": a " + std::to_string(target.dim()) + "D target expects " +
                     std::to_string(want) + "D inputs; got " + operands);
  const DType dt = detail::composite_loss_dtype({input1, input2}, op);
  detail::check_loss_broadcast(input1, input2, op);
  const Tensor x1 = input1.to(dt), x2 = input2.to(dt);
  const Axes along{target.dim()};
  // torch's EPSILON is the float 1e-12, in every dtype.
  const double epsilon = static_cast<double>(1e-12f);
  const Tensor cos = sum(x1 * x2, along) / sqrt((sum(x1 * x1, along) + epsilon) * (sum(x2 * x2, along) + epsilon));
  detail::check_loss_broadcast(cos, target, op);
  const Tensor loss = where(target == 1, 1.0 - cos, 0.0) + where(target == -1, clamp_min(cos - margin, 0.0), 0.0);
  return detail::fold_loss(loss, r);
}

KILN_ENTRY Tensor pairwise_distance(const Tensor& x1, const Tensor& x2, double p, double eps, bool keepdim) {
  return detail::pairwise_distance_of(x1, x2, p, eps, keepdim, "pairwise_distance");
}

KILN_ENTRY Tensor triplet_margin_loss(const Tensor& anchor_in, const Tensor& positive_in, const Tensor& negative_in,
                                      double margin, double p, double eps, bool swap, const std::string& reduction) {
  const char* op = "triplet_margin_loss";
  const Tensor anchor = detail::to_tensor(anchor_in), positive = detail::to_tensor(positive_in),
               negative = detail::to_tensor(negative_in);
  const decomp::Reduction r = detail::parse_reduction(reduction, op, anchor);
  detail::require_same_rank({anchor, positive, negative}, {"anchor", "positive", "negative"}, op);
  const Tensor d_pos = detail::pairwise_distance_of(anchor, positive, p, eps, false, op);
  Tensor d_neg = detail::pairwise_distance_of(anchor, negative, p, eps, false, op);
  if (swap) d_neg = minimum(d_neg, detail::pairwise_distance_of(positive, negative, p, eps, false, op));
  return detail::fold_loss(clamp_min(margin + d_pos - d_neg, 0.0), r);
}

KILN_ENTRY Tensor multilabel_soft_margin_loss(const Tensor& input_in, const Tensor& target_in, const Tensor& weight,
                                              const std::string& reduction) {
  const char* op = "multilabel_soft_margin_loss";
  const Tensor x = detail::to_tensor(input_in), t = detail::to_tensor(target_in);
  const decomp::Reduction r = detail::parse_reduction(reduction, op, x);
  detail::check_same_device(x.device(), t.device(), op);
  if (!is_floating(x.dtype()) || t.dtype() == DType::Bool)
    throw DTypeError(std::string(op) +
                     ": expected a floating point input and a non-bool target (torch computes 1 - "
                     "target), got input " +
                     detail::describe(x) + " and target " + detail::describe(t));
  if (x.dim() == 0)
    throw ShapeError(std::string(op) + ": the input needs a class dim (its last), got " + detail::describe(x));
  detail::check_loss_broadcast(x, t, op);
  Tensor loss = -(t * logsigmoid(x) + (1 - t) * logsigmoid(-x));
  if (weight.defined()) {
    detail::check_same_device(x.device(), weight.device(), op);
    detail::check_loss_broadcast(loss, weight, op);
    loss = loss * weight;
  }
  // torch sums over input's last dim counted from the front (loss.sum(input.dim() - 1)), even
  // where a target of higher rank gave the loss more dims.
  const std::int64_t class_dim = x.dim() - 1;
  loss = sum(loss, Axes{class_dim}) / static_cast<double>(x.shape()[class_dim]);
  return detail::fold_loss(loss, r);
}

KILN_ENTRY Tensor multi_margin_loss(const Tensor& input_in, const Tensor& target_in, std::int64_t p, double margin,
                                    const Tensor& weight, const std::string& reduction) {
  const char* op = "multi_margin_loss";
  const Tensor x = detail::fp32_operand(input_in), t = detail::to_tensor(target_in);
  const decomp::Reduction r = detail::parse_reduction(reduction, op, x);
  if (p != 1 && p != 2)
    throw ValueError(std::string(op) + ": only p == 1 and p == 2 supported, got p " + std::to_string(p) + " (input " +
                     detail::describe(x) + ")");
  if (weight.defined() && weight.dim() != 1)
    throw ValueError(std::string(op) + ": weight must be one-dimensional, got " + detail::describe(weight));
  detail::require_float(x, op);
  const std::int64_t frames = x.dim() <= 1 ? 1 : x.shape()[0];
  const std::int64_t classes = x.dim() <= 1 ? x.numel() : x.shape()[1];
  if (!((x.dim() <= 1 && x.numel() != 0) || (x.dim() == 2 && x.shape()[1] != 0)))
    throw ShapeError(std::string(op) + ": expected a non-empty vector or matrix with optional 0-dim batch size, got " +
                     detail::describe(x));
  if (t.dim() > 1 || t.numel() != frames)
    throw ShapeError(std::string(op) + ": inconsistent target size, expected " + std::to_string(frames) +
                     " targets, got target " + detail::describe(t) + " for input " + detail::describe(x));
  if (weight.defined()) {
    detail::check_same_device(x.device(), weight.device(), op);
    if (weight.numel() != classes)
      throw ShapeError(std::string(op) + ": inconsistent weight size, expected " + std::to_string(classes) +
                       " weights, got " + detail::describe(weight) + " for input " + detail::describe(x));
    if (!is_floating(weight.dtype()))
      throw DTypeError(std::string(op) + ": weight must be floating point, got " + detail::describe(weight));
  }
  const Tensor rows_in = reshape(x, {frames, classes});
  const Tensor targets = reshape(t, {frames});
  if (targets.dtype() != DType::Int64 && targets.dtype() != DType::Int32)
    throw DTypeError(std::string(op) + ": target must be int64 class indices, got " + detail::describe(t));
  detail::check_same_device(x.device(), t.device(), op);
  // Targets already in host memory are checked here, as torch's CPU kernel does; others by the
  // gather that reads them, when the result is evaluated (reading them here would synchronise).
  if (targets.is_evaluated() && targets.device().is_cpu() && !detail::deferring_eval())
    for (std::int64_t v : targets.to_vector<std::int64_t>())
      if (v < 0 || v >= classes)
        throw IndexError(std::string(op) + ": target " + std::to_string(v) + " is out of range for " +
                         std::to_string(classes) + " classes (target " + detail::describe(t) + ", input " +
                         detail::describe(x) + ")");
  const Tensor t64 = targets.to(DType::Int64);
  const Tensor column = reshape(t64, {frames, 1});
  const Tensor picked = detail::gather_nodes(rows_in, column.node(), 1, ir::GatherSite::Gather);
  // torch's kernel: margin - x[y] + x[i], counted (and differentiated) only where it is > 0.
  const Tensor z = (margin - picked) + rows_in;
  Tensor h = where(z > 0.0, z, 0.0);
  if (p == 2) h = h * h;
  // torch has no derivative for weight: it gets none here either.
  if (weight.defined()) h = h * reshape(index_select(weight.to(x.dtype()).detach(), 0, t64), {frames, 1});
  const Tensor others = reshape(arange(classes, DType::Int64, x.device()), {1, classes}) != column;
  const Tensor rows = sum(where(others, h, 0.0), Axes{1}) / static_cast<double>(classes);
  // A 0-dim target (one row) gives a 0-dim loss.
  return detail::fold_loss(t.dim() == 0 ? reshape(rows, Shape{}) : rows, r);
}

}  // namespace kiln
