#pragma once
// Helpers shared by the tests that run on a GPU when there is one: whether kiln can compile
// for and run on it (else the case says why it did not run), and a relative comparison of two
// tensors that counts NaN as the worst difference.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include <kiln/kiln.hpp>
#include <kiln/backend/cuda.hpp>

namespace kiln::testing {

/// True when kiln can compile for and run on a GPU here; otherwise says, as a test MESSAGE,
/// why `what` did not run.
inline bool have_gpu(const std::string& what) {
  if (backend::cuda_jit_available()) return true;
  MESSAGE("no usable GPU (" << (cuda_available() ? runtime::nvrtc_unavailable_reason() : cuda_unavailable_reason())
                            << "): " << what << " did not run");
  return false;
}

/// Largest |a - b| / (1 + |b|) over the elements of two tensors of one shape (copied to the
/// host); NaN counts as the worst.
inline double max_rel_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double d = std::fabs(x[i] - y[i]) / (1.0 + std::fabs(y[i]));
    if (!(d <= worst)) worst = d;
  }
  return worst;
}

}  // namespace kiln::testing
