// cuBLASLt loaded at run time. The first cases run anywhere (no GPU needed): loading, refusing
// wrong libraries, the translation of a GemmShape into cuBLASLt's terms, argument errors. The
// GPU cases return early with a message where CUDA or cuBLASLt is unavailable, and compare every
// product against a host loop in double on the GPU machine.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kiln/core/half.hpp"
#include "kiln/runtime/cublaslt.hpp"
#include "kiln/runtime/cuda_driver.hpp"
#include "kiln/runtime/cuda_memory.hpp"
#include "runtime_test_util.hpp"

#if __has_include(<cublasLt.h>)
#include <cublasLt.h>

#include <cstddef>
#include <type_traits>

// Our declarations must match the library's ABI: the values, the layouts of the structs kiln
// reads or copies, and (up to the opaque and enum types, which are passed as pointers and int)
// the shape of every entry point.
namespace kiln_cublaslt_abi {
namespace lt = kiln::runtime::lt;
using Api = kiln::runtime::detail::CublasLtApi;

template <class T>
constexpr int abi_kind() {
  if constexpr (std::is_pointer_v<T>)
    return 1;
  else if constexpr (std::is_integral_v<T> || std::is_enum_v<T>)
    return 2;
  else if constexpr (std::is_floating_point_v<T>)
    return 3;
  else
    return 0;
}
template <class A, class B>
constexpr bool same_abi = sizeof(A) == sizeof(B) && abi_kind<A>() == abi_kind<B>() && abi_kind<A>() != 0;
template <class F, class G>
struct SameAbi : std::false_type {};
template <class R1, class... A1, class R2, class... A2>
struct SameAbi<R1 (*)(A1...), R2 (*)(A2...)> {
  static constexpr bool value = [] {
    if constexpr (sizeof...(A1) != sizeof...(A2))
      return false;
    else
      return same_abi<R1, R2> && (same_abi<A1, A2> && ...);
  }();
};
#define KILN_CHECK_ABI(member, symbol)                                              \
  static_assert(SameAbi<decltype(Api::member), decltype(&::symbol)>::value, #symbol \
                " "                                                                 \
                "does not match")
KILN_CHECK_ABI(create, cublasLtCreate);
KILN_CHECK_ABI(destroy, cublasLtDestroy);
KILN_CHECK_ABI(get_version, cublasLtGetVersion);
KILN_CHECK_ABI(matmul_desc_create, cublasLtMatmulDescCreate);
KILN_CHECK_ABI(matmul_desc_destroy, cublasLtMatmulDescDestroy);
KILN_CHECK_ABI(matmul_desc_set_attribute, cublasLtMatmulDescSetAttribute);
KILN_CHECK_ABI(matrix_layout_create, cublasLtMatrixLayoutCreate);
KILN_CHECK_ABI(matrix_layout_destroy, cublasLtMatrixLayoutDestroy);
KILN_CHECK_ABI(matrix_layout_set_attribute, cublasLtMatrixLayoutSetAttribute);
KILN_CHECK_ABI(matmul_preference_create, cublasLtMatmulPreferenceCreate);
KILN_CHECK_ABI(matmul_preference_destroy, cublasLtMatmulPreferenceDestroy);
KILN_CHECK_ABI(matmul_preference_set_attribute, cublasLtMatmulPreferenceSetAttribute);
KILN_CHECK_ABI(matmul_algo_get_heuristic, cublasLtMatmulAlgoGetHeuristic);
KILN_CHECK_ABI(matmul, cublasLtMatmul);
KILN_CHECK_ABI(get_status_name, cublasLtGetStatusName);
KILN_CHECK_ABI(get_status_string, cublasLtGetStatusString);
#undef KILN_CHECK_ABI

static_assert(sizeof(lt::cublasLtMatmulAlgo_t) == sizeof(::cublasLtMatmulAlgo_t));
static_assert(sizeof(lt::cublasLtMatmulDescOpaque_t) == sizeof(::cublasLtMatmulDescOpaque_t));
static_assert(sizeof(lt::cublasLtMatrixLayoutOpaque_t) == sizeof(::cublasLtMatrixLayoutOpaque_t));
static_assert(sizeof(lt::cublasLtMatmulPreferenceOpaque_t) == sizeof(::cublasLtMatmulPreferenceOpaque_t));
static_assert(sizeof(lt::cublasLtMatmulHeuristicResult_t) == sizeof(::cublasLtMatmulHeuristicResult_t));
static_assert(offsetof(lt::cublasLtMatmulHeuristicResult_t, workspaceSize) ==
              offsetof(::cublasLtMatmulHeuristicResult_t, workspaceSize));
static_assert(offsetof(lt::cublasLtMatmulHeuristicResult_t, state) ==
              offsetof(::cublasLtMatmulHeuristicResult_t, state));
static_assert(offsetof(lt::cublasLtMatmulHeuristicResult_t, wavesCount) ==
              offsetof(::cublasLtMatmulHeuristicResult_t, wavesCount));

static_assert(lt::CUBLAS_STATUS_SUCCESS == CUBLAS_STATUS_SUCCESS);
static_assert(lt::CUBLAS_STATUS_NOT_INITIALIZED == CUBLAS_STATUS_NOT_INITIALIZED);
static_assert(lt::CUBLAS_STATUS_ALLOC_FAILED == CUBLAS_STATUS_ALLOC_FAILED);
static_assert(lt::CUBLAS_STATUS_INVALID_VALUE == CUBLAS_STATUS_INVALID_VALUE);
static_assert(lt::CUBLAS_STATUS_ARCH_MISMATCH == CUBLAS_STATUS_ARCH_MISMATCH);
static_assert(lt::CUBLAS_STATUS_MAPPING_ERROR == CUBLAS_STATUS_MAPPING_ERROR);
static_assert(lt::CUBLAS_STATUS_EXECUTION_FAILED == CUBLAS_STATUS_EXECUTION_FAILED);
static_assert(lt::CUBLAS_STATUS_INTERNAL_ERROR == CUBLAS_STATUS_INTERNAL_ERROR);
static_assert(lt::CUBLAS_STATUS_NOT_SUPPORTED == CUBLAS_STATUS_NOT_SUPPORTED);
static_assert(lt::CUBLAS_STATUS_LICENSE_ERROR == CUBLAS_STATUS_LICENSE_ERROR);
static_assert(lt::CUBLAS_OP_N == CUBLAS_OP_N && lt::CUBLAS_OP_T == CUBLAS_OP_T);
static_assert(lt::CUBLAS_COMPUTE_32F == CUBLAS_COMPUTE_32F);
static_assert(lt::CUBLAS_COMPUTE_32F_FAST_TF32 == CUBLAS_COMPUTE_32F_FAST_TF32);
static_assert(lt::CUBLAS_COMPUTE_64F == CUBLAS_COMPUTE_64F);
static_assert(lt::CUDA_R_32F == CUDA_R_32F && lt::CUDA_R_64F == CUDA_R_64F);
static_assert(lt::CUDA_R_16F == CUDA_R_16F && lt::CUDA_R_16BF == CUDA_R_16BF);
static_assert(lt::CUBLASLT_MATMUL_DESC_COMPUTE_TYPE == CUBLASLT_MATMUL_DESC_COMPUTE_TYPE);
static_assert(lt::CUBLASLT_MATMUL_DESC_SCALE_TYPE == CUBLASLT_MATMUL_DESC_SCALE_TYPE);
static_assert(lt::CUBLASLT_MATMUL_DESC_POINTER_MODE == CUBLASLT_MATMUL_DESC_POINTER_MODE);
static_assert(lt::CUBLASLT_MATMUL_DESC_TRANSA == CUBLASLT_MATMUL_DESC_TRANSA);
static_assert(lt::CUBLASLT_MATMUL_DESC_TRANSB == CUBLASLT_MATMUL_DESC_TRANSB);
static_assert(lt::CUBLASLT_MATMUL_DESC_EPILOGUE == CUBLASLT_MATMUL_DESC_EPILOGUE);
static_assert(lt::CUBLASLT_MATMUL_DESC_BIAS_POINTER == CUBLASLT_MATMUL_DESC_BIAS_POINTER);
static_assert(lt::CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE == CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE);
static_assert(lt::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER);
static_assert(lt::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD);
static_assert(lt::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE);
static_assert(lt::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE);
static_assert(lt::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE == CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE);
static_assert(lt::CUBLASLT_EPILOGUE_DEFAULT == CUBLASLT_EPILOGUE_DEFAULT);
static_assert(lt::CUBLASLT_EPILOGUE_RELU == CUBLASLT_EPILOGUE_RELU);
static_assert(lt::CUBLASLT_EPILOGUE_BIAS == CUBLASLT_EPILOGUE_BIAS);
static_assert(lt::CUBLASLT_EPILOGUE_RELU_BIAS == CUBLASLT_EPILOGUE_RELU_BIAS);
static_assert(lt::CUBLASLT_EPILOGUE_GELU == CUBLASLT_EPILOGUE_GELU);
static_assert(lt::CUBLASLT_EPILOGUE_GELU_BIAS == CUBLASLT_EPILOGUE_GELU_BIAS);
static_assert(lt::CUBLASLT_EPILOGUE_RELU_AUX == CUBLASLT_EPILOGUE_RELU_AUX);
static_assert(lt::CUBLASLT_EPILOGUE_RELU_AUX_BIAS == CUBLASLT_EPILOGUE_RELU_AUX_BIAS);
static_assert(lt::CUBLASLT_EPILOGUE_GELU_AUX == CUBLASLT_EPILOGUE_GELU_AUX);
static_assert(lt::CUBLASLT_EPILOGUE_GELU_AUX_BIAS == CUBLASLT_EPILOGUE_GELU_AUX_BIAS);
static_assert(lt::CUBLASLT_EPILOGUE_DRELU == CUBLASLT_EPILOGUE_DRELU);
static_assert(lt::CUBLASLT_EPILOGUE_DRELU_BGRAD == CUBLASLT_EPILOGUE_DRELU_BGRAD);
static_assert(lt::CUBLASLT_EPILOGUE_DGELU == CUBLASLT_EPILOGUE_DGELU);
static_assert(lt::CUBLASLT_EPILOGUE_DGELU_BGRAD == CUBLASLT_EPILOGUE_DGELU_BGRAD);
static_assert(lt::CUBLASLT_EPILOGUE_BGRADA == CUBLASLT_EPILOGUE_BGRADA);
static_assert(lt::CUBLASLT_EPILOGUE_BGRADB == CUBLASLT_EPILOGUE_BGRADB);
static_assert(lt::CUBLASLT_MATRIX_LAYOUT_TYPE == CUBLASLT_MATRIX_LAYOUT_TYPE);
static_assert(lt::CUBLASLT_MATRIX_LAYOUT_ORDER == CUBLASLT_MATRIX_LAYOUT_ORDER);
static_assert(lt::CUBLASLT_MATRIX_LAYOUT_ROWS == CUBLASLT_MATRIX_LAYOUT_ROWS);
static_assert(lt::CUBLASLT_MATRIX_LAYOUT_COLS == CUBLASLT_MATRIX_LAYOUT_COLS);
static_assert(lt::CUBLASLT_MATRIX_LAYOUT_LD == CUBLASLT_MATRIX_LAYOUT_LD);
static_assert(lt::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT);
static_assert(lt::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET);
static_assert(lt::CUBLASLT_MATMUL_PREF_SEARCH_MODE == CUBLASLT_MATMUL_PREF_SEARCH_MODE);
static_assert(lt::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES);
static_assert(lt::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES);
static_assert(lt::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES);
static_assert(lt::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES);
static_assert(lt::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES);
}  // namespace kiln_cublaslt_abi
#define KILN_TEST_CUBLASLT_ABI_CHECKED 1
#endif

namespace {

namespace rt = kiln::runtime;
using kiln::DType;
using rt::GemmEpilogue;
using rt::GemmShape;

constexpr const char* kToolkitCublasLt = "/usr/local/cuda/lib64/libcublasLt.so.13";

/// A row-major m x k by k x n product, contiguous, batch 1.
GemmShape contiguous_shape(DType t, std::int64_t m, std::int64_t n, std::int64_t k) {
  GemmShape s;
  s.dtype = s.out_dtype = s.bias_dtype = t;
  s.m = m, s.n = n, s.k = k;
  s.a_rs = k, s.a_cs = 1;
  s.b_rs = n, s.b_cs = 1;
  s.d_rs = n;
  return s;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(no exception)";
}

}  // namespace

// ---- anywhere ---------------------------------------------------------------------------------

TEST_CASE("cublaslt: KILN_CUBLASLT_PATH naming a missing file makes cuBLASLt unavailable, naming it") {
  // The process-wide state is loaded first, with the environment as the test run has it.
  const bool available = rt::cublaslt_available();
  CHECK(available == rt::cublaslt_unavailable_reason().empty());
  if (!available) MESSAGE("cuBLASLt unavailable here: " << rt::cublaslt_unavailable_reason());
  const std::string path = "/nonexistent/kiln/libcublasLt.so.13";
  kiln_test::ScopedEnv env("KILN_CUBLASLT_PATH", path);
  // What cublaslt_available() does on first use, with the setting as it is now (the
  // process-wide state is fixed by whichever test loaded it first).
  auto state = rt::detail::load_cublaslt_from_env();
  CHECK_FALSE(state.ok());
  CHECK(contains(state.reason, path));
  CHECK(contains(state.reason, "KILN_CUBLASLT_PATH"));
  auto direct = rt::detail::load_cublaslt(path);
  CHECK_FALSE(direct.ok());
  CHECK(contains(direct.reason, path));
  CHECK(contains(direct.reason, "No such file"));
  // Loaded once: the setting made after the first use changes nothing.
  CHECK(rt::cublaslt_available() == available);
}

TEST_CASE("cublaslt: the default search tries libcublasLt.so.13, then libcublasLt.so") {
  auto names = rt::detail::cublaslt_candidates();
  REQUIRE(names.size() == 2);
  CHECK(names[0] == "libcublasLt.so.13");
  CHECK(names[1] == "libcublasLt.so");
}

TEST_CASE("cublaslt: a library without cuBLASLt's symbols is refused, naming them") {
  auto state = rt::detail::load_cublaslt("libm.so.6");
  CHECK_FALSE(state.ok());
  CHECK(contains(state.reason, "libm.so.6"));
  CHECK(contains(state.reason, "cublasLtMatmul"));
  CHECK(contains(state.reason, "cublasLtMatmulAlgoGetHeuristic"));
}

TEST_CASE("cublaslt: the toolkit's libcublasLt resolves every symbol (no GPU needed)") {
#if KILN_TEST_CUBLASLT_ABI_CHECKED
  MESSAGE("declarations checked against <cublasLt.h>");
#endif
  if (!kiln_test::file_exists(kToolkitCublasLt)) {
    MESSAGE("no " << kToolkitCublasLt << "; symbol resolution not checked");
    return;
  }
  auto state = rt::detail::load_cublaslt(kToolkitCublasLt);
  INFO(state.reason);
  REQUIRE(state.ok());
  const auto& a = state.api;
  CHECK(bool(a.create));
  CHECK(bool(a.destroy));
  CHECK(bool(a.get_version));
  CHECK(bool(a.matmul_desc_create));
  CHECK(bool(a.matmul_desc_destroy));
  CHECK(bool(a.matmul_desc_set_attribute));
  CHECK(bool(a.matrix_layout_create));
  CHECK(bool(a.matrix_layout_destroy));
  CHECK(bool(a.matrix_layout_set_attribute));
  CHECK(bool(a.matmul_preference_create));
  CHECK(bool(a.matmul_preference_destroy));
  CHECK(bool(a.matmul_preference_set_attribute));
  CHECK(bool(a.matmul_algo_get_heuristic));
  CHECK(bool(a.matmul));
  CHECK(bool(a.get_status_name));
  CHECK(bool(a.get_status_string));
  CHECK(state.version >= 130000);  // the .so.13 of CUDA 13
  MESSAGE("cuBLASLt " << rt::detail::cublaslt_version_text(state.version) << " loaded in " << state.load_ms << " ms");
  // The library's status names are ours (these calls need no GPU).
  CHECK(std::string(a.get_status_name(rt::lt::CUBLAS_STATUS_NOT_SUPPORTED)) == "CUBLAS_STATUS_NOT_SUPPORTED");
  CHECK(std::string(a.get_status_name(rt::lt::CUBLAS_STATUS_INVALID_VALUE)) == "CUBLAS_STATUS_INVALID_VALUE");
  // Descriptors are host objects: making one needs no GPU either.
  rt::lt::cublasLtMatrixLayout_t layout = nullptr;
  CHECK(a.matrix_layout_create(&layout, rt::lt::CUDA_R_16BF, 64, 32, 64) == rt::lt::CUBLAS_STATUS_SUCCESS);
  const std::int32_t batch = 3;
  CHECK(a.matrix_layout_set_attribute(layout, rt::lt::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch) ==
        rt::lt::CUBLAS_STATUS_SUCCESS);
  const std::int64_t zero = 0;  // a broadcast operand
  CHECK(a.matrix_layout_set_attribute(layout, rt::lt::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &zero,
                                      sizeof zero) == rt::lt::CUBLAS_STATUS_SUCCESS);
  CHECK(a.matrix_layout_destroy(layout) == rt::lt::CUBLAS_STATUS_SUCCESS);
  rt::lt::cublasLtMatmulDesc_t desc = nullptr;
  CHECK(a.matmul_desc_create(&desc, rt::lt::CUBLAS_COMPUTE_32F, rt::lt::CUDA_R_32F) == rt::lt::CUBLAS_STATUS_SUCCESS);
  CHECK(a.matmul_desc_set_attribute(desc, rt::lt::CUBLASLT_MATMUL_DESC_EPILOGUE, &rt::lt::CUBLASLT_EPILOGUE_GELU_BIAS,
                                    sizeof(std::uint32_t)) == rt::lt::CUBLAS_STATUS_SUCCESS);
  CHECK(a.matmul_desc_destroy(desc) == rt::lt::CUBLAS_STATUS_SUCCESS);
}

TEST_CASE("cublaslt: status names and versions without a library") {
  rt::detail::CublasLtApi none;
  CHECK(rt::detail::cublas_status_name(none, 15) == "CUBLAS_STATUS_NOT_SUPPORTED");
  CHECK(rt::detail::cublas_status_name(none, 13) == "CUBLAS_STATUS_EXECUTION_FAILED");
  CHECK(rt::detail::cublas_status_name(none, 12345) == "cuBLAS status 12345");
  CHECK(rt::detail::cublaslt_version_text(130100) == "13.1.0");
  CHECK(rt::detail::cublaslt_version_text(120402) == "12.4.2");
}

TEST_CASE("cublaslt: row-major products through the operand swap (cuBLASLt's A is our B^T)") {
  using rt::lt::CUBLAS_OP_N;
  using rt::lt::CUBLAS_OP_T;
  // float32 [64, 32] x [32, 16], both row-major.
  GemmShape s = contiguous_shape(DType::Float32, 64, 16, 32);
  auto p = rt::detail::lt_problem(s);
  CHECK(p.a == rt::detail::LtOperand{CUBLAS_OP_N, 16, 32, 16, 0});  // B^T: n x k, ld = B's row stride
  CHECK(p.b == rt::detail::LtOperand{CUBLAS_OP_N, 32, 64, 32, 0});  // A^T: k x m, ld = A's row stride
  CHECK(p.d == rt::detail::LtOperand{CUBLAS_OP_N, 16, 64, 16, 0});  // D^T: n x m
  CHECK(p.compute_type == rt::lt::CUBLAS_COMPUTE_32F);
  CHECK(p.scale_type == rt::lt::CUDA_R_32F);
  CHECK(p.epilogue == rt::lt::CUBLASLT_EPILOGUE_DEFAULT);
  CHECK(p.bias_type == -1);
  CHECK(p.batch == 1);

  // Column-major A (a_rs == 1) and B (b_rs == 1), padded leading dimensions, batch 3 with a
  // broadcast B.
  s.a_rs = 1, s.a_cs = 70, s.a_bs = 70 * 32;
  s.b_rs = 1, s.b_cs = 40, s.b_bs = 0;
  s.d_rs = 20, s.d_bs = 64 * 20;
  s.batch = 3;
  p = rt::detail::lt_problem(s);
  CHECK(p.a == rt::detail::LtOperand{CUBLAS_OP_T, 32, 16, 40, 0});        // B stored k x n, ld = b_cs
  CHECK(p.b == rt::detail::LtOperand{CUBLAS_OP_T, 64, 32, 70, 70 * 32});  // A stored m x k, ld = a_cs
  CHECK(p.d == rt::detail::LtOperand{CUBLAS_OP_N, 16, 64, 20, 64 * 20});
  CHECK(p.batch == 3);

  // A single row: its row stride is never used.
  GemmShape row = contiguous_shape(DType::Float32, 1, 16, 32);
  row.a_rs = 0;
  row.d_rs = 0;
  p = rt::detail::lt_problem(row);
  CHECK(p.b == rt::detail::LtOperand{CUBLAS_OP_N, 32, 1, 32, 0});
  CHECK(p.d.ld == 16);
  // k == 1 (an outer product) with both strides 1: unused strides do not matter.
  GemmShape outer = contiguous_shape(DType::Float32, 8, 4, 1);
  outer.a_rs = 1, outer.a_cs = 1;
  outer.b_rs = 1, outer.b_cs = 1;
  p = rt::detail::lt_problem(outer);
  CHECK(p.a == rt::detail::LtOperand{CUBLAS_OP_N, 4, 1, 4, 0});
  CHECK(p.b == rt::detail::LtOperand{CUBLAS_OP_N, 1, 8, 1, 0});
  // A column vector stored column-major (a_cs unused since k == 1... and a_rs == 1).
  outer.a_rs = 1, outer.a_cs = 0;
  p = rt::detail::lt_problem(outer);
  CHECK(p.b == rt::detail::LtOperand{CUBLAS_OP_N, 1, 8, 1, 0});
}

TEST_CASE("cublaslt: types, compute types and bias types") {
  GemmShape s = contiguous_shape(DType::Float32, 8, 8, 8);
  s.allow_tf32 = true;
  CHECK(rt::detail::lt_problem(s).compute_type == rt::lt::CUBLAS_COMPUTE_32F_FAST_TF32);
  s = contiguous_shape(DType::Float64, 8, 8, 8);
  CHECK(rt::detail::lt_problem(s).compute_type == rt::lt::CUBLAS_COMPUTE_64F);
  CHECK(rt::detail::lt_problem(s).scale_type == rt::lt::CUDA_R_64F);
  for (DType t : {DType::Float16, DType::BFloat16}) {
    s = contiguous_shape(t, 8, 8, 8);
    s.allow_tf32 = true;  // no effect on half inputs
    auto p = rt::detail::lt_problem(s);
    CHECK(p.compute_type == rt::lt::CUBLAS_COMPUTE_32F);
    CHECK(p.scale_type == rt::lt::CUDA_R_32F);
    CHECK(p.data_type == (t == DType::Float16 ? rt::lt::CUDA_R_16F : rt::lt::CUDA_R_16BF));
    CHECK(p.out_type == p.data_type);
    // float32 output of half inputs, with a float32 bias.
    s.out_dtype = s.bias_dtype = DType::Float32;
    s.epilogue = GemmEpilogue::GeluBias;
    p = rt::detail::lt_problem(s);
    CHECK(p.out_type == rt::lt::CUDA_R_32F);
    CHECK(p.bias_type == rt::lt::CUDA_R_32F);
    CHECK(p.epilogue == rt::lt::CUBLASLT_EPILOGUE_GELU_BIAS);
    // The bias must have the output's type.
    s.bias_dtype = t;
    std::string msg = message_of<kiln::DTypeError>([&] { rt::detail::lt_problem(s); });
    CHECK(contains(msg, "bias"));
    CHECK(contains(msg, s.str()));
  }
  s = contiguous_shape(DType::Float32, 8, 8, 8);
  s.out_dtype = DType::Float16;
  CHECK_THROWS_AS(rt::detail::lt_problem(s), kiln::DTypeError);
  s = contiguous_shape(DType::Int32, 8, 8, 8);
  CHECK_THROWS_AS(rt::detail::lt_problem(s), kiln::DTypeError);
  const std::pair<GemmEpilogue, std::uint32_t> epilogues[] = {
      {GemmEpilogue::None, rt::lt::CUBLASLT_EPILOGUE_DEFAULT},
      {GemmEpilogue::Bias, rt::lt::CUBLASLT_EPILOGUE_BIAS},
      {GemmEpilogue::Relu, rt::lt::CUBLASLT_EPILOGUE_RELU},
      {GemmEpilogue::ReluBias, rt::lt::CUBLASLT_EPILOGUE_RELU_BIAS},
      {GemmEpilogue::Gelu, rt::lt::CUBLASLT_EPILOGUE_GELU},
      {GemmEpilogue::GeluBias, rt::lt::CUBLASLT_EPILOGUE_GELU_BIAS}};
  for (auto [e, want] : epilogues) {
    s = contiguous_shape(DType::BFloat16, 8, 8, 8);
    s.epilogue = e;
    auto p = rt::detail::lt_problem(s);
    CHECK(p.epilogue == want);
    CHECK((p.bias_type == rt::lt::CUDA_R_16BF) == rt::epilogue_has_bias(e));
  }
}

TEST_CASE("cublaslt: the training epilogues keep or read the GELU's input as an auxiliary matrix") {
  const std::pair<GemmEpilogue, std::uint32_t> aux_epilogues[] = {
      {GemmEpilogue::GeluAux, rt::lt::CUBLASLT_EPILOGUE_GELU_AUX},
      {GemmEpilogue::GeluAuxBias, rt::lt::CUBLASLT_EPILOGUE_GELU_AUX_BIAS},
      {GemmEpilogue::DGelu, rt::lt::CUBLASLT_EPILOGUE_DGELU}};
  for (auto [e, want] : aux_epilogues) {
    GemmShape s = contiguous_shape(DType::BFloat16, 8, 16, 8);
    s.epilogue = e;
    s.aux_rs = 16;
    auto p = rt::detail::lt_problem(s);
    CHECK(p.epilogue == want);
    CHECK(p.aux_ld == 16);
    CHECK((p.bias_type >= 0) == (e == GemmEpilogue::GeluAuxBias));
    // The leading dimension must cover the row and be a multiple of 8; one product, no batch.
    s.aux_rs = 12;
    std::string msg = message_of<kiln::ValueError>([&] { rt::detail::lt_problem(s); });
    CHECK(contains(msg, "auxiliary matrix's row stride 12"));
    CHECK(contains(msg, s.str()));
    s.aux_rs = 16, s.batch = 2, s.a_bs = 64, s.b_bs = 128, s.d_bs = 128;
    CHECK_THROWS_AS(rt::detail::lt_problem(s), kiln::ValueError);
  }
  // Shapes without an auxiliary matrix keep their hashes (stored tunings stay valid).
  GemmShape plain = contiguous_shape(DType::BFloat16, 8, 16, 8), with = plain;
  with.aux_rs = 16;
  CHECK(plain.hash() != with.hash());
  GemmShape zero = plain;
  zero.aux_rs = 0;
  CHECK(plain.hash() == zero.hash());
}

TEST_CASE("cublaslt: strides cuBLASLt cannot take are refused with the product named") {
  GemmShape s = contiguous_shape(DType::Float32, 8, 8, 8);
  s.a_rs = 0;  // every row of A the same (an expanded vector): needs a copy first
  std::string msg = message_of<kiln::ValueError>([&] { rt::detail::lt_problem(s); });
  CHECK(contains(msg, "A's strides"));
  CHECK(contains(msg, s.str()));
  s = contiguous_shape(DType::Float32, 8, 8, 8);
  s.b_rs = 4;  // overlapping rows
  CHECK_THROWS_AS(rt::detail::lt_problem(s), kiln::ValueError);
  s = contiguous_shape(DType::Float32, 8, 8, 8);
  s.d_rs = 7;
  CHECK_THROWS_AS(rt::detail::lt_problem(s), kiln::ValueError);
  s = contiguous_shape(DType::Float32, 8, 8, 8);
  s.batch = 2, s.a_bs = 64, s.b_bs = 0, s.d_bs = 0;  // broadcasting B is fine, D's stride 0 is not
  msg = message_of<kiln::ValueError>([&] { rt::detail::lt_problem(s); });
  CHECK(contains(msg, "D's batch stride"));
  s.d_bs = 64;
  CHECK(rt::detail::lt_problem(s).a.batch_stride == 0);
  s.m = std::int64_t(1) << 31;
  CHECK_THROWS_AS(rt::detail::lt_problem(s), kiln::ValueError);
}

TEST_CASE("cublaslt: empty products do nothing, k == 0 is the caller's, anywhere") {
  GemmShape s = contiguous_shape(DType::Float32, 0, 16, 32);
  CHECK_NOTHROW(rt::cublaslt_matmul(s, nullptr, nullptr, nullptr, nullptr, 0));
  CHECK(rt::cublaslt_autotune(s, nullptr, nullptr, nullptr, nullptr, 0) == 0.0);
  s = contiguous_shape(DType::Float32, 16, 0, 32);
  CHECK_NOTHROW(rt::cublaslt_matmul(s, nullptr, nullptr, nullptr, nullptr, 0));
  s = contiguous_shape(DType::Float32, 16, 16, 32);
  s.batch = 0;
  CHECK_NOTHROW(rt::cublaslt_matmul(s, nullptr, nullptr, nullptr, nullptr, 0));

  float dummy[4] = {};
  s = contiguous_shape(DType::Float32, 4, 4, 0);
  std::string msg = message_of<kiln::Error>([&] { rt::cublaslt_matmul(s, dummy, dummy, dummy, nullptr, 0); });
  CHECK(contains(msg, s.str()));
  CHECK(contains(msg, "k == 0"));
  s = contiguous_shape(DType::Float32, 4, 4, 4);
  CHECK_THROWS_AS(rt::cublaslt_matmul(s, nullptr, dummy, dummy, nullptr, 0), kiln::ValueError);
  s.epilogue = GemmEpilogue::ReluBias;
  msg = message_of<kiln::ValueError>([&] { rt::cublaslt_matmul(s, dummy, dummy, dummy, nullptr, 0); });
  CHECK(contains(msg, "bias"));
  s.m = -1;
  CHECK_THROWS_AS(rt::cublaslt_matmul(s, dummy, dummy, dummy, dummy, 0), kiln::ValueError);
}

TEST_CASE("cublaslt: without CUDA or cuBLASLt a product throws DeviceError naming it and why") {
  if (kiln::cuda_available() && rt::cublaslt_available()) {
    MESSAGE("CUDA and cuBLASLt are available; the unavailable path is not taken");
    return;
  }
  GemmShape s = contiguous_shape(DType::BFloat16, 64, 16, 32);
  alignas(256) static float dummy[16];  // never dereferenced: the call stops before any copy
  std::string msg = message_of<kiln::DeviceError>([&] { rt::cublaslt_matmul(s, dummy, dummy, dummy, nullptr, 0); });
  CHECK(contains(msg, s.str()));
  CHECK(contains(msg, rt::cublaslt_available() ? kiln::cuda_unavailable_reason() : rt::cublaslt_unavailable_reason()));
  msg = message_of<kiln::DeviceError>([&] { rt::cublaslt_autotune(s, dummy, dummy, dummy, nullptr, 0); });
  CHECK(contains(msg, s.str()));
}

// ---- GPU --------------------------------------------------------------------------------------

namespace {

bool skip_without_cublaslt_gpu() {
  if (!kiln::cuda_available()) {
    MESSAGE("CUDA unavailable, cuBLASLt GPU checks skipped: " << kiln::cuda_unavailable_reason());
    return true;
  }
  if (!rt::cublaslt_available()) {
    MESSAGE("cuBLASLt unavailable, its GPU checks skipped: " << rt::cublaslt_unavailable_reason());
    return true;
  }
  return false;
}

/// The value of `v` once stored as `t`.
double round_to(DType t, double v) {
  switch (t) {
    case DType::Float16:
      return static_cast<float>(kiln::Half(static_cast<float>(v)));
    case DType::BFloat16:
      return static_cast<float>(kiln::BFloat16(static_cast<float>(v)));
    case DType::Float32:
      return static_cast<float>(v);
    default:
      return v;
  }
}

void store(DType t, std::vector<unsigned char>& buf, std::int64_t i, double v) {
  unsigned char* p = buf.data() + i * static_cast<std::int64_t>(kiln::itemsize(t));
  switch (t) {
    case DType::Float16: {
      kiln::Half h(static_cast<float>(v));
      std::memcpy(p, &h.bits, 2);
      break;
    }
    case DType::BFloat16: {
      kiln::BFloat16 h(static_cast<float>(v));
      std::memcpy(p, &h.bits, 2);
      break;
    }
    case DType::Float32: {
      float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      break;
    }
    default:
      std::memcpy(p, &v, 8);
  }
}

double load(DType t, const std::vector<unsigned char>& buf, std::int64_t i) {
  const unsigned char* p = buf.data() + i * static_cast<std::int64_t>(kiln::itemsize(t));
  switch (t) {
    case DType::Float16: {
      std::uint16_t b;
      std::memcpy(&b, p, 2);
      return static_cast<float>(kiln::Half::from_bits(b));
    }
    case DType::BFloat16: {
      std::uint16_t b;
      std::memcpy(&b, p, 2);
      return static_cast<float>(kiln::BFloat16::from_bits(b));
    }
    case DType::Float32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    default: {
      double d;
      std::memcpy(&d, p, 8);
      return d;
    }
  }
}

/// Deterministic values in [-1, 1).
struct Lcg {
  std::uint64_t state;
  double next() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(state >> 11) / static_cast<double>(1ull << 53) * 2.0 - 1.0;
  }
};

double apply_epilogue(GemmEpilogue e, double x) {
  switch (e) {
    case GemmEpilogue::Relu:
    case GemmEpilogue::ReluBias:
      return x > 0 ? x : 0;
    case GemmEpilogue::Gelu:
    case GemmEpilogue::GeluBias: {
      // The tanh approximation, as cuBLASLt computes it.
      const double c = std::sqrt(2.0 / 3.14159265358979323846);
      return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
    }
    default:
      return x;
  }
}

/// Host operand: bytes to upload and the values as stored.
struct HostMatrix {
  DType dtype;
  std::vector<unsigned char> bytes;
  std::vector<double> values;
  HostMatrix(DType t, std::int64_t elements, Lcg& rng) : dtype(t) {
    bytes.resize(static_cast<std::size_t>(elements) * kiln::itemsize(t));
    values.resize(static_cast<std::size_t>(elements));
    for (std::int64_t i = 0; i < elements; ++i) {
      values[static_cast<std::size_t>(i)] = round_to(t, rng.next());
      store(t, bytes, i, values[static_cast<std::size_t>(i)]);
    }
  }
};

/// Device copy of host bytes, `offset_bytes` into a fresh block (to test unaligned operands).
struct DeviceCopy {
  kiln::StoragePtr storage;
  void* ptr = nullptr;
  DeviceCopy(const std::vector<unsigned char>& bytes, std::size_t offset_bytes = 0) {
    storage = rt::allocate_cuda(bytes.size() + offset_bytes, 0);
    ptr = static_cast<unsigned char*>(storage->data) + offset_bytes;
    rt::copy_host_to_device(ptr, bytes.data(), bytes.size(), 0);
  }
};

/// One product to check: layouts, types and what is expected of the result.
struct Case {
  DType dtype = DType::Float32, out = DType::Float32;
  GemmEpilogue epilogue = GemmEpilogue::None;
  std::int64_t m = 1, n = 1, k = 1, batch = 1;
  bool a_transposed = false, b_transposed = false, b_broadcast = false;
  std::int64_t pad = 0;             ///< extra elements in every leading dimension
  std::size_t offset_elements = 0;  ///< A starts this many elements into its block
  bool allow_tf32 = false;
  bool autotune = false;

  std::string str() const {
    return shape().str() + (a_transposed ? " A^T" : "") + (b_transposed ? " B^T" : "") +
           (b_broadcast ? " B broadcast" : "") + " pad " + std::to_string(pad) +
           (offset_elements ? " A offset " + std::to_string(offset_elements) : "") + (allow_tf32 ? " tf32" : "");
  }

  GemmShape shape() const {
    GemmShape s;
    s.dtype = dtype, s.out_dtype = out, s.bias_dtype = out;
    s.m = m, s.n = n, s.k = k, s.batch = batch;
    s.epilogue = epilogue;
    s.allow_tf32 = allow_tf32;
    if (a_transposed)
      s.a_rs = 1, s.a_cs = m + pad, s.a_bs = k * (m + pad);
    else
      s.a_rs = k + pad, s.a_cs = 1, s.a_bs = m * (k + pad);
    if (b_transposed)
      s.b_rs = 1, s.b_cs = k + pad, s.b_bs = n * (k + pad);
    else
      s.b_rs = n + pad, s.b_cs = 1, s.b_bs = k * (n + pad);
    if (b_broadcast) s.b_bs = 0;
    s.d_rs = n + pad, s.d_bs = m * (n + pad);
    if (batch == 1) s.a_bs = s.b_bs = s.d_bs = 0;
    return s;
  }

  /// |got - want| allowed for an element whose products sum to `scale` in absolute value.
  double tolerance(double want, double scale) const {
    const double sqrt_k = std::sqrt(static_cast<double>(k));
    if (out == DType::Float64) {
      // cuBLASLt's float64 GELU is not accurate to double precision (measured on an H200 with
      // cuBLASLt 13.1: right to ~6 digits), so it gets float32's tolerance.
      const bool gelu = epilogue == GemmEpilogue::Gelu || epilogue == GemmEpilogue::GeluBias;
      return gelu ? 1e-4 * scale + 1e-5 : 1e-12 * scale + 1e-12;
    }
    if (out == DType::Float32) return (allow_tf32 && dtype == DType::Float32 ? 4e-3 : 1e-4) * scale + 1e-5;
    if (out == DType::BFloat16) return 1e-2 * sqrt_k + std::ldexp(std::fabs(want), -7);
    return 1e-3 * sqrt_k + std::ldexp(std::fabs(want), -10);  // float16
  }
};

/// Runs `c` on cuda:0 and compares every element (and the padding, which must be untouched)
/// with the host product. Returns the number of wrong elements (0: pass).
std::int64_t run_case(const Case& c, std::uint64_t seed = 1) {
  const GemmShape s = c.shape();
  auto extent = [&](std::int64_t bs, std::int64_t rows, std::int64_t rs, std::int64_t cols, std::int64_t cs) {
    return (s.batch - 1) * bs + (rows - 1) * rs + (cols - 1) * cs + 1;
  };
  Lcg rng{seed * 0x9e3779b97f4a7c15ull + 12345};
  HostMatrix a(c.dtype, extent(s.a_bs, s.m, s.a_rs, s.k, s.a_cs), rng);
  HostMatrix b(c.dtype, extent(s.b_bs, s.k, s.b_rs, s.n, s.b_cs), rng);
  HostMatrix bias(c.out, s.n, rng);
  const std::int64_t d_elements = s.batch * s.m * s.d_rs;
  // D starts as all-ones bytes (NaN in every float type): beta = 0 must not read it, and the
  // padding must stay as it is.
  std::vector<unsigned char> d_host(static_cast<std::size_t>(d_elements) * kiln::itemsize(c.out), 0xFF);

  DeviceCopy da(a.bytes, c.offset_elements * kiln::itemsize(c.dtype)), db(b.bytes), dbias(bias.bytes), dd(d_host);
  const void* bias_ptr = rt::epilogue_has_bias(c.epilogue) ? dbias.ptr : nullptr;
  if (c.autotune) {
    const auto tunes = rt::detail::cublaslt_counters().autotunes.load();
    double ms = rt::cublaslt_autotune(s, da.ptr, db.ptr, dd.ptr, bias_ptr, 0);
    CHECK(ms > 0);
    CHECK(rt::detail::cublaslt_counters().autotunes.load() == tunes + 1);
    MESSAGE("autotuned " << s.str() << ": " << ms << " ms");
    // The autotune runs wrote D; start again from the sentinel so the check below sees one run.
    rt::copy_host_to_device(dd.ptr, d_host.data(), d_host.size(), 0);
  }
  const auto queries = rt::detail::cublaslt_counters().heuristic_queries.load();
  rt::cublaslt_matmul(s, da.ptr, db.ptr, dd.ptr, bias_ptr, 0);
  // After autotune, the same shape and pointers use the tuned plan: no heuristic query.
  if (c.autotune) CHECK(rt::detail::cublaslt_counters().heuristic_queries.load() == queries);
  rt::copy_device_to_host(d_host.data(), dd.ptr, d_host.size(), 0);

  std::int64_t bad = 0;
  double max_difference = 0;
  std::string first_bad;
  std::vector<bool> used(static_cast<std::size_t>(d_elements), false);
  for (std::int64_t bt = 0; bt < s.batch; ++bt)
    for (std::int64_t i = 0; i < s.m; ++i)
      for (std::int64_t j = 0; j < s.n; ++j) {
        double acc = 0, scale = 0;
        for (std::int64_t p = 0; p < s.k; ++p) {
          const double x = a.values[static_cast<std::size_t>(bt * s.a_bs + i * s.a_rs + p * s.a_cs)];
          const double y = b.values[static_cast<std::size_t>(bt * s.b_bs + p * s.b_rs + j * s.b_cs)];
          acc += x * y;
          scale += std::fabs(x * y);
        }
        if (rt::epilogue_has_bias(c.epilogue)) {
          acc += bias.values[static_cast<std::size_t>(j)];
          scale += std::fabs(bias.values[static_cast<std::size_t>(j)]);
        }
        const double want = apply_epilogue(c.epilogue, acc);
        const std::int64_t at = bt * s.d_bs + i * s.d_rs + j;
        used[static_cast<std::size_t>(at)] = true;
        const double got = load(c.out, d_host, at);
        max_difference = std::max(max_difference, std::fabs(got - want));
        if (!(std::fabs(got - want) <= c.tolerance(want, scale))) {
          if (bad++ == 0) {
            char text[160];
            std::snprintf(text, sizeof text, "] = %.17g, want %.17g (difference %.3g, tolerance %.3g)", got, want,
                          got - want, c.tolerance(want, scale));
            first_bad = "D[" + std::to_string(bt) + "][" + std::to_string(i) + "][" + std::to_string(j) + text;
          }
        }
      }
  std::int64_t padding_written = 0;
  for (std::int64_t at = 0; at < d_elements; ++at) {
    if (used[static_cast<std::size_t>(at)]) continue;
    const std::size_t w = kiln::itemsize(c.out);
    for (std::size_t byte = 0; byte < w; ++byte)
      if (d_host[static_cast<std::size_t>(at) * w + byte] != 0xFF) {
        ++padding_written;
        break;
      }
  }
  if (bad || padding_written)
    MESSAGE(c.str() << ": " << bad << " wrong elements, " << padding_written
                    << " padding elements written; largest difference " << max_difference << "; first: " << first_bad);
  return bad + padding_written;
}

constexpr GemmEpilogue kEpilogues[] = {GemmEpilogue::None,     GemmEpilogue::Bias, GemmEpilogue::Relu,
                                       GemmEpilogue::ReluBias, GemmEpilogue::Gelu, GemmEpilogue::GeluBias};

}  // namespace

TEST_CASE("cublaslt gpu: f32, f16, bf16 with every epilogue, transposed operands, batch 3, against a host loop") {
  if (skip_without_cublaslt_gpu()) return;
  const std::int64_t shapes[][3] = {{1, 1, 1}, {7, 17, 127}, {64, 64, 64}};  // m, n, k
  struct Layout {
    bool a_t, b_t, b_broadcast;
    std::int64_t pad;
  };
  const Layout layouts[] = {
      {false, false, false, 0}, {true, false, false, 3}, {false, true, false, 5}, {true, true, true, 0}};
  int cases = 0, failed = 0;
  for (DType t : {DType::Float32, DType::Float16, DType::BFloat16})
    for (GemmEpilogue e : kEpilogues)
      for (const auto& sh : shapes)
        for (const Layout& l : layouts) {
          Case c;
          c.dtype = c.out = t;
          c.epilogue = e;
          c.m = sh[0], c.n = sh[1], c.k = sh[2], c.batch = 3;
          c.a_transposed = l.a_t, c.b_transposed = l.b_t, c.b_broadcast = l.b_broadcast, c.pad = l.pad;
          CAPTURE(c.str());
          ++cases;
          if (run_case(c, static_cast<std::uint64_t>(cases)) != 0) ++failed;
        }
  CHECK(failed == 0);
  MESSAGE(cases << " products checked, " << failed << " wrong");
}

TEST_CASE("cublaslt gpu: GELU_AUX_BIAS stores the GELU's input, DGELU multiplies by its derivative there") {
  if (skip_without_cublaslt_gpu()) return;
  const double c0 = std::sqrt(2.0 / 3.14159265358979323846);
  auto gelu = [&](double x) { return 0.5 * x * (1.0 + std::tanh(c0 * (x + 0.044715 * x * x * x))); };
  auto gelu_grad = [&](double x) {
    const double t = std::tanh(c0 * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c0 * (1.0 + 3.0 * 0.044715 * x * x);
  };
  for (DType t : {DType::BFloat16, DType::Float16, DType::Float32})
    for (GemmEpilogue e : {GemmEpilogue::GeluAux, GemmEpilogue::GeluAuxBias, GemmEpilogue::DGelu}) {
      Case c;
      c.dtype = c.out = t, c.epilogue = e;
      c.m = 40, c.n = 24, c.k = 72, c.a_transposed = e == GemmEpilogue::DGelu;
      GemmShape s = c.shape();
      s.aux_rs = 32;  // the auxiliary matrix padded: its own leading dimension
      CAPTURE(s.str());
      Lcg rng{static_cast<std::uint64_t>(e) * 7919 + static_cast<std::uint64_t>(t)};
      HostMatrix a(t, s.m * s.k, rng), b(t, s.k * s.n, rng), bias(t, s.n, rng), z(t, s.m * s.aux_rs, rng);
      std::vector<unsigned char> d_host(static_cast<std::size_t>(s.m * s.n) * kiln::itemsize(t), 0xFF);
      DeviceCopy da(a.bytes), db(b.bytes), dbias(bias.bytes), dd(d_host), daux(z.bytes);
      rt::cublaslt_matmul(s, da.ptr, db.ptr, dd.ptr, rt::epilogue_has_bias(e) ? dbias.ptr : nullptr, 0, nullptr,
                          daux.ptr);
      std::vector<unsigned char> aux_host(z.bytes.size());
      rt::copy_device_to_host(d_host.data(), dd.ptr, d_host.size(), 0);
      rt::copy_device_to_host(aux_host.data(), daux.ptr, aux_host.size(), 0);
      std::int64_t bad = 0;
      for (std::int64_t i = 0; i < s.m; ++i)
        for (std::int64_t j = 0; j < s.n; ++j) {
          double acc = 0, scale = 0;
          for (std::int64_t p = 0; p < s.k; ++p) {
            const double x = a.values[static_cast<std::size_t>(i * s.a_rs + p * s.a_cs)];
            const double y = b.values[static_cast<std::size_t>(p * s.b_rs + j * s.b_cs)];
            acc += x * y;
            scale += std::fabs(x * y);
          }
          if (rt::epilogue_has_bias(e)) acc += bias.values[static_cast<std::size_t>(j)];
          const std::int64_t at_aux = i * s.aux_rs + j;
          double want = 0, got = load(t, d_host, i * s.n + j);
          if (e == GemmEpilogue::DGelu) {
            want = acc * gelu_grad(z.values[static_cast<std::size_t>(at_aux)]);
            // The auxiliary matrix is only read.
            bad += load(t, aux_host, at_aux) != z.values[static_cast<std::size_t>(at_aux)];
          } else {
            want = gelu(acc);
            const double kept = load(t, aux_host, at_aux);
            bad += !(std::fabs(kept - acc) <= c.tolerance(acc, scale + 1));
          }
          bad += !(std::fabs(got - want) <= c.tolerance(want, scale + 1));
        }
      // The auxiliary matrix's padding is untouched.
      for (std::int64_t i = 0; i < s.m; ++i)
        for (std::int64_t j = s.n; j < s.aux_rs; ++j)
          bad += load(t, aux_host, i * s.aux_rs + j) != z.values[static_cast<std::size_t>(i * s.aux_rs + j)];
      CHECK(bad == 0);
    }
  // Without the matrix's pointer the call is refused before cuBLASLt sees it.
  Case c;
  c.dtype = c.out = DType::BFloat16, c.epilogue = GemmEpilogue::DGelu, c.m = c.n = c.k = 8;
  GemmShape s = c.shape();
  s.aux_rs = 8;
  std::vector<unsigned char> bytes(64 * 2, 0);
  DeviceCopy x(bytes), y(bytes), d(bytes);
  std::string msg = message_of<kiln::ValueError>([&] { rt::cublaslt_matmul(s, x.ptr, y.ptr, d.ptr, nullptr, 0); });
  CHECK(contains(msg, "auxiliary matrix's pointer"));
}

TEST_CASE("cublaslt gpu: half inputs with float32 output and float32 bias") {
  if (skip_without_cublaslt_gpu()) return;
  for (DType t : {DType::Float16, DType::BFloat16})
    for (GemmEpilogue e : {GemmEpilogue::None, GemmEpilogue::Bias, GemmEpilogue::GeluBias}) {
      Case c;
      c.dtype = t, c.out = DType::Float32, c.epilogue = e;
      c.m = 33, c.n = 40, c.k = 96, c.batch = 2, c.a_transposed = true;
      CAPTURE(c.str());
      CHECK(run_case(c) == 0);
    }
}

TEST_CASE("cublaslt gpu: float64, and float32 with TF32") {
  if (skip_without_cublaslt_gpu()) return;
  Case c;
  c.dtype = c.out = DType::Float64;
  c.m = 31, c.n = 9, c.k = 65, c.batch = 3, c.b_transposed = true;
  CHECK(run_case(c) == 0);
  // cuBLASLt may not fuse every epilogue for float64; where it does, the result must be right.
  for (GemmEpilogue e : {GemmEpilogue::Bias, GemmEpilogue::ReluBias, GemmEpilogue::GeluBias}) {
    c.epilogue = e;
    CAPTURE(c.str());
    try {
      CHECK(run_case(c) == 0);
    } catch (const kiln::DeviceError& err) {
      CHECK(contains(err.what(), "CUBLAS_STATUS_NOT_SUPPORTED"));
      CHECK(contains(err.what(), c.shape().str()));
      MESSAGE("float64 " << rt::epilogue_name(e) << ": " << err.what());
    }
  }
  Case tf32;
  tf32.m = tf32.n = tf32.k = 64, tf32.allow_tf32 = true, tf32.epilogue = GemmEpilogue::ReluBias;
  CHECK(run_case(tf32) == 0);
}

TEST_CASE("cublaslt gpu: operands not 16-byte aligned get an algorithm that accepts them") {
  if (skip_without_cublaslt_gpu()) return;
  Case c;
  c.m = 19, c.n = 24, c.k = 40, c.offset_elements = 1;  // A 4-byte aligned
  CHECK(run_case(c) == 0);
  c.a_transposed = true, c.batch = 2;
  CHECK(run_case(c) == 0);
  for (DType t : {DType::Float16, DType::BFloat16}) {
    Case h;
    h.dtype = h.out = t, h.m = 16, h.n = 16, h.k = 32, h.offset_elements = 1;  // A 2-byte aligned
    h.epilogue = GemmEpilogue::Bias;
    CAPTURE(h.str());
    // cuBLASLt may have no kernel for half operands below 4-byte alignment; if it has, the
    // result must be right, and if not, the error must say so.
    try {
      CHECK(run_case(h) == 0);
    } catch (const kiln::DeviceError& err) {
      CHECK(contains(err.what(), "CUBLAS_STATUS_NOT_SUPPORTED"));
      CHECK(contains(err.what(), "A 2"));
      MESSAGE("2-byte aligned " << kiln::dtype_name(t) << ": " << err.what());
    }
  }
}

TEST_CASE("cublaslt gpu: the plan cache: one heuristic query per shape and alignment; the bias may move") {
  if (skip_without_cublaslt_gpu()) return;
  auto& counters = rt::detail::cublaslt_counters();
  GemmShape s = contiguous_shape(DType::BFloat16, 48, 80, 72);
  s.epilogue = GemmEpilogue::ReluBias;
  Lcg rng{7};
  HostMatrix a(s.dtype, s.m * s.k, rng), b(s.dtype, s.k * s.n, rng), bias1(s.dtype, s.n, rng), bias2(s.dtype, s.n, rng);
  // Both biases in one block, 512 bytes apart: pointers of the same alignment class.
  std::vector<unsigned char> biases(1024, 0);
  std::memcpy(biases.data(), bias1.bytes.data(), bias1.bytes.size());
  std::memcpy(biases.data() + 512, bias2.bytes.data(), bias2.bytes.size());
  DeviceCopy da(a.bytes), db(b.bytes), dbiases(biases);
  struct {
    void* ptr;
  } dbias1{dbiases.ptr}, dbias2{static_cast<unsigned char*>(dbiases.ptr) + 512};
  std::vector<unsigned char> d_host(static_cast<std::size_t>(s.m * s.n) * 2);
  DeviceCopy dd(d_host);

  const auto queries0 = counters.heuristic_queries.load(), plans0 = counters.plans.load();
  rt::cublaslt_matmul(s, da.ptr, db.ptr, dd.ptr, dbias1.ptr, 0);
  CHECK(counters.plans.load() == plans0 + 1);
  CHECK(counters.heuristic_queries.load() == queries0 + 1);
  rt::cublaslt_matmul(s, da.ptr, db.ptr, dd.ptr, dbias1.ptr, 0);
  // A second bias buffer of the same alignment: the same plan, the new bias.
  rt::cublaslt_matmul(s, da.ptr, db.ptr, dd.ptr, dbias2.ptr, 0);
  CHECK(counters.plans.load() == plans0 + 1);
  CHECK(counters.heuristic_queries.load() == queries0 + 1);
  rt::copy_device_to_host(d_host.data(), dd.ptr, d_host.size(), 0);
  std::int64_t bad = 0;
  for (std::int64_t i = 0; i < s.m; ++i)
    for (std::int64_t j = 0; j < s.n; ++j) {
      double acc = bias2.values[static_cast<std::size_t>(j)];
      for (std::int64_t p = 0; p < s.k; ++p)
        acc += a.values[static_cast<std::size_t>(i * s.k + p)] * b.values[static_cast<std::size_t>(p * s.n + j)];
      const double want = acc > 0 ? acc : 0;
      if (!(std::fabs(load(s.out_dtype, d_host, i * s.n + j) - want) <= 1e-2 * std::sqrt(72.0) + std::fabs(want) / 128))
        ++bad;
    }
  CHECK(bad == 0);
  // Another pointer alignment: another plan.
  GemmShape shifted = s;
  shifted.m = s.m - 1;  // rows 1..m-1 of A: 144 bytes in, 16-byte but not 256-byte aligned
  rt::cublaslt_matmul(shifted, static_cast<const unsigned char*>(da.ptr) + s.k * 2, db.ptr, dd.ptr, dbias1.ptr, 0);
  CHECK(counters.plans.load() == plans0 + 2);
  rt::synchronize_cuda(0);
}

TEST_CASE("cublaslt gpu: autotune times candidates, keeps the fastest, and later calls use it") {
  if (skip_without_cublaslt_gpu()) return;
  Case c;
  c.dtype = c.out = DType::BFloat16, c.epilogue = GemmEpilogue::GeluBias;
  c.m = 256, c.n = 384, c.k = 512, c.autotune = true;
  CHECK(run_case(c) == 0);
  c.dtype = c.out = DType::Float32, c.epilogue = GemmEpilogue::None;
  c.m = 1, c.n = 1024, c.k = 1024, c.batch = 4, c.a_transposed = true;
  CHECK(run_case(c) == 0);
}

TEST_CASE("cublaslt gpu: threads making and using the same plans at once") {
  if (skip_without_cublaslt_gpu()) return;
  std::atomic<int> wrong{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      try {
        for (int r = 0; r < 3; ++r) {
          Case c;
          c.dtype = c.out = r % 2 ? DType::BFloat16 : DType::Float32;
          c.epilogue = GemmEpilogue::ReluBias;
          c.m = 40 + r, c.n = 24, c.k = 56, c.batch = 2, c.b_transposed = t % 2 == 1;
          if (run_case(c, static_cast<std::uint64_t>(t * 10 + r)) != 0) ++wrong;
        }
      } catch (const std::exception& e) {
        ++errors;
        MESSAGE("thread " << t << ": " << e.what());
      }
    });
  for (auto& th : threads) th.join();
  CHECK(wrong.load() == 0);
  CHECK(errors.load() == 0);
}

TEST_CASE("cublaslt gpu: a device that does not exist is a DeviceError naming the product") {
  if (skip_without_cublaslt_gpu()) return;
  GemmShape s = contiguous_shape(DType::Float32, 4, 4, 4);
  alignas(256) static float dummy[16];
  std::string msg = message_of<kiln::DeviceError>([&] { rt::cublaslt_matmul(s, dummy, dummy, dummy, nullptr, 99); });
  CHECK(contains(msg, s.str()));
  CHECK(contains(msg, "cuda:99"));
}
