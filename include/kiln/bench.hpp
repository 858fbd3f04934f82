#pragma once
/// kiln's microbenchmark kit, for benchmark suites built on kiln and Google Benchmark.
///
///   #include <kiln/bench.hpp>
///   static void softmax_rows(benchmark::State& state) {
///     const kiln::Device device = kiln::bench::default_device();      // KILN_DEVICE
///     kiln::Tensor x = kiln::randn({4096, 4096}, 1, kiln::f32, device).eval();
///     kiln::bench::run(state, device, {.bytes = 2.0 * 4096 * 4096 * 4},
///                      [&] { return kiln::softmax(x, -1); });
///   }
///   KILN_BENCH(softmax_rows);
///   KILN_BENCH_MAIN();
///
/// `run` calls the body once untimed (the JIT compile or the disk-cache load happens there) and
/// reports that first call as the counter `compile_ms`, then times the body in the benchmark's
/// loop: with CUDA events on a GPU, with the host clock on the CPU. From the bytes and flops
/// declared per call it reports `GB/s`, `GFLOP/s` and `x_copy`, the fraction of the copy
/// bandwidth of the same device measured once per process. `KILN_BENCH_MAIN()` runs the
/// registered benchmarks; `KILN_BENCH_JSON=path` adds `--benchmark_out=path
/// --benchmark_out_format=json`. Not included by kiln.hpp: it needs Google Benchmark
/// (`benchmark::benchmark` in CMake, `-lbenchmark` otherwise). docs/performance.md, "The
/// benchmark kit", has the counters and the rules.
#include <benchmark/benchmark.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <typeindex>
#include <utility>
#include <vector>

#include "kiln/core/env.hpp"
#include "kiln/core/version.hpp"
#include "kiln/kiln.hpp"
#include "kiln/runtime/cuda_driver.hpp"
#include "kiln/runtime/cuda_memory.hpp"
#include "kiln/runtime/nvrtc.hpp"

namespace kiln::bench {

/// What one call of a benchmarked body does, for the throughput counters.
struct Work {
  /// Least traffic of one call: each input read once, each output written once (0: no GB/s and
  /// no x_copy).
  double bytes = 0;
  /// Floating-point operations of one call (0: no GFLOP/s).
  double flops = 0;
};

/// How `run` calls the body.
struct Options {
  /// Untimed calls after the first one (which is timed apart, as compile_ms).
  int warmup = 1;
  /// Calls per benchmark iteration, timed together; the iteration's time is their mean. 0: 10
  /// on a GPU (so the launch gap after each synchronisation weighs a tenth), 1 on the CPU.
  /// More than 1 needs manual time (a benchmark registered with `add` or `KILN_BENCH`).
  int batch = 0;
  /// On a GPU with manual time: one untimed call before each batch's start event. The stream is
  /// then busy while the host dispatches the batch's first call, so the host's dispatch time is
  /// not counted as GPU time (Triton's do_bench hides it behind its cache flush the same way).
  /// Off: the host's dispatch of each batch's first call is part of the batch's time.
  bool lead = true;
};

/// What `run` measured (also reported as counters).
struct Measurement {
  double first_call_ms = 0;      ///< the untimed first call (compile or disk-cache load, plus one run)
  double ms = 0;                 ///< mean milliseconds of one call in the timed loop
  double median_ms = 0;          ///< median over the loop's iterations (manual time; else = ms)
  double gbps = 0;               ///< bytes / mean time, 1e9 bytes per second
  double gflops = 0;             ///< flops / mean time, 1e9 per second
  double x_copy = 0;             ///< bytes per second / the device's copy bandwidth
  double copy_gbps = 0;          ///< that copy bandwidth, 1e9 bytes (read + written) per second
  double launches_per_call = 0;  ///< kernels (or, eagerly, primitives) launched per call
  std::int64_t calls = 0;        ///< timed calls
};

namespace detail {

using Clock = std::chrono::steady_clock;

inline double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

inline double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

/// True while a benchmark registered by `add` runs on this thread: its time is the kit's
/// (SetIterationTime), not the host clock around Google Benchmark's loop. Google Benchmark 1.7
/// does not tell a running benchmark how it was registered, so `add` says it.
inline bool& manual_time_flag() {
  thread_local bool manual = false;
  return manual;
}

/// The first call of each benchmark instance, kept while Google Benchmark calls the instance's
/// function again (it does, once per trial iteration count and per repetition): later calls
/// find the kernels in memory, and their first call would report a cache hit as compile_ms.
/// Google Benchmark 1.7 does not name the running instance to it either, so the kit's display
/// reporter marks where one instance ends (it empties `seen` when the instance is reported);
/// without it (RunSpecifiedBenchmarks called directly) every call reports its own first call.
struct FirstCall {
  double ms = 0, compiles = 0, disk_hits = 0;
};
struct FirstCalls {
  std::mutex mutex;
  std::atomic<bool> tracked{false};
  std::map<std::pair<std::type_index, int>, FirstCall> seen;  // (body type, thread) of this instance
};
inline FirstCalls& first_calls() {
  static FirstCalls f;
  return f;
}

/// The display reporter `run_benchmarks` installs: Google Benchmark's own, plus the instance
/// boundaries of the first-call record.
class BoundaryReporter : public benchmark::BenchmarkReporter {
 public:
  explicit BoundaryReporter(benchmark::BenchmarkReporter* inner) : inner_(inner) {}
  bool ReportContext(const Context& context) override { return inner_->ReportContext(context); }
  void ReportRuns(const std::vector<Run>& runs) override {
    {
      std::lock_guard<std::mutex> lock(first_calls().mutex);
      first_calls().seen.clear();
    }
    inner_->ReportRuns(runs);
  }
  void Finalize() override { inner_->Finalize(); }

 private:
  benchmark::BenchmarkReporter* inner_;
};

inline void synchronize(Device device) {
  if (device.is_cuda()) runtime::synchronize_cuda(device.index);
}

inline void collect(std::vector<Tensor>& out, const Tensor& t) {
  if (t.defined()) out.push_back(t);
}
template <class E>
requires TensorLike<E>
void collect(std::vector<Tensor>& out, const E& e) { out.push_back(Tensor(e)); }

template <class T>
struct is_tuple_like : std::false_type {};
template <class A, class B>
struct is_tuple_like<std::pair<A, B>> : std::true_type {};
template <class... Ts>
struct is_tuple_like<std::tuple<Ts...>> : std::true_type {};

/// Evaluates what a body returned: a Tensor, an expression, a vector, pair or tuple of them (in
/// one schedule, as `eval(a, b)` does); anything else is kept from being optimised away.
template <class R>
void evaluate_result(R&& r) {
  using T = std::remove_cvref_t<R>;
  if constexpr (std::is_same_v<T, Tensor>) {
    if (r.defined()) r.eval();
  } else if constexpr (TensorLike<T>) {
    Tensor(r).eval();
  } else if constexpr (std::is_same_v<T, std::vector<Tensor>>) {
    std::vector<Tensor> defined;
    for (const Tensor& t : r) collect(defined, t);
    if (!defined.empty()) kiln::eval(defined);
  } else if constexpr (is_tuple_like<T>::value) {
    std::vector<Tensor> all;
    std::apply([&](const auto&... t) { (collect(all, t), ...); }, r);
    if (!all.empty()) kiln::eval(all);
  } else {
    benchmark::DoNotOptimize(r);
  }
}

template <class Body>
void call(Body& body) {
  if constexpr (std::is_void_v<std::invoke_result_t<Body&>>)
    body();
  else
    evaluate_result(body());
}

/// Sets a thread's manual-time flag for one scope (restored also when the benchmark throws).
class ManualTimeScope {
 public:
  ManualTimeScope() : saved_(manual_time_flag()) { manual_time_flag() = true; }
  ~ManualTimeScope() { manual_time_flag() = saved_; }
  ManualTimeScope(const ManualTimeScope&) = delete;
  ManualTimeScope& operator=(const ManualTimeScope&) = delete;

 private:
  bool saved_;
};

}  // namespace detail

/// The device a benchmark runs on: KILN_DEVICE (`cpu`, `cuda` or `cuda:N`), else the CPU.
inline Device default_device() {
  const std::string v = env::get("KILN_DEVICE", "cpu");
  if (v.rfind("cuda", 0) == 0) return Device::cuda(v.size() > 5 && v[4] == ':' ? std::atoi(v.c_str() + 5) : 0);
  return Device::cpu();
}

/// Threads of the CPU copy baseline: KILN_NUM_THREADS, else the CPUs this process may run on
/// (so `taskset -c 0,1` gives a 2-core baseline beside 2-core kernels).
inline int cpu_threads() {
  if (const int n = std::atoi(env::get("KILN_NUM_THREADS", "0").c_str()); n > 0) return n;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

/// Copies `bytes` from `src` to `dst` with `threads` threads, each memcpy'ing one contiguous
/// part: the CPU copy baseline's loop.
inline void parallel_memcpy(void* dst, const void* src, std::size_t bytes, int threads) {
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  if (threads <= 1) {
    std::memcpy(d, s, bytes);
    return;
  }
  std::vector<std::thread> pool;
  const std::size_t part = (bytes / static_cast<std::size_t>(threads) + 63) / 64 * 64;
  for (int t = 0; t < threads; ++t) {
    const std::size_t begin = std::min(bytes, part * static_cast<std::size_t>(t));
    const std::size_t end = std::min(bytes, begin + part);
    pool.emplace_back([=] { std::memcpy(d + begin, s + begin, end - begin); });
  }
  for (auto& th : pool) th.join();
}

/// Why benchmarks cannot run on `device` (no usable GPU, no NVRTC, no such device); empty when
/// they can.
inline std::string unavailable_reason(Device device) {
  if (device.is_cpu()) return {};
  if (!cuda_available()) return "no usable GPU: " + cuda_unavailable_reason();
  if (device.index < 0 || device.index >= runtime::cuda_device_count())
    return device.str() + " does not exist (" + std::to_string(runtime::cuda_device_count()) + " CUDA devices)";
  if (!runtime::nvrtc_available()) return "NVRTC unavailable: " + runtime::nvrtc_unavailable_reason();
  return {};
}

/// Skips the benchmark with the reason when it cannot run on `device` (a GPU benchmark on a
/// machine without a GPU: the run goes on, its JSON has `"error_occurred": true` and the
/// message); returns true then. The caller returns at once.
inline bool skip_if_unavailable(benchmark::State& state, Device device) {
  const std::string why = unavailable_reason(device);
  if (why.empty()) return false;
  state.SkipWithError(("kiln::bench: skipped on " + device.str() + ": " + why).c_str());
  for (auto _ : state) {}
  return true;
}

/// Median milliseconds of one call of `fn` on a GPU: CUDA events around `batches` batches of
/// `reps` calls, after one untimed call; each batch is led by an untimed call when `lead`
/// (Options::lead). Throws DeviceError without a GPU.
template <class F>
double gpu_time_ms(Device device, F&& fn, int batches = 15, int reps = 10, bool lead = true) {
  const runtime::CudaContext& ctx = runtime::cuda_context(device.index);
  fn();
  runtime::synchronize_cuda(device.index);
  std::vector<double> ms;
  runtime::CudaEvent start(ctx), stop(ctx);
  for (int b = 0; b < batches; ++b) {
    if (lead) fn();
    start.record();
    for (int r = 0; r < reps; ++r) fn();
    stop.record();
    stop.synchronize();
    ms.push_back(static_cast<double>(stop.elapsed_ms_since(start)) / reps);
  }
  return detail::median_of(std::move(ms));
}

/// Copy bandwidth of `device` in bytes per second, bytes read plus bytes written: on the CPU a
/// memcpy of 64 MiB with cpu_threads() threads (best of 10), on a GPU a device-to-device copy of
/// 1 GiB (CUDA events, median of 15 batches of 5). Measured on first use, once per process and
/// device. Throws DeviceError for a GPU that cannot be used.
inline double copy_bandwidth(Device device) {
  static std::mutex mutex;
  static std::map<std::pair<int, int>, double> measured;
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(static_cast<int>(device.kind), device.index);
  if (auto it = measured.find(key); it != measured.end()) return it->second;
  double bytes_per_second = 0;
  if (device.is_cpu()) {
    const std::size_t bytes = std::size_t{1} << 26;
    std::unique_ptr<char[]> src(new char[bytes]), dst(new char[bytes]);
    std::memset(src.get(), 1, bytes);
    const int threads = cpu_threads();
    parallel_memcpy(dst.get(), src.get(), bytes, threads);  // touches dst's pages
    for (int rep = 0; rep < 10; ++rep) {
      const auto t0 = detail::Clock::now();
      parallel_memcpy(dst.get(), src.get(), bytes, threads);
      const double s = detail::seconds_between(t0, detail::Clock::now());
      bytes_per_second = std::max(bytes_per_second, 2.0 * static_cast<double>(bytes) / s);
    }
  } else {
    if (const std::string why = unavailable_reason(device); !why.empty())
      throw DeviceError("kiln::bench: no copy bandwidth for " + device.str() + ": " + why);
    const std::size_t bytes = std::size_t{1} << 30;
    StoragePtr a = runtime::allocate_cuda(bytes, device.index), b = runtime::allocate_cuda(bytes, device.index);
    runtime::fill_device_bytes(a->data, 1, bytes, device.index);
    const double ms = gpu_time_ms(
        device, [&] { runtime::copy_device_to_device(b->data, a->data, bytes, device.index); }, 15, 5);
    bytes_per_second = 2.0 * static_cast<double>(bytes) / (ms * 1e-3);
  }
  measured[key] = bytes_per_second;
  return bytes_per_second;
}

/// Sets the throughput counters of a benchmark whose call took `seconds_per_call` (its mean):
/// `GB/s` and `x_copy` when `work.bytes` > 0 (with `copy_GB/s`, and Google Benchmark's
/// `bytes_per_second`), `GFLOP/s` when `work.flops` > 0. For benchmarks that time their own
/// loop; `run` calls it.
inline void report(benchmark::State& state, Device device, const Work& work, double seconds_per_call,
                   Measurement* into = nullptr) {
  if (seconds_per_call <= 0) return;
  Measurement local;
  Measurement& m = into ? *into : local;
  if (work.bytes > 0) {
    const double copy = copy_bandwidth(device);
    m.gbps = work.bytes / seconds_per_call / 1e9;
    m.copy_gbps = copy / 1e9;
    m.x_copy = work.bytes / seconds_per_call / copy;
    state.SetBytesProcessed(static_cast<std::int64_t>(work.bytes) * state.iterations());
    state.counters["GB/s"] = m.gbps;
    state.counters["x_copy"] = m.x_copy;
    state.counters["copy_GB/s"] = m.copy_gbps;
  }
  if (work.flops > 0) {
    m.gflops = work.flops / seconds_per_call / 1e9;
    state.counters["GFLOP/s"] = m.gflops;
  }
}

/// Calls `body` once, untimed (before the loop), with the device synchronised after it, and
/// reports its milliseconds as `compile_ms`, with the kernels it compiled (`first_compiles`)
/// and loaded from the disk cache (`first_disk_hits`). A Tensor or expression the body returns
/// is evaluated. Under `run_benchmarks` the figures are those of the instance's first call in
/// the process, also when Google Benchmark calls the function again.
template <class Body>
double first_call(benchmark::State& state, Device device, Body&& body) {
  const Stats before = stats();
  const auto t0 = detail::Clock::now();
  detail::call(body);
  detail::synchronize(device);
  detail::FirstCall now{detail::seconds_between(t0, detail::Clock::now()) * 1e3, 0, 0};
  const Stats after = stats();
  now.compiles = static_cast<double>(after.compiles - before.compiles);
  now.disk_hits = static_cast<double>(after.disk_hits - before.disk_hits);
  detail::FirstCall first = now;
  auto& memo = detail::first_calls();
  if (memo.tracked.load()) {
    std::lock_guard<std::mutex> lock(memo.mutex);
    first = memo.seen.try_emplace({std::type_index(typeid(Body)), state.thread_index()}, now).first->second;
  }
  state.counters["compile_ms"] = first.ms;
  state.counters["first_compiles"] = first.compiles;
  state.counters["first_disk_hits"] = first.disk_hits;
  return first.ms;
}

/// Benchmarks `body` (a callable returning a Tensor, an expression, a vector/pair/tuple of them,
/// or nothing when it evaluates by itself) on `device` in `state`'s loop:
///   1. skips with the reason when `device` cannot run (no GPU);
///   2. the first call, untimed, reported as compile_ms (first_call), then `options.warmup` more;
///   3. the timed loop. Manual time (registered with `add` / `KILN_BENCH`): each iteration is
///      `batch` calls between two CUDA events on a GPU, or two host-clock reads on the CPU, and
///      its mean goes to SetIterationTime. Otherwise (Google Benchmark's UseRealTime or default
///      registration) Google Benchmark's clock times the loop, and on a GPU each call is
///      followed by a synchronisation so that the host clock sees the kernels end;
///   4. counters: GB/s, GFLOP/s, x_copy, copy_GB/s (report), launches_per_call, and
///      loop_compiles when the timed loop compiled anything (its time then includes it).
/// A kiln error inside the body skips the benchmark with its message.
template <class Body>
Measurement run(benchmark::State& state, Device device, const Work& work, Body&& body, const Options& options = {}) {
  Measurement m;
  if (skip_if_unavailable(state, device)) return m;
  const bool manual = detail::manual_time_flag();
  const int batch = options.batch > 0 ? options.batch : (manual && device.is_cuda() ? 10 : 1);
  if (!manual && batch != 1) {
    state.SkipWithError(
        "kiln::bench: Options::batch > 1 needs manual time (register with kiln::bench::add or KILN_BENCH)");
    for (auto _ : state) {}
    return m;
  }
  try {
    if (work.bytes > 0) copy_bandwidth(device);  // measured once, before anything of this benchmark
    m.first_call_ms = first_call(state, device, body);
    for (int i = 0; i < options.warmup; ++i) detail::call(body);
    detail::synchronize(device);

    const Stats before = stats();
    double seconds = 0;  // sum over iterations of the mean time of one call
    std::vector<double> samples;
    constexpr std::size_t kMaxSamples = std::size_t{1} << 20;
    auto keep = [&](double s) {
      seconds += s;
      if (samples.size() < kMaxSamples) samples.push_back(s);
    };
    std::int64_t lead_calls = 0;  // untimed calls inside the loop (Options::lead)
    if (manual && device.is_cuda()) {
      const runtime::CudaContext& ctx = runtime::cuda_context(device.index);
      runtime::CudaEvent start(ctx), stop(ctx);
      for (auto _ : state) {
        if (options.lead) {  // manual time: the host clock of the loop is not the figure
          detail::call(body);
          ++lead_calls;
        }
        start.record();
        for (int i = 0; i < batch; ++i) detail::call(body);
        stop.record();
        stop.synchronize();
        const double s = static_cast<double>(stop.elapsed_ms_since(start)) * 1e-3 / batch;
        state.SetIterationTime(s);
        keep(s);
      }
    } else if (manual) {
      for (auto _ : state) {
        const auto t0 = detail::Clock::now();
        for (int i = 0; i < batch; ++i) detail::call(body);
        const double s = detail::seconds_between(t0, detail::Clock::now()) / batch;
        state.SetIterationTime(s);
        keep(s);
      }
    } else {
      const auto t0 = detail::Clock::now();
      for (auto _ : state) {
        detail::call(body);
        detail::synchronize(device);
      }
      seconds = detail::seconds_between(t0, detail::Clock::now());
    }
    const Stats after = stats();

    const auto iterations = static_cast<double>(std::max<benchmark::IterationCount>(1, state.iterations()));
    m.calls = static_cast<std::int64_t>(state.iterations()) * batch;
    const double per_call = seconds / iterations;
    m.ms = per_call * 1e3;
    m.median_ms = samples.empty() ? m.ms : detail::median_of(std::move(samples)) * 1e3;
    m.launches_per_call =
        static_cast<double>(after.launches - before.launches) /
        static_cast<double>(std::max<std::int64_t>(1, m.calls + lead_calls));
    state.counters["launches_per_call"] = m.launches_per_call;
    if (after.compiles != before.compiles)
      state.counters["loop_compiles"] = static_cast<double>(after.compiles - before.compiles);
    report(state, device, work, per_call, &m);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
  return m;
}

/// Registers `fn(state, args...)` with Google Benchmark under `name`, timed by the kit (manual
/// time: CUDA events on a GPU, the host clock on the CPU; Google Benchmark appends
/// "/manual_time" to the name). An exception escaping `fn` (a kiln error while making inputs,
/// say) skips that benchmark with its message instead of ending the program. Returns the
/// benchmark for more settings (->Arg, ->Unit, ...).
template <class F, class... Args>
benchmark::internal::Benchmark* add(const std::string& name, F fn, Args... args) {
  return benchmark::RegisterBenchmark(name.c_str(),
                                      [fn, args...](benchmark::State& state) {
                                        detail::ManualTimeScope manual;
                                        try {
                                          fn(state, args...);
                                        } catch (const std::exception& e) {
                                          if (!state.error_occurred()) state.SkipWithError(e.what());
                                        }
                                      })
      ->UseManualTime();
}

/// Google Benchmark's command line with `--benchmark_out=P --benchmark_out_format=json` put
/// right after the program name when KILN_BENCH_JSON=P is set, so that the same flags given on
/// the command line win (Google Benchmark keeps the last).
inline std::vector<std::string> arguments(int argc, char** argv) {
  std::vector<std::string> args;
  args.emplace_back(argc > 0 && argv[0] ? argv[0] : "benchmark");
  if (const std::string json = env::get("KILN_BENCH_JSON"); !json.empty()) {
    args.push_back("--benchmark_out=" + json);
    args.emplace_back("--benchmark_out_format=json");
  }
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return args;
}

/// Initialises Google Benchmark with `arguments(argc, argv)` and adds kiln's context to its
/// report (kiln_version, kiln_num_threads, kiln_cache_dir, kiln_device). Returns false, after
/// printing them, when arguments are left that nobody recognised.
inline bool initialize(int argc, char** argv) {
  // Google Benchmark keeps pointers into these (the program name), so they live to the end.
  static std::vector<std::string> storage;
  static std::vector<char*> pointers;
  storage = arguments(argc, argv);
  pointers.clear();
  for (auto& s : storage) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  int n = static_cast<int>(storage.size());
  benchmark::Initialize(&n, pointers.data());
  if (benchmark::ReportUnrecognizedArguments(n, pointers.data())) return false;
  benchmark::AddCustomContext("kiln_version", version_string);
  benchmark::AddCustomContext("kiln_num_threads", env::get("KILN_NUM_THREADS", "default"));
  benchmark::AddCustomContext("kiln_cache_dir", env::get("KILN_CACHE_DIR", "default"));
  benchmark::AddCustomContext("kiln_device", default_device().str());
  return true;
}

/// Runs the registered benchmarks that the flags select, with Google Benchmark's own display
/// (and, with --benchmark_out, file) reporters, then shuts Google Benchmark down. Returns 0.
inline int run_benchmarks() {
  // Google Benchmark owns the default display reporter (a static of its own): not deleted here.
  detail::BoundaryReporter display(benchmark::CreateDefaultDisplayReporter());
  detail::first_calls().tracked = true;
  benchmark::RunSpecifiedBenchmarks(&display);
  detail::first_calls().tracked = false;
  benchmark::Shutdown();
  return 0;
}

/// A benchmark program's main: initialize, then run_benchmarks. Returns main's exit status.
inline int run_main(int argc, char** argv) {
  if (!initialize(argc, argv)) return 1;
  return run_benchmarks();
}

}  // namespace kiln::bench

#define KILN_BENCH_CONCAT_INNER(a, b) a##b
#define KILN_BENCH_CONCAT(a, b) KILN_BENCH_CONCAT_INNER(a, b)

/// Registers `fn` (a `void(benchmark::State&)`) under its own name with the kit's timing (see
/// kiln::bench::add). More settings follow as with BENCHMARK: `KILN_BENCH(f)->Arg(1024);`.
#define KILN_BENCH(fn)                                                                                    \
  [[maybe_unused]] static ::benchmark::internal::Benchmark* KILN_BENCH_CONCAT(kiln_bench_, __COUNTER__) = \
      ::kiln::bench::add(#fn, fn)

/// Defines main(): flags (and KILN_BENCH_JSON), then every registered benchmark. Write it as a
/// statement: `KILN_BENCH_MAIN();`.
#define KILN_BENCH_MAIN()                                                         \
  int main(int argc, char** argv) { return ::kiln::bench::run_main(argc, argv); } \
  int main(int, char**)
