// The step planner: graphs with matrix products become segments of generated kernels and
// library calls. Which values are written to memory for a later step, which leaves a call
// reads through their strides, and which epilogues join a cuBLASLt call (bias, relu,
// tanh-gelu) and which cannot (a product read twice, a bias computed from the product).
#include <doctest/doctest.h>

#include "../support/ir_build.hpp"
#include "../support/mlp_block.hpp"
#include "kiln/sched/steps.hpp"

namespace kiln_test_sched_steps {

using namespace kiln_ir_build;
using kiln::sched::Activation;
using kiln::sched::Slot;
using kiln::sched::Step;

namespace {

kiln::sched::StepPlan plan_of(const std::vector<NodePtr>& roots, bool fuse) {
  return kiln::sched::plan_steps(ir::capture(roots, Device::cpu()).graph, fuse);
}

NodePtr bias_rows(const NodePtr& b, std::int64_t m) {
  return ir::broadcast(ir::reshape(b, Shape{1, b->shape[0]}), Shape{m, b->shape[0]});
}

int count(const kiln::sched::StepPlan& p, Step::Kind k) {
  int n = 0;
  for (auto& s : p.order) n += s.kind == k;
  return n;
}

}  // namespace

TEST_CASE("a product's epilogue is one segment on the host and joins the call for cuBLASLt") {
  NodePtr x = input({8, 4}, f32, 1), w = input({4, 6}, f32, 2), b = input({6}, f32, 3);
  NodePtr y = decomp::relu(add(ir::matmul(x, w), bias_rows(b, 8)));
  auto host = plan_of({y}, false);
  REQUIRE(host.calls.size() == 1);
  CHECK(count(host, Step::Kernels) == 1);
  CHECK(host.order[0].kind == Step::Call);    // the call first, its epilogue after
  CHECK(host.calls[0].a.kind == Slot::Leaf);  // leaves are read where they are
  CHECK(host.calls[0].out.kind == Slot::Temp);
  auto gpu = plan_of({y}, true);
  REQUIRE(gpu.calls.size() == 1);
  CHECK(gpu.segments.empty());
  CHECK(gpu.calls[0].bias);
  CHECK(gpu.calls[0].activation == Activation::Relu);
  CHECK(gpu.calls[0].out.kind == Slot::Output);  // written straight into the result
  // tanh-gelu in bfloat16 (its decomposition computes in float32 between casts).
  NodePtr xb = input({8, 4}, bf16, 4), wb = input({6, 4}, bf16, 5), bb = input({6}, bf16, 6);
  auto g = plan_of({decomp::gelu(add(ir::matmul(xb, ir::permute(wb, {1, 0})), bias_rows(bb, 8)), true)}, true);
  REQUIRE(g.calls.size() == 1);
  CHECK(g.calls[0].activation == Activation::GeluTanh);
  CHECK(g.calls[0].bias);
  CHECK(g.segments.empty());
  // The exact (erf) gelu is not what cuBLASLt computes: it stays a kernel.
  auto erf = plan_of({decomp::gelu(ir::matmul(xb, ir::permute(wb, {1, 0})), false)}, true);
  CHECK(erf.calls[0].activation == Activation::None);
  CHECK(erf.segments.size() == 1);
}

TEST_CASE("what cannot join a call: a product read twice, a bias from the product, batches") {
  NodePtr x = input({8, 4}, f32, 1), w = input({4, 6}, f32, 2), b = input({6}, f32, 3);
  NodePtr p = ir::matmul(x, w);
  auto twice = plan_of({decomp::relu(add(p, bias_rows(b, 8))), p}, true);
  CHECK(!twice.calls[0].bias);
  CHECK(twice.calls[0].activation == Activation::None);
  CHECK(twice.segments.size() == 1);
  // A bias computed from the product itself is not known before the call.
  NodePtr from_p = ir::reshape(ir::reduce(Op::ReduceSum, p, {0}), Shape{6});
  auto late = plan_of({add(p, bias_rows(from_p, 8))}, true);
  CHECK(!late.calls[0].bias);
  // Batched products keep their epilogue in a kernel.
  NodePtr xs = input({3, 8, 4}, f32, 7), ws = input({3, 4, 6}, f32, 8);
  auto batched = plan_of({decomp::relu(ir::matmul(xs, ws))}, true);
  CHECK(batched.calls[0].activation == Activation::None);
}

TEST_CASE("chained products: operands written by the segment of their level, cheap values recomputed") {
  NodePtr x = input({8, 4}, f32, 1), w1 = input({4, 16}, f32, 2), w2 = input({16, 4}, f32, 3);
  NodePtr h = ir::unary(Op::Tanh, ir::matmul(mul(x, cst(2.0, x)), w1));
  NodePtr y = add(ir::matmul(h, w2), mul(x, cst(3.0, x)));  // x * 3: recomputed from x, not stored
  auto p = plan_of({y}, false);
  REQUIRE(p.calls.size() == 2);
  // Steps: the scaled x (an operand), call 1, tanh (an operand), call 2, the residual add.
  REQUIRE(p.order.size() == 5);
  CHECK(p.order[0].kind == Step::Kernels);
  CHECK(p.order[1].kind == Step::Call);
  CHECK(p.order[2].kind == Step::Kernels);
  CHECK(p.order[3].kind == Step::Call);
  CHECK(p.order[4].kind == Step::Kernels);
  CHECK(p.calls[0].a.kind == Slot::Temp);
  CHECK(p.calls[1].a.kind == Slot::Temp);
  const auto& last = p.segments[static_cast<std::size_t>(p.order[4].index)];
  for (const Slot& leaf : last.leaves) CHECK((leaf.kind != Slot::Temp || leaf.index == p.calls[1].out.index));
  // A product of a product reads the first call's result where it was written: no copy.
  NodePtr y2 = ir::matmul(ir::matmul(x, w1), w2);
  auto direct = plan_of({y2}, false);
  CHECK(direct.segments.empty());
  CHECK(direct.calls[1].a == direct.calls[0].out);
  // Also with an epilogue in the first call (the MLP's gelu on the GPU).
  NodePtr b1 = input({16}, f32, 9);
  auto mlp = plan_of({ir::matmul(decomp::gelu(add(ir::matmul(x, w1), bias_rows(b1, 8)), true), w2)}, true);
  CHECK(mlp.segments.empty());
  CHECK(mlp.calls[0].activation == Activation::GeluTanh);
  CHECK(mlp.calls[1].a == mlp.calls[0].out);
  // A leaf the library cannot read through its strides (every other column) is copied first.
  NodePtr wide = input({4, 12}, f32, 4);
  NodePtr cols = ir::slice(wide, 1, 0, 6, 2);
  auto copied = plan_of({ir::matmul(x, cols)}, false);
  CHECK(copied.calls[0].b.kind == Slot::Temp);
  CHECK(count(copied, Step::Kernels) == 1);
  // An empty inner dim is no call: a zero constant.
  auto empty = plan_of({ir::matmul(input({3, 0}, f32, 5), input({0, 2}, f32, 6))}, false);
  CHECK(empty.calls.empty());
  CHECK(empty.segments.size() == 1);
}

TEST_CASE("a cast of an operand the CPU call reads in place is folded into the call") {
  NodePtr x = input({8, 4}, f32, 1), w = input({4, 6}, bf16, 2), d = input({6, 3}, f64, 3);
  // x.to(bf16) @ w: the call packs x through the cast; no kernel before it.
  auto folded = plan_of({ir::matmul(ir::cast(x, bf16), w)}, false);
  REQUIRE(folded.calls.size() == 1);
  CHECK(folded.segments.empty());
  CHECK(folded.calls[0].a.kind == Slot::Leaf);
  CHECK(folded.calls[0].a_from == f32);
  CHECK(!folded.calls[0].b_from);
  // A product's result cast for the next product: read where the first call wrote it.
  auto chained = plan_of({ir::matmul(ir::cast(ir::matmul(x, ir::cast(w, f32)), f64), d)}, false);
  REQUIRE(chained.calls.size() == 2);
  CHECK(chained.segments.empty());
  CHECK(chained.calls[0].b_from == bf16);
  CHECK(chained.calls[1].a == chained.calls[0].out);
  CHECK(chained.calls[1].a_from == f32);
  // A cast of a computed value runs in the segment that writes the operand.
  auto computed = plan_of({ir::matmul(ir::cast(mul(x, cst(2.0, x)), bf16), w)}, false);
  CHECK(!computed.calls[0].a_from);
  CHECK(computed.calls[0].a.kind == Slot::Temp);
  // cuBLASLt reads one dtype: on the GPU the cast is a kernel's.
  auto gpu = kiln::sched::plan_steps(ir::capture({ir::matmul(ir::cast(x, bf16), w)}, Device::cuda(0)).graph, true);
  CHECK(!gpu.calls[0].a_from);
  CHECK(gpu.segments.size() == 1);
}

TEST_CASE("a residual stream is stored once per level, not recomputed from every earlier layer") {
  // x_l = x_{l-1} + tanh(x_{l-1}) @ w_l: without storing x_l, level l's segment would read x0
  // and every earlier product again (quadratic in the depth).
  NodePtr x = input({8, 4}, f32, 1);
  for (unsigned l = 0; l < 6; ++l) x = add(x, ir::matmul(ir::unary(Op::Tanh, x), input({4, 4}, f32, 10 + l)));
  auto p = plan_of({ir::unary(Op::Tanh, x)}, false);
  REQUIRE(p.calls.size() == 6);
  // A value that would read three stored values is stored; two are recomputed (an add is as
  // cheap as the load it saves), so a segment reads at most three, at any depth.
  for (const auto& seg : p.segments) CHECK(seg.leaves.size() <= 3);
  // A sum of three leaves that one later segment reads, and nothing of its own level: storing
  // it would read the same leaves in a kernel of its own and add a write, so it is recomputed.
  NodePtr a = input({8, 4}, f32, 20), b = input({8, 4}, f32, 21), c = input({8, 4}, f32, 22);
  auto once = plan_of({add(ir::matmul(a, input({4, 4}, f32, 23)), add(add(a, b), c))}, false);
  REQUIRE(once.segments.size() == 1);
  CHECK(once.segments[0].leaves.size() == 4);  // the product's result and a, b, c
}

TEST_CASE("a product returned as a reshape of itself is written into the output") {
  NodePtr x = input({8, 4}, f32, 1), w = input({4, 6}, f32, 2);
  auto p = plan_of({ir::reshape(ir::matmul(x, w), Shape{2, 4, 6})}, false);
  REQUIRE(p.calls.size() == 1);
  CHECK(p.segments.empty());
  CHECK(p.calls[0].out.kind == Slot::Output);
  CHECK(p.calls[0].out.strides == Strides{6, 1});
}

TEST_CASE("an output that only reshapes a value its segment computes is that value, stored by the kernel computing it") {
  // z = tanh(xw seen as [2, 4, 6] + c), returned as [8, 6] and, doubled, as [2, 4, 6]: the
  // segment writes z itself into the first output's memory (same elements, same order), so one
  // kernel over [2, 4, 6] stores both; as a reshape, the [8, 6] output was a kernel of its own.
  NodePtr x = input({8, 4}, f32, 1), w = input({4, 6}, f32, 2), c = input({2, 4, 6}, f32, 3);
  NodePtr z = ir::unary(Op::Tanh, add(ir::reshape(ir::matmul(x, w), Shape{2, 4, 6}), c));
  for (bool fuse : {false, true}) {
    auto p = plan_of({ir::reshape(z, Shape{8, 6}), add(z, z)}, fuse);
    REQUIRE(p.segments.size() == 1);
    const auto& seg = p.segments[0];
    REQUIRE(seg.outputs.size() == 2);
    for (std::size_t k = 0; k < seg.outputs.size(); ++k) {
      CHECK(seg.outputs[k].kind == Slot::Output);
      CHECK(seg.graph.nodes[static_cast<std::size_t>(seg.graph.outputs[k])].op != Op::Reshape);
      CHECK(seg.graph.output_strides[k] == Strides{24, 6, 1});
    }
    CHECK(kiln::sched::schedule(seg.graph).kernels.size() == 1);
  }
}

TEST_CASE("a product's operand that only reshapes a value its segment computes is stored by the kernel computing it") {
  // An MLP's gelu as the model writes it: h = xw seen as [2, 4, 6] plus c, z = tanh(h); h is
  // kept ([2, 4, 6], as a forward keeps a gelu's input) and z goes to the next product as
  // [8, 6]. The temporary the product reads holds z's elements in z's order, so the kernel over
  // [2, 4, 6] that stores h stores z too; as a reshape it was a second kernel over [8, 6] that
  // read the first product's result again.
  NodePtr x = input({8, 4}, f32, 1), w = input({4, 6}, f32, 2), c = input({2, 4, 6}, f32, 3);
  NodePtr w2 = input({6, 3}, f32, 4);
  NodePtr h = add(ir::reshape(ir::matmul(x, w), Shape{2, 4, 6}), c);
  NodePtr z = ir::unary(Op::Tanh, h);
  for (bool fuse : {false, true}) {
    auto p = plan_of({ir::matmul(ir::reshape(z, Shape{8, 6}), w2), h}, fuse);
    REQUIRE(p.calls.size() == 2);
    REQUIRE(p.segments.size() == 1);
    const auto& seg = p.segments[0];
    REQUIRE(seg.outputs.size() == 2);
    for (std::size_t k = 0; k < seg.outputs.size(); ++k) {
      CHECK(seg.graph.nodes[static_cast<std::size_t>(seg.graph.outputs[k])].op != Op::Reshape);
      CHECK(seg.graph.output_strides[k] == Strides{24, 6, 1});
    }
    CHECK(kiln::sched::schedule(seg.graph).kernels.size() == 1);
    // The product reads the temporary as [8, 6].
    const auto& second = p.calls[1];
    CHECK(second.a.kind == Slot::Temp);
    CHECK(second.a.strides == Strides{6, 1});
  }
}

TEST_CASE("a product's operand that reshapes a value an earlier segment stores reads it in place, not a copy") {
  // A backward's layer-norm output [B, T, C], computed in its first segment from the forward's
  // saved values and read by a later weight gradient as [B*T, C]: here z = a + b + c over
  // [2, 4, 6] (three stored values: too much to recompute later), read as [8, 6] by a product
  // of level 2. The segment of level 0 stores z once and the product reads that memory; it was
  // stored there and then copied, reshaped, by a second segment just before the product.
  NodePtr a = input({2, 4, 6}, f32, 1), b = input({2, 4, 6}, f32, 2), c = input({2, 4, 6}, f32, 3);
  NodePtr x = input({8, 4}, f32, 4), w = input({4, 8}, f32, 5);
  NodePtr z = add(add(a, b), c);
  auto p = plan_of({ir::matmul(ir::matmul(x, w), ir::reshape(z, Shape{8, 6}))}, false);
  REQUIRE(p.calls.size() == 2);
  REQUIRE(p.segments.size() == 1);
  CHECK(p.segments[0].outputs.size() == 1);
  CHECK(p.order[0].kind == Step::Kernels);
  CHECK(p.calls[1].b.kind == p.segments[0].outputs[0].kind);
  CHECK(p.calls[1].b.index == p.segments[0].outputs[0].index);
  CHECK(p.calls[1].b.strides == Strides{6, 1});
}

TEST_CASE("a cast of a transposed operand is stored in its source's order for cuBLASLt") {
  // The tied head: logits = x @ cast(wte^T); a row-major copy of wte^T would be a scattered write.
  NodePtr x = input({8, 4}, bf16, 1), table = input({6, 4}, f32, 2);
  NodePtr strided = input({4, 6}, f32, 3, Strides{1, 4});  // a transposed view of a [6, 4] leaf
  for (const NodePtr& wt : {ir::permute(table, {1, 0}), strided}) {
    auto p = kiln::sched::plan_steps(ir::capture({ir::matmul(x, ir::cast(wt, bf16))}, Device::cuda(0)).graph, true);
    REQUIRE(p.calls.size() == 1);
    CHECK(p.calls[0].b.kind == Slot::Temp);
    CHECK(p.calls[0].b.strides == Strides{1, 4});
    // Its transpose back (the backward's operand) reads the same memory.
    NodePtr dlogits = input({8, 6}, bf16, 4);
    std::vector<NodePtr> roots{ir::matmul(x, ir::cast(wt, bf16)),
                               ir::matmul(dlogits, ir::permute(ir::cast(wt, bf16), {1, 0}))};
    auto both = kiln::sched::plan_steps(ir::capture(roots, Device::cuda(0)).graph, true);
    REQUIRE(both.calls.size() == 2);
    CHECK(both.calls[1].b.index == both.calls[0].b.index);
    CHECK(both.calls[1].b.strides == Strides{4, 1});
  }
}

TEST_CASE("a scatter reads a broadcast index through strides: one index per row, sorted by runs on the GPU") {
  // An embedding's gradient with a computed index: scatter_add of [6, 4] rows into a [10, 4]
  // table by ids + 0 broadcast over the columns. Stored whole, the index would hold one copy
  // per column and the kernel could not tell it is one per row.
  NodePtr ids = ir::binary(Op::Add, input({6}, i64, 1), ir::constant(0.0, i64, Shape{6}, Device::cpu()));
  NodePtr rows = ir::broadcast(ir::reshape(ids, Shape{6, 1}), Shape{6, 4});
  NodePtr table = ir::constant(0.0, f32, Shape{10, 4}, Device::cpu());
  NodePtr g = ir::scatter(table, rows, input({6, 4}, f32, 2), 0, true, false, ir::GatherSite::Embedding);
  for (const Device dev : {Device::cpu(), Device::cuda(0)}) {
    auto p = kiln::sched::plan_steps(ir::capture({g}, dev).graph, dev.is_cuda());
    REQUIRE(p.scatters.size() == 1);
    CHECK(p.scatters[0].index.kind == Slot::Temp);
    CHECK(p.scatters[0].index.strides == Strides{1, 0});
    CHECK(p.temps[static_cast<std::size_t>(p.scatters[0].index.index)].shape == Shape{6});
    CHECK(p.scatters[0].sorted_runs == dev.is_cuda());
  }
}

namespace {

/// Whether a segment of `p` evaluates `op` (a GELU or its derivative left to a kernel).
bool segments_compute(const kiln::sched::StepPlan& p, Op op) {
  for (const auto& seg : p.segments)
    for (const auto& n : seg.graph.nodes)
      if (n.op == op) return true;
  return false;
}

}  // namespace

TEST_CASE("a GELU's gradient is cuBLASLt's DGELU on the next product, reading the input the forward call kept") {
  // Forward: the first product's bias and tanh-GELU join its call, which also stores the GELU's
  // input (GELU_AUX_BIAS) because the backward reads it; over sequences, through the reshape
  // that splits the product's rows. Backward: the product that makes the
  // gradient of the GELU's output (dy @ W2) multiplies by the GELU's derivative at that input in
  // its epilogue (DGELU). No kernel evaluates the GELU or its derivative (both need a tanh or an
  // exp); what is left to kernels is the two bias gradients' column sums.
  for (bool sequences : {false, true}) {
    CAPTURE(sequences);
    auto p = plan_of(mlp_block_with_gradients(32, sequences), true);
    REQUIRE(p.calls.size() == 6);
    const kiln::sched::LibraryCall* forward = nullptr;
    const kiln::sched::LibraryCall* gradient = nullptr;
    for (const auto& c : p.calls) {
      if (c.activation == Activation::GeluTanh) forward = &c;
      if (c.activation == Activation::GeluTanhGrad) gradient = &c;
    }
    REQUIRE(forward != nullptr);
    REQUIRE(gradient != nullptr);
    CHECK(forward->bias);
    CHECK(forward->aux >= 0);
    CHECK(forward->aux_slot.kind == Slot::Temp);
    CHECK(forward->aux_slot.strides == Strides{32, 1});
    CHECK(gradient->aux == forward->aux);  // the same node, read where the forward's call put it
    CHECK(gradient->aux_slot.kind == forward->aux_slot.kind);  // the same memory ([2, 8, 32] or [16, 32])
  CHECK(gradient->aux_slot.index == forward->aux_slot.index);
    CHECK(!gradient->bias);
    CHECK(gradient->level > forward->level);
    CHECK(!segments_compute(p, Op::Tanh));
    CHECK(!segments_compute(p, Op::Exp));
    int kernels = 0;
    for (const Step& st : p.order) kernels += st.kind == Step::Kernels;
    CHECK(kernels <= 2);
    CHECK(p.str().find("gelu(tanh) gradient at tmp") != std::string::npos);
    int biased = 0;  // the second linear's bias joins its call too
    for (const auto& c : p.calls) biased += c.bias;
    CHECK(biased == 2);
  }
  // Without them (KILN_CUBLASLT_TRAINING_EPILOGUES=0) the GELU and its derivative are
  // kernels, and over sequences the biases too (the split hides them), as before.
  for (bool sequences : {false, true}) {
    auto off =
        kiln::sched::plan_steps(ir::capture(mlp_block_with_gradients(32, sequences), Device::cpu()).graph, true, false);
    int biased = 0;
    for (const auto& c : off.calls) {
      CHECK(c.aux < 0);
      biased += c.bias;
    }
    CHECK(biased == (sequences ? 0 : 2));  // on plain rows both biases join their calls, as before
    CHECK(segments_compute(off, Op::Tanh));
  }
  // The host plan keeps every epilogue in kernels, as before.
  auto host = plan_of(mlp_block_with_gradients(32), false);
  for (const auto& c : host.calls) {
    CHECK(c.activation == Activation::None);
    CHECK(c.aux < 0);
  }
  // A hidden width that is no multiple of 8 cannot be cuBLASLt's auxiliary matrix: the GELU and
  // its derivative stay in kernels.
  auto odd = plan_of(mlp_block_with_gradients(36), true);
  for (const auto& c : odd.calls) CHECK(c.aux < 0);
  CHECK(segments_compute(odd, Op::Tanh));
}

TEST_CASE("the derivative joins a product reading a saved input, not one whose product is read elsewhere too") {
  // A compiled backward: the GELU's input is a leaf (the forward saved it), read in place.
  NodePtr saved = input({16, 8}, bf16, 1), w = input({8, 8}, bf16, 2), dy = input({16, 8}, bf16, 3);
  NodePtr dh = ir::matmul(dy, w);
  NodePtr dpre = ir::cast(decomp::gelu_backward(saved, dh, true), bf16);
  auto alone = plan_of({dpre}, true);
  REQUIRE(alone.calls.size() == 1);
  CHECK(alone.calls[0].activation == Activation::GeluTanhGrad);
  CHECK(alone.calls[0].aux_slot.kind == Slot::Leaf);
  CHECK(alone.calls[0].out.kind == Slot::Output);
  CHECK(alone.segments.empty());
  // dh itself returned as well: the call cannot replace it by dh * gelu'(x).
  auto both = plan_of({dpre, dh}, true);
  CHECK(both.calls[0].activation == Activation::None);
  CHECK(segments_compute(both, Op::Tanh));
  // Over sequences (a compiled transformer's backward): the saved input is [2, 8, 8] and the
  // product's rows are split back into it; the call reads the leaf and writes [16, 8] rows.
  NodePtr saved3 = input({2, 8, 8}, bf16, 5);
  NodePtr dh3 = ir::reshape(ir::matmul(dy, w), Shape{2, 8, 8});
  auto split = plan_of({ir::cast(decomp::gelu_backward(saved3, dh3, true), bf16)}, true);
  REQUIRE(split.calls.size() == 1);
  CHECK(split.calls[0].activation == Activation::GeluTanhGrad);
  CHECK(split.calls[0].aux_slot.kind == Slot::Leaf);
  CHECK(split.calls[0].out.strides == Strides{8, 1});
  CHECK(split.segments.empty());
  // A saved input read through strides (a transposed view) is no auxiliary matrix.
  NodePtr strided = input({16, 8}, bf16, 4, Strides{1, 16});
  auto transposed = plan_of({ir::cast(decomp::gelu_backward(strided, dh, true), bf16)}, true);
  CHECK(transposed.calls[0].activation == Activation::None);
}

TEST_CASE("a value only products read is stored just before the first of them, not where it can first be computed") {
  // A backward's weight-gradient operands (a layer's normalised input, its gelu) are all
  // computable from the start but read one layer at a time: stored at once, every layer's
  // would be held through the whole step. Here tanh(y_l) is read only by the product of level
  // l + 1: the segment of level l stores it, one a segment, and none runs before the first call.
  NodePtr a = input({8, 4}, f32, 1);
  std::vector<NodePtr> roots;
  for (unsigned l = 1; l <= 3; ++l) {
    a = ir::matmul(a, input({4, 4}, f32, 10 + l));                               // level l
    roots.push_back(ir::matmul(a, ir::unary(Op::Tanh, input({4, 5}, f32, 20 + l))));  // level l + 1
  }
  auto p = plan_of(roots, false);
  REQUIRE(p.calls.size() == 6);
  REQUIRE(p.segments.size() == 3);
  CHECK(p.order[0].kind == Step::Call);
  for (const auto& seg : p.segments) {
    CHECK(seg.outputs.size() == 1);
    CHECK(seg.leaves.size() == 1);  // y_l alone
  }
  // Each is written after the call of its level and before the call reading it.
  int written = 0;
  for (const Step& st : p.order) {
    if (st.kind == Step::Kernels) ++written;
    if (st.kind == Step::Call) {
      const auto& c = p.calls[static_cast<std::size_t>(st.index)];
      if (c.b.kind == Slot::Temp) CHECK(written >= 1);
    }
  }
  CHECK(written == 3);
}

TEST_CASE("a donated leaf's last reader writes a later value of its size over it, after every other kernel reading it") {
  // A loss over logits L and the gradient of L for a product (a backward's start): the row
  // statistics and the picked logit read L; exp(L - lse) * sum(lse) is read by the product only. With L
  // donated (nothing reads it after this run), that gradient is written into L's memory, by a
  // kernel that runs after every other kernel reading L; a leaf a later step still reads, or one
  // not donated, keeps a temporary.
  NodePtr L = input({8, 16}, f32, 1), t = input_values<std::int64_t>({8, 1}, {3, 0, 15, 7, 7, 2, 9, 11});
  NodePtr x = input({8, 4}, f32, 2);
  NodePtr m = red(Op::ReduceMax, L, {1});
  NodePtr lse = add(un(Op::Log, red(Op::ReduceSum, un(Op::Exp, sub(L, expand(m, {8, 16}))), {1})), m);
  NodePtr loss = red(Op::ReduceSum, sub(lse, ir::gather(L, t, 1, ir::GatherSite::CrossEntropy)), {0, 1});
  // Scaled by a sum over all rows (as cross_entropy's gradient by its count of targets): written
  // by a pointwise kernel of its own, once every row is reduced.
  NodePtr grad = mul(un(Op::Exp, sub(L, expand(lse, {8, 16}))), expand(red(Op::ReduceSum, lse, {0, 1}), {8, 16}));
  NodePtr dw = ir::matmul(permute(x, {1, 0}), grad);
  auto plan_with = [&](std::vector<NodePtr> roots, bool donate) {
    ir::Captured c = ir::capture(roots, Device::cpu());
    std::int32_t logits = -1;
    for (std::size_t l = 0; l < c.leaves.size(); ++l)
      if (c.leaves[l] == L) logits = static_cast<std::int32_t>(l);
    REQUIRE(logits >= 0);
    if (donate) c.graph.donated = {logits};
    c.graph.rehash();
    return std::make_pair(kiln::sched::plan_steps(c.graph, false), logits);
  };
  auto [p, logits] = plan_with({loss, dw}, true);
  REQUIRE(p.calls.size() == 1);
  CHECK(p.calls[0].b.kind == Slot::Leaf);  // the product reads the gradient from L's memory
  CHECK(p.calls[0].b.index == logits);
  CHECK(p.temps.empty() == false);  // the temporary is planned but no step uses it
  for (const Step& st : p.order) CHECK(p.temps_of(st).empty());
  REQUIRE(p.segments.size() == 1);
  const ir::Graph& seg = p.segments[0].graph;
  REQUIRE(seg.overwrites.size() == 1);
  const kiln::sched::Schedule s = kiln::sched::schedule(seg);
  const int out = seg.overwrites[0].first;
  int writer = -1, last_reader = -1;
  for (std::size_t k = 0; k < s.kernels.size(); ++k)
    for (const auto& st : s.kernels[k].stores)
      for (const auto& target : st.targets)
        if (target.kind == kiln::sched::Location::Output && target.index == out) writer = static_cast<int>(k);
  REQUIRE(writer >= 0);
  // The kernels reducing L (the statistics, the pick) run before the writer, a pointwise one.
  CHECK(s.kernels[static_cast<std::size_t>(writer)].kind == kiln::sched::KernelKind::Pointwise);
  for (std::size_t k = 0; k < s.kernels.size(); ++k)
    if (static_cast<int>(k) != writer && s.kernels[k].kind == kiln::sched::KernelKind::Reduce)
      last_reader = std::max(last_reader, static_cast<int>(k));
  CHECK(last_reader >= 0);
  CHECK(writer > last_reader);

  // Not donated: a temporary.
  auto [kept, l2] = plan_with({loss, dw}, false);
  CHECK(kept.calls[0].b.kind == Slot::Temp);
  // Read by a later step too (a second product reads L itself): a temporary.
  auto [later, l3] = plan_with({loss, dw, ir::matmul(permute(x, {1, 0}), L)}, true);
  for (const auto& c : later.calls)
    if (c.b.kind == Slot::Leaf) CHECK(c.b.index == l3);  // only L itself, read in place
}

}  // namespace kiln_test_sched_steps
