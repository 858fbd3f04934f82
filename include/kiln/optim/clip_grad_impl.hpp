#pragma once
// The definitions of clip_grad_norm_ and clip_grad_value_ (optim/clip_grad.hpp). Header-only mode includes them from
// that header (KILN_ENTRY is `inline`); compiled mode compiles them once into kiln::kiln_compiled
// (src/kiln_compiled.cpp), so users' translation units parse the declarations only.
#include "kiln/optim/clip_grad.hpp"

namespace kiln::nn::utils {
namespace detail {

KILN_ENTRY DType promote_floating(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::Float64 || b == DType::Float64) return DType::Float64;
  return DType::Float32;  // f32 with a half type, or f16 with bf16
}

KILN_ENTRY ir::NodePtr reduce_all(ir::Op op, const ir::NodePtr& x) {
  ir::NodePtr flat = ir::reshape(x, Shape{x->numel()});
  return ir::reshape(ir::reduce(op, flat, {0}), Shape{});
}

}  // namespace detail
}  // namespace kiln::nn::utils

namespace kiln::nn::utils {

KILN_ENTRY Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type,
                                  bool error_if_nonfinite) {
  namespace od = kiln::optim::detail;
  const double inf = std::numeric_limits<double>::infinity();
  if (!(norm_type > 0 || norm_type == 0 || norm_type == -inf))
    throw ValueError("clip_grad_norm_: norm_type must be positive, 0, inf or -inf, got " + std::to_string(norm_type));
  kiln::detail::before_data_read("clip_grad_norm_()", std::source_location::current());
  kiln::detail::SuspendTrace eager;
  NoGradGuard off;
  std::vector<ir::NodePtr> grads = od::defined_grads(params);
  if (grads.empty()) return zeros(Shape{}, DType::Float32, params.empty() ? Device::cpu() : params[0].device());
  const Device device = grads.front()->device;
  DType out = grads.front()->dtype;
  for (const ir::NodePtr& g : grads) {
    kiln::detail::check_same_device(device, g->device, "clip_grad_norm_");
    out = detail::promote_floating(out, g->dtype);
  }
  const DType cd = od::opmath(out);
  const std::vector<ir::NodePtr> pieces = od::coalesce(grads);
  ir::NodePtr total;
  // torch takes the norm of the per-gradient norms. For every other order that is the norm of
  // all the elements together (so coalesced pieces give it); for order 0 it counts the
  // gradients that hold a nonzero (or NaN), so it is taken per gradient.
  for (const ir::NodePtr& g : norm_type == 0 ? grads : std::vector<ir::NodePtr>{}) {
    if (g->numel() == 0) continue;
    ir::NodePtr x = ir::cast(ir::reshape(g, Shape{g->numel()}), cd);
    ir::NodePtr nonzero = ir::cast(ir::binary(ir::Op::Ne, x, ir::constant(0.0, cd, x->shape, device)), cd);
    ir::NodePtr part = detail::reduce_all(ir::Op::ReduceMax, nonzero);
    total = total ? od::add(total, part) : part;
  }
  for (const ir::NodePtr& piece : norm_type == 0 ? std::vector<ir::NodePtr>{} : pieces) {
    if (piece->numel() == 0) continue;
    ir::NodePtr x = ir::cast(ir::reshape(piece, Shape{piece->numel()}), cd);  // a view: one loop
    ir::NodePtr part;
    if (norm_type == inf || norm_type == -inf) {
      part = detail::reduce_all(norm_type > 0 ? ir::Op::ReduceMax : ir::Op::ReduceMin, ir::unary(ir::Op::Abs, x));
      total = total ? ir::binary(norm_type > 0 ? ir::Op::Maximum : ir::Op::Minimum, total, part) : part;
      continue;
    }
    if (norm_type == 2)
      part = od::mul(x, x);
    else
      part = ir::binary(ir::Op::Pow, ir::unary(ir::Op::Abs, x), ir::constant(norm_type, cd, x->shape, device));
    part = detail::reduce_all(ir::Op::ReduceSum, part);
    total = total ? od::add(total, part) : part;
  }
  if (!total) total = ir::constant(0.0, cd, Shape{}, device);
  if (norm_type == 2)
    total = od::sqrt(total);
  else if (norm_type > 0 && norm_type != inf)
    total = ir::binary(ir::Op::Pow, total, ir::constant(1.0 / norm_type, cd, Shape{}, device));
  // The norm and the factor in one graph; the factor's max_norm is a number in memory.
  ir::NodePtr limit = od::scalars_tensor({max_norm}, cd, device);
  ir::NodePtr coef =
      ir::binary(ir::Op::Minimum,
                 od::div(od::scalar_view(limit, 0, Shape{}), od::add(total, ir::constant(1e-6, cd, Shape{}, device))),
                 ir::constant(1.0, cd, Shape{}, device));
  kiln::detail::evaluate({total, coef});
  if (error_if_nonfinite) {
    const double v = Tensor(total).item<double>();
    if (!std::isfinite(v))
      throw ValueError("clip_grad_norm_: the total norm of order " + std::to_string(norm_type) +
                       " for gradients from `parameters` is non-finite (" + std::to_string(v) +
                       "), so it cannot be clipped. To disable this error and scale the gradients by the "
                       "non-finite norm anyway, set error_if_nonfinite=false");
  }
  std::vector<ir::NodePtr> values;
  for (const ir::NodePtr& piece : pieces)
    values.push_back(ir::cast(od::mul(ir::cast(piece, cd), od::scalar_view(coef, 0, piece->shape)), piece->dtype));
  kiln::detail::evaluate_into_many(values, pieces);
  return Tensor(ir::cast(total, out)).eval();
}

KILN_ENTRY void clip_grad_value_(const std::vector<Tensor>& params, double clip_value) {
  namespace od = kiln::optim::detail;
  kiln::detail::before_data_read("clip_grad_value_()", std::source_location::current());
  kiln::detail::SuspendTrace eager;
  NoGradGuard off;
  const std::vector<ir::NodePtr> pieces = od::coalesce(od::defined_grads(params));
  std::vector<ir::NodePtr> values;
  for (const ir::NodePtr& piece : pieces) {
    const DType cd = od::opmath(piece->dtype);
    ir::NodePtr bounds = od::scalars_tensor({-clip_value, clip_value}, cd, piece->device);
    ir::NodePtr x = ir::cast(piece, cd);
    x = ir::binary(ir::Op::Minimum, ir::binary(ir::Op::Maximum, x, od::scalar_view(bounds, 0, x->shape)),
                   od::scalar_view(bounds, 1, x->shape));
    values.push_back(ir::cast(x, piece->dtype));
  }
  kiln::detail::evaluate_into_many(values, pieces);
}

}  // namespace kiln::nn::utils
