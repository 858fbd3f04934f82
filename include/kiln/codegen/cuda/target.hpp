#pragma once
// What CUDA code generation knows about the GPU (CudaTarget, with the tuning knobs), the
// alignment of a launch's pointers, and what it hands the runtime: each kernel's launch
// (CudaKernelInfo, CudaGridRule) and the translation unit (CudaSource).
#include <cstdint>
#include <string>
#include <vector>
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::codegen {

/// What code generation needs to know about the GPU: the architecture, and the sizes that set
/// grids, block counts and shared memory.
struct CudaTarget {
  int cc_major = 9, cc_minor = 0;
  int sm_count = 132;
  int max_threads_per_sm = 2048;
  int max_shared_per_block_optin = 227 * 1024;  ///< bytes a block may use after opting in
  int max_shared_per_sm = 228 * 1024;
  bool index64 = false;  ///< 64-bit index math even where 32 bits suffice (tests use it)
  // Tuning: the defaults are the variants measured best on an H200 (bench_gpu --variants;
  // docs/performance-gpu.md has the figures).
  int pointwise_block = 256;    ///< threads per block of pointwise kernels
  int warp_rows_per_block = 8;  ///< rows per block of row kernels with a warp per row (short rows)
  /// A row of at most 32 x lanes x this many elements gets a warp, a longer one a block. Each
  /// thread's share of a row is unrolled, and NVRTC's time grows with it. 4: N2 (1024-wide
  /// rows, then 64 threads per row) 0.985 x copy and compiled by NVRTC in 78 ms on an H200's
  /// host; 8 (a warp per row, 32 floats per thread) 0.969 and 112-140 ms.
  int warp_row_vectors = 4;
  int pointwise_unroll = 2;        ///< vectors per thread and loop step of light pointwise kernels
  int row_vectors_per_thread = 4;  ///< sets the threads per row of row reductions
  int split_blocks_per_sm = 4;     ///< blocks per multiprocessor when rows or columns are split
  int pointwise_unroll_heavy = 1;  ///< the same for pointwise kernels heavy in transcendental functions
  /// The same for light pointwise kernels that gather: each step's loads wait on its index's
  /// load, so more steps in flight pay. 4: E1 (embedding rows) 0.949 x copy on an H200, 2: 0.942.
  int pointwise_unroll_gather = 4;
  /// At most this many lanes per thread in pointwise kernels heavy in transcendental functions
  /// (0: as many as 16-byte loads give). Two: P3 (16 sinf per element) 1.094 -> 0.905 ms on an
  /// H200, fewer live registers per thread.
  int pointwise_lanes_heavy = 2;
  int row_unroll_uncached = 4;               ///< unroll of a row pass whose row is not cached on chip
  int row_vectors_per_thread_uncached = 32;  ///< sets the threads per row of long rows not cached on chip
  bool column_split_interleave = false;      ///< column splits take interleaved row groups
  int column_vectors_per_thread = 1;         ///< 16-byte vectors per thread across the columns of column reductions
  int column_unroll = 4;                     ///< rows in flight per thread in column reductions
  /// Rows too long for registers stay in shared memory (one row per multiprocessor at a time),
  /// else they are re-read per pass, mostly from L2 (two rows per multiprocessor overlap).
  bool row_cache_shared = false;
  /// Row kernels read the rows they keep on chip with an L2 evict_last policy. On an H200 an
  /// rms_norm kernel over [16384, 4096] f32 went from 0.950 to 0.983 of copy with it, the speed
  /// of cudaMemcpy over the same bytes, also with a new input each launch and without slowing
  /// the kernel after it (evict_first instead: 0.90).
  bool row_cache_load_keep = true;
  /// 16-byte loads through a gathered index (embedding rows) use the same evict_last policy. Off:
  /// on an H200 it helped E1 only when the launch before had left clean lines in L2 (0.940 ->
  /// 0.955 of copy, inputs rotated) and cost as much after a cache flush (0.947 -> 0.930), as
  /// Triton's do_bench times torch (bench/probes/embedding_l2_policy.cu).
  bool gather_load_keep = false;
  /// x / d with d loop-invariant (f32): x * (1 / d), the exact division where 1/d is not a
  /// normal number. Off: it bought nothing on an H200 and its select doubles compile time.
  bool reciprocal_div = false;

  /// "sm_90".
  std::string arch() const { return "sm_" + std::to_string(cc_major) + std::to_string(cc_minor); }
  /// An H100/H200 (132 multiprocessors).
  static CudaTarget sm90() { return CudaTarget{}; }
  /// An A100 (108 multiprocessors, 163 KiB of shared memory per block).
  static CudaTarget sm80() {
    CudaTarget t;
    t.cc_major = 8;
    t.sm_count = 108;
    t.max_shared_per_block_optin = 163 * 1024;
    t.max_shared_per_sm = 164 * 1024;
    return t;
  }
};

/// Which buffers of a run are 16-byte aligned (vector loads and stores need it). Empty vectors
/// mean "all aligned".
struct CudaAlignment {
  std::vector<char> inputs;   ///< per leaf, in leaf order
  std::vector<char> outputs;  ///< per output
  bool input(int leaf) const { return inputs.empty() || inputs[static_cast<std::size_t>(leaf)]; }
  bool output(int index) const { return outputs.empty() || outputs[static_cast<std::size_t>(index)]; }
};

/// The grid of a kernel whose work grows with a symbolic size n, read at launch (see
/// CudaSource::symbolic): the kernel has units = floor(n * units_per_size / size_divisor) work
/// units (vectors of a pointwise kernel, rows of a row reduction), and its grid is
/// ceil(units / units_per_block) blocks, clamped to [1, max_grid] as the static choice is.
struct CudaGridRule {
  std::int64_t units_per_size = 0;  ///< 0: no rule, the grid is static (CudaKernelInfo::grid)
  std::int64_t size_divisor = 1;
  std::int64_t units_per_block = 1;
  std::int64_t max_grid = 1;
  /// The grid for size `n` (>= 0).
  unsigned grid(std::int64_t n) const {
    // n * units_per_size cannot overflow for any size a buffer can hold (units_per_size counts
    // elements of one unit of the size, and n times it are addressed in 64 bits).
    const std::int64_t units = n * units_per_size / size_divisor;
    const std::int64_t g = (units + units_per_block - 1) / units_per_block;
    return static_cast<unsigned>(std::max<std::int64_t>(1, std::min<std::int64_t>(g, max_grid)));
  }
};

/// How one generated kernel is launched.
struct CudaKernelInfo {
  std::string name;             ///< `extern "C"` symbol
  unsigned grid = 1;            ///< blocks (x); 0 when grid_rule sets it at launch
  unsigned block = 1;           ///< threads per block (x)
  unsigned shared_bytes = 0;    ///< dynamic shared memory
  std::string strategy;         ///< one line for logs and explain
  std::uint64_t code_hash = 0;  ///< hash of the kernel's code (equal: the same kernel; autotune skips repeats)
  /// Kernels over a symbolic size: how the grid follows the size (units_per_size 0: static).
  CudaGridRule grid_rule;
  /// The grid to launch with when the symbolic size is `n` (static kernels: `grid`).
  unsigned grid_for(std::int64_t n) const { return grid_rule.units_per_size != 0 ? grid_rule.grid(n) : grid; }
};

/// A generated unit: the source and its kernels in launch order. Every kernel takes one
/// argument, a struct of `num_args` pointers: the graph's leaves (leaf order), its outputs,
/// the schedule's temporaries, then a scratch buffer of `scratch_bytes` (cross-block partials;
/// null when 0).
///
/// A schedule with a symbolic size (sched::Schedule::symbolic, kiln::compile's dynamic
/// shapes) makes a `symbolic` unit: the struct then has one more field after the pointers,
/// `long long n`, the size at this launch (C layout: `struct { void* p[num_args]; long long
/// n; }`, n at byte 8 * num_args). Kernels whose iteration space leads with that size read it
/// for their loop bounds and index math (in 64-bit integers, whatever the size: no guard
/// picks 32 bits at launch), and their grid follows it (CudaKernelInfo::grid_rule); the other
/// kernels of the unit ignore it. One unit serves every size; sizes 0 and 1 are valid too.
struct CudaSource {
  std::string source;
  std::vector<CudaKernelInfo> kernels;
  std::size_t num_args = 0;
  std::size_t scratch_bytes = 0;
  bool symbolic = false;  ///< the argument struct ends with the size `n` (see above)
};

}  // namespace kiln::codegen

KILN_COLD_CODE_END
