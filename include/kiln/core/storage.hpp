#pragma once
// A block of memory on one device. Who frees it is decided by whoever made it (`owner`):
// kiln's allocators for its own buffers, nobody for `from_blob` views of user memory.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "kiln/core/device.hpp"

namespace kiln {

namespace ir {
struct Node;
}

struct Storage {
  void* data = nullptr;
  std::size_t bytes = 0;
  Device device = Device::cpu();
  std::shared_ptr<void> owner;  ///< releases `data` when the last reference goes; empty for borrowed memory
  /// Lazy nodes built with a view of this memory as an input (registered by ir::finish, guarded
  /// by detail::storage_lock): a write into the memory evaluates those still lazy first, so they
  /// read the values they were built on, as PyTorch's eager ops do.
  std::vector<std::weak_ptr<ir::Node>> lazy_readers;
  /// Bumped by every write into the memory (PyTorch's version counter): a backward that reads
  /// a value written after the graph recorded it raises instead of using the new values.
  std::uint64_t version = 0;
};

namespace detail {
/// The lock of `s`'s lazy_readers (one of a few shared by all storages).
inline std::mutex& storage_lock(const Storage* s) {
  static std::mutex locks[32];
  return locks[(reinterpret_cast<std::uintptr_t>(s) >> 6) % 32];
}
}  // namespace detail

using StoragePtr = std::shared_ptr<Storage>;

}  // namespace kiln
