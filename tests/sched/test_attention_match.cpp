// Written-out attention (matmul(softmax(q kᵀ · c [+ mask]), v)) recognised by the step
// planner and run as one fused attention call: the values against the math form and a plain
// loop, the schedule log's verdict, the misses with their reasons, and a backward that reads
// the weights (so the forward stays written out).
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include <kiln/kiln.hpp>
#include <kiln/sched/attention_match.hpp>
#include <kiln/sched/steps.hpp>

#include "../support/compile_util.hpp"
#include "../support/ir_build.hpp"

namespace kiln_test_sched_attention_match {

using namespace kiln;

namespace {

const Shape kQ{2, 3, 12, 8};  // [B, H, L, E]; k and v [B, H, S, E] with S = 10

Tensor input(const Shape& s, std::uint64_t seed) { return randn(s, seed, f32).eval(); }

/// softmax(q kᵀ · scale + mask) v by loops in double over the trailing [L, E] / [S, E]
/// matrices (the mask broadcast over leading dims, as numpy broadcasts).
std::vector<double> naive(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, double scale) {
  auto qv = q.to_vector<double>(), kv = k.to_vector<double>(), vv = v.to_vector<double>();
  const std::size_t r = q.shape().size();
  const std::int64_t L = q.shape()[r - 2], E = q.shape()[r - 1], S = k.shape()[r - 2], Ev = v.shape()[r - 1];
  const std::int64_t batches = q.numel() / (L * E);
  std::vector<std::int64_t> scores(q.shape().begin(), q.shape().end() - 1);
  scores.push_back(S);
  std::vector<double> mv =
      mask.defined() ? broadcast_to(mask, Shape(scores)).to_vector<double>() : std::vector<double>{};
  std::vector<double> out(static_cast<std::size_t>(batches * L * Ev)), w(static_cast<std::size_t>(S));
  for (std::int64_t b = 0; b < batches; ++b)
    for (std::int64_t i = 0; i < L; ++i) {
      double top = -INFINITY, sum = 0;
      for (std::int64_t j = 0; j < S; ++j) {
        double s = 0;
        for (std::int64_t e = 0; e < E; ++e) s += qv[(b * L + i) * E + e] * kv[(b * S + j) * E + e];
        w[j] = s * scale + (mv.empty() ? 0.0 : mv[(b * L + i) * S + j]);
        top = std::max(top, w[j]);
      }
      for (std::int64_t j = 0; j < S; ++j) sum += (w[j] = std::exp(w[j] - top));
      for (std::int64_t e = 0; e < Ev; ++e) {
        double acc = 0;
        for (std::int64_t j = 0; j < S; ++j) acc += w[j] / sum * vv[(b * S + j) * Ev + e];
        out[(b * L + i) * Ev + e] = acc;
      }
    }
  return out;
}

void check_close(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5).scale(1.0));
}

/// Evaluates `ts` in one graph with the schedule log captured (caches cleared first, so the
/// plan is made, and logged, again).
std::string eval_logged(const std::vector<Tensor>& ts) {
  kiln::reset();
  kiln::testing::LogCapture log("schedule");
  eval(ts);
  return log.text();
}

bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

}  // namespace

TEST_CASE("written-out attention runs as one fused call: scale, division by sqrt(d), masks") {
  Tensor q = input(kQ, 1), k = input({2, 3, 10, 8}, 2), v = input({2, 3, 10, 8}, 3);
  struct Case {
    const char* name;
    Tensor mask;
    bool divide;
  };
  const Case cases[] = {{"* scale", {}, false},
                        {"/ sqrt(d)", {}, true},
                        {"+ mask [L, S]", input({12, 10}, 4), false},
                        {"+ mask [B, 1, L, S]", input({2, 1, 12, 10}, 5), true}};
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const double scale = c.divide ? 1 / std::sqrt(8.0) : 0.125;
    Tensor scores = matmul(q, transpose(k, -2, -1));
    scores = c.divide ? Tensor(scores / std::sqrt(8.0)) : Tensor(scores * scale);
    if (c.mask.defined()) scores = scores + c.mask;
    Tensor out = matmul(softmax(scores, -1), v);
    const std::string text = eval_logged({out});
    CHECK(has(text, "attention pattern: matched softmax(q kᵀ · "));
    CHECK(has(text, "call attention forward"));
    CHECK(!has(text, "call matmul"));
    Tensor want = nn::functional::scaled_dot_product_attention_math(q, k, v, c.mask, 0.0, false, scale);
    check_close(out.to_vector<double>(), want.to_vector<double>());
    check_close(out.to_vector<double>(), naive(q, k, v, c.mask, scale));
  }
}

TEST_CASE("written-out attention over keys computed in the graph, the factor first") {
  Tensor q = input(kQ, 1), k = input({2, 3, 10, 8}, 2), v = input({2, 3, 10, 8}, 3);
  Tensor out = matmul(softmax(0.25 * matmul(q, transpose(k + k, -2, -1)), -1), v);
  CHECK(has(eval_logged({out}), "matched"));
  check_close(out.to_vector<double>(), naive(q, (k + k).eval(), v, {}, 0.25));
  // Traced by kiln::compile the number is a graph constant, baked into the call.
  auto f =
      kiln::compile([&](const Tensor& qq) { return matmul(softmax(matmul(qq, transpose(k, -2, -1)) / 4.0, -1), v); });
  kiln::reset();
  kiln::testing::LogCapture log("schedule");
  Tensor traced = f(q);
  check_close(traced.to_vector<double>(), naive(q, k, v, {}, 0.25));
  CHECK(has(log.text(), "attention pattern: matched softmax(q kᵀ · 0.25) v [2, 3, 12, 8] -> fused attention\n"));
}

TEST_CASE("the rewritten graph: a constant factor baked in, a broadcast mask read in place, leaves kept") {
  namespace b = kiln_ir_build;
  // Half operands (the softmax between casts), the factor a graph constant (CUDA, compile).
  ir::NodePtr q = b::input({2, 3, 12, 16}, f16, 1), k = b::input({2, 3, 10, 16}, f16, 2);
  ir::NodePtr v = b::input({2, 3, 10, 16}, f16, 3), m = b::input({1, 1, 12, 10}, f16, 4);
  ir::NodePtr product = ir::matmul(q, ir::permute(k, {0, 1, 3, 2}));
  // A mask computed in the graph: its [1, 1, L, S] value, not the broadcast, is what the call reads.
  ir::NodePtr scores = b::add(b::mul(product, b::cst(0.125, product)), b::expand(b::mul(m, m), product->shape));
  ir::Captured c = ir::capture({ir::matmul(decomp::softmax(scores, 3), v)}, Device::cpu());
  ir::Graph g;
  REQUIRE(sched::fuse_written_out_attention(c.graph, g));
  g.verify();
  CHECK(g.num_leaves() == c.graph.num_leaves());
  const ir::GraphNode& att = g.nodes[static_cast<std::size_t>(g.outputs[0])];
  REQUIRE(att.op == ir::Op::Attention);
  CHECK(att.attrs.scalar == 0.125);
  CHECK(g.nodes[static_cast<std::size_t>(att.inputs[3])].shape == Shape{1, 1, 12, 10});
  for (const auto& nd : g.nodes) CHECK(nd.op != ir::Op::MatMul);
  sched::StepPlan plan = sched::plan_steps(c.graph, false);
  REQUIRE(plan.attentions.size() == 1);
  CHECK(plan.calls.empty());
  const sched::Slot& mask = plan.attentions[0].mask;
  REQUIRE(mask.kind == sched::Slot::Temp);
  CHECK(plan.temps[static_cast<std::size_t>(mask.index)].shape == Shape{1, 1, 12, 10});
}

TEST_CASE("written-out attention the matcher refuses: logged with the reason, and still right") {
  Tensor q = input(kQ, 11), k = input({2, 3, 10, 8}, 12), v = input({2, 3, 10, 8}, 13);
  SUBCASE("rank 3 operands") {
    Tensor q3 = reshape(q, {6, 12, 8}), k3 = reshape(k, {6, 10, 8}), v3 = reshape(v, {6, 10, 8});
    Tensor out = matmul(softmax(matmul(q3, transpose(k3, -2, -1)) * 0.5, -1), v3);
    const std::string text = eval_logged({out});
    CHECK(has(text, "attention pattern: not fused: rank 3 operands"));
    CHECK(has(text, "call matmul"));
    check_close(out.to_vector<double>(), naive(q3, k3, v3, {}, 0.5));
  }
  SUBCASE("the weights are a second output") {
    Tensor w = softmax(matmul(q, transpose(k, -2, -1)) * 0.5, -1);
    Tensor out = matmul(w, v);
    const std::string text = eval_logged({out, w});
    CHECK(has(text, "attention pattern: not fused: the weights are read elsewhere"));
    CHECK(!has(text, "call attention"));
    check_close(out.to_vector<double>(), naive(q, k, v, {}, 0.5));
  }
  SUBCASE("a softmax over the queries' axis") {
    Tensor qs = input({2, 3, 10, 8}, 14);  // L = S, so the product is defined either way
    Tensor out = matmul(softmax(matmul(qs, transpose(k, -2, -1)) * 0.5, 2), v);
    CHECK(has(eval_logged({out}), "attention pattern: not fused: the softmax runs along axis 2"));
    Tensor want = matmul(softmax(matmul(qs, transpose(k, -2, -1)).to(f64) * 0.5, 2), v.to(f64));
    check_close(out.to_vector<double>(), want.to_vector<double>());
  }
  SUBCASE("ordinary products log nothing") {
    Tensor a = input({4, 6}, 15), b = input({6, 5}, 16);
    CHECK(!has(eval_logged({matmul(a * 2.0, b)}), "attention pattern"));
  }
}

TEST_CASE("written-out attention whose weights a backward reads stays written out; gradients right") {
  Tensor q = input(kQ, 21), k = input({2, 3, 10, 8}, 22), v = input({2, 3, 10, 8}, 23), cot = input(kQ, 24);
  auto loss = [&](const Tensor& qq) {
    return sum(matmul(softmax(matmul(qq, transpose(k, -2, -1)) * 0.125, -1), v) * cot);
  };
  auto fused_loss = [&](const Tensor& qq) {
    return sum(scaled_dot_product_attention(qq, k, v, {}, 0.0, false, 0.125) * cot);
  };
  std::vector<double> want = grad(fused_loss)(q)[0].to_vector<double>();
  SUBCASE("value and gradient in one graph: the backward reads the weights") {
    kiln::reset();
    kiln::testing::LogCapture log("schedule");
    auto [value, grads] = value_and_grad(loss)(q);
    CHECK(has(log.text(), "attention pattern: not fused: the weights are read elsewhere"));
    check_close(grads[0].to_vector<double>(), want);
  }
  SUBCASE("an eager forward keeps no weights (the backward recomputes them): fused") {
    Tensor qa = q.detach().requires_grad_();
    Tensor out = matmul(softmax(matmul(qa, transpose(k, -2, -1)) * 0.125, -1), v);
    CHECK(has(eval_logged({out}), "attention pattern: matched"));
    check_close(out.to_vector<double>(), naive(q, k, v, {}, 0.125));
    sum(out * cot).backward();
    check_close(qa.grad().to_vector<double>(), want);
  }
}

}  // namespace kiln_test_sched_attention_match
