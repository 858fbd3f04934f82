// Write your own fused kernel from a generic lambda.
//
// A generic lambda over kiln tensors is a kernel generator: calling it with tensors does not
// compute anything, it builds one typed expression (a tree of kiln's expression templates).
// Evaluating that expression runs it as ONE fused kernel: every intermediate stays in
// registers, each input is read once and the output written once, straight into memory the
// caller owns (from_blob + assign).
#include <kiln/kiln.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

using namespace kiln;

int main() {
  // The kernel: any mix of kiln's operators and functions.
  auto fused = [](auto x, auto y) { return relu(x * y + 0.1f); };

  const std::int64_t n = 1 << 20;
  Tensor x = randn({n}, /*seed=*/7);
  Tensor y = rand({n}, /*seed=*/8);
  x.eval();
  y.eval();

  // The caller's own memory, viewed (no copy) as a tensor.
  std::vector<float> result(static_cast<std::size_t>(n));
  Tensor out = from_blob(result.data(), {n});

  auto expr = fused(x, y);  // a typed expression: nothing runs, nothing is allocated
  reset_stats();
  out.assign(expr);  // one kernel writes into `result`
  Stats first = stats();
  out.assign(fused(x, y));  // the same expression type again: the kernel is reused
  Stats second = stats();

  // Chains of the lambda fuse too: ten applications, still one kernel, no temporaries.
  Tensor z = x;
  for (int i = 0; i < 10; ++i) z = fused(z, y);
  std::vector<float> chained = z.to_vector<float>();

  // Check against a plain loop.
  std::vector<float> xs = x.to_vector<float>(), ys = y.to_vector<float>();
  double worst = 0.0, worst_chain = 0.0;
  for (std::size_t i = 0; i < result.size(); ++i) {
    const float want = std::fmax(xs[i] * ys[i] + 0.1f, 0.0f);
    worst = std::fmax(worst, std::fabs(result[i] - want));
    float c = xs[i];
    for (int k = 0; k < 10; ++k) c = std::fmax(c * ys[i] + 0.1f, 0.0f);
    worst_chain = std::fmax(worst_chain, std::fabs(chained[i] - c) / std::fmax(1.0f, std::fabs(c)));
  }
  std::printf("relu(x*y + 0.1) over %lld elements, written into a std::vector\n", static_cast<long long>(n));
  // On the CPU the first evaluation compiles the kernel, unless an earlier run left it in
  // the disk cache (KILN_CACHE_DIR); the eager backend (KILN_BACKEND=eager) launches one loop
  // per primitive instead.
  std::printf("first evaluation:  %llu launch(es), %llu compile(s)\n", static_cast<unsigned long long>(first.launches),
              static_cast<unsigned long long>(first.compiles));
  std::printf("second evaluation: %llu launch(es), %llu compile(s)\n",
              static_cast<unsigned long long>(second.launches - first.launches),
              static_cast<unsigned long long>(second.compiles - first.compiles));
  std::printf("largest difference from a plain loop: %g (one application), %g relative (ten)\n", worst, worst_chain);
  return worst <= 1e-6 && worst_chain <= 1e-5 ? 0 : 1;
}
