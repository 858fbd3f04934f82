#pragma once
// cuDNN's fused attention, loaded at run time with dlopen (never linked), so one binary runs with
// and without cuDNN: when libcudnn.so.9 loads and its engines take a problem, a half-precision
// attention step runs cuDNN's flash-attention kernels (Hopper: wgmma and TMA, which kiln's own
// mma.sync kernels do not use); otherwise kiln's generated kernels run it.
//
// Only cuDNN's C "graph" (backend) API is used: tensors, operations and an operation graph are
// backend descriptors set attribute by attribute. cuDNN's fused-attention engines recognise
// attention written as the chain of its primitive operations (two products around a softmax made
// of reductions and pointwise operations, the causal mask as index comparisons), so the graphs
// below spell attention that way, and the engine heuristics pick a fused kernel for them.
//
// The declarations are our own (statuses and enums as int, descriptors as void*), so kiln compiles
// without cudnn.h; each value names the enum it is taken from (cuDNN 9.19, cudnn_graph.h), and
// tests/runtime/test_cudnn.cpp checks them against <cudnn_graph.h> where present.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
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

namespace kiln::runtime::dnn {

using cudnnStatus_t = int;  // enum cudnnStatus_t
inline constexpr cudnnStatus_t CUDNN_STATUS_SUCCESS = 0;
inline constexpr cudnnStatus_t CUDNN_STATUS_NOT_SUPPORTED = 3000;  // and 3001..: sub-codes of "not supported"
struct cudnnContext;
using cudnnHandle_t = cudnnContext*;
using cudnnBackendDescriptor_t = void*;

// enum cudnnDataType_t
inline constexpr int CUDNN_DATA_FLOAT = 0;
inline constexpr int CUDNN_DATA_HALF = 2;
inline constexpr int CUDNN_DATA_INT32 = 4;
inline constexpr int CUDNN_DATA_BFLOAT16 = 9;
inline constexpr int CUDNN_DATA_BOOLEAN = 11;

// enum cudnnPointwiseMode_t
inline constexpr int CUDNN_POINTWISE_ADD = 0;
inline constexpr int CUDNN_POINTWISE_MUL = 1;
inline constexpr int CUDNN_POINTWISE_DIV = 6;
inline constexpr int CUDNN_POINTWISE_SUB = 9;
inline constexpr int CUDNN_POINTWISE_EXP = 13;
inline constexpr int CUDNN_POINTWISE_LOG = 15;
inline constexpr int CUDNN_POINTWISE_IDENTITY = 21;
inline constexpr int CUDNN_POINTWISE_CMP_GE = 303;
inline constexpr int CUDNN_POINTWISE_CMP_LT = 304;
inline constexpr int CUDNN_POINTWISE_LOGICAL_AND = 400;
inline constexpr int CUDNN_POINTWISE_GEN_INDEX = 501;
inline constexpr int CUDNN_POINTWISE_BINARY_SELECT = 601;

// enum cudnnReduceTensorOp_t
inline constexpr int CUDNN_REDUCE_TENSOR_ADD = 0;
inline constexpr int CUDNN_REDUCE_TENSOR_MAX = 3;

// enum cudnnBackendHeurMode_t
inline constexpr int CUDNN_HEUR_MODE_A = 3;

// enum cudnnBackendAttributeType_t
inline constexpr int CUDNN_TYPE_HANDLE = 0;
inline constexpr int CUDNN_TYPE_DATA_TYPE = 1;
inline constexpr int CUDNN_TYPE_BOOLEAN = 2;
inline constexpr int CUDNN_TYPE_INT64 = 3;
inline constexpr int CUDNN_TYPE_VOID_PTR = 6;
inline constexpr int CUDNN_TYPE_HEUR_MODE = 8;
inline constexpr int CUDNN_TYPE_POINTWISE_MODE = 14;
inline constexpr int CUDNN_TYPE_BACKEND_DESCRIPTOR = 15;
inline constexpr int CUDNN_TYPE_REDUCTION_OPERATOR_TYPE = 18;

// enum cudnnBackendDescriptorType_t
inline constexpr int CUDNN_BACKEND_POINTWISE_DESCRIPTOR = 0;
inline constexpr int CUDNN_BACKEND_ENGINECFG_DESCRIPTOR = 3;
inline constexpr int CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR = 4;
inline constexpr int CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR = 5;
inline constexpr int CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR = 13;
inline constexpr int CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR = 15;
inline constexpr int CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR = 16;
inline constexpr int CUDNN_BACKEND_TENSOR_DESCRIPTOR = 17;
inline constexpr int CUDNN_BACKEND_MATMUL_DESCRIPTOR = 18;
inline constexpr int CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR = 19;
inline constexpr int CUDNN_BACKEND_REDUCTION_DESCRIPTOR = 21;
inline constexpr int CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR = 22;
inline constexpr int CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR = 31;

// enum cudnnBackendAttributeName_t
inline constexpr int CUDNN_ATTR_POINTWISE_MODE = 0;
inline constexpr int CUDNN_ATTR_POINTWISE_MATH_PREC = 1;
inline constexpr int CUDNN_ATTR_POINTWISE_AXIS = 9;
inline constexpr int CUDNN_ATTR_ENGINEHEUR_MODE = 200;
inline constexpr int CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH = 201;
inline constexpr int CUDNN_ATTR_ENGINEHEUR_RESULTS = 202;
inline constexpr int CUDNN_ATTR_EXECUTION_PLAN_HANDLE = 400;
inline constexpr int CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG = 401;
inline constexpr int CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE = 402;
inline constexpr int CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR = 750;
inline constexpr int CUDNN_ATTR_OPERATION_POINTWISE_XDESC = 751;
inline constexpr int CUDNN_ATTR_OPERATION_POINTWISE_BDESC = 752;
inline constexpr int CUDNN_ATTR_OPERATION_POINTWISE_YDESC = 753;
inline constexpr int CUDNN_ATTR_OPERATION_POINTWISE_TDESC = 758;
inline constexpr int CUDNN_ATTR_OPERATIONGRAPH_HANDLE = 800;
inline constexpr int CUDNN_ATTR_OPERATIONGRAPH_OPS = 801;
inline constexpr int CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT = 900;
inline constexpr int CUDNN_ATTR_TENSOR_DATA_TYPE = 901;
inline constexpr int CUDNN_ATTR_TENSOR_DIMENSIONS = 902;
inline constexpr int CUDNN_ATTR_TENSOR_STRIDES = 903;
inline constexpr int CUDNN_ATTR_TENSOR_UNIQUE_ID = 906;
inline constexpr int CUDNN_ATTR_TENSOR_IS_VIRTUAL = 907;
inline constexpr int CUDNN_ATTR_TENSOR_IS_BY_VALUE = 908;
inline constexpr int CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS = 1000;
inline constexpr int CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS = 1001;
inline constexpr int CUDNN_ATTR_VARIANT_PACK_WORKSPACE = 1003;
inline constexpr int CUDNN_ATTR_MATMUL_COMP_TYPE = 1500;
inline constexpr int CUDNN_ATTR_OPERATION_MATMUL_ADESC = 1520;
inline constexpr int CUDNN_ATTR_OPERATION_MATMUL_BDESC = 1521;
inline constexpr int CUDNN_ATTR_OPERATION_MATMUL_CDESC = 1522;
inline constexpr int CUDNN_ATTR_OPERATION_MATMUL_DESC = 1523;
inline constexpr int CUDNN_ATTR_REDUCTION_OPERATOR = 1600;
inline constexpr int CUDNN_ATTR_REDUCTION_COMP_TYPE = 1601;
inline constexpr int CUDNN_ATTR_OPERATION_REDUCTION_XDESC = 1610;
inline constexpr int CUDNN_ATTR_OPERATION_REDUCTION_YDESC = 1611;
inline constexpr int CUDNN_ATTR_OPERATION_REDUCTION_DESC = 1612;
inline constexpr int CUDNN_ATTR_OPERATION_RESHAPE_XDESC = 2200;
inline constexpr int CUDNN_ATTR_OPERATION_RESHAPE_YDESC = 2201;

}  // namespace kiln::runtime::dnn

namespace kiln::runtime {

namespace detail {

/// The cuDNN entry points kiln uses; each member's comment names its symbol. The enums of the C
/// API are passed as int (their C ABI).
struct CudnnApi {
  using Status = dnn::cudnnStatus_t;
  using Desc = dnn::cudnnBackendDescriptor_t;
  Status (*create)(dnn::cudnnHandle_t*) = nullptr;                   // cudnnCreate
  Status (*set_stream)(dnn::cudnnHandle_t, cu::CUstream) = nullptr;  // cudnnSetStream (cudaStream_t is CUstream)
  std::size_t (*get_version)() = nullptr;                            // cudnnGetVersion
  const char* (*get_error_string)(Status) = nullptr;                 // cudnnGetErrorString
  Status (*create_descriptor)(int type, Desc*) = nullptr;            // cudnnBackendCreateDescriptor
  Status (*destroy_descriptor)(Desc) = nullptr;                      // cudnnBackendDestroyDescriptor
  Status (*finalize)(Desc) = nullptr;                                // cudnnBackendFinalize
  Status (*set_attribute)(Desc, int name, int type, std::int64_t count,
                          const void* values) = nullptr;  // cudnnBackendSetAttribute
  Status (*get_attribute)(Desc, int name, int type, std::int64_t requested, std::int64_t* count,
                          void* values) = nullptr;                        // cudnnBackendGetAttribute
  Status (*execute)(dnn::cudnnHandle_t, Desc plan, Desc pack) = nullptr;  // cudnnBackendExecute
  // Optional: the library's text for the last failure (cuDNN 9).
  void (*get_last_error_string)(char*, std::size_t) = nullptr;  // cudnnGetLastErrorString
};

/// What loading cuDNN found: the API table, or why it is unusable.
using CudnnState = RuntimeLibrary<CudnnApi>;

/// "9.19.0" from cudnnGetVersion's 91900.
inline std::string cudnn_version_text(std::size_t v) { return library_version_text(v); }

/// Loads cuDNN from `path` and resolves every symbol. Never throws; creates no handle, so it
/// works without a GPU.
inline CudnnState load_cudnn(const std::string& path) {
  CudnnState s;
  s.path = path;
  const auto t0 = std::chrono::steady_clock::now();
  s.library = open_library(path, s.reason);
  if (!s.library) return s;
  auto& a = s.api;
  SymbolResolver sym(*s.library);
  sym(a.create, "cudnnCreate");
  sym(a.set_stream, "cudnnSetStream");
  sym(a.get_version, "cudnnGetVersion");
  sym(a.get_error_string, "cudnnGetErrorString");
  sym(a.create_descriptor, "cudnnBackendCreateDescriptor");
  sym(a.destroy_descriptor, "cudnnBackendDestroyDescriptor");
  sym(a.finalize, "cudnnBackendFinalize");
  sym(a.set_attribute, "cudnnBackendSetAttribute");
  sym(a.get_attribute, "cudnnBackendGetAttribute");
  sym(a.execute, "cudnnBackendExecute");
  sym(a.get_last_error_string, "cudnnGetLastErrorString", false);
  if (const std::string& missing = sym.missing(); !missing.empty()) {
    s.reason = "the library '" + path + "' is not a usable cuDNN: it lacks " + missing;
    return s;
  }
  s.version = a.get_version();
  // The fused-attention engines for the graphs below (stats output, the backward's dQ
  // accumulator left uninitialised) are those of cuDNN 9.6 and newer.
  if (s.version < 90600) {
    s.reason = "the cuDNN at '" + path + "' is version " + cudnn_version_text(s.version) + "; kiln needs 9.6 or newer";
    return s;
  }
  s.load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return s;
}

/// The library names tried in order when KILN_CUDNN_PATH is unset.
inline std::vector<std::string> cudnn_candidates() { return {"libcudnn.so.9", "libcudnn.so"}; }

/// KILN_CUDNN_PATH when set (and nothing else), else the candidates in turn.
inline CudnnState load_cudnn_from_env() {
  return load_library_from_env<CudnnState>("KILN_CUDNN_PATH", cudnn_candidates(), load_cudnn,
                                           "cuDNN not found (install libcudnn9 or set KILN_CUDNN_PATH)");
}

/// The process's cuDNN, loaded on first use (thread-safe, once), never unloaded.
inline const CudnnState& cudnn_state() {
  static const CudnnState* state = [] {
    auto* s = new CudnnState(load_cudnn_from_env());
    log_library_load("cuDNN", *s);
    return s;
  }();
  return *state;
}

/// "CUDNN_STATUS_NOT_SUPPORTED_SHAPE (the library's last message)".
inline std::string cudnn_status_text(const CudnnApi& api, dnn::cudnnStatus_t s) {
  std::string t = api.get_error_string ? api.get_error_string(s) : "cuDNN status " + std::to_string(s);
  if (api.get_last_error_string) {
    char buf[512] = {};
    api.get_last_error_string(buf, sizeof buf);
    if (buf[0]) t += std::string(" (") + buf + ")";
  }
  return t;
}

/// A failure while describing a problem to cuDNN: the caller falls back to its own kernels.
struct CudnnRefusal {
  std::string why;
};

/// One device's cuDNN handle, made once (a failure throws CudnnRefusal); `mu` orders
/// cudnnSetStream with the execution it is for.
struct CudnnDevice {
  dnn::cudnnHandle_t handle = nullptr;
  std::mutex mu;
};

inline CudnnDevice& cudnn_device(const CudaContext& ctx) {
  struct All {
    std::vector<std::once_flag> once;
    std::vector<std::unique_ptr<CudnnDevice>> dev;
    explicit All(int n) : once(static_cast<std::size_t>(n)), dev(static_cast<std::size_t>(n)) {}
  };
  static All* all = new All(cuda_device_count());  // never destroyed (as cuBLASLt's handles)
  const auto i = static_cast<std::size_t>(ctx.index);
  std::call_once(all->once[i], [&] {
    const auto& api = cudnn_state().api;
    auto d = std::make_unique<CudnnDevice>();
    ctx.make_current();
    const auto s = api.create(&d->handle);
    // A cuDNN that loads but cannot make a handle (a driver it does not support, say) is a
    // refusal: the generated kernels still run (the next plan tries again).
    if (s != dnn::CUDNN_STATUS_SUCCESS)
      throw CudnnRefusal{"cudnnCreate failed on cuda:" + std::to_string(ctx.index) + ": " + cudnn_status_text(api, s)};
    all->dev[i] = std::move(d);
  });
  if (!all->dev[i]) throw CudnnRefusal{"cuDNN has no handle on cuda:" + std::to_string(ctx.index)};
  return *all->dev[i];
}

/// Builds one cuDNN operation graph: every descriptor it makes lives as long as the builder (a
/// plan keeps its builder). Any failing call throws CudnnRefusal naming the step.
class CudnnGraphBuilder {
 public:
  using Desc = dnn::cudnnBackendDescriptor_t;
  explicit CudnnGraphBuilder(const CudnnApi& api) : api_(&api) {}
  CudnnGraphBuilder(const CudnnGraphBuilder&) = delete;
  CudnnGraphBuilder& operator=(const CudnnGraphBuilder&) = delete;
  ~CudnnGraphBuilder() {
    for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) api_->destroy_descriptor(*it);
  }

  Desc make(int type, const char* what) {
    Desc d = nullptr;
    check(api_->create_descriptor(type, &d), what);
    owned_.push_back(d);
    return d;
  }
  void set(Desc d, int name, int type, std::int64_t count, const void* values, const char* what) {
    check(api_->set_attribute(d, name, type, count, values), what);
  }
  void finalize(Desc d, const char* what) { check(api_->finalize(d), what); }

  /// A tensor with a fresh unique id; returns the id (its descriptor is tensor(id)).
  std::int64_t tensor(int dtype, const std::vector<std::int64_t>& dims, const std::vector<std::int64_t>& strides,
                      bool is_virtual, bool by_value = false) {
    const std::int64_t uid = next_uid_++;
    Desc t = make(dnn::CUDNN_BACKEND_TENSOR_DESCRIPTOR, "a tensor descriptor");
    const std::int64_t alignment = 16;
    const bool v = is_virtual, bv = by_value;
    set(t, dnn::CUDNN_ATTR_TENSOR_DATA_TYPE, dnn::CUDNN_TYPE_DATA_TYPE, 1, &dtype, "a tensor's data type");
    set(t, dnn::CUDNN_ATTR_TENSOR_DIMENSIONS, dnn::CUDNN_TYPE_INT64, static_cast<std::int64_t>(dims.size()),
        dims.data(), "a tensor's dimensions");
    set(t, dnn::CUDNN_ATTR_TENSOR_STRIDES, dnn::CUDNN_TYPE_INT64, static_cast<std::int64_t>(strides.size()),
        strides.data(), "a tensor's strides");
    set(t, dnn::CUDNN_ATTR_TENSOR_UNIQUE_ID, dnn::CUDNN_TYPE_INT64, 1, &uid, "a tensor's id");
    set(t, dnn::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, dnn::CUDNN_TYPE_INT64, 1, &alignment, "a tensor's alignment");
    set(t, dnn::CUDNN_ATTR_TENSOR_IS_VIRTUAL, dnn::CUDNN_TYPE_BOOLEAN, 1, &v, "a tensor's virtual flag");
    if (by_value)
      set(t, dnn::CUDNN_ATTR_TENSOR_IS_BY_VALUE, dnn::CUDNN_TYPE_BOOLEAN, 1, &bv, "a scalar's by-value flag");
    finalize(t, "a tensor descriptor");
    tensors_.emplace(uid, t);
    return uid;
  }
  /// A float scalar passed by value at execution (its value goes in the variant pack).
  std::int64_t scalar() { return tensor(dnn::CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true); }

  /// y = mode(x[, b[, t]]); `axis` for GEN_INDEX.
  void pointwise(int mode, std::int64_t x, std::int64_t b, std::int64_t t, std::int64_t y,
                 int math = dnn::CUDNN_DATA_FLOAT, std::int64_t axis = -1) {
    Desc pw = make(dnn::CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "a pointwise descriptor");
    set(pw, dnn::CUDNN_ATTR_POINTWISE_MODE, dnn::CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "a pointwise mode");
    set(pw, dnn::CUDNN_ATTR_POINTWISE_MATH_PREC, dnn::CUDNN_TYPE_DATA_TYPE, 1, &math, "a pointwise precision");
    if (axis >= 0) set(pw, dnn::CUDNN_ATTR_POINTWISE_AXIS, dnn::CUDNN_TYPE_INT64, 1, &axis, "an index axis");
    finalize(pw, "a pointwise descriptor");
    Desc op = make(dnn::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "a pointwise operation");
    attach(op, dnn::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    link(op, dnn::CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b >= 0) link(op, dnn::CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t >= 0) link(op, dnn::CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    link(op, dnn::CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    add_operation(op, "a pointwise operation");
  }
  /// c = a @ b over the leading (batch) dimensions, accumulated in float.
  void matmul(std::int64_t a, std::int64_t b, std::int64_t c) {
    Desc mm = make(dnn::CUDNN_BACKEND_MATMUL_DESCRIPTOR, "a matmul descriptor");
    const int comp = dnn::CUDNN_DATA_FLOAT;
    set(mm, dnn::CUDNN_ATTR_MATMUL_COMP_TYPE, dnn::CUDNN_TYPE_DATA_TYPE, 1, &comp, "a matmul's compute type");
    finalize(mm, "a matmul descriptor");
    Desc op = make(dnn::CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "a matmul operation");
    link(op, dnn::CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    link(op, dnn::CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    link(op, dnn::CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    attach(op, dnn::CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    add_operation(op, "a matmul operation");
  }
  /// y = reduce(x) over the dimensions where y has size 1.
  void reduction(int reduce_op, std::int64_t x, std::int64_t y) {
    Desc r = make(dnn::CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "a reduction descriptor");
    const int comp = dnn::CUDNN_DATA_FLOAT;
    set(r, dnn::CUDNN_ATTR_REDUCTION_OPERATOR, dnn::CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce_op,
        "a reduction's operator");
    set(r, dnn::CUDNN_ATTR_REDUCTION_COMP_TYPE, dnn::CUDNN_TYPE_DATA_TYPE, 1, &comp, "a reduction's compute type");
    finalize(r, "a reduction descriptor");
    Desc op = make(dnn::CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "a reduction operation");
    link(op, dnn::CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    link(op, dnn::CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    attach(op, dnn::CUDNN_ATTR_OPERATION_REDUCTION_DESC, r);
    add_operation(op, "a reduction operation");
  }
  /// y = x seen with y's dimensions and strides (a transpose, for the engines' pattern).
  void reshape(std::int64_t x, std::int64_t y) {
    Desc op = make(dnn::CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "a reshape operation");
    link(op, dnn::CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    link(op, dnn::CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    add_operation(op, "a reshape operation");
  }

  /// Finalizes the operation graph and asks the heuristics for its engine configurations, in
  /// their order of preference; then finalizes the first plan that cuDNN accepts.
  void build_plan(dnn::cudnnHandle_t handle) {
    handle_ = handle;
    Desc graph = make(dnn::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "the operation graph");
    set(graph, dnn::CUDNN_ATTR_OPERATIONGRAPH_OPS, dnn::CUDNN_TYPE_BACKEND_DESCRIPTOR,
        static_cast<std::int64_t>(ops_.size()), ops_.data(), "the graph's operations");
    set(graph, dnn::CUDNN_ATTR_OPERATIONGRAPH_HANDLE, dnn::CUDNN_TYPE_HANDLE, 1, &handle, "the graph's handle");
    finalize(graph, "the operation graph");
    Desc heur = make(dnn::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "the engine heuristics");
    const int mode = dnn::CUDNN_HEUR_MODE_A;
    attach(heur, dnn::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    set(heur, dnn::CUDNN_ATTR_ENGINEHEUR_MODE, dnn::CUDNN_TYPE_HEUR_MODE, 1, &mode, "the heuristics' mode");
    finalize(heur, "the engine heuristics");
    std::int64_t count = 0;
    check(api_->get_attribute(heur, dnn::CUDNN_ATTR_ENGINEHEUR_RESULTS, dnn::CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                              nullptr),
          "the number of engine configurations");
    if (count <= 0) throw CudnnRefusal{"no cuDNN engine takes this graph"};
    configs_.clear();
    for (std::int64_t i = 0; i < count; ++i)
      configs_.push_back(make(dnn::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "an engine configuration"));
    check(api_->get_attribute(heur, dnn::CUDNN_ATTR_ENGINEHEUR_RESULTS, dnn::CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                              &count, configs_.data()),
          "the engine configurations");
    configs_.resize(static_cast<std::size_t>(count));
    if (!add_plan()) throw CudnnRefusal{"no engine configuration finalizes:" + refusals_};
  }
  /// Finalizes the next engine configuration that cuDNN accepts as one more plan; false when
  /// none is left.
  bool add_plan() {
    while (next_config_ < configs_.size()) {
      Desc plan = make(dnn::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "an execution plan");
      set(plan, dnn::CUDNN_ATTR_EXECUTION_PLAN_HANDLE, dnn::CUDNN_TYPE_HANDLE, 1, &handle_, "the plan's handle");
      attach(plan, dnn::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, configs_[next_config_]);
      const std::size_t index = next_config_++;
      const auto s = api_->finalize(plan);
      if (s != dnn::CUDNN_STATUS_SUCCESS) {
        refusals_ += "\n  configuration " + std::to_string(index) + ": " + cudnn_status_text(*api_, s);
        continue;
      }
      std::int64_t bytes = 0, n = 0;
      check(api_->get_attribute(plan, dnn::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, dnn::CUDNN_TYPE_INT64, 1, &n,
                                &bytes),
            "the plan's workspace size");
      plans_.push_back(plan);
      workspace_bytes_ = std::max(workspace_bytes_, bytes);
      return true;
    }
    return false;
  }
  std::size_t plan_count() const { return plans_.size(); }
  Desc plan(std::size_t i) const { return plans_.at(i); }
  /// The largest workspace of the plans made so far.
  std::int64_t workspace_bytes() const { return workspace_bytes_; }
  std::size_t config_count() const { return configs_.size(); }

 private:
  void check(dnn::cudnnStatus_t s, const char* what) const {
    if (s != dnn::CUDNN_STATUS_SUCCESS) throw CudnnRefusal{std::string(what) + ": " + cudnn_status_text(*api_, s)};
  }
  /// Sets `attribute` of `d` to the descriptor `value`.
  void attach(Desc d, int attribute, Desc value) {
    set(d, attribute, dnn::CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value, "a descriptor attribute");
  }
  /// Sets `attribute` of operation `op` to tensor `uid`.
  void link(Desc op, int attribute, std::int64_t uid) { attach(op, attribute, tensors_.at(uid)); }
  /// Finalizes operation `op` and appends it to the graph's operations.
  void add_operation(Desc op, const char* what) {
    finalize(op, what);
    ops_.push_back(op);
  }

  const CudnnApi* api_;
  std::vector<Desc> owned_;
  std::vector<Desc> ops_;
  std::unordered_map<std::int64_t, Desc> tensors_;
  std::int64_t next_uid_ = 1;
  dnn::cudnnHandle_t handle_ = nullptr;
  std::vector<Desc> configs_;
  std::size_t next_config_ = 0;
  std::string refusals_;
  std::vector<Desc> plans_;
  std::int64_t workspace_bytes_ = 0;
};

}  // namespace detail

/// An attention problem as cuDNN is asked it: [B, H, L, E] operands of one half type, strides in
/// elements (the last stride of each is 1), no mask, no dropout, as many key heads as query heads.
struct CudnnAttentionProblem {
  bool backward = false;
  DType dtype = DType::BFloat16;
  std::int64_t batch = 0, heads = 0, q_len = 0, kv_len = 0, head_dim = 0, value_dim = 0;
  bool causal = false;
  double scale = 1.0;
  /// Element strides of dims 0..2 of q, k, v, out, dout, dq, dk, dv (dout and the gradients:
  /// backward only; a gradient nobody reads is written to the plan's scratch, contiguous).
  std::int64_t strides[8][3] = {};
  bool wants_lse = true;               ///< forward: the lse is read (else it goes to scratch)
  bool wants[3] = {true, true, true};  ///< backward: dq, dk, dv are read
  int device = 0;
  bool operator==(const CudnnAttentionProblem&) const = default;
  std::uint64_t hash() const {
    using kiln::detail::hash_combine;
    std::uint64_t h = hash_combine(static_cast<std::uint64_t>(backward), static_cast<std::uint64_t>(dtype));
    for (std::int64_t v : {batch, heads, q_len, kv_len, head_dim, value_dim})
      h = hash_combine(h, static_cast<std::uint64_t>(v));
    for (const auto& s : strides)
      for (std::int64_t v : s) h = hash_combine(h, static_cast<std::uint64_t>(v));
    std::uint64_t bits = 0;
    std::memcpy(&bits, &scale, sizeof bits);
    h = hash_combine(h, bits);
    return hash_combine(h, static_cast<std::uint64_t>(causal) | std::uint64_t(wants_lse) << 1 |
                               std::uint64_t(wants[0]) << 2 | std::uint64_t(wants[1]) << 3 |
                               std::uint64_t(wants[2]) << 4 | static_cast<std::uint64_t>(device) << 8);
  }
  /// "bfloat16 causal attention [16, 16, 2048, 128] (backward)".
  std::string str() const {
    return std::string(dtype_name(dtype)) + (causal ? " causal" : "") + " attention [" + std::to_string(batch) + ", " +
           std::to_string(heads) + ", " + std::to_string(q_len) + " x " + std::to_string(kv_len) + ", " +
           std::to_string(head_dim) + "]" + (backward ? " (backward)" : "");
  }
};

/// One attention problem's cuDNN execution plan, and the device memory it owns: cuDNN's
/// workspace, the backward's float dQ accumulator, and room for results nobody reads. Plans are
/// made once per problem and kept for the process (a CUDA graph that captured a plan's run reads
/// its scratch at replay, so scratch, once given out, is never freed).
class CudnnAttentionPlan {
 public:
  CudnnAttentionProblem problem;
  /// Runs the plan on `args` (the attention step's argument list: q, k, v, mask, out, lse in a
  /// forward; q, k, v, mask, out, dout, lse, dq, dk, dv, delta in a backward), queued on
  /// `stream` (kiln's stream of the device when null). Throws DeviceError when cuDNN fails.
  void run(const std::vector<void*>& args, cu::CUstream stream) const { enqueue(chosen_.load(), args, stream); }
  /// Whether every pointer the plan reads or writes is 16-byte aligned (the plan's assumption).
  bool fits(const std::vector<void*>& args) const;
  /// The lse the plan writes (forward) or reads (backward) in a run on `args`. cuDNN's forward
  /// leaves a row whose scores are all -inf at lse -inf with its values weighed by 0, so a
  /// non-finite value makes it NaN (0 · inf) where torch's safe softmax gives 0: the step
  /// zeroes such rows after the plan (codegen::cuda_library_attention_rows). A backward reads
  /// its lse from the plan's scratch, where the step copies the forward's with +inf for -inf
  /// before the plan runs (codegen::cuda_library_attention_backward_stats).
  void* stats(const std::vector<void*>& args) const { return pointer(stats_binding, args, scratch_base_.load()); }
  /// max-autotune: makes plans of up to kTunedCandidates engine configurations (the
  /// heuristics' first is the default), times them on `args` (their outputs are overwritten)
  /// and keeps the fastest for later runs. Once per plan in a process; synchronous.
  /// `prepare` runs once the scratch has its final size, before the timed runs: what a run
  /// reads from the scratch (the backward's lse copy) is written there first.
  void autotune(const std::vector<void*>& args, const std::function<void()>& prepare = {}) const;
  /// The engine configurations timed by autotune and their milliseconds (empty before).
  std::vector<double> tuned_ms() const {
    std::lock_guard<std::mutex> lock(tune_mu_);
    return tuned_ms_;
  }
  std::size_t chosen() const { return chosen_.load(); }
  static constexpr std::size_t kTunedCandidates = 8;

  std::unique_ptr<detail::CudnnGraphBuilder> graph;
  std::vector<std::int64_t> uids;  ///< the non-virtual tensors, in the order of `sources`
  /// Where each uid's pointer comes from: an index into the argument list (>= 0), or one of
  /// the plan's own buffers (kScratch or kLengths, at `offsets`), or a by-value float (kScalar + index).
  std::vector<int> sources;
  std::vector<std::size_t> offsets;
  std::vector<float> scalars;
  std::size_t workspace_offset = 0;  ///< where cuDNN's workspace starts in the scratch
  /// Which binding (index into uids) is the float lse, [B, H, L] contiguous.
  std::size_t stats_binding = 0;
  static constexpr int kScratch = -1;
  static constexpr int kLengths = -2;
  static constexpr int kScalar = -1000;
  /// A backward with a partial tile: its padding mask's sequence lengths (int32, B of q_len then
  /// B of kv_len; bindings kLengths at `offsets`), written when the plan is made.
  StoragePtr lengths;

  /// Tensor `uid`'s memory: argument `source` (>= 0) or the scratch at `offset` (kScratch).
  void bind(std::int64_t uid, int source, std::size_t offset = 0) {
    uids.push_back(uid);
    sources.push_back(source);
    offsets.push_back(offset);
  }
  /// Scalar `uid`'s value.
  /// Binding `i`'s memory in a run on `args` with the scratch at `base`.
  void* pointer(std::size_t i, const std::vector<void*>& args, char* base) const {
    const int s = sources[i];
    if (s >= 0) return args[static_cast<std::size_t>(s)];
    if (s == kScratch) return base + offsets[i];
    if (s == kLengths) return static_cast<char*>(lengths->data) + offsets[i];
    return const_cast<float*>(&scalars[static_cast<std::size_t>(s - kScalar)]);  // only read
  }
  void bind_scalar(std::int64_t uid, float value) {
    bind(uid, kScalar + static_cast<int>(scalars.size()));
    scalars.push_back(value);
  }
  /// Makes the scratch large enough for the plans made so far (a new block; the old one stays).
  void grow_scratch() const {
    const std::size_t bytes = workspace_offset + static_cast<std::size_t>(graph->workspace_bytes());
    if (bytes <= scratch_bytes_ || bytes == 0) return;
    scratches_.push_back(allocate_cuda(bytes, problem.device));
    scratch_bytes_ = bytes;
    scratch_base_.store(static_cast<char*>(scratches_.back()->data));
  }

 private:
  void enqueue(std::size_t plan, const std::vector<void*>& args, cu::CUstream stream) const;

  mutable std::mutex tune_mu_;
  mutable bool tuned_ = false;
  mutable std::vector<double> tuned_ms_;
  mutable std::atomic<std::size_t> chosen_{0};
  mutable std::vector<StoragePtr> scratches_;
  mutable std::size_t scratch_bytes_ = 0;
  mutable std::atomic<char*> scratch_base_{nullptr};
};

namespace detail {

inline int cudnn_data_type(DType t) { return t == DType::Float16 ? dnn::CUDNN_DATA_HALF : dnn::CUDNN_DATA_BFLOAT16; }

/// Adds the causal mask (key j > query i scored as the lowest float) to `scores`, returns the
/// masked scores' id.
inline std::int64_t cudnn_causal_mask(CudnnGraphBuilder& g, CudnnAttentionPlan& plan, std::int64_t scores,
                                      const std::vector<std::int64_t>& dims, const std::vector<std::int64_t>& strides) {
  const auto row = g.tensor(dnn::CUDNN_DATA_INT32, dims, strides, true);
  const auto col = g.tensor(dnn::CUDNN_DATA_INT32, dims, strides, true);
  const auto keep = g.tensor(dnn::CUDNN_DATA_BOOLEAN, dims, strides, true);
  const auto lowest = g.scalar();
  const auto masked = g.tensor(dnn::CUDNN_DATA_FLOAT, dims, strides, true);
  g.pointwise(dnn::CUDNN_POINTWISE_GEN_INDEX, scores, -1, -1, row, dnn::CUDNN_DATA_INT32, 2);
  g.pointwise(dnn::CUDNN_POINTWISE_GEN_INDEX, scores, -1, -1, col, dnn::CUDNN_DATA_INT32, 3);
  g.pointwise(dnn::CUDNN_POINTWISE_CMP_GE, row, col, -1, keep, dnn::CUDNN_DATA_BOOLEAN);
  g.pointwise(dnn::CUDNN_POINTWISE_BINARY_SELECT, scores, lowest, keep, masked);
  plan.bind_scalar(lowest, std::numeric_limits<float>::lowest());
  return masked;
}

/// Adds the padding mask (rows at or past q_len, keys at or past kv_len scored as the lowest
/// float) to `scores`, with the lengths in the plan's `lengths` buffer; returns the masked
/// scores' id.
inline std::int64_t cudnn_padding_mask(CudnnGraphBuilder& g, CudnnAttentionPlan& plan, std::int64_t scores,
                                       const std::vector<std::int64_t>& dims, const std::vector<std::int64_t>& strides) {
  const CudnnAttentionProblem& p = plan.problem;
  const auto B = static_cast<std::size_t>(p.batch);
  const std::int64_t seq_q = g.tensor(dnn::CUDNN_DATA_INT32, {p.batch, 1, 1, 1}, {1, 1, 1, 1}, false);
  const std::int64_t seq_kv = g.tensor(dnn::CUDNN_DATA_INT32, {p.batch, 1, 1, 1}, {1, 1, 1, 1}, false);
  const std::size_t kv_at = (B * 4 + 255) / 256 * 256;  // each length vector 256-byte aligned
  plan.bind(seq_q, CudnnAttentionPlan::kLengths, 0);
  plan.bind(seq_kv, CudnnAttentionPlan::kLengths, kv_at);
  std::vector<std::int32_t> lengths(2 * kv_at / 4, 0);
  for (std::size_t b = 0; b < B; ++b) {
    lengths[b] = static_cast<std::int32_t>(p.q_len);
    lengths[kv_at / 4 + b] = static_cast<std::int32_t>(p.kv_len);
  }
  plan.lengths = allocate_cuda(2 * kv_at, p.device);
  copy_host_to_device(plan.lengths->data, lengths.data(), 2 * kv_at, p.device);
  synchronize_cuda(p.device);  // before any stream (a capture's too) may run the plan
  const auto row = g.tensor(dnn::CUDNN_DATA_INT32, dims, strides, true);
  const auto col = g.tensor(dnn::CUDNN_DATA_INT32, dims, strides, true);
  const auto row_in = g.tensor(dnn::CUDNN_DATA_BOOLEAN, dims, strides, true);
  const auto col_in = g.tensor(dnn::CUDNN_DATA_BOOLEAN, dims, strides, true);
  const auto inside = g.tensor(dnn::CUDNN_DATA_BOOLEAN, dims, strides, true);
  const auto lowest = g.scalar();
  const auto masked = g.tensor(dnn::CUDNN_DATA_FLOAT, dims, strides, true);
  g.pointwise(dnn::CUDNN_POINTWISE_GEN_INDEX, scores, -1, -1, row, dnn::CUDNN_DATA_INT32, 2);
  g.pointwise(dnn::CUDNN_POINTWISE_CMP_LT, row, seq_q, -1, row_in, dnn::CUDNN_DATA_BOOLEAN);
  g.pointwise(dnn::CUDNN_POINTWISE_GEN_INDEX, scores, -1, -1, col, dnn::CUDNN_DATA_INT32, 3);
  g.pointwise(dnn::CUDNN_POINTWISE_CMP_LT, col, seq_kv, -1, col_in, dnn::CUDNN_DATA_BOOLEAN);
  g.pointwise(dnn::CUDNN_POINTWISE_LOGICAL_AND, row_in, col_in, -1, inside, dnn::CUDNN_DATA_BOOLEAN);
  g.pointwise(dnn::CUDNN_POINTWISE_BINARY_SELECT, scores, lowest, inside, masked);
  plan.bind_scalar(lowest, std::numeric_limits<float>::lowest());
  return masked;
}

/// Describes `p` to cuDNN and finalizes a plan; throws CudnnRefusal when cuDNN does not take it.
inline std::unique_ptr<CudnnAttentionPlan> make_cudnn_attention_plan(const CudnnAttentionProblem& p,
                                                                     dnn::cudnnHandle_t handle) {
  const auto& api = cudnn_state().api;
  auto plan = std::make_unique<CudnnAttentionPlan>();
  plan->problem = p;
  plan->graph = std::make_unique<CudnnGraphBuilder>(api);
  CudnnGraphBuilder& g = *plan->graph;
  const std::int64_t B = p.batch, H = p.heads, L = p.q_len, S = p.kv_len, E = p.head_dim, Ev = p.value_dim;
  const int io = cudnn_data_type(p.dtype), f32 = dnn::CUDNN_DATA_FLOAT;
  const std::size_t io_bytes = 2;
  auto st = [&](int i) { return p.strides[i]; };
  std::size_t scratch_bytes = 0;
  auto scratch_at = [&](std::size_t bytes) {
    const std::size_t at = scratch_bytes;
    scratch_bytes += (bytes + 255) / 256 * 256;
    return at;
  };
  auto bind = [&](std::int64_t uid, int source, std::size_t offset = 0) { plan->bind(uid, source, offset); };
  auto bind_scalar = [&](std::int64_t uid, float v) { plan->bind_scalar(uid, v); };
  const std::vector<std::int64_t> sdims{B, H, L, S}, sstr{H * L * S, L * S, S, 1};
  const std::vector<std::int64_t> rdims{B, H, L, 1}, rstr{H * L, L, 1, 1};
  // q [B, H, L, E]; kᵀ [B, H, E, S] (k's strides swapped: cuDNN multiplies q by kᵀ as stored).
  const auto q = g.tensor(io, {B, H, L, E}, {st(0)[0], st(0)[1], st(0)[2], 1}, false);
  const auto kt = g.tensor(io, {B, H, E, S}, {st(1)[0], st(1)[1], 1, st(1)[2]}, false);
  bind(q, 0);
  bind(kt, 1);
  const auto scale = g.scalar();
  bind_scalar(scale, static_cast<float>(p.scale));
  const auto raw = g.tensor(f32, sdims, sstr, true);
  const auto scaled = g.tensor(f32, sdims, sstr, true);
  if (!p.backward) {
    const auto v = g.tensor(io, {B, H, S, Ev}, {st(2)[0], st(2)[1], st(2)[2], 1}, false);
    const auto o = g.tensor(io, {B, H, L, Ev}, {st(3)[0], st(3)[1], st(3)[2], 1}, false);
    const auto stats = g.tensor(f32, rdims, rstr, false);
    bind(v, 2);
    bind(o, 4);
    if (p.wants_lse)
      bind(stats, 5);
    else
      bind(stats, CudnnAttentionPlan::kScratch, scratch_at(static_cast<std::size_t>(B * H * L) * 4));
    plan->stats_binding = plan->uids.size() - 1;
    g.matmul(q, kt, raw);
    g.pointwise(dnn::CUDNN_POINTWISE_MUL, raw, scale, -1, scaled);
    const auto s = p.causal ? cudnn_causal_mask(g, *plan, scaled, sdims, sstr) : scaled;
    const auto mx = g.tensor(f32, rdims, rstr, true);
    const auto shifted = g.tensor(f32, sdims, sstr, true);
    const auto e = g.tensor(f32, sdims, sstr, true);
    const auto sum = g.tensor(f32, rdims, rstr, true);
    const auto log_sum = g.tensor(f32, rdims, rstr, true);
    const auto prob = g.tensor(io, sdims, sstr, true);
    g.reduction(dnn::CUDNN_REDUCE_TENSOR_MAX, s, mx);
    g.pointwise(dnn::CUDNN_POINTWISE_SUB, s, mx, -1, shifted);
    g.pointwise(dnn::CUDNN_POINTWISE_EXP, shifted, -1, -1, e);
    g.reduction(dnn::CUDNN_REDUCE_TENSOR_ADD, e, sum);
    g.pointwise(dnn::CUDNN_POINTWISE_LOG, sum, -1, -1, log_sum);
    g.pointwise(dnn::CUDNN_POINTWISE_ADD, mx, log_sum, -1, stats);
    g.pointwise(dnn::CUDNN_POINTWISE_DIV, e, sum, -1, prob);
    g.matmul(prob, v, o);
  } else {
    // vᵀ [B, H, Ev, S]; out, dout [B, H, L, Ev]; the gradients in their slots or the scratch.
    const auto vt = g.tensor(io, {B, H, Ev, S}, {st(2)[0], st(2)[1], 1, st(2)[2]}, false);
    const auto o = g.tensor(io, {B, H, L, Ev}, {st(3)[0], st(3)[1], st(3)[2], 1}, false);
    const auto dout = g.tensor(io, {B, H, L, Ev}, {st(4)[0], st(4)[1], st(4)[2], 1}, false);
    const auto stats = g.tensor(f32, rdims, rstr, false);
    const auto delta = g.tensor(f32, rdims, rstr, false);
    bind(vt, 2);
    bind(o, 4);
    bind(dout, 5);
    // The forward's lse (argument 6) is read through a copy in the scratch with +inf for -inf,
    // which the step writes before the plan runs (codegen::cuda_library_attention_backward_stats).
    bind(stats, CudnnAttentionPlan::kScratch, scratch_at(static_cast<std::size_t>(B * H * L) * 4));
    plan->stats_binding = plan->uids.size() - 1;
    bind(delta, 10);
    auto gradient = [&](int which, std::int64_t rows, std::int64_t width) {
      const int slot = 5 + which;  // dq, dk, dv: strides 5, 6, 7; arguments 7, 8, 9
      if (p.wants[which]) {
        const auto t = g.tensor(io, {B, H, rows, width}, {st(slot)[0], st(slot)[1], st(slot)[2], 1}, false);
        bind(t, 7 + which);
        return t;
      }
      const auto t = g.tensor(io, {B, H, rows, width}, {H * rows * width, rows * width, width, 1}, false);
      bind(t, CudnnAttentionPlan::kScratch, scratch_at(static_cast<std::size_t>(B * H * rows * width) * io_bytes));
      return t;
    };
    const auto dq = gradient(0, L, E), dk = gradient(1, S, E), dv = gradient(2, S, Ev);
    const auto dq_accum = g.tensor(f32, {B, H, L, E}, {H * L * E, L * E, E, 1}, false);
    bind(dq_accum, CudnnAttentionPlan::kScratch, scratch_at(static_cast<std::size_t>(B * H * L * E) * 4));
    const auto one = g.scalar();
    bind_scalar(one, 1.0f);
    // delta = rowsum(dout * out)
    const auto prod = g.tensor(f32, {B, H, L, Ev}, {H * L * Ev, L * Ev, Ev, 1}, true);
    const auto rowsum = g.tensor(f32, rdims, rstr, true);
    g.pointwise(dnn::CUDNN_POINTWISE_MUL, dout, o, -1, prod);
    g.reduction(dnn::CUDNN_REDUCE_TENSOR_ADD, prod, rowsum);
    g.pointwise(dnn::CUDNN_POINTWISE_MUL, rowsum, one, -1, delta);
    // P = exp(scale q kᵀ - lse), masked
    const auto centred = g.tensor(f32, sdims, sstr, true);
    g.matmul(q, kt, raw);
    g.pointwise(dnn::CUDNN_POINTWISE_MUL, raw, scale, -1, scaled);
    // With a partial 128-row tile (either length), the padding mask with the full lengths:
    // cuDNN's Hopper backward otherwise scores the tile's padding 0 rather than -inf (cudnn-
    // frontend issues 628 and 1072, pytorch issue 196678), so exp(0 - lse) overflows where a
    // row's lse is below -88.7, and infinite query features times the zero padding are NaN:
    // such rows' gradients (with a partial query tile, the keys' and values' too) came out NaN.
    // cuDNN's frontend adds the same mask to its backward graphs before 9.15.1.
    const std::int64_t unpadded = p.q_len % 128 != 0 || p.kv_len % 128 != 0
                                      ? cudnn_padding_mask(g, *plan, scaled, sdims, sstr)
                                      : scaled;
    g.pointwise(dnn::CUDNN_POINTWISE_SUB, unpadded, stats, -1, centred);
    const auto s = p.causal ? cudnn_causal_mask(g, *plan, centred, sdims, sstr) : centred;
    const auto prob = g.tensor(f32, sdims, sstr, true);
    g.pointwise(dnn::CUDNN_POINTWISE_EXP, s, -1, -1, prob);
    // dV = Pᵀ dout
    const std::vector<std::int64_t> tdims{B, H, S, L}, tstr{H * L * S, L * S, 1, S};
    const auto prob_t = g.tensor(io, tdims, tstr, true);
    g.reshape(prob, prob_t);
    g.matmul(prob_t, dout, dv);
    // dS = P (dout vᵀ - delta) scale
    const auto dp = g.tensor(f32, sdims, sstr, true);
    const auto dp_centred = g.tensor(f32, sdims, sstr, true);
    const auto ds_unscaled = g.tensor(f32, sdims, sstr, true);
    const auto ds = g.tensor(f32, sdims, sstr, true);
    g.matmul(dout, vt, dp);
    g.pointwise(dnn::CUDNN_POINTWISE_SUB, dp, delta, -1, dp_centred);
    g.pointwise(dnn::CUDNN_POINTWISE_MUL, dp_centred, prob, -1, ds_unscaled);
    g.pointwise(dnn::CUDNN_POINTWISE_MUL, ds_unscaled, scale, -1, ds);
    // dK = dSᵀ q
    const auto ds_t = g.tensor(io, tdims, tstr, true);
    g.reshape(ds, ds_t);
    g.matmul(ds_t, q, dk);
    // dQ = dS k, accumulated in float, then converted
    const auto k = g.tensor(io, {B, H, S, E}, {st(1)[0], st(1)[1], st(1)[2], 1}, true);
    g.reshape(kt, k);
    g.matmul(ds, k, dq_accum);
    g.pointwise(dnn::CUDNN_POINTWISE_IDENTITY, dq_accum, -1, -1, dq);
  }
  g.build_plan(handle);
  plan->workspace_offset = scratch_bytes;
  plan->grow_scratch();
  return plan;
}

struct CudnnAttentionCache {
  std::mutex mu;
  struct Hash {
    std::size_t operator()(const CudnnAttentionProblem& p) const { return static_cast<std::size_t>(p.hash()); }
  };
  /// nullptr: cuDNN refused the problem (remembered, so it is asked once).
  std::unordered_map<CudnnAttentionProblem, std::shared_ptr<const CudnnAttentionPlan>, Hash> plans;
};
inline CudnnAttentionCache& cudnn_attention_cache() {
  static CudnnAttentionCache* c = new CudnnAttentionCache;  // never destroyed: plans hold device memory
  return *c;
}

}  // namespace detail

/// Whether libcudnn could be loaded (KILN_CUDNN_PATH, else libcudnn.so.9, then libcudnn.so).
inline bool cudnn_available() {
  try {
    return detail::cudnn_state().ok();
  } catch (...) {
    return false;
  }
}
/// Why cuDNN is not available ("" when it is).
inline std::string cudnn_unavailable_reason() { return detail::cudnn_state().reason; }

/// cuDNN's plan for `p`, made on first use and kept; nullptr when cuDNN is unavailable or refuses
/// the problem (`why` then says why). Plans are made outside CUDA graph captures: the first run
/// of a step is never captured.
inline std::shared_ptr<const CudnnAttentionPlan> cudnn_attention_plan(const CudnnAttentionProblem& p,
                                                                      std::string* why = nullptr) {
  if (!cudnn_available()) {
    if (why) *why = cudnn_unavailable_reason();
    return nullptr;
  }
  auto& cache = detail::cudnn_attention_cache();
  std::lock_guard<std::mutex> lock(cache.mu);
  if (auto it = cache.plans.find(p); it != cache.plans.end()) {
    if (!it->second && why) *why = "cuDNN refused it earlier";
    return it->second;
  }
  std::shared_ptr<const CudnnAttentionPlan> plan;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    CudaContext& ctx = cuda_context(p.device);
    detail::CudnnDevice& dev = detail::cudnn_device(ctx);
    ctx.make_current();
    plan = detail::make_cudnn_attention_plan(p, dev.handle);
    char ms[32];
    std::snprintf(ms, sizeof ms, "%.1f",
                  std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    log(LogChannel::perf, "cuDNN plan for " + p.str() + ": " + ms + " ms, workspace " +
                              std::to_string(plan->graph->workspace_bytes()) + " bytes, " +
                              std::to_string(plan->graph->config_count()) + " engine configurations");
  } catch (const detail::CudnnRefusal& r) {
    if (why) *why = r.why;
    log(LogChannel::perf, "cuDNN refuses " + p.str() + ": " + r.why);
  }
  cache.plans.emplace(p, plan);
  return plan;
}

inline bool CudnnAttentionPlan::fits(const std::vector<void*>& args) const {
  for (int s : sources)
    if (s >= 0 && (static_cast<std::size_t>(s) >= args.size() || !args[static_cast<std::size_t>(s)] ||
                   reinterpret_cast<std::uintptr_t>(args[static_cast<std::size_t>(s)]) % 16 != 0))
      return false;
  return true;
}

inline void CudnnAttentionPlan::enqueue(std::size_t which, const std::vector<void*>& args, cu::CUstream stream) const {
  const auto& api = detail::cudnn_state().api;
  CudaContext& ctx = cuda_context(problem.device);
  // The plan's making made the handle; this only finds it.
  detail::CudnnDevice& dev = [&]() -> detail::CudnnDevice& {
    try {
      return detail::cudnn_device(ctx);
    } catch (const detail::CudnnRefusal& r) {
      throw DeviceError("kiln: cuDNN " + problem.str() + ": " + r.why);
    }
  }();
  char* const base = scratch_base_.load();
  std::vector<void*> pointers;
  for (std::size_t i = 0; i < sources.size(); ++i) pointers.push_back(pointer(i, args, base));
  void* workspace = base ? base + workspace_offset : nullptr;
  auto fail = [&](const char* what, dnn::cudnnStatus_t s) {
    throw DeviceError("kiln: cuDNN " + problem.str() + ": " + what +
                      " failed on cuda:" + std::to_string(problem.device) + ": " + detail::cudnn_status_text(api, s));
  };
  dnn::cudnnBackendDescriptor_t pack = nullptr;
  if (auto s = api.create_descriptor(dnn::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack); s != dnn::CUDNN_STATUS_SUCCESS)
    fail("cudnnBackendCreateDescriptor(VARIANT_PACK)", s);
  struct Release {
    const detail::CudnnApi& api;
    dnn::cudnnBackendDescriptor_t d;
    ~Release() { api.destroy_descriptor(d); }
  } release{api, pack};
  const auto n = static_cast<std::int64_t>(uids.size());
  dnn::cudnnStatus_t s =
      api.set_attribute(pack, dnn::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, dnn::CUDNN_TYPE_INT64, n, uids.data());
  if (s == dnn::CUDNN_STATUS_SUCCESS)
    s = api.set_attribute(pack, dnn::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, dnn::CUDNN_TYPE_VOID_PTR, n,
                          pointers.data());
  if (s == dnn::CUDNN_STATUS_SUCCESS)
    s = api.set_attribute(pack, dnn::CUDNN_ATTR_VARIANT_PACK_WORKSPACE, dnn::CUDNN_TYPE_VOID_PTR, 1, &workspace);
  if (s == dnn::CUDNN_STATUS_SUCCESS) s = api.finalize(pack);
  if (s != dnn::CUDNN_STATUS_SUCCESS) fail("the variant pack", s);
  ctx.make_current();
  std::lock_guard<std::mutex> lock(dev.mu);
  if (auto r = api.set_stream(dev.handle, stream ? stream : ctx.stream); r != dnn::CUDNN_STATUS_SUCCESS)
    fail("cudnnSetStream", r);
  if (auto r = api.execute(dev.handle, graph->plan(which), pack); r != dnn::CUDNN_STATUS_SUCCESS)
    fail("cudnnBackendExecute", r);
}

inline void CudnnAttentionPlan::autotune(const std::vector<void*>& args, const std::function<void()>& prepare) const {
  std::lock_guard<std::mutex> lock(tune_mu_);
  if (tuned_) return;
  tuned_ = true;
  try {
    while (graph->plan_count() < kTunedCandidates && graph->add_plan()) {}
  } catch (const detail::CudnnRefusal& r) {
    log(LogChannel::perf, "cuDNN autotune of " + problem.str() + ": " + r.why);
  }
  grow_scratch();
  const std::size_t n = graph->plan_count();
  if (n < 2) return;
  if (prepare) prepare();
  CudaContext& ctx = cuda_context(problem.device);
  CudaEvent start(ctx), stop(ctx);
  auto time = [&](std::size_t i, int reps) {
    start.record();
    for (int r = 0; r < reps; ++r) enqueue(i, args, nullptr);
    stop.record();
    stop.synchronize();
    return static_cast<double>(stop.elapsed_ms_since(start)) / 1000.0 / reps;
  };
  std::vector<double> seconds;
  const std::size_t best = pick_fastest_by(n, time, {}, &seconds);
  chosen_.store(best);
  tuned_ms_.clear();
  std::string text;
  char ms[32];
  for (std::size_t i = 0; i < seconds.size(); ++i) {
    tuned_ms_.push_back(seconds[i] * 1e3);
    std::snprintf(ms, sizeof ms, "%.3f", seconds[i] * 1e3);
    text += std::string(i ? ", " : " ") + ms + (i == best ? " (chosen)" : "");
  }
  log(LogChannel::perf, "cuDNN autotune of " + problem.str() + ", " + std::to_string(n) + " of " +
                            std::to_string(graph->config_count()) + " engine configurations, ms:" + text);
}

}  // namespace kiln::runtime
