#pragma once
// kiln's version. It is part of every kernel cache key, so bump it whenever generated code,
// runtime helpers or the cache entry format change meaning.

#define KILN_VERSION_MAJOR 0
#define KILN_VERSION_MINOR 1
#define KILN_VERSION_PATCH 0
#define KILN_VERSION_STRING "0.1.0"

namespace kiln {

/// The library version as "major.minor.patch".
inline constexpr const char* version_string = KILN_VERSION_STRING;

}  // namespace kiln
