// The multi-GPU test: run by `scripts/kiln-run -n 2 kiln_nccl_check` on a machine with two or
// more GPUs and NCCL (ctest's distributed/nccl when configured with -DKILN_TEST_NCCL=ON; a
// machine without them cannot run it, so CI does not register it).
//
//   kiln_nccl_check            every collective on CUDA tensors against the values written out,
//                              then DistributedDataParallel over a compiled GPT: the ranks' mean
//                              loss equals one GPU's loss on the whole batch, step by step
//   kiln_nccl_check die        rank 1 leaves after the first collective; rank 0's next
//                              collective must end in a DistributedError within the timeout
//
// Prints one line per failure and "rank R: PASS" when all held; exits 1 on a failure.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "gpt.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;
namespace dist = kiln::distributed;

namespace {

int failures = 0;
void expect(bool ok, const std::string& what) {
  if (ok) return;
  ++failures;
  std::printf("rank %d: FAIL %s\n", dist::get_rank(), what.c_str());
}

std::vector<float> rank_values(int r, int n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<float>((r + 1) * (i + 1)) / 4.0f;
  return v;
}

void collectives(Device gpu) {
  const int r = dist::get_rank(), W = dist::get_world_size(), N = 1000;
  auto on_gpu = [&](const std::vector<float>& v) {
    return from_vector(v, Shape{static_cast<std::int64_t>(v.size())}).to(gpu);
  };
  Tensor sum = on_gpu(rank_values(r, N));
  dist::all_reduce(sum);
  Tensor avg = on_gpu(rank_values(r, N)).to(bf16);
  dist::all_reduce(avg, dist::ReduceOp::Avg);
  Tensor mx = on_gpu(rank_values(r, N));
  dist::all_reduce(mx, dist::ReduceOp::Max);
  Tensor ints = full(Shape{7}, r + 1, i64, gpu);
  dist::all_reduce(ints);
  const std::vector<float> s = sum.to_vector<float>(), a = avg.to_vector<float>(), m = mx.to_vector<float>();
  for (int i = 0; i < N; ++i) {
    float want = 0;
    for (int q = 0; q < W; ++q) want += rank_values(q, N)[static_cast<std::size_t>(i)];
    expect(s[i] == want, "all_reduce sum at " + std::to_string(i));
    expect(m[i] == rank_values(W - 1, N)[static_cast<std::size_t>(i)], "all_reduce max at " + std::to_string(i));
    expect(std::abs(a[i] - want / W) <= 0.01f * want / W, "all_reduce avg bf16 at " + std::to_string(i));
  }
  for (std::int64_t v : ints.to_vector<std::int64_t>()) expect(v == W * (W + 1) / 2, "all_reduce sum int64");
  Tensor b = on_gpu(rank_values(r, N));
  dist::broadcast(b, W - 1);
  expect(b.to_vector<float>() == rank_values(W - 1, N), "broadcast");
  Tensor gathered = empty(Shape{W * N}, f32, gpu);
  dist::all_gather_into_tensor(gathered, on_gpu(rank_values(r, N)));
  const std::vector<float> g = gathered.to_vector<float>();
  for (int q = 0; q < W; ++q)
    expect(std::vector<float>(g.begin() + q * N, g.begin() + (q + 1) * N) == rank_values(q, N), "all_gather");
  Tensor part = empty(Shape{N}, f32, gpu);
  dist::reduce_scatter_tensor(part, on_gpu(rank_values(r, W * N)));
  const std::vector<float> p = part.to_vector<float>();
  for (int i = 0; i < N; ++i) {
    float want = 0;
    for (int q = 0; q < W; ++q) want += rank_values(q, W * N)[static_cast<std::size_t>(r * N + i)];
    expect(p[i] == want, "reduce_scatter at " + std::to_string(i));
  }
  dist::barrier();
}

void ddp_gpt(Device gpu) {
  const int r = dist::get_rank(), W = dist::get_world_size();
  const gpt::Config c = gpt::small_config(64, 32, 2, 4, 64);
  const std::int64_t B = 4 * W, T = 32;
  const auto [tx, ty] = gpt::counting_batch(B, T, 64, 5, gpu);
  constexpr int steps = 5;
  auto run = [&](bool distributed) {
    manual_seed(distributed ? 100 + r : 100);  // rank 1 starts elsewhere: the broadcast fixes it
    auto model = std::make_shared<gpt::Gpt>(c);
    model->to(gpu);
    model->compile();
    std::unique_ptr<nn::DistributedDataParallel> ddp;
    if (distributed) ddp = std::make_unique<nn::DistributedDataParallel>(model);
    optim::AdamW opt(ddp ? ddp->parameters() : model->parameters(), {.lr = 3e-3});
    const std::int64_t share = B / W;
    const Tensor x = distributed ? slice(tx, 0, r * share, (r + 1) * share) : tx;
    const Tensor y = distributed ? slice(ty, 0, r * share, (r + 1) * share) : ty;
    std::vector<float> losses;
    for (int s = 0; s < steps; ++s) {
      Tensor loss = gpt::Gpt::loss(ddp ? (*ddp)(x) : (*model)(x), y);
      opt.zero_grad();
      loss.backward();
      opt.step();
      if (distributed) {
        Tensor mean_loss = loss.detach();
        dist::all_reduce(mean_loss, dist::ReduceOp::Avg);
        losses.push_back(mean_loss.item<float>());
      } else {
        losses.push_back(loss.item<float>());
      }
    }
    return losses;
  };
  const std::vector<float> one = run(false), many = run(true);
  for (int s = 0; s < steps; ++s) {
    std::printf("rank %d: step %d loss %.6f (one GPU, whole batch %.6f)\n", r, s, many[s], one[s]);
    expect(std::abs(many[s] - one[s]) <= 2e-4f * std::abs(one[s]), "GPT loss at step " + std::to_string(s));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  dist::Options options;
  if (mode == "die") options.timeout = std::chrono::seconds(5);
  dist::init_from_env(options);
  const Device gpu = dist::default_group().device();
  if (mode == "die") {
    Tensor t = full(Shape{1 << 20}, 1.0f, f32, gpu);
    dist::all_reduce(t);
    dist::barrier();
    if (dist::get_rank() == 1) std::_Exit(0);  // gone without a word
    const auto t0 = std::chrono::steady_clock::now();
    try {
      dist::all_reduce(t);
      dist::barrier();
      std::printf("rank 0: FAIL the collective with a departed rank completed\n");
      return 1;
    } catch (const DistributedError& e) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("rank 0: DistributedError after %.1f s: %s\n", s, e.what());
      if (s > 15) return 1;
    }
    std::printf("rank 0: PASS\n");
    return 0;
  }
  collectives(gpu);
  ddp_gpt(gpu);
  if (failures == 0) std::printf("rank %d: PASS\n", dist::get_rank());
  return failures == 0 ? 0 : 1;
}
