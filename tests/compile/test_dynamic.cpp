// kiln::compile's `dynamic`: one trace for every size (symbolic sizes), and one kernel compile
// for every batch size (sizes read at launch), on the CPU and on CUDA (KILN_DEVICE=cuda puts the
// tensors on the GPU; the CUDA cases at the end run wherever a GPU is usable).
#include <doctest/doctest.h>

#include <cstdio>
#include <string>
#include <vector>

#include <kiln/kiln.hpp>
#include <kiln/codegen/cpp.hpp>
#include <kiln/sched/schedule.hpp>

#include "../support/compile_util.hpp"
#include "../support/device.hpp"
#include "../support/gpu_util.hpp"

namespace kiln_test_compile_dynamic {

using namespace kiln;
using kiln::testing::check_equal;
using kiln::testing::LogCapture;

namespace {

Tensor rows(std::int64_t n, std::int64_t m, float scale = 1.0f, Device device = testing::device()) {
  std::vector<float> v(static_cast<std::size_t>(n * m));
  for (std::int64_t i = 0; i < n * m; ++i)
    v[static_cast<std::size_t>(i)] = scale * (static_cast<float>((i * 7) % 13) - 6.0f) / 4.0f;
  return from_vector(v, {n, m}).to(device).eval();
}

/// Evaluates `make()` with the reference executor: the expected values, without compiling any
/// kernel (the counts below are the compiled function's own).
template <class F>
auto uncompiled(F make) {
  Backend previous = get_backend();
  set_backend(Backend::Eager);
  auto r = make();
  set_backend(previous);
  return r;
}

// Kernels built or loaded (a kernel found on disk counts: the test cache may hold it already).
std::uint64_t kernels_built() { return kiln::stats().compiles + kiln::stats().disk_hits; }

Tensor pointwise_fn(const Tensor& x, const Tensor& w) { return relu(x * w + 1.0f) * 0.5f - x; }
Tensor softmax_fn(const Tensor& x, const Tensor& w) { return softmax(x * w, -1); }
Tensor sum_fn(const Tensor& x, const Tensor& w) { return sum(x * w, {-1}); }

using RowFn = Tensor (*)(const Tensor&, const Tensor&);

struct Counts {
  std::uint64_t traces, recompiles, built;
};

Counts run_loop(RowFn fn, std::optional<bool> dynamic) {
  kiln::reset();
  CompileOptions opt;
  opt.dynamic = dynamic;
  auto f = kiln::compile(fn, opt);
  Tensor w = reshape(rows(1, 64, 0.5f), {64}).eval();
  // Only the compiled function's calls are counted (making the inputs may run kernels too).
  std::uint64_t built = 0;
  auto call = [&](const Tensor& x) {
    const std::uint64_t before = kernels_built();
    Tensor y = f(x, w);
    built += kernels_built() - before;
    check_equal(y, uncompiled([&] {
                  Tensor t = fn(x, w);
                  t.eval();
                  return t;
                }));
  };
  for (std::int64_t n : {3, 5, 7, 9}) call(rows(n, 64, 1.0f + static_cast<float>(n) / 8.0f));
  const std::uint64_t first = built;
  // Every size again: served by the same entries, nothing more built.
  for (std::int64_t n : {9, 3, 7, 5}) call(rows(n, 64, 2.0f));
  CHECK(built == first);
  auto st = f.stats();
  return {st.traces, st.recompiles, first};
}

}  // namespace

TEST_CASE("dynamic: a loop over batch sizes traces and compiles as torch.compile's dynamic says") {
  for (RowFn fn : {&pointwise_fn, &softmax_fn, &sum_fn}) {
    CAPTURE(fn == &pointwise_fn ? "pointwise" : fn == &softmax_fn ? "softmax" : "sum");
    SUBCASE("dynamic=false: one trace and one compile per size") {
      Counts c = run_loop(fn, false);
      CHECK(c.traces == 4);
      CHECK(c.recompiles == 3);
      CHECK(c.built >= 4);
    }
    SUBCASE("dynamic=true: one trace, no recompile, one kernel compile for every size") {
      Counts c = run_loop(fn, true);
      CHECK(c.traces == 1);
      CHECK(c.recompiles == 0);
      CHECK(c.built == 1);
    }
    SUBCASE("automatic: static first, then one symbolic recompile") {
      Counts c = run_loop(fn, std::nullopt);
      CHECK(c.traces == 2);
      CHECK(c.recompiles == 1);
      CHECK(c.built == 2);
    }
  }
}

TEST_CASE("dynamic: sizes 0, 1 and 2+ are distinct guards; each gives the uncompiled result") {
  CompileOptions opt;
  opt.dynamic = true;
  auto f = kiln::compile(&softmax_fn, opt);
  Tensor w = reshape(rows(1, 64, 0.5f), {64}).eval();
  for (std::int64_t n : {4, 1, 0, 2, 1, 0, 6}) {
    Tensor x = rows(n, 64);
    check_equal(f(x, w), softmax_fn(x, w));
  }
  CHECK(f.stats().traces == 3);  // 2+, 1, 0
  CHECK(f.stats().recompiles == 2);
}

TEST_CASE("dynamic: reshapes, reductions over the batch and several outputs follow the sizes without a trace") {
  CompileOptions opt;
  opt.dynamic = true;
  auto fn = [](const Tensor& x, const Tensor& b) {
    Tensor y = reshape(x, {x.shape()[0], 8, 8}) + reshape(b, {1, 8, 8});  // split the row
    Tensor flat = reshape(y, {-1});                                       // batch * 64
    return std::make_tuple(sum(y, {1}), flat * 2.0f, sum(x, {0}), layer_norm(x));
  };
  auto f = kiln::compile(fn, opt);
  Tensor b = reshape(rows(1, 64, 0.25f), {64}).eval();
  for (std::int64_t n : {2, 3, 5, 3}) {
    Tensor x = rows(n, 64, static_cast<float>(n));
    auto got = f(x, b);
    auto want = fn(x, b);
    check_equal(std::get<0>(got), std::get<0>(want));
    check_equal(std::get<1>(got), std::get<1>(want));
    check_equal(std::get<2>(got), std::get<2>(want));
    check_equal(std::get<3>(got), std::get<3>(want));
  }
  CHECK(f.stats().traces == 1);
  CHECK(f.stats().recompiles == 0);
}

TEST_CASE("dynamic: two arguments whose sizes were equal when traced and now differ re-trace") {
  CompileOptions opt;
  opt.dynamic = true;
  auto fn = [](const Tensor& x, const Tensor& y) { return x * 2.0f + sum(y, {1}, true); };
  auto f = kiln::compile(fn, opt);
  check_equal(f(rows(4, 8), rows(4, 3)), fn(rows(4, 8), rows(4, 3)));
  check_equal(f(rows(6, 8), rows(6, 5)), fn(rows(6, 8), rows(6, 5)));
  CHECK(f.stats().traces == 1);
  // x's and y's batches were one size: a call where they differ is an error of the function,
  // raised by tracing it again (as the uncompiled function raises it).
  CHECK_THROWS_AS(f(rows(6, 8), rows(5, 5)), ShapeError);
  CHECK(f.stats().traces == 2);
}

TEST_CASE("dynamic: a size baked by the function re-traces for new sizes, and the log says why") {
  LogCapture logs("recompiles");
  CompileOptions opt;
  opt.dynamic = true;
  // The slice keeps 2 rows whatever the batch: the trace baked it, the graph cannot follow.
  auto fn = [](const Tensor& x) { return slice(x, 0, 0, 2) * 3.0f; };
  auto f = kiln::compile(fn, opt);
  for (std::int64_t n : {4, 6, 8}) check_equal(f(rows(n, 16)), fn(rows(n, 16)));
  CHECK(f.stats().traces == 3);
  CHECK(f.stats().recompiles == 0);
  CHECK(logs.text().find("dynamic entry: re-tracing: dim 0 of a tensor argument changed") != std::string::npos);
}

TEST_CASE("dynamic: recompiles and guards logs name the symbolic dims") {
  LogCapture logs("recompiles,guards");
  auto f = kiln::compile(&sum_fn);  // automatic
  Tensor w = reshape(rows(1, 64), {64}).eval();
  f(rows(3, 64), w);
  f(rows(5, 64), w);
  f(rows(7, 64), w);
  std::string text = logs.text();
  CHECK(text.find("now symbolic: arg 0 dim 0") != std::string::npos);
  CHECK(text.find("symbolic: arg 0 dim 0 (sizes 0 and 1 stay distinct)") != std::string::npos);
  CHECK(text.find("dynamic entry replays its graph for new sizes (no trace): arg 0 [7, 64]") != std::string::npos);
}

TEST_CASE("dynamic: one symbolic kernel serves small (one thread) and large (a team) batches") {
  kiln::reset();
  CompileOptions opt;
  opt.dynamic = true;
  auto fn = [](const Tensor& x, float a) { return softmax(x * a, -1) + sum(x, {-1}, true); };
  auto f = kiln::compile(fn, opt);
  std::uint64_t built = 0;
  // 2 x 64 runs on one thread; 1500 x 64 elements pass the parallel threshold at launch.
  for (std::int64_t n : {2, 1500, 37, 1500, 2}) {
    Tensor x = rows(n, 64, 0.75f);
    const std::uint64_t before = kernels_built();
    Tensor y = f(x, 1.5f);
    built += kernels_built() - before;
    check_equal(y, uncompiled([&] {
                  Tensor t = fn(x, 1.5f);
                  t.eval();
                  return t;
                }));
  }
  CHECK(f.stats().traces == 1);
  CHECK(built == 1);
}

TEST_CASE("dynamic: kernels that cannot read the size at launch are compiled per size, still without a trace") {
  LogCapture logs("recompiles");
  kiln::reset();
  CompileOptions opt;
  opt.dynamic = true;
  auto fn = [](const Tensor& x) { return sum(x * 2.0f, {0}); };  // reduces over the batch
  auto f = kiln::compile(fn, opt);
  std::uint64_t built = 0;
  for (std::int64_t n : {3, 5, 3}) {
    Tensor x = rows(n, 16);
    const std::uint64_t before = kernels_built();
    Tensor y = f(x);
    built += kernels_built() - before;
    check_equal(y, uncompiled([&] {
                  Tensor t = fn(x);
                  t.eval();
                  return t;
                }));
  }
  CHECK(f.stats().traces == 1);
  if (testing::on_cpu())
    CHECK(built == 2);
  else
    CHECK(built >= 2);
  CHECK(logs.text().find("dynamic entry: kernels compiled for these sizes (symbolic arg 0 dim 0 not read at launch)") !=
        std::string::npos);
}

TEST_CASE("dynamic: a function returning C++ numbers re-traces for new sizes") {
  CompileOptions opt;
  opt.dynamic = true;
  auto fn = [](const Tensor& x) { return std::make_tuple(x + 1.0f, x.shape()[0]); };
  auto f = kiln::compile(fn, opt);
  for (std::int64_t n : {3, 4, 5}) {
    auto [y, count] = f(rows(n, 4));
    CHECK(count == n);
    check_equal(y, rows(n, 4) + 1.0f);
  }
  CHECK(f.stats().traces == 3);
}

TEST_CASE("dynamic: symbolic CPU code reads the size from its arguments and bakes no placeholder") {
  // x[N, 64] * w[64] -> softmax over rows, at the placeholder size.
  const std::int64_t p = backend::kSymbolicPlaceholder;
  ir::Graph g;
  ir::GraphNode x;
  x.op = ir::Op::Input;
  x.dtype = DType::Float32;
  x.shape = Shape{p, 64};
  x.strides = Strides{64, 1};
  x.leaf = 0;
  g.nodes.push_back(x);
  ir::GraphNode e;
  e.op = ir::Op::Exp;
  e.dtype = DType::Float32;
  e.shape = Shape{p, 64};
  e.inputs = {0};
  g.nodes.push_back(e);
  ir::GraphNode r;
  r.op = ir::Op::ReduceSum;
  r.dtype = DType::Float32;
  r.shape = Shape{p, 1};
  r.attrs.ints = {1};
  r.inputs = {1};
  g.nodes.push_back(r);
  g.outputs = {1, 2};
  g.output_strides = {Strides{64, 1}, Strides{1, 1}};
  g.rehash();
  sched::Schedule s = sched::schedule(g, p);
  for (std::size_t k = 0; k < s.kernels.size(); ++k) CHECK(sched::symbolic_kernel(s, k));
  std::string src = codegen::generate_cpp(g, s, "k").source;
  CHECK(src.find("kiln_s0") != std::string::npos);
  CHECK(src.find(std::to_string(p)) == std::string::npos);
  CHECK(src.find("if(") != std::string::npos);
  // A reduction over the symbolic dim cannot read it at launch.
  g.nodes[2].shape = Shape{1, 64};
  g.nodes[2].attrs.ints = {0};
  g.output_strides[1] = Strides{64, 1};
  g.rehash();
  sched::Schedule s2 = sched::schedule(g, p);
  bool all = true;
  std::string why;
  for (std::size_t k = 0; k < s2.kernels.size(); ++k) all = all && sched::symbolic_kernel(s2, k, &why);
  CHECK_FALSE(all);
  CHECK(why.find("reduces over the symbolic size") != std::string::npos);
  CHECK_THROWS_AS(codegen::generate_cpp(g, s2, "k"), Error);
}

// ---- CUDA: kernels that read the batch size at launch (backend/cuda_symbolic.hpp) ----------

namespace {

/// A GPU kiln can compile for and run on (the CUDA cases need one; elsewhere they only build).
bool have_gpu() { return kiln::testing::have_gpu("the CUDA cases of dynamic shapes"); }

// Row sums into a temporary of n rows, read by a second kernel over [n, 4, 64].
Tensor temp_fn(const Tensor& x, const Tensor& y) { return reshape(sum(x, {-1}), {x.shape()[0], 1, 1}) + y; }

}  // namespace

TEST_CASE("dynamic: on CUDA one symbolic unit (one NVRTC compile) serves every batch size") {
  if (!have_gpu()) return;
  const Device gpu = Device::cuda(0);
  for (RowFn fn : {&pointwise_fn, &softmax_fn, &sum_fn}) {
    CAPTURE(fn == &pointwise_fn ? "pointwise" : fn == &softmax_fn ? "softmax" : "sum");
    kiln::reset();
    LogCapture logs("recompiles");
    CompileOptions opt;
    opt.dynamic = true;
    auto f = kiln::compile(fn, opt);
    Tensor w = reshape(rows(1, 64, 0.5f, gpu), {64}).eval();
    std::uint64_t built = 0, compiles = 0;
    for (std::int64_t n : {3, 5, 7, 9, 9, 3}) {
      Tensor x = rows(n, 64, 1.0f + static_cast<float>(n) / 8.0f, gpu);
      const Stats before = kiln::stats();
      Tensor y = f(x, w);
      built += kernels_built() - (before.compiles + before.disk_hits);
      compiles += kiln::stats().compiles - before.compiles;
      check_equal(y, uncompiled([&] {
                    Tensor t = fn(x, w);
                    t.eval();
                    return t;
                  }));
    }
    CHECK(f.stats().traces == 1);
    CHECK(f.stats().recompiles == 0);
    // One unit for every size: compiled by NVRTC, or found in the disk cache by an earlier run.
    CHECK(built == 1);
    CHECK(compiles <= 1);
    CHECK(logs.text().find("not read at launch") == std::string::npos);
  }
}

TEST_CASE("dynamic: on CUDA a symbolic temporary, an unaligned input and reduce-overhead") {
  if (!have_gpu()) return;
  const Device gpu = Device::cuda(0);
  CompileOptions opt;
  opt.dynamic = true;
  SUBCASE("a temporary of n rows between two kernels, sized per call") {
    kiln::reset();
    auto f = kiln::compile(&temp_fn, opt);
    std::uint64_t built = 0;
    for (std::int64_t n : {3, 33, 5}) {
      Tensor x = rows(n, 64, 1.0f, gpu), y = reshape(rows(n, 256, 0.5f, gpu), {n, 4, 64}).eval();
      const std::uint64_t before = kernels_built();
      Tensor z = f(x, y);
      built += kernels_built() - before;
      check_equal(z, uncompiled([&] {
                    Tensor t = temp_fn(x, y);
                    t.eval();
                    return t;
                  }));
    }
    CHECK(f.stats().traces == 1);
    CHECK(built == 1);
  }
  SUBCASE("an input 4 bytes off 16-byte alignment takes the unit of its alignment class") {
    kiln::reset();
    auto f = kiln::compile(&pointwise_fn, opt);
    Tensor w = reshape(rows(1, 64, 0.5f, gpu), {64}).eval();
    std::uint64_t built = 0;
    for (std::int64_t n : {3, 5, 7}) {
      Tensor big = rows(n * 64 + 1, 1, 1.0f, gpu);
      Tensor x = from_blob(big.data_ptr<float>() + 1, {n, 64}, gpu);
      const std::uint64_t before = kernels_built();
      Tensor y = f(x, w);
      built += kernels_built() - before;
      check_equal(y, uncompiled([&] {
                    Tensor t = pointwise_fn(x, w);
                    t.eval();
                    return t;
                  }));
    }
    CHECK(f.stats().traces == 1);
    CHECK(built == 2);  // the aligned unit (made with the runner) and the unaligned one (first run)
  }
  SUBCASE("reduce-overhead keeps a CUDA graph per size, and says so") {
    kiln::reset();
    LogCapture logs("recompiles");
    opt.mode = "reduce-overhead";
    auto f = kiln::compile(&softmax_fn, opt);
    Tensor w = reshape(rows(1, 64, 0.5f, gpu), {64}).eval();
    for (std::int64_t n : {3, 5}) {
      Tensor x = rows(n, 64, 1.0f, gpu);
      check_equal(f(x, w), uncompiled([&] {
                    Tensor t = softmax_fn(x, w);
                    t.eval();
                    return t;
                  }));
    }
    CHECK(f.stats().traces == 1);
    CHECK(logs.text().find("not read at launch): mode reduce-overhead captures a CUDA graph per size") !=
          std::string::npos);
  }
}

}  // namespace kiln_test_compile_dynamic
