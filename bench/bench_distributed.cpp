// Collectives between GPUs (NCCL), on kiln's benchmark kit. Every rank runs the same benchmarks
// with a fixed number of iterations (a collective needs every rank in step; Google Benchmark's
// adaptive iteration count would differ between processes); rank 0 prints.
//
//   scripts/kiln-run -n 2 build/bench/bench_distributed     # beside bench/torch_distributed.py
//
// D1: all_reduce (sum) of 256 MiB of float32. Reported as nccl-tests reports it: algbw = bytes /
// time and busbw = algbw * 2 (n - 1) / n, the bandwidth each link carried, comparable across
// rank counts. Without a launcher it runs as one rank (a group of one GPU).
//
// D2: bench_gpu's T1 (the GPT step: 6 layers, d 768, T 1024, batch 16 a rank, bf16 autocast,
// AdamW, the forward compiled) with the model in DistributedDataParallel. tokens/s counts every
// rank's tokens; run with -n 1 and -n 2 for the scaling efficiency (2-rank tokens/s over twice
// the 1-rank figure), beside torch.compile + DDP (bench/torch_distributed.py).
#include <kiln/bench.hpp>
#include <kiln/kiln.hpp>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "t1.hpp"

namespace {

using namespace kiln;
namespace dist = kiln::distributed;

void D1_all_reduce(benchmark::State& state) {
  const std::int64_t bytes = state.range(0) << 20;
  const int world = dist::get_world_size();
  const Device gpu = dist::default_group().device();
  Tensor t = full(Shape{bytes / 4}, 1.0f, f32, gpu).eval();
  const bench::Measurement m = bench::run(state, gpu, {}, [&] { dist::all_reduce(t); });
  const double algbw = static_cast<double>(bytes) / (m.ms * 1e-3) / 1e9;
  state.counters["algbw_GB/s"] = algbw;
  state.counters["busbw_GB/s"] = algbw * 2.0 * (world - 1) / world;
  state.counters["ranks"] = world;
}

void D2_gpt_step_ddp(benchmark::State& state) {
  const Device gpu = dist::default_group().device();
  const int rank = dist::get_rank(), world = dist::get_world_size();
  const gpt::Config c = t1::config();
  manual_seed(0);
  auto model = std::make_shared<gpt::Gpt>(c);
  model->to(gpu);
  model->compile();
  nn::DistributedDataParallel ddp(model);
  optim::AdamW opt(ddp.parameters(), {.lr = 3e-4, .weight_decay = 0.1});
  const std::int64_t B = 16, T = 1024;
  Tensor idx = t1::token_ids(B, T, c.vocab_size, 1 + 2 * static_cast<std::uint64_t>(rank), gpu);
  Tensor tgt = t1::token_ids(B, T, c.vocab_size, 2 + 2 * static_cast<std::uint64_t>(rank), gpu);
  auto step = [&] {
    Tensor loss;
    {
      AutocastGuard amp(bf16);
      loss = gpt::Gpt::loss(ddp(idx), tgt);
    }
    opt.zero_grad();
    loss.backward();
    opt.step();
    return loss;
  };
  const bench::Measurement m = bench::run(state, gpu, {}, step);
  state.counters["tokens/s"] = static_cast<double>(B * T * world) / (m.median_ms * 1e-3);
  state.counters["ranks"] = world;
  state.counters["first_step_s"] = m.first_call_ms / 1e3;
}

}  // namespace

int main(int argc, char** argv) {
  if (std::getenv("RANK")) {
    dist::init_from_env();
  } else {
    dist::init(0, 1, dist::make_unique_id());
  }
  if (dist::get_rank() != 0 && !std::freopen("/dev/null", "w", stdout)) return 1;
  bench::add("D1_all_reduce", D1_all_reduce)->Arg(256)->Iterations(20)->UseManualTime();
  bench::add("D2_gpt_step_ddp", D2_gpt_step_ddp)->Iterations(5)->Unit(benchmark::kMillisecond);
  const int status = bench::run_main(argc, argv);
  dist::barrier();
  return status;
}
