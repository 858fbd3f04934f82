// Sorting and selection: sort, argsort, topk, msort, and max/min along a dim with their indices,
// on both executors, against std::stable_sort of the same numbers (NaN the largest, -0 equal to
// +0, equal values by position): positions exactly, values exactly. Every dtype, every dim,
// ascending and descending, ties, NaN, non-contiguous and computed inputs, long rows (a GPU's
// radix select down to the position digits, rows kept in global scratch), 0-dim and empty
// tensors, typed errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>
#include <vector>

#include "../support/reference.hpp"

namespace kiln_test_tensor_sorting {

using namespace kiln;
namespace kt = kiln::testing;

namespace {

using V = std::vector<double>;
using I = std::vector<std::int64_t>;

struct BackendGuard {
  Backend saved = get_backend();
  ~BackendGuard() { set_backend(saved); }
};
const std::pair<Backend, const char*> kBackends[] = {{Backend::Jit, "jit"}, {Backend::Eager, "reference"}};

/// What sort / topk must give for row-major `x` of shape `s` along `axis`: the positions of the
/// `k` first elements of each row (a stable sort; NaN the largest) and their values, laid out as
/// x with k along the axis.
std::pair<I, V> expected(const V& x, const Shape& s, std::size_t axis, std::int64_t k, bool descending) {
  Shape os = s;
  os[axis] = k;
  I pos(static_cast<std::size_t>(os.numel()));
  V val(pos.size());
  const Strides xs = contiguous_strides(s), ost = contiguous_strides(os);
  auto less = [](double a, double b) { return std::isnan(b) ? !std::isnan(a) : a < b; };
  for (std::int64_t flat = 0; flat < os.numel(); ++flat) {
    std::vector<std::int64_t> at = kt::unravel(flat, os);
    if (at[axis] != 0) continue;  // each row from its first output
    std::int64_t xo = 0, oo = 0;
    for (std::size_t d = 0; d < s.size(); ++d) {
      xo += at[d] * xs[d];
      oo += at[d] * ost[d];
    }
    std::vector<std::int64_t> order(static_cast<std::size_t>(s[axis]));
    std::iota(order.begin(), order.end(), 0);
    auto v = [&](std::int64_t i) { return x[static_cast<std::size_t>(xo + i * xs[axis])]; };
    std::stable_sort(order.begin(), order.end(),
                     [&](std::int64_t a, std::int64_t b) { return descending ? less(v(b), v(a)) : less(v(a), v(b)); });
    for (std::int64_t j = 0; j < k; ++j) {
      pos[static_cast<std::size_t>(oo + j * ost[axis])] = order[static_cast<std::size_t>(j)];
      val[static_cast<std::size_t>(oo + j * ost[axis])] = v(order[static_cast<std::size_t>(j)]);
    }
  }
  return {pos, val};
}

const kt::Tolerance kExact{0, 0};

}  // namespace

TEST_CASE("sort and argsort along every dim, every dtype, both directions, both executors") {
  BackendGuard guard;
  const Shape s{3, 4, 5};
  for (auto [backend, name] : kBackends) {
    set_backend(backend);
    for (DType dt : kt::kAllDTypes) {
      V x = kt::values_for(dt, 60, -2, 2, 7);  // small integers: many ties
      if (is_floating(dt)) {
        x[3] = NAN, x[17] = -0.0, x[18] = 0.0, x[40] = INFINITY, x[41] = -INFINITY, x[44] = NAN;
        for (std::size_t i = 20; i < 30; ++i) x[i] = 1.0;  // a run of equal values
      }
      Tensor t = kt::make_tensor(x, s, dt);
      for (std::int64_t axis = 0; axis < 3; ++axis)
        for (bool descending : {false, true}) {
          CAPTURE(name);
          CAPTURE(dtype_name(dt));
          CAPTURE(axis);
          CAPTURE(descending);
          auto [want_pos, want_val] = expected(x, s, static_cast<std::size_t>(axis), s[static_cast<std::size_t>(axis)], descending);
          auto [values, indices] = sort(t, axis - (descending ? 3 : 0), descending);
          CHECK(values.dtype() == dt);
          CHECK(indices.dtype() == i64);
          CHECK(values.shape() == s);
          KILN_CHECK_EXACT(indices, want_pos);
          KILN_CHECK_CLOSE(values.to(f64), want_val, kExact);
          KILN_CHECK_EXACT(argsort(t, axis, descending, /*stable=*/true), want_pos);
        }
    }
  }
}

TEST_CASE("topk: largest and smallest, every k, ties by position, NaN the largest, on both executors") {
  BackendGuard guard;
  const Shape s{4, 37};
  V x = kt::integer_values(static_cast<std::size_t>(s.numel()), -6, 6, 3);
  x[5] = NAN, x[40] = NAN, x[41] = NAN, x[77] = -0.0;
  for (auto [backend, name] : kBackends) {
    set_backend(backend);
    for (DType dt : {f32, f64, bf16, i32, i64}) {
      V xv = x;
      if (!is_floating(dt))
        for (auto& v : xv) v = std::isnan(v) ? 9 : v;
      Tensor t = kt::make_tensor(xv, s, dt);
      for (std::int64_t k : {0, 1, 5, 36, 37})
        for (bool largest : {true, false}) {
          CAPTURE(name);
          CAPTURE(dtype_name(dt));
          CAPTURE(k);
          CAPTURE(largest);
          auto [want_pos, want_val] = expected(xv, s, 1, k, largest);
          auto [values, indices] = topk(t, k, -1, largest);
          CHECK(values.shape() == Shape{4, k});
          KILN_CHECK_EXACT(indices, want_pos);
          KILN_CHECK_CLOSE(values.to(f64), want_val, kExact);
        }
      // Along the first dim (a strided row).
      auto [want_pos, want_val] = expected(xv, s, 0, 2, true);
      auto [values, indices] = topk(t, 2, 0);
      KILN_CHECK_EXACT(indices, want_pos);
      KILN_CHECK_CLOSE(values.to(f64), want_val, kExact);
    }
  }
}

TEST_CASE("topk and sort of long rows, transposed and computed inputs (the GPU's select and scratch paths)") {
  BackendGuard guard;
  for (auto [backend, name] : kBackends) {
    set_backend(backend);
    CAPTURE(name);
    // [8, 4096]: the benchmark's row length; every eighth value repeats so the select resolves
    // ties down to positions.
    V x = kt::uniform_values(8 * 4096, -100, 100, f32, 11);
    for (std::size_t i = 0; i < x.size(); i += 8) x[i] = 42.5;
    Tensor t = kt::make_tensor(x, {8, 4096}, f32);
    for (std::int64_t k : {64, 700}) {
      CAPTURE(k);
      auto [want_pos, want_val] = expected(x, {8, 4096}, 1, k, true);
      auto [values, indices] = topk(t, k);
      KILN_CHECK_EXACT(indices, want_pos);
      KILN_CHECK_CLOSE(values, want_val, kExact);
    }
    // Values and positions in one evaluation: the sort step writes the positions, one kernel
    // gathers the values (and fuses what is computed from them: here the scaling).
    reset_stats();
    auto [scaled, at] = topk(t, 64);
    Tensor doubled_values = scaled * 2.0f;
    eval(doubled_values, at);
    if (backend == Backend::Jit) CHECK(stats().launches == 2);
    // A computed, transposed input: topk over x.T * 2 along dim 0.
    V doubled(x.size());
    for (std::size_t r = 0; r < 8; ++r)
      for (std::size_t c = 0; c < 4096; ++c) doubled[c * 8 + r] = 2 * x[r * 4096 + c];
    auto [want_pos, want_val] = expected(doubled, {4096, 8}, 0, 3, false);
    auto [values, indices] = topk(transpose(t, 0, 1) * 2.0f, 3, 0, /*largest=*/false);
    KILN_CHECK_EXACT(indices, want_pos);
    KILN_CHECK_CLOSE(values, want_val, kExact);
    // Rows too long for a GPU block's shared memory: a full sort of 20000 floats, of 9000
    // doubles, and a top-k of 30000 int64 values.
    V y = kt::uniform_values(2 * 20000, -1, 1, f32, 12);
    auto [ys, yi] = sort(kt::make_tensor(y, {2, 20000}, f32), 1, true);
    KILN_CHECK_EXACT(yi, expected(y, {2, 20000}, 1, 20000, true).first);
    V z = kt::uniform_values(2 * 9000, -1, 1, f64, 13);
    KILN_CHECK_EXACT(argsort(kt::make_tensor(z, {9000, 2}, f64), 0), expected(z, {9000, 2}, 0, 9000, false).first);
    V w = kt::integer_values(30000, -1000, 1000, 14);
    KILN_CHECK_EXACT(std::get<1>(topk(kt::make_tensor(w, {30000}, i64), 100)), expected(w, {30000}, 0, 100, true).first);
  }
}

TEST_CASE("topk, sort: 0-dim and empty inputs; bad k and dims are typed errors before anything runs") {
  BackendGuard guard;
  for (auto [backend, name] : kBackends) {
    set_backend(backend);
    CAPTURE(name);
    Tensor s = kt::make_tensor({2.5}, {}, f32);
    auto [v, i] = topk(s, 1);
    CHECK(v.shape() == Shape{});
    CHECK(v.item<float>() == 2.5f);
    CHECK(i.item<std::int64_t>() == 0);
    auto [sv, si] = sort(s);
    CHECK(sv.item<float>() == 2.5f);
    Tensor e = zeros({3, 0});
    auto [ev, ei] = sort(e, 1);
    CHECK(ev.shape() == Shape{3, 0});
    CHECK(ei.to_vector<std::int64_t>().empty());
    CHECK(std::get<0>(topk(e, 0, 1)).shape() == Shape{3, 0});
    CHECK(std::get<1>(topk(zeros({0, 4}), 2)).shape() == Shape{0, 2});
    Tensor x = zeros({3, 4});
    const auto before = stats();
    KILN_CHECK_THROWS_MENTIONING(ValueError, topk(x, 5), "topk", "k = 5", "size 4", "float32[3, 4]");
    KILN_CHECK_THROWS_MENTIONING(ValueError, topk(x, -1), "topk", "k = -1");
    KILN_CHECK_THROWS_MENTIONING(ShapeError, sort(x, 2), "sort", "axis 2", "float32[3, 4]");
    KILN_CHECK_THROWS_MENTIONING(ShapeError, argsort(x, -3), "sort", "axis -3");
    CHECK(stats().compiles == before.compiles);
  }
}

TEST_CASE("max and min along a dim give values and int64 indices, as torch.max(x, dim)") {
  BackendGuard guard;
  for (auto [backend, name] : kBackends) {
    set_backend(backend);
    CAPTURE(name);
    Tensor x = kt::make_tensor({3, 7, 7, 1, NAN, 2, -0.0, 0.0}, {2, 4}, f32);
    auto [v, i] = max(x, 1);
    KILN_CHECK_CLOSE(v, V{7, NAN}, kExact);
    KILN_CHECK_EXACT(i, I{1, 0});  // the first maximum; a NaN is the maximum
    CHECK(i.dtype() == i64);
    Tensor mv, mi;
    std::tie(mv, mi) = min(x, 0, /*keepdim=*/true);
    CHECK(mv.shape() == Shape{1, 4});
    KILN_CHECK_CLOSE(mv, V{NAN, 2, -0.0, 0.0}, kExact);
    KILN_CHECK_EXACT(mi, I{1, 1, 1, 1});
    KILN_CHECK_EXACT(std::get<1>(max(x, -2)), I{1, 0, 0, 0});  // NaN is the maximum of column 0
    ValuesIndices r = min(x, -1);
    KILN_CHECK_CLOSE(r.values(), V{1, NAN}, kExact);
    KILN_CHECK_EXACT(r.indices(), I{3, 0});
    // The result stands for its values where a Tensor is expected.
    KILN_CHECK_CLOSE(max(x, 1) + 1.0f, V{8, NAN}, kExact);
    Tensor m = max(x, 0);
    KILN_CHECK_CLOSE(m, V{NAN, 7, 7, 1}, kExact);
    // Integers and bool (positions of the first true).
    auto [iv, ii] = max(kt::make_int_tensor({4, -2, 4, 9, 9, 1}, {2, 3}, i32), 1);
    CHECK(iv.dtype() == i32);
    KILN_CHECK_EXACT(iv, I{4, 9});
    KILN_CHECK_EXACT(ii, I{0, 0});
    auto [bv, bi] = max(kt::make_tensor({0, 0, 1, 1}, {4}, DType::Bool), 0);
    CHECK(bv.dtype() == DType::Bool);
    KILN_CHECK_EXACT(bi, I{2});
    // 0-dim: the value at position 0; an empty dim is a ShapeError.
    auto [zv, zi] = max(kt::make_tensor({1.5}, {}, f64), 0);
    CHECK(zv.item<double>() == 1.5);
    CHECK(zi.item<std::int64_t>() == 0);
    KILN_CHECK_THROWS_MENTIONING(ShapeError, max(zeros({2, 0}), 1), "max", "size 0");
    // Several dims or all of them: the values alone (amax / max over Axes).
    KILN_CHECK_CLOSE(amax(x, {0, 1}), V{NAN}, kExact);
    KILN_CHECK_CLOSE(amin(kt::make_tensor({3, 1, 2}, {3}, f32)), V{1}, kExact);
  }
}

}  // namespace kiln_test_tensor_sorting
