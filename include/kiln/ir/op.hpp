#pragma once
// The primitive ops of kiln's graph IR. Every composite (softmax, layer_norm, gelu, ...) is
// lowered to these by decomp/; every backend implements exactly these.
#include <cstdint>

namespace kiln::ir {

enum class Op : std::uint8_t {
  // Leaves.
  Input,     ///< a realized buffer: shape, strides and dtype are structure, the pointer is bound at run time
  Constant,  ///< a scalar (attrs.scalar / attrs.iscalar) of `dtype`, broadcast to `shape`
  Iota,      ///< value = index along axis attrs.ints[0], as `dtype`
  Random,    ///< Philox4x32-10 keyed by attrs.seed, counter = flat index; attrs.ints[0]: 0 uniform [0,1), 1 normal
  // Unary pointwise (output dtype = input dtype, except Cast and Not/IsNan/IsInf -> Bool).
  Neg, Abs, Exp, Exp2, Log, Log2, Log1p, Expm1, Sqrt, Rsqrt, Sin, Cos, Tan, Tanh, Erf,
  Floor, Ceil, Round, Not, IsNan, IsInf, Cast,
  // Binary pointwise: both inputs have the output's shape and one dtype (comparisons and
  // And/Or give Bool).
  Add, Sub, Mul, Div, Pow, Maximum, Minimum, Eq, Ne, Lt, Le, Gt, Ge, And, Or,
  // Ternary pointwise: Where(cond Bool, a, b).
  Where,
  // Reductions over attrs.ints (sorted axes), keeping reduced dims as size 1.
  ReduceSum, ReduceProd, ReduceMax, ReduceMin, ArgMax, ArgMin,
  // Index maps: the output reads its input(s) at a remapped index; no arithmetic.
  Broadcast,  ///< same rank; size-1 dims of the input repeat to the output's size
  Reshape,    ///< same element order (row-major), new shape
  Permute,    ///< output dim i = input dim attrs.ints[i]
  Slice,      ///< attrs.ints = {axis, start, step}; output size along axis is shape[axis]
  Concat,     ///< attrs.ints = {axis}; inputs joined along axis
};

enum class OpKind : std::uint8_t { Leaf, Unary, Binary, Ternary, Reduce, IndexMap };

constexpr OpKind op_kind(Op op) {
  if (op <= Op::Random) return OpKind::Leaf;
  if (op <= Op::Cast) return OpKind::Unary;
  if (op <= Op::Or) return OpKind::Binary;
  if (op == Op::Where) return OpKind::Ternary;
  if (op <= Op::ArgMin) return OpKind::Reduce;
  return OpKind::IndexMap;
}

constexpr bool is_pointwise(Op op) {
  auto k = op_kind(op);
  return k == OpKind::Unary || k == OpKind::Binary || k == OpKind::Ternary;
}
constexpr bool is_reduction(Op op) { return op_kind(op) == OpKind::Reduce; }
constexpr bool is_index_map(Op op) { return op_kind(op) == OpKind::IndexMap; }
constexpr bool is_comparison(Op op) { return op >= Op::Eq && op <= Op::Ge; }

constexpr const char* op_name(Op op) {
  switch (op) {
    case Op::Input: return "input";
    case Op::Constant: return "constant";
    case Op::Iota: return "iota";
    case Op::Random: return "random";
    case Op::Neg: return "neg";
    case Op::Abs: return "abs";
    case Op::Exp: return "exp";
    case Op::Exp2: return "exp2";
    case Op::Log: return "log";
    case Op::Log2: return "log2";
    case Op::Log1p: return "log1p";
    case Op::Expm1: return "expm1";
    case Op::Sqrt: return "sqrt";
    case Op::Rsqrt: return "rsqrt";
    case Op::Sin: return "sin";
    case Op::Cos: return "cos";
    case Op::Tan: return "tan";
    case Op::Tanh: return "tanh";
    case Op::Erf: return "erf";
    case Op::Floor: return "floor";
    case Op::Ceil: return "ceil";
    case Op::Round: return "round";
    case Op::Not: return "not";
    case Op::IsNan: return "isnan";
    case Op::IsInf: return "isinf";
    case Op::Cast: return "cast";
    case Op::Add: return "add";
    case Op::Sub: return "sub";
    case Op::Mul: return "mul";
    case Op::Div: return "div";
    case Op::Pow: return "pow";
    case Op::Maximum: return "maximum";
    case Op::Minimum: return "minimum";
    case Op::Eq: return "eq";
    case Op::Ne: return "ne";
    case Op::Lt: return "lt";
    case Op::Le: return "le";
    case Op::Gt: return "gt";
    case Op::Ge: return "ge";
    case Op::And: return "and";
    case Op::Or: return "or";
    case Op::Where: return "where";
    case Op::ReduceSum: return "sum";
    case Op::ReduceProd: return "prod";
    case Op::ReduceMax: return "max";
    case Op::ReduceMin: return "min";
    case Op::ArgMax: return "argmax";
    case Op::ArgMin: return "argmin";
    case Op::Broadcast: return "broadcast";
    case Op::Reshape: return "reshape";
    case Op::Permute: return "permute";
    case Op::Slice: return "slice";
    case Op::Concat: return "concat";
  }
  return "?";
}

}  // namespace kiln::ir
