#pragma once
// The polygamma functions of orders 0 and 1 (digamma and trigamma) as graphs of primitives. No
// C library has them, so they are built here from the series PyTorch's kernels evaluate (the
// reflection formula below 0 / 0.5, the recurrence to a large argument, the asymptotic series
// there), with fixed trip counts instead of loops, so that a kernel computes them branch-free.
// Both the front end's digamma and the gradient rules (lgamma's derivative is digamma,
// digamma's trigamma) build from here: this sits at the graph level, below both.
#include <limits>
#include <numbers>

#include "kiln/ir/builder.hpp"

namespace kiln::ir::special {

namespace special_detail {
inline NodePtr lit(double v, const NodePtr& like) { return constant(v, like->dtype, like->shape, like->device); }
inline NodePtr add(const NodePtr& a, const NodePtr& b) { return binary(Op::Add, a, b); }
inline NodePtr sub(const NodePtr& a, const NodePtr& b) { return binary(Op::Sub, a, b); }
inline NodePtr mul(const NodePtr& a, const NodePtr& b) { return binary(Op::Mul, a, b); }
inline NodePtr div(const NodePtr& a, const NodePtr& b) { return binary(Op::Div, a, b); }
inline NodePtr lt(const NodePtr& a, double v) { return binary(Op::Lt, a, lit(v, a)); }
inline NodePtr eq(const NodePtr& a, const NodePtr& b) { return binary(Op::Eq, a, b); }
}  // namespace special_detail

/// digamma(x) = d/dx log Gamma(x) of a floating node, in its dtype: -inf at +0 and +inf at -0,
/// NaN at the negative integers and -inf (the poles), PyTorch's values elsewhere. Below 0 the
/// reflection psi(x) = psi(1 - x) - pi / tan(pi r), r the exact distance to the nearest integer;
/// then up to ten steps of psi(y) = psi(y + 1) - 1 / y until y >= 10, where the
/// asymptotic series log y - 1 / 2y - sum B_2k / (2k y^2k) to the 14th power is within a few
/// ulps of double precision.
inline NodePtr digamma(const NodePtr& x) {
  using namespace special_detail;
  const NodePtr zero = lit(0.0, x);
  const NodePtr negative = lt(x, 0.0);
  const NodePtr y = where(negative, sub(lit(1.0, x), x), x);
  // The recurrence: step k runs while y + k < 10, so the argument ends at y + (steps taken).
  NodePtr shift_sum = zero, z = y;
  for (int k = 0; k < 10; ++k) {
    const NodePtr yk = add(y, lit(static_cast<double>(k), x));
    const NodePtr active = lt(yk, 10.0);
    shift_sum = add(shift_sum, where(active, div(lit(1.0, x), yk), zero));
    z = where(active, add(yk, lit(1.0, x)), z);
  }
  // B_2k / 2k for k = 7 .. 1, Horner in 1 / z^2.
  static constexpr double kSeries[] = {1.0 / 12,  -691.0 / 32760, 1.0 / 132, -1.0 / 240,
                                       1.0 / 252, -1.0 / 120,     1.0 / 12};
  const NodePtr z2 = div(lit(1.0, x), mul(z, z));
  NodePtr poly = lit(kSeries[0], x);
  for (int i = 1; i < 7; ++i) poly = add(mul(poly, z2), lit(kSeries[i], x));
  const NodePtr tail = mul(z2, poly);
  const NodePtr at_y = sub(sub(sub(unary(Op::Log, z), div(lit(0.5, x), z)), tail), shift_sum);
  // Reflection for x < 0: pi / tan(pi r) with r = x - round(x) in [-1/2, 1/2], which has tan(pi
  // x)'s value (its period is 1) and keeps tan's argument small near the poles, where tan of a
  // multiple of pi would lose the argument's last bits.
  const NodePtr r = sub(x, unary(Op::Round, x));
  const NodePtr reflected = sub(at_y, div(lit(std::numbers::pi, x), unary(Op::Tan, mul(lit(std::numbers::pi, x), r))));
  const NodePtr value = where(negative, reflected, at_y);
  const NodePtr nan = lit(std::numeric_limits<double>::quiet_NaN(), x);
  // The poles: +-0 give -+inf (the sign of -x, as torch's copysign(inf, -x)); negative integers NaN.
  const NodePtr at_zero = binary(Op::Copysign, lit(std::numeric_limits<double>::infinity(), x), unary(Op::Neg, x));
  return where(eq(x, zero), at_zero, where(binary(Op::And, negative, eq(x, unary(Op::Floor, x))), nan, value));
}

/// trigamma(x) = d/dx digamma(x) of a floating node, in its dtype (PyTorch's trigamma): below
/// 0.5 the reflection psi1(x) = pi^2 / sin^2(pi x) - psi1(1 - x), six steps of psi1(y) =
/// psi1(y + 1) + 1 / y^2, then the asymptotic series 1/y + 1/2y^2 + sum B_2k / y^(2k+1) to
/// B_10 (two terms beyond PyTorch's, which stops at B_6 and is good to about 1e-9).
inline NodePtr trigamma(const NodePtr& x) {
  using namespace special_detail;
  const NodePtr reflect = lt(x, 0.5);
  NodePtr y = where(reflect, sub(lit(1.0, x), x), x);
  NodePtr sum = lit(0.0, x);
  for (int k = 0; k < 6; ++k) {
    sum = add(sum, div(lit(1.0, x), mul(y, y)));
    y = add(y, lit(1.0, x));
  }
  const NodePtr iyy = div(lit(1.0, x), mul(y, y));
  // (1 + 1/2y + iyy (1/6 - iyy (1/30 - iyy (1/42 - iyy (1/30 - iyy 5/66))))) / y
  NodePtr inner = sub(lit(1.0 / 30, x), mul(iyy, lit(5.0 / 66, x)));
  inner = sub(lit(1.0 / 42, x), mul(iyy, inner));
  inner = sub(lit(1.0 / 30, x), mul(iyy, inner));
  inner = sub(lit(1.0 / 6, x), mul(iyy, inner));
  const NodePtr series = div(add(add(lit(1.0, x), div(lit(0.5, x), y)), mul(iyy, inner)), y);
  const NodePtr at_y = add(sum, series);
  const NodePtr s = unary(Op::Sin, mul(lit(std::numbers::pi, x), x));
  const NodePtr pole = div(lit(std::numbers::pi * std::numbers::pi, x), mul(s, s));
  return where(reflect, sub(pole, at_y), at_y);
}

}  // namespace kiln::ir::special
