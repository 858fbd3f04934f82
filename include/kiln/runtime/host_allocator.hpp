#pragma once
// Host memory for tensors: 64-byte aligned blocks from a caching allocator. Freed blocks go to
// per-size free lists instead of back to the system, so a loop that makes a new result each
// iteration reuses memory whose pages are already mapped instead of faulting in fresh ones.
#include <cstddef>
#include <cstdint>

#include "kiln/core/linkage.hpp"
#include "kiln/core/storage.hpp"

namespace kiln::runtime {

/// A snapshot of the host allocator's state.
struct HostAllocatorStats {
  std::size_t cached_bytes = 0;       ///< bytes held in free lists, ready for reuse
  std::size_t in_use_bytes = 0;       ///< bytes in blocks handed out and not yet returned (size-class rounded)
  std::size_t peak_in_use_bytes = 0;  ///< most in_use_bytes since the start or reset_host_memory_peak
  std::size_t cache_limit = 0;        ///< most bytes the free lists may hold
  std::uint64_t hits = 0;             ///< allocations served from a free list
  std::uint64_t misses = 0;           ///< allocations that asked the system
};

/// A 64-byte aligned host block of at least `bytes` bytes (contents unspecified), returned to
/// kiln's cache when the last reference to the Storage's owner goes.
KILN_ENTRY StoragePtr allocate_host(std::size_t bytes);

/// Frees every cached (unused) host block back to the system.
KILN_ENTRY void release_cached_host_memory();

/// Sets the most bytes of unused blocks kept for reuse (default: a quarter of physical memory,
/// at most 4 GiB); frees the cache when it holds more.
KILN_ENTRY void set_host_cache_limit(std::size_t bytes);

/// Cached, in-use, peak and hit/miss counts of the host allocator.
KILN_ENTRY HostAllocatorStats host_allocator_stats();

/// Starts a new peak for host_allocator_stats().peak_in_use_bytes (the use now), as
/// torch.cuda.reset_peak_memory_stats does for its device.
KILN_ENTRY void reset_host_memory_peak();

}  // namespace kiln::runtime

#if !defined(KILN_COMPILED_LIBRARY)
#include "kiln/runtime/host_allocator_impl.hpp"
#endif
