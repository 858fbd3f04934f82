#pragma once
// C text of the integer and bitwise primitives (bitwise and/or/xor/not, shifts, integer fmod):
// the same in every C-family dialect kiln writes (the C++ writer and the CUDA writer), so it is
// written once here; their helpers (kiln_ifmod_*, kiln_shl_*, kiln_shr_*) are in each dialect's
// integer prelude, with the same semantics as the reference executor.
#include <string>

#include "kiln/core/dtype.hpp"
#include "kiln/ir/op.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::codegen::c_family {

/// The expression of integer/bool primitive `op` on operands `a`, `b` of dtype `it` (C type
/// `ctype`), or "" when `op` is not one of them. Sets `needs_ints` when a prelude helper is used.
/// The caller has refused the dtypes the op is not defined for.
inline std::string integer_expr(ir::Op op, DType it, const char* ctype, const std::string& a, const std::string& b,
                                bool& needs_ints) {
  using ir::Op;
  const std::string width = it == DType::Int32 ? "_i32(" : "_i64(";
  switch (op) {
    case Op::BitNot:
      return it == DType::Bool ? "(!" + a + ")" : "((" + std::string(ctype) + ")~" + a + ")";
    case Op::BitAnd:
      return "((" + std::string(ctype) + ")(" + a + " & " + b + "))";
    case Op::BitOr:
      return "((" + std::string(ctype) + ")(" + a + " | " + b + "))";
    case Op::BitXor:
      return "((" + std::string(ctype) + ")(" + a + " ^ " + b + "))";
    case Op::Shl:
      needs_ints = true;
      return "kiln_shl" + width + a + ", " + b + ")";
    case Op::Shr:
      needs_ints = true;
      return "kiln_shr" + width + a + ", " + b + ")";
    case Op::Fmod:
      needs_ints = true;
      return "kiln_ifmod" + width + a + ", " + b + ")";
    default:
      return "";
  }
}

/// Whether `op` on dtype `it` is refused by integer_expr's callers (bitwise ops on floats,
/// shifts and fmod on floats or bools are handled elsewhere or are not defined).
inline bool integer_expr_applies(ir::Op op, DType it) {
  using ir::Op;
  if (op == Op::Fmod) return is_integral(it);
  if (op == Op::Shl || op == Op::Shr) return is_integral(it);
  return (op == Op::BitNot || op == Op::BitAnd || op == Op::BitOr || op == Op::BitXor) && !is_floating(it);
}

}  // namespace kiln::codegen::c_family

KILN_COLD_CODE_END
