#pragma once
// C++/OpenMP code generation: a scheduled graph -> one translation unit holding one
// `extern "C"` entry per kernel. Sizes and strides are baked in as constants. The outer loop
// of a kernel is shared among an OpenMP team (only when the work is large enough to pay for
// the team). Each kernel's body is a static function with orphaned worksharing (`omp for`,
// `omp single` for serial combine steps): its own entry wraps it in a parallel region, and
// the optional graph entry calls every body inside one region. Inner loops are contiguous `omp simd` loops whose
// reductions are split across lanes (and accumulate floats in double), so GCC vectorises them without -ffast-math: NaN,
// Inf and signed zeros behave as in the reference executor (backend/reference.hpp), whose
// semantics every expression below reproduces.
//
// The writer lives in codegen/cpp/: dialect.hpp (the C++ dialect of the C-family core in
// codegen/c/ and the prelude's helpers), math.hpp (kiln's vectorisable math functions),
// kernel_writer.hpp (scopes, buffers, values, stores, the reductions' pieces), pointwise.hpp and
// reductions.hpp (the kernel kinds) and unit.hpp (generate_cpp).
#include "kiln/codegen/cpp/unit.hpp"
