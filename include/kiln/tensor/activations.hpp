#pragma once
// The activation functions of torch.nn.functional that are not kiln primitives (relu, silu,
// sigmoid, tanh and gelu are, in tensor/ops.hpp): leaky_relu, elu, selu, celu, softplus, mish,
// hardtanh, relu6, hardsigmoid, hardswish, logsigmoid, softsign, tanhshrink, softshrink, hardshrink. Each is
// a composite of kiln's ops written so that its value, its gradient at the kinks (the branch torch's
// backward takes at a tie) and at NaN and ±inf are PyTorch's: a branch that is not taken reads
// a harmless operand (`where(cond, x, 0)`), so its inf or NaN does not reach the gradient as
// 0 * inf. Dtypes as torch's kernels: the float16 and bfloat16 inputs of torch's native kernels
// compute in float32 and round once; integer and bool inputs are a DTypeError except where
// torch takes them (hardtanh and relu6 keep integer dtypes; softsign and tanhshrink, torch's
// Python composites, give float32).
#include "kiln/core/linkage.hpp"
#include "kiln/tensor/functions.hpp"
#include "kiln/tensor/ops.hpp"

namespace kiln {

/// x where x > 0, else negative_slope * x (torch.nn.functional.leaky_relu); the gradient at 0
/// (and at NaN) is negative_slope, as torch's. Floating inputs only.
KILN_ENTRY Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01);

/// x where x > 0, else alpha * (exp(x) - 1) (torch.nn.functional.elu); the gradient at 0 is
/// alpha (torch's x <= 0 branch). Floating inputs only.
KILN_ENTRY Tensor elu(const Tensor& x, double alpha = 1.0);

/// scale * elu(x, alpha) with torch's constants alpha = 1.6732632423543772, scale =
/// 1.0507009873554805 (torch.nn.functional.selu). Floating inputs only.
KILN_ENTRY Tensor selu(const Tensor& x);

/// x where x > 0, else alpha * (exp(x / alpha) - 1) (torch.nn.functional.celu); alpha 0 is a
/// ValueError (torch raises). Floating inputs only.
KILN_ENTRY Tensor celu(const Tensor& x, double alpha = 1.0);

/// log(1 + exp(beta x)) / beta, or x where beta x > threshold (torch.nn.functional.softplus).
/// Floating inputs only.
KILN_ENTRY Tensor softplus(const Tensor& x, double beta = 1.0, double threshold = 20.0);

/// x * tanh(softplus(x)) (torch.nn.functional.mish); above 20, where tanh(softplus(x)) is 1,
/// softplus is taken as x so that exp never overflows into the gradient (torch's backward is
/// finite there too). Floating inputs only.
KILN_ENTRY Tensor mish(const Tensor& x);

/// clamp(x, min_val, max_val) (torch.nn.functional.hardtanh): no gradient at or beyond a bound,
/// NaN passes through with gradient 1. Integer inputs keep their dtype, the bounds truncated to
/// integers as torch casts them; bool inputs are a DTypeError and min_val > max_val a
/// ValueError, as torch's.
KILN_ENTRY Tensor hardtanh(const Tensor& x, double min_val = -1.0, double max_val = 1.0);

/// hardtanh(x, 0, 6) (torch.nn.functional.relu6): no gradient at 0 or 6; integers keep their
/// dtype.
KILN_ENTRY Tensor relu6(const Tensor& x);

/// min(max(x + 3, 0), 6) / 6 (torch.nn.functional.hardsigmoid): gradient 1/6 strictly inside
/// (-3, 3) (float32's 1/6 in every dtype, the constant of torch's backward), 0 elsewhere, NaN
/// included. Floating inputs only.
KILN_ENTRY Tensor hardsigmoid(const Tensor& x);

/// x * min(max(x + 3, 0), 6) / 6 (torch.nn.functional.hardswish): gradient 0 at and below -3,
/// x / 3 + 1/2 inside, 1 at and above 3 and at NaN, as torch's backward. Floating inputs only.
KILN_ENTRY Tensor hardswish(const Tensor& x);

/// log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|)), finite for every finite x
/// (torch.nn.functional.logsigmoid). Floating inputs only.
KILN_ENTRY Tensor logsigmoid(const Tensor& x);

/// x / (1 + |x|) (torch.nn.functional.softsign, torch's composite: integers give float32, a
/// bool is a DTypeError).
KILN_ENTRY Tensor softsign(const Tensor& x);

/// x - tanh(x) (torch.nn.functional.tanhshrink, torch's composite: integers give float32, a
/// bool is a DTypeError).
KILN_ENTRY Tensor tanhshrink(const Tensor& x);

/// x - lambd above lambd, x + lambd below -lambd, 0 between (torch.nn.functional.softshrink): no
/// gradient for |x| <= lambd (the bounds included), 1 elsewhere and at NaN, which passes through,
/// as torch's shrink backward. A negative lambd is a ValueError; floating inputs only (float16
/// and bfloat16 compute in float32 and round once, as torch's CPU kernel).
KILN_ENTRY Tensor softshrink(const Tensor& x, double lambd = 0.5);

/// 0 for |x| <= lambd, else x (torch.nn.functional.hardshrink), compared in x's own dtype (lambd
/// rounded to it, as torch's kernel); gradient as softshrink's. Floating inputs only.
KILN_ENTRY Tensor hardshrink(const Tensor& x, double lambd = 0.5);

}  // namespace kiln

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/tensor/activations_impl.hpp"
#endif
