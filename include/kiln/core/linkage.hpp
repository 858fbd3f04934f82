#pragma once
// KILN_ENTRY: how a non-template definition of the library is linked. `inline` in header-only
// mode, where every translation unit that includes kiln compiles it; nothing in compiled mode
// (KILN_COMPILED_LIBRARY defined, linking kiln::kiln_compiled), where a header declares it and
// the library defines it once (src/kiln_compiled.cpp includes the *_impl.hpp files that hold
// such definitions).
#if defined(KILN_COMPILED_LIBRARY)
#define KILN_ENTRY
#else
#define KILN_ENTRY inline
#endif

// KILN_COLD_CODE_BEGIN / KILN_COLD_CODE_END bracket code that runs only when a plan or a kernel
// is built, never when one is replayed: the scheduler, the code generators, the compiler
// drivers and caches around kernel builds, and the reference executor (Mode::Eager, or no C++
// compiler). In header-only mode every translation unit that includes kiln compiles that code,
// and optimising it was most of such a file's build (the one-softmax program: 50.8 s at -O1,
// 32.3 s with it unoptimised). There it is compiled without optimisation; compiled mode builds
// it once, optimised, and defining KILN_OPTIMIZE_COLD_CODE keeps the optimisation in
// header-only mode too. The brackets go after a header's #include lines (tests/core checks
// it), so that a header first included from cold code keeps its own optimisation.
#if defined(KILN_COMPILED_LIBRARY) || defined(KILN_OPTIMIZE_COLD_CODE)
#define KILN_COLD_CODE_BEGIN
#define KILN_COLD_CODE_END
#elif defined(__clang__)
#define KILN_COLD_CODE_BEGIN _Pragma("clang optimize off")
#define KILN_COLD_CODE_END _Pragma("clang optimize on")
#elif defined(__GNUC__)
#define KILN_COLD_CODE_BEGIN _Pragma("GCC push_options") _Pragma("GCC optimize(\"O0\")")
#define KILN_COLD_CODE_END _Pragma("GCC pop_options")
#else
#define KILN_COLD_CODE_BEGIN
#define KILN_COLD_CODE_END
#endif
