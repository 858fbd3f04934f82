// Composites lowered to primitives by decomp/: softmax, log_softmax (any axis), layer_norm
// (with and without weight/bias), rms_norm (default eps of the computing dtype), cross_entropy (with
// ignore_index), on f16/bf16/f32/f64, against float64 references; and the shape of their
// lowering (primitives only; 16-bit inputs computed in f32 and rounded once).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "../support/reference.hpp"

namespace kiln_test_decomp_composites {

using namespace kiln;
namespace kt = kiln::testing;

namespace {

/// softmax (or log_softmax) of `a` along `axis`, in double.
kt::Ref ref_softmax_axis(const kt::Ref& a, std::int64_t axis, bool log_form) {
  if (axis < 0) axis += static_cast<std::int64_t>(a.shape.size());
  kt::Ref r = a;
  auto strides = contiguous_strides(a.shape);
  const std::int64_t n = a.shape[axis], st = strides[axis];
  for (std::int64_t i = 0; i < a.shape.numel(); ++i) {
    auto idx = kt::unravel(i, a.shape);
    if (idx[axis] != 0) continue;  // one pass per line along the axis
    std::vector<double> line;
    for (std::int64_t k = 0; k < n; ++k) line.push_back(a.v[i + k * st]);
    double lse = kt::ref_logsumexp(line);
    for (std::int64_t k = 0; k < n; ++k) r.v[i + k * st] = log_form ? line[k] - lse : std::exp(line[k] - lse);
  }
  return r;
}

/// The ops of the graph that evaluating `t` would run.
std::vector<ir::Op> ops_of(const Tensor& t) {
  ir::Captured c = ir::capture({t.node()}, t.device());
  c.graph.verify();
  std::vector<ir::Op> ops;
  for (auto& n : c.graph.nodes) ops.push_back(n.op);
  return ops;
}

}  // namespace

TEST_CASE("softmax and log_softmax: every floating dtype, every axis") {
  for (DType dt : kt::kFloatDTypes) {
    auto in = kt::uniform_values(60, -4, 4, dt, 1);
    Tensor x = kt::make_tensor(in, {3, 4, 5}, dt);
    const kt::Ref rx{in, {3, 4, 5}};
    for (std::int64_t axis : {-1, 0, 1, 2, -2, -3}) {
      CAPTURE(dt);
      CAPTURE(axis);
      Tensor s = softmax(x, axis);
      Tensor l = log_softmax(x, axis);
      CHECK(s.dtype() == dt);
      CHECK(l.dtype() == dt);
      KILN_CHECK_CLOSE(s, ref_softmax_axis(rx, axis, false));
      KILN_CHECK_CLOSE(l, ref_softmax_axis(rx, axis, true));
    }
  }
  // Default axis is the last; integer inputs are a DTypeError, as torch's softmax kernels
  // (convert first: softmax(x.to(f32))).
  Tensor xi = kt::make_tensor({1, 2, 3, -1, 0, 1}, {2, 3}, DType::Int32);
  CHECK_THROWS_AS(softmax(xi), DTypeError);
  CHECK_THROWS_AS(log_softmax(xi), DTypeError);
  Tensor si = softmax(xi.to(DType::Float32));
  KILN_CHECK_CLOSE(si, kt::ref_softmax_last({{1, 2, 3, -1, 0, 1}, {2, 3}}));
  // Large logits do not overflow (the max is subtracted first).
  Tensor big = kt::make_tensor({1000, 1001, 1002, -1000}, {1, 4}, DType::Float32);
  KILN_CHECK_CLOSE(softmax(big), kt::ref_softmax_last({{1000, 1001, 1002, -1000}, {1, 4}}));
  KILN_CHECK_CLOSE(log_softmax(big), kt::ref_log_softmax_last({{1000, 1001, 1002, -1000}, {1, 4}}));
  // 0-dim and size-1 axes.
  KILN_CHECK_CLOSE(softmax(kt::make_tensor({3}, {}, DType::Float32)), kt::Ref{{1}, {}});
  KILN_CHECK_CLOSE(log_softmax(kt::make_tensor({3, 4}, {2, 1}, DType::Float64)), kt::Ref{{0, 0}, {2, 1}});
  // Rows of a softmax sum to one.
  Tensor r = sum(softmax(kt::make_tensor(kt::uniform_values(40, -10, 10, DType::Float32), {8, 5}, DType::Float32)), 1);
  KILN_CHECK_CLOSE(r, std::vector<double>(8, 1.0));
}

TEST_CASE("layer_norm with and without weight and bias") {
  for (DType dt : kt::kFloatDTypes) {
    CAPTURE(dt);
    auto in = kt::uniform_values(48, -3, 5, dt, 2);
    auto wv = kt::uniform_values(8, 0.5, 1.5, dt, 3);
    auto bv = kt::uniform_values(8, -1, 1, dt, 4);
    Tensor x = kt::make_tensor(in, {2, 3, 8}, dt);
    Tensor w = kt::make_tensor(wv, {8}, dt), b = kt::make_tensor(bv, {8}, dt);
    const kt::Ref rx{in, {2, 3, 8}};
    Tensor full_ln = layer_norm(x, w, b, 1e-5);
    CHECK(full_ln.dtype() == dt);
    CHECK(full_ln.shape() == Shape{2, 3, 8});
    KILN_CHECK_CLOSE(full_ln, kt::ref_layer_norm_last(rx, wv, bv, 1e-5));
    KILN_CHECK_CLOSE(layer_norm(x), kt::ref_layer_norm_last(rx, {}, {}, 1e-5));
    KILN_CHECK_CLOSE(layer_norm(x, w), kt::ref_layer_norm_last(rx, wv, {}, 1e-5));
    KILN_CHECK_CLOSE(layer_norm(x, Tensor{}, b), kt::ref_layer_norm_last(rx, {}, bv, 1e-5));
    KILN_CHECK_CLOSE(layer_norm(x, w, b, 0.5), kt::ref_layer_norm_last(rx, wv, bv, 0.5));
  }
  // The variance is the biased one (divide by K), as PyTorch: eps dominates a near-constant row.
  Tensor x = kt::make_tensor({1, 1.001, 1, 1.001}, {1, 4}, DType::Float64);
  KILN_CHECK_CLOSE(layer_norm(x, Tensor{}, Tensor{}, 1e-6), kt::ref_layer_norm_last(kt::ref_of(x), {}, {}, 1e-6));
  // One-dimensional input and a last axis of size 1 (normalises to zero).
  Tensor v = kt::make_tensor({2, 4, 6}, {3}, DType::Float32);
  KILN_CHECK_CLOSE(layer_norm(v), kt::ref_layer_norm_last(kt::ref_of(v), {}, {}, 1e-5));
  KILN_CHECK_CLOSE(layer_norm(kt::make_tensor({5, 7}, {2, 1}, DType::Float32)), std::vector<double>{0, 0});
}

TEST_CASE("rms_norm with and without weight; the default eps is the epsilon of the dtype it computes in") {
  for (DType dt : kt::kFloatDTypes) {
    CAPTURE(dt);
    auto in = kt::uniform_values(40, -2, 2, dt, 5);
    auto wv = kt::uniform_values(10, 0.5, 1.5, dt, 6);
    Tensor x = kt::make_tensor(in, {4, 10}, dt);
    Tensor w = kt::make_tensor(wv, {10}, dt);
    const kt::Ref rx{in, {4, 10}};
    Tensor y = rms_norm(x, w, 1e-6);
    CHECK(y.dtype() == dt);
    KILN_CHECK_CLOSE(y, kt::ref_rms_norm_last(rx, wv, 1e-6));
    KILN_CHECK_CLOSE(rms_norm(x, Tensor{}, 1e-6), kt::ref_rms_norm_last(rx, {}, 1e-6));
    // Tiny rows make eps matter: torch.nn.functional.rms_norm uses the epsilon of the dtype it
    // computes in (opmath), float32's for float16 and bfloat16.
    const double eps = dt == DType::Float64 ? std::ldexp(1.0, -52) : std::ldexp(1.0, -23);
    const double tiny = dt == DType::Float64 ? 1e-8 : dt == DType::Float32 ? 1e-4 : 1e-3;
    auto tv = kt::uniform_values(6, tiny, 2 * tiny, dt, 7);
    Tensor t = kt::make_tensor(tv, {2, 3}, dt);
    KILN_CHECK_CLOSE(rms_norm(t), kt::ref_rms_norm_last({tv, {2, 3}}, {}, eps));
  }
}

TEST_CASE("cross_entropy: mean over targets, ignore_index") {
  for (DType dt : kt::kFloatDTypes) {
    CAPTURE(dt);
    auto in = kt::uniform_values(5 * 7, -3, 3, dt, 8);
    const kt::Ref rl{in, {5, 7}};
    Tensor logits = kt::make_tensor(in, {5, 7}, dt);
    std::vector<std::int64_t> tv = {3, 0, 6, 2, 2};
    Tensor loss = cross_entropy(logits, kt::make_int_tensor(tv, {5}));
    CHECK(loss.dtype() == dt);
    CHECK(loss.shape() == Shape{});
    KILN_CHECK_CLOSE(loss, std::vector<double>{kt::ref_cross_entropy(rl, tv)});
    // Targets equal to ignore_index (-100 by default) leave the mean.
    std::vector<std::int64_t> ti = {3, -100, 6, -100, 1};
    KILN_CHECK_CLOSE(cross_entropy(logits, kt::make_int_tensor(ti, {5})),
                     std::vector<double>{kt::ref_cross_entropy(rl, ti)});
    std::vector<std::int64_t> tc = {3, 4, 6, 4, 1};
    KILN_CHECK_CLOSE(cross_entropy(logits, kt::make_int_tensor(tc, {5}), 4),
                     std::vector<double>{kt::ref_cross_entropy(rl, tc, 4)});
    // Every target ignored: 0 / 0 = NaN, as PyTorch.
    KILN_CHECK_CLOSE(cross_entropy(logits, kt::make_int_tensor({-100, -100, -100, -100, -100}, {5})),
                     std::vector<double>{NAN});
  }
  // A confident correct prediction costs ~0; a confident wrong one costs ~the logit gap.
  Tensor l = kt::make_tensor({20, 0, 0, 0, 20, 0}, {2, 3}, DType::Float64);
  KILN_CHECK_CLOSE(cross_entropy(l, kt::make_int_tensor({0, 0}, {2})),
                   std::vector<double>{kt::ref_cross_entropy(kt::ref_of(l), {0, 0})});
  CHECK(cross_entropy(l, kt::make_int_tensor({0, 0}, {2})).item<double>() == doctest::Approx(10.0).epsilon(1e-6));
  // Logits from a lazy expression and a strided view.
  Tensor base = kt::make_tensor(kt::uniform_values(12, -2, 2, DType::Float32, 9), {4, 3}, DType::Float32);
  base.eval();
  Tensor tl = transpose(base, 0, 1) * 2.0f;  // [3, 4]
  KILN_CHECK_CLOSE(cross_entropy(tl, kt::make_int_tensor({0, 3, 1}, {3})),
                   std::vector<double>{kt::ref_cross_entropy(kt::ref_of(tl), {0, 3, 1})});
}

TEST_CASE("composites lower to primitives only; 16-bit inputs computed in f32 and rounded once") {
  Tensor x = kt::make_tensor(kt::uniform_values(12, -1, 1, DType::Float16), {3, 4}, DType::Float16);
  Tensor w = kt::make_tensor({1, 1, 1, 1}, {4}, DType::Float16);
  const std::vector<Tensor> composites = {
      softmax(x), log_softmax(x), layer_norm(x, w, w), rms_norm(x, w), gelu(x),        gelu(x, true),
      silu(x),    sigmoid(x),     mean(x, 1),          var(x, 1),      logsumexp(x, 1)};
  for (const Tensor& t : composites) {
    CAPTURE(t.str());
    ir::Captured c = ir::capture({t.node()}, t.device());
    c.graph.verify();
    // Exactly one cast back to float16; every arithmetic node in between runs in float32
    // (index maps after the final cast may carry float16).
    int to_f16 = 0;
    for (auto& n : c.graph.nodes) {
      if (n.op == ir::Op::Input || ir::is_index_map(n.op)) continue;
      if (n.op == ir::Op::Cast && n.dtype == DType::Float16)
        ++to_f16;
      else
        CHECK(n.dtype != DType::Float16);
    }
    CHECK(to_f16 == 1);
    CHECK(t.dtype() == DType::Float16);
  }
  // The lowering of softmax: max, subtract, exp, sum, divide (plus index maps and casts).
  auto ops = ops_of(softmax(kt::make_tensor({1, 2, 3, 4}, {2, 2}, DType::Float32)));
  auto count = [&](ir::Op op) { return std::count(ops.begin(), ops.end(), op); };
  CHECK(count(ir::Op::ReduceMax) == 1);
  CHECK(count(ir::Op::ReduceSum) == 1);
  CHECK(count(ir::Op::Exp) == 1);
  CHECK(count(ir::Op::Sub) == 1);
  CHECK(count(ir::Op::Div) == 1);
}

}  // namespace kiln_test_decomp_composites
