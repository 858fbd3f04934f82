#pragma once
#include <cstdint>
#include <string>

namespace kiln {

/// Where a tensor's storage lives and where its kernels run.
struct Device {
  enum class Kind : std::uint8_t { CPU, CUDA };
  Kind kind = Kind::CPU;
  int index = 0;

  /// The host.
  static constexpr Device cpu() { return Device{Kind::CPU, 0}; }
  /// GPU number `index` (CUDA).
  static constexpr Device cuda(int index = 0) { return Device{Kind::CUDA, index}; }

  constexpr bool is_cpu() const { return kind == Kind::CPU; }
  constexpr bool is_cuda() const { return kind == Kind::CUDA; }
  friend constexpr bool operator==(Device a, Device b) { return a.kind == b.kind && a.index == b.index; }
  friend constexpr bool operator!=(Device a, Device b) { return !(a == b); }

  /// "cpu" or "cuda:0".
  std::string str() const { return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index); }
};

}  // namespace kiln
