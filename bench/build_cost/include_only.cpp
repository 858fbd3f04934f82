// Build-cost probe: the header alone (scripts/build-cost compiles it in both modes).
#include <kiln/kiln.hpp>
int main() { return 0; }
