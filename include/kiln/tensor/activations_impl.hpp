#pragma once
// The definitions of the activation functions (tensor/activations.hpp). Header-only mode includes
// them from that header (KILN_ENTRY is `inline`); compiled mode compiles them once into
// kiln::kiln_compiled (src/kiln_compiled.cpp), so users' translation units parse the declarations
// only.
#include <cstdint>
#include <string>

#include "kiln/tensor/activations.hpp"
#include "kiln/tensor/autograd.hpp"

namespace kiln {
namespace detail {

/// The floating input of one of torch's native activation kernels, in the dtype it computes in
/// (float32 for float16 and bfloat16, torch's opmath); DTypeError naming `op` otherwise.
KILN_ENTRY Tensor activation_operand(const Tensor& x, const char* op) {
  require_float(x, op);
  return x.dtype() == DType::Float16 || x.dtype() == DType::BFloat16 ? x.to(DType::Float32) : x;
}

/// `y` (computed in activation_operand's dtype) in the input's dtype.
KILN_ENTRY Tensor activation_result(const Tensor& y, const Tensor& x) {
  return y.dtype() == x.dtype() ? y : y.to(x.dtype());
}

/// DTypeError naming `op` for a bool input (torch's composites and clamp refuse bools).
KILN_ENTRY void refuse_bool(const Tensor& x, const char* op) {
  if (x.dtype() == DType::Bool)
    throw DTypeError(std::string(op) + ": not supported for bool tensors, got " + describe(x));
}

/// torch's elu kernel: x <= 0 ? expm1(x * input_scale) * alpha * scale : x * scale, with the
/// coefficients multiplied in the computing dtype as torch's (float32's alpha * scale for float32).
KILN_ENTRY Tensor elu_kernel(const Tensor& input, double alpha, double scale, double input_scale, const char* op) {
  const Tensor x = activation_operand(input, op);
  const double negcoef = x.dtype() == DType::Float64
                             ? alpha * scale
                             : static_cast<double>(static_cast<float>(alpha) * static_cast<float>(scale));
  const Tensor neg = x <= 0.0;
  // The negative branch reads 0 where it is not taken: expm1(+inf) there would be 0 * inf in
  // the gradient.
  const Tensor xn = where(neg, x, 0.0);
  return activation_result(where(neg, expm1(xn * input_scale) * negcoef, x * scale), input);
}

}  // namespace detail

KILN_ENTRY Tensor leaky_relu(const Tensor& input, double negative_slope) {
  const Tensor x = detail::activation_operand(input, "leaky_relu");
  return detail::activation_result(where(x > 0.0, x, x * negative_slope), input);
}

KILN_ENTRY Tensor elu(const Tensor& x, double alpha) { return detail::elu_kernel(x, alpha, 1.0, 1.0, "elu"); }

KILN_ENTRY Tensor selu(const Tensor& x) {
  return detail::elu_kernel(x, 1.6732632423543772848170429916717, 1.0507009873554804934193349852946, 1.0, "selu");
}

KILN_ENTRY Tensor celu(const Tensor& x, double alpha) {
  if (alpha == 0.0) throw ValueError("celu: alpha cannot be 0 (it divides x), got input " + detail::describe(x));
  return detail::elu_kernel(x, alpha, 1.0, 1.0 / alpha, "celu");
}

KILN_ENTRY Tensor softplus(const Tensor& input_in, double beta, double threshold) {
  // On torch's autocast float32 list: a float32 result under autocast.
  const Tensor input = detail::autocast_cast(input_in, detail::AutocastClass::Fp32);
  const Tensor x = detail::activation_operand(input, "softplus");
  const Tensor linear = x * beta > threshold;
  const Tensor xs = where(linear, 0.0, x);  // exp(beta x) only where it is taken
  return detail::activation_result(where(linear, x, log1p(exp(xs * beta)) / beta), input);
}

KILN_ENTRY Tensor mish(const Tensor& input) {
  const Tensor x = detail::activation_operand(input, "mish");
  // torch's tanh(log1p(exp(x))); above 20 that tanh is 1 in float64 as in float32, and softplus
  // is taken as x, so exp(x) never overflows into the gradient as 0 * inf.
  const Tensor big = x > 20.0;
  const Tensor xs = where(big, 0.0, x);
  return detail::activation_result(x * tanh(where(big, x, log1p(exp(xs)))), input);
}

KILN_ENTRY Tensor hardtanh(const Tensor& x, double min_val, double max_val) {
  detail::refuse_bool(x, "hardtanh");
  if (min_val > max_val)
    throw ValueError("hardtanh: min_val cannot be greater than max_val, got min_val " + std::to_string(min_val) +
                     ", max_val " + std::to_string(max_val) + " for input " + detail::describe(x));
  // An integer tensor keeps its dtype, the bounds cast to it (truncated), as torch's kernel.
  if (!is_floating(x.dtype()))
    return clamp(x, static_cast<std::int64_t>(min_val), static_cast<std::int64_t>(max_val)).to(x.dtype());
  // torch's hardtanh_backward passes the gradient strictly inside (min_val, max_val) and at NaN
  // (clamp's includes the bounds and excludes NaN): the bounds are constants where reached.
  return where(x <= min_val, min_val, where(x >= max_val, max_val, x));
}

KILN_ENTRY Tensor relu6(const Tensor& x) {
  detail::refuse_bool(x, "relu6");
  return hardtanh(x, 0.0, 6.0);
}

KILN_ENTRY Tensor hardsigmoid(const Tensor& input) {
  const Tensor x = detail::activation_operand(input, "hardsigmoid");
  // Inside (-3, 3): (x + 3) / 6 with torch's gradient, float32's 1/6 in every dtype (its backward
  // multiplies by the float constant 1.0f / 6.0f): s * c plus the detached (s / 6 - s * c), which
  // is exact (the two are within a factor 2), so the value is s / 6 to the bit. Elsewhere (0, 1
  // or NaN) torch's value without a gradient, as torch's backward gives none outside or at NaN.
  const double sixth = static_cast<double>(1.0f / 6.0f);
  const Tensor inside = logical_and(x > -3.0, x < 3.0);
  const Tensor s = where(inside, x, 0.0) + 3.0;
  const Tensor in_value = s * sixth + (s / 6.0 - s * sixth).detach();
  const Tensor outside = (clamp(x + 3.0, 0.0, 6.0) / 6.0).detach();
  return detail::activation_result(where(inside, in_value, outside), input);
}

KILN_ENTRY Tensor hardswish(const Tensor& input) {
  const Tensor x = detail::activation_operand(input, "hardswish");
  // torch's x * min(max(x + 3, 0), 6) / 6 written per branch of its backward: at and below -3
  // x * 0 / 6 (gradient 0; -0 and NaN at -inf as torch), inside x * (x + 3) / 6, at and above
  // 3 and at NaN x * 6 / 6 (gradient 1; not x itself, which differs in the last bit).
  const Tensor inside = logical_and(x > -3.0, x < 3.0);
  const Tensor xi = where(inside, x, 0.0);
  const Tensor outside = where(x <= -3.0, x * 0.0 / 6.0, x * 6.0 / 6.0);
  return detail::activation_result(where(inside, xi * (xi + 3.0) / 6.0, outside), input);
}

KILN_ENTRY Tensor logsigmoid(const Tensor& input) {
  const Tensor x = detail::activation_operand(input, "logsigmoid");
  // min(x, 0) - log1p(exp(-|x|)) per branch: x - log1p(exp(x)) below 0, 0 - log1p(exp(-x))
  // from 0 (gradient 1/2 at 0, as torch's backward), each branch reading 0 where not taken.
  const Tensor neg = x < 0.0;
  const Tensor xn = where(neg, x, 0.0), xp = where(neg, 0.0, x);
  return detail::activation_result(where(neg, xn - log1p(exp(xn)), 0.0 - log1p(exp(-xp))), input);
}

KILN_ENTRY Tensor softsign(const Tensor& x) {
  detail::refuse_bool(x, "softsign");
  return x / (abs(x) + 1);
}

KILN_ENTRY Tensor tanhshrink(const Tensor& x) {
  detail::refuse_bool(x, "tanhshrink");
  return x - tanh(x);
}

KILN_ENTRY Tensor softshrink(const Tensor& input, double lambd) {
  if (lambd < 0)
    throw ValueError("softshrink: lambda must be greater or equal to 0, but found to be " + std::to_string(lambd) +
                     " (input " + detail::describe(input) + ")");
  const Tensor x = detail::activation_operand(input, "softshrink");
  // x - (+-lambd) outside [-lambd, lambd] (x - (-lambd) is x + lambd to the bit); NaN falls
  // outside too and keeps its gradient, as torch's backward; inside, the constant 0 has none.
  const Tensor inside = logical_and(x >= -lambd, x <= lambd);
  return detail::activation_result(where(inside, 0.0, x - where(x > lambd, lambd, -lambd)), input);
}

KILN_ENTRY Tensor hardshrink(const Tensor& x, double lambd) {
  detail::require_float(x, "hardshrink");
  return where(logical_and(x >= -lambd, x <= lambd), 0.0, x);
}

}  // namespace kiln
