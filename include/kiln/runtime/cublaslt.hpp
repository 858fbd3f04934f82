#pragma once
// cuBLASLt, loaded at run time with dlopen (never linked), so one binary runs with and without
// the CUDA toolkit's BLAS: it executes the GPU products of a plan (one GemmShape, runtime/gemm.hpp)
// with the epilogue fused, queued on kiln's stream of the device.
//
// The declarations below are our own (cublasStatus_t as int, opaque descriptors of the sizes the
// library documents, attribute ids as integers), so kiln compiles without cublasLt.h or cuda.h;
// each value names the header and enum it is taken from (CUDA 13.0), and
// tests/runtime/test_cublaslt.cpp checks them against <cublasLt.h> where present.
//
// Row-major through the operand swap: cuBLASLt is column-major, and a row-major X is the
// column-major X^T, so D = A B is computed as D^T = B^T A^T with B as cuBLASLt's first operand.
//
// One handle and one 32 MiB workspace per device, made on first use. The heuristic query costs
// more than a small product, so each (device, shape, pointer alignments) gets a plan once: the
// descriptors and the chosen algorithm; later calls only set the bias pointer and enqueue.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/core/dtype.hpp"
#include "kiln/core/duration.hpp"
#include "kiln/core/env.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/hash.hpp"
#include "kiln/core/log.hpp"
#include "kiln/runtime/autotune.hpp"
#include "kiln/runtime/cuda_driver.hpp"
#include "kiln/runtime/cuda_memory.hpp"
#include "kiln/runtime/dynlib.hpp"
#include "kiln/runtime/gemm.hpp"

namespace kiln::runtime::lt {

// ---- cublas_api.h -----------------------------------------------------------------------------
using cublasStatus_t = int;  // enum cublasStatus_t
inline constexpr cublasStatus_t CUBLAS_STATUS_SUCCESS = 0;
inline constexpr cublasStatus_t CUBLAS_STATUS_NOT_INITIALIZED = 1;
inline constexpr cublasStatus_t CUBLAS_STATUS_ALLOC_FAILED = 3;
inline constexpr cublasStatus_t CUBLAS_STATUS_INVALID_VALUE = 7;
inline constexpr cublasStatus_t CUBLAS_STATUS_ARCH_MISMATCH = 8;
inline constexpr cublasStatus_t CUBLAS_STATUS_MAPPING_ERROR = 11;
inline constexpr cublasStatus_t CUBLAS_STATUS_EXECUTION_FAILED = 13;
inline constexpr cublasStatus_t CUBLAS_STATUS_INTERNAL_ERROR = 14;
inline constexpr cublasStatus_t CUBLAS_STATUS_NOT_SUPPORTED = 15;
inline constexpr cublasStatus_t CUBLAS_STATUS_LICENSE_ERROR = 16;

inline constexpr std::int32_t CUBLAS_OP_N = 0;  // enum cublasOperation_t
inline constexpr std::int32_t CUBLAS_OP_T = 1;

inline constexpr std::int32_t CUBLAS_COMPUTE_32F = 68;            // enum cublasComputeType_t
inline constexpr std::int32_t CUBLAS_COMPUTE_32F_FAST_TF32 = 77;  // f32 inputs rounded to TF32
inline constexpr std::int32_t CUBLAS_COMPUTE_64F = 70;

// ---- library_types.h --------------------------------------------------------------------------
inline constexpr std::int32_t CUDA_R_32F = 0;  // enum cudaDataType_t
inline constexpr std::int32_t CUDA_R_64F = 1;
inline constexpr std::int32_t CUDA_R_16F = 2;
inline constexpr std::int32_t CUDA_R_16BF = 14;

// ---- cublasLt.h: opaque types -----------------------------------------------------------------
// The descriptors are "semi-opaque" structs of fixed size that the library allocates; kiln only
// holds pointers to them, except the algorithm, which is a value (copied into plans).
struct cublasLtContext;
using cublasLtHandle_t = cublasLtContext*;
struct cublasLtMatmulDescOpaque_t {
  std::uint64_t data[32];
};
using cublasLtMatmulDesc_t = cublasLtMatmulDescOpaque_t*;
struct cublasLtMatrixLayoutOpaque_t {
  std::uint64_t data[8];
};
using cublasLtMatrixLayout_t = cublasLtMatrixLayoutOpaque_t*;
struct cublasLtMatmulPreferenceOpaque_t {
  std::uint64_t data[8];
};
using cublasLtMatmulPreference_t = cublasLtMatmulPreferenceOpaque_t*;
/// cublasLtMatmulAlgo_t: 64 bytes that identify one algorithm and its configuration.
struct cublasLtMatmulAlgo_t {
  std::uint64_t data[8];
};
/// cublasLtMatmulHeuristicResult_t: one candidate of cublasLtMatmulAlgoGetHeuristic.
struct cublasLtMatmulHeuristicResult_t {
  cublasLtMatmulAlgo_t algo;
  std::size_t workspaceSize;
  cublasStatus_t state;  ///< the other fields are valid only when this is CUBLAS_STATUS_SUCCESS
  float wavesCount;
  int reserved[4];
};

// ---- cublasLt.h: enum cublasLtMatmulDescAttributes_t (value types in the comments) --------------
inline constexpr int CUBLASLT_MATMUL_DESC_COMPUTE_TYPE = 0;                // int32_t
inline constexpr int CUBLASLT_MATMUL_DESC_SCALE_TYPE = 1;                  // int32_t (cudaDataType_t)
inline constexpr int CUBLASLT_MATMUL_DESC_POINTER_MODE = 2;                // int32_t
inline constexpr int CUBLASLT_MATMUL_DESC_TRANSA = 3;                      // int32_t (cublasOperation_t)
inline constexpr int CUBLASLT_MATMUL_DESC_TRANSB = 4;                      // int32_t
inline constexpr int CUBLASLT_MATMUL_DESC_EPILOGUE = 7;                    // uint32_t (cublasLtEpilogue_t)
inline constexpr int CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8;                // const void*
inline constexpr int CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE = 10;          // int64_t
inline constexpr int CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 11;       // void* (forward), const void* (backward)
inline constexpr int CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 12;            // int64_t
inline constexpr int CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE = 13;  // int64_t
inline constexpr int CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE = 22;     // int32_t (cudaDataType_t)
inline constexpr int CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26;             // int32_t (cudaDataType_t)

// ---- cublasLt.h: enum cublasLtEpilogue_t ------------------------------------------------------
inline constexpr std::uint32_t CUBLASLT_EPILOGUE_DEFAULT = 1;
inline constexpr std::uint32_t CUBLASLT_EPILOGUE_RELU = 2;
inline constexpr std::uint32_t CUBLASLT_EPILOGUE_BIAS = 4;
inline constexpr std::uint32_t CUBLASLT_EPILOGUE_RELU_BIAS = 6;   // RELU | BIAS
inline constexpr std::uint32_t CUBLASLT_EPILOGUE_GELU = 32;       // tanh approximation
inline constexpr std::uint32_t CUBLASLT_EPILOGUE_GELU_BIAS = 36;  // GELU | BIAS
// Not used yet: the forward forms that also store what the backward pass needs (a ReLU bit
// mask, the GELU input) in the EPILOGUE_AUX buffer, and the backward forms (autodiff).
inline constexpr std::uint32_t CUBLASLT_EPILOGUE_RELU_AUX = 130;       // RELU | 128
inline constexpr std::uint32_t CUBLASLT_EPILOGUE_RELU_AUX_BIAS = 134;  // RELU_AUX | BIAS
inline constexpr std::uint32_t CUBLASLT_EPILOGUE_GELU_AUX = 160;       // GELU | 128
inline constexpr std::uint32_t CUBLASLT_EPILOGUE_GELU_AUX_BIAS = 164;  // GELU_AUX | BIAS
inline constexpr std::uint32_t CUBLASLT_EPILOGUE_DRELU = 136;          // 8 | 128
inline constexpr std::uint32_t CUBLASLT_EPILOGUE_DRELU_BGRAD = 152;    // DRELU | 16
inline constexpr std::uint32_t CUBLASLT_EPILOGUE_DGELU = 192;          // 64 | 128
inline constexpr std::uint32_t CUBLASLT_EPILOGUE_DGELU_BGRAD = 208;    // DGELU | 16
inline constexpr std::uint32_t CUBLASLT_EPILOGUE_BGRADA = 256;
inline constexpr std::uint32_t CUBLASLT_EPILOGUE_BGRADB = 512;

// ---- cublasLt.h: enum cublasLtMatrixLayoutAttribute_t -----------------------------------------
inline constexpr int CUBLASLT_MATRIX_LAYOUT_TYPE = 0;                  // uint32_t (cudaDataType_t)
inline constexpr int CUBLASLT_MATRIX_LAYOUT_ORDER = 1;                 // int32_t, default column-major
inline constexpr int CUBLASLT_MATRIX_LAYOUT_ROWS = 2;                  // uint64_t
inline constexpr int CUBLASLT_MATRIX_LAYOUT_COLS = 3;                  // uint64_t
inline constexpr int CUBLASLT_MATRIX_LAYOUT_LD = 4;                    // int64_t
inline constexpr int CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5;           // int32_t
inline constexpr int CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 6;  // int64_t, in elements

// ---- cublasLt.h: enum cublasLtMatmulPreferenceAttributes_t -------------------------------------
inline constexpr int CUBLASLT_MATMUL_PREF_SEARCH_MODE = 0;            // uint32_t
inline constexpr int CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1;    // uint64_t
inline constexpr int CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5;  // uint32_t, default 256
inline constexpr int CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6;  // uint32_t
inline constexpr int CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7;  // uint32_t
inline constexpr int CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8;  // uint32_t

}  // namespace kiln::runtime::lt

namespace kiln::runtime {

namespace detail {

/// The cuBLASLt entry points kiln uses. Each member's comment names the symbol it is loaded
/// from; the attribute enums of the C API are passed as int (their C ABI).
struct CublasLtApi {
  using Status = lt::cublasStatus_t;
  Status (*create)(lt::cublasLtHandle_t*) = nullptr;  // cublasLtCreate
  Status (*destroy)(lt::cublasLtHandle_t) = nullptr;  // cublasLtDestroy
  std::size_t (*get_version)() = nullptr;             // cublasLtGetVersion
  Status (*matmul_desc_create)(lt::cublasLtMatmulDesc_t*, int compute_type,
                               int scale_type) = nullptr;             // cublasLtMatmulDescCreate
  Status (*matmul_desc_destroy)(lt::cublasLtMatmulDesc_t) = nullptr;  // cublasLtMatmulDescDestroy
  Status (*matmul_desc_set_attribute)(lt::cublasLtMatmulDesc_t, int, const void*,
                                      std::size_t) = nullptr;  // cublasLtMatmulDescSetAttribute
  Status (*matrix_layout_create)(lt::cublasLtMatrixLayout_t*, int type, std::uint64_t rows, std::uint64_t cols,
                                 std::int64_t ld) = nullptr;              // cublasLtMatrixLayoutCreate
  Status (*matrix_layout_destroy)(lt::cublasLtMatrixLayout_t) = nullptr;  // cublasLtMatrixLayoutDestroy
  Status (*matrix_layout_set_attribute)(lt::cublasLtMatrixLayout_t, int, const void*,
                                        std::size_t) = nullptr;                   // cublasLtMatrixLayoutSetAttribute
  Status (*matmul_preference_create)(lt::cublasLtMatmulPreference_t*) = nullptr;  // cublasLtMatmulPreferenceCreate
  Status (*matmul_preference_destroy)(lt::cublasLtMatmulPreference_t) = nullptr;  // cublasLtMatmulPreferenceDestroy
  Status (*matmul_preference_set_attribute)(lt::cublasLtMatmulPreference_t, int, const void*,
                                            std::size_t) = nullptr;  // cublasLtMatmulPreferenceSetAttribute
  Status (*matmul_algo_get_heuristic)(lt::cublasLtHandle_t, lt::cublasLtMatmulDesc_t, lt::cublasLtMatrixLayout_t,
                                      lt::cublasLtMatrixLayout_t, lt::cublasLtMatrixLayout_t,
                                      lt::cublasLtMatrixLayout_t, lt::cublasLtMatmulPreference_t, int requested,
                                      lt::cublasLtMatmulHeuristicResult_t* results,
                                      int* returned) = nullptr;  // cublasLtMatmulAlgoGetHeuristic
  Status (*matmul)(lt::cublasLtHandle_t, lt::cublasLtMatmulDesc_t, const void* alpha, const void* a,
                   lt::cublasLtMatrixLayout_t, const void* b, lt::cublasLtMatrixLayout_t, const void* beta,
                   const void* c, lt::cublasLtMatrixLayout_t, void* d, lt::cublasLtMatrixLayout_t,
                   const lt::cublasLtMatmulAlgo_t*, void* workspace, std::size_t workspace_bytes,
                   cu::CUstream) = nullptr;  // cublasLtMatmul (cudaStream_t is CUstream)
  // Optional: the library's own names and texts of statuses.
  const char* (*get_status_name)(Status) = nullptr;    // cublasLtGetStatusName
  const char* (*get_status_string)(Status) = nullptr;  // cublasLtGetStatusString
};

/// What loading cuBLASLt found: the API table, or why it is unusable.
using CublasLtState = RuntimeLibrary<CublasLtApi>;

/// "13.1.0" from cublasLtGetVersion's 130100.
inline std::string cublaslt_version_text(std::size_t v) { return library_version_text(v); }

/// Loads cuBLASLt from `path` (a file or a name for the loader's search) and resolves every
/// symbol. Never throws: a failure is described in the returned state's `reason`. Creates no
/// handle, so it works without a GPU.
inline CublasLtState load_cublaslt(const std::string& path) {
  CublasLtState s;
  s.path = path;
  const auto t0 = std::chrono::steady_clock::now();
  s.library = open_library(path, s.reason);
  if (!s.library) return s;
  auto& a = s.api;
  SymbolResolver sym(*s.library);
  sym(a.create, "cublasLtCreate");
  sym(a.destroy, "cublasLtDestroy");
  sym(a.get_version, "cublasLtGetVersion");
  sym(a.matmul_desc_create, "cublasLtMatmulDescCreate");
  sym(a.matmul_desc_destroy, "cublasLtMatmulDescDestroy");
  sym(a.matmul_desc_set_attribute, "cublasLtMatmulDescSetAttribute");
  sym(a.matrix_layout_create, "cublasLtMatrixLayoutCreate");
  sym(a.matrix_layout_destroy, "cublasLtMatrixLayoutDestroy");
  sym(a.matrix_layout_set_attribute, "cublasLtMatrixLayoutSetAttribute");
  sym(a.matmul_preference_create, "cublasLtMatmulPreferenceCreate");
  sym(a.matmul_preference_destroy, "cublasLtMatmulPreferenceDestroy");
  sym(a.matmul_preference_set_attribute, "cublasLtMatmulPreferenceSetAttribute");
  sym(a.matmul_algo_get_heuristic, "cublasLtMatmulAlgoGetHeuristic");
  sym(a.matmul, "cublasLtMatmul");
  sym(a.get_status_name, "cublasLtGetStatusName", false);
  sym(a.get_status_string, "cublasLtGetStatusString", false);
  if (const std::string& missing = sym.missing(); !missing.empty()) {
    s.reason = "the library '" + path + "' is not a usable cuBLASLt: it lacks " + missing;
    return s;
  }
  s.version = a.get_version();
  // BIAS_DATA_TYPE and the GELU epilogues, which every plan uses, arrived in cuBLASLt 11.
  if (s.version < 110000) {
    s.reason =
        "the cuBLASLt at '" + path + "' is version " + cublaslt_version_text(s.version) + "; kiln needs 11.0 or newer";
    return s;
  }
  s.load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return s;
}

/// The library names tried in order when KILN_CUBLASLT_PATH is unset.
inline std::vector<std::string> cublaslt_candidates() { return {"libcublasLt.so.13", "libcublasLt.so"}; }

/// What the process-wide loader does: KILN_CUBLASLT_PATH when set (and nothing else: an
/// explicit path that fails is an error, not a reason to pick up some other cuBLASLt), else
/// the candidates in turn. Reads the environment now; the process-wide state calls it once.
inline CublasLtState load_cublaslt_from_env() {
  return load_library_from_env<CublasLtState>(
      "KILN_CUBLASLT_PATH", cublaslt_candidates(), load_cublaslt,
      "cuBLASLt not found (install the CUDA toolkit's libcublasLt or set KILN_CUBLASLT_PATH)");
}

/// The process's cuBLASLt, loaded on first use (thread-safe, once). Never unloaded: the
/// handles and descriptors it gave out live until the process ends.
inline const CublasLtState& cublaslt_state() {
  static const CublasLtState* state = [] {
    auto* s = new CublasLtState(load_cublaslt_from_env());
    log_library_load("cuBLASLt", *s);
    return s;
  }();
  return *state;
}

/// Names of the common statuses, for a library without cublasLtGetStatusName.
inline const char* fallback_cublas_status_name(lt::cublasStatus_t s) {
  switch (s) {
    case lt::CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case lt::CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case lt::CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case lt::CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case lt::CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case lt::CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case lt::CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case lt::CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case lt::CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case lt::CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
    default:
      return nullptr;
  }
}

/// "CUBLAS_STATUS_NOT_SUPPORTED" for a status (ours for the common ones, else the library's).
inline std::string cublas_status_name(const CublasLtApi& api, lt::cublasStatus_t s) {
  if (const char* n = fallback_cublas_status_name(s)) return n;
  if (api.get_status_name)
    if (const char* n = api.get_status_name(s)) return n;
  return "cuBLAS status " + std::to_string(s);
}

/// "kiln: cuBLASLt matmul float32 [64, 32] x [32, 16] -> float32: STATUS (what)".
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_cublaslt_error(const GemmShape& shape, lt::cublasStatus_t s,
                                                                        const std::string& what) {
  throw DeviceError("kiln: cuBLASLt matmul " + shape.str() + ": " + cublas_status_name(cublaslt_state().api, s) + " (" +
                    what + ")");
}

inline void cublaslt_check(lt::cublasStatus_t s, const GemmShape& shape, const char* function, int device) {
  if (s != lt::CUBLAS_STATUS_SUCCESS) [[unlikely]]
    throw_cublaslt_error(shape, s, std::string(function) + " failed on cuda:" + std::to_string(device));
}

/// "kiln: cuBLASLt matmul <shape>: <why>" for errors of the caller's arguments.
template <class E = ValueError>
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_gemm_argument_error(const GemmShape& shape,
                                                                             const std::string& why) {
  throw E("kiln: cuBLASLt matmul " + shape.str() + ": " + why);
}

// ---- the problem as cuBLASLt sees it (pure: no library, no GPU) ---------------------------------

/// One operand in cuBLASLt's terms: the stored column-major matrix and the operation on it.
struct LtOperand {
  std::int32_t op = lt::CUBLAS_OP_N;
  std::uint64_t rows = 0, cols = 0;  ///< of the matrix as stored (before `op`)
  std::int64_t ld = 0;
  std::int64_t batch_stride = 0;
  bool operator==(const LtOperand&) const = default;
};

/// Everything the descriptors of one GemmShape hold. cuBLASLt's A is our B^T (n x k), its B is
/// our A^T (k x m), its D (and C) our D^T (n x m).
struct LtProblem {
  LtOperand a, b, d;
  std::int32_t data_type = lt::CUDA_R_32F;  ///< of A and B
  std::int32_t out_type = lt::CUDA_R_32F;   ///< of C and D
  std::int32_t compute_type = lt::CUBLAS_COMPUTE_32F;
  std::int32_t scale_type = lt::CUDA_R_32F;  ///< of alpha and beta
  std::uint32_t epilogue = lt::CUBLASLT_EPILOGUE_DEFAULT;
  std::int32_t bias_type = -1;  ///< -1: no bias
  std::int64_t aux_ld = 0;      ///< the auxiliary matrix's leading dimension (0: none)
  std::int32_t batch = 1;
};

inline std::int32_t cuda_data_type(DType t) {
  switch (t) {
    case DType::Float32:
      return lt::CUDA_R_32F;
    case DType::Float64:
      return lt::CUDA_R_64F;
    case DType::Float16:
      return lt::CUDA_R_16F;
    case DType::BFloat16:
      return lt::CUDA_R_16BF;
    default:
      return -1;
  }
}

inline std::uint32_t cublaslt_epilogue(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::None:
      return lt::CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::Bias:
      return lt::CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::Relu:
      return lt::CUBLASLT_EPILOGUE_RELU;
    case GemmEpilogue::ReluBias:
      return lt::CUBLASLT_EPILOGUE_RELU_BIAS;
    case GemmEpilogue::Gelu:
      return lt::CUBLASLT_EPILOGUE_GELU;
    case GemmEpilogue::GeluBias:
      return lt::CUBLASLT_EPILOGUE_GELU_BIAS;
    case GemmEpilogue::GeluAux:
      return lt::CUBLASLT_EPILOGUE_GELU_AUX;
    case GemmEpilogue::GeluAuxBias:
      return lt::CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case GemmEpilogue::DGelu:
      return lt::CUBLASLT_EPILOGUE_DGELU;
  }
  return lt::CUBLASLT_EPILOGUE_DEFAULT;
}

/// The transpose of the R x C matrix X (element (i, j) at i * rs + j * cs) as a cuBLASLt
/// operand: a row-major X is the column-major X^T with ld = rs (no operation); a column-major X
/// is itself a column-major matrix with ld = cs, transposed by the operation. A stride along a
/// dimension of size 1 is never used, so either form fits there. False when neither fits (a 0 or
/// overlapping stride: cuBLASLt needs ld >= rows).
inline bool lt_transposed_operand(std::int64_t R, std::int64_t C, std::int64_t rs, std::int64_t cs, LtOperand& out) {
  const auto layout = matrix_layout(R, C, rs, cs);
  if (!layout) return false;
  out.op = layout->transposed ? lt::CUBLAS_OP_T : lt::CUBLAS_OP_N;
  out.rows = static_cast<std::uint64_t>(layout->transposed ? R : C);
  out.cols = static_cast<std::uint64_t>(layout->transposed ? C : R);
  out.ld = layout->ld;
  return true;
}

/// Checks `shape` (m, n, k > 0) against what cuBLASLt can do and translates it. Throws
/// DTypeError for type combinations it does not run, ValueError for sizes and strides.
inline LtProblem lt_problem(const GemmShape& s) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int32_t>::max();
  if (s.m > kMax || s.n > kMax || s.k > kMax || s.batch > kMax)
    throw_gemm_argument_error(s, "sizes and the batch count must fit in int32 for cuBLASLt");
  LtProblem p;
  p.batch = static_cast<std::int32_t>(s.batch);
  p.data_type = cuda_data_type(s.dtype);
  p.out_type = cuda_data_type(s.out_dtype);
  switch (s.dtype) {
    case DType::Float32:
    case DType::Float64:
      if (s.out_dtype != s.dtype)
        throw_gemm_argument_error<DTypeError>(
            s, std::string("the output of a ") + dtype_name(s.dtype) + " product must be " + dtype_name(s.dtype));
      break;
    case DType::Float16:
    case DType::BFloat16:
      if (s.out_dtype != s.dtype && s.out_dtype != DType::Float32)
        throw_gemm_argument_error<DTypeError>(s, std::string("the output of a ") + dtype_name(s.dtype) +
                                                     " product must be " + dtype_name(s.dtype) + " or float32");
      break;
    default:
      throw_gemm_argument_error<DTypeError>(s, std::string("cuBLASLt multiplies float16, bfloat16, float32 and "
                                                           "float64 matrices, not ") +
                                                   dtype_name(s.dtype));
  }
  if (s.dtype == DType::Float64) {
    p.compute_type = lt::CUBLAS_COMPUTE_64F;
    p.scale_type = lt::CUDA_R_64F;
  } else {
    // f16 and bf16 accumulate in f32 (CUBLAS_COMPUTE_16F would accumulate in f16).
    p.compute_type =
        s.dtype == DType::Float32 && s.allow_tf32 ? lt::CUBLAS_COMPUTE_32F_FAST_TF32 : lt::CUBLAS_COMPUTE_32F;
    p.scale_type = lt::CUDA_R_32F;
  }
  p.epilogue = cublaslt_epilogue(s.epilogue);
  if (epilogue_has_bias(s.epilogue)) {
    // cuBLASLt's bias has the type of D (the exceptions are integer and fp8 products).
    if (s.bias_dtype != s.out_dtype)
      throw_gemm_argument_error<DTypeError>(s, std::string("cuBLASLt's bias must have the output's dtype ") +
                                                   dtype_name(s.out_dtype) + ", not " + dtype_name(s.bias_dtype));
    p.bias_type = p.out_type;
  }
  if (epilogue_has_aux(s.epilogue)) {
    // The auxiliary matrix is D's transpose to cuBLASLt as well (n x m, column-major), in D's type.
    if (s.batch != 1)
      throw_gemm_argument_error(
          s, std::string("the ") + epilogue_name(s.epilogue) + " epilogue takes one product, not a batch");
    if (s.aux_rs < s.n || s.aux_rs % 8 != 0)
      throw_gemm_argument_error(s, "the auxiliary matrix's row stride " + std::to_string(s.aux_rs) +
                                       " must cover its " + std::to_string(s.n) + " columns and be a multiple of 8");
    p.aux_ld = s.aux_rs;
  }
  // Our B (k x n) is cuBLASLt's A, our A (m x k) its B.
  if (!lt_transposed_operand(s.k, s.n, s.b_rs, s.b_cs, p.a))
    throw_gemm_argument_error(s, "B's strides (" + std::to_string(s.b_rs) + ", " + std::to_string(s.b_cs) +
                                     ") are neither row-major nor column-major with a leading dimension covering "
                                     "its rows or columns; make it contiguous first");
  if (!lt_transposed_operand(s.m, s.k, s.a_rs, s.a_cs, p.b))
    throw_gemm_argument_error(s, "A's strides (" + std::to_string(s.a_rs) + ", " + std::to_string(s.a_cs) +
                                     ") are neither row-major nor column-major with a leading dimension covering "
                                     "its rows or columns; make it contiguous first");
  p.d.op = lt::CUBLAS_OP_N;
  p.d.rows = static_cast<std::uint64_t>(s.n);
  p.d.cols = static_cast<std::uint64_t>(s.m);
  p.d.ld = s.m == 1 ? s.n : s.d_rs;
  if (p.d.ld < s.n)
    throw_gemm_argument_error(
        s, "D's row stride " + std::to_string(s.d_rs) + " is less than its " + std::to_string(s.n) + " columns");
  if (s.batch > 1) {
    if (s.a_bs < 0 || s.b_bs < 0) throw_gemm_argument_error(s, "negative batch strides are not supported by cuBLASLt");
    // A batch stride of 0 broadcasts A or B (cuBLASLt accepts it for inputs); D's must not be 0:
    // the products of the batch would race on one output.
    if (s.d_bs <= 0)
      throw_gemm_argument_error(
          s, "D's batch stride is " + std::to_string(s.d_bs) + ": each product of the batch needs its own output");
    p.a.batch_stride = s.b_bs;
    p.b.batch_stride = s.a_bs;
    p.d.batch_stride = s.d_bs;
  }
  return p;
}

// ---- handles, workspaces and plans ------------------------------------------------------------

/// 32 MiB, what cuBLASLt recommends for Hopper (4 MiB would do for older GPUs).
inline constexpr std::size_t kCublasLtWorkspaceBytes = std::size_t(32) << 20;

/// One device's cuBLASLt handle and workspace.
struct CublasLtDevice {
  lt::cublasLtHandle_t handle = nullptr;
  StoragePtr workspace;
};

struct CublasLtDevices {
  std::vector<std::once_flag> once;
  std::vector<std::atomic<CublasLtDevice*>> dev;
  explicit CublasLtDevices(int n) : once(static_cast<std::size_t>(n)), dev(static_cast<std::size_t>(n)) {}
};

/// Device `index`'s handle and workspace, made once. Never destroyed (like CudaContext: a
/// cublasLtDestroy or cuMemFreeAsync during static destruction races the driver's teardown).
inline CublasLtDevice& cublaslt_device(const CudaContext& ctx, const GemmShape& shape) {
  static CublasLtDevices* all = new CublasLtDevices(cuda_device_count());
  const auto i = static_cast<std::size_t>(ctx.index);
  if (CublasLtDevice* d = all->dev[i].load(std::memory_order_acquire)) [[likely]]
    return *d;
  std::call_once(all->once[i], [&] {
    const auto& api = cublaslt_state().api;
    const auto t0 = std::chrono::steady_clock::now();
    auto d = std::make_unique<CublasLtDevice>();
    ctx.make_current();
    cublaslt_check(api.create(&d->handle), shape, "cublasLtCreate", ctx.index);
    try {
      d->workspace = allocate_cuda(kCublasLtWorkspaceBytes, ctx.index);
    } catch (...) {
      api.destroy(d->handle);  // the next call tries again
      throw;
    }
    char ms[32];
    std::snprintf(ms, sizeof ms, "%.1f",
                  std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    log(LogChannel::perf, "cuBLASLt handle and " + std::to_string(kCublasLtWorkspaceBytes >> 20) +
                              " MiB workspace on cuda:" + std::to_string(ctx.index) + ": " + ms + " ms");
    all->dev[i].store(d.release(), std::memory_order_release);
  });
  return *all->dev[i].load(std::memory_order_acquire);
}

/// log2 of the largest power of two (up to 256) dividing the address: cuBLASLt's heuristics
/// assume 256-byte aligned operands unless told otherwise, and an algorithm chosen for a better
/// aligned pointer may be invalid for a worse one.
inline std::uint8_t alignment_log2(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  std::uint8_t n = 0;
  while (n < 8 && ((v >> n) & 1u) == 0) ++n;
  return n;
}

/// What a plan is chosen for: the product, the device and the alignment of each pointer.
struct CublasLtKey {
  GemmShape shape;
  int device = 0;
  std::uint8_t align_a = 0, align_b = 0, align_d = 0, align_bias = 0, align_aux = 0;  ///< log2 bytes, capped at 8
  bool operator==(const CublasLtKey&) const = default;
};
struct CublasLtKeyHash {
  std::size_t operator()(const CublasLtKey& k) const {
    using kiln::detail::hash_combine;
    std::uint64_t h = hash_combine(k.shape.hash(), static_cast<std::uint64_t>(k.device));
    return static_cast<std::size_t>(
        hash_combine(h, std::uint64_t(k.align_a) | std::uint64_t(k.align_b) << 8 | std::uint64_t(k.align_d) << 16 |
                            std::uint64_t(k.align_bias) << 24 | std::uint64_t(k.align_aux) << 32));
  }
};

/// One product's descriptors and algorithm. The descriptors are made once; only the bias
/// pointer changes from call to call (set under `mu`, which is held until the product is
/// enqueued, since cublasLtMatmul reads it from the descriptor).
struct CublasLtPlan {
  const CublasLtApi* api = nullptr;
  LtProblem problem;
  lt::cublasLtMatmulDesc_t desc = nullptr;
  lt::cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;  ///< cuBLASLt's A, B and C = D
  lt::cublasLtMatmulAlgo_t algo{};
  const void* bias = nullptr;  ///< the bias pointer `desc` holds
  const void* aux = nullptr;   ///< the auxiliary matrix's pointer `desc` holds
  bool tuned = false;          ///< the algorithm was chosen by timing (cublaslt_autotune)
  std::mutex mu;

  CublasLtPlan() = default;
  CublasLtPlan(const CublasLtPlan&) = delete;
  CublasLtPlan& operator=(const CublasLtPlan&) = delete;
  ~CublasLtPlan() {
    // Only plans that lost a race to the cache are destroyed (the cache itself is never).
    if (!api) return;
    if (a) api->matrix_layout_destroy(a);
    if (b) api->matrix_layout_destroy(b);
    if (d) api->matrix_layout_destroy(d);
    if (desc) api->matmul_desc_destroy(desc);
  }
};

/// The plans of this process. Never destroyed: the descriptors are host memory that goes with
/// the process, and destroying them at exit could run after cuBLASLt's own teardown.
struct CublasLtCache {
  std::mutex mu;
  std::unordered_map<CublasLtKey, std::unique_ptr<CublasLtPlan>, CublasLtKeyHash> plans;
};
inline CublasLtCache& cublaslt_cache() {
  static CublasLtCache* c = new CublasLtCache;
  return *c;
}

/// Counters, for tests and benchmarks: how often the expensive steps ran.
struct CublasLtCounters {
  std::atomic<std::uint64_t> heuristic_queries{0};  ///< cublasLtMatmulAlgoGetHeuristic calls
  std::atomic<std::uint64_t> plans{0};              ///< plans made (cache misses)
  std::atomic<std::uint64_t> matmuls{0};            ///< products enqueued by cublaslt_matmul
  std::atomic<std::uint64_t> autotunes{0};          ///< cublaslt_autotune choices
};
inline CublasLtCounters& cublaslt_counters() {
  static CublasLtCounters c;
  return c;
}

/// Makes the descriptors of `p` (and sets the bias pointer the heuristics look at).
inline void make_plan_descriptors(CublasLtPlan& plan, const GemmShape& shape, int device, const void* bias,
                                  const void* aux) {
  const CublasLtApi& api = *plan.api;
  const LtProblem& p = plan.problem;
  auto check = [&](lt::cublasStatus_t s, const char* fn) { cublaslt_check(s, shape, fn, device); };
  check(api.matmul_desc_create(&plan.desc, p.compute_type, p.scale_type), "cublasLtMatmulDescCreate");
  auto desc_attr = [&](int attr, const auto& value, const char* what) {
    check(api.matmul_desc_set_attribute(plan.desc, attr, &value, sizeof value), what);
  };
  desc_attr(lt::CUBLASLT_MATMUL_DESC_TRANSA, p.a.op, "cublasLtMatmulDescSetAttribute(TRANSA)");
  desc_attr(lt::CUBLASLT_MATMUL_DESC_TRANSB, p.b.op, "cublasLtMatmulDescSetAttribute(TRANSB)");
  desc_attr(lt::CUBLASLT_MATMUL_DESC_EPILOGUE, p.epilogue, "cublasLtMatmulDescSetAttribute(EPILOGUE)");
  if (p.bias_type >= 0) {
    desc_attr(lt::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, p.bias_type, "cublasLtMatmulDescSetAttribute(BIAS_DATA_TYPE)");
    desc_attr(lt::CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
    plan.bias = bias;
    // BIAS_BATCH_STRIDE keeps its default 0: the same n-vector for every product of the batch.
  }
  if (p.aux_ld > 0) {
    desc_attr(lt::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, p.aux_ld, "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_LD)");
    desc_attr(lt::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux,
              "cublasLtMatmulDescSetAttribute(EPILOGUE_AUX_POINTER)");
    plan.aux = aux;
  }
  auto layout = [&](lt::cublasLtMatrixLayout_t& l, const LtOperand& o, std::int32_t type) {
    check(api.matrix_layout_create(&l, type, o.rows, o.cols, o.ld), "cublasLtMatrixLayoutCreate");
    if (p.batch > 1) {
      check(api.matrix_layout_set_attribute(l, lt::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &p.batch, sizeof p.batch),
            "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)");
      check(api.matrix_layout_set_attribute(l, lt::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &o.batch_stride,
                                            sizeof o.batch_stride),
            "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)");
    }
  };
  layout(plan.a, p.a, p.data_type);
  layout(plan.b, p.b, p.data_type);
  layout(plan.d, p.d, p.out_type);
}

/// Up to `count` algorithms for `plan` (best first, each with a successful state), for
/// operands of the key's alignments and at most the workspace kiln keeps.
inline std::vector<lt::cublasLtMatmulHeuristicResult_t> query_algorithms(const CublasLtPlan& plan,
                                                                         const CublasLtDevice& dev,
                                                                         const CublasLtKey& key, int count) {
  const CublasLtApi& api = *plan.api;
  auto check = [&](lt::cublasStatus_t s, const char* fn) { cublaslt_check(s, key.shape, fn, key.device); };
  lt::cublasLtMatmulPreference_t pref = nullptr;
  check(api.matmul_preference_create(&pref), "cublasLtMatmulPreferenceCreate");
  struct Destroy {
    const CublasLtApi& api;
    lt::cublasLtMatmulPreference_t p;
    ~Destroy() { api.matmul_preference_destroy(p); }
  } destroy{api, pref};
  auto pref_attr = [&](int attr, const auto& value) {
    check(api.matmul_preference_set_attribute(pref, attr, &value, sizeof value),
          "cublasLtMatmulPreferenceSetAttribute");
  };
  const std::uint64_t workspace = kCublasLtWorkspaceBytes;
  pref_attr(lt::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace);
  // cuBLASLt's A is our B, its B our A; C is D.
  pref_attr(lt::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, std::uint32_t(1) << key.align_b);
  pref_attr(lt::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, std::uint32_t(1) << key.align_a);
  pref_attr(lt::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, std::uint32_t(1) << key.align_d);
  pref_attr(lt::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, std::uint32_t(1) << key.align_d);

  std::vector<lt::cublasLtMatmulHeuristicResult_t> results(static_cast<std::size_t>(count));
  int returned = 0;
  static std::atomic<bool> first{true};
  const auto t0 = std::chrono::steady_clock::now();
  const lt::cublasStatus_t s = api.matmul_algo_get_heuristic(dev.handle, plan.desc, plan.a, plan.b, plan.d, plan.d,
                                                             pref, count, results.data(), &returned);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  cublaslt_counters().heuristic_queries++;
  if (first.exchange(false)) {
    char text[32];
    std::snprintf(text, sizeof text, "%.2f", ms);
    log(LogChannel::perf, std::string("cuBLASLt first heuristic query (") + key.shape.str() + "): " + text + " ms");
  }
  if (s == lt::CUBLAS_STATUS_NOT_SUPPORTED)
    returned = 0;
  else
    cublaslt_check(s, key.shape, "cublasLtMatmulAlgoGetHeuristic", key.device);
  results.resize(static_cast<std::size_t>(std::max(returned, 0)));
  std::erase_if(results, [](const auto& r) { return r.state != lt::CUBLAS_STATUS_SUCCESS; });
  if (results.empty())
    throw_cublaslt_error(key.shape, lt::CUBLAS_STATUS_NOT_SUPPORTED,
                         "no algorithm fits these types, strides, epilogue and pointer alignments (A " +
                             std::to_string(1u << key.align_a) + ", B " + std::to_string(1u << key.align_b) + ", D " +
                             std::to_string(1u << key.align_d) + " bytes) on cuda:" + std::to_string(key.device));
  return results;
}

/// Everything one call needs: the device, its handle, the plan (made on a miss).
struct CublasLtCall {
  const CublasLtApi* api = nullptr;
  const CudaContext* ctx = nullptr;
  CublasLtDevice* dev = nullptr;
  CublasLtPlan* plan = nullptr;
  CublasLtKey key;
};

/// Checks the arguments and the environment, finds or makes the plan. False when there is
/// nothing to do (an empty product).
inline bool prepare_cublaslt_call(const GemmShape& shape, const void* a, const void* b, void* d, const void* bias,
                                  const void* aux, int device, CublasLtCall& call) {
  if (shape.m < 0 || shape.n < 0 || shape.k < 0 || shape.batch < 0) throw_gemm_argument_error(shape, "negative sizes");
  if (shape.m == 0 || shape.n == 0 || shape.batch == 0) return false;
  if (shape.k == 0)
    throw_gemm_argument_error(shape,
                              "k == 0 is the caller's to handle (D = epilogue(bias), an empty sum); "
                              "cuBLASLt is called only for k > 0");
  if (!a || !b || !d) throw_gemm_argument_error(shape, "null data pointer");
  if (shape.a_from || shape.b_from)
    throw_gemm_argument_error(shape, "cuBLASLt reads A and B in the product's dtype (no cast prologue)");
  if (epilogue_has_bias(shape.epilogue) && !bias)
    throw_gemm_argument_error(shape,
                              std::string("the ") + epilogue_name(shape.epilogue) + " epilogue needs a bias pointer");
  if (epilogue_has_aux(shape.epilogue) && !aux)
    throw_gemm_argument_error(
        shape, std::string("the ") + epilogue_name(shape.epilogue) + " epilogue needs an auxiliary matrix's pointer");
  const CublasLtState& st = cublaslt_state();
  if (!st.ok()) [[unlikely]]
    throw DeviceError("kiln: cuBLASLt matmul " + shape.str() + ": cuBLASLt is unavailable: " + st.reason);
  require_cuda_driver([&] { return "run cuBLASLt matmul " + shape.str() + " on cuda:" + std::to_string(device); });
  try {
    call.ctx = &cuda_context(device);
  } catch (const DeviceError& e) {
    std::string why = e.what();
    if (why.rfind("kiln: ", 0) == 0) why.erase(0, 6);
    throw DeviceError("kiln: cuBLASLt matmul " + shape.str() + ": " + why);
  }
  call.api = &st.api;
  call.dev = &cublaslt_device(*call.ctx, shape);
  call.key.shape = shape;
  call.key.device = device;
  call.key.align_a = alignment_log2(a);
  call.key.align_b = alignment_log2(b);
  call.key.align_d = alignment_log2(d);
  call.key.align_bias = epilogue_has_bias(shape.epilogue) ? alignment_log2(bias) : 0;
  call.key.align_aux = epilogue_has_aux(shape.epilogue) ? alignment_log2(aux) : 0;

  CublasLtCache& cache = cublaslt_cache();
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    auto it = cache.plans.find(call.key);
    if (it != cache.plans.end()) [[likely]] {
      call.plan = it->second.get();
      return true;
    }
  }
  // A miss: made outside the cache's lock (the heuristic query takes tens of microseconds to
  // milliseconds); of two threads making the same plan, the first to insert wins.
  auto plan = std::make_unique<CublasLtPlan>();
  plan->api = &st.api;
  plan->problem = lt_problem(shape);
  call.ctx->make_current();
  make_plan_descriptors(*plan, shape, device, bias, aux);
  plan->algo = query_algorithms(*plan, *call.dev, call.key, 1).front().algo;
  cublaslt_counters().plans++;
  std::lock_guard<std::mutex> lock(cache.mu);
  auto [it, inserted] = cache.plans.try_emplace(call.key, std::move(plan));
  call.plan = it->second.get();
  if (inserted && log_enabled(LogChannel::cache))
    log(LogChannel::cache, "cuBLASLt plan " + shape.str() + " on cuda:" + std::to_string(device) + " (" +
                               std::to_string(cache.plans.size()) + " plans)");
  return true;
}

/// Enqueues the plan's product with `algo` on `stream` (null: kiln's stream of the device);
/// the caller holds plan.mu.
inline lt::cublasStatus_t enqueue_cublaslt(const CublasLtCall& call, const lt::cublasLtMatmulAlgo_t& algo,
                                           const void* a, const void* b, void* d, const void* bias, const void* aux,
                                           cu::CUstream stream = nullptr) {
  CublasLtPlan& plan = *call.plan;
  // The descriptor holds the bias's and the auxiliary matrix's pointers: set where they moved.
  auto point = [&](bool used, int attribute, const void*& held, const void* want) {
    if (!used || held == want) return lt::CUBLAS_STATUS_SUCCESS;
    lt::cublasStatus_t s = call.api->matmul_desc_set_attribute(plan.desc, attribute, &want, sizeof want);
    if (s == lt::CUBLAS_STATUS_SUCCESS) held = want;
    return s;
  };
  if (lt::cublasStatus_t s = point(plan.problem.bias_type >= 0, lt::CUBLASLT_MATMUL_DESC_BIAS_POINTER, plan.bias, bias);
      s != lt::CUBLAS_STATUS_SUCCESS)
    return s;
  if (lt::cublasStatus_t s =
          point(plan.problem.aux_ld > 0, lt::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, plan.aux, aux);
      s != lt::CUBLAS_STATUS_SUCCESS)
    return s;
  // alpha = 1, beta = 0 in the scale type (read at the call: host pointer mode); C is D,
  // never read since beta is 0.
  const double one_d = 1.0, zero_d = 0.0;
  const float one_f = 1.0f, zero_f = 0.0f;
  const bool f64 = plan.problem.scale_type == lt::CUDA_R_64F;
  const void* alpha = f64 ? static_cast<const void*>(&one_d) : static_cast<const void*>(&one_f);
  const void* beta = f64 ? static_cast<const void*>(&zero_d) : static_cast<const void*>(&zero_f);
  // Swapped operands: cuBLASLt's A is our B.
  return call.api->matmul(call.dev->handle, plan.desc, alpha, b, plan.a, a, plan.b, beta, d, plan.d, d, plan.d, &algo,
                          call.dev->workspace->data, kCublasLtWorkspaceBytes, stream ? stream : call.ctx->stream);
}

}  // namespace detail

/// Whether libcublasLt could be loaded (KILN_CUBLASLT_PATH, else "libcublasLt.so.13", then
/// "libcublasLt.so"); never throws. Loads it on first use (once per process).
inline bool cublaslt_available() {
  try {
    return detail::cublaslt_state().ok();
  } catch (...) {
    return false;
  }
}

/// Why cuBLASLt is not available ("" when it is).
inline std::string cublaslt_unavailable_reason() { return detail::cublaslt_state().reason; }

/// D = epilogue(A @ B + bias) on cuda:`device`, queued on kiln's stream of that device
/// (asynchronous). The first call for a (device, shape, pointer alignments) makes its
/// descriptors and asks cuBLASLt's heuristics for an algorithm; later calls only enqueue.
/// Empty products (m, n or batch 0) do nothing. k == 0 is the caller's to handle (D =
/// epilogue(bias)): it throws ValueError. A batch stride of 0 broadcasts A or B; D's must not be
/// 0 when batch > 1. The bias has the output's dtype (DTypeError otherwise).
/// Throws DeviceError naming the product (shape.str()) and the cuBLASLt status when the library
/// is absent, no algorithm fits, or a call fails.
/// `stream`: where to queue the product instead of kiln's stream (a CUDA graph's capture
/// stream). The device's one workspace is shared by every product queued there, so the work
/// on `stream` must be ordered with kiln's stream (a captured graph is replayed on it).
inline void cublaslt_matmul(const GemmShape& shape, const void* a, const void* b, void* d, const void* bias, int device,
                            cu::CUstream stream = nullptr, const void* aux = nullptr) {
  detail::CublasLtCall call;
  if (!detail::prepare_cublaslt_call(shape, a, b, d, bias, aux, device, call)) return;
  call.ctx->make_current();
  lt::cublasStatus_t s;
  {
    std::lock_guard<std::mutex> lock(call.plan->mu);
    s = detail::enqueue_cublaslt(call, call.plan->algo, a, b, d, bias, aux, stream);
  }
  detail::cublaslt_check(s, shape, "cublasLtMatmul", device);
  detail::cublaslt_counters().matmuls++;
}

/// max-autotune: times the top heuristic candidates (up to 8) for `shape` on the given buffers
/// (which it may overwrite: d), keeps the fastest for this shape in the in-memory algorithm
/// cache and in the disk cache (a later process loads it instead of timing: it then runs the
/// product once and returns 0), and returns the time of the best in ms. Synchronous (waits for
/// the timed runs). A product already tuned in this process runs once with its choice and returns 0.
/// Empty products return 0; otherwise it throws as cublaslt_matmul does.
inline double cublaslt_autotune(const GemmShape& shape, const void* a, const void* b, void* d, const void* bias,
                                int device, const void* aux = nullptr) {
  detail::CublasLtCall call;
  if (!detail::prepare_cublaslt_call(shape, a, b, d, bias, aux, device, call)) return 0.0;
  const CudaContext& ctx = *call.ctx;
  ctx.make_current();
  std::lock_guard<std::mutex> lock(call.plan->mu);
  if (call.plan->tuned) {  // chosen already in this process: just the product
    detail::cublaslt_check(detail::enqueue_cublaslt(call, call.plan->algo, a, b, d, bias, aux), shape, "cublasLtMatmul",
                           device);
    return 0.0;
  }
  // The choice is stored in the disk cache under the product, the device, the pointer
  // alignments and the library's version (an algorithm is only valid where it was chosen).
  const std::string tuning_key =
      "cublaslt|" + ctx.name + "|" + ctx.arch() + "|" + std::to_string(detail::cublaslt_state().version) + "|" +
      shape.str() + "|" + std::to_string(shape.hash()) + "|" + std::to_string(call.key.align_a) + "," +
      std::to_string(call.key.align_b) + "," + std::to_string(call.key.align_d) + "," +
      std::to_string(call.key.align_bias) + (aux ? "," + std::to_string(call.key.align_aux) : std::string());
  if (auto stored = load_tuning(tuning_key); stored && stored->size() == 2 * sizeof(lt::cublasLtMatmulAlgo_t)) {
    lt::cublasLtMatmulAlgo_t algo{};
    auto* bytes = reinterpret_cast<unsigned char*>(&algo);
    for (std::size_t i = 0; i < sizeof algo; ++i)
      bytes[i] = static_cast<unsigned char>(std::stoi(stored->substr(2 * i, 2), nullptr, 16));
    // A stored algorithm that no longer runs (a damaged entry) is timed again below.
    if (detail::enqueue_cublaslt(call, algo, a, b, d, bias, aux) == lt::CUBLAS_STATUS_SUCCESS) {
      call.plan->algo = algo;
      call.plan->tuned = true;
      return 0.0;
    }
  }
  const auto candidates = detail::query_algorithms(*call.plan, *call.dev, call.key, 8);
  CudaEvent start(ctx), stop(ctx);
  double best_ms = -1, first_ms = -1;
  std::size_t best = 0;
  lt::cublasStatus_t last_failure = lt::CUBLAS_STATUS_SUCCESS;
  for (std::size_t c = 0; c < candidates.size(); ++c) {
    const auto& algo = candidates[c].algo;
    auto run = [&](int reps) {
      for (int r = 0; r < reps; ++r)
        if (lt::cublasStatus_t s = detail::enqueue_cublaslt(call, algo, a, b, d, bias, aux);
            s != lt::CUBLAS_STATUS_SUCCESS)
          return s;
      return lt::CUBLAS_STATUS_SUCCESS;
    };
    // A warm-up run, a timed run to size the batch, then ~2 ms (3 to 100 runs) timed together.
    lt::cublasStatus_t s = run(1);
    if (s == lt::CUBLAS_STATUS_SUCCESS) {
      start.record();
      s = run(1);
      stop.record();
    }
    if (s != lt::CUBLAS_STATUS_SUCCESS) {
      // This candidate does not run here (cuBLASLt's heuristics can offer ones that do not).
      last_failure = s;
      continue;
    }
    stop.synchronize();
    const double once = std::max<double>(stop.elapsed_ms_since(start), 1e-3);
    const int reps = static_cast<int>(std::clamp(2.0 / once, 3.0, 100.0));
    start.record();
    s = run(reps);
    stop.record();
    if (s != lt::CUBLAS_STATUS_SUCCESS) {
      last_failure = s;
      continue;
    }
    stop.synchronize();
    const double ms = static_cast<double>(stop.elapsed_ms_since(start)) / static_cast<double>(reps);
    if (c == 0) first_ms = ms;
    if (best_ms < 0 || ms < best_ms) {
      best_ms = ms;
      best = c;
    }
  }
  if (best_ms < 0)
    detail::throw_cublaslt_error(shape, last_failure,
                                 "autotune: none of the " + std::to_string(candidates.size()) +
                                     " candidate algorithms ran on cuda:" + std::to_string(device));
  call.plan->algo = candidates[best].algo;
  call.plan->tuned = true;
  {
    std::string hex;
    const auto* bytes = reinterpret_cast<const unsigned char*>(&call.plan->algo);
    static const char* digits = "0123456789abcdef";
    for (std::size_t i = 0; i < sizeof call.plan->algo; ++i) {
      hex.push_back(digits[bytes[i] >> 4]);
      hex.push_back(digits[bytes[i] & 15]);
    }
    store_tuning(tuning_key, hex);
  }
  detail::cublaslt_counters().autotunes++;
  if (log_enabled(LogChannel::perf)) {
    char text[96];
    std::snprintf(text, sizeof text, ": best of %zu candidates is #%zu, %.4f ms (heuristic's first: %.4f ms)",
                  candidates.size(), best, best_ms, first_ms);
    log(LogChannel::perf, "cuBLASLt autotune " + shape.str() + " on cuda:" + std::to_string(device) + text);
  }
  return best_ms;
}

}  // namespace kiln::runtime
