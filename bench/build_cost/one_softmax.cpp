// Build-cost probe: a user program that evaluates one softmax (scripts/build-cost compiles it
// in both modes at -O1 and runs it, so the figure is for a program that works).
#include <kiln/kiln.hpp>

#include <cmath>
#include <cstdio>

int main() {
  kiln::Tensor x = kiln::rand({64, 128}, 7);
  kiln::Tensor y = kiln::softmax(x, -1);
  const float total = kiln::sum(y).item<float>();  // each of the 64 rows sums to 1
  std::printf("softmax rows sum to %.4f (expected 64)\n", total);
  return std::fabs(total - 64.0f) < 1e-3f ? 0 : 1;
}
