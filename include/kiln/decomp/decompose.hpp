#pragma once
// Every composite op lowered to primitives, in one place. Inputs are graph nodes whose shapes
// and dtypes the front end has already checked; 16-bit floats are computed in f32 and rounded
// once at the end, as PyTorch's kernels do.
#include <cmath>
#include <limits>
#include <numbers>
#include <vector>

#include "kiln/ir/builder.hpp"

namespace kiln::decomp {

using ir::NodePtr;
using ir::Op;

/// A scalar constant shaped and typed like `like`.
inline NodePtr scalar_like(double v, const NodePtr& like) { return ir::constant(v, like->dtype, like->shape, like->device); }

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

inline NodePtr sigmoid(const NodePtr& x) {
  return in_compute_dtype(x, [](const NodePtr& v) {
    NodePtr one = scalar_like(1.0, v);
    return div(one, add(one, ir::unary(Op::Exp, ir::unary(Op::Neg, v))));
  });
}

/// max(x, 0), NaN propagating.
inline NodePtr relu(const NodePtr& x) { return ir::binary(Op::Maximum, x, scalar_like(0.0, x)); }

inline NodePtr silu(const NodePtr& x) {
  return in_compute_dtype(x, [](const NodePtr& v) {
    NodePtr one = scalar_like(1.0, v);
    return div(v, add(one, ir::unary(Op::Exp, ir::unary(Op::Neg, v))));
  });
}

/// GELU: exact (erf) form, or the tanh approximation.
inline NodePtr gelu(const NodePtr& x, bool tanh_approx) {
  return in_compute_dtype(x, [tanh_approx](const NodePtr& v) {
    NodePtr half = scalar_like(0.5, v), one = scalar_like(1.0, v);
    NodePtr inner;
    if (tanh_approx) {
      NodePtr cube = mul(mul(v, v), v);
      NodePtr arg = mul(scalar_like(std::sqrt(2.0 / std::numbers::pi), v), add(v, mul(scalar_like(0.044715, v), cube)));
      inner = ir::unary(Op::Tanh, arg);
    } else {
      inner = ir::unary(Op::Erf, mul(v, scalar_like(1.0 / std::numbers::sqrt2, v)));
    }
    return mul(mul(half, v), add(one, inner));
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
inline NodePtr var_keep(const NodePtr& x, const std::vector<std::int64_t>& axes, double correction) {
  return in_compute_dtype(x, [&](const NodePtr& v) {
    NodePtr m = expand(mean_keep(v, axes), v->shape);
    NodePtr d = sub(v, m);
    NodePtr ss = ir::reduce(Op::ReduceSum, mul(d, d), axes);
    double n = static_cast<double>(reduced_count(v->shape, axes)) - correction;
    return div(ss, scalar_like(n > 0 ? n : 0.0, ss));
  });
}

/// log(sum(exp(x))) over axes, kept; stable (max subtracted; infinite maxima handled as PyTorch).
inline NodePtr logsumexp_keep(const NodePtr& x, const std::vector<std::int64_t>& axes) {
  return in_compute_dtype(x, [&](const NodePtr& v) {
    NodePtr m = ir::reduce(Op::ReduceMax, v, axes);
    NodePtr m_safe = ir::where(ir::unary(Op::IsInf, m), scalar_like(0.0, m), m);
    NodePtr e = ir::unary(Op::Exp, sub(v, expand(m_safe, v->shape)));
    return add(ir::unary(Op::Log, ir::reduce(Op::ReduceSum, e, axes)), m_safe);
  });
}

inline NodePtr softmax(const NodePtr& x, std::int64_t axis) {
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

inline NodePtr log_softmax(const NodePtr& x, std::int64_t axis) {
  return in_compute_dtype(x, [&](const NodePtr& v) {
    NodePtr shifted = sub(v, expand(ir::reduce(Op::ReduceMax, v, {axis}), v->shape));
    NodePtr lse = ir::unary(Op::Log, ir::reduce(Op::ReduceSum, ir::unary(Op::Exp, shifted), {axis}));
    return sub(shifted, expand(lse, v->shape));
  });
}

/// Normalises over the last axis; weight and bias (shape [K], same dtype) may be null.
inline NodePtr layer_norm(const NodePtr& x, const NodePtr& weight, const NodePtr& bias, double eps) {
  std::int64_t last = static_cast<std::int64_t>(x->shape.size()) - 1;
  NodePtr y = in_compute_dtype(x, [&](const NodePtr& v) {
    NodePtr mean = mean_keep(v, {last});
    NodePtr d = sub(v, expand(mean, v->shape));
    NodePtr var = div(ir::reduce(Op::ReduceSum, mul(d, d), {last}), scalar_like(static_cast<double>(v->shape[last]), mean));
    NodePtr rstd = ir::unary(Op::Rsqrt, add(var, scalar_like(eps, var)));
    NodePtr out = mul(d, expand(rstd, v->shape));
    if (weight) out = mul(out, expand(ir::cast(weight, v->dtype), v->shape));
    if (bias) out = add(out, expand(ir::cast(bias, v->dtype), v->shape));
    return out;
  });
  return y;
}

/// x * rsqrt(mean(x^2, last) + eps) * weight; weight may be null.
inline NodePtr rms_norm(const NodePtr& x, const NodePtr& weight, double eps) {
  std::int64_t last = static_cast<std::int64_t>(x->shape.size()) - 1;
  return in_compute_dtype(x, [&](const NodePtr& v) {
    NodePtr ms = mean_keep(mul(v, v), {last});
    NodePtr out = mul(v, expand(ir::unary(Op::Rsqrt, add(ms, scalar_like(eps, ms))), v->shape));
    if (weight) out = mul(out, expand(ir::cast(weight, v->dtype), v->shape));
    return out;
  });
}

/// Mean negative log-likelihood of `targets` (Int64 [N]) under softmax(logits [N, C]);
/// targets equal to `ignore_index` do not count (PyTorch's default -100).
///
/// logp[target] = (x[target] - max) - log(sum(exp(x - max))), with x[target] picked by a sum of
/// where(class == target, x, 0) over the row: every row reduction then reads only the logits
/// (the pick and the max share a pass, and with the online max/sum of exp the row is read
/// once), instead of a third pass over log_softmax's output. Ignored rows contribute 0 through
/// `where`, so they are skipped as in ATen (their logits, even NaN, do not count).
inline NodePtr cross_entropy(const NodePtr& logits, const NodePtr& targets, std::int64_t ignore_index) {
  return in_compute_dtype(logits, [&](const NodePtr& v) {
    const Shape& s = v->shape;  // [N, C]
    NodePtr m = ir::reduce(Op::ReduceMax, v, {1});  // [N,1]
    NodePtr lse = ir::unary(Op::Log, ir::reduce(Op::ReduceSum, ir::unary(Op::Exp, sub(v, expand(m, s))), {1}));
    NodePtr classes = ir::iota(s, 1, DType::Int64, v->device);
    NodePtr t = expand(ir::reshape(targets, Shape{s[0], 1}), s);
    NodePtr onehot = ir::binary(Op::Eq, classes, t);
    NodePtr picked_x = ir::reduce(Op::ReduceSum, ir::where(onehot, v, scalar_like(0.0, v)), {1});  // [N,1]
    NodePtr picked = sub(sub(picked_x, m), lse);
    NodePtr tn = ir::reshape(targets, Shape{s[0], 1});
    NodePtr valid = ir::binary(Op::Ne, tn, ir::constant_int(ignore_index, DType::Int64, tn->shape, v->device));
    // A target outside [0, C) picks no logit: its loss is NaN, so the mean is NaN rather than
    // a plausible number. (The front end raises IndexError where it can read the targets.)
    NodePtr in_range = ir::binary(Op::And, ir::binary(Op::Ge, tn, ir::constant_int(0, DType::Int64, tn->shape, v->device)),
                                  ir::binary(Op::Lt, tn, ir::constant_int(s[1], DType::Int64, tn->shape, v->device)));
    NodePtr row_loss = ir::where(in_range, ir::unary(Op::Neg, picked), scalar_like(std::numeric_limits<double>::quiet_NaN(), picked));
    NodePtr loss = ir::where(valid, row_loss, scalar_like(0.0, picked));
    NodePtr total = ir::reduce(Op::ReduceSum, loss, {0});  // [1,1]
    NodePtr count = ir::reduce(Op::ReduceSum, ir::cast(valid, v->dtype), {0});
    return ir::reshape(div(total, count), Shape{});
  });
}

}  // namespace kiln::decomp
