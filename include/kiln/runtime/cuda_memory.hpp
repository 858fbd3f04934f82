#pragma once
// Device memory through the driver's stream-ordered allocator: cuMemAllocAsync / cuMemFreeAsync
// on kiln's stream of the device, from the device's default memory pool. The pool keeps freed
// blocks (its release threshold is UINT64_MAX, set when the device's context is made), so a
// steady-state allocation is a pool hit; kiln keeps no allocator of its own.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kiln/core/error.hpp"
#include "kiln/core/storage.hpp"
#include "kiln/runtime/cuda_driver.hpp"

namespace kiln::runtime {

namespace detail {

inline cu::CUdeviceptr device_address(const void* p) {
  return static_cast<cu::CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p));
}

inline std::string bytes_text(std::size_t n) {
  std::string s = std::to_string(n) + " bytes";
  if (n >= (std::size_t(1) << 20)) s += " (" + std::to_string(n >> 20) + " MiB)";
  return s;
}

}  // namespace detail

/// Bytes of cuda:`device`'s memory pool in use now and at most since the last
/// reset_cuda_memory_peak (kiln's device memory: every tensor and temporary comes from it).
struct CudaMemoryUse {
  std::uint64_t current = 0, peak = 0;
};
inline CudaMemoryUse cuda_memory_use(int device) {
  const auto& api = detail::require_cuda_driver([] { return std::string("read the memory pool's use"); });
  CudaContext& ctx = cuda_context(device);
  CudaMemoryUse use;
  if (!ctx.pool) return use;
  detail::cuda_check(api.stream_synchronize(ctx.stream), "cuStreamSynchronize", "before reading the pool's use");
  detail::cuda_check(api.mem_pool_get_attribute(ctx.pool, cu::CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &use.current),
                     "cuMemPoolGetAttribute(CU_MEMPOOL_ATTR_USED_MEM_CURRENT)");
  detail::cuda_check(api.mem_pool_get_attribute(ctx.pool, cu::CU_MEMPOOL_ATTR_USED_MEM_HIGH, &use.peak),
                     "cuMemPoolGetAttribute(CU_MEMPOOL_ATTR_USED_MEM_HIGH)");
  return use;
}
/// Starts a new peak for cuda_memory_use (the driver resets the high-water mark to the use now).
inline void reset_cuda_memory_peak(int device) {
  const auto& api = detail::require_cuda_driver([] { return std::string("reset the memory pool's peak"); });
  CudaContext& ctx = cuda_context(device);
  if (!ctx.pool) return;
  detail::cuda_check(api.stream_synchronize(ctx.stream), "cuStreamSynchronize", "before resetting the pool's peak");
  std::uint64_t zero = 0;
  detail::cuda_check(api.mem_pool_set_attribute(ctx.pool, cu::CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero),
                     "cuMemPoolSetAttribute(CU_MEMPOOL_ATTR_USED_MEM_HIGH)");
}

/// A new block of `bytes` bytes on cuda:`device`, allocated in stream order on the device's
/// stream and freed (cuMemFreeAsync, same stream) when the Storage's owner is released.
/// Throws DeviceError when CUDA is unavailable, and on out of memory with the bytes asked for
/// and the bytes free.
inline StoragePtr allocate_cuda(std::size_t bytes, int device) {
  auto what = [&] { return "allocate " + detail::bytes_text(bytes) + " on cuda:" + std::to_string(device); };
  const auto& api = detail::require_cuda_driver(what);
  CudaContext& ctx = cuda_context(device);
  if (!ctx.pool)
    throw DeviceError("kiln: cannot " + what() + ": " + ctx.name +
                      " does not support stream-ordered memory pools (cuMemAllocAsync)");
  ctx.make_current();
  // A zero-byte request still gets a distinct valid address, as the host allocator does.
  const std::size_t request = bytes == 0 ? 1 : bytes;
  cu::CUdeviceptr ptr = 0;
  cu::CUresult r = api.mem_alloc_async(&ptr, request, ctx.stream);
  if (r == cu::CUDA_ERROR_OUT_OF_MEMORY) {
    // The pool may hold freed blocks that do not fit this request (fragmentation): give them
    // back to the driver once and retry before calling it out of memory.
    detail::cuda_check(api.stream_synchronize(ctx.stream), "cuStreamSynchronize", "before trimming the memory pool");
    detail::cuda_check(api.mem_pool_trim_to(ctx.pool, 0), "cuMemPoolTrimTo");
    r = api.mem_alloc_async(&ptr, request, ctx.stream);
    if (r == cu::CUDA_ERROR_OUT_OF_MEMORY) {
      std::size_t free_bytes = 0, total_bytes = 0;
      std::string free_text = "free memory unknown";
      if (api.mem_get_info(&free_bytes, &total_bytes) == cu::CUDA_SUCCESS)
        free_text = detail::bytes_text(free_bytes) + " free of " + detail::bytes_text(total_bytes);
      throw OutOfMemoryError("kiln: out of memory on cuda:" + std::to_string(device) + " (" + ctx.name +
                             "): asked for " + detail::bytes_text(bytes) + ", " + free_text +
                             " (cuMemAllocAsync: " + detail::describe_cuda_error(api, r) + ")");
    }
  }
  if (r != cu::CUDA_SUCCESS) [[unlikely]]
    detail::throw_cuda_error(r, "cuMemAllocAsync", "while trying to " + what());

  auto s = std::make_shared<Storage>();
  s->data = reinterpret_cast<void*>(static_cast<std::uintptr_t>(ptr));
  s->bytes = bytes;
  s->device = Device::cuda(device);
  CudaContext* c = &ctx;
  s->owner = std::shared_ptr<void>(s->data, [c](void* p) {
    // A deleter cannot throw. Errors are dropped: during process teardown the driver answers
    // CUDA_ERROR_DEINITIALIZED (the memory goes with the process), and any other failure is a
    // sticky context error that the next checked call reports.
    const auto& a = detail::cuda_driver_state().api;
    cu::CUcontext cur = nullptr;
    if (a.ctx_get_current(&cur) == cu::CUDA_SUCCESS && cur != c->context) a.ctx_set_current(c->context);
    a.mem_free_async(detail::device_address(p), c->stream);
  });
  return s;
}

/// Copies `bytes` from host memory to device memory on cuda:`device`'s stream. Returns once the
/// source may be reused (the driver stages pageable host memory before returning).
inline void copy_host_to_device(void* dst, const void* src, std::size_t bytes, int device) {
  if (bytes == 0) return;
  const auto& api = detail::require_cuda_driver([&] { return "copy to cuda:" + std::to_string(device); });
  const CudaContext& ctx = cuda_context(device);
  ctx.make_current();
  detail::cuda_check(api.memcpy_htod_async(detail::device_address(dst), src, bytes, ctx.stream), "cuMemcpyHtoDAsync",
                     [&] { return "copying " + detail::bytes_text(bytes) + " to cuda:" + std::to_string(device); });
}

/// Copies `bytes` from device memory on cuda:`device` to host memory, after all work queued
/// before it on the device's stream; synchronises the stream, so `dst` is ready on return.
inline void copy_device_to_host(void* dst, const void* src, std::size_t bytes, int device) {
  if (bytes == 0) return;
  const auto& api = detail::require_cuda_driver([&] { return "copy from cuda:" + std::to_string(device); });
  const CudaContext& ctx = cuda_context(device);
  ctx.make_current();
  auto what = [&] { return "copying " + detail::bytes_text(bytes) + " from cuda:" + std::to_string(device); };
  detail::cuda_check(api.memcpy_dtoh_async(dst, detail::device_address(src), bytes, ctx.stream), "cuMemcpyDtoHAsync",
                     what);
  detail::cuda_check(api.stream_synchronize(ctx.stream), "cuStreamSynchronize",
                     [&] { return what() + " (an earlier kernel's error may surface here)"; });
  // A gather that read out of range in the work before (its results are what is being read).
  ctx.raise_index_fault();
}

/// Copies `bytes` between two blocks on cuda:`device`, in order on the device's stream.
inline void copy_device_to_device(void* dst, const void* src, std::size_t bytes, int device) {
  if (bytes == 0) return;
  const auto& api = detail::require_cuda_driver([&] { return "copy on cuda:" + std::to_string(device); });
  const CudaContext& ctx = cuda_context(device);
  ctx.make_current();
  detail::cuda_check(api.memcpy_dtod_async(detail::device_address(dst), detail::device_address(src), bytes, ctx.stream),
                     "cuMemcpyDtoDAsync",
                     [&] { return "copying " + detail::bytes_text(bytes) + " on cuda:" + std::to_string(device); });
}

/// Sets `bytes` bytes at `dst` on cuda:`device` to `value`, in order on the device's stream.
inline void fill_device_bytes(void* dst, unsigned char value, std::size_t bytes, int device) {
  if (bytes == 0) return;
  const auto& api = detail::require_cuda_driver([&] { return "fill memory on cuda:" + std::to_string(device); });
  const CudaContext& ctx = cuda_context(device);
  ctx.make_current();
  detail::cuda_check(api.memset_d8_async(detail::device_address(dst), value, bytes, ctx.stream), "cuMemsetD8Async",
                     [&] { return "filling " + detail::bytes_text(bytes) + " on cuda:" + std::to_string(device); });
}

/// Waits until all of kiln's work on cuda:`device` is done.
inline void synchronize_cuda(int device) { cuda_context(device).synchronize(); }

/// Why memory at `p` cannot be what a tensor of `device` views, or "" when it can (or when
/// the driver cannot tell). A CUDA device: `p` must be memory the driver knows (device, managed
/// or registered host memory) and, when it is device memory, of that GPU; plain host memory
/// (malloc, std::vector) is refused. The CPU: `p` must not be device memory of a GPU; asked
/// only once kiln has made a CUDA context, so host code never loads the driver for this.
/// Throws DeviceError when `device` is a GPU and CUDA is unavailable or the GPU does not exist.
inline std::string cuda_pointer_mismatch(const void* p, Device device) {
  if (p == nullptr) return "";
  if (device.is_cpu() && !detail::cuda_context_made().load(std::memory_order_acquire)) return "";
  const auto& api = device.is_cpu() ? detail::cuda_driver_state().api
                                    : detail::require_cuda_driver([&] { return "view memory on " + device.str(); });
  if (device.is_cuda()) cuda_context(device.index).make_current();
  if (!api.pointer_get_attribute) return "";
  const auto address = detail::device_address(p);
  unsigned type = 0;
  const cu::CUresult r = api.pointer_get_attribute(&type, cu::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, address);
  if (r == cu::CUDA_ERROR_INVALID_VALUE)
    return device.is_cpu() ? "" : "host memory CUDA does not know (not from cudaMalloc, cudaMallocManaged or cudaHostAlloc)";
  if (r != cu::CUDA_SUCCESS || type != cu::CU_MEMORYTYPE_DEVICE) return "";
  int managed = 0, ordinal = -1;
  if (api.pointer_get_attribute(&managed, cu::CU_POINTER_ATTRIBUTE_IS_MANAGED, address) == cu::CUDA_SUCCESS &&
      managed != 0)
    return "";  // managed memory: reachable from the host and from every GPU
  if (api.pointer_get_attribute(&ordinal, cu::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, address) != cu::CUDA_SUCCESS)
    return "";
  return device.is_cpu() || ordinal != device.index ? "device memory of cuda:" + std::to_string(ordinal) : "";
}

}  // namespace kiln::runtime
