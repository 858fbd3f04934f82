// kiln::compile: capture, guards, recompiles, dynamic, limits, graph breaks, backends, logs.
#include <doctest/doctest.h>

#include <cstdio>
#include <string>
#include <vector>

#include <kiln/kiln.hpp>
#include <kiln/backend/reference.hpp>

#include "../support/compile_util.hpp"

namespace kiln_test_compile_compile {

using namespace kiln;
using kiln::testing::check_equal;
using kiln::testing::LogCapture;

namespace {

Tensor seq(std::int64_t n, float scale = 1.0f, DType dt = f32) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[i] = scale * (static_cast<float>(i % 7) - 3.0f);
  return from_vector(v, {n}).to(dt).eval();
}

}  // namespace

TEST_CASE("compile: first call traces, later calls replay and equal the uncompiled function") {
  auto fn = [](const Tensor& x, const Tensor& w) { return relu(x * w + 1.0f); };
  for (const char* backend : {"kiln", "eager", "trace"}) {
    for (const char* mode : {"default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"}) {
      CAPTURE(backend);
      CAPTURE(mode);
      CompileOptions opt;
      opt.backend = backend;
      opt.mode = mode;
      auto step = kiln::compile(fn, opt);
      Tensor x = seq(32), w = seq(32, 0.5f);
      Tensor expected = fn(x, w);
      check_equal(step(x, w), expected);
      Tensor x2 = seq(32, 2.0f);
      check_equal(step(x2, w), fn(x2, w));  // new data, same guard: replayed with the new buffers
      auto st = step.stats();
      if (std::string(backend) == "eager") {
        CHECK(st.traces == 0);
      } else {
        CHECK(st.traces == 1);
        CHECK(st.cache_hits == 1);
        CHECK(st.recompiles == 0);
      }
    }
  }
}

TEST_CASE(
    "compile: tuples, numbers, views of arguments and captured constants come back as the function returns them") {
  Tensor bias = seq(8, 0.25f);
  auto fn = [bias](const Tensor& x, float a) {
    return std::make_tuple(x * a + bias, sum(x), transpose(reshape(x, {2, 4}), 0, 1), 42, bias);
  };
  auto f = kiln::compile(fn);
  for (int call = 0; call < 2; ++call) {
    Tensor x = seq(8, 1.0f + call);
    auto [y, s, t, n, b] = f(x, 3.0f);
    auto [ey, es, et, en, eb] = fn(x, 3.0f);
    check_equal(y, ey);
    check_equal(s, es);
    check_equal(t, et);
    CHECK(n == en);
    check_equal(b, eb);
    // A view of an argument stays a view of that argument's memory.
    CHECK(t.data_ptr<float>() == x.data_ptr<float>());
  }
  CHECK(f.stats().traces == 1);
}

TEST_CASE("compile: a std::vector<Tensor> result (what autograd::grad returns) traces once and replays") {
  // A training step's gradients as a list, the forward's outputs as a list.
  auto gradients = [](const Tensor& x, const Tensor& w, const Tensor& b) {
    Tensor loss = sum(relu(matmul(x, w) + b) * seq(5, 0.5f));
    return autograd::grad({loss}, {w, b});
  };
  auto outputs = [](const Tensor& x) { return std::vector<Tensor>{x * 2.0f, sum(x), exp(x)}; };
  auto compiled_gradients = kiln::compile(gradients);
  auto compiled_outputs = kiln::compile(outputs);
  Tensor w = reshape(seq(15, 0.25f), {3, 5}).requires_grad_(), b = seq(5, 0.5f).requires_grad_();
  for (float scale : {1.0f, -2.0f}) {
    CAPTURE(scale);
    Tensor x = reshape(seq(12, scale), {4, 3});
    std::vector<Tensor> got = compiled_gradients(x, w, b), want = gradients(x, w, b);
    REQUIRE(got.size() == 2);
    for (std::size_t i = 0; i < 2; ++i) check_equal(got[i], want[i]);
    std::vector<Tensor> outs = compiled_outputs(x), plain = outputs(x);
    REQUIRE(outs.size() == 3);
    for (std::size_t i = 0; i < 3; ++i) check_equal(outs[i], plain[i]);
  }
  CHECK(compiled_gradients.stats().traces == 1);
  CHECK(compiled_gradients.stats().cache_hits == 1);
  CHECK(compiled_outputs.stats().traces == 1);
  CHECK(compiled_outputs.stats().cache_hits == 1);
  CHECK_FALSE(w.grad().defined());  // autograd::grad leaves .grad() alone, compiled or not
}

TEST_CASE("compile: the replay keeps none of the traced tensors alive") {
  // The traced result's lazy graph reads the captured weight. Kept by the replay, it stayed
  // alive after the caller dropped the result, and the next write into the weight (an
  // optimizer step) evaluated it first, as a write does for live lazy readers, and kept the
  // values: a model's whole traced forward, once, held for the process.
  Tensor w = seq(32, 0.5f).eval();
  auto step = kiln::compile([&w](const Tensor& x) { return relu(x * w + 1.0f); });
  { Tensor y = step(seq(32).eval()); }  // traced; the result dropped unread
  reset_stats();
  w.add_(1.0f);
  CHECK(stats().graphs == 1);  // the write alone
  Tensor x = seq(32, 2.0f);
  check_equal(step(x), relu(x * w + 1.0f));  // replayed with the new weight
}

TEST_CASE("compile: guards on shape, dtype, strides and numbers recompile; matching calls hit") {
  CompileOptions opt;
  opt.dynamic = false;
  auto f = kiln::compile([](const Tensor& x, double a) { return x * a; }, opt);
  Tensor x = seq(16);
  f(x, 2.0);
  f(x, 2.0);
  CHECK(f.stats().cache_hits == 1);
  f(x, 3.0);  // numbers are specialised
  CHECK(f.stats().recompiles == 1);
  f(seq(16, 1.0f, f64), 2.0);  // dtype
  CHECK(f.stats().recompiles == 2);
  Tensor m = reshape(seq(16), {4, 4}).eval();
  f(m, 2.0);
  f(transpose(m, 0, 1), 2.0);  // strides
  CHECK(f.stats().recompiles == 4);
  check_equal(f(transpose(m, 0, 1), 2.0), transpose(m, 0, 1) * 2.0);
  CHECK(f.stats().recompiles == 4);
}

TEST_CASE("compile: dynamic=false/true/automatic over a loop of batch sizes") {
  auto fn = [](const Tensor& x) { return exp(x) * 0.5f; };
  std::vector<std::int64_t> sizes = {8, 12, 16, 20, 24};
  SUBCASE("static: one recompile per new size") {
    CompileOptions opt;
    opt.dynamic = false;
    auto f = kiln::compile(fn, opt);
    for (auto n : sizes) check_equal(f(seq(n)), fn(seq(n)));
    CHECK(f.stats().recompiles == sizes.size() - 1);
  }
  SUBCASE("dynamic: one guard entry for every size") {
    CompileOptions opt;
    opt.dynamic = true;
    auto f = kiln::compile(fn, opt);
    for (auto n : sizes) check_equal(f(seq(n)), fn(seq(n)));
    CHECK(f.stats().recompiles == 0);
    for (auto n : sizes) check_equal(f(seq(n)), fn(seq(n)));
    CHECK(f.stats().recompiles == 0);
  }
  SUBCASE("automatic: static first, then the changed size becomes dynamic") {
    auto f = kiln::compile(fn);
    for (auto n : sizes) check_equal(f(seq(n)), fn(seq(n)));
    CHECK(f.stats().recompiles == 1);
  }
  SUBCASE("dynamic still guards rank, dtype and 0/1 sizes") {
    CompileOptions opt;
    opt.dynamic = true;
    auto f = kiln::compile(fn, opt);
    f(seq(8));
    f(seq(1));
    CHECK(f.stats().recompiles == 1);
    f(seq(8, 1.0f, f64));
    CHECK(f.stats().recompiles == 2);
  }
}

TEST_CASE("compile: past the recompile limit calls run uncompiled, or throw when asked") {
  auto fn = [](const Tensor& x, int k) { return x + static_cast<float>(k); };
  CompileOptions opt;
  opt.recompile_limit = 3;
  auto f = kiln::compile(fn, opt);
  for (int k = 0; k < 6; ++k) check_equal(f(seq(4), k), fn(seq(4), k));
  CHECK(f.stats().traces == 3);
  CHECK(f.stats().fallbacks == 3);

  opt.error_on_recompile_limit = true;
  auto g = kiln::compile(fn, opt);
  for (int k = 0; k < 3; ++k) g(seq(4), k);
  try {
    g(seq(4), 99);
    FAIL("expected an error past the recompile limit");
  } catch (const Error& e) {
    std::string msg = e.what();
    CHECK(msg.find("recompile limit") != std::string::npos);
    CHECK(msg.find("argument 1") != std::string::npos);
  }
}

TEST_CASE("compile: reading data is a graph break; fullgraph turns it into an error naming the place") {
  auto fn = [](const Tensor& x) {
    Tensor s = sum(x * x);
    float total = s.item<float>();  // graph break
    return x / (total > 100.0f ? total : 1.0f);
  };
  auto f = kiln::compile(fn);
  Tensor small = seq(4), big = seq(64, 3.0f);
  check_equal(f(small), fn(small));
  check_equal(f(big), fn(big));  // control flow re-runs with the new value
  CHECK(f.stats().graph_breaks >= 1);

  CompileOptions opt;
  opt.fullgraph = true;
  auto g = kiln::compile(fn, opt);
  try {
    g(small);
    FAIL("expected GraphBreakError");
  } catch (const GraphBreakError& e) {
    std::string msg = e.what();
    CHECK(msg.find("item()") != std::string::npos);
    CHECK(msg.find("test_compile.cpp") != std::string::npos);
  }
  // Tracing state is restored after the error: ordinary lazy evaluation works.
  Tensor t = seq(4) + 1.0f;
  CHECK(t.to_vector<float>()[0] == -2.0f);
}

TEST_CASE("compile: a registered backend receives the captured graph") {
  int graphs = 0;
  std::size_t ops = 0;
  register_backend("counting", [&](const ir::Graph& g, const CompileOptions&) -> GraphRunner {
    ++graphs;
    for (auto& n : g.nodes) ops += n.op != ir::Op::Input;
    return [](const ir::Graph& graph, const backend::RunArgs& args) { backend::run_reference(graph, args); };
  });
  auto names = list_backends();
  CHECK(std::find(names.begin(), names.end(), "counting") != names.end());
  CompileOptions opt;
  opt.backend = "counting";
  auto f = kiln::compile([](const Tensor& x) { return sigmoid(x) * 2.0f; }, opt);
  Tensor x = seq(8);
  check_equal(f(x), sigmoid(x) * 2.0f);
  f(x);
  CHECK(graphs == 1);
  CHECK(ops >= 5);  // neg, exp, add, div, mul and their constants
}

TEST_CASE("compile: unknown backend or mode names list the valid ones") {
  CompileOptions opt;
  opt.backend = "inductor";
  try {
    kiln::compile([](const Tensor& x) { return x; }, opt);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("kiln, trace") != std::string::npos);
  }
  opt.backend = "kiln";
  opt.mode = "fast";
  CHECK_THROWS_WITH_AS(kiln::compile([](const Tensor& x) { return x; }, opt), doctest::Contains("reduce-overhead"),
                       Error);
}

TEST_CASE("compile: logs name recompiles, guards, graph breaks and new graphs") {
  LogCapture logs("recompiles,guards,graph_breaks,graph");
  auto f = kiln::compile([](const Tensor& x) { return x * 2.0f; });
  f(seq(4));
  f(seq(6));
  auto g = kiln::compile([](const Tensor& x) { return x / sum(x).item<float>(); });
  g(seq(4, 1.0f) + 10.0f);
  std::string text = logs.text();
  CHECK(text.find("[kiln:recompiles] recompiling: guard on argument 0 failed: expected float32[4]") !=
        std::string::npos);
  CHECK(text.find("got float32[6]") != std::string::npos);
  CHECK(text.find("[kiln:guards] new guard entry") != std::string::npos);
  CHECK(text.find("[kiln:graph_breaks] graph break: item()") != std::string::npos);
  CHECK(text.find("[kiln:graph] compiling new graph") != std::string::npos);
}

TEST_CASE("compile: explain reports graphs and breaks; reset clears every entry") {
  auto f = kiln::compile([](const Tensor& x) { return softmax(x * 2.0f, -1); });
  Tensor x = reshape(seq(16), {4, 4}).eval();
  std::string report = kiln::explain(f, x);
  CHECK(report.find("graph breaks: 0") != std::string::npos);
  CHECK(report.find("sum") != std::string::npos);
  // A temporary compiled function can be explained too.
  std::string temporary = kiln::explain(kiln::compile([](const Tensor& v) { return relu(v - 1.0f); }), x);
  CHECK(temporary.find("graph breaks: 0") != std::string::npos);
  f(x);
  f(x);
  CHECK(f.stats().traces == 1);
  kiln::reset();
  f(x);
  CHECK(f.stats().traces == 2);
}

}  // namespace kiln_test_compile_compile
