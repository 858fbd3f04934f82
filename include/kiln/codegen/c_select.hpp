#pragma once
// C text of the primitives that read the same in every C-family dialect kiln writes (the C++
// writer and the CUDA writer): comparisons, logical and/or, where, and maximum/minimum with
// PyTorch's NaN rule. Written once here, as c_integer.hpp holds the integer primitives.
#include <string>

#include "kiln/ir/op.hpp"

namespace kiln::codegen::c_family {

/// The expression of `op` on operands `a`, `b`, `c` (`floating`: the operands' dtype is a
/// floating one), or "" when `op` is not one of these primitives.
inline std::string select_expr(ir::Op op, bool floating, const std::string& a, const std::string& b,
                               const std::string& c) {
  using ir::Op;
  switch (op) {
    case Op::Maximum:  // NaN if either operand is NaN
      if (floating)
        return "(" + a + " != " + a + " ? " + a + " : " + b + " != " + b + " ? " + b + " : (" + a + " < " + b + " ? " +
               b + " : " + a + "))";
      return "(" + a + " < " + b + " ? " + b + " : " + a + ")";
    case Op::Minimum:
      if (floating)
        return "(" + a + " != " + a + " ? " + a + " : " + b + " != " + b + " ? " + b + " : (" + b + " < " + a + " ? " +
               b + " : " + a + "))";
      return "(" + b + " < " + a + " ? " + b + " : " + a + ")";
    case Op::Eq:
      return "(" + a + " == " + b + ")";
    case Op::Ne:
      return "(" + a + " != " + b + ")";
    case Op::Lt:
      return "(" + a + " < " + b + ")";
    case Op::Le:
      return "(" + a + " <= " + b + ")";
    case Op::Gt:
      return "(" + a + " > " + b + ")";
    case Op::Ge:
      return "(" + a + " >= " + b + ")";
    case Op::And:
      return "((" + a + " != 0) & (" + b + " != 0))";
    case Op::Or:
      return "((" + a + " != 0) | (" + b + " != 0))";
    case Op::Where:
      return "(" + a + " ? " + b + " : " + c + ")";
    default:
      return "";
  }
}

}  // namespace kiln::codegen::c_family
