#pragma once
// The pointwise API: operators and free functions returning typed expressions.
#include <string>
#include <string_view>
#include <type_traits>

#include "kiln/tensor/expr.hpp"

namespace kiln {

namespace detail {
/// Tensor-like operands are held by value; C++ numbers become ScalarExpr.
template <class T>
auto as_operand(const T& v) {
  if constexpr (Scalar<T>)
    return ScalarExpr<std::remove_cvref_t<T>>(v);
  else
    return v.derived();
}
template <class T>
using operand_t = decltype(as_operand(std::declval<T>()));

template <class A, class B>
concept BinaryOperands = (TensorLike<A> && (TensorLike<B> || Scalar<B>)) || (Scalar<A> && TensorLike<B>);
}  // namespace detail

#define KILN_UNARY_FN(name, F) \
  template <class A>           \
  requires TensorLike<A>       \
  auto name(const A& a) { return UnaryExpr<detail::Fn::F, detail::expr_t<A>>(a.derived()); }

/// Elementwise functions (PyTorch semantics; integer inputs of float functions give float32).
KILN_UNARY_FN(neg, Neg)  // -x, as torch.neg
KILN_UNARY_FN(abs, Abs)
KILN_UNARY_FN(exp, Exp)
KILN_UNARY_FN(exp2, Exp2)
KILN_UNARY_FN(log, Log)
KILN_UNARY_FN(log2, Log2)
KILN_UNARY_FN(log1p, Log1p)
KILN_UNARY_FN(expm1, Expm1)
KILN_UNARY_FN(sqrt, Sqrt)
KILN_UNARY_FN(rsqrt, Rsqrt)
KILN_UNARY_FN(sin, Sin)
KILN_UNARY_FN(cos, Cos)
KILN_UNARY_FN(tan, Tan)
KILN_UNARY_FN(tanh, Tanh)
KILN_UNARY_FN(erf, Erf)
KILN_UNARY_FN(erfc, Erfc)        // 1 - erf(x) without the cancellation (torch.erfc)
KILN_UNARY_FN(lgamma, Lgamma)    // log |Gamma(x)| (torch.lgamma); gradient digamma(x)
KILN_UNARY_FN(digamma, Digamma)  // d/dx lgamma(x) (torch.digamma); gradient trigamma(x)
KILN_UNARY_FN(erfinv, Erfinv)    // the inverse of erf on [-1, 1] (torch.erfinv); gradient sqrt(pi)/2 e^(r^2)
KILN_UNARY_FN(floor, Floor)
KILN_UNARY_FN(ceil, Ceil)
KILN_UNARY_FN(round, Round)
KILN_UNARY_FN(sigmoid, Sigmoid)
KILN_UNARY_FN(relu, Relu)
KILN_UNARY_FN(silu, Silu)
KILN_UNARY_FN(logical_not, Not)
KILN_UNARY_FN(isnan, IsNan)
KILN_UNARY_FN(isinf, IsInf)
KILN_UNARY_FN(atan, Atan)
KILN_UNARY_FN(asin, Asin)
KILN_UNARY_FN(acos, Acos)
KILN_UNARY_FN(sinh, Sinh)
KILN_UNARY_FN(cosh, Cosh)
KILN_UNARY_FN(asinh, Asinh)
KILN_UNARY_FN(acosh, Acosh)
KILN_UNARY_FN(atanh, Atanh)
KILN_UNARY_FN(reciprocal, Reciprocal)
KILN_UNARY_FN(sign, Sign)
KILN_UNARY_FN(square, Square)
KILN_UNARY_FN(trunc, Trunc)
KILN_UNARY_FN(bitwise_not, BitNot)
KILN_UNARY_FN(operator~, BitNot)
#undef KILN_UNARY_FN

/// GELU, exact (erf) or with the tanh approximation.
template <class A>
requires TensorLike<A> Tensor gelu(const A& a, bool tanh_approx = false) {
  if (tanh_approx) return UnaryExpr<detail::Fn::GeluTanh, detail::expr_t<A>>(a.derived());
  return UnaryExpr<detail::Fn::Gelu, detail::expr_t<A>>(a.derived());
}
/// GELU with torch.nn.functional.gelu's `approximate`: "none" (erf) or "tanh"; any other word is
/// a ValueError. (Without this overload a string would convert to the bool above: true.)
template <class A>
requires TensorLike<A> Tensor gelu(const A& a, std::string_view approximate) {
  if (approximate != "none" && approximate != "tanh")
    throw ValueError("gelu: approximate must be 'none' or 'tanh', got '" + std::string(approximate) + "'");
  return gelu(a, approximate == "tanh");
}
template <class A>
requires TensorLike<A> Tensor gelu(const A& a, const char* approximate) {
  return gelu(a, std::string_view(approximate));
}

template <class A>
requires TensorLike<A>
auto operator-(const A& a) { return UnaryExpr<detail::Fn::Neg, detail::expr_t<A>>(a.derived()); }
template <class A>
requires TensorLike<A>
auto operator!(const A& a) { return UnaryExpr<detail::Fn::Not, detail::expr_t<A>>(a.derived()); }

#define KILN_BINARY_FN(name, F)                                                                          \
  template <class A, class B>                                                                            \
  requires detail::BinaryOperands<A, B>                                                                  \
  auto name(const A& a, const B& b) {                                                                    \
    return BinaryExpr<detail::Fn::F, detail::operand_t<A>, detail::operand_t<B>>(detail::as_operand(a),  \
                                                                                 detail::as_operand(b)); \
  }

KILN_BINARY_FN(operator+, Add)
KILN_BINARY_FN(operator-, Sub)
KILN_BINARY_FN(operator*, Mul)
KILN_BINARY_FN(operator/, Div)
KILN_BINARY_FN(operator==, Eq)
KILN_BINARY_FN(operator!=, Ne)
KILN_BINARY_FN(operator<, Lt)
KILN_BINARY_FN(operator<=, Le)
KILN_BINARY_FN(operator>, Gt)
KILN_BINARY_FN(operator>=, Ge)
KILN_BINARY_FN(operator&&, And)
KILN_BINARY_FN(operator||, Or)
KILN_BINARY_FN(add, Add)
KILN_BINARY_FN(sub, Sub)
KILN_BINARY_FN(mul, Mul)
KILN_BINARY_FN(div, Div)
KILN_BINARY_FN(pow, Pow)
KILN_BINARY_FN(maximum, Maximum)
KILN_BINARY_FN(minimum, Minimum)
KILN_BINARY_FN(eq, Eq)
KILN_BINARY_FN(ne, Ne)
KILN_BINARY_FN(lt, Lt)
KILN_BINARY_FN(le, Le)
KILN_BINARY_FN(gt, Gt)
KILN_BINARY_FN(ge, Ge)
KILN_BINARY_FN(logical_and, And)
KILN_BINARY_FN(logical_or, Or)
KILN_BINARY_FN(logical_xor, Xor)
KILN_BINARY_FN(atan2, Atan2)
KILN_BINARY_FN(hypot, Hypot)
KILN_BINARY_FN(copysign, Copysign)  // |a| with the sign bit of b (torch.copysign)
KILN_BINARY_FN(fmod, Fmod)
KILN_BINARY_FN(remainder, Remainder)
KILN_BINARY_FN(operator%, Remainder)
KILN_BINARY_FN(bitwise_and, BitAnd)
KILN_BINARY_FN(bitwise_or, BitOr)
KILN_BINARY_FN(bitwise_xor, BitXor)
KILN_BINARY_FN(operator&, BitAnd)
KILN_BINARY_FN(operator|, BitOr)
KILN_BINARY_FN(operator^, BitXor)
KILN_BINARY_FN(left_shift, Shl)
KILN_BINARY_FN(right_shift, Shr)
KILN_BINARY_FN(operator<<, Shl)
KILN_BINARY_FN(operator>>, Shr)
#undef KILN_BINARY_FN

namespace detail {
/// A clamp operand in the dtype all three operands promote to (numbers stay numbers: they
/// never widen a tensor's dtype).
template <class T>
auto clamp_operand(const T& v, DType dtype) {
  if constexpr (Scalar<T>)
    return v;
  else
    return v.dtype() == dtype ? Tensor(v) : Tensor(v).to(dtype);
}
}  // namespace detail

/// Elements of a where cond is true, else of b (cond must be bool; a, b tensors or numbers).
template <class C, class A, class B>
requires TensorLike<C> &&
    (TensorLike<A> || Scalar<A>)&&(TensorLike<B> || Scalar<B>)auto where(const C& cond, const A& a, const B& b) {
  return WhereExpr<detail::expr_t<C>, detail::operand_t<A>, detail::operand_t<B>>(
      cond.derived(), detail::as_operand(a), detail::as_operand(b));
}

namespace detail {
/// A number bound of clamp as a 0-dim tensor of the result dtype (a number would promote an
/// integer where()).
template <class T>
Tensor clamp_bound(const T& v, DType dtype, Device device) {
  return Tensor(ir::constant(static_cast<double>(v), dtype, Shape{}, device));
}

/// v kept where it is at or above (`lower`) or at or below the number bound b, else b: at the
/// bound v is kept (the same value; the gradient goes to v, torch's subgradient 1). A NaN v or b
/// propagates.
inline Tensor clamp_to(const Tensor& v, const Tensor& b, bool lower) {
  const Tensor inside = lower ? Tensor(v >= b) : Tensor(v <= b);
  if (!is_floating(v.dtype())) return where(inside, v, b);
  return where(logical_or(inside, isnan(v)), v, b);
}

/// One tensor bound as torch's clamp_min.Tensor / clamp_max.Tensor differentiate it: v where it
/// is at or inside the bound b (the gradient to v, a tie included), b where v is beyond it (the
/// gradient to b), NaN without a gradient where either is NaN.
inline Tensor clamp_to_tensor(const Tensor& v, const Tensor& b, bool lower) {
  const Tensor keep = lower ? Tensor(v >= b) : Tensor(v <= b);
  if (!is_floating(v.dtype())) return where(keep, v, b);
  const Tensor beyond = lower ? Tensor(v < b) : Tensor(v > b);
  return where(keep, v, where(beyond, b, Tensor(v + b).detach()));
}

/// ShapeError naming `op` and the input's and the tensor bound's shapes and dtypes unless they
/// broadcast (checked before the operands are converted, so the message shows the caller's).
template <class B>
void check_clamp_bound(const Tensor& x, const B& bound, const char* op) {
  if constexpr (!Scalar<B>) {
    const Tensor b = bound.derived();
    try {
      broadcast_shapes(x.shape(), b.shape(), op);
    } catch (const ShapeError&) {
      throw ShapeError(std::string(op) + ": the bound " + dtype_name(b.dtype()) + b.shape().str() +
                       " does not broadcast with the input " + dtype_name(x.dtype()) + x.shape().str());
    }
  }
}

/// A clamp bound as a tensor of the result dtype: a number as clamp_bound's 0-dim tensor.
template <class T>
Tensor clamp_bound_tensor(const T& b, DType dtype, Device device) {
  if constexpr (Scalar<T>)
    return clamp_bound(b, dtype, device);
  else
    return clamp_operand(b, dtype);
}

/// r, except that where x is NaN the result is x's NaN without a gradient (torch's clamp
/// backward compares lo <= x <= hi, false at NaN). Integers: r.
inline Tensor nan_without_gradient(const Tensor& x, const Tensor& r) {
  return is_floating(x.dtype()) ? Tensor(where(isnan(x), x.detach(), r)) : r;
}

}  // namespace detail

/// min(max(x, lo), hi), NaN propagating (torch.clamp). The dtype is torch.result_type over
/// all three operands at once, not pairwise. Gradients as PyTorch's: x gets it where lo <= x <=
/// hi (the bounds included: torch's subgradient 1) and none where it is NaN; a tensor bound
/// (torch's Tensor overload, a number beside it taken as a tensor) gets it where x is beyond it.
/// With lo > hi the result is hi and the gradient goes to hi (torch's formula also credits lo
/// where x < lo).
template <class A, class L, class H>
requires TensorLike<A> &&(TensorLike<L> || Scalar<L>)&&(TensorLike<H> || Scalar<H>)Tensor
    clamp(const A& x, const L& lo, const H& hi) {
  detail::ResultType rt;
  rt.add(detail::info_of(x.derived()));
  rt.add(detail::info_of(detail::as_operand(lo)));
  rt.add(detail::info_of(detail::as_operand(hi)));
  const DType dt = rt.result();
  if (dt == DType::Bool)  // as PyTorch: clamp is not implemented for bool
    throw DTypeError(std::string("clamp: not supported for bool tensors, got bool") +
                     detail::shape_of(x.derived(), "clamp").to_shape().str() + " with bool bounds");
  Tensor v = detail::clamp_operand(x.derived(), dt);
  if constexpr (!(Scalar<L> && Scalar<H>)) {
    const Tensor xt = x.derived();
    detail::check_clamp_bound(xt, lo, "clamp");
    detail::check_clamp_bound(xt, hi, "clamp");
    const Tensor low = detail::clamp_to_tensor(v, detail::clamp_bound_tensor(lo, dt, v.device()), true);
    return detail::clamp_to_tensor(low, detail::clamp_bound_tensor(hi, dt, v.device()), false);
  } else {
    // lo first, then hi: a bound above the other gives hi, as min(max(x, lo), hi).
    const Tensor low = detail::clamp_to(v, detail::clamp_bound(lo, dt, v.device()), true);
    return detail::nan_without_gradient(v, detail::clamp_to(low, detail::clamp_bound(hi, dt, v.device()), false));
  }
}

namespace detail {
/// clamp with one bound (torch.clamp_min / clamp_max): the dtype torch.result_type gives over x
/// and the bound; gradients as clamp's (x's at the bound included, a tensor bound's beyond it).
template <class A, class B>
Tensor clamp_side(const A& x, const B& bound, bool lower, const char* op) {
  ResultType rt;
  rt.add(info_of(x.derived()));
  rt.add(info_of(as_operand(bound)));
  const DType dt = rt.result();
  if (dt == DType::Bool)
    throw DTypeError(std::string(op) + ": not supported for bool tensors, got bool" +
                     shape_of(x.derived(), op).to_shape().str() + " with a bool bound");
  Tensor v = clamp_operand(x.derived(), dt);
  if constexpr (!Scalar<B>) {
    check_clamp_bound(Tensor(x.derived()), bound, op);
    return clamp_to_tensor(v, clamp_operand(bound, dt), lower);
  } else {
    return nan_without_gradient(v, clamp_to(v, clamp_bound(bound, dt, v.device()), lower));
  }
}
}  // namespace detail

}  // namespace kiln
