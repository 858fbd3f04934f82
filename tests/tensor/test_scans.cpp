// Scans: cumsum, cumprod, cummax/cummin (values and indices), logcumsumexp along every dim, on
// both executors, against a plain loop over the same numbers (floats summed in double, each
// prefix rounded once: bit for bit on the CPU); integer and bool inputs give int64; ties, NaN,
// -inf, non-contiguous and computed inputs, empty and 0-dim tensors, typed errors.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "../support/reference.hpp"

namespace kiln_test_tensor_scans {

using namespace kiln;
namespace kt = kiln::testing;

namespace {

using V = std::vector<double>;

struct BackendGuard {
  Backend saved = get_backend();
  ~BackendGuard() { set_backend(saved); }
};
const std::pair<Backend, const char*> kBackends[] = {{Backend::Jit, "jit"}, {Backend::Eager, "reference"}};

/// The running `f` of row-major `x` of shape `s` along `axis` (f(acc, v, i) from acc = `init`).
template <class F>
V running(const V& x, const Shape& s, std::size_t axis, double init, F f) {
  V out(x.size());
  const Strides st = contiguous_strides(s);
  for (std::size_t flat = 0; flat < x.size(); ++flat) {
    const std::int64_t i = (static_cast<std::int64_t>(flat) / st[axis]) % s[axis];
    if (i != 0) continue;  // each row from its first element
    double acc = init;
    for (std::int64_t k = 0; k < s[axis]; ++k) {
      const std::size_t at = flat + static_cast<std::size_t>(k * st[axis]);
      acc = f(acc, x[at], k);
      out[at] = acc;
    }
  }
  return out;
}

/// Exact on the CPU (the same order of operations); a GPU's warp-wide scan sums in another
/// order (in double): the dtype's tolerance.
kt::Tolerance scan_tolerance(DType dt) { return kt::device().is_cpu() ? kt::Tolerance{0, 0} : kt::tolerance(dt); }

}  // namespace

TEST_CASE("cumsum and cumprod along every dim, every dtype, on both executors") {
  BackendGuard guard;
  const Shape s{3, 4, 5};
  for (auto [backend, name] : kBackends) {
    set_backend(backend);
    for (DType dt : {f32, f64, f16, bf16, i32, i64, DType::Bool}) {
      const V x = kt::values_for(dt, 60, -2, 2, 3);
      Tensor t = kt::make_tensor(x, s, dt);
      const DType out = is_floating(dt) ? dt : i64;
      for (std::int64_t axis = 0; axis < 3; ++axis) {
        CAPTURE(name);
        CAPTURE(dtype_name(dt));
        CAPTURE(axis);
        auto round = [&](double v) { return is_floating(dt) ? kt::round_to(v, out) : v; };
        Tensor c = cumsum(t, axis);
        CHECK(c.dtype() == out);
        // Each output is the prefix in double, rounded once to the output dtype.
        V sums = running(x, s, static_cast<std::size_t>(axis), 0.0, [&](double a, double v, std::int64_t) { return a + v; });
        for (auto& v : sums) v = round(v);
        KILN_CHECK_CLOSE(c.to(f64), sums, scan_tolerance(dt));
        V p = running(x, s, static_cast<std::size_t>(axis), 1.0, [&](double a, double v, std::int64_t) { return a * v; });
        for (auto& v : p) v = round(v);
        KILN_CHECK_CLOSE(cumprod(t, axis - 3).to(f64), p, scan_tolerance(dt));
      }
    }
  }
}

TEST_CASE("cummax and cummin: the latest index among equal values, the first NaN kept") {
  BackendGuard guard;
  for (auto [backend, name] : kBackends) {
    set_backend(backend);
    CAPTURE(name);
    Tensor y = kt::make_tensor({3, 1, 3, NAN, 2, 5, 1, 1}, {8}, f32);
    auto [v, i] = cummax(y, 0);
    KILN_CHECK_CLOSE(v, V{3, 3, 3, NAN, NAN, NAN, NAN, NAN}, kt::Tolerance{0, 0});
    KILN_CHECK_EXACT(i, std::vector<std::int64_t>{0, 0, 2, 3, 3, 3, 3, 3});
    auto [w, j] = cummin(kt::make_tensor({3, 1, 1, 4, 0, 2, 0}, {7}, i32), 0);
    CHECK(w.dtype() == i32);
    KILN_CHECK_EXACT(w, std::vector<std::int64_t>{3, 1, 1, 1, 0, 0, 0});
    KILN_CHECK_EXACT(j, std::vector<std::int64_t>{0, 1, 2, 2, 4, 4, 6});
    // Along the first dim of a matrix, and of bools.
    Tensor m = kt::make_tensor({1, 5, 4, 2, 4, 9}, {3, 2}, f64);
    auto [mv, mi] = cummax(m, 0);
    KILN_CHECK_CLOSE(mv, V{1, 5, 4, 5, 4, 9}, kt::Tolerance{0, 0});
    KILN_CHECK_EXACT(mi, std::vector<std::int64_t>{0, 0, 1, 0, 2, 2});
    auto [bv, bi] = cummax(kt::make_tensor({0, 1, 0, 1}, {4}, DType::Bool), 0);
    KILN_CHECK_EXACT(bi, std::vector<std::int64_t>{0, 1, 1, 3});
  }
}

TEST_CASE("logcumsumexp: stable, -inf is the empty sum; rows of 1000 (many warp steps on a GPU)") {
  const V x = kt::uniform_values(3 * 1000, -30, 30, f32, 4);
  Tensor t = kt::make_tensor(x, {3, 1000}, f32);
  V want = running(x, {3, 1000}, 1, -INFINITY, [](double a, double v, std::int64_t) {
    const double m = std::max(a, v);
    return std::isinf(m) ? m : m + std::log1p(std::exp(-std::fabs(a - v)));
  });
  for (auto& v : want) v = kt::round_to(v, f32);
  KILN_CHECK_CLOSE(logcumsumexp(t, 1), want, kt::tolerance(f32));
  KILN_CHECK_CLOSE(logcumsumexp(kt::make_tensor({-INFINITY, 0, -INFINITY, 0}, {4}, f64), 0),
                   V{-INFINITY, 0, 0, std::log(2.0)}, kt::tolerance(f64));
  // A long row of a transposed (non-contiguous) computed input: cumsum of 2 * x.T.
  Tensor tt = transpose(t, 0, 1) * 2.0f;  // [1000, 3]
  V want2(3000);
  for (int c = 0; c < 3; ++c) {
    double acc = 0;
    for (int r = 0; r < 1000; ++r) {
      acc += 2.0 * static_cast<double>(static_cast<float>(x[static_cast<std::size_t>(c * 1000 + r)]));
      want2[static_cast<std::size_t>(r * 3 + c)] = kt::round_to(acc, f32);
    }
  }
  KILN_CHECK_CLOSE(cumsum(tt, 0), want2, scan_tolerance(f32));
}

TEST_CASE("scans: dtype argument, 0-dim and empty inputs, typed errors") {
  Tensor ints = kt::make_tensor({1, 2, 3}, {3}, i32);
  CHECK(cumsum(ints, 0).dtype() == i64);
  Tensor as_float = cumsum(ints, 0, f32);
  CHECK(as_float.dtype() == f32);
  KILN_CHECK_CLOSE(as_float, V{1, 3, 6}, kt::Tolerance{0, 0});
  KILN_CHECK_CLOSE(cumsum(kt::make_tensor({-0.0}, {1}, f32), 0), V{0.0}, kt::Tolerance{0, 0});  // +0, as torch
  Tensor scalar = kt::make_tensor({2.5}, {}, f32);
  CHECK(cumsum(scalar, 0).shape() == Shape{});
  KILN_CHECK_CLOSE(cumprod(scalar, -1), V{2.5}, kt::Tolerance{0, 0});
  CHECK(cumsum(kt::make_tensor({}, {2, 0}, f32), 1).shape() == Shape{2, 0});
  CHECK(std::get<1>(cummax(kt::make_tensor({}, {0, 3}, f32), 0)).shape() == Shape{0, 3});
  KILN_CHECK_THROWS_MENTIONING(ShapeError, cumsum(ints, 1), "cumsum", "axis 1");
  KILN_CHECK_THROWS_MENTIONING(DTypeError, logcumsumexp(ints, 0), "logcumsumexp", "int32[3]");
}

}  // namespace kiln_test_tensor_scans
