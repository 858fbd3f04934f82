#pragma once
// Which writer a scheduled kernel takes (its kind), decided from the schedule and the target
// alone, before any text is written.
#include <cstdint>
#include <string>

#include "kiln/codegen/cuda/target.hpp"
#include "kiln/sched/schedule.hpp"

namespace kiln::codegen {

/// The CUDA writers, one per kind of kernel (codegen/cuda/<kind>.hpp).
enum class CudaKernelKind : std::uint8_t {
  Pointwise = 1,  ///< one thread per vector of elements
  Rows = 2,       ///< a warp or a block per row
  SplitRows = 4,  ///< few long rows, each split over blocks
  Columns = 8,    ///< each thread a few columns and a share of the rows
};

inline const char* kind_name(CudaKernelKind k) {
  switch (k) {
    case CudaKernelKind::Pointwise:
      return "pointwise";
    case CudaKernelKind::Rows:
      return "rows";
    case CudaKernelKind::SplitRows:
      return "split rows";
    case CudaKernelKind::Columns:
      return "columns";
  }
  return "?";
}

/// The kind of kernel `kid` of `s` on `t`. Row reductions are split over blocks when there are
/// few long rows (fewer than multiprocessors, at least 8192 elements each), one phase and no
/// per-element store; a symbolic number of rows is never split (one code for every size; the
/// scheduler does not split it either).
inline CudaKernelKind cuda_kernel_kind(const sched::Schedule& s, int kid, const CudaTarget& t) {
  const sched::Kernel& k = s.kernels[static_cast<std::size_t>(kid)];
  if (k.kind == sched::KernelKind::Pointwise) return CudaKernelKind::Pointwise;
  if (k.loops.column) return CudaKernelKind::Columns;
  const bool symbolic = s.symbolic != 0 && !k.space.empty() && k.space[0] == s.symbolic;
  bool per_element = false;
  for (auto& st : k.stores) per_element = per_element || st.level == sched::Level::Full;
  if (symbolic || k.loops.red_groups.empty() || k.phases > 1 || k.passes > 1 || per_element) return CudaKernelKind::Rows;
  std::int64_t reduced = 1;
  for (int gi : k.loops.red_groups)
    for (int d : k.loops.groups[static_cast<std::size_t>(gi)]) reduced *= k.space[static_cast<std::size_t>(d)];
  const std::int64_t rows = k.loops.rows;
  return reduced >= 8192 && rows >= 1 && rows < t.sm_count ? CudaKernelKind::SplitRows : CudaKernelKind::Rows;
}

}  // namespace kiln::codegen
