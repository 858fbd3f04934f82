// Shape ops: reshape (with -1), permute, transpose, unsqueeze, squeeze, broadcast_to, slice
// (negative and clamped bounds, steps), concat. On evaluated tensors they are views of the
// same memory (no copy: equal data pointers, restrided); on lazy tensors they compute the
// same values; every kind of op accepts non-contiguous inputs.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "../support/reference.hpp"

namespace kiln_test_tensor_views {

using namespace kiln;
namespace kt = kiln::testing;

namespace {

std::vector<double> iota_values(std::int64_t n) {
  std::vector<double> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 0.0);
  return v;
}

// Host models of the shape ops, on row-major Refs.
kt::Ref ref_permute(const kt::Ref& a, const std::vector<std::int64_t>& perm) {
  kt::Ref r;
  for (auto p : perm) r.shape.push_back(a.shape[p]);
  auto in_strides = contiguous_strides(a.shape);
  for (std::int64_t i = 0; i < r.shape.numel(); ++i) {
    auto idx = kt::unravel(i, r.shape);
    std::int64_t off = 0;
    for (std::size_t d = 0; d < perm.size(); ++d) off += idx[d] * in_strides[perm[d]];
    r.v.push_back(a.v[off]);
  }
  return r;
}

/// start/size already clamped; step > 0.
kt::Ref ref_slice(const kt::Ref& a, std::int64_t axis, std::int64_t start, std::int64_t size, std::int64_t step) {
  kt::Ref r;
  r.shape = a.shape;
  r.shape[axis] = size;
  auto in_strides = contiguous_strides(a.shape);
  for (std::int64_t i = 0; i < r.shape.numel(); ++i) {
    auto idx = kt::unravel(i, r.shape);
    idx[axis] = start + idx[axis] * step;
    std::int64_t off = 0;
    for (std::size_t d = 0; d < idx.size(); ++d) off += idx[d] * in_strides[d];
    r.v.push_back(a.v[off]);
  }
  return r;
}

kt::Ref ref_broadcast(const kt::Ref& a, const Shape& shape) {
  kt::Ref zeros{std::vector<double>(static_cast<std::size_t>(shape.numel()), 0.0), shape};
  return kt::zip(a, zeros, [](double x, double) { return x; });
}

kt::Ref ref_concat(const std::vector<kt::Ref>& xs, std::int64_t axis) {
  kt::Ref r;
  r.shape = xs[0].shape;
  r.shape[axis] = 0;
  for (auto& x : xs) r.shape[axis] += x.shape[axis];
  for (std::int64_t i = 0; i < r.shape.numel(); ++i) {
    auto idx = kt::unravel(i, r.shape);
    std::int64_t k = idx[axis];
    for (auto& x : xs) {
      if (k < x.shape[axis]) {
        idx[axis] = k;
        std::int64_t off = 0;
        auto st = contiguous_strides(x.shape);
        for (std::size_t d = 0; d < idx.size(); ++d) off += idx[d] * st[d];
        r.v.push_back(x.v[off]);
        break;
      }
      k -= x.shape[axis];
    }
  }
  return r;
}

kt::Ref reshaped(const kt::Ref& a, Shape s) { return {a.v, std::move(s)}; }

}  // namespace

TEST_CASE("shape ops on evaluated tensors are views: same memory, new strides") {
  const auto vals = iota_values(24);
  Tensor x = kt::make_tensor(vals, {2, 3, 4}, DType::Float32);
  x.eval();
  const kt::Ref rx{vals, {2, 3, 4}};
  float* p0 = x.data_ptr<float>();
  CHECK(x.strides() == Strides{12, 4, 1});

  SUBCASE("reshape, with -1") {
    Tensor r = reshape(x, {6, -1});
    CHECK(r.shape() == Shape{6, 4});
    CHECK(r.is_evaluated());
    CHECK(r.data_ptr<float>() == p0);
    CHECK(r.strides() == Strides{4, 1});
    KILN_CHECK_CLOSE(r, reshaped(rx, {6, 4}));
    Tensor flat = reshape(x, {-1});
    CHECK(flat.shape() == Shape{24});
    CHECK(flat.data_ptr<float>() == p0);
    Tensor r3 = reshape(x, {4, -1, 2});
    CHECK(r3.shape() == Shape{4, 3, 2});
    CHECK(r3.data_ptr<float>() == p0);
    KILN_CHECK_CLOSE(r3, reshaped(rx, {4, 3, 2}));
  }
  SUBCASE("permute and transpose") {
    Tensor p = permute(x, {2, 0, 1});
    CHECK(p.shape() == Shape{4, 2, 3});
    CHECK(p.data_ptr<float>() == p0);
    CHECK(p.strides() == Strides{1, 12, 4});
    KILN_CHECK_CLOSE(p, ref_permute(rx, {2, 0, 1}));
    Tensor pn = permute(x, {-1, -3, -2});
    CHECK(pn.strides() == Strides{1, 12, 4});
    Tensor t = transpose(x, 0, 2);
    CHECK(t.shape() == Shape{4, 3, 2});
    CHECK(t.data_ptr<float>() == p0);
    CHECK(t.strides() == Strides{1, 4, 12});
    KILN_CHECK_CLOSE(t, ref_permute(rx, {2, 1, 0}));
    Tensor tn = transpose(x, -1, -2);
    CHECK(tn.strides() == Strides{12, 1, 4});
    KILN_CHECK_CLOSE(tn, ref_permute(rx, {0, 2, 1}));
    CHECK_FALSE(tn.is_contiguous());
    // Transposing back gives the original layout.
    CHECK(transpose(tn, 1, 2).is_contiguous());
  }
  SUBCASE("unsqueeze and squeeze") {
    Tensor u0 = unsqueeze(x, 0), u2 = unsqueeze(x, 2), ul = unsqueeze(x, -1);
    CHECK(u0.shape() == Shape{1, 2, 3, 4});
    CHECK(u2.shape() == Shape{2, 3, 1, 4});
    CHECK(ul.shape() == Shape{2, 3, 4, 1});
    CHECK(u0.data_ptr<float>() == p0);
    CHECK(u2.data_ptr<float>() == p0);
    CHECK(ul.data_ptr<float>() == p0);
    KILN_CHECK_CLOSE(u2, reshaped(rx, {2, 3, 1, 4}));
    Tensor s = squeeze(unsqueeze(ul, 1));
    CHECK(s.shape() == Shape{2, 3, 4});
    CHECK(s.data_ptr<float>() == p0);
    Tensor s1 = squeeze(u2, 2), sn = squeeze(u2, -2), keep = squeeze(u2, 0);
    CHECK(s1.shape() == Shape{2, 3, 4});
    CHECK(sn.shape() == Shape{2, 3, 4});
    CHECK(keep.shape() == Shape{2, 3, 1, 4});  // size 2: unchanged, as PyTorch
    CHECK(s1.data_ptr<float>() == p0);
    // Unsqueeze of a transposed view stays a view.
    Tensor ut = unsqueeze(transpose(x, 0, 1), 1);
    CHECK(ut.shape() == Shape{3, 1, 2, 4});
    CHECK(ut.data_ptr<float>() == p0);
    KILN_CHECK_CLOSE(ut, reshaped(ref_permute(rx, {1, 0, 2}), {3, 1, 2, 4}));
  }
  SUBCASE("broadcast_to: zero strides") {
    Tensor row = slice(x, 0, 0, 1);  // [1, 3, 4]
    Tensor b = broadcast_to(row, {5, 3, 4});
    CHECK(b.data_ptr<float>() == p0);
    CHECK(b.strides()[0] == 0);
    KILN_CHECK_CLOSE(b, ref_broadcast(kt::ref_of(row), {5, 3, 4}));
    Tensor v = kt::make_tensor({1, 2, 3}, {3}, DType::Float32);
    v.eval();
    Tensor bv = broadcast_to(v, {2, 4, 3});
    CHECK(bv.data_ptr<float>() == v.data_ptr<float>());
    CHECK(bv.strides() == Strides{0, 0, 1});
    KILN_CHECK_CLOSE(bv, ref_broadcast({{1, 2, 3}, {3}}, {2, 4, 3}));
  }
  SUBCASE("slice: offsets, steps, negative and clamped bounds") {
    Tensor s = slice(x, 1, 1, 3);
    CHECK(s.shape() == Shape{2, 2, 4});
    CHECK(s.data_ptr<float>() == p0 + 4);
    CHECK(s.strides() == Strides{12, 4, 1});
    KILN_CHECK_CLOSE(s, ref_slice(rx, 1, 1, 2, 1));
    Tensor st = slice(x, 2, 0, 4, 2);
    CHECK(st.shape() == Shape{2, 3, 2});
    CHECK(st.strides() == Strides{12, 4, 2});
    CHECK(st.data_ptr<float>() == p0);
    KILN_CHECK_CLOSE(st, ref_slice(rx, 2, 0, 2, 2));
    Tensor st3 = slice(x, -1, 1, 100, 3);  // elements 1 (and 4, out of range)
    CHECK(st3.shape() == Shape{2, 3, 1});
    CHECK(st3.data_ptr<float>() == p0 + 1);
    KILN_CHECK_CLOSE(st3, ref_slice(rx, 2, 1, 1, 3));
    Tensor neg = slice(x, 2, -3, -1);  // 1, 2
    CHECK(neg.shape() == Shape{2, 3, 2});
    CHECK(neg.data_ptr<float>() == p0 + 1);
    KILN_CHECK_CLOSE(neg, ref_slice(rx, 2, 1, 2, 1));
    Tensor clamped = slice(x, 0, -100, 100);
    CHECK(clamped.shape() == Shape{2, 3, 4});
    CHECK(clamped.data_ptr<float>() == p0);
    Tensor empty = slice(x, 1, 2, 1);
    CHECK(empty.shape() == Shape{2, 0, 4});
    CHECK(empty.to_vector<float>().empty());
    Tensor past = slice(x, 1, 5, 10);
    CHECK(past.shape() == Shape{2, 0, 4});
    // Slices of views: a column of a transposed view.
    Tensor col = slice(transpose(x, 1, 2), 2, 1, 2);  // [2, 4, 1]
    CHECK(col.data_ptr<float>() == p0 + 4);
    KILN_CHECK_CLOSE(col, ref_slice(ref_permute(rx, {0, 2, 1}), 2, 1, 1, 1));
    Tensor stepped2 = slice(slice(x, 2, 0, 4, 2), 2, 1, 2);  // element 2 of each row
    CHECK(stepped2.data_ptr<float>() == p0 + 2);
    KILN_CHECK_CLOSE(stepped2, ref_slice(rx, 2, 2, 1, 1));
  }
  SUBCASE("reshape of a non-viewable layout copies, with the right values") {
    Tensor t = transpose(x, 1, 2);  // [2, 4, 3], not viewable as [2, 12]
    Tensor r = reshape(t, {2, 12});
    KILN_CHECK_CLOSE(r, reshaped(ref_permute(rx, {0, 2, 1}), {2, 12}));
    Tensor f = reshape(t, {-1});
    KILN_CHECK_CLOSE(f, reshaped(ref_permute(rx, {0, 2, 1}), {24}));
    // Merging only the untouched leading dims of a transposed view is still a view.
    Tensor tl = transpose(x, 1, 2);
    Tensor m = reshape(tl, {2, 4, 3, 1});
    CHECK(m.data_ptr<float>() == p0);
  }
  SUBCASE("a view keeps the memory alive after the base handle is gone") {
    Tensor v;
    {
      Tensor base = kt::make_tensor(vals, {2, 3, 4}, DType::Float32);
      base.eval();
      v = slice(transpose(base, 0, 2), 0, 1, 3);
    }
    KILN_CHECK_CLOSE(v, ref_slice(ref_permute(rx, {2, 1, 0}), 0, 1, 2, 1));
  }
}

TEST_CASE("shape ops on lazy tensors compute the same values") {
  const auto vals = kt::uniform_values(24, -2, 2, DType::Float32, 3);
  const kt::Ref rx = kt::map(kt::Ref{vals, {2, 3, 4}}, [](double v) { return v * 2 + 1; });
  Tensor src = kt::make_tensor(vals, {2, 3, 4}, DType::Float32);
  auto lazy = [&] {
    Tensor t = src * 2.0f + 1.0f;
    REQUIRE_FALSE(t.is_evaluated());
    return t;
  };
  KILN_CHECK_CLOSE(reshape(lazy(), {4, -1}), reshaped(rx, {4, 6}));
  KILN_CHECK_CLOSE(permute(lazy(), {1, 2, 0}), ref_permute(rx, {1, 2, 0}));
  KILN_CHECK_CLOSE(transpose(lazy(), 0, -1), ref_permute(rx, {2, 1, 0}));
  KILN_CHECK_CLOSE(unsqueeze(lazy(), 1), reshaped(rx, {2, 1, 3, 4}));
  KILN_CHECK_CLOSE(squeeze(unsqueeze(lazy(), 3)), reshaped(rx, {2, 3, 4}));
  KILN_CHECK_CLOSE(broadcast_to(slice(lazy(), 1, 2, 3), {2, 5, 4}),
                   ref_broadcast(ref_slice(rx, 1, 2, 1, 1), {2, 5, 4}));
  KILN_CHECK_CLOSE(slice(lazy(), 2, -3, 100, 2), ref_slice(rx, 2, 1, 2, 2));
  KILN_CHECK_CLOSE(slice(transpose(lazy(), 1, 2), 1, 1, 4, 2), ref_slice(ref_permute(rx, {0, 2, 1}), 1, 1, 2, 2));
  KILN_CHECK_CLOSE(reshape(transpose(lazy(), 1, 2), {2, 12}), reshaped(ref_permute(rx, {0, 2, 1}), {2, 12}));
  KILN_CHECK_CLOSE(concat({lazy(), slice(lazy(), 0, 1, 2)}, 0), ref_concat({rx, ref_slice(rx, 0, 1, 1, 1)}, 0));
  // Views of lazy tensors feeding further arithmetic.
  Tensor y = transpose(lazy(), 0, 2) * 3.0f - slice(permute(lazy(), {2, 1, 0}), 0, 0, 4);
  kt::Ref ry =
      kt::zip(ref_permute(rx, {2, 1, 0}), ref_permute(rx, {2, 1, 0}), [](double a, double b) { return a * 3 - b; });
  KILN_CHECK_CLOSE(y, ry);
}

TEST_CASE("concat: axes, dtype promotion, empty pieces, strided pieces") {
  Tensor a = kt::make_tensor(iota_values(6), {2, 3}, DType::Float32);
  Tensor b = kt::make_tensor({10, 11, 12}, {1, 3}, DType::Float32);
  Tensor c = kt::make_tensor({20, 21, 22, 23}, {2, 2}, DType::Float32);
  KILN_CHECK_CLOSE(concat({a, b}, 0), kt::Ref{{0, 1, 2, 3, 4, 5, 10, 11, 12}, {3, 3}});
  KILN_CHECK_CLOSE(concat({a, c}, 1), kt::Ref{{0, 1, 2, 20, 21, 3, 4, 5, 22, 23}, {2, 5}});
  KILN_CHECK_CLOSE(concat({a, c, a}, -1), ref_concat({kt::ref_of(a), kt::ref_of(c), kt::ref_of(a)}, 1));
  KILN_CHECK_CLOSE(concat({a}, 0), kt::ref_of(a));
  // Empty pieces contribute nothing.
  Tensor e = kt::make_tensor({}, {0, 3}, DType::Float32);
  KILN_CHECK_CLOSE(concat({e, a, e}, 0), kt::ref_of(a));
  // Dtypes promote as torch.cat.
  Tensor ai = kt::make_tensor({1, 2, 3}, {1, 3}, DType::Int32);
  Tensor ah = kt::make_tensor({0.5, 1.5, 2.5}, {1, 3}, DType::Float16);
  Tensor m = concat({ai, ah}, 0);
  CHECK(m.dtype() == DType::Float16);
  KILN_CHECK_CLOSE(m, kt::Ref{{1, 2, 3, 0.5, 1.5, 2.5}, {2, 3}});
  Tensor ib = concat({ai, kt::make_tensor({1, 0, 1}, {1, 3}, DType::Bool)}, 0);
  CHECK(ib.dtype() == DType::Int32);
  KILN_CHECK_EXACT(ib, {1, 2, 3, 1, 0, 1});
  // Strided pieces (transposed and stepped views of evaluated tensors).
  a.eval();
  Tensor big = kt::make_tensor(iota_values(12), {3, 4}, DType::Float32);
  big.eval();
  Tensor t = concat({transpose(a, 0, 1), slice(big, 1, 0, 4, 2)}, 1);  // [3, 2] ++ [3, 2]
  KILN_CHECK_CLOSE(t, ref_concat({ref_permute(kt::ref_of(a), {1, 0}), ref_slice(kt::ref_of(big), 1, 0, 2, 2)}, 1));
}

TEST_CASE("views of a realized tensor share memory: assign through a view writes the base") {
  Tensor x = kt::make_tensor(iota_values(12), {3, 4}, DType::Float32);
  x.eval();
  Tensor row = slice(x, 0, 1, 2);  // [1, 4]
  row.assign(kt::make_tensor({-1, -2, -3, -4}, {4}, DType::Float32));
  KILN_CHECK_CLOSE(x, kt::Ref{{0, 1, 2, 3, -1, -2, -3, -4, 8, 9, 10, 11}, {3, 4}});
  Tensor col = slice(transpose(x, 0, 1), 0, 3, 4);  // last column, as [1, 3]
  col.assign(col * 10.0f);
  KILN_CHECK_CLOSE(x, kt::Ref{{0, 1, 2, 30, -1, -2, -3, -40, 8, 9, 10, 110}, {3, 4}});
  Tensor every_other = slice(x, 1, 0, 4, 2);
  every_other.assign(0);
  KILN_CHECK_CLOSE(x, kt::Ref{{0, 1, 0, 30, 0, -2, 0, -40, 0, 9, 0, 110}, {3, 4}});
}

TEST_CASE("a write is ordered after the lazy reads built before it (PyTorch's eager order)") {
  Tensor x = kt::make_tensor({0, 1, 2}, {3}, DType::Float32);
  x.eval();
  Tensor doubled = x * 2.0f;  // lazy, built on x's memory
  Tensor total = sum(x);
  Tensor row = slice(x, 0, 1, 3) + 1.0f;
  x.fill_(5);
  KILN_CHECK_CLOSE(doubled, kt::Ref{{0, 2, 4}, {3}});
  KILN_CHECK_CLOSE(total, kt::Ref{{3}, {}});
  KILN_CHECK_CLOSE(row, kt::Ref{{2, 3}, {2}});
  // A lazy tensor inside the value written is read before the write too.
  Tensor y = x * 2.0f;
  x.assign(y + 1.0f);
  KILN_CHECK_CLOSE(y, kt::Ref{{10, 10, 10}, {3}});
  KILN_CHECK_CLOSE(x, kt::Ref{{11, 11, 11}, {3}});
  // A read built after the write sees it.
  KILN_CHECK_CLOSE(x * 1.0f, kt::Ref{{11, 11, 11}, {3}});
}

TEST_CASE("a number fills a broadcast view (each distinct element once); a tensor cannot be written there") {
  Tensor x = kt::make_tensor({1, 2, 3}, {3, 1}, DType::Float32);
  x.eval();
  Tensor e = x.expand({3, 4});
  e.fill_(7);
  KILN_CHECK_CLOSE(x, kt::Ref{{7, 7, 7}, {3, 1}});
  KILN_CHECK_CLOSE(e, kt::Ref{std::vector<double>(12, 7.0), {3, 4}});
  e.zero_();
  KILN_CHECK_CLOSE(x, kt::Ref{{0, 0, 0}, {3, 1}});
  CHECK_THROWS_AS(e.assign(kt::make_tensor({0, 1, 2, 3}, {4}, DType::Float32)), ShapeError);
}

TEST_CASE("a view of a lazy tensor writes that tensor; flip and repeat are copies") {
  const Device dev = kt::device();
  Tensor x = full({2, 3}, 1.0, DType::Float32, dev) * 1.0f;  // lazy
  Tensor row = slice(x, 0, 0, 1);
  row.fill_(7);
  KILN_CHECK_CLOSE(x, kt::Ref{{7, 7, 7, 1, 1, 1}, {2, 3}});
  Tensor y = full({2, 3}, 0.0, DType::Float32, dev) * 1.0f;
  Tensor yt = transpose(y, 0, 1);
  yt.add_(kt::make_tensor({0, 1, 2, 3, 4, 5}, {3, 2}, DType::Float32));
  KILN_CHECK_CLOSE(y, kt::Ref{{0, 2, 4, 1, 3, 5}, {2, 3}});

  Tensor b = kt::make_tensor({0, 1, 2, 3, 4, 5}, {2, 3}, DType::Float32);
  b.eval();
  Tensor f = flip(b, {0});
  CHECK(f.strides() == Strides{3, 1});
  f.fill_(0);
  Tensor r = b.repeat({1, 1});
  r.fill_(9);
  Tensor r2 = slice(b, 0, 0, 1).repeat({2, 1});
  r2.add_(1.0);
  KILN_CHECK_CLOSE(b, kt::Ref{{0, 1, 2, 3, 4, 5}, {2, 3}});
  KILN_CHECK_CLOSE(r2, kt::Ref{{1, 2, 3, 1, 2, 3}, {2, 3}});
}

TEST_CASE("non-contiguous inputs to every kind of op") {
  const auto vals = kt::uniform_values(30, 0.1, 2, DType::Float32, 19);
  Tensor base = kt::make_tensor(vals, {5, 6}, DType::Float32);
  base.eval();
  const kt::Ref rb{vals, {5, 6}};
  Tensor t = transpose(base, 0, 1);    // [6, 5], strides (1, 6)
  Tensor s = slice(base, 1, 1, 6, 2);  // [5, 3], strides (6, 2), offset 1
  const kt::Ref rt = ref_permute(rb, {1, 0});
  const kt::Ref rs = ref_slice(rb, 1, 1, 3, 2);
  REQUIRE_FALSE(t.is_contiguous());
  REQUIRE_FALSE(s.is_contiguous());
  // unary, binary (two different layouts), ternary, cast
  KILN_CHECK_CLOSE(log(t), kt::map(rt, [](double v) { return std::log(v); }));
  KILN_CHECK_CLOSE(
      s * transpose(slice(t, 0, 0, 6, 2), 0, 1),
      kt::zip(rs, ref_permute(ref_slice(rt, 0, 0, 3, 2), {1, 0}), [](double a, double b) { return a * b; }));
  KILN_CHECK_CLOSE(where(s > 1.0f, s, -s), kt::map(rs, [](double v) { return v > 1 ? v : -v; }));
  KILN_CHECK_CLOSE(t.to(DType::Float64), rt);
  KILN_CHECK_EXACT(s.to(DType::Int32), [&] {
    std::vector<std::int64_t> e;
    for (double v : rs.v) e.push_back(static_cast<std::int64_t>(v));
    return e;
  }());
  // reductions and composites
  KILN_CHECK_CLOSE(sum(t, 1), kt::reduce(rt, {1}, false, kt::ref_sum));
  KILN_CHECK_CLOSE(max(s, 0), kt::reduce(rs, {0}, false, kt::ref_max));
  KILN_CHECK_CLOSE(softmax(t, -1), kt::ref_softmax_last(rt));
  KILN_CHECK_CLOSE(layer_norm(s), kt::ref_layer_norm_last(rs, {}, {}, 1e-5));
  // shape ops and broadcasting with a strided operand
  KILN_CHECK_CLOSE(reshape(t, {30}), reshaped(rt, {30}));
  KILN_CHECK_CLOSE(concat({s, s}, 1), ref_concat({rs, rs}, 1));
  KILN_CHECK_CLOSE(slice(s, 0, 0, 1) + s,
                   kt::zip(ref_slice(rs, 0, 0, 1, 1), rs, [](double a, double b) { return a + b; }));
  // to_vector and item of views
  CHECK(kt::values(t) == rt.v);
  CHECK(slice(slice(t, 0, 2, 3), 1, 4, 5).item<float>() == static_cast<float>(vals[4 * 6 + 2]));
}

}  // namespace kiln_test_tensor_views
