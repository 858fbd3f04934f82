// Every WORKLOADS.md workload (P1-P4, R1-R3, N1-N6, S1), written as a user would write it,
// at small (deliberately ragged) shapes, against a float64 reference computed here.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "../support/reference.hpp"

namespace kiln_test_workloads_workloads {

using namespace kiln;
namespace kt = kiln::testing;

namespace {
/// Philox inputs (the same numbers on every device), evaluated, with their host values.
struct Input {
  Tensor t;
  kt::Ref r;
};
Input normal(const Shape& s, std::uint64_t seed, DType dt = f32) {
  Tensor t = randn(s, seed, dt, kt::device());
  t.eval();
  return {t, kt::ref_of(t)};
}
Input uniform(const Shape& s, std::uint64_t seed, double lo, double hi, DType dt = f32) {
  Tensor t = rand(s, seed, dt, kt::device()) * static_cast<float>(hi - lo) + static_cast<float>(lo);
  t = t.to(dt);
  t.eval();
  return {t, kt::ref_of(t)};
}
}  // namespace

TEST_CASE("P1: 2*x + y") {
  auto x = normal({4099}, 1), y = normal({4099}, 2);
  Tensor out = 2.0f * x.t + y.t;
  KILN_CHECK_CLOSE(out, kt::zip(x.r, y.r, [](double a, double b) { return 2 * a + b; }));
}

TEST_CASE("P2: gelu, tanh form, written out as 8 pointwise ops") {
  auto x = normal({4099}, 3);
  Tensor xt = x.t;
  Tensor out = 0.5f * xt * (1.0f + tanh(0.7978845608f * (xt + 0.044715f * xt * xt * xt)));
  kt::Ref expected = kt::map(x.r, kt::ref_gelu_tanh);
  KILN_CHECK_CLOSE(out, expected);
  KILN_CHECK_CLOSE(gelu(xt, true), expected);  // the library's own form agrees
}

TEST_CASE("P3: 16 x (x = sin(x) * 1.01 + 0.5)") {
  auto x0 = normal({4099}, 4);
  Tensor x = x0.t;
  for (int i = 0; i < 16; ++i) x = sin(x) * 1.01f + 0.5f;
  kt::Ref expected = x0.r;
  for (int i = 0; i < 16; ++i) expected = kt::map(expected, [](double v) { return std::sin(v) * 1.01 + 0.5; });
  KILN_CHECK_CLOSE(x, expected);
}

TEST_CASE("P4: (X - mu) * s + b with mu [M,1], s and b [K]") {
  const std::int64_t m = 33, k = 65;
  auto X = normal({m, k}, 5), mu = normal({m, 1}, 6), s = uniform({k}, 7, 0.5, 1.5), b = normal({k}, 8);
  Tensor out = (X.t - mu.t) * s.t + b.t;
  CHECK(out.shape() == Shape{m, k});
  kt::Ref d = kt::zip(X.r, mu.r, [](double a, double c) { return a - c; });
  kt::Ref e =
      kt::zip(kt::zip(d, s.r, [](double a, double c) { return a * c; }), b.r, [](double a, double c) { return a + c; });
  KILN_CHECK_CLOSE(out, e);
}

TEST_CASE("R1: sum(x*x) over everything") {
  auto x = normal({10007}, 9);
  Tensor out = sum(x.t * x.t);
  CHECK(out.dim() == 0);
  double expected = 0;
  for (double v : x.r.v) expected += static_cast<double>(static_cast<float>(v * v));
  KILN_CHECK_CLOSE(out, std::vector<double>{expected});
}

TEST_CASE("R2 and R3: row sums and column sums") {
  auto X = normal({33, 257}, 10);
  KILN_CHECK_CLOSE(sum(X.t, {1}), kt::reduce(X.r, {1}, false, kt::ref_sum));
  KILN_CHECK_CLOSE(sum(X.t, {0}), kt::reduce(X.r, {0}, false, kt::ref_sum));
}

TEST_CASE("N1 and N2: softmax over the last axis, long and short rows") {
  auto X = normal({17, 129}, 11);
  KILN_CHECK_CLOSE(softmax(X.t, -1), kt::ref_softmax_last(X.r));
  auto S = normal({64, 32}, 12);
  KILN_CHECK_CLOSE(softmax(S.t, -1), kt::ref_softmax_last(S.r));
}

TEST_CASE("N3: layer_norm over the last axis, with weight and bias") {
  auto X = normal({17, 129}, 13), w = uniform({129}, 14, 0.5, 1.5), b = normal({129}, 15);
  KILN_CHECK_CLOSE(layer_norm(X.t, w.t, b.t, 1e-5), kt::ref_layer_norm_last(X.r, w.r.v, b.r.v, 1e-5));
}

TEST_CASE("N4: rms_norm written out") {
  auto X = normal({17, 129}, 16), w = uniform({129}, 17, 0.5, 1.5);
  Tensor out = X.t * rsqrt(mean(X.t * X.t, -1, true) + 1e-6f) * w.t;
  kt::Ref expected = kt::ref_rms_norm_last(X.r, w.r.v, 1e-6);
  KILN_CHECK_CLOSE(out, expected);
  KILN_CHECK_CLOSE(rms_norm(X.t, w.t, 1e-6), expected);
}

TEST_CASE("N5: softmax, bf16 in and out, f32 math") {
  auto X = normal({17, 129}, 18, bf16);
  CHECK(X.t.dtype() == DType::BFloat16);
  Tensor out = softmax(X.t, -1);
  CHECK(out.dtype() == DType::BFloat16);
  KILN_CHECK_CLOSE(out, kt::ref_softmax_last(X.r));
  // f32 math rounded once: identical to converting, computing in f32, converting back.
  Tensor by_hand = softmax(X.t.to(f32), -1).to(bf16);
  CHECK(kt::values(out) == kt::values(by_hand));
}

TEST_CASE("N6: cross_entropy(logits, int64 targets), mean") {
  const std::int64_t n = 16, c = 1000;
  auto L = normal({n, c}, 19);
  std::vector<std::int64_t> targets;
  for (std::int64_t i = 0; i < n; ++i) targets.push_back((i * 397 + 11) % c);
  Tensor loss = cross_entropy(L.t, kt::make_int_tensor(targets, {n}));
  CHECK(loss.dtype() == DType::Float32);
  KILN_CHECK_CLOSE(loss, std::vector<double>{kt::ref_cross_entropy(L.r, targets)});
}

TEST_CASE("S1: 10 x (x = relu(x*y + 0.1)) on 4096 elements") {
  auto x0 = uniform({4096}, 20, 0, 1), y = uniform({4096}, 21, -0.4, 1.0);
  Tensor x = x0.t;
  for (int i = 0; i < 10; ++i) x = relu(x * y.t + 0.1f);
  kt::Ref expected = x0.r;
  for (int i = 0; i < 10; ++i)
    expected = kt::map(kt::zip(expected, y.r, [](double a, double b) { return a * b + 0.1; }),
                       [](double v) { return v > 0 ? v : 0.0; });
  KILN_CHECK_CLOSE(x, expected);
}

}  // namespace kiln_test_workloads_workloads
