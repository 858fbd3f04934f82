#pragma once
// A block of memory on one device. Who frees it is decided by whoever made it (`owner`):
// kiln's allocators for its own buffers, nobody for `from_blob` views of user memory.
#include <cstddef>
#include <memory>

#include "kiln/core/device.hpp"

namespace kiln {

struct Storage {
  void* data = nullptr;
  std::size_t bytes = 0;
  Device device = Device::cpu();
  std::shared_ptr<void> owner;  ///< releases `data` when the last reference goes; empty for borrowed memory
};

using StoragePtr = std::shared_ptr<Storage>;

}  // namespace kiln
