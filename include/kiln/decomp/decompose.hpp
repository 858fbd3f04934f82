#pragma once
// Every composite op lowered to primitives, in one place. Inputs are graph nodes whose shapes
// and dtypes the front end has already checked; 16-bit floats are computed in f32 and rounded
// once at the end, as PyTorch's kernels do.
#include <cmath>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <numbers>
#include <vector>

#include "kiln/ir/builder.hpp"

namespace kiln::decomp {

using ir::NodePtr;
using ir::Op;

/// A scalar constant shaped and typed like `like`.
inline NodePtr scalar_like(double v, const NodePtr& like) {
  return ir::constant(v, like->dtype, like->shape, like->device);
}

inline NodePtr add(const NodePtr& a, const NodePtr& b) { return ir::binary(Op::Add, a, b); }
inline NodePtr sub(const NodePtr& a, const NodePtr& b) { return ir::binary(Op::Sub, a, b); }
inline NodePtr mul(const NodePtr& a, const NodePtr& b) { return ir::binary(Op::Mul, a, b); }
inline NodePtr div(const NodePtr& a, const NodePtr& b) { return ir::binary(Op::Div, a, b); }

/// Repeats `x` (same rank, size-1 dims) up to `shape`.
inline NodePtr expand(const NodePtr& x, const Shape& shape) {
  NodePtr r = x;
  if (r->shape.size() < shape.size()) {
    Shape s(shape.size() - r->shape.size(), 1);
    s.insert(s.end(), r->shape.begin(), r->shape.end());
    r = ir::reshape(r, s);
  }
  return ir::broadcast(r, shape);
}

/// Runs `f` on x in f32 when x is f16/bf16 and casts the result back; otherwise on x itself.
template <class F>
NodePtr in_compute_dtype(const NodePtr& x, F&& f) {
  if (!is_reduced_float(x->dtype)) return f(x);
  return ir::cast(f(ir::cast(x, DType::Float32)), x->dtype);
}

namespace detail {

inline NodePtr neg(const NodePtr& a) { return ir::unary(Op::Neg, a); }
inline NodePtr exp(const NodePtr& a) { return ir::unary(Op::Exp, a); }
inline NodePtr cmp(Op op, const NodePtr& a, double b) { return ir::binary(op, a, scalar_like(b, a)); }

// c[0] + t (c[1] + t (c[2] + ...)).
inline NodePtr horner(const NodePtr& t, std::initializer_list<double> c) {
  const double* k = c.end();
  NodePtr s = scalar_like(*--k, t);
  while (k != c.begin()) s = add(mul(s, t), scalar_like(*--k, t));
  return s;
}

// Phi(-a) exp(a^2/2) = erfc(a/sqrt2) exp(a^2/2) / 2 for a >= 0.7 (the scaled complementary error
// function; smooth, ~0.4/a). Two weighted minimax polynomials joined by a select: in a - mid up
// to `split`, and a * G(a) = H(1/a^2) beyond (an asymptotic variable). Relative errors of the
// fits: f32 2^-30.8 / 2^-30.5 (coefficients rounded to float), f64 2^-56.4 / 2^-57.4.
inline NodePtr gauss_tail_scaled(const NodePtr& a) {
  NodePtr near, far, r = div(scalar_like(1.0, a), a);
  double split;
  if (a->dtype == DType::Float64) {
    split = 4.0;
    near = horner(sub(a, scalar_like(2.35, a)),
                  {0x1.301d9be9e79e2p-3,  -0x1.9972ad20338d1p-5,  0x1.fc851804b10cdp-7,  -0x1.272e16f92f9c9p-8,
                   0x1.435de072ff2c2p-10, -0x1.50a58f1221757p-12, 0x1.4ee5e551fa429p-14, -0x1.3fc20bb963d39p-16,
                   0x1.261496746addfp-18, -0x1.054ed9da7a844p-20, 0x1.c1cc5dbbed032p-23, -0x1.77cb6ac8fa157p-25,
                   0x1.315ba5403fdffp-27, -0x1.e378aae2ab3abp-30, 0x1.755e33878992dp-32, -0x1.19636cda84499p-34,
                   0x1.9f94c98c47db1p-37, -0x1.30594fa79ce74p-39, 0x1.ac5f0f68ec244p-42, -0x1.077ffceb9e1e6p-44,
                   0x1.7491d69b96e63p-47, -0x1.9abaa79d1f307p-49, 0x1.001774c422a8cp-51});
    far =
        horner(mul(r, r), {0x1.9884533d43651p-2, -0x1.9884533d4348cp-2, 0x1.32633e6dba425p+0, -0x1.7efc0ddcde131p+2,
                           0x1.4f1c82eb033d9p+5, -0x1.78fee872b9d7ep+8, 0x1.0322b0b59220fp+12, -0x1.a45b05acc5a18p+15,
                           0x1.86078b543b3a2p+19, -0x1.8dd7201bcaf54p+23, 0x1.a51cfd4d97d03p+27, -0x1.aef9ec73c25fap+31,
                           0x1.8d9b1dff07376p+35, -0x1.3709580c9ee0fp+39, 0x1.86d37ea65a1dbp+42, -0x1.74f024c28b304p+45,
                           0x1.f6b2d8139ef2dp+47, -0x1.a7e1446cfc356p+49, 0x1.4f0682aa492a5p+50});
  } else {
    split = 3.0;
    near = horner(sub(a, scalar_like(1.85, a)),
                  {0x1.6c93a0p-3, -0x1.1d2248p-4, 0x1.934faep-6, -0x1.06f0a0p-7, 0x1.402d52p-9, -0x1.6f89d6p-11,
                   0x1.90da80p-13, -0x1.a0bfa6p-15, 0x1.980f50p-17, -0x1.8b04cap-19, 0x1.c1163ep-21, -0x1.83d4fcp-23});
    far = horner(mul(r, r), {0x1.988454p-2, -0x1.98842ep-2, 0x1.32576cp+0, -0x1.7d7872p+2, 0x1.42101ep+5,
                             -0x1.345758p+8, 0x1.1155f6p+11, -0x1.7256b6p+13, 0x1.3cf61ap+15, -0x1.f152b0p+15});
  }
  return ir::where(cmp(Op::Lt, a, split), near, mul(far, r));
}

// gelu(x) = x Phi(x), with no erf and no cancellation anywhere (1 + erf(x/sqrt2) loses ten bits
// at -3.6 and all of them below -5.5 in f32):
//   |x| < 0.7: Phi(x) = 1/2 + x Q(x^2), Q = erf(x/sqrt2)/(2x) (minimax, relative 2^-29.6 f32,
//              2^-58.1 f64);
//   x <= -0.7: x exp(-x^2/2) G(|x|), G = gauss_tail_scaled;
//   x >= 0.7:  x (1 - exp(-x^2/2) G(x)), 1 - Phi(-x) >= 0.75.
// exp(-x^2/2) is taken from |x| itself, never from a rounded x^2 or x/sqrt2 (whose rounding would
// cost |x|^2 ulp): with h = |x| rounded to 8 (f64: 20) fraction bits, h^2/2 is exact and
// exp(-x^2/2) = exp(-h^2/2) exp(-d), d = (|x| - h)(|x| + h)/2 below 2^-5 (f64: 2^-15.6), whose
// exp is a 4-term (f64: 3-term) Taylor polynomial. |x| is clamped at 16 (f64: 40), where the tail
// is 0, which keeps h exact; the factor exp(-h^2/2), the one that can turn subnormal, is
// multiplied last.
inline NodePtr gelu_erf(const NodePtr& v) {
  const bool f64 = v->dtype == DType::Float64;
  NodePtr one = scalar_like(1.0, v), half = scalar_like(0.5, v);
  NodePtr abs_v = ir::unary(Op::Abs, v);
  NodePtr a = ir::binary(Op::Minimum, abs_v, scalar_like(f64 ? 40.0 : 16.0, v));
  NodePtr h =
      mul(ir::unary(Op::Round, mul(a, scalar_like(f64 ? 0x1p20 : 0x1p8, v))), scalar_like(f64 ? 0x1p-20 : 0x1p-8, v));
  NodePtr e_hi = exp(neg(mul(mul(h, h), half)));
  NodePtr t = neg(mul(mul(sub(a, h), add(a, h)), half));  // -d
  NodePtr e_lo = f64 ? horner(t, {1.0, 1.0, 0.5, 1.0 / 6}) : horner(t, {1.0, 1.0, 0.5, 1.0 / 6, 1.0 / 24});
  NodePtr g = mul(gauss_tail_scaled(a), e_lo);
  NodePtr lower = mul(mul(v, g), e_hi);  // -inf * 0 = NaN at -inf, as PyTorch
  NodePtr upper = mul(v, sub(one, mul(g, e_hi)));
  NodePtr q = f64 ? horner(mul(v, v), {0x1.9884533d43651p-2, -0x1.1058377e2cec1p-4, 0x1.46d0429765d63p-7,
                                       -0x1.37403f697ce12p-10, 0x1.e42b0beae478bp-14, -0x1.3ce8b888f7128p-17,
                                       0x1.657bc0cc09c81p-21, -0x1.604ea69b033a3p-25, 0x1.1816ad0983138p-29})
                  : horner(mul(v, v), {0x1.988454p-2, -0x1.10582ap-4, 0x1.46c97ep-7, -0x1.360962p-10, 0x1.b62920p-14});
  NodePtr middle = mul(v, add(half, mul(v, q)));
  return ir::where(cmp(Op::Lt, abs_v, 0.7), middle, ir::where(cmp(Op::Lt, v, 0.0), lower, upper));
}

}  // namespace detail

inline NodePtr sigmoid(const NodePtr& x);

/// 1/(1+exp(-x)), as 1/(1+e) for x >= 0 and e/(1+e) below with e = exp(-|x|): exp never
/// overflows, and the tail below -88 (f32) keeps its subnormal value instead of flushing to 0.
inline NodePtr sigmoid_value(const NodePtr& x) {
  return in_compute_dtype(x, [](const NodePtr& v) {
    NodePtr one = scalar_like(1.0, v);
    NodePtr e = detail::exp(detail::neg(ir::unary(Op::Abs, v)));
    return div(ir::where(detail::cmp(Op::Ge, v, 0.0), one, e), add(one, e));
  });
}

/// 0 where x <= 0, else x: NaN propagates, and the gradient at 0 is 0 (PyTorch's relu'(0); a
/// maximum with 0 would split it between the tied inputs).
inline NodePtr relu(const NodePtr& x) {
  NodePtr zero = scalar_like(0.0, x);
  return ir::where(ir::binary(Op::Le, x, zero), zero, x);
}

/// x * sigmoid(x). The negative tail is x e/(1+e) with e = exp(-|x|/2)^2 and the product taken
/// as (x E) E: exp(-|x|) alone turns subnormal at -87.3 while x e is still normal down to -91.8
/// (f32); silu(-inf) is NaN (-inf * 0), as PyTorch's x * sigmoid(x) on every device.
inline NodePtr silu(const NodePtr& x) {
  return in_compute_dtype(x, [](const NodePtr& v) {
    NodePtr one = scalar_like(1.0, v);
    NodePtr e_half = detail::exp(detail::neg(mul(ir::unary(Op::Abs, v), scalar_like(0.5, v))));
    NodePtr tail = mul(mul(v, e_half), e_half);
    return div(ir::where(detail::cmp(Op::Ge, v, 0.0), v, tail), add(one, mul(e_half, e_half)));
  });
}

/// Attaches `rule` as the gradient of the composite result `out` built from `inputs` (when
/// gradients are being recorded through one of them): see ir::CustomGradient.
inline NodePtr with_gradient(NodePtr out, std::vector<NodePtr> inputs,
                             std::function<std::vector<NodePtr>(const NodePtr&, const NodePtr&)> rule) {
  if (!out->requires_grad || out->custom_gradient) return out;
  out->custom_gradient = std::make_shared<const ir::CustomGradient>(ir::CustomGradient{std::move(inputs), std::move(rule), {}});
  return out;
}

/// gelu's derivative times g (PyTorch's gelu_backward): Phi(x) + x phi(x), or for the tanh
/// form 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 0.044715 x^2) with t = tanh(u).
inline NodePtr gelu_backward(const NodePtr& x, const NodePtr& g, bool tanh_approx) {
  return in_compute_dtype(x, [&](const NodePtr& v) {
    NodePtr gv = ir::cast(g, v->dtype), half = scalar_like(0.5, v), one = scalar_like(1.0, v);
    if (!tanh_approx) {
      NodePtr cdf = mul(half, add(one, ir::unary(Op::Erf, mul(v, scalar_like(1.0 / std::numbers::sqrt2, v)))));
      NodePtr pdf = mul(scalar_like(1.0 / std::sqrt(2.0 * std::numbers::pi), v),
                        detail::exp(mul(mul(v, v), scalar_like(-0.5, v))));
      return mul(gv, add(cdf, mul(v, pdf)));
    }
    const double k = std::sqrt(2.0 / std::numbers::pi);
    NodePtr v2 = mul(v, v);
    NodePtr t = ir::unary(Op::Tanh, mul(scalar_like(k, v), add(v, mul(scalar_like(0.044715, v), mul(v2, v)))));
    NodePtr du = mul(scalar_like(k, v), add(one, mul(scalar_like(3 * 0.044715, v), v2)));
    NodePtr d = add(mul(half, add(one, t)), mul(mul(mul(half, v), sub(one, mul(t, t))), du));
    return mul(gv, d);
  });
}

inline NodePtr gelu_value(const NodePtr& x, bool tanh_approx);

/// sigmoid with PyTorch's rule g s (1 - s), s the result: the piecewise value is not built to be
/// differentiated (through |x| its derivative at 0 would be 0, not 1/4).
inline NodePtr sigmoid(const NodePtr& x) {
  return with_gradient(sigmoid_value(x), {x}, [x](const NodePtr& out, const NodePtr& g) {
    NodePtr gx = in_compute_dtype(x, [&](const NodePtr& v) {
      NodePtr s = ir::cast(out, v->dtype);
      return mul(mul(ir::cast(g, v->dtype), s), sub(scalar_like(1.0, v), s));
    });
    return std::vector<NodePtr>{ir::cast(gx, x->dtype)};
  });
}

/// GELU, x Phi(x): exact (erf) form, or the tanh approximation. Both are evaluated without the
/// cancellation of 1 + erf / 1 + tanh at negative x (docs/performance-math.md has the bounds);
/// gelu(-inf) is NaN, as PyTorch's (x times a CDF that is 0 there). It has its own gradient
/// rule: the accurate piecewise value is not built to be differentiated (its untaken branches
/// overflow).
inline NodePtr gelu(const NodePtr& x, bool tanh_approx) {
  return with_gradient(gelu_value(x, tanh_approx), {x}, [x, tanh_approx](const NodePtr&, const NodePtr& g) {
    return std::vector<NodePtr>{ir::cast(gelu_backward(x, g, tanh_approx), x->dtype)};
  });
}

inline NodePtr gelu_value(const NodePtr& x, bool tanh_approx) {
  return in_compute_dtype(x, [tanh_approx](const NodePtr& v) {
    if (!tanh_approx) return detail::gelu_erf(v);
    // 0.5 x (1 + tanh(u)) = x sigmoid(2u), as silu with exp(-2|u|) = exp(-|u|)^2.
    NodePtr cube = mul(mul(v, v), v);
    NodePtr u = mul(scalar_like(std::sqrt(2.0 / std::numbers::pi), v), add(v, mul(scalar_like(0.044715, v), cube)));
    NodePtr e_half = detail::exp(detail::neg(ir::unary(Op::Abs, u)));
    NodePtr tail = mul(mul(v, e_half), e_half);
    return div(ir::where(detail::cmp(Op::Ge, v, 0.0), v, tail), add(scalar_like(1.0, v), mul(e_half, e_half)));
  });
}

/// Number of elements folded together by reducing `axes` of `shape`.
inline std::int64_t reduced_count(const Shape& shape, const std::vector<std::int64_t>& axes) {
  std::int64_t n = 1;
  for (auto a : axes) n *= shape[a];
  return n;
}

/// Mean over axes, reduced dims kept (floating x).
inline NodePtr mean_keep(const NodePtr& x, const std::vector<std::int64_t>& axes) {
  return in_compute_dtype(x, [&](const NodePtr& v) {
    NodePtr s = ir::reduce(Op::ReduceSum, v, axes);
    return div(s, scalar_like(static_cast<double>(reduced_count(v->shape, axes)), s));
  });
}

/// Variance with `correction` (1 = unbiased), reduced dims kept (floating x).
/// The values are first shifted by the first element of their row (variance does not change
/// under a shift): a constant row is then exactly 0 and its variance exactly 0, as PyTorch's
/// Welford gives, whatever the order and precision of the sums; and rows far from 0 lose no
/// bits to the mean's rounding.
inline NodePtr var_keep(const NodePtr& x, const std::vector<std::int64_t>& axes, double correction) {
  return in_compute_dtype(x, [&](const NodePtr& v0) {
    NodePtr v = v0;
    bool empty = false;
    for (auto a : axes) empty = empty || v0->shape[static_cast<std::size_t>(a)] == 0;
    if (!empty) {
      NodePtr first = v0;
      for (auto a : axes) first = ir::slice(first, a, 0, 1, 1);
      v = sub(v0, expand(first, v0->shape));
    }
    NodePtr m = expand(mean_keep(v, axes), v->shape);
    NodePtr d = sub(v, m);
    NodePtr ss = ir::reduce(Op::ReduceSum, mul(d, d), axes);
    double n = static_cast<double>(reduced_count(v->shape, axes)) - correction;
    return div(ss, scalar_like(n > 0 ? n : 0.0, ss));
  });
}

namespace detail {

// log(sum(exp(x - m))) over axes, kept, as log1p(t) with t the sum less the 1 that one maximum
// contributes: the terms below the maximum are summed apart and the other maxima counted, so a
// row dominated by one element keeps log_softmax = -log1p(t) ~ -t instead of log(1 + t) = 0
// once t < 2^-24. `shifted` = x - m. When m is infinite or NaN no element of `shifted` is >= 0
// and the result is log1p(-1) = -inf (callers rely on that).
// A maximum is counted by `shifted >= 0`, not `== 0`: a GPU compiler may contract x * c - m into
// one fma, so the maximum's own shifted value is its product's rounding error, +-tiny, instead of
// 0. Either sign stays right: +tiny counts as a maximum; -tiny adds exp(-tiny) ~ 1 to `below`
// and one maximum fewer to the count, the same total.
inline NodePtr log1p_sum_exp_below_max(const NodePtr& shifted, const std::vector<std::int64_t>& axes) {
  NodePtr zero = scalar_like(0.0, shifted);
  NodePtr below = ir::reduce(Op::ReduceSum, ir::where(cmp(Op::Lt, shifted, 0.0), exp(shifted), zero), axes);
  NodePtr maxima =
      ir::reduce(Op::ReduceSum, ir::where(cmp(Op::Ge, shifted, 0.0), scalar_like(1.0, shifted), zero), axes);
  return ir::unary(Op::Log1p, add(below, sub(maxima, scalar_like(1.0, maxima))));
}

}  // namespace detail

/// log(sum(exp(x))) over axes, kept; stable (max subtracted; infinite maxima give the maximum,
/// as PyTorch), and accurate when one element dominates (see log1p_sum_exp_below_max).
/// Its gradient (own rule: the value's branches and counts are for accuracy, not for
/// differentiation) is g exp(x - out), the softmax over the axes.
inline NodePtr logsumexp_keep(const NodePtr& x, const std::vector<std::int64_t>& axes) {
  NodePtr out = in_compute_dtype(x, [&](const NodePtr& v) {
    NodePtr m = ir::reduce(Op::ReduceMax, v, axes);
    NodePtr l = detail::log1p_sum_exp_below_max(sub(v, expand(m, v->shape)), axes);
    return ir::where(ir::unary(Op::IsInf, m), m, add(m, l));
  });
  return with_gradient(out, {x}, [x](const NodePtr& result, const NodePtr& g) {
    return std::vector<NodePtr>{in_compute_dtype(x, [&](const NodePtr& v) {
      NodePtr r = expand(ir::cast(result, v->dtype), v->shape);
      return mul(expand(ir::cast(g, v->dtype), v->shape), ir::unary(Op::Exp, sub(v, r)));
    })};
  });
}

/// softmax's gradient from its result y: y (g - sum(g y)) along the axis (PyTorch's
/// _softmax_backward_data), computed in float32 for half types.
inline NodePtr softmax_backward(const NodePtr& y, const NodePtr& g, std::int64_t axis) {
  return in_compute_dtype(y, [&](const NodePtr& yv) {
    NodePtr gv = ir::cast(g, yv->dtype);
    NodePtr dot = ir::reduce(Op::ReduceSum, mul(gv, yv), {axis});
    return mul(yv, sub(gv, expand(dot, yv->shape)));
  });
}

/// log_softmax's gradient from its result: g - exp(out) sum(g) along the axis.
inline NodePtr log_softmax_backward(const NodePtr& out, const NodePtr& g, std::int64_t axis) {
  return in_compute_dtype(out, [&](const NodePtr& ov) {
    NodePtr gv = ir::cast(g, ov->dtype);
    NodePtr total = ir::reduce(Op::ReduceSum, gv, {axis});
    return sub(gv, mul(ir::unary(Op::Exp, ov), expand(total, ov->shape)));
  });
}

inline NodePtr softmax_value(const NodePtr& x, std::int64_t axis);
inline NodePtr log_softmax_value(const NodePtr& x, std::int64_t axis);

/// exp(x - max) / sum, with its own gradient rule (from the result, as PyTorch saves it).
inline NodePtr softmax(const NodePtr& x, std::int64_t axis) {
  return with_gradient(softmax_value(x, axis), {x}, [axis](const NodePtr& y, const NodePtr& g) {
    return std::vector<NodePtr>{softmax_backward(y, g, axis)};
  });
}

/// x - max - log(sum(exp(x - max))), with its own gradient rule (from the result).
inline NodePtr log_softmax(const NodePtr& x, std::int64_t axis) {
  return with_gradient(log_softmax_value(x, axis), {x}, [axis](const NodePtr& out, const NodePtr& g) {
    return std::vector<NodePtr>{log_softmax_backward(out, g, axis)};
  });
}

inline NodePtr softmax_value(const NodePtr& x, std::int64_t axis) {
  return in_compute_dtype(x, [&](const NodePtr& v) {
    NodePtr m = expand(ir::reduce(Op::ReduceMax, v, {axis}), v->shape);
    NodePtr e = ir::unary(Op::Exp, sub(v, m));
    // Multiplied by the reciprocal of the row's sum, as ATen's kernels do: one division per
    // row instead of one per element. The sum is in [1, K] (the maximum contributes exp(0)),
    // so the reciprocal is always normal and the result is within an ulp of the quotient.
    NodePtr sum = ir::reduce(Op::ReduceSum, e, {axis});
    return mul(e, expand(div(scalar_like(1.0, sum), sum), v->shape));
  });
}

inline NodePtr log_softmax_value(const NodePtr& x, std::int64_t axis) {
  return in_compute_dtype(x, [&](const NodePtr& v) {
    // An infinite or NaN maximum makes the whole row NaN, as in PyTorch: shifted - (-inf).
    NodePtr shifted = sub(v, expand(ir::reduce(Op::ReduceMax, v, {axis}), v->shape));
    return sub(shifted, expand(detail::log1p_sum_exp_below_max(shifted, {axis}), v->shape));
  });
}

namespace detail {

/// The gradients of a normalisation over the last axis, y = xhat w (+ b) with xhat = (x - mean)
/// rstd (`centred`: layer_norm; else rms_norm, mean = 0), from the forward's row statistics
/// (PyTorch's native_layer_norm_backward): dx = rstd (gw - [mean(gw)] - xhat mean(gw xhat)),
/// gw = g w; dw = sum of g xhat over the rows; db = sum of g. `inputs` are x, then the weight
/// and bias that are not null, in that order.
inline std::vector<NodePtr> norm_backward(const NodePtr& v, const NodePtr& mean, const NodePtr& rstd,
                                          const NodePtr& weight, const NodePtr& bias, const NodePtr& x,
                                          const NodePtr& g, bool centred) {
  const Shape& s = v->shape;
  const std::int64_t last = static_cast<std::int64_t>(s.size()) - 1;
  std::vector<std::int64_t> rows;
  for (std::int64_t d = 0; d < last; ++d) rows.push_back(d);
  NodePtr gv = ir::cast(g, v->dtype);
  NodePtr centred_v = centred ? sub(v, expand(mean, s)) : v;
  NodePtr xhat = mul(centred_v, expand(rstd, s));
  NodePtr gw = weight ? mul(gv, expand(ir::cast(weight, v->dtype), s)) : gv;
  NodePtr k = scalar_like(1.0 / static_cast<double>(s[static_cast<std::size_t>(last)]), rstd);
  NodePtr proj = mul(ir::reduce(Op::ReduceSum, mul(gw, xhat), {last}), k);
  NodePtr inner = sub(gw, mul(xhat, expand(proj, s)));
  if (centred) inner = sub(inner, expand(mul(ir::reduce(Op::ReduceSum, gw, {last}), k), s));
  std::vector<NodePtr> grads{ir::cast(mul(inner, expand(rstd, s)), x->dtype)};
  auto column_sum = [&](const NodePtr& t, const NodePtr& like) {
    NodePtr c = rows.empty() ? t : ir::reduce(Op::ReduceSum, t, rows);
    return ir::cast(ir::reshape(c, like->shape), like->dtype);
  };
  if (weight) grads.push_back(column_sum(mul(gv, xhat), weight));
  if (bias) grads.push_back(column_sum(gv, bias));
  return grads;
}

/// x, then the weight and bias that are not null.
inline std::vector<NodePtr> present(std::initializer_list<NodePtr> nodes) {
  std::vector<NodePtr> out;
  for (const NodePtr& n : nodes)
    if (n) out.push_back(n);
  return out;
}

}  // namespace detail

/// Normalises over the last axis; weight and bias (shape [K], same dtype) may be null. Its own
/// gradient rule reads the forward's mean and rstd (saved: a compiled forward outputs them).
inline NodePtr layer_norm(const NodePtr& x, const NodePtr& weight, const NodePtr& bias, double eps) {
  std::int64_t last = static_cast<std::int64_t>(x->shape.size()) - 1;
  NodePtr vv, mean, rstd;
  NodePtr y = in_compute_dtype(x, [&](const NodePtr& v) {
    vv = v;
    mean = mean_keep(v, {last});
    NodePtr d = sub(v, expand(mean, v->shape));
    NodePtr var =
        div(ir::reduce(Op::ReduceSum, mul(d, d), {last}), scalar_like(static_cast<double>(v->shape[last]), mean));
    rstd = ir::unary(Op::Rsqrt, add(var, scalar_like(eps, var)));
    NodePtr out = mul(d, expand(rstd, v->shape));
    if (weight) out = mul(out, expand(ir::cast(weight, v->dtype), v->shape));
    if (bias) out = add(out, expand(ir::cast(bias, v->dtype), v->shape));
    return out;
  });
  return with_gradient(y, detail::present({x, weight, bias}), [=](const NodePtr&, const NodePtr& g) {
    return detail::norm_backward(vv, mean, rstd, weight, bias, x, g, true);
  });
}

/// x * rsqrt(mean(x^2, last) + eps) * weight; weight may be null. Its own gradient rule reads
/// the forward's rstd.
inline NodePtr rms_norm(const NodePtr& x, const NodePtr& weight, double eps) {
  std::int64_t last = static_cast<std::int64_t>(x->shape.size()) - 1;
  NodePtr vv, rstd;
  NodePtr y = in_compute_dtype(x, [&](const NodePtr& v) {
    vv = v;
    NodePtr ms = mean_keep(mul(v, v), {last});
    rstd = ir::unary(Op::Rsqrt, add(ms, scalar_like(eps, ms)));
    NodePtr out = mul(v, expand(rstd, v->shape));
    if (weight) out = mul(out, expand(ir::cast(weight, v->dtype), v->shape));
    return out;
  });
  return with_gradient(y, detail::present({x, weight}), [=](const NodePtr&, const NodePtr& g) {
    return detail::norm_backward(vv, nullptr, rstd, weight, nullptr, x, g, false);
  });
}

/// How a loss folds its per-row (or per-element) values, as PyTorch's `reduction`.
enum class Reduction : std::uint8_t {
  Mean,  ///< the mean over the counted values (PyTorch's default)
  Sum,   ///< their sum
  None,  ///< no folding: one value per row (or element)
};

/// Negative log-likelihood of `targets` (Int64 [N]) under softmax(logits [N, C]), folded by
/// `reduction`; targets equal to `ignore_index` do not count (PyTorch's default -100: their row
/// is 0 and the mean is over the other rows). With `label_smoothing` e each row's loss is
/// (1 - e) nll + e (-mean over classes of log p), as PyTorch's.
///
/// logp[target] = (x[target] - max) - log(sum(exp(x - max))): the row's max and sum of exp are
/// one pass over the logits (the online max/sum of exp), x[target] one gathered element per row,
/// instead of a third pass over log_softmax's output. Ignored rows read class 0 and contribute 0
/// through `where`, so they are skipped as in ATen (their logits, even NaN, do not count); any
/// other target outside [0, C) is an IndexError from the kernel that reads it.
inline NodePtr cross_entropy(const NodePtr& logits, const NodePtr& targets, std::int64_t ignore_index,
                             Reduction reduction = Reduction::Mean, double label_smoothing = 0.0) {
  NodePtr vv, m, lse, valid, at, count;  // the forward's pieces, for the gradient rule
  NodePtr out = in_compute_dtype(logits, [&](const NodePtr& v) {
    const Shape& s = v->shape;           // [N, C]
    vv = v;
    m = ir::reduce(Op::ReduceMax, v, {1});  // [N,1]
    lse = ir::unary(Op::Log, ir::reduce(Op::ReduceSum, ir::unary(Op::Exp, sub(v, expand(m, s))), {1}));
    NodePtr tn = ir::reshape(targets, Shape{s[0], 1});
    valid = ir::binary(Op::Ne, tn, ir::constant_int(ignore_index, DType::Int64, tn->shape, v->device));
    at = ir::where(valid, tn, ir::constant_int(0, DType::Int64, tn->shape, v->device));
    NodePtr picked_x = ir::gather(v, at, 1, ir::GatherSite::CrossEntropy);  // [N,1]
    NodePtr row = ir::unary(Op::Neg, sub(sub(picked_x, m), lse));          // -log p[target]
    if (label_smoothing != 0.0) {
      // -mean_c log p_c = m + lse - mean_c x_c
      NodePtr mean_x = div(ir::reduce(Op::ReduceSum, v, {1}), scalar_like(static_cast<double>(s[1]), m));
      NodePtr smooth = sub(add(m, lse), mean_x);
      row = add(mul(row, scalar_like(1.0 - label_smoothing, row)), mul(smooth, scalar_like(label_smoothing, row)));
    }
    NodePtr loss = ir::where(valid, row, scalar_like(0.0, row));  // [N,1]
    if (reduction == Reduction::None) return ir::reshape(loss, Shape{s[0]});
    NodePtr total = ir::reduce(Op::ReduceSum, loss, {0});  // [1,1]
    if (reduction == Reduction::Sum) return ir::reshape(total, Shape{});
    count = ir::reduce(Op::ReduceSum, ir::cast(valid, v->dtype), {0});
    return ir::reshape(div(total, count), Shape{});
  });
  // Its own rule (PyTorch's): (softmax(x) - (1 - e) one_hot(target) - e / C) times the row's
  // share of g (g / count for the mean) on the counted rows, all pointwise over the forward's row
  // max and log-sum: one fused pass, where the rules of max and gather would add tie counts and
  // a scatter step.
  return with_gradient(out, {logits}, [=](const NodePtr&, const NodePtr& g) {
    const Shape& s = vv->shape;
    NodePtr p = ir::unary(Op::Exp, sub(sub(vv, expand(m, s)), expand(lse, s)));
    NodePtr hit = ir::cast(ir::binary(Op::Eq, ir::iota(s, 1, DType::Int64, vv->device), expand(at, s)), vv->dtype);
    if (label_smoothing != 0.0)
      hit = add(mul(hit, scalar_like(1.0 - label_smoothing, hit)),
                scalar_like(label_smoothing / static_cast<double>(s[1]), hit));
    NodePtr d = sub(p, hit);
    NodePtr gv = ir::cast(g, vv->dtype);
    NodePtr share;  // [N,1]: each row's factor
    if (reduction == Reduction::None)
      share = ir::reshape(gv, Shape{s[0], 1});
    else if (reduction == Reduction::Sum)
      share = expand(ir::reshape(gv, Shape{1, 1}), valid->shape);
    else
      share = expand(div(ir::reshape(gv, Shape{1, 1}), count), valid->shape);
    NodePtr row = ir::where(valid, share, scalar_like(0.0, m));
    return std::vector<NodePtr>{ir::cast(mul(d, expand(row, s)), logits->dtype)};
  });
}

}  // namespace kiln::decomp
