// softmax and layer_norm over the last axis, evaluated together, checked against a plain
// double-precision loop over a few rows.
#include <kiln/kiln.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

using namespace kiln;

int main() {
  const std::int64_t rows = 1024, cols = 768;
  Tensor x = randn({rows, cols}, /*seed=*/42) * 3.0f;
  Tensor weight = rand({cols}, /*seed=*/1) + 0.5f;  // per-feature scale in [0.5, 1.5)
  Tensor bias = full({cols}, 0.25);

  Tensor probs = softmax(x, -1);
  Tensor normed = layer_norm(x, weight, bias, 1e-5);
  Tensor logp = log_softmax(x, -1);
  eval(probs, normed, logp);  // one evaluation: x is read once for all three

  std::vector<float> xv = x.to_vector<float>(), pv = probs.to_vector<float>(), nv = normed.to_vector<float>(),
                     lv = logp.to_vector<float>(), wv = weight.to_vector<float>();
  double worst_p = 0, worst_n = 0, worst_l = 0;
  for (std::int64_t r : {std::int64_t{0}, rows / 2, rows - 1}) {
    const float* row = &xv[static_cast<std::size_t>(r * cols)];
    double mx = *std::max_element(row, row + cols), z = 0, mean = 0, var = 0;
    for (std::int64_t c = 0; c < cols; ++c) z += std::exp(row[c] - mx), mean += row[c];
    mean /= static_cast<double>(cols);
    for (std::int64_t c = 0; c < cols; ++c) var += (row[c] - mean) * (row[c] - mean);
    var /= static_cast<double>(cols);  // layer_norm uses the biased variance, as PyTorch
    for (std::int64_t c = 0; c < cols; ++c) {
      const std::size_t i = static_cast<std::size_t>(r * cols + c);
      const double p = std::exp(row[c] - mx) / z;
      const double n = (row[c] - mean) / std::sqrt(var + 1e-5) * wv[static_cast<std::size_t>(c)] + 0.25;
      worst_p = std::max(worst_p, std::fabs(pv[i] - p) / p);
      worst_n = std::max(worst_n, std::fabs(nv[i] - n));
      worst_l = std::max(worst_l, std::fabs(lv[i] - std::log(p)));
    }
  }
  std::printf("softmax row sums: %.6f (mean over %lld rows)\n", mean(sum(probs, -1)).item<float>(),
              static_cast<long long>(rows));
  std::printf("layer_norm: mean of row 0 before the affine part should be ~0: %.2e\n",
              mean(slice((normed - bias) / weight, 0, 0, 1)).item<float>());
  std::printf("largest error vs float64 loops: softmax %.2e (relative), layer_norm %.2e, log_softmax %.2e\n", worst_p,
              worst_n, worst_l);
  return worst_p < 1e-5 && worst_n < 1e-4 && worst_l < 1e-4 ? 0 : 1;
}
