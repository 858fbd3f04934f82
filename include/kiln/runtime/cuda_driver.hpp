#pragma once
// The CUDA driver API, loaded at run time with dlopen (never linked): the same binary runs on a
// machine without a GPU, where cuda_available() is false and cuda_unavailable_reason() says why.
// The declarations below are our own (CUresult as int, opaque handles), so kiln compiles without
// the CUDA headers; tests/runtime/test_cuda_driver.cpp checks them against <cuda.h> where present.
//
// Symbols are resolved by the names <cuda.h> maps the API to (cuMemcpyHtoDAsync ->
// cuMemcpyHtoDAsync_v2, cuStreamDestroy -> cuStreamDestroy_v2, cuGraphInstantiate ->
// cuGraphInstantiateWithFlags, ...): the unversioned symbols are the old ABIs (32-bit sizes, other
// parameters). Contexts are primary contexts, so no cuCtxCreate_v* question arises.
#include <dlfcn.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/env.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/index_fault.hpp"

namespace kiln::runtime::cu {

// Minimal driver API types. The names follow <cuda.h> but live in this namespace, so a
// translation unit may include both.
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
struct CUctx_st;
struct CUmod_st;
struct CUfunc_st;
struct CUstream_st;
struct CUevent_st;
struct CUgraph_st;
struct CUgraphExec_st;
struct CUmemPoolHandle_st;
using CUcontext = CUctx_st*;
using CUmodule = CUmod_st*;
using CUfunction = CUfunc_st*;
using CUstream = CUstream_st*;
using CUevent = CUevent_st*;
using CUgraph = CUgraph_st*;
using CUgraphExec = CUgraphExec_st*;
struct CUgraphNode_st;
using CUgraphNode = CUgraphNode_st*;
using CUmemoryPool = CUmemPoolHandle_st*;

enum CUdevice_attribute : int {
  CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1,
  CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X = 5,
  CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y = 6,
  CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK = 8,
  CU_DEVICE_ATTRIBUTE_WARP_SIZE = 10,
  CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
  CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38,
  CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR = 39,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
  CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81,
  CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
  CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115,
};

enum CUfunction_attribute : int {
  CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0,
  CU_FUNC_ATTRIBUTE_NUM_REGS = 4,
  CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
};

enum CUmemPool_attribute : int {
  CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4,
  CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7,
  CU_MEMPOOL_ATTR_USED_MEM_HIGH = 8,
};

/// The CUpointer_attribute values kiln asks about, and CUmemorytype's.
enum CUpointer_attribute : int {
  CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
  CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
  CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
};
inline constexpr unsigned CU_MEMORYTYPE_HOST = 1, CU_MEMORYTYPE_DEVICE = 2;

enum CUstreamCaptureMode : int {
  CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
  CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
  CU_STREAM_CAPTURE_MODE_RELAXED = 2,
};

/// CUDA_KERNEL_NODE_PARAMS_v2 of <cuda.h> (CUDA 12.0+): one kernel launch as a graph node.
/// `kern` and `ctx` stay null (the function and the current context are used).
struct KernelNodeParams {
  CUfunction func = nullptr;
  unsigned grid_x = 1, grid_y = 1, grid_z = 1;
  unsigned block_x = 1, block_y = 1, block_z = 1;
  unsigned shared_bytes = 0;
  void** kernel_params = nullptr;
  void** extra = nullptr;
  void* kern = nullptr;
  CUcontext ctx = nullptr;
};

inline constexpr CUresult CUDA_SUCCESS = 0;
inline constexpr CUresult CUDA_ERROR_INVALID_VALUE = 1;
inline constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
inline constexpr CUresult CUDA_ERROR_DEINITIALIZED = 4;
inline constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
inline constexpr CUresult CUDA_ERROR_NOT_READY = 600;
inline constexpr unsigned CU_STREAM_DEFAULT = 0x0;
inline constexpr unsigned CU_STREAM_NON_BLOCKING = 0x1;
inline constexpr unsigned CU_EVENT_DEFAULT = 0x0;
inline constexpr unsigned CU_EVENT_DISABLE_TIMING = 0x2;

}  // namespace kiln::runtime::cu

namespace kiln::runtime {

namespace detail {

/// The driver entry points kiln uses. Each member's comment names the symbol it is loaded from.
struct CudaDriverApi {
  using CUresult = cu::CUresult;
  CUresult (*init)(unsigned) = nullptr;                                                    // cuInit
  CUresult (*driver_get_version)(int*) = nullptr;                                          // cuDriverGetVersion
  CUresult (*device_get_count)(int*) = nullptr;                                            // cuDeviceGetCount
  CUresult (*device_get)(cu::CUdevice*, int) = nullptr;                                    // cuDeviceGet
  CUresult (*device_get_name)(char*, int, cu::CUdevice) = nullptr;                         // cuDeviceGetName
  CUresult (*device_get_attribute)(int*, cu::CUdevice_attribute, cu::CUdevice) = nullptr;  // cuDeviceGetAttribute
  CUresult (*device_total_mem)(std::size_t*, cu::CUdevice) = nullptr;                      // cuDeviceTotalMem_v2
  CUresult (*primary_ctx_retain)(cu::CUcontext*, cu::CUdevice) = nullptr;                  // cuDevicePrimaryCtxRetain
  CUresult (*primary_ctx_release)(cu::CUdevice) = nullptr;                             // cuDevicePrimaryCtxRelease_v2
  CUresult (*ctx_set_current)(cu::CUcontext) = nullptr;                                // cuCtxSetCurrent
  CUresult (*ctx_get_current)(cu::CUcontext*) = nullptr;                               // cuCtxGetCurrent
  CUresult (*ctx_synchronize)() = nullptr;                                             // cuCtxSynchronize
  CUresult (*stream_create)(cu::CUstream*, unsigned) = nullptr;                        // cuStreamCreate
  CUresult (*stream_destroy)(cu::CUstream) = nullptr;                                  // cuStreamDestroy_v2
  CUresult (*stream_synchronize)(cu::CUstream) = nullptr;                              // cuStreamSynchronize
  CUresult (*mem_alloc_async)(cu::CUdeviceptr*, std::size_t, cu::CUstream) = nullptr;  // cuMemAllocAsync
  CUresult (*mem_free_async)(cu::CUdeviceptr, cu::CUstream) = nullptr;                 // cuMemFreeAsync
  CUresult (*device_get_default_mem_pool)(cu::CUmemoryPool*, cu::CUdevice) = nullptr;  // cuDeviceGetDefaultMemPool
  CUresult (*mem_pool_set_attribute)(cu::CUmemoryPool, cu::CUmemPool_attribute,
                                     void*) = nullptr;                    // cuMemPoolSetAttribute
  CUresult (*mem_pool_trim_to)(cu::CUmemoryPool, std::size_t) = nullptr;  // cuMemPoolTrimTo
  CUresult (*mem_pool_get_attribute)(cu::CUmemoryPool, cu::CUmemPool_attribute,
                                     void*) = nullptr;  // cuMemPoolGetAttribute
  CUresult (*mem_get_info)(std::size_t*, std::size_t*) = nullptr;         // cuMemGetInfo_v2
  CUresult (*memcpy_htod_async)(cu::CUdeviceptr, const void*, std::size_t,
                                cu::CUstream) = nullptr;                                       // cuMemcpyHtoDAsync_v2
  CUresult (*memcpy_dtoh_async)(void*, cu::CUdeviceptr, std::size_t, cu::CUstream) = nullptr;  // cuMemcpyDtoHAsync_v2
  CUresult (*memcpy_dtod_async)(cu::CUdeviceptr, cu::CUdeviceptr, std::size_t,
                                cu::CUstream) = nullptr;  // cuMemcpyDtoDAsync_v2
  CUresult (*memset_d8_async)(cu::CUdeviceptr, unsigned char, std::size_t, cu::CUstream) = nullptr;  // cuMemsetD8Async
  CUresult (*module_load_data)(cu::CUmodule*, const void*) = nullptr;                                // cuModuleLoadData
  CUresult (*module_get_function)(cu::CUfunction*, cu::CUmodule, const char*) = nullptr;  // cuModuleGetFunction
  CUresult (*module_unload)(cu::CUmodule) = nullptr;                                      // cuModuleUnload
  // Index faults (core/index_fault.hpp): optional; without them gathers are not range-checked on
  // the device (their reads are still clamped into range).
  CUresult (*module_get_global)(cu::CUdeviceptr*, std::size_t*, cu::CUmodule,
                                const char*) = nullptr;                          // cuModuleGetGlobal_v2
  CUresult (*mem_host_alloc)(void**, std::size_t, unsigned) = nullptr;           // cuMemHostAlloc
  CUresult (*mem_host_get_device_pointer)(cu::CUdeviceptr*, void*, unsigned) = nullptr;  // cuMemHostGetDevicePointer_v2
  // Optional: without it from_blob cannot check which device a pointer's memory is on.
  CUresult (*pointer_get_attribute)(void*, cu::CUpointer_attribute, cu::CUdeviceptr) = nullptr;  // cuPointerGetAttribute
  CUresult (*launch_kernel)(cu::CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            cu::CUstream, void**, void**) = nullptr;                         // cuLaunchKernel
  CUresult (*func_set_attribute)(cu::CUfunction, cu::CUfunction_attribute, int) = nullptr;   // cuFuncSetAttribute
  CUresult (*func_get_attribute)(int*, cu::CUfunction_attribute, cu::CUfunction) = nullptr;  // cuFuncGetAttribute
  CUresult (*occupancy_max_active_blocks)(int*, cu::CUfunction, int,
                                          std::size_t) = nullptr;  // cuOccupancyMaxActiveBlocksPerMultiprocessor
  CUresult (*event_create)(cu::CUevent*, unsigned) = nullptr;      // cuEventCreate
  CUresult (*event_record)(cu::CUevent, cu::CUstream) = nullptr;   // cuEventRecord
  CUresult (*event_synchronize)(cu::CUevent) = nullptr;            // cuEventSynchronize
  CUresult (*event_query)(cu::CUevent) = nullptr;                  // cuEventQuery
  CUresult (*stream_wait_event)(cu::CUstream, cu::CUevent, unsigned) = nullptr;  // cuStreamWaitEvent
  CUresult (*event_elapsed_time)(float*, cu::CUevent,
                                 cu::CUevent) = nullptr;           // cuEventElapsedTime_v2, else cuEventElapsedTime
  CUresult (*event_destroy)(cu::CUevent) = nullptr;                // cuEventDestroy_v2
  CUresult (*get_error_name)(CUresult, const char**) = nullptr;    // cuGetErrorName
  CUresult (*get_error_string)(CUresult, const char**) = nullptr;  // cuGetErrorString
  CUresult (*stream_begin_capture)(cu::CUstream, cu::CUstreamCaptureMode) = nullptr;  // cuStreamBeginCapture_v2
  CUresult (*stream_end_capture)(cu::CUstream, cu::CUgraph*) = nullptr;               // cuStreamEndCapture
  CUresult (*graph_instantiate)(cu::CUgraphExec*, cu::CUgraph,
                                unsigned long long) = nullptr;        // cuGraphInstantiateWithFlags
  CUresult (*graph_launch)(cu::CUgraphExec, cu::CUstream) = nullptr;  // cuGraphLaunch
  CUresult (*graph_exec_destroy)(cu::CUgraphExec) = nullptr;          // cuGraphExecDestroy
  CUresult (*graph_destroy)(cu::CUgraph) = nullptr;                   // cuGraphDestroy
  // Launch graphs (runtime/cuda_graph.hpp, CudaLaunchGraph): optional too.
  CUresult (*graph_create)(cu::CUgraph*, unsigned) = nullptr;  // cuGraphCreate
  CUresult (*graph_add_kernel_node)(cu::CUgraphNode*, cu::CUgraph, const cu::CUgraphNode*, std::size_t,
                                    const cu::KernelNodeParams*) = nullptr;  // cuGraphAddKernelNode_v2
  CUresult (*graph_exec_kernel_node_set_params)(cu::CUgraphExec, cu::CUgraphNode,
                                                const cu::KernelNodeParams*) =
      nullptr;  // cuGraphExecKernelNodeSetParams_v2
};

/// What loading the driver found: the API table, or why it is unusable.
struct CudaDriverState {
  void* handle = nullptr;
  std::string path;    ///< the library asked for
  std::string reason;  ///< empty when usable
  CudaDriverApi api;
  int driver_version = 0;  ///< e.g. 12040 for CUDA 12.4
  int device_count = 0;
  std::string graphs_missing;         ///< CUDA graph entry points the driver lacks (empty: all there)
  std::string launch_graphs_missing;  ///< the same for launch graphs (runtime::CudaLaunchGraph)
  bool ok() const { return reason.empty() && handle != nullptr; }
};

/// The library that KILN_LIBCUDA_PATH names, else "libcuda.so.1".
inline std::string libcuda_path() { return env::get("KILN_LIBCUDA_PATH", "libcuda.so.1"); }

/// Names of the common driver errors, for when cuGetErrorName itself is unusable (a stub library).
inline const char* fallback_cuda_error_name(cu::CUresult r) {
  switch (r) {
    case 0:
      return "CUDA_SUCCESS";
    case 1:
      return "CUDA_ERROR_INVALID_VALUE";
    case 2:
      return "CUDA_ERROR_OUT_OF_MEMORY";
    case 3:
      return "CUDA_ERROR_NOT_INITIALIZED";
    case 4:
      return "CUDA_ERROR_DEINITIALIZED";
    case 34:
      return "CUDA_ERROR_STUB_LIBRARY";
    case 35:
      return "CUDA_ERROR_INSUFFICIENT_DRIVER";
    case 100:
      return "CUDA_ERROR_NO_DEVICE";
    case 101:
      return "CUDA_ERROR_INVALID_DEVICE";
    case 200:
      return "CUDA_ERROR_INVALID_IMAGE";
    case 201:
      return "CUDA_ERROR_INVALID_CONTEXT";
    case 209:
      return "CUDA_ERROR_NO_BINARY_FOR_GPU";
    case 222:
      return "CUDA_ERROR_UNSUPPORTED_PTX_VERSION";
    case 700:
      return "CUDA_ERROR_ILLEGAL_ADDRESS";
    case 803:
      return "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH";
    case 804:
      return "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE";
    case 999:
      return "CUDA_ERROR_UNKNOWN";
    default:
      return nullptr;
  }
}

/// "CUDA_ERROR_OUT_OF_MEMORY: out of memory" for a result code.
inline std::string describe_cuda_error(const CudaDriverApi& api, cu::CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (api.get_error_name && api.get_error_name(r, &name) != cu::CUDA_SUCCESS) name = nullptr;
  if (api.get_error_string && api.get_error_string(r, &text) != cu::CUDA_SUCCESS) text = nullptr;
  if (!name) name = fallback_cuda_error_name(r);
  std::string out = name ? std::string(name) : "CUDA error " + std::to_string(r);
  if (text) out += std::string(": ") + text;
  return out;
}

/// Opens the driver at `path`, resolves every symbol, runs cuInit(0) and counts devices. Never
/// throws: a failure is described in the returned state's `reason`. The library stays loaded
/// (the driver must outlive every handle that it gave out).
inline CudaDriverState load_cuda_driver(const std::string& path) {
  CudaDriverState s;
  s.path = path;
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    s.reason = "the CUDA driver library '" + path + "' could not be loaded (" + (e ? e : "dlopen failed") +
               "); install the NVIDIA driver or set KILN_LIBCUDA_PATH";
    return s;
  }
  auto& a = s.api;
  std::string missing;
  // Tries each name in turn: the versioned symbol that <cuda.h> maps to comes first.
  auto sym = [&](auto& fn, std::initializer_list<const char*> names) {
    for (const char* n : names) {
      if (void* p = dlsym(h, n)) {
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
        return;
      }
    }
    missing += std::string(missing.empty() ? "" : ", ") + *names.begin();
  };
  sym(a.init, {"cuInit"});
  sym(a.driver_get_version, {"cuDriverGetVersion"});
  sym(a.device_get_count, {"cuDeviceGetCount"});
  sym(a.device_get, {"cuDeviceGet"});
  sym(a.device_get_name, {"cuDeviceGetName"});
  sym(a.device_get_attribute, {"cuDeviceGetAttribute"});
  sym(a.device_total_mem, {"cuDeviceTotalMem_v2"});
  sym(a.primary_ctx_retain, {"cuDevicePrimaryCtxRetain"});
  sym(a.primary_ctx_release, {"cuDevicePrimaryCtxRelease_v2"});
  sym(a.ctx_set_current, {"cuCtxSetCurrent"});
  sym(a.ctx_get_current, {"cuCtxGetCurrent"});
  sym(a.ctx_synchronize, {"cuCtxSynchronize"});
  sym(a.stream_create, {"cuStreamCreate"});
  sym(a.stream_destroy, {"cuStreamDestroy_v2"});
  sym(a.stream_synchronize, {"cuStreamSynchronize"});
  sym(a.mem_alloc_async, {"cuMemAllocAsync"});
  sym(a.mem_free_async, {"cuMemFreeAsync"});
  sym(a.device_get_default_mem_pool, {"cuDeviceGetDefaultMemPool"});
  sym(a.mem_pool_set_attribute, {"cuMemPoolSetAttribute"});
  sym(a.mem_pool_trim_to, {"cuMemPoolTrimTo"});
  sym(a.mem_pool_get_attribute, {"cuMemPoolGetAttribute"});
  sym(a.mem_get_info, {"cuMemGetInfo_v2"});
  sym(a.memcpy_htod_async, {"cuMemcpyHtoDAsync_v2"});
  sym(a.memcpy_dtoh_async, {"cuMemcpyDtoHAsync_v2"});
  sym(a.memcpy_dtod_async, {"cuMemcpyDtoDAsync_v2"});
  sym(a.memset_d8_async, {"cuMemsetD8Async"});
  sym(a.module_load_data, {"cuModuleLoadData"});
  sym(a.module_get_function, {"cuModuleGetFunction"});
  sym(a.module_unload, {"cuModuleUnload"});
  sym(a.launch_kernel, {"cuLaunchKernel"});
  sym(a.func_set_attribute, {"cuFuncSetAttribute"});
  sym(a.func_get_attribute, {"cuFuncGetAttribute"});
  sym(a.occupancy_max_active_blocks, {"cuOccupancyMaxActiveBlocksPerMultiprocessor"});
  sym(a.event_create, {"cuEventCreate"});
  sym(a.event_record, {"cuEventRecord"});
  sym(a.event_synchronize, {"cuEventSynchronize"});
  sym(a.event_query, {"cuEventQuery"});
  sym(a.stream_wait_event, {"cuStreamWaitEvent"});
  // _v2 appeared in CUDA 12.8 with the same signature; older drivers only have the original.
  sym(a.event_elapsed_time, {"cuEventElapsedTime_v2", "cuEventElapsedTime"});
  sym(a.event_destroy, {"cuEventDestroy_v2"});
  sym(a.get_error_name, {"cuGetErrorName"});
  sym(a.get_error_string, {"cuGetErrorString"});
  // Optional entry points: a missing one is named in `into`, and what needs it is not used.
  auto optional_sym = [&](std::string& into, auto& fn, const char* name) {
    if (void* p = dlsym(h, name))
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    else
      into += std::string(into.empty() ? "" : ", ") + name;
  };
  // CUDA graphs: without them, "reduce-overhead" launches kernels one by one (runtime/
  // cuda_graph.hpp says why in its log line), and everything else works.
  std::string graph_missing;
  optional_sym(graph_missing, a.stream_begin_capture, "cuStreamBeginCapture_v2");
  optional_sym(graph_missing, a.stream_end_capture, "cuStreamEndCapture");
  optional_sym(graph_missing, a.graph_instantiate, "cuGraphInstantiateWithFlags");
  optional_sym(graph_missing, a.graph_launch, "cuGraphLaunch");
  optional_sym(graph_missing, a.graph_exec_destroy, "cuGraphExecDestroy");
  optional_sym(graph_missing, a.graph_destroy, "cuGraphDestroy");
  s.graphs_missing = graph_missing;
  // Launch graphs need three more (the _v2 forms take KernelNodeParams as declared; they
  // appeared in CUDA 12.0): without them kernels are launched one by one.
  std::string launch_missing;
  optional_sym(launch_missing, a.graph_create, "cuGraphCreate");
  optional_sym(launch_missing, a.graph_add_kernel_node, "cuGraphAddKernelNode_v2");
  optional_sym(launch_missing, a.graph_exec_kernel_node_set_params, "cuGraphExecKernelNodeSetParams_v2");
  std::string fault_missing;
  optional_sym(fault_missing, a.module_get_global, "cuModuleGetGlobal_v2");
  optional_sym(fault_missing, a.mem_host_alloc, "cuMemHostAlloc");
  optional_sym(fault_missing, a.mem_host_get_device_pointer, "cuMemHostGetDevicePointer_v2");
  std::string pointer_missing;
  optional_sym(pointer_missing, a.pointer_get_attribute, "cuPointerGetAttribute");
  s.launch_graphs_missing =
      graph_missing.empty() ? launch_missing : graph_missing + (launch_missing.empty() ? "" : ", " + launch_missing);
  s.handle = h;
  if (!missing.empty()) {
    s.reason = "the CUDA driver '" + path + "' lacks " + missing +
               " (kiln needs a driver for CUDA 11.4 or newer; update the NVIDIA driver)";
    return s;
  }
  cu::CUresult r = a.init(0);
  if (r != cu::CUDA_SUCCESS) {
    s.reason = "cuInit failed with the CUDA driver '" + path + "': " + describe_cuda_error(a, r);
    return s;
  }
  if (a.driver_get_version(&s.driver_version) != cu::CUDA_SUCCESS) s.driver_version = 0;
  r = a.device_get_count(&s.device_count);
  if (r != cu::CUDA_SUCCESS) {
    s.reason = "cuDeviceGetCount failed: " + describe_cuda_error(a, r);
    return s;
  }
  if (s.device_count <= 0) s.reason = "the CUDA driver '" + path + "' found no CUDA device";
  return s;
}

/// The process's driver, loaded on first use (KILN_LIBCUDA_PATH is read then, once).
inline const CudaDriverState& cuda_driver_state() {
  static const CudaDriverState state = load_cuda_driver(libcuda_path());
  return state;
}

/// Throws DeviceError unless the driver is usable; `what` says what was being attempted.
inline const CudaDriverApi& require_cuda_driver(std::string_view what) {
  const auto& s = cuda_driver_state();
  if (!s.ok()) [[unlikely]]
    throw DeviceError("kiln: cannot " + std::string(what) + ": CUDA is unavailable: " + s.reason);
  return s.api;
}

/// As above, with `what()` called only when CUDA is unavailable.
template <class F>
requires std::is_invocable_r_v<std::string, F>
inline const CudaDriverApi& require_cuda_driver(F&& what) {
  const auto& s = cuda_driver_state();
  if (!s.ok()) [[unlikely]]
    return require_cuda_driver(std::string_view(std::forward<F>(what)()));
  return s.api;
}

/// "12.4" from cuDriverGetVersion's 12040.
inline std::string cuda_version_text(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

[[noreturn, gnu::cold, gnu::noinline]] inline void throw_cuda_error(cu::CUresult r, const char* function,
                                                                    std::string_view context) {
  const auto& s = cuda_driver_state();
  std::string msg = "kiln: " + std::string(function) + " failed (" + describe_cuda_error(s.api, r) + ")";
  if (!context.empty()) msg += " " + std::string(context);
  throw DeviceError(msg);
}

/// Throws DeviceError naming `function` and the error's name and text unless `r` is success.
inline void cuda_check(cu::CUresult r, const char* function, std::string_view context = {}) {
  if (r != cu::CUDA_SUCCESS) [[unlikely]]
    throw_cuda_error(r, function, context);
}

/// As above; `context()` makes the context text only when there is an error to report (the
/// success path of copies and launches builds no strings).
template <class F>
requires std::is_invocable_r_v<std::string, F>
inline void cuda_check(cu::CUresult r, const char* function, F&& context) {
  if (r != cu::CUDA_SUCCESS) [[unlikely]]
    throw_cuda_error(r, function, std::forward<F>(context)());
}

}  // namespace detail

/// The driver's function table; throws DeviceError (with the reason) when CUDA is unavailable.
inline const detail::CudaDriverApi& cuda_driver() { return detail::require_cuda_driver("use the CUDA driver"); }

/// Number of CUDA devices (0 when CUDA is unavailable).
inline int cuda_device_count() {
  const auto& s = detail::cuda_driver_state();
  return s.ok() ? s.device_count : 0;
}

/// The driver's CUDA version, "12.4"; throws DeviceError when CUDA is unavailable.
inline std::string cuda_driver_version() {
  detail::require_cuda_driver("query the CUDA driver version");
  return detail::cuda_version_text(detail::cuda_driver_state().driver_version);
}

/// One device's primary context, its default stream and what kernels need to know about it.
/// Made once per device on first use and kept for the life of the process (destroying streams
/// and contexts during static destruction races the driver's own teardown).
class CudaContext {
 public:
  int index = 0;
  cu::CUdevice device = 0;
  cu::CUcontext context = nullptr;
  cu::CUstream stream = nullptr;    ///< kiln's stream on this device: all its work is ordered on it
  cu::CUmemoryPool pool = nullptr;  ///< default memory pool; null when the device has none
  std::string name;                 ///< e.g. "NVIDIA H200"
  int cc_major = 0, cc_minor = 0;   ///< compute capability
  int sm_count = 0;
  int max_threads_per_block = 0;
  int max_threads_per_sm = 0;
  int warp_size = 32;
  int max_shared_per_block = 0;        ///< bytes without opting in
  int max_shared_per_block_optin = 0;  ///< bytes with cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)
  int max_shared_per_sm = 0;
  int l2_cache_bytes = 0;
  int max_grid_x = 0, max_grid_y = 0;
  std::size_t total_memory = 0;

 private:
  std::once_flag fault_once_;
  long long* fault_host_ = nullptr;  ///< the index fault record (core/index_fault.hpp), host side
  cu::CUdeviceptr fault_device_ = 0;

 public:
  explicit CudaContext(int device_index) : index(device_index) {
    const auto& api = detail::require_cuda_driver("use cuda:" + std::to_string(device_index));
    const std::string where = "on cuda:" + std::to_string(index);
    detail::cuda_check(api.device_get(&device, index), "cuDeviceGet", where);
    char buf[256] = {};
    detail::cuda_check(api.device_get_name(buf, sizeof(buf) - 1, device), "cuDeviceGetName", where);
    name = buf;
    auto attr = [&](cu::CUdevice_attribute a) {
      int v = 0;
      detail::cuda_check(api.device_get_attribute(&v, a, device), "cuDeviceGetAttribute", where);
      return v;
    };
    cc_major = attr(cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    cc_minor = attr(cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    sm_count = attr(cu::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    max_threads_per_block = attr(cu::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
    max_threads_per_sm = attr(cu::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR);
    warp_size = attr(cu::CU_DEVICE_ATTRIBUTE_WARP_SIZE);
    max_shared_per_block = attr(cu::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK);
    max_shared_per_block_optin = attr(cu::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
    max_shared_per_sm = attr(cu::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
    l2_cache_bytes = attr(cu::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
    max_grid_x = attr(cu::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X);
    max_grid_y = attr(cu::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y);
    detail::cuda_check(api.device_total_mem(&total_memory, device), "cuDeviceTotalMem", where);
    detail::cuda_check(api.primary_ctx_retain(&context, device), "cuDevicePrimaryCtxRetain", where);
    detail::cuda_check(api.ctx_set_current(context), "cuCtxSetCurrent", where);
    // A blocking stream (not CU_STREAM_NON_BLOCKING): it stays ordered after work that other
    // code put on the legacy default stream (e.g. a user's cudaMemcpy into a from_blob buffer).
    detail::cuda_check(api.stream_create(&stream, cu::CU_STREAM_DEFAULT), "cuStreamCreate", where);
    if (attr(cu::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)) {
      detail::cuda_check(api.device_get_default_mem_pool(&pool, device), "cuDeviceGetDefaultMemPool", where);
      // Keep freed memory in the pool instead of returning it to the OS at every synchronisation,
      // so that steady-state allocation is a pool hit.
      std::uint64_t threshold = UINT64_MAX;
      detail::cuda_check(api.mem_pool_set_attribute(pool, cu::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold),
                         "cuMemPoolSetAttribute(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)", where);
    }
  }
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  /// The cubin target of this device: "sm_90" on an H100/H200.
  std::string arch() const { return "sm_" + std::to_string(cc_major) + std::to_string(cc_minor); }

  /// Makes this device's primary context current on the calling thread (a no-op when it is).
  void make_current() const {
    const auto& api = detail::cuda_driver_state().api;
    cu::CUcontext cur = nullptr;
    if (api.ctx_get_current(&cur) == cu::CUDA_SUCCESS && cur == context) return;
    detail::cuda_check(api.ctx_set_current(context), "cuCtxSetCurrent",
                       [&] { return "on cuda:" + std::to_string(index); });
  }

  /// Waits for all of kiln's work on this device, then raises the IndexError of a gather
  /// that read out of range in that work (core/index_fault.hpp).
  void synchronize() const {
    make_current();
    detail::cuda_check(detail::cuda_driver_state().api.stream_synchronize(stream), "cuStreamSynchronize", [&] {
      return "on cuda:" + std::to_string(index) + " (an earlier asynchronous error may surface here)";
    });
    raise_index_fault();
  }

  /// The device address of this device's index fault record (mapped pinned host memory, made on
  /// first use), or 0 when the driver cannot map host memory.
  cu::CUdeviceptr index_fault_record() {
    std::call_once(fault_once_, [&] {
      const auto& api = detail::cuda_driver_state().api;
      if (!api.mem_host_alloc || !api.mem_host_get_device_pointer) return;
      make_current();
      void* host = nullptr;
      constexpr unsigned kPortable = 0x01, kDeviceMap = 0x02;  // CU_MEMHOSTALLOC_PORTABLE, _DEVICEMAP
      if (api.mem_host_alloc(&host, 64, kPortable | kDeviceMap) != cu::CUDA_SUCCESS) return;
      std::memset(host, 0, 64);
      cu::CUdeviceptr dev = 0;
      if (api.mem_host_get_device_pointer(&dev, host, 0) != cu::CUDA_SUCCESS) return;
      fault_host_ = static_cast<long long*>(host);
      fault_device_ = dev;
    });
    return fault_device_;
  }

  /// Throws the IndexError a kernel recorded on this device (once it finished: after a
  /// synchronisation).
  void raise_index_fault() const {
    if (fault_host_) kiln::detail::raise_index_fault(fault_host_);
  }

  /// Waits for the device, then forgets a fault its work recorded: for warm-up runs over
  /// buffers that hold no user's data yet (a CUDA graph instance's, before inputs are copied in).
  void synchronize_discarding_faults() const {
    make_current();
    detail::cuda_check(detail::cuda_driver_state().api.stream_synchronize(stream), "cuStreamSynchronize",
                       [&] { return "on cuda:" + std::to_string(index) + " after a warm-up run"; });
    if (!fault_host_) return;
    volatile long long* r = fault_host_;
    r[1] = 0;
    r[2] = 0;
    r[3] = 0;
    r[0] = 0;
  }
};

namespace detail {
struct CudaContexts {
  std::vector<std::once_flag> once;
  std::vector<std::atomic<CudaContext*>> ctx;
  explicit CudaContexts(int n) : once(static_cast<std::size_t>(n)), ctx(static_cast<std::size_t>(n)) {}
};
/// Set once kiln has made a CUDA context: before that no pointer can be memory kiln gave out on
/// a GPU, and asking the driver about one would load it (from_blob of host memory must not).
inline std::atomic<bool>& cuda_context_made() {
  static std::atomic<bool> made{false};
  return made;
}
inline CudaContexts& cuda_contexts() {
  // Never destroyed, on purpose (see CudaContext).
  static CudaContexts* all = new CudaContexts(cuda_device_count());
  return *all;
}
}  // namespace detail

/// Device `index`'s context, made on first use. Throws DeviceError when CUDA is unavailable or
/// the device does not exist.
inline CudaContext& cuda_context(int index) {
  auto& all = detail::cuda_contexts();
  if (index >= 0 && static_cast<std::size_t>(index) < all.ctx.size()) [[likely]] {
    if (CudaContext* c = all.ctx[static_cast<std::size_t>(index)].load(std::memory_order_acquire)) [[likely]]
      return *c;
    std::call_once(all.once[static_cast<std::size_t>(index)], [&] {
      all.ctx[static_cast<std::size_t>(index)].store(new CudaContext(index), std::memory_order_release);
      detail::cuda_context_made().store(true, std::memory_order_release);
    });
    return *all.ctx[static_cast<std::size_t>(index)].load(std::memory_order_acquire);
  }
  detail::require_cuda_driver("use cuda:" + std::to_string(index));
  throw DeviceError("kiln: cuda:" + std::to_string(index) + " does not exist (this machine has " +
                    std::to_string(all.ctx.size()) + " CUDA device" + (all.ctx.size() == 1 ? "" : "s") + ")");
}

/// Launch geometry.
struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

/// Launches `fn` on device `ctx`'s stream. `args` points to the kernel's arguments, one pointer
/// per parameter (cuLaunchKernel's kernelParams). Does not count stats (the backend does).
inline void launch_kernel(const CudaContext& ctx, cu::CUfunction fn, Dim3 grid, Dim3 block, unsigned shared_bytes,
                          void** args) {
  const auto& api = detail::cuda_driver_state().api;
  ctx.make_current();
  cu::CUresult r =
      api.launch_kernel(fn, grid.x, grid.y, grid.z, block.x, block.y, block.z, shared_bytes, ctx.stream, args, nullptr);
  if (r != cu::CUDA_SUCCESS) [[unlikely]]
    detail::throw_cuda_error(r, "cuLaunchKernel",
                             "on cuda:" + std::to_string(ctx.index) + " with grid (" + std::to_string(grid.x) + "," +
                                 std::to_string(grid.y) + "," + std::to_string(grid.z) + ") block (" +
                                 std::to_string(block.x) + "," + std::to_string(block.y) + "," +
                                 std::to_string(block.z) + ") and " + std::to_string(shared_bytes) +
                                 " bytes of dynamic shared memory");
}

/// Lets `fn` use up to `bytes` of dynamic shared memory (needed above 48 KiB).
inline void set_max_dynamic_shared(const CudaContext& ctx, cu::CUfunction fn, int bytes) {
  ctx.make_current();
  detail::cuda_check(detail::cuda_driver_state().api.func_set_attribute(
                         fn, cu::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes),
                     "cuFuncSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)",
                     "asking for " + std::to_string(bytes) + " bytes on cuda:" + std::to_string(ctx.index) +
                         " (opt-in limit " + std::to_string(ctx.max_shared_per_block_optin) + ")");
}

/// How many blocks of `block_size` threads of `fn` fit on one multiprocessor at once.
inline int max_active_blocks_per_sm(const CudaContext& ctx, cu::CUfunction fn, int block_size,
                                    std::size_t dynamic_shared_bytes = 0) {
  ctx.make_current();
  int n = 0;
  detail::cuda_check(
      detail::cuda_driver_state().api.occupancy_max_active_blocks(&n, fn, block_size, dynamic_shared_bytes),
      "cuOccupancyMaxActiveBlocksPerMultiprocessor");
  return n;
}

/// A CUDA event on one device, for ordering and for timing kernels (benchmarks use these).
class CudaEvent {
 public:
  explicit CudaEvent(const CudaContext& ctx, bool timing = true) : ctx_(&ctx) {
    ctx.make_current();
    detail::cuda_check(cuda_driver().event_create(&event_, timing ? cu::CU_EVENT_DEFAULT : cu::CU_EVENT_DISABLE_TIMING),
                       "cuEventCreate");
  }
  ~CudaEvent() {
    // Errors are ignored: a destructor cannot throw, and a failed destroy leaks one event.
    if (event_) detail::cuda_driver_state().api.event_destroy(event_);
  }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  /// Records the event on the device's stream.
  void record() {
    ctx_->make_current();
    detail::cuda_check(detail::cuda_driver_state().api.event_record(event_, ctx_->stream), "cuEventRecord");
  }
  /// Waits until the work recorded before the event is done.
  void synchronize() {
    detail::cuda_check(detail::cuda_driver_state().api.event_synchronize(event_), "cuEventSynchronize");
  }
  /// Milliseconds from `start` to this event (both recorded and complete).
  float elapsed_ms_since(const CudaEvent& start) const {
    float ms = 0;
    detail::cuda_check(detail::cuda_driver_state().api.event_elapsed_time(&ms, start.event_, event_),
                       "cuEventElapsedTime");
    return ms;
  }
  cu::CUevent handle() const { return event_; }

 private:
  const CudaContext* ctx_;
  cu::CUevent event_ = nullptr;
};

}  // namespace kiln::runtime

namespace kiln {

/// True when the CUDA driver loads, cuInit succeeds and at least one device exists.
inline bool cuda_available() { return runtime::detail::cuda_driver_state().ok(); }

/// Why CUDA is unavailable (no driver, a missing symbol, cuInit's error, no device); empty when
/// it is available.
inline std::string cuda_unavailable_reason() { return runtime::detail::cuda_driver_state().reason; }

}  // namespace kiln
