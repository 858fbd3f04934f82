#pragma once
// Range errors of data-dependent reads (gather, index_select, embedding, ...) found inside
// generated kernels. An index is a value the kernel computes, so it can be checked only where
// it is read: the kernel reads a clamped (valid) element instead of stray memory and records the
// first bad index in a fault record; the host turns the record into an IndexError naming the op.
//
// The record is four 64-bit words {flag, site, value, bound}. The CPU's lives in host memory
// and every loaded module points at it (its `kiln_index_fault` pointer, set at load); the
// CPU's kernels run synchronously, so it is checked right after each run. A GPU's lives in
// mapped pinned host memory, written by the device and read by the host after the stream
// synchronises (reading results back), so checking costs no extra synchronisation.
//
// A site is the description of one gather (op, operands' shapes and dtypes, axis), registered
// by the code generator under a hash of its text, so a kernel loaded from the disk cache names
// its site too (the source, and so the registration, is generated in every process).
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

#include "kiln/core/error.hpp"
#include "kiln/core/hash.hpp"

namespace kiln::detail {

/// Words of a fault record.
inline constexpr int kIndexFaultWords = 4;

/// The CPU's fault record (the generated modules' `kiln_index_fault` points here).
inline long long* host_index_fault() {
  alignas(64) static long long record[kIndexFaultWords] = {0, 0, 0, 0};
  return record;
}

struct IndexFaultSites {
  std::mutex mu;
  std::unordered_map<long long, std::string> text;
};
inline IndexFaultSites& index_fault_sites() {
  static IndexFaultSites s;
  return s;
}

/// Registers a gather site described by `op` (the user-facing op), `axis` and `operands`
/// ("input float32[5, 3], index int64[4]"); returns its id (a positive 63-bit hash of the text).
inline long long register_index_fault_site(const std::string& op, long long axis, const std::string& operands) {
  std::string text = op + '\x1f' + std::to_string(axis) + '\x1f' + operands;
  long long id = static_cast<long long>(hash_bytes(text.data(), text.size()) >> 1);
  if (id == 0) id = 1;
  auto& s = index_fault_sites();
  std::lock_guard<std::mutex> lock(s.mu);
  s.text.emplace(id, std::move(text));
  return id;
}

/// The IndexError text of a fault at `site`: PyTorch's wording, with the operands.
inline std::string index_fault_message(long long site, long long value, long long bound) {
  std::string op = "gather", axis = "?", operands;
  {
    auto& s = index_fault_sites();
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.text.find(site);
    if (it != s.text.end()) {
      const std::string& t = it->second;
      const auto a = t.find('\x1f'), b = t.find('\x1f', a + 1);
      op = t.substr(0, a);
      axis = t.substr(a + 1, b - a - 1);
      operands = t.substr(b + 1);
    }
  }
  return op + ": index " + std::to_string(value) + " is out of bounds for dimension " + axis + " with size " +
         std::to_string(bound) + (operands.empty() ? std::string() : " (" + operands + ")") +
         "; found by the kernel that read it, the run's results discarded";
}

/// Throws the IndexError of `record` when it holds a fault, clearing it first.
inline void raise_index_fault(volatile long long* record) {
  if (record[0] == 0) return;
  const long long site = record[1], value = record[2], bound = record[3];
  record[1] = 0;
  record[2] = 0;
  record[3] = 0;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  record[0] = 0;
  throw IndexError(index_fault_message(site, value, bound));
}

/// Throws the IndexError of a fault the CPU's kernels recorded.
inline void raise_host_index_fault() { raise_index_fault(host_index_fault()); }

}  // namespace kiln::detail
