// Graph IR: the text printer, the verifier catching bad graphs, structural hashing (equal for
// equal structure; different for different shapes, dtypes, strides, constants), common-
// subexpression elimination at capture, views of realized nodes, and the typed expressions'
// compile-time structural keys.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../support/reference.hpp"

namespace kiln_test_ir_ir {

using namespace kiln;
namespace kt = kiln::testing;

namespace {

ir::GraphNode gnode(ir::Op op, DType dt, Shape shape, std::vector<std::int32_t> inputs = {},
                    std::vector<std::int64_t> ints = {}) {
  ir::GraphNode n;
  n.op = op;
  n.dtype = dt;
  n.shape = std::move(shape);
  n.inputs = std::move(inputs);
  n.attrs.ints = std::move(ints);
  return n;
}

ir::Graph graph_of(std::vector<ir::GraphNode> nodes, std::int32_t output) {
  ir::Graph g;
  g.nodes = std::move(nodes);
  g.outputs = {output};
  g.output_strides = {contiguous_strides(g.nodes[output].shape)};
  g.rehash();
  return g;
}

std::size_t count_ops(const ir::Graph& g, ir::Op op) {
  std::size_t n = 0;
  for (auto& node : g.nodes) n += node.op == op;
  return n;
}

Tensor realized(std::vector<double> v, Shape s, DType dt = DType::Float32) {
  Tensor t = kt::make_tensor(v, s, dt);
  t.eval();
  return t;
}

}  // namespace

TEST_CASE("graph printer") {
  const Device cpu = Device::cpu();
  auto a = ir::iota(Shape{2, 3}, 1, DType::Float32, cpu);
  auto b = ir::constant(2.0, DType::Float32, Shape{2, 3}, cpu);
  auto c = ir::binary(ir::Op::Add, a, b);
  auto d = ir::reduce(ir::Op::ReduceSum, c, {1});
  ir::Captured cap = ir::capture({d}, cpu);
  CHECK(cap.graph.str() ==
        "%0 = iota([1]) : float32[2, 3]\n"
        "%1 = constant(2) : float32[2, 3]\n"
        "%2 = add(%0, %1) : float32[2, 3]\n"
        "%3 = sum(%2, [1]) : float32[2, 1]\n"
        "outputs: %3\n");
  // Inputs show their leaf number and strides; casts their target dtype.
  Tensor x = realized({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor y = transpose(x, 0, 1).to(DType::Float64) * 2.0;
  std::string s = ir::capture({y.node()}, x.device()).graph.str();
  CAPTURE(s);
  CHECK(s.find("%0 = input(#0) : float32[3, 2] strides [1, 3]") != std::string::npos);
  CHECK(s.find("cast<float64>(%0) : float64[3, 2]") != std::string::npos);
  CHECK(s.find("mul(") != std::string::npos);
  CHECK(s.find("outputs: %") != std::string::npos);
  // Random leaves show their seed (on the CPU an input: a kernel argument) and distribution.
  std::string r = ir::capture({randn({4}, 77, f32, x.device()).node()}, x.device()).graph.str();
  CAPTURE(r);
  CHECK(r.find(x.device().is_cpu() ? "seed from its input, normal" : "seed=77, normal") != std::string::npos);
}

TEST_CASE("verifier accepts captured graphs and catches bad ones") {
  Tensor x = realized({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor y = softmax(x * 2.0f, 0) + sum(exp(x), 1, true) - slice(concat({x, x}, 0), 0, 1, 3);
  CHECK_NOTHROW(ir::capture({y.node()}, x.device()).graph.verify());
  const DType f = DType::Float32;
  auto c23 = gnode(ir::Op::Constant, f, {2, 3});
  auto c3 = gnode(ir::Op::Constant, f, {3});
  auto bad = [](const ir::Graph& g, const std::string& what) {
    try {
      g.verify();
      FAIL_CHECK("the verifier accepted a graph with " << what);
    } catch (const Error& e) {
      std::string msg = e.what();
      CHECK_MESSAGE(msg.find("graph verifier") != std::string::npos, msg);
    }
  };
  bad(graph_of({c23, c3, gnode(ir::Op::Add, f, {2, 3}, {0, 1})}, 2), "binary inputs of different shapes");
  bad(graph_of({c23, gnode(ir::Op::Constant, DType::Int32, {2, 3}), gnode(ir::Op::Mul, f, {2, 3}, {0, 1})}, 2),
      "binary inputs of different dtypes");
  bad(graph_of({gnode(ir::Op::Exp, f, {2, 3}, {1}), c23}, 0), "a forward reference");
  bad(graph_of({c23, gnode(ir::Op::Exp, f, {3, 2}, {0})}, 1), "a unary op changing the shape");
  bad(graph_of({c23, gnode(ir::Op::Exp, DType::Float64, {2, 3}, {0})}, 1), "a unary op changing the dtype");
  bad(graph_of({c23, gnode(ir::Op::ReduceSum, f, {2, 3}, {0}, {1})}, 1), "a reduction keeping the reduced size");
  bad(graph_of({c23, gnode(ir::Op::ReduceSum, f, {2}, {0}, {1})}, 1), "a reduction dropping a dim");
  bad(graph_of({c23, c23, c23, gnode(ir::Op::Where, f, {2, 3}, {0, 1, 2})}, 3), "a non-bool where condition");
  bad(graph_of({c23, gnode(ir::Op::Exp, f, {2, 3}, {0, 0})}, 1), "a unary op with two inputs");
  bad(graph_of({gnode(ir::Op::Constant, f, {2, -3})}, 0), "a negative size");
  bad(graph_of({c23, gnode(ir::Op::Reshape, f, {7}, {0})}, 1), "a reshape changing the element count");
  bad(graph_of({gnode(ir::Op::Iota, f, {2, 3}, {}, {2})}, 0), "an iota axis out of range");
  auto in = gnode(ir::Op::Input, f, {2, 3});
  in.strides = {3};
  in.leaf = 0;
  bad(graph_of({in}, 0), "input strides of the wrong rank");
  ir::Graph g = graph_of({c23}, 0);
  g.outputs = {5};
  CHECK_THROWS_AS(g.verify(), Error);
}

TEST_CASE("structural hashes: equal structure equal; shapes, dtypes, strides, constants differ") {
  Tensor x1 = realized({1, 2, 3, 4, 5, 6}, {2, 3}), y1 = realized({6, 5, 4, 3, 2, 1}, {2, 3});
  Tensor x2 = realized({0, 0, 0, 0, 0, 0}, {2, 3}), y2 = realized({9, 9, 9, 9, 9, 9}, {2, 3});
  auto expr = [](const Tensor& a, const Tensor& b) -> Tensor { return softmax(exp(a) * 2.0f + b, -1); };
  Tensor e1 = expr(x1, y1), e2 = expr(x2, y2);
  // Node hashes are computed as the graph is built (hash-consing): no walk needed.
  CHECK(e1.node()->hash == e2.node()->hash);
  const Device dev = x1.device();
  auto key = [&](const Tensor& t) { return ir::capture({t.node()}, dev).graph.key; };
  CHECK(key(e1) == key(e2));
  // Different shape.
  Tensor x3 = realized({1, 2, 3, 4, 5, 6}, {3, 2}), y3 = realized({1, 2, 3, 4, 5, 6}, {3, 2});
  CHECK(expr(x3, y3).node()->hash != e1.node()->hash);
  CHECK(key(expr(x3, y3)) != key(e1));
  // Different dtype.
  Tensor x4 = realized({1, 2, 3, 4, 5, 6}, {2, 3}, DType::Float64),
         y4 = realized({1, 2, 3, 4, 5, 6}, {2, 3}, DType::Float64);
  CHECK(expr(x4, y4).node()->hash != e1.node()->hash);
  CHECK(key(expr(x4, y4)) != key(e1));
  // Different strides of an input with the same shape (a transposed view of a [3, 2] tensor).
  Tensor xt = transpose(x3, 0, 1);
  REQUIRE(xt.shape() == Shape{2, 3});
  CHECK(expr(xt, y1).node()->hash != e1.node()->hash);
  CHECK(key(expr(xt, y1)) != key(e1));
  // Different number: on the CPU a C++ number is a kernel argument, so `x * 2` and `x * 3` are
  // one structure (one kernel for every value); on CUDA numbers are literals and differ.
  Tensor c1 = x1 * 2.0f, c2 = x1 * 3.0f, c3 = x1 + 2.0f;
  const bool numbers_are_arguments = dev.is_cpu();
  CHECK((c1.node()->hash == c2.node()->hash) == numbers_are_arguments);
  CHECK((key(c1) == key(c2)) == numbers_are_arguments);
  CHECK(c1.node()->hash != c3.node()->hash);  // different op
  Tensor c1b = x2 * 2.0f;
  CHECK(c1.node()->hash == c1b.node()->hash);
  // Numbers that change the code stay literals everywhere: pow's exponent (x^2 is x * x).
  CHECK(Tensor(pow(x1, 2.0f)).node()->hash != Tensor(pow(x1, 3.0f)).node()->hash);
  // Constant nodes differ by value.
  auto scaled = [&](double v) {
    return ir::binary(ir::Op::Mul, x1.node(), ir::constant(v, DType::Float32, Shape{2, 3}, dev));
  };
  CHECK(scaled(2.0)->hash != scaled(3.0)->hash);
  CHECK(ir::capture({scaled(2.0)}, dev).graph.key != ir::capture({scaled(3.0)}, dev).graph.key);
  CHECK(scaled(2.0)->hash == scaled(2.0)->hash);
  // Different reduction axes, different random seeds.
  CHECK(sum(x1, 0).node()->hash != sum(x1, 1).node()->hash);
  // On the CPU a seed is a kernel argument, as numbers are: every seed is one structure (one
  // kernel); on CUDA it is still part of the code.
  if (dev.is_cpu()) {
    CHECK(rand({4}, 1, f32, dev).node()->hash == rand({4}, 2, f32, dev).node()->hash);
    CHECK(ir::capture({rand({4}, 1, f32, dev).node()}, dev).graph.key ==
          ir::capture({rand({4}, 2, f32, dev).node()}, dev).graph.key);
    CHECK(rand({4}, 1, f32, dev).node()->hash != randn({4}, 1, f32, dev).node()->hash);
  } else {
    CHECK(rand({4}, 1, f32, dev).node()->hash != rand({4}, 2, f32, dev).node()->hash);
  }
  CHECK(rand({4}, 1, f32, dev).node()->hash == rand({4}, 1, f32, dev).node()->hash);
  // The graph key covers the output layout too.
  ir::Graph g = ir::capture({e1.node()}, dev).graph;
  std::uint64_t before = g.key;
  g.output_strides[0] = {1, 2};
  g.rehash();
  CHECK(g.key != before);
}

TEST_CASE("capture merges repeated subexpressions (CSE)") {
  Tensor x = realized({1, 2, 3, 4}, {4}), y = realized({5, 6, 7, 8}, {4});
  const Device dev = x.device();
  // (x + y) * (x + y): the two additions are separate C++ objects but one graph node.
  Tensor sq = (x + y) * (x + y);
  ir::Graph g = ir::capture({sq.node()}, dev).graph;
  CHECK(count_ops(g, ir::Op::Add) == 1);
  CHECK(count_ops(g, ir::Op::Mul) == 1);
  CHECK(count_ops(g, ir::Op::Input) == 2);
  CHECK(g.nodes.size() == 4);
  KILN_CHECK_CLOSE(sq, std::vector<double>{36, 64, 100, 144});
  // exp(x) built twice, and equal constants built separately.
  auto three = [&] { return ir::constant(3.0, DType::Float32, Shape{4}, dev); };
  auto scaled_exp = [&] { return ir::binary(ir::Op::Mul, ir::unary(ir::Op::Exp, x.node()), three()); };
  ir::Graph ge = ir::capture({ir::binary(ir::Op::Add, scaled_exp(), scaled_exp())}, dev).graph;
  CHECK(count_ops(ge, ir::Op::Exp) == 1);
  CHECK(count_ops(ge, ir::Op::Mul) == 1);
  CHECK(count_ops(ge, ir::Op::Constant) == 1);
  // Through the front end the shared exp(x) merges too (the two numbers may be two arguments).
  Tensor e = exp(x) * 3.0f + exp(x) * 3.0f;
  CHECK(count_ops(ir::capture({e.node()}, dev).graph, ir::Op::Exp) == 1);
  KILN_CHECK_CLOSE(e, std::vector<double>{6 * std::exp(1.0), 6 * std::exp(2.0), 6 * std::exp(3.0), 6 * std::exp(4.0)});
  // Across several outputs of one evaluation.
  Tensor a = exp(x * y), b = sum(x * y);
  ir::Captured both = ir::capture({a.node(), b.node()}, dev);
  CHECK(count_ops(both.graph, ir::Op::Mul) == 1);
  CHECK(both.graph.outputs.size() == 2);
  // Leaves merge only when they are the same memory: equal layouts over different buffers
  // (or different offsets into one buffer) stay distinct.
  Tensor z = realized({1, 2, 3, 4}, {4});
  ir::Graph gz = ir::capture({Tensor(x + z).node()}, dev).graph;
  CHECK(count_ops(gz, ir::Op::Input) == 2);
  Tensor w = realized({1, 2, 3, 4, 5, 6, 7, 8}, {8});
  ir::Graph go = ir::capture({Tensor(slice(w, 0, 0, 4) + slice(w, 0, 4, 8)).node()}, dev).graph;
  CHECK(count_ops(go, ir::Op::Input) == 2);
  KILN_CHECK_CLOSE(slice(w, 0, 0, 4) + slice(w, 0, 4, 8), std::vector<double>{6, 8, 10, 12});
  ir::Graph gs = ir::capture({Tensor(slice(w, 0, 0, 4) * slice(w, 0, 0, 4)).node()}, dev).graph;
  CHECK(count_ops(gs, ir::Op::Input) == 1);
}

TEST_CASE("shape primitives on realized nodes become views; on lazy nodes, index-map nodes") {
  Tensor x = realized({1, 2, 3, 4, 5, 6}, {2, 3});
  const ir::NodePtr& n = x.node();
  auto r = ir::reshape(n, Shape{3, 2});
  CHECK(r->op == ir::Op::Input);
  CHECK(r->realized());
  CHECK(r->buffer->storage == n->buffer->storage);
  auto p = ir::permute(n, {1, 0});
  CHECK(p->realized());
  CHECK(p->buffer->strides == Strides{1, 3});
  auto s = ir::slice(n, 1, 1, 2, 1);
  CHECK(s->buffer->offset == n->buffer->offset + 1);
  auto b = ir::broadcast(ir::reshape(n, Shape{1, 2, 3}), Shape{4, 2, 3});
  CHECK(b->buffer->strides == Strides{0, 3, 1});
  Tensor lazy = x * 2.0f;
  CHECK(ir::reshape(lazy.node(), Shape{6})->op == ir::Op::Reshape);
  CHECK(ir::permute(lazy.node(), {1, 0})->op == ir::Op::Permute);
  CHECK(ir::slice(lazy.node(), 0, 0, 1, 1)->op == ir::Op::Slice);
  // Identity shape ops return their input.
  CHECK(ir::reshape(lazy.node(), Shape{2, 3}) == lazy.node());
  CHECK(ir::permute(lazy.node(), {0, 1}) == lazy.node());
  CHECK(ir::slice(lazy.node(), 1, 0, 3, 1) == lazy.node());
  // Constants stay constants under reshape/broadcast (no index map needed).
  auto c = ir::constant(1.5, DType::Float32, Shape{1, 3}, x.device());
  CHECK(ir::broadcast(c, Shape{4, 3})->op == ir::Op::Constant);
  CHECK(ir::reshape(c, Shape{3})->op == ir::Op::Constant);
}

TEST_CASE("capture folds shape ops of realized nodes recorded for gradients into leaf views") {
  // While gradients are recorded through x, its transpose and slice are nodes (the gradient
  // flows back through them); captured, they are leaves viewing x's storage, as the builders
  // make them when nothing is recorded. A permute of a lazy permute is one permute.
  Tensor x = realized({1, 2, 3, 4, 5, 6}, {2, 3});
  x.requires_grad_();
  ir::NodePtr t = ir::permute(x.node(), {1, 0});
  ir::NodePtr s = ir::slice(x.node(), 1, 1, 2, 1);
  REQUIRE(t->op == ir::Op::Permute);
  REQUIRE(s->op == ir::Op::Slice);
  CHECK(ir::permute(t, {1, 0}) == x.node());
  ir::NodePtr y = ir::binary(ir::Op::Mul, ir::reshape(t, Shape{6}), ir::reshape(t, Shape{6}));
  ir::Captured c = ir::capture({y, s}, x.device());
  CHECK(count_ops(c.graph, ir::Op::Permute) == 0);
  CHECK(count_ops(c.graph, ir::Op::Slice) == 0);
  REQUIRE(c.leaves.size() == 2);
  for (const ir::NodePtr& leaf : c.leaves) CHECK(leaf->buffer->storage == x.node()->buffer->storage);
  CHECK(c.leaves[0]->buffer->strides == Strides{1, 3});  // the transpose, read in place
  CHECK(c.leaves[1]->buffer->offset == x.node()->buffer->offset + 1);
  // The reshape of the transpose is not a view of it (its layout does not allow one): it stays.
  CHECK(count_ops(c.graph, ir::Op::Reshape) == 1);
  // Evaluated, the graph gives the values of the ops it folded.
  Tensor out(y);
  CHECK(out.to_vector<float>() == std::vector<float>{1, 16, 4, 25, 9, 36});
}

TEST_CASE("depth and node counts grow with the lazy graph and restart at realized nodes") {
  Tensor x = realized({1, 2}, {2});
  Tensor y = x;
  for (int i = 0; i < 10; ++i) y = y + 1.0f;
  CHECK(y.node()->depth == 10);  // the longest path from a leaf (the constants are leaves too)
  CHECK(y.node()->count >= 11);
  y.eval();
  Tensor z = y * 2.0f;
  CHECK(z.node()->depth == 1);
}

TEST_CASE("typed expressions carry a compile-time structural key") {
  using T = Tensor;
  using Add = decltype(std::declval<T>() + std::declval<T>());
  using Sub = decltype(std::declval<T>() - std::declval<T>());
  using MulF = decltype(std::declval<T>() * 2.0f);
  using MulD = decltype(std::declval<T>() * 2.0);
  using MulI = decltype(std::declval<T>() * 2);
  using Nested = decltype(exp(std::declval<T>() + std::declval<T>()) * 2.0f);
  using Nested2 = decltype(log(std::declval<T>() + std::declval<T>()) * 2.0f);
  static_assert(Add::kStructKey != Sub::kStructKey);
  static_assert(MulF::kStructKey == MulD::kStructKey);  // both floating numbers
  static_assert(MulF::kStructKey != MulI::kStructKey);
  static_assert(Nested::kStructKey != Nested2::kStructKey);
  constexpr std::uint64_t k = Nested::kStructKey;  // usable in constant expressions
  CHECK(k != 0);
  // Typed expressions keep no graph nodes of their own: building one allocates no node.
  Tensor x = realized({1, 2}, {2});
  long before = x.node().use_count();
  auto e = exp(x + x) * 2.0f;
  CHECK(x.node().use_count() == before + 2);  // two leaf handles held by value, nothing else
  Tensor t = e;
  KILN_CHECK_CLOSE(t, std::vector<double>{2 * std::exp(2.0), 2 * std::exp(4.0)});
}

}  // namespace kiln_test_ir_ir
