#pragma once
// Typed expression templates. `x * 2.0f + y` is a BinaryExpr<Add, BinaryExpr<Mul, Tensor,
// ScalarExpr<float>>, Tensor>: no graph node and no heap allocation per op. Each expression
// type carries a compile-time structural key (kStructKey); shape, dtype and device are checked
// when the expression is built, so errors surface at the line that wrote the bad op. Leaves
// are held by value (Tensor is a shared handle), so keeping an expression in `auto` is safe.
#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "kiln/core/hash.hpp"
#include "kiln/decomp/decompose.hpp"
#include "kiln/decomp/elementwise.hpp"
#include "kiln/runtime/host_allocator.hpp"
#include "kiln/tensor/autocast.hpp"
#include "kiln/tensor/tensor.hpp"

namespace kiln {

/// The front end's pointwise functions, once each: X(enum name, printed name, dtype rule).
/// Rules: Same (the input's dtype), ToFloat (integers and bools compute in float32), FloatIn
/// (floating inputs only, as PyTorch), ToBool (a bool result), IntIn (integers, and bools where
/// the primitive allows them), NoBool (not defined for bools). Lowering is in lower_unary /
/// lower_binary: a primitive of the op table, or a composite of decomp/.
#define KILN_UNARY_FNS(X)                                                                                           \
  X(Neg, "neg", NoBool)                                                                                             \
  X(Abs, "abs", NoBool)                                                                                             \
  X(Exp, "exp", ToFloat)                                                                                            \
  X(Exp2, "exp2", ToFloat) X(Log, "log", ToFloat) X(Log2, "log2", ToFloat) X(Log1p, "log1p", ToFloat)               \
      X(Expm1, "expm1", ToFloat) X(Sqrt, "sqrt", ToFloat) X(Rsqrt, "rsqrt", ToFloat) X(Sin, "sin", ToFloat)         \
          X(Cos, "cos", ToFloat) X(Tan, "tan", ToFloat) X(Tanh, "tanh", ToFloat) X(Erf, "erf", ToFloat)             \
              X(Floor, "floor", NoBool) X(Ceil, "ceil", NoBool) X(Round, "round", NoBool)                           \
                  X(Not, "logical_not", ToBool) X(IsNan, "isnan", ToBool) X(IsInf, "isinf", ToBool)                 \
                      X(Sigmoid, "sigmoid", ToFloat) X(Relu, "relu", NoBool) X(Gelu, "gelu", FloatIn)               \
                          X(GeluTanh, "gelu(tanh)", FloatIn) X(Silu, "silu", FloatIn) X(Atan, "atan", ToFloat)      \
                              X(Asin, "asin", ToFloat) X(Acos, "acos", ToFloat) X(Sinh, "sinh", ToFloat)            \
                                  X(Cosh, "cosh", ToFloat) X(Asinh, "asinh", ToFloat) X(Acosh, "acosh", ToFloat)    \
                                      X(Atanh, "atanh", ToFloat) X(Reciprocal, "reciprocal", ToFloat)               \
                                          X(Sign, "sign", Same) X(Square, "square", Same) X(Trunc, "trunc", NoBool) \
                                              X(BitNot, "bitwise_not", IntIn) X(Erfc, "erfc", ToFloat)              \
                                                  X(Lgamma, "lgamma", ToFloat) X(Digamma, "digamma", ToFloat)       \
                                                      X(Erfinv, "erfinv", ToFloat)
#define KILN_BINARY_FNS(X)                                                                                        \
  X(Add, "add", Same)                                                                                             \
  X(Sub, "sub", Same)                                                                                             \
  X(Mul, "mul", Same) X(Div, "div", ToFloat) X(Pow, "pow", Same) X(Maximum, "maximum", Same)                      \
      X(Minimum, "minimum", Same) X(Eq, "eq", ToBool) X(Ne, "ne", ToBool) X(Lt, "lt", ToBool) X(Le, "le", ToBool) \
          X(Gt, "gt", ToBool) X(Ge, "ge", ToBool) X(And, "logical_and", ToBool) X(Or, "logical_or", ToBool)       \
              X(Xor, "logical_xor", ToBool) X(Atan2, "atan2", ToFloat) X(Hypot, "hypot", FloatIn)                 \
                  X(Fmod, "fmod", NoBool) X(Remainder, "remainder", NoBool) X(BitAnd, "bitwise_and", IntIn)       \
                      X(BitOr, "bitwise_or", IntIn) X(BitXor, "bitwise_xor", IntIn) X(Shl, "left_shift", IntIn)   \
                          X(Shr, "right_shift", IntIn)                                                            \
                          X(Copysign, "copysign", ToFloat)

namespace detail {

/// Front-end pointwise functions: primitives plus pointwise composites (lowered by decomp/).
/// Internal (the expression types' tag), so that a user's own `Fn` beside `using namespace
/// kiln;` is not ambiguous.
enum class Fn : std::uint8_t {
#define KILN_FN_ENUM(name, text, rule) name,
  KILN_UNARY_FNS(KILN_FN_ENUM) KILN_BINARY_FNS(KILN_FN_ENUM)
#undef KILN_FN_ENUM
};

/// Rank limit of typed expressions (their shapes live inline, without heap allocation).
inline constexpr std::size_t kMaxExprRank = 8;

struct SmallShape {
  std::array<std::int64_t, kMaxExprRank> dims{};
  std::uint8_t rank = 0;

  static SmallShape from(const Shape& s, const char* op) {
    if (s.size() > kMaxExprRank)
      throw ShapeError(std::string(op) + ": typed expressions support up to " + std::to_string(kMaxExprRank) +
                       " dimensions, got shape " + s.str());
    SmallShape r;
    r.rank = static_cast<std::uint8_t>(s.size());
    for (std::size_t i = 0; i < s.size(); ++i) r.dims[i] = s[i];
    return r;
  }
  Shape to_shape() const { return Shape(dims.begin(), dims.begin() + rank); }
};

/// PyTorch's three promotion tiers: wrapped numbers < 0-dim tensors < tensors with dimensions.
enum class Tier : std::uint8_t { Wrapped = 0, ZeroDim = 1, Dim = 2 };

struct OperandInfo {
  DType dtype;
  Tier tier;
};

/// torch.result_type over operands of different tiers (c10's combine_categories).
struct ResultType {
  bool has[3] = {false, false, false};
  DType dt[3] = {DType::Bool, DType::Bool, DType::Bool};
  void add(OperandInfo o) {
    int t = static_cast<int>(o.tier);
    dt[t] = has[t] ? promote_types(dt[t], o.dtype) : o.dtype;
    has[t] = true;
  }
  static void combine(bool& has_hi, DType& hi, bool has_lo, DType lo) {
    if (!has_lo) return;
    if (!has_hi) {
      has_hi = true;
      hi = lo;
      return;
    }
    if (is_floating(hi)) return;
    if (hi == DType::Bool || is_floating(lo)) {
      hi = promote_types(hi, lo);
      return;
    }
  }
  DType result() const {
    bool h1 = has[1];
    DType d1 = dt[1];
    combine(h1, d1, has[0], dt[0]);
    bool h2 = has[2];
    DType d2 = dt[2];
    combine(h2, d2, h1, d1);
    return d2;
  }
};

/// A pointwise function's dtype rule (see KILN_UNARY_FNS).
enum class FnRule : std::uint8_t { Same, ToFloat, FloatIn, ToBool, IntIn, NoBool };

struct FnInfo {
  const char* name;
  FnRule rule;
};
inline constexpr FnInfo kFnTable[] = {
#define KILN_FN_ROW(name, text, rule) FnInfo{text, FnRule::rule},
    KILN_UNARY_FNS(KILN_FN_ROW) KILN_BINARY_FNS(KILN_FN_ROW)
#undef KILN_FN_ROW
};

constexpr const FnInfo& fn_info(Fn f) { return kFnTable[static_cast<int>(f)]; }
inline const char* fn_name(Fn f) { return fn_info(f).name; }
constexpr bool is_float_fn(Fn f) { return fn_info(f).rule == FnRule::ToFloat; }
constexpr bool is_compare_fn(Fn f) { return f >= Fn::Eq && f <= Fn::Ge; }
constexpr bool is_logical_fn(Fn f) { return f == Fn::And || f == Fn::Or || f == Fn::Not || f == Fn::Xor; }

/// The autocast class of each pointwise function (tensor/autocast.hpp): torch's float32 list,
/// of the functions kiln has. square is torch's pow(x, 2) (a composite), so pow's entry casts
/// it. A number divided by a tensor (torch's __rtruediv__) is float32 too (BinaryExpr). atan2
/// is on torch's promote list; its ordinary promotion already gives the widest input. The
/// others run in their inputs' dtype.
constexpr AutocastClass autocast_class(Fn f) {
  switch (f) {
    case Fn::Exp:
    case Fn::Log:
    case Fn::Log2:
    case Fn::Log1p:
    case Fn::Expm1:
    case Fn::Rsqrt:
    case Fn::Reciprocal:
    case Fn::Tan:
    case Fn::Sinh:
    case Fn::Cosh:
    case Fn::Acos:
    case Fn::Asin:
    case Fn::Pow:
    case Fn::Square:
    case Fn::Erfinv:
      return AutocastClass::Fp32;
    case Fn::Atan2:
      return AutocastClass::Promote;
    default:
      return AutocastClass::None;
  }
}

/// Output dtype of unary `f` on `in` (of `shape`, for the message); throws DTypeError for
/// unsupported combinations.
inline DType unary_result(Fn f, DType in, const SmallShape& shape) {
  auto refuse = [&](const char* what) {
    throw DTypeError(std::string(fn_name(f)) + ": " + what + ", got " + dtype_name(in) + shape.to_shape().str());
  };
  switch (fn_info(f).rule) {
    case FnRule::ToBool:
      return DType::Bool;
    case FnRule::FloatIn:  // as PyTorch
      if (!is_floating(in)) refuse("expected a floating point tensor");
      return in;
    case FnRule::ToFloat:
      return is_floating(in) ? in : kDefaultFloat;
    case FnRule::IntIn:
      if (is_floating(in)) refuse("expected an integer or bool tensor");
      return in;
    case FnRule::NoBool:
      if (in == DType::Bool) refuse("not supported for bool tensors");
      return in;
    case FnRule::Same:
      if (f == Fn::Square && in == DType::Bool) return DType::Int64;  // torch.square: pow(x, 2)
      return in;
  }
  return in;
}

/// Dtype the operands of binary `f` are computed in, and the output dtype.
struct BinaryTypes {
  DType operand;
  DType out;
};
inline BinaryTypes binary_result(Fn f, DType common, DType a, DType b, const SmallShape& shape) {
  auto refuse = [&](const char* what) {
    throw DTypeError(std::string(fn_name(f)) + ": " + what + " (" + dtype_name(a) + ", " + dtype_name(b) + "; shape " +
                     shape.to_shape().str() + ")");
  };
  if (f == Fn::And || f == Fn::Or || f == Fn::Xor) return {DType::Bool, DType::Bool};
  if (is_compare_fn(f)) return {common, DType::Bool};
  switch (fn_info(f).rule) {
    case FnRule::ToFloat: {
      DType t = is_floating(common) ? common : kDefaultFloat;
      return {t, t};
    }
    case FnRule::FloatIn:
      if (!is_floating(common)) refuse("expected floating point tensors");
      break;
    case FnRule::IntIn:
      if (is_floating(common)) refuse("expected integer or bool tensors");
      if (common == DType::Bool && (f == Fn::Shl || f == Fn::Shr)) refuse("not supported for bool tensors");
      break;
    case FnRule::NoBool:
      if (common == DType::Bool) refuse("not supported for bool tensors");
      break;
    default:
      break;
  }
  // PyTorch refuses a subtraction with any bool operand (use logical_not / xor for masks).
  if (f == Fn::Sub && (a == DType::Bool || b == DType::Bool)) refuse("subtraction with a bool tensor is not supported");
  if (common == DType::Bool && f == Fn::Pow) refuse("not supported for bool tensors");
  return {common, common};
}

inline ir::NodePtr lower_unary(Fn f, const ir::NodePtr& x) {
  using ir::Op;
  switch (f) {
    case Fn::Neg:
      return ir::unary(Op::Neg, x);
    case Fn::Abs:
      return x->dtype == DType::Bool ? x : ir::unary(Op::Abs, x);
    case Fn::Exp:
      return ir::unary(Op::Exp, x);
    case Fn::Exp2:
      return ir::unary(Op::Exp2, x);
    case Fn::Log:
      return ir::unary(Op::Log, x);
    case Fn::Log2:
      return ir::unary(Op::Log2, x);
    case Fn::Log1p:
      return ir::unary(Op::Log1p, x);
    case Fn::Expm1:
      return ir::unary(Op::Expm1, x);
    case Fn::Sqrt:
      return ir::unary(Op::Sqrt, x);
    case Fn::Rsqrt:
      return ir::unary(Op::Rsqrt, x);
    case Fn::Sin:
      return ir::unary(Op::Sin, x);
    case Fn::Cos:
      return ir::unary(Op::Cos, x);
    case Fn::Tan:
      return ir::unary(Op::Tan, x);
    case Fn::Tanh:
      return ir::unary(Op::Tanh, x);
    case Fn::Erf:
      return ir::unary(Op::Erf, x);
    case Fn::Erfc:
      return ir::unary(Op::Erfc, x);
    case Fn::Lgamma:
      return ir::unary(Op::Lgamma, x);
    case Fn::Digamma:
      return decomp::digamma(x);
    case Fn::Erfinv:
      return decomp::erfinv(x);
    case Fn::Floor:
      return is_floating(x->dtype) ? ir::unary(Op::Floor, x) : x;
    case Fn::Ceil:
      return is_floating(x->dtype) ? ir::unary(Op::Ceil, x) : x;
    case Fn::Round:
      return is_floating(x->dtype) ? ir::unary(Op::Round, x) : x;
    case Fn::Not:
      return ir::unary(Op::Not, x);
    case Fn::IsNan:
      return ir::unary(Op::IsNan, x);
    case Fn::IsInf:
      return ir::unary(Op::IsInf, x);
    case Fn::Sigmoid:
      return decomp::sigmoid(x);
    case Fn::Relu:
      return decomp::relu(x);
    case Fn::Gelu:
      return decomp::gelu(x, false);
    case Fn::GeluTanh:
      return decomp::gelu(x, true);
    case Fn::Silu:
      return decomp::silu(x);
    case Fn::Atan:
      return ir::unary(Op::Atan, x);
    case Fn::Asin:
      return ir::unary(Op::Asin, x);
    case Fn::Acos:
      return ir::unary(Op::Acos, x);
    case Fn::Sinh:
      return decomp::sinh(x);
    case Fn::Cosh:
      return decomp::cosh(x);
    case Fn::Asinh:
      return decomp::asinh(x);
    case Fn::Acosh:
      return decomp::acosh(x);
    case Fn::Atanh:
      return decomp::atanh(x);
    case Fn::Reciprocal:
      return ir::binary(Op::Div, decomp::scalar_like(1.0, x), x);
    case Fn::Sign:
      return decomp::sign(x);
    case Fn::Square:
      return x->dtype == DType::Bool ? x : ir::binary(Op::Mul, x, x);  // bool: cast to int64 first
    case Fn::Trunc:
      return decomp::trunc(x);
    case Fn::BitNot:
      return ir::unary(Op::BitNot, x);
    default:
      break;
  }
  throw InternalError("lower_unary: not a unary function");
}

inline ir::NodePtr lower_binary(Fn f, const ir::NodePtr& a, const ir::NodePtr& b) {
  using ir::Op;
  bool boolean = a->dtype == DType::Bool;
  switch (f) {
    case Fn::Add:
      return ir::binary(boolean ? Op::Or : Op::Add, a, b);
    case Fn::Sub:
      return ir::binary(Op::Sub, a, b);
    case Fn::Mul:
      return ir::binary(boolean ? Op::And : Op::Mul, a, b);
    case Fn::Div:
      return ir::binary(Op::Div, a, b);
    case Fn::Pow:
      // A number exponent of a floating base: torch.pow's specialisations (its CPU and CUDA
      // kernels for a scalar exponent), so results match PyTorch's bit for bit where libm's pow
      // and its vector variants disagree on special values (pow(-inf, 0.5) is NaN, as sqrt;
      // pow(-0, 0.5) is -0).
      if (b->op == Op::Constant && is_floating(a->dtype)) {
        const double e = b->attrs.scalar;
        auto one = [&] { return ir::constant(1.0, a->dtype, a->shape, a->device); };
        if (e == 0.5) return ir::unary(Op::Sqrt, a);
        if (e == -0.5) return ir::unary(Op::Rsqrt, a);
        if (e == 2) return ir::binary(Op::Mul, a, a);
        if (e == 3) return ir::binary(Op::Mul, ir::binary(Op::Mul, a, a), a);
        if (e == -1) return ir::binary(Op::Div, one(), a);
        if (e == -2) return ir::binary(Op::Div, one(), ir::binary(Op::Mul, a, a));
      }
      return ir::binary(Op::Pow, a, b);
    case Fn::Maximum:
      return ir::binary(boolean ? Op::Or : Op::Maximum, a, b);
    case Fn::Minimum:
      return ir::binary(boolean ? Op::And : Op::Minimum, a, b);
    case Fn::Eq:
      return ir::binary(Op::Eq, a, b);
    case Fn::Ne:
      return ir::binary(Op::Ne, a, b);
    case Fn::Lt:
      return ir::binary(Op::Lt, a, b);
    case Fn::Le:
      return ir::binary(Op::Le, a, b);
    case Fn::Gt:
      return ir::binary(Op::Gt, a, b);
    case Fn::Ge:
      return ir::binary(Op::Ge, a, b);
    case Fn::And:
      return ir::binary(Op::And, a, b);
    case Fn::Or:
      return ir::binary(Op::Or, a, b);
    case Fn::Xor:
      return decomp::logical_xor(a, b);
    case Fn::Atan2:
      return ir::binary(Op::Atan2, a, b);
    case Fn::Hypot:
      return ir::binary(Op::Hypot, a, b);
    case Fn::Copysign:
      return ir::binary(Op::Copysign, a, b);
    case Fn::Fmod:
      return ir::binary(Op::Fmod, a, b);
    case Fn::Remainder:
      return decomp::remainder(a, b);
    case Fn::BitAnd:
      return ir::binary(Op::BitAnd, a, b);
    case Fn::BitOr:
      return ir::binary(Op::BitOr, a, b);
    case Fn::BitXor:
      return ir::binary(Op::BitXor, a, b);
    case Fn::Shl:
      return ir::binary(Op::Shl, a, b);
    case Fn::Shr:
      return ir::binary(Op::Shr, a, b);
    default:
      break;
  }
  throw InternalError("lower_binary: not a binary function");
}

}  // namespace detail

/// A C++ number inside an expression (PyTorch's "wrapped number": it never widens a tensor's dtype).
/// Most numbers are kernel arguments, read at launch, so that `w - lr * g` compiles once for
/// every `lr` (see number_is_argument); `literal` keeps one in the code (pow's exponent).
template <class T>
struct ScalarExpr : Expr<ScalarExpr<T>> {
  T value;
  bool literal = false;  ///< always a literal in the generated code (it changes the code)
  explicit ScalarExpr(T v) : value(v) {}
  static constexpr std::uint64_t kStructKey = detail::hash_combine(0x5ca1a7, std::is_floating_point_v<T> ? 1
                                                                             : std::is_same_v<T, bool>   ? 2
                                                                                                         : 3);
  static constexpr DType wrapped_dtype = std::is_floating_point_v<T> ? kDefaultFloat
                                         : std::is_same_v<T, bool>   ? DType::Bool
                                                                     : DType::Int64;
  detail::OperandInfo info() const { return {wrapped_dtype, detail::Tier::Wrapped}; }
};

namespace detail {

/// Whether the number `s` on `device` is a kernel argument (a 0-dim host leaf read at launch)
/// instead of a literal. Values that change the code stay literals: 0, 1 and -1 (x * 1, x + 0,
/// where(c, x, 0) simplify), bools, numbers marked literal (pow's exponent: x^2 is x * x), and
/// every number of a CUDA graph (whose leaves live on the device).
template <class T>
bool number_is_argument(const ScalarExpr<T>& s, Device device) {
  if constexpr (std::is_same_v<T, bool>) {
    return false;
  } else {
    const double v = static_cast<double>(s.value);
    // While kiln::compile traces, numbers stay literals: the trace bakes them (its guards check
    // number arguments), and a leaf made by the trace would be tied to none of its arguments,
    // which stops its dynamic-shape inference.
    return !s.literal && device.is_cpu() && !deferring_eval() && v != 0 && v != 1 && v != -1;
  }
}

/// While the typed-assign path records a new guard, the storages of the number leaves made by
/// number_leaf, in build order (= the order collect_leaves meets the numbers).
inline thread_local std::vector<const Storage*>* number_leaf_recorder = nullptr;

/// Writes number `v` as `dtype` stores it to `out` (8 bytes at most), as a cast would.
template <class T>
void store_number(T v, DType dtype, void* out) {
  visit_dtype(dtype, [&](auto tag) {
    using D = decltype(tag);
    D x;
    if constexpr (std::is_same_v<D, bool>)
      x = v != 0;
    else if constexpr (std::is_integral_v<D> && std::is_floating_point_v<T>)
      x = kiln::detail::float_to_int<D>(static_cast<double>(v));
    else if constexpr (std::is_integral_v<D>)
      x = static_cast<D>(static_cast<std::int64_t>(v));  // wraps as int_literal
    else if constexpr (std::is_same_v<D, double>)
      x = static_cast<double>(v);
    else if constexpr (std::is_same_v<D, float>)
      x = static_cast<float>(static_cast<double>(v));
    else
      x = D(static_cast<float>(static_cast<double>(v)));  // f16/bf16: through float, as constants
    std::memcpy(out, &x, sizeof(D));
  });
}

/// A realized 0-dim host leaf holding `v` as `dtype`, broadcast to `shape`.
template <class T>
ir::NodePtr number_leaf(T v, DType dtype, const Shape& shape, Device device) {
  StoragePtr st = runtime::allocate_host(8);
  store_number(v, dtype, st->data);
  if (number_leaf_recorder) number_leaf_recorder->push_back(st.get());
  return decomp::expand(ir::input(ir::BufferView{st, 0, {}}, Shape{}, dtype, device), shape);
}

template <class T>
struct is_scalar_expr : std::false_type {};
template <class T>
struct is_scalar_expr<ScalarExpr<T>> : std::true_type {};

// Uniform access to any operand: Tensor, typed expression or wrapped scalar.
inline OperandInfo info_of(const Tensor& t) { return {t.dtype(), t.dim() == 0 ? Tier::ZeroDim : Tier::Dim}; }
template <class E>
OperandInfo info_of(const E& e) {
  return e.info();
}
inline SmallShape shape_of(const Tensor& t, const char* op) { return SmallShape::from(t.shape(), op); }
template <class E>
SmallShape shape_of(const E& e, const char*) {
  return e.out_shape;
}
inline Device device_of(const Tensor& t) { return t.device(); }
template <class E>
Device device_of(const E& e) {
  return e.out_device;
}

template <class E>
constexpr std::uint64_t struct_key() {
  if constexpr (std::is_same_v<E, Tensor>)
    return 0x7e50a;
  else
    return E::kStructKey;
}

[[noreturn]] inline void broadcast_failed(const SmallShape& a, const SmallShape& b, const char* op, DType ta, DType tb,
                                          std::size_t dim, std::int64_t da, std::int64_t db) {
  throw ShapeError(std::string(op) + ": shapes " + dtype_name(ta) + a.to_shape().str() + " and " + dtype_name(tb) +
                   b.to_shape().str() + " cannot be broadcast (dimension " + std::to_string(dim) + ": " +
                   std::to_string(da) + " vs " + std::to_string(db) + ")");
}

/// NumPy broadcast of two operand shapes (dtypes `ta`, `tb` only name them in the error).
inline SmallShape broadcast_small(const SmallShape& a, const SmallShape& b, const char* op, DType ta, DType tb) {
  std::size_t n = std::max(a.rank, b.rank);
  SmallShape out;
  out.rank = static_cast<std::uint8_t>(n);
  std::int64_t numel = 1;
  bool overflow = false;
  for (std::size_t i = 0; i < n; ++i) {
    std::int64_t da = i < n - a.rank ? 1 : a.dims[i - (n - a.rank)];
    std::int64_t db = i < n - b.rank ? 1 : b.dims[i - (n - b.rank)];
    if (da != db && da != 1 && db != 1) broadcast_failed(a, b, op, ta, tb, i, da, db);
    out.dims[i] = da == 1 ? db : da;
    overflow |= __builtin_mul_overflow(numel, out.dims[i], &numel);
  }
  // [2^40, 1] with [1, 2^40] is a valid pair of tensors whose broadcast has 2^80 elements
  // (checked_numel says so, or accepts it when some size is 0).
  if (overflow) checked_numel(out.to_shape(), op);
  return out;
}

inline void check_same_device(Device a, Device b, const char* op) {
  if (a != b)
    throw DeviceError(std::string(op) + ": expected all tensors on one device, got " + a.str() + " and " + b.str());
}

/// The graph node of operand `e`, cast to `dtype` and broadcast to `shape`.
template <class E>
ir::NodePtr operand_node(const E& e, DType dtype, const SmallShape& shape, Device device) {
  if constexpr (is_scalar_expr<E>::value) {
    using T = decltype(e.value);
    if (number_is_argument(e, device)) return number_leaf(e.value, dtype, shape.to_shape(), device);
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
      return ir::constant_int(static_cast<std::int64_t>(e.value), dtype, shape.to_shape(), device);
    else
      return ir::constant(static_cast<double>(e.value), dtype, shape.to_shape(), device);
  } else {
    return decomp::expand(ir::cast(e.build(), dtype), shape.to_shape());
  }
}

}  // namespace detail

/// f(a), elementwise.
template <detail::Fn F, class A>
struct UnaryExpr : Expr<UnaryExpr<F, A>> {
  A a;
  DType out_dtype;
  detail::SmallShape out_shape;
  Device out_device;
  bool autocast = false;  ///< autocast made out_dtype float32 (the typed-assign guard tells them apart)
  static constexpr std::uint64_t kStructKey =
      detail::hash_combine(detail::hash_combine(0x0a1, static_cast<std::uint64_t>(F)), detail::struct_key<A>());

  explicit UnaryExpr(const A& x) : a(x) {
    const char* name = "unary";
    out_shape = detail::shape_of(a, name);
    out_device = detail::device_of(a);
    out_dtype = detail::unary_result(F, detail::info_of(a).dtype, out_shape);
    if constexpr (detail::autocast_class(F) == detail::AutocastClass::Fp32)
      if (is_reduced_float(out_dtype) && detail::autocast_on(out_device)) {
        out_dtype = DType::Float32;  // build() casts the input to it
        autocast = true;
      }
  }
  detail::OperandInfo info() const {
    return {out_dtype, out_shape.rank == 0 ? detail::Tier::ZeroDim : detail::Tier::Dim};
  }
  template <class V>
  void for_each_child(V&& v) const {
    v(a);
  }
  ir::NodePtr build() const {
    DType in = detail::info_of(a).dtype;
    DType operand = (F == detail::Fn::Not || F == detail::Fn::IsNan || F == detail::Fn::IsInf) ? in : out_dtype;
    return detail::lower_unary(F, ir::cast(a.build(), operand));
  }
  Shape shape_() const { return out_shape.to_shape(); }
};

/// f(a, b), elementwise with broadcasting and type promotion.
template <detail::Fn F, class A, class B>
struct BinaryExpr : Expr<BinaryExpr<F, A, B>> {
  A a;
  B b;
  DType operand_dtype;
  DType out_dtype;
  detail::SmallShape out_shape;
  Device out_device;
  bool autocast = false;  ///< autocast made the operands float32 (the typed-assign guard tells them apart)
  static constexpr std::uint64_t kStructKey = detail::hash_combine(
      detail::hash_combine(detail::hash_combine(0x0b2, static_cast<std::uint64_t>(F)), detail::struct_key<A>()),
      detail::struct_key<B>());

  BinaryExpr(const A& x, const B& y) : a(x), b(y) {
    static_assert(!(detail::is_scalar_expr<A>::value && detail::is_scalar_expr<B>::value));
    if constexpr (F == detail::Fn::Pow && detail::is_scalar_expr<B>::value) b.literal = true;  // x^2 compiles to x * x
    const char* name = detail::fn_name(F);
    if constexpr (detail::is_scalar_expr<A>::value) {
      out_shape = detail::shape_of(b, name);
      out_device = detail::device_of(b);
    } else if constexpr (detail::is_scalar_expr<B>::value) {
      out_shape = detail::shape_of(a, name);
      out_device = detail::device_of(a);
    } else {
      out_shape = detail::broadcast_small(detail::shape_of(a, name), detail::shape_of(b, name), name,
                                          detail::info_of(a).dtype, detail::info_of(b).dtype);
      out_device = detail::device_of(a);
      detail::check_same_device(out_device, detail::device_of(b), name);
    }
    detail::ResultType rt;
    auto ia = detail::info_of(a), ib = detail::info_of(b);
    rt.add(ia);
    rt.add(ib);
    // torch.pow(bool_tensor, True / False) is the tensor itself / ones (its scalar-exponent
    // shortcuts), while any other pow of bools is refused.
    auto types = bool_pow_by_number() ? detail::BinaryTypes{DType::Bool, DType::Bool}
                                      : detail::binary_result(F, rt.result(), ia.dtype, ib.dtype, out_shape);
    operand_dtype = types.operand;
    out_dtype = types.out;
    // Autocast's float32 ops: pow, and a number divided by a tensor (torch's __rtruediv__).
    if constexpr (detail::autocast_class(F) == detail::AutocastClass::Fp32 ||
                  (F == detail::Fn::Div && detail::is_scalar_expr<A>::value))
      if (is_reduced_float(out_dtype) && detail::autocast_on(out_device)) {
        operand_dtype = out_dtype = DType::Float32;
        autocast = true;
      }
    if constexpr (F == detail::Fn::Pow && detail::is_scalar_expr<B>::value) {
      // As torch.pow: an integer exponent given as a number may not be negative for an
      // integer (or bool) base; a tensor exponent follows integer pow's rules instead.
      using T = decltype(b.value);
      if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
        if (b.value < 0 && !is_floating(out_dtype))
          throw DTypeError("pow: integers to negative integer powers are not allowed (base " +
                           std::string(dtype_name(ia.dtype)) + out_shape.to_shape().str() + ", exponent " +
                           std::to_string(b.value) + ")");
    }
  }
  detail::OperandInfo info() const {
    return {out_dtype, out_shape.rank == 0 ? detail::Tier::ZeroDim : detail::Tier::Dim};
  }
  template <class V>
  void for_each_child(V&& v) const {
    v(a);
    v(b);
  }
  ir::NodePtr build() const {
    ir::NodePtr x = detail::operand_node(a, operand_dtype, out_shape, out_device);
    if constexpr (F == detail::Fn::Pow && std::is_same_v<B, ScalarExpr<bool>>)
      if (bool_pow_by_number()) return b.value ? x : ir::constant(1.0, DType::Bool, out_shape.to_shape(), out_device);
    ir::NodePtr y = detail::operand_node(b, operand_dtype, out_shape, out_device);
    return detail::lower_binary(F, x, y);
  }

 private:
  /// pow of a bool tensor by a bool number (see the constructor).
  bool bool_pow_by_number() const {
    if constexpr (F == detail::Fn::Pow && std::is_same_v<B, ScalarExpr<bool>>)
      return detail::info_of(a).dtype == DType::Bool;
    else
      return false;
  }
};

/// where(cond, a, b): a where cond is true, else b.
template <class C, class A, class B>
struct WhereExpr : Expr<WhereExpr<C, A, B>> {
  C c;
  A a;
  B b;
  DType out_dtype;
  detail::SmallShape out_shape;
  Device out_device;
  static constexpr std::uint64_t kStructKey = detail::hash_combine(
      detail::hash_combine(detail::hash_combine(0x3c3, detail::struct_key<C>()), detail::struct_key<A>()),
      detail::struct_key<B>());

  WhereExpr(const C& cond, const A& x, const B& y) : c(cond), a(x), b(y) {
    if (detail::info_of(c).dtype != DType::Bool)
      throw DTypeError(std::string("where: condition must be bool, got ") + dtype_name(detail::info_of(c).dtype) +
                       detail::shape_of(c, "where").to_shape().str());
    out_shape = detail::shape_of(c, "where");
    out_device = detail::device_of(c);
    if constexpr (!detail::is_scalar_expr<A>::value) {
      out_shape = detail::broadcast_small(out_shape, detail::shape_of(a, "where"), "where", DType::Bool,
                                          detail::info_of(a).dtype);
      detail::check_same_device(out_device, detail::device_of(a), "where");
    }
    if constexpr (!detail::is_scalar_expr<B>::value) {
      out_shape = detail::broadcast_small(out_shape, detail::shape_of(b, "where"), "where", detail::info_of(a).dtype,
                                          detail::info_of(b).dtype);
      detail::check_same_device(out_device, detail::device_of(b), "where");
    }
    detail::ResultType rt;
    rt.add(detail::info_of(a));
    rt.add(detail::info_of(b));
    out_dtype = rt.result();
  }
  detail::OperandInfo info() const {
    return {out_dtype, out_shape.rank == 0 ? detail::Tier::ZeroDim : detail::Tier::Dim};
  }
  template <class V>
  void for_each_child(V&& v) const {
    v(c);
    v(a);
    v(b);
  }
  ir::NodePtr build() const {
    ir::NodePtr cn = detail::operand_node(c, DType::Bool, out_shape, out_device);
    return ir::where(cn, detail::operand_node(a, out_dtype, out_shape, out_device),
                     detail::operand_node(b, out_dtype, out_shape, out_device));
  }
};

}  // namespace kiln
