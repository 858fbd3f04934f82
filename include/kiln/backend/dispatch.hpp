#pragma once
// The executor seam: memory, copies and graph execution for every device, chosen here so the
// front end never names a device-specific executor.
#include <cstring>
#include <string>

#include "kiln/backend/executor.hpp"
#include "kiln/backend/reference.hpp"
#include "kiln/runtime/host_allocator.hpp"

namespace kiln::backend {

/// A new buffer of `bytes` on `device`.
inline StoragePtr allocate(std::size_t bytes, Device device) {
  if (device.is_cpu()) return runtime::allocate_host(bytes);
  throw DeviceError("cannot allocate " + std::to_string(bytes) + " bytes on " + device.str() +
                    ": this build has no CUDA executor");
}

/// Copies `bytes` between any two devices (blocking).
inline void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes) {
  if (bytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  throw DeviceError("copy from " + src_device.str() + " to " + dst_device.str() + ": this build has no CUDA executor");
}

/// Runs `g` with the executor `mode` selects for its device.
inline void run(const ir::Graph& g, const RunArgs& args, Mode mode) {
  if (!g.device.is_cpu()) throw DeviceError("no executor for device " + g.device.str());
  (void)mode;
  run_reference(g, args);
}

/// How `g` would be run (its kernels), as text.
inline std::string explain(const ir::Graph& g, Mode mode) {
  (void)mode;
  return "reference executor: one launch per primitive\n" + g.str();
}

/// Drops every compiled plan and kernel the executors keep in memory.
inline void clear_caches() {}

}  // namespace kiln::backend
