// The common torch functions composed of kiln's ops (tensor/composites.hpp and
// nn::functional's normalize, cosine_similarity, glu): values, dtypes, errors and gradients
// against PyTorch 2.11's (the expected numbers were printed by torch on the same inputs).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <kiln/kiln.hpp>

namespace kiln_test_tensor_composites {

using namespace kiln;

namespace {

Tensor vec(std::vector<double> v, const Shape& shape, DType dtype = f32) {
  return from_vector<double>(v, shape).to(dtype).eval();
}
Tensor vec(std::vector<double> v) {
  const auto n = static_cast<std::int64_t>(v.size());
  return vec(std::move(v), Shape{n});
}

void check_values(const Tensor& t, const std::vector<double>& want, double tol = 1e-6) {
  std::vector<double> got = t.to(f64).to_vector<double>();
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("element " << i << ": " << got[i] << " vs " << want[i]);
    if (std::isnan(want[i]))
      CHECK(std::isnan(got[i]));
    else if (std::isinf(want[i]))
      CHECK(got[i] == want[i]);
    else
      CHECK(std::abs(got[i] - want[i]) <= tol * (1 + std::abs(want[i])));
  }
}

}  // namespace

TEST_CASE("all, any and count_nonzero: torch's values, empty reductions, NaN, dtypes and errors") {
  const Tensor x = vec({1, 0, 2, -3, 0, 0}, {2, 3});
  CHECK(all(x).item<bool>() == false);
  CHECK(any(x).item<bool>() == true);
  CHECK(all(x).dtype() == DType::Bool);
  check_values(any(x, {1}), {1, 1});
  check_values(all(x, {0}), {1, 0, 0});
  check_values(any(x * vec({1, 1, 1, 0, 1, 1}, {2, 3}), {1}), {1, 0});
  CHECK(any(x, {-1}, true).shape() == Shape{2, 1});
  check_values(count_nonzero(x, {0}), {2, 0, 1});
  CHECK(count_nonzero(x).item<std::int64_t>() == 3);
  CHECK(count_nonzero(x).dtype() == DType::Int64);
  // NaN is nonzero; -0 is zero; an empty reduction: all true, any false.
  CHECK(all(vec({NAN, 1})).item<bool>());
  CHECK_FALSE(any(vec({-0.0, 0.0})).item<bool>());
  CHECK(all(zeros({0})).item<bool>());
  CHECK_FALSE(any(zeros({0})).item<bool>());
  // Any dtype, and the method forms on expressions.
  CHECK(all(vec({1, 1}, {2}, DType::Bool)).item<bool>());
  CHECK_FALSE(all(vec({1, 0}, {2}, DType::Int64)).item<bool>());
  CHECK((x * 0).any().item<bool>() == false);
  CHECK((x + 10).all().item<bool>() == true);
  CHECK_THROWS_AS(all(x, {2}), ShapeError);
  CHECK_THROWS_AS(count_nonzero(x, {-3}), ShapeError);
}

TEST_CASE("linalg::vector_norm and norm: every ord, torch's gradients at zero and at ties, dtypes") {
  const Tensor x = vec({3, -4, 0, 1, 2, -2}, {2, 3});
  check_values(linalg::vector_norm(x, 2.0, {1}), {5, 3});
  check_values(linalg::vector_norm(x, 1.0, {1}), {7, 5});
  check_values(linalg::vector_norm(x, 3.0, {1}), {4.497941493988037, 2.571281671524048});
  check_values(linalg::vector_norm(x, INFINITY, {1}), {4, 2});
  check_values(linalg::vector_norm(x, -INFINITY, {1}), {0, 1});
  check_values(linalg::vector_norm(x, 0.0, {1}), {2, 3});
  check_values(norm(x), {std::sqrt(34.0)});
  CHECK(linalg::vector_norm(x, 2.0, {1}, true).shape() == Shape{2, 1});
  // float16 computes in float32 and keeps its dtype; integers are refused.
  CHECK(linalg::vector_norm(x.to(f16)).dtype() == f16);
  CHECK_THROWS_AS(linalg::vector_norm(x.to(i64)), DTypeError);
  // No identity for max, min or a negative power over an empty dim.
  CHECK_THROWS_AS(linalg::vector_norm(zeros({0}), INFINITY), ShapeError);
  CHECK_THROWS_AS(linalg::vector_norm(zeros({2, 0}), -1.0, {1}), ShapeError);

  // Gradients: the 3-norm's as torch's; 0 (not NaN) at a zero vector for ord 2 and 3; the
  // inf-norm's split evenly between the two elements of largest |x|.
  Tensor w = vec({3, -4, 0, 1, 2, -2}, {2, 3}).requires_grad_();
  auto g3 = autograd::grad({linalg::vector_norm(w, 3.0)}, {w});
  check_values(g3[0], {0.39685025811195374, -0.7055115699768066, 0, 0.044094473123550415, 0.17637789249420166,
                       -0.17637789249420166});
  for (double ord : {2.0, 3.0}) {
    Tensor z = zeros({3}).eval().requires_grad_();
    auto gz = autograd::grad({linalg::vector_norm(z, ord)}, {z});
    check_values(gz[0], {0, 0, 0});
  }
  Tensor t = vec({1, -2, 2}).requires_grad_();
  auto gi = autograd::grad({linalg::vector_norm(t, INFINITY)}, {t});
  check_values(gi[0], {0, -0.5, 0.5});
}

TEST_CASE("eye and linspace: torch's values, integer dtypes truncated, argument errors") {
  check_values(eye(3), {1, 0, 0, 0, 1, 0, 0, 0, 1});
  CHECK(eye(2, 3, i64).shape() == Shape{2, 3});
  CHECK(eye(2, 3, i64).dtype() == i64);
  check_values(eye(2, 3, i64), {1, 0, 0, 0, 1, 0});
  CHECK(eye(0).numel() == 0);
  CHECK_THROWS_AS(eye(-1), ShapeError);

  // torch's float32 kernel contracts the second half into an FMA (its middle element is
  // -2.98e-8); both are within float32's rounding of 0.
  check_values(linspace(-1, 1, 7), {-1, -0.6666666269302368, -0.3333333134651184, 0, 0.3333333134651184,
                                    0.6666666269302368, 1},
               1e-7);
  check_values(linspace(0, 1, 5, f64), {0, 0.25, 0.5, 0.75, 1});
  check_values(linspace(-3.25, -2.0, 9, i32), {-3, -2, -2, -2, -2, -2, -2, -2, -2});
  check_values(linspace(-3.25, 1.0, 7, i32), {-3, -2, -1, 0, 0, 0, 1});  // 1 - 2/3 * 3 is just above -1
  check_values(linspace(2.5, 7, 1), {2.5});
  CHECK(linspace(0, 1, 0).numel() == 0);
  CHECK(linspace(0, 10, 5, i64).dtype() == i64);
  CHECK_THROWS_AS(linspace(0, 1, -1), ValueError);
}

TEST_CASE("lerp, addcmul, addcdiv: torch's values, dtype rules and gradients") {
  const Tensor a = vec({1, 2, 3}), b = vec({5, -2, 3.5});
  check_values(lerp(a, b, 0.3), {2.200000047683716, 0.7999999523162842, 3.1500000953674316});
  check_values(lerp(a, b, 0.75), {4, -1, 3.375});
  check_values(lerp(a, b, 1.0), {5, -2, 3.5}, 0);  // exact at the end
  check_values(lerp(a, b, vec({0, 1, 0.6})), {1, -2, 3.299999952316284});
  CHECK_THROWS_AS(lerp(a, b.to(f64), 0.5), DTypeError);
  CHECK_THROWS_AS(lerp(a.to(i64), b.to(i64), 0.5), DTypeError);
  CHECK_THROWS_AS(lerp(a, b, vec({0.5, 0.5, 0.5}, {3}, f64)), DTypeError);
  // A 0-dim weight of another dtype is taken as a number; three 0-dim operands promote.
  CHECK(lerp(a, b, vec({0.5}, {}, f64)).dtype() == f32);
  CHECK(lerp(vec({1}, {}, f16), vec({2}, {}, f16), vec({0.5}, {}, f32)).dtype() == f32);
  {
    Tensor s = vec({1, 2}).requires_grad_(), e = vec({3, 5}).requires_grad_(), w = vec({0.25, 0.75}).requires_grad_();
    auto g = autograd::grad({sum(lerp(s, e, w))}, {s, e, w});
    check_values(g[0], {0.75, 0.25});
    check_values(g[1], {0.25, 0.75});
    check_values(g[2], {2, 3});
  }

  check_values(addcmul(a, a, b, 0.5), {3.5, 0, 8.25});
  check_values(addcdiv(a, a, b, 2), {1.399999976158142, 0, 4.714285850524902});
  CHECK(addcmul(a.to(i64), a.to(i64), a.to(i64), 2).dtype() == i64);
  check_values(addcmul(a.to(i64), a.to(i64), a.to(i64), 2), {3, 10, 21});
  CHECK(addcmul(a.to(i64), a, a).dtype() == f32);
  CHECK_THROWS_AS(addcmul(a.to(DType::Bool), a.to(DType::Bool), a.to(DType::Bool)), DTypeError);
  CHECK_THROWS_AS(addcdiv(a, a.to(i64), a.to(i64)), DTypeError);  // torch no longer divides integers here
  {
    Tensor i = vec({1, 2}).requires_grad_(), t1 = vec({3, 4}).requires_grad_(), t2 = vec({2, -8}).requires_grad_();
    auto g = autograd::grad({sum(addcdiv(i, t1, t2, 3))}, {i, t1, t2});
    check_values(g[0], {1, 1});
    check_values(g[1], {1.5, -0.375});
    check_values(g[2], {-2.25, -0.1875});
  }
}

TEST_CASE("logaddexp, nan_to_num, isfinite, logit, outer: torch's values at the extremes and their gradients") {
  check_values(logaddexp(vec({1000, -1000, 0, -INFINITY}), vec({1000, -1001, 1, -INFINITY})),
               {1000.6931762695312, -999.686767578125, 1.3132617473602295, -INFINITY});
  CHECK_THROWS_AS(logaddexp(vec({1}).to(i64), vec({1}).to(i64)), DTypeError);
  CHECK(logaddexp(vec({1}).to(f16), vec({1}).to(i64)).dtype() == f16);

  check_values(nan_to_num(vec({NAN, INFINITY, -INFINITY, 1.5})),
               {0, 3.4028234663852886e+38, -3.4028234663852886e+38, 1.5});
  check_values(nan_to_num(vec({NAN, INFINITY, -INFINITY}).to(f16)), {0, 65504, -65504});
  check_values(nan_to_num(vec({NAN, INFINITY, -INFINITY}), 1, 2, -3), {1, 2, -3});
  CHECK(nan_to_num(vec({1, 2}).to(i32)).dtype() == i32);
  {
    Tensor x = vec({NAN, 2, INFINITY}).requires_grad_();
    check_values(autograd::grad({sum(nan_to_num(x))}, {x})[0], {0, 1, 0});
  }

  {
    const Tensor x = vec({NAN, INFINITY, -INFINITY, 1.5, -0.0, 3.4028234663852886e+38});
    CHECK(isfinite(x).dtype() == DType::Bool);
    check_values(isfinite(x), {0, 0, 0, 1, 1, 1});
    check_values(isposinf(x), {0, 1, 0, 0, 0, 0});
    check_values(isneginf(x), {0, 0, 1, 0, 0, 0});
    check_values(isfinite(vec({65504, INFINITY}).to(f16)), {1, 0});
    check_values(isfinite(vec({-7, 0}).to(i64)), {1, 1});  // integers: all finite, none infinite
    check_values(isposinf(vec({-7, 0}).to(i32)), {0, 0});
    CHECK(isneginf(vec({1}).to(DType::Bool)).dtype() == DType::Bool);
  }

  check_values(logit(vec({0.25, 0.5, 0.9, 0, 1}), 0.1),
               {-1.0986123085021973, 0, 2.1972243785858154, -2.1972246170043945, 2.1972243785858154});
  CHECK(logit(vec({1, 0}).to(i64)).dtype() == f32);
  {
    // Outside [0, 1] torch's gradient is NaN; inside 1 / (x (1 - x)).
    Tensor y = vec({-0.5, 0.25, 1.5}).requires_grad_();
    check_values(autograd::grad({sum(logit(y))}, {y})[0], {NAN, 5.333333492279053, NAN});
    Tensor z = vec({0.05, 0.5}).requires_grad_();  // clamped by eps: no gradient there
    check_values(autograd::grad({sum(logit(z, 0.1))}, {z})[0], {0, 4});
    // At 0 (either sign) and 1 torch's gradient is +inf times the incoming one (not 0 * inf).
    Tensor e = vec({-0.0, 0.0, 1.0, 0.5}, {4}, f64).requires_grad_();
    check_values(autograd::grad({sum(logit(e, 0.0) * vec({0.21, -1, 2, 1}, {4}, f64))}, {e})[0],
                 {INFINITY, -INFINITY, INFINITY, 4});
  }
  // The bounds 1e-6 and 1 - 1e-6 in float16 (the latter is 1): torch's logit(1) is inf there.
  check_values(logit(vec({1.0}).to(f16), 1e-6), {INFINITY});

  check_values(outer(arange(3), vec({1.5, 2})), {0, 0, 1.5, 2, 3, 4});
  CHECK(outer(arange(3), vec({1.5, 2})).dtype() == f32);
  CHECK_THROWS_AS(outer(ones({2, 2}), ones({2})), ShapeError);
}

TEST_CASE("isclose, allclose, equal, nansum, nanmean, fmax, fmin, aminmax, tile, cat, clip, log10, frac: torch's results") {
  // isclose: torch's values for rtol 1e-5, atol 1e-8; infinities of one sign are close, NaN
  // only with equal_nan; one dtype required; integers compare in float32.
  const Tensor a = vec({1, 1e10, INFINITY, -INFINITY, NAN, 1, 0}), b = vec({1.000001, 1.000005e10, INFINITY, INFINITY, NAN, 1.1, 1e-9});
  check_values(isclose(a, b), {1, 1, 1, 0, 0, 0, 1});
  check_values(isclose(a, b, 1e-5, 1e-8, true), {1, 1, 1, 0, 1, 0, 1});
  check_values(isclose(a, b, 0, 0), {0, 0, 1, 0, 0, 0, 0});
  check_values(isclose(vec({1, 2}).to(i64), vec({1, 3}).to(i64), 0.3, 0), {1, 0});  // |2 - 3| > 0.3 * 3
  check_values(isclose(vec({2}).to(i64), vec({3}).to(i64), 0.4, 0), {1});
  // int64 differences are exact (2^40 + 1 and 2^40 differ by 1 > 0.5; float32 would tie them)
  check_values(isclose(vec({1099511627777}, {1}, f64).to(i64), vec({1099511627776}, {1}, f64).to(i64), 0, 0.5), {0});
  check_values(isclose(vec({1, 0}).to(DType::Bool), vec({1, 1}).to(DType::Bool), 0, 0.5), {1, 0});
  CHECK(isclose(a, b).dtype() == DType::Bool);
  CHECK_THROWS_AS(isclose(a, b.to(f64)), DTypeError);
  CHECK_THROWS_AS(isclose(a, b, -1.0), ValueError);
  CHECK(allclose(vec({1, 2}), vec({1.0000001, 2})));
  CHECK_FALSE(allclose(vec({1, NAN}), vec({1, NAN})));
  CHECK(allclose(vec({1, NAN}), vec({1, NAN}), 1e-5, 1e-8, true));
  CHECK(allclose(vec({1, 1}), vec({1})));  // broadcast, as torch
  CHECK(equal(vec({1, 2}), vec({1, 2})));
  CHECK_FALSE(equal(vec({1, 2}), vec({1, 2}, {2, 1})));  // shapes differ
  CHECK_FALSE(equal(vec({NAN}), vec({NAN})));
  CHECK(equal(vec({1, 2}).to(i64), vec({1, 2})));  // compared after promotion

  // nansum and nanmean: NaN as missing; gradients 1 (or 1/count) where not NaN, 0 where it is.
  {
    Tensor x = vec({1, NAN, 3, NAN, NAN, NAN}, {2, 3}).requires_grad_();
    check_values(nansum(x), {4});
    check_values(nansum(x, {1}), {4, 0});
    check_values(nanmean(x, {1}), {2, NAN});
    check_values(nanmean(x, {1}, true), {2, NAN});
    CHECK(nanmean(x, {1}, true).shape() == Shape{2, 1});
    check_values(autograd::grad({nansum(x)}, {x})[0], {1, 0, 1, 0, 0, 0});
    check_values(autograd::grad({nanmean(x)}, {x})[0], {0.5, 0, 0.5, 0, 0, 0});
    CHECK(nansum(vec({1, 2}).to(i32)).dtype() == i64);
    CHECK_THROWS_AS(nanmean(vec({1}).to(i64)), DTypeError);
  }

  // fmax, fmin: NaN as missing (NaN only where both are); a tie gives the first the gradient.
  {
    Tensor x = vec({1, NAN, 3, NAN, 2}).requires_grad_(), y = vec({2, 5, NAN, NAN, 2}).requires_grad_();
    check_values(fmax(x, y), {2, 5, 3, NAN, 2});
    check_values(fmin(x, y), {1, 5, 3, NAN, 2});
    const auto g = autograd::grad({nansum(fmax(x, y))}, {x, y});
    check_values(g[0], {0, 0, 1, 0, 1});
    check_values(g[1], {1, 1, 0, 0, 0});
    CHECK(fmax(vec({1}).to(i32), vec({2}).to(i64)).dtype() == i64);
    CHECK(fmax(vec({1}).to(f16), vec({2})).dtype() == f32);
  }

  // aminmax, tile, cat, clip
  {
    const auto [lo, hi] = aminmax(vec({3, -1, 2, 7}, {2, 2}), {1});
    check_values(lo, {-1, 2});
    check_values(hi, {3, 7});
    const Tensor t = vec({1, 2}, {1, 2});
    CHECK(tile(t, {2}).shape() == Shape{1, 4});  // reps padded with leading 1s
    check_values(tile(t, {2}), {1, 2, 1, 2});
    CHECK(tile(t, {2, 1, 1}).shape() == Shape{2, 1, 2});  // reps longer: leading dims
    check_values(cat({vec({1}), vec({2, 3})}), {1, 2, 3});
    check_values(clip(vec({-2, 0.5, 9}), 0, 1), {0, 0.5, 1});
  }

  // log10 (floating results, gradient 1 / (x ln 10)) and frac (the sign kept, floating only)
  {
    Tensor x = vec({1000, 0.01, 2, 0, -1}).requires_grad_();
    check_values(log10(x), {3, -2, 0.3010299956639812, -INFINITY, NAN});
    CHECK(log10(vec({10}).to(i64)).dtype() == f32);
    Tensor p = vec({2, 0.5}).requires_grad_();
    check_values(autograd::grad({sum(log10(p))}, {p})[0], {1 / (2 * std::log(10.0)), 1 / (0.5 * std::log(10.0))});
    check_values(frac(vec({1.5, -1.5, 3, -0.25})), {0.5, -0.5, 0, -0.25});
    check_values(frac(vec({INFINITY})), {NAN});
    CHECK_THROWS_AS(frac(vec({1}).to(i64)), DTypeError);
  }
}

TEST_CASE("quantile: torch's values for every interpolation, NaN, dims and errors") {
  // torch's documentation: quantile([0.0700, -0.5446, 0.9214], [0, 1, 0.5]) and the
  // interpolations of q = 0.4 over [0, 1, 2, 3].
  check_values(quantile(vec({0.0700, -0.5446, 0.9214}), std::vector<double>{0, 1, 0.5}), {-0.5446, 0.9214, 0.0700});
  const Tensor a = vec({3, 0, 2, 1});
  check_values(quantile(a, 0.4), {1.2});
  check_values(quantile(a, 0.4, std::nullopt, false, "lower"), {1});
  check_values(quantile(a, 0.4, std::nullopt, false, "higher"), {2});
  check_values(quantile(a, 0.4, std::nullopt, false, "midpoint"), {1.5});
  check_values(quantile(a, 0.4, std::nullopt, false, "nearest"), {1});
  check_values(quantile(a, 0.5, std::nullopt, false, "nearest"), {2});  // rank 1.5 rounds to even: 2
  check_values(quantile(vec({1, NAN, 3}), 0.5), {NAN});
  // Along a dim, keepdim, and q as a list (a new first dim).
  const Tensor m = vec({1, 5, 3, 8, 6, 7}, {2, 3});
  check_values(quantile(m, 0.5, 1), {3, 7});
  CHECK(quantile(m, 0.5, 1, true).shape() == Shape{2, 1});
  CHECK(quantile(m, 0.5, std::nullopt, true).shape() == Shape{1, 1});
  CHECK(quantile(m, std::vector<double>{0.25, 0.75}, 0).shape() == Shape{2, 3});
  check_values(quantile(m, std::vector<double>{0.25, 0.75}, 0), {2.75, 5.25, 4, 6.25, 5.75, 6});
  // The gradient reaches the two sorted neighbours by the interpolation's weights.
  {
    Tensor x = vec({3, 0, 2, 1}).requires_grad_();
    check_values(autograd::grad({quantile(x, 0.4)}, {x})[0], {0, 0, 0.2, 0.8});
  }
  CHECK_THROWS_AS(quantile(a.to(i64), 0.5), DTypeError);
  CHECK_THROWS_AS(quantile(a.to(f16), 0.5), DTypeError);
  CHECK_THROWS_AS(quantile(a, 1.5), ValueError);
  CHECK_THROWS_AS(quantile(a, 0.5, std::nullopt, false, "cubic"), ValueError);
  CHECK_THROWS_AS(quantile(vec({}), 0.5), ValueError);
}

TEST_CASE("flipud, fliplr, rot90, deg2rad, rad2deg, xlogy, heaviside, repeat_interleave: torch's results") {
  const Tensor m = vec({1, 2, 3, 4, 5, 6}, {2, 3});
  check_values(flipud(m), {4, 5, 6, 1, 2, 3});
  check_values(fliplr(m), {3, 2, 1, 6, 5, 4});
  CHECK_THROWS_AS(fliplr(vec({1, 2})), ShapeError);
  CHECK_THROWS_AS(flipud(vec({1}, {})), ShapeError);
  // torch.rot90([[1, 2, 3], [4, 5, 6]]): [[3, 6], [2, 5], [1, 4]]; k = 2, 3, -1, 4 as torch.
  CHECK(rot90(m).shape() == Shape{3, 2});
  check_values(rot90(m), {3, 6, 2, 5, 1, 4});
  check_values(rot90(m, 2), {6, 5, 4, 3, 2, 1});
  check_values(rot90(m, 3), {4, 1, 5, 2, 6, 3});
  check_values(rot90(m, -1), {4, 1, 5, 2, 6, 3});
  check_values(rot90(m, 4), {1, 2, 3, 4, 5, 6});
  check_values(rot90(m, 1, {1, 0}), {4, 1, 5, 2, 6, 3});
  CHECK_THROWS_AS(rot90(m, 1, {0, 0}), ValueError);
  CHECK_THROWS_AS(rot90(m, 1, {0}), ValueError);

  check_values(deg2rad(vec({180, -90})), {3.1415927410125732, -1.5707963705062866});
  CHECK(deg2rad(vec({180}).to(i64)).dtype() == f32);
  check_values(rad2deg(vec({3.141592653589793}, {1}, f64)), {180}, 1e-12);

  // xlogy: 0 where x is 0 (NaN where y is NaN), x log y elsewhere; torch's gradients.
  {
    Tensor x = vec({0, 0, 2, 3, 0}).requires_grad_(), y = vec({0, NAN, 4, -1, 5}).requires_grad_();
    check_values(xlogy(x, y), {0, NAN, 2.7725887298583984, NAN, 0});
    Tensor x2 = vec({0, 2, 0}).requires_grad_(), y2 = vec({5, 4, 0}).requires_grad_();
    const auto g = autograd::grad({sum(xlogy(x2, y2))}, {x2, y2});
    // torch 2.11's rule: x gets log(y) also where x is 0 (not where y <= 0 too); y gets x / y,
    // 0 / 0 = NaN at x = y = 0.
    check_values(g[0], {1.6094379124341003, 1.3862943611198906, 0});
    check_values(g[1], {0, 0.5, NAN});
    CHECK(xlogy(vec({1}).to(i64), vec({2}).to(i32)).dtype() == f32);
    CHECK(xlogy(vec({1}), vec({2}, {1}, f64)).dtype() == f64);
  }

  check_values(heaviside(vec({-1.5, 0, 2, NAN}), vec({0.5})), {0, 0.5, 1, 0});
  CHECK_THROWS_AS(heaviside(vec({1}), vec({1}, {1}, f64)), DTypeError);

  // repeat_interleave: along a dim, or over the flattened tensor; gradients sum the copies.
  check_values(repeat_interleave(m, 2, 0), {1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6});
  CHECK(repeat_interleave(m, 2, 1).shape() == Shape{2, 6});
  check_values(repeat_interleave(m, 2, -1), {1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6});
  check_values(repeat_interleave(m, 2), {1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6});
  CHECK(repeat_interleave(m, 0, 0).shape() == Shape{0, 3});
  CHECK_THROWS_AS(repeat_interleave(m, -1, 0), ValueError);
  {
    Tensor x = vec({1, 2}).requires_grad_();
    check_values(autograd::grad({sum(repeat_interleave(x, 3) * vec({1, 2, 3, 4, 5, 6}))}, {x})[0], {6, 15});
  }
}

TEST_CASE("clamp, clamp_min, clamp_max: torch's dtypes, the gradient at a bound and none at NaN; hardtanh's") {
  const Tensor xi = vec({1, 2, 3}).to(i64);
  CHECK(clamp_min(xi, 2).dtype() == i64);
  CHECK(clamp_min(xi, 1.5).dtype() == f32);
  check_values(clamp_min(xi, 1.5), {1.5, 2, 3});
  check_values(clamp_max(xi, 2), {1, 2, 2});
  check_values(clamp_min(vec({NAN, 0}), 1.0), {NAN, 1});
  check_values(clamp_min(vec({0, 5}), NAN), {NAN, NAN});
  CHECK_THROWS_AS(clamp_min(vec({1}).to(DType::Bool), true), DTypeError);
  // torch 2.11 (printed on the GPU machine): x gets the gradient at the bound (its subgradient 1)
  // and none where it is NaN, 1 at +inf (above the bound).
  const std::vector<double> v{NAN, 1.0, INFINITY, -INFINITY, 0.5};
  {
    Tensor x = vec(v).requires_grad_();
    check_values(autograd::grad({sum(clamp_min(x, 1.0))}, {x})[0], {0, 1, 1, 0, 0});
  }
  {
    Tensor x = vec(v).requires_grad_();
    check_values(autograd::grad({sum(clamp_max(x, 1.0))}, {x})[0], {0, 1, 0, 1, 1});
  }
  {
    Tensor x = vec(v).requires_grad_();
    check_values(autograd::grad({sum(clamp(x, -1.0, 1.0))}, {x})[0], {0, 1, 0, 0, 1});
    Tensor y = vec({-1, 1, NAN}).requires_grad_();
    check_values(autograd::grad({sum(clip(y, -1.0, 1.0))}, {y})[0], {1, 1, 0});
  }
  {
    // hardtanh's own backward stops strictly inside the bounds and passes the gradient at NaN.
    Tensor x = vec({NAN, 1.0, 0.5, 6.0, -1.0}).requires_grad_();
    check_values(autograd::grad({sum(hardtanh(x))}, {x})[0], {1, 0, 1, 0, 0});
    check_values(hardtanh(x), {NAN, 1, 0.5, 1, -1});
  }
  {
    // A tensor bound: x gets a tie, the bound only where x is beyond it (torch's clamp_min.Tensor).
    Tensor x = vec({1, 2, 0.5}).requires_grad_(), lo = vec({1, 1, 1}).requires_grad_();
    auto g = autograd::grad({sum(clamp_min(x, lo))}, {x, lo});
    check_values(g[0], {1, 1, 0});
    check_values(g[1], {0, 0, 1});
    // Both bounds tensors: x at both bounds, beyond each (torch's clamp(x, lo, hi) gradients).
    Tensor y = vec({1, -1, 0, 3}).requires_grad_(), l = vec({-1}, {}).requires_grad_(),
           h = vec({1}, {}).requires_grad_();
    auto gy = autograd::grad({sum(clamp(y, l, h))}, {y, l, h});
    check_values(gy[0], {1, 1, 1, 0});
    check_values(gy[1], {0});
    check_values(gy[2], {1});
    // NaN in x or in a bound: NaN, no gradient anywhere.
    Tensor z = vec({NAN, 2}).requires_grad_(), zb = vec({1, NAN}).requires_grad_();
    auto gz = autograd::grad({sum(where(isnan(clamp_min(z, zb)), 0.0, clamp_min(z, zb)))}, {z, zb});
    check_values(clamp_min(z, zb), {NAN, NAN});
    check_values(gz[0], {0, 0});
    check_values(gz[1], {0, 0});
  }
}

TEST_CASE("nn::functional normalize, cosine_similarity, glu: torch's values and gradients at a zero row") {
  namespace F = nn::functional;
  const Tensor other = vec({1, 2, 1, 1, 2, 0}, {3, 2});
  {
    Tensor x = vec({3, 4, 0, 0, 1, -1}, {3, 2}).requires_grad_();
    Tensor r = F::normalize(x);
    check_values(r, {0.6, 0.8, 0, 0, 0.7071067690849304, -0.7071067690849304});
    check_values(autograd::grad({sum(r)}, {x})[0],
                 {0.031999990344047546, -0.024000003933906555, 1e12, 1e12, 0.7071067690849304, 0.7071067690849304},
                 1e-5);
  }
  {
    Tensor x = vec({3, 4, 0, 0, 1, -1}, {3, 2}).requires_grad_();
    Tensor c = F::cosine_similarity(x, other);
    check_values(c, {0.9838699102401733, 0, 0.7071067690849304});
    check_values(autograd::grad({sum(c)}, {x})[0],
                 {-0.028621681034564972, 0.021466240286827087, 70710680, 70710680, 0.3535533845424652,
                  0.3535533845424652},
                 1e-5);
  }
  CHECK_THROWS_AS(F::cosine_similarity(other.to(i64), other.to(i64)), DTypeError);
  check_values(F::glu(vec({1, 2, -1, 0.5}, {1, 4})), {0.2689414322376251, 1.244918704032898});
  CHECK(F::glu(ones({4, 6}), 0).shape() == Shape{2, 6});
  CHECK_THROWS_AS(F::glu(ones({3})), ShapeError);
  CHECK_THROWS_AS(F::glu(ones({}, f32)), ShapeError);
  CHECK_THROWS_AS(F::glu(ones({2}).to(i64)), DTypeError);
}

TEST_CASE("var_mean, std_mean, median: torch's values, positions among ties and NaN, gradients") {
  {
    Tensor x = vec({1, 2, 3, 4, 5, 6.5}, {2, 3}).requires_grad_();
    auto [v, m] = var_mean(x, {1});
    check_values(v, {1, 1.5833333730697632});
    check_values(m, {2, 5.166666507720947});
    auto [sd, m2] = std_mean(x, {1});
    check_values(sd, {1, 1.2583057880401611});
    check_values(autograd::grad({sum(sd)}, {x})[0],
                 {-0.5, 0, 0.5, -0.4635862410068512, -0.06622655689716339, 0.5298129916191101});
    // torch's std backward: 0 where the deviation is 0.
    Tensor c = vec({1.5, 1.5, 1.5}).requires_grad_();
    check_values(autograd::grad({std::get<0>(std_mean(c))}, {c})[0], {0, 0, 0});
  }
  check_values(median(vec({3, 1, 2, 4})), {2});
  check_values(median(vec({3, NAN, 2})), {NAN});
  check_values(median(zeros({0})), {NAN});
  {
    auto r = median(vec({3, 1, 2, 4, 1, NAN, 0, 5}, {2, 4}), 1);
    check_values(r.values(), {2, NAN});
    check_values(r.indices(), {2, 1});
    // Among equal values the stable sort's position: [2, 1, 1] gives index 2, [1, 1, 1] index 1.
    auto t = median(vec({2, 1, 1, 1, 1, 1}, {2, 3}, i64), 1);
    check_values(t.indices(), {2, 1});
    CHECK(t.values().dtype() == i64);
    CHECK(median(vec({1, 2, 3, 4}, {2, 2}), 0, true).values().shape() == Shape{1, 2});
  }
  {
    Tensor x = vec({3, 1, 2, 4, 7}).requires_grad_();
    check_values(autograd::grad({median(x)}, {x})[0], {1, 0, 0, 0, 0});
    // torch's rule for the median of all elements: split among the elements equal to it (the
    // NaN elements where it is NaN); an empty input's NaN still reaches x.
    Tensor ties = vec({3, 3, 1, 5, 5}, {5, 1}).requires_grad_();
    check_values(autograd::grad({median(ties)}, {ties})[0], {0.5, 0.5, 0, 0, 0});
    Tensor nans = vec({1, NAN, 2, NAN}).requires_grad_();
    check_values(autograd::grad({median(nans)}, {nans})[0], {0, 0.5, 0, 0.5});
    Tensor empty = zeros({0, 3}).requires_grad_();
    CHECK(autograd::grad({median(empty)}, {empty})[0].shape() == Shape{0, 3});
  }
  CHECK_THROWS_AS(median(vec({1, 0}, {2}, DType::Bool)), DTypeError);
  CHECK_THROWS_AS(median(zeros({2, 0}), 1), ShapeError);
}

TEST_CASE("nonzero, argwhere, masked_select: row-major positions, broadcasting, gradients") {
  const Tensor x = vec({0, 1, 2, 0}, {2, 2}, i64);
  check_values(nonzero(x), {0, 1, 1, 0});
  CHECK(nonzero(x).shape() == Shape{2, 2});
  CHECK(nonzero(x).dtype() == i64);
  CHECK(argwhere(zeros({3})).shape() == Shape{0, 1});
  CHECK(nonzero(vec({5}, {}, f32)).shape() == Shape{1, 0});
  Tensor y = vec({1, 2, 3, 4}, {2, 2}).requires_grad_();
  const Tensor picked = masked_select(y, vec({1, 0}, {2}, DType::Bool));  // the mask broadcasts over rows
  check_values(picked, {1, 3});
  check_values(autograd::grad({sum(picked * vec({1, 2}))}, {y})[0], {1, 0, 2, 0});
  // Inside kiln::compile the read is a graph break: the compiled function still gives the values.
  auto positives = kiln::compile([](const Tensor& t) { return masked_select(t * 2, t > 0) + 1; });
  check_values(positives(vec({-1, 2, 0, 3})), {5, 7});
  check_values(positives(vec({4, -2, 1, -3})), {9, 3});
  CHECK(positives.stats().graph_breaks >= 1);
  CHECK_THROWS_AS(masked_select(y, vec({1, 0}, {2}, i64)), DTypeError);
  CHECK_THROWS_AS(masked_select(y, vec({1, 0, 1}, {3}, DType::Bool)), ShapeError);
}

TEST_CASE("diagonal, diag, trace, cross, softmin: torch's values, errors and gradients") {
  {
    Tensor x = reshape(arange(12).to(f32), Shape{3, 4}).eval().requires_grad_();
    const Tensor d = diagonal(x, 1);
    check_values(d, {1, 6, 11});
    check_values(autograd::grad({sum(d)}, {x})[0], {0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1});
  }
  check_values(diagonal(reshape(arange(24), Shape{2, 3, 4}), 1, 1, 2), {1, 6, 11, 13, 18, 23});
  CHECK(diagonal(ones({2, 3}), 5).shape() == Shape{0});
  CHECK_THROWS_AS(diagonal(ones({2, 3}), 0, 1, -1), ShapeError);
  CHECK_THROWS_AS(diagonal(ones({3})), ShapeError);
  check_values(diag(vec({1, 2}, {2}, i64)), {1, 0, 0, 2});
  check_values(diag(vec({1, 2}, {2}, i64), 1), {0, 1, 0, 0, 0, 2, 0, 0, 0});
  check_values(diag(vec({1, 2}), -1), {0, 0, 0, 1, 0, 0, 0, 2, 0});
  check_values(diag(vec({1, 2, 3, 4, 5, 6}, {2, 3}), -1), {4});
  CHECK_THROWS_AS(diag(ones({2, 2, 2})), ShapeError);
  CHECK(trace(vec({1, 2, 3, 4}, {2, 2}, i32)).dtype() == i64);
  CHECK(trace(vec({1, 2, 3, 4}, {2, 2}, i32)).item<std::int64_t>() == 5);
  CHECK_THROWS_AS(trace(ones({3})), ShapeError);

  {
    Tensor a = vec({1, 2, 3}, {1, 3}).requires_grad_();
    const Tensor c = linalg::cross(a, vec({4, 5, 6}, {1, 3}));
    check_values(c, {-3, 6, -3});
    check_values(autograd::grad({sum(c)}, {a})[0], {-1, 2, -1});
  }
  check_values(cross(vec({1, 0, 0, 0, 1, 0}, {2, 3}, i64), vec({0, 1, 0, 0, 0, 1}, {2, 3}, i64)), {0, 0, 1, 1, 0, 0});
  CHECK_THROWS_AS(linalg::cross(ones({2}), ones({2})), ShapeError);
  CHECK_THROWS_AS(linalg::cross(ones({3}), ones({3}, f64)), DTypeError);
  CHECK_THROWS_AS(linalg::cross(ones({2, 3}), ones({3})), ShapeError);  // torch: one rank
  check_values(softmin(vec({1, 2, 3}), 0), {0.6652409557748219, 0.24472847105479767, 0.09003057317038046});
}

TEST_CASE("kl_div and the loss modules: torch's reductions, gradients, options and errors") {
  Tensor i = vec({-1, -2, -0.5, -0.3, -3, -1}, {2, 3}).requires_grad_();
  const Tensor t = vec({0.2, 0, 0.8, 0.5, 0.5, 0}, {2, 3});
  check_values(kl_div(i, t, "sum"), {1.056450366973877});
  check_values(kl_div(i, t), {0.1760750561952591});
  check_values(kl_div(i, t, "batchmean"), {0.5282251834869385});
  CHECK(kl_div(i, t, "none").shape() == Shape{2, 3});
  check_values(autograd::grad({kl_div(i, t, "batchmean")}, {i})[0], {-0.1, 0, -0.4, -0.25, -0.25, 0});
  check_values(kl_div(i, log(vec({0.2, 0.3, 0.5, 0.5, 0.25, 0.25}, {2, 3})), "sum", true), {0.13062623143196106});
  CHECK_THROWS_AS(kl_div(i.to(i64), t), DTypeError);
  CHECK_THROWS_AS(kl_div(i, t, "average"), ValueError);

  // The modules call their functions with their options.
  CHECK(nn::KLDivLoss("sum")(i, t).item<float>() == doctest::Approx(1.056450366973877));
  const Tensor logits = vec({1, 2, 3, 1, 0, -1}, {2, 3});
  const Tensor labels = vec({2, 0}, {2}, i64);
  CHECK(nn::CrossEntropyLoss()(logits, labels).item<float>() == doctest::Approx(cross_entropy(logits, labels).item<float>()));
  CHECK(nn::CrossEntropyLoss({.reduction = "sum", .label_smoothing = 0.1})(logits, labels).item<float>() ==
        doctest::Approx(cross_entropy(logits, labels, {.reduction = "sum", .label_smoothing = 0.1}).item<float>()));
  CHECK(nn::NLLLoss(0)(log_softmax(logits, 1), labels).item<float>() ==
        doctest::Approx(nll_loss(log_softmax(logits, 1), labels, 0).item<float>()));
  CHECK(nn::MSELoss("sum")(logits, zeros({2, 3})).item<float>() == doctest::Approx(16));
  CHECK(nn::L1Loss()(logits, zeros({2, 3})).item<float>() == doctest::Approx(8.0 / 6));
  CHECK(nn::SmoothL1Loss("mean", 2.0)(logits, zeros({2, 3})).item<float>() ==
        doctest::Approx(smooth_l1_loss(logits, zeros({2, 3}), "mean", 2.0).item<float>()));
  CHECK(nn::HuberLoss("sum", 0.5)(logits, zeros({2, 3})).item<float>() ==
        doctest::Approx(huber_loss(logits, zeros({2, 3}), "sum", 0.5).item<float>()));
  CHECK(nn::BCELoss()(sigmoid(logits), ones({2, 3})).item<float>() ==
        doctest::Approx(binary_cross_entropy(sigmoid(logits), ones({2, 3})).item<float>()));
  nn::BCEWithLogitsLoss weighted("mean", vec({1, 2, 3}));
  CHECK(weighted(logits, ones({2, 3})).item<float>() ==
        doctest::Approx(binary_cross_entropy_with_logits(logits, ones({2, 3}), "mean", vec({1, 2, 3})).item<float>()));
  CHECK(weighted.named_buffers().size() == 1);
  nn::MSELoss loss;
  CHECK_THROWS_AS(static_cast<nn::Module&>(loss).forward(logits), ValueError);  // a loss takes (input, target)
  CHECK_THROWS_AS(nn::MSELoss("average")(logits, logits), ValueError);
}

TEST_CASE("randint, randperm, bernoulli, multinomial: ranges, frequencies, seeds and errors") {
  manual_seed(7);
  const std::vector<std::int64_t> a = randint(0, 10, {20000}).to_vector<std::int64_t>();
  manual_seed(7);
  CHECK(randint(0, 10, {20000}).to_vector<std::int64_t>() == a);  // the seed decides the draw
  CHECK(*std::min_element(a.begin(), a.end()) >= 0);
  REQUIRE(*std::max_element(a.begin(), a.end()) < 10);
  std::vector<int> count(10, 0);
  for (auto v : a) ++count[static_cast<std::size_t>(v)];
  for (int c : count) CHECK(std::abs(c - 2000) < 5 * 43);  // 5 sigma of a binomial(20000, 0.1)
  CHECK(randint(-3, -1, {5}, i32).dtype() == i32);
  for (auto v : randint(-3, -1, {100}).to_vector<std::int64_t>()) CHECK((v == -3 || v == -2));
  CHECK(randint(4, {2, 3}).shape() == Shape{2, 3});
  CHECK_THROWS_AS(randint(5, 5, {1}), ValueError);

  std::vector<std::int64_t> perm = randperm(100).to_vector<std::int64_t>();
  std::sort(perm.begin(), perm.end());
  CHECK(perm == arange(100).to_vector<std::int64_t>());
  CHECK(randperm(0).numel() == 0);
  CHECK_THROWS_AS(randperm(-1), ValueError);

  const double mean03 = mean(bernoulli(full({20000}, 0.3, f32))).item<double>();
  CHECK(std::abs(mean03 - 0.3) < 5 * 0.0033);
  CHECK(sum(bernoulli(zeros({100}))).item<float>() == 0);
  CHECK(sum(bernoulli(ones({100}))).item<float>() == 100);
  CHECK(sum(bernoulli(zeros({100}, f64), 1.0)).item<double>() == 100);
  CHECK(bernoulli(zeros({3}, f16), 0.5).dtype() == f16);
  CHECK_THROWS_AS(bernoulli(zeros({3}), 1.5), ValueError);
  CHECK_THROWS_AS(bernoulli(zeros({3}, i64)), DTypeError);

  // With replacement: frequencies follow the weights (unnormalised), a zero weight is never drawn.
  const Tensor w = vec({1, 0, 9}, {3});
  const std::vector<std::int64_t> draws = multinomial(w, 20000, true).to_vector<std::int64_t>();
  std::vector<int> hits(3, 0);
  for (auto d : draws) ++hits[static_cast<std::size_t>(d)];
  CHECK(hits[1] == 0);
  CHECK(std::abs(hits[0] - 2000) < 5 * 43);
  // Without replacement: distinct categories, only the positive ones, each order possible.
  const Tensor rows = vec({0.5, 0, 0.5, 0, 0.2, 0.3, 0.5, 0}, {2, 4});
  int first_is_zero = 0;
  int wrong = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const std::vector<std::int64_t> d = multinomial(rows, 2).to_vector<std::int64_t>();
    wrong += !((d[0] == 0 && d[1] == 2) || (d[0] == 2 && d[1] == 0)) || d[2] == d[3] || d[2] == 3 || d[3] == 3;
    first_is_zero += d[0] == 0;
  }
  CHECK(wrong == 0);
  CHECK(first_is_zero > 60);
  CHECK(first_is_zero < 140);
  CHECK(multinomial(rows, 3, true).shape() == Shape{2, 3});
  CHECK(multinomial(w, 1).dtype() == i64);
  CHECK_THROWS_AS(multinomial(rows, 3), ValueError);                 // only two positive weights in a row
  CHECK_THROWS_AS(multinomial(w, 4), ValueError);                    // more samples than categories
  CHECK_THROWS_AS(multinomial(vec({1, -1}), 1, true), ValueError);  // a negative weight
  CHECK_THROWS_AS(multinomial(zeros({2, 3}), 1, true), ValueError);  // a row summing to 0
  CHECK_THROWS_AS(multinomial(ones({2, 2, 2}), 1), ShapeError);
}

TEST_CASE("dot, mv, baddbmm: torch's shapes, dtypes, beta 0 and errors") {
  CHECK(dot(vec({1, 2, 3}), vec({4, 5, 6})).item<float>() == 32);
  CHECK(dot(vec({1, 2, 3}), vec({4, 5, 6})).shape() == Shape{});
  CHECK_THROWS_AS(dot(vec({1, 2, 3}), vec({4, 5})), ShapeError);
  CHECK_THROWS_AS(dot(vec({1, 2}), vec({4, 5}, {2}, f64)), DTypeError);
  CHECK_THROWS_AS(dot(ones({2, 2}), ones({2, 2})), ShapeError);
  check_values(mv(vec({1, 2, 3, 4}, {2, 2}), vec({1, -1})), {-1, -1});
  CHECK_THROWS_AS(mv(ones({2}), ones({2})), ShapeError);
  const Tensor a = ones({2, 2, 3}), b = ones({2, 3, 4});
  check_values(baddbmm(full({2, 2, 4}, NAN, f32), a, b, 0.0, 2.0), std::vector<double>(16, 6.0));
  check_values(baddbmm(ones({4}), a, b, 0.5), std::vector<double>(16, 3.5));
  CHECK_THROWS_AS(baddbmm(ones({3}), a, b), ShapeError);
  CHECK_THROWS_AS(baddbmm(ones({4}, f64), a, b), DTypeError);
}

TEST_CASE("the composites' method forms call their free functions, on tensors and expressions") {
  const Tensor x = vec({3, -4, 0, 1}, {2, 2});
  check_values(x.erfc(), {std::erfc(3.0), std::erfc(-4.0), 1, std::erfc(1.0)});
  check_values((x + 0).lgamma(), {std::log(2.0), INFINITY, INFINITY, 0});
  check_values(x.digamma(), {0.9227843350984671, NAN, -INFINITY, -0.5772156649015329});
  check_values((-x).signbit(), {1, 0, 1, 1});  // -0 has its sign bit set
  check_values(x.copysign(vec({-1, 1, -1, 1}, {2, 2})), {-3, 4, 0, 1});
  check_values(x.copysign(vec({-1, 1, -1, 1}, {2, 2})).signbit(), {1, 0, 1, 0});
  check_values(x.floor_divide(vec({2, 3, 1, -2}, {2, 2})), {1, -2, 0, -1});
  check_values(x.std({1}), {4.949747468305833, 0.7071067811865476});
  check_values(vec({1, NAN, 3}).nanmedian(), {1});
  check_values(std::get<1>(x.nanmedian(1)), {1, 0});
  check_values(std::get<0>((x * 1).kthvalue(2, 1)), {3, 1});
  check_values(x.diff(), {-7, 1});
  check_values((x / 8).erfinv(), {0.34561711478320656, -0.4769362762044699, 0, 0.11123545184094996});
  CHECK(x.norm().item<float>() == doctest::Approx(std::sqrt(26.0)));
  check_values((x * 1).norm(1.0, {1}), {7, 1});
  check_values(x.count_nonzero(), {3});
  check_values(x.clamp_min(0.5), {3, 0.5, 0.5, 1});
  check_values((x + 0).clamp_max(0), {0, -4, 0, 0});
  check_values(log(x).nan_to_num(), {1.0986122886681098, 0, -3.4028234663852886e+38, 0});
  check_values(x.lerp(zeros({2, 2}), 0.5), {1.5, -2, 0, 0.5});
  check_values(x.lerp(zeros({2, 2}), full({2, 2}, 1.0, f32)), {0, 0, 0, 0});
  check_values(vec({0.5}).logit(), {0});
  check_values(x.median(), {0});
  check_values(x.median(1).indices(), {1, 0});
  check_values(x.nonzero(), {0, 0, 0, 1, 1, 1});
  check_values(x.masked_select(x > 0), {3, 1});
  check_values(x.diag(), {3, 1});
  check_values(x.diagonal(1), {-4});
  check_values(x.trace(), {4});
  check_values(vec({1, 2}).dot(vec({3, 4})), {11});
  check_values(x.mv(vec({1, 1})), {-1, 1});
  check_values(vec({1, 2}).outer(vec({3, 4})), {3, 4, 6, 8});
}

TEST_CASE("unflatten: torch's shapes, an inferred size, errors") {
  const Tensor x = reshape(arange(24), Shape{2, 12});
  CHECK(unflatten(x, 1, {3, 4}).shape() == Shape{2, 3, 4});
  CHECK(x.unflatten(-1, {2, -1, 3}).shape() == Shape{2, 2, 2, 3});
  CHECK(unflatten(x, 0, {1, 2}).shape() == Shape{1, 2, 12});
  check_values(unflatten(x, 1, {3, 4}).select(1, 2), {8, 9, 10, 11, 20, 21, 22, 23});
  CHECK_THROWS_AS(unflatten(x, 1, {5, 2}), ShapeError);
  CHECK_THROWS_AS(unflatten(x, 1, {-1, -1}), ShapeError);
  CHECK_THROWS_AS(unflatten(x, 1, {5, -1}), ShapeError);
  CHECK_THROWS_AS(unflatten(x, 2, {1}), ShapeError);
}

TEST_CASE("movedim, swapaxes, hstack, vstack, meshgrid, tril/triu_indices, bincount, *_as: torch's results") {
  const Tensor x = zeros({2, 3, 4});
  CHECK(movedim(x, 0, -1).shape() == Shape{3, 4, 2});
  CHECK(movedim(x, {0, 1}, {2, 0}).shape() == Shape{3, 4, 2});
  CHECK(x.movedim(2, 0).shape() == Shape{4, 2, 3});
  CHECK(moveaxis(x, 1, 2).shape() == Shape{2, 4, 3});
  CHECK(swapaxes(x, 0, 2).shape() == Shape{4, 3, 2});
  CHECK(x.swapaxes(0, 1).shape() == Shape{3, 2, 4});
  CHECK_THROWS_AS(movedim(x, {0, 0}, {1, 2}), ShapeError);
  CHECK_THROWS_AS(movedim(x, {0}, {1, 2}), ShapeError);
  check_values(movedim(reshape(arange(6), Shape{2, 3}), 0, 1), {0, 3, 1, 4, 2, 5});

  const Tensor h = hstack({vec({1, 2}, {2}, i64), vec({3})});
  check_values(h, {1, 2, 3});
  CHECK(h.dtype() == f32);  // promoted as cat's
  CHECK(hstack({ones({2, 1}), zeros({2, 2})}).shape() == Shape{2, 3});
  check_values(vstack({vec({1, 2}), vec({3, 4})}), {1, 2, 3, 4});
  CHECK(vstack({vec({1, 2}), vec({3, 4})}).shape() == Shape{2, 2});
  CHECK_THROWS_AS(vstack({}), ValueError);

  auto ij = meshgrid({vec({1, 2, 3}), vec({4, 5})});
  CHECK(ij[0].shape() == Shape{3, 2});
  check_values(ij[1], {4, 5, 4, 5, 4, 5});
  auto xy = meshgrid({vec({1, 2, 3}), vec({4, 5})}, "xy");
  CHECK(xy[0].shape() == Shape{2, 3});
  check_values(xy[0], {1, 2, 3, 1, 2, 3});
  CHECK_THROWS_AS(meshgrid({vec({1})}, "yx"), ValueError);

  check_values(tril_indices(3, 3), {0, 1, 1, 2, 2, 2, 0, 0, 1, 0, 1, 2});
  check_values(triu_indices(3, 4, 1), {0, 0, 0, 1, 1, 2, 1, 2, 3, 2, 3, 3});
  check_values(tril_indices(2, 3, -1), {1, 0});
  CHECK(tril_indices(3, 3).dtype() == i64);

  const Tensor b = vec({0, 1, 1, 3}, {4}, i64);
  check_values(bincount(b), {1, 2, 0, 1});
  check_values(bincount(b, {}, 6), {1, 2, 0, 1, 0, 0});
  CHECK(bincount(b).dtype() == i64);
  check_values(bincount(b, vec({0.5, 1, 1, 2})), {0.5, 2, 0, 2});
  CHECK(bincount(b, vec({0.5, 1, 1, 2})).dtype() == f32);
  CHECK(bincount(b, vec({1, 2, 3, 4}, {4}, i64)).dtype() == f64);
  CHECK(bincount(vec({}, {0}, i64)).numel() == 0);
  CHECK_THROWS_AS(bincount(vec({-1, 2}, {2}, i64)), ValueError);
  CHECK_THROWS_AS(bincount(vec({1, 2}, {1, 2}, i64)), ShapeError);
  CHECK_THROWS_AS(bincount(vec({1, 2})), DTypeError);

  const Tensor like = zeros({2, 3}, f64);
  CHECK(vec({1, 2, 3}).expand_as(like).shape() == Shape{2, 3});
  CHECK(arange(6).view_as(like).shape() == Shape{2, 3});
  CHECK(arange(6).reshape_as(like).shape() == Shape{2, 3});
  CHECK(arange(6).type_as(like).dtype() == f64);
}

TEST_CASE("unique, unique_consecutive, where(cond): torch's values, inverse, counts, NaN") {
  auto [v, inv, cnt] = unique(vec({3, 1, NAN, 1, 2, NAN, 3}));
  check_values(v, {1, 2, 3, NAN, NAN});  // each NaN its own value, as torch's
  check_values(inv, {2, 0, 3, 0, 1, 4, 2});
  check_values(cnt, {2, 1, 2, 1, 1});
  auto [v2, inv2, cnt2] = unique(vec({2, 1, 1, 5}, {2, 2}, i64));
  check_values(v2, {1, 2, 5});
  CHECK(inv2.shape() == Shape{2, 2});
  check_values(inv2, {1, 0, 0, 2});
  CHECK(v2.dtype() == i64);
  auto [vb, ib, cb] = unique(vec({1, 0, 1}, {3}, DType::Bool));
  check_values(vb, {0, 1});
  CHECK(vb.dtype() == DType::Bool);
  auto [ve, ie, ce] = unique(vec({}, {0}, i64));
  CHECK(ve.numel() == 0);
  CHECK(ce.numel() == 0);
  auto [vc, ic, cc] = unique_consecutive(vec({1, 1, 2, 2, 3, 1, 1}, {7}, i64));
  check_values(vc, {1, 2, 3, 1});
  check_values(ic, {0, 0, 1, 1, 2, 3, 3});
  check_values(cc, {2, 2, 1, 2});
  const auto w = where(vec({1, 0, 0, 1}, {2, 2}, DType::Bool));
  REQUIRE(w.size() == 2);
  check_values(w[0], {0, 1});
  check_values(w[1], {0, 1});
  const auto w0 = where(vec({1}, {}, DType::Bool));  // 0-dim: one index tensor, as torch's
  REQUIRE(w0.size() == 1);
  check_values(w0[0], {0});
}

TEST_CASE("div's rounding modes, floor_divide, copysign, signbit, float_power, logaddexp2: torch's results") {
  const Tensor a = vec({7, -7, 7.5, -0.5, 0, 1, -1, 0}), b = vec({2, 2, -2, 3, -3, 0, 0, 0});
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  check_values(floor_divide(a, b), {3, -4, -4, -1, 0, inf, -inf, nan});
  check_values(div(a, b, "trunc"), {3, -3, -3, 0, 0, inf, -inf, nan});
  check_values(div(a, b, std::nullopt), {3.5, -3.5, -3.75, -0.5 / 3, 0, inf, -inf, nan});
  // A zero quotient keeps the sign a / b has: 0 // -3 and trunc(-0.5 / 3) are -0.
  // (Element 7, 0 // 0, is a NaN whose sign bit is the hardware's: not checked.)
  check_values(signbit(narrow(floor_divide(a, b), 0, 0, 7)), {0, 1, 1, 1, 1, 0, 1});
  check_values(signbit(narrow(div(a, b, "trunc"), 0, 0, 7)), {0, 1, 1, 1, 1, 0, 1});
  // Python's 5.0 // 0.1 is 49 (0.1 is a little above a tenth), where floor(5.0 / 0.1) is 50.
  check_values(floor_divide(vec({5.0}, {1}, f64), vec({0.1}, {1}, f64)), {49});
  const Tensor i = vec({7, -7, 7, -7}).to(i64), j = vec({2, 2, -2, -2}).to(i64);
  check_values(floor_divide(i, j), {3, -4, -4, 3});
  check_values(div(i, j, "trunc"), {3, -3, -3, 3});
  CHECK(floor_divide(i, j).dtype() == i64);
  CHECK(true_divide(i, j).dtype() == f32);
  CHECK(floor_divide(i, 2.5).dtype() == f32);  // a float number makes integers float32
  check_values(floor_divide(i, 2.5), {2, -3, 2, -3});
  check_values(floor_divide(8, j), {4, 4, -4, -4});
  CHECK_THROWS_AS(floor_divide(i, vec({1, 0, 1, 1}).to(i64)), ValueError);
  CHECK_THROWS_AS(div(a, b, "round"), ValueError);
  CHECK_THROWS_AS(floor_divide(a > 0, b > 0), DTypeError);
  {  // Rounded quotients have zero derivatives, as torch's (a backward runs and gives zeros).
    Tensor x = vec({7, -3}).requires_grad_(), y = vec({2, 0}).requires_grad_();
    const auto g = autograd::grad({sum(floor_divide(x, y) + div(x, y, "trunc"))}, {x, y});
    check_values(g[0], {0, 0});
    check_values(g[1], {0, 0});
  }

  // copysign: |a| with b's sign (-0 negative); a's gradient copysign(1, b) / sign(a), 0 at a = 0.
  {
    Tensor x = vec({1, -2, 3, 0, -4}).requires_grad_();
    const Tensor y = vec({-1, 2, -0.0, -5, 1});
    const Tensor r = copysign(x, y);
    check_values(r, {-1, 2, -3, 0, 4});
    check_values(signbit(r), {1, 0, 1, 1, 0});
    check_values(autograd::grad({sum(r)}, {x})[0], {-1, -1, -1, 0, -1});
    check_values(copysign(x, -1.0), {-1, -2, -3, 0, -4});
    CHECK(copysign(vec({1, -2}).to(i32), vec({1, 1}).to(i64)).dtype() == f32);
    CHECK(copysign(vec({1}, {1}, f64), vec({-1})).dtype() == f64);
  }
  check_values(signbit(vec({-0.0, 0, -1, inf, -inf, nan})), {1, 0, 1, 0, 1, 0});
  // The sign bit of a NaN is read too: negating a NaN sets it.
  check_values(signbit(-vec({nan})), {1});
  check_values(copysign(vec({2, 2}), -vec({nan, -nan})), {-2, 2});
  check_values(signbit(vec({-1, 0, 3}).to(i64)), {1, 0, 0});
  check_values(signbit(vec({1, 0}) > 0), {0, 0});
  CHECK(signbit(vec({1})).dtype() == DType::Bool);
  check_values(sgn(vec({-2, 0, 3})), {-1, 0, 1});
  {  // sign has a zero gradient (torch's), so a backward through it runs.
    Tensor x = vec({-2, 0, 3}).requires_grad_();
    check_values(autograd::grad({sum(sgn(x) * x)}, {x})[0], {-1, 0, 1});
  }

  // float_power: float64 whatever the operands.
  CHECK(float_power(vec({2, 3}).to(i64), 2).dtype() == f64);
  check_values(float_power(vec({2, 3}).to(i64), 2), {4, 9}, 1e-15);
  check_values(float_power(2, vec({-1, 0.5})), {0.5, 1.4142135623730951}, 1e-15);
  check_values(float_power(vec({-8}), vec({1.0 / 3})), {nan});
  {
    Tensor x = vec({1.5, -2}, {2}, f64).requires_grad_();
    check_values(autograd::grad({sum(float_power(x, 3))}, {x})[0], {6.75, 12}, 1e-15);
  }

  // logaddexp2: log2(2^a + 2^b); equal infinities stay.
  check_values(logaddexp2(vec({0, 1, -inf, inf, 200}), vec({0, 3, -inf, inf, 199})),
               {1, 3.321928094887362, -inf, inf, 200.58496250072116});
  {
    Tensor x = vec({0, 1}).requires_grad_(), y = vec({0, 3}).requires_grad_();
    const auto g = autograd::grad({sum(logaddexp2(x, y))}, {x, y});
    check_values(g[0], {0.5, 0.2});  // 2^a / (2^a + 2^b)
    check_values(g[1], {0.5, 0.8});
  }
  CHECK_THROWS_AS(logaddexp2(vec({1}).to(i64), vec({1}).to(i64)), DTypeError);
}

TEST_CASE("std, nanmedian, nanquantile, kthvalue: torch's values, positions, gradients and errors") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor x = vec({1, 2, 3, 4});
  check_values(kiln::std(x), {1.2909944487358056});
  check_values(kiln::std(x, {}, false, 0.0), {1.118033988749895});
  CHECK(kiln::std(vec({1, 2, 3, 4}, {2, 2}), {1}, true).shape() == Shape{2, 1});
  {  // A constant slice has deviation 0 and gradient 0 (not NaN), as torch's.
    Tensor c = vec({2, 2, 2}).requires_grad_();
    check_values(autograd::grad({kiln::std(c)}, {c})[0], {0, 0, 0});
  }
  CHECK_THROWS_AS(kiln::std(x.to(i64)), DTypeError);

  check_values(nanmedian(vec({3, nan, 1, 2, nan})), {2});
  check_values(nanmedian(vec({nan, nan})), {nan});
  check_values(nanmedian(zeros({0})), {nan});
  check_values(nanmedian(vec({3, 1, 2}).to(i64)), {2});
  {
    const Tensor m = vec({3, nan, 1, 2, nan, nan, nan, nan, 4, 1, nan, nan}, {3, 4});
    auto [values, indices] = nanmedian(m, 1);
    check_values(values, {2, nan, 1});
    check_values(indices, {3, 0, 1});
    CHECK(std::get<0>(nanmedian(m, 1, true)).shape() == Shape{3, 1});
    Tensor w = vec({3, nan, 1, 2}).requires_grad_();
    check_values(autograd::grad({nanmedian(w)}, {w})[0], {0, 0, 0, 1});
    Tensor ties = vec({0.25, nan, 2, 1, 0.25}).requires_grad_();
    check_values(autograd::grad({nanmedian(ties)}, {ties})[0], {0.5, 0, 0, 0, 0.5});
    Tensor empty = zeros({2, 0}).requires_grad_();
    CHECK(autograd::grad({nanmedian(empty)}, {empty})[0].shape() == Shape{2, 0});
  }
  CHECK_THROWS_AS(nanmedian(vec({1}) > 0, 0), DTypeError);

  const Tensor q = vec({1, nan, 3, 2});
  check_values(nanquantile(q, 0.5), {2});
  check_values(nanquantile(q, 0.25), {1.5});
  check_values(quantile(q, 0.5), {nan});
  check_values(nanquantile(vec({nan, nan}), 0.5), {nan});
  check_values(nanquantile(vec({1, nan, 3, nan, nan, nan}, {2, 3}), 1.0, 1), {3, nan});
  check_values(nanquantile(q, std::vector<double>{0, 1}), {1, 3});
  check_values(nanquantile(vec({1, nan, 3, 4}), 0.5, std::nullopt, false, "lower"), {3});
  CHECK_THROWS_AS(nanquantile(q, 1.5), ValueError);
  CHECK_THROWS_AS(nanquantile(q.to(f16), 0.5), DTypeError);

  // kthvalue: the k-th smallest (from 1), the stable sort's position among ties; NaN largest.
  {
    auto [v, at] = kthvalue(vec({3, 1, 2, 1}), 2);
    check_values(v, {1});
    check_values(at, {3});
    check_values(std::get<0>(kthvalue(vec({nan, 1, 2}), 3)), {nan});
    const Tensor m = vec({5, 1, 4, 2, 3, 6}, {2, 3});
    auto [v0, at0] = kthvalue(m, 1, 0);
    check_values(v0, {2, 1, 4});
    check_values(at0, {1, 0, 0});
    CHECK(std::get<0>(kthvalue(m, 2, 1, true)).shape() == Shape{2, 1});
    check_values(std::get<0>(kthvalue(m, 2, 1)), {4, 3});
    Tensor w = vec({3, 1, 2}).requires_grad_();
    check_values(autograd::grad({std::get<0>(kthvalue(w, 2))}, {w})[0], {0, 0, 1});
    CHECK_THROWS_AS(kthvalue(m, 4, 1), IndexError);
    CHECK_THROWS_AS(kthvalue(m, 0), IndexError);
    CHECK_THROWS_AS(kthvalue(m, 1, 2), ShapeError);
  }
}

TEST_CASE("searchsorted and bucketize: torch's documented examples, sides, sorter, NaN, both search paths") {
  const Tensor seq = vec({1, 3, 5, 7, 9, 2, 4, 6, 8, 10}, {2, 5}).to(i64);
  const Tensor values = vec({3, 6, 9, 3, 6, 9}, {2, 3}).to(i64);
  check_values(searchsorted(seq, values), {1, 3, 4, 1, 2, 4});
  check_values(searchsorted(seq, values, false, false, "right"), {2, 3, 5, 1, 3, 4});
  check_values(searchsorted(seq, values, false, true), {2, 3, 5, 1, 3, 4});
  const Tensor seq1 = vec({1, 3, 5, 7, 9}).to(i64);
  check_values(searchsorted(seq1, values), {1, 3, 4, 1, 3, 4});
  CHECK(searchsorted(seq1, values).dtype() == i64);
  CHECK(searchsorted(seq1, values, true).dtype() == i32);
  CHECK(searchsorted(seq1, 6.0).shape() == Shape{});
  CHECK(searchsorted(seq1, 6.0).item<std::int64_t>() == 3);
  CHECK(searchsorted(seq1, 7.0, false, true).item<std::int64_t>() == 4);
  const Tensor unsorted = vec({5, 1, 9, 3, 7});
  check_values(searchsorted(unsorted, vec({3, 6, 9}), false, false, std::nullopt, vec({1, 3, 0, 4, 2}).to(i64)),
               {1, 3, 4});
  // A NaN value goes last; -0 equals 0.
  check_values(searchsorted(vec({-1, 0, 1}), vec({NAN, -0.0, 0.5})), {3, 1, 2});
  check_values(bucketize(values, seq1), {1, 3, 4, 1, 3, 4});
  check_values(bucketize(values, seq1, false, true), {2, 3, 5, 2, 3, 5});
  CHECK_THROWS_AS(searchsorted(seq1, values, false, false, "middle"), ValueError);
  CHECK_THROWS_AS(searchsorted(seq1, values, false, true, "left"), ValueError);
  CHECK_THROWS_AS(searchsorted(seq, vec({1, 2}).to(i64)), ShapeError);
  CHECK_THROWS_AS(searchsorted(vec({1}, {}), values), ShapeError);
  CHECK_THROWS_AS(searchsorted(seq1, values, false, false, std::nullopt, vec({0, 1, 2, 3, 4})), DTypeError);
  CHECK_THROWS_AS(bucketize(values, seq), ShapeError);

  // Long rows merge with the values in one sort, short ones compare every pair: both against
  // std::lower_bound / upper_bound, one row and two.
  for (std::int64_t n : {40, 3000}) {
    std::vector<double> s(static_cast<std::size_t>(2 * n)), v(2100);
    for (std::size_t k = 0; k < s.size(); ++k) s[k] = static_cast<double>(k % static_cast<std::size_t>(n) / 2);
    for (std::size_t k = 0; k < v.size(); ++k) v[k] = static_cast<double>((k * 7919) % 3001) / 2.0 - 1.0;
    const Tensor rows = vec(s, {2, n}), vals = vec(v, {2, 1050});
    for (bool right : {false, true}) {
      std::vector<double> want_rows, want_one;
      for (std::size_t k = 0; k < v.size(); ++k) {
        auto begin = s.begin() + (k < 1050 ? 0 : n), end = begin + n;
        auto at = right ? std::upper_bound(begin, end, v[k]) : std::lower_bound(begin, end, v[k]);
        want_rows.push_back(static_cast<double>(at - begin));
        auto at1 =
            right ? std::upper_bound(s.begin(), s.begin() + n, v[k]) : std::lower_bound(s.begin(), s.begin() + n, v[k]);
        want_one.push_back(static_cast<double>(at1 - s.begin()));
      }
      INFO("n " << n << " right " << right);
      check_values(searchsorted(rows, vals, false, right), want_rows, 0);
      check_values(searchsorted(narrow(rows, 0, 0, 1).reshape({n}), vals, false, right), want_one, 0);
    }
  }
}

TEST_CASE("cov, corrcoef, histc: torch's values, weights, dtypes and errors") {
  const Tensor x = vec({0, 1, 2, 2, 1, 0}, {2, 3});
  check_values(cov(x), {1, -1, -1, 1});
  check_values(cov(vec({1, 2, 3, 4})), {1.6666666666666667});
  CHECK(cov(vec({1, 2, 3, 4})).shape() == Shape{});
  check_values(cov(vec({1, 2, 3, 4}), 0), {1.25});
  CHECK(cov(x.to(i64)).dtype() == f32);
  // fweights [1, 2, 1]: mean 1 both, sums 2 and -2 over 4 - 1 degrees of freedom.
  const Tensor fw = vec({1, 2, 1}).to(i64);
  check_values(cov(x, 1, fw), {2.0 / 3, -2.0 / 3, -2.0 / 3, 2.0 / 3});
  // aweights [1, 1, 2]: means 1.25 and 0.75, sums +-2.75 over 4 - 6 / 4.
  const Tensor aw = vec({1, 1, 2});
  check_values(cov(x, 1, {}, aw), {1.1, -1.1, -1.1, 1.1});
  check_values(cov(vec({1, 2}), 2), {INFINITY});  // no degrees of freedom left: torch divides by 0
  CHECK_THROWS_AS(cov(zeros({2, 2, 2})), ShapeError);
  CHECK_THROWS_AS(cov(x, 1, aw), DTypeError);
  CHECK_THROWS_AS(cov(x, 1, {}, fw), DTypeError);
  CHECK_THROWS_AS(cov(x, 1, vec({1, -1, 1}).to(i64)), ValueError);
  CHECK_THROWS_AS(cov(x, 1, vec({1, 1}).to(i64)), ShapeError);

  check_values(corrcoef(x), {1, -1, -1, 1});
  check_values(corrcoef(vec({1, 2, 4, 4, 3, 2, 1, 2, 4, 6, 8.5, 1}, {3, 4})),
               {1, -0.8164965809277261, 0.02627034687463669, -0.8164965809277261, 1, -0.5791405068790082,
                0.02627034687463669, -0.5791405068790082, 1},
               1e-5);
  check_values(corrcoef(vec({1, 2, 3})), {1});
  check_values(corrcoef(vec({2, 2, 2})), {NAN});

  // histc: torch's documented example; the data's range; outside values and NaN not counted.
  check_values(histc(vec({1, 2, 1}), 4, 0, 3), {0, 2, 1, 0});
  check_values(histc(vec({1, 2, 1}), 4), {2, 0, 0, 1});
  check_values(histc(vec({3, 3}), 2), {0, 2});
  check_values(histc(vec({-1, 0, 0.5, 1, 2, NAN}), 2, 0, 1), {1, 2});
  CHECK(histc(vec({1}, {1}, f64), 3).dtype() == f64);
  CHECK_THROWS_AS(histc(vec({1}).to(i64)), DTypeError);
  CHECK_THROWS_AS(histc(vec({1}), 0), ValueError);
  CHECK_THROWS_AS(histc(vec({1}), 2, 3, 1), ValueError);
  CHECK_THROWS_AS(histc(vec({1, INFINITY})), ValueError);
}

TEST_CASE("erfinv: values, the ends, round trips through erf and erfc, dtypes and the gradient") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  check_values(
      erfinv(vec({0.5, -0.9, 0.1, 1e-10, 0, 1, -1, 1.5, nan}, {9}, f64)),
      {0.4769362762044699, -1.1630871536766745, 0.08885599049425769, 8.862269254527581e-11, 0, inf, -inf, nan, nan},
      1e-15);
  check_values(signbit(erfinv(vec({-0.0}))), {1});
  {  // erf(erfinv(y)) = y in float64 over (-1, 1); near 1, erfc(erfinv(y)) = 1 - y to its digits.
    std::vector<double> ys;
    for (int k = 1; k < 200; ++k) ys.push_back(-1.0 + k / 100.0);
    for (double t : {1e-6, 1e-10, 1e-14}) ys.push_back(1.0 - t);
    const std::vector<double> x = erfinv(vec(ys, {static_cast<std::int64_t>(ys.size())}, f64)).to_vector<double>();
    for (std::size_t k = 0; k < ys.size(); ++k) {
      INFO("y = " << ys[k]);
      if (std::abs(ys[k]) <= 0.5)
        CHECK(std::abs(std::erf(x[k]) - ys[k]) <= 2e-16 * (1 + std::abs(ys[k])));
      else
        CHECK(std::abs(std::erfc(std::abs(x[k])) - (1 - std::abs(ys[k]))) <= 4e-15 * (1 - std::abs(ys[k])));
    }
    // float32 at the same (float32) points within a few ulps of the float64 result.
    const Tensor y32 = vec(ys, {static_cast<std::int64_t>(ys.size())}, f32);
    const std::vector<double> f = erfinv(y32).to(f64).to_vector<double>(),
                              exact = erfinv(y32.to(f64)).to_vector<double>();
    for (std::size_t k = 0; k < ys.size(); ++k) {
      INFO("y = " << ys[k]);
      if (std::isinf(exact[k]))  // 1 - 1e-10 and 1 - 1e-14 round to 1 in float32
        CHECK(f[k] == exact[k]);
      else
        CHECK(std::abs(f[k] - exact[k]) <= 4e-7 * std::abs(exact[k]));
    }
  }
  CHECK(erfinv(vec({0}).to(i64)).dtype() == f32);
  CHECK(erfinv(vec({0.5}).to(bf16)).dtype() == bf16);
  {  // torch's gradient sqrt(pi)/2 exp(erfinv(y)^2).
    Tensor y = vec({0, 0.5, -0.9}, {3}, f64).requires_grad_();
    const double r1 = 0.4769362762044699, r2 = -1.1630871536766745, c = std::sqrt(3.141592653589793) / 2;
    check_values(autograd::grad({sum(erfinv(y))}, {y})[0], {c, c * std::exp(r1 * r1), c * std::exp(r2 * r2)}, 1e-14);
    CHECK(autograd::gradcheck([](std::vector<Tensor> in) { return Tensor(erfinv(in[0])); },
                              {vec({-0.7, 0.2, 0.95}, {3}, f64)}));
  }
}

TEST_CASE("erfc, lgamma, digamma: values, poles, identities and gradients") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  const double pi = 3.141592653589793, euler = 0.5772156649015329;
  // erfc keeps its tail where 1 - erf(x) would round to 0.
  const Tensor e = vec({0, 1, 5, 10, -2, inf, -inf, nan}, {8}, f64);
  check_values(erfc(e), {1, std::erfc(1.0), std::erfc(5.0), std::erfc(10.0), std::erfc(-2.0), 0, 2, nan}, 1e-14);
  check_values(erfc(vec({10})), {std::erfc(10.0)}, 1e-5);  // float32: 2.1e-45, a subnormal
  CHECK(erfc(vec({1}).to(i64)).dtype() == f32);
  check_values(lgamma(vec({0.5, -0.5, 1, 2, 10, 0, -1, inf, -inf, nan}, {10}, f64)),
               {0.5723649429247001, 1.2655121234846454, 0, 0, std::lgamma(10.0), inf, inf, inf, inf, nan}, 1e-14);
  check_values(digamma(vec({1, 0.5, -0.5, 10, 100, 1e20, inf}, {7}, f64)),
               {-euler, -euler - 2 * std::log(2.0), 0.03648997397857652, 2.251752589066721, 4.600161852738087,
                std::log(1e20), inf},
               1e-13);
  // The poles: -inf at +0, +inf at -0, NaN at the negative integers and -inf.
  check_values(digamma(vec({0.0, -0.0, -1, -3, -inf, nan}, {6}, f64)), {-inf, inf, nan, nan, nan, nan});
  {  // psi(x + 1) = psi(x) + 1/x and psi(1 - x) - psi(x) = pi cot(pi x) over a range, float64.
    std::vector<double> xs;
    for (int k = 0; k < 200; ++k) xs.push_back(-30.0 + 0.3137 * k + 0.01);  // no pole among them
    const Tensor x = vec(xs, {200}, f64);
    const std::vector<double> a = digamma(x).to_vector<double>(), b = digamma(x + 1.0).to_vector<double>(),
                              c = digamma(1.0 - x).to_vector<double>();
    for (std::size_t k = 0; k < xs.size(); ++k) {
      INFO("x = " << xs[k]);
      CHECK(std::abs(b[k] - a[k] - 1 / xs[k]) <= 1e-12 * (1 + std::abs(b[k])));
      CHECK(std::abs(c[k] - a[k] - pi / std::tan(pi * xs[k])) <= 1e-10 * (1 + std::abs(c[k]) + std::abs(a[k])));
    }
    // float32 within a few ulps of the float64 values at the same (float32) points.
    const Tensor x32 = x.to(f32);
    const std::vector<double> f = digamma(x32).to(f64).to_vector<double>(),
                              exact = digamma(x32.to(f64)).to_vector<double>();
    for (std::size_t k = 0; k < xs.size(); ++k) {
      INFO("x = " << xs[k]);
      CHECK(std::abs(f[k] - exact[k]) <= 4e-7 * (1 + std::abs(exact[k])));
    }
  }
  CHECK(digamma(vec({1}).to(f16)).dtype() == f16);
  CHECK(lgamma(vec({1}).to(i32)).dtype() == f32);
  {  // Gradients: erfc' = -2/sqrt(pi) e^-x^2, lgamma' = digamma, digamma' = trigamma.
    Tensor x = vec({0.5, -0.5, 1, 3}, {4}, f64).requires_grad_();
    const auto g = autograd::grad({sum(erfc(x) + lgamma(x) + digamma(x))}, {x});
    const std::vector<double> trig = {pi * pi / 2, pi * pi / 2 + 4, pi * pi / 6, pi * pi / 6 - 1 - 0.25};
    const std::vector<double> dig = digamma(vec({0.5, -0.5, 1, 3}, {4}, f64)).to_vector<double>();
    std::vector<double> want;
    for (std::size_t k = 0; k < 4; ++k) {
      const double v = std::vector<double>{0.5, -0.5, 1, 3}[k];
      want.push_back(-2 / std::sqrt(pi) * std::exp(-v * v) + dig[k] + trig[k]);
    }
    check_values(g[0], want, 1e-11);
    const Tensor y = vec({0.7, 2.5, -1.3}, {3}, f64);
    CHECK(autograd::gradcheck(
        [](std::vector<Tensor> in) { return Tensor(lgamma(in[0]) * digamma(in[0]) + erfc(in[0])); }, {y}));
  }
}

TEST_CASE("index_put, index_fill, masked_scatter: torch's positions, accumulation, gradients and errors") {
  const Tensor x = zeros({3, 4});
  auto ints = [](std::vector<double> v) { return vec(std::move(v)).to(i64).eval(); };
  // One index: whole rows, negative positions from the end; two: single elements; broadcast.
  check_values(index_put(x, {ints({-1, 0})}, full({}, 1.0)), {1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1});
  check_values(index_put(x, {ints({0, 2}), ints({1, 3})}, vec({5, 6})), {0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 6});
  check_values(index_put(x, {vec({0, 2}, {2, 1}, i64), ints({1, 3})}, full({}, 7.0)),
               {0, 7, 0, 7, 0, 0, 0, 0, 0, 7, 0, 7});
  check_values(index_put(x, {ints({1, 1, 1})}, vec({1, 2, 3, 4}), true), {0, 0, 0, 0, 3, 6, 9, 12, 0, 0, 0, 0});
  check_values(index_put(x, {vec({1, 0, 1}, {3}, DType::Bool)}, vec({1, 2, 3, 4})),
               {1, 2, 3, 4, 0, 0, 0, 0, 1, 2, 3, 4});
  check_values(index_put(x, {ints({0}).to(i32)}, full({}, 1.0)), {1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0});
  Tensor y = zeros({3, 4});
  y.index_put_({ints({2})}, full({}, 3.0), true);
  y.index_put_({ints({2}), ints({-1})}, full({}, 3.0), true);
  check_values(y, {0, 0, 0, 0, 0, 0, 0, 0, 3, 3, 3, 6});
  CHECK_THROWS_AS(index_put(x, {ints({1})}, full({}, 1.0, f64)), DTypeError);
  CHECK_THROWS_AS(index_put(x, {vec({0})}, full({}, 1.0)), DTypeError);
  CHECK_THROWS_AS(index_put(x, {ints({3})}, full({}, 1.0)), IndexError);
  CHECK_THROWS_AS(index_put(x, {ints({0}), ints({-5})}, full({}, 1.0)), IndexError);
  CHECK_THROWS_AS(index_put(x, {ints({0}) + 4}, full({}, 1.0)).eval(), IndexError);  // found by the kernel
  CHECK_THROWS_AS(index_put(x, {ints({0, 1})}, ones({3})), ShapeError);
  CHECK_THROWS_AS(index_put(x, {ints({0}), ints({0}), ints({0})}, full({}, 1.0)), IndexError);
  CHECK_THROWS_AS(index_put(x, {ints({0, 1}), ints({0, 1, 2})}, full({}, 1.0)), ShapeError);

  check_values(index_fill(x, 1, ints({-1, 0}), 2.5), {2.5, 0, 0, 2.5, 2.5, 0, 0, 2.5, 2.5, 0, 0, 2.5});
  check_values(index_fill(zeros({2, 2}, i64), 0, ints({1}), 2.7), {0, 0, 2, 2});
  check_values(index_fill(full({}, 1.0), 0, ints({0}), 2.0), {2});
  CHECK_THROWS_AS(index_fill(x, 1, ints({4}), 1.0), IndexError);
  CHECK_THROWS_AS(index_fill(x, 1, vec({0}, {1, 1}, i64), 1.0), ShapeError);
  CHECK_THROWS_AS(index_fill(x, 1, ints({0}), full({1}, 3.0)), ShapeError);

  const Tensor alternate = vec({1, 0, 1, 0}, {4}, DType::Bool);
  check_values(masked_scatter(x, alternate, arange(0, 12, 1, f32)), {0, 0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0});
  CHECK(masked_scatter(zeros({4}), full({3, 4}, 1.0, DType::Bool), arange(0, 12, 1, f32)).shape() == Shape{3, 4});
  check_values(masked_scatter(x, zeros({4}, DType::Bool), zeros({0})), std::vector<double>(12, 0.0));
  CHECK_THROWS_AS(masked_scatter(x, alternate, arange(0, 5, 1, f32)).eval(), IndexError);  // 6 true, 5 values
  CHECK_THROWS_AS(masked_scatter(x, alternate, arange(0, 12, 1, i64)), DTypeError);
  CHECK_THROWS_AS(masked_scatter(x, alternate.to(i64), arange(0, 12, 1, f32)), DTypeError);

  // Gradients: the overwritten places of the input get none, the values (source) what reached
  // the places they were written to (summed over repeats and broadcasts).
  const Tensor rows = ints({0, 2});
  CHECK(autograd::gradcheck(
      [&](std::vector<Tensor> in) {
        return index_put(in[0], {rows, ints({1, -1})}, in[1]) * in[0];
      },
      {vec({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {3, 4}, f64), vec({0.5, -2}, {2}, f64)}));
  CHECK(autograd::gradcheck(
      [&](std::vector<Tensor> in) {
        return index_put(in[0], {ints({1, 1})}, in[1], true);
      },
      {vec({1, 2, 3, 4, 5, 6}, {3, 2}, f64), vec({0.5, -2}, {2}, f64)}));
  CHECK(autograd::gradcheck([&](std::vector<Tensor> in) { return index_fill(in[0] * in[0], 1, ints({-1}), in[1]); },
                            {vec({1, 2, 3, 4, 5, 6}, {2, 3}, f64), vec({0.5}, {}, f64)}));
  CHECK(autograd::gradcheck([&](std::vector<Tensor> in) { return masked_scatter(in[0], alternate, in[1] * in[1]); },
                            {vec({1, 2, 3, 4, 5, 6, 7, 8}, {2, 4}, f64), vec({1, 2, 3, 4, 5}, {5}, f64)}));
}

}  // namespace kiln_test_tensor_composites
