// Shapes and masks: stack, flip, roll, repeat, pad (constant, reflect, replicate, circular),
// tril, triu, masked_fill, one_hot, arange with a step. Values against PyTorch's (written out
// by hand for small inputs), on computed and non-contiguous inputs (the ops fuse with what
// produces them), errors as typed ShapeError/DTypeError/IndexError naming the op.
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

}  // namespace kiln_test_tensor_shape_ops
