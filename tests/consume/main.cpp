// The whole consumer program of tests/consume/*: it only has to compile against kiln's
// headers, link with what kiln::kiln (or kiln::kiln_compiled) brings, and compute something
// through the public API.
#include <kiln/core/version.hpp>
#include <kiln/kiln.hpp>

#include <cstdio>
#include <cstring>

#if defined(KILN_EXPECT_COMPILED) && !defined(KILN_COMPILED_LIBRARY)
#error "linking kiln::kiln_compiled must define KILN_COMPILED_LIBRARY"
#endif

int main() {
  using namespace kiln;
  Tensor one = full({1}, 1.0);
  const float two = sum(one + one).item<float>();
  std::printf("kiln %s consumer: 1 + 1 = %g\n", version_string, two);
#ifdef KILN_EXPECTED_VERSION
  // The headers found must be the ones of the package CMake found.
  if (std::strcmp(version_string, KILN_EXPECTED_VERSION) != 0) {
    std::printf("headers say %s, package says %s\n", version_string, KILN_EXPECTED_VERSION);
    return 1;
  }
#endif
  return two == 2.0f ? 0 : 1;
}
