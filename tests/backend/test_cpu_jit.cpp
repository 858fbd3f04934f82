// The CPU JIT against the reference executor: every WORKLOADS.md workload at IR level with its
// kernel count, then layouts, dtypes, special values and the plan cache.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <thread>

#include "cpu_jit_test_util.hpp"
#include "kiln/decomp/decompose.hpp"

using namespace kiln_jit_test;

namespace {

constexpr std::int64_t M = 64, K = 256;

void expect(const Check& c, std::uint64_t kernels) {
  INFO(c.schedule);
  CHECK_MESSAGE(c.mismatch.empty(), c.mismatch);
  CHECK(c.kernels == kernels);
  CHECK(c.launches == kernels);
}

NodePtr softmax_ir(const NodePtr& x, std::int64_t axis) {
  NodePtr m = ir::broadcast(red(Op::ReduceMax, x, {axis}), x->shape);
  NodePtr e = un(Op::Exp, sub(x, m));
  return div(e, ir::broadcast(red(Op::ReduceSum, e, {axis}), x->shape));
}

NodePtr log_softmax_ir(const NodePtr& x, std::int64_t axis) {
  NodePtr shifted = sub(x, ir::broadcast(red(Op::ReduceMax, x, {axis}), x->shape));
  NodePtr lse = un(Op::Log, red(Op::ReduceSum, un(Op::Exp, shifted), {axis}));
  return sub(shifted, ir::broadcast(lse, x->shape));
}

NodePtr layer_norm_ir(const NodePtr& x, const NodePtr& w, const NodePtr& b, double eps) {
  const std::int64_t last = static_cast<std::int64_t>(x->shape.size()) - 1;
  const double n = static_cast<double>(x->shape[static_cast<std::size_t>(last)]);
  NodePtr sum = red(Op::ReduceSum, x, {last});
  NodePtr mean = div(sum, cst(n, sum));
  NodePtr d = sub(x, ir::broadcast(mean, x->shape));
  NodePtr ss = red(Op::ReduceSum, mul(d, d), {last});
  NodePtr var = div(ss, cst(n, ss));
  NodePtr rstd = un(Op::Rsqrt, add(var, cst(eps, var)));
  return add(mul(mul(d, ir::broadcast(rstd, x->shape)), expand(w, x->shape)), expand(b, x->shape));
}

}  // namespace

TEST_CASE("cpu jit: WORKLOADS.md workloads at IR level, fused == reference, kernel counts") {
  SUBCASE("P1 2*x + y") {
    NodePtr x = input({M * K}, f32, 1), y = input({M * K}, f32, 2);
    expect(run_both({add(mul(cst(2.0, x), x), y)}), 1);
  }
  SUBCASE("P2 gelu, tanh form written out") {
    NodePtr x = input({M * K}, f32, 3);
    NodePtr cube = mul(mul(x, x), x);
    NodePtr inner = mul(cst(0.7978845608028654, x), add(x, mul(cst(0.044715, x), cube)));
    NodePtr y = mul(mul(cst(0.5, x), x), add(cst(1.0, x), un(Op::Tanh, inner)));
    expect(run_both({y}), 1);
  }
  SUBCASE("P3 16 x sin chain") {
    NodePtr x = input({M * K}, f32, 4);
    for (int i = 0; i < 16; ++i) x = add(mul(un(Op::Sin, x), cst(1.01, x)), cst(0.5, x));
    expect(run_both({x}), 1);
  }
  SUBCASE("P4 (X - mu) * s + b, mu [M,1], s and b [K]") {
    NodePtr X = input({M, K}, f32, 5), mu = input({M, 1}, f32, 6), s = input({K}, f32, 7), b = input({K}, f32, 8);
    NodePtr y = add(mul(sub(X, ir::broadcast(mu, X->shape)), expand(s, X->shape)), expand(b, X->shape));
    expect(run_both({y}), 1);
  }
  SUBCASE("R1 sum(x*x) over everything") {
    NodePtr x = input({M * K}, f32, 9);
    expect(run_both({ir::reshape(red(Op::ReduceSum, mul(x, x), {0}), Shape{})}), 1);
  }
  SUBCASE("R2 row sum") {
    NodePtr X = input({M, K}, f32, 10);
    expect(run_both({ir::reshape(red(Op::ReduceSum, X, {1}), Shape{M})}), 1);
  }
  SUBCASE("R3 column sum") {
    NodePtr X = input({M, K}, f32, 11);
    expect(run_both({ir::reshape(red(Op::ReduceSum, X, {0}), Shape{K})}), 1);
  }
  SUBCASE("N1 softmax, decomposed as max/sub/exp/sum/div") {
    NodePtr X = input({M, K}, f32, 12, {}, -1, 0, 3.0);
    expect(run_both({softmax_ir(X, 1)}), 1);
  }
  SUBCASE("N2 softmax, short rows") {
    NodePtr X = input({4 * M, 32}, f32, 13);
    expect(run_both({softmax_ir(X, 1)}), 1);
  }
  SUBCASE("N3 layer_norm with weight and bias") {
    NodePtr X = input({M, K}, f32, 14), w = input({K}, f32, 15), b = input({K}, f32, 16);
    expect(run_both({layer_norm_ir(X, w, b, 1e-5)}), 1);
  }
  SUBCASE("N4 rms_norm written out") {
    NodePtr X = input({M, K}, f32, 17), w = input({K}, f32, 18);
    NodePtr ms = div(red(Op::ReduceSum, mul(X, X), {1}), cst(static_cast<double>(K), ir::constant(0, f32, {M, 1}, cpu())));
    NodePtr y = mul(mul(X, ir::broadcast(un(Op::Rsqrt, add(ms, cst(1e-6, ms))), X->shape)), expand(w, X->shape));
    expect(run_both({y}), 1);
  }
  SUBCASE("N5 softmax, bf16 in and out, f32 math") {
    NodePtr X = input({M, K}, bf16, 19);
    expect(run_both({ir::cast(softmax_ir(ir::cast(X, f32), 1), bf16)}), 1);
  }
  SUBCASE("N6 cross_entropy: log_softmax, onehot(iota == target), where, sum, mean") {
    NodePtr logits = input({M, K}, f32, 20);
    std::vector<std::int64_t> t(M);
    for (std::int64_t i = 0; i < M; ++i) t[static_cast<std::size_t>(i)] = (i * 37) % K;
    NodePtr targets = input_values<std::int64_t>({M}, t);
    NodePtr logp = log_softmax_ir(logits, 1);
    NodePtr onehot = ir::binary(Op::Eq, ir::iota({M, K}, 1, i64, cpu()), ir::broadcast(ir::reshape(targets, {M, 1}), {M, K}));
    NodePtr picked = red(Op::ReduceSum, ir::where(onehot, logp, cst(0.0, logp)), {1});
    NodePtr total = red(Op::ReduceSum, un(Op::Neg, picked), {0});
    NodePtr loss = ir::reshape(div(total, cst(static_cast<double>(M), total)), Shape{});
    expect(run_both({loss}), 1);
  }
  SUBCASE("N6 through decomp::cross_entropy (ignore_index, valid count)") {
    NodePtr logits = input({M, K}, f32, 21);
    std::vector<std::int64_t> t(M);
    for (std::int64_t i = 0; i < M; ++i) t[static_cast<std::size_t>(i)] = i % 5 == 0 ? -100 : (i * 13) % K;
    expect(run_both({decomp::cross_entropy(logits, input_values<std::int64_t>({M}, t), -100)}), 1);
  }
  SUBCASE("decomp softmax, log_softmax, layer_norm, rms_norm, logsumexp: one kernel each") {
    NodePtr X = input({M, K}, f32, 22), w = input({K}, f32, 23), b = input({K}, f32, 24);
    expect(run_both({decomp::softmax(X, 1)}), 1);
    expect(run_both({decomp::log_softmax(X, 1)}), 1);
    expect(run_both({decomp::layer_norm(X, w, b, 1e-5)}), 1);
    expect(run_both({decomp::rms_norm(X, w, 1e-6)}), 1);
    expect(run_both({decomp::logsumexp_keep(X, {1})}), 1);
    expect(run_both({decomp::gelu(X, false), decomp::silu(X)}), 1);
  }
}
