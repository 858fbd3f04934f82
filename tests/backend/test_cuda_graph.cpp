// kiln::compile's "reduce-overhead" on CUDA: the graph's launches captured once into a CUDA
// graph (backend::CudaGraphRunner, runtime/cuda_graph.hpp) and replayed. On the GPU: results
// equal the default mode for every WORKLOADS.md workload at small sizes, one capture for
// repeated calls, inputs that move between calls, results kept across later calls, several
// outputs, graphs with temporaries, the runner used with caller-owned outputs. Without a GPU
// only the checks that need none run, and the GPU cases say they were skipped.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include <kiln/kiln.hpp>
#include <kiln/backend/dispatch.hpp>
#include <kiln/backend/cuda.hpp>
#include <kiln/runtime/cublaslt.hpp>
#include <kiln/runtime/cuda_graph.hpp>

#include "../support/gpu_util.hpp"
#include "../support/mode_workloads.hpp"

namespace kiln_test_backend_cuda_graph {

using namespace kiln;

namespace {

const Device kGpu = Device::cuda(0);

bool have_gpu() { return kiln::testing::have_gpu("the CUDA graph tests"); }

bool have_graphs() {
  if (runtime::cuda_graphs_available()) return true;
  MESSAGE("the CUDA driver has no CUDA graphs (" << runtime::cuda_graphs_unavailable_reason() << "): skipped");
  return false;
}

std::uint64_t captures() { return runtime::cuda_graph_counters().captures.load(); }
std::uint64_t replays() { return runtime::cuda_graph_counters().replays.load(); }

using testing::max_rel_diff;

using Workload = testing::ModeWorkload;

/// The workloads of WORKLOADS.md at small sizes on cuda:0.
std::vector<Workload> workloads() { return testing::mode_workloads(kGpu, {1 << 14, 32, 512, 256, 1024}); }

auto compiled(const Workload& w, const char* mode) { return testing::compiled_workload(w, mode); }

CompileOptions reduce_overhead() {
  CompileOptions o;
  o.mode = "reduce-overhead";
  return o;
}

}  // namespace

TEST_CASE("cuda graph: without CUDA graphs, the runner refuses host graphs and the reason is given") {
  // Runs everywhere: a host graph is not a CUDA graph runner's business.
  Tensor x = randn({8}, 1);
  x.eval();
  ir::Captured c = ir::capture({(x * 2.0f).build()}, Device::cpu());
  CHECK_THROWS_AS(backend::CudaGraphRunner(c.graph), DeviceError);
  if (!cuda_available()) {
    CHECK_FALSE(runtime::cuda_graphs_available());
    CHECK(runtime::cuda_graphs_unavailable_reason().find("CUDA is unavailable") != std::string::npos);
  } else {
    CHECK(runtime::cuda_graphs_available() == runtime::cuda_graphs_unavailable_reason().empty());
  }
}

TEST_CASE("cuda graph: reduce-overhead == default for every WORKLOADS.md workload (small sizes)") {
  if (!have_gpu() || !have_graphs()) return;
  for (const Workload& w : workloads()) {
    CAPTURE(w.id);
    std::vector<Tensor> in = w.inputs();
    while (in.size() < 4) in.push_back(zeros({1}, f32, kGpu));
    auto plain = compiled(w, "default");
    auto graphed = compiled(w, "reduce-overhead");
    Tensor want = plain(in[0], in[1], in[2], in[3]);
    const std::uint64_t c0 = captures(), r0 = replays();
    for (int call = 0; call < 3; ++call) {
      CAPTURE(call);
      Tensor got = graphed(in[0], in[1], in[2], in[3]);
      CHECK(got.dtype() == want.dtype());
      CHECK(max_rel_diff(got, want) <= 1e-5);
    }
    // One capture; every call a replay (the result of each call was dropped before the next).
    CHECK(captures() - c0 == 1);
    CHECK(replays() - r0 == 3);
    CHECK(graphed.stats().traces == 1);
  }
}

TEST_CASE("cuda graph: captured once, replayed for every later call with the same inputs") {
  if (!have_gpu() || !have_graphs()) return;
  Tensor x = randn({4096}, 11, f32, kGpu), y = rand({4096}, 12, f32, kGpu);
  x.eval();
  y.eval();
  auto step = [](Tensor a, const Tensor& b) {
    for (int i = 0; i < 10; ++i) a = relu(a * b + 0.1f);
    return a;
  };
  auto plain = kiln::compile(step);
  auto graphed = kiln::compile(step, reduce_overhead());
  Tensor want = plain(x, y);
  const std::uint64_t c0 = captures(), r0 = replays();
  for (int i = 0; i < 20; ++i) {
    Tensor got = graphed(x, y);
    if (i % 5 == 0) CHECK(max_rel_diff(got, want) <= 1e-6);
  }
  CHECK(captures() - c0 == 1);
  CHECK(replays() - r0 == 20);
  CHECK(graphed.stats().cache_hits == 19);
}

TEST_CASE("cuda graph: inputs at new addresses are copied into static buffers (one re-capture)") {
  if (!have_gpu() || !have_graphs()) return;
  auto fn = [](const Tensor& a, const Tensor& w) -> Tensor { return relu(a * w + 1.0f); };
  auto plain = kiln::compile(fn);
  auto graphed = kiln::compile(fn, reduce_overhead());
  Tensor w = randn({1000}, 21, f32, kGpu);
  w.eval();
  // Every x is kept alive, so each call's x is at a new address (a freed block could come back).
  std::vector<Tensor> xs;
  for (int i = 0; i < 6; ++i)
    xs.push_back(Tensor(randn({1000}, 100 + static_cast<std::uint64_t>(i), f32, kGpu)).eval());
  const std::uint64_t c0 = captures();
  for (int i = 0; i < 6; ++i) {
    CAPTURE(i);
    Tensor got = graphed(xs[static_cast<std::size_t>(i)], w);
    CHECK(max_rel_diff(got, plain(xs[static_cast<std::size_t>(i)], w)) <= 1e-6);
  }
  // The first call captures reading x in place; the second finds x moved and captures again
  // with a static buffer for it; later calls copy x there and replay.
  CHECK(captures() - c0 == 2);
  // The same data at the same place after changes in place: the replay reads current values.
  Tensor x = randn({1000}, 31, f32, kGpu);
  x.eval();
  Tensor first = graphed(x, w);
  CHECK(max_rel_diff(first, plain(x, w)) <= 1e-6);
  x.assign(x * 3.0f);
  Tensor second = graphed(x, w);
  CHECK(max_rel_diff(second, plain(x, w)) <= 1e-6);
}

TEST_CASE("cuda graph: a result kept across later calls keeps its value") {
  if (!have_gpu() || !have_graphs()) return;
  auto fn = [](const Tensor& a) -> Tensor { return a * 2.0f + 1.0f; };
  auto graphed = kiln::compile(fn, reduce_overhead());
  std::vector<Tensor> xs, kept;
  for (int i = 0; i < 5; ++i) {
    xs.push_back(randn({2048}, 200 + static_cast<std::uint64_t>(i), f32, kGpu));
    xs.back().eval();
  }
  // Five results alive at once: more than the instances a runner keeps, so the later calls
  // run their kernels into new buffers instead of overwriting a held result.
  for (auto& x : xs) kept.push_back(graphed(x));
  for (std::size_t i = 0; i < xs.size(); ++i) {
    CAPTURE(i);
    Tensor want = Tensor(xs[i] * 2.0f + 1.0f).eval();
    CHECK(max_rel_diff(kept[i], want) <= 1e-6);
  }
  // The loop `y = f(y)`: the previous result is alive during each call.
  Tensor y = xs[0];
  Tensor ref = xs[0];
  for (int i = 0; i < 6; ++i) {
    y = graphed(y);
    ref = Tensor(ref * 2.0f + 1.0f).eval();
    CHECK(max_rel_diff(y, ref) <= 1e-5);
  }
  // Results taken earlier are still intact after all of this.
  CHECK(max_rel_diff(kept[0], Tensor(xs[0] * 2.0f + 1.0f).eval()) <= 1e-6);
}

TEST_CASE("cuda graph: y = f(y) alternates between two instances, copying y into their static inputs") {
  if (!have_gpu() || !have_graphs()) return;
  auto graphed = kiln::compile([](const Tensor& a) -> Tensor { return a * 0.5f + 1.0f; }, reduce_overhead());
  Tensor y0 = randn({4096}, 71, f32, kGpu);
  y0.eval();
  const std::vector<float> y0_before = y0.to_vector<float>();
  Tensor y = y0, ref = y0;
  const std::uint64_t c0 = captures(), r0 = replays();
  for (int i = 0; i < 8; ++i) {
    CAPTURE(i);
    y = graphed(y);
    ref = Tensor(ref * 0.5f + 1.0f).eval();
    CHECK(max_rel_diff(y, ref) <= 1e-6);
  }
  // Call 1 captures instance A reading y0 in place; call 2 finds A's output held (it is the
  // argument) and captures B with a static input; call 3 captures A again with a static
  // input; from then on A and B take turns, each call a replay.
  CHECK(captures() - c0 == 3);
  CHECK(replays() - r0 == 8);
  CHECK(y0.to_vector<float>() == y0_before);  // the first input is untouched
}

TEST_CASE("cuda graph: several outputs, numbers and views among the results") {
  if (!have_gpu() || !have_graphs()) return;
  auto fn = [](const Tensor& a, const Tensor& b) {
    return std::make_tuple(Tensor(a + b), Tensor(a * b), sum(a * b), softmax(a, -1), b, 7);
  };
  auto plain = kiln::compile(fn);
  auto graphed = kiln::compile(fn, reduce_overhead());
  Tensor a = randn({16, 256}, 41, f32, kGpu), b = randn({16, 256}, 42, f32, kGpu);
  a.eval();
  b.eval();
  auto want = plain(a, b);
  for (int call = 0; call < 3; ++call) {
    CAPTURE(call);
    auto got = graphed(a, b);
    CHECK(max_rel_diff(std::get<0>(got), std::get<0>(want)) <= 1e-6);
    CHECK(max_rel_diff(std::get<1>(got), std::get<1>(want)) <= 1e-6);
    CHECK(max_rel_diff(std::get<2>(got), std::get<2>(want)) <= 1e-5);
    CHECK(max_rel_diff(std::get<3>(got), std::get<3>(want)) <= 1e-6);
    CHECK(max_rel_diff(std::get<4>(got), b) == 0);
    CHECK(std::get<5>(got) == 7);
  }
}

TEST_CASE("cuda graph: graphs with temporaries between kernels") {
  if (!have_gpu() || !have_graphs()) return;
  // Centring by column means, then a row softmax: the column reduction is one kernel whose
  // result is a temporary that the row kernel reads (a whole-tensor statistic fuses into a
  // single multi-pass kernel instead, with no temporary).
  auto fn = [](const Tensor& a) -> Tensor { return softmax(a - mean(a, {0}, true), -1); };
  Tensor x = randn({64, 1024}, 51, f32, kGpu);
  x.eval();
  {
    Tensor lazy = fn(x);
    ir::Captured c = ir::capture({lazy.node()}, kGpu);
    sched::Schedule s = sched::schedule(c.graph);
    INFO(s.str(c.graph));
    REQUIRE(s.kernels.size() >= 2);
    REQUIRE_FALSE(s.temps.empty());
  }
  auto plain = kiln::compile(fn);
  auto graphed = kiln::compile(fn, reduce_overhead());
  std::vector<Tensor> xs;  // kept alive: each call's input is at a new address
  for (int call = 0; call < 4; ++call) xs.push_back(Tensor(x * static_cast<float>(call + 1)).eval());
  const std::uint64_t c0 = captures();
  for (int call = 0; call < 4; ++call) {
    CAPTURE(call);
    Tensor got = graphed(xs[static_cast<std::size_t>(call)]);  // copied into the static input from call 1 on
    CHECK(max_rel_diff(got, plain(xs[static_cast<std::size_t>(call)])) <= 1e-5);
  }
  CHECK(captures() - c0 == 2);
}

TEST_CASE("cuda graph: the runner writes into caller-owned outputs; plain runs == run_cuda") {
  if (!have_gpu() || !have_graphs()) return;
  Tensor a = randn({3000}, 61, f32, kGpu), b = randn({3000}, 62, f32, kGpu);
  a.eval();
  b.eval();
  Tensor lazy = Tensor(a * b - 0.5f);
  Tensor total = sum(a);
  ir::Captured c = ir::capture({lazy.node(), total.node()}, kGpu);
  auto runner = std::make_shared<backend::CudaGraphRunner>(c.graph);
  backend::RunArgs args;
  for (auto& leaf : c.leaves) args.inputs.push_back(detail::leaf_pointer(*leaf));
  std::vector<StoragePtr> mine, ref;
  for (auto out : c.graph.outputs) {
    const std::size_t bytes = static_cast<std::size_t>(c.graph.nodes[out].shape.numel()) * 4;
    mine.push_back(runtime::allocate_cuda(bytes, 0));
    ref.push_back(runtime::allocate_cuda(bytes, 0));
  }
  backend::RunArgs ours = args, theirs = args;
  for (std::size_t o = 0; o < mine.size(); ++o) {
    ours.outputs.push_back(mine[o]->data);
    theirs.outputs.push_back(ref[o]->data);
  }
  backend::run_cuda(c.graph, theirs);
  GraphRunner fn = backend::CudaGraphRunFn{runner};
  fn(c.graph, ours);
  fn(c.graph, ours);
  for (std::size_t o = 0; o < mine.size(); ++o) {
    const std::size_t n = static_cast<std::size_t>(c.graph.nodes[c.graph.outputs[o]].shape.numel());
    std::vector<float> x(n), y(n);
    runtime::copy_device_to_host(x.data(), mine[o]->data, n * 4, 0);
    runtime::copy_device_to_host(y.data(), ref[o]->data, n * 4, 0);
    for (std::size_t i = 0; i < n; ++i) CHECK(std::fabs(x[i] - y[i]) <= 1e-6f * (1.0f + std::fabs(y[i])));
  }
  backend::CudaGraphStats st = runner->stats();
  CHECK(st.captures == 1);
  CHECK(st.replays == 2);
  CHECK(st.input_copies == 0);
  CHECK(st.instances == 1);
  // Too few input pointers: the error run_cuda gives.
  backend::RunArgs few;
  few.outputs = ours.outputs;
  CHECK_THROWS_AS(fn(c.graph, few), Error);
}

TEST_CASE("cuda: PreparedGraph binds a plan per alignment class (more classes than slots too) == run_cuda") {
  if (!have_gpu()) return;
  const std::int64_t n = 1001;
  Tensor a = randn({n}, 81, f32, kGpu), b = randn({n}, 82, f32, kGpu);
  a.eval();
  b.eval();
  Tensor lazy = Tensor(a * b + 2.0f);
  ir::Captured c = ir::capture({lazy.node()}, kGpu);
  REQUIRE(c.leaves.size() == 2);
  backend::PreparedGraph prepared(c.graph, backend::Mode::Auto);
  const std::size_t bytes = static_cast<std::size_t>(n) * 4;
  // Every buffer may start 16-byte aligned or one float past it: 2^3 classes, 4 slots.
  StoragePtr in0 = runtime::allocate_cuda(bytes + 16, 0), in1 = runtime::allocate_cuda(bytes + 16, 0);
  StoragePtr out = runtime::allocate_cuda(bytes + 16, 0), ref = runtime::allocate_cuda(bytes, 0);
  for (int round = 0; round < 2; ++round) {
    for (int cls = 0; cls < 8; ++cls) {
      CAPTURE(round);
      CAPTURE(cls);
      char* p0 = static_cast<char*>(in0->data) + ((cls & 1) ? 4 : 0);
      char* p1 = static_cast<char*>(in1->data) + ((cls & 2) ? 4 : 0);
      char* po = static_cast<char*>(out->data) + ((cls & 4) ? 4 : 0);
      runtime::copy_device_to_device(p0, detail::leaf_pointer(*c.leaves[0]), bytes, 0);
      runtime::copy_device_to_device(p1, detail::leaf_pointer(*c.leaves[1]), bytes, 0);
      backend::RunArgs args;
      args.inputs = {p0, p1};
      args.outputs = {po};
      prepared.run(args);
      backend::RunArgs plain;
      plain.inputs = {detail::leaf_pointer(*c.leaves[0]), detail::leaf_pointer(*c.leaves[1])};
      plain.outputs = {ref->data};
      backend::run_cuda(c.graph, plain);
      std::vector<float> got(static_cast<std::size_t>(n)), want(static_cast<std::size_t>(n));
      runtime::copy_device_to_host(got.data(), po, bytes, 0);
      runtime::copy_device_to_host(want.data(), ref->data, bytes, 0);
      for (std::size_t i = 0; i < got.size(); ++i)
        CHECK(std::fabs(got[i] - want[i]) <= 1e-6f * (1.0f + std::fabs(want[i])));
    }
  }
  // Too few pointers: the error run_cuda gives.
  backend::RunArgs few;
  few.outputs = {out->data};
  CHECK_THROWS_AS(prepared.run(few), Error);
}

TEST_CASE("cuda graph: products are captured with their kernels (cuBLASLt calls in the graph)") {
  if (!have_gpu() || !have_graphs() || !runtime::cublaslt_available()) return;
  // An MLP block with a softmax between products: calls, epilogues, a row kernel, temporaries.
  auto block = [](const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2) {
    Tensor h = gelu(linear(x, w1, b1), true);
    return Tensor(softmax(matmul(h, w2) * 0.5f, -1) + sum(x, -1, true));
  };
  Tensor x = randn({64, 32}, 41, f32, kGpu), w1 = randn({48, 32}, 42, f32, kGpu), b1 = randn({48}, 43, f32, kGpu),
         w2 = randn({48, 16}, 44, f32, kGpu);
  for (Tensor* t : {&x, &w1, &b1, &w2}) t->eval();
  auto plain = kiln::compile(block);
  auto graphed = kiln::compile(block, reduce_overhead());
  CompileOptions tuned_options;
  tuned_options.mode = "max-autotune";
  auto tuned = kiln::compile(block, tuned_options);
  Tensor want = plain(x, w1, b1, w2);
  reset_stats();
  for (int i = 0; i < 4; ++i) plain(x, w1, b1, w2);
  const std::uint64_t plain_launches = stats().launches;
  for (auto* f : {&graphed, &tuned}) {
    const std::uint64_t c0 = captures(), r0 = replays();
    CHECK(max_rel_diff((*f)(x, w1, b1, w2), want) <= 1e-5);  // a plain run, the capture, a replay
    reset_stats();
    for (int i = 0; i < 4; ++i) (*f)(x, w1, b1, w2);  // as the plain calls were counted (no comparison kernels)
    CHECK(captures() - c0 == 1);
    CHECK(replays() - r0 == 5);
    CHECK(stats().library_calls == 8);  // two per replay
    // The same kernels as the default mode's steps (max-autotune may have chosen the epilogue
    // as a kernel after the plain call instead).
    if (f == &graphed) CHECK(stats().launches == plain_launches);
    CHECK(max_rel_diff((*f)(x, w1, b1, w2), want) <= 1e-5);
  }
  // Inputs that move are copied into the instance's static buffers, as for kernels.
  Tensor x2 = randn({64, 32}, 45, f32, kGpu);
  x2.eval();
  CHECK(max_rel_diff(graphed(x2, w1, b1, w2), plain(x2, w1, b1, w2)) <= 1e-5);
}

}  // namespace kiln_test_backend_cuda_graph
