// kiln::kiln_compiled: the backend's entry points (backend/entry.hpp) compiled once, so that
// translation units built with KILN_COMPILED_LIBRARY parse only the front end. Everything here
// is the header-only library's own code; this file only decides where it is compiled.
#ifndef KILN_COMPILED_LIBRARY
#error "kiln_compiled.cpp is built with KILN_COMPILED_LIBRARY defined (the kiln::kiln_compiled target does that)"
#endif
#include "kiln/backend/entry_impl.hpp"
