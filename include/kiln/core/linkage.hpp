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
