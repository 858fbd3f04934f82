// cuDNN loaded at run time for fused attention. Anywhere: our declarations against
// <cudnn_graph.h> where it is on the include path, loading and refusing libraries, which
// attention steps may go to cuDNN and why the others do not. The numerical checks of cuDNN's
// attention run in tests/nn/test_attention.cpp (on a GPU with cuDNN every half-type case
// without a mask goes there).
#include <doctest/doctest.h>

#include <string>

#include "kiln/backend/steps.hpp"
#include "kiln/runtime/cudnn.hpp"
#include "runtime_test_util.hpp"

#if __has_include(<cudnn_graph.h>) && __has_include(<cuda_runtime_api.h>)
#include <cudnn_graph.h>
namespace kiln_cudnn_abi {
namespace dnn = kiln::runtime::dnn;
static_assert(dnn::CUDNN_STATUS_SUCCESS == CUDNN_STATUS_SUCCESS);
static_assert(dnn::CUDNN_STATUS_NOT_SUPPORTED == CUDNN_STATUS_NOT_SUPPORTED);
static_assert(dnn::CUDNN_DATA_FLOAT == CUDNN_DATA_FLOAT);
static_assert(dnn::CUDNN_DATA_HALF == CUDNN_DATA_HALF);
static_assert(dnn::CUDNN_DATA_INT32 == CUDNN_DATA_INT32);
static_assert(dnn::CUDNN_DATA_BFLOAT16 == CUDNN_DATA_BFLOAT16);
static_assert(dnn::CUDNN_DATA_BOOLEAN == CUDNN_DATA_BOOLEAN);
static_assert(dnn::CUDNN_POINTWISE_ADD == CUDNN_POINTWISE_ADD);
static_assert(dnn::CUDNN_POINTWISE_MUL == CUDNN_POINTWISE_MUL);
static_assert(dnn::CUDNN_POINTWISE_DIV == CUDNN_POINTWISE_DIV);
static_assert(dnn::CUDNN_POINTWISE_SUB == CUDNN_POINTWISE_SUB);
static_assert(dnn::CUDNN_POINTWISE_EXP == CUDNN_POINTWISE_EXP);
static_assert(dnn::CUDNN_POINTWISE_LOG == CUDNN_POINTWISE_LOG);
static_assert(dnn::CUDNN_POINTWISE_IDENTITY == CUDNN_POINTWISE_IDENTITY);
static_assert(dnn::CUDNN_POINTWISE_CMP_GE == CUDNN_POINTWISE_CMP_GE);
static_assert(dnn::CUDNN_POINTWISE_CMP_LT == CUDNN_POINTWISE_CMP_LT);
static_assert(dnn::CUDNN_POINTWISE_LOGICAL_AND == CUDNN_POINTWISE_LOGICAL_AND);
static_assert(dnn::CUDNN_POINTWISE_GEN_INDEX == CUDNN_POINTWISE_GEN_INDEX);
static_assert(dnn::CUDNN_POINTWISE_BINARY_SELECT == CUDNN_POINTWISE_BINARY_SELECT);
static_assert(dnn::CUDNN_REDUCE_TENSOR_ADD == CUDNN_REDUCE_TENSOR_ADD);
static_assert(dnn::CUDNN_REDUCE_TENSOR_MAX == CUDNN_REDUCE_TENSOR_MAX);
static_assert(dnn::CUDNN_HEUR_MODE_A == CUDNN_HEUR_MODE_A);
static_assert(dnn::CUDNN_TYPE_HANDLE == CUDNN_TYPE_HANDLE);
static_assert(dnn::CUDNN_TYPE_DATA_TYPE == CUDNN_TYPE_DATA_TYPE);
static_assert(dnn::CUDNN_TYPE_BOOLEAN == CUDNN_TYPE_BOOLEAN);
static_assert(dnn::CUDNN_TYPE_INT64 == CUDNN_TYPE_INT64);
static_assert(dnn::CUDNN_TYPE_VOID_PTR == CUDNN_TYPE_VOID_PTR);
static_assert(dnn::CUDNN_TYPE_HEUR_MODE == CUDNN_TYPE_HEUR_MODE);
static_assert(dnn::CUDNN_TYPE_POINTWISE_MODE == CUDNN_TYPE_POINTWISE_MODE);
static_assert(dnn::CUDNN_TYPE_BACKEND_DESCRIPTOR == CUDNN_TYPE_BACKEND_DESCRIPTOR);
static_assert(dnn::CUDNN_TYPE_REDUCTION_OPERATOR_TYPE == CUDNN_TYPE_REDUCTION_OPERATOR_TYPE);
static_assert(dnn::CUDNN_BACKEND_POINTWISE_DESCRIPTOR == CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
static_assert(dnn::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR == CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
static_assert(dnn::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR == CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
static_assert(dnn::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
static_assert(dnn::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR == CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
static_assert(dnn::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR == CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
static_assert(dnn::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR == CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
static_assert(dnn::CUDNN_BACKEND_TENSOR_DESCRIPTOR == CUDNN_BACKEND_TENSOR_DESCRIPTOR);
static_assert(dnn::CUDNN_BACKEND_MATMUL_DESCRIPTOR == CUDNN_BACKEND_MATMUL_DESCRIPTOR);
static_assert(dnn::CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR == CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
static_assert(dnn::CUDNN_BACKEND_REDUCTION_DESCRIPTOR == CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
static_assert(dnn::CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR == CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
static_assert(dnn::CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR == CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
static_assert(dnn::CUDNN_ATTR_POINTWISE_MODE == CUDNN_ATTR_POINTWISE_MODE);
static_assert(dnn::CUDNN_ATTR_POINTWISE_MATH_PREC == CUDNN_ATTR_POINTWISE_MATH_PREC);
static_assert(dnn::CUDNN_ATTR_POINTWISE_AXIS == CUDNN_ATTR_POINTWISE_AXIS);
static_assert(dnn::CUDNN_ATTR_ENGINEHEUR_MODE == CUDNN_ATTR_ENGINEHEUR_MODE);
static_assert(dnn::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH == CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH);
static_assert(dnn::CUDNN_ATTR_ENGINEHEUR_RESULTS == CUDNN_ATTR_ENGINEHEUR_RESULTS);
static_assert(dnn::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG == CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG);
static_assert(dnn::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE);
static_assert(dnn::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR == CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR);
static_assert(dnn::CUDNN_ATTR_OPERATION_POINTWISE_XDESC == CUDNN_ATTR_OPERATION_POINTWISE_XDESC);
static_assert(dnn::CUDNN_ATTR_OPERATION_POINTWISE_BDESC == CUDNN_ATTR_OPERATION_POINTWISE_BDESC);
static_assert(dnn::CUDNN_ATTR_OPERATION_POINTWISE_YDESC == CUDNN_ATTR_OPERATION_POINTWISE_YDESC);
static_assert(dnn::CUDNN_ATTR_OPERATION_POINTWISE_TDESC == CUDNN_ATTR_OPERATION_POINTWISE_TDESC);
static_assert(dnn::CUDNN_ATTR_OPERATIONGRAPH_OPS == CUDNN_ATTR_OPERATIONGRAPH_OPS);
static_assert(dnn::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT == CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT);
static_assert(dnn::CUDNN_ATTR_TENSOR_DATA_TYPE == CUDNN_ATTR_TENSOR_DATA_TYPE);
static_assert(dnn::CUDNN_ATTR_TENSOR_DIMENSIONS == CUDNN_ATTR_TENSOR_DIMENSIONS);
static_assert(dnn::CUDNN_ATTR_TENSOR_STRIDES == CUDNN_ATTR_TENSOR_STRIDES);
static_assert(dnn::CUDNN_ATTR_TENSOR_UNIQUE_ID == CUDNN_ATTR_TENSOR_UNIQUE_ID);
static_assert(dnn::CUDNN_ATTR_TENSOR_IS_VIRTUAL == CUDNN_ATTR_TENSOR_IS_VIRTUAL);
static_assert(dnn::CUDNN_ATTR_TENSOR_IS_BY_VALUE == CUDNN_ATTR_TENSOR_IS_BY_VALUE);
static_assert(dnn::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS == CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
static_assert(dnn::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS == CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
static_assert(dnn::CUDNN_ATTR_VARIANT_PACK_WORKSPACE == CUDNN_ATTR_VARIANT_PACK_WORKSPACE);
static_assert(dnn::CUDNN_ATTR_MATMUL_COMP_TYPE == CUDNN_ATTR_MATMUL_COMP_TYPE);
static_assert(dnn::CUDNN_ATTR_OPERATION_MATMUL_ADESC == CUDNN_ATTR_OPERATION_MATMUL_ADESC);
static_assert(dnn::CUDNN_ATTR_OPERATION_MATMUL_BDESC == CUDNN_ATTR_OPERATION_MATMUL_BDESC);
static_assert(dnn::CUDNN_ATTR_OPERATION_MATMUL_CDESC == CUDNN_ATTR_OPERATION_MATMUL_CDESC);
static_assert(dnn::CUDNN_ATTR_OPERATION_MATMUL_DESC == CUDNN_ATTR_OPERATION_MATMUL_DESC);
static_assert(dnn::CUDNN_ATTR_REDUCTION_OPERATOR == CUDNN_ATTR_REDUCTION_OPERATOR);
static_assert(dnn::CUDNN_ATTR_REDUCTION_COMP_TYPE == CUDNN_ATTR_REDUCTION_COMP_TYPE);
static_assert(dnn::CUDNN_ATTR_OPERATION_REDUCTION_XDESC == CUDNN_ATTR_OPERATION_REDUCTION_XDESC);
static_assert(dnn::CUDNN_ATTR_OPERATION_REDUCTION_YDESC == CUDNN_ATTR_OPERATION_REDUCTION_YDESC);
static_assert(dnn::CUDNN_ATTR_OPERATION_REDUCTION_DESC == CUDNN_ATTR_OPERATION_REDUCTION_DESC);
static_assert(dnn::CUDNN_ATTR_OPERATION_RESHAPE_XDESC == CUDNN_ATTR_OPERATION_RESHAPE_XDESC);
static_assert(dnn::CUDNN_ATTR_OPERATION_RESHAPE_YDESC == CUDNN_ATTR_OPERATION_RESHAPE_YDESC);
// The two attributes cuDNN 9 marks deprecated (still what the graph and plan take the handle by).
static_assert(dnn::CUDNN_ATTR_OPERATIONGRAPH_HANDLE == 800 && dnn::CUDNN_ATTR_EXECUTION_PLAN_HANDLE == 400);
}  // namespace kiln_cudnn_abi
#define KILN_TEST_CUDNN_ABI_CHECKED 1
#endif

namespace {

namespace rt = kiln::runtime;
using kiln::DType;

constexpr const char* kToolkitCudnn = "/usr/local/cuda/lib64/libcudnn.so.9";

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// A contiguous [B, H, L, E] slot.
kiln::sched::Slot slot(std::int64_t H, std::int64_t L, std::int64_t E) {
  kiln::sched::Slot s;
  s.kind = kiln::sched::Slot::Leaf;
  s.index = 0;
  s.strides = {H * L * E, L * E, E, 1};
  return s;
}

/// A causal bf16 forward [2, 4, 128, 64] (out and lse read).
kiln::sched::AttentionCall forward_call() {
  kiln::sched::AttentionCall c;
  c.dtype = DType::BFloat16;
  c.batch = 2, c.heads = c.kv_heads = 4, c.q_len = c.kv_len = 128, c.head_dim = c.value_dim = 64;
  c.causal = true;
  c.scale = 0.125;
  c.q = c.k = c.v = c.out = slot(4, 128, 64);
  c.lse.kind = kiln::sched::Slot::Output;
  c.lse.index = 1;
  c.lse.strides = {4 * 128, 128, 1};
  return c;
}

}  // namespace

TEST_CASE("cudnn: KILN_CUDNN_PATH naming a missing file makes cuDNN unavailable, naming it") {
  const bool available = rt::cudnn_available();
  CHECK(available == rt::cudnn_unavailable_reason().empty());
  if (!available) MESSAGE("cuDNN unavailable here: " << rt::cudnn_unavailable_reason());
  const std::string path = "/nonexistent/kiln/libcudnn.so.9";
  kiln_test::ScopedEnv env("KILN_CUDNN_PATH", path);
  auto state = rt::detail::load_cudnn_from_env();
  CHECK_FALSE(state.ok());
  CHECK(contains(state.reason, path));
  CHECK(contains(state.reason, "KILN_CUDNN_PATH"));
  CHECK(rt::cudnn_available() == available);  // loaded once, on first use
  CHECK(rt::detail::cudnn_candidates() == std::vector<std::string>{"libcudnn.so.9", "libcudnn.so"});
}

TEST_CASE("cudnn: a library without cuDNN's symbols is refused, naming them") {
  auto state = rt::detail::load_cudnn("libm.so.6");
  CHECK_FALSE(state.ok());
  CHECK(contains(state.reason, "libm.so.6"));
  CHECK(contains(state.reason, "cudnnBackendExecute"));
  CHECK(contains(state.reason, "cudnnBackendCreateDescriptor"));
}

TEST_CASE("cudnn: the toolkit's libcudnn resolves every symbol and names its version (no GPU needed)") {
#if KILN_TEST_CUDNN_ABI_CHECKED
  MESSAGE("declarations checked against <cudnn_graph.h>");
#endif
  if (!kiln_test::file_exists(kToolkitCudnn)) {
    MESSAGE("no " << kToolkitCudnn << "; symbol resolution not checked");
    return;
  }
  auto state = rt::detail::load_cudnn(kToolkitCudnn);
  INFO(state.reason);
  REQUIRE(state.ok());
  CHECK(state.version >= 90600);
  CHECK(static_cast<bool>(state.api.get_last_error_string));
  CHECK(rt::detail::cudnn_version_text(91900) == "9.19.0");
  // A status's text comes from the library, without a GPU.
  CHECK(contains(rt::detail::cudnn_status_text(state.api, rt::dnn::CUDNN_STATUS_NOT_SUPPORTED), "NOT_SUPPORTED"));
}

TEST_CASE("cudnn: which attention steps may go to cuDNN, and why the others may not") {
  namespace be = kiln::backend::detail;
  rt::CudnnAttentionProblem p;
  std::string why;
  auto c = forward_call();
  REQUIRE(be::cudnn_attention_problem(c, 0, p, why));
  CHECK(p.q_len == 128);
  CHECK(p.causal);
  CHECK(p.strides[0][0] == 4 * 128 * 64);
  CHECK(p.strides[3][2] == 64);
  CHECK(p.wants_lse);
  CHECK(p.str() == "bfloat16 causal attention [2, 4, 128 x 128, 64]");

  // Problems that differ in anything cuDNN's plan depends on are different keys.
  rt::CudnnAttentionProblem other = p;
  other.scale = 0.25;
  CHECK_FALSE(other == p);
  other = p;
  other.strides[1][2] = 3 * 64;
  CHECK(other.hash() != p.hash());

  auto refused = [&](kiln::sched::AttentionCall call, const char* reason) {
    CAPTURE(reason);
    rt::CudnnAttentionProblem q;
    std::string w;
    CHECK_FALSE(be::cudnn_attention_problem(call, 0, q, w));
    CHECK(contains(w, reason));
  };
  auto f32 = c;
  f32.dtype = DType::Float32;
  refused(f32, "float32, not a half type");
  auto masked = c;
  masked.has_mask = true;
  refused(masked, "mask");
  auto grouped = c;
  grouped.kv_heads = 2;
  refused(grouped, "fewer heads");
  auto odd = c;
  odd.head_dim = 60;
  refused(odd, "multiples of 8");
  auto strided = c;
  strided.k.strides = {4 * 128 * 64, 64, 4 * 64, 2};
  refused(strided, "last dim");
  auto unaligned = c;
  unaligned.v.strides = {4 * 129 * 64, 129 * 64, 63, 1};
  refused(unaligned, "16 bytes");
  auto no_keys = c;
  no_keys.kv_len = 0;
  refused(no_keys, "empty");
  auto no_features = c;
  no_features.head_dim = 0;
  refused(no_features, "empty");
  auto lse_view = c;
  lse_view.lse.strides = {128, 2 * 4 * 128, 1};
  refused(lse_view, "contiguous [B, H, L]");
  auto no_out = c;
  no_out.out = kiln::sched::Slot{};
  refused(no_out, "operand cuDNN needs is absent");

  // A backward needs the saved lse; gradients nobody reads go to the plan's scratch.
  auto back = c;
  back.kind = kiln::sched::AttentionCall::Backward;
  back.dout = back.dq = back.dv = slot(4, 128, 64);
  REQUIRE(be::cudnn_attention_problem(back, 0, p, why));
  CHECK(p.backward);
  CHECK(p.wants[0]);
  CHECK_FALSE(p.wants[1]);
  CHECK(p.wants[2]);
  // Any lengths, forward and backward (a backward with a partial 128-row tile gets the padding
  // mask when its plan is made).
  for (auto call : {c, back}) {
    call.q_len = 129, call.kv_len = 64;
    call.lse.strides = {4 * 129, 129, 1};
    CHECK(be::cudnn_attention_problem(call, 0, p, why));
  }
  back.lse = kiln::sched::Slot{};
  refused(back, "no saved lse");
}

TEST_CASE("cudnn: KILN_ATTENTION=generated keeps attention on kiln's kernels") {
  {
    kiln_test::ScopedEnv env("KILN_ATTENTION", "generated");
    CHECK_FALSE(kiln::backend::detail::attention_library_allowed());
  }
  kiln_test::ScopedEnv env("KILN_ATTENTION", std::nullopt);
  CHECK(kiln::backend::detail::attention_library_allowed());
}
