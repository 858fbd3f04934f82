#pragma once
// Host memory for tensors: 64-byte aligned blocks.
#include <cstdlib>
#include <memory>
#include <new>

#include "kiln/core/storage.hpp"

namespace kiln::runtime {

/// A new 64-byte aligned host block of at least `bytes` bytes.
inline StoragePtr allocate_host(std::size_t bytes) {
  std::size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded == 0) rounded = 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw std::bad_alloc();
  auto s = std::make_shared<Storage>();
  s->data = p;
  s->bytes = bytes;
  s->device = Device::cpu();
  s->owner = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  return s;
}

}  // namespace kiln::runtime
