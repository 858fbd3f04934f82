// Data-dependent reads: gather, index_select, take_along_dim, embedding. Values against a plain
// loop over the same numbers on both executors (fused kernels and the op-by-op reference), for
// every dtype, int32 and int64 indices, negative and positive dims, non-contiguous and computed
// inputs and indices; kernel counts for the fused cases; empty index sets; range errors as typed
// IndexErrors naming the op, before anything compiles when the index is in host memory and from
// the kernel that read it otherwise.
#include <doctest/doctest.h>

#include <vector>

#include "../support/reference.hpp"

namespace kiln_test_tensor_indexing {

using namespace kiln;
namespace kt = kiln::testing;

namespace {

using V = std::vector<double>;

struct BackendGuard {
  Backend saved = get_backend();
  ~BackendGuard() { set_backend(saved); }
};

/// `n` indices into a dim of `bound`: a fixed pattern with repeats, every value in range.
V indices(std::int64_t n, std::int64_t bound, std::int64_t salt = 0) {
  V v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<double>((i * 7 + i / 3 + salt) % bound);
  return v;
}

/// 0, 1, 2, ... of `shape`.
V counting(const Shape& s) {
  V v(static_cast<std::size_t>(s.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i);
  return v;
}

/// torch.gather by definition: out[p] = x[p with p[axis] = index[p]] (row-major values).
V gathered(const V& x, const Shape& xs, std::size_t axis, const V& index, const Shape& is) {
  V out(static_cast<std::size_t>(is.numel()));
  Strides xst = contiguous_strides(xs);
  std::vector<std::int64_t> p(is.size(), 0);
  for (std::size_t flat = 0; flat < out.size(); ++flat) {
    std::int64_t off = 0;
    for (std::size_t d = 0; d < is.size(); ++d)
      off += (d == axis ? static_cast<std::int64_t>(index[flat]) : p[d]) * xst[d];
    out[flat] = x[static_cast<std::size_t>(off)];
    for (std::size_t d = is.size(); d-- > 0;) {
      if (++p[d] < is[d]) break;
      p[d] = 0;
    }
  }
  return out;
}

const std::pair<Backend, const char*> kBackends[] = {{Backend::Jit, "jit"}, {Backend::Eager, "reference"}};

}  // namespace

TEST_CASE("gather along every dim, int64 and int32 indices, on both executors") {
  BackendGuard guard;
  const Shape xs{3, 4, 5};
  const V xv = counting(xs);
  for (auto [backend, name] : kBackends) {
    set_backend(backend);
    for (DType it : {i64, i32}) {
      for (std::int64_t axis = 0; axis < 3; ++axis) {
        CAPTURE(name);
        CAPTURE(axis);
        // Off the axis the index may be smaller than the input.
        Shape is{2, 3, 4};
        is[static_cast<std::size_t>(axis)] = 6;
        V iv = indices(is.numel(), xs[static_cast<std::size_t>(axis)], axis);
        Tensor x = kt::make_tensor(xv, xs, f32), index = kt::make_tensor(iv, is, it);
        V want = gathered(xv, xs, static_cast<std::size_t>(axis), iv, is);
        Tensor g = gather(x, axis, index);
        CHECK(g.shape() == is);
        CHECK(g.dtype() == f32);
        KILN_CHECK_CLOSE(g, want, kt::Tolerance{0, 0});
        KILN_CHECK_CLOSE(gather(x, axis - 3, index), want, kt::Tolerance{0, 0});  // the same dim, negative
      }
    }
  }
}

TEST_CASE("gather keeps every dtype's values exactly") {
  const Shape xs{4, 6};
  const V iv = indices(12, 6);
  for (DType dt : {f64, f32, f16, bf16, i64, i32, DType::Bool}) {
    CAPTURE(dtype_name(dt));
    V xv = kt::values_for(dt, 24);
    Tensor g = gather(kt::make_tensor(xv, xs, dt), 1, kt::make_tensor(iv, {4, 3}, i64));
    CHECK(g.dtype() == dt);
    KILN_CHECK_CLOSE(g.to(f64), gathered(xv, xs, 1, iv, {4, 3}), kt::Tolerance{0, 0});
  }
}

TEST_CASE("gathers read transposed and computed inputs at computed indices, fused into one kernel") {
  const Shape xs{5, 7};
  const V xv = counting(xs);
  Tensor x = kt::make_tensor(xv, xs, f32);
  const V iv = indices(10, 7);
  Tensor index = kt::make_tensor(iv, {5, 2}, i32);
  // x.T gathered along its dim 0 reads x's columns.
  Tensor xt = transpose(x, 0, 1);  // [7, 5]
  const V tv = indices(10, 7, 3);
  V xtv(35);
  for (int i = 0; i < 7; ++i)
    for (int j = 0; j < 5; ++j) xtv[static_cast<std::size_t>(i * 5 + j)] = xv[static_cast<std::size_t>(j * 7 + i)];
  KILN_CHECK_CLOSE(gather(xt, 0, kt::make_tensor(tv, {2, 5}, i64)), gathered(xtv, {7, 5}, 0, tv, {2, 5}),
                   kt::Tolerance{0, 0});
  // A computed input at a computed index: one kernel reads x, the index, and writes the result.
  Tensor doubled_index = index * 2 - index;  // lazy int32 arithmetic, the same values
  reset_stats();
  Tensor g = gather(x * 3.0f + 1.0f, 1, doubled_index);
  V want = gathered(xv, xs, 1, iv, {5, 2});
  for (auto& w : want) w = w * 3 + 1;
  KILN_CHECK_CLOSE(g, want, kt::Tolerance{0, 0});
  if (get_backend() == Backend::Jit) CHECK(stats().launches == 1);
}

TEST_CASE("index_select picks whole slices; take_along_dim broadcasts or flattens") {
  const Shape xs{3, 4};
  const V xv = counting(xs);
  Tensor x = kt::make_tensor(xv, xs, f32);
  Tensor picks = kt::make_tensor({2, 0, 2, 1}, {4}, i64);
  KILN_CHECK_CLOSE(index_select(x, 0, picks), V{8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7},
                   kt::Tolerance{0, 0});
  CHECK(index_select(x, 0, picks).shape() == Shape{4, 4});
  KILN_CHECK_CLOSE(index_select(x, -1, kt::make_tensor({3, 0}, {2}, i32)), V{3, 0, 7, 4, 11, 8}, kt::Tolerance{0, 0});
  KILN_CHECK_CLOSE(index_select(x, 1, kt::make_tensor({1}, {}, i64)), V{1, 5, 9}, kt::Tolerance{0, 0});
  // take_along_dim: argmax's indices pick each row's largest value.
  Tensor y = kt::make_tensor({3, 9, 1, 4, 2, 8, 7, 0, 5, 6, 1, 2}, {3, 4}, f32);
  KILN_CHECK_CLOSE(take_along_dim(y, argmax(y, 1, true), 1), V{9, 8, 6}, kt::Tolerance{0, 0});
  // The index broadcasts over the input's other dims ([1, 2] against [3, 4]) and the input over the index's.
  KILN_CHECK_CLOSE(take_along_dim(x, kt::make_tensor({3, 1}, {1, 2}, i64), 1), V{3, 1, 7, 5, 11, 9},
                   kt::Tolerance{0, 0});
  Tensor col = kt::make_tensor({10, 20}, {2, 1}, f32);
  Tensor two = kt::make_tensor({0, 0, 0, 0, 0, 0}, {2, 3}, i64);
  KILN_CHECK_CLOSE(take_along_dim(col, two, 1), V{10, 10, 10, 20, 20, 20}, kt::Tolerance{0, 0});
  // Without a dim: positions in the flattened input.
  KILN_CHECK_CLOSE(take_along_dim(x, kt::make_tensor({11, 0, 5}, {3}, i64)), V{11, 0, 5}, kt::Tolerance{0, 0});
}

TEST_CASE("embedding: rows at an index of any shape; embedding * scale + pos is one kernel") {
  const Shape ws{10, 6};
  const V wv = kt::uniform_values(60, -1, 1, f32, 3);
  Tensor w = kt::make_tensor(wv, ws, f32);
  const V iv = {3, 9, 0, 3, 7, 1};
  Tensor ids = kt::make_tensor(iv, {2, 3}, i64);
  Tensor e = embedding(w, ids);
  CHECK(e.shape() == Shape{2, 3, 6});
  V want;
  for (double i : iv)
    for (int j = 0; j < 6; ++j) want.push_back(wv[static_cast<std::size_t>(i) * 6 + static_cast<std::size_t>(j)]);
  KILN_CHECK_CLOSE(e, want, kt::Tolerance{0, 0});
  // The lookup, a scale and a position table: one kernel reading W, ids and pos.
  const V pv = kt::uniform_values(18, -1, 1, f32, 4);
  Tensor pos = kt::make_tensor(pv, {3, 6}, f32);
  reset_stats();
  Tensor y = embedding(w, ids) * 2.0f + pos;
  V yw(want.size());
  for (std::size_t k = 0; k < yw.size(); ++k)
    yw[k] = static_cast<double>(static_cast<float>(want[k]) * 2.0f + static_cast<float>(pv[k % 18]));
  KILN_CHECK_CLOSE(y, yw, kt::Tolerance{0, 0});
  if (get_backend() == Backend::Jit) CHECK(stats().launches == 1);
  // An int32 index of one element, and a scalar index.
  KILN_CHECK_CLOSE(embedding(w, kt::make_tensor({9}, {1}, i32)), V(wv.begin() + 54, wv.end()), kt::Tolerance{0, 0});
  CHECK(embedding(w, kt::make_tensor({2}, {}, i64)).shape() == Shape{6});
  // At arange(n) (a position embedding): the first n rows as a slice, whose gradient pads the
  // upstream gradient with zero rows (no scatter); past the table's end it stays a checked gather.
  Tensor wg = kt::make_tensor(wv, ws, f32).requires_grad_();
  Tensor first = embedding(wg, arange(4, i64, kt::device()));
  CHECK(first.node()->op != ir::Op::Gather);
  KILN_CHECK_CLOSE(first, V(wv.begin(), wv.begin() + 24), kt::Tolerance{0, 0});
  sum(first * kt::make_tensor(kt::uniform_values(24, -1, 1, f32, 5), {4, 6}, f32)).backward();
  const V up = kt::uniform_values(24, -1, 1, f32, 5);
  V grad(60, 0.0);
  std::copy(up.begin(), up.end(), grad.begin());
  KILN_CHECK_CLOSE(wg.grad(), grad, kt::Tolerance{0, 0});
  KILN_CHECK_THROWS_MENTIONING(IndexError, embedding(w, arange(11, i64, kt::device())).to_vector<float>(), "embedding",
                               "index 10", "size 10");
}

TEST_CASE("empty index sets give empty results of the right shape") {
  Tensor x = kt::make_tensor(counting({3, 4}), {3, 4}, f32);
  Tensor none = kt::make_tensor({}, {0}, i64);
  CHECK(index_select(x, 0, none).shape() == Shape{0, 4});
  CHECK(index_select(x, 0, none).to_vector<float>().empty());
  CHECK(gather(x, 1, kt::make_tensor({}, {3, 0}, i64)).shape() == Shape{3, 0});
  CHECK(embedding(x, kt::make_tensor({}, {2, 0}, i32)).shape() == Shape{2, 0, 4});
  // Nothing to read from is fine while nothing is read.
  Tensor empty_rows = kt::make_tensor({}, {0, 4}, f32);
  CHECK(index_select(empty_rows, 0, none).shape() == Shape{0, 4});
  CHECK_THROWS_AS(index_select(empty_rows, 0, kt::make_tensor({0}, {1}, i64)), IndexError);
  // cross_entropy over no rows gathers nothing: the mean of nothing, NaN (fuzz seed 32 graph 2636).
  CHECK(std::isnan(cross_entropy(kt::make_tensor({}, {0, 1}, f32), kt::make_tensor({}, {0}, i32)).item<float>()));
}

TEST_CASE("out-of-range indices: IndexError naming the op, before compiling when the index is on the host") {
  Tensor w = kt::make_tensor(counting({5, 4}), {5, 4}, f32);
  if (kt::device().is_cpu()) {
    Tensor bad = kt::make_tensor({1, 5}, {2}, i64);
    reset_stats();
    KILN_CHECK_THROWS_MENTIONING(IndexError, embedding(w, bad), "embedding", "index 5", "size 5", "float32[5, 4]");
    KILN_CHECK_THROWS_MENTIONING(IndexError, index_select(w, 0, kt::make_tensor({-1}, {1}, i32)), "index_select",
                                 "index -1");
    KILN_CHECK_THROWS_MENTIONING(IndexError, gather(w, 1, kt::make_tensor({0, 4}, {1, 2}, i64)), "gather", "index 4",
                                 "dimension 1 with size 4");
    CHECK(stats().compiles == 0);
    CHECK(stats().graphs == 0);
  }
  // A computed index is checked by the kernel that reads it: the error names the op and the value
  // (on the CPU when the kernel has run, the result never handed out; on a GPU, whose kernels run
  // asynchronously, when the result is read back), and the next run is unaffected.
  Tensor lazy_bad = kt::make_tensor({1, 2, 7}, {3}, i64) + std::int64_t(0);
  Tensor e = embedding(w, lazy_bad);
  KILN_CHECK_THROWS_MENTIONING(IndexError, e.to_vector<float>(), "embedding", "index 7", "size 5");
  if (kt::device().is_cpu()) CHECK_FALSE(e.is_evaluated());
  Tensor negative = kt::make_tensor({-2, 0}, {2}, i64) * std::int64_t(1);
  KILN_CHECK_THROWS_MENTIONING(IndexError, take_along_dim(w, negative).to_vector<float>(), "take_along_dim",
                               "index -2");
  Tensor good = embedding(w, kt::make_tensor({4, 0}, {2}, i64) + std::int64_t(0));
  KILN_CHECK_CLOSE(good, V{16, 17, 18, 19, 0, 1, 2, 3}, kt::Tolerance{0, 0});
}

TEST_CASE("bad arguments: typed errors naming the op, the shapes and the dtypes") {
  Tensor x = kt::make_tensor(counting({3, 4}), {3, 4}, f32);
  KILN_CHECK_THROWS_MENTIONING(DTypeError, gather(x, 0, kt::make_tensor({0}, {1, 1}, f32)), "gather", "float32[1, 1]");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, gather(x, 0, kt::make_tensor({0}, {1}, i64)), "gather", "rank");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, gather(x, 0, kt::make_tensor({0, 0, 0, 0, 0}, {1, 5}, i64)), "gather",
                               "dimension 1");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, gather(x, 2, kt::make_tensor({0}, {1, 1}, i64)), "gather", "axis 2");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, index_select(x, 0, kt::make_tensor({0, 0}, {1, 2}, i64)), "index_select",
                               "1-d");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, embedding(kt::make_tensor({0}, {1}, f32), kt::make_tensor({0}, {1}, i64)),
                               "embedding", "2-d");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, take_along_dim(x, kt::make_tensor({0}, {1}, i64), 0), "take_along_dim",
                               "number of dimensions");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, take_along_dim(x, kt::make_tensor({0, 0}, {2, 1}, i64), 1),
                               "take_along_dim", "broadcast");
}

namespace {

/// torch.scatter / scatter_add by definition, sequentially in index order, in float arithmetic of
/// `dt` (what the deterministic kernels compute, bit for bit).
V scattered(V out, const Shape& os, std::size_t axis, const V& index, const V& src, const Shape& is, bool add, DType dt) {
  Strides ost = contiguous_strides(os);
  std::vector<std::int64_t> p(is.size(), 0);
  for (std::size_t flat = 0; flat < index.size(); ++flat) {
    std::int64_t off = 0;
    for (std::size_t d = 0; d < is.size(); ++d) off += (d == axis ? static_cast<std::int64_t>(index[flat]) : p[d]) * ost[d];
    double& o = out[static_cast<std::size_t>(off)];
    o = add ? kt::round_to(o + src[flat], dt) : src[flat];
    for (std::size_t d = is.size(); d-- > 0;) {
      if (++p[d] < is[d]) break;
      p[d] = 0;
    }
  }
  return out;
}

}  // namespace

TEST_CASE("scatter and scatter_add along every dim, repeated indices in index order, on both executors") {
  BackendGuard guard;
  const Shape xs{4, 5, 3};
  for (auto [backend, name] : kBackends) {
    set_backend(backend);
    for (std::int64_t axis = 0; axis < 3; ++axis) {
      CAPTURE(name);
      CAPTURE(axis);
      Shape is{3, 4, 2};
      is[static_cast<std::size_t>(axis)] = 7;  // more positions than the dim: repeats
      const V iv = indices(is.numel(), xs[static_cast<std::size_t>(axis)], axis);
      const V xv = kt::uniform_values(static_cast<std::size_t>(xs.numel()), -1, 1, f32, 5);
      const V sv = kt::uniform_values(static_cast<std::size_t>(is.numel()), -1, 1, f32, 6);
      Tensor x = kt::make_tensor(xv, xs, f32), index = kt::make_tensor(iv, is, i64), src = kt::make_tensor(sv, is, f32);
      KILN_CHECK_CLOSE(scatter_add(x, axis, index, src), scattered(xv, xs, static_cast<std::size_t>(axis), iv, sv, is, true, f32),
                       kt::Tolerance{0, 0});
      KILN_CHECK_CLOSE(scatter(x, axis - 3, index, src), scattered(xv, xs, static_cast<std::size_t>(axis), iv, sv, is, false, f32),
                       kt::Tolerance{0, 0});
    }
  }
}

TEST_CASE("scatter_add and index_add: every dtype, int32 indices, exact sums and the same bits run to run") {
  for (DType dt : {f64, f32, f16, bf16, i64, i32, DType::Bool}) {
    CAPTURE(dtype_name(dt));
    const Shape xs{6, 4}, ss{9, 4};
    const V xv = kt::values_for(dt, 24, -3, 3, 7), sv = kt::values_for(dt, 36, -3, 3, 8);
    const V iv = indices(9, 6);
    V spread;
    for (double i : iv)
      for (int j = 0; j < 4; ++j) spread.push_back(i);
    Tensor x = kt::make_tensor(xv, xs, dt), src = kt::make_tensor(sv, ss, dt);
    const V want = scattered(xv, xs, 0, spread, sv, ss, true, dt);
    Tensor a = index_add(x, 0, kt::make_tensor(iv, {9}, i32), src);
    KILN_CHECK_CLOSE(a.to(f64), want, kt::Tolerance{0, 0});
    KILN_CHECK_CLOSE(scatter_add(x, 0, kt::make_tensor(spread, ss, i64), src).to(f64), want, kt::Tolerance{0, 0});
    // A second run of the same graph gives the same bits.
    Tensor b = index_add(x, 0, kt::make_tensor(iv, {9}, i32), src);
    CHECK(a.to(f64).to_vector<double>() == b.to(f64).to_vector<double>());
  }
  // Many repeats of few rows, large enough to be shared among threads (a GPU: among blocks).
  const V xv = kt::uniform_values(300 * 64, -1, 1, f32, 9), sv = kt::uniform_values(5000 * 64, -1, 1, f32, 10);
  const V iv = indices(5000, 300, 11);
  V spread;
  for (double i : iv)
    for (int j = 0; j < 64; ++j) spread.push_back(i);
  Tensor big = index_add(kt::make_tensor(xv, {300, 64}, f32), 0, kt::make_tensor(iv, {5000}, i64),
                         kt::make_tensor(sv, {5000, 64}, f32));
  KILN_CHECK_CLOSE(big, scattered(xv, {300, 64}, 0, spread, sv, {5000, 64}, true, f32), kt::Tolerance{0, 0});
}

TEST_CASE("index_copy, index_add with alpha, scatter of a value; non-contiguous and larger sources; fused producers") {
  const Shape xs{4, 3};
  const V xv = counting(xs);
  Tensor x = kt::make_tensor(xv, xs, f32);
  Tensor idx = kt::make_tensor({1, 3, 1, 0}, {4}, i64);
  Tensor src = kt::make_tensor(counting({4, 3}), {4, 3}, f32) * 10.0f;  // computed
  KILN_CHECK_CLOSE(index_copy(x, 0, idx, src), V{90, 100, 110, 60, 70, 80, 6, 7, 8, 30, 40, 50}, kt::Tolerance{0, 0});
  KILN_CHECK_CLOSE(index_add(x, 0, idx, src, 0.5), V{45, 51, 57, 33, 44, 55, 6, 7, 8, 24, 30, 36}, kt::Tolerance{0, 0});
  // Along the last dim, the source a transposed leaf.
  Tensor srcT = transpose(kt::make_tensor(counting({2, 4}), {2, 4}, f32), 0, 1);  // [4, 2]
  KILN_CHECK_CLOSE(index_add(x, 1, kt::make_tensor({2, 2}, {2}, i64), srcT), V{0, 1, 6, 3, 4, 11, 6, 7, 16, 9, 10, 21},
                   kt::Tolerance{0, 0});
  // scatter: src larger than index (its leading part is used), and a value.
  Tensor g = kt::make_tensor({2, 0, 1}, {1, 3}, i64);
  KILN_CHECK_CLOSE(scatter(x, 1, g, kt::make_tensor(counting({2, 4}), {2, 4}, f32) + 100.0f),
                   V{101, 102, 100, 3, 4, 5, 6, 7, 8, 9, 10, 11}, kt::Tolerance{0, 0});
  KILN_CHECK_CLOSE(scatter(x, 0, kt::make_tensor({3, 0, 3}, {1, 3}, i64), -1.0), V{0, -1, 2, 3, 4, 5, 6, 7, 8, -1, 10, -1},
                   kt::Tolerance{0, 0});
  // The result feeds more work, and an empty index leaves the input as it was.
  KILN_CHECK_CLOSE(sum(index_add(x, 0, idx * std::int64_t(1), src), 1), V{303, 252, 21, 150}, kt::Tolerance{0, 0});
  KILN_CHECK_CLOSE(index_add(x, 0, kt::make_tensor({}, {0}, i64), kt::make_tensor({}, {0, 3}, f32)), xv,
                   kt::Tolerance{0, 0});
  // Atomic accumulation (the GPU's opt-in; elsewhere the deterministic kernels) sums the same values.
  set_scatter_mode(ScatterMode::Atomic);
  Tensor atomic = index_add(x, 0, idx, src);
  set_scatter_mode(ScatterMode::Deterministic);
  KILN_CHECK_CLOSE(atomic, V{90, 101, 112, 63, 84, 105, 6, 7, 8, 39, 50, 61}, kt::Tolerance{0, 0});
  // Runs of ten rows a target, summed in any order by the atomic mode: close to the ordered sums.
  std::vector<double> ids(3000), rows(3000 * 64);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<double>((i * 7919) % 300);
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<double>(i % 97) / 3.0 + 1.0 / 7.0;
  Tensor many = kt::make_tensor(ids, {3000}, i64), many_src = kt::make_tensor(rows, {3000, 64}, f32);
  Tensor ordered_sums = index_add(zeros({300, 64}).to(kt::device()), 0, many, many_src).eval();
  // Deterministic: each run summed in position order, the bits of a plain loop in float.
  std::vector<float> in_order(300 * 64, 0.0f);
  for (std::size_t p = 0; p < ids.size(); ++p)
    for (std::size_t j = 0; j < 64; ++j)
      in_order[static_cast<std::size_t>(ids[p]) * 64 + j] += static_cast<float>(rows[p * 64 + j]);
  KILN_CHECK_CLOSE(ordered_sums, std::vector<double>(in_order.begin(), in_order.end()), kt::Tolerance{0, 0});
  set_scatter_mode(ScatterMode::Atomic);
  Tensor any_order_sums = index_add(zeros({300, 64}).to(kt::device()), 0, many, many_src).eval();
  set_scatter_mode(ScatterMode::Deterministic);
  KILN_CHECK_CLOSE(any_order_sums, kt::values(ordered_sums), kt::Tolerance{1e-5, 1e-4});
}

TEST_CASE("scatters: range errors name the op and nothing is written; bad arguments are typed errors") {
  Tensor x = kt::make_tensor(counting({4, 3}), {4, 3}, f32);
  Tensor src = kt::make_tensor(counting({2, 3}), {2, 3}, f32);
  if (kt::device().is_cpu()) {
    reset_stats();
    KILN_CHECK_THROWS_MENTIONING(IndexError, index_add(x, 0, kt::make_tensor({1, 4}, {2}, i64), src), "index_add",
                                 "index 4", "size 4");
    KILN_CHECK_THROWS_MENTIONING(IndexError, scatter_add(x, 1, kt::make_tensor({0, -1, 0}, {1, 3}, i64), src),
                                 "scatter_add", "index -1");
    CHECK(stats().compiles == 0);
  }
  // A computed index: found by the scatter's check before it writes; assigned into a view of a
  // leaf, the leaf is untouched.
  Tensor target = kt::make_tensor(counting({4, 3}), {4, 3}, f32);
  Tensor bad = kt::make_tensor({1, 9}, {2}, i64) + std::int64_t(0);
  KILN_CHECK_THROWS_MENTIONING(IndexError, {
    target.assign(index_add(x, 0, bad, src));
    (void)target.to_vector<float>();
  }, "index_add", "index 9");
  KILN_CHECK_CLOSE(target, counting({4, 3}), kt::Tolerance{0, 0});
  KILN_CHECK_THROWS_MENTIONING(DTypeError, index_add(x, 0, kt::make_tensor({0}, {1}, i64), kt::make_tensor({0, 0, 0}, {1, 3}, f64)),
                               "index_add", "float64[1, 3]");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, index_add(x, 0, kt::make_tensor({0, 1}, {2}, i64), kt::make_tensor({0, 0, 0}, {1, 3}, f32)),
                               "index_add", "[2, 3]");
  KILN_CHECK_THROWS_MENTIONING(ShapeError, scatter_add(x, 0, kt::make_tensor({0, 0, 0, 0}, {1, 4}, i64), src), "scatter_add",
                               "dimension 1");
  KILN_CHECK_THROWS_MENTIONING(DTypeError, scatter(x, 0, kt::make_tensor({0}, {1, 1}, f32), src), "scatter", "float32[1, 1]");
}

}  // namespace kiln_test_tensor_indexing
