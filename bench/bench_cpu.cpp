// The CPU workloads of WORKLOADS.md (CPU shapes), each timed with the reference executor
// ("eager": op by op, every intermediate materialised) and with the JIT (fused, compiled),
// beside a plain copy of memory measured in the same run. Every workload reports its bytes
// (the least traffic a perfect kernel needs), so Google Benchmark prints bytes_per_second,
// and `ratio_to_copy`: that bandwidth divided by the copy bandwidth measured at start-up.
//
//   bench_cpu --benchmark_out=cpu.json --benchmark_out_format=json
//   KILN_NUM_THREADS=2 taskset -c 0,1 bench_cpu      # the 2-core setting of WORKLOADS.md
#include <benchmark/benchmark.h>
#include <kiln/core/version.hpp>
#include <kiln/kiln.hpp>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace kiln;

namespace {

constexpr std::int64_t kN = std::int64_t{1} << 24;  // P1-P3, R1
constexpr std::int64_t kM = 4096, kK = 4096;        // P4, R2, R3, N1, N3, N4, N5

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// Threads of the copy baseline: KILN_NUM_THREADS, else the CPUs this process may run on.
int copy_threads() {
  if (const char* v = std::getenv("KILN_NUM_THREADS"); v && std::atoi(v) > 0) return std::atoi(v);
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

/// Copies `bytes` from src to dst with `threads` threads, each memcpy'ing one contiguous part.
void parallel_copy(char* dst, const char* src, std::size_t bytes, int threads) {
  if (threads <= 1) {
    std::memcpy(dst, src, bytes);
    return;
  }
  std::vector<std::thread> pool;
  const std::size_t part = (bytes / threads + 63) / 64 * 64;
  for (int t = 0; t < threads; ++t) {
    const std::size_t begin = std::min(bytes, part * t), end = std::min(bytes, begin + part);
    pool.emplace_back([=] { std::memcpy(dst + begin, src + begin, end - begin); });
  }
  for (auto& th : pool) th.join();
}

struct CopyBuffers {
  std::vector<char> src, dst;
  explicit CopyBuffers(std::size_t bytes) : src(bytes, 1), dst(bytes, 0) {}
};

/// Copy bandwidth (bytes read + bytes written per second) of 2^24 floats, best of 10 runs.
double measure_copy_bandwidth() {
  const std::size_t bytes = static_cast<std::size_t>(kN) * sizeof(float);
  CopyBuffers b(bytes);
  const int threads = copy_threads();
  parallel_copy(b.dst.data(), b.src.data(), bytes, threads);  // touch the pages
  double best = 0;
  for (int rep = 0; rep < 10; ++rep) {
    const auto t0 = Clock::now();
    parallel_copy(b.dst.data(), b.src.data(), bytes, threads);
    const double s = seconds_since(t0);
    best = std::max(best, 2.0 * static_cast<double>(bytes) / s);
  }
  return best;
}

double g_copy_bytes_per_second = 0;  // set in main before any benchmark runs

/// Declares the bytes one iteration moves and sets ratio_to_copy from the loop's wall time
/// (a plain number: Google Benchmark's rate counters would print it per second).
void report_bytes(benchmark::State& state, double bytes_per_iteration, double loop_seconds) {
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes_per_iteration) * state.iterations());
  if (loop_seconds > 0)
    state.counters["ratio_to_copy"] =
        bytes_per_iteration * static_cast<double>(state.iterations()) / loop_seconds / g_copy_bytes_per_second;
}

void BM_copy(benchmark::State& state) {
  const std::size_t bytes = static_cast<std::size_t>(kN) * sizeof(float);
  CopyBuffers b(bytes);
  const int threads = static_cast<int>(state.range(0)) > 0 ? static_cast<int>(state.range(0)) : copy_threads();
  parallel_copy(b.dst.data(), b.src.data(), bytes, threads);
  const auto t0 = Clock::now();
  for (auto _ : state) {
    parallel_copy(b.dst.data(), b.src.data(), bytes, threads);
    benchmark::ClobberMemory();
  }
  const double seconds = seconds_since(t0);
  state.counters["threads"] = threads;
  report_bytes(state, 2.0 * static_cast<double>(bytes), seconds);
}

/// One workload: makes (and evaluates) its inputs, then builds its result from them.
struct Workload {
  const char* id;
  std::function<std::vector<Tensor>()> inputs;
  std::function<Tensor(const std::vector<Tensor>&)> compute;
  double bytes;  // 0: launch-bound, no bandwidth reported
};

std::vector<Tensor> evaluated(std::vector<Tensor> ts) {
  for (auto& t : ts) t.eval();
  return ts;
}

Tensor gelu_written_out(const Tensor& x) {
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): eight pointwise ops.
  return 0.5f * x * (1.0f + tanh(0.7978845608f * (x + 0.044715f * (x * x * x))));
}

const std::vector<Workload>& workloads() {
  static const std::vector<Workload> w = {
      {"P1_2x_plus_y", [] { return evaluated({randn({kN}, 1), randn({kN}, 2)}); },
       [](const auto& in) -> Tensor { return 2.0f * in[0] + in[1]; }, 3.0 * kN * 4},
      {"P2_gelu_tanh_8ops", [] { return evaluated({randn({kN}, 1)}); },
       [](const auto& in) { return gelu_written_out(in[0]); }, 2.0 * kN * 4},
      {"P3_16x_sin_chain", [] { return evaluated({randn({kN}, 1)}); },
       [](const auto& in) {
         Tensor x = in[0];
         for (int i = 0; i < 16; ++i) x = sin(x) * 1.01f + 0.5f;
         return x;
       },
       2.0 * kN * 4},
      {"P4_broadcast_affine",
       [] { return evaluated({randn({kM, kK}, 1), randn({kM, 1}, 2), rand({kK}, 3), randn({kK}, 4)}); },
       [](const auto& in) -> Tensor { return (in[0] - in[1]) * in[2] + in[3]; }, 2.0 * kM * kK * 4},
      {"R1_sum_x_squared", [] { return evaluated({randn({kN}, 1)}); },
       [](const auto& in) { return sum(in[0] * in[0]); }, 1.0 * kN * 4},
      {"R2_row_sum", [] { return evaluated({randn({kM, kK}, 1)}); },
       [](const auto& in) { return sum(in[0], {1}); }, 1.0 * kM * kK * 4},
      {"R3_column_sum", [] { return evaluated({randn({kM, kK}, 1)}); },
       [](const auto& in) { return sum(in[0], {0}); }, 1.0 * kM * kK * 4},
      {"N1_softmax", [] { return evaluated({randn({kM, kK}, 1)}); },
       [](const auto& in) { return softmax(in[0], -1); }, 2.0 * kM * kK * 4},
      {"N2_softmax_short_rows", [] { return evaluated({randn({16384, 1024}, 1)}); },
       [](const auto& in) { return softmax(in[0], -1); }, 2.0 * 16384 * 1024 * 4},
      {"N3_layer_norm", [] { return evaluated({randn({kM, kK}, 1), rand({kK}, 2), randn({kK}, 3)}); },
       [](const auto& in) { return layer_norm(in[0], in[1], in[2], 1e-5); }, 2.0 * kM * kK * 4},
      {"N4_rms_norm_written_out", [] { return evaluated({randn({kM, kK}, 1), rand({kK}, 2)}); },
       [](const auto& in) -> Tensor { return in[0] * rsqrt(mean(in[0] * in[0], {-1}, true) + 1e-6f) * in[1]; },
       2.0 * kM * kK * 4},
      {"N5_softmax_bf16", [] { return evaluated({randn({kM, kK}, 1, bf16)}); },
       [](const auto& in) { return softmax(in[0], -1); }, 2.0 * kM * kK * 2},
      {"N6_cross_entropy",
       [] {
         const std::int64_t rows = 2048, classes = 32768;
         Tensor targets = Tensor(rand({rows}, 2, f64) * static_cast<double>(classes)).to(i64);
         return evaluated({randn({rows, classes}, 1), targets});
       },
       [](const auto& in) { return cross_entropy(in[0], in[1]); }, 1.0 * 2048 * 32768 * 4},
      {"S1_10x_relu_chain_4096", [] { return evaluated({randn({4096}, 1), rand({4096}, 2)}); },
       [](const auto& in) {
         Tensor x = in[0];
         for (int i = 0; i < 10; ++i) x = relu(x * in[1] + 0.1f);
         return x;
       },
       0.0},
  };
  return w;
}

void BM_workload(benchmark::State& state, const Workload& w, Backend backend) {
  const Backend saved = get_backend();
  set_backend(backend);
  try {
    const std::vector<Tensor> in = w.inputs();
    w.compute(in).eval();  // warm-up: the JIT compiles (or loads from its cache) here
    const Stats before = stats();
    const auto t0 = Clock::now();
    for (auto _ : state) {
      Tensor r = w.compute(in);  // a new result each call, as a user's loop makes
      r.eval();
    }
    const double seconds = seconds_since(t0);
    const Stats after = stats();
    state.counters["launches_per_call"] = static_cast<double>(after.launches - before.launches) /
                                          static_cast<double>(std::max<benchmark::IterationCount>(1, state.iterations()));
    if (w.bytes > 0) report_bytes(state, w.bytes, seconds);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
  set_backend(saved);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  g_copy_bytes_per_second = measure_copy_bandwidth();
  benchmark::AddCustomContext("copy_GB_per_s", std::to_string(g_copy_bytes_per_second / 1e9));
  benchmark::AddCustomContext("copy_threads", std::to_string(copy_threads()));
  benchmark::AddCustomContext("kiln_version", version_string);

  benchmark::RegisterBenchmark("copy/threads:all", BM_copy)->Arg(0)->UseRealTime()->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("copy/threads:1", BM_copy)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond);
  for (const Workload& w : workloads()) {
    for (auto [name, backend] : {std::pair{"eager", Backend::Eager}, std::pair{"jit", Backend::Jit}}) {
      benchmark::RegisterBenchmark((std::string(w.id) + "/" + name).c_str(), BM_workload, w, backend)
          ->UseRealTime()
          ->Unit(w.bytes > 0 ? benchmark::kMillisecond : benchmark::kMicrosecond);
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
