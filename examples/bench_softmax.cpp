// A user's microbenchmark of softmax on kiln's benchmark kit (kiln/bench.hpp, Google Benchmark).
// The first call (JIT compile or disk-cache load) is reported apart as compile_ms; the timed
// loop gives GB/s and x_copy, the fraction of this device's copy bandwidth.
//   bench_softmax --benchmark_min_time=0.2            KILN_DEVICE=cuda bench_softmax
//   KILN_BENCH_JSON=softmax.json bench_softmax && scripts/plot-bench softmax.json softmax.png
#include <kiln/bench.hpp>

using namespace kiln;

static void softmax_rows(benchmark::State& state) {
  const Device device = bench::default_device();          // KILN_DEVICE, else the CPU
  if (bench::skip_if_unavailable(state, device)) return;  // no GPU: skipped, with the reason
  const std::int64_t rows = state.range(0), cols = 4096;
  Tensor x = randn({rows, cols}, /*seed=*/1, f32, device);
  x.eval();  // the input exists before the benchmark starts
  // Reads x once, writes the result once; about 5 flops per element (max, sub, exp, sum, mul).
  const bench::Work work{.bytes = 2.0 * rows * cols * 4, .flops = 5.0 * rows * cols};
  bench::run(state, device, work, [&] { return softmax(x, -1); });
}
KILN_BENCH(softmax_rows)->Arg(1024)->Arg(4096)->Unit(benchmark::kMillisecond);

KILN_BENCH_MAIN();
