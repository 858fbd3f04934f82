#pragma once
// The definitions of runtime/host_allocator.hpp. Header-only mode includes them from that header
// (KILN_ENTRY is `inline`); compiled mode compiles them once into kiln::kiln_compiled.
#include "kiln/runtime/host_allocator.hpp"
#include "kiln/runtime/host_cache.hpp"

namespace kiln::runtime {

KILN_ENTRY StoragePtr allocate_host(std::size_t bytes) {
  std::size_t cls = detail::HostAllocator::size_class(bytes);
  void* p = detail::host_allocator().allocate(cls);
  // If either allocation below throws, the block has already gone back: shared_ptr's
  // constructor calls the deleter itself, and `owner`'s destructor covers make_shared.
  std::shared_ptr<void> owner(p, [cls](void* q) { detail::host_allocator().release(q, cls); });
  StoragePtr s = std::make_shared<Storage>();
  s->owner = std::move(owner);
  s->data = p;
  s->bytes = bytes;
  s->device = Device::cpu();
  return s;
}

KILN_ENTRY void release_cached_host_memory() { detail::host_allocator().release_cached(); }

KILN_ENTRY void set_host_cache_limit(std::size_t bytes) { detail::host_allocator().set_limit(bytes); }

KILN_ENTRY HostAllocatorStats host_allocator_stats() { return detail::host_allocator().stats(); }

KILN_ENTRY void reset_host_memory_peak() { detail::host_allocator().reset_peak(); }

}  // namespace kiln::runtime
