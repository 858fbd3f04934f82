// Shapes and masks: stack, flip, roll, repeat, pad (constant, reflect, replicate, circular),
// tril, triu, masked_fill, one_hot, arange with a step, block_diag, diag_embed, diagflat,
// dstack, column_stack, cartesian_prod, vander; with them the composites of other headers that
// torch users reach for beside them: tensordot, kron, cdist, dist (linalg.hpp), diff,
// trapezoid, cumulative_trapezoid (scans.hpp). Values against PyTorch's (written out by hand
// for small inputs), on computed and non-contiguous inputs (the ops fuse with what produces
// them), errors as typed ShapeError/DTypeError/IndexError naming the op, gradients by
// autograd::gradcheck on float64 inputs.
#include <doctest/doctest.h>

#include <vector>

#include "../support/reference.hpp"

namespace kiln_test_tensor_shape_ops {

using namespace kiln;
namespace kt = kiln::testing;

namespace {

using V = std::vector<double>;

/// [rows, cols] holding 0, 1, 2, ... row by row.
Tensor counting(const Shape& s, DType dt = f32) {
  V v(static_cast<std::size_t>(s.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i);
  return kt::make_tensor(v, s, dt);
}

void check(const Tensor& t, const Shape& shape, const V& want) {
  CHECK(t.shape() == shape);
  KILN_CHECK_CLOSE(t, want, kt::Tolerance{0, 0});
}

/// Close within the dtype's tolerance (for values that are roots or quotients).
void near(const Tensor& t, const Shape& shape, const V& want) { KILN_CHECK_CLOSE(t, kt::Ref{want, shape}); }

Tensor f64s(const V& v, const Shape& s) { return kt::make_tensor(v, s, f64); }

}  // namespace

TEST_CASE("stack joins along a new dim, any position, with promotion") {
  Tensor a = counting({2, 3}), b = counting({2, 3}) + 10.0f;
  check(stack({a, b}), {2, 2, 3}, {0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15});
  check(stack({a, b}, 1), {2, 2, 3}, {0, 1, 2, 10, 11, 12, 3, 4, 5, 13, 14, 15});
  check(stack({a, b}, -1), {2, 3, 2}, {0, 10, 1, 11, 2, 12, 3, 13, 4, 14, 5, 15});
  CHECK(stack({counting({2}, i32), counting({2}, f64)}).dtype() == f64);
  CHECK_THROWS_AS(stack({a, counting({3, 2})}), ShapeError);
  CHECK_THROWS_AS(stack({a, b}, 3), ShapeError);
  CHECK_THROWS_AS(stack({}), ShapeError);
}

TEST_CASE("narrow, select and unbind as torch's: views of an evaluated tensor, negative positions, range errors") {
  Tensor x = counting({3, 4});  // 0 .. 11
  check(narrow(x, 1, 1, 2), {3, 2}, {1, 2, 5, 6, 9, 10});
  check(x.narrow(0, -2, 2), {2, 4}, {4, 5, 6, 7, 8, 9, 10, 11});
  check(narrow(x, 0, 3, 0), {0, 4}, {});
  check(select(x, 0, 1), {4}, {4, 5, 6, 7});
  check(x.select(-1, -1), {3}, {3, 7, 11});
  std::vector<Tensor> cols = unbind(x, 1);
  REQUIRE(cols.size() == 4);
  check(cols[2], {3}, {2, 6, 10});
  REQUIRE(x.unbind().size() == 3);
  check(x.unbind()[2], {4}, {8, 9, 10, 11});
  // Views: a write through one reaches x, as torch's.
  x.eval();
  select(x, 0, 2).fill_(-1);
  check(x, {3, 4}, {0, 1, 2, 3, 4, 5, 6, 7, -1, -1, -1, -1});
  // torch: narrow's start outside [-4, 4] is an IndexError, start + length past the end an
  // error; select's index outside [-3, 3); no position in a 0-dim tensor.
  CHECK_THROWS_AS(narrow(x, 1, 5, 0), IndexError);
  CHECK_THROWS_AS(narrow(x, 1, 2, 3), ShapeError);
  CHECK_THROWS_AS(narrow(x, 1, 0, -1), ShapeError);
  CHECK_THROWS_AS(select(x, 0, 3), IndexError);
  CHECK_THROWS_AS(select(x, 0, -4), IndexError);
  CHECK_THROWS_AS(select(x, 2, 0), ShapeError);
  CHECK_THROWS_AS(unbind(kt::make_tensor({1}, {}, f32)), ShapeError);
  // Gradients flow back to the rows and columns picked.
  Tensor w = counting({2, 3}, f64).requires_grad_();
  sum(select(w, 1, 2) * 2.0 + narrow(w, 0, 1, 1).sum()).backward();
  KILN_CHECK_CLOSE(w.grad(), kt::Ref{{0, 0, 2, 2, 2, 4}, {2, 3}});
}

TEST_CASE("flip reverses dims of leaves, views and computed values") {
  Tensor m = counting({2, 3});
  check(flip(m, {0}), {2, 3}, {3, 4, 5, 0, 1, 2});
  check(flip(m, {-1}), {2, 3}, {2, 1, 0, 5, 4, 3});
  check(flip(m, {0, 1}), {2, 3}, {5, 4, 3, 2, 1, 0});
  // A computed value (the reversed read fuses into the kernel) and a transposed leaf.
  check(flip(m * 2.0f + 1.0f, {1}), {2, 3}, {5, 3, 1, 11, 9, 7});
  check(flip(transpose(m, 0, 1), {0}), {3, 2}, {2, 5, 1, 4, 0, 3});
  check(flip(m, {1}) + m, {2, 3}, {2, 2, 2, 8, 8, 8});
  CHECK_THROWS_AS(flip(m, {1, -1}), ShapeError);
  CHECK_THROWS_AS(flip(m, {2}), ShapeError);
}

TEST_CASE("roll wraps elements around, per dim or over the flattened tensor") {
  Tensor v = counting({5});
  check(roll(v, {2}), {5}, {3, 4, 0, 1, 2});
  check(roll(v, {-1}), {5}, {1, 2, 3, 4, 0});
  check(roll(v, {7}), {5}, {3, 4, 0, 1, 2});
  Tensor m = counting({2, 3});
  check(roll(m, {1}, {1}), {2, 3}, {2, 0, 1, 5, 3, 4});
  check(roll(m, {1, 1}, {0, 1}), {2, 3}, {5, 3, 4, 2, 0, 1});
  check(roll(m, {1}), {2, 3}, {5, 0, 1, 2, 3, 4});  // flattened
  check(roll(m, -1, 1), {2, 3}, {1, 2, 0, 4, 5, 3});
  check(roll(m, 2), {2, 3}, {4, 5, 0, 1, 2, 3});
  check(flip(m, 1), {2, 3}, {2, 1, 0, 5, 4, 3});
  CHECK_THROWS_AS(roll(m, {1, 2}, {0}), ShapeError);
}

TEST_CASE("repeat tiles dims and adds leading ones") {
  Tensor m = counting({2, 2});
  check(repeat(m, {2, 1}), {4, 2}, {0, 1, 2, 3, 0, 1, 2, 3});
  check(repeat(m, {1, 2}), {2, 4}, {0, 1, 0, 1, 2, 3, 2, 3});
  check(repeat(counting({2}), {2, 2}), {2, 4}, {0, 1, 0, 1, 0, 1, 0, 1});
  check(repeat(m * 3.0f, {1, 1}), {2, 2}, {0, 3, 6, 9});
  CHECK(repeat(m, {0, 2}).shape() == Shape{0, 4});
  CHECK_THROWS_AS(repeat(m, {2}), ShapeError);
  CHECK_THROWS_AS(repeat(m, {-1, 1}), ShapeError);
}

TEST_CASE("tril and triu keep a triangle of the last two dims, with a diagonal offset") {
  Tensor m = counting({3, 4}) + 1.0f;
  check(tril(m), {3, 4}, {1, 0, 0, 0, 5, 6, 0, 0, 9, 10, 11, 0});
  check(tril(m, 1), {3, 4}, {1, 2, 0, 0, 5, 6, 7, 0, 9, 10, 11, 12});
  check(tril(m, -1), {3, 4}, {0, 0, 0, 0, 5, 0, 0, 0, 9, 10, 0, 0});
  check(triu(m), {3, 4}, {1, 2, 3, 4, 0, 6, 7, 8, 0, 0, 11, 12});
  check(triu(m, 2), {3, 4}, {0, 0, 3, 4, 0, 0, 0, 8, 0, 0, 0, 0});
  // Batched, integer, and the causal mask attention uses.
  Tensor b = counting({2, 2, 2}, i64);
  CHECK(tril(b).dtype() == i64);
  check(tril(b), {2, 2, 2}, {0, 0, 2, 3, 4, 0, 6, 7});
  Tensor scores = full({3, 3}, 1.0, f32, kt::device());
  Tensor masked = masked_fill(scores, triu(full({3, 3}, 1.0, bool_, kt::device()), 1), -1e9);
  check(masked, {3, 3}, {1, -1e9, -1e9, 1, 1, -1e9, 1, 1, 1});
  CHECK_THROWS_AS(tril(counting({3})), ShapeError);
}

TEST_CASE("masked_fill writes a value where the (broadcast) mask holds") {
  Tensor m = counting({2, 3});
  Tensor row = kt::make_tensor({1, 0, 1}, {3}, bool_);
  check(masked_fill(m, row, -1), {2, 3}, {-1, 1, -1, -1, 4, -1});
  check(masked_fill(m * 2.0f, m > 2.0f, 0.5), {2, 3}, {0, 2, 4, 0.5, 0.5, 0.5});
  Tensor ints = counting({3}, i32);
  CHECK(masked_fill(ints, ints > 0, 7).dtype() == i32);
  check(masked_fill(ints, ints > 0, 7), {3}, {0, 7, 7});
  check(masked_fill(m, row, kt::make_tensor({2.5}, {}, f64)), {2, 3}, {2.5, 1, 2.5, 2.5, 4, 2.5});
  CHECK_THROWS_AS(masked_fill(m, row, counting({2})), ShapeError);
  CHECK_THROWS_AS(masked_fill(m, m, 1), DTypeError);
  CHECK_THROWS_AS(masked_fill(m, kt::make_tensor({1, 0}, {2}, bool_), 1), ShapeError);
  // A value the dtype cannot hold is an error, as PyTorch's "cannot be converted ... without
  // overflow"; the floats' infinities and NaN are values they hold.
  KILN_CHECK_THROWS_MENTIONING(ValueError, masked_fill(ints, ints > 0, -INFINITY), "masked_fill", "int32", "overflow");
  CHECK_THROWS_AS(masked_fill(ints, ints > 0, NAN), ValueError);
  CHECK_THROWS_AS(masked_fill(ints, ints > 0, 3e9), ValueError);
  CHECK_THROWS_AS(masked_fill(m.to(f16), row, 1e5), ValueError);
  check(masked_fill(m.to(f16), row, -INFINITY).to(f32), {2, 3}, {-INFINITY, 1, -INFINITY, -INFINITY, 4, -INFINITY});
  check(masked_fill(counting({3}, i64), kt::make_tensor({1, 0, 0}, {3}, bool_), -2147483649.0), {3},
        {-2147483649.0, 1, 2});
}

TEST_CASE("one_hot: int64 rows, any index shape, the class count inferred or checked") {
  Tensor idx = kt::make_tensor({0, 2, 1}, {3}, i64);
  Tensor h = one_hot(idx, 4);
  CHECK(h.dtype() == i64);
  check(h, {3, 4}, {1, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0});
  check(one_hot(idx), {3, 3}, {1, 0, 0, 0, 0, 1, 0, 1, 0});
  check(one_hot(kt::make_tensor({1, 0, 0, 1}, {2, 2}, i32), 2), {2, 2, 2}, {0, 1, 1, 0, 1, 0, 0, 1});
  if (kt::on_cpu()) {
    // The index is in host memory: checked as torch's CPU kernel does.
    CHECK_THROWS_AS(one_hot(idx, 2), IndexError);
    CHECK_THROWS_AS(one_hot(kt::make_tensor({-1}, {1}, i64), 3), IndexError);
  } else {
    // A device index is not read back (no synchronisation): out-of-range classes match no
    // column, so their rows are zeros.
    check(one_hot(kt::make_tensor({-1, 1}, {2}, i64), 2), {2, 2}, {0, 0, 0, 1});
  }
  CHECK_THROWS_AS(one_hot(counting({3}), 3), DTypeError);
}

TEST_CASE("pad: constant (and cropping), reflect, replicate, circular over the last dims") {
  Tensor m = counting({2, 3});
  check(pad(m, {1, 2}, 9.0), {2, 6}, {9, 0, 1, 2, 9, 9, 9, 3, 4, 5, 9, 9});
  check(pad(m, {0, 0, 1, 0}), {3, 3}, {0, 0, 0, 0, 1, 2, 3, 4, 5});
  check(pad(m, {-1, 1}), {2, 3}, {1, 2, 0, 4, 5, 0});
  check(pad(m, {2, 1}, "reflect"), {2, 6}, {2, 1, 0, 1, 2, 1, 5, 4, 3, 4, 5, 4});
  check(pad(m, {1, 2}, "replicate"), {2, 6}, {0, 0, 1, 2, 2, 2, 3, 3, 4, 5, 5, 5});
  check(pad(m, {1, 1}, "circular"), {2, 5}, {2, 0, 1, 2, 0, 5, 3, 4, 5, 3});
  check(pad(m * 2.0f, {1, 0, 0, 1}, "replicate"), {3, 4}, {0, 0, 2, 4, 6, 6, 8, 10, 6, 6, 8, 10});
  CHECK_THROWS_AS(pad(m, {3, 0}, "reflect"), ShapeError);
  CHECK_THROWS_AS(pad(m, {1}), ShapeError);
  CHECK_THROWS_AS(pad(m, {1, 1}, "wrap"), ValueError);
}

TEST_CASE("arange with start, end and step, as torch.arange") {
  check(arange(2, 11, 3), {3}, {2, 5, 8});
  check(arange(5, 0, -2), {3}, {5, 3, 1});
  CHECK(arange(0.0, 1.0, 0.25).dtype() == f32);
  check(arange(0.0, 1.0, 0.25), {4}, {0, 0.25, 0.5, 0.75});
  CHECK_THROWS_AS(arange(0, 5, 0), ValueError);
}

TEST_CASE("tensordot contracts dims given by count or by lists, as a matrix product") {
  Tensor a = counting({2, 3}, f64), b = counting({3, 2}, f64);
  check(tensordot(a, b, 1), {2, 2}, {10, 13, 28, 40});
  check(tensordot(a, a), {}, {55});
  check(tensordot(a, b, {0}, {1}), {3, 3}, {3, 9, 15, 4, 14, 24, 5, 19, 33});
  check(tensordot(a, b, {-2}, {-1}), {3, 3}, {3, 9, 15, 4, 14, 24, 5, 19, 33});
  CHECK(tensordot(a, b, 0).shape() == Shape{2, 3, 3, 2});
  // Integers: exact, in their dtype; a contracted size of 1 sums the other side first.
  Tensor ti = tensordot(counting({2, 3}, i32), counting({3, 2}, i32), 1);
  CHECK(ti.dtype() == i32);
  check(ti, {2, 2}, {10, 13, 28, 40});
  check(tensordot(counting({2, 1}, f64), b, {1}, {0}), {2, 2}, {0, 0, 6, 9});
  CHECK_THROWS_AS(tensordot(a, b, -1), ValueError);
  CHECK_THROWS_AS(tensordot(a, b, 3), ShapeError);
  KILN_CHECK_THROWS_MENTIONING(ShapeError, tensordot(a, b, {0}, {0}), "tensordot", "float64[2, 3]", "float64[3, 2]");
  CHECK_THROWS_AS(tensordot(a, b, {0, 0}, {0, 1}), ShapeError);
  CHECK_THROWS_AS(tensordot(a, b, {0}, {}), ShapeError);
  CHECK_THROWS_AS(tensordot(a, b, {2}, {0}), ShapeError);
  CHECK_THROWS_AS(tensordot(a, counting({3, 2}, f32), 1), DTypeError);
  CHECK(autograd::gradcheck([](std::vector<Tensor> x) { return tensordot(x[0], x[1], {0}, {1}); },
                            {f64s({0.5, -1, 2, 0.25, 3, -0.75}, {2, 3}), f64s({1, -2, 0.5, 1.5, -1, 2}, {3, 2})}));
}

TEST_CASE("kron: the Kronecker product, lower ranks padded with leading dims") {
  Tensor a = kt::make_tensor({1, 2, 3, 4}, {2, 2}, f32), b = kt::make_tensor({0, 1, 1, 0}, {2, 2}, f32);
  check(kron(a, b), {4, 4}, {0, 1, 0, 2, 1, 0, 2, 0, 0, 3, 0, 4, 3, 0, 4, 0});
  check(kron(kt::make_tensor({1, 2}, {2}, f32), b), {2, 4}, {0, 1, 0, 2, 1, 0, 2, 0});
  check(kron(kt::make_tensor({2}, {}, f32), kt::make_tensor({1, 2}, {2}, f32)), {2}, {2, 4});
  CHECK(kron(counting({2}, i32), counting({2}, f64)).dtype() == f64);
  CHECK(autograd::gradcheck([](std::vector<Tensor> x) { return kron(x[0], x[1]); },
                            {f64s({0.5, -1, 2}, {3, 1}), f64s({1, -2, 0.5, 1.5}, {2, 2})}));
}

TEST_CASE("cdist: p-norm distances between rows, batch dims broadcast; torch's gradients") {
  Tensor x1 = kt::make_tensor({0, 0, 1, 1}, {2, 2}, f32), x2 = kt::make_tensor({0, 0, 3, 4, 1, 0}, {3, 2}, f32);
  near(cdist(x1, x2), {2, 3}, {0, 5, 1, 1.4142135623730951, 3.605551275463989, 1});
  check(cdist(x1, x2, 1), {2, 3}, {0, 7, 1, 2, 5, 1});
  check(cdist(x1, x2, INFINITY), {2, 3}, {0, 4, 1, 1, 3, 1});
  check(cdist(x1, x2, 0), {2, 3}, {0, 2, 1, 2, 2, 1});
  near(cdist(x1, x2, 3), {2, 3}, {0, 4.497941445275415, 1, 1.2599210498948732, 3.2710663101885897, 1});
  // Batch dims broadcast: each batch of x1 against the one x2.
  Tensor batched = cdist(stack({x1, x1 * 2.0f}), x2);
  CHECK(batched.shape() == Shape{2, 2, 3});
  near(select(batched, 0, 0), {2, 3}, {0, 5, 1, 1.4142135623730951, 3.605551275463989, 1});
  check(cdist(kt::make_tensor({}, {2, 0}, f32), kt::make_tensor({}, {1, 0}, f32)), {2, 1}, {0, 0});
  KILN_CHECK_THROWS_MENTIONING(ShapeError, cdist(x1, counting({3, 3})), "cdist", "float32[2, 2]", "float32[3, 3]");
  CHECK_THROWS_AS(cdist(counting({2}), x2), ShapeError);
  CHECK_THROWS_AS(cdist(counting({2, 2, 2}), counting({3, 3, 2})), ShapeError);
  CHECK_THROWS_AS(cdist(counting({2, 2}, i32), counting({2, 2}, i32)), DTypeError);
  CHECK_THROWS_AS(cdist(x1, counting({2, 2}, f64)), DTypeError);
  CHECK_THROWS_AS(cdist(x1, x2, -1), ValueError);
  // Away from ties and zeros every p matches central differences.
  const Tensor g1 = f64s({0.1, -0.3, 0.7, 1.2, 0.4, -0.5}, {2, 3}), g2 = f64s({0.9, 0.2, -0.4, -0.6, 1.1, 0.3}, {2, 3});
  for (double p : {0.5, 1.0, 1.5, 2.0, 3.0, double(INFINITY)}) {
    CAPTURE(p);
    CHECK(autograd::gradcheck([p](std::vector<Tensor> x) { return cdist(x[0], x[1], p); }, {g1, g2}));
  }
  CHECK(autograd::gradcheck([](std::vector<Tensor> x) { return cdist(x[0], x[1]); }, {reshape(g1, {2, 1, 3}), g2}));
  // torch's values where the composite's would be NaN or split: 0 at a zero distance, 0 for
  // p < 1 at a zero difference, the whole gradient to each tied column for p = inf.
  auto grads = [](const V& a, const V& b, double p) {
    Tensor u = f64s(a, {1, 2}).requires_grad_(), v = f64s(b, {static_cast<std::int64_t>(b.size()) / 2, 2});
    v.requires_grad_();
    return autograd::grad({sum(cdist(u, v, p))}, {u, v});
  };
  std::vector<Tensor> g = grads({1, 2}, {1, 2, 1, 3}, 2);
  KILN_CHECK_CLOSE(g[0], kt::Ref{{0, -1}, {1, 2}});
  KILN_CHECK_CLOSE(g[1], kt::Ref{{0, 0, 0, 1}, {2, 2}});
  KILN_CHECK_CLOSE(grads({1, 2}, {1, 2}, 1.5)[0], kt::Ref{{0, 0}, {1, 2}});
  KILN_CHECK_CLOSE(grads({0, 0}, {0, 1}, 0.5)[0], kt::Ref{{0, -1}, {1, 2}});
  KILN_CHECK_CLOSE(grads({0, 0}, {1, -1}, INFINITY)[0], kt::Ref{{-1, 1}, {1, 2}});
  KILN_CHECK_CLOSE(grads({0, 0}, {1, -1}, 0)[0], kt::Ref{{0, 0}, {1, 2}});
}

TEST_CASE("dist: the p-norm of a - b over all elements, broadcast") {
  Tensor a = kt::make_tensor({1, 2, 3}, {3}, f32), b = kt::make_tensor({1, 0, 0}, {3}, f32);
  near(dist(a, b), {}, {3.605551275463989});
  check(dist(a, b, 1), {}, {5});
  check(dist(a, b, INFINITY), {}, {3});
  check(dist(a, b, 0), {}, {2});
  near(dist(counting({2, 3}), kt::make_tensor({0, 1, 2}, {3}, f32)), {}, {5.196152422706632});
  CHECK(dist(a, b.to(f64)).dtype() == f64);
  CHECK_THROWS_AS(dist(counting({3}, i64), counting({3}, i64)), DTypeError);
  CHECK_THROWS_AS(dist(a, counting({2})), ShapeError);
  Tensor u = f64s({1, 2}, {2}).requires_grad_();
  KILN_CHECK_CLOSE(autograd::grad({dist(u, f64s({1, 2}, {2}))}, {u})[0], kt::Ref{{0, 0}, {2}});
  CHECK(autograd::gradcheck([](std::vector<Tensor> x) { return dist(x[0], x[1], 3); },
                            {f64s({0.5, -1, 2}, {3}), f64s({1, -2, 0.25, 1.5, -1, 2}, {2, 3})}));
}

TEST_CASE("block_diag, diag_embed and diagflat place values on diagonals") {
  Tensor m = kt::make_tensor({1, 2, 3, 4}, {2, 2}, f32);
  Tensor bd = block_diag({m, counting({3}, i64) + 5, kt::make_tensor({8}, {}, f64)});
  CHECK(bd.dtype() == f32);  // torch.result_type: the 0-dim float64 does not widen float32
  check(bd, {4, 6}, {1, 2, 0, 0, 0, 0, 3, 4, 0, 0, 0, 0, 0, 0, 5, 6, 7, 0, 0, 0, 0, 0, 0, 8});
  CHECK(block_diag({counting({2}, i32), kt::make_tensor({1}, {}, i64)}).dtype() == i32);
  CHECK(block_diag({}).shape() == Shape{1, 0});
  CHECK_THROWS_AS(block_diag({m, counting({1, 1, 1})}), ShapeError);
  CHECK(autograd::gradcheck(
      [](std::vector<Tensor> x) {
        return block_diag({x[0], x[1]});
      },
      {f64s({0.5, -1, 2, 3}, {2, 2}), f64s({1, -2, 0.5}, {3})}));

  Tensor v = kt::make_tensor({1, 2}, {2}, f32);
  check(diag_embed(m), {2, 2, 2}, {1, 0, 0, 2, 3, 0, 0, 4});
  check(diag_embed(v, 1), {3, 3}, {0, 1, 0, 0, 0, 2, 0, 0, 0});
  check(diag_embed(v, -1), {3, 3}, {0, 0, 0, 1, 0, 0, 0, 2, 0});
  check(diag_embed(v, 1, -1, -2), {3, 3}, {0, 0, 0, 1, 0, 0, 0, 2, 0});
  check(diag_embed(m, 0, 0, 2), {2, 2, 2}, {1, 0, 3, 0, 0, 2, 0, 4});
  CHECK(diag_embed(counting({2}, i32)).dtype() == i32);
  CHECK_THROWS_AS(diag_embed(kt::make_tensor({1}, {}, f32)), ShapeError);
  CHECK_THROWS_AS(diag_embed(m, 0, 1, -2), ShapeError);
  CHECK_THROWS_AS(diag_embed(m, 0, 0, 3), ShapeError);
  CHECK(autograd::gradcheck([](std::vector<Tensor> x) { return diag_embed(x[0], 1, 0, 2); },
                            {f64s({0.5, -1, 2, 3}, {2, 2})}));

  check(diagflat(m), {4, 4}, {1, 0, 0, 0, 0, 2, 0, 0, 0, 0, 3, 0, 0, 0, 0, 4});
  check(diagflat(v, -1), {3, 3}, {0, 0, 0, 1, 0, 0, 0, 2, 0});
  check(diagflat(kt::make_tensor({5}, {}, f32)), {1, 1}, {5});
}

TEST_CASE("dstack, column_stack and cartesian_prod join 0-D, 1-D and 2-D tensors as torch's") {
  Tensor a = kt::make_tensor({1, 2}, {2}, f32), b = kt::make_tensor({3, 4}, {2}, f32);
  check(dstack({a, b}), {1, 2, 2}, {1, 3, 2, 4});
  check(dstack({reshape(a, {2, 1}), reshape(b, {2, 1})}), {2, 1, 2}, {1, 3, 2, 4});
  check(dstack({select(a, 0, 0), select(b, 0, 1)}), {1, 1, 2}, {1, 4});
  CHECK(dstack({a, counting({2}, f64)}).dtype() == f64);
  KILN_CHECK_THROWS_MENTIONING(ShapeError, dstack({a, counting({3})}), "dstack", "float32[1, 3, 1]");
  CHECK_THROWS_AS(dstack({}), ValueError);

  Tensor c = kt::make_tensor({7, 8, 9, 10, 11, 12}, {3, 2}, f32);
  check(column_stack({counting({3}) + 1.0f, counting({3}) + 4.0f}), {3, 2}, {1, 4, 2, 5, 3, 6});
  check(column_stack({counting({3}, i32) + 1, c}), {3, 3}, {1, 7, 8, 2, 9, 10, 3, 11, 12});
  CHECK(column_stack({counting({3}, i32), c}).dtype() == f32);
  check(column_stack({select(a, 0, 0), select(b, 0, 0)}), {1, 2}, {1, 3});
  CHECK_THROWS_AS(column_stack({a, counting({3})}), ShapeError);
  CHECK_THROWS_AS(column_stack({}), ValueError);

  check(cartesian_prod({kt::make_tensor({1, 2, 3}, {3}, i64), kt::make_tensor({4, 5}, {2}, i64)}), {6, 2},
        {1, 4, 1, 5, 2, 4, 2, 5, 3, 4, 3, 5});
  check(cartesian_prod({a, kt::make_tensor({3}, {1}, f32), kt::make_tensor({4, 5}, {2}, f32)}), {4, 3},
        {1, 3, 4, 1, 3, 5, 2, 3, 4, 2, 3, 5});
  check(cartesian_prod({a}), {2}, {1, 2});
  CHECK_THROWS_AS(cartesian_prod({a, counting({2}, f64)}), DTypeError);
  CHECK_THROWS_AS(cartesian_prod({counting({2, 2})}), ShapeError);
  CHECK_THROWS_AS(cartesian_prod({}), ValueError);
  CHECK(autograd::gradcheck(
      [](std::vector<Tensor> x) {
        return cartesian_prod({x[0], x[1]});
      },
      {f64s({0.5, -1}, {2}), f64s({1, -2, 0.5}, {3})}));
}

TEST_CASE("vander: powers of x in columns, decreasing by default (torch.vander)") {
  Tensor x = kt::make_tensor({1, 2, 3}, {3}, f32);
  check(vander(x), {3, 3}, {1, 1, 1, 4, 2, 1, 9, 3, 1});
  check(vander(x, 4, true), {3, 4}, {1, 1, 1, 1, 1, 2, 4, 8, 1, 3, 9, 27});
  check(vander(x, 1), {3, 1}, {1, 1, 1});
  CHECK(vander(x, 0).shape() == Shape{3, 0});
  CHECK(vander(counting({3}, i32)).dtype() == i64);
  CHECK(vander(kt::make_tensor({1, 0}, {2}, bool_)).dtype() == i64);
  CHECK(vander(x.to(f64)).dtype() == f64);
  CHECK_THROWS_AS(vander(counting({2, 2})), ShapeError);
  CHECK_THROWS_AS(vander(x, -1), ValueError);
  CHECK(autograd::gradcheck([](std::vector<Tensor> v) { return vander(v[0], 4); }, {f64s({0.5, -1.25, 2}, {3})}));
}

TEST_CASE("diff: n-th differences along a dim, with prepend and append") {
  Tensor x = kt::make_tensor({1, 4, 9, 16}, {4}, f32);
  check(diff(x), {3}, {3, 5, 7});
  check(diff(x, 2), {2}, {2, 2});
  check(diff(x, 3), {1}, {0});
  CHECK(diff(x, 5).shape() == Shape{0});
  check(diff(x, 0, -1, kt::make_tensor({0}, {1}, f32)), {4}, {1, 4, 9, 16});  // n = 0 leaves prepend out
  check(diff(counting({2, 3}), 1, 0), {1, 3}, {3, 3, 3});
  check(diff(x, 1, -1, kt::make_tensor({0}, {1}, f32), kt::make_tensor({20}, {1}, f32)), {5}, {1, 3, 5, 7, 4});
  Tensor flags = kt::make_tensor({1, 0, 0, 1}, {4}, bool_);
  CHECK(diff(flags).dtype() == bool_);
  check(diff(flags), {3}, {1, 0, 1});
  Tensor joined = diff(kt::make_tensor({1, 0}, {2}, bool_), 1, -1, kt::make_tensor({1}, {1}, i64));
  CHECK(joined.dtype() == i64);
  check(joined, {2}, {0, -1});
  CHECK(diff(counting({3}, i32)).dtype() == i32);
  CHECK_THROWS_AS(diff(kt::make_tensor({1}, {}, f32)), ShapeError);
  CHECK_THROWS_AS(diff(x, -1), ValueError);
  CHECK_THROWS_AS(diff(x, 1, 1), ShapeError);
  CHECK_THROWS_AS(diff(counting({2, 3}), 1, -1, counting({2})), ShapeError);
  KILN_CHECK_THROWS_MENTIONING(ShapeError, diff(counting({2, 3}), 1, -1, {}, counting({3, 1})), "diff", "append",
                               "float32[3, 1]", "float32[2, 3]");
  // Weights 1..4 on [x0 - p, x1 - x0, x2 - x1, a - x2]: dp = -1, dx = 1 - 2, 2 - 3, 3 - 4, da = 4.
  Tensor v = f64s({0.5, 2, -1}, {3}).requires_grad_(), p = f64s({3}, {1}).requires_grad_();
  Tensor a = f64s({1}, {1}).requires_grad_();
  std::vector<Tensor> g = autograd::grad({sum(diff(v, 1, 0, p, a) * f64s({1, 2, 3, 4}, {4}))}, {v, p, a});
  KILN_CHECK_CLOSE(g[0], kt::Ref{{-1, -1, -1}, {3}});
  KILN_CHECK_CLOSE(g[1], kt::Ref{{-1}, {1}});
  KILN_CHECK_CLOSE(g[2], kt::Ref{{4}, {1}});
  CHECK(
      autograd::gradcheck([](std::vector<Tensor> t) { return diff(t[0], 2, -1, t[1], t[2]); },
                          {f64s({0.5, 2, -1, 3, 1, -2}, {2, 3}), f64s({1, -1}, {2, 1}), f64s({2, 0, -3, 1}, {2, 2})}));
}

TEST_CASE("trapezoid and cumulative_trapezoid: spacing dx or sample points x") {
  Tensor y = kt::make_tensor({1, 2, 4, 7}, {4}, f32);
  check(trapezoid(y), {}, {10});
  check(trapezoid(y, 0.5), {}, {5});
  check(trapezoid(counting({2, 3})), {2}, {2, 8});
  check(trapezoid(counting({2, 3}), 1.0, 0), {3}, {1.5, 2.5, 3.5});
  Tensor yi = trapezoid(kt::make_tensor({1, 2, 4, 7}, {4}, i32));
  CHECK(yi.dtype() == f32);
  check(yi, {}, {10});
  Tensor none = trapezoid(counting({2, 0}, i32));
  CHECK(none.dtype() == i32);
  check(none, {2}, {0, 0});
  Tensor xs = kt::make_tensor({0, 1, 3, 6}, {4}, f32);
  check(trapezoid(y, xs), {}, {24});
  check(trapezoid(counting({2, 3}), kt::make_tensor({0, 2, 3}, {3}, f32)), {2}, {2.5, 11.5});
  check(trapezoid(counting({2, 3}), kt::make_tensor({0, 1, 2, 0, 2, 4}, {2, 3}, f32)), {2}, {2, 16});
  CHECK(trapezoid(y, xs.to(f64)).dtype() == f64);
  CHECK_THROWS_AS(trapezoid(kt::make_tensor({1, 0}, {2}, bool_)), DTypeError);
  CHECK_THROWS_AS(trapezoid(kt::make_tensor({1}, {}, f32)), ShapeError);
  KILN_CHECK_THROWS_MENTIONING(ShapeError, trapezoid(y, counting({3})), "trapezoid", "float32[3]", "float32[4]");
  CHECK_THROWS_AS(trapezoid(counting({2, 3}), counting({4, 3})), ShapeError);

  check(cumulative_trapezoid(y), {3}, {1.5, 4.5, 10});
  check(cumulative_trapezoid(y, 2.0), {3}, {3, 9, 20});
  check(cumulative_trapezoid(y, xs), {3}, {1.5, 7.5, 24});
  check(cumulative_trapezoid(counting({2, 3}), 1.0, 0), {1, 3}, {1.5, 2.5, 3.5});
  CHECK(cumulative_trapezoid(kt::make_tensor({1, 2}, {2}, i64)).dtype() == f32);
  CHECK_THROWS_AS(cumulative_trapezoid(y, kt::make_tensor({1, 0, 1, 0}, {4}, bool_)), DTypeError);
  const std::vector<Tensor> yx = {f64s({0.5, 2, -1, 3, 1, -2}, {2, 3}), f64s({0, 0.5, 2}, {3})};
  CHECK(autograd::gradcheck([](std::vector<Tensor> t) { return trapezoid(t[0], t[1]); }, yx));
  CHECK(autograd::gradcheck([](std::vector<Tensor> t) { return cumulative_trapezoid(t[0], t[1]); }, yx));
  CHECK(autograd::gradcheck([](std::vector<Tensor> t) { return trapezoid(t[0], 0.5, 0); }, {yx[0]}));
}

}  // namespace kiln_test_tensor_shape_ops
