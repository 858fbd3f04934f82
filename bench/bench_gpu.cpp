// The GPU workloads of the benchmark table (docs/performance.md) at their GPU shapes, run by the
// CUDA executor on kiln's benchmark kit (kiln/bench.hpp): registered with kiln::bench::add
// (manual time), timed with CUDA events in batches of 10 calls, each workload reports GB/s
// (the table's bytes column), `x_copy` (the ratio to the device-to-device copy bandwidth
// measured in the same process; `ratio_to_copy` before the kit), `compile_ms` (the untimed first
// call) and `ms` (the median batch). Also: the first NVRTC compile of one fused kernel, a
// disk-cache hit in a new process, and the host time of a cached launch (executor and typed
// expression). Builds without the CUDA headers; on a machine without a usable GPU every
// benchmark is skipped with the reason (an error line per benchmark, exit status 0).
//
//   bench_gpu --benchmark_out=gpu.json --benchmark_out_format=json   # or KILN_BENCH_JSON=gpu.json
//
// Extra flags (before Google Benchmark's): --variants also times tuning variants of the code
// generator (pointwise unroll, threads per row, blocks per multiprocessor when splitting);
// --no-lead times each batch from an idle stream, the host's dispatch of its first call included
// (bench::Options::lead).
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kiln/backend/cuda.hpp"
#include "kiln/bench.hpp"
#include "kiln/decomp/decompose.hpp"
#include "kiln/autodiff/backward.hpp"
#include "kiln/kiln.hpp"
#include "kiln/runtime/cuda_memory.hpp"

#include "t1.hpp"

namespace {

using namespace kiln;
using ir::NodePtr;
using ir::Op;

const Device kDev = Device::cuda(0);

std::string unavailable() { return bench::unavailable_reason(kDev); }

bool skip_without_gpu(benchmark::State& state) { return bench::skip_if_unavailable(state, kDev); }

// ---- device data --------------------------------------------------------------------------

/// Runs `root` (a graph on the GPU) into a new buffer: how the benchmark makes its inputs.
NodePtr realize(const NodePtr& root) {
  ir::Captured c = ir::capture({root}, kDev);
  StoragePtr st = runtime::allocate_cuda(static_cast<std::size_t>(root->numel()) * itemsize(root->dtype), 0);
  backend::RunArgs args;
  for (auto& leaf : c.leaves)
    args.inputs.push_back(static_cast<char*>(leaf->buffer->storage->data) +
                          leaf->buffer->offset * static_cast<std::int64_t>(itemsize(leaf->dtype)));
  args.outputs.push_back(st->data);
  if (sched::has_library_calls(c.graph)) {  // a sort (E1u's ids): the steps a compiled graph runs
    backend::PreparedGraph steps(c.graph, backend::Mode::Jit);
    steps.run(args);
    runtime::synchronize_cuda(0);  // before the steps' temporaries go
  } else {
    backend::run_cuda(c.graph, args);
  }
  return ir::input(ir::BufferView{st, 0, contiguous_strides(root->shape)}, root->shape, root->dtype, kDev);
}

/// A device leaf of normal values times `scale` (Philox, generated on the GPU).
NodePtr normal(const Shape& shape, DType dt, std::uint64_t seed, double scale = 1.0) {
  NodePtr r = ir::random(shape, seed, 1, f32, kDev);
  if (scale != 1.0) r = ir::binary(Op::Mul, r, ir::constant(scale, f32, shape, kDev));
  if (dt != f32) r = ir::cast(r, dt);
  return realize(r);
}

NodePtr cst(double v, const NodePtr& like) { return ir::constant(v, like->dtype, like->shape, kDev); }
NodePtr add(const NodePtr& a, const NodePtr& b) { return ir::binary(Op::Add, a, b); }
NodePtr sub(const NodePtr& a, const NodePtr& b) { return ir::binary(Op::Sub, a, b); }
NodePtr mul(const NodePtr& a, const NodePtr& b) { return ir::binary(Op::Mul, a, b); }
NodePtr div(const NodePtr& a, const NodePtr& b) { return ir::binary(Op::Div, a, b); }
NodePtr red(Op op, const NodePtr& a, std::vector<std::int64_t> axes) { return ir::reduce(op, a, std::move(axes)); }

// ---- workloads ----------------------------------------------------------------------------

struct Workload {
  const char* id;
  double bytes;  ///< least traffic (the workload table's bytes)
  std::function<std::vector<NodePtr>()> build;
};

constexpr std::int64_t kN = std::int64_t(1) << 26, kM = 16384, kK = 4096;

std::vector<Workload> workloads() {
  std::vector<Workload> w;
  w.push_back({"P1", 3.0 * kN * 4, [] {
                 NodePtr x = normal({kN}, f32, 1), y = normal({kN}, f32, 2);
                 return std::vector<NodePtr>{add(mul(cst(2.0, x), x), y)};
               }});
  w.push_back({"P2", 2.0 * kN * 4, [] {
                 NodePtr x = normal({kN}, f32, 3);
                 NodePtr cube = mul(mul(x, x), x);
                 NodePtr inner = mul(cst(0.7978845608028654, x), add(x, mul(cst(0.044715, x), cube)));
                 return std::vector<NodePtr>{mul(mul(cst(0.5, x), x), add(cst(1.0, x), ir::unary(Op::Tanh, inner)))};
               }});
  w.push_back({"P3", 2.0 * kN * 4, [] {
                 NodePtr x = normal({kN}, f32, 4);
                 for (int i = 0; i < 16; ++i) x = add(mul(ir::unary(Op::Sin, x), cst(1.01, x)), cst(0.5, x));
                 return std::vector<NodePtr>{x};
               }});
  w.push_back({"P4", 2.0 * kM * kK * 4, [] {
                 NodePtr X = normal({kM, kK}, f32, 5), mu = normal({kM, 1}, f32, 6), s = normal({kK}, f32, 7),
                         b = normal({kK}, f32, 8);
                 return std::vector<NodePtr>{add(mul(sub(X, ir::broadcast(mu, X->shape)), decomp::expand(s, X->shape)),
                                                 decomp::expand(b, X->shape))};
               }});
  w.push_back({"R1", 1.0 * kN * 4, [] {
                 NodePtr x = normal({kN}, f32, 9);
                 return std::vector<NodePtr>{ir::reshape(red(Op::ReduceSum, mul(x, x), {0}), Shape{})};
               }});
  w.push_back(
      {"R2", 1.0 * kM * kK * 4, [] {
         return std::vector<NodePtr>{ir::reshape(red(Op::ReduceSum, normal({kM, kK}, f32, 10), {1}), Shape{kM})};
       }});
  w.push_back(
      {"R3", 1.0 * kM * kK * 4, [] {
         return std::vector<NodePtr>{ir::reshape(red(Op::ReduceSum, normal({kM, kK}, f32, 11), {0}), Shape{kK})};
       }});
  w.push_back({"N1", 2.0 * kM * kK * 4, [] {
                 return std::vector<NodePtr>{decomp::softmax(normal({kM, kK}, f32, 12, 3.0), 1)};
               }});
  w.push_back({"N2", 2.0 * 65536 * 1024 * 4, [] {
                 return std::vector<NodePtr>{decomp::softmax(normal({65536, 1024}, f32, 13, 3.0), 1)};
               }});
  w.push_back({"N3", 2.0 * kM * kK * 4, [] {
                 NodePtr X = normal({kM, kK}, f32, 14), wt = normal({kK}, f32, 15), b = normal({kK}, f32, 16);
                 return std::vector<NodePtr>{decomp::layer_norm(X, wt, b, 1e-5)};
               }});
  w.push_back({"N4", 2.0 * kM * kK * 4, [] {
                 NodePtr X = normal({kM, kK}, f32, 17), wt = normal({kK}, f32, 18);
                 NodePtr ms =
                     div(red(Op::ReduceSum, mul(X, X), {1}), ir::constant(static_cast<double>(kK), f32, {kM, 1}, kDev));
                 NodePtr rs = ir::unary(Op::Rsqrt, add(ms, cst(1e-6, ms)));
                 return std::vector<NodePtr>{mul(mul(X, ir::broadcast(rs, X->shape)), decomp::expand(wt, X->shape))};
               }});
  w.push_back({"N5", 2.0 * kM * kK * 2, [] {
                 return std::vector<NodePtr>{decomp::softmax(normal({kM, kK}, bf16, 19, 3.0), 1)};
               }});
  w.push_back({"N6", 1.0 * 8192 * 32768 * 4, [] {
                 NodePtr logits = normal({8192, 32768}, f32, 20, 2.0);
                 NodePtr u = ir::random({8192}, 21, 0, f32, kDev);
                 NodePtr t = realize(ir::cast(mul(u, ir::constant(32768.0, f32, {8192}, kDev)), i64));
                 return std::vector<NodePtr>{decomp::cross_entropy(logits, t, -100)};
               }});
  // E1: embedding lookup, 32768 rows of a [50304, 1024] f32 table (bytes gathered and written).
  w.push_back({"E1", 2.0 * 32768 * 1024 * 4, [] {
                 const std::int64_t n = 32768, d = 1024, vocab = 50304;
                 NodePtr table = normal({vocab, d}, f32, 22);
                 NodePtr u = ir::random({n}, 23, 0, f32, kDev);
                 NodePtr ids = realize(ir::cast(mul(u, ir::constant(vocab - 1.0, f32, {n}, kDev)), i64));
                 NodePtr rows = ir::broadcast(ir::reshape(ids, Shape{n, 1}), Shape{n, d});
                 return std::vector<NodePtr>{ir::gather(table, rows, 0, ir::GatherSite::Embedding)};
               }});
  // E1u: E1 with 32768 distinct ids in random order (no row read twice: L2 cannot serve repeats).
  w.push_back({"E1u", 2.0 * 32768 * 1024 * 4, [] {
                 const std::int64_t n = 32768, d = 1024, vocab = 50304;
                 NodePtr table = normal({vocab, d}, f32, 22);
                 NodePtr ids = realize(ir::sort(ir::random({vocab}, 28, 0, f32, kDev), 0, n, true));
                 NodePtr rows = ir::broadcast(ir::reshape(ids, Shape{n, 1}), Shape{n, d});
                 return std::vector<NodePtr>{ir::gather(table, rows, 0, ir::GatherSite::Embedding)};
               }});
  // C1: cumsum over [16384, 4096] rows (the rows read and written).
  w.push_back({"C1", 2.0 * kM * kK * 4, [] {
                 return std::vector<NodePtr>{ir::scan(normal({kM, kK}, f32, 26), 1, ir::ScanKind::Sum, f32)};
               }});
  // K1: topk(x, 64, -1) values over [16384, 4096] rows (the rows read once).
  w.push_back({"K1", 1.0 * kM * kK * 4, [] {
                 NodePtr x = normal({kM, kK}, f32, 27);
                 return std::vector<NodePtr>{ir::gather(x, ir::sort(x, 1, 64, true), 1, ir::GatherSite::Gather)};
               }});
  // E2: index_add of 32768 rows of 1024 floats back into a zero [50304, 1024] table (bytes as
  // torch_suite's: src read, the rows read and written), deterministic and atomic.
  for (bool atomic : {false, true})
    w.push_back({atomic ? "E2_atomic" : "E2", 3.0 * 32768 * 1024 * 4, [atomic] {
                   const std::int64_t n = 32768, d = 1024, vocab = 50304;
                   NodePtr src = normal({n, d}, f32, 24);
                   NodePtr u = ir::random({n}, 25, 0, f32, kDev);
                   NodePtr ids = realize(ir::cast(mul(u, ir::constant(vocab - 1.0, f32, {n}, kDev)), i64));
                   NodePtr rows = ir::broadcast(ir::reshape(ids, Shape{n, 1}), Shape{n, d});
                   NodePtr zero = ir::constant(0.0, f32, {vocab, d}, kDev);
                   return std::vector<NodePtr>{ir::scatter(zero, rows, src, 0, true, atomic, ir::GatherSite::IndexAdd)};
                 }});
  // B1: forward and backward of gelu_tanh(layer_norm(X, w, b)) with respect to X, w and b
  // (torch_suite's B1), the three gradients one graph (what autograd::grad evaluates); bytes:
  // X read once and dX written once, the least traffic.
  w.push_back({"B1", 2.0 * kM * kK * 4, [] {
                 NodePtr X = normal({kM, kK}, f32, 28), wt = normal({kK}, f32, 29), b = normal({kK}, f32, 30);
                 for (const NodePtr& leaf : {X, wt, b}) {
                   leaf->requires_grad = true;
                   leaf->grad_leaf = std::make_shared<ir::GradLeaf>();
                 }
                 NodePtr loss = ir::reduce(Op::ReduceSum, decomp::gelu(decomp::layer_norm(X, wt, b, 1e-5), true), {0, 1});
                 std::vector<autodiff::Reached> reached =
                     autodiff::backward_pass({loss}, {ir::constant(1.0, f32, loss->shape, kDev)}, {X, wt, b}, false, "B1");
                 std::vector<NodePtr> grads;
                 for (const NodePtr& leaf : {X, wt, b})
                   for (const autodiff::Reached& r : reached)
                     if (r.node == leaf) grads.push_back(r.grad);
                 return grads;
               }});
  return w;
}

// ---- timing -------------------------------------------------------------------------------

/// A workload's graph bound to device buffers, ready to run.
struct Bound {
  ir::Captured captured;
  backend::RunArgs args;
  std::vector<StoragePtr> outputs;
};

Bound bind_graph(const std::vector<NodePtr>& roots) {
  Bound b;
  b.captured = ir::capture(roots, kDev);
  for (auto& leaf : b.captured.leaves)
    b.args.inputs.push_back(static_cast<char*>(leaf->buffer->storage->data) +
                            leaf->buffer->offset * static_cast<std::int64_t>(itemsize(leaf->dtype)));
  for (auto& r : roots) {
    b.outputs.push_back(runtime::allocate_cuda(static_cast<std::size_t>(r->numel()) * itemsize(r->dtype), 0));
    b.args.outputs.push_back(b.outputs.back()->data);
  }
  return b;
}

bool g_lead = true;  // --no-lead clears it

/// Median milliseconds of one run, from CUDA events around batches of `reps` runs.
double time_ms(const std::function<void()>& run, int batches = 15, int reps = 10) {
  return bench::gpu_time_ms(kDev, run, batches, reps, g_lead);
}

/// Device-to-device copy bandwidth in GB/s (bytes read + written), measured once per process by the kit.
double copy_gbps() { return bench::copy_bandwidth(kDev) / 1e9; }

struct Result {
  double ms = 0, gbps = 0, ratio = 0;
  std::string strategy;
  double peak_mib = 0;  ///< device memory of one run beyond its inputs
};
std::map<std::string, Result>& results() {
  static std::map<std::string, Result> r;
  return r;
}

/// Times workload `w` (CUDA events) under `label`. `autotune`: its max-autotune plan, tuned by
/// the untimed first run (or loaded from the disk cache), as kiln::compile's max-autotune modes run it.
void run_workload(benchmark::State& state, const Workload& w, const std::string& label, bool autotune = false) {
  if (skip_without_gpu(state)) return;
  std::vector<NodePtr> roots = w.build();  // the inputs are allocated here
  // Device memory beyond the inputs: the outputs and every temporary of one run (the pool's
  // high-water mark; torch_suite reports max_memory_allocated beyond the inputs alike).
  runtime::reset_cuda_memory_peak(0);
  const std::uint64_t before = runtime::cuda_memory_use(0).current;
  Bound b = bind_graph(roots);
  // A graph with steps (a scatter) runs as kiln::compile runs it, bound once.
  std::unique_ptr<backend::PreparedGraph> steps;
  if (sched::has_library_calls(b.captured.graph))
    steps = std::make_unique<backend::PreparedGraph>(b.captured.graph, backend::Mode::Jit);
  auto run = [&] {
    if (steps)
      steps->run(b.args);
    else if (autotune)
      backend::run_cuda_autotuned(b.captured.graph, b.args);
    else
      backend::run_cuda(b.captured.graph, b.args);
  };
  run();
  const double peak_mib = static_cast<double>(runtime::cuda_memory_use(0).peak - before) / (1 << 20);
  // The kit: an untimed first call (compile_ms) and one warm-up, then batches of 10 calls
  // between CUDA events, one batch per benchmark iteration.
  const bench::Measurement m = bench::run(state, kDev, {.bytes = w.bytes}, run);
  if (state.error_occurred()) return;
  state.counters["peak_MiB"] = peak_mib;
  Result r;
  r.peak_mib = peak_mib;
  r.ms = m.median_ms;
  r.gbps = w.bytes / (r.ms * 1e-3) / 1e9;
  r.ratio = r.gbps / m.copy_gbps;
  std::string explain = steps ? backend::explain(b.captured.graph, backend::Mode::Jit) : backend::explain_cuda(b.captured.graph);
  if (steps) {
    for (std::size_t p = explain.find('\n'); p != std::string::npos; p = explain.find('\n')) explain[p] = ' ';
    explain = "cuda kernel " + explain.substr(0, 200);
  }
  auto pos = explain.find("cuda kernel");
  r.strategy = pos == std::string::npos ? "" : explain.substr(pos);
  while (!r.strategy.empty() && r.strategy.back() == '\n') r.strategy.pop_back();
  if (autotune) {
    auto plan = backend::detail::tuned_cuda_plan(b.captured.graph, backend::detail::alignment_of(b.args), b.args);
    r.strategy = "tuned:";
    for (auto& t : plan->tuning) r.strategy += " [" + backend::detail::tuning_text(t) + "]";
  }
  results()[label] = r;
  state.counters["ms"] = r.ms;  // the median batch (the summary's figure); GB/s is the kit's, from the mean
}

void BM_copy(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const std::size_t bytes = std::size_t(1) << 30;
  StoragePtr a = runtime::allocate_cuda(bytes, 0), b = runtime::allocate_cuda(bytes, 0);
  for (auto _ : state) {
    double ms = time_ms([&] { runtime::copy_device_to_device(b->data, a->data, bytes, 0); }, 3, 5);
    state.SetIterationTime(ms * 1e-3);
  }
  state.counters["GB/s"] = copy_gbps();
}

// ---- compile and launch costs -------------------------------------------------------------

/// A softmax graph on a small device tensor whose scale constant `c` makes its source new.
Bound softmax_graph(double c) {
  NodePtr x = normal({64, 1024}, f32, 30);
  return bind_graph({decomp::softmax(mul(x, cst(c, x)), 1)});
}

/// First build of a plan for a never-seen kernel: code generation, NVRTC (a cubin for the
/// device's architecture), module load. Each iteration compiles a new source.
void BM_first_compile(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  static int serial = 0;
  const double salt = static_cast<double>(::getpid() % 100000) * 1e-7;
  std::vector<double> ms;
  for (auto _ : state) {
    Bound b = softmax_graph(1.0 + salt + 1e-9 * ++serial);
    auto t0 = std::chrono::steady_clock::now();
    backend::run_cuda(b.captured.graph, b.args);
    double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    runtime::synchronize_cuda(0);
    ms.push_back(t);
    state.SetIterationTime(t * 1e-3);
  }
  std::sort(ms.begin(), ms.end());
  results()["first compile (softmax), ms"] = Result{ms[ms.size() / 2], 0, 0, ""};
  state.counters["median_ms"] = ms[ms.size() / 2];
}

/// NVRTC alone on the source of workload `w` (every kernel of its graph, at its GPU shape, with
/// the device's code-generation target): median of 5 compiles, each made new by an unused
/// device variable (NVRTC answers a source it compiled before, comments aside, from a cache).
void BM_nvrtc_compile(benchmark::State& state, const Workload& w, const std::string& label) {
  if (skip_without_gpu(state)) return;
  const auto& ctx = runtime::cuda_context(0);
  Bound b = bind_graph(w.build());
  const ir::Graph& g = b.captured.graph;
  sched::Schedule s = sched::schedule(g);
  codegen::CudaSource src = codegen::generate_cuda(g, s, "kiln_bench", backend::detail::cuda_target(ctx));
  static int serial = 0;
  std::vector<double> ms;
  for (auto _ : state) {
    const std::string source = src.source + "\n__device__ int kiln_bench_probe_" + std::to_string(::getpid()) + "_" +
                               std::to_string(++serial) + ";\n";
    auto t0 = std::chrono::steady_clock::now();
    runtime::compile_cuda_to_cubin(source, "kiln_bench.cu", ctx.arch());
    double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ms.push_back(t);
    state.SetIterationTime(t * 1e-3);
  }
  std::sort(ms.begin(), ms.end());
  Result r{ms[ms.size() / 2], 0, 0, ""};
  r.strategy = std::to_string(src.kernels.size()) + " kernel(s), " +
               std::to_string(std::count(src.source.begin(), src.source.end(), '\n')) + " lines";
  results()["nvrtc compile " + label + ", ms"] = r;
  state.counters["median_ms"] = r.ms;
}

/// A new process that builds the plan of a kernel already on disk: reads its cubin back.
void BM_disk_hit_new_process(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  {
    Bound b = softmax_graph(0.5);  // the child's kernel, compiled (and stored) here first
    backend::run_cuda(b.captured.graph, b.args);
    runtime::synchronize_cuda(0);
  }
  std::vector<double> ms;
  for (auto _ : state) {
    char exe[4096];
    ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
      state.SkipWithError("cannot find the benchmark's executable");
      return;
    }
    exe[n] = 0;
    std::string run = std::string("KILN_BENCH_CHILD=disk_hit '") + exe + "' 2>&1";
    std::FILE* p = ::popen(run.c_str(), "r");
    double t = -1;
    char line[512];
    while (p && std::fgets(line, sizeof line, p))
      if (std::sscanf(line, "disk_hit_ms=%lf", &t) == 1) break;
    if (p) ::pclose(p);
    if (t < 0) {
      state.SkipWithError("the child process reported no time");
      return;
    }
    ms.push_back(t);
    state.SetIterationTime(t * 1e-3);
  }
  std::sort(ms.begin(), ms.end());
  results()["disk-cache hit in a new process, ms"] = Result{ms[ms.size() / 2], 0, 0, ""};
  state.counters["median_ms"] = ms[ms.size() / 2];
}

/// In the child: CUDA is set up first (context, pool), then the plan of the parent's kernel
/// is built and run once; prints the milliseconds of that first run.
int child_disk_hit() {
  if (!unavailable().empty()) return 1;
  runtime::cuda_context(0);
  Bound b = softmax_graph(0.5);
  runtime::synchronize_cuda(0);
  Stats before = stats();
  auto t0 = std::chrono::steady_clock::now();
  backend::run_cuda(b.captured.graph, b.args);
  double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  runtime::synchronize_cuda(0);
  Stats after = stats();
  std::printf("disk_hit_ms=%.3f compiles=%llu disk_hits=%llu\n", t,
              static_cast<unsigned long long>(after.compiles - before.compiles),
              static_cast<unsigned long long>(after.disk_hits - before.disk_hits));
  return 0;
}

/// Times `call` in batches of 200 per benchmark iteration and records the median microseconds
/// per call under `label`. `synchronize_each` waits for the GPU after every call (end-to-end
/// time); otherwise only after each batch (host time: the calls return once queued).
template <class Call>
void time_calls_us(benchmark::State& state, const std::string& label, bool synchronize_each, Call call) {
  std::vector<double> us;
  for (auto _ : state) {
    const int reps = 200;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) {
      call();
      if (synchronize_each) runtime::synchronize_cuda(0);
    }
    double t = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
    runtime::synchronize_cuda(0);
    us.push_back(t);
    state.SetIterationTime(t * 1e-6);
  }
  std::sort(us.begin(), us.end());
  results()[label] = Result{us[us.size() / 2], 0, 0, ""};
  state.counters["median_us"] = us[us.size() / 2];
}

/// Host time of one launch of a cached plan through the executor (16 elements).
void BM_cached_launch_executor(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  NodePtr x = normal({16}, f32, 31), y = normal({16}, f32, 32);
  Bound b = bind_graph({add(mul(cst(2.0, x), x), y)});
  backend::run_cuda(b.captured.graph, b.args);
  runtime::synchronize_cuda(0);
  time_calls_us(state, "cached launch host time (run_cuda), us", false,
                [&] { backend::run_cuda(b.captured.graph, b.args); });
}

/// The floor under every launch figure: cuLaunchKernel alone, queuing the 16-element kernel
/// of BM_cached_launch_executor with fixed arguments (no plan lookup, no allocation).
void BM_launch_floor(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  NodePtr x = normal({16}, f32, 41), y = normal({16}, f32, 42);
  Bound b = bind_graph({add(mul(cst(2.0, x), x), y)});
  backend::run_cuda(b.captured.graph, b.args);
  runtime::synchronize_cuda(0);
  auto plan = backend::detail::CudaPlanCache::instance().get(b.captured.graph, backend::detail::alignment_of(b.args));
  const runtime::CudaContext& ctx = runtime::cuda_context(0);
  const auto& api = runtime::detail::cuda_driver_state().api;
  std::vector<void*> argv(plan->num_args, nullptr);
  for (std::size_t i = 0; i < b.args.inputs.size() && i < plan->leaves; ++i)
    argv[i] = const_cast<void*>(b.args.inputs[i]);
  argv[plan->leaves] = b.args.outputs[0];
  void* params[] = {argv.data()};
  const auto& info = plan->kernels[0];
  ctx.make_current();
  time_calls_us(state, "launch floor (cuLaunchKernel alone), us", false, [&] {
    api.launch_kernel(plan->functions[0], info.grid, 1, 1, info.block, 1, 1, info.shared_bytes, ctx.stream, params,
                      nullptr);
  });
}

/// Host time of one result buffer's life: cuMemAllocAsync from the pool and cuMemFreeAsync.
void BM_pool_alloc_free(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  time_calls_us(state, "pool allocate + free (64 bytes), us", false, [&] {
    StoragePtr s = runtime::allocate_cuda(64, 0);
    benchmark::DoNotOptimize(s);
  });
}

/// Host time of one cached launch from a typed expression: y.assign(2 * x + z) on 16 elements.
void BM_cached_launch_typed(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  try {
    Tensor x = randn({16}, 33, f32, kDev), z = randn({16}, 34, f32, kDev), y = zeros({16}, f32, kDev);
    // Evaluated leaves: the typed fast path takes only realized tensors (lazy ones would be
    // generated inside every call's graph, through the general path).
    x.eval();
    z.eval();
    y.eval();
    y.assign(x * 2.0f + z);
    runtime::synchronize_cuda(0);
    time_calls_us(state, "cached launch host time (typed assign), us", false, [&] { y.assign(x * 2.0f + z); });
  } catch (const Error& e) {
    state.SkipWithError(e.what());
  }
}

/// Host time of one cached kiln::compile call (guard check + launch of one kernel) on 16
/// elements: the "compiled call" figure of docs/performance.md (torch.compile: 54 us).
void BM_compiled_call(benchmark::State& state, const char* mode) {
  if (skip_without_gpu(state)) return;
  try {
    Tensor x = randn({16}, 35, f32, kDev), w = randn({16}, 36, f32, kDev);
    CompileOptions opt;
    opt.mode = mode;
    auto step = kiln::compile([](const Tensor& a, const Tensor& b) { return relu(a * b + 1.0f); }, opt);
    Tensor y = step(x, w);
    y.eval();
    runtime::synchronize_cuda(0);
    const std::string label = std::string(mode) == "default"
                                  ? "compiled call host time, us"
                                  : std::string("compiled call host time (") + mode + "), us";
    time_calls_us(state, label, false, [&] {
      Tensor r = step(x, w);
      benchmark::DoNotOptimize(r);
    });
  } catch (const Error& e) {
    state.SkipWithError(e.what());
  }
}

/// S1 of the workload table: 10 x `x = relu(x*y + 0.1)` on 4096 elements, compiled, end to end
/// (call + synchronise) per call, in the mode given by the benchmark's argument.
void BM_S1_compiled(benchmark::State& state, const char* mode) {
  if (skip_without_gpu(state)) return;
  try {
    Tensor x = randn({4096}, 37, f32, kDev), y = randn({4096}, 38, f32, kDev);
    CompileOptions opt;
    opt.mode = mode;
    auto f = kiln::compile(
        [](Tensor a, const Tensor& b) {
          for (int i = 0; i < 10; ++i) a = relu(a * b + 0.1f);
          return a;
        },
        opt);
    Tensor r0 = f(x, y);
    r0.eval();
    runtime::synchronize_cuda(0);
    time_calls_us(state, std::string("S1 compiled (") + mode + ") end to end, us", true, [&] {
      Tensor r = f(x, y);
      r.eval();
    });
  } catch (const Error& e) {
    state.SkipWithError(e.what());
  }
}

/// G4: a small transformer MLP (two layers of x + linear(gelu(linear(x, W1, b1)), W2, b2), bf16,
/// x [32, 1024], hidden 4096: four products, their epilogues, two residual adds), compiled,
/// end to end (call + synchronise) per call: what CUDA graphs save when the launches and
/// library calls, not the GPU, are the cost.
void BM_G4_compiled(benchmark::State& state, const char* mode) {
  if (skip_without_gpu(state)) return;
  try {
    Tensor x = randn({32, 1024}, 61, bf16, kDev);
    std::vector<Tensor> p;
    for (std::uint64_t layer = 0; layer < 2; ++layer) {
      p.push_back(Tensor(randn({4096, 1024}, 62 + layer * 4, bf16, kDev) * 0.02f));
      p.push_back(Tensor(randn({4096}, 63 + layer * 4, bf16, kDev) * 0.02f));
      p.push_back(Tensor(randn({1024, 4096}, 64 + layer * 4, bf16, kDev) * 0.02f));
      p.push_back(Tensor(randn({1024}, 65 + layer * 4, bf16, kDev) * 0.02f));
    }
    for (auto& t : p) t.eval();
    CompileOptions opt;
    opt.mode = mode;
    auto mlp = [](const Tensor& h, const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2) {
      return Tensor(h + linear(gelu(linear(h, w1, b1), true), w2, b2));
    };
    auto f = kiln::compile([mlp](const Tensor& h, const Tensor& w1, const Tensor& b1, const Tensor& w2,
                                 const Tensor& b2, const Tensor& w3, const Tensor& b3, const Tensor& w4,
                                 const Tensor& b4) { return mlp(mlp(h, w1, b1, w2, b2), w3, b3, w4, b4); },
                           opt);
    Tensor r0 = f(x, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]);
    r0.eval();
    runtime::synchronize_cuda(0);
    time_calls_us(state, std::string("G4 small MLP compiled (") + mode + ") end to end, us", true, [&] {
      Tensor r = f(x, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]);
      r.eval();
    });
  } catch (const Error& e) {
    state.SkipWithError(e.what());
  }
}

/// Every benchmark through the kit's registration (manual time: the names keep their
/// "/manual_time" suffix of earlier versions).
// ---- matrix products (G1-G3): kiln's step plan beside the plain library products ----------

/// One product workload: its graph, and the plain products (no epilogue) it is held to.
struct ProductWorkload {
  const char* id;
  double flops;
  std::function<std::vector<NodePtr>()> build;
  std::function<std::vector<std::vector<NodePtr>>()> plain;  ///< each a graph of one product
  double plain_flops = 0;  ///< the plain products' flops, where they are not the workload's
};

NodePtr transposed(const NodePtr& w) { return ir::permute(w, {1, 0}); }
NodePtr row_bias(const NodePtr& b, std::int64_t m) {
  return ir::broadcast(ir::reshape(b, Shape{1, b->shape[0]}), Shape{m, b->shape[0]});
}

std::vector<ProductWorkload> product_workloads() {
  std::vector<ProductWorkload> w;
  for (DType dt : {bf16, f32}) {
    const std::int64_t n = 4096;
    auto inputs = std::make_shared<std::vector<NodePtr>>();
    auto get = [inputs, dt, n] {
      if (inputs->empty())
        *inputs = {normal({n, n}, dt, 11, 0.02), normal({n, n}, dt, 12, 0.02), normal({n}, dt, 13, 0.02)};
      return *inputs;
    };
    w.push_back({dt == bf16 ? "G1" : "G2", 2.0 * n * n * n,
                 [get] {
                   auto in = get();
                   return std::vector<NodePtr>{decomp::relu(add(ir::matmul(in[0], in[1]), row_bias(in[2], 4096)))};
                 },
                 [get] {
                   auto in = get();
                   return std::vector<std::vector<NodePtr>>{{ir::matmul(in[0], in[1])}};
                 }});
  }
  auto mlp = std::make_shared<std::vector<NodePtr>>();
  auto get = [mlp] {
    if (mlp->empty())
      *mlp = {normal({8192, 4096}, bf16, 21, 1.0), normal({16384, 4096}, bf16, 22, 0.02),
              normal({16384}, bf16, 23, 0.02),     normal({4096, 16384}, bf16, 24, 0.02),
              normal({4096}, bf16, 25, 0.02),      normal({8192, 16384}, bf16, 26, 1.0)};
    return *mlp;
  };
  w.push_back({"G3", 2.0 * 8192.0 * 4096 * 16384 * 2,
               [get] {
                 auto in = get();
                 NodePtr h = decomp::gelu(add(ir::matmul(in[0], transposed(in[1])), row_bias(in[2], 8192)), true);
                 return std::vector<NodePtr>{add(ir::matmul(h, transposed(in[3])), row_bias(in[4], 8192))};
               },
               [get] {
                 auto in = get();
                 return std::vector<std::vector<NodePtr>>{{ir::matmul(in[0], transposed(in[1]))},
                                                          {ir::matmul(in[5], transposed(in[3]))}};
               }});
  // B2: forward and backward of G3 with respect to x, W1, b1, W2 and b2 (torch_suite's B2), from
  // a given gradient of the output; held to the six plain products of the same sizes (two
  // forward, four backward).
  auto grad_out = [g = std::make_shared<NodePtr>()] {
    if (!*g) *g = normal({8192, 4096}, bf16, 27, 1.0);
    return *g;
  };
  w.push_back({"B2", 6 * 2.0 * 8192.0 * 4096 * 16384,
               [get, grad_out] {
                 auto in = get();
                 std::vector<NodePtr> leaves;
                 for (int k = 0; k < 5; ++k) {  // fresh leaves over the same buffers: each build records anew
                   NodePtr leaf = ir::input(*in[k]->buffer, in[k]->shape, in[k]->dtype, in[k]->device);
                   leaf->requires_grad = true;
                   leaf->grad_leaf = std::make_shared<ir::GradLeaf>();
                   leaves.push_back(leaf);
                 }
                 NodePtr h = decomp::gelu(add(ir::matmul(leaves[0], transposed(leaves[1])), row_bias(leaves[2], 8192)), true);
                 NodePtr y = add(ir::matmul(h, transposed(leaves[3])), row_bias(leaves[4], 8192));
                 std::vector<autodiff::Reached> reached = autodiff::backward_pass({y}, {grad_out()}, leaves, false, "B2");
                 std::vector<NodePtr> grads{y};  // the forward's output too, as a training step has it
                 for (const NodePtr& leaf : leaves)
                   for (const autodiff::Reached& r : reached)
                     if (r.node == leaf) grads.push_back(r.grad);
                 return grads;
               },
               [get, grad_out] {
                 auto in = get();
                 const NodePtr g = grad_out();
                 const NodePtr &x = in[0], &W1 = in[1], &W2 = in[3], &h = in[5];
                 return std::vector<std::vector<NodePtr>>{
                     {ir::matmul(x, transposed(W1))}, {ir::matmul(h, transposed(W2))},  // forward
                     {ir::matmul(g, W2)},             {ir::matmul(transposed(g), h)},   // dh, dW2
                     {ir::matmul(h, W1)},             {ir::matmul(transposed(h), x)}};  // dx, dW1 (h as dh')
               }});
  // A1 / A2: fused causal attention over [16, 16, 2048, 128] bf16 (torch_suite's A1 / A2), its
  // forward and its forward with the backward of q, k and v from a given gradient; held to the
  // dense bf16 product rate (G1's plain product, same run). flops: 4 B H T T D halved by the
  // causal mask; the backward counted as 2.5 forwards (FlashAttention's convention).
  auto attn = std::make_shared<std::vector<NodePtr>>();
  auto qkv = [attn] {
    if (attn->empty())
      for (std::uint64_t s = 0; s < 4; ++s) attn->push_back(normal({16, 16, 2048, 128}, bf16, 31 + s, 1.0));
    return *attn;
  };
  // A2 at T = 2000: partial 128-row tiles (cuDNN's backward with its padding mask).
  auto attn_partial = std::make_shared<std::vector<NodePtr>>();
  auto qkv_partial = [attn_partial] {
    if (attn_partial->empty())
      for (std::uint64_t s = 0; s < 4; ++s) attn_partial->push_back(normal({16, 16, 2000, 128}, bf16, 31 + s, 1.0));
    return *attn_partial;
  };
  const double attn_flops = 4.0 * 16 * 16 * 2048.0 * 2048 * 128 / 2;
  const double scale = 1.0 / std::sqrt(128.0);
  auto dense = [] {
    NodePtr a = normal({4096, 4096}, bf16, 11, 0.02), b = normal({4096, 4096}, bf16, 12, 0.02);
    return std::vector<std::vector<NodePtr>>{{ir::matmul(a, b)}};
  };
  w.push_back({"A1", attn_flops,
               [qkv, scale] {
                 auto in = qkv();
                 return std::vector<NodePtr>{
                     ir::attention(ir::AttentionRole::Out, in[0], in[1], in[2], nullptr, true, scale)};
               },
               dense, 2.0 * 4096 * 4096 * 4096});
  // A2 and A2-dropout (p 0.1, as a GPT trains: the mask drawn inside the kernels, the same in
  // the backward; torch's same call runs FlashAttention's dropout).
  auto forward_backward = [scale](auto inputs, double dropout_p) {
    return [inputs, scale, dropout_p] {
      auto in = inputs();
      std::vector<NodePtr> leaves;
      for (int k = 0; k < 3; ++k) {
        NodePtr leaf = ir::input(*in[k]->buffer, in[k]->shape, in[k]->dtype, in[k]->device);
        leaf->requires_grad = true;
        leaf->grad_leaf = std::make_shared<ir::GradLeaf>();
        leaves.push_back(leaf);
      }
      ir::AttentionDropout dropout;
      if (dropout_p > 0) dropout = {dropout_p, ir::constant_int(1234, DType::Int64, Shape{}, in[0]->device)};
      NodePtr y = ir::attention(ir::AttentionRole::Out, leaves[0], leaves[1], leaves[2], nullptr, true, scale, {},
                                dropout);
      std::vector<autodiff::Reached> reached = autodiff::backward_pass({y}, {in[3]}, leaves, false, "A2");
      std::vector<NodePtr> outs{y};
      for (const NodePtr& leaf : leaves)
        for (const autodiff::Reached& r : reached)
          if (r.node == leaf) outs.push_back(r.grad);
      return outs;
    };
  };
  w.push_back({"A2", 3.5 * attn_flops, forward_backward(qkv, 0.0), dense, 2.0 * 4096 * 4096 * 4096});
  w.push_back({"A2-dropout", 3.5 * attn_flops, forward_backward(qkv, 0.1), dense, 2.0 * 4096 * 4096 * 4096});
  const double partial_flops = attn_flops * (2000.0 * 2000.0) / (2048.0 * 2048.0);
  w.push_back({"A2-T2000", 3.5 * partial_flops, forward_backward(qkv_partial, 0.0), dense, 2.0 * 4096 * 4096 * 4096});
  return w;
}

/// Times graphs (each bound once, as kiln::compile's replays run them) one after another.
void time_graphs(benchmark::State& state, const std::vector<std::vector<NodePtr>>& graphs, double flops,
                 const std::string& label, bool autotune = false) {
  if (skip_without_gpu(state)) return;
  std::vector<Bound> bound;
  std::vector<std::unique_ptr<backend::PreparedGraph>> prepared;
  std::string plan_text;
  for (auto& g : graphs) {
    bound.push_back(bind_graph(g));
    prepared.push_back(std::make_unique<backend::PreparedGraph>(bound.back().captured.graph, backend::Mode::Jit,
                                                                backend::CpuLaunchOptions{.autotune = autotune}));
    plan_text += backend::explain(bound.back().captured.graph, backend::Mode::Jit);
  }
  auto run = [&] {
    for (std::size_t i = 0; i < bound.size(); ++i) prepared[i]->run(bound[i].args);
  };
  const bench::Measurement m = bench::run(state, kDev, {.flops = flops}, run);
  if (state.error_occurred()) return;
  Result r;
  r.ms = m.median_ms;
  for (std::size_t p = plan_text.find('\n'); p != std::string::npos; p = plan_text.find('\n')) plan_text[p] = ' ';
  r.strategy = plan_text.substr(0, 160);
  results()[label] = r;
  state.counters["ms"] = r.ms;
  state.counters["TFLOP/s"] = flops / (r.ms * 1e-3) / 1e12;
}

// ---- training (T1, T2) ------------------------------------------------------------------------

/// T1: one training step of the GPT at batch 16 (bf16 autocast, AdamW lr 3e-4, weight decay
/// 0.1, the forward compiled; the step's loss read back as torch_suite's step returns it).
/// compile_ms is the first step: trace and compile of forward, backward and optimizer (cold
/// unless KILN_CACHE_DIR holds a warm cache). peak_GiB is the pool's high-water mark over
/// everything the run holds (parameters, optimizer state, activations), as
/// torch.cuda.max_memory_allocated.
void BM_T1(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  runtime::reset_cuda_memory_peak(0);
  manual_seed(0);
  gpt::Gpt model(t1::config());
  model.to(kDev);
  model.compile();
  optim::AdamW opt(model.parameters(), {.lr = 3e-4, .weight_decay = 0.1});
  Tensor idx = t1::token_ids(16, 1024, 50304, 1, kDev), tgt = t1::token_ids(16, 1024, 50304, 2, kDev);
  auto step = [&] {
    Tensor loss;
    {
      AutocastGuard amp(bf16);
      loss = gpt::Gpt::loss(model(idx), tgt);
    }
    opt.zero_grad();
    loss.backward();
    opt.step();
    return loss;
  };
  const bench::Measurement m = bench::run(state, kDev, {}, step);
  if (state.error_occurred()) return;
  const double peak_gib = static_cast<double>(runtime::cuda_memory_use(0).peak) / (1u << 30);
  state.counters["peak_GiB"] = peak_gib;
  state.counters["first_step_s"] = m.first_call_ms / 1e3;
  Result r;
  r.ms = m.median_ms;
  r.peak_mib = peak_gib * 1024;
  r.strategy = "first step " + std::to_string(m.first_call_ms / 1e3).substr(0, 5) + " s";
  results()["T1 GPT step"] = r;
}

/// T2: the AdamW step alone over T1's parameters (gradients from one backward), held to copy
/// speed on 28 bytes a parameter (p, g, m, v read; p, m, v written).
void BM_T2(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  manual_seed(0);
  gpt::Gpt model(t1::config());
  model.to(kDev);
  optim::AdamW opt(model.parameters(), {.lr = 3e-4, .weight_decay = 0.1});
  double params = 0;
  for (const Tensor& p : model.parameters()) params += static_cast<double>(p.numel());
  {
    Tensor idx = t1::token_ids(2, 64, 50304, 1, kDev), tgt = t1::token_ids(2, 64, 50304, 2, kDev);
    gpt::Gpt::loss(model(idx), tgt).backward();
  }
  const bench::Measurement m = bench::run(state, kDev, {.bytes = 28.0 * params}, [&] { opt.step(); });
  if (state.error_occurred()) return;
  Result r;
  r.ms = m.median_ms;
  r.gbps = 28.0 * params / (r.ms * 1e-3) / 1e9;
  r.ratio = r.gbps / m.copy_gbps;
  r.strategy = std::to_string(static_cast<long long>(m.launches_per_call)) + " launch(es) per step, " +
               std::to_string(static_cast<long long>(params / 1e6)) + " M parameters";
  results()["T2 AdamW step"] = r;
}

void register_all(bool variants) {
  bench::add("BM_copy", BM_copy)->Iterations(3)->Unit(benchmark::kMillisecond);
  static std::vector<Workload> ws = workloads();
  for (auto& w : ws)
    bench::add((std::string("BM_") + w.id).c_str(), [&w](benchmark::State& s) { run_workload(s, w, w.id); })
        ->Iterations(5)
        ->Unit(benchmark::kMillisecond);
  // max-autotune beside the default of every workload: it must never be slower.
  for (auto& w : ws)
    if (std::string(w.id).rfind("E2", 0) != 0 && std::string(w.id) != "C1" &&
        std::string(w.id) != "K1")  // scatters, scans and sorts have no knobs
    bench::add((std::string("BM_") + w.id + "/max-autotune").c_str(),
               [&w](benchmark::State& s) { run_workload(s, w, std::string(w.id) + " max-autotune", true); })
        ->Iterations(5)
        ->Unit(benchmark::kMillisecond);
  if (variants) {
    struct V {
      const char* name;
      std::vector<const char*> ids;
      int backend::detail::CudaTuning::*knob;
      std::vector<int> values;
    };
    static std::vector<V> vs = {
        {"pointwise_lanes_heavy", {"P3"}, &backend::detail::CudaTuning::pointwise_lanes_heavy, {1, 4}},
        {"row_unroll_uncached", {"N6"}, &backend::detail::CudaTuning::row_unroll_uncached, {8, 32}},
        {"row_vectors_per_thread_uncached",
         {"N6"},
         &backend::detail::CudaTuning::row_vectors_per_thread_uncached,
         {4, 16, 64}},
        {"column_split_interleave", {"R3"}, &backend::detail::CudaTuning::column_split_interleave, {1}},
        {"column_unroll", {"R3"}, &backend::detail::CudaTuning::column_unroll, {8}},
        {"warp_row_vectors", {"N2"}, &backend::detail::CudaTuning::warp_row_vectors, {4, 8}},
        {"row_vectors_per_thread", {"N1", "N3", "N4"}, &backend::detail::CudaTuning::row_vectors_per_thread, {2, 8}},
        {"pointwise_unroll_gather", {"E1"}, &backend::detail::CudaTuning::pointwise_unroll_gather, {2, 8}},
        {"row_cache_load_keep", {"N1", "N3", "N4", "N5"}, &backend::detail::CudaTuning::row_cache_load_keep, {-1}},
        {"gather_load_keep", {"E1", "E1u"}, &backend::detail::CudaTuning::gather_load_keep, {1}},
    };
    for (auto& v : vs)
      for (int value : v.values)
        for (const char* id : v.ids)
          for (auto& w : ws)
            if (std::string(w.id) == id) {
              std::string label = std::string(id) + " " + v.name + "=" + std::to_string(value);
              // Runs `body` with the variant's knob set; plans made with it are dropped after.
              auto with_variant = [&v, value](const std::function<void()>& body) {
                backend::detail::CudaTuning saved = backend::detail::cuda_tuning();
                backend::detail::cuda_tuning().*(v.knob) = value;
                backend::clear_cuda_plans();
                body();
                backend::detail::cuda_tuning() = saved;
                backend::clear_cuda_plans();
              };
              bench::add(
                  ("BM_" + label).c_str(),
                  [&w, with_variant, label](benchmark::State& s) { with_variant([&] { run_workload(s, w, label); }); })
                  ->Iterations(3)
                  ->Unit(benchmark::kMillisecond);
              bench::add(("BM_nvrtc_compile/" + label).c_str(),
                         [&w, with_variant, label](benchmark::State& s) {
                           with_variant([&] { BM_nvrtc_compile(s, w, label); });
                         })
                  ->Iterations(5)
                  ->Unit(benchmark::kMillisecond);
            }
  }
  for (auto& w : ws)
    bench::add((std::string("BM_nvrtc_compile/") + w.id).c_str(),
               [&w](benchmark::State& s) { BM_nvrtc_compile(s, w, w.id); })
        ->Iterations(5)
        ->Unit(benchmark::kMillisecond);
  static std::vector<ProductWorkload> products = product_workloads();
  for (auto& p : products) {
    bench::add((std::string("BM_") + p.id).c_str(),
               [&p](benchmark::State& s) { time_graphs(s, {p.build()}, p.flops, p.id); })
        ->Iterations(5)
        ->Unit(benchmark::kMillisecond);
    // max-autotune (the first, untimed run tunes: cuBLASLt's algorithms, cuDNN's configurations).
    bench::add((std::string("BM_") + p.id + "/max-autotune").c_str(),
               [&p](benchmark::State& s) { time_graphs(s, {p.build()}, p.flops, std::string(p.id) + " max-autotune", true); })
        ->Iterations(5)
        ->Unit(benchmark::kMillisecond);
    bench::add((std::string("BM_") + p.id + "/plain_products").c_str(),
               [&p](benchmark::State& s) {
                 time_graphs(s, p.plain(), p.plain_flops > 0 ? p.plain_flops : p.flops, std::string(p.id) + " plain products");
               })
        ->Iterations(5)
        ->Unit(benchmark::kMillisecond);
  }
  for (const char* mode : {"default", "reduce-overhead"})
    bench::add((std::string("BM_G4_compiled/") + mode).c_str(),
               [mode](benchmark::State& s) { BM_G4_compiled(s, mode); })
        ->Iterations(5)
        ->Unit(benchmark::kMicrosecond);
  bench::add("BM_T1", BM_T1)->Iterations(5)->Unit(benchmark::kMillisecond);
  bench::add("BM_T2", BM_T2)->Iterations(5)->Unit(benchmark::kMillisecond);
  bench::add("BM_first_compile", BM_first_compile)->Iterations(7)->Unit(benchmark::kMillisecond);
  bench::add("BM_disk_hit_new_process", BM_disk_hit_new_process)->Iterations(5)->Unit(benchmark::kMillisecond);
  bench::add("BM_launch_floor", BM_launch_floor)->Iterations(5)->Unit(benchmark::kMicrosecond);
  bench::add("BM_pool_alloc_free", BM_pool_alloc_free)->Iterations(5)->Unit(benchmark::kMicrosecond);
  bench::add("BM_cached_launch_executor", BM_cached_launch_executor)->Iterations(5)->Unit(benchmark::kMicrosecond);
  bench::add("BM_cached_launch_typed", BM_cached_launch_typed)->Iterations(5)->Unit(benchmark::kMicrosecond);
  for (const char* mode : {"default", "reduce-overhead"})
    bench::add((std::string("BM_compiled_call/") + mode).c_str(),
               [mode](benchmark::State& s) { BM_compiled_call(s, mode); })
        ->Iterations(5)
        ->Unit(benchmark::kMicrosecond);
  for (const char* mode : {"default", "reduce-overhead"})
    bench::add((std::string("BM_S1_compiled/") + mode).c_str(),
               [mode](benchmark::State& s) { BM_S1_compiled(s, mode); })
        ->Iterations(5)
        ->Unit(benchmark::kMicrosecond);
}

void print_summary() {
  if (results().empty()) return;
  std::printf("\n%-34s %10s %10s %8s %9s  %s\n", "workload", "ms", "GB/s", "/copy", "peak MiB", "kernel");
  for (auto& [name, r] : results()) {
    if (r.gbps > 0)
      std::printf("%-34s %10.4f %10.1f %8.3f %9.0f  %s\n", name.c_str(), r.ms, r.gbps, r.ratio, r.peak_mib,
                  r.strategy.c_str());
    else
      std::printf("%-34s %10.3f %19s  %s\n", name.c_str(), r.ms, "", r.strategy.c_str());
  }
  if (unavailable().empty()) {
    const auto& ctx = runtime::cuda_context(0);
    std::printf("device: %s (%s, %d SMs), driver CUDA %s, NVRTC %s, copy %.1f GB/s\n", ctx.name.c_str(),
                ctx.arch().c_str(), ctx.sm_count, runtime::cuda_driver_version().c_str(),
                runtime::nvrtc_version().c_str(), copy_gbps());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (const char* child = std::getenv("KILN_BENCH_CHILD"); child && std::string(child) == "disk_hit")
    return child_disk_hit();
  bool variants = false;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::string(argv[i]) == "--variants")
      variants = true;
    else if (std::string(argv[i]) == "--no-lead")
      g_lead = false;
    else
      args.push_back(argv[i]);
  }
  // The kit's flags (KILN_BENCH_JSON), context and reporter.
  if (!bench::initialize(static_cast<int>(args.size()), args.data())) return 1;
  register_all(variants);
  bench::run_benchmarks();
  print_summary();
  return 0;
}
