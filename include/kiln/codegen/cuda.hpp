#pragma once
// CUDA code generation: a scheduled graph -> one CUDA translation unit (for NVRTC) holding one
// `extern "C" __global__` kernel per kernel of the schedule. The kernel grouping and the index
// algebra are the scheduler's (kiln/sched), exactly as for the CPU; only the mapping of the
// loops onto the GPU differs:
//
//  * pointwise kernels: one thread per VEC consecutive elements of the unit-stride loop group,
//    grid-stride over the rest; VEC = 16 bytes of the narrowest vectorisable access, so every
//    contiguous load and store is one 16-byte transaction per thread (a scalar tail covers what
//    the vectors leave over);
//  * row reductions: a warp (short rows) or a block per row; the row is read once into
//    registers (or shared memory for long rows) when later passes need it again, reductions are
//    folded per thread, then across the warp with shuffles and across warps through shared
//    memory; few long rows are split over many blocks whose partials the last block combines;
//  * column reductions: each thread owns VEC neighbouring columns (coalesced along the
//    contiguous axis) and a share of the rows; shares are combined in shared memory, and when
//    there are few columns the rows are split over blocks whose partials the last block of each
//    column tile combines;
//  * reductions over all rows of a row kernel ("finals", e.g. cross_entropy's mean) fold
//    per-block partials that the last block combines.
// Every combination runs in a fixed order for a given grid, and the grid depends only on the
// device (its multiprocessor count), so results are deterministic. Values are computed as the
// reference executor (kiln/backend/reference.hpp) defines them: f16/bf16 are loaded and stored
// as 16-bit and computed in f32, rounded once per op; sums accumulate in double (floats) or
// wrap in 64 bits (integers); CUDA's standard-accuracy math functions (no fast-math).
//
// The writer lives in codegen/cuda/: target.hpp (what the writer knows of the GPU, what it
// returns), dialect.hpp (the CUDA dialect of the C-family core in codegen/c/, the reduction
// combiner's text), kernel_writer.hpp (scopes, loads, stores, values), reduction.hpp (what the
// reduction kernels share: folds, warp and block reduce, partials, finals), one header per
// kernel kind (pointwise.hpp, rows.hpp, split_rows.hpp, columns.hpp: each a plan step and a
// print step), kinds.hpp (which kind a kernel takes, and the tuning knobs each kind reads) and
// unit.hpp (generate_cuda).
#include "kiln/codegen/cuda/unit.hpp"
