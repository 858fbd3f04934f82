// The fusion scheduler on its own: which kernels a graph becomes, how their loops are
// planned, and what lives in memory between them. No code is generated or compiled here.
#include <doctest/doctest.h>

#include "kiln/ir/builder.hpp"
#include "kiln/ir/graph.hpp"
#include "kiln/runtime/host_allocator.hpp"
#include "kiln/sched/schedule.hpp"

namespace kiln_test_sched_schedule {

using namespace kiln;
using ir::NodePtr;
using ir::Op;

namespace {

NodePtr leaf(const Shape& shape, DType dt = f32, Strides strides = {}, std::int64_t alloc = -1) {
  if (strides.empty()) strides = contiguous_strides(shape);
  if (alloc < 0) alloc = shape.numel();
  auto st = runtime::allocate_host(static_cast<std::size_t>(std::max<std::int64_t>(1, alloc)) * itemsize(dt));
  return ir::input(ir::BufferView{st, 0, std::move(strides)}, shape, dt, Device::cpu());
}
NodePtr cst(double v, const NodePtr& like) { return ir::constant(v, like->dtype, like->shape, Device::cpu()); }
NodePtr bin(Op op, const NodePtr& a, const NodePtr& b) { return ir::binary(op, a, b); }
NodePtr red(Op op, const NodePtr& a, std::vector<std::int64_t> axes) { return ir::reduce(op, a, std::move(axes)); }
NodePtr softmax(const NodePtr& x, std::int64_t axis) {
  NodePtr e = ir::unary(Op::Exp, bin(Op::Sub, x, ir::broadcast(red(Op::ReduceMax, x, {axis}), x->shape)));
  return bin(Op::Div, e, ir::broadcast(red(Op::ReduceSum, e, {axis}), x->shape));
}

struct Sched {
  ir::Captured c;
  sched::Schedule s;
};
Sched plan(const std::vector<NodePtr>& roots) {
  Sched r{ir::capture(roots, Device::cpu()), {}};
  r.s = sched::schedule(r.c.graph);
  return r;
}

}  // namespace

TEST_CASE("sched: pointwise chains, broadcasts and index maps are one loop nest") {
  NodePtr x = leaf({64, 32}), mu = leaf({64, 1}), w = leaf({32});
  NodePtr y =
      bin(Op::Mul, bin(Op::Sub, x, ir::broadcast(mu, x->shape)), ir::broadcast(ir::reshape(w, {1, 32}), x->shape));
  auto r = plan({ir::permute(ir::unary(Op::Exp, y), {1, 0})});
  REQUIRE(r.s.kernels.size() == 1);
  const sched::Kernel& k = r.s.kernels[0];
  CHECK(k.kind == sched::KernelKind::Pointwise);
  CHECK(r.s.temps.empty());
  CHECK(k.loops.groups.size() == 2);
  // A transposed sum of two inputs: two reads move along output dim 0 with unit stride, one
  // write along dim 1, so dim 0 is the inner (vectorised) loop.
  NodePtr z = leaf({64, 32});
  auto t = plan({ir::permute(bin(Op::Add, x, z), {1, 0})});
  CHECK(t.s.kernels[0].loops.order.back() == 0);
  auto u = plan({bin(Op::Add, x, z)});
  CHECK(u.s.kernels[0].loops.groups.size() == 1);
}

TEST_CASE("sched: contiguous dims coalesce, broadcasts and iota keep them apart") {
  NodePtr x = leaf({8, 16, 32}), y = leaf({8, 16, 32});
  auto r = plan({bin(Op::Add, x, y)});
  CHECK(r.s.kernels[0].loops.groups == std::vector<std::vector<int>>{{0, 1, 2}});
  auto r2 = plan({bin(Op::Add, x, ir::broadcast(leaf({8, 1, 32}), x->shape))});
  CHECK(r2.s.kernels[0].loops.groups == std::vector<std::vector<int>>{{0}, {1}, {2}});
  auto r3 = plan({bin(Op::Add, ir::cast(ir::iota({8, 16, 32}, 1, i64, Device::cpu()), f32), x)});
  CHECK(r3.s.kernels[0].loops.groups == std::vector<std::vector<int>>{{0}, {1}, {2}});
  auto r4 = plan({bin(Op::Add, ir::cast(ir::iota({8, 16, 32}, 0, i64, Device::cpu()), f32), x)});
  CHECK(r4.s.kernels[0].loops.groups == std::vector<std::vector<int>>{{0}, {1, 2}});
}

TEST_CASE("sched: row kernels") {
  NodePtr x = leaf({128, 256});
  SUBCASE("softmax: max then sum of exp, outputs in a third pass") {
    auto r = plan({softmax(x, 1)});
    REQUIRE(r.s.kernels.size() == 1);
    const sched::Kernel& k = r.s.kernels[0];
    CHECK(k.kind == sched::KernelKind::Reduce);
    CHECK(!k.loops.column);
    CHECK(k.phases == 2);
    CHECK(k.passes == 3);
    CHECK(k.loops.rows == 128);
    CHECK(k.loops.parallel);
    CHECK(k.loops.chunks == 1);
    CHECK(r.s.temps.empty());
  }
  SUBCASE("a reduction's pointwise users of the row shape are stored once per row") {
    NodePtr s = red(Op::ReduceSum, x, {1});
    auto r = plan({ir::reshape(bin(Op::Div, s, cst(256.0, s)), Shape{128})});
    REQUIRE(r.s.kernels.size() == 1);
    REQUIRE(r.s.kernels[0].stores.size() == 1);
    CHECK(r.s.kernels[0].stores[0].level == sched::Level::Row);
  }
  SUBCASE("a sibling pointwise output of the row shape is written in the first pass") {
    auto r = plan({red(Op::ReduceSum, x, {1}), bin(Op::Mul, x, x)});
    REQUIRE(r.s.kernels.size() == 1);
    bool full_in_pass1 = false;
    for (auto& st : r.s.kernels[0].stores)
      full_in_pass1 = full_in_pass1 || (st.level == sched::Level::Full && st.pass == 1);
    CHECK(full_in_pass1);
    CHECK(r.s.kernels[0].passes == 1);
  }
  SUBCASE("a mean over rows of per-row values is a final reduction of the row kernel") {
    NodePtr lse = ir::unary(Op::Log, red(Op::ReduceSum, ir::unary(Op::Exp, x), {1}));
    NodePtr m = red(Op::ReduceSum, lse, {0});
    auto r = plan({ir::reshape(bin(Op::Div, m, cst(128.0, m)), Shape{})});
    REQUIRE(r.s.kernels.size() == 1);
    CHECK(r.s.kernels[0].finals.size() == 1);
    CHECK(r.s.kernels[0].stores[0].level == sched::Level::Final);
  }
}

TEST_CASE("sched: column and full reductions") {
  SUBCASE("sum over axis 0 is vectorised along the kept contiguous axis") {
    auto r = plan({red(Op::ReduceSum, leaf({512, 1024}), {0})});
    const sched::Kernel& k = r.s.kernels[0];
    CHECK(k.loops.column);
    CHECK(k.loops.blocks * k.loops.block >= 1024);
    CHECK(k.loops.block == 1024);                  // whole rows: one contiguous run per row
    CHECK(k.loops.tiles() * k.loops.chunks >= 8);  // threads share the rows instead
  }
  SUBCASE("a transposed input makes a row sum a column walk") {
    auto r = plan({red(Op::ReduceSum, leaf({512, 1024}, f32, {1, 512}), {1})});
    CHECK(r.s.kernels[0].loops.column);
  }
  SUBCASE("few columns: the reduced axis is split into chunks combined in order") {
    auto r = plan({red(Op::ReduceSum, leaf({100000, 3}), {0})});
    const sched::Kernel& k = r.s.kernels[0];
    CHECK(k.loops.column);
    CHECK(k.loops.chunks > 1);
    CHECK(k.loops.chunks * k.loops.chunk_len >= 100000);
  }
  SUBCASE("a full reduction of a large tensor is split; of a small one it is one tile") {
    auto big = plan({red(Op::ReduceSum, leaf({1 << 20}), {0})});
    CHECK(big.s.kernels[0].loops.chunks > 1);
    CHECK(big.s.kernels[0].loops.parallel);
    auto small = plan({red(Op::ReduceSum, leaf({1000}), {0})});
    CHECK(small.s.kernels[0].loops.chunks == 1);
    CHECK(!small.s.kernels[0].loops.parallel);
  }
}

TEST_CASE("sched: boundaries, temporaries and launch order") {
  NodePtr x = leaf({32, 32});
  SUBCASE("a row reduction read at other rows goes through a temporary, in an earlier kernel") {
    NodePtr rs = red(Op::ReduceSum, x, {1});
    NodePtr t = ir::permute(ir::broadcast(rs, {32, 32}), {1, 0});
    auto r = plan({bin(Op::Mul, x, t)});
    REQUIRE(r.s.kernels.size() == 2);
    REQUIRE(r.s.temps.size() == 1);
    CHECK(r.s.kernels[0].kind == sched::KernelKind::Reduce);
    CHECK(r.s.kernels[1].after == std::vector<int>{0});
    CHECK(r.s.location[static_cast<std::size_t>(r.s.temps[0].node)].kind == sched::Location::Temp);
  }
  SUBCASE("a reduction that is an output is read back from the output, not a temporary") {
    NodePtr rs = red(Op::ReduceSum, x, {1});
    NodePtr cs = red(Op::ReduceSum, bin(Op::Div, x, ir::broadcast(rs, {32, 32})), {0});
    auto r = plan({rs, cs});
    CHECK(r.s.kernels.size() == 2);
    CHECK(r.s.temps.empty());
  }
  SUBCASE("the explanation names every kernel") {
    auto r = plan({softmax(x, 1), red(Op::ReduceSum, x, {0})});
    std::string text = r.s.str(r.c.graph);
    CHECK(text.find("kernel 0") != std::string::npos);
    CHECK(text.find("kernel 1") != std::string::npos);
    CHECK(text == sched::explain_schedule(r.c.graph));
  }
}

TEST_CASE("sched: index arithmetic") {
  using namespace kiln::sched;
  const Shape space{6, 4};
  Index id = identity_index(space);
  SUBCASE("merging reshape stays affine; an even split too") {
    Index flat = map_reshape(id, Shape{6, 4}, Shape{24}, space);
    CHECK(flat[0].affine());
    CHECK(flat[0].at(0) == 4);
    CHECK(flat[0].at(1) == 1);
    Index back = map_reshape(flat, Shape{24}, Shape{6, 4}, space);
    CHECK(back[0] == id[0]);
    CHECK(back[1] == id[1]);
  }
  SUBCASE("an uneven split is opaque and names the dims it reads") {
    Index flat = map_reshape(id, Shape{6, 4}, Shape{24}, space);
    Index odd = map_reshape(flat, Shape{24}, Shape{3, 8}, space);
    CHECK(!odd[1].affine());
    CHECK(odd[1].dep_mask() == 3u);
  }
  SUBCASE("a split that is merged back is the index it split (affine again, so loads vectorise)") {
    // [B*T, C] seen as [B, T, C] and back, over a 2-dim kernel: i0 / T and i0 % T are opaque,
    // T * (i0 / T) + i0 % T is i0.
    const Shape rows{24, 4};
    Index r = identity_index(rows);
    Index split = map_reshape(r, Shape{24, 4}, Shape{4, 6, 4}, rows);
    CHECK(!split[0].affine());
    Index merged = map_reshape(split, Shape{4, 6, 4}, Shape{24, 4}, rows);
    CHECK(merged[0] == r[0]);
    CHECK(merged[0].affine());
    Index other = map_reshape(split, Shape{4, 6, 4}, Shape{2, 12, 4}, rows);  // a different split
    CHECK(!other[0].affine());
    // The same through the strides of a contiguous [4, 6, 4] buffer: 24 * (i0 / 6) + 4 * (i0 % 6) + i1.
    IndexExpr off = strided_offset(split, Strides{24, 4, 1}, Shape{4, 6, 4});
    CHECK(off.affine());
    CHECK(off.at(0) == 4);
    CHECK(off.at(1) == 1);
    // Strides that do not lay the parts out contiguously stay opaque.
    CHECK(!strided_offset(split, Strides{32, 4, 1}, Shape{4, 6, 4}).affine());
  }
  SUBCASE("slices scale and offset; broadcasts zero the size-1 dims") {
    Index s = map_slice(id, {1, 1, 2}, Shape{6, 9});
    CHECK(s[1].at(1) == 2);
    CHECK(s[1].constant == 1);
    Index b = map_broadcast(id, Shape{6, 1});
    CHECK(b[1].is_constant());
  }
}

TEST_CASE("sched: a costly value read by two kernels is stored once, by the first") {
  NodePtr x = leaf({48, 64});
  NodePtr t = ir::unary(Op::Tanh, bin(Op::Mul, ir::unary(Op::Exp, x), cst(0.5, x)));
  auto r = plan({red(Op::ReduceSum, t, {1}), red(Op::ReduceSum, t, {0})});
  REQUIRE(r.s.kernels.size() == 2);
  REQUIRE(r.s.temps.size() == 1);
  const int tn = r.s.temps[0].node;
  CHECK(r.c.graph.nodes[static_cast<std::size_t>(tn)].op == Op::Tanh);
  CHECK(r.s.owner[static_cast<std::size_t>(tn)] == 0);
  CHECK(r.s.kernels[1].after == std::vector<int>{0});
  // Large graphs schedule quickly: a 2000-op chain with 40 row reductions is one kernel.
  NodePtr v = leaf({64, 128});
  for (int i = 0; i < 2000; ++i) {
    v = bin(Op::Add, bin(Op::Mul, v, cst(1.0001, v)), cst(0.001, v));
    if (i % 50 == 49) v = bin(Op::Sub, v, ir::broadcast(red(Op::ReduceMax, v, {1}), v->shape));
  }
  auto big = plan({v});
  CHECK(big.s.kernels.size() == 1);
  CHECK(big.s.kernels[0].phases == 40);
}

}  // namespace kiln_test_sched_schedule
