// Eigen and kiln side by side: kiln computes over Eigen's memory without copying it, and Eigen
// reads kiln's results without copying them.
#include <kiln/eigen.hpp>
#include <kiln/kiln.hpp>

#include <cstdio>

using namespace kiln;

int main() {
  // A column-major Eigen matrix (Eigen's default) viewed as a [rows, cols] tensor: same memory,
  // column-major strides.
  Eigen::MatrixXf a = Eigen::MatrixXf::Random(4, 6);
  Tensor t = from_eigen(a);
  std::printf("tensor view of a: shape %s, strides [%lld, %lld], same memory: %s\n", t.shape().str().c_str(),
              static_cast<long long>(t.strides()[0]), static_cast<long long>(t.strides()[1]),
              t.data_ptr<float>() == a.data() ? "yes" : "no");

  // kiln computes; the result is copied into a new Eigen matrix...
  Eigen::MatrixXf probs = to_eigen<Eigen::MatrixXf>(softmax(t, -1));
  std::printf("softmax row sums (Eigen): %s\n",
              (probs.rowwise().sum().transpose().array() - 1.0f).abs().maxCoeff() < 1e-6f ? "all 1" : "WRONG");

  // ...or written straight into Eigen's memory through the view.
  Eigen::MatrixXf b(4, 6);
  from_eigen(b).assign(tanh(t) * 0.5f);
  std::printf("b == 0.5 tanh(a): %s\n",
              (b - 0.5f * a.array().tanh().matrix()).cwiseAbs().maxCoeff() < 1e-6f ? "yes" : "no");

  // An Eigen Map over an evaluated tensor: Eigen reads kiln's buffer in place.
  Tensor y = layer_norm(t, Tensor{}, Tensor{}, 1e-5);
  y.eval();
  auto m = to_eigen<Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>>(y);
  std::printf("layer_norm row means seen by Eigen: %.1e .. %.1e (map over kiln's memory: %s)\n",
              m.rowwise().mean().minCoeff(), m.rowwise().mean().maxCoeff(),
              m.data() == y.data_ptr<float>() ? "yes" : "no");

  // Eigen::Tensor works as well; its default column-major layout is kept as strides.
  Eigen::Tensor<float, 3> e(2, 3, 4);
  e.setRandom();
  Tensor te = from_eigen(e);
  Eigen::Tensor<float, 3> doubled = to_eigen<Eigen::Tensor<float, 3>>(te * 2.0f);
  std::printf("Eigen::Tensor round trip: e(1,2,3) = %g, doubled = %g\n", e(1, 2, 3), doubled(1, 2, 3));
  return doubled(1, 2, 3) == 2.0f * e(1, 2, 3) ? 0 : 1;
}
