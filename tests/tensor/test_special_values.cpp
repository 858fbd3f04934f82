// NaN, Inf and signed zeros behave as in PyTorch: pointwise ops, comparisons, reductions,
// composites, and 16-bit overflow.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "../support/reference.hpp"

namespace kiln_test_tensor_special_values {

using namespace kiln;
namespace kt = kiln::testing;

namespace {
const double kNan = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

/// Values exactly (NaN matches NaN) and the sign of every zero.
void check_exact_signed(const std::vector<double>& actual, const std::vector<double>& expected) {
  KILN_CHECK_CLOSE(actual, expected, kt::Tolerance{});
  for (std::size_t i = 0; i < expected.size() && i < actual.size(); ++i)
    if (expected[i] == 0.0) {
      CAPTURE(i);
      CHECK(std::signbit(actual[i]) == std::signbit(expected[i]));
    }
}
}  // namespace

TEST_CASE("signed zeros") {
  for (DType dt : kt::kFloatDTypes) {
    CAPTURE(dt);
    Tensor nz = kt::make_tensor({-0.0, -0.0, 0.0}, {3}, dt);
    Tensor pz = kt::make_tensor({0.0, -0.0, 0.0}, {3}, dt);
    check_exact_signed(kt::values(nz * 1), {-0.0, -0.0, 0.0});
    check_exact_signed(kt::values(nz * 1.0), {-0.0, -0.0, 0.0});
    check_exact_signed(kt::values(pz * -1.0), {-0.0, 0.0, -0.0});
    check_exact_signed(kt::values(nz + pz), {0.0, -0.0, 0.0});  // -0 + +0 = +0; -0 + -0 = -0
    check_exact_signed(kt::values(-pz), {-0.0, 0.0, -0.0});
    check_exact_signed(kt::values(abs(nz)), {0.0, 0.0, 0.0});
    check_exact_signed(kt::values(sqrt(nz)), {-0.0, -0.0, 0.0});
    check_exact_signed(kt::values(nz - 0.0), {-0.0, -0.0, 0.0});
    KILN_CHECK_CLOSE(kt::values(1.0 / nz), std::vector<double>{-kInf, -kInf, kInf}, kt::Tolerance{});
    KILN_CHECK_CLOSE(kt::values(rsqrt(nz)), std::vector<double>{-kInf, -kInf, kInf}, kt::Tolerance{});
    KILN_CHECK_EXACT(nz == pz, {1, 1, 1});  // -0 == +0
    KILN_CHECK_EXACT(nz < pz, {0, 0, 0});
    Tensor halves = kt::make_tensor({-0.5, -0.25, 0.5}, {3}, dt);
    check_exact_signed(kt::values(ceil(halves)), {-0.0, -0.0, 1.0});
    check_exact_signed(kt::values(round(halves)), {-0.0, -0.0, 0.0});
    check_exact_signed(kt::values(floor(halves)), {-1.0, -1.0, 0.0});
    check_exact_signed(kt::values(nz.to(DType::Float64)), {-0.0, -0.0, 0.0});
    check_exact_signed(kt::values(nz.to(DType::Float32)), {-0.0, -0.0, 0.0});
  }
}

TEST_CASE("unary functions at NaN, +-Inf and zero") {
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&)> f;
    std::vector<double> in, out;
  };
  std::vector<Case> cases = {
      {"exp", [](const Tensor& x) -> Tensor { return exp(x); }, {-kInf, kInf, kNan, 0}, {0, kInf, kNan, 1}},
      {"exp2", [](const Tensor& x) -> Tensor { return exp2(x); }, {-kInf, kInf, kNan, 0}, {0, kInf, kNan, 1}},
      {"expm1", [](const Tensor& x) -> Tensor { return expm1(x); }, {-kInf, kInf, kNan, -0.0}, {-1, kInf, kNan, -0.0}},
      {"log",
       [](const Tensor& x) -> Tensor { return log(x); },
       {0, -1, kInf, kNan, -0.0},
       {-kInf, kNan, kInf, kNan, -kInf}},
      {"log2", [](const Tensor& x) -> Tensor { return log2(x); }, {0, -1, kInf, kNan}, {-kInf, kNan, kInf, kNan}},
      {"log1p", [](const Tensor& x) -> Tensor { return log1p(x); }, {-1, -2, kInf, -0.0}, {-kInf, kNan, kInf, -0.0}},
      {"sqrt", [](const Tensor& x) -> Tensor { return sqrt(x); }, {-1, kInf, kNan, -kInf}, {kNan, kInf, kNan, kNan}},
      {"rsqrt", [](const Tensor& x) -> Tensor { return rsqrt(x); }, {0, kInf, -1, kNan}, {kInf, 0, kNan, kNan}},
      {"sin", [](const Tensor& x) -> Tensor { return sin(x); }, {kInf, -kInf, kNan, -0.0}, {kNan, kNan, kNan, -0.0}},
      {"cos", [](const Tensor& x) -> Tensor { return cos(x); }, {kInf, kNan, 0}, {kNan, kNan, 1}},
      {"tan", [](const Tensor& x) -> Tensor { return tan(x); }, {kInf, kNan, -0.0}, {kNan, kNan, -0.0}},
      {"tanh", [](const Tensor& x) -> Tensor { return tanh(x); }, {kInf, -kInf, kNan, -0.0}, {1, -1, kNan, -0.0}},
      {"erf", [](const Tensor& x) -> Tensor { return erf(x); }, {kInf, -kInf, kNan, -0.0}, {1, -1, kNan, -0.0}},
      {"sigmoid", [](const Tensor& x) -> Tensor { return sigmoid(x); }, {kInf, -kInf, kNan, 0}, {1, 0, kNan, 0.5}},
      {"relu", [](const Tensor& x) -> Tensor { return relu(x); }, {kNan, -kInf, kInf, -3}, {kNan, 0, kInf, 0}},
      {"abs", [](const Tensor& x) -> Tensor { return abs(x); }, {-kInf, kNan, -0.0}, {kInf, kNan, 0}},
      {"neg", [](const Tensor& x) -> Tensor { return -x; }, {kInf, kNan, 0}, {-kInf, kNan, -0.0}},
      {"floor", [](const Tensor& x) -> Tensor { return floor(x); }, {kInf, -kInf, kNan}, {kInf, -kInf, kNan}},
      {"ceil", [](const Tensor& x) -> Tensor { return ceil(x); }, {kInf, -kInf, kNan}, {kInf, -kInf, kNan}},
      {"round", [](const Tensor& x) -> Tensor { return round(x); }, {kInf, -kInf, kNan}, {kInf, -kInf, kNan}},
      {"gelu", [](const Tensor& x) -> Tensor { return gelu(x); }, {kInf, kNan, 0}, {kInf, kNan, 0}},
      {"silu", [](const Tensor& x) -> Tensor { return silu(x); }, {kInf, kNan, 0}, {kInf, kNan, 0}},
  };
  for (const auto& c : cases) {
    for (DType dt : kt::kFloatDTypes) {
      CAPTURE(c.name);
      CAPTURE(dt);
      auto n = static_cast<std::int64_t>(c.in.size());
      check_exact_signed(kt::values(c.f(kt::make_tensor(c.in, {n}, dt))), c.out);
    }
  }
  Tensor x = kt::make_tensor({kNan, kInf, -kInf, 1}, {4}, DType::Float32);
  KILN_CHECK_EXACT(isnan(x), {1, 0, 0, 0});
  KILN_CHECK_EXACT(isinf(x), {0, 1, 1, 0});
}

TEST_CASE("binary ops at NaN, +-Inf and zero") {
  for (DType dt : kt::kFloatDTypes) {
    CAPTURE(dt);
    Tensor a = kt::make_tensor({1, -1, 0, kInf, kInf, kNan, 1, -kInf}, {8}, dt);
    Tensor b = kt::make_tensor({0, 0, 0, kInf, -kInf, 1, kNan, 2}, {8}, dt);
    check_exact_signed(kt::values(a / b), {kInf, -kInf, kNan, kNan, kNan, kNan, kNan, -kInf});
    check_exact_signed(kt::values(a + b), {1, -1, 0, kInf, kNan, kNan, kNan, -kInf});
    check_exact_signed(kt::values(a - b), {1, -1, 0, kNan, kInf, kNan, kNan, -kInf});
    check_exact_signed(kt::values(a * b), {0, -0.0, 0, kInf, -kInf, kNan, kNan, -kInf});
    // maximum/minimum propagate NaN from either side (torch.maximum), unlike std::max.
    check_exact_signed(kt::values(maximum(a, b)), {1, 0, 0, kInf, kInf, kNan, kNan, 2});
    check_exact_signed(kt::values(minimum(a, b)), {0, -1, 0, kInf, -kInf, kNan, kNan, -kInf});
    check_exact_signed(kt::values(maximum(b, a)), {1, 0, 0, kInf, kInf, kNan, kNan, 2});
    check_exact_signed(kt::values(clamp(kt::make_tensor({kNan, -kInf, kInf, 0.5}, {4}, dt), 0, 1)), {kNan, 0, 1, 0.5});
    // Comparisons with NaN are false except !=.
    KILN_CHECK_EXACT(a == b, {0, 0, 1, 1, 0, 0, 0, 0});
    KILN_CHECK_EXACT(a != b, {1, 1, 0, 0, 1, 1, 1, 1});
    KILN_CHECK_EXACT(a < b, {0, 1, 0, 0, 0, 0, 0, 1});
    KILN_CHECK_EXACT(a <= b, {0, 1, 1, 1, 0, 0, 0, 1});
    KILN_CHECK_EXACT(a > b, {1, 0, 0, 0, 1, 0, 0, 0});
    KILN_CHECK_EXACT(a >= b, {1, 0, 1, 1, 1, 0, 0, 0});
    Tensor n = kt::make_tensor({kNan}, {1}, dt);
    KILN_CHECK_EXACT(n == n, {0});
    KILN_CHECK_EXACT(n != n, {1});
    // pow: IEEE/C99 special cases, as torch.pow.
    Tensor base = kt::make_tensor({0, kNan, 1, 0, -0.0, kInf, -8, -kInf}, {8}, dt);
    Tensor ex = kt::make_tensor({0, 0, kNan, -1, -1, -1, 0.5, 3}, {8}, dt);
    check_exact_signed(kt::values(pow(base, ex)), {1, 1, 1, kInf, -kInf, 0, kNan, -kInf});
    // A number exponent: torch.pow's scalar-exponent kernels (0.5 is sqrt, -0.5 rsqrt, -1 a
    // reciprocal, 2 and 3 products), on the JIT and the reference alike.
    Tensor s = kt::make_tensor({-kInf, -0.0, 0, 4, kInf, kNan, -2}, {7}, dt);
    check_exact_signed(kt::values(pow(s, 0.5)), {kNan, -0.0, 0, 2, kInf, kNan, kNan});
    check_exact_signed(kt::values(pow(s, -0.5)), {kNan, -kInf, kInf, 0.5, 0, kNan, kNan});
    check_exact_signed(kt::values(pow(s, -1)), {-0.0, -kInf, kInf, 0.25, 0, kNan, -0.5});
    check_exact_signed(kt::values(pow(s, 2)), {kInf, 0, 0, 16, kInf, kNan, 4});
    check_exact_signed(kt::values(pow(s, 3)), {-kInf, -0.0, 0, 64, kInf, kNan, -8});
    check_exact_signed(kt::values(pow(s, -2)), {0, kInf, kInf, 0.0625, 0, kNan, 0.25});
    // where passes NaN through and ignores the other branch.
    check_exact_signed(kt::values(where(b > 0, a, b)), {0, 0, 0, kInf, -kInf, kNan, kNan, -kInf});
  }
}

TEST_CASE("16-bit overflow and underflow round like PyTorch") {
  Tensor h = kt::make_tensor({60000, 100, 1e-4, -60000}, {4}, DType::Float16);
  KILN_CHECK_CLOSE(kt::values(h * 2.0), std::vector<double>{kInf, 200, 2e-4, -kInf}, kt::tolerance(DType::Float16));
  KILN_CHECK_CLOSE(kt::values(h * kt::make_tensor({1000, 1000, 1e-4, 1}, {4}, DType::Float16)),
                   std::vector<double>{kInf, kInf, 0, -60000}, kt::Tolerance{1e-3, 1e-7});
  Tensor b = kt::make_tensor({3e38, 1e-38}, {2}, DType::BFloat16);
  KILN_CHECK_CLOSE(kt::values(b * 2.0), std::vector<double>{kInf, 2e-38}, kt::tolerance(DType::BFloat16));
  // Reductions over 16-bit inputs accumulate in float32: no overflow of partial sums that fit the result.
  Tensor many = full({64}, 2000, f16, kt::device());
  KILN_CHECK_CLOSE(kt::values(mean(many)), std::vector<double>{2000}, kt::tolerance(DType::Float16));
  KILN_CHECK_CLOSE(kt::values(softmax(many, -1)), std::vector<double>(64, 1.0 / 64), kt::tolerance(DType::Float16));
}

TEST_CASE("reductions and composites with NaN and Inf") {
  SUBCASE("sum, mean, max, min, prod") {
    Tensor x = kt::make_tensor({kInf, -kInf, 1, kInf, 1, 2, -kInf, -kInf, 0, kNan, 0, 0}, {4, 3}, DType::Float32);
    KILN_CHECK_CLOSE(sum(x, 1), std::vector<double>{kNan, kInf, -kInf, kNan});
    KILN_CHECK_CLOSE(mean(x, 1), std::vector<double>{kNan, kInf, -kInf, kNan});
    KILN_CHECK_CLOSE(max(x, 1), std::vector<double>{kInf, kInf, 0, kNan});
    KILN_CHECK_CLOSE(min(x, 1), std::vector<double>{-kInf, 1, -kInf, kNan});
    KILN_CHECK_CLOSE(prod(x, 1), std::vector<double>{-kInf, kInf, kNan, kNan});
    KILN_CHECK_EXACT(argmax(x, 1), {0, 0, 2, 0});
    KILN_CHECK_EXACT(argmin(x, 1), {1, 1, 0, 0});
    Tensor all_nan = kt::make_tensor({kNan, kNan}, {2}, DType::Float64);
    KILN_CHECK_CLOSE(max(all_nan), std::vector<double>{kNan});
    KILN_CHECK_EXACT(argmax(all_nan), {0});
  }
  SUBCASE("softmax and log_softmax") {
    for (DType dt : kt::kFloatDTypes) {
      CAPTURE(dt);
      Tensor x = kt::make_tensor({-kInf, -kInf, -kInf, -kInf, 0, 1, kInf, 0, 1, kNan, 2, 3}, {4, 3}, dt);
      double e1 = std::exp(1.0), s = 1 + e1;
      KILN_CHECK_CLOSE(softmax(x, -1),
                       std::vector<double>{kNan, kNan, kNan, 0, 1 / s, e1 / s, kNan, kNan, kNan, kNan, kNan, kNan});
      KILN_CHECK_CLOSE(log_softmax(x, -1), std::vector<double>{kNan, kNan, kNan, -kInf, -std::log(s), 1 - std::log(s),
                                                               kNan, kNan, kNan, kNan, kNan, kNan});
    }
  }
  SUBCASE("softmax of products near 1e30: each op rounds, the max subtracts to exactly 0") {
    // A fused multiply-add would keep w*x - max(w*x) at the product's rounding error (about
    // 1e23 here), whose exp is inf: the GPU gave NaN rows before +, - and * were kept apart.
    for (DType dt : {DType::Float32, DType::Float64}) {
      CAPTURE(dt);
      Tensor x = kt::make_tensor({1, 1, 1, -1e30, -1e30, 1}, {3, 2}, dt);
      Tensor w = kt::make_tensor({-1.9166764, -1.9166764, 3.1}, {3, 1}, dt);
      KILN_CHECK_CLOSE(softmax(w * x, -1), std::vector<double>{0.5, 0.5, 0, 1, 0, 1});
      KILN_CHECK_CLOSE(logsumexp(w * x, {1}), std::vector<double>{-1.9166764 + std::log(2.0), 1.9166764e30, 3.1},
                       kt::tolerance(dt));
    }
  }
  SUBCASE("logsumexp") {
    Tensor x = kt::make_tensor({-kInf, -kInf, kInf, 1, kInf, kInf, kNan, 1, -kInf, 2}, {5, 2}, DType::Float32);
    KILN_CHECK_CLOSE(logsumexp(x, 1), std::vector<double>{-kInf, kInf, kInf, kNan, 2});
    KILN_CHECK_CLOSE(logsumexp(kt::make_tensor({-kInf, -kInf, -kInf}, {3}, DType::Float64)),
                     std::vector<double>{-kInf});
  }
  SUBCASE("layer_norm of a constant row is zero; rms_norm of zeros is zero") {
    Tensor c = full({2, 8}, 3.25, f32, kt::device());
    KILN_CHECK_CLOSE(layer_norm(c), std::vector<double>(16, 0.0));
    KILN_CHECK_CLOSE(rms_norm(zeros({2, 8}, f32, kt::device())), std::vector<double>(16, 0.0));
    Tensor withnan = kt::make_tensor({1, kNan, 3, 4}, {1, 4}, DType::Float32);
    KILN_CHECK_CLOSE(layer_norm(withnan), std::vector<double>{kNan, kNan, kNan, kNan});
  }
}

}  // namespace kiln_test_tensor_special_values
