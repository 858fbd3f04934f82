// The CPU JIT against the reference executor: every WORKLOADS.md workload at IR level with its
// kernel count, then layouts, dtypes, special values and the plan cache.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <optional>
#include <thread>

#include "../runtime/runtime_test_util.hpp"
#include "../support/mlp_block.hpp"
#include "cpu_jit_test_util.hpp"
#include "kiln/backend/steps.hpp"
#include "kiln/decomp/decompose.hpp"

namespace kiln_test_backend_cpu_jit {

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
    NodePtr ms =
        div(red(Op::ReduceSum, mul(X, X), {1}), cst(static_cast<double>(K), ir::constant(0, f32, {M, 1}, cpu())));
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
    NodePtr onehot =
        ir::binary(Op::Eq, ir::iota({M, K}, 1, i64, cpu()), ir::broadcast(ir::reshape(targets, {M, 1}), {M, K}));
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

TEST_CASE("cpu jit: layouts (strided, transposed, sliced, broadcast leaves; strided outputs; lazy index maps)") {
  const std::int64_t R = 48, C = 40;
  SUBCASE("transposed and sliced leaves, pointwise and reductions") {
    NodePtr t = input({R, C}, f32, 30, {1, R}, R * C);                             // a [C, R] buffer viewed transposed
    NodePtr s = input({R, C}, f32, 31, {2 * C + 3, 2}, 2 * C * R + 3 * R + 2, 5);  // every other column, padded rows
    expect(run_both({add(t, s), red(Op::ReduceSum, t, {1}), red(Op::ReduceMax, s, {0})}), 2);  // add joins a reduction
  }
  SUBCASE("broadcast leaf (zero strides) and scalar leaf") {
    NodePtr b = input({R, C}, f32, 32, {0, 1}, C);
    NodePtr one = input({}, f32, 33);
    NodePtr y = mul(b, ir::broadcast(ir::reshape(one, {1, 1}), {R, C}));
    expect(run_both({y, red(Op::ReduceSum, y, {0, 1})}), 1);
  }
  SUBCASE("outputs written with strides (assign into a transposed view)") {
    NodePtr x = input({R, C}, f32, 34), y = input({R, C}, f32, 35);
    expect(run_both({add(x, y), red(Op::ReduceSum, x, {1})}, {Strides{1, R}, Strides{2, 1}}), 1);
  }
  SUBCASE("lazy permute, slice, reshape (even and uneven splits), concat") {
    NodePtr x = input({R, C}, f32, 36), y = input({C, R}, f32, 37);
    NodePtr p = ir::permute(add(x, cst(1.0, x)), {1, 0});                             // [C, R]
    NodePtr sl = ir::slice(mul(y, y), 1, 3, 10, 4);                                   // [C, 10]
    NodePtr flat = ir::reshape(p, Shape{C * R});                                      // merge after permute
    NodePtr split = ir::reshape(add(flat, cst(2.0, flat)), Shape{R, C});              // uneven: [C*R] -> [R, C]
    NodePtr odd = ir::reshape(ir::permute(un(Op::Neg, x), {1, 0}), Shape{8, 5, 48});  // C*R = 1920 = 8*5*48
    NodePtr cat0 = ir::concat({p, un(Op::Abs, y), ir::slice(p, 1, 0, 10, 1)}, 1);
    NodePtr cat1 = ir::concat({add(x, x), ir::slice(mul(x, x), 0, 5, 7, 1)}, 0);
    expect(run_both({p, sl, split, odd, cat0, cat1}), 6);  // six shapes
  }
  SUBCASE("reductions over several and middle axes, kept dims") {
    NodePtr z = input({6, 10, 12}, f32, 38);
    expect(run_both({red(Op::ReduceSum, z, {0, 2}), red(Op::ReduceSum, z, {1}), red(Op::ReduceMax, z, {0, 1}),
                     red(Op::ReduceMin, z, {2}), red(Op::ReduceSum, z, {0, 1, 2})}),
           5);
  }
}

TEST_CASE("cpu jit: dtypes") {
  const Shape sh{12, 20};
  SUBCASE("f16 and bf16 are computed in f32 and rounded per op") {
    for (DType dt : {f16, bf16}) {
      NodePtr a = input(sh, dt, 40), b = input(sh, dt, 41);
      NodePtr y = add(mul(a, b), div(un(Op::Exp, a), add(un(Op::Abs, b), cst(1.0, b))));
      NodePtr z = un(Op::Sqrt, un(Op::Abs, sub(a, b)));
      expect(
          run_both({y, z, red(Op::ReduceSum, y, {1}), red(Op::ReduceMax, a, {0}), ir::cast(y, f32), ir::cast(a, i32)}),
          2);
    }
  }
  SUBCASE("f64") {
    NodePtr a = input(sh, f64, 42), b = input(sh, f64, 43);
    NodePtr y = add(un(Op::Tanh, a), mul(un(Op::Log1p, un(Op::Abs, b)), un(Op::Erf, a)));
    expect(run_both({y, red(Op::ReduceSum, y, {1}), red(Op::ReduceProd, add(cst(1.0, a), mul(cst(0.01, a), a)), {0})}),
           2);
  }
  SUBCASE("int32, int64: wrapping arithmetic, division, pow, reductions") {
    for (DType dt : {i32, i64}) {
      NodePtr a = input(sh, dt, 44), b = input(sh, dt, 45);
      NodePtr big = mul(a, cst(dt == i32 ? 2147483000.0 : 9.2e18, a));
      expect(run_both({add(mul(a, b), big), div(a, b), ir::binary(Op::Pow, a, un(Op::Abs, b)), un(Op::Neg, a),
                       un(Op::Abs, a), ir::binary(Op::Maximum, a, b), red(Op::ReduceSum, a, {1}),
                       red(Op::ReduceProd, b, {0}), red(Op::ReduceMin, a, {1}), red(Op::ArgMax, b, {1}),
                       red(Op::ArgMin, a, {0}), ir::cast(a, f32), ir::cast(a, dt == i32 ? i64 : i32),
                       ir::binary(Op::Lt, a, b)}),
             2);
    }
  }
  SUBCASE("bool: logic, arithmetic on 0/1, reductions, casts") {
    NodePtr a = input(sh, bool_, 46), b = input(sh, bool_, 47);
    expect(run_both({ir::binary(Op::And, a, b), ir::binary(Op::Or, a, un(Op::Not, b)), add(a, b), mul(a, b), sub(a, b),
                     red(Op::ReduceSum, a, {1}), red(Op::ReduceMax, a, {0}), red(Op::ReduceMin, b, {1}),
                     red(Op::ArgMax, a, {1}), ir::cast(a, f32), ir::cast(a, i64),
                     ir::where(a, input(sh, f32, 48), input(sh, f32, 49))}),
           2);
  }
  SUBCASE("casts between every pair") {
    NodePtr a = input(sh, f32, 50, {}, -1, 0, 100.0);
    std::vector<NodePtr> outs;
    for (DType from : {bool_, i32, i64, f16, bf16, f32, f64}) {
      NodePtr src = ir::cast(a, from);
      for (DType to : {bool_, i32, i64, f16, bf16, f32, f64}) outs.push_back(ir::cast(src, to));
    }
    expect(run_both(outs), 1);
  }
  SUBCASE("a primitive on a dtype it is not defined for throws DTypeError") {
    NodePtr a = input(sh, i32, 51);
    ir::Captured c = ir::capture({un(Op::Exp, a)}, cpu());
    Outputs o = make_outputs(c.graph, 0);
    CHECK_THROWS_AS(backend::run_cpu_jit(c.graph, args_for(c, o)), DTypeError);
  }
}

TEST_CASE("cpu jit: NaN, Inf and signed zeros behave as in the reference") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> va = {1.f, -0.f, 0.f, nan, inf, -inf, 2.5f, -2.5f, 0.5f, -0.5f, 3.f, nan, 1.5f, -1.5f, 7.f, -7.f};
  std::vector<float> vb = {nan, 0.f, -0.f, 1.f, -inf, inf, 0.f, -0.f, 2.f, 2.f, 3.f, 4.f, -1.f, 1.f, 0.f, -0.f};
  NodePtr a = input_values<float>({4, 4}, va), b = input_values<float>({4, 4}, vb);
  expect(run_both({ir::binary(Op::Maximum, a, b), ir::binary(Op::Minimum, a, b), div(a, b), un(Op::Floor, a),
                   un(Op::Ceil, a), un(Op::Round, a), un(Op::Neg, a), un(Op::Abs, a), un(Op::Sqrt, a), un(Op::Rsqrt, a),
                   un(Op::Exp, a), un(Op::Log, a), un(Op::IsNan, a), un(Op::IsInf, b), ir::cast(a, i32),
                   ir::cast(a, bool_), ir::binary(Op::Pow, a, b), mul(a, b)}),
         1);
  expect(run_both({red(Op::ReduceMax, a, {1}), red(Op::ReduceMin, a, {0}), red(Op::ArgMax, a, {1}),
                   red(Op::ArgMin, a, {0}), red(Op::ReduceSum, b, {1}), red(Op::ReduceProd, a, {0})}),
         2);
}

TEST_CASE("cpu jit: leaves, generators, size 0, outputs that are inputs") {
  SUBCASE("iota, random (every float dtype, both distributions), constants") {
    std::vector<NodePtr> outs;
    for (DType dt : {f16, bf16, f32, f64}) {
      outs.push_back(ir::random({9, 13}, 1234, 0, dt, cpu()));
      outs.push_back(ir::random({9, 13}, 99, 1, dt, cpu()));
      outs.push_back(ir::iota({9, 13}, 1, dt, cpu()));
    }
    outs.push_back(ir::iota({9, 13}, 0, i64, cpu()));
    outs.push_back(ir::constant(-0.0, f32, {9, 13}, cpu()));
    outs.push_back(ir::constant_int(-7, i32, {9, 13}, cpu()));
    expect(run_both(outs), 1);
  }
  SUBCASE("size-0 tensors and reductions over empty axes") {
    NodePtr e = input({0, 5}, f32, 60);
    expect(run_both({add(e, e), red(Op::ReduceSum, e, {0}), red(Op::ReduceSum, e, {1}), red(Op::ReduceProd, e, {0})}),
           2);
  }
  SUBCASE("an input and a constant as outputs, one node output twice") {
    NodePtr x = input({7, 3}, f32, 61, {1, 7}, 21);
    NodePtr y = add(x, x);
    expect(run_both({x, y, y, ir::constant(3.0, f64, {2}, cpu())}), 2);
  }
}

TEST_CASE("cpu jit: parallel, split and column paths on larger shapes") {
  SUBCASE("parallel pointwise and row kernel") {
    NodePtr X = input({256, 320}, f32, 70);
    expect(run_both({decomp::softmax(X, 1), add(X, cst(1.0, X))}), 1);
  }
  SUBCASE("full reduction split into chunks (sum, max with NaN free data, argmax)") {
    NodePtr x = input({1 << 17}, f32, 71);
    expect(run_both({red(Op::ReduceSum, x, {0}), red(Op::ReduceMax, x, {0}), red(Op::ArgMin, x, {0})}), 1);
  }
  SUBCASE("few long rows: row softmax split into chunks") {
    NodePtr X = input({3, 40000}, f32, 72);
    expect(run_both({decomp::softmax(X, 1), red(Op::ArgMax, X, {1})}), 1);
  }
  SUBCASE("column sum of a tall narrow matrix: split over rows, combined in order") {
    NodePtr X = input({40000, 3}, f32, 73);
    expect(run_both({red(Op::ReduceSum, X, {0}), red(Op::ReduceMax, X, {0})}), 1);
  }
  SUBCASE("softmax over axis 0: column strategy with several passes") {
    NodePtr X = input({300, 200}, f32, 74);
    expect(run_both({decomp::softmax(X, 0), decomp::layer_norm(ir::permute(X, {1, 0}), nullptr, nullptr, 1e-5)}), 2);
  }
  SUBCASE("wide column blocks with a partial last block, split over rows, several passes") {
    NodePtr X = input({24, 5000}, f32, 76);
    expect(run_both({decomp::softmax(X, 0), red(Op::ArgMax, X, {0})}), 1);
  }
  SUBCASE("accurate float sums over many elements") {
    NodePtr x = input({1 << 20}, f32, 75);
    expect(run_both({red(Op::ReduceSum, add(x, cst(3.0, x)), {0})}, {}, 0.05), 1);
  }
}

TEST_CASE("cpu jit: fusion boundaries") {
  const std::int64_t S = 32;
  SUBCASE("a reduction read at other rows is materialised and read by a second kernel") {
    NodePtr x = input({S, S}, f32, 80);
    NodePtr rs = red(Op::ReduceSum, x, {1});                     // [S, 1]
    NodePtr t = ir::permute(ir::broadcast(rs, {S, S}), {1, 0});  // row i reads rs[j]
    expect(run_both({red(Op::ReduceSum, mul(x, t), {1})}), 2);
  }
  SUBCASE("a reduction output also read by another kernel comes from the output buffer") {
    NodePtr x = input({S, S}, f32, 81);
    NodePtr rs = red(Op::ReduceSum, x, {1});
    NodePtr cs = red(Op::ReduceSum, div(x, ir::broadcast(rs, {S, S})), {0});
    expect(run_both({rs, cs}), 2);
  }
  SUBCASE("siblings of one shape share a kernel; other shapes get their own") {
    NodePtr x = input({S, S}, f32, 82), v = input({S}, f32, 83);
    expect(run_both({mul(x, cst(2.0, x)), add(x, cst(1.0, x))}), 1);
    expect(run_both({mul(x, cst(2.0, x)), add(v, v)}), 2);
  }
  SUBCASE("row and column reductions of one input: two kernels, both exact") {
    NodePtr x = input({S, 3 * S}, f32, 84);
    NodePtr y = div(x, mul(ir::broadcast(red(Op::ReduceSum, x, {1}), x->shape),
                           ir::broadcast(red(Op::ReduceMax, x, {0}), x->shape)));
    expect(run_both({y}), 2);
  }
}

TEST_CASE("cpu jit: plan cache and threads") {
  NodePtr x = input({16, 16}, f32, 90);
  NodePtr y = add(mul(x, x), cst(0.25, x));
  ir::Captured c = ir::capture({y}, cpu());
  Outputs o = make_outputs(c.graph, 0);
  backend::run_cpu_jit(c.graph, args_for(c, o));
  auto before = stats();
  std::size_t plans = backend::detail::CpuPlanCache::instance().size();
  backend::run_cpu_jit(c.graph, args_for(c, o));
  CHECK(stats().compiles == before.compiles);
  CHECK(stats().memory_hits == before.memory_hits);  // a plan hit does not even ask the module cache
  CHECK(stats().launches == before.launches + 1);
  CHECK(backend::detail::CpuPlanCache::instance().size() == plans);
  CHECK(backend::explain_schedule(c.graph).find("kernel 0: pointwise") != std::string::npos);
  // A kept plan runs without the lookup and is the cached one.
  backend::CpuPlanPtr plan = backend::cpu_plan(c.graph);
  CHECK(plan == backend::cpu_plan(c.graph));
  Outputs o2 = make_outputs(c.graph, 0);
  backend::run_cpu_plan(*plan, args_for(c, o2));
  CHECK(std::memcmp(o.pointers[0], o2.pointers[0], 16 * 16 * sizeof(float)) == 0);
  CHECK(stats().launches == before.launches + 2);

  // Threads racing for one new graph all get correct results.
  NodePtr z = input({64, 64}, f32, 91);
  NodePtr w = decomp::log_softmax(mul(z, cst(1.5, z)), 1);
  ir::Captured cz = ir::capture({w}, cpu());
  Outputs ref = make_outputs(cz.graph, 0);
  backend::run_reference(cz.graph, args_for(cz, ref));
  std::atomic<int> bad{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; ++i)
    ts.emplace_back([&] {
      Outputs mine = make_outputs(cz.graph, 0);
      backend::run_cpu_jit(cz.graph, args_for(cz, mine));
      const float* a = static_cast<const float*>(mine.pointers[0]);
      const float* b = static_cast<const float*>(ref.pointers[0]);
      for (int k = 0; k < 64 * 64; ++k)
        if (std::fabs(a[k] - b[k]) > 1e-5f * (1 + std::fabs(b[k]))) bad++;
    });
  for (auto& t : ts) t.join();
  CHECK(bad == 0);
}

TEST_CASE("cpu jit: an expensive value needed by several kernels is computed once") {
  NodePtr x = input({48, 64}, f32, 100);
  NodePtr t =
      un(Op::Tanh, mul(un(Op::Exp, x), cst(0.5, x)));  // costly: recomputing it would repeat two transcendental calls
  Check c = run_both({red(Op::ReduceSum, t, {1}), red(Op::ReduceSum, t, {0})});
  expect(c, 2);
  CHECK(c.schedule.find("temp 0") != std::string::npos);
  // Cheap pointwise work of leaves is recomputed instead: no temporary.
  NodePtr u = add(mul(x, x), cst(1.0, x));
  Check d = run_both({red(Op::ReduceSum, u, {1}), red(Op::ReduceSum, u, {0})});
  expect(d, 2);
  CHECK(d.schedule.find("temp") == std::string::npos);
}


TEST_CASE("a GPU's step plans take the training epilogues unless KILN_CUBLASLT_TRAINING_EPILOGUES is off") {
  // On by default since they ran on GPUs (docs/performance-gpu.md); the setting turns them off.
  {
    kiln_test::ScopedEnv unset("KILN_CUBLASLT_TRAINING_EPILOGUES", std::nullopt);
    CHECK(backend::detail::training_epilogues());
  }
  {
    kiln_test::ScopedEnv off("KILN_CUBLASLT_TRAINING_EPILOGUES", "0");
    CHECK_FALSE(backend::detail::training_epilogues());
  }
  kiln_test::ScopedEnv on("KILN_CUBLASLT_TRAINING_EPILOGUES", "1");
  CHECK(backend::detail::training_epilogues());
}

TEST_CASE("a GPU's step plan with its training epilogues runs on the host with the host plan's values") {
  // The plan a GPU gets for a training step's MLP block (the first product's bias and GELU in
  // its call, which keeps the GELU's input; the GELU's gradient in the next product's call;
  // through the reshapes of a linear over sequences too), run on the host, whose product then
  // applies cuBLASLt's epilogues itself: its six outputs must equal the host's own plan (the
  // epilogues in kernels) within rounding. Every slot the GPU's calls read and write (the
  // auxiliary matrix, results in a split shape, the later levels) is checked by its values.
  for (DType dt : {f32, bf16})
    for (bool sequences : {false, true}) {
      CAPTURE(std::string(dtype_name(dt)));
      CAPTURE(sequences);
      ir::Captured c = ir::capture(mlp_block_with_gradients(32, sequences, dt), cpu());
      backend::CpuLaunchOptions gpu_plan;
      gpu_plan.host_epilogues = true;
      auto fused = backend::make_step_program(c.graph, backend::Mode::Jit, gpu_plan);
      auto plain = backend::make_step_program(c.graph, backend::Mode::Jit, {});
      int keeps = 0, gradients = 0;
      for (const auto& call : fused->plan().calls) {
        keeps += call.activation == sched::Activation::GeluTanh && call.aux >= 0;
        gradients += call.activation == sched::Activation::GeluTanhGrad;
      }
      CHECK(keeps == 1);
      CHECK(gradients == 1);
      for (const auto& call : plain->plan().calls) CHECK(call.activation == sched::Activation::None);
      Outputs got = make_outputs(c.graph, 0xFF), want = make_outputs(c.graph, 0xFF);
      fused->run(args_for(c, got));
      plain->run(args_for(c, want));
      // bfloat16: the fused product rounds once where the kernels round the product, then the
      // biased value (a few units in the last place of bfloat16, relative to each output's scale).
      const double tol = dt == f32 ? 1e-5 : 3e-2;
      for (std::size_t k = 0; k < c.graph.outputs.size(); ++k) {
        CAPTURE(k);
        const ir::GraphNode& n = c.graph.nodes[static_cast<std::size_t>(c.graph.outputs[k])];
        double scale = 0, worst = 0;
        for (std::int64_t e = 0; e < n.shape.numel(); ++e) scale = std::max(scale, std::fabs(as_double(want.pointers[k], e, dt)));
        for (std::int64_t e = 0; e < n.shape.numel(); ++e)
          worst = std::max(worst, std::fabs(as_double(got.pointers[k], e, dt) - as_double(want.pointers[k], e, dt)));
        CHECK(worst <= tol * (scale + 1e-3));
      }
    }
}

}  // namespace kiln_test_backend_cpu_jit
