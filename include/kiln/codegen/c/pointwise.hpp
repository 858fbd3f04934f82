#pragma once
// C text of the pointwise primitives as every C-family dialect kiln writes them (the C++ writer
// and the CUDA writer), each dialect lending its spellings (c/literals.hpp's Dialect) and its
// errors. What the writers emit themselves: the libm-named math (kiln's
// vectorised functions on the CPU), casts, and floating + - * / (CUDA keeps them apart from
// FMA contraction and may multiply by a reciprocal).
#include <string>

#include "kiln/codegen/c/integer.hpp"
#include "kiln/codegen/c/literals.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/generated.hpp"
#include "kiln/core/index_fault.hpp"
#include "kiln/core/philox.hpp"
#include "kiln/ir/graph.hpp"
#include "kiln/ir/op.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

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

/// The DTypeError of primitive `n` on operand dtype `in`, from writer `writer` ("kiln codegen").
[[noreturn]] inline void unsupported(const char* writer, const ir::GraphNode& n, DType in) {
  throw DTypeError(std::string(writer) + ": " + ir::op_name(n.op) + " is not defined for " + dtype_name(in) +
                   " (shape " + n.shape.str() + "); cast to a floating dtype first");
}

/// One pointwise node as the shared emitter sees it.
struct PointwiseArgs {
  const ir::GraphNode& node;
  DType in;  ///< the first operand's dtype
  const std::string& a;
  const std::string& b;  ///< "" for unary ops
  const std::string& c;  ///< "" but for where
};

/// What the writer lends the shared emitter.
struct PointwiseHooks {
  const Dialect& dialect;
  PreludeNeeds& needs;  ///< the prelude helpers the text calls
  const char* writer;   ///< names the writer in errors
};

/// C text of `p`, or "" for what each writer emits itself (see the top of this file).
inline std::string pointwise_expr(const PointwiseArgs& p, const PointwiseHooks& h) {
  using ir::Op;
  const std::string &a = p.a, &b = p.b;
  const DType it = p.in, t = p.node.dtype;
  const Op op = p.node.op;
  const bool fl = is_floating(it), dbl = it == DType::Float64;
  const Dialect& d = h.dialect;
  if (std::string e = select_expr(op, fl, a, b, p.c); !e.empty()) return e;
  // Integer arithmetic wraps (as unsigned); bool arithmetic is done on 0/1 integers, as the
  // reference does.
  auto wrap = [&](const char* op) {
    if (it == DType::Bool) return "((long long)" + a + " " + op + " (long long)" + b + " != 0)";
    std::string u = it == DType::Int32 ? "unsigned" : "unsigned long long";
    return "(" + std::string(ctype(it)) + ")((" + u + ")" + a + " " + op + " (" + u + ")" + b + ")";
  };
  const std::string negated =
      it == DType::Int32 ? "(int)(0u - (unsigned)" + a + ")" : "(long long)(0ull - (unsigned long long)" + a + ")";
  switch (op) {
    case Op::Neg:
      if (fl) return "(-" + a + ")";
      return it == DType::Bool ? a : negated;
    case Op::Abs:
      if (fl) return libm_call(d, "fabs", dbl) + a + ")";
      return it == DType::Bool ? a : "(" + a + " < 0 ? " + negated + " : " + a + ")";
    case Op::BitNot:
    case Op::BitAnd:
    case Op::BitOr:
    case Op::BitXor:
    case Op::Shl:
    case Op::Shr:
      if (!integer_expr_applies(op, it)) unsupported(h.writer, p.node, it);
      return integer_expr(op, it, ctype(it), a, b, h.needs.ints);
    case Op::Rsqrt:
      // 1/sqrt(x) with two correctly rounded steps, as the reference (CUDA's rsqrtf is approximate).
      if (!fl) unsupported(h.writer, p.node, it);
      return round16(std::string(dbl ? "(1.0 / " : "(1.0f / ") + libm_call(d, "sqrt", dbl) + a + "))", t, h.needs);
    case Op::Floor:
      return fl ? libm_call(d, "floor", dbl) + a + ")" : a;
    case Op::Ceil:
      return fl ? libm_call(d, "ceil", dbl) + a + ")" : a;
    case Op::Round:  // halves to even, as torch.round
      return fl ? libm_call(d, d.round_even, dbl) + a + ")" : a;
    case Op::Not:
      return "(" + a + " == 0)";
    case Op::IsNan:
      return fl ? "(" + a + " != " + a + ")" : "false";
    case Op::IsInf:
      return fl ? "(" + libm_call(d, "fabs", dbl) + a + ") == " + (dbl ? d.inf_d : d.inf_f) + ")" : "false";
    case Op::Add:
      return fl ? "" : wrap("+");
    case Op::Sub:
      return fl ? "" : wrap("-");
    case Op::Mul:
      return fl ? "" : wrap("*");
    case Op::Div:
      if (fl) return "";
      h.needs.ints = true;
      if (it == DType::Bool) return "(kiln_idiv_i64((long long)" + a + ", (long long)" + b + ") != 0)";
      return std::string(it == DType::Int32 ? "kiln_idiv_i32(" : "kiln_idiv_i64(") + a + ", " + b + ")";
    case Op::Fmod:
      if (fl) return round16(libm_call(d, "fmod", dbl) + a + ", " + b + ")", t, h.needs);
      if (!integer_expr_applies(op, it)) unsupported(h.writer, p.node, it);
      return integer_expr(op, it, ctype(it), a, b, h.needs.ints);
    case Op::Pow:
      if (fl) return round16(libm_call(d, "pow", dbl) + a + ", " + b + ")", t, h.needs);
      h.needs.ints = true;
      if (it == DType::Bool) return "(kiln_ipow_i64((long long)" + a + ", (long long)" + b + ") != 0)";
      return std::string(it == DType::Int32 ? "kiln_ipow_i32(" : "kiln_ipow_i64(") + a + ", " + b + ")";
    default:
      return "";
  }
}

/// A Philox draw (kiln/core/philox.hpp, compiled into every dialect's prelude) for random node
/// `n` at flat index `flat`: uniform in [0, 1) or standard normal (attrs.ints[0] == 1), in n's
/// floating dtype; the key is `seed` (an expression) when given, else the node's seed literal.
/// `writer` names the writer in the DTypeError for other dtypes.
inline std::string random_expr(const ir::GraphNode& n, const std::string& flat, PreludeNeeds& needs, const char* writer,
                               const std::string& seed = "") {
  needs.philox = true;
  if (!is_floating(n.dtype))
    throw DTypeError(std::string(writer) + ": random of dtype " + dtype_name(n.dtype) + " (shape " + n.shape.str() +
                     "): only floating dtypes");
  const bool normal = !n.attrs.ints.empty() && n.attrs.ints[0] == 1;
  const std::string key = seed.empty() ? "(unsigned long long)" + std::to_string(n.attrs.seed) + "ULL" : seed;
  const std::string args = key + ", (unsigned long long)" + flat;
  const std::string ns = "kiln::philox::";
  switch (n.dtype) {
    case DType::Float32:
      return ns + (normal ? "normal_f32(" : "uniform_f32(") + args + ")";
    case DType::Float64:
      return ns + (normal ? "normal_f64(" : "uniform_f64(") + args + ")";
    case DType::Float16:
      return normal ? round16(ns + "normal_f32(" + args + ")", n.dtype, needs) : ns + "uniform_f16(" + args + ")";
    default:
      return normal ? round16(ns + "normal_f32(" + args + ")", n.dtype, needs) : ns + "uniform_bf16(" + args + ")";
  }
}

/// The checked index of gather node `n` whose index operand's value is `at`: the value when it
/// is in [0, size), else a clamped one, the fault recorded for the host to raise (every dialect's
/// prelude defines kiln_gather_index; core/index_fault.hpp says how faults are reported). The
/// site describing the gather is registered here, where the text is generated.
inline std::string gather_index_expr(const ir::Graph& g, const ir::GraphNode& n, const std::string& at,
                                     PreludeNeeds& needs) {
  needs.gather = true;
  const ir::GraphNode& x = g.nodes[static_cast<std::size_t>(n.inputs[0])];
  const ir::GraphNode& index = g.nodes[static_cast<std::size_t>(n.inputs[1])];
  const std::int64_t axis = n.attrs.ints.at(0);
  const long long site = kiln::detail::register_index_fault_site(
      ir::gather_site_name(n.attrs.ints.at(1)), axis,
      "input " + std::string(dtype_name(x.dtype)) + x.shape.str() + ", index " + dtype_name(index.dtype) +
          index.shape.str());
  return "kiln_gather_index((long long)" + at + ", " + std::to_string(x.shape[static_cast<std::size_t>(axis)]) +
         "LL, " + std::to_string(site) + "LL)";
}

/// The prelude text of kiln_gather_index in a dialect: `device` is the dialect's function
/// qualifier ("" or "__device__"), `noinline` its spelling of a cold out-of-line function,
/// `exchange` the first-fault claim on r[0] (an atomic swap from 0 to 1 that yields the old value).
inline std::string gather_prelude(const std::string& device, const std::string& noinline, const std::string& exchange) {
  const std::string fn = "static " + device + (device.empty() ? "" : " ");
  return "extern \"C\" { " + fn.substr(7) + "long long* kiln_index_fault = 0; }\n" + fn + noinline +
         " void kiln_index_out_of_range(long long site, long long v, long long bound) {\n" +
         "  long long* r = kiln_index_fault;\n  if (r && " + exchange +
         " == 0) { r[1] = site; r[2] = v; r[3] = bound; }\n}\n" + fn +
         "inline long long kiln_gather_index(long long v, long long bound, long long site) {\n" +
         "  if ((unsigned long long)v >= (unsigned long long)bound) {\n    kiln_index_out_of_range(site, v, bound);\n" +
         "    return v < 0 ? 0 : bound - 1;\n  }\n  return v;\n}\n";
}

/// The end of a unit in every dialect, after the dialect's own helpers: the Philox source when a
/// kernel draws random numbers, the marker logs cut at (KILN_LOGS=output_code), the kernels.
inline void append_kernels(std::string& src, const PreludeNeeds& needs, const std::string& kernels) {
  if (needs.philox) {
    src += philox::kPhiloxSource;
    src += "\n";
  }
  src += kiln::detail::kKernelsBeginMarker;
  src += kernels;
}

}  // namespace kiln::codegen::c_family

KILN_COLD_CODE_END
