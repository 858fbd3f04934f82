#pragma once
// The primitive ops of kiln's graph IR. Every composite (softmax, layer_norm, gelu, ...) is
// lowered to these by decomp/; every backend implements exactly these.
#include <cstdint>

namespace kiln::ir {

/// How the scheduler and the code generators weigh recomputing an op inline.
enum class CostClass : std::uint8_t {
  Free,            ///< leaves and index maps: an address, no arithmetic
  Cheap,           ///< one or a few instructions
  Divide,          ///< a division or square root: several cycles, not pipelined fully
  Transcendental,  ///< a polynomial or a library call (exp, sin, pow, ...)
};

enum class OpKind : std::uint8_t {
  Leaf, Unary, Binary, Ternary, Reduce, IndexMap, Gather, Scatter, Scan, Sort, Contract, Attention
};

/// Properties of a primitive that stages read instead of listing ops themselves.
enum OpFlag : std::uint32_t {
  kNoFlags = 0,
  kBoolResult = 1u << 0,   ///< the result is Bool whatever the input dtype (comparisons, tests)
  kFloatOnly = 1u << 1,    ///< defined on floating dtypes only (the front end promotes integers)
  kIntOnly = 1u << 2,      ///< defined on integer (and, where kBoolToo, bool) dtypes only
  kBoolToo = 1u << 3,      ///< with kIntOnly: bool inputs too (bitwise and/or/xor/not)
  kMathCall = 1u << 4,     ///< computed by a math function, not an operator (CUDA counts these)
  kComparison = 1u << 5,   ///< eq, ne, lt, le, gt, ge
  kCommutative = 1u << 6,  ///< f(a, b) == f(b, a)
  /// Floating math computed by the C library function of the op's printed name (expf / exp,
  /// atan2f / atan2): every C-family writer emits it by that name, each in its dialect.
  kLibmName = 1u << 7,
  /// Computed by a library call (a BLAS product), a step of its own between generated kernels:
  /// its operands are read from memory through their strides and its result is written to memory.
  kLibraryCall = 1u << 8,
};

/// The op table: every primitive once, as X(enum name, printed name, kind, cost class, flags).
/// Kinds are contiguous in the list (leaves, unary, binary, ternary, reductions, index maps);
/// op_info() and everything derived from it read this list and nothing else. Each primitive's
/// vector-Jacobian rule will be a column of this table (see OpInfo::vjp).
#define KILN_IR_OPS(X)                                                                         \
  /* Leaves. */                                                                                \
  X(Input, "input", Leaf, Free, kNoFlags)                                                      \
  X(Constant, "constant", Leaf, Free, kNoFlags)                                                \
  X(Iota, "iota", Leaf, Free, kNoFlags)                                                        \
  X(Random, "random", Leaf, Cheap, kNoFlags)                                                   \
  /* Unary pointwise: output dtype = input dtype unless kBoolResult; Cast converts. */         \
  X(Neg, "neg", Unary, Cheap, kNoFlags)                                                        \
  X(Abs, "abs", Unary, Cheap, kNoFlags)                                                        \
  X(Exp, "exp", Unary, Transcendental, kFloatOnly | kMathCall | kLibmName)                     \
  X(Exp2, "exp2", Unary, Transcendental, kFloatOnly | kMathCall | kLibmName)                   \
  X(Log, "log", Unary, Transcendental, kFloatOnly | kMathCall | kLibmName)                     \
  X(Log2, "log2", Unary, Transcendental, kFloatOnly | kMathCall | kLibmName)                   \
  X(Log1p, "log1p", Unary, Transcendental, kFloatOnly | kMathCall | kLibmName)                 \
  X(Expm1, "expm1", Unary, Transcendental, kFloatOnly | kMathCall | kLibmName)                 \
  X(Sqrt, "sqrt", Unary, Divide, kFloatOnly | kMathCall | kLibmName)                           \
  X(Rsqrt, "rsqrt", Unary, Divide, kFloatOnly | kMathCall)                                     \
  X(Sin, "sin", Unary, Transcendental, kFloatOnly | kMathCall | kLibmName)                     \
  X(Cos, "cos", Unary, Transcendental, kFloatOnly | kMathCall | kLibmName)                     \
  X(Tan, "tan", Unary, Transcendental, kFloatOnly | kMathCall | kLibmName)                     \
  X(Tanh, "tanh", Unary, Transcendental, kFloatOnly | kMathCall | kLibmName)                   \
  X(Erf, "erf", Unary, Transcendental, kFloatOnly | kMathCall | kLibmName)                     \
  X(Erfc, "erfc", Unary, Transcendental, kFloatOnly | kMathCall | kLibmName)                   \
  X(Lgamma, "lgamma", Unary, Transcendental, kFloatOnly | kMathCall | kLibmName)               \
  X(Atan, "atan", Unary, Transcendental, kFloatOnly | kMathCall | kLibmName)                   \
  X(Asin, "asin", Unary, Transcendental, kFloatOnly | kMathCall | kLibmName)                   \
  X(Acos, "acos", Unary, Transcendental, kFloatOnly | kMathCall | kLibmName)                   \
  X(Floor, "floor", Unary, Cheap, kNoFlags)                                                    \
  X(Ceil, "ceil", Unary, Cheap, kNoFlags)                                                      \
  X(Round, "round", Unary, Cheap, kNoFlags)                                                    \
  X(Not, "not", Unary, Cheap, kBoolResult)                                                     \
  X(IsNan, "isnan", Unary, Cheap, kBoolResult)                                                 \
  X(IsInf, "isinf", Unary, Cheap, kBoolResult)                                                 \
  X(BitNot, "bitwise_not", Unary, Cheap, kIntOnly | kBoolToo)                                  \
  X(Cast, "cast", Unary, Cheap, kNoFlags)                                                      \
  /* Binary pointwise: both inputs have the output's shape and one dtype. */                   \
  X(Add, "add", Binary, Cheap, kCommutative)                                                   \
  X(Sub, "sub", Binary, Cheap, kNoFlags)                                                       \
  X(Mul, "mul", Binary, Cheap, kCommutative)                                                   \
  X(Div, "div", Binary, Divide, kNoFlags)                                                      \
  X(Pow, "pow", Binary, Transcendental, kMathCall)                                             \
  X(Maximum, "maximum", Binary, Cheap, kCommutative)                                           \
  X(Minimum, "minimum", Binary, Cheap, kCommutative)                                           \
  X(Eq, "eq", Binary, Cheap, kBoolResult | kComparison | kCommutative)                         \
  X(Ne, "ne", Binary, Cheap, kBoolResult | kComparison | kCommutative)                         \
  X(Lt, "lt", Binary, Cheap, kBoolResult | kComparison)                                        \
  X(Le, "le", Binary, Cheap, kBoolResult | kComparison)                                        \
  X(Gt, "gt", Binary, Cheap, kBoolResult | kComparison)                                        \
  X(Ge, "ge", Binary, Cheap, kBoolResult | kComparison)                                        \
  X(And, "and", Binary, Cheap, kBoolResult | kCommutative)                                     \
  X(Or, "or", Binary, Cheap, kBoolResult | kCommutative)                                       \
  X(Atan2, "atan2", Binary, Transcendental, kFloatOnly | kMathCall | kLibmName)                \
  X(Hypot, "hypot", Binary, Transcendental, kFloatOnly | kMathCall | kCommutative | kLibmName) \
  X(Copysign, "copysign", Binary, Cheap, kFloatOnly | kMathCall | kLibmName)                   \
  X(Fmod, "fmod", Binary, Divide, kNoFlags)                                                    \
  X(BitAnd, "bitwise_and", Binary, Cheap, kIntOnly | kBoolToo | kCommutative)                  \
  X(BitOr, "bitwise_or", Binary, Cheap, kIntOnly | kBoolToo | kCommutative)                    \
  X(BitXor, "bitwise_xor", Binary, Cheap, kIntOnly | kBoolToo | kCommutative)                  \
  X(Shl, "left_shift", Binary, Cheap, kIntOnly)                                                \
  X(Shr, "right_shift", Binary, Cheap, kIntOnly)                                               \
  /* Ternary pointwise: Where(cond Bool, a, b). */                                             \
  X(Where, "where", Ternary, Cheap, kNoFlags)                                                  \
  /* Reductions over attrs.ints (sorted axes), keeping reduced dims as size 1. */              \
  X(ReduceSum, "sum", Reduce, Free, kNoFlags)                                                  \
  X(ReduceProd, "prod", Reduce, Free, kNoFlags)                                                \
  X(ReduceMax, "max", Reduce, Free, kNoFlags)                                                  \
  X(ReduceMin, "min", Reduce, Free, kNoFlags)                                                  \
  X(ArgMax, "argmax", Reduce, Free, kNoFlags)                                                  \
  X(ArgMin, "argmin", Reduce, Free, kNoFlags)                                                  \
  /* Index maps: the output reads its input(s) at a remapped index; no arithmetic. */          \
  X(Broadcast, "broadcast", IndexMap, Free, kNoFlags)                                          \
  X(Reshape, "reshape", IndexMap, Free, kNoFlags)                                              \
  X(Permute, "permute", IndexMap, Free, kNoFlags)                                              \
  X(Slice, "slice", IndexMap, Free, kNoFlags)                                                  \
  X(Concat, "concat", IndexMap, Free, kNoFlags)                                                \
  /* Data-dependent reads: the output reads input 0 where input 1's values say. */             \
  X(Gather, "gather", Gather, Free, kNoFlags)                                                  \
  /* Accumulating writes, a step of their own (the runtime's scatter kernels). */              \
  X(Scatter, "scatter", Scatter, Free, kLibraryCall)                                           \
  /* Scans along one axis, a step of their own (the runtime's scan kernels). */                 \
  X(Scan, "scan", Scan, Free, kLibraryCall)                                                    \
  /* Sorting and selection along one axis, a step of its own (the runtime's sort kernels). */   \
  X(Sort, "sort", Sort, Free, kLibraryCall)                                                    \
  /* Contractions, computed by a library call (CBLAS, cuBLASLt). */                            \
  X(MatMul, "matmul", Contract, Free, kLibraryCall)                                            \
  /* Fused attention and its gradients, a step of their own (the runtime's attention kernels). */ \
  X(Attention, "attention", Attention, Free, kLibraryCall)

// Attributes and leaves, op by op:
//   Input      a realized buffer: shape, strides and dtype are structure, the pointer is bound at run time
//   Constant   a scalar (attrs.scalar / attrs.iscalar) of `dtype`, broadcast to `shape`
//   Iota       value = index along axis attrs.ints[0], as `dtype`
//   Random     Philox4x32-10 keyed by attrs.seed, counter = flat index (float32 uniform: word
//              index % 4 of the block at index / 4, kiln::philox::uniform_f32); attrs.ints[0]:
//              0 uniform [0,1), 1 normal
//   Shl/Shr    shifts by a count outside [0, bits) give 0 (Shr of a negative value: -1), as PyTorch
//   Broadcast  same rank; size-1 dims of the input repeat to the output's size
//   Reshape    same element order (row-major), new shape
//   Permute    output dim i = input dim attrs.ints[i]
//   Slice      attrs.ints = {axis, start, step}; output size along axis is shape[axis]
//   Concat     attrs.ints = {axis}; inputs joined along axis
//   Gather     gather(x, index) along axis attrs.ints[0]: out[p] = x[p with p[axis] = index[p]];
//              index is Int64 of the output's shape and x's rank, x's other dims at least the
//              index's; attrs.ints[1] is the user-facing op (GatherSite) its range errors name.
//              An index outside [0, x.shape[axis]) is reported (IndexError) and reads a clamped element
//   Scatter    scatter(base, index, src) along axis attrs.ints[0]: out = base, then for each p of
//              index's shape in row-major order out[p with p[axis] = index[p]] = src[p]
//              (attrs.ints[1] == 0) or += src[p] (1); index Int64 and src of index's shape, both
//              at most base's off the axis; attrs.ints[2] == 1: atomic accumulation (any order,
//              GPU); attrs.ints[3] the GatherSite its range errors name. Any index outside
//              [0, base.shape[axis]) is an IndexError and nothing is written
//   Scan       the running sum, product, max, min, index of the max / min, or log-sum-exp of the
//              input along axis attrs.ints[0] (attrs.ints[1]: ScanKind), same shape; sums and
//              products of integers and bool are int64, accumulated exactly (wrapping); floats
//              accumulate in double and each prefix is rounded once; max/min propagate the first
//              NaN and take the latest index among equal values (torch.cummax)
//   Sort       the int64 positions along axis attrs.ints[0] of the attrs.ints[1] (k) first elements of
//              x in the order (largest first when attrs.ints[2] == 1, else smallest first); the
//              output is x's shape with k along the axis. The order is total: NaN counts as larger
//              than every number, -0 equals +0, and equal values keep their order (the lower
//              position first), so a full sort is stable and a top-k is the stable sort's prefix
//   MatMul     a [..., M, K] x b [..., K, N] -> [..., M, N]: equal rank >= 2, equal batch dims,
//              one dtype (floating); half types accumulate in float32, the result keeps the dtype
//   Attention  one value of softmax(q kᵀ · attrs.scalar + mask) v, computed without the scores
//              in memory (sched::AttentionCall): attrs.ints = {role, causal, has_mask, dropout}
//              (ir::AttentionAttrs; dropout: the bits of the double p, 0 for none); the role
//              (AttentionRole) says which value: Out [B, H, L, Ev] of q's dtype, Lse [B, H, L]
//              float32 (float64 for float64 q): each row's log-sum-exp of its scores, -inf where
//              every key is masked;
//              or the gradient DQ / DK / DV (q's, k's, v's shape and dtype). Inputs: forward
//              roles {q [B, H, L, E], k [B, Hkv, S, E], v [B, Hkv, S, Ev], mask?}; gradient roles
//              {q, k, v, out, dout, lse, mask?}, then the dropout's key (a 0-dim int64 node)
//              when dropout p > 0; the mask is additive, [B|1, H|1, L, S], of a floating dtype.
//              H is a multiple of Hkv (grouped-query heads). A row whose keys are all masked gives
//              0 (torch's fused kernels), and no gradient. Dropout: P's element (b, h, i, j) is
//              kept where Philox's uniform_f32(key, ((b H + h) L + i) S + j) >= (float)p (the
//              counter a Random node of P's shape gives it) and scaled by 1 / (1 - p); the lse
//              is of the undropped P, and the gradients use the same mask

enum class Op : std::uint8_t {
#define KILN_IR_OP_ENUM(name, text, kind, cost, flags) name,
  KILN_IR_OPS(KILN_IR_OP_ENUM)
#undef KILN_IR_OP_ENUM
};

/// One row of the op table.
struct OpInfo {
  const char* name;
  OpKind kind;
  int arity;  ///< inputs; -1: any number (concat)
  CostClass cost;
  std::uint32_t flags;
  /// The vector-Jacobian rule: declared here so that every primitive gets its gradient in the
  /// same row; the rules are filled in by the autodiff stage (null: none yet).
  const void* vjp = nullptr;
};

namespace table_detail {
constexpr int kind_arity(OpKind k, Op op) {
  return k == OpKind::Leaf                               ? 0
         : k == OpKind::Binary || k == OpKind::Contract || k == OpKind::Gather ? 2
         : k == OpKind::Ternary || k == OpKind::Scatter ? 3
         : op == Op::Concat || k == OpKind::Attention   ? -1
                                                        : 1;
}
inline constexpr OpInfo kOpTable[] = {
#define KILN_IR_OP_ROW(name, text, kind, cost, flags) \
  OpInfo{text, OpKind::kind, kind_arity(OpKind::kind, Op::name), CostClass::cost, static_cast<std::uint32_t>(flags)},
    KILN_IR_OPS(KILN_IR_OP_ROW)
#undef KILN_IR_OP_ROW
};
}  // namespace table_detail

/// Number of primitives.
inline constexpr int kNumOps = static_cast<int>(sizeof(table_detail::kOpTable) / sizeof(table_detail::kOpTable[0]));

/// The table row of `op`.
constexpr const OpInfo& op_info(Op op) { return table_detail::kOpTable[static_cast<int>(op)]; }

constexpr OpKind op_kind(Op op) { return op_info(op).kind; }
constexpr bool has_flag(Op op, OpFlag f) { return (op_info(op).flags & f) != 0; }
constexpr bool is_pointwise(Op op) {
  auto k = op_kind(op);
  return k == OpKind::Unary || k == OpKind::Binary || k == OpKind::Ternary;
}
constexpr bool is_reduction(Op op) { return op_kind(op) == OpKind::Reduce; }
constexpr bool is_index_map(Op op) { return op_kind(op) == OpKind::IndexMap; }
constexpr bool is_gather(Op op) { return op_kind(op) == OpKind::Gather; }
constexpr bool is_scatter(Op op) { return op_kind(op) == OpKind::Scatter; }
constexpr bool is_scan(Op op) { return op_kind(op) == OpKind::Scan; }
constexpr bool is_sort(Op op) { return op_kind(op) == OpKind::Sort; }
constexpr bool is_attention(Op op) { return op_kind(op) == OpKind::Attention; }

/// Which value of a fused attention an Attention node is (attrs.ints[0]).
enum class AttentionRole : std::int64_t { Out, Lse, DQ, DK, DV };

/// What a Scan node accumulates (attrs.ints[1]).
enum class ScanKind : std::int64_t { Sum, Prod, Max, Min, ArgMax, ArgMin, LogSumExp };

/// The user-facing op a Gather or Scatter node was made for: what its range errors name.
enum class GatherSite : std::int64_t {
  Gather,
  IndexSelect,
  TakeAlongDim,
  Embedding,
  CrossEntropy,
  Scatter,
  ScatterAdd,
  IndexAdd,
  IndexCopy,
  NllLoss
};
constexpr const char* gather_site_name(std::int64_t site) {
  switch (static_cast<GatherSite>(site)) {
    case GatherSite::IndexSelect:
      return "index_select";
    case GatherSite::TakeAlongDim:
      return "take_along_dim";
    case GatherSite::Embedding:
      return "embedding";
    case GatherSite::CrossEntropy:
      return "cross_entropy";
    case GatherSite::Scatter:
      return "scatter";
    case GatherSite::ScatterAdd:
      return "scatter_add";
    case GatherSite::IndexAdd:
      return "index_add";
    case GatherSite::IndexCopy:
      return "index_copy";
    case GatherSite::NllLoss:
      return "nll_loss";
    default:
      return "gather";
  }
}
constexpr bool is_comparison(Op op) { return has_flag(op, kComparison); }
constexpr bool is_library_call(Op op) { return has_flag(op, kLibraryCall); }
constexpr const char* op_name(Op op) { return static_cast<int>(op) < kNumOps ? op_info(op).name : "?"; }

/// Every primitive, in table order (for tests and tools that cover them all).
inline constexpr Op kAllOps[] = {
#define KILN_IR_OP_LIST(name, text, kind, cost, flags) Op::name,
    KILN_IR_OPS(KILN_IR_OP_LIST)
#undef KILN_IR_OP_LIST
};

// The table lists kinds contiguously: a check that a row was not added out of place.
static_assert([] {
  for (int i = 1; i < kNumOps; ++i)
    if (static_cast<int>(table_detail::kOpTable[i].kind) < static_cast<int>(table_detail::kOpTable[i - 1].kind))
      return false;
  return true;
}());

}  // namespace kiln::ir
