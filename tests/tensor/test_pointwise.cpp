// Every pointwise op x every dtype it supports, against float64 (or exact integer) references
// computed here, with torch.testing's per-dtype tolerances; contiguous and transposed inputs. The
// activations (tensor/activations.hpp) against torch's float64 values and gradients.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "../support/reference.hpp"

namespace kiln_test_tensor_pointwise {

using namespace kiln;
namespace kt = kiln::testing;

namespace {

using TensorFn = std::function<Tensor(const Tensor&)>;
using BinaryFn = std::function<Tensor(const Tensor&, const Tensor&)>;

/// `vals` as a [rows, cols] tensor of `dtype`: contiguous, or a transposed view of an
/// evaluated [cols, rows] tensor (same logical values, non-contiguous strides).
Tensor make_2d(const std::vector<double>& vals, std::int64_t rows, std::int64_t cols, DType dtype, bool transposed) {
  if (!transposed) return kt::make_tensor(vals, {rows, cols}, dtype);
  std::vector<double> t(vals.size());
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) t[j * rows + i] = vals[i * cols + j];
  Tensor base = kt::make_tensor(t, {cols, rows}, dtype);
  base.eval();
  Tensor v = transpose(base, 0, 1);
  REQUIRE_FALSE(v.is_contiguous());
  return v;
}

struct UnaryCase {
  const char* name;
  TensorFn f;
  double (*ref)(double);
  double lo, hi;        // domain of the test inputs
  bool integer_inputs;  // also defined for integer and bool inputs (result float32)
};

std::vector<UnaryCase> float_unary_cases() {
  return {
      {"exp", [](const Tensor& x) -> Tensor { return exp(x); }, [](double x) { return std::exp(x); }, -4, 4, true},
      {"exp2", [](const Tensor& x) -> Tensor { return exp2(x); }, [](double x) { return std::exp2(x); }, -4, 4, true},
      {"log", [](const Tensor& x) -> Tensor { return log(x); }, [](double x) { return std::log(x); }, 0.05, 10, true},
      {"log2", [](const Tensor& x) -> Tensor { return log2(x); }, [](double x) { return std::log2(x); }, 0.05, 10,
       true},
      {"log1p", [](const Tensor& x) -> Tensor { return log1p(x); }, [](double x) { return std::log1p(x); }, -0.9, 5,
       true},
      {"expm1", [](const Tensor& x) -> Tensor { return expm1(x); }, [](double x) { return std::expm1(x); }, -3, 3,
       true},
      {"sqrt", [](const Tensor& x) -> Tensor { return sqrt(x); }, [](double x) { return std::sqrt(x); }, 0, 10, true},
      {"rsqrt", [](const Tensor& x) -> Tensor { return rsqrt(x); }, [](double x) { return 1.0 / std::sqrt(x); }, 0.05,
       10, true},
      {"sin", [](const Tensor& x) -> Tensor { return sin(x); }, [](double x) { return std::sin(x); }, -6, 6, true},
      {"cos", [](const Tensor& x) -> Tensor { return cos(x); }, [](double x) { return std::cos(x); }, -6, 6, true},
      {"tan", [](const Tensor& x) -> Tensor { return tan(x); }, [](double x) { return std::tan(x); }, -1.4, 1.4, true},
      {"tanh", [](const Tensor& x) -> Tensor { return tanh(x); }, [](double x) { return std::tanh(x); }, -4, 4, true},
      {"erf", [](const Tensor& x) -> Tensor { return erf(x); }, [](double x) { return std::erf(x); }, -3, 3, true},
      {"sigmoid", [](const Tensor& x) -> Tensor { return sigmoid(x); }, kt::ref_sigmoid, -8, 8, true},
      // PyTorch defines gelu and silu for floating tensors only.
      {"gelu", [](const Tensor& x) -> Tensor { return gelu(x); }, kt::ref_gelu, -5, 5, false},
      {"gelu(tanh)", [](const Tensor& x) -> Tensor { return gelu(x, true); }, kt::ref_gelu_tanh, -5, 5, false},
      {"silu", [](const Tensor& x) -> Tensor { return silu(x); }, [](double x) { return x * kt::ref_sigmoid(x); }, -8,
       8, false},
  };
}

}  // namespace

TEST_CASE("floating unary functions on every floating dtype, contiguous and strided") {
  for (const auto& c : float_unary_cases()) {
    for (DType dt : kt::kFloatDTypes) {
      for (bool transposed : {false, true}) {
        CAPTURE(c.name);
        CAPTURE(dt);
        CAPTURE(transposed);
        auto in = kt::uniform_values(15, c.lo, c.hi, dt, 7);
        Tensor x = make_2d(in, 3, 5, dt, transposed);
        Tensor y = c.f(x);
        CHECK(y.dtype() == dt);
        CHECK(y.shape() == Shape{3, 5});
        std::vector<double> expected;
        for (double v : in) expected.push_back(c.ref(v));
        KILN_CHECK_CLOSE(y, expected);
      }
    }
  }
}

TEST_CASE("floating unary functions on integer and bool inputs give float32") {
  for (const auto& c : float_unary_cases()) {
    if (!c.integer_inputs) continue;
    for (DType dt : {DType::Bool, DType::Int32, DType::Int64}) {
      CAPTURE(c.name);
      CAPTURE(dt);
      std::int64_t lo = static_cast<std::int64_t>(std::ceil(c.lo)), hi = static_cast<std::int64_t>(std::floor(c.hi));
      if (dt == DType::Bool) lo = 0, hi = 1;
      lo = std::max<std::int64_t>(lo, dt == DType::Bool ? 0 : -5);
      hi = std::min<std::int64_t>(hi, 5);
      auto in = kt::integer_values(12, lo, hi, 3);
      Tensor y = c.f(kt::make_tensor(in, {3, 4}, dt));
      CHECK(y.dtype() == DType::Float32);
      std::vector<double> expected;
      for (double v : in) expected.push_back(c.ref(v));
      KILN_CHECK_CLOSE(y, expected);
    }
  }
}

TEST_CASE("abs, neg, floor, ceil, round, relu keep the dtype") {
  struct Case {
    const char* name;
    TensorFn f;
    double (*ref)(double);
    bool bool_ok;
  };
  std::vector<Case> cases = {
      {"abs", [](const Tensor& x) -> Tensor { return abs(x); }, [](double x) { return std::fabs(x); }, false},
      {"neg", [](const Tensor& x) -> Tensor { return neg(x); }, [](double x) { return -x; }, false},
      {"floor", [](const Tensor& x) -> Tensor { return floor(x); }, [](double x) { return std::floor(x); }, false},
      {"ceil", [](const Tensor& x) -> Tensor { return ceil(x); }, [](double x) { return std::ceil(x); }, false},
      // torch.round rounds halves to even.
      {"round", [](const Tensor& x) -> Tensor { return round(x); }, [](double x) { return std::nearbyint(x); }, false},
      {"relu", [](const Tensor& x) -> Tensor { return relu(x); }, [](double x) { return x > 0 ? x : 0.0; }, false},
  };
  for (const auto& c : cases) {
    for (DType dt : kt::kAllDTypes) {
      CAPTURE(c.name);
      CAPTURE(dt);
      auto in = kt::values_for(dt, 12, -4, 4, 11);
      if (is_floating(dt)) {  // halves, to check rounding to even
        double halves[] = {-2.5, -1.5, -0.5, 0.5, 1.5, 2.5};
        for (int i = 0; i < 6; ++i) in[i] = halves[i];
      }
      Tensor x = kt::make_tensor(in, {4, 3}, dt);
      if (dt == DType::Bool && !c.bool_ok) {
        CHECK_THROWS_AS(c.f(x), DTypeError);
        continue;
      }
      Tensor y = c.f(x);
      CHECK(y.dtype() == dt);
      std::vector<double> expected;
      for (double v : in) expected.push_back(c.ref(v));
      KILN_CHECK_CLOSE(y, expected);
    }
  }
}

TEST_CASE("round: halves go to even, like torch.round") {
  Tensor x = kt::make_tensor({-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 0.49999997, -3.7}, {9}, DType::Float32);
  Tensor y = round(x);
  auto v = kt::values(y);
  KILN_CHECK_CLOSE(v, std::vector<double>{-2, -2, -0.0, 0, 2, 2, 4, 0, -4}, kt::Tolerance{});
  CHECK(std::signbit(v[2]));  // round(-0.5) = -0.0
}

namespace {

struct BinaryCase {
  const char* name;
  BinaryFn f;
  double (*ref)(double, double);
  bool comparison;  // result bool
};

std::vector<BinaryCase> arithmetic_cases() {
  return {
      {"add", [](const Tensor& a, const Tensor& b) -> Tensor { return a + b; },
       [](double a, double b) { return a + b; }, false},
      {"sub", [](const Tensor& a, const Tensor& b) -> Tensor { return a - b; },
       [](double a, double b) { return a - b; }, false},
      {"mul", [](const Tensor& a, const Tensor& b) -> Tensor { return a * b; },
       [](double a, double b) { return a * b; }, false},
      {"maximum", [](const Tensor& a, const Tensor& b) -> Tensor { return maximum(a, b); },
       [](double a, double b) { return std::max(a, b); }, false},
      {"minimum", [](const Tensor& a, const Tensor& b) -> Tensor { return minimum(a, b); },
       [](double a, double b) { return std::min(a, b); }, false},
      {"eq", [](const Tensor& a, const Tensor& b) -> Tensor { return a == b; },
       [](double a, double b) { return double(a == b); }, true},
      {"ne", [](const Tensor& a, const Tensor& b) -> Tensor { return a != b; },
       [](double a, double b) { return double(a != b); }, true},
      {"lt", [](const Tensor& a, const Tensor& b) -> Tensor { return a < b; },
       [](double a, double b) { return double(a < b); }, true},
      {"le", [](const Tensor& a, const Tensor& b) -> Tensor { return a <= b; },
       [](double a, double b) { return double(a <= b); }, true},
      {"gt", [](const Tensor& a, const Tensor& b) -> Tensor { return a > b; },
       [](double a, double b) { return double(a > b); }, true},
      {"ge", [](const Tensor& a, const Tensor& b) -> Tensor { return a >= b; },
       [](double a, double b) { return double(a >= b); }, true},
  };
}

}  // namespace

TEST_CASE("binary arithmetic and comparisons on every dtype, broadcast and strided") {
  for (const auto& c : arithmetic_cases()) {
    for (DType dt : kt::kAllDTypes) {
      for (bool transposed : {false, true}) {
        CAPTURE(c.name);
        CAPTURE(dt);
        CAPTURE(transposed);
        auto av = kt::values_for(dt, 12, -3, 3, 21);
        auto bv = kt::values_for(dt, 4, -3, 3, 22);
        av[0] = bv[0];  // at least one tie for the comparisons
        Tensor a = make_2d(av, 3, 4, dt, transposed);
        Tensor b = kt::make_tensor(bv, {4}, dt);  // broadcast along rows
        if (dt == DType::Bool && std::string(c.name) == "sub") {
          CHECK_THROWS_AS(c.f(a, b), DTypeError);
          continue;
        }
        Tensor y = c.f(a, b);
        CHECK(y.dtype() == (c.comparison ? DType::Bool : dt));
        CHECK(y.shape() == Shape{3, 4});
        kt::Ref r = kt::zip({av, {3, 4}}, {bv, {4}}, c.ref);
        if (dt == DType::Bool && !c.comparison)  // bool arithmetic saturates: add = or, mul = and
          for (auto& v : r.v) v = v != 0 ? 1 : 0;
        KILN_CHECK_CLOSE(y, r);
      }
    }
  }
}

TEST_CASE("division is true division; integer inputs give float32") {
  for (DType dt : kt::kAllDTypes) {
    CAPTURE(dt);
    auto av = kt::values_for(dt, 6, -3, 3, 31);
    std::vector<double> bv = dt == DType::Bool ? std::vector<double>{1, 1, 1} : std::vector<double>{2, -3, 0.5};
    for (auto& v : bv) v = kt::round_to(v == 0.5 && !is_floating(dt) ? 4 : v, dt);
    Tensor y = kt::make_tensor(av, {2, 3}, dt) / kt::make_tensor(bv, {3}, dt);
    DType out = is_floating(dt) ? dt : DType::Float32;
    CHECK(y.dtype() == out);
    KILN_CHECK_CLOSE(y, kt::zip({av, {2, 3}}, {bv, {3}}, [](double a, double b) { return a / b; }));
  }
  Tensor q =
      kt::make_int_tensor({7, -7, 1, 0}, {4}, DType::Int32) / kt::make_int_tensor({2, 2, 0, 0}, {4}, DType::Int32);
  CHECK(q.dtype() == DType::Float32);
  KILN_CHECK_CLOSE(q, std::vector<double>{3.5, -3.5, INFINITY, NAN});
}

TEST_CASE("pow on every numeric dtype") {
  for (DType dt : {DType::Int32, DType::Int64, DType::Float16, DType::BFloat16, DType::Float32, DType::Float64}) {
    CAPTURE(dt);
    std::vector<double> base, expo;
    if (is_floating(dt)) {
      base = kt::uniform_values(12, 0.25, 3, dt, 41);
      expo = kt::uniform_values(12, -2, 2, dt, 42);
    } else {
      base = kt::integer_values(12, -5, 5, 41);
      expo = kt::integer_values(12, 0, 4, 42);
    }
    Tensor y = pow(kt::make_tensor(base, {3, 4}, dt), kt::make_tensor(expo, {3, 4}, dt));
    CHECK(y.dtype() == dt);
    std::vector<double> expected;
    for (std::size_t i = 0; i < base.size(); ++i) expected.push_back(std::pow(base[i], expo[i]));
    KILN_CHECK_CLOSE(y, expected);
  }
  // Negative bases with integral exponents are defined; with fractional ones they are NaN.
  Tensor b = kt::make_tensor({-2, -2, -8, 4}, {4}, DType::Float32);
  KILN_CHECK_CLOSE(pow(b, kt::make_tensor({3, 2, 0.5, -0.5}, {4}, DType::Float32)),
                   std::vector<double>{-8, 4, NAN, 0.5});
  KILN_CHECK_CLOSE(pow(b, 2), std::vector<double>{4, 4, 64, 16});
  KILN_CHECK_CLOSE(pow(2.0f, b), std::vector<double>{0.25, 0.25, 1.0 / 256, 16});
  CHECK_THROWS_AS(pow(kt::make_tensor({1, 0}, {2}, DType::Bool), kt::make_tensor({1, 1}, {2}, DType::Bool)),
                  DTypeError);
}

TEST_CASE("int64 arithmetic is exact beyond 2^53") {
  const std::int64_t big = (std::int64_t(1) << 60) + 1;
  Tensor a = kt::make_int_tensor({big, big, -big, 3}, {4});
  Tensor b = kt::make_int_tensor({3, big - 1, 2, 39}, {4});
  KILN_CHECK_EXACT(a + b, {big + 3, 2 * big - 1, -big + 2, 42});
  KILN_CHECK_EXACT(a - b, {big - 3, 1, -big - 2, -36});
  KILN_CHECK_EXACT(a * 3, {3 * big, 3 * big, -3 * big, 9});
  KILN_CHECK_EXACT(maximum(a, b), {big, big, 2, 39});
  KILN_CHECK_EXACT(a > b, {1, 1, 0, 0});
  KILN_CHECK_EXACT(a == b + 1, {0, 1, 0, 0});
  KILN_CHECK_EXACT(a + (std::int64_t(1) << 55), {big + (std::int64_t(1) << 55), big + (std::int64_t(1) << 55),
                                                 -big + (std::int64_t(1) << 55), 3 + (std::int64_t(1) << 55)});
  // 3^39 = 4052555153018976267 needs all 62 bits: integer pow must not go through double.
  Tensor three = kt::make_int_tensor({3, 3, -3, 7}, {4});
  KILN_CHECK_EXACT(pow(three, kt::make_int_tensor({39, 0, 3, 2}, {4})), {4052555153018976267LL, 1, -27, 49});
  KILN_CHECK_EXACT(abs(kt::make_int_tensor({-big, big}, {2})), {big, big});
  KILN_CHECK_EXACT(-kt::make_int_tensor({-big, 5}, {2}), {big, -5});
}

TEST_CASE("logical and, or, not: bool results; nonzero counts as true") {
  Tensor p = kt::make_tensor({1, 1, 0, 0}, {4}, DType::Bool);
  Tensor q = kt::make_tensor({1, 0, 1, 0}, {4}, DType::Bool);
  Tensor a = p && q, o = p || q, n = !p;
  CHECK(a.dtype() == DType::Bool);
  CHECK(o.dtype() == DType::Bool);
  CHECK(n.dtype() == DType::Bool);
  KILN_CHECK_EXACT(a, {1, 0, 0, 0});
  KILN_CHECK_EXACT(o, {1, 1, 1, 0});
  KILN_CHECK_EXACT(n, {0, 0, 1, 1});
  KILN_CHECK_EXACT(logical_and(p, q), {1, 0, 0, 0});
  KILN_CHECK_EXACT(logical_or(p, q), {1, 1, 1, 0});
  KILN_CHECK_EXACT(logical_not(q), {0, 1, 0, 1});
  // torch.logical_* accept any dtype (nonzero is true) and give bool.
  for (DType dt : {DType::Int32, DType::Int64, DType::Float16, DType::BFloat16, DType::Float32, DType::Float64}) {
    CAPTURE(dt);
    Tensor x = kt::make_tensor({2, 0, -0.5, 0}, {4}, dt);
    Tensor y = kt::make_tensor({-3, 5, 0, 0}, {4}, dt);
    Tensor xa = logical_and(x, y), xo = logical_or(x, y), xn = logical_not(x);
    CHECK(xa.dtype() == DType::Bool);
    CHECK(xn.dtype() == DType::Bool);
    KILN_CHECK_EXACT(xa, {1, 0, is_floating(dt) ? 0 : 0, 0});
    KILN_CHECK_EXACT(xo, {1, 1, is_floating(dt) ? 1 : 0, 0});  // int(-0.5) == 0
    KILN_CHECK_EXACT(xn, {0, 1, is_floating(dt) ? 0 : 1, 1});
  }
  // Broadcast with a strided operand.
  Tensor m = kt::make_tensor({1, 0, 1, 1, 0, 0}, {2, 3}, DType::Bool);
  m.eval();
  KILN_CHECK_EXACT(transpose(m, 0, 1) && kt::make_tensor({1, 0}, {2}, DType::Bool), {1, 0, 0, 0, 1, 0});
}

TEST_CASE("where on every dtype, with broadcasting and scalars") {
  Tensor cond = kt::make_tensor({1, 0, 1, 0, 0, 1}, {2, 3}, DType::Bool);
  for (DType dt : kt::kAllDTypes) {
    CAPTURE(dt);
    auto av = kt::values_for(dt, 3, -3, 3, 51);
    auto bv = kt::values_for(dt, 2, -3, 3, 52);
    Tensor y = where(cond, kt::make_tensor(av, {3}, dt), kt::make_tensor(bv, {2, 1}, dt));
    CHECK(y.dtype() == dt);
    CHECK(y.shape() == Shape{2, 3});
    std::vector<double> c = {1, 0, 1, 0, 0, 1}, expected;
    for (int i = 0; i < 6; ++i) expected.push_back(c[i] ? av[i % 3] : bv[i / 3]);
    KILN_CHECK_CLOSE(y, expected);
  }
  Tensor x = kt::make_tensor({-1.5, 2.5, -3.5}, {3}, DType::Float32);
  KILN_CHECK_CLOSE(where(x > 0, x, 0.0f), std::vector<double>{0, 2.5, 0});
  KILN_CHECK_CLOSE(where(x > 0, 1, x), std::vector<double>{-1.5, 1, -3.5});
  Tensor wi = where(x > 0, kt::make_tensor({1, 2, 3}, {3}, DType::Int32), 0.5);
  CHECK(wi.dtype() == DType::Float32);  // int tensor with a float number -> default float
  KILN_CHECK_CLOSE(wi, std::vector<double>{0.5, 2, 0.5});
  Tensor wh = where(x > 0, kt::make_tensor({1, 2, 3}, {3}, DType::Float16), 2.0);
  CHECK(wh.dtype() == DType::Float16);  // a number does not widen a float tensor
  KILN_CHECK_CLOSE(wh, std::vector<double>{2, 2, 2});
  CHECK_THROWS_AS(where(x, x, x), DTypeError);  // condition must be bool
}

TEST_CASE("clamp on every numeric dtype, scalar and tensor bounds") {
  for (DType dt : {DType::Int32, DType::Int64, DType::Float16, DType::BFloat16, DType::Float32, DType::Float64}) {
    CAPTURE(dt);
    auto in = kt::values_for(dt, 12, -4, 4, 61);
    Tensor y = clamp(kt::make_tensor(in, {3, 4}, dt), -2, 3);
    CHECK(y.dtype() == dt);
    std::vector<double> expected;
    for (double v : in) expected.push_back(std::min(std::max(v, -2.0), 3.0));
    KILN_CHECK_CLOSE(y, expected);

    auto lo = kt::values_for(dt, 4, -4, 0, 62);
    auto hi = kt::values_for(dt, 3, 0, 4, 63);
    for (auto& h : hi) h = std::abs(h);
    for (auto& l : lo) l = -std::abs(l);
    Tensor z = clamp(kt::make_tensor(in, {3, 4}, dt), kt::make_tensor(lo, {4}, dt), kt::make_tensor(hi, {3, 1}, dt));
    CHECK(z.dtype() == dt);
    expected.clear();
    for (int i = 0; i < 12; ++i) expected.push_back(std::min(std::max(in[i], lo[i % 4]), hi[i / 4]));
    KILN_CHECK_CLOSE(z, expected);
  }
  // Integer tensor clamped by float numbers: float32 (torch.clamp promotes).
  Tensor ci = clamp(kt::make_tensor({-3, 0, 3}, {3}, DType::Int32), -1.5, 2.5);
  CHECK(ci.dtype() == DType::Float32);
  KILN_CHECK_CLOSE(ci, std::vector<double>{-1.5, 0, 2.5});
}

TEST_CASE("scalars on either side of an operator") {
  for (DType dt : {DType::Int32, DType::Int64, DType::Float16, DType::BFloat16, DType::Float32, DType::Float64}) {
    CAPTURE(dt);
    auto in = kt::values_for(dt, 6, 0.5, 3, 71);
    for (auto& v : in)
      if (v == 0) v = 1;
    Tensor x = kt::make_tensor(in, {2, 3}, dt);
    std::vector<double> e1, e2, e3, e4;
    for (double v : in) {
      e1.push_back(2 - v);
      e2.push_back(3 * v);
      e3.push_back(12 / v);
      e4.push_back(v - 1);
    }
    Tensor y1 = 2 - x, y2 = 3 * x, y3 = 12 / x, y4 = x - 1;
    CHECK(y1.dtype() == dt);
    CHECK(y2.dtype() == dt);
    CHECK(y3.dtype() == (is_floating(dt) ? dt : DType::Float32));
    KILN_CHECK_CLOSE(y1, e1);
    KILN_CHECK_CLOSE(y2, e2);
    KILN_CHECK_CLOSE(y3, e3);
    KILN_CHECK_CLOSE(y4, e4);
    KILN_CHECK_EXACT(x > 1, [&] {
      std::vector<std::int64_t> e;
      for (double v : in) e.push_back(v > 1);
      return e;
    }());
  }
}

TEST_CASE("expressions compose: a chain of mixed ops matches the double reference") {
  auto av = kt::uniform_values(20, -2, 2, DType::Float32, 81);
  auto bv = kt::uniform_values(5, 0.5, 2, DType::Float32, 82);
  Tensor a = kt::make_tensor(av, {4, 5}, DType::Float32);
  Tensor b = kt::make_tensor(bv, {5}, DType::Float32);
  Tensor y = where(a > 0, exp(-a) * b, sqrt(abs(a)) / b) + tanh(a * 0.5f) - 1;
  std::vector<double> expected;
  for (int i = 0; i < 20; ++i) {
    double x = av[i], w = bv[i % 5];
    expected.push_back((x > 0 ? std::exp(-x) * w : std::sqrt(std::fabs(x)) / w) + std::tanh(x * 0.5) - 1);
  }
  KILN_CHECK_CLOSE(y, expected);
}

namespace {

const double kActInf = std::numeric_limits<double>::infinity();
const double kActNan = std::numeric_limits<double>::quiet_NaN();

/// One activation with its inputs and torch's float64 values and gradients of sum(f(x)) there
/// (torch 2.x, torch.autograd.grad, one element at a time: torch's scalar kernels).
struct ActivationCase {
  const char* name;
  std::function<Tensor(const Tensor&)> f;
  std::vector<double> x, y, grad;
};

std::vector<ActivationCase> activation_cases() {
  const double kInf = kActInf, kNan = kActNan;
  return {
      {"leaky_relu(0.2)", [](const Tensor& x) { return leaky_relu(x, 0.2); },
       {-2.0, -0.0, 0.0, 1.5, kNan, kInf, -kInf},
       {-0.4, -0.0, 0.0, 1.5, kNan, kInf, -kInf},
       {0.2, 0.2, 0.2, 1.0, 0.2, 1.0, 0.2}},
      {"elu(1.5)", [](const Tensor& x) { return elu(x, 1.5); },
       {-2.0, 0.0, 1.5, kNan, kInf, -kInf},
       {-1.296997075145081, 0.0, 1.5, kNan, kInf, -1.5},
       {0.20300292485491905, 1.5, 1.0, 1.0, 1.0, 0.0}},
      {"selu", [](const Tensor& x) { return selu(x); },
       {-2.0, 0.0, 1.5, kNan, kInf, -kInf},
       {-1.5201664685956948, 0.0, 1.5760514810332207, kNan, kInf, -1.7580993408473766},
       {0.2379328722516818, 1.7580993408473766, 1.0507009873554805, 1.0507009873554805, 1.0507009873554805, 0.0}},
      {"celu(1.5)", [](const Tensor& x) { return celu(x, 1.5); },
       {-2.0, 0.0, 1.5, kNan, kInf, -kInf},
       {-1.10460429282641, 0.0, 1.5, kNan, kInf, -1.5},
       {0.26359713811572677, 1.0, 1.0, 1.0, 1.0, 0.0}},
      {"softplus(2.0, 5.0)", [](const Tensor& x) { return softplus(x, 2.0, 5.0); },
       {-2.0, 0.0, 2.5, 3.0, kNan, kInf, -kInf},
       {0.009074963958904869, 0.34657359027997264, 2.503357674244559, 3.0, kNan, kInf, 0.0},
       {0.017986209962091555, 0.5, 0.9933071490757152, 1.0, kNan, 1.0, 0.0}},
      {"softplus", [](const Tensor& x) { return softplus(x); },
       {-30.0, 0.0, 20.0, 20.5, kNan, kInf, -kInf},
       {9.357622968839737e-14, 0.6931471805599453, 20.000000002061153, 20.5, kNan, kInf, 0.0},
       {9.3576229688393e-14, 0.5, 0.9999999979388464, 1.0, kNan, 1.0, 0.0}},
      {"mish", [](const Tensor& x) { return mish(x); },
       {-2.0, 0.0, 1.5, 30.0, kNan, kInf, -kInf},
       {-0.2525014826957089, 0.0, 1.4033782663958028, 30.0, kNan, kInf, kNan},
       {-0.1083550924203939, 0.6, 1.0884879850078475, 1.0, kNan, kNan, kNan}},
      {"hardtanh(-1.0, 2.0)", [](const Tensor& x) { return hardtanh(x, -1.0, 2.0); },
       {-3.0, -1.0, 0.5, 2.0, 3.0, kNan, kInf, -kInf},
       {-1.0, -1.0, 0.5, 2.0, 2.0, kNan, 2.0, -1.0},
       {0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0}},
      {"relu6", [](const Tensor& x) { return relu6(x); },
       {-1.0, 0.0, 3.0, 6.0, 7.0, kNan, kInf, -kInf},
       {0.0, 0.0, 3.0, 6.0, 6.0, kNan, 6.0, 0.0},
       {0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0}},
      {"hardsigmoid", [](const Tensor& x) { return hardsigmoid(x); },
       {-4.0, -3.0, 0.5, 3.0, 4.0, kNan, kInf, -kInf},
       {0.0, 0.0, 0.5833333333333334, 1.0, 1.0, kNan, 1.0, 0.0},
       {0.0, 0.0, 0.1666666716337204, 0.0, 0.0, 0.0, 0.0, 0.0}},
      {"hardswish", [](const Tensor& x) { return hardswish(x); },
       {-4.0, -3.0, 1.0, 3.0, 4.0, kNan, kInf, -kInf},
       {-0.0, -0.0, 0.6666666666666666, 3.0, 4.0, kNan, kInf, kNan},
       {0.0, 0.0, 0.8333333333333333, 1.0, 1.0, 1.0, 1.0, 0.0}},
      {"logsigmoid", [](const Tensor& x) { return logsigmoid(x); },
       {-800.0, -2.0, 0.0, 2.0, 800.0, kNan, kInf, -kInf},
       {-800.0, -2.1269280110429727, -0.6931471805599453, -0.1269280110429725, 0.0, kNan, 0.0, -kInf},
       {1.0, 0.8807970779778824, 0.5, 0.11920292202211755, 0.0, kNan, 0.0, 1.0}},
      {"softsign", [](const Tensor& x) { return softsign(x); },
       {-2.0, 0.0, 3.0, kNan, kInf, -kInf},
       {-0.6666666666666666, 0.0, 0.75, kNan, kNan, kNan},
       {0.1111111111111111, 1.0, 0.0625, kNan, kNan, kNan}},
      {"tanhshrink", [](const Tensor& x) { return tanhshrink(x); },
       {-2.0, 0.0, 0.5, kNan, kInf, -kInf},
       {-1.035972419924183, 0.0, 0.03788284273999026, kNan, kInf, -kInf},
       {0.9293491751468356, 0.0, 0.2135522670340726, kNan, 1.0, 1.0}},
  };
}

/// "" when the zeros of `actual` have the signs of those of `expected` (torch's -0.0 results).
std::string zero_signs(const std::vector<double>& actual, const std::vector<double>& expected) {
  std::string out;
  for (std::size_t i = 0; i < actual.size() && i < expected.size(); ++i)
    if (expected[i] == 0.0 && actual[i] == 0.0 && std::signbit(actual[i]) != std::signbit(expected[i]))
      out += "  [" + std::to_string(i) + "] has the other sign of zero\n";
  return out;
}

}  // namespace

TEST_CASE("activations: torch's values and gradients at the kinks, NaN and +-inf, in float64 and float32") {
  for (const ActivationCase& c : activation_cases()) {
    const std::string name = c.name;
    CAPTURE(name);
    const auto n = static_cast<std::int64_t>(c.x.size());
    for (DType dt : {f64, f32}) {
      const std::string dtype = dtype_name(dt);
      CAPTURE(dtype);
      // float64 to the last bits (the values are torch's); float32 within torch.testing's tolerance.
      const kt::Tolerance tol = dt == f64 ? kt::Tolerance{1e-12, 1e-15} : kt::tolerance(dt);
      Tensor x = kt::make_tensor(c.x, {n}, dt).requires_grad_();
      Tensor y = c.f(x);
      CHECK(y.dtype() == dt);
      CHECK_MESSAGE(kt::close_report(y, c.y, tol) == "", kt::close_report(y, c.y, tol));
      CHECK_MESSAGE(zero_signs(kt::values(y), c.y) == "", zero_signs(kt::values(y), c.y));
      sum(y).backward();
      CHECK_MESSAGE(kt::close_report(x.grad(), c.grad, tol) == "", kt::close_report(x.grad(), c.grad, tol));
    }
    // float16 and bfloat16 compute in float32 and round once (torch's opmath), but for softsign
    // and tanhshrink, torch's Python composites, which round after each op (below).
    if (name == "softsign" || name == "tanhshrink") continue;
    for (DType dt : {f16, bf16}) {
      const std::string dtype = dtype_name(dt);
      CAPTURE(dtype);
      Tensor y = c.f(kt::make_tensor(c.x, {n}, dt));
      CHECK(y.dtype() == dt);
      CHECK_MESSAGE(kt::close_report(y, c.y) == "", kt::close_report(y, c.y));
    }
  }
}

TEST_CASE("activations: torch's dtype rules and argument errors") {
  const Tensor i = kt::make_int_tensor({-3, 0, 1, 2, 7}, {5});
  const Tensor b = kt::make_tensor({1, 0}, {2}, DType::Bool);
  // torch's native kernels are not implemented for integers and bools: DTypeErrors naming the op.
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>> floating = {
      {"leaky_relu", [](const Tensor& x) { return leaky_relu(x); }},
      {"elu", [](const Tensor& x) { return elu(x); }},
      {"selu", [](const Tensor& x) { return selu(x); }},
      {"celu", [](const Tensor& x) { return celu(x); }},
      {"softplus", [](const Tensor& x) { return softplus(x); }},
      {"mish", [](const Tensor& x) { return mish(x); }},
      {"hardsigmoid", [](const Tensor& x) { return hardsigmoid(x); }},
      {"hardswish", [](const Tensor& x) { return hardswish(x); }},
      {"logsigmoid", [](const Tensor& x) { return logsigmoid(x); }}};
  for (const auto& [name, f] : floating) {
    CAPTURE(name);
    for (const Tensor& x : {i, i.to(i32), b}) {
      try {
        f(x);
        FAIL("no error");
      } catch (const DTypeError& e) {
        CHECK(kt::mentions(e.what(), {name, dtype_name(x.dtype())}));
      }
    }
  }
  // hardtanh and relu6 keep integer dtypes, the bounds truncated (torch casts them): hardtanh of
  // [-3, 0, 1, 2, 7] in [-0.5, 1.5] is [0, 0, 1, 1, 1].
  CHECK(hardtanh(i, -0.5, 1.5).dtype() == DType::Int64);
  CHECK(kt::exact_report(hardtanh(i, -0.5, 1.5), {0, 0, 1, 1, 1}) == "");
  CHECK(relu6(i.to(i32)).dtype() == DType::Int32);
  CHECK(kt::exact_report(relu6(i.to(i32)), {0, 0, 1, 2, 6}) == "");
  // softsign and tanhshrink are torch's composites: integers compute in float32.
  CHECK(softsign(i).dtype() == f32);
  CHECK(kt::close_report(softsign(i), {-0.75, 0.0, 0.5, 0.6666666865348816, 0.875}) == "");
  CHECK(tanhshrink(i.to(i32)).dtype() == f32);
  CHECK(kt::close_report(tanhshrink(i), {-2.0049452781677246, 0.0, 0.23840582370758057, 1.0359723567962646,
                                         6.000001907348633}) == "");
  for (auto f : {+[](const Tensor& x) { return hardtanh(x); }, +[](const Tensor& x) { return relu6(x); },
                 +[](const Tensor& x) { return softsign(x); }, +[](const Tensor& x) { return tanhshrink(x); }})
    CHECK_THROWS_AS(f(b), DTypeError);
  // softsign and tanhshrink round after each op in 16 bits, as torch's composites: torch gives
  // 0.037109375 for tanhshrink(0.5) in bfloat16 (0.5 - 0.462890625) and 0.0909423828125 for
  // softsign(0.1) in float16.
  CHECK(kt::values(tanhshrink(kt::make_tensor({0.5}, {1}, bf16)))[0] == 0.037109375);
  CHECK(kt::values(softsign(kt::make_tensor({0.1}, {1}, f16)))[0] == 0.0909423828125);
  // torch's argument checks.
  const Tensor x = kt::make_tensor({1.0}, {1}, f32);
  CHECK_THROWS_AS(hardtanh(x, 2.0, -1.0), ValueError);
  CHECK_NOTHROW(hardtanh(x, 1.0, 1.0));
  CHECK_THROWS_AS(celu(x, 0.0), ValueError);
}

}  // namespace kiln_test_tensor_pointwise
