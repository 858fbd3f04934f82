#pragma once
// The CUDA dialect of the C-family core (codegen/c/): literals and types as NVRTC reads them,
// what a unit's prelude must hold (Needs), a reduction's combiner as CUDA text (Red: step,
// merge, the online max-and-sum step) and the vector words loads and stores move.
#include <string>

#include "kiln/codegen/c/integer.hpp"
#include "kiln/codegen/c/literals.hpp"
#include "kiln/codegen/c/pointwise.hpp"
#include "kiln/codegen/c/reduction.hpp"
#include "kiln/core/error.hpp"
#include "kiln/ir/graph.hpp"
#include "kiln/sched/index.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

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
/// A reduction of the kernel: its combiner (codegen/c/reduction.hpp: the text both writers
/// print) and what the CUDA writer adds.
struct Red : c_family::Combiner {
  int node = -1;
  /// A max whose phase-next sum of exp(input - max) is folded in the same pass ("online
  /// softmax": the sum is rescaled whenever the max grows); the sum's node, else -1.
  int online_sum = -1;
};

inline Red red_info(const ir::Graph& g, int id) {
  const ir::GraphNode& n = g.nodes[static_cast<std::size_t>(id)];
  Red r;
  static_cast<c_family::Combiner&>(r) =
      c_family::combiner(n.op, g.nodes[static_cast<std::size_t>(n.inputs[0])].dtype, n.dtype, c_family::kCudaDialect);
  r.node = id;
  return r;
}

// The combiner's text, written once for both writers.
using c_family::is_max;
using c_family::merge;
using c_family::step;
using c_family::take;

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

KILN_COLD_CODE_END
