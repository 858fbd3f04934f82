#pragma once
// Which writer a scheduled kernel takes (its kind), decided from the schedule and the target
// alone, before any text is written.
#include <cstdint>
#include <string>

#include "kiln/codegen/cuda/target.hpp"
#include "kiln/sched/schedule.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::codegen {

/// The CUDA writers, one per kind of kernel (codegen/cuda/<kind>.hpp).
enum class CudaKernelKind : std::uint8_t {
  Pointwise = 1,  ///< one thread per vector of elements
  Rows = 2,       ///< a warp or a block per row
  SplitRows = 4,  ///< few long rows, each split over blocks
  Columns = 8,    ///< each thread a few columns and a share of the rows
};

/// Kernel kinds as bits (a knob's readers below).
inline constexpr unsigned kReadPointwise = static_cast<unsigned>(CudaKernelKind::Pointwise);
inline constexpr unsigned kReadRows = static_cast<unsigned>(CudaKernelKind::Rows);
inline constexpr unsigned kReadSplitRows = static_cast<unsigned>(CudaKernelKind::SplitRows);
inline constexpr unsigned kReadColumns = static_cast<unsigned>(CudaKernelKind::Columns);
inline constexpr unsigned kReadAll = kReadPointwise | kReadRows | kReadSplitRows | kReadColumns;

/// The writers' tuning knobs, listed once: each is the CudaTarget field of the same name
/// (where its default and meaning are documented), a Count (a positive integer) or a Switch (a
/// bool, overridden with 1 or -1), and the kinds whose plan or print step reads it: a knob
/// cannot change the code of another kind (tests/backend/test_cuda_autotune.cpp checks this),
/// so max-autotune generates a candidate only for kernels that read what it moves.
#define KILN_CUDA_TUNING_KNOBS(X)                                                                      \
  X(pointwise_unroll, Count, kReadPointwise)                                                           \
  X(row_vectors_per_thread, Count, kReadRows)                                                          \
  X(split_blocks_per_sm, Count, kReadSplitRows | kReadColumns)                                         \
  X(pointwise_unroll_heavy, Count, kReadPointwise)                                                     \
  X(row_cache_shared, Switch, kReadRows)                                                               \
  X(reciprocal_div, Switch, kReadAll)                                                                  \
  X(column_vectors_per_thread, Count, kReadColumns)                                                    \
  X(column_unroll, Count, kReadColumns)                                                                \
  X(pointwise_lanes_heavy, Count, kReadPointwise)                                                      \
  X(row_unroll_uncached, Count, kReadRows)                                                             \
  X(row_vectors_per_thread_uncached, Count, kReadRows)                                                 \
  X(column_split_interleave, Switch, kReadColumns)                                                     \
  X(pointwise_block, Count, kReadPointwise)                                                            \
  X(warp_rows_per_block, Count, kReadRows)                                                             \
  X(warp_row_vectors, Count, kReadRows)                                                                \
  X(pointwise_unroll_gather, Count, kReadPointwise)                                                    \
  X(row_cache_load_keep, Switch, kReadRows)                                                            \
  X(gather_load_keep, Switch, kReadAll)

/// The kinds (kRead* bits) that read knob `name`; 0 for a name that is not a knob.
inline unsigned knob_readers(const std::string& name) {
#define KILN_KNOB_READERS(knob, kind, readers) \
  if (name == #knob) return readers;
  KILN_CUDA_TUNING_KNOBS(KILN_KNOB_READERS)
#undef KILN_KNOB_READERS
  return 0;
}

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

KILN_COLD_CODE_END
