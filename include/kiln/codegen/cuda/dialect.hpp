#pragma once
// The CUDA dialect of the C-family core (codegen/c/): literals and types as NVRTC reads them,
// what a unit's prelude must hold (Needs), a reduction's combiner as CUDA text (Red: step,
// merge, the online max-and-sum step) and the vector words loads and stores move.
#include <string>

#include "kiln/codegen/c/integer.hpp"
#include "kiln/codegen/c/literals.hpp"
#include "kiln/codegen/c/pointwise.hpp"
#include "kiln/core/error.hpp"
#include "kiln/ir/graph.hpp"
#include "kiln/sched/index.hpp"

namespace kiln::codegen::cuda_detail {

using ir::Op;
using sched::i64;
using sched::Index;
using sched::IndexExpr;

/// How this writer's errors name it.
inline constexpr const char* kWriter = "kiln CUDA codegen";

// Types and literals: the C every dialect shares (codegen/c/literals.hpp).
using c_family::ctype;
using c_family::hex_double;
using c_family::int_literal;
using c_family::stype;
inline std::string float_literal(double v, bool is_double) {
  return c_family::float_literal(v, is_double, c_family::kCudaDialect);
}
inline std::string constant_literal(const ir::GraphNode& n) {
  return c_family::constant_literal(n, c_family::kCudaDialect);
}

/// What a unit needs in its prelude.
struct Needs : c_family::PreludeNeeds {};

/// One reduction as generated code sees it.
struct Red {
  int node = -1;
  Op op = Op::ReduceSum;
  DType in = DType::Float32, out = DType::Float32;
  bool fl = false;    ///< floating input
  bool arg = false;   ///< ArgMax / ArgMin: (value, index) pairs
  std::string acc_t;  ///< accumulator type
  std::string init;   ///< identity of the combination
  /// A max whose phase-next sum of exp(input - max) is folded in the same pass ("online
  /// softmax": the sum is rescaled whenever the max grows); the sum's node, else -1.
  int online_sum = -1;
};

inline Red red_info(const ir::Graph& g, int id) {
  const ir::GraphNode& n = g.nodes[static_cast<std::size_t>(id)];
  Red r;
  r.node = id;
  r.op = n.op;
  r.in = g.nodes[static_cast<std::size_t>(n.inputs[0])].dtype;
  r.out = n.dtype;
  r.fl = is_floating(r.in);
  c_family::Accumulator acc = c_family::accumulator(n.op, r.in, c_family::kCudaDialect);
  r.acc_t = acc.type;
  r.init = acc.init;
  r.arg = n.op == Op::ArgMax || n.op == Op::ArgMin;
  return r;
}

inline bool is_max(const Red& r) { return r.op == Op::ReduceMax || r.op == Op::ArgMax; }

/// Whether candidate (cv, ck) replaces (a, x) in an arg reduction (the reference's rule: the
/// extreme wins, NaN counts as the extreme, ties go to the lower index; index-aware, so
/// partial results may be combined in any grouping).
inline std::string take(const Red& r, const std::string& a, const std::string& x, const std::string& cv,
                        const std::string& ck) {
  const char* cmp = is_max(r) ? " > " : " < ";
  std::string plain = "(" + cv + cmp + a + " || (" + cv + " == " + a + " && " + ck + " < " + x + "))";
  if (r.fl) {
    std::string an = "(" + a + " != " + a + ")", bn = "(" + cv + " != " + cv + ")";
    plain = "((" + an + " || " + bn + ") ? ((" + an + " && " + bn + ") ? " + ck + " < " + x + " : " + bn +
            ") : " + plain + ")";
  }
  return "(" + ck + " >= 0 && (" + x + " < 0 || " + plain + "))";
}

/// Folds value `v` (at flat position `k` along the reduced dims, for arg reductions) into the
/// accumulator `a` (`x` its index). NaN sticks in max/min: once `a` is NaN no comparison is true.
inline std::string step(const Red& r, const std::string& a, const std::string& x, const std::string& v,
                        const std::string& k) {
  switch (r.op) {
    case Op::ReduceSum:
      return a + " += " + (r.fl ? "(double)" + v : "(unsigned long long)(long long)" + v) + ";";
    case Op::ReduceProd:
      return a + " *= " + (r.fl ? "(double)" + v : "(unsigned long long)(long long)" + v) + ";";
    case Op::ReduceMax:
    case Op::ReduceMin: {
      const char* cmp = r.op == Op::ReduceMax ? " > " : " < ";
      if (!r.fl) {
        std::string vv = r.in == DType::Bool ? "(long long)" + v : v;
        return "{ const " + r.acc_t + " cv = " + vv + "; " + a + " = cv" + cmp + a + " ? cv : " + a + "; }";
      }
      return "{ const " + r.acc_t + " cv = " + v + "; " + a + " = (cv" + cmp + a + " || cv != cv) ? cv : " + a + "; }";
    }
    default: {
      std::string vv = r.in == DType::Bool ? "(long long)" + v : v;
      return "{ const " + r.acc_t + " cv = " + vv + "; const long long ck = " + k + "; if (" +
             take(r, a, x, "cv", "ck") + ") { " + a + " = cv; " + x + " = ck; } }";
    }
  }
}

/// Merges partial (pv, px) into (a, x).
inline std::string merge(const Red& r, const std::string& a, const std::string& x, const std::string& pv,
                         const std::string& px) {
  switch (r.op) {
    case Op::ReduceSum:
      return a + " += " + pv + ";";
    case Op::ReduceProd:
      return a + " *= " + pv + ";";
    case Op::ReduceMax:
    case Op::ReduceMin: {
      const char* cmp = r.op == Op::ReduceMax ? " > " : " < ";
      if (!r.fl) return "{ const " + r.acc_t + " cv = " + pv + "; " + a + " = cv" + cmp + a + " ? cv : " + a + "; }";
      return "{ const " + r.acc_t + " cv = " + pv + "; " + a + " = (cv" + cmp + a + " || cv != cv) ? cv : " + a + "; }";
    }
    default:
      return "{ const " + r.acc_t + " cv = " + pv + "; const long long ck = " + px + "; if (" +
             take(r, a, x, "cv", "ck") + ") { " + a + " = cv; " + x + " = ck; } }";
  }
}

/// Online max-and-sum-of-exp: folds `v` into max `m` and sum `s` (double), the sum kept
/// relative to the current max. Terms exp(-inf - -inf) are skipped (they are 0 once a finite
/// value arrives; an all -inf row is made NaN at the end, as the reference computes it).
inline std::string online_step(const Red& r, const std::string& m, const std::string& s, const std::string& v) {
  const bool dbl = r.in == DType::Float64;
  const std::string t = r.acc_t, ex = dbl ? "exp(" : "expf(", ninf = dbl ? "(-KILN_INF_D)" : "(-KILN_INF_F)";
  return "{ const " + t + " cv = " + v + "; const " + t + " nm = (cv > " + m + " || cv != cv) ? cv : " + m +
         "; if (nm != " + m + ") { " + s + " *= (double)" + ex + m + " - nm); " + m + " = nm; } " + s +
         " += (cv == " + ninf + " && " + m + " == " + ninf + ") ? 0.0 : (double)" + ex + "cv - " + m + "); }";
}

/// Type of a chunk of `bytes` bytes (a whole vector access, or one 16-byte piece of it).
inline const char* chunk_type(std::size_t bytes) {
  switch (bytes) {
    case 16:
      return "uint4";
    case 8:
      return "uint2";
    case 4:
      return "unsigned int";
    case 2:
      return "unsigned short";
    default:
      return "unsigned char";
  }
}

inline const char* word_name(std::size_t chunk_bytes, std::size_t word) {
  static const char* xyzw[] = {".x", ".y", ".z", ".w"};
  if (chunk_bytes >= 8) return xyzw[word];
  return "";
}

}  // namespace kiln::codegen::cuda_detail
