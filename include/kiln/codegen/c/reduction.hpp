#pragma once
// A reduction's combiner as C text, for every C-family dialect: the rules of ir/combiner.hpp
// (which the reference executor folds values with) printed once for the C++ and the CUDA
// writers. A writer lends its names (accumulator `a`, index `x`, value `v`, position `k`) and
// decides where each piece goes (per thread, per lane, across threads); the text is the same.
#include <string>

#include "kiln/codegen/c/literals.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/ir/op.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::codegen::c_family {

/// One reduction's combiner: what it folds, its accumulator's C type and its identity.
struct Combiner {
  ir::Op op = ir::Op::ReduceSum;
  DType in = DType::Float32, out = DType::Float32;
  bool fl = false;     ///< floating input
  bool arg = false;    ///< ArgMax / ArgMin: (value, index) pairs
  std::string acc_t;   ///< sums and products in double (floats) or wrapping unsigned (integers)
  std::string init;    ///< the identity: 0, 1, -inf/+inf or the integer extremes; 0 for arg ones
};

/// The combiner of reduction `op` (sum, prod, max, min, argmax, argmin) from `in` to `out`,
/// with dialect `d`'s infinities.
inline Combiner combiner(ir::Op op, DType in, DType out, const Dialect& d) {
  using ir::Op;
  Combiner c;
  c.op = op;
  c.in = in;
  c.out = out;
  c.fl = is_floating(in);
  c.arg = op == Op::ArgMax || op == Op::ArgMin;
  switch (op) {
    case Op::ReduceSum:
    case Op::ReduceProd:
      c.acc_t = c.fl ? "double" : "unsigned long long";
      c.init = op == Op::ReduceSum ? (c.fl ? "0.0" : "0ull") : (c.fl ? "1.0" : "1ull");
      break;
    case Op::ReduceMax:
    case Op::ReduceMin: {
      const bool mx = op == Op::ReduceMax;
      if (c.fl) {
        c.acc_t = ctype(in);
        c.init = std::string(mx ? "(-" : "(") + (in == DType::Float64 ? d.inf_d : d.inf_f) + ")";
      } else if (in == DType::Bool) {
        c.acc_t = "long long";
        c.init = mx ? "0LL" : "1LL";
      } else if (in == DType::Int32) {
        c.acc_t = ctype(in);
        c.init = mx ? "(-2147483647 - 1)" : "2147483647";
      } else {
        c.acc_t = ctype(in);
        c.init = mx ? "(-9223372036854775807LL - 1)" : "9223372036854775807LL";
      }
      break;
    }
    default:  // ArgMax, ArgMin: the value beside its index, which starts at -1 (none yet)
      c.acc_t = in == DType::Bool ? "long long" : ctype(in);
      c.init = in == DType::Bool ? "0LL" : std::string("(") + ctype(in) + ")0";
      break;
  }
  return c;
}

inline bool is_max(const Combiner& c) { return c.op == ir::Op::ReduceMax || c.op == ir::Op::ArgMax; }

/// Whether candidate (cv, ck) replaces (a, x) in an arg reduction: the extreme wins, NaN counts
/// as the extreme, ties go to the lower index; index-aware, so partial results may be combined
/// in any grouping.
inline std::string take(const Combiner& c, const std::string& a, const std::string& x, const std::string& cv,
                        const std::string& ck) {
  const char* cmp = is_max(c) ? " > " : " < ";
  std::string plain = "(" + cv + cmp + a + " || (" + cv + " == " + a + " && " + ck + " < " + x + "))";
  if (c.fl) {
    std::string an = "(" + a + " != " + a + ")", bn = "(" + cv + " != " + cv + ")";
    plain = "((" + an + " || " + bn + ") ? ((" + an + " && " + bn + ") ? " + ck + " < " + x + " : " + bn + ") : " +
            plain + ")";
  }
  return "(" + ck + " >= 0 && (" + x + " < 0 || " + plain + "))";
}

/// Folds value `v` (at flat position `k` along the reduced dims, for arg reductions) into the
/// accumulator `a` (`x` its index). A float max/min either lets NaN stick (once `a` is NaN no
/// comparison is true) or, given `nan_flag`, keeps NaN apart in that int (a writer whose max
/// may be a vector instruction that drops NaN; finish reads the flag).
inline std::string step(const Combiner& c, const std::string& a, const std::string& x, const std::string& v,
                        const std::string& k, const std::string& nan_flag = "") {
  using ir::Op;
  switch (c.op) {
    case Op::ReduceSum:
      return a + " += " + (c.fl ? "(double)" + v : "(unsigned long long)(long long)" + v) + ";";
    case Op::ReduceProd:
      return a + " *= " + (c.fl ? "(double)" + v : "(unsigned long long)(long long)" + v) + ";";
    case Op::ReduceMax:
    case Op::ReduceMin: {
      const char* cmp = c.op == Op::ReduceMax ? " > " : " < ";
      const std::string cv = "{ const " + c.acc_t + " cv = " + (c.in == DType::Bool ? "(long long)" + v : v) + "; ";
      if (!c.fl) return cv + a + " = cv" + cmp + a + " ? cv : " + a + "; }";
      if (!nan_flag.empty()) return cv + a + " = cv" + cmp + a + " ? cv : " + a + "; " + nan_flag + " |= (cv != cv); }";
      return cv + a + " = (cv" + cmp + a + " || cv != cv) ? cv : " + a + "; }";
    }
    default: {
      std::string vv = c.in == DType::Bool ? "(long long)" + v : v;
      return "{ const " + c.acc_t + " cv = " + vv + "; const long long ck = " + k + "; if (" +
             take(c, a, x, "cv", "ck") + ") { " + a + " = cv; " + x + " = ck; } }";
    }
  }
}

/// Merges partial result (pv, px) into (a, x): the step applied to a partial result.
inline std::string merge(const Combiner& c, const std::string& a, const std::string& x, const std::string& pv,
                         const std::string& px) {
  using ir::Op;
  switch (c.op) {
    case Op::ReduceSum:
      return a + " += " + pv + ";";
    case Op::ReduceProd:
      return a + " *= " + pv + ";";
    case Op::ReduceMax:
    case Op::ReduceMin: {
      const char* cmp = c.op == Op::ReduceMax ? " > " : " < ";
      if (!c.fl) return "{ const " + c.acc_t + " cv = " + pv + "; " + a + " = cv" + cmp + a + " ? cv : " + a + "; }";
      return "{ const " + c.acc_t + " cv = " + pv + "; " + a + " = (cv" + cmp + a + " || cv != cv) ? cv : " + a + "; }";
    }
    default:
      return "{ const " + c.acc_t + " cv = " + pv + "; const long long ck = " + px + "; if (" +
             take(c, a, x, "cv", "ck") + ") { " + a + " = cv; " + x + " = ck; } }";
  }
}

/// The result in ctype(out) from accumulator `a` (index `x`; `nan_flag` as given to step, or
/// ""), 16-bit floats rounded once.
inline std::string finish(const Combiner& c, const std::string& a, const std::string& x, const std::string& nan_flag,
                          const Dialect& d, PreludeNeeds& needs) {
  using ir::Op;
  switch (c.op) {
    case Op::ReduceSum:
    case Op::ReduceProd:
      if (c.fl) return round16("(" + std::string(ctype(c.out)) + ")" + a, c.out, needs);
      if (c.out == DType::Bool) return "(" + a + " != 0)";
      return "(" + std::string(ctype(c.out)) + ")(long long)" + a;
    case Op::ReduceMax:
    case Op::ReduceMin:
      if (c.out == DType::Bool) return "(" + a + " != 0)";
      if (c.fl && !nan_flag.empty())
        return "(" + nan_flag + " ? " + (c.in == DType::Float64 ? d.nan_d : d.nan_f) + " : " + a + ")";
      return a;
    default:
      return "(" + x + " < 0 ? 0LL : " + x + ")";
  }
}

}  // namespace kiln::codegen::c_family

KILN_COLD_CODE_END
