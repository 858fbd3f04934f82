// Data-parallel training: examples/train_mlp.cpp's spiral classifier, each rank on its own
// share of the points, nn::DistributedDataParallel averaging the gradients, so every replica
// takes the step the whole batch would give.
//
//   train_ddp                              two ranks as threads of this process, on the CPU
//   scripts/kiln-run -n 2 ./train_ddp      one process per GPU (NCCL), cuda:LOCAL_RANK each
//
// Rank 0 prints the loss averaged over the ranks and the accuracy; exits non-zero if the model
// did not learn or the replicas drifted apart.
#include <kiln/kiln.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

using namespace kiln;
namespace dist = kiln::distributed;

namespace {

/// Trains on the points whose index is `rank` mod the world size; true when it learnt.
bool train(Device device) {
  const int rank = dist::get_rank(), world = dist::get_world_size();
  const int classes = 3, per_class = 256;
  std::vector<float> points, mine;
  std::vector<std::int64_t> labels, my_labels;
  for (int c = 0; c < classes; ++c)
    for (int i = 0; i < per_class; ++i) {
      const double r = static_cast<double>(i) / per_class;
      const double t = c * 2.0944 + 4.0 * r + 0.2 * std::sin(37.0 * i + c);
      const float px = static_cast<float>(r * std::sin(t)), py = static_cast<float>(r * std::cos(t));
      points.insert(points.end(), {px, py});
      labels.push_back(c);
      if ((c * per_class + i) % world == rank) {
        mine.insert(mine.end(), {px, py});
        my_labels.push_back(c);
      }
    }
  const auto n = static_cast<std::int64_t>(labels.size()), m = static_cast<std::int64_t>(my_labels.size());
  const Tensor x = from_vector(mine, {m, 2}, device), y = from_vector(my_labels, {m}, device);

  // The global generator is the process's: thread ranks draw their initial weights one at a
  // time, each from seed 0 (the DDP's broadcast would make them equal anyway; this makes the run
  // repeatable).
  static std::mutex init_mutex;
  std::shared_ptr<nn::Sequential> model;
  {
    std::lock_guard lock(init_mutex);
    manual_seed(0);
    model = std::make_shared<nn::Sequential>(nn::Linear(2, 64), nn::GELU("tanh"), nn::Linear(64, 64), nn::GELU("tanh"),
                                             nn::Linear(64, classes));
  }
  model->to(device);
  model->compile();
  nn::DistributedDataParallel ddp(model);  // rank 0's weights on every rank
  optim::AdamW opt(ddp.parameters(), {.lr = 1e-2, .weight_decay = 1e-4});

  float first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    Tensor loss = cross_entropy(ddp(x), y);
    opt.zero_grad();
    loss.backward();  // the gradients are averaged over the ranks here
    opt.step();
    Tensor mean_loss = loss.detach();
    dist::all_reduce(mean_loss, dist::ReduceOp::Avg);
    const float l = mean_loss.item<float>();
    if (step == 0) first = l;
    last = l;
    if (rank == 0 && (step % 30 == 0 || step == 149))
      std::printf("step %3d  loss %.4f (mean of %d ranks)\n", step, l, world);
  }
  // The replicas must still be equal: the largest difference of a weight from rank 0's.
  float drift = 0;
  for (const Tensor& p : ddp.parameters()) {
    Tensor from_rank0 = p.detach() + 0.0f;
    dist::broadcast(from_rank0, 0);
    drift = std::max(drift, max(abs(from_rank0 - p.detach())).item<float>());
  }
  model->eval();
  NoGradGuard no_grad;
  const Tensor all_x = from_vector(points, {n, 2}, device), all_y = from_vector(labels, {n}, device);
  const float accuracy = mean((argmax((*model)(all_x), 1) == all_y).to(f32)).item<float>();
  if (rank == 0) std::printf("accuracy %.3f (loss %.4f -> %.4f), replicas drift %g\n", accuracy, first, last, drift);
  return last < 0.5f * first && accuracy > 0.8f && drift == 0.0f;
}

}  // namespace

int main() {
  if (std::getenv("RANK")) {  // started by scripts/kiln-run: one process per GPU
    dist::init_from_env();
    return train(dist::default_group().device()) ? 0 : 1;
  }
  std::atomic<bool> ok{true};
  dist::run_threads(2, [&](int) {
    if (!train(Device::cpu())) ok = false;
  });
  return ok ? 0 : 1;
}
