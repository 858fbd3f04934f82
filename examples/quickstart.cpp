// kiln in a few lines: build lazy expressions, evaluate them together, read the results.
// Runs on the CPU; KILN_DEVICE=cuda runs it on the GPU.
#include <kiln/kiln.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace kiln;

int main() {
  const char* dev = std::getenv("KILN_DEVICE");
  const Device device = (dev && std::string(dev) == "cuda") ? Device::cuda() : Device::cpu();

  Tensor x = randn({4096, 4096}, /*seed=*/1, f32, device);  // f32 on the CPU by default
  Tensor w = ones({4096}, f32, device), b = zeros({4096}, f32, device);
  Tensor y = softmax(x * 2.0f + 1.0f, -1);  // lazy: nothing runs yet
  Tensor z = layer_norm(x, w, b, 1e-5);
  std::printf("before eval: y is %s\n", y.str().c_str());

  eval(y, z);  // evaluates both in one schedule
  std::printf("after eval:  y is %s\n", y.str().c_str());

  std::vector<float> host = y.to_vector<float>();  // copies to the host
  std::printf("y[0, 0:4] = %.6g %.6g %.6g %.6g\n", host[0], host[1], host[2], host[3]);

  float total = sum(y).item<float>();  // data access evaluates
  std::printf("sum(y) = %.4f (each of the 4096 rows of a softmax sums to 1)\n", total);
  std::printf("mean(z) = %.3g, var(z) = %.4f (layer_norm: about 0 and 1)\n", mean(z).item<float>(),
              var(z).item<float>());

  // Results can land in memory the caller owns: assign() evaluates into a from_blob view. The
  // view is of host memory, so it is a CPU tensor, and the GPU's result is copied to it.
  std::vector<float> mine(4096);
  Tensor out = from_blob(mine.data(), {4096});
  out.assign(max(y, 1).to(Device::cpu()));
  std::printf("largest probability of row 0: %.6g (written into a std::vector)\n", mine[0]);

  // torch.compile's first example: one library product (a CBLAS here, cuBLASLt on the GPU)
  // and one fused kernel for the bias and relu after it.
  Tensor W = randn({4096, 512}, /*seed=*/2, f32, device), bias = randn({512}, /*seed=*/3, f32, device);
  Tensor h = relu(matmul(x, W) + bias);
  std::printf("relu(x @ W + bias): %s, mean %.4f\n", h.shape().str().c_str(), mean(h).item<float>());

  Stats s = stats();
  std::printf("stats: %llu launches, %llu library calls, %llu compiles\n",
              static_cast<unsigned long long>(s.launches), static_cast<unsigned long long>(s.library_calls),
              static_cast<unsigned long long>(s.compiles));
  return 0;
}
