#pragma once
// C types and literals of the C-family dialects kiln writes (the C++ writer, codegen/cpp.hpp,
// and the CUDA writer, codegen/cuda.hpp): the same C in both but for how IEEE infinities and
// NaNs are spelled, which each dialect gives as a Dialect.
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "kiln/core/dtype.hpp"
#include "kiln/core/half.hpp"
#include "kiln/ir/graph.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::codegen::c_family {

/// What differs between the dialects in the text they share: the spelling of inf and NaN and
/// of C library calls.
struct Dialect {
  const char* inf_f;
  const char* inf_d;
  const char* nan_f;
  const char* nan_d;
  const char* libm_prefix;  ///< before a C library function's name ("__builtin_" + "floorf")
  const char* round_even;   ///< the function rounding halves to even in the default mode
};
/// GCC/Clang C++: the builtins (constant expressions in every context, inlined, vectorised).
inline constexpr Dialect kCppDialect{"__builtin_inff()",    "__builtin_inf()", "__builtin_nanf(\"\")",
                                     "__builtin_nan(\"\")", "__builtin_",      "nearbyint"};
/// CUDA C++ under NVRTC: the prelude's macros (codegen/cuda/prelude.hpp), bit patterns; CUDA's
/// device math functions.
inline constexpr Dialect kCudaDialect{"KILN_INF_F", "KILN_INF_D", "KILN_NAN_F", "KILN_NAN_D", "", "rint"};

/// The opening of a call of C library function `name` on double (`is_double`) or float
/// operands in dialect `d`: "__builtin_floorf(", "floor(".
inline std::string libm_call(const Dialect& d, const std::string& name, bool is_double) {
  return std::string(d.libm_prefix) + name + (is_double ? "(" : "f(");
}

/// C type values of `t` are computed in (16-bit floats in float).
inline const char* ctype(DType t) {
  switch (t) {
    case DType::Bool:
      return "bool";
    case DType::Int32:
      return "int";
    case DType::Int64:
      return "long long";
    case DType::Float64:
      return "double";
    default:
      return "float";
  }
}

/// C type values of `t` are stored as (16-bit floats as their bits).
inline const char* stype(DType t) {
  switch (t) {
    case DType::Bool:
      return "unsigned char";
    case DType::Int32:
      return "int";
    case DType::Int64:
      return "long long";
    case DType::Float16:
    case DType::BFloat16:
      return "unsigned short";
    case DType::Float32:
      return "float";
    case DType::Float64:
      return "double";
  }
  return "?";
}

/// `v` as a C hexadecimal floating literal (exact).
inline std::string hex_double(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, std::fabs(v), std::chars_format::hex);
  return std::string(std::signbit(v) ? "-0x" : "0x") + std::string(buf, r.ptr);
}

/// Exact literal of a floating value as a float or a double.
inline std::string float_literal(double v, bool is_double, const Dialect& d) {
  if (std::isnan(v)) return is_double ? d.nan_d : d.nan_f;
  if (std::isinf(v)) return std::string(v < 0 ? "(-" : "(") + (is_double ? d.inf_d : d.inf_f) + ")";
  if (is_double) return "(" + hex_double(v) + ")";
  // A double beyond float's range rounds to inf as a float: spelled as inf, not as the hex
  // text of an infinity ("0xinff", which no compiler reads).
  const float f = static_cast<float>(v);
  if (std::isinf(f)) return std::string(f < 0 ? "(-" : "(") + d.inf_f + ")";
  return "(" + hex_double(static_cast<double>(f)) + "f)";
}

/// Literal of integer `v` in integer or bool dtype `t` (int32 wraps as a cast does).
inline std::string int_literal(std::int64_t v, DType t) {
  if (t == DType::Bool) return v ? "true" : "false";
  if (t == DType::Int32)
    return "((int)" + std::to_string(static_cast<std::int32_t>(static_cast<std::uint32_t>(v))) + ")";
  if (v == std::numeric_limits<std::int64_t>::min()) return "(-9223372036854775807LL - 1)";
  return "(" + std::to_string(v) + "LL)";
}

/// The value of constant `n` (as the reference casts it) in its dtype, as a literal of ctype.
inline std::string constant_literal(const ir::GraphNode& n, const Dialect& d) {
  DType t = n.dtype;
  if (is_floating(t)) {
    double v = n.attrs.scalar;
    if (t == DType::Float16)
      v = static_cast<float>(Half(static_cast<float>(v)));
    else if (t == DType::BFloat16)
      v = static_cast<float>(BFloat16(static_cast<float>(v)));
    return float_literal(v, t == DType::Float64, d);
  }
  return int_literal(n.attrs.iscalar, t);
}

/// The prelude helpers a unit calls, as far as the code shared by the writers decides them (each
/// writer's own Needs adds the rest).
struct PreludeNeeds {
  bool half = false, bf16 = false, ints = false, philox = false;
  bool gather = false;  ///< kiln_gather_index and the fault record (core/index_fault.hpp)
};

/// An f32 result `v` rounded to the precision of 16-bit dtype `dt` (the reference rounds every
/// op); `v` itself for other dtypes.
inline std::string round16(const std::string& v, DType dt, PreludeNeeds& needs) {
  if (dt == DType::Float16) {
    needs.half = true;
    return "kiln_rh(" + v + ")";
  }
  if (dt == DType::BFloat16) {
    needs.bf16 = true;
    return "kiln_rb(" + v + ")";
  }
  return v;
}

/// Value `v` (of ctype(dt)) as stored (stype(dt)).
inline std::string to_storage(const std::string& v, DType dt, PreludeNeeds& needs) {
  switch (dt) {
    case DType::Bool:
      return "(unsigned char)(" + v + ")";
    case DType::Float16:
      needs.half = true;
      return "kiln_f2h(" + v + ")";
    case DType::BFloat16:
      needs.bf16 = true;
      return "kiln_f2b(" + v + ")";
    default:
      return v;
  }
}

/// Stored element `e` (stype(dt)) as a value of ctype(dt).
inline std::string from_storage(const std::string& e, DType dt, PreludeNeeds& needs) {
  switch (dt) {
    case DType::Bool:
      return "(" + e + " != 0)";
    case DType::Float16:
      needs.half = true;
      return "kiln_h2f(" + e + ")";
    case DType::BFloat16:
      needs.bf16 = true;
      return "kiln_b2f(" + e + ")";
    default:
      return e;
  }
}

}  // namespace kiln::codegen::c_family

KILN_COLD_CODE_END
