#pragma once
// One matrix product as the BLAS libraries see it: what the CPU (a run-time-loaded CBLAS, or
// the built-in fallback) and the GPU (cuBLASLt) are handed by the library-call steps of a
// plan. Row-major views with arbitrary element strides; one level of batch with one stride per
// operand (outer batch levels are looped over by the caller).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "kiln/core/dtype.hpp"
#include "kiln/core/hash.hpp"

namespace kiln::runtime {

/// What a library product applies to its result before storing it (cuBLASLt's epilogues).
/// The GELU forms are the tanh approximation, which is what cuBLASLt computes. The training
/// pair: GeluAux and GeluAuxBias also store the GELU's input (the biased product) in an auxiliary matrix
/// of D's shape, and DGelu multiplies the product by the GELU's derivative at such a matrix
/// (D = (A @ B) * gelu'(aux)): a backward's gradient through the GELU, computed by the product
/// that makes the gradient of its output.
enum class GemmEpilogue : std::uint8_t { None, Bias, Relu, ReluBias, Gelu, GeluBias, GeluAux, GeluAuxBias, DGelu };

inline const char* epilogue_name(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::None:
      return "none";
    case GemmEpilogue::Bias:
      return "bias";
    case GemmEpilogue::Relu:
      return "relu";
    case GemmEpilogue::ReluBias:
      return "relu_bias";
    case GemmEpilogue::Gelu:
      return "gelu";
    case GemmEpilogue::GeluBias:
      return "gelu_bias";
    case GemmEpilogue::GeluAux:
      return "gelu_aux";
    case GemmEpilogue::GeluAuxBias:
      return "gelu_aux_bias";
    case GemmEpilogue::DGelu:
      return "dgelu";
  }
  return "?";
}
inline bool epilogue_has_bias(GemmEpilogue e) {
  return e == GemmEpilogue::Bias || e == GemmEpilogue::ReluBias || e == GemmEpilogue::GeluBias ||
         e == GemmEpilogue::GeluAuxBias;
}
/// Whether the epilogue writes (GeluAux, GeluAuxBias) or reads (DGelu) an auxiliary matrix: D's
/// shape, in D's dtype, row-major with row stride GemmShape::aux_rs.
inline bool epilogue_has_aux(GemmEpilogue e) {
  return e == GemmEpilogue::GeluAux || e == GemmEpilogue::GeluAuxBias || e == GemmEpilogue::DGelu;
}

/// How a BLAS reads one rows x cols matrix whose element (i, j) is at i * rs + j * cs: as a
/// row-major matrix (`transposed` false) or a column-major one (`transposed` true), with leading
/// dimension `ld` (at least max(1, the inner size); a stride along a dim of size 1 is never
/// used, so either form fits there). The one rule the step planner (what a call may read in
/// place), the CBLAS and cuBLASLt all apply.
struct MatrixLayout {
  bool transposed = false;
  std::int64_t ld = 1;
};

/// The layout of that matrix, or nothing when neither form fits (no unit stride, or a stride
/// that does not span the inner dim: 0, overlapping).
inline std::optional<MatrixLayout> matrix_layout(std::int64_t rows, std::int64_t cols, std::int64_t rs,
                                                 std::int64_t cs) {
  if ((cs == 1 || cols == 1) && (rows == 1 || rs >= std::max<std::int64_t>(cols, 1)))
    return MatrixLayout{false, rows == 1 ? std::max<std::int64_t>(cols, 1) : rs};
  if ((rs == 1 || rows == 1) && (cols == 1 || cs >= std::max<std::int64_t>(rows, 1)))
    return MatrixLayout{true, cols == 1 ? std::max<std::int64_t>(rows, 1) : cs};
  return std::nullopt;
}

/// D[b] = epilogue(A[b] @ B[b] + bias), b < batch, with A[b] m x k, B[b] k x n, D[b] m x n.
/// Element (i, p) of A[b] is at a + b * a_bs + i * a_rs + p * a_cs (in elements of `dtype`);
/// one of a_rs, a_cs is 1 (a row-major or a column-major matrix), likewise for B. D is
/// row-major with unit column stride and row stride d_rs. A batch stride of 0 broadcasts.
/// The bias has n contiguous elements of `bias_dtype`, added to every row.
struct GemmShape {
  DType dtype = DType::Float32;      ///< A and B
  DType out_dtype = DType::Float32;  ///< D
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t batch = 1;
  std::int64_t a_rs = 0, a_cs = 1, a_bs = 0;
  std::int64_t b_rs = 0, b_cs = 1, b_bs = 0;
  std::int64_t d_rs = 0, d_bs = 0;
  GemmEpilogue epilogue = GemmEpilogue::None;
  DType bias_dtype = DType::Float32;
  /// The auxiliary matrix's row stride (epilogue_has_aux): cuBLASLt wants a multiple of 8.
  std::int64_t aux_rs = 0;
  /// f32 products may use TF32 tensor cores (set_float32_matmul_precision("high")).
  bool allow_tf32 = false;
  /// The floating dtype A (B) is stored in when it is not `dtype`: the operand is read through
  /// a cast to `dtype` (a prologue folded into the call; the CPU product packs it so).
  std::optional<DType> a_from, b_from;

  bool operator==(const GemmShape&) const = default;

  /// Hash of every field: the key of cached algorithm choices.
  std::uint64_t hash() const {
    using kiln::detail::hash_combine;
    std::uint64_t h = hash_combine(static_cast<std::uint64_t>(dtype), static_cast<std::uint64_t>(out_dtype));
    for (std::int64_t v : {m, n, k, batch, a_rs, a_cs, a_bs, b_rs, b_cs, b_bs, d_rs, d_bs})
      h = hash_combine(h, static_cast<std::uint64_t>(v));
    h = hash_combine(h, static_cast<std::uint64_t>(epilogue) * 16 + static_cast<std::uint64_t>(bias_dtype));
    for (const auto& from : {a_from, b_from}) h = hash_combine(h, from ? 1 + static_cast<std::uint64_t>(*from) : 0);
    if (aux_rs != 0) h = hash_combine(h, static_cast<std::uint64_t>(aux_rs));  // shapes without one keep their hashes
    return hash_combine(h, allow_tf32 ? 1 : 0);
  }

  /// "bfloat16 [8, 4096] x [4096, 4096] -> bfloat16, relu_bias" for logs and errors.
  std::string str() const {
    std::string s = std::string(dtype_name(dtype)) + " ";
    if (batch != 1) s += std::to_string(batch) + " x ";
    s += "[" + std::to_string(m) + ", " + std::to_string(k) + "] x [" + std::to_string(k) + ", " + std::to_string(n) +
         "] -> " + dtype_name(out_dtype);
    if (epilogue != GemmEpilogue::None) s += ", " + std::string(epilogue_name(epilogue));
    if (a_from) s += ", A cast from " + std::string(dtype_name(*a_from));
    if (b_from) s += ", B cast from " + std::string(dtype_name(*b_from));
    return s;
  }
};

/// set_float32_matmul_precision's setting: 0 "highest" (full float32), 1 "high", 2 "medium"
/// (TF32 allowed on the GPU). Read by every float32 library product when it runs.
inline std::atomic<int>& float32_matmul_precision_setting() {
  static std::atomic<int> setting{0};
  return setting;
}

}  // namespace kiln::runtime
