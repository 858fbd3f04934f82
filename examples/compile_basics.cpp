// kiln::compile, walked through the way torch.compile's user guide teaches it: wrap a function,
// see what the first call costs, pick a mode, find graph breaks with `fullgraph`, and stop
// recompiles over varying shapes with `dynamic`. Runs on the CPU; KILN_DEVICE=cuda runs it
// on the GPU (where reduce-overhead replays a CUDA graph).
#include <kiln/kiln.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

using namespace kiln;

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void print_stats(const char* what, const CompileStats& s) {
  std::printf("  %-34s traces %llu, recompiles %llu, graph breaks %llu, cache hits %llu, fallbacks %llu\n", what,
              static_cast<unsigned long long>(s.traces), static_cast<unsigned long long>(s.recompiles),
              static_cast<unsigned long long>(s.graph_breaks), static_cast<unsigned long long>(s.cache_hits),
              static_cast<unsigned long long>(s.fallbacks));
}

}  // namespace

int main() {
  const char* dev = std::getenv("KILN_DEVICE");
  const Device device = (dev && std::string(dev) == "cuda") ? Device::cuda() : Device::cpu();

  // 1. Wrapping. The function is ordinary kiln code; compile() returns a callable taking and
  //    returning the same things. The first call traces it into one graph, fuses, generates
  //    and compiles the kernel; later calls with matching guards only check them and launch.
  auto gelu_layer = kiln::compile([](const Tensor& x, const Tensor& w, const Tensor& b) {
    Tensor h = x * w + b;
    return 0.5f * h * (1.0f + tanh(0.7978845608f * (h + 0.044715f * h * h * h)));
  });
  Tensor x = randn({256, 1024}, 1, f32, device), w = randn({1024}, 2, f32, device), b = zeros({1024}, f32, device);
  std::printf("1. wrapping a function\n");
  auto t0 = std::chrono::steady_clock::now();
  Tensor y = gelu_layer(x, w, b);
  y.eval();
  const double first = ms_since(t0);
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 10; ++i) gelu_layer(x, w, b).eval();
  const double later = ms_since(t0) / 10;
  std::printf(
      "  first call %.1f ms (trace + compile; a second process finds the kernel in the disk cache),"
      " later calls %.3f ms\n",
      first, later);
  print_stats("after 11 calls:", gelu_layer.stats());
  std::printf("%s", kiln::explain(gelu_layer, x, w, b).c_str());

  // 2. Modes. "default" launches each kernel; "reduce-overhead" runs a graph's kernels from one
  //    entry (one parallel region on the CPU, a replayed CUDA graph on the GPU); "max-autotune"
  //    times launch configurations on the first call and keeps the fastest (stored on disk).
  std::printf("2. modes\n");
  auto step = [](Tensor a, const Tensor& c) {
    for (int i = 0; i < 10; ++i) a = relu(a * c + 0.1f);  // S1 of WORKLOADS.md: fuses into one kernel
    return a;
  };
  Tensor s = randn({4096}, 3, f32, device), c = randn({4096}, 4, f32, device);
  Tensor reference = step(s, c).eval();
  for (const char* mode : {"default", "reduce-overhead", "max-autotune"}) {
    CompileOptions opt;
    opt.mode = mode;
    auto f = kiln::compile(step, opt);
    f(s, c).eval();  // first call: compile (and, for max-autotune, tune)
    t0 = std::chrono::steady_clock::now();
    Tensor r;
    for (int i = 0; i < 100; ++i) r = f(s, c).eval();
    const double us = ms_since(t0) * 10;  // per call, in microseconds
    const float diff = max(abs(r - reference)).item<float>();
    std::printf("  %-16s %7.2f us per call, max |difference| to uncompiled %g\n", mode, us, diff);
  }

  // 3. Graph breaks. Reading a value inside the function (item(), to_vector(), data_ptr())
  //    ends the graph there: the part before runs, C++ continues with the real number, tracing
  //    resumes. fullgraph = true turns the first break into an error that says where it is.
  std::printf("3. graph breaks\n");
  auto normalise = [](const Tensor& v) {
    float norm = std::sqrt(sum(v * v).item<float>());  // a data read: graph break
    return v / (norm > 0.0f ? norm : 1.0f);
  };
  auto with_break = kiln::compile(normalise);
  Tensor v = randn({1000}, 5, f32, device);
  with_break(v).eval();
  with_break(v).eval();
  print_stats("normalise, 2 calls:", with_break.stats());
  CompileOptions strict;
  strict.fullgraph = true;
  auto must_be_one_graph = kiln::compile(normalise, strict);
  try {
    must_be_one_graph(v);
    std::printf("  fullgraph: no break?\n");
    return 1;
  } catch (const GraphBreakError& e) {
    std::printf("  fullgraph = true: %s\n", e.what());
  }
  // The fix: keep the norm a tensor, so the whole function is one graph.
  auto no_break = kiln::compile([](const Tensor& u) { return u / sqrt(sum(u * u)); }, strict);
  const float diff = max(abs(no_break(v) - with_break(v))).item<float>();
  std::printf("  rewritten without item(): one graph, max |difference| %g\n", diff);

  // 4. Dynamic shapes. By default (dynamic unset) the first shape is specialised; when a size
  //    changes, kiln recompiles once with that dimension symbolic, so a loop over batch sizes
  //    compiles twice, not once per size. dynamic = false specialises every shape.
  std::printf("4. dynamic shapes\n");
  auto row_softmax = [](const Tensor& t) { return softmax(t * 2.0f, -1); };
  for (std::optional<bool> dynamic : {std::optional<bool>(false), std::optional<bool>()}) {
    CompileOptions opt;
    opt.dynamic = dynamic;
    auto f = kiln::compile(row_softmax, opt);
    for (std::int64_t batch : {8, 16, 24, 32, 40}) f(randn({batch, 128}, 6, f32, device)).eval();
    print_stats(dynamic.has_value() ? "dynamic=false, 5 batch sizes:" : "dynamic automatic, 5 batch sizes:", f.stats());
  }
  return 0;
}
