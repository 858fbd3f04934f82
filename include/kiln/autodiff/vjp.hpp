#pragma once
// The vector-Jacobian rule of every primitive: given a node n and g, the gradient of the loss
// with respect to n (n's shape and dtype), the gradients with respect to n's inputs, as new
// lazy nodes. The rules are the op table's gradient column: `Vjp<op>` is specialised once per
// row of KILN_IR_OPS (a row without one does not compile), and kVjpRules lists them in table
// order. Each rule builds primitives only, so a backward graph is decomposed, fused, compiled
// and cached like any forward graph; the values a rule reads from the forward (an input, the
// output) are the forward's nodes themselves, realized or recomputed where they are lazy.
//
// Special values follow PyTorch's derivatives.yaml: relu'(0) = 0 (relu is a where, not a
// maximum), maximum/minimum split ties evenly, abs'(0) = 0, sqrt'(0) = inf, max and min split the
// gradient evenly among ties, floor/ceil/round have zero gradient, comparisons and integer
// results none.
#include <cmath>
#include <numbers>
#include <vector>

#include "kiln/ir/builder.hpp"
#include "kiln/ir/special.hpp"

namespace kiln::autodiff {

using ir::NodePtr;
using ir::Op;
using Grads = std::vector<NodePtr>;  ///< one per input; null: no gradient flows there

namespace vjp_detail {

/// The scalar `v` as a node like `like` (its dtype, shape and device).
inline NodePtr constant_like(const NodePtr& like, double v) {
  return ir::constant(v, like->dtype, like->shape, like->device);
}
inline NodePtr add(const NodePtr& a, const NodePtr& b) { return ir::binary(Op::Add, a, b); }
inline NodePtr sub(const NodePtr& a, const NodePtr& b) { return ir::binary(Op::Sub, a, b); }
inline NodePtr mul(const NodePtr& a, const NodePtr& b) { return ir::binary(Op::Mul, a, b); }
inline NodePtr div(const NodePtr& a, const NodePtr& b) { return ir::binary(Op::Div, a, b); }
inline NodePtr neg(const NodePtr& a) { return ir::unary(Op::Neg, a); }
inline NodePtr scale(const NodePtr& a, double v) { return mul(a, constant_like(a, v)); }
inline NodePtr zeros_like(const NodePtr& a) { return constant_like(a, 0.0); }
inline NodePtr compare(Op op, const NodePtr& a, const NodePtr& b) { return ir::binary(op, a, b); }
/// g summed over the dims where `shape` is 1 and g's is not (undoing a broadcast).
inline NodePtr sum_to(const NodePtr& g, const Shape& shape) {
  std::vector<std::int64_t> axes;
  for (std::size_t d = 0; d < shape.size(); ++d)
    if (shape[d] == 1 && g->shape[d] != 1) axes.push_back(static_cast<std::int64_t>(d));
  return axes.empty() ? g : ir::reduce(Op::ReduceSum, g, axes);
}
using ir::flip;
/// The int64 positions 0, 1, ... along `axis` of `shape`.
inline NodePtr positions(const Shape& shape, std::int64_t axis, Device device) {
  return ir::iota(shape, axis, DType::Int64, device);
}
inline const NodePtr& in(const NodePtr& n, std::size_t i) { return n->inputs[i]; }
inline bool floating(const NodePtr& x) { return is_floating(x->dtype); }

}  // namespace vjp_detail

/// The rule of one primitive: `apply(n, g)` gives the gradients of n's inputs.
template <Op op>
struct Vjp;

/// Ops whose result carries no gradient (integer or bool results, leaves).
struct NoGradient {
  static Grads apply(const NodePtr& n, const NodePtr&) { return Grads(n->inputs.size()); }
};

/// Pointwise ops of zero derivative almost everywhere (floor, ceil, round): a zero gradient,
/// as PyTorch gives, not none.
struct ZeroGradient {
  static Grads apply(const NodePtr&, const NodePtr& g) { return {vjp_detail::zeros_like(g)}; }
};

// ---- leaves ----------------------------------------------------------------------------
template <> struct Vjp<Op::Input> : NoGradient {};
template <> struct Vjp<Op::Constant> : NoGradient {};
template <> struct Vjp<Op::Iota> : NoGradient {};
template <> struct Vjp<Op::Random> : NoGradient {};

// ---- unary -----------------------------------------------------------------------------
template <> struct Vjp<Op::Neg> {
  static Grads apply(const NodePtr&, const NodePtr& g) { return {vjp_detail::neg(g)}; }
};
template <> struct Vjp<Op::Abs> {
  // g * sign(x): abs'(0) = 0.
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    using namespace vjp_detail;
    const NodePtr& x = in(n, 0);
    if (!floating(x)) return {nullptr};
    NodePtr z = zeros_like(x);
    return {ir::where(compare(Op::Gt, x, z), g, ir::where(compare(Op::Lt, x, z), neg(g), zeros_like(g)))};
  }
};
template <> struct Vjp<Op::Exp> {
  static Grads apply(const NodePtr& n, const NodePtr& g) { return {vjp_detail::mul(g, n)}; }
};
template <> struct Vjp<Op::Exp2> {
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    return {vjp_detail::mul(g, vjp_detail::scale(n, std::numbers::ln2))};
  }
};
template <> struct Vjp<Op::Log> {
  static Grads apply(const NodePtr& n, const NodePtr& g) { return {vjp_detail::div(g, vjp_detail::in(n, 0))}; }
};
template <> struct Vjp<Op::Log2> {
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    using namespace vjp_detail;
    return {div(g, scale(in(n, 0), std::numbers::ln2))};
  }
};
template <> struct Vjp<Op::Log1p> {
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    using namespace vjp_detail;
    return {div(g, add(in(n, 0), constant_like(g, 1.0)))};
  }
};
template <> struct Vjp<Op::Expm1> {
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    using namespace vjp_detail;
    return {mul(g, add(n, constant_like(g, 1.0)))};
  }
};
template <> struct Vjp<Op::Sqrt> {
  // g / (2 sqrt(x)): inf at 0, as PyTorch.
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    using namespace vjp_detail;
    return {div(g, scale(n, 2.0))};
  }
};
template <> struct Vjp<Op::Rsqrt> {
  // -g / 2 * x^(-3/2) = -g / 2 * rsqrt(x)^3.
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    using namespace vjp_detail;
    return {mul(scale(g, -0.5), mul(n, mul(n, n)))};
  }
};
template <> struct Vjp<Op::Sin> {
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    return {vjp_detail::mul(g, ir::unary(Op::Cos, vjp_detail::in(n, 0)))};
  }
};
template <> struct Vjp<Op::Cos> {
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    return {vjp_detail::neg(vjp_detail::mul(g, ir::unary(Op::Sin, vjp_detail::in(n, 0))))};
  }
};
template <> struct Vjp<Op::Tan> {
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    using namespace vjp_detail;
    return {mul(g, add(constant_like(g, 1.0), mul(n, n)))};
  }
};
template <> struct Vjp<Op::Tanh> {
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    using namespace vjp_detail;
    return {mul(g, sub(constant_like(g, 1.0), mul(n, n)))};
  }
};
template <> struct Vjp<Op::Erf> {
  // g * 2/sqrt(pi) * exp(-x^2).
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    using namespace vjp_detail;
    const NodePtr& x = in(n, 0);
    return {mul(scale(g, 2.0 / std::sqrt(std::numbers::pi)), ir::unary(Op::Exp, neg(mul(x, x))))};
  }
};
template <> struct Vjp<Op::Erfc> {
  // -g * 2/sqrt(pi) * exp(-x^2).
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    using namespace vjp_detail;
    const NodePtr& x = in(n, 0);
    return {mul(scale(g, -2.0 / std::sqrt(std::numbers::pi)), ir::unary(Op::Exp, neg(mul(x, x))))};
  }
};
template <> struct Vjp<Op::Lgamma> {
  // g * digamma(x) (infinite at the poles, as torch's).
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    using namespace vjp_detail;
    return {mul(g, ir::special::digamma(in(n, 0)))};
  }
};
template <> struct Vjp<Op::Atan> {
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    using namespace vjp_detail;
    const NodePtr& x = in(n, 0);
    return {div(g, add(constant_like(g, 1.0), mul(x, x)))};
  }
};
template <> struct Vjp<Op::Asin> {
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    using namespace vjp_detail;
    const NodePtr& x = in(n, 0);
    return {div(g, ir::unary(Op::Sqrt, sub(constant_like(g, 1.0), mul(x, x))))};
  }
};
template <> struct Vjp<Op::Acos> {
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    using namespace vjp_detail;
    const NodePtr& x = in(n, 0);
    return {neg(div(g, ir::unary(Op::Sqrt, sub(constant_like(g, 1.0), mul(x, x)))))};
  }
};
template <> struct Vjp<Op::Floor> : ZeroGradient {};
template <> struct Vjp<Op::Ceil> : ZeroGradient {};
template <> struct Vjp<Op::Round> : ZeroGradient {};
template <> struct Vjp<Op::Not> : NoGradient {};
template <> struct Vjp<Op::IsNan> : NoGradient {};
template <> struct Vjp<Op::IsInf> : NoGradient {};
template <> struct Vjp<Op::BitNot> : NoGradient {};
template <> struct Vjp<Op::Cast> {
  // The gradient converted back to the input's dtype; none into an integer or bool input.
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    const NodePtr& x = vjp_detail::in(n, 0);
    if (!vjp_detail::floating(x)) return {nullptr};
    return {ir::cast(g, x->dtype)};
  }
};

// ---- binary ----------------------------------------------------------------------------
template <> struct Vjp<Op::Add> {
  static Grads apply(const NodePtr&, const NodePtr& g) { return {g, g}; }
};
template <> struct Vjp<Op::Sub> {
  static Grads apply(const NodePtr&, const NodePtr& g) { return {g, vjp_detail::neg(g)}; }
};
template <> struct Vjp<Op::Mul> {
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    using namespace vjp_detail;
    return {mul(g, in(n, 1)), mul(g, in(n, 0))};
  }
};
template <> struct Vjp<Op::Div> {
  // d/da = g / b; d/db = -g * a / b^2 = -(g / b) * (a / b).
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    using namespace vjp_detail;
    NodePtr ga = div(g, in(n, 1));
    return {ga, neg(mul(ga, n))};
  }
};
template <> struct Vjp<Op::Pow> {
  // d/da = g * b * a^(b-1) (0 where b == 0, as PyTorch); d/db = g * a^b * log(a), 0 where
  // a == 0 and b >= 0 (PyTorch's mask).
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    using namespace vjp_detail;
    const NodePtr &a = in(n, 0), &b = in(n, 1);
    NodePtr zero = zeros_like(a);
    NodePtr ga = ir::where(compare(Op::Eq, b, zero), zero,
                       mul(g, mul(b, ir::binary(Op::Pow, a, sub(b, constant_like(b, 1.0))))));
    NodePtr gb = ir::where(ir::binary(Op::And, compare(Op::Eq, a, zero), compare(Op::Ge, b, zero)), zero,
                       mul(g, mul(n, ir::unary(Op::Log, a))));
    return {ga, gb};
  }
};
/// maximum/minimum: the gradient goes to the chosen input, split evenly on ties (PyTorch).
template <Op kPick>
struct PickOfTwo {
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    using namespace vjp_detail;
    const NodePtr &a = in(n, 0), &b = in(n, 1);
    NodePtr half = scale(g, 0.5), zero = zeros_like(g);
    NodePtr tie = compare(Op::Eq, a, b);
    return {ir::where(tie, half, ir::where(compare(kPick, a, b), g, zero)),
            ir::where(tie, half, ir::where(compare(kPick, b, a), g, zero))};
  }
};
template <> struct Vjp<Op::Maximum> : PickOfTwo<Op::Gt> {};
template <> struct Vjp<Op::Minimum> : PickOfTwo<Op::Lt> {};
template <> struct Vjp<Op::Eq> : NoGradient {};
template <> struct Vjp<Op::Ne> : NoGradient {};
template <> struct Vjp<Op::Lt> : NoGradient {};
template <> struct Vjp<Op::Le> : NoGradient {};
template <> struct Vjp<Op::Gt> : NoGradient {};
template <> struct Vjp<Op::Ge> : NoGradient {};
template <> struct Vjp<Op::And> : NoGradient {};
template <> struct Vjp<Op::Or> : NoGradient {};
template <> struct Vjp<Op::Atan2> {
  // atan2(a, b): d/da = g b / (a^2 + b^2), d/db = -g a / (a^2 + b^2).
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    using namespace vjp_detail;
    const NodePtr &a = in(n, 0), &b = in(n, 1);
    NodePtr r = div(g, add(mul(a, a), mul(b, b)));
    return {mul(r, b), neg(mul(r, a))};
  }
};
template <> struct Vjp<Op::Hypot> {
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    using namespace vjp_detail;
    NodePtr r = div(g, n);
    return {mul(r, in(n, 0)), mul(r, in(n, 1))};
  }
};
template <> struct Vjp<Op::Copysign> {
  // torch's: g * result / a, 0 where a is 0 (NaN where a is NaN); b gets zeros.
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    using namespace vjp_detail;
    const NodePtr& a = in(n, 0);
    const NodePtr ratio = ir::where(compare(Op::Eq, a, zeros_like(a)), zeros_like(a), div(n, a));
    return {mul(g, ratio), zeros_like(in(n, 1))};
  }
};
template <> struct Vjp<Op::Fmod> {
  // fmod(a, b) = a - trunc(a / b) b: d/da = g, d/db = -g trunc(a / b).
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    using namespace vjp_detail;
    if (!floating(in(n, 0))) return {nullptr, nullptr};
    NodePtr q = div(in(n, 0), in(n, 1));
    NodePtr trunc = ir::where(compare(Op::Lt, q, zeros_like(q)), ir::unary(Op::Ceil, q), ir::unary(Op::Floor, q));
    return {g, neg(mul(g, trunc))};
  }
};
template <> struct Vjp<Op::BitAnd> : NoGradient {};
template <> struct Vjp<Op::BitOr> : NoGradient {};
template <> struct Vjp<Op::BitXor> : NoGradient {};
template <> struct Vjp<Op::Shl> : NoGradient {};
template <> struct Vjp<Op::Shr> : NoGradient {};

// ---- ternary ---------------------------------------------------------------------------
template <> struct Vjp<Op::Where> {
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    using namespace vjp_detail;
    const NodePtr& c = in(n, 0);
    NodePtr zero = zeros_like(g);
    return {nullptr, ir::where(c, g, zero), ir::where(c, zero, g)};
  }
};

// ---- reductions ------------------------------------------------------------------------
template <> struct Vjp<Op::ReduceSum> {
  static Grads apply(const NodePtr& n, const NodePtr& g) { return {ir::broadcast(g, vjp_detail::in(n, 0)->shape)}; }
};
template <> struct Vjp<Op::ReduceProd> {
  // The product of the others: out / x where no element of the reduced set is zero; where one
  // is, only that element gets the product of the rest; with two or more, none.
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    using namespace vjp_detail;
    const NodePtr& x = in(n, 0);
    const Shape& s = x->shape;
    NodePtr zero = zeros_like(x), one = constant_like(x, 1.0);
    NodePtr is_zero = compare(Op::Eq, x, zero);
    NodePtr zeros = ir::reduce(Op::ReduceSum, ir::where(is_zero, one, zero), n->attrs.ints);
    NodePtr rest = ir::reduce(Op::ReduceProd, ir::where(is_zero, one, x), n->attrs.ints);
    NodePtr gb = ir::broadcast(g, s), zb = ir::broadcast(zeros, s);
    NodePtr none_zero = div(ir::broadcast(n, s), x);
    NodePtr others = ir::where(compare(Op::Eq, zb, zero), none_zero,
                           ir::where(ir::binary(Op::And, is_zero, compare(Op::Eq, zb, one)), ir::broadcast(rest, s), zero));
    return {mul(gb, others)};
  }
};
/// max/min over axes: the gradient split evenly among the elements equal to the result.
// The gradient split evenly among the elements equal to the result, and where the result is
// NaN among the NaN elements (torch.max()'s evenly_distribute_backward; torch.amax's rule
// would give NaN everywhere there).
struct ReduceExtreme {
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    using namespace vjp_detail;
    const NodePtr& x = in(n, 0);
    const Shape& s = x->shape;
    const NodePtr result = ir::broadcast(n, s);
    NodePtr hit = compare(Op::Eq, x, result);
    if (floating(x))
      hit = ir::binary(Op::Or, hit, ir::binary(Op::And, ir::unary(Op::IsNan, x), ir::unary(Op::IsNan, result)));
    NodePtr count = ir::reduce(Op::ReduceSum, ir::where(hit, constant_like(x, 1.0), zeros_like(x)), n->attrs.ints);
    return {ir::where(hit, ir::broadcast(div(g, count), s), zeros_like(x))};
  }
};
template <> struct Vjp<Op::ReduceMax> : ReduceExtreme {};
template <> struct Vjp<Op::ReduceMin> : ReduceExtreme {};
template <> struct Vjp<Op::ArgMax> : NoGradient {};
template <> struct Vjp<Op::ArgMin> : NoGradient {};

// ---- index maps ------------------------------------------------------------------------
template <> struct Vjp<Op::Broadcast> {
  static Grads apply(const NodePtr& n, const NodePtr& g) { return {vjp_detail::sum_to(g, vjp_detail::in(n, 0)->shape)}; }
};
template <> struct Vjp<Op::Reshape> {
  static Grads apply(const NodePtr& n, const NodePtr& g) { return {ir::reshape(g, vjp_detail::in(n, 0)->shape)}; }
};
template <> struct Vjp<Op::Permute> {
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    const auto& perm = n->attrs.ints;
    std::vector<std::int64_t> inverse(perm.size());
    for (std::size_t i = 0; i < perm.size(); ++i) inverse[static_cast<std::size_t>(perm[i])] = static_cast<std::int64_t>(i);
    // The gradient of a transposed weight (x W^T) arrives as the product x^T g: its transpose
    // is the product g^T x, computed in the weight's layout instead of transposed after. Also
    // through the cast that converts the product back to the weight's dtype (autocast's
    // cast(W^T) to bfloat16: a tied head's d(wte) was otherwise a [768, V] product whose
    // transpose the embedding's gradient was added to, read across rows).
    const std::size_t r = perm.size();
    bool swaps_last_two = r >= 2 && perm[r - 1] == static_cast<std::int64_t>(r - 2) &&
                          perm[r - 2] == static_cast<std::int64_t>(r - 1);
    for (std::size_t i = 0; i + 2 < r && swaps_last_two; ++i) swaps_last_two = perm[i] == static_cast<std::int64_t>(i);
    auto transposed_product = [&](const NodePtr& mm) {
      return ir::matmul(ir::permute(mm->inputs[1], perm), ir::permute(mm->inputs[0], perm));
    };
    if (swaps_last_two && g->op == Op::MatMul && !g->realized()) return {transposed_product(g)};
    if (swaps_last_two && g->op == Op::Cast && !g->realized() && g->inputs[0]->op == Op::MatMul &&
        !g->inputs[0]->realized())
      return {ir::cast(transposed_product(g->inputs[0]), g->dtype)};
    return {ir::permute(g, inverse)};
  }
};
template <> struct Vjp<Op::Slice> {
  // The gradient in the sliced places, zeros elsewhere: zeros joined around it for a step of
  // one, a scatter of it for other steps.
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    using namespace vjp_detail;
    const NodePtr& x = in(n, 0);
    const std::int64_t axis = n->attrs.ints[0], start = n->attrs.ints[1], step = n->attrs.ints[2];
    const auto a = static_cast<std::size_t>(axis);
    const std::int64_t size = n->shape[a], full = x->shape[a];
    if (size == 0) return {ir::constant(0.0, x->dtype, x->shape, x->device)};
    if (step == 1) {
      std::vector<NodePtr> parts;
      Shape before = x->shape, after = x->shape;
      before[a] = start;
      after[a] = full - start - size;
      if (start > 0) parts.push_back(ir::constant(0.0, g->dtype, before, g->device));
      parts.push_back(g);
      if (after[a] > 0) parts.push_back(ir::constant(0.0, g->dtype, after, g->device));
      return {ir::concat(parts, axis)};
    }
    NodePtr where_to = ir::binary(Op::Add, ir::constant_int(start, DType::Int64, g->shape, g->device),
                                  ir::binary(Op::Mul, positions(g->shape, axis, g->device),
                                             ir::constant_int(step, DType::Int64, g->shape, g->device)));
    return {ir::scatter(ir::constant(0.0, x->dtype, x->shape, x->device), where_to, g, axis, false, false,
                        ir::GatherSite::Scatter)};
  }
};
template <> struct Vjp<Op::Concat> {
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    const std::int64_t axis = n->attrs.ints[0];
    Grads out;
    std::int64_t at = 0;
    for (const NodePtr& x : n->inputs) {
      const std::int64_t size = x->shape[static_cast<std::size_t>(axis)];
      out.push_back(ir::slice(g, axis, at, size, 1));
      at += size;
    }
    return out;
  }
};

// ---- data-dependent reads and writes ---------------------------------------------------
template <> struct Vjp<Op::Gather> {
  // The gradient added back where each element was read from (deterministic scatter-add).
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    const NodePtr &x = vjp_detail::in(n, 0), &index = vjp_detail::in(n, 1);
    return {ir::scatter(ir::constant(0.0, x->dtype, x->shape, x->device), index, g, n->attrs.ints[0], true, false,
                        ir::GatherSite::ScatterAdd),
            nullptr};
  }
};
template <> struct Vjp<Op::Scatter> {
  // Adding: the base's gradient is g, the source's g read where it was added. Writing: the
  // overwritten places of the base get none (g with zeros written there), the source g read.
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    using namespace vjp_detail;
    const NodePtr &index = in(n, 1), &src = in(n, 2);
    const std::int64_t axis = n->attrs.ints[0];
    const bool accumulate = n->attrs.ints[1] != 0;
    NodePtr gsrc = ir::gather(g, index, axis, ir::GatherSite::Gather);
    NodePtr gbase = accumulate ? g
                               : ir::scatter(g, index, ir::constant(0.0, g->dtype, src->shape, g->device), axis, false,
                                             false, ir::GatherSite::Scatter);
    return {gbase, nullptr, gsrc};
  }
};

// ---- scans -----------------------------------------------------------------------------
template <> struct Vjp<Op::Scan> {
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    using namespace vjp_detail;
    const NodePtr& x = in(n, 0);
    const std::int64_t axis = n->attrs.ints[0];
    const auto kind = static_cast<ir::ScanKind>(n->attrs.ints[1]);
    if (!floating(x) || !floating(n)) return {nullptr};
    // sum over j >= i of v_j: a cumsum of the reversed values, reversed.
    auto reverse_cumsum = [&](const NodePtr& v) {
      return flip(ir::scan(flip(v, axis), axis, ir::ScanKind::Sum, v->dtype), axis);
    };
    switch (kind) {
      case ir::ScanKind::Sum:
        return {reverse_cumsum(g)};
      case ir::ScanKind::Prod: {
        // d out_j / d x_i = the product of x_m for m <= j, m != i (j >= i), zeros included, as
        // PyTorch's cumprod_backward:
        // - before the row's first zero: sum_{j >= i} g_j out_j / x_i (x_i is not 0 there);
        // - at the first zero k: sum_{j >= k} g_j cumprod(y)_j, y = x with x_k replaced by 1 (the
        //   product of the others; a later zero makes the later terms 0 by itself);
        // - after it: 0 (every product left holds x_k = 0).
        NodePtr one = constant_like(x, 1.0);
        NodePtr is_zero = compare(Op::Eq, x, zeros_like(x));
        NodePtr zeros_so_far = ir::scan(ir::cast(is_zero, DType::Int64), axis, ir::ScanKind::Sum, DType::Int64);
        NodePtr before = compare(Op::Eq, zeros_so_far, zeros_like(zeros_so_far));
        NodePtr first_zero = ir::binary(Op::And, is_zero, compare(Op::Eq, zeros_so_far, constant_like(zeros_so_far, 1.0)));
        NodePtr y = ir::where(first_zero, one, x);
        NodePtr at_zero = reverse_cumsum(mul(g, ir::scan(y, axis, ir::ScanKind::Prod, y->dtype)));
        NodePtr ahead = div(reverse_cumsum(mul(g, n)), ir::where(before, x, one));
        return {ir::where(before, ahead, ir::where(first_zero, at_zero, zeros_like(g)))};
      }
      case ir::ScanKind::Max:
      case ir::ScanKind::Min: {
        // Each output took its value from one position (torch.cummax's index): add g there.
        NodePtr where_from = ir::scan(x, axis, kind == ir::ScanKind::Max ? ir::ScanKind::ArgMax : ir::ScanKind::ArgMin,
                                      DType::Int64);
        return {ir::scatter(zeros_like(x), where_from, g, axis, true, false, ir::GatherSite::ScatterAdd)};
      }
      case ir::ScanKind::LogSumExp: {
        // d out_j / d x_i = exp(x_i - out_j) (j >= i): sum_j g_j exp(x_i - out_j), with the
        // positive and negative parts of g each summed in log space (stable for large x).
        NodePtr zero = zeros_like(g);
        auto part = [&](const NodePtr& w) {  // exp(x + log sum_{j >= i} w_j exp(-out_j)), w >= 0
          NodePtr terms = sub(ir::unary(Op::Log, w), n);
          NodePtr rev = flip(ir::scan(flip(terms, axis), axis, ir::ScanKind::LogSumExp, terms->dtype), axis);
          return ir::unary(Op::Exp, add(x, rev));
        };
        NodePtr pos = ir::binary(Op::Maximum, g, zero), negp = ir::binary(Op::Maximum, neg(g), zero);
        return {sub(part(pos), part(negp))};
      }
      default:
        return {nullptr};  // ArgMax / ArgMin: integer results
    }
  }
};

// ---- sorting and contractions ----------------------------------------------------------
template <> struct Vjp<Op::Sort> : NoGradient {};  // positions; values are gathers of them
template <> struct Vjp<Op::MatMul> {
  // a [..., M, K] b [..., K, N]: da = g b^T, db = a^T g.
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    const NodePtr &a = vjp_detail::in(n, 0), &b = vjp_detail::in(n, 1);
    const std::size_t r = a->shape.size();
    std::vector<std::int64_t> t(r);
    for (std::size_t i = 0; i < r; ++i) t[i] = static_cast<std::int64_t>(i);
    std::swap(t[r - 1], t[r - 2]);
    return {ir::matmul(g, ir::permute(b, t)), ir::matmul(ir::permute(a, t), g)};
  }
};

template <> struct Vjp<Op::Attention> {
  // The output's gradients are the backward's three values, over the forward's operands, its
  // output, the incoming gradient and the rows' log-sum-exp (a sibling of the output: planned
  // into the same forward step when both are computed together). The mask gets none (the front
  // end writes attention out when a mask requires grad).
  static Grads apply(const NodePtr& n, const NodePtr& g) {
    const auto role = static_cast<ir::AttentionRole>(n->attrs.ints.at(0));
    if (role != ir::AttentionRole::Out)
      throw AutogradError(std::string("scaled_dot_product_attention: the fused kernel's ") +
                          (role == ir::AttentionRole::Lse ? "log-sum-exp" : "gradients") +
                          " have no gradient of their own (a double backward): compute attention written out "
                          "(softmax(q k^T * scale) v) to differentiate twice");
    const ir::AttentionAttrs a = ir::AttentionAttrs::of(n->attrs);
    const NodePtr &q = vjp_detail::in(n, 0), &k = vjp_detail::in(n, 1), &v = vjp_detail::in(n, 2);
    const NodePtr mask = a.has_mask ? n->inputs[static_cast<std::size_t>(a.mask_input())] : nullptr;
    ir::AttentionDropout dropout;
    if (a.has_dropout()) dropout = {a.dropout_p, n->inputs[static_cast<std::size_t>(a.seed_input())]};
    const double scale = n->attrs.scalar;
    NodePtr lse = ir::attention(ir::AttentionRole::Lse, q, k, v, mask, a.causal, scale, {}, dropout);
    Grads out = ir::attention_gradients(q, k, v, mask, a.causal, scale, n, g, lse, dropout);
    out.resize(n->inputs.size());  // the mask's and the key's: none
    return out;
  }
};

/// A rule in the table: the gradients of a node's inputs.
using VjpRule = Grads (*)(const NodePtr& n, const NodePtr& g);

/// The gradient column of the op table, in KILN_IR_OPS order.
inline constexpr VjpRule kVjpRules[] = {
#define KILN_VJP_ROW(name, text, kind, cost, flags) &Vjp<Op::name>::apply,
    KILN_IR_OPS(KILN_VJP_ROW)
#undef KILN_VJP_ROW
};
static_assert(sizeof(kVjpRules) / sizeof(kVjpRules[0]) == static_cast<std::size_t>(ir::kNumOps));

/// The gradients of n's inputs given g, the gradient of n.
inline Grads vjp(const NodePtr& n, const NodePtr& g) { return kVjpRules[static_cast<int>(n->op)](n, g); }

}  // namespace kiln::autodiff
