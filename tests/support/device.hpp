#pragma once
// The device every API-level test creates its tensors on: KILN_DEVICE=cpu (default) or
// cuda[:N], so that one test suite checks the reference executor, the CPU JIT and CUDA.
// Tests that only make sense on the host (from_blob over host memory, Eigen) say so and
// create their tensors with Device::cpu().
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "kiln/core/device.hpp"
#include "kiln/core/env.hpp"

namespace kiln::testing {

/// Parses "cpu", "cuda" or "cuda:N"; throws std::invalid_argument for anything else, so a
/// typo in KILN_DEVICE fails loudly instead of silently testing the CPU.
inline Device parse_device(const std::string& s) {
  if (s.empty() || s == "cpu") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    std::size_t used = 0;
    int index = std::stoi(s.substr(5), &used);
    if (used == s.size() - 5 && index >= 0) return Device::cuda(index);
  }
  throw std::invalid_argument("KILN_DEVICE must be cpu, cuda or cuda:N, got '" + s + "'");
}

/// The device under test (KILN_DEVICE, default cpu).
inline Device device() {
  static const Device d = parse_device(env::get("KILN_DEVICE", "cpu"));
  return d;
}

/// True when the tests run on the host (some checks, e.g. reading user memory behind a
/// from_blob view, only apply there).
inline bool on_cpu() { return device().is_cpu(); }

}  // namespace kiln::testing
