// dispatch.hpp: the op-by-op executor of generated-kernel devices, checked on the CPU JIT
// against the reference executor; PreparedGraph against run().
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include <kiln/kiln.hpp>
#include <kiln/backend/dispatch.hpp>

namespace kiln_test_backend_dispatch {

using namespace kiln;

TEST_CASE("run_op_by_op: one kernel per primitive, same values as the reference executor") {
  Tensor x = randn({8, 16}, 3).eval();
  Tensor y = softmax(x * 2.0f + 1.0f, -1) + transpose(reshape(x, {16, 8}), 0, 1);
  Tensor z = sum(x, {0});
  ir::Captured c = ir::capture({y.node(), z.node(), x.node()}, Device::cpu());
  backend::RunArgs args;
  for (auto& leaf : c.leaves) args.inputs.push_back(detail::leaf_pointer(*leaf));
  std::vector<float> ref_y(128), ref_z(16), ref_x(128), y2(128), z2(16), x2(128);
  args.outputs = {ref_y.data(), ref_z.data(), ref_x.data()};
  backend::run_reference(c.graph, args);
  args.outputs = {y2.data(), z2.data(), x2.data()};
  std::size_t primitives = 0;
  for (auto& n : c.graph.nodes) primitives += n.op != ir::Op::Input;
  reset_stats();
  backend::run_op_by_op(c.graph, args, [](const ir::Graph& g, const backend::RunArgs& a) {
    CHECK(g.nodes.size() <= 4);  // one primitive and its leaves
    backend::run_cpu_jit(g, a);
  });
  CHECK(stats().launches == primitives + 1);  // + the copy of the output that is a leaf (x)
  for (int i = 0; i < 128; ++i) CHECK(y2[i] == doctest::Approx(ref_y[i]).epsilon(1e-6));
  for (int i = 0; i < 16; ++i) CHECK(z2[i] == doctest::Approx(ref_z[i]).epsilon(1e-6));
  CHECK(x2 == ref_x);
}

TEST_CASE("PreparedGraph runs what run() runs") {
  Tensor x = randn({4, 32}, 5).eval();
  Tensor y = layer_norm(x * 3.0f);
  ir::Captured c = ir::capture({y.node()}, Device::cpu());
  backend::RunArgs args;
  for (auto& leaf : c.leaves) args.inputs.push_back(detail::leaf_pointer(*leaf));
  std::vector<float> a(128), b(128);
  args.outputs = {a.data()};
  backend::run(c.graph, args, backend::Mode::Auto);
  backend::PreparedGraph prepared(c.graph, backend::Mode::Auto);
  args.outputs = {b.data()};
  prepared.run(args);
  CHECK(a == b);
}

TEST_CASE("steps: a run holds a temporary only from the first step that uses it to the last") {
  // Eight products with a tanh between each: every product's result and every tanh's are
  // temporaries between steps (1 MiB each). Held for the whole run they would take 16 MiB; at
  // any step at most three are live (the step's input, its output, and the one being freed).
  const std::int64_t n = 512;
  const Device cpu = Device::cpu();
  manual_seed(3);
  Tensor x = randn({n, n}, DType::Float32, cpu).eval();
  std::vector<Tensor> w;
  for (int i = 0; i < 8; ++i) w.push_back((randn({n, n}, DType::Float32, cpu) * (1.0 / std::sqrt(double(n)))).eval());
  auto chain = [&] {
    Tensor h = x;
    for (const Tensor& wi : w) h = tanh(matmul(h, wi));
    return sum(h);
  };
  // The same chain evaluated one product at a time (each result realized): the reference value.
  Tensor h = x;
  for (const Tensor& wi : w) h = tanh(matmul(h, wi)).eval();
  const double expected = sum(h).item<double>();

  const std::size_t base = runtime::host_allocator_stats().in_use_bytes;
  runtime::reset_host_memory_peak();
  const double got = chain().item<double>();
  const std::size_t peak = runtime::host_allocator_stats().peak_in_use_bytes - base;
  CHECK(got == doctest::Approx(expected).epsilon(1e-5));
  const std::size_t mib = std::size_t(1) << 20;
  CHECK_MESSAGE(peak <= 3 * mib, "peak " << peak << " bytes beyond the inputs");
}

}  // namespace kiln_test_backend_dispatch
