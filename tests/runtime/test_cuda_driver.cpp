// The CUDA driver loaded at run time, device memory and module launches. The first cases run
// anywhere (no GPU: the driver is absent, a stub, or a wrong library); the GPU cases return
// early with a message where cuda_available() is false and run on the GPU machine.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kiln/runtime/cuda_driver.hpp"
#include "kiln/runtime/cuda_memory.hpp"
#include "kiln/runtime/cuda_module.hpp"
#include "kiln/runtime/disk_cache.hpp"
#include "kiln/runtime/nvrtc.hpp"
#include "runtime_test_util.hpp"

#if __has_include(<cuda.h>)
#include <cuda.h>

#include <type_traits>

// Our declarations must match the driver's ABI: every table entry has the signature of the
// symbol it is loaded from, once our handle and enum types are mapped to <cuda.h>'s.
namespace kiln_cuda_abi {
namespace cu = kiln::runtime::cu;
template <class T>
struct To {
  using type = T;
};
template <class T>
using to_t = typename To<T>::type;
template <class T>
struct To<T*> {
  using type = to_t<T>*;
};
template <class T>
struct To<const T> {
  using type = const to_t<T>;
};
template <class R, class... A>
struct To<R (*)(A...)> {
  using type = to_t<R> (*)(to_t<A>...);
};
template <>
struct To<cu::CUctx_st> {
  using type = ::CUctx_st;
};
template <>
struct To<cu::CUmod_st> {
  using type = ::CUmod_st;
};
template <>
struct To<cu::CUfunc_st> {
  using type = ::CUfunc_st;
};
template <>
struct To<cu::CUstream_st> {
  using type = ::CUstream_st;
};
template <>
struct To<cu::CUevent_st> {
  using type = ::CUevent_st;
};
template <>
struct To<cu::CUgraph_st> {
  using type = ::CUgraph_st;
};
template <>
struct To<cu::CUgraphExec_st> {
  using type = ::CUgraphExec_st;
};
template <>
struct To<cu::CUmemPoolHandle_st> {
  using type = ::CUmemPoolHandle_st;
};
template <>
struct To<cu::CUdevice_attribute> {
  using type = ::CUdevice_attribute;
};
template <>
struct To<cu::CUfunction_attribute> {
  using type = ::CUfunction_attribute;
};
template <>
struct To<cu::CUmemPool_attribute> {
  using type = ::CUmemPool_attribute;
};
template <>
struct To<cu::CUstreamCaptureMode> {
  using type = ::CUstreamCaptureMode;
};
template <>
struct To<int> {
  using type = int;  // CUresult and CUdevice are int in our table; see the checks below
};

using Api = kiln::runtime::detail::CudaDriverApi;
static_assert(sizeof(::CUresult) == sizeof(int) && sizeof(::CUdevice) == sizeof(int));
static_assert(std::is_same_v<::CUdeviceptr, cu::CUdeviceptr>);
// CUresult is an enum in <cuda.h>: compare the signatures with it replaced by int.
template <class F>
struct ResultAsInt;
template <class... A>
struct ResultAsInt<::CUresult (*)(A...)> {
  using type = int (*)(A...);
};
#define KILN_CHECK_ABI(member, symbol) \
  static_assert(std::is_same_v<to_t<decltype(Api::member)>, ResultAsInt<decltype(&::symbol)>::type>, #symbol)
KILN_CHECK_ABI(driver_get_version, cuDriverGetVersion);
KILN_CHECK_ABI(device_get_count, cuDeviceGetCount);
KILN_CHECK_ABI(device_get_name, cuDeviceGetName);
KILN_CHECK_ABI(device_get_attribute, cuDeviceGetAttribute);
KILN_CHECK_ABI(device_total_mem, cuDeviceTotalMem_v2);
KILN_CHECK_ABI(primary_ctx_retain, cuDevicePrimaryCtxRetain);
KILN_CHECK_ABI(ctx_set_current, cuCtxSetCurrent);
KILN_CHECK_ABI(ctx_get_current, cuCtxGetCurrent);
KILN_CHECK_ABI(stream_create, cuStreamCreate);
KILN_CHECK_ABI(stream_destroy, cuStreamDestroy_v2);
KILN_CHECK_ABI(stream_synchronize, cuStreamSynchronize);
KILN_CHECK_ABI(mem_alloc_async, cuMemAllocAsync);
KILN_CHECK_ABI(mem_free_async, cuMemFreeAsync);
KILN_CHECK_ABI(device_get_default_mem_pool, cuDeviceGetDefaultMemPool);
KILN_CHECK_ABI(mem_pool_set_attribute, cuMemPoolSetAttribute);
KILN_CHECK_ABI(mem_pool_trim_to, cuMemPoolTrimTo);
KILN_CHECK_ABI(mem_get_info, cuMemGetInfo_v2);
KILN_CHECK_ABI(memcpy_htod_async, cuMemcpyHtoDAsync_v2);
KILN_CHECK_ABI(memcpy_dtoh_async, cuMemcpyDtoHAsync_v2);
KILN_CHECK_ABI(memcpy_dtod_async, cuMemcpyDtoDAsync_v2);
KILN_CHECK_ABI(memset_d8_async, cuMemsetD8Async);
KILN_CHECK_ABI(module_load_data, cuModuleLoadData);
KILN_CHECK_ABI(module_get_function, cuModuleGetFunction);
KILN_CHECK_ABI(module_unload, cuModuleUnload);
KILN_CHECK_ABI(launch_kernel, cuLaunchKernel);
KILN_CHECK_ABI(func_set_attribute, cuFuncSetAttribute);
KILN_CHECK_ABI(func_get_attribute, cuFuncGetAttribute);
KILN_CHECK_ABI(occupancy_max_active_blocks, cuOccupancyMaxActiveBlocksPerMultiprocessor);
KILN_CHECK_ABI(event_create, cuEventCreate);
KILN_CHECK_ABI(event_record, cuEventRecord);
KILN_CHECK_ABI(event_synchronize, cuEventSynchronize);
KILN_CHECK_ABI(event_elapsed_time, cuEventElapsedTime_v2);
KILN_CHECK_ABI(event_destroy, cuEventDestroy_v2);
KILN_CHECK_ABI(stream_begin_capture, cuStreamBeginCapture_v2);
KILN_CHECK_ABI(stream_end_capture, cuStreamEndCapture);
KILN_CHECK_ABI(graph_instantiate, cuGraphInstantiateWithFlags);
KILN_CHECK_ABI(graph_launch, cuGraphLaunch);
KILN_CHECK_ABI(graph_exec_destroy, cuGraphExecDestroy);
KILN_CHECK_ABI(graph_destroy, cuGraphDestroy);
#undef KILN_CHECK_ABI
static_assert(std::is_same_v<decltype(Api::init), int (*)(unsigned)>);
static_assert(std::is_same_v<decltype(Api::device_get), int (*)(int*, int)>);
static_assert(std::is_same_v<decltype(Api::primary_ctx_release), int (*)(int)>);
static_assert(std::is_same_v<decltype(Api::get_error_name), int (*)(int, const char**)>);
static_assert(std::is_same_v<decltype(Api::get_error_string), int (*)(int, const char**)>);

// The enumerators we declare have <cuda.h>'s values.
static_assert(int(cu::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK) == int(::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK));
static_assert(int(cu::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X) == int(::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X));
static_assert(int(cu::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y) == int(::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y));
static_assert(int(cu::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK) ==
              int(::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK));
static_assert(int(cu::CU_DEVICE_ATTRIBUTE_WARP_SIZE) == int(::CU_DEVICE_ATTRIBUTE_WARP_SIZE));
static_assert(int(cu::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) == int(::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT));
static_assert(int(cu::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE) == int(::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE));
static_assert(int(cu::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR) ==
              int(::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR));
static_assert(int(cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) ==
              int(::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR));
static_assert(int(cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) ==
              int(::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR));
static_assert(int(cu::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR) ==
              int(::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR));
static_assert(int(cu::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN) ==
              int(::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN));
static_assert(int(cu::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED) == int(::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED));
static_assert(int(cu::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK) == int(::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK));
static_assert(int(cu::CU_FUNC_ATTRIBUTE_NUM_REGS) == int(::CU_FUNC_ATTRIBUTE_NUM_REGS));
static_assert(int(cu::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) ==
              int(::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES));
static_assert(int(cu::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) == int(::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD));
static_assert(int(cu::CU_STREAM_CAPTURE_MODE_GLOBAL) == int(::CU_STREAM_CAPTURE_MODE_GLOBAL));
static_assert(int(cu::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == int(::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
static_assert(int(cu::CU_STREAM_CAPTURE_MODE_RELAXED) == int(::CU_STREAM_CAPTURE_MODE_RELAXED));
static_assert(cu::CUDA_SUCCESS == int(::CUDA_SUCCESS));
static_assert(cu::CUDA_ERROR_OUT_OF_MEMORY == int(::CUDA_ERROR_OUT_OF_MEMORY));
static_assert(cu::CUDA_ERROR_DEINITIALIZED == int(::CUDA_ERROR_DEINITIALIZED));
static_assert(cu::CUDA_ERROR_NO_DEVICE == int(::CUDA_ERROR_NO_DEVICE));
static_assert(cu::CU_STREAM_DEFAULT == unsigned(::CU_STREAM_DEFAULT));
static_assert(cu::CU_EVENT_DEFAULT == unsigned(::CU_EVENT_DEFAULT));
static_assert(cu::CU_EVENT_DISABLE_TIMING == unsigned(::CU_EVENT_DISABLE_TIMING));
}  // namespace kiln_cuda_abi
#endif

namespace {

namespace rt = kiln::runtime;

const char* const kStubLibcuda = "/usr/local/cuda/lib64/stubs/libcuda.so";

// The same kernels as test_nvrtc.cpp: a vectorised axpy with a scalar tail and a warp-shuffle
// block reduction.
const char* const kKernels = R"(
__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
extern "C" __global__ void axpy_f4(float a, const float* __restrict__ x, float* __restrict__ y, unsigned n) {
  const unsigned tid = blockIdx.x * blockDim.x + threadIdx.x, stride = gridDim.x * blockDim.x;
  const unsigned n4 = n / 4;
  const float4* x4 = reinterpret_cast<const float4*>(x);
  float4* y4 = reinterpret_cast<float4*>(y);
  for (unsigned i = tid; i < n4; i += stride) {
    float4 v = x4[i], w = y4[i];
    w.x = fmaf(a, v.x, w.x); w.y = fmaf(a, v.y, w.y); w.z = fmaf(a, v.z, w.z); w.w = fmaf(a, v.w, w.w);
    y4[i] = w;
  }
  for (unsigned i = n4 * 4 + tid; i < n; i += stride) y[i] = fmaf(a, x[i], y[i]);
}
extern "C" __global__ void block_sum(const float* __restrict__ x, float* __restrict__ out, unsigned n) {
  __shared__ float partial[32];
  float acc = 0.f;
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) acc += x[i];
  acc = warp_sum(acc);
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = lane < (blockDim.x + 31u) / 32u ? partial[lane] : 0.f;
    acc = warp_sum(acc);
    if (lane == 0) atomicAdd(out, acc);
  }
}
extern "C" __global__ void empty_kernel() {}
)";

bool skip_without_gpu() {
  if (kiln::cuda_available()) return false;
  MESSAGE("CUDA unavailable, GPU checks skipped: " << kiln::cuda_unavailable_reason());
  return true;
}

bool skip_without_nvrtc() {
  if (rt::nvrtc_available()) return false;
  MESSAGE("NVRTC unavailable, GPU module checks skipped: " << rt::nvrtc_unavailable_reason());
  return true;
}

}  // namespace

// ---- anywhere ---------------------------------------------------------------------------------

TEST_CASE("cuda driver: KILN_LIBCUDA_PATH naming a missing file makes CUDA unavailable, naming it") {
  kiln_test::ScopedEnv env("KILN_LIBCUDA_PATH", std::string("/nonexistent/kiln/libcuda.so.1"));
  CHECK(rt::detail::libcuda_path() == "/nonexistent/kiln/libcuda.so.1");
  // What cuda_available() does on first use, with the setting as it is now (the process-wide
  // state was fixed by whatever test ran first).
  auto state = rt::detail::load_cuda_driver(rt::detail::libcuda_path());
  CHECK_FALSE(state.ok());
  CHECK(state.reason.find("/nonexistent/kiln/libcuda.so.1") != std::string::npos);
  CHECK(state.reason.find("KILN_LIBCUDA_PATH") != std::string::npos);
}

TEST_CASE("cuda driver: the default library is libcuda.so.1") {
  kiln_test::ScopedEnv env("KILN_LIBCUDA_PATH", std::nullopt);
  CHECK(rt::detail::libcuda_path() == "libcuda.so.1");
}

TEST_CASE("cuda driver: a library without the driver's symbols is refused, naming them") {
  auto state = rt::detail::load_cuda_driver("libm.so.6");
  CHECK_FALSE(state.ok());
  CHECK(state.reason.find("libm.so.6") != std::string::npos);
  CHECK(state.reason.find("cuInit") != std::string::npos);
  CHECK(state.reason.find("cuMemAllocAsync") != std::string::npos);
}

TEST_CASE("cuda driver: the toolkit's stub libcuda resolves every symbol, then cuInit fails") {
  // The stub's soname is libcuda.so.1: once it is loaded, dlopen("libcuda.so.1") would find it
  // instead of the real driver. So the process-wide driver is loaded first, and a machine with
  // a real driver does not load the stub at all.
  if (kiln::cuda_available()) {
    MESSAGE("a real CUDA driver is loaded; the stub library is not tried");
    return;
  }
  if (!kiln_test::file_exists(kStubLibcuda)) {
    MESSAGE("no stub libcuda at " << kStubLibcuda);
    return;
  }
  auto state = rt::detail::load_cuda_driver(kStubLibcuda);
  CHECK_FALSE(state.ok());
  // Every versioned name we ask for exists in a CUDA 13 driver's export list.
  CHECK(state.reason.find("lacks") == std::string::npos);
  CHECK(bool(state.api.memcpy_htod_async));
  CHECK(bool(state.api.graph_instantiate));
  CHECK(state.reason.find("cuInit") != std::string::npos);
  CHECK(state.reason.find("CUDA_ERROR_STUB_LIBRARY") != std::string::npos);
}

TEST_CASE("cuda driver: error names without a driver") {
  rt::detail::CudaDriverApi none;
  CHECK(rt::detail::describe_cuda_error(none, 2) == "CUDA_ERROR_OUT_OF_MEMORY");
  CHECK(rt::detail::describe_cuda_error(none, 12345) == "CUDA error 12345");
  CHECK(rt::detail::cuda_version_text(12040) == "12.4");
  CHECK(rt::detail::cuda_version_text(13000) == "13.0");
}

TEST_CASE("cuda driver: availability and its reason agree; no CUDA means DeviceError naming why") {
  CHECK(kiln::cuda_available() == kiln::cuda_unavailable_reason().empty());
  CHECK(kiln::cuda_available() == (rt::cuda_device_count() > 0));
  if (kiln::cuda_available()) return;
  const std::string reason = kiln::cuda_unavailable_reason();
  auto throws_with_reason = [&](auto&& call, const std::string& what) {
    CAPTURE(what);
    try {
      call();
      FAIL("no DeviceError");
    } catch (const kiln::DeviceError& e) {
      CHECK(std::string(e.what()).find(reason) != std::string::npos);
    }
  };
  throws_with_reason([] { rt::allocate_cuda(1024, 0); }, "allocate_cuda");
  float host[4] = {};
  throws_with_reason([&] { rt::copy_host_to_device(host, host, sizeof host, 0); }, "copy_host_to_device");
  throws_with_reason([&] { rt::copy_device_to_host(host, host, sizeof host, 0); }, "copy_device_to_host");
  throws_with_reason([] { rt::cuda_context(0); }, "cuda_context");
  throws_with_reason([] { rt::cuda_driver_version(); }, "cuda_driver_version");
}

// ---- on a GPU ---------------------------------------------------------------------------------

TEST_CASE("cuda gpu: device properties") {
  if (skip_without_gpu()) return;
  auto& ctx = rt::cuda_context(0);
  MESSAGE(ctx.name << " " << ctx.arch() << ", " << ctx.sm_count << " SMs, driver CUDA " << rt::cuda_driver_version());
  CHECK(&rt::cuda_context(0) == &ctx);  // one context object per device
  CHECK(ctx.sm_count > 0);
  CHECK(ctx.cc_major >= 5);
  CHECK(ctx.arch() == "sm_" + std::to_string(ctx.cc_major) + std::to_string(ctx.cc_minor));
  CHECK(ctx.max_threads_per_block >= 1024);
  CHECK(ctx.max_shared_per_block >= 48 * 1024);
  CHECK(ctx.max_shared_per_block_optin >= ctx.max_shared_per_block);
  CHECK(ctx.warp_size == 32);
  CHECK(ctx.total_memory > 0);
  CHECK(ctx.pool != nullptr);
  CHECK(ctx.stream != nullptr);
  CHECK_THROWS_AS(rt::cuda_context(rt::cuda_device_count()), kiln::DeviceError);
  CHECK_THROWS_AS(rt::cuda_context(-1), kiln::DeviceError);
}

TEST_CASE("cuda gpu: allocation and copies round trip") {
  if (skip_without_gpu()) return;
  const std::size_t n = (1 << 20) + 3;
  std::vector<float> host(n), back(n, -1.f);
  for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i) * 0.5f - 7.f;
  auto a = rt::allocate_cuda(n * sizeof(float), 0);
  auto b = rt::allocate_cuda(n * sizeof(float), 0);
  REQUIRE(a->data != nullptr);
  CHECK(a->device == kiln::Device::cuda(0));
  CHECK(a->bytes == n * sizeof(float));
  // Generated kernels use 16-byte vector loads on whole buffers.
  CHECK(reinterpret_cast<std::uintptr_t>(a->data) % 16 == 0);
  MESSAGE("allocation alignment: " << (reinterpret_cast<std::uintptr_t>(a->data) &
                                       -reinterpret_cast<std::uintptr_t>(a->data))
                                   << " bytes");
  rt::copy_host_to_device(a->data, host.data(), n * sizeof(float), 0);
  rt::copy_device_to_device(b->data, a->data, n * sizeof(float), 0);
  rt::copy_device_to_host(back.data(), b->data, n * sizeof(float), 0);
  CHECK(std::memcmp(back.data(), host.data(), n * sizeof(float)) == 0);
  rt::fill_device_bytes(b->data, 0, n * sizeof(float), 0);
  rt::copy_device_to_host(back.data(), b->data, n * sizeof(float), 0);
  CHECK(std::all_of(back.begin(), back.end(), [](float v) { return v == 0.f; }));
  // A zero-byte block is still a distinct, freeable address.
  auto z = rt::allocate_cuda(0, 0);
  CHECK(z->data != nullptr);
  CHECK(z->bytes == 0);
}

TEST_CASE("cuda gpu: freed memory is reused by the pool") {
  if (skip_without_gpu()) return;
  auto& ctx = rt::cuda_context(0);
  const std::size_t bytes = std::size_t(256) << 20;
  void* first = nullptr;
  {
    auto a = rt::allocate_cuda(bytes, 0);
    first = a->data;
  }
  ctx.synchronize();  // with a release threshold of 0 this would hand the memory back
  std::size_t free_before = 0, total = 0;
  rt::detail::cuda_check(rt::cuda_driver().mem_get_info(&free_before, &total), "cuMemGetInfo");
  auto b = rt::allocate_cuda(bytes, 0);
  std::size_t free_after = 0;
  rt::detail::cuda_check(rt::cuda_driver().mem_get_info(&free_after, &total), "cuMemGetInfo");
  // Served from the pool: the device's free memory does not drop by another 256 MiB.
  CHECK(static_cast<long long>(free_before) - static_cast<long long>(free_after) < static_cast<long long>(bytes / 2));
  MESSAGE("reused the same address: " << (b->data == first));
}

TEST_CASE("cuda gpu: out of memory is a DeviceError with the bytes asked for and free") {
  if (skip_without_gpu()) return;
  const std::size_t huge = rt::cuda_context(0).total_memory + (std::size_t(1) << 30);
  try {
    rt::allocate_cuda(huge, 0);
    FAIL("an allocation larger than the device succeeded");
  } catch (const kiln::DeviceError& e) {
    std::string what = e.what();
    CHECK(what.find("out of memory") != std::string::npos);
    CHECK(what.find(std::to_string(huge)) != std::string::npos);
    CHECK(what.find("free") != std::string::npos);
  }
  // The device stays usable.
  auto ok = rt::allocate_cuda(1024, 0);
  CHECK(ok->data != nullptr);
}

TEST_CASE("cuda gpu: compiled kernels load, launch and compute the right results") {
  if (skip_without_gpu() || skip_without_nvrtc()) return;
  kiln_test::TempDir dir;
  rt::DiskCache disk(dir.path);
  rt::CudaModuleCache cache(disk);
  auto& ctx = rt::cuda_context(0);
  auto axpy = cache.get_function(kKernels, "axpy_f4", 0);
  auto sum = cache.get_function(kKernels, "block_sum", 0);
  CHECK(cache.cubins_in_memory() == 1);  // one cubin for both kernels
  CHECK(cache.get_function(kKernels, "axpy_f4", 0) == axpy);

  const unsigned n = (1u << 22) + 3;  // a scalar tail after the float4 body
  std::vector<float> x(n), y(n);
  for (unsigned i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i % 7);
    y[i] = static_cast<float>(i % 5) - 2.f;
  }
  auto dx = rt::allocate_cuda(n * sizeof(float), 0);
  auto dy = rt::allocate_cuda(n * sizeof(float), 0);
  auto dsum = rt::allocate_cuda(sizeof(float), 0);
  rt::copy_host_to_device(dx->data, x.data(), n * sizeof(float), 0);
  rt::copy_host_to_device(dy->data, y.data(), n * sizeof(float), 0);
  rt::fill_device_bytes(dsum->data, 0, sizeof(float), 0);

  float a = 1.5f;
  void* px = dx->data;
  void* py = dy->data;
  void* ps = dsum->data;
  unsigned nn = n;
  void* axpy_args[] = {&a, &px, &py, &nn};
  rt::Dim3 grid{static_cast<unsigned>(ctx.sm_count) * 4}, block{256};
  rt::launch_kernel(ctx, axpy, grid, block, 0, axpy_args);
  void* sum_args[] = {&px, &ps, &nn};
  rt::launch_kernel(ctx, sum, grid, {1024}, 0, sum_args);

  std::vector<float> out(n);
  float total = 0;
  rt::copy_device_to_host(out.data(), dy->data, n * sizeof(float), 0);
  rt::copy_device_to_host(&total, dsum->data, sizeof(float), 0);
  std::size_t wrong = 0;
  double expect_total = 0;
  for (unsigned i = 0; i < n; ++i) {
    if (out[i] != std::fma(a, x[i], y[i])) ++wrong;
    expect_total += x[i];
  }
  CHECK(wrong == 0);
  CHECK(total == static_cast<float>(expect_total));  // integers below 2^24: exact in any order

  // A kernel the module does not have is a DeviceError naming it.
  try {
    cache.get_function(kKernels, "no_such_kernel", 0);
    FAIL("found a kernel that does not exist");
  } catch (const kiln::DeviceError& e) {
    CHECK(std::string(e.what()).find("no_such_kernel") != std::string::npos);
  }
  // Bytes that are not a cubin are a DeviceError from the loader.
  CHECK_THROWS_AS(cache.function("definitely not a cubin", "axpy_f4", 0), kiln::DeviceError);
}

TEST_CASE("cuda gpu: events time kernels; graphs capture and replay them; launches are cheap") {
  if (skip_without_gpu() || skip_without_nvrtc()) return;
  kiln_test::TempDir dir;
  rt::DiskCache disk(dir.path);
  rt::CudaModuleCache cache(disk);
  auto& ctx = rt::cuda_context(0);
  const auto& api = rt::cuda_driver();
  auto axpy = cache.get_function(kKernels, "axpy_f4", 0);
  auto empty = cache.get_function(kKernels, "empty_kernel", 0);

  const unsigned n = 1u << 24;
  auto dx = rt::allocate_cuda(n * sizeof(float), 0);
  auto dy = rt::allocate_cuda(n * sizeof(float), 0);
  rt::fill_device_bytes(dx->data, 0, n * sizeof(float), 0);
  rt::fill_device_bytes(dy->data, 0, n * sizeof(float), 0);
  float a = 2.f;
  void* px = dx->data;
  void* py = dy->data;
  unsigned nn = n;
  void* args[] = {&a, &px, &py, &nn};
  rt::Dim3 grid{static_cast<unsigned>(ctx.sm_count) * 4}, block{256};

  rt::CudaEvent start(ctx), stop(ctx);
  start.record();
  for (int i = 0; i < 10; ++i) rt::launch_kernel(ctx, axpy, grid, block, 0, args);
  stop.record();
  stop.synchronize();
  float ms = stop.elapsed_ms_since(start);
  CHECK(ms > 0.f);
  MESSAGE("axpy over " << n << " floats: " << ms / 10 << " ms, " << 3.0 * n * sizeof(float) / (ms / 10 * 1e-3) / 1e9
                       << " GB/s");

  // Capture two launches into a graph and replay it three times: from x = 1 and y = 0, each
  // launch adds 2 to every y.
  std::vector<float> ones(n, 1.f);
  rt::copy_host_to_device(px, ones.data(), n * sizeof(float), 0);
  rt::fill_device_bytes(py, 0, n * sizeof(float), 0);
  ctx.synchronize();
  rt::cu::CUgraph graph = nullptr;
  rt::cu::CUgraphExec exec = nullptr;
  rt::detail::cuda_check(api.stream_begin_capture(ctx.stream, rt::cu::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                         "cuStreamBeginCapture");
  rt::launch_kernel(ctx, axpy, grid, block, 0, args);
  rt::launch_kernel(ctx, axpy, grid, block, 0, args);
  rt::detail::cuda_check(api.stream_end_capture(ctx.stream, &graph), "cuStreamEndCapture");
  rt::detail::cuda_check(api.graph_instantiate(&exec, graph, 0), "cuGraphInstantiate");
  for (int i = 0; i < 3; ++i) rt::detail::cuda_check(api.graph_launch(exec, ctx.stream), "cuGraphLaunch");
  std::vector<float> out(n);
  rt::copy_device_to_host(out.data(), py, n * sizeof(float), 0);
  CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == 12.f; }));  // 3 replays x 2 launches x 2
  rt::detail::cuda_check(api.graph_exec_destroy(exec), "cuGraphExecDestroy");
  rt::detail::cuda_check(api.graph_destroy(graph), "cuGraphDestroy");

  // Host time of one launch through launch_kernel (context check + cuLaunchKernel): the median
  // of batches, so one descheduled batch does not decide it.
  void* no_args[] = {nullptr};
  std::vector<double> per_launch_us;
  // Batches stay well below the driver's launch queue depth, so the host never waits for the GPU.
  for (int batch = 0; batch < 9; ++batch) {
    ctx.synchronize();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 200; ++i) rt::launch_kernel(ctx, empty, {1}, {32}, 0, no_args);
    auto t1 = std::chrono::steady_clock::now();
    per_launch_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 200);
  }
  ctx.synchronize();
  std::sort(per_launch_us.begin(), per_launch_us.end());
  MESSAGE("host time per launch: " << per_launch_us[4] << " us (median of 9 batches of 200)");
  CHECK(per_launch_us[4] < 5.0);
}
