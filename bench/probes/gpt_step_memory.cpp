// Probe: one compiled training step of a GPT (examples/gpt.hpp; bf16 autocast, AdamW) on the
// CPU: its time and the host allocator's high-water mark, the CPU stand-in for T1's peak.
// Not part of the build:
//   g++ -O1 -std=gnu++20 -DKILN_COMPILED_LIBRARY -Iinclude -Iexamples bench/probes/gpt_step_memory.cpp \
//       build/test/libkiln_compiled.a -ldl -lpthread -fopenmp -o /tmp/gpt_step_memory
//   /tmp/gpt_step_memory 6 256 256 8 8192 3      # layers, width, sequence, batch, vocabulary, steps
// (docs/fusion.md, "What crosses steps").
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include "gpt.hpp"
using namespace kiln;
int main(int argc, char** argv) {
  auto arg = [&](int i, long d) { return argc > i ? std::atol(argv[i]) : d; };
  const long L = arg(1, 6), C = arg(2, 256), T = arg(3, 256), B = arg(4, 8), V = arg(5, 8192), steps = arg(6, 3);
  manual_seed(0);
  gpt::Gpt model(gpt::small_config(V, T, L, 4, C));
  model.compile();
  optim::AdamW opt(model.parameters(), {.lr = 1e-3, .weight_decay = 0.1});
  Tensor idx = (rand({B, T}, 1) * float(V - 1)).to(DType::Int64).eval(), tgt = (rand({B, T}, 2) * float(V - 1)).to(DType::Int64).eval();
  for (long s = 0; s < steps; ++s) {
    runtime::reset_host_memory_peak();
    auto t0 = std::chrono::steady_clock::now();
    Tensor loss;
    {
      AutocastGuard amp(DType::BFloat16);
      loss = gpt::Gpt::loss(model(idx), tgt);
    }
    opt.zero_grad();
    loss.backward();
    opt.step();
    const float l = loss.item<float>();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("step %ld loss %.6f  %.0f ms  peak %.1f MiB\n", s, l, ms,
                runtime::host_allocator_stats().peak_in_use_bytes / 1048576.0);
  }
}
