// The smallest complete training loop: an MLP (kiln::nn::Sequential) learns to classify points
// of three interleaved spirals with AdamW and cross_entropy; the forward runs compiled
// (model.compile()). Prints the loss and the accuracy; exits non-zero if it did not learn.
// Runs on the CPU; KILN_DEVICE=cuda runs it on the GPU.
#include <kiln/kiln.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace kiln;

int main() {
  const char* dev = std::getenv("KILN_DEVICE");
  const Device device = (dev && std::string(dev) == "cuda") ? Device::cuda() : Device::cpu();
  manual_seed(0);

  // Three spirals of 256 points each: x [768, 2], labels [768].
  const int classes = 3, per_class = 256;
  std::vector<float> points;
  std::vector<std::int64_t> labels;
  for (int c = 0; c < classes; ++c)
    for (int i = 0; i < per_class; ++i) {
      const double r = static_cast<double>(i) / per_class;
      const double t = c * 2.0944 + 4.0 * r + 0.2 * std::sin(37.0 * i + c);
      points.push_back(static_cast<float>(r * std::sin(t)));
      points.push_back(static_cast<float>(r * std::cos(t)));
      labels.push_back(c);
    }
  const std::int64_t n = classes * per_class;
  Tensor x = from_vector(points, {n, 2}, device);
  Tensor y = from_vector(labels, {n}, device);

  auto model = nn::Sequential(nn::Linear(2, 64), nn::GELU("tanh"), nn::Linear(64, 64), nn::GELU("tanh"),
                              nn::Linear(64, classes));
  model.to(device);
  model.compile();
  optim::AdamW opt(model.parameters(), {.lr = 1e-2, .weight_decay = 1e-4});

  float first = 0, last = 0;
  for (int step = 0; step < 200; ++step) {
    Tensor loss = cross_entropy(model(x), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
    const float l = loss.item<float>();
    if (step == 0) first = l;
    last = l;
    if (step % 40 == 0 || step == 199) std::printf("step %3d  loss %.4f\n", step, l);
  }
  model.eval();
  NoGradGuard no_grad;
  const float accuracy = mean((argmax(model(x), 1) == y).to(f32)).item<float>();
  std::printf("accuracy %.3f (loss %.4f -> %.4f)\n", accuracy, first, last);
  return last < 0.5f * first && accuracy > 0.8f ? 0 : 1;
}
