#pragma once
// Elementwise composites built from primitives that every backend already vectorises (exp,
// expm1, log, log1p, sqrt, floor, ceil, comparisons and selects): sign, trunc, the hyperbolic
// functions and their inverses, remainder, logical_xor. Each form is chosen for accuracy over
// the whole range (no cancellation near 0, no overflow before the result overflows), and keeps
// PyTorch's special values: NaN propagates, -0 stays -0 where the function is odd.
#include <cmath>
#include <limits>
#include <numbers>

#include "kiln/decomp/decompose.hpp"
#include "kiln/ir/special.hpp"

namespace kiln::decomp {

inline NodePtr asinh_value(const NodePtr& x);
inline NodePtr acosh_value(const NodePtr& x);
inline NodePtr atanh_value(const NodePtr& x);

namespace elementwise_detail {
inline NodePtr lt0(const NodePtr& x) { return ir::binary(Op::Lt, x, scalar_like(0.0, x)); }
inline NodePtr abs(const NodePtr& x) { return ir::unary(Op::Abs, x); }
/// An odd function's value from its value `r` at |x|: -r below 0, x itself at ±0 (keeps -0).
inline NodePtr odd(const NodePtr& x, const NodePtr& r) {
  return ir::where(lt0(x), ir::unary(Op::Neg, r), ir::where(ir::binary(Op::Eq, x, scalar_like(0.0, x)), x, r));
}
/// e^a / 2 for a >= 0, as (e^(a/2) / 2) e^(a/2): a/2 is exact and neither factor overflows
/// before the result does (exp(a - ln 2) would round a - ln 2 and lose ~5 bits near a = 60).
inline NodePtr half_exp(const NodePtr& a) {
  NodePtr h = ir::unary(Op::Exp, mul(a, scalar_like(0.5, a)));
  return mul(mul(h, scalar_like(0.5, a)), h);
}
/// Above this |x|, x * x overflows in `dtype` (f32: 2^64 is safe, f64: 2^500).
inline double square_limit(const NodePtr& x) { return x->dtype == DType::Float64 ? 0x1p500 : 0x1p60; }
}  // namespace elementwise_detail

/// torch.sign: 1, -1 or 0 in x's dtype (NaN gives 0, as PyTorch's CPU kernel: (0 < x) - (x < 0)).
inline NodePtr sign(const NodePtr& x) {
  if (x->dtype == DType::Bool) return x;
  NodePtr pos = ir::cast(ir::binary(Op::Gt, x, scalar_like(0.0, x)), x->dtype);
  NodePtr neg = ir::cast(elementwise_detail::lt0(x), x->dtype);
  NodePtr value = sub(pos, neg);
  // PyTorch's sign has a zero gradient (a backward gives zeros, not an error): a select that
  // never takes x carries it.
  if (!x->requires_grad) return value;
  return ir::where(ir::constant(0.0, DType::Bool, x->shape, x->device), x, value);
}

/// Rounds toward zero: ceil below 0 (so -0.5 gives -0), floor elsewhere; integers unchanged.
inline NodePtr trunc(const NodePtr& x) {
  if (!is_floating(x->dtype)) return x;
  return ir::where(elementwise_detail::lt0(x), ir::unary(Op::Ceil, x), ir::unary(Op::Floor, x));
}

/// sinh: (expm1(x) - expm1(-x)) / 2 below |x| = 1 (no cancellation), else e^|x|/2 - e^-|x|/2
/// (half_exp), finite up to the largest x whose sinh is.
inline NodePtr sinh(const NodePtr& x) {
  using namespace elementwise_detail;
  return in_compute_dtype(x, [](const NodePtr& v) {
    NodePtr a = abs(v);
    NodePtr small = mul(sub(ir::unary(Op::Expm1, a), ir::unary(Op::Expm1, ir::unary(Op::Neg, a))), scalar_like(0.5, v));
    NodePtr half_e = half_exp(a);
    NodePtr large = sub(half_e, div(scalar_like(0.25, v), half_e));
    NodePtr r = ir::where(ir::binary(Op::Lt, a, scalar_like(1.0, v)), small, large);
    return odd(v, r);
  });
}

/// cosh: e^|x|/2 + e^-|x|/2 (no cancellation anywhere), e^|x|/2 by half_exp.
inline NodePtr cosh(const NodePtr& x) {
  using namespace elementwise_detail;
  return in_compute_dtype(x, [](const NodePtr& v) {
    NodePtr half_e = half_exp(abs(v));
    return add(half_e, div(scalar_like(0.25, v), half_e));
  });
}

namespace elementwise_detail {
/// `value` (an inverse hyperbolic function of x) with PyTorch's gradient rule g * d(x), d
/// evaluated in x's compute dtype: the piecewise forms are not built to be differentiated
/// (|x| has no derivative at 0, and the untaken branches' terms would join in).
template <class D>
NodePtr with_derivative(const NodePtr& value, const NodePtr& x, D derivative) {
  return with_gradient(value, {x}, [x, derivative](const NodePtr&, const NodePtr& g) {
    NodePtr gx = in_compute_dtype(x, [&](const NodePtr& v) { return mul(ir::cast(g, v->dtype), derivative(v)); });
    return std::vector<NodePtr>{ir::cast(gx, x->dtype)};
  });
}
}  // namespace elementwise_detail

/// asinh: log1p(a + a^2 / (1 + sqrt(1 + a^2))) for a = |x| (exact near 0), log(a) + ln 2 where
/// a^2 would overflow; odd. Gradient g / sqrt(x^2 + 1), as PyTorch's.
inline NodePtr asinh(const NodePtr& x) {
  using namespace elementwise_detail;
  return with_derivative(asinh_value(x), x, [](const NodePtr& v) {
    return ir::unary(Op::Rsqrt, add(mul(v, v), scalar_like(1.0, v)));
  });
}

inline NodePtr asinh_value(const NodePtr& x) {
  using namespace elementwise_detail;
  return in_compute_dtype(x, [](const NodePtr& v) {
    NodePtr a = abs(v);
    NodePtr a2 = mul(a, a);
    NodePtr one = scalar_like(1.0, v);
    NodePtr core = ir::unary(Op::Log1p, add(a, div(a2, add(one, ir::unary(Op::Sqrt, add(one, a2))))));
    NodePtr big = add(ir::unary(Op::Log, a), scalar_like(std::numbers::ln2, v));
    NodePtr r = ir::where(ir::binary(Op::Gt, a, scalar_like(square_limit(v), v)), big, core);
    return odd(v, r);
  });
}

/// acosh: log1p(t + sqrt(t (t + 2))) with t = x - 1 (exact near 1), log(x) + ln 2 where the
/// product would overflow; NaN below 1. Gradient g / sqrt(x^2 - 1), as PyTorch's.
inline NodePtr acosh(const NodePtr& x) {
  using namespace elementwise_detail;
  return with_derivative(acosh_value(x), x, [](const NodePtr& v) {
    return ir::unary(Op::Rsqrt, sub(mul(v, v), scalar_like(1.0, v)));
  });
}

inline NodePtr acosh_value(const NodePtr& x) {
  using namespace elementwise_detail;
  return in_compute_dtype(x, [](const NodePtr& v) {
    NodePtr t = sub(v, scalar_like(1.0, v));
    NodePtr core = ir::unary(Op::Log1p, add(t, ir::unary(Op::Sqrt, mul(t, add(t, scalar_like(2.0, v))))));
    NodePtr big = add(ir::unary(Op::Log, v), scalar_like(std::numbers::ln2, v));
    NodePtr r = ir::where(ir::binary(Op::Gt, v, scalar_like(square_limit(v), v)), big, core);
    // Below 1 the product t (t + 2) is positive again for large negative x: NaN, not a value.
    return ir::where(ir::binary(Op::Lt, v, scalar_like(1.0, v)),
                     scalar_like(std::numeric_limits<double>::quiet_NaN(), v), r);
  });
}

/// atanh: (log1p(x) - log1p(-x)) / 2. The two terms have opposite signs (no cancellation near
/// 0), and near ±1 the small one of 1 ± x is exact inside log1p (a quotient (1+x)/(1-x) would
/// round there and lose a third of the bits); ±inf at ±1, NaN beyond, -0 stays -0.
inline NodePtr atanh(const NodePtr& x) {
  using namespace elementwise_detail;
  // Gradient g / (1 - x^2), as PyTorch's.
  return with_derivative(atanh_value(x), x, [](const NodePtr& v) {
    return div(scalar_like(1.0, v), sub(scalar_like(1.0, v), mul(v, v)));
  });
}

inline NodePtr atanh_value(const NodePtr& x) {
  return in_compute_dtype(x, [](const NodePtr& v) {
    NodePtr d = sub(ir::unary(Op::Log1p, v), ir::unary(Op::Log1p, ir::unary(Op::Neg, v)));
    return mul(d, scalar_like(0.5, v));
  });
}

/// digamma (torch.digamma): ir::special's series in x's compute dtype; PyTorch's gradient
/// trigamma(x) g, not the series' own derivative.
inline NodePtr digamma(const NodePtr& x) {
  using namespace elementwise_detail;
  return with_derivative(in_compute_dtype(x, [](const NodePtr& v) { return ir::special::digamma(v); }), x,
                         [](const NodePtr& v) { return ir::special::trigamma(v); });
}

/// erfinv (torch.erfinv): the inverse of erf on [-1, 1], +-inf at +-1, NaN outside, -0 kept.
/// Giles' single-precision polynomials in w = -log(1 - y^2) give the start (an asymptotic one
/// beyond their range); three Halley steps
/// then take the residual as erf(z) - a for a = |y| <= 0.5 and as (1 - a) - erfc(z) above, where
/// 1 - a is exact and erfc keeps the tail's digits (erf(z) - a would cancel them); the result
/// takes y's sign. PyTorch's gradient sqrt(pi)/2 exp(erfinv(y)^2), read from the result.
inline NodePtr erfinv(const NodePtr& y) {
  using namespace elementwise_detail;
  NodePtr value = in_compute_dtype(y, [](const NodePtr& v) {
    const NodePtr a = abs(v), one = scalar_like(1.0, v);
    const NodePtr w = detail::neg(ir::unary(Op::Log, mul(sub(one, a), add(one, a))));
    const NodePtr central = detail::horner(sub(w, scalar_like(2.5, v)),
                                           {1.50140941, 0.246640727, -0.00417768164, -0.00125372503, 0.00021858087,
                                            -4.39150654e-06, -3.5233877e-06, 3.43273939e-07, 2.81022636e-08});
    const NodePtr tail = detail::horner(sub(ir::unary(Op::Sqrt, w), scalar_like(3.0, v)),
                                        {2.83297682, 1.00167406, 0.00943887047, -0.0076224613, 0.00573950773,
                                         -0.00367342844, 0.00134934322, 0.000100950558, -0.000200214257});
    // Beyond the float range the polynomials were fitted on (w >= 16, 1 - a below about 1e-7),
    // the start solves erfc(z) ~ e^-z^2 / (z sqrt(pi)) once: z^2 = t - log(pi t) / 2, t = -log(1 - a).
    const NodePtr t = detail::neg(ir::unary(Op::Log, sub(one, a)));
    const NodePtr far = ir::unary(
        Op::Sqrt, sub(t, mul(scalar_like(0.5, v), ir::unary(Op::Log, mul(scalar_like(std::numbers::pi, v), t)))));
    NodePtr z = ir::where(detail::cmp(Op::Lt, w, 5.0), mul(central, a),
                          ir::where(detail::cmp(Op::Lt, w, 16.0), mul(tail, a), far));
    const NodePtr near_zero = detail::cmp(Op::Le, a, 0.5);
    for (int step = 0; step < 3; ++step) {
      // Halley's step for f(z) = erf(z) - a, whose f'' = -2 z f': z - (f / f') / (1 + z f / f'),
      // cubic where the far start is off by hundredths (float64's residuals then within 5e-15).
      const NodePtr residual =
          ir::where(near_zero, sub(ir::unary(Op::Erf, z), a), sub(sub(one, a), ir::unary(Op::Erfc, z)));
      const NodePtr slope = mul(scalar_like(2.0 / std::sqrt(std::numbers::pi), v), detail::exp(detail::neg(mul(z, z))));
      const NodePtr newton = div(residual, slope);
      z = sub(z, div(newton, add(one, mul(z, newton))));
    }
    const NodePtr inf = scalar_like(std::numeric_limits<double>::infinity(), v);
    const NodePtr nan = scalar_like(std::numeric_limits<double>::quiet_NaN(), v);
    z = ir::where(detail::cmp(Op::Eq, a, 1.0), inf, ir::where(detail::cmp(Op::Gt, a, 1.0), nan, z));
    return ir::binary(Op::Copysign, z, v);
  });
  return with_gradient(value, {y}, [y](const NodePtr& out, const NodePtr& g) {
    NodePtr gy = in_compute_dtype(y, [&](const NodePtr& v) {
      const NodePtr r = ir::cast(out, v->dtype);
      return mul(mul(ir::cast(g, v->dtype), scalar_like(std::sqrt(std::numbers::pi) / 2, v)), detail::exp(mul(r, r)));
    });
    return std::vector<NodePtr>{ir::cast(gy, y->dtype)};
  });
}

/// Python's modulus (torch.remainder): fmod, moved by one divisor when the signs of the result
/// and the divisor differ, so the result takes the divisor's sign. Exact (no a - floor(a/b)*b).
inline NodePtr remainder(const NodePtr& a, const NodePtr& b) {
  using namespace elementwise_detail;
  NodePtr r = ir::binary(Op::Fmod, a, b);
  NodePtr zero = scalar_like(0.0, r);
  NodePtr differ = ir::binary(Op::And, ir::binary(Op::Ne, r, zero), ir::binary(Op::Ne, lt0(r), lt0(b)));
  return ir::where(differ, add(r, b), r);
}

/// logical_xor: true where exactly one of a, b is nonzero.
inline NodePtr logical_xor(const NodePtr& a, const NodePtr& b) {
  NodePtr za = ir::binary(Op::Ne, a, scalar_like(0.0, a));
  NodePtr zb = ir::binary(Op::Ne, b, scalar_like(0.0, b));
  return ir::binary(Op::Ne, za, zb);
}

}  // namespace kiln::decomp
