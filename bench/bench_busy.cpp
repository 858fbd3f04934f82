// Kernels on a busy machine: a fused 64K-element pointwise kernel, a 256 x 1024 softmax, and the
// large P1 and N1 workloads of docs/performance.md, each timed alone and beside busy-loop
// threads started by the benchmark for its timed loop (`hogs:N`: none, one per CPU this process
// may run on, and four per CPU), so that the team sizing of backend/cpu_jit.hpp
// (KILN_THREAD_POLICY) shows what it gains on a loaded machine and what it costs on an idle one.
// `threshold/...` sweeps the sizes around the team threshold (run it with
// KILN_THREAD_POLICY=fixed and KILN_NUM_THREADS=1, then 2 with GOMP_SPINCOUNT=300: where 2
// threads start to win).
//
//   # before/after in one session: the old behaviour is KILN_THREAD_POLICY=fixed; alternate
//   # the two, a few rounds, and take medians (libgomp reads its spin setting once per process,
//   # so the two policies cannot share a process)
//   for r in 1 2 3; do for p in fixed auto; do
//     KILN_THREAD_POLICY=$p bench_busy --benchmark_filter='^busy/' --benchmark_min_time=0.5; done; done
//
// Counters: median_us and p90_us of single calls (the time column is their mean, which is what a
// loop of calls pays), hogs (busy threads during the loop), gap_us (host work between calls,
// untimed: idle workers of a team go to sleep when it is longer than libgomp's spin), and
// load_1min (the load average when the loop ended). The hogs start after the kernel's first
// call (the compile) and stop with the loop; they also stop by themselves after 10 minutes.
#include <benchmark/benchmark.h>
#include <sched.h>
#include <unistd.h>

#include <kiln/bench.hpp>
#include <kiln/kiln.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

using namespace kiln;

namespace {

using Clock = std::chrono::steady_clock;
const Device kCpu = Device::cpu();

/// `n` threads that spin until destroyed (or for 10 minutes at most).
class Hogs {
 public:
  explicit Hogs(int n) {
    const auto deadline = Clock::now() + std::chrono::minutes(10);
    for (int i = 0; i < std::min(n, 256); ++i)
      threads_.emplace_back([this, deadline] {
        std::uint64_t spins = 0;
        while (!stop_.load(std::memory_order_relaxed)) {
          benchmark::DoNotOptimize(++spins);
          if ((spins & 0xFFFFF) == 0 && Clock::now() > deadline) return;
        }
      });
  }
  ~Hogs() {
    stop_.store(true);
    for (auto& t : threads_) t.join();
  }
  Hogs(const Hogs&) = delete;
  Hogs& operator=(const Hogs&) = delete;

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

/// Keeps the calling thread busy for `us` microseconds (host work between two calls).
void host_work(double us) {
  if (us <= 0) return;
  const auto until = Clock::now() + std::chrono::duration<double, std::micro>(us);
  while (Clock::now() < until) {}
}

/// Times `body` call by call beside `hogs` busy threads, `gap_us` of host work before each call.
void timed(benchmark::State& state, const std::function<void()>& body, int hogs, double gap_us) {
  set_backend(Backend::Jit);
  bench::first_call(state, kCpu, body);  // the compile, before the hogs start
  body();
  std::vector<double> samples;
  {
    Hogs busy(hogs);
    for (auto _ : state) {
      host_work(gap_us);
      const auto t0 = Clock::now();
      body();
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      state.SetIterationTime(s);
      if (samples.size() < (std::size_t{1} << 20)) samples.push_back(s);
    }
  }
  double load[3] = {0, 0, 0};
  if (::getloadavg(load, 3) < 1) load[0] = -1;
  std::sort(samples.begin(), samples.end());
  if (!samples.empty()) {
    state.counters["median_us"] = samples[samples.size() / 2] * 1e6;
    state.counters["p90_us"] = samples[samples.size() * 9 / 10] * 1e6;
  }
  state.counters["hogs"] = hogs;
  state.counters["gap_us"] = gap_us;
  state.counters["load_1min"] = load[0];
}

/// `z.assign(2x + y)` over n elements: one fused pointwise kernel, no allocation per call.
void pointwise(benchmark::State& state, std::int64_t n, int hogs, double gap_us) {
  Tensor x = randn({n}, 1), y = randn({n}, 2), z = zeros({n});
  x.eval();
  y.eval();
  z.eval();
  timed(
      state, [&] { z.assign(2.0f * x + y); }, hogs, gap_us);
}

/// softmax over the last axis of rows x cols: one fused row kernel.
void softmax_rows(benchmark::State& state, std::int64_t rows, std::int64_t cols, int hogs, double gap_us) {
  Tensor x = randn({rows, cols}, 1);
  x.eval();
  timed(
      state,
      [&] {
        Tensor s = softmax(x, -1);
        s.eval();
      },
      hogs, gap_us);
}

/// 16 x `x = sin(x) * 1.01 + 0.5` over n elements: a costly pointwise kernel.
void sin_chain(benchmark::State& state, std::int64_t n, int hogs, double gap_us) {
  Tensor x = randn({n}, 1);
  x.eval();
  timed(
      state,
      [&] {
        Tensor v = x;
        for (int i = 0; i < 16; ++i) v = sin(v) * 1.01f + 0.5f;
        v.eval();
      },
      hogs, gap_us);
}

/// CPUs this process may run on (not KILN_NUM_THREADS: the hogs load the machine, whatever the
/// team size being measured).
int cpus() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace

int main(int argc, char** argv) {
  // A fresh cache directory unless one is set, as bench_cpu does: no figure depends on an
  // earlier run's disk cache.
  std::string fresh;
  if (env::get("KILN_CACHE_DIR").empty()) {
    fresh = (std::filesystem::temp_directory_path() / ("kiln-bench-busy-" + std::to_string(::getpid()))).string();
    ::setenv("KILN_CACHE_DIR", fresh.c_str(), 1);
  }
  if (!bench::initialize(argc, argv)) return 1;
  benchmark::AddCustomContext("kiln_thread_policy", env::get("KILN_THREAD_POLICY", "auto"));
  benchmark::AddCustomContext("omp_settings", "OMP_WAIT_POLICY=" + env::get("OMP_WAIT_POLICY", "unset") +
                                                  " GOMP_SPINCOUNT=" + env::get("GOMP_SPINCOUNT", "unset"));
  const int n = cpus();
  const std::vector<int> hog_counts = {0, n, 4 * n};
  for (double gap : {0.0, 100.0}) {
    const std::string g = "/gap_us:" + std::to_string(static_cast<int>(gap));
    for (int h : hog_counts) {
      const std::string suffix = "/hogs:" + std::to_string(h) + g;
      bench::add("busy/pointwise_64k" + suffix, pointwise, std::int64_t{65536}, h, gap)->Unit(benchmark::kMicrosecond);
      bench::add("busy/softmax_256x1024" + suffix, softmax_rows, std::int64_t{256}, std::int64_t{1024}, h, gap)
          ->Unit(benchmark::kMicrosecond);
    }
  }
  for (int h : hog_counts) {
    const std::string suffix = "/hogs:" + std::to_string(h);
    // Calls of 10-200 ms: a longer loop, so that a few slow ones do not decide the mean.
    bench::add("busy/P1_2x_plus_y_2^24" + suffix, pointwise, std::int64_t{1} << 24, h, 0.0)
        ->MinTime(1.0)
        ->Unit(benchmark::kMillisecond);
    bench::add("busy/N1_softmax_4096x4096" + suffix, softmax_rows, std::int64_t{4096}, std::int64_t{4096}, h, 0.0)
        ->MinTime(1.0)
        ->Unit(benchmark::kMillisecond);
  }
  for (double gap : {0.0, 100.0}) {
    const std::string g = "/gap_us:" + std::to_string(static_cast<int>(gap));
    for (std::int64_t e : {32768, 65536, 131072, 262144, 524288, 1048576, 4194304})
      bench::add("threshold/pointwise/n:" + std::to_string(e) + g, pointwise, e, 0, gap)->Unit(benchmark::kMicrosecond);
    for (std::int64_t r : {32, 64, 128, 256, 512, 1024})
      bench::add("threshold/softmax/rows:" + std::to_string(r) + "x1024" + g, softmax_rows, r, std::int64_t{1024}, 0,
                 gap)
          ->Unit(benchmark::kMicrosecond);
    for (std::int64_t e : {32768, 65536, 131072})
      bench::add("threshold/sin16/n:" + std::to_string(e) + g, sin_chain, e, 0, gap)->Unit(benchmark::kMicrosecond);
  }
  bench::run_benchmarks();
  if (!fresh.empty()) std::filesystem::remove_all(fresh);
  return 0;
}
